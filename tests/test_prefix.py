"""Prefix-tuning on tiny random causal LMs built from a config: a Llama with grouped-query attention
(hidden 32, 2 layers, 4 query / 2 key-value heads) and a GPT-2 (hidden 32, 2 layers, 4 heads), with
a word-level tokenizer of a few dozen words. initializer_range is raised so that the random LMs
have decisive next-token distributions (comparisons of generated ids are then not decided by ties).
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import word_tokenizer
from frozentune.generation import prefix as PF
from frozentune.backbone import pad
from frozentune.generation.prefix import KVShape, PrefixBatch, PrefixConfig, PrefixTuner
from numerics import ACTIVATION, ROUNDING, assert_close, dot, exact, linear, prefix_mlp_scale, softmax, tol, transformer

WORDS = ("name eatType food area priceRange pub coffee shop restaurant the is a an in city centre riverside "
         "Blue Spice Aromi Cotto serves Italian English French cheap moderate near there it with and "
         "table to text summarize following . , [ ] : - |").split()
PHRASE = "table-to-text:"  # 6 tokens here: table - to - text :
SOURCES = ["name [ Blue Spice ] , eatType [ pub ]", "name [ Aromi ] , food [ Italian ] , area [ city centre ]",
           "name [ Cotto ]"]
TARGETS = ["Blue Spice is a pub .", "Aromi serves Italian food in the city centre .", "there is Cotto ."]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(WORDS)


def _llama(vocab: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def _gpt2(vocab: int, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                     initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module")
def llama(tok):
    return _llama(len(tok))


@pytest.fixture(scope="module")
def gpt2(tok):
    return _gpt2(len(tok))


@pytest.fixture(params=["llama", "gpt2"])
def lm(request):
    return request.getfixturevalue(request.param)


SMALL = PrefixConfig(prefix_length=4, reparam_hidden=16)


def logits_ops(keys: int) -> int:
    """Logits of the tiny Llama / GPT-2 (2 layers, width 32, FFN ≤ 4·32, heads of 8) attending over
    `keys` slots (prefix + tokens): the forward and the 32-input LM head."""
    return transformer(2, 32, 4 * 32, keys, 8) + linear(32)


def ce_ops(vocab: int, tokens: int) -> int:
    """Mean cross-entropy from logits: logsumexp over the vocabulary (softmax + log), minus the
    target logit, the mean over the target tokens."""
    return softmax(vocab) + ACTIVATION + 1 + dot(tokens) + 1


def rand_prefix(lm, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(KVShape.from_config(lm.config).tensor_shape(length), generator=g)


# ----------------------------------------------------------------------------- shapes and counts
def test_smollm2_prefix_size_from_config_alone():
    """SmolLM2-135M's shapes (30 layers, hidden 576, 9 heads / 3 kv heads of 64): the saved prefix for
    L_p = 10 is 10·30·2·192 = 115,200 numbers, under 0.1% of the LM; the MLP trained on the way is
    counted on the meta device (nothing allocated)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    shape = KVShape.from_config(cfg)
    assert shape == KVShape(layers=30, heads=3, head_dim=64) and shape.kv_dim == 192
    assert PF.saved_numel(PrefixConfig(), shape) == 115_200
    assert PF.saved_numel(PrefixConfig(), shape) / 134.5e6 < 0.001
    with torch.device("meta"):
        enc = PF.PrefixEncoder(PrefixConfig(), shape, 576)
    assert sum(p.numel() for p in enc.parameters()) == PF.trainable_numel(PrefixConfig(), shape, 576)
    assert enc().shape == (30, 2, 3, 10, 64)


def test_gpt2_shape_has_one_kv_head_per_head(gpt2, llama):
    assert KVShape.from_config(gpt2.config) == KVShape(layers=2, heads=4, head_dim=8)
    assert KVShape.from_config(llama.config) == KVShape(layers=2, heads=2, head_dim=8)


@pytest.mark.parametrize("reparam", [True, False])
def test_trainable_count_formula(lm, tok, reparam):
    tuner = PrefixTuner(dataclasses.replace(SMALL, reparam=reparam), lm, tok)
    assert tuner.num_trainable() == PF.trainable_numel(tuner.cfg, tuner.shape, 32)
    assert tuner.prefix().shape == tuner.shape.tensor_shape(4)
    assert tuner.trainable_state()[PF.PREFIX_KEY].numel() == PF.saved_numel(tuner.cfg, tuner.shape)


def test_config_errors_say_what_to_do():
    for bad, words in [(dict(train_backbone=True), "frozen"), (dict(prefix_length=-1), "0 or more"),
                       (dict(init="words", init_text=" "), "phrase"),
                       (dict(init="words", prefix_length=20, reparam_hidden=8), "raise reparam_hidden")]:
        with pytest.raises(ValueError, match=words):
            PrefixConfig(**bad).validate()


# ----------------------------------------------------------------------------- training
def test_only_the_prefix_trains(lm, tok):
    tuner = PrefixTuner(SMALL, lm, tok)
    lm_before = {k: v.clone() for k, v in lm.state_dict().items()}
    enc_before = {k: v.clone() for k, v in tuner.encoder.state_dict().items()}
    assert {n.split(".")[0] for n, _ in tuner.named_parameters()} == {"encoder"}
    x, y = PF.encode_sources(tok, SOURCES), PF.encode_targets(tok, TARGETS)
    opt = torch.optim.AdamW(tuner.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        loss = tuner.loss(x, y)
        opt.zero_grad()
        loss.backward()
        for n, p in tuner.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {n}"
        opt.step()
        losses.append(loss.item())
    assert all(not p.requires_grad and p.grad is None for p in lm.parameters())
    # exact: frozen weights are never written; every trained one moved
    assert all(torch.equal(v, lm.state_dict()[k]) for k, v in lm_before.items())
    assert all(not torch.equal(v, tuner.encoder.state_dict()[k]) for k, v in enc_before.items())
    assert losses[-1] < losses[0]


def test_loss_is_on_target_tokens_only(llama, tok):
    x, y = PF.encode_sources(tok, SOURCES), PF.encode_targets(tok, TARGETS)
    ids, mask, labels = PF.pack_pairs(x, y, 0)
    for b in range(len(x)):
        assert (labels[b, :len(x[b])] == PF.IGNORE).all() and (labels[b, len(x[b]) + len(y[b]):] == PF.IGNORE).all()
        assert labels[b, len(x[b]):len(x[b]) + len(y[b])].tolist() == y[b]
    prefix = rand_prefix(llama, 4, 0)
    loss = PF.prefix_lm_loss(llama, prefix, x, y, 0)
    # by hand: cross-entropy of each y token given everything before it, averaged over all y tokens
    logits = PF.prefix_forward(llama, PrefixBatch.single(prefix, len(x)), ids, mask).logits
    terms = [torch.nn.functional.cross_entropy(logits[b, t - 1], ids[b, t], reduction="sum")
             for b in range(len(x)) for t in range(len(x[b]), len(x[b]) + len(y[b]))]
    # the same forward; CE per token vs batched: the error is relative to the logits' size (logsumexp − logit)
    n, scale = len(terms), float(logits.abs().max())
    assert_close(loss, torch.stack(terms).mean(), ops=ce_ops(len(tok), n), scale=scale, what="loss")
    # padding changes nothing: the batch loss is the y-token-weighted mean of the one-row losses
    singles = [PF.prefix_lm_loss(llama, prefix, [x[b]], [y[b]], 0) * len(y[b]) for b in range(len(x))]
    assert_close(loss, torch.stack(singles).sum() / sum(map(len, y)), scale=scale, what="loss over rows alone",
                 ops=logits_ops(4 + ids.shape[1]) + ce_ops(len(tok), n) + 2)  # each row alone: other blocking


def test_training_positions_are_decoding_positions(lm, tok):
    """Teacher forcing on [x; generated y] (right-padded, as in training) reproduces greedy decoding
    (left-padded, through generate): same positions, masks and prefix in both."""
    prefixes = [rand_prefix(lm, n, s) for n, s in ((4, 1), (2, 2), (0, 3))]
    batch = PrefixBatch.mixed(prefixes)
    x = PF.encode_sources(tok, SOURCES)
    y = PF.generate(lm, batch, x, 0, None, max_new_tokens=5)
    ids, mask, _ = PF.pack_pairs(x, y, 0)
    logits = PF.prefix_forward(lm, batch, ids, mask).logits
    for b in range(len(x)):
        start = len(x[b])
        assert logits[b, start - 1:start + len(y[b]) - 1].argmax(-1).tolist() == y[b]


# ----------------------------------------------------------------------------- generation
def test_generate_equals_forward_only_greedy_loop(lm, tok):
    """Catches changes in how `generate` treats a given cache (PEFT's recurring breakage)."""
    batch = PrefixBatch.mixed([rand_prefix(lm, n, s) for n, s in ((4, 1), (3, 2), (0, 3))])
    x = PF.encode_sources(tok, SOURCES)
    assert PF.generate(lm, batch, x, 0, 2, max_new_tokens=8) == PF.greedy_reference(lm, batch, x, 0, 2, 8)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_zero_length_prefix_is_the_plain_model(lm, tok, num_beams):
    x = PF.encode_sources(tok, SOURCES)
    ids, mask = pad(x, 0, left=True)
    plain = lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, num_beams=num_beams, do_sample=False,
                        pad_token_id=0, eos_token_id=2)
    plain = [PF.until_eos(r, 2) for r in plain[:, ids.shape[1]:].tolist()]
    empty = PrefixBatch.single(rand_prefix(lm, 0, 0), len(x))
    assert PF.generate(lm, empty, x, 0, 2, max_new_tokens=6, num_beams=num_beams) == plain


@pytest.mark.parametrize("reparam", [True, False])
def test_words_init_is_the_phrase_itself(lm, tok, reparam):
    """A prefix of the phrase's own activations must make the LM behave as on phrase + x: logits,
    and greedy / beam outputs of `generate` (this checks positions, masks and the per-beam expansion
    of the prefix cache against the plain model's beam search)."""
    phrase = tok(PHRASE, add_special_tokens=False)["input_ids"]
    assert PF.phrase_ids(tok, PHRASE, 4) == phrase[:4] and PF.phrase_ids(tok, PHRASE, 9) == (phrase * 2)[:9]
    cfg = PrefixConfig(prefix_length=len(phrase), init="words", init_text=PHRASE, reparam=reparam, reparam_hidden=16)
    tuner = PrefixTuner(cfg, lm, tok)
    target = PF.activations(lm, phrase)
    if reparam:  # the MLP's last layer solved in float64 to give target, evaluated in float32
        fit_ops, mlp = linear(cfg.reparam_hidden) + ROUNDING, prefix_mlp_scale(tuner.encoder)
        assert_close(tuner.prefix(), target, ops=fit_ops, scale=mlp, what="MLP fitted to the phrase's keys/values")
        fit = tol(torch.float32, fit_ops) * mlp / float(target.abs().max())  # that error relative to the prefix's size
    else:
        exact(tuner.prefix(), target, "init_from copies the activations into the parameter")
        fit = 0.0
    x = PF.encode_sources(tok, SOURCES)
    withp = PF.prefix_forward(lm, PrefixBatch.single(tuner.encoder.materialize(), 1), torch.tensor([x[0]]),
                       torch.ones(1, len(x[0]), dtype=torch.long)).logits
    plain = lm(input_ids=torch.tensor([phrase + x[0]])).logits[:, len(phrase):]
    # cache + mask path vs the plain forward (rounding), plus the fitted prefix's error relative to its size
    assert_close(withp, plain, rtol=tol(torch.float32, logits_ops(len(phrase) + len(x[0]))) + fit,
                 what="logits with the phrase as prefix vs in the input")
    ids, mask = pad([phrase + r for r in x], 0, left=True)
    for beams in (1, 4):
        out = lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, num_beams=beams, do_sample=False,
                          pad_token_id=0, eos_token_id=2)
        want = [PF.until_eos(r, 2) for r in out[:, ids.shape[1]:].tolist()]
        assert tuner.generate(x, max_new_tokens=6, num_beams=beams) == want


def test_mixed_prefix_batch_equals_each_prefix_alone(lm, tok):
    """Rows with different prefixes (lengths 5, 2, 0, 5 — two rows share one) in one call give, row
    for row, what each prefix gives on its own: logits, greedy and beam search."""
    prefixes = [rand_prefix(lm, 5, 1), rand_prefix(lm, 2, 2), rand_prefix(lm, 0, 3)]
    rows = [0, 1, 2, 0]
    x = PF.encode_sources(tok, SOURCES + SOURCES[1:2])
    y = PF.encode_targets(tok, TARGETS + TARGETS[:1])
    batch = PrefixBatch.mixed([prefixes[r] for r in rows])
    ids, mask, _ = PF.pack_pairs(x, y, 0)
    logits = PF.prefix_forward(lm, batch, ids, mask).logits
    for b, r in enumerate(rows):
        one_ids, one_mask, _ = PF.pack_pairs([x[b]], [y[b]], 0)
        alone = PF.prefix_forward(lm, PrefixBatch.single(prefixes[r], 1), one_ids, one_mask).logits[0]
        n = len(x[b]) + len(y[b])
        # mixed batch (prefixes padded to 5, rows to the longest) vs the row alone: other blocking and masks
        assert_close(logits[b, :n], alone[:n], ops=logits_ops(5 + ids.shape[1]), what=f"logits row {b}")
    for beams in (1, 3):
        mixed = PF.generate(lm, batch, x, 0, 2, max_new_tokens=6, num_beams=beams)
        alone = [PF.generate(lm, PrefixBatch.single(prefixes[r], 1), [x[b]], 0, 2, max_new_tokens=6,
                             num_beams=beams)[0] for b, r in enumerate(rows)]
        assert mixed == alone
        assert mixed[1] != mixed[3]  # same source, different prefixes: the prefix does steer the row


def test_cache_is_fresh_every_call(llama):
    prefix = rand_prefix(llama, 3, 0)
    kept = prefix.clone()
    batch = PrefixBatch.single(prefix, 1)
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)
    a = PF.prefix_forward(llama, batch, ids, mask).logits
    b = PF.prefix_forward(llama, batch, ids, mask).logits
    exact(a, b, "the same call twice: a cache kept between calls would change the second")
    exact(prefix, kept, "the prefix is only read")


# ----------------------------------------------------------------------------- save / load
def test_save_load_generates_identical_text(lm, tok, tmp_path):
    from safetensors import safe_open

    tuner = PrefixTuner(SMALL, lm, tok, lm_name="tiny")
    opt = torch.optim.AdamW(tuner.parameters(), lr=1e-2)
    x, y = PF.encode_sources(tok, SOURCES), PF.encode_targets(tok, TARGETS)
    for _ in range(2):
        opt.zero_grad()
        tuner.loss(x, y).backward()
        opt.step()
    before = tuner.generate_text(SOURCES, max_new_tokens=6, num_beams=2)
    assert before == [tok.decode(r, skip_special_tokens=True).strip()
                      for r in tuner.generate(x, max_new_tokens=6, num_beams=2)]
    tuner.save(tmp_path / "run")

    with safe_open(str(tmp_path / "run" / PF.WEIGHTS), framework="pt") as f:
        assert list(f.keys()) == [PF.PREFIX_KEY]  # the MLP (and P') are not saved
        assert f.get_tensor(PF.PREFIX_KEY).numel() == PF.saved_numel(SMALL, tuner.shape)
    config = json.loads((tmp_path / "run" / PF.CONFIG).read_text())
    assert config["method"] == "prefix" and config["options"]["prefix_length"] == 4

    prefix, cfg, _ = PF.load_prefix(tmp_path / "run", lm)
    assert cfg == SMALL
    batch = PrefixBatch.single(prefix, len(x))
    assert [tok.decode(r, skip_special_tokens=True).strip()
            for r in PF.generate(lm, batch, x, 0, 2, max_new_tokens=6, num_beams=2)] == before
    loaded = PrefixTuner.load(tmp_path / "run", lm, tok)  # the prefix as a direct parameter, ready to train on
    assert loaded.num_trainable() == PF.saved_numel(SMALL, loaded.shape)
    assert loaded.generate_text(SOURCES, max_new_tokens=6, num_beams=2) == before


def test_load_refuses_another_lm(llama, gpt2, tok, tmp_path):
    PrefixTuner(SMALL, llama, tok).save(tmp_path / "run")
    with pytest.raises(PF.PrefixError, match="Load the model it was trained on"):
        PF.load_prefix(tmp_path / "run", gpt2)
    with pytest.raises(PF.PrefixError, match="weights differ"):
        PF.load_prefix(tmp_path / "run", _llama(len(tok), seed=1))
    with pytest.raises(PF.PrefixError, match="no config.json"):
        PF.load_prefix(tmp_path / "nothing")

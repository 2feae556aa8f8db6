"""Prefix-tuning on tiny random encoder-decoder LMs built from a config: a BART (post-LayerNorm,
learned positions, width 32, 2 + 2 layers, 4 heads) and a T5 (RMSNorm, relative position bias,
no 1/√E, width 32, 2 + 2 layers, 4 heads of 8), with a word-level tokenizer. init_std /
initializer_factor are raised so the random models have decisive next-token distributions
(generated ids are then not decided by near-ties).
"""
from __future__ import annotations

import copy
import json

import pytest
import torch

import seq2seq_reference as REF
from conftest import make_bart, make_t5, make_tiny_llama, word_tokenizer
from frozentune.backbone import pad
from frozentune.generation.prefix import PrefixConfig, PrefixError, PrefixTuner
from frozentune.generation.seq2seq import (KINDS, Seq2SeqPrefixTuner, greedy_reference, load_seq2seq_prefix, mixed, prefixed,
                                seq2seq_generate, shapes_from_config, single)
from frozentune.generation.seq2seq.tuner import saved_numel
from numerics import assert_close, linear, transformer

WORDS = "a b c d e f g h i j k l m n o p q r s t".split()
PAD, EOS = 0, 2  # conftest.word_tokenizer's ids

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(WORDS)


MAKERS = {"bart": make_bart, "t5": make_t5}
SOURCES = ["a b c d e", "f g", "h i j k"]


@pytest.fixture(params=list(MAKERS), scope="module")
def arch(request):
    return request.param


@pytest.fixture
def lm(arch, tok):
    return MAKERS[arch](len(tok))


def ids_of(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] + [EOS] for t in texts]


def tuner_of(lm, tok, length=3, reparam=False, seed=1, **kw) -> Seq2SeqPrefixTuner:
    torch.manual_seed(seed)
    return Seq2SeqPrefixTuner(PrefixConfig(prefix_length=length, reparam=reparam, **kw), lm, tok, "tiny")


def ops_of(lm, keys: int) -> int:
    """Roundings behind a logit: every encoder and decoder block (cross-attention counted as one more
    attention block per decoder layer), over `keys` keys, then the LM head."""
    c = lm.config
    d, heads = c.hidden_size, c.num_attention_heads
    ffn = getattr(c, "encoder_ffn_dim", None) or c.d_ff
    layers = c.num_hidden_layers + 2 * (getattr(c, "decoder_layers", None) or c.num_decoder_layers)
    return transformer(layers, d, ffn, keys, d // heads) + linear(d)


# ----------------------------------------------------------------------------- where the prefixes go
def test_three_kinds_of_sites_per_layer(lm, tok):
    tuner = tuner_of(lm, tok)
    assert {k: len(v) for k, v in tuner.sites.items()} == {"encoder": 2, "decoder": 2, "cross": 2}
    assert len({id(s.module) for found in tuner.sites.values() for s in found}) == 6
    assert shapes_from_config(lm.config) == tuner.shapes  # the config alone gives what the model's calls show
    assert sum(p.numel() for p in tuner.trainable_state().values()) == saved_numel(3, tuner.shapes) == 3 * 3 * 2 * 2 * 32


@pytest.mark.parametrize("lengths", [(3, 3, 3), (2, 4, 1)])
def test_prefixed_forward_equals_the_reference(arch, lm, tok, lengths):
    """Every layer and the logits, on a padded batch, with different prefixes in the three kinds."""
    torch.manual_seed(5)
    shapes = shapes_from_config(lm.config)
    prefixes = {k: torch.randn(shapes[k].tensor_shape(p)) for k, p in zip(KINDS, lengths)}
    ids, mask = pad(ids_of(tok, SOURCES), PAD)
    dec = torch.tensor([[lm.config.decoder_start_token_id, 5, 6, 7]] * len(SOURCES))
    tuner = tuner_of(lm, tok)  # routes the model's attention through the prefix attention
    with prefixed(lm, tuner.sites, single(prefixes, len(SOURCES))):
        out = lm(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, output_hidden_states=True)
    logits, enc, dec_states = getattr(REF, arch)(lm, prefixes, ids, mask, dec)
    ops = ops_of(lm, ids.shape[1] + max(lengths))
    real = mask.bool()
    for n in range(len(enc) - 1):  # the last layer's states reach the logits (T5 also norms them)
        assert_close(out.encoder_hidden_states[n + 1][real], enc[n][real], ops=ops, what=f"encoder layer {n}")
        assert_close(out.decoder_hidden_states[n + 1], dec_states[n], ops=ops, what=f"decoder layer {n}")
    assert_close(out.logits, logits, ops=ops, what="logits")


def test_a_prefix_changes_every_kind_of_attention(lm, tok):
    """Each kind alone moves the logits far beyond rounding (so no kind is silently ignored)."""
    torch.manual_seed(5)
    shapes = shapes_from_config(lm.config)
    ids, mask = pad(ids_of(tok, SOURCES), PAD)
    dec = torch.tensor([[lm.config.decoder_start_token_id, 5, 6]] * len(SOURCES))
    tuner = tuner_of(lm, tok)
    zero = {k: torch.zeros(shapes[k].tensor_shape(0)) for k in KINDS}
    with prefixed(lm, tuner.sites, single(zero, 3)):
        base = lm(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    for kind in KINDS:
        one = dict(zero, **{kind: torch.randn(shapes[kind].tensor_shape(3))})
        with prefixed(lm, tuner.sites, single(one, 3)):
            moved = lm(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        assert (moved - base).abs().max() > 1e-2, kind


@pytest.mark.parametrize("num_beams", [1, 3])
def test_zero_length_prefix_is_the_plain_model(lm, tok, num_beams):
    plain = copy.deepcopy(lm)  # its own attention (sdpa), never switched
    tuner = tuner_of(lm, tok, length=0)
    ids, mask = pad(ids_of(tok, SOURCES), PAD)
    dec = torch.tensor([[lm.config.decoder_start_token_id, 5, 6, 7]] * len(SOURCES))
    with prefixed(lm, tuner.sites, tuner.prefix_batch(3, False)):
        got = lm(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    want = plain(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert_close(got, want, ops=ops_of(lm, ids.shape[1]), what="logits")
    expected = plain.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, do_sample=False,
                              max_new_tokens=8, pad_token_id=PAD, eos_token_id=EOS)
    assert tuner.generate(ids_of(tok, SOURCES), max_new_tokens=8, num_beams=num_beams) == \
        [_until_eos(r) for r in expected[:, 1:].tolist()]


def _until_eos(row):
    return row[:row.index(EOS)] if EOS in row else row


def test_generate_equals_forward_only_greedy_loop(lm, tok):
    tuner = tuner_of(lm, tok, length=4, reparam=True)
    prompts = ids_of(tok, SOURCES)
    got = tuner.generate(prompts, max_new_tokens=10)
    want = greedy_reference(lm, tuner.sites, tuner.prefix_batch(3, False), prompts, PAD, EOS, 10)
    assert got == want
    assert len({tuple(r) for r in got}) > 1 or any(len(r) > 1 for r in got)  # not a degenerate all-empty output


def test_beam_search_scores_are_the_prefixed_models_log_probs(arch, lm, tok):
    """Each returned beam's score (length_penalty 0: the sum of its token log-probs) equals that sum
    under the slow reference forward with the same prefixes: beams, their cache reordering and the
    prefix rows stay together."""
    tuner = tuner_of(lm, tok, length=3)
    prompts = ids_of(tok, SOURCES)
    ids, mask = pad(prompts, PAD)
    with prefixed(lm, tuner.sites, tuner.prefix_batch(3, False)):
        out = lm.generate(input_ids=ids, attention_mask=mask, num_beams=3, num_return_sequences=2, do_sample=False,
                          max_new_tokens=6, pad_token_id=PAD, eos_token_id=EOS, length_penalty=0.0,
                          output_scores=True, return_dict_in_generate=True)
    prefixes = tuner.prefixes()
    for row, (seq, score) in enumerate(zip(out.sequences, out.sequences_scores)):
        b = row // 2
        tokens = seq.tolist()
        n = tokens.index(EOS, 1) + 1 if EOS in tokens[1:] else len(tokens)
        dec = seq[None, :n - 1]
        logits, _, _ = getattr(REF, arch)(lm, prefixes, ids[b:b + 1], mask[b:b + 1], dec)
        logp = logits[0].log_softmax(-1).gather(-1, seq[1:n, None]).sum()
        assert_close(score, logp, ops=ops_of(lm, ids.shape[1] + 3) * n, what=f"beam {row}")


@pytest.mark.parametrize("num_beams", [1, 3])
def test_mixed_prefix_batch_equals_each_prefix_alone(lm, tok, num_beams):
    tuners = [tuner_of(lm, tok, length=p, reparam=r, seed=s) for p, r, s in ((3, False, 1), (5, True, 2), (0, False, 3))]
    prompts = ids_of(tok, SOURCES)
    batch = mixed([t.prefixes() for t in tuners])
    together = seq2seq_generate(lm, tuners[0].sites, batch, prompts, PAD, EOS, 8, num_beams)
    alone = [t.generate([p], max_new_tokens=8, num_beams=num_beams)[0] for t, p in zip(tuners, prompts)]
    assert together == alone
    assert len({tuple(r) for r in alone}) > 1  # the prefixes make a difference


# ----------------------------------------------------------------------------- training, saving, init
@pytest.mark.parametrize("reparam", [False, True])
def test_gradients_reach_all_three_prefixes_and_nothing_else(lm, tok, reparam):
    tuner = tuner_of(lm, tok, reparam=reparam)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    loss = tuner.loss(ids_of(tok, SOURCES), ids_of(tok, ["c d", "e", "f g h"]))
    loss.backward()
    assert torch.isfinite(loss)
    for kind, enc in tuner.encoders.items():
        grads = [p.grad for p in enc.parameters()]
        assert all(g is not None and g.abs().sum() > 0 for g in grads), kind
    assert all(p.grad is None for p in lm.parameters())
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())


def test_loss_is_the_target_token_cross_entropy(lm, tok):
    tuner = tuner_of(lm, tok)
    sources, targets = ids_of(tok, SOURCES[:2]), ids_of(tok, ["c d", "e"])
    start = lm.config.decoder_start_token_id
    total, count = 0.0, 0
    for x, y in zip(sources, targets):
        with prefixed(lm, tuner.sites, tuner.prefix_batch(1, False)):
            logits = lm(input_ids=torch.tensor([x]), decoder_input_ids=torch.tensor([[start] + y[:-1]])).logits[0]
        total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(y), reduction="sum"))
        count += len(y)
    assert_close(tuner.loss(sources, targets).detach(), torch.tensor(total / count), ops=ops_of(lm, 6) + 10)


@pytest.mark.parametrize("reparam", [False, True])
def test_words_init_is_the_models_own_keys_and_values(lm, tok, reparam):
    tuner = tuner_of(lm, tok, length=4, reparam=reparam, init="words", init_text="a b")
    ids = torch.tensor([tok("a b a b", add_special_tokens=False)["input_ids"]])
    from frozentune.generation.seq2seq.attention import record
    with record() as calls:
        lm(input_ids=ids, decoder_input_ids=ids, use_cache=False)
    keys = {id(m): k[0] for m, _, k, _ in calls}
    got = tuner.prefixes()
    for kind, found in tuner.sites.items():
        for n, site in enumerate(found):
            assert_close(got[kind][n, 0], keys[id(site.module)], rtol=1e-5 if reparam else 0.0, what=kind)


def test_save_load_generates_identically_and_keeps_only_the_prefixes(lm, tok, tmp_path):
    tuner = tuner_of(lm, tok, length=4, reparam=True)
    tuner.save(tmp_path / "m")
    from safetensors.torch import load_file
    state = load_file(tmp_path / "m" / "model.safetensors")
    assert set(state) == {"prefix.encoder", "prefix.decoder", "prefix.cross"}
    assert sum(v.numel() for v in state.values()) == saved_numel(4, tuner.shapes)
    loaded = Seq2SeqPrefixTuner.load(tmp_path / "m", lm, tok)
    prompts = ids_of(tok, SOURCES)
    for beams in (1, 3):
        assert loaded.generate(prompts, max_new_tokens=8, num_beams=beams) == \
            tuner.generate(prompts, max_new_tokens=8, num_beams=beams)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architecture"] == "encoder-decoder"


def test_prefixes_of_one_kind_of_lm_are_refused_by_the_other(lm, tok, tmp_path):
    llama_dir = make_tiny_llama(tmp_path / "llama", WORDS)
    from transformers import AutoModelForCausalLM
    llama = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    with pytest.raises(PrefixError, match="encoder-decoder model; its prefix is"):
        PrefixTuner(PrefixConfig(prefix_length=2), lm, tok)
    with pytest.raises(PrefixError, match="decoder-only LM"):
        Seq2SeqPrefixTuner(PrefixConfig(prefix_length=2), llama, tok)
    tuner_of(lm, tok).save(tmp_path / "s2s")
    PrefixTuner(PrefixConfig(prefix_length=2), llama, tok).save(tmp_path / "causal")
    with pytest.raises(PrefixError, match="prefix for an encoder-decoder LM cannot be loaded on a decoder-only"):
        PrefixTuner.load(tmp_path / "s2s", llama, tok)
    with pytest.raises(PrefixError, match="prefix for a decoder-only .causal. LM cannot be loaded on an encoder-decoder"):
        Seq2SeqPrefixTuner.load(tmp_path / "causal", lm, tok)
    with pytest.raises(PrefixError, match="cannot be loaded on an encoder-decoder LM"):
        from frozentune.registry import get_method
        get_method("prefix").generator.load(tmp_path / "causal", lm, tok)


def test_load_refuses_another_model(tok, tmp_path):
    bart, t5 = make_bart(len(tok)), make_t5(len(tok))
    tuner_of(bart, tok).save(tmp_path / "b")
    with pytest.raises(PrefixError, match="this model has|weights differ"):
        load_seq2seq_prefix(tmp_path / "b", t5)
    with pytest.raises(PrefixError, match="weights differ"):
        load_seq2seq_prefix(tmp_path / "b", make_bart(len(tok), seed=1))


def test_bart_base_prefix_size_from_its_config():
    """BART-base (6 + 6 layers, width 768, 12 heads): 3 kinds × 6 layers × 2 × 768 per prefix slot."""
    from transformers import BartConfig
    cfg = BartConfig(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                     decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265)
    assert saved_numel(200, shapes_from_config(cfg)) == 200 * 3 * 6 * 2 * 768


@pytest.mark.parametrize("causal", [False, True])
def test_attention_given_no_mask_follows_the_module(causal):
    """transformers may pass no mask (nothing to hide); a causal module then still hides later keys:
    query i of the last Q sees keys up to S − Q + i."""
    from frozentune.generation.seq2seq.attention import prefixed_attention
    from numerics import attention

    module = torch.nn.Module()
    module.is_causal = causal
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    got, _ = prefixed_attention(module, q, k, v, None)
    allowed = torch.ones(3, 5, dtype=torch.bool).tril(2) if causal else torch.ones(3, 5, dtype=torch.bool)
    scores = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~allowed, float("-inf"))
    want = (scores.softmax(-1) @ v).transpose(1, 2)
    assert_close(got, want, ops=attention(5, 8), what="attention")


@pytest.mark.parametrize("arch_name", ["bart", "t5"])
def test_finetune_top_layers_takes_the_top_block_of_encoder_and_decoder(arch_name, tok):
    from frozentune.registry import get_method, make_config

    lm = {"bart": make_bart, "t5": make_t5}[arch_name](len(tok))
    tuner = get_method("finetune").generator(make_config("finetune", {"top_layers": 1}), lm, tok, "tiny")
    trained = [n for n, p in lm.named_parameters() if p.requires_grad]
    layer = {"bart": ("encoder.layers.1.", "decoder.layers.1."), "t5": ("encoder.block.1.", "decoder.block.1.")}[arch_name]
    assert trained and all(any(x in n for x in layer) for n in trained)
    assert {x for x in layer if any(x in n for n in trained)} == set(layer)  # both sides
    loss = tuner.loss(ids_of(tok, SOURCES), ids_of(tok, ["c d", "e", "f g h"]))
    loss.backward()
    assert all(p.grad is not None for p in lm.parameters() if p.requires_grad)

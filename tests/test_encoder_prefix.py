"""Encoder prefix-tuning on tiny random BERTs built from a config (2 layers, hidden 32, 4 heads of
8 dims, seeded; no downloads), under both the eager and the sdpa attention implementation. The
central check is a slow hand-written BERT forward with explicit prefix concatenation, built from
the model's own weights."""
from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from frozentune.backbone import LayerSpec, freeze, weights_hash
from frozentune.generation.encoder_prefix import encoder_kv_shape, prefix_encode, prefix_hidden_states
from frozentune.generation.prefix import PrefixError
from numerics import ROUNDING, assert_close, exact, linear, prefix_mlp_scale, transformer

IMPLS = ("eager", "sdpa")
VOCAB, HIDDEN, LAYERS, HEADS = 50, 32, 2, 4


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_bert(impl: str, seed: int = 0):
    """A frozen random BertModel (fresh config each time: _from_config writes the implementation into it)."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=2 * HIDDEN, max_position_embeddings=64, initializer_range=0.2)
    torch.manual_seed(seed)
    model = BertModel._from_config(cfg, attn_implementation=impl)
    assert model.config._attn_implementation == impl
    freeze(model)
    return model


@pytest.fixture(scope="module", params=IMPLS)
def model(request):
    return tiny_bert(request.param)


def batch(lengths: list[int], seed: int = 1) -> tuple[Tensor, Tensor]:
    """Right-padded random ids (B, T) (pad id 0) and mask (B, T)."""
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.zeros(len(lengths), t, dtype=torch.long)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[b, :n] = 1
    return ids, mask


def random_prefix(model, length: int, rows: int | None = None, seed: int = 2) -> Tensor:
    """(N, 2, H, P, E), or (rows, N, 2, H, P, E); scaled up so the prefix changes the output clearly."""
    shape = encoder_kv_shape(model.config).tensor_shape(length)
    g = torch.Generator().manual_seed(seed)
    return 2 * torch.randn(((rows,) if rows else ()) + shape, generator=g)


def plain(model, ids: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
    with torch.no_grad():
        return tuple(model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states)


def forward_ops(keys: int) -> int:
    """Roundings of one tiny-BERT forward whose attention reads `keys` slots (prefix + tokens)."""
    return transformer(LAYERS, HIDDEN, 2 * HIDDEN, keys, HIDDEN // HEADS)


def assert_states_close(a, b, keys: int, mask: Tensor | None = None) -> None:
    """Every hidden state equal up to fp32 rounding of two forwards along different kernel paths."""
    assert len(a) == len(b)
    for n, (x, y) in enumerate(zip(a, b)):
        if mask is not None:
            x, y = x[mask.bool()], y[mask.bool()]
        assert_close(x, y, ops=forward_ops(keys), what=f"hidden state {n}")


def assert_states_equal(a, b, why: str) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        exact(x, y, why)


# ----------------------------------------------------------------------------- slow reference
def reference(model, prefix: Tensor, ids: Tensor, mask: Tensor, prefix_mask: Tensor) -> list[Tensor]:
    """One BERT forward written out from the model's weights, each layer's keys/values being
    [prefix; tokens]. prefix (B, N, 2, H, P, E), prefix_mask (B, P) bool; hidden states (B, T, D)."""
    emb, cfg = model.embeddings, model.config
    b, t = ids.shape
    h, e = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    x = emb.word_embeddings.weight[ids] + emb.position_embeddings.weight[:t] + emb.token_type_embeddings.weight[0]
    x = torch.nn.functional.layer_norm(x, (cfg.hidden_size,), emb.LayerNorm.weight, emb.LayerNorm.bias,
                                       cfg.layer_norm_eps)
    states = [x]
    allowed = torch.cat([prefix_mask, mask.bool()], 1)                  # (B, P+T)
    bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[:, None, None, :]

    def lin(layer, v):
        return v @ layer.weight.T + layer.bias

    def ln(layer, v):
        return torch.nn.functional.layer_norm(v, (cfg.hidden_size,), layer.weight, layer.bias, cfg.layer_norm_eps)

    for n, layer in enumerate(model.encoder.layer):
        att = layer.attention.self
        split = lambda v: v.view(b, t, h, e).transpose(1, 2)             # (B, H, T, E)
        q = split(lin(att.query, x))
        k = torch.cat([prefix[:, n, 0], split(lin(att.key, x))], 2)      # (B, H, P+T, E)
        v = torch.cat([prefix[:, n, 1], split(lin(att.value, x))], 2)
        probs = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(e) + bias, -1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, t, h * e)
        a = ln(layer.attention.output.LayerNorm, lin(layer.attention.output.dense, ctx) + x)
        inner = torch.nn.functional.gelu(lin(layer.intermediate.dense, a))
        x = ln(layer.output.LayerNorm, lin(layer.output.dense, inner) + a)
        states.append(x)
    return states


# ----------------------------------------------------------------------------- 1. no prefix = plain model
def test_empty_prefix_is_plain_model(model):
    ids, mask = batch([7, 4, 6])
    want = plain(model, ids, mask)
    with torch.no_grad():
        # the prefix path passes a 4D mask (another SDPA/eager kernel path than the plain model): rounding only
        assert_states_close(prefix_hidden_states(model, None, ids, mask), want, keys=7)
        assert_states_close(prefix_hidden_states(model, random_prefix(model, 0), ids, mask), want, keys=7)
        off = torch.zeros(3, 5, dtype=torch.bool)
        assert_states_close(prefix_hidden_states(model, random_prefix(model, 5), ids, mask, off), want, keys=5 + 7)
        # and a real prefix does change the states (so the comparisons above mean something)
        moved = prefix_hidden_states(model, random_prefix(model, 5), ids, mask)
    assert (moved[-1] - want[-1]).abs().max() > 0.1  # effect size (states ~1): 100× the rounding bound above
    exact(moved[0], want[0], "embeddings: the prefix enters in attention only; same embedding kernels, same ids")


# ----------------------------------------------------------------------------- 2. slow reference
@pytest.mark.parametrize("per_row", [False, True])
def test_matches_reference(model, per_row):
    ids, mask = batch([6, 3, 5, 1])
    p = 4
    pre = random_prefix(model, p, rows=4 if per_row else None, seed=3)
    pmask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    with torch.no_grad():
        got = prefix_hidden_states(model, pre, ids, mask, pmask)
        want = reference(model, pre if per_row else pre.expand(4, *pre.shape), ids, mask, pmask)
    assert len(got) == LAYERS + 1
    assert_states_close(got, want, keys=p + 6)
    assert (got[-1] - plain(model, ids, mask)[-1]).abs().max() > 0.1  # effect size: 100× the rounding bound


# ----------------------------------------------------------------------------- 3. padding invariance
def test_padding_invariance(model):
    ids, mask = batch([3, 8, 5], seed=4)
    pre = random_prefix(model, 6, seed=5)
    with torch.no_grad():
        together = prefix_hidden_states(model, pre, ids, mask)
        for b in range(3):
            n = int(mask[b].sum())
            alone = prefix_hidden_states(model, pre, ids[b:b + 1, :n], mask[b:b + 1, :n])
            assert_states_close([s[b:b + 1, :n] for s in together], alone, keys=6 + 8)
            # the same row padded further on the right alone
            extra = torch.cat([ids[b:b + 1, :n], torch.zeros(1, 4, dtype=torch.long)], 1)
            extra_mask = torch.cat([mask[b:b + 1, :n], torch.zeros(1, 4, dtype=torch.long)], 1)
            padded = prefix_hidden_states(model, pre, extra, extra_mask)
            assert_states_close([s[:, :n] for s in padded], alone, keys=6 + n + 4)


# ----------------------------------------------------------------------------- 4. gradients
def test_gradients_reach_prefix_only(model):
    before = weights_hash(model)
    ids, mask = batch([5, 2, 4], seed=6)
    pre = random_prefix(model, 3, seed=7).requires_grad_(True)
    states = prefix_hidden_states(model, pre, ids, mask)
    (states[-1] * torch.randn_like(states[-1])).sum().backward()
    assert pre.grad is not None and torch.isfinite(pre.grad).all()
    for n in range(LAYERS):
        for kv in range(2):
            assert pre.grad[n, kv].abs().max() > 0, f"no gradient for layer {n} {'keys' if kv == 0 else 'values'}"
    assert all(p.grad is None for p in model.parameters())
    assert weights_hash(model) == before

    # per-row prefixes: gradients reach only the real slots of each row
    rows = random_prefix(model, 3, rows=3, seed=8).requires_grad_(True)
    pmask = torch.tensor([[1, 1, 1], [0, 1, 1], [1, 0, 0]], dtype=torch.bool)
    prefix_hidden_states(model, rows, ids, mask, pmask)[-1].pow(2).sum().backward()
    slot_grad = rows.grad.abs().amax(dim=(1, 2, 3, 5))  # (B, P)
    assert (slot_grad[pmask] > 0).all() and (slot_grad[~pmask] == 0).all()
    assert all(p.grad is None for p in model.parameters())


# ----------------------------------------------------------------------------- 5. per-row prefixes
def test_per_row_prefixes_equal_rows_alone(model):
    ids, mask = batch([4, 7, 2], seed=9)
    rows = random_prefix(model, 5, rows=3, seed=10)
    pmask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        together = prefix_hidden_states(model, rows, ids, mask, pmask)
        for b in range(3):
            n = int(mask[b].sum())
            own = rows[b][:, :, :, pmask[b]]  # (N, 2, H, P_b, E)
            alone = prefix_hidden_states(model, own, ids[b:b + 1, :n], mask[b:b + 1, :n])
            assert_states_close([s[b:b + 1, :n] for s in together], alone, keys=5 + 7)
        # rows really differ: row 0 with row 1's prefix gives other states
        swapped = prefix_hidden_states(model, rows[1][:, :, :, pmask[1]], ids[:1, :4], mask[:1, :4])
    assert (swapped[-1] - together[-1][:1, :4]).abs().max() > 0.1  # effect size: 100× the rounding bound


# ----------------------------------------------------------------------------- 6. nothing left installed
def installed(model) -> list:
    """Everything a call could leave behind: hooks, instance-level forwards, the attention choice."""
    left = []
    for name, m in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if getattr(m, attr, None):
                left.append((name, attr))
        if "forward" in vars(m):
            left.append((name, "forward"))
    return left + [model.config._attn_implementation]


def test_nothing_left_installed(model):
    ids, mask = batch([6, 3], seed=11)
    want = plain(model, ids, mask)
    state = installed(model)
    pre = random_prefix(model, 4, seed=12)
    with torch.no_grad():
        prefix_hidden_states(model, pre, ids, mask)
    assert installed(model) == state
    assert_states_equal(plain(model, ids, mask), want, "the same call on the same model: a leftover would change it")

    # a call that raises inside the forward, after the first layer took its prefix
    def boom(*_):
        raise RuntimeError("boom")

    handle = model.encoder.layer[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
            prefix_hidden_states(model, pre, ids, mask)
    finally:
        handle.remove()
    assert installed(model) == state
    assert_states_equal(plain(model, ids, mask), want, "the same call on the same model: a leftover would change it")

    # a call refused by the checks
    with pytest.raises(PrefixError):
        prefix_hidden_states(model, pre[:1], ids, mask)
    assert_states_equal(plain(model, ids, mask), want, "the same call on the same model: a leftover would change it")


# ----------------------------------------------------------------------------- 7. clear errors
@pytest.mark.parametrize("bad", [(LAYERS + 1, 2, HEADS, 3, 8), (LAYERS, 2, HEADS - 1, 3, 8),
                                 (LAYERS, 2, HEADS, 3, 16), (LAYERS, 3, HEADS, 3, 8), (2, HEADS, 3, 8)])
def test_wrong_prefix_shape(model, bad):
    ids, mask = batch([3, 2])
    with pytest.raises(PrefixError, match=r"\(2, 2, 4, P, 8\)") as err:
        prefix_hidden_states(model, torch.zeros(bad), ids, mask)
    assert isinstance(err.value, ValueError)


def test_wrong_rows_and_masks(model):
    ids, mask = batch([3, 2])
    with pytest.raises(PrefixError, match="one prefix per row"):
        prefix_hidden_states(model, random_prefix(model, 3, rows=3), ids, mask)
    with pytest.raises(PrefixError, match=r"prefix_mask .*\(2, 3\)"):
        prefix_hidden_states(model, random_prefix(model, 3), ids, mask, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(PrefixError, match="must match input_ids"):
        prefix_hidden_states(model, random_prefix(model, 3), ids, mask[:, :2])


def test_unsupported_models():
    from transformers import GPT2Config, GPT2Model

    gpt2 = GPT2Model(GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64))
    ids, mask = batch([3, 2])
    pre = torch.zeros(encoder_kv_shape(gpt2.config).tensor_shape(2))
    with pytest.raises(PrefixError, match="BertModel") as err:
        prefix_hidden_states(gpt2, pre, ids, mask)
    assert isinstance(err.value, ValueError) and "frozentune.generation.prefix" in str(err.value)

    bert = tiny_bert("sdpa")
    bert.config._attn_implementation = "flash_attention_2"  # (only the name is read before refusing)
    with pytest.raises(PrefixError, match="attn_implementation='sdpa'"):
        prefix_hidden_states(bert, pre, ids, mask)

    bert = tiny_bert("sdpa")
    enable = getattr(bert, "activation_checkpointing_enable", None) or bert.gradient_checkpointing_enable
    enable()
    bert.train()
    with pytest.raises(PrefixError, match="checkpointing"):
        prefix_hidden_states(bert, pre, ids, mask)


def test_head_model_and_layer_selection():
    """A BertFor… model is unwrapped to its BertModel; prefix_encode selects layers like backbone.encode."""
    from transformers import BertForMaskedLM

    bert = tiny_bert("sdpa")
    head = BertForMaskedLM(bert.config)
    head.bert.load_state_dict(bert.state_dict(), strict=False)
    freeze(head)
    ids, mask = batch([5, 3], seed=13)
    pre = random_prefix(bert, 2, seed=14)
    with torch.no_grad():
        states = prefix_hidden_states(bert, pre, ids, mask)
        assert_states_equal(prefix_hidden_states(head, pre, ids, mask), states,
                            "the same BertModel code with the same weights on the same inputs")
        exact(prefix_encode(bert, pre, ids, mask), states[-1], "the same call; selecting a layer copies nothing")
        both = prefix_encode(bert, pre, ids, mask, LayerSpec((-1, -2), "concat"))
    exact(both, torch.cat([states[-1], states[-2]], -1), "concatenation copies the same states")


def test_words_init_is_the_phrase_activations():
    """encoder_activations reads layer n's keys/values on the phrase: they equal the layer's own key
    and value projections of its input states, and a prefix started from them holds exactly them."""
    from frozentune.generation.encoder_prefix import encoder_activations
    from frozentune.generation.prefix import PrefixConfig, PrefixEncoder

    model = tiny_bert("sdpa")
    ids = [5, 7, 9, 11]
    kv = encoder_activations(model, ids)
    assert kv.shape == (LAYERS, 2, HEADS, 4, HIDDEN // HEADS)
    x = torch.tensor([ids])
    with torch.no_grad():
        states = model(input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True).hidden_states
        for n, layer in enumerate(model.encoder.layer):
            att = layer.attention.self
            for j, proj in enumerate((att.key, att.value)):
                want = proj(states[n])[0].view(4, HEADS, HIDDEN // HEADS).transpose(0, 1)  # (H, P, E)
                # the same projection, but inside a forward fed a capturing cache (its own mask path)
                assert_close(kv[n, j], want, ops=forward_ops(4) + linear(HIDDEN), what=f"layer {n} kv {j}")
    enc = PrefixEncoder(PrefixConfig(prefix_length=4), encoder_kv_shape(model.config), HIDDEN)
    enc.init_from(kv)
    assert_close(enc(), kv, ops=linear(enc.cfg.reparam_hidden) + ROUNDING, scale=prefix_mlp_scale(enc),
                 what="MLP fitted to the phrase's keys/values")

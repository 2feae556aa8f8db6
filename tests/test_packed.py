"""The packed frozen pass (extract/packed.py): linear layers on the real tokens only.

Compared with the model's own padded forward at the real tokens. The two compute the same sums
per row along other kernel paths (a matrix of N packed rows instead of B·T padded ones; the same
masked SDPA): in fp32 they differ by rounding only, bounded as in numerics.py by the whole
forward's chain, tol(float32, transformer(...)). In bf16/fp16/int8 each rounding to the low
precision of a value that differs by fp32 rounding may land one step apart, so the bound is that
precision's own against fp32 (test_precision.rtol, the same chain). A mask bug (padding attended
to, a row shifted) moves states by 1e-1 or more (checked below), far past every bound.
"""
from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, RobertaConfig, RobertaModel

from frozentune.backbone import Backbone, LayerSpec, freeze
from frozentune.extract.packed import packed_hidden_states, packing_reason
from frozentune.extract.precision import PRECISIONS, prepare
from numerics import assert_close, exact
from test_precision import FFN, HEADS, LAYERS, WIDTH, rtol

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_thread")


def _frozen(m: torch.nn.Module) -> torch.nn.Module:
    freeze(m)
    return m


@pytest.fixture(scope="module", params=["bert", "roberta"])
def model(request) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=100, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=FFN, attn_implementation="sdpa", initializer_range=0.2)
    if request.param == "bert":
        return _frozen(BertModel(BertConfig(max_position_embeddings=64, **common)))
    return _frozen(RobertaModel(RobertaConfig(max_position_embeddings=66, pad_token_id=1, **common)))


def batch(pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of 12, 5, 9 and 2 real tokens, right-padded with pad_id; the third row in token type 1 from
    its 5th token (a pair)."""
    g = torch.Generator().manual_seed(1)
    lengths = [12, 5, 9, 2]
    ids = torch.randint(3, 100, (4, 12), generator=g)
    mask = (torch.arange(12)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, pad_id)
    types = torch.zeros_like(ids)
    types[2, 4:9] = 1
    return ids, mask, types


def padded_states(runner, ids, mask, types):
    with torch.no_grad():
        return runner(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True).hidden_states


@pytest.mark.parametrize("precision", PRECISIONS)
def test_packed_equals_the_padded_forward_at_real_tokens(model, precision):
    runner = prepare(model, precision, CPU)
    assert packing_reason(runner) is None
    ids, mask, types = batch(model.config.pad_token_id)
    want = padded_states(runner, ids, mask, types)
    got = packed_hidden_states(runner, ids, mask, types)
    keep = mask.bool()
    assert len(got) == len(want) == LAYERS + 1
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape
        assert_close(g[keep].float(), w[keep].float(), rtol=rtol(precision), what=f"{precision} state {i}")
        exact(g[~keep], torch.zeros_like(g[~keep]), "padding is filled with 0")


def test_a_row_does_not_depend_on_the_batch(model):
    """Each text's states equal those of the text alone (no padding at all) within fp32 rounding."""
    ids, mask, types = batch(model.config.pad_token_id)
    together = packed_hidden_states(model, ids, mask, types)
    for r in range(len(ids)):
        n = int(mask[r].sum())
        alone = packed_hidden_states(model, ids[r:r + 1, :n], mask[r:r + 1, :n], types[r:r + 1, :n])
        for i in (1, LAYERS):
            assert_close(together[i][r, :n], alone[i][0], rtol=rtol("fp32"), what=f"row {r} state {i}")


def test_the_tolerance_catches_attention_to_padding(model):
    """The bound means something: letting padding into attention (the mask dropped) moves the states past it."""
    ids, mask, types = batch(model.config.pad_token_id)
    want = padded_states(model, ids, mask, types)
    with torch.no_grad():
        leaky = model(input_ids=ids, attention_mask=torch.ones_like(mask), token_type_ids=types,
                      output_hidden_states=True).hidden_states
    keep = mask.bool()
    with pytest.raises(AssertionError):
        assert_close(leaky[-1][keep], want[-1][keep], rtol=rtol("fp32"))


def test_other_layouts_are_named_and_refused():
    torch.manual_seed(0)
    gpt2 = _frozen(GPT2Model(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16)))
    assert "gpt2" in packing_reason(gpt2)
    decoder = _frozen(BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=32, is_decoder=True)))
    assert "decoder" in packing_reason(decoder)
    with pytest.raises(ValueError, match="cannot run this model packed: model type 'gpt2'"):
        packed_hidden_states(gpt2, torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))


def test_backbone_states_pack_and_say_so(tiny_bert):
    """Backbone.states / hidden_states run packed by default and padded with pack off; both agree."""
    bb = Backbone.load(str(tiny_bert), LayerSpec((-1, 1), "concat"), max_length=16)
    tokens = bb.tokenize(["a short one .", "a somewhat longer sentence about films and acting ."])
    ids, mask, types = tokens.padded([0, 1], bb.pad_id())
    assert bb.packs and bb.pass_layout == "packed"
    packed = bb.states(ids, mask, types)
    bb.pack = False
    assert not bb.packs and bb.pass_layout == "padded: packing turned off"
    padded = bb.states(ids, mask, types)
    keep = mask.bool()
    assert_close(packed[keep], padded[keep], rtol=rtol("fp32"), what="Backbone.states packed vs padded")

import pytest
import torch

from frozentune.backbone import Backbone
from frozentune.head import Features
from frozentune.heads.ytuning import margin_loss
from frozentune.model import build_classifier
from frozentune.registry import MethodError, create_method
from numerics import ROUNDING, approx, assert_close, assert_differs, attention_block, dot, ffn_block, linear, softmax, tol


def head_ops(T: int, D: int = 32, d: int = 16, heads: int = 4, labels: int = 4, layers: int = 2) -> int:
    """Scores of the default label encoder: the projection D → d, per block self-attention over the
    label vectors, cross-attention over T tokens and the FFN (2·d), then the pointer's d-term dot."""
    block = attention_block(d, labels, d // heads) + attention_block(d, T, d // heads) + ffn_block(d, 2 * d)
    return linear(D) + layers * block + dot(d)


def cosine_ops(D: int) -> int:
    """cosine_similarity over D: three D-term dots, the product and sqrt of the norms, the division."""
    return 3 * dot(D) + 3


def feats(B=3, T=7, D=32, seed=0, lengths=(7, 4, 2)):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return Features(hidden * mask[..., None], mask)


def test_margin_loss_hand_computed():
    s = torch.tensor([[2.0, 0.5, 1.8], [0.0, 3.0, 1.0]])
    y = torch.tensor([0, 2])
    # row 0: [0.5-2+1]+ + [1.8-2+1]+ = 0 + 0.8 ; row 1: [0-1+1]+ + [3-1+1]+ = 0 + 3
    # float32: 1.8 and 2.1 are rounded, then s_c − s_c* + α, the sum over classes, the mean; terms ~3 cancel
    hinge_ops = ROUNDING + 2 + dot(3) + dot(2) + 1
    assert margin_loss(s, y, 1.0).item() == approx((0.8 + 3.0) / 2, ops=hinge_ops, scale=3.0)
    # zero once the true score beats every other by at least alpha (exact: clamped to 0, a sum of zeros)
    assert margin_loss(torch.tensor([[3.0, 2.0, 1.5]]), torch.tensor([0]), 1.0).item() == 0.0
    assert margin_loss(torch.tensor([[3.0, 2.1, 1.5]]), torch.tensor([0]), 1.0).item() == approx(0.1, ops=hinge_ops, scale=3.0)


def test_padding_does_not_change_scores():
    head, _ = create_method("ytuning", 32, 3, {"dim": 16})
    head.eval()
    f = feats()
    longer = Features(torch.cat([f.hidden, torch.randn(3, 5, 32)], 1), torch.cat([f.mask, torch.zeros(3, 5, dtype=torch.bool)], 1))
    a, b = head(f), head(longer)
    # cross-attention over 12 keys (5 masked) instead of 7: other softmax/product lengths
    assert_close(a.logits, b.logits, ops=head_ops(12), what="scores")
    assert_close(a.extras["label_attention"], b.extras["label_attention"][..., :7], ops=head_ops(12), what="attention")


@pytest.mark.parametrize("options", [{"dim": 16}, {"dim": 0, "k": 2}])
def test_inference_folds_keys_and_values_into_the_labels(options):
    """Without autograd, in eval, the cross-attention never forms the tokens' keys and values
    (folded_cross_attention): the same scores and label attention as nn.MultiheadAttention's, on
    padded rows; a row's key-bias shift is dropped, which the softmax ignores."""
    head, _ = create_method("ytuning", 32, 3, options)
    head.eval()
    with torch.no_grad():  # the attention's biases made large, so that dropping the wrong one shows
        for block in head.blocks:
            block.cross_attn.in_proj_bias.normal_(0, 1.0)
    f = feats(lengths=(7, 4, 2))
    with torch.no_grad():
        folded = head(f)
    plain = head(f)  # autograd on: nn.MultiheadAttention
    assert plain.logits.requires_grad
    d = options["dim"] or 32
    assert_close(folded.logits, plain.logits, ops=head_ops(7, d=d, labels=1 + 3 * options.get("k", 1)), what="scores")
    assert_close(folded.extras["label_attention"], plain.extras["label_attention"],
                 ops=head_ops(7, d=d, labels=1 + 3 * options.get("k", 1)), what="attention")
    assert (folded.extras["label_attention"][~f.mask[:, None, :].expand(-1, 3, -1)] == 0).all()  # exact: exp(−inf)


def test_inference_remakes_what_it_keeps_when_the_weights_change():
    """Inference keeps the weight-only part of the label encoder (block 1's label side, the folded maps:
    YTuningHead.folded) between calls, and makes it again when a parameter changes in place (an
    optimiser step, load_state_dict) or is replaced: its scores always equal the training path's."""
    head, _ = create_method("ytuning", 32, 3, {"dim": 16})
    head.eval()
    f = feats()
    with torch.no_grad():
        head(f)
        kept = head.folded()
        assert head.folded() is kept  # no change: reused, not remade
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))  # in place, as an optimiser step
        stepped = head(f)
    assert head.folded() is not kept
    assert_close(stepped.logits, head(f).logits, ops=head_ops(7), what="scores after an in-place change")
    other, _ = create_method("ytuning", 32, 3, {"dim": 16})
    head.load_state_dict(other.state_dict())
    with torch.no_grad():
        loaded = head(f)
    assert_close(loaded.logits, head(f).logits, ops=head_ops(7), what="scores after load_state_dict")
    head.labels = torch.nn.Parameter(torch.randn_like(head.labels))  # replaced, not changed in place
    with torch.no_grad():
        replaced = head(f)
    assert_close(replaced.logits, head(f).logits, ops=head_ops(7), what="scores after a replaced parameter")
    assert_differs(replaced.logits, loaded.logits, ops=head_ops(7), what="new label vectors change the scores")


def test_explanation_is_a_distribution_over_real_tokens():
    head, _ = create_method("ytuning", 32, 4, {"k": 2})
    head.eval()
    f = feats()
    w = head(f).extras["label_attention"]  # (B, C, T)
    assert w.shape == (3, 4, 7)
    # softmax over 7 keys, summed, averaged over 4 heads and k = 2 vectors
    assert_close(w.sum(-1), torch.ones(3, 4), ops=softmax(7) + dot(7) + dot(4) + dot(2), what="Σ attention")
    assert (w[~f.mask[:, None, :].expand_as(w)] == 0).all()  # exact: masked keys get exp(−inf) = 0


@pytest.mark.parametrize("pool", ["mean", "max"])
def test_k_vectors_per_label_are_pooled(pool):
    head, cfg = create_method("ytuning", 32, 3, {"k": 2, "pool": pool})
    head.eval()
    f = feats()
    x, y = head.proj(f.hidden), head.labels.unsqueeze(0).expand(3, -1, -1)
    for block in head.blocks:
        y, _ = block(y, x, ~f.mask)
    labels = y[:, 1:].reshape(3, 3, 2, -1)  # (B, C, k, D): vectors 1+2c and 2+2c belong to class c
    pooled = labels.mean(2) if pool == "mean" else labels.amax(2)
    expect = torch.einsum("bd,bcd->bc", y[:, 0], pooled)
    # the same blocks on the same inputs; the pooling (k = 2) and d-term pointer dot may be evaluated otherwise
    assert_close(head(f).logits, expect, ops=dot(2) + 1 + dot(16),
                 scale=torch.einsum("bd,bcd->bc", y[:, 0].abs(), pooled.abs()), what="scores")
    assert head.labels.shape == (1 + 3 * 2, cfg.dim)


def test_label_name_initialisation_uses_the_vocabulary(tiny_bert):
    bb = Backbone.load(str(tiny_bert), max_length=16)
    emb = bb.model.get_input_embeddings().weight
    names = ["negative", "positive"]
    want = torch.stack([emb[bb.tok(n, add_special_tokens=False)["input_ids"]].mean(0) for n in names])
    # D = backbone width: same direction as the names' embeddings (rescaled)
    init = build_classifier("ytuning", bb, names, {"dim": 0}).head.labels.detach()
    # the same vectors up to rounding (a positive rescale; no noise for k = 1): cos = 1 within its own rounding
    assert (torch.nn.functional.cosine_similarity(init[1:], want, dim=-1) > 1 - tol(torch.float32, cosine_ops(32))).all()
    # D < width: the names' embeddings through the initial projection
    head = build_classifier("ytuning", bb, names, {"dim": 16}).head
    projected = head.proj(want).detach()
    # (the projection applied to 3 rows vs 2 changes only rounding, which moves cos in second order)
    assert (torch.nn.functional.cosine_similarity(head.labels.detach()[1:], projected, dim=-1)
            > 1 - tol(torch.float32, cosine_ops(16))).all()
    uniform = build_classifier("ytuning", bb, names, {"dim": 0, "init": "uniform"}).head.labels.detach()
    assert_differs(uniform, init, ops=linear(32) + 2, what="uniform vs label-name init")
    # a name of no word pieces (a lone combining accent, stripped by the tokenizer) starts from the unknown token's
    # embedding (an IndexError ended the run, and the load of a model relabelled so)
    assert bb.tok("\u0301", add_special_tokens=False)["input_ids"] == []
    odd = build_classifier("ytuning", bb, ["\u0301", "positive"], {"dim": 0}).head.labels.detach()
    assert torch.nn.functional.cosine_similarity(odd[1], emb[bb.tok.unk_token_id], dim=0) > 1 - tol(
        torch.float32, cosine_ops(32))


def test_bad_options():
    with pytest.raises(ValueError, match="not divisible by heads"):
        create_method("ytuning", 32, 2, {"dim": 30, "heads": 4})
    with pytest.raises(MethodError, match="at least 1"):
        create_method("ytuning", 32, 2, {"k": 0})


def test_explanation_ranks_the_texts_tokens_and_states_the_special_tokens_share():
    from frozentune.head import Output, TokenView

    head, _ = create_method("ytuning", 32, 2, {})
    text = "who wrote it"
    view = TokenView(text, ["[CLS]", "who", "wrote", "it", "[SEP]"], [(0, 0), (0, 3), (4, 9), (10, 12), (0, 0)],
                     [None, 0, 1, 2, None])
    # [CLS] and [SEP] carry most of the attention, as on a trained head; the text's tokens the rest
    attn = torch.tensor([[[0.50, 0.05, 0.20, 0.10, 0.15], [0.30, 0.30, 0.05, 0.05, 0.30]]])  # (1, C, T)
    ex = head.explain(Output(torch.zeros(1, 2), {"label_attention": attn}), view, ["a", "b"], top=2)
    assert [t["text"] for t in ex.data["attention"]["a"]] == ["wrote", "it"]
    assert [t["text"] for t in ex.data["attention"]["b"]] == ["who", "wrote"] or \
        [t["text"] for t in ex.data["attention"]["b"]] == ["who", "it"]  # 0.05 twice: either order
    assert ex.data["attention"]["a"][0] == {"text": "wrote", "start": 4, "end": 9, "weight": 0.2}
    assert ex.data["special_tokens"] == {"a": pytest.approx(0.65, abs=1e-6), "b": pytest.approx(0.60, abs=1e-6)}
    assert "special tokens 0.65" in ex.lines[0] and "[CLS]" not in ex.lines[0]
    assert ex.lines[-1].startswith("(attention, not importance:")  # the measured caveat, with what to use instead

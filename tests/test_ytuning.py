import pytest
import torch

from frozentune.backbone import Backbone
from frozentune.head import Features
from frozentune.heads.ytuning import YTuningConfig, YTuningHead, margin_loss
from frozentune.model import build_classifier
from frozentune.registry import MethodError, create_method


def feats(B=3, T=7, D=32, seed=0, lengths=(7, 4, 2)):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return Features(hidden * mask[..., None], mask)


def test_margin_loss_hand_computed():
    s = torch.tensor([[2.0, 0.5, 1.8], [0.0, 3.0, 1.0]])
    y = torch.tensor([0, 2])
    # row 0: [0.5-2+1]+ + [1.8-2+1]+ = 0 + 0.8 ; row 1: [0-1+1]+ + [3-1+1]+ = 0 + 3
    assert margin_loss(s, y, 1.0).item() == pytest.approx((0.8 + 3.0) / 2)
    # zero once the true score beats every other by at least alpha
    assert margin_loss(torch.tensor([[3.0, 2.0, 1.5]]), torch.tensor([0]), 1.0).item() == 0.0
    assert margin_loss(torch.tensor([[3.0, 2.1, 1.5]]), torch.tensor([0]), 1.0).item() == pytest.approx(0.1, abs=1e-6)


def test_padding_does_not_change_scores():
    head, _ = create_method("ytuning", 32, 3, {"dim": 16})
    head.eval()
    f = feats()
    longer = Features(torch.cat([f.hidden, torch.randn(3, 5, 32)], 1), torch.cat([f.mask, torch.zeros(3, 5, dtype=torch.bool)], 1))
    a, b = head(f), head(longer)
    assert torch.allclose(a.logits, b.logits, atol=1e-5)
    assert torch.allclose(a.extras["label_attention"], b.extras["label_attention"][..., :7], atol=1e-6)


def test_explanation_is_a_distribution_over_real_tokens():
    head, _ = create_method("ytuning", 32, 4, {"k": 2})
    head.eval()
    f = feats()
    w = head(f).extras["label_attention"]  # (B, C, T)
    assert w.shape == (3, 4, 7)
    assert torch.allclose(w.sum(-1), torch.ones(3, 4), atol=1e-5)
    assert (w[~f.mask[:, None, :].expand_as(w)] == 0).all()


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
    assert torch.allclose(head(f).logits, expect, atol=1e-5)
    assert head.labels.shape == (1 + 3 * 2, cfg.dim)


def test_label_name_initialisation_uses_the_vocabulary(tiny_bert):
    bb = Backbone.load(str(tiny_bert), max_length=16)
    emb = bb.model.get_input_embeddings().weight
    names = ["negative", "positive"]
    want = torch.stack([emb[bb.tok(n, add_special_tokens=False)["input_ids"]].mean(0) for n in names])
    # D = backbone width: same direction as the names' embeddings (rescaled)
    init = build_classifier("ytuning", bb, names, {"dim": 0}).head.labels.detach()
    assert (torch.nn.functional.cosine_similarity(init[1:], want, dim=-1) > 0.999).all()
    # D < width: the names' embeddings through the initial projection
    head = build_classifier("ytuning", bb, names, {"dim": 16}).head
    projected = head.proj(want).detach()
    assert (torch.nn.functional.cosine_similarity(head.labels.detach()[1:], projected, dim=-1) > 0.999).all()
    uniform = build_classifier("ytuning", bb, names, {"dim": 0, "init": "uniform"}).head.labels.detach()
    assert not torch.allclose(uniform, init)


def test_bad_options():
    with pytest.raises(ValueError, match="not divisible by heads"):
        create_method("ytuning", 32, 2, {"dim": 30, "heads": 4})
    with pytest.raises(MethodError, match="at least 1"):
        create_method("ytuning", 32, 2, {"k": 0})

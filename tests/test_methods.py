"""Every registered method goes through the same checks."""
import numpy as np
import pytest
import torch

from frozentune import model as M
from frozentune.backbone import Backbone
from frozentune.cache import get_or_build
from frozentune.pairs import pair_kind, separator_ids
from frozentune.registry import MethodError, create_method, get_method, list_methods, make_config
from frozentune.train import TrainConfig, fit, predict_logits
from numerics import ROUNDING, approx, assert_close, dot, exact, linear, prefix_mlp_scale

TEXTS = ["good film", "bad film", "what a great movie !", "terrible , boring and long",
         "i loved it", "i hated it", "fine acting", "awful plot"] * 2
LABELS = np.array([1, 0] * 8)
# the same examples as sentence pairs (a premise-like first text, a claim about it second)
PAIRS = [(t, "it is " + ("good" if y else "bad")) for t, y in zip(TEXTS, LABELS)]
INPUTS = {"single": TEXTS, "pair": PAIRS}


# options for methods whose defaults are too big for these tests: conv's own encoder (default: 4
# layers of width 256, 10.7M parameters) at the tiny BERT's scale
OPTIONS = {"conv": {"layers": 2, "dim": 32, "ffn_dim": 64}}


@pytest.fixture(scope="module")
def bb_factory(tiny_bert):
    """bb_factory() → the tiny BERT; bb_factory(method) → what that method reads: the tiny BERT, or
    for a method that trains an encoder of its own (conv), that encoder built from OPTIONS."""
    def make(method: str | None = None):
        if method is not None and get_method(method).encoder is not None:
            return get_method(method).encoder(make_config(method, OPTIONS.get(method)), 16)
        return Backbone.load(str(tiny_bert), max_length=16)
    return make


def source_for(model, bb, root, texts=TEXTS):
    sep = separator_ids(bb.tok) if pair_kind(texts) else None
    if model.runs_live:
        return M.LiveSource(bb.tokenize(texts), bb.pad_id(), sep)
    cache, _ = get_or_build(bb, texts, root, progress=False)
    return M.CachedSource(cache, np.arange(len(texts)), sep)


@pytest.mark.parametrize("inputs", sorted(INPUTS))
@pytest.mark.parametrize("method", list_methods("classification"))
def test_shared_method_checks(method, inputs, bb_factory, tmp_path):
    texts = INPUTS[inputs]
    bb = bb_factory(method)
    frozen_before = {k: v.clone() for k, v in bb.model.state_dict().items()}
    model = M.build_classifier(method, bb, ["neg", "pos"], OPTIONS.get(method), seed=0)
    src = source_for(model, bb, tmp_path / "cache", texts)
    idx = np.arange(len(TEXTS))
    if inputs == "pair":  # the batch says where the two texts meet, and the backbone gets their token types
        b = src.batch(idx)
        assert b.separator is not None and (b.separator.sum(1) == len(separator_ids(bb.tok))).all()
        if model.runs_live:
            assert b.token_type_ids is not None and (b.token_type_ids.amax(1) == 1).all()

    # shapes and a finite loss
    out = model(src.batch(idx))
    assert out.logits.shape == (len(TEXTS), 2)
    loss = model.head.loss(out, torch.from_numpy(LABELS))
    assert loss.ndim == 0 and torch.isfinite(loss)

    # gradients reach every trainable parameter
    loss.backward()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable, "a method must have trainable parameters"
    for n, p in trainable.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{method}: no gradient for {n}"
    assert any(p.grad.abs().sum() > 0 for p in trainable.values())
    model.zero_grad()

    # a few optimiser steps: the method's parameters change; the frozen backbone does not
    head_before = {k: v.clone() for k, v in model.head.state_dict().items()}
    fit(model, src, LABELS, src, LABELS, TrainConfig(epochs=2, batch_size=4, lr=1e-2, patience=0), log=lambda s: None)
    # exact: a frozen weight is never written, so any bit that differs is a change
    assert any(not torch.equal(head_before[k], v) for k, v in model.head.state_dict().items())
    changed = [k for k, v in bb.model.state_dict().items() if not torch.equal(frozen_before[k], v)]
    if model.trains_backbone:
        assert changed, f"{method} trains the backbone but it did not change"
    else:
        assert changed == [], f"{method} changed frozen backbone weights: {changed[:3]}"
        assert not any(p.requires_grad for p in bb.model.parameters())

    # save → load gives identical predictions, and the file holds only trained weights
    M.save(model, tmp_path / "m")
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    if hasattr(model.head, "saved_state"):  # e.g. prefix: the materialised prefix, not the MLP that made it
        assert sum(v.numel() for v in saved.values()) == sum(v.numel() for v in model.head.saved_state().values())
    else:
        assert sum(v.numel() for v in saved.values()) == model.num_trainable()
    assert any(k.startswith("backbone.") for k in saved) == model.trains_backbone
    before = predict_logits(model, src)
    loaded = M.load(tmp_path / "m", backbone=bb_factory() if not model.trains_backbone else None)
    src2 = source_for(loaded, loaded.backbone_ref, tmp_path / "cache", texts)
    exact(predict_logits(loaded, src2), before,
          "safetensors round-trips the weights bit for bit; same kernels on the same batches")


@pytest.mark.parametrize("method", list_methods())
def test_default_config_is_valid_and_listed(method):
    spec = get_method(method)
    make_config(method)
    assert spec.help
    from frozentune.train import TrainConfig as TC
    TC(**spec.train_defaults)  # training defaults name real options
    TC(**spec.generation_defaults)
    assert spec.classifies or spec.generates


def test_heads_whose_cost_grows_faster_than_the_labels_say_so():
    """Y-Tuning and space at 1,000 labels took 15 s and 1.3 s a step against probe's 1 ms (bench/many_labels.py),
    found out only from the epoch's time; from 100 labels their runs say so as they start."""
    from frozentune.head import MANY_LABELS

    for method in list_methods("classification"):
        if get_method(method).head_cls is None:
            continue
        few, many = (create_method(method, 8, n)[0].cost_note() for n in (MANY_LABELS - 1, MANY_LABELS))
        assert few is None
        assert (many is not None) == (method in ("ytuning", "space")), method
    note = create_method("space", 8, 100)[0].cost_note()
    assert note.startswith("space: 100 labels: its classifier reads all 100 concept spaces") and "160,000 weights" in note


def test_registry_errors():
    with pytest.raises(MethodError, match="unknown method 'nope'; available: .*probe"):
        get_method("nope")
    with pytest.raises(MethodError, match="no option\\(s\\) bogus"):
        create_method("probe", 8, 2, {"bogus": 1})
    with pytest.raises(MethodError, match="pooling='max'; choose one of mean, cls"):
        create_method("probe", 8, 2, {"pooling": "max"})


def test_padding_does_not_change_probe_output(bb_factory, tmp_path):
    bb = bb_factory()
    model = M.build_classifier("probe", bb, ["neg", "pos"])
    cache, _ = get_or_build(bb, TEXTS, tmp_path, progress=False)
    src = M.CachedSource(cache, np.arange(len(TEXTS)))
    alone = torch.cat([model(src.batch(np.array([i]))).logits for i in range(4)])
    together = model(src.batch(np.arange(4))).logits
    # masked mean over ≤ 16 tokens (more zero terms when padded), then the 32-input linear layer; batch 1 vs 4
    assert_close(alone, together, ops=dot(16) + 1 + linear(32), what="logits")


def test_same_seed_same_numbers(bb_factory, tmp_path):
    def run(seed):
        bb = bb_factory()
        model = M.build_classifier("probe", bb, ["neg", "pos"], seed=seed)
        src = source_for(model, bb, tmp_path / "c")
        r = fit(model, src, LABELS, src, LABELS, TrainConfig(epochs=3, batch_size=4, lr=1e-2, seed=seed, patience=0), log=lambda s: None)
        return [h["train_loss"] for h in r.history], predict_logits(model, src)
    a, b, c = run(0), run(0), run(1)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])  # exact: same seed, same kernels, same process
    assert a[0] != c[0]


def test_early_stopping_restores_best_epoch(bb_factory, tmp_path):
    bb = bb_factory()
    model = M.build_classifier("probe", bb, ["neg", "pos"])
    src = source_for(model, bb, tmp_path / "c")
    logs = []
    r = fit(model, src, LABELS, src, 1 - LABELS, TrainConfig(epochs=30, batch_size=4, lr=5e-2, patience=2), log=logs.append)
    # validation labels are inverted, so learning the training labels makes validation worse
    assert r.stopped_early and any("early stop" in s for s in logs)
    best = max(h["val_accuracy"] for h in r.history)
    assert r.history[r.best_epoch - 1]["val_accuracy"] == best
    pred = predict_logits(model, src).argmax(1)
    assert 100.0 * (pred == 1 - LABELS).mean() == approx(best, ops=3, dtype=torch.float64)  # 100·k/16 in float64


# prefix-tuning is by definition a frozen backbone (it refuses train_backbone: test_encoder_prefix)
@pytest.mark.parametrize("method", [m for m in list_methods("classification") if m != "prefix"])
def test_every_method_can_train_its_backbone(method, bb_factory):
    """`--train-backbone` (the unfrozen setting) runs every head live and sends gradients into the
    backbone as well as the head."""
    bb = bb_factory(method)
    model = M.build_classifier(method, bb, ["neg", "pos"], {**OPTIONS.get(method, {}), "train_backbone": True}, seed=0)
    texts = ["good film", "a really bad film !", "fine"]
    src = M.LiveSource(bb.tokenize(texts), bb.pad_id())
    out = model(src.batch(np.arange(3)))
    assert out.logits.shape == (3, 2)
    model.head.loss(out, torch.tensor([1, 0, 1])).backward()
    grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(p.grad is not None for p in model.head.parameters())


def test_encoder_prefix_words_init(bb_factory):
    """prefix on an encoder with init=words starts as the encoder's own keys/values on init_text."""
    from frozentune.generation.encoder_prefix import encoder_activations
    from frozentune.generation.prefix import phrase_ids

    bb = bb_factory()
    model = M.build_classifier("prefix", bb, ["neg", "pos"], {"init": "words", "init_text": "what is it", "prefix_length": 5})
    want = encoder_activations(bb.model, phrase_ids(bb.tok, "what is it", 5))
    enc = model.head.prefix
    assert_close(enc(), want, ops=linear(enc.cfg.reparam_hidden) + ROUNDING, scale=prefix_mlp_scale(enc),
                 what="MLP fitted to the phrase's keys/values")
    with pytest.raises(MethodError, match="train_backbone must be false"):
        M.build_classifier("prefix", bb, ["neg", "pos"], {"train_backbone": True})


@pytest.mark.parametrize("method", ["ytuning", "space"])
def test_an_explanation_of_many_classes_lines_the_likeliest_and_keeps_every_class_in_its_data(method, bb_factory):
    """With a thousand classes, explain printed a thousand lines, in label order, the prediction's own
    anywhere among them. Beyond LINES_SHOWN classes the lines show the likeliest, likeliest first, and
    say how many were left out; the data keeps every class. A few classes keep every line, in label order."""
    from frozentune import api
    from frozentune.head import LINES_SHOWN

    bb = bb_factory(method)
    for n in (3, LINES_SHOWN + 4):
        labels = [f"class{i:02d}" for i in range(n)]
        model = M.build_classifier(method, bb, labels, seed=0)
        (row,) = api.explain(model, ["the film was a quiet joy to watch"], top=2)
        data = row["explanation"]["attention" if method == "ytuning" else "classes"]
        assert list(data) == labels
        lined = [line.split(":")[0].strip() for line in row["lines"] if line.strip().startswith("class")]
        if n <= LINES_SHOWN:
            assert lined == labels and not any("classes shown" in line for line in row["lines"]), row["lines"]
            continue
        p = row["scores"]  # (rounded: near-equal classes may tie, so the order is checked, not one list)
        assert len(lined) == LINES_SHOWN and lined[0] == row["label"], (lined, p)
        assert all(p[a] >= p[b] for a, b in zip(lined, lined[1:])), (lined, p)
        assert min(p[lab] for lab in lined) >= max(p[lab] for lab in labels if lab not in lined), (lined, p)
        assert f"({LINES_SHOWN} of the {n:,} classes shown, the likeliest; the explanation's data holds every " \
               f"class: explain --json)" in row["lines"], row["lines"]

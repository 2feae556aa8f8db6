"""Few labels: the step floor, cross-validation (folds, refit, small classes), the convex probe,
heads anchored on a logistic regression, --shots sampling, and `frozentune sweep` (reproducible;
its best model is a `train` of that point)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from frozentune import api, crossval
from frozentune import model as M
from frozentune.data import DataError, load_classification
from frozentune.registry import MethodError
from frozentune.train import TrainConfig, fit, plan_steps

from numerics import dot, softmax, tol

pytestmark = pytest.mark.usefixtures("one_thread")


def run(capsys, *argv):
    from frozentune.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_step_floor_raises_a_small_schedule_and_leaves_a_large_one():
    cfg = TrainConfig(epochs=10, batch_size=64, min_steps=200)
    small = plan_steps(16, cfg)
    assert small.total == 200 and "floor" in small.why
    large = plan_steps(64 * 30, cfg)  # 30 steps an epoch × 10 epochs = 300 ≥ the floor: unchanged
    assert (large.total, large.every) == (300, 30)
    assert plan_steps(16, TrainConfig(steps=7)).total == 7


def _toy(n_per_class: int = 8, classes: int = 2, dim: int = 6, seed: int = 0):
    """A cached-like source of random states whose class shifts the mean; (src, y)."""
    g = torch.Generator().manual_seed(seed)
    y = np.repeat(np.arange(classes), n_per_class)
    hidden = torch.randn(len(y), 3, dim, generator=g) + torch.from_numpy(y)[:, None, None].float()
    src = _Toy(hidden)
    return src, y


class _Toy:
    def __init__(self, hidden: torch.Tensor):
        self.hidden = hidden
        self.lengths = np.full(len(hidden), 3)

    def __len__(self) -> int:
        return len(self.hidden)

    def batch(self, idx):
        h = self.hidden[np.asarray(idx)]
        return M.Batch(torch.ones(h.shape[:2], dtype=torch.bool), h)


def _classifier(tiny_bert, labels, method="space", seed=0):
    bb = api.BackboneOptions(str(tiny_bert), max_length=16).load()
    return lambda: M.build_classifier(method, bb, labels, seed=seed)


def test_a_sixteen_example_set_gets_the_floor(tiny_bert):
    src, y = _toy(8, dim=32)
    model = _classifier(tiny_bert, ["a", "b"])()
    r = fit(model, src, y, None, None, TrainConfig(batch_size=64, epochs=3, min_steps=40), log=lambda s: None)
    assert sum(len(h["step_losses"]) for h in r.history) == 40


def test_folds_are_stratified_seeded_and_disjoint():
    y = np.repeat(np.arange(3), [10, 7, 5])
    f = crossval.folds(y, 5, seed=3)
    held = np.concatenate([b for _, b in f])
    assert sorted(held.tolist()) == list(range(len(y)))  # every example held out exactly once
    for a, b in f:
        assert not set(a) & set(b) and len(a) + len(b) == len(y)
        for c, n in enumerate((10, 7, 5)):  # each class spread as evenly as its count allows
            assert (y[b] == c).sum() in (n // 5, -(-n // 5))
    again = crossval.folds(y, 5, seed=3)
    assert all(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(f, again))
    other = crossval.folds(y, 5, seed=4)
    assert any(not np.array_equal(b, d) for (_, b), (_, d) in zip(f, other))


def test_cross_validation_refits_on_all_of_train(tiny_bert, monkeypatch):
    src, y = _toy(6, dim=32)
    sizes = []
    real = crossval.fit

    def spy(model, train, *args, **kwargs):
        sizes.append(len(train))
        return real(model, train, *args, **kwargs)

    monkeypatch.setattr(crossval, "fit", spy)
    cfg = TrainConfig(cv_folds=3, min_steps=20, batch_size=8)
    model, fitted, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"]), src, y, None, None, cfg, lambda s: None)
    assert sizes[:-1] == [8, 8, 8] and sizes[-1] == 12  # k fold runs on k-1 folds, then all of train
    assert info["folds"] == 3 and info["chosen_steps"] in info["checkpoints"]
    assert sum(len(h["step_losses"]) for h in fitted.history) == info["chosen_steps"]


def test_a_class_smaller_than_k_is_handled_as_documented(tiny_bert):
    y = np.repeat(np.arange(2), [6, 3])
    assert crossval.choose_folds(y, 5, ["a", "b"])[0] == 3  # fewer folds, said
    k, note = crossval.choose_folds(np.array([0, 0, 0, 1]), 5, ["a", "b"])
    assert k == 0 and "'b' has a single training example" in note
    src, _ = _toy(2, dim=32)
    y1 = np.array([0, 0, 0, 1])
    lines = []
    model, fitted, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"]), src, y1, None, None,
                                          TrainConfig(min_steps=12), lines.append)
    assert info["folds"] == 0 and info["chosen_steps"] == 12 and any("single training example" in s for s in lines)


def _penalised_objective(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray, c: float) -> float:
    """scikit-learn's LogisticRegression(C=c) objective / N, in float64. Two classes: scikit-learn's
    one weight vector w (1, D) on the logit of class 1; a softmax's (2, D) rows are turned into it."""
    if w.shape[0] == 2:
        w, b = w[1:] - w[:1], b[1:] - b[:1]
    if w.shape[0] == 1:
        z = (x @ w.T + b)[:, 0]
        nll = np.logaddexp(0.0, np.where(y == 1, -z, z)).mean()
    else:
        z = x @ w.T + b
        z = z - z.max(1, keepdims=True)
        nll = -(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(1))).mean()
    return float(nll + (w * w).sum() / (2 * c * len(y)))


def _optimum_bound(x: np.ndarray, classes: int, objective: float) -> float:
    """How far a float32 solution's objective may sit from the float64 optimum: the rounding of a
    float32 evaluation of it (a sum of N·C·D products)."""
    return tol(torch.float32, dot(x.shape[1]) + softmax(classes)) * max(1.0, abs(objective))


@pytest.mark.parametrize("c,classes", [(0.1, 3), (1.0, 3), (1.0, 2), (10.0, 2)])
def test_the_convex_probe_reaches_logistic_regressions_optimum(tiny_bert, c, classes):
    from sklearn.linear_model import LogisticRegression

    labels = ["a", "b", "c"][:classes]
    src, y = _toy(10, classes=classes, dim=32)
    model = _classifier(tiny_bert, labels, "probe")()
    crossval.fit_convex(model, src, y, c)
    x = src.hidden.mean(1).double().numpy()
    ours = _penalised_objective(model.head.out.weight.detach().double().numpy(), model.head.out.bias.detach().double().numpy(), x, y, c)
    ref = LogisticRegression(C=c, max_iter=10000, tol=1e-10).fit(x, y)
    theirs = _penalised_objective(ref.coef_, ref.intercept_, x, y, c)
    bound = _optimum_bound(x, classes, theirs)
    print(f"objective: ours {ours:.9f}, scikit-learn {theirs:.9f}, bound {bound:.2e}")
    assert ours <= theirs + bound


ANCHORED = ("space", "ytuning", "selfexplain")


def _anchored(tiny_bert, labels, method, seed=0):
    bb = api.BackboneOptions(str(tiny_bert), max_length=16).load()
    return bb, lambda: M.build_classifier(method, bb, labels, seed=seed, anchor=True)


@pytest.mark.parametrize("method", ANCHORED)
def test_an_anchored_head_starts_as_the_probes_logistic_regression(tiny_bert, method):
    """Solved, with its gate at 0, an anchored head scores as a logistic regression on the mean-pooled
    states: its anchor reaches the optimum of the objective the convex probe solves (C = 1)."""
    src, y = _toy(10, classes=3, dim=32)
    _, build = _anchored(tiny_bert, ["a", "b", "c"], method)
    model = build()
    crossval.solve_anchor(model, src, y, batch_size=7)  # pooled over several batches
    head = model.head
    assert float(head.gate.detach()) == 0.0
    x = src.hidden.mean(1).double().numpy()
    ours = _penalised_objective(head.anchor.weight.detach().double().numpy(), head.anchor.bias.detach().double().numpy(),
                                x, y, 1.0)
    probe = _classifier(tiny_bert, ["a", "b", "c"], "probe")()
    crossval.fit_convex(probe, src, y, 1.0)
    theirs = _penalised_objective(probe.head.out.weight.detach().double().numpy(),
                                  probe.head.out.bias.detach().double().numpy(), x, y, 1.0)
    # two float32 L-BFGS solutions of one strictly convex objective: equal up to its float32 rounding
    bound = _optimum_bound(x, 3, theirs)
    assert abs(ours - theirs) <= bound, (ours, theirs, bound)
    b = src.batch(np.arange(len(src)))
    with torch.no_grad():
        logits = model(b).logits
        alone = head.anchor(b.hidden.mean(1))
    torch.testing.assert_close(logits, alone, rtol=0, atol=0)  # gate 0: the head adds exactly nothing


@pytest.mark.parametrize("method", ANCHORED)
def test_training_moves_the_gate_and_the_head_never_the_anchor(tiny_bert, method):
    src, y = _toy(8, dim=32)
    _, build = _anchored(tiny_bert, ["a", "b"], method)
    model = build()
    crossval.solve_anchor(model, src, y, batch_size=64)
    anchor = {k: v.clone() for k, v in model.head.anchor.state_dict().items()}
    inner = {k: v.clone() for k, v in model.head.inner.state_dict().items()}
    fit(model, src, y, None, None, TrainConfig(steps=15, lr=1e-2, min_steps=0, batch_size=8), log=lambda s: None)
    assert float(model.head.gate.detach()) != 0.0
    for k, v in model.head.anchor.state_dict().items():
        assert torch.equal(v, anchor[k]), f"the optimiser changed the anchor's {k}"
    assert any(not torch.equal(v, inner[k]) for k, v in model.head.inner.state_dict().items()), "the head never moved"


@pytest.mark.parametrize("method", ANCHORED)
def test_cross_validation_scores_the_anchor_alone_and_saves_what_it_chose(tiny_bert, tmp_path, method):
    src, y = _toy(6, dim=32)
    bb, build = _anchored(tiny_bert, ["a", "b"], method)
    model, fitted, info = crossval.fit_cv(build, src, y, None, None, TrainConfig(cv_folds=3, min_steps=20, batch_size=8),
                                          lambda s: None)
    assert info["checkpoints"][0] == 0 and info["anchor"] and info["chosen_steps"] in info["checkpoints"]
    assert sum(len(h.get("step_losses", [])) for h in fitted.history) == info["chosen_steps"]
    M.save(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["anchor"] is True
    back = M.load(tmp_path / "m", backbone=bb)
    b = src.batch(np.arange(len(src)))
    with torch.no_grad():
        torch.testing.assert_close(back(b).logits, model(b).logits, rtol=0, atol=0)


def test_an_anchored_head_cannot_be_the_probe(tiny_bert):
    bb = api.BackboneOptions(str(tiny_bert), max_length=16).load()
    with pytest.raises(MethodError, match="cannot be anchored"):
        M.build_classifier("probe", bb, ["a", "b"], anchor=True)


def test_train_anchors_a_few_label_head_and_says_so(capsys, trec_slice, tiny_bert, tmp_path):
    common = ("--data", trec_slice, "--backbone", tiny_bert, "--max-length", 16, "--shots", 2, "--cache-dir", tmp_path / "c",
              "--min-steps", 20)
    code, out, err = run(capsys, "train", "--method", "space", *common, "--output", tmp_path / "m")
    assert code == 0, err
    assert "few labels: the head learns a correction on a logistic regression" in out
    r = json.loads((tmp_path / "m" / "result.json").read_text())
    assert r["selection"]["anchor"] and r["selection"]["checkpoints"][0] == 0 and r["config"]["train"]["anchor"] == "auto"
    assert json.loads((tmp_path / "m" / "config.json").read_text())["anchor"] is True
    code, out, err = run(capsys, "explain", "--model", tmp_path / "m", "what is the capital of France ?")
    assert code == 0, err
    assert "trained on few labels" in out
    code, out, err = run(capsys, "train", "--method", "space", *common, "--anchor", "off", "--output", tmp_path / "off")
    assert code == 0, err
    assert "few labels:" not in out
    assert json.loads((tmp_path / "off" / "config.json").read_text())["anchor"] is False
    assert json.loads((tmp_path / "off" / "result.json").read_text())["selection"]["anchor"] is None


def test_shots_sample_exactly_k_per_class_seeded(trec_slice, shared_data):
    a = load_classification(str(trec_slice), shots=2, seed=1, carve_below=1000)
    counts = {lab: a.train.labels.count(lab) for lab in set(a.train.labels)}
    assert set(counts.values()) == {2} and len(a.validation) == 0
    assert a.train.rows.tolist() == load_classification(str(trec_slice), shots=2, seed=1, carve_below=1000).train.rows.tolist()
    assert a.train.rows.tolist() != load_classification(str(trec_slice), shots=2, seed=2, carve_below=1000).train.rows.tolist()
    with pytest.raises(DataError, match="has only"):
        load_classification(str(trec_slice), shots=500)
    with pytest.raises(DataError, match="give one of them"):
        load_classification(str(trec_slice), shots=2, max_train=10)


def test_shots_on_a_phrase_treebank_draw_whole_sentences(tmp_path):
    rows = [("a truly good film", "pos"), ("truly good", "pos"), ("good film", "pos"), ("a dull and slow film", "neg"),
            ("dull and slow", "neg"), ("slow film", "neg"), ("a fine warm story", "pos"), ("a cold flat story", "neg")]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows[:2] + rows[3:4]))
    ds = load_classification(str(tmp_path), shots=2, carve_below=1000)
    assert sorted(ds.train.texts) == ["a cold flat story", "a dull and slow film", "a fine warm story", "a truly good film"]


def test_train_with_shots_cross_validates_and_records_it(capsys, trec_slice, tiny_bert, tmp_path):
    code, out, err = run(capsys, "train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert,
                         "--max-length", 16, "--shots", 2, "--output", tmp_path / "m", "--cache-dir", tmp_path / "c")
    assert code == 0, err
    assert "cross-validation" in out and "no validation split" in out
    r = json.loads((tmp_path / "m" / "result.json").read_text())
    assert r["selection"]["how"] == "cross-validation" and r["selection"]["solver"] == "lbfgs"
    assert r["config"]["shots"] == 2 and r["validation"] is None
    assert json.loads((tmp_path / "m" / "config.json").read_text())["anchor"] is False  # the probe is a regression already


def _grid():
    from frozentune.sweep import Grid

    return Grid.parse("probe,space", "-1", "0.01", "0.01,0.1", "0,1")


def test_a_sweep_is_reproducible_and_its_best_is_a_train_of_that_point(trec_slice, tiny_bert, tmp_path):
    from frozentune.sweep import run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    cfg = {"min_steps": 12}
    one = run_sweep(_grid(), str(trec_slice), bb, tmp_path / "s1", shots=2, cache_root=tmp_path / "c",
                    train_cfg=cfg, log=lambda s: None)
    two = run_sweep(_grid(), str(trec_slice), bb, None, shots=2, cache_root=tmp_path / "c", train_cfg=cfg, log=lambda s: None)
    keep = ("method", "layer", "lr", "weight_decay", "seed", "score", "test_accuracy")
    assert len(one.rows) == 8
    assert [{k: r[k] for k in keep} for r in one.rows] == [{k: r[k] for k in keep} for r in two.rows]
    assert all(r["extract_seconds"] == 0 for r in one.rows[1:] if r["layer"] == one.rows[0]["layer"])
    for name in ("sweep.md", "sweep.json", "sweep.png", "best/model.safetensors"):
        assert (tmp_path / "s1" / name).is_file()
    best = one.best
    api.train(best["method"], str(trec_slice), dataclasses_replace(bb, best["layer"]), shots=2,
              train_cfg=cfg | {"seed": min(best["seeds"]), "lr": best["lr"], "weight_decay": best["weight_decay"]},
              output=tmp_path / "t", cache_root=tmp_path / "c", progress=False, log=lambda s: None)
    texts = ["What is the capital of France ?", "Who wrote Hamlet ?"]
    a = api.predict(tmp_path / "s1" / "best", texts)
    b = api.predict(tmp_path / "t", texts)
    assert a == b


def dataclasses_replace(bb, layer):
    import dataclasses

    return dataclasses.replace(bb, layers=layer)


@pytest.mark.parametrize("args, message", [
    (["--methods", "finetune"], "cannot train from one cache"),
    (["--methods", "probe", "--lr", "fast"], "comma list of numbers"),
    (["--methods", "probe", "--layers", "top"], "hidden-state indices"),
    (["--methods", "nope"], "unknown method 'nope'"),
    (["--methods", "probe", "--rebuild-cache"], "extract once per point"),
    (["--methods", "probe", "--layer", "-1"], "not --layer"),
])
def test_sweep_refuses_bad_grids(capsys, trec_slice, args, message):
    code, _, err = run(capsys, "sweep", "--data", trec_slice, *args)
    assert code == 2 and message in err

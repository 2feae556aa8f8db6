"""Few labels: the step floor, cross-validation (folds, refit, small classes, the logistic
regression it falls back to), the convex probe, --shots sampling, and `frozentune sweep`
(reproducible; its best model is a `train` of that point)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from frozentune import api, crossval
from frozentune import model as M
from frozentune.data import DataError, load_classification
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


def test_a_long_round_says_where_it_is_and_trains_the_same(tiny_bert, monkeypatch):
    from frozentune import train as T

    src, y = _toy(8, dim=32)
    cfg = TrainConfig(batch_size=4, epochs=2, min_steps=0)  # 16 examples: 4 steps an epoch
    quiet = fit(_classifier(tiny_bert, ["a", "b"])(), src, y, None, None, cfg, log=lambda s: None)
    monkeypatch.setattr(T, "PROGRESS_EVERY_S", 0.0)  # every step is "long"
    lines: list[str] = []
    loud = fit(_classifier(tiny_bert, ["a", "b"])(), src, y, None, None, cfg, log=lines.append)
    progress = [line for line in lines if "of this epoch" in line]
    assert len(progress) == 2 * 3  # each step but an epoch's last, which the epoch's own line reports
    assert progress[0].startswith("epoch   1/2  step 1/4 of this epoch  loss so far ")
    assert "min to its end" in progress[-1]
    assert [h["step_losses"] for h in loud.history] == [h["step_losses"] for h in quiet.history]


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


def test_folds_hold_out_every_copy_of_a_text_together(tiny_bert):
    """Copies of a text (one group) in two folds scored a fold on a text it trained on. With groups every
    group is held out once, whole; distinct texts give the plain folds; a class counts its distinct texts."""
    y = np.repeat(np.arange(3), [12, 9, 6])
    groups = np.arange(len(y)) // 3  # rows 0-2 one text, 3-5 the next, ...: 9 groups of 3
    f = crossval.folds(y, 2, seed=1, groups=groups)  # class c has 2 texts: 2 folds (choose_folds below)
    assert sorted(np.concatenate([b for _, b in f]).tolist()) == list(range(len(y)))
    for a, b in f:
        assert not set(groups[a]) & set(groups[b])
    plain = crossval.folds(y, 3, seed=1)
    distinct = crossval.folds(y, 3, seed=1, groups=np.arange(len(y)))
    assert all(np.array_equal(b, d) for (_, b), (_, d) in zip(plain, distinct))
    assert crossval.choose_folds(y, 5, ["a", "b", "c"], groups)[0] == 2  # class c: 6 rows, 2 texts
    # through fit_cv: the log says so, and a run trains (probe: the convex path; space: the head's path)
    ds_y = np.repeat(np.arange(2), 12)
    lines: list[str] = []
    for method in ("probe", "space"):
        bb = api.BackboneOptions(str(tiny_bert), max_length=16).load()
        tokens = bb.tokenize([f"text {i // 2}" for i in range(24)])
        src = M.LiveSource(tokens, bb.pad_id())
        cfg = TrainConfig(epochs=1, min_steps=4, fallback="off")
        crossval.fit_cv(lambda: M.build_classifier(method, bb, ["a", "b"], seed=0), src, ds_y, None, None, cfg,
                        lines.append, groups=np.arange(24) // 2)
    assert sum("12 training rows repeat an earlier text" in ln for ln in lines) == 2


def test_repeated_folds_start_with_plain_k_fold_and_each_repeat_is_a_partition():
    y = np.repeat(np.arange(2), [8, 8])
    one = crossval.folds(y, 4, seed=5)
    rep = crossval.repeated_folds(y, 4, seed=5, repeats=3)
    assert len(rep) == 12
    assert all(np.array_equal(b, d) for (_, b), (_, d) in zip(one, rep[:4]))  # repeat 0: today's folds
    for r in range(3):  # each repeat holds every example out exactly once, and the repeats differ
        held = np.concatenate([b for _, b in rep[4 * r:4 * r + 4]])
        assert sorted(held.tolist()) == list(range(16))
    assert any(not np.array_equal(b, d) for (_, b), (_, d) in zip(rep[:4], rep[4:8]))


def test_repeats_do_not_shrink_the_standard_error():
    """Repeated folds share their examples, so the standard error is taken over k folds (the rows'
    spread over √k), not over √(k·repeats)."""
    acc = np.array([[60.0], [80.0], [70.0], [90.0]])
    loss = np.zeros(1)
    _, se3 = crossval.best_candidate(np.tile(acc, (3, 1)), loss, k=4)
    rows = np.tile(acc, (3, 1))[:, 0]
    assert se3 == pytest.approx(rows.std(ddof=1) / np.sqrt(4), rel=1e-12)
    assert se3 > crossval.best_candidate(np.tile(acc, (3, 1)), loss)[1]  # over √12 it would be smaller


def _fit_sizes(monkeypatch) -> list[int]:
    """The number of training examples of every fit crossval runs, in order."""
    sizes: list[int] = []
    real = crossval.fit

    def spy(model, train, *args, **kwargs):
        sizes.append(len(train))
        return real(model, train, *args, **kwargs)

    monkeypatch.setattr(crossval, "fit", spy)
    return sizes


def test_cross_validation_repeats_train_k_times_repeats_then_refit(tiny_bert, monkeypatch):
    src, y = _toy(6, dim=32)
    sizes = _fit_sizes(monkeypatch)
    cfg = TrainConfig(cv_folds=3, cv_repeats=2, min_steps=20, batch_size=8)
    model, fitted, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"]), src, y, None, None, cfg, lambda s: None)
    assert sizes == [8] * 6 + [12] and info["repeats"] == 2
    with pytest.raises(ValueError, match="--cv-repeats 0: must be at least 1"):
        TrainConfig(cv_repeats=0).validate()


def test_cross_validation_refits_on_all_of_train(tiny_bert, monkeypatch):
    src, y = _toy(6, dim=32)
    sizes = _fit_sizes(monkeypatch)
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


def _spy_choice(monkeypatch, pick_regression: bool) -> list:
    """Make crossval keep the logistic regression (column 0) or the head at its last checkpoint,
    recording the (k, candidates) accuracies keep_regression was given."""
    seen = []

    def keep(acc, mean_loss, k=None, margin=1.0):
        seen.append(np.asarray(acc))
        return {"keep": pick_regression, "regression": 50.0, "head_best": 50.0, "optimism": 0.0,
                "head_corrected": 50.0, "se": 0.0}

    monkeypatch.setattr(crossval, "keep_regression", keep)
    monkeypatch.setattr(crossval, "one_se", lambda acc, mean_loss, prefer=None, k=None: acc.shape[1] - 1)
    return seen


def test_convex_inputs_run_in_length_order_and_come_back_in_row_order():
    """Each row's embedding is its own (here: its row number), in src's order, whatever the order
    the chunks ran in; the chunks ran shortest first, so each is padded to lengths like its own."""
    lengths = np.array([9, 2, 7, 2, 5, 11, 1])
    seen: list[list[int]] = []

    class Src:
        def __init__(self):
            self.lengths = lengths

        def __len__(self) -> int:
            return len(lengths)

        def batch(self, rows: np.ndarray) -> torch.Tensor:
            seen.append(rows.tolist())
            return torch.from_numpy(rows)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.head = self

        def features(self, b: torch.Tensor) -> torch.Tensor:
            return b

        def convex_inputs(self, f: torch.Tensor) -> torch.Tensor:
            return torch.stack([f, torch.from_numpy(lengths[f.numpy()])], 1).float()

    x = crossval.convex_inputs(Model(), Src(), chunk=3)          # (7, 2): row number, length
    assert x[:, 0].tolist() == list(range(7)) and x[:, 1].tolist() == lengths.tolist()
    ran = [lengths[r].tolist() for r in seen]
    assert ran == [[1, 2, 2], [5, 7, 9], [11]]  # the stable length order, in chunks of 3


def test_the_head_is_judged_after_the_optimism_of_its_best_checkpoint():
    """The head's best mean over its checkpoints is corrected by how much each fold's own best beats
    the shared choice; a head that is best only by noise (each fold's peak at another checkpoint)
    loses to the regression, one that is better at the same checkpoint in every fold keeps its place."""
    loss = np.zeros(5)
    # noise: each fold peaks at a different checkpoint; the best mean (70) is 10 above the regression
    # (60), more than one standard error (0: every fold scores 70 there), so one_se alone keeps the head
    noisy = np.array([[60, 85, 70, 55, 55], [60, 55, 70, 85, 55], [60, 55, 70, 55, 85]], dtype=float)
    assert crossval.one_se(noisy, loss) == 2
    choice = crossval.keep_regression(noisy, loss)
    assert choice["head_best"] == pytest.approx(70) and choice["optimism"] == pytest.approx(15)
    assert choice["head_corrected"] == pytest.approx(55) and choice["keep"]
    # signal: every fold peaks at the same checkpoint, 10 above the regression
    steady = np.array([[60, 55, 70, 55, 55], [62, 55, 71, 55, 55], [58, 55, 69, 55, 55]], dtype=float)
    choice = crossval.keep_regression(steady, loss)
    assert choice["optimism"] == 0 and not choice["keep"]
    # a tie goes to the regression, the simpler model
    assert crossval.keep_regression(np.array([[70, 70, 60], [70, 70, 60]], dtype=float), np.zeros(3))["keep"]


def test_a_head_s_fallback_margin_is_how_many_standard_errors_it_must_win_by():
    """The head is kept only where its corrected accuracy beats the regression's by more than `margin` standard
    errors: here 10 points at a standard error of 0.45 (fold scores 69, 71, 70, 71, 69 at the shared checkpoint: 22.4
    standard errors)."""
    head = np.array([69, 71, 70, 71, 69], dtype=float)
    acc = np.stack([np.full(5, 60.0), head, head - 20], 1)
    se = head.std(ddof=1) / np.sqrt(5)
    for margin, keep in ((1.0, False), (22.0, False), (23.0, True)):
        choice = crossval.keep_regression(acc, np.zeros(3), margin=margin)
        assert choice["keep"] is keep and choice["margin"] == margin
        assert choice["head_corrected"] - margin * choice["se"] == pytest.approx(70 - margin * se)
    # per head: space asks for 3 (its kept runs lost on development rows), the others for the one-SE rule
    from frozentune.heads.self_explaining import SelfExplainHead
    from frozentune.heads.space import SpaceHead
    from frozentune.heads.ytuning import YTuningHead

    assert SpaceHead.fallback_margin == 3.0
    assert YTuningHead.fallback_margin == SelfExplainHead.fallback_margin == 1.0


@pytest.mark.parametrize("method,margin", [("space", 3.0), ("ytuning", 1.0)])
def test_the_run_passes_its_head_s_margin_and_says_it(trec_slice, tiny_bert, tmp_path, monkeypatch, method, margin):
    given = []
    real = crossval.keep_regression

    def spy(acc, mean_loss, k=None, margin=1.0):
        given.append(margin)
        return real(acc, mean_loss, k, margin)

    monkeypatch.setattr(crossval, "keep_regression", spy)
    monkeypatch.setattr(api, "fit_cv", crossval.fit_cv)  # the real one, with its fallback (conftest takes it out)
    said: list[str] = []
    r = api.train(method, str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16), shots=2,
                  train_cfg={"min_steps": 10, "seed": 0}, cache_root=tmp_path / "c", progress=False, log=said.append)
    assert given == [margin] and r["selection"]["head_vs_regression"]["margin"] == margin, "\n".join(said)
    assert any(f"by more than {margin:g} standard errors ({method}'s setting" in x for x in said) == (margin != 1.0), said


@pytest.mark.parametrize("pick_regression", [True, False])
def test_the_folds_score_a_logistic_regression_first_and_keep_what_they_pick(tiny_bert, monkeypatch, pick_regression):
    src, y = _toy(6, classes=2, dim=32)
    seen = _spy_choice(monkeypatch, pick_regression)
    cfg = TrainConfig(cv_folds=3, min_steps=20, batch_size=8)
    lines = []
    model, fitted, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"], "space"), src, y, None, None, cfg,
                                          lines.append, fallback=_classifier(tiny_bert, ["a", "b"], "probe"))
    assert seen[0].shape == (3, 1 + len(info["checkpoints"]))  # the regression, then every checkpoint, per fold
    assert 0 <= info["regression_accuracy"] <= 100
    if pick_regression:
        assert model.method == "probe" and info["fallback"] == "probe" and info["chosen_steps"] == 0
        assert any("saved as a probe" in s for s in lines)
        # the regression kept is solved on all of train: the optimum of scikit-learn's objective
        from sklearn.linear_model import LogisticRegression

        x = src.hidden.mean(1).double().numpy()
        w, b = model.head.out.weight.detach().double().numpy(), model.head.out.bias.detach().double().numpy()
        ref = LogisticRegression(C=crossval.C_DEFAULT, max_iter=10000, tol=1e-10).fit(x, y)
        theirs = _penalised_objective(ref.coef_, ref.intercept_, x, y, crossval.C_DEFAULT)
        assert _penalised_objective(w, b, x, y, crossval.C_DEFAULT) <= theirs + _optimum_bound(x, 2, theirs)
    else:
        assert model.method == "space" and info["fallback"] is None
        assert info["chosen_steps"] == info["checkpoints"][-1]
        assert sum(len(h["step_losses"]) for h in fitted.history) == info["chosen_steps"]


def test_the_session_runs_heads_without_the_fallback_however_it_is_passed(tiny_bert):
    """conftest.heads_stay_heads: api.fit_cv drops the fallback whether it comes by position or by name."""
    src, y = _toy(6, classes=2, dim=32)
    cfg = TrainConfig(cv_folds=3, min_steps=20, batch_size=8)

    def never():
        raise AssertionError("the fallback was built")

    build = _classifier(tiny_bert, ["a", "b"], "space")
    assert api.fit_cv(build, src, y, None, None, cfg, lambda s: None, never)[0].method == "space"
    assert api.fit_cv(build, src, y, None, None, cfg, lambda s: None, fallback=never)[0].method == "space"


def test_a_run_without_folds_does_not_say_they_score_a_regression(capsys, trec_slice, tiny_bert, tmp_path, monkeypatch):
    """One example per class: no folds, and the run said that "the folds also score a logistic regression"."""
    monkeypatch.setattr(api, "fit_cv", crossval.fit_cv)  # the real one (conftest.heads_stay_heads)
    code, out, err = run(capsys, "train", "--method", "space", "--data", trec_slice, "--backbone", tiny_bert,
                         "--max-length", 16, "--shots", 1, "--cache-dir", tmp_path / "c", "--min-steps", 4,
                         "--output", tmp_path / "m")
    assert code == 0, err
    assert "cross-validation: none possible" in out and "folds also score" not in out


def test_train_falls_back_only_where_asked_and_says_what_it_saved(capsys, trec_slice, tiny_bert, tmp_path, monkeypatch):
    common = ("--method", "space", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 16, "--shots", 2,
              "--cache-dir", tmp_path / "c", "--min-steps", 20)
    monkeypatch.setattr(api, "fit_cv", crossval.fit_cv)  # the real one (conftest.heads_stay_heads)
    _spy_choice(monkeypatch, pick_regression=True)
    code, out, err = run(capsys, "train", *common, "--output", tmp_path / "m")
    assert code == 0, err
    assert "the folds also score a logistic regression" in out and "saved as a probe" in out
    r = json.loads((tmp_path / "m" / "result.json").read_text())
    assert (r["method"], r["model_method"], r["selection"]["fallback"]) == ("space", "probe", "probe")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["method"] == "probe"
    assert "Trained as `--method space`" in (tmp_path / "m" / "README.md").read_text()
    code, out, err = run(capsys, "predict", "--model", tmp_path / "m", "What is the capital of France ?")
    assert code == 0, err
    code, out, err = run(capsys, "explain", "--model", tmp_path / "m", "What is the capital of France ?")
    assert code == 2 and "trained as --method space" in err and "--fallback off" in err
    assert "train_cfg={'fallback': 'off'} in Python" in err
    code, out, err = run(capsys, "train", *common, "--fallback", "off", "--output", tmp_path / "off")
    assert code == 0, err
    assert "the folds also score" not in out
    r = json.loads((tmp_path / "off" / "result.json").read_text())
    assert (r["model_method"], r["selection"]["fallback"]) == ("space", None) and "regression_accuracy" not in r["selection"]


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


def test_eval_of_train_and_validation_scores_the_rows_training_used(capsys, trec_slice, tiny_bert, tmp_path):
    """eval --split train / validation rebuild the training run's splits: its --shots sample, and no
    validation where cross-validation used all of train (it used to carve one out of the training rows)."""
    code, out, err = run(capsys, "train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert,
                         "--max-length", 16, "--shots", 2, "--output", tmp_path / "m", "--cache-dir", tmp_path / "c")
    assert code == 0, err
    r = json.loads((tmp_path / "m" / "result.json").read_text())
    code, out, err = run(capsys, "eval", "--model", tmp_path / "m", "--data", trec_slice, "--split", "train",
                         "--cache-dir", tmp_path / "c")
    assert code == 0, err
    assert json.loads(out)["n"] == r["sizes"]["train"] == 2 * len(json.loads((tmp_path / "m" / "config.json").read_text())["labels"])
    code, out, err = run(capsys, "eval", "--model", tmp_path / "m", "--data", trec_slice, "--split", "validation",
                         "--cache-dir", tmp_path / "c")
    assert code == 2 and "trained without a validation split" in err and "--split test" in err
    # an old model (no split rule saved) is rebuilt from its result.json and checked against its sizes
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    del config["split_rule"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    code, out, err = run(capsys, "eval", "--model", tmp_path / "m", "--data", trec_slice, "--split", "train",
                         "--cache-dir", tmp_path / "c")
    assert code == 0 and json.loads(out)["n"] == r["sizes"]["train"], err
    r["sizes"]["train"] += 1  # sizes that the data no longer gives: refused, not scored
    (tmp_path / "m" / "result.json").write_text(json.dumps(r))
    code, out, err = run(capsys, "eval", "--model", tmp_path / "m", "--data", trec_slice, "--split", "train",
                         "--cache-dir", tmp_path / "c")
    assert code == 2 and "cannot be rebuilt" in err


def test_eval_reads_the_training_runs_max_train_sample(trec_slice, tiny_bert, tmp_path):
    own = tmp_path / "own"  # the model's data, in a folder of this test's (edited below)
    own.mkdir()
    for f in trec_slice.iterdir():
        (own / f.name).write_bytes(f.read_bytes())
    r = api.train("probe", str(own), api.BackboneOptions(str(tiny_bert), max_length=16), max_train=30,
                  train_cfg={"cv_below": 0, "epochs": 1}, output=tmp_path / "m", cache_root=tmp_path / "c",
                  progress=False, log=lambda s: None)
    for split in ("train", "validation"):
        e = api.evaluate_model(tmp_path / "m", str(own), split, cache_root=tmp_path / "c", progress=False,
                               log=lambda s: None)
        assert e["n"] == r["sizes"][split] and (split != "validation" or e["metrics"] == r["validation"])
    # a copy of its data under another name: the same rows, so the training run's sample (since the rows' digest is
    # what tells its data; by name, it was read as other data and its whole train split scored as held-out); and the
    # same data moved to another folder of the same name
    for where in (tmp_path / "copy", tmp_path / "moved" / "own"):
        where.mkdir(parents=True)
        for f in own.iterdir():
            (where / f.name).write_bytes(f.read_bytes())
        e = api.evaluate_model(tmp_path / "m", str(where), "train", cache_root=tmp_path / "c", progress=False,
                               log=lambda s: None)
        assert e["n"] == r["sizes"]["train"] == 30
    # other data than the model's (other rows, whatever its name): its splits as they are, no sample drawn
    for where in (tmp_path / "other", tmp_path / "elsewhere" / "own"):
        where.mkdir(parents=True)
        for f in own.iterdir():
            (where / f.name).write_bytes(f.read_bytes())
        lines = (where / "train.jsonl").read_text().splitlines()
        (where / "train.jsonl").write_text("\n".join(lines[1:]) + "\n")
        e = api.evaluate_model(tmp_path / "m", str(where), "train", cache_root=tmp_path / "c", progress=False,
                               log=lambda s: None)
        assert e["n"] == len(load_classification(str(where)).train) > 30
    # its own folder, its train rows reordered since: the same sample would be other rows, and it was scored so
    rows = (own / "train.jsonl").read_text().splitlines()
    (own / "train.jsonl").write_text("\n".join(rows[::-1]) + "\n")
    for split in ("train", "validation"):
        with pytest.raises(DataError, match=f"not the ones this model was trained on .*its {split} split cannot be "
                                            f"rebuilt"):
            api.evaluate_model(tmp_path / "m", str(own), split, cache_root=tmp_path / "c", progress=False,
                               log=lambda s: None)
    assert api.evaluate_model(tmp_path / "m", str(own), "test", cache_root=tmp_path / "c", progress=False,
                              log=lambda s: None)["n"] == r["sizes"]["test"]  # test is its own file: scored


def _grid():
    from frozentune.sweep import Grid

    return Grid.parse("probe,space", "-1", "0.01", "0.01,0.1", "0,1")


def test_a_sweep_is_reproducible_and_its_best_is_a_train_of_that_point(trec_slice, tiny_bert, tmp_path):
    from frozentune.sweep import run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    cfg = {"min_steps": 12}
    lines = []
    one = run_sweep(_grid(), str(trec_slice), bb, tmp_path / "s1", shots=2, cache_root=tmp_path / "c",
                    train_cfg=cfg, log=lines.append)
    # the data's notes, as train says them (they were silent: e.g. SNLI training on its validation file), once each
    for seed in (0, 1):
        assert lines.count(f"data: --shots 2: 12 examples, 2 of each class drawn from train (seed {seed}) (from "
                           f"Python: shots= for --shots)") == 1, lines
    two = run_sweep(_grid(), str(trec_slice), bb, None, shots=2, cache_root=tmp_path / "c", train_cfg=cfg, log=lambda s: None)
    keep = ("method", "layer", "lr", "weight_decay", "seed", "score", "test_accuracy", "model_method")
    assert len(one.rows) == 8
    # where the folds kept the regression, the row and the table say so (the rows were labelled with the head)
    from frozentune.sweep.run import markdown
    table = markdown(one, "trec")
    for t in one.table:
        fell = sum(r["model_method"] != r["method"] for r in one.rows
                   if (r["method"], r["layer"], r["lr"], r["weight_decay"]) == (t["method"], t["layer"], t["lr"], t["weight_decay"]))
        assert t["fell_back"] == fell
        assert (f"(a probe in {fell} of {len(t['seeds'])})" in table) == (fell > 0)
    assert [{k: r[k] for k in keep} for r in one.rows] == [{k: r[k] for k in keep} for r in two.rows]
    assert all(r["extract_seconds"] == 0 for r in one.rows[1:] if r["layer"] == one.rows[0]["layer"])
    for name in ("sweep.md", "sweep.json", "sweep.png", "best/model.safetensors"):
        assert (tmp_path / "s1" / name).is_file()
    best = one.best
    api.train(best["method"], str(trec_slice), dataclasses_replace(bb, best["layer"]), shots=2,
              train_cfg=cfg | {"seed": one.best_seed, "lr": best["lr"], "weight_decay": best["weight_decay"]},
              output=tmp_path / "t", cache_root=tmp_path / "c", progress=False, log=lambda s: None)
    texts = ["What is the capital of France ?", "Who wrote Hamlet ?"]
    assert one.best_saved_as == json.loads((tmp_path / "s1" / "best" / "config.json").read_text())["method"]
    # sweep.json's best_temperature is best/'s own record (here none: 12 examples are too few to fit one on)
    best_result = json.loads((tmp_path / "s1" / "best" / "result.json").read_text())
    assert one.best_temperature == best_result["temperature"] is None
    assert json.loads((tmp_path / "s1" / "sweep.json").read_text())["best_temperature"] is None
    a = api.predict(tmp_path / "s1" / "best", texts)
    b = api.predict(tmp_path / "t", texts)
    assert a == b
    # a second sweep into the same folder: refused without --overwrite (saying it holds a sweep), replaced with it
    # (--overwrite was refused: the folder "holds no saved model")
    from frozentune.output import OutputError
    with pytest.raises(OutputError, match="already holds a sweep .* pass --overwrite"):
        run_sweep(_grid(), str(trec_slice), bb, tmp_path / "s1", shots=2, cache_root=tmp_path / "c", train_cfg=cfg,
                  log=lambda s: None)
    again = run_sweep(_grid(), str(trec_slice), bb, tmp_path / "s1", shots=2, cache_root=tmp_path / "c", train_cfg=cfg,
                      overwrite=True, log=lambda s: None)
    assert [r["score"] for r in again.rows] == [r["score"] for r in one.rows] and (tmp_path / "s1" / "sweep.json").is_file()


def test_sweep_from_python_and_its_folders(trec_slice, tiny_bert, tmp_path):
    """From Python the grid takes lists and single values and the backbone a name, as api.train does; the
    same hidden state written two ways (2 and -1 of a 2-layer model) is one layer; best/ records the
    --shots it was trained with; --overwrite does not swap a model for a sweep or the reverse."""
    from frozentune.output import OutputError
    from frozentune.registry import MethodError
    from frozentune.sweep import Grid, run_sweep

    assert Grid.parse(["probe"], [-1, -2], [0.01], 0.1, [0, 1]) == Grid.parse("probe", "-1,-2", "0.01", "0.1", "0,1")
    with pytest.raises(MethodError, match="layers 2 and -1 are the same hidden state"):
        run_sweep(Grid.parse("probe", "2,-1"), str(trec_slice), str(tiny_bert), shots=2, cache_root=tmp_path / "c",
                  log=lambda s: None)
    with pytest.raises(MethodError, match="the seeds are the grid's"):
        run_sweep(Grid.parse("probe"), str(trec_slice), str(tiny_bert), train_cfg={"seed": 7}, log=lambda s: None)
    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    r = run_sweep(Grid.parse("probe"), str(trec_slice), bb, tmp_path / "s", shots=2, cache_root=tmp_path / "c",
                  log=lambda s: None)
    best = json.loads((tmp_path / "s" / "best" / "result.json").read_text())
    assert best["config"]["shots"] == 2 and r.best_saved_as == "probe"
    # all 120 examples, under cross-validation: best/'s temperature fitted on the folds' held-out logits, and said
    r = run_sweep(Grid.parse("probe"), str(trec_slice), bb, tmp_path / "all", cache_root=tmp_path / "c",
                  log=lambda s: None)
    t = json.loads((tmp_path / "all" / "best" / "result.json").read_text())["temperature"]
    assert r.best_temperature == t and t["fitted_on"] == "cross-validation"
    assert (f"best/'s probabilities: its logits are divided by a temperature of {t['value']:.3f}, fitted on the 120 "
            f"training examples") in (tmp_path / "all" / "sweep.md").read_text()
    api.train("probe", str(trec_slice), bb, train_cfg={"epochs": 1, "cv_below": 0}, output=tmp_path / "m",
              cache_root=tmp_path / "c", progress=False, log=lambda s: None)
    with pytest.raises(OutputError, match="holds a saved model; --overwrite replaces a sweep with another, not a saved model"):
        run_sweep(Grid.parse("probe"), str(trec_slice), bb, tmp_path / "m", shots=2, overwrite=True,
                  cache_root=tmp_path / "c", log=lambda s: None)
    with pytest.raises(OutputError, match="holds a sweep; --overwrite replaces a saved model with another, not a sweep"):
        api.train("probe", str(trec_slice), bb, output=tmp_path / "s", overwrite=True, log=lambda s: None)
    with pytest.raises(Exception, match="the folder of a sweep; its best point's model is"):
        api.predict(tmp_path / "s", ["a question ?"])


def test_the_sweep_table_says_where_a_head_fell_back_to_the_regression():
    """A point whose folds kept the logistic regression is a probe: its row said only the head's name."""
    from frozentune.sweep.run import SweepResult, markdown, tabulate

    def row(method, seed, kept):
        return {"method": method, "layer": "-1", "lr": 0.01, "weight_decay": 0.01, "seed": seed, "score": 50.0 + seed,
                "score_is": "cv accuracy", "test_accuracy": 60.0, "seconds": 1.0, "extract_seconds": 0.0,
                "model_method": kept, "selection": {"how": "cross-validation"}}
    rows = [row("space", 0, "probe"), row("space", 1, "space"), row("probe", 0, "probe"), row("probe", 1, "probe")]
    table = tabulate(rows)
    assert [t["fell_back"] for t in table] == [1, 0]
    text = markdown(SweepResult(rows, table, table[0]), "trec")
    assert "| space (a probe in 1 of 2) **best** |" in text and "kept that regression" in text
    assert "best/" not in text  # where nothing was saved, nothing is said of best/
    # "± std" did not say which: it is the population standard deviation over seeds (numpy's default, ddof 0)
    assert "| score (mean ± std) | test accuracy (mean ± std) |" in text
    assert "± is the standard deviation over seeds, population (ddof 0" in text
    assert table[0]["score_std"] == pytest.approx(np.std([50.0, 51.0], ddof=0)) == 0.5
    # best/ is a seed that kept the head: seed 0 kept the regression, which is the probe setting's point
    # (the space setting ranks first because of seed 1's head); it was min(seeds) = 0
    from frozentune.sweep.run import saved_seed
    assert saved_seed(rows, table[0]) == 1 and saved_seed(rows, table[1]) == 0
    assert saved_seed([rows[0], {**rows[1], "model_method": "probe"}], table[0]) == 0  # all fell back: the first
    text = markdown(SweepResult(rows, table, table[0], best_saved_as="space", best_seed=1), "trec")
    assert ("best/ is the best setting's seed 1 (of its seeds, the first whose folds kept the head): cv accuracy "
            "51.00, test 60.00.") in text
    # and whether best/'s probabilities were calibrated (--calibrate): the temperature and what it was fitted on
    assert "best/'s probabilities: the head's own scale: no temperature was fitted (`--calibrate off`" in text
    cal = {"fitted_on": "cross-validation", "value": 1.8, "examples": 360, "distinct_examples": 120}
    text = markdown(SweepResult(rows, table, table[0], best_saved_as="space", best_seed=1, best_temperature=cal),
                    "trec")
    assert ("best/'s probabilities: its logits are divided by a temperature of 1.800, fitted on the 120 training "
            "examples as the fold models that did not train on them scored them") in text
    assert "no temperature was fitted" not in text
    # where best/ is the regression its folds kept, the table (and the log line) say what was saved
    text = markdown(SweepResult(rows, table, table[0], best_saved_as="probe"), "trec")
    assert "The best setting's saved model (best/), as a probe: on these few labels its folds found the space head" in text
    assert "| probe |" in text
    # the note on the probe's solved points comes where the grid varied --lr / --weight-decay (it came always)
    solved = [{**r, "selection": {"how": "cross-validation", "C": 1.0}} for r in rows if r["method"] == "probe"]
    assert "do not change them" not in markdown(SweepResult(solved, tabulate(solved), tabulate(solved)[0]), "trec")
    # probes that fell back from heads with their own default lr (space 0.01, ytuning 0.001): not a varied grid
    mixed = solved + [{**rows[0], "method": "ytuning", "lr": 0.001, "selection": {"how": "cross-validation", "C": 1.0}}]
    assert "do not change them" not in markdown(SweepResult(mixed, tabulate(mixed), tabulate(mixed)[0]), "trec")
    varied = solved + [{**solved[0], "lr": 0.1}]
    assert "--lr and --weight-decay do not change them" in markdown(SweepResult(varied, tabulate(varied),
                                                                              tabulate(varied)[0]), "trec")


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
    # a grid smaller than typed went unnoticed: repeats and empty items were dropped, an empty list meant the default
    (["--methods", "probe", "--seeds", "0,0"], "0 is given twice"),
    (["--methods", "probe", "--seeds", "1,-1"], "give seeds from 0 to 4294967295"),
    (["--methods", "probe", "--lr", "1e-3,0.001"], "0.001 is given twice (as 1e-3)"),
    (["--methods", "probe", "--lr", "1e-3,,1e-2"], "an empty item"),
    (["--methods", "probe", "--lr", ""], "empty; give a comma list"),
    (["--methods", "probe,probe"], "probe is given twice"),
    # --layer-combine was accepted and ignored (each point reads one layer); --shots 1 trained a point, then a traceback
    (["--methods", "probe", "--layers", "-1,-2", "--layer-combine", "concat"], "leave the backbone's layers and --layer-combine out"),
    (["--methods", "probe", "--shots", "1"], "has a single training example and there is no validation split"),
])
def test_sweep_refuses_bad_grids(capsys, trec_slice, args, message):
    code, _, err = run(capsys, "sweep", "--data", trec_slice, *args)
    assert code == 2 and message in err


def test_folds_count_the_distinct_texts_each_class_holds():
    """A class whose rows are copies of one text has one distinct example (a sweep on it passed the
    row count, trained, then ended in a traceback); a class whose texts are also labelled as another
    class counts them (it counted 0 there and was left out of the smallest count)."""
    y = np.array([0, 0, 0, 0, 0, 1, 1])
    groups = np.array([0, 1, 2, 3, 4, 5, 5])  # class 1: one text twice
    k, note = crossval.choose_folds(y, 5, ["a", "rare"], groups)
    assert k == 0 and "'rare' has a single distinct training text (2 rows: copies of it)" in note
    y = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    groups = np.array([0, 1, 2, 3, 4, 0, 1, 5])  # 'rare' on texts 0 and 1 (also 'a'), and text 5
    assert crossval.choose_folds(y, 5, ["a", "rare"], groups) == (3, "class 'rare' has 3 training examples, fewer "
                                                                     "than --cv-folds 5: 3-fold cross-validation")


def test_a_run_without_folds_says_so_in_its_selection(tiny_bert):
    src, _ = _toy(2, dim=32)
    y1 = np.array([0, 0, 0, 1])
    lines = []
    model, fitted, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"]), src, y1, None, None,
                                          TrainConfig(min_steps=12), lines.append,
                                          fallback=_classifier(tiny_bert, ["a", "b"], "probe"))
    assert info["how"] == "planned schedule (no cross-validation possible)" and "score" not in info
    assert any("the planned 12 steps are trained without selection" in s for s in lines)
    assert not any("chosen by cross-validation" in s for s in lines)
    assert not any("the folds also score" in s for s in lines) and info["fallback"] is None  # no folds to score it


def test_the_sweep_scores_a_point_by_what_chose_it():
    """Under --cv-below a validation split is scored, not used: the folds chose, so the sweep ranks
    by their score (it ranked by validation accuracy, which the run's log said it did not use)."""
    from frozentune.sweep.run import point_score

    assert point_score({"validation": {"accuracy": 50.0}, "selection": {"score": 37.5}}) == \
        (37.5, "cross-validated accuracy")
    assert point_score({"validation": {"accuracy": 50.0}, "selection": {"how": "validation"}}) == \
        (50.0, "validation accuracy")


def test_a_sweep_on_a_class_of_copies_is_refused_before_training(capsys, tmp_path):
    rows = [{"text": f"a fine film number {i}", "label": "pos" if i % 2 else "neg"} for i in range(12)]
    rows += [{"text": "the same rare text", "label": "rare"}] * 2
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run(capsys, "sweep", "--data", tmp_path / "d.jsonl", "--methods", "probe", "--seeds", "0",
                         "--output", tmp_path / "s")
    assert code == 2 and "Traceback" not in err and not (tmp_path / "s").exists()
    assert "class 'rare' has a single distinct training text (2 rows: copies of it) and there is no validation" in err


class Unglossed(list):
    """A Python caller's log of lines, each kept without the clause that names the Python spelling of its flags
    (pyterms.glossed: the lines are compared in the command line's words; `raw` has them whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[str] = []

    def append(self, line: str) -> None:
        self.raw.append(line)
        super().append(line.split(" (from Python: ")[0])


def test_options_a_run_does_not_use_are_said(trec_slice, tiny_bert, tmp_path):
    """The exact solve ignored --lr, --epochs, --batch-size... and a run above --cv-below its --cv-* options,
    saying nothing; the probe's repeated folds were run and not recorded."""
    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    said = Unglossed()
    r = api.train("probe", str(trec_slice), bb, shots=2, train_cfg={"lr": 0.5, "epochs": 3, "cv_repeats": 2},
                  cache_root=tmp_path / "c", progress=False, log=said.append)
    assert any(s.startswith("schedule: --lr, --epochs not used: the exact solve") for s in said), said
    assert r["selection"]["repeats"] == 2 and any("folds × 2 repeats, L-BFGS" in s for s in said)
    said.clear()
    api.train("probe", str(trec_slice), bb, max_train=60, train_cfg={"cv_below": 50, "cv_folds": 3, "epochs": 1},
              cache_root=tmp_path / "c", progress=False, log=said.append)
    assert any("--cv-folds not used: 60 training examples are not under --cv-below 50" in s for s in said), said
    # and, said nowhere before: the exact solve's steps, clipping and fallback; --min-steps beside --steps;
    # the folds' options of a head that trains the backbone, or with the folds turned off
    said.clear()
    api.train("probe", str(trec_slice), bb, shots=2, train_cfg={"steps": 5, "min_steps": 9, "max_grad_norm": 0.5,
                                                                  "fallback": "off"},
              cache_root=tmp_path / "c", progress=False, log=said.append)
    assert "schedule: --steps, --min-steps, --max-grad-norm not used: the exact solve has no learning rate, steps or " \
           "batches (its only setting is C, chosen by the folds)" in said, said
    assert "schedule: --fallback not used: this head is the logistic regression the fallback would keep" in said
    assert ('schedule: --steps, --min-steps, --max-grad-norm not used: the exact solve has no learning rate, steps or '
            'batches (its only setting is C, chosen by the folds) (from Python: train_cfg["steps"] for --steps; '
            'train_cfg["min_steps"] for --min-steps; train_cfg["max_grad_norm"] for --max-grad-norm)') in said.raw
    said.clear()
    api.train("finetune", str(trec_slice), bb, max_train=40, train_cfg={"steps": 2, "min_steps": 9, "cv_folds": 3,
                                                                         "fallback": "off"},
              cache_root=None, progress=False, log=said.append)
    assert "schedule: --min-steps not used: --steps 2 sets the number of steps" in said, said
    assert "schedule: --cv-folds, --fallback not used: method 'finetune' trains or steers the backbone, which is not " \
           "cross-validated: validation chooses" in said, said
    said.clear()
    api.train("space", str(trec_slice), bb, max_train=40, train_cfg={"cv_folds": 0, "cv_repeats": 3, "epochs": 1},
              cache_root=tmp_path / "c", progress=False, log=said.append)
    assert "schedule: --cv-repeats not used: --cv-folds 0 turns cross-validation off" in said, said
    said.clear()
    api.train("contrastive", str(trec_slice), bb, shots=2, train_cfg={"steps": 2, "patience": 3, "cv_folds": 3},
              progress=False, log=said.append)
    assert "schedule: --patience, --cv-folds not used: method 'contrastive' trains its fixed schedule whole on few " \
           "labels (no early stopping, no folds)" in said, said
    said.clear()  # --cv-below is used by contrastive: it decides whether the fixed schedule runs
    api.train("contrastive", str(trec_slice), bb, shots=2, train_cfg={"steps": 2, "cv_below": 4}, progress=False,
              log=said.append)
    assert not any("not used" in s for s in said), said


class _StopAfter:
    """A sweep log that raises KeyboardInterrupt (Ctrl-C) at the `n`-th point's line, keeping the lines."""

    def __init__(self, n: int | None = None):
        self.n, self.lines = n, []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.n is not None and line.startswith(f"[{self.n}/"):
            raise KeyboardInterrupt


def test_an_interrupted_sweep_goes_on_from_its_finished_points(trec_slice, tiny_bert, tmp_path):
    """Ctrl-C at point 3 of 8 kept nothing: the same sweep run again trained all 8. Now each finished
    point is kept in a journal in the cache folder; the rerun reuses 3, trains 5, gives the table an
    uninterrupted sweep gives, and removes the journal. A line cut short by a kill is skipped and said;
    --restart (resume=False) trains every point again; a point whose data changed is trained again."""
    from frozentune.sweep import journal as journal_module
    from frozentune.sweep import run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    cfg = {"min_steps": 12}
    keep = ("method", "layer", "lr", "weight_decay", "seed", "score", "test_accuracy", "model_method")

    def sweep(data=trec_slice, log=None, resume=True, output=None):
        return run_sweep(_grid(), str(data), bb, output, shots=2, cache_root=tmp_path / "c", train_cfg=cfg,
                         log=log or _StopAfter(), resume=resume)

    whole = sweep()
    journals = lambda: sorted((tmp_path / "c").glob("sweep-*.points.jsonl"))  # noqa: E731
    assert journals() == []  # a finished sweep removes its journal
    with pytest.raises(KeyboardInterrupt):
        sweep(log=_StopAfter(3), output=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    [journal] = journals()
    assert len(journal.read_text().splitlines()) == 1 + 3  # its header, then a line per finished point
    log = _StopAfter()
    again = sweep(log=log, output=tmp_path / "out")
    assert [{k: r[k] for k in keep} for r in again.rows] == [{k: r[k] for k in keep} for r in whole.rows]
    assert [bool(r.get("reused")) for r in again.rows] == [True] * 3 + [False] * 5
    assert again.seconds["reused_points"] == 3
    assert any("holds 3 finished points of an interrupted run" in line for line in log.lines)
    # the way out in both spellings: run_sweep has no `restart` (a notebook's user could not guess resume=False)
    assert any("(--restart, resume=False in Python, trains every point again)" in line for line in log.lines)
    assert sum("reused" in line for line in log.lines if line.startswith("[")) == 3
    assert "3 of the 8 points were finished by an interrupted run" in (tmp_path / "out" / "sweep.md").read_text()
    assert journals() == []
    # killed while writing: a cut last line is skipped and counted; the whole lines are reused, and the next
    # point goes on a line of its own (it was glued onto the cut one, and lost)
    with pytest.raises(KeyboardInterrupt):
        sweep(log=_StopAfter(2))
    [journal] = journals()
    journal.write_bytes(journal.read_bytes() + b'{"key": "ab')
    log = _StopAfter(4)
    with pytest.raises(KeyboardInterrupt):
        sweep(log=log)
    assert any("holds 2 finished points" in line and "1 line unreadable or changed since written" in line
               for line in log.lines)
    assert sum("reused" in line for line in log.lines if line.startswith("[")) == 2
    log = _StopAfter(5)
    with pytest.raises(KeyboardInterrupt):
        sweep(log=log)
    assert any("holds 4 finished points" in line and "1 line unreadable or changed since written" in line
               for line in log.lines)
    # --restart: the 5 kept points are trained again
    log = _StopAfter()
    restarted = sweep(log=log, resume=False)
    assert not any("reused" in line for line in log.lines) and journals() == []
    assert [{k: r[k] for k in keep} for r in restarted.rows] == [{k: r[k] for k in keep} for r in whole.rows]
    # data changed under the journal (the same command, the file edited): no point reused
    data = tmp_path / "data" / trec_slice.name
    data.mkdir(parents=True)
    for f in trec_slice.iterdir():
        (data / f.name).write_bytes(f.read_bytes())
    with pytest.raises(KeyboardInterrupt):
        sweep(data, log=_StopAfter(2))
    lines = (data / "train.jsonl").read_text().splitlines()
    (data / "train.jsonl").write_text("\n".join(lines[1:] + lines[:1]) + "\n")  # another order: other shots drawn
    log = _StopAfter(3)
    with pytest.raises(KeyboardInterrupt):
        sweep(data, log=log)
    # the 2 rows of the old data are dropped, not counted as kept (an interrupt said "all 8 points are finished")
    assert any("holds 0 finished points" in line and "2 points of another state of its data or backbone dropped"
               in line for line in log.lines), log.lines
    assert not any("reused" in line for line in log.lines if line.startswith("["))
    [kept] = journals()
    assert journal_module.points_in(kept) == 3
    journal_module.current.total = 8
    assert "the 3 finished points and cache entries" in journal_module.interrupt_note(False)


def test_a_sweep_point_is_keyed_on_the_backbones_config(tiny_bert):
    """A sweep rerun after config.json was edited in its backbone's folder (same path, so the same sweep and
    journal; same weights) reused the points trained on the old config's states: a point's key now holds
    the config, as the cache's key does."""
    from frozentune.backbone import Backbone
    from frozentune.sweep.journal import point_keys

    a, b = Backbone.load(str(tiny_bert), max_length=16), Backbone.load(str(tiny_bert), max_length=16)
    point = {"method": "probe", "layer": "2", "lr": 1e-3, "weight_decay": 0.0, "seed": 0}
    assert point_keys(point, "data", a) == point_keys(point, "data", b)
    b.model.config.hidden_act = "relu"
    assert point_keys(point, "data", a)[0] != point_keys(point, "data", b)[0]
    assert point_keys(point, "data", a)[1] == point_keys(point, "data", b)[1]  # the key journals had before


def test_a_journal_written_before_the_config_was_in_its_keys_is_resumed_and_said(trec_slice, tiny_bert, tmp_path,
                                                                                   monkeypatch):
    """The point keys gained the backbone's config; a journal of the version before (keys without it) then
    held "0 finished points … (4 points of another state of its data or backbone dropped: the files at those
    paths changed)", untrue, and trained them again. Its rows are now reused, said so with --restart as the way
    out where config.json was edited since."""
    from frozentune.sweep import run as R
    from frozentune.sweep import run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)

    def sweep(log):
        return run_sweep(_grid(), str(trec_slice), bb, None, shots=2, cache_root=tmp_path / "c",
                         train_cfg={"min_steps": 12}, log=log)

    real = R.point_keys
    monkeypatch.setattr(R, "point_keys", lambda *a: (real(*a)[1],) * 2)  # the version before: keys without config
    with pytest.raises(KeyboardInterrupt):
        sweep(_StopAfter(3))
    monkeypatch.undo()
    log = _StopAfter()
    again = sweep(log)
    assert [bool(r.get("reused")) for r in again.rows] == [True] * 3 + [False] * 5
    assert any("holds 3 finished points" in line and "3 of them kept by an earlier frozentune" in line
               and "--restart" in line and "dropped" not in line for line in log.lines), log.lines


def test_a_sweep_journal_line_of_another_shape_is_skipped(tmp_path):
    """A journal line that is JSON but not a row (hand-edited, another version) is skipped and counted,
    like a line cut short: reusing it raised KeyError mid-sweep."""
    from frozentune.sweep.journal import Journal, points_in

    path = tmp_path / "sweep-x.points.jsonl"
    row = {"method": "probe", "layer": "-1", "lr": 0.01, "weight_decay": 0.01, "seed": 0, "score": 50.0,
           "score_is": "validation accuracy", "test_accuracy": 40.0, "train_seconds": 1.0, "extract_seconds": 0.0,
           "seconds": 1.0, "model_method": "probe", "selection": {}}
    lines = [{"key": "a", "row": row}, {"key": "b", "row": {}}, {"key": "c", "row": row | {"score": "high"}},
             {"key": 1, "row": row}, ["a"], {"key": "d", "row": row | {"seed": True}}]
    old_header = {"sweep": {"data": "x"}}  # a journal written before rows carried checksums: rows read without
    path.write_text("\n".join(json.dumps(x) for x in [old_header, *lines]) + "\n{\"key\": \"e\"\n")
    j = Journal(path, {}, log=lambda s: None)
    assert list(j.rows) == ["a"] and j.skipped == 6 and points_in(path) == 1
    assert j.found("a")["reused"] is True and j.found("b") is None


def test_a_sweep_journal_row_changed_since_written_is_trained_again(tmp_path):
    """A row's score changed in the journal (by hand, a disk, a sync tool) was reused as the point's own: the
    table and the best pick then read it (bench/fuzz.py's sweep part). Each row carries a checksum of itself;
    a row whose checksum differs, or that lost it, is skipped and counted (its point is trained again); a
    journal written before checksums (its header says nothing of them) is read as it was."""
    from frozentune.sweep.journal import Journal, header_line, row_line

    path = tmp_path / "sweep-x.points.jsonl"
    row = {"method": "probe", "layer": "-1", "lr": 0.01, "weight_decay": 0.01, "seed": 0, "score": 50.0,
           "score_is": "validation accuracy", "test_accuracy": 40.0, "train_seconds": 1.0, "extract_seconds": 0.0,
           "seconds": 1.0, "model_method": "probe", "selection": {"how": "validation"}}
    changed = json.loads(row_line("b", row)) | {"row": row | {"score": 99.0}}
    unsummed = {"key": "c", "row": row}
    path.write_bytes(header_line({"data": "x"}) + row_line("a", row) + json.dumps(changed).encode() + b"\n"
                     + json.dumps(unsummed).encode() + b"\n")
    def kept() -> list[str]:
        j = Journal(path, {"data": "x"}, log=lambda s: None)
        j.close()
        return list(j.rows)

    j = Journal(path, {"data": "x"}, log=lambda s: None)
    assert list(j.rows) == ["a"] and j.rows["a"] == row and j.skipped == 2
    assert "(2 lines unreadable or changed since written: skipped, trained again)" in j.opening_line()
    j.add("d", row | {"seed": 1})  # appended with its checksum, read back whole
    j.close()
    assert kept() == ["a", "d"]
    path.write_text("\n".join(json.dumps(x) for x in [{"sweep": {"data": "x"}}, unsummed, changed]) + "\n")
    assert kept() == ["c"]  # the old kind: rows without sums are read, a row with a wrong one is not


def test_a_signal_while_a_point_is_written_still_stops_the_sweep(trec_slice, tiny_bert, tmp_path, monkeypatch):
    """Ctrl-C while a finished point's line is written is held until the line is whole, then raised: the
    sweep ran on to its end (exit 0 after SIGTERM, seen in CI's interrupt test)."""
    import os
    import signal

    from frozentune.sweep import Grid, journal, run_sweep

    real = os.fsync

    def fsync_then_signal(fd):
        os.kill(os.getpid(), signal.SIGINT)  # lands inside the held block
        real(fd)

    import types

    class OsButFsync(types.SimpleNamespace):  # the journal's fsync only: the cache's own fsyncs are not signalled
        def __getattr__(self, name):
            return getattr(os, name)

    monkeypatch.setattr(journal, "os", OsButFsync(fsync=fsync_then_signal))
    from frozentune import interrupts

    # SIGINT as a plain Python program has it: a suite started in the background (`make test &`) inherits it
    # ignored, which Python and the held block keep, and then no signal was raised at all
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sweep(Grid.parse("probe", seeds="0,1,2"), str(trec_slice),
                      api.BackboneOptions(str(tiny_bert), max_length=16), shots=2, cache_root=tmp_path / "c",
                      log=lambda s: None)
    finally:
        signal.signal(signal.SIGINT, before)
        interrupts.clear()  # the recorded signal, as the command line clears it when a command ends
    [kept] = (tmp_path / "c").glob("sweep-*.points.jsonl")
    assert len(kept.read_text().splitlines()) == 1 + 1  # the header and the whole line, and no point after it


def test_sweep_journals_belong_to_their_sweep(trec_slice, tiny_bert, tmp_path, capsys):
    """Another grid on the same data and backbone finished and removed the first sweep's journal (its key
    left the grid out); two runs of one sweep at once both trained every point (now the second is refused
    while the first holds the journal); `cache --list` shows a running sweep's journal as running and
    --prune never removes it; a journal that cannot be written or removed is said, and the sweep ends well."""
    from frozentune.cli import main
    from frozentune.sweep import Grid, journal, run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    root = tmp_path / "c"

    def sweep(grid, log=None, cache_root=root):
        return run_sweep(grid, str(trec_slice), bb, None, shots=2, cache_root=cache_root, log=log or _StopAfter())

    first = Grid.parse("probe", seeds="0,1,2,3")
    with pytest.raises(KeyboardInterrupt):
        sweep(first, _StopAfter(3))
    [kept] = root.glob("sweep-*.points.jsonl")
    sweep(Grid.parse("probe", seeds="5"))  # another sweep, to its end
    assert kept.exists() and journal.points_in(kept) == 3
    # the first sweep is running (holds its journal): a second run of it is refused, cache --list says running
    header, _, _ = journal.read(kept)
    held = journal.Journal(kept, header, log=lambda s: None)
    with pytest.raises(journal.SweepBusy, match="another process is running this same sweep now"):
        sweep(first)
    capsys.readouterr()
    assert main(["cache", "--list", "--json", "--cache-dir", str(root)]) == 0
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["kind"] == "sweep"]
    assert row["status"] == "running" and row["shards"] == "3 finished points" and row["bytes"] > 0
    assert row["sweep"] == f"sweep on {trec_slice} with {tiny_bert}: probe, 4 points"
    assert main(["cache", "--prune", "--include-resumable", "--cache-dir", str(root)]) == 0
    assert "a sweep is running and writing into it now" in capsys.readouterr().out and kept.exists()
    held.close()
    log = _StopAfter()
    sweep(first, log)
    assert sum("reused" in line for line in log.lines if line.startswith("[")) == 3 and not kept.exists()
    # a journal that cannot be opened (here a folder in its place): said once; the sweep ends with its table
    with pytest.raises(KeyboardInterrupt):
        sweep(first, _StopAfter(2))
    [kept] = root.glob("sweep-*.points.jsonl")
    kept.unlink()
    kept.mkdir()
    log = _StopAfter()
    result = sweep(first, log)
    assert len(result.rows) == 4
    assert any(line.startswith(f"sweep: cannot keep finished points in {kept}") for line in log.lines)
    assert any(line.startswith(f"sweep: cannot remove {kept}") for line in log.lines)


def test_what_an_interrupt_says_a_sweep_kept(tmp_path):
    """Points that could not be written are not said to be kept, and points kept before still are (a read-only
    cache said "could not be kept" of all); a journal without a header (not this version's) is unreadable to
    `cache --list` and removed by --prune."""
    from frozentune.extract.entries import prune, scan
    from frozentune.sweep import journal

    row = {"method": "probe", "layer": "-1", "lr": 0.01, "weight_decay": 0.01, "seed": 0, "score": 50.0,
           "score_is": "validation accuracy", "test_accuracy": 40.0, "train_seconds": 1.0, "extract_seconds": 0.0,
           "seconds": 1.0, "model_method": "probe", "selection": {}}
    blocked = tmp_path / "sweep-x.points.jsonl"
    blocked.mkdir()  # cannot be opened as a file: nothing is written
    lines: list[str] = []
    j = journal.Journal(blocked, {}, lines.append)
    journal.current, j.total = j, 5
    j.add("a", row)
    j.add("b", row)
    assert any("cannot keep finished points" in line for line in lines)
    assert "the 2 points finished in this run could not be kept" in journal.interrupt_note(False)
    j.rows = {"k": row}  # one it had read before (a read-only journal)
    note = journal.interrupt_note(True)
    assert "the 1 point it held before are kept: run the same command again without --restart" in note
    root = tmp_path / "cache"
    root.mkdir()
    old = root / ("sweep-" + "0" * 32 + ".points.jsonl")
    old.write_text(json.dumps({"key": "a", "row": row}) + "\n")  # rows, no header
    [e] = scan(root)
    assert e.kind == "sweep" and e.status.startswith("unreadable") and e.removable
    assert [x.path for x in prune(root)] == [old] and not old.exists()
    journal.current = None


def test_one_sweep_however_its_backbone_and_device_are_spelled(trec_slice, tiny_bert, tmp_path, monkeypatch):
    """--backbone ./bert and its absolute path, --device cpu and the default on a CPU: one sweep, one journal
    (each spelling trained from the first point)."""
    from frozentune.sweep import Grid, run_sweep

    grid = Grid.parse("probe", seeds="0,1,2")
    with pytest.raises(KeyboardInterrupt):
        run_sweep(grid, str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16), shots=2,
                  cache_root=tmp_path / "c", log=_StopAfter(2))
    monkeypatch.chdir(tiny_bert.parent)
    log = _StopAfter()
    run_sweep(grid, str(trec_slice), api.BackboneOptions(f"./{tiny_bert.name}", max_length=16, device="cpu"), shots=2,
              cache_root=tmp_path / "c", log=log)
    assert sum("reused" in line for line in log.lines if line.startswith("[")) == 2


def test_a_default_given_explicitly_is_the_same_point(trec_slice, tiny_bert, tmp_path):
    """`--lr 0.01` (the probe's default) and no --lr, `--layers -1` and the method's own layer: one sweep, whose
    points are reused (the grid as typed was the key)."""
    from frozentune.registry import get_method
    from frozentune.sweep import Grid, run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    defaults = get_method("probe").train_defaults
    with pytest.raises(KeyboardInterrupt):
        run_sweep(Grid.parse("probe", seeds="0,1,2"), str(trec_slice), bb, shots=2, cache_root=tmp_path / "c",
                  log=_StopAfter(2))
    log = _StopAfter()
    run_sweep(Grid.parse("probe", "-1", str(defaults["lr"]), seeds="0,1,2"), str(trec_slice), bb, shots=2,
              cache_root=tmp_path / "c", log=log)
    assert sum("reused" in line for line in log.lines if line.startswith("[")) == 2


def test_a_validation_carved_from_enough_rows_early_stops_rather_than_folds(trec_slice, tiny_bert, tmp_path):
    """120 training rows under --cv-below 110: the 10% carve left 108, under it, so the run cross-validated
    those and scored the 12 carved examples for nothing. The rows given are not under --cv-below, so the
    carve early-stops, and the run says why. A --max-train sample under it still folds: its validation came
    from the larger train, not from the rows it trains on."""
    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    said: list[str] = []
    r = api.train("probe", str(trec_slice), bb, train_cfg={"cv_below": 110, "epochs": 1}, cache_root=tmp_path / "c",
                  progress=False, log=said.append)
    assert r["selection"]["how"] == "validation" and r["sizes"] == {"train": 108, "validation": 12, "test": 40}, r
    assert any("early stopping on 12 validation examples" in s and "carved from the 120 training examples given, "
               "which are not under --cv-below 110, so validation chooses rather than folds" in s for s in said), said
    r = api.train("probe", str(trec_slice), bb, max_train=100, train_cfg={"cv_below": 110, "epochs": 1},
                  cache_root=tmp_path / "c", progress=False, log=said.append)
    assert r["selection"]["how"] == "cross-validation" and r["sizes"]["train"] == 100, r


def test_the_head_is_the_mean_of_the_refit_and_the_fold_models_at_the_chosen_step(tiny_bert, monkeypatch):
    """--average-folds on: the saved head is the mean of the refit's weights and the k fold models' at the
    chosen step (each fold model is the one a run of that many steps on its folds gives, as the refit is on
    all of train); off: the refit alone, as before; auto (the default): as the head says (Y-Tuning averages)."""
    from dataclasses import replace

    from frozentune.train import Schedule

    src, y = _toy(6, dim=32)
    build = _classifier(tiny_bert, ["a", "b"])
    cfg = TrainConfig(cv_folds=3, min_steps=20, batch_size=8, fallback="off", average_folds="on")
    off, _, info_off = crossval.fit_cv(build, src, y, None, None, replace(cfg, average_folds="off"), lambda s: None)
    assert "averaged" not in info_off
    seen = {}
    real = crossval.average_into

    def spy(model, others):
        seen["refit"], seen["others"] = crossval.trained_weights(model), others
        real(model, others)
    monkeypatch.setattr(crossval, "average_into", spy)
    said: list[str] = []
    on, _, info = crossval.fit_cv(build, src, y, None, None, cfg, said.append)
    chosen = info["chosen_steps"]
    assert info["averaged"] == 4 and len(seen["others"]) == 3 and chosen == info_off["chosen_steps"]
    assert any(f"the mean of the refit's and the 3 fold models' at step {chosen}" in s for s in said), said
    trained = crossval.trained_weights(off)
    assert trained.keys() == seen["refit"].keys()
    for name, value in trained.items():  # the refit is the run with averaging off
        assert torch.equal(value, seen["refit"][name]), name
    tr, _ = crossval.folds(y, 3, cfg.seed)[0]
    alone = build()  # fold 0's model, trained for the chosen steps alone
    fit(alone, crossval.Subset(src, tr), y[tr], None, None, cfg, lambda s: None,
        Schedule(chosen, chosen, crossval.plan_steps(len(tr), cfg, constant=True).warmup, True, "test"), select=False)
    kept_fold = seen["others"][0]
    for name, value in crossval.trained_weights(alone).items():
        torch.testing.assert_close(kept_fold[name], value, rtol=0, atol=0, msg=name)
    for name, p in on.named_parameters():
        if p.requires_grad:
            mean = (seen["refit"][name] + sum(o[name] for o in seen["others"])) / 4
            torch.testing.assert_close(p.detach(), mean, rtol=1.3e-6, atol=1e-7, msg=name)  # float32 sums in two orders
    with pytest.raises(ValueError, match="average_folds|--average-folds"):
        replace(cfg, average_folds="yes").validate()
    auto = replace(cfg, average_folds="auto")
    for method in ("space", "ytuning", "selfexplain"):
        head = _classifier(tiny_bert, ["a", "b"], method)
        _, _, info = crossval.fit_cv(head, src, y, None, None, auto, lambda s: None)
        assert ("averaged" in info) == (method == "ytuning") == type(head().head).average_folds, (method, info)


def test_a_head_too_large_to_average_is_refit_alone_and_said(tiny_bert, monkeypatch):
    src, y = _toy(6, dim=32)
    monkeypatch.setattr(crossval, "SOUP_BYTES", 1)
    said: list[str] = []
    cfg = TrainConfig(cv_folds=3, min_steps=20, batch_size=8, fallback="off", average_folds="on")
    _, _, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"]), src, y, None, None, cfg, said.append)
    assert "averaged" not in info
    assert any(s.startswith("cross-validation: the fold models are not averaged: keeping their weights at ")
               and s.endswith("MB allowed for it, so the refit alone is the model") for s in said), said


def test_a_diverging_training_is_one_line_that_says_to_lower_the_rate(capsys, trec_slice, tiny_bert, tmp_path):
    """A learning rate too high made the loss NaN: the trainer's message said "lower --lr", under a traceback."""
    code, out, err = run(capsys, "train", "--method", "space", "--data", trec_slice, "--backbone", tiny_bert,
                         "--max-length", 16, "--shots", 2, "--cache-dir", tmp_path / "c", "--min-steps", 8,
                         "--lr", "1e30", "--output", tmp_path / "m")
    assert code == 2 and "Traceback" not in err, err
    # lr × the default weight decay is 1e28 too: the weights go non-finite at the update, before a loss says so
    assert "the weights became non-finite; lower --lr" in err and "the output folder is as it was" in err
    assert not (tmp_path / "m").exists()
    from frozentune import FrozentuneError
    from frozentune.train import Diverged
    with pytest.raises(Diverged, match="the weights became non-finite") as e:
        api.train("space", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16), shots=2,
                  train_cfg={"min_steps": 8, "lr": 1e30}, cache_root=tmp_path / "c", progress=False, log=lambda s: None)
    assert isinstance(e.value, FrozentuneError) and isinstance(e.value, FloatingPointError)  # older except clauses
    import pickle
    again = pickle.loads(pickle.dumps(e.value))  # as a worker process would hand it on
    assert (str(again), again.where) == (str(e.value), e.value.where)


def test_a_diverging_sweep_point_is_a_row_and_the_sweep_goes_on(trec_slice, tiny_bert, tmp_path):
    """One learning rate of the grid too high: the whole sweep died with a traceback at that point. Its row
    now says where it diverged, the table marks the setting, and the best is chosen among the others."""
    from frozentune.registry import MethodError
    from frozentune.sweep import Grid, run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    lines: list[str] = []
    r = run_sweep(Grid.parse("space", "-1", "0.01,1e30", None, "0,1"), str(trec_slice), bb, tmp_path / "s", shots=2,
                  cache_root=tmp_path / "c", train_cfg={"min_steps": 8}, log=lines.append)
    gone = [row for row in r.rows if row.get("diverged")]
    assert [row["lr"] for row in gone] == [1e30, 1e30] and all(row["score"] is None for row in gone)
    assert all(row["diverged"].endswith("the weights became non-finite") for row in gone)
    assert sum("diverged (" in line and "not scored; lower --lr" in line for line in lines) == 2, lines
    assert r.best["lr"] == 0.01 and r.best["diverged"] == 0
    high = next(t for t in r.table if t["lr"] == 1e30)
    assert (high["diverged"], high["score_mean"]) == (2, None)
    md = (tmp_path / "s" / "sweep.md").read_text()
    assert "| space (diverged in 2 of 2) | -1 | 1e+30 |" in md and "| — | — |" in md
    assert (tmp_path / "s" / "sweep.png").is_file()
    saved = json.loads((tmp_path / "s" / "sweep.json").read_text())["rows"]
    assert [x["lr"] for x in saved if x.get("diverged", "").endswith("became non-finite")] == [1e30, 1e30]
    with pytest.raises(MethodError, match="every setting diverged .* give lower learning rates"):
        run_sweep(Grid.parse("space", "-1", "1e30", None, "0"), str(trec_slice), bb, None, shots=2,
                  cache_root=tmp_path / "c", train_cfg={"min_steps": 8}, log=lambda s: None)


def test_the_sweep_table_ranks_a_setting_with_a_diverged_seed_below_none():
    """A setting that trained on one seed and diverged on the other keeps that seed's figures, is marked,
    and is not the best even where its one score is the highest."""
    from frozentune.sweep.run import best_setting, markdown, SweepResult, tabulate

    def row(lr, seed, score, diverged=None):
        return {"method": "space", "layer": "-1", "lr": lr, "weight_decay": 0.01, "seed": seed, "score": score,
                "score_is": None if diverged else "cross-validated accuracy", "test_accuracy": score,
                "seconds": 1.0, "extract_seconds": 0.0, "model_method": "space", "selection": {}, "diverged": diverged}

    rows = [row(0.1, 0, 90.0), row(0.1, 1, None, "step 2: loss became inf"), row(0.01, 0, 60.0), row(0.01, 1, 70.0)]
    table = tabulate(rows)
    assert table[0]["score_mean"] == 90.0 and table[0]["diverged"] == 1
    best = best_setting(table)
    assert best["lr"] == 0.01 and best["score_mean"] == 65.0
    md = markdown(SweepResult(rows, table, best), "trec")
    assert "| space (diverged in 1 of 2) | -1 | 0.1 | 0.01 | 2 | 90.00 ± 0.00 |" in md
    assert "- space layer -1 lr 0.1 wd 0.01 seed 1: step 2: loss became inf" in md


def _fit_tiny(cfg_kw: dict, validate=lambda: {}, log=lambda s: None):
    """fit_loop on a 2 → 2 linear layer and 8 examples, one round per step."""
    from frozentune.train import fit_loop

    torch.manual_seed(0)
    layer = torch.nn.Linear(2, 2)
    x, y = torch.randn(8, 2), torch.arange(8) % 2
    cfg = TrainConfig(**{"batch_size": 4, "warmup": 0.0} | cfg_kw)
    return layer, fit_loop(layer, np.ones(8, dtype=np.int64),
                           lambda idx: torch.nn.functional.cross_entropy(layer(x[idx]), y[idx]),
                           validate, lambda m: m["accuracy"], cfg, log)


def test_weights_that_the_last_update_made_non_finite_are_a_divergence():
    """The loss is checked before each update, so the last step's update went unchecked: with --steps 1 the
    NaN weights were validated, chosen as best and met as "Out of range float values are not JSON compliant"
    when result.json was written (a traceback, the run lost)."""
    from frozentune.train import Diverged

    with pytest.raises(Diverged, match=r"^step 1: the weights became non-finite; lower --lr or --weight-decay "
                                       r"\(lr × weight decay = 1e\+40: at 1 or more each step's decay overshoots zero\)$"):
        _fit_tiny({"lr": 1e30, "weight_decay": 1e10, "steps": 1})


def test_an_update_too_large_for_float32_is_a_divergence():
    """--lr 1e39 is a finite number, but Adam's first step (up to 10× the rate) overflows float32: torch's
    "value cannot be converted to type float without overflow" came out as a traceback, and ended a sweep."""
    from frozentune.train import Diverged

    with pytest.raises(Diverged, match="^step 1: the optimiser's update overflowed float32; lower --lr$"):
        _fit_tiny({"lr": 1e39, "weight_decay": 0.0, "steps": 2})


def test_the_run_says_which_round_it_kept_when_that_is_not_the_last():
    """Without an early stop the schedule's last round was printed and an earlier round's weights were saved,
    with no line saying so."""
    scores = iter([80.0, 60.0, 70.0])
    lines: list[str] = []
    _, r = _fit_tiny({"lr": 1e-3, "steps": 3, "patience": 0}, validate=lambda: {"accuracy": next(scores)},
                     log=lines.append)
    assert r.best_epoch == 1 and not r.stopped_early
    assert lines[-1] == "kept the weights of validation round 1 of 3 (step 1), the best on validation", lines
    lines.clear()
    scores = iter([60.0, 70.0, 80.0])
    _fit_tiny({"lr": 1e-3, "steps": 3, "patience": 0}, validate=lambda: {"accuracy": next(scores)}, log=lines.append)
    assert not any(line.startswith("kept the weights") for line in lines)  # the last round is the one kept
    lines.clear()  # patience running out at the last round: it said "early stop" of a schedule that ran whole
    scores = iter([80.0, 60.0, 70.0])
    _, r = _fit_tiny({"lr": 1e-3, "steps": 3, "patience": 2}, validate=lambda: {"accuracy": next(scores)},
                     log=lines.append)
    assert not r.stopped_early and not any(line.startswith("early stop") for line in lines), lines
    assert lines[-1] == "kept the weights of validation round 1 of 3 (step 1), the best on validation"


def test_contrastive_refuses_batches_of_one(trec_slice, tiny_bert, tmp_path):
    """A batch of one has no pair: the run finished, "trained", with an encoder the pair loss never moved."""
    from frozentune.registry import MethodError

    with pytest.raises(MethodError, match=r"^contrastive: --batch-size 1: its loss compares the texts of a batch in "
                                          r"pairs, and a batch of one has none; give 2 or more "
                                          r"\(from Python: train_cfg\[\"batch_size\"\] for --batch-size\)$"):
        api.train("contrastive", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16), shots=1,
                  train_cfg={"batch_size": 1}, output=tmp_path / "m", cache_root=tmp_path / "c", progress=False,
                  log=lambda s: None)
    assert not (tmp_path / "m").exists()


def _pooled_loss_by_fold(held: "crossval.HeldOut", splits) -> float:
    """The mean over folds of each fold's mean cross-entropy, from the out-of-fold logits (in fold order)."""
    out, at = [], 0
    for _, rows in splits:
        z = torch.from_numpy(held.logits[at:at + len(rows)])
        out.append(float(torch.nn.functional.cross_entropy(z, torch.from_numpy(held.y[at:at + len(rows)]))))
        at += len(rows)
    assert at == len(held.y)
    return float(np.mean(out))


@pytest.mark.parametrize("pick_regression", [True, False])
def test_the_held_out_logits_are_the_chosen_candidate_s_out_of_fold(tiny_bert, monkeypatch, pick_regression):
    """fit_cv's held_out: every training example once, scored by the fold model that did not train on it, at the
    candidate chosen. The regression kept: each fold's logits are a regression solved on its other rows; the head's
    first checkpoint kept (not the last, not the regression before it): its folds' losses are the ones recorded
    there."""
    src, y = _toy(6, classes=2, dim=32)  # 12 examples, 3 folds of 4
    _spy_choice(monkeypatch, pick_regression)
    monkeypatch.setattr(crossval, "one_se", lambda acc, mean_loss, prefer=None, k=None: 0)  # the first checkpoint
    cfg = TrainConfig(cv_folds=3, min_steps=20, batch_size=8)
    probe = _classifier(tiny_bert, ["a", "b"], "probe")
    model, fitted, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"], "space"), src, y, None, None, cfg,
                                          lambda s: None, fallback=probe)
    held, splits = fitted.held_out, crossval.folds(y, 3, cfg.seed)
    assert (held.examples, held.folds, held.logits.shape) == (12, 3, (12, 2))
    assert np.array_equal(held.y, y[np.concatenate([rows for _, rows in splits])])
    # equal folds: the pooled cross-entropy is the mean of the folds' (float32 sums of 4 terms each, averaged)
    want = info["regression_loss"] if pick_regression else info["mean_loss"][0]
    assert _pooled_loss_by_fold(held, splits) == pytest.approx(want, rel=tol(torch.float32, dot(4)))
    assert want != pytest.approx(info["mean_loss"][-1] if pick_regression else info["regression_loss"])
    if pick_regression:  # the same solve on the same rows, in this process: the same numbers
        x = crossval.convex_inputs(probe(), src)
        for i, (tr, rows) in enumerate(splits):
            _, z = crossval.convex_fold(probe, x, src, y, tr, rows, crossval.C_DEFAULT, cfg)
            assert np.array_equal(held.logits[4 * i:4 * i + 4], z)


def test_the_convex_probe_s_held_out_logits_are_those_of_the_c_chosen(tiny_bert, monkeypatch):
    src, y = _toy(6, classes=2, dim=32)
    monkeypatch.setattr(crossval, "one_se", lambda acc, mean_loss, prefer=None, k=None: 1)  # C = C_GRID[1]
    model, fitted, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"], "probe"), src, y, None, None,
                                          TrainConfig(cv_folds=3), lambda s: None)
    assert info["C"] == crossval.C_GRID[1] and fitted.held_out.examples == 12
    got = _pooled_loss_by_fold(fitted.held_out, crossval.folds(y, 3, 0))
    assert got == pytest.approx(info["mean_loss"][1], rel=tol(torch.float32, dot(4)))
    assert got != pytest.approx(info["mean_loss"][2])  # C = 1 (the default) gives other logits


def test_no_held_out_logits_without_folds(tiny_bert):
    src, _ = _toy(2, dim=32)
    _, fitted, info = crossval.fit_cv(_classifier(tiny_bert, ["a", "b"]), src, np.array([0, 0, 0, 1]), None, None,
                                      TrainConfig(min_steps=12), lambda s: None)
    assert info["folds"] == 0 and fitted.held_out is None

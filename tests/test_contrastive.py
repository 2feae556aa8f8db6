"""`contrastive` (SetFit's pair loss over every pair of a batch, then a logistic regression on the
tuned embeddings): the loss against its definition, the solve after training, the fixed few-label
schedule of `train`, and the options it refuses. The shared checks (shapes, gradients, save → load)
are test_methods.py's, which run every registered method."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from frozentune import api, distributed
from frozentune import model as M
from frozentune.heads.contrastive import pair_loss
from frozentune.registry import MethodError, get_method, make_config
from frozentune.train import TrainConfig, fit

from numerics import ROUNDING, assert_close, dot
from test_few_labels import _optimum_bound, _penalised_objective, run

pytestmark = pytest.mark.usefixtures("one_thread")


def test_pair_loss_is_the_mean_over_every_pair_of_the_squared_cosine_error():
    g = torch.Generator().manual_seed(0)
    e = F.normalize(torch.randn(5, 8, generator=g, dtype=torch.float64), dim=-1)
    y = torch.tensor([0, 1, 0, 2, 1])
    want = np.mean([(float(e[i] @ e[j]) - float(y[i] == y[j])) ** 2 for i, j in itertools.combinations(range(5), 2)])
    # 10 pairs, each a D=8 dot product, a square and a term of the mean: float64 rounding only
    assert_close(pair_loss(e, y), torch.tensor(want, dtype=torch.float64), ops=dot(8) + 2 + dot(10), what="pair loss")
    same = F.normalize(torch.ones(3, 4), dim=-1)  # identical embeddings of one class: cos 1, target 1
    assert pair_loss(same, torch.zeros(3, dtype=torch.long)) == 0
    one = torch.randn(1, 4, requires_grad=True)  # no pair: 0, and backward still runs
    loss = pair_loss(one, torch.zeros(1, dtype=torch.long))
    loss.backward()
    assert loss == 0 and one.grad is not None


def test_balanced_pair_loss_weights_same_and_different_class_pairs_equally():
    g = torch.Generator().manual_seed(1)
    e = F.normalize(torch.randn(7, 8, generator=g, dtype=torch.float64), dim=-1)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 2])
    pairs = list(itertools.combinations(range(7), 2))
    err = {(i, j): (float(e[i] @ e[j]) - float(y[i] == y[j])) ** 2 for i, j in pairs}
    same = [v for (i, j), v in err.items() if y[i] == y[j]]
    diff = [v for (i, j), v in err.items() if y[i] != y[j]]
    assert 0 < len(same) < len(diff)  # the two kinds differ in number, so the weighting matters
    want = (np.mean(same) + np.mean(diff)) / 2
    assert_close(pair_loss(e, y, balance=True), torch.tensor(want, dtype=torch.float64), ops=dot(8) + 2 + dot(21),
                 what="balanced pair loss")
    assert not torch.isclose(pair_loss(e, y, balance=True), pair_loss(e, y))
    # a batch with one kind of pair only: the mean over that kind, as without balancing
    for labels in (torch.zeros(7, dtype=torch.long), torch.arange(7)):
        assert pair_loss(e, labels, balance=True) == pair_loss(e, labels)


def _model(tiny_bert, labels=("neg", "pos"), options=None):
    bb = api.BackboneOptions(str(tiny_bert), max_length=16).load()
    return M.build_classifier("contrastive", bb, list(labels), options, seed=0), bb


TEXTS = ["good film", "bad film", "a great movie", "boring and long", "i loved it", "i hated it", "fine acting",
         "awful plot"]
LABELS = np.array([1, 0, 1, 0, 1, 0, 1, 0])


@pytest.mark.parametrize("c", [0.5, 4.0])
def test_after_training_the_output_is_logistic_regression_solved_on_the_tuned_embeddings(tiny_bert, c):
    from sklearn.linear_model import LogisticRegression

    model, bb = _model(tiny_bert, options={"logreg_c": c})
    src = M.LiveSource(bb.tokenize(TEXTS), bb.pad_id())
    fit(model, src, LABELS, None, None, TrainConfig(steps=3, batch_size=8, lr=1e-3), log=lambda s: None)
    with torch.no_grad():
        e = model(src.batch(np.arange(len(TEXTS)))).extras["embedding"].double().numpy()
    assert_close(torch.from_numpy(np.linalg.norm(e, axis=1)), torch.ones(len(TEXTS), dtype=torch.float64),
                 ops=dot(e.shape[1]) + ROUNDING, dtype=torch.float32, what="the embeddings' norms")
    ours = _penalised_objective(model.head.out.weight.detach().double().numpy(),
                                model.head.out.bias.detach().double().numpy(), e, LABELS, c)
    ref = LogisticRegression(C=c, max_iter=10000, tol=1e-10).fit(e, LABELS)
    theirs = _penalised_objective(ref.coef_, ref.intercept_, e, LABELS, c)
    assert ours <= theirs + _optimum_bound(e, 2, theirs)


def test_the_pair_loss_trains_the_encoder_and_the_cross_entropy_only_the_output(tiny_bert, monkeypatch):
    from frozentune.heads import contrastive

    model, bb = _model(tiny_bert)
    src = M.LiveSource(bb.tokenize(TEXTS), bb.pad_id())
    out = model(src.batch(np.arange(len(TEXTS))))
    y = torch.from_numpy(LABELS)
    enc = [p for p in model.backbone.parameters() if p.requires_grad]
    head = list(model.head.out.parameters())
    grads = torch.autograd.grad(pair_loss(out.extras["embedding"], y), enc + head, allow_unused=True, retain_graph=True)
    assert all(g is None for g in grads[len(enc):])  # the pair loss never reaches the linear layer
    assert any(g is not None and g.abs().sum() > 0 for g in grads[:len(enc)])
    monkeypatch.setattr(contrastive, "pair_loss", lambda e, labels, balance=False: torch.zeros((), dtype=e.dtype))
    grads = torch.autograd.grad(model.head.loss(out, y), enc + head, allow_unused=True)
    assert all(g is None for g in grads[:len(enc)])  # the cross-entropy reads the embeddings cut off
    assert all(g is not None and g.abs().sum() > 0 for g in grads[len(enc):])


def test_train_on_few_labels_runs_the_fixed_schedule_without_a_validation_split(capsys, trec_slice, tiny_bert, tmp_path):
    code, out, err = run(capsys, "train", "--method", "contrastive", "--data", trec_slice, "--backbone", tiny_bert,
                         "--max-length", 16, "--shots", 2, "--output", tmp_path / "m")
    assert code == 0, err
    assert "the training defaults are finetune's" not in out  # its own defaults, not fine-tuning's
    defaults = get_method("contrastive").train_defaults
    r = json.loads((tmp_path / "m" / "result.json").read_text())
    assert r["selection"]["how"] == "fixed schedule" and r["validation"] is None and r["sizes"]["validation"] == 0
    steps = [h["step"] for h in r["history"]]
    assert steps[-1] == defaults["min_steps"]  # 12 examples, one batch: the floor
    assert r["config"]["train"]["lr"] == defaults["lr"] and r["config"]["train"]["batch_size"] == defaults["batch_size"]
    assert "no early stopping" in out and "constant rate after warm-up" in out and "so none is carved" in out
    code, out, err = run(capsys, "predict", "--model", tmp_path / "m", "What is the capital of France ?")
    assert code == 0, err


def test_a_large_train_set_early_stops_on_validation_as_finetune_does(tiny_bert, trec_slice):
    logs = []
    r = api.train("contrastive", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16),
                  train_cfg={"cv_below": 50, "epochs": 2, "batch_size": 32, "min_steps": 0}, log=logs.append)
    assert r["selection"]["how"] == "validation" and r["sizes"]["validation"] > 0
    assert any("early stopping on" in s for s in logs)


@pytest.mark.parametrize("options, message", [
    ({"train_backbone": False}, "train_backbone must be true"),
    ({"logreg_c": 0.0}, "give a positive inverse L2 strength"),
    ({"top_layers": -1}, "give 0 \\(all layers\\) or a positive count"),
])
def test_options_that_cannot_work_are_refused(options, message):
    with pytest.raises(MethodError, match=message):
        make_config("contrastive", options)


def test_the_cli_takes_its_options_and_refuses_bad_ones_in_one_line(capsys, trec_slice, tiny_bert, tmp_path):
    common = ("train", "--method", "contrastive", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 16,
              "--shots", 2)
    code, out, err = run(capsys, *common, "--logreg-c", 0)
    assert code == 2 and "logreg_c=0.0; give a positive inverse L2 strength" in err
    code, out, err = run(capsys, *common, "--no-train-backbone")
    assert code == 2 and "use --method probe" in err
    code, out, err = run(capsys, *common, "--logreg-c", 4, "--top-layers", 1, "--balance-pairs",
                         "--output", tmp_path / "m")
    assert code == 0, err
    options = json.loads((tmp_path / "m" / "result.json").read_text())["config"]["method_options"]
    assert (options["logreg_c"], options["top_layers"], options["balance_pairs"]) == (4.0, 1, True)


def test_data_parallel_refuses_the_pair_loss(tiny_bert, monkeypatch):
    model, bb = _model(tiny_bert)
    src = M.LiveSource(bb.tokenize(TEXTS[:4]), bb.pad_id())
    out = model(src.batch(np.arange(4)))
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    with pytest.raises(ValueError, match="cannot be split across data-parallel processes; run it in one process"):
        model.head.loss(out, torch.from_numpy(LABELS[:4]))


def test_train_under_a_launcher_refuses_before_loading_anything(tiny_bert, monkeypatch):
    """Refused before the data and the backbone load (it used to load both and print its data-parallel line)."""
    monkeypatch.setattr(distributed, "launch", lambda: distributed.Launch(0, 2, 0, 2, "torchrun"))
    monkeypatch.setattr(api, "load_classification", lambda *a, **k: pytest.fail("the data was loaded"))
    with pytest.raises(MethodError, match="contrastive: its pair loss spans the whole batch, so it cannot be split"):
        api.train("contrastive", "no-such-data", tiny_bert, progress=False, log=lambda s: None)


def test_top_layers_train_only_those_blocks(tiny_bert):
    model, _ = _model(tiny_bert, options={"top_layers": 1})
    names = [n for n, p in model.backbone.named_parameters() if p.requires_grad]
    assert names and all(".layer.1." in n for n in names), names  # the tiny BERT's top block of 2

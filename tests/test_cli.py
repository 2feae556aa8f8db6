"""The CLI end to end on a tiny model and a slice of the real TREC data."""
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from numerics import ROUNDING, approx, softmax, sum_of_abs, tol

from frozentune.cli import main
from frozentune.registry import list_methods


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def trained(tiny_bert, trec_slice, tmp_path, capsys):
    out = tmp_path / "model"
    code, stdout, err = run(capsys, "train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert,
                            "--max-length", 32, "--epochs", 3, "--output", out, "--cache-dir", tmp_path / "cache",
                            "--pooling", "cls", "--quiet")
    assert code == 0, err
    return out, stdout, tmp_path / "cache"


def test_train_writes_model_and_result(trained):
    out, stdout, _ = trained
    # 120 examples: under --cv-below, so folds choose the steps (no validation carved), said in the log
    assert "test accuracy" in stdout and "cross-validation" in stdout and "no validation split" in stdout
    result = json.loads((out / "result.json").read_text())
    for key in ("trainable_params", "extract_seconds", "train_seconds", "peak_rss_mb"):
        assert isinstance(result[key], (int, float))
    assert set(result["metrics"]) >= {"accuracy", "macro_f1"}
    assert result["config"]["method_options"]["pooling"] == "cls"
    assert result["environment"]["torch"] == torch.__version__ and result["environment"]["torch_threads"] >= 1
    assert result["trainable_params"] == 32 * 6 + 6
    assert result["extract_seconds"] > 0
    # the weights file is as readable as the rest of the folder (safetensors wrote it 0600)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == (out / "config.json").stat().st_mode & 0o777
    config = json.loads((out / "config.json").read_text())
    assert config["labels"] == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"][: len(config["labels"])] or config["labels"]
    assert config["method"] == "probe" and config["backbone"]["max_length"] == 32


def test_eval_agrees_with_training_run(trained, trec_slice, capsys):
    out, _, cache = trained
    result = json.loads((out / "result.json").read_text())
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--cache-dir", cache)
    assert code == 0, err
    assert json.loads(stdout)["metrics"] == result["metrics"]  # exact: the same cached states, model and batches
    assert "eval: the test split, 40 examples" in err
    # a person reading the terminal gets the figures in one line, the JSON being long
    m = result["metrics"]
    assert f"eval: accuracy {m['accuracy']:.2f} (95% interval" in err and f"macro-F1 {m['macro_f1']:.2f}" in err


def test_eval_reports_each_class_and_the_confusion_matrix(trained, trec_slice, capsys):
    out, _, cache = trained
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--cache-dir", cache)
    got = json.loads(stdout)
    labels = json.loads((out / "config.json").read_text())["labels"]
    truth = [json.loads(line)["label"] for line in (trec_slice / "test.jsonl").read_text().splitlines()]
    matrix = np.array(got["confusion"]["matrix"])
    assert got["confusion"]["labels"] == labels and matrix.shape == (len(labels), len(labels))
    assert matrix.sum() == got["n"] == len(truth)
    assert [got["per_class"][lab]["support"] for lab in labels] == [truth.count(lab) for lab in labels]
    assert matrix.sum(1).tolist() == [truth.count(lab) for lab in labels]  # rows: the true label
    # percentages of whole counts: exact to float64's rounding of one division (and a mean of a handful)
    assert 100 * np.trace(matrix) / matrix.sum() == pytest.approx(got["metrics"]["accuracy"], rel=1e-12)
    f1s = [c["f1"] for c in got["per_class"].values() if c["f1"] is not None]
    assert np.mean(f1s) == pytest.approx(got["metrics"]["macro_f1"], rel=1e-12)
    bins = [b for b in got["calibration"]["bins"] if b["n"]]  # the predictions, by the probability given them
    assert sum(b["n"] for b in bins) == got["n"]
    assert sum(b["n"] * b["accuracy"] for b in bins) / got["n"] == pytest.approx(got["metrics"]["accuracy"], rel=1e-9)
    assert all(100 * b["from"] <= b["confidence"] <= 100 * b["to"] + 1e-4 for b in bins)  # float32 probabilities
    result = json.loads((out / "result.json").read_text())  # training wrote the same for its test split
    assert result["per_class"] == got["per_class"] and result["confusion"] == got["confusion"]
    assert result["calibration"] == got["calibration"]
    every = got["calibration"]["selective"][0]  # all 40 answered: the accuracy, and the lowest probability given
    assert (every["coverage"], every["n"], every["accuracy"]) == (100, 40, got["metrics"]["accuracy"])
    assert bins[0]["from"] <= every["threshold"] <= bins[0]["confidence"] / 100 + 1e-6  # in the lowest bin
    assert result["intervals"] == got["intervals"]  # and each figure's interval, from the same predictions
    low, high = got["intervals"]["accuracy"]
    assert low < got["metrics"]["accuracy"] < high and got["intervals"]["n"] == 40
    assert got["intervals"]["macro_f1"] is None  # 40 examples: too few for a bootstrap


def test_eval_writes_the_misclassified_examples(trained, trec_slice, capsys, tmp_path):
    out, _, cache = trained
    errors = tmp_path / "new" / "errors.jsonl"  # its folder is made
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--cache-dir", cache,
                            "--errors", errors)
    assert code == 0, err
    got, rows = json.loads(stdout), [json.loads(line) for line in errors.read_text().splitlines()]
    wrong = got["n"] - round(got["n"] * got["metrics"]["accuracy"] / 100)
    assert len(rows) == wrong == got["errors"]["count"] and f"{wrong} misclassified examples of 40 written" in err
    matrix = np.array(got["confusion"]["matrix"])
    assert len(rows) == matrix.sum() - np.trace(matrix)
    lines = (trec_slice / "test.jsonl").read_text().splitlines()
    for r in rows:  # each names its line of the file, as it is there, and a prediction that is not its label
        assert {"text": r["text"], "label": r["label"]} == json.loads(lines[r["line"] - 1])
        assert r["predicted"] != r["label"] and max(r["scores"], key=r["scores"].get) == r["predicted"]
        assert sum(r["scores"].values()) == pytest.approx(1.0, abs=1e-5)  # float32 softmax over 6 labels
    assert [r["line"] for r in rows] == sorted(r["line"] for r in rows)
    # a file frozentune reads, a folder: refused before any work, nothing written
    before = (trec_slice / "test.jsonl").read_bytes()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for target, said in ((trec_slice / "test.jsonl", "a file of the data being scored"),
                         (out / "errors.jsonl", "inside the model's folder"), (tmp_path, "is a folder"),
                         # the model's folder itself: said so, not "give a file name, e.g. MODEL/errors.jsonl"
                         (out, "--errors " + str(out) + ": the model's folder"),
                         ("-", "standard output carries eval's JSON"),  # (it wrote a file named -)
                         (tmp_path / "loop", "cannot be written")):  # a symlink loop: one line, not a traceback
        code, _, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--errors", target)
        assert code == 2 and said in err and "Traceback" not in err
    assert (trec_slice / "test.jsonl").read_bytes() == before and not (out / "errors.jsonl").exists()
    assert not Path("-").exists()
    # texts holding a line separator (U+2028) and U+0085: each record is still one line for every reader
    odd = tmp_path / "odd.jsonl"
    odd.write_text("".join(json.dumps({**json.loads(line), "text": json.loads(line)["text"] + " \u2028 next \x85"})
                           + "\n" for line in lines))
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", odd, "--split", "all", "--cache-dir", cache,
                            "--errors", tmp_path / "odd-errors.jsonl")
    written = (tmp_path / "odd-errors.jsonl").read_text(encoding="utf-8")
    assert code == 0 and json.loads(stdout)["errors"]["count"] == written.count("\n") == len(written.splitlines()) > 0


def test_calibration_bins_the_predictions_by_their_probability():
    from frozentune.train import calibration

    probs = np.array([[0.95, 0.05], [0.9, 0.1], [0.35, 0.65], [0.3, 0.7], [0.5, 0.5]])
    y = np.array([0, 1, 1, 0, 0])  # right, wrong, right, wrong, right (a tie is the first label, as argmax)
    c = calibration(y, probs.argmax(1), probs)
    by = {round(b["from"], 1): b for b in c["bins"] if b["n"]}
    assert sorted(by) == [0.5, 0.6, 0.7, 0.9] and sum(b["n"] for b in c["bins"]) == 5 and len(c["bins"]) == 10
    assert by[0.9] == {"from": 0.9, "to": 1.0, "n": 2, "confidence": pytest.approx(92.5), "accuracy": 50.0}
    assert (by[0.6]["accuracy"], by[0.7]["accuracy"], by[0.5]["accuracy"]) == (100.0, 0.0, 100.0)
    # (2 × |50 − 92.5| + |100 − 65| + |0 − 70| + |100 − 50|) / 5
    assert c["ece"] == pytest.approx((2 * 42.5 + 35 + 70 + 50) / 5)
    assert calibration(np.array([0, 1]), np.array([0, 1]), np.array([[1.0, 0.0], [0.0, 1.0]]))["ece"] == 0.0
    # the probability of the prediction scored, not of the likeliest class where the two differ (a tie in float32)
    tied = calibration(np.array([1]), np.array([1]), np.array([[0.5, 0.5]]))
    assert tied["ece"] == 50.0 and tied["bins"][5]["accuracy"] == 100.0
    # answering only the surest: 80% of 5 is 4 (0.95, 0.9, 0.7, 0.65; right, wrong, wrong, right), 50% is 3
    assert c["selective"][2] == {"coverage": 80, "n": 4, "accuracy": 50.0, "threshold": 0.65}
    assert c["selective"][3] == {"coverage": 50, "n": 3, "accuracy": pytest.approx(100 / 3), "threshold": 0.7}
    assert c["selective"][0]["accuracy"] == 60.0 and calibration(np.array([]), np.array([]),
                                                                  np.zeros((0, 2)))["selective"] == []


def test_selective_accuracy_against_counting_by_hand():
    """For random probabilities (ties among them), each coverage's rows are the ceil(c·N/100) highest, earlier row
    first among equals, counted here one by one."""
    from frozentune.train import COVERAGES, selective

    rng = np.random.default_rng(0)
    for n in (1, 7, 100, 333):
        conf = rng.choice([0.3, 0.5, 0.55, 0.8, 0.9, 0.99], size=n)
        right = rng.random(n) < conf
        got = selective(conf, right)
        ranked = sorted(range(n), key=lambda i: (-conf[i], i))
        for row, c in zip(got, COVERAGES):
            k = -(-c * n // 100)
            assert row["n"] == k and row["threshold"] == min(conf[i] for i in ranked[:k])
            assert row["accuracy"] == pytest.approx(100 * sum(right[i] for i in ranked[:k]) / k, rel=1e-12)
        assert [r["threshold"] for r in got] == sorted(r["threshold"] for r in got)  # surer as fewer are answered


def test_accuracy_interval_is_wilsons():
    """Against scipy's own Wilson interval (binomtest.proportion_ci), at the edges too."""
    from scipy.stats import binomtest

    from frozentune.train import intervals, wilson

    for right, n in ((81, 100), (0, 7), (7, 7), (433, 500), (1, 2)):
        ci = binomtest(right, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson(right, n) == pytest.approx([100 * ci.low, 100 * ci.high], abs=1e-9)  # float64, closed form
    got = intervals(np.array([0, 1, 2]), np.array([0, 1, 2]), 3)  # every example right: still an interval
    assert got["accuracy"][1] == 100.0 and got["accuracy"][0] < 50 and got["macro_f1"] is None


def test_f1_interval_resamples_the_examples_and_covers():
    """The bootstrap over the confusion cells draws what a bootstrap over the examples draws; seeded; and over many
    test samples drawn from one known classifier, the intervals hold its true figures about 95% of the time."""
    from frozentune.train import _f1s, intervals, metrics

    rng = np.random.default_rng(7)
    truth = np.array([[0.30, 0.04, 0.01], [0.05, 0.25, 0.05], [0.02, 0.03, 0.25]])  # P(true, predicted)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        cells = rng.choice(9, size=n, p=truth.ravel())
        return cells // 3, cells % 3

    y, p = sample(400)
    fast = intervals(y, p, 3, (1, "b"), resamples=20000)
    draws = rng.integers(0, 400, size=(20000, 400))  # the examples themselves, resampled
    counts = np.zeros((20000, 9))
    np.add.at(counts, (np.arange(20000)[:, None], (3 * y + p)[draws]), 1)
    f1 = _f1s(counts.reshape(-1, 3, 3))
    for d, row in zip(draws[:30], f1):  # the per-class F1s are scikit-learn's, as `metrics` gives them
        m = metrics(y[d], p[d], 3, (1, "b"))
        assert (100 * np.nanmean(row), 100 * row[1]) == pytest.approx((m["macro_f1"], m["positive_f1"]), rel=1e-12)
    # 20,000 draws each way: the 2.5% and 97.5% points agree to the Monte Carlo error, about 0.05 points here
    assert np.percentile(100 * np.nanmean(f1, 1), [2.5, 97.5]) == pytest.approx(fast["macro_f1"], abs=0.25)
    assert np.percentile(100 * f1[:, 1], [2.5, 97.5]) == pytest.approx(fast["positive_f1"], abs=0.25)
    assert intervals(y, p, 3) == intervals(y, p, 3)  # seeded: the same predictions, the same interval
    f1 = 2 * np.diag(truth) / (truth.sum(0) + truth.sum(1))
    held = {"accuracy": 0, "macro_f1": 0}
    for _ in range(300):
        got = intervals(*sample(300), 3)
        held["accuracy"] += got["accuracy"][0] <= 100 * np.trace(truth) <= got["accuracy"][1]
        held["macro_f1"] += got["macro_f1"][0] <= 100 * f1.mean() <= got["macro_f1"][1]
    # 300 samples at 95%: a standard deviation of 1.3%; a percentile bootstrap runs a little under its level
    assert 0.90 <= held["accuracy"] / 300 <= 0.99 and 0.88 <= held["macro_f1"] / 300 <= 0.99


def test_class_report_says_none_where_nothing_divides():
    from frozentune.train import class_report, metrics

    y, pred = np.array([0, 0, 1, 1, 1]), np.array([0, 1, 1, 1, 0])  # class 2: never present, never predicted
    r = class_report(y, pred, ["a", "b", "c"])
    assert r["confusion"]["matrix"] == [[1, 1, 0], [1, 2, 0], [0, 0, 0]]
    assert r["per_class"]["a"] == {"precision": 50.0, "recall": 50.0, "f1": 50.0, "support": 2}
    assert r["per_class"]["b"]["precision"] == pytest.approx(200 / 3) and r["per_class"]["b"]["support"] == 3
    assert r["per_class"]["c"] == {"precision": None, "recall": None, "f1": None, "support": 0}
    r = class_report(np.array([0, 0]), np.array([1, 1]), ["a", "b"])  # a never predicted, b never present
    assert r["per_class"]["a"] == {"precision": None, "recall": 0.0, "f1": 0.0, "support": 2}
    assert r["per_class"]["b"] == {"precision": 0.0, "recall": None, "f1": 0.0, "support": 0}
    assert metrics(np.array([0, 0]), np.array([1, 1]), 2)["macro_f1"] == 0.0  # the mean of the two 0s


def test_eval_of_a_folder_holding_only_a_test_file(trained, trec_slice, capsys, tmp_path):
    """A folder of held-out data alone was refused ("no train file") though eval reads only its test split."""
    out, _, cache = trained
    held = tmp_path / "held"
    held.mkdir()
    (held / "test.jsonl").write_text((trec_slice / "test.jsonl").read_text())
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", held, "--cache-dir", cache)
    assert code == 0, err
    assert json.loads(stdout)["metrics"] == json.loads((out / "result.json").read_text())["metrics"]
    code, _, err = run(capsys, "eval", "--model", out, "--data", held, "--split", "train")
    assert code == 2 and "no train file (found test)" in err
    code, _, err = run(capsys, "train", "--method", "probe", "--data", held)
    assert code == 2 and "no train file (found test)" in err


def test_eval_rebuilds_a_damaged_entry_when_asked(trained, trec_slice, capsys, tmp_path):
    """The cache's error says "rerun with --rebuild-cache", and eval now takes it (it did not)."""
    import shutil

    out, _, cache = trained
    own = tmp_path / "own-cache"
    shutil.copytree(cache, own)
    for states in own.glob("*/states.bin"):
        states.write_bytes(states.read_bytes()[:-4])
    code, _, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--cache-dir", own)
    assert code == 2 and "--rebuild-cache (train, eval and cache take it)" in err
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--cache-dir", own, "--rebuild-cache")
    assert code == 0, err
    assert json.loads(stdout)["metrics"] == json.loads((out / "result.json").read_text())["metrics"]


def test_eval_of_one_file_says_it_scores_the_carved_tenth(trained, trec_slice, capsys, tmp_path):
    """A single file gives up 10% as test, as training carved it: eval says so instead of scoring a tenth
    of its rows silently."""
    out, _, cache = trained
    one = tmp_path / "held_out.jsonl"
    one.write_text((trec_slice / "test.jsonl").read_text())
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", one, "--cache-dir", cache)
    assert code == 0, err
    n = json.loads(stdout)["n"]
    assert 0 < n < 40  # about a tenth, stratified per class
    assert "data: no test split: carved 10%" in err and f"eval: the test split, {n} examples" in err
    # --split all: the file scored whole, as predict would label every row of it
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", one, "--cache-dir", cache, "--split", "all")
    assert code == 0, err
    whole = json.loads(stdout)
    assert whole["n"] == 40 and "every row of" in err and whole["split"] == "all"
    from frozentune import api
    labels = [json.loads(line)["label"] for line in one.read_text().splitlines()]
    predicted = [r["label"] for r in api.predict(out, [json.loads(line)["text"] for line in one.read_text().splitlines()])]
    accuracy = 100 * sum(a == b for a, b in zip(labels, predicted)) / len(labels)
    assert whole["metrics"]["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    code, _, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--split", "all")
    assert code == 2 and "--split all scores every row of one file" in err


def test_eval_of_a_small_file_scores_its_test_part_without_a_validation_carve(trained, trec_slice, capsys, tmp_path):
    """Three rows: one is carved as test, and the two left could not also give up a validation split with
    every class on both sides. That carve is training's business; eval stopped on it with advice about
    validation and never scored the test row. Now the test row is scored, the lines say nothing of what
    training draws from train, and a file too small even for the test carve is pointed to --split all."""
    out, _, cache = trained
    rows = [json.loads(line) for line in (trec_slice / "test.jsonl").read_text().splitlines()]
    first = {}
    for r in rows:
        first.setdefault(r["label"], r)
    a, b = list(first.values())[:2]
    small = tmp_path / "three.jsonl"
    small.write_text("".join(json.dumps(r) + "\n" for r in (a, b, {**a, "text": a["text"] + " again"})))
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", small, "--cache-dir", cache)
    assert code == 0, err
    assert json.loads(stdout)["n"] == 1 and "eval: the test split, 1 example (" in err
    assert "--split all scores every row of the file" in err and "validation" not in err
    tiny = tmp_path / "two.jsonl"
    tiny.write_text("".join(json.dumps(r) + "\n" for r in (a, b)))
    code, _, err = run(capsys, "eval", "--model", out, "--data", tiny, "--cache-dir", cache)
    assert code == 2 and err.rstrip().endswith(f"to score every row of {tiny} instead, give --split all")
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--cache-dir", cache)
    assert code == 0 and "train limited" not in err and "no validation split" not in err
    # a file of one class (all the positive reviews) is scored: "a classifier needs at least two classes" is
    # training's rule; and a folder's test file is scored whatever its train file holds (one class, a bad line)
    one_class = tmp_path / "one_class.jsonl"
    one_class.write_text("".join(json.dumps({**a, "text": f"{a['text']} {i}"}) + "\n" for i in range(4)))
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", one_class, "--cache-dir", cache)
    assert code == 0 and json.loads(stdout)["n"] == 1, err
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.jsonl").write_text(one_class.read_text() + "{not json\n")
    (folder / "test.jsonl").write_text(small.read_text())
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", folder, "--cache-dir", cache)
    assert code == 0 and json.loads(stdout)["n"] == 3, err


def test_predict_agrees_with_eval(trained, trec_slice, capsys, tmp_path):
    out, _, cache = trained
    from frozentune import api
    from frozentune.data import load_classification
    from frozentune.model import load
    from frozentune.train import predict_logits

    test = load_classification(str(trec_slice)).test
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("\n".join(test.texts) + "\n")
    code, stdout, err = run(capsys, "predict", "--model", out, "--input", texts_file)
    assert code == 0, err
    rows = [json.loads(line) for line in stdout.splitlines()]
    assert [r["text"] for r in rows] == test.texts
    model = load(out)
    cached = api.SourceFactory(model.backbone_ref, False, cache, False, False)(test)
    logits = predict_logits(model, cached)                               # (N, C)
    # Live states are rounded to float16 as the cache's were, but the float32 states before that
    # rounding come from other batches (other kernel blocking), so an element may land one float16
    # step away: each logit can move by up to tol(float16)·Σ_j |w_cj|·|h_j| (the probe reads h = [CLS]).
    # A label must agree wherever the cached margin between the top two logits exceeds twice that.
    h = cached.batch(np.arange(len(test))).hidden[:, 0]                # (N, D)
    moved = tol(torch.float16, ROUNDING) * sum_of_abs(h, model.head.out.weight.T).max(1).values.numpy()  # (N,)
    # The scores then agree within 2·moved (a softmax moves by at most the largest change of its inputs,
    # twice: the class's own logit and the normaliser) plus the softmax's own rounding.
    probs = torch.softmax(torch.from_numpy(logits).double(), -1).numpy()
    scores = np.array([[r["scores"][lab] for lab in model.labels] for r in rows])
    bound = 2 * moved[:, None] + tol(torch.float32, softmax(len(model.labels)))  # (N, 1)
    diff = np.abs(scores - probs)
    assert (diff <= bound).all(), f"predict's scores vs eval's: max |diff| {diff.max():.3g}, bound {bound.min():.3g}"
    top2 = np.sort(logits, 1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) > 2 * moved  # the tiny probe's margins are mostly smaller than this
    got = np.array([r["label"] for r in rows])
    assert (got[sure] == np.array(model.labels)[logits.argmax(1)][sure]).all()
    code, stdout, _ = run(capsys, "predict", "--model", out, "How far is Paris ?")
    assert code == 0 and json.loads(stdout)["label"] in model.labels


class _Stdin(io.TextIOWrapper):
    """Standard input piped from bytes (not a terminal)."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data), encoding="utf-8")


def test_predict_reads_texts_from_standard_input_with_input_dash(trained, capsys, tmp_path, monkeypatch):
    out = trained[0]
    texts = ["How far is Paris ?", "Who wrote Hamlet ?", "What is a dog ?"]
    (tmp_path / "t.txt").write_text("\n".join(texts) + "\n")
    code, from_file, err = run(capsys, "predict", "--model", out, "--input", tmp_path / "t.txt")
    assert code == 0, err
    # a byte-order mark, CRLF line ends and trailing blank lines, as a Windows pipe may send them
    monkeypatch.setattr(sys, "stdin", _Stdin(("\ufeff" + "\r\n".join(texts) + "\r\n\r\n").encode()))
    code, from_stdin, err = run(capsys, "predict", "--model", out, "--input", "-")
    assert code == 0, err
    assert from_stdin == from_file and [json.loads(r)["text"] for r in from_stdin.splitlines()] == texts


def test_output_lines_are_one_per_input_for_every_line_reader(trained, capsys, tmp_path):
    """JSON leaves U+0085, U+2028 and U+2029 raw, and str.splitlines, editors and terminals break lines at them:
    predict's output had more lines than inputs. They are escaped in JSON Lines and in the text forms."""
    from frozentune.cli import _escape_line_breaks

    texts = ["c\x85d awful", "g\u2028h awful", "i\u2029j great", "tab\there and\x0cform feed"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    code, out, err = run(capsys, "predict", "--model", trained[0], "--input", tmp_path / "in.jsonl")
    assert code == 0, err
    assert [json.loads(line)["text"] for line in out.splitlines()] == texts  # one line each, texts as given
    assert "\\u2028" in out and "\u2028" not in out and "\x85" not in out
    for t in texts:
        assert len(_escape_line_breaks(t, tabs=True).splitlines()) == 1 and "\t" not in _escape_line_breaks(t, tabs=True)


def test_an_output_that_is_not_utf8_gets_escapes_not_a_traceback(trained):
    """PYTHONIOENCODING=ascii (a Windows console, the C locale without Python's UTF-8 switch): `--help` died at
    its first "×", predict at the first non-ASCII text (the rows after it lost), train at its "→" note."""
    from clirun import finish, start

    env = {"PYTHONIOENCODING": "ascii"}
    text = "café — \U0001f600"
    answer = finish(start("predict", "--model", trained[0], text, env=env), ["predict"], code=0)
    assert json.loads(answer.out)["text"] == text and answer.out.isascii()
    answer = finish(start("--help", env=env), ["--help"], code=0)
    assert "Traceback" not in answer.err and "train" in answer.out


def test_a_pipe_given_by_path_is_read_like_a_file(tmp_path):
    """`--input <(cmd)` and `--input /dev/stdin` are pipes, not regular files: they were refused as "no such
    file". A dataset path that is a pipe is refused saying why (datasets are read more than once)."""
    import os
    import threading

    from frozentune.data import DataError, read_lines, resolve

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("one\ntwo\n"), daemon=True)
    writer.start()
    assert read_lines(fifo) == ["one", "two"]
    writer.join(5)
    with pytest.raises(DataError, match="not a regular file .*save it to a file first"):
        resolve(str(fifo))
    with pytest.raises(DataError, match="-: datasets are not read from standard input"):
        resolve("-")


@pytest.mark.parametrize("data, message", [
    (b"a\n\nb\n", "<standard input>:2: a blank line with texts after it"),
    (b"\xff\xfeab\n", "<standard input>: not UTF-8 text (byte 0xff at byte offset 0)"),
    (b"", "<standard input>: the file is empty"),
])
def test_bad_standard_input_is_refused_in_one_line(data, message, monkeypatch):
    from frozentune.data import DataError, read_lines

    monkeypatch.setattr(sys, "stdin", _Stdin(data))
    with pytest.raises(DataError, match=re.escape(message)):
        read_lines(Path("-"))


def test_input_dash_refuses_a_terminal(monkeypatch):
    from frozentune.data import DataError, read_lines

    class Terminal(_Stdin):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(b""))
    with pytest.raises(DataError, match="standard input is a terminal, not a pipe or file; pipe the texts in"):
        read_lines(Path("-"))


def test_cache_and_list_commands(tiny_bert, trec_slice, tmp_path, capsys):
    code, stdout, err = run(capsys, "cache", trec_slice, "--backbone", tiny_bert, "--cache-dir", tmp_path, "--quiet")
    assert code == 0, err
    assert "train: 120 examples" in stdout and "test: 40 examples" in stdout
    code, stdout, _ = run(capsys, "cache", trec_slice, "--backbone", tiny_bert, "--cache-dir", tmp_path, "--quiet")
    assert "(cached)" in stdout
    # texts without labels (a file to predict on) are cached too: the states need none ("missing field 'label'")
    texts = [json.loads(line)["text"] for line in (trec_slice / "test.jsonl").read_text().splitlines()]
    (tmp_path / "unlabelled.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    code, stdout, err = run(capsys, "cache", tmp_path / "unlabelled.jsonl", "--backbone", tiny_bert, "--cache-dir",
                            tmp_path, "--quiet")
    assert code == 0 and "(cached)" in stdout, err  # the same texts as the labelled test file: its entry
    code, stdout, _ = run(capsys, "list")
    assert code == 0 and "probe" in stdout and "finetune" in stdout and "--pooling" in stdout
    assert "--[no-]train-backbone" in stdout  # a flag's two forms (rich would read "[no-]" as markup)


@pytest.mark.parametrize("columns", ["40", "60", "71", "72", "120"])
def test_list_never_cuts_a_flag_or_default(monkeypatch, capsys, columns):
    """On a narrow terminal the table cut flags and defaults to "…" (at 40 columns "--[no-…", "--pool…"):
    below cli.NARROW columns the options come one by one, every flag and default whole."""
    from frozentune.cli import _flag
    from frozentune.registry import describe_options

    monkeypatch.setenv("COLUMNS", columns)
    code, stdout, _ = run(capsys, "list")
    assert code == 0 and "…" not in stdout
    for name in list_methods():
        for opt, typ, default, _help in describe_options(name):
            assert _flag(opt)[2:] in stdout and str(default) in stdout


@pytest.mark.parametrize("argv,needle", [
    (["train", "--method", "nope", "--data", "trec"], "unknown method 'nope'"),
    (["train", "--method", "probe", "--data", "nosuch"], "unknown dataset 'nosuch'"),
    (["train", "--method", "probe", "--data", "trec", "--bogus", "1"], "unknown option(s) --bogus"),
    (["train", "--method", "probe", "--data", "trec", "--backbone", "/no/such/folder"], "folder /no/such/folder does not exist"),
    (["eval", "--model", "/no/such/model", "--data", "trec"], "/no/such/model: no such folder"),
    (["predict", "--model", "/no/such/model"], "nothing to predict"),
    (["eval", "--model", __file__, "--data", "trec"], "a file, not a model folder"),
    (["cache", "trec", "--max-train", "10"], "frozentune cache: error: unrecognized arguments: --max-train 10 "
                                             "(see frozentune cache --help)"),
    (["train", "--method", "probe", "--data", "trec", "--layer-combine", "concat"],  # one layer: it was ignored
     "--layer-combine concat: it combines several layers, and the layer read is one (-1)"),
    # a method's options that its other settings leave unused were saved and ignored
    (["train", "--method", "ytuning", "--data", "trec", "--alpha", "5"], "ytuning: --alpha is the margin loss's α: "
                                                                         "with --loss ce it is not used"),
    (["train", "--method", "finetune", "--data", "trec", "--no-train-backbone", "--top-layers", "1"],
     "finetune: --top-layers chooses which of the backbone's layers train: with --no-train-backbone none does"),
    (["train", "--method", "contrastive", "--data", "trec", "--dropout", "0.2"],  # reached only the stand-in layer
     "contrastive: --dropout does not reach the saved model: its linear layer is a logistic regression"),
    (["train", "--method", "conv", "--data", "trec", "--arch", "transformer", "--kernel-size", "3", "--weight-dropout",
      "0.5"], "conv: --kernel-size, --weight-dropout do not apply to --arch transformer"),
    (["train", "--method", "conv", "--data", "trec", "--arch", "light", "--dilation-cycle", "2"],
     "conv: --dilation-cycle does not apply to --arch light"),
    # (an --output any user can write to: as a user, /nonexistent/o was refused first, for its parent /)
    (["pretrain", "--arch", "dilated", "--weight-dropout", "0.2", "--corpus", "imdb", "--output", "TMP/o",
      "--steps", "1"], "pretrain: --weight-dropout does not apply to --arch dilated"),
    (["train", "--method", "probe", "--data", "trec", "--overwrite"], "--overwrite replaces what --output holds"),
    (["sweep", "--data", "trec", "--overwrite"], "--overwrite replaces what --output holds"),
    (["train", "--method", "ytuning", "--data", "trec", "--pool", "max"], "ytuning: --pool pools a label's k vectors: "
                                                                          "with --k 1 there is one to pool"),
    (["train", "--method", "conv", "--data", "trec", "--arch", "dilated", "--heads", "3"],
     "conv: --heads does not apply to --arch dilated"),  # it was refused as "heads 3 must divide dim 256"
    (["generate", "--model", "m", "--source-field", "mr", "name[Aromi]"],  # was ignored
     "--source-field picks the field of an --input file of records"),
])
def test_bad_input_messages(capsys, tmp_path, argv, needle):
    code, _, err = run(capsys, *(str(tmp_path / x[4:]) if x.startswith("TMP/") else x for x in argv))
    assert code == 2
    assert needle in err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("argv,field,value", [
    (["sweep", "--data", "trec", "--layers", "-1,-3"], "layers", "-1,-3"),
    (["sweep", "--data", "trec", "--lr", "1e-3,1e-2", "--layers", "-2"], "layers", "-2"),
    (["train", "--method", "probe", "--data", "trec", "--layer", "-1,-3"], "layer", "-1,-3"),
    (["cache", "trec", "--layer", "-3,-1"], "layer", "-3,-1"),
    (["train", "--method", "probe", "--data", "trec", "--layer", "-1"], "layer", "-1"),
    (["predict", "--model", "m", "-1,-2.5"], "texts", ["-1,-2.5"]),
    (["sweep", "--data", "trec", "--lr", "-1e-3,1E+2"], "lr", "-1e-3,1E+2"),  # exponents: refused later, saying why
])
def test_comma_lists_of_negative_numbers_are_values(argv, field, value):
    # The README's sweep command (`--layers -1,-3`) was refused by argparse as an unknown option.
    from frozentune.cli import _parser

    a, rest = _parser().parse_known_args(argv)
    assert getattr(a, field) == value and rest == []


def test_a_value_read_as_an_option_says_how_to_pass_it(capsys):
    with pytest.raises(SystemExit) as stop:  # argparse's own exit
        main(["train", "--method", "probe", "--data", "trec", "--text-field", "-x"])
    assert stop.value.code == 2 and "join it with '=', e.g. --text-field=-VALUE" in capsys.readouterr().err
    code, _, err = run(capsys, "sweep", "--data", "trec", "--lr", "-1e-3")
    assert code == 2 and "--lr '-1e-3': give a comma list of non-negative numbers" in err


def test_readme_sweep_layers_run_end_to_end(capsys, tiny_bert, trec_slice, tmp_path):
    code, _, err = run(capsys, "sweep", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 16,
                       "--methods", "probe", "--layers", "-1,-2", "--shots", 2, "--seeds", 0,
                       "--output", tmp_path / "sw", "--cache-dir", tmp_path / "c")
    assert code == 0, err
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]
    assert sorted({str(r["layer"]) for r in rows}) == ["-1", "-2"]


@pytest.mark.parametrize("argv,needle", [
    (["explain", "--model", "m", "--top", "0", "x"], "--top: 0: give a whole number of at least 1"),
    (["explain", "--model", "m", "--top", "-1", "x"], "--top: -1: give a whole number of at least 1"),
    (["train", "--method", "probe", "--data", "trec", "--max-train", "2.5"], "'2.5' is not a whole number"),
    (["generate", "--model", "m", "--num-beams", "0", "x"], "--num-beams: 0: give a whole number of at least 1"),
])
def test_counts_under_one_are_refused_in_one_line(capsys, argv, needle):
    """--top -1 ended in a traceback (topk of a negative count) and --top 0 printed empty lists;
    every count option takes whole numbers of at least 1."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,needle", [
    (["predict", "--model", "m", "fine", " "], "text argument 2 is empty"),
    (["explain", "--model", "m", "--pair", "a", ""], "--pair 1's argument 2 is empty"),
    # which pair: the index counted within the pair alone ("--pair text argument 2" of the third)
    (["predict", "--model", "m", "--pair", "a", "b", "--pair", "c", "d", "--pair", "e", ""], "--pair 3's argument 2 is empty"),
    (["predict", "--model", "m", "--pair", "a", "b", "extra text"], "text argument 'extra text' beside --pair: a model "
                                                                    "takes single texts or sentence pairs, not both"),
    (["predict", "--model", "m", "caf\udce9"], "text argument 1: character offset 3 is a lone UTF-16 surrogate (U+DCE9; "
                                                "the byte 0xe9, which is not UTF-8"),
    (["generate", "--model", "m", ""], "source argument 1 is empty"),
    # zero-width characters alone tokenize to nothing, as an empty text does
    (["predict", "--model", "m", "\u200b\u200d "], "text argument 1 is empty (only invisible characters: U+200B ZERO WIDTH SPACE)"),
])
def test_texts_given_as_arguments_follow_the_rules_of_files(capsys, argv, needle):
    """An empty text argument was labelled (the server and files refuse it), and a Latin-1 byte from the
    shell (a lone surrogate in Python) ended in the tokenizer's TypeError; both are one-line errors,
    before any model is loaded (the folder `m` does not exist)."""
    code, _, err = run(capsys, *argv)
    assert code == 2 and needle in err, err


def test_device_messages_say_what_to_do():
    from frozentune.extract import ExtractError, resolve_device

    with pytest.raises(ExtractError, match="empty; give auto"):  # was taken as auto without a word
        resolve_device("")
    from frozentune.extract import choose_runtime

    with pytest.raises(ExtractError, match="empty; give auto"):  # --device "" on cache / train: the same
        choose_runtime("", None)
    with pytest.raises(ExtractError, match="Use --device cpu"):
        resolve_device("mps" if not torch.backends.mps.is_available() else "cuda:99")


def test_predict_gives_its_rows_a_chunk_at_a_time(trained, monkeypatch, capsys):
    """25,000 texts were all tokenised and scored before the first row came out (2.6 GB, minutes with no
    word, nothing kept on Ctrl-C). Rows now come a chunk at a time, the same rows as in one chunk (within
    float32 rounding of a 2-layer pass: batches are padded to other lengths), with a progress line, the
    note of cut texts once at the end, and an error naming the text by its place among all of them."""
    from numerics import assert_close, dot, linear, softmax, transformer

    from frozentune import api
    from frozentune import train as T
    from frozentune.data import DataError

    out = trained[0]
    texts = [f"question number {i} about {'a very long winding subject ' * (i % 4)}?" for i in range(8)]
    whole = api.predict(out, texts, precision="fp32")
    lines: list[str] = []
    monkeypatch.setattr(T, "PROGRESS_EVERY_S", 0.0)
    chunked = list(api.predict_stream(out, texts, precision="fp32", log=lines.append, chunk=3))
    assert [r["text"] for r in chunked] == texts and [r["label"] for r in chunked] == [r["label"] for r in whole]
    assert [r.get("truncated") for r in chunked] == [r.get("truncated") for r in whole]
    labels = list(whole[0]["scores"])
    assert_close(torch.tensor([[r["scores"][k] for k in labels] for r in chunked]),
                 torch.tensor([[r["scores"][k] for k in labels] for r in whole]),
                 ops=transformer(2, 32, 64, 32, 8) + dot(32) + linear(32) + softmax(len(labels)), dtype=torch.float32)
    assert [line.split(",")[0] for line in lines if line.startswith("predict:")] == ["predict: 3 of 8 texts",
                                                                                     "predict: 6 of 8 texts"]
    with pytest.raises(DataError, match=re.escape("texts[4]: the tokenizer keeps none of its characters")):
        list(api.predict_stream(out, texts[:4] + ["\u0301\u0301"], chunk=3))
    # the CLI prints each chunk's rows when they are done
    monkeypatch.setattr(api, "PREDICT_CHUNK", 3)
    code, stdout, err = run(capsys, "predict", "--model", out, *texts)
    assert code == 0 and [json.loads(line)["label"] for line in stdout.splitlines()] == [r["label"] for r in whole]
    assert "predict: 6 of 8 texts" in err  # in chunks of 3 (a progress line between them)
    code, stdout, err = run(capsys, "predict", "--model", out, *texts[:4], "\u0301\u0301")  # a bad input in chunk 2
    assert code == 2 and "texts[4]" in err and "the rows of the first 3 inputs were printed before it" in err
    assert len(stdout.splitlines()) == 3


def test_the_python_api_answers_mistakes_in_plain_words(trained, trec_slice, tmp_path, tiny_bert):
    """The API took a bare string as one text per character, and met an empty list, None, top=-1 and
    an unknown training option with errors from deep inside torch / transformers / dataclasses."""
    from frozentune import api
    from frozentune.data import DataError
    from frozentune.registry import MethodError

    from transformers import AutoTokenizer

    out, _, cache = trained
    for texts, says in (("Who wrote Hamlet ?", "a single str"), ([], "the list is empty"), (None, "NoneType, not a list"),
                        (["fine", " "], "texts[1]: empty"), (["caf\udce9"], "texts[0]: character offset 3")):
        with pytest.raises(DataError, match=re.escape(says)):
            api.predict(out, texts)
    assert [r["text"] for r in api.predict(out, (t for t in ["a question ?", "another ?"]))] == ["a question ?", "another ?"]
    for top in (-1, 0, "3", True):
        with pytest.raises(DataError, match="give a whole number of at least 1"):
            api.explain(out, ["Who wrote Hamlet ?"], top=top)
    with pytest.raises(MethodError, match="training option\\(s\\) epoch unknown; the options are: .*epochs"):
        api.train("probe", str(trec_slice), train_cfg={"epoch": 1})
    with pytest.raises(MethodError, match="lr"):
        api.train("probe", str(trec_slice), train_cfg={"lr": "abc"})
    # a dict was labelled by its keys, a set in no order; values of the wrong type failed deep in training,
    # and fallback="on" (any word but auto) was taken as off
    for texts, says in (({"text": "Who ?"}, "a dict, not a list"), ({"Who ?"}, "a set, not a list")):
        with pytest.raises(DataError, match=says):
            api.predict(out, texts)
    for cfg, says in (({"steps": 2.5}, "--steps 2.5: a whole number"), ({"batch_size": 3.5}, "--batch-size 3.5"),
                      ({"epochs": 1.5}, "--epochs 1.5"), ({"fallback": "on"}, "--fallback 'on': choose one of auto, off"),
                      ({"seed": "1"}, "--seed '1': a whole number"), ({"lr": True}, "--lr True: a number")):
        with pytest.raises(MethodError, match=re.escape(says)):
            api.train("probe", str(trec_slice), train_cfg=cfg)
    with pytest.raises(MethodError, match=re.escape("space: concept_dim='x': a whole number is expected")):
        api.train("space", str(trec_slice), options={"concept_dim": "x"})
    # arguments of the wrong kind: named, not a TypeError from pathlib or an AttributeError
    with pytest.raises(MethodError, match=re.escape("backbone: dict ({'name': 'minilm'}); give a model name or folder")):
        api.train("probe", str(trec_slice), backbone={"name": "minilm"})
    with pytest.raises(DataError, match="data: NoneType"):
        api.train("probe", None)
    with pytest.raises(DataError, match="model: int"):
        api.predict(3, ["a question ?"])
    # a text the tokenizer keeps nothing of (combining accents alone: the uncased WordPiece strips them) was
    # classified as [CLS] [SEP], and explained by them
    with pytest.raises(DataError, match=re.escape("texts[1]: the tokenizer keeps none of its characters")):
        api.predict(out, ["a question ?", "\u0301\u0301"])
    # a text cut at max_length says so, as the server's answer does (predict said nothing)
    said: list[str] = []
    exact = "word " * 30  # [CLS] + 30 + [SEP]: exactly --max-length 32, read whole (it was said to be truncated)
    assert len(AutoTokenizer.from_pretrained(str(tiny_bert))(exact)["input_ids"]) == 32
    rows = api.predict(out, ["a short one ?", "word " * 500, exact], log=said.append)
    assert "truncated" not in rows[0] and rows[1]["truncated"] is True and "truncated" not in rows[2]
    assert any("1 of 3 texts reached --max-length 32 tokens" in line for line in said)
    assert [("truncated" in r) for r in api.explain(out, [exact, exact + "word"], log=said.append,
                                                     occlusion=True)] == [False, True]
    with pytest.raises(MethodError, match=re.escape("BackboneOptions: max_length='32'")):
        api.BackboneOptions(max_length="32")
    with pytest.raises(DataError, match=re.escape("--shots '3': give a whole number")):
        api.train("probe", str(trec_slice), shots="3")


def test_a_closed_pipe_ends_quietly(capsys, monkeypatch):
    """`frozentune ... | head`: when the reader goes away, the command stops with SIGPIPE's status and
    no traceback (a BrokenPipeError from printing)."""
    import signal

    from frozentune import cli

    def closed(a):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(cli, "cmd_list", lambda: closed(None))
    monkeypatch.setattr(cli, "_stdout_to_devnull", lambda: None)  # the test's own stdout stays
    code, _, err = run(capsys, "list")
    assert code == 128 + signal.SIGPIPE and err == ""


def test_list_into_a_closed_pipe_ends_as_every_command_does():
    """`frozentune list | head -1` exited 1 (rich's own SystemExit for a broken pipe), which a script cannot tell
    from a failure; every other command exits 141."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "frozentune.cli", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=0)
    proc.stdout.close()  # the reader goes away (as head does once it has its line): every write meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGPIPE and b"Traceback" not in err


def test_train_help_for_a_method_lists_its_options_and_defaults(capsys):
    """Errors say 'see frozentune train --method space --help', which printed the generic help: no
    --concept-dim, and the generic training defaults instead of the method's."""
    from frozentune.registry import get_method

    with pytest.raises(SystemExit) as stop:
        main(["train", "--method", "space", "--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and "space options:" in out and "--concept-dim" in out and "--no-masked-mean" in out
    lr = get_method("space").train_defaults["lr"]
    assert "(the defaults of space)" in out and f"peak learning rate (AdamW) (default: {lr})" in out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    generic = capsys.readouterr().out
    assert "--concept-dim" not in generic and "train --method METHOD --help" in generic


def test_train_backbone_on_a_frozen_head_takes_finetunes_schedule(tiny_bert, trec_slice, tmp_path):
    """`--method probe --train-backbone` trained the whole backbone at the probe's lr 0.01 (an 8-shot
    MiniLM run collapsed to one class); it now takes finetune's defaults and says so, and an --lr given
    still wins."""
    from frozentune import api
    from frozentune.registry import get_method

    lines = []
    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    r = api.train("probe", str(trec_slice), bb, options={"train_backbone": True}, train_cfg={"epochs": 1},
                  cache_root=tmp_path / "c", progress=False, log=lines.append)
    assert r["config"]["train"]["lr"] == get_method("finetune").train_defaults["lr"]
    assert any("the training defaults are finetune's" in line for line in lines)
    r = api.train("probe", str(trec_slice), bb, options={"train_backbone": True}, train_cfg={"epochs": 1, "lr": 1e-4},
                  cache_root=tmp_path / "c", progress=False, log=lambda s: None)
    assert r["config"]["train"]["lr"] == 1e-4


def test_train_refuses_to_train_a_loaded_backbone_in_place(tiny_bert, trec_slice):
    """A loaded Backbone passed to api.train with a method that trains it would be changed in place,
    so that the next run reusing it starts trained: refused before any work, the weights untouched."""
    from frozentune import api
    from frozentune.registry import MethodError

    bb = api.BackboneOptions(str(tiny_bert), max_length=16).load()
    before = {k: v.clone() for k, v in bb.model.state_dict().items()}
    for method, options in (("finetune", None), ("contrastive", None), ("probe", {"train_backbone": True})):
        with pytest.raises(MethodError, match="would change the loaded Backbone .* pass BackboneOptions"):
            api.train(method, str(trec_slice), bb, options=options, progress=False, log=lambda s: None)
    assert all(torch.equal(before[k], v) for k, v in bb.model.state_dict().items())


def test_console_script_runs():
    exe = __import__("shutil").which("frozentune") or str(__import__("pathlib").Path(sys.executable).parent / "frozentune")
    proc = subprocess.run([exe, "list"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "probe" in proc.stdout


def test_explain_ytuning_and_refuse_probe(tiny_bert, trec_slice, tmp_path, capsys, trained):
    out = tmp_path / "yt"
    code, _, err = run(capsys, "train", "--method", "ytuning", "--data", trec_slice, "--backbone", tiny_bert,
                       "--max-length", 32, "--epochs", 1, "--output", out, "--cache-dir", tmp_path / "cache",
                       "--heads", 2, "--quiet")
    assert code == 0, err
    code, stdout, err = run(capsys, "explain", "--model", out, "Who invented the telephone ?", "--top", 2)
    assert code == 0, err
    assert "predicted:" in stdout and "who" in stdout.lower()
    config = __import__("json").loads((out / "config.json").read_text())
    assert all(f"{lab}:" in stdout for lab in config["labels"])
    assert "asked for" not in stdout  # five words and a mark: two to show, no note
    code, stdout, err = run(capsys, "explain", "--model", out, "Who invented ?", "--top", 5)
    assert code == 0, err  # three words: each label lists three, and the run says why not five
    assert "(3 of the 5 asked for: the text has no more words)" in stdout
    code, stdout, err = run(capsys, "explain", "--model", out, "Who invented the telephone ?", "--json")
    assert code == 0, err
    rows = __import__("json").loads(stdout)
    assert set(rows[0]["explanation"]["attention"]) == set(config["labels"])
    code, stdout, err = run(capsys, "explain", "--model", out, "Who invented ?", "--top", 5, "--json")
    assert "(3 of the 5 asked for: the text has no more words)" in __import__("json").loads(stdout)[0]["lines"]
    # the prediction explained comes with its probabilities, the ones predict gives (a near-tie shows)
    text = "Who invented\nthe telephone ?"
    code, stdout, err = run(capsys, "explain", "--model", out, text, "--json")
    explained = __import__("json").loads(stdout)[0]
    code, stdout, err = run(capsys, "predict", "--model", out, text)
    predicted = __import__("json").loads(stdout)
    assert explained["label"] == predicted["label"] and explained["scores"].keys() == predicted["scores"].keys()
    for lab, p in predicted["scores"].items():  # the same logits (one text, the same model call); only the
        # fp32 softmax after it may run another kernel path (a row of a (1, C) batch against a (C,) vector)
        assert explained["scores"][lab] == approx(p, ops=softmax(len(predicted["scores"])), scale=1.0)
    ranked = sorted(predicted["scores"].items(), key=lambda kv: -kv[1])
    code, stdout, err = run(capsys, "explain", "--model", out, text, "--top", 2)
    assert stdout.startswith("Who invented\\nthe telephone ?\n")  # one line per text: the break written as \n
    assert f"predicted: {ranked[0][0]} (probability {ranked[0][1]:.2f}; next {ranked[1][0]} {ranked[1][1]:.2f})" in stdout
    assert all(line.startswith("  ") for line in stdout.splitlines()[1:])
    code, _, err = run(capsys, "explain", "--model", trained[0], "Who ?")
    assert code == 2 and "returns no explanation" in err and "ytuning" in err


def test_peak_rss_is_the_processs_own_not_its_parents():
    """A run started by a big process (bench/run.py, a notebook) reports its own peak memory:
    getrusage carries the parent's peak across fork + exec; VmHWM does not."""
    if not Path("/proc/self/status").exists():
        pytest.skip("VmHWM is read from /proc (Linux)")
    ballast = np.ones((1200, 2 ** 17))  # about 1.2 GB resident in this process
    ballast += 1
    code = "from frozentune.api import peak_rss_mb; print(peak_rss_mb())"
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert child < 1000, f"the child reported {child:.0f} MB: its parent's peak, not its own"
    del ballast


def test_no_method_option_is_the_start_of_a_train_option():
    """A method's own options are parsed after `train`'s, which take unique prefixes (argparse's
    abbreviations): a method option that begins another train option (`--c` of `--cv-folds`) would be
    refused as ambiguous before the method could read it."""
    import argparse

    from frozentune.cli import _flag, _parser
    from frozentune.registry import describe_options

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    train = set(sub.choices["train"]._option_string_actions)
    for method in list_methods():
        for name, *_ in describe_options(method):
            flag = _flag(name)
            clash = sorted(o for o in train if o != flag and o.startswith(flag))
            assert not clash, f"{method}: {flag} begins {clash}"


@pytest.mark.parametrize("argv", [["eval", "--model", "M", "--data", "trec"], ["predict", "--model", "M", "a text"],
                                  ["sweep", "--data", "trec", "--output", "OUT"], ["serve", "M"],
                                  ["export", "--model", "M", "--format", "onnx", "--output", "OUT"]])
def test_one_process_commands_refuse_a_launcher(argv, monkeypatch, capsys, tmp_path):
    """Under torchrun (WORLD_SIZE 2) eval and predict printed every answer once per rank (two JSON
    objects: not JSON), and a sweep's ranks raced on --output (one published it without best/).
    Each refuses in one line before reading anything, and nothing is written."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert f"frozentune {argv[0]} runs in one process; under torchrun (world size 2)" in err
    assert "run it without the launcher" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_eval_names_the_lines_of_labels_the_model_lacks(trained, capsys, tmp_path):
    out, _, cache = trained
    rows = [{"text": f"What is thing number {i} ?", "label": "meh" if i in (2, 5) else "DESC"} for i in range(8)]
    data = tmp_path / "extra.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", data, "--split", "all", "--cache-dir", cache)
    assert code == 2 and stdout == ""
    assert "extra.jsonl:3: labels 'meh' are not among the model's" in err and "(2 rows hold them: lines 3, 6)" in err
    # "them" is 'meh', so the rows come before the model's labels the data lacks (they came after, reading as theirs)
    assert err.index("(2 rows hold them") < err.index("do not occur in the data")


def test_macro_f1_averages_the_classes_that_occur():
    """A test split holding one of two classes, every example right, had macro-F1 50 (the absent,
    never-predicted class counted as F1 0)."""
    from sklearn.metrics import f1_score

    from frozentune.train import metrics

    assert metrics(np.array([0, 0, 0]), np.array([0, 0, 0]), 2) == {"accuracy": 100.0, "macro_f1": 100.0}
    y, p = np.array([0, 0, 1, 2]), np.array([0, 1, 1, 1])  # class 3 of 4 in neither
    got = metrics(y, p, 4)["macro_f1"]
    assert got == pytest.approx(100 * f1_score(y, p, average="macro", zero_division=0))
    assert got == pytest.approx(100 * (1 / 1.5 * 1 + 2 * (1 / 3) / (1 / 3 + 1) + 0) / 3)


def test_options_of_the_other_task_are_refused(trained, trec_slice, tiny_bert, capsys, tmp_path):
    """--num-beams / --max-test on a classification run, and eval's generation options on a
    classification model, were accepted and ignored (the whole test split was scored)."""
    code, _, err = run(capsys, "train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert,
                       "--max-test", 5, "--num-beams", 3, "--output", tmp_path / "x")
    assert code == 2 and "--num-beams, --max-test: options of a generation run" in err
    assert not (tmp_path / "x").exists()
    out, _, cache = trained
    code, stdout, err = run(capsys, "eval", "--model", out, "--data", trec_slice, "--num-beams", 3,
                            "--source-field", "text", "--cache-dir", cache)
    assert code == 2 and stdout == "" and "--source-field, --num-beams: options for generation models" in err


def test_device_and_precision_with_a_loaded_model_are_refused(trained):
    """api.predict / explain / evaluate_model given a loaded model ran it as loaded and dropped device= and
    precision= (evaluate_model even reported bf16 after int8 was asked for); they are refused now."""
    from frozentune import api
    from frozentune import model as M
    from frozentune.registry import MethodError

    model = M.load(trained[0])
    assert api.predict(model, ["Who ?"])[0]["label"]  # without them, as before
    same = {"device": str(model.backbone_ref.device), "precision": model.backbone_ref.precision}
    assert api.predict(model, ["Who ?"], **same)[0]["label"]  # what it already has is no change
    other = "int8" if same["precision"] != "int8" else "fp32"
    for kw in ({"device": "meta"}, {"precision": other}):
        with pytest.raises(MethodError, match=f"{next(iter(kw))}=.*a loaded model runs where and as it was loaded"):
            api.predict(model, ["Who ?"], **kw)


def test_the_truncation_note_says_how_far_the_backbone_reads():
    """Every IMDB review was cut at the default 128 tokens, and the note said only that they were cut:
    where a quarter or more are, it says the backbone reads further and how to ask for it."""
    import numpy as np

    from frozentune.api import truncation_note

    class Source:
        def __init__(self, lengths):
            self.lengths = np.asarray(lengths)

        def __len__(self):
            return len(self.lengths)

    many, few = [Source([128, 128, 40]), Source([128])], [Source([128, 30, 30, 30, 30])]
    assert truncation_note(many, 128, 512) == ("3 of 4 texts reached --max-length 128 tokens (the default); longer "
                                              "ones were truncated to it; this backbone reads up to 512 tokens: "
                                              "--max-length 512 reads more of each (extraction takes longer)")
    assert truncation_note(few, 128, 512).endswith("longer ones were truncated to it")  # one in five: no advice
    at_most = truncation_note([Source([512, 512])], 512, 512)  # read as far as it goes: nothing more to ask
    assert at_most.endswith("to it") and "(the default)" not in at_most
    assert truncation_note([Source([30])], 128, 512) is None


def test_version_names_what_computes_the_numbers(capsys):
    """`frozentune --version` answered "the following arguments are required: command"."""
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("frozentune ") and f"torch {torch.__version__}" in out


def test_the_text_form_of_explain_keeps_a_label_with_a_line_break_on_its_line():
    """`predicted: hum (probability 0.34; next desc` then `ription 0.20)` on a line of its own."""
    from frozentune.cli import _odds

    assert _odds({"hum": 0.5, "desc\nription": 0.3, "x": 0.2}) == "probability 0.50; next desc\\nription 0.30"


def test_predict_and_explain_keep_the_likeliest_classes_when_asked(trained, capsys, tmp_path):
    """With many classes every row held every class's probability (a thousand classes: a thousand scores
    a row). --top-classes K keeps the K likeliest, likeliest first, the label first; the same in Python."""
    from frozentune import api

    out, _, _ = trained
    texts = ["Who wrote Hamlet ?", "How far is the moon ?", "What is a prime number ?"]
    code, stdout, err = run(capsys, "predict", "--model", out, *texts)
    assert code == 0, err
    full = [json.loads(line) for line in stdout.splitlines()]
    assert all(len(r["scores"]) == 6 for r in full)
    code, stdout, err = run(capsys, "predict", "--model", out, "--top-classes", 2, *texts)
    assert code == 0, err
    for r, f in zip(map(json.loads, stdout.splitlines()), full):
        assert list(r["scores"]) == sorted(f["scores"], key=lambda lab: -f["scores"][lab])[:2], (r, f)
        assert next(iter(r["scores"])) == r["label"] == f["label"]
        assert {lab: f["scores"][lab] for lab in r["scores"]} == r["scores"]
    code, stdout, err = run(capsys, "explain", "--model", out, "--occlusion", "--json", "--top-classes", 1, texts[0])
    assert code == 0, err
    (row,) = json.loads(stdout)
    assert list(row["scores"]) == [full[0]["label"]] and row["explanation"]["occlusion"]["words"], row
    assert [list(r["scores"]) for r in api.predict(out, texts, top_classes=3)] == \
        [sorted(f["scores"], key=lambda lab: -f["scores"][lab])[:3] for f in full]
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(api.DataError, match=r"top_classes=.*: give a whole number of at least 1"):
            api.predict(out, texts, top_classes=bad)
    with pytest.raises(SystemExit) as e:
        main(["predict", "--model", str(out), "--top-classes", "0", texts[0]])
    assert e.value.code == 2 and "--top-classes: 0: give a whole number of at least 1" in capsys.readouterr().err


def test_likeliest_cuts_each_task_of_an_answer_and_keeps_failures():
    from frozentune.api import likeliest

    row = {"text": "t", "tasks": {"a": {"label": "y", "scores": {"x": 0.2, "y": 0.5, "z": 0.3}},
                                  "b": {"error": "failed"}}}
    assert likeliest(row, 2) == {"text": "t", "tasks": {"a": {"label": "y", "scores": {"y": 0.5, "z": 0.3}},
                                                        "b": {"error": "failed"}}}
    assert likeliest(row, None) is row
    tie = {"label": "x", "scores": {"x": 0.4, "y": 0.4, "z": 0.2}}
    assert list(likeliest(tie, 2)["scores"]) == ["x", "y"]  # ties in label order: the label (np.argmax's) first


def test_likeliest_keeps_the_same_classes_of_an_explanation():
    """--top-classes K kept K probabilities beside every class's block of the explanation (space's "classes",
    ytuning's "attention" and "special_tokens"): a thousand blocks for three scores. They keep the same K, in
    the same order; parts not keyed by class (occlusion, spans) stay whole."""
    from frozentune.api import likeliest

    row = {"label": "y", "scores": {"x": 0.2, "y": 0.5, "z": 0.3},
           "explanation": {"classes": {"x": {"tokens": [1]}, "y": {"tokens": [2]}, "z": {"tokens": [3]}},
                           "special_tokens": {"x": 0.1, "y": 0.2, "z": 0.3},
                           "occlusion": {"words": [{"text": "x"}, {"text": "y"}]}, "spans": [{"x": 1}]}}
    got = likeliest(row, 2)["explanation"]
    assert got["classes"] == {"y": {"tokens": [2]}, "z": {"tokens": [3]}} and list(got["classes"]) == ["y", "z"]
    assert got["special_tokens"] == {"y": 0.2, "z": 0.3}
    assert got["occlusion"] == row["explanation"]["occlusion"] and got["spans"] == row["explanation"]["spans"]
    assert likeliest(row, 3)["explanation"]["classes"] == row["explanation"]["classes"]
    assert len(row["explanation"]["classes"]) == 3  # the row given is not changed

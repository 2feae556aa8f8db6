"""`frozentune compare`: saved classifiers scored on the same examples, each against the first."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from clirun import cli

from frozentune import api
from frozentune.compare import CompareError, compare
from frozentune.train import paired

# the row of bench/bad_input_table.py these cases are recorded under
ROW = ("compare: one model, a folder given twice, a missing folder, a text generator, models whose carved test "
       "splits are other rows")


@pytest.fixture(scope="module")
def held_out(two, trec_slice, shared_data, tmp_path_factory) -> Path:
    """150 rows of TREC's train file after trec_slice's 120 (so neither model of `two` trained on them), of the
    models' labels: a file to score whole (--split all)."""
    labels = set(json.loads((two[0] / "config.json").read_text())["labels"])
    rows = [json.loads(line) for line in (shared_data / "trec" / "train.jsonl").read_text().splitlines()[120:400]]
    path = tmp_path_factory.mktemp("held_out") / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n"
                            for r in [r for r in rows if r["label"] in labels][:150]))
    return path


@pytest.fixture(scope="module")
def two(tiny_bert, trec_slice, tmp_path_factory) -> tuple[Path, Path, Path]:
    """Two probes on the TREC slice that answer differently ([CLS] and mean pooling), and their cache."""
    root = tmp_path_factory.mktemp("compare")
    for name, pooling in (("cls", "cls"), ("mean", "mean")):
        cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 32,
            "--epochs", 3, "--pooling", pooling, "--output", root / name, "--cache-dir", root / "cache", "--quiet",
            code=0)
    return root / "cls", root / "mean", root / "cache"


def test_compare_scores_each_model_as_eval_does_and_counts_the_examples_between_them(two, held_out):
    first, other, cache = two
    rows = held_out  # 150 examples neither trained on, scored whole: enough for the F1 bootstrap's interval
    answer = cli("compare", "--model", first, "--model", other, "--data", rows, "--split", "all",
                 "--cache-dir", cache, code=0)
    got = json.loads(answer.out)
    assert got["n"] == 150 and [m["model"] for m in got["models"]] == [str(first), str(other)]
    for m in got["models"]:  # each model's figures are eval's, from the same states
        alone = json.loads(cli("eval", "--model", m["model"], "--data", rows, "--split", "all", "--cache-dir", cache,
                               code=0).out)
        assert (m["metrics"], m["intervals"], m["calibration"]) == (alone["metrics"], alone["intervals"],
                                                                    alone["calibration"])
        assert f"ECE {m['calibration']['ece']:.2f} points; its surest 80%" in answer.err
    # which examples each got right, from predict on the file's texts
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    texts = [r["text"] for r in lines]
    right = [np.array([p["label"] == r["label"] for p, r in zip(api.predict(m, texts), lines)]) for m in (first, other)]
    p = got["against_first"][0]
    assert (p["model"], p["first"]) == (str(other), str(first))
    assert (p["both_right"], p["first_only"], p["other_only"], p["both_wrong"]) == (
        int((right[0] & right[1]).sum()), int((right[0] & ~right[1]).sum()), int((~right[0] & right[1]).sum()),
        int((~right[0] & ~right[1]).sum()))
    assert p["first_only"] + p["other_only"] > 0  # the two poolings answer differently here
    accuracy = [m["metrics"]["accuracy"] for m in got["models"]]
    assert p["difference"] == pytest.approx(accuracy[1] - accuracy[0], abs=1e-9)  # two ratios of whole counts
    assert p["interval"][0] <= p["difference"] <= p["interval"][1]
    assert f"{other} − {first}: {p['difference']:+.2f} accuracy points" in answer.err and "McNemar" in answer.err
    assert "another seed moves a score too" in answer.err


def test_paired_counts_the_examples_one_alone_got_right():
    first = np.array([True] * 60 + [False] * 25 + [True] * 5 + [False] * 10)  # 100 examples
    other = np.array([True] * 60 + [True] * 25 + [False] * 5 + [False] * 10)
    p = paired(first, other)
    assert (p["both_right"], p["first_only"], p["other_only"], p["both_wrong"], p["n"]) == (60, 5, 25, 10, 100)
    assert p["difference"] == pytest.approx(20.0)
    # McNemar's exact test: 25 of the 30 that differ on the other's side, two-sided, by a fair coin
    exact = min(1.0, 2 * sum(math.comb(30, k) for k in range(0, 6)) / 2 ** 30)
    assert p["mcnemar_p"] == pytest.approx(exact, rel=1e-9)
    assert p["interval"][0] < 20.0 < p["interval"][1] and p["interval"][0] > 0  # 25 against 5: clear of zero
    # the exact conditional interval: Clopper-Pearson's for the other's share of the 30, (30/100)(2π − 1)
    from scipy.stats import beta
    lo, hi = beta.ppf(0.025, 25, 6), beta.ppf(0.975, 26, 5)  # the textbook form of Clopper-Pearson's bounds
    assert p["interval"] == pytest.approx([30 * (2 * lo - 1), 30 * (2 * hi - 1)], rel=1e-9)
    same = paired(first, first)
    assert same["mcnemar_p"] == 1.0 and same["difference"] == 0.0 and same["interval"] is None  # none differ
    assert paired(first[40:90], other[40:90])["interval"] is not None  # any size (50 here): the interval is exact


def test_the_difference_interval_and_mcnemars_test_agree():
    """The line gives an interval and McNemar's verdict: the interval leaves out 0 exactly where p < 0.05, for
    every split of up to 60 differing examples among 200 (a percentile bootstrap of the examples disagreed with
    the test in 27 of 1,580 such cases, where few examples differed: e.g. 5 against 0, p = 0.0625, interval
    +0.33 to +3.33)."""
    for d in range(1, 61):
        for c in range(d + 1):
            first = np.array([True] * (d - c) + [False] * c + [True] * (200 - d))
            other = np.array([False] * (d - c) + [True] * c + [True] * (200 - d))
            p = paired(first, other)
            assert (p["first_only"], p["other_only"]) == (d - c, c)
            clear = p["interval"][0] > 0 or p["interval"][1] < 0
            assert clear == (p["mcnemar_p"] < 0.05), (d - c, c, p)


def test_compare_refuses_what_it_cannot_compare(two, held_out, trec_slice, tiny_bert, tmp_path):
    first, other, cache = two
    data = ("--data", trec_slice, "--cache-dir", cache)
    cli("compare", "--model", first, *data, contains="give another --model", row=ROW)
    cli("compare", "--model", first, "--model", f"{first}/../{first.name}", *data, contains="given twice", row=ROW)
    cli("compare", "--model", first, "--model", tmp_path / "nowhere", *data, contains="no such folder", row=ROW)
    generator = tmp_path / "generator"
    generator.mkdir()
    (generator / "config.json").write_text(json.dumps({"task": "generation", "method": "prefix"}))
    cli("compare", "--model", first, "--model", generator, *data, contains="a text generator", row=ROW)
    # one file, carved by each model's own seed: the test splits are other rows, and comparing them would mislead
    rows = trec_slice / "train.jsonl"
    for seed in (0, 1):
        cli("train", "--method", "probe", "--data", rows, "--backbone", tiny_bert, "--max-length", 32, "--epochs", 2,
            "--seed", seed, "--output", tmp_path / f"seed{seed}", "--cache-dir", cache, "--quiet", code=0)
    cli("compare", "--model", tmp_path / "seed0", "--model", tmp_path / "seed1", "--data", rows, "--cache-dir", cache,
        contains=("is not", "a file neither was trained on"), row=ROW)
    # the examples a model was trained on are not where a test tells models apart: refused before scoring any
    cli("compare", "--model", tmp_path / "seed0", "--model", tmp_path / "seed1", "--data", rows, "--split", "all",
        "--cache-dir", cache, row=ROW, contains=(f"--model {tmp_path / 'seed0'}: --split all of {rows} is every row of "
                                                f"{rows}, the examples it was trained on among them", "--split test"))
    cli("compare", "--model", first, "--model", other, *data, "--split", "train", row=ROW,
        contains=f"--model {first}: --split train of {trec_slice} is the examples it was trained on")
    cli("compare", "--model", first, "--model", other, "--data", rows, "--split", "all", "--cache-dir", cache,
        row=ROW, contains=f"is every row of {rows}, the examples it was trained on among them")  # the dataset's
    # train file named alone: the rows its run drew train from (the slice has no validation file), by their digest
    both = cli("compare", "--model", tmp_path / "seed0", "--model", tmp_path / "seed1", "--data", held_out, "--split",
               "all", "--cache-dir", cache, code=0)  # every row of a file neither trained on: the same examples
    assert json.loads(both.out)["n"] == 150
    # a folder that holds no model is said before the first model is scored (it was said after)
    (tmp_path / "empty").mkdir()
    said = cli("compare", "--model", first, "--model", tmp_path / "empty", *data, row=ROW, contains="no config.json")
    assert "compare " not in said.err


def test_compare_from_python(two, trec_slice):
    first, other, cache = two
    lines: list[str] = []
    got = compare([first, other], str(trec_slice), cache_root=cache, progress=False, log=lines.append)
    p = got["against_first"][0]
    assert got["n"] == 40 and (p["interval"] is None) == (p["first_only"] + p["other_only"] == 0)  # exact, any size
    assert got["models"][0]["intervals"]["macro_f1"] is None  # 40 examples: no F1 bootstrap
    assert any("McNemar" in line for line in lines)
    assert compare([str(first), str(other)], str(trec_slice), cache_root=cache, log=None) == got  # silent, the same
    with pytest.raises(CompareError, match="a list of two or more"):
        compare(str(first), str(trec_slice))
    with pytest.raises(CompareError, match="1 model given"):
        compare([first], str(trec_slice))


def test_compare_errors_name_the_python_argument(two, trec_slice):
    first, _, cache = two
    with pytest.raises(CompareError) as e:
        compare([first, first], str(trec_slice), cache_root=cache)
    assert "given twice" in str(e.value) and "models=[…] for --model" in str(e.value)
    from frozentune import model as M
    loaded = M.load(first)  # one loaded model twice: against itself it differs on no example (it was compared)
    with pytest.raises(CompareError, match=r"models\[1\]: the model of models\[0\] again"):
        compare([loaded, loaded], str(trec_slice), cache_root=cache)


def test_the_verdict_names_the_split_scored():
    from frozentune.compare import difference_line

    p = paired(np.array([True] * 80 + [False] * 40), np.array([True] * 120))
    assert "unlikely to be chance in the train sample alone" in difference_line("b", "a", p, "train")
    assert "unlikely to be chance in the file's rows alone" in difference_line("b", "a", p, "all")
    same = paired(np.ones(120, bool), np.ones(120, bool))
    assert "the test sample cannot tell them apart (p ≥ 0.05)" in difference_line("b", "a", same)


def test_a_pair_model_and_a_single_text_model_compare_on_the_same_rows(mrpc_slice, tiny_bert, tmp_path):
    """One model reads MRPC's two sentences, the other the second alone: the same rows of the same file, which
    compare took for other examples (it compared what each model reads) and refused with advice that did not help."""
    data, cache = mrpc_slice / "mrpc", ("--cache-dir", tmp_path / "cache")
    for name, fields in (("pair", ()), ("single", ("--text-field", "sentence2"))):
        cli("train", "--method", "probe", "--data", data, *fields, "--backbone", tiny_bert, "--max-length", 32,
            "--epochs", 1, "--output", tmp_path / name, *cache, "--quiet", code=0)
    got = json.loads(cli("compare", "--model", tmp_path / "pair", "--model", tmp_path / "single", "--data", data,
                         *cache, code=0).out)
    assert got["n"] == 30 and [m["model"] for m in got["models"]] == [str(tmp_path / "pair"), str(tmp_path / "single")]
    # a model whose reading of the data fails is named in the error (it came after the line of the model before)
    cli("compare", "--model", tmp_path / "pair", "--model", tmp_path / "single", "--data", data, "--text-field",
        "nothing", *cache, contains=f"--model {tmp_path / 'pair'}: ")


def test_the_macro_f1_interval_averages_the_classes_of_the_whole_sample():
    """A rare class (2 of 300 examples, never right) is missing from some resamples; averaging over the classes a
    resample has made those jump (5 classes, not 6) and stretched the interval's top. Each resample now averages the
    whole sample's classes, one it lacks counting 0 (scikit-learn's zero_division)."""
    from sklearn.metrics import f1_score

    from frozentune.train import intervals

    rng = np.random.default_rng(0)
    y = np.array([0] * 2 + [1] * 98 + [2] * 100 + [3] * 100)
    pred = np.where(rng.random(300) < 0.75, y, rng.integers(1, 4, 300))
    pred[:2] = 1  # the rare class: never right
    band = intervals(y, pred, 4)["macro_f1"]
    draws = []
    for _ in range(1000):  # resampling the examples, each resample scored as metrics scores the whole sample
        i = rng.integers(0, 300, 300)
        draws.append(100 * f1_score(y[i], pred[i], labels=[0, 1, 2, 3], average="macro", zero_division=0))
    ref = np.percentile(draws, [2.5, 97.5])
    assert band == pytest.approx(ref, abs=1.5)  # two bootstraps of 1,000: their percentiles agree to about a point
    assert band[1] < 100 * f1_score(y, pred, average="macro") + 6  # the top is not the 3-class mean's (~+20)

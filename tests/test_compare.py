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
    # Bonett and Price's interval: one example added to each cell where the models differ, an adjusted Wald
    p12, p21 = 6 / 102, 26 / 102
    half = 1.959963984540054 * math.sqrt((p12 + p21 - (p21 - p12) ** 2) / 102)
    assert p["interval"] == pytest.approx([100 * (p21 - p12 - half), 100 * (p21 - p12 + half)], rel=1e-9)
    same = paired(first, first)
    assert same["mcnemar_p"] == 1.0 and same["difference"] == 0.0
    assert same["interval"][0] < 0 < same["interval"][1]  # none differ among 100: not a difference of exactly 0
    assert paired(first[40:90], other[40:90])["interval"] is not None  # any size (50 here)
    assert paired(first[:0], other[:0])["interval"] is None


def test_the_difference_interval_covers_where_one_model_is_rarely_worse():
    """The interval must hold the true difference about 95% of the time. Simulated comparisons of N = 500 examples
    where the other model alone is right on 2% and the first alone on none (one model fixes the other's errors and
    rarely breaks new ones, compare's common case): the exact interval conditional on the differing examples (exact
    with McNemar's test) covered 52% of them; Bonett and Price's covers ≥ 93%, and so it does where the models are
    close."""
    rng = np.random.default_rng(0)
    for n, p10, p01 in ((500, 0.0, 0.02), (200, 0.0, 0.05), (500, 0.02, 0.04)):
        hit = 0
        for _ in range(1000):
            _, b, c, _ = rng.multinomial(n, [0.9 - p10 - p01, p10, p01, 0.1])
            first = np.array([True] * b + [False] * c + [True] * (n - b - c))
            other = np.array([False] * b + [True] * c + [True] * (n - b - c))
            lo, hi = paired(first, other)["interval"]
            hit += lo - 1e-9 <= 100 * (p01 - p10) <= hi + 1e-9
        # 1,000 draws: a 95% interval's count is 950 ± 7 (one standard deviation); 930 is ~3 below
        assert hit >= 930, (n, p10, p01, hit)


def test_the_line_says_where_the_interval_and_the_test_part():
    """An interval and a test are two procedures: in a borderline case one leaves out 0 and the other not. The line
    said both without a word (an interval clear of 0 beside "cannot tell them apart")."""
    from frozentune.compare import difference_line

    parted = 0
    for d in range(1, 40):
        for c in range(d // 2 + 1, d + 1):
            first = np.array([True] * (d - c) + [False] * c + [True] * (200 - d))
            other = np.array([False] * (d - c) + [True] * c + [True] * (200 - d))
            p = paired(first, other)
            clear = p["interval"][0] > 0 or p["interval"][1] < 0
            line = difference_line("b", "a", p)
            assert ("a borderline case" in line) == (clear != (p["mcnemar_p"] < 0.05)), line
            parted += clear != (p["mcnemar_p"] < 0.05)
    assert parted > 0  # such cases exist here (counts with few examples differing)


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
        row=ROW, contains=f"is rows of {rows.resolve()}, which holds the rows it was trained on")  # the dataset's
    # train file named alone
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

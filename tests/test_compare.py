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
def two(tiny_bert, trec_slice, tmp_path_factory) -> tuple[Path, Path, Path]:
    """Two probes on the TREC slice that answer differently ([CLS] and mean pooling), and their cache."""
    root = tmp_path_factory.mktemp("compare")
    for name, pooling in (("cls", "cls"), ("mean", "mean")):
        cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 32,
            "--epochs", 3, "--pooling", pooling, "--output", root / name, "--cache-dir", root / "cache", "--quiet",
            code=0)
    return root / "cls", root / "mean", root / "cache"


def test_compare_scores_each_model_as_eval_does_and_counts_the_examples_between_them(two, trec_slice):
    first, other, cache = two
    rows = trec_slice / "train.jsonl"  # 120 examples scored whole: enough for the bootstrap's interval
    answer = cli("compare", "--model", first, "--model", other, "--data", rows, "--split", "all",
                 "--cache-dir", cache, code=0)
    got = json.loads(answer.out)
    assert got["n"] == 120 and [m["model"] for m in got["models"]] == [str(first), str(other)]
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
    assert paired(first, other) == p  # seeded
    same = paired(first, first)
    assert same["mcnemar_p"] == 1.0 and same["difference"] == 0.0 and same["interval"] == [0.0, 0.0]
    assert paired(first[:50], other[:50])["interval"] is None  # under 100 examples: no bootstrap


def test_compare_refuses_what_it_cannot_compare(two, trec_slice, tiny_bert, tmp_path):
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
        contains=("is not", "--split all"), row=ROW)
    both = cli("compare", "--model", tmp_path / "seed0", "--model", tmp_path / "seed1", "--data", rows, "--split",
               "all", "--cache-dir", cache, code=0)  # every row: the same examples for both
    assert json.loads(both.out)["n"] == 120


def test_compare_from_python(two, trec_slice):
    first, other, cache = two
    lines: list[str] = []
    got = compare([first, other], str(trec_slice), cache_root=cache, progress=False, log=lines.append)
    assert got["n"] == 40 and got["against_first"][0]["interval"] is None  # 40 examples: no bootstrap
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


def test_the_verdict_names_the_split_scored():
    from frozentune.compare import difference_line

    p = paired(np.array([True] * 80 + [False] * 40), np.array([True] * 120))
    assert "unlikely to be chance in the train sample alone" in difference_line("b", "a", p, "train")
    assert "unlikely to be chance in the file's rows alone" in difference_line("b", "a", p, "all")
    same = paired(np.ones(120, bool), np.ones(120, bool))
    assert "the test sample cannot tell them apart (p ≥ 0.05)" in difference_line("b", "a", same)

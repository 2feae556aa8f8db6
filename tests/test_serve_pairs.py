"""`frozentune serve` with sentence pairs: pair tasks beside a single-text task on one tiny BERT.

Checked: `pairs` requests answer as `predict` / `explain` do on the same pairs; texts go to the
text tasks and pairs to the pair tasks by default, and naming a task of the other kind is a 422
that says what to send; a batch holding pairs and single texts together answers each row as it is
answered alone (token types zero on the single rows, the separator only on pair rows).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from frozentune import api
from frozentune.cli import main

httpx = pytest.importorskip("httpx")
from frozentune.serve import Engine, RequestError, ServeOptions  # noqa: E402
from frozentune.serve.app import Running  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PAIR_TASKS = {"pair-probe": ["--method", "probe"], "pair-se": ["--method", "selfexplain"],
              "pair-ft": ["--method", "finetune", "--top-layers", "1"],
              # fed without token types: a frozen pass of its own (its states differ from the typed pass's)
              "pair-untyped": ["--method", "probe", "--no-token-types"]}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_bert, trec_slice, mrpc_slice, monkeypatch_module) -> Path:
    root = tmp_path_factory.mktemp("served_pairs")
    monkeypatch_module.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    for name, args in PAIR_TASKS.items():
        assert main(["train", *args, "--data", "mrpc", "--backbone", str(tiny_bert), "--output", str(root / name),
                     "--epochs", "1", "--precision", "fp32", "--seed", "0", "--quiet"]) == 0
    assert main(["train", "--method", "probe", "--data", str(trec_slice), "--backbone", str(tiny_bert), "--output",
                 str(root / "text-probe"), "--epochs", "1", "--precision", "fp32", "--seed", "0", "--quiet"]) == 0
    return root


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def engine(models):
    e = Engine.load([models], options=ServeOptions(pad_multiple=1), log=lambda line: None)
    yield e
    e.close()


@pytest.fixture(scope="module")
def pairs(mrpc_slice) -> list[tuple[str, str]]:
    rows = [json.loads(x) for x in (mrpc_slice / "mrpc" / "test.jsonl").read_text().splitlines()[:3]]
    return [(r["sentence1"], r["sentence2"]) for r in rows]


def test_pairs_answer_as_predict_and_explain(engine, models, pairs):
    got = engine.classify([list(p) for p in pairs], pairs=True)
    assert set(got["tasks"]) == set(PAIR_TASKS)
    for name in PAIR_TASKS:
        want = api.predict(models / name, pairs)
        for row, w in zip(got["results"], want):
            # pad_multiple 1: each batch is padded as predict pads it; fp32 both ways
            assert row["tasks"][name]["label"] == w["label"]
            np.testing.assert_allclose(list(row["tasks"][name]["scores"].values()), list(w["scores"].values()),
                                       rtol=1e-5, atol=1e-6)
    ex = engine.explain([list(pairs[0])], tasks=["pair-se"], top=3, pairs=True)
    want = api.explain(models / "pair-se", pairs[:1], top=3)[0]["explanation"]
    assert ex["results"][0]["tasks"]["pair-se"]["explanation"]["spans"] == want["spans"]
    for span in want["spans"]:
        assert pairs[0][span["part"]][span["start"]:span["end"]] == span["text"]


def test_pair_occlusion_answers_as_explain_occlusion(engine, models, pairs):
    """Occlusion of a pair: each word of either text cut out in turn, `part` saying which; the words and drops
    `frozentune explain --occlusion` gives (pad_multiple 1 and fp32 both ways; the cut pairs are batched
    otherwise, so within float32 rounding plus the 4 decimals kept)."""
    wide = Engine(list(engine.tasks.values()), ServeOptions(pad_multiple=1, max_top=100))  # every word listed
    got = wide.explain([list(pairs[0])], tasks=["pair-probe", "pair-ft"], top=100, pairs=True, occlusion=True)
    wide.close()
    for name in ("pair-probe", "pair-ft"):
        want = api.explain(models / name, pairs[:1], top=100, occlusion=True)[0]["explanation"]["occlusion"]
        mine = got["results"][0]["tasks"][name]["explanation"]["occlusion"]
        key = lambda w: (w["part"], w["start"], w["end"])  # noqa: E731
        assert sorted(map(key, mine["words"])) == sorted(map(key, want["words"])), name
        assert {w["part"] for w in mine["words"]} == {0, 1}
        by = {key(w): w for w in want["words"]}
        for w in mine["words"]:
            assert pairs[0][w["part"]][w["start"]:w["end"]] == w["text"]
            assert abs(w["drop"] - by[key(w)]["drop"]) <= 2e-4 and abs(w["without"] - by[key(w)]["without"]) <= 2e-4


def test_inputs_go_to_the_tasks_that_take_them(engine, pairs):
    assert engine.classify(["What is a bird ?"])["tasks"] == ["text-probe"]
    with pytest.raises(RequestError, match=r"task 'pair-probe' takes sentence pairs \(sentence1 and sentence2\): send `pairs`"):
        engine.classify(["What is a bird ?"], tasks=["pair-probe"])
    with pytest.raises(RequestError, match="task 'text-probe' takes single texts: send `texts`"):
        engine.classify([list(pairs[0])], tasks=["text-probe"], pairs=True)
    with pytest.raises(RequestError, match=r"pairs\[0\]: give a pair \[first, second\]"):
        engine.classify(["just one"], pairs=True)
    with pytest.raises(RequestError, match=r"pairs\[0\]\[1\]: empty"):
        engine.classify([["a premise", " "]], pairs=True)
    # one text of the pair that the tokenizer keeps nothing of: it was classified as the other text alone
    with pytest.raises(RequestError, match=re.escape("pairs[1]: the tokenizer keeps none of the characters of its second "
                                                     "text (e.g. combining accents alone), so it would be read as the "
                                                     "first text alone")):
        engine.classify([list(pairs[0]), ["a premise", "\u0301\u0301"]], pairs=True)


def test_pairs_and_texts_in_one_batch_answer_as_alone(engine, pairs):
    """One frozen pass over a pair row and a text row: each answered as in a batch of its own."""
    group = engine.tasks["pair-probe"].group
    assert engine.tasks["text-probe"].group is group  # one frozen pass serves both kinds
    pj, _ = engine.plan_classify([list(pairs[0])], ["pair-probe", "pair-se"], pairs=True)
    tj, _ = engine.plan_classify(["Name a bird ."], ["text-probe"])
    together = group.run(pj + tj)
    alone = group.run(pj) + group.run(tj)
    for a, b in zip(together, alone):
        for name in a:
            np.testing.assert_allclose(list(a[name]["scores"].values()), list(b[name]["scores"].values()),
                                       rtol=1e-4, atol=1e-6)  # other padding: float sums in another order


def test_http_pairs(models, pairs):
    engine = Engine.load([models], log=lambda line: None)
    running = Running(engine)
    try:
        with httpx.Client(base_url=running.url, timeout=30) as c:
            r = c.post("/v1/classify", json={"pair": list(pairs[0]), "tasks": ["pair-probe"]})
            assert r.status_code == 200 and r.json()["results"][0]["tasks"]["pair-probe"]["label"]
            r = c.post("/v1/classify", json={"pairs": [list(p) for p in pairs]})
            assert r.status_code == 200 and set(r.json()["tasks"]) == set(PAIR_TASKS)
            r = c.post("/v1/classify", json={"pair": list(pairs[0]), "text": "both"})
            assert r.status_code == 422 and "not text and pair" in r.json()["error"]
            r = c.post("/v1/classify", json={"pair": ["only one"]})
            assert r.status_code == 422 and r.json()["error"].startswith("pair: give a pair [first, second]")
            kinds = {t["name"]: t.get("input") for t in c.get("/v1/models").json()["tasks"]}
            assert kinds["pair-probe"] == "pair" and kinds["text-probe"] == "text"
    finally:
        running.stop()


def test_page_shows_pair_tasks_in_headless_chromium(models, tmp_path):
    """The page with pair tasks beside a text task: a second box appears, every task gets its card,
    and the pair cards shade both texts (first / second). The screenshot goes to
    $FROZENTUNE_SCREENSHOTS when set (docs/serve-page-pairs.png was made this way)."""
    from test_serve import render_page

    engine = Engine.load([models], log=lambda line: None)
    running = Running(engine)
    try:
        dom = render_page(running.url, tmp_path, "serve-page-pairs.png", "1280,1300")
        for name in [*PAIR_TASKS, "text-probe"]:
            assert f'data-task="{name}"' in dom, f"no card for {name}"
        assert 'id="pairbox" hidden' not in dom and "second:</span>" in dom
        assert "pair (sentence1, sentence2)" in dom
        # an empty second box: the pair tasks say so, in the page's words, and the text task is still answered
        dom = render_page(running.url, tmp_path, "serve-page-no-second.png", "1280,900", path="/?text=fine&text2=")
        assert 'data-task="text-probe"' in dom and not any(f'data-task="{n}"' in dom for n in PAIR_TASKS)
        assert "pair tasks: second text: empty" in dom and "(1 task in" in dom
    finally:
        running.stop()


def test_a_pair_cut_at_max_length_is_said_to_be_a_pair(engine, models, pairs):
    """A pair is cut longest_first: the longer text loses its end and the second may be read whole. predict
    and the server said "what follows was not read", and explain said nothing."""
    from frozentune import api

    long_pair = ("a man plays a guitar on a stage " * 40, "He plays music.")
    said: list[str] = []
    rows = api.explain(models / "pair-se", [long_pair, pairs[0]], top=2, log=said.append)
    assert rows[0]["truncated"] is True and "truncated" not in rows[1]
    assert rows[0]["explanation"]  # the explanation is of the part that was read
    predicted = api.predict(models / "pair-se", [long_pair, pairs[0]], log=said.append)
    assert predicted[0]["truncated"] is True and "truncated" not in predicted[1]
    lines = [s for s in said if "reached --max-length" in s]
    assert len(lines) == 2 and all(s.startswith("1 of 2 pairs") and "the longer text of the pair was cut first" in s
                                   for s in lines), said
    answer = engine.classify([list(long_pair)], tasks=["pair-se"], pairs=True)["results"][0]
    assert answer["truncated"] is True and "the pair reached max_length" in answer["note"]
    assert "the longer text of the pair was cut first" in answer["note"]

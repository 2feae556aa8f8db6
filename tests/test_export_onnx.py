"""`frozentune export --format onnx`: every frozen classification head on a tiny BERT in one graph,
ONNX Runtime against PyTorch on batch 1, one token and ragged batches of other sizes than the one
traced; `predict --onnx` gives predict's labels; a pair model's graph takes token types; what cannot
be exported is refused with the reason.

Tolerance: the graph and PyTorch both round the backbone's states to float16 (as the cache does);
the float32 kernels before that rounding differ (ONNX Runtime's vs torch's), so a state may land on
the other side of a float16 rounding boundary: one float16 rounding, relative to the outputs' scale.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from clirun import cli
from numerics import assert_close, exact, tol

pytest.importorskip("onnxruntime", reason="the onnx extra: pip install 'frozentune[onnx]'")
pytest.importorskip("onnxscript", reason="the onnx extra: pip install 'frozentune[onnx]'")

from frozentune.data import DataError  # noqa: E402
from frozentune.export.onnx import OnnxClassifier, build_graph, example_inputs, load_heads, session  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
HEADS = ("probe", "ytuning", "space", "selfexplain")
TEXTS = ["Who invented the telephone ?", "How far is the moon from the Earth ?", "Name a bird .",
         "What is the capital city of Australia and why was it chosen over Sydney ?"]


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny_bert, trec_slice, trec_val_slice) -> Path:
    root = tmp_path_factory.mktemp("onnx_heads")
    for m in HEADS:  # ytuning early-stops on 100 validation examples (--cv-below 0), so it has a temperature, which
        # the graph holds
        data = trec_val_slice if m == "ytuning" else trec_slice
        cli("train", "--method", m, "--data", data, "--backbone", tiny_bert, "--output", root / m, "--epochs", "1",
            "--precision", "fp32", "--seed", "0", "--cache-dir", root / "cache", "--quiet",
            *(("--cv-below", "0") if m == "ytuning" else ()), code=0)
    assert json.loads((root / "ytuning" / "result.json").read_text())["temperature"]["value"] != 1.0
    return root


@pytest.fixture(scope="module")
def graph_dir(heads, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "graph"
    ans = cli("export", "--model", *(heads / m for m in HEADS), "--format", "onnx", "--output", out, code=0,
              show="wrote")
    assert "4 head(s)" in ans.message
    return out


def test_one_graph_matches_pytorch_for_every_head(heads, graph_dir):
    meta = json.loads((graph_dir / "onnx.json").read_text())
    assert [h["name"] for h in meta["heads"]] == list(HEADS)
    assert meta["inputs"] == ["input_ids", "attention_mask"]
    assert {"selfexplain.span_weights", "ytuning.label_attention", "space.token_scores"} <= set(meta["outputs"])
    loaded = load_heads([heads / m for m in HEADS])
    graph, bb = build_graph(loaded), loaded[0][1].backbone_ref
    sess = session(graph_dir / "model.onnx", threads=1)
    for batch, tokens in ((1, 1), (1, 2), (1, 3), (2, 3), (1, 6), (2, 7), (5, 23)):  # traced at 2×7; the others not
        ids, mask, _ = example_inputs(bb, False, batch, tokens, seed=10 + batch)
        with torch.no_grad():
            want = graph(ids, mask)
        got = sess.run(graph.output_names, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        for name, g, w in zip(graph.output_names, got, want):
            assert g.shape == tuple(w.shape), f"{name}: {g.shape} vs {tuple(w.shape)} at {batch}×{tokens}"
            assert_close(torch.from_numpy(g), w, rtol=tol(torch.float16, 1), what=f"{name} at {batch}×{tokens}")


def test_the_export_folder_carries_a_card_of_its_heads(heads, graph_dir):
    """Every saved or exported folder carries a README.md card (README); the ONNX folder had none."""
    card = (graph_dir / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: onnx\n") and 'frozentune predict --onnx THIS_FOLDER "a text' in card
    # what it says is so: loading checks the graph's files (not the backbone hash, which a graph cannot be
    # checked against), and the saved tokenizer truncates at the graph's length
    meta = json.loads((graph_dir / "onnx.json").read_text())
    assert "(loading checks it)" not in card and "Loading checks the graph's files against the checksums" in card
    assert "A head's logits are already divided by its temperature, where one was fitted" in card  # (not said)
    assert set(meta["checksums"]) >= {"model.onnx"} and all(Path(h["from"]).is_absolute() for h in meta["heads"])
    tok = json.loads((graph_dir / "tokenizer_config.json").read_text())
    assert tok["model_max_length"] == meta["max_length"] and f"`model_max_length` is the graph's {meta['max_length']}" in card
    for name in HEADS:
        result = json.loads((heads / name / "result.json").read_text())
        assert f"## Head `{name}`" in card and f"{result['metrics']['accuracy']:.2f}" in card


def test_predict_onnx_gives_predicts_labels(heads, graph_dir):
    exact = "word " * (json.loads((graph_dir / "onnx.json").read_text())["max_length"] - 2)  # read whole: not cut
    texts = [*TEXTS, exact, "a question that goes on " * 200]  # the last is cut at max_length: both say "truncated"
    ans = cli("predict", "--onnx", graph_dir, *texts, code=0)
    rows = [json.loads(line) for line in ans.out.splitlines()]
    assert [r["text"] for r in rows] == texts
    assert [r.get("truncated", False) for r in rows] == [False] * (len(TEXTS) + 1) + [True]  # it said nothing of it
    assert "1 of 6 texts reached --max-length" in ans.err
    for m in HEADS:
        want = [json.loads(line) for line in cli("predict", "--model", heads / m, "--precision", "fp32", *texts,
                                                 code=0).out.splitlines()]
        for r, w in zip(rows, want):
            assert r["tasks"][m]["label"] == w["label"], m
            assert r.get("truncated") == w.get("truncated"), m
            assert_close(torch.tensor(list(r["tasks"][m]["scores"].values())), torch.tensor(list(w["scores"].values())),
                         rtol=tol(torch.float16, 1), scale=1.0, what=f"{m} probabilities")
    top = [json.loads(line) for line in cli("predict", "--onnx", graph_dir, "--top-classes", 2, *texts,
                                            code=0).out.splitlines()]
    for r, t in zip(rows, top):  # every head's scores cut to its two likeliest, likeliest first
        for m in HEADS:
            s = r["tasks"][m]["scores"]
            assert t["tasks"][m]["scores"] == dict(sorted(s.items(), key=lambda kv: -kv[1])[:2]), m


def test_one_head_prints_predicts_rows(heads, tmp_path):
    cli("export", "--model", heads / "probe", "--format", "onnx", "--output", tmp_path / "g", code=0)
    cli("export", "--model", heads / "probe", "--format", "onnx", "--output", tmp_path / "g", contains="--overwrite")
    cli("export", "--model", heads / "probe", "--format", "onnx", "--output", tmp_path / "g", "--overwrite", code=0)
    # an export's --overwrite deleted a trained model folder given as --output
    cli("export", "--model", heads / "probe", "--format", "onnx", "--output", heads / "space", "--overwrite",
        contains="holds a saved model; --overwrite replaces an ONNX export with another, not a saved model")
    assert (heads / "space" / "model.safetensors").is_file()
    (tmp_path / "q.txt").write_text("\n".join(TEXTS) + "\n")
    rows = [json.loads(line) for line in cli("predict", "--onnx", tmp_path / "g", "--input", tmp_path / "q.txt",
                                             code=0).out.splitlines()]
    assert len(rows) == 4 and set(rows[0]) == {"text", "label", "scores"}


def test_pair_model_graph(tiny_bert, mrpc_slice, tmp_path, monkeypatch):
    monkeypatch.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    cli("train", "--method", "selfexplain", "--data", "mrpc", "--backbone", tiny_bert, "--output", tmp_path / "m",
        "--epochs", "1", "--precision", "fp32", "--cache-dir", tmp_path / "c", "--quiet", code=0)
    cli("export", "--model", tmp_path / "m", "--format", "onnx", "--output", tmp_path / "g", code=0)
    graph = OnnxClassifier(tmp_path / "g")
    assert graph.pairs and graph.meta["inputs"][-1] == "token_type_ids"
    pair = ("The cat sat on the mat .", "A cat was sitting on a mat .")
    got = json.loads(cli("predict", "--onnx", tmp_path / "g", "--pair", *pair, code=0).out)
    want = json.loads(cli("predict", "--model", tmp_path / "m", "--precision", "fp32", "--pair", *pair, code=0).out)
    assert got["label"] == want["label"]
    cli("predict", "--onnx", tmp_path / "g", "a single text", contains="takes sentence pairs")
    for empty in [("", "x"), ("a", " \t")]:  # refused as predict --model refuses them; the graph answered before
        with pytest.raises(DataError, match=r"texts\[0\]\[[01]\]: empty"):
            graph.predict([empty])
    card = (tmp_path / "g" / "README.md").read_text()  # its usage line gave one text, which the graph refuses
    assert 'predict --onnx THIS_FOLDER --pair "the first text" "the second text"' in card
    assert "the longer text of a pair is cut first" in card
    # the separator is found in the graph: spans never cross it (a span weight on the separator is 0)
    out = graph.run([pair])
    sep = graph.tok(*pair)["input_ids"].index(graph.tok.sep_token_id)
    exact(torch.from_numpy(out["m.span_weights"][0, sep]), torch.zeros(out["m.span_weights"].shape[2]),
          "spans starting on the separator are masked to exactly 0")
    # a literal "[SEP]" typed in the first text is text in the graph's tokenizer too (recorded in its
    # saved config), so the graph finds the one separator predict finds
    assert json.loads((tmp_path / "g" / "tokenizer_config.json").read_text())["split_special_tokens"] is True
    typed = ("The cat [SEP] sat on the mat .", "A cat was sitting on a mat .")
    got = json.loads(cli("predict", "--onnx", tmp_path / "g", "--pair", *typed, code=0).out)
    want = json.loads(cli("predict", "--model", tmp_path / "m", "--precision", "fp32", "--pair", *typed, code=0).out)
    assert got["label"] == want["label"]
    assert_close(torch.tensor(list(got["scores"].values())), torch.tensor(list(want["scores"].values())),
                 rtol=tol(torch.float16, 1), scale=1.0, what="probabilities of a pair with a typed [SEP]")


def test_pair_model_without_token_types(tiny_bert, mrpc_slice, tmp_path, monkeypatch):
    """A --no-token-types pair model exports a graph that takes no token_type_ids and answers as predict."""
    monkeypatch.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    cli("train", "--method", "probe", "--data", "mrpc", "--backbone", tiny_bert, "--output", tmp_path / "m",
        "--no-token-types", "--epochs", "1", "--precision", "fp32", "--cache-dir", tmp_path / "c", "--quiet", code=0)
    cli("export", "--model", tmp_path / "m", "--format", "onnx", "--output", tmp_path / "g", code=0)
    assert OnnxClassifier(tmp_path / "g").meta["inputs"] == ["input_ids", "attention_mask"]
    pair = ("The cat sat on the mat .", "A cat was sitting on a mat .")
    got = json.loads(cli("predict", "--onnx", tmp_path / "g", "--pair", *pair, code=0).out)
    want = json.loads(cli("predict", "--model", tmp_path / "m", "--precision", "fp32", "--pair", *pair, code=0).out)
    assert got["label"] == want["label"]
    # as the card says to feed it: the tokenizer saved beside the graph, its every output (it gave token_type_ids,
    # which ONNX Runtime refused as an input the graph lacks)
    import onnxruntime as ort
    from transformers import AutoTokenizer

    fed = dict(AutoTokenizer.from_pretrained(str(tmp_path / "g"))(*pair, return_tensors="np", truncation=True))
    assert sorted(fed) == ["attention_mask", "input_ids"]
    logits = ort.InferenceSession(str(tmp_path / "g" / "model.onnx")).run(None, fed)[0]
    assert logits.shape == (1, len(want["scores"]))
    # a typed pair head cannot share that graph: its pass feeds token types
    cli("train", "--method", "probe", "--data", "mrpc", "--backbone", tiny_bert, "--output", tmp_path / "typed",
        "--epochs", "1", "--precision", "fp32", "--cache-dir", tmp_path / "c", "--quiet", code=0)
    cli("export", "--model", tmp_path / "m", tmp_path / "typed", "--format", "onnx", "--output", tmp_path / "both",
        contains=("token types on", "one graph holds one backbone pass"))
    assert not (tmp_path / "both").exists()


def test_what_cannot_be_exported(heads, tiny_bert, tiny_bert_other, trec_slice, tmp_path):
    out = tmp_path / "g"
    cli("train", "--method", "finetune", "--data", trec_slice, "--backbone", tiny_bert, "--output", tmp_path / "ft",
        "--epochs", "1", "--top-layers", "1", "--quiet", code=0)
    cli("export", "--model", tmp_path / "ft", "--format", "onnx", "--output", out,
        contains=("trains its encoder", "frozen backbone"))
    cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert_other, "--output", tmp_path / "other",
        "--epochs", "1", "--cache-dir", tmp_path / "c", "--quiet", code=0)
    cli("export", "--model", heads / "probe", tmp_path / "other", "--format", "onnx", "--output", out,
        contains="one graph holds one backbone pass")
    cli("export", "--model", heads / "probe", heads / "space", "--format", "onnx", "--name", "a", "a", "--output", out,
        contains="both be named 'a'")
    cli("export", "--model", heads / "probe", "--format", "onnx", "--name", " ", "--output", out,
        contains=("--name 1", "cannot name a head's output"))
    cli("export", "--model", heads / "probe", heads / "space", "--format", "peft", "--output", out, contains="one --model")
    cli("predict", "--onnx", heads / "probe", "a text", contains="no onnx.json")
    assert not out.exists()
    # the output may not be one of the models it reads, nor around one: --overwrite replaced the model with the graph
    before = sorted(p.name for p in (heads / "probe").iterdir())
    for target in (heads / "probe", heads):
        cli("export", "--model", heads / "probe", "--format", "onnx", "--output", target, "--overwrite",
            contains=("the command reads", "choose another folder"))
    assert sorted(p.name for p in (heads / "probe").iterdir()) == before


def test_export_traces_every_span_slot_and_restores_the_head():
    """The self-explaining head computes only valid spans (a count the data decides); the exporter
    switches it to every slot for the trace and back afterwards, also when the export fails."""
    from types import SimpleNamespace

    from frozentune.export.onnx import every_slot
    from frozentune.registry import create_method

    head, _ = create_method("selfexplain", 8, 2, {"dim": 4})
    graph = SimpleNamespace(heads=[head, torch.nn.Linear(2, 2)])
    with every_slot(graph):
        assert head.every_slot
    assert not head.every_slot
    with pytest.raises(RuntimeError), every_slot(graph):
        raise RuntimeError("export failed")
    assert not head.every_slot


def test_the_exporters_noise_is_quieted_and_restored():
    """torch.onnx's "torchvision is not installed" and onnxscript's "Skipping constant folding"
    warnings (4 + 4 lines on a MiniLM export) say nothing about the user's graph: their loggers sit at
    ERROR during the export and get their levels back after. The names are the libraries' own."""
    import importlib
    import logging

    from frozentune.export import onnx as X

    for name in X.QUIET_LOGGERS:  # a renamed module would leave its warnings loud again
        assert importlib.import_module(name).logger.name == name
    loggers = [logging.getLogger(n) for n in X.QUIET_LOGGERS]
    before = [lg.level for lg in loggers]
    with X.quiet_loggers():
        assert all(not lg.isEnabledFor(logging.WARNING) and lg.isEnabledFor(logging.ERROR) for lg in loggers)
    assert [lg.level for lg in loggers] == before


def test_a_damaged_export_folder_is_named_not_a_traceback(graph_dir, tmp_path):
    """A folder copied without its weights file, an edited onnx.json, lost tokenizer files: tracebacks
    from onnxruntime / json / transformers before, and an edited label list gave scores of other labels."""
    import shutil

    def broken(name: str, damage) -> Path:
        folder = tmp_path / name
        shutil.copytree(graph_dir, folder)
        damage(folder)
        return folder

    def edit_meta(change):
        def apply(folder):
            meta = json.loads((folder / "onnx.json").read_text())
            change(meta)
            (folder / "onnx.json").write_text(json.dumps(meta))
        return apply

    labels = len(json.loads((graph_dir / "onnx.json").read_text())["heads"][0]["labels"])
    cases = [
        ("not-json", lambda f: (f / "onnx.json").write_text("{"), "onnx.json is not valid JSON"),
        ("no-pairs", edit_meta(lambda m: m.pop("pairs")), "onnx.json lacks or has a wrong pairs"),
        ("labels", edit_meta(lambda m: m["heads"][0]["labels"].pop()),
         f"gives head '{HEADS[0]}' {labels - 1} labels, and the graph's {HEADS[0]}.logits has {labels}"),
        ("graph", lambda f: (f / "model.onnx").write_bytes((f / "model.onnx").read_bytes()[:100]),
         "ONNX Runtime cannot load model.onnx"),
        ("tokenizer", lambda f: [p.unlink() for p in f.glob("tokenizer*")] + [p.unlink() for p in f.glob("vocab*")],
         "its tokenizer files cannot be read"),
        # weights scaled in place: ONNX Runtime loads them, and the scores moved silently (the card said it checked)
        ("weights", lambda f: _scale_weights(f), "model.onnx.data differs from what the export wrote (checksums in "
                                                 "onnx.json)"),
        # found by bench/fuzz.py (part model): a TypeError, a KeyError, ORT's own error, StopIteration, OverflowError
        ("outputs", edit_meta(lambda m: m.update(outputs=["fp64"])), "onnx.json has a wrong outputs (the graph's output "
                                                                      "names, every head's logits among them)"),
        ("inputs", edit_meta(lambda m: m.update(inputs=[["input_ids"]])), "onnx.json has a wrong inputs"),
        ("no-heads", edit_meta(lambda m: m.update(heads=[])), "onnx.json has a wrong heads (one or more, of distinct"),
        ("max-length", edit_meta(lambda m: m.update(max_length=10 ** 20)), "onnx.json has a wrong max_length"),
        # the same count in another order: loaded, and each score went out under another label's name
        ("labels-order", edit_meta(lambda m: m["heads"][1]["labels"].reverse()),
         f"onnx.json gives head '{HEADS[1]}' the labels [\"NUM\", \"LOC\""),
    ]
    for name, damage, says in cases:
        cli("predict", "--onnx", broken(name, damage), "a question ?", contains=says)
    # a file beside the graph that the export did not write (a backup copy) is not checked, nor refused
    spare = broken("spare", lambda f: (f / "model.onnx.bak").write_bytes((f / "model.onnx").read_bytes()))
    cli("predict", "--onnx", spare, "a question ?", code=0)


def test_a_graph_exported_before_it_recorded_its_labels_still_loads(graph_dir, tmp_path):
    """A graph exported before the graph file recorded its heads' labels (2026-11-29) has none in its metadata:
    it loads and answers as before; the labels in onnx.json are then checked by count only."""
    import shutil

    import onnx

    from frozentune.export.onnx import GRAPH, HEADS_KEY, graph_checksums

    folder = tmp_path / "old"
    shutil.copytree(graph_dir, folder)
    model = onnx.load(str(folder / GRAPH), load_external_data=False)
    assert [p.key for p in model.metadata_props] == [HEADS_KEY]
    del model.metadata_props[:]
    onnx.save(model, str(folder / GRAPH))
    meta = json.loads((folder / "onnx.json").read_text())
    (folder / "onnx.json").write_text(json.dumps(meta | {"checksums": graph_checksums(folder, list(meta["checksums"]))}))
    assert OnnxClassifier(folder).predict(TEXTS) == OnnxClassifier(graph_dir).predict(TEXTS)


def _scale_weights(folder: Path) -> None:
    """Every float32 of the graph's weights file times 5, the file's length and layout unchanged."""
    data = folder / "model.onnx.data"
    w = np.frombuffer(data.read_bytes(), dtype=np.float32).copy()
    data.write_bytes((w * 5).tobytes())


def test_a_head_trained_on_other_states_is_said_to_be(heads, tmp_path):
    """The graph runs the backbone in fp32; a head trained on int8 (or the bf16 default) states was exported
    without a word, and its `predict --model` answers differed from the graph's on texts near a tie."""
    import shutil

    head = tmp_path / "probe-int8"
    shutil.copytree(heads / "probe", head)
    config = json.loads((head / "config.json").read_text())
    config["backbone"]["precision"] = "int8"
    (head / "config.json").write_text(json.dumps(config))
    ans = cli("export", "--model", head, "--format", "onnx", "--output", tmp_path / "g", code=0)
    assert "probe-int8 (int8) trained on int8 states; the graph runs the backbone in fp32" in ans.err + ans.out
    meta = json.loads((tmp_path / "g" / "onnx.json").read_text())
    assert meta["precision"] == "fp32" and meta["heads"][0]["trained_precision"] == "int8"
    assert "Trained on int8 states; this graph runs the backbone in fp32" in (tmp_path / "g" / "README.md").read_text()
    # heads trained on different field names: the graph's --input reads the first head's, now said
    config["text_field"] = "question"
    (head / "config.json").write_text(json.dumps(config))
    ans = cli("export", "--model", heads / "probe", head, "--format", "onnx", "--output", tmp_path / "two", code=0)
    assert "the heads were trained on different fields (probe: text; probe-int8: question)" in ans.err + ans.out
    (tmp_path / "here").mkdir()
    shutil.copytree(heads / "probe", tmp_path / "here" / "task")
    import os  # `export --model .` without --name: it blamed --name ("'' cannot name a head's output")
    cwd = os.getcwd()
    os.chdir(tmp_path / "here" / "task")
    try:
        cli("export", "--model", ".", "--format", "onnx", "--output", tmp_path / "dot", code=0)
    finally:
        os.chdir(cwd)
    assert json.loads((tmp_path / "dot" / "onnx.json").read_text())["heads"][0]["name"] == "task"

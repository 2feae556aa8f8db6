"""Encoder-decoder generation end to end through the CLI, as a user runs it: a tiny random BART
saved as a Hugging Face folder (so the real loading code runs), a slice of the real SciTLDR files
(abstract → TL;DR, several references in `targets`), and a CSV of pairs under other field names."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from clirun import cli
from conftest import head_of_files, make_tiny_bart, saved_as_before_trained_as
from frozentune.cli import main

WORDS = ("we propose a new method for learning the of and to in is that with on neural networks model models "
         "training data deep show this paper results task tasks which by are as an be can from our it".split())

pytestmark = pytest.mark.usefixtures("one_thread")
ROW = ("source → target pairs (issue 19): a field the file lacks, an empty source, a classifier method on pairs "
       "data, an encoder-decoder prefix exported to PEFT")  # bench/bad_input_table.py's row


@pytest.fixture(scope="module")
def bart_dir(tmp_path_factory) -> Path:
    return make_tiny_bart(tmp_path_factory.mktemp("tiny_bart"), WORDS)


@pytest.fixture(scope="module")
def scitldr_slice(tmp_path_factory, shared_data) -> Path:
    return head_of_files(shared_data / "scitldr", tmp_path_factory.mktemp("scitldr_slice"),
                         {"train": 24, "validation": 6, "test": 5})


def _train(bart_dir: Path, data: Path, out: Path, *extra: str) -> dict:
    assert main(["train", "--data", str(data), "--backbone", str(bart_dir), "--output", str(out), "--epochs", "2",
                 "--max-new-tokens", "8", "--num-beams", "2", "--seed", "0", *extra]) == 0
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("method,extra", [("prefix", ["--prefix-length", "3", "--lr", "1e-2"]),
                                          ("finetune", ["--top-layers", "1", "--lr", "1e-3"])])
def test_train_generate_eval_on_a_pairs_folder(method, extra, bart_dir, scitldr_slice, tmp_path, capsys):
    from safetensors.torch import load_file

    out = tmp_path / method
    r = _train(bart_dir, scitldr_slice, out, "--method", method, *extra)
    assert r["sizes"]["train"] == 24 and r["sizes"]["test"] == 5
    assert r["sizes"]["validation"] > 6  # SciTLDR's validation records carry several references each
    # the tiny BART takes 64 positions; abstracts are longer, and the run says how many were cut
    assert any("24 of 24 training sources are longer than the 64 tokens" in n for n in r["config"]["data_notes"])
    assert set(r["metrics"]) >= {"bleu", "chrf", "rouge_1", "rouge_2", "rouge_l"}
    saved = load_file(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] == "encoder-decoder"
    if method == "prefix":
        assert set(saved) == {"prefix.encoder", "prefix.decoder", "prefix.cross"}
        assert all(v.shape == (2, 2, 4, 3, 8) for v in saved.values())
        assert r["trainable_params"] > r["saved_params"] == sum(v.numel() for v in saved.values())
    else:
        assert saved and all(".layers.1." in k for k in saved)
    written = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (scitldr_slice / "test.jsonl").read_text().splitlines()]
    assert [w["refs"] for w in written] == [t["targets"] for t in test]  # every reference is scored
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--input", str(scitldr_slice / "test.jsonl"), "--json"]) == 0
    said = capsys.readouterr()
    again = [json.loads(line) for line in said.out.splitlines()]
    assert [a["output"] for a in again] == [w["output"] for w in written]
    # generate and eval say the cut too (only train did)
    assert "5 of 5 sources are longer than the 64 tokens the encoder takes" in said.err
    assert main(["eval", "--model", str(out), "--data", str(scitldr_slice)]) == 0
    said = capsys.readouterr()
    assert json.loads(said.out)["metrics"] == r["metrics"]  # exact: same model, same batches
    assert "5 of 5 sources are longer than the 64 tokens the encoder takes" in said.err


def test_one_csv_file_with_named_fields(bart_dir, tmp_path, capsys):
    rows = [{"article": f"we propose a new method for {w} data", "summary": f"a method for {w}"}
            for w in WORDS[:20]]
    path = tmp_path / "pairs.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ["article", "summary"])
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "m"
    r = _train(bart_dir, path, out, "--method", "prefix", "--prefix-length", "2", "--source-field", "article",
               "--target-field", "summary")
    assert r["sizes"]["train"] + r["sizes"]["validation"] == 20 and r["sizes"]["test"] == r["sizes"]["validation"]
    assert any("held out" in n for n in r["config"]["data_notes"])
    assert any("no test split" in n for n in r["config"]["data_notes"])
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--input", str(path), "--source-field", "article"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 20


def test_pairs_errors_say_what_to_do(bart_dir, scitldr_slice, tmp_path):
    cli("train", "--method", "prefix", "--data", scitldr_slice, "--backbone", bart_dir, "--source-field", "abstract",
        contains=("no 'abstract' field", "--source-field"), row=ROW)
    cli("train", "--method", "prefix", "--data", scitldr_slice, "--backbone", bart_dir, "--target-field", "tldr",
        contains=("no 'tldr' field", "--target-field"), row=ROW)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "", "target": "x"}\n{"source": "a", "target": "b"}\n')
    cli("train", "--method", "prefix", "--data", bad, "--backbone", bart_dir, contains="must be non-empty text",
        row=ROW)
    cli("train", "--method", "probe", "--data", scitldr_slice, "--backbone", bart_dir, contains="does not generate text",
        row=ROW)
    # a target longer than the decoder's positions failed mid-epoch with an IndexError; now refused first
    from frozentune.backbone import load_seq2seq_lm
    limit = load_seq2seq_lm(str(bart_dir))[0].config.max_position_embeddings
    long = tmp_path / "long.jsonl"
    long.write_text("".join(json.dumps({"source": f"a b {i}", "target": " ".join(["a"] * (limit + 5))}) + "\n" for i in range(6)))
    cli("train", "--method", "prefix", "--data", long, "--backbone", bart_dir, "--epochs", "1", "--output", tmp_path / "l",
        contains=("training and validation targets are longer than the", "decoder takes"), row=ROW)
    # a classification field option on generation data was ignored: the run trained on source / target
    cli("train", "--method", "prefix", "--data", scitldr_slice, "--backbone", bart_dir, "--text-field", "abstract",
        "--output", tmp_path / "m", contains=("--text-field abstract", "--source-field"), row=ROW)
    assert not (tmp_path / "m").exists()


def test_an_encoder_decoder_lm_without_a_decoder_start_token_is_refused(scitldr_slice, tmp_path):
    """A hand-built config without decoder_start_token_id failed mid-training in transformers'
    shift_tokens_right with a TypeError; it is now refused when the LM loads, saying what to set."""
    folder = make_tiny_bart(tmp_path / "bart", WORDS)
    config = json.loads((folder / "config.json").read_text())
    for start, said in ((None, "has no decoder_start_token_id"), (10_000, "is not a token id of its vocabulary")):
        (folder / "config.json").write_text(json.dumps(dict(config, decoder_start_token_id=start)))
        cli("train", "--method", "prefix", "--data", scitldr_slice, "--backbone", folder, "--epochs", "1",
            "--output", tmp_path / "m", contains=(said, "set it"), row=ROW)
        assert not (tmp_path / "m").exists()


def test_an_encoder_decoder_prefix_has_no_peft_form(bart_dir, tmp_path):
    pytest.importorskip("peft")
    from frozentune.generation.prefix import PrefixConfig
    from frozentune.generation.seq2seq import Seq2SeqPrefixTuner
    from frozentune.backbone import load_seq2seq_lm

    lm, tok = load_seq2seq_lm(str(bart_dir))
    Seq2SeqPrefixTuner(PrefixConfig(prefix_length=2), lm, tok, str(bart_dir)).save(
        tmp_path / "m", extra={"task": "generation"})
    # it said PEFT's prefix adapters are for causal LMs only; PEFT has encoder-decoder ones, laid out otherwise
    cli("export", "--model", tmp_path / "m", "--format", "peft", "--output", tmp_path / "p",
        contains=("no exact PEFT form", "decoder's self-attention only", "three prefixes",
                  f"generate --model {tmp_path / 'm'}"), row=ROW)
    assert not (tmp_path / "p").exists()
    pytest.importorskip("onnxruntime", reason="the onnx extra")
    # --format onnx sent it to --format peft, which refuses it
    cli("export", "--model", tmp_path / "m", "--format", "onnx", "--output", tmp_path / "p",
        contains="an encoder-decoder prefix has no PEFT form either")


@pytest.mark.parametrize("method", ["prefix", "finetune"])
def test_an_encoder_decoder_lm_whose_config_changed_since_training_is_refused(method, bart_dir, tmp_path):
    """The same BART weights under an edited config.json (another activation) decode other text: generate gave
    it without a word. A model saved before the LM's config hash was recorded loads as before, unchecked."""
    import shutil

    from frozentune.backbone import load_seq2seq_lm
    from frozentune.generation.prefix import PrefixConfig
    from frozentune.generation.seq2seq import Seq2SeqFinetuner, Seq2SeqPrefixTuner
    from frozentune.registry import make_config

    lm_dir, run = tmp_path / "bart", tmp_path / "m"
    shutil.copytree(bart_dir, lm_dir)
    lm, tok = load_seq2seq_lm(str(lm_dir))
    tuner = (Seq2SeqPrefixTuner(PrefixConfig(prefix_length=2), lm, tok, str(lm_dir)) if method == "prefix" else
             Seq2SeqFinetuner(make_config("finetune", {"top_layers": 1}), lm, tok, str(lm_dir)))
    tuner.save(run, extra={"task": "generation"})
    config = json.loads((run / "config.json").read_text())
    assert config["backbone"]["config_hash"]
    cli("generate", "--model", run, "we propose", code=0)
    lm_config = json.loads((lm_dir / "config.json").read_text())
    (lm_dir / "config.json").write_text(json.dumps(dict(lm_config, activation_function="relu")))
    cli("generate", "--model", run, "we propose",
        contains=(f"the language model {str(lm_dir)!r} found here has the same weights but another config.json",
                  "load the same model files"))
    del config["backbone"]["config_hash"]  # as a frozentune before it was recorded saved it
    saved_as_before_trained_as(run, config)
    cli("generate", "--model", run, "we propose", code=0)


def test_a_peft_encoder_decoder_prefix_adapter_is_refused_with_the_real_reason(bart_dir, tmp_path):
    """PEFT's SEQ_2_SEQ_LM prefix adapter: refused because the layouts differ (it said frozentune's prefixes were
    for causal LMs only, which the encoder-decoder prefix trained here contradicts)."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForSeq2SeqLM

    made = peft.get_peft_model(AutoModelForSeq2SeqLM.from_pretrained(str(bart_dir)),
                               peft.PrefixTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=2))
    made.save_pretrained(str(tmp_path / "s2s"))
    cli("import", "--format", "peft", "--adapter", tmp_path / "s2s", "--output", tmp_path / "m",
        contains=("an encoder-decoder LM", "decoder's self-attention only", "three prefixes",
                  f"frozentune train --method prefix --backbone {bart_dir}"))
    assert not (tmp_path / "m").exists()


def test_serve_batches_encoder_decoder_prefixes_as_each_alone(bart_dir, tmp_path):
    """Two prefixes of one BART share one LM and one batch; each answer equals `frozentune generate`'s."""
    from concurrent.futures import ThreadPoolExecutor

    from frozentune.backbone import load_seq2seq_lm
    from frozentune.generation.run import generate_sources
    from frozentune.generation.prefix import PrefixConfig
    from frozentune.generation.seq2seq import Seq2SeqPrefixTuner
    from frozentune.serve.engine import Engine, ServeOptions

    lm, tok = load_seq2seq_lm(str(bart_dir))
    for name, length, seed in (("a", 2, 0), ("b", 4, 1)):
        torch.manual_seed(seed)
        Seq2SeqPrefixTuner(PrefixConfig(prefix_length=length, reparam=False), lm, tok, str(bart_dir)).save(
            tmp_path / name, extra={"task": "generation", "decoding": {"num_beams": 2, "max_new_tokens": 6}})
    sources = ["we propose a new method", "deep neural networks", "this paper show results on tasks"]
    alone = {(p, s): generate_sources(tmp_path / p, [s])[0] for p in ("a", "b") for s in sources}
    assert len(set(alone.values())) > 1
    e = Engine.load([tmp_path / "a", tmp_path / "b"], "cpu", None, ServeOptions(max_wait_ms=200.0), log=lambda s: None)
    try:
        assert len({id(t.group) for t in e.tasks.values()}) == 1  # one LM for both prefixes
        with ThreadPoolExecutor(6) as pool:
            got = dict(zip(alone, pool.map(lambda k: e.generate(k[0], [k[1]])["outputs"][0]["output"], alone)))
        assert max(b.rows for b in e.batches) > 1  # requests did share a batch
        long = " ".join(["data"] * 80)  # past the encoder's 64 positions: cut as generate cuts it (it was a 413)
        out = e.generate("a", [long])["outputs"][0]
        assert out["output"] == generate_sources(tmp_path / "a", [long])[0] and out["truncated"]
    finally:
        e.close()
    assert got == alone


def test_generation_options_on_pairs_of_other_field_names_name_the_fields(tmp_path):
    """With a method that generates, --num-beams / --max-new-tokens on pairs whose fields are not source /
    target were answered "leave them out" (the classification hint); without them the hint names the fields."""
    data = tmp_path / "pairs.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([["article", "summary"]] + [[f"a text {i}", f"short {i}"] for i in range(12)])
    cli("train", "--method", "prefix", "--max-new-tokens", "8", "--num-beams", "1", "--data", data,
        contains=("--num-beams, --max-new-tokens", "name the source and target fields: --source-field / --target-field"),
        row=ROW)
    answer = cli("train", "--method", "probe", "--num-beams", "1", "--data", data, row=ROW,
                 contains="leave them out")  # a method that only classifies: the options do not apply
    assert "--source-field" not in answer.message

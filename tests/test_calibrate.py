"""--calibrate: one temperature fitted on the validation split's logits after training; every prediction stays as
it was, the probabilities are softmax(logits / T) wherever the model answers (predict, eval, serve, ONNX)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from clirun import cli

from frozentune import api
from frozentune import model as M
from frozentune.registry import MethodError
from frozentune.train import fit_temperature

TEXTS = ["What does NASA stand for ?", "Who wrote Hamlet ?", "How far is the moon ?", "Where is Lima ?",
         "Name a bird .", "Why is the sky blue ?"]


def test_fit_temperature_finds_the_scale_the_logits_were_stretched_by():
    """Labels drawn from softmax(z): the logits 3z are three times too confident, and T comes out near 3; the
    loss is lowest at T (against T nudged either way)."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(20000, 4)) * 1.5
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    y = np.array([rng.choice(4, p=row) for row in p])
    fitted = fit_temperature(3 * z, y)
    assert fitted["value"] == pytest.approx(3.0, rel=0.05)  # 20,000 draws: the estimate's spread is ~1%
    assert fitted["loss_after"] < fitted["loss_before"] and fitted["examples"] == 20000

    def loss(t: float) -> float:
        return float(torch.nn.functional.cross_entropy(torch.from_numpy(3 * z / t), torch.from_numpy(y)))
    assert all(loss(fitted["value"]) <= loss(fitted["value"] * f) for f in (0.99, 1.01))
    assert fit_temperature(z, y)["value"] == pytest.approx(1.0, rel=0.05)  # already calibrated: left near 1


@pytest.fixture(scope="module")
def pair(tiny_bert, trec_val_slice, tmp_path_factory) -> tuple[Path, Path]:
    """The same Y-Tuning head trained twice, --calibrate auto and off; validation (100 examples) chooses
    (--cv-below 0), so auto fits a temperature."""
    root = tmp_path_factory.mktemp("calibrate")
    for name in ("auto", "off"):
        ans = cli("train", "--method", "ytuning", "--data", trec_val_slice, "--backbone", tiny_bert, "--max-length", 32,
                  "--epochs", 3, "--cv-below", 0, "--calibrate", name, "--output", root / name, "--cache-dir",
                  root / "cache", "--quiet", code=0)
        said = [line for line in ans.out.splitlines() if line.startswith("probabilities: temperature")]
        assert len(said) == (name == "auto"), ans.out  # the run says the temperature it fitted, once
    return root / "auto", root / "off"


def test_calibrate_divides_the_logits_and_keeps_every_prediction(pair, trec_val_slice):
    auto, off = pair
    result = json.loads((auto / "result.json").read_text())
    t = result["temperature"]
    assert t["fitted_on"] == "validation" and t["examples"] == result["sizes"]["validation"] and t["value"] > 0
    assert t["value"] != 1.0 and t["loss_after"] <= t["loss_before"]
    assert json.loads((off / "result.json").read_text())["temperature"] is None
    assert float(load_file(str(auto / "model.safetensors"))["temperature"]) == t["value"]  # saved with the weights
    assert "temperature" not in load_file(str(off / "model.safetensors"))
    assert M.load(auto).temperature == t["value"] and M.load(off).temperature == 1.0
    calibrated, raw = api.predict(auto, TEXTS), api.predict(off, TEXTS)  # the same seed: the same weights
    for c, r in zip(calibrated, raw):
        assert c["label"] == r["label"]
        z = np.log(np.array(list(r["scores"].values()), dtype=np.float64))  # the logits, up to a constant
        want = np.exp(z / t["value"]) / np.exp(z / t["value"]).sum()
        # float32 softmax on both sides, one division more: a few float32 roundings of numbers ≤ 1
        assert np.array(list(c["scores"].values())) == pytest.approx(want, abs=1e-5)
    # the training run's test figures are eval's (the temperature loads with the model), and the card says it
    assert json.loads(cli("eval", "--model", auto, "--data", trec_val_slice, "--cache-dir", auto.parent / "cache",
                          code=0).out)["calibration"] == result["calibration"]
    assert f"divided by a temperature of {t['value']:.3f}" in (auto / "README.md").read_text()
    surest = next(r for r in result["calibration"]["selective"] if r["coverage"] == 80)  # and what the surest score
    assert (f"the 80% it is surest of (probability at least {surest['threshold']:.3f}) are {surest['accuracy']:.2f}% "
            f"right") in (auto / "README.md").read_text()


def test_calibrate_on_the_folds_held_out_examples(trec_slice, tiny_bert, tmp_path):
    """Few labels, no validation split: cross-validation chose the model, and the temperature is fitted on its
    out-of-fold logits (120 training examples, each once), saved with the weights and said on the card."""
    ans = cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 32,
              "--output", tmp_path / "m", "--cache-dir", tmp_path / "cache", code=0)
    result = json.loads((tmp_path / "m" / "result.json").read_text())
    t = result["temperature"]
    assert result["selection"]["how"] == "cross-validation" and result["sizes"]["validation"] == 0
    assert t["fitted_on"] == "cross-validation" and t["examples"] == t["distinct_examples"] == 120
    assert t["value"] > 0 and t["value"] != 1.0 and t["loss_after"] <= t["loss_before"]
    assert (f"probabilities: temperature {t['value']:.3f} fitted on the 120 training examples as each was scored by "
            f"the fold model that did not train on it (2 folds)") in ans.out  # ABBR has 2: 2 folds
    assert M.load(tmp_path / "m").temperature == t["value"]
    assert "fitted on the 120 training examples as the fold models that did not train on them scored them" in (
        tmp_path / "m" / "README.md").read_text()
    # repeated folds: each example held out once per repeat, all of them fitted on
    ans = cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 32,
              "--cv-repeats", 2, "--output", tmp_path / "r", "--cache-dir", tmp_path / "cache", code=0)
    t = json.loads((tmp_path / "r" / "result.json").read_text())["temperature"]
    assert (t["examples"], t["distinct_examples"]) == (240, 120)
    assert "scored by the 2 fold models that did not train on it (2 folds × 2 repeats)" in ans.out


def test_calibrate_where_it_cannot_apply(trec_slice, trec_val_slice, tiny_bert, tmp_path):
    # a class with a single example: no folds, no validation split; nothing to fit on, said where it was asked for
    rows = [json.loads(line) for line in (trec_slice / "train.jsonl").read_text().splitlines()]
    rows[0] = {**rows[0], "label": "LONE"}  # a label of its own on one row
    data = tmp_path / "lone"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(trec_slice / "test.jsonl", data / "test.jsonl")
    ans = cli("train", "--method", "probe", "--data", data, "--backbone", tiny_bert, "--max-length", 32,
              "--calibrate", "auto", "--output", tmp_path / "m", "--cache-dir", tmp_path / "cache", code=0)
    assert "--calibrate auto not used" in ans.out and "this run had neither" in ans.out
    assert json.loads((tmp_path / "m" / "result.json").read_text())["temperature"] is None
    # validation chose, but from 12 examples carved out of train: too few to fit on, said
    ans = cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 32,
              "--epochs", 2, "--cv-below", 0, "--cache-dir", tmp_path / "cache", code=0)
    assert "a temperature is fitted on 100 validation examples or more (--calibrate), and there are 12" in ans.out
    # the folds held out 12 examples (2 per class): too few as well
    ans = cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 32,
              "--shots", 2, "--cache-dir", tmp_path / "cache", code=0)
    assert ("a temperature is fitted on 100 training examples held out by the folds or more (--calibrate), and "
            "there are 12") in ans.out
    # where every validation example is right by a wide margin, no finite temperature is best: none is set
    margin = np.array([[9.0, 0.0], [0.0, 9.0]] * 60)
    assert fit_temperature(margin, np.array([0, 1] * 60))["at_edge"]
    assert not fit_temperature(margin, np.array([0, 1] * 59 + [1, 0]))["at_edge"]  # one wrong: a finite T
    # logits that are not finite: the search's losses were NaN and any T passed as the best; now refused, saying so
    from frozentune.train import NonFiniteLogits
    for bad in (np.nan, np.inf, -np.inf):
        z = margin.copy()
        z[3, 0] = bad
        with pytest.raises(NonFiniteLogits, match="^1 of the 120 examples have logits that are not finite numbers"):
            fit_temperature(z, np.array([0, 1] * 60))
    # and a run whose validation logits are not all finite keeps the head's own scale, saying why
    real_fit, said = api.fit_temperature, []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "fit_temperature", lambda z, y: real_fit(np.where(np.arange(len(z))[:, None] == 0, np.inf, z),
                                                                 y))
        r = api.train("probe", str(trec_val_slice), api.BackboneOptions(str(tiny_bert), max_length=32),
                      train_cfg={"epochs": 1, "cv_below": 0}, cache_root=tmp_path / "cache", progress=False,
                      log=said.append)
    assert r["temperature"] is None and any(x.startswith("probabilities: the head's own scale: on the 100 validation "
                                                         "examples, 1 of the 100 examples have logits that are not "
                                                         "finite numbers") for x in said), said
    with pytest.raises(MethodError, match="calibrate"):  # a generation run has no classes to scale
        api.train("prefix", "e2e", train_cfg={"calibrate": "off"}, log=None)
    cli("train", "--method", "probe", "--data", trec_slice, "--calibrate", "on", contains="--calibrate")


def test_a_damaged_temperature_is_refused(pair, tmp_path):
    folder = Path(shutil.copytree(pair[0], tmp_path / "m"))
    config = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    state["temperature"] = torch.tensor(-2.0, dtype=torch.float64)
    M.write_saved(folder, state, {k: v for k, v in config.items() if k not in ("format", "weights_file")})
    with pytest.raises(M.ModelLoadError, match="'temperature' is not a positive number"):
        M.load(folder)


def test_the_parts_of_a_logit_are_divided_with_it(tiny_bert, trec_val_slice, tmp_path):
    """Space's token_logits add up (with the bias) to its logits; with a temperature they still add up to what the
    model answers with, in forward and in the ONNX graph alike."""
    from numerics import assert_close, dot

    cli("train", "--method", "space", "--data", trec_val_slice, "--backbone", tiny_bert, "--max-length", 32,
        "--epochs", 2, "--cv-below", 0, "--output", tmp_path / "space", "--cache-dir", tmp_path / "cache", "--quiet",
        code=0)
    m = M.load(tmp_path / "space")
    assert m.temperature != 1.0
    bb = m.backbone_ref
    b = M.LiveSource(bb.tokenize(TEXTS), bb.pad_id()).batch(np.arange(len(TEXTS)))
    with torch.no_grad():
        out = m(b)
    bias = m.head.out.bias.detach() / m.temperature
    # the tokens' shares and the bias, summed in another order than the head's centroids: a sum of 32 terms each
    # at most the largest |logit| (float32 roundings, scaled alike by 1/T on both sides)
    assert_close(out.extras["token_logits"].sum(-1) + bias, out.logits, ops=dot(32),
                 scale=float(out.logits.abs().max()), what="shares + bias against the calibrated logits")
    from frozentune.export.onnx import build_graph, load_heads  # the module ONNX exports: the same, exactly

    graph = build_graph(load_heads([tmp_path / "space"]))
    with torch.no_grad():
        got = dict(zip(graph.output_names, graph(b.input_ids, b.mask.long())))
    assert torch.equal(got["space.logits"], out.logits)
    assert torch.equal(got["space.token_logits"], out.extras["token_logits"])


# the row of bench/bad_input_table.py the refusals of `frozentune calibrate` are recorded under
ROW = ("calibrate: the examples the model was trained on, a split of fewer than 100 examples, a text generator, "
       "--overwrite without --output")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_calibrate_fits_on_a_split_what_training_would_have(pair, trec_val_slice, tmp_path):
    """`frozentune calibrate` of the model trained with --calibrate off, on the validation split, gives the
    temperature the same run with --calibrate auto fitted there (same seed, same weights, same examples): the
    calibrated folder answers as the auto one does; result.json stays the training run's, the card says what
    changed, config.json records it."""
    auto, off = pair
    folder = Path(shutil.copytree(off, tmp_path / "m"))
    before = _files(folder)
    ans = cli("calibrate", "--model", folder, "--data", trec_val_slice, "--cache-dir", tmp_path / "cache", code=0)
    record = json.loads(ans.out)
    want = json.loads((auto / "result.json").read_text())["temperature"]
    # the same logits and the same bounded search (xatol 1e-6 on log T): the same T, to the search's precision
    assert record["value"] == pytest.approx(want["value"], rel=1e-5) and record["examples"] == 100
    assert record["previous"] is None and record["loss_previous"] == pytest.approx(want["loss_before"], rel=1e-9)
    assert M.load(folder).temperature == record["value"]
    for c, a in zip(api.predict(folder, TEXTS), api.predict(auto, TEXTS)):
        assert c["label"] == a["label"]
        assert list(c["scores"].values()) == pytest.approx(list(a["scores"].values()), abs=1e-5)
    after = _files(folder)
    assert after["result.json"] == before["result.json"]
    assert json.loads(after["config.json"])["calibrated"] == {k: v for k, v in record.items()
                                                               if k not in ("model", "output")}
    assert (f"`frozentune calibrate` fitted a temperature of {record['value']:.3f} (it was none) on the 100 examples "
            f"of the validation split") in after["README.md"].decode()
    # again, now from a temperature: the same fit (the head's own scale is what T is fitted on), the previous one said
    again = frozentune_calibrate(folder, trec_val_slice, tmp_path / "cache", output=tmp_path / "copy")
    assert again["value"] == pytest.approx(record["value"], rel=1e-9) and again["previous"] == record["value"]
    assert _files(folder) == after  # --output: the folder given is left as it was
    # the card says which of result.json's figures came before: the surest examples' thresholds were the training
    # run's (they said "(its temperature applied)"), and a temperature the run fitted is said as replaced
    # before: the run fitted none, and its card said "(its temperature applied)" all the same
    assert "on the head's own scale (no temperature was fitted)" in before["README.md"].decode()
    assert "(its temperature applied)" in (auto / "README.md").read_text()
    card = after["README.md"].decode()
    assert "These were measured as the training run left the model, before `frozentune calibrate`" in card
    assert "(its temperature applied)" not in card and "its logits are divided by" not in card
    frozentune_calibrate(auto, trec_val_slice, tmp_path / "cache", output=tmp_path / "auto-again")
    card = (tmp_path / "auto-again" / "README.md").read_text()
    assert (f"a temperature of {want['value']:.3f} was fitted on the 100 validation examples (`--calibrate`), which "
            f"`frozentune calibrate` has since replaced (below)") in card and "its logits are divided by" not in card
    assert "its logits are divided by" in (auto / "README.md").read_text()  # before: the run's own, in force


def frozentune_calibrate(folder: Path, data: Path, cache: Path, **kw) -> dict:
    from frozentune.calibrate import calibrate

    return calibrate(folder, str(data), cache_root=cache, log=None, **kw)


def test_calibrate_refuses_and_leaves_the_folder_as_it_was(pair, trec_val_slice, trec_slice, tiny_bert, tmp_path):
    folder = Path(shutil.copytree(pair[1], tmp_path / "m"))
    before = _files(folder)
    cache = ("--cache-dir", tmp_path / "cache")
    cli("calibrate", "--model", folder, "--data", trec_val_slice, "--split", "train", *cache, row=ROW,
        contains=("--split train: the examples the model was trained on", "give --split validation"))
    # the training file named as data of its own (read alone, so carved anew or read whole): its rows, whatever the
    # split is called, are the model's training rows (the data's name, "train", was not the model's, so it passed)
    for split in ("all", "validation", "train", "test"):  # (test: a carve of the file, not the run's test file)
        cli("calibrate", "--model", folder, "--data", trec_val_slice / "train.jsonl", "--split", split, *cache,
            row=ROW, contains=(f"--split {split}: rows of {(trec_val_slice / 'train.jsonl').resolve()}, which holds "
                               f"the rows the model was trained on", "give --split validation"))
    # its validation file read alone is held-out rows: fitted (into --output, the folder left as it is)
    cli("calibrate", "--model", folder, "--data", trec_val_slice / "validation.jsonl", "--split", "all", *cache,
        "--output", tmp_path / "on-validation", code=0)
    one_file = trec_val_slice / "train.jsonl"  # a model of one file: its every row holds those it trained on
    cli("train", "--method", "probe", "--data", one_file, "--backbone", tiny_bert, "--max-length", 32,
        "--output", tmp_path / "file", *cache, "--quiet", code=0)
    cli("calibrate", "--model", tmp_path / "file", "--data", one_file, "--split", "all", *cache, row=ROW,
        contains=f"--split all: every row of {one_file}, the examples the model was trained on among them")
    cli("calibrate", "--model", folder, "--data", trec_slice, "--split", "test", *cache, row=ROW,
        contains=("holds 40 examples", "fitted on 100 or more"))
    cli("calibrate", "--model", folder, "--data", trec_val_slice, "--overwrite", *cache, row=ROW,
        contains="--overwrite replaces a model saved at --output")
    cli("calibrate", "--model", tmp_path / "nowhere", "--data", trec_val_slice, row=ROW, contains="no such folder")
    # an --output that cannot be written is said before the model is loaded and the split scored (it came after)
    said = cli("calibrate", "--model", folder, "--data", trec_val_slice, "--output", pair[0], *cache, row=ROW,
               contains=(f"--output {pair[0]}", "--overwrite"))
    assert "calibrate: the validation split" not in said.err and "device:" not in said.err
    generator = tmp_path / "generator"
    generator.mkdir()
    (generator / "config.json").write_text(json.dumps({"task": "generation", "method": "prefix"}))
    cli("calibrate", "--model", generator, "--data", trec_val_slice, row=ROW, contains="a text generator")
    assert _files(folder) == before
    from frozentune.calibrate import CalibrateError, calibrate
    from frozentune import train as T

    real = T.fit_temperature  # a split every example of which is right by a wide margin: T runs to its range's end
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T, "fit_temperature", lambda z, y: real(z, y) | {"value": float(np.exp(-T.LOG_T)), "at_edge": True})
        with pytest.raises(CalibrateError, match="at the end of its range .* the model is left as it was"):
            calibrate(folder, str(trec_val_slice), cache_root=tmp_path / "cache", log=None)
    assert _files(folder) == before

    scored = api._scored_split  # a model that gives one example a NaN logit: one line, the folder as it was

    def nan_logit(*a, **k):
        ds, part, y, z = scored(*a, **k)
        z = z.copy()
        z[3, 0] = np.nan
        return ds, part, y, z
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "_scored_split", nan_logit)
        cli("calibrate", "--model", folder, "--data", trec_val_slice, *cache, row=ROW,
            contains=("1 of the 100 examples have logits that are not finite numbers (NaN or infinite), so no "
                      "temperature can be fitted on them", "the model is left as it was"))
    assert _files(folder) == before
    with pytest.raises(CalibrateError, match="from Python: split= for --split"):  # in Python's terms
        calibrate(folder, str(trec_val_slice), split="train", cache_root=tmp_path / "cache", log=None)


def test_calibrate_knows_the_training_rows_by_their_content_and_the_run_test_file_by_its_path(
        trec_slice, tiny_bert, shared_data, tmp_path):
    """A model's training rows are known by the digest of them its run recorded (split_rule's "rows") and where they
    lie, not by the data's name: a copy of its dataset is its data (its validation split the run's), its training
    file read alone or copied is training rows whatever the split (a test carved from it was scored), and another
    file of the same name is not (it was refused, "small" against "small"); its run's test file named by path is
    said to be the test split it scored, another test file is not; the record keeps the path, not the file's stem."""
    cache = ("--cache-dir", tmp_path / "cache")
    rows = [json.loads(line) for line in (shared_data / "trec" / "train.jsonl").read_text().splitlines()]
    labels = {r["label"] for r in rows[:120]}

    def jsonl(part: list[dict]) -> str:
        return "".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in part)
    later = [r for r in rows[1000:] if r["label"] in labels][:300]  # rows the models here do not train on
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(trec_slice / "train.jsonl", data / "train.jsonl")
    (data / "test.jsonl").write_text(jsonl(later[:150]))
    cli("train", "--method", "probe", "--data", data, "--backbone", tiny_bert, "--max-length", 32, "--epochs", 1,
        "--output", tmp_path / "m", *cache, "--quiet", code=0)
    m = ("--model", tmp_path / "m")
    copy = shutil.copytree(data, tmp_path / "copy")  # the dataset elsewhere: its data, read as the run read it
    cli("calibrate", *m, "--data", copy, "--split", "train", *cache, row=ROW,
        contains="--split train: the examples the model was trained on")
    cli("calibrate", *m, "--data", copy, "--split", "validation", *cache,  # 120 < --cv-below: none, as in the run
        contains="the model was trained without a validation split")  # (it carved one anew out of training rows)
    alone = tmp_path / "alone"  # its training file copied alone: carved anew, its every split is training rows
    alone.mkdir()
    shutil.copy(data / "train.jsonl", alone / "train.jsonl")
    for where, split in ((data / "train.jsonl", "test"), (alone, "test"), (alone, "validation")):
        cli("calibrate", *m, "--data", where, "--split", split, *cache, row=ROW,
            contains="which holds the rows the model was trained on")
    other = tmp_path / "other"  # a file with the training file's name and other rows: not the model's
    other.mkdir()
    (other / "train.jsonl").write_text(jsonl(later[150:]))
    ans = cli("calibrate", *m, "--data", other / "train.jsonl", "--split", "all", *cache, "--output",
              tmp_path / "on-other", code=0)
    assert json.loads(ans.out)["data"] == str(other / "train.jsonl")
    assert "the test split the training run" not in ans.err
    ans = cli("calibrate", *m, "--data", data / "test.jsonl", "--split", "all", *cache, "--output",
              tmp_path / "on-test", code=0)
    assert "calibrate: this is the test split the training run scored" in ans.err
    assert json.loads(ans.out)["data"] == str(data / "test.jsonl")
    newtest = tmp_path / "newtest"  # its train file with another test file: that test split is not the run's
    newtest.mkdir()
    shutil.copy(data / "train.jsonl", newtest / "train.jsonl")
    (newtest / "test.jsonl").write_text(jsonl(later[150:]))
    ans = cli("calibrate", *m, "--data", newtest, "--split", "test", *cache, "--output", tmp_path / "on-new", code=0)
    assert "the test split the training run scored" not in ans.err
    # a model of one file "small.jsonl", and another "small.jsonl" of other rows: read as other data, not refused as
    # "edited since" (its validation carve is its own)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(data / "train.jsonl", tmp_path / "a" / "small.jsonl")
    (tmp_path / "b" / "small.jsonl").write_text(jsonl(later))
    cli("train", "--method", "probe", "--data", tmp_path / "a" / "small.jsonl", "--backbone", tiny_bert,
        "--max-length", 32, "--epochs", 1, "--output", tmp_path / "ms", *cache, "--quiet", code=0)
    cli("eval", "--model", tmp_path / "ms", "--data", tmp_path / "b" / "small.jsonl", "--split", "validation", *cache,
        code=0)


def test_calibrate_and_compare_read_data_trained_on_its_validation_file(trec_slice, tiny_bert, tmp_path):
    """Data of a validation and a test file and no train file (SNLI offline), which a run trains on: a KeyError
    ('train') ended calibrate's and compare's check of the rows; its validation file read alone is training rows."""
    cache = ("--cache-dir", tmp_path / "cache")
    vt = tmp_path / "vt"
    vt.mkdir()
    shutil.copy(trec_slice / "train.jsonl", vt / "validation.jsonl")
    shutil.copy(trec_slice / "test.jsonl", vt / "test.jsonl")
    for name in ("a", "b"):
        cli("train", "--method", "probe", "--data", vt, "--backbone", tiny_bert, "--max-length", 32, "--epochs", 1,
            "--seed", 0, "--pooling", "mean" if name == "a" else "cls", "--output", tmp_path / name, *cache,
            "--quiet", code=0)
    cli("calibrate", "--model", tmp_path / "a", "--data", vt, *cache, contains="the model was trained without a "
                                                                                "validation split")
    cli("calibrate", "--model", tmp_path / "a", "--data", vt / "validation.jsonl", "--split", "all", *cache, row=ROW,
        contains="which holds the rows the model was trained on")
    renamed = tmp_path / "renamed"  # the same files, validation.jsonl called train.jsonl: read the same way
    renamed.mkdir()
    shutil.copy(vt / "validation.jsonl", renamed / "train.jsonl")
    shutil.copy(vt / "test.jsonl", renamed / "test.jsonl")
    from frozentune.api import trained_on
    assert trained_on(json.loads((tmp_path / "a" / "config.json").read_text()), str(renamed), "validation") == (
        True, None, False)  # (it was refused as training rows: the file names were compared as written)
    got = cli("compare", "--model", tmp_path / "a", "--model", tmp_path / "b", "--data", vt, *cache, code=0)
    assert json.loads(got.out)["n"] == 40
    cli("compare", "--model", tmp_path / "a", "--model", tmp_path / "b", "--data", vt, "--split", "train", *cache,
        contains="the examples it was trained on")


def test_which_rows_a_model_trained_on_in_the_cases_a_review_found(pair, trec_val_slice, tmp_path):
    """api.trained_on where a second review found it wrong: a copy of the training file alone, where the run also had
    a validation file (the digest of train and validation together did not match it: recorded now per file); a
    model saved before paths were recorded, scored on its own test split by name (the warning was lost)."""
    from frozentune.api import trained_on

    config = json.loads((pair[1] / "config.json").read_text())
    assert "train_rows" in config["split_rule"]
    alone = tmp_path / "alone.jsonl"
    shutil.copy(trec_val_slice / "train.jsonl", alone)
    for split in ("train", "validation", "test", "all"):
        assert trained_on(config, str(alone), split).trained_file == str(alone.resolve()), split
    assert trained_on(config, str(trec_val_slice / "validation.jsonl"), "all").trained_file is None
    old = {k: v for k, v in config.items() if k != "split_rule"}  # saved before 2026-11-28: by the data's name
    assert trained_on(old, str(trec_val_slice), "test") == (True, None, True)


def test_labels_are_read_under_their_trained_names_only_where_that_is_clear():
    """A rename's data is read under the trained names; a swap's cannot be told from data still named as trained
    (both are names of the model), so it is read as it is; data with other names is not mapped."""
    from frozentune.data import TextSplit, as_trained

    def split(*labels):
        return {"train": TextSplit(["t"] * len(labels), list(labels), "x", list(range(1, len(labels) + 1)))}
    renamed = {"zz_desc": "DESC", "HUM": "HUM"}
    assert as_trained(split("zz_desc", "HUM"), renamed) == renamed
    assert as_trained(split("DESC", "HUM"), renamed) is None  # the trained names: scoring says they are unknown
    swap = {"pos": "neg", "neg": "pos"}
    assert as_trained(split("pos", "neg"), swap) is None
    assert as_trained(split("a", "b"), {"a": "a", "b": "b"}) is None  # nothing renamed

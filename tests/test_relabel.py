"""`frozentune relabel`: a saved classifier's labels renamed, its answers the same but for the names."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from clirun import cli
from conftest import make_tiny_llama, saved_as_before_trained_as

from frozentune import api
from frozentune.relabel import RelabelError, parse_renames, renamed_labels

# the row of bench/bad_input_table.py these cases are recorded under
ROW = ("relabel: a label the model lacks, OLD without =NEW, two labels given one name, an empty name, a folder edited "
       "by hand, damaged, holding other files or not a classifier; eval on data with the names it was trained with")
TEXTS = ["What does NASA stand for ?", "Who wrote Hamlet ?", "How far is the moon ?", "Where is Lima ?"]


@pytest.fixture(scope="module")
def saved(tiny_bert, trec_slice, tmp_path_factory) -> Path:
    """A probe trained on the TREC slice (labels ABBR, DESC, ENTY, HUM, LOC, NUM)."""
    out = tmp_path_factory.mktemp("relabel") / "probe"
    cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 32,
        "--epochs", 2, "--output", out, "--cache-dir", out.parent / "cache", "--quiet", code=0)
    return out


@pytest.fixture
def model(saved, tmp_path) -> Path:
    """A copy of the saved probe, to rename in."""
    return Path(shutil.copytree(saved, tmp_path / "model"))


def answers(folder: Path) -> list[dict]:
    return api.predict(folder, TEXTS)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_rename_in_place_keeps_every_answer_but_the_names(model):
    before, weights = answers(model), load_file(str(model / "model.safetensors"))
    result = json.loads((model / "result.json").read_text())
    cli("relabel", "--model", model, "--rename", "ABBR=abbreviation", "HUM=person", code=0, row=ROW,
        show="renamed")
    names = {"ABBR": "abbreviation", "HUM": "person"}
    after = answers(model)
    for b, a in zip(before, after):
        assert a["label"] == names.get(b["label"], b["label"])
        assert a["scores"] == {names.get(k, k): v for k, v in b["scores"].items()}  # the same numbers, exactly
    assert list(after[0]["scores"]) == ["abbreviation", "DESC", "ENTY", "person", "LOC", "NUM"]
    now = load_file(str(model / "model.safetensors"))
    assert now.keys() == weights.keys() and all(now[k].equal(weights[k]) for k in now)
    config = config_of(model)
    assert config["labels"] == ["abbreviation", "DESC", "ENTY", "person", "LOC", "NUM"]
    assert config["trained_labels"] == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    card = (model / "README.md").read_text()
    assert "`abbreviation`" in card and "`ABBR`" not in card
    hum = result["per_class"]["HUM"]  # the training run's record keeps the names it had; the card shows today's
    assert f"| `person` | {hum['precision']:.2f} | {hum['recall']:.2f} | {hum['f1']:.2f} | {hum['support']} |" in card
    assert json.loads((model / "result.json").read_text()) == result  # the training run's record, as it was
    assert not [p for p in model.parent.iterdir() if p.name.startswith(".")]  # no staging or lock left beside it


def test_swap_and_rename_back(model):
    before = answers(model)
    cli("relabel", "--model", model, "--rename", "DESC=ENTY", "ENTY=DESC", code=0)
    swapped = {"DESC": "ENTY", "ENTY": "DESC"}
    assert [a["label"] for a in answers(model)] == [swapped.get(b["label"], b["label"]) for b in before]
    cli("relabel", "--model", model, "--rename", "DESC=ENTY", "ENTY=DESC", code=0)
    assert answers(model) == before
    assert "trained_labels" not in config_of(model)  # the names it was trained with again: nothing to record


def test_output_leaves_the_original_alone(model, tmp_path):
    original = folder_bytes(model)
    other = tmp_path / "renamed"
    cli("relabel", "--model", model, "--rename", "NUM=number", "--output", other, code=0)
    assert folder_bytes(model) == original
    assert config_of(other)["labels"][-1] == "number"
    cli("relabel", "--model", model, "--rename", "NUM=count", "--output", other, code=2, row=ROW,
        contains=("already holds", "--overwrite"))
    cli("relabel", "--model", model, "--rename", "NUM=count", "--output", other, "--overwrite", code=0)
    assert config_of(other)["labels"][-1] == "count"


def test_eval_on_the_old_names_says_how_to_rename_back(model, trec_slice):
    cli("relabel", "--model", model, "--rename", "HUM=person", code=0)
    cli("eval", "--model", model, "--data", trec_slice, code=2, row=ROW,
        contains=("renamed after training (HUM → person)", f"relabel --model {model} --rename person=HUM"))
    # a name with a space, and a folder with one: the command is quoted so that it runs as written (it split them)
    spaced = Path(shutil.copytree(model, model.parent / "my model"))
    cli("relabel", "--model", spaced, "--rename", "LOC=a place", code=0)
    said = cli("eval", "--model", spaced, "--data", trec_slice, code=2)
    command = said.err.split("rename them back with `")[1].split("`")[0]
    assert command == f"frozentune relabel --model '{spaced}' --rename person=HUM 'a place=LOC'"
    import shlex
    cli(*shlex.split(command)[1:], code=0)  # it runs, and the names are back
    assert {"HUM", "LOC"} <= set(config_of(spaced)["labels"])
    assert api.relabel(spaced, {"HUM": "someone"}, log=None)["renamed"] == {"HUM": "someone"}  # (it raised)


@pytest.mark.parametrize("words, said", [
    (["HUM"], "give OLD=NEW"),
    (["human=person"], "'human' is not a label of the model"),
    (["HUM=LOC"], "two labels would be named 'LOC'"),
    (["HUM=HUM"], "nothing would change"),
    (["HUM=a", "HUM=b"], "renamed twice"),
    (["HUM="], "must be text, not empty"),
    (["HUM= person"], "without spaces at either end"),
    (["HUM=a\nb"], "--rename HUM='a\\nb': a new name must be text, not empty, printable"),  # one line
    # names no data file can carry: a file's True, 1.0 or 01 is read as true, 1, 1 (eval then found them unknown)
    (["HUM=True"], "a data file's label 'True' is read as 'true'"),
    (["HUM=1.0"], "a data file's label '1.0' is read as '1'"),
    (["NUM=e\u0301"], "a data file's label 'e\\u0301' is read as '\\xe9'"),  # (both printed 'é')
])
def test_bad_renames_change_nothing(model, words, said):
    original = folder_bytes(model)
    cli("relabel", "--model", model, "--rename", *words, code=2, row=ROW, contains=said)
    assert folder_bytes(model) == original


def test_a_label_holding_equals_signs():
    assert parse_renames(["a=b=c"], ["a=b", "x"]) == {"a=b": "c"}
    assert parse_renames(["a=b=c"], ["a", "x"]) == {"a": "b=c"}
    with pytest.raises(RelabelError, match="ambiguous"):
        parse_renames(["a=b=c"], ["a", "a=b"])
    assert renamed_labels(["a", "b", "c"], {"a": "c", "c": "a"}) == ["c", "b", "a"]


def test_refused_folders_are_left_as_they_were(model, tmp_path):
    cli("relabel", "--model", model, "--rename", "HUM=person", "--overwrite", code=2, row=ROW,
        contains="without --output")
    edited = config_of(model)  # the old way, by hand: refused at load, and relabel refuses it too
    edited["labels"] = edited["labels"][::-1]
    (model / "config.json").write_text(json.dumps(edited))
    original = folder_bytes(model)
    cli("relabel", "--model", model, "--rename", "HUM=person", code=2, row=ROW,
        contains=("config.json was edited since", "restore that entry"))
    assert folder_bytes(model) == original
    onnx = tmp_path / "graph"
    onnx.mkdir()
    (onnx / "onnx.json").write_text("{}")
    cli("relabel", "--model", onnx, "--rename", "HUM=person", code=2, row=ROW,
        contains=("an ONNX export", "export them again"))


def test_a_folder_holding_files_of_its_own_is_refused_in_its_own_words(model):
    (model / "notes.txt").write_text("mine")
    original = folder_bytes(model)
    cli("relabel", "--model", model, "--rename", "HUM=person", code=2, row=ROW,
        contains=(f"--model {model}: holds a saved model and 1 entry frozentune did not write there (notes.txt)",
                  "move them out; or write the renamed model into a new folder with --output DIR"))
    assert folder_bytes(model) == original


def test_damaged_weights_are_refused(model):
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    cli("relabel", "--model", model, "--rename", "HUM=person", code=2, row=ROW,
        contains=("checksum mismatch", "restore it or train again"))
    assert weights.read_bytes() == bytes(data)


def test_a_generator_has_no_labels(tmp_path):
    from frozentune.backbone import load_causal_lm
    from frozentune.generation.prefix import PrefixTuner
    from frozentune.registry import make_config

    lm_dir = make_tiny_llama(tmp_path / "lm", ["a", "b", "c"])
    lm, tok = load_causal_lm(str(lm_dir))
    PrefixTuner(make_config("prefix", {"prefix_length": 2}), lm, tok, str(lm_dir)).save(
        tmp_path / "gen", extra={"task": "generation"})
    cli("relabel", "--model", tmp_path / "gen", "--rename", "a=b", code=2, row=ROW,
        contains="a generation model, which has no labels")


def test_interrupted_rename_leaves_the_folder_as_it_was(model, monkeypatch):
    import frozentune.export.card as card

    def interrupted(folder):
        raise KeyboardInterrupt

    original = folder_bytes(model)
    monkeypatch.setattr(card, "write_card_from_files", interrupted)
    got = cli("relabel", "--model", model, "--rename", "HUM=person", code=130)
    assert "nothing was changed" in got.err
    assert folder_bytes(model) == original
    assert not [p for p in model.parent.iterdir() if p.name.startswith(".")]


def test_weights_saved_before_the_record_gain_it(model):
    saved_as_before_trained_as(model)
    before = answers(model)
    cli("relabel", "--model", model, "--rename", "LOC=place", code=0)
    assert [a["label"] for a in answers(model)] == [{"LOC": "place"}.get(b["label"], b["label"]) for b in before]
    edited = config_of(model)
    edited["labels"][0], edited["labels"][1] = edited["labels"][1], edited["labels"][0]
    (model / "config.json").write_text(json.dumps(edited))
    with pytest.raises(Exception, match="config.json was edited since"):
        answers(model)


def test_python_api_says_its_own_argument(model):
    got = api.relabel(model, {"HUM": "person"}, log=lambda line: None)
    assert got["renamed"] == {"HUM": "person"} and got["labels"][3] == "person"
    with pytest.raises(RelabelError, match=r"from Python: rename= for --rename"):
        api.relabel(model, {"nobody": "x"})
    with pytest.raises(RelabelError, match="at least one OLD=NEW"):
        api.relabel(model, {})


def test_a_relabelled_model_knows_its_data_under_the_new_names(trec_slice, tiny_bert, tmp_path):
    """After a rename the data must carry the new names, and its rows were then drawn as other data's: a carve
    orders classes by name (DESC → zz_desc moved it last), so a single file's test split was other rows, among them
    training rows, and the digest of the rows the run drew from (which holds the labels) no longer matched, so its
    training rows were not refused. The data is now read under the names the model was trained with."""
    cache = ("--cache-dir", tmp_path / "cache")
    rows = [json.loads(line) for line in (trec_slice / "train.jsonl").read_text().splitlines()]
    original, renamed = tmp_path / "a" / "rows.jsonl", tmp_path / "b" / "rows.jsonl"
    for path, names in ((original, {}), (renamed, {"DESC": "zz_desc", "NUM": "a_num"})):
        path.parent.mkdir()
        path.write_text("".join(json.dumps({"text": r["text"], "label": names.get(r["label"], r["label"])}) + "\n"
                                for r in rows))
    cli("train", "--method", "probe", "--data", original, "--backbone", tiny_bert, "--max-length", 32, "--epochs", 2,
        "--output", tmp_path / "m", *cache, "--quiet", code=0)
    cli("relabel", "--model", tmp_path / "m", "--rename", "DESC=zz_desc", "NUM=a_num", "--output", tmp_path / "r",
        code=0)
    before = json.loads(cli("eval", "--model", tmp_path / "m", "--data", original, *cache, code=0).out)
    after = json.loads(cli("eval", "--model", tmp_path / "r", "--data", renamed, *cache, code=0).out)
    assert after["n"] == before["n"] and after["metrics"]["accuracy"] == before["metrics"]["accuracy"]
    assert after["confusion"]["matrix"] == before["confusion"]["matrix"]  # the same rows, the same answers
    cli("calibrate", "--model", tmp_path / "r", "--data", renamed, "--split", "all", *cache,
        contains="the examples the model was trained on among them")
    cli("compare", "--model", tmp_path / "r", "--model", tmp_path / "m", "--data", renamed, "--split", "train",
        *cache, contains="the examples it was trained on")


def test_the_rename_back_command_runs_where_a_name_begins_with_a_dash(model, trec_slice):
    """A name such as -1 (Hugging Face's unlabelled rows) read as an option in the printed command (argparse:
    "expected at least one argument"); each word is now given as --rename=WORD there, and --rename takes several."""
    import shlex

    cli("relabel", "--model", model, "--rename=HUM=-1", "--rename", "LOC=place", code=0)  # several flags: extended
    assert {"-1", "place"} <= set(config_of(model)["labels"])
    said = cli("eval", "--model", model, "--data", trec_slice, code=2)
    command = said.err.split("rename them back with `")[1].split("`")[0]
    assert command == f"frozentune relabel --model {model} --rename=-1=HUM --rename=place=LOC"
    cli(*shlex.split(command)[1:], code=0)
    assert {"HUM", "LOC"} <= set(config_of(model)["labels"])

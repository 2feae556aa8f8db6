"""`--data` and `--input` as Hugging Face `datasets` output: a DatasetDict or Dataset written by
save_to_disk, Parquet and Arrow files. Class-label columns are read as their names; the same rows
give the same model as the .jsonl files they came from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import cli
from frozentune.data import load_classification, read_records

datasets = pytest.importorskip("datasets", reason="the hf extra: pip install 'frozentune[hf]'")

pytestmark = pytest.mark.usefixtures("one_thread")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def trec_dict(trec_slice, tmp_path_factory) -> tuple[Path, list[str]]:
    """The TREC slice as a DatasetDict (train 100 / validation 20 / test 40) with a ClassLabel
    column, saved with save_to_disk; and the label names."""
    train, test = rows(trec_slice / "train.jsonl"), rows(trec_slice / "test.jsonl")
    names = sorted({r["label"] for r in train + test})
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})

    def make(rs):
        return datasets.Dataset.from_dict({"text": [r["text"] for r in rs],
                                           "label": [names.index(r["label"]) for r in rs]}, features=features)

    dd = datasets.DatasetDict({"train": make(train[:100]), "validation": make(train[100:]), "test": make(test)})
    out = tmp_path_factory.mktemp("hf") / "trec_dd"
    dd.save_to_disk(str(out))
    return out, names


def test_save_to_disk_folder_reads_like_the_files(trec_dict, trec_slice):
    folder, names = trec_dict
    ds = load_classification(str(folder))
    train = rows(trec_slice / "train.jsonl")
    assert ds.train.texts == [r["text"] for r in train[:100]]
    assert ds.train.labels == [r["label"] for r in train[:100]]  # ClassLabel ints came back as names
    assert ds.validation.texts == [r["text"] for r in train[100:]] and len(ds.test) == 40


def test_parquet_and_arrow_files(trec_dict, tmp_path):
    folder, names = trec_dict
    dd = datasets.load_from_disk(str(folder))
    dd["train"].to_parquet(str(tmp_path / "train.parquet"))
    dd["test"].to_parquet(str(tmp_path / "test.parquet"))
    parquet = [r for _, r in read_records(tmp_path / "train.parquet")]
    assert parquet == [r for _, r in read_records(folder / "train")] and parquet[0]["label"] in names  # names kept
    got = load_classification(str(tmp_path))  # train + test files: validation carved from train
    assert len(got.train) + len(got.validation) == 100 and len(got.test) == 40
    arrow = next((folder / "train").glob("*.arrow"))
    recs = read_records(arrow)
    assert recs[0][0] == 1 and recs[0][1]["label"] in names and len(recs) == 100


def test_train_predict_from_hf_data(trec_dict, tiny_bert, tmp_path):
    folder, names = trec_dict
    out = tmp_path / "m"
    cli("train", "--method", "probe", "--data", folder, "--backbone", tiny_bert, "--epochs", "1", "--output", out,
        "--cache-dir", tmp_path / "c", "--quiet", code=0)
    assert json.loads((out / "config.json").read_text())["labels"] == names
    texts = datasets.Dataset.from_dict({"text": ["How far is it from Denver to Aspen ?", "Who wrote Hamlet ?"]})
    texts.to_parquet(str(tmp_path / "q.parquet"))
    texts.save_to_disk(str(tmp_path / "q_folder"))
    for given in (tmp_path / "q.parquet", tmp_path / "q_folder"):
        ans = cli("predict", "--model", out, "--input", given, code=0)
        assert len(ans.out.strip().splitlines()) == 2
    # a DatasetDict folder holds several splits: named, with the folder to give (it said "is a folder; give a file")
    cli("predict", "--model", out, "--input", folder, contains=(f"{folder}: a DatasetDict folder (splits: ",
                                                                f"give the folder of one split, e.g. {folder / 'test'}"))


def test_hf_data_errors(trec_dict, tmp_path):
    folder, names = trec_dict
    bad = tmp_path / "train.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    cli("train", "--method", "probe", "--data", bad, contains=("not readable as parquet", "write it again"))
    # a test split whose labels are -1 (GLUE's unlabelled test sets) is missing labels, said per row
    feats = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})
    dd = datasets.DatasetDict({"train": datasets.load_from_disk(str(folder / "train")),
                               "test": datasets.Dataset.from_dict({"text": ["a", "b"], "label": [-1, -1]}, features=feats)})
    dd.save_to_disk(str(tmp_path / "unlabelled"))
    with pytest.raises(Exception, match=r"test:1: no label in field 'label'"):
        load_classification(str(tmp_path / "unlabelled"))
    # a DatasetDict without a train or validation split
    datasets.DatasetDict({"test": datasets.load_from_disk(str(folder / "test"))}).save_to_disk(str(tmp_path / "only_test"))
    cli("train", "--method", "probe", "--data", tmp_path / "only_test", contains="no train file (found test)")

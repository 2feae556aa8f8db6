"""Bad input through the CLI: data files, options, output folders, saved models, wrong commands.

Each case runs `frozentune ...` as a user would (tests/clirun.py: exit status 2, one line naming
what is wrong and where, no traceback) and checks that nothing was written or changed. The
`row=` texts are the rows of the issue's table; bench/bad_input_table.py builds REPORT.md's
"Bad input" section from what these tests record.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from clirun import cli, swap_while_loading, with_defaults

pytestmark = pytest.mark.usefixtures("one_thread")

R_JSONL = "JSONL with a malformed line (line 1,234 of 5,000)"
R_CSV = "CSV/TSV with a ragged row, a BOM, CRLF line ends, quoted newlines"
R_FIELDS = "--text-field/--label-field not present"
R_EMPTY = "empty text, whitespace-only text, null text or label"
R_LATIN1 = "non-UTF-8 bytes (Latin-1 file)"
R_LABELS = 'labels: one class only; a test label unseen in train; ints vs strings mixed (1 and "1")'
R_OPTIONS = "--epochs 0, --lr -1, --batch-size 0, an option of another method"
R_OUTPUT = "train --output into a folder that holds another model; into a file; into a read-only folder"
R_SAVED = ("a saved model whose model.safetensors is corrupt, whose config.json names an unknown method, "
           "whose weights hash does not match")
R_EVAL = "eval --data a dataset whose labels differ from the model's"
R_PREDICT = "predict --input an empty file, a missing file, a directory"
R_COMMAND = "generate on a classification model, explain on a method without explanations"
R_NUMBERS = "labels 1 and 1.0 in one file; a number where text belongs"
R_INPLACE = "a saved model whose weights were overwritten in place, same size"
R_EARLY = "--output that is a file, a read-only folder or an existing model"
# rows added after the table: cases a new-user walkthrough found (2026-11-25)
R_SURROGATE = "a lone UTF-16 surrogate in a text (JSON's \\ud800; shell bytes that are not UTF-8)"
R_BLANK = "a blank line in the middle of a plain input file or a CSV"


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes (to show a command changed nothing)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def labelled(n: int, labels=("neg", "pos")) -> list[dict]:
    words = ["good", "bad", "fine", "awful", "great", "dull", "fun", "slow"]
    return [{"text": f"{words[i % 8]} film number {i}", "label": labels[i % len(labels)]} for i in range(n)]


def train_args(data: Path, tiny_bert: Path, tmp_path: Path, *extra) -> list:
    """A small train command; `extra` adds options, or replaces --method / --epochs (an option is given once)."""
    return ["train", "--data", data, "--backbone", tiny_bert, "--max-length", 16, "--cache-dir", tmp_path / "cache",
            "--quiet", *with_defaults({"--method": "probe", "--epochs": 1}, extra)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_bert) -> Path:
    """A small trained probe (labels neg / pos) to load, damage and question."""
    root = tmp_path_factory.mktemp("saved")
    write_jsonl(root / "d" / "train.jsonl", labelled(40))
    write_jsonl(root / "d" / "test.jsonl", labelled(10))
    cli(*train_args(root / "d", tiny_bert, root, "--output", root / "model"), code=0)
    return root / "model"


@pytest.fixture
def model_copy(model_dir, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(model_dir, out)
    return out


# ----------------------------------------------------------------------------- data files
def test_malformed_jsonl_line_is_named_and_nothing_cached(tmp_path, tiny_bert):
    rows = labelled(5000)
    rows[1233] = '{"text": "broken line", "label": "pos"'  # line 1,234
    data = write_jsonl(tmp_path / "big.jsonl", rows)
    cli(*train_args(data, tiny_bert, tmp_path), contains=("big.jsonl:1234", "not valid JSON"), row=R_JSONL)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("kind", ["csv", "tsv"])
def test_delimited_bom_crlf_quoted_newlines_read_and_ragged_row_named(tmp_path, tiny_bert, kind):
    sep = "," if kind == "csv" else "\t"
    rows = [row for i in range(10) for row in (f'"a good film {i}, truly{chr(10)}over two lines"{sep}pos', f"a bad film {i}{sep}neg")]
    good = tmp_path / f"good.{kind}"
    good.write_bytes(("\ufeff" + f"text{sep}label\r\n" + "\r\n".join(rows) + "\r\n").encode("utf-8"))
    from frozentune.data import read_split

    split = read_split(good)  # BOM dropped from the header, CRLF and the quoted newline kept right
    assert split.texts[0] == "a good film 0, truly\nover two lines" and split.labels[:2] == ["pos", "neg"]
    assert len(split) == 20
    cli(*train_args(good, tiny_bert, tmp_path), code=0, row=R_CSV, show="trainable parameters")
    ragged = tmp_path / f"ragged.{kind}"
    ragged.write_text(f"text{sep}label\r\nfine film{sep}pos\r\nlost{sep}neg{sep}extra\r\n", encoding="utf-8")
    cli(*train_args(ragged, tiny_bert, tmp_path), contains=(f"ragged.{kind}:3", "3 fields", "header has 2"), row=R_CSV)


def test_missing_fields_list_the_columns_present(tmp_path, tiny_bert):
    data = write_jsonl(tmp_path / "d.jsonl", [{"sentence": "x", "polarity": "pos"}] * 20)
    cli(*train_args(data, tiny_bert, tmp_path), contains=("d.jsonl:1", "'text'", "'sentence', 'polarity'"), row=R_FIELDS)
    cli(*train_args(data, tiny_bert, tmp_path, "--text-field", "sentence"),
        contains=("missing field 'label'", "'sentence', 'polarity'"), row=R_FIELDS)


@pytest.mark.parametrize("bad,what", [
    ({"text": "", "label": "pos"}, "empty text"),
    ({"text": "   \t ", "label": "pos"}, "empty text"),
    ({"text": "\u200b\u2060", "label": "pos"}, "only invisible characters: U+200B"),
    ({"text": None, "label": "pos"}, "holds null"),
    ({"text": "fine", "label": None}, "no label"),
])
def test_empty_or_null_rows_are_errors_with_a_count(tmp_path, tiny_bert, bad, what):
    """Decision: an error, not a skip (a silently smaller test split changes every metric); the
    message names the first line and how many rows share the problem."""
    rows = labelled(30)
    rows[4] = rows[9] = rows[20] = bad
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    cli(*train_args(data, tiny_bert, tmp_path), contains=("d.jsonl:5", what, "3 rows like it", "5, 10, 21"), row=R_EMPTY)


@pytest.mark.parametrize("method", ["probe", "finetune"])  # cached states and the live pass
def test_rows_the_tokenizer_keeps_nothing_of_are_named(tmp_path, tiny_bert, method):
    """Combining accents alone (the uncased WordPiece strips them) passed the blank-text check and were
    trained on, or scored, as [CLS] [SEP]: an error naming the lines, as for an empty text."""
    rows = labelled(40)
    rows[3] = rows[5] = {"text": "\u0301\u0301", "label": "pos"}
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "train.jsonl", rows)
    write_jsonl(tmp_path / "d" / "test.jsonl", labelled(10))
    cli(*train_args(tmp_path / "d", tiny_bert, tmp_path, "--method", method), contains=(
        "train.jsonl: line 4: the tokenizer keeps none of its characters", "(2 rows like it: lines 4, 6)",
        "fix or remove those rows"), row=R_EMPTY)


def test_latin1_file_names_file_and_byte_offset(tmp_path, tiny_bert):
    data = tmp_path / "latin1.jsonl"
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in labelled(20))
    head = len(lines.encode("utf-8"))
    data.write_bytes(lines.encode("utf-8") + '{"text": "café crème", "label": "pos"}\n'.encode("latin-1"))
    offset = head + len('{"text": "caf')
    cli(*train_args(data, tiny_bert, tmp_path), contains=("latin1.jsonl:21", f"byte offset {offset:,}", "0xe9", "iconv"),
        row=R_LATIN1)
    csv = tmp_path / "latin1.csv"
    csv.write_bytes("text,label\n".encode() + "déjà vu,pos\n".encode("latin-1"))
    cli(*train_args(csv, tiny_bert, tmp_path), contains=("latin1.csv", "byte offset 12", "UTF-8"), row=R_LATIN1)


def test_lone_surrogate_in_a_data_file_is_named_not_a_traceback(tmp_path, tiny_bert, model_dir):
    """JSON allows "\\ud800", which as a Python str cannot be encoded (the cache's hash, the tokenizer)."""
    rows = labelled(30)
    rows[6] = '{"text": "abc \\ud800 def", "label": "pos"}'  # line 7, the JSON escape as written
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    cli(*train_args(data, tiny_bert, tmp_path), contains=(
        "d.jsonl:7", "field 'text'", "character offset 4 is a lone UTF-16 surrogate (U+D800)", "Fix or remove"),
        row=R_SURROGATE)
    assert not (tmp_path / "cache").exists()
    inputs = write_jsonl(tmp_path / "in.jsonl", ['{"text": "fine"}', '{"text": "x \\udcff"}'])
    answer = cli("predict", "--model", model_dir, "--input", inputs,
                 contains=("in.jsonl:2", "field 'text'", "character offset 2 is a lone UTF-16 surrogate (U+DCFF)"),
                 row=R_SURROGATE)
    assert "command line" not in answer.err  # it came from a file: not named as a command-line byte


def test_blank_lines_inside_a_plain_input_file_are_named_not_dropped(tmp_path, model_dir):
    """Row i of predict's output answers line i + 1: a blank line dropped in the middle would shift every
    later row. Blank lines at the end are fine."""
    texts = tmp_path / "texts.txt"
    texts.write_text("a fine film\n\na dull film\n   \nan odd film\n\n\n")
    cli("predict", "--model", model_dir, "--input", texts,
        contains=("texts.txt:2", "2 blank lines with texts after them (lines 2, 4)", ".jsonl"), row=R_BLANK)
    texts.write_text("a fine film\na dull film\n\n\n")
    out = cli("predict", "--model", model_dir, "--input", texts, code=0).out.splitlines()
    assert len(out) == 2


def test_blank_csv_row_inside_training_data_is_named(tmp_path, tiny_bert):
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"{r['text']},{r['label']}\n" + ("\n" if i == 3 else "")
                                             for i, r in enumerate(labelled(30))), encoding="utf-8")
    cli(*train_args(data, tiny_bert, tmp_path), contains=("d.csv:6", "a blank line with rows after it"), row=R_BLANK)
    assert not (tmp_path / "cache").exists()


def test_one_class_unseen_test_label_and_mixed_int_string_labels(tmp_path, tiny_bert):
    one = write_jsonl(tmp_path / "one" / "train.jsonl", labelled(20, ("pos",)))
    cli(*train_args(one.parent, tiny_bert, tmp_path), contains=("train.jsonl", "'pos'", "at least two classes"), row=R_LABELS)
    write_jsonl(tmp_path / "unseen" / "train.jsonl", labelled(20))
    write_jsonl(tmp_path / "unseen" / "test.jsonl", labelled(6) + [{"text": "meh", "label": "neutral"}])
    cli(*train_args(tmp_path / "unseen", tiny_bert, tmp_path), contains=("test.jsonl:7", "'neutral'", "never occur in train"),
        row=R_LABELS)
    mixed = [{"text": r["text"], "label": [1, "1", 0, "0"][i % 4]} for i, r in enumerate(labelled(40))]
    out = tmp_path / "mixed-model"
    ans = cli(*train_args(write_jsonl(tmp_path / "mixed.jsonl", mixed), tiny_bert, tmp_path, "--output", out), code=0,
              row=R_LABELS, show="read as one class")
    assert json.loads((out / "config.json").read_text())["labels"] == ["0", "1"]
    assert "read as one class '1'" in ans.out


def test_label_1_and_1_0_are_one_class_and_a_number_is_not_text(tmp_path, tiny_bert):
    rows = [{"text": r["text"], "label": [1, 1.0, 0, 0.0][i % 4]} for i, r in enumerate(labelled(40))]
    out = tmp_path / "m"
    ans = cli(*train_args(write_jsonl(tmp_path / "d.jsonl", rows), tiny_bert, tmp_path, "--output", out), code=0,
              row=R_NUMBERS, show="read as one class")
    assert json.loads((out / "config.json").read_text())["labels"] == ["0", "1"]
    assert "labels 1, 1.0 read as one class '1'" in ans.out
    rows[7] = {"text": 42, "label": 1}
    cli(*train_args(write_jsonl(tmp_path / "n.jsonl", rows), tiny_bert, tmp_path), contains=("n.jsonl:8", "holds a number, not text (42)"),
        row=R_NUMBERS)


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize("argv,needle", [
    (["--epochs", 0], "--epochs 0: must be at least 1"),
    (["--lr", -1], "--lr -1.0: must be a finite positive number"),
    (["--batch-size", 0], "--batch-size 0: must be at least 1"),
    (["--warmup", 2], "--warmup 2.0"),
    (["--seed", -1], "--seed -1: must be a whole number from 0 to 4294967295"),
    (["--num-labels", 3], "unknown option(s) --num-labels 3 for method 'probe'"),
    (["--span-width", 3], "unknown option(s) --span-width 3 for method 'probe'"),
    (["--dropout", 2], "probe: --dropout 2.0: give a probability in [0, 1) (0: off)"),
])
def test_bad_training_options_refused_before_any_work(tmp_path, tiny_bert, argv, needle):
    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    ans = cli(*train_args(data, tiny_bert, tmp_path, "--output", tmp_path / "out", *argv), contains=needle, row=R_OPTIONS)
    assert ans.message.startswith("frozentune: error: " + needle.split()[0])  # the option first, no dict of them
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- output folders
@contextlib.contextmanager
def read_only_folder(path: Path):
    """A folder nobody can write to, this process included. As root (which ignores mode bits) a
    read-only tmpfs is mounted there; otherwise the mode is 0o555."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"running as root, and mounting a read-only tmpfs failed ({got.stderr.strip()}): "
                    f"no way to make a folder root cannot write to")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_output_checked_before_any_work(tmp_path, tiny_bert, model_dir):
    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    cli(*train_args(data, tiny_bert, tmp_path, "--output", a_file), contains=("a_file", "is a file"), row=R_EARLY)
    assert a_file.read_text() == "keep me"
    existing = tmp_path / "existing"
    shutil.copytree(model_dir, existing)
    before = tree(existing)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", existing), contains=("already holds a saved model", "--overwrite"),
        row=R_EARLY)
    assert tree(existing) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    cli(*train_args(data, tiny_bert, tmp_path, "--output", other), contains=("not empty", "notes.txt"), row=R_OUTPUT)
    with read_only_folder(tmp_path / "ro") as ro:
        cli(*train_args(data, tiny_bert, tmp_path, "--output", ro / "model"), contains=("not writable",), row=R_EARLY)
    # refused before any extraction: no cache entry was built by any of these
    assert not (tmp_path / "cache").exists()


R_WRITERS = ("two runs (train, sweep, pretrain) given one --output at the same time (one threw its model away at the "
             "end; with --overwrite, one replaced the other's unseen)")


def test_a_second_writer_of_one_output_is_refused_at_its_start(tmp_path, tiny_bert, model_dir):
    """Two runs given one --output both trained; at the end the later one threw its model away (the folder held a
    model by then), or with --overwrite replaced the other's without a word, and two pretrains interleaved their
    checkpoints. A run holds its --output from start to end: another is refused before any work, naming it."""
    from frozentune import locks

    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    out = tmp_path / "m"
    shutil.copytree(model_dir, out)
    before = tree(out)
    lock = tmp_path / ".m.lock"
    fd = locks.acquire(lock, wait=False)  # what a run writing into m holds (this test's process, for it)
    try:
        said = (f"--output {out}: process {os.getpid()} is writing a run into it now; wait for it to end",)
        cli(*train_args(data, tiny_bert, tmp_path, "--output", out, "--overwrite"), contains=said, row=R_WRITERS)
        cli("pretrain", "--corpus", data, "--steps", 2, "--layers", 1, "--dim", 32, "--heads", 2, "--ffn-dim", 64,
            "--output", out, contains=said, row=R_WRITERS)
        cli("sweep", "--data", data, "--backbone", tiny_bert, "--methods", "probe", "--layers", "-1", "--cache-dir",
            tmp_path / "cache", "--output", out, "--overwrite", contains=said, row=R_WRITERS)
        assert tree(out) == before and not (tmp_path / "cache").exists()  # refused before any work
    finally:
        locks.release(lock, fd)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", out, "--overwrite"), code=0)  # free again
    assert tree(out) != before and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    # a run refused for its data leaves no folder its lock made on the way to a new --output
    cli(*train_args(tmp_path / "nope.jsonl", tiny_bert, tmp_path, "--output", tmp_path / "new" / "deep" / "m"),
        contains="nope.jsonl")
    assert not (tmp_path / "new").exists()


def test_output_into_model_file_read_only_and_overwrite(tmp_path, tiny_bert, model_dir):
    data = write_jsonl(tmp_path / "d.jsonl", labelled(30, ("a", "b")))
    existing = tmp_path / "existing"
    shutil.copytree(model_dir, existing)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", existing), contains="already holds a saved model", row=R_OUTPUT)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", existing / "config.json"), contains="is a file", row=R_OUTPUT)
    with read_only_folder(tmp_path / "ro") as ro:
        cli(*train_args(data, tiny_bert, tmp_path, "--output", ro), contains="not writable", row=R_OUTPUT)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", existing, "--overwrite"), code=0)
    assert json.loads((existing / "config.json").read_text())["labels"] == ["a", "b"]
    assert not list(tmp_path.glob(".existing.*")), "no staging folder left beside the output"


def test_overwrite_replaces_only_what_frozentune_wrote(tmp_path, tiny_bert, model_dir):
    """--overwrite replaces a folder whole, so a folder holding anything frozentune did not write there
    (a user's notes, a subfolder, a Hugging Face model) is refused, named, and left as it was."""
    data = write_jsonl(tmp_path / "d.jsonl", labelled(30, ("a", "b")))
    saved = tmp_path / "saved"
    cli(*train_args(data, tiny_bert, tmp_path, "--output", saved), code=0)
    assert (saved / ".frozentune-files").is_file()
    (saved / "notes.txt").write_text("mine")
    (saved / "sub").mkdir()
    before = tree(saved)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", saved, "--overwrite"),
        contains=("2 entries frozentune did not write", "notes.txt", "sub", "move them out"))
    assert tree(saved) == before and (saved / "sub").is_dir()
    (saved / "notes.txt").unlink()
    (saved / "sub").rmdir()
    cli(*train_args(data, tiny_bert, tmp_path, "--output", saved, "--overwrite"), code=0)
    # a folder saved before manifests: frozentune's own kinds of file are replaced, others refused
    earlier = tmp_path / "earlier"
    shutil.copytree(model_dir, earlier)
    (earlier / ".frozentune-files").unlink(missing_ok=True)
    (earlier / "my_notes.txt").write_text("mine")
    cli(*train_args(data, tiny_bert, tmp_path, "--output", earlier, "--overwrite"), contains=("my_notes.txt",))
    (earlier / "my_notes.txt").unlink()
    cli(*train_args(data, tiny_bert, tmp_path, "--output", earlier, "--overwrite"), code=0)
    # a Hugging Face model folder is not frozentune's to replace
    hf = tmp_path / "hf"
    shutil.copytree(tiny_bert, hf)
    before = tree(hf)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", hf, "--overwrite"), contains=("frozentune did not save",))
    assert tree(hf) == before


def test_output_through_links_and_into_folders_that_cannot_be_renamed(tmp_path, tiny_bert, model_dir):
    """A link to nothing crashed after training (a folder renamed onto it); a link to a folder was replaced
    by a folder, its target left empty and a link to it left behind; an existing folder that cannot be
    renamed (a mount point, or inside a read-only folder) crashed after training or was refused though
    writable. Now: refused before any work, written through, written in place."""
    data = write_jsonl(tmp_path / "d.jsonl", labelled(30, ("a", "b")))
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    cli(*train_args(data, tiny_bert, tmp_path, "--output", dangling), contains=("a link to", "which does not exist"))
    assert not (tmp_path / "cache").exists()  # before any extraction
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", link), code=0)
    assert link.is_symlink() and (target / "config.json").is_file()
    cli(*train_args(data, tiny_bert, tmp_path, "--output", link, "--overwrite"), code=0)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # nothing left beside it
    if os.geteuid() == 0:  # a mount point inside a read-only mount: only root can make one
        holder = tmp_path / "holder"
        holder.mkdir()
        mounted = []
        try:
            for where, opts in ((holder, "size=1m"), (holder / "volume", "size=4m")):
                if where == holder / "volume":
                    where.mkdir()
                got = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True)
                if got.returncode != 0:
                    pytest.skip(f"mounting a tmpfs failed: {got.stderr.decode().strip()}")
                mounted.append(where)
            subprocess.run(["mount", "-o", "remount,ro", str(holder)], check=True)
            volume = holder / "volume"
            cli(*train_args(data, tiny_bert, tmp_path, "--output", volume), code=0)
            cli(*train_args(data, tiny_bert, tmp_path, "--output", volume, "--overwrite"), code=0)
            assert (volume / "config.json").is_file() and not [p for p in volume.iterdir() if p.name.startswith(".p")]
            assert json.loads((volume / ".frozentune-files").read_text()) == sorted(
                p.name for p in volume.iterdir() if p.name != ".frozentune-files")
        finally:
            for where in reversed(mounted):
                subprocess.run(["umount", str(where)], check=True)
    else:  # a writable folder in a read-only one
        holder = tmp_path / "holder"
        (holder / "mine").mkdir(parents=True)
        holder.chmod(0o555)
        try:
            cli(*train_args(data, tiny_bert, tmp_path, "--output", holder / "mine"), code=0)
            assert (holder / "mine" / "config.json").is_file()
        finally:
            holder.chmod(0o755)


def test_a_backbone_folder_given_relative_is_saved_absolute(tmp_path, tiny_bert, monkeypatch):
    """--backbone "my bb" (a folder relative to where train ran) was saved as typed, so the model loaded
    only from that folder: predict elsewhere said the backbone folder does not exist."""
    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    (tmp_path / "a").mkdir()
    shutil.copytree(tiny_bert, tmp_path / "a" / "my bb")
    monkeypatch.chdir(tmp_path / "a")
    cli("train", "--method", "probe", "--data", data, "--backbone", "my bb", "--max-length", 16, "--epochs", 1,
        "--cache-dir", tmp_path / "cache", "--quiet", "--output", tmp_path / "m", code=0)
    saved = json.loads((tmp_path / "m" / "config.json").read_text())["backbone"]["name"]
    assert saved == str(tmp_path / "a" / "my bb")
    monkeypatch.chdir(tmp_path)
    cli("predict", "--model", tmp_path / "m", "a fine film", code=0)


def test_a_model_saved_with_a_relative_backbone_path_says_where_the_name_comes_from(tmp_path, tiny_bert, monkeypatch):
    """A model saved before 2026-11-27 names its backbone folder as typed ("my bb"). From another folder,
    predict (and serve) said the folder does not exist and to give a local folder, which they take no option
    for, and never that the name came from the model's config.json."""
    from frozentune.model import ModelLoadError
    from frozentune.serve.models import load_tasks

    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    (tmp_path / "a").mkdir()
    shutil.copytree(tiny_bert, tmp_path / "a" / "my bb")
    cli(*train_args(data, tmp_path / "a" / "my bb", tmp_path, "--output", tmp_path / "m"), code=0)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["backbone"]["name"] = "my bb"  # as an older frozentune saved it
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path / "a")
    cli("predict", "--model", tmp_path / "m", "a fine film", code=0)  # from the folder training ran in: found
    monkeypatch.chdir(tmp_path)
    says = (f"{tmp_path / 'm' / 'config.json'} names its backbone by the relative path 'my bb', which is no folder "
            f"from here ({tmp_path}): a frozentune before 2026-11-27 saved a folder's path as typed, relative to where "
            f"training ran. Run from the folder training ran in, or set backbone.name in "
            f"{tmp_path / 'm' / 'config.json'} to that folder's absolute path")
    cli("predict", "--model", tmp_path / "m", "a fine film", contains=says)
    with pytest.raises(ModelLoadError, match=re.escape(says)):
        load_tasks([tmp_path / "m"], None, None, lambda line: None)


def test_a_backbone_whose_config_changed_since_training_is_refused(tmp_path, tiny_bert):
    """The same weights under an edited config.json (another head count) give other states: a model
    loaded silently and predicted from them. A model saved before config_hash existed still loads."""
    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    shutil.copytree(tiny_bert, tmp_path / "bb")
    cli(*train_args(data, tmp_path / "bb", tmp_path, "--output", tmp_path / "m"), code=0)
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["backbone"]["config_hash"]
    config = json.loads((tmp_path / "bb" / "config.json").read_text())
    (tmp_path / "bb" / "config.json").write_text(json.dumps(dict(config, num_attention_heads=1)))
    cli("predict", "--model", tmp_path / "m", "a fine film", contains=("another config.json", "head count"),
        row=R_SAVED)
    (tmp_path / "bb" / "config.json").write_text(json.dumps(dict(config, hidden_dropout_prob=0.3)))
    cli("predict", "--model", tmp_path / "m", "a fine film", code=0)  # dropout does not change the states


def test_a_data_file_named_in_bytes_that_are_not_utf8_trains_and_saves(tmp_path, tiny_bert, monkeypatch):
    """A --data path holding a byte that is not UTF-8 (Python: a lone surrogate) trained, then failed to
    write the model card (UnicodeEncodeError), losing the model; and FROZENTUNE_CACHE set but empty put
    the cache in the working folder."""
    from frozentune.cache import default_root

    data = write_jsonl(tmp_path / os.fsdecode(b"bad\xff.jsonl"), labelled(30))
    cli(*train_args(data, tiny_bert, tmp_path, "--output", tmp_path / "m"), code=0)
    assert "# probe on bad\\udcff" in (tmp_path / "m" / "README.md").read_text(encoding="utf-8")
    # a model saved under such a name loads (safetensors takes no such path: it was called damaged)
    named = tmp_path / os.fsdecode(b"m\xe9")
    cli(*train_args(data, tiny_bert, tmp_path, "--output", named), code=0)
    cli("predict", "--model", named, "a fine film", code=0)
    monkeypatch.setenv("FROZENTUNE_CACHE", "")
    assert default_root() == Path.home() / ".cache" / "frozentune" / "features"


def test_output_dot_and_folders_written_in_place_beside_another_run(tmp_path, tiny_bert, monkeypatch):
    """`--output .` trained, then refused its own staging folder (a path with no name stages inside itself).
    A folder written in place (a mount point) refused a fresh volume's lost+found, and a second run writing
    there failed on the first's staging folder after all its work, or would have moved it away."""
    import errno

    import frozentune.output as O

    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", "."), code=0)
    assert (here / "config.json").is_file() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    volume = tmp_path / "volume"
    (volume / "lost+found").mkdir(parents=True)
    other = volume / f".partial-{os.getpid()}-0123abcd"  # a run under way (this process: alive)
    other.mkdir()
    monkeypatch.setattr(O, "_in_place", lambda output: output.is_dir())
    monkeypatch.setattr(O.os.path, "ismount", lambda p: Path(p) == volume)
    for _ in range(2):  # the second time, over the model the first wrote
        with O.staged_output(volume, overwrite=True) as folder:
            (folder / "config.json").write_text('{"format": "frozentune/1"}')
    assert sorted(p.name for p in volume.iterdir()) == [".frozentune-files", other.name, "config.json", "lost+found"]
    with pytest.raises(OSError) as err:  # a write's error names no file: the --output is named
        with O.staged_output(tmp_path / "full") as folder:
            raise OSError(errno.ENOSPC, "No space left on device")
    assert err.value.filename == str(tmp_path / "full")


def test_a_pretrain_checkpoint_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """torch's writer hid the full disk's OSError under a RuntimeError (a traceback), and the half-written
    step folder kept its space until the next run."""
    import errno

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a small corpus\n" for i in range(50)))
    real = Path.write_bytes

    def full(self, data):
        if self.name == "optimizer.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    out = tmp_path / "pt"
    cli("pretrain", "--arch", "light", "--corpus", corpus, "--steps", 1, "--layers", 1, "--dim", 32, "--heads", 2,
        "--ffn-dim", 64, "--max-length", 16, "--device", "cpu", "--output", out,
        contains=("optimizer.pt: no space left on its device",))
    assert not list(out.glob(".tmp-*"))


def test_permission_denied_names_the_folder_that_shuts_the_way(tmp_path, monkeypatch):
    """Refused a file inside a folder it may not enter, the message named the file (one that may not exist,
    e.g. sweep.json looked for in a model folder) and an `ls -ld` of it that cannot answer either."""
    import frozentune.cli as C

    shut = tmp_path / "secret"
    (shut / "model").mkdir(parents=True)
    monkeypatch.setattr(C.os, "access", lambda p, mode: Path(p) != shut)
    line = C._environment_line(PermissionError(13, "Permission denied", str(shut / "model" / "sweep.json")))
    assert line.startswith(f"{shut}: permission denied; give this user access to it (ls -ld {shut} ")


def test_pretrain_output_checked_before_any_work(tmp_path):
    """pretrain writes into its --output as it runs and checked only that it was not a file: a read-only
    folder, or a link to nothing, failed with a traceback once the corpus and the model were built."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a small corpus\n" for i in range(50)))
    args = ("pretrain", "--arch", "light", "--corpus", corpus, "--steps", 1, "--layers", 1, "--dim", 32, "--heads", 2,
            "--ffn-dim", 64, "--max-length", 16, "--output")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    cli(*args, dangling, contains=("a link to", "which does not exist"))
    with read_only_folder(tmp_path / "ro") as ro:
        cli(*args, ro, contains=("not writable",))
        cli(*args, ro / "new", contains=("not writable",))


def test_files_it_may_not_read_and_a_full_disk_are_one_line(tmp_path, tiny_bert, monkeypatch):
    """An unreadable data file (and folder, model, cache) and a disk that filled while the model was saved
    gave tracebacks, the latter after all the training. Each is one line naming the file and what to do,
    exit 2; a failed save leaves no output folder."""
    import builtins

    from safetensors import SafetensorError

    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    real_open = builtins.open

    def locked(file, *a, **k):  # root reads any file whatever its mode, so the refusal is made here
        if Path(str(file)) == data:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", locked)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", tmp_path / "m"), contains=(str(data), "permission denied",
                                                                                       "ls -ld"))
    monkeypatch.setattr(builtins, "open", real_open)

    def full(*a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("safetensors.torch.save_file", full)
    cli(*train_args(data, tiny_bert, tmp_path, "--output", tmp_path / "m"),
        contains=(f"{tmp_path / 'm'}: no space left on its device", "the output folder is as it was"))
    assert not (tmp_path / "m").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ----------------------------------------------------------------------------- saved models
def test_damaged_saved_models_refuse_to_load(model_copy):
    weights = model_copy / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    cli("predict", "--model", model_copy, "fine", contains=("model.safetensors", "checksum mismatch"), row=R_SAVED)
    weights.write_bytes(b"\x00" * 16)
    cli("predict", "--model", model_copy, "fine", contains=("model.safetensors", "16 bytes"), row=R_SAVED)
    weights.write_bytes(good)
    config = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({**config, "method": "telepathy"}))
    cli("predict", "--model", model_copy, "fine", contains=("config.json", "unknown method 'telepathy'"), row=R_SAVED)
    (model_copy / "config.json").write_text(json.dumps({**config, "weights_file": {**config["weights_file"], "blake2b": "0" * 32}}))
    cli("predict", "--model", model_copy, "fine", contains=("checksum mismatch",), row=R_SAVED)
    (model_copy / "config.json").write_text("{not json")
    cli("eval", "--model", model_copy, "--data", model_copy, contains=("config.json", "not valid JSON"), row=R_SAVED)


def test_a_model_saved_before_checksums_loads_unverified_and_says_so(model_copy):
    """Models saved before 2026-11-23 (before config.json recorded model.safetensors' checksum) were refused by
    every command ("train it again"), though their weights still load and predict exactly. They now load,
    with one line saying the file is not verified; a checksum that is there but malformed is still refused."""
    good = cli("predict", "--model", model_copy, "fine", code=0)
    config = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "weights_file"}))
    old = cli("predict", "--model", model_copy, "fine", code=0)
    assert old.out == good.out
    assert "loaded unverified" in old.err and "did not record the checksum" in old.err
    (model_copy / "config.json").write_text(json.dumps({**config, "weights_file": "abc"}))
    cli("predict", "--model", model_copy, "fine", contains=("weights_file", "damaged"))


def test_saved_files_that_cannot_be_read_are_named(model_copy, monkeypatch):
    """A config.json or model.safetensors the user may not read (as root, chmod cannot show it: the
    read is made to fail as it would) is named with what to check, not a PermissionError traceback."""
    import frozentune.model as M

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    with monkeypatch.context() as m:
        m.setattr(M, "file_checksum", denied)
        cli("predict", "--model", model_copy, "fine", contains=("model.safetensors: cannot be read",
                                                               "Permission denied", "check its permissions"))
    with monkeypatch.context() as m:
        m.setattr(Path, "read_text", denied)
        cli("predict", "--model", model_copy, "fine", contains=("config.json: cannot be read", "check its permissions"))


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.pop("labels"), '"labels" is missing'),
    (lambda c: c.update(labels="ab"), '"labels" is "ab", not a list'),
    (lambda c: c.update(labels=["a", "a"]), "not a list of distinct names"),  # loaded and answered "a" for both
    (lambda c: c.update(labels=["a", "b", "c"]), 'labels is ["a", "b", "c"], but model.safetensors was trained with '
                                                 '["neg", "pos"]'),
    (lambda c: c["backbone"].update(max_length="x"), '"backbone"."max_length" is "x"'),
    (lambda c: c["backbone"].update(layers=5), '"backbone"."layers" is 5'),
    (lambda c: c["backbone"].update(combine=3), '"backbone"."combine" is 3'),  # loaded, and meant nothing
    (lambda c: c["backbone"].update(precision="fp64"), '"backbone"."precision" is "fp64"'),
    (lambda c: c["backbone"].update(cache_dtype="int3"), '"backbone"."cache_dtype" is "int3"'),
    (lambda c: c.update(options=[]), '"options" is []'),
    (lambda c: c["train"].update(seed="x"), '"train"."seed" is "x"'),
    # found by bench/fuzz.py (part model): a TypeError (unhashable), KeyErrors, and a model that then asked for pairs
    (lambda c: c.update(method=["probe"]), "names a method this frozentune does not have (unknown method ['probe']"),
    (lambda c: c["backbone"].update(precision=["fp32"]), '"backbone"."precision" is ["fp32"]'),
    (lambda c: c["backbone"].pop("weights_hash"), '"backbone"."weights_hash" is missing'),
    (lambda c: c["weights_file"].pop("bytes"), "its checksum of model.safetensors ('weights_file') is not what"),
    (lambda c: c.update(text_pair_field=""), '"text_pair_field" is "", not the name of a text field'),
], ids=["no-labels", "labels-string", "labels-twice", "labels-count", "max-length", "layers", "combine", "precision",
        "cache-dtype", "options", "seed", "method-list", "precision-list", "no-weights-hash", "checksum-no-bytes",
        "pair-field-empty"])
def test_a_hand_edited_config_is_named_not_a_traceback(model_copy, edit, needle):
    """config.json edited by hand: each entry frozentune cannot use is named in one line (several ended in a
    KeyError or TypeError traceback; labels as one string, or twice the same, loaded and answered wrongly)."""
    config = json.loads((model_copy / "config.json").read_text())
    edit(config)
    (model_copy / "config.json").write_text(json.dumps(config))
    cli("predict", "--model", model_copy, "fine", contains=("config.json", needle), row=R_SAVED)


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.update(labels=c["labels"][::-1]), 'labels is ["pos", "neg"], but model.safetensors was trained with '
                                                   '["neg", "pos"]'),
    (lambda c: c["options"].update(pooling="cls"), 'options.pooling is "cls", but model.safetensors was trained with '
                                                   '"mean"'),
    (lambda c: c["backbone"].update(layers=[-2]), "backbone.layers is [-2], but model.safetensors was trained with [-1]"),
    (lambda c: c["backbone"].update(token_types=False), "backbone.token_types is false, but model.safetensors was "
                                                        "trained with true"),
    (lambda c: c.update(text_pair_field="b"), "pairs is true, but model.safetensors was trained with false"),
], ids=["labels-order", "pooling", "layers", "token-types", "pairs"])
def test_an_edit_the_weights_answer_by_is_refused(model_copy, edit, needle):
    """config.json edited in an entry the weights were trained with (labels in another order, another pooling or
    layer) loaded and answered without a word, wrongly: "neg" for what the model scored "pos" (bench/fuzz.py's
    model part). The weights record those entries; the edit is named with both values."""
    config = json.loads((model_copy / "config.json").read_text())
    edit(config)
    (model_copy / "config.json").write_text(json.dumps(config))
    cli("predict", "--model", model_copy, "fine", contains=("config.json", needle, "restore that entry"), row=R_SAVED)


def test_edits_the_weights_do_not_answer_by_still_load(model_copy, model_dir):
    """What may change in config.json: the backbone's name (moved, or given as an alias), max_length, the training
    record; the model answers as before."""
    config = json.loads((model_copy / "config.json").read_text())
    config["train"]["epochs"], config["backbone"]["max_length"] = 99, 12
    config["backbone"]["name"] = str(Path(config["backbone"]["name"]).resolve())
    (model_copy / "config.json").write_text(json.dumps(config))
    answer = lambda folder: cli("predict", "--model", folder, "fine film", "dull", code=0).out  # noqa: E731
    assert answer(model_copy) == answer(model_dir)


def test_weights_saved_before_they_recorded_their_entries_still_load(model_copy, model_dir):
    """Weights saved before 2026-11-29 hold only the method in their metadata: they load and answer as they did, and
    an edit of labels to another count is caught as before, by the weights' shapes."""
    from conftest import saved_as_before_trained_as

    config = saved_as_before_trained_as(model_copy)
    answer = lambda folder: cli("predict", "--model", folder, "fine film", "dull", code=0).out  # noqa: E731
    assert answer(model_copy) == answer(model_dir)
    (model_copy / "config.json").write_text(json.dumps(config | {"labels": ["a", "b", "c"]}))
    cli("predict", "--model", model_copy, "fine", contains=("the weights do not fit config.json (3 labels",))


def test_corrupt_safetensors_with_matching_checksum_is_refused(model_copy):
    """The checksum guards against change; a file that was saved broken still fails in one line."""
    from frozentune.model import file_checksum

    weights = model_copy / "model.safetensors"
    weights.write_bytes(b"this is not a safetensors file")
    config = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({**config, "weights_file": file_checksum(weights)}))
    cli("predict", "--model", model_copy, "fine", contains=("model.safetensors", "not a readable safetensors file"), row=R_SAVED)


def test_weights_overwritten_in_place_same_size(model_copy):
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    weights = model_copy / "model.safetensors"
    size = weights.stat().st_size
    state = load_file(str(weights))
    with safe_open(str(weights), "np") as f:  # the same metadata: the same size
        metadata = f.metadata()
    save_file({k: np.full_like(v, np.nan) for k, v in state.items()}, str(weights), metadata=metadata)
    assert weights.stat().st_size == size
    ans = cli("predict", "--model", model_copy, "fine", contains=("same size", "checksum mismatch"), row=R_INPLACE)
    assert ans.out == ""
    # even with the checksum made to match, NaN weights are refused, never printed as an answer
    from frozentune.model import file_checksum

    config = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({**config, "weights_file": file_checksum(weights)}))
    ans = cli("predict", "--model", model_copy, "fine", contains="NaN or infinite weights", row=R_INPLACE)
    assert ans.out == ""


def test_a_model_replaced_while_it_loads_is_said_not_mixed(tmp_path, model_dir, monkeypatch):
    """predict read config.json (labels, checksum), loaded the backbone for seconds, then read model.safetensors
    again by path: a `train --overwrite` that swapped the folder in between gave the old labels with the new
    weights, exit 0 (wrong answers). The weights parsed are now the bytes the config read names."""
    from frozentune import model as M

    m, new = tmp_path / "m", tmp_path / "new"
    shutil.copytree(model_dir, m)
    shutil.copytree(model_dir, new)  # another run's model: other weights, its labels the other way round
    config = swap_while_loading(monkeypatch, m, new, lambda c: c.update(labels=c["labels"][::-1]))
    with pytest.raises(M.ModelLoadError, match="was replaced while it was being loaded .*run the command again"):
        M.load(m)
    monkeypatch.undo()
    assert M.load(m).labels == config["labels"]  # run again: the new model, whole


def test_eval_on_data_with_other_labels_names_them(tmp_path, model_dir):
    data = write_jsonl(tmp_path / "other" / "train.jsonl", labelled(20, ("neg", "neutral")))
    write_jsonl(tmp_path / "other" / "test.jsonl", labelled(6, ("neg", "neutral")))
    cli("eval", "--model", model_dir, "--data", tmp_path / "other", "--cache-dir", tmp_path / "cache",
        contains=("'neutral'", "not among the model's", "'pos' do not occur"), row=R_EVAL)
    assert data.exists()


def test_predict_input_empty_missing_directory(tmp_path, model_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    cli("predict", "--model", model_dir, "--input", empty, contains=("empty.txt", "empty"), row=R_PREDICT)
    cli("predict", "--model", model_dir, "--input", tmp_path / "nope.txt", contains=("nope.txt", "no such file"), row=R_PREDICT)
    cli("predict", "--model", model_dir, "--input", tmp_path, contains=("is a folder",), row=R_PREDICT)
    good = tmp_path / "texts.txt"
    good.write_text("a fine film\na dull film\n")
    rows = [json.loads(line) for line in cli("predict", "--model", model_dir, "--input", good, code=0).out.splitlines()]
    assert [r["label"] in ("neg", "pos") for r in rows] == [True, True]


def test_wrong_command_for_the_model_says_what_it_supports(model_dir):
    cli("generate", "--model", model_dir, "name[Aromi]", contains=("classifier", "supports predict, eval"), row=R_COMMAND)
    cli("explain", "--model", model_dir, "fine", contains=("no explanation", "supports predict, eval", "ytuning"),
        row=R_COMMAND)


def test_other_options_refused_before_any_work(tmp_path, tiny_bert):
    data = write_jsonl(tmp_path / "d.jsonl", labelled(30))
    cli(*train_args(data, tiny_bert, tmp_path, "--max-train", 1), contains="--max-train 1: give at least 2", row=R_OPTIONS)
    cli("cache", data, "--backbone", tiny_bert, "--cache-dir", tmp_path / "cache", "--splits", "tran",
        contains="--splits tran: choose among train, validation, test", row=R_OPTIONS)
    assert not (tmp_path / "cache").exists()
    a_file = tmp_path / "ckpt"
    a_file.write_text("keep me")
    cli("pretrain", "--arch", "light", "--corpus", data, "--output", a_file, "--steps", 1,
        contains=("ckpt", "is a file"), row=R_EARLY)
    assert a_file.read_text() == "keep me"


R_TWICE = "--model given twice (argparse kept the last; the first was dropped without a word)"


@pytest.mark.parametrize("argv", [["generate", "--model", "A", "--model", "B", "a source"],
                                  ["predict", "--model", "A", "text", "--model", "B"],
                                  ["eval", "--model", "A", "--model", "B", "--data", "d"],
                                  ["explain", "--model", "A", "--model", "B", "text"],
                                  ["plot-concepts", "--model", "A", "--model", "B", "--data", "d"],
                                  ["export", "--model", "A", "B", "--model", "C", "--format", "peft", "--output", "o"]])
def test_a_repeated_model_is_refused(argv):
    """Refused by the parser, before any folder is read (none of these exist)."""
    first = "A B" if argv[0] == "export" else "A"
    cli(*argv, contains=("--model", f"given twice ({first}, then {argv[argv.index('--model', 2) + 1]})", "give it once"),
        row=R_TWICE)


@pytest.mark.parametrize("argv, option", [
    (["predict", "--model", "M", "--input", "a.txt", "--input", "b.txt"], "--input"),
    (["train", "--method", "probe", "--data", "X", "--data", "Y"], "--data"),
    (["train", "--method", "ytuning", "--data", "X", "--layers", "1", "--layers", "2"], "--layers"),  # a method's own
    (["explain", "--model", "M", "--top", "3", "--top", "5", "text"], "--top"),
    (["sweep", "--data", "X", "--methods", "probe", "--methods", "space"], "--methods"),
])
def test_any_option_of_one_value_given_twice_is_refused(argv, option):
    """Every option that takes one value was last-wins, so a script that built `--input a --input b` read b
    alone, saying nothing; only --model was refused."""
    cli(*argv, contains=(f"argument {option}: given twice", "give it once"))


@pytest.mark.parametrize("argv", [["pretrain", "--arch", "light", "--corpus", "c.txt"],
                                  ["plot-concepts", "--model", "M", "--data", "d"],
                                  ["train", "--method", "probe", "--data", "d"]])
def test_output_dash_is_refused(argv):
    """`--output -` made a folder (pretrain, train) or a picture (-.png) named "-": a user means standard output."""
    cli(*argv, "--output", "-", contains=f"--output -: {argv[0]} writes files, not to standard output")


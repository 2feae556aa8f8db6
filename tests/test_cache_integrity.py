"""Damaged, edited or swapped feature-cache entries through the CLI.

Each case builds entries with `frozentune cache` (tiny BERT, a TREC slice), damages one the way
a user, a disk or a sync tool might, and runs `frozentune cache` / `frozentune train` again: exit
status 2, one line naming the entry and the way out (--rebuild-cache), no traceback, never states
read silently; nothing half-written is left and --rebuild-cache then fixes it. `row=` texts are
the rows of the issue's table (tests/clirun.py records them for REPORT.md).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from clirun import cli
from frozentune.cache import CachedStates, meta_sha

pytestmark = pytest.mark.usefixtures("one_thread")

R_DAMAGED = "a cache entry truncated, a shard file deleted, meta.json edited"
R_SWAPPED = "a cache entry whose files were replaced by another entry's; dim or dtype edited in meta.json"


def cache_args(data: Path, tiny_bert: Path, root: Path, *extra) -> list:
    return ["cache", data, "--backbone", tiny_bert, "--cache-dir", root, "--max-length", 32, "--quiet", *extra]


def train_args(data: Path, tiny_bert: Path, root: Path, output: Path, *extra) -> list:
    return ["train", "--method", "probe", "--data", data, "--backbone", tiny_bert, "--cache-dir", root,
            "--max-length", 32, "--epochs", 1, "--output", output, "--quiet", *extra]


def entries(trec_slice: Path, tiny_bert: Path, root: Path) -> dict[str, Path]:
    """Build the train and test entries; {split: entry folder}."""
    out = cli(*cache_args(trec_slice, tiny_bert, root), code=0).out
    return {m[1]: Path(m[2]) for m in re.finditer(r"^(\w+): \d+ examples, [\d,]+ tokens → (\S+)", out, re.M)}


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(root: Path) -> list[str]:
    """Anything in the cache folder besides complete entries: partial folders, lock files."""
    return sorted(p.name for p in root.iterdir() if ".partial-" in p.name or p.suffix == ".lock")


def rewrite_meta(entry: Path, consistent: bool = False, **changes) -> None:
    """Edit meta.json; consistent=True also recomputes its checksum (a wrong but self-consistent
    entry: what the deeper checks are for)."""
    meta = json.loads((entry / "meta.json").read_text())
    meta.update(changes)
    if consistent:
        meta["meta_sha"] = meta_sha(meta)
    (entry / "meta.json").write_text(json.dumps(meta, indent=1))


def rebuild_fixes_it(trec_slice: Path, tiny_bert: Path, root: Path, entry: Path) -> None:
    cli(*cache_args(trec_slice, tiny_bert, root, "--rebuild-cache"), code=0)
    CachedStates(entry)  # complete and verified again
    assert leftovers(root) == []


def assert_refused(argv: list, root: Path, entry: Path, contains: tuple[str, ...], row: str) -> str:
    """The command fails with one line naming the entry and --rebuild-cache; the cache folder is
    exactly as it was (nothing rebuilt behind the user's back, nothing half-written)."""
    before = tree(root)
    answer = cli(*argv, code=2, contains=(str(entry.name), "--rebuild-cache", *contains), row=row)
    assert tree(root) == before and leftovers(root) == []
    return answer.message


# ---- truncated, deleted, edited -----------------------------------------------------------------

@pytest.mark.parametrize("damage,contains", [
    ("truncate-states", ("states.bin", "truncated")),
    ("truncate-offsets", ("offsets.bin", "truncated")),
    ("delete-ids", ("ids.bin", "missing cache file")),
    ("delete-lengths", ("lengths.bin", "missing cache file")),
    ("flip-byte-states", ("states.bin", "corrupt")),
    ("delete-meta", ("no meta.json",)),
])
def test_damaged_entry_is_refused_then_rebuilt(tiny_bert, trec_slice, tmp_path, damage, contains):
    root = tmp_path / "cache"
    entry = entries(trec_slice, tiny_bert, root)["train"]
    what, name = damage.rsplit("-", 1)
    path = entry / ("meta.json" if name == "meta" else f"{name}.bin")
    if what == "truncate":
        path.write_bytes(path.read_bytes()[:-3])
    elif what == "delete":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 3] ^= 0x40
        path.write_bytes(bytes(data))
    assert_refused(cache_args(trec_slice, tiny_bert, root), root, entry, contains, R_DAMAGED)
    rebuild_fixes_it(trec_slice, tiny_bert, root, entry)


@pytest.mark.parametrize("name", ["states.bin", "offsets.bin"])
def test_list_marks_a_truncated_entry_unreadable_and_prune_removes_it(tiny_bert, trec_slice, tmp_path, name):
    """`cache --list` compares every data file's size with meta.json's (a stat, no hashing): a
    truncated file makes the entry unreadable, naming the file and both sizes, and --prune removes
    it (using it would fail anyway); the intact entry beside it stays ok."""
    root = tmp_path / "cache"
    made = entries(trec_slice, tiny_bert, root)
    entry, intact = made["train"], made["test"]
    path = entry / name
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-3])
    rows = {Path(r["path"]).name: r for r in json.loads(cli("cache", "--list", "--json", "--cache-dir", root,
                                                            code=0).out)}
    assert rows[entry.name]["status"] == f"unreadable ({name}: {size - 3:,} bytes, meta.json records {size:,})"
    assert rows[intact.name]["status"] == "ok"
    assert "unreadable" in cli("cache", "--list", "--cache-dir", root, code=0).out
    cli("cache", "--prune", "--cache-dir", root, code=0)
    assert sorted(p.name for p in root.iterdir()) == [intact.name]


def test_verify_finds_bytes_changed_in_place_and_prune_removes_the_entry(tiny_bert, trec_slice, tmp_path):
    """A flipped byte keeps every size: --list said ok and --prune kept the entry. With --verify both read
    the checksums: the entry is unreadable, naming the file, and --prune --verify removes it."""
    root = tmp_path / "cache"
    made = entries(trec_slice, tiny_bert, root)
    entry, intact = made["train"], made["test"]
    data = bytearray((entry / "states.bin").read_bytes())
    data[len(data) // 2] ^= 0x40
    (entry / "states.bin").write_bytes(bytes(data))

    def listed(*flags):
        return {Path(r["path"]).name: r["status"]
                for r in json.loads(cli("cache", "--list", "--json", "--cache-dir", root, *flags, code=0).out)}
    assert listed()[entry.name] == "ok"  # sizes only: not found
    verified = listed("--verify")
    assert verified[entry.name].startswith("unreadable (") and "states.bin" in verified[entry.name]
    assert "corrupt" in verified[entry.name] and verified[intact.name] == "ok"
    cli("cache", "--prune", "--cache-dir", root, code=0)
    assert entry.exists()  # without --verify, kept
    cli("cache", "--prune", "--verify", "--cache-dir", root, code=0)
    assert sorted(p.name for p in root.iterdir()) == [intact.name]
    cli("cache", "trec", "--verify", contains="--verify goes with --list or --prune")


def test_list_marks_an_entry_missing_a_file_unreadable(tiny_bert, trec_slice, tmp_path):
    from frozentune.extract.entries import scan

    root = tmp_path / "cache"
    entry = entries(trec_slice, tiny_bert, root)["train"]
    (entry / "ids.bin").unlink()
    assert {e.path.name: e.status for e in scan(root)}[entry.name] == "unreadable (ids.bin missing)"


@pytest.mark.parametrize("field,value", [
    ("n", lambda m: m["n"] - 1), ("dim", lambda m: m["dim"] * 2), ("dtype", lambda m: "float32"),
    ("tokens", lambda m: m["tokens"] - 7), ("key", lambda m: "0" * 32),
    ("files", lambda m: {**m["files"], "states.bin": {**m["files"]["states.bin"], "size": 0}}),
    ("created", lambda m: "1999-01-01T00:00:00"), ("meta_sha", lambda m: None),
])
def test_edited_meta_is_refused(tiny_bert, trec_slice, tmp_path, field, value):
    """Any edit of meta.json, in any field, is found (its own checksum), before any state is read."""
    root = tmp_path / "cache"
    entry = entries(trec_slice, tiny_bert, root)["train"]
    meta = json.loads((entry / "meta.json").read_text())
    rewrite_meta(entry, **{field: value(meta)})
    assert_refused(cache_args(trec_slice, tiny_bert, root), root, entry,
                   ("meta.json", "edited or corrupt"), R_DAMAGED)
    if field == "dim":  # the same through train: no output folder is made
        out = tmp_path / "model"
        assert_refused(train_args(trec_slice, tiny_bert, root, out), root, entry, ("edited",), R_SWAPPED)
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    rebuild_fixes_it(trec_slice, tiny_bert, root, entry)


# ---- files of another entry; self-consistent but wrong metadata ---------------------------------

def test_entry_replaced_by_another_entrys_files(tiny_bert, trec_slice, tmp_path):
    """A sync tool or a hand copy put the test entry's files into the train entry's folder:
    refused by key (the entry says whose it is), not trained on."""
    root = tmp_path / "cache"
    got = entries(trec_slice, tiny_bert, root)
    train, test = got["train"], got["test"]
    for f in test.iterdir():
        shutil.copy2(f, train / f.name)
    msg = assert_refused(cache_args(trec_slice, tiny_bert, root), root, train,
                         ("holds the files of another cache entry", test.name), R_SWAPPED)
    out = tmp_path / "model"
    assert_refused(train_args(trec_slice, tiny_bert, root, out), root, train, ("another cache entry",), R_SWAPPED)
    assert not out.exists()
    # the whole folder renamed onto another key: the same
    shutil.rmtree(train)
    test.rename(train)
    assert_refused(cache_args(trec_slice, tiny_bert, root, "--splits", "train"), root, train,
                   ("another cache entry",), R_SWAPPED)
    assert msg


def test_entry_bins_replaced_without_meta(tiny_bert, trec_slice, tmp_path):
    """Only the .bin files copied over: their sizes or checksums give them away."""
    root = tmp_path / "cache"
    got = entries(trec_slice, tiny_bert, root)
    for name in ("states.bin", "ids.bin", "offsets.bin", "lengths.bin"):
        shutil.copy2(got["test"] / name, got["train"] / name)
    assert_refused(cache_args(trec_slice, tiny_bert, root), root, got["train"], ("truncated or overwritten",), R_SWAPPED)


@pytest.mark.parametrize("field,value,contains", [
    ("dim", 64, ("dimension 64", "backbone's is 32")),
    ("dtype", "float32", ("float32 states", "float16 was asked for")),
    ("n", 119, ("holds 119 examples", "120 texts")),
    ("tokens", None, ("states.bin", "tokens", "need")),
])
def test_consistent_but_wrong_meta(tiny_bert, trec_slice, tmp_path, field, value, contains):
    """meta.json rewritten with a matching checksum (a buggy writer, a deliberate edit): what it
    says is still checked against what was asked for and against the files' sizes."""
    root = tmp_path / "cache"
    entry = entries(trec_slice, tiny_bert, root)["train"]
    meta = json.loads((entry / "meta.json").read_text())
    rewrite_meta(entry, consistent=True, **{field: meta["tokens"] + 1 if value is None else value})
    assert_refused(cache_args(trec_slice, tiny_bert, root), root, entry, contains, R_SWAPPED)
    rebuild_fixes_it(trec_slice, tiny_bert, root, entry)


@pytest.mark.parametrize("field,value,listed", [
    ("n", [], "unreadable (meta.json: missing or invalid n)"),
    ("tokens", "1000", "unreadable (meta.json: missing or invalid tokens)"),
    ("max_length", "x", "ok"), ("extract_seconds", "../x", "ok"),
])
def test_a_field_of_the_wrong_kind_is_listed_and_read_as_it_is(tiny_bert, trec_slice, tmp_path, field, value, listed):
    """meta.json re-signed with a field of another kind (found by bench/fuzz.py's cache part): `cache --list` crashed
    formatting a list as a number, and `cache` on a float of a text. A field the reader relies on makes the entry
    unreadable in the list (as the run says it) and --prune removes it; a field that only informs (how long the
    build took, the max_length shown) is not shown, and the entry is read."""
    root = tmp_path / "cache"
    entry = entries(trec_slice, tiny_bert, root)["train"]
    rewrite_meta(entry, consistent=True, **{field: value})
    rows = {Path(r["path"]).name: r for r in json.loads(cli("cache", "--list", "--json", "--cache-dir", root,
                                                            code=0).out)}
    assert rows[entry.name]["status"] == listed
    assert entry.name[:16] in cli("cache", "--list", "--cache-dir", root, code=0).out
    if listed == "ok":
        tokens = json.loads((entry / "meta.json").read_text())["tokens"]
        assert (rows[entry.name]["max_length"], rows[entry.name]["tokens"]) == ((None if field == "max_length" else 32),
                                                                                tokens)
        assert f"→ {entry} (cached)" in cli(*cache_args(trec_slice, tiny_bert, root), code=0).out
        return
    assert_refused(cache_args(trec_slice, tiny_bert, root), root, entry, (f"missing or invalid {field}",), R_SWAPPED)
    cli("cache", "--prune", "--cache-dir", root, code=0)
    assert not entry.exists()


def test_ragged_index_out_of_range(tiny_bert, trec_slice, tmp_path):
    """offsets.bin pointing past the states (checksums and meta recomputed to match): refused."""
    root = tmp_path / "cache"
    entry = entries(trec_slice, tiny_bert, root)["train"]
    offsets = np.fromfile(entry / "offsets.bin", dtype=np.int64)
    offsets[5] += 10 ** 6
    offsets.tofile(entry / "offsets.bin")
    meta = json.loads((entry / "meta.json").read_text())
    meta["files"]["offsets.bin"]["chunks"] = [hashlib.blake2b(offsets.tobytes(), digest_size=16).hexdigest()]
    rewrite_meta(entry, consistent=True, files=meta["files"])
    assert_refused(cache_args(trec_slice, tiny_bert, root), root, entry,
                   ("do not describe",), R_SWAPPED)


def test_disk_full_while_merging(tiny_bert, trec_slice, tmp_path, monkeypatch):
    """The disk fills while the shards are merged into the entry: one line naming the cache folder,
    the way out and the finished shards kept; the half-merged entry is removed (its space given
    back), the shards stay, and the rerun (space freed) resumes from them."""
    import errno

    import frozentune.cache as C

    real = C._ChunkedWriter.write

    def fills_up(self, data):
        if self.f is not None:  # a file the merge writes (the states are linked from the build, not written)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(C._ChunkedWriter, "write", fills_up)
    root = tmp_path / "cache"
    cli(*cache_args(trec_slice, tiny_bert, root), code=2, contains=(str(root), "No space left on device", "--cache-dir",
                                                                    "finished shards", "--prune"))
    assert [p.suffix for p in root.iterdir()] == [".building"] and not list(root.rglob("*.partial-*"))
    monkeypatch.undo()
    answer = cli(*cache_args(trec_slice, tiny_bert, root), code=0)
    assert "resumed" not in answer.err  # nothing left to extract: every shard was finished, only merged now
    assert [p.suffix for p in root.iterdir()] == ["", ""]  # train and test entries, no build folder


def test_disk_full_while_extracting(tiny_bert, trec_slice, tmp_path, monkeypatch):
    """The disk fills while a shard is written: the error is one line, and nothing is left but the
    build's plan and its data files (made at full size, sparse until shards are written), no shard
    record."""
    import errno

    import frozentune.extract.shards as S

    def fails(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
        yield

    monkeypatch.setattr(S, "iter_states", fails)
    root = tmp_path / "cache"
    cli(*cache_args(trec_slice, tiny_bert, root), code=2, contains=(str(root), "No space left on device", "--cache-dir"))
    (folder,) = root.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == [".active", "ids.bin", "plan.json", "states.bin"]


def test_a_build_larger_than_the_free_space_is_refused_before_it_starts(tiny_bert, trec_slice, tmp_path, monkeypatch):
    """A build whose states could not fit failed with a full disk after minutes of extraction, holding the
    space it had taken. It is now refused before any extraction, with its size and the free space."""
    import collections

    import frozentune.cache as C

    real = C.shutil.disk_usage
    monkeypatch.setattr(C.shutil, "disk_usage", lambda p: collections.namedtuple("U", "total used free")(1, 1, 1000))
    root = tmp_path / "cache"
    answer = cli(*cache_args(trec_slice, tiny_bert, root, "--splits", "test"), code=2,  # one file: its own check
                 contains=(str(root), "1.0 kB are free there", "--cache-dir", "--prune"))
    # sizes in the unit that fits (a small build was said to "take 0.00 GB and 0.00 GB are free")
    assert re.search(r"take [\d.,]+ (kB|MB) and", answer.message) and "0.00 GB" not in answer.message
    assert list(root.iterdir()) == []  # no build folder: nothing was extracted
    monkeypatch.setattr(C.shutil, "disk_usage", real)
    cli(*cache_args(trec_slice, tiny_bert, root), code=0)


def test_a_run_whose_files_do_not_fit_together_is_refused_before_the_first(tiny_bert, trec_slice, tmp_path, monkeypatch):
    """Each entry's room was checked as it started, so a train file that fitted was extracted and then the
    test file was refused, its space taken. All the files a run builds are now checked together first."""
    import collections

    import frozentune.cache as C

    root = tmp_path / "cache"
    real = C.shutil.disk_usage
    sizes = {}

    def spy(backbone, texts, *a, **k):  # the bytes each file's entry takes, from the tokens it is built from
        sizes[len(texts)] = C.state_bytes(int(k["tokens"].lengths.sum()), backbone.dim, "float16")
        raise SystemExit  # measured: stop before building

    monkeypatch.setattr("frozentune.api.get_or_build", spy)
    with pytest.raises(SystemExit):
        from frozentune import api
        api.train("probe", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=32), cache_root=root,
                  progress=False, log=lambda s: None)
    monkeypatch.undo()
    assert sorted(sizes) == [120]  # the first file's build got the tokens made for the check
    free = max(sizes.values()) + 1  # room for either file alone, not for both
    monkeypatch.setattr(C.shutil, "disk_usage", lambda p: collections.namedtuple("U", "total used free")(1, 1, free))
    cli(*train_args(trec_slice, tiny_bert, root, tmp_path / "m"), code=2,
        contains=("these 2 files (160 texts)", " together and ", "--cache-dir"))
    assert [p for p in root.iterdir()] == []  # nothing extracted
    monkeypatch.setattr(C.shutil, "disk_usage", real)


def test_cache_checks_its_files_together_before_the_first(tiny_bert, trec_slice, tmp_path, monkeypatch):
    """`frozentune cache DATA` built split by split, each checked alone as it started: on a nearly full disk
    it wrote train, filled the disk, then refused the next file. Like train and sweep, it now checks every
    file it will build against the free space together, before anything is extracted."""
    import collections

    import frozentune.cache as C

    sizes = [C.state_bytes(json.loads((p / "meta.json").read_text())["tokens"], 32, "float16")  # tiny BERT: width 32
             for p in entries(trec_slice, tiny_bert, tmp_path / "measured").values()]
    assert len(sizes) == 2
    root = tmp_path / "cache"
    real = C.shutil.disk_usage
    free = max(sizes) + 1  # room for either file alone, not for both
    monkeypatch.setattr(C.shutil, "disk_usage", lambda p: collections.namedtuple("U", "total used free")(1, 1, free))
    cli(*cache_args(trec_slice, tiny_bert, root), code=2,
        contains=(str(root), "these 2 files (160 texts)", " together and ", "--cache-dir"))
    assert list(root.iterdir()) == []  # nothing extracted
    cli(*cache_args(trec_slice, tiny_bert, root, "--splits", "test"), code=0)  # one file alone fits
    monkeypatch.setattr(C.shutil, "disk_usage", real)


def test_a_large_build_is_said_before_it_starts_and_as_it_runs_without_a_terminal(tiny_bert, trec_slice, tmp_path,
                                                                                  monkeypatch):
    """Where no terminal shows a bar (a log file, CI), a 25,000-text build extracted for 50 minutes with no
    word. A large one is now said before it starts (texts, tokens, bytes, free space, why the whole file)
    and then every EVERY_S seconds (texts done, rate, time left)."""
    import frozentune.cache as C

    monkeypatch.setattr(C, "SIZE_SAID", 0)  # every build counts as large; the tiny ones here take milliseconds
    monkeypatch.setattr(C, "EVERY_S", 0.0)
    answer = cli(*cache_args(trec_slice, tiny_bert, tmp_path / "cache"), code=0)
    assert re.search(r"cache: extracting [\d,]+ texts \([\d,]+ tokens\) for entry \S+: [\d.,]+ (kB|MB) of states "
                     r"\([\d.,]+ (kB|MB|GB) free there\)", answer.err)
    assert re.search(r"extracting: [\d,]+ of [\d,]+ texts, [\d,]+ texts/s, about \d+ min left", answer.err)


def test_file_digests_need_no_python_3_11():
    """hashlib.file_digest exists from Python 3.11; the package says 3.10. blake2b_of reads in blocks and gives
    the digest of the whole, across block edges and through a limited view."""
    import hashlib
    import io

    from frozentune.cache import _Limited, blake2b_of

    data = bytes(range(256)) * 4099  # not a multiple of the block
    want = hashlib.blake2b(data, digest_size=16).hexdigest()
    assert blake2b_of(io.BytesIO(data), block=1000) == want == blake2b_of(io.BytesIO(data))
    assert blake2b_of(_Limited(io.BytesIO(data), 5000), block=777) == hashlib.blake2b(data[:5000], digest_size=16).hexdigest()
    assert blake2b_of(io.BytesIO(b"")) == hashlib.blake2b(b"", digest_size=16).hexdigest()

"""The backbone pass (issue 16): device choice, precision in the key, absolute layer keys, shards
that resume after a kill at any point, parts that merge into the one-process entry, torchrun,
migration of format-2 entries, cache --list / --prune.

Equality of entries is checked on the files' checksums (meta.json's chunk sums) or byte for byte:
a resumed or merged build runs the same batches (same shapes, same kernels, same thread count) as
an uninterrupted one, so its bytes are identical, not merely close.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import frozentune.cache as C
import frozentune.extract.shards as S
from frozentune.backbone import Backbone, LayerSpec
from frozentune.cache import (CacheError, CachedStates, FORMAT_VERSION, build_part, cache_key, get_or_build,
                              KEY_FIELDS, legacy_keys, meta_sha)
from frozentune.extract import ExtractError, resolve_device
from frozentune.extract.entries import OLD_READ_ONLY, kept_lines, prune, scan
from frozentune.extract.shards import Part, building_dir, make_plan, part_of

from clirun import cli

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ["a short one .", "a somewhat longer sentence about films and acting .", "ok",
        "what is the capital of france ?", "the movie was neither good nor bad , just long ."]
MANY = [f"{t} {i}" for i in range(40) for t in BASE]  # 200 texts, ~1,900 tokens
SHARD = 150  # real tokens per shard, and batches of ≤ 128 padded tokens (≤ 8 rows of 16): ~12 shards of 2 batches
KW = dict(shard_tokens=SHARD, max_tokens=128)
FILES = ("states.bin", "ids.bin", "offsets.bin", "lengths.bin")


@pytest.fixture(scope="module")
def bb(tiny_bert):
    return Backbone.load(str(tiny_bert), max_length=16)


def sums(cache: CachedStates) -> dict:
    """The entry's content: every file's size and chunk checksums."""
    return {name: cache.meta["files"][name] for name in FILES}


def plan_of(bb, texts=MANY):
    return make_plan(bb.tokenize(texts).lengths, SHARD, 128)


@pytest.fixture(scope="module")
def reference(bb, tmp_path_factory):
    """The entry of MANY as one uninterrupted process writes it."""
    cache, secs = get_or_build(bb, MANY, tmp_path_factory.mktemp("ref"), progress=False, **KW)
    assert secs > 0
    return cache


def test_plan_is_the_one_process_order(bb):
    """Shards are runs of the very batches an unsharded pass makes, longest first, each ≥ SHARD real tokens."""
    from frozentune.backbone import length_batches

    tokens = bb.tokenize(MANY)
    plan = make_plan(tokens.lengths, SHARD, max_tokens=128)  # small batches: several per shard
    assert np.array_equal(plan.order, np.concatenate(length_batches(tokens.lengths, 128, 128)))
    assert len(plan.shards) > 5 and plan.shards[0][0] == 0 and plan.shards[-1][1] == len(plan.batches)
    assert any(b1 - b0 > 1 for b0, b1 in plan.shards)
    for k, (b0, b1) in enumerate(plan.shards[:-1]):
        assert plan.shards[k + 1][0] == b1
        p0, p1 = plan.examples(k)
        assert tokens.lengths[plan.order[p0:p1]].sum() >= SHARD


class Killed(BaseException):
    """Stands for SIGKILL/Ctrl-C at a chosen batch (a BaseException: nothing may catch it)."""


def kill_after(monkeypatch, batches: int):
    """The next build dies after yielding `batches` extraction batches (mid-shard or on a boundary)."""
    real = S.iter_states
    seen = {"n": 0}

    def dying(*a, **k):
        for item in real(*a, **k):
            if seen["n"] == batches:
                raise Killed
            seen["n"] += 1
            yield item
    monkeypatch.setattr(S, "iter_states", dying)


def shard_ends(plan) -> np.ndarray:
    """Batches extracted when each shard is complete (cumulative)."""
    return np.cumsum([b1 - b0 for b0, b1 in plan.shards])


@pytest.mark.parametrize("kills", [(1,), (3, 2, 7), (0, 4, 4)], ids=["mid-first", "three-kills", "at-boundaries"])
def test_resume_after_kills_equals_uninterrupted(bb, reference, tmp_path, monkeypatch, kills):
    """Killed after k more batches, again and again: every kill keeps exactly the shards whose
    batches were all written (so it loses at most the shard being written), no partial shard is
    read, and the finished entry has the uninterrupted build's bytes."""
    root = tmp_path / "cache"
    plan = plan_of(bb)
    ends = shard_ends(plan)
    assert len(plan.shards) >= 8 and (np.diff(np.r_[0, ends]) >= 2).sum() >= 4  # several shards of several batches
    key = cache_key(bb, MANY)[0]
    folder = building_dir(root, key)
    done_batches = 0
    for k in kills:
        kill_after(monkeypatch, k)
        with pytest.raises(Killed):
            get_or_build(bb, MANY, root, progress=False, **KW)
        monkeypatch.undo()
        assert not (root / key).exists(), "no entry before every shard is there"
        expect = int((ends <= done_batches + k).sum())  # shards whose last batch was written before the kill
        assert S.finished(folder, plan) == set(range(expect))
        done_batches = int(ends[expect - 1]) if expect else 0
    cache, secs = get_or_build(bb, MANY, root, progress=False, **KW)
    assert secs > 0 and sums(cache) == sums(reference)
    assert not folder.exists() and not list(root.glob("*.partial-*"))


def test_one_process_publishes_without_reading_its_shards_back(bb, tmp_path, monkeypatch):
    """A build that wrote every shard in order, in this process, checksummed the entry's chunks as it
    wrote them: publishing reads no byte back, and the checksums equal those of the files read from
    disk, and those of a resumed build, which reads every byte back. Chunks of 1,000 bytes, so that
    every file spans many and shards end inside them."""
    import frozentune.cache as C

    monkeypatch.setattr(S, "CHUNK", 1000)
    monkeypatch.setattr(C, "CHUNK", 1000)
    real, reads = S._read_back, []
    monkeypatch.setattr(S, "_read_back", lambda *a: reads.append(1) or real(*a))
    fresh, _ = get_or_build(bb, MANY, tmp_path / "fresh", progress=False, **KW)
    assert reads == [] and len(sums(fresh)["states.bin"]["chunks"]) > 10
    for name in FILES:
        on_disk = C._file_sums(fresh.path / name)
        assert sums(fresh)[name]["chunks"] == [on_disk[c] for c in sorted(on_disk)], name
    whole = S.iter_states
    kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        get_or_build(bb, MANY, tmp_path / "resumed", progress=False, **KW)
    monkeypatch.setattr(S, "iter_states", whole)
    resumed, _ = get_or_build(bb, MANY, tmp_path / "resumed", progress=False, **KW)
    assert reads == [1] and sums(resumed) == sums(fresh)
    CachedStates(resumed.path, verify="full")  # every checksum checked against the bytes


@pytest.mark.parametrize("threads,ahead", [(1, 1), (2, 1), (8, 1 << 29)], ids=["one-thread", "no-room", "default-room"])
def test_the_writers_threads_write_the_one_process_entry(bb, reference, tmp_path, monkeypatch, threads, ahead):
    """However many threads write and hash, and however little room they have ahead of the pass (one
    batch: every batch waits for the one before it), the entry has the same bytes and checksums, and
    publishing reads none of them back. One thread is the case where every hashing task waits for the
    one before it on the same thread's queue."""
    import frozentune.cache as C

    monkeypatch.setattr(S, "WRITER_THREADS", threads)
    monkeypatch.setattr(S, "AHEAD_BYTES", ahead)
    monkeypatch.setattr(S, "CHUNK", 1000)  # many chunks, each a lane of its own, ending inside shards and batches
    monkeypatch.setattr(C, "CHUNK", 1000)
    real, reads = S._read_back, []
    monkeypatch.setattr(S, "_read_back", lambda *a: reads.append(1) or real(*a))
    cache, _ = get_or_build(bb, MANY, tmp_path / "cache", progress=False, **KW)
    assert reads == []
    for name in FILES:
        assert (cache.path / name).read_bytes() == (reference.path / name).read_bytes(), name
        on_disk = C._file_sums(cache.path / name)
        assert sums(cache)[name]["chunks"] == [on_disk[c] for c in sorted(on_disk)], name


def test_a_write_that_fails_on_the_writers_threads_stops_the_build_and_resumes(bb, reference, tmp_path, monkeypatch):
    """The disk fills while the writer's threads write shard 3: the build stops with that error, shard 3
    has no record (so its bytes are not vouched for), the shards written before it have theirs, and the
    rerun extracts only what is missing and gives the uninterrupted entry."""
    import errno

    plan = plan_of(bb)
    row = S.row_bytes(bb.dim, 2)["states.bin"]
    starts = S.shard_starts(plan, bb.tokenize(MANY).lengths)
    first, end, states_size = int(starts[3]) * row, int(starts[4]) * row, int(starts[-1]) * row
    real = S._pwrite

    def fills_up(fd, data, at):  # states.bin is made at its full size, so its size tells it from ids.bin
        if first <= at < end and os.fstat(fd).st_size == states_size:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, at)

    monkeypatch.setattr(S, "_pwrite", fills_up)
    root = tmp_path / "cache"
    with pytest.raises(CacheError, match="No space left on device"):
        get_or_build(bb, MANY, root, progress=False, **KW)
    folder = building_dir(root, cache_key(bb, MANY)[0])
    done = S.finished(folder, plan)
    assert 3 not in done and {0, 1, 2} <= done
    monkeypatch.undo()
    cache, secs = get_or_build(bb, MANY, root, progress=False, **KW)
    assert secs > 0 and sums(cache) == sums(reference)


def test_parts_merge_into_the_one_process_entry(bb, reference, tmp_path):
    """--shard 0/3, 1/3, 2/3 as independent processes: the first two stop with the entry incomplete,
    the last publishes it, and it is the one-process entry byte for byte."""
    root = tmp_path / "cache"
    for i in (2, 0):
        cache, stats = build_part(bb, MANY, Part(i, 3, f"--shard {i}/3"), root, progress=False, **KW)
        assert cache is None and not stats.complete and stats.report.missing
    # a part never publishes outside the build lock, even when its shards were the last ones
    # (under torchrun the waiting ranks poll publish_when_complete at the same moment)
    from frozentune.cache import build, publish_when_complete

    key, fields = cache_key(bb, MANY)
    stats = build(root, key, fields, bb, bb.tokenize(MANY), part=Part(1, 3), progress=False, **KW)
    assert not stats.complete and not stats.report.missing and not (root / key).exists()
    assert publish_when_complete(root, key, fields, bb, bb.tokenize(MANY), plan_of(bb))
    cache, stats = build_part(bb, MANY, Part(1, 3, "--shard 1/3"), root, progress=False, **KW)
    assert stats is None and cache is not None and sums(cache) == sums(reference)


def test_a_part_with_nothing_to_write_leaves_no_build_folder(bb, reference, tmp_path):
    """Under torchrun a rank may reach its build after another rank published the entry and removed
    the build folder: a rank that owns no shard (a small split has fewer shards than ranks), or one
    whose shards were finished by an earlier, interrupted run. It must not create the folder again
    (a leftover `<key>.building` with only plan.json) nor extract its shards again."""
    from frozentune.cache import build, publish_when_complete

    root = tmp_path / "cache"
    one_shard = BASE[:2]  # fewer real tokens than a shard: part 1 of 2 owns nothing
    key1, fields1 = cache_key(bb, one_shard)
    stats = build(root, key1, fields1, bb, bb.tokenize(one_shard), part=Part(1, 2), progress=False, **KW)
    assert stats.report.done_now == [] and not building_dir(root, key1).exists()

    key, fields = cache_key(bb, MANY)
    tokens = bb.tokenize(MANY)
    for i in (0, 1):
        build(root, key, fields, bb, tokens, part=Part(i, 2), progress=False, **KW)
    assert publish_when_complete(root, key, fields, bb, tokens, plan_of(bb)) and not building_dir(root, key).exists()
    late = build(root, key, fields, bb, tokens, part=Part(1, 2), progress=False, **KW)  # a rank arriving now
    assert late.report.done_now == [] and not building_dir(root, key).exists()
    assert sums(CachedStates(root / key, key=key, n=len(MANY), dim=bb.dim, dtype="float16")) == sums(reference)


def test_merge_refuses_missing_and_foreign_shards(bb, tmp_path):
    root = tmp_path / "cache"
    other = [t + " !" for t in MANY]
    build_part(bb, MANY, Part(0, 2), root, progress=False, **KW)
    build_part(bb, other, Part(1, 2), root, progress=False, **KW)
    key, fields = cache_key(bb, MANY)
    okey = cache_key(bb, other)[0]
    folder, plan, tokens = building_dir(root, key), plan_of(bb), bb.tokenize(MANY)
    with pytest.raises(ExtractError, match=r"shards are not finished \(1, 3"):
        S.merge(folder, key, plan, tokens.lengths, bb.dim, "float16", lambda *a: None)
    # a shard of another entry put in place of a missing one is refused by name, nothing is published
    shutil.copy(building_dir(root, okey) / "shard-00001.json", folder / "shard-00001.json")
    for k in range(3, len(plan.shards), 2):
        shutil.copy(building_dir(root, okey) / S.shard_name(k), folder / S.shard_name(k))
    with pytest.raises(CacheError, match="a shard of another cache entry"):
        build_part(bb, MANY, Part(1, 2), root, progress=False, **KW)
    assert not (root / key).exists()


def test_damaged_shard_is_found_before_publishing(bb, tmp_path):
    root = tmp_path / "cache"
    build_part(bb, MANY, Part(0, 2), root, progress=False, **KW)
    key = cache_key(bb, MANY)[0]
    f = building_dir(root, key) / "states.bin"  # shard 0's rows come first
    data = bytearray(f.read_bytes())
    data[10] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=r"states.bin: bytes 0\.\.\d+ of shard 0 are corrupt .*shard-00000.json"):
        build_part(bb, MANY, Part(1, 2), root, progress=False, **KW)
    assert not (root / key).exists()


@pytest.mark.parametrize("edit, says", [
    (lambda r: r.update(files=[r["files"]]), "a damaged record (it gives no place and checksum for states.bin)"),
    (lambda r: r["files"].update({"ids.bin": ""}), "a damaged record (it gives no place and checksum for ids.bin)"),
    (lambda r: r["files"]["states.bin"].update(size=float(r["files"]["states.bin"]["size"])), "places states.bin"),
    (lambda r: r.update(seconds={"v": 1}, device=["cpu"]), None),
], ids=["files-list", "file-text", "size-float", "seconds-device"])
def test_a_damaged_shard_record_is_named_or_read(bb, tmp_path, edit, says):
    """A shard's record changed in what places and vouches for its bytes (found by bench/fuzz.py's cache part: an
    AttributeError and a TypeError in the merge) is named, with the way out, before anything is published; a damaged
    time or device (which only inform) do not stop the build, and the entry equals the one-process one."""
    root = tmp_path / "cache"
    build_part(bb, MANY, Part(0, 2), root, progress=False, **KW)
    key = cache_key(bb, MANY)[0]
    record = building_dir(root, key) / "shard-00002.json"
    info = json.loads(record.read_text())
    edit(info)
    record.write_text(json.dumps(info))
    if says is not None:
        with pytest.raises(CacheError, match=re.escape(f"{record}: {says}") + ".*delete .*and rerun"):
            build_part(bb, MANY, Part(1, 2), root, progress=False, **KW)
        assert not (root / key).exists()
        return
    cache, _ = build_part(bb, MANY, Part(1, 2), root, progress=False, **KW)
    assert sums(cache) == sums(get_or_build(bb, MANY, tmp_path / "whole", progress=False, **KW)[0])


@pytest.mark.parametrize("part", [None, Part(1, 2, "--shard 1/2")])
def test_a_folder_in_place_of_a_build_file_is_said_as_such(bb, tmp_path, part):
    """ids.bin of an interrupted build replaced by a folder (found by bench/fuzz.py's cache part): the build said
    "(Is a directory); free space there or give --cache-dir a writable folder with room". It says what stands there
    and how to start over (one process: --rebuild-cache; a part of several: delete the build folder), and that
    works."""
    root = tmp_path / "cache"
    build_part(bb, MANY, Part(0, 2), root, progress=False, **KW)
    folder = building_dir(root, cache_key(bb, MANY)[0])
    (folder / "ids.bin").unlink()
    (folder / "ids.bin").mkdir()
    again = "rerun with --rebuild-cache to start over" if part is None else f"delete {folder} and rerun every part (2)"
    with pytest.raises(CacheError, match=re.escape(f"{folder / 'ids.bin'}: a folder stands where the build writes a "
                                                   f"file") + ".*" + re.escape(again)) as e:
        get_or_build(bb, MANY, root, progress=False, **KW) if part is None else \
            build_part(bb, MANY, part, root, progress=False, **KW)
    assert "free space" not in str(e.value)
    rebuilt, _ = get_or_build(bb, MANY, root, progress=False, rebuild=True, **KW)
    assert sums(rebuilt) == sums(get_or_build(bb, MANY, tmp_path / "whole", progress=False, **KW)[0])


def test_part_of_reads_shard_flag_and_launcher_env():
    assert part_of(None, {}) == Part()
    assert part_of("1/4", {}).index == 1 and part_of("1/4", {}).count == 4
    p = part_of(None, {"RANK": "1", "WORLD_SIZE": "2"})
    assert (p.index, p.count, p.waits) == (1, 2, True)
    assert not part_of("0/2", {}).waits
    assert part_of(None, {"RANK": "0", "WORLD_SIZE": "1"}) == Part()
    for bad in ("2/2", "x", "1/0", "-1/2"):
        with pytest.raises(ExtractError, match="give i/N"):
            part_of(bad, {})
    with pytest.raises(ExtractError, match="disagrees with the launcher"):
        part_of("0/2", {"RANK": "1", "WORLD_SIZE": "2"})


def test_layer_key_is_absolute(tiny_bert):
    """On a 2-layer model hidden states are 0..2: -1 and 2 (and -3 and 0) are one entry."""
    a = Backbone.load(str(tiny_bert), LayerSpec((-1,)), max_length=16)
    b = Backbone.load(str(tiny_bert), LayerSpec((2,)), max_length=16)
    c = Backbone.load(str(tiny_bert), LayerSpec((1,)), max_length=16)
    assert a.layer_key == b.layer_key == "2" and cache_key(a, BASE)[0] == cache_key(b, BASE)[0]
    assert cache_key(c, BASE)[0] != cache_key(a, BASE)[0]
    assert Backbone.load(str(tiny_bert), LayerSpec((-3, -1), "concat"), max_length=16).layer_key == "0,2:concat"


def test_precision_is_in_the_key_and_device_is_not(bb):
    key32 = cache_key(bb, BASE)[0]
    bb.set_runtime("cpu", "bf16")
    try:
        assert cache_key(bb, BASE)[0] != key32 and cache_key(bb, BASE)[1]["precision"] == "bf16"
    finally:
        bb.set_runtime("cpu", "fp32")
    assert cache_key(bb, BASE)[0] == key32 and "device" not in cache_key(bb, BASE)[1]


def test_the_models_config_is_in_the_key(tiny_bert, tmp_path):
    """Two folders of the same weights and tokenizer whose config.json differ in a field that changes
    the states (the head count) shared one entry, so the second read the first's states; a field that
    cannot change them (a dropout, the transformers version) keeps the key."""
    other = tmp_path / "heads"
    shutil.copytree(tiny_bert, other)
    config = json.loads((other / "config.json").read_text())
    assert config["num_attention_heads"] != 1
    a, b = Backbone.load(str(tiny_bert), max_length=16), Backbone.load(str(tiny_bert), max_length=16)
    b.model.config.num_attention_heads = 1
    b.model.config.hidden_dropout_prob, b.model.config.transformers_version = 0.5, "0.0.1"
    assert cache_key(a, BASE)[0] != cache_key(b, BASE)[0] and a.weights_hash == b.weights_hash
    (other / "config.json").write_text(json.dumps(dict(config, num_attention_heads=1)))
    c = Backbone.load(str(other), max_length=16)
    assert cache_key(c, BASE)[0] == cache_key(b, BASE)[0]  # the field as read from a folder
    root = tmp_path / "cache"
    states_a = get_or_build(a, BASE, root, progress=False)[0]
    states_c, secs = get_or_build(c, BASE, root, progress=False)
    assert secs > 0 and states_c.meta["key"] != states_a.meta["key"]
    assert not np.array_equal(states_a.example(0), states_c.example(0))  # other states, not a copy
    b.model.config.num_attention_heads = a.model.config.num_attention_heads
    assert cache_key(a, BASE)[0] == cache_key(b, BASE)[0]  # dropout and version do not count


def as_format3(root: Path, key: str, meta: dict, old: str) -> str:
    """Turn the entry `key` back into what format 3 wrote under `old` (no config in its key or meta.json)."""
    meta = {k: v for k, v in meta.items() if k != "config"}
    meta.update(format=3, key=old)
    meta["meta_sha"] = meta_sha(meta)
    os.rename(root / key, root / old)
    (root / old / "meta.json").write_text(json.dumps(meta))
    return old


def test_format3_entry_is_rekeyed_with_a_message(tiny_bert, tmp_path):
    """An entry keyed before the key held the model's config (format 3) is re-keyed on first use,
    said so, states unchanged; in bf16 too (format 3 held the precision)."""
    for precision in ("fp32", "bf16", "int8"):
        bb = Backbone.load(str(tiny_bert), max_length=16, precision=precision)
        root = tmp_path / precision
        cache, _ = get_or_build(bb, BASE, root, progress=False)
        content, key = sums(cache), cache.meta["key"]
        old_key = as_format3(root, key, cache.meta, legacy_keys(bb, BASE)[0])
        assert [e.status for e in scan(root)] == ["old format (re-keyed on next use)"]
        said = []
        again, secs = get_or_build(bb, BASE, root, progress=False, log=said.append)
        assert secs == 0.0 and again.meta["key"] == key and sums(again) == content
        assert again.meta["format"] == FORMAT_VERSION and again.meta["config"] == bb.config_hash
        assert any("re-keyed" in s and "format 3 → 4" in s and "config" in s for s in said)
        assert not (root / old_key).exists()


def test_a_format3_entry_of_another_config_is_not_taken_for_this_models(tiny_bert, tmp_path, monkeypatch):
    """Format 3's key lacked the config: an entry made from a folder whose config.json had another head count
    (same weights, tokenizer, texts) had the stock model's old key, and was re-keyed as the stock model's, so
    its states were read as the stock model's. Now the shortest texts are recomputed before re-keying: another
    model's states are left where they are (said so) and this model's are built; the model that made them still
    re-keys them. (MiniLM with 6 heads instead of 12: states 43% apart; this random tiny model's attention is
    near uniform, so its head count hardly shows: its activation is changed instead, 1.1% apart.)"""
    import frozentune.cache as C

    edited = tmp_path / "relu"
    shutil.copytree(tiny_bert, edited)
    config = json.loads((edited / "config.json").read_text())
    assert config["hidden_act"] != "relu"
    (edited / "config.json").write_text(json.dumps(dict(config, hidden_act="relu")))
    stock, other = Backbone.load(str(tiny_bert), max_length=16), Backbone.load(str(edited), max_length=16)
    assert legacy_keys(stock, BASE) == legacy_keys(other, BASE)  # what format 3 could not tell apart
    notypes = Backbone.load(str(tiny_bert), max_length=16, token_types=False)
    assert {"split_special_tokens", "pairs", "token_types"} <= set(cache_key(notypes, [("a [SEP] b", "c")])[1])
    for fields in (cache_key(stock, BASE)[1], cache_key(notypes, [("a [SEP] b", "c")])[1]):
        assert set(fields) <= set(KEY_FIELDS)  # what --list derives an entry's old key from (format3_key)
    root = tmp_path / "cache"
    made, _ = get_or_build(other, BASE, root, progress=False)
    content, key = sums(made), made.meta["key"]
    old = as_format3(root, key, made.meta, legacy_keys(other, BASE)[0])
    fresh, _ = get_or_build(stock, BASE, tmp_path / "fresh", progress=False)
    for readonly in (True, False):  # read in place where the cache cannot be written; re-keyed where it can
        real = os.access
        monkeypatch.setattr(C.os, "access", lambda p, mode: False if readonly and Path(p) == root else real(p, mode))
        said = []
        got, secs = get_or_build(stock, BASE, root, progress=False, log=said.append)
        monkeypatch.undo()
        assert secs > 0 and got.path == root / fresh.meta["key"] and sums(got) == sums(fresh)
        assert any(old in s and "another config.json" in s and "built anew" in s for s in said), said
        assert (root / old / "meta.json").is_file()  # left for the config that made it
        listed = {e.path.name: e.status for e in scan(root)}
        assert listed[old].startswith(f"old format, beside entry {got.path.name[:8]}") and "--remove" in listed[old]
        shutil.rmtree(got.path)
    monkeypatch.setattr(C.os, "access", lambda p, mode: False if Path(p) == root else real(p, mode))
    assert [e.status for e in scan(root)] == [OLD_READ_ONLY]  # not "re-keyed on next use"
    monkeypatch.undo()
    again, secs = get_or_build(other, BASE, root, progress=False)
    assert secs == 0.0 and again.meta["key"] == key and sums(again) == content and not (root / old).exists()


def test_a_format3_entry_in_a_cache_that_cannot_be_written_is_read_in_place(bb, reference, tmp_path, monkeypatch):
    """A shared, read-only cache of format-3 entries: re-keying needs to write, so after the upgrade
    the run failed ("cannot write the feature cache there"); the entry is now read where it is."""
    import frozentune.cache as C

    root = tmp_path / "cache"
    shutil.copytree(reference.path, root / reference.meta["key"])
    old = as_format3(root, reference.meta["key"], reference.meta, legacy_keys(bb, MANY)[0])
    real = os.access
    monkeypatch.setattr(C.os, "access", lambda p, mode: False if Path(p) == root else real(p, mode))
    said = []
    found, secs = get_or_build(bb, MANY, root, progress=False, log=said.append, **KW)
    assert secs == 0.0 and found.path == root / old and sums(found) == sums(reference)
    assert any("reading entry" in s and "in place" in s and "not writable" in s for s in said)
    assert not (root / reference.meta["key"]).exists()  # nothing was written
    monkeypatch.undo()
    part, stats = build_part(bb, MANY, Part(0, 2, "--shard 0/2"), root, progress=False, **KW)
    assert stats is None and part.path == root / old  # a part reads it in place too (parts would race to rename)
    again, secs = get_or_build(bb, MANY, root, progress=False, **KW)  # writable again: re-keyed, not rebuilt
    assert secs == 0.0 and again.path == root / reference.meta["key"]


def test_a_format3_entry_this_user_cannot_rename_is_read_in_place_and_left_as_it_was(bb, reference, tmp_path,
                                                                                      monkeypatch):
    """A shared cache (a sticky folder, another user's entry): meta.json was rewritten to format 4, then the
    rename failed, leaving an entry neither version could read. Now the old meta.json is put back and the
    entry is read where it is."""
    import frozentune.cache as C

    root = tmp_path / "cache"
    shutil.copytree(reference.path, root / reference.meta["key"])
    old = as_format3(root, reference.meta["key"], reference.meta, legacy_keys(bb, MANY)[0])
    before = json.loads((root / old / "meta.json").read_text())
    real = os.rename

    def refused(src, dst):
        if Path(src) == root / old:
            raise PermissionError(1, "Operation not permitted", str(src))
        return real(src, dst)
    monkeypatch.setattr(C.os, "rename", refused)
    said = []
    found, secs = get_or_build(bb, MANY, root, progress=False, log=said.append, **KW)
    assert secs == 0.0 and found.path == root / old and sums(found) == sums(reference)
    assert json.loads((root / old / "meta.json").read_text()) == before  # the previous version still reads it
    assert any("in place" in s and "cannot rename" in s for s in said)
    assert not (root / reference.meta["key"]).exists() and not list((root / old).glob(".meta.json.*"))


def test_an_interrupted_format3_build_resumes_under_the_new_key(bb, reference, tmp_path, monkeypatch):
    """A build killed under format 3 was orphaned by the new key (started over, and --prune still said
    "rerun the same command to resume it"); it is now carried over and resumed from its shards."""
    root = tmp_path / "cache"
    key, fields = cache_key(bb, MANY)
    old = legacy_keys(bb, MANY)[0]
    kill_after(monkeypatch, 5)
    with pytest.raises(Killed):
        get_or_build(bb, MANY, root, progress=False, **KW)
    monkeypatch.undo()
    folder = building_dir(root, key)
    done = S.finished(folder, plan_of(bb))
    assert done
    for record in [folder / "plan.json", *S.shard_records(folder).values()]:  # what format 3 wrote
        info = json.loads(record.read_text())
        record.write_text(json.dumps(dict(info, key=old)))
    os.rename(folder, building_dir(root, old))
    extracted = []
    real = S.extract_shards
    monkeypatch.setattr(S, "extract_shards", lambda writer, todo, *a, **k: (extracted.extend(todo),
                                                                            real(writer, todo, *a, **k))[1])
    said = []
    cache, secs = get_or_build(bb, MANY, root, progress=False, log=said.append, **KW)
    assert sums(cache) == sums(reference) and not building_dir(root, old).exists()
    assert set(extracted).isdisjoint(done) and extracted  # only the shards the kill left
    assert any("interrupted build" in s and old in s and "resumes as" in s for s in said)


def test_an_interrupted_format3_build_of_another_config_is_built_again(bb, reference, tiny_bert, tmp_path,
                                                                          monkeypatch):
    """An interrupted format-3 build has the same old key whatever config.json made it: carried over and
    finished by the stock model, its first shards held another config's states beside this model's. The
    carried shards' shortest texts are now checked once the entry is complete; on a mismatch it is built
    again from the start (said so), and equals an uninterrupted build."""
    edited = tmp_path / "relu"
    shutil.copytree(tiny_bert, edited)
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps(dict(config, hidden_act="relu")))
    other = Backbone.load(str(edited), max_length=16)
    root = tmp_path / "cache"
    key, old = cache_key(other, MANY)[0], legacy_keys(other, MANY)[0]
    assert old == legacy_keys(bb, MANY)[0]
    kill_after(monkeypatch, 5)
    with pytest.raises(Killed):
        get_or_build(other, MANY, root, progress=False, **KW)
    monkeypatch.undo()
    folder = building_dir(root, key)
    assert S.finished(folder, plan_of(other))
    for record in [folder / "plan.json", *S.shard_records(folder).values()]:  # what format 3 wrote
        info = json.loads(record.read_text())
        record.write_text(json.dumps(dict(info, key=old)))
    os.rename(folder, building_dir(root, old))
    said = []
    cache, secs = get_or_build(bb, MANY, root, progress=False, log=said.append, **KW)
    assert sums(cache) == sums(reference) and secs > 0
    assert any("resumes as" in s for s in said) and any("carried over" in s and "built again" in s for s in said)


def test_format2_entry_is_rekeyed_with_a_message(tiny_bert, tmp_path):
    """An entry written before shards (format 2: layers as typed, no precision) is re-keyed on
    first use — same states, no extraction — and said so."""
    bb = Backbone.load(str(tiny_bert), LayerSpec((-1,)), max_length=16)
    root = tmp_path / "cache"
    cache, _ = get_or_build(bb, BASE, root, progress=False)
    content, key = sums(cache), cache.meta["key"]
    old_key = legacy_keys(bb, BASE)[1]
    meta = {k: v for k, v in cache.meta.items() if k not in ("precision", "shards", "shard_tokens", "devices", "config")}
    meta.update(format=2, layers="-1", key=old_key)
    meta["meta_sha"] = meta_sha(meta)
    os.rename(root / key, root / old_key)
    (root / old_key / "meta.json").write_text(json.dumps(meta))
    assert [e.status for e in scan(root)] == ["old format (re-keyed on next use)"]
    said = []
    again, secs = get_or_build(bb, BASE, root, progress=False, log=said.append)
    assert secs == 0.0 and again.meta["key"] == key and sums(again) == content
    assert again.meta["format"] == FORMAT_VERSION and again.meta["precision"] == "fp32"
    assert any("re-keyed" in s and old_key in s for s in said) and not (root / old_key).exists()
    # an entry under `--layer 2` finds it too: one entry for both spellings
    b2 = Backbone.load(str(tiny_bert), LayerSpec((2,)), max_length=16)
    assert get_or_build(b2, BASE, root, progress=False)[1] == 0.0


def test_a_format1_entry_is_listed_as_old_not_as_edited(bb, tmp_path):
    """Format 1 wrote no checksum of its meta.json, so `cache --list` called such an entry "meta.json edited: its
    checksum differs", untrue; it is now named as format 1, built anew by a run, removed by --prune."""
    root = tmp_path / "cache"
    cache, _ = get_or_build(bb, BASE, root, progress=False)
    meta = {k: v for k, v in cache.meta.items() if k not in ("meta_sha", "config", "precision")}
    (cache.path / "meta.json").write_text(json.dumps(dict(meta, format=1)))
    [entry] = scan(root)
    assert "cache format 1" in entry.status and "edited" not in entry.status and entry.removable
    assert prune(root) and not cache.path.exists()


def test_devices(monkeypatch):
    dev, said = resolve_device("cpu")
    assert dev == torch.device("cpu") and said.startswith("device: cpu")
    if not torch.cuda.is_available():
        dev, said = resolve_device("auto")
        assert dev.type in ("cpu", "mps") and "auto →" in said
        for spec in ("cuda", "cuda:1"):
            with pytest.raises(ExtractError, match=f"--device {spec}: .*Use --device cpu"):
                resolve_device(spec)
    with pytest.raises(ExtractError, match="give auto .*cpu, cuda, cuda:N or mps"):
        resolve_device("tpu")


def test_cli_device_and_shard_errors(tiny_bert, trec_slice, tmp_path):
    base = ("cache", str(trec_slice), "--backbone", str(tiny_bert), "--cache-dir", str(tmp_path / "c"), "--quiet")
    if not torch.cuda.is_available():
        cli(*base, "--device", "cuda", code=2, contains=("--device cuda",))
    cli(*base, "--device", "gpu0", code=2, contains=("--device 'gpu0'",))
    cli(*base, "--shard", "2/2", code=2, contains=("--shard", "0 <= i < N"))
    cli(*base, "--shard", "0/2", "--rebuild-cache", code=2, contains=("--rebuild-cache",))
    cli("cache", "--list", str(trec_slice), code=2, contains=("--list",))
    # options that only building an entry reads were accepted by --list / --prune and ignored
    cli("cache", "--list", "--backbone", str(tiny_bert), "--layer", "-2", "--no-token-types", "--cache-dir",
        str(tmp_path / "c"), code=2, contains=("--backbone, --layer, --no-token-types: options for building an entry",))
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_frozentune_cache_naming_a_file_is_refused(tiny_bert, trec_slice, tmp_path, monkeypatch):
    """FROZENTUNE_CACHE pointing at a file: --list said "…/afile/features: no cache entries" (status 0), --prune
    pruned nothing and a build failed with a bare "Not a directory". It is refused as --cache-dir FILE is,
    naming FROZENTUNE_CACHE."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    monkeypatch.setenv("FROZENTUNE_CACHE", str(afile))
    says = (f"FROZENTUNE_CACHE={afile}: a file, not a cache folder", "set FROZENTUNE_CACHE to a folder")
    cli("cache", "--list", code=2, contains=says)
    cli("cache", "--prune", code=2, contains=says)
    cli("cache", trec_slice, "--backbone", tiny_bert, "--quiet", code=2, contains=says)
    assert afile.read_text() == "not a folder"
    cli("cache", "--list", "--cache-dir", tmp_path / "c", code=0)  # a folder given: FROZENTUNE_CACHE is not read


def test_a_cache_folder_under_a_file_names_the_file(tiny_bert, trec_slice, tmp_path, monkeypatch):
    """FROZENTUNE_CACHE (or --cache-dir) below a file: --list said "no cache entries", a build said only "Not a
    directory", naming neither the file in the way nor the variable. Both are said now."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    monkeypatch.setenv("FROZENTUNE_CACHE", str(afile / "cache"))
    says = (f"FROZENTUNE_CACHE={afile / 'cache'}: under {afile}, a file", "set FROZENTUNE_CACHE to a folder")
    cli("cache", "--list", code=2, contains=says)
    cli("cache", trec_slice, "--backbone", tiny_bert, "--quiet", code=2, contains=says)
    monkeypatch.delenv("FROZENTUNE_CACHE")
    cli("cache", trec_slice, "--backbone", tiny_bert, "--quiet", "--cache-dir", afile / "x", code=2,
        contains=(f"({afile} is a file)", "give --cache-dir"))
    assert afile.read_text() == "not a folder"


def test_a_plan_with_a_shard_count_of_another_kind_is_listed(bb, tmp_path):
    """An interrupted build whose plan.json says "shards": "x" (int() raised in `cache --list`; found by
    bench/fuzz.py's cache part): listed with "?" for the count, and the rerun resumes it (a run goes by the plan's key
    and digest, not its count) to the entry one process makes."""
    root, whole = tmp_path / "cache", tmp_path / "whole"
    build_part(bb, MANY, Part(0, 2, "--shard 0/2"), root, progress=False, **KW)
    building = building_dir(root, cache_key(bb, MANY)[0])
    plan = json.loads((building / "plan.json").read_text())
    (building / "plan.json").write_text(json.dumps(dict(plan, shards="x")))
    listed = {e.path: e for e in scan(root)}[building]
    assert listed.status == "interrupted, resumable" and listed.shards == f"{(plan['shards'] + 1) // 2}/?"
    assert "interrupted, resumable" in cli("cache", "--list", "--cache-dir", str(root), code=0).out
    resumed, _ = get_or_build(bb, MANY, root, progress=False, **KW)
    assert sums(resumed) == sums(get_or_build(bb, MANY, whole, progress=False, **KW)[0]) and not building.exists()


def test_list_and_prune(bb, tmp_path, monkeypatch):
    """--prune removes what nothing can use (a build killed before its first shard, a dead merge's
    leftover) and keeps a build holding finished shards (a rerun resumes from them), saying so;
    include_resumable (the CLI's --include-resumable) removes that one too."""
    root = tmp_path / "cache"
    get_or_build(bb, BASE, root, progress=False)
    kill_after(monkeypatch, 3)  # shards are ≥ 2 batches: shard 0 finished, shard 1 half-written
    with pytest.raises(Killed):
        get_or_build(bb, MANY, root, progress=False, **KW)
    monkeypatch.undo()
    early = [t + " ?" for t in MANY]
    kill_after(monkeypatch, 1)  # killed inside its first shard: nothing to resume
    with pytest.raises(Killed):
        get_or_build(bb, early, root, progress=False, **KW)
    monkeypatch.undo()
    resumable, empty = building_dir(root, cache_key(bb, MANY)[0]), building_dir(root, cache_key(bb, early)[0])
    dead = "deadbeef" * 4 + ".partial-999999999-x"
    (root / dead).mkdir()  # a merge whose process is gone
    (root / "notes").mkdir()  # a folder of the user's own, in the folder given as the cache: never removed
    (root / "notes" / "todo.txt").write_text("keep me")
    rows = {e.path: e for e in scan(root)}
    entry = next(e for e in rows.values() if e.kind == "entry")
    assert entry.status == "ok" and entry.precision == "fp32" and entry.examples == len(BASE)
    total = len(plan_of(bb).shards)
    assert (rows[resumable].status, rows[resumable].shards) == ("interrupted, resumable", f"1/{total}")
    assert rows[empty].status == "interrupted" and rows[empty].shards.startswith("0/")
    assert rows[resumable].resumable and not rows[resumable].removable and rows[empty].removable
    assert rows[root / "notes"].kind == "other" and not rows[root / "notes"].removable  # it was 'unreadable', pruned
    answer = cli("cache", "--list", "--cache-dir", str(root), code=0)
    assert "interrupted, resumable" in answer.out and "ok" in answer.out and "not a cache entry" in answer.out
    answer = cli("cache", "--prune", "--cache-dir", str(root), code=0)  # as the CLI runs prune
    assert f"removed {empty.name}" in answer.out and f"removed {dead}" in answer.out
    assert f"kept {resumable.name}" in answer.out and "pruned 2 item(s)" in answer.out
    assert sorted(e.kind for e in scan(root)) == ["building", "entry", "other"] and resumable.is_dir()
    (kept,) = kept_lines(root)
    assert resumable.name in kept and f"1/{total} shards finished" in kept and "rerun the same command" in kept
    assert "--include-resumable" in kept
    assert get_or_build(bb, BASE, root, progress=False)[1] == 0.0  # the entry is intact
    assert "--include-resumable goes with --prune" in cli("cache", "--list", "--include-resumable",
                                                          "--cache-dir", str(root), code=2).err
    answer = cli("cache", "--prune", "--include-resumable", "--cache-dir", str(root), code=0)
    assert f"removed {resumable.name}" in answer.out and "kept" not in answer.out
    assert sorted(e.kind for e in scan(root)) == ["entry", "other"] and kept_lines(root) == []
    assert prune(root) == [] and (root / "notes" / "todo.txt").read_text() == "keep me"


def test_prune_says_what_it_could_not_remove(bb, tmp_path, monkeypatch):
    """--prune removed with ignore_errors and reported every item "removed" and "freed", status 0, even where
    nothing went (a read-only folder). It now removes what it can, says only that, names what stayed and why,
    and exits 2. A link named like a key was listed with its target's size and "removed" each time while it
    stayed: a link is not the cache's own, so it is listed as such (size 0, never followed) and left alone."""
    import frozentune.extract.entries as E

    root = tmp_path / "cache"
    stuck, goes = root / ("deadbeef" * 4 + ".partial-999999999-x"), root / ("cafebabe" * 4 + ".partial-999999999-y")
    for folder in (stuck, goes):  # merges whose process is gone: removable
        folder.mkdir(parents=True)
        (folder / "states.bin").write_bytes(b"x" * 5000)
    real = shutil.rmtree

    def read_only(path, ignore_errors=False, **kw):  # `stuck` sits where this user cannot delete
        if Path(path) == stuck:
            if not ignore_errors:
                raise PermissionError(13, "Permission denied", str(stuck / "states.bin"))
            return None
        return real(path, ignore_errors=ignore_errors, **kw)

    monkeypatch.setattr(E.shutil, "rmtree", read_only)
    answer = cli("cache", "--prune", "--cache-dir", root, code=2,
                 contains=("could not remove 1 item(s)", f"{stuck.name} (Permission denied (states.bin); 5.0 kB of it left)",
                           "(1 other item(s) were removed)"))
    assert f"removed {goes.name}" in answer.out and stuck.name not in answer.out
    assert "pruned 1 item(s), 5.0 kB freed" in answer.out and stuck.is_dir() and not goes.exists()
    from frozentune.cache import NotRemoved

    with pytest.raises(NotRemoved, match="could not remove 1 item") as e:
        prune(root)
    assert e.value.removed == []
    answer = cli("cache", "--prune", "--json", "--cache-dir", root, code=2, contains=("could not remove",))
    assert json.loads(answer.out) == []
    monkeypatch.undo()
    assert [x.path for x in prune(root)] == [stuck]

    target = tmp_path / "elsewhere"  # a key-named link to a folder of someone's
    target.mkdir()
    (target / "data.bin").write_bytes(b"y" * 20000)
    link = root / ("ab" * 16)
    link.symlink_to(target, target_is_directory=True)
    (row,) = scan(root)
    assert (row.path, row.kind, row.bytes) == (link, "other", 0) and not row.removable
    assert row.status == f"a symbolic link to {target}, not the cache's own (left alone)"
    answer = cli("cache", "--prune", "--cache-dir", root, code=0)
    assert "pruned 0 item(s)" in answer.out and link.is_symlink() and (target / "data.bin").stat().st_size == 20000
    assert "a symbolic link to" in cli("cache", "--list", "--cache-dir", root, code=0).out


def test_prune_removes_the_lock_files_no_build_holds(bb, tmp_path):
    """A build killed (SIGKILL, a power cut) before releasing its lock left `<key>.lock`, which --prune never
    removed. A lock file no process holds is now removed; one a build holds is kept."""
    from frozentune.cache import build_lock

    root = tmp_path / "cache"
    root.mkdir()
    stale = root / (cache_key(bb, BASE)[0] + ".lock")
    stale.write_text("")  # as a killed build leaves it
    held_key = cache_key(bb, MANY)[0]
    with build_lock(root, held_key, print):  # a build running now
        answer = cli("cache", "--prune", "--cache-dir", root, code=0)
        assert f"removed {stale.name} (lock, held by no process" in answer.out and "pruned 1 item(s)" in answer.out
        assert not stale.exists() and (root / f"{held_key}.lock").is_file()
        assert prune(root) == []
    assert sorted(p.name for p in root.iterdir()) == []  # released: the build removed its own
    (root / "notes.lock").write_text("mine")  # not a name frozentune writes: left alone
    assert prune(root) == [] and (root / "notes.lock").read_text() == "mine"
    assert get_or_build(bb, BASE, root, progress=False)[1] > 0  # a build takes its lock anew


def test_remove_holds_the_build_lock_while_it_deletes(bb, tmp_path, monkeypatch):
    """`cache --remove` checked for a running build, then deleted without the build lock: a build (a
    --rebuild-cache) that started in between lost its folder mid-way. Each key's lock is now held from the
    check to the end of its deletion, and released after (the lock file gone, a later build takes it)."""
    import frozentune.extract.entries as E
    from frozentune.cache import build_lock

    root = tmp_path / "cache"
    key = get_or_build(bb, BASE, root, progress=False)[0].path.name
    seen = []
    real = E.remove

    def remove(path):  # what a build starting now would find: the lock held by --remove
        seen.append((path.name, S.lock_held(root / f"{key}.lock")))
        return real(path)

    monkeypatch.setattr(E, "remove", remove)
    assert [e.path.name for e in E.remove_entries(root, [key[:12]])] == [key] and seen == [(key, True)]
    assert sorted(p.name for p in root.iterdir()) == []  # entry and lock file gone
    key = get_or_build(bb, BASE, root, progress=False)[0].path.name  # built again, its lock taken anew
    with build_lock(root, key, print):  # a build holding it (the status check saw nothing running)
        with pytest.raises(CacheError, match="being built now"):
            E.remove_entries(root, [key])
    assert (root / key).is_dir() and len(seen) == 1


def test_remove_chosen_entries_and_the_source_they_record(tiny_bert, trec_slice, tmp_path):
    """A full disk left no way to remove chosen complete entries but `rm -rf` of 32-hex folders, and nothing
    said which dataset an entry held. An entry now records the file its texts came from (meta.json's source,
    under its checksum, not in its key: the same texts from another file are the same entry, which keeps the
    first file), shown by --list and --json; `cache --remove KEY` deletes the entries named by a key or a
    unique prefix of 8 or more hex digits, refusing unknown, ambiguous or running ones before removing any."""
    from frozentune import api
    from frozentune.cache import build_lock

    root = tmp_path / "cache"
    build = ("cache", trec_slice, "--backbone", tiny_bert, "--cache-dir", root, "--quiet")
    cli(*build, code=0)
    rows = {e.examples: e for e in scan(root)}
    train, test = rows[120], rows[40]
    assert train.source == str((trec_slice / "train.jsonl").resolve()) and test.source.endswith("test.jsonl")
    meta = json.loads((train.path / "meta.json").read_text())
    assert meta["source"] == train.source and meta["meta_sha"] == meta_sha(meta)
    with pytest.raises(CacheError, match="edited or corrupt"):  # the checksum covers it
        (train.path / "meta.json").write_text(json.dumps(dict(meta, source="elsewhere")))
        CachedStates(train.path)
    (train.path / "meta.json").write_text(json.dumps(meta, indent=1))
    assert "source" in cli("cache", "--list", "--cache-dir", root, code=0).out
    assert {r["source"] for r in json.loads(cli("cache", "--list", "--json", "--cache-dir", root, code=0).out)} == \
        {train.source, test.source}
    other = tmp_path / "copy"  # the same texts from another file: the same entry, its first source kept
    other.mkdir()
    shutil.copy(trec_slice / "train.jsonl", other / "train.jsonl")
    cli("cache", other, "--backbone", tiny_bert, "--cache-dir", root, "--quiet", code=0)
    assert {e.path: e.source for e in scan(root)} == {train.path: train.source, test.path: test.source}
    # train records the file too (an entry of another --max-length: new states)
    api.train("probe", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=32), cache_root=root,
              progress=False, log=lambda s: None)
    assert sorted(e.source for e in scan(root) if e.path not in (train.path, test.path)) == [test.source, train.source]

    key = train.path.name
    twin = root / (key[:8] + "0" * 24)  # another entry whose key starts with the same 8 digits
    twin.mkdir()
    cli("cache", "--remove", "entry1", "--cache-dir", root, code=2, contains=("--remove entry1: not a cache key",))
    cli("cache", "--remove", key[:7], "--cache-dir", root, code=2, contains=("not a cache key", "at least its first 8"))
    cli("cache", "--remove", "ffffffff", "--cache-dir", root, code=2,
        contains=("no cache entry in", "has that key", key[:16] + "…", "--list"))
    cli("cache", "--remove", key[:8], "--cache-dir", root, code=2,
        contains=(f"the keys of 2 entries start with it ({twin.name}, {key})", "give more of the key"))
    with build_lock(root, test.path.name, print):
        cli("cache", "--remove", test.path.name[:10], "--cache-dir", root, code=2, contains=("being built now",))
    cli("cache", "--remove", test.path.name, "ffffffff", "--cache-dir", root, code=2, contains=("no cache entry",))
    assert test.path.is_dir() and twin.is_dir() and train.path.is_dir()  # refused: nothing removed
    cli("cache", "--remove", key, "--list", "--cache-dir", root, code=2, contains=("give one of --list, --prune or --remove",))
    cli("cache", "--remove", key, "--verify", "--cache-dir", root, code=2, contains=("--verify goes with",))
    answer = cli("cache", "--remove", key[:16] + "…", twin.name, "--cache-dir", root, code=0)  # as --list shows it
    assert f"removed {key} (entry, ok, " in answer.out and "120 examples, " + train.source in answer.out
    assert f"removed {twin.name} (entry, unreadable" in answer.out and "removed 2 item(s), " in answer.out
    assert not train.path.exists() and not twin.exists() and test.path.is_dir()
    assert "--remove KEY deletes the ones you choose" in C.ROOM_ADVICE


def test_a_finished_part_waits_and_is_kept(bb, reference, tmp_path, monkeypatch):
    """`--shard 0/2` finishes its share and stops: --list says the build waits for the other parts,
    --prune keeps it (and says why), and part 1/2 then completes the one-process entry. A part
    interrupted before its share is done is resumable, not waiting."""
    root = tmp_path / "cache"
    key = cache_key(bb, MANY)[0]
    folder, total = building_dir(root, key), len(plan_of(bb).shards)
    kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        build_part(bb, MANY, Part(0, 2, "--shard 0/2"), root, progress=False, **KW)
    monkeypatch.undo()
    (row,) = scan(root)
    assert (row.status, row.shards, row.parts) == ("interrupted, resumable", f"1/{total}", "")
    cache, stats = build_part(bb, MANY, Part(0, 2, "--shard 0/2"), root, progress=False, **KW)
    assert cache is None and stats.report.missing
    (row,) = scan(root)
    half = (total + 1) // 2
    assert (row.status, row.shards, row.parts) == ("waiting for other parts", f"{half}/{total}", "0/2")
    assert row.resumable and not row.removable
    rows = json.loads(cli("cache", "--list", "--json", "--cache-dir", str(root), code=0).out)
    assert [(r["status"], r["shards"], r["parts"]) for r in rows] == [("waiting for other parts", f"{half}/{total}",
                                                                      "0/2")]
    assert prune(root) == [] and folder.is_dir()
    (kept,) = kept_lines(root)
    assert "waiting for other parts" in kept and "part 0/2 done" in kept and "--shard" in kept
    said: list[str] = []
    cache, _ = build_part(bb, MANY, Part(1, 2, "--shard 1/2"), root, progress=False, log=said.append, **KW)
    assert sums(cache) == sums(reference) and scan(root)[0].kind == "entry"
    # part 1/2 found part 0/2's shards: that is not a resume of its own (it was said to be one)
    assert not any("resum" in line for line in said), said


def test_resume_needs_the_shard_size_it_was_started_with(bb, reference, tmp_path, monkeypatch):
    """A build started with FROZENTUNE_SHARD_TOKENS=150, rerun without it (the default size): the
    plans are compared before any shard is counted, so the answer names the variable and the value
    to resume with — not a shard "of another plan" (all are), not another version — and nothing
    is touched. Rerun with it, the build resumes into the uninterrupted entry's bytes."""
    root = tmp_path / "cache"
    key = cache_key(bb, MANY)[0]
    folder = building_dir(root, key)
    monkeypatch.setenv(S.SHARD_ENV, str(SHARD))
    kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        get_or_build(bb, MANY, root, progress=False, max_tokens=128)
    monkeypatch.undo()  # the variable is unset again, as in a plain rerun
    before = sorted((p.relative_to(folder), p.stat().st_size) for p in folder.rglob("*"))
    assert (folder / "shard-00000.json").is_file() and os.environ.get(S.SHARD_ENV) is None
    with pytest.raises(ExtractError) as e:
        get_or_build(bb, MANY, root, progress=False, max_tokens=128)
    said = str(e.value)
    assert f"started with {S.SHARD_ENV}={SHARD} (shards of {SHARD} tokens)" in said
    assert f"rerun with {S.SHARD_ENV}={SHARD} to resume it" in said and "--rebuild-cache" in said
    assert f"{S.SHARD_TOKENS:,} tokens (the default, {S.SHARD_ENV} unset)" in said
    assert "shard-00000" not in said and "version" not in said
    with pytest.raises(ExtractError, match=f"rerun with {S.SHARD_ENV}={SHARD} to resume") as e:  # as well for a part,
        build_part(bb, MANY, Part(1, 2, "--shard 1/2"), root, progress=False, max_tokens=128)
    # which cannot start over with --rebuild-cache (parts refuse it): it is told what can
    assert f"or delete {folder} and rerun every part (2) to start over" in str(e.value)
    assert "--rebuild-cache" not in str(e.value)
    assert sorted((p.relative_to(folder), p.stat().st_size) for p in folder.rglob("*")) == before
    monkeypatch.setenv(S.SHARD_ENV, str(SHARD))
    said = []
    cache, secs = get_or_build(bb, MANY, root, progress=False, max_tokens=128, log=said.append)
    assert secs > 0 and sums(cache) == sums(reference) and any("resumed" in s for s in said)


def test_a_plan_of_other_batch_settings_says_which(bb, tmp_path, monkeypatch):
    """Batch settings (not the shard size) differ: the answer names them and --rebuild-cache."""
    root = tmp_path / "cache"
    kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        get_or_build(bb, MANY, root, progress=False, **KW)
    monkeypatch.undo()
    with pytest.raises(ExtractError, match=r"max_tokens 128, now 256.*--rebuild-cache"):
        get_or_build(bb, MANY, root, progress=False, shard_tokens=SHARD, max_tokens=256)


def test_a_build_folder_left_beside_its_entry_is_removed(bb, reference, tmp_path, monkeypatch):
    """Publishing renames the entry into place, then removes the build folder (whose data files are
    links to the entry's). An interrupt there left the folder listed as "interrupted, resumable" and
    kept by --prune, its bytes counted twice: the removal now finishes before the interrupt goes on,
    and a folder left so anyway (a kill) is listed as left over and pruned."""
    import frozentune.cache as C

    root = tmp_path / "cache"
    key = cache_key(bb, MANY)[0]
    folder = building_dir(root, key)
    real = shutil.rmtree
    calls = []

    def interrupted(path, *a, **k):
        if str(path).endswith(".building") and not calls:
            calls.append(path)
            raise KeyboardInterrupt  # arrives as the removal starts
        return real(path, *a, **k)

    monkeypatch.setattr(C.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        get_or_build(bb, MANY, root, progress=False, **KW)
    monkeypatch.undo()
    assert calls and not folder.exists() and [e.kind for e in scan(root)] == ["entry"]
    assert sums(get_or_build(bb, MANY, root, progress=False, **KW)[0]) == sums(reference)
    # a kill leaves it whole: simulated with the shards of an interrupted build of the same key
    shutil.rmtree(root)
    kill_after(monkeypatch, 3)
    with pytest.raises(Killed):
        get_or_build(bb, MANY, root, progress=False, **KW)
    monkeypatch.undo()
    shutil.copytree(folder, tmp_path / "kept")
    get_or_build(bb, MANY, root, progress=False, **KW)
    shutil.copytree(tmp_path / "kept", folder)
    (row,) = [e for e in scan(root) if e.kind == "building"]
    assert row.status == "left over beside its complete entry" and row.removable
    assert [e.path for e in prune(root)] == [folder] and not folder.exists()
    assert sums(get_or_build(bb, MANY, root, progress=False, **KW)[0]) == sums(reference)


def test_running_build_is_not_pruned(bb, tmp_path):
    root = tmp_path / "cache"
    key, fields = cache_key(bb, MANY)
    folder = building_dir(root, key)
    S.open_plan(folder, key, fields, plan_of(bb), {})
    with S.active(folder):
        assert [e.status for e in scan(root)] == ["running"] and prune(root) == []
        answer = cli("cache", "--prune", "--cache-dir", str(root), code=0)  # it says what it kept, and why
        assert f"kept {folder.name} (running: a process is extracting into it now" in answer.out
        assert "pruned 0 item(s)" in answer.out and folder.is_dir()
    assert [e.status for e in scan(root)] == ["interrupted"]


def _entry_files(root: Path) -> dict:
    entries = [p for p in root.iterdir() if p.is_dir() and "." not in p.name]
    assert len(entries) == 2, entries  # train and test
    return {json.loads((p / "meta.json").read_text())["n"]: {f: (p / f).read_bytes() for f in FILES} for p in entries}


def test_torchrun_two_processes_equal_one(tiny_bert, trec_slice, tmp_path):
    """`frozentune cache` under torchrun (2 CPU processes, one thread each) writes the entry one
    process (one thread) writes, byte for byte; each rank reports its part."""
    env = dict(os.environ, OMP_NUM_THREADS="1", FROZENTUNE_SHARD_TOKENS="300")
    args = ["-m", "frozentune.cli", "cache", str(trec_slice), "--backbone", str(tiny_bert), "--quiet",
            "--precision", "fp32", "--device", "cpu"]
    one = subprocess.run([sys.executable, *args, "--cache-dir", str(tmp_path / "one")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          *args, "--cache-dir", str(tmp_path / "two")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "part 0 of 2" in two.stdout and "part 1 of 2" in two.stdout
    assert _entry_files(tmp_path / "one") == _entry_files(tmp_path / "two")
    assert not list((tmp_path / "two").glob("*.building"))


def test_fp32_states_are_the_ones_before_shards(bb, reference):
    """The fp32 pass stores exactly what the one-piece extraction stored before shards existed
    (same batches, same model, same cast), so re-keyed format-2 entries hold the right states."""
    from frozentune.backbone import iter_states

    tokens = bb.tokenize(MANY)
    old = b"".join(states[mask].to(torch.float16).numpy().tobytes()
                   for _, states, mask in iter_states(bb.model, bb.tok, tokens, bb.layers, max_tokens=128))
    assert old == (reference.path / "states.bin").read_bytes()  # exact: the same kernels on the same batches


def test_publishing_links_the_shards_bytes_and_writes_no_state_twice(bb, reference, tmp_path, monkeypatch):
    """The shards write the entry's states in place; publishing checks and checksums them, then
    links the files into the entry: the files it writes hold only offsets and lengths."""
    import frozentune.cache as C

    real, written = C._ChunkedWriter.write, []

    def counts(self, data):
        if self.f is not None:
            written.append(len(memoryview(data).cast("B")))
        return real(self, data)

    monkeypatch.setattr(C._ChunkedWriter, "write", counts)
    cache, _ = get_or_build(bb, MANY, tmp_path / "cache", progress=False, **KW)
    assert sums(cache) == sums(reference)
    assert sum(written) == len(MANY) * (8 + 4)  # offsets (int64) and lengths (int32), nothing else


def test_publishing_without_hard_links_moves_the_files_back_when_it_fails(bb, reference, tmp_path, monkeypatch):
    """A file system without hard links: the data files are moved into the entry instead; when
    publishing then fails (disk full writing the offsets), they are moved back, so the rerun
    publishes the finished shards without extracting any again."""
    import errno

    import frozentune.cache as C

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    real = C._ChunkedWriter.write

    def full(self, data):
        if self.f is not None:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    root = tmp_path / "cache"
    monkeypatch.setattr(C.os, "link", no_links)
    monkeypatch.setattr(C._ChunkedWriter, "write", full)
    with pytest.raises(CacheError, match="No space left on device.*finished shards"):
        get_or_build(bb, MANY, root, progress=False, **KW)
    folder = building_dir(root, cache_key(bb, MANY)[0])
    assert (folder / "states.bin").is_file() and (folder / "ids.bin").is_file()
    monkeypatch.setattr(C._ChunkedWriter, "write", real)
    cache, secs = get_or_build(bb, MANY, root, progress=False, **KW)
    assert secs == 0.0 and sums(cache) == sums(reference) and not folder.exists()


def test_shards_written_without_pwrite_are_the_same_bytes(bb, reference, tmp_path, monkeypatch):
    """Where the OS has no pwrite (Windows), a seek and a write put the rows in the same places."""
    monkeypatch.delattr(S.os, "pwrite")
    cache, _ = get_or_build(bb, MANY, tmp_path / "cache", progress=False, **KW)
    assert sums(cache) == sums(reference)

"""FeatureCache: frozen token states on disk — ragged, fp16, memory-mapped, content-keyed.

A cache entry is a folder `<root>/<key>/`:
  states.bin   (N_tok, D) fp16 (or fp32) token states of all examples, no padding, stored in
               extraction order (longest first)
  ids.bin      (N_tok,) int32 token ids (for explanations)
  offsets.bin  (N,) int64 first row of example i;  lengths.bin (N,) int32 its token count
  meta.json    written last: key inputs, shapes, sizes and chunk checksums of every file, where the
               texts came from (source, where the caller said: not part of the key), and
               meta_sha, a checksum of meta.json's own content (so an edit of it is found)

The key hashes the model's weights, the tokenizer's definition, the layer choice (absolute
indices), max_length, the precision of the pass, the dtype and every text, so a changed input
never returns stale states. Entries are extracted in shards under `<key>.building/` (resumable,
splittable across processes: see extract/shards.py, whose files become the entry's), checked and
gathered in a `.partial-*` folder and renamed into place only when complete, by one process at a time (an flock on
`<root>/<key>.lock`: a second process asking for the same entry waits, then reads it).
Format-2 entries (before shards) are re-keyed on first use, their states untouched.
A reader checks that the entry is the one asked for (key, example count, dimension, dtype), that
its files' sizes agree with each other and with meta.json, and the checksums; it raises
CacheError (with the way out) on anything truncated, corrupt, edited, moved or from an
incompatible format version — never returns wrong states.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from . import locks
from .errors import FrozentuneError
from .backbone import (Backbone, Tokenized, cache_home, file_in_the_way, holds_special_text, iter_states,
                       tokenizer_hash)
from .pairs import Text, pair_kind
from .extract.entries import size_text
from .extract.errors import ExtractError
from .extract.shards import (CHUNK, DATA, ChunkSums, Part, Plan, building_dir, check_plan, extract_part, finished,
                              finished_spans, make_plan, merge, read_json, rekey_build, seconds_in, shard_records,
                              start_over, work_of)

FORMAT_VERSION = 4  # 2: meta.json carries meta_sha; 3: built in shards, key has precision and absolute layers;
#                    4: key has the model's config (config_hash) too
DTYPES = {"float16": np.float16, "float32": np.float32}


REBUILD = "Rebuild it: rerun with --rebuild-cache (train, eval and cache take it)."


class CacheError(FrozentuneError, RuntimeError):
    """A cache entry is missing, truncated, corrupt or incompatible; the message says what to do."""


class NotRemoved(CacheError):
    """Some of what `cache --prune` was to delete could not be removed (a read-only folder, another owner's
    files): the message says which and why; `removed` holds the entries.Entry items that did go."""

    def __init__(self, message: str, removed: list):
        super().__init__(message)
        self.removed = removed


def default_root() -> Path:
    return cache_home() / "features"


def texts_hash(texts: Sequence[Text]) -> str:
    """Hash of every text in order; a sentence pair hashes both its texts, marked as a pair."""
    h = hashlib.blake2b(digest_size=16)
    for t in texts:
        for part in (t if isinstance(t, tuple) else (t,)):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
        if isinstance(t, tuple):
            h.update(b"\xffpair")
    return h.hexdigest()


# every field cache_key may hash; meta.json holds them as they were (beside fields that are not the key's)
KEY_FIELDS = ("format", "model", "weights", "config", "tokenizer", "layers", "max_length", "precision", "dtype",
              "texts", "n", "split_special_tokens", "pairs", "token_types")


def cache_key(backbone: Backbone, texts: Sequence[str], dtype: str = "float16") -> tuple[str, dict]:
    """(key, the fields it was made from). Any change in model weights, config, tokenizer, layers
    (as absolute indices: -3 and 4 of a 6-layer model are one entry), max_length, the precision
    of the pass, the stored dtype or any text changes the key; the device does not."""
    fields = {
        "format": FORMAT_VERSION,
        "model": backbone.name,
        "weights": backbone.weights_hash,
        "config": backbone.config_hash,
        "tokenizer": tokenizer_hash(backbone.tok),
        "layers": backbone.layer_key,
        "max_length": backbone.max_length,
        "precision": backbone.precision,
        "dtype": dtype,
        "texts": texts_hash(texts),
        "n": len(texts),
    }
    if holds_special_text(backbone.tok, texts):  # a literal "[SEP]" is now read as text (backbone.text_as_text):
        fields["split_special_tokens"] = True    # other ids than an entry made before; other texts keep their key
    if pair_kind(texts):  # sentence pairs (encoded as pairs): never the entry of the same texts glued
        fields["pairs"] = True
        if not backbone.token_types:  # the same pairs fed without token type ids: other states
            fields["token_types"] = False
    return _key_of(fields), fields


def meta_sha(meta: dict) -> str:
    """Checksum of a meta.json's content: everything in it but meta_sha, as canonical JSON."""
    body = json.dumps({k: v for k, v in meta.items() if k != "meta_sha"}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


class _ChunkedWriter:
    """Appends bytes to a file and keeps a blake2b digest per CHUNK bytes (ChunkSums); with path None,
    only the digests (of bytes that are already in a file)."""

    def __init__(self, path: Path | None):
        self.f = open(path, "wb") if path is not None else None
        self.sums = ChunkSums()

    def write(self, data: bytes | memoryview) -> None:
        mv = memoryview(data).cast("B")
        if self.f is not None:
            self.f.write(mv)
        self.sums.update(mv)

    def close(self) -> dict:
        if self.f is not None:
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
        return self.sums.close()


def _file_sums(path: Path) -> dict[int, str]:
    """Checksum of every chunk, read with plain I/O (no growth of resident memory)."""
    out = {}
    size = path.stat().st_size
    with open(path, "rb") as f:
        for c in range((size + CHUNK - 1) // CHUNK):
            f.seek(c * CHUNK)
            out[c] = blake2b_of(_Limited(f, CHUNK))
    return out


def blake2b_of(f, block: int = 1 << 20) -> str:
    """The 16-byte blake2b digest (hex) of what a binary file object holds from where it stands, read in
    blocks (hashlib.file_digest does this from Python 3.11 only; the package supports 3.10)."""
    h = hashlib.blake2b(digest_size=16)
    buf = bytearray(block)
    view = memoryview(buf)
    while n := f.readinto(buf):
        h.update(view[:n])
    return h.hexdigest()


class _Limited:
    """A read-only file view that stops after n bytes (for blake2b_of)."""

    def __init__(self, f, n: int):
        self.f, self.left = f, n

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        mv = memoryview(buf)[: self.left]
        got = self.f.readinto(mv) if len(mv) else 0
        self.left -= got
        return got


FILES = ("states.bin", "ids.bin", "offsets.bin", "lengths.bin")


@dataclass
class BuildStats:
    examples: int
    tokens: int
    seconds: float
    files: dict  # file name → {"size", "chunks"}
    complete: bool = True  # False: not published by this call (shards missing, or a part of several)
    report: object = None  # extract.shards.ShardReport of this process's part
    shards: int = 0


def is_count(v: object) -> bool:
    """v is a whole number ≥ 0 (not a bool), as meta.json's sizes and counts are."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def meta_problems(meta: dict) -> list[str]:
    """The fields of an entry's meta.json that a reader relies on and that are missing or of an unusable kind
    (names as "n", "files.states.bin"); [] when none. `cache --list` shows the same as the reader says."""
    files, dtype = meta.get("files"), meta.get("dtype")
    bad = [f for f, ok in (("key", isinstance(meta.get("key"), str)), ("n", is_count(meta.get("n"))),
                           ("dim", is_count(meta.get("dim")) and meta["dim"] > 0),
                           ("dtype", isinstance(dtype, str) and dtype in DTYPES),
                           ("tokens", is_count(meta.get("tokens"))), ("files", isinstance(files, dict)))
           if not ok]
    if not bad:
        for name in FILES:
            e = files.get(name)
            if not (isinstance(e, dict) and is_count(e.get("size")) and isinstance(e.get("chunks"), list)):
                bad.append(f"files.{name}")
    return bad


class CachedStates:
    """Read side of a cache entry. Rows are memory-mapped; `batch` copies only what it needs,
    and `release` drops mapped pages from this process (they stay in the OS page cache), so
    resident memory stays bounded however large the cache is."""

    def __init__(self, path: Path, verify: str = "full", key: str | None = None, n: int | None = None,
                 dim: int | None = None, dtype: str | None = None, legacy: bool = False):
        """verify: 'full' checks sizes and every checksum (≈0.7 GB/s); 'none' only sizes.
        key, n, dim, dtype: what the caller asked for (get_or_build passes them); an entry that
        is not that — files moved or copied from another entry — is a CacheError. legacy: an entry
        of format 2 or 3 is read too (the same files; get_or_build re-keys them where it can write)."""
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise CacheError(f"{self.path}: not a complete cache entry (no meta.json). Delete it "
                             f"or rebuild it: rerun with --rebuild-cache (train, cache).")
        try:
            self.meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CacheError(f"{meta_path}: corrupt metadata. {REBUILD}") from None
        if not isinstance(self.meta, dict):
            raise CacheError(f"{meta_path}: corrupt metadata. {REBUILD}")
        if self.meta.get("format") not in ((2, 3, FORMAT_VERSION) if legacy else (FORMAT_VERSION,)):
            raise CacheError(f"{self.path}: cache format {self.meta.get('format')} is not this "
                             f"version's ({FORMAT_VERSION}). {REBUILD}")
        try:
            edited = self.meta.get("meta_sha") != meta_sha(self.meta)
        except ValueError:  # NaN or infinity written into it
            edited = True
        if edited:
            raise CacheError(f"{meta_path}: edited or corrupt (its content does not match its "
                             f"checksum), so the entry cannot be trusted. {REBUILD}")
        self._check_fields()
        self._check_expected(key, n, dim, dtype)
        self._check(verify)
        self.n: int = self.meta["n"]
        self.dim: int = self.meta["dim"]
        self.dtype = DTYPES[self.meta["dtype"]]
        self._check_layout()  # reads offsets and lengths
        self._maps = {}
        self.states = self._map("states.bin", self.dtype).reshape(-1, self.dim)  # (N_tok, D)
        self._states_t = torch.from_numpy(self.states)  # same memory, for torch's fast gather
        self.ids = self._map("ids.bin", np.int32)  # (N_tok,)
        self._since_release = 0

    def _check_fields(self) -> None:
        """Every field the reader relies on is there with a usable type."""
        if bad := meta_problems(self.meta):
            raise CacheError(f"{self.path / 'meta.json'}: missing or invalid {', '.join(bad)}. {REBUILD}")

    def _check_expected(self, key: str | None, n: int | None, dim: int | None, dtype: str | None) -> None:
        """The entry is the one its folder name and the caller say it is."""
        m = self.meta
        if m["key"] != self.path.name or (key is not None and m["key"] != key):
            raise CacheError(f"{self.path}: holds the files of another cache entry ({m['key']}), moved or "
                             f"copied here. {REBUILD}")
        asked = {"examples": (n, f"holds {m['n']} examples, but {n} texts were asked for"),
                 "dim": (dim, f"holds states of dimension {m['dim']}, but the backbone's is {dim}"),
                 "dtype": (dtype, f"holds {m['dtype']} states, but {dtype} was asked for")}
        for field, (want, says) in asked.items():
            if want is not None and m["n" if field == "examples" else field] != want:
                raise CacheError(f"{self.path}: {says}; it is not the entry its key names. {REBUILD}")

    def _check_layout(self) -> None:
        """File sizes agree with each other, and every example's rows lie inside states.bin."""
        m, sizes = self.meta, {name: self.meta["files"][name]["size"] for name in FILES}
        tokens, n = m["tokens"], m["n"]
        want = {"states.bin": tokens * m["dim"] * np.dtype(self.dtype).itemsize, "ids.bin": tokens * 4,
                "offsets.bin": n * 8, "lengths.bin": n * 4}
        for name in FILES:
            if sizes[name] != want[name]:
                raise CacheError(f"{self.path / name}: {sizes[name]} bytes, but {n} examples of {tokens} tokens "
                                 f"× {m['dim']} {m['dtype']} need {want[name]}. {REBUILD}")
        self.offsets = offs = np.fromfile(self.path / "offsets.bin", dtype=np.int64)
        self.lengths = lens = np.fromfile(self.path / "lengths.bin", dtype=np.int32).astype(np.int64)
        if (lens < 0).any() or int(lens.sum()) != tokens or (offs < 0).any() or (offs + lens > tokens).any():
            raise CacheError(f"{self.path}: offsets.bin and lengths.bin do not describe {tokens} tokens of "
                             f"{n} examples. {REBUILD}")

    def _check(self, verify: str) -> None:
        files = self.meta["files"]
        for name in FILES:
            p = self.path / name
            if not p.is_file():
                raise CacheError(f"{p}: missing cache file. {REBUILD}")
            if p.stat().st_size != files[name]["size"]:
                raise CacheError(f"{p}: truncated or overwritten ({p.stat().st_size} bytes, "
                                 f"expected {files[name]['size']}). {REBUILD}")
        if verify == "none":
            return
        for name in FILES:
            want = files[name]["chunks"]
            got = _file_sums(self.path / name)
            for c, s in got.items():
                if c >= len(want) or s != want[c]:
                    end = min((c + 1) * CHUNK, files[name]["size"])
                    raise CacheError(f"{self.path / name}: corrupt (checksum of bytes "
                                     f"{c * CHUNK}..{end} differs). {REBUILD}")

    def _map(self, name: str, dtype) -> np.ndarray:
        if self.meta["files"][name]["size"] == 0:
            return np.zeros(0, dtype=dtype)
        with open(self.path / name, "rb") as f:
            # copy-on-write: writable to numpy/torch without a copy, never written, file untouched
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._maps[name] = mm
        return np.frombuffer(mm, dtype=dtype)

    def __len__(self) -> int:
        return self.n

    @property
    def build_seconds(self) -> float:
        """What building this entry took, every run's shards together (meta.json's extract_seconds; 0.0 where it
        was not recorded as a number ≥ 0: the field is information, not part of the states)."""
        return seconds_in(self.meta.get("extract_seconds"))

    def example(self, i: int) -> np.ndarray:
        """(L_i, D) states of example i, as stored."""
        o = self.offsets[i]
        return self.states[o:o + self.lengths[i]]

    def token_ids(self, i: int) -> np.ndarray:
        o = self.offsets[i]
        return np.asarray(self.ids[o:o + self.lengths[i]])

    def batch(self, idx: np.ndarray) -> tuple[Tensor, Tensor]:
        """(B, T, D) float32 states and (B, T) bool mask for examples idx, padded to the longest.
        One torch gather over the mapped rows (padding slots read a real row, then are zeroed)."""
        idx = np.asarray(idx)
        lens = self.lengths[idx]                                   # (B,)
        B, T = len(idx), int(lens.max())
        pos = np.arange(T)
        rows = self.offsets[idx][:, None] + np.minimum(pos[None, :], lens[:, None] - 1)  # (B, T)
        mask = torch.from_numpy(pos[None, :] < lens[:, None])      # (B, T)
        out = self._states_t.index_select(0, torch.from_numpy(rows.reshape(-1)))
        out = out.view(B, T, self.dim).float().masked_fill_(~mask.unsqueeze(-1), 0.0)
        self._since_release += B * T * self.dim * self.states.itemsize
        if self._since_release > (256 << 20):
            self.release()
        return out, mask

    def release(self) -> None:
        """Drop this process's mapped pages (data stays in the OS page cache)."""
        for mm in self._maps.values():
            mm.madvise(mmap.MADV_DONTNEED)
        self._since_release = 0


def _clean_partials(root: Path) -> None:
    """Remove partial folders left by merges whose process is gone."""
    for p in root.glob("*.partial-*"):
        try:
            pid = int(p.name.split(".partial-")[1].split("-")[0])
            os.kill(pid, 0)
        except (ValueError, IndexError, ProcessLookupError):
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass


def hard_limit(hard: int) -> str:
    """A process's hard limit on open files, as the messages about it say it."""
    import resource

    return "no hard limit" if hard == resource.RLIM_INFINITY else f"the hard limit is {hard}"


def fd_advice(e: OSError) -> str | None:
    """What to do when `e` is the process (EMFILE) or the system (ENFILE) out of open files, not a disk or folder
    problem (the cache's advice was "free space there"); None for any other error."""
    import errno
    import resource

    if e.errno == errno.EMFILE:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (f"too many open files: this process may open {soft} (ulimit -n; {hard_limit(hard)}); raise it, e.g. "
                f"ulimit -n 4096, and run again")
    if e.errno == errno.ENFILE:
        return "the system is out of open files (its file-max); close other programs' files and run again"
    return None


def write_advice(e: OSError, part: Part | None = None, folder: Path | None = None) -> str:
    """What to do about an OSError met writing a cache entry, by its kind: out of open files (fd_advice), a folder
    where the build writes a file or a file where it makes a folder (a damaged build: start it over; the advice was
    "free space there"), no permission, or (any other: a full disk, a quota) room."""
    import errno

    if advice := fd_advice(e):
        return advice
    if e.errno in (errno.EISDIR, errno.ENOTDIR):
        where = f"{e.filename}: " if e.filename else ""
        return (f"{where}a folder stands where the build writes a file, or a file where it makes a folder (not what "
                f"frozentune wrote there); {start_over(folder, part) if folder else 'rerun with --rebuild-cache'}")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "give --cache-dir a folder you can write to"
    return "free space there or give --cache-dir a writable folder with room"


def _write_error(root: Path, key: str, e: OSError, part: Part | None = None) -> CacheError:
    folder = building_dir(root, key)
    kept = list(shard_records(folder).values()) if folder.is_dir() else []
    size = sum(f["size"] for r in kept for f in _record_files(r) if isinstance(f, dict) and is_count(f.get("size")))
    advice = write_advice(e, part, folder)
    return CacheError(f"{root}: cannot write cache entry {key} ({e.strerror or e}); {advice}"
                      + (f"; its {len(kept)} finished shards ({size_text(size)}) are kept in {folder.name}: "
                         f"rerun to resume from them, or `frozentune cache --prune --include-resumable` removes them"
                         if kept else ""))


def _record_files(record: Path) -> list:
    """The per-file entries a shard's record holds ([] where it is unreadable or damaged)."""
    files = (read_json(record) or {}).get("files")
    return list(files.values()) if isinstance(files, dict) else []


def build(root: Path, key: str, fields: dict, backbone: Backbone, tokens: Tokenized,
          dtype: str = "float16", progress: bool = True, part: Part = Part(),
          log: Callable[[str], None] | None = None, shard_tokens: int | None = None,
          max_tokens: int | None = None, source: str | None = None) -> BuildStats:
    """Extract this part's unfinished shards into `<root>/<key>.building/` (extract.shards), and,
    when every shard is there, publish `<root>/<key>/` atomically (an entry already there is
    replaced; its meta.json records `source`, where the caller said where the texts came from). A build interrupted earlier resumes from its finished shards. Callers that may run
    concurrently hold `build_lock(root, key)` (for a part of several: `publish` takes it)."""
    log = log or _stderr
    plan = make_plan(tokens.lengths, shard_tokens, max_tokens)
    folder = building_dir(root, key)
    try:
        root.mkdir(parents=True, exist_ok=True)
        _clean_partials(root)
        owned = [k for k in range(len(plan.shards)) if part.owns(k)]
        done: set[int] = set()
        if folder.exists():
            check_plan(folder, key, plan, part)  # first: shards of another plan are not finished ones of this
            done = finished(folder, plan)
        left = [k for k in owned if k not in done]
        size = _say_size(root, key, plan, tokens, backbone.dim, dtype, left, log, resuming=bool(done),
                         what="pairs" if fields.get("pairs") else "texts")
        with _Progress(*work_of(plan, tokens.lengths, owned), "extracting", enabled=progress,
                       log=log if size >= SIZE_SAID else None) as bar:
            if done:
                bar.skip(work_of(plan, tokens.lengths, [k for k in owned if k in done])[0])
                if left and part.count > 1:  # said now, not when the build ends
                    log(f"cache: part {part.index}/{part.count} of {key}: {len(done)} of {len(plan.shards)} shards "
                        f"finished already ({len(owned) - len(left)} of them this part's, by an earlier run; the "
                        f"others by other parts); extracting this part's other {len(left)}")
                elif left:
                    log(f"cache: resuming {key}: {len(done)} of {len(plan.shards)} shards were finished before; "
                        f"extracting the other {len(left)}")
            report = extract_part(folder, key, fields, plan, backbone, tokens, dtype, part, bar.advance)
        if part.count > 1:
            if report.done_now and (before := [k for k in report.done_before if part.owns(k)]):
                log(f"cache: resumed part {part.index}/{part.count} of {key}: {len(report.done_now)} shards extracted "
                    f"now, {len(before)} by an earlier run of this part")
        elif report.done_before and report.done_now:
            log(f"cache: resumed {key}: {len(report.done_now)} shards extracted now, {len(report.done_before)} before")
        if report.missing or part.count > 1:  # a part of several publishes under the build lock (build_part)
            return BuildStats(len(plan.order), 0, report.seconds, {}, complete=False, report=report,
                              shards=len(plan.shards))
        stats = _publish(root, key, fields, folder, plan, backbone.dim, dtype, tokens, report.entry_sums, source)
    except OSError as e:  # disk full, quota, a read-only or vanished folder
        raise _write_error(root, key, e, part) from None
    stats.report, stats.seconds = report, report.seconds  # spent by this process now (meta has the total)
    return stats


def _publish(root: Path, key: str, fields: dict, folder: Path, plan, dim: int, dtype: str,
             tokens: Tokenized, written: dict | None = None, source: str | None = None) -> BuildStats:
    """Merge the finished shards into `<root>/<key>/` (checked against plan and checksums) and
    remove the build folder. written: the data files' chunk checksums where this process wrote every
    shard just now, in order (ShardReport.entry_sums): the shards' records are checked, their bytes
    are not read back (116 MB: 0.002 s against 0.094 s on this project's CPU, bench/publish_cost.py;
    at that rate the 308 MB of MiniLM states of the GPU benchmark take about as long as its pass
    there). Otherwise (shards of an earlier run or of other processes) every byte is read and
    checked against its shard's checksum."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = root / f"{key}.partial-{tag}"
    old = root / f"{key}.partial-{tag}-replaced"  # a replaced entry, removed last
    lengths = tokens.lengths
    moved: list[str] = []  # data files renamed (not linked) into tmp: moved back if publishing fails
    try:
        tmp.mkdir()
        sums = {name: _ChunkedWriter(None) for name in DATA}
        try:
            merged = merge(folder, key, plan, lengths, dim, dtype,
                           None if written else lambda name, b: sums[name].write(b))
        except ExtractError as e:
            raise CacheError(str(e)) from None
        files = dict(written) if written else {name: w.close() for name, w in sums.items()}
        for name in DATA:  # the bytes the shards wrote become the entry's: linked, not copied
            try:
                os.link(folder / name, tmp / name)
            except OSError:  # a file system without hard links
                os.rename(folder / name, tmp / name)
                moved.append(name)
        offsets = np.zeros(len(lengths), dtype=np.int64)
        in_order = lengths[plan.order]
        offsets[plan.order] = np.cumsum(in_order) - in_order
        for name, arr in (("offsets.bin", offsets), ("lengths.bin", lengths.astype(np.int32))):
            w = _ChunkedWriter(tmp / name)
            w.write(arr.tobytes())
            files[name] = w.close()
        n_tokens = int(lengths.sum())
        meta = dict(fields, dim=dim, key=key, tokens=n_tokens, extract_seconds=merged["seconds"],
                    shards=merged["shards"], shard_tokens=plan.settings["shard_tokens"],
                    devices=merged["devices"], created=time.strftime("%Y-%m-%dT%H:%M:%S"))
        if source:  # where the texts came from (a file), where the caller said: not part of the key
            meta["source"] = source
        meta["files"] = files
        meta["meta_sha"] = meta_sha(meta)
        with open(tmp / "meta.json", "w") as f:
            f.write(json.dumps(meta, indent=1))
            f.flush()
            os.fsync(f.fileno())
        final = root / key
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        moved.clear()
        try:
            shutil.rmtree(folder, ignore_errors=True)
        except BaseException:  # an interrupt while the build folder goes: the entry is published, so finish
            shutil.rmtree(folder, ignore_errors=True)  # removing it (it held links to the entry's files)
            raise
    finally:
        for name in moved:  # not published: the build keeps its data (and so its finished shards)
            with contextlib.suppress(OSError):
                os.rename(tmp / name, folder / name)
        # on success only `old` is left; on any exception, interrupts included, both go
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return BuildStats(len(lengths), n_tokens, merged["seconds"], files, shards=merged["shards"])


def publish_when_complete(root: Path, key: str, fields: dict, backbone: Backbone, tokens: Tokenized, plan: Plan,
                          dtype: str = "float16", log: Callable[[str], None] | None = None,
                          source: str | None = None) -> bool:
    """For a part of several: publish the entry if every shard of `plan` is finished and no other
    part has done so yet (under the build lock). Returns whether the entry exists now."""
    log = log or _stderr
    final = root / key
    with build_lock(root, key, log):
        if final.exists():
            return True
        folder = building_dir(root, key)
        if not folder.exists() or len(finished(folder, plan)) < len(plan.shards):
            return False
        try:
            _publish(root, key, fields, folder, plan, backbone.dim, dtype, tokens, source=source)
        except OSError as e:
            raise _write_error(root, key, e) from None
        return True


# ----------------------------------------------------------------------------- format 2 → 3
def _key_of(fields: dict) -> str:
    ident = {k: v for k, v in fields.items() if k != "model"}  # the name is not content
    return hashlib.blake2b(json.dumps(ident, sort_keys=True).encode(), digest_size=16).hexdigest()


def format3_key(fields: dict) -> str:
    """The key format 3 gave an entry of these key fields (cache_key's, or a format-4 meta.json's): all of
    them but the model's config, which format 4 added."""
    return _key_of(dict({k: v for k, v in fields.items() if k in KEY_FIELDS and k != "config"}, format=3))


def legacy_keys(backbone: Backbone, texts: Sequence[str], dtype: str = "float16",
                fields: dict | None = None) -> list[str]:
    """Keys an entry of these states had before this format: format 3 (every field but the model's
    config), then format 2 (fp32 states, the layer indices as typed, so `-3` and `4` were two
    entries; only an fp32 pass can reuse them). `fields`: cache_key's, where the caller has them."""
    fields = cache_key(backbone, texts, dtype)[1] if fields is None else fields
    format3 = format3_key(fields)
    if backbone.precision != "fp32":
        return [format3]
    base = {"format": 2, **{k: fields[k] for k in ("weights", "tokenizer", "max_length", "dtype", "texts", "n")}}
    return [format3] + list(dict.fromkeys(_key_of(dict(base, layers=layers))
                                          for layers in (str(backbone.layers), backbone.layer_key)))


# Mean per-token relative L2 difference two passes of one model may show in a precision (another CPU's
# kernels, another batch). fp32: worst case n·eps ≈ 2e-3 for MiniLM's ~15,000 roundings per state, typically
# √n·eps ≈ 2e-5 (tests/numerics.py); bf16/fp16: each pass 0.5-2% from fp32 (extract/precision.py), so two
# of them up to ~4%; int8: 3.7-8% from fp32 with or without VNNI (7- or 8-bit weights), so two up to ~16%.
# The same weights read with another config are far beyond these (MiniLM with 6 or 24 heads instead of 12:
# 63% / 47%; relu for gelu: 79%); edits within them (layer_norm_eps 1e-12 → 1e-5: 0.05%; gelu → gelu_new:
# 0.12%) give the states this precision gives anyway (bf16 0.66% and int8 5.7% from fp32 on the same texts:
# bench/old_entry_configs.py). The stored dtype adds its rounding, at most eps/2 of each value.
PASS_AGREEMENT = {"fp32": 2e-3, "bf16": 5e-2, "fp16": 5e-2, "int8": 0.2}


def disagreement(entry: "CachedStates", backbone: Backbone, texts: Sequence[Text], k: int = 4,
                 among: np.ndarray | None = None) -> str | None:
    """Whether an entry of an earlier format holds this model's states: its `k` shortest examples (of
    `among`, where given) are run through `backbone` now and compared with what the entry stores. Format 3
    and 2 keys did not hold the model's config, so an entry of the same weights, tokenizer and texts read
    with another config.json (another head count) shares its key with the stock model's. None where they
    agree within the precision's tolerance (PASS_AGREEMENT, plus the stored dtype's rounding); else why not."""
    among = np.arange(entry.n) if among is None else np.asarray(among, dtype=np.int64)
    if len(among) == 0:
        return None
    idx = among[np.argsort(entry.lengths[among], kind="stable")[:k]]
    tokens = backbone.tokenize([texts[int(i)] for i in idx])
    tol = PASS_AGREEMENT.get(backbone.precision, PASS_AGREEMENT["int8"]) + float(np.finfo(entry.dtype).eps) / 2
    diffs = []
    for sub, states, _ in iter_states(backbone.runner, backbone.tok, tokens, backbone.layers):
        for j, s in zip(sub, states):
            i = int(idx[j])
            now = s[: int(tokens.lengths[j])].float().cpu()                     # (L_i, D)
            if len(now) != entry.lengths[i] or not np.array_equal(np.asarray(tokens.ids[j], np.int32), entry.token_ids(i)):
                return f"example {i}'s tokens differ from the stored ones"
            stored = torch.from_numpy(np.array(entry.example(i), dtype=np.float32))  # (L_i, D)
            diffs.append(float(((now - stored).norm(dim=-1) / stored.norm(dim=-1).clamp_min(1e-12)).mean()))
    diff = float(np.mean(diffs))
    if diff <= tol:
        return None
    return (f"its states of the {len(idx)} shortest texts differ from this model's by {diff:.1%} (mean per-token "
            f"relative difference; two {backbone.precision} passes of one model stay within {tol:.2%})")


def agreeing(root: Path, olds: list[str], backbone: Backbone, texts: Sequence[Text],
             log: Callable[[str], None]) -> list[str]:
    """`olds` (legacy_keys, in their order) less the complete entries whose states are not this model's
    (`disagreement`): those are left where they are, for the config that made them, with one line; this
    model's entry is built anew. Keys without a complete entry stay (an interrupted build is carried over)."""
    keep = []
    for old in olds:
        if (root / old / "meta.json").is_file():
            try:
                why = disagreement(CachedStates(root / old, verify="none", key=old, legacy=True), backbone, texts)
            except CacheError:
                why = None  # a damaged entry: migrate leaves it alone and reading it in place says what is wrong
            if why is not None:
                log(f"cache: entry {old} (keyed before format {FORMAT_VERSION}, whose key did not hold the model's "
                    f"config) has the same weights, tokenizer and texts, but {why}: it was made with another "
                    f"config.json (or its files were changed since). It is left for that config (`frozentune "
                    f"cache --remove {old}` deletes it) and this model's states are built anew.")
                continue
        keep.append(old)
    return keep


def migrate(root: Path, old_key: str, key: str, fields: dict, log: Callable[[str], None]) -> bool:
    """Re-key an entry of an older format `<root>/<old_key>/` as `<root>/<key>/`: its states are
    exactly what this version's pass stores, only meta.json changes (format 2: absolute layers and
    the precision, fp32; format 3: the model's config, which its key did not hold: the caller has
    checked that this model gives its states, `agreeing`). Returns whether it did; an entry that is not
    a sound one of those formats is left alone."""
    src = root / old_key
    try:
        meta = json.loads((src / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or meta.get("meta_sha") != _safe_sha(meta):
        return False
    old = meta.get("format")
    if old in (2, 3) and meta.get("key") == old_key:
        new = dict(meta, **fields, key=key, migrated_from=old_key)
        new["meta_sha"] = meta_sha(new)
        try:
            _replace_meta(src, new)
        except OSError:  # the entry's folder is not this user's to write (a shared cache): read in place
            return False
        try:
            os.rename(src, root / key)
        except OSError:  # a sticky shared folder, another owner: put the old meta.json back, so that
            try:         # the entry stays readable here (in place) and by the version that made it
                _replace_meta(src, meta)
            except OSError:
                pass
            return False
    elif old == FORMAT_VERSION and meta.get("key") == key:  # re-keyed, not yet renamed
        try:
            os.rename(src, root / key)
        except OSError:
            return False
    else:
        return False
    what = {2: "absolute layer indices, the precision (fp32) and the model's config",
            3: "the model's config"}.get(old, "what this version keys on")
    log(f"cache: re-keyed entry {old_key} → {key} (cache format {old} → {FORMAT_VERSION}: the key now holds "
        f"{what}; this model gives its states, checked on its shortest texts); its states are unchanged")
    return True


def _legacy_in_place(root: Path, olds: list[str], verify: str, expect: dict,
                     log: Callable[[str], None], part: Part | None = None,
                     stuck: bool = False) -> "CachedStates | None":
    """An entry of an earlier format read where it is (its states are this version's), where it cannot be
    re-keyed: in a cache folder this process cannot write (a shared, read-only cache), or by one `part` of
    a build split across processes (they would race to rename it; a one-process run re-keys it)."""
    writable = os.access(root, os.W_OK)
    if writable and part is None and not stuck:  # stuck: migrate could not rename it (another user's entry)
        return None
    for old in olds:  # legacy_keys
        if (root / old / "meta.json").is_file():
            try:
                found = CachedStates(root / old, verify=verify, **dict(expect, key=old), legacy=True)
            except CacheError:
                if stuck:  # a damaged old entry: built anew under the new key, as before
                    continue
                raise
            why = (f"{root} is not writable" if not writable else "parts of a build do not rename entries"
                   if part is not None else "this user cannot rename it (a shared cache: another user's entry)")
            log(f"cache: reading entry {old} in place (cache format {found.meta.get('format')}, keyed before "
                f"format {FORMAT_VERSION}): {why}, so it is not re-keyed")
            return found
    return None


def _replace_meta(folder: Path, meta: dict) -> None:
    """Write `folder`/meta.json atomically (a temporary file, then a rename)."""
    tmp = folder / f".meta.json.{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, folder / "meta.json")
    finally:
        tmp.unlink(missing_ok=True)


def _safe_sha(meta: dict) -> str | None:
    try:
        return meta_sha(meta)
    except (TypeError, ValueError):
        return None


class BuildRunning(Exception):
    """build_lock(wait=False) found the lock held: another process is building that entry."""


@contextlib.contextmanager
def build_lock(root: Path, key: str, log: Callable[[str], None], wait: bool = True) -> Iterator[bool]:
    """Hold the exclusive lock on building `<root>/<key>/` (locks.acquire on `<root>/<key>.lock`, released
    by the kernel if the holder dies); yields whether another process held it first (this one
    waited, saying so through `log`, with the holder's process id, and again every locks.REMIND_S); with
    wait=False, BuildRunning instead of waiting (`cache --remove`). Where flock does not work (no fcntl,
    a network mount without it) this yields False unlocked."""
    waited = []

    def say(holder: str, seconds: float) -> None:
        if not waited:
            from .distributed import read_launch

            launch = read_launch(os.environ)
            who = f" (under {launch.how}: another rank of this run)" if launch.world_size > 1 else ""
            log(f"cache: waiting for {holder}{who}, which is building the same entry {root / key}")
        else:
            log(f"cache: still waiting for {holder} ({seconds / 60:.0f} min), which holds the build of {root / key}; "
                f"a process stopped with Ctrl-Z holds it until it is resumed (fg) or ended")
        waited.append(seconds)

    make_root(root)
    lock = root / f"{key}.lock"
    try:
        fd = locks.acquire(lock, wait, say)
    except locks.Held:
        raise BuildRunning(key) from None
    except OSError as e:
        raise unwritable(root, e) from None
    try:
        yield bool(waited)
    finally:
        locks.release(lock, fd)


def unwritable(root: Path, e: OSError) -> CacheError:
    blocking = file_in_the_way(root)
    why = (f"{blocking} is a file" if blocking is not None and blocking != root else
           fd_advice(e) or e.strerror or str(e))
    return CacheError(f"{root}: cannot write the feature cache there ({why}); give --cache-dir (cache_root "
                      f"from Python) a writable folder")


def make_root(root: Path) -> None:
    """The cache folder, made where absent; a CacheError where it cannot be (a file of that name, no
    permission), as for its lock file (pathlib's FileExistsError reached Python callers raw)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise unwritable(root, e) from None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


SIZE_SAID = 50e6  # a build whose states are larger is said before it starts (bytes, time), with progress lines
EVERY_S = 60.0    # without a terminal: a line this often while a build that large runs


def state_bytes(tokens: int, dim: int, dtype: str) -> int:
    """Bytes an entry of `tokens` tokens takes: each token's state (dim values of dtype) and its int32 id."""
    return tokens * (dim * torch.empty(0, dtype=getattr(torch, dtype)).element_size() + 4)


def check_room(backbone: Backbone, files: Sequence[Sequence[Text]], root: Path | None = None,
               dtype: str = "float16") -> dict[int, Tokenized]:
    """Before a run builds several entries (a dataset's train and test files): a CacheError unless all of
    those not yet cached fit in the free space together (each entry alone was checked as it started, so
    the second was refused after the first had been extracted). Returns the tokens made for the check, by
    id of the texts, for get_or_build to use (no second tokenisation). A build already under way (resumed
    from its finished shards) is left to its own check."""
    root = Path(root) if root is not None else default_root()
    keys = {id(t): (t, *cache_key(backbone, t, dtype)) for t in files}
    todo = {k: t for k, (t, key, fields) in keys.items() if not (root / key).exists()
            and not building_dir(root, key).exists()
            and not any((root / old).is_dir()  # re-keyed, not built (unless another config's: agreeing)
                        for old in agreeing(root, legacy_keys(backbone, t, dtype, fields), backbone, t, lambda _: None))}
    if len(todo) < 2:
        return {}
    tokens = {k: backbone.tokenize(t) for k, t in todo.items()}
    size = sum(state_bytes(int(tk.lengths.sum()), backbone.dim, dtype) for tk in tokens.values())
    make_root(root)
    free = shutil.disk_usage(root).free
    if size > free:
        n = sum(len(t) for t in todo.values())
        raise CacheError(f"{root}: the states of these {len(todo)} files ({n:,} texts) take {size_text(size)} together "
                         f"and {size_text(free)} are free there; {ROOM_ADVICE}")
    return tokens


ROOM_ADVICE = ("free some space (frozentune cache --prune removes unfinished builds; cache --list shows the entries, "
               "their sizes and sources, and cache --remove KEY deletes the ones you choose), give --cache-dir a folder "
               "with room, or read fewer tokens of each text (a smaller --max-length); the whole file is extracted, "
               "whatever --max-train or --shots takes from it")


def _say_size(root: Path, key: str, plan, tokens: Tokenized, dim: int, dtype: str, left: list[int],
              log: Callable[[str], None], resuming: bool, what: str = "texts") -> int:
    """Refuse a build whose states will not fit in the free space of `root` (it failed with a full disk
    after extracting for minutes); say one that is large, before it starts (a 25,000-text file extracted
    for 50 minutes in silence where no terminal showed a bar). Returns the bytes still to write."""
    examples, n = work_of(plan, tokens.lengths, left)
    size = state_bytes(n, dim, dtype)
    free = shutil.disk_usage(root).free
    if size > free:
        raise CacheError(f"{root}: the states of these {examples:,} {what} take {size_text(size)} and "
                         f"{size_text(free)} are free there; {ROOM_ADVICE}")
    if size >= SIZE_SAID:
        log(f"cache: {'resuming' if resuming else 'extracting'} {examples:,} {what} ({n:,} tokens) for entry {key}: "
            f"{size_text(size)} of states ({size_text(free)} free there); the whole file is extracted once, so "
            f"that any later run on it (another --max-train, --shots, seed or method) reads the cache")
    return size


class _Progress:
    """A rich progress bar with examples/s and tokens/s where enabled; otherwise, for a large build, a
    line through `log` every EVERY_S seconds (where no terminal shows a bar: a log file, CI)."""

    def __init__(self, total: int, total_tokens: int, label: str, enabled: bool,
                 log: Callable[[str], None] | None = None):
        # a bar only where stderr is a terminal (it drew nothing until the end in a log file, and said no minute
        # lines there: the API's progress=True is its default whatever the caller's output is)
        enabled = enabled and sys.stderr.isatty()
        self.enabled, self.total, self.label = enabled, total, label
        self.done = self.tokens = 0
        self.t0 = self.said = time.perf_counter()
        self.log = None if enabled else log  # lines where no bar is shown
        self.skipped = 0

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
            from rich.console import Console

            self.p = Progress(TextColumn("{task.description}"), BarColumn(),
                              TextColumn("{task.completed}/{task.total}"),
                              TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                              transient=False, console=Console(stderr=True))  # stdout is for results
            self.p.__enter__()
            self.task = self.p.add_task(self.label, total=self.total, rate="")
        return self

    def skip(self, examples: int) -> None:
        """Count work done before this run (finished shards of an interrupted build), not in the rate."""
        self.skipped += examples
        if self.enabled and examples:
            self.p.update(self.task, advance=examples)

    def advance(self, examples: int, tokens: int) -> None:
        self.done += examples
        self.tokens += tokens
        now = time.perf_counter()
        if self.log is not None and now - self.said >= EVERY_S:
            self.said = now
            rate = self.done / max(now - self.t0, 1e-9)
            left = self.total - self.skipped - self.done
            self.log(f"{self.label}: {self.skipped + self.done:,} of {self.total:,} texts, {rate:,.0f} texts/s, "
                     f"about {left / max(rate, 1e-9) / 60:,.0f} min left")
        if self.enabled:
            dt = max(time.perf_counter() - self.t0, 1e-9)
            self.p.update(self.task, advance=examples,
                          rate=f"{self.done / dt:,.0f} ex/s  {self.tokens / dt:,.0f} tok/s")

    def __exit__(self, *exc):
        if self.enabled:
            self.p.__exit__(*exc)


def get_or_build(backbone: Backbone, texts: Sequence[str], root: Path | None = None,
                 dtype: str = "float16", rebuild: bool = False, progress: bool = True,
                 verify: str = "full", log: Callable[[str], None] = _stderr,
                 shard_tokens: int | None = None, max_tokens: int | None = None,
                 tokens: Tokenized | None = None, source: str | None = None) -> tuple[CachedStates, float]:
    """The cache entry for these texts, built if absent (resuming an interrupted build from its
    finished shards; a new entry records `source`, where the texts came from, e.g. their file: not
    part of the key, so the same texts from another file are the same entry, with its first source). Returns (reader, extraction seconds spent now — 0.0 on a hit). A broken
    entry raises CacheError unless rebuild=True. Another process building the same entry is
    waited for (one line through `log`), then read. A format-2 entry of the same states is
    re-keyed (one line through `log`)."""
    root = Path(root) if root is not None else default_root()
    key, fields = cache_key(backbone, texts, dtype)
    path = root / key
    expect = dict(key=key, n=len(texts), dim=backbone.dim, dtype=dtype)
    if path.exists() and not rebuild:
        return CachedStates(path, verify=verify, **expect), 0.0
    legacy = legacy_keys(backbone, texts, dtype, fields)  # [format 3, format 2…]
    carried: list[tuple[int, int]] = []  # plan positions of the shards an interrupted format-3 build had finished
    olds = [] if rebuild else agreeing(root, legacy, backbone, texts, log)
    if not rebuild and (found := _legacy_in_place(root, olds, verify, expect, log)) is not None:
        return found, 0.0
    with build_lock(root, key, log) as waited:
        if not rebuild and not path.exists():
            if not any((root / old).is_dir() and migrate(root, old, key, fields, log) for old in olds) \
                    and rekey_build(root, legacy[0], key, fields):
                log(f"cache: the interrupted build of entry {legacy[0]} resumes as {key} (cache format 3 → "
                    f"{FORMAT_VERSION}: the key now holds the model's config)")
                carried = finished_spans(building_dir(root, key))
            if not path.exists() and (found := _legacy_in_place(root, olds, verify, expect, log,
                                                                   stuck=True)) is not None:
                return found, 0.0  # an old entry this user cannot rename (a shared cache): read where it is
        if path.exists() and (not rebuild or waited):
            # built meanwhile by the process this one waited for (or, with rebuild, its rebuild)
            try:
                return CachedStates(path, verify=verify, **expect), 0.0
            except CacheError:
                if not rebuild:
                    raise
        if rebuild:
            shutil.rmtree(building_dir(root, key), ignore_errors=True)
        tokens = tokens if tokens is not None else backbone.tokenize(texts)
        seconds = 0.0
        while True:
            seconds += build(root, key, fields, backbone, tokens, dtype, progress, log=log, shard_tokens=shard_tokens,
                             max_tokens=max_tokens, source=source).seconds
            found = CachedStates(path, verify="none", **expect)
            if not carried or not (why := _carried_disagree(found, backbone, texts, carried)):
                return found, seconds
            log(f"cache: the shards carried over from the interrupted build of entry {legacy[0]} were made with "
                f"another config.json of the same weights (or changed since): {why}. The entry is built "
                f"again from the start.")
            del found
            shutil.rmtree(path)
            carried = []


def _carried_disagree(entry: CachedStates, backbone: Backbone, texts: Sequence[Text],
                      spans: list[tuple[int, int]]) -> str | None:
    """`disagreement` on the examples of the shards an interrupted format-3 build had finished (`spans` of
    plan positions; the entry stores its examples in plan order, so position p is the p-th by offset)."""
    in_order = np.argsort(entry.offsets, kind="stable")
    return disagreement(entry, backbone, texts, among=np.concatenate([in_order[a:b] for a, b in spans]))


def build_part(backbone: Backbone, texts: Sequence[str], part: Part, root: Path | None = None,
               dtype: str = "float16", progress: bool = True, log: Callable[[str], None] = _stderr,
               shard_tokens: int | None = None, max_tokens: int | None = None,
               poll_s: float = 0.5, source: str | None = None) -> tuple[CachedStates | None, BuildStats | None]:
    """This process's part of a build split across processes (`--shard i/N`, torchrun, accelerate
    launch). Returns (reader, stats): the reader once the entry is complete (already, or merged by
    this process or another); None when other parts still have shards to do and this part does
    not wait for them (independent --shard processes). Under a launcher every rank waits for the
    others (polling every poll_s), and all read the same entry."""
    root = Path(root) if root is not None else default_root()
    key, fields = cache_key(backbone, texts, dtype)
    path = root / key
    expect = dict(key=key, n=len(texts), dim=backbone.dim, dtype=dtype)
    if path.exists():
        return CachedStates(path, verify="full", **expect), None
    olds = agreeing(root, legacy_keys(backbone, texts, dtype, fields), backbone, texts, log)
    if (found := _legacy_in_place(root, olds, "full", expect, log, part)) is not None:
        return found, None
    tokens = backbone.tokenize(texts)
    plan = make_plan(tokens.lengths, shard_tokens, max_tokens)  # made once: the wait below polls with it
    stats = build(root, key, fields, backbone, tokens, dtype, progress, part, log, shard_tokens, max_tokens, source)
    if stats.complete or publish_when_complete(root, key, fields, backbone, tokens, plan, dtype, log, source):
        return CachedStates(path, verify="none" if stats.complete else "full", **expect), stats
    if not part.waits:
        return None, stats
    said = False
    while not path.exists():
        if not said:
            log(f"cache: part {part.index}/{part.count} done; waiting for the other parts' shards of {key}")
            said = True
        time.sleep(poll_s)
        publish_when_complete(root, key, fields, backbone, tokens, plan, dtype, log, source)
    return CachedStates(path, verify="full", **expect), stats

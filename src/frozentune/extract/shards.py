"""Extraction in shards: resumable after any interrupt, splittable across processes.

An entry `<root>/<key>/` is built in `<root>/<key>.building/`:
  plan.json         the key's fields and the plan: extraction order (length-sorted batches, longest
                    first, exactly as a one-piece build runs them) cut into shards of about
                    SHARD_TOKENS real tokens; written once, by whoever starts the build
  states.bin        the entry's states and token ids, made at their full size when the build starts;
  ids.bin           shard k's rows go to their final place (plan order), so nothing is copied later
  shard-00007.json  shard k is finished: key, plan digest, which examples, and the offset, size and
                    blake2b of its bytes in each file; written (atomically) only after those bytes
                    are on disk (fdatasync)
  .active           every process extracting holds a shared flock on it (so `cache --prune` can
                    tell an interrupted build from a running one)

A process extracts the shards it owns (shard k belongs to part k mod N of `--shard i/N`, or of
RANK/WORLD_SIZE under torchrun / accelerate launch; one process owns all), skipping those already
finished. An interrupt loses at most the shard being written: its bytes are not vouched for by a
record, so they are written again. When every shard is there, one process (under the entry's
build lock) checks each against the plan and its checksums while it checksums the entry's chunks,
and links the two files into the entry — the same bytes, in the same order, that one uninterrupted
process writes for the same device and precision. Each state is written once.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
import queue
import re
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from ..backbone import Backbone, Tokenized, iter_states, length_batches
from .errors import ExtractError

try:
    import fcntl
except ImportError:  # not POSIX: builds are not marked active (prune then cannot tell)
    fcntl = None  # type: ignore[assignment]

SHARD_TOKENS = 1 << 16  # real tokens per shard: ~30 s of MiniLM on one CPU core, a fraction of a second on a GPU
SHARD_ENV = "FROZENTUNE_SHARD_TOKENS"  # overrides SHARD_TOKENS (e.g. larger shards on a GPU)
MAX_TOKENS = 8192       # padded tokens per forward batch
MAX_BATCH = 128         # rows per forward batch
PLAN_VERSION = 2  # 2: shards write into the entry's files in place (1: a folder per shard)
DATA = ("states.bin", "ids.bin")
CHUNK = 64 << 20  # bytes per checksum chunk of an entry's files (meta.json's "chunks")


# ----------------------------------------------------------------------------- which part is this process's
@dataclass(frozen=True)
class Part:
    """Part `index` of `count` equal-by-rotation parts of a build; `how` says where it came from."""
    index: int = 0
    count: int = 1
    how: str = "one process"

    def owns(self, shard: int) -> bool:
        return shard % self.count == self.index

    @property
    def waits(self) -> bool:
        """Under a launcher every rank waits for the others and the entry is read by all; with
        --shard the processes are independent and each stops after its own shards."""
        return self.how.startswith("launcher")


def part_of(shard: str | None, env: dict | None = None) -> Part:
    """The part this process builds: from `--shard i/N`, else from RANK / WORLD_SIZE (set by
    torchrun and accelerate launch), else the whole. Both given and disagreeing is an error."""
    from ..distributed import DistributedError, read_launch

    env = os.environ if env is None else env
    launched = None
    try:
        info = read_launch(env)
    except DistributedError as e:
        raise ExtractError(f"{e}; start the processes with torchrun or accelerate launch, or give --shard i/N") from None
    if info.world_size > 1:
        launched = Part(info.rank, info.world_size, f"launcher ({info.how}: rank {info.rank} of {info.world_size})")
    if shard is None:
        return launched or Part()
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", shard)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise ExtractError(f"--shard {shard!r}: give i/N with 0 <= i < N, e.g. --shard 0/4 … --shard 3/4 for four "
                           f"processes")
    given = Part(int(m.group(1)), int(m.group(2)), f"--shard {m.group(1)}/{m.group(2)}")
    if launched is not None and (launched.index, launched.count) != (given.index, given.count):
        raise ExtractError(f"--shard {shard} disagrees with the launcher's RANK {launched.index} / WORLD_SIZE "
                           f"{launched.count}; under torchrun or accelerate launch leave --shard out")
    return given


# ----------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """order (N,): example indices in extraction order; batches: [start, end) positions in order;
    shards: [first batch, end batch) of each shard."""
    order: np.ndarray
    batches: list[tuple[int, int]]
    shards: list[tuple[int, int]]
    settings: dict
    source: str = ""  # where settings["shard_tokens"] came from (for messages; not part of the digest)

    def examples(self, k: int) -> tuple[int, int]:
        """[start, end) positions (in `order`) of shard k's examples."""
        b0, b1 = self.shards[k]
        return self.batches[b0][0], self.batches[b1 - 1][1]

    @functools.cached_property
    def digest(self) -> str:  # made once: its JSON of every batch is read by every shard and check
        h = hashlib.blake2b(digest_size=16)
        h.update(json.dumps({"settings": self.settings, "batches": self.batches, "shards": self.shards}).encode())
        h.update(self.order.astype("<i8").tobytes())
        return h.hexdigest()


def shard_tokens_default() -> int:
    """SHARD_TOKENS, or $FROZENTUNE_SHARD_TOKENS when set."""
    text = os.environ.get(SHARD_ENV)
    if text is None:
        return SHARD_TOKENS
    if not text.isdigit() or int(text) < 1:
        raise ExtractError(f"{SHARD_ENV}={text!r}: give a positive number of tokens per shard (default {SHARD_TOKENS})")
    return int(text)


def shard_tokens_source(given: int | None) -> str:
    """Where the shard size of a plan made with `make_plan(shard_tokens=given)` comes from."""
    if given:
        return f"shard_tokens={given} as passed"
    if os.environ.get(SHARD_ENV) is not None:
        return f"{SHARD_ENV}={os.environ[SHARD_ENV]}"
    return f"the default, {SHARD_ENV} unset"


def make_plan(lengths: np.ndarray, shard_tokens: int | None = None, max_tokens: int | None = None,
              max_batch: int = MAX_BATCH) -> Plan:
    """Length-sorted batches (backbone.length_batches: the order one process has always used)
    grouped into shards of at least shard_tokens real tokens (the last may be smaller)."""
    source = shard_tokens_source(shard_tokens)
    shard_tokens = shard_tokens or shard_tokens_default()
    max_tokens = max_tokens or MAX_TOKENS
    batches_idx = length_batches(lengths, max_tokens, max_batch)
    order = np.concatenate(batches_idx) if batches_idx else np.zeros(0, dtype=np.int64)
    batches, start = [], 0
    for b in batches_idx:
        batches.append((start, start + len(b)))
        start += len(b)
    shards, first, tokens = [], 0, 0
    for j, (s, e) in enumerate(batches):
        tokens += int(lengths[order[s:e]].sum())
        if tokens >= shard_tokens:
            shards.append((first, j + 1))
            first, tokens = j + 1, 0
    if first < len(batches):
        shards.append((first, len(batches)))
    settings = {"version": PLAN_VERSION, "shard_tokens": shard_tokens, "max_tokens": max_tokens,
                "max_batch": max_batch}
    return Plan(order.astype(np.int64), batches, shards, settings, source)


# ----------------------------------------------------------------------------- files
def building_dir(root: Path, key: str) -> Path:
    return root / f"{key}.building"


def shard_name(k: int) -> str:
    """The record that marks shard k finished (in the build folder)."""
    return f"shard-{k:05d}.json"


def shard_records(folder: Path) -> dict[int, Path]:
    """The finished shards' records in a build folder, by shard index (the names shard_name makes)."""
    return {int(m.group(1)): p for p in folder.glob("shard-*.json") if (m := re.fullmatch(r"shard-(\d+)\.json", p.name))}


def finished_spans(folder: Path) -> list[tuple[int, int]]:
    """(first, end) plan positions of the examples of each finished shard in a build folder, from their records."""
    spans = []
    for record in shard_records(folder).values():
        got = (read_json(record) or {}).get("examples")
        if isinstance(got, list) and len(got) == 2 and all(isinstance(x, int) for x in got) and 0 <= got[0] <= got[1]:
            spans.append((got[0], got[1]))
    return sorted(spans)


def rekey_build(root: Path, old: str, key: str, fields: dict) -> bool:
    """Carry an interrupted build of entry `old` (an earlier cache format's key of the same states) over
    to `key`: its plan.json and every shard's record are rewritten to name `key` (each atomically, so a
    kill midway is finished by the next call), then the folder is renamed. Returns whether it did; a
    build that is running, or that is not one of `old`, or a build of `key` already there, is left alone."""
    src, dst = building_dir(root, old), building_dir(root, key)
    plan = read_json(src / "plan.json")
    if not src.is_dir() or dst.exists() or plan is None or plan.get("key") not in (old, key) or is_running(src):
        return False
    for k, record in sorted(shard_records(src).items()):
        info = read_json(record)
        if info is not None and info.get("key") == old:
            _write_json(record, dict(info, key=key))
    if plan.get("key") == old:
        _write_json(src / "plan.json", dict(plan, key=key, fields=fields))
    os.rename(src, dst)
    return True


def row_bytes(dim: int, itemsize: int) -> dict[str, int]:
    """Bytes one token takes in each data file: its state (dim values) and its id (int32)."""
    return {"states.bin": dim * itemsize, "ids.bin": 4}


def data_sizes(plan: Plan, lengths: np.ndarray, dim: int, itemsize: int) -> dict[str, int]:
    """Bytes of each data file of the entry."""
    tokens = int(lengths[plan.order].sum()) if len(plan.order) else 0
    return {name: tokens * row for name, row in row_bytes(dim, itemsize).items()}


def shard_starts(plan: Plan, lengths: np.ndarray) -> np.ndarray:
    """(shards + 1,) token offset of each shard's first row in the entry (and the total)."""
    in_order = lengths[plan.order] if len(plan.order) else np.zeros(0, dtype=np.int64)
    ends = np.r_[0, np.cumsum(in_order)]
    return np.array([ends[plan.examples(k)[0]] for k in range(len(plan.shards))] + [ends[-1]], dtype=np.int64)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def open_plan(folder: Path, key: str, fields: dict, plan: Plan, sizes: dict[str, int]) -> None:
    """Write plan.json and make the data files at their full size, or check that the ones there
    (an interrupted build's, or another part's) are this plan's."""
    folder.mkdir(parents=True, exist_ok=True)
    check_plan(folder, key, plan)
    if not (folder / "plan.json").exists():
        _write_json(folder / "plan.json", {"key": key, "fields": fields, "digest": plan.digest,
                                           "shards": len(plan.shards), "examples": len(plan.order),
                                           "settings": plan.settings})
    for name, size in sizes.items():
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT, 0o644)  # never truncated: parts share it
        try:
            have = os.fstat(fd).st_size
            if have == 0 and size:
                os.ftruncate(fd, size)  # sparse until written
            elif have != size:
                raise _wrong_size(folder / name, have, size)
        finally:
            os.close(fd)


def _wrong_size(path: Path, have: int | None, size: int) -> ExtractError:
    return ExtractError(f"{path}: {have} bytes, but this build's states need {size}; rerun with --rebuild-cache "
                        f"to start over")


def start_over(folder: Path, part: "Part | None" = None) -> str:
    """How to start a build over: --rebuild-cache in one process; a part of several cannot take it
    (the parts would delete each other's shards), so the build folder is deleted and every part rerun."""
    if part is not None and part.count > 1:
        return f"delete {folder} and rerun every part ({part.count}) to start over"
    return "rerun with --rebuild-cache to start over"


def check_plan(folder: Path, key: str, plan: Plan, part: "Part | None" = None) -> None:
    """The plan.json of a build already in `folder` (an interrupted build's, or another part's) is
    this plan; an ExtractError saying which setting differs and how to resume otherwise (for a
    part of several, how to start over without --rebuild-cache, which parts refuse). No plan.json
    (no build yet, or one just published and removed) passes. Checked before any shard is counted:
    a shard of another plan is only as foreign as its plan."""
    path = folder / "plan.json"
    have = read_json(path)
    again = start_over(folder, part)
    if have is None:
        if path.exists():  # written atomically, so an unreadable one is damaged, not half-written
            raise ExtractError(f"{path}: damaged plan of an interrupted build; {again}")
        return
    if have.get("key") != key:
        raise ExtractError(f"{path}: the plan of another cache entry ({have.get('key')}), not of {key}; delete "
                           f"{folder} (or rerun with --rebuild-cache) to start this entry over")
    if have.get("digest") != plan.digest:
        settings = have.get("settings")
        raise ExtractError(_plan_mismatch(folder, settings if isinstance(settings, dict) else {}, plan, again))


def _plan_mismatch(folder: Path, had: dict, plan: Plan, again: str) -> str:
    """Why the interrupted build in `folder` (settings `had`) cannot take this run's shards, and
    the one way to resume it when the shard size is all that differs; `again`: how to start over."""
    now = plan.settings
    if had.get("version") == 1:
        return (f"{folder}: an interrupted build by an earlier frozentune, which kept each shard in a folder of its "
                f"own; this version writes shards into the entry's files and cannot resume it: finish it with "
                f"that version, or {again}")
    size_had, size_now = had.get("shard_tokens"), now["shard_tokens"]
    batching = [name for name in ("version", "max_tokens", "max_batch") if had.get(name) != now[name]]
    if not batching and isinstance(size_had, int) and size_had != size_now:
        default = " (the default: unset it)" if size_had == SHARD_TOKENS else ""
        return (f"{folder}: this build was started with {SHARD_ENV}={size_had} (shards of {size_had:,} tokens); "
                f"this run makes shards of {size_now:,} tokens ({plan.source}), and shards of two sizes cannot be "
                f"combined; rerun with {SHARD_ENV}={size_had}{default} to resume it, or {again}")
    if batching:
        shown = ", ".join(f"{name} {had.get(name)}, now {now[name]}" for name in batching)
        why = f"other batch settings: {shown}"
    else:
        why = "the same settings but another extraction order: another frozentune version's batching"
    return (f"{folder}: an interrupted build of this entry used another plan ({why}), so its shards cannot be "
            f"combined with new ones; finish it with the settings (or frozentune version) that started it, or {again}")


def finished(folder: Path, plan: Plan) -> set[int]:
    """Shards with a record (their bytes are on disk). None while a data file is missing: a record
    vouches for bytes in it."""
    if not all((folder / name).is_file() for name in DATA):
        return set()
    return {k for k in range(len(plan.shards)) if (folder / shard_name(k)).is_file()}


def parts_done(folder: Path, done: set[int], total: int) -> list[str]:
    """The parts of several ("i/N", from the finished shards' records) whose shards, of `total`,
    are all in `done`: a `--shard i/N` process that finished its share, waiting for the others."""
    parts = set()
    for k in done:
        part = (read_json(folder / shard_name(k)) or {}).get("part")
        if isinstance(part, list) and len(part) == 2 and all(isinstance(x, int) for x in part) \
                and 0 <= part[0] < part[1]:
            parts.add((part[0], part[1]))
    return [f"{i}/{n}" for i, n in sorted(parts, key=lambda p: (p[1], p[0]))
            if n > 1 and all(j in done for j in range(i, total, n))]


@contextlib.contextmanager
def active(folder: Path) -> Iterator[None]:
    """Mark the build as running (a shared flock on `.active`, released by the kernel if the
    process dies)."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder / ".active", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def is_running(folder: Path) -> bool:
    """Some process holds the build's `.active` lock (it is extracting now)."""
    return lock_held(folder / ".active")


def lock_held(path: Path) -> bool:
    """Whether another process holds a flock on `path` (False where it is absent, unreadable, or the file
    system has no flock: not known to be held). Also a sweep's journal (sweep/journal.py)."""
    if fcntl is None or not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)  # flock takes any open mode; a read-only cache is read too
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- extracting
def _cast(dtype: str) -> torch.dtype:
    return {"float16": torch.float16, "float32": torch.float32}[dtype]


WRITE_AHEAD = 8  # batches extracted ahead of the writer (pinned host copies waiting to be written)


def _real_rows(lengths: np.ndarray, T: int) -> np.ndarray:
    """Flat (b * T + t) positions of the real tokens of right-padded rows of these lengths, row by
    row: the rows `states[mask]` picks, found on the host so that the device never waits."""
    pos = np.arange(T)
    keep = pos[None, :] < lengths[:, None]                                  # (B, T)
    return (np.arange(len(lengths))[:, None] * T + pos[None, :])[keep]


def _to_host(states: torch.Tensor, rows: np.ndarray, dtype: torch.dtype) -> tuple[torch.Tensor, object]:
    """(tokens, D) real-token states, cast where computed, on their way to the host. On a GPU the
    copy is asynchronous into pinned memory; the event returned completes with it (None elsewhere)."""
    flat = states.reshape(-1, states.shape[-1])
    idx = torch.from_numpy(rows)
    if states.device.type != "cuda":
        return flat.index_select(0, idx.to(states.device)).to(dtype).cpu(), None
    real = flat.index_select(0, idx.to(states.device, non_blocking=True)).to(dtype)
    host = torch.empty(real.shape, dtype=dtype, pin_memory=True)
    host.copy_(real, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(states.device))
    return host, done


class _Lane:
    """One blake2b fed its pieces in order. With a pool, each piece is hashed there by a task that first
    waits for the piece before it: that task was submitted earlier, and the pool starts tasks in the
    order they come, so it is running or done (a lane never waits on work that cannot start). Many lanes
    (shards, chunks) then hash side by side on the pool's threads; hashlib lets the GIL go. Without a
    pool, each piece is hashed at once."""

    def __init__(self, pool: ThreadPoolExecutor | None = None):
        self.pool, self.h, self.last = pool, hashlib.blake2b(digest_size=16), None

    def feed(self, piece: memoryview) -> Future | None:
        """Hash `piece` after the pieces fed before it; the task doing so (None without a pool). The
        piece's memory must not change until then (the memoryview keeps it alive)."""
        if self.pool is None:
            self.h.update(piece)
            return None
        before = self.last

        def run() -> None:
            if before is not None:
                before.result()  # the piece before it, or its error
            self.h.update(piece)

        self.last = self.pool.submit(run)
        return self.last

    def hexdigest(self) -> str:
        if self.last is not None:
            self.last.result()
        return self.h.hexdigest()


class ChunkSums:
    """A blake2b digest per CHUNK bytes of a file, fed its bytes in order (meta.json's "chunks"); with a
    pool, every chunk is a lane of its own on it (hashed beside the others)."""

    def __init__(self, pool: ThreadPoolExecutor | None = None) -> None:
        self.pool = pool
        self.lanes: list[_Lane] = []
        self.size = 0

    def update(self, data: bytes | memoryview) -> list[Future]:
        """Feed the file's next bytes; returns the tasks hashing them (none without a pool)."""
        mv = memoryview(data).cast("B")
        tasks = []
        while len(mv):
            at = self.size % CHUNK
            if at == 0:
                self.lanes.append(_Lane(self.pool))
            take = min(len(mv), CHUNK - at)
            if (task := self.lanes[-1].feed(mv[:take])) is not None:
                tasks.append(task)
            self.size += take
            mv = mv[take:]
        return tasks

    def close(self) -> dict:
        """{"size", "chunks"} of the bytes fed so far (waiting for their hashing)."""
        return {"size": self.size, "chunks": [lane.hexdigest() for lane in self.lanes]}


class _Open:
    """A shard being written: where its rows go in each data file, their running checksums, and the
    tasks writing and hashing its bytes."""

    def __init__(self, k: int, starts: dict[str, int], pool: ThreadPoolExecutor, t0: float):
        self.k, self.t0, self.tokens = k, t0, 0
        self.seconds = 0.0  # from its first batch handed over to its last: the pass's time for it
        self.start = dict(starts)  # name -> first byte
        self.at = dict(starts)     # name -> next byte
        self.sums = {name: _Lane(pool) for name in starts}
        self.tasks: list[Future] = []


_datasync = getattr(os, "fdatasync", os.fsync)
_seek_lock = threading.Lock()  # without pwrite, a seek and a write are one step for the writer's threads

WRITER_THREADS = max(2, min(8, os.cpu_count() or 1))  # hashing and writing (each lets the GIL go)
AHEAD_BYTES = 1 << 29  # states handed to the writer's threads and not yet written and hashed (pinned host copies)


def _pwrite(fd: int, data: memoryview, at: int) -> int:
    """os.pwrite where the OS has it; elsewhere (Windows) a seek and a write under one lock, which is the
    same here: each process's writer is the only user of its descriptors."""
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, data, at)
    with _seek_lock:
        os.lseek(fd, at, os.SEEK_SET)
        return os.write(fd, data)


def _write_all(fd: int, mv: memoryview, at: int) -> None:
    while len(mv):
        n = _pwrite(fd, mv, at)
        at += n
        mv = mv[n:]


class ShardWriter:
    """Writes shards while the caller keeps the device busy with the next batches. Each batch's states
    arrive as a host copy (with the event that completes it). A thread of its own hands each batch to a
    pool of WRITER_THREADS: its bytes are written to their final place in the build's data files while
    they are checksummed, for the shard's record and for the entry's chunks. Batches, shards and chunks
    go side by side, which is what keeps up with a GPU: one blake2b runs at about 0.65 GB/s on an H200's
    host, and bf16 states come at about 2 GB/s (bench/REPORT.md). When a shard's every byte is written
    and hashed, a task makes them durable and writes its record. At most WRITE_AHEAD batches wait for the
    thread, and at most AHEAD_BYTES of states for the pool. An error is raised in the caller at its next
    call; `close()` after an interrupt still finishes the shards whose every batch was handed over (the
    partial one has no record)."""

    def __init__(self, folder: Path, key: str, plan: Plan, backbone: Backbone, part: Part, lengths: np.ndarray,
                 itemsize: int):
        self.folder, self.key, self.plan, self.part = folder, key, plan, part
        self.device, self.precision = str(backbone.device), backbone.precision
        self.row_bytes = row_bytes(backbone.dim, itemsize)
        self.starts = shard_starts(plan, lengths)
        self.seconds: list[float] = []
        self.error: BaseException | None = None
        self._fds = {name: os.open(folder / name, os.O_WRONLY) for name in DATA}
        self._q: queue.Queue = queue.Queue(maxsize=WRITE_AHEAD)
        self._pool = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="frozentune-shard-io")
        self._ahead: collections.deque[tuple[int, list[Future]]] = collections.deque()  # (bytes, tasks) per batch
        self._ahead_bytes = 0
        self._finishing: list[Future] = []
        # the entry's chunk checksums, while every file is written in order from its first byte (one process
        # writing every shard in turn): publishing then need not read the files back (entry_sums)
        self._entry = {name: ChunkSums(self._pool) for name in DATA}
        self._in_order = True
        self._thread = threading.Thread(target=self._run, name="frozentune-shard-writer", daemon=True)
        self._thread.start()

    def start(self, k: int) -> None:
        self._put(("start", k, time.perf_counter()))

    def batch(self, host: torch.Tensor, done, ids: np.ndarray) -> None:
        self._put(("batch", host, done, ids))

    def end(self, k: int) -> None:
        self._put(("end", k, time.perf_counter()))

    def close(self) -> None:
        """Wait until every shard handed over is written (or the writer failed: raised here)."""
        try:
            if self.error is None:
                self._put(("stop",))
        finally:
            self._thread.join()
            for task in [t for _, tasks in self._ahead for t in tasks] + self._finishing:
                try:
                    task.result()
                except BaseException as e:  # noqa: BLE001 — the first error is raised below
                    self.error = self.error or e
            self._pool.shutdown(wait=True)
            for fd in self._fds.values():
                os.close(fd)
        if self.error is not None:
            raise self.error

    def _put(self, item: tuple) -> None:
        while True:
            if self.error is not None:
                raise self.error
            if not self._thread.is_alive():
                raise ExtractError("the shard writer stopped unexpectedly; rerun to resume the build")
            try:
                self._q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        cur: _Open | None = None
        try:
            while (item := self._q.get())[0] != "stop":
                for task in self._finishing:  # a shard that could not be finished stops the build
                    if task.done():
                        task.result()
                if item[0] == "start":
                    _, k, t0 = item
                    cur = _Open(k, {name: int(self.starts[k]) * size for name, size in self.row_bytes.items()},
                                self._pool, t0)
                elif item[0] == "batch":
                    _, host, done, ids = item
                    if done is not None:
                        done.synchronize()
                    states = host.numpy()
                    tasks = self._write(cur, "states.bin", states) + self._write(cur, "ids.bin", ids)
                    cur.tokens += len(ids)
                    cur.tasks += tasks
                    self._hand_over(states.nbytes + ids.nbytes, tasks)
                else:
                    cur.seconds = item[2] - cur.t0
                    self._finishing.append(self._pool.submit(self._finish, cur))
                    cur = None
        except BaseException as e:  # handed to the caller; a partial shard has no record, so is redone
            self.error = e

    def _hand_over(self, nbytes: int, tasks: list[Future]) -> None:
        """Count a batch's bytes in flight; let go of the oldest batches that are done, and wait for the
        oldest while more than AHEAD_BYTES are (the newest is never waited for here)."""
        self._ahead.append((nbytes, tasks))
        self._ahead_bytes += nbytes
        while self._ahead and ((self._ahead_bytes > AHEAD_BYTES and len(self._ahead) > 1)
                               or all(t.done() for t in self._ahead[0][1])):
            n, oldest = self._ahead.popleft()
            for task in oldest:
                task.result()  # waits, or raises the task's error
            self._ahead_bytes -= n

    def entry_sums(self, sizes: dict[str, int]) -> dict | None:
        """After close(): {name: {"size", "chunks"}} of each data file, where this writer wrote every file
        in order from its first byte to `sizes[name]`; else None (the files are read back to publish)."""
        if self.error is not None or not self._in_order:
            return None
        sums = {name: c.close() for name, c in self._entry.items()}
        return sums if all(sums[name]["size"] == sizes[name] for name in DATA) else None

    def _write(self, cur: _Open, name: str, arr: np.ndarray) -> list[Future]:
        """Hand the bytes of `arr` to the pool: written at the shard's next place in `name`, hashed into the
        shard's checksum and, while the file is written in order, the entry's chunks. Returns the tasks."""
        mv = memoryview(np.ascontiguousarray(arr)).cast("B")
        tasks = [self._pool.submit(_write_all, self._fds[name], mv, cur.at[name]), cur.sums[name].feed(mv)]
        if self._in_order and cur.at[name] == self._entry[name].size:
            tasks += self._entry[name].update(mv)
        else:
            self._in_order = False
        cur.at[name] += len(mv)
        return tasks

    def _finish(self, cur: _Open) -> None:
        """On the pool, once the shard's bytes are written and hashed: make them durable, then its record."""
        for task in cur.tasks:
            task.result()
        for fd in self._fds.values():
            _datasync(fd)
        p0, p1 = self.plan.examples(cur.k)
        info = {"key": self.key, "plan": self.plan.digest, "shard": cur.k, "examples": [p0, p1], "tokens": cur.tokens,
                "seconds": cur.seconds, "device": self.device, "precision": self.precision,
                "part": [self.part.index, self.part.count],
                "files": {name: {"offset": cur.start[name], "size": cur.at[name] - cur.start[name],
                                 "blake2b": cur.sums[name].hexdigest()} for name in DATA}}
        _write_json(self.folder / shard_name(cur.k), info)
        self.seconds.append(cur.seconds)


def extract_shards(writer: ShardWriter, todo: list[int], plan: Plan, backbone: Backbone, tokens: Tokenized,
                   dtype: str, advance: Callable[[int, int], None]) -> None:
    """Run the backbone over the batches of shards `todo`, handing each batch's real-token states
    to `writer` as they come (the device is not waited for). An interrupt here still lets the
    writer finish the shards whose batches were all handed over; the one in progress is lost."""
    lengths = tokens.lengths
    cast = _cast(dtype)
    try:
        for k in todo:
            writer.start(k)
            b0, b1 = plan.shards[k]
            batches = [plan.order[s:e] for s, e in plan.batches[b0:b1]]
            for idx, states, _ in iter_states(backbone.runner, backbone.tok, tokens, backbone.layers, batches=batches):
                lens = lengths[idx]
                host, done = _to_host(states, _real_rows(lens, states.shape[1]), cast)
                writer.batch(host, done, np.concatenate([tokens.ids[i] for i in idx]).astype(np.int32))
                advance(len(idx), int(lens.sum()))
            writer.end(k)
    finally:
        writer.close()


@dataclass
class ShardReport:
    done_now: list[int]        # shards this process extracted
    done_before: list[int]     # shards found finished (an interrupted build's, or another process's)
    missing: list[int]         # shards still to be done (by other parts) after this process's work
    seconds: float             # extraction time spent now (wall: the pass, and the writing after it)
    shard_seconds: float       # mean seconds per shard extracted now, the pass's time for it (0 if none)
    entry_sums: dict | None = None  # the data files' chunk checksums, where this process wrote all of them in order


def extract_part(folder: Path, key: str, fields: dict, plan: Plan, backbone: Backbone, tokens: Tokenized,
                 dtype: str, part: Part, progress: Callable[[int, int], None]) -> ShardReport:
    """Extract every unfinished shard this part owns. A part with none to write does not touch the
    build folder: among several parts, another may have published the entry and removed it, and
    writing plan.json would leave a `.building` folder behind (a rank owning no shard of a small
    split, under torchrun). Nor does a part write once the entry is published: its shards, finished
    by an earlier interrupted run, were in the folder that publishing removed."""
    check_plan(folder, key, plan)  # before counting: shards of another plan are not this build's
    before = finished(folder, plan)
    # read after `before`: publishing renames the entry into place before it removes the folder, so
    # either the entry is seen here or the folder was still whole when `before` was read. Only parts
    # of several can meet a published entry; one process builds under the build lock (and a rebuild
    # replaces an existing entry).
    published = part.count > 1 and folder.with_name(key).exists()
    todo = [] if published else [k for k in range(len(plan.shards)) if part.owns(k) and k not in before]
    spent: list[float] = []
    entry, wall = None, 0.0
    if todo:
        lengths, itemsize = tokens.lengths, np.dtype(dtype).itemsize
        sizes = data_sizes(plan, lengths, backbone.dim, itemsize)
        open_plan(folder, key, fields, plan, sizes)
        with active(folder):
            t0 = time.perf_counter()
            writer = ShardWriter(folder, key, plan, backbone, part, lengths, itemsize)
            try:
                extract_shards(writer, todo, plan, backbone, tokens, dtype, progress)
            finally:
                spent, wall = writer.seconds, time.perf_counter() - t0
            entry = writer.entry_sums(sizes)
    done = finished(folder, plan)
    missing = [k for k in range(len(plan.shards)) if k not in done]
    return ShardReport(todo, sorted(before), missing, wall, float(np.mean(spent)) if spent else 0.0, entry)


def work_of(plan: Plan, lengths: np.ndarray, shards: Iterable[int]) -> tuple[int, int]:
    """(examples, tokens) of these shards (a progress bar's total, or what was done before it)."""
    ex = tok = 0
    for k in shards:
        p0, p1 = plan.examples(k)
        ex += p1 - p0
        tok += int(lengths[plan.order[p0:p1]].sum())
    return ex, tok


# ----------------------------------------------------------------------------- combining
def check_shard(folder: Path, k: int, key: str, plan: Plan, starts: np.ndarray, rows: dict[str, int]) -> dict:
    """The record of shard k, after checking it belongs to this key and plan and places its bytes
    where its examples go; an ExtractError saying which shard and what to do otherwise."""
    where = folder / shard_name(k)
    info = read_json(where)
    redo = f"delete {where} and rerun (only that shard is extracted again), or rerun with --rebuild-cache"
    if info is None:
        raise ExtractError(f"{where}: missing or unreadable; {redo}")
    if info.get("key") != key:
        raise ExtractError(f"{where}: a shard of another cache entry ({info.get('key')}), not of {key}; "
                           f"shards of different entries cannot be merged: {redo}")
    if info.get("plan") != plan.digest or info.get("shard") != k:
        raise ExtractError(f"{where}: made for another plan of this entry (other shard size or batch settings); {redo}")
    p0, p1 = plan.examples(k)
    tokens = int(starts[k + 1] - starts[k])
    files = info.get("files")
    for name, row in rows.items():
        want = {"offset": int(starts[k]) * row, "size": tokens * row}
        got = files.get(name) if isinstance(files, dict) else None
        if not isinstance(got, dict) or not isinstance(got.get("blake2b"), str):
            raise ExtractError(f"{where}: a damaged record (it gives no place and checksum for {name}); {redo}")
        if any(type(got.get(field)) is not int or got[field] != value for field, value in want.items()):
            raise ExtractError(f"{where}: places {name} bytes at {got.get('offset')} (+{got.get('size')}), but its "
                               f"{p1 - p0} examples of {tokens} tokens go at {want['offset']} (+{want['size']}); {redo}")
    return info


def merge(folder: Path, key: str, plan: Plan, lengths: np.ndarray, dim: int, dtype: str,
          sink: Callable[[str, bytes], None] | None) -> dict:
    """Read the build's data files once, in order, passing their bytes to `sink(name, bytes)` (the
    entry's own checksums) while each shard's bytes are checked against its record (a damaged
    shard is an ExtractError before the entry is published); returns totals. A missing shard is
    named. sink None: the records, sizes and places are checked, the bytes are not read (a writer
    that wrote them all in this process checksummed them as it wrote: ShardReport.entry_sums)."""
    missing = [k for k in range(len(plan.shards)) if not (folder / shard_name(k)).is_file()]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
        raise ExtractError(f"{folder}: {len(missing)} of {len(plan.shards)} shards are not finished ({shown}); "
                           f"run the parts that own them (shard k belongs to --shard k%N/N) before merging")
    itemsize = np.dtype(dtype).itemsize
    for name, size in data_sizes(plan, lengths, dim, itemsize).items():
        have = (folder / name).stat().st_size if (folder / name).is_file() else None
        if have != size:
            raise _wrong_size(folder / name, have, size)
    starts = shard_starts(plan, lengths)
    rows = row_bytes(dim, itemsize)
    infos = [check_shard(folder, k, key, plan, starts, rows) for k in range(len(plan.shards))]
    if sink is not None:
        _read_back(folder, infos, sink)
    return {"seconds": float(sum(seconds_in(i.get("seconds")) for i in infos)), "shards": len(infos),
            "devices": sorted({str(i.get("device", "?")) for i in infos})}


def seconds_in(v: object) -> float:
    """A time read back from a shard's record or an entry's meta.json: v where it is a number ≥ 0, else 0.0 (it
    informs, it is not part of the states: a damaged one is not worth refusing the entry for)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf") else 0.0


def _read_back(folder: Path, infos: list[dict], sink: Callable[[str, bytes], None]) -> None:
    """Each data file read in order: every shard's bytes checked against its record, all passed to sink."""
    with ThreadPoolExecutor(1, thread_name_prefix="frozentune-merge-sum") as pool:
        for name in DATA:
            with open(folder / name, "rb") as f:
                for k, info in enumerate(infos):
                    _check_range(folder, k, name, _stream(f, info["files"][name]["size"], pool,
                                                          lambda b, name=name: sink(name, b)), info)


def _stream(f, n: int, pool: ThreadPoolExecutor, sink: Callable[[bytes], None]) -> str:
    """Pass the next n bytes of `f` to `sink` in pieces of at most 16 MiB, checksumming them on
    `pool` meanwhile (both release the GIL); returns their blake2b."""
    h = hashlib.blake2b(digest_size=16)
    while n:
        chunk = f.read(min(n, 16 << 20))
        if not chunk:
            raise ExtractError(f"{f.name}: ends early; rerun with --rebuild-cache to start over")
        summed = pool.submit(h.update, chunk)
        sink(chunk)
        summed.result()
        n -= len(chunk)
    return h.hexdigest()


def _check_range(folder: Path, k: int, name: str, got: str, info: dict) -> None:
    if got != info["files"][name]["blake2b"]:
        off, size = info["files"][name]["offset"], info["files"][name]["size"]
        raise ExtractError(f"{folder / name}: bytes {off}..{off + size} of shard {k} are corrupt (their checksum "
                           f"differs from {shard_name(k)}'s); delete {folder / shard_name(k)} and rerun (only that "
                           f"shard is extracted again), or rerun with --rebuild-cache")

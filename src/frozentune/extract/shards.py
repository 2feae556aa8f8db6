"""Extraction in shards: resumable after any interrupt, splittable across processes.

An entry `<root>/<key>/` is built in `<root>/<key>.building/`:
  plan.json         the key's fields and the plan: extraction order (length-sorted batches, longest
                    first, exactly as a one-piece build runs them) cut into shards of about
                    SHARD_TOKENS real tokens; written once, by whoever starts the build
  shard-00007/      one finished shard: states.bin, ids.bin (its examples' rows, in plan order) and
                    shard.json (key, plan digest, which examples, sizes, blake2b of each file),
                    written in `shard-00007.partial-*` and renamed into place only when complete
  .active           every process extracting holds a shared flock on it (so `cache --prune` can
                    tell an interrupted build from a running one)

A process extracts the shards it owns (shard k belongs to part k mod N of `--shard i/N`, or of
RANK/WORLD_SIZE under torchrun / accelerate launch; one process owns all), skipping those already
finished. An interrupt loses at most the shard being written. When every shard is there, one
process (under the entry's build lock) checks each against the plan and its checksums and
concatenates them into the entry's files — the same bytes, in the same order, that one
uninterrupted process writes for the same device and precision — then removes the folder.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import queue
import re
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
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
PLAN_VERSION = 1


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
    return f"shard-{k:05d}"


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


def open_plan(folder: Path, key: str, fields: dict, plan: Plan) -> None:
    """Write plan.json, or check that the one there (an interrupted build's) is this plan."""
    folder.mkdir(parents=True, exist_ok=True)
    check_plan(folder, key, plan)
    if not (folder / "plan.json").exists():
        _write_json(folder / "plan.json", {"key": key, "fields": fields, "digest": plan.digest,
                                           "shards": len(plan.shards), "examples": len(plan.order),
                                           "settings": plan.settings})


def check_plan(folder: Path, key: str, plan: Plan) -> None:
    """The plan.json of a build already in `folder` (an interrupted build's, or another part's) is
    this plan; an ExtractError saying which setting differs and how to resume otherwise. No
    plan.json (no build yet, or one just published and removed) passes. Checked before any shard
    is counted: a shard of another plan is only as foreign as its plan."""
    path = folder / "plan.json"
    have = read_json(path)
    if have is None:
        if path.exists():  # written atomically, so an unreadable one is damaged, not half-written
            raise ExtractError(f"{path}: damaged plan of an interrupted build; rerun with --rebuild-cache to start over")
        return
    if have.get("key") != key:
        raise ExtractError(f"{path}: the plan of another cache entry ({have.get('key')}), not of {key}; delete "
                           f"{folder} (or rerun with --rebuild-cache) to start this entry over")
    if have.get("digest") != plan.digest:
        settings = have.get("settings")
        raise ExtractError(_plan_mismatch(folder, settings if isinstance(settings, dict) else {}, plan))


def _plan_mismatch(folder: Path, had: dict, plan: Plan) -> str:
    """Why the interrupted build in `folder` (settings `had`) cannot take this run's shards, and
    the one way to resume it when the shard size is all that differs."""
    now = plan.settings
    size_had, size_now = had.get("shard_tokens"), now["shard_tokens"]
    batching = [name for name in ("version", "max_tokens", "max_batch") if had.get(name) != now[name]]
    if not batching and isinstance(size_had, int) and size_had != size_now:
        default = " (the default: unset it)" if size_had == SHARD_TOKENS else ""
        return (f"{folder}: this build was started with {SHARD_ENV}={size_had} (shards of {size_had:,} tokens); "
                f"this run makes shards of {size_now:,} tokens ({plan.source}), and shards of two sizes cannot be "
                f"combined; rerun with {SHARD_ENV}={size_had}{default} to resume it, or with --rebuild-cache to "
                f"start over")
    if batching:
        shown = ", ".join(f"{name} {had.get(name)}, now {now[name]}" for name in batching)
        why = f"other batch settings: {shown}"
    else:
        why = "the same settings but another extraction order: another frozentune version's batching"
    return (f"{folder}: an interrupted build of this entry used another plan ({why}), so its shards cannot be "
            f"combined with new ones; finish it with the settings (or frozentune version) that started it, or "
            f"rerun with --rebuild-cache to start over")


def finished(folder: Path, plan: Plan) -> set[int]:
    """Shards whose folder is complete (renamed into place with its shard.json)."""
    return {k for k in range(len(plan.shards)) if (folder / shard_name(k) / "shard.json").is_file()}


def parts_done(folder: Path, done: set[int], total: int) -> list[str]:
    """The parts of several ("i/N", from the finished shards' shard.json) whose shards, of `total`,
    are all in `done`: a `--shard i/N` process that finished its share, waiting for the others."""
    parts = set()
    for k in done:
        part = (read_json(folder / shard_name(k) / "shard.json") or {}).get("part")
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
    if fcntl is None or not (folder / ".active").exists():
        return False
    try:
        fd = os.open(folder / ".active", os.O_RDWR)
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


class _Open:
    """A shard being written: its partial folder, files and running checksums."""

    def __init__(self, folder: Path, k: int):
        for old in folder.glob(f"{shard_name(k)}.partial-*"):  # this shard's leftovers from a killed run
            shutil.rmtree(old, ignore_errors=True)
        self.k, self.t0, self.tokens = k, time.perf_counter(), 0
        self.tmp = folder / f"{shard_name(k)}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        self.files = {name: open(self.tmp / name, "wb") for name in ("states.bin", "ids.bin")}
        self.sums = {name: hashlib.blake2b(digest_size=16) for name in self.files}

    def close_files(self) -> None:
        for f in self.files.values():
            f.close()


class ShardWriter:
    """Writes shards on a thread of its own while the caller keeps the device busy with the next
    batches: each batch's states arrive as a host copy (with the event that completes it), are
    checksummed while they are written, and a shard's end flushes, fsyncs, writes shard.json and
    renames its folder into place. At most WRITE_AHEAD batches wait. An error on the thread is
    raised in the caller at its next call; `close(finish=False)` (an interrupt) still finishes the
    shards whose every batch was handed over, and removes the partial one."""

    def __init__(self, folder: Path, key: str, plan: Plan, backbone: Backbone, part: Part):
        self.folder, self.key, self.plan, self.part = folder, key, plan, part
        self.device, self.precision = str(backbone.device), backbone.precision
        self.seconds: list[float] = []
        self.error: BaseException | None = None
        self._q: queue.Queue = queue.Queue(maxsize=WRITE_AHEAD)
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="frozentune-shard-sum")
        self._thread = threading.Thread(target=self._run, name="frozentune-shard-writer", daemon=True)
        self._thread.start()

    def start(self, k: int) -> None:
        self._put(("start", k))

    def batch(self, host: torch.Tensor, done, ids: np.ndarray) -> None:
        self._put(("batch", host, done, ids))

    def end(self, k: int) -> None:
        self._put(("end", k))

    def close(self) -> None:
        """Wait until every shard handed over is written (or the writer failed: raised here)."""
        try:
            if self.error is None:
                self._put(("stop",))
        finally:
            self._thread.join()
            self._hasher.shutdown()
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
                if item[0] == "start":
                    cur = _Open(self.folder, item[1])
                elif item[0] == "batch":
                    _, host, done, ids = item
                    if done is not None:
                        done.synchronize()
                    self._write(cur, "states.bin", host.numpy())
                    self._write(cur, "ids.bin", ids)
                    cur.tokens += len(ids)
                else:
                    self._finish(cur)
                    cur = None
        except BaseException as e:  # handed to the caller; the partial shard goes below
            self.error = e
        finally:
            if cur is not None:
                cur.close_files()
                shutil.rmtree(cur.tmp, ignore_errors=True)

    def _write(self, cur: _Open, name: str, arr: np.ndarray) -> None:
        mv = memoryview(np.ascontiguousarray(arr)).cast("B")
        summed = self._hasher.submit(cur.sums[name].update, mv)  # both release the GIL: side by side
        cur.files[name].write(mv)
        summed.result()

    def _finish(self, cur: _Open) -> None:
        for f in cur.files.values():
            f.flush()
            os.fsync(f.fileno())
        cur.close_files()
        p0, p1 = self.plan.examples(cur.k)
        seconds = time.perf_counter() - cur.t0
        info = {"key": self.key, "plan": self.plan.digest, "shard": cur.k, "examples": [p0, p1], "tokens": cur.tokens,
                "seconds": seconds, "device": self.device, "precision": self.precision,
                "part": [self.part.index, self.part.count],
                "files": {name: {"size": (cur.tmp / name).stat().st_size, "blake2b": cur.sums[name].hexdigest()}
                          for name in cur.files}}
        _write_json(cur.tmp / "shard.json", info)
        final = self.folder / shard_name(cur.k)
        try:
            os.rename(cur.tmp, final)
        except OSError:
            if not (final / "shard.json").is_file():  # not another process's identical copy: a real failure
                raise
            shutil.rmtree(cur.tmp, ignore_errors=True)
        self.seconds.append(seconds)


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
    seconds: float             # extraction time spent now
    shard_seconds: float       # mean seconds per shard extracted now (0 if none)


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
    if todo:
        open_plan(folder, key, fields, plan)
        with active(folder):
            writer = ShardWriter(folder, key, plan, backbone, part)
            try:
                extract_shards(writer, todo, plan, backbone, tokens, dtype, progress)
            finally:
                spent = writer.seconds
    done = finished(folder, plan)
    missing = [k for k in range(len(plan.shards)) if k not in done]
    return ShardReport(todo, sorted(before), missing, float(sum(spent)),
                       float(np.mean(spent)) if spent else 0.0)


def work_of(plan: Plan, lengths: np.ndarray, shards: Iterable[int]) -> tuple[int, int]:
    """(examples, tokens) of these shards (a progress bar's total, or what was done before it)."""
    ex = tok = 0
    for k in shards:
        p0, p1 = plan.examples(k)
        ex += p1 - p0
        tok += int(lengths[plan.order[p0:p1]].sum())
    return ex, tok


# ----------------------------------------------------------------------------- combining
def check_shard(folder: Path, k: int, key: str, plan: Plan, lengths: np.ndarray, dim: int, itemsize: int) -> dict:
    """shard.json of shard k, after checking it belongs to this key and plan and its files have the
    sizes its examples need; an ExtractError saying which shard and what to do otherwise."""
    where = folder / shard_name(k)
    info = read_json(where / "shard.json")
    redo = "delete that shard folder and rerun (only it is extracted again), or rerun with --rebuild-cache"
    if info is None:
        raise ExtractError(f"{where}: shard.json missing or unreadable; {redo}")
    if info.get("key") != key:
        raise ExtractError(f"{where}: a shard of another cache entry ({info.get('key')}), not of {key}; "
                           f"shards of different entries cannot be merged: {redo}")
    if info.get("plan") != plan.digest or info.get("shard") != k:
        raise ExtractError(f"{where}: made for another plan of this entry (other shard size or batch settings); {redo}")
    p0, p1 = plan.examples(k)
    tokens = int(lengths[plan.order[p0:p1]].sum())
    want = {"states.bin": tokens * dim * itemsize, "ids.bin": tokens * 4}
    for name, size in want.items():
        got = (where / name).stat().st_size if (where / name).is_file() else None
        if got != size or info.get("files", {}).get(name, {}).get("size") != size:
            raise ExtractError(f"{where / name}: {got} bytes, but its {p1 - p0} examples of {tokens} tokens need "
                               f"{size}; {redo}")
    return info


def merge(folder: Path, key: str, plan: Plan, lengths: np.ndarray, dim: int, dtype: str,
          write: Callable[[str, bytes | memoryview], None]) -> dict:
    """Stream every shard's files, in plan order, into `write(name, bytes)`; returns totals.
    Each file's bytes are checked against its shard.json checksum as they pass (a damaged shard
    is an ExtractError before the entry is published). A missing shard is named."""
    missing = [k for k in range(len(plan.shards)) if not (folder / shard_name(k) / "shard.json").is_file()]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
        raise ExtractError(f"{folder}: {len(missing)} of {len(plan.shards)} shards are not finished ({shown}); "
                           f"run the parts that own them (shard k belongs to --shard k%N/N) before merging")
    itemsize = np.dtype(dtype).itemsize
    infos = [check_shard(folder, k, key, plan, lengths, dim, itemsize) for k in range(len(plan.shards))]
    seconds = 0.0
    with ThreadPoolExecutor(1, thread_name_prefix="frozentune-merge-sum") as pool:
        for k, info in enumerate(infos):
            for name in ("states.bin", "ids.bin"):
                h = _stream(folder / shard_name(k) / name, pool, lambda b, name=name: write(name, b))
                _check_sum(folder / shard_name(k) / name, h, info["files"][name]["blake2b"])
            seconds += float(info.get("seconds", 0.0))
    return {"seconds": seconds, "shards": len(infos), "devices": sorted({i.get("device", "?") for i in infos})}


def _stream(path: Path, pool: ThreadPoolExecutor, write: Callable[[bytes], None]) -> str:
    """Pass a file's bytes to `write` in 16 MiB pieces, checksumming each on `pool` meanwhile
    (hashing and writing both release the GIL); returns the file's blake2b."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            summed = pool.submit(h.update, chunk)
            write(chunk)
            summed.result()
    return h.hexdigest()


def _check_sum(path: Path, got: str, want: str) -> None:
    if got != want:
        raise ExtractError(f"{path}: corrupt (its checksum differs from shard.json's); delete that shard folder "
                           f"and rerun, or rerun with --rebuild-cache")

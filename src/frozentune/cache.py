"""FeatureCache: frozen token states on disk — ragged, fp16, memory-mapped, content-keyed.

A cache entry is a folder `<root>/<key>/`:
  states.bin   (N_tok, D) fp16 (or fp32) token states of all examples, no padding, stored in
               extraction order (longest first)
  ids.bin      (N_tok,) int32 token ids (for explanations)
  offsets.bin  (N,) int64 first row of example i;  lengths.bin (N,) int32 its token count
  meta.json    written last: key inputs, shapes, sizes and chunk checksums of every file

The key hashes the model's weights, the tokenizer's definition, the layer choice, max_length,
the dtype and every text, so a changed input never returns stale states. Entries are built in a
`.partial-*` folder and renamed into place only when complete; a reader checks sizes and
checksums and raises CacheError (with the way out) on anything truncated, corrupt or from an
incompatible format version.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .backbone import Backbone, Tokenized, iter_states, tokenizer_hash

FORMAT_VERSION = 1
CHUNK = 64 << 20  # bytes per checksum chunk
DTYPES = {"float16": np.float16, "float32": np.float32}


REBUILD = "Rebuild it: rerun with --rebuild-cache (train, cache)."


class CacheError(RuntimeError):
    """A cache entry is missing, truncated, corrupt or incompatible; the message says what to do."""


def default_root() -> Path:
    return Path(os.environ.get("FROZENTUNE_CACHE", Path.home() / ".cache" / "frozentune")) / "features"


def texts_hash(texts: Sequence[str]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def cache_key(backbone: Backbone, texts: Sequence[str], dtype: str = "float16") -> tuple[str, dict]:
    """(key, the fields it was made from). Any change in model weights, tokenizer, layers,
    max_length, dtype or any text changes the key."""
    fields = {
        "format": FORMAT_VERSION,
        "model": backbone.name,
        "weights": backbone.weights_hash,
        "tokenizer": tokenizer_hash(backbone.tok),
        "layers": str(backbone.layers),
        "max_length": backbone.max_length,
        "dtype": dtype,
        "texts": texts_hash(texts),
        "n": len(texts),
    }
    ident = {k: v for k, v in fields.items() if k != "model"}  # the name is not content
    key = hashlib.blake2b(json.dumps(ident, sort_keys=True).encode(), digest_size=16).hexdigest()
    return key, fields


class _ChunkedWriter:
    """Appends bytes to a file and keeps a blake2b digest per CHUNK bytes."""

    def __init__(self, path: Path):
        self.f = open(path, "wb")
        self.sums: list[str] = []
        self.h = hashlib.blake2b(digest_size=16)
        self.in_chunk = 0
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        mv = memoryview(data).cast("B")
        self.f.write(mv)
        self.size += len(mv)
        while len(mv):
            take = min(len(mv), CHUNK - self.in_chunk)
            self.h.update(mv[:take])
            self.in_chunk += take
            mv = mv[take:]
            if self.in_chunk == CHUNK:
                self._close_chunk()

    def _close_chunk(self) -> None:
        self.sums.append(self.h.hexdigest())
        self.h = hashlib.blake2b(digest_size=16)
        self.in_chunk = 0

    def close(self) -> dict:
        if self.in_chunk:
            self._close_chunk()
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        return {"size": self.size, "chunks": self.sums}


def _file_sums(path: Path) -> dict[int, str]:
    """Checksum of every chunk, read with plain I/O (no growth of resident memory)."""
    out = {}
    size = path.stat().st_size
    with open(path, "rb") as f:
        for c in range((size + CHUNK - 1) // CHUNK):
            f.seek(c * CHUNK)
            out[c] = hashlib.file_digest(_Limited(f, CHUNK), lambda: hashlib.blake2b(digest_size=16)).hexdigest()
    return out


class _Limited:
    """A read-only file view that stops after n bytes (for hashlib.file_digest)."""

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


class CachedStates:
    """Read side of a cache entry. Rows are memory-mapped; `batch` copies only what it needs,
    and `release` drops mapped pages from this process (they stay in the OS page cache), so
    resident memory stays bounded however large the cache is."""

    def __init__(self, path: Path, verify: str = "full"):
        """verify: 'full' checks sizes and every checksum (≈0.7 GB/s); 'none' only sizes."""
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise CacheError(f"{self.path}: not a complete cache entry (no meta.json). Delete it "
                             f"or rebuild it: rerun with --rebuild-cache (train, cache).")
        try:
            self.meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError:
            raise CacheError(f"{meta_path}: corrupt metadata. {REBUILD}") from None
        if self.meta.get("format") != FORMAT_VERSION:
            raise CacheError(f"{self.path}: cache format {self.meta.get('format')} is not this "
                             f"version's ({FORMAT_VERSION}). {REBUILD}")
        self._check(verify)
        self.n: int = self.meta["n"]
        self.dim: int = self.meta["dim"]
        self.dtype = DTYPES[self.meta["dtype"]]
        self.offsets = np.fromfile(self.path / "offsets.bin", dtype=np.int64)
        self.lengths = np.fromfile(self.path / "lengths.bin", dtype=np.int32).astype(np.int64)
        self._maps = {}
        self.states = self._map("states.bin", self.dtype).reshape(-1, self.dim)  # (N_tok, D)
        self._states_t = torch.from_numpy(self.states)  # same memory, for torch's fast gather
        self.ids = self._map("ids.bin", np.int32)  # (N_tok,)
        self._since_release = 0

    def _check(self, verify: str) -> None:
        files = self.meta.get("files", {})
        for name in FILES:
            p = self.path / name
            if name not in files or not p.is_file():
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
                if s != want[c]:
                    raise CacheError(f"{self.path / name}: corrupt (checksum of bytes "
                                     f"{c * CHUNK}..{(c + 1) * CHUNK} differs). {REBUILD}")

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
    """Remove partial folders left by extractions whose process is gone."""
    for p in root.glob("*.partial-*"):
        try:
            pid = int(p.name.split(".partial-")[1].split("-")[0])
            os.kill(pid, 0)
        except (ValueError, IndexError, ProcessLookupError):
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass


def build(root: Path, key: str, fields: dict, backbone: Backbone, tokens: Tokenized,
          dtype: str = "float16", progress: bool = True, max_tokens: int = 8192) -> BuildStats:
    """Extract states for every example and atomically publish `<root>/<key>/`."""
    root.mkdir(parents=True, exist_ok=True)
    _clean_partials(root)
    tmp = root / f"{key}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        stats = _extract_into(tmp, backbone, tokens, DTYPES[dtype], progress, max_tokens)
        meta = dict(fields, dim=backbone.dim, key=key,
                    tokens=stats.tokens, extract_seconds=stats.seconds,
                    created=time.strftime("%Y-%m-%dT%H:%M:%S"))
        meta["files"] = stats.files
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        final = root / key
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return stats


def _extract_into(folder: Path, backbone: Backbone, tokens: Tokenized, dtype,
                  progress: bool, max_tokens: int) -> BuildStats:
    n = len(tokens.ids)
    lengths = tokens.lengths
    offsets = np.zeros(n, dtype=np.int64)
    states_w = _ChunkedWriter(folder / "states.bin")
    ids_w = _ChunkedWriter(folder / "ids.bin")
    row = 0
    t0 = time.perf_counter()
    with _Progress(n, int(lengths.sum()), "extracting", enabled=progress) as bar:
        for idx, states, mask in iter_states(backbone.model, backbone.tok, tokens,
                                             backbone.layers, max_tokens=max_tokens):
            real = states[mask].to(torch.float16 if dtype == np.float16 else torch.float32)
            lens = lengths[idx]
            offsets[idx] = row + np.cumsum(lens) - lens
            states_w.write(real.numpy().tobytes())
            ids_w.write(np.concatenate([tokens.ids[i] for i in idx]).astype(np.int32).tobytes())
            row += int(lens.sum())
            bar.advance(len(idx), int(lens.sum()))
    seconds = time.perf_counter() - t0
    files = {"states.bin": states_w.close(), "ids.bin": ids_w.close()}
    for name, arr in (("offsets.bin", offsets), ("lengths.bin", lengths.astype(np.int32))):
        w = _ChunkedWriter(folder / name)
        w.write(arr.tobytes())
        files[name] = w.close()
    return BuildStats(n, row, seconds, files)


class _Progress:
    """A rich progress bar with examples/s and tokens/s; silent when disabled."""

    def __init__(self, total: int, total_tokens: int, label: str, enabled: bool):
        self.enabled, self.total, self.label = enabled, total, label
        self.done = self.tokens = 0
        self.t0 = time.perf_counter()

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
            self.p = Progress(TextColumn("{task.description}"), BarColumn(),
                              TextColumn("{task.completed}/{task.total}"),
                              TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                              transient=False)
            self.p.__enter__()
            self.task = self.p.add_task(self.label, total=self.total, rate="")
        return self

    def advance(self, examples: int, tokens: int) -> None:
        self.done += examples
        self.tokens += tokens
        if self.enabled:
            dt = max(time.perf_counter() - self.t0, 1e-9)
            self.p.update(self.task, advance=examples,
                          rate=f"{self.done / dt:,.0f} ex/s  {self.tokens / dt:,.0f} tok/s")

    def __exit__(self, *exc):
        if self.enabled:
            self.p.__exit__(*exc)


def get_or_build(backbone: Backbone, texts: Sequence[str], root: Path | None = None,
                 dtype: str = "float16", rebuild: bool = False, progress: bool = True,
                 verify: str = "full") -> tuple[CachedStates, float]:
    """The cache entry for these texts, built if absent. Returns (reader, extraction seconds
    spent now — 0.0 on a hit). A broken entry raises CacheError unless rebuild=True."""
    root = Path(root) if root is not None else default_root()
    key, fields = cache_key(backbone, texts, dtype)
    path = root / key
    if path.exists() and not rebuild:
        return CachedStates(path, verify=verify), 0.0
    stats = build(root, key, fields, backbone, backbone.tokenize(texts), dtype, progress)
    return CachedStates(path, verify="none"), stats.seconds

"""Handing memory that finished batches freed back to the operating system (glibc's malloc_trim).

Why: a server's batches come in many shapes, and each batch's tensors are freed when it is
answered. glibc keeps what is freed for reuse: blocks below its mmap threshold stay in the heap, and
that threshold rises by itself (up to 32 MB) as large blocks are freed, so more and more of the
tensors land in the heap, where freed pages inside it are not returned until something asks. Under
steady load the resident size then creeps up in steps, though nothing is leaked. malloc_trim(0)
returns every whole free page of every arena; called at most once every few seconds after a batch,
its cost is a small fraction of a batch (the bench measures it: bench/serve_load.py's soak).

Where the C library is not glibc (musl, macOS, Windows) there is no malloc_trim: `Trimmer.available`
is False and the startup log says so.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from typing import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


class Trimmer:
    """`maybe()` calls malloc_trim(0) when `every_s` have passed since the last call (every_s 0: never)."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self._trim = _malloc_trim() if every_s > 0 else None
        self._last = time.perf_counter()
        self._lock = threading.Lock()
        self.calls, self.seconds = 0, 0.0  # how often it ran and the time it took, for /metrics and the bench

    @property
    def available(self) -> bool:
        return self._trim is not None

    def describe(self) -> str:
        if self.every_s <= 0:
            return "memory trim off (--trim-every-ms 0)"
        if self._trim is None:
            return "memory trim not available (this C library has no malloc_trim: glibc only)"
        return f"freed memory returned to the OS at most every {self.every_s:g} s (glibc malloc_trim)"

    def maybe(self) -> None:
        if self._trim is None or time.perf_counter() - self._last < self.every_s:
            return
        if not self._lock.acquire(blocking=False):  # the other thread is trimming
            return
        try:
            t0 = time.perf_counter()
            self._trim(0)
            self._last = done = time.perf_counter()
            self.calls += 1
            self.seconds += done - t0
        finally:
            self._lock.release()

"""Exclusive locks between frozentune processes: an flock on a lock file beside what it guards (a cache
entry being built, an --output folder being written, a pre-training run's folder).

The kernel releases an flock when its holder dies, however it dies. The holder writes its process id and
host into the file, so that a process that waits for it, or is refused, can name it. The file is removed
on release; a process that then holds a lock on a removed file takes the current one instead.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Callable

try:
    import fcntl
except ImportError:  # not POSIX: no locks (concurrent writers then race, as they did before locks)
    fcntl = None  # type: ignore[assignment]

REMIND_S = 60.0  # a waiting process says so again this often (a holder stopped with Ctrl-Z holds it for ever)


class Held(Exception):
    """The lock is held by another process (`holder`: "process N on HOST", or "another process")."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def holder(path: Path) -> str:
    """Who holds the lock file `path`, as its holder wrote it: "process N" (on this host) or "process N on
    HOST"; "another process" where it wrote nothing yet or the file cannot be read."""
    try:
        pid, host = Path(path).read_text().split()[:2]
        int(pid)
    except (OSError, ValueError):
        return "another process"
    return f"process {pid}" + ("" if host == socket.gethostname() else f" on {host}")


def acquire(path: Path, wait: bool = True, on_wait: Callable[[str, float], None] | None = None,
            poll_s: float = 0.5) -> int | None:
    """The locked descriptor of the current lock file `path` (created where absent), this process named in
    it; None where the file system refuses flock (no fcntl, a network mount without it). Held where another
    process holds it and not `wait`; with `wait`, on_wait(holder, seconds waited) is called at once and every
    REMIND_S seconds until it is free. OSError where the file cannot be created."""
    if fcntl is None:
        return None
    t0 = said = None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                current = _current(fd, path)
            except BlockingIOError:
                if not wait:
                    raise Held(holder(path)) from None
                now = time.monotonic()
                t0 = now if t0 is None else t0
                if on_wait is not None and (said is None or now - said >= REMIND_S):
                    on_wait(holder(path), now - t0)
                    said = now
                time.sleep(poll_s)  # polled, not a blocking flock: the reminders need the time (an interrupt raises)
                current = False
        except BaseException as e:
            os.close(fd)
            if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
                return None  # flock unsupported here (ENOLCK, EOPNOTSUPP...)
            raise
        if current:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())  # at 0: a new descriptor
            return fd
        os.close(fd)


def _current(fd: int, path: Path) -> bool:
    """Whether the locked descriptor `fd` is the file now at `path` (its holder removed it on release)."""
    try:
        st, cur = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_ino, st.st_dev) == (cur.st_ino, cur.st_dev)


def release(path: Path, fd: int | None) -> None:
    """Remove the lock file `path` and let go of it (`fd`, acquire's; None: nothing was locked)."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


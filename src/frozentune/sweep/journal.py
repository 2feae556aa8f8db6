"""The finished points of a sweep, kept as they finish, so that an interrupted sweep goes on from
where it stopped.

A sweep of 40 points on a full dataset runs for many minutes; before this, Ctrl-C, a SIGTERM from a
scheduler or a full disk at the last save lost every finished point. Each point's table row is now
appended to a journal, one JSON line, as soon as it is trained. Running the same sweep again reads
the journal and trains only the points it does not hold; a sweep that finishes removes its journal
(a complete sweep run again trains every point again, so its seconds are its own).

Where: `sweep-<key>.points.jsonl` in the feature cache's folder (the sweep's states live there; one
folder to list and prune; `frozentune cache --list` shows journals). The key is made from the whole
command: its grid, data files (as absolute paths), fields, shots, train size, backbone options, shared
train options and frozentune's version; so the same sweep finds its journal and another sweep (another
grid too) has its own, never removing the first's points. Within it, a point is reused only where
everything that made its row is unchanged: its setting (method, absolute layer, lr, weight decay,
seed), the texts and labels of its seed's splits, the backbone's weights, config (config.json edited
between the two runs: other states), tokenizer, max length, precision and device.

The first line says what sweep the journal is for (`frozentune cache --list` shows it). A running
sweep holds an exclusive lock on its journal: a second run of the same sweep is refused while it runs,
and `cache --list` / `--prune` see it as running (never removed then).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable

from ..registry import MethodError

NAME = "sweep-{key}.points.jsonl"
FULL_NAME = re.compile(r"sweep-[0-9a-f]{32}\.points\.jsonl")  # what frozentune writes (a 16-byte key in hex)


class SweepBusy(MethodError):
    """Another process is running the same sweep now (it holds the journal's lock)."""


def _digest(obj: object, size: int = 16) -> str:
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(body.encode(), digest_size=size).hexdigest()


def dataset_hash(ds) -> str:
    """Hash of every split's texts and labels, in order (data.Dataset)."""
    from ..cache import texts_hash

    return _digest([[texts_hash(s.texts), s.labels] for s in (ds.train, ds.validation, ds.test)])


def sweep_key(context: dict) -> str:
    from .. import __version__

    return _digest({"frozentune": __version__, **context})


def point_keys(point: dict, dataset: str, backbone) -> tuple[str, str]:
    """(key, legacy key) of one row. The key holds everything that made the row: the point's setting (method,
    lr, weight decay, seed; its layer as the backbone's absolute layer key), its seed's splits, the backbone's
    weights, config, tokenizer, length, precision, token types and device. The legacy key is the same less
    the config: what journals written before the config was in it hold (`Journal`'s `legacy`)."""
    from ..backbone import tokenizer_hash

    fields = {"point": point, "dataset": dataset, "model": backbone.name, "weights": backbone.weights_hash,
              "tokenizer": tokenizer_hash(backbone.tok), "layers": backbone.layer_key,
              "max_length": backbone.max_length, "precision": backbone.precision,
              "token_types": backbone.token_types, "device": str(backbone.device)}
    return _digest(dict(fields, config=backbone.config_hash)), _digest(fields)


NUMBERS = ("lr", "weight_decay", "seed", "score", "test_accuracy", "train_seconds", "extract_seconds", "seconds")
TEXTS = ("method", "layer", "score_is", "model_method")


def _parse(line: bytes) -> object:
    try:
        return json.loads(line)
    except ValueError:
        return None


def row_line(key: str, row: dict) -> bytes:
    """One finished point as its journal line: its key, its row and a checksum of both, so that a line changed
    since (by hand, by a disk or a sync tool) is trained again, not reused (a changed score was taken as the
    point's own: bench/fuzz.py's sweep part)."""
    return json.dumps({"key": key, "row": row, "sum": _digest({"key": key, "row": row})}, allow_nan=False).encode() \
        + b"\n"


def header_line(header: dict) -> bytes:
    """A journal's first line: which sweep it is for, and that its rows carry checksums ("sums")."""
    return json.dumps({"sweep": header, "sums": True}).encode() + b"\n"


def _row_of(entry: object, summed: bool = True) -> tuple[str, dict] | None:
    """(key, row) of a parsed line holding a row as `run_sweep` writes it; None for anything else (a line
    cut short, another shape, the header, a row whose checksum differs: changed since it was written). A row
    without a checksum is read only from a journal whose header does not say its rows carry one (`summed`
    False: written before rows carried checksums, 2026-11-29; see row_line)."""
    if not isinstance(entry, dict):
        return None
    key, row = entry.get("key"), entry.get("row")
    if not isinstance(key, str) or not isinstance(row, dict) or not isinstance(row.get("selection"), dict):
        return None
    if ("sum" in entry or summed) and entry.get("sum") != _digest({"key": key, "row": row}):
        return None
    if not all(isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool) for k in NUMBERS):
        return None
    return (key, row) if all(isinstance(row.get(k), str) for k in TEXTS) else None


def read(path: Path) -> tuple[dict | None, dict[str, dict], int]:
    """(the header, rows by point key, lines neither whole rows nor the header) of a journal; each line
    parsed once."""
    header, rows, skipped, summed = None, {}, 0, True
    for i, line in enumerate(path.read_bytes().splitlines()):
        entry = _parse(line)
        if i == 0 and isinstance(entry, dict) and isinstance(entry.get("sweep"), dict):
            header, summed = entry["sweep"], entry.get("sums") is True
        elif (found := _row_of(entry, summed)) is not None:
            rows.setdefault(*found)
        elif line.strip():
            skipped += 1
    return header, rows, skipped


def describe(header: dict | None) -> str:
    """One line saying which sweep a journal is for, from its header."""
    if not header:
        return "sweep of unknown options (no header: not a journal this version writes)"
    return (f"sweep on {header.get('data', '?')} with {header.get('backbone', '?')}: {header.get('methods', '?')}, "
            f"{header.get('points', '?')} points")


def is_running(path: Path) -> bool:
    """Whether a process holds the journal's lock (a sweep writing into it now)."""
    from ..extract.shards import lock_held

    return lock_held(path)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


current: "Journal | None" = None  # the journal of the sweep running in this process (for the interrupt's message)


def interrupt_note(restart: bool) -> str:
    """What an interrupt of the sweep running now keeps, for the command's one-line message."""
    j = current
    if j is None:  # before the journal was opened: data, backbone loading
        return "the output folder is as it was; cache entries already complete are kept"
    if j.finished:
        return "the sweep was finished and saved"
    again = "run the same command again" + (" without --restart" if restart else "")
    if j.unwritten:
        before = (f"; the {plural(j.kept(), 'point')} it held before are kept: {again} to go on from them"
                  if j.kept() else "")
        return (f"the output folder is as it was; the {plural(j.unwritten, 'point')} finished in this run could not "
                f"be kept ({j.path} cannot be written): a rerun trains them again{before}")
    if j.total and j.kept() >= j.total:
        return (f"the output folder is as it was; all {j.total} points are finished and kept: {again} to write the "
                f"table and the best model (no point is trained again)")
    if not j.kept():
        return "the output folder is as it was; no point had finished; cache entries already complete are kept"
    return (f"the output folder is as it was; the {plural(j.kept(), 'finished point')} and cache entries already "
            f"complete are kept: {again} to go on from the next point")


class Journal:
    """Rows of finished points, read from and appended to one file, locked while this sweep runs. A
    file that cannot be written is said once (the sweep goes on; an interrupt then loses its points);
    a line cut short by a killed process, or one of another shape, is skipped and counted."""

    def __init__(self, path: Path, header: dict, log: Callable[[str], None], resume: bool = True,
                 keys: set[str] | None = None, legacy: dict[str, str] | None = None):
        """keys: the point keys of this sweep's grid; rows of others (their data or backbone changed at the same
        path) are dropped from the journal, not counted as kept (None: every row is this sweep's). legacy: the
        keys rows of the same points had before the key held the backbone's config → their keys now; such rows
        are taken as this config's (said in the opening line, with --restart as the way out)."""
        self.path, self.header, self.log, self.keys, self.legacy = path, header, log, keys, legacy or {}
        self.rows: dict[str, dict] = {}
        self.skipped = self.reused = self.added = self.unwritten = self.dropped = self.upgraded = 0
        self.fd: int | None = None
        self.total = 0  # the grid's points (run_sweep sets it), for interrupt_note
        self.finished = False
        self._open()
        if not resume:  # --restart: the kept points are dropped now (not reused, not left to be reused later)
            self._rewrite()
        elif self.path.is_file():  # read where it cannot be written too (a read-only cache)
            self._read()

    def _open(self) -> None:
        """Open (creating) and lock the journal; a read-only place is said once, and the sweep goes on."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            self.log(f"sweep: cannot keep finished points in {self.path} ({e.strerror}); the sweep goes on, but an "
                     f"interrupt will lose its points")
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            raise SweepBusy(f"sweep: another process is running this same sweep now (it holds {self.path}); wait for "
                            f"it to finish, or run this one with another --cache-dir") from None
        except OSError:  # no flock on this file system: run unlocked
            pass

    def _read(self) -> None:
        try:
            _, self.rows, self.skipped = read(self.path)
        except OSError as e:
            self.log(f"sweep: cannot read the finished points kept in {self.path} ({e.strerror}); training every point")
            return
        if old := [k for k in self.rows if k in self.legacy and self.legacy[k] not in self.rows]:
            self.rows = {self.legacy.get(k, k) if k in old else k: r for k, r in self.rows.items()}
            self.upgraded = len(old)
        if self.keys is not None and (stale := [k for k in self.rows if k not in self.keys]):
            for k in stale:
                del self.rows[k]
            self.dropped = len(stale)
        if self.upgraded or self.dropped:
            self._rewrite()

    def _rewrite(self) -> None:
        """The journal as this sweep can use it: its header and the rows it holds now (in place, under the lock;
        a read-only one is left as it is)."""
        if self.fd is None:
            return
        body = header_line(self.header) + b"".join(row_line(k, r) for k, r in self.rows.items())
        from ..interrupts import held

        with held():
            os.ftruncate(self.fd, 0)
            os.write(self.fd, body if self.rows else b"")
            os.fsync(self.fd)

    def found(self, key: str) -> dict | None:
        row = self.rows.get(key)
        if row is not None:
            self.reused += 1
            return dict(row, reused=True)
        return None

    def add(self, key: str, row: dict) -> None:
        """Append one finished point (flushed to disk before the sweep logs it); the header goes first into
        an empty journal, and a newline first after a line cut short (the row was glued onto it)."""
        if self.fd is None:
            self.unwritten += 1
            return
        from ..interrupts import held

        line = row_line(key, row)
        try:
            with held():  # a whole line or none, whatever the signal
                size = os.fstat(self.fd).st_size
                if size == 0:
                    line = header_line(self.header) + line
                elif os.pread(self.fd, 1, size - 1) != b"\n":
                    line = b"\n" + line
                os.write(self.fd, line)
                os.fsync(self.fd)
            self.added += 1
        except OSError as e:
            self._close()
            self.unwritten += 1
            self.log(f"sweep: cannot keep finished points in {self.path} ({e.strerror}); the sweep goes on, but an "
                     f"interrupt will lose its points")

    def _close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # the lock goes with it
            self.fd = None

    def finish(self) -> None:
        """The sweep is done (table and best model written): remove the journal."""
        self.finished = True
        try:
            self.path.unlink(missing_ok=True)
        except OSError as e:
            self.log(f"sweep: cannot remove {self.path} ({e.strerror}); remove it by hand (a rerun of this sweep "
                     f"would reuse its points)")
        self._close()

    def close(self) -> None:
        """The sweep stopped (an interrupt, an error) or finished: release the lock; a journal holding no
        point (stopped before the first one finished) is removed."""
        if self.fd is not None and not self.added and not self.rows:
            with contextlib.suppress(OSError):
                if os.fstat(self.fd).st_size == 0:
                    self.path.unlink(missing_ok=True)
        self._close()

    def kept(self) -> int:
        """Points of this sweep an interrupt now keeps for the next run: those the journal held (this sweep's
        only) and those written since."""
        return len(self.rows) + self.added

    def opening_line(self) -> str | None:
        """What the journal holds, said before the first point; None when it held nothing."""
        if not self.rows and not self.skipped and not self.dropped:
            return None
        skipped = (f" ({plural(self.skipped, 'line')} unreadable or changed since written: skipped, trained again)"
                   if self.skipped else "")
        if self.dropped:
            skipped += (f" ({plural(self.dropped, 'point')} of another state of its data or backbone dropped: the files "
                        f"at those paths changed)")
        if self.upgraded:
            skipped += (f" ({self.upgraded} of them kept by an earlier frozentune, whose journal did not record the "
                        f"backbone's config.json: taken as this config's; if config.json was edited since that run, "
                        f"use --restart (resume=False in Python))")
        return (f"sweep: {self.path} holds {plural(len(self.rows), 'finished point')} of an interrupted run of this "
                f"sweep{skipped}; each is reused where its setting, data and backbone are unchanged (--restart, resume=False in "
                f"Python, trains every point again)")


def points_in(path: Path) -> int:
    """How many whole rows (finished points) a journal holds; 0 when it cannot be read."""
    try:
        return len(read(path)[1])
    except OSError:
        return 0

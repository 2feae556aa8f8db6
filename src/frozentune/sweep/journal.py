"""The finished points of a sweep, kept as they finish, so that an interrupted sweep goes on from
where it stopped.

A sweep of 40 points on a full dataset runs for many minutes; before this, Ctrl-C, a SIGTERM from a
scheduler or a full disk at the last save lost every finished point. Each point's table row is now
appended to a journal, one JSON line, as soon as it is trained. Running the same sweep again reads
the journal and trains only the points it does not hold; a sweep that finishes removes its journal
(a complete sweep run again trains every point again, so its seconds are its own).

Where: `sweep-<key>.points.jsonl` in the feature cache's folder (the sweep's states live there; one
folder to list and prune; `frozentune cache --list` shows journals). The key is made from what the
command was given besides its grid (data, fields, shots, train size, backbone options, shared train
options, frozentune's version), so the same sweep finds its journal and another sweep has its own;
a point is reused only where everything that made its row is unchanged: its setting (method, absolute
layer, lr, weight decay, seed), the texts and labels of its seed's splits, the backbone's weights,
tokenizer, max length, precision and device.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

NAME = "sweep-{key}.points.jsonl"
PATTERN = "sweep-*.points.jsonl"


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


def point_key(point: dict, dataset: str, backbone) -> str:
    """Everything that made one row: the point's setting (method, lr, weight decay, seed; its layer as
    the backbone's absolute layer key), its seed's splits, the backbone's weights, tokenizer, length,
    precision, token types and device."""
    from ..backbone import tokenizer_hash

    return _digest({"point": point, "dataset": dataset, "model": backbone.name, "weights": backbone.weights_hash,
                    "tokenizer": tokenizer_hash(backbone.tok), "layers": backbone.layer_key,
                    "max_length": backbone.max_length, "precision": backbone.precision,
                    "token_types": backbone.token_types, "device": str(backbone.device)})


def points_in(path: Path) -> int:
    """How many whole lines (finished points) a journal holds; 0 when it cannot be read."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return 0
    return len({k for k in map(_key_of_line, lines) if k is not None})


NUMBERS = ("lr", "weight_decay", "seed", "score", "test_accuracy", "train_seconds", "extract_seconds", "seconds")
TEXTS = ("method", "layer", "score_is", "model_method")


def _key_of_line(line: bytes) -> str | None:
    """The key of a whole line holding a row as `run_sweep` writes it; None for anything else (a line
    cut short, another shape)."""
    try:
        entry = json.loads(line)
        key, row = entry["key"], entry["row"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(key, str) or not isinstance(row, dict) or not isinstance(row.get("selection"), dict):
        return None
    if not all(isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool) for k in NUMBERS):
        return None
    return key if all(isinstance(row.get(k), str) for k in TEXTS) else None


class Journal:
    """Rows of finished points, read from and appended to one file. A file that cannot be written is
    said once (the sweep goes on; an interrupt then loses its points); a line cut short by a killed
    process, or one written by another version, is skipped and counted."""

    def __init__(self, path: Path, log: Callable[[str], None], resume: bool = True):
        self.path, self.log = path, log
        self.rows: dict[str, dict] = {}
        self.skipped = 0
        self.writable = True
        self.reused = 0
        if not resume:
            self.remove()
        elif path.is_file():
            self._read()

    def _read(self) -> None:
        try:
            lines = self.path.read_bytes().splitlines()
        except OSError as e:
            self.log(f"sweep: cannot read the finished points kept in {self.path} ({e.strerror}); training every point")
            return
        for line in lines:
            if (key := _key_of_line(line)) is None:
                self.skipped += 1
            else:
                self.rows.setdefault(key, json.loads(line)["row"])

    def found(self, key: str) -> dict | None:
        row = self.rows.get(key)
        if row is not None:
            self.reused += 1
            return dict(row, reused=True)
        return None

    def add(self, key: str, row: dict) -> None:
        """Append one finished point (flushed to disk before the sweep logs it)."""
        if not self.writable:
            return
        from ..interrupts import held

        line = json.dumps({"key": key, "row": row}, allow_nan=False).encode() + b"\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with held(), open(self.path, "ab") as f:  # a whole line or none, whatever the signal
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            self.writable = False
            self.log(f"sweep: cannot keep finished points in {self.path} ({e.strerror}); the sweep goes on, but an "
                     f"interrupt will lose its points")

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def opening_line(self) -> str | None:
        """What the journal holds, said before the first point; None when it holds nothing."""
        if not self.rows and not self.skipped:
            return None
        skipped = f" ({self.skipped} unreadable line(s) skipped)" if self.skipped else ""
        return (f"sweep: {self.path} holds {len(self.rows)} finished point(s) of an interrupted run of this sweep"
                f"{skipped}; each is reused where its setting, data and backbone are unchanged (--restart trains "
                f"every point again)")

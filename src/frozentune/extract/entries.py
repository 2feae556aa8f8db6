"""What a feature-cache folder holds (`frozentune cache --list`) and clearing what cannot be used
(`frozentune cache --prune`)."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .shards import is_running, read_json


@dataclass
class Entry:
    """One thing in the cache folder: a complete entry, an interrupted or running build, or debris."""
    path: Path
    kind: str            # entry | building | merging | partial
    status: str          # ok | old format (re-keyed on next use) | unreadable | running | interrupted | …
    bytes: int
    model: str = ""
    layers: str = ""
    max_length: int | None = None
    precision: str = ""
    dtype: str = ""
    examples: int | None = None
    tokens: int | None = None
    created: str = ""
    shards: str = ""     # building: "done/total"

    @property
    def removable(self) -> bool:
        """What --prune removes: interrupted builds (nobody is extracting into them), leftovers of
        merges whose process is gone, and entries that no version can read. A running build and a
        readable entry (old-format ones are re-keyed on use) are kept."""
        return (self.kind == "building" and self.status == "interrupted") or self.kind == "partial" \
            or self.status == "unreadable"

    def row(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "path"}
        return {"path": str(self.path), **d}


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


def _pid_alive(text: str) -> bool:
    try:
        os.kill(int(text), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _describe(fields: dict) -> dict:
    return {"model": str(fields.get("model", "")), "layers": str(fields.get("layers", "")),
            "max_length": fields.get("max_length"), "precision": str(fields.get("precision", "fp32")),
            "dtype": str(fields.get("dtype", "")), "examples": fields.get("n")}


def scan(root: Path) -> list[Entry]:
    """Every entry, build and leftover under root (sorted by path)."""
    from ..cache import FORMAT_VERSION, _safe_sha

    out: list[Entry] = []
    if not root.is_dir():
        return out
    for p in sorted(root.iterdir()):
        if p.suffix == ".lock" or not p.is_dir():
            continue
        if ".partial-" in p.name:
            alive = _pid_alive(p.name.split(".partial-")[1].split("-")[0])
            out.append(Entry(p, "merging" if alive else "partial",
                             "running" if alive else "leftover of a merge", _size(p)))
            continue
        if p.name.endswith(".building"):
            plan = read_json(p / "plan.json")
            if plan is None:
                out.append(Entry(p, "building", "interrupted", _size(p)))
                continue
            total = int(plan.get("shards", 0))
            done = sum(1 for s in p.glob("shard-*") if (s / "shard.json").is_file() and ".partial-" not in s.name)
            status = "running" if is_running(p) else "interrupted"
            out.append(Entry(p, "building", status, _size(p), shards=f"{done}/{total}",
                             **_describe(plan.get("fields", {}))))
            continue
        meta = read_json(p / "meta.json")
        if meta is None or meta.get("meta_sha") != _safe_sha(meta):
            out.append(Entry(p, "entry", "unreadable", _size(p)))
            continue
        fmt = meta.get("format")
        status = "ok" if fmt == FORMAT_VERSION else \
            "old format (re-keyed on next use)" if fmt == 2 else "unreadable"
        out.append(Entry(p, "entry", status, _size(p), tokens=meta.get("tokens"), created=str(meta.get("created", "")),
                         **_describe(meta)))
    return out


def prune(root: Path) -> list[Entry]:
    """Remove what `Entry.removable` names; returns what was removed."""
    gone = []
    for e in scan(root):
        if e.removable:
            shutil.rmtree(e.path, ignore_errors=True)
            gone.append(e)
    return gone


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"

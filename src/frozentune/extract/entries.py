"""What a feature-cache folder holds (`frozentune cache --list`) and clearing what cannot be used
(`frozentune cache --prune`)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .shards import is_running, parts_done, read_json, shard_records

try:
    import fcntl
except ImportError:  # not POSIX: no build locks are taken (cache.build_lock), so none are left to remove
    fcntl = None  # type: ignore[assignment]


# statuses of a build folder
RUNNING = "running"                       # a process is extracting into it now
WAITING = "waiting for other parts"       # a part of several (--shard i/N) finished its shards
RESUMABLE = "interrupted, resumable"      # finished shards that a rerun resumes from
INTERRUPTED = "interrupted"               # nothing to resume from (no finished shard, or no readable plan)
DONE_LEFTOVER = "left over beside its complete entry"  # a build whose entry was published (a run reads the entry)
UNREADABLE = "unreadable"                 # an entry's status starts with it, then says why in parentheses
NOT_OURS = "not a cache entry (left alone)"  # a folder whose name frozentune never writes
LINK = "a symbolic link"  # "a symbolic link to TARGET, not the cache's own (left alone)": never followed, never removed
SWEEP_RESUMABLE = "interrupted sweep, resumable"  # a sweep journal (sweep/journal.py): its finished points
SWEEP_EMPTY = "interrupted sweep, nothing to reuse"  # a journal with no whole line
# The names frozentune writes in a cache folder: <key>, <key>.building, <key>.partial-<pid>-<tag>[-replaced],
# a key being 32 hex digits (cache._key_of). Anything else is someone's own folder: listed, never removed.
KEY_NAME = re.compile(r"[0-9a-f]{32}(\.building|\.partial-.+)?")
LOCK_NAME = re.compile(r"[0-9a-f]{32}\.lock")  # a build's flock (cache.build_lock), removed when it is released
STALE_LOCK = "held by no process (left by a build that was killed)"
OLD = "old format (re-keyed on next use)"  # an entry of format 2 or 3 (cache.legacy_keys)
OLD_READ_ONLY = "old format (read in place: this cache folder is not writable, so it is not re-keyed)"


@dataclass
class Entry:
    """One thing in the cache folder: a complete entry, an interrupted or running build, or debris."""
    path: Path
    kind: str            # entry | building | merging | partial | sweep (a journal) | lock (prune) | other (never removed)
    status: str          # ok | old format (re-keyed on next use) | unreadable (why) | running | waiting for other
                         # parts | interrupted, resumable | interrupted | leftover of a merge
    bytes: int
    model: str = ""
    layers: str = ""
    max_length: int | None = None
    precision: str = ""
    dtype: str = ""
    examples: int | None = None
    input: str = ""      # texts | pairs | pairs without token types (two entries of one file differ by it alone)
    tokens: int | None = None
    created: str = ""
    shards: str = ""     # building: "finished/total"
    parts: str = ""      # building: the parts of several that finished their shards ("0/2, 2/4")
    sweep: str = ""      # sweep: which sweep the journal is for ("sweep on trec with minilm: probe,space, 12 points")
    source: str = ""     # entry: where its texts came from (a file), where the build said so (meta.json's source)

    @property
    def removable(self) -> bool:
        """What --prune removes: builds with nothing to resume from (no finished shard), leftovers
        of merges whose process is gone, and entries that no version can read. A running build, a
        build holding finished shards (see `resumable`) and a readable entry (old-format ones are
        re-keyed on use) are kept. A build folder left beside its complete entry (publishing
        interrupted while removing it) is removed too: no run reads it."""
        return (self.kind == "building" and self.status in (INTERRUPTED, DONE_LEFTOVER)) or self.kind == "partial" \
            or self.status.startswith(UNREADABLE) or self.status == SWEEP_EMPTY

    @property
    def resumable(self) -> bool:
        """A build holding finished shards that nobody is extracting into now: a later run (or the
        other parts) resumes from them. --prune removes it only when asked (include_resumable)."""
        return (self.kind == "building" and self.status in (WAITING, RESUMABLE)) or self.status == SWEEP_RESUMABLE

    def row(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "path"}
        return {"path": str(self.path), **d}


def _size(path: Path) -> int:
    if path.is_file():  # a sweep's journal
        return path.stat().st_size
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                st = os.lstat(os.path.join(dirpath, n))
                # disk in use: a build's data files are made at full size and filled as shards finish
                total += min(st.st_size, getattr(st, "st_blocks", st.st_size // 512 + 1) * 512)
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


def _count(v: object) -> int | None:
    """v where it is a count (a whole number ≥ 0), else None: what an edited meta.json or plan.json holds is shown
    only where it can be."""
    from ..cache import is_count

    return v if is_count(v) else None


def _describe(fields: object) -> dict:
    fields = fields if isinstance(fields, dict) else {}
    return {"model": str(fields.get("model", "")), "layers": str(fields.get("layers", "")),
            "max_length": _count(fields.get("max_length")), "precision": str(fields.get("precision", "fp32")),
            "dtype": str(fields.get("dtype", "")), "examples": _count(fields.get("n")),
            "input": ("pairs" + ("" if fields.get("token_types", True) else " without token types")
                      if fields.get("pairs") else "texts")}


def _files_problem(path: Path, meta: dict) -> str:
    """Why an entry's data files cannot be what its meta.json records ("" when their sizes agree);
    sizes only (stat): the checksums are verified when the entry is opened."""
    from ..cache import FILES

    files = meta.get("files")
    for name in FILES:
        want = files.get(name) if isinstance(files, dict) else None
        size = want.get("size") if isinstance(want, dict) else None
        if not isinstance(size, int):
            return f"meta.json records no size for {name}"
        try:
            got = (path / name).stat().st_size
        except OSError:
            return f"{name} missing"
        if got != size:
            return f"{name}: {got:,} bytes, meta.json records {size:,}"
    return ""


def _entry(p: Path, verify: bool = False, metas: dict | None = None) -> Entry:
    """A complete entry `p/` (meta.json written last): ok, old format, or unreadable and why. Sizes
    only, unless `verify`: then every checksum of an ok entry is read too (all its bytes, ≈0.7 GB/s),
    so bytes changed in place (same size) are found before a run opens the entry."""
    from ..cache import FORMAT_VERSION, _safe_sha, meta_problems

    meta = read_json(p / "meta.json")
    if meta is None:
        return Entry(p, "entry", f"{UNREADABLE} (meta.json missing or not JSON)", _size(p))
    fmt = meta.get("format")
    if fmt == 1 and "meta_sha" not in meta:  # format 1 wrote no checksum of its meta.json (format 2 added it)
        return Entry(p, "entry", f"{UNREADABLE} (cache format 1, not {FORMAT_VERSION}: a run builds it anew; "
                     f"--prune removes this one)", _size(p), tokens=_count(meta.get("tokens")),
                     created=str(meta.get("created", "")), **_describe(meta))
    if meta.get("meta_sha") != _safe_sha(meta):
        return Entry(p, "entry", f"{UNREADABLE} (meta.json edited: its checksum differs)", _size(p))
    bad = meta_problems(meta)
    problem = (f"cache format {fmt}, not {FORMAT_VERSION}" if fmt not in (2, 3, FORMAT_VERSION)
               else f"meta.json: missing or invalid {', '.join(bad)}" if bad else _files_problem(p, meta))
    status = f"{UNREADABLE} ({problem})" if problem else "ok" if fmt == FORMAT_VERSION else OLD
    if metas is not None and not problem:
        metas[p] = meta
    if verify and status == "ok":
        status = _verified(p)
    return Entry(p, "entry", status, _size(p), tokens=_count(meta.get("tokens")), created=str(meta.get("created", "")),
                 source=str(meta.get("source") or ""), **_describe(meta))


def _verified(p: Path) -> str:
    """"ok" when entry p/ passes the checks a run makes on opening it (every checksum), else UNREADABLE
    and the first problem found."""
    from ..cache import CacheError, CachedStates

    try:
        CachedStates(p, verify="full")
    except CacheError as e:
        return f"{UNREADABLE} ({str(e).split('. ')[0].replace(str(p) + '/', '')})"
    return "ok"


def _building(p: Path) -> Entry:
    """A `<key>.building/` folder: running, waiting for other parts, resumable or interrupted."""
    plan = read_json(p / "plan.json")
    if plan is None:
        return Entry(p, "building", INTERRUPTED, _size(p))
    total = _count(plan.get("shards"))  # None where plan.json was edited (a run goes by its key and digest)
    done = set(shard_records(p))
    parts = parts_done(p, done, total or 0)
    entry = p.with_name(p.name[:-len(".building")])
    if is_running(p):
        status = RUNNING
    elif (entry / "meta.json").is_file() and _entry(entry).status == "ok":
        # published, then interrupted while its build folder was removed: no run reads it (a run finds the
        # entry first), and its data files may be links to the entry's
        status = DONE_LEFTOVER
    elif not done:
        status = INTERRUPTED
    elif parts and total is not None and len(done) < total:
        status = WAITING
    else:
        status = RESUMABLE
    return Entry(p, "building", status, _size(p), shards=f"{len(done)}/{'?' if total is None else total}",
                 parts=", ".join(parts),
                 **_describe(plan.get("fields", {})))


def _journal(p: Path) -> Entry:
    """A sweep's journal: which sweep, and how many finished points a rerun of it would reuse; running
    while a sweep holds its lock (never removed then)."""
    from ..sweep import journal

    try:
        header, rows, skipped = journal.read(p)
    except OSError:
        header, rows, skipped = None, {}, 0
    n = len(rows)
    status = (RUNNING if journal.is_running(p) else f"{UNREADABLE} (no header: not a journal this version writes)"
              if header is None and (n or skipped) else SWEEP_RESUMABLE if n else SWEEP_EMPTY)
    return Entry(p, "sweep", status, _size(p), model=(header or {}).get("backbone", ""),
                 shards=journal.plural(n, "finished point"), sweep=journal.describe(header))


def scan(root: Path, verify: bool = False) -> list[Entry]:
    """Every entry, build and leftover under root (sorted by path); verify: read every checksum of
    the complete entries (see `_entry`)."""
    out: list[Entry] = []
    if not root.is_dir():
        return out
    from ..sweep.journal import FULL_NAME

    metas: dict[Path, dict] = {}  # readable entries' meta.json, for _old_entries
    for p in sorted(root.iterdir()):
        if p.is_symlink():  # e.g. a key-named link to an entry elsewhere: its size was its target's, and --prune
            if p.suffix != ".lock":  # said "removed" each time while the link stayed
                out.append(Entry(p, "other", f"{LINK} to {os.readlink(p)}, not the cache's own (left alone)", 0))
            continue
        if FULL_NAME.fullmatch(p.name) and p.is_file():
            out.append(_journal(p))
            continue
        if p.suffix == ".lock" or not p.is_dir():
            continue
        if not KEY_NAME.fullmatch(p.name):  # e.g. --cache-dir pointed at a folder that holds other things
            out.append(Entry(p, "other", NOT_OURS, _size(p)))
        elif ".partial-" in p.name:
            alive = _pid_alive(p.name.split(".partial-")[1].split("-")[0])
            out.append(Entry(p, "merging" if alive else "partial",
                             "running" if alive else "leftover of a merge", _size(p)))
        elif p.name.endswith(".building"):
            out.append(_building(p))
        else:
            out.append(_entry(p, verify, metas))
    _old_entries(root, out, metas)
    return out


def _old_entries(root: Path, out: list[Entry], metas: dict[Path, dict]) -> None:
    """Say what will become of each old-format entry in `out` where "re-keyed on next use" is not so: in a
    folder this process cannot write it is read in place; a format-3 entry beside a format-4 one of the
    same inputs (weights, tokenizer, texts…) was made with another config.json (cache.agreeing leaves it
    for that config) or by the previous version running beside this one, and no run of this model re-keys it."""
    old = [e for e in out if e.status == OLD]
    if not old:
        return
    if not os.access(root, os.W_OK):
        for e in old:
            e.status = OLD_READ_ONLY
        return
    from ..cache import FORMAT_VERSION, format3_key

    had = {format3_key(m): p.name for p, m in metas.items() if m.get("format") == FORMAT_VERSION}  # their old keys
    for e in old:
        twin = had.get(e.path.name) if metas[e.path].get("format") == 3 else None
        if twin:
            e.status = (f"old format, beside entry {twin[:8]}… of the same weights and texts: unused unless made "
                        f"with another config.json (re-keyed when that is used); `cache --remove {e.path.name}` "
                        f"deletes it")


def prune(root: Path, include_resumable: bool = False, verify: bool = False) -> list[Entry]:
    """Remove what `Entry.removable` names, and with include_resumable also the builds holding
    finished shards (`Entry.resumable`); with verify, entries whose checksums fail count as
    unreadable; and the `<key>.lock` files no process holds (kind "lock"). Returns what was
    removed. What could not be removed (a read-only folder) is a cache.NotRemoved naming each and
    why, raised after the rest was removed (its `removed` holds those); it was reported "removed"
    and "freed" while it stayed."""
    gone, failed = [], []
    for e in scan(root, verify):
        if e.removable or (include_resumable and e.resumable):
            why = remove(e.path)
            if why:
                failed.append(f"{e.path.name} ({why})")
            else:
                gone.append(e)
    for lock in sorted(root.glob("*.lock")) if root.is_dir() else []:
        if LOCK_NAME.fullmatch(lock.name) and not lock.is_symlink():
            why = _remove_unheld_lock(lock)
            if why:
                failed.append(f"{lock.name} ({why})")
            elif why is not None:
                gone.append(Entry(lock, "lock", STALE_LOCK, 0))
    _raise_not_removed(root, failed, gone, "run --prune again")
    return gone


def _raise_not_removed(root: Path, failed: list[str], gone: list[Entry], then: str) -> None:
    """A cache.NotRemoved naming what could not be removed ("name (why)" each), if anything."""
    from ..cache import NotRemoved

    if failed:
        raise NotRemoved(f"{root}: could not remove {len(failed)} item(s): {'; '.join(failed)}"
                         + (f" ({len(gone)} other item(s) were removed)" if gone else "")
                         + f". Make them writable to you (a read-only mount, another user's files), then {then}", gone)


KEY_GIVEN = re.compile(r"[0-9a-f]{8,32}")  # what --remove takes: a key, or a prefix of it as --list shows it


def remove_entries(root: Path, given: list[str]) -> list[Entry]:
    """`cache --remove KEY [KEY ...]`: remove the entries named, each by its key or a prefix of at least 8 of its
    hex digits that no other key starts with (--list shows 16, then "…"), with their interrupted build folders
    (a key whose build alone is there removes that). Every key is checked first: an unknown or ambiguous one
    (naming the candidates), or one being built now, is a CacheError and nothing is removed. Returns what was
    removed; what could not be is a cache.NotRemoved, raised after the rest was removed."""
    from ..cache import BuildRunning, CacheError, build_lock

    items: dict[str, list[Entry]] = {}
    for e in scan(root):
        if e.kind in ("entry", "building"):
            items.setdefault(e.path.name[:32], []).append(e)
    chosen: list[tuple[str, str]] = []  # (as given, the key)
    for text in given:
        prefix = text.strip().removesuffix("…").lower()
        if not KEY_GIVEN.fullmatch(prefix):
            raise CacheError(f"--remove {text}: not a cache key; give a key as `frozentune cache --list` shows it (at "
                             f"least its first 8 hex digits)")
        found = sorted(k for k in items if k.startswith(prefix))
        if not found:
            have = ", ".join(k[:16] + "…" for k in sorted(items)[:6]) + (", …" if len(items) > 6 else "")
            raise CacheError(f"--remove {text}: no cache entry in {root} has that key"
                             + (f" (it holds {have})" if items else " (it holds none)")
                             + "; `frozentune cache --list` shows them")
        if len(found) > 1:
            raise CacheError(f"--remove {text}: the keys of {len(found)} entries start with it ({', '.join(found)}); "
                             f"give more of the key")
        key = found[0]
        if any(e.status == RUNNING for e in items[key]):
            raise _being_built(text, key)
        if key not in [k for _, k in chosen]:
            chosen.append((text, key))
    gone, failed = [], []
    with contextlib.ExitStack() as held:  # each key's build lock, all taken before anything is removed: a build
        for text, key in chosen:          # that starts meanwhile waits, then builds the entry anew
            try:
                held.enter_context(build_lock(root, key, lambda _: None, wait=False))
            except BuildRunning:
                raise _being_built(text, key) from None
        for _, key in chosen:
            for e in items[key]:
                why = remove(e.path)
                if why:
                    failed.append(f"{e.path.name} ({why})")
                else:
                    gone.append(e)
    _raise_not_removed(root, failed, gone, "run --remove again")
    return gone


def _being_built(text: str, key: str) -> Exception:
    from ..cache import CacheError

    return CacheError(f"--remove {text}: entry {key} is being built now; let the build finish (or stop it), then "
                      f"remove it")


def _remove_unheld_lock(path: Path) -> str | None:
    """Remove a `<key>.lock` that no process holds (a build killed before releasing it left it; they were
    never removed): "" when removed, why not when that failed, None when it is kept (a build holds it, or
    flock does not work here, so it is not known to be free). It is removed while locked: a build that opened
    it meanwhile takes a new one once this lets go (locks.acquire checks that its lock file is current)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:  # removed meanwhile (its build ended), or not readable: left alone
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: a build holds it; other errors: no flock on this file system
            return None
        try:
            st, cur = os.fstat(fd), os.lstat(path)
        except FileNotFoundError:
            return None
        if (st.st_ino, st.st_dev) != (cur.st_ino, cur.st_dev):  # another lock file of that name now
            return None
        try:
            os.unlink(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            return err.strerror or str(err)
        return ""
    finally:
        os.close(fd)


def remove(path: Path) -> str:
    """Delete a folder of the cache (or a sweep's journal, a file) and everything in it; "" when it is gone,
    else why not and what is left of it (what could be removed is). A link is never followed."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as err:
        if not os.path.lexists(path):  # gone meanwhile (another --prune)
            return ""
        at = f" ({Path(err.filename).name})" if isinstance(err.filename, str) else ""
        return f"{err.strerror or err}{at}; {size_text(_size(path))} of it left"
    return ""


def kept_lines(root: Path) -> list[str]:
    """After `prune`: one line per build it kept, a running one or one holding finished shards,
    saying why and how to finish or remove it (none once everything resumable was removed and
    nothing runs)."""
    lines = []
    for e in scan(root):
        if e.status == RUNNING:
            what = {"building": "a process is extracting into it now", "sweep": "a sweep is running and writing into "
                    "it now"}.get(e.kind, "a process is merging into it now")
            lines.append(f"kept {e.path.name} (running: {what}; it is never removed while running, {size_text(e.bytes)})")
            continue
        if not e.resumable:
            continue
        if e.kind == "sweep":
            lines.append(f"kept {e.path.name} (an interrupted {e.sweep}, its {e.shards}: run the same sweep again to "
                         f"go on from them; --prune --include-resumable deletes it, {size_text(e.bytes)})")
            continue
        if e.status == WAITING:
            why = (f"waiting for other parts: {e.shards} shards finished, part {e.parts} done; run the other "
                   f"parts (--shard i/N) to finish it")
        else:
            why = f"interrupted, resumable: {e.shards} shards finished; rerun the same command to resume it"
        lines.append(f"kept {e.path.name} ({why}; --prune --include-resumable deletes it, {size_text(e.bytes)})")
    return lines


def size_text(n: int) -> str:
    """A size in bytes as people read it, in the unit that fits: bytes, kB, MB or GB (a journal of a few rows
    said 0.0 MB; a small build's free-space check said "take 0.00 GB and 0.00 GB are free")."""
    if n < 1e3:
        return f"{n:,} bytes"
    if n < 1e6:
        return f"{n / 1e3:,.1f} kB"
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"

"""The memory allocator under `frozentune serve`: glibc's malloc, or tcmalloc / jemalloc preloaded.

A server's memory under load is mostly the allocator's, not the models': 8 MiniLM heads hold 0.58 GB
at rest, and under 32 clients glibc's malloc took the process to 0.86-1.08 GB. Of the 0.40-0.65 GB
glibc held from the system after such a run, 0.26-0.34 GB was in use (its malloc_stats); the rest
was freed memory kept in the pass thread's arena, fragmented by batches of every size, and how much
it kept varied by 100 MB and more between identical servers. In one run side by side
(`python bench/serve_allocators.py`), tcmalloc (gperftools) peaked at 0.84× (1 head) and 0.81×
(8 heads) of glibc's memory and answered 1.02× (short texts) and 1.11× (long) the requests/s;
jemalloc peaked as low (0.84×, 0.79×) but answered long texts on one head 0.89× (bench/REPORT.md,
"The allocator under the server").

An allocator is chosen before the process's first allocation, so `--allocator tcmalloc|jemalloc`
starts the server again (`exec`, same process id and arguments) with the library in LD_PRELOAD, as
Intel's launcher for PyTorch on CPUs does. From a command line that happens before torch is
imported (cli._allocator_before_imports), so it costs nothing measurable: a 1-head server answered
/health 3.5-3.7 s after its start on tcmalloc, 3.6-3.7 s on the system's malloc (3 alternating
starts each); restarting after the imports had cost 0.9 s. `auto` (the default) does that where tcmalloc is
installed and otherwise runs on the system's malloc, and the startup log says which, and why.
Linux only: elsewhere the platform's malloc is used, and asking for another is an error.
"""
from __future__ import annotations

import ctypes.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import FrozentuneError

CHOICES = ("auto", "system", "tcmalloc", "jemalloc")
# the shared libraries to preload, in order of preference, and the Debian/Ubuntu package of each
LIBRARIES = {"tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"), "jemalloc": ("libjemalloc.so.2",)}
PACKAGES = {"tcmalloc": "libtcmalloc-minimal4", "jemalloc": "libjemalloc2"}
LIBRARY_NAMES = {"tcmalloc": ("tcmalloc_minimal", "tcmalloc"), "jemalloc": ("jemalloc",)}  # for ctypes.util
SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
               "/opt/conda/lib")
# set in the environment of the process started again, so that a preload that did not take is said, not looped
MARK = "FROZENTUNE_ALLOCATOR"


class AllocatorError(FrozentuneError, ValueError):
    """An --allocator that cannot be had here; the message says what to do."""


@dataclass(frozen=True)
class Plan:
    name: str                   # the allocator the server runs on: system, tcmalloc or jemalloc
    preload: str | None = None  # a library to start the process again with (LD_PRELOAD); None: run as it is
    note: str = ""              # one line for the startup log


def in_use(maps: Path = Path("/proc/self/maps")) -> str:
    """The allocator this process runs on: tcmalloc or jemalloc where one is mapped into it (preloaded),
    else system (also where /proc is absent: not Linux)."""
    try:
        text = maps.read_text()
    except OSError:
        return "system"
    for name in ("tcmalloc", "jemalloc"):
        if f"lib{name}" in text:
            return name
    return "system"


def find(name: str, dirs: tuple[str, ...] = SEARCH_DIRS) -> str | None:
    """The path of `name`'s library in `dirs` (then the active environment's lib/, then the linker's
    cache through ctypes.util), or None where it is not installed."""
    for folder in (*dirs, str(Path(sys.prefix) / "lib")):
        for lib in LIBRARIES[name]:
            if (Path(folder) / lib).is_file():
                return str(Path(folder) / lib)
    if dirs is SEARCH_DIRS:  # a caller's own dirs are the whole search (tests)
        for short in LIBRARY_NAMES[name]:
            if (found := ctypes.util.find_library(short)) and found in LIBRARIES[name]:
                return found  # a soname: LD_PRELOAD looks it up as the linker does
    return None


def plan(choice: str, can_restart: bool, current: str | None = None, locate=None) -> Plan:
    """What `--allocator choice` means for this process. can_restart: the process may be started again
    (it runs `frozentune serve` from its own command line, not inside another program). current: the
    allocator in use (in_use()); locate: name → library path or None (find). Raises AllocatorError
    where the choice cannot be had."""
    if choice not in CHOICES:
        raise AllocatorError(f"--allocator {choice!r}: choose one of {', '.join(CHOICES)}")
    current = current or in_use()
    preloaded = os.environ.get("LD_PRELOAD", "")
    if current != "system":
        if choice in ("auto", current):
            how = (f"preloaded by --allocator {choice}{' (the default)' if choice == 'auto' else ''}"
                   if os.environ.get(MARK) == current else "already in this process")
            return Plan(current, None, f"{current} ({how}: LD_PRELOAD={preloaded})")
        raise AllocatorError(f"--allocator {choice}: this process already runs on {current} (LD_PRELOAD={preloaded}); "
                             f"start it without that LD_PRELOAD, or give --allocator {current}")
    if choice == "system":
        return Plan("system", None, "the system's malloc (--allocator system)")
    name = "tcmalloc" if choice == "auto" else choice
    if os.environ.get(MARK) == name:
        raise AllocatorError(f"--allocator {choice}: the server was started again with LD_PRELOAD={preloaded} and "
                             f"{name} is still not loaded; check that library, or give --allocator system")
    if not sys.platform.startswith("linux"):
        return _system_or_error(choice, f"the platform's malloc (preloading {name} is done on Linux only)",
                                "preloading an allocator is supported on Linux only; give --allocator system")
    lib = (locate or find)(name)
    if lib is None:
        return _system_or_error(
            choice, f"glibc's malloc ({name} is not installed; with it a server holds less memory under load: "
                    f"apt-get install {PACKAGES[name]})",
            f"{' or '.join(LIBRARIES[name])} was not found (looked in {', '.join(SEARCH_DIRS)}, the environment's "
            f"lib/ and the linker's cache); install it (Debian/Ubuntu: apt-get install {PACKAGES[name]}) or give "
            f"--allocator system")
    if not can_restart:
        return _system_or_error(
            choice, f"the system's malloc (the server runs inside another program, which chose its allocator when it "
                    f"started; {name} is at {lib})",
            f"an allocator is chosen when a process starts, and this server runs inside another program; start that "
            f"with LD_PRELOAD={lib}, or give --allocator system")
    return Plan(name, lib, f"{name} ({lib}, preloaded)")


def _system_or_error(choice: str, note: str, why: str) -> Plan:
    """Where the library cannot be preloaded: for auto, the system's malloc with `note` for the log;
    for an explicit choice, AllocatorError saying `why`."""
    if choice == "auto":
        return Plan("system", None, note)
    raise AllocatorError(f"--allocator {choice}: {why}")


def restart(p: Plan, argv: list[str]) -> None:
    """Replace this process with `python -m frozentune argv...` with p.preload in LD_PRELOAD (kept
    ahead of any library already there). Does not return."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(x for x in (p.preload, env.get("LD_PRELOAD", "")) if x)
    env[MARK] = p.name
    if p.name == "tcmalloc":  # else it reports every allocation over 1 GiB on stderr
        env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "frozentune", *argv], env)

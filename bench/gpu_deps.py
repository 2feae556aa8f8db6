"""Give a bare GPU machine (device tool) the serving stack from carried wheels, without pip or a network.

  python3 bench/gpu_deps.py .gpu/wheels /tmp/site     # then PYTHONPATH=/tmp/site:...

The machine's python3 has torch and transformers but may lack what `frozentune serve` and
bench/serve_load.py import (NEEDED: fastapi, uvicorn, httptools, uvloop, psutil, …). When any of these is
missing, every wheel in WHEELS that fits this interpreter (pure Python, abi3, or its own cpXY tag;
the newest version of each distribution) is unpacked into SITE, which goes first on PYTHONPATH: one
consistent set (fastapi with the pydantic it was resolved with), not a mix with what the machine has.
A wheel is a zip of site-packages entries, so unpacking it is installing it (no entry-point scripts
are needed here). The wheels are made on the development machine with `pip download` (gpu_run.sh).
"""
from __future__ import annotations

import importlib.util
import re
import sys
import zipfile
from pathlib import Path

NEEDED = ("fastapi", "uvicorn", "prometheus_client", "psutil", "httpx", "pydantic", "starlette", "httptools", "uvloop")


def fits(name: str) -> bool:
    """Whether a wheel file name's tags suit this interpreter on x86-64 Linux."""
    py, abi, plat = name[:-4].split("-")[-3:]
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    ok_plat = plat == "any" or "x86_64" in plat and "linux" in plat
    return ok_plat and (abi == "none" and py.startswith("py3") or abi == "abi3" or abi == here)


def version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.+-]", v))


def main(wheels: Path, site: Path) -> int:
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        print(f"deps: all of {', '.join(NEEDED)} importable; nothing unpacked", flush=True)
        return 0
    best: dict[str, tuple[tuple, Path]] = {}
    for w in sorted(wheels.glob("*.whl")):
        if fits(w.name):
            dist, version = w.name.split("-")[:2]
            if dist not in best or version_key(version) > best[dist][0]:
                best[dist] = (version_key(version), w)
    site.mkdir(parents=True, exist_ok=True)
    for _, w in best.values():
        with zipfile.ZipFile(w) as z:
            z.extractall(site)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    still = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    print(f"deps: {', '.join(missing)} missing; unpacked {len(best)} wheels into {site}: "
          f"{', '.join(sorted(w.name.split('-')[0] + ' ' + w.name.split('-')[1] for _, w in best.values()))}"
          + (f"; STILL MISSING {still}" if still else ""), flush=True)
    return 1 if still else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))

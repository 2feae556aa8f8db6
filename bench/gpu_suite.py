"""Train the SST-2 suite of heads on a device, and evaluate each saved head on states made by the
CPU and by that device (issue 16: "the whole SST-2 suite of heads trained on GPU"; saved heads do not
depend on the device that made their states).

  python bench/gpu_suite.py --device cuda --methods probe,space,selfexplain,ytuning --out OUT.jsonl

Each method: `frozentune train --method M --data sst2 --device D` (the device's default precision),
then `frozentune eval` of the saved model with each --eval pair (device:precision), each in a fresh
cache folder (the cache key holds the precision, not the device, so a shared folder would hand the
CPU the GPU's states). One JSON line per method is appended to OUT as soon as it is done.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def cli(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frozentune.cli", *args], text=True,
                          capture_output=capture)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--methods", default="probe,space,selfexplain,ytuning")
    ap.add_argument("--evals", default="cpu:fp32,cuda:bf16", help="device:precision pairs to evaluate on")
    ap.add_argument("--runs", type=Path, default=Path("/tmp/gpu-runs"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--extra", default="", help="more train options, space-separated (e.g. --max-train 200)")
    a = ap.parse_args()
    for m in a.methods.split(","):
        model = a.runs / m
        t0 = time.perf_counter()
        rc = cli("train", "--method", m, "--data", "sst2", "--device", a.device, "--output", str(model),
                 *a.extra.split()).returncode
        row = {"method": m, "device": a.device, "train_rc": rc, "wall_seconds": time.perf_counter() - t0}
        if rc == 0:
            r = json.loads((model / "result.json").read_text())
            row.update({k: r.get(k) for k in ("metrics", "precision", "extract_seconds", "train_seconds",
                                                "best_epoch", "trainable_params", "config")})
            row["epochs"] = len(r.get("history") or [])
            row["evals"] = []
            for pair in a.evals.split(","):
                device, precision = pair.split(":")
                p = cli("eval", "--model", str(model), "--data", "sst2", "--device", device, "--precision", precision,
                        "--cache-dir", f"/tmp/ft-eval-{device}-{precision}", capture=True)
                e = {"device": device, "precision": precision, "rc": p.returncode}
                e.update(json.loads(p.stdout) if p.returncode == 0 else {"stderr": p.stderr[-600:]})
                row["evals"].append(e)
                print(f"{m} eval on {device} {precision}: {e.get('metrics', e.get('stderr'))}", flush=True)
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

"""How each frozen head's cost grows with the number of labels: trainable weights and the time of one
training step (forward, loss, backward, AdamW) on random states, at 50, 200 and 1,000 labels.

The states are random (B, T, D) tensors: the backbone's pass does not depend on the labels, so the head's own
step is what grows. D is 32 by default (the test suite's tiny BERT); --dim 384 is MiniLM's width. Each cell:
one warm-up step, then the median of --repeats steps, torch pinned to --threads threads.

  OMP_NUM_THREADS=1 python bench/many_labels.py --threads 1
  OMP_NUM_THREADS=1 python bench/many_labels.py --threads 1 --dim 384 --labels 50,200

Writes bench/results/many_labels.json, or --out (a rerun replaces the records of its dim) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "many_labels.json"


def step_seconds(method: str, dim: int, labels: int, batch: int, tokens: int, repeats: int) -> tuple[int, float]:
    """(trainable weights, median seconds of one training step) of `method`'s head with its defaults."""
    import frozentune.heads  # noqa: F401  (registers the methods)
    from frozentune.head import Features
    from frozentune.registry import create_method

    torch.manual_seed(0)
    head, _ = create_method(method, dim, labels, {})
    opt = torch.optim.AdamW(head.parameters(), 1e-3)
    f = Features(torch.randn(batch, tokens, dim), torch.ones(batch, tokens, dtype=torch.bool))
    y = torch.randint(0, labels, (batch,))

    def step() -> float:
        t0 = time.perf_counter()
        loss = head.loss(head(f), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    step()
    return sum(p.numel() for p in head.parameters() if p.requires_grad), statistics.median(step() for _ in range(repeats))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="probe,space,ytuning,selfexplain")
    ap.add_argument("--labels", default="50,200,1000")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT, help="results file (a rerun replaces the records of its dim)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from frozentune.extract.device import cpu_summary

    rows = []
    for method in a.methods.split(","):
        for n in map(int, a.labels.split(",")):
            weights, seconds = step_seconds(method, a.dim, n, a.batch, a.tokens, a.repeats)
            rows.append({"method": method, "labels": n, "weights": weights, "step_s": round(seconds, 4)})
            print(f"{method:12s} {n:5d} labels  {weights:>12,} weights  {seconds:8.3f} s/step", flush=True)
    record = {"command": f"python bench/many_labels.py --threads {a.threads} --dim {a.dim} --labels {a.labels}",
              "dim": a.dim, "batch": a.batch, "tokens": a.tokens, "repeats": a.repeats, "cpu": cpu_summary(),
              "rows": rows}
    old = json.loads(a.out.read_text()) if a.out.is_file() else []
    a.out.write_text(json.dumps([r for r in old if r["dim"] != a.dim] + [record], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

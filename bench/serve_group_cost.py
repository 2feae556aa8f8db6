"""The compute bound on serve_load.py's "8 heads vs 1 head": the server's own batch call
(FrozenPass.run: padding, the shared pass, every head, each row's answer) for the 8-head group and
the 1-head group (probe-l4), in this process, interleaved, torch pinned to --threads; 16 texts a
batch, short (SST-2 test) and long (IMDB test, cut at 128 tokens), the texts serve_load.py sends.
The ratio of the two is the best "8 heads / 1 head" requests/s the server can reach when its
batches are full; HTTP, JSON and the client only add the same cost to both.

Two modes, side by side in one run: the default (each head's inference path: the self-explaining
head's spans made in chunks, Y-Tuning's cross-attention folded), and "training paths", the forward
as it ran before those (2026-11-25): every head run under torch.enable_grad() with no parameter
requiring a gradient, so it takes its autograd branches and records no graph.

  OMP_NUM_THREADS=1 python bench/serve_group_cost.py      # bench/results/serve_group_cost.json
Needs the heads serve_load.py trains (bench/runs/serve-models/heads).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from pathlib import Path

import torch

from serve_load import HEADS, MODELS, long_texts, short_texts
from span_packing import training_path

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def training_paths(engine):
    """Every head of the engine on its training path (span_packing.training_path)."""
    with contextlib.ExitStack() as stack:
        for t in engine.tasks.values():
            stack.enter_context(training_path(t.model.head))
        yield


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--batches", type=int, default=10, help="batches per text kind (drawn with seed 0)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "serve_group_cost.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from frozentune.extract import cpu_summary
    from frozentune.serve.engine import Engine

    heads = MODELS / "heads"
    eight = Engine.load([heads / n for n, _, _ in HEADS], log=lambda line: None)
    one = Engine.load([heads / HEADS[0][0]], log=lambda line: None)
    rng = random.Random(0)
    rows = []
    try:
        for kind, texts in (("short", short_texts()), ("long", long_texts())):
            draws = [rng.sample(texts, a.rows) for _ in range(a.batches)]
            plans = {n: [e.plan_classify(d)[0] for d in draws] for n, e in (("1 head", one), ("8 heads", eight))}
            groups = {"1 head": one.groups[0], "8 heads": eight.groups[0]}
            modes = {"training paths": lambda: training_paths(eight), "default": contextlib.nullcontext}
            best = {(m, n): float("inf") for m in modes for n in groups}
            for _ in range(a.repeats):  # the modes interleaved
                for m, mode in modes.items():
                    with mode():
                        for n, g in groups.items():
                            t0 = time.perf_counter()
                            for jobs in plans[n]:
                                g.run(jobs)
                            best[m, n] = min(best[m, n], (time.perf_counter() - t0) / a.batches)
            for m in modes:
                row = {"texts": kind, "heads": m, "one_head_ms": 1000 * best[m, "1 head"],
                       "eight_heads_ms": 1000 * best[m, "8 heads"],
                       "ratio_8_over_1_throughput": best[m, "1 head"] / best[m, "8 heads"]}
                rows.append(row)
                print(f"{kind:5s} heads' {m:14s}: batch of {a.rows}, 1 head {row['one_head_ms']:.1f} ms, "
                      f"8 heads {row['eight_heads_ms']:.1f} ms → 8/1 throughput {row['ratio_8_over_1_throughput']:.3f}",
                      flush=True)
    finally:
        eight.close()
        one.close()
    a.out.write_text(json.dumps({"command": f"OMP_NUM_THREADS={a.threads} python bench/serve_group_cost.py",
                                 "threads": a.threads, "cpu": cpu_summary(), "rows_per_batch": a.rows,
                                 "batches": a.batches, "repeats": a.repeats, "results": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

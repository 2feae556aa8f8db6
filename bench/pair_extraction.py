"""Pair extraction speed (issue 22): the frozen pass over sentence pairs against the same pairs
glued into single texts (about the same number of tokens: one [SEP] fewer), in one process,
alternating, several repeats; and the number of backbone calls of each (one pass per batch: a pair
is never run as two texts).

  OMP_NUM_THREADS=1 python bench/pair_extraction.py --n 2000 --repeats 3    # → results/pair_extraction.md

MiniLM in the CPU's default precision, SNLI test pairs (the first N), length-sorted batches as the
cache builds them (`iter_states`, max 8,192 tokens per batch).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    import numpy as np
    import torch

    from frozentune.api import BackboneOptions
    from frozentune.backbone import iter_states
    from frozentune.data import data_root
    from frozentune.pairs import glue

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [json.loads(x) for x in (data_root() / "snli" / "test.jsonl").read_text().splitlines()[:args.n]]
    pairs = [(r["premise"], r["hypothesis"]) for r in rows]
    opts = BackboneOptions()
    rt = opts.runtime()
    bb = opts.load(rt)
    inputs = {"pair": bb.tokenize(pairs), "glued": bb.tokenize([glue(p) for p in pairs])}
    calls = {"n": 0}
    bb.runner.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    times: dict[str, list[float]] = {k: [] for k in inputs}
    passes: dict[str, int] = {}
    for _ in range(1):  # warm-up of both
        for k, tok in inputs.items():
            for _ in iter_states(bb.runner, bb.tok, tok, bb.layers):
                pass
    for r in range(args.repeats):
        for k, tok in (inputs.items() if r % 2 == 0 else reversed(list(inputs.items()))):
            calls["n"] = 0
            t0 = time.perf_counter()
            for _ in iter_states(bb.runner, bb.tok, tok, bb.layers):
                pass
            times[k].append(time.perf_counter() - t0)
            passes[k] = calls["n"]
    tokens = {k: int(t.lengths.sum()) for k, t in inputs.items()}
    rate = {k: tokens[k] / float(np.median(times[k])) for k in inputs}
    out = {"command": " ".join(["OMP_NUM_THREADS=" + str(args.threads), "python"] + sys.argv), "n": args.n,
           "repeats": args.repeats, "threads": args.threads, "precision": bb.precision,
           "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "tokens": tokens, "seconds": times, "tokens_per_s": rate, "backbone_calls": passes,
           "ratio_pair_over_glued": rate["pair"] / rate["glued"]}
    (HERE / "results" / "pair_extraction.json").write_text(json.dumps(out, indent=1))
    md = (f"`{out['command']}` ({out['date']}, {out['machine']}, {args.threads} torch thread, {bb.precision}): "
          f"{args.n:,} SNLI test pairs, median of {args.repeats} alternating runs.\n\n"
          "| input | tokens | seconds (median) | tokens/s | backbone calls |\n|---|---|---|---|---|\n"
          + "".join(f"| {k} | {tokens[k]:,} | {np.median(times[k]):.2f} | {rate[k]:,.0f} | {passes[k]} |\n" for k in inputs)
          + f"\npair / glued tokens/s: **{out['ratio_pair_over_glued']:.3f}×**\n")
    (HERE / "results" / "pair_extraction.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

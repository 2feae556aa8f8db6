"""Throughput cost of --pad-multiple: the serving engine in this process (no HTTP), torch pinned
to 1 thread, one probe head on MiniLM (bench/runs/serve-models/heads/probe-l4, made by
serve_load.py), SST-2 test texts drawn with seed 0: 300 batches of 1 text and 60 of 16, each
set run 3 times interleaved at --pad-multiple 1 and 8; best of 3.

  python bench/serve_pad_cost.py
"""
import random, time, torch
torch.set_num_threads(1)
from frozentune.serve import Engine, ServeOptions
from serve_load import MODELS, short_texts
texts = short_texts()
h = MODELS / "heads" / "probe-l4"  # made by serve_load.py
engines = {m: Engine.load([h], options=ServeOptions(pad_multiple=m), log=lambda x: None) for m in (1, 8)}
rng = random.Random(0)
for rows in (1, 16):
    batches = [rng.sample(texts, rows) for _ in range(60 if rows == 16 else 300)]
    res = {1: [], 8: []}
    for rep in range(3):
        for m, e in engines.items():
            t = time.perf_counter()
            for b in batches: e.classify(b)
            res[m].append(time.perf_counter() - t)
    best = {m: min(v) for m, v in res.items()}
    print(f"rows {rows}: texts/s pad1 {len(batches)*rows/best[1]:.1f} pad8 {len(batches)*rows/best[8]:.1f} ratio pad8/pad1 {best[1]/best[8]:.3f}")
for e in engines.values(): e.close()

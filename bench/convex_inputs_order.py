"""The embeddings a solved head reads (crossval.convex_inputs), computed in row order against in
length order, side by side: `contrastive`'s final solve runs the live fp32 encoder over every
training row, and the rows of a chunk are padded to the chunk's longest.

  OMP_NUM_THREADS=1 python bench/convex_inputs_order.py --threads 1 --data sst2 --rows 4000 --repeats 2

Both orders run on the same model (MiniLM, contrastive's head, fp32, untrained) and rows (the first
--rows of the train file), alternating, --repeats times each; printed: seconds of each, their ratio,
and the largest difference between the two results (float32 rounding of other batch shapes only).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def row_order(model, src, chunk: int = 512):
    """convex_inputs as it was before: chunks of `chunk` rows in src's order."""
    import torch

    rows = np.arange(len(src))
    with torch.no_grad():
        return torch.cat([model.head.convex_inputs(model.features(src.batch(rows[i:i + chunk])))
                          for i in range(0, len(rows), chunk)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="sst2")
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    from frozentune import api
    from frozentune import model as M
    from frozentune.crossval import convex_inputs
    from frozentune.data import load_classification

    ds = load_classification(a.data, seed=0)
    train = ds.train.subset(np.arange(min(a.rows, len(ds.train))))
    bb = api.BackboneOptions(precision="fp32").load()
    model = M.build_classifier("contrastive", bb, list(ds.labels), None, seed=0).eval()
    src = M.LiveSource(bb.tokenize(train.texts), bb.pad_id())
    times = {"row order (before)": [], "length order (now)": []}
    for _ in range(a.repeats):
        for name, fn in (("row order (before)", row_order), ("length order (now)", convex_inputs)):
            t0 = time.perf_counter()
            x = fn(model, src)
            times[name].append(time.perf_counter() - t0)
            if name.startswith("row"):
                before = x
            else:
                now = x
    lengths = src.lengths
    print(f"{a.data}: {len(src)} rows, tokens per row mean {lengths.mean():.1f} max {lengths.max()}; "
          f"{torch.get_num_threads()} torch thread(s); {a.repeats} repeats, alternating")
    for name, t in times.items():
        print(f"  {name}: {' '.join(f'{v:.1f}' for v in t)} s")
    print(f"  ratio before / now (best of each): {min(times['row order (before)']) / min(times['length order (now)']):.2f}x")
    print(f"  largest |difference| of the embeddings: {(before - now).abs().max().item():.2e}")


if __name__ == "__main__":
    main()

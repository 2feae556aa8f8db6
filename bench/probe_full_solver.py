"""Issue 21: should the probe use the convex solver on full train sets too? Below --cv-below it is
solved exactly (L-BFGS on LogisticRegression's objective). On a full train set it is trained by
Adam with early stopping on the validation split. This fits scikit-learn's LogisticRegression on
the same mean-pooled states for each C of the probe's grid, picks C by the validation split (as the
run would have to), and prints test accuracy beside the C = 1 reference of bench/few_shot.py.

  OMP_NUM_THREADS=1 python bench/probe_full_solver.py --data trec,sst5,sst2 --seeds 0,1,2 > bench/results/probe_full_solver.txt
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="trec,sst5,sst2")
    ap.add_argument("--seeds", default="0,1,2", help="seeds of the validation split carved from train (as `train --seed`)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    from sklearn.linear_model import LogisticRegression

    from few_shot import pooled
    from frozentune import api
    from frozentune.crossval import C_GRID
    from frozentune.data import load_classification

    bb = api.BackboneOptions(layers="-1").load()
    sf = api.SourceFactory(bb, False, None, False, False)
    print(f"MiniLM layer -1 mean-pooled, {bb.precision} states, {a.threads} thread(s); LogisticRegression(C, max_iter=2000); "
          "test accuracy (validation accuracy)\n")
    print("| data | seed | " + " | ".join(f"C={c:g}" for c in C_GRID) + " | C by validation: test |")
    print("|---|---:|" + "---:|" * (len(C_GRID) + 1))
    for data in a.data.split(","):
        for seed in map(int, a.seeds.split(",")):
            ds = load_classification(data, seed=seed, carve_below=1000)
            x = {s: pooled(sf(getattr(ds, s)), len(getattr(ds, s))) for s in ("train", "validation", "test")}
            y = {s: ds.label_ids(getattr(ds, s)) for s in ("train", "validation", "test")}
            cells, val = [], []
            t0 = time.perf_counter()
            for c in C_GRID:
                clf = LogisticRegression(C=c, max_iter=2000).fit(x["train"], y["train"])
                v, t = (100 * float((clf.predict(x[s]) == y[s]).mean()) for s in ("validation", "test"))
                val.append((v, c == 1.0, t))  # ties on validation go to C = 1, the reference
                cells.append(f"{t:.2f} ({v:.2f})")
            best = max(val)
            print(f"| {data} | {seed} | " + " | ".join(cells) + f" | {best[2]:.2f} | ", flush=True)
            print(f"<!-- {data} seed {seed}: {time.perf_counter() - t0:.0f} s -->", file=sys.stderr)


if __name__ == "__main__":
    main()

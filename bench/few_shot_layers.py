"""One head trained with its defaults on several layer choices of MiniLM (one cache each), at K examples
per class, seeds in turn: test accuracy, and what the run's own cross-validation said (result.json's
selection: the regression's and the head's held-out accuracy, the fallback). One JSON line per run.

A question for issue 21: does another layer choice bring a head nearer SetFit at 16 per class, and
what does it do at other K? A layer choice is `L` or `L1,L2[:mean|:concat]` (several layers averaged,
the default, or concatenated); choices are separated by `;`.

    OMP_NUM_THREADS=1 python bench/few_shot_layers.py --data trec --method selfexplain --layers='-1;-2;-3;-4' \\
        --shots 16 --seeds 0,1,2 > bench/results/few_shot_layers_trec_se.jsonl
"""
import argparse
import json
import time

import torch

from frozentune import api
from frozentune.data import load_classification

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--data", default="trec")
ap.add_argument("--method", default="selfexplain")
ap.add_argument("--layers", default="-1;-3")
ap.add_argument("--shots", default="16", help="K per class, comma-separated")
ap.add_argument("--seeds", default="0,1,2")
a = ap.parse_args()
torch.set_num_threads(1)
bbs = {}
for data in a.data.split(","):
    for shots in map(int, a.shots.split(",")):
        for seed in map(int, a.seeds.split(",")):
            ds = load_classification(data, seed=seed, shots=shots, carve_below=1000)
            for layer in a.layers.split(";"):
                if layer not in bbs:
                    name, _, combine = layer.partition(":")
                    bbs[layer] = api.BackboneOptions(layers=name, combine=combine or "mean").load()
                t0 = time.perf_counter()
                r = api.train(a.method, ds, bbs[layer], train_cfg={"seed": seed}, progress=False, log=lambda s: None)
                sel = r["selection"]
                print(json.dumps({"data": data, "shots": shots, "method": a.method, "layer": layer, "seed": seed,
                                  "acc": r["metrics"]["accuracy"], "cv": sel.get("head_vs_regression") or sel.get("how"),
                                  "fallback": sel.get("fallback"), "s": round(time.perf_counter() - t0, 1)}), flush=True)

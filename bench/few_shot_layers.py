"""One head at 16 examples per class, trained with its defaults on each of several layers of MiniLM
(one cache per layer), seeds in turn: test accuracy, and what the run's own cross-validation said
(result.json's selection: the regression's and the head's held-out accuracy, the fallback).
A question for issue 21: would choosing the layer by the folds (what `frozentune sweep` can do)
bring the best head to SetFit's accuracy?

    OMP_NUM_THREADS=1 python bench/few_shot_layers.py trec selfexplain -1,-2,-3,-4 0,1,2 > bench/results/few_shot_layers_trec_se.jsonl
"""
import json
import sys
import time

import torch

from frozentune import api
from frozentune.data import load_classification

torch.set_num_threads(1)
data, method, layers, seeds = sys.argv[1], sys.argv[2], sys.argv[3].split(","), [int(s) for s in sys.argv[4].split(",")]
bbs = {}
for seed in seeds:
    ds = load_classification(data, seed=seed, shots=16, carve_below=1000)
    for layer in layers:
        if layer not in bbs:
            bbs[layer] = api.BackboneOptions(layers=layer).load()
        t0 = time.perf_counter()
        r = api.train(method, ds, bbs[layer], train_cfg={"seed": seed}, progress=False, log=lambda s: None)
        sel = r["selection"]
        print(json.dumps({"data": data, "method": method, "layer": layer, "seed": seed, "acc": r["metrics"]["accuracy"],
                          "cv": sel.get("head_vs_regression") or sel.get("how"), "fallback": sel.get("fallback"),
                          "s": round(time.perf_counter() - t0, 1)}), flush=True)

"""How the convex probe's L2 strength C should be chosen at few labels (issue 21): for SST-2,
TREC and SST-5 at 8 and 16 per class, seeds 0-2, the test accuracy of every C in C_GRID and the
C each selection rule picks from the same 5 folds.

  OMP_NUM_THREADS=1 python bench/probe_c_choice.py > bench/results/probe_c_choice.txt
"""
import numpy as np
import torch

from frozentune import api, crossval as CV, model as M
from frozentune.data import load_classification
from frozentune.train import scored

torch.set_num_threads(1)
bb = api.BackboneOptions().load()
rules = {"one-SE, smallest C": [], "best mean": [], "C=1 unless beaten by > 1 SE": [], "lowest loss": [], "C=1": []}
for data in ("sst2", "trec", "sst5"):
    for shots in (8, 16):
        for seed in (0, 1, 2):
            ds = load_classification(data, seed=seed, shots=shots, carve_below=1000)
            sf = api.SourceFactory(bb, False, None, False, False)
            tr, te = sf(ds.train), sf(ds.test)
            y, yte = ds.label_ids(ds.train), ds.label_ids(ds.test)
            test = []
            for c in CV.C_GRID:
                m = M.build_classifier("probe", bb, ds.labels)
                CV.fit_convex(m, tr, y, c)
                test.append(scored(m, te, yte)["accuracy"])
            k, _ = CV.choose_folds(y, 5, ds.labels)
            acc, loss = np.zeros((k, len(CV.C_GRID))), np.zeros((k, len(CV.C_GRID)))
            for i, (a, b) in enumerate(CV.folds(y, k, seed)):
                for j, c in enumerate(CV.C_GRID):
                    m = M.build_classifier("probe", bb, ds.labels)
                    CV.fit_convex(m, CV.Subset(tr, a), y[a], c)
                    s = scored(m, CV.Subset(tr, b), y[b])
                    acc[i, j], loss[i, j] = s["accuracy"], s["loss"]
            mean, ml = acc.mean(0), loss.mean(0)
            best = max(range(len(mean)), key=lambda j: (round(mean[j], 9), -ml[j]))
            se = acc[:, best].std(ddof=1) / np.sqrt(k)
            default = CV.C_GRID.index(1.0)
            picks = {"one-SE, smallest C": next(j for j in range(len(mean)) if mean[j] >= mean[best] - se - 1e-9),
                     "best mean": best, "C=1 unless beaten by > 1 SE": default if mean[default] >= mean[best] - se - 1e-9 else best,
                     "lowest loss": int(np.argmin(ml)), "C=1": default}
            for rule, j in picks.items():
                rules[rule].append(test[j])
            print(data, shots, seed, "test accuracy by C", [round(t, 1) for t in test],
                  "picks", {r: CV.C_GRID[j] for r, j in picks.items()}, flush=True)
print("mean test accuracy over the 18 samples, by rule:")
for rule, accs in rules.items():
    print(f"  {rule}: {np.mean(accs):.2f}")

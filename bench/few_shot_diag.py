"""Where a few-label head's cross-validated score and its test score part (SST-2, 8 per class):
the 5 folds' held-out accuracy at each checkpoint, each fold model's test accuracy, the step count
one_se picks, the fold models retrained to that count (held-out and test), and the refit on all of
train (train and test accuracy). MiniLM's last layer, the method's registered defaults, 1 thread.

  OMP_NUM_THREADS=1 python bench/few_shot_diag.py SEED [METHOD]     # METHOD: ytuning (default)

Output: bench/results/few_shot_diag_sst2_k8_s1.txt (seed 1, ytuning).
"""
import sys, dataclasses, numpy as np, torch
torch.set_num_threads(1)
from frozentune import api, model as M
from frozentune.data import load_classification
from frozentune.train import TrainConfig, Schedule, fit, plan_steps, scored, silent
from frozentune import crossval as CV
seed = int(sys.argv[1]); method = sys.argv[2] if len(sys.argv) > 2 else "ytuning"
ds = load_classification("sst2", seed=seed, shots=8, carve_below=1000)
bb = api.BackboneOptions(layers="-1").load()
sf = api.SourceFactory(bb, False, None, False, False)
src = {s: sf(getattr(ds, s)) for s in ("train", "test")}
y = {s: ds.label_ids(getattr(ds, s)) for s in ("train", "test")}
from frozentune.registry import get_method
spec = get_method(method)
cfg = TrainConfig(seed=seed, **spec.train_defaults)
build = lambda: M.build_classifier(method, bb, ds.labels, seed=seed)
plan = plan_steps(len(y["train"]), cfg, constant=True); plan = dataclasses.replace(plan, at=CV.checkpoints(plan.total))
print("plan", plan.total, plan.at, "batch", cfg.batch_size, "lr", cfg.lr)
accs = []
for i, (tr, held) in enumerate(CV.folds(y["train"], 5, seed)):
    m = build()
    r = fit(m, CV.Subset(src["train"], tr), y["train"][tr], CV.Subset(src["train"], held), y["train"][held], cfg, silent, plan, select=False)
    accs.append([h["val_accuracy"] for h in r.history])
    print("fold", i, "held", len(held), "acc by ckpt", [round(h["val_accuracy"]) for h in r.history], "final test", round(scored(m, src["test"], y["test"])["accuracy"], 1))
accs = np.array(accs); steps = list(plan.at)
pick = CV.one_se(accs, np.zeros(accs.shape[1])); chosen = steps[pick]
print("chosen", chosen, "mean", accs.mean(0).round(1))
for i, (tr, held) in enumerate(CV.folds(y["train"], 5, seed)):
    m = build()
    sch = Schedule(chosen, max(1, -(-chosen // 4)), plan.warmup, True, "x")
    fit(m, CV.Subset(src["train"], tr), y["train"][tr], None, None, cfg, silent, sch, select=False)
    print("fold model at chosen: held", round(scored(m, CV.Subset(src["train"], held), y["train"][held])["accuracy"]), "test", round(scored(m, src["test"], y["test"])["accuracy"], 1))
m = build()
sch = Schedule(chosen, max(1, -(-chosen // 4)), plan.warmup, True, "x")
fit(m, src["train"], y["train"], None, None, cfg, silent, sch, select=False)
print("refit: train", round(scored(m, src["train"], y["train"])["accuracy"]), "test", round(scored(m, src["test"], y["test"])["accuracy"], 1))

"""How the few-label fallback chooses between a head and the logistic regression, scored offline.

For each run (a head, a dataset, K examples per class, a seed) this records what the folds saw:
the (k, 1 + R) held-out accuracies and the mean held-out cross-entropies of the regression
(column 0) and of the head's R checkpoints; the test accuracy of the head refit on all of train
(the fallback forced off); and the test accuracy of the regression, LogisticRegression(C=1) solved
to its optimum on the head's layer (what the fallback saves, within 0-1 test predictions,
bench/solver_check.py). Training is deterministic, so any rule that reads only the folds can then
be scored without training again: the run's result under a rule is the regression's test accuracy
where the rule keeps it and the head's otherwise.

  OMP_NUM_THREADS=1 python bench/fallback_rules.py --methods ytuning,selfexplain,space --seeds 5,6,7 --out bench/results/fallback_rules.jsonl
  OMP_NUM_THREADS=1 python bench/fallback_rules.py --score dev ...   # head_test / lr_test on development rows instead
  python bench/fallback_rules.py --report --out bench/results/fallback_rules.jsonl [more.jsonl ...]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

def margin(m: float):
    """keep_regression's accuracy rule with m standard errors instead of one: the regression is kept unless
    the head's optimism-corrected held-out accuracy beats it by more than m of them."""
    return lambda a, lr_loss, pick_loss, min_loss: a["regression"] >= a["head_corrected"] - m * a["se"] - 1e-9


# each rule reads the folds only: a (keep_regression's numbers, recorded at one standard error: regression,
# head_corrected, se, keep), the regression's mean held-out cross-entropy, the head's at the refit's checkpoint
# and its lowest
RULES = {
    "head always": lambda a, lr_loss, pick_loss, min_loss: False,
    "accuracy, 1 standard error (the default, but for space)": lambda a, lr_loss, pick_loss, min_loss: a["keep"],
    "cross-entropy at the refit's step": lambda a, lr_loss, pick_loss, min_loss: lr_loss <= pick_loss,
    "accuracy, or cross-entropy at the refit's step": lambda a, lr_loss, pick_loss, min_loss: a["keep"] or lr_loss <= pick_loss,
    "accuracy, or the head's lowest cross-entropy": lambda a, lr_loss, pick_loss, min_loss: a["keep"] or lr_loss <= min_loss,
    "accuracy, 1.5 standard errors": margin(1.5),
    "accuracy, 2 standard errors": margin(2.0),
    "accuracy, 3 standard errors": margin(3.0),
    "regression always": lambda a, lr_loss, pick_loss, min_loss: True,
}


def study(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(a.threads)
    import frozentune.crossval as cv
    from few_shot import LAYER_OF, dev_rows, logistic, pooled
    from frozentune import api
    from frozentune.data import load_classification

    seen: dict = {}
    decide = cv.keep_regression

    def record(acc, mean_loss, k=None, _margin=1.0):  # what the folds saw, and the head kept whatever they say
        r = decide(acc, mean_loss, k)  # at one standard error, whatever the head's: RULES set their own margins
        seen.update(acc=acc.tolist(), mean_loss=np.asarray(mean_loss).tolist(), k=k, acc_rule=r)
        return {**r, "keep": False}

    cv.keep_regression = record
    backbones: dict = {}
    for method in a.methods.split(","):
        layer = LAYER_OF.get(method, "-1")
        if layer not in backbones:
            backbones[layer] = api.BackboneOptions(layers=layer).load()
        bb = backbones[layer]
        for data in a.data.split(","):
            for k in map(int, a.shots.split(",")):
                for seed in map(int, a.seeds.split(",")):
                    ds = load_classification(data, seed=seed, shots=k, carve_below=1000)
                    if a.score == "dev":  # scored on development rows in place of test: never test
                        ds = dataclasses.replace(ds, test=dev_rows(data, ds, seed))
                    sf = api.SourceFactory(bb, False, None, False, False)
                    x = {s: pooled(sf(getattr(ds, s)), len(getattr(ds, s))) for s in ("train", "test")}
                    y = {s: ds.label_ids(getattr(ds, s)) for s in ("train", "test")}
                    lr_test, _ = logistic(x["train"], y["train"], x["test"], y["test"], converged=True)
                    seen.clear()
                    t0 = time.perf_counter()
                    r = api.train(method, ds, bb, train_cfg={"seed": seed}, progress=False, log=lambda s: None)
                    row = {"method": method, "data": data, "shots": k, "seed": seed, "scored_on": a.score,
                           "head_test": r["metrics"]["accuracy"], "lr_test": lr_test,
                           "chosen_steps": r["selection"].get("chosen_steps"),
                           "seconds": time.perf_counter() - t0, **seen}
                    with a.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(method, data, k, seed, round(row["head_test"], 1), round(lr_test, 1), flush=True)


def decisions(r: dict) -> dict[str, bool]:
    """Rule name → whether it keeps the regression in run r (True) or the head (False)."""
    from frozentune.crossval import one_se

    acc, loss = np.asarray(r["acc"]), np.asarray(r["mean_loss"])
    pick = one_se(acc[:, 1:], loss[1:], k=r["k"])  # the checkpoint the head is refit to
    return {name: bool(rule(r["acc_rule"], loss[0], loss[1 + pick], loss[1:].min()))
            for name, rule in RULES.items()}


def report(rows: list[dict]) -> str:
    rows = [{**r, "keeps": decisions(r)} for r in rows]  # every rule's choice, once per run
    cells: dict = collections.defaultdict(list)
    for r in rows:
        cells[(r["method"], r["data"], r["shots"])].append(r)
    names = list(RULES)
    lines = ["| head | data | K/class | runs | regression | " + " | ".join(names) + " |",
             "|---|---|---:|---:|---:|" + "---:|" * len(names)]
    gaps: dict = collections.defaultdict(list)
    by_head: dict = collections.defaultdict(list)  # (head, rule) → its cells' gaps
    order = {m: i for i, m in enumerate(("ytuning", "selfexplain", "space"))}
    for (method, data, k), rs in sorted(cells.items(), key=lambda c: (order.get(c[0][0], 9), c[0][0], c[0][1], c[0][2])):
        lr = float(np.mean([r["lr_test"] for r in rs]))
        out = []
        for name in names:
            v = float(np.mean([r["lr_test"] if r["keeps"][name] else r["head_test"] for r in rs]))
            gaps[name].append(v - lr)
            by_head[(method, name)].append(v - lr)
            out.append(f"{v:.1f}")
        lines.append(f"| {method} | {data} | {k} | {len(rs)} | {lr:.1f} | " + " | ".join(out) + " |")
    lines += ["", "| rule | cells at or above the regression | worst gap | mean gap | runs that keep the regression |",
              "|---|---:|---:|---:|---:|"]
    for name in names:
        g = np.asarray(gaps[name])
        kept = sum(r["keeps"][name] for r in rows)
        lines.append(f"| {name} | {int((g >= -1e-9).sum())} of {len(g)} | {g.min():+.1f} | {g.mean():+.2f} | {kept} of {len(rows)} |")
    lines += ["", "Per head (mean gap over its cells; cells at or above the regression; worst gap):", "",
              "| rule | " + " | ".join(h for h in order if any(m == h for m, _ in by_head)) + " |",
              "|---|" + "---:|" * sum(any(m == h for m, _ in by_head) for h in order)]
    for name in names:
        cells_ = [np.asarray(by_head[(h, name)]) for h in order if (h, name) in by_head]
        lines.append(f"| {name} | " + " | ".join(f"{g.mean():+.2f} ({int((g >= -1e-9).sum())} of {len(g)}; {g.min():+.1f})"
                                                 for g in cells_) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="ytuning,selfexplain,space")
    ap.add_argument("--data", default="sst2,sst5,trec")
    ap.add_argument("--shots", default="8,16,32,64")
    ap.add_argument("--seeds", default="5,6,7")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--score", choices=("test", "dev"), default="test",
                    help="what head_test and lr_test are scored on: the test split, or development rows (few_shot.dev_rows: "
                         "neither test nor the sample) for choosing a rule without test")
    ap.add_argument("--out", type=Path, nargs="+", default=[HERE / "results" / "fallback_rules.jsonl"])
    ap.add_argument("--report", action="store_true", help="score every rule on the recorded runs (all --out files)")
    a = ap.parse_args()
    if a.report:
        rows: dict = {}
        for f in a.out:  # a run recorded twice (two processes over the same grid) counts once
            for line in f.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    rows.setdefault((r["method"], r["data"], r["shots"], r["seed"]), r)
        print(report(list(rows.values())))
        return
    a.out = a.out[0]
    study(a)


if __name__ == "__main__":
    main()

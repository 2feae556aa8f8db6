"""Few labels (issue 21): every frozen head with its defaults against scikit-learn's
LogisticRegression on the same frozen states, K examples per class, several seeds, same run.

  OMP_NUM_THREADS=1 python bench/few_shot.py --threads 1            # all cells (resumes: done cells are kept)
  python bench/few_shot.py --report                                 # the table from results/few_shot.json

For each dataset, K and seed: `load_classification(data, shots=K, seed=seed)` draws the sample
(`frozentune train --shots K --seed seed` draws the same); each head is trained by `api.train`
on it exactly as the CLI does (its defaults: cross-validation below 1,000 examples), and scored on
the test split. Beside it, on the same sample: `LogisticRegression()` (scikit-learn defaults,
max_iter raised to 1000 so that it converges) on the mean-pooled states of the last layer and of
the layer each head reads (space: -3); `--methods contrastive` adds the method that tunes the
encoder with SetFit's pair loss (its own fp32 copy of MiniLM each run); with --converged also the same model solved to its optimum
(logreg*). All states come from one cache per dataset and layer,
built in the default precision of this CPU.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
METHODS = ("probe", "space", "ytuning", "selfexplain")
# methods that train the encoder (run live, fp32): each run loads its own copy of the backbone, since
# training changes it; not run unless named in --methods
LIVE = ("contrastive",)
LAYER_OF = {"space": "-3"}  # the heads' registered defaults; the others read the last layer


def pooled(src, rows_n: int) -> np.ndarray:
    """(N, D) mean over real tokens of a cached source's states (the probe's pooling)."""
    from frozentune.head import masked_mean

    out = []
    for s in range(0, rows_n, 256):
        b = src.batch(np.arange(s, min(s + 256, rows_n)))
        out.append(masked_mean(b.hidden.float(), b.mask).numpy())
    return np.concatenate(out)


def dev_rows(data: str, ds, seed: int):
    """Development rows for a K-shot sample `ds`: neither test nor the sample. SST-5's validation file; for
    SST-2 and TREC the validation carve of the whole train file (seeded as the run), less the sample's texts."""
    from frozentune.data import TextSplit, load_classification

    d = load_classification(data, seed=seed).validation
    train_texts = set(ds.train.texts)
    keep = [i for i, t in enumerate(d.texts) if t not in train_texts]
    return TextSplit([d.texts[i] for i in keep], [d.labels[i] for i in keep], f"dev:{data}", [d.lines[i] for i in keep])


def logistic(xtr, ytr, xte, yte, converged: bool = False) -> tuple[float, float]:
    """Test accuracy and fit seconds of LogisticRegression() (max_iter 1000) on the pooled states;
    converged: the same model solved to tol 1e-10 in float64 (scikit-learn's default tol 1e-4 stops
    1e-6 to 1e-5 above the optimum here, which moves 1-7 test predictions; bench/solver_check.py)."""
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    if converged:
        clf = LogisticRegression(max_iter=100_000, tol=1e-10).fit(np.asarray(xtr, np.float64), ytr)
        return 100.0 * float((clf.predict(np.asarray(xte, np.float64)) == yte).mean()), time.perf_counter() - t0
    clf = LogisticRegression(max_iter=1000).fit(xtr, ytr)
    return 100.0 * float((clf.predict(xte) == yte).mean()), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="sst2,trec,sst5")
    ap.add_argument("--shots", default="8,16,32,64", help="K per class; 'full' for the whole train set")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "few_shot.json")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--converged", action="store_true",
                    help="add logreg*@L rows: LogisticRegression solved to tol 1e-10 (the exact optimum of the same "
                         "model) beside scikit-learn's default tolerance")
    ap.add_argument("--references-only", action="store_true", help="the logistic regressions only, no head trained")
    ap.add_argument("--cv-repeats", type=int, default=1, help="train --cv-repeats for every head (repeated k-fold)")
    ap.add_argument("--merge", type=Path, nargs="*", default=[HERE / "results" / "few_shot_s34a.json",
                                                             HERE / "results" / "few_shot_s34b.json",
                                                             HERE / "results" / "few_shot_probe.json",
                                                             HERE / "results" / "setfit_peer.json"],
                    help="with --report: more result files (a rerun of some cells, SetFit) whose rows join the "
                         "table; a cell in a later file replaces the same cell of an earlier one")
    a = ap.parse_args()
    if a.report:
        d = json.loads(a.out.read_text())
        for extra in a.merge:
            if extra.exists():
                more = json.loads(extra.read_text())
                key = lambda r: (r["data"], r["shots"], r["seed"], r["method"])  # noqa: E731
                again = {key(r) for r in more["rows"]}
                d["rows"] = [r for r in d["rows"] if key(r) not in again] + more["rows"]
                d.setdefault("merged", []).append(more["command"])
        print(report(d))
        return
    import torch

    torch.set_num_threads(a.threads)
    from frozentune import api
    from frozentune.data import load_classification
    from frozentune.extract.device import cpu_summary

    done = json.loads(a.out.read_text()) if a.out.exists() else {
        "command": "bench/few_shot.py " + " ".join(sys.argv[1:]), "threads": a.threads, "cpu": cpu_summary(),
        "machine": platform.machine(), "torch": torch.__version__, "rows": []}
    have = {(r["data"], r["shots"], r["seed"], r["method"]) for r in done["rows"]}
    backbones: dict[str, object] = {}

    def backbone(layer: str):
        if layer not in backbones:
            backbones[layer] = api.BackboneOptions(layers=layer).load()
        return backbones[layer]

    def save(row: dict) -> None:
        done["rows"].append(row)
        a.out.write_text(json.dumps(done, indent=1))
        print(json.dumps(row), flush=True)

    for data in a.data.split(","):
        for shots in a.shots.split(","):
            k = None if shots == "full" else int(shots)
            for seed in map(int, a.seeds.split(",")):
                ds = load_classification(data, seed=seed, shots=k, carve_below=1000)
                y = {s: ds.label_ids(getattr(ds, s)) for s in ("train", "test")}
                for layer in sorted({"-1", *(LAYER_OF.get(m, "-1") for m in a.methods.split(","))}):
                    names = {c: f"logreg{'*' if c else ''}@{layer}" for c in ((False, True) if a.converged else (False,))}
                    todo = [c for c, name in names.items() if (data, shots, seed, name) not in have]
                    if not todo:
                        continue
                    sf = api.SourceFactory(backbone(layer), False, None, False, False)
                    x = {s: pooled(sf(getattr(ds, s)), len(getattr(ds, s))) for s in ("train", "test")}  # once per layer
                    for converged in todo:
                        name = names[converged]
                        acc, secs = logistic(x["train"], y["train"], x["test"], y["test"], converged)
                        save({"data": data, "shots": shots, "seed": seed, "method": name, "n_train": len(ds.train),
                              "accuracy": acc, "seconds": secs})
                for method in [] if a.references_only else a.methods.split(","):
                    if (data, shots, seed, method) in have:
                        continue
                    t0 = time.perf_counter()
                    bb = api.BackboneOptions() if method in LIVE else backbone(LAYER_OF.get(method, "-1"))
                    r = api.train(method, ds, bb,
                                  train_cfg={"seed": seed, **({"cv_repeats": a.cv_repeats} if a.cv_repeats > 1 else {})},
                                  progress=False, log=lambda s: None)
                    save({"data": data, "shots": shots, "seed": seed, "method": method, "n_train": len(ds.train),
                          "accuracy": r["metrics"]["accuracy"], "seconds": time.perf_counter() - t0,
                          "train_seconds": r["train_seconds"], "selection": {
                              k_: v for k_, v in r["selection"].items()
                              if k_ in ("how", "folds", "repeats", "chosen_steps", "fallback", "regression_accuracy",
                                        "head_vs_regression")}})


def report(d: dict) -> str:
    rows = d["rows"]
    methods = [m for m in (*METHODS, *LIVE, "logreg@-1", "logreg@-3", "logreg*@-1", "logreg*@-3", "setfit")
               if any(r["method"] == m for r in rows)]
    lines = [f"`{d['command']}`" + "".join(f" + `{c}`" for c in d.get("merged", [])) + f" — {d['threads']} thread(s), "
             f"{d['cpu']}; test accuracy, mean ± std over seeds (n seeds); logreg@L: LogisticRegression on layer L "
             "mean-pooled; logreg*@L: the same solved to tol 1e-10 (its exact optimum); last row of each dataset: mean seconds per run (fit + test scoring; logreg: fit only)", "",
             "| data | K/class | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for data in dict.fromkeys(r["data"] for r in rows):
        for shots in dict.fromkeys(r["shots"] for r in rows if r["data"] == data):
            cells = []
            for m in methods:
                acc = [r["accuracy"] for r in rows if (r["data"], r["shots"], r["method"]) == (data, shots, m)]
                cells.append(f"{np.mean(acc):.1f} ± {np.std(acc):.1f} ({len(acc)})" if acc else "")
            lines.append(f"| {data} | {shots} | " + " | ".join(cells) + " |")
        secs = [np.mean([r["seconds"] for r in rows if (r["data"], r["method"]) == (data, m)] or [np.nan]) for m in methods]
        lines.append(f"| {data} | seconds | " + " | ".join(f"{s:.1f}" for s in secs) + " |")
    lines += ["", "Goal check (mean over seeds; a cell counts where both sides exist):"]
    mean = {}
    for r in rows:
        mean.setdefault((r["data"], r["shots"], r["method"]), []).append(r["accuracy"])
    for m in (*METHODS, *LIVE):
        own = LAYER_OF.get(m, "-1")
        for ref in dict.fromkeys(("logreg@-1", f"logreg@{own}", "logreg*@-1", f"logreg*@{own}")):
            gaps = [np.mean(mean[(d_, k, m)]) - np.mean(mean[(d_, k, ref)]) for (d_, k, mm) in mean
                    if mm == m and (d_, k, ref) in mean]
            if gaps:
                lines.append(f"- {m} vs {ref}: at or above in {sum(g >= 0 for g in gaps)} of {len(gaps)} cells; "
                             f"gap from {min(gaps):+.1f} to {max(gaps):+.1f} points")
    kept = [(r["data"], r["method"]) for r in rows if r["method"] in METHODS[1:] and "selection" in r
            and (r["selection"].get("fallback") or r["selection"].get("chosen_steps") == 0)]
    if any("selection" in r for r in rows if r["method"] in METHODS[1:] and r["shots"] != "full"):
        heads = [m for m in METHODS[1:] if any(r["method"] == m for r in rows)]
        lines += ["", "Runs where the folds kept the logistic regression (of the runs in the table):", "",
                  "| data | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
        for data in dict.fromkeys(r["data"] for r in rows):
            n = {m: sum(1 for r in rows if (r["data"], r["method"]) == (data, m) and r["shots"] != "full") for m in heads}
            if not any(n.values()):  # this dataset's runs were all on the full train set: no folds, no choice
                continue
            lines.append(f"| {data} | " + " | ".join(f"{kept.count((data, m))} of {n[m]}" for m in heads) + " |")
    return "\n".join(lines + paired(rows))


def paired(rows: list[dict]) -> list[str]:
    """Each frozen head against the regression on its own layer, sample by sample: the head and the regression
    of one (data, K, seed) read the same states, so their difference varies far less than either's accuracy.
    Mean ± standard error over the samples, how many runs kept the head (the folds did not fall back), and the
    mean difference in those runs (elsewhere it is the solver's tolerance: the regression solved to its optimum,
    logreg*, where the run has it)."""
    acc = {(r["data"], r["shots"], r["seed"], r["method"]): r for r in rows}
    out = ["", "Paired: each head less the regression on its own layer, on the same samples "
           "(mean ± standard error over samples; kept: runs whose folds kept the head):", "",
           "| data | K/class | method | against | samples | head − regression | kept | mean difference where kept |",
           "|---|---|---|---|---:|---:|---:|---:|"]
    cells = dict.fromkeys((r["data"], r["shots"], r["method"]) for r in rows if r["method"] in METHODS)
    for data, shots, m in cells:
        layer = LAYER_OF.get(m, "-1")
        seeds = [s for (d_, k, s, mm) in acc if (d_, k, mm) == (data, shots, m)]
        ref = next((f for f in (f"logreg*@{layer}", f"logreg@{layer}") if any((data, shots, s, f) in acc for s in seeds)),
                   None)
        pairs = [(acc[(data, shots, s, m)], acc[(data, shots, s, ref)]["accuracy"]) for s in seeds
                 if (data, shots, s, ref) in acc]
        if len(pairs) < 2:
            continue
        diff = np.array([r["accuracy"] - lr for r, lr in pairs])
        kept = [r["accuracy"] - lr for r, lr in pairs if "fallback" in r.get("selection", {})
                and not r["selection"]["fallback"]]
        out.append(f"| {data} | {shots} | {m} | {ref} | {len(diff)} | {diff.mean():+.2f} ± {diff.std(ddof=1) / np.sqrt(len(diff)):.2f} "
                   f"| {len(kept) if m != 'probe' else '–'} | {f'{np.mean(kept):+.2f}' if kept else ''} |")
    return out


if __name__ == "__main__":
    main()

"""Accuracy of every cached method on states of each precision (issue 16).

For each dataset and frozen-head method: train on fp32 states and save; evaluate that saved model
on states of every precision without retraining; then train again on states of each reduced
precision (the head's own seed and settings unchanged) and score it on the same precision.

  python bench/precision_accuracy.py --threads 1 --out bench/results/precision_accuracy.json
  python bench/precision_accuracy.py --report          # only print the markdown table

SST-2 trains on a seeded, stratified 10,000-example sample of its train file (--max-train 10000)
to keep the run within the session; TREC and SST-5 on their whole train files. The cache entries
are of whole split files, so each precision extracts SST-2's whole train file once.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = {"sst2": 10_000, "trec": None, "sst5": None}
METHODS = ("probe", "space", "ytuning", "selfexplain")
EVAL = ("fp32", "bf16", "fp16", "int8")
RETRAIN = ("bf16", "int8")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "precision_accuracy.json")
    ap.add_argument("--runs", type=Path, default=HERE / "runs" / "precision")
    ap.add_argument("--data", default=",".join(DATA))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--eval", default=",".join(EVAL), help="precisions to score the fp32-trained model on")
    ap.add_argument("--retrain", default=",".join(RETRAIN), help="precisions to train on again")
    ap.add_argument("--seeds", default="0", help="training seeds (each also draws its own SST-2 sample); the "
                    "saved fp32 model of every seed is retrained on --retrain precisions with that seed")
    ap.add_argument("--base", action=argparse.BooleanOptionalAction, default=True,
                    help="train (and save) the fp32 model of each seed; --no-base retrains only, so that another "
                         "process can train the fp32 side at the same time")
    ap.add_argument("--merge", type=Path, nargs="*", default=[], help="with --report: more result files' rows")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    if a.report:
        result = json.loads(a.out.read_text())
        for extra in a.merge:
            result["rows"] += json.loads(extra.read_text())["rows"]
        print(table(result))
        if len({r.get("seed", 0) for r in result["rows"]}) > 1:
            print("\n" + seed_table(result))
        return

    import torch

    torch.set_num_threads(a.threads)
    from frozentune import api
    from frozentune.extract import cpu_features

    rows = json.loads(a.out.read_text())["rows"] if a.out.exists() else []
    done = {(r["data"], r["method"], r["kind"], r["precision"], r.get("seed", 0)) for r in rows}
    quiet = lambda s: None  # noqa: E731
    cache = a.runs / "cache"

    def save() -> None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"command": " ".join(sys.argv), "threads": a.threads,
                                     "cpu": {k: v for k, v in cpu_features().items()},
                                     "machine": platform.processor() or platform.machine(),
                                     "torch": torch.__version__, "rows": rows}, indent=1))

    for seed, data, method in ((int(s), d, m) for s in a.seeds.split(",") for d in a.data.split(",")
                               for m in a.methods.split(",")):
        base = a.runs / (f"{method}-{data}-fp32" + (f"-s{seed}" if seed else ""))

        def train(precision: str, output: Path | None) -> dict:
            t0 = time.perf_counter()
            r = api.train(method, data, api.BackboneOptions(device="cpu", precision=precision), output=output,
                          train_cfg={"seed": seed}, max_train=DATA[data], cache_root=cache, progress=False,
                          log=quiet, overwrite=True)
            return {"seed": seed, "accuracy": r["metrics"]["accuracy"], "macro_f1": r["metrics"]["macro_f1"],
                    "seconds": time.perf_counter() - t0}

        if a.base and ((data, method, "train", "fp32", seed) not in done or not (base / "config.json").exists()):
            rows.append({"data": data, "method": method, "kind": "train", "precision": "fp32",
                         **train("fp32", base)})
            done.add((data, method, "train", "fp32", seed))
            save()
            print(f"{data} {method} seed {seed} train fp32: {rows[-1]['accuracy']:.2f}", flush=True)
        for p in filter(None, a.eval.split(",")):
            if (data, method, "eval", p, seed) in done:
                continue
            t0 = time.perf_counter()
            m = api.evaluate_model(base, data, cache_root=cache, progress=False, device="cpu", precision=p,
                                   log=quiet)
            rows.append({"data": data, "method": method, "kind": "eval", "precision": p, "seed": seed,
                         "accuracy": m["metrics"]["accuracy"], "macro_f1": m["metrics"]["macro_f1"],
                         "seconds": time.perf_counter() - t0})
            done.add((data, method, "eval", p, seed))
            save()
            print(f"{data} {method} eval {p}: {rows[-1]['accuracy']:.2f}", flush=True)
        for p in filter(None, a.retrain.split(",")):
            if (data, method, "train", p, seed) in done:
                continue
            rows.append({"data": data, "method": method, "kind": "train", "precision": p, **train(p, None)})
            done.add((data, method, "train", p, seed))
            save()
            print(f"{data} {method} seed {seed} train {p}: {rows[-1]['accuracy']:.2f}", flush=True)
    save()
    print(table(json.loads(a.out.read_text())))


def table(result: dict) -> str:
    """Markdown: one row per (data, method); columns: fp32 accuracy, then each precision's
    difference from it, evaluated (trained on fp32) and retrained."""
    rows = [r for r in result["rows"] if r.get("seed", 0) == 0]
    get = {(r["data"], r["method"], r["kind"], r["precision"]): r["accuracy"] for r in rows}
    evals = [p for p in EVAL if any(k[2:] == ("eval", p) for k in get)]
    trains = [p for p in RETRAIN if any(k[2:] == ("train", p) for k in get)]
    head = (["data", "method", "fp32 accuracy"] + [f"eval on {p} (Δ)" for p in evals if p != "fp32"]
            + [f"trained on {p} (Δ)" for p in trains])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    worst_eval = worst_train = 0.0
    for data in DATA:
        for method in METHODS:
            ref = get.get((data, method, "train", "fp32"))
            if ref is None:
                continue
            cells = [data, method, f"{ref:.2f}"]
            for p in evals:
                if p == "fp32":
                    continue
                v = get.get((data, method, "eval", p))
                cells.append("–" if v is None else f"{v:.2f} ({v - ref:+.2f})")
                if v is not None:
                    worst_eval = max(worst_eval, abs(v - ref))
            for p in trains:
                v = get.get((data, method, "train", p))
                cells.append("–" if v is None else f"{v:.2f} ({v - ref:+.2f})")
                if v is not None:
                    worst_train = max(worst_train, abs(v - ref))
            out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append(f"largest |Δ|: evaluated without retraining {worst_eval:.2f} points (goal ≤ 0.5); "
               f"retrained {worst_train:.2f} points (goal ≤ 0.3)")
    return "\n".join(out)


def seed_table(result: dict) -> str:
    """Markdown: retraining on each reduced precision, paired by seed. Per (data, method): the fp32
    accuracy over seeds (mean ± std: what another seed alone moves it), then per precision each
    seed's Δ = acc(p, seed) − acc(fp32, seed) and their mean ± standard error."""
    import statistics as st

    get = {(r["data"], r["method"], r["precision"], r.get("seed", 0)): r["accuracy"]
           for r in result["rows"] if r["kind"] == "train"}
    seeds = sorted({k[3] for k in get})
    trains = [p for p in RETRAIN if len({k[3] for k in get if k[2] == p}) > 1]  # precisions retrained with 2+ seeds
    head = ["data", "method", f"fp32 over seeds {','.join(map(str, seeds))}"] + [f"trained on {p}: Δ per seed, mean ± SE"
                                                                                for p in trains]
    out = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    means = {p: [] for p in trains}
    for data in DATA:
        for method in METHODS:
            ref = {s: get[(data, method, "fp32", s)] for s in seeds if (data, method, "fp32", s) in get}
            if len(ref) < 2:
                continue
            cells = [data, method, f"{st.mean(ref.values()):.2f} ± {st.stdev(ref.values()):.2f} ({len(ref)})"]
            for p in trains:
                d = [get[(data, method, p, s)] - ref[s] for s in ref if (data, method, p, s) in get]
                if len(d) < 2:
                    cells.append("–")
                    continue
                se = st.stdev(d) / len(d) ** 0.5
                means[p].append(st.mean(d))
                cells.append(" / ".join(f"{x:+.2f}" for x in d) + f"; **{st.mean(d):+.2f} ± {se:.2f}**")
            out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for p, m in means.items():
        if m:
            within = sum(abs(x) <= 0.3 for x in m)
            out.append(f"trained on {p}: mean Δ within 0.3 points in {within} of {len(m)} cells; largest |mean Δ| "
                       f"{max(map(abs, m)):.2f}")
    return "\n".join(out)


if __name__ == "__main__":
    main()

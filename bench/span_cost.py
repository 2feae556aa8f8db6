"""What the span-width cap costs at IMDB length: one `selfexplain` training epoch per width on a
seeded, balanced 2,000-review IMDB slice at max_length 512, each in its own process (so its peak
RSS is its own), and a `probe` on the same cache as the memory floor. The cache is built first, so
no run's time or memory includes the extraction.

  python bench/span_cost.py                # the probe, then widths 3, 5, 10 and all (0)
  python bench/span_cost.py --runs probe   # redo one row; the others are kept

Writes bench/results/span-cost.json; `python bench/run.py --report` puts it in REPORT.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"


def imdb_slice(n: int, seed: int = 0) -> Path:
    """n reviews from IMDB train, half of each label, seeded; written once under bench/runs/."""
    from frozentune.data import resolve

    path = RUNS / f"imdb-slice-{n}.jsonl"
    if path.exists():
        return path
    _, files = resolve("imdb")
    rows = [json.loads(line) for line in open(files["train"], encoding="utf-8")]
    rng = random.Random(seed)
    picked = []
    for label in ("negative", "positive"):
        pool = [r for r in rows if r["label"] == label]
        picked += rng.sample(pool, n // 2)
    rng.shuffle(picked)
    RUNS.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in picked))
    return path


def train_once(name: str, data: Path, args: list[str]) -> dict:
    out = RUNS / name
    exe = str(Path(sys.executable).parent / "frozentune")
    cmd = [exe, "train", "--data", str(data), "--max-length", "512", "--epochs", "1", "--patience", "0",
           "--output", str(out), "--quiet", *args]
    print("==", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, text=True, capture_output=True)
    if proc.returncode != 0:
        return {"name": name, "args": args, "failed": proc.returncode, "stderr_tail": proc.stderr[-600:]}
    r = json.loads((out / "result.json").read_text())
    return {"name": name, "args": args, "epoch_seconds": r["history"][0]["epoch_seconds"],
            "peak_rss_mb": r["peak_rss_mb"], "train_examples": r["sizes"]["train"],
            "trainable_params": r["trainable_params"], "test_accuracy": r["metrics"]["accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--runs", default="probe,3,5,10,0",
                    help="probe and/or span widths (0 = all spans); rows already in the results file for "
                         "other runs are kept")
    a = ap.parse_args()
    data = imdb_slice(a.examples)
    exe = str(Path(sys.executable).parent / "frozentune")
    # build the cache first, so no run's time or memory includes the extraction
    subprocess.run([exe, "cache", str(data), "--max-length", "512", "--quiet"], check=True)
    bs = ["--batch-size", str(a.batch_size), "--eval-batch-size", str(a.batch_size)]
    path = HERE / "results" / "span-cost.json"
    old = {r["name"]: r for r in json.loads(path.read_text())["runs"]} if path.exists() else {}
    for run in a.runs.split(","):
        if run == "probe":
            old["span-cost-probe"] = train_once("span-cost-probe", data, ["--method", "probe", *bs])
        else:
            w = int(run)
            r = train_once(f"span-cost-w{w}", data, ["--method", "selfexplain", "--max-span-width", str(w), *bs])
            old[r["name"]] = {**r, "width": "all" if w == 0 else w}
    order = ["span-cost-probe"] + [f"span-cost-w{w}" for w in (1, 2, 3, 4, 5, 6, 8, 10, 16, 20, 0)]
    runs = sorted(old.values(), key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    import torch

    result = {"command": "python bench/span_cost.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M"),
              "threads": int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())),
              "examples": a.examples, "max_length": 512, "batch_size": a.batch_size, "runs": runs}
    path.write_text(json.dumps(result, indent=2))
    for r in runs:
        print(r)


if __name__ == "__main__":
    main()

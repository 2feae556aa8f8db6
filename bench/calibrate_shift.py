"""`frozentune calibrate` where the texts change: heads trained on SST-2 sentences (their temperature fitted on
SST-2's validation carve, `--calibrate auto`) answer IMDB reviews, and their probabilities are scored there before and
after `frozentune calibrate` on IMDB rows the test never sees.

    OMP_NUM_THREADS=1 python bench/calibrate_shift.py --out bench/results/calibrate_shift.json

The IMDB slice: --fit rows of IMDB's train file as its validation split (what calibrate fits on) and --test rows of
its test file as its test split, each drawn seeded from the whole file (the two files share no review). Every head
is `frozentune train --method M --data sst2 --max-train N --precision fp32 --seed S` (a validation split of 10% is
carved from the N, and chooses and calibrates), then `eval` on the IMDB test rows, `calibrate --split validation`
into a copy, and `eval` of the copy on the same rows. Accuracy cannot move (T > 0 keeps every argmax); the
cross-entropy and ECE of the test rows are the figures. One torch thread; the SST-2 states come from the cache.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]


def slice_rows(path: Path, n: int, seed: int) -> list[str]:
    lines = [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]  # (\u2028 is in texts)
    return random.Random(seed).sample(lines, n)


def scored(folder: Path, data: Path) -> dict:
    """The saved model's test figures on data's test split, read as `eval` reads it: accuracy, ECE (train.calibration,
    eval's) and the mean cross-entropy, with the temperature it holds."""
    from frozentune import api
    from frozentune.train import calibration, temperature_loss

    m = api._load(folder, None, None, lambda s: None)
    _, _, y, z = api._scored_split(m, folder, str(data), "test", (None, None, None), None, False, False,
                                   lambda s: None)
    pred = z.argmax(1)
    return {"accuracy": 100.0 * float((pred == y).mean()), "ece": calibration(y, pred, api.softmax_rows(z))["ece"],
            "nll": temperature_loss(z, y)(1.0), "temperature": m.temperature}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="probe,space,ytuning,selfexplain")
    ap.add_argument("--max-train", type=int, default=5000)
    ap.add_argument("--fit", type=int, default=1000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=None, help="the data root (default: FROZENTUNE_DATA)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import os

    import torch

    from frozentune import api
    from frozentune.calibrate import calibrate
    from run import machine

    torch.set_num_threads(1)
    root = a.data or Path(os.environ.get("FROZENTUNE_DATA", ROOT.parent / "shared" / "data"))
    work = Path(tempfile.mkdtemp(prefix="frozentune-calibrate-shift-"))
    imdb = work / "imdb-slice"
    imdb.mkdir()
    (imdb / "validation.jsonl").write_text("\n".join(slice_rows(root / "imdb" / "train.jsonl", a.fit, a.seed)) + "\n")
    (imdb / "test.jsonl").write_text("\n".join(slice_rows(root / "imdb" / "test.jsonl", a.test, a.seed)) + "\n")
    (imdb / "train.jsonl").write_text((imdb / "validation.jsonl").read_text())  # (a folder needs one; unused)
    rows = []
    for method in a.methods.split(","):
        t0 = time.perf_counter()
        folder = work / method
        r = api.train(method, "sst2", api.BackboneOptions(precision="fp32"), max_train=a.max_train,
                      train_cfg={"seed": a.seed}, output=folder, overwrite=True, progress=False, log=None)
        before = scored(folder, imdb)
        fitted = calibrate(folder, str(imdb), output=work / f"{method}-cal", log=None, progress=False)
        after = scored(work / f"{method}-cal", imdb)
        row = {"method": method, "model_method": r["model_method"], "sst2_temperature": r["temperature"],
               "sst2_test": {"accuracy": r["metrics"]["accuracy"], "ece": r["calibration"]["ece"]},
               "imdb_before": before, "calibrate": {k: v for k, v in fitted.items() if k not in ("model", "output")},
               "imdb_after": after, "seconds": time.perf_counter() - t0}
        rows.append(row)
        print(f"{method:12s} IMDB test: accuracy {before['accuracy']:.2f} -> {after['accuracy']:.2f}  ECE "
              f"{before['ece']:.2f} -> {after['ece']:.2f}  cross-entropy {before['nll']:.4f} -> {after['nll']:.4f}  "
              f"T {before['temperature']:.3f} (SST-2's) -> {after['temperature']:.3f} (IMDB's)", flush=True)
    command = "OMP_NUM_THREADS=1 python bench/calibrate_shift.py " + " ".join(sys.argv[1:])
    a.out.write_text(json.dumps({"command": command, "threads": 1, "machine": machine(), "fit": a.fit, "test": a.test,
                                 "max_train": a.max_train, "seed": a.seed, "rows": rows}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

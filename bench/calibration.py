"""How calibrated each head's probabilities are: train every frozen head on one dataset with its defaults and
print the test split's calibration (result.json's `calibration`: ten slices of the probability given each
prediction, their accuracy, and the expected calibration error) beside its accuracy.

    OMP_NUM_THREADS=1 python bench/calibration.py --data trec --out bench/results/calibration_trec.json

One seed (--seed), the backbone pass in fp32 (--precision), one torch thread; the states come from the feature
cache (built on the first run). Models are written under --work and removed unless --keep.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="trec")
    ap.add_argument("--methods", default="probe,space,ytuning,selfexplain")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()

    import torch

    from frozentune import api
    from run import machine  # bench/run.py: the machine description every result records

    torch.set_num_threads(1)
    work = a.work or Path(tempfile.mkdtemp(prefix="frozentune-calibration-"))
    rows = []
    for method in a.methods.split(","):
        r = api.train(method, a.data, api.BackboneOptions(precision=a.precision), train_cfg={"seed": a.seed},
                      output=work / method, overwrite=True, progress=False, log=None)
        cal = r["calibration"]
        rows.append({"method": method, "model_method": r["model_method"], "accuracy": r["metrics"]["accuracy"],
                     "ece": cal["ece"], "bins": cal["bins"]})
        print(f"{method:12s} accuracy {r['metrics']['accuracy']:6.2f}  ECE {cal['ece']:5.2f} points", flush=True)
    a.out.write_text(json.dumps({"data": a.data, "seed": a.seed, "precision": a.precision, "threads": 1,
                                 "machine": machine(), "rows": rows}, indent=2))
    if not a.keep and a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

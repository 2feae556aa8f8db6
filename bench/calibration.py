"""How calibrated each head's probabilities are: train every frozen head on one dataset with its defaults and
print the test split's calibration (result.json's `calibration`: ten slices of the probability given each
prediction, their accuracy, and the expected calibration error) beside its accuracy.

    OMP_NUM_THREADS=1 python bench/calibration.py --data trec --out bench/results/calibration_trec.json

Each head is trained with `--calibrate off`, so the ECE printed first is of the head's own scale. --temperature:
also what `--calibrate auto` gives (temperature scaling, Guo et al. 2017, "On Calibration of Modern Neural
Networks"): T fitted on the validation split's logits by the library's own train.fit_temperature, and the test
split's ECE and cross-entropy with the logits divided by it, beside the head's own. Accuracy is unchanged by it
(the argmax does not move).

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
    ap.add_argument("--temperature", action="store_true", help="also fit a temperature on validation (see above)")
    a = ap.parse_args()

    import torch

    from frozentune import api
    from run import machine  # bench/run.py: the machine description every result records

    torch.set_num_threads(1)
    work = a.work or Path(tempfile.mkdtemp(prefix="frozentune-calibration-"))
    rows = []
    for method in a.methods.split(","):
        r = api.train(method, a.data, api.BackboneOptions(precision=a.precision),
                      train_cfg={"seed": a.seed, "calibrate": "off"},
                      output=work / method, overwrite=True, progress=False, log=None)
        cal = r["calibration"]
        row = {"method": method, "model_method": r["model_method"], "accuracy": r["metrics"]["accuracy"],
               "ece": cal["ece"], "bins": cal["bins"]}
        line = f"{method:12s} accuracy {r['metrics']['accuracy']:6.2f}  ECE {cal['ece']:5.2f} points"
        if a.temperature:
            row["temperature"] = scaled(work / method, a.data)
            t = row["temperature"]
            line += (f"  T {t['T']:.3f} (on {t['validation']:,} validation)  test ECE {t['ece'][0]:.2f} -> "
                     f"{t['ece'][1]:.2f}  cross-entropy {t['nll'][0]:.4f} -> {t['nll'][1]:.4f}")
        rows.append(row)
        print(line, flush=True)
    a.out.write_text(json.dumps({"data": a.data, "seed": a.seed, "precision": a.precision, "threads": 1,
                                 "command": " ".join(sys.argv[1:]),
                                 "machine": machine(), "rows": rows}, indent=2))
    if not a.keep and a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def scaled(folder: Path, data: str) -> dict:
    """The saved model's validation and test logits; T fitted on validation; test ECE and cross-entropy at T = 1
    and at T."""
    from frozentune import api
    from frozentune import model as M
    from frozentune.train import calibration, fit_temperature, predict_logits, temperature_loss

    m = M.load(folder)
    z, y = {}, {}
    for split in ("validation", "test"):
        _, part, y[split] = api._saved_split(m, data, split, None, None, None, folder)
        z[split] = predict_logits(m, api.SourceFactory(m.backbone_ref, m.runs_live, None, False, False, None)(part))

    nll = temperature_loss(z["test"], y["test"])
    t = fit_temperature(z["validation"], y["validation"])["value"]
    ece = [calibration(y["test"], z["test"].argmax(1), api.softmax_rows(z["test"] / u))["ece"] for u in (1.0, t)]
    return {"T": t, "validation": len(y["validation"]), "ece": ece, "nll": [nll(1.0), nll(t)]}


if __name__ == "__main__":
    sys.exit(main())

"""What a sweep costs against separate runs (issue 21): 40 points on full SST-2 from one cache.

  OMP_NUM_THREADS=1 python bench/sweep_cost.py --threads 1

The sweep (probe, space × layers -1, -3 × lr 1e-3, 1e-2 × seeds 0-4 = 40 points) runs with an
empty cache folder, so its wall time includes the one extraction per layer a new user pays. It is
compared with
- 40 separate `frozentune train` runs, each extracting its own states: the sum over points of the
  extraction its layer took in the sweep plus the point's own fit. One such run is also made for
  real (the first point, with an empty cache of its own) to check that sum against a real run;
- the 40 fits alone (the sweep's wall time less extraction, loading and saving).
Results: results/sweep_cost.json; the sweep's own table, plot and best model in runs/sweep-sst2.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="sst2")
    ap.add_argument("--methods", default="probe,space")
    ap.add_argument("--layers", default="-1,-3")
    ap.add_argument("--lr", default="1e-3,1e-2")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=Path, default=HERE / "runs")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "sweep_cost.json")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    from frozentune import api
    from frozentune.extract.device import cpu_summary
    from frozentune.sweep import Grid, run_sweep
    from frozentune.sweep.run import markdown

    caches = a.runs / "sweep-cache"
    shutil.rmtree(caches, ignore_errors=True)
    shutil.rmtree(a.runs / "sweep-sst2", ignore_errors=True)
    grid = Grid.parse(a.methods, a.layers, a.lr, None, a.seeds)
    t0 = time.perf_counter()
    result = run_sweep(grid, a.data, api.BackboneOptions(), a.runs / "sweep-sst2", cache_root=caches,
                       log=lambda s: print(s, flush=True))
    sweep_wall = time.perf_counter() - t0
    extract_of = {r["layer"]: r["extract_seconds"] for r in result.rows if r["extract_seconds"]}
    fits = [r["seconds"] - r["extract_seconds"] for r in result.rows]
    separate = sum(extract_of[r["layer"]] + f for r, f in zip(result.rows, fits))

    # one separate run for real: the first point, its own empty cache
    first = result.rows[0]
    real_cache = a.runs / "sweep-cache-single"
    shutil.rmtree(real_cache, ignore_errors=True)
    t1 = time.perf_counter()
    api.train(first["method"], a.data, api.BackboneOptions(layers=first["layer"]),
              train_cfg={"seed": first["seed"], "lr": first["lr"], "weight_decay": first["weight_decay"]},
              cache_root=real_cache, progress=False, log=lambda s: None)
    real_single = time.perf_counter() - t1
    shutil.rmtree(real_cache, ignore_errors=True)
    out = {"command": "bench/sweep_cost.py " + " ".join(sys.argv[1:]), "threads": a.threads, "cpu": cpu_summary(),
           "points": len(result.rows), "sweep_wall_seconds": sweep_wall, "sweep_seconds": result.seconds,
           "extraction_per_layer_seconds": extract_of, "fits_seconds": sum(fits),
           "separate_runs_seconds": separate,
           "separate_first_point_estimated": extract_of[first["layer"]] + fits[0],
           "separate_first_point_measured": real_single,
           "ratio_separate_over_sweep": separate / sweep_wall, "ratio_sweep_over_fits": sweep_wall / sum(fits),
           "best": result.best, "table": markdown(result, a.data)}
    a.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k not in ("table", "best")}, indent=1))


if __name__ == "__main__":
    main()

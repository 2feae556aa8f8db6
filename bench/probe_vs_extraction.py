"""The cache's promise, measured as a ratio in one process: extracting the SST-2 train states
vs 10 epochs of `probe` over them (validation evaluated every epoch, as in any run).

  python bench/probe_vs_extraction.py          # 2 repeats: extract into a fresh cache, then train
Writes bench/results/probe-vs-extraction.json.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from frozentune import api
from frozentune.cache import get_or_build
from frozentune.data import load_classification

HERE = Path(__file__).resolve().parent


def main(repeats: int = 2) -> None:
    bb = api.BackboneOptions().load()
    bb.weights_hash  # hashed once, outside the timings
    ds = load_classification("sst2")
    runs = []
    for r in range(repeats):
        root = Path(tempfile.mkdtemp(prefix="ft-pve-"))
        try:
            t0 = time.perf_counter()
            get_or_build(bb, ds.train.file_texts, root, progress=False)
            extract = time.perf_counter() - t0
            res = api.train("probe", ds, bb, train_cfg={"epochs": 10, "patience": 0}, cache_root=root,
                            progress=False, log=lambda s: None)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        runs.append({"extract_seconds": extract, "train_seconds": res["train_seconds"],
                     "ratio": res["train_seconds"] / extract, "test_accuracy": res["metrics"]["accuracy"]})
        print(f"repeat {r + 1}: extraction of {len(ds.train.file_texts):,} texts {extract:.1f}s, 10 probe epochs "
              f"{res['train_seconds']:.1f}s = {100 * runs[-1]['ratio']:.1f}%", flush=True)
    out = {"command": "python bench/probe_vs_extraction.py", "date": time.strftime("%Y-%m-%d %H:%M"), "runs": runs}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "probe-vs-extraction.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

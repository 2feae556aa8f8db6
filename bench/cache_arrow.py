"""Why the feature cache keeps its own format instead of a `datasets` Arrow dataset (issue 18),
measured: one cache entry written as a Hugging Face `datasets` dataset (one row per example, the
states an Array2D(None, D) float16 column, the token ids beside them), then the same random
training batches read from both.

  OMP_NUM_THREADS=1 python bench/cache_arrow.py [ENTRY] [--batches 30] [--batch-size 64]
  (default ENTRY: the largest entry in $FROZENTUNE_CACHE / ~/.cache/frozentune with D = 384)

Timed: writing the Arrow dataset (save_to_disk), its size beside the entry's, and per batch
(B examples drawn at random, padded to (B, T, D) float32 with a mask: what a head trains on) the
read time of CachedStates.batch and of the Arrow dataset (`with_format("numpy")`, rows by index,
then the same padding), interleaved, median. Results: bench/results/cache_arrow.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import write_result  # noqa: E402  (bench/run.py)
OUT = HERE / "results" / "cache_arrow"


def default_entry() -> Path:
    root = Path(os.environ.get("FROZENTUNE_CACHE", Path.home() / ".cache" / "frozentune")) / "features"
    entries = [p for p in root.iterdir() if (p / "meta.json").is_file()]
    metas = {p: json.loads((p / "meta.json").read_text()) for p in entries}
    return max((p for p, m in metas.items() if m.get("dim") == 384), key=lambda p: metas[p]["tokens"])


def rows(path: str):
    """The entry's examples as datasets rows (a top-level function of a path: datasets pickles it)."""
    from frozentune.cache import CachedStates

    entry = CachedStates(Path(path), verify="none")
    for i in range(entry.n):
        yield {"input_ids": entry.token_ids(i).astype(np.int32), "states": entry.example(i)}


def padded(rows: list[np.ndarray], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    lens = np.array([len(r) for r in rows])
    out = torch.zeros(len(rows), int(lens.max()), dim)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.from_numpy(np.asarray(r, dtype=np.float32))
    return out, torch.arange(out.shape[1])[None, :] < torch.from_numpy(lens)[:, None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("entry", nargs="?", type=Path)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    import datasets

    from frozentune.cache import CachedStates

    entry = a.entry or default_entry()
    native = CachedStates(entry)
    n, dim = native.n, native.dim
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "states": datasets.Array2D(shape=(None, dim), dtype="float16")})

    tmp = Path(tempfile.mkdtemp(prefix="cache-arrow-"))
    try:
        t0 = time.perf_counter()
        ds = datasets.Dataset.from_generator(rows, features=features, gen_kwargs={"path": str(entry)},
                                             cache_dir=str(tmp / "hf-cache"))
        ds.save_to_disk(str(tmp / "arrow"))
        write_s = time.perf_counter() - t0
        arrow_bytes = sum(p.stat().st_size for p in (tmp / "arrow").rglob("*") if p.is_file())
        native_bytes = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
        t0 = time.perf_counter()
        arrow = datasets.load_from_disk(str(tmp / "arrow")).with_format("numpy", columns=["states"])
        open_s = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        times = {"native": [], "arrow": []}
        for _ in range(a.batches):
            idx = rng.choice(n, a.batch_size, replace=False)
            t = time.perf_counter()
            h1, m1 = native.batch(idx)
            times["native"].append(time.perf_counter() - t)
            t = time.perf_counter()
            h2, m2 = padded(list(arrow[idx.tolist()]["states"]), dim)
            times["arrow"].append(time.perf_counter() - t)
            assert torch.equal(h1, h2) and torch.equal(m1, m2), "the two formats must hold the same states"
        med = {k: float(np.median(v)) for k, v in times.items()}
        result = {"entry": entry.name, "examples": n, "tokens": int(native.meta["tokens"]), "dim": dim,
                  "native_mib": round(native_bytes / 2**20, 1), "arrow_mib": round(arrow_bytes / 2**20, 1),
                  "arrow_write_s": round(write_s, 1), "arrow_open_s": round(open_s, 2),
                  "batch_ms": {k: round(1000 * v, 2) for k, v in med.items()},
                  "arrow_over_native": round(med["arrow"] / med["native"], 2),
                  "batches": a.batches, "batch_size": a.batch_size, "datasets": datasets.__version__,
                  "threads": 1, "date": time.strftime("%Y-%m-%d %H:%M"),
                  "command": "python bench/cache_arrow.py " + " ".join(sys.argv[1:])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    md = (f"| format | size | a batch of {a.batch_size} (median of {a.batches}, ms) |\n|---|---:|---:|\n"
          f"| frozentune cache entry | {result['native_mib']} MiB | {result['batch_ms']['native']} |\n"
          f"| datasets Arrow (save_to_disk) | {result['arrow_mib']} MiB | {result['batch_ms']['arrow']} |\n\n"
          f"{n:,} examples, {result['tokens']:,} tokens × {dim} float16 states; the Arrow copy took "
          f"{result['arrow_write_s']} s to write; a batch read from it takes {result['arrow_over_native']}× the "
          f"cache's time (same states, checked equal). datasets {datasets.__version__}, 1 thread, "
          f"{result['date']}. `{result['command'].strip()}`\n")
    write_result(OUT, result, md)


if __name__ == "__main__":
    main()

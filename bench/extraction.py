"""Extraction speed, side by side in one process, interleaved, repeated:

  bare     a bare `model(input_ids, attention_mask)` loop over the length-sorted batches
  cache    frozentune's cache build over the same batches (layer choice, fp16, ragged write,
           checksums, fsync, atomic rename)
  padded   the bare loop with every batch padded to max_length (same token budget per batch)

  python bench/extraction.py            # SST-2 (4,000 sampled train texts, max_length 128) and
                                        # IMDB (2,000 sampled train reviews, max_length 256)
Writes bench/results/extraction.json; `python bench/run.py --report` puts it in REPORT.md.
"""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from frozentune.backbone import Backbone, length_batches, pad
from frozentune.cache import build, cache_key
from frozentune.data import data_root, read_split

HERE = Path(__file__).resolve().parent
MAX_TOKENS, MAX_BATCH = 8192, 128


def bare_loop(bb: Backbone, ids: list[np.ndarray], pad_to: int | None) -> float:
    lengths = np.array([len(x) for x in ids])
    budget = lengths if pad_to is None else np.full_like(lengths, pad_to)
    t0 = time.perf_counter()
    for idx in length_batches(budget, MAX_TOKENS, MAX_BATCH):
        x, m = pad([ids[i] for i in idx], bb.pad_id(), pad_to)
        with torch.inference_mode():
            bb.model(input_ids=x, attention_mask=m)
    return time.perf_counter() - t0


def cache_build(bb: Backbone, texts: list[str], tokens) -> float:
    root = Path(tempfile.mkdtemp(prefix="ft-extract-"))
    try:
        key, fields = cache_key(bb, texts)
        t0 = time.perf_counter()
        build(root, key, fields, bb, tokens, progress=False, max_tokens=MAX_TOKENS)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(name: str, texts: list[str], max_length: int, repeats: int) -> dict:
    bb = Backbone.load("minilm", max_length=max_length)
    bb.weights_hash  # hash once, outside the timings
    tokens = bb.tokenize(texts)
    n_tok = int(tokens.lengths.sum())
    bare_loop(bb, tokens.ids[:64], None)  # warm-up
    times: dict[str, list[float]] = {"bare": [], "cache": [], "padded": []}
    for r in range(repeats):
        times["bare"].append(bare_loop(bb, tokens.ids, None))
        times["cache"].append(cache_build(bb, texts, tokens))
        times["padded"].append(bare_loop(bb, tokens.ids, max_length))
        print(f"{name} repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "name": name, "examples": len(texts), "max_length": max_length, "real_tokens": n_tok,
        "mean_tokens": n_tok / len(texts), "repeats": repeats, "seconds": times,
        "tokens_per_s": {k: n_tok / v for k, v in med.items()},
        "cache_vs_bare": med["bare"] / med["cache"],
        "sorted_speedup_over_padded": med["padded"] / med["bare"],
    }


def sample(path: Path, n: int, seed: int = 0) -> list[str]:
    texts = read_split(path).texts
    idx = np.random.default_rng(seed).choice(len(texts), size=n, replace=False)
    return [texts[i] for i in sorted(idx)]


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    root = data_root()
    out = {"threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "command": "python bench/extraction.py" + (f" --repeats {a.repeats}" if a.repeats != 2 else ""),
           "runs": [measure("sst2 (4,000 train texts)", sample(root / "sst2" / "train.jsonl", 4000), 128, a.repeats),
                    measure("imdb (2,000 train reviews)", sample(root / "imdb" / "train.jsonl", 2000), 256, a.repeats)]}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "extraction.json").write_text(json.dumps(out, indent=2))
    for r in out["runs"]:
        print(f"{r['name']}: cache {r['tokens_per_s']['cache']:,.0f} tok/s vs bare {r['tokens_per_s']['bare']:,.0f} "
              f"({100 * r['cache_vs_bare']:.1f}%); sorted dynamic padding {r['sorted_speedup_over_padded']:.2f}x faster than padding to {r['max_length']}")


if __name__ == "__main__":
    main()

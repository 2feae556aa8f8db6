"""The self-explaining head's no-grad span product W₄(h_i ⊙ h_j) in bf16 (heads/self_explaining.py,
product_dtype) against the same product in fp32, on saved models and their own cached bf16 states:
test accuracy and macro-F1 both ways, how many test predictions (`frozentune predict`, live pass)
change, and the head's time on one batch of 16 test texts (1 thread, mean of --repeats calls after
3 warm-up calls, both ways interleaved).

Models (SST-2: the serve benchmark's heads, bench/serve_load.py; TREC and SST-5 trained the same way):
  frozentune train --method selfexplain --data trec --backbone minilm --max-train 1500 --epochs 2 --seed 0 --output bench/runs/se-trec
  frozentune train --method selfexplain --data sst5 --backbone minilm --max-train 1500 --epochs 2 --seed 0 --output bench/runs/se-sst5
  OMP_NUM_THREADS=1 python bench/span_product_bf16.py bench/runs/serve-models/heads/selfexplain-l4=sst2 \\
      bench/runs/serve-models/heads/selfexplain-last=sst2 bench/runs/se-trec=trec bench/runs/se-sst5=sst5
      → bench/results/span_product_bf16.json and .md
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def head_ms(folder: str, texts: list[str], repeats: int) -> dict[str, float]:
    """The head alone on one batch of the texts' states (the pass run once, outside the timing)."""
    import frozentune.heads.self_explaining as se
    from frozentune import api
    from frozentune.head import Features

    model = api._load(Path(folder), "cpu", None, lambda s: None)
    from frozentune.backbone import pad
    from frozentune.model import as_cached

    bb = model.backbone_ref
    ids, mask = pad([list(x) for x in bb.tokenize(texts).ids], bb.pad_id())
    with torch.no_grad():
        hidden = as_cached(bb.states(ids, mask), model.cache_dtype)
    f = Features(hidden, mask.bool(), None, bb.precision)
    real = se.product_dtype
    out: dict[str, list[float]] = {"fp32": [], "bf16": []}
    try:
        for i in range(3 + repeats):
            for name in ("fp32", "bf16"):
                se.product_dtype = real if name == "bf16" else (lambda p, d: torch.float32)
                t0 = time.perf_counter()
                with torch.no_grad():
                    model.head(f)
                if i >= 3:
                    out[name].append(1000 * (time.perf_counter() - t0))
    finally:
        se.product_dtype = real
    return {k: round(sum(v) / len(v), 2) for k, v in out.items()}


def main() -> int:
    import frozentune.heads.self_explaining as se
    from frozentune import api
    from frozentune.data import load_classification

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="FOLDER=DATA")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--output", type=Path, default=HERE / "results" / "span_product_bf16.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    real = se.product_dtype
    rows = []
    for spec in a.models:
        folder, data = spec.split("=")
        got = {}
        texts = list(load_classification(data).test.texts)
        for name, rule in (("fp32", lambda p, d: torch.float32), ("bf16", real)):
            se.product_dtype = rule
            try:
                m = api.evaluate_model(folder, data, "test", log=lambda s: None)
                preds = [p["label"] for p in api.predict(folder, texts, log=lambda s: None)]
            finally:
                se.product_dtype = real
            got[name] = {"precision": m["precision"], "accuracy": round(m["metrics"]["accuracy"], 2),
                         "macro_f1": round(m["metrics"]["macro_f1"], 2), "predictions": preds}
        changed = sum(x != y for x, y in zip(got["fp32"]["predictions"], got["bf16"]["predictions"]))
        row = {"model": folder, "data": data, "test": len(texts), "pass_precision": got["bf16"]["precision"],
               **{f"{k}_{n}": got[n][k] for n in ("fp32", "bf16") for k in ("accuracy", "macro_f1")},
               "predictions_changed": changed, "head_ms_16_texts": head_ms(folder, texts[:16], a.repeats)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = {"command": "python bench/span_product_bf16.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M"),
           "threads": 1, "rows": rows}
    a.output.write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"`{out['command']}` ({out['date']}, 1 thread)", "",
             "| model | data | test | pass | accuracy fp32 → bf16 product | macro-F1 | predictions changed | "
             "head ms, 16 texts: fp32 / bf16 product |", "|---|---|---:|---|---|---|---:|---|"]
    for r in rows:
        h = r["head_ms_16_texts"]
        lines.append(f"| {r['model']} | {r['data']} | {r['test']:,} | {r['pass_precision']} | {r['accuracy_fp32']} → "
                     f"{r['accuracy_bf16']} | {r['macro_f1_fp32']} → {r['macro_f1_bf16']} | {r['predictions_changed']} | "
                     f"{h['fp32']} / {h['bf16']} ({h['fp32'] / h['bf16']:.2f}×) |")
    a.output.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

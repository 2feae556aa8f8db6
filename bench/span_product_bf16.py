"""The self-explaining head's no-grad bf16 path (heads/self_explaining.py, product_dtype) against fp32,
on saved models and their own cached bf16 states, three ways: fp32; the span product W₄(h_i ⊙ h_j) in
bf16 with the end maps in fp32 (the path of 2026-11-25); the product and the end maps in bf16
(low_end_maps, the path since 2026-11-26). For each: test accuracy and macro-F1, how many test
predictions (`frozentune predict`, live pass) differ from fp32's, and the head's time on one batch of
16 test texts (1 thread, mean of --repeats calls after 3 warm-up calls, the three ways interleaved).

Models (SST-2: the serve benchmark's heads, bench/serve_load.py; TREC and SST-5 trained the same way):
  frozentune train --method selfexplain --data trec --backbone minilm --max-train 1500 --epochs 2 --seed 0 --output bench/runs/se-trec
  frozentune train --method selfexplain --data sst5 --backbone minilm --max-train 1500 --epochs 2 --seed 0 --output bench/runs/se-sst5
  OMP_NUM_THREADS=1 python bench/span_product_bf16.py bench/runs/serve-models/heads/selfexplain-l4=sst2 \\
      bench/runs/serve-models/heads/selfexplain-last=sst2 bench/runs/se-trec=trec bench/runs/se-sst5=sst5 \\
      --output bench/results/span_low_bf16.json
      → bench/results/span_low_bf16.json and .md (results/span_product_bf16.* are the two-way run of
      2026-11-25, fp32 against the product alone)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


MODES = ("fp32", "product", "bf16")  # fp32; the product alone in bf16; the product and the end maps in bf16


@contextlib.contextmanager
def mode(name: str):
    """The head's no-grad path as `name` (MODES) inside the block."""
    import frozentune.heads.self_explaining as se

    real_dtype, real_maps = se.product_dtype, se.SelfExplainHead.low_end_maps
    if name == "fp32":
        se.product_dtype = lambda p, d: torch.float32
    elif name == "product":
        se.SelfExplainHead.low_end_maps = lambda self, hidden, low: self.end_maps(hidden)
    try:
        yield
    finally:
        se.product_dtype, se.SelfExplainHead.low_end_maps = real_dtype, real_maps


def head_ms(folder: str, texts: list[str], repeats: int) -> dict[str, float]:
    """The head alone on one batch of the texts' states (the pass run once, outside the timing)."""
    from frozentune import api
    from frozentune.backbone import pad
    from frozentune.head import Features
    from frozentune.model import as_cached

    model = api._load(Path(folder), "cpu", None, lambda s: None)
    bb = model.backbone_ref
    ids, mask = pad([list(x) for x in bb.tokenize(texts).ids], bb.pad_id())
    with torch.no_grad():
        hidden = as_cached(bb.states(ids, mask), model.cache_dtype)
    f = Features(hidden, mask.bool(), None, bb.precision)
    out: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(3 + repeats):
        for name in MODES:
            with mode(name), torch.no_grad():
                t0 = time.perf_counter()
                model.head(f)
                if i >= 3:
                    out[name].append(1000 * (time.perf_counter() - t0))
    return {k: round(sum(v) / len(v), 2) for k, v in out.items()}


def main() -> int:
    from frozentune import api
    from frozentune.data import load_classification

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="FOLDER=DATA")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--output", type=Path, default=HERE / "results" / "span_low_bf16.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for spec in a.models:
        folder, data = spec.split("=")
        got = {}
        texts = list(load_classification(data).test.texts)
        for name in MODES:
            with mode(name):
                m = api.evaluate_model(folder, data, "test", log=lambda s: None)
                preds = [p["label"] for p in api.predict(folder, texts, log=lambda s: None)]
            got[name] = {"precision": m["precision"], "accuracy": round(m["metrics"]["accuracy"], 2),
                         "macro_f1": round(m["metrics"]["macro_f1"], 2), "predictions": preds}
        row = {"model": folder, "data": data, "test": len(texts), "pass_precision": got["bf16"]["precision"],
               **{f"{k}_{n}": got[n][k] for n in MODES for k in ("accuracy", "macro_f1")},
               **{f"predictions_changed_{n}": sum(x != y for x, y in zip(got["fp32"]["predictions"], got[n]["predictions"]))
                  for n in MODES[1:]},
               "head_ms_16_texts": head_ms(folder, texts[:16], a.repeats)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = {"command": "python bench/span_product_bf16.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M"),
           "threads": 1, "modes": {"fp32": "fp32", "product": "the span product in bf16, the end maps in fp32",
                                   "bf16": "the span product and the end maps in bf16"}, "rows": rows}
    a.output.write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"`{out['command']}` ({out['date']}, 1 thread). product: the span product alone in bf16 (2026-11-25); "
             f"bf16: the product and the end maps (2026-11-26).", "",
             "| model | data | test | pass | accuracy fp32 / product / bf16 | macro-F1 fp32 / product / bf16 | "
             "predictions changed from fp32: product / bf16 | head ms, 16 texts: fp32 / product / bf16 | bf16 vs product |",
             "|---|---|---:|---|---|---|---|---|---:|"]
    for r in rows:
        h = r["head_ms_16_texts"]
        lines.append(f"| {r['model']} | {r['data']} | {r['test']:,} | {r['pass_precision']} | "
                     + " / ".join(str(r[f"accuracy_{n}"]) for n in MODES) + " | "
                     + " / ".join(str(r[f"macro_f1_{n}"]) for n in MODES) + " | "
                     f"{r['predictions_changed_product']} / {r['predictions_changed_bf16']} | "
                     f"{h['fp32']} / {h['product']} / {h['bf16']} | {h['product'] / h['bf16']:.2f}× |")
    a.output.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How concentrated the span weights of trained `selfexplain` models are on a test split: the mean
over examples of Σα² (1 = all weight on one span) and of the largest α, and the mean number of
valid spans. Shows what the λ·Σα² term does to the rationales.

  python bench/span_concentration.py --data sst5 bench/runs/selfexplain-sst5 bench/runs/selfexplain-sst5-lam0 ...

Writes bench/results/span-concentration-DATA.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def concentration(model_dir: Path, data: str) -> dict:
    from frozentune import model as M
    from frozentune.api import SourceFactory, _saved_split
    from frozentune.train import eval_batches

    model = M.load(model_dir)
    _, part, _ = _saved_split(model, data, "test", None, None)
    src = SourceFactory(model.backbone_ref, model.runs_live, None, False, False)(part)
    model.eval()
    sq, top, spans, n = 0.0, 0.0, 0.0, 0
    with torch.no_grad():
        for idx in eval_batches(src.lengths, 64):
            alpha = model(src.batch(idx)).extras["span_weights"].flatten(1)  # (B, T·W)
            sq += float(alpha.pow(2).sum(1).sum())
            top += float(alpha.amax(1).sum())
            spans += float((alpha > 0).sum())
            n += len(idx)
    opts = dataclasses.asdict(model.cfg)
    return {"model": model_dir.name, "reg_lambda": opts["reg_lambda"], "max_span_width": opts["max_span_width"],
            "mean_sum_alpha_sq": sq / n, "mean_top_alpha": top / n, "mean_spans_with_weight": spans / n, "examples": n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--data", default="sst5")
    a = ap.parse_args()
    rows = [concentration(m, a.data) for m in a.models]
    out = {"command": "python bench/span_concentration.py " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M"), "data": a.data, "rows": rows}
    (HERE / "results" / f"span-concentration-{a.data}.json").write_text(json.dumps(out, indent=2))
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()

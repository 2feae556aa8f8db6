"""Do the heads' inference paths answer what their training paths answer, on real models and texts?

The 8 heads serve_load.py trains (bench/runs/serve-models/heads; MiniLM, SST-2) classify SST-2 test
(872 sentences) and the first 200 reviews of serve_load.py's IMDB test slice in batches of 16, once
on each head's inference path (the default: no autograd, so the self-explaining head's chunked spans
and Y-Tuning's folded cross-attention) and once on its training path (serve_group_cost.py's
training_paths: under enable_grad, no parameter requiring a gradient). Per head: how many labels
agree, the largest difference of a class probability, and whether the explanations of the first 40
SST-2 sentences name the same spans / tokens. Torch pinned to 1 thread.

  OMP_NUM_THREADS=1 python bench/inference_paths_check.py     # bench/results/inference_paths_check.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch

from serve_group_cost import training_paths
from serve_load import HEADS, MODELS, long_texts, short_texts

HERE = Path(__file__).resolve().parent


def answers(engine, texts: list[str], rows: int = 16) -> list[dict]:
    return [r for i in range(0, len(texts), rows) for r in engine.classify(texts[i:i + rows])["results"]]


def cited(explanation: dict) -> object:
    """What an explanation points at, as character ranges: spans, or each label's tokens."""
    if "spans" in explanation:
        return [(s["start"], s["end"]) for s in explanation["spans"]]
    if "attention" in explanation:
        return {k: [(s["start"], s["end"]) for s in v] for k, v in explanation["attention"].items()}
    return explanation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "inference_paths_check.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from frozentune.serve.engine import Engine

    engine = Engine.load([MODELS / "heads" / n for n, _, _ in HEADS], log=lambda line: None)
    texts = {"short (SST-2 test)": short_texts(), "long (IMDB test, first 200)": long_texts()[:200]}
    runs = {}
    try:
        for path, mode in (("inference", contextlib.nullcontext), ("training", lambda: training_paths(engine))):
            with mode():
                runs[path] = {kind: answers(engine, t) for kind, t in texts.items()}
                runs[path]["explain"] = [r for i in range(0, 40, 8)
                                         for r in engine.explain(short_texts()[i:i + 8])["results"]]
    finally:
        engine.close()
    rows = []
    for kind in texts:
        for task in runs["inference"][kind][0]["tasks"]:
            pairs = [(x["tasks"][task], y["tasks"][task]) for x, y in zip(runs["inference"][kind], runs["training"][kind])]
            rows.append({"texts": kind, "task": task, "texts_n": len(pairs),
                         "same_label": sum(x["label"] == y["label"] for x, y in pairs),
                         "max_abs_prob_diff": max(abs(x["scores"][c] - y["scores"][c]) for x, y in pairs for c in x["scores"])})
            print(f"{kind:28s} {task:17s} labels agree {rows[-1]['same_label']}/{len(pairs)}, "
                  f"max |Δp| {rows[-1]['max_abs_prob_diff']:.1e}", flush=True)
    same = differ = 0
    for x, y in zip(runs["inference"]["explain"], runs["training"]["explain"]):
        for task, v in x["tasks"].items():
            if "explanation" in v:
                if cited(v["explanation"]) == cited(y["tasks"][task]["explanation"]):
                    same += 1
                else:
                    differ += 1
    print(f"explanations of 40 SST-2 sentences: {same} cite the same spans / tokens, {differ} differ")
    a.out.write_text(json.dumps({"command": "OMP_NUM_THREADS=1 python bench/inference_paths_check.py", "threads": 1,
                                 "rows": rows, "explanations_same": same, "explanations_differ": differ},
                                indent=1) + "\n")


if __name__ == "__main__":
    main()

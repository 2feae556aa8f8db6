"""Source → target generation from a pairs dataset on real data: SciTLDR (abstract → one-sentence
TL;DR) with SmolLM2-135M's prefix, run as a user runs it (`frozentune train --method prefix --data
scitldr`), beside the lead-1 baseline (the abstract's first sentence, the usual floor for
summarisation) scored by the same metrics on the same test sample, against every reference.

  python bench/scitldr.py --threads 1       # writes bench/results/scitldr.json

On 2 CPU cores SmolLM2 takes about 15 s per step of 8 abstracts, so the defaults are small: 400
training pairs seen once (50 steps, --min-steps 0 lifts the 200-step floor), 100 test sources, greedy.

The prefix run's options are printed and stored; its result.json is kept under bench/runs/scitldr-prefix.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def lead_1(text: str) -> str:
    """The first sentence: up to the first '.', '!' or '?' followed by a space and a capital letter."""
    m = re.search(r"[.!?](?=\s+[A-Z])", text)
    return text[:m.end()] if m else text


def main() -> None:
    from frozentune.cli import main as cli
    from frozentune.generation.run import grouped_scores, load_generation_splits

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-train", type=int, default=400)
    ap.add_argument("--max-test", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = HERE / "runs" / "scitldr-prefix"
    argv = ["train", "--method", "prefix", "--data", "scitldr", "--init", "words", "--init-text", "TL;DR:",
            "--max-train", str(a.max_train), "--max-validation", "100", "--max-test", str(a.max_test),
            "--epochs", str(a.epochs), "--min-steps", "0", "--num-beams", "1", "--max-new-tokens", "48", "--seed", "0",
            "--output", str(out), "--overwrite"]
    print("frozentune " + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    assert cli(argv) == 0
    wall = time.perf_counter() - t0
    r = json.loads((out / "result.json").read_text())
    test = load_generation_splits("scitldr", 0, a.max_train, 100, a.max_test).test  # the run's own sample
    gens = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert [g["source"] for g in gens] == [ex.source for ex in test], "not the run's test sample"
    lead = grouped_scores([lead_1(ex.source) for ex in test], test)["all"]
    from run import machine
    result = {"command": "python bench/scitldr.py " + " ".join(sys.argv[1:]), "argv": argv,
              "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(torch.get_num_threads()),
              "prefix": {k: r[k] for k in ("metrics", "trainable_params", "saved_params", "backbone_params",
                                           "train_seconds", "decode_seconds", "best_epoch", "sizes")},
              "wall_seconds": wall, "lead_1": lead, "notes": r["config"]["data_notes"],
              "examples": [{"source": g["source"][:300], "output": g["output"], "refs": g["refs"]} for g in gens[:3]]}
    (HERE / "results" / "scitldr.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({"prefix": r["metrics"], "lead_1": lead}, indent=2))


def report(r: dict) -> str:
    keys = ("rouge_1", "rouge_2", "rouge_l", "bleu")
    p = r["prefix"]
    rows = [f"`{r['command']}` ({r['date']}, {r['machine']}): `frozentune {' '.join(r['argv'])}`", "",
            "| | " + " | ".join(k.replace("_", "-").upper() for k in keys) + " | trained / saved numbers | seconds |",
            "|---|" + "---:|" * (len(keys) + 2),
            f"| SmolLM2-135M + prefix ({p['sizes']['train']} pairs) | "
            + " | ".join(f"{p['metrics'][k]:.2f}" for k in keys)
            + f" | {p['trainable_params']:,} / {p['saved_params']:,} | train {p['train_seconds']:.0f}, decode "
            f"{p['decode_seconds']:.0f} |",
            "| lead-1 (the abstract's first sentence) | " + " | ".join(f"{r['lead_1'][k]:.2f}" for k in keys) + " | — | — |"]
    return "\n".join(rows)


if __name__ == "__main__":
    main()

"""How often an explanation listed the same words twice, before TokenView.ranked merged them.

    OMP_NUM_THREADS=1 python bench/explain_repeats.py --model DIR [--model DIR ...] --data sst5 --top 3

For every test text, the explanation of each saved model is made twice from the same head output:
as it was before (the first `top` tokens or spans, each grown to its whole words: the pieces of one
word each listed) and as it is now (`TokenView.ranked`: a word listed once). Counts the lists that
repeat a character range, and the distinct ranges each shows. Writes a JSON and prints a table.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def lists_of(explanation: dict) -> list[list[dict]]:
    """The ranked lists of one explanation: selfexplain's spans, space's tokens per class, ytuning's
    attention per label."""
    if "spans" in explanation:
        return [explanation["spans"]]
    if "classes" in explanation:
        return [c["tokens"] for c in explanation["classes"].values()]
    return list(explanation["attention"].values())


def ranges(entries: list[dict]) -> list[tuple]:
    return [(e["start"], e["end"], e.get("part")) for e in entries]


def first_top(self, candidates, top):  # the explanation as it was made before ranked merged words
    out = []
    for i, j, weight in candidates:
        if len(out) == top:
            break
        out.append(self.weighted(i, weight, j))
    return out


def measure(model_dir: Path, texts: list[str], top: int) -> dict:
    from frozentune import api
    from frozentune.head import TokenView

    now = api.explain(model_dir, texts, top=top, log=lambda s: None)
    merged = TokenView.ranked
    TokenView.ranked = first_top
    try:
        before = api.explain(model_dir, texts, top=top, log=lambda s: None)
    finally:
        TokenView.ranked = merged
    out = {"model": str(model_dir), "method": json.loads((model_dir / "config.json").read_text())["method"],
           "texts": len(texts), "lists": 0, "before_repeating": 0, "now_repeating": 0,
           "before_distinct": 0, "now_distinct": 0, "same_first": 0}
    for b, n in zip(before, now):
        for lb, ln in zip(lists_of(b["explanation"]), lists_of(n["explanation"])):
            rb, rn = ranges(lb), ranges(ln)
            out["lists"] += 1
            out["before_repeating"] += len(set(rb)) < len(rb)
            out["now_repeating"] += len(set(rn)) < len(rn)
            out["before_distinct"] += len(set(rb))
            out["now_distinct"] += len(set(rn))
            out["same_first"] += rb[:1] == rn[:1]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, action="append", required=True)
    p.add_argument("--data", default="sst5")
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--max-texts", type=int, default=0, help="0: the whole test split")
    p.add_argument("--out", type=Path, default=Path("bench/results/explain_repeats.json"))
    a = p.parse_args()
    from frozentune.data import load_classification

    torch.set_num_threads(1)
    texts = load_classification(a.data).test.texts
    texts = texts[:a.max_texts] if a.max_texts else texts
    rows = []
    for m in a.model:
        t0 = time.perf_counter()
        rows.append(measure(m, texts, a.top) | {"seconds": round(time.perf_counter() - t0, 1)})
    print(f"{a.data} test, {len(texts)} texts, top {a.top}, torch threads {torch.get_num_threads()}")
    print("| method | lists | repeating a word, before | now | distinct words per list, before | now | same first entry |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        n = r["lists"]
        print(f"| {r['method']} | {n:,} | {r['before_repeating']:,} ({100 * r['before_repeating'] / n:.1f}%) | "
              f"{r['now_repeating']} | {r['before_distinct'] / n:.2f} | {r['now_distinct'] / n:.2f} | "
              f"{100 * r['same_first'] / n:.1f}% |")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"data": a.data, "top": a.top, "threads": torch.get_num_threads(), "rows": rows},
                                indent=1))


if __name__ == "__main__":
    main()

"""Top-3 rationales of a trained `selfexplain` model for ten SST-2 test sentences (a seeded sample),
so a person can judge whether they point at the sentiment-bearing words.

  python bench/rationales.py                         # model: bench/runs/selfexplain-sst2
  python bench/rationales.py --model DIR --n 10 --seed 0

Writes bench/results/rationales-sst2.json; `python bench/run.py --report` puts it in REPORT.md.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    from frozentune import api
    from frozentune.data import load_classification

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=HERE / "runs" / "selfexplain-sst2")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not (a.model / "config.json").exists():
        raise SystemExit(f"{a.model}: no saved model; run `python bench/run.py selfexplain --only selfexplain-sst2` first")
    test = load_classification("sst2").test
    picked = sorted(random.Random(a.seed).sample(range(len(test.texts)), a.n))
    texts = [test.texts[i] for i in picked]
    rows = api.explain(a.model, texts, top=3)
    out = [{"index": i, "text": r["text"], "gold": test.labels[i], "predicted": r["label"],
            "spans": r["explanation"]["spans"]} for i, r in zip(picked, rows)]
    for r in out:  # the character ranges must give back the span texts
        assert all(r["text"][s["start"]:s["end"]] == s["text"] for s in r["spans"] if s["start"] is not None)
    result = {"command": "python bench/rationales.py " + " ".join(sys.argv[1:]), "model": str(a.model),
              "date": time.strftime("%Y-%m-%d %H:%M"), "rows": out}
    (HERE / "results" / "rationales-sst2.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
    for r in out:
        print(f"[{r['gold']} → {r['predicted']}] {r['text']}")
        for s in r["spans"]:
            print(f"    {s['weight']:.2f}  {s['text']!r}")


if __name__ == "__main__":
    main()

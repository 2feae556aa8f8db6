"""`contrastive` against SetFit, sample by sample, at K per class (issue 21): every result file in
bench/results that holds both on the same (dataset, K, seed) sample.

  python bench/contrastive_vs_setfit.py            # K = 16
  python bench/contrastive_vs_setfit.py --shots 8

contrastive's rows come from bench/few_shot.py's files of its current defaults
(few_shot_contrastive2_*.json), SetFit's from bench/setfit_peer.py's (setfit_peer*.json). Where a
sample has more than one row of a method, the run fails rather than choosing one.
"""
from __future__ import annotations

import argparse
import json
import statistics as st
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def rows(shots: str) -> dict[tuple[str, int], dict[str, tuple[float, float, str]]]:
    """(data, seed) → method → (accuracy, seconds, file name)."""
    out: dict[tuple[str, int], dict[str, tuple[float, float, str]]] = {}
    files = sorted(RESULTS.glob("few_shot_contrastive2_*.json")) + sorted(RESULTS.glob("setfit_peer*.json"))
    for f in files:
        for r in json.loads(f.read_text())["rows"]:
            if r["method"] in ("contrastive", "setfit") and str(r["shots"]) == shots:
                cell = out.setdefault((r["data"], r["seed"]), {})
                if r["method"] in cell:
                    raise SystemExit(f"{r['data']} seed {r['seed']}: {r['method']} is in both {cell[r['method']][2]} "
                                     f"and {f.name}")
                cell[r["method"]] = (r["accuracy"], r["seconds"], f.name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shots", default="16")
    a = ap.parse_args()
    cells = rows(a.shots)
    print("| data | samples (seeds) | contrastive | SetFit | mean difference | sd of the difference | "
          "standard error | contrastive ahead or level | seconds: contrastive / SetFit |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for data in dict.fromkeys(d for d, _ in sorted(cells)):
        both = sorted((s, v) for (d, s), v in cells.items() if d == data and len(v) == 2)
        if not both:
            continue
        c = [v["contrastive"][0] for _, v in both]
        t = [v["setfit"][0] for _, v in both]
        diff = [x - y for x, y in zip(c, t)]
        sd = st.stdev(diff) if len(diff) > 1 else float("nan")
        secs = (st.mean(v["contrastive"][1] for _, v in both), st.mean(v["setfit"][1] for _, v in both))
        print(f"| {data} | {len(both)} ({','.join(str(s) for s, _ in both)}) | {st.mean(c):.2f} | {st.mean(t):.2f} | "
              f"{st.mean(diff):+.2f} | {sd:.2f} | {sd / len(diff) ** 0.5:.2f} | {sum(d >= 0 for d in diff)} of {len(diff)} | "
              f"{secs[0]:.0f} / {secs[1]:.0f} (1/{secs[1] / secs[0]:.0f}) |")


if __name__ == "__main__":
    main()

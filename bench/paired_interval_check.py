"""compare's difference interval against McNemar's exact test, which the same line reports: how often does the
interval leave out 0 where the test cannot tell the models apart (p ≥ 0.05), or the reverse?

Both methods are scored on every pair of counts (b examples only the first model got right, c only the other) with
b < c, b + c ≤ 99, on N examples (the rest right by both or wrong by both, which neither method depends on):
- "bootstrap": the percentile bootstrap of the examples (1,000 multinomial draws over the four right/wrong cells,
  seed 0) that train.paired gave up to 2026-11-29 (written out here as it was);
- "exact": train.paired now, the exact conditional interval (Clopper-Pearson for c / (b + c), times (b + c) / N).

  OMP_NUM_THREADS=1 python bench/paired_interval_check.py [--n 300]
"""
from __future__ import annotations

import argparse

import numpy as np

from frozentune.train import paired


def bootstrap_interval(b: int, c: int, n: int, level: float = 0.95, resamples: int = 1000) -> list[float]:
    """The interval train.paired computed before: percentiles of 100·(c* − b*)/N over seeded multinomial draws."""
    cells = np.array([(n - b - c) // 2, b, c, n - b - c - (n - b - c) // 2])
    draws = np.random.default_rng(0).multinomial(n, cells / n, size=resamples)
    return [float(v) for v in np.percentile(100.0 * (draws[:, 2] - draws[:, 1]) / n,
                                            [100 * (1 - level) / 2, 100 * (1 + level) / 2])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    n = ap.parse_args().n
    cases, disagree, examples = 0, {"bootstrap": 0, "exact": 0}, []
    for d in range(1, 100):
        for c in range(d // 2 + 1, d + 1):
            b = d - c
            first = np.array([True] * b + [False] * c + [True] * (n - d))
            other = np.array([False] * b + [True] * c + [True] * (n - d))
            p = paired(first, other)
            significant = p["mcnemar_p"] < 0.05
            cases += 1
            for name, band in (("bootstrap", bootstrap_interval(b, c, n)), ("exact", p["interval"])):
                if (band[0] > 0) != significant:
                    disagree[name] += 1
                    if name == "bootstrap" and len(examples) < 3:
                        examples.append(f"{c} against {b}: p = {p['mcnemar_p']:.4f}, bootstrap {band[0]:+.2f} to "
                                        f"{band[1]:+.2f}, exact {p['interval'][0]:+.2f} to {p['interval'][1]:+.2f}")
    print(f"N = {n}: {cases} pairs of counts (b < c, b + c ≤ 99); the interval and McNemar's p < 0.05 disagree in "
          f"{disagree['bootstrap']} with the bootstrap, {disagree['exact']} with the exact interval")
    for line in examples:
        print("  e.g.", line)


if __name__ == "__main__":
    main()

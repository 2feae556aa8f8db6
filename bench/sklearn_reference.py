"""Reference for the probe: scikit-learn logistic regression (lbfgs, C=1) on the same
mean-pooled frozen MiniLM states that `probe` reads from the feature cache, same splits.

  python bench/sklearn_reference.py trec sst5     # writes bench/results/sklearn-lr-NAME.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from frozentune.api import BackboneOptions, SourceFactory
from frozentune.data import load_classification
from frozentune.head import masked_mean
from frozentune.train import metrics

HERE = Path(__file__).resolve().parent


def pooled(source) -> np.ndarray:
    """(N, D) mean-pooled states of every example of a cached source."""
    out = []
    for s in range(0, len(source), 512):
        b = source.batch(np.arange(s, min(s + 512, len(source))))
        out.append(masked_mean(b.hidden, b.mask).numpy())
    return np.concatenate(out)


def main(names: list[str]) -> None:
    from sklearn.linear_model import LogisticRegression

    bb = BackboneOptions().load()
    for name in names:
        ds = load_classification(name)
        sources = SourceFactory(bb, False, None, False, False)
        x_train, x_test = pooled(sources(ds.train)), pooled(sources(ds.test))
        t0 = time.perf_counter()
        clf = LogisticRegression(max_iter=3000).fit(x_train, ds.label_ids(ds.train))
        secs = time.perf_counter() - t0
        m = metrics(ds.label_ids(ds.test), clf.predict(x_test), len(ds.labels))
        row = {"name": f"sklearn-lr-{name}", "reference": True, "data": name, "metrics": m, "fit_seconds": secs,
               "command": f"python bench/sklearn_reference.py {name}", "date": time.strftime("%Y-%m-%d %H:%M")}
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / f"sklearn-lr-{name}.json").write_text(json.dumps(row, indent=2))
        print(f"{name}: sklearn logistic regression test accuracy {m['accuracy']:.2f}, macro-F1 {m['macro_f1']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["trec", "sst5"])

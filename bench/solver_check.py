"""Which solver is nearer the exact optimum of LogisticRegression(C=1) on few-shot pooled states:
scikit-learn's as bench/few_shot.py's reference runs it (max_iter 1000, default tol 1e-4) or
frozentune's fit_convex (float32 L-BFGS, what the probe and the heads' fallback solve)? The
objective, in float64, at each solution less its value at a float64 solve to tol 1e-12, and how
many test predictions each changes against that solve. Cells: the few-shot table's cells where
a head that fell back to the regression sat 0.02-0.1 points under the reference.

  OMP_NUM_THREADS=1 python bench/solver_check.py > bench/results/solver_check.txt
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

sys.path.insert(0, "bench")
from few_shot import pooled  # noqa: E402

from frozentune import api  # noqa: E402
from frozentune.crossval import fit_convex  # noqa: E402
from frozentune.data import load_classification  # noqa: E402

CELLS = [("sst2", 64, 0), ("sst2", 64, 1), ("sst5", 8, 0), ("sst5", 8, 3), ("sst2", 8, 3)]


def objective(W: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray, C: float) -> float:
    """scikit-learn's LogisticRegression objective divided by n, in float64: the binary form for one
    weight row (two classes), the multinomial one otherwise."""
    x = x.astype(np.float64)
    n = len(y)
    if W.shape[0] == 1:
        z = x @ W[0] + b[0]
        s = np.where(y == 1, 1, -1)
        return np.mean(np.logaddexp(0, -s * z)) + (W ** 2).sum() / (2 * C * n)
    z = x @ W.T + b
    z = z - z.max(1, keepdims=True)
    ce = -(z[np.arange(n), y] - np.log(np.exp(z).sum(1))).mean()
    return ce + (W ** 2).sum() / (2 * C * n)


class PooledRows:
    """Pooled states as the Source that fit_convex reads: len() and batch(idx).to(device)."""

    def __init__(self, x: np.ndarray):
        self.x = torch.from_numpy(x)

    def __len__(self) -> int:
        return len(self.x)

    def batch(self, idx: np.ndarray) -> "PooledBatch":
        return PooledBatch(self.x[idx])


class PooledBatch:
    def __init__(self, x: torch.Tensor):
        self.x = x

    def to(self, device) -> "PooledBatch":
        return self


class Linear(torch.nn.Module):
    """The probe's convex part alone, as fit_convex sees a model: .labels, .features of a batch, and a
    .head with .convex_inputs and the linear layer .out (here the model is its own head)."""

    def __init__(self, dim: int, classes: int):
        super().__init__()
        self.out = torch.nn.Linear(dim, classes)
        self.labels = list(range(classes))

    @property
    def head(self) -> "Linear":
        return self

    def features(self, b: PooledBatch) -> torch.Tensor:
        return b.x

    def convex_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return x


def main() -> None:
    torch.set_num_threads(1)
    bb = api.BackboneOptions(layers="-1").load()
    for data, shots, seed in CELLS:
        ds = load_classification(data, seed=seed, shots=shots, carve_below=1000)
        sf = api.SourceFactory(bb, False, None, False, False)
        xtr, xte = (pooled(sf(getattr(ds, s)), len(getattr(ds, s))) for s in ("train", "test"))
        ytr, yte = (np.asarray(ds.label_ids(getattr(ds, s))) for s in ("train", "test"))
        C = len(ds.labels)
        sk = LogisticRegression(max_iter=1000).fit(xtr, ytr)
        exact = LogisticRegression(max_iter=100000, tol=1e-12).fit(xtr.astype(np.float64), ytr)
        torch.manual_seed(seed)
        m = Linear(xtr.shape[1], C)
        fit_convex(m, PooledRows(xtr), ytr, 1.0)
        W = m.out.weight.detach().double().numpy()
        b = m.out.bias.detach().double().numpy()
        if C == 2:  # the softmax's two rows as scikit-learn's one weight vector on the logit difference
            W, b = (W[1] - W[0])[None], np.array([b[1] - b[0]])
        ours_pred = (xte @ W.T + b).argmax(1) if C > 2 else ((xte @ W[0] + b[0]) > 0).astype(int)
        J = {"sklearn": objective(sk.coef_, sk.intercept_, xtr, ytr, 1.0), "frozentune": objective(W, b, xtr, ytr, 1.0),
             "exact": objective(exact.coef_, exact.intercept_, xtr, ytr, 1.0)}
        ep = exact.predict(xte)
        print(f"{data} K={shots} seed {seed}: objective − exact: sklearn {J['sklearn']-J['exact']:.2e}, frozentune "
              f"{J['frozentune']-J['exact']:.2e}; test acc sklearn {100*(sk.predict(xte)==yte).mean():.2f} frozentune "
              f"{100*(ours_pred==yte).mean():.2f} exact {100*(ep==yte).mean():.2f}; predictions ≠ exact: sklearn "
              f"{(sk.predict(xte)!=ep).sum()} frozentune {(ours_pred!=ep).sum()}", flush=True)


if __name__ == "__main__":
    main()

"""Few-label heads anchored on a logistic regression over the same states.

With a few dozen labelled examples a head with 10⁴-10⁵ parameters from a random start does not
reliably catch up with a convex model on pooled states (bench/REPORT.md, Few labels: Y-Tuning up
to 11 points under scikit-learn's LogisticRegression at 8 per class, space up to 5.6 under it on
its own layer). Below --cv-below examples a frozen head is therefore trained as a correction:

    logits = A · mean(h) + b + g · head(h)                                        (B, C)

- A, b: scikit-learn's LogisticRegression(C=1) objective on the mean-pooled states of the layers
  the head reads, solved exactly (L-BFGS, `solve`) on the examples the head is trained on, then
  fixed. It is what `frozentune train --method probe` fits on those states.
- g: one scalar, 0 at the start and trained with the head (as ReZero scales a residual branch):
  at step 0 the model is the logistic regression, and every step lets the head move it.
- Cross-validation (crossval.fit_cv) scores step 0 among its candidate step counts, so the folds
  decide how far the head moves the regression, possibly not at all. result.json and the saved
  config.json record the anchor; `explain` gives the head's own explanation and says how much of
  the score is the head's (g).

`--anchor off` trains the bare head as before. The head's own loss (Y-Tuning's margin, space's
intra/inter-space terms) is computed on the anchored logits.

Legend: B batch, T tokens, D hidden size, C classes.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn

from .head import Explanation, Features, Head, Output, TokenView, masked_mean

ANCHOR_C = 1.0  # scikit-learn's default, what the probe keeps on few labels (crossval.C_DEFAULT)


def lbfgs_logistic(logits: Callable[[], Tensor], params: list[nn.Parameter], y: Tensor, c: float,
                   max_iter: int = 500) -> None:
    """Minimise scikit-learn's LogisticRegression(C=c) objective divided by N over `params` in place:
    mean cross-entropy(logits() (N, C), y) + penalty·||W||²/(2·c·N), matrices penalised, biases not,
    by full-batch L-BFGS with a strong Wolfe line search.

    penalty is 1, except for two classes, where scikit-learn fits one weight vector w on the logit
    difference: the softmax's rows at its optimum are w₁ = −w₂ = w/2, whose squared norms add up to
    ||w||²/2, so the penalty is doubled there and both solve the same problem."""
    opt = torch.optim.LBFGS(params, lr=1, max_iter=max_iter, history_size=20, tolerance_grad=1e-7,
                            tolerance_change=1e-10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        z = logits()
        penalty = 2.0 if z.shape[1] == 2 else 1.0
        loss = torch.nn.functional.cross_entropy(z, y)
        loss = loss + penalty * sum((p * p).sum() for p in params if p.ndim >= 2) / (2 * c * len(y))
        loss.backward()
        return loss

    opt.step(closure)


class Anchored(Head):
    """`inner` (any classification head) as a correction on a fixed logistic regression; see the
    module docstring. Explanation tensors are the inner head's."""

    def __init__(self, inner: Head, dim: int, num_labels: int):
        super().__init__()
        self.inner = inner
        self.anchor = nn.Linear(dim, num_labels)
        self.anchor.requires_grad_(False)  # solved by `solve`, never by the optimiser
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, f: Features) -> Output:
        out = self.inner(f)
        base = self.anchor(masked_mean(f.hidden.to(self.anchor.weight.dtype), f.mask))  # (B, C)
        return Output(base + self.gate * out.logits, out.extras)

    def loss(self, out: Output, labels: Tensor) -> Tensor:
        return self.inner.loss(out, labels)

    def explain(self, out: Output, tokens: TokenView, labels: list[str], top: int) -> Explanation:
        ex = self.inner.explain(out, tokens, labels, top)
        g = float(self.gate.detach())
        data = {**ex.data, "anchor": {"gate": round(g, 4), "what": "logits = logistic regression on the mean-pooled "
                                      "states + gate × this head's scores (trained on few labels)"}}
        return Explanation(data, [*ex.lines, f"(trained on few labels: the scores are a logistic regression on the "
                                             f"pooled states plus {g:.3f} × this head's)"])

    @torch.no_grad()
    def pooled(self, batches) -> Tensor:
        """(N, D) mean-pooled states of the given batches (each with .hidden (B, T, D), .mask)."""
        return torch.cat([masked_mean(b.hidden.to(self.anchor.weight.dtype), b.mask) for b in batches])

    def solve(self, x: Tensor, y: np.ndarray | Tensor, c: float = ANCHOR_C) -> None:
        """Fit the anchor on pooled states x (N, D) and labels y (N,) (see lbfgs_logistic); the gate
        is set to 0, so the model is then exactly that logistic regression."""
        y_t = torch.as_tensor(np.asarray(y), device=x.device)
        with torch.enable_grad():
            self.anchor.requires_grad_(True)
            try:
                lbfgs_logistic(lambda: self.anchor(x), list(self.anchor.parameters()), y_t, c)
            finally:
                self.anchor.requires_grad_(False)
        with torch.no_grad():
            self.gate.zero_()


def anchored(head: Head) -> Anchored | None:
    """The Anchored wrapper a classifier's head is, or None."""
    return head if isinstance(head, Anchored) else None

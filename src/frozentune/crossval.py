"""Training from few labels: stratified k-fold cross-validation on train picks the number of
optimiser steps, then the head is refit on all of train for that many.

Below `TrainConfig.cv_below` examples a validation split would hold a handful of examples (the
run that motivated this: "29 train / 3 validation", stopped at epoch 1), so frozen heads are not
early-stopped on one. Instead each fold trains a fresh head (same seed, same initialisation) on
k-1 folds for the planned schedule with a constant rate after warm-up, scoring the held-out fold
at geometrically spaced checkpoints; the fewest steps whose mean held-out accuracy is within one
standard error of the best checkpoint's (one_se) is the number of steps of the refit. With a constant
rate, a fold's model at step s is the model a run of s steps gives, so the refit runs exactly the
schedule that was scored.

With `--average-folds on` (auto: where the head's `average_folds` says so; Y-Tuning) the fold models at the
chosen step are kept, and the head's weights are the mean of the refit's and theirs: all start from one
initialisation and train a few dozen steps on mostly the same examples, so their mean is a model of its
own (a uniform "model soup", Wortsman et al. 2022) that varies less with the draw of a handful of
examples. Measured on held-out rows that were neither trained on nor test (bench/soup_dev.py): Y-Tuning,
in the 17 runs of 45 where the folds kept the head, gained 5.1 points on average, winning 16 and losing 1;
the self-explaining head lost in all 7 runs that kept it (1.4 points on average), so it keeps the refit
alone.

Legend: N training examples, k folds, R checkpoints.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    import torch

from . import distributed
from .data import first_rows, split_by_groups
from .model import Batch, Classifier, Source
from .train import (FitResult, HeldOut, Schedule, TrainConfig, eval_batches, fit, plan_steps, predict_logits, scored,
                    scores, silent, trained_weights)

# The fold models' weights kept at every checkpoint (to average those at the chosen step) are at most
# this many bytes; a head larger than that (k folds × R checkpoints × its trainable parameters) is not
# averaged, and the run says so. Y-Tuning's 450k parameters: 90 MB.
SOUP_BYTES = 512 * 2 ** 20

CHECKPOINTS = 10  # held-out scores per fold run (R)
# A head whose loss is convex in its parameters (the probe: a linear layer on pooled states, no
# dropout) is solved exactly instead: full-batch L-BFGS on the objective of scikit-learn's
# LogisticRegression(C) (fit_convex), with C from C_GRID.
# C_DEFAULT (scikit-learn's) is kept unless the folds show another C better by more than one
# standard error: on 18 few-shot samples (bench/probe_c_choice.py) no rule of choosing C from the
# folds beat C=1 on test accuracy (49.7-50.0 against 50.1), the folds being too small to tell.
C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)
C_DEFAULT = 1.0


def checkpoints(total: int, r: int = CHECKPOINTS) -> tuple[int, ...]:
    """R steps from total/20 to total, spaced geometrically: the best count for a few dozen
    examples is often a few dozen steps, so the short end is sampled more finely."""
    lo = max(1, total / 20)
    return tuple(sorted({int(round(lo * (total / lo) ** (i / (r - 1)))) for i in range(r)})) if total > 1 else (1,)


@dataclass
class Subset:
    """Rows `idx` of a source, as a source (what a fold trains or is scored on)."""
    src: Source
    idx: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return self.src.lengths[self.idx]

    def __len__(self) -> int:
        return len(self.idx)

    def batch(self, idx: np.ndarray) -> Batch:
        return self.src.batch(self.idx[idx])


def folds(y: np.ndarray, k: int, seed: int, groups: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """k stratified, seeded (train rows, held-out rows) pairs: every example is held out exactly
    once, and each class is spread over the folds as evenly as its count allows. groups (N,): rows
    of one group (copies of one text, data.text_groups) are held out together, so that no fold is
    scored on a text it trained on; the folds are then those of the groups' first rows. Without
    copies (or groups None) they are the plain folds."""
    from sklearn.model_selection import StratifiedKFold

    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    if groups is None or len(np.unique(groups)) == len(groups):
        return [(np.sort(a), np.sort(b)) for a, b in skf.split(np.zeros(len(y)), y)]
    first = first_rows(groups)  # each group by its first row (its label)
    return [split_by_groups(groups, held_g) for _, held_g in skf.split(np.zeros(len(first)), y[first])]


def repeated_folds(y: np.ndarray, k: int, seed: int, repeats: int = 1,
                   groups: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """`repeats` × k stratified folds: repeat r splits with seed + r, so repeat 0 is folds(y, k, seed)
    and one repeat is plain k-fold."""
    return [f for r in range(repeats) for f in folds(y, k, seed + r, groups)]


def choose_folds(y: np.ndarray, k: int, labels: list[str], groups: np.ndarray | None = None) -> tuple[int, str | None]:
    """(folds to use, a note where it differs from k): k, or the smallest class count when a class
    has fewer than k examples (at least 2); 0 when some class has a single example (no fold could
    both train on it and hold it out). With groups, a class's count is of the distinct texts that
    hold it (copies of one text are held out together; a text that is also labelled as another
    class counts for both), and the note says so where rows are copies."""
    smallest, what = smallest_class(y, labels, groups)
    if smallest >= k:
        return k, None
    if smallest >= 2:
        return smallest, f"{what}, fewer than --cv-folds {k}: {smallest}-fold cross-validation"
    return 0, f"{what}, so no fold could hold it out: no cross-validation (give 2 or more distinct examples per class)"


def smallest_class(y: np.ndarray, labels: list[str], groups: np.ndarray | None = None) -> tuple[int, str]:
    """(the count of the class with the fewest examples present, "class 'x' has …" saying it): with
    groups, the count is of the distinct texts holding the class, and the phrase names the copies."""
    rows = np.bincount(y, minlength=len(labels))
    if groups is None:
        counts = rows
    else:
        counts = np.array([len(np.unique(groups[y == c])) for c in range(len(labels))])
    smallest = int(counts[rows > 0].min())
    c = int(np.flatnonzero((counts == smallest) & (rows > 0))[0])
    copies = int(rows[c]) > smallest
    if smallest >= 2:
        what = f"{smallest} distinct training texts ({rows[c]} rows, the others copies)" if copies else \
            f"{smallest} training examples"
    else:
        what = f"a single distinct training text ({rows[c]} rows: copies of it)" if copies else \
            "a single training example"
    return smallest, f"class {labels[c]!r} has {what}"


def best_candidate(acc: np.ndarray, mean_loss: np.ndarray, k: int | None = None) -> tuple[int, float]:
    """From (k, R) held-out accuracies: the best candidate (highest mean accuracy, then lowest mean
    cross-entropy) and the standard error of its mean over the k folds. With repeated folds the rows
    are k·repeats folds, and `k` says how many of them are independent: the standard error is the
    rows' spread over √k, not over √rows."""
    mean = acc.mean(0)
    best = max(range(acc.shape[1]), key=lambda j: (round(float(mean[j]), 9), -float(mean_loss[j])))
    return best, float(acc[:, best].std(ddof=1) / np.sqrt(k or acc.shape[0])) if acc.shape[0] > 1 else 0.0


def one_se(acc: np.ndarray, mean_loss: np.ndarray, prefer: int | None = None, k: int | None = None) -> int:
    """The choice among candidates ordered simplest first (fewest steps, smallest C), from (k, R)
    held-out accuracies: the simplest whose mean accuracy is within one standard error of the best
    candidate's (the one-standard-error rule, Hastie et al., ESL §7.10). With a few held-out
    examples per fold the best mean is mostly noise; the rule trades it for the simpler model.
    The best candidate is the highest mean accuracy, then the lowest mean cross-entropy.
    `prefer`: a default kept unless the best beats it by more than one standard error. `k`: see
    best_candidate."""
    mean = acc.mean(0)
    best, se = best_candidate(acc, mean_loss, k)
    if prefer is not None:
        return prefer if mean[prefer] >= mean[best] - se - 1e-9 else best
    return next(j for j in range(acc.shape[1]) if mean[j] >= mean[best] - se - 1e-9)


def keep_regression(acc: np.ndarray, mean_loss: np.ndarray, k: int | None = None, margin: float = 1.0) -> dict:
    """Whether the logistic regression (column 0 of the (k, 1 + R) held-out accuracies) is kept over
    the head (columns 1..R, its checkpoints). The regression is one candidate; the head's best mean is
    the best of R, so it is biased upward, more so the noisier the folds. That optimism is estimated
    as the mean over folds of each fold's own best checkpoint less the checkpoint chosen for all
    (Tibshirani & Tibshirani 2009, "A bias correction for the minimum error rate in
    cross-validation") and subtracted; the regression, the simpler model, is then kept unless the
    head's corrected accuracy beats it by more than `margin` standard errors (one, the one-standard-error
    rule of one_se, unless the head's `fallback_margin` says more)."""
    head = acc[:, 1:]
    best, se = best_candidate(head, mean_loss[1:], k)
    head_best = float(head[:, best].mean())
    optimism = float((head.max(1) - head[:, best]).mean())
    corrected, regression = head_best - optimism, float(acc[:, 0].mean())
    return {"keep": regression >= corrected - margin * se - 1e-9, "regression": regression, "head_best": head_best,
            "optimism": optimism, "head_corrected": corrected, "se": se, "margin": margin}


def fit_cv(build: Callable[[], Classifier], train: Source, y: np.ndarray, val: Source | None,
           y_val: np.ndarray | None, cfg: TrainConfig, log: Callable[[str], None] = print,
           fallback: Callable[[], Classifier] | None = None,
           groups: np.ndarray | None = None) -> tuple[Classifier, FitResult, dict]:
    """(model refit on all of train, its FitResult, what cross-validation did). `build()` makes a
    fresh classifier with the run's seed. `val`, when given, is scored after every refit round for
    the record only; it chooses nothing.

    `fallback()`: a convex probe on the same states. The folds then also score it (solved with
    C_DEFAULT, as scikit-learn's LogisticRegression() would be) as the simplest candidate, before
    the head's checkpoints; when keep_regression keeps it, the probe solved on all of train is
    returned instead of the head, and the log and info say so.

    `groups` (N,): copies of one text share a number (data.text_groups); a fold holds them out together."""
    first = build()
    copies = 0 if groups is None else len(groups) - len(np.unique(groups))
    if not copies:
        groups = None  # no copies: the plain folds
    k, note = choose_folds(y, cfg.cv_folds, first.labels, groups)
    if copies:
        log(f"cross-validation: {copies} training rows repeat an earlier text; a fold holds "
            f"out every copy of a text together")
    if note:
        log(f"cross-validation: {note}")
    if getattr(first.head, "convex", False):
        return fit_convex_cv(build, k, note, train, y, val, y_val, cfg, log, groups)
    plan = plan_steps(len(y), cfg, constant=True)
    plan = dataclasses.replace(plan, at=checkpoints(plan.total))
    info: dict = {"how": "cross-validation", "folds": k, "note": note, "schedule": plan.why, "fallback": None}
    if cfg.cv_repeats > 1:
        info["repeats"] = cfg.cv_repeats
    t0 = time.perf_counter()
    if k >= 2:
        acc, loss, regression = [], [], fallback is not None
        logits: list[list[np.ndarray]] = []  # per fold, its held-out rows' (n_i, C) logits at each candidate
        if regression:  # said where there are folds to score it (it was said beside "none possible" too)
            log(f"few labels: the folds also score a logistic regression on the same states (a probe with C="
                f"{C_DEFAULT:g}, scikit-learn's default; --method probe chooses its C on the folds), and the run "
                f"keeps it instead of the head where the head does no better on them (--fallback off: the head)")
        x_lr = convex_inputs(fallback().to(cfg.device), train) if regression else None  # type: ignore[misc]
        splits = repeated_folds(y, k, cfg.seed, cfg.cv_repeats, groups)
        kept: list[list[dict]] | None = None  # per fold, its trainable weights at each checkpoint
        if cfg.average_folds == "on" or (cfg.average_folds == "auto" and getattr(first.head, "average_folds", False)):
            size = sum(p.numel() * p.element_size() for p in first.parameters() if p.requires_grad)
            if size * len(splits) * len(plan.at) <= SOUP_BYTES:
                kept = []
            else:
                log(f"cross-validation: the fold models are not averaged: keeping their weights at {len(plan.at)} "
                    f"checkpoints would take {size * len(splits) * len(plan.at) / 2 ** 20:,.0f} MB, over the "
                    f"{SOUP_BYTES // 2 ** 20} MB allowed for it, so the refit alone is the model")
        for i, (tr, held) in enumerate(splits):
            # the logistic regression on this fold: the first, simplest candidate
            lr = [convex_fold(fallback, x_lr, train, y, tr, held, C_DEFAULT, cfg)] if regression else []  # type: ignore[arg-type]
            logits.append([z for _, z in lr])  # the fold's held-out logits, of each candidate in order
            lr = [m for m, _ in lr]
            model = build()
            on_round = None
            if kept is not None:
                kept.append([])
                on_round = lambda m=model, mine=kept[-1]: mine.append(trained_weights(m))  # noqa: E731
            r = fit(model, Subset(train, tr), y[tr], Subset(train, held), y[held], cfg, silent, plan, select=False,
                    on_round=on_round, keep_logits=logits[-1])
            acc.append([m["accuracy"] for m in lr] + [h["val_accuracy"] for h in r.history])
            loss.append([m["loss"] for m in lr] + [h["val_loss"] for h in r.history])
            steps = [h["step"] for h in r.history]
        acc_k, mean_loss = np.asarray(acc), np.mean(loss, 0)
        mean_acc = acc_k.mean(0)
        head = slice(1 if regression else 0, None)
        pick = one_se(acc_k[:, head], mean_loss[head], k=k)  # the head's steps, as without the regression
        names = (["LR"] if regression else []) + [str(s) for s in steps]
        margin = float(getattr(first.head, "fallback_margin", 1.0))
        choice = keep_regression(acc_k, mean_loss, k, margin) if regression else None
        fell_back = bool(choice and choice["keep"])
        chosen = 0 if fell_back else steps[pick]
        info |= {"score": float(mean_acc[0] if fell_back else mean_acc[head][pick]), "checkpoints": steps,
                 "mean_accuracy": mean_acc[head].tolist(), "std_accuracy": acc_k.std(0)[head].tolist(),
                 "mean_loss": mean_loss[head].tolist(), "chosen_steps": chosen, "seconds": time.perf_counter() - t0}
        log(f"cross-validation: {k} folds{f' × {cfg.cv_repeats} repeats' if cfg.cv_repeats > 1 else ''} × {plan.total} steps ({plan.why}); held-out accuracy by step "
            + " ".join(f"{s}:{a:.1f}" for s, a in zip(names, mean_acc))
            + ("" if fell_back else f"; refit on all {len(y)} examples for {chosen} steps"))
        if choice:
            info["head_vs_regression"] = {name: v for name, v in choice.items() if name != "keep"}
            info["regression_accuracy"], info["regression_loss"] = float(mean_acc[0]), float(mean_loss[0])
            log(f"cross-validation: the head's best held-out accuracy {choice['head_best']:.1f} less its optimism "
                f"{choice['optimism']:.1f} (its folds' own best checkpoints over the one they share) is "
                f"{choice['head_corrected']:.1f}; the logistic regression on the same states (LR) has "
                f"{choice['regression']:.1f}, one standard error {choice['se']:.1f}"
                + ("" if margin == 1.0 else f"; this head is kept only where it beats the regression by more than "
                                            f"{margin:g} standard errors ({first.method}'s setting, from development rows)"))
        if fell_back:
            log(f"cross-validation: the head is not clearly better, so the model is that regression (C={C_DEFAULT:g}), "
                f"saved as a probe (--fallback off trains the head whatever the folds say)")
            model, fitted = convex_refit(fallback, x_lr, train, y, val, y_val, C_DEFAULT, cfg, t0)  # type: ignore[arg-type]
            info |= {"fallback": model.method, "C": C_DEFAULT}
            return model, dataclasses.replace(fitted, held_out=held_out(logits, splits, y, 0, k)), info
    else:
        chosen = plan.total
        info |= {"how": "planned schedule (no cross-validation possible)", "chosen_steps": chosen, "seconds": 0.0}
        log(f"cross-validation: none possible; the planned {chosen} steps are trained without selection")
    why = f"{chosen} steps chosen by cross-validation" if k >= 2 else f"the planned {chosen} steps (no cross-validation)"
    refit = Schedule(chosen, max(1, -(-chosen // 4)), plan.warmup, True, why)
    model = build()
    fitted = fit(model, train, y, val, y_val, cfg, log, refit, select=False)
    if k >= 2 and kept:
        at = info["checkpoints"].index(chosen)
        average_into(model, [fold[at] for fold in kept])
        info["averaged"] = 1 + len(kept)
        log(f"cross-validation: the head's weights are the mean of the refit's and the {len(kept)} fold models' at "
            f"step {chosen} (one initialisation: a model soup; --average-folds off keeps the refit alone)")
        if val is not None:  # the record's validation scores are of the model saved
            fitted.history[-1] |= {f"val_{k_}": v for k_, v in scored(model, val, y_val, cfg.eval_batch_size).items()}
    fitted = dataclasses.replace(fitted, train_seconds=fitted.train_seconds + info["seconds"],
                                 held_out=held_out(logits, splits, y, pick + (1 if regression else 0), k)
                                 if k >= 2 else None)
    return model, fitted, info


def held_out(logits: list[list[np.ndarray]], splits: list[tuple[np.ndarray, np.ndarray]], y: np.ndarray, j: int,
             k: int) -> HeldOut | None:
    """The out-of-fold logits of candidate j: each fold's held-out rows (splits[i][1]) as scored by that fold's
    model at candidate j (logits[i][j], (n_i, C)), all folds together, with their labels; k folds of N = len(y).
    None on a launcher's ranks other than 0: rank 0 alone scores a fold's held-out rows at each checkpoint
    (train.fit_loop) and sends the figures, not the logits; it alone saves the model, and so its temperature."""
    if any(len(fold) <= j for fold in logits):
        if distributed.is_main():  # every candidate of every fold was scored in one process: a bug, not a rank
            raise RuntimeError(f"cross-validation kept no held-out logits of candidate {j} for a fold "
                               f"({[len(f) for f in logits]} candidates)")
        return None
    return HeldOut(np.concatenate([fold[j] for fold in logits]), np.concatenate([y[held] for _, held in splits]),
                   len(y), k)


def average_into(model: Classifier, others: list[dict[str, "torch.Tensor"]]) -> None:
    """Set each trainable parameter of `model` to the mean of its own value and the same parameter in each
    of `others` (trained_weights of models built alike), in place, summed in float32."""
    import torch

    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                total = p.detach().float().clone()
                for o in others:
                    total += o[n].to(p.device).float()
                p.copy_((total / (1 + len(others))).to(p.dtype))


def convex_inputs(model: Classifier, src: Source, chunk: int = 512) -> "torch.Tensor":
    """(N, D) what a convex head's linear layer reads (head.convex_inputs) for every row of src, in
    src's order: computed once, so that a solve never re-reads the token states. Rows go through in
    chunks of `chunk` sorted by length, as evaluation batches them, so that a chunk is padded to
    lengths like its own, not to the longest of N (a live encoder's cost grows with the padding)."""
    import torch

    device = next(model.parameters()).device
    batches = eval_batches(src.lengths, chunk)  # rows by length, `chunk` at a time
    with torch.no_grad():
        x = torch.cat([model.head.convex_inputs(model.features(src.batch(b).to(device))) for b in batches])  # (N, D)
    out = torch.empty_like(x)
    out[torch.from_numpy(np.concatenate(batches)).to(x.device)] = x  # back in src's order
    return out


def fit_convex(model: Classifier, src: Source, y: np.ndarray, c: float, max_iter: int = 500) -> None:
    """solve_convex on the head's inputs for the rows of src (convex_inputs)."""
    solve_convex(model, convex_inputs(model, src), y, c, max_iter)


def solve_convex(model: Classifier, x: "torch.Tensor", y: np.ndarray, c: float, max_iter: int = 500) -> None:
    """Solve a convex head in place on its inputs x (N, D) (convex_inputs of the N training rows):
    scikit-learn's LogisticRegression(C=c) objective divided by N, mean cross-entropy +
    penalty·||W||²/(2·c·N) over its linear layer's weight (bias unpenalised), by full-batch L-BFGS
    with a strong Wolfe line search; each of the solver's evaluations is one (N, D) × (D, C) product.

    penalty is 1, except for two classes, where scikit-learn fits one weight vector w on the logit
    difference: the softmax's rows at its optimum are w₁ = −w₂ = w/2, whose squared norms add up to
    ||w||²/2, so the penalty is doubled there and both solve the same problem."""
    layer = model.head.out  # the only trained part of a convex head
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    if trained != {id(layer.weight), id(layer.bias)}:
        raise ValueError("solve_convex solves a head whose only trained parameters are its linear layer `out`")
    solve_linear(layer, x, y, c, len(model.labels), max_iter)
    model.eval()


def solve_linear(layer: "torch.nn.Linear", x: "torch.Tensor", y: np.ndarray, c: float, num_labels: int,
                 max_iter: int = 500) -> None:
    """Solve `layer` in place on inputs x (N, D): the objective of solve_convex (scikit-learn's
    LogisticRegression(C=c), divided by N), whatever else around it trains."""
    import torch

    y_t = torch.from_numpy(np.asarray(y)).to(x.device)
    penalty = 2.0 if num_labels == 2 else 1.0
    opt = torch.optim.LBFGS([layer.weight, layer.bias], lr=1, max_iter=max_iter, history_size=20, tolerance_grad=1e-7,
                            tolerance_change=1e-10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(layer(x), y_t)
        loss = loss + penalty * (layer.weight * layer.weight).sum() / (2 * c * len(y))
        loss.backward()
        return loss

    opt.step(closure)


def solve_output(model: Classifier, src: Source, y: np.ndarray) -> None:
    """For a head that declares `solves_output` (contrastive): after training, its linear layer `out`
    solved exactly on its inputs (convex_inputs, in eval mode) for every row of src, with inverse L2
    strength cfg.logreg_c."""
    model.eval()  # no dropout in the embeddings the regression is solved on
    x = convex_inputs(model, src)  # (N, D), without grad: the encoder is fixed from here
    solve_linear(model.head.out, x, y, float(model.head.cfg.logreg_c), len(model.labels))


def fit_convex_cv(build: Callable[[], Classifier], k: int, note: str | None, train: Source, y: np.ndarray,
                  val: Source | None, y_val: np.ndarray | None, cfg: TrainConfig, log: Callable[[str], None] = print,
                  groups: np.ndarray | None = None) -> tuple[Classifier, FitResult, dict]:
    """fit_cv for a convex head, over the k folds (and their note) fit_cv chose: the folds choose C
    from C_GRID (one_se, preferring C_DEFAULT), then the head is solved on all of train with it."""
    t0 = time.perf_counter()
    info: dict = {"how": "cross-validation", "solver": "lbfgs", "folds": k, "note": note, "grid": list(C_GRID)}
    if cfg.cv_repeats > 1 and k >= 2:
        info["repeats"] = cfg.cv_repeats
    chosen = C_DEFAULT
    x = convex_inputs(build().to(cfg.device), train)  # (N, D) once: every fold, C and the refit read rows of it
    if k >= 2:
        splits = repeated_folds(y, k, cfg.seed, cfg.cv_repeats, groups)
        acc = np.zeros((len(splits), len(C_GRID)))
        loss = np.zeros_like(acc)
        logits: list[list[np.ndarray]] = [[] for _ in splits]  # per fold, its held-out logits at each C
        for i, (tr, held) in enumerate(splits):
            for j, c in enumerate(C_GRID):
                m, z = convex_fold(build, x, train, y, tr, held, c, cfg)
                acc[i, j], loss[i, j] = m["accuracy"], m["loss"]
                logits[i].append(z)
        mean_acc, mean_loss = acc.mean(0), loss.mean(0)
        pick = one_se(acc, mean_loss, prefer=C_GRID.index(C_DEFAULT), k=k)
        chosen = C_GRID[pick]
        info |= {"score": float(mean_acc[pick]), "mean_accuracy": mean_acc.tolist(), "std_accuracy": acc.std(0).tolist(), "mean_loss": mean_loss.tolist()}
        log(f"cross-validation: {k} folds{f' × {cfg.cv_repeats} repeats' if cfg.cv_repeats > 1 else ''}, L-BFGS "
            f"(convex head) with L2 strength C: held-out accuracy "
            + " ".join(f"C={c:g}:{a:.1f}" for c, a in zip(C_GRID, mean_acc)) + f"; refit on all {len(y)} with C={chosen:g}")
    else:
        info["how"] = "exact solve (no cross-validation possible)"
        log(f"cross-validation: none possible; L-BFGS with C={chosen:g} (scikit-learn's default)")
    model, fitted = convex_refit(build, x, train, y, val, y_val, chosen, cfg, t0)
    info |= {"C": chosen, "seconds": fitted.train_seconds}
    if k >= 2:
        fitted = dataclasses.replace(fitted, held_out=held_out(logits, splits, y, pick, k))
    return model, fitted, info


def convex_fold(build: Callable[[], Classifier], x: "torch.Tensor", train: Source, y: np.ndarray, tr: np.ndarray,
                held: np.ndarray, c: float, cfg: TrainConfig) -> tuple[dict[str, float], np.ndarray]:
    """A fresh convex head solved (solve_convex, strength c) on rows `tr` of x, the head's inputs for
    train's rows, and scored on rows `held` of train: (its figures, its (len(held), C) logits there)."""
    model = build().to(cfg.device)
    solve_convex(model, x[tr], y[tr], c)
    z = predict_logits(model, Subset(train, held), cfg.eval_batch_size)
    return scores(z, y[held], len(model.labels)), z


def convex_refit(build: Callable[[], Classifier], x: "torch.Tensor", train: Source, y: np.ndarray,
                 val: Source | None, y_val: np.ndarray | None, c: float, cfg: TrainConfig, t0: float
                 ) -> tuple[Classifier, FitResult]:
    """A fresh convex head solved on all of train (x: its inputs for train's rows), and its FitResult:
    one round at step 0 with the validation metrics (when `val` is given); train_seconds counted from
    t0 (the cross-validation's start)."""
    model = build().to(cfg.device)
    t1 = time.perf_counter()
    solve_convex(model, x, y, c)
    val_m = scored(model, val, y_val, cfg.eval_batch_size) if val is not None else {}
    row = {"epoch": 1, "step": 0, **{f"val_{k_}": v for k_, v in val_m.items()}, "epoch_seconds": time.perf_counter() - t1}
    return model, FitResult([row], 1, time.perf_counter() - t0, False)

"""One training loop for every method: heads on cached features and methods that run the
backbone live. AdamW, linear warm-up/decay, seeded length-bucketed batches, early stopping on
validation accuracy (the best epoch's weights are restored), accuracy and macro-F1.

Started by `torchrun` or `accelerate launch` (WORLD_SIZE > 1), the loop runs data-parallel with
exact global-batch semantics: every rank draws the same global batch, computes the loss of its
contiguous slice weighted by the slice's share of the batch, and the gradients are summed over
the ranks before clipping and the step (see `distributed`). The update is the one-process update
on the global batch up to float summation order; only dropout differs (its masks are drawn per
slice, from a per-rank seed). Validation runs on rank 0 and its metrics are sent to every rank,
so all ranks take the same early-stopping decision; only rank 0 logs.
"""
from __future__ import annotations

import dataclasses
import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from . import distributed, interrupts
from .errors import FrozentuneError
from .fields import as_flag
from .registry import MethodError
from .model import Classifier, Source
from .rng import keeps_rng


# Defaults for small training sets (bench/few_shot.py measures them; REPORT.md "Few labels"):
# at 8 examples per class and batch 64 an epoch is one step, so 10-20 epochs were 10-20 steps and
# every head stayed at chance. MIN_STEPS is the floor of a run's optimiser steps. Below CV_BELOW
# examples a carved validation split has under 100 examples: its accuracy has a standard error of
# about 5 points, larger than the gains early stopping compares, so k-fold cross-validation on
# train chooses the number of steps instead.
MIN_STEPS = 200
CV_BELOW = 1000

# A round (epoch) that runs longer than this says where it is every this many seconds: a prefix on
# SmolLM2 spends about 5 minutes an epoch on one CPU thread, which was 5 minutes without a line.
PROGRESS_EVERY_S = 60.0


@dataclass
class TrainConfig:
    epochs: int = field(default=10, metadata={"help": "passes over the training set"})
    batch_size: int = field(default=64, metadata={"help": "examples per optimiser step"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate (AdamW)"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    warmup: float = field(default=0.06, metadata={"help": "fraction of steps of linear warm-up"})
    patience: int = field(default=3, metadata={"help": "epochs without validation gain before stopping (0: never stop early)"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0: off)"})
    seed: int = field(default=0, metadata={"help": "seed for initialisation, splits and batch order"})
    eval_batch_size: int = field(default=256, metadata={"help": "examples per evaluation batch"})
    device: str = field(default="cpu", metadata={"help": "torch device to train on (cpu, cuda, cuda:1 …)"})
    steps: int = field(default=0, metadata={"help": "optimiser steps in all (0: --epochs passes over train, at least --min-steps)"})
    min_steps: int = field(default=MIN_STEPS, metadata={
        "help": "the fewest optimiser steps a run takes however small train is, so 16 examples are seen often enough (0: no floor)"})
    cv_folds: int = field(default=5, metadata={
        "help": "below --cv-below training examples, stratified k-fold cross-validation on train picks the number of steps "
                "instead of early stopping on a handful of validation examples (0 or 1: off)"})
    cv_repeats: int = field(default=1, metadata={
        "help": "repeat the --cv-folds split this many times with other seeds (repeated stratified k-fold): every "
                "score is the mean over all k·R held-out folds, its standard error that of k folds (the repeats "
                "share their examples, so they are not independent); R times the cross-validation's cost"})
    cv_below: int = field(default=CV_BELOW, metadata={"help": "train size under which --cv-folds applies (frozen heads)"})
    fallback: str = field(default="auto", metadata={
        "help": "auto: where --cv-folds applies, the folds also score a logistic regression on the head's own states "
                "(a probe), which is the model unless the head's best held-out accuracy, less the optimism of taking the "
                "best of its checkpoints, beats it by more than one standard error; "
                "off: always the head", "choices": ("auto", "off")})
    calibrate: str = field(default="auto", metadata={
        "help": "auto: one temperature T is fitted on the logits of the examples that chose the model (the "
                "validation split, or under --cv-folds every training example as scored by the fold model that did "
                "not train on it): the probabilities softmax(logits / T) given the lowest cross-entropy there; every "
                "prediction stays as it was, so the scores mean what they say more closely; off: the head's own scale",
        "choices": ("auto", "off")})
    average_folds: str = field(default="auto", metadata={
        "help": "on: where --cv-folds chose a head's steps, its weights are the mean of the refit's and the fold "
                "models' at those steps (all from one initialisation: a uniform model soup); off: the refit alone; "
                "auto: the head's own choice, made on development rows (on for ytuning)",
        "choices": ("auto", "on", "off")})

    def validate(self) -> "TrainConfig":
        """Raise MethodError (a ValueError) naming the option (as typed on the command line) whose value cannot work."""
        from .fields import wrong_value

        if (why := wrong_value(self, flag=True)) is not None:  # e.g. epochs=1.5 or fallback="on" from Python
            raise MethodError(why)
        rules = [("epochs", self.epochs >= 1, "at least 1"), ("batch_size", self.batch_size >= 1, "at least 1"),
                 ("eval_batch_size", self.eval_batch_size >= 1, "at least 1"),
                 ("lr", math.isfinite(self.lr) and self.lr > 0, "a finite positive number"),
                 ("weight_decay", math.isfinite(self.weight_decay) and self.weight_decay >= 0, "0 or more"),
                 ("warmup", 0 <= self.warmup <= 1, "a fraction of the steps, 0 to 1"),
                 ("patience", self.patience >= 0, "0 (never stop early) or more"),
                 ("max_grad_norm", math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0, "0 (off) or more"),
                 ("steps", self.steps >= 0, "0 (from --epochs) or more"), ("min_steps", self.min_steps >= 0, "0 (no floor) or more"),
                 ("cv_folds", self.cv_folds >= 0, "0 or 1 (off), or at least 2 folds"), ("cv_below", self.cv_below >= 0, "0 (never) or more"),
                 ("cv_repeats", self.cv_repeats >= 1, "at least 1"),
                 ("seed", 0 <= self.seed < 2 ** 32, "a whole number from 0 to 4294967295 (what numpy and scikit-learn seed)")]
        for name, ok, want in rules:
            if not ok:
                raise MethodError(f"{as_flag(name)} {getattr(self, name)}: must be {want}")
        return self


def train_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                  bucket: int = 50) -> list[np.ndarray]:
    """Shuffled batches of examples of similar length: shuffle, sort chunks of bucket·B by
    length, cut into batches, shuffle the batches. Same rng state → same batches."""
    perm = rng.permutation(len(lengths))
    batches = []
    for s in range(0, len(perm), batch_size * bucket):
        chunk = perm[s:s + batch_size * bucket]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def eval_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    order = np.argsort(lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def metrics(y_true: np.ndarray, y_pred: np.ndarray, num_labels: int,
            positive: tuple[int, str] | None = None) -> dict[str, float]:
    """Accuracy and macro-F1 in percent; with `positive` (index, name), also the F1 of that class
    (`positive_f1`, as MRPC is reported). Macro-F1 averages over the classes that occur in the
    labels or the predictions (scikit-learn's default): a class of the model's `num_labels` that is
    neither in a small test split nor predicted has no F1, and counting it as 0 gave a split whose
    every example was right a macro-F1 of 50."""
    from sklearn.metrics import accuracy_score, f1_score

    present = sorted(set(np.asarray(y_true).tolist()) | set(np.asarray(y_pred).tolist()))
    out = {"accuracy": 100.0 * accuracy_score(y_true, y_pred),
           "macro_f1": 100.0 * f1_score(y_true, y_pred, average="macro", labels=present, zero_division=0)}
    if positive is not None:
        out["positive_f1"] = 100.0 * f1_score(y_true, y_pred, labels=[positive[0]], average="macro", zero_division=0)
    return out


def confusion(y_true: np.ndarray, y_pred: np.ndarray, num_labels: int) -> np.ndarray:
    """(C, C) counts: row i the examples whose true label is i, column j those predicted j."""
    matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(matrix, (np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)), 1)
    return matrix


def class_report(y_true: np.ndarray, y_pred: np.ndarray, labels: Sequence[str]) -> dict:
    """What `metrics` averages, class by class, for a user reading where a model errs:
    {"per_class": {label: {"precision", "recall", "f1" (percent), "support"}}, "confusion": {"labels", "matrix"}}.
    The matrix's row i holds the examples whose true label is labels[i], column j those predicted labels[j].
    A value with nothing to divide is None, not 0: precision of a class never predicted, recall of one absent from
    the split, F1 of a class neither present nor predicted (F1 = 2·tp / (2·tp + fp + fn), so macro_f1 is the
    mean of the F1s that are not None)."""
    matrix = confusion(y_true, y_pred, len(labels))
    tp, predicted, support = np.diag(matrix), matrix.sum(0), matrix.sum(1)

    def share(num: int, den: int) -> float | None:
        return 100.0 * num / den if den else None

    per_class = {lab: {"precision": share(tp[i], predicted[i]), "recall": share(tp[i], support[i]),
                       "f1": share(2 * tp[i], predicted[i] + support[i]), "support": int(support[i])}
                 for i, lab in enumerate(labels)}
    return {"per_class": per_class, "confusion": {"labels": list(labels), "matrix": matrix.tolist()}}


def calibration(y_true: np.ndarray, y_pred: np.ndarray, probs: np.ndarray, bins: int = 10) -> dict:
    """How far the probability a model gives its prediction is from how often it is right: the examples in
    `bins` equal slices of that probability (0-0.1, …, 0.9-1; the top one closed), each slice's mean probability
    and accuracy (percent; None for an empty slice), and the expected calibration error, the slices' |accuracy −
    mean probability| weighted by their share of the examples (percentage points; 0 for a model whose scores are
    as often right as they say). `y_pred`: the predictions scored (the logits' argmax, as `metrics` takes them);
    `probs`: (N, C) probabilities, rows summing to 1. "selective": the accuracy where the model answers only its
    surest examples (see selective)."""
    probs, y_pred = np.asarray(probs, dtype=np.float64), np.asarray(y_pred, dtype=np.int64)
    confidence, right = probs[np.arange(len(y_pred)), y_pred], y_pred == np.asarray(y_true)
    slot = np.minimum((confidence * bins).astype(np.int64), bins - 1)
    out, ece = [], 0.0
    for b in range(bins):
        inside = slot == b
        n = int(inside.sum())
        mean_p = 100.0 * float(confidence[inside].mean()) if n else None
        acc = 100.0 * float(right[inside].mean()) if n else None
        if n:
            ece += n / len(confidence) * abs(acc - mean_p)
        out.append({"from": b / bins, "to": (b + 1) / bins, "n": n, "confidence": mean_p, "accuracy": acc})
    return {"ece": ece if len(confidence) else None, "bins": out, "selective": selective(confidence, right)}


COVERAGES = (100, 90, 80, 50)  # percent of the examples answered, surest first (calibration's "selective")


def selective(confidence: np.ndarray, right: np.ndarray, coverages: Sequence[int] = COVERAGES) -> list[dict]:
    """Where a model answers only the examples it is surest of: for each coverage c (percent), its ceil(c·N/100)
    examples of highest probability (N,) `confidence` (ties: the earlier row first), how many, their accuracy
    (percent, of (N,) bools `right`) and `threshold`, the lowest probability among them (answering where the
    probability is at least that gives at least that coverage on these examples). [] for no examples."""
    if not len(confidence):
        return []
    order = np.argsort(-np.asarray(confidence, dtype=np.float64), kind="stable")
    out = []
    for c in coverages:
        k = max(1, -(-c * len(order) // 100))
        top = order[:k]
        out.append({"coverage": c, "n": int(k), "accuracy": 100.0 * float(np.asarray(right)[top].mean()),
                    "threshold": float(confidence[top].min())})
    return out


LEVEL, RESAMPLES = 0.95, 1000  # the intervals' coverage, and the bootstrap's resamples
# Under this many examples no F1 interval is given: a bootstrap only redraws the examples there are, so on a
# handful it is too narrow (every example right: [100, 100]); Wilson's interval for accuracy holds at any size
MIN_BOOTSTRAP = 100


def wilson(right: int, n: int, level: float = LEVEL) -> list[float]:
    """[low, high] in percent: the Wilson score interval of a proportion right / n (Wilson 1927), which stays
    inside [0, 100] and is not empty at 0 or n right, where the normal approximation's is."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p = right / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return [100.0 * max(0.0, (centre - half) / (1 + z * z / n)), 100.0 * min(1.0, (centre + half) / (1 + z * z / n))]


def _band(draws: np.ndarray, level: float, scale: float = 1.0) -> list[float]:
    """[low, high]: the percentile bootstrap's interval at `level` of a statistic's resampled values, times `scale`."""
    return [float(v) for v in scale * np.percentile(draws, [100 * (1 - level) / 2, 100 * (1 + level) / 2])]


def figures(m: dict, band: dict) -> str:
    """A run's figures as a log line gives them: accuracy with its interval, and macro-F1 (metrics, intervals)."""
    return (f"accuracy {m['accuracy']:.2f} ({band['level']:.0%} interval {band['accuracy'][0]:.2f}-"
            f"{band['accuracy'][1]:.2f})  macro-F1 {m['macro_f1']:.2f}")


def _f1s(matrix: np.ndarray) -> np.ndarray:
    """(R, C, C) confusion matrices (true, predicted) → (R, C) per-class F1 (0-1), NaN for a class neither
    present nor predicted (as `metrics` leaves it out of macro-F1)."""
    tp = np.diagonal(matrix, axis1=1, axis2=2).astype(np.float64)
    den = matrix.sum(1) + matrix.sum(2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, 2 * tp / den, np.nan)


def intervals(y_true: np.ndarray, y_pred: np.ndarray, num_labels: int, positive: tuple[int, str] | None = None,
              level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0) -> dict | None:
    """How far `metrics`' figures could move with another sample of the same size from the same source (of the test
    split, where train and eval give them):
    [low, high] (percent) at `level` for accuracy (wilson) and for macro-F1 (and positive_f1 with `positive`) by
    the percentile bootstrap (Efron & Tibshirani 1993), `resamples` draws of the N examples with replacement,
    seeded, so the same predictions give the same interval. An F1 depends only on the confusion counts, so a
    resample is a multinomial draw of N over the C × C cells: the same distribution, at no cost per example.
    The F1 intervals are None under MIN_BOOTSTRAP examples. Only the test sample's share of the uncertainty:
    training again with another seed moves a score too. None for an empty split."""
    n = len(y_true)
    if n == 0:
        return None
    matrix = confusion(y_true, y_pred, num_labels)
    out: dict = {"level": level, "n": n, "accuracy": wilson(int(np.trace(matrix)), n, level)}
    if n < MIN_BOOTSTRAP:
        out |= {"macro_f1": None} | ({"positive_f1": None} if positive is not None else {})
        how = f"F1: none under {MIN_BOOTSTRAP} examples, where a bootstrap's interval is too narrow"
    else:
        draws = np.random.default_rng(seed).multinomial(n, matrix.ravel() / n, size=resamples)
        f1 = _f1s(draws.reshape(resamples, num_labels, num_labels))  # (R, C)
        # over the classes macro-F1 averages on the whole sample (`metrics`: present or predicted there), each one a
        # resample happens to lack counted as F1 0 (scikit-learn's zero_division): a mean over fewer classes jumped
        # (a rare class right in none of its 2 examples, dropped from 13% of the resamples, widened 66-74 to 66-86)
        present = (matrix.sum(0) + matrix.sum(1)) > 0
        out["macro_f1"] = _band(np.nan_to_num(f1[:, present]).mean(1), level, 100.0)
        if positive is not None:
            out["positive_f1"] = _band(np.nan_to_num(f1[:, positive[0]]), level, 100.0)  # no F1 to divide: 0
        how = f"F1: percentile bootstrap, {resamples:,} resamples of the {n:,} examples (seed {seed})"
    out["how"] = (f"accuracy: Wilson score interval; {how}; the scored sample's uncertainty only, not a retrained "
                  f"model's")
    return out


def paired(first: np.ndarray, other: np.ndarray, level: float = LEVEL) -> dict:
    """Two models' right (True) / wrong answers on the same N examples (bool (N,) each): how many each alone got
    right, the difference in accuracy (other − first, points) with its interval at `level`, and McNemar's exact test
    (the examples one alone got right, split between the two as by a fair coin if neither is better: a two-sided
    binomial p; 1.0 where none differ).

    The interval is Bonett and Price's (2012) adjusted Wald interval for a difference of paired proportions: one
    example added to each of the two cells where the models differ, (p̃₂₁ − p̃₁₂) ± z·√((p̃₁₂ + p̃₂₁ − (p̃₂₁ − p̃₁₂)²) /
    (N + 2)), p̃ = (count + 1) / (N + 2); recommended by Fagerland, Lydersen and Laake (2013, BMC Med Res Methodol
    13:91), closed, at any N. Measured (bench/paired_interval_check.py): at least 95% coverage in every scenario
    drawn, where the interval conditional on the differing examples (exact with McNemar's test) covered 52% when
    one model was rarely worse, and the percentile bootstrap used before 94%. An interval and a test are two
    procedures: in a borderline case one can leave out 0 and the other not, which compare's line then says.
    None for no examples."""
    from scipy.stats import binomtest, norm

    first, other = np.asarray(first, dtype=bool), np.asarray(other, dtype=bool)
    n = len(first)
    cells = np.array([(first & other).sum(), (first & ~other).sum(), (~first & other).sum(), (~first & ~other).sum()])
    out: dict = {"n": n, "both_right": int(cells[0]), "first_only": int(cells[1]), "other_only": int(cells[2]),
                 "both_wrong": int(cells[3]), "difference": 100.0 * (int(cells[2]) - int(cells[1])) / n if n else None}
    out["interval"] = None
    if n:
        p12, p21 = (cells[1] + 1) / (n + 2), (cells[2] + 1) / (n + 2)
        half = float(norm.ppf(0.5 + level / 2)) * math.sqrt(max(p12 + p21 - (p21 - p12) ** 2, 0.0) / (n + 2))
        out["interval"] = [100.0 * max(-1.0, p21 - p12 - half), 100.0 * min(1.0, p21 - p12 + half)]
    split = int(cells[1] + cells[2])
    out["mcnemar_p"] = float(binomtest(int(cells[2]), split, 0.5).pvalue) if split else 1.0
    out["level"] = level
    return out


# --calibrate fits a temperature on at least this many examples (validation, or distinct training examples held out
# by the folds): on fewer, one number is still fitted
# to the few (a carve of 12 put it at either end of its range), and the probabilities would then say less, not more
MIN_CALIBRATE = 100
LOG_T = 4.0  # the search's range of log T: T from e^-4 (0.018) to e^4 (55)


def temperature_loss(logits: np.ndarray, y: np.ndarray) -> Callable[[float], float]:
    """The mean cross-entropy of softmax(logits / t) against labels y, as a function of t > 0, in float64 (the
    logits (N, C) converted once)."""
    z, target = torch.from_numpy(np.asarray(logits, dtype=np.float64)), torch.from_numpy(np.asarray(y, dtype=np.int64))
    return lambda t: float(nn.functional.cross_entropy(z / t, target))


class NonFiniteLogits(FrozentuneError, ValueError):
    """Logits that are not all finite numbers: no temperature fits them (the search's losses would be NaN, and any T
    would pass as the best). `rows`: how many examples have one, of `examples`."""

    def __init__(self, rows: int, examples: int):
        self.rows, self.examples = rows, examples
        super().__init__(f"{rows:,} of the {examples:,} examples have logits that are not finite numbers (NaN or "
                         f"infinite), so no temperature can be fitted on them")


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> dict:
    """Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks"): the T > 0 whose
    softmax(logits / T) gives held-out examples `y` the lowest mean cross-entropy, found over log T in
    [-LOG_T, LOG_T] (Brent's bounded search; the loss is convex in 1/T). {"value": T, "examples", "loss_before"
    (at T = 1), "loss_after", "at_edge": whether T is at an end of the range (examples all right with room to
    spare make the loss fall as T goes to 0: no finite T is best)}. Dividing by T > 0 keeps every row's argmax.
    NonFiniteLogits where a row holds NaN or ±inf."""
    from scipy.optimize import minimize_scalar

    if rows := int((~np.isfinite(np.asarray(logits, dtype=np.float64))).any(axis=1).sum()):
        raise NonFiniteLogits(rows, len(y))
    loss = temperature_loss(logits, y)
    best = float(np.exp(minimize_scalar(lambda lt: loss(float(np.exp(lt))), bounds=(-LOG_T, LOG_T), method="bounded",
                                        options={"xatol": 1e-6}).x))
    after = loss(best)
    # an end of the range doing as well: the loss still falls (or is flat, all of it rounded away) towards it
    edge = min(loss(float(np.exp(-LOG_T))), loss(float(np.exp(LOG_T)))) <= after + 1e-12
    return {"value": best, "examples": int(len(y)), "loss_before": loss(1.0), "loss_after": after, "at_edge": edge}


def predict_logits(model: Classifier, src: Source, batch_size: int = 256) -> np.ndarray:
    """(N, C) logits in the source's order."""
    return predict_outputs(model, src, (), batch_size)["logits"]


@torch.no_grad()
def predict_outputs(model: Classifier, src: Source, extras: Sequence[str] = (),
                    batch_size: int = 256) -> dict[str, np.ndarray]:
    """Logits (N, C) and the named per-example extras of the head (N, ...), in the source's order.
    Extras with a token axis cannot be stacked across batches and are refused."""
    model.eval()
    device = next(model.parameters()).device
    out: dict[str, np.ndarray] = {}
    for idx in eval_batches(src.lengths, batch_size):
        o = model(src.batch(idx).to(device))
        for name, value in (("logits", o.logits), *((e, o.extras[e]) for e in extras)):
            if name not in out:
                out[name] = np.zeros((len(src), *value.shape[1:]), dtype=np.float32)
            elif value.shape[1:] != out[name].shape[1:]:
                raise ValueError(f"extra {name!r} changes shape between batches ({tuple(value.shape[1:])} vs "
                                 f"{out[name].shape[1:]}): only fixed-size extras can be collected")
            out[name][idx] = value.float().cpu().numpy()
    return out


def evaluate(model: Classifier, src: Source, y: np.ndarray, batch_size: int = 256,
             positive: tuple[int, str] | None = None) -> tuple[dict, np.ndarray]:
    pred = predict_logits(model, src, batch_size).argmax(1)
    return metrics(y, pred, len(model.labels), positive), pred


def adamw(params: list[nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, LayerNorm or other vectors)."""
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=lr)


class Diverged(FrozentuneError, FloatingPointError):
    """Training stopped because it stopped being finite: `where` ("step 3"), `what` happened (by default
    "loss became nan"; also weights that became non-finite, or an update that overflowed), and `advice`.
    A FloatingPointError as well, as it was before it had a class."""

    def __init__(self, where: str, loss: float, advice: str, what: str | None = None):
        self.what = what or f"loss became {loss}"
        super().__init__(f"{where}: {self.what}; {advice}")
        self.where, self.loss, self.advice = where, loss, advice

    def __reduce__(self):  # pickled (a worker process's error) as its parts, not the joined message; then its
        # message as it was last said (pyterms adds the Python spelling of the flags to it)
        return type(self), (self.where, self.loss, self.advice, self.what), {"args": self.args}


def divergence_advice(lr: float, weight_decay: float) -> str:
    """What to do about a training that diverged: lower --lr; where lr × weight decay is 1 or more, AdamW's
    decoupled decay (w ← w·(1 − lr·wd)) overshoots zero at every step, so lower --weight-decay too."""
    if lr * weight_decay >= 1:
        return (f"lower --lr or --weight-decay (lr × weight decay = {lr * weight_decay:g}: at 1 or more each step's "
                f"decay overshoots zero)")
    return "lower --lr"


def _step(opt: torch.optim.Optimizer, where: str, advice: str) -> None:
    """opt.step(), an update too large for float32 (Adam's first steps are up to 10× the rate: --lr 1e38)
    said as a divergence, not torch's overflow error."""
    try:
        opt.step()
    except RuntimeError as e:
        if "overflow" not in str(e):
            raise
        raise Diverged(where, float("inf"), advice, what="the optimiser's update overflowed float32") from None


def check_finite(params: list[nn.Parameter], where: str, advice: str) -> None:
    """A Diverged where a trainable parameter holds NaN or ±inf: an update whose loss was finite made it
    so (the loss of the next step would say it; after the last step there is none)."""
    if not all(bool(torch.isfinite(p).all()) for p in params):
        raise Diverged(where, float("nan"), advice, what="the weights became non-finite")


def optimizer_step(loss: torch.Tensor, opt: torch.optim.Optimizer, params: list[nn.Parameter],
                   max_grad_norm: float, where: str, advice: str) -> None:
    """One update from `loss`: refuse a non-finite loss (saying `where` and what to do), backward,
    clip the gradient norm (0: off), step."""
    if not torch.isfinite(loss):
        raise Diverged(where, loss.item(), advice)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm > 0:
        nn.utils.clip_grad_norm_(params, max_grad_norm)
    _step(opt, where, advice)


def shared_step(part: torch.Tensor | None, opt: torch.optim.Optimizer, params: list[nn.Parameter],
                max_grad_norm: float, where: str, advice: str) -> float:
    """One update from this rank's part of the global batch's loss (weighted so that the parts of all
    ranks sum to it; None for a rank whose slice is empty): backward, sum the gradients and the
    parts over the ranks, refuse a non-finite global loss (on every rank alike), clip the summed
    gradient's norm (0: off), step. Returns the global loss. In one process: optimizer_step."""
    if distributed.world_size() == 1:
        assert part is not None
        optimizer_step(part, opt, params, max_grad_norm, where, advice)
        return part.item()
    opt.zero_grad(set_to_none=True)
    value = 0.0
    if part is not None:
        part.backward()  # a non-finite part is refused below, once all ranks know the sum
        value = part.item()
    (total,) = distributed.reduce_gradients(params, [value])
    if not math.isfinite(total):
        raise Diverged(where, total, advice)
    if max_grad_norm > 0:
        nn.utils.clip_grad_norm_(params, max_grad_norm)
    _step(opt, where, advice)
    return total


@dataclass
class HeldOut:
    """Logits of training examples each scored by a model that did not train on it, with their labels:
    cross-validation's out-of-fold predictions of the candidate it chose (where no validation split chose,
    --calibrate fits on them).
    With repeated folds every example is there once per repeat."""
    logits: np.ndarray  # (M, C): M = N x repeats
    y: np.ndarray  # (M,)
    examples: int  # N, the distinct examples
    folds: int  # k


@dataclass
class FitResult:
    history: list[dict]
    best_epoch: int
    train_seconds: float
    stopped_early: bool
    held_out: HeldOut | None = None  # cross-validation's out-of-fold logits of the model chosen (crossval.fit_cv)


def trained_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of a module's trainable parameters."""
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of what training changes: the trainable parameters and every buffer."""
    return trained_weights(module) | {n: b.detach().clone() for n, b in module.named_buffers()}


@dataclass(frozen=True)
class Schedule:
    """How many optimiser steps a run takes and when it validates. `total` steps, validation every
    `every` steps (and after the last), `warmup` steps of linear warm-up, then linear decay to 0
    (`constant`: the rate stays at its peak, so the model after s steps is the one a run of s steps
    gives; cross-validation relies on that). `why`: the one line a run prints about it."""
    total: int
    every: int
    warmup: int
    constant: bool
    why: str
    at: tuple[int, ...] = ()  # validate after these steps instead of every `every` (the last is `total`)

    def bounds(self) -> list[int]:
        """The steps after which validation runs, ascending, ending at total."""
        if self.at:
            return sorted(set(min(max(1, s), self.total) for s in self.at) | {self.total})
        return [min(r * self.every, self.total) for r in range(1, math.ceil(self.total / self.every) + 1)]


def counted(n: int, noun: str) -> str:
    """"1 epoch", "3 epochs": a count with its noun in the right number."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def plan_steps(n: int, cfg: TrainConfig, constant: bool = False) -> Schedule:
    """The schedule for n training examples: --steps if given, else --epochs passes over train
    (ceil(n/B) steps each), raised to --min-steps. Validation happens once per epoch, or --epochs
    times over a raised or given number of steps."""
    per_epoch = max(1, math.ceil(n / cfg.batch_size))
    from_epochs = per_epoch * cfg.epochs
    if cfg.steps:
        total, why = cfg.steps, f"{counted(cfg.steps, 'step')} (--steps)"
    elif from_epochs < cfg.min_steps:
        total = cfg.min_steps
        why = (f"{total} steps: {counted(cfg.epochs, 'epoch')} of {counted(n, 'example')} would be "
               f"{counted(from_epochs, 'step')}, under the floor of "
               f"{cfg.min_steps} (--min-steps), so train is seen {total * min(n, cfg.batch_size) / max(n, 1):.0f} times")
    else:
        total, why = from_epochs, f"{counted(from_epochs, 'step')} ({counted(cfg.epochs, 'epoch')} of {per_epoch})"
    every = per_epoch if total == from_epochs else max(1, math.ceil(total / cfg.epochs))
    return Schedule(total, every, int(cfg.warmup * total), constant, why + (", constant rate after warm-up" if constant else ""))


@keeps_rng  # it seeds torch for dropout; the caller's random state is put back after
def fit_loop(module: nn.Module, lengths: np.ndarray, batch_loss: Callable[[np.ndarray], torch.Tensor],
             validate: Callable[[], dict[str, float]], score: Callable[[dict[str, float]], float],
             cfg: TrainConfig, log: Callable[[str], None] = print, schedule: Schedule | None = None,
             select: bool = True, on_round: Callable[[], None] | None = None) -> FitResult:
    """The one training loop. `lengths` (N,): tokens per training example (for length-bucketed
    batches); `batch_loss(idx)`: the mean loss of those examples (data-parallel: the mean over
    examples of per-example losses, so that a slice's mean times its share of the batch is its part
    of the batch's mean); `validate()`: validation metrics ({} where there is nothing to validate
    on); `score(metrics)`: higher is better. `schedule`: steps and validation rounds (default
    plan_steps). `select`: stop early (--patience) and leave `module` with the trainable parameters
    (and buffers) of the best validation round; False: run every step and keep the last weights.
    history rows, one per validation round: the round ("epoch"), its last step, the mean training
    loss and each step's (step_losses), the validation metrics and the round's seconds (rank 0's
    under a launcher). Batches are drawn epoch by epoch (seeded), whatever the rounds. `on_round()` is
    called after each round's validation (cross-validation keeps the fold models' weights so)."""
    from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

    world = distributed.launch().world_size
    if world > 1 and not distributed.is_main():
        log = silent
    torch.manual_seed(distributed.rank_seed(cfg.seed))  # dropout: rank 0 draws as one process would
    rng = np.random.default_rng(cfg.seed)  # the batches: the same on every rank
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(module).__name__} has no trainable parameters")
    if world > 1:
        run = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "device"}
        distributed.check_same("the trainable parameters, training set and options",
                               (distributed.param_signature(module), len(lengths),
                                zlib.crc32(np.ascontiguousarray(lengths, dtype=np.int64).tobytes()), run))
        distributed.broadcast_module(module)
        log(f"data-parallel: {world} processes ({distributed.launch().how}), each a slice of every batch of "
            f"{cfg.batch_size}")
    sch = schedule or plan_steps(len(lengths), cfg)
    opt = adamw(params, cfg.lr, cfg.weight_decay)
    sched = (get_constant_schedule_with_warmup(opt, sch.warmup) if sch.constant
             else get_linear_schedule_with_warmup(opt, sch.warmup, sch.total))
    bounds = sch.bounds()
    rounds = len(bounds)
    by_epoch = not sch.at and sch.every == math.ceil(len(lengths) / cfg.batch_size)  # rounds are epochs: say "epoch"

    def batches():
        while True:  # epoch after epoch, each a fresh seeded permutation
            yield from train_batches(lengths, cfg.batch_size, rng)

    advice = divergence_advice(cfg.lr, cfg.weight_decay)
    unit = "epoch" if by_epoch else "validation round"  # what the lines call a round
    history, best, best_state, bad = [], -float("inf"), None, 0
    best_epoch, stopped = 0, False
    draw = batches()
    t_start = time.perf_counter()
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        module.train()
        loss_sum, n, steps = 0.0, 0, []
        done = bounds[rnd - 2] if rnd > 1 else 0
        todo, said = bounds[rnd - 1] - done, t0
        for _ in range(todo):
            interrupts.check()  # a SIGTERM or SIGINT whose first raise was swallowed (interrupts.py) ends the run here
            idx = next(draw)
            if world == 1:
                part = batch_loss(idx)
            else:  # this rank's slice, weighted by its share; an empty slice still joins the gradient sum
                mine = distributed.shard(idx)
                part = batch_loss(mine) * (len(mine) / len(idx)) if len(mine) else None
            loss = shared_step(part, opt, params, cfg.max_grad_norm,
                               f"epoch {rnd}" if by_epoch else f"step {done + len(steps) + 1}", advice)
            sched.step()
            steps.append(loss)
            loss_sum += loss * len(idx)
            n += len(idx)
            if (now := time.perf_counter()) - said >= PROGRESS_EVERY_S and len(steps) < todo:
                said = now
                log(progress_line(rnd, rounds, by_epoch, len(steps), todo, loss_sum / n, now - t0))
        epoch_s = time.perf_counter() - t0
        check_finite(params, f"epoch {rnd}" if by_epoch else f"step {bounds[rnd - 1]}", advice)  # the last update's
        module.eval()
        if world == 1:
            val_m = validate()
        else:  # rank 0 validates; every rank then decides on its numbers
            val_m, epoch_s = distributed.broadcast_object((validate(), epoch_s) if distributed.is_main() else None)
        row = {"epoch": rnd, "step": bounds[rnd - 1], "train_loss": loss_sum / max(n, 1),
               **{f"val_{k}": v for k, v in val_m.items()}, "epoch_seconds": epoch_s, "step_losses": steps}
        history.append(row)
        if on_round is not None:
            on_round()
        shown = "  ".join(f"val {k.replace('_', '-')} {v:.{4 if k == 'loss' else 2}f}" for k, v in val_m.items())
        where = f"epoch {rnd:>3}/{rounds}" if by_epoch else f"step {row['step']:>5}/{sch.total}"
        log(f"{where}  loss {row['train_loss']:.4f}  {shown}  {epoch_s:.1f}s".replace("    ", "  "))
        if not select or not val_m:
            best_epoch = rnd
            continue
        if score(val_m) > best:
            best, best_epoch, bad = score(val_m), rnd, 0
            best_state = snapshot(module)
        else:
            bad += 1
            if cfg.patience and bad >= cfg.patience and rnd < rounds:  # at the last round nothing is cut short
                stopped = True
                log(f"early stop: no validation gain for {bad} {unit}s; best {unit} {best_epoch}")
                break
    if best_state is not None:
        module.load_state_dict(best_state, strict=False)
        if best_epoch != len(history) and not stopped:  # said where it stopped early; the whole schedule ran here
            log(f"kept the weights of {unit} {best_epoch} of {len(history)} (step {history[best_epoch - 1]['step']}), "
                f"the best on validation")
    return FitResult(history, best_epoch, time.perf_counter() - t_start, stopped)


def progress_line(rnd: int, rounds: int, by_epoch: bool, done: int, todo: int, loss: float, seconds: float) -> str:
    """Where a long round is: its steps done of `todo`, the mean training loss so far, and the time
    its remaining steps will take at the rate so far."""
    where = f"epoch {rnd:>3}/{rounds}" if by_epoch else f"round {rnd}/{rounds}"
    left = seconds / done * (todo - done)
    return (f"{where}  step {done}/{todo} of this {'epoch' if by_epoch else 'round'}  loss so far {loss:.4f}  "
            f"{seconds / done:.2f}s a step, about {left / 60:.1f} min to its end")


def silent(line: str) -> None:
    """A log that prints nothing: ranks other than 0, fold runs, sweep points (their callers print
    one summary line instead)."""


def fit(model: Classifier, train: Source, y_train: np.ndarray, val: Source | None, y_val: np.ndarray | None,
        cfg: TrainConfig, log: Callable[[str], None] = print, schedule: Schedule | None = None,
        select: bool = True, on_round: Callable[[], None] | None = None,
        keep_logits: list[np.ndarray] | None = None) -> FitResult:
    """Train a classifier in place: fit_loop on its head's loss. With `select`, early stopping on
    validation accuracy leaves it with the weights of the best validation round; without (or with
    no validation split, val None), it runs the whole schedule and keeps the last weights. A head
    that `solves_output` then has its linear layer solved on all of train (crossval.solve_output).
    `keep_logits`: a list that gets each validation round's (N_val, C) logits (cross-validation's
    held-out folds)."""
    device = distributed.device(cfg.device)  # under a launcher, a bare "cuda" is this rank's GPU
    model.to(device)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"method {model.method!r} has no trainable parameters")
    y_train_t = torch.from_numpy(np.asarray(y_train))

    def batch_loss(idx: np.ndarray) -> torch.Tensor:
        return model.head.loss(model(train.batch(idx).to(device)), y_train_t[idx].to(device))

    def validate() -> dict[str, float]:
        if val is None:
            return {}
        logits = predict_logits(model, val, cfg.eval_batch_size)
        if keep_logits is not None:
            keep_logits.append(logits)
        return scores(logits, y_val, len(model.labels))

    result = fit_loop(model, train.lengths, batch_loss, validate, lambda m: m["accuracy"], cfg, log, schedule, select,
                      on_round)
    if getattr(model.head, "solves_output", False):  # contrastive: SetFit's logistic regression on the tuned embeddings
        from .crossval import solve_output

        solve_output(model, train, y_train)
    return result


def scored(model: Classifier, src: Source, y: np.ndarray, batch_size: int = 256) -> dict[str, float]:
    """Accuracy and macro-F1 (percent) and the mean cross-entropy of softmax(logits) ("loss", the
    tie-break between equally accurate rounds)."""
    return scores(predict_logits(model, src, batch_size), y, len(model.labels))


def scores(logits: np.ndarray, y: np.ndarray, num_labels: int) -> dict[str, float]:
    """scored's figures from (N, C) logits already computed."""
    z = torch.from_numpy(logits)
    return metrics(np.asarray(y), logits.argmax(1), num_labels) | {
        "loss": float(nn.functional.cross_entropy(z, torch.from_numpy(np.asarray(y))))}

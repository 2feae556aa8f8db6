"""Tolerances for the tests' numeric comparisons, derived from the dtype and the operations.

Model (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 3): every floating-point
operation rounds once, to within eps/2 of its exact result (eps = torch.finfo(dtype).eps); a
value that went through a chain of n roundings (a sum or dot product of k terms counts k, in
any order) is within about n·eps/2 of the exact value, relative to the magnitudes the chain
works on. Two results of the same maths computed along different kernel paths (another
summation order: AVX2 vs AVX-512 blocking, 1 vs 2 threads, a batch of 1 vs 4, the SDPA mask
path vs the plain one, a fused vs a looped reference) are each that far from the exact value,
so they differ by up to n·eps. `tol` doubles that, 2·n·eps: one rounding may be amplified by
the step after it (exp in a softmax turns an absolute error of its argument into a relative
error of its result; a LayerNorm divides by a standard deviation below the values' size).

These are worst-case bounds; typical differences are about √n·eps (roundings partly cancel),
so a comparison holds here with a margin of about √n, on any x86-64 CPU and thread count,
while a real bug (a mask off by one, a missing 1/√d, the wrong layer, a position offset) moves
values by 1e-2 to 1, orders of magnitude beyond every tolerance below. Example: the 2-layer
width-32 BERT of test_encoder_prefix is n = transformer(2, 32, 64, 12, 8) = 754 roundings, tol
1.8e-4, times states of size ~5: bound ~1e-3; the AVX2-only failure that prompted this was 1.2e-6
(against atol 1e-6); a padding token let into attention moves those states by 0.6.

Magnitude: rounding errors are relative to the quantities a computation adds up, not to each
compared element (an element near 0 after cancellation still carries an error of its inputs'
size). So `assert_close` checks

    |actual − expected| ≤ tol · (scale + |expected|)

with `scale` by default max|expected| (the size of the compared values: hidden states, logits,
probabilities), or given where the terms of a sum are larger than its result (`sum_of_abs`).

Exact comparisons (`exact`) are for results of the same kernels on the same inputs (a value
copied, saved and loaded, recomputed by the identical call) and for integer/bool data; each
call says why the paths are identical.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

# ----------------------------------------------------------------------------- operation counts
# Each function returns n, the roundings along the longest dependency chain of one result.


def dot(k: int) -> int:
    """A sum or dot product of k terms: any summation order is within k·eps/2 of exact (γ_k)."""
    return k


def linear(k: int) -> int:
    """x·Wᵀ + b over k inputs: the dot product of k terms and the bias add."""
    return dot(k) + 1


def softmax(n: int) -> int:
    """Over n entries: subtract the max (1), exp (1), the sum of n (n), the division (1)."""
    return 1 + 1 + dot(n) + 1


def norm(d: int) -> int:
    """LayerNorm (RMSNorm: fewer) over d: mean (d), variance (d), rsqrt (2), scale and shift (2)."""
    return dot(d) + dot(d) + 2 + 2


ACTIVATION = 4
"""GELU / SiLU / tanh / sigmoid: a few roundings in the exp or erf evaluation and the products around it."""


def attention(keys: int, head_dim: int) -> int:
    """Scaled dot-product attention: q·k over head_dim, ×1/√E, softmax over the keys, p·v over the keys."""
    return dot(head_dim) + 1 + softmax(keys) + dot(keys)


def attention_block(width: int, keys: int, head_dim: int) -> int:
    """Projection to q/k/v (width inputs), attention, output projection, residual add, norm."""
    return linear(width) + attention(keys, head_dim) + linear(width) + 1 + norm(width)


def ffn_block(width: int, ffn: int) -> int:
    """Feed-forward block: linear(width) → activation (× gate) → linear(ffn), residual add, norm."""
    return linear(width) + ACTIVATION + 1 + linear(ffn) + 1 + norm(width)


def transformer(layers: int, width: int, ffn: int, keys: int, head_dim: int) -> int:
    """A whole encoder/decoder forward (BERT, GPT-2, Llama): embedding norm, then `layers` blocks;
    the hidden states of every layer are within this (add linear(width) for an LM head's logits)."""
    return norm(width) + layers * (attention_block(width, keys, head_dim) + ffn_block(width, ffn))


ROUNDING = 1
"""One rounding to the dtype (e.g. float32 states stored as float16): within eps/2 of the value."""


# ----------------------------------------------------------------------------- tolerances
def eps(dtype: torch.dtype = torch.float32) -> float:
    """Machine epsilon of `dtype` (the gap between 1 and the next representable number)."""
    return float(torch.finfo(dtype).eps)


def tol(dtype: torch.dtype = torch.float32, ops: float = 1) -> float:
    """Relative tolerance between two results of `ops` roundings in `dtype`: 2·ops·eps (see the module
    docstring: n·eps/2 per result, two results, ×2 for amplification by the following step).
    Add terms for mixed precision, e.g. tol(float16, ROUNDING) + tol(float32, transformer(...))."""
    return 2.0 * ops * eps(dtype)


def _float_dtype(*tensors) -> torch.dtype:
    for t in tensors:
        if isinstance(t, Tensor) and t.is_floating_point():
            return t.dtype
    raise TypeError("give dtype= for non-tensor or integer values: the precision the computation ran in")


def _rtol(ops, dtype, rtol, *tensors) -> tuple[float, torch.dtype | None]:
    if (ops is None) == (rtol is None):
        raise TypeError("give exactly one of ops= (with dtype=, or the tensors' dtype) or rtol=")
    if rtol is not None:
        return float(rtol), dtype
    dtype = dtype or _float_dtype(*tensors)
    return tol(dtype, ops), dtype


def _scale(expected: Tensor, scale) -> Tensor | float:
    if scale is None:
        return float(expected.abs().max()) if expected.numel() else 0.0
    return scale.to(expected.dtype) if isinstance(scale, Tensor) else float(scale)


def noise(expected: Tensor, *, ops: float | None = None, dtype: torch.dtype | None = None,
          rtol: float | None = None, scale=None) -> float:
    """The largest difference rounding alone can explain for values like `expected`: tol · scale
    (scale default max|expected|). For "did not change" (≤ noise) and "did change" (> noise) checks."""
    r, _ = _rtol(ops, dtype, rtol, expected)
    s = _scale(expected.detach(), scale)
    return r * float(s.max() if isinstance(s, Tensor) else s)


def assert_close(actual: Tensor, expected: Tensor, *, ops: float | None = None, dtype: torch.dtype | None = None,
                 rtol: float | None = None, scale=None, what: str = "") -> None:
    """|actual − expected| ≤ r·(scale + |expected|) elementwise, r = tol(dtype, ops) (or `rtol`).
    dtype defaults to the tensors' (the precision the computation ran in); scale to max|expected|, a
    float or a tensor broadcast against expected (e.g. sum_of_abs of a matrix product)."""
    actual, expected = torch.as_tensor(actual).detach(), torch.as_tensor(expected).detach()
    r, dtype = _rtol(ops, dtype, rtol, expected, actual)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.double(), expected.double()
    s = _scale(expected, scale)
    s = s.double() if isinstance(s, Tensor) else s
    bound = r * (s + e.abs())
    diff = (a - e).abs()
    ok = diff <= bound
    if bool(ok.all()):
        return
    nan = ~torch.isfinite(diff)
    worst = torch.where(nan, torch.inf, diff / bound.clamp_min(torch.finfo(torch.float64).tiny))
    i = int(worst.flatten().argmax())
    raise AssertionError(
        f"{what or 'values'} differ beyond rounding ({dtype}, ops={ops}, rtol={r:.3g}): "
        f"{int((~ok).sum())} of {ok.numel()} elements; worst at flat index {i}: "
        f"actual {a.flatten()[i].item():.9g}, expected {e.flatten()[i].item():.9g}, "
        f"|diff| {diff.flatten()[i].item():.3g} > bound {bound.flatten()[i].item():.3g}; "
        f"max |diff| {diff.max().item():.3g}")


def assert_differs(a: Tensor, b: Tensor, *, ops: float | None = None, dtype: torch.dtype | None = None,
                   rtol: float | None = None, scale=None, what: str = "") -> None:
    """max|a − b| > noise(b): the two differ by more than rounding can explain (the change is real)."""
    limit = noise(b, ops=ops, dtype=dtype, rtol=rtol, scale=scale)
    diff = float((a.detach() - b.detach()).abs().max())
    assert diff > limit, f"{what or 'values'}: max |diff| {diff:.3g} is within rounding noise {limit:.3g}"


def approx(expected: float, *, ops: float, dtype: torch.dtype = torch.float32, scale: float | None = None):
    """pytest.approx for a Python number (or list) computed in `dtype` through `ops` roundings: rel = tol,
    abs = tol·scale (scale default max|expected|: pass the size of the terms when they cancel, e.g. to 0)."""
    r = tol(dtype, ops)
    if scale is None:
        scale = max(map(abs, expected)) if isinstance(expected, (list, tuple)) else abs(expected)
    return pytest.approx(expected, rel=r, abs=r * scale)


def sum_of_abs(a: Tensor, b: Tensor) -> Tensor:
    """|a| @ |b|: the magnitude the rounding error of the matrix product a @ b is relative to (Σ|terms|)."""
    return a.detach().abs() @ b.detach().abs()


def prefix_mlp_scale(encoder) -> float:
    """For a frozentune PrefixEncoder with reparam: max over outputs of Σ|terms| of the MLP's last layer,
    |tanh(first(P'))|·|W|ᵀ + |b|. init_from solves W, b in float64 so that MLP(P') = target; rounded to
    float32 and evaluated there, the output is within linear(M) + ROUNDING roundings of this size
    (which exceeds |target| by the cancellation in the fitted weights)."""
    with torch.no_grad():
        first, last = encoder.mlp[0], encoder.mlp[2]
        feats = torch.tanh(first(encoder.embedding))
        return float((sum_of_abs(feats, last.weight.T) + last.bias.abs()).max())


def exact(a, b, why: str) -> None:
    """a and b are identical (same shape, same bits; NaN never equal): `why` names why the paths are
    identical (same kernel, same inputs; a copy; integer or bool data)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        same = np.array_equal(a, b)
        diff = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if not same and np.shape(a) == np.shape(b) else None
    else:
        same = torch.equal(a, b)
        diff = (float((a.double() - b.double()).abs().max()) if not same and a.shape == b.shape and a.numel() else None)
    assert same, f"expected identical results ({why}); max |diff| {diff}"

"""--precision for decoding: a frozen LM's linear layers in bf16 or fp16 under autocast, its norms,
residual stream and input embedding in fp32 (as extract/precision.py runs an encoder's pass).

Decoding is not training: the prefix (or the fine-tuned weights) was trained in fp32, and decoding
it in 16 bits changes the numbers each step, so a greedy or beam choice between two near-equal
tokens can go the other way. What it buys on a CPU with native bf16 (SmolLM2-135M, 1 thread, an E2E
prefix trained on 100 pairs; bench/decode_precision.py): all 630 test MRs decoded 2.5× as fast,
a batch of 8 at 2.25× fp32's tokens/s; BLEU 49.75 against 49.99.

The default stays fp32 on every device: fp32 decoding gave the same text for a source alone as in
a batch (64 of 64), bf16 did not (17 of 64 differed, even within a batch of equal-length sources;
where in the step the rounding comes to depend on the batch was not found), and the server
promises that a reply equals `frozentune generate` on the same text. --precision bf16 is the choice
to make for throughput, said where it is used.

    lm = for_decoding(lm, "bf16")      # in place: Linear weights in bf16, the output layer untied
    with decoding(lm):                  # autocast when the LM's output layer is not fp32
        lm.generate(...)
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from ..extract.precision import DTYPES, check_precision, slow_suffix
from .prefix import PrefixError

DECODE_PRECISIONS = ("fp32", "bf16", "fp16")
DECODE_DEFAULT = "fp32"
DECODE_WHY = ("decoding in fp32 (exact: a row's tokens do not depend on what shares its batch); --precision bf16 "
              "decodes faster where the CPU or GPU has bf16, and a near-tie between two tokens can then go either way")


def _check_known(precision: str) -> None:
    if precision not in DECODE_PRECISIONS:
        raise PrefixError(f"--precision {precision}: generation decodes in {', '.join(DECODE_PRECISIONS)} (int8 is "
                          f"for the frozen pass of classifiers); give one of those or leave --precision out for fp32")


def choose_decode_precision(given: str | None, device: torch.device) -> tuple[str, str]:
    """(precision, one line saying why) for decoding on `device`; an unknown or unfit precision is a
    PrefixError saying what to give."""
    if given is None:
        return DECODE_DEFAULT, f"precision: {DECODE_WHY}"
    _check_known(given)
    check_precision(given, torch.device(device))
    return given, f"precision: decoding in {given} (--precision {given})" + (
        "; a near-tie between two tokens can go either way, and a row's tokens can depend on what shares its batch"
        if given != "fp32" else "") + slow_suffix(given, torch.device(device))  # (the LM's linear layers' products)


def for_decoding(lm: nn.Module, precision: str) -> nn.Module:
    """`lm` changed in place to decode in `precision`: every nn.Linear's weights in its dtype (autocast
    would cast them on every step; once is enough), the output layer given its own copy when it shares
    its weight with the input embedding (which stays fp32, as the residual stream does). Only for a
    frozen LM that is not trained afterwards. fp32: `lm` unchanged."""
    _check_known(precision)
    if precision == "fp32":
        return lm
    dtype = DTYPES[precision]
    out, inp = lm.get_output_embeddings(), lm.get_input_embeddings()
    if out is not None and inp is not None and out.weight is inp.weight:
        out.weight = nn.Parameter(out.weight.detach().clone(), requires_grad=False)
    for m in lm.modules():
        if isinstance(m, nn.Linear):
            m.to(dtype)
    return lm


def decode_dtype(lm: nn.Module) -> torch.dtype:
    """The dtype `lm` decodes in: its output layer's (for_decoding sets it), else its first parameter's."""
    out = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    return out.weight.dtype if out is not None else next(lm.parameters()).dtype


def precision_of(lm: nn.Module) -> str:
    """The --precision name of decode_dtype(lm)."""
    dtype = decode_dtype(lm)
    return next((k for k, v in DTYPES.items() if v == dtype), str(dtype))


@contextlib.contextmanager
def decoding(lm: nn.Module) -> Iterator[None]:
    """Autocast in the LM's decode dtype when that is not fp32; nothing otherwise."""
    dtype = decode_dtype(lm)
    if dtype == torch.float32:
        yield
        return
    device = next(lm.parameters()).device
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def decode_runtime(device: str | None, precision: str | None) -> tuple[torch.device, str, list[str]]:
    """(device, precision, the lines saying what was chosen and why) for decoding a saved generator."""
    from ..extract import resolve_device

    dev, said = resolve_device("auto" if device is None else device)  # 0 and "" are refused there, not auto
    prec, why = choose_decode_precision(precision, dev)
    return dev, prec, [said, why]


def ready_to_decode(tuner: nn.Module, device: torch.device, precision: str) -> None:
    """A loaded tuner and its (unregistered) LM moved to `device`, the LM made to decode in `precision`."""
    tuner.lm.to(device)
    tuner.to(device)
    for_decoding(tuner.lm, precision)
    tuner.eval()

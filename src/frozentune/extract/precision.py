"""PLACEHOLDER (main engineer, for testing shards): the precision helper replaces this file whole."""
from __future__ import annotations

import copy

import torch

from .errors import ExtractError

PRECISIONS = ("fp32", "bf16", "fp16", "int8")


def check_precision(precision: str, device: torch.device) -> None:
    if precision not in PRECISIONS:
        raise ExtractError(f"--precision {precision!r}: give one of {', '.join(PRECISIONS)}")


def default_precision(device: torch.device) -> tuple[str, str]:
    return "fp32", "placeholder"


def prepare(model, precision, device):
    if precision == "fp32":
        return model.to(device)
    m = copy.deepcopy(model).to(device)
    return m.to({"bf16": torch.bfloat16, "fp16": torch.float16}[precision]) if precision != "int8" else m

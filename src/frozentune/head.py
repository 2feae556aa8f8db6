"""The interface every classification head implements.

Legend: B batch, T tokens, D hidden size of the frozen states, C classes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class Features:
    hidden: Tensor  # (B, T, D) frozen token states, float32
    mask: Tensor    # (B, T) bool, True on real tokens


@dataclass
class Output:
    logits: Tensor                              # (B, C) class scores; argmax is the prediction
    extras: dict[str, Tensor] = field(default_factory=dict)  # what the method can explain


class Head(nn.Module):
    """A trainable module over frozen token states. Subclasses set `forward`; the default loss
    is cross-entropy over the logits."""

    def forward(self, f: Features) -> Output:  # pragma: no cover - abstract
        raise NotImplementedError

    def loss(self, out: Output, labels: Tensor) -> Tensor:
        """labels: (B,) int64 → scalar."""
        return F.cross_entropy(out.logits, labels)


def masked_mean(hidden: Tensor, mask: Tensor) -> Tensor:
    """(B, T, D), (B, T) → (B, D): the mean over real tokens only."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)

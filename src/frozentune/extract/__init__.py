"""The frozen backbone's forward pass: where it runs (device), in what precision, and how a
cache entry is extracted in shards that survive interrupts and split across processes.

  device.py     --device auto|cpu|cuda|cuda:N|mps, and what the CPU can do
  precision.py  --precision fp32|bf16|fp16|int8: preparing the frozen model, the per-device default
  shards.py     the plan, shard files, resume, merging, --shard i/N and launcher ranks
  entries.py    `frozentune cache --list` / `--prune`
  packed.py     the pass with its linear layers on the real tokens only (BERT-style encoders): serving, live predict
"""
from __future__ import annotations


import torch

from .device import cpu_features, cpu_summary, resolve_device
from .errors import ExtractError

__all__ = ["ExtractError", "Runtime", "choose_runtime", "cpu_features", "cpu_summary", "resolve_device"]


class Runtime(tuple):
    """(device, precision, what to print about them)."""

    def __new__(cls, device: torch.device, precision: str, lines: list[str]):
        return super().__new__(cls, (device, precision, lines))

    @property
    def device(self) -> torch.device:
        return self[0]

    @property
    def precision(self) -> str:
        return self[1]

    @property
    def lines(self) -> list[str]:
        return self[2]


def choose_runtime(device: str | None, precision: str | None, fallback: str | None = None,
                   fallback_why: str = "") -> Runtime:
    """The device and precision of the frozen pass from --device / --precision. Without
    --precision: `fallback` (e.g. the precision a saved model was trained with) when it can run on
    the device, else the device's measured default; the lines say which and why."""
    from .precision import check_precision, default_precision, slow_suffix

    dev, said = resolve_device("auto" if device is None else device)  # "" is an error there, not auto
    lines = [said]
    if precision is not None:
        check_precision(precision, dev)
        lines.append(f"precision: {precision} (as asked)" + slow_suffix(precision, dev))
        return Runtime(dev, precision, lines)
    if fallback is not None:
        try:
            check_precision(fallback, dev)
            lines.append((f"precision: {fallback} ({fallback_why})" if fallback_why else f"precision: {fallback}")
                         + slow_suffix(fallback, dev))
            return Runtime(dev, fallback, lines)
        except ExtractError as e:
            lines.append(f"precision: {fallback} cannot run on {dev} ({e}); using this device's default")
    chosen, why = default_precision(dev)  # (bf16 only where the CPU has bf16 instructions: not slower there)
    lines.append(f"precision: {chosen} (default on {dev}: {why}; --precision to choose)")
    return Runtime(dev, chosen, lines)

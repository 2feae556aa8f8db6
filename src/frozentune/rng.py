"""torch's global random state is the caller's: frozentune seeds its own draws and puts the state back.

Building a head (also when a saved model loads), the training loop, generation training and pre-training
seed torch's global generator for reproducible runs. A program that calls them (a notebook looping over
seeds, a web app) would otherwise find its own draws reset to frozentune's seed after every call, even
after a predict. `own_rng` forks the state for the block: the CPU generator, and those of the CUDA
devices already in use (forking a device's generator would start CUDA in a process that never uses it).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, TypeVar

import torch

F = TypeVar("F", bound=Callable)


@contextlib.contextmanager
def own_rng(seed: int | None = None) -> Iterator[None]:
    """The block draws from torch's global generators (seeded with `seed` when given); after it they are as
    the caller left them."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def keeps_rng(fn: F) -> F:
    """`fn` run inside own_rng(): what it seeds and draws leaves the caller's random state as it was."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with own_rng():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]

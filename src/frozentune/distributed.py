"""Data parallelism across processes started by `torchrun` or `accelerate launch`.

Every rank draws the same global batch (same seeded generator), takes a contiguous slice of it
(`shard`), and back-propagates its slice's share of the global batch's mean loss; the gradients
are summed across ranks (`reduce_gradients`), then clipped and applied identically everywhere.
So a step equals the one-process step on the whole global batch up to float summation order
(and up to dropout, whose masks depend on the slice: see train.fit_loop).

The launch is read from the environment the launchers set: RANK, WORLD_SIZE, LOCAL_RANK
(torchrun; `accelerate launch --multi_gpu --num_processes N`, which also works on a CPU-only
machine), or OMPI_COMM_WORLD_* / PMI_* (mpirun, what `accelerate launch --cpu --mpirun_hostfile`
starts). The process group is made on first use (env:// rendezvous: MASTER_ADDR, MASTER_PORT;
gloo for CPU tensors, NCCL for CUDA ones). torch.distributed is used directly rather than
accelerate's Accelerator: the trainer needs only a gradient sum, a broadcast and a barrier, and
this way the same code runs under both launchers and without accelerate installed.

In one process (no launcher, or WORLD_SIZE=1) every function here is a no-op: no process group,
no communication, no thread setting.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .errors import FrozentuneError


class DistributedError(FrozentuneError, RuntimeError):
    """The ranks of a data-parallel run disagree (different data, models or options); the message says how."""


class PeerLost(DistributedError):
    """A collective call failed: another process of the run stopped (an error, a signal, a killed
    machine) or cannot be reached. The command stops too, with what it keeps."""


@contextlib.contextmanager
def collective(what: str) -> Iterator[None]:
    """Turn the backend's error when a peer process is gone (gloo's "Connection closed by peer", NCCL's
    DistBackendError: RuntimeErrors with a C++ trace) into PeerLost, one line naming `what` was being
    exchanged; the other process prints why it stopped."""
    try:
        yield
    except DistributedError:
        raise
    except RuntimeError as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise PeerLost(f"{what} across the {world_size()} processes failed (rank {rank()}: {first[:200]}): another "
                       f"process of the run stopped or cannot be reached, so this one stops too; its own message says "
                       f"why") from None


@dataclass(frozen=True)
class Launch:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    how: str = "one process"


# (rank, world size, local rank, local world size) variables of each launcher, in order of preference
_SCHEMES = (("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
            ("mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE"),
            ("mpirun (MPICH / Intel MPI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"))


def read_launch(env: Mapping[str, str]) -> Launch:
    """The launch that `env` describes (pure: reads nothing else). A malformed value is a DistributedError."""
    for how, rank_v, size_v, local_v, local_size_v in _SCHEMES:
        if size_v not in env:
            continue
        try:
            size, rank = int(env[size_v]), int(env.get(rank_v, "0"))
            local = int(env.get(local_v, str(rank)))
            local_size = int(env.get(local_size_v, str(size)))
        except ValueError:
            raise DistributedError(f"{how} launch: {rank_v}={env.get(rank_v)!r}, {size_v}={env.get(size_v)!r} are "
                                   f"not whole numbers") from None
        if size < 1 or not 0 <= rank < size or not 0 <= local < max(local_size, 1):
            raise DistributedError(f"{how} launch: {rank_v}={rank}, {size_v}={size}, {local_v}={local}: the rank "
                                   f"must be in [0, world size)")
        if how == "torchrun" and "ACCELERATE_USE_CPU" in env:  # accelerate starts its processes through torchrun
            how = "accelerate launch"
        return Launch(rank, size, local, local_size, how)
    return Launch()


def accelerate_cpu_single(env: Mapping[str, str]) -> bool:
    """Whether this looks like `accelerate launch --num_processes N` (N > 1) that started ONE process: with
    --cpu (and no mpirun), or without --multi_gpu on a machine with no GPU. accelerate then sets its own
    variables and MASTER_ADDR (it does for N > 1 only), but no rank variables."""
    return "ACCELERATE_USE_CPU" in env and "MASTER_ADDR" in env and read_launch(env).world_size == 1


_state: dict[str, Any] = {"launch": None}


def launch() -> Launch:
    """This process's launch (read once), with the process group made when WORLD_SIZE > 1: idempotent.
    Under a launcher each process runs 1 torch thread unless OMP_NUM_THREADS says otherwise."""
    if _state["launch"] is not None:
        return _state["launch"]
    info = read_launch(os.environ)
    if info.world_size > 1:
        if "OMP_NUM_THREADS" not in os.environ:  # torchrun and accelerate set it (to 1); other launchers may not
            torch.set_num_threads(1)
        _init_group(info)
    elif accelerate_cpu_single(os.environ):
        print("frozentune: note: accelerate started a single process: `accelerate launch --num_processes N` does so "
              "with --cpu (unless given --mpirun_hostfile) or without --multi_gpu where there is no GPU; for several "
              "CPU processes use `accelerate launch --multi_gpu --num_processes N` (it works without a GPU) or "
              "`torchrun --nproc-per-node N`", file=sys.stderr, flush=True)
    _state["launch"] = info
    return info


def _init_group(info: Launch) -> None:
    import torch.distributed as dist

    if dist.is_initialized():  # made by the caller (e.g. accelerate's Accelerator): use it
        if dist.get_world_size() != info.world_size:
            raise DistributedError(f"a process group of {dist.get_world_size()} ranks exists, but the launch says "
                                   f"{info.world_size}")
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        raise DistributedError(f"{info.how} launch of {info.world_size} processes without MASTER_ADDR / MASTER_PORT: "
                               f"start it with torchrun or accelerate launch, which set them")
    dist.init_process_group(backend, init_method="env://", rank=info.rank, world_size=info.world_size)
    atexit.register(_destroy)


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return launch().world_size


def rank() -> int:
    return launch().rank


def is_main() -> bool:
    """Rank 0 (or the only process): the one that prints and writes outputs."""
    return launch().rank == 0


def device(spec: str) -> torch.device:
    """The device this rank trains on: `spec`, with a bare "cuda" meaning cuda:LOCAL_RANK under a launcher."""
    d = torch.device(spec)
    info = launch()
    if d.type == "cuda" and d.index is None and info.world_size > 1:
        return torch.device("cuda", info.local_rank % max(torch.cuda.device_count(), 1))
    return d


def shard_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous slice of n items: sizes differ by at most 1, the first
    n mod world ranks get the larger ones; a rank gets an empty slice when n < world."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard(items: Sequence | np.ndarray) -> Sequence | np.ndarray:
    """This rank's contiguous slice of a global batch (all of it in one process)."""
    info = launch()
    if info.world_size == 1:
        return items
    start, stop = shard_bounds(len(items), info.world_size, info.rank)
    return items[start:stop]


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        with collective("waiting for the other processes"):
            dist.barrier()


def _bucket(params: Sequence[nn.Parameter], limit: int = 1 << 24) -> list[list[nn.Parameter]]:
    """Parameters in buckets of at most `limit` elements (one bigger parameter gets a bucket of its own)."""
    buckets: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in params:
        if buckets[-1] and size + p.numel() > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel()
    return buckets


def reduce_gradients(params: Sequence[nn.Parameter], extras: Sequence[float] = ()) -> list[float]:
    """Sum the gradients of `params` over the ranks, in place, and the numbers `extras` (e.g. each
    rank's part of the loss); returns the summed extras. A parameter whose gradient is None on
    every rank keeps None (as in one process, where AdamW then leaves it alone); one that has a
    gradient on some rank gets the sum (None elsewhere counting as zeros), so a rank with an
    empty slice takes part with no gradients at all. Every rank must call it with the same
    parameters in the same order. One process: returns extras unchanged."""
    extras = [float(x) for x in extras]
    if world_size() == 1:
        return extras
    import torch.distributed as dist

    # presence flags and extras in float64 (the loss parts are summed to full precision)
    # (a CPU tensor: gloo carries it, also beside NCCL)
    small = torch.tensor([0.0 if p.grad is None else 1.0 for p in params] + extras, dtype=torch.float64)
    with collective("summing the gradients"):
        dist.all_reduce(small)
    present = small[:len(params)].cpu().tolist()
    for bucket in _bucket([p for p, k in zip(params, present) if k > 0]):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
        with collective("summing the gradients"):
            dist.all_reduce(flat)
        offset = 0
        for p in bucket:
            g = flat[offset:offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
            offset += p.numel()
    for p, k in zip(params, present):
        if k == 0:
            p.grad = None
    return small[len(params):].cpu().tolist()


def broadcast_module(module: nn.Module) -> None:
    """Rank 0's trainable parameters and buffers, copied to every rank (so every rank starts the same)."""
    if world_size() == 1:
        return
    import torch.distributed as dist

    with torch.no_grad():
        for t in [p for p in module.parameters() if p.requires_grad] + list(module.buffers()):
            with collective("copying rank 0's weights"):
                dist.broadcast(t.data, src=0)


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` (picklable), on every rank."""
    if world_size() == 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    with collective("copying rank 0's settings"):
        dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank ([obj] in one process)."""
    if world_size() == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size()
    with collective("gathering every rank's values"):
        dist.all_gather_object(out, obj)
    return out


def check_same(what: str, value: Any) -> None:
    """Raise DistributedError on every rank unless all ranks have the same `value` (say `what` it is)."""
    values = gather_objects(value)
    if any(v != values[0] for v in values[1:]):
        shown = "; ".join(f"rank {r}: {v!r}"[:200] for r, v in enumerate(values))
        raise DistributedError(f"the {len(values)} data-parallel ranks disagree on {what} ({shown}): start every "
                               f"rank with the same command, data and seed")


def rank_seed(seed: int) -> int:
    """The torch seed for this rank's own randomness (dropout): `seed` on rank 0 (as in one process),
    an independent one derived from (seed, rank) elsewhere."""
    r = rank()
    # the shift on a Python int: numpy 1.x refuses `np.uint64 >> int` (same value on numpy 2)
    return seed if r == 0 else int(np.random.SeedSequence([seed, r]).generate_state(1, np.uint64)[0]) >> 1


def param_signature(module: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the trainable parameters (to check that every rank built the same model)."""
    return [(n, tuple(p.shape)) for n, p in module.named_parameters() if p.requires_grad]

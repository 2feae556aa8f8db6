"""CUDA graphs for the heads that share a frozen pass: each head's kernels launched as one graph.

On a GPU the pass over a batch of 16 short texts took 3.8 ms and 8 heads 8.0 ms (one NVIDIA H200,
bench/REPORT.md, "On a GPU"): a head is tens to hundreds of small kernels (Y-Tuning 471 aten ops,
the self-explaining head 411, at one text), and the GPU waits while one Python thread launches them
one by one. A CUDA graph records a head's kernels once, at one batch shape, and launches them all
with one call afterwards.

A graph holds its shapes and its memory: it reads its input from fixed tensors and writes its
output to fixed tensors. So, per batch shape (rows B rounded up to a power of two, tokens T as the
pass padded them), the heads reading the same layers share one fixed input (the states, the mask),
which each batch is copied into once; the rows past the batch's (one zero token at first, later
whatever an earlier batch left there) are computed and dropped unread (no head mixes rows). Each head records its graphs into a memory pool of its own and
replays them on a CUDA stream of its own, after the batch's rows are in the fixed input: the GPU runs
the heads of a batch side by side (each is far too small to fill it), and their answers are read once
all are queued (ClassifierGroup.answer).

A head records where its forward has no step that needs the data's values on the host (the
self-explaining head runs its every-slot form there: Head.static_shapes). Where a head cannot be
recorded, the error is logged once and that head runs without graphs. A head that only some rows of a
batch ask for, and sentence pairs (their separator mask), run without graphs too.

Graphs need CUDA; `capture` is replaceable so that everything around the recording (the fixed
inputs, the padding, the slicing of outputs) is tested on a CPU with `rerun` (the head called again
into the same fixed output tensors at each replay).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..head import Features, Output

# graphs one group keeps (heads × shapes); past it, a new shape runs without graphs (said once in the log)
MAX_GRAPHS = 1024


@dataclass
class Fixed:
    """The fixed input of one (layers, dtype, B, T) shape: (B, T, D) states and (B, T) mask."""
    hidden: Tensor
    mask: Tensor
    batch: int = -1  # the batch whose rows were last copied in
    ready: object = None  # on CUDA: an event recorded after they were


class Recorded:
    """A head's graph at one shape: replay() runs it, `out` holds its last output."""

    def __init__(self, replay: Callable[[], None], out: Output):
        self.replay, self.out = replay, out


Capture = Callable[[Callable[[], Output], torch.device, object], Recorded]


def cuda_capture(fn: Callable[[], Output], device: torch.device, pool: object) -> Recorded:
    """fn's kernels as a CUDA graph, after two calls on a side stream (kernels chosen, workspaces
    and anything the head keeps from its weights made: none of that may happen while recording).
    capture_begin/end rather than torch.cuda.graph(), which also collects Python's garbage and empties
    the allocator's cache at every recording, while the server's other requests wait."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
        side.synchronize()
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            out = fn()
        except BaseException:
            with contextlib.suppress(Exception):  # the recording is invalid: end it, and say the head's error
                graph.capture_end()
            raise
        graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(side)
    return Recorded(graph.replay, out)


def rerun(fn: Callable[[], Output], device: torch.device, pool: object) -> Recorded:
    """For tests on a CPU: the same fixed input and output tensors as a graph, with replay() calling
    the head again and copying its output into them."""
    out = fn()

    def replay() -> None:
        new = fn()
        out.logits.copy_(new.logits)
        for name, value in new.extras.items():
            out.extras[name].copy_(value)
    return Recorded(replay, out)


def padded_rows(n: int) -> int:
    """Rows a batch of n is recorded at: the next power of two (1, 2, 4, … ), so few shapes."""
    return 1 << max(0, n - 1).bit_length()


class HeadGraphs:
    """Per group: the fixed inputs and each head's recorded graphs. Used from one thread at a time
    (the batcher's, or its finisher's with --pipeline on)."""

    def __init__(self, device: torch.device, log: Callable[[str], None] = print, capture: Capture | None = None,
                 limit: int = MAX_GRAPHS):
        if capture is None and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the heads run on {device}: give --cuda-graphs off or auto")
        self.device, self.log, self.limit = device, log, limit
        self.capture = capture or cuda_capture
        self.cuda = capture is None
        self.pools: dict[str, object] = {}  # per head: graphs that may run side by side must not share memory
        self.streams: dict[str, torch.cuda.Stream] = {}
        self.fixed: dict[tuple, Fixed] = {}
        self.graphs: dict[tuple, Recorded] = {}
        self.failed: dict[str, str] = {}  # task name → why its head runs without graphs
        self.full = False
        self.batch = 0
        self.seconds = 0.0  # spent recording

    def next_batch(self) -> None:
        """Call once per batch, before its heads: the fixed inputs are copied in again."""
        self.batch += 1

    def run(self, task: str, head: torch.nn.Module, precision: str, layers: tuple, hidden: Tensor,
            mask: Tensor) -> Output | None:
        """The head's output on (B, T, D) states and (B, T) mask from its graph at this shape (recorded
        now if new), or None where it runs without one (the caller runs it eagerly). The output's
        tensors are the graph's own: read them before the next batch."""
        if task in self.failed:
            return None
        B, T = mask.shape
        rows = padded_rows(B)
        gkey = (task, rows, T)
        graph = self.graphs.get(gkey)
        if graph is None and self.full:
            return None
        fixed = self._fill((layers, hidden.dtype, rows, T), hidden, mask)
        if graph is None:
            graph = self._record(task, head, precision, fixed, gkey)  # recording runs nothing
            if graph is None:
                return None
        self._replay(task, graph, fixed)
        return Output(graph.out.logits[:B], {k: v[:B] for k, v in graph.out.extras.items()})

    def describe(self) -> str:
        """One line for the log and /v1/models."""
        made = f"{len(self.graphs)} recorded in {self.seconds:.1f} s"
        if self.failed:
            made += "; without: " + ", ".join(f"{t} ({why})" for t, why in self.failed.items())
        return made

    def _replay(self, task: str, graph: Recorded, fixed: Fixed) -> None:
        """The head's graph on its own stream once the batch's rows are in `fixed`; work queued after this
        on the current stream (reading the output, the next batch's copy into `fixed`) waits for it."""
        if not self.cuda:
            graph.replay()
            return
        stream = self.streams.get(task)
        if stream is None:
            stream = self.streams[task] = torch.cuda.Stream(self.device)
        stream.wait_event(fixed.ready)
        with torch.cuda.stream(stream):
            graph.replay()
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def _fill(self, key: tuple, hidden: Tensor, mask: Tensor) -> Fixed:
        """The fixed input of this shape with the batch's rows in it (copied once per batch); rows past B
        hold one zero token when made, then an earlier batch's rows, whose answers are dropped."""
        fixed = self.fixed.get(key)
        if fixed is None:
            _, dtype, rows, T = key
            fixed = Fixed(hidden.new_zeros(rows, T, hidden.shape[-1]), mask.new_zeros(rows, T))
            fixed.mask[:, 0] = True
            self.fixed[key] = fixed
        if fixed.batch != self.batch:
            B = hidden.shape[0]
            fixed.hidden[:B].copy_(hidden)
            fixed.mask[:B].copy_(mask)
            fixed.batch = self.batch
            if self.cuda:
                fixed.ready = torch.cuda.Event()
                fixed.ready.record(torch.cuda.current_stream(self.device))
        return fixed

    def _record(self, task: str, head: torch.nn.Module, precision: str, fixed: Fixed, gkey: tuple) -> Recorded | None:
        def call() -> Output:
            with torch.no_grad(), head.static_shapes():
                return head(Features(fixed.hidden, fixed.mask, None, precision))
        t0 = time.perf_counter()
        try:
            if self.cuda and task not in self.pools:
                self.pools[task] = torch.cuda.graph_pool_handle()
            graph = self.capture(call, self.device, self.pools.get(task))
        except Exception as e:  # noqa: BLE001 - any failure to record is logged and that head runs eagerly
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.failed[task] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            self.log(f"serve: task {task!r}: its head could not be recorded as a CUDA graph "
                     f"({self.failed[task]}); it runs without one")
            return None
        self.graphs[gkey] = graph
        self.seconds += time.perf_counter() - t0
        if len(self.graphs) >= self.limit:
            self.full = True
            self.log(f"serve: {len(self.graphs)} CUDA graphs recorded (the most kept); heads at a new batch shape "
                     f"run without one")
        return graph


def graphs_choice(option: str, device: torch.device) -> tuple[bool, str]:
    """Whether a group's heads run as CUDA graphs (--cuda-graphs), and why. auto: on a CUDA device;
    on: an error elsewhere."""
    if option == "off":
        return False, "--cuda-graphs off"
    if device.type != "cuda":
        if option == "on":
            from .models import ServeError

            raise ServeError(f"--cuda-graphs on: the heads run on {device}, and CUDA graphs need a CUDA device; "
                             f"give --device cuda, or --cuda-graphs auto or off")
        return False, f"auto: off on {device.type} (CUDA graphs need a CUDA device)"
    return True, f"--cuda-graphs {option}"

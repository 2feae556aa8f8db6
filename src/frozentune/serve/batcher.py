"""Dynamic batching: jobs from concurrent requests wait a short while in one queue and run together.

A job is one row of work (a text for one pass, a source for one LM) with a `group` (the pass or LM
that runs it), a `key` (jobs share a batch only when group and key are equal: e.g. the beam width of
a generation) and a `cost` in padded tokens. One worker thread takes the oldest job, gathers the
later jobs of its group and key in arrival order while the batch's padded size (rows × the longest
cost) stays within the token budget, waits at most `max_wait_s` after the oldest job arrived for
the batch to fill, runs it, and answers each job's future. Past `max_queue` waiting jobs a submit is
refused (`Overloaded`, with a Retry-After estimate from the recent throughput): memory stays bounded.

Refill (groups with `refill = True`: generation). A decode runs for seconds and costs little more
for 8 rows than for 4, so its batches should hold every client that is waiting. Left alone they
split into cohorts: while one batch decodes, the clients it does not hold queue up; when it ends,
they start at once, and the clients just answered come back a few milliseconds later, too late, and
queue for the next one. So when a refill group's batch ends, the next batch of that group and key
waits until the rows just answered plus the rows that were already waiting are there again (their
clients' next requests), or `refill_wait_s` has passed since the worker became free, whichever is
first, and never while another group's rows are waiting. A lone client sending one request after
another is not slowed: its target is its own next request.

Lanes. A group's `lane` attribute (default "") names the worker that runs its batches; each lane has
its own worker, queue order and refill state, and the queue bound counts every lane's rows. Within a
lane, one worker takes batches one at a time: each batch uses all the cores (or the GPU) torch is
given, so two batches at once would only take turns. Generation groups have a lane of their own: a
decode runs for seconds (a long one for minutes), and a classify batch that waited behind it waited
that long for 0.02 s of work; in its own lane it runs beside the decode, sharing the cores.

A job whose future was cancelled before its batch started (its client went away, or the server's
grace period at shutdown ran out) is dropped when the batch is taken; a future whose batch has
started cannot be cancelled (set_running_or_notify_cancel), so every answer finds it waiting.

For the groups `split` names, a batch's work comes in two parts: the worker runs begin(jobs) (a
classify batch's backbone pass; FrozenPass.begin) and hands the rest (its heads and answers) to a
second thread, the finisher, then starts the next batch. At most two batches of a lane are under way
at once (one in the worker, one handed over), so memory stays bounded and a slow finisher holds the
worker back; meanwhile the next batch keeps filling.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from ..errors import FrozentuneError


class Overloaded(FrozentuneError, RuntimeError):
    """The queue is full: try again after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Closed(Overloaded):
    """The batcher was closed (Engine.close(), or the server stopping): it takes no more jobs. Over
    HTTP a 503 like a full queue; from Python, its own type and words."""

    def __init__(self):
        super().__init__("closed: no more requests are taken (the server is shutting down, or Engine.close() was "
                         "called; an embedded Engine is used until it is closed)", 1)


@dataclass
class Job:
    group: Any                 # what runs it: has run(jobs) -> results, one per job, and where the batcher's
                               # `split` says so, begin(jobs) -> a Deferred
    key: Hashable              # jobs of one batch have equal keys
    cost: int                  # padded tokens this row occupies (its length)
    payload: Any
    future: Future = field(default_factory=Future)
    t0: float = field(default_factory=time.perf_counter)
    # set when nobody waits for the answer any more (its request cancelled: the client left, or cut off at
    # shutdown); a group whose batch runs long (a decode) reads it to stop once every row of it is gone
    gone: threading.Event | None = None


@dataclass
class Deferred:
    """What a group's begin(jobs) returns: the rest of the batch's work, which the batcher's finisher
    thread runs while the worker starts the next batch."""
    finish: Callable[[], list]  # () -> one result per job


@dataclass
class BatchStats:
    rows: int
    tokens: int     # rows × the longest cost: the padded size that ran
    seconds: float  # from the batch's start to its answers (with a Deferred part: its wait for the finisher too)
    waited: float   # how long the oldest job waited before its batch started
    group: str


@dataclass(eq=False)
class _Lane:
    """One worker's share: its jobs in arrival order, its refill target, its batches under way."""
    name: Hashable
    pending: deque = field(default_factory=deque)
    refill: tuple | None = None  # (group, key, rows to wait for, until)
    under_way: threading.BoundedSemaphore = field(default_factory=lambda: threading.BoundedSemaphore(2))
    thread: threading.Thread | None = None


def lane_of(group: Any) -> Hashable:
    return getattr(group, "lane", "")


class Batcher:
    def __init__(self, batch_tokens: int = 8192, max_wait_s: float = 0.005, max_queue: int = 1024,
                 max_rows: int = 256, on_batch: Callable[[BatchStats], None] | None = None,
                 refill_wait_s: float = 0.05, split: Callable[[Any], bool] | None = None):
        if batch_tokens < 1 or max_queue < 1 or max_rows < 1 or max_wait_s < 0 or refill_wait_s < 0:
            raise ValueError("batch_tokens, max_queue and max_rows must be at least 1, max_wait_s and "
                             "refill_wait_s at least 0")
        self.batch_tokens, self.max_wait_s, self.max_queue, self.max_rows = batch_tokens, max_wait_s, max_queue, max_rows
        self.refill_wait_s = refill_wait_s
        self.split = split or (lambda group: False)  # whether a group's batches are begun and finished apart
        self.on_batch = on_batch
        self._lanes: dict[Hashable, _Lane] = {}
        self._cv = threading.Condition()
        self._closing = False
        self._running = 0  # lane workers not yet stopped (the last one to stop stops the finisher)
        self._rate = 0.0  # jobs per second of the recent batches (exponential mean), for Retry-After
        self._handoff: queue.Queue = queue.Queue()  # (lane, batch, Deferred, start) for the finisher; None: stop
        self._finisher = threading.Thread(target=self._finish_loop, name="frozentune-finisher", daemon=True)
        self._finisher.start()
        with self._cv:
            self._thread = self._lane("").thread  # the default lane's worker (classify)

    def _lane(self, name: Hashable) -> _Lane:
        """Under the lock: the lane `name`, its worker started on first use."""
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = _Lane(name)
            label = f"frozentune-batcher{'-' + str(name) if name != '' else ''}"
            lane.thread = threading.Thread(target=self._loop, args=(lane,), name=label, daemon=True)
            self._running += 1
            lane.thread.start()
        return lane

    # ------------------------------------------------------------------ submitting
    def submit(self, jobs: Sequence[Job]) -> list[Future]:
        """Queue jobs (all or none); their futures get each job's result or exception."""
        with self._cv:
            if self._closing:
                raise Closed()
            if self.depth + len(jobs) > self.max_queue:
                raise Overloaded(f"{self.depth} rows are waiting and this request needs {len(jobs)} more (the bound "
                                 f"is {self.max_queue}); retry shortly", self.retry_after())
            for j in jobs:
                self._lane(lane_of(j.group)).pending.append(j)
            self._cv.notify_all()  # one condition for every lane's worker: each looks at its own queue
        return [j.future for j in jobs]

    def retry_after(self) -> int:
        """Seconds until the queue has drained at the recent rate (at least 1)."""
        return max(1, math.ceil(self.depth / self._rate)) if self._rate > 0 else 1

    @property
    def depth(self) -> int:
        """Rows waiting, every lane's."""
        return sum(len(lane.pending) for lane in list(self._lanes.values()))

    def close(self, timeout: float | None = None) -> None:
        """Finish every queued job, then stop the workers and the finisher."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            threads = [lane.thread for lane in self._lanes.values()]
        end = None if timeout is None else time.perf_counter() + timeout
        for t in threads:
            t.join(None if end is None else max(0.0, end - time.perf_counter()))
        self._finisher.join(None if end is None else max(0.0, end - time.perf_counter()))

    # ------------------------------------------------------------------ the worker
    def _take(self, lane: _Lane) -> list[Job] | None:
        """Under the lock: the lane's next batch (oldest job first) of jobs whose futures were not
        cancelled (each now running, so it can no longer be), or None when closing with nothing left."""
        while True:
            while not lane.pending and not self._closing:
                self._cv.wait()
            if not lane.pending:
                return None
            first = lane.pending[0]
            batch, full = self._gather(lane, first)
            left = max(first.t0 + self.max_wait_s, self._refill_until(lane, first, len(batch))) - time.perf_counter()
            if full or left <= 0 or self._closing:
                lane.refill = None
                for j in batch:
                    lane.pending.remove(j)
                batch = [j for j in batch if j.future.set_running_or_notify_cancel()]  # a cancelled one: dropped
                if batch:
                    return batch
                continue
            self._cv.wait(left)

    def _refill_until(self, lane: _Lane, first: Job, rows: int) -> float:
        """Under the lock: until when first's batch of `rows` waits for the rows of the batch just
        answered to come back (see Refill above); 0 when it does not wait."""
        if lane.refill is None:
            return 0.0
        group, key, target, until = lane.refill
        if first.group is not group or first.key != key or rows >= target:
            return 0.0
        if any(j.group is not group or j.key != key for j in lane.pending):
            return 0.0  # another group's rows are waiting: do not hold them up
        return until

    def _gather(self, lane: _Lane, first: Job) -> tuple[list[Job], bool]:
        """Jobs of first's group and key, in arrival order, within the budget; whether it is full."""
        batch, longest = [], 0
        for j in lane.pending:
            if j.group is not first.group or j.key != first.key:
                continue
            grown = max(longest, j.cost)
            if batch and (grown * (len(batch) + 1) > self.batch_tokens or len(batch) >= self.max_rows):
                return batch, True
            batch.append(j)
            longest = grown
        return batch, longest * len(batch) >= self.batch_tokens or len(batch) >= self.max_rows

    def _loop(self, lane: _Lane) -> None:
        try:
            while True:
                lane.under_way.acquire()  # while two batches are under way, the next one keeps filling
                with self._cv:
                    batch = self._take(lane)
                if batch is None:
                    return
                start = time.perf_counter()
                try:
                    group = batch[0].group
                    results = group.begin(batch) if self.split(group) else group.run(batch)
                except Exception as e:  # answered to every request of the batch; the worker goes on
                    self._fail(lane, batch, e)
                    continue
                if isinstance(results, Deferred):
                    self._handoff.put((lane, batch, results, start))
                else:
                    self._answer(lane, batch, results, start)
        finally:
            with self._cv:
                self._running -= 1
                last = self._running == 0
            if last:
                self._handoff.put(None)

    def _finish_loop(self) -> None:
        while (item := self._handoff.get()) is not None:
            lane, batch, deferred, start = item
            try:
                results = deferred.finish()
            except Exception as e:
                self._fail(lane, batch, e)
                continue
            self._answer(lane, batch, results, start)

    def _fail(self, lane: _Lane, batch: list[Job], e: Exception) -> None:
        for j in batch:
            j.future.set_exception(e)
        lane.under_way.release()

    def _answer(self, lane: _Lane, batch: list[Job], results: list, start: float) -> None:
        """Each job's result to its future; the rate and refill bookkeeping; on_batch."""
        seconds = time.perf_counter() - start
        group, key = batch[0].group, batch[0].key
        if getattr(group, "refill", False) and self.refill_wait_s > 0:
            with self._cv:  # set before the answers go out, so that no returning row is missed
                waiting = sum(1 for j in lane.pending if j.group is group and j.key == key)
                lane.refill = (group, key, min(len(batch) + waiting, self.max_rows),
                               time.perf_counter() + self.refill_wait_s)
        for j, r in zip(batch, results):
            j.future.set_result(r)
        lane.under_way.release()
        rate = len(batch) / max(seconds, 1e-6)
        self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate
        if self.on_batch is not None:
            self.on_batch(BatchStats(len(batch), max(j.cost for j in batch) * len(batch), seconds,
                                     start - batch[0].t0, getattr(group, "label", "?")))

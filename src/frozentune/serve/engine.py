"""Engine: the served tasks on one dynamic batcher, callable from Python (blocking or awaitable) and
from the HTTP app, which adds nothing but transport.

    engine = Engine.load(["runs/a", "runs/b"])           # or a folder of saved models
    engine.classify(["text", ...], tasks=None, explain=False, top=5)
    engine.generate("e2e-prefix", ["name[Aromi] ..."], num_beams=None, max_new_tokens=None)
    await engine.aclassify(...); await engine.agenerate(...)
    engine.close()                                        # finishes what is queued

A classify request becomes one job per text and per pass group (heads on one frozen backbone are
one group: one pass); a generate request one job per source. Jobs of concurrent requests share
batches (batcher.py). Requests are checked before anything is queued: a bad one raises
RequestError (with the HTTP status it maps to) and queues nothing.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..pyterms import field_flags, in_python_terms
from ..errors import FrozentuneError
from ..backbone import cut_words, textless_message
from ..data import blank, invisible, unencodable
from .batcher import BatchStats, Batcher, Job
from .graphs import HeadGraphs, graphs_choice
from .models import FrozenPass, ServeError, Task, TaskFailed, find_models, load_tasks, pipeline_choice, task_failed


class ServeTypeError(FrozentuneError, TypeError):
    """An argument of the wrong type given to the serving API from Python; the message says what to give."""


class RequestError(FrozentuneError, ValueError):
    """A request that cannot be served as given; `status` is the HTTP status it is answered with."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


@dataclass
class ServeOptions:
    batch_tokens: int = field(default=8192, metadata={"help": "padded tokens per batch (rows × the longest row)"})
    max_wait_ms: float = field(default=5.0, metadata={"help": "how long the oldest waiting row may wait for its "
                                                               "batch to fill, in milliseconds"})
    refill_wait_ms: float = field(default=50.0, metadata={
        "help": "generate: after a batch, how long the next one may wait for the clients just answered to send "
                "again, so that they share it (0: off), in milliseconds"})
    pad_multiple: int = field(default=8, metadata={
        "help": "classify: pad each batch to a multiple of this many tokens (at most max_length), so that batches "
                "come in few shapes and the kernels' per-shape caches stop growing (1: pad to the longest row)"})
    pack_tokens: bool = field(default=True, metadata={
        "help": "classify: run the frozen backbone's linear layers on the real tokens only, none on a batch's "
                "padding (BERT-style encoders; another model runs padded, and /v1/models says so under 'pass')"})
    pipeline: str = field(default="auto", metadata={
        "help": "classify: run a batch's heads and answers on a second thread while the backbone's pass of the next "
                "batch runs (on, off; auto: on for a CPU pass that leaves torch a free core, off where torch uses "
                "every core or on a GPU); the startup log and /v1/models say which", "choices": ("auto", "on", "off")})
    cuda_graphs: str = field(default="auto", metadata={
        "help": "classify: record each head of a shared pass as a CUDA graph per batch shape, launched with one call "
                "(auto: on a CUDA device; on: an error elsewhere; off); the startup log and /v1/models say which",
        "choices": ("auto", "on", "off")})
    warmup: bool = field(default=False, metadata={
        "help": "classify: at startup, run two requests of texts at max_length, a token budget each, through every "
                "pass and its heads, overlapping as under load: resident memory starts at the most batches of "
                "that budget need and then stays flat (8 MiniLM heads: 1.03 GB, against 0.73-0.80 GB reached "
                "under short texts without it), and the first requests pay no one-time costs"})
    max_queue: int = field(default=4096, metadata={"help": "rows (texts × pass groups, sources) waiting; past it a "
                                                           "request is answered 503 with Retry-After"})
    max_texts: int = field(default=64, metadata={"help": "texts or sources in one request (more: 413)"})
    max_top: int = field(default=50, metadata={"help": "explain: the most tokens or spans a request may ask for"})
    max_beams: int = field(default=8, metadata={"help": "generate: the widest beam a request may ask for"})
    max_new_tokens: int = field(default=256, metadata={"help": "generate: the most new tokens a request may ask for"})

    def validate(self) -> "ServeOptions":
        from ..fields import as_flag, wrong_value

        if (why := wrong_value(self, flag=True)) is not None:  # e.g. max_texts="3" from Python
            raise ServeError(why)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if "choices" in f.metadata:
                if value not in f.metadata["choices"]:
                    raise ServeError(f"{as_flag(f.name)} {value!r}: choose one of "
                                     f"{', '.join(f.metadata['choices'])}")
                continue
            if isinstance(value, bool):
                continue
            least = 0 if f.name.endswith("_ms") else 1
            if f.name.endswith("_ms") and not math.isfinite(value):  # NaN passed `< 0`; inf: a lone request waited for ever
                raise ServeError(f"{as_flag(f.name)} {value}: give a number of milliseconds, 0 or more")
            if getattr(self, f.name) < least:
                raise ServeError(f"{as_flag(f.name)} {getattr(self, f.name)}: must be at least {least}")
        return self


Assemble = Callable[[list], Any]


class FailureLog:
    """Task failures told to the operator: the HTTP answer said them to the client only, and the log said
    nothing. One line per task at most every `every_s` seconds (a head that fails on every text would
    otherwise write a line per request), the next line saying how many failures went unsaid in between;
    `totals` counts them all (/health, and /metrics' frozentune_task_failures_total)."""

    def __init__(self, log: Callable[[str], None], every_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.log, self.every_s, self.clock = log, every_s, clock
        self.totals: dict[str, int] = {}
        self._said: dict[str, float] = {}  # when each task's last line was said
        self._unsaid: dict[str, int] = {}  # failures since then
        self._lock = threading.Lock()  # requests are assembled on the event loop and on callers' threads

    def failed(self, task: str, times: int, message: str) -> None:
        """Task `task` failed on `times` texts (or sources) of one request, the first with `message`."""
        with self._lock:
            self.totals[task] = self.totals.get(task, 0) + times
            now, last = self.clock(), self._said.get(task)
            if last is not None and now - last < self.every_s:
                self._unsaid[task] = self._unsaid.get(task, 0) + times
                return
            self._said[task] = now
            unsaid = self._unsaid.pop(task, 0)
        more = (f" ({unsaid} more failure{'s' if unsaid > 1 else ''} of it in the last {now - last:.0f} s not said: "
                f"a line per task every {self.every_s:g} s at most)" if unsaid else "")
        self.log(f"serve: {task}: failed on {times} {'text' if times == 1 else 'texts'} of a request: {message}{more}")


def whole(name: str, value: Any, least: int, most: int, most_text: str | None = None) -> int:
    """value, if it is an int (not a bool) from least to most; else RequestError naming the field."""
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        raise RequestError(f"{name} {value!r}: give a whole number from {least} to {most_text or most}")
    return value


def serve_options_terms() -> dict[str, str]:
    """`frozentune serve`'s options as a Python caller gives them: ServeOptions' fields (Engine.load's `options`)."""
    return field_flags(ServeOptions, lambda f: f"ServeOptions({f}=…)")


class Engine:
    def __init__(self, tasks: Sequence[Task], options: ServeOptions | None = None,
                 log: Callable[[str], None] = print):
        self.options = (options or ServeOptions()).validate()
        self.tasks = {t.name: t for t in tasks}
        self.started = time.time()
        self.batches: list[BatchStats] = []  # the most recent ones (bounded), for tests and /v1/models
        self._observers: list[Callable[[BatchStats], None]] = []
        self.failures = FailureLog(log)
        self._failure_observers: list[Callable[[str, int], None]] = []
        o = self.options
        for g in self.groups:
            if isinstance(g, FrozenPass):
                g.backbone.pack = o.pack_tokens
        # per group: whether its heads run beside the next pass, and why (this engine's own: groups may be shared)
        self.pipelined = {g: pipeline_choice(o.pipeline, g.backbone.device) for g in self.groups if isinstance(g, FrozenPass)}
        # per group: whether its heads run as CUDA graphs, and why (set on the group: the last engine made decides)
        self.graphed = {g: graphs_choice(o.cuda_graphs, g.backbone.device) for g in self.pipelined}
        for g, (on, _) in self.graphed.items():
            g.graphs = HeadGraphs(g.backbone.device, log) if on else None
        self.batcher = Batcher(o.batch_tokens, o.max_wait_ms / 1000.0, o.max_queue, on_batch=self._on_batch,
                               refill_wait_s=o.refill_wait_ms / 1000.0,
                               split=lambda g: g in self.pipelined and self.pipelined[g][0])

    @classmethod
    @in_python_terms(also=serve_options_terms)
    def load(cls, paths: Sequence[Path | str], device: str | None = None, precision: str | None = None,
             options: ServeOptions | None = None, log: Callable[[str], None] = print) -> "Engine":
        """Every saved model under `paths` (model folders, or folders of them; one path alone is one
        too), loaded once."""
        from ..api import as_log

        log = as_log(log)  # None: no messages
        if isinstance(paths, (str, Path)):  # not read one character at a time
            paths = [paths]
        if isinstance(paths, (bytes, int, float)) or not hasattr(paths, "__iter__"):
            raise ServeTypeError(f"paths: {paths!r}; give a model folder, or a list of model folders or folders of them")
        if options is not None and not isinstance(options, ServeOptions):
            raise ServeTypeError(f"options: a {type(options).__name__}; give ServeOptions(...), e.g. "
                            f"ServeOptions(**{options!r})" if isinstance(options, dict) else
                            f"options: a {type(options).__name__}; give ServeOptions(...)")
        options = (options or ServeOptions()).validate()
        engine = cls(load_tasks(find_models(paths, log), device, precision, log), options, log)
        for g in engine.groups:
            if isinstance(g, FrozenPass):
                log(f"serve: {g.label}: {g.backbone.pass_layout} pass; {engine.heads_run(g)}")
        if options.warmup:
            log(f"serve: {engine.warm_up()}")
        return engine

    def warm_up(self) -> str:
        """Two requests at the token budget (rows of max_length tokens) through every classify pass group
        and its heads, submitted together so that they overlap as they do under load (the second
        one's pass while the first one's heads run), on the batcher's own threads, whose allocator
        arenas then hold what traffic will need. Generators are not warmed (a decode's memory grows
        with the tokens it makes). Returns what it did, for the log."""
        import psutil

        me = psutil.Process()
        rss0, t0 = me.memory_info().rss, time.perf_counter()
        futures, sizes = [], []
        for group in self.groups:
            tasks = [t for t in self.tasks.values() if t.group is group and t.kind == "classify"]
            if not tasks:  # a generation group
                continue
            rows = max(1, min(self.options.batch_tokens // group.max_length, self.options.max_texts))
            text = " ".join(["warm"] * group.max_length)  # past max_length tokens: cut to it
            for pairs in sorted({t.pairs for t in tasks}):
                names = [t.name for t in tasks if t.pairs == pairs]
                sizes.append(f"{rows} × {group.max_length}")
                for _ in range(2):
                    jobs, _ = self.plan_classify([(text, text) if pairs else text] * rows, names, pairs=pairs)
                    futures += self.batcher.submit(jobs)
        if not futures:
            return "warm-up: nothing to warm (no classify tasks)"
        for f in futures:
            f.result()
        return (f"warm-up: 2 requests of rows × tokens {', '.join(sizes)} (per pass group) "
                f"in {time.perf_counter() - t0:.1f} s; resident memory {rss0 / 2**20:.0f} → "
                f"{me.memory_info().rss / 2**20:.0f} MB (--warmup)")

    # ------------------------------------------------------------------ observing
    def observe(self, fn: Callable[[BatchStats], None]) -> None:
        """Call fn(stats) after every batch (from the batcher's thread)."""
        self._observers.append(fn)

    def on_failure(self, fn: Callable[[str, int], None]) -> None:
        """Call fn(task, times) when a request's answer has task `task` failed on `times` of its texts or sources."""
        self._failure_observers.append(fn)

    def _task_failed(self, task: str, times: int, message: str) -> None:
        self.failures.failed(task, times, message)
        for fn in self._failure_observers:
            fn(task, times)

    def _on_batch(self, stats: BatchStats) -> None:
        self.batches.append(stats)
        del self.batches[:-1000]
        for fn in self._observers:
            fn(stats)

    @property
    def groups(self) -> list:
        return list(dict.fromkeys(t.group for t in self.tasks.values()))

    def heads_run(self, group) -> str:
        """How a group's heads run: beside the next pass or after the pass, and why."""
        if group not in self.pipelined:
            return "its head runs in its own pass"
        on, why = self.pipelined[group]
        graphed, how = self.graphed[group]
        return (f"heads {'beside the next pass' if on else 'after the pass'} ({why}); "
                f"{'as CUDA graphs' if graphed else 'no CUDA graphs'} ({how})")

    def describe(self) -> list[dict]:
        return [t.describe() | ({"heads": self.heads_run(t.group)} if t.kind == "classify" else {})
                | ({"cuda_graphs": t.group.graphs.describe()} if getattr(t.group, "graphs", None) else {})
                for t in self.tasks.values()]

    def close(self, timeout: float | None = None) -> None:
        self.batcher.close(timeout)

    def __enter__(self) -> "Engine":  # with Engine.load(...) as engine: closed at the end of the block
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ classify
    def _texts(self, texts: Any, what: str = "texts", pairs: bool = False) -> list:
        """The request's texts (or, with pairs, its (first, second) pairs), checked."""
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise RequestError(f"{what}: give a list of " + ("[first, second] pairs" if pairs else "strings"))
        if not texts:
            raise RequestError(f"{what}: the list is empty; give at least one")
        if len(texts) > self.options.max_texts:
            raise RequestError(f"{what}: {len(texts)} in one request; the limit is {self.options.max_texts} "
                               f"(send several requests, or start the server with a higher --max-texts)", 413)
        out = []
        for i, t in enumerate(texts):
            if pairs:
                if isinstance(t, str) or not isinstance(t, (list, tuple)) or len(t) != 2:
                    raise RequestError(f"{what}[{i}]: give a pair [first, second] of strings")
                parts = [(f"{what}[{i}][{k}]", x) for k, x in enumerate(t)]
            else:
                parts = [(f"{what}[{i}]", t)]
            for where, x in parts:
                if not isinstance(x, str):
                    raise RequestError(f"{where}: a {type(x).__name__}, not a string")
                if blank(x):
                    raise RequestError(f"{where}: empty{invisible(x)}; give some text")
                if (why := unencodable(x)) is not None:
                    raise RequestError(f"{where}: {why}; send valid Unicode")
            out.append(tuple(t) if pairs else t)
        return out

    def _chosen(self, tasks: Sequence[str] | None, kind: str, explaining: bool = False,
                pairs: bool | None = None) -> list[Task]:
        """The tasks a request asks for (all of `kind` by default); for classify, `pairs` says which
        input it sent: by default the tasks that take that input, and a named task that takes the
        other is refused."""
        mine = [t for t in self.tasks.values() if t.kind == kind]
        if tasks is None and pairs is not None and mine:
            fitting = [t for t in mine if t.pairs == pairs]
            if not fitting:
                other = "single texts (send `texts`)" if pairs else "sentence pairs (send `pairs`)"
                raise RequestError(f"no task of this server takes {'sentence pairs' if pairs else 'single texts'}; "
                                   f"its classify tasks ({', '.join(t.name for t in mine)}) take {other}", 422)
            mine = fitting
        if tasks is None:
            if not mine:
                raise RequestError(f"this server has no {kind} tasks (it serves: {', '.join(self.tasks) or 'nothing'})", 404)
            if explaining and not any(t.explains for t in mine):  # /v1/explain answered with no explanation at all
                raise RequestError(f"no {kind} task of this server gives an explanation (its tasks: "
                                   f"{', '.join(f'{t.name} ({t.method})' for t in mine)}; ytuning, space and "
                                   f"selfexplain models do); use /v1/classify for their predictions", 422)
            return [t for t in mine if t.explains] if explaining else mine
        if isinstance(tasks, str) or not isinstance(tasks, (list, tuple)) or not tasks:
            raise RequestError("tasks: give a non-empty list of task names, or leave it out for all")
        if (odd := next((t for t in tasks if not isinstance(t, str)), None)) is not None:  # a list is unhashable
            raise RequestError(f"tasks: {odd!r} is a {type(odd).__name__}, not a task name; give task names (strings)")
        out = []
        for name in dict.fromkeys(tasks):
            task = self.tasks.get(name) if isinstance(name, str) else None
            if task is None or task.kind != kind:
                known = ", ".join(t.name for t in mine) or "none"
                raise RequestError(f"task {name!r}: not a {kind} task of this server (its {kind} tasks: {known})", 404)
            if pairs is not None and task.pairs != pairs:
                fields = " and ".join(f for f in (task.model.pair_fields or ()) if f)
                raise RequestError(f"task {name!r} takes " + (f"sentence pairs ({fields}): send `pairs`" if task.pairs
                                   else "single texts: send `texts`"), 422)
            if explaining and not task.explains:
                able = ", ".join(t.name for t in mine if t.explains) or "none"
                raise RequestError(f"task {name!r}: {task.no_explanation}; tasks that do: {able}", 422)
            out.append(task)
        return out


    def plan_classify(self, texts: Any, tasks: Sequence[str] | None = None, explain: bool = False,
                      top: int = 5, explaining_only: bool = False, pairs: bool = False,
                      occlusion: bool = False, top_classes: int | None = None) -> tuple[list[Job], Assemble]:
        """The jobs of a classify (or, with explain, explain) request of texts (or, with pairs,
        [first, second] sentence pairs), and how to build its answer from their results; raises
        RequestError for a bad request (nothing queued). occlusion (with explain): every task's
        explanation also lists the words whose removal lowers its prediction most (plan_occlusion);
        every task explains so, those without an explanation of their own too. top_classes: each task's
        scores keep the K likeliest classes, likeliest first, and so do its explanation's per-class parts
        (None: every class)."""
        if top_classes is not None and (not isinstance(top_classes, int) or isinstance(top_classes, bool)
                                        or top_classes < 1):
            raise RequestError(f"top_classes {top_classes!r}: give a whole number of at least 1 (how many of the "
                               f"likeliest classes each task's scores keep), or leave it out for every class")
        jobs, done = self._plan_classify(texts, tasks, explain, top, explaining_only, pairs, occlusion)
        if top_classes is None:
            return jobs, done
        from ..api import likeliest

        def cut(results: list) -> dict:  # after occlusion, which reads every class's probability
            answer = done(results)
            return answer | {"results": [likeliest(row, top_classes) for row in answer["results"]]}
        return jobs, cut

    def _plan_classify(self, texts: Any, tasks: Sequence[str] | None, explain: bool, top: int,
                       explaining_only: bool, pairs: bool, occlusion: bool) -> tuple[list[Job], Assemble]:
        """plan_classify without top_classes."""
        for name, value in (("explain", explain), ("occlusion", occlusion)):
            if not isinstance(value, bool):  # "yes", 1: the HTTP API's schema refuses them, the Python API did not
                raise RequestError(f"{name} {value!r}: give true or false")
        if occlusion and not explain:
            raise RequestError("occlusion is an explanation: add \"explain\": true (or post to /v1/explain)")
        if not isinstance(pairs, bool):  # 1 or "yes" was taken as true
            raise RequestError(f"pairs {pairs!r}: give True (the texts are [first, second] pairs) or False")
        texts = self._texts(texts, "pairs" if pairs else "texts", pairs)
        chosen = self._chosen(tasks, "classify", explaining_only and not occlusion, pairs)
        top = whole("top", top, 1, self.options.max_top)
        jobs: list[Job] = []
        per_text: list[list[int]] = [[] for _ in texts]  # each text's jobs (one per pass group), by index
        views_of: dict[Any, list] = {}  # per group: the texts' token views (occlusion finds their words in them)
        for group in dict.fromkeys(t.group for t in chosen):
            names = {t.name for t in chosen if t.group is group}
            views = explain and (occlusion or any(t.explains for t in chosen if t.group is group))
            tokens, vs = group.tokenize(texts, views)
            views_of[group] = vs
            if empty := group.backbone.textless(texts, [len(x) for x in tokens.ids]):
                raise RequestError(textless_message(f"{'pairs' if pairs else 'texts'}[{empty[0][0]}]", empty[0][1]))
            for i, (x, v) in enumerate(zip(tokens.ids, vs)):
                per_text[i].append(len(jobs))
                # the key is the padding multiple: a classify batch's rows are padded alike
                jobs.append(Job(group, self.options.pad_multiple, len(x), {
                    "ids": x, "view": v, "tasks": names, "explain": top if explain else None, "pair": pairs,
                    "types": None if tokens.types is None else tokens.types[i], "cut": bool(tokens.cut[i])}))

        def assemble(results: list) -> dict:
            rows, failed, times = [], {}, {}  # times: on how many texts each task failed
            for i, text in enumerate(texts):
                merged: dict[str, Any] = {}
                for k in per_text[i]:
                    if isinstance(results[k], Exception):  # the whole batch failed (its pass): each task it ran
                        merged |= {name: task_failed(name, results[k]) for name in jobs[k].payload["tasks"]}
                    else:
                        merged |= results[k]
                for name, got in merged.items():
                    if isinstance(got, TaskFailed):
                        failed.setdefault(name, str(got))
                        times[name] = times.get(name, 0) + 1
                        merged[name] = {"error": str(got)}
                cut = [jobs[k].group.max_length for k in per_text[i] if jobs[k].payload["cut"]]  # went on past it
                chars = sum(map(len, text)) if pairs else len(text)
                row: dict[str, Any] = {"chars": chars, "tasks": {t.name: merged[t.name] for t in chosen},
                                       "truncated": bool(cut)}
                if cut:
                    row["note"] = (f"the {'pair' if pairs else 'text'} reached max_length ({min(cut)} tokens, special "
                                   f"tokens included): {cut_words(pairs)}")
                rows.append(row)
            for name, n in times.items():  # a task that failed on some texts only: how many, said at the top
                self._task_failed(name, n, failed[name])
                if len(texts) > 1:  # how many of them (all: said too, the message is of one text)
                    failed[name] += f" ({n} of the {len(texts)} {'pairs' if pairs else 'texts'})"
            if not any("error" not in x for row in rows for x in row["tasks"].values()):
                # nothing to answer with: the request fails (a 500 over HTTP), naming each task and why
                raise TaskFailed("; ".join(failed.values()))
            answer: dict[str, Any] = {"tasks": [t.name for t in chosen], "results": rows}
            if failed:  # the healthy tasks are answered; these are said once, and in their place per text
                answer["failed"] = failed
            return answer

        if not occlusion:
            return jobs, assemble
        return self.plan_occlusion(texts, chosen, top, pairs, jobs, assemble, views_of)

    def plan_occlusion(self, texts: list, chosen: list[Task], top: int, pairs: bool, jobs: list[Job],
                       assemble: Assemble, views_of: dict) -> tuple[list[Job], Assemble]:
        """A classify plan (`jobs`, `assemble`) with occlusion added: each text is read once more per word, cut
        out in turn (frozentune.occlusion, as `frozentune explain --occlusion`), in the same batches as the
        rest. A task whose cut texts failed fails on that text, as for its own row. views_of: per pass group,
        the texts' token views, as the plan tokenised them."""
        from ..occlusion import cuts, ranked, with_occlusion

        first, plans = len(jobs), []
        for group in dict.fromkeys(t.group for t in chosen):
            names = {t.name for t in chosen if t.group is group}
            cut = cuts(texts, views_of[group])  # the words of the part that was read, by its tokenizer
            starts = []
            for per, _ in cut:
                starts.append(len(jobs))
                if per:
                    tokens, _ = group.tokenize([t for _, t in per], False)
                    jobs.extend(Job(group, self.options.pad_multiple, len(x), {
                        "ids": x, "view": None, "tasks": names, "explain": None, "pair": pairs,
                        "types": None if tokens.types is None else tokens.types[k]}) for k, x in enumerate(tokens.ids))
            plans.append(([t for t in chosen if t.group is group], cut, starts))
        if len(jobs) > self.options.max_queue:
            raise RequestError(f"occlusion reads each text once more per word: this request is {len(jobs)} rows (words "
                               f"× the pass groups they go through), more than the server ever queues (--max-queue "
                               f"{self.options.max_queue}); send fewer or shorter texts", 413)

        def finish(results: list) -> dict:
            answer = assemble(results[:first])
            failed: dict[str, list[str]] = {}
            for tasks, cut, starts in plans:
                for i, (text, c, at) in enumerate(zip(texts, cut, starts)):
                    got = results[at:at + len(c[0])]
                    for task in tasks:
                        row = answer["results"][i]["tasks"][task.name]
                        if "error" in row:
                            continue
                        rows = [g if isinstance(g, Exception) else g[task.name] for g in got]
                        if (bad := next((r for r in rows if isinstance(r, Exception)), None)) is not None:
                            said = str(task_failed(task.name, bad))
                            answer["results"][i]["tasks"][task.name] = {"error": said}
                            failed.setdefault(task.name, []).append(said)
                            continue
                        probs = np.array([[r["scores"][lab] for lab in task.labels] for r in rows])
                        probs = probs.reshape(-1, len(task.labels))  # (words, C); (0, C) for a one-word text
                        found = ranked([text], [c], [task.labels.index(row["label"])], [row["scores"][row["label"]]],
                                       task.labels, top, probs)[0]
                        row["explanation"], row["lines"] = with_occlusion(
                            row["explanation"] if task.explains else {}, row["lines"] if task.explains else [], found)
            for name, said in failed.items():
                self._task_failed(name, len(said), said[0])
                answer.setdefault("failed", {}).setdefault(name, said[0] + (
                    f" ({len(said)} of the {len(texts)} {'pairs' if pairs else 'texts'})" if len(texts) > 1 else ""))
            if not any("error" not in x for row in answer["results"] for x in row["tasks"].values()):
                raise TaskFailed("; ".join(answer["failed"].values()))
            return answer

        return jobs, finish

    @in_python_terms(also=serve_options_terms)
    def classify(self, texts: Sequence[Any], tasks: Sequence[str] | None = None, explain: bool = False,
                 top: int = 5, pairs: bool = False, occlusion: bool = False, top_classes: int | None = None) -> dict:
        """{"tasks": [names], "results": [per text {"tasks": {name: {label, scores[, explanation, lines]}},
        "truncated", "chars"}]} — blocking. occlusion (with explain): each task's explanation also has
        "occlusion", the words whose removal lowers its prediction most (one more row per word).
        top_classes: each task's scores keep its K likeliest classes, likeliest first."""
        return self._wait(*self.plan_classify(texts, tasks, explain, top, pairs=pairs, occlusion=occlusion,
                                              top_classes=top_classes))

    async def aclassify(self, texts: Sequence[Any], tasks: Sequence[str] | None = None, explain: bool = False,
                        top: int = 5, pairs: bool = False, occlusion: bool = False,
                        top_classes: int | None = None) -> dict:
        return await self._await(*self.plan_classify(texts, tasks, explain, top, pairs=pairs, occlusion=occlusion,
                                                     top_classes=top_classes))

    @in_python_terms(also=serve_options_terms)
    def explain(self, texts: Sequence[Any], tasks: Sequence[str] | None = None, top: int = 5,
                pairs: bool = False, occlusion: bool = False, top_classes: int | None = None) -> dict:
        """classify with explanations, for tasks that explain (all of them by default; with occlusion, every
        task, since occlusion explains any) — blocking."""
        return self._wait(*self.plan_classify(texts, tasks, True, top, explaining_only=True, pairs=pairs,
                                              occlusion=occlusion, top_classes=top_classes))

    async def aexplain(self, texts: Sequence[Any], tasks: Sequence[str] | None = None, top: int = 5,
                       pairs: bool = False, occlusion: bool = False, top_classes: int | None = None) -> dict:
        return await self._await(*self.plan_classify(texts, tasks, True, top, explaining_only=True, pairs=pairs,
                                                     occlusion=occlusion, top_classes=top_classes))

    # ------------------------------------------------------------------ generate
    def plan_generate(self, prefix: Any, sources: Any, num_beams: int | None = None,
                      max_new_tokens: int | None = None, min_new_tokens: int = 0) -> tuple[list[Job], Assemble]:
        from ..generation.prefix import encode_sources
        from ..generation.seq2seq import is_seq2seq

        if not isinstance(prefix, str):
            raise RequestError("prefix: give the name of a generation task")
        task = self._chosen([prefix], "generate")[0]
        sources = self._texts(sources, "sources")
        beams = task.decoding["num_beams"] if num_beams is None else num_beams
        new = task.decoding["max_new_tokens"] if max_new_tokens is None else max_new_tokens
        whole("num_beams", beams, 1, self.options.max_beams)
        whole("max_new_tokens", new, 1, self.options.max_new_tokens)
        whole("min_new_tokens", min_new_tokens, 0, new, f"max_new_tokens ({new})")
        group = task.group
        seq2seq = is_seq2seq(group.lm)
        context = getattr(group.lm.config, "max_position_embeddings", None) or 2048
        if seq2seq:  # the source has the encoder to itself; the new tokens fill the decoder's positions
            room = task.tuner.source_limit() or context
            if new > context:
                raise RequestError(f"max_new_tokens {new}: this model's decoder takes {context} positions; ask for fewer")
        else:
            room = context - new - (task.prefix.shape[3] if task.prefix is not None else 0)
        for i, s in enumerate(sources):  # characters first: a huge source is refused without tokenising it
            if not seq2seq and len(s) > 64 * max(room, 1):  # (an encoder's cut reads only a leading part of it)
                raise RequestError(f"sources[{i}]: {len(s):,} characters, far more than this LM's room of "
                                   f"{max(room, 0)} tokens for a source; shorten it", 413)
        ids, cut = [], []
        for i, s in enumerate(sources):  # one at a time: a source too long is refused before the next is read
            with group.tokenizer_lock:
                if seq2seq:  # a long source is cut to the encoder's positions, as generate cuts it
                    (x,), (was_cut,) = task.tuner.encode_sources_cut([s])
                else:
                    x, was_cut = encode_sources(group.tok, [s])[0], False
            ids.append(x)
            cut.append(was_cut)
            if len(x) > room:  # a causal LM's context (generate refuses it too); an encoder of no stated limit
                raise RequestError(f"sources[{i}]: {len(x)} tokens; " + (
                    f"this model's encoder takes {room}: shorten it" if seq2seq else
                    f"with max_new_tokens {new} and the prefix this LM's context of {context} leaves {max(room, 0)}: "
                    f"shorten it or ask for fewer new tokens"), 413)
        jobs = [Job(group, (beams, new, min_new_tokens), (len(x) + new) * beams, {"ids": x, "task": task},
                    gone=threading.Event()) for x in ids]

        def assemble(results: list) -> dict:
            if (failed := next((r for r in results if isinstance(r, Exception)), None)) is not None:
                self._task_failed(task.name, len(sources), f"{type(failed).__name__}: {' '.join(str(failed).split())}")
                raise failed  # one decode for the whole batch: nothing of it to answer with
            return {"prefix": task.name, "num_beams": beams, "max_new_tokens": new,
                    "outputs": [{"source": s, **r, "truncated": c, **({"note": (
                        f"the source is longer than the {room} tokens the encoder takes (special tokens included): "
                        f"its end was cut off, as frozentune generate cuts it")} if c else {})}
                        for s, r, c in zip(sources, results, cut)]}

        return jobs, assemble

    @in_python_terms(also=serve_options_terms)
    def generate(self, prefix: str, sources: Sequence[str], num_beams: int | None = None,
                 max_new_tokens: int | None = None, min_new_tokens: int = 0) -> dict:
        """{"prefix", "num_beams", "max_new_tokens", "outputs": [{source, output, tokens}]} — blocking.
        min_new_tokens > 0 keeps the end-of-text token away until that many (Hugging Face generate's option)."""
        return self._wait(*self.plan_generate(prefix, sources, num_beams, max_new_tokens, min_new_tokens))

    async def agenerate(self, prefix: str, sources: Sequence[str], num_beams: int | None = None,
                        max_new_tokens: int | None = None, min_new_tokens: int = 0) -> dict:
        # planned off the event loop: a source is tokenised whole to be measured (64 sources of 500,000
        # characters held every other request, /health included, for 19 s), and a decode's seconds dwarf the hop
        plan = await asyncio.to_thread(self.plan_generate, prefix, sources, num_beams, max_new_tokens, min_new_tokens)
        return await self._await(*plan)

    # ------------------------------------------------------------------ waiting
    def _fits(self, jobs: list[Job]) -> list[Job]:
        """jobs, unless they are more rows than the queue ever holds: then no retry could succeed, so a
        413 saying so, not the 503 + Retry-After of a queue that is full for now."""
        if len(jobs) > self.options.max_queue:
            raise RequestError(f"this request is {len(jobs)} rows (texts × the pass groups they go through), more than "
                               f"the server ever queues (--max-queue {self.options.max_queue}); send fewer texts", 413)
        return jobs

    # A job's result, or the Exception its batch failed with: `assemble` decides what fails with it (a
    # classify request: only the tasks that job ran; a generate request: the whole request). A cancelled
    # job (CancelledError, a BaseException) still ends the wait.
    def _wait(self, jobs: list[Job], assemble: Assemble):
        futures: list[Future] = self.batcher.submit(self._fits(jobs))
        return assemble([f.exception() or f.result() for f in futures])

    async def _await(self, jobs: list[Job], assemble: Assemble):
        futures = self.batcher.submit(self._fits(jobs))

        async def settled(f: Future):
            try:
                return await asyncio.wrap_future(f)
            except Exception as e:
                return e

        try:
            return assemble(list(await asyncio.gather(*(settled(f) for f in futures))))
        except asyncio.CancelledError:  # rows still queued are dropped (their futures cancelled); a decode under
            for j in jobs:              # way stops at its next token once all of its rows are gone (LMGroup.run)
                if j.gone is not None:
                    j.gone.set()
            raise

"""What `frozentune serve` serves: saved model folders, each loaded once, grouped by the pass they share.

Groups (each runs one batch of jobs at a time; see batcher.py):
  FrozenPass  classifiers that read one frozen backbone (same weights, max_length, device and
              precision): one forward pass per batch, every hidden state kept, and each head reads
              its own layer choice from it, so N heads cost one pass plus N small heads.
  LivePass    a classifier that runs or steers the backbone itself (finetune, encoder prefix): its
              own pass, still batched across requests.
  LMGroup     generators on one causal LM: prefixes of different tasks (and lengths) in one batch
              (Li & Liang §8.2), greedy or beam; a fine-tuned LM is a group of its own.

A job's payload is a dict and its key says how its batch is shaped (classify: the --pad-multiple of
the padded length; generate: beams, max and min new tokens); a group's run(jobs) returns one result
per job. Every number a group returns is computed the way `frozentune predict` / `explain` /
`generate` compute it (the tests hold them equal: identical with --pad-multiple 1 for a text alone,
within float rounding otherwise).

Legend: B rows of a batch, T tokens, C classes.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..errors import FrozentuneError
from .. import model as M
from ..backbone import Backbone, LayerSpec, Tokenized, pad, select_layers
from ..extract.device import oversubscribed, usable_cores
from ..head import Features, Output, TokenView, explains
from ..pairs import Text, separator_ids, separator_mask
from .batcher import Deferred
from .graphs import HeadGraphs


class ServeError(FrozentuneError, ValueError):
    """The models given to serve cannot be served as asked."""


class TaskFailed(RuntimeError):
    """One task failed on a batch (its head raised, or its scores were not numbers). It stays with that
    task: the other tasks of the batch are answered, and a request's answer carries it in that task's
    place (Engine.plan_classify)."""


def task_failed(name: str, e: BaseException) -> TaskFailed:
    """`e` as task `name`'s failure, in one line that names the task."""
    said = " ".join(str(e).split())
    if isinstance(e, TaskFailed) or said.startswith(f"task {name!r}"):
        failed = TaskFailed(said)
    else:
        failed = TaskFailed(f"task {name!r} failed on its batch: {type(e).__name__}: {said}")
    failed.__cause__ = e
    return failed


def find_models(paths: Sequence[Path | str], log: Callable[[str], None] = print) -> list[Path]:
    """Model folders: each path is one (it holds config.json) or a folder of them (its subfolders that do;
    every other entry is said in one line, and skipped; hidden ones are skipped, said where they hold a
    model). A path given twice (however it is written, a link too) is read once, and a model folder reached
    twice (a link to it in a folder of models) is served once, under the name it was first found by; each
    is said."""
    found: list[Path] = []
    read: dict[str, Path] = {}
    for p in map(Path, paths):
        if (where := os.path.realpath(p)) in read:  # its skip lines were said twice
            if str(read[where]) != str(p):
                log(f"serve: {p}: the same folder as {read[where]}, read once")
            continue
        read[where] = p
        if (p / M.CONFIG).is_file():
            found.append(p)
        elif p.is_dir():
            entries = sorted(p.iterdir())
            subs = [q for q in entries if not q.name.startswith(".") and (q / M.CONFIG).is_file()]
            sweep = (p / "sweep.json").is_file()  # a sweep's own folder: its best/ is served, its report is no junk
            skipped = [] if sweep else [(q, why) for q in entries if q not in subs and (why := not_a_model(q))]
            if not subs:
                raise ServeError(no_models(p, skipped))
            for q, why in skipped:
                log(f"serve: {q}: skipped, {why}")
            found += subs
        elif p.exists():
            raise ServeError(f"{p}: a file, not a model folder; give folders written by `frozentune train --output` "
                             f"(or a folder of them)")
        else:
            raise ServeError(f"{p}: no such folder; give folders written by `frozentune train --output`")
    if not found:
        raise ServeError("no model folders given; give folders written by `frozentune train --output`")
    names: dict[str, Path] = {}
    first: dict[str, Path] = {}  # real folder → the path it was first found by
    for f in found:
        if (real := os.path.realpath(f)) in first:  # a link to a model beside it: the same model served twice
            if first[real] != f:
                log(f"serve: {f}: the same model folder as {first[real]}, served once (as {task_name(first[real])!r})")
            continue
        first[real] = f
        name = task_name(f)
        if name in names and names[name].resolve() != f.resolve():
            raise ServeError(f"two models would be served as {name!r} ({names[name]} and {f}); a task is named "
                             f"after its folder (a sweep's best model after the sweep's): rename one")
        names[name] = f
    return list(dict.fromkeys(names.values()))


def no_models(folder: Path, skipped: Sequence[tuple[Path, str]]) -> str:
    """Why `folder` serves nothing, with what to give instead where an entry of it says (a sweep's output,
    a folder of models, a hidden model): the generic message alone left the way to them unsaid."""
    said = f"{folder}: neither a saved model (no {M.CONFIG}) nor a folder of saved models"
    if (folder / "onnx.json").is_file() and (folder / "model.onnx").is_file():
        return (f"{said}: an ONNX export (`frozentune export --format onnx`), which serve does not run; serve the "
                f"model folders it was exported from, or run the graph with `frozentune predict --onnx {folder}` "
                f"or ONNX Runtime")
    hints = [f"{q.name}: {why}" for q, why in skipped if why.startswith(HINTED)]
    if hints:
        return f"{said}; in it, {'; '.join(hints)}"
    return f"{said}; give folders written by `frozentune train --output`"


def task_name(folder: Path) -> str:
    """The task a model folder is served as: the folder's name, or for a sweep's best model (best/ beside
    its sweep.json) the sweep folder's name (two sweeps were both served as "best", and clashed)."""
    if folder.name == "best" and (folder.parent / "sweep.json").is_file():
        return Path(os.path.abspath(folder)).parent.name
    return folder.name


# how not_a_model's answers that say where a model is begin (no_models repeats them in its error)
HINTED = ("a sweep's output folder", "a folder of models", "a model in a hidden folder")


def not_a_model(entry: Path) -> str | None:
    """Why an entry of a folder of models is not one, in words that say what to do; None for a hidden
    entry that holds no model (.git, .ipynb_checkpoints, .DS_Store: nobody meant it as a model)."""
    if entry.name.startswith("."):  # .old-sst2 was served as task ".old-sst2"
        return ("a model in a hidden folder (its name starts with '.'): rename it to serve it"
                if (entry / M.CONFIG).is_file() else None)
    if entry.is_symlink() and not entry.exists():
        return f"a broken link (to {os.readlink(entry)})"
    if not entry.is_dir():
        return "a file, not a model folder"
    if (entry / "best" / M.CONFIG).is_file():
        return f"a sweep's output folder: to serve its best model, give {entry / 'best'} (or link it here)"
    try:
        inside = list(entry.iterdir())
    except OSError as e:
        return f"a folder that cannot be read ({e.strerror})"
    if not inside:
        return "an empty folder"
    if any(not q.name.startswith(".") and (q / M.CONFIG).is_file() for q in inside):
        return (f"a folder of models (folders in a folder of models are not searched): to serve them, give {entry} "
                f"as a path too")
    return f"no {M.CONFIG} in it: not a folder written by `frozentune train --output`"


# ----------------------------------------------------------------------------- tasks
@dataclass
class Task:
    """One served model: a classifier or a generator, by its folder's name."""
    name: str
    folder: Path
    kind: str                          # "classify" | "generate"
    method: str
    group: Any
    model: M.Classifier | None = None  # classifiers
    tuner: Any = None                  # generators
    prefix: Tensor | dict | None = None  # prefix generators: the materialised (N, 2, H, P, E); encoder-decoder: per kind
    decoding: dict = field(default_factory=dict)  # generators: num_beams, max_new_tokens as trained
    data: str | None = None  # generators: the data it was trained on (config.json), for the page's example source
    trained_as: str = ""  # classifiers the folds kept as a regression (few labels): api._fallback_note's sentence

    @property
    def explains(self) -> bool:
        return self.model is not None and explains(self.model.head)

    @property
    def no_explanation(self) -> str:
        """Why a classifier gives no explanation; one trained as another method whose folds kept the logistic
        regression (few labels) says so, as `frozentune explain` does ("probe gives none" puzzled its user)."""
        return f"{self.method} gives no explanation (ytuning, space and selfexplain models do){self.trained_as}"

    @property
    def labels(self) -> list[str]:
        return list(self.model.labels) if self.model is not None else []

    @property
    def pairs(self) -> bool:
        """Whether the classifier was trained on sentence pairs (and so takes pairs, not texts)."""
        return self.model is not None and bool(self.model.takes_pairs)

    def describe(self) -> dict:
        d = {"name": self.name, "kind": self.kind, "method": self.method, "folder": str(self.folder),
             "group": self.group.label}
        if self.model is not None:
            bb = self.model.backbone_ref
            saved = getattr(self.model, "saved_config", {}).get("backbone", {})
            # as this model's config names it (the shared pass's is the first model's spelling of one backbone)
            d |= {"labels": self.labels, "explains": self.explains, "backbone": saved.get("name", bb.name),
                  "input": "pair" if self.pairs else "text",
                  "fields": [f for f in (self.model.pair_fields or ("text",)) if f],
                  "layers": list(bb.layers.layers), "max_length": bb.max_length, "device": str(bb.device),
                  "precision": bb.precision if not self.model.runs_live else "fp32",
                  "shares_pass": isinstance(self.group, FrozenPass),
                  "pass": self.group.backbone.pass_layout if isinstance(self.group, FrozenPass)
                  else "padded: its own pass (the method trains or steers the backbone)"}
        else:
            d |= {"backbone": self.group.lm_name, "decoding": self.decoding, "data": self.data, "device": str(self.group.device),
                  "precision": self.group.precision, "shares_batches": self.prefix is not None}
        return d


def host_logits(outs: Sequence[Output]) -> list[Tensor]:
    """Each output's (rows, C) logits as float32 on the host. From a GPU they come back in one copy (one wait
    for the device) rather than one per head. On an H100, in one process (bench/gpu_batch_gil.py), the 8-head
    engine's batch of 16 short texts took 14.2 ms against 15.0 with a copy per head, and beside a thread doing
    an event loop's work 18.4-19.1 ms against 18.8-21.9 (medians of 2 rounds; bench/REPORT.md)."""
    logits = [o.logits for o in outs]
    if all(x.device.type == "cpu" for x in logits):  # (also no heads at all: nothing to copy)
        return [x.float() for x in logits]
    return gathered(logits)


def gathered(logits: Sequence[Tensor]) -> list[Tensor]:
    """The tensors as float32 on the host through one concatenated copy, each in its own shape."""
    flat = torch.cat([x.reshape(-1).float() for x in logits]).cpu()  # (sum of rows × C,)
    return [part.view(x.shape) for part, x in zip(flat.split([x.numel() for x in logits]), logits)]


def not_numbers(name: str) -> TaskFailed:
    """Task `name`'s failure on one text whose scores are not numbers (NaN or infinite: its head overflowed
    on it, or its weights are damaged)."""
    return TaskFailed(f"task {name!r}: its scores for this text are not numbers (NaN or infinite), so it has no "
                      f"answer for it; if it fails so on every text, its weights are damaged: train it again")


def classify_rows(task: Task, out: Output, jobs: Sequence, rows: Sequence[int],
                  logits: Tensor | None = None) -> list[dict | TaskFailed]:
    """Label and per-label probabilities (softmax of the logits in float32, as `predict`), and the
    head's explanation where the job asks for one. `out` holds the head's output for `rows` of the
    batch only, in that order: its row k is the batch's row rows[k]. `logits`: out.logits already
    on the host in float32 (host_logits), where the caller read several heads' at once. A row whose
    scores are not numbers gets a TaskFailed in its place, and that row alone: the batch's other rows
    are other texts, often other clients', and their answers must not depend on what they were
    batched with."""
    from ..api import labelled

    probs = torch.softmax(out.logits.float().cpu() if logits is None else logits, -1)  # (len(rows), C)
    finite = torch.isfinite(probs).all(-1).tolist()  # (len(rows),): one check and one conversion for all rows
    res: list[dict | TaskFailed] = []
    for k, (i, p, ok) in enumerate(zip(rows, probs.tolist(), finite)):
        if not ok:
            res.append(not_numbers(task.name))
            continue
        row: dict[str, Any] = labelled(task.labels, p)
        job = jobs[i].payload
        if job["explain"] is not None and task.explains:
            one = Output(out.logits[k:k + 1], {name: v[k:k + 1] for name, v in out.extras.items()})
            ex = task.model.head.explain(one, job["view"], task.labels, job["explain"])
            row |= {"explanation": ex.data, "lines": ex.lines} | read_chars(job["view"])
        elif job["explain"] is not None:  # asked, and this method has none: said, not left out unseen
            row |= {"explanation": None, "lines": [task.no_explanation]}
        res.append(row)
    return res


def read_chars(view: TokenView) -> dict:
    """{"read_chars": [characters read per text]} where a text was cut at max_length (the explanation covers that
    part: the page greys the rest), else {}."""
    texts = view.text if isinstance(view.text, tuple) else (view.text,)
    ends = view.read_to()
    return {"read_chars": ends} if any(t[e:].strip() for t, e in zip(texts, ends)) else {}


@dataclass
class Padded:
    """A classify batch as the pass takes it: (B, T) ids and mask; for rows that are sentence pairs,
    (B, T) token types (zeros on single texts: the model's own default) and the separator mask."""
    ids: Tensor
    mask: Tensor
    types: Tensor | None = None
    separator: Tensor | None = None


def _batch(jobs: Sequence, pad_id: int, device: torch.device, multiple: int, max_length: int,
           tok: Any = None) -> Padded:
    """The jobs padded to T = the longest row rounded up to `multiple` (at most max_length): with
    few distinct shapes the kernels' per-shape caches and the allocator's heap stop growing under
    varied traffic (bench/results/serve_memory.md). Pairs and single texts may share a batch."""
    ids = [j.payload["ids"] for j in jobs]
    longest = max(len(x) for x in ids)
    ids, mask = pad(ids, pad_id, to_length=max(longest, min(-(-longest // multiple) * multiple, max_length)))
    out = Padded(ids.to(device), mask.to(device))  # (B, T), (B, T)
    is_pair = torch.tensor([j.payload.get("pair", False) for j in jobs])
    if bool(is_pair.any()):
        types = [j.payload.get("types") for j in jobs]
        if any(t is not None for t in types):
            out.types = pad([t if t is not None else [0] * len(x) for t, x in zip(types, ids)], 0,
                            to_length=ids.shape[1])[0].to(device)
        out.separator = (separator_mask(ids, mask.bool(), separator_ids(tok)) & is_pair[:, None]).to(device)
    return out


class Labelled:
    """A group's label: what it runs, in words, for the log, /v1/models and the metrics' series. It starts
    from the backbone's folder (or hub) name; tell_apart lengthens that name and adds `marks` where two
    groups' labels would otherwise be the same."""
    source: str  # the backbone or LM as the models name it (a folder or a hub id)
    shown: str = ""
    marks: tuple[str, ...] = ()

    def what(self, name: str) -> str:
        raise NotImplementedError

    @property
    def label(self) -> str:
        return self.what(self.shown or Path(self.source).name) + (f" [{', '.join(self.marks)}]" if self.marks else "")

    def differences(self) -> dict[str, str]:
        """Parts that may tell this group from another of the same label, in the order they are tried."""
        return {"tasks": "for " + ", ".join(t.name for t in self.tasks)}


def tell_apart(groups: Sequence[Labelled]) -> None:
    """Labels that differ wherever the groups do. Two folders both named bert, or hub ids a/model and
    b/model, were both "bert ..." or "model ...": /v1/models listed two groups alike and /metrics summed
    their series into one. Where labels would be the same (only there), the name gets as many parent
    folders as tell the sources apart, then a mark for what still differs: the weights' hash, the token
    types, and last the tasks (two live passes or fine-tuned LMs of one backbone)."""
    for g in groups:
        g.shown, g.marks = "", ()
    for same in _colliding(groups):
        _longer_names(same)
    for part in ("weights", "token types", "tasks"):
        for same in _colliding(groups):
            values = [g.differences().get(part) for g in same]
            if len(set(values)) > 1:
                for g, v in zip(same, values):
                    g.marks += (v,) if v is not None else ()


def _colliding(groups: Sequence[Labelled]) -> list[list[Labelled]]:
    """The groups, by label, where more than one has it."""
    by: dict[str, list[Labelled]] = {}
    for g in groups:
        by.setdefault(g.label, []).append(g)
    return [same for same in by.values() if len(same) > 1]


def _longer_names(same: Sequence[Labelled]) -> None:
    """Each group shown by the last k parts of its source's path, for the least k that shows different
    sources differently (absolute folders without their root)."""
    parts = [[p for p in Path(g.source).parts if p != Path(g.source).anchor] for g in same]
    sources = len({g.source for g in same})
    if sources < 2:
        return
    for k in range(2, max(map(len, parts)) + 1):
        shown = ["/".join(p[-k:]) for p in parts]
        if len(set(shown)) == sources:
            for g, name in zip(same, shown):
                g.shown = name
            return
    for g in same:  # sources that differ only in how they are written (./bert, bert/): shown whole
        g.shown = g.source


class ClassifierGroup(Labelled):
    """What FrozenPass and LivePass share: tokenising for their backbone and answering rows."""
    backbone: Backbone
    tasks: list[Task]

    def __init__(self) -> None:
        self.tasks = []
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer refuses concurrent calls ("Already borrowed")

    @property
    def max_length(self) -> int:
        return self.backbone.max_length

    def tokenize(self, texts: Sequence[Text], views: bool) -> tuple[Tokenized, list[TokenView | None]]:
        """Token ids (and, for pairs, token types) of each text or pair, cut to max_length, and, when
        views, the pieces with character offsets."""
        with self.tokenizer_lock:
            if views:
                tokens, vs = self.backbone.tokenize_with_views(texts)
                return tokens, list(vs)
            return self.backbone.tokenize(texts), [None] * len(texts)

    def answer(self, jobs: Sequence, outputs: Callable[[Task, list[int]], Output]) -> list[dict]:
        """{task name: row} per job, for the tasks each job asked for of this group. A task whose head
        raises gets a TaskFailed in place of its rows, and a row whose scores are not numbers in place of
        that row: the batch holds requests that never asked for it, and they are answered."""
        results: list[dict] = [{} for _ in jobs]
        made = []  # every head run (on a GPU: its kernels queued) before the first answer waits for its scores
        for task in self.tasks:
            rows = [i for i, j in enumerate(jobs) if task.name in j.payload["tasks"]]
            if not rows:
                continue
            try:
                made.append((task, rows, outputs(task, rows)))
            except Exception as e:
                for i in rows:
                    results[i][task.name] = task_failed(task.name, e)
        for (task, rows, out), logits in zip(made, host_logits([out for _, _, out in made])):
            try:
                answers: list = classify_rows(task, out, jobs, rows, logits)  # a row not numbers: its TaskFailed
            except Exception as e:
                answers = [task_failed(task.name, e)] * len(rows)
            for i, row in zip(rows, answers):
                results[i][task.name] = row
        return results


class FrozenPass(ClassifierGroup):
    """Heads on one frozen backbone: one pass per batch for all of them. run() does a batch's
    whole work; begin() its pass, returning the heads and answers as a Deferred, which a pipelining
    batcher's finisher thread runs while the next batch's pass runs (see pipeline_choice)."""

    def __init__(self, backbone: Backbone, weights: str | None = None):
        super().__init__()
        self.backbone, self.source = backbone, backbone.name
        self.weights = weights  # the hash the models were saved with (config.json), else the loaded weights'
        self.graphs: HeadGraphs | None = None  # set by the Engine (--cuda-graphs)

    def what(self, name: str) -> str:
        bb = self.backbone
        return f"{name} max_length {bb.max_length} {bb.precision} on {bb.device}"

    def differences(self) -> dict[str, str]:
        return {"weights": f"weights {(self.weights or self.backbone.weights_hash)[:8]}",
                "token types": "token types" if self.backbone.token_types else "no token types"} | super().differences()

    def run(self, jobs: Sequence) -> list[dict]:
        """The batch's pass, then every task's head: one answer per job."""
        return self.heads(jobs, *self.forward(jobs))

    def begin(self, jobs: Sequence) -> Deferred:
        """The batch's pass now; its heads and answers as a Deferred."""
        b, states = self.forward(jobs)
        return Deferred(lambda: self.heads(jobs, b, states))

    def forward(self, jobs: Sequence) -> tuple["Padded", tuple[Tensor, ...]]:
        """The batch padded, and every layer's states from one pass."""
        bb = self.backbone
        b = _batch(jobs, bb.pad_id(), bb.device, jobs[0].key, bb.max_length, bb.tok)  # key: --pad-multiple
        return b, bb.hidden_states(b.ids, b.mask, b.types)

    def heads(self, jobs: Sequence, b: "Padded", states: tuple[Tensor, ...]) -> list[dict]:
        """Every task's head on the batch's states, and each job's answer."""
        fmask, sep = b.mask.bool(), b.separator
        chosen: dict[tuple, Tensor] = {}  # heads reading the same layers share their selection
        graphs = self.graphs
        if graphs is not None:
            graphs.next_batch()

        def outputs(task: Task, rows: list[int]) -> Output:
            m = task.model
            key = (m.backbone_ref.layers, m.cache_dtype)
            if key not in chosen:  # as Classifier.features: the layers, float32, rounded as the cache stores them
                chosen[key] = M.as_cached(select_layers(states, key[0]), key[1])
            every = len(rows) == len(jobs)
            if graphs is not None and every and sep is None:  # all rows, single texts: its recorded graph
                out = graphs.run(task.name, m.head, m.backbone_ref.precision, key, chosen[key], fmask)
                if out is not None:
                    return m.calibrated(out)  # (its temperature applied outside the graph, as in Classifier.forward)
            hidden = chosen[key] if every else chosen[key][rows]
            with torch.no_grad():
                return m.calibrated(m.head(Features(hidden, fmask if every else fmask[rows],
                                                    None if sep is None else sep if every else sep[rows],
                                                    m.backbone_ref.precision)))

        return self.answer(jobs, outputs)


def pipeline_choice(option: str, device: torch.device) -> tuple[bool, str]:
    """Whether a FrozenPass's batches are begun (the heads handed to the batcher's second thread) or
    run whole (--pipeline), and why.
    auto: on a CPU where torch's threads leave a core free, since the heads then run on it while
    the next pass runs (bench/REPORT.md, "Heads beside the next pass"); off where torch already uses
    every core (two stages would take turns on them) and on a GPU, where on an H200 the 8 heads / 1 head
    ratio with it was 0.77-1.10× against 0.68-1.00× without, over three repeats: ahead on short texts in
    all three, on long ones in one (bench/REPORT.md, "`--pipeline on` on a GPU, two more repeats")."""
    if option != "auto":
        return option == "on", f"--pipeline {option}"
    if device.type != "cpu":
        return False, f"auto: off on {device.type} (measured there: no clear gain; --pipeline on to try it)"
    cores, threads = usable_cores(), torch.get_num_threads()
    if threads < cores:
        return True, f"auto: torch uses {threads} of {cores} cores, so the heads run beside the next pass"
    if over := oversubscribed():
        return False, f"auto: off, {over}"
    return False, f"auto: off, torch uses all {cores} cores for the pass"


class LivePass(ClassifierGroup):
    """A classifier that runs (or steers) the backbone itself: its own pass per batch."""

    def __init__(self, model: M.Classifier):
        super().__init__()
        self.backbone, self.model, self.source = model.backbone_ref, model, model.backbone_ref.name

    def what(self, name: str) -> str:
        return f"{name} ({self.model.method}, its own pass)"

    def run(self, jobs: Sequence) -> list[dict]:
        device = next(self.model.parameters()).device
        b = _batch(jobs, self.backbone.pad_id(), device, jobs[0].key, self.backbone.max_length, self.backbone.tok)
        with torch.no_grad():
            out = self.model(M.Batch(mask=b.mask.bool(), input_ids=b.ids, token_type_ids=b.types,
                                     separator=b.separator))
        return self.answer(jobs, lambda task, rows: Output(out.logits[rows], {k: v[rows] for k, v in out.extras.items()}))


class LMGroup(Labelled):
    """Generators on one LM (causal or encoder-decoder): each row after its own prefix, all rows of a batch in
    one decode."""

    refill = True  # a decode's batch waits briefly for the clients just answered (batcher.py, Refill)
    lane = "generate"  # its own worker: a classify batch does not wait behind a decode (batcher.py, Lanes)

    def __init__(self, lm: torch.nn.Module, tok, lm_name: str, device: torch.device):
        self.lm, self.tok, self.lm_name, self.device, self.source = lm, tok, lm_name, device, lm_name
        self.tasks: list[Task] = []
        self.tokenizer_lock = threading.Lock()

    @property
    def precision(self) -> str:
        """What the LM decodes in (its weights say: generation/precision.py)."""
        from ..generation.precision import precision_of

        return precision_of(self.lm)

    def what(self, name: str) -> str:
        return f"{name} (generation) {self.precision} on {self.device}"

    def decode_in(self, precision: str) -> None:
        """The LM made to decode in `precision` (generation/precision.py), once every task on it is loaded."""
        from ..generation.precision import for_decoding

        for_decoding(self.lm, precision)

    def run(self, jobs: Sequence) -> list[dict]:
        from ..generation.prefix import PrefixBatch, eos_id_of, generate, pad_id_of

        beams, max_new, min_new = jobs[0].key
        extra: dict = {"min_new_tokens": min_new} if min_new else {}
        if all(j.gone is not None for j in jobs):
            extra["stopping_criteria"] = until_all_gone([j.gone for j in jobs])
        prompts = [j.payload["ids"] for j in jobs]
        tasks = [j.payload["task"] for j in jobs]
        if tasks[0].prefix is None:  # a fine-tuned LM: the group has that one task
            rows = tasks[0].tuner.generate(prompts, max_new_tokens=max_new, num_beams=beams, **extra)
        elif isinstance(tasks[0].prefix, dict):  # encoder-decoder: {kind: prefix}, the sites shared by the group
            from ..generation.seq2seq import mixed, seq2seq_generate
            rows = seq2seq_generate(self.lm, tasks[0].tuner.sites, mixed([t.prefix for t in tasks]), prompts,
                                    pad_id_of(self.lm, self.tok), eos_id_of(self.lm, self.tok), max_new, beams, **extra)
        else:
            pb = PrefixBatch.mixed([t.prefix for t in tasks])
            rows = generate(self.lm, pb, prompts, pad_id_of(self.lm, self.tok), eos_id_of(self.lm, self.tok),
                            max_new, beams, **extra)
        return [{"output": self.tok.decode(r, skip_special_tokens=True).strip(), "tokens": len(r)} for r in rows]


def until_all_gone(gone: Sequence[threading.Event]):
    """A StoppingCriteriaList for `generate`: it ends the decode at the next token once every event is set
    (every request of the batch cancelled: its client left, or it was cut off at shutdown). A decode of
    64 sources × 8 beams ran to its end for nobody, holding the generation lane and the server's shutdown."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class AllGone(StoppingCriteria):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
            stop = all(e.is_set() for e in gone)
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([AllGone()])


# ----------------------------------------------------------------------------- loading
Log = Callable[[str], None]


def _alias_folder(alias: str, aliases: dict) -> str | None:
    """The folder an alias stands for, or None where it cannot be had (its package is not installed)."""
    from ..backbone import BackboneError

    try:
        return aliases[alias]()
    except BackboneError:
        return None


def pass_source(name: str, aliases: dict | None = None) -> str:
    """Where a backbone (or, with the LM aliases, an LM) is read from, spelled one way per place: an alias's
    folder; a local folder's real path (/x/bert, /x/./bert, ../x/bert from /y, /x/bert/ and a link to it are one
    folder, whose pass was run once per spelling); a hub id as given. Models whose frozen pass is the same
    share one group: the key is this, with the weights hash, max_length, device, precision and token types."""
    from ..backbone import ALIASES

    aliases = ALIASES if aliases is None else aliases
    path = _alias_folder(name, aliases) if name in aliases else name
    local = Path(path or name).expanduser()
    return os.path.realpath(local) if local.is_dir() else name


def shown_source(name: str, aliases: dict | None = None, reverse: bool = True) -> str:
    """A backbone as its group's label names it: the alias whose folder it is (the MiniLM package's folder,
    .../model, was labelled "model"), else a local folder as written, made absolute and tidy (no ./, .. or
    trailing /: not the real path, which may be a store's hash), else the hub id. reverse=False: no alias is
    looked up for a folder (an LM alias's folder may be made on first use: a conversion of seconds)."""
    from ..backbone import ALIASES

    aliases = ALIASES if aliases is None else aliases
    if name in aliases:
        return name
    where = pass_source(name, aliases)
    for alias in aliases if reverse else ():
        if (folder := _alias_folder(alias, aliases)) is not None and os.path.realpath(folder) == where:
            return alias
    local = Path(name).expanduser()
    return os.path.abspath(local) if local.is_dir() else name


def load_tasks(folders: Sequence[Path], device: str | None, precision: str | None, log: Log) -> list[Task]:
    """Every folder loaded once; frozen classifiers on the same backbone share one FrozenPass and
    prefix generators on the same LM one LMGroup."""
    from ..generation.run import is_generation_model

    frozen: dict[tuple, FrozenPass] = {}
    lms: dict[str, LMGroup] = {}
    tasks = []
    decode = None  # (device, precision) of every generator, chosen with the first one
    for folder in folders:
        if is_generation_model(folder):
            if decode is None:
                decode = _decode_runtime(device, precision, log)
            task = _load_generator(folder, decode[0], lms, log)
        else:
            task = _load_classifier(folder, device, precision, frozen, log)
        task.group.tasks.append(task)
        tasks.append(task)
    if decode is not None:  # after every generator's load, which checks the LM's fp32 weights against its hash
        for group in {id(t.group): t.group for t in tasks if t.kind == "generate"}.values():
            group.decode_in(decode[1])
    tell_apart(list({id(t.group): t.group for t in tasks}.values()))
    for task in tasks:
        log(f"serve: {task.name}: {task.method} → {task.group.label}")
    return tasks


def per_task(name: str, log: Log) -> Log:
    """`log` with each line said of task `name` (serve: NAME: line)."""
    return lambda line: log(f"serve: {name}: {line}")


def _decode_runtime(device: str | None, precision: str | None, log: Log) -> tuple[torch.device, str]:
    from ..generation.precision import decode_runtime

    dev, prec, lines = decode_runtime(device, precision)
    for line in lines:
        log(f"serve: generation: {line}")
    return dev, prec


def _load_classifier(folder: Path, device: str | None, precision: str | None, frozen: dict, log: Log) -> Task:
    from ..api import _fallback_note, _load, runs_live, saved_runtime
    from ..model import known_method

    config = M.read_saved(folder)
    known_method(config, folder)
    M.check_config(config, folder / M.CONFIG)  # as M.load does: a hand edit named, not a KeyError below
    b = config["backbone"]
    name = task_name(folder)
    said = per_task(name, log)  # "device: ..." and "precision: ..." for each model: say whose
    if runs_live(config["method"], config["options"]):  # trains or steers the backbone, or has its own encoder
        model = _load(folder, device, precision, said)
        group: ClassifierGroup = LivePass(model)
        group.source = shown_source(group.source)
        return Task(name, folder, "classify", config["method"], group, model=model, trained_as=_fallback_note(folder))
    rt = saved_runtime(device, precision, said)(b)
    types = b.get("token_types", True)
    # what the pass depends on; the backbone by where it is read from, not by how its name is spelled
    key = (pass_source(b["name"]), b.get("weights_hash"), b["max_length"], str(rt[0]), rt[1], types)
    if key not in frozen:
        bb = M.load_named(folder, b["name"], lambda n: Backbone.load(n, LayerSpec(), b["max_length"], device=rt[0],
                                                                      precision=rt[1], token_types=types))
        frozen[key] = FrozenPass(bb, b.get("weights_hash"))
        frozen[key].source = shown_source(b["name"])
    group = frozen[key]
    view = group.backbone.with_layers(LayerSpec(tuple(b["layers"]), b["combine"]))
    model = M.load(folder, backbone=view)
    model.to(view.device)
    return Task(name, folder, "classify", config["method"], group, model=model, trained_as=_fallback_note(folder))


def _load_generator(folder: Path, dev: torch.device, lms: dict, log: Log) -> Task:
    from ..backbone import LM_ALIASES, load_generation_lm
    from ..generation.run import check_generation_config, check_safetensors, DecodeOptions
    from ..model import known_method, read_saved
    from ..generation.prefix import PrefixTuner
    from ..generation.seq2seq import Seq2SeqPrefixTuner

    config = read_saved(folder, "the --output folder of a generation training run")
    spec = known_method(config, folder)
    check_generation_config(config, folder / M.CONFIG, spec)  # as load_tuner does
    check_safetensors(folder / M.WEIGHTS)
    name = config["backbone"]["name"]
    decoding = DecodeOptions(**config.get("decoding", {}))
    seq2seq = config.get("architecture") == "encoder-decoder"
    cls = getattr(spec.generator, "seq2seq" if seq2seq else "causal", spec.generator)
    shares = cls in (PrefixTuner, Seq2SeqPrefixTuner)  # prefixes of one LM share batches; a fine-tuned LM is its own
    where = pass_source(name, LM_ALIASES)  # one LM however its name is spelled
    if shares and where in lms:
        group = lms[where]
    else:
        lm, tok = M.load_named(folder, name, load_generation_lm, "language model")
        group = LMGroup(lm, tok, name, dev)
        group.source = shown_source(name, LM_ALIASES, reverse=False)
        if shares:
            lms[where] = group
    tuner = spec.generator.load(folder, group.lm, group.tok, name)
    M.check_unchanged(folder, config)  # the decoding options below are of the folder whose weights were read
    tuner.eval()
    group.lm.to(dev)
    tuner.to(dev)
    prefix = None if not shares else tuner.prefixes() if seq2seq else tuner.encoder.materialize().detach()
    return Task(task_name(folder), folder, "generate", config["method"], group, tuner=tuner, prefix=prefix,
                decoding={"num_beams": decoding.num_beams, "max_new_tokens": decoding.max_new_tokens},
                data=config.get("data") if isinstance(config.get("data"), str) else None)

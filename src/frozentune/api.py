"""The library calls behind each CLI command: train, evaluate, predict, cache.

`train` writes, into its output folder, the saved model and result.json with (stable names)
metrics.accuracy, metrics.macro_f1 (percent, test split), trainable_params, extract_seconds,
train_seconds, peak_rss_mb, plus the config, validation metrics and per-epoch history.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from .errors import FrozentuneError
from .pyterms import glossed, in_python_terms
from . import distributed
from . import model as M
from .backbone import Backbone, LayerSpec, cut_rows
from .cache import CachedStates, build_part, check_room, get_or_build
from .extract import Runtime, choose_runtime
from .data import (CarveError, DataError, Dataset, TextSplit, encode_labels, json_line, load_classification,
                   one_side_note, read_split, read_texts, resolve, rows_like_it, run_files, some, text_groups)
from .output import check_output, holds_output, run_environment, staged_output
from .pairs import POSITIVE, PairError, Text, is_pair, pair_kind, separator_ids
from .fields import as_flag
from .registry import MethodError, get_method, make_config, refuse_unused
from . import relabel as _relabel
from .relabel import renamed_hint
from .crossval import choose_folds, fit_cv
from .train import (MIN_CALIBRATE, HeldOut, NonFiniteLogits, TrainConfig, calibration, class_report, evaluate, figures,
                    fit, fit_temperature, intervals, metrics, plan_steps, predict_logits, silent)


relabel = _relabel.relabel  # api.relabel: a saved classifier's labels renamed (frozentune relabel)


def peak_rss_mb() -> float:
    """Peak resident memory of this process image so far, in MB: VmHWM from /proc/self/status on
    Linux. (getrusage's ru_maxrss carries the parent's peak across fork + exec, so a run started
    by a large process would report that process's size; it is used only where /proc is absent,
    e.g. macOS, which reports bytes.)"""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 1024.0


def reset_peak_rss() -> str:
    """Start peak_rss_mb's count again, so that a run's result gives its own peak, not the peak of everything the
    process did before (a notebook's kernel: an earlier cell's 2 GB was reported by every later run). Linux lets
    a process reset its VmHWM (/proc/self/clear_refs, 5); returns "run" where it did, else "process" (what
    peak_rss_mb then measures, recorded as result.json's peak_rss_of)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return "run"
    except OSError:
        return "process"


class _DefaultName(str):
    """BackboneOptions' name where none was given: MiniLM for the classification methods, the default causal LM
    for generation. A str of its own type, so that a generation run tells it from name="minilm" given (the
    encoder, which generation refuses), and BackboneOptions(device="cuda") from BackboneOptions("minilm")."""


@dataclasses.dataclass
class BackboneOptions:
    name: str = _DefaultName("minilm")
    layers: str | None = None  # None: the method's default layer (MethodSpec.layer), else the last
    combine: str = "mean"
    max_length: int = 128
    trust_remote_code: bool = False  # let a model that ships Python code run it (never by default)
    device: str | None = None  # where the frozen pass (and the head) runs; None: auto (a GPU if there is one)
    precision: str | None = None  # of the frozen pass; None: the device's measured default
    token_types: bool = True  # False: sentence pairs without their token type ids (see backbone.Backbone)

    def __post_init__(self) -> None:
        from .fields import wrong_value

        if (why := wrong_value(self)) is not None:  # e.g. max_length="32": a BackboneError below, not a TypeError
            raise MethodError(f"BackboneOptions: {why}")
        if self.layers is not None and (isinstance(self.layers, bool) or not isinstance(self.layers, (str, int, list, tuple))):
            raise MethodError(f"BackboneOptions: layers={self.layers!r}: give a layer as text or a number, e.g. "
                              f"'-1' or '-1,-2'")

    def runtime(self) -> Runtime:
        return choose_runtime(self.device, self.precision)

    def load(self, runtime: Runtime | None = None) -> Backbone:
        rt = runtime or self.runtime()
        spec = LayerSpec.parse("-1" if self.layers is None else self.layers, self.combine)
        if self.combine != "mean" and len(spec.layers) == 1:  # was dropped: one layer has nothing to combine
            raise MethodError(f"--layer-combine {self.combine}: it combines several layers, and the layer read is one "
                              f"({spec}); give --layer as a comma list (e.g. -1,-2), or leave --layer-combine out")
        return Backbone.load(self.name, spec,
                             self.max_length,
                             trust_remote_code=self.trust_remote_code, device=rt.device, precision=rt.precision,
                             token_types=self.token_types)


def saved_runtime(device: str | None, precision: str | None, log: Callable[[str], None]) -> Callable[[dict], tuple]:
    """For model.load: the device and precision of a saved model's frozen pass — as given, else
    auto and the precision it was trained with (said through `log`)."""
    def choose(saved_backbone: dict) -> tuple:
        rt = choose_runtime(device, precision, saved_backbone.get("precision", "fp32"), "the precision it was trained with")
        for line in rt.lines:
            log(line)
        return rt.device, rt.precision
    return choose


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def backbone_for(method: str, opts: BackboneOptions, options: dict[str, Any] | None = None, seed: int = 0,
                 runtime: Runtime | None = None) -> Backbone:
    """The frozen backbone `opts` names, or, for a method that trains an encoder of its own
    (MethodSpec.encoder, e.g. conv), that encoder built from the method's options at opts.max_length."""
    spec = get_method(method)
    if spec.encoder is None:
        return dataclasses.replace(opts, layers=spec.layer if opts.layers is None else opts.layers).load(runtime)
    frozen = ("name", "layers", "combine", "trust_remote_code")  # a frozen backbone's options
    if given := [f for f in frozen if getattr(opts, f) != getattr(BackboneOptions, f)]:
        flags = {"name": "--backbone", "layers": "--layer", "combine": "--layer-combine",
                 "trust_remote_code": "--trust-remote-code"}
        raise MethodError(f"method {method!r} trains an encoder of its own (on the MiniLM tokenizer), so "
                          f"{', '.join(flags[f] for f in given)} {'does' if len(given) == 1 else 'do'} not apply "
                          f"({'it chooses' if len(given) == 1 else 'they choose'} a frozen backbone); to start from pre-trained weights, give --init DIR (a "
                          f"`frozentune pretrain` output)")
    if not opts.token_types:
        raise MethodError(f"method {method!r} trains an encoder of its own, whose segment embedding learns the "
                          f"pair's two texts with the task; --no-token-types is for a frozen backbone's pairs")
    return spec.encoder(make_config(method, options), opts.max_length, seed)


def check_token_types(backbone: BackboneOptions | Backbone, pairs: bool, data: str) -> None:
    """--no-token-types changes only how sentence pairs are fed: on single texts it would do nothing."""
    if not backbone.token_types and not pairs:
        raise DataError(f"--no-token-types: {data} holds single texts, which have no token types; it is for "
                        f"sentence pairs (give --text-pair-field, or leave the option out)")


def _lm_name(backbone: BackboneOptions | Backbone) -> str | None:
    """The LM a generation run loads: BackboneOptions' name, None (the default LM) where no name was given (the
    encoder alias given as the LM is refused where it loads); the encoder's other options (layers, max_length,
    precision...) do not apply to it."""
    if isinstance(backbone, Backbone):
        raise MethodError("generation runs load their causal LM by name; give BackboneOptions(name=...)")
    rest = {f.name: getattr(backbone, f.name) for f in dataclasses.fields(backbone)
            if f.name not in ("name", "device", "trust_remote_code") and getattr(backbone, f.name) != f.default
            and not (f.name == "precision" and backbone.precision == "fp32")}  # fp32: what it runs, as the CLI takes it
    if rest:
        raise MethodError(f"BackboneOptions({', '.join(f'{k}={v!r}' for k, v in rest.items())}): options of a frozen "
                          f"encoder; a generation run loads a causal LM by name only (BackboneOptions(name=...))")
    return None if type(backbone.name) is _DefaultName else backbone.name


class SourceFactory:
    """Makes the right batch source for a model: cache rows for frozen heads (building the cache
    entry for the split's whole file on first use), token ids for live methods."""

    def __init__(self, backbone: Backbone, live: bool, cache_root: Path | None, rebuild: bool,
                 progress: bool, log: Callable[[str], None] | None = None):
        self.backbone, self.live, self.log = backbone, live, log or _stderr  # log: the cache's messages
        self.cache_root, self.rebuild, self.progress = cache_root, rebuild, progress
        self.extract_seconds = 0.0  # spent extracting in this run
        self._caches: dict[int, CachedStates] = {}
        self._tokens: dict[int, Any] = {}  # made by check_room, used by the builds

    def check_room(self, splits: Sequence[TextSplit]) -> None:
        """For frozen heads: the entries of these splits' files not yet cached fit in the free space together
        (cache.check_room), checked before the first is extracted."""
        if not self.live:
            files = list({id(s.file_texts): s.file_texts for s in splits}.values())
            self._tokens = check_room(self.backbone, files, self.cache_root)

    @property
    def cache_build_seconds(self) -> float:
        """What building the cache entries in use took when they were built (now or earlier)."""
        return float(sum(c.build_seconds for c in self._caches.values()))

    def __call__(self, split: TextSplit) -> M.Source:
        sep = separator_ids(self.backbone.tok) if split.is_pair else None
        if self.live:
            tokens = self.backbone.tokenize(split.texts)
            self._check_text(split, tokens.lengths)
            return M.LiveSource(tokens, self.backbone.pad_id(), sep)
        key = id(split.file_texts)
        if key not in self._caches:
            cache, secs = get_or_build(self.backbone, split.file_texts, self.cache_root, rebuild=self.rebuild,
                                       progress=self.progress, tokens=self._tokens.pop(key, None), log=self.log,
                                       source=str(Path(split.file).resolve()) if split.file else None)
            self._caches[key] = cache
            self.extract_seconds += secs
        self._check_text(split, self._caches[key].lengths[split.rows])
        return M.CachedSource(self._caches[key], split.rows, sep)

    def _check_text(self, split: TextSplit, lengths: np.ndarray) -> None:
        """A DataError naming the lines of rows the tokenizer kept nothing of (Backbone.textless):
        each would be trained on, or scored, as the special tokens alone, the same for all of them."""
        from .backbone import textless_message

        if empty := self.backbone.textless(split.texts, lengths):
            at = [split.lines[i] for i, _ in empty]
            raise DataError(textless_message(f"{split.source}: line {at[0]}", empty[0][1],
                                             f"fix or remove those rows{rows_like_it(at)}"))


def as_backbone(backbone: object, loaded: bool = True) -> BackboneOptions | Backbone:
    """A backbone argument as the API takes it: a model name or folder (str or Path), BackboneOptions,
    or (where `loaded`) a loaded Backbone; anything else is a MethodError saying what to give."""
    if isinstance(backbone, (str, Path)):  # a model id, folder or alias, as --backbone takes it
        return BackboneOptions(str(backbone))
    if isinstance(backbone, BackboneOptions) or (loaded and isinstance(backbone, Backbone)):
        return backbone
    raise MethodError(f"backbone: {type(backbone).__name__} ({str(backbone)[:40]}); give a model name or folder, "
                      f"BackboneOptions(...)" + (f", e.g. BackboneOptions(**{backbone!r})" if isinstance(backbone, dict)
                                                 else "") + (", or a loaded Backbone" if loaded else ""))


def as_path(value: object, what: str) -> Path | None:
    """A folder or file argument (str or os.PathLike) as a Path; None stays None; anything else is a
    MethodError naming the argument (pathlib's TypeError named none)."""
    if value is None or isinstance(value, Path):
        return value
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        return Path(value)
    raise MethodError(f"{what}={value!r}: give a folder or file path (a str or pathlib.Path)")


def as_log(log: Callable[[str], None] | None, what: str = "log") -> Callable[[str], None]:
    """A `log` argument: a function taking each message line; None is silence (no messages)."""
    if log is None:
        return silent
    if not callable(log):
        raise MethodError(f"{what}={log!r}: give a function that takes each message line (e.g. print, or "
                          f"list.append), or None for no messages")
    return glossed(log)  # the lines that name a flag also say what the Python call takes instead


def as_options(given: object, what: str, example: str) -> dict | None:
    """A dict of options (train_cfg, options) as given, or None; anything else is a MethodError naming it."""
    if given is not None and not isinstance(given, Mapping):
        raise MethodError(f"{what}: a {type(given).__name__}; give a dict of options, e.g. {example}")
    return None if given is None else dict(given)


def as_switch(value: object, what: str) -> bool:
    """A yes/no argument (overwrite, rebuild_cache, progress): True or False only; overwrite="no" replaced a
    saved model, being true."""
    if not isinstance(value, (bool, np.bool_)):
        raise MethodError(f"{what}={value!r}: give True or False")
    return bool(value)


@in_python_terms(backbone=True, train_cfg=True, options=True)
@holds_output
def train(method: str, data: str | Dataset, backbone: BackboneOptions | Backbone | str = BackboneOptions(),
          options: dict[str, Any] | None = None, train_cfg: dict[str, Any] | None = None,
          output: Path | None = None, text_field: str = "text", label_field: str = "label",
          max_train: int | None = None, cache_root: Path | None = None,
          rebuild_cache: bool = False, progress: bool = True,
          log: Callable[[str], None] | None = print, overwrite: bool = False, shots: int | None = None,
          pair_field: str | None = None, cache_log: Callable[[str], None] | None = None) -> dict:
    """Train `method` on `data`, evaluate on its test split, save to `output`; returns the
    result dict (also written to output/result.json). `log` takes every message line (None: none);
    `cache_log`, where given, takes the feature cache's instead (a large build's size and progress,
    waits for another process, resumes), which otherwise go to `log` too. A data-to-text dataset (E2E, WebNLG) goes to
    generation.train_generation; use that directly for its decoding options.

    A frozen head on fewer than --cv-below training examples is not early-stopped on a carved
    validation split: k-fold cross-validation on train picks its number of steps and it is refit on
    all of train (crossval.py; result.json's "selection" says what was done).

    pair_field: the second text's field of sentence-pair data (snli, rte and mrpc pick theirs)."""
    from .generation.run import is_generation_data, train_generation

    peak_of = reset_peak_rss()
    backbone = as_backbone(backbone)
    output, cache_root = as_path(output, "output"), as_path(cache_root, "cache_root")
    log = as_log(log)
    cache_log = log if cache_log is None else as_log(cache_log, "cache_log")
    for flag, value in (("overwrite", overwrite), ("rebuild_cache", rebuild_cache), ("progress", progress)):
        as_switch(value, flag)
    if isinstance(data, Path):
        data = str(data)
    if isinstance(data, str) and is_generation_data(data):
        given = {"shots": shots, "text_field": text_field, "label_field": label_field, "pair_field": pair_field}
        unused = [k for k, v in given.items() if v != {"text_field": "text", "label_field": "label"}.get(k)]
        if unused:  # fields and few-shot sampling of classification data: generation data has sources and targets
            raise MethodError(f"{', '.join(f'{k}={given[k]!r}' for k in unused)}: for classification data; {data} is "
                              f"source → target generation data (use generation.run.train_generation for its fields "
                              f"and decoding options)")
        if folds := [k for k in ("cv_folds", "cv_below", "cv_repeats", "fallback", "average_folds", "calibrate")
                     if k in (train_cfg or {})]:
            raise MethodError(f"train_cfg {', '.join(folds)}: options of a classifier's training (its "
                              f"cross-validation, its probabilities); a generation run early-stops on validation "
                              f"loss: leave them out")
        if cache_root is not None or rebuild_cache:  # they were dropped: a generation run keeps no feature cache
            raise MethodError(f"cache_root / rebuild_cache: {data} is source → target generation data, whose runs "
                              f"read the whole LM and keep no feature cache; leave them out")
        if isinstance(backbone, BackboneOptions) and backbone.device is not None:  # it was dropped: the run used the CPU
            if (train_cfg or {}).get("device") not in (None, backbone.device):
                raise MethodError(f"BackboneOptions(device={backbone.device!r}) and train_cfg device="
                                  f"{train_cfg['device']!r}: give the device once")
            from .extract import resolve_device

            device, said = resolve_device(backbone.device)  # "auto" and an absent GPU, as the command line has them
            log(said)
            train_cfg = {**(train_cfg or {}), "device": str(device)}
        return train_generation(method, data, _lm_name(backbone), options, train_cfg, output, max_train, log=log,
                                overwrite=overwrite, trust_remote_code=getattr(backbone, "trust_remote_code", False))
    spec = get_method(method)
    method_cfg = make_config(method, options)
    refuse_unused(method_cfg, method)  # options set that the others leave unused: said before any work
    trains_backbone = spec.encoder is None and method_cfg.train_backbone
    if isinstance(backbone, Backbone) and trains_backbone:
        raise MethodError(f"method {method!r} trains the backbone, so it would change the loaded Backbone passed to "
                          f"train in place (a later run reusing it would start from this one's training); pass "
                          f"BackboneOptions or a model name instead, so that the run loads its own copy")
    defaults = spec.train_defaults
    if trains_backbone and not make_config(method).train_backbone:
        # a frozen head's defaults (the probe's lr 0.01) applied to the whole backbone collapse it: the
        # backbone trains too, so the schedule is fine-tuning's unless the user gave one
        defaults = get_method("finetune").train_defaults
        log(f"--train-backbone: the backbone trains with the {method} head, so the training defaults are "
            f"finetune's ({', '.join(f'{k} {v:g}' for k, v in defaults.items())}); give --lr / --epochs to change them")
    cfg = train_config(defaults, train_cfg)
    if output is not None:
        check_output(Path(output), overwrite)  # before any work: a bad --output is found now, not after training
    least, why_least = getattr(spec.head_cls, "min_batch_size", (1, ""))
    if cfg.batch_size < least:  # contrastive's pair loss: batches of one trained nothing, silently
        raise MethodError(f"{method}: --batch-size {cfg.batch_size}: {why_least}; give {least} or more")
    if (why := getattr(spec.head_cls, "one_process_only", None)) and distributed.launch().world_size > 1:
        raise MethodError(f"{method}: {why}, so it cannot be split across data-parallel processes; run it in one "
                          f"process (without torchrun / accelerate launch)")  # before the data and backbone load
    may_cv = cfg.cv_folds >= 2 and not runs_live(method, options)
    # a live method that trains a fixed schedule on few labels (contrastive, as SetFit does): no carved split either
    fixed_few = bool(getattr(spec.head_cls, "fixed_schedule_few_labels", False))
    try:
        ds = data if isinstance(data, Dataset) else load_classification(
            data, text_field, label_field, seed=cfg.seed, max_train=max_train, shots=shots,
            carve_below=cfg.cv_below if may_cv or fixed_few else 0, pair_field=pair_field)
    except DataError as e:
        if spec.generates and "missing field" in str(e):  # read as classification data, meant as pairs?
            raise DataError(f"{e} For source → target generation with --method {method}, name the source and target "
                            f"fields instead: --source-field / --target-field.") from None
        raise
    check_token_types(backbone, ds.pair_field is not None, ds.name)
    if isinstance(backbone, Backbone):
        rt = Runtime(backbone.device, backbone.precision, [])
        bb = backbone
    else:
        if backbone.device is None and train_cfg and train_cfg.get("device"):
            backbone = dataclasses.replace(backbone, device=train_cfg["device"])
        rt = backbone.runtime()
        bb = backbone_for(method, backbone, options, cfg.seed, rt)
    for note in ds.notes:
        log(f"data: {note}")
    model = M.build_classifier(method, bb, ds.labels, options, seed=cfg.seed)
    model.pair_fields = (ds.text_field, ds.pair_field)
    lines = list(rt.lines)
    asked = backbone.precision if isinstance(backbone, BackboneOptions) else None
    if model.runs_live and asked not in (None, "fp32"):  # (conv's own encoder is fp32 whatever was asked: it was ignored)
        raise MethodError(f"--precision {asked}: method {method!r} trains or steers the backbone, which "
                          f"it does in fp32; leave --precision out (or give fp32)")
    _unused_cache_options(model, method, cache_root, rebuild_cache, log)
    _live_backbone_on(model, rt.device)
    if model.runs_live:  # its own encoder (conv) or the backbone it trains runs in fp32, whatever the default said
        lines = [f"precision: fp32 (method {method!r} trains or steers the backbone)" if line.startswith("precision:")
                 else line for line in lines]
    for line in lines:
        log(line)
    cfg = dataclasses.replace(cfg, device=str(rt.device))
    sources = SourceFactory(bb, model.runs_live, cache_root, rebuild_cache, progress, cache_log)
    parts = [name for name in ("train", "validation", "test") if len(getattr(ds, name))]  # validation may be empty
    sources.check_room([getattr(ds, name) for name in parts])
    y = {name: ds.label_ids(getattr(ds, name)) for name in parts}
    src = {name: sources(getattr(ds, name)) for name in parts}
    if sources.extract_seconds:
        log(f"extracted features in {sources.extract_seconds:.1f}s")
    notes = list(ds.notes)
    if (note := truncation_note(src.values(), bb.max_length, bb.longest_input, model.runs_live)) is not None:
        log(f"data: {note}")
        notes.append(note)
    n_params = model.num_trainable()
    log(f"{method} on {ds.name}: {len(ds.train)} train / {len(ds.validation)} validation / "
        f"{len(ds.test)} test, {len(ds.labels)} labels, {n_params:,} trainable parameters")
    if (cost := model.head.cost_note()) is not None:
        log(f"note: {cost}")
    val_src, y_val = src.get("validation"), y.get("validation")
    given = set(train_cfg or {})
    convex = getattr(model.head, "convex", False)
    # under --cv-below the folds choose, unless validation was carved from the rows given for training:
    # there were at least --cv-below of them, and the carve early-stops (ds.carved_from_train)
    few = len(ds.train) < cfg.cv_below and not ds.carved_from_train
    if cfg.steps and "min_steps" in given and not (may_cv and few and convex):
        log(f"schedule: --min-steps not used: --steps {cfg.steps} sets the number of steps")  # the floor is for --epochs
    if may_cv and few:
        groups = text_groups(ds.train.texts)
        k = choose_folds(y["train"], cfg.cv_folds, ds.labels, groups)[0]
        log(f"schedule: {len(ds.train)} training examples, under --cv-below {cfg.cv_below}: "
            + (f"{k}-fold cross-validation on train picks " + ("the L2 strength C of the exact solve (convex head)"
                                                               if convex else "the number of steps") if k >= 2 else
               "no cross-validation is possible (a class has a single distinct example): "
               + ("the exact solve with scikit-learn's C=1" if convex else "the planned steps, without selection"))
            + (f" ({len(ds.validation)} validation examples are scored, not used)" if val_src is not None else ""))
        unused = [o for o in (("lr", "weight_decay", "epochs", "steps", "min_steps", "warmup", "batch_size",
                               "max_grad_norm", "patience") if convex else ("patience",)) if o in given]
        if unused:
            log(f"schedule: {_flags(unused)} not used: "
                + ("the exact solve has no learning rate, steps or batches (its only setting is C, chosen by the folds)"
                   if convex else "cross-validation chooses the steps, so nothing is early-stopped"))
        if convex and "fallback" in given:
            log("schedule: --fallback not used: this head is the logistic regression the fallback would keep")
        if convex and "average_folds" in given:  # (auto: no head that is convex averages)
            log("schedule: --average-folds not used: the exact solve has one optimum, the same from every start")
        fallback = None
        if cfg.fallback == "auto" and not convex and get_method(method).encoder is None:
            fallback = lambda: M.build_classifier("probe", bb, ds.labels, seed=cfg.seed)  # noqa: E731
        model, fitted, selection = fit_cv(lambda: M.build_classifier(method, bb, ds.labels, options, seed=cfg.seed),
                                          src["train"], y["train"], val_src, y_val, cfg, log, fallback=fallback,
                                          groups=groups)
    elif fixed_few and few:
        plan = plan_steps(len(ds.train), cfg, constant=True)  # a few steps: a decaying rate would halve them
        log(f"schedule: {plan.why}; {len(ds.train)} training examples, under --cv-below {cfg.cv_below}: no early "
            f"stopping, the whole schedule is trained" + (f" ({len(ds.validation)} validation examples are scored, "
                                                          f"not used)" if val_src is not None else ""))
        if unused := [o for o in ("patience", "cv_folds", "cv_repeats", "fallback", "average_folds") if o in given]:
            log(f"schedule: {_flags(unused)} not used: method {method!r} trains its fixed schedule whole on few labels "
                f"(no early stopping, no folds)")
        fitted = fit(model, src["train"], y["train"], val_src, y_val, cfg, log, plan, select=False)
        selection = {"how": "fixed schedule", "schedule": plan.why}
    else:
        if val_src is None:
            raise DataError(f"{ds.name}: the validation split is empty; give a validation file, or train a frozen "
                            f"head with --cv-folds 2 or more")
        plan = plan_steps(len(ds.train), cfg)
        if may_cv:
            if unused := [o for o in ("cv_folds", "cv_repeats", "fallback", "average_folds") if o in given]:
                n_given = len(ds.train) + len(ds.validation) if ds.carved_from_train else len(ds.train)
                log(f"schedule: {_flags(unused)} not used: {n_given:,} training examples are not under --cv-below "
                    f"{cfg.cv_below}, so validation chooses (raise --cv-below to cross-validate)")
        elif model.runs_live:  # (--cv-below is used by a head with a fixed schedule on few labels: it says where)
            if unused := [o for o in ("cv_folds", "cv_repeats", "fallback", "average_folds") +
                          (() if fixed_few else ("cv_below",))
                          if o in given]:
                log(f"schedule: {_flags(unused)} not used: method {method!r} trains or steers the backbone, which is "
                    f"not cross-validated: validation chooses")
        elif unused := [o for o in ("cv_repeats", "cv_below", "fallback", "average_folds") if o in given]:
            log(f"schedule: {_flags(unused)} not used: --cv-folds {cfg.cv_folds} turns cross-validation off")
        carved = may_cv and ds.carved_from_train and len(ds.train) < cfg.cv_below  # (else it would have folds)
        log(f"schedule: {plan.why}; early stopping on {len(ds.validation)} validation examples "
            f"(--patience {cfg.patience})" + ("; methods that train or steer the backbone do not cross-validate"
                                               if model.runs_live and len(ds.train) < cfg.cv_below else "")
            + (f"; they were carved from the {len(ds.train) + len(ds.validation):,} training examples given, which "
               f"are not under --cv-below {cfg.cv_below}, so validation chooses rather than folds" if carved else ""))
        fitted = fit(model, src["train"], y["train"], val_src, y_val, cfg, log, plan)
        selection = {"how": "validation", "schedule": plan.why}
    n_params = model.num_trainable()  # the fallback, where cross-validation chose it, is a probe
    temperature = _calibrate(model, cfg, selection["how"], val_src, y_val, fitted.held_out, "calibrate" in given, log)
    positive = positive_label(ds.name, ds.labels)
    val_m = evaluate(model, val_src, y_val, cfg.eval_batch_size, positive)[0] if val_src is not None else None
    test_logits = predict_logits(model, src["test"], cfg.eval_batch_size)
    test_pred = test_logits.argmax(1)
    test_m = metrics(y["test"], test_pred, len(model.labels), positive)
    result = {
        "method": method,
        "model_method": model.method,  # the method saved: `method`, or probe where cross-validation fell back to it
        "data": ds.name,
        "fields": {"text": ds.text_field, "text_pair": ds.pair_field},
        "positive_label": positive[1] if positive else None,  # the class of metrics' positive_f1
        "config": {"method_options": dataclasses.asdict(model.cfg), "train": dataclasses.asdict(cfg),
                   "backbone": {"name": bb.name, "layers": str(bb.layers), "max_length": bb.max_length,
                                "device": str(bb.device), "precision": bb.precision},
                   "max_train": max_train, "shots": shots, "data_notes": notes},
        "metrics": test_m,
        "intervals": intervals(y["test"], test_pred, len(model.labels), positive),
        **class_report(y["test"], test_pred, model.labels),  # per_class, confusion: of the test split
        "calibration": calibration(y["test"], test_pred, softmax_rows(test_logits)),
        "temperature": temperature,  # fitted on validation (--calibrate), or None
        "validation": val_m,
        "trainable_params": n_params,
        "backbone_params": sum(p.numel() for p in bb.model.parameters()),
        "extract_seconds": sources.extract_seconds,
        "cache_build_seconds": None if model.runs_live else sources.cache_build_seconds,
        "train_seconds": fitted.train_seconds,
        "peak_rss_mb": peak_rss_mb(), "peak_rss_of": peak_of,
        "best_epoch": fitted.best_epoch if selection["how"] == "validation" else None,  # chosen by validation only
        "selection": selection,
        "history": fitted.history,
        "sizes": {"train": len(ds.train), "validation": len(ds.validation), "test": len(ds.test)},
        "environment": run_environment(),
    }
    band = result["intervals"]
    log(f"test accuracy {test_m['accuracy']:.2f} ({band['level']:.0%} interval {band['accuracy'][0]:.2f}-"
        f"{band['accuracy'][1]:.2f} for {len(ds.test):,} examples)  "
        f"macro-F1 {test_m['macro_f1']:.2f}  "
        + (f"F1[{positive[1]}] {test_m['positive_f1']:.2f}  " if positive else "")
        + f"trainable {n_params:,}  extract {sources.extract_seconds:.1f}s  train {fitted.train_seconds:.1f}s  "
        f"peak RSS {result['peak_rss_mb']:.0f} MB")
    from .export.card import write_card_from_files

    if output is not None and distributed.is_main():  # data-parallel ranks hold the same weights: rank 0 saves
        with staged_output(Path(output), overwrite) as folder:
            M.save(model, folder, extra={"train": dataclasses.asdict(cfg), "data": ds.name,
                                         "text_field": ds.text_field, "text_pair_field": ds.pair_field,
                                         "label_field": label_field, "shots": shots,
                                         "split_rule": ds.split_rule})
            (folder / "result.json").write_text(json.dumps(result, indent=2, allow_nan=False))
            write_card_from_files(folder)  # README.md: the folder can go to the Hub as it is
        log(f"saved to {output}")
    return result


def _calibrate(model: M.Classifier, cfg: TrainConfig, how: str, val_src, y_val: np.ndarray | None,
               held: HeldOut | None, asked: bool, log: Callable[[str], None]) -> dict | None:
    """--calibrate auto: fit the model's temperature (train.fit_temperature) on the examples that chose it and set it;
    its record for result.json, or None (said where --calibrate was given and nothing was fitted). Where the validation
    split chose, on its logits; where cross-validation chose, on the out-of-fold logits of the candidate it chose
    (`held`: every training example scored by the fold model that did not train on it, the approach of scikit-learn's
    CalibratedClassifierCV(ensemble=False)), the refit on all of train being the model (or the mean of its weights
    and the fold models', --average-folds: the same temperature, an approximation as the refit is one)."""
    if cfg.calibrate == "off":
        return None
    if how == "validation" and val_src is not None:
        logits, y, n, where = predict_logits(model, val_src, cfg.eval_batch_size), y_val, len(y_val), "validation"
        on, noun = f"the {n:,} validation examples", "validation examples"
    elif held is not None:
        logits, y, n, where = held.logits, held.y, held.examples, "cross-validation"
        noun = "training examples held out by the folds"
        repeats = len(y) // n
        on = (f"the {n:,} training examples as each was scored by the fold model that did not train on it "
              f"({held.folds} folds)" if repeats == 1 else
              f"the {n:,} training examples as each was scored by the {repeats} fold models that did not train on it "
              f"({held.folds} folds × {repeats} repeats)")
    else:
        if asked:
            log(f"schedule: --calibrate {cfg.calibrate} not used: it fits on the examples that chose the model, "
                f"validation or cross-validation's held-out folds, and this run had neither ({how}); the head's own "
                f"scale is kept")
        return None
    if n < MIN_CALIBRATE:
        log(f"probabilities: the head's own scale: a temperature is fitted on {MIN_CALIBRATE} {noun} or more "
            f"(--calibrate), and there are {n}")
        return None
    try:
        fitted = fit_temperature(logits, y)
    except NonFiniteLogits as e:
        log(f"probabilities: the head's own scale: on {on}, {e}")
        return None
    if fitted.pop("at_edge"):
        why = ("they are all right by a wide margin, so it would make every probability 0 or 1" if fitted["value"] < 1
               else "on them the scores do worse than no scores, so it would make every class equally likely")
        log(f"probabilities: the head's own scale: on {on} the best temperature is at the end of its range "
            f"({fitted['value']:.3g}): {why}")
        return None
    model.temperature = fitted["value"]
    log(f"probabilities: temperature {fitted['value']:.3f} fitted on {on}: their cross-entropy "
        f"{fitted['loss_before']:.4f} -> {fitted['loss_after']:.4f}; every prediction is as it was (--calibrate off "
        f"keeps the head's own scale)")
    return {"fitted_on": where, **fitted} | ({"distinct_examples": n} if where == "cross-validation" else {})


def _fallback_note(model_dir) -> str:
    """Where a saved folder's result.json says it was trained as another method than it holds (few
    labels: crossval.fit_cv kept the logistic regression), a sentence saying so; else ''."""
    try:
        r = json.loads((Path(model_dir) / "result.json").read_text())
    except (TypeError, OSError, ValueError):
        return ""
    asked, kept = (r.get("method"), r.get("model_method")) if isinstance(r, dict) else (None, None)
    if not (isinstance(asked, str) and isinstance(kept, str) and asked and kept) or asked == kept:
        return ""  # (result.json only informs this sentence: an edited one drops it)
    return (f". It was trained as --method {asked}, and on its few labels cross-validation kept a logistic "
            f"regression ({kept}) instead; train again with --fallback off (train_cfg={{'fallback': 'off'}} in Python) "
            f"to keep the {asked} head")


def runs_live(method: str, options: dict[str, Any] | None = None) -> bool:
    """Whether `method` with `options` trains or steers a backbone (so it reads no cache), known
    before any model is built."""
    spec = get_method(method)
    return (spec.encoder is not None or bool(make_config(method, options).train_backbone)
            or bool(getattr(spec.head_cls, "steers_backbone", False)))


def truncation_note(sources, max_length: int, longest: int | None = None, live: bool = False) -> str | None:
    """How many of the texts behind `sources` (live or cached) reached max_length tokens, or None; where
    a quarter or more did and the backbone reads up to `longest` tokens, that --max-length reads more
    (every IMDB review was cut at the default 128, and nothing said MiniLM reads 512), at the cost of a
    longer extraction, or (`live`: a method that runs its backbone on every batch) of longer steps."""
    reached = sum(int((s.lengths >= max_length).sum()) for s in sources)
    if not reached:
        return None
    total = sum(len(s) for s in sources)
    pairs = any(getattr(s, "sep", None) is not None for s in sources)
    cost = "each training step takes longer" if live else "extraction takes longer"
    more = (f"; this backbone reads up to {longest} tokens: --max-length {longest} reads more of each ({cost})"
            if longest is not None and longest > max_length and reached * 4 >= total else "")
    return (f"{reached:,} of {total:,} {'pairs' if pairs else 'texts'} reached --max-length {max_length} tokens"
            f"{' (the default)' if max_length == BackboneOptions.max_length else ''}; "
            + ("the longer text of a pair was cut first" if pairs else "longer ones were truncated to it") + more)


def train_config(defaults: dict[str, Any], given: dict[str, Any] | None) -> TrainConfig:
    """The method's training defaults with what the user gave; a value that cannot work is a MethodError."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    given = as_options(given, "train_cfg", "{'lr': 0.01, 'epochs': 5}")
    if unknown := sorted(set(given or {}) - known):
        raise MethodError(f"training option(s) {', '.join(unknown)} unknown; the options are: {', '.join(sorted(known))}")
    try:
        return TrainConfig(**{**defaults, **(given or {})}).validate()
    except ValueError as e:  # validate's own message names the option and what it must be
        raise MethodError(str(e)) from None
    except TypeError as e:  # e.g. lr="abc" from the API: a comparison of str with a number
        raise MethodError(f"training options {given}: {e}") from None


def _flags(options: Sequence[str]) -> str:
    """TrainConfig field names as the command line spells them: "--cv-folds, --fallback"."""
    return ", ".join(map(as_flag, options))


def _unused_cache_options(model: M.Classifier, method: str, cache_root: Path | None, rebuild_cache: bool,
                          log: Callable[[str], None]) -> None:
    """Say so where cache options are given for a model that runs its backbone live: it reads and writes
    no feature cache, so they change nothing (a note, not an error: a script may pass one cache folder
    to every method it runs)."""
    given = [f for f, v in (("--cache-dir", cache_root is not None), ("--rebuild-cache", rebuild_cache)) if v]
    if model.runs_live and given:
        log(f"cache: {', '.join(given)} not used: method {method!r} runs its backbone on every batch and reads no "
            f"feature cache")


@in_python_terms()
def evaluate_model(model_dir: Path, data: str, split: str = "test", text_field: str | None = None,
                   label_field: str | None = None, cache_root: Path | None = None,
                   progress: bool = True, device: str | None = None, precision: str | None = None,
                   log: Callable[[str], None] = _stderr, pair_field: str | None = None,
                   rebuild_cache: bool = False, errors: Path | None = None) -> dict:
    """Metrics of a saved model on a split of a dataset (the same numbers its training run
    reported, when given the same data and precision), each label's (per_class) and the confusion matrix.
    precision: of the frozen pass (default: the one it was trained with) — a head trained on fp32 states can be
    scored on bf16 ones. errors: a JSONL file to write every misclassified example into (write_errors)."""
    log, cache_root, errors = as_log(log), as_path(cache_root, "cache_root"), as_path(errors, "errors")
    as_switch(rebuild_cache, "rebuild_cache")
    check_split(split)  # before the model is read
    if errors is not None and str(errors) == "-":  # elsewhere "-" is standard input or output; here it made ./-
        raise DataError("--errors -: standard output carries eval's JSON; give a file name for the misclassified "
                        "examples, e.g. errors.jsonl")
    if errors is not None:  # a file frozentune reads, or one in the model's folder, said before its folder's advice
        _not_read_here(errors, data, model_dir)
    errors = _file_path(errors, "--errors") if errors is not None else None  # and its file before any work
    model = _load(model_dir, device, precision, log)
    ds, part, y, logits = _scored_split(model, model_dir, data, split, (text_field, label_field, pair_field),
                                        cache_root, rebuild_cache, progress, log)
    positive = positive_label(ds.name, model.labels)
    pred = logits.argmax(1)
    bb = model.backbone_ref
    named = str(model_dir) if isinstance(model_dir, (str, os.PathLike)) else f"a loaded {model.method} model"
    result = {"model": named, "data": ds.name, "split": split, "n": len(part),
              "metrics": metrics(y, pred, len(model.labels), positive),
              "intervals": intervals(y, pred, len(model.labels), positive), **class_report(y, pred, model.labels),
              "calibration": calibration(y, pred, softmax_rows(logits)),
              "positive_label": positive[1] if positive else None, "device": str(bb.device), "precision": bb.precision}
    if errors is not None:
        wrong = write_errors(errors, part, y, logits, model.labels)
        log(f"eval: {wrong:,} misclassified example{'s' if wrong != 1 else ''} of {len(part):,} written to {errors}")
        result["errors"] = {"file": str(errors), "count": wrong}
    if (band := result["intervals"]) is not None:  # (None: no examples, which reading the split refuses)
        m = result["metrics"]
        log(f"eval: {figures(m, band)}" + (f"  F1[{positive[1]}] {m['positive_f1']:.2f}" if positive else "")
            + f"  ECE {result['calibration']['ece']:.2f} points" + surest(result["calibration"]["selective"])
            + "; per class, the confusion matrix and calibration are in the JSON")
    return result


def surest(rows: list[dict], coverage: int = 80) -> str:
    """"; its surest 80% (probability ≥ p): accuracy a" for eval's line, from calibration's "selective"; ""
    where there is no such row."""
    row = next((r for r in rows if r["coverage"] == coverage), None)
    return "" if row is None else (f"; its surest {coverage}% (probability ≥ {row['threshold']:.3f}): accuracy "
                                   f"{row['accuracy']:.2f}")


def _scored_split(model: M.Classifier, model_dir: object, data: str, split: str,
                  fields: tuple[str | None, str | None, str | None], cache_root: Path | None, rebuild_cache: bool,
                  progress: bool, log: Callable[[str], None], verb: str = "eval") -> tuple[Dataset, TextSplit,
                                                                                          np.ndarray, np.ndarray]:
    """(the data, its `split` read as the model was trained, its labels in the model's order (N,), the model's
    logits on it (N, C)); what was read said in `log`. fields: --text-field, --label-field, --text-pair-field."""
    ds, part, y = _saved_split(model, data, split, fields[0], fields[1], fields[2], model_dir)
    for note in ds.notes:  # e.g. a single file's test split is the 10% carved from it, as training carved it
        log(f"data: {note}")
    one_file = split == "test" and Path(str(data)).expanduser().is_file()
    log(f"{verb}: the {split} split, {len(part):,} example{'s' if len(part) != 1 else ''} ({part.source})"
        + ("; --split all scores every row of the file" if one_file else ""))
    _read_as_trained(model, part)
    _unused_cache_options(model, model.method, cache_root, rebuild_cache, log)
    sources = SourceFactory(model.backbone_ref, model.runs_live, cache_root, rebuild_cache, progress, log)
    return ds, part, y, predict_logits(model, sources(part))


def _not_read_here(path: Path, data: str, model_dir: object) -> None:
    """A DataError where a file a command would write is one it reads: a file of the data, or one inside the model's
    folder (the errors of a test file written over it lost the test file)."""
    from .data import resolve

    try:
        target = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: _file_path says it, as writing it would fail
        return
    try:
        inputs = [Path(p).resolve() for p in resolve(data)[1].values()]
    except DataError:  # the data is said to be wrong where it is read, with its own message
        inputs = []
    if target in inputs:
        raise DataError(f"--errors {path}: a file of the data being scored; writing there would replace it: choose "
                        f"another file")
    if isinstance(model_dir, (str, os.PathLike)) and Path(model_dir).resolve() in (target, *target.parents):
        raise DataError(f"--errors {path}: {'the' if target == Path(model_dir).resolve() else 'inside the'} model's "
                        f"folder, which holds only what training wrote; choose a file elsewhere")


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    """(N, C) logits → the probabilities predict gives (torch's float32 softmax)."""
    import torch

    return torch.softmax(torch.from_numpy(np.asarray(logits)).float(), -1).numpy()


def write_errors(path: Path, part: TextSplit, y: np.ndarray, logits: np.ndarray, labels: Sequence[str]) -> int:
    """Every example of `part` whose prediction (argmax of `logits`, (N, C)) is not its label `y`, as JSON lines
    in the split's order: {"line" (of its file, where read from one), "text" (and "text_pair"), "label",
    "predicted", "scores" (the probabilities predict gives)}. Written whole or not at all (a temporary file beside
    it, renamed). Returns how many."""
    probs = softmax_rows(logits)
    wrong = np.flatnonzero(probs.argmax(1) != y)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace") as f:
            for i in wrong:
                where = {"line": int(part.lines[i])} if part.lines else {"row": int(i)}
                scored = labelled(labels, probs[i])
                # json_line: a text holding U+2028 (or U+0085, U+2029) split its line for str.splitlines and editors
                f.write(json_line({**where, **text_row(part.texts[i]), "label": labels[y[i]],
                                   "predicted": scored["label"], "scores": scored["scores"]}) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # the disk filled, or the folder went, while the states were read
        raise DataError(f"--errors {path}: cannot be written ({e.strerror or e}); choose another file") from None
    finally:
        tmp.unlink(missing_ok=True)
    return len(wrong)


def _read_as_trained(model: M.Classifier, part: TextSplit) -> None:
    """A PairError when `part` holds single texts for a pair model or pairs for a single-text one
    (eval and plot-concepts read fields from data files, so the advice names the field options)."""
    try:
        check_inputs(model, part.texts[:1])
    except PairError:  # its advice is predict's (--pair, --input): these read both fields from the data
        fields = model.pair_fields
        if model.takes_pairs:
            raise PairError(f"this model was trained on sentence pairs ({fields[0]}, {fields[1]}), and {part.source} "
                            f"was read as single texts: give --text-field {fields[0]} --text-pair-field {fields[1]} (or "
                            f"leave both out to read the model's), naming the data's fields") from None
        raise PairError(f"this model was trained on single texts (field {fields[0]!r}), and {part.source} was read as "
                        f"sentence pairs: leave --text-pair-field out, and give --text-field the data's text field") from None


def _load(model_dir: Path | M.Classifier, device: str | None, precision: str | None,
          log: Callable[[str], None]) -> M.Classifier:
    """A saved model with its frozen pass on `device` in `precision` (see saved_runtime); its head
    (and a trained backbone) on that device too."""
    if isinstance(model_dir, M.Classifier):
        bb = model_dir.backbone_ref
        now = {"device": str(bb.device), "precision": bb.precision}
        asked = {"device": None if device is None else _as_device(device), "precision": precision}
        if given := [f"{k}={v!r}" for k, v in (("device", device), ("precision", precision))
                     if v is not None and asked[k] != now[k]]:
            # they were accepted and ignored: the model ran as it was loaded
            raise MethodError(f"{', '.join(given)}: a loaded model runs where and as it was loaded (its pass: "
                              f"{bb.device}, {bb.precision}); pass the model's folder to load it that way, or "
                              f"leave {'it' if len(given) == 1 else 'them'} out")
        return model_dir
    if not isinstance(model_dir, (str, os.PathLike)):
        raise DataError(f"model: {type(model_dir).__name__} ({str(model_dir)[:40]}); give the folder of a saved model "
                        f"(a str or Path), or a loaded model")
    lines: list[str] = []  # said once the method is known: a live method runs its backbone in fp32 whatever was asked
    model = M.load(model_dir, runtime=saved_runtime(device, precision, lines.append))
    for line in lines:
        log(f"precision: fp32 (method {model.method!r} runs its backbone itself, in fp32; --precision applies to "
            f"frozen passes)" if model.runs_live and line.startswith("precision:") else line)
    _live_backbone_on(model, model.backbone_ref.device)
    model.to(model.backbone_ref.device)
    return model


def _as_device(spec: str) -> str:
    """A --device value as torch writes the device ("cpu", "cuda:0"), for comparing it with a loaded one's;
    the value itself where it is not one ("auto": never the same as a loaded model's)."""
    import torch

    try:
        d = torch.device(spec)
    except (RuntimeError, TypeError):
        return spec
    return f"{d.type}:0" if d.type == "cuda" and d.index is None else str(d)


def _live_backbone_on(model: M.Classifier, device) -> bool:
    """A method that trains or steers the backbone runs it itself, in fp32, on `device`: set that up.
    Returns whether the backbone's precision had to be changed to fp32 for it."""
    if not model.runs_live:
        return False
    bb = model.backbone_ref
    changed = bb.precision != "fp32"
    if changed:
        bb.set_runtime(device, "fp32")
    bb.model.to(device)
    return changed


def check_split(split: str) -> None:
    if split not in ("train", "validation", "test", "all"):
        raise DataError(f"split {split!r}: choose train, validation, test or all")


def _saved_split(model: M.Classifier, data: str, split: str, text_field: str | None,
                 label_field: str | None, pair_field: str | None = None, model_dir: Path | None = None) -> tuple[Dataset, TextSplit, np.ndarray]:
    """A split of `data` read the way the model was trained (fields, seed for carved splits),
    with its labels encoded in the model's label order. Split `all`: every row of one file, nothing
    carved (a file of held-out examples scored whole). Data of another task (no row has the model's
    fields, and its labels are none of the model's) is said to be so in one error, not field by field."""
    from .data import FieldNowhere, label_values

    try:
        return _read_saved_split(model, data, split, text_field, label_field, pair_field, model_dir)
    except FieldNowhere as e:
        label = label_field or model.saved_config.get("label_field", "label")  # type: ignore[attr-defined]
        held = label_values(e.path, label)
        if not held or held & set(model.labels):
            raise
        raise DataError(f"{e.path}: data of another task: no row has the model's field {e.field!r} "
                        f"(its fields: {', '.join(map(repr, e.fields))}), and its labels "
                        f"({some(sorted(held))}) are none of the model's "
                        f"({some(model.labels)}); give data of the task the model was trained on (or "
                        f"name its fields and label field with --text-field / --text-pair-field / --label-field)"
                        ) from None


def _read_saved_split(model: M.Classifier, data: str, split: str, text_field: str | None, label_field: str | None,
                      pair_field: str | None, model_dir: Path | None) -> tuple[Dataset, TextSplit, np.ndarray]:
    """_saved_split, as the data reads."""
    check_split(split)
    saved = model.saved_config  # type: ignore[attr-defined]
    seed = saved.get("train", {}).get("seed", 0)
    fields = (text_field or saved.get("text_field", "text"), label_field or saved.get("label_field", "label"),
              pair_field or (None if text_field else saved.get("text_pair_field")))
    if split == "all":
        ds = _whole_file(data, *fields)
        part = ds.test
    elif split == "test" and "test" in (files := resolve(data))[1]:  # a test file: read alone, as it is (train's
        # content, one class or a bad line, does not stop it being scored)
        part = read_split(files[1]["test"], *fields)
        ds = Dataset(files[0], part.subset([]), part.subset([]), part, sorted(set(part.labels)), [], fields[0], fields[2])
    elif split == "test":  # carved from a single file as training carved it; what train gave up after does not matter
        try:
            ds = load_classification(data, fields[0], fields[1], seed=seed, pair_field=fields[2], test_only=True,
                                     renamed=renamed_from(saved))
        except CarveError as e:
            raise DataError(f"{e}; to score every row of {data} instead, give --split all") from None
        part = ds.test
    else:
        sample = _training_sample(saved, data, split, model_dir)
        expect = sample.pop("expect_sizes", None)
        ds = load_classification(data, fields[0], fields[1], seed=seed, pair_field=fields[2], **sample,
                                 renamed=renamed_from(saved))
        part = getattr(ds, split)
        rows = (saved.get("split_rule") or {}).get("rows")  # recorded since 2026-11-28
        if sample and expect is None and rows is not None and (ds.split_rule or {}).get("rows") != rows:
            raise DataError(f"{data}: its train / validation rows are not the ones this model was trained on (the "
                            f"file was edited or reordered since), so its {split} split cannot be rebuilt: the same "
                            f"sample would be other rows; use --split test, or train the model again on this data")
        if expect is not None and (len(ds.train), len(ds.validation)) != (expect.get("train"), expect.get("validation")):
            raise DataError(f"{data}: this model was saved before frozentune recorded how its splits were drawn, and "
                            f"they cannot be rebuilt: its result.json has {expect.get('train')} train / "
                            f"{expect.get('validation')} validation examples, reading the data now gives "
                            f"{len(ds.train)} / {len(ds.validation)}; use --split test, or train it again")
        if split == "validation" and not len(part):
            raise DataError(f"{ds.name}: the model was trained without a validation split ({len(ds.train):,} training "
                            f"examples, under --cv-below: cross-validation on all of train chose its schedule), so "
                            f"there is none to score; use --split test (held out), or --split train")
    missing, extra = sorted(set(model.labels) - set(ds.labels)), sorted(set(part.labels) - set(model.labels))
    if extra:
        at = [n for n, lab in zip(part.lines, part.labels) if lab in extra] if part.lines else []
        where = f"{part.source}:{at[0]}" if at else part.source
        raise DataError(f"{where}: labels {some(extra)} are not among the model's "
                        f"({some(model.labels)})"
                        + rows_like_it(at, "hold them")  # (them: those labels, said before the model's own)
                        + (f"; the model's {some(missing)} do not occur in the data" if missing else "")
                        + ". Give data with the model's labels (or check --label-field)"
                        + renamed_hint(model.saved_config, extra,  # type: ignore[attr-defined]
                                       model_dir if isinstance(model_dir, (str, os.PathLike)) else "DIR") + ".")
    return ds, part, encode_labels(part, {lab: i for i, lab in enumerate(model.labels)})


class Provenance(NamedTuple):
    """Where the rows a command scores stand to a saved model's training run (trained_on)."""
    same_data: bool             # the data it was trained on, laid out as its run read it
    trained_file: str | None    # otherwise: the file the rows are read from, where it holds the rows it trained on
    run_test: bool              # the rows are the test split its run scored (result.json's figures)


def _trains(files: Mapping[str, Any]) -> Any:
    """The file a run draws train from (data.run_files: train, or validation where the data has validation and test
    files but no train, SNLI offline); None where it has neither."""
    return run_files(files).get("train")


def trained_on(config: dict, data: str, split: str) -> Provenance:
    """Where `split` of `data` stands to the model's training run (`config`: its saved config.json).

    The same data: the same files; else, where the run recorded a digest of the rows it drew train and validation
    from (split_rule's "rows", since 2026-11-28), the same rows in the same splits (the data moved or copied); else
    (older models) a dataset of the same name. Its train split is then the run's, its validation split the run's
    held-out carve or file. Otherwise, where `split` reads its rows from the file the run trained on, or from one
    holding the same rows (`--data …/train.jsonl` of a model trained on the dataset: read alone, that file is carved
    anew or read whole), they are training rows whatever the split is called: `trained_file` names it. And whether
    the rows are the test split the run scored."""
    from .data import resolved_files

    name, files = resolve(data)
    rule = config.get("split_rule") or {}
    recorded, here = rule.get("files") or {}, resolved_files(files)
    own = split == "test" or (split == "validation" and "train" in here)  # a split that may be a file of its own
    read = here[split] if own and split in here else _trains(here)  # the file its rows come from
    digest_same = False
    if here == recorded:
        same = True
    elif "rows" in rule:
        digest_same = _rows_digest(files, config) == rule["rows"]
        same = digest_same and _layout(here) == _layout(recorded)
    else:
        same = name == config.get("data")
    if same:
        carved = "test" not in here and "test" not in recorded  # the run's test carve, drawn again with its seed
        return Provenance(True, None, split == "test" and (carved or here.get("test") == recorded.get("test")
                                                           or not recorded))  # (no paths recorded: by name)
    copied = (read is not None and read == _trains(here) and "train_rows" in rule  # a copy of its training file,
              and _rows_digest({"train": Path(read)}, config) == rule["train_rows"])  # by that file's digest
    training = read is not None and (read == _trains(recorded) or (digest_same and read == _trains(here)) or copied)
    return Provenance(False, read if training else None, read is not None and read == recorded.get("test"))


def training_rows(where: Provenance, data: str, split: str, whose: str = "the model") -> str | None:
    """What `split` of `data` is, in words, where it holds rows the model was trained on (`where`, trained_on's: its
    train split, every row of its data, or any split of its training file read alone); None where it does not."""
    same_data, trained_file, _ = where
    if split == "train" and same_data:
        return f"the examples {whose} was trained on"
    if split == "all" and same_data:
        return f"every row of {data}, the examples {whose} was trained on among them"
    return f"rows of {trained_file}, which holds the rows {whose} was trained on" if trained_file else None


def _layout(files: Mapping[str, Any]) -> list[str]:
    """The splits a run reads from `files` (data.run_files), so that a folder of the SNLI-offline layout whose
    validation file was renamed train is laid out the same."""
    return sorted(run_files(files))


def _rows_digest(files: dict, config: dict) -> str | None:
    """data.rows_digest of the train and validation files of `files` read with the model's fields and under the
    label names it was trained with (as its run read them, load_classification); None where they cannot be read so."""
    from .data import as_trained, rows_digest, with_names

    try:
        splits = {k: read_split(p, config.get("text_field", "text"), config.get("label_field", "label"),
                                config.get("text_pair_field"))
                  for k, p in run_files(files).items() if k in ("train", "validation")}
    except (FrozentuneError, OSError):
        return None
    forward = as_trained(splits, renamed_from(config))
    return rows_digest({k: with_names(sp, forward) for k, sp in splits.items()})


def renamed_from(config: dict) -> dict[str, str] | None:
    """A relabelled model's labels → the names it was trained with (config.json's labels and trained_labels);
    None where they were not renamed."""
    labels, trained = config.get("labels"), config.get(_relabel.TRAINED_LABELS)
    if not (isinstance(labels, list) and isinstance(trained, list) and len(labels) == len(trained)):
        return None
    return dict(zip(map(str, labels), map(str, trained)))


def _training_sample(saved: dict, data: str, split: str, model_dir: Path | None) -> dict[str, Any]:
    """load_classification's arguments that make train and validation what the model's training run
    made of `data` (its --shots / --max-train sample, no validation carved under --cv-below), where
    `data` is the data it was trained on (trained_on: the same files, or its rows moved or copied; a dataset of the
    same name for a model saved before the rows were recorded); {} for other data, whose splits are read as they are
    (the test split does not depend on them). A model saved before the rule was recorded is given the arguments its
    result.json implies, and they are checked against the split sizes it recorded."""
    name, files = resolve(data)
    rule = saved.get("split_rule")
    if rule is not None:
        if not trained_on(saved, data, split).same_data:  # (a copy under another name is; another of the same is not)
            return {}
        return {k: rule[k] for k in ("shots", "max_train", "carve_below", "val_fraction") if k in rule}
    if split == "test" or saved.get("data") != name:
        return {}
    try:
        result = json.loads((Path(model_dir) / "result.json").read_text())
        sizes, max_train = result["sizes"], result["config"].get("max_train")
    except (TypeError, OSError, ValueError, KeyError):
        sizes = None
    if sizes is None:
        raise DataError(f"{data}: this model was saved before frozentune recorded how its train and validation splits "
                        f"were drawn, and its result.json cannot say, so its {split} split cannot be rebuilt for "
                        f"certain; use --split test, or train it again")
    cv_below = saved.get("train", {}).get("cv_below", 0)
    no_val = sizes.get("validation") == 0 and sizes.get("train", 0) < cv_below
    return {"shots": saved.get("shots"), "max_train": max_train, "carve_below": cv_below if no_val else 0,
            "expect_sizes": sizes}


def _whole_file(data: str, text_field: str, label_field: str, pair_field: str | None) -> Dataset:
    """One labelled file read whole as the test split (nothing carved, no train): `eval --split all`."""
    name, files = resolve(data)
    if not Path(data).expanduser().is_file():
        raise DataError(f"--split all scores every row of one file; {data} is a dataset folder or name, whose splits "
                        f"are files of their own: choose --split train, validation or test")
    part = read_split(files["train"], text_field, label_field, pair_field)
    return Dataset(name, part.subset([]), part.subset([]), part, sorted(set(part.labels)),
                   [f"--split all: every row of {files['train']}, nothing carved"], text_field, pair_field)


def _png_path(output: Path) -> Path:
    """Where plot-concepts writes its picture, checked before any work: a .png path (the suffix added
    when it has none, as matplotlib would), not a folder, in a folder that exists or can be made, and
    writable; a DataError saying which otherwise."""
    try:
        if output.is_dir():
            raise DataError(f"--output {output}: is a folder; give the picture's file name, e.g. "
                            f"{output / 'concepts.png'}")
    except OSError as e:  # e.g. a name too long: even asking whether it is a folder fails
        raise DataError(f"--output {output}: cannot be written ({e.strerror or e}); choose another file") from None
    if output.suffix.lower() in (".jpg", ".jpeg", ".svg", ".pdf", ".gif", ".webp", ".tif", ".tiff", ".bmp"):
        raise DataError(f"--output {output}: plot-concepts writes a PNG; give a .png name, e.g. "
                        f"{output.with_suffix('.png')}")
    return _file_path(output if output.suffix.lower() == ".png" else output.with_name(output.name + ".png"),
                      example="concepts.png")


def _file_path(output: Path, flag: str = "--output", example: str = "errors.jsonl") -> Path:
    """A file a command writes when its work is done (`flag` names it), checked before any work: not a folder, in a
    folder that exists or can be made, and writable; a DataError saying which otherwise (`example`: a file name
    the advice for a folder suggests)."""
    try:
        return _checked_file_path(output, flag, example)
    except OSError as e:  # e.g. a name too long: even asking whether it is a folder fails
        raise DataError(f"{flag} {output}: cannot be written ({e.strerror or e}); choose another file") from None


def _checked_file_path(output: Path, flag: str, example: str) -> Path:
    if output.is_dir():
        raise DataError(f"{flag} {output}: is a folder; give a file name, e.g. {output / example}")
    parent = output.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise DataError(f"{flag} {output}: {parent} is a file, so the folder cannot be made there")
    if not os.access(parent, os.W_OK):
        raise DataError(f"{flag} {output}: {parent} is not writable; choose a folder you can write to")
    if output.parent.is_dir():  # the path itself, opened as the file will be: os.access says yes to root on /proc,
        existed = output.exists() or output.is_symlink()  # and knows nothing of a dangling link or a name too long
        try:
            with open(output, "ab"):
                pass
        except OSError as e:
            raise DataError(f"{flag} {output}: cannot be written ({e.strerror or e}); choose another file") from None
        if not existed:
            output.unlink()
    return output


@in_python_terms()
def plot_concepts(model_dir: Path, data: str, output: Path | None = None, split: str = "test",
                  max_points: int = 3000, text_field: str | None = None, label_field: str | None = None,
                  cache_root: Path | None = None, progress: bool = True, device: str | None = None,
                  precision: str | None = None, log: Callable[[str], None] = _stderr,
                  pair_field: str | None = None) -> dict:
    """Write a PNG of a `space` model's centroids for a split's examples in concept space (a seeded
    sample of at most max_points), coloured by true label; also return the silhouette score of the
    true labels over the concatenated centroids (1: tight separate classes, 0: overlapping)."""
    from sklearn.metrics import silhouette_score

    from .plot import plot_concepts as draw
    from .train import predict_outputs

    log, cache_root, output = as_log(log), as_path(cache_root, "cache_root"), as_path(output, "output")
    model = _load(model_dir, device, precision, log)
    if model.method != "space":
        raise MethodError(f"plot-concepts draws the concept spaces of a `space` model; {model_dir} holds "
                         f"a {model.method!r} model" + _fallback_note(model_dir))
    if isinstance(max_points, bool) or not isinstance(max_points, int):
        raise MethodError(f"max_points={max_points!r}: give a whole number of at least 2 (the examples drawn)")
    if max_points < 2:
        raise MethodError(f"--max-points {max_points}: give at least 2 (the examples drawn)")
    output = _png_path(Path(output)) if output else None  # checked before the states are extracted
    ds, part, y = _saved_split(model, data, split, text_field, label_field, pair_field, model_dir)
    if output is None:  # the model's folder, checked now too (a read-only one failed after the states were read)
        try:
            output = _png_path(Path(model_dir) / f"concepts-{ds.name}-{split}.png")
        except DataError as e:
            raise DataError(f"{str(e).removeprefix('--output ').split(';')[0]}: the picture goes into the model's "
                            f"folder unless --output says where; pass --output FILE.png") from None
    _read_as_trained(model, part)  # a pair model was drawn from single texts, silently
    sources = SourceFactory(model.backbone_ref, model.runs_live, cache_root, False, progress, log)
    src = sources(part)
    keep = np.sort(np.random.default_rng(0).permutation(len(part))[:max_points])
    outs = predict_outputs(model, _Subset(src, keep), ("centroids",))
    k, y = outs["centroids"], y[keep]  # (N, n, m), (N,)
    accuracy = 100.0 * float((outs["logits"].argmax(1) == y).mean())
    # the silhouette needs 2 .. n − 1 distinct labels among the n points drawn (a handful of points may hold fewer)
    labels_drawn = len(set(y.tolist()))
    silhouette = float(silhouette_score(k.reshape(len(k), -1), y)) if 1 < labels_drawn < len(y) else float("nan")
    if math.isnan(silhouette):
        log(f"plot-concepts: no silhouette (nan): it needs 2 to {len(y) - 1} distinct labels among the {len(y)} points "
            f"drawn, and they hold {labels_drawn}; draw more points (--max-points)")
    title = (f"space model on {ds.name} {split}: {len(k):,} of {len(part):,} examples, m = {k.shape[2]}\n"
             f"accuracy on these {accuracy:.1f}%, silhouette of the true labels {silhouette:.2f}")
    try:
        what = draw(k, y, model.labels, output, title)
    except OSError as e:  # the disk filled, or the folder went, while the states were read
        raise DataError(f"--output {output}: cannot be written ({e.strerror or e}); choose another file") from None
    if Path(output).parent.resolve() == Path(model_dir).resolve():  # in the model's folder: frozentune's, like the rest
        from .output import record_written

        record_written(Path(model_dir), Path(output).name)
    return {"png": str(output), "data": ds.name, "split": split, "points": len(k), "of": len(part),
            "drawn": what, "accuracy_on_points": accuracy, "silhouette": silhouette}


class _Subset:
    """Rows `keep` of a source, in that order."""

    def __init__(self, src: M.Source, keep: np.ndarray):
        self.src, self.keep = src, keep
        self.lengths = src.lengths[keep]

    def __len__(self) -> int:
        return len(self.keep)

    def batch(self, idx: np.ndarray) -> M.Batch:
        return self.src.batch(self.keep[idx])


def _with_text(bb: Backbone, texts: Sequence[Text], tokens, first: int = 0):
    """tokens, unless one input kept no token of its text (Backbone.textless): then a DataError naming it
    (`texts` begin at index `first` of what the user gave)."""
    from .backbone import textless_message

    if empty := bb.textless(texts, tokens.lengths):
        raise DataError(textless_message(f"texts[{first + empty[0][0]}]", empty[0][1]))
    return tokens


def read_inputs(model_dir: Path, path: Path, text_field: str | None = None,
                pair_field: str | None = None) -> list[Text]:
    """The inputs in a file for a saved model: a .jsonl/.csv/.tsv file's text field (and, for a model
    trained on pairs, its second text's field) — the model's field names unless given — or a plain
    file's lines, one text each (not for a pair model: a line cannot hold two texts unambiguously)."""
    saved = M.read_saved(Path(model_dir))
    return read_inputs_with((saved.get("text_field"), saved.get("text_pair_field")), path, text_field, pair_field)


def read_inputs_with(fields: tuple[str | None, str | None], path: Path, text_field: str | None = None,
                     pair_field: str | None = None) -> list[Text]:
    """read_inputs for a model whose (text field, pair field or None) are `fields`. Standard input ("-")
    is read as JSON Lines where fields are needed (a pair model, or `text_field` given), else one text
    per line."""
    from .data import SUFFIXES, is_hf_split_folder, read_lines, read_texts

    if pair_field and fields[0] is not None and fields[1] is None:  # a model known to take single texts
        raise DataError(f"--text-pair-field {pair_field}: the model takes single texts (trained on field "
                        f"{fields[0]!r}), not pairs; leave --text-pair-field out")
    pair = pair_field or fields[1]
    records = str(path) == "-" and (pair is not None or text_field is not None)  # standard input as JSON Lines
    if records or Path(path).suffix.lower() in SUFFIXES or is_hf_split_folder(Path(path)):
        text = text_field or fields[0] or "text"
        if pair is not None and pair == text:  # each pair would be one field twice
            given = "--text-field" if text_field else "--text-pair-field"
            raise DataError(f"{given} {pair!r}: the model's pairs would read field {pair!r} as both texts; give "
                            f"--text-field and --text-pair-field as two different fields (the model was trained on "
                            f"{fields[0]!r}, {fields[1]!r})")
        return read_texts(path, text, pair)
    if pair:
        raise DataError(f"{path}: the model takes sentence pairs ({fields[0]}, {pair}); give them in a "
                        f".jsonl / .csv / .tsv file with both fields, as JSON Lines on standard input (--input -), "
                        f"or as --pair FIRST SECOND")
    if text_field:  # it was ignored, where generate and pretrain refuse it
        raise DataError(f"--text-field {text_field}: {path} is read as plain text, one text per line, which has no "
                        f"fields; leave --text-field out, or give a .jsonl / .csv / .tsv file")
    return read_lines(path, "texts")


def check_inputs(model: M.Classifier, texts: Sequence[Text]) -> bool:
    """Whether `texts` are pairs; a PairError when they are not what the model was trained on
    (pairs for a pair model, single texts otherwise), naming the fields it was trained with."""
    pairs = pair_kind(texts)
    fields, takes = model.pair_fields, model.takes_pairs
    if fields is None:  # a model built here and not trained through `train`: whatever it is given
        return pairs
    if takes and not pairs:
        raise PairError(f"this model was trained on sentence pairs ({fields[0]}, {fields[1]}): give each input as "
                        f"a pair — `--pair FIRST SECOND` on the command line, an --input file with both fields, "
                        f"or (first, second) tuples in Python")
    if not takes and pairs:
        raise PairError(f"this model was trained on single texts (field {fields[0]!r}), not pairs: give one text "
                        f"per input (glue the two texts yourself if that is what you mean)")
    return pairs


def text_row(text: Text) -> dict:
    """An input as a result row shows it: {"text"} or, for a pair, {"text", "text_pair"}."""
    return {"text": text[0], "text_pair": text[1]} if is_pair(text) else {"text": text}


def positive_label(name: str, labels: Sequence[str]) -> tuple[int, str] | None:
    """(index, name) of the class a named dataset reports F1 of (MRPC: equivalent), or None."""
    lab = POSITIVE.get(name)
    return (list(labels).index(lab), lab) if lab in labels else None


def given_texts(texts: object, what: str = "texts", pairs: bool = True) -> list[Text]:
    """The texts of a predict / explain call, as a list, held to the rules of texts in files: a list
    (or any iterable) of strings or (first, second) pairs, at least one, none empty or not valid
    Unicode. A bare string is refused, not read one character at a time."""
    from .data import blank, invisible, unencodable

    if isinstance(texts, (str, bytes)):
        raise DataError(f"{what}: a single {type(texts).__name__} ({texts[:40]!r}); give a list of texts, e.g. [text]")
    kinds = "texts or (first, second) pairs" if pairs else "texts"
    if hasattr(texts, "columns") and hasattr(texts, "iloc"):  # a pandas DataFrame iterates over its column names
        names = list(texts.columns)
        if not names:
            raise DataError(f"{what}: an empty DataFrame; give a list of {kinds}")
        example = f"df[{names[0]!r}].tolist()" + (f", or for pairs list(zip(df[{names[0]!r}], df[{names[1]!r}]))"
                                                   if pairs and len(names) > 1 else "")
        raise DataError(f"{what}: a DataFrame (columns {', '.join(map(repr, names[:5]))}); give a list of {kinds}, "
                        f"e.g. {example}")
    if isinstance(texts, (Mapping, set, frozenset)):  # a dict's keys would be labelled, a set's rows come back in any order
        raise DataError(f"{what}: a {type(texts).__name__}, not a list; give a list of {kinds}"
                        + (" (e.g. [record['text'] for record in records])" if isinstance(texts, Mapping) else ""))
    try:
        out = list(texts)  # type: ignore[arg-type]  # a generator is read once, here
    except TypeError:
        raise DataError(f"{what}: {type(texts).__name__}, not a list; give a list of {kinds}") from None
    if not out:
        raise DataError(f"{what}: the list is empty; give at least one text")
    for i, t in enumerate(out):
        for k, part in enumerate(t if isinstance(t, tuple) else (t,)):
            where = f"{what}[{i}]" + (f"[{k}]" if isinstance(t, tuple) else "")
            if isinstance(part, str) and blank(part):
                raise DataError(f"{where}: empty{invisible(part)}; give some text")
            if isinstance(part, str) and (why := unencodable(part)) is not None:
                raise DataError(f"{where}: {why}; give valid Unicode")
    if pairs:  # each item is a string or a pair of them, all alike: said before a model is loaded for them
        pair_kind(out)
    return out


@in_python_terms()
def predict(model_dir: Path | M.Classifier, texts: Sequence[Text], device: str | None = None,
            precision: str | None = None, log: Callable[[str], None] = _stderr,
            top_classes: int | None = None) -> list[dict]:
    """Label and per-label probabilities for each text or (first, second) pair (backbone run live,
    on `device` in `precision`: default auto and the precision the model was trained with). A text
    that reached max_length tokens (and was cut there) has "truncated": true, as the server says,
    and `log` says how many were. top_classes: keep the K likeliest classes' probabilities, likeliest
    first (None: every class, in label order). predict_stream gives the rows as they are done."""
    return list(predict_stream(model_dir, texts, device, precision, log, top_classes=top_classes))


PREDICT_CHUNK = 2048  # texts tokenised and scored together: memory is bounded by one chunk, and rows come out per chunk


@in_python_terms()
def predict_stream(model_dir: Path | M.Classifier, texts: Sequence[Text], device: str | None = None,
                   precision: str | None = None, log: Callable[[str], None] = _stderr,
                   chunk: int | None = None, top_classes: int | None = None) -> Iterator[dict]:
    """predict's rows, in order, `chunk` texts at a time: 25,000 IMDB reviews were all tokenised and
    scored before the first row came out (2.6 GB, nothing printed for minutes, nothing kept on Ctrl-C).
    Where there are several chunks, `log` says how far it is every train.PROGRESS_EVERY_S seconds; the
    note of texts cut at max_length comes at the end, for all of them."""
    texts, log = given_texts(texts), as_log(log)  # checked now, not when the stream is first read
    chunk = PREDICT_CHUNK if chunk is None else whole_chunk(chunk)
    top_classes = as_top_classes(top_classes)
    model = _load(model_dir, device, precision, log)
    pairs = check_inputs(model, texts)
    return _predict_rows(model, model_dir, texts, pairs, chunk, log, top_classes)


def _predict_rows(model: M.Classifier, model_dir, texts: list[Text], pairs: bool, chunk: int,
                  log: Callable[[str], None], top_classes: int | None = None) -> Iterator[dict]:
    from . import train as T

    bb = model.backbone_ref
    cuts = []
    t0 = said = time.perf_counter()
    for first in range(0, len(texts), chunk):
        part = texts[first:first + chunk]
        tokens = _with_text(bb, part, bb.tokenize(part), first)
        probs = _scored(model, tokens, pairs)
        if not np.isfinite(probs).all():
            bad = int((~np.isfinite(probs).all(1)).sum())
            raise M.ModelLoadError(f"{model_dir}: the model's scores are not numbers (NaN or infinite) for {bad} of "
                                   f"{len(part)} texts; its weights are damaged: train it again")
        cut = cut_rows(tokens.cut, bb.max_length, pairs)  # the text went on past what was read (said at the end)
        cuts.append(cut)
        yield from ({**text_row(t), **likeliest(labelled(model.labels, p), top_classes),
                     **({"truncated": True} if c else {})} for t, p, c in zip(part, probs, cut))
        done = first + len(part)
        if done < len(texts) and (now := time.perf_counter()) - said >= T.PROGRESS_EVERY_S:
            said, rate = now, done / (now - t0)
            log(f"predict: {done:,} of {len(texts):,} {'pairs' if pairs else 'texts'}, {rate:,.0f} a second, about "
                f"{(len(texts) - done) / rate / 60:,.1f} min left")
    cut_rows(np.concatenate(cuts), bb.max_length, pair_kind(texts), log)  # said once, for all of them


def whole_chunk(chunk: object) -> int:
    """A `chunk` argument (inputs handled together): a whole number of at least 1."""
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
        raise MethodError(f"chunk={chunk!r}: give a whole number of inputs handled together, at least 1 (None: the "
                          f"default)")
    return int(chunk)


def labelled(labels: Sequence[str], probs: Sequence[float]) -> dict:
    """{"label", "scores"} of one text from its per-label probabilities (the first of tied maxima)."""
    best = max(range(len(probs)), key=probs.__getitem__)  # the first of tied maxima, as np.argmax; no array per row
    return {"label": labels[best], "scores": {lab: float(s) for lab, s in zip(labels, probs)}}


def as_top_classes(value: object) -> int | None:
    """A `top_classes` argument: None (every class), or a whole number of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise DataError(f"top_classes={value!r}: give a whole number of at least 1 (how many of the likeliest classes "
                        f"each row's scores keep), or None for every class")
    return int(value)


def likeliest(row: dict, k: int | None) -> dict:
    """`row` with its "scores" cut to the k likeliest classes, likeliest first (ties in the label order),
    and its explanation's per-class parts kept to the same classes (_classes_kept), the same done to each
    task's under "tasks" (an answer of several heads); unchanged for k None. The
    label is always the first, as it is the likeliest: with a thousand classes a row was a thousand scores."""
    if k is None:
        return row
    out = dict(row)
    if isinstance(row.get("scores"), dict):
        ranked = sorted(row["scores"].items(), key=lambda kv: -kv[1])  # stable: ties keep the label order
        out["scores"] = dict(ranked[:k])
        if isinstance(row.get("explanation"), dict):
            out["explanation"] = _classes_kept(row["explanation"], set(row["scores"]), list(out["scores"]))
    if isinstance(row.get("tasks"), dict):
        out["tasks"] = {name: likeliest(t, k) if isinstance(t, dict) else t for name, t in row["tasks"].items()}
    return out


def _classes_kept(explanation: dict, labels: set[str], kept: list[str]) -> dict:
    """An explanation whose per-class parts (an entry keyed by every label: space's "classes", ytuning's
    "attention" and "special_tokens") keep the classes `kept`, in that order; its other parts as they are.
    With a thousand classes, --top-classes 3 kept three probabilities beside a thousand class blocks."""
    return {key: {lab: part[lab] for lab in kept} if isinstance(part, dict) and set(part) == labels else part
            for key, part in explanation.items()}


@in_python_terms(backbone=True)
def build_cache(data: str, backbone: BackboneOptions = BackboneOptions(), splits: Sequence[str] = ("train", "validation", "test"),
                text_field: str = "text", label_field: str = "label", cache_root: Path | None = None,
                rebuild: bool = False, progress: bool = True,
                log: Callable[[str], None] | None = print, shard: str | None = None,
                pair_field: str | None = None, cache_log: Callable[[str], None] | None = None) -> list[dict]:
    """Build the cache entries for a dataset's split files; existing entries are verified in
    full (sizes and checksums) and reported. An interrupted build resumes from its finished
    shards. shard 'i/N' (or RANK / WORLD_SIZE from torchrun or accelerate launch) extracts only
    this process's part; the entry is published when every part is done. `log` takes every message
    line (None: none); `cache_log`, where given, the cache's own (sizes, progress, waits, resumes).
    `splits`: a list, or one name or a comma list as text."""
    from .data import SPLIT_NAMES, text_fields
    from .extract.shards import part_of

    backbone, cache_root, log = as_backbone(backbone, loaded=False), as_path(cache_root, "cache_root"), as_log(log)
    cache_log = log if cache_log is None else as_log(cache_log, "cache_log")
    as_switch(rebuild, "rebuild")
    as_switch(progress, "progress")
    if isinstance(splits, str):  # "test" was read as the splits t, e, s, t
        splits = [x.strip() for x in splits.split(",")]

    part = part_of(shard)
    if part.count > 1 and rebuild:
        raise DataError(f"--rebuild-cache with a build split in {part.count} parts ({part.how}): the parts would "
                        f"delete each other's shards; rebuild with one process, or remove the entry first "
                        f"(`frozentune cache --prune` lists what it removes)")
    name, files = resolve(data)
    text_field, pair_field = text_fields(name, text_field, pair_field, files, label_field)
    for note in one_side_note(name, files, text_field, pair_field):
        log(f"data: {note}")
    check_token_types(backbone, pair_field is not None, data)
    unknown = [s for s in splits if s not in SPLIT_NAMES]
    if unknown or not splits:
        raise DataError(f"--splits {','.join(splits)}: choose among {', '.join(SPLIT_NAMES)}")
    if not any(s in files for s in splits):
        raise DataError(f"{data}: has no {' / '.join(splits)} file (it has: {', '.join(files)})")
    rt = backbone.runtime()
    for line in rt.lines:
        log(line)
    if part.count > 1:
        log(f"cache: extracting part {part.index} of {part.count} ({part.how}): shards k with k mod {part.count} = "
            f"{part.index}")
    bb = backbone.load(rt)
    # the texts alone: the states need no labels (a file of texts to predict on can be cached); a file with
    # labels gives the same texts in the same order as training reads them
    todo = {split: read_texts(files[split], text_field, pair_field) for split in splits if split in files}
    # the entries not yet cached fit in the free space together, checked before the first is extracted (as train and
    # sweep do): each alone was checked as it started, so train filled the disk, then validation was refused
    tokens = check_room(bb, list(todo.values()), cache_root)
    out = []
    for split, texts in todo.items():
        source = str(Path(files[split]).resolve())  # recorded in the entry, where this builds it
        if part.count == 1:
            cache, secs = get_or_build(bb, texts, cache_root, rebuild=rebuild, progress=progress, log=cache_log,
                                       tokens=tokens.pop(id(texts), None), source=source)
            stats = None
        else:
            cache, stats = build_part(bb, texts, part, cache_root, progress=progress, log=cache_log, source=source)
            secs = stats.seconds if stats is not None else 0.0
        row = {"split": split, "file": str(files[split]), "device": str(bb.device), "precision": bb.precision,
               "extract_seconds": secs}
        if cache is None:
            report = stats.report
            row |= {"path": None, "complete": False, "shards_done_now": len(report.done_now),
                    "shards_missing": report.missing}
            log(f"{split}: part {part.index}/{part.count} done ({len(report.done_now)} shards, {secs:.1f}s); "
                f"{len(report.missing)} of {stats.shards} shards are other parts' — the entry is written when the "
                f"last part finishes")
            out.append(row)
            continue
        built = cache.build_seconds  # every run's shards: more than secs after a resume
        row |= {"path": str(cache.path), "complete": True, "examples": cache.n, "tokens": int(cache.meta["tokens"]),
                "tokens_per_s": cache.meta["tokens"] / built if secs and part.count == 1 and built else None,
                "at_max_length": int((cache.lengths >= bb.max_length).sum())}
        log(f"{split}: {cache.n} examples, {row['tokens']:,} tokens → {cache.path}"
            + (f" ({secs:.1f}s now; the build: {built:.1f}s, {row['tokens_per_s']:,.0f} tok/s)"
               if row["tokens_per_s"] and built > secs * 1.01 + 0.05 else
               f" ({secs:.1f}s, {row['tokens_per_s']:,.0f} tok/s)" if row["tokens_per_s"] else
               f" (this part: {secs:.1f}s)" if secs else " (cached)")
            + (f"; {row['at_max_length']:,} reached --max-length {bb.max_length} (cut there, or exactly that long)"
               if row["at_max_length"] else ""))
        out.append(row)
    return out


@in_python_terms()
def explain(model_dir: Path | M.Classifier, texts: Sequence[Text], top: int = 5, device: str | None = None,
            precision: str | None = None, log: Callable[[str], None] = _stderr, occlusion: bool = False,
            top_classes: int | None = None) -> list[dict]:
    """Per text: the prediction and the head's explanation of it (what it is depends on the method:
    see each head's `explain`). Each row: text, label, scores (the per-label probabilities, as predict
    gives them), explanation (JSON) and lines (for people).

    occlusion: also cut each word out of the text in turn and say how much the predicted label's
    probability drops without it (frozentune.occlusion; one more pass per word), under
    explanation["occlusion"]. Any classifier explains so, the methods without an explanation of their
    own too. top_classes: scores keep the K likeliest classes, likeliest first (None: every class)."""
    import torch

    from .head import explains
    from .registry import get_method, list_methods

    texts, log = given_texts(texts), as_log(log)
    if isinstance(top, bool) or not isinstance(top, numbers.Integral) or top < 1:
        raise DataError(f"top={top!r}: give a whole number of at least 1 (how many tokens or spans to show)")
    top, occlusion = int(top), as_switch(occlusion, "occlusion")  # numpy's ints too
    top_classes = as_top_classes(top_classes)
    model = _load(model_dir, device, precision, log)
    own = explains(model.head)
    if not own and not occlusion:
        from .generation.run import model_commands

        saved = getattr(model, "saved_config", {"method": model.method})
        able = [m for m in list_methods("classification") if explains(get_method(m).head_cls)]
        raise MethodError(f"{model_dir if not isinstance(model_dir, M.Classifier) else 'this model'}: method "
                          f"{model.method!r} returns no explanation of its own (explain works for: {', '.join(able)}; "
                          f"--occlusion / occlusion=True explains any classifier by cutting out each word in turn); "
                          f"this model supports {', '.join(model_commands(saved))}" + _fallback_note(model_dir))
    pairs = check_inputs(model, texts)
    bb = model.backbone_ref
    tokens, views = bb.tokenize_with_views(texts)
    _with_text(bb, texts, tokens)  # an explanation would rank [CLS] and [SEP]
    src = M.LiveSource(tokens, bb.pad_id(), separator_ids(bb.tok) if pairs else None)
    cut = cut_rows(tokens.cut, bb.max_length, pairs, log)  # the explanation covers the part that was read
    out = []
    model.eval()
    device = next(model.parameters()).device
    for i, text in enumerate(texts):
        with torch.no_grad():
            o = model(src.batch(np.array([i])).to(device))
        ex = model.head.explain(o, views[i], model.labels, top) if own else None
        probs = torch.softmax(o.logits[0].float(), -1).tolist()  # as predict gives them: the prediction explained
        out.append({**text_row(text), **labelled(model.labels, probs),
                    "explanation": ex.data if ex else {}, "lines": ex.lines if ex else [],
                    **({"truncated": True} if cut[i] else {})})
    if occlusion:
        _add_occlusion(model, texts, views, out, top, pairs)
    return [likeliest(row, top_classes) for row in out]  # after occlusion, which reads the label's probability


def _add_occlusion(model: M.Classifier, texts: list[Text], views: list, rows: list[dict], top: int, pairs: bool) -> None:
    """explain's rows gain explanation["occlusion"] and its lines (frozentune.occlusion)."""
    from .occlusion import occlude, with_occlusion

    labels = list(model.labels)
    predicted = [labels.index(r["label"]) for r in rows]
    found = occlude(texts, views, predicted, [r["scores"][r["label"]] for r in rows], labels, top,
                    lambda cut: _probabilities(model, cut, pairs))
    for row, ex in zip(rows, found):
        row["explanation"], row["lines"] = with_occlusion(row["explanation"], row["lines"], ex)


def _probabilities(model: M.Classifier, texts: list[Text], pairs: bool) -> np.ndarray:
    """(N, C) probabilities of a loaded model for `texts` (live pass, PREDICT_CHUNK at a time)."""
    bb = model.backbone_ref
    return np.concatenate([_scored(model, bb.tokenize(texts[first:first + PREDICT_CHUNK]), pairs)
                           for first in range(0, len(texts), PREDICT_CHUNK)])


def _scored(model: M.Classifier, tokens, pairs: bool) -> np.ndarray:
    """(N, C) probabilities of tokenised texts (live pass)."""
    bb = model.backbone_ref
    src = M.LiveSource(tokens, bb.pad_id(), separator_ids(bb.tok) if pairs else None)
    return softmax_rows(predict_logits(model, src))


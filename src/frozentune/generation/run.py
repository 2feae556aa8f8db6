"""Source → target generation (E2E, WebNLG, any pairs file) on a frozen LM, causal or encoder-decoder
(seq2seq/): the pairs a run trains on, the reference method (fine-tuning all or the top k layers of
the LM), the shared training and decoding path, and the metrics (sacrebleu BLEU over all references
and chrF; ROUGE-1/2/L from rouge-score).

Both methods go through the same code: the loss is prefix.prefix_lm_loss (fine-tuning uses a
zero-length prefix, which the tests hold equal to the plain LM), decoding is prefix.generate, and
training is train.fit_loop with early stopping on the validation loss. So a comparison between
prefix-tuning and fine-tuning differs only in what is trained.

Legend: B batch, T tokens, N layers, P prefix positions.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..pyterms import in_python_terms
from ..backbone import ALIASES, LM_ALIASES, as_saved, freeze, trainable_names, weights_hash
from ..model import CONFIG, WEIGHTS, write_saved
from ..output import holds_output, run_environment
from ..rng import keeps_rng
from ..data import (DataError, GenExample, blank, json_line, merged_note, load_generation, resolve, resolved_files,
                   whole_count)
from .prefix import ARCHITECTURES, KVShape, LMTuner, PrefixBatch, PrefixError, architecture, lm_entry

GEN_LM = "smollm2-135m"  # default language model of generation runs


# ----------------------------------------------------------------------------- data
MAX_VALIDATION = 200  # validation pairs (a seeded sample) for early stopping, unless --max-validation says


@dataclass
class GenSplits:
    """(source, target) pairs to train and validate on; test examples keep all their references."""
    name: str
    train: list[tuple[str, str]]
    validation: list[tuple[str, str]]
    test: list[GenExample]
    notes: list[str] = field(default_factory=list)
    # the examples (each source with all its references) of the pairs train and validation hold (their
    # --max-train / --max-validation samples): what eval --split train / validation scores
    examples: dict[str, list[GenExample]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # {split: absolute path} read (data.resolved_files)


def is_generation_data(data: str, source_field: str | None = None, target_field: str | None = None) -> bool:
    """True when `data` is a source → target dataset: a source or target field is named, or the
    first record of its train file (else of its first file) has `mr` (E2E), `triples` (WebNLG) or
    `source` and `target` (a test file may hold sources alone). Reads a header, a first record or a
    schema, not the whole file."""
    if source_field is not None or target_field is not None:
        return True
    try:
        _, files = resolve(data)
    except DataError:
        return False
    path = files.get("train") or next(iter(files.values()), None)
    fields = _first_fields(path) if path is not None else None
    return fields is not None and ("mr" in fields or "triples" in fields or {"source", "target"} <= fields)


def _first_fields(path: Path) -> set[str] | None:
    """The fields of a data file's first record (of its header, its schema), or None where it cannot
    be read: the data reader then reports why, with its line."""
    from ..data import _read_arrow, is_hf_split_folder, read_records

    suffix = path.suffix.lower()
    try:
        if suffix in (".csv", ".tsv"):
            import csv
            with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
                return set(next(csv.reader(f, delimiter="\t" if suffix == ".tsv" else ","), []))
        if suffix == ".jsonl" or (suffix == ".json" and not _array(path)):
            with open(path, "rb") as f:  # bytes: a bad byte further on is the data reader's to report
                for raw in f:
                    line = raw.decode("utf-8-sig", errors="replace")
                    if line.strip():
                        rec = json.loads(line)
                        return set(rec) if isinstance(rec, dict) else None
            return None
        if suffix == ".parquet":
            import pyarrow.parquet as pq
            return set(pq.read_schema(str(path)).names)
        if suffix == ".arrow":  # the columns, memory-mapped: no row is read
            return set(_read_arrow(path).column_names)
        if is_hf_split_folder(path):
            import datasets
            return set(datasets.load_from_disk(str(path)).column_names)
        if suffix == ".json":  # one JSON array: parsed whole
            records = read_records(path)
            return set(records[0][1]) if records else None
    except (OSError, ValueError, DataError, ImportError):  # json's errors are ValueErrors
        return None
    return None


def _array(path: Path) -> bool:
    from ..data import _starts_with
    return _starts_with(path, b"[")


def _pairs(examples: Sequence[GenExample]) -> list[tuple[str, str]]:
    return [(ex.source, ref) for ex in examples for ref in ex.refs]


def _sample(items: list, n: int | None, rng: np.random.Generator) -> list:
    """A seeded sample of n items in their original order (all of them when n is None or ≥ len)."""
    if n is None or n >= len(items):
        return list(items)
    if n < 1:
        raise DataError(f"asked for {n} examples; give at least 1")
    return [items[i] for i in np.sort(rng.choice(len(items), n, replace=False))]


def load_generation_splits(name: str, seed: int = 0, max_train: int | None = None,
                           max_validation: int | None = MAX_VALIDATION, max_test: int | None = None,
                           validation_fraction: float = 0.1,
                           fields: tuple[str | None, str | None] = (None, None),
                           scoring: str | None = None) -> GenSplits:
    """Train/validation pairs and test examples of a data-to-text dataset. Training pairs come from
    `train`, or, when the dataset has none (E2E as shipped here: dev + test), from `validation`, whose
    sources are then split: a seeded `validation_fraction` of them is held out for validation and the
    rest trains, so no source is in both. `max_train` samples that many (source, reference) pairs
    (seeded); `max_validation` caps the validation pairs; `max_test` takes a seeded sample of test
    examples (in file order). `scoring`: for eval, whether this is the data the model scored trained on
    (is_training_data: "own", "other" or "unknown"; the notes on a test held out say so and name --split
    all); None: this is the training run."""
    _, files = resolve(name)
    rng = np.random.default_rng(seed)
    notes = []
    test = load_generation(name, "test", *fields) if "test" in files else None
    held_out = "validation" if "validation" in files else "train"
    if "train" in files and "validation" in files:
        train_ex = load_generation(name, "train", *fields)
        val_ex = load_generation(name, "validation", *fields)
        notes += [n for n in (merged_note(train_ex, files["train"].name), merged_note(val_ex, files["validation"].name)) if n]
    elif held_out in files:  # one file to train on: hold out whole sources of it for validation
        pool = load_generation(name, held_out, *fields)
        notes += [n for n in (merged_note(pool, files[held_out].name),) if n]
        if len(pool) < 2:
            raise DataError(f"{files[held_out]}: {len(pool)} example; give at least 2 (one is held out to validate)")
        order = rng.permutation(len(pool))
        n_val = max(1, int(round(validation_fraction * len(pool))))
        val_ex = [pool[i] for i in np.sort(order[:n_val])]
        train_ex = [pool[i] for i in np.sort(order[n_val:])]
        if scoring not in ("other", "unknown"):  # of other data, the model trained on none of these sources
            notes.append(f"no {'train' if held_out == 'validation' else 'validation'} split: training pairs come from "
                         f"the {files[held_out].name} file's {len(train_ex)} sources; {len(val_ex)} other sources "
                         f"({validation_fraction:.0%}, seed {seed}) are held out for validation")
    else:
        raise DataError(f"{name}: needs a train or validation file to train on (has: {', '.join(files)}).")
    if test is not None and (note := merged_note(test, files["test"].name)):
        notes.append(note)
    own_test = test is not None
    if test is None:
        test = val_ex
        every = (f"--split all scores every source of {files[held_out].name}" if Path(name).expanduser().is_file()
                 else "")
        if scoring in ("other", "unknown"):  # not said to be held out of a training it may not have been
            notes.append(f"no test split: the scores are on {len(val_ex)} of the {len(val_ex) + len(train_ex)} sources "
                         f"of {files[held_out].name} ({validation_fraction:.0%}, seed {seed}: those a run training on it "
                         f"holds out for validation), not on all of them"
                         + ("; this model was trained on other data" if scoring == "other" else "")
                         + (f": {every}" if every else ""))
        else:
            notes.append("no test split: the scores are on the held-out validation sources (used for early stopping "
                         "only, never trained on)" + (f"; {every}, the trained ones too" if scoring and every else ""))
    train = _sample(_pairs(train_ex), max_train, rng)
    validation = _sample(_pairs(val_ex), max_validation, rng)
    if max_test is not None:
        whole = len(test)
        test = _sample(test, max_test, rng)
        notes.append(f"test: a seeded sample of {len(test)} examples" if len(test) < whole else
                     f"test: all {whole} examples (--max-test {max_test} is not fewer)")
    if own_test:  # a carve keeps them apart; a user's own test file may not. Counted on the samples: the
        trained = {src for src, _ in train}  # pairs trained on and the sources scored, not the whole files
        if shared := sum(ex.source in trained for ex in test):
            notes.append(f"{files['test'].name}: {shared} of the {len(test)} test sources scored are also sources of "
                         f"training pairs (their targets may differ): those scores are of sources the model was "
                         f"trained on")
    return GenSplits(name, train, validation, test, notes, {"train": _holding(train_ex, train),
                                                            "validation": _holding(val_ex, validation)},
                     resolved_files(files))


def _holding(examples: Sequence[GenExample], pairs: Sequence[tuple[str, str]]) -> list[GenExample]:
    """The examples (in order, each with all its references) whose source is in `pairs`: a --max-train sample
    as eval --split train scores it (it scored every source of the file)."""
    sources = {src for src, _ in pairs}
    return [ex for ex in examples if ex.source in sources]


# ----------------------------------------------------------------------------- fine-tuning reference
class LMFinetuner(LMTuner):
    """The LM itself trained (all of it, or its top k layers), through the same loss and decoding as
    prefix-tuning (a zero-length prefix). The LM is a submodule: parameters() is what is trained."""

    def __init__(self, cfg: Any, lm: nn.Module, tok=None, lm_name: str = ""):
        super().__init__()
        self.base_hash = weights_hash(lm)  # of the pre-trained weights, before any step
        self.cfg, self.lm, self.tok, self.lm_name = cfg, lm, tok, lm_name
        top_layers = self.top_layers = int(getattr(cfg, "top_layers", 0))
        self.shape = KVShape.from_config(lm.config)
        freeze(lm)
        chosen = set(trainable_names(lm, top_layers))
        for n, p in lm.named_parameters():
            p.requires_grad_(n in chosen)

    def prefix_batch(self, rows: int, train: bool) -> PrefixBatch:
        """A zero-length prefix: the plain LM (the tests hold the two equal)."""
        dev = next(self.lm.parameters()).device
        return PrefixBatch.single(torch.zeros(self.shape.tensor_shape(0), device=dev), rows)

    def trainable_state(self) -> dict[str, Tensor]:
        return {f"lm.{n}": p for n, p in self.lm.named_parameters() if p.requires_grad}

    def save(self, folder: Path, extra: dict | None = None) -> None:
        config = {"method": "finetune", "task": "generation", "architecture": architecture(self.lm),
                  "options": dataclasses.asdict(self.cfg),
                  "backbone": lm_entry(self.lm_name, self.lm, trained=True, weights=self.base_hash),
                  **(extra or {})}
        write_saved(folder, {k: v.float() for k, v in self.trainable_state().items()}, config)

    @classmethod
    def load(cls, folder: Path, lm: nn.Module, tok=None, lm_name: str = "") -> "LMFinetuner":
        from ..model import check_config_hash, load_weights

        from ..registry import make_config

        config = json.loads((Path(folder) / CONFIG).read_text())
        tuner = cls(make_config("finetune", config["options"]), lm, tok, lm_name)
        saved = config["backbone"].get("weights_hash")
        if saved and tuner.base_hash != saved:
            raise PrefixError(f"{folder}: was fine-tuned from other base weights than "
                              f"{config['backbone'].get('name')!r} has now; load the same model files")
        check_config_hash(folder, config["backbone"], lm, "language model")
        state = {k.removeprefix("lm."): v for k, v in load_weights(folder, config).items()}
        missing = set(trainable_names(lm, tuner.top_layers)) - set(state)
        if missing:
            raise PrefixError(f"{folder / WEIGHTS}: lacks {len(missing)} trained tensors (e.g. {sorted(missing)[0]})")
        lm.load_state_dict(state, strict=False)
        return tuner


class ByArchitecture:
    """A generation method's generator (MethodSpec.generator): the causal-LM class or the
    encoder-decoder one, picked by the LM it is given, so `--method prefix` (or finetune) is one
    method on both kinds of LM."""

    def __init__(self, causal: type, seq2seq: type):
        self.causal, self.seq2seq = causal, seq2seq
        self.__doc__ = causal.__doc__

    def pick(self, lm: nn.Module) -> type:
        return self.seq2seq if architecture(lm) == "encoder-decoder" else self.causal

    def __call__(self, cfg: Any, lm: nn.Module, tok=None, lm_name: str = ""):
        return self.pick(lm)(cfg, lm, tok, lm_name)

    def load(self, folder: Path, lm: nn.Module, tok=None, lm_name: str = ""):
        config = json.loads((Path(folder) / CONFIG).read_text())
        saved, have = config.get("architecture", "causal"), architecture(lm)
        if saved != have:
            raise PrefixError(f"{folder}: was trained on {ARCHITECTURES.get(saved, saved)} "
                              f"({config.get('backbone', {}).get('name') or 'not recorded'}) and cannot be loaded on "
                              f"{ARCHITECTURES[have]} ({type(lm).__name__}); load the model it was trained on")
        return self.pick(lm).load(folder, lm, tok, lm_name)


# ----------------------------------------------------------------------------- training and decoding
def encode_pairs(tuner: LMTuner, pairs: Sequence[tuple[str, str]]) -> tuple[list[list[int]], list[list[int]]]:
    return tuner.encode_sources([s for s, _ in pairs]), tuner.encode_targets([t for _, t in pairs])


@torch.no_grad()
def mean_loss(tuner: nn.Module, sources: list[list[int]], targets: list[list[int]], batch_size: int = 32) -> float:
    """Token-weighted mean loss over the target tokens of all pairs."""
    total, count = 0.0, 0
    for i in range(0, len(sources), batch_size):
        s, t = sources[i:i + batch_size], targets[i:i + batch_size]
        n = sum(len(y) for y in t)
        total += float(tuner.loss(s, t)) * n
        count += n
    return total / max(count, 1)


def fit_generation(tuner: nn.Module, tok, splits: GenSplits, cfg, log: Callable[[str], None] = print):
    """train.fit_loop on the target-token loss; early stopping on the validation loss. The schedule
    (train.plan_steps) is said in one line before training."""
    from ..train import fit_loop, plan_steps

    src, tgt = encode_pairs(tuner, splits.train)
    vsrc, vtgt = encode_pairs(tuner, splits.validation)
    check_pairs_room(tuner, "training", src, tgt)  # before any step: the pairs just encoded, not encoded again
    check_pairs_room(tuner, "validation", vsrc, vtgt)
    lengths = np.array([len(a) + len(b) for a, b in zip(src, tgt)])

    def batch_loss(idx: np.ndarray) -> Tensor:
        return tuner.loss([src[i] for i in idx], [tgt[i] for i in idx])

    def validate() -> dict[str, float]:
        return {"loss": mean_loss(tuner, vsrc, vtgt, cfg.eval_batch_size)}

    plan = plan_steps(len(lengths), cfg)
    log(f"schedule: {plan.why}; early stopping on the loss of {len(splits.validation)} validation pairs "
        f"(--patience {cfg.patience})")
    return fit_loop(tuner, lengths, batch_loss, validate, lambda m: -m["loss"], cfg, log, plan)


def decode(tuner: LMTuner, tok, sources: Sequence[str], num_beams: int = 1, max_new_tokens: int = 64,
           batch_size: int = 32, log: Callable[[str], None] | None = None,
           ids: Sequence[Sequence[int]] | None = None) -> list[str]:
    """Generated text for each source, batched by source length (outputs in input order). `log`:
    where a decode longer than train.PROGRESS_EVERY_S says how far it is, that often. `ids`: the
    sources already encoded (tuner.encode_sources) and checked against the LM's room."""
    from .. import train

    tuner.eval()
    if ids is None:
        ids = tuner.encode_sources(sources)
        check_room(tuner, ids, max_new_tokens)
    order = np.argsort([len(x) for x in ids], kind="stable")
    out: list[str] = [""] * len(ids)
    step = max(1, batch_size // max(num_beams, 1))
    t0 = said = time.perf_counter()
    for s in range(0, len(order), step):
        chunk = order[s:s + step]
        rows = tuner.generate([ids[i] for i in chunk], max_new_tokens=max_new_tokens, num_beams=num_beams)
        for i, row in zip(chunk, rows):
            out[i] = tok.decode(row, skip_special_tokens=True).strip()
        done = s + len(chunk)
        if log is not None and done < len(order) and (now := time.perf_counter()) - said >= train.PROGRESS_EVERY_S:
            said, each = now, (now - t0) / done
            log(f"decoding: {done}/{len(order)} sources ({num_beams} beam{'s' if num_beams > 1 else ''}), "
                f"{each:.2f}s a source; the longest come last, so more than {each * (len(order) - done) / 60:.1f} min left")
    return out


def check_room(tuner: LMTuner, ids: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """A PrefixError before decoding where the LM cannot hold a source, its prefix and max_new_tokens
    (a causal LM past its positions would fail or run for minutes first): the check the server makes.
    An encoder-decoder's decoder must hold max_new_tokens (its sources are cut to its encoder)."""
    lm = getattr(tuner, "lm", None)
    context = _context(lm)
    if context is None:
        return  # no stated limit (a model built here in a test): nothing to check against
    from .seq2seq.tuner import is_seq2seq

    if is_seq2seq(lm):  # its sources are cut to its encoder; the new tokens fill its decoder
        if max_new_tokens > context:
            raise PrefixError(f"--max-new-tokens {max_new_tokens}: this model's decoder takes {context} positions; "
                              f"ask for fewer")
        return
    prefix = int(tuner.prefix_batch(1, False).mask.shape[1])  # 0 for a fine-tuned LM
    if prefix >= context:
        raise PrefixError(f"--prefix-length {prefix}: this LM's context holds {context} positions, so a prefix of "
                          f"{prefix} leaves none for a source and its output; give a shorter prefix")
    room = context - max_new_tokens - prefix
    if room < 1:
        raise PrefixError(f"--max-new-tokens {max_new_tokens}: this LM's context of {context} positions"
                          + (f", less its prefix of {prefix}," if prefix else "") + " leaves no room for a source; ask for fewer")
    longest = max(range(len(ids)), key=lambda i: len(ids[i]), default=None)
    if longest is not None and len(ids[longest]) > room:
        too_long = sum(len(x) > room for x in ids)
        raise PrefixError(f"source {longest + 1} is {len(ids[longest])} tokens ({too_long} source"
                          f"{'s' if too_long > 1 else ''} too long): with --max-new-tokens {max_new_tokens}"
                          + (f" and the prefix of {prefix}" if prefix else "") + f" this LM's context of {context} "
                          f"leaves {room}; shorten the sources or ask for fewer new tokens")


def _context(lm: nn.Module | None) -> int | None:
    """The positions an LM's config says it holds (max_position_embeddings), or None where it states none."""
    context = getattr(getattr(lm, "config", None), "max_position_embeddings", None)
    return context if isinstance(context, int) else None


def check_pairs_room(tuner: LMTuner, part: str, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> None:
    """A PrefixError before training where a causal LM cannot hold a pair (`src`, `tgt`: the
    encoded sources with their separator, the targets with their end token) after its prefix. Past
    its position table an LM with learnt positions fails mid-epoch (an index error), and one with
    rotary positions trains on positions it never saw, then refuses those sources at eval. An
    encoder-decoder cuts its sources and checks its targets (targets_too_long). `part`: training,
    validation."""
    from .seq2seq.tuner import is_seq2seq

    lm = getattr(tuner, "lm", None)
    context = _context(lm)
    if context is None or is_seq2seq(lm) or not src:
        return
    prefix = int(tuner.prefix_batch(1, False).mask.shape[1])
    sizes = [prefix + len(a) + len(b) for a, b in zip(src, tgt)]
    long = [i for i, n in enumerate(sizes) if n > context]
    if long:
        i = max(long, key=lambda j: sizes[j])
        raise PrefixError(f"{len(long)} of the {len(src)} {part} pairs do not fit this LM's context of {context} "
                          f"positions (the longest, pair {i + 1}: {len(src[i])} source and {len(tgt[i])} target "
                          f"tokens" + (f" after a prefix of {prefix}" if prefix else "") + "); shorten or drop them, "
                          "or use an LM with a longer context (an encoder-decoder cuts its sources)")


def scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """Corpus BLEU over all references and chrF (sacrebleu, default 13a tokenisation, cased), and
    mean ROUGE-1 / ROUGE-2 / ROUGE-L F1 against the best-matching reference (rouge-score, stemmed);
    all in percent."""
    import sacrebleu
    from rouge_score import rouge_scorer

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} outputs but {len(references)} reference lists")
    if not hypotheses:
        raise ValueError("no outputs to score")
    width = max(len(r) for r in references)
    streams = [[r[k] if k < len(r) else None for r in references] for k in range(width)]  # None: fewer refs
    kinds = {"rouge_1": "rouge1", "rouge_2": "rouge2", "rouge_l": "rougeL"}
    scorer = rouge_scorer.RougeScorer(list(kinds.values()), use_stemmer=True)
    rouge = [scorer.score_multi(list(r), h) for h, r in zip(hypotheses, references)]
    return {"bleu": sacrebleu.corpus_bleu(list(hypotheses), streams).score,
            "chrf": sacrebleu.corpus_chrf(list(hypotheses), streams).score,
            **{ours: 100.0 * float(np.mean([x[theirs].fmeasure for x in rouge])) for ours, theirs in kinds.items()}}


def grouped_scores(hypotheses: Sequence[str], examples: Sequence[GenExample]) -> dict[str, dict[str, float]]:
    """Scores over all examples, and over the `seen` / `unseen` ones when they are marked (WebNLG)."""
    refs = [ex.refs for ex in examples]
    out = {"all": {**scores(hypotheses, refs), "n": len(examples)}}
    marks = [ex.meta.get("seen") for ex in examples]
    for name, want in (("seen", True), ("unseen", False)):
        keep = [i for i, m in enumerate(marks) if m is want]
        if keep:
            out[name] = {**scores([hypotheses[i] for i in keep], [refs[i] for i in keep]), "n": len(keep)}
    return out


# ----------------------------------------------------------------------------- building and loading
def build_tuner(method: str, options: dict[str, Any] | None, lm: nn.Module, tok, lm_name: str) -> tuple[nn.Module, Any]:
    """(tuner, config) for a registered generation method (MethodSpec.generator)."""
    from ..registry import MethodError, get_method, list_methods, make_config, refuse_unused

    spec = get_method(method)
    if not spec.generates:
        raise MethodError(f"method {method!r} does not generate text; for generation data (E2E, WebNLG, source → target pairs) "
                          f"use one of: "
                          f"{', '.join(list_methods('generation'))}")
    cfg = make_config(method, options)
    refuse_unused(cfg, method, generating=True)
    return spec.generator(cfg, lm, tok, lm_name), cfg


def load_tuner(folder: Path, device: str | None = None, precision: str | None = None,
               log: Callable[[str], None] | None = None) -> tuple[nn.Module, Any, dict]:
    """(tuner, tokenizer, config.json) of a saved generation model, ready to decode: the LM it names
    loaded, on `device` (auto: a GPU when there is one), decoding in `precision` (default fp32;
    generation/precision.py); what was chosen and why goes to `log`."""
    from . import precision as P
    from ..api import as_path

    if (path := as_path(folder, "model_dir")) is None:  # (a number or None failed in pathlib, naming no argument)
        raise PrefixError("model_dir=None: give the folder of a saved generation model (a str or pathlib.Path)")
    dev, prec, lines = P.decode_runtime(device, precision)  # a bad --device / --precision: refused before the LM loads
    tuner, tok, config = _load_tuner(path)
    for line in lines if log is not None else ():
        log(line)
    P.ready_to_decode(tuner, dev, prec)
    return tuner, tok, config


def _load_tuner(folder: Path) -> tuple[nn.Module, Any, dict]:
    from ..backbone import load_generation_lm
    from ..model import check_unchanged, known_method, load_named, read_saved

    config = read_saved(folder, "the --output folder of a generation training run")
    if config.get("task") != "generation":
        raise PrefixError(f"{folder}: holds a {config.get('method')!r} classifier, not a text generator; "
                          f"it supports {', '.join(model_commands(config))}")
    spec = known_method(config, folder)
    check_generation_config(config, folder / CONFIG, spec)
    check_safetensors(folder / WEIGHTS)  # before the LM is loaded: a damaged or foreign file is refused at once
    name = config["backbone"]["name"]
    lm, tok = load_named(folder, name, load_generation_lm, "language model")
    tuner = spec.generator.load(folder, lm, tok, name)  # its weights: the bytes its own read of config.json names
    check_unchanged(folder, config)  # and that config.json is still the one whose decoding options are returned
    return tuner, tok, config


def check_generation_config(config: dict, path: Path, spec) -> None:
    """A ModelLoadError naming the first entry of a generation model's config.json (read from `path`) that cannot be
    what frozentune wrote there: a hand edit that otherwise ended in a KeyError, a TypeError or a string compared
    with a number, in loading or in decoding (bench/fuzz.py, part model)."""
    from ..model import ModelLoadError, edited_entry
    from ..registry import MethodError, make_config
    from .seq2seq.attention import KINDS

    def bad(where: str, what: str, value: object) -> ModelLoadError:
        return edited_entry(path, where, what, value)

    b = config.get("backbone")
    if not isinstance(b, dict):
        raise bad('"backbone"', "an object describing the language model", b)
    if not isinstance(b.get("name"), str):  # ("" where a tuner built from an LM object in Python was saved)
        raise bad('"backbone"."name"', "a model id or folder", b.get("name"))
    for key in ("weights_hash", "config_hash"):
        if not (b.get(key) is None or isinstance(b[key], str)):
            raise bad(f'"backbone"."{key}"', "a hash of the language model (text)", b[key])
    if not isinstance(b.get("decoding_ids", {}), dict):
        raise bad('"backbone"."decoding_ids"', "an object of token ids", b["decoding_ids"])
    arch = config.get("architecture", "causal")
    if not (isinstance(arch, str) and arch in ARCHITECTURES):
        raise bad('"architecture"', " or ".join(map(json.dumps, ARCHITECTURES)), arch)
    options = config.get("options")
    if not isinstance(options, dict):
        raise bad('"options"', "an object of the method's options", options)
    known = {f.name for f in dataclasses.fields(spec.config_cls)}  # (options of older versions are left out)
    try:
        make_config(spec.name, {k: v for k, v in options.items() if k in known})
    except MethodError as e:
        raise ModelLoadError(f"{path}: \"options\": {e}; the file was edited or damaged: restore it, or train the "
                             f"model again") from None
    if spec.name == "prefix":
        shapes = config.get("prefix")
        kinds = (shapes if isinstance(shapes, dict) and set(shapes) == set(KINDS) else {"": None}
                 ) if arch == "encoder-decoder" else {"": shapes}
        for s in kinds.values():
            if not (isinstance(s, dict) and all(type(s.get(k)) is int and s[k] >= 0
                                                for k in ("layers", "kv_heads", "head_dim", "length"))):
                raise bad('"prefix"', "the prefix's shape (whole numbers layers, kv_heads, head_dim, length"
                          + (f", for each of {', '.join(KINDS)}" if arch == "encoder-decoder" else "") + ")", shapes)
    d = config.get("decoding", {})
    names = {f.name for f in dataclasses.fields(DecodeOptions)}
    if not (isinstance(d, dict) and set(d) <= names and all(type(v) is int and v >= 1 for v in d.values())):
        raise bad('"decoding"', f"an object of {', '.join(sorted(names))} (whole numbers, 1 or more)", d)
    fields = config.get("fields") or {}
    if not (isinstance(fields, dict) and all(v is None or isinstance(v, str) and v for v in fields.values())):
        raise bad('"fields"', "an object of the source and target field names", fields)
    splits = config.get("splits", {})
    if not (isinstance(splits, dict) and all(splits.get(k) is None or type(splits[k]) is int and splits[k] >= 0
                                             for k in ("max_train", "max_validation"))
            and isinstance(splits.get("files") or {}, dict)):
        raise bad('"splits"', "an object of the sample sizes and files the run read", splits)
    train = config.get("train", {})
    if not (isinstance(train, dict) and type(seed := train.get("seed", 0)) is int and 0 <= seed < 2 ** 32):
        raise bad('"train"', "an object of the training options (a whole-number seed)", train)
    if not (config.get("data") is None or isinstance(config["data"], str)):
        raise bad('"data"', "the name or path of the data it was trained on", config["data"])
    if not (config.get("imported") is None or isinstance(config["imported"], dict)):
        raise bad('"imported"', "an object saying where an imported adapter came from", config["imported"])


def check_safetensors(path: Path) -> None:
    """PrefixError unless `path` is a readable safetensors file (its header is parsed, no tensor is
    read, no code can run)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        raise PrefixError(f"{path}: not a readable safetensors file ({' '.join(str(e).split())}); "
                          f"the folder is damaged: train it again") from None


def model_commands(config: dict) -> list[str]:
    """The commands a saved model (its config.json) supports."""
    from ..head import explains
    from ..registry import MethodError, get_method

    if config.get("task") == "generation":
        return ["generate", "eval"]
    cmds = ["predict", "eval"]
    try:
        spec = get_method(config.get("method", ""))
    except MethodError:
        return cmds
    if spec.head_cls is not None and explains(spec.head_cls):
        cmds.append("explain")
    if spec.name == "space":
        cmds.append("plot-concepts")
    return cmds


# ----------------------------------------------------------------------------- runs
@dataclass
class DecodeOptions:
    num_beams: int = 5           # Li & Liang decode table-to-text with beam 5; 1: greedy
    max_new_tokens: int = 64
    batch_size: int = 32         # prompts × beams per generate call

    def validate(self) -> "DecodeOptions":
        from ..fields import wrong_value

        if (why := wrong_value(self, flag=True)) is not None:
            raise DataError(why)
        for name in ("num_beams", "max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise DataError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        return self


def as_decoding(decoding: object) -> DecodeOptions:
    """A `decoding` argument: DecodeOptions, checked; anything else (a dict of them) is a MethodError saying
    what to give (a dict failed with an AttributeError)."""
    from ..registry import MethodError

    if not isinstance(decoding, DecodeOptions):
        raise MethodError(f"decoding: a {type(decoding).__name__} ({str(decoding)[:40]}); give DecodeOptions(...)"
                          + (f", e.g. DecodeOptions(**{decoding!r})" if isinstance(decoding, dict) else ""))
    return decoding.validate()


def as_fields(fields: object) -> tuple[str | None, str | None]:
    """A `fields` argument: (source field, target field), each a field's name or None (the default); a
    bare string was unpacked into its characters' fields."""
    if isinstance(fields, str) or not isinstance(fields, (tuple, list)) or len(fields) != 2:
        raise DataError(f"fields={fields!r}: give (source field, target field), e.g. ('article', 'summary'); None "
                        f"for either keeps its default (source, target)")
    for flag, value in zip(("--source-field", "--target-field"), fields):
        if value is not None and (not isinstance(value, str) or not value):
            raise DataError(f"{flag} {value!r}: give the name of a field of the records, as text (or None)")
    return fields[0], fields[1]


@in_python_terms(train_cfg=True, options=True)
@holds_output
@keeps_rng  # it seeds torch (the prefix's initial values, dropout); the caller's random state is put back after
def train_generation(method: str, data: str, lm_name: str | None = None, options: dict[str, Any] | None = None,
                     train_cfg: dict[str, Any] | None = None, output: Path | None = None,
                     max_train: int | None = None, max_validation: int | None = MAX_VALIDATION, max_test: int | None = None,
                     decoding: DecodeOptions = DecodeOptions(), log: Callable[[str], None] = print,
                     overwrite: bool = False, trust_remote_code: bool = False,
                     fields: tuple[str | None, str | None] = (None, None)) -> dict:
    """Train a generation method (prefix or finetune) on a data-to-text dataset, decode its test
    sources, score them; save to `output` (model, result.json, generations.jsonl)."""
    from ..api import as_log, as_path, as_switch, peak_rss_mb, reset_peak_rss, train_config
    from ..backbone import load_generation_lm
    from ..distributed import read_launch
    from ..export.card import write_card_from_files
    from ..output import check_output, staged_output
    from ..registry import MethodError, get_method

    peak_of = reset_peak_rss()
    log, output = as_log(log), as_path(output, "output")
    as_switch(overwrite, "overwrite")
    decoding, fields = as_decoding(decoding), as_fields(fields)
    max_train, max_validation, max_test = (whole_count(flag, v) for flag, v in (
        ("--max-train", max_train), ("--max-validation", max_validation), ("--max-test", max_test)))
    if isinstance(data, os.PathLike):  # saved in result.json and the card as text (a Path failed at the save)
        data = os.fspath(data)
    if (launch := read_launch(os.environ)).world_size > 1:
        raise MethodError(f"training on {data} (generation) runs in one process only, but this is one of "
                          f"{launch.world_size} ({launch.how}); run it without torchrun / accelerate launch")
    cfg_train = train_config(get_method(method).generation_defaults, train_cfg)
    if cfg_train.steps and "min_steps" in (train_cfg or {}):  # the floor is for --epochs; said as classification says it
        log(f"schedule: --min-steps not used: --steps {cfg_train.steps} sets the number of steps")
    if output is not None:
        check_output(Path(output), overwrite)  # before any work
    splits = load_generation_splits(data, cfg_train.seed, max_train, max_validation, max_test, fields=fields)
    for note in splits.notes:
        log(f"data: {note}")
    lm, tok = load_generation_lm(lm_name or GEN_LM, trust_remote_code=trust_remote_code)
    lm_name = as_saved(lm_name or GEN_LM, {**LM_ALIASES, **ALIASES})
    torch.manual_seed(cfg_train.seed)
    tuner, cfg = build_tuner(method, options, lm, tok, lm_name)
    if getattr(cfg, "prefix_length", None) == 0:  # trained and saved, it changed nothing: the LM as it is
        raise PrefixError(f"--prefix-length 0: a prefix of no positions leaves the LM as it is, so there is nothing to "
                          f"train; give 1 or more (default {type(cfg)().prefix_length})")
    device = torch.device(cfg_train.device)
    lm.to(device)
    tuner.to(device)
    for part, texts in (("training", [src for src, _ in splits.train]), ("test", [ex.source for ex in splits.test])):
        if (note := cut_note(tuner, texts, f"{part} ", lm_name)) is not None:  # an encoder takes its position table
            splits.notes.append(note)
            log(f"data: {note}")
    if hasattr(tuner, "targets_too_long"):  # an encoder-decoder's decoder holds a target whole: refused now, not mid-epoch
        targets = [t for _, t in splits.train + splits.validation]
        long, limit = tuner.targets_too_long(targets)
        if long:
            raise PrefixError(f"{long} of the {len(targets)} training and validation targets are longer than the {limit} "
                              f"tokens {lm_name}'s decoder takes; shorten them, or use a model with a longer decoder")
    # the test sources must fit with the new tokens: found now, not after training (the check decode makes)
    check_room(tuner, tuner.encode_sources([ex.source for ex in splits.test]), decoding.max_new_tokens)
    lm_params = sum(p.numel() for p in lm.parameters())
    n_trainable = tuner.num_trainable()
    log(f"{method} on {splits.name} with {lm_name}: {len(splits.train)} train pairs / {len(splits.validation)} "
        f"validation pairs / {len(splits.test)} test sources; {n_trainable:,} trainable parameters "
        f"({100 * n_trainable / lm_params:.3f}% of the LM's {lm_params:,})")
    fitted = fit_generation(tuner, tok, splits, cfg_train, log)
    saved_params = sum(v.numel() for v in tuner.trainable_state().values())
    t0 = time.perf_counter()
    hyps = decode(tuner, tok, [ex.source for ex in splits.test], decoding.num_beams, decoding.max_new_tokens,
                  decoding.batch_size, log)
    decode_seconds = time.perf_counter() - t0
    metrics = grouped_scores(hyps, splits.test)
    result = {
        "method": method, "data": splits.name, "task": "generation",
        "config": {"method_options": dataclasses.asdict(cfg), "train": dataclasses.asdict(cfg_train),
                   "backbone": {"name": lm_name}, "decoding": dataclasses.asdict(decoding),
                   "max_train": max_train, "max_validation": max_validation, "max_test": max_test,
                   "data_notes": splits.notes},
        "metrics": metrics["all"], "metrics_by_group": metrics,
        "validation": {"loss": min(h["val_loss"] for h in fitted.history)},
        "trainable_params": n_trainable, "saved_params": saved_params, "backbone_params": lm_params,
        "train_seconds": fitted.train_seconds, "decode_seconds": decode_seconds,
        "peak_rss_mb": peak_rss_mb(), "peak_rss_of": peak_of, "best_epoch": fitted.best_epoch, "history": fitted.history,
        "sizes": {"train": len(splits.train), "validation": len(splits.validation), "test": len(splits.test)},
        "environment": run_environment(),
    }
    m = metrics["all"]
    log(f"test BLEU {m['bleu']:.2f}  chrF {m['chrf']:.2f}  ROUGE-1/2/L {m['rouge_1']:.2f}/{m['rouge_2']:.2f}/"
        f"{m['rouge_l']:.2f}  "
        + "".join(f" [{g}: BLEU {v['bleu']:.2f}]" for g, v in metrics.items() if g != "all")
        + f"  train {fitted.train_seconds:.0f}s  decode {decode_seconds:.0f}s  peak RSS {result['peak_rss_mb']:.0f} MB")
    if output is not None:
        with staged_output(Path(output), overwrite) as folder:
            tuner.save(folder, extra={"task": "generation", "train": dataclasses.asdict(cfg_train), "data": splits.name,
                                      "decoding": dataclasses.asdict(decoding),
                                      "splits": {"max_train": max_train, "max_validation": max_validation,
                                                 "files": splits.files},
                                      "fields": {"source": fields[0], "target": fields[1]}})
            (folder / "result.json").write_text(json.dumps(result, indent=2, allow_nan=False))
            write_card_from_files(folder)  # README.md: the folder can go to the Hub as it is
            with open(folder / "generations.jsonl", "w", encoding="utf-8") as f:
                for ex, h in zip(splits.test, hyps):
                    f.write(json_line({"source": ex.source, "output": h, "refs": ex.refs, **ex.meta}) + "\n")
        log(f"saved to {output}")
    return result


@in_python_terms()
def generate_sources(model_dir: Path, sources: Sequence[str], num_beams: int | None = None,
                     max_new_tokens: int | None = None, device: str | None = None, precision: str | None = None,
                     log: Callable[[str], None] | None = None) -> list[str]:
    """A saved generation model's outputs for sources (linearised tables), decoded with the options
    its training run used unless given, on `device` in `precision` (load_tuner)."""
    return list(generate_stream(model_dir, sources, num_beams, max_new_tokens, device, precision, log))


GENERATE_CHUNK = 256  # sources decoded together (longest last within it), their outputs given in input order


@in_python_terms()
def generate_stream(model_dir: Path, sources: Sequence[str], num_beams: int | None = None,
                    max_new_tokens: int | None = None, device: str | None = None, precision: str | None = None,
                    log: Callable[[str], None] | None = None, chunk: int | None = None) -> Iterator[str]:
    """generate_sources' outputs, in input order, GENERATE_CHUNK sources at a time: every source was decoded
    before the first output came out, and Ctrl-C kept none. Every source is measured against the LM's room
    first, so a source too long is refused before any output; `log` also gets the decode's progress."""
    from ..api import whole_chunk

    sources = given_sources(sources)  # checked now, not when the stream is first read
    step = GENERATE_CHUNK if chunk is None else whole_chunk(chunk)
    tuner, tok, config = load_tuner(model_dir, device, precision, log)
    d = decoding(config, num_beams, max_new_tokens)
    say_cut(tuner, sources, log)
    ids = tuner.encode_sources(sources)
    check_room(tuner, ids, d.max_new_tokens)
    return (out for first in range(0, len(sources), step)
            for out in decode(tuner, tok, sources[first:first + step], d.num_beams, d.max_new_tokens, d.batch_size, log,
                              ids=ids[first:first + step]))


def given_sources(sources: object) -> list[str]:
    """The sources of a generate call as a list of strings, held to predict's rules (api.given_texts: a
    list or any iterable, none empty; a bare string is refused, not decoded one character at a time)."""
    from ..api import given_texts
    from ..data import DataError, _describe

    out = given_texts(sources, "sources", pairs=False)
    for i, src in enumerate(out):
        if not isinstance(src, str):
            raise DataError(f"sources[{i}]: {_describe(src)}; give each source as a string (a linearised table or "
                            f"any text)")
    return out


def say_cut(tuner: nn.Module, sources: Sequence[str], log: Callable[[str], None] | None) -> None:
    """An encoder-decoder reads at most its encoder's positions of a source: say how many sources
    lose their ends (train says it of its own splits; generate and eval did not)."""
    if log is not None and (note := cut_note(tuner, sources)) is not None:
        log(f"data: {note}")


def cut_note(tuner: nn.Module, sources: Sequence[str], part: str = "", taker: str = "the encoder") -> str | None:
    """"N of M {part}sources are longer than the L tokens {taker} takes; ...", where a tuner with an encoder
    (sources_cut) cuts some of `sources`; None where it cuts none, or has no encoder."""
    if not hasattr(tuner, "sources_cut"):
        return None
    cut, limit = tuner.sources_cut(sources)
    return (f"{cut} of {len(sources)} {part}sources are longer than the {limit} tokens {taker} takes; their ends are "
            f"cut off") if cut else None


def decoding(config: dict, num_beams: int | None = None, max_new_tokens: int | None = None) -> DecodeOptions:
    """A saved model's decoding options (config.json's `decoding`), with the ones given in their place;
    None keeps the saved one, and a value under 1 is an error (0 is not "the default")."""
    saved = DecodeOptions(**config.get("decoding", {}))
    given = {k: v for k, v in (("num_beams", num_beams), ("max_new_tokens", max_new_tokens)) if v is not None}
    return dataclasses.replace(saved, **given).validate()


def is_generation_model(folder: Path) -> bool:
    """Whether a saved model folder holds a text generator (not a classifier)."""
    config = Path(folder) / CONFIG
    try:
        return config.is_file() and json.loads(config.read_text(encoding="utf-8")).get("task") == "generation"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False  # not a readable config: the classifier loader says what is wrong with it


@in_python_terms()
def evaluate_generation(model_dir: Path, data: str, split: str = "test", max_test: int | None = None,
                        num_beams: int | None = None, max_new_tokens: int | None = None,
                        source_field: str | None = None, target_field: str | None = None,
                        log: Callable[[str], None] | None = None, device: str | None = None,
                        precision: str | None = None) -> dict:
    """BLEU / chrF / ROUGE-L of a saved generation model on a split of a data-to-text dataset.
    `max_test`: a seeded sample; on the test split the one its training run scored when given the
    same number (the same seed and draws), so `eval` repeats the run's figures. `device`, `precision`:
    as load_tuner; the result says the precision."""
    from .precision import precision_of

    max_test = whole_count("--max-test", max_test)  # before the model loads
    source_field, target_field = as_fields((source_field, target_field))
    tuner, tok, config = load_tuner(model_dir, device, precision, log)
    d = decoding(config, num_beams, max_new_tokens)
    saved = config.get("fields") or {}
    fields = (source_field or saved.get("source"), target_field or saved.get("target"))
    if split == "all":  # every source of one file, nothing held out
        if not Path(data).expanduser().is_file():
            raise DataError(f"--split all scores every source of one file; {data} is a dataset folder or name, whose "
                            f"splits are files of their own: choose --split train, validation or test")
        examples = _sample(load_generation(data, "train", *fields), max_test, np.random.default_rng(0))
    elif split in ("test", "train", "validation"):  # drawn as the training run drew them (same seed, same draws)
        sizes = config.get("splits", {})
        splits = load_generation_splits(data, config.get("train", {}).get("seed", 0), sizes.get("max_train"),
                                        sizes.get("max_validation", MAX_VALIDATION), max_test, fields=fields,
                                        scoring=is_training_data(config, data))
        for note in splits.notes if log else ():
            log(f"data: {note}")
        examples = splits.test if split == "test" else _sample(splits.examples[split], max_test, np.random.default_rng(0))
    else:
        raise DataError(f"--split {split!r}: choose train, validation, test or all")
    say_cut(tuner, [ex.source for ex in examples], log)
    hyps = decode(tuner, tok, [ex.source for ex in examples], d.num_beams, d.max_new_tokens, d.batch_size, log)
    metrics = grouped_scores(hyps, examples)
    return {"model": str(model_dir), "data": str(data), "split": split, "n": len(examples), "metrics": metrics["all"],
            "metrics_by_group": metrics, "precision": precision_of(tuner.lm)}


def is_training_data(config: dict, data: str) -> str:
    """"own" where `data` is what a saved generation model (its config.json) was trained on: the files its
    splits.files records, or a dataset of the name it records (moved with $FROZENTUNE_DATA); for a model saved
    before the files were recorded, the files its recorded name reads from here. "other" where it is not;
    "unknown" where that name is not found from here."""
    files = resolved_files(resolve(data)[1])
    named, recorded = config.get("data"), (config.get("splits") or {}).get("files")
    if files == recorded or (named == os.fspath(data) and not Path(named).expanduser().exists()):
        return "own"
    if isinstance(recorded, dict):  # the files it read are known, and they are not these
        return "other"
    if not isinstance(named, str):
        return "unknown"
    try:
        return "own" if resolved_files(resolve(named)[1]) == files else "other"
    except DataError:  # named by a path that is not there from here
        return "unknown"


def read_sources(path: Path, source_field: str | None = None) -> list[str]:
    """Sources from a file: a .jsonl / .json / .csv / .tsv / .parquet / .arrow (or a `save_to_disk` folder) of
    E2E (`mr`), WebNLG (`triples`) or pairs records (`source`, or `source_field`), else one per line. Standard
    input ("-") is one source per line, or JSON Lines records with `source_field` (as predict reads it)."""
    from ..data import STDIN, holds_records, read_lines, read_records, table_source, unencodable

    records = str(path) == "-" and source_field is not None
    path = Path(path)
    if not records and not holds_records(path):  # (generate passes the model's source field where this holds)
        if source_field is not None:
            raise DataError(f"--source-field {source_field}: {path} is read as one source per line, which has no fields; "
                            f"give a .jsonl / .json / .csv / .tsv / .parquet / .arrow file, or leave --source-field out")
        return read_lines(path, "sources")
    field = source_field or "source"
    out = []
    rows = read_records(path)
    path = STDIN if records else path  # as the errors below name it
    for n, rec in rows:
        if field in rec:
            value = rec[field]
            if not isinstance(value, str) or blank(value):
                raise DataError(f"{path}:{n}: the source in {field!r} is {'empty' if isinstance(value, str) else 'not text'}; "
                                f"fix or remove the row")
            if (why := unencodable(value)) is not None:
                raise DataError(f"{path}:{n}: the source in {field!r}: {why}; fix or remove the row")
            out.append(value)
        elif source_field is None and ("mr" in rec or "triples" in rec):
            out.append(table_source(f"{path}:{n}", rec))
        else:
            raise DataError(f"{path}:{n}: a source record needs non-empty text in {field!r}"
                            + (" (or 'mr' / 'triples')" if source_field is None else "")
                            + f"; it has {', '.join(map(str, rec))}. Name the field with --source-field")
    return out

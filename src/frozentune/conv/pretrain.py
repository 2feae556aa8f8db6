"""Masked-language-model pre-training of an encoder, with resumable checkpoints.

The corpus (`imdb` = the IMDB train reviews, another dataset name's train texts, or any text file:
one text per line, or .jsonl/.csv/.tsv with a text field) is tokenised once with the MiniLM
WordPiece tokenizer and cut into chunks of at most max_length tokens ([CLS] … [SEP]). Each step
draws a batch of chunks (seeded by (seed, step)), picks 15% of the real, non-special tokens
(80% → [MASK], 10% → a random token, 10% kept) and minimises cross-entropy at those positions.
AdamW; linear warm-up, then the rate decays as 1/√step, so no total length needs to be known and
a step or wall-clock budget can stop it anywhere.

Output folder:
  latest              name of the newest complete checkpoint (replaced atomically)
  step-NNNNNNN/       model.safetensors (encoder.* and mlm.*), config.json (encoder, run, corpus,
                      step, seconds), optimizer.pt (AdamW state and the torch RNG), loss.jsonl
  loss.jsonl          the loss curve as it runs (one line per step)
  result.json         summary of the last run
A checkpoint is written into a temporary folder and renamed into place, then `latest` is switched
(temp file + rename), so an interrupted run always leaves a complete checkpoint to resume.

Started by `torchrun` or `accelerate launch` (WORLD_SIZE > 1), it runs data-parallel: every rank
builds the same masked global batch for a step, runs a contiguous slice of its sequences, and
back-propagates the sum of its slice's cross-entropies divided by the global batch's number of
predicted positions; the gradients are summed over the ranks (see `distributed`). So each step,
and the loss in loss.jsonl, equal the one-process ones up to float summation order (dropout
aside: its masks are drawn per slice, from a per-rank seed). Rank 0 alone prints and writes the
output folder; the checkpoint keeps every rank's random state, so a resumed run continues as an
uninterrupted one would (with the same number of processes).

Legend: B batch, T tokens, D width, V vocabulary, N positions chosen for prediction.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import distributed
from ..data import DataError
from ..fields import as_flag
from ..output import holds_output, run_environment
from ..pyterms import field_flags, in_python_terms
from ..registry import refuse_unused
from ..rng import keeps_rng
from ..train import adamw, shared_step, silent
from .encoder import TOKENIZER, ConvError, Encoder, EncoderConfig, load_tokenizer, require_at_least

FORMAT = "frozentune-mlm/1"
IGNORE = -100  # label of positions that are not predicted
WEIGHTS, CONFIG, OPTIMIZER, CURVE, LATEST = "model.safetensors", "config.json", "optimizer.pt", "loss.jsonl", "latest"
# run options that may change when a run is resumed (the budget and bookkeeping); the rest may not
RESUMABLE_CHANGES = ("steps", "minutes", "checkpoint_every", "log_every", "device")


@dataclass
class PretrainConfig:
    steps: int = field(default=0, metadata={"help": "stop after this many optimiser steps in all (0: no step limit; give --steps and/or --minutes)"})
    minutes: float = field(default=0.0, metadata={"help": "stop once training has taken this long in all, resumed runs included (0: no time limit)"})
    batch_size: int = field(default=32, metadata={"help": "sequences per step"})
    lr: float = field(default=5e-4, metadata={"help": "peak learning rate (AdamW)"})
    warmup_steps: int = field(default=200, metadata={"help": "steps of linear warm-up; the rate then decays as 1/sqrt(step)"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (matrices only)"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0: off)"})
    mask_prob: float = field(default=0.15, metadata={"help": "fraction of real tokens predicted (80% [MASK], 10% random, 10% kept)"})
    checkpoint_every: int = field(default=200, metadata={"help": "steps between checkpoints (one is also written at the end)"})
    log_every: int = field(default=20, metadata={"help": "steps between printed losses (every step goes to loss.jsonl)"})
    seed: int = field(default=0, metadata={"help": "seed for initialisation, batches and masking"})
    device: str = field(default="auto", metadata={
        "help": "where to train: auto (a GPU when there is one, else the CPU), cpu, cuda, cuda:N or mps"})

    def validate(self) -> None:
        from ..fields import wrong_value

        if (why := wrong_value(self, flag=True)) is not None:  # e.g. steps=1.5 from Python
            raise ConvError(why)
        for name in ("minutes", "lr", "weight_decay", "max_grad_norm", "mask_prob"):
            if not math.isfinite(value := getattr(self, name)):  # NaN passed every comparison: --minutes nan never ended
                raise ConvError(f"{as_flag(name)} {value}: give a finite number")
        if self.lr <= 0:
            raise ConvError(f"--lr {self.lr}: give a learning rate above 0 (the default is 5e-4)")
        if self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ConvError(f"--weight-decay {self.weight_decay} / --max-grad-norm {self.max_grad_norm}: give 0 or more "
                            f"(0: off)")
        if self.seed < 0:
            raise ConvError(f"--seed {self.seed}: give a whole number of 0 or more")
        if self.steps < 0 or self.minutes < 0:
            raise ConvError(f"--steps {self.steps} / --minutes {self.minutes}: a budget cannot be negative; give "
                            f"--steps N and/or --minutes M, at least one of them above 0 (0 means no limit of that kind)")
        if self.steps == 0 and self.minutes == 0:
            raise ConvError("give a budget: --steps N and/or --minutes M (at least one above 0)")
        require_at_least(self, ("batch_size", "checkpoint_every", "log_every"), 1)
        require_at_least(self, ("warmup_steps",), 0, " (0: no warm-up)")
        if not 0.0 < self.mask_prob < 1.0:
            raise ConvError(f"--mask-prob {self.mask_prob}: give a fraction in (0, 1)")


# ----------------------------------------------------------------------------- masking
def mask_tokens(ids: Tensor, eligible: Tensor, mask_id: int, replace_ids: Tensor, prob: float = 0.15,
                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """BERT's masking. ids (B, T), eligible (B, T) bool (real, non-special tokens) → inputs (B, T)
    and labels (B, T): each eligible token is chosen with probability `prob` (at least one per
    batch when any is eligible); a chosen one becomes [MASK] (80%), a random id from
    `replace_ids` (10%) or stays (10%), and its label is the original id; others get IGNORE."""
    chosen = (torch.rand(ids.shape, generator=generator) < prob) & eligible
    if not chosen.any() and eligible.any():  # a loss needs one prediction; take a random eligible token
        flat = eligible.flatten().nonzero()[:, 0]
        chosen.view(-1)[flat[torch.randint(len(flat), (1,), generator=generator)]] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    u = torch.rand(ids.shape, generator=generator)
    to_mask, to_random = chosen & (u < 0.8), chosen & (u >= 0.8) & (u < 0.9)
    inputs = ids.masked_fill(to_mask, mask_id)
    pick = torch.randint(len(replace_ids), (int(to_random.sum()),), generator=generator)
    inputs[to_random] = replace_ids[pick]
    return inputs, labels


class MaskedLM(nn.Module):
    """The encoder with BERT's prediction head (dense, GELU, LayerNorm), decoding with the token
    embeddings (tied) plus a bias."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        d = encoder.config.dim
        self.encoder = encoder
        self.mlm = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.bias = nn.Parameter(torch.zeros(encoder.vocab_size))

    def forward(self, inputs: Tensor, mask: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
        """inputs, mask, labels (B, T) → the cross-entropy over the chosen positions: their mean,
        or (reduction "sum") their sum (0 when none is chosen)."""
        h = self.encoder(inputs, mask)            # (B, T, D)
        chosen = labels != IGNORE                 # (B, T)
        z = self.mlm(h[chosen])                   # (N, D)
        logits = F.linear(z, self.encoder.tok.weight, self.bias)  # (N, V)
        return F.cross_entropy(logits, labels[chosen], reduction=reduction)


# ----------------------------------------------------------------------------- corpus
@dataclass
class Corpus:
    name: str
    path: str
    texts: int
    chunks: list[np.ndarray]  # each (L,) int64 with [CLS] … [SEP], L ≤ max_length

    @property
    def tokens(self) -> int:
        return int(sum(len(c) for c in self.chunks))

    @functools.cached_property
    def sha256(self) -> str:
        """A digest of the tokenised corpus: every chunk's length and token ids, in order (a corpus edited
        without changing its number of chunks gives another)."""
        h = hashlib.sha256()
        for c in self.chunks:
            h.update(len(c).to_bytes(8, "little"))
            h.update(np.ascontiguousarray(c, dtype="<i8").tobytes())
        return h.hexdigest()

    def describe(self) -> dict:
        return {"name": self.name, "path": self.path, "texts": self.texts, "chunks": len(self.chunks),
                "tokens": self.tokens, "sha256": self.sha256}


def corpus_texts(corpus: str, text_field: str = "text") -> tuple[str, Path, list[str]]:
    """(name, file, texts): a dataset name or a folder of split files (its train file; `imdb` = the
    IMDB train reviews), or a file: .jsonl/.json/.csv/.tsv/.parquet/.arrow (the `text_field` of each
    record; data.read_texts), anything else one text per line (data.read_lines). Files are read as
    --data reads them (UTF-8 errors named, compressed files refused, a text that is not a string is
    an error naming its line); a corpus is a bag of texts, so blank lines and empty texts are skipped."""
    from ..data import holds_records, is_hf_split_folder, read_lines, read_texts, resolve

    path = Path(corpus).expanduser()
    looks_like_path = path.suffix != "" or os.sep in corpus or path.exists()
    if looks_like_path and not path.exists():
        raise DataError(f"corpus {corpus}: no such file or folder. Give a text file (one text per line), a "
                        f".jsonl/.json/.csv/.tsv/.parquet/.arrow file with a text field, a folder of train / "
                        f"validation / test files, or a dataset name such as imdb.")
    name = path.name if looks_like_path else corpus
    if not path.is_file() and not is_hf_split_folder(path):  # a dataset name or a folder: its train split
        _, files = resolve(corpus)
        if "train" not in files:
            raise DataError(f"corpus {corpus}: no train file to pre-train on (found: {', '.join(sorted(files))})")
        path = files["train"]
    if holds_records(path):
        texts = read_texts(path, text_field, skip_blank=True)
    elif text_field != "text":
        raise DataError(f"--text-field {text_field}: {path} is read as plain text, one text per line, which has "
                        f"no fields; leave --text-field out, or give a .jsonl / .csv / .tsv file")
    else:
        texts = read_lines(path, "corpus texts", skip_blank=True)
    if not texts:
        raise DataError(f"{path}: no text in the corpus")
    return name, path, texts


def build_corpus(corpus: str, max_length: int, tok, text_field: str = "text",
                 batch: int = 2000) -> Corpus:
    """Tokenise every text (no truncation) and cut it into chunks of max_length − 2 word pieces,
    each wrapped in [CLS] … [SEP]. Chunks without a predictable (non-special) token are dropped."""
    name, path, texts = corpus_texts(corpus, text_field)
    body = max_length - 2
    special = set(tok.all_special_ids)
    cls, sep = tok.cls_token_id, tok.sep_token_id
    chunks = []
    for s in range(0, len(texts), batch):
        enc = tok(texts[s:s + batch], add_special_tokens=False, return_attention_mask=False,
                  return_token_type_ids=False, verbose=False)["input_ids"]
        for ids in enc:
            for c in range(0, len(ids), body):
                piece = ids[c:c + body]
                if any(i not in special for i in piece):
                    chunks.append(np.asarray([cls, *piece, sep], dtype=np.int64))
    if not chunks:
        raise DataError(f"{path}: the corpus has no tokens the tokenizer keeps")
    return Corpus(name, str(path), len(texts), chunks)


# ----------------------------------------------------------------------------- checkpoints
def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def find_checkpoint(path: Path) -> Path:
    """The step folder of a pre-training output folder (via `latest`), or `path` itself when it
    is a step folder; an error that says what to give otherwise."""
    path = Path(path)
    if not path.exists():
        raise ConvError(f"{path}: no such folder; give the --output folder of `frozentune pretrain` (it holds `latest` "
                        f"and step-N folders) or one of its step-N folders")
    folder = path / latest_step(path) if (path / LATEST).is_file() else path
    config = folder / CONFIG
    ok = config.is_file() and (folder / WEIGHTS).is_file()
    if ok:
        try:
            saved = json.loads(config.read_text())
            ok = isinstance(saved, dict) and saved.get("format") == FORMAT
        except (json.JSONDecodeError, UnicodeDecodeError):
            ok = False
    if not ok:
        raise ConvError(f"{path} is not a pre-training checkpoint: give the --output folder of "
                        f"`frozentune pretrain` (it holds `latest` and step-N folders) or one of its step-N folders")
    check_checkpoint_config(saved, config)
    return folder


def latest_step(output: Path) -> str:
    """The step folder's name that `output/latest` holds (a "step-N" folder beside it, as `pretrain` writes it); a
    ConvError where it holds anything else: a name with a folder in it would resume, or initialise an encoder, from
    another run's checkpoint, and a damaged file raised a UnicodeDecodeError."""
    path = output / LATEST
    try:
        name = path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        name = None
    if name is None or not re.fullmatch(r"step-\d+", name):
        shown = "bytes that are not text" if name is None else json.dumps(name, ensure_ascii=False)[:80]
        raise ConvError(f"{path}: holds {shown}, not the name of a step-N folder beside it (what `frozentune pretrain` "
                        f"writes); it was edited or damaged: write the newest step folder's name into it "
                        f"(e.g. step-{'0' * 7}100), or give that step folder itself")
    return name


def check_checkpoint_config(config: dict, path: Path) -> None:
    """A ConvError naming the first entry of a checkpoint's config.json (`path`) that cannot be what `pretrain` wrote:
    a hand edit ended in a KeyError or AttributeError in --resume and --init (a fuzz of it, this session's REPORT)."""
    from ..fields import wrong_value

    def bad(key: str, what: str) -> ConvError:
        shown = json.dumps(config.get(key), ensure_ascii=False)
        return ConvError(f"{path}: {key} is not {what} (it holds {shown[:80]}); the checkpoint was edited or damaged: "
                         f"restore it or start a new run")

    for key, cls in (("encoder", EncoderConfig), ("run", PretrainConfig)):
        entry = config.get(key)
        if not isinstance(entry, dict) or set(entry) - {f.name for f in dataclasses.fields(cls)}:
            raise bad(key, f"an object of {cls.__name__}'s fields")
        # every field has a default (one an older frozentune did not write keeps it, as `_resume_settings` builds it)
        if (why := wrong_value(cls(**entry))) is not None:
            raise bad(key, f"an object of {cls.__name__}'s fields ({why})")
    corpus = config.get("corpus")
    if not (isinstance(corpus, dict) and isinstance(corpus.get("spec"), str) and isinstance(corpus.get("text_field"), str)
            and type(corpus.get("chunks")) is int and isinstance(corpus.get("sha256", ""), str)):
        raise bad("corpus", "an object of the corpus read (spec, text_field, chunks, sha256)")
    for key, kinds in (("step", (int,)), ("seconds", (int, float)), ("tokens_seen", (int,))):
        if not (type(config.get(key)) in kinds and config[key] >= 0):
            raise bad(key, "a number, 0 or more")
    if not isinstance(config.get("tokenizer_hash", ""), str):
        raise bad("tokenizer_hash", "a hash of the tokenizer (text)")


def read_checkpoint(path: Path) -> tuple[dict, dict[str, Tensor]]:
    """(config, weights) of the checkpoint at `path` (see find_checkpoint)."""
    folder = find_checkpoint(path)
    return json.loads((folder / CONFIG).read_text()), load_weights(folder / WEIGHTS)


def load_weights(path: Path, device: str = "cpu") -> dict[str, Tensor]:
    """The tensors of a checkpoint's model.safetensors (no code can run), or a one-line ConvError."""
    from ..model import read_safetensors

    return read_safetensors(path, ConvError, "the checkpoint is damaged: restore it or start a new run", device)


def load_optimizer(path: Path, device: torch.device) -> dict:
    """optimizer.pt as `_save_checkpoint` wrote it: {"optimizer": AdamW state, "torch_rng": tensor},
    read with torch's weights-only unpickler (tensors and plain containers; anything else, such
    as a pickle that would call a function, is refused before it runs)."""
    import pickle

    from ..backbone import refused_pickle

    redo = "restore the checkpoint or start a new run without --resume"
    try:
        extra = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ConvError(f"{path}: not the optimizer state frozentune writes; torch's weights-only loader refused "
                        f"it ({refused_pickle(e)}) and nothing in it was run: {redo}") from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise ConvError(f"{path}: unreadable ({' '.join(str(e).split())[:200]}): {redo}") from None
    if not (isinstance(extra, dict) and isinstance(extra.get("optimizer"), dict)
            and isinstance(extra.get("torch_rng"), Tensor)):
        raise ConvError(f"{path}: not the optimizer state frozentune writes (expected optimizer and torch_rng): {redo}")
    return extra


def _write_bytes(path: Path, data: bytes) -> None:
    """path.write_bytes, its errors naming the file (a write or close error of a full disk names none)."""
    try:
        path.write_bytes(data)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e


def _save_checkpoint(output: Path, model: MaskedLM, opt: torch.optim.Optimizer, config: dict,
                     curve: list[dict], rank_rngs: list[Tensor] | None = None) -> Path:
    from ..model import save_tensors

    name = f"step-{config['step']:07d}"
    tmp = output / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_tensors(state, tmp / WEIGHTS, metadata={"format": FORMAT})
        extra = {"optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state()}
        if rank_rngs is not None:  # data-parallel: every rank's state (rank 0's is torch_rng)
            extra["rank_rngs"] = rank_rngs
        buffer = io.BytesIO()  # torch's zip writer hid a full disk's OSError under a RuntimeError of its own
        torch.save(extra, buffer)
        _write_bytes(tmp / OPTIMIZER, buffer.getvalue())
        _write_bytes(tmp / CURVE, "".join(json.dumps(r) + "\n" for r in curve).encode())
        _write_bytes(tmp / CONFIG, json.dumps(config, indent=2).encode())
    except BaseException:  # a full disk, an interrupt: the half-written step does not hold the space
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = output / name
    if final.exists():  # the same step written before (a run resumed at its last checkpoint)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_atomic(output / LATEST, name)
    for old in output.glob("step-*"):
        if old.name != name:
            shutil.rmtree(old)
    return final


def lr_at(step: int, run: PretrainConfig) -> float:
    """Linear warm-up to run.lr over warmup_steps, then lr·sqrt(warmup/step)."""
    if run.warmup_steps and step <= run.warmup_steps:
        return run.lr * step / run.warmup_steps
    return run.lr * math.sqrt(max(run.warmup_steps, 1) / step)


def budgets_reached(run: PretrainConfig, step: int, seconds: float) -> dict[str, float]:
    """The budgets (steps, minutes) that a run at `step` after `seconds` of training has spent; a
    budget of 0 (no limit) is never spent."""
    reached: dict[str, float] = {}
    if run.steps and step >= run.steps:
        reached["steps"] = run.steps
    if run.minutes and seconds >= 60 * run.minutes:
        reached["minutes"] = run.minutes
    return reached


def as_flags(d: dict) -> str:
    return " ".join(f"{as_flag(k)} {v}" for k, v in d.items())


def same_corpus(given: str, saved: str) -> bool:
    """Whether --corpus names the saved run's corpus: the same words, or paths of the same file (a run
    saved the path as given, relative to where it started, before it saved it resolved)."""
    if given == saved:
        return True
    a, b = Path(given).expanduser(), Path(saved).expanduser()
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def check_same_corpus(saved: dict, data: Corpus, corpus: str) -> None:
    """Refuse to resume on a corpus other than the checkpoint's: another number of chunks, or (where the
    checkpoint recorded it; those written before it did are checked by the count alone) another digest
    of the tokenised chunks. A corpus read from another path than the saved one (the file moved) is
    the same corpus where its digest is the checkpoint's; a checkpoint without a digest cannot tell."""
    redo = "resume with the same corpus, or start a new run in another --output folder"
    if corpus != saved["spec"] and "sha256" not in saved:
        raise ConvError(f"--corpus {corpus}: the checkpoint's corpus is {saved['spec']}, and the checkpoint was "
                        f"written before frozentune recorded a digest of the corpus, so another path cannot be "
                        f"checked to hold the same text; resume with --corpus {saved['spec']} (put the file back "
                        f"there), or start a new run in another --output folder")
    if saved["chunks"] != len(data.chunks):
        raise ConvError(f"the corpus {corpus} changed since the checkpoint ({saved['chunks']:,} chunks then, "
                        f"{len(data.chunks):,} now); {redo}")
    if "sha256" in saved and saved["sha256"] != data.sha256:
        raise ConvError(f"the corpus {corpus} changed since the checkpoint: as many chunks as then "
                        f"({len(data.chunks):,}), but other tokens (sha256 {saved['sha256'][:12]}… then, "
                        f"{data.sha256[:12]}… now); {redo}")


def _resume_settings(saved: dict, encoder: dict, run: dict, corpus: str | None, text_field: str) -> tuple[EncoderConfig, PretrainConfig, str]:
    """The saved run's settings with the budget options given now; any other option given must
    equal the saved one."""
    enc, old_run = saved["encoder"], saved["run"]
    differ = {k: (v, enc.get(k)) for k, v in encoder.items() if enc.get(k) != v}
    differ |= {k: (v, old_run.get(k)) for k, v in run.items() if k not in RESUMABLE_CHANGES and old_run.get(k) != v}
    moved = corpus is not None and not same_corpus(corpus, saved["corpus"]["spec"])  # checked by its digest
    if text_field != saved["corpus"]["text_field"]:
        differ["text_field"] = (text_field, saved["corpus"]["text_field"])
    if differ:
        shown = ", ".join(f"{k} {new!r} (saved: {old!r})" for k, (new, old) in differ.items())
        raise ConvError(f"--resume continues the saved run, whose settings differ from the ones given: {shown}. "
                        f"Leave those options out (only {', '.join(RESUMABLE_CHANGES)} may change), or start a "
                        f"new run in another --output folder")
    new_run = {**old_run, **{k: v for k, v in run.items() if k in RESUMABLE_CHANGES}}
    return EncoderConfig(**enc), PretrainConfig(**new_run), corpus if moved else saved["corpus"]["spec"]


def _settings(output: Path, corpus: str | None, encoder: dict, run: dict, resume: bool,
              text_field: str) -> tuple[EncoderConfig, PretrainConfig, str, dict | None]:
    """(encoder config, run config, corpus, saved checkpoint config or None) for a new or resumed run."""
    from ..output import check_writable_folder

    check_writable_folder(output)  # before any work: a read-only folder failed at the first checkpoint
    if resume:
        if not (output / LATEST).is_file():
            raise ConvError(f"nothing to resume: {output} holds no checkpoint; run without --resume to start")
        saved = json.loads((find_checkpoint(output) / CONFIG).read_text())
        return (*_resume_settings(saved, encoder, run, corpus, text_field), saved)
    if (output / LATEST).is_file():
        step = json.loads((find_checkpoint(output) / CONFIG).read_text())["step"]
        raise ConvError(f"{output} already holds a pre-training run (step {step}); add --resume to "
                        f"continue it, or choose another --output")
    if output.exists() and not output.is_dir():
        raise ConvError(f"--output {output}: is a file, not a folder; give a folder path (it is created)")
    # a folder holding only what a run stopped before its first checkpoint wrote (its loss curve, a
    # half-written checkpoint) is started afresh; anything else (e.g. a saved model's folder) is not ours
    own = {CURVE} if not (output / "result.json").exists() else set()
    if output.is_dir() and (present := sorted(p.name for p in output.iterdir()
                                              if p.name not in own and not p.name.startswith(".tmp-"))):
        raise ConvError(f"--output {output}: is not empty ({len(present)} entr{'y' if len(present) == 1 else 'ies'}, "
                        f"e.g. {present[0]}) and holds no pre-training run; choose a new or empty folder")
    if corpus is None:
        raise ConvError("give --corpus: imdb (the IMDB train reviews), a dataset name, or a text file")
    try:
        return EncoderConfig(**encoder), PretrainConfig(**run), corpus, None
    except TypeError as e:
        raise ConvError(f"bad option: {e}") from None


def _device(spec: str) -> tuple[torch.device, str]:
    """(the device to train on, the `device:` line train prints for it): an absent or unknown one is an
    error listing what this machine has (extract.resolve_device); under a launcher, a bare "cuda" is
    this rank's GPU."""
    from ..extract.device import resolve_device

    chosen, said = resolve_device(spec)
    return (chosen if spec.strip().lower() == "auto" else distributed.device(spec.strip().lower())), said


class Batches:
    """Step → a masked batch, the same for the same (seed, step), so a resumed run sees what an
    uninterrupted one would."""

    def __init__(self, chunks: list[np.ndarray], tok, run: PretrainConfig):
        special = set(tok.all_special_ids)
        self.chunks, self.run = chunks, run
        self.special = torch.tensor(sorted(special))
        self.replace_ids = torch.tensor([i for i in range(len(tok)) if i not in special])  # "random token" draws
        self.pad_id, self.mask_id = int(tok.pad_token_id), int(tok.mask_token_id)

    def __call__(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """inputs (B, T), real-token mask (B, T) bool, labels (B, T)."""
        from ..backbone import pad

        rng = np.random.default_rng([self.run.seed, step])
        idx = rng.integers(0, len(self.chunks), self.run.batch_size)
        ids, real = pad([self.chunks[i] for i in idx], self.pad_id)
        real = real.bool()
        gen = torch.Generator().manual_seed(int(rng.integers(2 ** 62)))
        inputs, labels = mask_tokens(ids, real & ~torch.isin(ids, self.special), self.mask_id, self.replace_ids,
                                     self.run.mask_prob, gen)
        return inputs, real, labels


# ----------------------------------------------------------------------------- the loop
def optimizer_without(opt: torch.optim.Optimizer, state: dict, model: nn.Module, newer: list[nn.Parameter],
                      run_cfg: "PretrainConfig") -> None:
    """Load into `opt` (over every parameter of `model`) the optimiser state of a checkpoint saved before the
    parameters `newer` existed: it is loaded into an optimiser over the others, in their order (as that run
    made it), and handed over; the newer ones start with fresh state."""
    older = adamw([p for p in model.parameters() if not any(p is q for q in newer)], run_cfg.lr, run_cfg.weight_decay)
    older.load_state_dict(state)
    for p, st in older.state.items():
        opt.state[p] = st
    for group, was in zip(opt.param_groups, older.param_groups):
        group.update({k: v for k, v in was.items() if k != "params"})


def _pretrain_terms() -> dict[str, str]:
    """`frozentune pretrain`'s flags as pretrain() takes them: the encoder's in `encoder`, the run's in `run`."""
    return {**field_flags(EncoderConfig, lambda f: f'encoder["{f}"]'), **field_flags(PretrainConfig, lambda f: f'run["{f}"]')}


@in_python_terms(also=_pretrain_terms)
@holds_output
@keeps_rng  # it seeds torch (initial weights, masks, dropout); the caller's random state is put back after
def pretrain(output: Path, corpus: str | None = None, encoder: dict[str, Any] | None = None,
             run: dict[str, Any] | None = None, resume: bool = False, text_field: str = "text",
             log: Callable[[str], None] = print) -> dict:
    """Pre-train an encoder with MLM until the step or time budget is spent, checkpointing into
    `output`. `encoder` (EncoderConfig fields) and `run` (PretrainConfig fields) hold only the
    options set by the caller; with `resume`, the saved run continues and only its budget
    (steps, minutes) and bookkeeping may change. Returns the summary written to result.json."""
    from ..backbone import tokenizer_hash

    output = Path(output)
    world = distributed.launch().world_size
    main = distributed.is_main()
    if not main:
        log = silent
    enc_cfg, run_cfg, corpus, saved = _settings(output, corpus, dict(encoder or {}), dict(run or {}), resume, text_field)
    if enc_cfg.max_length < 3:  # a chunk is [CLS] + word pieces + [SEP]
        # before the encoder's own check, whose minimum (2) is not pre-training's
        raise ConvError(f"--max-length {enc_cfg.max_length}: a pre-training chunk holds [CLS], [SEP] and at least one "
                        f"word piece; give at least 3 (the default is 128)")
    enc_cfg.validate()
    run_cfg.validate()
    if saved is None:  # a new run's options (a resumed run's are the checkpoint's)
        refuse_unused(enc_cfg, "pretrain")
    if saved is None or corpus != saved["corpus"]["spec"]:  # new, or resumed from where the corpus moved to
        if os.sep in corpus or Path(corpus).suffix or Path(corpus).exists():  # a path: saved resolved, so that
            corpus = str(Path(corpus).expanduser().resolve())  # --resume from another folder finds it
    device, said = _device(run_cfg.device)  # an unknown or absent device: said before any work
    log(said)
    tok = load_tokenizer()
    t0 = time.perf_counter()
    try:
        data = build_corpus(corpus, enc_cfg.max_length, tok, text_field)  # a corpus it cannot read: before any folder is made
    except DataError as e:
        if saved is None or corpus != saved["corpus"]["spec"] or Path(corpus).expanduser().exists():
            raise
        raise DataError(f"{str(e).rstrip('.')}. If the corpus moved, resume with --corpus NEW_PATH: its tokens are checked "
                        f"against the checkpoint's") from None
    prepare_seconds = time.perf_counter() - t0
    distributed.barrier()  # every rank has read the output folder as it was before rank 0 writes to it
    if main:
        output.mkdir(parents=True, exist_ok=True)
        for stale in output.glob(".tmp-*"):  # left by an interrupted checkpoint write
            shutil.rmtree(stale, ignore_errors=True)

    log(f"corpus {data.name}: {data.texts:,} texts → {len(data.chunks):,} chunks of ≤ {enc_cfg.max_length} tokens, "
        f"{data.tokens:,} tokens ({prepare_seconds:.1f}s)")
    if saved is not None:
        check_same_corpus(saved["corpus"], data, corpus)

    torch.manual_seed(run_cfg.seed)
    model = MaskedLM(Encoder(enc_cfg, len(tok))).to(device)
    if not main:  # dropout: rank 0 continues the stream as one process would, the others draw their own
        torch.manual_seed(distributed.rank_seed(run_cfg.seed))
    opt = adamw(list(model.parameters()), run_cfg.lr, run_cfg.weight_decay)
    step, elapsed, tokens_seen, curve = 0, 0.0, 0, []
    if saved is not None:
        folder = find_checkpoint(output)
        weights = load_weights(folder / WEIGHTS, str(device))
        extra = load_optimizer(folder / OPTIMIZER, device)
        try:
            newer = [(n, p) for n, p in model.named_parameters() if n not in weights]  # filled in by load (segments)
            model.load_state_dict(weights)
            if newer:
                optimizer_without(opt, extra["optimizer"], model, [p for _, p in newer], run_cfg)
                log(f"{folder}: saved by a frozentune before {', '.join(n for n, _ in newer)} existed; "
                    f"{'it starts' if len(newer) == 1 else 'they start'} at zero, as in a new encoder, with "
                    f"fresh optimiser state, and every other parameter continues as saved")
            else:
                opt.load_state_dict(extra["optimizer"])
            rngs = extra.get("rank_rngs")
            if world == 1 or (isinstance(rngs, list) and len(rngs) == world):
                # dropout continues as it would have
                torch.set_rng_state((extra["torch_rng"] if world == 1 else rngs[distributed.rank()]).cpu())
            else:  # a run saved by another number of processes: fresh per-rank streams
                torch.manual_seed(distributed.rank_seed(run_cfg.seed + int(saved["step"])))
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise ConvError(f"{folder}: the checkpoint does not fit the run it describes "
                            f"({' '.join(str(e).split())[:200]}); restore it or start a new run") from None
        step, elapsed, tokens_seen = saved["step"], saved["seconds"], saved["tokens_seen"]
        if reached := budgets_reached(run_cfg, step, elapsed):
            raise ConvError(f"{output} is at step {step} ({elapsed / 60:.1f} minutes trained), already past "
                            f"{as_flags(reached)}; give a larger budget to continue it (nothing was changed)")
        curve = [json.loads(line) for line in (folder / CURVE).read_text().splitlines() if line.strip()]
        log(f"resuming {output} at step {step} ({elapsed:.0f}s trained)")
    n_params = sum(p.numel() for p in model.encoder.parameters())
    log(f"{enc_cfg.arch} encoder: {enc_cfg.layers} layers, width {enc_cfg.dim}, {n_params:,} parameters; "
        f"budget: {run_cfg.steps or '∞'} steps, {run_cfg.minutes or '∞'} minutes")

    batches, tok_hash, params = Batches(data.chunks, tok, run_cfg), tokenizer_hash(tok), list(model.parameters())
    if world > 1:
        distributed.check_same("the model, corpus and run", (distributed.param_signature(model), data.describe(),
                                                             dataclasses.asdict(run_cfg) | {"device": None}, step))
        distributed.broadcast_module(model)
        log(f"data-parallel: {world} processes ({distributed.launch().how}), each a slice of every batch of "
            f"{run_cfg.batch_size}")

    def checkpoint() -> None:
        config = {"format": FORMAT, "encoder": dataclasses.asdict(enc_cfg), "vocab_size": len(tok),
                  "tokenizer": TOKENIZER, "tokenizer_hash": tok_hash, "run": dataclasses.asdict(run_cfg),
                  "corpus": {"spec": corpus, "text_field": text_field, **data.describe()},
                  "step": step, "seconds": elapsed, "tokens_seen": tokens_seen,
                  "loss": curve[-1]["loss"] if curve else None}
        rngs = distributed.gather_objects(torch.get_rng_state()) if world > 1 else None
        if main:
            _save_checkpoint(output, model, opt, config, curve, rngs)

    def spent() -> str | None:
        return next(iter(budgets_reached(run_cfg, step, elapsed)), None)

    live = output / CURVE
    if main:  # a resumed run drops what came after its checkpoint
        live.write_text("".join(json.dumps(r) + "\n" for r in curve))
    last_saved = step if saved is not None else -1
    model.train()
    with open(live, "a") if main else contextlib.nullcontext() as curve_file:
        while (stopped := spent()) is None:
            step += 1
            t_step = time.perf_counter()
            inputs, real, labels = batches(step)
            lr = lr_at(step, run_cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            if world == 1:
                part = model(inputs.to(device), real.to(device), labels.to(device))
            else:  # this rank's rows; its part of the batch's mean: its sum over the batch's predicted positions
                rows = slice(*distributed.shard_bounds(len(inputs), world, distributed.rank()))
                chosen = int((labels != IGNORE).sum())
                part = (model(inputs[rows].to(device), real[rows].to(device), labels[rows].to(device), "sum") / chosen
                        if rows.stop > rows.start else None)
            loss = shared_step(part, opt, params, run_cfg.max_grad_norm, f"step {step}",
                               "lower --lr or raise --warmup-steps")
            elapsed += time.perf_counter() - t_step
            if world > 1:  # rank 0's clock for everyone: the --minutes budget stops all ranks at the same step
                elapsed = distributed.broadcast_object(elapsed)
            tokens_seen += int(real.sum())
            row = {"step": step, "loss": loss, "lr": lr, "seconds": round(elapsed, 3), "tokens": tokens_seen}
            curve.append(row)
            if curve_file is not None:
                curve_file.write(json.dumps(row) + "\n")
                curve_file.flush()
            if step % run_cfg.log_every == 0:
                recent = [r["loss"] for r in curve[-run_cfg.log_every:]]
                log(f"step {step:>6}  loss {sum(recent) / len(recent):.4f}  lr {lr:.2e}  {elapsed:.0f}s  "
                    f"{tokens_seen / max(elapsed, 1e-9):,.0f} tok/s")
            if step % run_cfg.checkpoint_every == 0:
                checkpoint()
                last_saved = step
    if last_saved != step:
        checkpoint()
    distributed.barrier()  # the last checkpoint is in place before any rank reads it below
    tail = [r["loss"] for r in curve[-run_cfg.log_every:]]
    result = {"output": str(output), "checkpoint": str(find_checkpoint(output)), "arch": enc_cfg.arch,
              "encoder": dataclasses.asdict(enc_cfg), "run": dataclasses.asdict(run_cfg), "corpus": data.describe(),
              "step": step, "stopped_by": stopped, "train_seconds": elapsed, "prepare_seconds": prepare_seconds,
              "tokens_seen": tokens_seen, "tokens_per_s": tokens_seen / elapsed if elapsed else None,
              "final_loss": sum(tail) / len(tail) if tail else None, "encoder_params": n_params,
              "environment": run_environment()}
    if main:
        (output / "result.json").write_text(json.dumps(result, indent=2))
    log(f"stopped at step {step} ({stopped} budget spent): loss {result['final_loss'] or float('nan'):.4f} "
        f"(mean of the last {len(tail)} steps), {elapsed:.0f}s; checkpoint {result['checkpoint']}")
    return result

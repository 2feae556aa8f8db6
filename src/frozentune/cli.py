"""frozentune command line: thin; each command parses arguments and makes one library call.

  frozentune train --method M --data D [--backbone B] [--output DIR] [method/training options]
  frozentune train --method prefix|finetune --data e2e|webnlg [--backbone LM] [--num-beams K] ...
  frozentune generate --model DIR --input FILE | SOURCE...
  frozentune eval --model DIR --data D
  frozentune predict --model DIR TEXT... | --input FILE
  frozentune explain --model DIR TEXT...
  frozentune plot-concepts --model DIR --data D [--output PNG]
  frozentune cache DATA --backbone B
  frozentune pretrain --arch A --corpus imdb|FILE --output DIR [--steps N] [--minutes M] [--resume]
  frozentune serve MODEL_DIR... [--host 127.0.0.1 --port 8000 --device --precision]
  frozentune export --model DIR --format peft --output OUT
  frozentune export --model DIR [DIR ...] --format onnx --output OUT;  frozentune predict --onnx OUT TEXT...
  frozentune import --format peft --adapter DIR --output OUT [--backbone LM]
  frozentune list
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import resource
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from .errors import FrozentuneError, out_of_memory
from . import interrupts, pyterms
from .fields import as_flag
from .export import FORMATS as EXPORT_FORMATS
from .interrupts import Interrupted
from .interrupts import raise_interrupted as _raise_interrupted
from .interrupts import raise_keyboard_interrupt as _raise_keyboard_interrupt
from .registry import describe_options, get_method, list_methods


class CLIError(FrozentuneError):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (the usage itself is one `--help` away), and comma lists
    of negative numbers taken as values: `--layers -1,-3` is a value, where Python 3.10-3.12's
    argparse took any "-1,-3" for an unknown option and refused the README's own command. No option
    here is spelled like a number, so nothing that is meant as an option is read as a value."""

    # argparse reads an argument as a value, not an option, when this matches it (and the parser
    # has no option that looks like a number). The stock pattern takes "-1" and "-.5" only, and
    # argparse sets it on each parser in __init__, so it is replaced there.
    _NUMBER = r"(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?"  # 1, 1.5, .5, 1e-3
    _NUMBER_LIST = re.compile(rf"^-{_NUMBER}([,:]-?{_NUMBER})*$")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = self._NUMBER_LIST

    def error(self, message: str):  # type: ignore[override]
        if message.endswith("expected one argument"):  # e.g. --text-field -x: a value that starts with "-"
            flag = message.split()[1].rstrip(":")
            message += f"; a value that starts with '-' is read as an option: join it with '=', e.g. {flag}=-VALUE"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _whole(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `least`; anything else is refused in one line."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give one of at least {least}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value}: give a whole number of at least {least}")
        return value
    return parse


_flag = as_flag  # fields.as_flag: cv_folds → --cv-folds


class _Once(argparse.Action):
    """An option given at most once: argparse keeps the last of repeated values, so `--model A --model B`
    ran B alone, saying nothing of A. (Its nargs are argparse's: `--model A B` where it takes several.)"""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        seen = self.__dict__.setdefault("given_in", set())  # the parses (their namespaces) that gave it
        if id(namespace) in seen:  # (not judged by the value: a value typed equal to the default is given too)
            shown = " ".join(map(str, before if isinstance(before, list) else [before]))
            again = " ".join(map(str, values if isinstance(values, list) else [values]))
            several = " (it takes several after one " + option_string + ")" if self.nargs in ("+", "*") else ""
            raise argparse.ArgumentError(self, f"given twice ({shown}, then {again}); give it once{several}")
        seen.add(id(namespace))
        setattr(namespace, self.dest, values)


def _add_dataclass_options(p: argparse.ArgumentParser, cls: type, title: str, defaults: dict | None = None,
                           skip: tuple[str, ...] = ()) -> None:
    """One option per dataclass field (but `skip`); defaults are left unset (None) so only what the
    user typed overrides the method's own defaults."""
    g = p.add_argument_group(title)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = (defaults or {}).get(f.name, f.default)
        help_ = f"{f.metadata.get('help', '')} (default: {default})".replace("%", "%%")  # argparse formats help
        typ = f.type if not isinstance(f.type, str) else {"int": int, "float": float, "str": str, "bool": bool}.get(f.type, str)
        if typ is bool:
            g.add_argument(_flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            g.add_argument(_flag(f.name), dest=f.name, type=typ, default=None, help=help_,
                           choices=f.metadata.get("choices"))


def _backbone_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("backbone")
    g.add_argument("--backbone", default=None, help="Hugging Face id or folder, or an alias: minilm (the default "
                   "encoder), smollm2-135m (the default causal LM for e2e/webnlg)")
    g.add_argument("--layer", help="hidden-state index, or a comma list (0 = embeddings, -1 = last); "
                                  "default: the method's own (see `frozentune list`), else -1")
    g.add_argument("--layer-combine", default="mean", choices=("mean", "concat"), help="how several layers combine")
    g.add_argument("--max-length", type=int, default=128, help="tokens per text after truncation (default 128; the "
                   "run says how many texts were cut, and how far the backbone reads)")
    g.add_argument("--no-token-types", dest="token_types", action="store_false", help="sentence pairs: keep "
                   "the separator but feed every token as type 0, for a backbone trained on single texts only "
                   "(sentence-transformers models such as the default MiniLM, whose second-segment embedding is "
                   "stale: see bench/REPORT.md, Sentence pairs); part of the cache key and the saved model")
    g.add_argument("--cache-dir", type=Path, default=None, help="feature cache folder: its entries are in it (default "
                   "$FROZENTUNE_CACHE/features, else ~/.cache/frozentune/features)")
    g.add_argument("--rebuild-cache", action="store_true", help="re-extract features even if a cache entry exists (fixes a corrupt one)")
    g.add_argument("--trust-remote-code", action="store_true", help="allow a Hugging Face model whose folder or "
                   "hub repository ships its own Python code to run that code (off: such a model is refused)")
    _runtime_args(g)


GENERATORS_PRECISION = ("; generation models decode in it (default fp32; bf16 is faster where the hardware has it, "
                        "and a near-tie between two tokens can then go either way; int8 is for classifiers only)")


def _runtime_args(g, generators: str = "") -> None:
    """--device and --precision of the frozen pass (and the device of the head); `generators`: what they
    mean for generation models, where the command takes them."""
    from .extract.precision import PRECISIONS

    g.add_argument("--device", default=None, help="where the backbone and the head run: auto (default: a GPU when "
                   "there is one, else the CPU), cpu, cuda, cuda:N, mps; said at the start")
    g.add_argument("--precision", default=None, choices=PRECISIONS, help="precision of the frozen backbone pass "
                   "(part of the cache key); default: chosen per device from measurements and said at the start "
                   "(saved models: the one they were trained with)" + generators)


def _decode_runtime_args(g) -> None:
    """--device and --precision of decoding (generation/precision.py)."""
    from .generation.precision import DECODE_PRECISIONS

    g.add_argument("--device", default=None, help="where the LM decodes: auto (default: a GPU when there is one, "
                   "else the CPU), cpu, cuda, cuda:N, mps; said at the start")
    g.add_argument("--precision", default=None, choices=DECODE_PRECISIONS, help="precision of decoding: fp32 "
                   "(default: exact, a row's tokens independent of its batch) or bf16 / fp16 (linear layers in 16 "
                   "bits under autocast: faster where the hardware has them; near-ties between tokens can flip)")


def _scored_split_args(p: argparse.ArgumentParser, whose: str, split: str = "test", split_help: str | None = None
                       ) -> None:
    """--data, --split (default `split`; `split_help` in place of eval's words) and the fields of a command that scores
    saved classifiers on a split (eval, compare, calibrate)."""
    p.add_argument("--data", required=True)
    p.add_argument("--split", default=split, choices=("train", "validation", "test", "all"),
                   help=split_help or "the split to score (default: test; a single file's test split is the 10%% "
                        "carved from it, as training carved it); all: every row of one file, nothing carved")
    p.add_argument("--text-field")
    p.add_argument("--text-pair-field", help=PAIR_HELP + f" (default: {whose})")
    p.add_argument("--label-field")


def _cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", type=Path)
    p.add_argument("--rebuild-cache", action="store_true", help="re-extract the split's features even if a cache entry "
                   "exists (fixes a corrupt one)")


def _pair_field_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source-field", help="generation from any pairs file: the source text's field (default: "
                   "source; E2E's mr and WebNLG's triples are read as they are)")
    p.add_argument("--target-field", help="generation: the target text's field (default: target; a list, or a "
                   "list in the same name + s, e.g. targets, gives several references)")


def _data_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--data", required=required, help="dataset name (sst2, sst5, trec, imdb; pairs: snli, rte, mrpc), "
                   "a .jsonl/.json/.csv/.tsv/.parquet/.arrow file, a folder of train/validation/test files, or a folder "
                   "written by datasets' save_to_disk")
    p.add_argument("--text-field", default="text")
    p.add_argument("--text-pair-field", help=PAIR_HELP)
    p.add_argument("--label-field", default="label")


PAIR_HELP = "the second text's field, for sentence pairs (e.g. --text-field premise --text-pair-field hypothesis); snli, rte and mrpc pick theirs"


def _input_args(p: argparse.ArgumentParser) -> None:
    """Inputs of predict / explain besides the positional texts: pairs and files."""
    p.add_argument("--pair", nargs=2, action="append", metavar=("FIRST", "SECOND"), default=[],
                   help="a sentence pair (e.g. premise and hypothesis), for a model trained on pairs; repeatable")
    p.add_argument("--input", type=Path, help="a file with one text per line (- reads them from standard input; JSON Lines there for a pair model "
                   "or with --text-field), or a .jsonl/.json/.csv/.tsv/.parquet/.arrow file (or save_to_disk folder) whose "
                   "text (and, for a pair model, second text) fields are the model's or --text-field / --text-pair-field")
    p.add_argument("--text-field", help="with a .jsonl/.json/.csv/.tsv/.parquet/.arrow --input: the text field (default: the model's)")
    p.add_argument("--text-pair-field", help="with a .jsonl/.json/.csv/.tsv/.parquet/.arrow --input: the second text's field (default: the model's)")


def _version_line() -> str:
    """`frozentune --version`: its version and those of what computes its numbers (as result.json records: torch's
    own version string, whose local part says the build, e.g. 2.13.0+cpu or 2.13.0+cu130, where a wheel's metadata
    may say 2.13.0 alone). The parser that asks for it imports torch with the methods anyway."""
    import torch

    from .output import package_version as of

    return (f"frozentune {of('frozentune')} (torch {torch.__version__}, transformers "
            f"{of('transformers') or 'not installed'}, Python {sys.version.split()[0]})")


def _parser(method: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. `method`: a registered method whose options and training defaults `train
    --method METHOD --help` shows (its own options are otherwise parsed after the method is known)."""
    ap = _Parser(prog="frozentune", description="Adapt frozen pre-trained language models.")
    ap.add_argument("--version", action="version", version=_version_line())
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a method and evaluate it on the test split")
    t.add_argument("--method", required=True, help=f"one of: {', '.join(list_methods())}")
    _data_args(t)
    _pair_field_args(t)
    t.add_argument("--output", type=Path, help="folder for the saved model and result.json")
    t.add_argument("--max-train", type=_whole(1), help="use a stratified sample of this many training examples (the "
                   "cache still holds the whole split's states, extracted once and shared by every sample)")
    t.add_argument("--shots", type=_whole(1), metavar="K", help="use K training examples of each class (seeded by --seed; "
                   "whole sentences of a phrase treebank) for few-shot runs")
    t.add_argument("--quiet", action="store_true", help="no progress bar (a build of over 50 MB of states still says a "
                   "line a minute, as where no terminal shows the bar)")
    t.add_argument("--overwrite", action="store_true", help="replace a model already saved in --output (otherwise refused)")
    _backbone_args(t)
    g = t.add_argument_group("generation (e2e, webnlg)")
    g.add_argument("--num-beams", type=_whole(1), help="beam width for decoding the test sources (1: greedy; default 5)")
    g.add_argument("--max-new-tokens", type=_whole(1), help="longest generated text, in tokens (default 64)")
    g.add_argument("--max-validation", type=_whole(1), help="validation pairs (seeded sample) for early stopping "
                   "(default 200)")
    g.add_argument("--max-test", type=_whole(1), help="decode a seeded sample of this many test sources (default: all)")
    from .train import TrainConfig
    if method is None:
        _add_dataclass_options(t, TrainConfig, "training (defaults depend on the method: see `frozentune list`, or "
                               "train --method METHOD --help)", skip=("device",))  # --device: the backbone group's
    else:  # --help for one method: its training defaults, and its own options
        spec = get_method(method)
        _add_dataclass_options(t, TrainConfig, f"training (the defaults of {method})", spec.train_defaults,
                               skip=("device",))
        _add_dataclass_options(t, spec.config_cls, f"{method} options")

    e = sub.add_parser("eval", help="evaluate a saved model")
    e.add_argument("--model", type=Path, action=_Once, required=True)
    _scored_split_args(e, "the model's")
    _pair_field_args(e)
    _cache_args(e)
    e.add_argument("--errors", type=Path, metavar="FILE.jsonl", help="classification models: write every misclassified "
                   "example here (its line, text, label, prediction and scores), one JSON object a line")
    e.add_argument("--max-test", type=_whole(1), help="generation models: score a seeded sample of this many sources")
    e.add_argument("--num-beams", type=_whole(1), help="generation models: beam width (default: as trained)")
    _runtime_args(e, GENERATORS_PRECISION)

    cmp = sub.add_parser("compare", help="score saved classifiers on the same examples, each against the first: "
                         "accuracy with intervals, the difference, and McNemar's exact test of it")
    cmp.add_argument("--model", type=Path, action="append", required=True,
                     help="a saved classifier's folder; give it two or more times (the first is the baseline)")
    _scored_split_args(cmp, "each model's")
    _cache_args(cmp)
    _runtime_args(cmp)

    gen = sub.add_parser("generate", help="generate text with a saved prefix or fine-tuned LM (one output per line; "
                         "a line break inside an output is written as \\n, --json keeps outputs as they are)")
    gen.add_argument("--model", type=Path, action=_Once, required=True)
    gen.add_argument("sources", nargs="*", help="sources: an E2E meaning representation, linearised triples, or any source text")
    gen.add_argument("--input", type=Path, help="a file with one source per line (- reads them from standard input), or a .jsonl/.json/.csv/.tsv/.parquet/.arrow dataset file "
                     "(source / mr / triples)")
    gen.add_argument("--source-field", help="with a .jsonl/.json/.csv/.tsv/.parquet/.arrow --input (or --input - of JSON Lines): the source "
                     "field (default: source)")
    gen.add_argument("--num-beams", type=_whole(1), help="beam width (default: the one the model was trained with)")
    gen.add_argument("--max-new-tokens", type=_whole(1), help="longest output in tokens (default: as trained)")
    gen.add_argument("--json", action="store_true", help="print {source, output} JSON lines")
    _decode_runtime_args(gen)

    pr = sub.add_parser("predict", help="label texts with a saved model (or an exported ONNX graph: --onnx)")
    which = pr.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", type=Path, action=_Once)
    which.add_argument("--onnx", type=Path, help="a folder written by `frozentune export --format onnx`, run with "
                       "ONNX Runtime (every head in it answers)")
    pr.add_argument("texts", nargs="*", help="texts to label")
    pr.add_argument("--top-classes", type=_whole(1), metavar="K",
                    help="keep the K likeliest classes' probabilities in each row, likeliest first (default: every "
                         "class, in label order)")
    _input_args(pr)
    _runtime_args(pr)

    x = sub.add_parser("explain", help="show why a saved model predicts what it does (methods that explain: see `list`)")
    x.add_argument("--model", type=Path, action=_Once, required=True)
    x.add_argument("texts", nargs="*", help="texts to explain")
    _input_args(x)
    x.add_argument("--top", type=_whole(1), default=5, help="how many tokens or spans to show (default: 5)")
    x.add_argument("--top-classes", type=_whole(1), metavar="K",
                   help="--json: keep the K likeliest classes' probabilities and per-class explanations, likeliest first "
                        "(default: every class)")
    x.add_argument("--json", action="store_true", help="print the explanations as JSON")
    x.add_argument("--occlusion", action="store_true",
                   help="also cut each word out in turn and show how much the prediction's probability drops without "
                        "it (one more pass per word; explains any classifier, probe and finetune too)")
    _runtime_args(x)

    pc = sub.add_parser("plot-concepts", help="draw a space model's test centroids in concept space (PNG)")
    pc.add_argument("--model", type=Path, action=_Once, required=True)
    pc.add_argument("--data", required=True)
    pc.add_argument("--split", default="test", choices=("train", "validation", "test"))
    pc.add_argument("--output", type=Path, help="PNG path (default: MODEL/concepts-DATA-SPLIT.png)")
    pc.add_argument("--max-points", type=int, default=3000, help="seeded sample of examples drawn")
    pc.add_argument("--text-field")
    pc.add_argument("--text-pair-field", help=PAIR_HELP + " (default: the model's)")
    pc.add_argument("--label-field")
    pc.add_argument("--cache-dir", type=Path)
    _runtime_args(pc)

    c = sub.add_parser("cache", help="extract and store the frozen token states of a dataset; --list / --prune / "
                       "--remove KEY")
    c.add_argument("data", nargs="?", help="dataset name, file or folder")
    c.add_argument("--splits", default="train,validation,test",
                   help="comma list of the splits to extract (default: train,validation,test)")
    c.add_argument("--shard", metavar="i/N", help="extract only part i of N (0-based), for N independent processes "
                   "(job arrays); the entry is written when the last part finishes. Under torchrun / accelerate "
                   "launch the part comes from RANK / WORLD_SIZE")
    c.add_argument("--list", action="store_true", help="list the entries and interrupted builds in the cache folder")
    c.add_argument("--prune", action="store_true", help="remove interrupted builds with no finished shard, leftovers, "
                   "unreadable entries and lock files no build holds (builds holding finished shards are kept and "
                   "listed)")
    c.add_argument("--remove", nargs="+", metavar="KEY", help="delete these complete entries (and their interrupted "
                   "builds): each a key as --list shows it, or the first 8 or more of its hex digits where no other "
                   "key starts with them; an entry being built is refused")
    c.add_argument("--include-resumable", action="store_true", help="with --prune: also delete builds holding finished "
                   "shards (interrupted, or a --shard part waiting for the others)")
    c.add_argument("--json", action="store_true", help="with --list / --prune / --remove: JSON instead of a table")
    c.add_argument("--verify", action="store_true", help="with --list / --prune: read every entry's checksums (all "
                   "its bytes), so an entry changed in place shows as unreadable and --prune removes it; without it, "
                   "sizes only (checksums are read when a run opens an entry)")
    c.add_argument("--text-field", default="text")
    c.add_argument("--text-pair-field", help=PAIR_HELP)
    c.add_argument("--label-field", default="label")
    c.add_argument("--quiet", action="store_true", help="no progress bar (a build of over 50 MB of states still says a "
                   "line a minute, as where no terminal shows the bar)")
    _backbone_args(c)

    pt = sub.add_parser("pretrain", help="pre-train a conv or Transformer encoder by masked language modelling "
                                         "(fine-tune it with `train --method conv --init DIR`)")
    pt.add_argument("--corpus", help="imdb (the IMDB train reviews), another dataset name or a folder of split files "
                                     "(its train texts), or a file: one text per line, or .jsonl/.json/.csv/.tsv/"
                                     ".parquet/.arrow with --text-field")
    pt.add_argument("--output", type=Path, required=True, help="checkpoint folder")
    pt.add_argument("--resume", action="store_true", help="continue the run saved in --output (a larger --steps or --minutes extends it)")
    pt.add_argument("--text-field", default="text", help="the text field of a corpus of records (.jsonl, .csv, ...)")
    from .conv.encoder import EncoderConfig
    from .conv.pretrain import PretrainConfig
    _add_dataclass_options(pt, EncoderConfig, "encoder")
    _add_dataclass_options(pt, PretrainConfig, "pre-training")

    sw = sub.add_parser("sweep", help="train methods × layers × learning rates × weight decays × seeds from one cache; "
                        "a table, a plot and the best point saved as a model")
    _data_args(sw)
    sw.add_argument("--methods", default="probe", help="comma list of frozen heads (default: probe)")
    sw.add_argument("--layers", help="comma list of hidden-state indices, e.g. -1,-3 (default: each method's own)")
    sw.add_argument("--lr", help="comma list of peak learning rates (default: each method's own)")
    sw.add_argument("--weight-decay", help="comma list of AdamW weight decays (default: each method's own)")
    sw.add_argument("--seeds", default="0,1,2", help="comma list of seeds: each setting is trained once per seed "
                    "(default: 0,1,2)")
    sw.add_argument("--shots", type=_whole(1), metavar="K", help="K training examples per class (drawn with each seed)")
    sw.add_argument("--fallback", choices=("auto", "off"), help="as train's --fallback: off keeps each head where "
                    "the folds would keep a logistic regression instead (default: auto; the table says where it did)")
    sw.add_argument("--max-train", type=_whole(1), help="a stratified sample of this many training examples")
    sw.add_argument("--output", type=Path, help="folder for sweep.md, sweep.json, sweep.png and best/ (the best point's model)")
    sw.add_argument("--overwrite", action="store_true", help="replace a sweep already saved in --output")
    sw.add_argument("--restart", action="store_true", help="train every point again: without it, the points an "
                    "interrupted run of the same sweep finished (kept in the cache folder) are reused")
    _backbone_args(sw)
    for action in sw._actions:  # kept so that giving them is answered with what to do instead (cmd_sweep), not listed
        if action.dest in ("layer", "rebuild_cache"):
            action.help = argparse.SUPPRESS
    sv = sub.add_parser("serve", help="serve saved models over HTTP: every task from one backbone pass, "
                        "batched across requests; a page at /, the API at /docs")
    sv.add_argument("models", nargs="+", type=Path, help="saved model folders, or folders of them")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    sv.add_argument("--port", type=int, default=8000, help="(default: 8000; 0: a free one, said at start)")
    sv.add_argument("--access-log", action="store_true", help="log one line per request (off: it costs CPU under load)")
    sv.add_argument("--shutdown-grace", type=float, default=60.0, metavar="SECONDS",
                    help="on SIGINT / SIGTERM, how long the requests in flight may take to finish before they are cut "
                         "off (their clients get a 503); a long decode needs more (default 60)")
    from .serve.allocator import CHOICES as ALLOCATORS
    sv.add_argument("--allocator", choices=ALLOCATORS, default="auto",
                    help="memory allocator: tcmalloc or jemalloc start the server again with the library preloaded "
                         "(Linux); auto: tcmalloc where it is installed, else the system's malloc; the startup log "
                         "says which (default: auto)")
    _runtime_args(sv, GENERATORS_PRECISION)
    from .serve.engine import ServeOptions
    _add_dataclass_options(sv, ServeOptions, "batching and limits")
    ex = sub.add_parser("export", help="write saved models in another library's format (peft: a prefix-tuning "
                        "adapter folder PeftModel.from_pretrained loads; onnx: classifiers as one graph)")
    ex.add_argument("--model", type=Path, action=_Once, required=True, nargs="+", help="saved model folder(s): for peft one prefix "
                    "(--method prefix on a generation dataset); for onnx one or more heads on the same frozen backbone, "
                    "which share one backbone pass in the graph")
    ex.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    ex.add_argument("--name", nargs="+", help="onnx: the heads' output names, one per --model (default: the folder names)")
    ex.add_argument("--output", type=Path, required=True, help="the folder to write (new or empty; --overwrite replaces an earlier one)")
    ex.add_argument("--overwrite", action="store_true")
    im = sub.add_parser("import", help="make a frozentune model folder from another library's (peft: a prefix-tuning "
                        "adapter of a causal LM), for generate / eval / serve")
    im.add_argument("--format", required=True, choices=("peft",), help="peft: a prefix-tuning adapter folder")
    im.add_argument("--adapter", type=Path, required=True, help="the folder PEFT's save_pretrained wrote")
    im.add_argument("--output", type=Path, required=True)
    im.add_argument("--backbone", help="the causal LM (default: the adapter's base_model_name_or_path)")
    im.add_argument("--overwrite", action="store_true")
    rl = sub.add_parser("relabel", help="rename labels of a saved classifier (the order and the weights stay; "
                        "config.json, the weights' record and the card get the new names)")
    rl.add_argument("--model", type=Path, required=True, help="the saved classifier's folder")
    rl.add_argument("--rename", nargs="+", action="extend", required=True, metavar="OLD=NEW",
                    help="a label and its new name, one or more (to swap two names, rename both in one run)")
    rl.add_argument("--output", type=Path, help="write the renamed model here and leave --model as it is "
                    "(default: rename in place; the folder is replaced whole, so an interrupt leaves it as it was)")
    rl.add_argument("--overwrite", action="store_true", help="with --output: replace a model saved there")
    cal = sub.add_parser("calibrate", help="fit a saved classifier's temperature again on labelled examples it was "
                         "not trained on (its probabilities; every prediction stays as it was)")
    cal.add_argument("--model", type=Path, action=_Once, required=True, help="the saved classifier's folder")
    _scored_split_args(cal, "the model's", "validation", "the split to fit on (default: validation; all: every row of "
                       "one file, e.g. held-out examples of your own)")
    cal.add_argument("--output", type=Path, help="write the calibrated model here and leave --model as it is "
                     "(default: in place; the folder is replaced whole, so an interrupt leaves it as it was)")
    cal.add_argument("--overwrite", action="store_true", help="with --output: replace a model saved there")
    _cache_args(cal)
    sub.add_parser("list", help="list the methods and their options")
    en = sub.add_parser("env", help="what this machine gives frozentune, for a bug report or before a long run: "
                                    "versions, extras, CPU, devices, the default precision and why, models, data, cache")
    en.add_argument("--json", action="store_true", help="the same as one JSON object")
    en.add_argument("--no-measure", action="store_true",
                    help="do not time each reduced precision's matrix product against fp32's (up to about 1 s each "
                         "where it is slow)")
    _once_each(ap)
    return ap


def _once_each(parser: argparse.ArgumentParser) -> None:
    """Every option of `parser` (and of its commands) that stores one value is given at most once (_Once):
    `--input a.txt --input b.txt` read b.txt alone, `--data X --data Y` trained on Y, saying nothing."""
    for action in parser._actions:  # argparse keeps no public list of them
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _once_each(child)
        elif action.option_strings and type(action) is argparse._StoreAction:
            action.__class__ = _Once


def _given(a: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The options of dataclass `cls` that the user typed (see _add_dataclass_options)."""
    return {f.name: getattr(a, f.name) for f in dataclasses.fields(cls) if getattr(a, f.name) is not None}


def _method_options(method: str, rest: Sequence[str]) -> dict[str, Any]:
    """Parse the method's own options out of what the main parser did not know."""
    spec = get_method(method)
    mp = _Parser(prog=f"frozentune train --method {method}", add_help=False)
    _add_dataclass_options(mp, spec.config_cls, f"{method} options")
    _once_each(mp)
    ns, unknown = mp.parse_known_args(list(rest))
    if unknown:
        known = ", ".join(_flag(n) for n, *_ in describe_options(method))
        raise CLIError(f"unknown option(s) {' '.join(unknown)} for method {method!r}; its options: {known}")
    return {k: v for k, v in vars(ns).items() if v is not None}


def _overwrite_needs_output(a: argparse.Namespace) -> None:
    """--overwrite without --output was accepted and did nothing (nothing is saved without --output)."""
    if a.overwrite and a.output is None:
        raise CLIError("--overwrite replaces what --output holds; give --output DIR (without it nothing is saved)")


def cmd_train(a: argparse.Namespace, rest: list[str]) -> int:
    from . import api
    from .train import TrainConfig

    from .generation.run import MAX_VALIDATION, DecodeOptions, is_generation_data, train_generation

    _overwrite_needs_output(a)
    on_interrupt("the output folder is as it was; cache entries already complete are kept, and the finished "
                 "shards of one being built (a rerun resumes from them)")
    options = _method_options(a.method, rest)
    train_cfg = _given(a, TrainConfig)
    from .distributed import read_launch

    main_rank = read_launch(os.environ).rank == 0  # under torchrun / accelerate launch only rank 0 prints
    log = (lambda s: print(s, flush=True)) if main_rank else (lambda s: None)  # noqa: E731
    if is_generation_data(a.data, a.source_field, a.target_field):
        from .extract import resolve_device

        on_interrupt("the output folder is as it was")  # a generation run reads no feature cache

        if a.shots is not None:
            raise CLIError(f"--shots {a.shots}: few-shot sampling is for classification data (K examples per class); "
                           f"for generation data give --max-train")
        given = [f"{_flag(k)} {v}" for k, v, default in
                 (("text_field", a.text_field, "text"), ("text_pair_field", a.text_pair_field, None),
                  ("label_field", a.label_field, "label")) if v != default]
        if given:
            raise CLIError(f"{', '.join(given)}: fields of classification data; {a.data} is read as source → target "
                           f"generation data, whose fields are --source-field and --target-field (default: source "
                           f"and target; E2E and WebNLG pick theirs)")
        encoder = [f"{_flag(k)} {v}" for k, v, default in
                   (("max_length", a.max_length, 128), ("layer", a.layer, None), ("layer_combine", a.layer_combine, "mean"))
                   if v != default] + [_flag(k) for k in ("cv_folds", "cv_below", "cv_repeats", "fallback",
                                                          "average_folds", "calibrate") if k in train_cfg] + \
                  [flag for flag, v in (("--cache-dir", a.cache_dir), ("--rebuild-cache", a.rebuild_cache)) if v]
        if encoder:  # accepted and ignored before: the generation run never read them
            raise CLIError(f"{', '.join(encoder)}: options of a frozen encoder's classification run; a generation run "
                           f"reads the whole LM (its sources are cut to an encoder-decoder's positions, or refused where "
                           f"a causal LM cannot hold them), keeps no feature cache, and early-stops on validation loss: "
                           f"leave them out")
        if not a.token_types:
            raise CLIError("--no-token-types is for sentence-pair classification; generation data has sources, "
                           "not pairs: leave it out")
        if a.precision not in (None, "fp32"):
            raise CLIError(f"--precision {a.precision}: generation methods train through the language model, which "
                           f"they run in fp32; leave --precision out")
        device, said = resolve_device(a.device or "auto")
        log(said)
        train_cfg["device"] = str(device)
        decode_given = {k: v for k, v in (("num_beams", a.num_beams), ("max_new_tokens", a.max_new_tokens)) if v is not None}
        train_generation(a.method, a.data, a.backbone, options, train_cfg, a.output, a.max_train,
                         MAX_VALIDATION if a.max_validation is None else a.max_validation, a.max_test,
                         DecodeOptions(**decode_given), log, overwrite=a.overwrite,
                         trust_remote_code=a.trust_remote_code, fields=(a.source_field, a.target_field))
        _unsaved(a.output, log)
        return 0
    generation = [flag for flag, v in (("--num-beams", a.num_beams), ("--max-new-tokens", a.max_new_tokens),
                                       ("--max-validation", a.max_validation), ("--max-test", a.max_test)) if v is not None]
    if generation and get_method(a.method).generates:  # meant as pairs whose fields are not source / target
        raise CLIError(f"{', '.join(generation)}: options of a generation run, but {a.data} is read as classification "
                       f"data (its records have no source / target, mr or triples fields); for --method {a.method} "
                       f"on it, name the source and target fields: --source-field / --target-field")
    if generation:  # accepted and ignored before: a classification run scored its whole test split
        raise CLIError(f"{', '.join(generation)}: options of a generation run (source → target data); {a.data} is read "
                       f"as classification data: leave them out (--max-train samples its train split)")
    bb = api.BackboneOptions(a.backbone or "minilm", a.layer, a.layer_combine, a.max_length, a.trust_remote_code,
                             a.device, a.precision, a.token_types)
    if api.runs_live(a.method, options):  # (its options' errors are api.train's first ones too)
        on_interrupt(f"the output folder is as it was and nothing trained is kept (method {a.method!r} runs its "
                     f"backbone on every batch, so no feature cache is built)")
    api.train(a.method, a.data, bb, options, train_cfg, a.output, a.text_field, a.label_field,
              a.max_train, a.cache_dir, a.rebuild_cache, progress=not a.quiet and sys.stderr.isatty(), log=log,
              overwrite=a.overwrite, shots=a.shots, pair_field=a.text_pair_field,
              cache_log=api._stderr)  # the cache's size and progress lines on stderr, as the bar
    _unsaved(a.output, log)
    return 0


def _unsaved(output: Path | None, log) -> None:
    """A run without --output keeps nothing but what it printed: say so, once it is over."""
    if output is None:
        log("the model was not saved (no --output); give --output DIR to keep it for eval, predict and serve")


def cmd_eval(a: argparse.Namespace) -> int:
    from . import api
    from .generation.run import evaluate_generation, is_generation_model

    generation = is_generation_model(a.model)
    other = ([f for f, v in (("--text-field", a.text_field), ("--text-pair-field", a.text_pair_field),
                             ("--label-field", a.label_field), ("--cache-dir", a.cache_dir),
                             ("--rebuild-cache", a.rebuild_cache or None), ("--errors", a.errors)) if v is not None]
             if generation else
             [f for f, v in (("--source-field", a.source_field), ("--target-field", a.target_field),
                             ("--num-beams", a.num_beams), ("--max-test", a.max_test)) if v is not None])
    if other:  # accepted and ignored before
        raise CLIError(f"{', '.join(other)}: options for " + ("classification models; this is a generation model (its "
                       "options: --source-field, --target-field, --num-beams, --max-test)" if generation else
                       "generation models; this is a classification model (its options: --text-field, "
                       "--text-pair-field, --label-field, --cache-dir, --rebuild-cache, --errors)"))
    on_interrupt(CACHE_KEPT)
    if generation:
        print(json.dumps(evaluate_generation(a.model, a.data, a.split, a.max_test, a.num_beams,
                                             source_field=a.source_field, target_field=a.target_field,
                                             log=api._stderr, device=a.device, precision=a.precision),
                         indent=2, allow_nan=False))
        return 0
    print(json.dumps(api.evaluate_model(a.model, a.data, a.split, a.text_field, a.label_field, a.cache_dir,
                                        progress=sys.stderr.isatty(), device=a.device, precision=a.precision,
                                        pair_field=a.text_pair_field, rebuild_cache=a.rebuild_cache,
                                        errors=a.errors),
                     indent=2, allow_nan=False))
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from .compare import compare

    on_interrupt(CACHE_KEPT)
    print(json.dumps(compare(a.model, a.data, a.split, a.text_field, a.label_field, a.text_pair_field, a.cache_dir,
                             progress=sys.stderr.isatty(), device=a.device, precision=a.precision,
                             rebuild_cache=a.rebuild_cache), indent=2, allow_nan=False))
    return 0


def _arguments(values: Sequence[str], what: str) -> list[str]:
    """Texts given on the command line, held to the rule of texts in files: an empty one, or one that
    is not valid Unicode (bytes the shell passed that are not UTF-8), is an error naming it."""
    from .data import blank, invisible, unencodable

    for i, text in enumerate(values, 1):
        if blank(text):
            raise CLIError(f"{what} argument {i} is empty{invisible(text)}; give some text")
        if (why := unencodable(text, argv=True)) is not None:
            raise CLIError(f"{what} argument {i}: {why}; give UTF-8 text")
    return list(values)


def _inputs(a: argparse.Namespace, verb: str, fields: tuple[str | None, str | None] | None = None) -> list:
    """The texts and pairs given to predict / explain: arguments, --pair, then --input (read with the
    model's fields, or `fields`)."""
    from . import api

    if a.texts and a.pair:  # the mix was named by its Python position ("item 0 is str")
        raise CLIError(f"text argument {' '.join(a.texts[0].split())[:40]!r} beside --pair: a model takes single "
                       f"texts or sentence pairs, not both; give each pair as --pair FIRST SECOND, or only texts")
    texts = _arguments(a.texts, "text") + [tuple(_arguments(p, f"--pair {n}'s"))
                                           for n, p in enumerate(a.pair, 1)]  # "--pair 3's argument 2 is empty"
    if a.input:
        texts += (api.read_inputs_with(fields, a.input, a.text_field, a.text_pair_field) if fields is not None
                  else api.read_inputs(a.model, a.input, a.text_field, a.text_pair_field))
    elif a.text_field or a.text_pair_field:
        raise CLIError("--text-field / --text-pair-field pick the fields of an --input file; give --input FILE")
    if not texts:
        raise CLIError(f"nothing to {verb}: give texts as arguments, --pair FIRST SECOND, or --input FILE "
                       f"(--input - reads one text per line from standard input; a pair model's pairs come in a .jsonl / .csv / "
                       f".tsv file, or as JSON Lines on standard input)")
    return texts


def cmd_predict(a: argparse.Namespace) -> int:
    from . import api
    from .data import DataError, json_line

    ascii_only = not _writes_unicode(sys.stdout)  # JSON escapes where stdout cannot take every character
    if a.onnx:
        from .export.onnx import OnnxClassifier

        if a.device or a.precision:
            raise CLIError("--device / --precision apply to --model; an --onnx graph runs in float32 on the CPU")
        graph = OnnxClassifier(a.onnx)
        for row in graph.predict(_inputs(a, "predict", tuple(graph.meta["fields"])), log=api._stderr):
            print(json_line(api.likeliest(row, a.top_classes), ascii_only))
        return 0
    texts = _inputs(a, "predict")
    n = 0
    try:
        for n, row in enumerate(api.predict_stream(a.model, texts, a.device, a.precision,
                                                   top_classes=a.top_classes), 1):
            print(json_line(row, ascii_only), flush=n % api.PREDICT_CHUNK == 0)
            if n % api.PREDICT_CHUNK == 0:
                on_interrupt(f"the rows of the first {n:,} inputs were printed, one per input in order (the rest "
                             f"were not)")
    except DataError as e:  # an input of a later chunk: the rows of the earlier ones are out already
        if n == 0:
            raise
        raise CLIError(f"{e}; the rows of the first {n:,} inputs were printed before it, the rest were not") from None
    return 0


_LINE_BREAKS = {c: f"\\u{ord(c):04x}" for c in "\v\f\x1c\x1d\x1e\x85\u2028\u2029"} | {"\r": "\\r", "\n": "\\n"}
_ONE_LINE = {False: str.maketrans(_LINE_BREAKS), True: str.maketrans(_LINE_BREAKS | {"\t": "\\t"})}  # by `tabs`


def _escape_line_breaks(text: str, tabs: bool = False) -> str:
    """`text` as one output line: every character a line reader may break at (\\n, \\r, and the others
    str.splitlines knows: U+2028, U+0085, form feed, …) written as an escape, so line N of the output is the
    output for source N; with `tabs`, tabs as \\t too."""
    return text.translate(_ONE_LINE[tabs])


def cmd_generate(a: argparse.Namespace) -> int:
    from .api import _stderr
    from .data import holds_records, json_line
    from .generation import run as G
    from .generation.run import read_sources

    if a.source_field and not a.input:  # it was ignored: arguments have no fields
        raise CLIError("--source-field picks the field of an --input file of records; give --input FILE, or leave it "
                       "out for sources given as arguments")
    records = a.input is not None and holds_records(a.input)  # records (as read_sources reads them): the model's field
    field = a.source_field or (_saved_source_field(a.model) if records else None)
    sources = _arguments(a.sources, "source") + (read_sources(a.input, field) if a.input else [])
    if not sources:
        raise CLIError("nothing to generate from: give sources as arguments or --input FILE (--input - reads one "
                       "source per line from standard input)")
    outputs = G.generate_stream(a.model, sources, a.num_beams, a.max_new_tokens, a.device, a.precision, _stderr)
    ascii_only = not _writes_unicode(sys.stdout)  # JSON escapes where stdout cannot take every character
    for n, (src, out) in enumerate(zip(sources, outputs), 1):
        print(json_line({"source": src, "output": out}, ascii_only) if a.json else _escape_line_breaks(out),
              flush=True)
        if n % G.GENERATE_CHUNK == 0:
            on_interrupt(f"the outputs of the first {n:,} sources were printed, one line each in order (the rest were not)")
    return 0


def _saved_source_field(model: Path) -> str | None:
    """The source field a generation model was trained with (config.json "fields"), where it named one
    (eval reads it too); None for E2E / WebNLG records or a folder that cannot say."""
    try:
        fields = json.loads((Path(model) / "config.json").read_text()).get("fields") or {}
        return fields.get("source") if isinstance(fields.get("source"), str) else None
    except (OSError, ValueError, AttributeError):
        return None


def cmd_explain(a: argparse.Namespace) -> int:
    from . import api
    texts = _inputs(a, "explain")
    try:
        rows = api.explain(a.model, texts, a.top, a.device, a.precision, occlusion=a.occlusion,
                           top_classes=a.top_classes)
    except ValueError as e:
        raise CLIError(str(e)) from None
    if a.json:  # "truncated" as predict writes it: true where the input went on past --max-length, absent otherwise;
        # "lines": the text form, as the server's JSON has it (with the note of a list shorter than --top)
        print(json.dumps([{k: r[k] for k in ("text", "text_pair", "label", "scores", "truncated", "explanation", "lines")
                           if k in r} for r in rows], indent=2, allow_nan=False))
        return 0
    for row in rows:  # one line per text, per span: a line break or tab inside them is shown as \n, \t
        shown = f"{_one_line_text(row['text'])}\n  ⟷ {_one_line_text(row['text_pair'])}" if "text_pair" in row \
            else _one_line_text(row["text"])
        cut = "  (truncated: it reached --max-length; the explanation is of the part read)" if row.get("truncated") else ""
        print(f"{shown}\n  predicted: {_one_line_text(row['label'])} ({_odds(row['scores'])}){cut}")
        for line in row["lines"]:
            print(f"  {_one_line_text(line)}")
    return 0


def _one_line_text(text: str) -> str:
    """A text on one line: its line breaks and tabs escaped (_escape_line_breaks; JSON keeps them as they are)."""
    return _escape_line_breaks(text, tabs=True)


def _odds(scores: dict[str, float]) -> str:
    """The predicted label's probability and the runner-up's, e.g. "probability 0.23; next DESC 0.18", so
    a near-tie shows beside its explanation."""
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    return f"probability {ranked[0][1]:.2f}" + (f"; next {_one_line_text(ranked[1][0])} {ranked[1][1]:.2f}"
                                                if len(ranked) > 1 else "")


def cmd_plot_concepts(a: argparse.Namespace) -> int:
    from . import api
    on_interrupt(CACHE_KEPT)
    try:
        r = api.plot_concepts(a.model, a.data, a.output, a.split, a.max_points, a.text_field, a.label_field,
                              a.cache_dir, progress=sys.stderr.isatty(), device=a.device, precision=a.precision,
                              pair_field=a.text_pair_field)
    except ValueError as e:
        raise CLIError(str(e)) from None
    print(f"wrote {r['png']}: {r['points']:,} of {r['of']:,} {r['data']} {r['split']} examples, {r['drawn']}; "
          f"silhouette of the true labels {r['silhouette']:.3f}")
    return 0


def cmd_cache(a: argparse.Namespace) -> int:
    from . import api
    if a.list or a.prune or a.remove:
        if a.data is not None or a.list + a.prune + bool(a.remove) != 1:
            raise CLIError("give one of --list, --prune or --remove KEY, without a dataset (e.g. frozentune cache "
                           "--list)")
        if a.include_resumable and not a.prune:
            raise CLIError("--include-resumable goes with --prune")
        if a.verify and a.remove:
            raise CLIError("--verify goes with --list or --prune (--remove deletes the entries named, whatever "
                           "their checksums)")
        if building := _building_options(a):  # accepted and ignored before
            raise CLIError(f"{', '.join(building)}: options for building an entry; --list / --prune / --remove read "
                           f"the cache folder as it is (their options: --cache-dir, --json, --verify, "
                           f"--include-resumable)")
        return _cache_folder(a)
    if a.verify:
        raise CLIError("--verify goes with --list or --prune")
    if a.data is None:
        raise CLIError("give a dataset to cache (e.g. frozentune cache sst2), or --list / --prune")
    if a.json:
        raise CLIError("--json goes with --list or --prune")
    if a.include_resumable:
        raise CLIError("--include-resumable goes with --prune")
    on_interrupt("entries finished before it are kept, and the finished shards of the one being built: "
                 "rerun the same command to resume")
    bb = api.BackboneOptions(a.backbone or "minilm", a.layer, a.layer_combine, a.max_length, a.trust_remote_code,
                             a.device, a.precision, a.token_types)
    api.build_cache(a.data, bb, [s.strip() for s in a.splits.split(",")], a.text_field, a.label_field,
                    a.cache_dir, a.rebuild_cache, progress=not a.quiet and sys.stderr.isatty(), shard=a.shard,
                    pair_field=a.text_pair_field, cache_log=api._stderr)
    return 0


def _building_options(a: argparse.Namespace) -> list[str]:
    """The options of `cache` given with values other than their defaults that only building an entry reads."""
    defaults = vars(_parser().parse_args(["cache", "--list"]))
    folder = {"command", "data", "list", "prune", "remove", "json", "verify", "include_resumable", "cache_dir"}
    flag = {"token_types": "--no-token-types"}
    return [flag.get(k, _flag(k)) for k, v in vars(a).items()
            if k not in folder and k in defaults and v != defaults[k]]


def _cache_folder(a: argparse.Namespace) -> int:
    """--list / --prune / --remove of the cache folder."""
    from .cache import NotRemoved, default_root
    from .extract.entries import kept_lines, prune, remove_entries, scan, size_text

    root = a.cache_dir or default_root()
    if root.exists() and not root.is_dir():
        raise CLIError(f"{root}: a file, not a cache folder; give --cache-dir a folder")
    failed = None
    if a.prune or a.remove:
        try:
            rows = remove_entries(root, a.remove) if a.remove else prune(root, include_resumable=a.include_resumable,
                                                                          verify=a.verify)
        except NotRemoved as e:  # said after what was removed; the command then fails with it
            rows, failed = e.removed, e
    else:
        rows = scan(root, a.verify)
    if a.json:
        print(json.dumps([e.row() for e in rows], indent=2, allow_nan=False))
    elif a.prune or a.remove:
        for e in rows:
            what = ", ".join(x for x in (e.kind, e.status, e.model, f"{e.examples:,} examples" if e.examples is not None
                                         else "", e.source) if x)
            print(f"removed {e.path.name} ({what}, {size_text(e.bytes)})")
        if a.prune:
            for line in kept_lines(root):
                print(line)
        print(f"{'pruned' if a.prune else 'removed'} {len(rows)} item(s), {size_text(sum(e.bytes for e in rows))} "
              f"freed in {root}")
    if failed is not None:
        raise failed
    if a.json or a.prune or a.remove:
        return 0
    if not rows:
        print(f"{root}: no cache entries")
        return 0
    from rich.table import Table

    t = Table(title=f"feature cache {root}", title_justify="left")
    for col in ("key", "status", "model", "layers", "max len", "precision", "dtype", "examples", "tokens", "size",
                "created", "source"):
        t.add_column(col)
    for e in rows:
        status = e.status + (f" ({e.shards}; {e.sweep})" if e.kind == "sweep" else f" ({e.shards} shards)" if e.shards
                             else "")
        examples = "" if e.examples is None else f"{e.examples:,}" + (f" {e.input}" if e.input.startswith("pairs") else "")
        t.add_row(e.path.name[:16] + ("…" if len(e.path.name) > 16 else ""), status, e.model, e.layers,
                  str(e.max_length or ""), e.precision, e.dtype, examples,
                  f"{e.tokens:,}" if e.tokens is not None else "", size_text(e.bytes), e.created, e.source)
    _console(width=200).print(t)
    print(f"{len(rows)} item(s), {size_text(sum(e.bytes for e in rows))}; --prune removes "
          f"{sum(e.removable for e in rows)} of them (interrupted builds with no finished shard, leftovers, unreadable "
          f"entries); --include-resumable also the {sum(e.resumable for e in rows)} holding finished shards or "
          f"an interrupted sweep's finished points; --remove KEY deletes the entries you choose")
    return 0


def cmd_pretrain(a: argparse.Namespace) -> int:
    from .conv.encoder import EncoderConfig
    from .conv.pretrain import PretrainConfig, pretrain

    if a.output.exists() and not a.output.is_dir():
        raise CLIError(f"--output {a.output}: is a file; give a folder for the checkpoint (it is created)")
    on_interrupt(lambda: _pretrain_kept(a.output))
    pretrain(a.output, a.corpus, _given(a, EncoderConfig), _given(a, PretrainConfig), a.resume, a.text_field,
             log=lambda s: print(s, flush=True))
    return 0


def _pretrain_kept(output: Path) -> str:
    """What an interrupted pretrain leaves in `output`: its last complete checkpoint, or none yet."""
    from .conv.pretrain import LATEST

    if (output / LATEST).is_file():
        return (f"{output} keeps its last complete checkpoint ({(output / LATEST).read_text().strip()}): --resume "
                f"continues from it")
    return "no checkpoint was written yet; the same command starts again"


def cmd_sweep(a: argparse.Namespace) -> int:
    from . import api
    from .sweep import Grid, run_sweep

    _overwrite_needs_output(a)
    if a.layer is not None:
        raise CLIError("sweep: give the layers to try with --layers (a comma list), not --layer")
    if a.rebuild_cache:
        raise CLIError("sweep: every point reads the cache, so --rebuild-cache would extract once per point; rebuild "
                       "it first with `frozentune cache DATA --rebuild-cache` (with the same --backbone and a --layer)")
    grid = Grid.parse(a.methods, a.layers, a.lr, a.weight_decay, a.seeds)
    bb = api.BackboneOptions(a.backbone or "minilm", None, a.layer_combine, a.max_length, a.trust_remote_code,
                             a.device, a.precision, a.token_types)
    from .sweep import journal

    journal.current = None  # another command's in this process (tests, a notebook)
    on_interrupt(lambda: journal.interrupt_note(a.restart))
    points = grid.points()
    print(f"sweep: {len(points)} points ({len(grid.methods)} method(s) × {len(grid.layers)} layer setting(s) × "
          f"{len(grid.lrs)} lr × {len(grid.weight_decays)} weight decay × {len(grid.seeds)} seed(s)) on {a.data}",
          flush=True)
    result = run_sweep(grid, a.data, bb, a.output, a.shots, a.max_train, a.text_field, a.label_field, a.cache_dir,
                       train_cfg={"fallback": a.fallback} if a.fallback else None,
                       overwrite=a.overwrite, log=lambda s: print(s, flush=True), pair_field=a.text_pair_field,
                       resume=not a.restart)
    from .sweep.run import markdown

    print(markdown(result, a.data))
    return 0


def _serve_unused(given: dict, kinds: set[str]) -> list[str]:
    """Lines naming the serve options given (ServeOptions fields) for a kind of task the server does not
    serve: its help says which kind an option is for ("generate: ...", "classify: ...", "explain: ...")."""
    from .serve import ServeOptions

    lines = []
    for kind, words, marks in (("generate", "generation", ("generate:",)), ("classify", "classification", ("classify:",)),
                               ("explain", "explaining", ("explain:",))):
        unused = [_flag(f.name) for f in dataclasses.fields(ServeOptions)
                  if f.name in given and f.metadata["help"].startswith(marks)]
        if kind not in kinds and unused:
            lines.append(f"serve: {', '.join(unused)} not used: no {words} task is served")
    return lines


def cmd_serve(a: argparse.Namespace) -> int:
    # what an interrupt before the server is up leaves ("nothing was saved" was said: serve saves nothing)
    on_interrupt("the server had not started; no request was answered")
    # SIGHUP as SIGTERM for the whole command: set around serve() alone, a hangup while the models loaded
    # killed the process with no line
    with _hangup_as_interrupt():
        return _serve_command(a)


def _serve_command(a: argparse.Namespace) -> int:
    from .serve import Engine, ServeOptions
    from .serve.app import serve

    given = {f.name: getattr(a, f.name) for f in dataclasses.fields(ServeOptions) if getattr(a, f.name) is not None}
    try:
        options = ServeOptions(**given).validate()
    except ValueError as e:
        raise CLIError(str(e)) from None
    if not 0 <= a.port < 65536:
        raise CLIError(f"--port {a.port}: give a port from 1 to 65535 (0: one the system picks, said at start)")
    if not a.shutdown_grace >= 0 or a.shutdown_grace == float("inf"):  # nan fails the first test
        raise CLIError(f"--shutdown-grace {a.shutdown_grace}: give a number of seconds, 0 or more")
    from .api import _stderr
    from .serve import allocator
    from .serve.app import listen_socket
    try:  # from a command line, main has already started again where a library is to be preloaded
        chosen = allocator.plan(a.allocator, can_restart=False)  # (_allocator_before_imports); here: said
    except allocator.AllocatorError as e:
        raise CLIError(str(e)) from None
    _stderr(f"allocator: {chosen.note}")
    try:
        sock = listen_socket(a.host, a.port)  # before the models load: a port in use is said at once
    except ValueError as e:
        raise CLIError(str(e)) from None
    try:
        engine = Engine.load(a.models, a.device, a.precision, options, log=_stderr)
    except BaseException:
        sock.close()
        raise
    kinds = {t.kind for t in engine.tasks.values()} | ({"explain"} if any(t.explains for t in engine.tasks.values()) else set())
    for line in _serve_unused(given, kinds):
        _stderr(line)  # accepted and silent before
    on_interrupt("the server stopped accepting and answered the requests in flight")

    at_once: list[bool] = []  # a second interrupt came: the server stopped without waiting

    def cut(n: int) -> None:  # said in the interrupt's one line, in place of "answered the requests in flight"
        many = f"{n} request{'s' if n > 1 else ''}"
        if at_once:
            on_interrupt(f"the server stopped at once on the second interrupt: {many} in flight {'were' if n > 1 else 'was'} "
                         f"cut off (answered 503); one Ctrl-C waits for them")
            return
        on_interrupt(f"the server stopped accepting, and {many} still running after --shutdown-grace "
                     f"{a.shutdown_grace:g} s {'were' if n > 1 else 'was'} cut off (answered 503); give more seconds "
                     f"to let them finish")

    def forced() -> None:  # (cut, where requests were in flight, then says how many)
        at_once.append(True)
        on_interrupt("the server stopped at once on the second interrupt (no request was in flight)")

    serve(engine, a.host, a.port, a.access_log, log=_stderr, sock=sock, grace_s=a.shutdown_grace, on_cut=cut,
          on_forced=forced)
    return 0


@contextlib.contextmanager
def _hangup_as_interrupt():
    """SIGHUP (the terminal closed) handled as SIGTERM is: the server stops gracefully (serve captures it),
    then the command ends with the interrupt's line and status 129; before the server is up (the models
    loading), it ends there with that line. Left alone, it killed the process at once. Not where SIGHUP is
    ignored (nohup), nor off the main thread (tests' in-process runs)."""
    if (not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGHUP) is signal.SIG_IGN):
        yield
        return
    previous = signal.signal(signal.SIGHUP, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def cmd_export(a: argparse.Namespace) -> int:
    from .api import _stderr

    on_interrupt("nothing was written")
    if a.format == "onnx":
        from .export.onnx import export_onnx

        export_onnx(a.model, a.output, a.name, a.overwrite, log=_stderr)
        return 0
    if a.name:
        raise CLIError("--name names the heads of an ONNX graph; --format peft writes one adapter")
    if len(a.model) != 1:
        raise CLIError(f"--format peft writes one adapter: give one --model (got {len(a.model)})")
    from .export.peft import export_peft

    export_peft(a.model[0], a.output, a.overwrite, log=_stderr)
    return 0


def cmd_relabel(a: argparse.Namespace) -> int:
    from .api import _stderr
    from .relabel import RelabelError, relabel

    if a.overwrite and a.output is None:
        raise RelabelError("--overwrite replaces a model saved at --output; without --output the labels are renamed "
                           "in place, which needs no --overwrite")
    on_interrupt("nothing was changed")
    relabel(a.model, a.rename, a.output, a.overwrite, log=_stderr)
    return 0


def cmd_calibrate(a: argparse.Namespace) -> int:
    from .calibrate import CalibrateError, calibrate

    if a.overwrite and a.output is None:
        raise CalibrateError("--overwrite replaces a model saved at --output; without --output the model is calibrated "
                             "in place, which needs no --overwrite")
    on_interrupt("nothing was changed")
    print(json.dumps(calibrate(a.model, a.data, a.split, a.output, a.overwrite, a.text_field, a.label_field,
                               a.text_pair_field, a.cache_dir, progress=sys.stderr.isatty(),
                               rebuild_cache=a.rebuild_cache), indent=2, allow_nan=False))
    return 0


def cmd_import(a: argparse.Namespace) -> int:
    from .api import _stderr
    from .export.peft import import_peft

    on_interrupt("nothing was written")
    import_peft(a.adapter, a.output, a.backbone, a.overwrite, log=_stderr)
    return 0


def _console(**kwargs):
    """A rich Console for results on stdout whose broken pipe (`| head -1`) is the BrokenPipeError main
    answers as every command does (exit 141), not rich's own SystemExit(1), which reads as a failure."""
    from rich.console import Console

    class ResultsConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return ResultsConsole(**kwargs)


NARROW = 72  # columns below which `list` prints options one by one, not as a table (measured: at 70 the table cut flags)


def cmd_env(a: argparse.Namespace) -> int:
    from . import env

    r = env.report(measure=not a.no_measure)
    print(json.dumps(r, indent=1) if a.json else "\n".join(env.lines(r)))
    return 0


def cmd_list() -> int:
    from rich.markup import escape
    from rich.padding import Padding
    from rich.table import Table

    con = _console()
    for name in list_methods():
        spec = get_method(name)
        rows = [(_flag(opt) if typ != "bool" else "--[no-]" + _flag(opt)[2:], typ, str(default), help_)  # both forms
                for opt, typ, default, help_ in describe_options(name)]
        if con.width < NARROW:  # a table there cuts flags and defaults to "…": one option after another instead
            con.print(f"{escape(name)} — {escape(spec.help)}")
            for flag, typ, default, help_ in rows:
                con.print(f"  {escape(flag)} ({typ}, default {escape(default)})")
                con.print(Padding(escape(help_), (0, 0, 0, 6)))
        else:
            t = Table(title=f"{name} — {spec.help}", title_justify="left", show_lines=False)
            for col in ("option", "type", "default", "help"):
                t.add_column(col)
            for row in rows:
                t.add_row(*map(escape, row))
            con.print(t)
        tasks = [t for t, ok in (("classification", spec.classifies), ("generation (e2e, webnlg)", spec.generates)) if ok]
        con.print("  tasks: " + ", ".join(tasks))
        if spec.layer is not None:
            con.print(f"  reads backbone layer {spec.layer} unless --layer says otherwise")
        if spec.classifies and spec.train_defaults:
            con.print("  training defaults: " + ", ".join(f"{_flag(k)} {v}" for k, v in spec.train_defaults.items()))
        if spec.generates and spec.generation_defaults:
            con.print("  training defaults for generation: "
                      + ", ".join(f"{_flag(k)} {v}" for k, v in spec.generation_defaults.items()))
    return 0


# what an interrupt of the running command leaves behind; commands that keep something set it
_on_interrupt = {"note": "nothing was saved"}
# what an interrupted eval / plot-concepts keeps: a cached model's states are extracted into the cache
CACHE_KEPT = ("nothing was saved but the cache: a cached model's finished cache shards are kept (a rerun resumes "
              "from them)")


def on_interrupt(note: str | Callable[[], str]) -> None:
    """Say what an interrupt of the running command keeps (printed in its one-line message); a function
    is asked when the interrupt comes (what a sweep keeps grows as its points finish)."""
    _on_interrupt["note"] = note


def _kept() -> str:
    note = _on_interrupt["note"]
    return note() if callable(note) else note


def _interrupt_in_chain(e: BaseException) -> BaseException | None:
    """The Interrupted / KeyboardInterrupt behind `e`, if a library caught the signal's exception and
    raised its own from it (transformers does when a signal lands inside one of its lazy imports)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, (Interrupted, KeyboardInterrupt)):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _report_interrupt(e: BaseException) -> int:
    """The one line an interrupted command prints; its exit status 128 + the signal."""
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    print(f"frozentune: interrupted by {signal.Signals(signum).name}; {_kept()}",
          file=sys.stderr, flush=True)
    return 128 + int(signum)


def _environment_line(e: OSError) -> str | None:
    """One line for an OSError that the machine's state caused, not the program (a file it may not read,
    a full disk, a read-only file system), saying what to do; None for any other (left as a traceback)."""
    import errno

    path = e.filename if e.filename is not None else "a file"
    if e.errno in (errno.EACCES, errno.EPERM) and e.filename is not None:
        # the folder that shuts the way, not a file inside it (which may not even exist: sweep.json looked for)
        whole = Path(os.path.abspath(e.filename))
        path = next((str(a) for a in reversed(whole.parents) if a.exists() and not os.access(a, os.R_OK | os.X_OK)),
                    e.filename)
        return (f"{path}: permission denied; give this user access to it (ls -ld {path} shows who may read and "
                f"write it), or choose another path")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"{path}: no space left on its device ({e.strerror}); free some there (frozentune cache --prune "
                f"removes unfinished cache builds, cache --remove KEY the entries you choose) or choose another place")
    if e.errno == errno.EROFS:
        return f"{path}: on a read-only file system; choose a place that can be written"
    from .cache import fd_advice

    if (advice := fd_advice(e)) is not None:
        return f"{path}: {advice}"
    return None


def _memory_line(e: BaseException) -> str | None:
    """One line for running out of memory, what a memory limit (ulimit -v, a container's) or a full machine
    gives: numpy's MemoryError, torch's allocator RuntimeError, CUDA's OutOfMemoryError, a weights file that
    could not be mapped, a shared library that could not be (a lazy import), a thread that could not start.
    They were tracebacks. None for any other error. Building the details may itself run out of memory: then
    the line without them."""
    said = _one_line(e)
    if isinstance(e, RuntimeError) and "can't start new thread" in said:
        return ("could not start a thread: the process is at its memory or thread limit (ulimit -v, ulimit -u); "
                "raise the limit, or set OMP_NUM_THREADS lower")
    if not (out_of_memory(e) or (isinstance(e, ImportError) and "failed to map segment" in said)):
        return None
    advice = ("lower --batch-size or --max-length, give fewer texts at a time, or run where there is more memory "
              "(a limit below about 1.5 GB cannot hold the MiniLM pass at all)")
    try:
        asked = re.search(r"allocate (\d+) bytes", said)
        what = f"{int(asked.group(1)) / 2 ** 20:,.0f} MB asked for" if asked else said[:160]
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        room = "" if limit == resource.RLIM_INFINITY else f"; this process may use {limit / 2 ** 30:.1f} GB (ulimit -v)"
        try:
            import psutil

            room += f"; {psutil.virtual_memory().available / 2 ** 30:.1f} GB free on the machine"
        except Exception:  # not installed, or /proc/meminfo unreadable at the limit
            pass
        return f"out of memory ({what}{room}): {advice}"
    except Exception:  # MemoryError again, while saying so
        return f"out of memory: {advice}"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _method_asking_for_help(argv: list[str]) -> str | None:
    """The registered method of `train --method METHOD --help` (or -h), so that its help lists the
    method's options; None for anything else (an unknown method is left to the usual error)."""
    if not argv or argv[0] != "train" or not {"-h", "--help"} & set(argv):
        return None
    for i, arg in enumerate(argv):
        name = argv[i + 1] if arg == "--method" and i + 1 < len(argv) else arg[9:] if arg.startswith("--method=") else None
        if name in list_methods():
            return name
    return None


def _stdout_to_devnull() -> None:
    """Point standard output at /dev/null, so that Python's flush at exit meets no closed pipe (and
    prints no second error)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _allocator_before_imports(args: list[str]) -> None:
    """`frozentune serve` from a command line whose --allocator asks for a preloaded library: start
    again with it now, before torch is imported (0.9 s of a second start otherwise). Anything this
    cannot settle (an unknown or unavailable choice) is left to cmd_serve, which says it."""
    from .serve.allocator import CHOICES, AllocatorError, plan, restart

    choice = "auto"
    for i, arg in enumerate(args):  # the last one wins, as with argparse
        if arg == "--allocator" and i + 1 < len(args):
            choice = args[i + 1]
        elif arg.startswith("--allocator="):
            choice = arg.split("=", 1)[1]
    if choice not in CHOICES:
        return
    try:
        chosen = plan(choice, can_restart=True)
    except AllocatorError:
        return
    if chosen.preload is not None:
        restart(chosen, args)


# The commands that split their work across the processes of a launcher (torchrun, accelerate launch):
# the backbone pass (each rank extracts its share) and training (data parallel).
SPLIT_COMMANDS = ("cache", "train", "pretrain")


def _one_process_only(command: str) -> None:
    """Refuse a command that runs in one process when a launcher started several: every rank would
    do the whole work and print it again (eval's JSON twice, not valid JSON), or write the same
    folder (a sweep's ranks raced on --output) or port."""
    from .distributed import read_launch

    launch = read_launch(os.environ)
    if command in SPLIT_COMMANDS or command in ("list", "env") or launch.world_size == 1:  # env: each rank's own
        return
    raise CLIError(f"frozentune {command} runs in one process; under {launch.how} (world size {launch.world_size}) "
                   f"every process would do all of it again: run it without the launcher (what splits across "
                   f"processes is the backbone pass, `frozentune cache`, and training: {', '.join(SPLIT_COMMANDS)})")


def _writes_unicode(stream) -> bool:
    """Whether `stream` can take any character: a UTF-8 (or -16, -32) file, or one that holds str (StringIO)."""
    import codecs

    encoding = getattr(stream, "encoding", None)
    try:
        return encoding is None or codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


def _unencodable_escaped() -> None:
    """On a stdout / stderr that is not UTF-8 (PYTHONIOENCODING=latin-1, a Windows console, the C locale where
    Python does not switch to UTF-8), a character it has no byte for is written as \\u escape, not a
    UnicodeEncodeError traceback at the first "→" of a note (which lost every result after it)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure") and not _writes_unicode(stream):
            stream.reconfigure(errors="backslashreplace")


def _run(a: argparse.Namespace, rest: list[str]) -> int:
    """Dispatch one parsed command (main catches its errors)."""
    if a.command != "train" and rest:  # named with the command, whose --help lists its own options
        print(f"frozentune {a.command}: error: unrecognized arguments: {' '.join(rest)} "
              f"(see frozentune {a.command} --help)", file=sys.stderr)
        return 2
    _one_process_only(a.command)
    if str(getattr(a, "output", None)) == "-":  # it made a folder (or a picture) named "-", not standard output
        raise CLIError(f"--output -: {a.command} writes files, not to standard output; give a path")
    if sys.stdout is None and a.command in ("predict", "explain", "generate", "eval", "compare", "list", "env"):  # `>&-`: print
        # wrote nowhere and the command ended with 0, its results lost
        raise CLIError(f"standard output is closed, and {a.command} writes its results there; give it a file "
                       f"or a pipe (e.g. > results.jsonl)")
    if a.command == "train":
        return cmd_train(a, rest)
    if a.command == "list":
        return cmd_list()
    return {"eval": cmd_eval, "compare": cmd_compare, "predict": cmd_predict, "generate": cmd_generate, "explain": cmd_explain, "cache": cmd_cache,
            "plot-concepts": cmd_plot_concepts, "pretrain": cmd_pretrain, "sweep": cmd_sweep,
            "serve": cmd_serve, "export": cmd_export, "import": cmd_import, "relabel": cmd_relabel,
            "calibrate": cmd_calibrate,
            "env": cmd_env}[a.command](a)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Exit status: 0 done; 2 a usage or data error (one line on stderr, no
    traceback); 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM (one line; what was kept)."""
    import threading

    _unencodable_escaped()
    # transformers' per-tensor "Loading weights" bars would bury the one line that matters; our own
    # progress (extraction, training) is shown instead. Read when transformers is first imported.
    if argv is None and sys.argv[1:2] == ["serve"]:
        _allocator_before_imports(sys.argv[1:])
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":  # imported already
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()

    try:  # building the parser imports the methods (torch): seconds in which Ctrl-C gave a traceback
        ap = _parser(_method_asking_for_help(sys.argv[1:] if argv is None else list(argv)))
        a, rest = ap.parse_known_args(argv)
    except KeyboardInterrupt:
        print("frozentune: interrupted by SIGINT while starting; nothing was done", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    _on_interrupt["note"] = "nothing was saved"
    previous = previous_int = None
    previous_hook = sys.unraisablehook
    sys.unraisablehook = interrupts.quiet_lost_interrupts
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored
            previous_int = signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    try:
        with pyterms.command_line():  # errors keep the flags they name (the Python API's say its arguments too)
            return _run(a, rest)
    except FrozentuneError as e:  # every error of frozentune's about the input, files or environment
        from .distributed import PeerLost
        from .train import Diverged
        kept = f"; {_kept()}" if isinstance(e, (PeerLost, Diverged)) else ""  # stopped part-way, as an interrupt does
        print(f"frozentune: error: {_one_line(e)}{kept}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of our output went away (`| head`): stop quietly, as Unix tools do
        _stdout_to_devnull()
        return 128 + signal.SIGPIPE
    except (KeyboardInterrupt, Interrupted) as e:
        return _report_interrupt(e)
    except OSError as e:
        if (line := _environment_line(e)) is None:
            raise
        print(f"frozentune: error: {line}; {_kept()}", file=sys.stderr)
        return 2
    except Exception as e:
        if (line := _memory_line(e)) is not None:
            print(f"frozentune: error: {line}; {_kept()}", file=sys.stderr)
            return 2
        if (cause := _interrupt_in_chain(e)) is None:
            raise
        return _report_interrupt(cause)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        sys.unraisablehook = previous_hook
        interrupts.clear()


if __name__ == "__main__":
    sys.exit(main())

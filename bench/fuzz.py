"""Random inputs against every entry point a user feeds: the data readers, `api.train` then predict / explain /
eval on the saved model, the command line, generation (train, generate, eval), saved folders with their JSON
changed (and their labels renamed), damaged feature-cache folders, a changed sweep journal, and the server over
HTTP.

A finding is anything but frozentune's own answer: an exception that is not a FrozentuneError (whose message
says what to do), a command-line exit other than 0 / 2 or a traceback on stderr, an HTTP 5xx, a reply that is
not JSON or an error reply without "error", a server that stops answering; and, where the right answer is known,
a wrong one given without an error (a cache entry read whose examples are not an undamaged build's, a sweep point
whose figures are not its first run's, a relabelled model whose answers are not its own with the new names).
Refusals are counted, not findings: most random inputs are wrong on purpose; the summary lists the most frequent
refusals, to be read.

  OMP_NUM_THREADS=1 python bench/fuzz.py data --seed 0 --cases 300
  OMP_NUM_THREADS=1 python bench/fuzz.py train --seed 0 --cases 60       # ~2 s a case
  OMP_NUM_THREADS=1 python bench/fuzz.py cli --seed 0 --cases 300        # a case is cut after 20 s (counted)
  OMP_NUM_THREADS=1 python bench/fuzz.py generation --seed 0 --cases 60
  OMP_NUM_THREADS=1 python bench/fuzz.py http --seed 0 --cases 800       # `frozentune serve` on 127.0.0.1 only
  OMP_NUM_THREADS=1 python bench/fuzz.py model --seed 0 --cases 200      # saved folders with config.json changed
  OMP_NUM_THREADS=1 python bench/fuzz.py cache --seed 0 --cases 200      # feature-cache folders damaged
  OMP_NUM_THREADS=1 python bench/fuzz.py sweep --seed 0 --cases 60       # an interrupted sweep's journal changed

Models are tiny and seeded, built from a config as the tests build theirs (tests/conftest.py): nothing is
downloaded. Everything is written under --work (default /tmp/frozentune-fuzz). The HTTP part sends at most
--cases requests, one at a time, and stops after --seconds whatever is left. Exit status 1 where there was a
finding.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
WORDS = ["good", "bad", "film", "not", "very", "plot", "the", "a", "great", "awful"]
ODD = ["", "   \t", "\u200b\u200b", "line\nbreak\r\nhere", "tab\there,comma,\"quote\"", "\U0001F600 é ü 中文", "\x00nul"]


class Tally:
    """Cases done, refused (FrozentuneError, by the first words of the message) and findings (whole)."""

    def __init__(self) -> None:
        self.done, self.refused, self.findings = 0, Counter(), []

    def run(self, what: str, call: Callable[[], object]) -> bool:
        """Run call(); True when it returned. A FrozentuneError is a refusal, anything else a finding."""
        from frozentune.errors import FrozentuneError

        try:
            call()
        except FrozentuneError as e:
            self.refused[re.sub(r"\d+", "N", re.sub(r"/\S+", "PATH", str(e)))[:90]] += 1
            return False
        except Exception as e:  # noqa: BLE001 — the point: anything else is reported
            self.findings.append(f"{what}\n{type(e).__name__}: {e}\n{''.join(traceback.format_exc(limit=-6))}")
            return False
        self.done += 1
        return True

    def report(self, part: str, cases: int, seed: int) -> dict:
        calls = self.done + sum(self.refused.values()) + len(self.findings)
        print(f"\n{part}, seed {seed}: {cases} cases, {calls} calls: {self.done} answered, {sum(self.refused.values())} "
              f"refused (frozentune's own error), {len(self.findings)} finding(s)")
        for msg, n in self.refused.most_common(12):
            print(f"  {n:4d} × {msg}")
        for f in self.findings:
            print("=== finding\n" + f)
        return {"part": part, "seed": seed, "cases": cases, "calls": calls, "answered": self.done,
                "refused": sum(self.refused.values()), "findings": len(self.findings)}


def text(r: random.Random, odd: float) -> str:
    if r.random() < odd:
        return r.choice(ODD + ["a" * r.randint(1000, 20000)])
    return " ".join(r.choice(WORDS) for _ in range(r.randint(1, 12)))


def value(r: random.Random, odd: float, strings: Callable[[], str]) -> object:
    """A field's value: mostly `strings()`, at rate `odd` a value of another JSON kind."""
    if r.random() >= odd:
        return strings()
    return r.choice([None, 5, 1.5, True, ["x"], {"t": "x"}, float("nan"), 10 ** 30, -1, ""])


def write_rows(r: random.Random, path: Path, rows: list[dict], fmt: str, odd: float) -> None:
    """rows as jsonl / json / csv / tsv, with damage at rate `odd` (a cut line, a short or long row, no header,
    a duplicate column, Latin-1 bytes)."""
    if fmt == "jsonl":
        lines = [json.dumps(x, ensure_ascii=r.random() < 0.5) for x in rows]
        lines = [s[:-3] if r.random() < odd / 5 else s for s in lines]
        path.write_text("\n".join(lines) + ("\n" if r.random() < 0.8 else ""), encoding="utf-8")
        return
    if fmt == "json":
        path.write_text(json.dumps(rows if r.random() >= odd else {"data": rows}))
        return
    import csv

    keys = sorted({k for x in rows for k in x}) + (["label"] if r.random() < odd else [])
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="," if fmt == "csv" else "\t", lineterminator=r.choice(["\n", "\r\n"]))
    if r.random() >= odd:
        w.writerow(keys)
    for x in rows:
        cells = [x.get(k) if isinstance(x.get(k), str) else json.dumps(x.get(k)) for k in keys]
        w.writerow(cells[:-1] if r.random() < odd / 5 else cells + ["x"] if r.random() < odd / 5 else cells)
    encoding = r.choice(["utf-8", "utf-8", "utf-8-sig", "latin-1"] if r.random() < odd else ["utf-8"])
    try:
        path.write_bytes(buf.getvalue().encode(encoding))
    except UnicodeEncodeError:
        path.write_bytes(buf.getvalue().encode("utf-8"))


def classification_files(r: random.Random, folder: Path, odd: float) -> tuple[str, dict]:
    """A random dataset (one file, or a folder of split files) and the fields it uses."""
    fmt = r.choice(["jsonl", "json", "csv", "tsv"])
    fields = {"text_field": r.choice(["text", "sentence"]), "label_field": r.choice(["label", "y"]),
              "pair_field": r.choice([None, None, "hypothesis"])}
    labels = r.choice([["pos", "neg"], ["a", "b", "c"], ["0", "1"], ["x"], [str(i) for i in range(30)]])

    def rows(n: int) -> list[dict]:
        out = []
        for i in range(n):
            x = {fields["text_field"]: value(r, odd, lambda: text(r, odd)),
                 fields["label_field"]: value(r, odd, lambda: labels[i % len(labels)] if r.random() < 0.7
                                              else r.choice(labels))}
            if fields["pair_field"]:
                x[fields["pair_field"]] = value(r, odd, lambda: text(r, odd))
            out.append({k: v for k, v in x.items() if r.random() >= odd / 10})
        return out

    if r.random() < 0.5:
        path = folder / f"data.{fmt}"
        write_rows(r, path, rows(r.randint(0, 60)), fmt, odd)
        return str(path), fields
    for split in r.sample(["train", "validation", "test"], r.randint(1, 3)):
        write_rows(r, folder / f"{split}.{fmt}", rows(r.randint(0, 40)), fmt, odd)
    return str(folder), fields


def part_data(args) -> dict:
    from frozentune import data as D

    r, tally = random.Random(args.seed), Tally()
    for case in range(args.cases):
        folder = fresh(args.work / "data" / f"c{case}")
        odd = r.choice([0.0, 0.0, 0.05, 0.2])
        target, fields = classification_files(r, folder, odd)
        if odd and r.random() < 0.3:
            fields = {**fields, r.choice(list(fields)): "missing"}
        kw = {"seed": r.randint(0, 3), "shots": r.choice([None, None, None, 1, 2, 5, 100, 0, -1]),
              "max_train": r.choice([None, None, None, 1, 3, 10, 0]), "carve_below": r.choice([0, 0, 1000])}
        if kw["shots"] is not None and r.random() < 0.8:
            kw["max_train"] = None
        first = next(iter(sorted(folder.iterdir())))
        tally.run(f"load_classification({target!r}, **{fields | kw})", lambda: D.load_classification(target, **fields, **kw))
        tally.run(f"read_texts({str(first)!r})", lambda: D.read_texts(first, fields["text_field"], fields["pair_field"]))
    return tally.report("data", args.cases, args.seed)


def fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def tiny_bert(work: Path) -> Path:
    from conftest import make_tiny_bert

    folder = work / "tiny_bert"
    return folder if (folder / "config.json").exists() else make_tiny_bert(folder)


TRAIN_OPTIONS = {"space": [{}, {"concept_dim": 1}, {"masked_mean": False}], "ytuning": [{}, {"layers": 1, "k": 1}],
                 "selfexplain": [{}, {"max_span_width": 1}, {"special_tokens": "include"}],
                 "prefix": [{}, {"prefix_length": 2}]}
EXPLAINS = ("space", "ytuning", "selfexplain")


def part_train(args) -> dict:
    from frozentune import api

    r, tally, bert = random.Random(args.seed), Tally(), tiny_bert(args.work)
    cache = args.work / "cache"
    for case in range(args.cases):
        folder = fresh(args.work / "train" / f"c{case}")
        target, fields = classification_files(r, folder, r.choice([0.0, 0.0, 0.0, 0.02]))
        method = r.choice(["probe", "space", "ytuning", "selfexplain", "finetune", "contrastive", "prefix"])
        options = r.choice(TRAIN_OPTIONS.get(method, [{}]))
        cfg = {"epochs": r.choice([1, 2]), "batch_size": r.choice([2, 8, 64]), "min_steps": r.choice([0, 5, 20]),
               "cv_folds": r.choice([2, 5, 0]), "seed": r.randint(0, 5)}
        cfg |= {"cv_below": r.choice([0, 5, 1000])} if r.random() < 0.2 else {}
        cfg |= {"steps": r.choice([1, 3])} if r.random() < 0.15 else {}
        cfg |= {"average_folds": r.choice(["on", "off"])} if r.random() < 0.1 else {}
        model = folder / "model"
        texts = [text(r, 0.05) for _ in range(r.randint(1, 4))]
        texts = [(t, text(r, 0.05)) for t in texts] if fields["pair_field"] else texts
        said = f"train({method!r}, {target!r}, options={options}, train_cfg={cfg}, {fields})"
        trained = tally.run(said, lambda: api.train(
            method, target, api.BackboneOptions(str(bert), max_length=r.choice([16, 64, 128])), options, cfg, model,
            cache_root=cache, progress=False, log=None, shots=r.choice([None, None, None, 1, 2]), **fields))
        if trained:
            quiet = lambda s: None  # noqa: E731
            tally.run(f"predict after {said}", lambda: api.predict(model, texts, log=quiet,
                                                                   top_classes=r.choice([None, 1, 50])))
            tally.run(f"explain after {said}", lambda: api.explain(
                model, texts, top=r.choice([1, 5, 100]), log=quiet,
                occlusion=method not in EXPLAINS or r.random() < 0.2))
            tally.run(f"evaluate after {said}", lambda: api.evaluate_model(
                model, target, cache_root=cache, progress=False, log=quiet, pair_field=fields["pair_field"]))
        shutil.rmtree(folder, ignore_errors=True)
    return tally.report("train", args.cases, args.seed)


class Cut(Exception):
    """A command line case past its time (counted apart: a random --epochs can ask for hours)."""


def _cut(signum, frame) -> None:
    raise Cut()


def trec_slice(work: Path, train: int = 60, test: int = 20) -> Path:
    """The first `train` and `test` TREC questions, as a folder of split files."""
    folder = work / f"trec{train}-{test}"
    if not (folder / "test.jsonl").exists():
        folder.mkdir(parents=True, exist_ok=True)
        shared = Path(os.environ.get("FROZENTUNE_DATA", ROOT.parent / "shared" / "data")) / "trec"
        for split, n in (("train", train), ("test", test)):
            lines = (shared / f"{split}.jsonl").read_text().splitlines()[:n]
            (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


NUMBERS = ["-1", "0", "1", "2", "3", "0.5", "1e9", "nan", "inf", "-0", "abc", ""]
PLAUSIBLE = ["1", "2", "3", "0.5", "0.1"]
UNBOUNDED = {"--epochs", "--steps", "--min-steps", "--minutes", "--cv-repeats", "--max-length", "--prefix-length",
             "--top", "--cv-folds"}  # where 1e9 / inf would only make a case run for hours
FIXED = {"--data", "--backbone", "--output", "--model", "--method", "--overwrite", "--input", "--port", "--host"}


def run_cli(tally: Tally, argv: list[str], exits: Counter, seconds: int = 20) -> object:
    """`frozentune ARGV` in this process, cut after `seconds`; its exit (or "cut" / "exception") counted in `exits`.
    A traceback, an exception or an exit but 0 / 2 is a finding; exit 2 a refusal, by the last line on stderr;
    exit 0 answered. Returns the exit."""
    from frozentune import cli

    err = io.StringIO()
    signal.signal(signal.SIGALRM, _cut)
    signal.alarm(seconds)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    except Cut:
        code = "cut"
    except Exception as e:  # noqa: BLE001
        code = "exception"
        tally.findings.append(f"frozentune {' '.join(argv)}\n{type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        signal.alarm(0)
    exits[code] += 1
    said = err.getvalue()
    if code not in (0, 2, "cut", "exception") or "Traceback" in said:
        tally.findings.append(f"frozentune {' '.join(argv)} → exit {code}\n{said[-2000:]}")
    elif code == 0:
        tally.done += 1
    elif code == 2:  # argparse's usage errors and frozentune's own both exit 2: the last line says which
        last = said.strip().splitlines()[-1] if said.strip() else "(nothing on stderr)"
        tally.refused[re.sub(r"\d+", "N", re.sub(r"/\S+", "PATH", last))[:90]] += 1
    return code


def likely_values(work: Path, data: str, adapter: Path) -> dict[str, list[str]]:
    """For the cli part: values a user would give each option whose default says nothing of its kind (None), so
    that more cases get past the option checks to the work behind them (most random words are refused there)."""
    return {"--batch-size": ["4", "16"], "--checkpoint-every": ["1", "2"], "--cv-below": ["50", "1000"],
            "--cv-folds": ["0", "2", "3"], "--cv-repeats": ["1", "2"], "--device": ["cpu", "auto"],
            "--dim": ["16", "32"], "--dropout": ["0.0", "0.1"], "--epochs": ["1", "2"],
            "--eval-batch-size": ["8", "64"], "--ffn-dim": ["32"], "--heads": ["2", "4"], "--kernel-size": ["3", "5"],
            "--label-field": ["label"], "--layer": ["-1", "1", "-2"], "--layers": ["1", "2"], "--log-every": ["1"],
            "--lr": ["1e-3", "1e-2"], "--mask-prob": ["0.15"], "--max-grad-norm": ["1.0"],
            "--max-new-tokens": ["2", "4"], "--max-test": ["2", "5"], "--max-train": ["30", "60"],
            "--max-validation": ["5", "10"], "--methods": ["probe", "probe,space"], "--min-steps": ["0", "10"],
            "--minutes": ["0.05"], "--name": ["a"], "--num-beams": ["1", "2"], "--patience": ["1", "3"],
            "--seed": ["0", "1"], "--seeds": ["0", "0,1"], "--shard": ["0/2", "1/2"], "--shots": ["2", "4"],
            "--splits": ["train", "test", "train,test"], "--steps": ["2", "5"], "--text-field": ["text"],
            "--top-classes": ["1", "3"], "--warmup": ["0.1"], "--warmup-steps": ["1"],
            "--weight-decay": ["0.0", "0.01"], "--dilation-cycle": ["2"], "--dilation-growth": ["2"],
            "--weight-dropout": ["0.0", "0.1"], "--errors": [str(work / "cli-errors.jsonl")],
            "--cache-dir": [str(work / "cli-cache2")], "--rename": ["HUM=person", "LOC=place"],
            "--source-field": ["source"], "--target-field": ["target"], "--corpus": [f"{data}/train.jsonl"],
            "--adapter": [str(adapter)], "--pair": ["what is it ?", "a dog"]}


def part_cli(args) -> dict:
    import argparse as ap_mod

    from frozentune import cli

    os.environ["FROZENTUNE_CACHE"] = str(args.work / "cli-cache")
    r, tally, bert, data = random.Random(args.seed), Tally(), str(tiny_bert(args.work)), str(trec_slice(args.work))
    os.chdir(fresh(args.work / "cli-cwd"))  # relative folders a random option names (--cache-dir 0) land here
    model, sweep = str(args.work / "cli-model"), str(args.work / "cli-sweep")
    models, adapter = serve_models(args.work), args.work / "cli-adapter"  # trained once, read by every case
    if older(adapter / "adapter_config.json", models / "gen"):
        from frozentune.export.peft import export_peft

        export_peft(models / "gen", adapter, overwrite=True, log=lambda s: None)
    parser = cli._parser(None)
    sub = next(a for a in parser._actions if isinstance(a, ap_mod._SubParsersAction))
    base = {"train": ["--data", data, "--backbone", bert, "--quiet", "--output", model, "--overwrite", "--method"],
            "predict": ["--model", model, "what is a dog ?", "who wrote it ?"],
            "explain": ["--model", model, "what is a dog ?"], "eval": ["--model", model, "--data", data],
            "cache": [data, "--backbone", bert],
            "sweep": ["--data", data, "--backbone", bert, "--methods", "probe", "--output", sweep, "--overwrite"],
            "generate": ["--model", str(models / "gen"), "name Aromi", "food cheap"],
            "export": ["--output", str(args.work / "cli-export"), "--overwrite"],
            "import": ["--format", "peft", "--adapter", str(adapter), "--output", str(args.work / "cli-import"),
                       "--overwrite"],
            "pretrain": ["--corpus", f"{data}/train.jsonl", "--output", str(args.work / "cli-pretrain"), "--steps", "2",
                         "--layers", "1", "--dim", "16", "--heads", "2", "--ffn-dim", "32"],
            "plot-concepts": ["--model", str(models / "space"), "--data", data, "--output", str(args.work / "cli.png")],
            "relabel": ["--model", str(args.work / "cli-relabel")],
            "compare": ["--model", model, "--model", str(models / "probe"), "--data", data],
            "calibrate": ["--model", str(args.work / "cli-calibrate"), "--data", data]}
    exports = [("onnx", "probe"), ("onnx", "space"), ("onnx", "ytuning"), ("peft", "gen"), ("peft", "probe"),
               ("onnx", "gen")]
    likely = likely_values(args.work, data, adapter)  # half the options drawn get one of these, not a random word
    exits: Counter = Counter()
    for _ in range(args.cases):
        command = r.choice(["train", "train", "train", "predict", "explain", "eval", "cache", "sweep", "generate",
                            "export", "import", "pretrain", "plot-concepts", "relabel", "compare", "calibrate"])
        argv = [command, *base[command]]
        if command == "train":
            argv.append(r.choice(["probe", "space", "ytuning", "selfexplain", "contrastive", "finetune"]))
        elif command == "export":
            kind, name = r.choice(exports)
            argv += ["--format", kind, "--model", str(models / name)]
        elif command == "pretrain":
            shutil.rmtree(args.work / "cli-pretrain", ignore_errors=True)
        elif command in ("relabel", "calibrate"):  # a fresh copy of the probe each time, changed in place or copied
            shutil.rmtree(args.work / f"cli-{command}", ignore_errors=True)
            shutil.copytree(models / "probe", args.work / f"cli-{command}")
        if command == "relabel":
            argv += ["--rename", *r.sample(["HUM=person", "LOC=place", "DESC=ENTY", "ENTY=DESC", "x=y", "HUM", "HUM=",
                                            "NUM=LOC", "HUM=a=b"], r.randint(1, 3))]
        options = [a for a in sub.choices[command]._actions if a.option_strings and a.dest != "help"]
        for action in r.sample(options, min(len(options), r.randint(0, 4))):
            flag = max(action.option_strings, key=len)
            if flag in FIXED or flag in argv:  # the command line refuses a flag given twice
                continue
            if action.nargs == 0:
                argv.append(flag)
                continue
            plausible = r.random() < 0.5
            count = action.nargs if isinstance(action.nargs, int) else r.randint(1, 2) if action.nargs == "+" else 1
            values = []
            for _ in range(count):
                v = (r.choice([*action.choices] + ([] if plausible else ["nope"])) if action.choices
                     else r.choice(likely[flag]) if plausible and flag in likely
                     else r.choice(PLAUSIBLE if plausible else NUMBERS)
                     if isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
                     else r.choice(["x", "", "-1", "0", "1", "a,b", "/nonexistent", "3", "0/2", "1/2", "2/2"]))
                values.append("2" if flag in UNBOUNDED and v in ("1e9", "inf") else str(v))
            argv += [flag, *values]
        run_cli(tally, argv, exits)
    return tally.report("cli", args.cases, args.seed) | {"exits": {str(k): v for k, v in exits.items()}}

ENTRY_FILES = ("states.bin", "ids.bin", "offsets.bin", "lengths.bin")


def entry_examples(path: Path) -> list[tuple[bytes, bytes]]:
    """Every example's (states, token ids) bytes of the complete entry at `path`, read as a run reads it."""
    from frozentune.cache import CachedStates

    entry = CachedStates(path)
    try:
        return [(entry.example(i).tobytes(), entry.token_ids(i).tobytes()) for i in range(len(entry))]
    finally:
        del entry


def damage(r: random.Random, root: Path) -> dict:
    """One random change to a feature-cache folder, as a disk, a sync tool, a kill or a user might make it: a JSON
    file changed (meta.json re-signed half the time, so the deeper checks are reached), a data file cut, grown,
    flipped or zeroed, a file deleted or a folder in its place, a shard record copied over another's, two entries'
    folders swapped, a stray file or folder. Returns what it did."""
    from frozentune.cache import meta_sha

    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    kind = r.choice(["json", "json", "json", "bin", "bin", "bin", "delete", "folder", "record", "swap", "stray"])
    jsons, bins = [p for p in files if p.suffix == ".json"], [p for p in files if p.suffix == ".bin"]
    if kind == "json" and jsons:
        path = r.choice(jsons)
        try:
            changed = mutate(r, json.loads(path.read_text()))
        except ValueError:
            changed = r.choice([None, 0, "x"])
        if path.name == "meta.json" and isinstance(changed, dict) and r.random() < 0.5:
            with contextlib.suppress(ValueError, TypeError):
                changed["meta_sha"] = meta_sha(changed)
        path.write_text(json.dumps(changed))
        return {"changed": str(path.relative_to(root)), "to": changed}
    if kind == "bin" and bins:
        path = r.choice(bins)
        data, how = bytearray(path.read_bytes()), r.choice(["cut", "grow", "flip", "zero"])
        at = r.randrange(len(data) + 1)
        if how == "cut":
            data = data[:at]
        elif how == "grow":
            data += bytes(r.randrange(256) for _ in range(r.randint(1, 64)))
        elif data:
            at = min(at, len(data) - 1)
            end = at + 1 if how == "flip" else min(len(data), at + r.randint(1, 4096))
            data[at:end] = bytes(b ^ 0x5A for b in data[at:end]) if how == "flip" else bytes(end - at)
        path.write_bytes(bytes(data))
        return {how: str(path.relative_to(root)), "at": at}
    if kind in ("delete", "folder") and files:
        path = r.choice(files)
        path.unlink()
        if kind == "folder":
            path.mkdir()
        return {kind: str(path.relative_to(root))}
    records = [p for p in files if p.name.startswith("shard-")]
    if kind == "record" and len(records) > 1:
        a, b = r.sample(records, 2)
        shutil.copyfile(a, b)
        return {"record": str(a.relative_to(root)), "over": str(b.relative_to(root))}
    folders = [p for p in sorted(root.iterdir()) if p.is_dir() and "." not in p.name]
    if kind == "swap" and len(folders) > 1:
        a, b = r.sample(folders, 2)
        a.rename(root / "swap")
        b.rename(a)
        (root / "swap").rename(b)
        return {"swapped": [a.name, b.name]}
    stray = r.choice([root / "0123abcd.lock", root / "x.partial-999999-ab", root / "notakey", root / "a.building",
                      root / "0123abcd.building" / "plan.json", *(f / ".active" for f in folders[:1])])
    stray.parent.mkdir(parents=True, exist_ok=True)
    if stray.suffix:
        stray.write_text(r.choice(["", "pid 1", "{}", "\x00"]))
    else:
        stray.mkdir(exist_ok=True)
        (stray / "meta.json").write_text("{}")
    return {"stray": str(stray.relative_to(root))}


def part_cache(args) -> dict:
    """Feature-cache folders (complete entries, and interrupted builds split in two parts with half their shards) with
    one to three random changes (damage), then: `cache --list` / `--prune` / `--list --verify`, a build or resume of
    every entry (in one process or as a part), a rebuild, a probe trained on it. A finding is anything but
    frozentune's own error, and any entry a run reads whose examples are not the ones an undamaged build made."""
    from frozentune import api

    # several shards to an entry: a shard is made of whole forward batches (≤ 128 rows), each here past 500 tokens
    os.environ["FROZENTUNE_SHARD_TOKENS"] = "500"
    r, tally, bert = random.Random(args.seed), Tally(), str(tiny_bert(args.work))
    data = str(trec_slice(args.work, 1000, 300))
    exits: Counter = Counter()
    backbone = api.BackboneOptions(bert, max_length=32)
    clean, partial = args.work / "cache-clean", args.work / "cache-partial"
    if not clean.is_dir():
        api.build_cache(data, backbone, "train,test", cache_root=clean, progress=False, log=None)
    if not partial.is_dir():
        api.build_cache(data, backbone, "train,test", cache_root=partial, progress=False, log=None, shard="0/2")
    truth = {p.name: entry_examples(p) for p in clean.iterdir() if (p / "meta.json").is_file()}
    wrong: list[str] = []

    def built(shard: str | None = None, rebuild: bool = False) -> None:
        rows = api.build_cache(data, backbone, "train,test", cache_root=root, progress=False, log=None, shard=shard,
                               rebuild=rebuild)
        for row in rows:
            if row["path"] is not None and entry_examples(Path(row["path"])) != truth.get(Path(row["path"]).name):
                wrong.append(f"{row['split']} read from {row['path']} differs from the undamaged build's")

    for case in range(args.cases):
        root = args.work / "cache-case"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(clean if r.random() < 0.6 else partial, root)
        changes = [damage(r, root) for _ in range(r.choice([1, 1, 1, 2, 3]))]
        before, wrong[:] = len(tally.findings), []
        run_cli(tally, ["cache", "--list", "--cache-dir", str(root)] + (["--verify"] if r.random() < 0.3 else []), exits)
        if r.random() < 0.2:
            run_cli(tally, ["cache", "--prune", "--cache-dir", str(root)] + r.choice([[], ["--verify"]]), exits)
        if r.random() < 0.2:
            tally.run("a probe trained", lambda: api.train("probe", data, backbone, {}, {"epochs": 1},
                                                           args.work / "cache-model", cache_root=root,
                                                           progress=False, log=None, overwrite=True))
        tally.run("build", lambda: built(r.choice([None, None, None, "0/2", "1/2"])))
        if r.random() < 0.3:
            tally.run("build with rebuild", lambda: built(rebuild=True))
        run_cli(tally, ["cache", "--prune", "--cache-dir", str(root), "--json"], exits)
        tally.findings += [f"{w} (no error was raised)" for w in wrong]
        for i in range(before, len(tally.findings)):
            tally.findings[i] += f"\nthe changes: {json.dumps(changes, default=str)[:1500]}"
    return tally.report("cache", args.cases, args.seed) | {"exits": {str(k): v for k, v in exits.items()}}


def part_sweep(args) -> dict:
    """The journal an interrupted sweep leaves (its finished points, one JSON line each) with one to three random
    changes to its lines (a value of another kind, a line cut short, repeated, moved or removed), then the same
    sweep run again (it reuses the rows it can read and trains the others), the best model it saves used, and
    `cache --list`: frozentune's own error or an answer."""
    from frozentune import api
    from frozentune.sweep import journal as J
    from frozentune.sweep.grid import Grid
    from frozentune.sweep.run import run_sweep

    r, tally, bert, data = random.Random(args.seed), Tally(), str(tiny_bert(args.work)), str(trec_slice(args.work))
    backbone, exits = api.BackboneOptions(bert, max_length=32), Counter()
    grid = Grid.parse("probe,space,ytuning", lrs="0.01,0.001", seeds="0,1")
    kept = args.work / "sweep-kept"  # the cache folder of a sweep whose journal was kept (as an interrupt keeps it)
    truth_file = args.work / "sweep-kept-rows.json"

    def scores(rows: list[dict]) -> dict[str, list]:
        """Each point's (score, test accuracy), by its setting: what the table and the best pick are made of."""
        return {f"{x['method']} {x['layer']} {x['lr']} {x['weight_decay']} {x['seed']}": [x["score"], x["test_accuracy"]]
                for x in rows}

    if not any(kept.glob("sweep-*.points.jsonl")) or not truth_file.is_file():
        finish = J.Journal.finish
        J.Journal.finish = J.Journal.close  # the journal stays, every point in it
        try:
            done = run_sweep(grid, data, backbone, args.work / "sweep-out", cache_root=fresh(kept),
                             train_cfg={"epochs": 1}, overwrite=True, log=lambda s: None)
        finally:
            J.Journal.finish = finish
        truth_file.write_text(json.dumps(scores(done.rows)))
    truth, journal = json.loads(truth_file.read_text()), next(kept.glob("sweep-*.points.jsonl"))
    for case in range(args.cases):
        root = args.work / "sweep-case"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(kept, root)
        path = root / journal.name
        lines, changes = path.read_bytes().splitlines(), []
        for _ in range(r.choice([1, 1, 2, 3])):
            i, how = r.randrange(len(lines)), r.choice(["value", "value", "value", "cut", "again", "move", "drop"])
            if how == "value":
                with contextlib.suppress(ValueError):
                    lines[i] = json.dumps(mutate(r, json.loads(lines[i]))).encode()
            elif how == "cut":
                lines[i] = lines[i][:r.randrange(len(lines[i]) + 1)]
            elif how == "again":
                lines.insert(r.randrange(len(lines) + 1), lines[i])
            elif how == "move":
                lines.insert(r.randrange(len(lines)), lines.pop(i))
            elif len(lines) > 1:
                del lines[i]
            changes.append({how: i, "line": lines[i].decode(errors="replace")[:300] if i < len(lines) else None})
        path.write_bytes(b"\n".join(lines) + b"\n")
        before, out = len(tally.findings), args.work / "sweep-case-out"
        run_cli(tally, ["cache", "--list", "--cache-dir", str(root)], exits)
        got: list = []
        if tally.run("the same sweep again", lambda: got.append(run_sweep(grid, data, backbone, out, cache_root=root,
                                                                            train_cfg={"epochs": 1}, overwrite=True,
                                                                            log=lambda s: None))):
            tally.run("the best point's model", lambda: api.predict(out / "best", ["what is a dog ?"], log=None))
            wrong = {k: v for k, v in scores(got[0].rows).items() if truth.get(k) != v}
            if wrong:  # a point trained again gives its first run's figures (same seed): these were read as changed
                tally.findings.append(f"the same sweep again: {len(wrong)} point(s) with other figures than the "
                                      f"first run's, no error raised: {json.dumps(wrong)[:600]}")
        for i in range(before, len(tally.findings)):
            tally.findings[i] += f"\nthe changes: {json.dumps(changes)[:1500]}"
    return tally.report("sweep", args.cases, args.seed) | {"exits": {str(k): v for k, v in exits.items()}}


GEN_WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "name", "food", "area", "city", "eat", "type", "pub"]


def part_generation(args) -> dict:
    from frozentune.generation.run import DecodeOptions, evaluate_generation, generate_sources, train_generation

    r, tally, lms = random.Random(args.seed), Tally(), tiny_lms(args.work)

    def sentence(odd: float, least: int = 1) -> str:
        if r.random() < odd:
            return r.choice(["", "unknownword zzz é中文", " ".join(r.choice(GEN_WORDS) for _ in range(r.randint(200, 400)))])
        return " ".join(r.choice(GEN_WORDS) for _ in range(r.randint(least, 12)))

    for case in range(args.cases):
        folder = fresh(args.work / "generation" / f"c{case}")
        odd = r.choice([0.0, 0.0, 0.02, 0.1])
        sf, tf = r.choice([("source", "target"), ("src", "tgt"), ("document", "summary")])
        many = r.random() < 0.2

        def row() -> dict:
            x = {sf: value(r, odd / 5, lambda: sentence(odd)),
                 tf: [sentence(odd) for _ in range(r.randint(1, 3))] if many else sentence(odd)}
            return {k: v for k, v in x.items() if r.random() >= odd / 10}

        if r.random() < 0.5:
            target = folder / "pairs.jsonl"
            target.write_text("\n".join(json.dumps(row()) for _ in range(r.randint(2, 40))) + "\n")
        else:
            for split in r.sample(["train", "validation", "test"], r.randint(1, 3)):
                (folder / f"{split}.jsonl").write_text("\n".join(json.dumps(row()) for _ in range(r.randint(1, 20))))
            target = folder
        lm, method = r.choice(["llama", "llama", "bart"]), r.choice(["prefix", "prefix", "finetune"])
        options = r.choice([{}, {"prefix_length": 2}, {"prefix_length": 1, "reparam": False}]) if method == "prefix" else {}
        cfg = {"epochs": 1, "steps": r.choice([1, 2, 3]), "batch_size": r.choice([1, 2, 8]), "min_steps": 0}
        decoding = DecodeOptions(num_beams=r.choice([1, 2]), max_new_tokens=r.choice([1, 4, 8]))
        fields = (None, None) if sf == "source" and r.random() < 0.5 else (sf if r.random() >= odd else "nope", tf)
        model = folder / "model"
        said = f"train_generation({method!r}, {str(target)!r}, {lm}, options={options}, train_cfg={cfg}, fields={fields})"
        if tally.run(said, lambda: train_generation(method, str(target), str(lms[lm]), options, cfg, model,
                                                    max_test=r.choice([1, 3, None]), decoding=decoding,
                                                    log=lambda s: None, fields=fields)):
            tally.run(f"generate after {said}", lambda: generate_sources(
                model, [sentence(odd) for _ in range(r.randint(1, 3))], num_beams=r.choice([None, 1, 3]),
                max_new_tokens=r.choice([None, 1, 5])))
            tally.run(f"evaluate after {said}", lambda: evaluate_generation(
                model, str(target), max_test=2, source_field=fields[0], target_field=fields[1]))
        shutil.rmtree(folder, ignore_errors=True)
    return tally.report("generation", args.cases, args.seed)


def tiny_lms(work: Path) -> dict[str, Path]:
    from conftest import make_tiny_bart, make_tiny_llama

    lms = {"llama": work / "llama", "bart": work / "bart"}
    if not (lms["llama"] / "config.json").exists():
        make_tiny_llama(lms["llama"], GEN_WORDS)
    if not (lms["bart"] / "config.json").exists():
        make_tiny_bart(lms["bart"], GEN_WORDS)
    return lms


def older(made: Path, *sources: Path) -> bool:
    """Whether `made` (a file exported from the model folders `sources`) is absent or older than one of them (they
    were trained again since: saved_now)."""
    return not made.exists() or any(made.stat().st_mtime < (p / "model.safetensors").stat().st_mtime for p in sources)


def saved_now(folder: Path) -> bool:
    """Whether `folder` holds a model saved the way this frozentune saves one: its weights record what they were
    trained with (model.TRAINED_AS). A --work kept from an older frozentune's run is trained again, not read: its
    models would load unchecked, and the model part would report what this version refuses as findings."""
    from safetensors import safe_open

    from frozentune.model import TRAINED_AS

    try:
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return (folder / "result.json").exists() and TRAINED_AS in (f.metadata() or {})
    except Exception:  # noqa: BLE001 — absent or unreadable: train it
        return False


def serve_models(work: Path) -> Path:
    """Four tiny classifiers (probe, selfexplain, ytuning, space) on a TREC slice and a prefix of a tiny Llama
    ("gen"), trained once."""
    from frozentune import api
    from frozentune.generation.run import DecodeOptions, train_generation

    folder = work / "serve-models"
    for method in ("probe", "selfexplain", "ytuning", "space"):
        if not saved_now(folder / method):
            api.train(method, str(trec_slice(work)), api.BackboneOptions(str(tiny_bert(work))),
                      train_cfg={"fallback": "off"}, output=folder / method, overwrite=True,
                      cache_root=work / "cache", progress=False, log=None)
    if not saved_now(folder / "gen"):
        r = random.Random(0)
        pairs = fresh(work / "serve-pairs") / "pairs.jsonl"
        pairs.write_text("\n".join(json.dumps({"source": " ".join(r.choices(GEN_WORDS, k=6)),
                                               "target": " ".join(r.choices(GEN_WORDS, k=4))}) for _ in range(30)))
        train_generation("prefix", str(pairs), str(tiny_lms(work)["llama"]), {"prefix_length": 2},
                         {"steps": 3, "min_steps": 0}, folder / "gen", decoding=DecodeOptions(max_new_tokens=4),
                         log=lambda s: None, overwrite=True)
    return folder


def request_body(r: random.Random, kind: str, tasks: list[str]) -> dict:
    """Mostly a plausible request (70%), else fields of any kind, unknown ones among them."""
    def string() -> str:
        return r.choice(["what is a dog ?"] * 30 + ODD[:3] + ["who " * r.randint(1, 3000), "[SEP] [CLS]", "<b>x</b>"])

    def anything() -> object:
        return r.choice([string(), 0, -1, 10 ** 20, 2.5, True, None, [string() for _ in range(r.randint(0, 20))],
                         [[string()] * r.randint(0, 3)], {"text": string()}, [r.choice(tasks + ["nope", ""])]])

    keys = {"classify": ["texts", "text", "pairs", "pair", "tasks", "explain", "top", "occlusion", "top_classes"],
            "explain": ["texts", "text", "pairs", "pair", "tasks", "top", "occlusion", "top_classes"],
            "generate": ["prefix", "sources", "source", "num_beams", "max_new_tokens", "min_new_tokens"]}[kind]
    if r.random() >= 0.7:
        return {k: anything() for k in r.sample(keys + ["extra"], r.randint(0, 3))}
    if kind == "generate":
        body = {"prefix": "gen" if r.random() < 0.8 else r.choice(tasks + ["nope"])}
        body |= {"source": string()} if r.random() < 0.5 else {"sources": [string() for _ in range(r.randint(1, 6))]}
        for k in ("num_beams", "max_new_tokens", "min_new_tokens"):
            if r.random() < 0.3:
                body[k] = r.choice([1, 2, 4, 0, -1, 64, 10 ** 6])
        return body
    body: dict = {"text": string()} if r.random() < 0.5 else {"texts": [string() for _ in range(r.randint(1, 20))]}
    if r.random() < 0.5:
        body["tasks"] = r.sample(tasks, r.randint(1, len(tasks))) + (["nope"] if r.random() < 0.1 else [])
    for k in ("top", "top_classes"):
        if r.random() < 0.3:
            body[k] = r.choice([1, 3, 20, 1, 3, 20, 0, 21, -1, 100])
    body |= {"occlusion": True} if r.random() < 0.3 else {}
    body |= {"explain": True} if kind == "classify" and r.random() < 0.4 else {}
    return body


def part_http(args) -> dict:
    import httpx

    models = serve_models(args.work)
    tasks = sorted(p.name for p in models.iterdir())
    env = dict(os.environ, OMP_NUM_THREADS="1", FROZENTUNE_CACHE=str(args.work / "cache"))
    server = subprocess.Popen([sys.executable, "-m", "frozentune.cli", "serve", str(models), "--host", "127.0.0.1",
                               "--port", "0", "--max-texts", "16", "--max-top", "20"],
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    port, seen, t0 = None, [], time.monotonic()
    while port is None and time.monotonic() - t0 < 120 and server.poll() is None:
        seen.append(server.stderr.readline())
        port = (m := re.search(r"http://127\.0\.0\.1:(\d+)", seen[-1])) and int(m.group(1))
    if port is None:
        server.kill()
        raise SystemExit("the server did not start:\n" + "".join(seen))
    r, tally, statuses = random.Random(args.seed), Tally(), Counter()
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + args.seconds
    try:
        with httpx.Client(timeout=30) as client:
            for _ in range(args.cases):
                if time.monotonic() > deadline:
                    break
                kind, how = r.choice(["classify", "classify", "explain", "generate"]), r.random()
                url, sent = f"{base}/v1/{kind}", None
                try:
                    if how < 0.05:
                        reply = client.post(url, content=r.choice([b"{", b"[]", b"null", b"\xff\xfe", b"1e999"]),
                                            headers={"content-type": "application/json"})
                    elif how < 0.08:
                        reply = client.post(url, content=b"text=a", headers={"content-type": r.choice(
                            ["text/plain", "application/x-www-form-urlencoded", ""])})
                    elif how < 0.1:
                        reply = client.get(url)
                    else:
                        sent = request_body(r, kind, tasks)
                        reply = client.post(url, json=sent)
                except httpx.HTTPError as e:
                    tally.findings.append(f"{kind} {json.dumps(sent)[:300]}: no reply ({type(e).__name__}: {e})")
                    continue
                statuses[reply.status_code] += 1
                try:
                    answer = reply.json()
                except ValueError:
                    tally.findings.append(f"{kind} {json.dumps(sent)[:300]}: {reply.status_code}, not JSON: {reply.text[:200]}")
                    continue
                if reply.status_code >= 500 or (reply.status_code >= 400 and "error" not in answer):
                    tally.findings.append(f"{kind} {json.dumps(sent)[:300]} → {reply.status_code} {str(answer)[:300]}")
                elif reply.status_code >= 400:
                    tally.refused[f"{reply.status_code} " + re.sub(r"\d+", "N", answer["error"])[:80]] += 1
                else:
                    tally.done += 1
            health = client.get(f"{base}/health").status_code
    finally:
        server.terminate()
        server.wait(60)
    if health != 200:
        tally.findings.append(f"/health answered {health} after the requests")
    sent_n = sum(statuses.values())
    print(f"statuses: {dict(sorted(statuses.items()))}; /health after them: {health}")
    return tally.report("http", sent_n, args.seed) | {"statuses": {str(k): v for k, v in statuses.items()}}


def mutate(r: random.Random, node: object, depth: int = 0) -> object:
    """node with one random change somewhere in it: a key removed, a value of another kind, a list emptied."""
    if isinstance(node, dict) and node and (depth < 3 and r.random() < 0.7):
        key = r.choice(sorted(node))
        out = dict(node)
        if r.random() < 0.2:
            del out[key]
        else:
            out[key] = mutate(r, node[key], depth + 1)
        return out
    if isinstance(node, list) and node and r.random() < 0.6:
        i = r.randrange(len(node))
        return node[:i] + [mutate(r, node[i], depth + 1)] + node[i + 1:]
    return r.choice([None, 0, -1, 1.5, True, "x", "", [], {}, [node], {"v": node}, 10 ** 20, "fp64", "../x"])


def mutate_file(r: random.Random, path: Path) -> object:
    """JSON file `path` with one random change (mutate); returns what it now holds."""
    changed = mutate(r, json.loads(path.read_text()))
    path.write_text(json.dumps(changed))
    return changed


def run_on_changed_copy(tally: Tally, source: Path, folder: Path, edit: Callable[[Path], object],
                        calls: list[tuple[str, Callable[[], object]]]) -> None:
    """`source` copied to `folder`, changed by edit(folder) (which returns the change, for a finding's report),
    each (what, call) run in `tally`; the copy removed after."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder)
    changed, before = edit(folder), len(tally.findings)
    for what, call in calls:
        tally.run(what, call)
    for i in range(before, len(tally.findings)):
        tally.findings[i] += f"\nthe change: {json.dumps(changed)[:1500]}"
    shutil.rmtree(folder, ignore_errors=True)


RELABELLED: Counter = Counter()  # the model part's relabel calls: renamed (answers compared), refused (folder compared)


def relabelled(r: random.Random, tally: Tally, said: str, folder: Path) -> None:
    """`frozentune relabel` of a (changed) classifier folder with random renames. Oracle: where it answers, the
    folder predicts what it did before but for the names (same scores); where it refuses, the folder is unchanged."""
    from frozentune import api
    from frozentune.relabel import relabel

    texts, got = ["what is a dog ?", "where is Lima ?"], {}
    config = json.loads((folder / "config.json").read_text())
    labels = config.get("labels") if isinstance(config, dict) else None  # as changed: anything
    labels = [x for x in labels if isinstance(x, str)] if isinstance(labels, list) else []
    names = lambda: (r.choice(labels) if labels and r.random() < 0.1 else  # noqa: E731 (a collision)
                     r.choice(["", " x", "\n"]) if r.random() < 0.15 else  # not a name
                     r.choice(["person", "place", "a=b", "ünï 中", "x" * 300]) + str(r.randrange(1000)))
    old = r.sample(labels, min(len(labels), r.randint(1, 3))) if labels and r.random() < 0.9 else ["nobody"]
    asked = {o: names() for o in old}  # the oracle's own mapping, not the one relabel reports
    rename = asked if r.random() < 0.7 else [f"{o}={n}" for o, n in asked.items()]
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    tally.run(said + "predict before relabel", lambda: got.setdefault("before", api.predict(folder, texts, log=None)))
    if not tally.run(said + f"relabel {rename!r:.80}", lambda: got.setdefault("relabel", relabel(
            folder, rename, log=lambda s: None))):
        RELABELLED["refused"] += 1
        if {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} != before:
            tally.findings.append(f"{said}relabel {rename!r:.80} refused, but the folder changed")
        return
    if "before" not in got:  # predict refused the folder (e.g. its backbone's name changed): nothing to compare
        RELABELLED["renamed, predict refused before"] += 1
        return
    if not tally.run(said + "predict after relabel", lambda: got.setdefault("after", api.predict(folder, texts,
                                                                                                log=None))):
        tally.findings.append(f"{said}relabel {rename!r:.80} answered, and the folder that predicted before it no "
                              f"longer does")
        return
    RELABELLED["renamed, answers compared"] += 1
    mapped = {lab: asked.get(lab, lab) for lab in labels}
    want = [{"label": mapped[b["label"]], "scores": {mapped[k]: v for k, v in b["scores"].items()}}
            for b in got["before"]]
    if [{"label": a["label"], "scores": a["scores"]} for a in got["after"]] != want:
        tally.findings.append(f"{said}relabel {rename!r:.80}: the answers after it are not the ones before with the "
                              f"new names: {json.dumps(got['after'])[:300]} vs {json.dumps(want)[:300]}")


def part_model(args) -> dict:
    """Saved model folders with their config.json (or result.json) changed at random, an ONNX export's onnx.json, a
    PEFT adapter's JSON files (then imported) and a pre-training checkpoint's config.json (then resumed, and read by
    `train --method conv --init`):
    loading (as the server does too), predicting, explaining, generating and exporting must refuse with frozentune's
    own error or work."""
    from frozentune import api
    from frozentune.export.onnx import OnnxClassifier, export_onnx
    from frozentune.conv.pretrain import find_checkpoint, pretrain
    from frozentune.export.peft import export_peft, import_peft
    from frozentune.generation.run import generate_sources
    from frozentune.model import json_differences, trained_as
    from frozentune.registry import get_method, make_config
    from frozentune.serve.models import load_tasks

    r, tally, models = random.Random(args.seed), Tally(), serve_models(args.work)
    originals = {p.name: json.loads((p / "config.json").read_text()) for p in models.iterdir()}
    quiet = lambda s: None  # noqa: E731
    graph = args.work / "onnx-graph"  # the probe and space heads as one ONNX graph: its onnx.json is changed too
    if older(graph / "onnx.json", models / "probe", models / "space"):
        export_onnx([models / "probe", models / "space"], graph, overwrite=True, log=quiet)
    graph_meta, edits = json.loads((graph / "onnx.json").read_text()), []

    def labels_of(meta: object) -> object:
        """Each head's labels in an onnx.json (as changed: anything where they were)."""
        heads = meta.get("heads") if isinstance(meta, dict) else None
        return [h.get("labels") if isinstance(h, dict) else h for h in heads] if isinstance(heads, list) else heads

    checkpoint = args.work / "mlm-checkpoint"  # a tiny `frozentune pretrain` run: its config.json and `latest` too
    shape = {"arch": "light", "layers": 1, "dim": 32, "heads": 2, "ffn_dim": 64}
    if not (checkpoint / "latest").exists():
        pretrain(checkpoint, str(trec_slice(args.work) / "train.jsonl"), {**shape, "max_length": 32},
                 {"steps": 2, "batch_size": 8}, log=quiet)
    adapter = args.work / "peft-adapter"  # the prefix as a PEFT adapter: its JSON files are changed too
    if older(adapter / "adapter_config.json", models / "gen"):
        export_peft(models / "gen", adapter, overwrite=True, log=quiet)
    for case in range(args.cases):
        if r.random() < 0.1:
            def checkpoint_edit(folder: Path) -> object:
                if r.random() < 0.1:
                    (folder / "latest").write_text(latest := r.choice(["", "step-9", "../x", "step-0000002\nx"]))
                    return {"latest": latest}
                return mutate_file(r, find_checkpoint(folder) / "config.json")

            folder = args.work / "model" / f"mlm{case}"
            run_on_changed_copy(tally, checkpoint, folder, checkpoint_edit, [
                ("checkpoint changed: pretrain --resume",
                 lambda: pretrain(folder, None, {}, {"steps": 3}, resume=True, log=quiet)),
                ("checkpoint changed: train --method conv --init",
                 lambda: get_method("conv").encoder(make_config("conv", {**shape, "init": str(folder)}), 16))])
            continue
        if r.random() < 0.1:
            folder, out = args.work / "model" / f"adapter{case}", args.work / "model-import"
            shutil.rmtree(out, ignore_errors=True)
            run_on_changed_copy(tally, adapter, folder, lambda f: mutate_file(r, f / r.choice(
                ["adapter_config.json", "adapter_config.json", "frozentune_decoding.json"])), [
                ("adapter JSON changed: import", lambda: import_peft(folder, out, log=quiet))])
            continue
        if r.random() < 0.2:
            folder = args.work / "model" / f"onnx{case}"
            answered_before = tally.done
            edit = lambda f: edits.append(mutate_file(r, f / "onnx.json")) or edits[-1]  # noqa: E731
            run_on_changed_copy(tally, graph, folder, edit, [
                ("onnx.json changed: predict --onnx", lambda: OnnxClassifier(folder).predict(["what is a dog ?"]))])
            if tally.done > answered_before and labels_of(edits[-1]) != labels_of(graph_meta):  # the graph knows its own
                tally.findings.append(f"onnx.json changed: predict --onnx answered with other labels than the graph "
                                      f"was exported with: {json.dumps(labels_of(edits[-1]))[:300]}")
            continue
        name = r.choice(sorted(p.name for p in models.iterdir()))
        folder = args.work / "model" / f"c{case}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(models / name, folder)
        which = folder / r.choice(["config.json"] * 4 + ["result.json"])
        changed = mutate_file(r, which)
        said, before, answered_before = f"{name} with {which.name} changed: ", len(tally.findings), tally.done
        out = args.work / "model-export"
        shutil.rmtree(out, ignore_errors=True)
        tally.run(said + "serve's load", lambda: load_tasks([folder], None, None, quiet))
        if name == "gen":
            tally.run(said + "generate", lambda: generate_sources(folder, ["the cat sat"], max_new_tokens=3))
            tally.run(said + "export peft", lambda: export_peft(folder, out, log=quiet))
        else:
            if r.random() < 0.1:  # a second or two a graph
                tally.run(said + "export onnx", lambda: export_onnx([folder], out, log=quiet))
            tally.run(said + "predict", lambda: api.predict(folder, ["what is a dog ?"], log=quiet))
            tally.run(said + "explain", lambda: api.explain(folder, ["what is a dog ?"], log=quiet,
                                                            occlusion=name == "probe"))
            if r.random() < 0.5:
                relabelled(r, tally, said, folder)
        if which.name == "config.json" and isinstance(changed, dict) and tally.done > answered_before:
            edited = [w for w, _, _ in json_differences(trained_as(changed), trained_as(originals[name]))]
            if edited:  # the weights answer only by what they were trained with: an edit of it must be refused
                tally.findings.append(f"{said}answered, though config.json's {', '.join(edited[:3])} differ from "
                                      f"what the weights were trained with")
        for i in range(before, len(tally.findings)):  # the change that made it, for the report
            tally.findings[i] += f"\nthe changed {which.name}: {json.dumps(changed)[:1500]}"
        shutil.rmtree(folder, ignore_errors=True)
    if RELABELLED:
        print(f"relabel: {dict(RELABELLED)}")
    return tally.report("model", args.cases, args.seed) | {"relabel": dict(RELABELLED)}


PARTS = {"cache": part_cache, "data": part_data, "sweep": part_sweep, "model": part_model, "train": part_train, "cli": part_cli, "generation": part_generation, "http": part_http}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=sorted(PARTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=480, help="http: stop sending after this long")
    ap.add_argument("--work", type=Path, default=Path("/tmp/frozentune-fuzz"))
    ap.add_argument("--out", type=Path, help="append the summary as one JSON line")
    args = ap.parse_args()
    args.work = args.work.resolve()  # the cli part works in a folder of its own (so paths given are made absolute)
    args.out = args.out.resolve() if args.out else None
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ.setdefault("FROZENTUNE_DATA", str(ROOT.parent / "shared" / "data"))
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = PARTS[args.part](args) | {"seconds": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads()}
    print(json.dumps(summary))
    if args.out:
        with args.out.open("a") as f:
            f.write(json.dumps(summary) + "\n")
    return 1 if summary["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Output folders of training runs: checked before any work starts, written whole or not at all.

`check_output` refuses, up front, an --output that is a file, that cannot be written, that holds
another saved model (unless overwrite) or other files. `staged_output` gives a temporary sibling
folder to write into; only when everything is written is it renamed into place (an existing
model it replaces is moved aside first and removed last), so an interrupted or failed run leaves
the user's folder exactly as it was.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterator, Sequence

MODEL_FILES = ("config.json", "model.safetensors", "result.json", "adapter_config.json", "adapter_model.safetensors",
               "onnx.json", "model.onnx", "sweep.json")  # sweep.json: a `frozentune sweep` folder (its model in best/)


MANIFEST = ".frozentune-files"  # the entries a run wrote into its output folder (JSON list), beside them
# what older folders (saved before the manifest) can hold besides MODEL_FILES: cards, generations, an
# ONNX export's external data and tokenizer files, a sweep's table, plot and best model
EARLIER_FILES = ("README.md", "generations.jsonl", "model.onnx.data", "sweep.md", "sweep.png", "best", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt",
                 "added_tokens.json", "chat_template.jinja", "spiece.model", "sentencepiece.bpe.model")


class OutputError(ValueError):
    """--output cannot be used; the message says why and what to do."""


def _writable(folder: Path) -> bool:
    """Whether a folder can be created in `folder` (tried, not guessed: root ignores modes on
    some file systems and not on others, and a read-only mount refuses everyone)."""
    try:
        probe = tempfile.mkdtemp(dir=folder, prefix=".frozentune-write-test-")
    except OSError:
        return False
    os.rmdir(probe)
    return True


def check_output(output: Path, overwrite: bool = False, reads: Sequence[Path] = (), kind: str = "model") -> None:
    """Raise OutputError unless `output` can receive what a command writes (`kind`, one of KINDS: a
    saved model, a sweep's folder, an ONNX export, a PEFT adapter): a new path in a writable folder,
    an empty folder, or (with overwrite) a folder holding one of the same kind written earlier
    (--overwrite of an export does not replace a model, nor a sweep's a model, nor the reverse).
    `reads`: the folders the command reads (an export's --model): the output may be none of them,
    nor hold or lie inside one, since it is replaced whole."""
    output = Path(output)
    for source in map(Path, reads):
        a, b = output.resolve(), source.resolve()
        if a == b or a in b.parents or b in a.parents:
            raise OutputError(f"--output {output}: the command reads {source} and writing {output} would replace "
                              f"{'it' if a == b else 'it or a folder around it'}; choose another folder")
    if output.exists() and not output.is_dir():
        raise OutputError(f"--output {output}: is a file, not a folder; give a folder path (it is created)")
    parent = output if output.exists() else output.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"--output {output}: {parent} is a file, so the folder cannot be created there")
    # an existing output is renamed away and replaced (its parent is written), and must itself be writable
    for folder in (output, output.parent) if output.exists() else (parent,):
        if not _writable(folder):
            raise OutputError(f"--output {output}: {folder} is not writable; choose a folder you can write to")
    if not output.is_dir():
        return
    present = sorted(p.name for p in output.iterdir())
    if not present:
        return
    if any(name in present for name in MODEL_FILES):
        _check_ours(output, present)
        what = _holds(present)
        if overwrite and what != KINDS[kind]:  # e.g. an export's --overwrite deleted a trained model
            raise OutputError(f"--output {output}: holds {what}; --overwrite replaces {KINDS[kind]} with another, not "
                              f"{what}: remove it yourself, or choose another folder")
        if overwrite:
            return
        raise OutputError(f"--output {output}: already holds {what} ({', '.join(n for n in present if n in MODEL_FILES)}); "
                          f"pass --overwrite (overwrite=True in Python) to replace it, or choose another folder")
    raise OutputError(f"--output {output}: is not empty ({len(present)} {'entry' if len(present) == 1 else 'entries'}, e.g. {present[0]}) and holds no "
                      f"saved model; choose a new or empty folder")


def _frozentune_config(path: Path) -> bool:
    try:
        return str(json.loads(path.read_text()).get("format", "")).startswith("frozentune/")
    except (OSError, ValueError, AttributeError):
        return False


# what each kind of output folder is called: what a command writes, and what --overwrite may replace
KINDS = {"model": "a saved model", "sweep": "a sweep", "onnx": "an ONNX export", "peft": "a PEFT adapter"}


def _holds(present: list[str]) -> str:
    """What a folder of frozentune's holds, by its entries (one of KINDS' values)."""
    return ("a sweep" if "sweep.json" in present else "an ONNX export" if "onnx.json" in present
            else "a PEFT adapter" if "adapter_config.json" in present and "config.json" not in present
            else "a saved model")


def _manifest(folder: Path) -> set[str] | None:
    """The entries `folder`'s manifest names, or None where it has none (or none readable)."""
    try:
        return set(json.loads((Path(folder) / MANIFEST).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _check_ours(output: Path, present: list[str]) -> None:
    """An --output holding model files is replaced whole, so it must hold only what frozentune wrote
    there: the entries its manifest names, or (a folder saved before manifests) frozentune's own kinds
    of file. Anything else (a user's notes, a Hugging Face model) is refused, named, before any work."""
    if (output / MANIFEST).is_file():
        wrote = _manifest(output) or set()
        other = [n for n in present if n not in wrote and n != MANIFEST]
    else:
        if "config.json" in present and not _frozentune_config(output / "config.json"):
            raise OutputError(f"--output {output}: holds a model frozentune did not save (its config.json is not a "
                              f"frozentune config); choose another folder")
        other = [n for n in present if n not in MODEL_FILES and n not in EARLIER_FILES]
    if other:
        shown = ", ".join(other[:5]) + (" …" if len(other) > 5 else "")
        raise OutputError(f"--output {output}: holds {_holds(present)} and {len(other)} "
                          f"{'entry' if len(other) == 1 else 'entries'} frozentune did not write there ({shown}); "
                          f"replacing the folder would delete them: move them out, or choose another folder")


def record_written(folder: Path, name: str) -> None:
    """Add `name` to the manifest of frozentune's output folder `folder` (a file a later command wrote
    there, e.g. plot-concepts' picture in a model folder), so that --overwrite may replace it too."""
    wrote = _manifest(folder)
    if wrote is not None:  # a folder without a manifest: nothing to record in
        (Path(folder) / MANIFEST).write_text(json.dumps(sorted(wrote | {name})))


@contextlib.contextmanager
def staged_output(output: Path, overwrite: bool = False, kind: str = "model") -> Iterator[Path]:
    """Yield a temporary folder beside `output`; on success it replaces `output` (checked again
    first); on any exception, interrupts included, it is removed and `output` is untouched."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = output.parent / f".{output.name}.partial-{tag}"
    tmp.mkdir()
    try:
        yield tmp
        (tmp / MANIFEST).write_text(json.dumps(sorted(p.name for p in tmp.iterdir())))
        check_output(output, overwrite, kind=kind)
        old = output.parent / f".{output.name}.replaced-{tag}"
        if output.is_dir():
            output.rename(old)
        tmp.rename(output)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

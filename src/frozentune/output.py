"""Output folders of training runs: checked before any work starts, written whole or not at all.

`check_output` refuses, up front, an --output that is a file, that cannot be written, that holds
another saved model (unless overwrite) or other files, that is a link to nothing. `staged_output`
gives a temporary sibling folder to write into; only when everything is written is it renamed into
place (an existing model it replaces is moved aside first and removed last), so an interrupted or
failed run leaves the user's folder exactly as it was. A link to a folder is written through (its
target receives the files). An existing folder that cannot be renamed (a mount point, or one whose
parent is not writable) is written in place instead: the files are staged inside it and moved in
when all are written.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from .errors import FrozentuneError
from . import interrupts, locks

MODEL_FILES = ("config.json", "model.safetensors", "result.json", "adapter_config.json", "adapter_model.safetensors",
               "onnx.json", "model.onnx", "sweep.json")  # sweep.json: a `frozentune sweep` folder (its model in best/)


MANIFEST = ".frozentune-files"  # the entries a run wrote into its output folder (JSON list), beside them
# what older folders (saved before the manifest) can hold besides MODEL_FILES: cards, generations, an
# ONNX export's external data and tokenizer files, a sweep's table, plot and best model
EARLIER_FILES = ("README.md", "generations.jsonl", "model.onnx.data", "sweep.md", "sweep.png", "best", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt",
                 "added_tokens.json", "chat_template.jinja", "spiece.model", "sentencepiece.bpe.model")


class OutputError(FrozentuneError, ValueError):
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


_STAGED = r"(partial|replaced)-(\d+)-[0-9a-f]{8}"  # what staged_output's folders are called after their prefix
STAGING = re.compile(r"\." + _STAGED)  # its folders inside an output written in place
LOCK = ".frozentune.lock"  # claimed's lock inside an output written in place (beside it: .NAME.lock)


def _followed(output: Path) -> Path:
    """`output` made absolute (`--output .` has no name to stage beside), or the folder it links to: a link
    is written through, not replaced by a folder. A link to nothing is refused (renaming a folder onto it
    failed after all the work was done)."""
    output = Path(os.path.abspath(output))
    if not output.is_symlink():
        return output
    target = Path(os.path.realpath(output))
    if not target.exists():
        raise OutputError(f"--output {output}: a link to {os.readlink(output)}, which does not exist; create that "
                          f"folder, or give another --output")
    return target


def check_writable_folder(output: Path) -> Path:
    """`output` (a link followed) where it is, or can be made, a folder this process writes into; else an
    OutputError saying why. For a command that writes into its --output as it runs (pretrain's
    checkpoints), and the first of check_output's checks."""
    output = _followed(Path(output))
    if output.exists() and not output.is_dir():
        raise OutputError(f"--output {output}: is a file, not a folder; give a folder path (it is created)")
    parent = output if output.exists() else output.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"--output {output}: {parent} is a file, so the folder cannot be created there")
    if not _writable(parent):
        raise OutputError(f"--output {output}: {parent} is not writable; choose a folder you can write to")
    return output


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _clean_stale(output: Path) -> None:
    """What staged_output left of a run killed outright (SIGKILL, a power cut): its staging folders beside
    or inside `output` (a model or an ONNX graph, tens of MB each, hidden and kept for ever) removed, and
    an old folder it had moved aside and not yet replaced put back. Only a dead process's: each name
    carries its process id."""
    places = [(output.parent, f".{output.name}.")] + ([(output, ".")] if output.is_dir() else [])
    for folder, start in places:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for p in entries:
            if not (m := re.fullmatch(re.escape(start) + _STAGED, p.name)) or not p.is_dir() or _alive(int(m[2])):
                continue
            kind = m[1]
            if kind == "replaced" and folder == output.parent and not output.exists():
                p.rename(output)  # killed between its two renames: the old folder is the user's
                continue
            if kind == "replaced" and folder == output:  # killed while swapping in place: what was not yet replaced
                for q in list(p.iterdir()):               # goes back
                    if not (output / q.name).exists():
                        q.rename(output / q.name)
            shutil.rmtree(p, ignore_errors=True)


def _in_place(output: Path) -> bool:
    """Whether an existing output folder must be written in place: it cannot be renamed aside, being a
    mount point (a container's volume) or in a folder this process cannot write."""
    return output.is_dir() and (os.path.ismount(output) or not _writable(output.parent))


def check_output(output: Path, overwrite: bool = False, reads: Sequence[Path] = (), kind: str = "model") -> None:
    """Raise OutputError unless `output` can receive what a command writes (`kind`, one of KINDS: a
    saved model, a sweep's folder, an ONNX export, a PEFT adapter): a new path in a writable folder,
    an empty folder, or (with overwrite) a folder holding one of the same kind written earlier
    (--overwrite of an export does not replace a model, nor a sweep's a model, nor the reverse).
    `reads`: the folders the command reads (an export's --model): the output may be none of them,
    nor hold or lie inside one, since it is replaced whole. Staging folders of runs writing in place
    (STAGING) are not counted as its entries."""
    output = _followed(Path(output))
    _clean_stale(output)
    for source in map(Path, reads):
        a, b = output.resolve(), source.resolve()
        if a == b or a in b.parents or b in a.parents:
            raise OutputError(f"--output {output}: the command reads {source} and writing {output} would replace "
                              f"{'it' if a == b else 'it or a folder around it'}; choose another folder")
    # an existing output is renamed away and replaced where its parent is writable, else written in place
    check_writable_folder(output)
    if not output.is_dir():
        return
    # not the folders of a run staging in place (this one's, another's under way: the last to finish wins), nor a
    # file system's own lost+found at a mount point
    skip = {"lost+found"} if os.path.ismount(output) else set()
    present = sorted(p.name for p in output.iterdir() if not STAGING.fullmatch(p.name) and p.name not in skip | {LOCK})
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
    first); on any exception, interrupts included, it is removed and `output` is untouched. A link to
    a folder is written through; a folder that cannot be renamed (_in_place) gets the temporary
    folder inside it, whose entries replace its own once all are written."""
    output = _followed(Path(output))
    output.parent.mkdir(parents=True, exist_ok=True)
    with claimed(output):
        yield from _staged(output, overwrite, kind)


def _staged(output: Path, overwrite: bool, kind: str) -> Iterator[Path]:
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    inside = _in_place(output)
    tmp = output / f".partial-{tag}" if inside else output.parent / f".{output.name}.partial-{tag}"
    tmp.mkdir()
    try:
        try:
            yield tmp
        except OSError as e:  # a full disk: the --output said, not a staging file (or no file: a write's error names none)
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise OSError(e.errno, e.strerror, str(output)) from e
            raise
        (tmp / MANIFEST).write_text(json.dumps(sorted(p.name for p in tmp.iterdir())))
        check_output(output, overwrite, kind=kind)
        if inside:
            _replace_entries(output, tmp, tag)
            return
        old = output.parent / f".{output.name}.replaced-{tag}"
        with interrupts.held():  # an interrupt between the two renames left neither folder in place; one in the
            if output.is_dir():  # removal after them left the old folder beside the new, and said nothing was saved
                output.rename(old)
            tmp.rename(output)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace_entries(output: Path, tmp: Path, tag: str) -> None:
    """`output`'s entries (checked: frozentune's own, or none) moved aside into a folder inside it, `tmp`'s
    moved in, the old ones removed: renames within one folder, for a folder that cannot itself be renamed."""
    old = output / f".replaced-{tag}"
    old.mkdir()
    skip = ({"lost+found"} if os.path.ismount(output) else set()) | {LOCK}  # the lock stays with the folder
    with interrupts.held():
        for p in list(output.iterdir()):
            if not STAGING.fullmatch(p.name) and p.name not in skip:  # another run's staging is its own
                p.rename(old / p.name)
        for p in list(tmp.iterdir()):
            p.rename(output / p.name)
        shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------- one writer per --output
_CLAIMS: dict[Path, list] = {}  # the --output folders this process writes: [lock file, descriptor, depth, made]


@contextlib.contextmanager
def claimed(output: Path) -> Iterator[None]:
    """Hold `output` (a followed, absolute path) for this process: a second frozentune process given the same
    --output meanwhile is refused at its start, naming this one. Without it both trained, and at the end one
    threw its model away (the folder held a model by then) or, with --overwrite, replaced the other's unseen.
    Nested claims of one process (train → staged_output) share the lock. Where the lock file cannot be made
    (a folder not writable: check_output says so) or flock does not work, nothing is held."""
    if (claim := _CLAIMS.get(output)) is None:
        lock = output / LOCK if _in_place(output) else output.parent / f".{output.name}.lock"
        made = [p for p in (lock.parent, *lock.parent.parents) if not p.exists()]  # folders the lock makes
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = locks.acquire(lock, wait=False)
        except locks.Held as e:
            raise OutputError(f"--output {output}: {e.holder} is writing a run into it now; wait for it to end, or "
                              f"choose another folder") from None
        except OSError:
            fd = None
        claim = _CLAIMS[output] = [lock, fd, 0, made]
    claim[2] += 1
    try:
        yield
    finally:
        claim[2] -= 1
        if not claim[2]:
            del _CLAIMS[output]
            locks.release(claim[0], claim[1])
            for folder in claim[3]:  # a run that saved nothing (bad data, an interrupt) leaves no empty folders
                with contextlib.suppress(OSError):
                    folder.rmdir()


F = TypeVar("F", bound=Callable)


def holds_output(fn: F) -> F:
    """A command that writes its `output` argument (a folder, or None) claims it for the whole call, on the
    main process of a launch (the one that writes it): `claimed`."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        from .distributed import is_main

        try:
            output = sig.bind(*args, **kwargs).arguments.get("output")
        except TypeError:  # the call itself raises it
            output = None
        if not isinstance(output, (str, os.PathLike)) or not str(output) or not is_main():
            return fn(*args, **kwargs)  # (an output of the wrong type is the command's own error)
        with claimed(_followed(Path(output))):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def run_environment() -> dict[str, Any]:
    """What a rerun needs to give the same numbers, recorded with a run's results: the versions that compute
    them, and torch's thread count and CPU kernels (a run is bitwise repeatable at the same thread count; at
    another, sums are taken in another order and the weights differ in their last digits)."""
    import platform

    import torch

    return {"frozentune": package_version("frozentune"), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": package_version("transformers"),
            "torch_threads": torch.get_num_threads(), "cpu_kernels": torch.backends.cpu.get_cpu_capability()}


def package_version(package: str) -> str | None:
    """An installed package's version (frozentune's own from its source where it is not installed), or None;
    read from the package's metadata, without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        if package == "frozentune":
            from . import __version__
            return __version__
        return None

"""Renaming a saved classifier's labels: `frozentune relabel --model DIR --rename OLD=NEW [OLD=NEW ...]`.

A classifier answers by the position of each label, so the labels of its config.json are also recorded in its
weights (model.trained_as) and an edit of config.json is refused at load: names put in another order would
label every answer wrongly, with nothing said. A rename keeps the order, and this is the way to make one: the
new names are written into both records (config.json, and the weights' metadata: the tensors are the same), the
card is written again, and config.json's "trained_labels" keeps the names the model was trained with, so that
`eval` on data that still has them says how to rename them back. The folder is replaced whole
(output.staged_output): an interrupt or an error leaves it exactly as it was. `--output` writes the renamed
model into another folder instead and leaves the original alone.
"""
from __future__ import annotations

import shlex
import shutil
import unicodedata
from pathlib import Path
from typing import Callable, Mapping, Sequence

from . import model as M
from .data import label_name, some
from .errors import FrozentuneError
from .pyterms import in_python_terms

TRAINED_LABELS = "trained_labels"  # config.json: the labels as trained, where a rename changed them since


class RelabelError(FrozentuneError, ValueError):
    """A rename that cannot be made; the message says why and what to do."""


def parse_renames(given: Sequence[str], labels: Sequence[str]) -> dict[str, str]:
    """--rename's OLD=NEW words as {old: new}. A label may itself hold "=": the word is split at the "=" whose
    left side is one of the model's `labels` (one such "=" only; otherwise the word is ambiguous, and said so)."""
    out: dict[str, str] = {}
    for word in given:
        cuts = [i for i, ch in enumerate(word) if ch == "=" and word[:i] in labels]
        if not cuts:
            old = word.split("=", 1)[0] if "=" in word else word
            if "=" not in word:
                raise RelabelError(f"--rename {word!r}: give OLD=NEW, a label of the model and its new name "
                                   f"(the model's labels: {some(labels)})")
            raise RelabelError(f"--rename {word!r}: {old!r} is not a label of the model (its labels: {some(labels)})")
        if len(cuts) > 1:
            raise RelabelError(f"--rename {word!r}: ambiguous, since {' and '.join(repr(word[:i]) for i in cuts)} are "
                               f"both labels of the model; rename the shorter one in another run first")
        old, new = word[:cuts[0]], word[cuts[0] + 1:]
        if old in out:
            raise RelabelError(f"--rename: {old!r} is renamed twice ({old}={out[old]} and {word}); give it once")
        out[old] = new
    return out


def renamed_labels(labels: Sequence[str], rename: object) -> list[str]:
    """`labels` with `rename` ({old: new}) applied, in the same order; RelabelError where a name is not a label,
    a new name is empty or not text, two labels would share a name, or nothing would change."""
    if not isinstance(rename, Mapping) or not rename:
        raise RelabelError(f"--rename: give at least one OLD=NEW (got {rename!r:.60})")
    for old, new in rename.items():
        if old not in labels:
            raise RelabelError(f"--rename {_word(old, new)}: {old!r:.60} is not a label of the model (its labels: "
                               f"{some(labels)})")
        if not isinstance(new, str) or not new.strip() or new != new.strip() or not new.isprintable():
            raise RelabelError(f"--rename {_word(old, new)}: a new name must be text, not empty, printable and without "
                               f"spaces at either end (got {new!r:.60})")
        if (read := label_name(new)) != new:  # data files could never carry it: eval would find its labels unknown
            # (a decomposed accent prints as its composed form: both shown in their code points)
            a, b = (ascii(new), ascii(read)) if unicodedata.normalize("NFC", new) == read else (repr(new), repr(read))
            raise RelabelError(f"--rename {_word(old, new)}: a data file's label {a:.60} is read as {b:.60} "
                               f"(numbers and true / false are read in one spelling, text in Unicode's composed "
                               f"form), so no data could be scored with that name; give {b:.60}")
    out = [rename.get(lab, lab) for lab in labels]
    if len(set(out)) != len(out):
        twice = sorted({lab for lab in out if out.count(lab) > 1})
        raise RelabelError(f"--rename: two labels would be named {twice[0]!r} (the labels would be {some(out)}); "
                           f"each label needs its own name (to swap two names, rename both in one run)")
    if out == list(labels):
        raise RelabelError(f"--rename: every name given is the label's own, so nothing would change (the model's "
                           f"labels: {some(labels)})")
    return out


@in_python_terms()
def relabel(model_dir: Path, rename: Mapping[str, str] | Sequence[str] | str, output: Path | None = None,
            overwrite: bool = False, log: Callable[[str], None] | None = print) -> dict:
    """Rename labels of the classifier saved in `model_dir` ({old: new}, or "OLD=NEW" words as the command line
    takes them; the other labels keep their names), in place, or into `output` (model_dir is then left as it is;
    an existing output needs overwrite). The weights are checked as every load checks them, and written back
    unchanged with the new names recorded. Returns {"model", "output", "labels", "renamed", "trained_labels"}.
    `log`: None says nothing (it raised a TypeError once the folder was written)."""
    log = log or (lambda line: None)
    model_dir = Path(model_dir)
    config = M.read_saved(model_dir)  # an ONNX export, a sweep's or a PEFT adapter's folder: named there
    if config.get("task") == "generation" or "labels" not in config:
        raise RelabelError(f"{model_dir}: a generation model, which has no labels to rename; relabel a classifier")
    M.check_config(config, model_dir / M.CONFIG)
    state = M.load_weights(model_dir, config)  # whole, and answering by this config.json's labels (check_trained_as)
    labels = list(config["labels"])
    if isinstance(rename, (str, Sequence)):  # the command line's OLD=NEW words
        rename = parse_renames([rename] if isinstance(rename, str) else rename, labels)
    new = renamed_labels(labels, rename)
    trained = config.get(TRAINED_LABELS)
    if not (isinstance(trained, list) and len(trained) == len(labels) and all(isinstance(x, str) for x in trained)):
        trained = labels
    saved = {k: v for k, v in config.items() if k not in ("format", "weights_file", TRAINED_LABELS)}
    saved["labels"] = new
    if new != trained:
        saved[TRAINED_LABELS] = trained
    target = rewrite_model(model_dir, output, overwrite, state, saved, "relabel", "renamed", RelabelError)
    changed = {old: n for old, n in zip(labels, new) if old != n}
    log(f"renamed {len(changed)} label{'s' if len(changed) != 1 else ''} of {model_dir} "
        f"({', '.join(f'{o} → {n}' for o, n in changed.items())})"
        + ("" if target == model_dir else f" into {target}") + f"; its labels are now {some(new)}")
    return {"model": str(model_dir), "output": str(target), "labels": new, "renamed": changed,
            "trained_labels": trained}


def check_rewrite(model_dir: Path, output: Path | None, overwrite: bool, command: str, done: str,
                  error: type[Exception]) -> tuple[Path, bool]:
    """(the folder rewrite_model would write, whether it is model_dir itself), or `error` (rewrite_model's words)
    where it cannot be written: what a command checks before its work, so that the refusal comes first."""
    from .output import OutputError, check_output

    in_place = output is None or Path(output).resolve() == Path(model_dir).resolve()
    target = Path(model_dir) if in_place else Path(output)
    if not in_place:
        check_output(target, overwrite, reads=[model_dir])
    else:  # replaced whole, as an --output is: said in the words of --model
        try:
            check_output(target, overwrite=True)
        except OutputError as e:
            said = str(e).split(": ", 1)[-1].removesuffix(", or choose another folder")
            raise error(f"--model {model_dir}: {said}; or write the {done} model into a new folder with "
                        f"--output DIR ({command} in place replaces the folder whole)") from None
    return target, in_place


def rewrite_model(model_dir: Path, output: Path | None, overwrite: bool, state: dict, saved: dict, command: str,
                  done: str, error: type[Exception]) -> Path:
    """Write a saved classifier's folder again with `state` (its weights) and `saved` (config.json's entries), in
    place (the folder replaced whole: an interrupt or an error leaves it as it was) or into `output` (an existing one
    needs overwrite); the other files (result.json, a concept plot) copied as they were, the card written again.
    `command` ("relabel", "calibrate"), `done` ("renamed") and `error` (its error class) word the refusals. Returns
    the folder written."""
    from .export.card import write_card_from_files
    from .output import LOCK, MANIFEST, STAGING, staged_output

    target, in_place = check_rewrite(model_dir, output, overwrite, command, done, error)
    skip = {M.CONFIG, M.WEIGHTS, "README.md", MANIFEST, LOCK}
    with staged_output(target, overwrite=in_place or overwrite) as folder:
        M.write_saved(folder, state, saved)
        for entry in model_dir.iterdir():  # result.json, a concept plot: as they were
            if entry.name in skip or STAGING.fullmatch(entry.name) or entry.name.startswith("."):
                continue
            if entry.is_dir():
                shutil.copytree(entry, folder / entry.name, symlinks=True)
            else:
                shutil.copy2(entry, folder / entry.name)
        write_card_from_files(folder)
    return target


def renamed_hint(config: dict, data_labels: Sequence[str], folder: Path | str = "DIR") -> str:
    """For eval's error on data whose labels are not the model's: where the model's labels were renamed and the
    data has names it was trained with, the rename and how to undo it; else ""."""
    trained, labels = config.get(TRAINED_LABELS), config.get("labels")
    if not (isinstance(trained, list) and isinstance(labels, list) and len(trained) == len(labels)):
        return ""
    back = {now: then for then, now in zip(trained, labels) if then != now and isinstance(now, str)}
    if not set(data_labels) & {then for then in trained if then not in labels}:
        return ""
    # to be run as written: quoted, and where a word begins with "-" each given as --rename=WORD (argparse reads such
    # a word as an option otherwise; --rename takes its words in one flag or several)
    words = [f"{now}={then}" for now, then in back.items()]
    undo = (" ".join(f"--rename={shlex.quote(w)}" for w in words) if any(w.startswith("-") for w in words)
            else "--rename " + " ".join(map(shlex.quote, words)))
    model = f"--model={shlex.quote(str(folder))}" if str(folder).startswith("-") else \
        f"--model {shlex.quote(str(folder))}"
    renames = ", ".join(f"{then} → {now}" for now, then in back.items())
    return (f"; the model's labels were renamed after training ({renames}): give data with the new names, or rename "
            f"them back with `frozentune relabel {model} {undo}`")


def _word(old: object, new: object) -> str:
    """OLD=NEW as the message shows it: each side as typed, or as a Python literal where it is not plain printable
    text (a line break would cut the one-line message)."""
    plain = [x if isinstance(x, str) and x.isprintable() and x == x.strip() and x else repr(x)[:60] for x in (old, new)]
    return "=".join(plain)

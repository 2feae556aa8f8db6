"""`frozentune compare`: saved classifiers scored on the same examples, each against the first.

Two models a point apart on a test split of 500 examples may be apart by the test sample's chance alone.
Scored on the same examples, what tells them apart is the examples one got right and the other wrong: McNemar's
exact test asks whether those split unevenly enough that a fair coin would rarely do it, and Bonett and Price's
interval gives the difference in accuracy its range (train.paired). Each model's own figures come with their
intervals (train.intervals). All of it is the test sample's uncertainty: each model is one training run, and
another seed moves a score too (`frozentune sweep` trains over seeds).

    frozentune compare --model runs/probe --model runs/space --data trec
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from . import api
from .errors import FrozentuneError
from .pyterms import in_python_terms

SIGNIFICANT = 0.05  # the p under which the log says a difference is unlikely to be chance in the sample alone


class CompareError(FrozentuneError, ValueError):
    """The models given cannot be compared (too few, one twice, a generator, other rows of the data)."""


def _named(models: object) -> list[tuple[str, object]]:
    """(the name said for it, the folder or loaded model) of each model given; a CompareError for fewer than two,
    a folder given twice, or a value that is not a folder or a loaded model."""
    from . import model as M

    if isinstance(models, (str, os.PathLike)) or not isinstance(models, Sequence):
        raise CompareError(f"models: {type(models).__name__}; give a list of two or more saved models' folders")
    if len(models) < 2:
        raise CompareError(f"{len(models)} model{'' if len(models) == 1 else 's'} given: compare scores two or more "
                           f"on the same examples, each against the first; give another --model")
    out: list[tuple[str, object]] = []
    seen: dict[Path, str] = {}
    loaded: dict[int, int] = {}
    for i, m in enumerate(models):
        if isinstance(m, M.Classifier):
            if id(m) in loaded:
                raise CompareError(f"models[{i}]: the model of models[{loaded[id(m)]}] again; a model against itself "
                                   f"differs on no example: give another model")
            loaded[id(m)] = i
            out.append((f"model {i + 1} (a loaded {m.method} model)", m))
            continue
        if not isinstance(m, (str, os.PathLike)):
            raise CompareError(f"models[{i}]: {type(m).__name__}; give the folder of a saved model (a str or Path), "
                               f"or a loaded model")
        where = Path(m).expanduser().resolve()
        if where in seen:
            raise CompareError(f"--model {m}: given twice (as {seen[where]} too); a model against itself differs on "
                               f"no example: give another model")
        seen[where] = str(m)
        out.append((str(m), m))
    return out


def _rows(part) -> tuple:
    """What identifies a split's examples, whatever fields a model reads of them (a pair model's two texts, another
    model's one): the file's rows and their labels; the texts where the file is not known."""
    return (part.file, part.rows.tolist(), part.labels) if part.file else (None, part.texts, part.labels)


def _same_rows(first: tuple, other: tuple, data: str, split: str) -> None:
    """A CompareError where two models' reading of the split is not the same examples in the same order."""
    (name_a, part_a), (name_b, part_b) = first, other
    if _rows(part_a) == _rows(part_b):
        return
    why = (f"{len(part_a):,} examples against {len(part_b):,}" if len(part_a) != len(part_b) else
           "the same number of examples, but not the same ones")
    raise CompareError(f"{name_b}: its {split} split of {data} is not {name_a}'s ({why}): a split carved from one "
                       f"file follows each model's own seed (and --shots / --max-train sample), so the two were "
                       f"scored on other examples; compare them on a file neither was trained on (a dataset's "
                       f"test file, or such a file read whole with --split all)")


def _config(name: str, m: object) -> dict:
    """A model's saved config.json (its "data" and "split_rule"): read from its folder before anything is scored
    (a folder that holds no model is said here, not after the models before it), or a loaded model's."""
    from . import model as M

    if isinstance(m, M.Classifier):
        return getattr(m, "saved_config", None) or {}
    folder = Path(m).expanduser()
    if not (folder / M.CONFIG).is_file():
        M.read_saved(folder)  # says what the folder is instead (a sweep, an ONNX export, no config.json …)
    config = M.read_config_json(folder, CompareError)
    if not isinstance(config, dict):
        raise CompareError(f"--model {name}: {folder / M.CONFIG} is not a frozentune model config; give the folder "
                           f"`frozentune train --output` wrote")
    return config


def _not_trained_on(name: str, config: dict, data: str, split: str) -> None:
    """A CompareError where `split` of `data` holds the examples the model was trained on (api.trained_on): a model
    is surer and more often right on them, so a difference there says how the models fit their training rows, and
    the test would call a memorised gap unlikely to be chance."""
    if what := api.training_rows(api.trained_on(config, data, split), data, split, whose="it"):
        raise CompareError(f"--model {name}: --split {split} of {data} is {what}: scores there measure how a model "
                           f"fits its training rows, not how it does on texts it has not seen; compare on --split "
                           f"test or validation (`frozentune eval --split {split}` gives a model's figures there)")


@in_python_terms()
def compare(models: Sequence[Path | str], data: str, split: str = "test", text_field: str | None = None,
            label_field: str | None = None, pair_field: str | None = None, cache_root: Path | None = None,
            progress: bool = True, device: str | None = None, precision: str | None = None,
            rebuild_cache: bool = False, log: Callable[[str], None] | None = api._stderr) -> dict:
    """Score `models` (two or more saved classifiers' folders, or loaded ones) on the same `split` of `data`, each
    read as it was trained (as `eval` reads it), and compare each with the first. Returns {"data", "split", "n",
    "models": [{"model", "method", "metrics", "intervals", "calibration"}], "against_first": [{"model", "first",
    the counts of both right / first only / other only / both wrong, "difference" (points), "interval", "mcnemar_p",
    "level"}]}; each model's "calibration" is eval's (the ECE, its bins, and the accuracy of the examples it is
    surest of).
    `log` (default: standard error; None: nothing) gets what was read and a line per comparison. Models are
    loaded one at a time, and each is let go once scored."""
    from .generation.run import is_generation_model
    from .train import calibration, figures, intervals, metrics, paired

    log = api.as_log(log)
    cache_root = api.as_path(cache_root, "cache_root")
    api.as_switch(rebuild_cache, "rebuild_cache")
    api.check_split(split)
    named = _named(models)
    for name, m in named:  # every folder checked before the first is scored
        if isinstance(m, (str, os.PathLike)):
            if not Path(m).expanduser().is_dir():
                raise CompareError(f"--model {name}: no such folder; give the folder `frozentune train --output` "
                                   f"wrote")
            if is_generation_model(m):
                raise CompareError(f"--model {name}: a text generator; compare scores classifiers (score "
                                   f"generators with `frozentune eval`, which gives BLEU and ROUGE)")
        _not_trained_on(name, _config(name, m), data, split)
    scored, rows = [], []
    ds_name = None
    said: set[str] = set()

    def once(line: str) -> None:  # the models' common lines (the device, the precision) said once, not per model
        if line not in said:
            said.add(line)
            log(line)

    for name, m in named:
        try:
            model = api._load(m, device, precision, once)
            ds, part, y, logits = api._scored_split(model, m, data, split, (text_field, label_field, pair_field),
                                                    cache_root, rebuild_cache, progress, once, verb=f"compare {name}")
        except FrozentuneError as e:  # said under the model's name (it came after the line of the model before)
            if e.args and isinstance(e.args[0], str) and not e.args[0].startswith(f"--model {name}:"):
                e.args = (f"--model {name}: {e.args[0]}",) + tuple(e.args[1:])
            raise
        if not len(part):  # (eval's reading refuses an empty split; said here too, not a division by zero)
            raise CompareError(f"{name}: its {split} split of {data} holds no examples; give a split with some")
        if rows:
            _same_rows(rows[0], (name, part), data, split)
        rows.append((name, part))
        pred = logits.argmax(1)
        positive = api.positive_label(ds.name, model.labels)
        scored.append({"model": name, "method": model.method, "right": pred == y,
                       "metrics": metrics(y, pred, len(model.labels), positive),
                       "intervals": intervals(y, pred, len(model.labels), positive),
                       "calibration": calibration(y, pred, api.softmax_rows(logits))})
        ds_name = ds.name
        del model
    out = {"data": ds_name, "split": split, "n": len(rows[0][1]),
           "models": [{k: v for k, v in s.items() if k != "right"} for s in scored], "against_first": []}
    for s in scored:
        log(f"{s['model']} ({s['method']}): {figures(s['metrics'], s['intervals'])}  ECE "
            f"{s['calibration']['ece']:.2f} points" + api.surest(s["calibration"]["selective"]))
    first = scored[0]
    for s in scored[1:]:
        p = paired(first["right"], s["right"])
        out["against_first"].append({"model": s["model"], "first": first["model"], **p})
        log(difference_line(s["model"], first["model"], p, split))
    log("each model is one training run: training again with another seed moves a score too, which these intervals "
        "do not include (`frozentune sweep` trains over seeds)")
    return out


def difference_line(other: str, first: str, p: dict, split: str = "test") -> str:
    """One line for the log: other − first in accuracy, its interval, the examples only one got right, and
    McNemar's p with what it says (of the `split` scored)."""
    band = (f" ({p['level']:.0%} interval {p['interval'][0]:+.2f} to {p['interval'][1]:+.2f})"
            if p["interval"] is not None else "")
    sample = "the file's rows" if split == "all" else f"the {split} sample"
    verdict = (f"unlikely to be chance in {sample} alone (p < {SIGNIFICANT:g})" if p["mcnemar_p"] < SIGNIFICANT
               else f"{sample} cannot tell them apart (p ≥ {SIGNIFICANT:g})")
    if p["interval"] is not None and (p["interval"][0] > 0 or p["interval"][1] < 0) != (p["mcnemar_p"] < SIGNIFICANT):
        verdict += (", though the interval " + ("leaves out 0" if p["mcnemar_p"] >= SIGNIFICANT else "reaches 0")
                    + ": a borderline case, where the two procedures part")
    return (f"{other} − {first}: {p['difference']:+.2f} accuracy points{band}; right where the other was wrong: "
            f"{p['other_only']:,} examples against {p['first_only']:,}; McNemar's exact test p = "
            f"{p['mcnemar_p']:.3g}: {verdict}")


__all__ = ["CompareError", "compare", "difference_line"]

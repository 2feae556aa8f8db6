"""Running a sweep: one dataset, one backbone per layer, one `api.train` per point."""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..pyterms import in_python_terms
from .. import interrupts
from ..registry import get_method
from ..output import holds_output, run_environment
from ..train import Diverged, silent
from .grid import Grid, Point
from .journal import NAME, Journal, dataset_hash, point_keys, sweep_key


@dataclass
class SweepResult:
    rows: list[dict]          # one per point: its setting, seed, score, test accuracy, seconds
    table: list[dict]         # one per setting: mean ± std over seeds
    best: dict                # the table row with the highest mean score
    seconds: dict = field(default_factory=dict)  # wall, extraction, fits, loading
    best_saved_as: str | None = None  # the method of best/: the best's, or probe where its folds kept the regression
    best_seed: int | None = None      # the seed of best/ (saved_seed): its row is best/'s scores
    best_temperature: dict | None = None  # best/'s result.json `temperature` (--calibrate): None where none was fitted

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def point_score(result: dict) -> tuple[float, str]:
    """(score, what it is) of a train result, by what chose its model: the cross-validated held-out
    accuracy where folds chose (under --cv-below: a validation split there is scored, not used, as
    train says), else validation accuracy."""
    sel = result["selection"]
    if sel.get("score") is not None:
        return float(sel["score"]), "cross-validated accuracy"
    if result.get("validation"):
        return float(result["validation"]["accuracy"]), "validation accuracy"
    from ..data import DataError

    raise DataError("sweep: a point has neither cross-validation folds nor a validation split to score it by; give "
                    "2 or more distinct examples per class, or a validation file")


def effective_layer(p: Point) -> str:
    return p.layer or get_method(p.method).layer or "-1"


@in_python_terms(backbone=True, train_cfg=True, options=True)
@holds_output
def run_sweep(grid: Grid, data: str, backbone, output: Path | None = None, shots: int | None = None,
              max_train: int | None = None, text_field: str = "text", label_field: str = "label",
              cache_root: Path | None = None, train_cfg: dict | None = None, overwrite: bool = False,
              log: Callable[[str], None] = print, pair_field: str | None = None, resume: bool = True) -> SweepResult:
    """Train every point of `grid` on `data` (`backbone`: api.BackboneOptions; its layers are the
    grid's), tabulate, and save the best point to output/best. train_cfg: options every point shares.
    Each finished point is kept in a journal in the cache folder (`journal`); the same sweep run
    again after an interrupt reuses them (resume False: trains every point again). The journal is
    removed when the sweep finishes."""
    from .. import api
    from ..crossval import smallest_class
    from ..data import DataError, load_classification, text_groups
    from ..output import check_output
    from ..registry import MethodError
    from ..train import CV_BELOW

    t_start = time.perf_counter()
    if not isinstance(grid, Grid):
        raise MethodError(f"grid: a {type(grid).__name__} ({repr(grid)[:40]}); give a Grid, e.g. "
                          f"Grid.parse('probe,space', seeds='0,1,2')")
    backbone, log = api.as_backbone(backbone, loaded=False), api.as_log(log)
    output, cache_root = api.as_path(output, "output"), api.as_path(cache_root, "cache_root")
    if backbone.layers is not None or backbone.combine != "mean":
        raise MethodError("sweep: each point reads one layer, the grid's (--layers); leave the backbone's layers and "
                          "--layer-combine out")
    train_cfg = api.as_options(train_cfg, "train_cfg", "{'epochs': 5}")
    if "seed" in (train_cfg or {}):
        raise MethodError(f"sweep: train_cfg seed={train_cfg['seed']!r}: the seeds are the grid's (--seeds)")
    if output is not None:
        check_output(Path(output), overwrite, kind="sweep")
    points = grid.points()
    base = dict(train_cfg or {})
    seeds = {p.seed for p in points}
    datasets = {s: load_classification(data, text_field, label_field, seed=s, max_train=max_train, shots=shots,
                                       carve_below=base.get("cv_below", CV_BELOW), pair_field=pair_field)
                for s in sorted(seeds)}
    said: set[str] = set()
    for ds in datasets.values():  # what a train of the data says (SNLI's missing train file, a carved test split,
        for note in ds.notes:    # each seed's sample), once: the points' own logs are silent
            if note not in said:
                said.add(note)
                log(f"data: {note}")
    if not backbone.token_types:
        log("data: sentence pairs fed without token type ids (--no-token-types), as every point's model records")
    for s, ds in datasets.items():  # every point must have a score: validation, or folds that can hold each class out
        index = {lab: i for i, lab in enumerate(sorted(set(ds.train.labels)))}
        y = np.array([index[lab] for lab in ds.train.labels])
        smallest, why = smallest_class(y, sorted(index), text_groups(ds.train.texts))
        if not len(ds.validation) and smallest < 2:
            raise DataError(f"sweep: with seed {s}, {why} and there is no validation split, so no "
                            f"point could be scored (nothing to hold out); give a validation file, or data with 2 or "
                            f"more distinct texts in every class")
    t0 = time.perf_counter()
    backbones = load_layers(points, backbone)  # every layer's, before any training: a layer given twice is said now
    load_s = time.perf_counter() - t0
    hashes = {s: dataset_hash(ds) for s, ds in datasets.items()}
    settled = settings(points, base, backbones)
    both = [point_keys(x, hashes[p.seed], backbones[effective_layer(p)]) for p, x in zip(points, settled)]
    keys = [k for k, _ in both]
    legacy = {old: k for k, old in both}  # the keys of journals written before the config was in them
    journal = open_journal(settled, data, backbone, base, shots, max_train, text_field, label_field, pair_field,
                           cache_root, log, resume, set(keys), grid.methods, legacy)
    journal.total = len(points)
    try:
        rows, extract_s = [], 0.0
        for i, (p, key) in enumerate(zip(points, keys), 1):
            layer = effective_layer(p)
            if (row := journal.found(key)) is not None:
                row["layer"] = layer  # as this run names it (`6` and `-1` of a 6-layer model are one point)
                rows.append(row)
                log(f"[{i}/{len(points)}] {p.method} layer {layer} lr {row['lr']:g} wd {row['weight_decay']:g} seed "
                    f"{p.seed}: {point_outcome(row)} (finished by the interrupted run; reused)")
                continue
            t0 = time.perf_counter()
            try:
                r = api.train(p.method, datasets[p.seed], backbones[layer], train_cfg=base | p.train_cfg(),
                              cache_root=cache_root, progress=False, log=silent, cache_log=log)  # a point's log is its row
            except Diverged as e:  # this point's learning rate is too high: its row says so, the others go on
                row = diverged_row(settled[i - 1], layer, e, time.perf_counter() - t0)
                rows.append(row)
                journal.add(key, row)
                interrupts.check()
                log(f"[{i}/{len(points)}] {p.method} layer {layer} lr {row['lr']:g} wd {row['weight_decay']:g} seed "
                    f"{p.seed}: {point_outcome(row)}  ({row['seconds']:.1f}s)")
                continue
            score, what = point_score(r)
            extract_s += r["extract_seconds"]
            row = {"method": p.method, "layer": layer, "lr": r["config"]["train"]["lr"],
                   "weight_decay": r["config"]["train"]["weight_decay"], "seed": p.seed, "score": score, "score_is": what,
                   "test_accuracy": r["metrics"]["accuracy"], "train_seconds": r["train_seconds"],
                   "extract_seconds": r["extract_seconds"], "seconds": time.perf_counter() - t0,
                   "model_method": r.get("model_method", p.method),  # probe where cross-validation kept the regression
                   "reused": False,
                   "selection": {k: v for k, v in r["selection"].items() if k in ("how", "chosen_steps", "C", "fallback")}}
            rows.append(row)
            journal.add(key, row)  # signals are held while the line is written, then raised here
            interrupts.check()
            kept = " (the folds kept the regression: a probe)" if row["model_method"] != p.method else ""
            log(f"[{i}/{len(points)}] {p.method} layer {layer} lr {row['lr']:g} wd {row['weight_decay']:g} seed {p.seed}: "
                f"{what} {score:.2f}, test {row['test_accuracy']:.2f}{kept}  ({row['seconds']:.1f}s"
                + (f", of which extraction {row['extract_seconds']:.1f}s" if row["extract_seconds"] else "") + ")")
        table = tabulate(rows)
        best = best_setting(table)
        result = SweepResult(rows, table, best)
        if output is not None:
            from ..output import staged_output

            t0 = time.perf_counter()
            first = saved_seed(rows, best)
            with staged_output(Path(output), overwrite, kind="sweep") as folder:
                saved = api.train(best["method"], datasets[first], backbones[best["layer"]], shots=shots, max_train=max_train,
                          train_cfg=base | {"seed": first, "lr": best["lr"], "weight_decay": best["weight_decay"]},
                          output=folder / "best", cache_root=cache_root, progress=False, log=silent, cache_log=log)
                result.seconds = _seconds(t_start, extract_s, load_s, rows, time.perf_counter() - t0)
                result.best_saved_as, result.best_seed = saved.get("model_method", best["method"]), first
                result.best_temperature = saved.get("temperature")
                write(result, folder, data)
            journal.finish()
            interrupts.check()  # one held while the old output was replaced: raised now, the sweep saved
            log(f"best: {best['method']} layer {best['layer']} lr {best['lr']:g} wd {best['weight_decay']:g}: "
                f"{best['score_is']} {best['score_mean']:.2f} ± {best['score_std']:.2f}; saved to {Path(output) / 'best'} "
                f"(seed {first}){kept_note(result)}; table in {Path(output) / 'sweep.md'}")
        else:
            result.seconds = _seconds(t_start, extract_s, load_s, rows, 0.0)
            journal.finish()
        return result
    finally:
        journal.close()  # its lock released; removed where it holds no point


def diverged_row(point: dict, layer: str, e: Diverged, seconds: float) -> dict:
    """The row of a point whose training diverged (`point`: its entry of settings()): no score and no test
    accuracy, what happened in `diverged` ("step 3: loss became nan")."""
    return {"method": point["method"], "layer": layer, "lr": point["lr"], "weight_decay": point["weight_decay"],
            "seed": point["seed"], "score": None, "score_is": None, "test_accuracy": None, "train_seconds": seconds,
            "extract_seconds": 0.0, "seconds": seconds, "model_method": point["method"], "reused": False,
            "selection": {}, "diverged": f"{e.where}: {e.what}", "advice": e.advice}


def point_outcome(row: dict) -> str:
    """What a point's log line says of it: its score and test accuracy, or where its training diverged."""
    if row.get("diverged"):
        return f"diverged ({row['diverged']}): not scored; {row.get('advice', 'lower --lr')}"
    return f"{row['score_is']} {row['score']:.2f}, test {row['test_accuracy']:.2f}"


def best_setting(table: list[dict]) -> dict:
    """The table row with the highest mean score (the smaller spread among equals), among the settings
    whose every seed trained; a MethodError where every setting diverged in some seed."""
    whole = [t for t in table if not t["diverged"]]
    if not whole:
        from ..registry import MethodError

        raise MethodError("sweep: every setting diverged (its loss stopped being finite) in at least one seed, so "
                          "none can be chosen; give lower learning rates (--lr)")
    return max(whole, key=lambda t: (t["score_mean"], -t["score_std"]))


def saved_seed(rows: list[dict], best: dict) -> int:
    """The seed whose model is saved as best/: the first seed where the best setting kept its head, so
    best/ is the setting the table ranks first (a seed whose folds kept the logistic regression is the
    probe's point, not this setting's); the first seed where every seed kept the regression."""
    own = [r["seed"] for r in rows if (r["method"], r["layer"], r["lr"], r["weight_decay"])
           == (best["method"], best["layer"], best["lr"], best["weight_decay"]) and r["model_method"] == r["method"]]
    return min(own) if own else min(best["seeds"])


def load_layers(points: list[Point], backbone) -> dict:
    """The backbone loaded for each layer the points read (api.BackboneOptions → Backbone), in grid order; the
    same hidden state written two ways is a MethodError."""
    from ..registry import MethodError

    backbones: dict[str, object] = {}
    for layer in dict.fromkeys(effective_layer(p) for p in points):
        backbones[layer] = dataclasses.replace(backbone, layers=layer).load()
        same = [k for k, b in backbones.items() if k != layer and b.layer_key == backbones[layer].layer_key]
        if same:  # `6` and `-1` of a 6-layer model: one hidden state, two rows of the table
            raise MethodError(f"sweep: layers {same[0]} and {layer} are the same hidden state of "
                              f"{backbone.name} ({backbones[layer].layer_key}); give each layer once")
    return backbones


def settings(points: list[Point], base: dict, backbones: dict) -> list[dict]:
    """Each point as it trains: its method, layer (the backbone's absolute layer key), lr and weight decay as
    resolved (where the grid leaves them out: the shared train options', else the method's defaults, as
    api.train resolves them) and seed; so `--lr 0.01` and the probe's default are one point."""
    from ..api import train_config

    out = []
    for p in points:
        cfg = train_config(get_method(p.method).train_defaults, base | p.train_cfg())
        out.append({"method": p.method, "layers": backbones[effective_layer(p)].layer_key, "lr": cfg.lr,
                    "weight_decay": cfg.weight_decay, "seed": p.seed})
    return out


def open_journal(settled: list[dict], data: str, backbone, base: dict, shots: int | None, max_train: int | None,
                 text_field: str, label_field: str, pair_field: str | None, cache_root: Path | None,
                 log: Callable[[str], None], resume: bool, keys: set[str], methods: tuple[str, ...],
                 legacy: dict[str, str] | None = None) -> Journal:
    """The journal of this sweep (its key: the whole command, with its data files as absolute paths), said
    when it holds points; SweepBusy where another process runs the same sweep now."""
    from ..backbone import as_saved
    from ..cache import default_root
    from ..data import resolve, resolved_files
    from . import journal as J

    _, files = resolve(data)
    name = as_saved(backbone.name)  # ./bert and its absolute path: one sweep
    # device and precision are each point's (its key holds the device and precision the pass ran with), so
    # --device cpu and the default on a CPU are one sweep
    options = dataclasses.asdict(backbone) | {"name": name, "device": None, "precision": None}
    context = {"points": settled, "data": resolved_files(files),
               "fields": [text_field, label_field, pair_field], "shots": shots, "max_train": max_train, "train": base,
               "backbone": options}
    local = Path(str(data)).expanduser()
    header = {"data": str(local.resolve()) if local.exists() else str(data), "backbone": name,
              "methods": ",".join(methods), "points": len(settled)}
    root = Path(cache_root) if cache_root is not None else default_root()
    journal = Journal(root / NAME.format(key=sweep_key(context)), header, log, resume, keys, legacy)
    J.current = journal
    if (line := journal.opening_line()) is not None:
        log(line)
    return journal


def kept_note(result: SweepResult) -> str:
    """Where the best point's saved model is the logistic regression its folds kept, not the head it
    names, a clause saying so; "" otherwise."""
    kept, method = result.best_saved_as, result.best["method"]
    if kept is None or kept == method:
        return ""
    return (f", as a {kept}: on these few labels its folds found the {method} head no better than a logistic "
            f"regression and kept that (train --fallback off keeps the head)")


def _seconds(t_start: float, extract_s: float, load_s: float, rows: list[dict], save_s: float) -> dict:
    fits = float(sum(r["seconds"] - r["extract_seconds"] for r in rows if not r.get("reused")))
    return {"wall": time.perf_counter() - t_start, "extraction": extract_s, "backbone_loading": load_s,
            "fits": fits, "saving_best": save_s, "points": len(rows), "reused_points": sum(bool(r.get("reused")) for r in rows)}


def tabulate(rows: list[dict]) -> list[dict]:
    """One row per setting (method, layer, lr, weight decay): score and test accuracy, mean ± std
    (population) over its seeds, ordered as first seen."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["layer"], r["lr"], r["weight_decay"]), []).append(r)
    out = []
    for (method, layer, lr, wd), rs in groups.items():
        done = [r for r in rs if not r.get("diverged")]  # a diverged seed has no score: the others' are the setting's
        s, t = np.array([r["score"] for r in done]), np.array([r["test_accuracy"] for r in done])
        stat = (lambda f, a: float(f(a)) if len(a) else None)
        out.append({"method": method, "layer": layer, "lr": lr, "weight_decay": wd, "seeds": [r["seed"] for r in rs],
                    "score_is": done[0]["score_is"] if done else None, "score_mean": stat(np.mean, s),
                    "score_std": stat(np.std, s), "test_mean": stat(np.mean, t), "test_std": stat(np.std, t),
                    "fell_back": sum(r["model_method"] != r["method"] for r in done),
                    "diverged": len(rs) - len(done),
                    "seconds_mean": float(np.mean([r["seconds"] - r["extract_seconds"] for r in rs]))})
    return out


NOT_CALIBRATED = ("the head's own scale: no temperature was fitted (`--calibrate off`, no validation split or "
                  "cross-validation folds to fit it on, fewer than 100 examples there, or a best temperature at the "
                  "end of its range)")
STD_NOTE = "± is the standard deviation over seeds, population (ddof 0: divided by the number of seeds, not one less)."


def markdown(result: SweepResult, data: str) -> str:
    lines = [f"# sweep on {data}: {len(result.rows)} points, {len(result.table)} settings", "",
             "| method | layer | lr | weight decay | seeds | score (mean ± std) | test accuracy (mean ± std) | fit s |",
             "|---|---|---|---|---|---|---|---|"]
    for t in ranked(result.table):
        mark = " **best**" if t is result.best else ""
        cell = (lambda m, sd: f"{t[m]:.2f} ± {t[sd]:.2f}" if t[m] is not None else "—")
        lines.append(f"| {t['method']}{setting_marks(t)}{mark} | {t['layer']} | {t['lr']:g} | {t['weight_decay']:g} | "
                     f"{len(t['seeds'])} | {cell('score_mean', 'score_std')} | {cell('test_mean', 'test_std')} | "
                     f"{t['seconds_mean']:.1f} |")
    lines += ["", STD_NOTE]
    if any(t["diverged"] for t in result.table):
        lines += ["", "\"diverged in k of n\": in k of the setting's n seeds training stopped being finite (its loss "
                      "or weights; a learning rate too high for it, or learning rate × weight decay of 1 or more), so "
                      "those seeds have no score; the setting's figures are its other seeds', and it is not chosen as "
                      "the best."]
        lines += [f"- {r['method']} layer {r['layer']} lr {r['lr']:g} wd {r['weight_decay']:g} seed {r['seed']}: "
                  f"{r['diverged']}" for r in result.rows if r.get("diverged")]
    if any(t["fell_back"] for t in result.table):
        lines += ["", "\"a probe in k of n\": in k of the setting's n seeds, cross-validation found the head no better "
                      "than a logistic regression with C=1 on the same states and kept that regression (saved as a "
                      "probe), so those scores are that regression's (a probe row's C is chosen by its folds, so it "
                      "may differ); `--fallback off` (train) keeps the head whatever the folds say."]
    solved = [r for r in result.rows if "C" in r["selection"]]
    if any(len({(r["lr"], r["weight_decay"]) for r in solved if r["method"] == m}) > 1  # said where the grid varied
           for m in {r["method"] for r in solved}):  # them for one method (methods' own default lr differ)
        lines += ["", "The probe's points on fewer than --cv-below examples are solved by L-BFGS with their C chosen "
                      "by cross-validation: --lr and --weight-decay do not change them."]
    if result.best_seed is not None:  # which row best/ is: the setting's score is the mean over its seeds
        row = next(r for r in result.rows if r["seed"] == result.best_seed and all(
            r[k] == result.best[k] for k in ("method", "layer", "lr", "weight_decay")))
        chosen = " (of its seeds, the first whose folds kept the head)" \
            if result.best["fell_back"] and not kept_note(result) else ""
        lines += ["", f"best/ is the best setting's seed {result.best_seed}{chosen}: {row['score_is']} "
                      f"{row['score']:.2f}, test {row['test_accuracy']:.2f}{kept_note(result)}."]
        from ..export.card import temperature_words

        lines += ["", f"best/'s probabilities: {temperature_words(result.best_temperature) or NOT_CALIBRATED}."]
    elif kept_note(result):
        lines += ["", f"The best setting's saved model (best/){kept_note(result)}."]
    s = result.seconds
    if s:
        lines += ["", f"score: {result.best['score_is']}. Wall {s['wall']:.1f}s: extraction {s['extraction']:.1f}s, "
                      f"backbone loading {s['backbone_loading']:.1f}s, {s['points'] - s.get('reused_points', 0)} fits {s['fits']:.1f}s, "
                      f"saving the best {s['saving_best']:.1f}s."]
        if s.get("reused_points"):
            lines += ["", f"{s['reused_points']} of the {s['points']} points were finished by an interrupted run of this "
                          f"sweep and reused from its journal: the fits counted above are this run's; the fit seconds in "
                          f"the table are each point's own."]
    return "\n".join(lines) + "\n"


def ranked(table: list[dict]) -> list[dict]:
    """The settings by mean score, highest first; those with no seed that trained (all diverged) last."""
    return sorted(table, key=lambda t: (t["score_mean"] is None, -(t["score_mean"] or 0.0)))


def setting_marks(t: dict) -> str:
    """What the table and the plot say beside a setting's name: seeds kept as a probe, seeds diverged."""
    n = len(t["seeds"])
    return ((f" (a probe in {t['fell_back']} of {n})" if t["fell_back"] else "")
            + (f" (diverged in {t['diverged']} of {n})" if t["diverged"] else ""))


def plot(result: SweepResult, path: Path) -> None:
    """Score (mean ± std over seeds) of every setting with a seed that trained, best first, with test
    accuracy beside it."""
    from ..plot import figure

    table = [t for t in ranked(result.table) if t["score_mean"] is not None]
    names = [f"{t['method']} L{t['layer']} lr{t['lr']:g} wd{t['weight_decay']:g}"  # marks as the table has them
             + setting_marks(t) + (" ★ best" if t is result.best else "") for t in table]
    y = np.arange(len(table))
    fig = figure(figsize=(8, 1.5 + 0.28 * len(table)))
    ax = fig.subplots()
    ax.errorbar([t["score_mean"] for t in table], y - 0.15, xerr=[t["score_std"] for t in table], fmt="o",
                label=table[0]["score_is"] if table else "score")
    ax.errorbar([t["test_mean"] for t in table], y + 0.15, xerr=[t["test_std"] for t in table], fmt="s",
                label="test accuracy")
    ax.set_yticks(y, names, fontsize=7)
    ax.invert_yaxis()
    gone = len(result.table) - len(table)  # settings whose every seed diverged: nothing to draw
    ax.set_xlabel("accuracy (%), mean ± standard deviation over seeds (population, ddof 0)"
                  + (f"\nnot drawn: {gone} setting(s) that diverged in every seed (sweep.md lists them)" if gone else ""))
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)  # above, off the data
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write(result: SweepResult, folder: Path, data: str) -> None:
    (folder / "sweep.json").write_text(json.dumps(result.to_json() | {"environment": run_environment()}, indent=1,
                                                  allow_nan=False))
    (folder / "sweep.md").write_text(markdown(result, data))
    plot(result, folder / "sweep.png")

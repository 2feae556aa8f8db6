"""Sentence pairs: encoding, cache keys, explanations, data errors and the CLI, on the tiny BERT
(real MiniLM tokenizer) and a slice of the real MRPC files."""
import io
import json
import re
import sys

import numpy as np
import pytest
import torch

from clirun import cli
from numerics import assert_close, assert_differs, tol
from frozentune import api
from frozentune import model as M
from frozentune.backbone import Backbone
from frozentune.cache import cache_key, get_or_build
from frozentune.data import DataError, load_classification, read_split, read_texts, text_fields
from frozentune.pairs import PairError, glue, pair_kind, separator_ids, separator_mask

pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [("A man is playing a guitar on stage.", "A person makes music."),
         ("Two dogs run through the snow.", "The animals are asleep indoors."),
         ("The unbelievably long-winded speaker kept talking.", "Someone spoke.")]
LONG = ("word " * 300, "another sentence that is also rather long " * 20)


@pytest.fixture(scope="module")
def bb(tiny_bert):
    return Backbone.load(str(tiny_bert), max_length=32)


def test_pair_encoding_is_the_tokenizers_own(bb):
    for max_length in (32, 12):  # 12: both texts are cut, longest first
        bb.max_length = max_length
        tokens = bb.tokenize(PAIRS + [LONG])
        a, b = [p[0] for p in PAIRS + [LONG]], [p[1] for p in PAIRS + [LONG]]
        want = bb.tok(a, b, truncation="longest_first", max_length=max_length)
        assert [t.tolist() for t in tokens.ids] == want["input_ids"]
        assert [t.tolist() for t in tokens.types] == want["token_type_ids"]
        assert max(len(x) for x in tokens.ids) == max_length
    bb.max_length = 32
    # single texts carry no token types (the model's default of zeros), pairs do
    assert bb.tokenize(["one text"]).types is None


def test_separator_found_again_in_the_ids(bb):
    sep = separator_ids(bb.tok)
    assert sep == (bb.tok.sep_token_id,)
    tokens = bb.tokenize(PAIRS)
    enc = bb.tok([p[0] for p in PAIRS], [p[1] for p in PAIRS], truncation="longest_first", max_length=32)
    ids, mask, _ = tokens.padded(range(len(PAIRS)), bb.pad_id())
    marked = separator_mask(ids, mask.bool(), sep)
    for k in range(len(PAIRS)):
        # the separator is the token just before the second text's first
        assert marked[k].nonzero().flatten().tolist() == [enc.sequence_ids(k).index(1) - 1]


SPECIAL = ("The answer is [SEP] or [CLS], as typed.", "A second [sep] text [PAD] here.")


def test_a_literal_separator_in_a_text_is_read_as_text(bb):
    """A "[SEP]" typed in a pair's first text is its characters, not the tokenizer's separator:
    the pair keeps one boundary, where the tokenizer's own sequence ids put it, and explanations
    slice each text where they say. Read as the special token, it ended the first text early."""
    tokens = bb.tokenize([SPECIAL])
    enc = bb.tok(*SPECIAL, truncation="longest_first", max_length=32, split_special_tokens=True)
    assert tokens.ids[0].tolist() == enc["input_ids"]
    special = {bb.tok.sep_token_id, bb.tok.cls_token_id, bb.tok.pad_token_id}
    assert [i for i in enc["input_ids"] if i in special] == [bb.tok.cls_token_id] + [bb.tok.sep_token_id] * 2
    ids, mask, _ = tokens.padded([0], bb.pad_id())
    marked = separator_mask(ids, mask.bool(), separator_ids(bb.tok))
    assert marked[0].nonzero().flatten().tolist() == [enc.sequence_ids(0).index(1) - 1]
    assert bb.tokenize(["just [SEP] one"]).ids[0].tolist().count(bb.tok.sep_token_id) == 1  # single texts too
    model = M.build_classifier("selfexplain", bb, ["neg", "pos"], {"max_span_width": 4, "dim": 16}, seed=0)
    model.pair_fields = ("premise", "hypothesis")
    (row,) = api.explain(model, [SPECIAL], top=200)
    spans = row["explanation"]["spans"]
    assert {s["part"] for s in spans} == {0, 1}
    for span in spans:
        assert SPECIAL[span["part"]][span["start"]:span["end"]] == span["text"]
    # only texts holding a special token's string get another cache key (their ids changed)
    assert "split_special_tokens" not in cache_key(bb, PAIRS)[1]
    assert cache_key(bb, PAIRS + [SPECIAL])[1]["split_special_tokens"] is True
    assert cache_key(bb, ["a [mask] here"])[1]["split_special_tokens"] is True


def test_cache_keys_of_pairs_and_glued_texts_differ(bb):
    key_pair, fields = cache_key(bb, PAIRS)
    key_glued, _ = cache_key(bb, [glue(p) for p in PAIRS])
    key_swapped, _ = cache_key(bb, [(b, a) for a, b in PAIRS])
    assert len({key_pair, key_glued, key_swapped}) == 3
    assert fields["pairs"] is True
    assert cache_key(bb, list(PAIRS))[0] == key_pair  # same pairs, same entry


def test_pair_states_are_one_pass_with_token_types(bb, tmp_path):
    """The cached states of a pair are the backbone's states of the pair encoding, token types
    included (they change the states: type 1 has its own embedding)."""
    cache, _ = get_or_build(bb, PAIRS, tmp_path, progress=False)
    tokens = bb.tokenize(PAIRS)
    ids, mask, types = tokens.padded([0], bb.pad_id())
    with torch.no_grad():
        want = bb.states(ids, mask, types)[0]
        without = bb.states(ids, mask)[0]
    got, _ = cache.batch(np.array([0]))
    # fp16 cache rounding of fp32 states: 2^-11 relative, plus float error of a 2-layer pass
    torch.testing.assert_close(got[0], want, rtol=2 ** -10, atol=2 ** -10)
    assert not torch.allclose(want, without, atol=1e-3)


def test_mixed_inputs_and_wrong_kind_are_refused(bb, tmp_path):
    with pytest.raises(PairError, match="mix sentence pairs and single texts"):
        pair_kind([PAIRS[0], "single"])
    model = M.build_classifier("probe", bb, ["neg", "pos"])
    model.pair_fields = ("premise", "hypothesis")
    with pytest.raises(PairError, match=r"trained on sentence pairs \(premise, hypothesis\).*--pair FIRST SECOND"):
        api.predict(model, ["just one"])
    model.pair_fields = ("text", None)
    with pytest.raises(PairError, match="trained on single texts"):
        api.predict(model, [PAIRS[0]])


def test_selfexplain_spans_stay_inside_one_text(bb):
    """Every span of a pair lies inside the premise or the hypothesis; its offsets slice the text
    it names, and the separator is never in one."""
    model = M.build_classifier("selfexplain", bb, ["neg", "pos"], {"max_span_width": 4, "dim": 16}, seed=0)
    model.pair_fields = ("premise", "hypothesis")
    rows = api.explain(model, PAIRS, top=200)
    seen_parts = set()
    for (first, second), row in zip(PAIRS, rows):
        assert row["text"] == first and row["text_pair"] == second
        for span in row["explanation"]["spans"]:
            assert "[SEP]" not in span["text"] and span["part"] in (0, 1)
            source = (first, second)[span["part"]]
            assert source[span["start"]:span["end"]] == span["text"]
            seen_parts.add(span["part"])
    assert seen_parts == {0, 1}
    # the lines for people say which text a span is in, as the JSON's `part` does
    for row in rows:
        for span, line in zip(row["explanation"]["spans"], row["lines"]):
            assert line.endswith(('" (1st)', '" (2nd)')[span["part"]])


@pytest.mark.parametrize("method", ["ytuning", "space"])
def test_token_explanations_name_their_text(bb, method):
    model = M.build_classifier(method, bb, ["neg", "pos"], seed=0)
    model.pair_fields = ("premise", "hypothesis")
    rows = api.explain(model, PAIRS[:1], top=50)
    pieces = [p for group in _weighted_pieces(rows[0]["explanation"]) for p in group]
    assert pieces and {p["part"] for p in pieces if p["start"] is not None} <= {0, 1}
    for p in pieces:
        if p["start"] is not None:
            assert PAIRS[0][p["part"]][p["start"]:p["end"]] == p["text"]
    # the lines name the text too (two '.' of a pair looked the same there)
    text = "\n".join(rows[0]["lines"])
    assert "(1st)" in text and "(2nd)" in text


def _weighted_pieces(explanation: dict):
    """Every list of {text, start, end, weight} in an explanation (their layout differs per method)."""
    if isinstance(explanation, dict):
        if {"text", "start", "end", "weight"} <= set(explanation):
            yield [explanation]
        for v in explanation.values():
            yield from _weighted_pieces(v)
    elif isinstance(explanation, list):
        for v in explanation:
            yield from _weighted_pieces(v)


def test_missing_pair_field_names_the_line(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps({"premise": "a", "hypothesis": "b", "label": "x"}) + "\n"
                 + json.dumps({"premise": "c", "label": "y"}) + "\n")
    with pytest.raises(DataError, match=r"train.jsonl:2: missing field 'hypothesis'.*--text-pair-field"):
        read_split(f, "premise", "label", "hypothesis")
    with pytest.raises(DataError, match=r"train.jsonl:2: missing field 'hypothesis'"):
        read_texts(f, "premise", "hypothesis")
    f.write_text(json.dumps({"premise": "a", "hypothesis": " ", "label": "x"}) + "\n")
    with pytest.raises(DataError, match=r"train.jsonl:1: empty text in field 'hypothesis'"):
        read_split(f, "premise", "label", "hypothesis")
    with pytest.raises(DataError, match="is the --text-field too"):
        text_fields("x", "premise", "premise")


def test_the_label_field_as_a_text_field_is_refused(tmp_path):
    """--label-field naming a text field fed the label in as input: a probe trained and scored 100 with no word."""
    f = tmp_path / "mine.jsonl"
    f.write_text("".join(json.dumps({"q": f"question {i}", "a": f"answer {i % 5}", "lab": "yes no".split()[i % 2]})
                         + "\n" for i in range(40)))
    for fields, flag in (((f, "q", "lab", "lab"), "--text-pair-field"), ((f, "lab", "lab", "a"), "--text-field"),
                         ((f, "lab", "lab"), "--text-field")):
        with pytest.raises(DataError, match=f"--label-field 'lab' is the {flag} too: the label would be read as the input"):
            load_classification(str(fields[0]), *fields[1:3], pair_field=fields[3] if len(fields) > 3 else None)
    with pytest.raises(DataError, match="--label-field 'text' is the --text-field too"):  # the default text field
        load_classification(str(f), None, "text")
    cli("train", "--method", "probe", "--data", f, "--text-field", "q", "--text-pair-field", "lab", "--label-field",
        "lab", "--output", tmp_path / "run", code=2, contains=("--label-field 'lab' is the --text-pair-field too",))
    assert not (tmp_path / "run").exists()
    assert len(load_classification(str(f), "q", "lab", pair_field="a").train.texts) > 0  # distinct fields: read


def test_named_pair_datasets_pick_their_fields(monkeypatch, mrpc_slice):
    monkeypatch.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    ds = load_classification("mrpc")
    assert (ds.text_field, ds.pair_field) == ("sentence1", "sentence2")
    assert all(isinstance(t, tuple) and len(t) == 2 for t in ds.train.texts)
    assert ds.labels == ["not_equivalent", "equivalent"]
    assert text_fields("mrpc", "sentence1", None) == ("sentence1", None)  # a field given: a single text
    # only the second field given: the dataset's own first field stays (it became `text`, and the error named
    # a missing 'text' instead of the second field asked for)
    assert text_fields("rte", None, "nosuch") == ("premise", "nosuch")
    with pytest.raises(DataError, match="missing field 'nosuch'"):
        load_classification("mrpc", None, pair_field="nosuch")
    # the dataset's first field as the second: it trained on (sentence1, sentence1), sentence2 left out
    with pytest.raises(DataError, match=re.escape("--text-pair-field 'sentence1' is the --text-field too (mrpc's pairs "
                                                  "are sentence1, sentence2)")):
        load_classification("mrpc", None, pair_field="sentence1")
    # one field of a pair dataset alone: read as single texts, and said (it was silent)
    ds = load_classification("mrpc", "sentence2")
    assert (ds.text_field, ds.pair_field) == ("sentence2", None) and isinstance(ds.train.texts[0], str)
    assert any("--text-field sentence2 alone reads sentence2 as single texts and leaves sentence1 out" in n
               for n in ds.notes)


def test_a_file_named_like_a_pair_dataset_reads_its_text_field(tmp_path):
    """A user's rte.jsonl of text + label: the named dataset's fields were forced on it (missing field
    'premise', whatever --text-field said)."""
    rows = [{"text": f"{w} film {i}", "label": "pos" if i % 2 else "neg"} for i, w in enumerate(["good", "bad"] * 15)]
    (tmp_path / "rte.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for field in (None, "text"):
        ds = load_classification(str(tmp_path / "rte.jsonl"), field)
        assert ds.pair_field is None and isinstance(ds.train.texts[0], str) and not any("pairs" in n for n in ds.notes)


def test_cli_pairs_end_to_end(monkeypatch, mrpc_slice, tiny_bert, tmp_path):
    """train on pairs → eval reports F1 of `equivalent` → predict --pair and --input with both
    fields agree → a single text is refused with what to do."""
    monkeypatch.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    out, cache = tmp_path / "m", tmp_path / "cache"
    cli("train", "--method", "probe", "--data", "mrpc", "--backbone", tiny_bert, "--max-length", 48,
        "--output", out, "--cache-dir", cache, "--quiet", code=0)
    result = json.loads((out / "result.json").read_text())
    assert result["fields"] == {"text": "sentence1", "text_pair": "sentence2"}
    assert result["positive_label"] == "equivalent" and 0 <= result["metrics"]["positive_f1"] <= 100
    ev = cli("eval", "--model", out, "--data", "mrpc", "--cache-dir", cache, code=0)
    assert json.loads(ev.out)["metrics"] == result["metrics"]
    # eval read as single texts: the advice is eval's fields, not predict's --pair / --input
    cli("eval", "--model", out, "--data", "mrpc", "--cache-dir", cache, "--text-field", "sentence1",
        contains="give --text-field sentence1 --text-pair-field sentence2")
    first = json.loads((mrpc_slice / "mrpc" / "test.jsonl").read_text().splitlines()[0])
    by_arg = cli("predict", "--model", out, "--pair", first["sentence1"], first["sentence2"], code=0)
    by_file = cli("predict", "--model", out, "--input", mrpc_slice / "mrpc" / "test.jsonl", code=0)
    row = json.loads(by_arg.out)
    assert row == json.loads(by_file.out.splitlines()[0])
    assert row["text"] == first["sentence1"] and row["text_pair"] == first["sentence2"]
    cli("predict", "--model", out, "just one text", contains="trained on sentence pairs (sentence1, sentence2)")
    for side, pair in ((0, ["\u0301", "He plays."]), (1, ["A man plays.", "\u0301\u0301"])):  # were read as one text
        cli("predict", "--model", out, "--pair", *pair, contains=f"texts[0]: the tokenizer keeps none of the "
            f"characters of its {('first', 'second')[side]} text")
    plain = tmp_path / "lines.txt"
    plain.write_text("one\ntwo\n")
    cli("predict", "--model", out, "--input", plain, contains=("give them in a .jsonl / .csv / .tsv file",
                                                              "as JSON Lines on standard input (--input -)"))
    # standard input: JSON Lines with the model's fields (a pair has no one-line plain form), as the file gives
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((mrpc_slice / "mrpc" / "test.jsonl").read_bytes())))
    assert cli("predict", "--model", out, "--input", "-", code=0).out == by_file.out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"A man plays.\tHe plays.\n")))
    cli("predict", "--model", out, "--input", "-", contains=("<standard input>:1: not valid JSON Lines",
                                                            "standard input (--input -) are read as JSON Lines"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"sentence1": "A man plays."}\n')))
    cli("predict", "--model", out, "--input", "-", contains="<standard input>:1: missing field 'sentence2'")
    # eval on another task's data (RTE's fields and labels): said in one error, not the fields, then the labels
    rte = tmp_path / "rte" / "test.jsonl"
    rte.parent.mkdir()
    rte.write_text("".join(json.dumps({"premise": f"a man plays {i}", "hypothesis": "music", "label": lab}) + "\n"
                           for i, lab in enumerate(["entailment", "not_entailment"] * 3)))
    cli("eval", "--model", out, "--data", rte.parent, "--cache-dir", cache,
        contains=("data of another task: no row has the model's field 'sentence1' (its fields: 'premise', "
                  "'hypothesis', 'label')", "its labels ('entailment', 'not_entailment') are none of the model's"))


def test_plot_concepts_reads_pairs_as_the_model_was_trained(monkeypatch, mrpc_slice, tiny_bert, tmp_path):
    """plot-concepts of a pair `space` model: the model's two fields by default; one field alone is refused
    as eval refuses it (it drew the first texts alone, silently, and had no --text-pair-field)."""
    monkeypatch.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    out, cache = tmp_path / "m", tmp_path / "cache"
    cli("train", "--method", "space", "--data", "mrpc", "--backbone", tiny_bert, "--max-length", 48, "--epochs", 1,
        "--output", out, "--cache-dir", cache, "--quiet", code=0)
    cli("plot-concepts", "--model", out, "--data", "mrpc", "--cache-dir", cache, "--output", tmp_path / "a.png",
        code=0, show="wrote")
    cli("plot-concepts", "--model", out, "--data", "mrpc", "--cache-dir", cache, "--output", tmp_path / "b.png",
        "--text-field", "sentence1", contains="give --text-field sentence1 --text-pair-field sentence2")
    assert not (tmp_path / "b.png").exists()
    cli("plot-concepts", "--model", out, "--data", "mrpc", "--cache-dir", cache, "--output", tmp_path / "c.png",
        "--text-field", "sentence2", "--text-pair-field", "sentence1", code=0, show="wrote")


# ----------------------------------------------------------------------------- --no-token-types
def test_no_token_types_keeps_the_ids_and_drops_the_types(tiny_bert, bb, tmp_path):
    """Pairs fed without token types: the same ids (separator included), no types, so the states are
    the model's with type 0 everywhere; another cache entry than the typed pairs, the same entry for
    single texts (which have no types either way)."""
    off = Backbone.load(str(tiny_bert), max_length=32, token_types=False)
    typed, untyped = bb.tokenize(PAIRS), off.tokenize(PAIRS)
    assert [t.tolist() for t in untyped.ids] == [t.tolist() for t in typed.ids] and untyped.types is None
    assert off.tokenize_with_views(PAIRS)[0].types is None
    assert cache_key(off, PAIRS)[0] != cache_key(bb, PAIRS)[0] and cache_key(off, PAIRS)[1]["token_types"] is False
    assert cache_key(off, ["one text"])[0] == cache_key(bb, ["one text"])[0]
    cache, _ = get_or_build(off, PAIRS, tmp_path, progress=False)
    ids, mask, _ = untyped.padded([0], off.pad_id())
    with torch.no_grad():
        want = off.states(ids, mask, torch.zeros_like(ids))[0]
    got, _ = cache.batch(np.array([0]))
    torch.testing.assert_close(got[0], want, rtol=2 ** -10, atol=2 ** -10)  # fp16 cache rounding, as above
    # --list tells the two entries of one file apart (they differed in no column: which to --remove?)
    get_or_build(bb, PAIRS, tmp_path, progress=False)
    get_or_build(bb, ["one text"], tmp_path, progress=False)
    listed = json.loads(cli("cache", "--list", "--json", "--cache-dir", tmp_path, code=0).out)
    assert sorted(r["input"] for r in listed) == ["pairs", "pairs without token types", "texts"]
    assert f"{len(PAIRS):,} pairs without token types" in cli("cache", "--list", "--cache-dir", tmp_path, code=0).out


def test_no_token_types_is_saved_and_used_by_predict(monkeypatch, mrpc_slice, tiny_bert, tmp_path):
    monkeypatch.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    runs = {}
    for types in (True, False):
        out = tmp_path / f"m-{types}"
        api.train("probe", "mrpc", api.BackboneOptions(str(tiny_bert), max_length=48, precision="fp32", token_types=types),
                  output=out, cache_root=tmp_path / "cache", progress=False, log=lambda s: None)
        runs[types] = out
    config = json.loads((runs[False] / "config.json").read_text())
    assert config["backbone"]["token_types"] is False
    model = M.load(runs[False])
    assert model.backbone_ref.token_types is False
    # predict reads the pair as it was trained: the probe on type-0 states
    got = api.predict(model, PAIRS)
    tokens = model.backbone_ref.tokenize(PAIRS)
    ids, mask, types = tokens.padded(range(len(PAIRS)), model.backbone_ref.pad_id())
    assert types is None
    typed = Backbone.load(str(tiny_bert), max_length=48).tokenize(PAIRS).padded(range(len(PAIRS)), 0)[2]
    sep = separator_mask(ids, mask.bool(), separator_ids(model.backbone_ref.tok))

    def probs(token_types):
        with torch.no_grad():
            feats = M.as_cached(model.backbone_ref.states(ids, mask, token_types), model.cache_dtype)
            return model.head(M.Features(feats, mask.bool(), sep)).logits.softmax(-1)

    want, with_types = probs(None), probs(typed)
    got_p = torch.tensor([[r["scores"][lab] for lab in model.labels] for r in got])
    # predict's states, perhaps at another padded length: other float32 blocking, then the states'
    # float16 rounding (one rounding may flip); probabilities are at most 1
    assert_close(got_p, want, rtol=tol(torch.float16, 1), scale=1.0, what="types off")
    assert_differs(with_types, want, rtol=tol(torch.float16, 1), scale=1.0, what="types on vs off")  # so it can fail
    assert M.load(runs[True]).backbone_ref.token_types is True
    assert "without token type ids" in (runs[False] / "README.md").read_text()  # the model card says so
    assert "without token type ids" not in (runs[True] / "README.md").read_text()
    with pytest.raises(M.ModelLoadError, match="token types off, given .* on"):
        M.load(runs[False], backbone=Backbone.load(str(tiny_bert), max_length=48))
    # a sweep says it too (only its best model's config.json did)
    from frozentune.sweep import Grid, run_sweep

    lines = []
    run_sweep(Grid.parse("probe", "-1", "0.01", "0.01", "0"), "mrpc", api.BackboneOptions(
        str(tiny_bert), max_length=48, precision="fp32", token_types=False), cache_root=tmp_path / "cache",
        log=lines.append)
    assert ("data: sentence pairs fed without token type ids (--no-token-types), as every point's model records "
            "(from Python: BackboneOptions(token_types=False) for --no-token-types)") in lines


def test_no_token_types_refusals(monkeypatch, mrpc_slice, trec_slice, tiny_bert, tmp_path):
    monkeypatch.setenv("FROZENTUNE_DATA", str(mrpc_slice))
    cli("train", "--method", "probe", "--data", trec_slice, "--backbone", tiny_bert, "--no-token-types",
        "--output", tmp_path / "a", "--cache-dir", tmp_path / "c", "--quiet",
        contains="holds single texts, which have no token types")
    cli("cache", trec_slice, "--backbone", tiny_bert, "--no-token-types", "--cache-dir", tmp_path / "c",
        contains="holds single texts, which have no token types")
    cli("train", "--method", "conv", "--layers", 1, "--dim", 32, "--heads", 2, "--ffn-dim", 64, "--data", "mrpc",
        "--no-token-types", "--output", tmp_path / "b", "--quiet", contains="--no-token-types is for a frozen backbone")
    gen = tmp_path / "gen.jsonl"  # a source → target pairs file: generation data
    gen.write_text("".join(json.dumps({"source": f"s{i}", "target": f"t{i}"}) + "\n" for i in range(4)))
    cli("train", "--method", "prefix", "--data", gen, "--source-field", "source", "--target-field", "target",
        "--no-token-types", "--output", tmp_path / "g", contains="--no-token-types is for sentence-pair classification")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "g").exists()


def test_inputs_of_a_pair_model_never_read_one_field_as_both_texts(tmp_path, monkeypatch):
    """predict --input on a pair model: a --text-field that is the model's second field (or a
    --text-pair-field that is the first) would pair each text with itself; refused, as train refuses it."""
    from frozentune.api import read_inputs_with

    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"premise": "a man plays", "hypothesis": "nobody plays"}) + "\n")
    fields = ("premise", "hypothesis")
    assert read_inputs_with(fields, f) == [("a man plays", "nobody plays")]
    with pytest.raises(DataError, match=r"--text-field 'hypothesis'.*as both texts"):
        read_inputs_with(fields, f, text_field="hypothesis")
    with pytest.raises(DataError, match=r"--text-pair-field 'premise'.*as both texts"):
        read_inputs_with(fields, f, pair_field="premise")
    assert read_inputs_with(fields, f, text_field="hypothesis", pair_field="premise") == [("nobody plays", "a man plays")]
    # a single-text model given --text-pair-field: said so (it was read as the model's own pair field)
    for path in (f, tmp_path / "lines.txt"):
        path.touch()
        with pytest.raises(DataError, match=r"--text-pair-field hypothesis: the model takes single texts \(trained on "
                                            r"field 'premise'\), not pairs"):
            read_inputs_with(("premise", None), path, pair_field="hypothesis")
    with pytest.raises(DataError, match=r"--text-field premise: .*lines.txt is read as plain text, one text per line"):
        read_inputs_with(("premise", None), tmp_path / "lines.txt", text_field="premise")  # it was ignored
    # standard input: JSON Lines where fields are named (a pair model, or --text-field), else one text per line
    line = json.dumps({"premise": "a man plays", "hypothesis": "nobody plays"}) + "\n"
    for fields, text_field, want in ((("premise", "hypothesis"), None, [("a man plays", "nobody plays")]),
                                     (("premise", None), "hypothesis", ["nobody plays"]),
                                     (("premise", None), None, [line.strip()])):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(line.encode())))
        assert read_inputs_with(fields, "-", text_field=text_field) == want

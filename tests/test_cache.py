import json

import numpy as np
import pytest
import torch

from frozentune.backbone import Backbone, LayerSpec, length_batches, pad
from frozentune.cache import CacheError, CachedStates, cache_key, get_or_build
from numerics import ROUNDING, assert_close, exact, tol, transformer

TEXTS = ["a short one .", "a somewhat longer sentence about films and acting .", "ok",
         "what is the capital of france ?", "the movie was neither good nor bad , just long ."]


@pytest.fixture(scope="module")
def bb(tiny_bert):
    return Backbone.load(str(tiny_bert), max_length=16)


def live_states(bb, texts):
    """Reference: each text alone through the model, no padding at all."""
    out = []
    for ids in bb.tokenize(texts).ids:
        x = torch.from_numpy(ids)[None]
        with torch.no_grad():
            out.append(bb.encode(x, torch.ones_like(x))[0])
    return out


# the tiny BERT of conftest (2 layers, width 32, FFN 64, 4 heads of 8) over at most max_length=16 tokens
FORWARD = tol(torch.float32, transformer(2, 32, 64, 16, 8))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cached_equals_live(bb, cache_root, dtype):
    cache, secs = get_or_build(bb, TEXTS, cache_root, dtype=dtype, progress=False)
    assert secs > 0 and cache.n == len(TEXTS)
    for i, ref in enumerate(live_states(bb, TEXTS)):
        got = torch.from_numpy(np.array(cache.example(i), dtype=np.float32))
        assert got.shape == ref.shape
        # padded length-sorted batches vs one text alone (other kernel blocking), then stored in `dtype`
        stored = tol(torch.float16, ROUNDING) if dtype == "float16" else 0.0
        assert_close(got, ref, rtol=FORWARD + stored, what=f"text {i} ({dtype})")
        assert cache.token_ids(i).tolist() == bb.tokenize([TEXTS[i]]).ids[0].tolist()
    # a second call is a hit: no extraction
    again, secs2 = get_or_build(bb, TEXTS, cache_root, dtype=dtype, progress=False)
    assert secs2 == 0.0 and again.path == cache.path


def test_batch_pads_and_masks(bb, cache_root):
    cache, _ = get_or_build(bb, TEXTS, cache_root, progress=False)
    idx = np.array([2, 1, 4])
    hidden, mask = cache.batch(idx)
    lens = cache.lengths[idx]
    assert hidden.shape == (3, lens.max(), bb.dim) and hidden.dtype == torch.float32
    assert mask.sum(1).tolist() == lens.tolist()
    for r, i in enumerate(idx):
        exact(hidden[r, :lens[r]], torch.from_numpy(cache.example(i).astype(np.float32)),
              "batch copies the stored values, widened to float32 losslessly")
        assert hidden[r, lens[r]:].abs().sum() == 0  # exact: padding is zero-filled
    cache.release()  # dropping mapped pages keeps the data readable
    exact(cache.batch(idx)[0], hidden, "the same stored bytes read again")


def test_key_changes_with_every_input(tiny_bert, tiny_bert_other):
    base = Backbone.load(str(tiny_bert), max_length=16)
    key = cache_key(base, TEXTS)[0]
    variants = {
        "text": cache_key(base, TEXTS[:-1] + [TEXTS[-1] + "!"])[0],
        "order": cache_key(base, TEXTS[::-1])[0],
        "layer": cache_key(Backbone.load(str(tiny_bert), LayerSpec((-2,)), 16), TEXTS)[0],
        "layers": cache_key(Backbone.load(str(tiny_bert), LayerSpec((-1, -2), "concat"), 16), TEXTS)[0],
        "max_length": cache_key(Backbone.load(str(tiny_bert), max_length=17), TEXTS)[0],
        "weights": cache_key(Backbone.load(str(tiny_bert_other), max_length=16), TEXTS)[0],
        "dtype": cache_key(base, TEXTS, "float32")[0],
    }
    assert len(set(variants.values()) | {key}) == len(variants) + 1
    # and the same inputs give the same key (a fresh load of the same files)
    assert cache_key(Backbone.load(str(tiny_bert), max_length=16), list(TEXTS))[0] == key


def test_tokenizer_change_changes_key(tiny_bert):
    own = Backbone.load(str(tiny_bert), max_length=16)  # not the shared fixture: it gets modified
    key = cache_key(own, TEXTS)[0]
    own.tok.add_tokens(["frobnicate"])
    assert cache_key(own, TEXTS)[0] != key


def _fresh(bb, root):
    cache, _ = get_or_build(bb, TEXTS, root, progress=False)
    return cache.path


def test_truncated_file_is_detected_and_rebuild_fixes_it(bb, cache_root):
    path = _fresh(bb, cache_root)
    states = path / "states.bin"
    states.write_bytes(states.read_bytes()[:-10])
    with pytest.raises(CacheError, match="states.bin: truncated.*--rebuild-cache"):
        get_or_build(bb, TEXTS, cache_root, progress=False)
    fixed, secs = get_or_build(bb, TEXTS, cache_root, rebuild=True, progress=False)
    assert secs > 0 and fixed.n == len(TEXTS)


@pytest.mark.parametrize("name", ["states.bin", "ids.bin", "offsets.bin", "lengths.bin"])
def test_corrupt_byte_is_detected(bb, cache_root, name):
    path = _fresh(bb, cache_root)
    data = bytearray((path / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / name).write_bytes(bytes(data))
    with pytest.raises(CacheError, match=f"{name}: corrupt"):
        CachedStates(path)


def test_incompatible_or_partial_entries(bb, cache_root):
    path = _fresh(bb, cache_root)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps(dict(meta, format=999)))
    with pytest.raises(CacheError, match="format 999"):
        CachedStates(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(CacheError, match="corrupt metadata"):
        CachedStates(path)
    (path / "meta.json").unlink()
    with pytest.raises(CacheError, match="no meta.json"):
        CachedStates(path)


def test_interrupted_extraction_leaves_no_entry(bb, cache_root, monkeypatch):
    """An interrupt mid-shard leaves no entry and no partial shard; the rerun resumes and finishes."""
    import frozentune.extract.shards as S

    real = S.iter_states

    def dies_midway(*a, **k):
        for i, item in enumerate(real(*a, **k)):
            if i == 1:
                raise KeyboardInterrupt
            yield item

    many = [f"{t} {i}" for i in range(60) for t in TEXTS]  # several extraction batches
    monkeypatch.setattr(S, "iter_states", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        get_or_build(bb, many, cache_root, progress=False, max_tokens=256)
    monkeypatch.undo()
    assert [p.suffix for p in cache_root.iterdir()] == [".building"]  # no half entry, no lock
    assert not list(cache_root.rglob("*.partial-*"))  # no partial shard
    cache, secs = get_or_build(bb, many, cache_root, progress=False, max_tokens=256)
    assert secs > 0 and list(cache_root.iterdir()) == [cache.path]


def test_length_batches_respect_token_budget():
    lengths = np.array([5, 50, 7, 49, 3, 10, 10, 60])
    batches = length_batches(lengths, max_tokens=100, max_batch=4)
    assert sorted(np.concatenate(batches).tolist()) == list(range(8))
    for b in batches:
        assert len(b) * lengths[b].max() <= 100 or len(b) == 1
    ids, mask = pad([np.array([1, 2, 3]), np.array([4])], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_layer_choice(tiny_bert):
    cat = Backbone.load(str(tiny_bert), LayerSpec((-1, -2), "concat"), 16)
    avg = Backbone.load(str(tiny_bert), LayerSpec((-1, -2), "mean"), 16)
    assert cat.dim == 64 and avg.dim == 32
    x = torch.tensor([[101, 2000, 102]])
    m = torch.ones_like(x)
    with torch.no_grad():
        hs = cat.model(input_ids=x, attention_mask=m, output_hidden_states=True).hidden_states
        same = "the same BERT forward (same weights, kernels and ids); "
        exact(cat.encode(x, m), torch.cat([hs[-1], hs[-2]], -1), same + "concatenation copies")
        exact(avg.encode(x, m), (hs[-1] + hs[-2]) / 2, same + "a mean of two is (a + b) / 2, one rounding either way")
    from frozentune.backbone import BackboneError
    with pytest.raises(BackboneError, match="layer 7 out of range"):
        Backbone.load(str(tiny_bert), LayerSpec((7,)), 16).encode(x, m)
    with pytest.raises(BackboneError, match="comma-separated"):
        LayerSpec.parse("last")
    with pytest.raises(BackboneError, match="--max-length 4096: .* supports 128 positions; give --max-length 128 or less"):
        Backbone.load(str(tiny_bert), max_length=4096)


@pytest.mark.parametrize("layers,combine,says", [
    ((1, -2), "mean", "--layer 1,-2: 1 and -2 are both layer 1 of the model's hidden states 0..2"),
    ((-1, 2), "concat", "--layer -1,2: -1 and 2 are both layer 2 of the model's hidden states 0..2"),
    ((0, 0), "mean", "--layer 0,0: layer 0 is given twice"),
])
def test_a_layer_given_twice_is_refused(tiny_bert, layers, combine, says):
    """On a 2-layer model (hidden states 0..2) `1,-2` is layer 1 twice: refused with both spellings,
    never an entry of `1,1:mean` (one layer) or of a doubled width (concat)."""
    from frozentune.backbone import BackboneError

    with pytest.raises(BackboneError) as e:
        Backbone.load(str(tiny_bert), LayerSpec(layers, combine), 16)
    assert says in str(e.value) and "give each layer once" in str(e.value)
    bb = Backbone.load(str(tiny_bert), max_length=16)
    with pytest.raises(BackboneError, match="give each layer once"):  # a view on other layers too
        bb.with_layers(LayerSpec(layers, combine))


def test_a_layer_given_twice_through_the_cli(tiny_bert, trec_slice, tmp_path):
    from clirun import cli

    root = tmp_path / "c"
    cli("cache", trec_slice, "--backbone", tiny_bert, "--cache-dir", root, "--quiet", "--layer", "1,-2", code=2,
        contains=("--layer 1,-2", "both layer 1", "give each layer once"))
    assert not root.exists() or not any(root.iterdir())


def test_the_cache_folder_follows_xdg_and_refuses_a_home_that_is_not_there(tmp_path, monkeypatch):
    """HOME=/nonexistent (a service account): the cache was made there, as root, with nothing said. It is an
    error that says what to set; $XDG_CACHE_HOME, where set, is read as other tools read it."""
    from frozentune.backbone import cache_home

    monkeypatch.delenv("FROZENTUNE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "nonexistent"))
    with pytest.raises(CacheError, match=r"the home folder .*nonexistent does not exist \(a service account\?\), so "
                                         r"the default cache ~/.cache/frozentune has no place; set FROZENTUNE_CACHE"):
        cache_home()
    assert not (tmp_path / "nonexistent").exists()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_home() == tmp_path / "xdg" / "frozentune"
    monkeypatch.setenv("FROZENTUNE_CACHE", str(tmp_path / "mine"))
    assert cache_home() == tmp_path / "mine"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FROZENTUNE_CACHE")
    assert cache_home() == tmp_path / ".cache" / "frozentune"

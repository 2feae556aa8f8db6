"""The Python API's arguments as a user embedding frozentune passes them: a wrong type or shape is
answered with what to give (not a TypeError or AttributeError from deep inside, nor a silent wrong
result), the forms a user would expect are accepted, and `log` takes every message."""
from __future__ import annotations

import json

import numpy as np
import pytest

from frozentune import api
from frozentune.data import DataError
from frozentune.generation.prefix import PrefixError
from frozentune.registry import MethodError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def probe(tiny_bert, trec_slice, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "m"
    api.train("probe", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16), train_cfg={"epochs": 1},
              output=out, cache_root=out.parent / "c", progress=False, log=None)
    return out


def test_a_dataframe_is_refused_not_scored_as_its_column_names(probe):
    pd = pytest.importorskip("pandas")
    with pytest.raises(DataError, match=r"a DataFrame \(columns 'text'\); give a list of texts or \(first, second\) "
                                        r"pairs, e\.g\. df\['text'\]\.tolist\(\)$"):
        api.predict(probe, pd.DataFrame({"text": ["Who wrote Hamlet ?"]}))
    with pytest.raises(DataError, match=r"or for pairs list\(zip\(df\['premise'\], df\['hypothesis'\]\)\)"):
        api.predict(probe, pd.DataFrame({"premise": ["a"], "hypothesis": ["b"]}))
    assert len(api.predict(probe, pd.DataFrame({"text": ["Who wrote Hamlet ?"]})["text"])) == 1  # a column is a list


@pytest.mark.parametrize("sources, says", [
    ("name[Aromi], area[city centre]", "sources: a single str"),  # was decoded one character at a time
    ([], "sources: the list is empty"),
    (["name[Aromi]", ""], r"sources\[1\]: empty"),
    (["name[Aromi]", None], r"sources\[1\]: null; give each source as a string"),
    ([5], r"sources\[0\]: 5; give each source as a string"),
    (None, "sources: NoneType, not a list"),
])
def test_generate_checks_its_sources_first(sources, says, tmp_path):
    from frozentune.generation.run import generate_sources

    with pytest.raises(DataError, match=says):  # before any model is read: the folder need not exist
        generate_sources(tmp_path / "no-model", sources)


@pytest.mark.parametrize("call", [api.predict, api.predict_stream, api.explain])
def test_predict_and_explain_check_each_item_first(call, tmp_path):
    """An item that is neither a string nor a pair was found after the model was loaded (its device and
    precision lines printed, a second spent); it is said before any model is read: the folder need not exist."""
    from frozentune.pairs import PairError

    with pytest.raises(PairError, match="item 1 is NoneType: give a string, or a pair"):
        call(tmp_path / "no-model", ["How far is Paris ?", None])
    with pytest.raises(PairError, match=r"item 0 is a tuple of 3: give a string, or a pair \(first, second\)"):
        call(tmp_path / "no-model", [("a", "b", "c")])
    with pytest.raises(PairError, match="texts mix sentence pairs and single texts"):
        call(tmp_path / "no-model", [("a", "b"), "c"])


@pytest.mark.parametrize("call, error, says", [
    (lambda G, d: G.generate_sources(5, ["a source"]), MethodError, r"model_dir=5: give a folder or file path"),
    (lambda G, d: G.evaluate_generation(None, d), PrefixError, r"model_dir=None: give the folder"),
    (lambda G, d: G.train_generation("prefix", d, decoding={"num_beams": 1}, log=None), MethodError,
     r"decoding: a dict .*e\.g\. DecodeOptions\(\*\*\{'num_beams': 1\}\)$"),
    (lambda G, d: G.train_generation("prefix", d, fields="article", log=None), DataError,
     r"fields='article': give \(source field, target field\)"),
    (lambda G, d: G.train_generation("prefix", d, fields=("article", 5), log=None), DataError,
     r"--target-field 5: give the name of a field"),
    (lambda G, d: G.train_generation("prefix", d, max_train="4", log=None), DataError, r"--max-train '4': give a whole"),
    (lambda G, d: G.evaluate_generation(d, d, max_test="4"), DataError, r"--max-test '4': give a whole number"),
    (lambda G, d: G.evaluate_generation(d, d, source_field=3), DataError, r"--source-field 3: give the name"),
])
def test_generation_calls_name_a_wrong_argument(call, error, says, tmp_path):
    """A TypeError from pathlib, an AttributeError on a dict, a string unpacked into fields, a str count
    compared with an int: each is refused by name before anything loads (the folder need not exist)."""
    from frozentune.generation import run as G

    with pytest.raises(error, match=says):
        call(G, tmp_path / "nothing")


@pytest.mark.parametrize("chunk", [0, -1, "2", 1.5, True])
def test_a_chunk_is_a_whole_number_of_at_least_one(probe, chunk, tmp_path):
    """Checked when the stream is made, not when it is first read (a server making it lazily found out late)."""
    from frozentune.generation.run import generate_stream

    with pytest.raises(MethodError, match=rf"chunk={chunk!r}: give a whole number"):
        api.predict_stream(probe, ["a question ?"], chunk=chunk)
    with pytest.raises(MethodError, match=rf"chunk={chunk!r}: give a whole number"):
        generate_stream(tmp_path / "no-model", ["a source"], chunk=chunk)
    assert len(list(api.predict_stream(probe, ["a ?", "b ?", "c ?"], chunk=np.int64(2)))) == 3


def test_build_cache_takes_a_model_name_and_one_split_as_text(tiny_bert, trec_slice, tmp_path):
    rows = api.build_cache(str(trec_slice), str(tiny_bert), splits="test", cache_root=tmp_path / "c", progress=False,
                           log=None)  # "test" was read as the splits t, e, s, t; the name as BackboneOptions
    assert [r["split"] for r in rows] == ["test"] and rows[0]["examples"] == 40


def test_the_cache_messages_go_to_log(tiny_bert, trec_slice, tmp_path, monkeypatch, capsys):
    """api.train(log=lines.append) missed the cache's lines (printed to stderr whatever log was given);
    cache_log takes them apart, as the command line does (stderr, beside the bar)."""
    from frozentune import cache

    monkeypatch.setattr(cache, "SIZE_SAID", 0)  # every build is "large": its size line is said
    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    lines: list[str] = []
    api.train("probe", str(trec_slice), bb, train_cfg={"epochs": 1}, cache_root=tmp_path / "c", progress=False,
              log=lines.append)
    assert any(line.startswith("cache: extracting") for line in lines)
    assert "cache:" not in capsys.readouterr().err
    lines, apart = [], []
    api.build_cache(str(trec_slice), bb, cache_root=tmp_path / "c2", progress=False, log=lines.append,
                    cache_log=apart.append)
    assert any(x.startswith("cache: extracting") for x in apart) and not any(x.startswith("cache:") for x in lines)
    assert lines  # the build's own lines ("train: 120 examples ...")


def test_log_none_is_silence(tiny_bert, trec_slice, tmp_path, capsys):
    api.train("probe", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16), train_cfg={"epochs": 1},
              cache_root=tmp_path / "c", progress=False, log=None)  # TypeError: 'NoneType' object is not callable
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    with pytest.raises(MethodError, match="log='quiet': give a function that takes each message line"):
        api.train("probe", str(trec_slice), str(tiny_bert), log="quiet")


def test_wrong_types_are_answered(tiny_bert, trec_slice, probe, tmp_path):
    from frozentune.cache import CacheError
    from frozentune.extract.errors import ExtractError
    from frozentune.sweep import Grid, run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    with pytest.raises(MethodError, match=r"train_cfg: a list; give a dict of options"):
        api.train("probe", str(trec_slice), bb, train_cfg=[("lr", 0.1)], log=None)
    with pytest.raises(MethodError, match=r"output=5: give a folder or file path"):
        api.train("probe", str(trec_slice), bb, output=5, log=None)
    with pytest.raises(MethodError, match=r"cache_root=5: give a folder or file path"):
        api.evaluate_model(probe, str(trec_slice), cache_root=5, log=None)
    with pytest.raises(DataError, match=r"--label-field None: give the name of a field"):  # was "missing field None
        api.train("probe", str(trec_slice), bb, label_field=None, log=None)              # ... --text-pair-field"
    with pytest.raises(ExtractError, match=r"--device 0: give the device as text, .* \(cuda:0 for GPU 0\)"):
        api.predict(probe, ["a question ?"], device=0)
    with pytest.raises(MethodError, match=r"grid: a str \('probe'\); give a Grid"):
        run_sweep("probe", str(trec_slice), bb, log=None)
    with pytest.raises(MethodError, match=r"backbone: dict .* BackboneOptions\(\*\*\{'name'"):
        run_sweep(Grid.parse("probe"), str(trec_slice), {"name": str(tiny_bert)}, log=None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CacheError, match=r"cannot write the feature cache there \(File exists\)"):
        api.train("probe", str(trec_slice), bb, cache_root=tmp_path / "file", log=None)  # FileExistsError, raw


def test_explain_takes_numpy_integers(tiny_bert, trec_slice, tmp_path):
    out = tmp_path / "space"
    api.train("space", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16), train_cfg={"epochs": 1},
              output=out, cache_root=tmp_path / "c", progress=False, log=None)
    a = api.explain(out, ["Who wrote Hamlet ?"], top=np.int64(3))  # refused: "give a whole number of at least 1"
    b = api.explain(out, ["Who wrote Hamlet ?"], top=3)
    assert json.dumps(a) == json.dumps(b)


def test_more_wrong_types_are_answered(tiny_bert, trec_slice, probe, tmp_path):
    """The second walk-through: options, a sweep's train_cfg, yes/no arguments given as text."""
    from frozentune.sweep import Grid, run_sweep

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    for options in (5, ["x"]):  # TypeError: 'int' object is not iterable; ValueError: dictionary update sequence
        with pytest.raises(MethodError, match=rf"options: a {type(options).__name__}; give a dict of method 'probe'"):
            api.train("probe", str(trec_slice), bb, options=options, log=None)
    for cfg in ([("lr", 0.1)], ["seed"], "epochs=1", 5):  # the first ran, as if a dict
        with pytest.raises(MethodError, match=rf"train_cfg: a {type(cfg).__name__}; give a dict of options"):
            run_sweep(Grid.parse("probe"), str(trec_slice), bb, train_cfg=cfg, log=None)
    with pytest.raises(MethodError, match=r"overwrite='no': give True or False"):  # replaced the saved model
        api.train("probe", str(trec_slice), bb, output=probe, overwrite="no", log=None)
    with pytest.raises(MethodError, match=r"rebuild_cache='no': give True or False"):
        api.evaluate_model(probe, str(trec_slice), rebuild_cache="no", log=None)
    with pytest.raises(MethodError, match=r"cache_log=5: give a function"):  # named log=5
        api.train("probe", str(trec_slice), bb, cache_log=5, log=None)


def test_a_stream_without_a_terminal_says_its_progress_in_lines(tiny_bert, trec_slice, tmp_path, monkeypatch, capsys):
    """progress=True (the API's default) where stderr is no terminal (a log file, nohup, CI): rich drew nothing
    until the end, on stdout, and no minute lines were sent; now the lines go to the cache's log."""
    from frozentune import cache

    monkeypatch.setattr(cache, "SIZE_SAID", 0)
    monkeypatch.setattr(cache, "EVERY_S", 0.0)
    lines: list[str] = []
    api.build_cache(str(trec_slice), str(tiny_bert), splits="train", cache_root=tmp_path / "c", log=lines.append,
                    progress=True)
    assert any(line.startswith("extracting: ") and "texts/s" in line for line in lines)
    out, err = capsys.readouterr()
    assert "━" not in out + err


def test_engine_load_is_silent_with_log_none(probe, capsys):
    from frozentune.serve import Engine

    with Engine.load(probe, log=None) as e:  # TypeError: 'NoneType' object is not callable
        assert e.classify(["Who wrote Hamlet ?"])
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    with pytest.raises(TypeError, match="paths: 5; give a model folder"):
        Engine.load(5, log=None)

"""Errors in the caller's terms: the messages name the command line's flags; a caller of the Python API
is told, in one clause more, what it spells instead (`shots=`, `train_cfg["lr"]`, `BackboneOptions(…)`),
and the command line prints them as before."""
from __future__ import annotations

import pytest

from frozentune import FrozentuneError, api, cli, pyterms
from frozentune.data import DataError
from frozentune.registry import MethodError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_flag_mentioned_is_glossed_once_in_the_order_first_named():
    spelled = {"--shots": "shots=", "--max-train": "max_train=", "--lr": 'train_cfg["lr"]'}
    said = pyterms.said_in_python("--shots 3 and --max-train 10: give one of them (--shots alone: K per class)",
                                  spelled)
    assert said.endswith(" (from Python: shots= for --shots; max_train= for --max-train)")
    assert said.startswith("--shots 3 and --max-train 10: give one of them")


def test_a_message_without_a_flag_of_the_function_is_left_as_it_is():
    spelled = {"--shots": "shots="}
    for message in ("top=0: give a whole number of at least 1", "give a folder written by `frozentune train "
                    "--output`", "a--shots-like word, x--shots", ""):
        assert pyterms.said_in_python(message, spelled) == message


def test_a_flag_already_given_its_python_spelling_beside_it_is_not_glossed_again():
    spelled = {"--overwrite": "overwrite=", "--fallback": 'train_cfg["fallback"]', "--output": "output="}
    message = ("--output runs/x: already holds a saved model; pass --overwrite (overwrite=True in Python) to replace "
               "it; or train again with --fallback off (train_cfg={'fallback': 'off'} in Python)")
    assert pyterms.said_in_python(message, spelled) == message + " (from Python: output= for --output)"
    spelled = {"--occlusion": "occlusion=", "--top": "top="}
    message = "--occlusion / occlusion=True explains any classifier; --top 0: give 1 or more (max_top=5 here)"
    assert pyterms.said_in_python(message, spelled) == message + " (from Python: top= for --top)"


def test_the_spellings_of_train_come_from_its_arguments_and_their_dataclasses():
    spelled = pyterms.terms(api.train.__wrapped__, backbone=True, train_cfg=True, options=True)
    assert spelled["--shots"] == "shots=" and spelled["--text-pair-field"] == "pair_field="
    assert spelled["--cache-dir"] == "cache_root=" and spelled["--backbone"] == "backbone="
    assert spelled["--lr"] == 'train_cfg["lr"]' and spelled["--cv-below"] == 'train_cfg["cv_below"]'
    assert spelled["--precision"] == "BackboneOptions(precision=…)" and spelled["--layer"] == "BackboneOptions(layers=…)"
    assert spelled["--no-token-types"] == "BackboneOptions(token_types=False)"
    assert spelled["--dim"] == 'options["dim"]'
    assert spelled["--no-train-backbone"] == 'options["train_backbone"]=False'
    # predict takes its device and precision itself; it has no --output
    spelled = pyterms.terms(api.predict.__wrapped__)
    assert spelled["--device"] == "device=" and spelled["--model"] == "model_dir=" and "--output" not in spelled


def test_generation_names_its_own_arguments():
    from frozentune.generation.run import evaluate_generation, train_generation

    spelled = pyterms.terms(train_generation.__wrapped__, train_cfg=True, options=True)
    assert spelled["--backbone"] == "lm_name=" and spelled["--source-field"] == "fields=(SOURCE, TARGET)"
    assert spelled["--num-beams"] == "decoding=DecodeOptions(num_beams=…)"
    spelled = pyterms.terms(evaluate_generation.__wrapped__)
    assert spelled["--source-field"] == "source_field=" and spelled["--num-beams"] == "num_beams="


@pytest.mark.parametrize("kwargs, error, clause", [
    ({"shots": -1}, DataError, "(from Python: shots= for --shots)"),
    ({"shots": 3, "max_train": 10}, DataError, "(from Python: shots= for --shots; max_train= for --max-train)"),
    ({"train_cfg": {"lr": -1}}, MethodError, '(from Python: train_cfg["lr"] for --lr)'),
])
def test_train_from_python_says_what_python_spells(kwargs, error, clause, tiny_bert, trec_slice, tmp_path):
    with pytest.raises(error) as e:
        api.train("probe", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16), output=tmp_path / "m",
                  cache_root=tmp_path / "c", progress=False, log=None, **kwargs)
    assert str(e.value).endswith(clause) and str(e.value).count("from Python") == 1
    assert isinstance(e.value, FrozentuneError)
    assert not (tmp_path / "m").exists()


def test_the_command_line_prints_the_same_error_in_its_own_words(tiny_bert, trec_slice, tmp_path, capsys):
    rc = cli.main(["train", "--method", "probe", "--data", str(trec_slice), "--backbone", str(tiny_bert),
                   "--max-length", "16", "--shots", "3", "--max-train", "10", "--output", str(tmp_path / "m"),
                   "--cache-dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert rc == 2 and "--shots 3 and --max-train 10: give one of them" in err and "from Python" not in err


def test_only_the_outermost_call_says_it_and_the_command_line_none():
    @pyterms.in_python_terms()
    def inner(shots: int = 0):
        raise DataError(f"--shots {shots}: give 1 or more")

    @pyterms.in_python_terms()
    def outer(shots: int = 0):
        return inner(shots)

    with pytest.raises(DataError, match=r"^--shots -1: give 1 or more \(from Python: shots= for --shots\)$"):
        outer(-1)
    with pyterms.command_line(), pytest.raises(DataError, match=r"^--shots -1: give 1 or more$"):
        outer(-1)
    with pytest.raises(DataError, match=r"\(from Python: shots= for --shots\)$"):  # the context was put back
        inner(-1)


def test_a_flag_of_a_quoted_command_line_is_left_as_it_is():
    spelled = {"--output": "output=", "--rename": "rename="}
    message = "m: no config.json; give a folder written by `frozentune train --output` (--rename: OLD=NEW)"
    assert pyterms.said_in_python(message, spelled) == message + " (from Python: rename= for --rename)"


def test_message_lines_logged_inside_a_python_call_say_it_too():
    @pyterms.in_python_terms()
    def inner(shots: int = 0, log=print):
        log = api.as_log(log)
        log(f"data: --shots {shots}: 2 of each class")
        log("no flag here")

    @pyterms.in_python_terms()
    def outer(shots: int = 0, log=print):
        log = api.as_log(log)
        log("outer: --shots given")
        inner(shots, log)  # a nested call's as_log: glossed once, by the outermost call's spellings

    lines: list[str] = []
    outer(2, lines.append)
    assert lines == ["outer: --shots given (from Python: shots= for --shots)",
                     "data: --shots 2: 2 of each class (from Python: shots= for --shots)", "no flag here"]
    lines.clear()
    with pyterms.command_line():  # the command line's lines are its own words
        outer(2, lines.append)
    assert lines == ["outer: --shots given", "data: --shots 2: 2 of each class", "no flag here"]
    lines.clear()
    api.as_log(lines.append)("--shots: outside any call")  # no call to speak for: as it is
    assert lines == ["--shots: outside any call"]


def test_an_error_while_a_returned_stream_is_read_says_it_too():
    closed = []

    def rows(shots: int):
        try:
            yield 1
            raise DataError(f"--shots {shots}: give 1 or more")
        finally:
            closed.append(True)

    @pyterms.in_python_terms()
    def stream(shots: int = 0):
        return rows(shots)

    it = stream(-1)
    assert next(it) == 1
    with pytest.raises(DataError, match=r"\(from Python: shots= for --shots\)$"):
        next(it)
    assert closed == [True]
    it = stream(-1)
    next(it)
    it.close()  # closing the stream closes the one it reads
    assert closed == [True, True]


def test_the_error_keeps_its_type_and_attributes():
    from frozentune.backbone import NotFound

    @pyterms.in_python_terms()
    def load(backbone: str = "x"):
        raise NotFound(f"--backbone {backbone}: not found", reason="no such folder")

    with pytest.raises(NotFound) as e:
        load("nope")
    assert e.value.reason == "no such folder" and str(e.value).endswith("(from Python: backbone= for --backbone)")


def test_the_public_functions_of_the_python_api_are_wrapped():
    from frozentune.conv.pretrain import pretrain
    from frozentune.export.onnx import export_onnx
    from frozentune.generation.run import evaluate_generation, generate_sources, generate_stream, train_generation
    from frozentune.serve.engine import Engine
    from frozentune.sweep.grid import Grid
    from frozentune.sweep.run import run_sweep

    for fn in (api.train, api.evaluate_model, api.predict, api.predict_stream, api.explain, api.build_cache,
               api.plot_concepts, run_sweep, Grid.parse, train_generation, generate_sources, generate_stream,
               evaluate_generation, export_onnx, Engine.load, Engine.classify, Engine.explain, Engine.generate,
               pretrain, api.relabel):
        assert hasattr(fn, "__wrapped__"), fn.__qualname__


def test_serve_options_are_named_as_python_gives_them(tmp_path):
    from frozentune.serve.engine import Engine, ServeOptions

    with pytest.raises(FrozentuneError, match=r"\(from Python: ServeOptions\(max_wait_ms=…\) for --max-wait-ms\)$"):
        Engine.load([tmp_path], options=ServeOptions(max_wait_ms=-1.0))

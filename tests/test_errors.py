"""One base class for the errors frozentune raises about its input, files or environment, so a user
embedding it can catch them all (`except frozentune.FrozentuneError`), and the command line prints
every one of them as one line with exit status 2 instead of a traceback."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import frozentune
from frozentune import FrozentuneError, cli

# Exceptions that are not about the user's input: control flow inside the server and the interrupt
# signal (a BaseException, as KeyboardInterrupt is).
INTERNAL = {"TaskFailed", "ClientGone", "Interrupted",
            "Held", "BuildRunning"}  # a lock held by another process: caught where it is taken, said as an OutputError / CacheError


def _exception_classes() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(frozentune.__path__, "frozentune."):
        if info.name.endswith("__main__"):  # runs the command line when imported
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_error_class_of_frozentune_has_the_one_base():
    classes = _exception_classes()
    assert len(classes) >= 20  # the walk found the package's modules
    missing = [name for name, cls in classes.items()
               if cls.__name__ not in INTERNAL and not issubclass(cls, FrozentuneError)]
    assert not missing, f"error classes outside FrozentuneError: {missing}"


def test_the_older_bases_still_catch_them():
    from frozentune.cache import CacheError
    from frozentune.data import DataError

    assert issubclass(DataError, ValueError) and issubclass(CacheError, RuntimeError)


@pytest.mark.parametrize("error", ["frozentune.generation.seq2seq.attention.Seq2SeqError",
                                   "frozentune.serve.engine.RequestError",
                                   "frozentune.serve.allocator.AllocatorError",
                                   "frozentune.data.DataError"])
def test_the_command_line_prints_any_of_them_as_one_line(error, monkeypatch, capsys):
    """Seq2SeqError (an encoder-decoder whose attention prefix-tuning cannot steer) was missing from the
    command line's list and ended in a traceback."""
    module, name = error.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)

    def fail():
        raise cls("what went wrong; what to do")

    monkeypatch.setattr(cli, "cmd_list", fail)
    assert cli.main(["list"]) == 2
    assert capsys.readouterr().err == "frozentune: error: what went wrong; what to do\n"


def test_python_api_input_errors_are_frozentune_errors(tmp_path):
    from frozentune import api
    from frozentune.serve import ServeOptions
    from frozentune.train import TrainConfig

    with pytest.raises(FrozentuneError, match="--epochs 0: must be at least 1"):
        TrainConfig(epochs=0).validate()
    with pytest.raises(FrozentuneError, match="--max-texts 0: must be at least 1"):
        ServeOptions(max_texts=0).validate()
    with pytest.raises(FrozentuneError, match="split 'dev': choose train, validation, test or all"):
        api.evaluate_model(tmp_path / "no-model", "trec", split="dev")


@pytest.mark.parametrize("method, options, says", [
    ("space", {"concept_dim": 0}, "space: --concept-dim 0: must be at least 1"),
    ("space", {"inter_weight": -1.0}, r"space: --inter-weight -1.0: must be 0 \(off\) or more"),
    ("ytuning", {"k": 0}, "ytuning: --k 0: must be at least 1"),
    ("selfexplain", {"dropout": 1.0}, r"selfexplain: --dropout 1.0: use a value in \[0, 1\)"),
    # torch's own words ("dropout probability has to be between 0 and 1, but got 2.0"), or NaN taken: every range
    # check is false for it, so --dropout nan failed in the first training step and --reg-lambda nan as a NaN loss
    ("probe", {"dropout": 2.0}, r"^probe: --dropout 2.0: give a probability in \[0, 1\) \(0: off\)$"),
    ("ytuning", {"dropout": 1.0}, r"^ytuning: --dropout 1.0: give a probability in \[0, 1\)"),
    ("probe", {"dropout": float("nan")}, "^probe: --dropout nan: give a number$"),
    ("selfexplain", {"reg_lambda": float("nan")}, "^selfexplain: --reg-lambda nan: give a number$"),
    ("ytuning", {"alpha": float("nan")}, "^ytuning: --alpha nan: give a number$"),
    # taken, and met later as a shape error or a decoder with no feed-forward width
    ("ytuning", {"dim": -1}, "^ytuning: --dim -1: use a width ≥ 1, or 0 for the backbone's width$"),
    ("ytuning", {"ffn_mult": 0}, "^ytuning: --ffn-mult 0: must be at least 1$"),
    ("ytuning", {"alpha": -1.0}, "^ytuning: --alpha -1.0: the margin must be 0 or more$"),
])
def test_a_heads_option_error_names_the_flag_as_typed(method, options, says):
    """They said `concept_dim`, `max_span_width=-1`, or lumped 'layers, k and heads' together."""
    from frozentune.registry import MethodError, create_method

    with pytest.raises(MethodError, match=says):
        create_method(method, 32, 2, options)


def test_a_head_too_large_for_memory_names_its_options():
    """--concept-dim 10**9 was answered "out of memory ...: lower --batch-size or --max-length". 10**13 concept
    dimensions ask for more bytes than a 47-bit address space holds, so no machine's overcommit grants them."""
    from frozentune.registry import MethodError, create_method

    with pytest.raises(MethodError, match="^space: its head's parameters do not fit in memory for 16-wide states and 3 "
                                          "classes with --concept-dim 10000000000000; give smaller values$"):
        create_method("space", 16, 3, {"concept_dim": 10 ** 13})
    # past 2^63 torch's size argument overflows: a TypeError escaped (bench/fuzz.py, part model)
    with pytest.raises(MethodError, match="^selfexplain: its head's parameters do not fit in memory .* with --dim "
                                          "100000000000000000000; give smaller values$"):
        create_method("selfexplain", 16, 3, {"dim": 10 ** 20})


def test_serve_argument_errors_are_frozentune_errors(tmp_path):
    from frozentune.serve import Engine
    from frozentune.serve.app import listen_socket

    with pytest.raises(FrozentuneError, match="paths: 123; give a model folder"):
        Engine.load(123)
    with pytest.raises(FrozentuneError, match=r"options: a dict; give ServeOptions\(\.\.\.\)"):
        Engine.load([tmp_path], options={"max_texts": 3})
    with pytest.raises(TypeError):  # the older base still catches it
        Engine.load(123)
    with pytest.raises(FrozentuneError, match="--host no.such.host.invalid: not an address"):
        listen_socket("no.such.host.invalid", 0)


def test_ctrl_c_while_the_command_line_starts_is_one_line(monkeypatch, capsys):
    """Building the parser imports every method (torch): a Ctrl-C in those seconds printed a traceback."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", interrupted)
    assert cli.main(["list"]) == 130
    assert capsys.readouterr().err == "frozentune: interrupted by SIGINT while starting; nothing was done\n"


@pytest.mark.parametrize("allocate, says", [
    (lambda: __import__("torch").empty(2 ** 50, dtype=__import__("torch").uint8), "out of memory (1,073,741,824 MB asked for"),
    (lambda: __import__("numpy").empty(2 ** 50, dtype="uint8"), "out of memory (Unable to allocate 1.00 PiB"),
])
def test_running_out_of_memory_is_one_line(monkeypatch, capsys, allocate, says):
    """Under a memory limit (ulimit -v, a container's) torch's allocator raised a RuntimeError and numpy a
    MemoryError, both printed as tracebacks; each is now one line saying what to lower, with exit status 2.
    The allocation is a real one of 1 PiB, which no machine gives."""
    monkeypatch.setattr(cli, "cmd_list", allocate)
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"frozentune: error: {says}") and "lower --batch-size or --max-length" in err
    assert "GB free on the machine" in err and "Traceback" not in err and err.count("\n") == 1


def test_a_thread_that_cannot_start_is_one_line(monkeypatch, capsys):
    def no_thread():
        raise RuntimeError("can't start new thread")  # threading's own words at the process's limit

    monkeypatch.setattr(cli, "cmd_list", no_thread)
    assert cli.main(["list"]) == 2
    assert "could not start a thread: the process is at its memory or thread limit" in capsys.readouterr().err


@pytest.mark.parametrize("error, says", [
    (RuntimeError("unable to mmap 90868376 bytes from file <model.safetensors>: Cannot allocate memory (12)"),
     "out of memory (unable to mmap"),  # loading the backbone's weights
    (ImportError("/x/_lsprof.so: failed to map segment from shared object"), "out of memory (/x/_lsprof.so"),  # a lazy import
])
def test_memory_running_out_while_loading_or_importing_is_one_line(monkeypatch, capsys, error, says):
    def fail():
        raise error

    monkeypatch.setattr(cli, "cmd_list", fail)
    assert cli.main(["list"]) == 2
    assert capsys.readouterr().err.startswith(f"frozentune: error: {says}")


def test_the_out_of_memory_line_survives_running_out_again(monkeypatch, capsys):
    """At 600-800 MB the handler's own details (psutil reading /proc/meminfo) raised MemoryError again: two
    chained tracebacks. The line is then given without them."""
    import resource

    def fail():
        raise MemoryError

    def no_room(*_args):
        raise MemoryError

    monkeypatch.setattr(cli, "cmd_list", fail)
    monkeypatch.setattr(resource, "getrlimit", no_room)
    assert cli.main(["list"]) == 2
    assert capsys.readouterr().err.startswith("frozentune: error: out of memory: lower --batch-size")


def test_too_many_open_files_says_ulimit_n_not_free_space(monkeypatch, capsys):
    """EMFILE under `ulimit -n 8`: train printed a traceback, cache and sweep said "free space there"."""
    import errno

    from frozentune.cache import _write_error

    e = OSError(errno.EMFILE, "Too many open files", "/cache/x/states.bin")
    assert "too many open files: this process may open" in str(_write_error(Path("/cache"), "k", e))
    assert "free space" not in str(_write_error(Path("/cache"), "k", e))

    def fail():
        raise e

    monkeypatch.setattr(cli, "cmd_list", fail)
    assert cli.main(["list"]) == 2
    assert "/cache/x/states.bin: too many open files: this process may open" in capsys.readouterr().err

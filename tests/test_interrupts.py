"""Ctrl-C, SIGTERM and a second process, against `frozentune cache` and `frozentune train`.

Each case runs the CLI as a child process on a dataset large enough for the tiny BERT to be
caught mid-extraction (a few thousand 128-token texts, 8 shards), signals it once extraction has
started (a shard is being written, or finished), and checks: exit 130 / 143 with one line, no
traceback, no partial shard, no half entry and no lock left — only the build folder with its
finished shards — and the user's output folder as it was; then a rerun resumes from those shards
and its entry reads back whole. `row=` texts are the rows of the issue's table.
"""
from __future__ import annotations

import contextlib
import json
import random
import re
import signal
import time
from pathlib import Path

import pytest

from clirun import _record, cli, finish, start
from frozentune.cache import CachedStates

R_SIGNAL = "Ctrl-C (SIGINT) and SIGTERM during frozentune cache imdb and during train"
R_TWO = "two frozentune cache of the same entry at the same time"
N_TEXTS = 4000  # × 128 tokens: 1.5-3 s of extraction with the tiny BERT on two cores
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # children too: two threads each on two shared cores crawl

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """A folder with train.jsonl only: N_TEXTS reviews of 150 words (cut to 128 tokens)."""
    folder = tmp_path_factory.mktemp("big")
    rng = random.Random(0)
    words = ("the a film movie actor plot story good bad great awful scene music long short dull "
             "exciting director script cast ending camera").split()
    with open(folder / "train.jsonl", "w") as f:
        for i in range(N_TEXTS):
            text = " ".join(rng.choice(words) for _ in range(150))
            f.write(json.dumps({"text": f"{i} {text}", "label": ("neg", "pos")[i % 2]}) + "\n")
    return folder


def cache_argv(data: Path, bert: Path, root: Path) -> list:
    return ["cache", data, "--backbone", bert, "--cache-dir", root, "--max-length", 128, "--quiet"]


def train_argv(data: Path, bert: Path, root: Path, output: Path, epochs: int = 1) -> list:
    return ["train", "--method", "probe", "--data", data, "--backbone", bert, "--cache-dir", root,
            "--max-length", 128, "--epochs", epochs, "--patience", 0, "--output", output, "--quiet"]


@contextlib.contextmanager
def sigint_reaches_children():
    """A child inherits an ignored SIGINT (a test run started in the background has one) and
    Python then never raises KeyboardInterrupt; with a handler installed here, exec resets it
    to the default and the child's Python installs its own."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def launch(argv: list):
    return start(*argv, env=ONE_THREAD)  # (with SIGINT at its default, however the test run was started)


def partials(root: Path) -> list[Path]:
    """Merges in progress (shards are written in place, into the build's data files)."""
    return sorted(root.glob("*.partial-*")) if root.exists() else []


def extracting(root: Path) -> list[Path]:
    """The data files a build makes as its extraction starts."""
    return sorted(root.glob("*.building/states.bin")) if root.exists() else []


def finished_shards(root: Path) -> list[Path]:
    return sorted(root.glob("*.building/shard-?????.json")) if root.exists() else []


def only_build_folder(root: Path) -> Path:
    """What an interrupted extraction leaves: one `<key>.building` folder, holding its plan, its
    data files and the records of finished shards only — no entry, no merge, no lock file."""
    names = sorted(p.name for p in root.iterdir())
    assert len(names) == 1 and names[0].endswith(".building"), f"left behind: {names}"
    inside = sorted(p.name for p in (root / names[0]).iterdir())
    assert all(n in ("plan.json", ".active", "states.bin", "ids.bin") or re.fullmatch(r"shard-\d{5}\.json", n)
               for n in inside), inside
    return root / names[0]


def wait_for(proc, ready, what: str, timeout: float = 60) -> None:
    """Poll until ready(), failing if the child ends first."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended (exit {proc.returncode}) before {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.01)


def interrupt(proc, argv: list, sig: int) -> str:
    """Send `sig`; the command must end with its one line and status. That it stopped mid-way (not
    after finishing) shows in what it leaves: no complete entry, no output (checked by the callers);
    the 60 s limit only guards against a hang, it is not a speed test."""
    proc.send_signal(sig)
    answer = finish(proc, [str(a) for a in argv], code=CODES[sig],
                    contains=f"interrupted by {signal.Signals(sig).name}", row=R_SIGNAL, timeout=60)
    return answer.message


def whole_entry(root: Path, n: int) -> Path:
    """The only thing in root: one complete entry of n examples that verifies in full."""
    names = sorted(p.name for p in root.iterdir())
    assert len(names) == 1 and re.fullmatch(r"[0-9a-f]{32}", names[0]), names
    entry = CachedStates(root / names[0])
    assert entry.n == n and entry.meta["tokens"] == n * 128
    return entry.path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cache_interrupted_keeps_finished_shards_then_resumes(tiny_bert, big, tmp_path, sig):
    root = tmp_path / "cache"
    argv = cache_argv(big, tiny_bert, root)
    proc = launch(argv)
    wait_for(proc, lambda: finished_shards(root), "a shard finished")
    message = interrupt(proc, argv, sig)
    assert "rerun the same command to resume" in message
    kept = {p.parent.name for p in finished_shards(only_build_folder(root).parent)}
    assert kept
    answer = cli(*argv, code=0)  # the rerun extracts only the shards not finished
    assert f"{len(kept)} of 8 shards were finished before; extracting the other {8 - len(kept)}" in answer.err, answer.err
    # said when the rerun starts (it was said only once the build had ended, so an interrupted rerun never said it)
    assert answer.err.index("cache: resuming") < answer.err.index("cache: resumed"), answer.err
    assert "s now; the build: " in answer.out, answer.out  # this run's seconds beside the whole build's rate
    whole_entry(root, N_TEXTS)


def test_train_interrupted_during_extraction(tiny_bert, big, tmp_path):
    """Ctrl-C while train builds its cache entry: no entry, no output folder, no staging folder
    beside it, the user's files untouched; the rerun trains."""
    root, output = tmp_path / "cache", tmp_path / "runs" / "model"
    mine = tmp_path / "runs" / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("my notes\n")
    argv = train_argv(big, tiny_bert, root, output)
    proc = launch(argv)
    wait_for(proc, lambda: extracting(root), "extraction started")
    interrupt(proc, argv, signal.SIGINT)
    only_build_folder(root)
    assert sorted(p.name for p in mine.parent.iterdir()) == ["notes.txt"]
    assert mine.read_text() == "my notes\n"
    cli(*argv, code=0)
    assert (output / "result.json").is_file()
    whole_entry(root, N_TEXTS)


def test_train_interrupted_during_epochs_keeps_output_as_it_was(tiny_bert, big, tmp_path):
    """SIGTERM after extraction, while training: the finished cache entry is kept (whole), the
    output folder (here: an empty one the user made) is untouched."""
    root, output = tmp_path / "cache", tmp_path / "model"
    output.mkdir()
    argv = train_argv(big, tiny_bert, root, output, epochs=500)
    proc = launch(argv)
    lines = []

    def training() -> bool:
        lines.append(proc.stdout.readline())
        return "trainable parameters" in lines[-1]

    wait_for(proc, training, "training started", timeout=120)
    interrupt(proc, argv, signal.SIGTERM)
    assert list(output.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cache", "model"]
    whole_entry(root, N_TEXTS)


def test_two_caches_of_one_entry_at_once(tiny_bert, big, tmp_path):
    """The second waits for the first (saying so), then reads the entry the first built."""
    root = tmp_path / "cache"
    argv = cache_argv(big, tiny_bert, root)
    procs = [launch(argv), launch(argv)]
    answers = [finish(p, [str(a) for a in argv], code=0) for p in procs]
    built = [a for a in answers if "tok/s" in a.out]
    cached = [a for a in answers if "(cached)" in a.out]
    assert len(built) == 1 and len(cached) == 1, [a.out for a in answers]
    builder = procs[answers.index(built[0])]  # named by the one that waited (it said "another process")
    assert f"waiting for process {builder.pid}, which is building the same entry" in cached[0].err
    cached[0].show = "waiting for process"
    _record(R_TWO, [str(a) for a in argv], cached[0])  # the table shows the one that waited, and its line
    path = whole_entry(root, N_TEXTS)
    assert all(str(path) in a.out for a in answers)


def test_stale_lock_file_does_not_block(tiny_bert, trec_slice, tmp_path):
    """A lock file left by a killed process (the kernel released its flock) is taken over and
    removed; nothing waits."""
    from frozentune.backbone import Backbone
    from frozentune.cache import cache_key
    from frozentune.data import read_split

    root = tmp_path / "cache"
    root.mkdir()
    bb = Backbone.load(str(tiny_bert), max_length=32)
    key = cache_key(bb, read_split(trec_slice / "train.jsonl", "text", "label").texts)[0]
    (root / f"{key}.lock").write_text("")
    answer = cli("cache", trec_slice, "--backbone", tiny_bert, "--cache-dir", root, "--max-length", 32,
                 "--splits", "train", "--quiet", "--precision", "fp32", code=0)  # the key computed above
    assert "waiting" not in answer.err and [p.name for p in root.iterdir()] == [key]


def test_an_interrupt_a_library_wrapped_is_still_an_interrupt(monkeypatch, capsys):
    """A SIGTERM that lands inside a lazy import of transformers comes out as its ModuleNotFoundError
    raised from our Interrupted (seen in CI): the command still ends as interrupted, in one line."""
    from frozentune import cli as cli_module

    def wrapped() -> int:
        try:
            cli_module._raise_interrupted(signal.SIGTERM, None)
        except cli_module.Interrupted as e:
            raise ModuleNotFoundError("Could not import module 'get_constant_schedule_with_warmup'") from e
        return 0

    monkeypatch.setattr(cli_module, "cmd_list", wrapped)
    assert cli_module.main(["list"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.startswith("frozentune: interrupted by SIGTERM") and "Traceback" not in err

    def unrelated() -> int:
        raise ModuleNotFoundError("no module named x")

    monkeypatch.setattr(cli_module, "cmd_list", unrelated)
    with pytest.raises(ModuleNotFoundError):  # an error with no interrupt behind it is not hidden
        cli_module.main(["list"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_swallowed_interrupt_still_ends_the_training(monkeypatch, capsys, tiny_bert, trec_slice, tmp_path, sig):
    """A SIGTERM whose exception lands in a weakref callback is printed as "Exception ignored" and
    lost (seen in CI, in the import system's module-lock callback), and a Ctrl-C was lost during a
    cache build with nothing printed (CI): the next training step raises it again, so the command
    still ends as interrupted and writes nothing. The handlers are the ones cli.main installs."""
    from frozentune import cli as cli_module
    from frozentune import train as train_module

    real, calls = train_module.shared_step, []

    def step_that_swallows(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            try:
                signal.getsignal(sig)(sig, None)  # the handler main installed, as the signal would call it
            except (cli_module.Interrupted, KeyboardInterrupt):
                pass  # what Python does with an exception raised inside a weakref callback
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "shared_step", step_that_swallows)
    output = tmp_path / "model"
    argv = ["train", "--method", "probe", "--data", str(trec_slice), "--backbone", str(tiny_bert), "--cache-dir",
            str(tmp_path / "cache"), "--epochs", "3", "--cv-below", "0", "--output", str(output), "--quiet"]
    # main installs its SIGINT handler only where SIGINT has Python's own (not where it is ignored, as in a
    # test run started in the background): give it Python's own, as a terminal's command has
    with sigint_reaches_children():
        assert cli_module.main(argv) == 128 + sig
        assert capsys.readouterr().err.startswith(f"frozentune: interrupted by {signal.Signals(sig).name}")
        assert len(calls) == 1 and not output.exists()
        # the command has ended: its signal is forgotten, and the next command runs to its end
        monkeypatch.setattr(train_module, "shared_step", real)
        assert cli_module.main(argv) == 0 and output.exists()


def test_an_interrupt_lost_in_a_callback_is_not_printed(capsys, monkeypatch):
    """A SIGTERM landing in a weakref callback or __del__ (CI: the import system's module-lock
    callback) cannot propagate; Python hands it to sys.unraisablehook. While a command runs, that
    hook keeps it quiet (it is recorded, and interrupts.check raises it again), and prints anything else."""
    import gc
    import sys

    from frozentune import interrupts

    class Dies:
        def __init__(self, exc: BaseException):
            self.exc = exc

        def __del__(self):
            raise self.exc

    monkeypatch.setattr(sys, "unraisablehook", interrupts.quiet_lost_interrupts)
    monkeypatch.setattr(interrupts, "_pending", [signal.SIGTERM])
    Dies(interrupts.Interrupted(signal.SIGTERM))
    gc.collect()
    assert "Interrupted" not in capsys.readouterr().err
    with pytest.raises(interrupts.Interrupted):
        interrupts.check()
    Dies(ValueError("a real error in a destructor"))
    gc.collect()
    assert "a real error in a destructor" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the output folder's last renames
def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_an_interrupt_between_the_output_renames_waits_for_both(tmp_path, monkeypatch):
    """--overwrite moves the old folder aside, then the new one in. A Ctrl-C between the two renames left
    neither in place (the old model hidden in .NAME.replaced-…) and said the folder was as it was. Both
    renames now happen; the interrupt is recorded for the next check, not raised over a finished save."""
    from frozentune import interrupts
    from frozentune.output import staged_output

    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text('{"format": "frozentune/1"}')
    (out / ".frozentune-files").write_text('["config.json"]')
    real = Path.rename

    def rename(self, target):
        moved = real(self, target)
        if self == out:  # the old folder is aside: Ctrl-C now
            signal.raise_signal(signal.SIGINT)
        return moved

    monkeypatch.setattr(Path, "rename", rename)
    before = signal.signal(signal.SIGINT, interrupts.raise_keyboard_interrupt)  # a command's, as cli.main installs
    try:
        with staged_output(out, overwrite=True) as folder:
            (folder / "config.json").write_text('{"format": "frozentune/1", "new": true}')
        assert json.loads((out / "config.json").read_text())["new"] is True
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
    finally:
        signal.signal(signal.SIGINT, before)
        interrupts.clear()
    # in a program that calls frozentune (Python's own handler): both renames, then its KeyboardInterrupt
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with staged_output(out, overwrite=True) as folder:
                (folder / "config.json").write_text('{"format": "frozentune/1", "newer": true}')
        assert json.loads((out / "config.json").read_text())["newer"] is True
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and not interrupts._pending
    finally:
        signal.signal(signal.SIGINT, before)
        interrupts.clear()


def test_what_a_killed_save_left_is_cleaned_or_put_back(tmp_path):
    """SIGKILL during a save left hidden .NAME.partial-PID-… folders (a model, an ONNX graph: tens of MB)
    for ever, and one killed between its renames left the old model hidden in .NAME.replaced-PID-…. The
    next command on that --output removes a dead process's staging folders and puts the old one back;
    a live process's are left alone."""
    from frozentune.output import OutputError, check_output

    dead, alive = _dead_pid(), __import__("os").getpid()
    out = tmp_path / "m"
    for name in (f".m.partial-{dead}-ab12cd34", f".m.partial-{alive}-ab12cd34", f".m.replaced-{dead}-ef56ab78"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"format": "frozentune/1"}')
    (tmp_path / f".m.replaced-{dead}-ef56ab78" / ".frozentune-files").write_text('["config.json"]')
    with pytest.raises(OutputError, match="already holds a saved model"):  # the old model, put back
        check_output(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".m.partial-{alive}-ab12cd34", "m"]
    (out / f".partial-{dead}-0a0b0c0d").mkdir()  # staged inside a folder written in place
    check_output(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [".frozentune-files", "config.json"]


def test_an_interrupted_sweep_keeps_its_finished_points(tiny_bert, trec_slice, tmp_path):
    """SIGTERM between a sweep's points: the command says its finished points are kept and how to go on
    (it said the output folder was as it was, and every point was lost); `cache --list` shows the journal,
    `--prune` keeps it, `--prune --include-resumable` removes it. (Reusing the points is tested in
    test_few_labels.py, from Python.)"""
    root, output = tmp_path / "cache", tmp_path / "sweep"
    argv = ["sweep", "--data", trec_slice, "--backbone", tiny_bert, "--max-length", 16, "--methods", "probe",
            "--shots", 2, "--seeds", ",".join(map(str, range(60))), "--cache-dir", root, "--output", output]
    proc = launch(argv)

    def points() -> int:
        return sum(len(p.read_bytes().splitlines()) for p in root.glob("sweep-*.points.jsonl")) if root.exists() else 0

    wait_for(proc, lambda: points() >= 1 + 2, "two points finished", timeout=120)  # the header, 2 points
    proc.send_signal(signal.SIGTERM)
    answer = finish(proc, [str(a) for a in argv], code=143, contains=("interrupted by SIGTERM", "finished points",
                                                                      "run the same command again to go on"), timeout=60)
    assert not output.exists()
    [journal] = root.glob("sweep-*.points.jsonl")
    kept = points() - 1  # its header line
    assert 2 <= kept < 60 and f"the {kept} finished points and cache entries already complete are kept" in answer.message
    listed = {Path(r["path"]).name: r for r in json.loads(cli("cache", "--list", "--json", "--cache-dir", root, code=0).out)}
    assert listed[journal.name]["kind"] == "sweep"
    assert listed[journal.name]["status"] == "interrupted sweep, resumable"
    assert listed[journal.name]["shards"] == f"{kept} finished points" and listed[journal.name]["bytes"] > 0
    out = cli("cache", "--prune", "--cache-dir", root, code=0).out
    assert (f"kept {journal.name} (an interrupted sweep on {trec_slice} with {tiny_bert}: probe, 60 points, its "
            f"{kept} finished points: run the same sweep again") in out
    assert journal.exists()
    out = cli("cache", "--prune", "--include-resumable", "--cache-dir", root, code=0).out
    assert f"removed {journal.name} (sweep, interrupted sweep, resumable" in out
    assert not journal.exists()


def test_an_interrupt_while_the_old_output_is_removed_waits(tmp_path, monkeypatch):
    """A signal while --overwrite removed the old folder, after the new one was in place: the run said the
    output was as it was, and the old folder stayed beside the new (a sweep then also kept its journal)."""
    import os
    import shutil

    from frozentune import interrupts, output

    target = tmp_path / "out"
    with output.staged_output(target) as folder:  # a saved model (frozentune's own: its manifest says so)
        (folder / "config.json").write_text('{"old": true}')
        (folder / "model.safetensors").write_bytes(b"")
    real = shutil.rmtree

    def signalled(path, *a, **k):
        if ".replaced-" in str(path):
            os.kill(os.getpid(), signal.SIGINT)
        return real(path, *a, **k)

    monkeypatch.setattr(output.shutil, "rmtree", signalled)
    before = signal.signal(signal.SIGINT, interrupts.raise_keyboard_interrupt)  # a command's, as cli.main installs
    try:
        with output.staged_output(target, overwrite=True) as folder:
            (folder / "config.json").write_text('{"new": true}')
            (folder / "model.safetensors").write_bytes(b"")
        assert json.loads((target / "config.json").read_text()) == {"new": True}
        assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no .out.replaced-… left
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()  # recorded, for the command's next check
    finally:
        signal.signal(signal.SIGINT, before)
        interrupts.clear()

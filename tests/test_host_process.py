"""frozentune called from another program (a notebook, a web app, a test suite): what a call leaves behind
in the host's process. A Ctrl-C held while a model was saved was kept for ever and raised by every later
call; every call that builds a head (predict and load too) reset torch's global random state to its seed."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from frozentune import api, interrupts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def python_sigint():
    """SIGINT as a plain Python program has it (KeyboardInterrupt), whatever the test runner installed."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
    interrupts.clear()


def test_a_signal_held_in_a_host_goes_to_its_handler_after_the_block(python_sigint):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the block ran to its end")
    assert done and not interrupts._pending
    interrupts.check()  # nothing left to raise: a later call starts clean


def test_a_signal_held_under_a_command_is_recorded_for_its_loops(python_sigint):
    signal.signal(signal.SIGINT, interrupts.raise_keyboard_interrupt)  # as cli.main installs it
    with interrupts.held():
        os.kill(os.getpid(), signal.SIGINT)
    assert interrupts._pending == [signal.SIGINT]  # not raised after the save (the work is done) ...
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()  # ... but the command's next long loop stops on it
    interrupts.clear()


def test_ctrl_c_during_the_save_belongs_to_that_call(python_sigint, tiny_bert, trec_slice, tmp_path, monkeypatch):
    """The signal lands while train renames its staging folder into place: that call raises it (the model is
    saved whole); the next train in the same process runs to its end."""
    from pathlib import Path

    real = Path.rename
    calls = []

    def rename(self, target):  # the renames of the save, which `held` guards
        if not calls:
            os.kill(os.getpid(), signal.SIGINT)
        calls.append(target)
        return real(self, target)

    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    args = dict(train_cfg={"epochs": 1}, cache_root=tmp_path / "cache", progress=False, log=None)
    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        api.train("probe", str(trec_slice), bb, output=tmp_path / "a", **args)
    monkeypatch.undo()
    assert calls and (tmp_path / "a" / "model.safetensors").is_file()
    # the trainer's step loop (which `check`s for held signals) runs to its end
    result = api.train("ytuning", str(trec_slice), bb, output=tmp_path / "b",
                       **{**args, "train_cfg": {"epochs": 1, "fallback": "off"}})
    assert result["metrics"] and (tmp_path / "b" / "model.safetensors").is_file()


def test_calls_leave_the_hosts_random_state_as_it_was(tiny_bert, trec_slice, tmp_path):
    bb = api.BackboneOptions(str(tiny_bert), max_length=16)
    args = dict(cache_root=tmp_path / "cache", progress=False, log=None)
    calls = {"train": lambda: api.train("ytuning", str(trec_slice), bb, output=tmp_path / "m", overwrite=True,
                                        train_cfg={"epochs": 1, "fallback": "off"}, **args),
             "predict": lambda: api.predict(tmp_path / "m", ["How far is Paris ?"], log=None)}
    for name, call in calls.items():
        torch.manual_seed(7)  # the host's own seed, which frozentune's seed 0 replaced
        want = torch.get_rng_state()
        call()
        assert torch.equal(torch.get_rng_state(), want), f"{name} changed the host's random state"


def test_a_runs_peak_memory_is_its_own_not_the_hosts(tiny_bert, trec_slice, tmp_path):
    """result.json's peak_rss_mb was the process's peak over its whole life: in a notebook, every run after a
    cell that once held 2 GB reported 2 GB. Where Linux lets the peak be reset, a run reports its own."""
    from pathlib import Path

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("no /proc/self/clear_refs: this system keeps one peak per process (peak_rss_of: process)")
    held = bytearray(1200 * 2 ** 20)  # 1.2 GB, as an earlier cell's data
    held[::4096] = b"\1" * len(range(0, len(held), 4096))  # every page written: resident, whatever calloc did
    before = api.peak_rss_mb()
    del held
    r = api.train("probe", str(trec_slice), api.BackboneOptions(str(tiny_bert), max_length=16),
                  cache_root=tmp_path / "cache", progress=False, log=None, train_cfg={"epochs": 1})
    assert r["peak_rss_of"] == "run"
    assert r["peak_rss_mb"] < before - 1000, (r["peak_rss_mb"], before)  # the 1.2 GB freed before the run is not in it

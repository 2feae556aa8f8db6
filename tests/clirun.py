"""Run the CLI the way a user does and check the bad-input contract.

`cli(...)` runs `frozentune ARGV` in this process (through `main()`, stdout/stderr captured) and
checks what every answer to bad input must be: the expected exit status, no Python traceback,
and, for an error, one line on stderr. `cli_process(...)` does the same in a subprocess (for
signals). Both append a record to $FROZENTUNE_BAD_INPUT_LOG when it is set:
bench/bad_input_table.py runs the bad-input tests with it and writes REPORT.md's "Bad input"
table from these records, so the table is exactly what the tests saw.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

LOG_ENV = "FROZENTUNE_BAD_INPUT_LOG"


@dataclass
class Answer:
    code: int
    out: str
    err: str

    show: str = ""  # for a success: the line of stdout/stderr containing this is its message

    @property
    def message(self) -> str:
        """What the user sees: an error's line (stderr's last), or for a success the line holding
        `show` (else stdout's last line)."""
        if self.code == 0:
            lines = [ln for ln in (self.out + "\n" + self.err).splitlines() if ln.strip()]
            chosen = [ln for ln in lines if self.show and self.show in ln]
            out = [ln for ln in self.out.splitlines() if ln.strip()]
            return (chosen or out or [""])[-1]
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


def _record(row: str, argv: list[str], answer: Answer) -> None:
    path = os.environ.get(LOG_ENV)
    if not path or not row:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"row": row, "test": test, "argv": argv, "code": answer.code,
                            "message": answer.message}) + "\n")


def check(answer: Answer, code: int, contains: tuple[str, ...] | str = ()) -> Answer:
    """The contract: exit status `code`; no traceback; an error is one line naming `contains`."""
    assert "Traceback" not in answer.err, f"traceback instead of a message:\n{answer.err}"
    assert answer.code == code, f"exit {answer.code}, expected {code}; stderr:\n{answer.err}"
    if code != 0:
        errors = [ln for ln in answer.err.splitlines() if ln.startswith("frozentune")]
        assert len(errors) == 1, f"expected one error line, got:\n{answer.err}"
    assert "NaN" not in answer.out and "Infinity" not in answer.out, f"a non-number printed as an answer:\n{answer.out}"
    for part in ([contains] if isinstance(contains, str) else contains):
        assert part.lower() in answer.message.lower(), f"{part!r} not in the message: {answer.message}"
    return answer


def with_defaults(defaults: dict[str, object], extra: tuple) -> list:
    """The options in `defaults` ({flag: value}) that `extra` does not give, then `extra`: a command line whose
    defaults a test may replace (an option given twice is refused)."""
    return [x for flag, value in defaults.items() if flag not in extra for x in (flag, value)] + list(extra)


def cli(*argv: str | Path, code: int = 2, contains: tuple[str, ...] | str = (), row: str = "",
        show: str = "") -> Answer:
    """Run `frozentune ARGV` in-process; check the contract; record it under table row `row` (for a
    success, the line containing `show` is the one recorded)."""
    from frozentune.cli import main

    args = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            got = main(args)
        except SystemExit as e:  # argparse's usage errors
            got = e.code if isinstance(e.code, int) else 1
    answer = Answer(int(got or 0), out.getvalue(), err.getvalue(), show)
    _record(row, args, answer)
    return check(answer, code, contains)


def _signals_as(ignored: tuple[int, ...]) -> Callable[[], None]:
    """For preexec_fn: SIGINT and SIGHUP at their defaults in the child, but for those in `ignored`. A child
    inherits ignored signals (a test run started under nohup, or with `&` from a script, ignores SIGHUP or
    SIGINT), and frozentune rightly keeps ignoring them, as nohup asks: tests that send them would fail."""
    def prepare() -> None:
        for s in (signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)
    return prepare


def start(*argv: str | Path, env: dict | None = None, ignored: tuple[int, ...] = ()) -> subprocess.Popen:
    """`python -m frozentune.cli ARGV` as a child process (stdout/stderr piped, text), with SIGINT and SIGHUP
    at their defaults however the test run was started, or ignored where named in `ignored` (as nohup does)."""
    return subprocess.Popen([sys.executable, "-m", "frozentune.cli", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, preexec_fn=_signals_as(ignored))


def finish(proc: subprocess.Popen, argv: list[str], code: int, contains: tuple[str, ...] | str = (),
           row: str = "", timeout: float = 120) -> Answer:
    """Wait for a process from `start`, then check and record it like `cli`."""
    out, err = proc.communicate(timeout=timeout)
    answer = Answer(proc.returncode, out, err)
    _record(row, [str(a) for a in argv], answer)
    return check(answer, code, contains)


def swap_while_loading(monkeypatch, folder: Path, new: Path, edit) -> dict:
    """Make `new` (a copy of the saved model `folder`) another run's model: its weights doubled and its
    config.json changed by `edit(config)`, checksum kept right. Then, whenever the model's backbone or LM is
    loaded (model.load_named), `folder` is swapped for `new` the way staged_output swaps a folder in. Returns
    the new config.json."""
    import json

    from frozentune import model as M

    M.save_tensors({k: v * 2 for k, v in M.load_weights(new).items()}, new / M.WEIGHTS)
    config = json.loads((new / "config.json").read_text())
    edit(config)
    config["weights_file"] = M.file_checksum(new / M.WEIGHTS)
    (new / "config.json").write_text(json.dumps(config))
    real = M.load_named

    def swapped_meanwhile(where, name, load, what="backbone"):
        loaded = real(where, name, load, what)
        folder.rename(folder.parent / f"{folder.name}-old")
        new.rename(folder)
        return loaded

    monkeypatch.setattr(M, "load_named", swapped_meanwhile)
    return config


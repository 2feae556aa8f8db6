"""SIGTERM as an exception, and a second chance for SIGTERM and SIGINT when their exception is lost.

`raise_interrupted` is the SIGTERM handler of a command (cli.main installs it): it raises
`Interrupted` in whatever code runs when the signal lands, so every `finally` and temporary-folder
cleanup runs as for Ctrl-C. Where that code is a weakref callback or a `__del__` (the import
system's module-lock callbacks, seen in CI), Python prints the exception as "Exception ignored" and
carries on, and the command would run to its end. So the handler also records the signal, and the
long loops (the trainer's steps, extraction's batches) call `check`, which raises it again there.

`raise_keyboard_interrupt` is the SIGINT handler (cli.main installs it too): Python's own
KeyboardInterrupt, recorded the same way. CI saw a Ctrl-C during a cache build lost with nothing
printed (tests/test_interrupts.py, test_train_interrupted_during_extraction: exit 0, the model saved).
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator

_pending: list[int] = []  # signals whose exception has been raised, until the command ends (`clear`)


class Interrupted(BaseException):
    """SIGTERM turned into an exception (SIGINT is Python's KeyboardInterrupt), so that every
    `finally` and temporary-folder cleanup runs exactly as for Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def raise_interrupted(signum: int, frame: Any) -> None:
    _pending.append(signum)
    raise Interrupted(signum)


def raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    _pending.append(signum)
    raise KeyboardInterrupt


def quiet_lost_interrupts(unraisable: Any) -> None:
    """sys.unraisablehook while a command runs (cli.main installs it): an interrupt that Python could
    not propagate (raised in a weakref callback or a `__del__`) is not printed as "Exception ignored"
    with a traceback, since it is recorded and `check` raises it again; anything else goes to
    Python's own hook."""
    if isinstance(unraisable.exc_value, (Interrupted, KeyboardInterrupt)) and _pending:
        return
    sys.__unraisablehook__(unraisable)


def check() -> None:
    """Raise the interrupt again if one arrived (its first raise may have been swallowed)."""
    if _pending:
        if _pending[-1] == signal.SIGINT:
            raise KeyboardInterrupt
        raise Interrupted(_pending[-1])


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGINT and SIGTERM recorded, not raised, while the block runs (a few renames that must happen
    together: an interrupt between two of them hid a saved model). Then:
    - under a command (the handler is cli.main's): the block's work is done, so the signal is not raised
      after it either (the message would say nothing was saved); it is recorded for `check`, which a long
      loop after it calls, until the command ends (`clear`);
    - in a program that calls frozentune (its own handler, e.g. Python's KeyboardInterrupt): the signal is
      handed to that handler once the block is done, as if it had landed then. It was recorded before, and
      nothing forgot it outside a command: every later call's first `check` raised it again."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    got: list[int] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s, handler in before.items():
        if callable(handler):  # an ignored signal stays ignored
            signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            if callable(handler):
                signal.signal(s, handler)
    ours = (raise_interrupted, raise_keyboard_interrupt)
    _pending.extend(s for s in got if before[s] in ours)
    for s in dict.fromkeys(s for s in got if before[s] not in ours):  # each signal once, in the order they came
        before[s](s, None)


def clear() -> None:
    """The command has ended: forget its signals."""
    _pending.clear()

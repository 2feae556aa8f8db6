"""Checking the values of an options dataclass against the kinds of their defaults, so that a value
of the wrong type given from Python (epochs=1.5, max_length="32", fallback="on") is refused by name
before any work, not met later as a TypeError deep inside the library or, worse, taken for another
setting. The command line parses its values already; this is for everything else."""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any

KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def out_of_range(obj: Any) -> str | None:
    """The first float field of dataclass instance `obj` that is NaN (no option means anything by it: every
    comparison with it is false, so range checks let it through), or, where its metadata says `fraction`
    (a dropout probability), outside [0, 1); as the command line spells it ("--dropout 2.0: ..."). None
    when every such field is in range."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            continue
        if value != value:  # NaN
            return f"{as_flag(f.name)} {value}: give a number"
        if f.metadata.get("fraction") and not 0.0 <= value < 1.0:
            return f"{as_flag(f.name)} {value}: give a probability in [0, 1) (0: off)"
    return None


def as_flag(name: str) -> str:
    """An options field's name as the command line spells it: cv_folds → --cv-folds."""
    return "--" + name.replace("_", "-")


def wrong_value(obj: Any, flag: bool = False) -> str | None:
    """The first field of dataclass instance `obj` whose value is not of its default's kind (bool,
    int, float, str; an int where a float is expected is fine, a bool is not a number), or not among
    its metadata's `choices`, as "name=value: want" (flag: "--name value: want", as the command line's
    own messages say it); None when every field is right. Fields whose default is None or of another
    kind are not checked."""
    for f in dataclasses.fields(obj):
        value, default = getattr(obj, f.name), f.default
        declared = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        kind = next((k for k in KINDS if k.__name__ == declared), type(default))  # `x: float = 0` is a float
        if default is dataclasses.MISSING or default is None or kind not in KINDS:
            continue
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy's numbers too
        ok = (isinstance(value, bool) if kind is bool else
              number and isinstance(value, numbers.Integral) if kind is int else
              number if kind is float else  # NaN is a number here: the options' own rules refuse it, saying why
              isinstance(value, str))
        shown = f"{as_flag(f.name)} {value!r}" if flag else f"{f.name}={value!r}"
        choices = f.metadata.get("choices")
        if not ok:  # where the field has choices, they are what to give
            return f"{shown}: {KINDS[kind]} is expected" + (f", one of {', '.join(map(str, choices))}" if choices else "")
        if choices and value not in choices:
            return f"{shown}: choose one of {', '.join(map(str, choices))}"
    return None

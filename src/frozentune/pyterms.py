"""Errors said in the caller's terms: a message names the command line's flags (`--shots -1: give …`), and a
caller of the Python API gave `shots=-1`, `train_cfg={"lr": …}` or `BackboneOptions(precision=…)` instead.

The messages are written once, in the command line's words, and the bad-input table pins them there. A public
function of the Python API is wrapped with `in_python_terms`: where one of frozentune's errors leaves it, the
message gains one clause naming, for each flag it mentions, what the caller spells instead, e.g.

    --lr -1: must be a finite positive number (from Python: train_cfg["lr"] for --lr)

The message lines a wrapped call logs (api.as_log gives the caller's `log` through `glossed`) gain the same
clause: "schedule: … under --cv-below 1000: …" ends with (from Python: train_cfg["cv_below"] for --cv-below). A
flag inside a quoted command line ("`frozentune train --output`") is that command's, and left as it is.

The command line (cli.main) runs inside `command_line()`, so its errors are printed as they were. Only the
outermost wrapped call adds the clause (api.train calls generation's train_generation, also wrapped); a flag
with no Python spelling in that function (e.g. predict's --input) is left as it is.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Mapping, TypeVar

from .errors import FrozentuneError

F = TypeVar("F", bound=Callable[..., Any])

# None outside frozentune; "command line" under cli.main; "python" inside a wrapped call (the outermost says it)
_WHO: ContextVar[str | None] = ContextVar("frozentune_caller", default=None)
# inside the outermost wrapped call: its message lines in the caller's terms (said_in_python with its spellings)
_GLOSS: ContextVar[Callable[[str], str] | None] = ContextVar("frozentune_gloss", default=None)

# --shots, --text-pair-field; not a-b--c, nor accelerate's own --num_processes
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?!\w)")

COMMAND = re.compile(r"`frozentune [^`]*`")  # a command line quoted in a message

# the command line's flags whose Python argument has another name: flag → (argument, how it is spelled), the
# first argument the function has
RENAMED = {"--text-pair-field": (("pair_field", "pair_field="),), "--cache-dir": (("cache_root", "cache_root="),),
           "--model": (("model_dir", "model_dir="), ("model_dirs", "model_dirs="), ("models", "models=[…]")),
           "--backbone": (("backbone", "backbone="), ("lm_name", "lm_name=")),
           "--source-field": (("fields", "fields=(SOURCE, TARGET)"),),
           "--target-field": (("fields", "fields=(SOURCE, TARGET)"),),
           "--num-beams": (("decoding", "decoding=DecodeOptions(num_beams=…)"),),
           "--max-new-tokens": (("decoding", "decoding=DecodeOptions(max_new_tokens=…)"),),
           "--restart": (("resume", "resume=False"),), "--name": (("names", "names=[…]"),)}
# the backbone group's flags that BackboneOptions takes (flag → its field)
BACKBONE = {"--layer": "layers", "--layer-combine": "combine", "--max-length": "max_length",
            "--no-token-types": "token_types", "--trust-remote-code": "trust_remote_code",
            "--device": "device", "--precision": "precision"}


@contextmanager
def command_line() -> Iterator[None]:
    """cli.main runs in it: errors keep the flags they name, as the user typed them."""
    token = _WHO.set("command line")
    try:
        yield
    finally:
        _WHO.reset(token)


def flag_of(name: str) -> str:
    """A dataclass field's flag, as cli._add_dataclass_options spells it: cv_below → --cv-below."""
    return "--" + name.replace("_", "-")


def field_flags(cls: type, spell: Callable[[str], str]) -> dict[str, str]:
    """Each field of dataclass `cls` as the command line spells it (a bool also as --no-NAME) → `spell(field)`."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        out[flag_of(f.name)] = spell(f.name)
        if f.type in (bool, "bool"):
            out["--no-" + flag_of(f.name)[2:]] = spell(f.name) + "=False"
    return out


def terms(fn: Callable, backbone: bool = False, train_cfg: bool = False, options: bool = False,
          also: Callable[[], dict[str, str]] | None = None) -> dict[str, str]:
    """The command line's flag → how a caller of `fn` spells it. Its own arguments first (`--shots` → `shots=`),
    then, where `fn` takes them, BackboneOptions' fields, train_cfg's keys, the methods' options and `also()`
    (e.g. ServeOptions' fields)."""
    out: dict[str, str] = dict(also()) if also is not None else {}
    if options:
        from .registry import get_method, list_methods

        for name in list_methods():
            out.update(field_flags(get_method(name).config_cls, lambda f: f'options["{f}"]'))
    if train_cfg:
        from .train import TrainConfig

        out.update(field_flags(TrainConfig, lambda f: f'train_cfg["{f}"]'))
    if backbone:
        out.update({flag: f"BackboneOptions({field}=…)" for flag, field in BACKBONE.items()})
        out["--no-token-types"] = "BackboneOptions(token_types=False)"
    params = inspect.signature(fn).parameters
    for name in params:
        out[flag_of(name)] = f"{name}="
        if params[name].annotation in (bool, "bool"):
            out["--no-" + flag_of(name)[2:]] = f"{name}=False"
    own = {flag_of(name) for name in params}
    for flag, candidates in RENAMED.items():
        if flag not in own and (spelled := next((how for name, how in candidates if name in params), None)):
            out[flag] = spelled
    return out


def said_in_python(message: str, spelled: Mapping[str, str]) -> str:
    """`message` with one clause more, naming the Python spelling of each flag it mentions that has one here."""
    # a flag inside a quoted command line ("give a folder written by `frozentune train --output`") is that
    # command's, to be run as written, not an argument of this call
    seen = list(dict.fromkeys(m.group(0) for m in FLAG.finditer(COMMAND.sub("", message))))
    pairs = [f"{spelled[flag]} for {flag}" for flag in seen
             if flag in spelled and not said_there(message, flag, spelled[flag])]
    return f"{message} (from Python: {'; '.join(pairs)})" if pairs else message


def said_there(message: str, flag: str, spelled: str) -> bool:
    """Whether the message gives the flag's Python spelling already: beside it, as in "--overwrite
    (overwrite=True in Python)" or "--fallback off (train_cfg={'fallback': 'off'} in Python)", or anywhere
    as the argument it is ("--occlusion / occlusion=True")."""
    if re.search(re.escape(flag) + r"(?: \S+)? \([^()]*\bin Python\)", message):
        return True
    return spelled.endswith("=") and re.search(r"(?<![\w.\-])" + re.escape(spelled), message) is not None


def _retold(e: FrozentuneError, spelled: Mapping[str, str]) -> None:
    """Rewrite `e`'s message in place (its type, attributes and traceback kept)."""
    if e.args and isinstance(e.args[0], str):
        e.args = (said_in_python(e.args[0], spelled),) + tuple(e.args[1:])


def in_python_terms(backbone: bool = False, train_cfg: bool = False, options: bool = False,
                    also: Callable[[], dict[str, str]] | None = None) -> Callable[[F], F]:
    """Wrap a public function of the Python API (see the module's docstring). A returned generator is wrapped
    too, so an error raised while it is read says the same."""
    def wrap(fn: F) -> F:
        spelled: dict[str, str] = {}

        def spellings() -> dict[str, str]:
            if not spelled:
                spelled.update(terms(fn, backbone, train_cfg, options, also))
            return spelled

        def told(e: FrozentuneError) -> None:
            _retold(e, spellings())

        def gloss(line: str) -> str:
            return said_in_python(line, spellings()) if "--" in line else line

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if _WHO.get() is not None:  # the command line, or inside another wrapped call: it says it, once
                return fn(*args, **kwargs)
            token, glossing = _WHO.set("python"), _GLOSS.set(gloss)
            try:
                result = fn(*args, **kwargs)
            except FrozentuneError as e:
                told(e)
                raise
            finally:
                _WHO.reset(token)
                _GLOSS.reset(glossing)
            return _read_in_python_terms(result, told, gloss) if inspect.isgenerator(result) else result

        return call  # type: ignore[return-value]
    return wrap


def _read_in_python_terms(gen: Iterator, told: Callable[[FrozentuneError], None],
                          gloss: Callable[[str], str]) -> Iterator:
    """`gen`'s items; an error of frozentune's raised while one is made is told in Python terms, and so are the
    message lines logged meanwhile."""
    try:
        while True:
            token, glossing = _WHO.set("python"), _GLOSS.set(gloss)
            try:
                item = next(gen)
            except StopIteration:
                return
            except FrozentuneError as e:
                told(e)
                raise
            finally:
                _WHO.reset(token)
                _GLOSS.reset(glossing)
            yield item
    finally:
        gen.close()


def glossed(log: Callable[[str], None]) -> Callable[[str], None]:
    """`log` (a Python caller's function taking message lines), given each line in the caller's terms: a line
    logged inside a wrapped call that names a flag ("--cv-below 1000: …") ends with what that call takes instead,
    as its errors do. Lines logged elsewhere (the command line, a server's threads) are given as they are."""
    if getattr(log, "_frozentune_glossed", False):  # a nested call's as_log: glossed once
        return log

    @functools.wraps(log)
    def say(line: str) -> None:
        gloss = _GLOSS.get()
        log(gloss(line) if gloss is not None and isinstance(line, str) else line)

    say._frozentune_glossed = True  # type: ignore[attr-defined]
    return say

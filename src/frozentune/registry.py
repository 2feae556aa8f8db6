"""Method registry: each method file registers its config dataclass and head class, so adding
a method touches that one file (plus the import in heads/__init__.py)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import FrozentuneError, out_of_memory
from .fields import as_flag


@dataclass
class MethodConfig:
    """Options every method has. Method configs subclass this; every field has a default and a
    `help` in its metadata (shown by `frozentune list` and the CLI)."""
    train_backbone: bool = field(default=False, metadata={
        "help": "unfreeze the backbone and train it with the head (run live, no cache)"})

    def unused(self) -> list[tuple[list[str], str]]:
        """(options set apart from their defaults, why the other settings leave them unused): saved and
        ignored before. A config lists its own; refuse_unused says them where a user's options come in."""
        return []


def changed(cfg: Any, *names: str) -> list[str]:
    """Of `names`, the fields of dataclass `cfg` whose value is not the field's default."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    return [n for n in names if getattr(cfg, n) != defaults[n]]


def refuse_unused(cfg: Any, who: str, generating: bool = False) -> None:
    """A MethodError naming the options `cfg.unused()` finds (set, and left unused by the other settings),
    and with `generating` those `cfg.unused_generating()` finds (a classifier's options in a generation run).
    Called where a user's options come in (train, pretrain), not where a saved config is read back, so
    that a folder saved before the check still loads."""
    found = getattr(cfg, "unused", lambda: [])() + (getattr(cfg, "unused_generating", lambda: [])() if generating else [])
    for names, why in found:
        if names:  # a flag switched off is written as it was typed: --no-train-backbone
            flags = [as_flag("no_" + n if getattr(cfg, n) is False else n) for n in names]
            raise MethodError(f"{who}: {', '.join(flags)} {why}")


@dataclass
class MethodSpec:
    name: str
    config_cls: type
    head_cls: type
    help: str
    train_defaults: dict[str, Any]  # TrainConfig overrides that suit this method (lr, epochs…)
    # for a method that trains an encoder of its own instead of reading a pre-trained backbone:
    # (config, max_length, seed=0, load_init=True) → a Backbone with encoder_of == name
    encoder: Callable[..., Any] | None = None
    # for a method that also adapts a causal LM to generate text (E2E, WebNLG): a class built as
    # generator(config, lm, tokenizer, lm_name), with .load(folder, lm, tokenizer, lm_name), and its
    # TrainConfig overrides there; None: classification only
    generator: type | None = None
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    # the backbone hidden states this method reads when --layer is not given (LayerSpec syntax,
    # e.g. "-3"); None: the last layer, like every method
    layer: str | None = None

    @property
    def classifies(self) -> bool:
        return self.head_cls is not None

    @property
    def generates(self) -> bool:
        return self.generator is not None


_METHODS: dict[str, MethodSpec] = {}


class MethodError(FrozentuneError, ValueError):
    """Unknown method or bad option; the message lists what is valid."""


def register_method(name: str, config_cls: type, help: str = "",
                    train_defaults: dict[str, Any] | None = None,
                    encoder: Callable[..., Any] | None = None,
                    generator: type | None = None,
                    generation_defaults: dict[str, Any] | None = None,
                    layer: str | None = None) -> Callable[[type | None], type | None]:
    """Class decorator: `@register_method("probe", ProbeConfig)` on a Head taking
    (config, dim, num_labels), or called on None for a method that only generates. `encoder`,
    `generator`, `generation_defaults`, `layer`: see MethodSpec (`api.train` and `model.load` call `encoder` instead of
    loading the backbone named by --backbone)."""
    if not (dataclasses.is_dataclass(config_cls) and issubclass(config_cls, MethodConfig)):
        raise TypeError(f"{name}: config must be a dataclass subclassing MethodConfig")

    def deco(head_cls: type | None) -> type | None:
        if name in _METHODS:
            raise ValueError(f"method {name!r} registered twice")
        if head_cls is None and generator is None:
            raise TypeError(f"{name}: give a head class, or a generator for a generation-only method")
        _METHODS[name] = MethodSpec(name, config_cls, head_cls, help or ((head_cls or generator).__doc__ or "").strip().split("\n")[0],
                                    dict(train_defaults or {}), encoder,
                                    generator, dict(generation_defaults or {}), layer)
        return head_cls
    return deco


def get_method(name: str) -> MethodSpec:
    _load_builtin()
    if not isinstance(name, str) or name not in _METHODS:  # (a list from a hand-edited config.json: not hashable)
        raise MethodError(f"unknown method {name!r}; available: {', '.join(list_methods())}")
    return _METHODS[name]


def list_methods(task: str | None = None) -> list[str]:
    """Registered methods; task "classification" or "generation" keeps those that do it."""
    _load_builtin()
    if task not in (None, "classification", "generation"):
        raise MethodError(f"task {task!r}: choose classification or generation")
    return sorted(n for n, s in _METHODS.items()
                  if task is None or (s.classifies if task == "classification" else s.generates))


def make_config(name: str, options: dict[str, Any] | None = None) -> MethodConfig:
    """The method's config with `options` applied; unknown names or bad values are errors."""
    spec = get_method(name)
    names = {f.name: f for f in dataclasses.fields(spec.config_cls)}
    if options is not None and not isinstance(options, Mapping):  # options=5 raised "'int' object is not iterable"
        raise MethodError(f"options: a {type(options).__name__}; give a dict of method {name!r}'s options, e.g. "
                          f"{{'pooling': 'mean'}} (its options: {', '.join(f.name for f in dataclasses.fields(spec.config_cls))})")
    options = dict(options or {})
    bad = sorted(set(options) - set(names))
    if bad:
        raise MethodError(f"method {name!r} has no option(s) {', '.join(bad)}; its options: "
                          f"{', '.join(names)}")
    cfg = spec.config_cls(**options)
    from .fields import wrong_value

    if (why := wrong_value(cfg)) is not None:  # a value of the wrong type, or not among the choices
        raise MethodError(f"{name}: {why.replace(': choose', '; choose')}")
    if hasattr(cfg, "validate"):
        try:
            cfg.validate()
        except ValueError as e:
            raise MethodError(str(e)) from None
    from .fields import out_of_range

    if (why := out_of_range(cfg)) is not None:  # what the method's own rules do not catch: NaN, a dropout of 2
        raise MethodError(f"{name}: {why}")
    return cfg


def create_method(name: str, dim: int, num_labels: int, options: dict[str, Any] | None = None):
    """(head, config) for method `name` over D=dim states and C=num_labels classes."""
    cfg = make_config(name, options)
    spec = get_method(name)
    if not spec.classifies:
        raise MethodError(f"method {name!r} generates text (E2E, WebNLG); classifiers: "
                          f"{', '.join(list_methods('classification'))}")
    try:
        return spec.head_cls(cfg, dim, num_labels), cfg
    except ValueError as e:  # an option that does not fit these shapes
        raise MethodError(str(e)) from None
    except (MemoryError, RuntimeError, OverflowError, TypeError) as e:  # options that make the head itself too large
        # (--concept-dim 10**9) were told to lower --batch-size; past 2^63 torch's size argument overflows (a TypeError)
        if not (out_of_memory(e) or isinstance(e, OverflowError) or "Overflow" in str(e)):
            raise
        given = [f"{as_flag(f.name)} {getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
                 if getattr(cfg, f.name) != f.default]
        raise MethodError(f"{name}: its head's parameters do not fit in memory for {dim}-wide states and {num_labels} "
                          f"classes with {', '.join(given) or 'its default options'}; give smaller values") from None


def describe_options(name: str) -> list[tuple[str, str, Any, str]]:
    """(option, type, default, help) for each option of a method."""
    spec = get_method(name)
    out = []
    for f in dataclasses.fields(spec.config_cls):
        typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append((f.name, str(typ), default, f.metadata.get("help", "")))
    return out


def _load_builtin() -> None:
    from . import heads  # noqa: F401  (importing registers the built-in methods)

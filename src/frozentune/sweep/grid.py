"""The grid of a sweep: its axes, parsed from comma lists, and the points they span."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..pyterms import in_python_terms
from ..registry import MethodError, get_method


@dataclass(frozen=True)
class Point:
    """One training run of a sweep. lr / weight_decay None: the method's default."""
    method: str
    layer: str  # LayerSpec syntax; "" = the method's default layer
    lr: float | None
    weight_decay: float | None
    seed: int

    def setting(self) -> tuple:
        """What the seeds of one row of the table share."""
        return self.method, self.layer, self.lr, self.weight_decay

    def train_cfg(self) -> dict:
        cfg = {"seed": self.seed}
        if self.lr is not None:
            cfg["lr"] = self.lr
        if self.weight_decay is not None:
            cfg["weight_decay"] = self.weight_decay
        return cfg


def _items(text: str | int | float | list | tuple, what: str, example: str, read=str, kind: str = "names") -> list:
    """The items of a comma list as typed (or, from Python, a list or one value), each read by `read`:
    an empty item or one given twice (as the same value) is an error, not dropped: a grid of fewer
    points than typed would go unnoticed."""
    if isinstance(text, (list, tuple)):
        text = ",".join(map(str, text))
    elif isinstance(text, (int, float)) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        raise MethodError(f"--{what} {text!r}: give a comma list, e.g. {example}")
    items = [v.strip() for v in text.split(",")]
    if not any(items):
        raise MethodError(f"--{what} {text!r}: empty; give a comma list, e.g. {example} (or leave the option out)")
    if not all(items):
        raise MethodError(f"--{what} {text!r}: an empty item between commas; give a comma list, e.g. {example}")
    try:
        values = [read(v) for v in items]
    except ValueError:
        raise MethodError(f"--{what} {text!r}: give a comma list of {kind}, e.g. {example}") from None
    for i, v in enumerate(values):
        if v in values[:i]:
            raise MethodError(f"--{what} {text!r}: {items[i]} is given twice (as {items[values.index(v)]}); give each once")
    return values


def _floats(text: str | list | float | None, what: str) -> list[float | None]:
    if text is None:
        return [None]
    values = _items(text, what, "1e-3,1e-2", float, "numbers")
    if any(not v >= 0 for v in values):
        raise MethodError(f"--{what} {text!r}: give a comma list of non-negative numbers")
    return values


@dataclass(frozen=True)
class Grid:
    methods: tuple[str, ...]
    layers: tuple[str, ...]
    lrs: tuple[float | None, ...]
    weight_decays: tuple[float | None, ...]
    seeds: tuple[int, ...]

    @classmethod
    @in_python_terms()
    def parse(cls, methods: str | list, layers: str | list | int | None = None, lrs: str | list | float | None = None,
              weight_decays: str | list | float | None = None, seeds: str | list | int = "0") -> "Grid":
        """Axes from comma lists (layers separated by ';' or ',' — one layer index each; from Python, a
        list or one value does as well); unknown methods, generation or live methods (they read no
        cache) are refused."""
        from ..api import runs_live

        names = _items(methods, "methods", "probe,space")
        for m in names:
            spec = get_method(m)
            if not spec.classifies or runs_live(m):
                raise MethodError(f"sweep: method {m!r} runs the backbone itself (or generates text), so it cannot "
                                  f"train from one cache; sweep frozen heads (probe, space, ytuning, selfexplain)")
        seed_list = _items(seeds, "seeds", "0,1,2", int, "integers")
        if any(not 0 <= v < 2 ** 32 for v in seed_list):
            raise MethodError(f"--seeds {seeds!r}: give seeds from 0 to 4294967295 (what numpy and scikit-learn seed)")
        layer_list = [""]  # each method's own layer
        if layers is not None:
            text = layers.replace(";", ",") if isinstance(layers, str) else layers
            layer_list = [str(i) for i in _items(text, "layers", "-1,-3", int, "hidden-state indices")]
        return cls(tuple(names), tuple(layer_list), tuple(_floats(lrs, "lr")),
                   tuple(_floats(weight_decays, "weight-decay")), tuple(seed_list))

    def points(self) -> list[Point]:
        """Every combination, layer-major (so each layer's cache is built once, then read)."""
        return [Point(m, layer, lr, wd, s) for layer, m, lr, wd, s in
                itertools.product(self.layers, self.methods, self.lrs, self.weight_decays, self.seeds)]

"""The grid of a sweep: its axes, parsed from comma lists, and the points they span."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

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


def _floats(text: str | None, what: str) -> list[float | None]:
    if not text:
        return [None]
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise MethodError(f"--{what} {text!r}: give a comma list of numbers, e.g. 1e-3,1e-2") from None
    if not values or any(not v >= 0 for v in values):
        raise MethodError(f"--{what} {text!r}: give a comma list of non-negative numbers")
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class Grid:
    methods: tuple[str, ...]
    layers: tuple[str, ...]
    lrs: tuple[float | None, ...]
    weight_decays: tuple[float | None, ...]
    seeds: tuple[int, ...]

    @classmethod
    def parse(cls, methods: str, layers: str | None = None, lrs: str | None = None,
              weight_decays: str | None = None, seeds: str = "0") -> "Grid":
        """Axes from comma lists (layers separated by ';' or ',' — one layer index each); unknown
        methods, generation or live methods (they read no cache) are refused."""
        from ..api import runs_live

        names = [m.strip() for m in methods.split(",") if m.strip()]
        if not names:
            raise MethodError("--methods: give at least one method, e.g. probe,space")
        for m in names:
            spec = get_method(m)
            if not spec.classifies or runs_live(m):
                raise MethodError(f"sweep: method {m!r} runs the backbone itself (or generates text), so it cannot "
                                  f"train from one cache; sweep frozen heads (probe, space, ytuning, selfexplain)")
        try:
            seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError:
            raise MethodError(f"--seeds {seeds!r}: give a comma list of integers, e.g. 0,1,2") from None
        if not seed_list:
            raise MethodError("--seeds: give at least one seed")
        layer_list = [s.strip() for s in (layers or "").replace(";", ",").split(",") if s.strip()] or [""]
        for layer in filter(None, layer_list):
            try:
                int(layer)
            except ValueError:
                raise MethodError(f"--layers {layers!r}: give hidden-state indices, e.g. -1,-3") from None
        return cls(tuple(dict.fromkeys(names)), tuple(dict.fromkeys(layer_list)), tuple(_floats(lrs, "lr")),
                   tuple(_floats(weight_decays, "weight-decay")), tuple(dict.fromkeys(seed_list)))

    def points(self) -> list[Point]:
        """Every combination, layer-major (so each layer's cache is built once, then read)."""
        return [Point(m, layer, lr, wd, s) for layer, m, lr, wd, s in
                itertools.product(self.layers, self.methods, self.lrs, self.weight_decays, self.seeds)]

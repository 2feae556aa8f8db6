"""Serving many tasks from one frozen pass: `frozentune serve`, and the same engine from Python.

  models.py   find saved model folders, load each once, group them by the pass they share
  batcher.py  dynamic batching across concurrent requests (token budget, short wait, queue bound)
  engine.py   Engine: classify / explain / generate, blocking or awaitable, on the batcher
  app.py      the HTTP API (FastAPI on uvicorn), Prometheus metrics, the page
  page.html   the page: type a text, see every task's prediction and explanation on the text

    from frozentune.serve import Engine
    engine = Engine.load(["runs/sst2-space", "runs/trec-ytuning"])
    engine.classify(["a gripping, funny film"], explain=True)
    engine.close()
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .batcher import Overloaded
    from .engine import Engine, RequestError, ServeOptions
    from .models import ServeError

# imported on first use, so that `frozentune serve` can choose its allocator (allocator.py) and start
# again before torch is imported
_FROM = {"Engine": ".engine", "RequestError": ".engine", "ServeOptions": ".engine", "Overloaded": ".batcher",
         "ServeError": ".models"}
__all__ = ["Engine", "Overloaded", "RequestError", "ServeError", "ServeOptions"]


def __getattr__(name: str):
    if name in _FROM:
        return getattr(importlib.import_module(_FROM[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""`frozentune sweep`: methods × layers × learning rates × weight decays × seeds on one cache.

The dataset is read once and the backbone loaded once per layer; the first point on a layer
extracts (or finds) its cache entry and every other point trains from the stored states, with
no backbone pass. Each point is an ordinary `api.train` run (the same defaults, cross-validation
below --cv-below examples), scored by validation accuracy, or by its cross-validated held-out
accuracy where train is small. The table (mean ± std over seeds), a plot and the best point,
saved as a normal model folder, are written to the output folder.
"""
from .grid import Grid, Point
from .run import SweepResult, run_sweep

__all__ = ["Grid", "Point", "SweepResult", "run_sweep"]

"""Pictures of what a model learned (matplotlib, written to PNG; no display needed)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def figure(**kwargs):
    """A matplotlib Figure drawn by the Agg canvas, outside pyplot: `matplotlib.use("Agg")` switched the
    caller's backend too, and a notebook's own plots stopped showing after a sweep or plot-concepts; a
    Figure made so is never registered with pyplot, and is freed with its last reference."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def plot_concepts(k: np.ndarray, y: np.ndarray, labels: Sequence[str], path: Path, title: str) -> str:
    """Scatter the examples' centroids in concept space, coloured by true label.

    k (N, n, m): centroids of N examples in each of the n classes' m-dimensional spaces. With m = 3
    (or 2) each class's space gets its own 3-D (2-D) panel in its own coordinates; otherwise the
    concatenated centroids (N, n·m) are projected onto their two principal components.
    Returns a short description of what was drawn."""
    import matplotlib

    n, m = k.shape[1], k.shape[2]
    colours = matplotlib.colormaps["tab10"]
    if m in (2, 3):
        fig = figure(figsize=(5.2 * n, 5.0))
        for i in range(n):
            ax = fig.add_subplot(1, n, i + 1, **({"projection": "3d"} if m == 3 else {}))
            for c, lab in enumerate(labels):
                pts = k[y == c, i]  # (N_c, m)
                ax.scatter(*pts.T, s=4, alpha=0.5, color=colours(c % 10), label=lab)
            ax.set_title(f"concept space of {labels[i]!r}")
            for axis, name in zip("xyz", ("k[0]", "k[1]", "k[2]")[:m]):
                getattr(ax, f"set_{axis}label")(name)
        what = f"{n} panels, one per class's {m}-D concept space"
    else:
        from sklearn.decomposition import PCA

        flat = k.reshape(len(k), -1)
        pca = PCA(n_components=2, random_state=0).fit(flat)
        xy = pca.transform(flat)
        fig = figure(figsize=(6.0, 5.0))
        ax = fig.subplots()
        for c, lab in enumerate(labels):
            ax.scatter(*xy[y == c].T, s=4, alpha=0.5, color=colours(c % 10), label=lab)
        ratio = pca.explained_variance_ratio_
        ax.set_xlabel(f"PC1 ({100 * ratio[0]:.0f}% of variance)")
        ax.set_ylabel(f"PC2 ({100 * ratio[1]:.0f}% of variance)")
        what = f"the {n}·{m} = {n * m}-D centroids on their first two principal components"
    fig.axes[0].legend(loc="best", markerscale=4, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return what

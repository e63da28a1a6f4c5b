"""Figure of the activation-patching experiment: the recovered share of the logit difference
per (layer, position) or (layer, head). Takes a plain result (duck-typed: the fields named in the
docstring), draws on ``ax`` when given, and returns the matplotlib Figure (built without pyplot,
see :mod:`sinklab.viz.figure`)."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .figure import Figure, subplots


def patching_figure(result: Any, ax: Any = None, title: Optional[str] = None, annotate: bool = False) -> Figure:
    """Heatmap of the mean recovered share (0 = corrupted run, 1 = clean run; diverging colours
    centred on 0) with layers down and positions (labelled by the clean tokens) or heads across;
    cells whose interval over pairs lies above 0.5 are outlined.

    Args:
        result: a :class:`sinklab.analysis.patching_experiment.PatchingResult` (uses ``mean``,
            ``lo`` (L', X), ``layers``, ``index``, ``axis``, ``over``, ``tokens``, ``model``,
            ``recovered`` (N, ...)).
        ax: a matplotlib Axes to draw on (default: a new figure).
        annotate: write each cell's mean.
    """
    mean = np.asarray(result.mean, np.float64)
    L, X = mean.shape
    if ax is None:
        fig, ax = subplots(1, 1, figsize=(1.5 + 0.42 * X, 1.2 + 0.2 * L), layout="constrained")
    else:
        fig = ax.figure
    lim = max(1.0, float(np.nanmax(np.abs(mean))) if np.isfinite(mean).any() else 1.0)
    im = ax.imshow(mean, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    lo = np.asarray(result.lo, np.float64)
    for li, xi in zip(*np.nonzero(np.nan_to_num(lo, nan=-np.inf) > 0.5)):
        ax.add_patch(_rect(xi, li))
    if annotate:
        for li in range(L):
            for xi in range(X):
                if np.isfinite(mean[li, xi]):
                    ax.text(xi, li, f"{mean[li, xi]:.2f}", ha="center", va="center", fontsize=5)
    if result.axis == "position":
        toks = list(result.tokens)
        ax.set_xticks(range(X), [repr(toks[i])[1:-1] if i < len(toks) else str(i) for i in result.index],
                      rotation=90, fontsize=6)
        ax.set_xlabel("position (clean token)")
    else:
        ax.set_xticks(range(X), [str(h) for h in result.index], fontsize=6)
        ax.set_xlabel("head")
    step = max(1, L // 12)
    ax.set_yticks(range(0, L, step), [str(result.layers[i]) for i in range(0, L, step)], fontsize=7)
    ax.set_ylabel("layer")
    n = np.asarray(result.recovered).shape[0]
    ax.set_title(title or f"{result.over} patching, {result.model} ({n} pairs)", fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.8, label="recovered logit difference")
    return fig


def _rect(x: int, y: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, lw=0.8, ec="black")

"""Figures. Every function returns a matplotlib Figure built without pyplot
(see :mod:`sinklab.viz.figure`): the user's backend is never switched."""
from __future__ import annotations

from typing import Optional

import numpy as np

from .figure import Figure, colormap, restylable, subplots


@restylable
def importance_heatmap(importance: np.ndarray, eps: Optional[float] = None, title: str = "") -> Figure:
    """Layers × heads heatmap of first-token importance a_0 (Gu et al.'s metric).

    ``importance``: (L, H) values in [0, 1]. Heads above ``eps`` (sinks) are outlined.
    """
    imp = np.asarray(importance, dtype=np.float64)
    L, H = imp.shape
    fig, ax = subplots(figsize=(max(4.0, 0.45 * H + 2.0), max(4.0, 0.22 * L + 1.5)))
    im = ax.imshow(imp, aspect="auto", cmap=colormap("viridis"), vmin=0.0, vmax=1.0, origin="lower")
    if eps is not None:
        ys, xs = np.nonzero(imp > eps)
        ax.scatter(xs, ys, s=12, facecolors="none", edgecolors="white", linewidths=0.8,
                   label=f"mean a₀ > {eps:g}")
        if len(xs):
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.07), fontsize=8, frameon=False)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(H))
    ax.set_title(title or "attention to the first token")
    fig.colorbar(im, ax=ax, label="first-token importance a₀ (mean attention received)")
    fig.tight_layout()
    return fig


@restylable
def layer_lines(panels: "dict", title: str = "") -> Figure:
    """One panel per quantity, a line per condition against layer.

    ``panels``: {panel title: {condition label: (L,) values}}.
    """
    fig, axes = subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (name, lines) in zip(axes[0], panels.items()):
        for label, values in lines.items():
            ax.plot(np.arange(len(values)), values, marker="o", ms=3, label=label.replace("_", " "))
        ax.set_xlabel("layer")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

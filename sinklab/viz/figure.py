"""The one way sinklab makes a figure: a matplotlib ``Figure`` built without pyplot.

Going through pyplot would register the figure in pyplot's global list and, for a headless
default, tempt a ``matplotlib.use(...)`` that switches the user's backend (in Jupyter that closes
their open figures). A :class:`Figure` here is never seen by pyplot: the caller owns it, it is
garbage-collected like any object, ``fig.savefig(path)`` writes it with the Agg renderer, and in
Jupyter it shows itself as a PNG through ``_repr_png_`` whatever backend is active.
"""
from __future__ import annotations

import io
from typing import Any, Tuple

from matplotlib import colormaps
from matplotlib.colors import Colormap
from matplotlib.figure import Figure as _MplFigure

REPR_DPI = 100  # resolution of the inline PNG in notebooks; savefig takes its own dpi


class Figure(_MplFigure):
    """A matplotlib Figure that renders itself as PNG in Jupyter without pyplot."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=REPR_DPI)
        return buf.getvalue()


def subplots(nrows: int = 1, ncols: int = 1, figsize: Tuple[float, float] = (6.4, 4.8),
             layout: Any = None, **subplot_kw: Any) -> Tuple[Figure, Any]:
    """Like ``plt.subplots`` but pyplot-free: (figure, axes), axes squeezed as pyplot does
    unless ``squeeze=False`` is passed."""
    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **subplot_kw)


def colormap(name: str) -> Colormap:
    """A registered colormap by name (what ``plt.get_cmap`` returns)."""
    return colormaps[name]

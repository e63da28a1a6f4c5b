"""The one way sinklab makes a figure: a matplotlib ``Figure`` built without pyplot.

Going through pyplot would register the figure in pyplot's global list and, for a headless
default, tempt a ``matplotlib.use(...)`` that switches the user's backend (in Jupyter that closes
their open figures). A :class:`Figure` here is never seen by pyplot: the caller owns it, it is
garbage-collected like any object, ``fig.savefig(path)`` writes it with the Agg renderer, and in
Jupyter it shows itself as a PNG through ``_repr_png_`` whatever backend is active.

Every public figure function is :func:`restylable`: ``ax=`` draws a one-panel figure on the
caller's axes, ``fig=`` draws any figure into the caller's (cleared) figure, ``cmap=`` replaces
the colour map of every colour-mapped panel; the function returns the Figure it drew on. The
choice reaches :func:`subplots` and :func:`colormap` through a context variable, so the figure
functions themselves stay as they are.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import io
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

import numpy as np

from matplotlib import colormaps
from matplotlib.colors import Colormap
from matplotlib.figure import Figure as _MplFigure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

REPR_DPI = 100  # resolution of the inline PNG in notebooks; savefig takes its own dpi


class Figure(_MplFigure):
    """A matplotlib Figure that renders itself as PNG in Jupyter without pyplot."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=REPR_DPI)
        return buf.getvalue()


@dataclass
class _Target:
    ax: Any = None
    fig: Any = None
    cmap: Union[str, Colormap, None] = None
    used: bool = False       # the caller's axes or figure go to the first subplots() call only


_TARGET: contextvars.ContextVar[Optional[_Target]] = contextvars.ContextVar("sinklab_figure_target", default=None)

F = TypeVar("F", bound=Callable[..., Any])


def restylable(fn: F) -> F:
    """Adds ``ax=`` (one-panel figures), ``fig=`` (any figure) and ``cmap=`` (a colormap name or
    object) to a figure function; it returns the Figure it drew on. A function that already takes
    ``ax`` keeps handling it (and gets ``fig=``/``cmap=``)."""
    params = inspect.signature(fn).parameters
    own_ax = "ax" in params

    @functools.wraps(fn)
    def wrapper(*args: Any, ax: Any = None, fig: Any = None, cmap: Union[str, Colormap, None] = None,
                **kw: Any) -> Any:
        if ax is not None and fig is not None:
            raise ValueError("pass ax= (draw on these axes) or fig= (draw into this figure), not both")
        if cmap is not None and not isinstance(cmap, (str, Colormap)):
            raise TypeError(f"cmap must be a colormap name or a matplotlib Colormap, got {type(cmap).__name__}")
        if own_ax:
            kw["ax"] = ax
        token = _TARGET.set(_Target(None if own_ax else ax, fig, cmap))
        try:
            return fn(*args, **kw)
        finally:
            _TARGET.reset(token)

    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
             for n in ("ax", "fig", "cmap") if n not in params]
    sig = inspect.signature(fn)
    kinds = [p for p in sig.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    var_kw = [p for p in sig.parameters.values() if p.kind == inspect.Parameter.VAR_KEYWORD]
    wrapper.__signature__ = sig.replace(parameters=kinds + extra + var_kw)  # type: ignore[attr-defined]
    wrapper.__restylable__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def subplots(nrows: int = 1, ncols: int = 1, figsize: Tuple[float, float] = (6.4, 4.8),
             layout: Any = None, **subplot_kw: Any) -> Tuple[Figure, Any]:
    """Like ``plt.subplots`` but pyplot-free: (figure, axes), axes squeezed as pyplot does
    unless ``squeeze=False`` is passed. Inside a :func:`restylable` call given ``ax=`` (one
    panel only) or ``fig=``, those are used instead of a new figure."""
    t = _TARGET.get()
    if t is not None and not t.used and (t.ax is not None or t.fig is not None):
        t.used = True
        if t.ax is not None:
            if (nrows, ncols) != (1, 1):
                raise ValueError(f"this figure has {nrows} x {ncols} panels: pass fig= (a figure to draw into) "
                                 f"instead of ax=")
            return t.ax.figure, (t.ax if subplot_kw.get("squeeze", True) else np.array([[t.ax]]))
        t.fig.clear()
        if layout is not None:
            t.fig.set_layout_engine(layout)
        return t.fig, t.fig.subplots(nrows, ncols, **subplot_kw)
    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **subplot_kw)


def colormap(name: str) -> Colormap:
    """A registered colormap by name (what ``plt.get_cmap`` returns), or, inside a
    :func:`restylable` call given ``cmap=``, that one."""
    t = _TARGET.get()
    chosen = t.cmap if t is not None and t.cmap is not None else name
    return colormaps[chosen] if isinstance(chosen, str) else chosen


def readable_log(ax: Any, axis: str = "y") -> None:
    """Enough tick labels on a log ``axis`` ("x", "y" or "both"): evenly spaced round values
    within one decade (where matplotlib labels only one or two ticks), 1, 2 and 5 of each decade
    up to three decades, one label per decade beyond."""
    for name in ("x", "y") if axis == "both" else (axis,):
        a = ax.xaxis if name == "x" else ax.yaxis
        if a.get_scale() != "log":
            continue
        a.set_major_locator(_ReadableLogLocator())
        a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a.set_minor_formatter(NullFormatter())


class _ReadableLogLocator(LogLocator):
    """1, 2, 5 per decade; within a decade, round values as a linear axis would have."""

    def __init__(self) -> None:
        super().__init__(base=10, subs=(1.0, 2.0, 5.0))

    def tick_values(self, vmin: float, vmax: float) -> Any:
        lo, hi = sorted((vmin, vmax))
        if lo > 0 and hi / lo < 10:
            ticks = np.asarray(MaxNLocator(nbins=8, steps=[1.0, 2.0, 2.5, 5.0, 10.0]).tick_values(lo, hi))
            return ticks[ticks > 0]
        if lo > 0 and hi / lo > 1e3:                  # many decades: one label each is enough
            return LogLocator(base=10).tick_values(vmin, vmax)
        return super().tick_values(vmin, vmax)


def percent_axis(ax: Any, axis: str = "y", top: float = 100.0) -> None:
    """A percentage ``axis`` that runs from 0 to ``top`` exactly (no −2 % margin); markers at the
    ends are drawn whole rather than clipped."""
    (ax.set_xlim if axis == "x" else ax.set_ylim)(0, top)
    for artist in list(ax.lines) + list(ax.collections):
        artist.set_clip_on(False)


LINESTYLES = ("-", "--", ":", "-.")


def distinct_label(label: str, y: np.ndarray, drawn: dict) -> str:
    """``label``, with "(= other)" appended when ``y`` equals a curve already drawn on the same
    axes (``drawn``: label -> values, updated), so that a line hidden under an identical one is
    still accounted for in the legend."""
    same = next((k for k, v in drawn.items() if v.shape == y.shape and np.allclose(v, y, rtol=1e-6, atol=0,
                                                                                     equal_nan=True)), None)
    drawn[label] = np.asarray(y, dtype=float)
    return f"{label} (= {same})" if same is not None else label

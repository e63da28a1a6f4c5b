"""Figures for the secondary sinks and the sinks across documents: class enrichment with
intervals, the per-head map of the strongest secondary key, and a per layer across document
boundaries. Each takes plain numbers (dicts of intervals, arrays), draws on ``ax`` when given, and
returns the matplotlib Figure (built without pyplot, see :mod:`sinklab.viz.figure`)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from .figure import Figure, colormap, restylable, subplots


def _axes(ax: Any, figsize: Tuple[float, float]) -> Tuple[Figure, Any]:
    if ax is None:
        return subplots(1, 1, figsize=figsize, layout="constrained")
    return ax.figure, ax


def _iv(d: Optional[Dict[str, Any]]) -> Tuple[float, float, float]:
    if not d:
        return (np.nan, np.nan, np.nan)
    return tuple(float(np.nan if d.get(k) is None else d[k]) for k in ("value", "lo", "hi"))  # type: ignore


@restylable
def class_enrichment_figure(classes: Dict[str, Dict[str, Any]], ax: Any = None, title: str = "") -> Figure:
    """Per token class, the enrichment of its secondary attention mass over its frequency and over
    the uniform-attention (position) baseline, log scale, with 95 % intervals; 1 = no enrichment.

    Args:
        classes: {class name: {"enrich_freq": interval dict, "enrich_pos": interval dict, ...}}
            (:meth:`sinklab.analysis.secondary.SecondarySinks.class_summary`).
        ax: a matplotlib Axes to draw on (default: a new figure).
    """
    fig, ax = _axes(ax, (5.0, 3.4))
    names = list(classes)
    x = np.arange(len(names))
    bars = ((-0.17, "enrich_freq", "over frequency"), (0.17, "enrich_pos", "over position (uniform attention)"))
    for dx, key, label in bars:
        v = np.array([_iv(classes[n].get(key)) for n in names])
        ok = np.isfinite(v[:, 0]) & (v[:, 0] > 0)
        err = np.abs(np.stack([v[ok, 0] - v[ok, 1], v[ok, 2] - v[ok, 0]]))
        ax.bar(x[ok] + dx, v[ok, 0], width=0.34, yerr=err, capsize=2, label=label)
    ax.axhline(1.0, c="gray", lw=1, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("mass share / baseline share")
    ax.set_title(title or "secondary attention mass by token class", fontsize=9)
    ax.legend(fontsize=7)
    return fig


@restylable
def secondary_map_figure(a_max2: np.ndarray, top_class: np.ndarray, class_names: Sequence[str], ax: Any = None,
                         title: str = "") -> Figure:
    """Layer x head map of the largest secondary a_k (mean over prompts), each cell labelled with
    the initial of the class its top key has most often.

    Args:
        a_max2: (L, H) mean largest a_k over keys k >= 1. top_class: (L, H) int class index.
        class_names: the class names (:data:`sinklab.analysis.secondary.TOKEN_CLASSES`).
    """
    a = np.asarray(a_max2, np.float64)
    L, H = a.shape
    fig, ax = _axes(ax, (1.2 + 0.45 * H, 1.0 + 0.25 * L))
    im = ax.imshow(a, aspect="auto", origin="lower", cmap=colormap("magma"), vmin=0, vmax=max(0.05, float(a.max())))
    tc = np.asarray(top_class)
    for l in range(L):
        for h in range(H):
            ax.text(h, l, class_names[int(tc[l, h])][0], ha="center", va="center", fontsize=5,
                    color="white" if a[l, h] < 0.6 * a.max() else "black")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(H))
    ax.set_title(title or "largest secondary a_k (letter: class of the top key)", fontsize=9)
    fig.colorbar(im, ax=ax, label="mean max_{k≥1} a_k")
    return fig


@restylable
def document_sinks_figure(profiles: Dict[str, np.ndarray], ax: Any = None, title: str = "",
                          sep_token: str = "⟨bos⟩") -> Figure:
    """Per layer, the mean over heads (and prompts) of Gu's a at position 0, at the later
    documents' starts with and without a separator, after the separator, and at the other keys.

    Args:
        profiles: {"first", "start_sep", "after_sep", "start_plain", "rest": (L,) arrays}; any may
            be missing.
        sep_token: the separator's string, for the legend.
    """
    fig, ax = _axes(ax, (5.2, 3.4))
    style = {"first": ("position 0", "-", "o"), "start_sep": (f"{sep_token} at a boundary", "-", "s"),
             "after_sep": (f"first token after {sep_token}", ":", "^"),
             "start_plain": ("document start, no separator", "--", "v"), "rest": ("other keys", "-", ".")}
    for key, (label, ls, mk) in style.items():
        if key in profiles:
            y = np.asarray(profiles[key], np.float64)
            ax.plot(np.arange(len(y)), y, ls=ls, marker=mk, ms=3, lw=1.2, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean a over heads")
    ax.set_title(title or "sinks across concatenated documents", fontsize=9)
    ax.legend(fontsize=7)
    return fig

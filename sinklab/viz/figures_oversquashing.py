"""Figure for the multi-head over-squashing bound (the paper's Thm. 3.2) against the measured
Jacobian norms (:func:`sinklab.analysis.oversquashing.oversquashing_bound`).

Returns a :class:`sinklab.viz.figure.Figure`, built without pyplot; it shows inline in Jupyter
and saves with ``fig.savefig(path, dpi=150)``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np

from .figure import Figure, colormap, readable_log, restylable, subplots

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _as_dict(results: Union[Any, Mapping[str, Any]]) -> Dict[str, Any]:
    if isinstance(results, Mapping):
        return dict(results)
    return {"": results}


@restylable
def bound_vs_measured(results: Union[Any, Mapping[str, Any]], layers: Optional[Sequence[int]] = None,
                      title: str = "") -> Figure:
    """Thm. 3.2's bound against the measured spectral norm ||d v_target^(L) / d v_j^(l)||_2.

    Three panels, log axes:
      1. for the first result, bound (solid) and measurement (dashed) over source position j
         for a few layers l (``layers``; default 4 spread over 0..L-1);
      2. every (layer, position) as a point (measured, bound), one colour per result, with the
         line bound = measured (every point must lie above it);
      3. per layer: the median bound / measured over positions (solid, left axis) and the rank
         correlation over positions (dotted, right axis), per result.

    Args:
        results: one :class:`OversquashingBound` with measurements, or ``{label: result}`` (e.g.
            ``{"with BOS": ..., "without BOS": ..., "sink masked": ...}``).
        layers: layers drawn in panel 1.
        title: figure title (default: the model name and target).
    """
    rs = _as_dict(results)
    if not rs or any(r.measured is None for r in rs.values()):
        raise ValueError("bound_vs_measured needs results with measured norms (measured=...)")
    first = next(iter(rs.values()))
    L = first.bound.shape[0] - 1
    if layers is None:
        layers = sorted(set(int(x) for x in np.linspace(0, L - 1, min(4, L)).round()))
    fig, axes = subplots(1, 3, figsize=(15.0, 4.3))

    ax = axes[0]
    cmap = colormap("viridis")
    t = first.target
    j = np.arange(t + 1)
    for i, l in enumerate(layers):
        col = cmap(i / max(1, len(layers) - 1))
        b, m = first.bound[l, :t + 1], first.measured[l, :t + 1]
        ax.plot(j, np.where(b > 0, b, np.nan), color=col, lw=1.6, label=f"l={l} bound")
        ax.plot(j, np.where(m > 0, m, np.nan), color=col, lw=1.2, ls="--", label=f"l={l} measured")
    ax.set_yscale("log")
    readable_log(ax, "y")
    ax.set_xlabel("source position j")
    ax.set_ylabel(f"‖d v[L][{t}] / d v[l][j]‖ (spectral)")
    ax.set_title("bound (solid) vs measured (dashed)" + (f": {next(iter(rs))}" if next(iter(rs)) else ""))
    ax.legend(fontsize=7, ncol=2)

    ax = axes[1]
    lo, hi = np.inf, 0.0
    for k, (label, r) in enumerate(rs.items()):
        b, m = r.bound[:-1, :r.target + 1].ravel(), r.measured[:-1, :r.target + 1].ravel()
        ok = (b > 0) & (m > 0) & np.isfinite(m)
        if not ok.any():
            continue
        ax.scatter(m[ok], b[ok], s=5, alpha=0.45, color=PALETTE[k % len(PALETTE)],
                   label=f"{label or 'result'} (min ratio {r.min_ratio:.3g})", rasterized=True)
        lo, hi = min(lo, m[ok].min(), b[ok].min()), max(hi, m[ok].max(), b[ok].max())
    if hi > 0:
        ax.plot([lo, hi], [lo, hi], color="k", lw=1, ls=":", label="bound = measured")
    ax.set_xscale("log")
    readable_log(ax, "x")
    ax.set_yscale("log")
    readable_log(ax, "y")
    ax.set_xlabel("measured spectral norm")
    ax.set_ylabel("bound")
    ax.set_title("every (layer, source position)")
    ax.legend(fontsize=7)

    ax = axes[2]
    ax2 = ax.twinx()
    for k, (label, r) in enumerate(rs.items()):
        col = PALETTE[k % len(PALETTE)]
        with np.errstate(all="ignore"):
            med = np.array([np.nanmedian(row) if np.isfinite(row).any() else np.nan
                            for row in r.ratio[:-1, :r.target + 1]])
        ax.plot(np.arange(L), med, color=col, lw=1.8, label=label or None)
        ax2.plot(np.arange(L), r.spearman[:-1], color=col, lw=1.2, ls=":")
    ax.set_yscale("log")
    readable_log(ax, "y")
    ax.set_xlabel("source layer l")
    ax.set_ylabel("median bound / measured (solid)")
    ax2.set_ylabel("rank correlation over positions (dotted)")
    ax2.set_ylim(-1.05, 1.05)
    ax.set_title("looseness and shape agreement")
    if any(rs):
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(title or f"{first.meta.get('model') or ''}: Thm. 3.2 bound vs measured Jacobian "
                 f"(target position {t}, constants {first.constants})", fontsize=11)
    fig.tight_layout()
    return fig

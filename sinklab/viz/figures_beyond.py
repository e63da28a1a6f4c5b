"""Figures for the beyond-the-paper analyses: massive activations per layer, the per-head
sink map of the sink key's geometry, windowed perplexity with kept sink tokens and the sink-head
ablation against matched controls. Each takes a plain result object (duck-typed: the fields
named in its docstring), draws on ``ax`` when given, and returns the matplotlib Figure (built
without pyplot, see :mod:`sinklab.viz.figure`)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from .figure import Figure, LINESTYLES, colormap, readable_log, restylable, subplots


def _axes(ax: Any, figsize: Tuple[float, float]) -> Tuple[Figure, Any]:
    if ax is None:
        return subplots(1, 1, figsize=figsize, layout="constrained")
    return ax.figure, ax


@restylable
def massive_activations_figure(result: Any, ax: Any = None, title: Optional[str] = None) -> Figure:
    """Per residual stream l = 0..L, the top |activation| over the median |activation| (log
    scale; mean over prompts with the 2.5-97.5 % range of prompts shaded), streams whose largest
    entry sits at position 0 (⟨bos⟩) in most prompts marked with a filled dot, the ⟨bos⟩ norm-jump
    layer's output stream with a dashed line.

    Args:
        result: a :class:`sinklab.analysis.massive.MassiveActivations` (uses ``top_ratio``
            (P, S), ``top_at_bos`` (S,), ``jump_layer``, ``writer``, ``model``, ``T``).
        ax: a matplotlib Axes to draw on (default: a new figure).
    """
    fig, ax = _axes(ax, (6.4, 4.0))
    r = np.asarray(result.top_ratio, np.float64)
    S = r.shape[1]
    x = np.arange(S)
    mean = r.mean(axis=0)
    lo, hi = np.percentile(r, [2.5, 97.5], axis=0)
    ax.fill_between(x, lo, hi, alpha=0.25, lw=0, label="2.5–97.5 % of prompts")
    ax.plot(x, mean, "-", lw=1.5, label="mean top |x| / median |x|")
    bos = np.asarray(result.top_at_bos) > 0.5
    ax.plot(x[bos], mean[bos], "o", ms=5, label="top entry at ⟨bos⟩ (position 0)")
    ax.plot(x[~bos], mean[~bos], "o", ms=5, mfc="none", label="top entry elsewhere")
    j = int(result.jump_layer) + 1
    ax.axvline(j, ls="--", lw=1, c="gray", label=f"⟨bos⟩ norm jump: layer {j - 1} ({result.writer})")
    ax.set_yscale("log")
    readable_log(ax, "y")
    ax.set_xlabel("residual stream l (entering layer l)")
    ax.set_ylabel("top |activation| / median")
    ax.set_title(title or f"massive activations, {result.model} (T={result.T})", fontsize=10)
    ax.legend(fontsize=7)
    return fig


@restylable
def sink_map_figure(result: Any, ax: Any = None, title: Optional[str] = None, annotate: bool = True) -> Figure:
    """Per-head sink map: a layer x head heatmap of the mean first-token importance a_0,
    each cell annotated with the mean ‖k_0‖ / mean ‖k_j‖ (the sink key's norm ratio).

    Args:
        result: a :class:`sinklab.analysis.key_geometry.KeyGeometry` (uses ``a0`` and
            ``norm_ratio``, (P, L, H), ``model``, ``T``).
        ax: a matplotlib Axes to draw on (default: a new figure).
        annotate: write the norm ratio in each cell.
    """
    a0 = np.asarray(result.a0, np.float64).mean(axis=0)
    ratio = np.asarray(result.norm_ratio, np.float64).mean(axis=0)
    L, H = a0.shape
    fig, ax = _axes(ax, (1.2 + 0.6 * H, 1.0 + 0.3 * L))
    im = ax.imshow(a0, aspect="auto", origin="lower", cmap=colormap("viridis"), vmin=0, vmax=1)
    if annotate:
        for l in range(L):
            for h in range(H):
                ax.text(h, l, f"{ratio[l, h]:.2g}", ha="center", va="center", fontsize=5,
                        color="black" if a0[l, h] > 0.6 else "white")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(H))
    ax.set_title(title or f"sink map, {result.model} (T={result.T}): colour a₀, text ‖k₀‖/mean‖kⱼ‖", fontsize=9)
    fig.colorbar(im, ax=ax, label="mean a₀")
    return fig


@restylable
def windowed_figure(result: Any, ax: Any = None, title: Optional[str] = None) -> Figure:
    """Perplexity ratio to full attention (log scale) against the window w, one line per count k
    of kept first tokens, with the 95 % interval over text stretches as error bars.

    Args:
        result: a :class:`sinklab.analysis.windowed.WindowedPerplexity` (uses ``windows``,
            ``keeps``, ``delta(w, k)``, ``model``, ``T``).
        ax: a matplotlib Axes to draw on (default: a new figure).
    """
    fig, ax = _axes(ax, (5.0, 3.6))
    w = np.asarray(result.windows, np.float64)
    n = len(result.keeps)
    for j, k in enumerate(result.keeps):
        ivs = [result.delta(int(x), k) for x in result.windows]
        v = np.exp([i.value for i in ivs])
        lo, hi = np.exp([i.lo for i in ivs]), np.exp([i.hi for i in ivs])
        dodge = 2.0 ** (0.05 * (j - (n - 1) / 2))      # side by side, so near-equal curves stay visible
        ax.errorbar(w * dodge, v, yerr=[v - lo, hi - v], marker="osD^v"[j % 5], ls=LINESTYLES[j % len(LINESTYLES)],
                    capsize=3, label=f"window + first {k} kept")
    ax.axhline(1.0, ls="--", lw=1, c="gray", label="full attention")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    readable_log(ax, "y")
    ax.set_xlabel("window w (keys per query)")
    ax.set_ylabel("perplexity / full attention")
    ax.set_title(title or f"windowed attention, {result.model} (T={result.T})", fontsize=10)
    ax.legend(fontsize=7)
    return fig


@restylable
def head_ablation_figure(result: Any, ax: Any = None, title: Optional[str] = None) -> Figure:
    """ΔNLL of each random matched draw (histogram of the draws' prompt means) with the sink
    heads' ΔNLL and its 95 % interval over prompts marked.

    Args:
        result: a :class:`sinklab.analysis.head_ablation.HeadAblation` (uses ``nll_base``,
            ``nll_random``, ``dnll_sink()``, ``n``, ``model``, ``T``).
        ax: a matplotlib Axes to draw on (default: a new figure).
    """
    fig, ax = _axes(ax, (5.0, 3.6))
    d = (np.asarray(result.nll_random) - np.asarray(result.nll_base)[None]).mean(axis=1)
    ax.hist(d, bins=max(5, min(30, len(d))), alpha=0.6, label=f"{len(d)} matched random draws")
    s = result.dnll_sink()
    ax.axvline(s.value, c="C3", lw=2, label=f"top {result.n} sink heads")
    if s.defined:
        ax.axvspan(s.lo, s.hi, color="C3", alpha=0.15, lw=0, label="95 % interval (prompts)")
    ax.axvline(0.0, ls="--", lw=1, c="gray")
    ax.set_xlabel("ΔNLL (nats) when the heads write nothing")
    ax.set_ylabel("draws")
    ax.set_title(title or f"sink-head ablation, {result.model} (T={result.T})", fontsize=10)
    ax.legend(fontsize=7)
    return fig

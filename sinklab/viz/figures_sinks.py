"""Figures for prompt-set sink studies and quality with/without BOS. Each returns a matplotlib
Figure built without pyplot
(see :mod:`sinklab.viz.figure`): the user's backend is never switched."""
from __future__ import annotations

from typing import Optional

import numpy as np

from matplotlib.ticker import MaxNLocator

from .figure import Figure, colormap, percent_axis, readable_log, restylable, subplots



@restylable
def bos_comparison_figure(with_bos, without_bos=None, eps: float = 0.3,
                          title: Optional[str] = None) -> Figure:
    """Mean first-token importance a_0 per (layer, head), with and without BOS, side by side,
    their spread over prompts (standard deviation), and the per-layer sink rate at ``eps``.

    Args:
        with_bos: a :class:`sinklab.analysis.sinkset.SinkStudy` with BOS, or a ``BosComparison``.
        without_bos: the study without BOS (omit when ``with_bos`` is a ``BosComparison``).
        eps: threshold for the per-layer sink-rate panel and the outlined heads.

    Layout (2 x 3): top row mean a_0 (L x H heatmaps, shared 0-1 scale; heads whose mean exceeds
    ``eps`` are dotted) and per-layer sink rate (%); bottom row the standard deviation of a_0
    over prompts (shared scale) and the distribution of a_0 over all (prompt, layer, head).
    """
    if without_bos is None:
        with_bos, without_bos = with_bos.with_bos, with_bos.without_bos
    studies = (("with BOS", with_bos), ("without BOS", without_bos))
    L, H = with_bos.mean.shape
    fig, axes = subplots(2, 3, figsize=(4.0 + 0.55 * H * 2 + 4.5, max(6.5, 0.36 * L + 2.0)),
                             gridspec_kw={"width_ratios": [1, 1, 1.25]}, layout="constrained")
    smax = max(float(with_bos.std.max()), float(without_bos.std.max()), 1e-6)
    for col, (name, s) in enumerate(studies):
        ax = axes[0, col]
        im = ax.imshow(s.mean, aspect="auto", origin="lower", cmap=colormap("viridis"), vmin=0, vmax=1)
        ys, xs = np.nonzero(s.mean > eps)
        ax.scatter(xs, ys, s=6, c="white", marker=".")
        first = s.bos_token if s.bos else "each prompt's first token"
        ax.set_title(f"mean a₀, {name}\n(position 0: {first!s}; · marks mean a₀ > {eps:g})", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(H))
        ims = axes[1, col].imshow(s.std, aspect="auto", origin="lower", cmap=colormap("magma"), vmin=0, vmax=smax)
        axes[1, col].set_title(f"std of a₀ over {s.n_prompts} prompts, {name}", fontsize=9)
        axes[1, col].set_xlabel("head")
        axes[1, col].set_ylabel("layer")
        axes[1, col].set_xticks(range(H))
    fig.colorbar(im, ax=axes[0, :2].tolist(), label="mean a₀", shrink=0.9)
    fig.colorbar(ims, ax=axes[1, :2].tolist(), label="std of a₀", shrink=0.9)

    ax = axes[0, 2]
    for (name, s), style in zip(studies, ("-o", "--s")):
        ax.plot(100 * s.layer_sink_rate(eps), np.arange(L), style, ms=3,
                label=f"{name}: {100 * s.sink_rate(eps):.1f}%")
    percent_axis(ax, "x")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"sink rate at eps={eps:g} (% of heads x prompts)")
    ax.set_ylabel("layer")
    ax.set_title("per-layer sink rate", fontsize=9)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)

    ax = axes[1, 2]
    bins = np.linspace(0, 1, 41)
    for name, s in studies:
        ax.hist(s.importance.ravel(), bins=bins, histtype="step", lw=1.5, label=name)
    ax.axvline(eps, color="k", ls=":", lw=1, label=f"eps = {eps:g}")
    ax.set_yscale("log")
    ax.set_xlabel("a₀ (all prompts, layers, heads)")
    ax.set_ylabel("count")
    ax.legend(fontsize=8)
    fig.suptitle(title or f"{with_bos.model}: attention to position 0, T={with_bos.T}", fontsize=11)
    return fig


@restylable
def passkey_figure(with_bos, without_bos, title: Optional[str] = None) -> Figure:
    """Passkey accuracy (%) against length (tokens, log scale), with and without BOS.

    ``with_bos``/``without_bos``: :class:`sinklab.analysis.quality.PasskeyResult`.
    """
    fig, ax = subplots(figsize=(5.5, 3.6))
    for r, name, style in ((with_bos, "with BOS", "-o"), (without_bos, "without BOS", "--s")):
        xs = sorted(r.accuracy)
        ax.plot(xs, [100 * r.accuracy[n] for n in xs], style, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(with_bos.accuracy))
    ax.set_xticklabels([str(n) for n in sorted(with_bos.accuracy)])
    percent_axis(ax, "y")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("passkey accuracy (%)")
    n = sum(1 for t in with_bos.trials if t.length == min(with_bos.accuracy))
    ax.set_title(title or f"{with_bos.model}: passkey retrieval ({n} trials per length)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


@restylable
def task_accuracy_figure(results, title: Optional[str] = None, exact: bool = False,
                         chance: bool = True) -> Figure:
    """Accuracy (%) against length (tokens, log scale) with 95 % Wilson interval bars, one line per
    condition.

    Args:
        results: {label: :class:`sinklab.analysis.tasks.RetrievalResult`} (e.g. ``{"with BOS": a,
            "without BOS": b, "BOS, masked": c}``), or a list of results (labelled by their BOS
            condition and intervention). A :class:`~sinklab.analysis.tasks.ClozeResult` is drawn
            as a point with its bar at the right of the length axis, labelled "cloze".
        exact: plot the greedy exact-match accuracy of retrieval results instead of the
            multiple-choice accuracy.
        chance: draw each task's chance level (dotted).
    """
    if not isinstance(results, dict):
        results = {(("with BOS" if r.bos else "without BOS")
                    + (f", {r.intervention}" if getattr(r, "intervention", None) else "")): r
                   for r in results}
    if not results:
        raise ValueError("no results to plot")
    fig, ax = subplots(figsize=(6.0, 3.8))
    styles = ("-o", "--s", ":^", "-.D", "-v", "--P")
    ret = {k: r for k, r in results.items() if hasattr(r, "lengths")}
    clz = {k: r for k, r in results.items() if not hasattr(r, "lengths")}
    xs_all = sorted({n for r in ret.values() for n in r.lengths})
    x_cloze = (2 * xs_all[-1]) if xs_all else 1
    nres = max(1, len(results))
    for j, (label, r) in enumerate(results.items()):
        shift = 2 ** (0.04 * (j - (nres - 1) / 2))      # side by side on the log axis
        if label in ret:
            xs = r.lengths
            ivs = [r.accuracy(n, exact=exact) for n in xs]
        else:
            xs, ivs = [x_cloze], [r.accuracy()]
        v = np.asarray([100 * iv.value for iv in ivs])
        lo = v - np.asarray([100 * iv.lo for iv in ivs])
        hi = np.asarray([100 * iv.hi for iv in ivs]) - v
        n = "/".join(dict.fromkeys(str(iv.n) for iv in ivs))    # trials per length, e.g. 100/30
        ax.errorbar([x * shift for x in xs], v, yerr=[lo, hi], fmt=styles[j % len(styles)],
                    capsize=3, ms=4, label=f"{label} (n={n}{'' if label in ret else ', cloze'})")
    if chance:
        for r in {id(r): r for r in results.values()}.values():
            ax.axhline(100 * r.chance, color="grey", ls=":", lw=1)
    ticks = xs_all + ([x_cloze] if clz else [])
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(n) for n in xs_all] + (["cloze"] if clz else []))
    percent_axis(ax, "y")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel(("exact-match" if exact else "multiple-choice") + " accuracy (%)")
    first = next(iter(results.values()))
    ax.set_title(title or f"{first.model}: accuracy with 95% Wilson intervals (dotted: chance)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


TOP_KEY_CLASSES = {"pos0": "position 0", "bos": "⟨bos⟩ (moved)", "text": "first text token", "elsewhere": "elsewhere"}
"""Legend of the classes of a head's top key in :func:`bos_controls_figure`, by the keys of
``BosControls.location`` (the figure reads the classes from the result, not from the analysis)."""


@restylable
def bos_controls_figure(result, title: Optional[str] = None) -> Figure:
    """Controls for ⟨bos⟩ removal (:class:`sinklab.analysis.controls.BosControls`), one row per
    condition (draws of a random control pooled): perplexity with its 95% interval (log scale,
    the baseline's as a dotted line), the sink rate at position 0 and at the (moved) ⟨bos⟩ with
    their intervals, and where each head's top key sits (stacked shares)."""
    groups = list(result.groups())
    labels = [result.label(g) for g in groups]
    n = len(groups)
    y = np.arange(n)[::-1]
    fig, axes = subplots(1, 3, figsize=(15.0, 1.2 + 0.34 * n), layout="constrained",
                         gridspec_kw={"width_ratios": [1.2, 1, 1]})
    ax = axes[0]
    for yi, g in zip(y, groups):
        iv = result.perplexity(g)
        err = [[iv.value - iv.lo], [iv.hi - iv.value]] if iv.defined else None
        ax.errorbar([iv.value], [yi], xerr=err, fmt="o", ms=4, color="C0" if g != result.baseline else "k", capsize=2)
    ax.axvline(result.perplexity(result.baseline).value, color="k", ls=":", lw=1)
    ax.set_xscale("log")
    readable_log(ax, "x")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel(f"perplexity on the same {int(result.n_tokens.sum())} tokens (95% CI)")
    ax.grid(alpha=0.3, axis="x")

    ax = axes[1]
    for off, where, name, color in ((0.15, "pos0", "position 0", "C1"), (-0.15, "bos", "the ⟨bos⟩ (moved)", "C2")):
        first = True
        for yi, g in zip(y, groups):
            iv = result.sink_rate(g, where)
            if iv is None or (where == "bos" and result[result._members(g)[0]].location.bos_pos in (None, 0)):
                continue
            err = [[100 * (iv.value - iv.lo)], [100 * (iv.hi - iv.value)]] if iv.defined else None
            ax.errorbar([100 * iv.value], [yi + off], xerr=err, fmt="s", ms=4, color=color, capsize=2,
                        label=name if first else None)
            first = False
    percent_axis(ax, "x")
    ax.set_yticks(y)
    ax.set_yticklabels([])
    ax.set_xlabel(f"sink rate (% of heads with a_k > {result.meta.get('eps', 0.3):g})")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, axis="x")

    ax = axes[2]
    left = np.zeros(n)
    keys = [k for k in result.location(groups[0]) if k != "top_mass"]  # the classes, in their order
    for c, key in enumerate(keys):
        name = TOP_KEY_CLASSES.get(key, key)
        vals = np.array([100 * result.location(g)[key].value for g in groups])
        ax.barh(y, vals, left=left, color=f"C{c + 3}", label=name, height=0.7)
        left += vals
    ax.set_xlim(0, 100)
    ax.set_yticks(y)
    ax.set_yticklabels([])
    ax.set_xlabel("heads' top key (% of heads)")
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.suptitle(title or f"{result.meta.get('model', '')}: controls for ⟨bos⟩ removal", fontsize=11)
    return fig

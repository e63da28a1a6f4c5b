"""Figures for perturbation propagation (the paper's Fig. 2–3), rank/representational collapse
(§3.1, Prop. 3.1) and approximate no-op heads (§3.2).

Every function returns a :class:`sinklab.viz.figure.Figure`, built without pyplot (the user's backend is
never switched); it shows inline in Jupyter and saves with ``fig.savefig(path, dpi=150)``.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence, Union

import numpy as np

from .figure import Figure, colormap, readable_log, restylable, subplots
from ..inputs import BOS, LABELS, NOBOS

COLORS = {BOS: "#1f77b4", NOBOS: "#d62728"}


def _bos_label(setting: str, meta: dict) -> str:
    """The setting's label, with ⟨bos⟩'s text (its id only for results saved before the text was)."""
    if setting == BOS and meta.get("bos_token") is not None:
        return f"{LABELS[setting]} ({meta['bos_token']!r})"
    if setting == BOS and meta.get("bos_token_id") is not None:
        return f"{LABELS[setting]} (id {meta['bos_token_id']})"
    return LABELS[setting]


def _swap_label(meta: dict) -> str:
    """What a token perturbation changed: the tokens' texts (ids only for results saved before)."""
    if meta.get("token_text") is not None and meta.get("old_token_text") is not None:
        return f"{meta['old_token_text']!r} at position {meta.get('position')} → {meta['token_text']!r}"
    return f"token at position {meta.get('position')} → id {meta.get('token')}"


# ---------------------------------------------------------------------------------- perturbation
@restylable
def perturbation_heatmaps(result: Any, relative: bool = True, max_tick_labels: int = 48,
                          title: str = "") -> Figure:
    """Layers × positions heatmaps of the perturbation, with and without BOS side by side (Fig. 2).

    Colour: log10 of the relative (default) or absolute change ||v_j^(l) - ṽ_j^(l)||, on one
    scale shared by both panels; exactly unchanged cells (positions before the perturbation)
    are grey. The perturbed position(s) are marked with a dashed line. x ticks are the text
    tokens when there are at most ``max_tick_labels``.
    """
    from matplotlib.colors import LogNorm

    settings = list(result.settings)
    data = {s: np.asarray(result.change(s, relative), dtype=np.float64) for s in settings}
    pos = np.concatenate([d[d > 0] for d in data.values()])
    vmax = float(pos.max()) if pos.size else 1.0
    vmin = max(float(pos.min()) if pos.size else vmax * 1e-4, vmax * 1e-4)
    norm = LogNorm(vmin=vmin, vmax=vmax)
    T = len(result.ids)
    L1 = data[settings[0]].shape[0]
    width = min(22.0, max(5.0, 0.28 * T + 2.0)) * len(settings) / 2 + 1.5
    fig, axes = subplots(1, len(settings), figsize=(max(6.0, width), max(4.0, 0.16 * L1 + 2.5)),
                             sharey=True, squeeze=False, layout="constrained")
    cmap = colormap("magma").with_extremes(bad="#d9d9d9")
    im = None
    for ax, s in zip(axes[0], settings):
        d = np.ma.masked_less_equal(data[s], 0.0)
        im = ax.imshow(d, aspect="auto", origin="lower", cmap=cmap, norm=norm, interpolation="nearest")
        for j in np.asarray(result.changed):
            ax.axvline(j, color="cyan", lw=0.8, ls="--", alpha=0.8)
        ax.set_title(_bos_label(s, result.meta))
        ax.set_xlabel("text position" + ("" if T > max_tick_labels else " (token)"))
        if T <= max_tick_labels and result.tokens:
            ax.set_xticks(range(T))
            ax.set_xticklabels([t.replace("\n", "\\n") for t in result.tokens], rotation=90, fontsize=7)
    axes[0][0].set_ylabel("layer l (0 = embeddings)")
    what = "relative change ‖v−ṽ‖/‖v‖" if relative else "change ‖v−ṽ‖"
    fig.colorbar(im, ax=axes[0].tolist(), label=what, shrink=0.9)
    m = result.meta
    sub = f"{m.get('old')!r} → {m.get('new')!r}" if m.get("mode") == "word" else _swap_label(m)
    fig.suptitle(title or f"{m.get('model') or ''}: perturbation {sub}", fontsize=11)
    return fig


@restylable
def perturbation_lines(results: Union[Any, Sequence[Any]], relative: bool = True, title: str = "") -> Figure:
    """Three panels vs layer (Fig. 3): mean change over reachable positions, the spread ratio
    without/with BOS, and mean attention entropy — for one result or the mean of several (thin
    lines: individual prompts)."""
    rs = list(results) if isinstance(results, (list, tuple)) else [results]
    settings = [s for s in (BOS, NOBOS) if all(s in r.settings for r in rs)]
    fig, axes = subplots(1, 3, figsize=(14.0, 4.0))
    ax = axes[0]
    for s in settings:
        curves = np.array([r.mean_change(s, relative) for r in rs])
        x = np.arange(curves.shape[1])
        if len(rs) > 1:
            for c in curves:
                ax.plot(x, c, color=COLORS[s], lw=0.6, alpha=0.35)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_curve = np.nanmean(curves, axis=0)
        ax.plot(x, mean_curve, color=COLORS[s], lw=2, label=_bos_label(s, rs[0].meta))
    ax.set_yscale("log")
    readable_log(ax, "y")
    ax.set_xlabel("layer l")
    ax.set_ylabel("mean " + ("relative " if relative else "") + "change at later positions")
    ax.set_title("perturbation size")
    ax.legend(fontsize=8)
    ax = axes[1]
    if len(settings) == 2:
        ratios = np.array([r.spread_ratio(relative) for r in rs])
        x = np.arange(ratios.shape[1])
        if len(rs) > 1:
            for c in ratios:
                ax.plot(x, c, color="k", lw=0.6, alpha=0.3)
        with warnings.catch_warnings():  # layer 0 is NaN in every prompt
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_ratio = np.nanmean(ratios, axis=0)
        ax.plot(x, mean_ratio, color="k", lw=2, label="mean" if len(rs) > 1 else None)
        ax.axhline(1.0, color="gray", ls=":")
        if len(rs) > 1:
            ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "needs bos='both'", ha="center", transform=ax.transAxes)
    ax.set_xlabel("layer l")
    ax.set_ylabel("spread without BOS / with BOS")
    ax.set_title("spread ratio (> 1: spreads more without BOS)")
    ax = axes[2]
    for s in settings:
        ent = np.array([r.mean_entropy(s) for r in rs])
        ax.plot(np.arange(ent.shape[1]), ent.mean(axis=0), color=COLORS[s], lw=2, marker=".",
                label=_bos_label(s, rs[0].meta))
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention row entropy (nats)")
    ax.set_title("attention smoothness")
    ax.legend(fontsize=8)
    n = f" ({len(rs)} prompts)" if len(rs) > 1 else ""
    fig.suptitle(title or f"{rs[0].meta.get('model') or ''}: perturbation propagation{n}", fontsize=11)
    fig.tight_layout()
    return fig


@restylable
def perturbation_study_figure(study: Any, relative: bool = True, title: str = "") -> Figure:
    """Fig. 2–3 over many swaps (a :class:`sinklab.analysis.perturbation.PerturbationStudy`): the spread
    ratio without/with BOS per layer (median, 10–90% band over swaps, mean), the fraction of
    swaps that spread more without BOS, and the mean attention entropy on all keys, on text keys
    only (the same keys in both settings) and without BOS."""
    rs = study.ratio_stats(relative)
    x = np.arange(len(rs["mean"]))
    fig, axes = subplots(1, 3, figsize=(14.5, 4.0))
    ax = axes[0]
    ax.fill_between(x, rs["q10"], rs["q90"], color="k", alpha=0.15, label="10–90% of swaps")
    ax.plot(x, rs["q50"], color="k", lw=2, label="median")
    ax.plot(x, rs["mean"], color="k", lw=1, ls="--", label="mean")
    ax.axhline(1.0, color="gray", ls=":")
    ax.set_yscale("log")
    readable_log(ax, "y")
    ax.set_xlabel("layer l")
    ax.set_ylabel("spread without BOS / with BOS")
    ax.set_title("spread ratio (> 1: spreads more without BOS)")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(x, rs["frac_gt1"], color="k", marker=".")
    ax.axhline(0.5, color="gray", ls=":")
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer l")
    ax.set_ylabel("fraction of swaps with ratio > 1")
    ax.set_title(f"{study.n_swaps} swaps on {study.n_passages} passages")
    ax = axes[2]
    ent = study.mean_entropies()
    styles = {"bos_all_keys": (COLORS[BOS], ":", "with BOS, all keys"),
              "bos_text_keys": (COLORS[BOS], "-", "with BOS, text keys only"),
              NOBOS: (COLORS[NOBOS], "-", "without BOS")}
    for k, (color, ls, label) in styles.items():
        ax.plot(np.arange(len(ent[k])), ent[k], color=color, ls=ls, lw=2, label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention row entropy (nats)")
    ax.set_title("attention smoothness on the same keys")
    ax.legend(fontsize=8)
    fig.suptitle(title or f"{study.meta.get('model') or ''}: perturbation propagation over many swaps", fontsize=11)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------- collapse
@restylable
def collapse_figure(result: Any, title: str = "") -> Figure:
    """Three panels: rank-collapse residual vs layer (one line per T; solid with BOS, dashed
    without), the residual at the last layer vs T, and the representational-collapse distance
    ||v_T − v'_{T+1}|| / ||v_T|| at the last layer vs T."""
    Ts = np.asarray(result.lengths)
    fig, axes = subplots(1, 3, figsize=(14.5, 4.2))
    cmap = colormap("viridis")
    ls = {BOS: "-", NOBOS: "--"}
    ax = axes[0]
    for i, T in enumerate(Ts):
        col = cmap(i / max(1, len(Ts) - 1))
        for s in result.settings:
            ax.plot(result.rank[s][i], color=col, ls=ls[s], lw=1.3,
                    label=f"T={T}" if s == result.settings[0] else None)
    ax.set_xlabel("layer l")
    ax.set_ylabel("‖V − 1μᵀ‖_F / ‖V‖_F")
    ax.set_title("rank-collapse residual (— with BOS, -- without)" if len(result.settings) == 2
                 else "rank-collapse residual")
    ax.legend(fontsize=7, ncol=2)
    L = result.rank[result.settings[0]].shape[1] - 1
    for ax, key, ylab, ttl in ((axes[1], "rank", "rank-collapse residual", f"last layer (l={L}) vs T"),
                               (axes[2], "repr", "‖v_T − v'_T+1‖ / ‖v_T‖",
                                "representational collapse (last token repeated)")):
        for s in result.settings:
            y = result.rank[s][:, L] if key == "rank" else result.repr_rel[s][:, L]
            ax.plot(Ts, y, color=COLORS[s], marker="o", lw=2, label=_bos_label(s, result.meta) + f", l={L}")
            if key == "repr":
                mid = L // 2
                ax.plot(Ts, result.repr_rel[s][:, mid], color=COLORS[s], marker=".", lw=1, ls=":",
                        label=_bos_label(s, result.meta) + f", l={mid}")
        ax.set_xscale("log", base=2)
        if key == "repr":
            ax.set_yscale("log")
            readable_log(ax, "y")
        ax.set_xlabel("tokens T")
        ax.set_ylabel(ylab)
        ax.set_title(ttl)
        ax.legend(fontsize=7)
    fig.suptitle(title or f"{result.meta.get('model') or ''}: over-mixing vs depth and length", fontsize=11)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------- no-op
@restylable
def noop_figure(result: Any, eps: float = 0.5, title: str = "") -> Figure:
    """Are sink heads' outputs small? Three panels, colour = layer: (a) per query head, sink
    mass vs head-output norm relative to the residual stream; (b) per KV head (query heads that
    share one share its values), the mean sink mass of its query heads vs the position-0 value
    norm / median value norm; (c) per query head, sink mass vs the correlation across queries
    between attention to position 0 and head-output norm."""
    mass = result.sink_mass()
    L, H = mass.shape
    kv_ratio = result.kv_first_value_ratio()                       # (L, G)
    kv_mass = mass.reshape(L, kv_ratio.shape[1], -1).mean(axis=-1)  # (L, G)
    panels = [(mass, result.rel_out_norm(), "mean ‖head output‖ / ‖residual‖", "log", "head-output size (query heads)",
               None),
              (kv_mass, kv_ratio, "‖value(pos 0)‖ / median ‖value(others)‖", "log", "value norm of position 0 "
               "(KV heads)", 1.0),
              (mass, result.correlation(), "corr over queries: A→0 vs ‖output‖", "linear",
               "within-head relation (query heads)", 0.0)]
    fig, axes = subplots(1, 3, figsize=(15.5, 4.6), layout="constrained")
    sc = None
    for ax, (x, y, ylab, scale, ttl, ref) in zip(axes, panels):
        layer = np.repeat(np.arange(L), x.shape[1])
        sc = ax.scatter(x.ravel(), y.ravel(), c=layer, cmap=colormap("viridis"), s=14, alpha=0.85, vmin=0, vmax=L - 1)
        ax.axvline(eps, color="gray", ls=":", lw=1)
        ax.set_yscale(scale)
        if ref is not None:
            ax.axhline(ref, color="gray", ls=":", lw=1)
        ax.set_xlabel("sink mass (mean attention to position 0)")
        ax.set_ylabel(ylab)
        ax.set_title(ttl)
    fig.colorbar(sc, ax=axes.tolist(), label="layer", shrink=0.9)
    s = result.summary(eps)
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    fig.suptitle(title or (f"{result.meta.get('model') or ''}: sinks as no-ops — {s['n_sink_heads']} heads "
                           f"with sink mass > {eps:g}; median ‖o‖/‖v‖: sink heads "
                           f"{fmt(s['median_rel_out_norm_sink_heads'])}, others "
                           f"{fmt(s['median_rel_out_norm_other_heads'])}"), fontsize=10)
    return fig


@restylable
def conditional_heads_figure(result: Any, title: str = "") -> Figure:
    """Left: every head's attention to the trigger (when present) vs attention to position 0
    (when absent), the top heads labelled; right: score heatmap layers × heads."""
    a, b, s = result.to_trigger_with, result.to_first_without, result.score
    L, H = s.shape
    fig, axes = subplots(1, 2, figsize=(12.0, 4.8), gridspec_kw={"width_ratios": [1.2, 1]})
    ax = axes[0]
    sc = ax.scatter(b.ravel(), a.ravel(), c=np.repeat(np.arange(L), H), cmap=colormap("viridis"), s=14)
    for r in result.top[:5]:
        ax.annotate(f"L{r['layer']}H{r['head']}", (r["to_first_without"], r["to_trigger_with"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("attention to position 0 when the trigger is absent")
    ax.set_ylabel(f"attention to trigger {result.trigger!r} when present")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, max(0.05, float(a.max()) * 1.1))
    fig.colorbar(sc, ax=ax, label="layer")
    ax = axes[1]
    im = ax.imshow(s, aspect="auto", origin="lower", cmap=colormap("viridis"))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(H))
    ax.set_title("score = A→trigger|with × A→0|without")
    fig.colorbar(im, ax=ax)
    fig.suptitle(title or f"{result.meta.get('model') or ''}: conditional heads for {result.trigger!r}", fontsize=11)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------- mixing measure
def _errbar(ax: Any, x: Any, ivs: Sequence[Any], **kw: Any) -> None:
    """Points at each interval's value with its 95% interval as error bars (none where undefined)."""
    v = np.array([iv.value for iv in ivs], dtype=np.float64)
    lo = np.array([iv.lo if iv.defined else iv.value for iv in ivs], dtype=np.float64)
    hi = np.array([iv.hi if iv.defined else iv.value for iv in ivs], dtype=np.float64)
    ax.errorbar(np.asarray(x), v, yerr=np.vstack([v - lo, hi - v]), capsize=2, **kw)


@restylable
def mixing_measure_figure(result: Any, title: str = "") -> Figure:
    """The mixing measure (:class:`sinklab.analysis.mixing.MixingResult`), intervals as error bars
    (95% bootstrap over passage units): (a) mean log(M_nobos / M_bos) vs source layer, one line per
    T; (b) its layer average vs T (log axis) with the slope vs log T; (c) the share-based version,
    share_nobos − share_bos vs layer, for comparison."""
    Ts = np.asarray(result.lengths)
    layers = np.asarray(result.layers)
    grid, sgrid = result.effect_grid(), result.share_difference_grid()
    cmap = colormap("viridis")
    fig, axes = subplots(1, 3, figsize=(15.0, 4.3))
    for i, T in enumerate(Ts):
        col = cmap(i / max(1, len(Ts) - 1))
        dx = 0.08 * (i - (len(Ts) - 1) / 2)
        _errbar(axes[0], layers + dx, grid[i], color=col, marker=".", lw=1.2, label=f"T={T}")
        _errbar(axes[2], layers + dx, sgrid[i], color=col, marker=".", lw=1.2, label=f"T={T}")
    for ax in (axes[0], axes[2]):
        ax.axhline(0.0, color="gray", ls=":")
        ax.set_xlabel("source layer l (resid[l])")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("log(mass without BOS / mass with BOS)")
    axes[0].set_title("other text tokens' mass ratio (> 0: more mixing without BOS)", fontsize=9)
    axes[2].set_ylabel("share without BOS − share with BOS")
    axes[2].set_title("share-based version (bounded, for comparison)", fontsize=9)
    ax = axes[1]
    _errbar(ax, Ts, result.effect_by_length(), color="k", marker="o", lw=2, label="mean over layers")
    ax.axhline(0.0, color="gray", ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("text tokens T")
    ax.set_ylabel("layer-averaged log ratio")
    sl_iv = result.slope() if len(Ts) > 1 else None
    ax.set_title("vs context" + (f": slope vs log T {sl_iv.fmt('.3f')}" if sl_iv is not None else ""), fontsize=9)
    ax.legend(fontsize=7)
    m = result.meta
    fig.suptitle(title or f"{m.get('model') or ''}: mixing of the other text tokens into the last token, "
                          f"{result.n_units} passage units", fontsize=11)
    fig.tight_layout()
    return fig


@restylable
def collapse_trend_figure(trend: Any, measure: str = "rank", setting: Any = None, title: str = "") -> Figure:
    """A :class:`sinklab.analysis.collapse.CollapseTrend`, intervals as error bars (95% bootstrap
    over passage units): (a) the measure vs layer, one line per T; (b) at the last layer and
    averaged over the depth layers vs T (log axis), with the slopes vs log T."""
    Ts = np.asarray(trend.lengths)
    grid = trend.mean_ci(measure, setting)
    L = trend.n_layers
    cmap = colormap("viridis")
    fig, axes = subplots(1, 2, figsize=(11.5, 4.2))
    for i, T in enumerate(Ts):
        _errbar(axes[0], np.arange(L + 1), grid[i], color=cmap(i / max(1, len(Ts) - 1)), marker=".", lw=1.2,
                label=f"T={T}")
    ylab = {"rank": "‖V − 1μᵀ‖_F / ‖V‖_F", "repr_rel": "‖v_T − v'_T+1‖ / ‖v_T‖",
            "repr_dist": "‖v_T − v'_T+1‖"}[measure]
    axes[0].set_xlabel("layer l")
    axes[0].set_ylabel(ylab)
    axes[0].set_title(f"depth slope {trend.depth_ci(measure, setting).fmt('.4f')}", fontsize=9)
    axes[0].legend(fontsize=7, ncol=2)
    ax = axes[1]
    _errbar(ax, Ts, [r[L] for r in grid], color="k", marker="o", lw=2, label=f"l = {L}")
    _errbar(ax, Ts, trend.depth_mean_ci(measure, setting), color="gray", marker=".", lw=1,
            label="mean over layers")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("text tokens T")
    ax.set_ylabel(ylab)
    if len(Ts) > 1:
        ax.set_title(f"slope vs log T: last {trend.context_ci(measure, -1, setting).fmt('.4f')}, mean "
                     f"{trend.context_ci(measure, 'mean', setting).fmt('.4f')}", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(title or f"{trend.meta.get('model') or ''}: collapse over depth and context, "
                          f"{trend.n_units} passage units", fontsize=11)
    fig.tight_layout()
    return fig

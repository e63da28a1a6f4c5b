"""Figures of the over-squashing map (the measured side of the paper's Thm. 3.2): how strongly
the last token's final representation depends on each source position at each layer, with and
without ⟨bos⟩, and how much it mixes in from the other tokens as context and depth grow.

Every function returns a pyplot-free :class:`sinklab.viz.figure.Figure`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .figure import Figure, LINESTYLES, colormap, distinct_label, readable_log, restylable, subplots

COLORS = {"bos": "#1f77b4", "nobos": "#d62728", "masked": "#2ca02c"}


@restylable
def sensitivity_maps(study: Any, title: str = "") -> Figure:
    """Top row: log10 ||d v_last^(L) / d v_j^(l)||_F over layer l (rows) and source position j
    (columns), one panel per condition, one colour scale. Bottom: the same at l = 0 (the input
    embeddings, the whole depth) and at the middle layer, over j, one line per condition.

    Source positions are aligned on the text: in the runs without ⟨bos⟩ text token k sits at
    x = k + 1, so a column is the same token in every panel and ⟨bos⟩ is at x = 0.
    """
    from matplotlib.colors import LogNorm

    conds = list(study.conditions)
    fro = {c: study.maps[c].fro for c in conds}
    shift = {c: 1 - study.first_text(c) for c in conds}
    pos = np.concatenate([f[f > 0] for f in fro.values()])
    vmax = float(pos.max()) if pos.size else 1.0
    norm = LogNorm(vmin=max(float(pos.min()) if pos.size else vmax * 1e-6, vmax * 1e-6), vmax=vmax)
    fig, axes = subplots(2, len(conds), figsize=(4.6 * len(conds), 8.0), squeeze=False, layout="constrained")
    cmap = colormap("viridis").with_extremes(bad="#d9d9d9")
    im = None
    for ax, c in zip(axes[0], conds):
        f = np.ma.masked_less_equal(fro[c], 0.0)
        T = f.shape[1]
        x0 = shift[c]
        im = ax.imshow(f, aspect="auto", origin="lower", cmap=cmap, norm=norm, interpolation="nearest",
                       extent=(x0 - 0.5, x0 + T - 0.5, -0.5, f.shape[0] - 0.5))
        ax.set_title(study.label(c), fontsize=9)
        ax.set_xlabel("source position j (text aligned; BOS = 0)")
        ax.set_ylabel("layer l of resid[l]")
    if im is not None:
        fig.colorbar(im, ax=axes[0].tolist(), label="||∂v_last^(L) / ∂v_j^(l)||_F")
    L = study.maps[conds[0]].fro.shape[0] - 1
    for ax, l, name in ((axes[1][0], 0, "l = 0 (input embeddings)"), (axes[1][1 % len(conds)], L // 2,
                                                                     f"l = {L // 2} (middle)")):
        drawn: dict = {}
        for k, c in enumerate(conds):
            f = fro[c][l]
            x = np.arange(len(f)) + shift[c]
            keep = f > 0
            ax.semilogy(x[keep], f[keep], LINESTYLES[k % len(LINESTYLES)], color=COLORS.get(c), lw=1.2,
                        label=distinct_label(study.label(c), np.where(keep, f, np.nan), drawn))
        readable_log(ax, "y")
        ax.set_title(f"sensitivity of the last token, {name}", fontsize=9)
        ax.set_xlabel("source position j")
        ax.set_ylabel("Frobenius norm")
        ax.legend(fontsize=7)
    if len(conds) > 2:
        ax = axes[1][2]
        drawn = {}
        for k, c in enumerate(conds):
            ax.plot(np.arange(L + 1), study.share(c), LINESTYLES[k % len(LINESTYLES)] + "o", ms=2.5,
                    color=COLORS.get(c), label=distinct_label(study.label(c), np.asarray(study.share(c)), drawn))
        ax.set_title("mixing share: mass on the other text tokens", fontsize=9)
        ax.set_xlabel("layer l of resid[l] (depth of the path = L - l)")
        ax.set_ylabel("share of ||J||_F^2")
        ax.legend(fontsize=7)
    fig.suptitle(title or f"{study.meta.get('model', '')}: over-squashing map of the last token, T = {study.T}")
    return fig


@restylable
def mixing_vs_length(study: Any, title: str = "") -> Figure:
    """Mixing share (module docstring of sinklab.analysis.squashing_study) against the depth of
    the path L - l, one line per context length, one panel per condition (random-probe
    estimates); and the share over the whole depth (l = 0) against the context length."""
    conds = [c for c in study.conditions if study.length_maps.get(c)]
    fig, axes = subplots(1, len(conds) + 1, figsize=(4.4 * (len(conds) + 1), 4.0), squeeze=False,
                         layout="constrained")
    cmap = colormap("plasma")
    lengths = study.lengths
    for ax, c in zip(axes[0], conds):
        for k, n in enumerate(lengths):
            if n not in study.length_maps[c]:
                continue
            s = study.share(c, n)
            L = len(s) - 1
            ax.plot(L - np.arange(L + 1), s, "-", color=cmap(k / max(len(lengths) - 1, 1) * 0.85),
                    label=f"T = {n}")
        ax.set_title(study.label(c), fontsize=9)
        ax.set_xlabel("depth of the path L - l (layers)")
        ax.set_ylabel("mixing share")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for c in conds:
        xs = [n for n in lengths if n in study.length_maps[c]]
        ax.semilogx(xs, [study.share(c, n)[0] for n in xs], "-o", color=COLORS.get(c), label=study.label(c))
    ax.set_title("whole depth (l = 0) vs context length", fontsize=9)
    ax.set_xlabel("context length T")
    ax.set_ylabel("mixing share")
    ax.legend(fontsize=7)
    fig.suptitle(title or f"{study.meta.get('model', '')}: mixing with context length and depth "
                          f"({study.n_probes}-probe estimates)")
    return fig

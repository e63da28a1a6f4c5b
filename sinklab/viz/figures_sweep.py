"""Figures of a sweep's table: each analysis's headline metric across the grid's axes.

Per analysis, one figure: when a numeric axis (T, then eps) varies, the metric against it with
one line per combination of the other varying axes; otherwise grouped bars, one group per
combination of the varying axes other than ``bos`` and one bar per ``bos`` value.
"""
from __future__ import annotations

import os
from typing import Any, List

from .figure import restylable, subplots

METRICS = {"sink_study": ("sink_rate", "sink rate (fraction of (prompt, layer, head) with a_0 > eps)"),
           "perturbation": ("mean_rel_change", "mean relative change after a one-token swap"),
           "sensitivity": ("first_over_others", "||d h_L[last]/d h_0[0]|| / mean over other sources"),
           "quality": ("mean_nll", "held-out NLL (nats/token)"),
           "train": ("sink_rate", "sink rate of the trained model")}

AXES = ("model", "prompts", "intervention", "train", "T", "eps", "bos")


def _varying(df: Any) -> List[str]:
    return [a for a in AXES if a in df and df[a].nunique(dropna=True) > 1]


def _label(row: Any, axes: List[str]) -> str:
    return ", ".join(f"{a}={row[a]}" for a in axes) or "all"


def _lines(ax: Any, df: Any, metric: str, x_axis: str, others: List[str]) -> None:
    for label, g in df.groupby(df.apply(lambda r: _label(r, others), axis=1), sort=False):
        g = g.sort_values(x_axis)
        ax.plot(g[x_axis], g[metric], marker="o", label=label)
    ax.set_xlabel(x_axis)
    if x_axis == "T":
        ax.set_xscale("log", base=2)


def _bars(ax: Any, df: Any, metric: str, var: List[str]) -> None:
    groups = [a for a in var if a != "bos"]
    labels = list(dict.fromkeys(df.apply(lambda r: _label(r, groups), axis=1)))
    hues = list(dict.fromkeys(df["bos"])) if "bos" in var else [None]
    width = 0.8 / len(hues)
    for j, h in enumerate(hues):
        sub = df if h is None else df[df["bos"] == h]
        keys = sub.apply(lambda r: _label(r, groups), axis=1).tolist()
        xs = [labels.index(k) + (j - (len(hues) - 1) / 2) * width for k in keys]
        ax.bar(xs, sub[metric], width=width, label=None if h is None else ("with ⟨bos⟩" if h else "without ⟨bos⟩"))
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)


@restylable
def analysis_figure(df: Any, analysis: str) -> Any:
    """The figure of one analysis's rows (``df`` filtered to it): one panel per eps when eps
    varies beside T."""
    metric, ylabel = METRICS[analysis]
    var = _varying(df)
    x_axis = next((a for a in ("T", "eps") if a in var), None)
    panels = sorted(df["eps"].unique()) if x_axis == "T" and "eps" in var else [None]
    fig, axs = subplots(1, len(panels), figsize=(4.5 + 3.5 * len(panels), 4.5), layout="constrained",
                        squeeze=False, sharey=True)
    for ax, e in zip(axs[0], panels):
        sub = df if e is None else df[df["eps"] == e]
        if x_axis is not None:
            _lines(ax, sub, metric, x_axis, [a for a in var if a not in (x_axis, "eps" if e is not None else "")])
        else:
            _bars(ax, sub, metric, var)
        ax.set_title(f"sweep: {analysis}" + ("" if e is None else f", eps = {e:g}"), fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axs[0][0].set_ylabel(ylabel, fontsize=9)
    return fig


def sweep_figures(df: Any, folder: str) -> List[str]:
    """Writes ``folder/ANALYSIS.png`` for every analysis in the table; returns the paths."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for analysis in dict.fromkeys(df["analysis"]):
        sub = df[df["analysis"] == analysis].dropna(axis=1, how="all")
        if analysis not in METRICS or METRICS[analysis][0] not in sub:   # user analyses: no known metric
            continue
        path = os.path.join(folder, f"{analysis}.png")
        analysis_figure(sub, analysis).savefig(path, dpi=120)
        paths.append(path)
    return paths

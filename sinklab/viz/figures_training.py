"""Figures of the pre-training experiments in miniature (Fig. 5, Table 2): shared by the
report's training section and ``sinklab experiment``. sinklab Figures, no pyplot state; they
draw from the summaries alone (plain dicts) and import no training code."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from .figure import restylable, subplots
# re-exported: the report's training section reads them from here
from .reference import SINK_TOKENS, sink_T, uniform_first_importance  # noqa: F401


def _series(run: Dict[str, Any], key: str, scale: float = 1.0) -> tuple:
    """(mean, sd) arrays of one per-evaluation series of a Fig. 5 run (sd NaN without seeds)."""
    mean = scale * np.array([np.nan if v is None else v for v in run[key]], float)
    sds = (run.get("sd") or {}).get(key)
    sd = (scale * np.array([np.nan if v is None else v for v in sds], float) if sds is not None
          else np.full_like(mean, np.nan))
    return mean, sd[:mean.size]


def _seeds(summary: Dict[str, Any]) -> str:
    """"one seed", "3 seeds" or, for a partial summary whose rows have different numbers of
    seeds, "2-3 seeds": the counts of the rows (Table 2's rows, Fig. 5's runs, the depths, the
    variants), else of the summary's seed list."""
    rows = [r for k in ("rows", "runs", "depths", "variants") for r in summary.get(k) or [] if r.get("seeds")]
    counts = sorted({len(r["seeds"]) for r in rows}) or [len(summary.get("seeds") or [0])]
    lo, hi = counts[0], counts[-1]
    return "one seed" if hi == 1 else f"{lo}-{hi} seeds" if lo != hi else f"{hi} seeds"


@restylable
def fig5_miniature_figure(fig5: Dict[str, Any]) -> Any:
    """Fig. 5 in miniature against training tokens, one line per context: sink rate at eps 0.3
    and 0.8, mean first-token importance a_0 (dotted: uniform attention's a_0 over the same T)
    and validation loss; with several seeds the mean over seeds, and a band of ± one sd.
    A sinklab Figure (no pyplot)."""
    fig, axes = subplots(1, 4, figsize=(16, 3.8))
    top = 0.0
    for run in fig5["runs"]:
        tok = np.asarray(run["tokens"], float) / 1e6
        panels = [_series(run, "sink_0.3", 100.0), _series(run, "sink_0.8", 100.0), _series(run, "importance"),
                  _series(run, "val_loss")]
        s3, sd3 = panels[0]
        top = max(top, float(np.nanmax(np.concatenate([s3 + np.nan_to_num(sd3), [0.0]]))))
        col = None
        for ax, (mean, sd) in zip(axes, panels):
            line = ax.plot(tok[:mean.size], mean, "-o", ms=3, color=col,
                           label=f"C = {run['context']}" if ax is axes[0] else None)[0]
            col = line.get_color()
            if np.isfinite(sd).any():
                ax.fill_between(tok[:mean.size], mean - sd, mean + sd, color=col, alpha=0.2, lw=0)
        axes[2].axhline(uniform_first_importance(sink_T(run["context"])), color=col, ls=":", lw=1)
    for ax in axes[:2]:
        ax.set_ylim(0, max(5.0, 1.1 * top))
        for artist in ax.lines:
            artist.set_clip_on(False)
    titles = ("sink rate, eps = 0.3 (%)", "sink rate, eps = 0.8 (%)",
              "mean first-token importance a0\n(dotted: uniform attention)", "validation loss (nats, text only)")
    for ax, title in zip(axes, titles):
        ax.set_xlabel("training tokens (millions)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    prof = fig5.get("profile", {}).get("name", "?")
    n = _seeds(fig5)
    seeds = f"mean ± sd over {n}" if n != "one seed" else n
    fig.suptitle(f"Fig. 5 in miniature ({prof} profile, {seeds}): the first-token sink while training at each "
                 f"context length (paper: ~120M models, 5B tokens each)", fontsize=10)
    fig.tight_layout()
    return fig


def _row_label(r: Dict[str, Any]) -> str:
    return (f"{r['masking'].replace('_', '-')}\n{'fixed <bos>' if r['fixed_bos'] else 'no fixed <bos>'}\n"
            f"{'<bos>+text' if r['inference'] == 'bos' else 'text only'}")


@restylable
def table2_miniature_figure(table2: Dict[str, Any]) -> Any:
    """Table 2 in miniature beside the paper's: sink rate (eps 0.3) and validation loss per row,
    and the loss change when ⟨bos⟩ is removed at inference from each model evaluated both ways
    (the comparison that does not depend on the tokenizer); with several seeds the mean over
    seeds with ± one sd error bars (the change: the sd of the per-seed paired changes).
    A sinklab Figure (no pyplot)."""
    rows = table2["rows"]
    x = np.arange(len(rows))
    n = _seeds(table2)

    def sd(r: Dict[str, Any], key: str) -> float:
        v = (r.get("sd") or {}).get(key)
        return np.nan if v is None else float(v)

    fig, axes = subplots(1, 3, figsize=(17, 4.4), gridspec_kw={"width_ratios": [3, 3, 1.6]})
    prof = table2.get("profile", {}).get("name", "?")
    seeds = f", mean ± sd over {n}" if n != "one seed" else ""
    pairs = ((axes[0], [r["sink_0.3"] for r in rows], [sd(r, "sink_0.3") for r in rows],
              [r["paper_sink"] for r in rows], "sink rate (%)"),
             (axes[1], [r["val_loss"] for r in rows], [sd(r, "val_loss") for r in rows],
              [r["paper_loss"] for r in rows], "validation loss (nats)"))
    for ax, ours, sds, paper, label in pairs:
        err = None if not np.isfinite(sds).any() else np.nan_to_num(sds)
        ax.bar(x - 0.2, ours, 0.4, yerr=err, capsize=3,
               label=f"here ({prof} profile" + (", eps = 0.3" if "sink" in label else "") + seeds + ")")
        ax.bar(x + 0.2, paper, 0.4, label="paper (~120M, 30B tokens)", alpha=0.7)
        ax.set_xticks(x)
        ax.set_xticklabels([_row_label(r) for r in rows], fontsize=6.5)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylim(0, 100)
    by = {(r["masking"], r["fixed_bos"], r["inference"]): r for r in rows}
    both = [(m, b) for m, b in dict.fromkeys((r["masking"], r["fixed_bos"]) for r in rows)
            if (m, b, "bos") in by and (m, b, "text") in by]
    models = {(m["masking"], m["fixed_bos"]): m for m in table2.get("models", [])}

    def change(m: str, b: bool) -> tuple:
        """Mean and sd over seeds of the per-seed paired change (text only - <bos>+text)."""
        s = models.get((m, b), {}).get("bos_removed", {}).get("val_loss")
        if s is not None:
            return s["mean"], (np.nan if s.get("sd") is None else s["sd"])
        return by[(m, b, "text")]["val_loss"] - by[(m, b, "bos")]["val_loss"], np.nan

    d_ours = [change(m, b)[0] for m, b in both]
    d_err = np.array([change(m, b)[1] for m, b in both], float)
    d_paper = [by[(m, b, "text")]["paper_loss"] - by[(m, b, "bos")]["paper_loss"] for m, b in both]
    xb = np.arange(len(both))
    axes[2].bar(xb - 0.2, d_ours, 0.4, yerr=None if not np.isfinite(d_err).any() else np.nan_to_num(d_err),
                capsize=3, label="here" + (f" (paired per seed, ± sd over {n})" if n != "one seed" else ""))
    axes[2].bar(xb + 0.2, d_paper, 0.4, label="paper", alpha=0.7)
    axes[2].axhline(0, color="k", lw=0.6)
    axes[2].set_xticks(xb)
    axes[2].set_xticklabels([f"{m.replace('_', '-')}\n{'fixed <bos>' if b else 'no fixed <bos>'}" for m, b in both],
                            fontsize=6.5)
    axes[2].set_ylabel("loss text only - loss <bos>+text (nats)")
    axes[2].set_title("<bos> removed at inference", fontsize=9)
    axes[2].grid(axis="y", alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.suptitle("Table 2 in miniature: masking x fixed <bos> in training x inference with or without <bos> "
                 "(absolute losses depend on the tokenizer; their differences compare)", fontsize=10)
    fig.tight_layout()
    return fig


@restylable
def depth_figure(depth: Dict[str, Any]) -> Any:
    """Depth at matched parameters: the final sink rate (eps 0.3, with ⟨bos⟩) and the cost of
    removing ⟨bos⟩ (text-only minus ⟨bos⟩+text validation loss, nats) against the number of
    layers; each seed a dot, the mean over seeds a line. A sinklab Figure (no pyplot)."""
    rows = depth["depths"]
    fig, axes = subplots(1, 2, figsize=(9, 3.6))
    L = np.array([r["n_layers"] for r in rows], float)
    for ax, key, scale, label in ((axes[0], "sink_0.3", 100.0, "sink rate, eps = 0.3, with <bos> (%)"),
                                  (axes[1], "bos_gap", 1.0, "removing <bos>: Δ val loss (nats)")):
        per = [[np.nan if v is None else scale * v for v in r["final_per_seed"][key]] for r in rows]
        for x, ys in zip(L, per):
            ax.plot(np.full(len(ys), x), ys, "o", ms=4, alpha=0.5, color="C0")
        ax.plot(L, [np.nanmean(ys) if np.isfinite(ys).any() else np.nan for ys in per], "-", color="C0",
                label="mean over seeds")
        ax.set_xticks(L)
        ax.set_xticklabels([f"{r['n_layers']}\n(d {r['d_model']}, {r['n_heads']} h)" for r in rows], fontsize=7)
        ax.set_xlabel("layers (width at matched block parameters)")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(bottom=0)
    axes[1].axhline(0, color="0.5", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Depth at matched parameters ({depth.get('profile', '?')} profile, {_seeds(depth)})",
                 fontsize=10)
    fig.tight_layout()
    return fig


@restylable
def variants_figure(vrows: Any) -> Any:
    """Attention variants beside softmax attention of the same setting and seed (rows of
    :func:`sinklab.train.miniature.variant_rows`): the sink rate at eps 0.3 with ⟨bos⟩ (%), the
    cost of removing ⟨bos⟩ (text-only minus ⟨bos⟩+text validation loss, nats, with its 95 %
    bootstrap interval over documents) and the validation loss with ⟨bos⟩ (nats); the softmax
    run first. A sinklab Figure (no pyplot)."""
    if not vrows:
        raise ValueError("variants_figure: no variant rows (no variant run has a softmax run of its setting)")
    base = vrows[0]
    names = ["softmax"] + [r["attention"] for r in vrows]
    sink = [100 * base["sink_bos_softmax"]] + [100 * r["sink_bos"] for r in vrows]
    gap = [base["delta_loss_softmax"]] + [r["delta_loss"] for r in vrows]
    lo_hi = [(base["delta_lo_softmax"], base["delta_hi_softmax"])] + [(r["delta_lo"], r["delta_hi"]) for r in vrows]
    err = [[g - lo for g, (lo, _) in zip(gap, lo_hi)], [hi - g for g, (_, hi) in zip(gap, lo_hi)]]
    loss = [base["val_loss_bos_softmax"]] + [r["val_loss_bos"] for r in vrows]
    fig, axes = subplots(1, 3, figsize=(10, 3.4))
    x = np.arange(len(names))
    colors = ["0.55"] + [f"C{i}" for i in range(len(vrows))]
    axes[0].bar(x, sink, color=colors)
    axes[0].set_title("sink rate, eps = 0.3, with <bos> (%)", fontsize=9)
    axes[1].bar(x, gap, color=colors, yerr=err, capsize=3)
    axes[1].axhline(0, color="0.4", lw=0.8)
    axes[1].set_title("removing <bos>: Δ val loss (nats)", fontsize=9)
    axes[2].bar(x, loss, color=colors)
    lo, hi = min(loss), max(loss)
    axes[2].set_ylim(lo - 0.5 * (hi - lo + 0.02), hi + 0.3 * (hi - lo + 0.02))
    axes[2].set_title("val loss with <bos> (nats)", fontsize=9)
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(names, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    s = base.get("setting") or {}
    fig.suptitle(f"Attention variants against softmax (d {s.get('d_model', '?')}, {s.get('n_layers', '?')} layers, "
                 f"wd {s.get('weight_decay', '?')}, C {s.get('context', '?')}; one seed, interval over documents)",
                 fontsize=9)
    fig.tight_layout()
    return fig


@restylable
def variants_seeds_figure(summary: Dict[str, Any]) -> Any:
    """Attention variants with seeds (:func:`sinklab.train.variants.variants_summary`): per
    variant the final sink rate at eps 0.3 with ⟨bos⟩ (%), the cost of removing ⟨bos⟩ (text-only
    minus ⟨bos⟩+text validation loss, nats) and the validation loss with ⟨bos⟩; each seed a dot,
    the mean over seeds a bar; softmax first. A sinklab Figure (no pyplot)."""
    rows = summary["variants"]
    fig, axes = subplots(1, 3, figsize=(10, 3.4))
    x = np.arange(len(rows))
    colors = ["0.55"] + [f"C{i}" for i in range(len(rows) - 1)]
    for ax, key, scale, title in ((axes[0], "sink_0.3", 100.0, "sink rate, eps = 0.3, with <bos> (%)"),
                                  (axes[1], "bos_gap", 1.0, "removing <bos>: Δ val loss (nats)"),
                                  (axes[2], "val_loss", 1.0, "val loss with <bos> (nats)")):
        per = [np.array([np.nan if v is None else scale * v for v in r["final_per_seed"][key]], float) for r in rows]
        means = [float(np.nanmean(p)) if np.isfinite(p).any() else np.nan for p in per]
        ax.bar(x, means, color=colors, alpha=0.6)
        for i, p in enumerate(per):
            ax.plot(np.full(p.size, x[i]), p, "o", ms=4, color="k")
        ax.set_xticks(x)
        ax.set_xticklabels([r["attention"] for r in rows], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[1].axhline(0, color="0.4", lw=0.8)
    vals = [v for p in (r["final_per_seed"]["val_loss"] for r in rows) for v in p if v is not None]
    if vals:
        lo, hi = min(vals), max(vals)
        axes[2].set_ylim(lo - 0.5 * (hi - lo + 0.02), hi + 0.3 * (hi - lo + 0.02))
    fig.suptitle(f"Attention variants against softmax ({summary.get('profile', '?')} profile, causal, fixed <bos>; "
                 f"{_seeds(summary)}: dots, mean: bar)", fontsize=9)
    fig.tight_layout()
    return fig

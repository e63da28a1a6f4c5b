"""Figures of the pre-training experiments in miniature (Fig. 5, Table 2): shared by the
report's training section and ``sinklab experiment``. sinklab Figures, no pyplot state."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from .figure import subplots


def uniform_first_importance(T: int) -> float:
    """a_0 of a head that attends uniformly over its causal prefix, over T tokens:
    1/T Σ_{i<T} 1/(i+1) = H_T / T (0.074 at T = 64). A trained head's a_0 above it leans on
    position 0; the sink rate counts only heads above eps."""
    if T < 1:
        raise ValueError(f"T must be at least 1, got {T}")
    return float(np.sum(1.0 / np.arange(1, T + 1)) / T)


def sink_T(context: int) -> int:
    """T of the training runs' sink metric: 64 tokens, or the context when shorter."""
    from ..train.evaluate import SINK_TOKENS

    return min(SINK_TOKENS, int(context))


def fig5_miniature_figure(fig5: Dict[str, Any]) -> Any:
    """Fig. 5 in miniature against training tokens, one line per context: sink rate at eps 0.3
    and 0.8, mean first-token importance a_0 (dotted: uniform attention's a_0 over the same T)
    and validation loss. A sinklab Figure (no pyplot)."""
    fig, axes = subplots(1, 4, figsize=(16, 3.8))
    top = 0.0
    for run in fig5["runs"]:
        tok = np.asarray(run["tokens"], float) / 1e6
        s3, s8 = 100 * np.asarray(run["sink_0.3"], float), 100 * np.asarray(run["sink_0.8"], float)
        top = max(top, float(np.max(s3, initial=0.0)))
        line = axes[0].plot(tok, s3, "-o", ms=3, label=f"C = {run['context']}")[0]
        col = line.get_color()
        axes[1].plot(tok, s8, "-o", ms=3, color=col)
        imp = np.array([np.nan if v is None else v for v in run["importance"]], float)
        axes[2].plot(tok, imp, "-o", ms=3, color=col)
        axes[2].axhline(uniform_first_importance(sink_T(run["context"])), color=col, ls=":", lw=1)
        axes[3].plot(tok, run["val_loss"], "-o", ms=3, color=col)
    for ax in axes[:2]:
        ax.set_ylim(-2, max(5.0, 1.1 * top))
    titles = ("sink rate, eps = 0.3 (%)", "sink rate, eps = 0.8 (%)",
              "mean first-token importance a0\n(dotted: uniform attention)", "validation loss (nats, text only)")
    for ax, title in zip(axes, titles):
        ax.set_xlabel("training tokens (millions)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    prof = fig5.get("profile", {}).get("name", "?")
    fig.suptitle(f"Fig. 5 in miniature ({prof} profile): the first-token sink while training at each context "
                 f"length (paper: ~120M models, 5B tokens each)", fontsize=10)
    fig.tight_layout()
    return fig


def _row_label(r: Dict[str, Any]) -> str:
    return (f"{r['masking'].replace('_', '-')}\n{'fixed <bos>' if r['fixed_bos'] else 'no fixed <bos>'}\n"
            f"{'<bos>+text' if r['inference'] == 'bos' else 'text only'}")


def table2_miniature_figure(table2: Dict[str, Any]) -> Any:
    """Table 2 in miniature beside the paper's: sink rate (eps 0.3) and validation loss per row,
    and the loss change when ⟨bos⟩ is removed at inference from each model evaluated both ways
    (the comparison that does not depend on the tokenizer). A sinklab Figure (no pyplot)."""
    rows = table2["rows"]
    x = np.arange(len(rows))
    fig, axes = subplots(1, 3, figsize=(17, 4.4), gridspec_kw={"width_ratios": [3, 3, 1.6]})
    prof = table2.get("profile", {}).get("name", "?")
    pairs = ((axes[0], [r["sink_0.3"] for r in rows], [r["paper_sink"] for r in rows], "sink rate (%)"),
             (axes[1], [r["val_loss"] for r in rows], [r["paper_loss"] for r in rows], "validation loss (nats)"))
    for ax, ours, paper, label in pairs:
        ax.bar(x - 0.2, ours, 0.4, label=f"here ({prof} profile" + (", eps = 0.3)" if "sink" in label else ")"))
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
    d_ours = [by[(m, b, "text")]["val_loss"] - by[(m, b, "bos")]["val_loss"] for m, b in both]
    d_paper = [by[(m, b, "text")]["paper_loss"] - by[(m, b, "bos")]["paper_loss"] for m, b in both]
    xb = np.arange(len(both))
    axes[2].bar(xb - 0.2, d_ours, 0.4, label="here")
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

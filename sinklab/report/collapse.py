"""Section: rank and representational collapse with depth and context (§3.1, Prop. 3.1), over
independent passage units with intervals, on every model."""
from __future__ import annotations

from typing import Any, Dict

from ..analysis.collapse import collapse_trend, criterion_collapse, criterion_prop31
from ..viz import figures_mixing
from .core import Context, Section, table


def section_collapse(c: Context) -> Section:
    s = c.s
    rows, nums, figs = [], {}, []
    verdicts: Dict[str, Dict[str, Any]] = {"prop31": {}, "collapse_trend": {}}
    for m in c.models:
        lengths = tuple(T for T in s.collapse_lengths if T < m.model.config.context_length)
        tr = collapse_trend(m.model, lengths=lengths, bos=True, n_passages=s.collapse_passages, progress=c.progress)
        v = criterion_collapse(tr, measure="rank")
        verdicts["collapse_trend"][m.name] = v
        verdicts["prop31"][m.name] = criterion_prop31(tr.prop31())
        for name, label in (("rank", "rank-collapse residual ‖V − 1μᵀ‖_F/‖V‖_F"),
                            ("repr_rel", "representational-collapse distance (relative)")):
            rows.append([m.name, label, tr.depth_ci(name).fmt("+.4f"), tr.context_ci(name, -1).fmt("+.4f"),
                         tr.context_ci(name, "mean").fmt("+.4f")])
        nums[m.name] = tr.summary()
        figs.append(c.save(figures_mixing.collapse_trend_figure(tr), f"collapse_{m.name.replace('/', '_')}.png"))
    body = (table(["model", "measure", "slope vs layer (per layer)", "slope vs log T, last layer",
                   "slope vs log T, mean over layers"], rows)
            + f"\n\n{s.collapse_passages} independent passage units (disjoint passages, a shorter T reads a prefix of "
              f"the same unit), T ∈ {list(s.collapse_lengths)} text tokens after ⟨bos⟩; V = the residual stream of the "
              f"text tokens after the first (no sink row). Slopes per unit (least squares), 95% bootstrap over units. "
              f"Collapse growing means the measure *falls* (slope < 0).")
    reading = " ".join(f"{n}: collapse with depth and context **{verdicts['collapse_trend'][n].status}** "
                       f"({verdicts['collapse_trend'][n].reason}); Prop. 3.1 **{verdicts['prop31'][n].status}** "
                       f"({verdicts['prop31'][n].reason})." for n in verdicts["prop31"])
    return Section(
        "Rank and representational collapse (Prop. 3.1)",
        paper="§3.1: over-mixing (rank and representational collapse) grows with depth and context length; Prop. 3.1: "
              "if ‖V − 1μᵀ‖_F < Δ/2 then ‖v_T − v_{T−1}‖ < Δ (a theorem: checked here as a consistency check of the "
              "numbers, it cannot fail short of a bug).",
        here="Representational collapse as in Barbero et al. 2024 (a sequence vs the same with its last token "
             "repeated). " + " ".join(m.note for m in c.models),
        body=body, reading=reading, figures=figs, numbers=nums, verdicts=verdicts)

"""Section: controls for ⟨bos⟩ removal (was the sink lost, or is the first token merely
unfamiliar?), :func:`sinklab.analysis.controls.bos_controls` on every decoder."""
from __future__ import annotations

from typing import Any, Dict

from ..analysis.controls import bos_controls, criterion_bos_controls
from .core import Context, Section, as_contrast

CLAIMS = {"controls_removal": "removing ⟨bos⟩ costs perplexity (the effect to explain)",
          "controls_sink_tied": "replacing ⟨bos⟩ by another token loses the sink",
          "controls_identity": "a first token that keeps the sink avoids the loss (H2, the sink) — or not (H1, identity)",
          "controls_noop": "zeroing what ⟨bos⟩ passes on, sink kept, costs little (the no-op reading)",
          "controls_mean": "replacing ⟨bos⟩'s value by the mean of the others costs more than zeroing it",
          "controls_heads": "zeroing the sink heads' ⟨bos⟩ value costs more than as many random heads'"}


def section_controls(c: Context) -> Section:
    s = c.s
    quick = s.controls_texts < 36
    parts, nums, figs = [], {}, []
    verdicts: Dict[str, Dict[str, Any]] = {k: {} for k in CLAIMS}
    for m in c.decoders:
        res = bos_controls(m.model, n_texts=s.controls_texts, max_tokens=s.controls_max_tokens,
                           draws=s.controls_random_draws, T=s.sink_T, eps=min(s.eps), quick=quick,
                           progress=c.progress)
        v = criterion_bos_controls(res)
        # Table 2 predicts no removal loss and a sink on any first token for a model trained without a
        # fixed ⟨bos⟩: the fixed-⟨bos⟩ criteria do not apply (the quality section tests no-effect).
        for k in ("controls_removal", "controls_sink_tied"):
            if k in v:
                v[k] = as_contrast(m, v[k])
        for k in CLAIMS:
            if k in v:
                verdicts[k][m.name] = v[k]
        parts.append(f"**{m.name}** ({m.role}):\n\n" + res.table())
        nums[m.name] = res.to_dict()
        figs.append(c.save(res.figure(), f"controls_{m.name.replace('/', '_')}.png"))
    rows = "\n".join(f"| {CLAIMS[k]} | " + " | ".join(f"**{per[n].status}**: {per[n].reason}" if n in per else "—"
                                                      for n in (m.name for m in c.decoders)) + " |"
                     for k, per in verdicts.items())
    body = ("| claim | " + " | ".join(m.name for m in c.decoders) + " |\n|---|" + "---|" * len(c.decoders) + "\n"
            + rows + "\n\n" + "\n\n".join(parts))
    study = c.study
    sep = verdicts["controls_identity"].get(study.name) if study else None
    reading = ("Which control separates the hypotheses: the first token changed while the sink is kept "
               "(controls_identity). " + (f"On {study.name}: **{sep.status}** — {sep.reason}. " if sep else "")
               + " ".join(f"{m.name}: " + "; ".join(f"{k.replace('controls_', '')} **{per[m.name].status}**"
                                                    for k, per in verdicts.items() if m.name in per) + "."
                          for m in c.decoders))
    return Section(
        "Controls for ⟨bos⟩ removal",
        paper="The paper reads the loss without ⟨bos⟩ as the loss of the sink (§5, Table 2) and the sink as an "
              "approximate no-op (§3.2); it runs no controls that tell a lost sink from an unfamiliar first token.",
        here=f"Held-out passages (≤ {s.controls_max_tokens} tokens, the same predicted tokens x[1:] in every condition), "
             f"sink prompts of {s.sink_T} tokens; conditions: ⟨bos⟩, none, ⟨bos⟩ replaced by frequent / rare / "
             f"punctuation / newline / padding tokens, ⟨bos⟩ not first, its value zeroed (queries ≥ 1, every query) or "
             f"replaced by the causal mean of the other values, only the sink heads' values zeroed, and as many random "
             f"heads' ({s.controls_random_draws} draws). Criteria fixed in `sinklab.analysis.controls` before measuring. "
             + " ".join(m.note for m in c.decoders),
        body=body, reading=reading, figures=figs, numbers=nums, verdicts=verdicts)

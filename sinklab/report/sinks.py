"""Section: the sink metric on every model, with and without ⟨bos⟩ (Gu et al.'s a_0; Table 1
beside; Table 2's sink-rate column at inference)."""
from __future__ import annotations

from typing import Dict

import numpy as np

from ..analysis import bos_removal as R
from ..analysis import status as S
from ..analysis.sinkset import compare_bos
from ..prompts import load_passages
from ..viz import figures_sinks
from .core import Context, Section, pct_ci, table

# The paper's numbers quoted beside ours.
TABLE1 = {"LLaMA 3.1 8B": (45.97, "32 × 32"), "LLaMA 3.1 70B": (73.49, "80 × 64"),
          "LLaMA 3.1 405B": (78.29, "126 × 128")}
TABLE2_NO_FIXED_BOS = {"⟨bos⟩+text": (65.10, 2.69), "text only": (65.15, 2.70)}
TABLE2_FIXED_BOS = {"⟨bos⟩+text": (90.84, 2.69), "text only": (0.05, 7.56)}


def sink_comparison(c: Context, m) -> object:
    """The with/without-⟨bos⟩ sink study of ``m`` on the sink prompts (computed once)."""
    s = c.s
    prompts = load_passages("sinks")[: s.sink_prompts]
    return c.cached("sinks", m, lambda: compare_bos(m.model, prompts, T=s.sink_T, eps=s.eps, skip_short=True,
                                                    keep_keys=True, progress=c.progress))


def section_sinks(c: Context) -> Section:
    s = c.s
    e = min(s.eps)
    rows, verdicts, nums, figs = [], {"sinks": {}, "bos_sinks": {}, "table1": {}}, {}, []
    for m in c.models:
        cmp = sink_comparison(c, m)
        w, wo = cmp.bos.importance, cmp.nobos.importance
        n = R.sink_numbers(w, wo, e)
        loc_w, loc_wo = cmp.bos.location(), cmp.nobos.location()
        rows.append([m.name, m.role, str(cmp.bos.n_prompts)]
                    + [pct_ci(R.sink_rate_ci(w, x)) for x in s.eps] + [pct_ci(R.sink_rate_ci(wo, x)) for x in s.eps]
                    + [n["sink_rate_change"].scaled(100).fmt("+.1f"),
                       f"{100 * loc_w['at_0']:.0f}% / {100 * loc_wo['at_0']:.0f}%"])
        verdicts["sinks"][m.name] = R.criterion_sinks(w, e)
        verdicts["bos_sinks"][m.name] = R.criterion_sinks_removed(w, wo, e, m.trained_with_bos)
        verdicts["table1"][m.name] = S.not_testable(
            "a size trend needs several sizes of one family in one format; the families report "
            "(`sinklab reproduce --families`) tests it within Qwen2.5 (0.5B vs 1.5B)")
        nums[m.name] = {"summary": cmp.summary(), "intervals": {k: v.to_dict() for k, v in n.items()},
                        "sink_rate_ci": {f"{x:g}": {"bos": R.sink_rate_ci(w, x).to_dict(),
                                                    "nobos": R.sink_rate_ci(wo, x).to_dict()} for x in s.eps}}
        safe = m.name.replace("/", "_")
        figs.append(c.save(figures_sinks.bos_comparison_figure(cmp.bos, cmp.nobos, eps=e), f"sinks_bos_{safe}.png"))
    head = (["model", "role", "prompts"] + [f"sink rate ε {x:g}, ⟨bos⟩+text" for x in s.eps]
            + [f"ε {x:g}, text only" for x in s.eps] + [f"change ε {e:g} (points)", "heads with top key at 0 (⟨bos⟩ / text)"])
    t1 = "\n".join(f"| {k} | {lay} | {pct:.2f}% |" for k, (pct, lay) in TABLE1.items())
    body = (table(head, rows) + "\n\nIntervals: 95% bootstrap over prompts (the heads of one forward pass are not "
            "independent draws). Beside Table 1 (ε = 0.8, the paper's threshold there):\n\n| model | layers × heads | "
            "sink rate |\n|---|---|---|\n" + t1 + "\n" + "\n".join(
                f"| {m.name} (here, ⟨bos⟩+text) | {m.model.config.n_layers} × {m.model.config.n_heads} | "
                f"{pct_ci(R.sink_rate_ci(sink_comparison(c, m).bos.importance, 0.8))} |" for m in c.models))
    reading = " ".join(
        f"{m.name}: {verdicts['sinks'][m.name].reason}; without ⟨bos⟩, {verdicts['bos_sinks'][m.name].reason} "
        f"(**{verdicts['bos_sinks'][m.name].status}**)." for m in c.models)
    return Section(
        "Attention sinks with and without ⟨bos⟩",
        paper="Gu et al.'s first-token importance a_0 and sink rate (used throughout the paper); Table 1: 45.97 / 73.49 "
              "/ 78.29 % at ε = 0.8 for LLaMA 3.1 8B / 70B / 405B; Table 2's inference rows: a model trained with a "
              "fixed ⟨bos⟩ loses its sinks without it (90.84 % → 0.05 %), one trained without keeps them "
              "(65.10 % → 65.15 %).",
        here=f"{s.sink_prompts} shipped public-domain passages cut to their first {s.sink_T} tokens (⟨bos⟩ counted "
             f"among them; without it, position 0 is the first text token and the text is one token longer), "
             f"streaming C statistics, query heads counted. " + " ".join(m.note for m in c.models),
        body=body, reading=reading, figures=figs, numbers=nums, verdicts=verdicts)

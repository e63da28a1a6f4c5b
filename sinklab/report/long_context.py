"""Section: attention statistics at long inference contexts, streamed from C without a T×T
buffer, on every model (a stand-in: Fig. 5 varies the *training* context)."""
from __future__ import annotations

from typing import Dict

from ..analysis.long_context import N_WINDOWS, long_context_stats, long_texts
from ..analysis.stats import mean_ci
from ..inputs import BOS, LABELS, NOBOS
from .core import Context, Section, pct_ci, table


def section_long_context(c: Context) -> Section:
    s = c.s
    e = min(s.eps)
    rows, nums, notes = [], {}, []
    for m in c.models:
        T = min(s.long_T, m.model.config.context_length - 1)
        texts = long_texts(m.model, T)
        st = long_context_stats(m.model, texts, e)
        for key in (BOS, NOBOS):
            r = st[key]
            rows.append([m.name, LABELS[key], str(T), pct_ci(mean_ci(r["sink_rate"])),
                         mean_ci(r["to_first"]).fmt(".3f"), mean_ci(r["entropy"]).fmt(".3f")])
        nums[m.name] = {"T": T, **{k: {q: v.tolist() for q, v in d.items()} for k, d in st.items()}}
        win = [w for w in (m.model.config.window or ()) if w > 0]
        if win and T > min(win):
            notes.append(f"{m.name}: {len(win)} of its {m.model.config.n_layers} layers attend within a {min(win)}-token "
                         f"sliding window, so at T = {T} {100 * (T - min(win)) / T:.0f}% of their queries cannot see "
                         f"position 0: a_0 there falls by construction.")
    body = (table(["model", "condition", "T", f"sink rate ε {e:g}", "attention to position 0 (queries ≥ 1)",
                   "row entropy (nats)"], rows)
            + f"\n\nIntervals: 95% bootstrap over {N_WINDOWS} stretches of text per model (few units: wide).")
    reading = ("Descriptive: these numbers vary the inference context of trained models, which is not the paper's "
               "Fig. 5 (the training context; see the pre-training section), so no status is claimed. " + " ".join(notes))
    return Section(
        "Long context",
        paper="Fig. 5 shows sinks growing with the pre-training context length (128 → 2048); Thm. 3.2 predicts that longer "
              "contexts need stronger sinks.",
        here=f"{N_WINDOWS} stretches of up to {s.long_T} tokens (passages concatenated), statistics streamed from the C "
             f"kernel without a T×T buffer, with ⟨bos⟩ and without (T tokens in both). " + " ".join(m.note for m in c.models),
        body=body, reading=reading, numbers=nums)

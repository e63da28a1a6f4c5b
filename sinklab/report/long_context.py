"""Section: attention statistics at long inference contexts, streamed from C without a T×T
buffer, on every model (a stand-in: Fig. 5 varies the *training* context)."""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from ..analysis.stats import mean_ci
from ..inputs import BOS, LABELS, NOBOS, prepare
from ..prompts import load_passages
from .core import Context, Section, pct_ci, table

N_WINDOWS = 3     # independent stretches of text per model and condition (the interval's units)


def long_texts(model: Any, T: int, n: int = N_WINDOWS) -> List[np.ndarray]:
    """``n`` stretches of T text tokens (no BOS): the shipped passages joined by blank lines, each
    stretch starting at another passage (rotated order), so they share no starting text."""
    passages = load_passages("all")
    out = []
    for w in range(n):
        ids: List[int] = []
        order = passages[w * len(passages) // n:] + passages[: w * len(passages) // n]
        for p in order:
            ids.extend(int(i) for i in prepare(model, p + "\n\n", False, T))
            if len(ids) >= T:
                break
        out.append(np.asarray(ids[:T], np.int64))
    return out


def long_context_stats(model: Any, texts: List[np.ndarray], eps: float) -> Dict[str, Any]:
    """Per condition (with / without ⟨bos⟩, T tokens in both): per window the sink rate, the mean
    attention to position 0 over queries >= 1 and the mean row entropy; arrays (n_windows,)."""
    T = len(texts[0])
    out = {}
    for key, bos in ((BOS, True), (NOBOS, False)):
        rate, to0, ent = [], [], []
        for x in texts:
            st = model.run(prepare(model, x, bos, T), capture=("stats",), logits_from=-1, progress=False).stats
            rate.append(float((st.importance[:, :, 0] > eps).mean()))
            to0.append(float(st.to_first[:, :, 1:].mean()))
            ent.append(float(st.entropy[:, :, 1:].mean()))
        out[key] = {"sink_rate": np.array(rate), "to_first": np.array(to0), "entropy": np.array(ent)}
    return out


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

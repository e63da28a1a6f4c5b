"""Section: sinks as approximate no-ops (§3.2–3.3): head-output and value norms of sink heads,
and the search for conditional ("apostrophe") heads, on every model."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from ..analysis.noop import criterion_noop, find_conditional_heads, noop_analysis
from ..prompts import load_passages
from ..viz import figures_mixing
from .core import Context, Section, num, table

SINK_MASS = 0.5      # a sink head: mean attention to position 0 over queries >= 1 above this

# Sentence pairs with and without the trigger "'s", for the search for conditional heads: the
# paper's "apostrophe head" in Gemma 7B attends to an apostrophe when one is present and to
# ⟨bos⟩ otherwise. These sentences are ours; the paper's prompts are not published.
APOSTROPHE = [
    ("John's car is parked outside the old house by the river.",
     "The car is parked outside the old house by the river."),
    ("The dog's bone was buried deep in the garden behind the shed.",
     "A bone was buried deep in the garden behind the shed."),
    ("My sister's new job starts next week in the city centre.",
     "My sister starts a new job next week in the city centre."),
    ("The company's profits rose sharply during the last quarter of the year.",
     "The profits of the company rose sharply during the last quarter of the year."),
    ("We borrowed Maria's bicycle to ride along the coast road.",
     "We borrowed a bicycle from Maria to ride along the coast road."),
    ("The teacher's voice echoed through the empty classroom after school.",
     "The voice of the teacher echoed through the empty classroom after school."),
    ("Our neighbour's cat sleeps on the warm roof every afternoon.",
     "The cat of our neighbour sleeps on the warm roof every afternoon."),
    ("The book's cover was torn, but the pages were still clean.",
     "The cover of the book was torn, but the pages were still clean."),
]


def section_noop(c: Context) -> Section:
    s = c.s
    prompts = load_passages("sinks")[: s.noop_prompts]
    rows, nums, figs, cond_tables = [], {}, [], []
    verdicts: Dict[str, Dict[str, Any]] = {"noop_out": {}, "noop_value": {}}
    for m in c.models:
        res = noop_analysis(m.model, prompts, bos=s.bos, max_tokens=s.sink_T, progress=c.progress)
        summ = res.summary(SINK_MASS)
        summ.pop("per_head", None)
        v = criterion_noop(res, SINK_MASS)
        verdicts["noop_out"][m.name], verdicts["noop_value"][m.name] = v["out_norm"], v["first_value"]
        lr_o, lr_v = v.get("out_norm_log_ratio"), v.get("first_value_log_ratio")
        rows.append([m.name, m.role, f"{summ['n_sink_heads']} / {summ['n_heads']}",
                     f"{num(summ['median_rel_out_norm_sink_heads'], '.4f')} / "
                     f"{num(summ['median_rel_out_norm_other_heads'], '.4f')}",
                     "—" if lr_o is None else lr_o.map(np.exp).fmt(".3f"),
                     f"{summ['n_sink_kv_heads']} / {summ['n_kv_heads']}",
                     "—" if lr_v is None else lr_v.map(np.exp).fmt(".3f")])
        safe = m.name.replace("/", "_")
        figs.append(c.save(figures_mixing.noop_figure(res), f"noop_{safe}.png"))
        entry = {"noop": summ, **{k: x.to_dict() for k, x in v.items()}}
        if not m.model.config.bidirectional:
            cond = find_conditional_heads(m.model, [a for a, _ in APOSTROPHE], [b for _, b in APOSTROPHE],
                                          trigger="'s", top=5, progress=c.progress)
            cond_tables.append(f"{m.name}:\n\n" + cond.table())
            entry["conditional_heads"] = cond.summary()
        nums[m.name] = entry
    body = (table(["model", "role", "sink heads (mass > 0.5)", "median relative output norm, sink / other heads",
                   "ratio sink / other (geometric mean over prompts)", "sink kv heads",
                   "⟨bos⟩ value norm / median token's, sink kv heads"], rows)
            + "\n\nIntervals: 95% bootstrap over prompts of the mean log ratio (sink heads chosen once on all prompts). "
              "Search for conditional heads (attend to \"'s\" when present, to position 0 otherwise), "
              f"{len(APOSTROPHE)} sentence pairs written for this report (a lead, not a test):\n\n"
            + "\n\n".join(cond_tables))
    reading = " ".join(f"{name}: sink heads' output **{verdicts['noop_out'][name].status}** "
                       f"({verdicts['noop_out'][name].reason}); ⟨bos⟩'s value **{verdicts['noop_value'][name].status}** "
                       f"({verdicts['noop_value'][name].reason})." for name in verdicts["noop_out"])
    return Section(
        "Sinks as approximate no-ops",
        paper="§3.2–3.3: a head with nothing to do attends to ⟨bos⟩, whose value has a small norm, so its update is ≈ 0; "
              "the 'apostrophe head' of Gemma 7B (qualitative, no numbers).",
        here=f"{len(prompts)} passages, {s.sink_T} tokens with ⟨bos⟩. Value norms per kv head (query heads of one kv "
             f"head share its values). The intervention test of the no-op reading (zeroing what the sink passes on) "
             f"is in the controls section. " + " ".join(m.note for m in c.models),
        body=body, reading=reading, figures=figs, numbers=nums, verdicts=verdicts)

"""The report's first table: every element of the paper, with the status its criterion computed
on the study model (trained with a fixed ⟨bos⟩) and on the contrast models. Nothing in it is
literal text: a status comes from a :class:`~sinklab.analysis.status.Verdict` a section computed,
and an element no section measured says so."""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..analysis import status as S
from .core import Section

MINIATURE = "trained here"      # the verdicts of the pre-training section (models trained by sinklab)

# (element key, the paper element, the paper's numbers, the section that measures it)
ELEMENTS: List[Tuple[str, str, str, str]] = [
    ("sinks", "Heads attend to the first token (Gu et al.'s a_0, sink rate)", "used throughout", "sinks"),
    ("table1", "Table 1: sink rate grows with model size (LLaMA 3.1, ε 0.8)", "45.97 / 73.49 / 78.29 %", "sinks"),
    ("bos_sinks", "Table 2 at inference: without its fixed ⟨bos⟩ a model loses its sinks (none lost if trained "
                  "without one)", "90.84 → 0.05 % (65.10 → 65.15 %)", "sinks"),
    ("bos_quality", "Removing a fixed ⟨bos⟩ hurts: perplexity", "loss 2.69 → 7.56 (2.69 → 2.70)", "quality"),
    ("bos_passkey", "Removing a fixed ⟨bos⟩ hurts: passkey retrieval", "RULER 82.57 → 0.00", "quality"),
    ("bos_retrieval", "Removing a fixed ⟨bos⟩ hurts: multi-key retrieval with distractors", "RULER 82.57 → 0.00",
     "quality"),
    ("bos_cloze", "Removing a fixed ⟨bos⟩ hurts: cloze by log-likelihood", "HellaSwag 80.61 → 27.35", "quality"),
    ("controls_sink_tied", "Controls: another first token in ⟨bos⟩'s place does not become the sink", "Table 2 (fixed "
                           "⟨bos⟩)", "controls"),
    ("controls_identity", "Controls: the loss is the sink's, not an unfamiliar first token's", "—", "controls"),
    ("controls_noop", "Controls: the sink is an approximate no-op (zeroing what it passes on costs little)",
     "§3.2 (qualitative)", "controls"),
    ("controls_mean", "Controls: replacing ⟨bos⟩'s value by the others' mean (mixing) costs more than zeroing it",
     "§3 (over-mixing)", "controls"),
    ("controls_heads", "Controls: sink heads' values matter more than random heads'", "—", "controls"),
    ("fig23_spread", "Fig. 2–3: a one-word perturbation spreads further without ⟨bos⟩", "Gemma 7B, one prompt",
     "perturbation"),
    ("fig23_entropy", "Fig. 2–3: attention is smoother without ⟨bos⟩", "Gemma 7B, one prompt", "perturbation"),
    ("noop_out", "No-op reading: sink heads write little into the residual stream", "§3.2 (qualitative)", "noop"),
    ("noop_value", "No-op reading: ⟨bos⟩'s value vector is small", "§3.2 (qualitative)", "noop"),
    ("prop31", "Prop. 3.1: rank collapse implies representational collapse", "a bound", "collapse"),
    ("collapse_trend", "Collapse grows with depth and context length", "§3.1 (qualitative)", "collapse"),
    ("thm32", "Thm. 3.2: the over-squashing bound, tight enough to test", "a bound", "oversquashing"),
    ("mixing", "Thm. 3.2's reading: the sink limits mixing, more so at longer contexts", "prediction",
     "oversquashing"),
    ("fig5", "Fig. 5: longer pre-training contexts form more sinks", "~0 % at 128 → most at 2048", "training"),
    ("table2_fixed", "Table 2: a model pre-trained with a fixed ⟨bos⟩ relies on it", "90.84 → 0.05 %, 2.69 → 7.56",
     "training"),
    ("table2_free", "Table 2: a model pre-trained without one does not", "65.10 → 65.15 %, 2.69 → 2.70", "training"),
]


def element_rows(sections: Dict[str, Section], study: str, contrasts: List[str]) -> List[Dict[str, object]]:
    """One row per element: the study model's (or the trained-here miniature's) verdict and the
    contrast models' statuses, from the sections' verdicts."""
    rows = []
    for key, element, paper, sec_key in ELEMENTS:
        sec = sections.get(sec_key)
        per = sec.verdicts.get(key, {}) if sec is not None else {}
        main = per.get(study) or per.get(MINIATURE)
        if main is None:
            why = ("its section was not run" if sec is None else
                   "no model here was trained with a fixed ⟨bos⟩" if study is None else "not measured in this run")
            main = S.not_testable(why)
        rows.append({"key": key, "element": element, "paper": paper, "status": main.status, "reason": main.reason,
                     "criterion": main.criterion, "section": sec.title if sec is not None else "",
                     "contrast": {n: per[n].status for n in contrasts if n in per}})
    return rows

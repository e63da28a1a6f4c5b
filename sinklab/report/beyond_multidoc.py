"""Report section: where the sinks form when documents are concatenated, with and without the
model's ⟨bos⟩ at each boundary, per model, from :func:`sinklab.analysis.multidoc.multidoc_sinks`."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from ..analysis.multidoc import multidoc_sinks
from ..analysis.stats import Interval, paired_difference
from ..viz.figure import Figure, subplots
from ..viz.figures_secondary import document_sinks_figure
from .core import num, pct_ci, table

TITLE = "Sinks across concatenated documents"
SUMMARY = "a ⟨bos⟩ id at every document boundary"

EPS = 0.3
# A boundary token is "a sink like position 0" when the interval of its mean a over position 0's
# lies wholly above this fraction; it "attracts" when its excess over the other keys' a is above 0.
SINK_LIKE = 0.5


def settings(quick: bool) -> Dict[str, int]:
    return {"n_prompts": 8, "n_docs": 4, "doc_tokens": 96} if quick else {"n_prompts": 16, "n_docs": 8,
                                                                          "doc_tokens": 112}


def compute(model: Any, quick: bool, progress: bool) -> Dict[str, Any]:
    """Sinks over n documents (shipped passages) in one sequence, separated by the model's ⟨bos⟩
    or concatenated, position 0 by the model's own ⟨bos⟩ rule."""
    s = settings(quick)
    r = multidoc_sinks(model, n_docs=s["n_docs"], doc_tokens=s["doc_tokens"], n_prompts=s["n_prompts"], eps=EPS,
                       progress=progress)
    sm = r.summary()
    prof = lambda c, k: r.layer_profile(c, k).mean(axis=0)  # noqa: E731
    profiles = {"first": prof("separated", "a0"), "start_sep": prof("separated", "a_start"),
                "after_sep": prof("separated", "a_after"), "start_plain": prof("concatenated", "a_start"),
                "rest": prof("separated", "a_rest")}
    by_doc = r.data["separated"]["a_start"].mean(axis=(0, 2, 3))          # (n-1,) mean a per boundary
    # the same passages in both conditions: the effect of the separators, paired by prompt
    sinks_sep = r.head_mean("separated", "mass_first") + r.head_mean("separated", "mass_starts")
    change = {"a0": paired_difference(r.head_mean("concatenated", "a0"), r.head_mean("separated", "a0")).to_dict(),
              "mass": paired_difference(r.head_mean("concatenated", "mass_first"), sinks_sep).to_dict()}
    return {"change": change, "settings": {**s, "bos": r.bos, "eps": EPS, "min_queries": r.min_queries},
            "sep_id": r.sep_id,
            "sep_token": r.sep_token, "separated": sm["separated"], "concatenated": sm["concatenated"],
            "profiles": profiles, "by_boundary": by_doc, "n_layers": len(r.windows)}


def _iv(d: Any) -> Interval:
    return Interval.from_dict(d) if d else Interval(float("nan"), float("nan"), float("nan"), 0)


def boundary_kind(cond: Dict[str, Any]) -> str:
    """What the later documents' start tokens are, from the intervals: ``"sink like position 0"``
    (mean a over position 0's above :data:`SINK_LIKE`), ``"attracts"`` (above the other keys, not
    that much), ``"repels"`` (below the other keys) or ``"like other keys"``."""
    if _iv(cond["start_over_first"]).above(SINK_LIKE):
        return "sink like position 0"
    d = _iv(cond["start_minus_rest"])
    return "attracts" if d.above(0.0) else "repels" if d.below(0.0) else "like other keys"


def code(token: str, in_table: bool = False) -> str:
    """A token string as Markdown code (``<bos>`` would otherwise be read as an HTML tag); in a
    table its pipes escaped."""
    return "`" + (token.replace("|", "\\|") if in_table else token) + "`"


def reading(name: str, res: Dict[str, Any]) -> str:
    sep, plain, tok = res["separated"], res["concatenated"], code(res["sep_token"])
    k = boundary_kind(sep)
    weaker = ", weaker than position 0" if _iv(sep["start_over_first"]).below(1.0) else ""
    what = {"sink like position 0": f"every {tok} at a boundary becomes a sink{weaker}",
            "attracts": f"a {tok} at a boundary attracts more attention than other tokens but stays far below "
                        "position 0",
            "repels": f"a {tok} at a boundary gets less attention than other tokens",
            "like other keys": f"a {tok} at a boundary gets no more attention than other tokens"}[k]
    text = (f"{name} ({'⟨bos⟩ + text' if res['settings']['bos'] else 'text only'} at position 0): {what} "
            f"(mean a {_iv(sep['a_start']).fmt('.3f')} against {_iv(sep['a0']).fmt('.3f')} at position 0 and "
            f"{_iv(sep['a_rest']).fmt('.4f')} elsewhere; {_iv(sep['start_over_first']).fmt('.2f')} of position 0's; "
            f"sink rate {pct_ci(_iv(sep['rate_start']))} of heads against {pct_ci(_iv(sep['rate_first']))} at "
            f"position 0)")
    after = _iv(sep["a_after"])
    if after.defined:
        text += f"; the document's first text token after it has a = {after.fmt('.4f')}"
    if len(res["by_boundary"]):
        text += "; a by boundary, first to last: " + ", ".join(f"{x:.3f}" for x in res["by_boundary"])
    ms, mf = _iv(sep["mass_sinks"]), _iv(plain["mass_first"])
    da0, dm = _iv(res["change"]["a0"]), _iv(res["change"]["mass"])
    share = ("the separators take from position 0 (a₀ changes by " + da0.fmt("+.3f") + ")" if da0.below(0) else
             "position 0 keeps its a₀ (change " + da0.fmt("+.3f") + ")" if not da0.excludes(0) else
             "position 0's a₀ even rises (change " + da0.fmt("+.3f") + ")")
    total = ("the separators add to the sinks' total" if dm.above(0) else
             "the sinks' total stays as it is" if not dm.excludes(0) else "the sinks' total falls")
    text += (f". With separators {share} and {total}: position 0 and the boundary tokens together take {pct_ci(ms)} "
             f"of all attention mass, position 0 alone without separators {pct_ci(mf)} (paired change "
             f"{dm.scaled(100).fmt('+.1f', ' points')})")
    kp = boundary_kind(plain)
    text += {"sink like position 0": ". Without separators, every document's first token becomes a sink",
             "attracts": ". Without separators, a document's first token attracts more than other tokens "
                         f"(excess {_iv(plain['start_minus_rest']).fmt('.4f')}) but is no sink",
             "repels": ". Without separators, a document's first token gets less than other tokens",
             "like other keys": ". Without separators, a document's first token is like any other"}[kp]
    return text + "."


def summary(res: Dict[str, Any]) -> str:
    """The reading in one table cell (the report's summary table)."""
    sep = res["separated"]
    word = {"sink like position 0": "a sink", "attracts": "attracts, no sink", "repels": "less than other tokens",
            "like other keys": "like other tokens"}[boundary_kind(sep)]
    return (f"{code(res['sep_token'], in_table=True)} at a boundary: {word} "
            f"(a / a₀ {_iv(sep['start_over_first']).fmt('.2f')})")

def markdown(results: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for name, r in results.items():
        labels = (("separated", f"{code(r['sep_token'], True)} at each boundary"), ("concatenated", "no separator"))
        for cond, label in labels:
            c = r[cond]
            rows.append([name, label, num(_iv(c["a0"]), ".3f"), num(_iv(c["a_start"]), ".3f"),
                         num(_iv(c["a_after"]), ".4f") if c.get("a_after") else "—", num(_iv(c["a_rest"]), ".4f"),
                         num(_iv(c["start_over_first"]), ".2f"), pct_ci(_iv(c["rate_first"])),
                         pct_ci(_iv(c["rate_start"])), pct_ci(_iv(c["mass_sinks"])), boundary_kind(c)])
    s = next(iter(results.values()))["settings"]
    return "\n\n".join([
        "**Question.** When several documents share one sequence (packed pretraining windows, retrieval "
        "prompts), where do the sinks form: only at position 0, at every ⟨bos⟩, at every document's first "
        "token? The paper's §5 (Table 2) trains with and without a fixed ⟨bos⟩ and intra-document "
        "masking and finds the sink follows the ⟨bos⟩ a model was trained with; here the trained models are "
        "probed at inference: for a model trained with a ⟨bos⟩ in front of every document (Gemma 3) the "
        "expectation is that every ⟨bos⟩ becomes a sink.",
        f"**Here.** Prompts of {s['n_docs']} shipped passages of {s['doc_tokens']} tokens each, back to back "
        "(\"no separator\") or with the model's ⟨bos⟩ id (`config.bos_token_id`: Gemma `<bos>`, SmolLM2 "
        "`<|im_start|>`, Qwen2.5 `<|endoftext|>`, its pretraining document separator) before every document "
        "after the first; position 0 by the model's own rule (its tokenizer's `add_bos_default`: ⟨bos⟩ for "
        "Gemma, none for SmolLM2 and Qwen2.5). Gu's a (mean attention a key receives from the queries that see "
        "it, streamed by the C kernel, exact under Gemma's 512-token windows) at position 0, at the later "
        "documents' starts, after a separator, and over the other keys; means over heads within each prompt, "
        f"intervals over prompts; sink rate: heads with a > {EPS}. Boundary kind: a sink like position 0 when "
        f"a / a₀'s interval lies above {SINK_LIKE}, else attracts / repels by the sign of the excess over other "
        "keys. Differs from the paper: no training, causal attention across documents (no intra-document "
        "mask), literary passages.",
        table(["model", "boundaries", "a₀", "a at starts", "a after separator", "a elsewhere", "starts / a₀",
               "sink rate at 0", "sink rate at starts", "mass on 0 + starts", "starts are"], rows),
        "**Reading.** " + " ".join(reading(n, r) for n, r in results.items())])


def figures(results: Dict[str, Dict[str, Any]]) -> Dict[str, Figure]:
    n = len(results)
    fig, axes = subplots(1, n, figsize=(5.2 * n, 3.6), layout="constrained", squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        document_sinks_figure({k: np.asarray(v, np.float64) for k, v in r["profiles"].items()}, ax=ax,
                              title=f"{name}: {r['settings']['n_docs']} documents", sep_token=r["sep_token"])
    return {"beyond_multidoc.png": fig}

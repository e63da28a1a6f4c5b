"""Report section: the top sink heads switched off against matched random non-sink heads per
model, from :func:`sinklab.analysis.head_ablation.head_ablation`."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

import numpy as np

from ..analysis.head_ablation import ABLATIONS, head_ablation
from ..analysis.stats import Interval
from ..prompts import load_passages
from ..viz.figure import Figure, subplots
from ..viz.figures_beyond import head_ablation_figure
from .core import table

TITLE = "Sink-head ablation against matched controls"
SUMMARY = "top sink heads off vs matched heads (ΔNLL difference)"

EPS = 0.3  # a sink head: mean a_0 over prompts above this (the paper's ε for Table 1)


def settings(quick: bool) -> Dict[str, int]:
    return ({"n_prompts": 6, "T": 64, "n_top": 8, "draws": 8} if quick else
            {"n_prompts": 24, "T": 128, "n_top": 8, "draws": 50})


def compute(model: Any, quick: bool, progress: bool) -> Dict[str, Any]:
    """Ablation of the top sink heads and of matched random draws on the shipped passages (the
    model's own ⟨bos⟩ rule), with the intervals the reading uses."""
    s = settings(quick)
    out: Dict[str, Any] = {}
    for ablation in ABLATIONS:  # zero-ablation's result at the top level, mean-ablation's under "mean"
        r = head_ablation(model, load_passages("sinks")[: s["n_prompts"]], T=s["T"], n_top=s["n_top"],
                          draws=s["draws"], eps=EPS, progress=progress, ablation=ablation)
        d = r.to_dict()
        d.update(settings=s, n_prompts=int(len(r.nll_base)), n_heads=int(r.a0.size),
                 dnll_sink=r.dnll_sink().to_dict(), dnll_random=r.dnll_random().to_dict(),
                 dnll_difference=r.dnll_difference().to_dict(), dacc_sink=r.dacc_sink().to_dict(),
                 dacc_random=r.dacc_random().to_dict(), exceed=r.exceed(),
                 nll_base_mean=float(np.mean(r.nll_base)))
        if ablation == "zero":
            out = d
        else:
            out[ablation] = d
    return out


def _by_ablation(res: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    """(ablation, result) of a model: zero-ablation, then mean-ablation when it was run."""
    return [("zero", res)] + ([("mean", res["mean"])] if "mean" in res else [])


def _iv(res: Dict[str, Any], key: str) -> Interval:
    return Interval.from_dict(res[key])


def comparison(res: Dict[str, Any]) -> str:
    """"more" (ΔNLL(sink) − ΔNLL(random) has its interval above 0), "less" (below 0) or "no
    detectable difference"."""
    d = _iv(res, "dnll_difference")
    return "more" if d.above(0) else "less" if d.below(0) else "no detectable difference"


def _effect(iv: Interval) -> str:
    return "raises NLL" if iv.above(0) else "lowers NLL" if iv.below(0) else "has no detectable effect on NLL"


def reading(name: str, res: Dict[str, Any], ablation: str = "zero") -> str:
    c = comparison(res)
    how = {"more": "hurts more than", "less": "hurts less than",
           "no detectable difference": "is not distinguishable from"}[c]
    verb = "switching off" if ablation == "zero" else "mean-ablating"
    return (f"{name}: {verb} its top {len(res['sink_heads'])} sink heads (of {res['n_sink_total']} with "
            f"mean a₀ > {EPS}) {_effect(_iv(res, 'dnll_sink'))} ({_iv(res, 'dnll_sink').fmt('.3f')} nats) and "
            f"{how} {verb} matched non-sink heads ({_iv(res, 'dnll_random').fmt('.3f')}; difference "
            f"{_iv(res, 'dnll_difference').fmt('.3f')}; {100 * res['exceed']:.0f} % of {len(res['random_heads'])} "
            f"draws hurt at least as much).")


def summary(res: Dict[str, Any]) -> str:
    """The reading in one table cell (the report's summary table): sink heads against matched
    heads, by each ablation."""
    how = {"more": "hurts more", "less": "hurts less", "no detectable difference": "no detectable difference"}
    return "; ".join(f"{a}: {how[comparison(r)]} ({_iv(r, 'dnll_difference').fmt('+.2f')} nats)"
                     for a, r in _by_ablation(res))

def markdown(results: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for name, res in results.items():
        for ablation, r in _by_ablation(res):
            rows.append(_row(name, ablation, r))
    return "\n\n".join([
        "**Question.** Do the heads that attend most to position 0 matter more to the model than other heads? "
        "The paper (§3-4) reads sink heads as near no-ops that a model uses to *avoid* mixing; head-ablation studies "
        "(e.g. Gu et al., 2024) switch heads off one set at a time. Here a set of sink heads is compared with "
        "control sets of the same size drawn from the non-sink heads of the same layers.",
        f"**Here.** Sink heads: mean a₀ > {EPS} on the unablated model, the top n by a₀ taken while their layer has a "
        "non-sink head to match (so n can be smaller than asked); each control draw takes, in every layer, as many "
        "random non-sink heads as the sink set has there. *zero*: a head is switched off by `head_scale` 0 (it "
        "writes nothing before W_O); *mean*: its output before W_O is replaced at every position by its mean over "
        "16 held-out reference passages and their positions (a `z` patch), which keeps the head's average "
        "contribution and removes only what depends on the input. ΔNLL is the change of mean next-token NLL per "
        "prompt (nats), Δacc the change of next-token top-1 accuracy on the same tokens (a cheap task on the same "
        "forward, in points); 95 % bootstrap intervals over prompts, the draws averaged per prompt; 'difference' is "
        "paired per prompt. The comparison reads 'more' / 'less' when the difference's interval excludes 0.",
        table(["model", "input", "ablation", "prompts", "T", "sink heads", "n ablated", "draws", "NLL (none)",
               "ΔNLL sink", "ΔNLL random", "sink − random", "Δacc sink", "Δacc random", "draws ≥ sink",
               "sink heads hurt"], rows),
        "**Reading.** " + " ".join(reading(n, r, a) for n, res in results.items() for a, r in _by_ablation(res))])


def _row(name: str, ablation: str, r: Dict[str, Any]) -> List[str]:
    return [name, "⟨bos⟩ + text" if r["bos"] else "text only", ablation, str(r["n_prompts"]), str(r["T"]),
            f"{r['n_sink_total']} / {r['n_heads']}", str(len(r["sink_heads"])), str(len(r["random_heads"])),
            f"{r['nll_base_mean']:.3f}", _iv(r, "dnll_sink").fmt(".3f"), _iv(r, "dnll_random").fmt(".3f"),
            _iv(r, "dnll_difference").fmt(".3f"), _iv(r, "dacc_sink").scaled(100).fmt(".1f", " pt"),
            _iv(r, "dacc_random").scaled(100).fmt(".1f", " pt"), f"{100 * r['exceed']:.0f} %", comparison(r)]


def figures(results: Dict[str, Dict[str, Any]]) -> Dict[str, Figure]:
    """One panel per model and ablation: zero-ablation on the top row, mean-ablation below it."""
    n = len(results)
    rows = max(len(_by_ablation(res)) for res in results.values())
    fig, axes = subplots(rows, n, figsize=(4.2 * n, 3.4 * rows), layout="constrained", squeeze=False)
    for col, (name, res) in enumerate(results.items()):
        for row, (ablation, r) in enumerate(_by_ablation(res)):
            view = SimpleNamespace(nll_base=np.asarray(r["nll_base"]), nll_random=np.asarray(r["nll_random"]),
                                   n=len(r["sink_heads"]), model=name, T=r["T"],
                                   dnll_sink=lambda r=r: Interval.from_dict(r["dnll_sink"]))
            head_ablation_figure(view, ax=axes[row, col], title=f"{name} (T={r['T']}, {ablation}-ablation)")
    return {"beyond_ablation.png": fig}

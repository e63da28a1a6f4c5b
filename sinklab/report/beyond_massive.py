"""Report section: massive activations (Sun et al., 2024) per model, from
:func:`sinklab.analysis.massive.massive_activations`."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict

import numpy as np

from ..analysis.massive import massive_activations
from ..analysis.stats import Interval, mean_ci
from ..prompts import load_passages
from ..viz.figure import Figure, subplots
from ..viz.figures_beyond import massive_activations_figure
from .core import num, pct_ci, table

TITLE = "Massive activations (Sun et al., 2024)"
SUMMARY = "massive activations (top \\|x\\| / median)"

# Sun et al. call an activation massive when its magnitude exceeds 100 and is about 1,000 times
# the median magnitude; both bars are applied to the lower ends of the intervals
MASSIVE_ABS, MASSIVE_RATIO, OUTLIER_RATIO = 100.0, 1000.0, 100.0


def settings(quick: bool) -> Dict[str, int]:
    return {"n_prompts": 16, "T": 64} if quick else {"n_prompts": 96, "T": 128}


def compute(model: Any, quick: bool, progress: bool) -> Dict[str, Any]:
    """Massive activations of ``model`` on the shipped passages, with the model's own ⟨bos⟩ rule
    (the tokenizer's default), at the stream with the largest top/median ratio and at the layer
    where position 0's norm jumps."""
    s = settings(quick)
    bos = bool(getattr(model.tokenizer, "add_bos_default", True))
    r = massive_activations(model, load_passages("sinks")[: s["n_prompts"]], T=s["T"], bos=bos,
                            skip_short=True, progress=progress)
    sm = r.summary()
    l = int(sm["max_ratio_layer"])
    top_abs = np.abs(r.top_value[:, l, 0])
    at0 = (r.top_pos[:, l, 0] == 0).astype(np.float64)
    freq = r.dim_frequency[l]
    j = int(np.argmax(freq))
    out = {"settings": {**s, "bos": bos, "n_kept": r.n_prompts}, "summary": sm,
           "ratio": r.ratio_ci(l).to_dict(), "top_abs": mean_ci(top_abs).to_dict(),
           "top_at_pos0": mean_ci(at0).to_dict(), "top_dim": j, "top_dim_frequency": float(freq[j]),
           "jump": r.jump_ci().to_dict(), "top_ratio": r.top_ratio, "top_at_bos": r.top_at_bos,
           "jump_layer": r.jump_layer, "writer": r.writer, "T": r.T, "model": r.model}
    if r.neurons is not None:
        share = r.neuron_share.mean(axis=0)
        out["neurons"] = {"ids": r.neurons.tolist(), "share": share.tolist(), "check": r.neuron_check,
                          "top_share": mean_ci(r.neuron_share[:, 0]).to_dict()}
    return out


def classify(res: Dict[str, Any]) -> str:
    """Sun et al.'s criterion on the lower ends of the intervals: ``"massive"``, ``"outliers"``
    (>= 100x the median but below their bar) or ``"none"``."""
    ratio, top = Interval.from_dict(res["ratio"]), Interval.from_dict(res["top_abs"])
    if ratio.lo >= MASSIVE_RATIO and top.lo > MASSIVE_ABS:
        return "massive"
    return "outliers" if ratio.lo >= OUTLIER_RATIO else "none"


def where(res: Dict[str, Any]) -> str:
    """Where the stream's largest entry sits: ``"position 0"`` (the interval of the share of
    prompts is above 1/2), ``"elsewhere"`` (below) or ``"position 0 or elsewhere"``."""
    iv = Interval.from_dict(res["top_at_pos0"])
    return "position 0" if iv.above(0.5) else "elsewhere" if iv.below(0.5) else "position 0 or elsewhere"


def reading(name: str, res: Dict[str, Any]) -> str:
    sm, kind = res["summary"], classify(res)
    ratio = Interval.from_dict(res["ratio"])
    what = {"massive": "massive activations by Sun et al.'s criterion (top |x| > 100 and ≥ 1,000× the median, "
                       "both at the intervals' lower ends)",
            "outliers": "outliers ≥ 100× the median, below Sun et al.'s bar for massive activations",
            "none": "no entry ≥ 100× the median (interval's lower end)"}[kind]
    jump = Interval.from_dict(res["jump"])
    text = (f"{name}: {what}; the largest sits in stream {sm['max_ratio_layer']} at {ratio.fmt('.0f')}× the median, "
            f"at {where(res)} (share of prompts {pct_ci(Interval.from_dict(res['top_at_pos0']))}), in dimension "
            f"{res['top_dim']} in {100 * res['top_dim_frequency']:.0f} % of prompts. Position 0's norm grows "
            f"×{jump.fmt('.1f')} through layer {res['jump_layer']}, whose {res['writer'].upper()} writes the larger "
            f"part (‖attn_out₀‖ {sm['attn_norm0']:.3g}, ‖mlp_out₀‖ {sm['mlp_norm0']:.3g})")
    if "neurons" in res:
        nr = res["neurons"]
        text += (f"; MLP neuron {nr['ids'][0]} alone writes {pct_ci(Interval.from_dict(nr['top_share']))} of that "
                 f"MLP output (neuron sum against the C capture: {nr['check']:.1e} relative)")
    return text + "."


def summary(res: Dict[str, Any]) -> str:
    """The reading in one table cell (the report's summary table)."""
    kind = {"massive": "yes", "outliers": "outliers only", "none": "no"}[classify(res)]
    return (f"{kind}: stream {res['summary']['max_ratio_layer']}, {Interval.from_dict(res['ratio']).fmt(',.0f')}×, "
            f"at {where(res)}, dimension {res['top_dim']}")

def markdown(results: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for name, r in results.items():
        sm = r["summary"]
        rows.append([name, "⟨bos⟩ + text" if r["settings"]["bos"] else "text only", str(r["settings"]["n_kept"]),
                     str(sm["max_ratio_layer"]), num(Interval.from_dict(r["ratio"]), ".0f"),
                     num(Interval.from_dict(r["top_abs"]), ".0f"), pct_ci(Interval.from_dict(r["top_at_pos0"]), ".0f"),
                     f"{r['top_dim']} ({100 * r['top_dim_frequency']:.0f} %)", str(r["jump_layer"]),
                     num(Interval.from_dict(r["jump"]), ".1f"), r["writer"], classify(r)])
    T = sorted({r["T"] for r in results.values()})
    return "\n\n".join([
        "**Question.** Which residual-stream entries are orders of magnitude larger than the rest, on which "
        "token and dimension, and which block writes them? Sun et al. (2024) found a few such *massive "
        "activations*, on the first token and a fixed dimension, acting as biases that the attention sink "
        "reads; the paper's §3 sees the sink as what keeps deep models from over-mixing.",
        f"**Here.** The shipped passages cut to T = {', '.join(map(str, T))} tokens, each model with its own ⟨bos⟩ "
        "rule (its tokenizer's default); per residual stream l (entering layer l), the largest |x| over the median "
        "|x| of its T × d entries. The ⟨bos⟩ norm jump is the layer that most multiplies position 0's norm; the "
        "writer the block (attention or MLP) with the larger output norm there; its neurons are recomputed in "
        "float64 from the weights and checked against the C capture. Differs from Sun et al.: short passages, "
        "one prompt set, small models.",
        table(["model", "input", "prompts", "stream", "top / median", "top |x|", "top at position 0",
               "dimension (prompts)", "jump layer", "norm jump ×", "writer", "criterion"], rows),
        "**Reading.** " + " ".join(reading(n, r) for n, r in results.items())])


def figures(results: Dict[str, Dict[str, Any]]) -> Dict[str, Figure]:
    n = len(results)
    fig, axes = subplots(1, n, figsize=(5.2 * n, 4.0), layout="constrained", squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        view = SimpleNamespace(top_ratio=np.asarray(r["top_ratio"], np.float64), top_at_bos=np.asarray(r["top_at_bos"]),
                               jump_layer=r["jump_layer"], writer=r["writer"], model=name, T=r["T"])
        massive_activations_figure(view, ax=ax)
    return {"beyond_massive.png": fig}

"""Report section: the sink key's geometry (norm against angle) per model, from
:func:`sinklab.analysis.key_geometry.key_geometry`."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict

import numpy as np

from ..analysis.key_geometry import key_geometry
from ..analysis.stats import Interval, mean_ci
from ..prompts import load_passages
from ..viz.figure import Figure, subplots
from ..viz.figures_beyond import sink_map_figure
from .core import num, table

TITLE = "The sink key's geometry: norm or angle"
SUMMARY = "sink key: norm or angle"

EPS = 0.3  # a sink head: mean a_0 over prompts above this (the paper's ε for Table 1)


def settings(quick: bool) -> Dict[str, int]:
    return {"n_prompts": 16, "T": 64} if quick else {"n_prompts": 96, "T": 128}


def compute(model: Any, quick: bool, progress: bool) -> Dict[str, Any]:
    """Per (layer, head) the split of the sink logit gap Δ = S_0 − S_1 into a norm term and an
    angle term, on the shipped passages with the model's own ⟨bos⟩ rule; summarised over the sink
    heads (mean a_0 > :data:`EPS`)."""
    s = settings(quick)
    bos = bool(getattr(model.tokenizer, "add_bos_default", True))
    kg = key_geometry(model, load_passages("sinks")[: s["n_prompts"]], T=s["T"], bos=bos, skip_short=True,
                      progress=progress)
    sink = kg.a0.mean(axis=0) > EPS                       # (L, H)
    out: Dict[str, Any] = {"settings": {**s, "bos": bos, "n_kept": kg.n_prompts, "eps": EPS},
                           "n_heads": int(sink.size), "n_sink_heads": int(sink.sum()),
                           "a0_map": kg.a0.mean(axis=0), "norm_ratio_map": kg.norm_ratio.mean(axis=0),
                           "T": kg.T, "strongest": kg.summary()["strongest"]}
    if sink.any():
        out.update(norm_share=mean_ci(kg.norm_share[:, sink]).to_dict(),
                   gap=mean_ci(kg.gap[:, sink]).to_dict(), norm_term=mean_ci(kg.norm_term[:, sink]).to_dict(),
                   angle_term=mean_ci(kg.angle_term[:, sink]).to_dict(),
                   norm_ratio=mean_ci(kg.norm_ratio[:, sink]).to_dict(),
                   cos_gap=mean_ci(kg.cos_gap[:, sink]).to_dict())
    return out


def winner(res: Dict[str, Any]) -> str:
    """What wins the sink heads' logit gap: ``"norm"`` (the norm share's interval is above 1/2),
    ``"angle"`` (below), ``"both"`` (it contains 1/2) or ``"no sink heads"``."""
    if not res["n_sink_heads"]:
        return "no sink heads"
    iv = Interval.from_dict(res["norm_share"])
    return "norm" if iv.above(0.5) else "angle" if iv.below(0.5) else "both"


def reading(name: str, res: Dict[str, Any]) -> str:
    w = winner(res)
    if w == "no sink heads":
        return f"{name}: no head has mean a₀ > {EPS} at T = {res['T']}, so there is no sink logit gap to split."
    share = Interval.from_dict(res["norm_share"])
    gap, ratio = Interval.from_dict(res["gap"]), Interval.from_dict(res["norm_ratio"])
    how = {"norm": "mostly by the sink key's norm", "angle": "mostly by its angle to the queries",
           "both": "by norm and angle alike (the norm share's interval contains 1/2)"}[w]
    norm = Interval.from_dict(res["norm_term"])
    sign = (f"; its {'smaller' if ratio.below(1) else 'larger'} norm {'costs' if norm.below(0) else 'adds'} "
            f"{abs(norm.value):.2f} nats" if norm.excludes(0) else "")
    return (f"{name}: over its {res['n_sink_heads']} sink heads of {res['n_heads']}, the sink key wins a logit gap of "
            f"{gap.fmt('.2f')} nats {how}: norm share {share.fmt('.2f')}, ‖k₀‖ / mean ‖kⱼ‖ = {ratio.fmt('.2f')}, "
            f"cosine gap {Interval.from_dict(res['cos_gap']).fmt('.2f')}{sign}.")


def summary(res: Dict[str, Any]) -> str:
    """The reading in one table cell (the report's summary table)."""
    w = winner(res)
    if w == "no sink heads":
        return "no sink heads"
    return (f"{w} (norm share {Interval.from_dict(res['norm_share']).fmt('.2f')}; ‖k₀‖ "
            f"{Interval.from_dict(res['norm_ratio']).fmt('.2f')} of the others')")

def markdown(results: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for name, r in results.items():
        has = bool(r["n_sink_heads"])
        g = (lambda k, f=".2f": num(Interval.from_dict(r[k]), f) if has else "—")  # noqa: E731
        rows.append([name, "⟨bos⟩ + text" if r["settings"]["bos"] else "text only", str(r["settings"]["n_kept"]),
                     f"{r['n_sink_heads']} / {r['n_heads']}", g("gap"), g("norm_term"), g("angle_term"),
                     g("norm_share"), g("norm_ratio"), g("cos_gap"), winner(r)])
    T = sorted({r["T"] for r in results.values()})
    return "\n\n".join([
        "**Question.** Is a head's attention to position 0 won by the *norm* of the sink key k₀ or by its "
        "*angle* to the queries? Studies of sinks report small-norm, query-orthogonal sink keys in some models "
        "and large keys in others; the paper's §3 asks only that the sink exist.",
        f"**Here.** The shipped passages at T = {', '.join(map(str, T))}, each model with its own ⟨bos⟩ rule; queries "
        "and keys as the C core captures them (after RoPE and QK-norm). Per head, the mean logit gap Δ = S₀ − S₁ of "
        "the sink key over the other keys splits exactly into a norm term (n₀ − N₁)·C₀ and an angle term "
        f"N₁·(C₀ − C₁) (sinklab.analysis.key_geometry); the norm share is |norm| / (|norm| + |angle|). Sink heads: "
        f"mean a₀ > {EPS}. Intervals over prompts, the heads' numbers averaged within each prompt.",
        table(["model", "input", "prompts", "sink heads", "gap Δ (nats)", "norm term", "angle term", "norm share",
               "‖k₀‖ / ‖kⱼ‖", "cosine gap", "won by"], rows),
        "**Reading.** " + " ".join(reading(n, r) for n, r in results.items())])


def figures(results: Dict[str, Dict[str, Any]]) -> Dict[str, Figure]:
    n = len(results)
    H = max(np.asarray(r["a0_map"]).shape[1] for r in results.values())
    L = max(np.asarray(r["a0_map"]).shape[0] for r in results.values())
    fig, axes = subplots(1, n, figsize=(n * (1.6 + 0.45 * H), 1.4 + 0.22 * L), layout="constrained", squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        view = SimpleNamespace(a0=np.asarray(r["a0_map"], np.float64)[None],
                               norm_ratio=np.asarray(r["norm_ratio_map"], np.float64)[None], model=name, T=r["T"])
        sink_map_figure(view, ax=ax, title=f"{name} (T={r['T']})")
    return {"beyond_key_geometry.png": fig}

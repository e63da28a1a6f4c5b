"""Verdicts and readings of the pre-training experiments in miniature (Fig. 5, Table 2), computed
from the per-seed numbers of their summaries (:mod:`.experiments`) with the shared rules of
:mod:`sinklab.analysis.status` and the intervals of :mod:`sinklab.analysis.stats`.

The criteria were written from the paper's claims (§5, Table 2, Fig. 5 and Appendix A) before any
result was read, and their thresholds are fixed here, not fitted:

* **Fig. 5** (:func:`criterion_fig5`): "longer pre-training contexts form more sinks". Effect:
  per seed s, the final ε = 0.3 sink rate at the longest context minus at the shortest (seed s
  with seed s), its t interval over seeds. reproduced only when that interval lies above 0 *and*
  at least one context has sinks (the t interval of its final sink rate lies above 0);
  contradicted when the interval lies below 0; inconclusive otherwise. When no head crossed
  ε = 0.3 in any seed at any context and evaluation, inconclusive with the reason "no head
  crossed ε in any seed": a null where the model is too small to form sinks tests nothing.
  "Comparable validation losses" (:func:`criterion_fig5_loss`) is judged apart, by
  equivalence of the longest-minus-shortest loss within ±5 % of the shortest context's loss.
* **Table 2** (:func:`table2_claims`, :func:`criterion_table2` combining them), per claim:

  (a) a model trained with a fixed ⟨bos⟩ relies on it, for each masking:
      *loss*: the change when ⟨bos⟩ is removed at inference (text only minus ⟨bos⟩+text, the
      same model, per seed) must have an interval at or above :data:`RELIANCE_NATS` (0.5
      nats, a tenth of the paper's +4.87/+5.11; a perplexity ratio of 1.65) for reproduced;
      above 0 but not that large is "direction only" (inconclusive); below 0 contradicted.
      *sink*: the with-⟨bos⟩ sink rate's interval above 0 and the change's interval below 0
      (the sink collapses without ⟨bos⟩) for reproduced; a change whose interval lies above 0
      (more sinks without ⟨bos⟩) is the reverse effect: contradicted.
  (b) a model trained without a fixed ⟨bos⟩ (causal, the paper's only such row evaluated both
      ways) barely changes: equivalence of the loss change within ±:data:`NO_EFFECT_NATS`
      (0.05 nats; paper +0.01) and of the sink-rate change within ±:data:`NO_EFFECT_SINK_PP`
      (5 percentage points; paper +0.05); beyond the margin contradicted, and the reason says
      which way (more sinks without ⟨bos⟩ is a reverse effect).

  Every sink claim with no head above ε = 0.3 in any seed is inconclusive ("no head crossed ε
  in any seed").

The readings (:func:`fig5_reading`, :func:`table2_reading`) turn the same numbers into sentences:
a trend or difference is named only when its interval excludes zero, otherwise "no detectable
effect (±x)" (:func:`sinklab.analysis.stats.describe_difference`). Each returns
``(text, numbers, verdict)``. They also read summaries written before seeds were added (one
seed: no interval, so every verdict is inconclusive).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..analysis import status as S
from ..analysis.status import Verdict
from ..analysis.stats import Interval, SeedSummary, describe_difference, over_seeds
from ..viz.reference import sink_T, uniform_first_importance

EPS = 0.3                       # the sink threshold the criteria judge (Gu et al.'s default)
RELIANCE_NATS = 0.5             # (a) loss: the size of effect counted as "relies on ⟨bos⟩"
NO_EFFECT_NATS = 0.05           # (b) loss: the equivalence margin of "no change"
NO_EFFECT_SINK_PP = 5.0         # (b) sink rate: the equivalence margin, percentage points
LOSS_COMPARABLE_FRACTION = 0.05  # Fig. 5 losses "comparable": within ±5 % of the shortest context's
NO_SINKS = "no head crossed ε = {eps:g} in any seed"

# The paper's Table 2 (~120M LLaMA-2-style models, 30B tokens): (masking, fixed ⟨bos⟩ in training,
# inference) -> (sink rate %, validation loss). Its intra-document model without a fixed ⟨bos⟩
# has no ⟨bos⟩+text row (it never saw one).
PAPER_TABLE2: List[Tuple[str, bool, str, float, float]] = [
    ("causal", False, "bos", 65.10, 2.69), ("causal", False, "text", 65.15, 2.70),
    ("causal", True, "bos", 90.84, 2.69), ("causal", True, "text", 0.05, 7.56),
    ("intra_doc", False, "text", 28.23, 2.67),
    ("intra_doc", True, "bos", 90.56, 2.67), ("intra_doc", True, "text", 0.00, 7.78)]

PAPER_ROWS = {(m, b, i): (sink, loss) for m, b, i, sink, loss in PAPER_TABLE2}


# ------------------------------------------------------------------------------ numbers
def seed_stats(values: Optional[Sequence[Optional[float]]], scale: float = 1.0) -> Optional[SeedSummary]:
    """Mean ± sd and t interval over seeds of ``values`` × ``scale``, or None when there are no
    values or a seed lacks its value."""
    present = [scale * float(v) for v in values or () if v is not None]
    if not present or len(present) != len(values or ()):
        return None
    return over_seeds(present)


def seed_interval(values: Optional[Sequence[Optional[float]]], scale: float = 1.0) -> Interval:
    """The t interval of the mean over seeds (:func:`seed_stats`); all-NaN with n = 0 when a
    seed lacks its value, which every criterion reads as inconclusive."""
    s = seed_stats(values, scale)
    if s is None:
        nan = float("nan")
        return Interval(nan, nan, nan, 0, method="t")
    return s.interval


def mean_pm_sd(s: Optional[SeedSummary], spec: str = ".3f", unit: str = "") -> str:
    """"mean ± sd{unit}" of a :func:`seed_stats` (just the mean for one seed; "–" for None); a
    sign in ``spec`` applies to the mean only."""
    if s is None:
        return "–"
    return (f"{format(s.mean, spec)} ± {format(s.sd, spec.replace('+', ''))}{unit}" if s.n > 1
            else f"{format(s.mean, spec)}{unit}")


def seeds_phrase(counts: Sequence[Tuple[str, int]]) -> str:
    """How many seeds a reading's numbers rest on: ``"3 seeds"`` when every group (a context, a
    row, a depth) has as many, else ``"2–3 seeds (C = 128: 2, C = 256: 3)"``, so a campaign still
    under way is never described by its most complete group. ``counts``: (group label, seeds)."""
    ns = sorted({int(n) for _, n in counts})
    if not ns:
        return "no seeds"
    if len(ns) == 1:
        return f"{ns[0]} seed{'s' if ns[0] != 1 else ''}"
    return f"{ns[0]}–{ns[-1]} seeds (" + ", ".join(f"{label}: {n}" for label, n in counts) + ")"


def _uniform(context: int) -> float:
    return uniform_first_importance(sink_T(context))


def fig5_finals(summary: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per context (ascending): ``{"context", "seeds", "values": {name: per-seed final values},
    "peak" (largest ε 0.3 sink rate at any evaluation of any seed), "evaluations", "tokens"}``,
    from a summary with seeds or one written before them (one seed)."""
    out = []
    for r in sorted(summary["runs"], key=lambda r: r["context"]):
        if "final_per_seed" in r:
            vals = dict(r["final_per_seed"])
            seeds = list(r["seeds"])
        else:
            vals = {k: [r[k][-1]] for k in ("sink_0.3", "sink_0.8", "importance", "val_loss")}
            u = _uniform(r["context"])
            vals["importance_over_uniform"] = [None if v is None else v / u for v in vals["importance"]]
            seeds = [0]
        peak = r.get(f"peak_sink_{EPS:g}")
        if peak is None:
            series = [v for v in r.get(f"sink_{EPS:g}", []) if v is not None]
            peak = max(series) if series else 0.0
        out.append({"context": r["context"], "seeds": seeds, "values": vals, "peak": float(peak),
                    "evaluations": len(r.get("tokens", [])), "tokens": (r.get("tokens") or [None])[-1]})
    return out


def _paired(a: Dict[str, Any], b: Dict[str, Any], key: str) -> List[Optional[float]]:
    """b − a per seed present in both (seed s with seed s)."""
    va = dict(zip(a["seeds"], a["values"][key]))
    vb = dict(zip(b["seeds"], b["values"][key]))
    return [None if va[s] is None or vb[s] is None else vb[s] - va[s] for s in a["seeds"] if s in vb]


def _rows(summary: Dict[str, Any]) -> Dict[Tuple[str, bool, str], Dict[str, Any]]:
    """(masking, fixed ⟨bos⟩, inference) -> {"seeds", "values": {name: per-seed}} (sink in %)."""
    out = {}
    for r in summary["rows"]:
        if "per_seed" in r:
            vals, seeds = dict(r["per_seed"]), list(r["seeds"])
        else:
            vals = {k: [r.get(k)] for k in ("sink_0.3", "sink_0.8", "importance", "val_loss")}
            seeds = [0]
        if "importance_over_uniform" not in vals:
            u = r.get("uniform_importance") or _uniform(64)
            vals["importance_over_uniform"] = [None if v is None else v / u for v in vals["importance"]]
        out[(r["masking"], r["fixed_bos"], r["inference"])] = {"seeds": seeds, "values": vals}
    return out


def bos_removed(summary: Dict[str, Any], masking: str, fixed_bos: bool, key: str) -> Optional[List[Optional[float]]]:
    """Per seed, text only minus ⟨bos⟩+text of ``key`` for one training condition (the same
    model and seed), or None when the summary lacks either row."""
    rows = _rows(summary)
    b, t = rows.get((masking, fixed_bos, "bos")), rows.get((masking, fixed_bos, "text"))
    if b is None or t is None:
        return None
    return _paired(b, t, key)


# ------------------------------------------------------------------------------ Fig. 5
FIG5_RULE = (f"per seed, the final ε = {EPS:g} sink rate at the longest context minus at the shortest (seed with "
             f"seed); reproduced if its 95% t interval over seeds lies above 0 and at least one context's sink-rate "
             f"interval lies above 0, contradicted if it lies below 0, else inconclusive; inconclusive when no head "
             f"crossed ε in any seed (no sinks: the null tests nothing)")


def criterion_fig5(summary: Dict[str, Any]) -> Verdict:
    """"Longer pre-training contexts form more sinks" (the paper's Fig. 5), by the rule in the
    module docstring; the reason ends with the loss comparison (:func:`criterion_fig5_loss`),
    which does not change the status."""
    runs = fig5_finals(summary)
    if len(runs) < 2:
        return S.not_testable("Fig. 5 needs at least two training contexts", FIG5_RULE)
    lo, hi = runs[0], runs[-1]
    key = f"sink_{EPS:g}"
    d = _paired(lo, hi, key)
    iv = seed_interval(d).scaled(100)
    what = f"sink rate at C = {hi['context']} minus at C = {lo['context']} (percentage points, ε = {EPS:g})"
    finals = {r["context"]: seed_stats(r["values"][key]) for r in runs}
    nums: Dict[str, Any] = {"effect": iv, "contexts": [r["context"] for r in runs], "n_seeds": len(d),
                            "peak_sink": max(r["peak"] for r in runs),
                            "final_sink": {str(C): (None if s is None else s.to_dict()) for C, s in finals.items()}}
    loss = criterion_fig5_loss(summary)
    tail = f"; validation losses ({loss.status}): {loss.reason}"
    if nums["peak_sink"] <= 0:
        n_ev = sum(r["evaluations"] for r in runs)
        return S.Verdict(S.INCONCLUSIVE, NO_SINKS.format(eps=EPS) + f" at any of the {len(runs)} contexts or "
                         f"{n_ev} evaluations per seed: no sinks formed at this scale, so a null here tests nothing"
                         + tail, FIG5_RULE, nums)
    v = S.directional(iv, +1, what, spec=".2f", criterion=FIG5_RULE)
    if v.status == S.REPRODUCED:
        formed = [C for C, s in finals.items() if s is not None and s.interval.above(0)]
        if not formed:
            return S.Verdict(S.INCONCLUSIVE, v.reason.replace(" as the paper predicts", "") + ", but no context's "
                             "sink-rate interval lies above 0 (sinks not established at any context)" + tail,
                             FIG5_RULE, nums)
        return S.Verdict(S.REPRODUCED, v.reason + f"; sinks established at C = {', '.join(map(str, formed))}" + tail,
                         FIG5_RULE, nums)
    if v.status == S.CONTRADICTED:
        return S.Verdict(S.CONTRADICTED, v.reason + " (fewer sinks at the longest context)" + tail, FIG5_RULE, nums)
    return S.Verdict(v.status, v.reason + tail, FIG5_RULE, nums)


def fig5_loss_key(runs: Sequence[Dict[str, Any]]) -> str:
    """``"val_loss_common"`` (every context's model on the targets they all share) when every
    run has it, else ``"val_loss"`` (each on its own first C - 1 tokens, a summary from before)."""
    ok = all(r["values"].get("val_loss_common") and None not in r["values"]["val_loss_common"] for r in runs)
    return "val_loss_common" if ok else "val_loss"


def criterion_fig5_loss(summary: Dict[str, Any]) -> Verdict:
    """"Validation losses are comparable across contexts": equivalence of the final loss at
    the longest context minus at the shortest (seed with seed) within ±5 % of the shortest
    context's mean loss."""
    runs = fig5_finals(summary)
    if len(runs) < 2:
        return S.not_testable("needs at least two training contexts")
    lo, hi = runs[0], runs[-1]
    key = fig5_loss_key(runs)
    d = _paired(lo, hi, key)
    base = seed_stats(lo["values"][key])
    margin = LOSS_COMPARABLE_FRACTION * (base.mean if base is not None else float("nan"))
    where = " on the same targets" if key == "val_loss_common" else ", each context on its own targets"
    return S.equivalence(seed_interval(d), round(margin, 4), f"val loss at C = {hi['context']} minus at C = {lo['context']} "
                         f"(nats{where})", criterion=f"reproduced if the 95% t interval over seeds of the longest-minus-"
                         f"shortest final validation loss lies within ±{LOSS_COMPARABLE_FRACTION:.0%} of the "
                         f"shortest context's loss, contradicted if wholly outside, else inconclusive")


def _vs_uniform(s: Optional[SeedSummary]) -> str:
    """a₀ over uniform attention's a₀: named above/below only when its interval excludes 1."""
    if s is None:
        return "–"
    iv = s.interval
    if not iv.defined:
        return f"{s.mean:.2f}× uniform (one seed: no interval)"
    shown = f"{s.mean:.2f}× uniform [{iv.lo:.2f}, {iv.hi:.2f}]"
    if iv.above(1):
        return f"{shown}: above it"
    if iv.below(1):
        return f"{shown}: below it"
    return f"{s.mean:.2f}× uniform: not detectably different from it (±{iv.half_width:.2f})"


def fig5_reading(summary: Dict[str, Any],
                 params: Optional[Dict[str, int]] = None) -> Tuple[str, Dict[str, Any], Verdict]:
    """Sentences on the Fig. 5 numbers (end of training, over seeds), the numbers they rest on,
    and :func:`criterion_fig5`'s verdict. ``params`` (optional, ``{"params": count}``): the
    model's size, named where no sinks formed."""
    runs = fig5_finals(summary)
    verdict = criterion_fig5(summary)
    n = max(len(r["seeds"]) for r in runs)
    key = f"sink_{EPS:g}"
    sinks = {r["context"]: seed_stats(r["values"][key]) for r in runs}
    ratio = {r["context"]: seed_stats(r["values"]["importance_over_uniform"]) for r in runs}
    lkey = fig5_loss_key(runs)
    loss = {r["context"]: seed_stats(r["values"][lkey]) for r in runs}
    seeds = seeds_phrase([(f"C = {r['context']}", len(r["seeds"])) for r in runs])
    tokens = runs[0]["tokens"]
    parts = []
    scaled = {C: (None if s is None else over_seeds([100 * v for v in s.values])) for C, s in sinks.items()}
    peak = max(r["peak"] for r in runs)
    if peak <= 0:
        parts.append(f"No head crossed ε = {EPS:g} in any seed at any context ({seeds}; "
                     + ", ".join(f"C = {r['context']}" for r in runs) + "): no sinks formed at this scale"
                     + (f" ({tokens:,} tokens per run" if tokens else "")
                     + (f", {params['params'] / 1e6:.1f}M parameters" if params and tokens else "")
                     + (")" if tokens else "") + ", so Fig. 5's growth of sinks with the training context is not "
                     "tested here.")
    else:
        parts.append(f"Final ε = {EPS:g} sink rate over {seeds} (mean ± sd)"
                     + (f" after {tokens:,} tokens per run" if tokens else "") + ": "
                     + ", ".join(f"{mean_pm_sd(scaled[C], '.2f', '%')} at C = {C}" for C in scaled) + ".")
    nums: Dict[str, Any] = {"contexts": [r["context"] for r in runs], "n_seeds": n, "tokens_per_run": tokens,
                            "sinks_formed": bool(peak > 0), "peak_sink_0.3": peak,
                            "final_sink_0.3": {str(C): (None if s is None else s.to_dict()) for C, s in scaled.items()},
                            "final_importance_over_uniform": {str(C): (None if s is None else s.to_dict())
                                                              for C, s in ratio.items()},
                            "final_val_loss": {str(C): (None if s is None else s.to_dict()) for C, s in loss.items()}}
    if len(runs) >= 2:
        lo, hi = runs[0], runs[-1]
        pair = f"C = {hi['context']} minus C = {lo['context']}, seed with seed"
        diffs = {}
        for k, scale, spec, unit, what in ((key, 100.0, ".2f", " pp", "difference"),
                                           ("importance_over_uniform", 1.0, ".3f", "", "difference"),
                                           (lkey, 1.0, ".3f", " nats", "difference")):
            d = _paired(lo, hi, k)
            iv = seed_interval(d)
            iv = iv.scaled(scale) if iv.n and scale != 1.0 else iv
            diffs[k] = iv
            nums[f"longest_minus_shortest_{k}"] = iv.to_dict()
        if peak > 0:
            parts.append(f"Longest minus shortest context ({pair}): sink rate "
                         + describe_difference(diffs[key], "difference", ".2f", " pp") + ".")
        parts.append("Mean first-token importance a₀ at the end of training, over uniform attention's a₀ on the same "
                     "tokens: " + "; ".join(f"C = {C}: {_vs_uniform(s)}" for C, s in ratio.items())
                     + "; longest minus shortest: "
                     + describe_difference(diffs["importance_over_uniform"], "difference") + ".")
        lv = criterion_fig5_loss(summary)
        where = (f"on the same targets, each held-out document's first {summary.get('common_target_tokens', '?')} "
                 "tokens" if lkey == "val_loss_common" else "each context on its own first C - 1 tokens")
        parts.append(f"Final validation loss (nats, {where}): "
                     + ", ".join(f"{mean_pm_sd(s)} at C = {C}" for C, s in loss.items())
                     + "; longest minus shortest: " + describe_difference(diffs[lkey], "difference", ".3f", " nats")
                     + f" (comparable within ±{LOSS_COMPARABLE_FRACTION:.0%}: {lv.status}).")
        nums["loss_verdict"] = lv.to_dict()
    parts.append(f"Verdict on \"longer contexts form more sinks\": {verdict.status}.")
    nums["verdict"] = verdict.to_dict()
    return " ".join(parts), nums, verdict


# ------------------------------------------------------------------------------ Table 2
def _reliance_loss(d: Optional[List[Optional[float]]], masking: str) -> Verdict:
    rule = (f"text-only minus ⟨bos⟩+text validation loss of the fixed-⟨bos⟩ {masking} model, per seed: reproduced "
            f"if its 95% t interval lies at or above {RELIANCE_NATS:g} nats, 'direction only' (inconclusive) if it "
            f"lies above 0 but wholly below {RELIANCE_NATS:g}, contradicted if it lies below 0 (the loss falls without "
            f"⟨bos⟩), else inconclusive")
    p = PAPER_ROWS[(masking, True, "text")][1] - PAPER_ROWS[(masking, True, "bos")][1]
    if d is None:
        return S.not_testable(f"no fixed-⟨bos⟩ {masking} run evaluated both ways", rule)
    iv = seed_interval(d)
    what = f"loss change without ⟨bos⟩ ({masking.replace('_', '-')}, fixed ⟨bos⟩; nats)"
    v = S.threshold(iv, RELIANCE_NATS, 0.0, what, criterion=rule)
    if v.status == S.REPRODUCED or not iv.defined:
        return S.Verdict(v.status, v.reason + f" (paper {p:+.2f})", rule, v.numbers)
    if iv.below(0):
        return S.Verdict(S.CONTRADICTED, f"{what} = {iv.fmt()}: the loss falls without ⟨bos⟩, the reverse of the "
                         f"paper's {p:+.2f}", rule, v.numbers)
    if iv.above(0) and iv.hi < RELIANCE_NATS:
        return S.Verdict(S.INCONCLUSIVE, f"direction only: {what} = {iv.fmt()} lies above 0 but wholly below the "
                         f"{RELIANCE_NATS:g} nats counted as reliance (paper {p:+.2f})", rule, v.numbers)
    if iv.above(0):
        return S.Verdict(S.INCONCLUSIVE, f"{what} = {iv.fmt()} lies above 0, but the interval straddles "
                         f"{RELIANCE_NATS:g} nats, the size counted as reliance (paper {p:+.2f})", rule, v.numbers)
    return S.Verdict(S.INCONCLUSIVE, f"{what} = {iv.fmt()}: the interval includes 0 (paper {p:+.2f})", rule, v.numbers)


def _sink_collapse(bos: Optional[List[Optional[float]]], d: Optional[List[Optional[float]]], peak: float,
                   masking: str) -> Verdict:
    rule = (f"ε = {EPS:g} sink rate of the fixed-⟨bos⟩ {masking} model: reproduced if the with-⟨bos⟩ rate's 95% t "
            f"interval lies above 0 and the change without ⟨bos⟩ (per seed) lies below 0; contradicted if the change "
            f"lies above 0 (more sinks without ⟨bos⟩, the reverse effect); inconclusive otherwise, and when no head "
            f"crossed ε in any seed")
    pb, pt = PAPER_ROWS[(masking, True, "bos")][0], PAPER_ROWS[(masking, True, "text")][0]
    if bos is None or d is None:
        return S.not_testable(f"no fixed-⟨bos⟩ {masking} run evaluated both ways", rule)
    ivd, ivb = seed_interval(d), seed_interval(bos)
    m = masking.replace("_", "-")
    nums = {"effect": ivd, "with_bos": ivb, "peak": peak}
    paper = f"(paper {pb:.2f}% → {pt:.2f}%)"
    if ivd.above(0):
        return S.Verdict(S.CONTRADICTED, f"reverse effect: the fixed-⟨bos⟩ {m} model has more sinks without ⟨bos⟩ than "
                         f"with it (change {ivd.fmt('.2f')} pp, with ⟨bos⟩ {ivb.fmt('.2f')}%) {paper}", rule, nums)
    if peak <= 0:
        return S.Verdict(S.INCONCLUSIVE, NO_SINKS.format(eps=EPS) + f" of the fixed-⟨bos⟩ {m} model, with or without "
                         f"⟨bos⟩: no sinks formed, so their collapse is not tested {paper}", rule, nums)
    if not ivd.defined:
        return S.Verdict(S.INCONCLUSIVE, f"sink-rate change without ⟨bos⟩ ({m}) = {ivd.fmt('.2f')} pp has no interval "
                         f"({ivd.n} seed{'s' if ivd.n != 1 else ''})", rule, nums)
    if ivb.above(0) and ivd.below(0):
        return S.Verdict(S.REPRODUCED, f"the fixed-⟨bos⟩ {m} model's sinks ({ivb.fmt('.2f')}% with ⟨bos⟩) fall by "
                         f"{ivd.fmt('.2f')} pp without it {paper}", rule, nums)
    why = ("the with-⟨bos⟩ sink rate's interval includes 0" if not ivb.above(0) else
           "the change's interval includes 0")
    return S.Verdict(S.INCONCLUSIVE, f"sink rate of the fixed-⟨bos⟩ {m} model {ivb.fmt('.2f')}% with ⟨bos⟩, change "
                     f"without it {ivd.fmt('.2f')} pp: {why} {paper}", rule, nums)


def _no_fixed_loss(d: Optional[List[Optional[float]]], masking: str) -> Verdict:
    rule = (f"text-only minus ⟨bos⟩+text validation loss of the {masking} model trained without a fixed ⟨bos⟩: "
            f"reproduced if its 95% t interval lies within ±{NO_EFFECT_NATS:g} nats, contradicted if wholly outside, "
            f"else inconclusive")
    if d is None:
        return S.not_testable(f"no {masking} model without a fixed ⟨bos⟩ evaluated both ways", rule)
    iv = seed_interval(d)
    what = f"loss change without ⟨bos⟩ ({masking.replace('_', '-')}, no fixed ⟨bos⟩; nats)"
    v = S.equivalence(iv, NO_EFFECT_NATS, what, criterion=rule)
    p = PAPER_ROWS[(masking, False, "text")][1] - PAPER_ROWS[(masking, False, "bos")][1]
    extra = ""
    if v.status == S.CONTRADICTED:
        extra = "; the loss rises without ⟨bos⟩" if iv.lo > 0 else "; the loss falls without ⟨bos⟩"
    return S.Verdict(v.status, v.reason + extra + f" (paper {p:+.2f})", rule, v.numbers)


def _no_fixed_sink(d: Optional[List[Optional[float]]], peak: float, masking: str) -> Verdict:
    rule = (f"ε = {EPS:g} sink-rate change without ⟨bos⟩ of the {masking} model trained without a fixed ⟨bos⟩: "
            f"reproduced if its 95% t interval lies within ±{NO_EFFECT_SINK_PP:g} percentage points, contradicted if "
            f"wholly outside (the reason says which way), else inconclusive; inconclusive when no head crossed ε in "
            f"any seed")
    if d is None:
        return S.not_testable(f"no {masking} model without a fixed ⟨bos⟩ evaluated both ways", rule)
    iv = seed_interval(d)
    m = masking.replace("_", "-")
    p = PAPER_ROWS[(masking, False, "text")][0] - PAPER_ROWS[(masking, False, "bos")][0]
    if peak <= 0:
        return S.Verdict(S.INCONCLUSIVE, NO_SINKS.format(eps=EPS) + f" of the {m} model without a fixed ⟨bos⟩, with or "
                         f"without ⟨bos⟩: no sinks formed, so 'the sink forms on the first token whatever it is' is "
                         f"not tested", rule, {"effect": iv, "peak": peak})
    what = f"sink-rate change without ⟨bos⟩ ({m}, no fixed ⟨bos⟩; pp)"
    v = S.equivalence(iv, NO_EFFECT_SINK_PP, what, spec=".2f", criterion=rule)
    extra = ""
    if v.status == S.CONTRADICTED:
        extra = ("; more sinks without ⟨bos⟩: a reverse effect" if iv.lo > 0 else
                 "; fewer sinks without ⟨bos⟩: the model relies on a ⟨bos⟩ it was not trained with")
    return S.Verdict(v.status, v.reason + extra + f" (paper {p:+.2f})", rule, v.numbers)


def _peak(summary: Dict[str, Any], masking: str, fixed_bos: bool) -> float:
    rows = _rows(summary)
    vals = [v for mode in ("bos", "text") if (masking, fixed_bos, mode) in rows
            for v in rows[(masking, fixed_bos, mode)]["values"][f"sink_{EPS:g}"] if v is not None]
    return max(vals) if vals else 0.0


def table2_claims(summary: Dict[str, Any]) -> Dict[str, Verdict]:
    """One verdict per claim of the paper's Table 2 (module docstring): ``reliance_loss_{m}``
    and ``sink_collapse_{m}`` for m in causal, intra_doc (claim a), ``no_fixed_bos_loss_causal``
    and ``no_fixed_bos_sink_causal`` (claim b)."""
    rows = _rows(summary)
    key = f"sink_{EPS:g}"
    out: Dict[str, Verdict] = {}
    for m in ("causal", "intra_doc"):
        out[f"reliance_loss_{m}"] = _reliance_loss(bos_removed(summary, m, True, "val_loss"), m)
        b = rows.get((m, True, "bos"))
        out[f"sink_collapse_{m}"] = _sink_collapse(None if b is None else b["values"][key],
                                                   bos_removed(summary, m, True, key), _peak(summary, m, True), m)
    out["no_fixed_bos_loss_causal"] = _no_fixed_loss(bos_removed(summary, "causal", False, "val_loss"), "causal")
    out["no_fixed_bos_sink_causal"] = _no_fixed_sink(bos_removed(summary, "causal", False, key),
                                                     _peak(summary, "causal", False), "causal")
    return out


def criterion_table2(summary: Dict[str, Any]) -> Verdict:
    """All of Table 2's claims (:func:`table2_claims`) combined by :func:`status.combine`: every
    claim reproduced → reproduced, any contradicted → contradicted, else inconclusive."""
    return S.combine(*table2_claims(summary).values(), what="Table 2")


CLAIM_NAMES = {"reliance_loss_causal": "(a) causal, fixed ⟨bos⟩: loss without it",
               "sink_collapse_causal": "(a) causal, fixed ⟨bos⟩: sinks without it",
               "reliance_loss_intra_doc": "(a) intra-doc, fixed ⟨bos⟩: loss without it",
               "sink_collapse_intra_doc": "(a) intra-doc, fixed ⟨bos⟩: sinks without it",
               "no_fixed_bos_loss_causal": "(b) causal, no fixed ⟨bos⟩: loss without it",
               "no_fixed_bos_sink_causal": "(b) causal, no fixed ⟨bos⟩: sinks without it"}


def table2_reading(summary: Dict[str, Any]) -> Tuple[str, Dict[str, Any], Verdict]:
    """Sentences on the Table 2 numbers (end of training, over seeds), the numbers they rest on
    and :func:`criterion_table2`'s verdict (``numbers["claims"]``: each claim's verdict)."""
    rows = _rows(summary)
    claims = table2_claims(summary)
    verdict = S.combine(*claims.values(), what="Table 2")
    key = f"sink_{EPS:g}"
    n = max(len(r["seeds"]) for r in rows.values())
    seeds = seeds_phrase([(f"{m.replace('_', '-')}{', fixed ⟨bos⟩' if fixed else ''}, {inf}", len(r["seeds"]))
                          for (m, fixed, inf), r in rows.items()])
    parts = [f"Over {seeds} (mean ± sd; changes are text only minus ⟨bos⟩+text on the same "
             f"model, seed by seed):"]
    nums: Dict[str, Any] = {"n_seeds": n}
    for m, fixed in (("causal", True), ("intra_doc", True), ("causal", False)):
        b, t = rows.get((m, fixed, "bos")), rows.get((m, fixed, "text"))
        if b is None or t is None:
            continue
        label = f"{m.replace('_', '-')} {'with' if fixed else 'without'} a fixed ⟨bos⟩"
        dl = seed_interval(bos_removed(summary, m, fixed, "val_loss"))
        ds = seed_interval(bos_removed(summary, m, fixed, key))
        sb, st = seed_stats(b["values"][key]), seed_stats(t["values"][key])
        pl = PAPER_ROWS[(m, fixed, "text")][1] - PAPER_ROWS[(m, fixed, "bos")][1]
        ps = (PAPER_ROWS[(m, fixed, "bos")][0], PAPER_ROWS[(m, fixed, "text")][0])
        peak = _peak(summary, m, fixed)
        text = (f" {label[:1].upper() + label[1:]}: removing ⟨bos⟩ at inference changes the loss "
                f"{mean_pm_sd(seed_stats(b['values']['val_loss']))} → {mean_pm_sd(seed_stats(t['values']['val_loss']))} nats, "
                f"{describe_difference(dl, 'change', '.3f', ' nats')} (paper {pl:+.2f});")
        if peak <= 0:
            text += (f" no head crossed ε = {EPS:g} in any seed, with or without ⟨bos⟩ (paper {ps[0]:.2f}% → "
                     f"{ps[1]:.2f}%);")
        else:
            text += (f" the ε = {EPS:g} sink rate {mean_pm_sd(sb, '.2f', '%')} → {mean_pm_sd(st, '.2f', '%')}, "
                     f"{describe_difference(ds, 'change', '.2f', ' pp')} (paper {ps[0]:.2f}% → {ps[1]:.2f}%)"
                     + (", more sinks without ⟨bos⟩ than with it" if ds.above(0) else "") + ";")
        text += f" mean a₀ with ⟨bos⟩ {_vs_uniform(seed_stats(b['values']['importance_over_uniform']))}, text only " \
                f"{_vs_uniform(seed_stats(t['values']['importance_over_uniform']))}."
        parts.append(text)
        tag = f"{m}_{'fixed_bos' if fixed else 'no_fixed_bos'}"
        nums[f"delta_loss_{tag}"] = dl.to_dict()
        nums[f"delta_sink_{tag}"] = ds.to_dict()
        nums[f"peak_sink_{tag}"] = peak
    ci = rows.get(("intra_doc", False, "text"))
    if ci is not None:
        s = seed_stats(ci["values"][key])
        parts.append(f" Intra-document without a fixed ⟨bos⟩ (text only): sink rate {mean_pm_sd(s, '.2f', '%') if s else '–'} "
                     f"(paper 28.23%).")
    parts.append(" Verdicts: " + "; ".join(f"{CLAIM_NAMES.get(k, k)}: {v.status}" for k, v in claims.items()) + ".")
    nums["claims"] = {k: v.to_dict() for k, v in claims.items()}
    nums["verdict"] = verdict.to_dict()
    return "".join(parts), nums, verdict


__all__ = ["criterion_fig5", "criterion_fig5_loss", "criterion_table2", "table2_claims", "fig5_reading",
           "table2_reading", "fig5_finals", "bos_removed", "seeds_phrase", "EPS", "RELIANCE_NATS", "NO_EFFECT_NATS",
           "NO_EFFECT_SINK_PP", "LOSS_COMPARABLE_FRACTION"]


LEARNED_FRACTION = 0.95   # a model whose loss stays above this share of ln V has not learned the language


def learned_nothing(summary: Dict[str, Any], vocab_size: int) -> Optional[str]:
    """Why the models of a summary cannot test any claim, or None: when the best final
    validation loss (nats) is still above :data:`LEARNED_FRACTION` × ln V (V the vocabulary), the
    models predict about as well as a uniform guess, and "nothing changes without ⟨bos⟩" then holds
    trivially (the quick profile: 6.90 nats against ln 1024 = 6.93)."""
    import math

    losses = [r["val_loss"] for r in summary.get("rows", [])]
    losses += [r["val_loss"][-1] for r in summary.get("runs", []) if r.get("val_loss")]
    losses = [float(x) for x in losses if x is not None]
    if not losses:
        return "no validation loss recorded"
    best, uniform = min(losses), math.log(vocab_size)
    if best > LEARNED_FRACTION * uniform:
        return (f"the models did not learn: best validation loss {best:.3f} nats against {uniform:.3f} for a uniform "
                f"guess over {vocab_size} tokens, so a null result tests nothing")
    return None

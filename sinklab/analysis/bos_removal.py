"""⟨bos⟩ removed at inference (the paper's §5, Table 2's inference rows, the rebuttal's Gemma 7B),
with intervals, and the criteria that turn them into statuses.

What the paper predicts depends on how the model was trained:

* trained **with** a fixed ⟨bos⟩ (Gemma; Table 2's fixed-⟨bos⟩ rows): without it the sinks on
  position 0 vanish (90.84 % → 0.05 %) and quality collapses (loss 2.69 → 7.56; Gemma 7B's RULER
  82.57 → 0.00);
* trained **without** one (Table 2's other rows): the sink forms on whatever token comes first,
  and nothing changes (65.10 % → 65.15 %, loss 2.69 → 2.70).

Every number here is paired: the same prompts, the same predicted tokens, with and without ⟨bos⟩,
so differences are bootstrapped over prompts in pairs (:mod:`sinklab.analysis.stats`).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np

from . import status as S
from .sinks import sink_indicator
from .stats import (Interval, bootstrap, mean_ci, paired_difference, paired_proportion_difference, ratio_of_means,
                    weighted_mean_ci)

# Thresholds of the criteria, fixed from the paper's claims before any measurement here.
SINK_COLLAPSE_RATIO = 0.5      # "the sinks vanish": the text-only sink rate is at most half the ⟨bos⟩ one
PPL_COLLAPSE_RATIO = 1.5       # "quality collapses": perplexity × 1.5 or more (the paper's ×131 is far beyond)
NO_EFFECT_SINK_POINTS = 0.05   # "nothing changes": the sink rate moves by at most 5 points (paper: +0.05)
NO_EFFECT_NLL = 0.1            # ... and the mean NLL by at most 0.1 nats (paper: +0.01)


def sink_rate_ci(importance: np.ndarray, eps: float) -> Interval:
    """Sink rate (fraction of (layer, head) pairs with a_0 > eps) with its bootstrap interval over
    prompts; ``importance`` (P, L, H)."""
    return mean_ci(sink_indicator(importance, eps))


def sink_rate_change(bos_importance: np.ndarray, nobos_importance: np.ndarray, eps: float) -> Interval:
    """Text-only minus ⟨bos⟩+text sink rate, paired over prompts (the same prompts in both)."""
    return paired_difference(sink_indicator(bos_importance, eps), sink_indicator(nobos_importance, eps))


def sink_rate_ratio(bos_importance: np.ndarray, nobos_importance: np.ndarray, eps: float) -> Interval:
    """Text-only / ⟨bos⟩+text sink rate, paired over prompts."""
    P = np.asarray(bos_importance).shape[0]
    a = sink_indicator(bos_importance, eps).reshape(P, -1).mean(axis=1)
    b = sink_indicator(nobos_importance, eps).reshape(P, -1).mean(axis=1)
    return ratio_of_means(b, a)


def nll_change(bos_ppl: Any, nobos_ppl: Any) -> Interval:
    """Token-weighted mean NLL without minus with ⟨bos⟩ (nats), paired over texts; both
    :class:`~sinklab.analysis.quality.PerplexityResult` on the same predicted tokens."""
    w_b, w_n = np.asarray(bos_ppl.n_predicted, float), np.asarray(nobos_ppl.n_predicted, float)
    if not np.array_equal(w_b, w_n):
        raise ValueError("the two perplexities were not scored on the same predicted tokens")
    a, b = np.asarray(bos_ppl.nll) * w_b, np.asarray(nobos_ppl.nll) * w_n
    return bootstrap(lambda i: (b[i].sum() - a[i].sum()) / w_b[i].sum(), len(w_b),
                     rows=lambda idx: (b[idx].sum(axis=1) - a[idx].sum(axis=1)) / w_b[idx].sum(axis=1))


def nll_ci(ppl: Any) -> Interval:
    """Token-weighted mean NLL (nats) of one condition with its interval over texts."""
    w = np.asarray(ppl.n_predicted, float)
    return weighted_mean_ci(np.asarray(ppl.nll) * w, w)


def criterion_sinks(importance: np.ndarray, eps: float = 0.3) -> S.Verdict:
    """Heads attend to the first token (the paper's title claim, Gu et al.'s metric): the sink
    rate's interval must lie above 0 (uniform attention over 64 tokens gives a_0 ≈ 0.07 < eps,
    i.e. a sink rate of 0)."""
    return S.directional(sink_rate_ci(importance, eps), +1, f"sink rate (eps {eps:g}) with ⟨bos⟩", spec=".3f")


def criterion_sinks_removed(bos_importance: np.ndarray, nobos_importance: np.ndarray, eps: float,
                            trained_with_bos: Optional[bool]) -> S.Verdict:
    """Table 2's sink-rate column when ⟨bos⟩ is dropped at inference.

    Fixed-⟨bos⟩ model: reproduced when the text-only / ⟨bos⟩ sink-rate ratio's interval lies at or
    below :data:`SINK_COLLAPSE_RATIO`. Model trained without one: reproduced when the change's
    interval lies within ±:data:`NO_EFFECT_SINK_POINTS`. Unknown training: not testable."""
    if trained_with_bos is None:
        return S.not_testable("whether this model was trained with a fixed ⟨bos⟩ is not recorded in its file")
    if trained_with_bos:
        base = sink_rate_ci(bos_importance, eps)
        if not base.above(0):
            return S.not_testable(f"no sinks with ⟨bos⟩ to lose (sink rate {base.fmt('.3f')})")
        return S.threshold(sink_rate_ratio(bos_importance, nobos_importance, eps), SINK_COLLAPSE_RATIO, 1.0,
                           f"text-only / ⟨bos⟩ sink rate (eps {eps:g})")
    return S.equivalence(sink_rate_change(bos_importance, nobos_importance, eps), NO_EFFECT_SINK_POINTS,
                         f"sink-rate change without ⟨bos⟩ (eps {eps:g})")


def criterion_quality_removed(bos_ppl: Any, nobos_ppl: Any, trained_with_bos: Optional[bool]) -> S.Verdict:
    """Table 2's loss column and the rebuttal's benchmarks, by held-out perplexity.

    Fixed-⟨bos⟩ model: reproduced when the perplexity ratio's interval (exp of the paired mean-NLL
    change) lies at or above :data:`PPL_COLLAPSE_RATIO`. Model trained without one: reproduced
    when the NLL change lies within ±:data:`NO_EFFECT_NLL` nats."""
    d = nll_change(bos_ppl, nobos_ppl)
    if trained_with_bos is None:
        return S.not_testable("whether this model was trained with a fixed ⟨bos⟩ is not recorded in its file")
    if trained_with_bos:
        return S.threshold(d.map(math.exp), PPL_COLLAPSE_RATIO, 1.0, "perplexity ratio without / with ⟨bos⟩",
                           spec=".2f")
    return S.equivalence(d, NO_EFFECT_NLL, "mean NLL change without ⟨bos⟩ (nats)")


def criterion_task_removed(bos_correct: np.ndarray, nobos_correct: np.ndarray, trained_with_bos: Optional[bool],
                           what: str, margin: float = 0.05, change: Optional[Interval] = None) -> S.Verdict:
    """A task's accuracy when ⟨bos⟩ is dropped (per-item correctness, the same items in both).

    Fixed-⟨bos⟩ model: the paper predicts a drop, reproduced when the paired accuracy change's
    interval lies below 0 (the rebuttal's drops are 20–80 points). Model trained without one:
    reproduced when it lies within ±``margin``. A task at ceiling or at chance in both conditions
    cannot show a drop: the interval then includes 0 and the verdict is inconclusive. The interval
    is Newcombe's for paired proportions, which stays honest at ceiling and with few trials;
    ``change`` replaces it where items are clustered (cloze items sharing a passage:
    :func:`clustered_change`)."""
    d = change if change is not None else paired_proportion_difference(bos_correct, nobos_correct)
    if trained_with_bos is None:
        return S.not_testable("whether this model was trained with a fixed ⟨bos⟩ is not recorded in its file")
    if trained_with_bos:
        return S.directional(d, -1, f"{what} accuracy change without ⟨bos⟩")
    return S.equivalence(d, margin, f"{what} accuracy change without ⟨bos⟩")


def sink_numbers(bos_importance: np.ndarray, nobos_importance: np.ndarray, eps: float) -> Dict[str, Interval]:
    """Sink rates with and without ⟨bos⟩ and their paired change, each with its interval."""
    return {"sink_rate_bos": sink_rate_ci(bos_importance, eps), "sink_rate_nobos": sink_rate_ci(nobos_importance, eps),
            "sink_rate_change": sink_rate_change(bos_importance, nobos_importance, eps)}


def quality_numbers(bos_ppl: Any, nobos_ppl: Any) -> Dict[str, Interval]:
    """Mean NLL (nats) with and without ⟨bos⟩, the paired change and the perplexity ratio."""
    d = nll_change(bos_ppl, nobos_ppl)
    return {"nll_bos": nll_ci(bos_ppl), "nll_nobos": nll_ci(nobos_ppl), "nll_change": d, "ppl_ratio": d.map(math.exp)}


def clustered_change(bos_correct: np.ndarray, nobos_correct: np.ndarray, cluster: np.ndarray) -> Interval:
    """Paired accuracy change (text only minus ⟨bos⟩) with a bootstrap over clusters (e.g. the
    passage each cloze item was cut from: items of one passage are not independent draws)."""
    a, b, g = np.asarray(bos_correct, float), np.asarray(nobos_correct, float), np.asarray(cluster)
    groups = [np.flatnonzero(g == c) for c in np.unique(g)]
    da = np.array([b[i].sum() - a[i].sum() for i in groups])
    n = np.array([len(i) for i in groups], float)
    return weighted_mean_ci(da, n)

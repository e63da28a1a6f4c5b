"""How much the last token mixes in from the other text tokens, with and without ⟨bos⟩: a
measure built so that it cannot move by construction (the paper's §3 over-squashing argument).

The paper's claim: a sink (attention parked on the first token) takes weight off the paths
between the other tokens, so it *limits mixing*; removing it should make the last token's final
representation more sensitive to the other text tokens, and the more so the longer the context.

**The measure.** For each condition c (``"bos"``: ⟨bos⟩ + T text tokens; ``"nobos"``: the same T
text tokens alone) and each source layer l >= 1, the Jacobian blocks of the target's final stream
with respect to every source stream,

    J_j^(l) = d resid[L][target] / d resid[l][j]        (target = the last text token)

from :func:`sinklab.sensitivity` (``method="exact"``: d cotangents; ``"estimate"``: random-sign
probes, an unbiased estimate of every ||J_j^(l)||_F^2). The *mass on the other text tokens* is

    M_c^(l) = sum_{j in O_c} ||J_j^(l)||_F^2,

where O_c are the positions of text tokens 1 .. T-2 (text indices, 0-based): the same text
tokens in both runs. Excluded in *both* conditions: position 0 of the run with ⟨bos⟩ (⟨bos⟩
itself), the first text token (position 1 with ⟨bos⟩, position 0 without: the token that
becomes the sink when ⟨bos⟩ is removed, the "relocated sink"), and the target itself
(:func:`source_groups`). Positions are aligned by dropping ⟨bos⟩, as in
:mod:`sinklab.analysis.perturbation`.

Per unit (passage), T and layer: the log ratio

    log(M_nobos^(l) / M_bos^(l))      (> 0: more mixing of the other tokens without ⟨bos⟩)

is unbounded and compares identical sets of source tokens, unlike a difference of two shares in
[0, 1]; layers l >= 1 avoid the Jacobian with respect to raw embeddings, which passes through a
norm of inputs whose norms differ by orders of magnitude. For comparison the share-based version
is reported too: ``share_c = M_c / (total mass over every source j <= target)`` and its paired
difference nobos − bos, and the scale-free ``log((M/self)_nobos / (M/self)_bos)`` (mass relative
to the target's own block at the same layer, which cancels an overall scale of the Jacobian).

**Intervals.** The units are independent passages (:func:`sinklab.analysis.collapse.passage_units`:
disjoint passages, concatenated when one is shorter than T); every interval is a percentile
bootstrap over units (:mod:`sinklab.analysis.stats`). With the probe estimate, the probe noise is
part of each unit's value and so inside the interval; the two conditions of a unit use the same
probe vectors (common random numbers). The trend over context is, per unit, the OLS slope of the
layer-averaged log ratio against log T, then its bootstrap interval. :func:`criterion_mixing` states
the paper's prediction as a rule on those intervals.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..inputs import BOS, CONDITIONS, NOBOS, check_length
from ..progress import progress_bar
from ..results import load_npz, save_npz, to_jsonable
from .collapse import PASSAGE_SEPARATOR, default_passages, ols_slope, units_with_spans
from .sensitivity import sensitivity
from .stats import Interval, mean_ci, paired_difference
from .status import Verdict, combine, directional, not_testable
from ..reprs import compact_repr

GROUPS = ("bos", "first_text", "others", "target")
"""The source groups of a run: ⟨bos⟩ (position 0 with ⟨bos⟩; absent without), the first text
token (the relocated sink), the other text tokens (the measure) and the target."""


def source_groups(T: int, condition: str) -> Dict[str, np.ndarray]:
    """Positions (int64 arrays) of each source group in a run of ``T`` text tokens.

    With ⟨bos⟩ (``"bos"``, T+1 positions): bos = [0], first_text = [1], others = 2..T-1,
    target = [T]. Without (``"nobos"``, T positions): bos = [], first_text = [0],
    others = 1..T-2, target = [T-1]. In both, ``others`` are text tokens 1..T-2: the same tokens.
    """
    T = int(T)
    if T < 3:
        raise ValueError(f"T={T}: need at least 3 text tokens (first, one other, the target)")
    off = {BOS: 1, NOBOS: 0}[condition]
    return {"bos": np.arange(off, dtype=np.int64), "first_text": np.array([off], np.int64),
            "others": np.arange(off + 1, off + T - 1, dtype=np.int64), "target": np.array([off + T - 1], np.int64)}


def group_masses(fro: np.ndarray, T: int, condition: str) -> Dict[str, np.ndarray]:
    """Squared Frobenius mass per source group, from a (n_layers, positions) array of Frobenius
    norms (``Sensitivity.fro``) of a run of ``T`` text tokens: group -> (n_layers,) float64."""
    f2 = np.asarray(fro, np.float64) ** 2
    return {g: f2[:, idx].sum(axis=1) for g, idx in source_groups(T, condition).items()}


@compact_repr
@dataclass
class MixingResult:
    """The mixing measure per (unit, T, layer) in both conditions.

    Attributes:
        lengths: (nT,) int64, text tokens T (the ⟨bos⟩ run has T+1).
        layers: (nl,) int64 source layers l (resid[l], 1 <= l < L).
        mass: condition -> group -> (P, nT, nl) float64 squared Frobenius mass of each source group
            (:data:`GROUPS`; ``"bos"`` is 0 without ⟨bos⟩).
        method: per length ``"exact"`` or ``"estimate"``.
        seconds: condition -> (P, nT) wall seconds of each map.
        meta: model, units (passage indices), n_probes, seed, ...
    """

    lengths: np.ndarray
    layers: np.ndarray
    mass: Dict[str, Dict[str, np.ndarray]]
    method: List[str]
    seconds: Dict[str, np.ndarray]
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def n_units(self) -> int:
        return int(self.mass[BOS]["others"].shape[0])

    # ------------------------------------------------------------------ per unit
    def total(self, condition: str) -> np.ndarray:
        """(P, nT, nl) mass over every source j <= target."""
        return sum(self.mass[condition][g] for g in GROUPS)

    def log_ratio(self) -> np.ndarray:
        """(P, nT, nl) log(M_nobos / M_bos) of the other text tokens."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(self.mass[NOBOS]["others"] / self.mass[BOS]["others"])

    def share(self, condition: str) -> np.ndarray:
        """(P, nT, nl) share of the total mass on the other text tokens."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.mass[condition]["others"] / self.total(condition)

    def log_ratio_vs_self(self) -> np.ndarray:
        """(P, nT, nl) log((M/self)_nobos / (M/self)_bos): the mass relative to the target's own
        block, which cancels an overall scale of each run's Jacobian."""
        m = {c: self.mass[c]["others"] / self.mass[c]["target"] for c in CONDITIONS}
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(m[NOBOS] / m[BOS])

    def layer_mean_log_ratio(self) -> np.ndarray:
        """(P, nT): the log ratio averaged over the layers."""
        return self.log_ratio().mean(axis=2)

    def slopes(self) -> np.ndarray:
        """(P,) OLS slope of the layer-averaged log ratio vs log T, per unit."""
        return ols_slope(np.log(self.lengths.astype(np.float64)), self.layer_mean_log_ratio())

    def layer_slopes(self) -> np.ndarray:
        """(P, nl) OLS slope of the log ratio vs log T, per unit and layer."""
        return ols_slope(np.log(self.lengths.astype(np.float64)), np.moveaxis(self.log_ratio(), 1, 2))

    # ------------------------------------------------------------------ intervals over units
    def effect(self) -> Interval:
        """The mean log ratio over every (T, layer), per unit, then over units (bootstrap)."""
        return mean_ci(self.log_ratio().reshape(self.n_units, -1).mean(axis=1))

    def effect_by_length(self) -> List[Interval]:
        """Per T: the layer-averaged log ratio, interval over units."""
        lm = self.layer_mean_log_ratio()
        return [mean_ci(lm[:, i]) for i in range(lm.shape[1])]

    def effect_grid(self) -> List[List[Interval]]:
        """``[T][layer]`` interval over units of the mean log ratio."""
        lr = self.log_ratio()
        return [[mean_ci(lr[:, i, k]) for k in range(lr.shape[2])] for i in range(lr.shape[1])]

    def slope(self) -> Interval:
        """The trend over context: mean over units of :meth:`slopes` (bootstrap)."""
        return mean_ci(self.slopes())

    def share_difference_grid(self) -> List[List[Interval]]:
        """``[T][layer]`` share_nobos − share_bos, units resampled in pairs."""
        a, b = self.share(BOS), self.share(NOBOS)
        return [[paired_difference(a[:, i, k], b[:, i, k]) for k in range(a.shape[2])] for i in range(a.shape[1])]

    def share_difference(self) -> Interval:
        """share_nobos − share_bos averaged over every (T, layer) per unit (paired bootstrap)."""
        P = self.n_units
        return paired_difference(self.share(BOS).reshape(P, -1), self.share(NOBOS).reshape(P, -1))

    def share_difference_slope(self) -> Interval:
        """Slope vs log T of the layer-averaged share difference (the share-based trend)."""
        d = (self.share(NOBOS) - self.share(BOS)).mean(axis=2)
        return mean_ci(ols_slope(np.log(self.lengths.astype(np.float64)), d))

    def effect_vs_self(self) -> Interval:
        """:meth:`log_ratio_vs_self` averaged over (T, layer) per unit, interval over units."""
        return mean_ci(self.log_ratio_vs_self().reshape(self.n_units, -1).mean(axis=1))

    def summary(self) -> Dict[str, Any]:
        """JSON-ready numbers: the effect and the trend with intervals, per T and per (T, layer),
        the share-based version for comparison, and the verdict of :func:`criterion_mixing`."""
        grid = self.effect_grid()
        sgrid = self.share_difference_grid()
        shares = {c: self.share(c) for c in CONDITIONS}
        out = {
            "meta": self.meta, "lengths": self.lengths, "layers": self.layers, "method": self.method,
            "n_units": self.n_units,
            "log_ratio": {"mean": self.effect().to_dict(), "slope_vs_logT": self.slope().to_dict(),
                          "by_length": [iv.to_dict() for iv in self.effect_by_length()],
                          "by_length_layer": [[iv.to_dict() for iv in row] for row in grid]},
            "log_ratio_vs_self": {"mean": self.effect_vs_self().to_dict()},
            "share": {"difference_mean": self.share_difference().to_dict(),
                      "difference_slope_vs_logT": self.share_difference_slope().to_dict(),
                      "by_length_layer": [[iv.to_dict() for iv in row] for row in sgrid],
                      "mean": {c: [[mean_ci(shares[c][:, i, k]).to_dict() for k in range(shares[c].shape[2])]
                                   for i in range(shares[c].shape[1])] for c in CONDITIONS}},
            "seconds": {c: float(np.sum(self.seconds[c])) for c in CONDITIONS},
            "verdict": criterion_mixing(self).to_dict(),
        }
        return to_jsonable(out)

    # ------------------------------------------------------------------ files
    def save(self, path: str) -> str:
        """.npz with embedded JSON metadata (no pickle); returns the file written."""
        arrays: Dict[str, np.ndarray] = {"lengths": self.lengths, "layers": self.layers}
        for c in CONDITIONS:
            arrays[f"seconds_{c}"] = self.seconds[c]
            for g in GROUPS:
                arrays[f"mass_{c}_{g}"] = self.mass[c][g]
        return save_npz(path, arrays, {"kind": "mixing_measure", "method": self.method, "meta": self.meta})

    @classmethod
    def load(cls, path: str) -> "MixingResult":
        a, m = load_npz(path)
        if m.get("kind") != "mixing_measure":
            raise ValueError(f"{path} is not a saved mixing measure")
        return cls(lengths=a["lengths"], layers=a["layers"],
                   mass={c: {g: a[f"mass_{c}_{g}"] for g in GROUPS} for c in CONDITIONS},
                   method=list(m["method"]), seconds={c: a[f"seconds_{c}"] for c in CONDITIONS},
                   meta=dict(m["meta"]))


def mixing_measure(model: Any, passages: Optional[Sequence[str]] = None,
                   lengths: Sequence[int] = (64, 128, 256, 512, 1024), n_passages: int = 10,
                   layers: Optional[Sequence[int]] = None, n_probes: int = 32, exact_up_to: int = 0,
                   seed: int = 0, progress: bool = True) -> MixingResult:
    """The mixing measure (module docstring) over ``n_passages`` independent passage units.

    Args:
        model: a :class:`sinklab.Model` with a BOS token.
        passages: the passages (default ``load_passages("sinks")``), grouped into disjoint units of
            max(lengths) text tokens (:func:`sinklab.analysis.collapse.passage_units`).
        lengths: numbers of text tokens T (>= 3); the ⟨bos⟩ run has T+1 tokens.
        n_passages: number of units (>= 10 for intervals worth reading).
        layers: source layers l, 1 <= l < L (default all of them: one backward gives every layer).
        n_probes: random-sign probes of the estimate (``method="estimate"`` of sl.sensitivity).
        exact_up_to: lengths T <= this use the exact map (d cotangents: about d / n_probes times
            the cost of the estimate); 0 (default): the estimate everywhere.
        seed: probe seed; unit u uses ``seed + u`` in both conditions and at every T.
        progress: a bar over the 2 x n_passages x len(lengths) maps.

    Returns:
        :class:`MixingResult`.
    """
    L = model.config.n_layers
    model.bos_id(True)                                  # ValueError without a BOS
    sel = list(range(1, L)) if layers is None else sorted({int(l) for l in layers})
    bad = [l for l in sel if not 1 <= l < L]
    if bad or not sel:
        raise ValueError(f"layers must lie in [1, {L - 1}] (l = 0 is the embeddings, l = L the target's own "
                         f"stream), got {bad or sel}")
    Ts = sorted({int(t) for t in lengths})
    if not Ts or Ts[0] < 3:
        raise ValueError(f"every length must be >= 3 text tokens, got {list(lengths)}")
    check_length(model, Ts[-1] + 1, f"length T={Ts[-1]} (+1 for BOS): a sequence")
    if n_probes < 2:
        raise ValueError("n_probes must be >= 2")
    units = units_with_spans(model, default_passages(passages), Ts[-1], n_passages, PASSAGE_SEPARATOR)
    P, nT, nl = len(units), len(Ts), len(sel)
    mass = {c: {g: np.zeros((P, nT, nl)) for g in GROUPS} for c in CONDITIONS}
    secs = {c: np.zeros((P, nT)) for c in CONDITIONS}
    methods = ["exact" if T <= exact_up_to else "estimate" for T in Ts]
    bos_id = model.bos_id(True)
    jobs = [(u, i, c) for u in range(P) for i in range(nT) for c in CONDITIONS]
    for u, i, c in progress_bar(jobs, progress, desc="mixing measure", unit="map"):
        T = Ts[i]
        text = units[u][0][:T]
        ids = np.concatenate([[bos_id], text]).astype(np.int64) if c == BOS else text
        t0 = time.perf_counter()
        if methods[i] == "exact":
            s = sensitivity(model, ids, target=-1, layers=sel, method="exact", spectral=False, progress=False)
        else:
            s = sensitivity(model, ids, target=-1, layers=sel, method="estimate", n_probes=n_probes,
                            seed=seed + u, spectral=False, progress=False)
        secs[c][u, i] = time.perf_counter() - t0
        for g, m in group_masses(s.fro, T, c).items():
            mass[c][g][u, i] = m
    tok = getattr(model, "tokenizer", None)
    meta = {"model": getattr(model, "name", None), "bos_token_id": int(bos_id), "n_probes": int(n_probes),
            "exact_up_to": int(exact_up_to), "seed": int(seed), "units": [span for _, span in units],
            "separator": PASSAGE_SEPARATOR, "adds_bos": getattr(tok, "add_bos_default", None),
            "n_layers": int(L)}
    return MixingResult(lengths=np.asarray(Ts, np.int64), layers=np.asarray(sel, np.int64), mass=mass,
                        method=methods, seconds=secs, meta=meta)


MIXING_CLAIM = ("a sink limits mixing: removing ⟨bos⟩ increases the mixing of the other text tokens into the "
                "last token (log ratio > 0), and the more so the longer the context (slope vs log T > 0)")


def criterion_mixing(result: MixingResult) -> Verdict:
    """The paper's prediction as a rule (written from the claim, never fitted to a result), two
    parts combined with :func:`sinklab.analysis.status.combine` (both must be reproduced):

    1. effect: the mean log(M_nobos / M_bos) over every (T, layer >= 1), per unit, has a 95%
       bootstrap interval over units above 0 (reproduced), below 0 (contradicted), else
       inconclusive;
    2. growth with context: the mean over units of the slope of the layer-averaged log ratio vs
       log T has an interval above 0 (reproduced), below 0 (contradicted), else inconclusive;
       with a single length it is not testable.

    The paper predicts the effect for a model trained with a fixed ⟨bos⟩ (Gemma); for one trained
    without (SmolLM2: the sink forms on whatever token is first) the same rule is the contrast."""
    eff = directional(result.effect(), +1, "mean log(mixing mass without ⟨bos⟩ / with ⟨bos⟩) over T and layers >= 1")
    if len(result.lengths) < 2:
        trend = not_testable(f"one length only (T = {int(result.lengths[0])}): no trend over context")
    else:
        trend = directional(result.slope(), +1, "slope of the mean log ratio vs log T", spec=".4f")
    return combine(eff, trend, what="removing ⟨bos⟩ increases mixing, more with context")


__all__ = ["GROUPS", "MixingResult", "criterion_mixing", "group_masses", "mixing_measure", "source_groups",
           "MIXING_CLAIM"]

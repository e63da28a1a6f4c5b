"""The paper's over-squashing argument (§3, Thm. 3.2) run end to end on one model from one call:
the measured sensitivity map of the last token with and without ⟨bos⟩ and with the sink masked,
Thm. 3.2's bound against it, and how much the last token mixes in from the other tokens as the
context grows and the path gets deeper.

The paper's prediction: a sink (attention parked on the first token) takes weight off every
path between other tokens, so without it the last token's representation is more sensitive to
the rest of the context, the more so for longer contexts and deeper models.

Mixing share. For a map of target i (the last position) and a layer l, the share of the
Jacobian's squared Frobenius mass that comes from the *other text tokens*,

    share^(l) = sum_{text j != i} ||J_j^(l)||_F^2 / sum_{j <= i} ||J_j^(l)||_F^2,

is scale-free (the overall size of the Jacobian cancels) and excludes ⟨bos⟩ itself, so runs with
and without ⟨bos⟩ compare on the same text tokens. Row L (the target's own stream) has share 0.
The mass ⟨bos⟩ itself takes is in the denominator: that is the sink's effect the paper describes
(weight moved off the other paths). The "text-only" share leaves it out (others / (others +
target)), for the reader who wants the comparison without it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..inputs import prepare
from ..interventions import Intervention
from ..progress import progress_bar
from .oversquashing import OversquashingBound, oversquashing_bound
from .sensitivity import Sensitivity, sensitivity
from ..reprs import compact_repr

# condition -> (prepend ⟨bos⟩, intervention, label; plain "BOS" since figure fonts lack ⟨⟩)
CONDITIONS: Dict[str, Tuple[bool, Optional[Intervention], str]] = {
    "bos": (True, None, "BOS + text"),
    "nobos": (False, None, "text only (no BOS)"),
    "masked": (True, Intervention(mask_first=True), "BOS + text, attention to BOS masked (all heads)"),
}


def mixing_share(s: Sensitivity, first_text: int, text_only: bool = False) -> np.ndarray:
    """(len(s.layers),) share of squared Frobenius mass on text tokens other than the target
    (see the module docstring); ``first_text`` is the first text position (1 after ⟨bos⟩).
    ``text_only``: leave ⟨bos⟩ out of the denominator too (others / (others + target)), so a
    run with ⟨bos⟩ is not lower merely because ⟨bos⟩ takes some of the mass."""
    f2 = s.fro[:, : s.target + 1] ** 2
    total = f2[:, first_text:].sum(axis=1) if text_only else f2.sum(axis=1)
    others = f2[:, first_text: s.target].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, others / total, 0.0)


@compact_repr
@dataclass
class SquashingStudy:
    """Results of :func:`squashing_study`.

    Attributes:
        T: tokens of the ⟨bos⟩ runs at the main length (⟨bos⟩ + T-1 text tokens; the run without
            ⟨bos⟩ has the same T-1 text tokens).
        conditions: the conditions run, keys of ``CONDITIONS``.
        maps: condition -> exact :class:`Sensitivity` (Frobenius and spectral) at T.
        bounds: condition -> :class:`OversquashingBound` with the measured spectral norms.
        lengths: context lengths of the length sweep (⟨bos⟩ counted).
        length_maps: condition -> {length: estimated :class:`Sensitivity`} (random probes).
        n_probes: probes of the length sweep.
        meta: model, text, seconds per part.
    """

    T: int
    conditions: List[str]
    maps: Dict[str, Sensitivity]
    bounds: Dict[str, OversquashingBound]
    lengths: List[int]
    length_maps: Dict[str, Dict[int, Sensitivity]]
    n_probes: int
    meta: Dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def first_text(condition: str) -> int:
        return 1 if CONDITIONS[condition][0] else 0

    @staticmethod
    def label(condition: str) -> str:
        return CONDITIONS[condition][2]

    def share(self, condition: str, length: Optional[int] = None, text_only: bool = False) -> np.ndarray:
        """Mixing share per layer (L+1,) at the main length (exact) or a sweep length (estimate);
        ``text_only`` as in :func:`mixing_share`."""
        s = self.maps[condition] if length is None else self.length_maps[condition][length]
        return mixing_share(s, self.first_text(condition), text_only)

    def summary(self) -> Dict[str, Any]:
        """Plain numbers per condition: mixing share at resid[0] (the whole depth) and at the
        middle layer, the bound's min/median ratio and mean rank correlation, and the share at
        resid[0] for every sweep length."""
        out: Dict[str, Any] = {"T": self.T, "lengths": self.lengths, "n_probes": self.n_probes, "conditions": {}}
        for c in self.conditions:
            s = self.share(c)
            L = len(s) - 1
            row: Dict[str, Any] = {"share_layer0": float(s[0]), "share_mid": float(s[L // 2]),
                                   "text_share_layer0": float(self.share(c, text_only=True)[0])}
            if c in self.bounds:
                b = self.bounds[c].summary()
                row.update({k: b.get(k) for k in ("min_ratio", "median_ratio", "violations", "spearman_mean",
                                                   "spearman_min")})
            if c in self.length_maps:
                row["share_layer0_by_length"] = {int(T): float(self.share(c, T)[0]) for T in self.length_maps[c]}
            out["conditions"][c] = row
        return out


def _ids(model: Any, text: str, condition: str, T: int) -> np.ndarray:
    """⟨bos⟩ + the first T-1 text tokens, or the same T-1 text tokens alone."""
    with_bos = CONDITIONS[condition][0]
    ids = prepare(model, text, True, max_tokens=T)
    return ids if with_bos else ids[1:]


def squashing_study(model: Any, text: str, T: int = 64, lengths: Sequence[int] = (64, 256, 1024),
                    n_probes: int = 32, conditions: Sequence[str] = ("bos", "nobos", "masked"),
                    constants: str = "entrywise", seed: int = 0, progress: bool = True) -> SquashingStudy:
    """Sensitivity maps, Thm. 3.2's bound and the length sweep for one text (module docstring).

    Args:
        model: a :class:`sinklab.Model` with a BOS token.
        text: the passage; its first tokens are used.
        T: tokens of the exact maps and the bound (⟨bos⟩ counted; the run without ⟨bos⟩ uses
            the same T-1 text tokens). The exact map costs about 2·d forward passes of T tokens.
        lengths: context lengths (⟨bos⟩ counted) of the sweep, estimated with ``n_probes``
            random probes each; lengths beyond the text or the context window are dropped.
        n_probes: probes per sweep map.
        conditions: subset of ``("bos", "nobos", "masked")``.
        constants: the bound's constants (:func:`oversquashing_bound`).
        seed: seed of the probes.
        progress: a progress bar over the runs.

    Returns:
        :class:`SquashingStudy`.
    """
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown conditions {unknown}; choose from {tuple(CONDITIONS)}")
    n_text = len(prepare(model, text, False, max_tokens=model.config.context_length))
    lengths = [int(n) for n in lengths if 2 <= n <= min(n_text + 1, model.config.context_length)]
    maps: Dict[str, Sensitivity] = {}
    bounds: Dict[str, OversquashingBound] = {}
    length_maps: Dict[str, Dict[int, Sensitivity]] = {c: {} for c in conditions}
    runs = [(c, None) for c in conditions] + [(c, n) for c in conditions for n in lengths]
    seconds = {"exact": 0.0, "bound": 0.0, "sweep": 0.0}
    for c, n in progress_bar(runs, progress, desc="over-squashing (Thm. 3.2)", unit="run"):
        iv = CONDITIONS[c][1]
        t0 = time.perf_counter()
        if n is None:
            ids = _ids(model, text, c, T)
            maps[c] = sensitivity(model, ids, method="exact", intervene=iv, spectral=True, progress=False)
            seconds["exact"] += time.perf_counter() - t0
            t1 = time.perf_counter()
            bounds[c] = oversquashing_bound(model, ids, intervene=iv, constants=constants, measured=maps[c])
            seconds["bound"] += time.perf_counter() - t1
        else:
            ids = _ids(model, text, c, n)
            length_maps[c][n] = sensitivity(model, ids, method="estimate", n_probes=n_probes, seed=seed,
                                            intervene=iv, progress=False)
            seconds["sweep"] += time.perf_counter() - t0
    meta = {"model": model.name, "text_tokens": n_text, "seconds": seconds, "constants": constants}
    return SquashingStudy(T=T, conditions=list(conditions), maps=maps, bounds=bounds, lengths=lengths,
                          length_maps=length_maps, n_probes=n_probes, meta=meta)

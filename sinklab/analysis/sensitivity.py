"""The over-squashing map: how strongly each source position's residual stream, at each layer,
moves one target token's final representation (the measured side of the paper's Thm. 3.2).

For a target position i and the stream after the last layer (``resid[L]``, before the final
norm), the map holds, for every layer l and source position j, a norm of the d x d Jacobian block

    J_j^(l) = d resid[L][i] / d resid[l][j].

``of_layer=l'`` takes the target row at ``resid[l']`` instead of ``resid[L]`` (l <= l'): with
l' = l + 1 and ``layers=[l]`` the blocks are one layer's own Jacobian blocks d resid[l+1][i] /
d resid[l][j], from which :mod:`sinklab.analysis.oversquashing` builds its path bound.

``method="exact"`` pushes the d unit cotangents at (L, i) back through the C backward together
and reads every block at every layer boundary on the way down: Frobenius norms from the squared
row norms, spectral norms by Lanczos iteration on each block's J^T J (to a relative change of the Ritz
value below ``spectral_rtol``). ``method="estimate"`` pushes ``n_probes`` random sign vectors u instead:
E||u^T J||^2 = ||J||_F^2 for E[u u^T] = I, so the mean over probes of ||u^T J_j^(l)||^2 is an
unbiased estimate of every block's squared Frobenius norm at once, with its standard error from
the spread over probes. In a causal model positions after the target cannot influence it and are
not computed: their norms are exactly 0 (an encoder computes every position).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..interventions import Intervention, core_arrays
from ..progress import progress_bar

METHODS = ("exact", "estimate")


@dataclass
class Sensitivity:
    """Norms of ``d resid[L][target] / d resid[l][j]`` for l in ``layers`` and every position j.

    Attributes:
        fro: (len(layers), T) float64 Frobenius norms (the estimate's square root for
            ``method="estimate"``).
        spectral: (len(layers), T) float64 largest singular values, or None (not computed, or
            ``method="estimate"``).
        stderr: (len(layers), T) float64 standard error of ``fro`` (estimate only, by the delta
            method from the squared norms' standard error), else None.
        layers: the resid indices l of the rows; ``layers[-1] == L`` gives the identity block at
            the target (Frobenius sqrt(d), spectral 1).
        target: the target position (non-negative).
        of_layer: the resid index of the target row (L unless :func:`sensitivity` was given
            ``of_layer``).
        method, n_probes, seconds: how it was computed and the wall time.
        spectral_iters: the most Lanczos steps any block took (0 when not computed).
    """

    fro: np.ndarray
    spectral: Optional[np.ndarray]
    stderr: Optional[np.ndarray]
    layers: List[int]
    target: int
    method: str
    n_probes: Optional[int]
    seconds: float
    spectral_iters: int = 0
    meta: Dict[str, Any] = field(default_factory=dict)
    of_layer: Optional[int] = None

    @property
    def T(self) -> int:
        return int(self.fro.shape[1])

    def __repr__(self) -> str:
        kind = "exact" if self.method == "exact" else f"estimate, {self.n_probes} probes"
        return (f"<Sensitivity {kind}: {len(self.layers)} layers x {self.T} positions, target {self.target}, "
                f"{self.seconds:.1f} s>")

    def summary(self) -> Dict[str, Any]:
        """Plain numbers: per layer, the norm at the target itself, at position 0 and the mean
        over the other sources 1..target-1."""
        rows = []
        for k, l in enumerate(self.layers):
            f = self.fro[k]
            others = f[1:self.target] if self.target > 1 else np.zeros(0)
            rows.append({"layer": l, "self": float(f[self.target]), "first": float(f[0]),
                         "others_mean": float(others.mean()) if others.size else None})
        return {"method": self.method, "n_probes": self.n_probes, "target": self.target, "T": self.T,
                "seconds": self.seconds, "layers": rows}


def _probes(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """(n, d) cotangents at the target row: random signs (+-1)."""
    return rng.choice(np.array([-1.0, 1.0], np.float32), size=(n, d))


def sensitivity(model, ids: Any, target: int = -1, layers: Optional[Sequence[int]] = None,
                method: str = "exact", n_probes: int = 32, seed: int = 0,
                intervene: Optional[Intervention] = None, spectral: bool = True,
                spectral_rtol: float = 1e-9, progress: bool = True,
                chunk: Optional[int] = None, of_layer: Optional[int] = None) -> Sensitivity:
    """The over-squashing map of one target token (see the module docstring).

    Args:
        model: a :class:`sinklab.Model`.
        ids: token ids (T,).
        target: the target position (negative counts from the end).
        layers: resid indices l in [0, L] to report (default all, 0..L).
        method: ``"exact"`` (d cotangents, Frobenius and spectral norms) or ``"estimate"``
            (``n_probes`` random-sign probes, Frobenius only, with standard errors).
        n_probes: probes of the estimate.
        seed: seed of the probes.
        intervene: an :class:`Intervention` (e.g. ``mask_first`` on every head: the map with the
            sink removed), differentiated as applied.
        spectral: compute spectral norms (exact only). They need all d cotangents in one backward;
            without them the cotangents go in chunks that fit in memory.
        spectral_rtol: relative change of the largest Ritz value (sigma^2) at which the Lanczos
            iteration stops (at most 300 steps; ``Sensitivity.spectral_iters`` tells the most taken).
        progress: progress bar over the backward calls.
        chunk: cotangents per backward call (exact without spectral, or estimate).
        of_layer: the resid index l' in [1, L] of the target row (default L, the last layer's
            output); ``layers`` then lie in [0, l'], default 0..l'. The C backward stops at the
            lowest layer asked for, so ``of_layer=l + 1, layers=[l]`` costs one layer's backward.

    Returns:
        a :class:`Sensitivity`.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    arr = model.check_sequence(ids)
    T, d, L = arr.shape[0], model.config.d_model, model.config.n_layers
    if not -T <= int(target) < T:
        raise ValueError(f"target={target} outside [-{T}, {T}) for T={T}")
    target = int(target) % T
    top = L if of_layer is None else model.layer_index(of_layer, "of_layer", lo=1)
    sel = model.check_resid_layers(layers, top, sort=True)
    t_eff = model.influence_end(target, T)
    B = d if method == "exact" else int(n_probes)
    if B < 2 and method == "estimate":
        raise ValueError("the estimate needs n_probes >= 2 (its standard error comes from their spread)")
    want_spec = spectral and method == "exact"
    if want_spec:
        model.check_bytes(model.grad_bytes(t_eff, B, top), f"the exact map with spectral norms ({d} cotangents at "
                          f"once, {t_eff} tokens)",
                          "pass spectral=False (Frobenius only, chunked) or method='estimate'")
        step = B
    else:
        step = model.cotangent_chunk(t_eff, B, top) if chunk is None else max(1, int(chunk))
    rng = np.random.default_rng(seed)
    sq = np.zeros((len(sel), B, t_eff))
    spec = None
    iters = 0
    t0 = time.perf_counter()
    starts = range(0, B, step)
    for b0 in progress_bar(starts, progress and len(starts) > 1, desc=f"sensitivity ({method}, {B} directions)",
                           unit="chunk"):
        n = min(step, B - b0)
        if method == "exact":
            cot = np.zeros((n, d), np.float32)
            cot[np.arange(n), b0 + np.arange(n)] = 1.0
        else:
            cot = _probes(n, d, rng)
        r = model.vjp_norms(arr, cot, at=(top, target), layers=sel, spectral=want_spec,
                            spectral_rtol=spectral_rtol, intervene=intervene)
        iters = max(iters, r.iters)
        sq[:, b0:b0 + n] = r.sq
        if want_spec:
            spec = r.spectral
    seconds = time.perf_counter() - t0
    fro = np.zeros((len(sel), T))
    stderr = None
    if method == "exact":
        fro[:, :t_eff] = np.sqrt(sq.sum(axis=1))
    else:
        mean = sq.mean(axis=1)
        se_sq = sq.std(axis=1, ddof=1) / np.sqrt(B)
        fro[:, :t_eff] = np.sqrt(mean)
        stderr = np.zeros((len(sel), T))
        with np.errstate(divide="ignore", invalid="ignore"):
            stderr[:, :t_eff] = np.where(mean > 0, se_sq / (2.0 * np.sqrt(mean)), 0.0)
    spectral_full = None
    if spec is not None:
        spectral_full = np.zeros((len(sel), T))
        spectral_full[:, :t_eff] = spec
    ivs = core_arrays(intervene, L, model.config.n_heads)
    meta = {"model": model.name, "T": T, "intervention": {k: v is not None for k, v in ivs.items()},
            "seed": seed if method == "estimate" else None, "spectral_rtol": spectral_rtol if want_spec else None,
            "of_layer": top}
    return Sensitivity(fro=fro, spectral=spectral_full, stderr=stderr, layers=sel, target=target, method=method,
                       n_probes=B if method == "estimate" else None, seconds=seconds, spectral_iters=iters, meta=meta,
                       of_layer=top)

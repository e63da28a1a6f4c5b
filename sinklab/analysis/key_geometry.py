"""The sink's key geometry, beyond the paper: is a head's attention to position 0 (the ⟨bos⟩) won
by the *norm* of the sink key k_0 or by its *angle* to the queries?

Inputs are the C core's captures (:meth:`sinklab.Model.run`): ``q`` (L, H, T, hd) and ``k``
(L, G, T, hd) **after RoPE** (and after QK-norm where the family has one), i.e. exactly the
vectors whose scaled dot products are the attention logits; and the ``stats`` capture's
first-token importance a_0 (:class:`sinklab.AttentionStats`). With grouped-query attention,
query head h reads kv head g = h // (H / G) (as Hugging Face's ``repeat_kv``). At position 0 RoPE
is the identity, so k_0 is the un-rotated key of the ⟨bos⟩.

Definitions, per (layer, head), with s the attention scale (``config.attn_scale``, default
1/sqrt(hd)) and logits ℓ_ij = s q_i·k_j (before any soft-cap; none for LLaMA, Qwen, Gemma 3).
Queries i range over I = {1, ..., T-1} (query 0 sees only key 0, so it has no other key to
compare with); the other keys of query i are J_i = {1, ..., i} (causal; {1, ..., T-1} for a
bidirectional model); Π = {(i, j): i ∈ I, j ∈ J_i} are the (query, other key) pairs.

- S_0 = mean_{i∈I} ℓ_i0, the mean sink logit; S_1 = mean_{(i,j)∈Π} ℓ_ij, the mean other logit.
- The mean logit gap Δ = S_0 − S_1 (logit units, nats of the softmax).
- n_0 = ‖k_0‖ and N_1 = mean_{(i,j)∈Π} ‖k_j‖ (the pair-weighted mean norm of the other keys).
- C_0 = S_0 / n_0 = mean_i s‖q_i‖ cos θ_i0 and C_1 = S_1 / N_1, the mean logit per unit of key
  norm (the norm-weighted mean of s‖q_i‖ cos θ_ij over Π), so that S_0 = n_0 C_0 and S_1 = N_1 C_1.
- The split (exact identity, Oaxaca-style with the other keys' norm as reference)::

      Δ = (n_0 − N_1) C_0  +  N_1 (C_0 − C_1)
          \\_ norm term _/     \\_ angle term _/

  The norm term is what k_0's excess norm buys at k_0's own alignment; the angle term is what
  k_0's better alignment buys at the other keys' norm. Scaling k_0 by c > 1 changes only the
  norm term (to (c n_0 − N_1) C_0); the angle term is unchanged.
- ``norm_share`` = |norm term| / (|norm term| + |angle term|) in [0, 1].
- Descriptors beside the split: ``log_norm_ratio`` = log(n_0 / mean_{j≥1} ‖k_j‖) and
  ``cos_gap`` = mean_{i∈I} cos θ_i0 − mean_{(i,j)∈Π} cos θ_ij; ``cos0_mean`` / ``cos0_std`` the
  mean and spread (population std) of cos θ_i0 over i ∈ I.

Every number is computed per prompt in float64 and kept as (P, L, H) arrays; summaries average
over prompts, intervals bootstrap over prompts (:mod:`sinklab.analysis.stats`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..batching import run_each
from ..results import load_npz, save_npz, to_jsonable
from .massive import Prompt, sequences
from .stats import Interval, mean_ci
from ..reprs import compact_repr

FORMAT = "sinklab.KeyGeometry/1"
FIELDS = ("a0", "k0_norm", "kj_norm", "cos0_mean", "cos0_std", "cosj_mean", "sink_logit", "other_logit",
          "other_key_norm", "norm_term", "angle_term")


def logits_of(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """(H, T, T) float64 scaled logits s q_i·k_j of one layer from q (H, T, hd) and k (G, T, hd)
    (query head h reads kv head h // (H/G)); no mask, no soft-cap."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    H, G = q.shape[0], k.shape[0]
    return scale * np.einsum("htd,hsd->hts", q, k[np.arange(H) // (H // G)])


def geometry_of(q: np.ndarray, k: np.ndarray, scale: float, bidirectional: bool = False) -> Dict[str, np.ndarray]:
    """The module docstring's quantities for one sequence, from its captures.

    Args:
        q: (L, H, T, hd) queries after RoPE; k: (L, G, T, hd) keys after RoPE (T >= 2).
        scale: the logit scale s. bidirectional: every query sees every key.

    Returns:
        {name: (L, H) float64} for every name of :data:`FIELDS` but ``a0``.
    """
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    L, H, T, _ = q.shape
    if T < 2:
        raise ValueError(f"key geometry needs T >= 2 tokens, got {T}")
    G = k.shape[1]
    kk = k[:, np.arange(H) // (H // G)]                                  # (L, H, T, hd)
    qn, kn = np.linalg.norm(q, axis=-1), np.linalg.norm(kk, axis=-1)     # (L, H, T)
    dots = np.einsum("lhtd,lhsd->lhts", q, kk)                           # (L, H, T, T)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = dots / (qn[..., :, None] * kn[..., None, :])
    i = np.arange(T)
    pair = np.ones((T, T), bool) if bidirectional else (i[None, :] <= i[:, None])
    pair[0, :] = False
    pair[:, 0] = False                                                   # Π: i >= 1, 1 <= j (<= i)
    npair = pair.sum()
    out = {"k0_norm": kn[..., 0], "kj_norm": kn[..., 1:].mean(-1),
           "cos0_mean": cos[..., 1:, 0].mean(-1), "cos0_std": cos[..., 1:, 0].std(-1),
           "cosj_mean": (cos * pair).sum((-2, -1)) / npair,
           "sink_logit": scale * dots[..., 1:, 0].mean(-1),
           "other_logit": scale * (dots * pair).sum((-2, -1)) / npair,
           "other_key_norm": (kn[..., None, :] * pair).sum((-2, -1)) / npair}
    n0, N1 = out["k0_norm"], out["other_key_norm"]
    C0, C1 = out["sink_logit"] / n0, out["other_logit"] / N1
    out["norm_term"] = (n0 - N1) * C0
    out["angle_term"] = N1 * (C0 - C1)
    return out


@compact_repr
@dataclass
class KeyGeometry:
    """Key geometry of every (prompt, layer, head); each array field (P, L, H) float64, names and
    definitions in :mod:`sinklab.analysis.key_geometry`'s docstring (logits and terms in logit
    units, norms in the captured q/k units, cosines dimensionless, a0 in [0, 1]).

    Attributes:
        a0: first-token importance from the ``stats`` capture.
        k0_norm, kj_norm: ‖k_0‖ and the mean ‖k_j‖ over j >= 1.
        cos0_mean, cos0_std: mean and std over queries i >= 1 of cos(q_i, k_0).
        cosj_mean: mean cos(q_i, k_j) over the pairs Π.
        sink_logit, other_logit: S_0 and S_1. other_key_norm: N_1.
        norm_term, angle_term: the split of Δ = S_0 − S_1.
        attn_check: max |softmax of the formed logits − captured attn| over prompts, or NaN
            when not checked (``check_attn=False``).
        T, bos, scale, model, meta: the setup.
    """

    a0: np.ndarray
    k0_norm: np.ndarray
    kj_norm: np.ndarray
    cos0_mean: np.ndarray
    cos0_std: np.ndarray
    cosj_mean: np.ndarray
    sink_logit: np.ndarray
    other_logit: np.ndarray
    other_key_norm: np.ndarray
    norm_term: np.ndarray
    angle_term: np.ndarray
    T: int
    bos: bool
    scale: float
    model: str
    attn_check: float = float("nan")
    source: str = ""
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return int(self.a0.shape[0])

    @property
    def gap(self) -> np.ndarray:
        """(P, L, H): Δ = S_0 − S_1, the mean logit gap of the sink key over the others."""
        return self.sink_logit - self.other_logit

    @property
    def norm_share(self) -> np.ndarray:
        """(P, L, H) in [0, 1]: |norm term| / (|norm term| + |angle term|) (NaN when both are 0)."""
        a, b = np.abs(self.norm_term), np.abs(self.angle_term)
        with np.errstate(divide="ignore", invalid="ignore"):
            return a / (a + b)

    @property
    def norm_ratio(self) -> np.ndarray:
        """(P, L, H): ‖k_0‖ / mean_{j>=1} ‖k_j‖."""
        return self.k0_norm / self.kj_norm

    @property
    def log_norm_ratio(self) -> np.ndarray:
        return np.log(self.norm_ratio)

    @property
    def cos_gap(self) -> np.ndarray:
        """(P, L, H): mean cos θ_i0 − mean cos θ_ij."""
        return self.cos0_mean - self.cosj_mean

    def strongest(self, n: int = 5) -> List[Tuple[int, int]]:
        """The n (layer, head) pairs with the largest mean a_0 over prompts, strongest first."""
        m = self.a0.mean(axis=0)
        flat = np.argsort(-m, axis=None, kind="stable")[:int(n)]
        return [(int(f // m.shape[1]), int(f % m.shape[1])) for f in flat]

    def head_summary(self, layer: int, head: int, **kw: Any) -> Dict[str, Any]:
        """One head's numbers, means over prompts, with bootstrap intervals for a0, the gap and
        the norm share."""
        L, H = self.a0.shape[1:]
        for name, v, n in (("layer", layer, L), ("head", head, H)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
                raise ValueError(f"{name} must be an integer in [0, {n}), got {v!r}")
        sl = (slice(None), int(layer), int(head))
        return {"layer": int(layer), "head": int(head), "a0": mean_ci(self.a0[sl], **kw).to_dict(),
                "gap": mean_ci(self.gap[sl], **kw).to_dict(), "norm_share": mean_ci(self.norm_share[sl], **kw).to_dict(),
                "norm_term": float(self.norm_term[sl].mean()), "angle_term": float(self.angle_term[sl].mean()),
                "norm_ratio": float(self.norm_ratio[sl].mean()), "cos0_mean": float(self.cos0_mean[sl].mean()),
                "cos0_std": float(self.cos0_std[sl].mean()), "cosj_mean": float(self.cosj_mean[sl].mean())}

    def sink_heads_norm_share(self, eps: float = 0.3, **kw: Any) -> Interval:
        """Bootstrap interval over prompts of the mean norm share over the heads whose mean a_0
        exceeds ``eps`` (NaN interval when there is none)."""
        mask = self.a0.mean(axis=0) > eps
        if not mask.any():
            return Interval(float("nan"), float("nan"), float("nan"), 0)
        return mean_ci(self.norm_share[:, mask], **kw)

    def summary(self, n: int = 5) -> Dict[str, Any]:
        return to_jsonable({"model": self.model, "T": self.T, "bos": self.bos, "n_prompts": self.n_prompts,
                            "scale": self.scale, "attn_check": self.attn_check,
                            "sink_heads_norm_share": self.sink_heads_norm_share().to_dict(),
                            "strongest": [self.head_summary(l, h) for l, h in self.strongest(n)]})

    def __str__(self) -> str:
        heads = ", ".join(f"L{l}H{h} a0={self.a0[:, l, h].mean():.2f} norm share {self.norm_share[:, l, h].mean():.2f}"
                          for l, h in self.strongest(3))
        return f"KeyGeometry({self.model}, {self.n_prompts} prompts, T={self.T}: {heads})"

    # ------------------------------------------------------------------ persistence
    def _meta(self) -> Dict[str, Any]:
        return {"format": FORMAT, "T": self.T, "bos": self.bos, "scale": self.scale, "model": self.model,
                "attn_check": self.attn_check, "source": self.source, "meta": self.meta}

    def to_dict(self) -> Dict[str, Any]:
        d = self._meta()
        d.update({f: getattr(self, f) for f in FIELDS})
        return to_jsonable(d)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "KeyGeometry":
        if d.get("format") != FORMAT:
            raise ValueError(f"not a saved KeyGeometry (format {d.get('format')!r}, expected {FORMAT!r})")
        ac = d.get("attn_check")
        return cls(**{f: np.asarray(d[f], np.float64) for f in FIELDS}, T=int(d["T"]), bos=bool(d["bos"]),
                   scale=float(d["scale"]), model=str(d["model"]),
                   attn_check=float("nan") if ac is None else float(ac), source=d.get("source", ""),
                   meta=d.get("meta", {}))

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Writes an ``.npz`` (arrays + JSON metadata, no pickle); returns the file written."""
        return save_npz(path, {f: getattr(self, f) for f in FIELDS}, self._meta())

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "KeyGeometry":
        arrays, d = load_npz(path)
        d.update(arrays)
        return cls.from_dict(d)


def _softmax_check(q: np.ndarray, k: np.ndarray, attn: np.ndarray, scale: float, softcap: float,
                   bidirectional: bool) -> float:
    """max |softmax(masked, soft-capped s q·k) − attn| over one sequence's layers."""
    T = q.shape[2]
    i = np.arange(T)
    mask = np.ones((T, T), bool) if bidirectional else (i[None, :] <= i[:, None])
    err = 0.0
    for l in range(q.shape[0]):
        z = logits_of(q[l], k[l], scale)
        if softcap > 0:
            z = softcap * np.tanh(z / softcap)
        z = np.where(mask, z, -np.inf)
        z = np.exp(z - z.max(-1, keepdims=True))
        err = max(err, float(np.abs(z / z.sum(-1, keepdims=True) - attn[l]).max()))
    return err


def key_geometry(model, prompts: Optional[Sequence[Prompt]] = None, T: int = 64, bos: bool = True,
                 skip_short: bool = False, check_attn: bool = False, progress: bool = True,
                 batch_bytes: Optional[int] = None) -> KeyGeometry:
    """Norm vs angle of the sink key k_0, per (prompt, layer, head) (definitions in the module
    docstring).

    Args:
        model: a :class:`sinklab.Model` with attention over rotary or learned positions.
        prompts: strings (tokenized without BOS) or 1-D token-id arrays; default the shipped
            passages (split ``"sinks"``). Each is cut to T tokens, the BOS included.
        T: tokens per sequence (2 <= T <= context length, and no longer than any sliding
            window, so that every query sees key 0).
        bos: prepend the model's BOS (ValueError if it has none).
        skip_short: leave out prompts shorter than T instead of raising ValueError.
        check_attn: also capture ``attn`` and record in ``attn_check`` the largest difference
            between it and the softmax of the logits formed here (a self-check, float64).
        progress: a tqdm bar over prompts. batch_bytes: the forward's memory cap per call.

    Returns:
        A :class:`KeyGeometry` with (P, L, H) float64 arrays.
    """
    seqs, keep, source = sequences(model, prompts, T, bos, skip_short)
    c = model.config
    P, T = seqs.shape
    windows = [w for w in (c.window or []) if w > 0]
    if windows and T > min(windows):
        raise ValueError(f"T={T} exceeds the sliding window of {min(windows)} tokens: later queries could not "
                         f"see key 0; use T <= {min(windows)}")
    scale = float(c.attn_scale) if c.attn_scale is not None else c.head_dim ** -0.5
    cap = ("q", "k", "stats") + (("attn",) if check_attn else ())
    arrays = {f: np.empty((P, c.n_layers, c.n_heads)) for f in FIELDS}
    err = 0.0 if check_attn else float("nan")
    for p, tr in run_each(model, seqs, cap, batch_bytes=batch_bytes, progress=progress,
                          desc=f"key geometry (T={T})", unit="prompt"):
        g = geometry_of(tr.q, tr.k, scale, c.bidirectional)
        for f, v in g.items():
            arrays[f][p] = v
        arrays["a0"][p] = tr.stats.importance[..., 0]
        if check_attn:
            err = max(err, _softmax_check(tr.q, tr.k, tr.attn, scale, float(c.attn_softcap), c.bidirectional))
    return KeyGeometry(**arrays, T=int(T), bos=bool(bos), scale=scale, model=model.name, attn_check=err,
                       source=source, meta={"kept_prompts": keep, "n_kv_heads": c.n_kv_heads,
                                            "qk": "after RoPE (and QK-norm), as captured"})

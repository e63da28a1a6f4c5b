"""Massive activations (Sun et al., 2024, "Massive activations in large language models"), beyond
the paper: which residual-stream entries are orders of magnitude larger than the rest, on which
token and in which dimensions, and which block writes them.

Questions answered, per residual stream l = 0..L (``resid[l]`` enters layer l, ``resid[L]`` is
the last layer's output before the final norm):

- how large is the largest |x_{l,t,j}| compared with the layer's median |x_{l,t,j}| over all
  T positions and d dimensions (the *top ratio*, dimensionless);
- where do the ``top`` largest entries sit: their token positions (position 0, the ⟨bos⟩ with
  ``bos=True``, vs the others) and their dimensions, and how consistently across prompts
  (fraction of prompts in which dimension j is among the top entries' dimensions);
- at which layer does position 0's residual norm jump (the largest mean over prompts of
  ‖x_{l+1,0}‖ / ‖x_{l,0}‖) and which block of that layer writes the jump: the attention output
  or the MLP output (their norms at position 0, from the ``attn_out`` / ``mlp_out`` captures);
- for that layer's MLP, which hidden neurons write it. The C core does not capture the MLP's
  hidden activations, so for that one layer and position the neurons' contributions are
  recomputed here in float64 NumPy from the model's weights (:meth:`sinklab.Model.weight`) and
  the captured MLP input (``resid[l] + attn_out[l]``, pre-norm families only); their sum is
  checked against the captured ``mlp_out`` (``neuron_check``, the relative error).

Neuron contribution (pre-norm gated MLP, SwiGLU or GeGLU): with u = norm(resid + attn_out) at
position 0, a_n = act(W_gate[n] · u + b) · (W_up[n] · u + b) and c_n = a_n W_down[:, n]
(d,), so Σ_n c_n + b_down = mlp_out (ungated: a_n = act(W_up[n] · u + b)). With a post-MLP norm
(Gemma 2/3) every c_n is multiplied by the same w / rms(Σ c + b_down), so the sum still
reproduces ``mlp_out`` exactly. A neuron's *share* is c_n · m / ‖m‖² for m = mlp_out at position 0
(the shares and the bias's sum to 1).

Headline intervals are percentile bootstraps over prompts (:mod:`sinklab.analysis.stats`).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..batching import run_each
from ..inputs import prepare, text_budget
from ..progress import progress_bar
from ..results import load_npz, save_npz, to_jsonable
from .sinkset import check_T, default_prompts, select_prompts, token_lists
from .stats import Interval, mean_ci
from ..reprs import compact_repr

Prompt = Union[str, Sequence[int], np.ndarray]
FORMAT = "sinklab.MassiveActivations/1"


def sequences(model, prompts: Optional[Sequence[Prompt]], T: int, bos: bool,
              skip_short: bool = False) -> Tuple[np.ndarray, List[int], str]:
    """(P, T) int64 token ids, one row per prompt kept: [BOS] + the first T - 1 tokens with
    ``bos`` (the BOS counts among the T), else the first T; the kept prompts' indices; a
    description of the source. ValueError for T out of range, no BOS with ``bos=True``, or a
    prompt shorter than needed (unless ``skip_short``)."""
    model.bos_id(bos)                                   # ValueError when the model has no BOS
    T = check_T(model, T, 0)
    prompts, source = default_prompts(prompts)
    tokens = token_lists(model, prompts)
    keep, _ = select_prompts(prompts, tokens, text_budget(T, bos), T, skip_short)
    return np.stack([prepare(model, tokens[i], bos, T) for i in keep]), keep, source


def _norm(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray], kind: str, eps: float) -> np.ndarray:
    if kind == "layernorm":
        y = (x - x.mean()) / np.sqrt(((x - x.mean()) ** 2).mean() + eps)
    else:
        y = x / np.sqrt((x * x).mean() + eps)
    return y * w + (0.0 if b is None else b)


def _act(x: np.ndarray, act: str) -> np.ndarray:
    if act == "swiglu":
        return x / (1.0 + np.exp(-x))
    if act in ("geglu_tanh", "gelu_tanh"):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    from math import erf
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))


def has_neurons(model) -> bool:
    """Whether :func:`mlp_neurons` applies: a pre-norm MLP (``ffn_norm``, no post-residual norms)."""
    n = model.config.layer_norms
    return "ffn_norm" in n and "ffn_res_norm" not in n and "attn_res_norm" not in n


def mlp_neurons(model, layer: int, mlp_in: np.ndarray,
                cache: Optional[Dict[str, np.ndarray]] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The MLP of ``layer`` on one residual vector, neuron by neuron, in float64.

    Args:
        model: a pre-norm :class:`sinklab.Model` (``ffn_norm`` present, no post-residual norms).
        layer: the layer index in [0, L).
        mlp_in: (d,) the residual stream the MLP reads before its norm (``resid[l] + attn_out[l]``).
        cache: an optional dict kept between calls for the same layer: the float64 weights
            (dequantized once instead of on every call).

    Returns:
        (a (F,) the neurons' activations, C (F, d) their contributions to the residual stream,
        bias (d,) the part that is no neuron's: b_down, times the post-norm factor if any), with
        C.sum(0) + bias = the block's output.
    """
    c = model.config
    if not has_neurons(model):
        raise ValueError(f"{model.name}: neuron contributions need a pre-norm MLP (ffn_norm, no post-residual norms)")
    p = f"blk.{int(layer)}."
    cache = {} if cache is None else cache

    def W(n: str) -> np.ndarray:
        if p + n not in cache:
            cache[p + n] = model.weight(p + n).astype(np.float64)
        return cache[p + n]

    opt = lambda n: W(n) if p + n in model.weights else None  # noqa: E731
    u = _norm(np.asarray(mlp_in, np.float64), W("ffn_norm"), opt("ffn_norm_b"), c.norm_kind, c.norm_eps)
    up = W("ffn_up") @ u + (opt("ffn_up_b") if opt("ffn_up_b") is not None else 0.0)
    if c.gated:
        g = W("ffn_gate") @ u + (opt("ffn_gate_b") if opt("ffn_gate_b") is not None else 0.0)
        a = _act(g, c.act) * up
    else:
        a = _act(up, c.act)
    down = W("ffn_down")                                              # (d, F)
    C = (down * a[None, :]).T                                         # (F, d)
    bias = opt("ffn_down_b")
    bias = np.zeros(c.d_model) if bias is None else bias
    if "ffn_post_norm" in c.layer_norms:
        tot = C.sum(axis=0) + bias
        f = W("ffn_post_norm") / np.sqrt((tot * tot).mean() + c.norm_eps)
        C, bias = C * f[None, :], bias * f
    return a, C, bias


@compact_repr
@dataclass
class MassiveActivations:
    """Massive activations of a model over P prompts of T tokens (see the module docstring).

    Attributes (P prompts, S = L + 1 residual streams, k = ``top``, d model width):
        top_value: (P, S, k) float64, the k largest-|x| entries of each stream (signed values,
            residual-stream units), largest first; ``top_pos`` / ``top_dim`` (P, S, k) int64 their
            token position and dimension.
        median_abs: (P, S) float64, the median |x| over the stream's T x d entries.
        bos_norm: (P, S) float64, ‖x_{l,0}‖; ``other_norm`` (P, S) the mean ‖x_{l,t}‖ over t >= 1.
        attn_norm0 / mlp_norm0: (P, L) float64, ‖attn_out[l, 0]‖ and ‖mlp_out[l, 0]‖.
        dim_frequency: (S, d) float64, fraction of prompts in which dimension j is among the
            dimensions of the stream's k top entries.
        jump_layer: the layer l whose output most multiplies position 0's norm (argmax over l of
            the mean over prompts of ‖x_{l+1,0}‖/‖x_{l,0}‖).
        writer: ``"mlp"`` or ``"attn"``, the block of ``jump_layer`` with the larger mean norm
            at position 0.
        neurons: (n,) int64, the jump layer's MLP neurons with the largest mean contribution
            norm at position 0 (None when the family's MLP is not pre-norm);
            ``neuron_norm`` (P, n) their contribution norms, ``neuron_share`` (P, n) their
            shares c_n·m/‖m‖², ``neuron_act`` (P, n) their activations.
        neuron_check: max over prompts of ‖Σ_n c_n + b − mlp_out‖ / ‖mlp_out‖ at position 0
            (the NumPy recomputation against the C capture).
        T, bos, top, model, source, meta: the setup.
    """

    top_value: np.ndarray
    top_pos: np.ndarray
    top_dim: np.ndarray
    median_abs: np.ndarray
    bos_norm: np.ndarray
    other_norm: np.ndarray
    attn_norm0: np.ndarray
    mlp_norm0: np.ndarray
    dim_frequency: np.ndarray
    jump_layer: int
    writer: str
    T: int
    bos: bool
    top: int
    model: str
    neurons: Optional[np.ndarray] = None
    neuron_norm: Optional[np.ndarray] = None
    neuron_share: Optional[np.ndarray] = None
    neuron_act: Optional[np.ndarray] = None
    neuron_check: float = float("nan")
    source: str = ""
    meta: Dict[str, Any] = field(default_factory=dict)

    _ARRAYS = ("top_value", "top_pos", "top_dim", "median_abs", "bos_norm", "other_norm", "attn_norm0",
               "mlp_norm0", "dim_frequency", "neurons", "neuron_norm", "neuron_share", "neuron_act")

    # ------------------------------------------------------------------ derived numbers
    @property
    def n_prompts(self) -> int:
        return int(self.top_value.shape[0])

    @property
    def top_ratio(self) -> np.ndarray:
        """(P, S) float64: the largest |x| of each stream over its median |x| (dimensionless)."""
        return np.abs(self.top_value[..., 0]) / self.median_abs

    @property
    def norm_jump(self) -> np.ndarray:
        """(P, L) float64: ‖x_{l+1,0}‖ / ‖x_{l,0}‖, how much layer l multiplies position 0's norm."""
        return self.bos_norm[:, 1:] / self.bos_norm[:, :-1]

    @property
    def bos_fraction(self) -> np.ndarray:
        """(S,) float64: fraction of the top entries (all prompts) at position 0."""
        return (self.top_pos == 0).mean(axis=(0, 2))

    @property
    def top_at_bos(self) -> np.ndarray:
        """(S,) float64: fraction of prompts whose single largest entry is at position 0."""
        return (self.top_pos[..., 0] == 0).mean(axis=0)

    def _stream(self, layer: Any) -> int:
        S = self.median_abs.shape[1]
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < S:
            raise ValueError(f"layer must be a residual stream index in [0, {S}), got {layer!r}")
        return int(layer)

    def top_dims(self, layer: int, n: int = 3) -> List[int]:
        """The n dimensions most often among stream ``layer``'s top entries, most frequent first
        (ties broken by the summed |x| of their top entries over prompts)."""
        layer = self._stream(layer)
        f = self.dim_frequency[layer]
        w = np.zeros_like(f)
        np.add.at(w, self.top_dim[:, layer].ravel(), np.abs(self.top_value[:, layer]).ravel())
        order = np.lexsort((-w, -f))
        return [int(j) for j in order[:n] if f[j] > 0]

    def ratio_ci(self, layer: Optional[int] = None, **kw: Any) -> Interval:
        """Bootstrap interval over prompts of the mean top ratio of stream ``layer`` (default:
        the stream with the largest mean ratio)."""
        r = self.top_ratio
        l = int(np.argmax(r.mean(axis=0))) if layer is None else self._stream(layer)
        return mean_ci(r[:, l], **kw)

    def jump_ci(self, **kw: Any) -> Interval:
        """Bootstrap interval over prompts of the mean norm jump ‖x_{l+1,0}‖/‖x_{l,0}‖ at ``jump_layer``."""
        return mean_ci(self.norm_jump[:, self.jump_layer], **kw)

    def summary(self) -> Dict[str, Any]:
        """The headline numbers as plain JSON-able values."""
        r = self.top_ratio.mean(axis=0)
        lmax = int(np.argmax(r))
        l = self.jump_layer
        out = {"model": self.model, "T": self.T, "bos": self.bos, "n_prompts": self.n_prompts, "top": self.top,
               "max_ratio_layer": lmax, "max_ratio": self.ratio_ci(lmax).to_dict(),
               "max_ratio_top_at_bos": float(self.top_at_bos[lmax]), "max_ratio_dims": self.top_dims(lmax),
               "mean_top_ratio": r.tolist(), "bos_fraction": self.bos_fraction.tolist(),
               "jump_layer": l, "jump": self.jump_ci().to_dict(), "writer": self.writer,
               "attn_norm0": float(self.attn_norm0[:, l].mean()), "mlp_norm0": float(self.mlp_norm0[:, l].mean()),
               "jump_dims": self.top_dims(l + 1)}
        if self.neurons is not None:
            out.update(neurons=self.neurons.tolist(), neuron_share=self.neuron_share.mean(axis=0).tolist(),
                       neuron_check=self.neuron_check)
        return to_jsonable(out)

    def __str__(self) -> str:
        s = self.summary()
        return (f"MassiveActivations({self.model}, {self.n_prompts} prompts, T={self.T}: top/median "
                f"{self.ratio_ci(s['max_ratio_layer']).fmt('.0f')} at stream {s['max_ratio_layer']}, "
                f"⟨bos⟩ norm jump x{self.jump_ci().fmt('.1f')} at layer {self.jump_layer} ({self.writer})")

    # ------------------------------------------------------------------ persistence
    def _meta(self) -> Dict[str, Any]:
        return {"format": FORMAT, "jump_layer": self.jump_layer, "writer": self.writer, "T": self.T,
                "bos": self.bos, "top": self.top, "model": self.model, "neuron_check": self.neuron_check,
                "source": self.source, "meta": self.meta}

    def to_dict(self) -> Dict[str, Any]:
        """Everything as JSON-able values (arrays as nested lists)."""
        d = self._meta()
        d.update({k: getattr(self, k) for k in self._ARRAYS})
        return to_jsonable(d)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "MassiveActivations":
        if d.get("format") != FORMAT:
            raise ValueError(f"not a saved MassiveActivations (format {d.get('format')!r}, expected {FORMAT!r})")
        ints = ("top_pos", "top_dim", "neurons")
        arr = {k: None if d.get(k) is None else np.asarray(d[k], np.int64 if k in ints else np.float64)
               for k in cls._ARRAYS}
        nc = d.get("neuron_check")
        return cls(**arr, jump_layer=int(d["jump_layer"]), writer=str(d["writer"]), T=int(d["T"]),
                   bos=bool(d["bos"]), top=int(d["top"]), model=str(d["model"]),
                   neuron_check=float("nan") if nc is None else float(nc), source=d.get("source", ""),
                   meta=d.get("meta", {}))

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Writes an ``.npz`` (arrays + JSON metadata, no pickle); returns the file written."""
        arrays = {k: getattr(self, k) for k in self._ARRAYS if getattr(self, k) is not None}
        return save_npz(path, arrays, self._meta())

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "MassiveActivations":
        """Reads what :meth:`save` wrote."""
        arrays, d = load_npz(path)
        d.update(arrays)
        return cls.from_dict(d)


def massive_activations(model, prompts: Optional[Sequence[Prompt]] = None, T: int = 64, bos: bool = True,
                        top: int = 8, n_neurons: int = 5, skip_short: bool = False,
                        progress: bool = True, batch_bytes: Optional[int] = None) -> MassiveActivations:
    """Where a model's residual stream carries massive activations and what writes them.

    Args:
        model: a :class:`sinklab.Model`.
        prompts: strings (tokenized without BOS) or 1-D token-id arrays; default the shipped
            passages (split ``"sinks"``). Each is cut to T tokens, the BOS included.
        T: tokens per sequence (>= 2, within the context length).
        bos: prepend the model's BOS (ValueError if it has none).
        top: k, how many largest-|x| entries to keep per stream (1 <= k <= T*d).
        n_neurons: how many of the jump layer's MLP neurons to report.
        skip_short: leave out prompts shorter than T instead of raising ValueError.
        progress: a tqdm bar over prompts. batch_bytes: the forward's memory cap per call.

    Returns:
        A :class:`MassiveActivations` (shapes in its docstring).
    """
    seqs, keep, source = sequences(model, prompts, T, bos, skip_short)
    c = model.config
    P, T = seqs.shape
    L, d, S = c.n_layers, c.d_model, c.n_layers + 1
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or not 1 <= top <= T * d:
        raise ValueError(f"top must be an integer in [1, T*d = {T * d}], got {top!r}")
    if isinstance(n_neurons, bool) or not isinstance(n_neurons, (int, np.integer)) or not 1 <= n_neurons <= c.d_ff:
        raise ValueError(f"n_neurons must be an integer in [1, d_ff = {c.d_ff}], got {n_neurons!r}")
    k = int(top)
    tv, tp, td = np.empty((P, S, k)), np.empty((P, S, k), np.int64), np.empty((P, S, k), np.int64)
    med, bn, on = np.empty((P, S)), np.empty((P, S)), np.empty((P, S))
    an, mn = np.empty((P, L)), np.empty((P, L))
    freq = np.zeros((S, d))
    mlp_in0, mlp_out0 = np.empty((P, L, d)), np.empty((P, L, d))
    for p, tr in run_each(model, seqs, ("resid", "attn_out", "mlp_out"), batch_bytes=batch_bytes,
                          progress=progress, desc=f"massive activations (T={T})", unit="prompt"):
        x = tr.resid.astype(np.float64)                               # (S, T, d)
        a = np.abs(x).reshape(S, -1)
        idx = np.argpartition(-a, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(a, idx, 1), axis=1, kind="stable")
        idx = np.take_along_axis(idx, order, 1)
        tv[p] = np.take_along_axis(x.reshape(S, -1), idx, 1)
        tp[p], td[p] = idx // d, idx % d
        for l in range(S):
            freq[l, np.unique(td[p, l])] += 1
        med[p] = np.median(a, axis=1)
        norms = np.linalg.norm(x, axis=2)                             # (S, T)
        bn[p], on[p] = norms[:, 0], norms[:, 1:].mean(axis=1)
        ao, mo = tr.attn_out.astype(np.float64), tr.mlp_out.astype(np.float64)
        an[p], mn[p] = np.linalg.norm(ao[:, 0], axis=1), np.linalg.norm(mo[:, 0], axis=1)
        mlp_in0[p], mlp_out0[p] = x[:L, 0] + ao[:, 0], mo[:, 0]
    jump = (bn[:, 1:] / bn[:, :-1]).mean(axis=0)
    jl = int(np.argmax(jump))
    writer = "mlp" if mn[:, jl].mean() >= an[:, jl].mean() else "attn"
    res = MassiveActivations(top_value=tv, top_pos=tp, top_dim=td, median_abs=med, bos_norm=bn, other_norm=on,
                             attn_norm0=an, mlp_norm0=mn, dim_frequency=freq / P, jump_layer=jl, writer=writer,
                             T=int(T), bos=bool(bos), top=k, model=model.name, source=source,
                             meta={"kept_prompts": keep, "n_layers": L, "d_model": d})
    if not has_neurons(model):
        return res                                                    # not a pre-norm MLP: no neurons
    acts, norms_, shares, err, cache = [], [], [], 0.0, {}
    for p in progress_bar(range(P), progress, desc=f"MLP neurons of layer {jl}", unit="prompt"):
        a, C, b = mlp_neurons(model, jl, mlp_in0[p, jl], cache)
        m = mlp_out0[p, jl]
        err = max(err, float(np.linalg.norm(C.sum(axis=0) + b - m) / max(np.linalg.norm(m), 1e-30)))
        acts.append(a)
        norms_.append(np.linalg.norm(C, axis=1))
        shares.append(C @ m / max(float(m @ m), 1e-30))
    acts, norms_, shares = np.array(acts), np.array(norms_), np.array(shares)
    nz = np.argsort(-norms_.mean(axis=0), kind="stable")[:int(n_neurons)]
    res.neurons, res.neuron_norm, res.neuron_share, res.neuron_act = nz.astype(np.int64), norms_[:, nz], shares[:, nz], acts[:, nz]
    res.neuron_check = err
    return res

"""The multi-head over-squashing bound (the paper's Thm. 3.2), computed from captured attention
and the weights as a rigorous local bound, and compared with the measured Jacobian.

The paper bounds the sensitivity of token i's final representation to token j's input by a
sum over causal paths of products of head-summed attention weights,

    || d v_i^(L) / d v_j^(l) ||  <=  sum_{paths j = k_l <= ... <= k_L = i} prod_l abar^(l)_{k_{l+1}, k_l}
                                 =   (abar^(L-1) ... abar^(l))_{i, j},
    abar^(l) = sum_h c_{l,h} A^(l,h) + I     (up to a constant C_l per layer),

with C and c_{l,h} "collecting Lipschitz constants and weight norms". The exact form of the
constants is not fixed by the paper's statement; here they are derived for the model sinklab
runs (pre-norm LLaMA: RMSNorm, RoPE, causal GQA softmax attention, SwiGLU MLP) so that the
bound holds at the given input, and the form is a parameter (``constants=``).

Notation. v^(l) = ``resid[l]`` (T, d), the stream entering layer l (0 = embeddings, L = last
layer's output before the final norm). ||.|| is the spectral norm (largest singular value) of
a d x d block, the Euclidean norm of a vector. For a layer, x = resid[l], h = x + Attn(N1(x)),
y = h + MLP(N2(h)) = resid[l+1].

Derivation (each step an inequality that holds exactly at the input; nothing is linearised
away, the Jacobian *is* the linearisation):

1. RMSNorm. N(x) = w * x * r, r = 1/sqrt(mean(x^2) + eps) (``norm_eps``, as the model computes
   it). Its Jacobian is J_N(x) = r diag(w) P with P = I - x x^T / (d (mean(x^2) + eps)); P is
   symmetric with eigenvalues 1 and 1 - mean(x^2)/(mean(x^2)+eps) in [0, 1], so ||P|| <= 1 and
   for any matrix W, ||W J_N(x)|| <= r ||W diag(w)||. Every weight below that reads a norm's
   output is taken with the norm weight folded in (W' = W diag(w)), which is tighter than
   max|w| ||W|| and equally rigorous.

2. Residual structure. The layer's (T d x T d) Jacobian is block lower-triangular (causal);
   block (k, m) (output position k, input position m) is

       dy_k/dx_m = (I + D_k) (delta_km I + dAttn_k/dx_m),

   D_k = dMLP(N2(h_k))/dh_k (the MLP is position-wise), hence
   ||block_km|| <= (1 + ||D_k||) (delta_km + ||dAttn_k/dx_m||).

3. MLP. MLP(n) = W_down (silu(g) * u), g = W_gate n, u = W_up n, n = N2(h). With
   a = silu'(g) * u, b = silu(g) (d_ff vectors at position k),
   D_k = W_down (diag(a) W_gate' + diag(b) W_up') r2_k P2_k. Two cheap bounds, the minimum taken
   (``mlp="fast"``):
       ||D_k|| <= r2_k ||W_down|| (max|a| ||W_gate'|| + max|b| ||W_up'||),
       ||D_k|| <= r2_k ||W_down|| max_f sqrt(a_f^2 + b_f^2) ||[W_gate'; W_up']||
   (the second because [diag(a) diag(b)] has norm max_f sqrt(a_f^2 + b_f^2)).
   ``mlp="exact"`` forms D_k (d x d) exactly in float64 and uses ||I + D_k|| in place of
   1 + ||D_k|| (d^2 d_ff flops and one d x d SVD per position: seconds on SmolLM2 at T = 64).

4. Attention, one query head h reading kv head g, scale s = 1/sqrt(hd), head factor gamma_h
   (``head_scale``; W_O^h is effectively gamma_h W_O^h). n_m = N1(x_m), q_k = R_k W_Q^h n_k,
   kk_m = R_m W_K^g n_m, v_m = W_V^g n_m (R_k the RoPE rotation, orthogonal, so it drops out of
   every norm), scores s q_k . kk_m, probabilities A_km, o_k = sum_m A_km v_m. Since
   dA_km'/dscore_km = A_km' (delta_m'm - A_km), d o_k / d score_km = A_km (v_m - o_k), and

       value path  A_km W_V^g
                   -> A_km ||W_O^h W_V^g'|| r1_m
       key path    A_km (v_m - o_k) (s q_k^T R_m W_K^g)
                   -> A_km ||W_O^h (v_m - o_k)|| s ||q_k|| ||W_K^g'|| r1_m
       query path  sum_m' A_km' (v_m' - o_k) (s kk_m'^T R_k W_Q^h)      (only m = k)
                   -> s sum_m' A_km' ||W_O^h (v_m' - o_k)|| ||kk_m'|| ||W_Q^h'|| r1_k

   (key path: a rank-one matrix, its norm is the product of the two vector norms, and
   ||W_K^T R_m^T q_k|| <= ||W_K'|| ||q_k||). The attention block is the sum over heads (the
   triangle inequality across heads), times gamma_h each.
   Interventions: ``mask_first`` only changes which keys a query may attend to; the softmax
   Jacobian over the allowed keys has the same form and the captured A (zero on masked keys)
   carries it. ``head_scale`` multiplies W_O^h. ``zero_first_value`` (the C core leaves key 0
   out of A V for the affected queries, the probabilities unchanged): for those queries v_0 is
   replaced by the constant 0, so the value path from position 0 vanishes and v_0 is 0 in
   o_k, v_m - o_k and the query path. All three are handled.

5. Path sums. With abar^(l)_{k,m} = (1 + ||D_k||) (delta_km + sum_h [value + key] +
   delta_km sum_h [query]) and the chain rule through the block-triangular layer Jacobians,
   ||d v_i^(L)/d v_j^(l)|| <= (abar^(L-1) ... abar^(l))_{i,j}: the rows b^(L) = e_i,
   b^(l) = b^(l+1) abar^(l) are the bound for every source position at every layer.

Forms (``constants=``):
  - ``"entrywise"`` (default): abar^(l)_{k,m} as in 5, with constants per entry: the tightest.
  - ``"per_head"``: the paper's form. abar^(l) = C_l ((1 + q_l) I + sum_h c_{l,h} A^(l,h)) with
    C_l = max_k (1 + ||D_k||), c_{l,h} = the largest per-entry coefficient of A^(l,h) (value +
    key path divided by A_km) over the entries with A_km > 0, q_l = max_k of the query-path
    sum. Equivalently C'_l (I + sum_h c'_{l,h} A^(l,h)) with C'_l = C_l (1 + q_l),
    c' = c / (1 + q_l). Entry by entry >= the entrywise matrix, so also a valid bound, looser.
  Both are local: the constants depend on the input (norm scales r, values, queries, keys, MLP
  activations), as any bound of a softmax network's Jacobian must.

Precision. The captures are float32 (what the C forward computed); everything after them runs
in float64. The bound is therefore the bound at the float32 forward's activations; comparing
it with a float64 Jacobian needs only a relative slack of float32 rounding (~1e-6; tests use
1e-4).

Norms compared: the bound is on the spectral norm. The Frobenius norm of a d x d block can
exceed it by up to sqrt(d); compare ``Sensitivity.spectral``, never ``.fro``.
"""
from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import numpy as np

from ..interventions import Intervention

CONSTANTS = ("entrywise", "per_head")
MLP_MODES = ("fast", "exact")
CAPTURE = ("attn", "resid", "q", "k", "v", "attn_out")


# ------------------------------------------------------------------------------ weight norms
@dataclass
class LayerNorms:
    """Spectral norms of one layer's weight blocks (float64), norm weights folded in (W' = W diag(w)).

    Attributes:
        o_r: (H, hd, hd) R factors of W_O^h = Q R (d x hd): ||W_O^h x|| = ||R_h x|| for any x.
        ov: (H,) ||W_O^h W_V^g'||.
        q: (H,) ||W_Q^h'||.
        k: (G,) ||W_K^g'||.
        down, gate, up, gate_up: ||W_down||, ||W_gate'||, ||W_up'||, ||[W_gate'; W_up']||.
    """

    o_r: np.ndarray
    ov: np.ndarray
    q: np.ndarray
    k: np.ndarray
    down: float
    gate: float
    up: float
    gate_up: float


_CACHE: "weakref.WeakKeyDictionary[Any, Dict[int, LayerNorms]]" = weakref.WeakKeyDictionary()


def _one_blas_thread() -> Any:
    """Single-threaded BLAS/LAPACK while the bound runs, when threadpoolctl is installed.

    Every matrix here is small (<= d_ff x d); on a loaded 2-core machine OpenBLAS's threaded
    symmetric eigensolver took 9.4 s for one 576 x 576 matrix, single-threaded 0.08 s."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _spec(m: np.ndarray) -> float:
    """Spectral norm: sqrt of the largest eigenvalue of the smaller Gram matrix (float64).

    LAPACK's SVD (``np.linalg.norm(m, 2)``) took 17 s for one 1536 x 576 matrix on a loaded
    2-core machine, the symmetric eigensolver 0.1 s; its relative error (~1e-13 here) is far
    below the float32 rounding of the captures the bound is built from."""
    if not m.size:
        return 0.0
    g = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    return float(np.sqrt(max(float(np.linalg.eigvalsh(g)[-1]), 0.0)))


def layer_norms(model: Any, layer: int) -> LayerNorms:
    """The weight constants of ``layer`` (cached per model).

    Q/K rows of a GGUF file are in llama.cpp's permuted layout; the permutation only reorders
    rows *within* each head's contiguous block of hd rows, so slicing rows h*hd:(h+1)*hd gives
    the head's block up to a row permutation, which leaves its spectral norm unchanged.
    """
    try:
        per_model = _CACHE.setdefault(model, {})
    except TypeError:                 # not weak-referenceable: no cache
        per_model = {}
    if layer in per_model:
        return per_model[layer]
    c = model.config
    H, G, hd = c.n_heads, c.n_kv_heads, c.head_dim
    W = lambda name: model.weight(f"blk.{layer}.{name}").astype(np.float64)  # noqa: E731
    w1, w2 = W("attn_norm"), W("ffn_norm")
    wq, wk, wv, wo = W("attn_q") * w1, W("attn_k") * w1, W("attn_v") * w1, W("attn_output")
    o_r = np.empty((H, hd, hd))
    ov = np.empty(H)
    qn = np.empty(H)
    for h in range(H):
        g = h // (H // G)
        o_r[h] = np.linalg.qr(wo[:, h * hd:(h + 1) * hd], mode="r")
        ov[h] = _spec(o_r[h] @ wv[g * hd:(g + 1) * hd])
        qn[h] = _spec(wq[h * hd:(h + 1) * hd])
    kn = np.array([_spec(wk[g * hd:(g + 1) * hd]) for g in range(G)])
    gate, up = W("ffn_gate") * w2, W("ffn_up") * w2
    out = LayerNorms(o_r=o_r, ov=ov, q=qn, k=kn, down=_spec(W("ffn_down")), gate=_spec(gate),
                     up=_spec(up), gate_up=_spec(np.concatenate([gate, up])))
    per_model[layer] = out
    return out


# ------------------------------------------------------------------------------ helpers
def _rstd(x: np.ndarray, eps: float) -> np.ndarray:
    return 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))        # no overflow for large |x|


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two 1-D arrays (average ranks for ties); NaN when either
    is constant or has fewer than 3 entries."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.size < 3 or a.size != b.size:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(x.size)
    i = 0
    while i < x.size:                      # average rank over each run of ties
        j = i
        while j + 1 < x.size and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j)
        i = j + 1
    return ranks


def _zeroed_rows(intervene: Optional[Intervention], layer: int, head: int, n_layers: int,
                 n_heads: int, T: int) -> np.ndarray:
    """(T,) bool: queries k for which this head takes v_0 as zero (``zero_first_value``)."""
    rows = np.zeros(T, dtype=bool)
    if intervene is None:
        return rows
    z = intervene.arrays(n_layers, n_heads)["zero_first_value"]
    if z is None or z[layer, head] == 0:
        return rows
    rows[1:] = True
    if z[layer, head] == 2:                 # scope "all": query 0 too
        rows[0] = True
    return rows


# ------------------------------------------------------------------------------ one layer
@dataclass
class LayerBound:
    """One layer's factors (float64). attn: (T, T) bound on ||dAttn_k/dx_m|| (entrywise form);
    mlp: (T,) bound on ||I + D_k||; coef: (H, T, T) value+key coefficient of A per entry;
    query: (T,) query-path bound summed over heads."""

    attn: np.ndarray
    mlp: np.ndarray
    coef: np.ndarray
    query: np.ndarray


def _layer_bound(model: Any, tr: Any, l: int, intervene: Optional[Intervention],
                 mlp: str) -> LayerBound:
    c = model.config
    H, G, hd, d = c.n_heads, c.n_kv_heads, c.head_dim, c.d_model
    eps = float(c.norm_eps)
    nrm = layer_norms(model, l)
    x = np.asarray(tr.resid[l], dtype=np.float64)               # (T, d)
    T = x.shape[0]
    r1 = _rstd(x, eps)                                          # (T,)
    A = np.asarray(tr.attn[l], dtype=np.float64)                # (H, T, T)
    qn = np.linalg.norm(np.asarray(tr.q[l], dtype=np.float64), axis=-1)   # (H, T)
    kv = np.asarray(tr.k[l], dtype=np.float64)
    kn = np.linalg.norm(kv, axis=-1)                             # (G, T)
    V = np.asarray(tr.v[l], dtype=np.float64)                   # (G, T, hd)
    scale = 1.0 / np.sqrt(hd)
    gamma = np.ones(H)
    if intervene is not None:
        hs = intervene.arrays(c.n_layers, H)["head_scale"]
        if hs is not None:
            gamma = np.abs(hs[l].astype(np.float64))
    coef = np.zeros((H, T, T))
    query = np.zeros(T)
    chunk = max(1, int(2 ** 22 // max(1, T * hd)))              # rows of k per (chunk, T, hd) block
    for h in range(H):
        g = h // (H // G)
        zr = _zeroed_rows(intervene, l, h, c.n_layers, H, T)
        Ah = A[h]
        o = Ah @ V[g]                                            # (T, hd)
        if zr.any():
            o[zr] -= Ah[zr, :1] * V[g][:1]                       # v_0 counts as zero there
        R = nrm.o_r[h]
        Rv = V[g] @ R.T                                          # (T, hd): R v_m
        Ro = o @ R.T
        diff = np.empty((T, T))                                  # ||W_O^h (v'_m - o_k)||
        for k0 in range(0, T, chunk):
            k1 = min(T, k0 + chunk)
            dv = Rv[None, :, :] - Ro[k0:k1, None, :]
            diff[k0:k1] = np.sqrt(np.einsum("kme,kme->km", dv, dv))
        diff[zr, 0] = np.linalg.norm(Ro[zr], axis=-1)           # v'_0 = 0
        value = np.broadcast_to(nrm.ov[h] * r1[None, :], (T, T)).copy()
        value[zr, 0] = 0.0
        key = diff * (scale * nrm.k[g]) * qn[h][:, None] * r1[None, :]
        coef[h] = gamma[h] * (value + key)
        query += gamma[h] * scale * nrm.q[h] * r1 * np.einsum("km,km,m->k", Ah, diff, kn[g])
    attn = np.einsum("hkm,hkm->km", coef, A)
    attn[np.diag_indices(T)] += query
    # ---- MLP factor ||I + D_k|| (or 1 + a bound on ||D_k||)
    h_in = x + np.asarray(tr.attn_out[l], dtype=np.float64)
    r2 = _rstd(h_in, eps)
    w2 = model.weight(f"blk.{l}.ffn_norm").astype(np.float64)
    Wg = model.weight(f"blk.{l}.ffn_gate").astype(np.float64)
    Wu = model.weight(f"blk.{l}.ffn_up").astype(np.float64)
    n2 = h_in * r2[:, None] * w2
    gt, up = n2 @ Wg.T, n2 @ Wu.T                               # (T, d_ff)
    sg = _sigmoid(gt)
    a = sg * (1.0 + gt * (1.0 - sg)) * up                       # silu'(g) u
    b = gt * sg                                                  # silu(g)
    if mlp == "exact":
        Wd = model.weight(f"blk.{l}.ffn_down").astype(np.float64)
        Wg2, Wu2 = Wg * w2, Wu * w2
        ms = np.mean(h_in * h_in, axis=-1) + eps
        mlp_f = np.empty(T)
        eye = np.eye(d)
        for k in range(T):
            M = (Wd * a[k]) @ Wg2 + (Wd * b[k]) @ Wu2           # d x d
            P = eye - np.outer(h_in[k], h_in[k]) / (d * ms[k])
            mlp_f[k] = _spec(eye + r2[k] * (M @ P))
    else:
        fa = nrm.down * (np.abs(a).max(axis=1) * nrm.gate + np.abs(b).max(axis=1) * nrm.up)
        fb = nrm.down * np.sqrt(a * a + b * b).max(axis=1) * nrm.gate_up
        mlp_f = 1.0 + r2 * np.minimum(fa, fb)
    return LayerBound(attn=attn, mlp=mlp_f, coef=coef, query=query)


# ------------------------------------------------------------------------------ result
@dataclass
class OversquashingBound:
    """Thm. 3.2's bound on ||d resid[L][target] / d resid[l][j]||_2 at one input, and optionally
    the measured Jacobian norms it bounds.

    Attributes:
        bound: (L+1, T) float64. Row l bounds the spectral norm of the d x d block
            d resid[L][target] / d resid[l][j] for every source position j; row L is the
            identity (1 at j = target, 0 elsewhere); 0 for j > target (causality).
        abar: (L, T, T) float64 path-sum matrices (abar[l][k, m] bounds the (k, m) block of
            layer l's Jacobian); None if not kept.
        layers: [0, ..., L], the rows of ``bound``.
        target: the target position (non-negative).
        constants: "entrywise" or "per_head" (see the module docstring).
        mlp: "fast" or "exact" (how the MLP factor was bounded).
        C: (L,) per-layer constant C_l = max_k ||I + D_k|| bound (MLP and residual).
        c: (L, H) per-head constants c_{l,h} (largest coefficient of A^(l,h), the paper's form).
        q: (L,) query-path constant q_l (diagonal, per layer).
        measured: (L+1, T) float64 measured spectral norms, or None.
        ratio: (L+1, T) bound / measured where measured > 0 (NaN elsewhere), or None.
        spearman: (L+1,) rank correlation over source positions 0..target of bound and
            measured per layer (NaN for row L and where undefined), or None.
        seconds: time for the bound (the measurement excluded).
        meta: ids length, intervention, model name.
    """

    bound: np.ndarray
    abar: Optional[np.ndarray]
    layers: List[int]
    target: int
    constants: str
    mlp: str
    C: np.ndarray
    c: np.ndarray
    q: np.ndarray
    measured: Optional[np.ndarray] = None
    ratio: Optional[np.ndarray] = None
    spearman: Optional[np.ndarray] = None
    seconds: float = 0.0
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def min_ratio(self) -> float:
        """Smallest bound/measured over layers 0..L-1 (row L is the identity, ratio 1) and
        source positions with a measurement (>= 1 up to float32 rounding when the bound
        holds); NaN without a measurement."""
        if self.ratio is None or not np.isfinite(self.ratio[:-1]).any():
            return float("nan")
        return float(np.nanmin(self.ratio[:-1]))

    @property
    def median_ratio(self) -> float:
        """Median bound/measured over layers 0..L-1 and positions with a measurement."""
        if self.ratio is None:
            return float("nan")
        r = self.ratio[:-1]
        r = r[np.isfinite(r)]
        return float(np.median(r)) if r.size else float("nan")

    def violations(self, rtol: float = 1e-4) -> int:
        """How many (layer, position) entries have bound * (1 + rtol) < measured."""
        if self.measured is None:
            return 0
        return int(np.sum(self.bound * (1.0 + rtol) < self.measured))

    def summary(self) -> Dict[str, Any]:
        """Plain numbers: bound range over layers 0..L-1 and positions 0..target, log10 span,
        and with a measurement the min / median ratio, violations and mean rank correlation."""
        b = self.bound[:-1, :self.target + 1]
        pos = b[b > 0]
        out: Dict[str, Any] = {
            "target": self.target, "constants": self.constants, "mlp": self.mlp,
            "n_layers": len(self.layers) - 1, "T": int(self.bound.shape[1]),
            "bound_min": float(pos.min()) if pos.size else 0.0,
            "bound_max": float(b.max()) if b.size else 0.0,
            "bound_layer0_target": float(self.bound[0, self.target]),
            "C_max": float(self.C.max()) if self.C.size else float("nan"),
            "c_max": float(self.c.max()) if self.c.size else float("nan"),
            "seconds": round(float(self.seconds), 3),
        }
        if self.measured is not None:
            sp = self.spearman[:-1] if self.spearman is not None else np.array([])
            sp = sp[np.isfinite(sp)]
            out.update({
                "min_ratio": self.min_ratio, "median_ratio": self.median_ratio,
                "violations": self.violations(),
                "spearman_mean": float(sp.mean()) if sp.size else float("nan"),
                "spearman_min": float(sp.min()) if sp.size else float("nan"),
            })
        return out


def _measured_array(model: Any, ids: np.ndarray, target: int, measured: Any,
                    intervene: Optional[Intervention], L: int, T: int) -> Optional[np.ndarray]:
    if measured is None or measured is False:
        return None
    if measured is True:
        import sinklab
        fn = getattr(sinklab, "sensitivity", None)
        if fn is None:
            raise ValueError("measured=True needs sinklab.sensitivity (the exact Jacobian map), "
                             "which this build does not have; pass the measured norms instead")
        measured = fn(model, ids, target=target, method="exact", intervene=intervene,
                      spectral=True, progress=False)
    if isinstance(measured, np.ndarray):
        arr = np.asarray(measured, dtype=np.float64)
        if arr.shape != (L + 1, T):
            raise ValueError(f"measured has shape {arr.shape}, expected (L+1, T) = {(L + 1, T)}")
        return arr
    spec = getattr(measured, "spectral", None)
    if spec is None:
        raise ValueError("measured has no spectral norms (.spectral is None): the bound is on the "
                         "spectral norm, and the Frobenius norm may exceed it by up to sqrt(d)")
    mt = getattr(measured, "target", target)
    if int(mt) != target:
        raise ValueError(f"measured is for target {mt}, the bound for target {target}")
    layers = list(getattr(measured, "layers", range(L + 1)))
    arr = np.full((L + 1, T), np.nan)
    arr[layers] = np.asarray(spec, dtype=np.float64)
    return arr


def _check_bound_applies(c: Any) -> None:
    """The constants below are derived for the LLaMA block (pre-RMSNorm, SwiGLU, RoPE, no biases,
    no post-norms, causal): on any other block they would be a wrong bound, so refuse it."""
    differs = [what for what, bad in (
        ("LayerNorm", c.norm_kind != "rmsnorm"), (f"the {c.act} MLP", c.act != "swiglu"),
        ("biases", bool(c.biases)), ("bidirectional attention", c.bidirectional),
        ("norms other than the two pre-norms", tuple(c.layer_norms) != ("attn_norm", "ffn_norm")),
        ("attention soft-capping", c.attn_softcap > 0), ("an embedding norm", c.embd_norm),
    ) if bad]
    if differs:
        raise ValueError(f"the over-squashing bound is derived for the LLaMA block; {c.arch} differs by "
                         f"{', '.join(differs)} (the measured sensitivity, sinklab.sensitivity, works on every family)")


def oversquashing_bound(model: Any, ids: Any, target: int = -1,
                        intervene: Optional[Intervention] = None, constants: str = "entrywise",
                        measured: Union[None, bool, np.ndarray, Any] = None, mlp: str = "fast",
                        keep_abar: bool = True) -> OversquashingBound:
    """Thm. 3.2's path-sum bound on the sensitivity of ``resid[L][target]`` to every
    ``resid[l][j]``, from one captured forward pass and the weights (see the module docstring
    for the derivation; every constant is a rigorous local Lipschitz bound at this input).

    Args:
        model: a :class:`sinklab.Model`.
        ids: (T,) token ids.
        target: the output position i (negative counts from the end).
        intervene: an :class:`Intervention` (mask_first, zero_first_value, head_scale all handled);
            the bound is then on the intervened model's Jacobian.
        constants: ``"entrywise"`` (tightest) or ``"per_head"`` (the paper's form
            abar = C_l((1 + q_l) I + sum_h c_{l,h} A^(l,h)), looser).
        measured: None; True (``sinklab.sensitivity(..., method="exact")``); an (L+1, T) array
            of measured spectral norms; or a Sensitivity-like object with ``.spectral``
            (n_l, T), ``.layers`` and ``.target``.
        mlp: ``"fast"`` (weight-norm bound of the MLP Jacobian) or ``"exact"`` (its exact
            spectral norm per position, d^2 d_ff flops each).
        keep_abar: keep the (L, T, T) path-sum matrices in the result.

    Returns:
        :class:`OversquashingBound`; ``bound`` (L+1, T) float64 is dimensionless (a bound on an
        operator norm of the residual-to-residual Jacobian).

    Raises:
        ValueError: a bad ``constants``/``mlp``, a target outside the sequence, or measured norms
            of the wrong shape / target.
    """
    if constants not in CONSTANTS:
        raise ValueError(f"constants={constants!r}; choose from {CONSTANTS}")
    _check_bound_applies(model.config)
    if mlp not in MLP_MODES:
        raise ValueError(f"mlp={mlp!r}; choose from {MLP_MODES}")
    t0 = time.perf_counter()
    ids = model.check_ids(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be one sequence (T,), got shape {ids.shape}")
    T = int(ids.shape[0])
    if not -T <= int(target) < T:
        raise ValueError(f"target={target} outside a sequence of {T} tokens")
    target = int(target) % T
    c = model.config
    L = c.n_layers
    tr = model.run(ids, capture=CAPTURE, intervene=intervene, progress=False)
    with _one_blas_thread():
        bound, abar, C, cc, qq = _path_sums(model, tr, T, target, intervene, constants, mlp)
    seconds = time.perf_counter() - t0
    res = OversquashingBound(bound=bound, abar=abar if keep_abar else None,
                             layers=list(range(L + 1)), target=target, constants=constants,
                             mlp=mlp, C=C, c=cc, q=qq, seconds=seconds,
                             meta={"model": getattr(model, "name", None), "T": T,
                                   "starts_with_bos": bool(c.bos_token_id is not None
                                                           and ids[0] == c.bos_token_id),
                                   "intervention": intervene is not None})
    meas = _measured_array(model, ids, target, measured, intervene, L, T)
    if meas is not None:
        attach_measured(res, meas)
    return res


def _path_sums(model: Any, tr: Any, T: int, target: int, intervene: Optional[Intervention],
               constants: str, mlp: str):
    """(bound (L+1, T), abar (L, T, T), C (L,), c (L, H), q (L,)) from one captured trace."""
    L, H = model.config.n_layers, model.config.n_heads
    abar = np.zeros((L, T, T))
    C = np.zeros(L)
    cc = np.zeros((L, H))
    qq = np.zeros(L)
    eye = np.eye(T)
    for l in range(L):
        lb = _layer_bound(model, tr, l, intervene, mlp)
        A = np.asarray(tr.attn[l], dtype=np.float64)
        C[l] = lb.mlp.max()
        qq[l] = lb.query.max()
        for h in range(H):
            on = A[h] > 0
            cc[l, h] = lb.coef[h][on].max() if on.any() else 0.0
        if constants == "entrywise":
            abar[l] = lb.mlp[:, None] * (eye + lb.attn)
        else:
            abar[l] = C[l] * ((1.0 + qq[l]) * eye + np.einsum("h,hkm->km", cc[l], A))
    bound = np.zeros((L + 1, T))
    b = np.zeros(T)
    b[target] = 1.0
    bound[L] = b
    for l in range(L - 1, -1, -1):
        b = b @ abar[l]
        bound[l] = b
    return bound, abar, C, cc, qq


def attach_measured(res: OversquashingBound, measured: np.ndarray) -> OversquashingBound:
    """Store measured spectral norms (L+1, T) (NaN rows: not measured) in ``res`` with the
    ratio bound/measured and the per-layer rank correlation over positions 0..target."""
    m = np.asarray(measured, dtype=np.float64)
    if m.shape != res.bound.shape:
        raise ValueError(f"measured has shape {m.shape}, expected {res.bound.shape}")
    res.measured = m
    with np.errstate(divide="ignore", invalid="ignore"):
        res.ratio = np.where(m > 0, res.bound / m, np.nan)
    sp = np.full(m.shape[0], np.nan)
    for l in range(m.shape[0] - 1):
        if np.all(np.isfinite(m[l, :res.target + 1])):
            sp[l] = rank_correlation(res.bound[l, :res.target + 1], m[l, :res.target + 1])
    res.spearman = sp
    return res

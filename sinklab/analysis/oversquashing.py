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

4'. Exact attention factors (:func:`thm32_bounds`, ``"analytic"``). Step 4's per-path, per-head
   triangle inequalities cost ~30-100x per layer on SmolLM2; here ||delta_km I + dAttn_k/dx_m||
   is computed exactly. With W' = W diag(w1), P_m = I - r_m^2 x_m x_m^T / d, a_h = gamma_h A^h_km,
   u_h = v_m - o^h_k, y_h = W_K^g'^T R_m^T q^h_k, and for m < k
       dAttn_k/dx_m = r_m W_O [E(a), U(a)] [W_V'; Y^T] P_m
   (E: a_h I_hd in block (h, g(h)); U: column h is a_h s u_h in head h's rows; Y = [y_h]_h), so
   ||.||^2 = r_m^2 lambda_max(G_L G_R) with G_L = [E, U]^T W_O^T W_O [E, U] and
   G_R = [W_V'; Y^T] P_m^2 [W_V'; Y^T]^T, both (G hd + H)-square and formed from weight Grams
   (W_O^T W_O, W_V' W_V'^T, W_V' W_K'^T, W_K' W_K'^T) and the captures. The diagonal block
   (value + key + query paths, the query path sum_m' A_km' u_m' (R_k^T kappa_m')^T W_Q^h') is
   formed as a d x d matrix. RoPE enters only through R_m^T q_k and R_k^T kappa_m', rotations
   of the captured (rotate-half layout) queries and keys; the Q/K weight rows are put in that
   layout, and keys and queries recomputed from the weights must match the captured ones to
   1e-3 (``meta["rope_check"]``) or the call fails. The MLP factor is ||I + D_k|| exactly
   (``mlp="exact"`` of step 3). abar^(l)_km = ||I + D_k|| ||delta_km I + dAttn_k/dx_m||: the
   theorem's product of a residual/MLP constant and an identity-plus-attention term, every
   factor exact; its one remaining per-layer slack is the split itself (1-2.5x per block).
   ``"joint"``: ||(I + D_k)(delta_km I + dAttn_k/dx_m)|| (G_L with W_O^T (I+D_k)^T (I+D_k) W_O),
   the layer's exact block norm in float64.

5'. Exact one-layer blocks (``"blocks"``, any architecture). B^(l)_km = ||d resid[l+1][k] /
   d resid[l][m]||_2 from the C backward through layer l alone (:func:`layer_block_norms`).
   By the chain rule d resid[L][i]/d resid[l][j] = sum over paths of products of one-layer
   blocks, and by the triangle inequality and submultiplicativity its norm is <= the same sum
   of products of B's: (B^(L-1) ... B^(l))_{i,j}. No bound of the path-sum form with
   per-layer nonnegative matrices can be smaller at every layer (each B is attained), so this is
   the tightest bound the theorem's form allows; its looseness is entirely the cancellation
   between paths and the misalignment of singular directions across layers.

6. Looseness. Per layer: (one-layer bound) / B^(l) over the blocks (1 for "blocks"). By depth D:
   the median over sources of bound / measured from resid[L-D] to resid[L]; the depths where
   it passes 10x and 1e3x. :func:`criterion_thm32` turns them into a status.

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
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ..interventions import Intervention
from ..progress import progress_bar
from . import status
from .sensitivity import sensitivity
from .stats import bootstrap
from ..reprs import compact_repr

CONSTANTS = ("entrywise", "per_head")
MLP_MODES = ("fast", "exact")
CAPTURE = ("attn", "resid", "q", "k", "v", "attn_out")


# ------------------------------------------------------------------------------ weight norms
@compact_repr
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
@compact_repr
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
@compact_repr
@dataclass
class OversquashingBound:
    """Thm. 3.2's bound on ``||d resid[L][target] / d resid[l][j]||_2`` at one input, and optionally
    the measured Jacobian norms it bounds.

    Attributes:
        bound: (L+1, T) float64. Row l bounds the spectral norm of the d x d block
            ``d resid[L][target] / d resid[l][j]`` for every source position j; row L is the
            identity (1 at j = target, 0 elsewhere); 0 for j > target (causality).
        abar: (L, T, T) float64 path-sum matrices (``abar[l][k, m]`` bounds the (k, m) block of
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
        measured = sensitivity(model, ids, target=target, method="exact", intervene=intervene,
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


def _one_sequence(model: Any, ids: Any, target: int) -> Tuple[np.ndarray, int, int]:
    """(ids (T,) int64, T, target in 0..T-1), or a ValueError naming what is wrong."""
    ids = model.check_ids(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be one sequence (T,), got shape {ids.shape}")
    T = int(ids.shape[0])
    if not -T <= int(target) < T:
        raise ValueError(f"target={target} outside a sequence of {T} tokens")
    return ids, T, int(target) % T


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
    ids, T, target = _one_sequence(model, ids, target)
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
    return _path_rows(abar, target), abar, C, cc, qq


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


# ============================================================================== exact one-layer blocks
def layer_block_norms(model: Any, ids: Any, layers: Optional[List[int]] = None,
                      rows: Optional[List[int]] = None, intervene: Optional[Intervention] = None,
                      spectral_rtol: float = 1e-9, progress: bool = True) -> np.ndarray:
    """Exact spectral norms of every layer's own Jacobian blocks, any architecture.

    ``out[l, k, m] = || d resid[l+1][k] / d resid[l][m] ||_2`` (d x d blocks), from the C
    backward through layer l alone (:func:`sinklab.sensitivity` with ``of_layer=l + 1,
    layers=[l]``: d unit cotangents at (l+1, k), one layer's backward, Lanczos on each block's
    J^T J to a relative change of ``spectral_rtol``). In a causal model blocks with m > k are
    exactly 0 and not computed.

    Args:
        model: a :class:`sinklab.Model`.
        ids: (T,) token ids.
        layers: the layers l to compute (default all 0..L-1); the others are NaN.
        rows: the output positions k (default all); the others are NaN.
        intervene: an :class:`Intervention`, differentiated as applied.
        spectral_rtol: Lanczos stopping rule (a Ritz value is a lower bound on sigma^2 that
            rises to it; 1e-9 leaves it exact to far below the float32 rounding of the backward).
        progress: a progress bar over the (layer, row) backward calls.

    Returns:
        (L, T, T) float64.

    Cost: for every layer and row k, one forward of k + 1 tokens through l + 1 layers and one
    layer's backward of d cotangents over k + 1 tokens: about d T^2 / 2 token-rows of one
    layer per layer (SmolLM2-135M, T = 16: ~10 min on two loaded cores).
    """
    ids = model.check_ids(ids)
    T, L = int(ids.shape[0]), model.config.n_layers
    sel = model.check_layers(layers)
    ks = list(range(T)) if rows is None else sorted({int(k) % T for k in rows})
    out = np.full((L, T, T), np.nan)
    jobs = [(l, k) for l in sel for k in ks]
    for l, k in progress_bar(jobs, progress, desc="one-layer Jacobian blocks", unit="block row"):
        s = sensitivity(model, ids, target=k, layers=[l], of_layer=l + 1, method="exact",
                        intervene=intervene, spectral=True, spectral_rtol=spectral_rtol, progress=False)
        out[l, k] = s.spectral[0]
    return out


# ============================================================================== exact local factors
ATTN_MODES = ("fast", "exact")
EXACT_MLP_MODES = ("exact", "joint")


def _rope_hf(x: np.ndarray, pos: Any, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate ``x`` (..., hd) in Hugging Face's rotate-half layout by ``pos * inv_freq`` (pos
    broadcast against x[..., 0]); a negative pos rotates back."""
    half = x.shape[-1] // 2
    ang = np.asarray(pos, dtype=np.float64)[..., None] * inv_freq
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _hf_rows(w: np.ndarray, n_heads: int, hd: int, layout: int) -> np.ndarray:
    """Q/K weight rows in Hugging Face's rotate-half layout (the captures' layout): llama.cpp's
    adjacent-pair layout (``rope_layout == 1``) stores HF row i of a head at 2i and row
    hd/2 + i at 2i + 1."""
    if layout == 0:
        return w
    perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
    return w[(np.arange(n_heads)[:, None] * hd + perm[None, :]).ravel()]


def _lam_max_product(GL: np.ndarray, GR: np.ndarray) -> np.ndarray:
    """(n,) largest eigenvalue of GL @ GR for stacks (n, r, r) of symmetric PSD matrices: with
    GR = S S^T, it is lambda_max(S^T GL S), the squared spectral norm of L R^T when
    GL = L^T L and GR = R^T R."""
    lam, V = np.linalg.eigh(GR)
    S = V * np.sqrt(np.clip(lam, 0.0, None))[:, None, :]
    M = np.einsum("nai,nab,nbj->nij", S, GL, S, optimize=True)
    return np.clip(np.linalg.eigvalsh(0.5 * (M + np.swapaxes(M, 1, 2)))[:, -1], 0.0, None)


@compact_repr
@dataclass
class ExactLayer:
    """One layer's exact local factors (float64), rows k <= the target.

    mlp: (T,) ||I + D_k|| (residual plus MLP Jacobian at position k, exact).
    attn: (T, T) ||delta_km I + dAttn_k/dx_m|| (the attention sublayer's exact block norms).
    joint: (T, T) ||(I + D_k)(delta_km I + dAttn_k/dx_m)||: the layer's exact block norms, or
        None (``mlp="exact"``).
    check: largest relative difference between the keys and queries recomputed here and the
        captured ones (the layout and RoPE check).
    """

    mlp: np.ndarray
    attn: np.ndarray
    joint: Optional[np.ndarray]
    check: float


def _mlp_jacobians(model: Any, tr: Any, l: int, rows: np.ndarray) -> Dict[int, np.ndarray]:
    """{k: I + D_k} (d x d float64) for the positions ``rows``: the residual plus the SwiGLU
    MLP's Jacobian d(h + MLP(N2(h)))/dh at h = resid[l] + attn_out[l] (step 3 of the module
    docstring), one d x d_ff x d product per position."""
    c = model.config
    d, eps = c.d_model, float(c.norm_eps)
    x = np.asarray(tr.resid[l], dtype=np.float64)
    h_in = x + np.asarray(tr.attn_out[l], dtype=np.float64)
    r2 = _rstd(h_in, eps)
    w2 = model.weight(f"blk.{l}.ffn_norm").astype(np.float64)
    Wg = model.weight(f"blk.{l}.ffn_gate").astype(np.float64) * w2
    Wu = model.weight(f"blk.{l}.ffn_up").astype(np.float64) * w2
    Wd = model.weight(f"blk.{l}.ffn_down").astype(np.float64)
    out = {}
    eye = np.eye(d)
    for k in rows:
        n2 = h_in[k] * r2[k]                                        # w2 is folded into Wg, Wu
        gt, up = Wg @ n2, Wu @ n2
        sg = _sigmoid(gt)
        a = sg * (1.0 + gt * (1.0 - sg)) * up                       # silu'(g) u
        b = gt * sg                                                  # silu(g)
        M = Wd @ (a[:, None] * Wg + b[:, None] * Wu)                 # d x d
        MP = M - np.outer(M @ h_in[k], h_in[k]) * (r2[k] ** 2 / d)  # M P, P = I - r^2 h h^T / d
        out[int(k)] = eye + r2[k] * MP
    return out


def _exact_layer(model: Any, tr: Any, l: int, intervene: Optional[Intervention], target: int,
                 joint: bool) -> ExactLayer:
    """The exact attention block norms ||delta_km I + dAttn_k/dx_m|| and MLP factors ||I + D_k||
    of one LLaMA layer for every k <= target, m <= k (step 4' of the module docstring)."""
    c = model.config
    H, G, hd, d = c.n_heads, c.n_kv_heads, c.head_dim, c.d_model
    rep = H // G
    eps = float(c.norm_eps)
    x = np.asarray(tr.resid[l], dtype=np.float64)
    T = x.shape[0]
    r1 = _rstd(x, eps)
    W = lambda name: model.weight(f"blk.{l}.{name}").astype(np.float64)  # noqa: E731
    w1 = W("attn_norm")
    lay = int(getattr(model, "rope_layout", 0))
    Wq = _hf_rows(W("attn_q"), H, hd, lay) * w1                  # (H hd, d), HF layout, norm folded
    Wk = _hf_rows(W("attn_k"), G, hd, lay) * w1                  # (G hd, d)
    Wv = W("attn_v") * w1                                         # (G hd, d)
    Wo = W("attn_output")                                         # (d, H hd)
    inv = np.asarray(model.weight("rope_inv_freq"), dtype=np.float64)[l]
    q = np.asarray(tr.q[l], dtype=np.float64)                     # (H, T, hd) after RoPE
    kc = np.asarray(tr.k[l], dtype=np.float64)                    # (G, T, hd) after RoPE
    V = np.asarray(tr.v[l], dtype=np.float64)                     # (G, T, hd)
    A = np.asarray(tr.attn[l], dtype=np.float64)                  # (H, T, T)
    pos = np.arange(T)
    # the check: keys and queries recomputed from the weights in HF layout match the captures
    n1 = x * r1[:, None]
    kre = _rope_hf((n1 @ Wk.T).reshape(T, G, hd).transpose(1, 0, 2), pos[None, :], inv)
    qre = _rope_hf((n1 @ Wq.T).reshape(T, H, hd).transpose(1, 0, 2), pos[None, :], inv)
    check = max(float(np.abs(kre - kc).max() / max(np.abs(kc).max(), 1e-30)),
                float(np.abs(qre - q).max() / max(np.abs(q).max(), 1e-30)))
    if check > 1e-3:
        raise ValueError(f"layer {l}: queries/keys recomputed from the weights differ from the captured ones "
                         f"(relative {check:.2g}): the exact attention factors do not apply to this model "
                         f"(use attn='fast' or the exact-block path bound)")
    scale = float(c.attn_scale) if c.attn_scale is not None else 1.0 / np.sqrt(hd)
    gamma = np.ones(H)
    if intervene is not None:
        hs = intervene.arrays(c.n_layers, H)["head_scale"]
        if hs is not None:
            gamma = hs[l].astype(np.float64)                      # signed: exact, not a bound
    # o_k per head, with zero_first_value's v_0 -> 0 on the affected queries
    zr = np.stack([_zeroed_rows(intervene, l, h, c.n_layers, H, T) for h in range(H)])   # (H, T)
    grp = np.arange(H) // rep
    O = np.einsum("hkm,hme->hke", A, V[grp])                      # (H, T, hd)
    O[zr] -= A[zr][:, :1] * np.broadcast_to(V[grp][:, :1], (H, T, hd))[zr]
    aK = gamma[:, None, None] * A                                 # key/query-path weights
    aV = aK.copy()
    aV[:, :, 0][zr] = 0.0                                         # value path from v_0 removed
    # weight products (Ghd x Ghd) and the Gram of W_O
    VV, VK, KK = Wv @ Wv.T, Wv @ Wk.T, Wk @ Wk.T
    wvx, wkx = x @ Wv.T, x @ Wk.T                                 # (T, Ghd)
    ms = np.mean(x * x, axis=-1) + eps
    cc = r1 ** 2 / d
    beta = cc * (2.0 - (ms - eps) / ms)                           # P^2 = I - beta x x^T
    Ghd = G * hd
    rows = np.arange(min(target, T - 1) + 1)
    mlp_j = _mlp_jacobians(model, tr, l, rows)
    mlp_f = np.zeros(T)
    attn = np.zeros((T, T))
    jnt = np.zeros((T, T)) if joint else None
    FoI = Wo.T @ Wo
    eye = np.eye(d)
    Wk_g = Wk.reshape(G, hd, d)
    for k in rows:
        Mk = mlp_j[int(k)]
        mlp_f[k] = _spec(Mk)
        # ---- diagonal: I + r_k W_O G1 P_k, G1 = value + key + query paths of every head
        zkk = _rope_hf(q[:, k], -k, inv)                          # (H, hd): R_k^T q_k
        u_kk = V[grp, k] - O[:, k]                                # (H, hd)
        u_kk[zr[:, k] & (k == 0)] = -O[zr[:, k] & (k == 0), k]
        G1 = np.empty((H, hd, d))
        for h in range(H):
            g = grp[h]
            yk = Wk_g[g].T @ zkk[h]                               # (d,)
            u_all = V[g] - O[h, k]                                # (T, hd): v_m - o_k
            if zr[h, k]:
                u_all[0] = -O[h, k]
            kt = _rope_hf(kc[g], -k, inv)                         # (T, hd): R_k^T kappa_m
            Kh = (aK[h, k][:, None] * u_all).T @ kt               # (hd, hd), head scale included
            G1[h] = aV[h, k, k] * Wv[g * hd:(g + 1) * hd] + scale * aK[h, k, k] * np.outer(u_kk[h], yk) \
                + scale * (Kh @ Wq[h * hd:(h + 1) * hd])
        WG = Wo @ G1.reshape(H * hd, d)
        Jatt = r1[k] * (WG - np.outer(WG @ x[k], x[k]) * cc[k])   # r_k W_O G1 P_k
        attn[k, k] = _spec(eye + Jatt)
        if joint:
            jnt[k, k] = _spec(Mk @ (eye + Jatt))
        if k == 0:
            continue
        # ---- off-diagonal m < k: r_m W_O [E(aV), U(aK)] [W_V'; Y^T] P_m, Gram form
        m = np.arange(k)
        m = m[(A[:, k, :k] > 0).any(axis=0)]
        if m.size == 0:
            continue
        n = m.size
        F = FoI if not joint else (Wo.T @ (Mk.T @ Mk) @ Wo)
        F4 = F.reshape(H, hd, H, hd)
        av = aV[:, k, m].T                                        # (n, H)
        ak = aK[:, k, m].T
        u = V[grp][:, m] - O[:, k][:, None, :]                    # (H, n, hd)
        u = u.transpose(1, 0, 2).copy()                           # (n, H, hd)
        if 0 in m.tolist():
            u[0, zr[:, k]] = -O[zr[:, k], k]
        wu = (ak * scale)[:, :, None] * u                         # (n, H, hd)
        avr = av.reshape(n, G, rep)
        F6 = F.reshape(G, rep, hd, G, rep, hd)
        EFE = np.einsum("ngi,giaGjb,nGj->ngaGb", avr, F6, avr, optimize=True)   # E^T F E
        FW = np.einsum("hajb,njb->nhaj", F4, wu, optimize=True)   # (n, H, hd, H): F[h, h'] w_h'
        EFU = np.einsum("ngi,ngiaj->ngaj", avr, FW.reshape(n, G, rep, hd, H), optimize=True)
        UFU = np.einsum("nha,nhaj->nhj", wu, FW, optimize=True)
        r = Ghd + H
        GL = np.empty((n, r, r))
        GL[:, :Ghd, :Ghd] = EFE.reshape(n, Ghd, Ghd)
        GL[:, :Ghd, Ghd:] = EFU.reshape(n, Ghd, H)
        GL[:, Ghd:, :Ghd] = np.swapaxes(GL[:, :Ghd, Ghd:], 1, 2)
        GL[:, Ghd:, Ghd:] = UFU
        # right Gram: z_h = R_m^T q_k (n, H, hd); y_h = W_K^g'^T z_h
        z = _rope_hf(np.broadcast_to(q[:, k][None], (n, H, hd)), -m[:, None], inv)
        Zg = np.zeros((n, H, Ghd))                                # z_h placed in its group's rows
        for h in range(H):
            Zg[:, h, grp[h] * hd:(grp[h] + 1) * hd] = z[:, h]
        xm_v, xm_k, bm = wvx[m], wkx[m], beta[m]
        kz = np.einsum("nc,nhc->nh", xm_k, Zg)                     # x_m . y_h
        GR = np.empty((n, r, r))
        GR[:, :Ghd, :Ghd] = VV[None] - bm[:, None, None] * np.einsum("na,nb->nab", xm_v, xm_v)
        GR[:, :Ghd, Ghd:] = np.einsum("ac,nhc->nah", VK, Zg) - bm[:, None, None] * xm_v[:, :, None] * kz[:, None, :]
        GR[:, Ghd:, :Ghd] = np.swapaxes(GR[:, :Ghd, Ghd:], 1, 2)
        GR[:, Ghd:, Ghd:] = np.einsum("nhc,cd,njd->nhj", Zg, KK, Zg, optimize=True) \
            - bm[:, None, None] * kz[:, :, None] * kz[:, None, :]
        vals = r1[m] * np.sqrt(_lam_max_product(GL, GR))
        if joint:
            jnt[k, m] = vals
            FI = FoI.reshape(H, hd, H, hd)
            # the attention factor alone needs the plain W_O Gram
            F6i = FoI.reshape(G, rep, hd, G, rep, hd)
            EFEi = np.einsum("ngi,giaGjb,nGj->ngaGb", avr, F6i, avr, optimize=True)
            FWi = np.einsum("hajb,njb->nhaj", FI, wu, optimize=True)
            GL[:, :Ghd, :Ghd] = EFEi.reshape(n, Ghd, Ghd)
            GL[:, :Ghd, Ghd:] = np.einsum("ngi,ngiaj->ngaj", avr, FWi.reshape(n, G, rep, hd, H),
                                          optimize=True).reshape(n, Ghd, H)
            GL[:, Ghd:, :Ghd] = np.swapaxes(GL[:, :Ghd, Ghd:], 1, 2)
            GL[:, Ghd:, Ghd:] = np.einsum("nha,nhaj->nhj", wu, FWi, optimize=True)
            attn[k, m] = r1[m] * np.sqrt(_lam_max_product(GL, GR))
        else:
            attn[k, m] = vals
    return ExactLayer(mlp=mlp_f, attn=attn, joint=jnt, check=check)


# ============================================================================== Thm. 3.2, tight
BOUND_KINDS = ("analytic", "joint", "blocks", "fast")
RTOL = 1e-4                       # float32 rounding slack of captures, backward and Lanczos


def analytic_mismatch(cfg: Any) -> Optional[str]:
    """Why the analytic factors (steps 1-5 and 4' of the module docstring, derived for the
    pre-norm LLaMA block) do not apply to a model of configuration ``cfg``, or None when they
    do. The exact-block path bound (:func:`layer_block_norms`) applies to every architecture.

    Each reason names a Jacobian factor the derivation does not contain: for Gemma 3 (pre- and
    post-norms, QK-norm, GeGLU), the attention sublayer's block is N_post'(a_k) W_O ... with
    the post-norm's Jacobian r_post diag(1 + w) P_post at the sublayer output, the score
    derivative runs through the per-head q/k RMSNorm Jacobians, and the MLP's gate is
    tanh-GELU; the embedding scale only scales resid[0] and is no reason (the bound is on
    residual-to-residual Jacobians), nor is a sliding window (it only masks A, which the
    captured probabilities carry)."""
    why = []
    if cfg.bidirectional:
        why.append("bidirectional attention (the path sums and rows assume a causal mask)")
    if cfg.norm_kind != "rmsnorm":
        why.append(f"{cfg.norm_kind} (a mean-centring norm: its Jacobian is not r diag(w) P)")
    extra = [n for n in cfg.layer_norms if n not in ("attn_norm", "ffn_norm")]
    post = [n for n in extra if n.endswith("post_norm")]
    qk = [n for n in extra if n in ("attn_q_norm", "attn_k_norm")]
    other = [n for n in extra if n not in post and n not in qk]
    if post:
        why.append(f"post-sublayer norms {', '.join(post)} (the sublayer output passes through an RMSNorm "
                   f"whose Jacobian at that output is not in the derivation)")
    if qk:
        why.append(f"QK-norm {', '.join(qk)} (the key/query paths run through per-head RMSNorm Jacobians)")
    if other:
        why.append(f"norms {', '.join(other)}")
    if "attn_norm" not in cfg.layer_norms or "ffn_norm" not in cfg.layer_norms:
        why.append("a missing pre-norm")
    if cfg.act != "swiglu":
        why.append(f"the {cfg.act} MLP (the MLP Jacobian is derived for SiLU-gated SwiGLU)")
    if cfg.biases:
        why.append(f"biases on {', '.join(cfg.biases)}")
    if cfg.positions != "rope":
        why.append(f"{cfg.positions} positions")
    if cfg.attn_softcap:
        why.append("attention soft-capping (a tanh on the scores)")
    if not why:
        return None
    return (f"the analytic factors are derived for the pre-norm LLaMA block (RMSNorm, RoPE, causal GQA softmax "
            f"attention, SwiGLU, no biases); {cfg.arch} differs by " + "; ".join(why)
            + ". The exact-block path bound applies (it needs only one-layer Jacobians)")


def _median_pos(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def _avg_ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis (ties share their mean rank), vectorised."""
    less = (x[..., None, :] < x[..., :, None]).sum(-1)
    eq = (x[..., None, :] == x[..., :, None]).sum(-1)
    return less + 0.5 * (eq - 1)


def _spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row pair (..., n) (NaN where either row is constant)."""
    ra, rb = _avg_ranks(a), _avg_ranks(b)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra * ra).sum(-1) * (rb * rb).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(-1) / den, np.nan)


def _first_depth(r: np.ndarray, level: float) -> Optional[int]:
    over = np.nonzero(r > level)[0]
    return int(over[0]) + 1 if over.size else None


@compact_repr
@dataclass
class Thm32Bounds:
    """Thm. 3.2's path-sum bounds at one input, against the measured Jacobian, layer by layer.

    Every bound here is rigorous: ``bounds[name][l, j] >= ||d resid[L][target] / d resid[l][j]||_2``
    up to float32 rounding (``RTOL``). Names: ``"analytic"`` (abar^(l)_{km} = ||I + D_k|| *
    ||delta_km I + dAttn_k/dx_m||, both factors exact: the theorem's product of an MLP/residual
    constant and an identity-plus-attention term), ``"joint"`` (the same computation without the
    split: ||(I + D_k)(delta_km I + dAttn_k/dx_m)||, the layer's exact block norm in float64),
    ``"blocks"`` (the exact one-layer block norms from the C backward, any architecture: the
    tightest bound of the theorem's form), ``"fast"`` (the weight-norm bound of
    :func:`oversquashing_bound`, for comparison).

    Attributes:
        target, T, n_layers: the target position, sequence length and L.
        measured: (L+1, T) measured end-to-end spectral norms (row L: the identity at target).
        bounds: name -> (L+1, T) path bound (row l: from resid[l] to resid[L]).
        layer: name -> (L, T, T) one-layer matrices the path sums multiply (rows k > target 0).
        blocks: (L, T, T) exact one-layer block norms (the per-layer measurement), or None.
        seconds: name -> wall time; "measured" for the end-to-end map.
        analytic_skipped: why the analytic factors were not computed (None when they were).
        meta: model, T, intervention, RoPE check.

    Derived (filled on construction), each name -> array or number:
        ratio: (L+1, T) bound / measured (NaN where measured is 0 or beyond the target).
        layer_looseness / layer_looseness_max: (L,) median / max over the blocks (k <= target,
            m <= k, block > 0) of one-layer bound / one-layer measured (NaN without blocks; 1 for
            "blocks" by construction).
        depth_ratio: (L,) entry D-1 = median over sources j <= target of ratio[L - D, j]: the
            cumulative looseness after composing D layers (entry L-1 is the end-to-end one).
        depth_10, depth_1000: the first depth D with depth_ratio > 10 (> 1e3), None if never.
        end_to_end: depth_ratio at D = L (whole depth, resid[0] -> resid[L]).
        spearman: (L,) rank correlation over sources 0..target of bound and measured, per row l.
        violations: entries (l < L, j <= target) with bound * (1 + RTOL) < measured.
        layer_violations: one-layer entries with layer * (1 + RTOL) < blocks (NaN-free ones).
    """

    target: int
    T: int
    n_layers: int
    measured: np.ndarray
    bounds: Dict[str, np.ndarray]
    layer: Dict[str, np.ndarray]
    blocks: Optional[np.ndarray] = None
    seconds: Dict[str, float] = field(default_factory=dict)
    analytic_skipped: Optional[str] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    ratio: Dict[str, np.ndarray] = field(default_factory=dict, init=False)
    layer_looseness: Dict[str, np.ndarray] = field(default_factory=dict, init=False)
    layer_looseness_max: Dict[str, np.ndarray] = field(default_factory=dict, init=False)
    depth_ratio: Dict[str, np.ndarray] = field(default_factory=dict, init=False)
    depth_10: Dict[str, Optional[int]] = field(default_factory=dict, init=False)
    depth_1000: Dict[str, Optional[int]] = field(default_factory=dict, init=False)
    end_to_end: Dict[str, float] = field(default_factory=dict, init=False)
    spearman: Dict[str, np.ndarray] = field(default_factory=dict, init=False)
    violations: Dict[str, int] = field(default_factory=dict, init=False)
    layer_violations: Dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.refresh()

    @property
    def names(self) -> List[str]:
        return list(self.bounds)

    def refresh(self, rtol: float = RTOL) -> "Thm32Bounds":
        """(Re)compute the derived fields from measured, bounds, layer and blocks."""
        L, t = self.n_layers, self.target
        m = np.asarray(self.measured, dtype=np.float64)
        tri = np.tril(np.ones((self.T, self.T), bool))
        tri[t + 1:] = False
        for name, b in self.bounds.items():
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.where(m > 0, b / m, np.nan)
            r[:, t + 1:] = np.nan
            self.ratio[name] = r
            self.depth_ratio[name] = np.array([_median_pos(r[L - D, :t + 1]) for D in range(1, L + 1)])
            self.depth_10[name] = _first_depth(self.depth_ratio[name], 10.0)
            self.depth_1000[name] = _first_depth(self.depth_ratio[name], 1e3)
            self.end_to_end[name] = float(self.depth_ratio[name][-1]) if L else float("nan")
            self.spearman[name] = np.array([rank_correlation(b[l, :t + 1], m[l, :t + 1]) for l in range(L)])
            self.violations[name] = int(np.sum(b[:L, :t + 1] * (1.0 + rtol) < m[:L, :t + 1]))
            lay = self.layer.get(name)
            med = np.full(L, np.nan)
            mx = np.full(L, np.nan)
            nv = 0
            if lay is not None and self.blocks is not None:
                for l in range(L):
                    B = self.blocks[l]
                    ok = tri & np.isfinite(B) & (B > 0)
                    if ok.any():
                        q = lay[l][ok] / B[ok]
                        med[l], mx[l] = float(np.median(q)), float(q.max())
                    okv = tri & np.isfinite(B)
                    nv += int(np.sum(lay[l][okv] * (1.0 + rtol) < B[okv]))
            self.layer_looseness[name] = med
            self.layer_looseness_max[name] = mx
            self.layer_violations[name] = nv
        return self

    def total_violations(self) -> int:
        """End-to-end plus one-layer violations over every bound."""
        return int(sum(self.violations.values()) + sum(self.layer_violations.values()))

    def summary(self, digits: int = 4) -> Dict[str, Any]:
        """Plain JSON-able numbers: per bound the per-layer looseness (median, max), the
        cumulative looseness by depth, where it passes 10x and 1e3x, the end-to-end ratio, the
        rank correlations and violations; the time of each part."""
        def rnd(a: Any) -> Any:
            if a is None:
                return None
            if np.ndim(a) == 0:
                v = float(a)
                return None if not np.isfinite(v) else float(f"{v:.{digits}g}")
            return [rnd(v) for v in np.asarray(a).tolist()]

        out: Dict[str, Any] = {"target": self.target, "T": self.T, "n_layers": self.n_layers,
                               "seconds": {k: round(float(v), 2) for k, v in self.seconds.items()},
                               "analytic_skipped": self.analytic_skipped,
                               "meta": {k: v for k, v in self.meta.items()
                                        if isinstance(v, (str, int, float, bool, type(None)))},
                               "bounds": {}}
        for name in self.bounds:
            sp = self.spearman[name]
            out["bounds"][name] = {
                "layer_looseness_median": rnd(self.layer_looseness[name]),
                "layer_looseness_max": rnd(self.layer_looseness_max[name]),
                "depth_ratio": rnd(self.depth_ratio[name]),
                "depth_10x": self.depth_10[name], "depth_1000x": self.depth_1000[name],
                "end_to_end_median_ratio": rnd(self.end_to_end[name]),
                "min_ratio": rnd(np.nanmin(self.ratio[name][:-1]) if np.isfinite(self.ratio[name][:-1]).any()
                                 else float("nan")),
                "spearman": rnd(sp), "spearman_mean": rnd(np.nanmean(sp) if np.isfinite(sp).any() else np.nan),
                "violations": self.violations[name], "layer_violations": self.layer_violations[name],
            }
        return out


def _path_rows(layer: np.ndarray, target: int) -> np.ndarray:
    """(L+1, T) rows b^(l) = b^(l+1) M^(l), b^(L) = e_target (rows of M beyond the target are
    never reached in a causal model: they are taken as 0)."""
    L, T, _ = layer.shape
    M = np.nan_to_num(layer, nan=0.0)
    out = np.zeros((L + 1, T))
    b = np.zeros(T)
    b[target] = 1.0
    out[L] = b
    for l in range(L - 1, -1, -1):
        b = b @ M[l]
        out[l] = b
    return out


def thm32_bounds(model: Any, ids: Any, target: int = -1, intervene: Optional[Intervention] = None,
                 bounds: Any = ("analytic", "blocks"), measured: Any = True,
                 blocks: Optional[np.ndarray] = None, progress: bool = True) -> Thm32Bounds:
    """Thm. 3.2's bound made tight: path sums of exact one-layer factors, against the measured
    end-to-end Jacobian (module docstring, steps 4'-6).

    Args:
        model: a :class:`sinklab.Model`.
        ids: (T,) token ids.
        target: the output position (negative counts from the end).
        intervene: an :class:`Intervention`, applied to the forward, the bounds and the measure.
        bounds: which bounds, from ``BOUND_KINDS``: "analytic" and "joint" (LLaMA blocks only,
            skipped with the reason in ``analytic_skipped`` elsewhere), "blocks" (any
            architecture), "fast" (the old weight-norm bound).
        measured: True (``sinklab.sensitivity`` exact, spectral), an (L+1, T) array, or a
            Sensitivity-like object (as :func:`oversquashing_bound`).
        blocks: precomputed (L, T, T) :func:`layer_block_norms` of this input (else computed
            when "blocks" is asked for, or when a per-layer looseness is wanted: pass
            ``bounds`` without "blocks" and ``blocks=None`` to skip the expensive part).
        progress: progress bars.

    Returns:
        :class:`Thm32Bounds`.
    """
    kinds = [bounds] if isinstance(bounds, str) else list(bounds)
    bad = [k for k in kinds if k not in BOUND_KINDS]
    if bad or not kinds:
        raise ValueError(f"bounds={bounds!r}; choose from {BOUND_KINDS}")
    ids, T, target = _one_sequence(model, ids, target)
    c = model.config
    L = c.n_layers
    seconds: Dict[str, float] = {}
    t0 = time.perf_counter()
    meas = _measured_array(model, ids, target, measured, intervene, L, T)
    if meas is None:
        raise ValueError("thm32_bounds needs the measurement (measured=True or the measured norms)")
    seconds["measured"] = time.perf_counter() - t0 if measured is True else 0.0
    why = analytic_mismatch(c)
    layer: Dict[str, np.ndarray] = {}
    paths: Dict[str, np.ndarray] = {}
    meta: Dict[str, Any] = {"model": getattr(model, "name", None), "T": T,
                            "intervention": intervene is not None}
    want = [k for k in kinds if k in ("analytic", "joint")]
    if want and why is None:
        t0 = time.perf_counter()
        tr = model.run(ids, capture=CAPTURE, intervene=intervene, progress=False)
        an = np.zeros((L, T, T))
        jt = np.zeros((L, T, T))
        checks = []
        with _one_blas_thread():
            for l in progress_bar(range(L), progress, desc="exact local factors", unit="layer"):
                ex = _exact_layer(model, tr, l, intervene, target, joint="joint" in want)
                an[l] = ex.mlp[:, None] * ex.attn
                if ex.joint is not None:
                    jt[l] = ex.joint
                checks.append(ex.check)
        dt = time.perf_counter() - t0
        meta["rope_check"] = float(max(checks)) if checks else 0.0
        if "analytic" in want:
            layer["analytic"] = an
        if "joint" in want:
            layer["joint"] = jt
        for k in want:
            seconds[k] = dt
    if "fast" in kinds and why is None:
        t0 = time.perf_counter()
        fb = oversquashing_bound(model, ids, target=target, intervene=intervene, mlp="fast")
        layer["fast"] = fb.abar
        seconds["fast"] = time.perf_counter() - t0
    if blocks is None and "blocks" in kinds:
        t0 = time.perf_counter()
        rows = None if c.bidirectional else list(range(target + 1))
        blocks = layer_block_norms(model, ids, rows=rows, intervene=intervene, progress=progress)
        seconds["blocks"] = time.perf_counter() - t0
    if blocks is not None:
        blocks = np.asarray(blocks, dtype=np.float64)
        if blocks.shape != (L, T, T):
            raise ValueError(f"blocks has shape {blocks.shape}, expected (L, T, T) = {(L, T, T)}")
        if "blocks" in kinds:
            layer["blocks"] = blocks
    for k in kinds:
        if k in layer:
            paths[k] = _path_rows(layer[k], target)
    return Thm32Bounds(target=target, T=T, n_layers=L, measured=meas, bounds=paths, layer=layer,
                       blocks=blocks, seconds=seconds, analytic_skipped=why if want else None, meta=meta)


# ------------------------------------------------------------------------------ the criterion
CRITERION_THM32 = (
    "Thm. 3.2 says the sensitivity ||d v_i^(L) / d v_j^(0)|| is bounded by, and governed by, path sums of "
    "per-layer attention-plus-identity factors. Contradicted if a rigorous bound of that form is violated "
    "anywhere beyond float32 rounding (rtol 1e-4, any bound, any layer, any source, end to end or one layer). "
    "Otherwise inconclusive if the bound is too loose to test anything (median over sources of the end-to-end "
    "bound / measured > 10) or does not order the sources as the measurement does (the 95% bootstrap interval "
    "of the mean over layers of the per-layer Spearman correlation between bound and measurement over source "
    "positions does not lie above 0; units: source positions for one input, inputs for several). Reproduced "
    "only if it holds, the median end-to-end looseness is <= 10 and that interval lies above 0. Not testable "
    "without a measurement, the chosen bound, or at least 3 source positions.")


def criterion_thm32(result: Any, bound: Optional[str] = None, rtol: float = RTOL,
                    max_looseness: float = 10.0, n_boot: int = 2000, seed: Optional[int] = None):
    """The status of Thm. 3.2 from :class:`Thm32Bounds` (one input, or a list: one per input).

    Args:
        result: a :class:`Thm32Bounds` or a sequence of them (the same bound in each).
        bound: which bound's looseness and correlation are tested (default "blocks" when
            present, else "analytic", else the first); violations count every bound present.
        rtol: rounding slack of a violation.
        max_looseness: the largest median end-to-end bound / measured that still tests something.
        n_boot, seed: the bootstrap of the rank correlation (:func:`sinklab.analysis.stats.bootstrap`).

    Returns:
        :class:`sinklab.analysis.status.Verdict`; the rule is ``CRITERION_THM32``.
    """
    res = list(result) if isinstance(result, (list, tuple)) else [result]
    if not res:
        raise ValueError("criterion_thm32: no results")
    names = res[0].names
    name = bound or ("blocks" if "blocks" in names else "analytic" if "analytic" in names
                     else (names[0] if names else None))
    if name is None or any(name not in r.bounds for r in res):
        return status.not_testable(f"no {name or 'bound'} in the result"
                                   + (f" ({res[0].analytic_skipped})" if res[0].analytic_skipped else ""),
                                   CRITERION_THM32)
    if any(r.target < 2 for r in res):
        return status.not_testable("fewer than 3 source positions (target < 2): no correlation to test",
                                   CRITERION_THM32)
    for r in res:
        r.refresh(rtol)
    viol = sum(r.total_violations() for r in res)
    loose = [r.end_to_end[name] for r in res]
    med = float(np.median([v for v in loose if np.isfinite(v)])) if np.isfinite(loose).any() else float("nan")
    L = res[0].n_layers

    def rows(r: Thm32Bounds):
        t = r.target
        return r.bounds[name][:L, :t + 1], r.measured[:L, :t + 1]

    if len(res) == 1:
        b, m = rows(res[0])

        def stat(i: np.ndarray) -> float:
            sp = _spearman_rows(b[:, i], m[:, i])
            return float(np.nanmean(sp)) if np.isfinite(sp).any() else float("nan")

        rho = bootstrap(stat, b.shape[1], n_boot=n_boot, seed=seed)
        unit = "source positions"
    else:
        per = []
        for r in res:
            sp = _spearman_rows(*rows(r))
            per.append(float(np.nanmean(sp)) if np.isfinite(sp).any() else float("nan"))
        per_a = np.array([p for p in per if np.isfinite(p)])
        if per_a.size == 0:
            return status.Verdict(status.INCONCLUSIVE, "no defined rank correlation", CRITERION_THM32)
        rho = bootstrap(lambda i: float(per_a[i].mean()), per_a.size, n_boot=n_boot, seed=seed)
        unit = "inputs"
    nums = {"bound": name, "violations": viol, "median_end_to_end_ratio": med, "spearman": rho,
            "n_inputs": len(res), "rho_units": unit,
            "depth_10x": [r.depth_10[name] for r in res], "depth_1000x": [r.depth_1000[name] for r in res]}
    shown = f"ρ = {rho.fmt('.3f')} over {rho.n} {unit}"
    if viol:
        return status.Verdict(status.CONTRADICTED, f"the {name} bound (or another bound of the result) is violated "
                              f"at {viol} entries beyond rtol {rtol:g}: a wrong constant or a bug",
                              CRITERION_THM32, nums)
    if not (med <= max_looseness):
        return status.Verdict(status.INCONCLUSIVE, f"the {name} bound holds but is {med:.3g}x the measured norm "
                              f"end to end (median), above {max_looseness:g}x: too loose to test ({shown})",
                              CRITERION_THM32, nums)
    if not rho.above(0.0):
        return status.Verdict(status.INCONCLUSIVE, f"the {name} bound holds within {med:.3g}x, but {shown}: the "
                              f"interval does not lie above 0", CRITERION_THM32, nums)
    return status.Verdict(status.REPRODUCED, f"the {name} bound holds, within {med:.3g}x end to end (median), and "
                          f"orders the sources as measured: {shown}", CRITERION_THM32, nums)


def consistency_thm32(result: Any, rtol: float = RTOL):
    """The exact-block path bound >= the measured norm is a theorem (chain rule and
    submultiplicativity), so its holding is a consistency check of the measurement, not a test
    of the paper: ``status.consistency`` over every (layer, source) entry of every bound."""
    res = list(result) if isinstance(result, (list, tuple)) else [result]
    cases = holds = 0
    for r in res:
        r.refresh(rtol)
        n = r.n_layers * (r.target + 1) * len(r.bounds)
        cases += n
        holds += n - sum(r.violations.values())
    return status.consistency(holds, cases, "every path bound >= the measured Jacobian norm")

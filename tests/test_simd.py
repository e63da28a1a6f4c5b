"""Every SIMD level this CPU supports (generic, avx2, avx512), forced with
sinklab._core.set_simd or SINKLAB_SIMD, against the portable generic path, against float64
NumPy and against transformers fp32.

What differs between levels (csrc/ops.c): the vector exp (Cephes polynomial, <= 2 ulp) against
libm's expf (<= 1 ulp) in softmax and SwiGLU, the order of the double sums in softmax and
RMSNorm, and the SGEMM kernels (FMA contraction, blocking). Each op therefore differs by a few
ulp (u = 2^-24 ~ 6e-8) between levels. Through the model those differences are amplified the
way test_determinism's module docstring describes (softmax turns an absolute logit difference d
into a relative probability difference d, |logit| reaches 10-40, and depth compounds it), so the
whole-model bounds are the ones derived and measured there: SIMD_RTOL = 5e-6 of max|generic|
per tensor on the tiny models, SMOL_SIMD_RTOL = 5e-5 on SmolLM2's 30 layers. The op-level check
(`test_softmax_entropy_vs_float64`) needs no such amplification: it bounds each attention
probability and each row entropy from the captured q and k directly (see its docstring).

Determinism: within a level, 1 and 2 threads give the same bits, and SINKLAB_SIMD=<level> at
import gives the same bits as set_simd(<level>).

The model shapes are chosen so that the SIMD kernels meet their awkward cases: d_model = 232
and d_ff = 700 are not multiples of 16 (masked / padded tails in RMSNorm and SwiGLU: T * d_ff
= 143 * 700 is 4 mod 16), causal softmax rows have every length 1..T, and T * d and T * d_ff
exceed the ops' thresholds for splitting work across threads.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support import reference_models as rm
from test_determinism import (_CHILD, SIMD_RTOL, SMOL_SIMD_RTOL, _assert_bitwise,  # noqa: E402
                              threads_restored)

rm.require("torch")
rm.require("transformers")

import sinklab as sl  # noqa: E402
import sinklab._core as core  # noqa: E402

_ALL_LEVELS = ("generic", "avx2", "avx512")
LEVELS = _ALL_LEVELS[:_ALL_LEVELS.index(core.simd_best()) + 1]
SIMD_LEVELS = [lv for lv in LEVELS if lv != "generic"]
CAPTURE = ("attn", "resid", "logits", "stats")
STATS = ("importance", "to_first", "entropy")

TAIL_SPEC = rm.TinySpec("simd_tail", d_model=232, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=58,
                        d_ff=700, vocab_size=1001, context_length=512, seed=12)
TAIL_T = 143
SMOL_T = 96          # T * d_ff = 147456 and T * d = 55296: both split over threads
U = 2.0 ** -24       # unit roundoff of float32

_ = threads_restored  # a fixture imported for the tests below


@pytest.fixture(scope="module")
def tail_model(tmp_path_factory):
    m = rm.make_hf_model(TAIL_SPEC)
    path = rm.save_hf(m, tmp_path_factory.mktemp("simd") / "simd-tail")
    return {"hf": m, "path": path, "sl": sl.load(str(path))}


@pytest.fixture(scope="module")
def smol(smollm2_model):
    return smollm2_model


def _at(level, fn):
    """fn() with the kernels of `level`, then back to the default level."""
    assert core.set_simd(level) == level, f"set_simd({level!r}) did not select {level}"
    try:
        assert sl.simd() == level
        return fn()
    finally:
        core.set_simd("auto")


def _run(model, ids, capture=CAPTURE):
    tr = model.run(ids, capture=capture, progress=False)
    out = {}
    for k in capture:
        if k == "stats":
            out.update({f"stats.{s}": np.array(getattr(tr.stats, s), copy=True) for s in STATS})
        else:
            out[k] = np.array(getattr(tr, k), copy=True)
    return out


def _assert_all_bitwise(a, b, what):
    _assert_bitwise(a, b, what)   # attn, resid, logits
    for k in (k for k in a if k.startswith("stats.")):
        assert np.array_equal(a[k], b[k]), (
            f"{what} {k}: not bitwise identical "
            f"(max |diff| {np.max(np.abs(a[k].astype(np.float64) - b[k])):.3e})")


def test_levels_selectable():
    """Every level up to the CPU's best can be forced; 'auto' returns to the best."""
    assert sl.simd() == core.simd_best()
    for lv in LEVELS:
        assert _at(lv, sl.simd) == lv
    assert core.set_simd("auto") == core.simd_best()


@pytest.mark.parametrize("level", SIMD_LEVELS)
def test_level_vs_generic_tiny(tail_model, level):
    model = tail_model["sl"]
    ids = rm.random_ids(TAIL_SPEC.vocab_size, TAIL_T, seed=21)
    gen = _at("generic", lambda: _run(model, ids))
    got = _at(level, lambda: _run(model, ids))
    for k in gen:
        rm.assert_close(f"{level} vs generic {k}", got[k], gen[k], rtol=SIMD_RTOL)
    # the level really switched kernels: the vector exp and expf disagree somewhere
    assert not np.array_equal(got["attn"], gen["attn"]), f"{level}: attn bitwise equal to generic"


@pytest.mark.parametrize("level", SIMD_LEVELS)
def test_level_vs_generic_smollm2(smol, level):
    ids = rm.random_ids(49152, SMOL_T, seed=22)
    gen = _at("generic", lambda: _run(smol, ids))
    got = _at(level, lambda: _run(smol, ids))
    measured = {}
    for k in gen:
        e, s = rm.max_err(got[k], gen[k])
        measured[k] = e / s if s else e
    rm.merge_report(os.environ.get("SINKLAB_PARITY_REPORT"), f"simd_{level}_vs_generic_smollm2",
                    measured)
    for k in gen:
        rm.assert_close(f"SmolLM2 {level} vs generic {k}", got[k], gen[k], rtol=SMOL_SIMD_RTOL)
    assert not np.array_equal(got["attn"], gen["attn"]), f"{level}: attn bitwise equal to generic"


@pytest.mark.parametrize("level", LEVELS)
def test_level_parity_vs_transformers(tail_model, level):
    """Each level alone meets the 1e-4 parity bound against transformers fp32 (the parity
    modules check the default level on many more configs)."""
    ids = rm.random_ids(TAIL_SPEC.vocab_size, TAIL_T, seed=23)
    ref = rm.hf_forward(tail_model["hf"], ids)
    got = _at(level, lambda: tail_model["sl"].run(ids, capture=("attn", "resid", "logits"),
                                                  progress=False))
    rm.ErrorLog(level).compare_trace(f"{level} simd_tail T={TAIL_T}", got, ref)


def _assert_threads_bitwise(model, ids, level, what):
    """The forward at ``level`` on 1 and on 2 threads: bitwise the same captures."""
    sl.set_num_threads(1)
    one = _at(level, lambda: _run(model, ids))
    sl.set_num_threads(2)
    two = _at(level, lambda: _run(model, ids))
    _assert_all_bitwise(one, two, f"{what}{level}: 1 vs 2 threads")


@pytest.mark.parametrize("level", LEVELS)
def test_threads_bitwise_tiny(tail_model, threads_restored, level):
    _assert_threads_bitwise(tail_model["sl"], rm.random_ids(TAIL_SPEC.vocab_size, TAIL_T, seed=24), level, "")


@pytest.mark.parametrize("level", LEVELS)
def test_threads_bitwise_smollm2(smol, threads_restored, level):
    _assert_threads_bitwise(smol, rm.random_ids(49152, SMOL_T, seed=25), level, "SmolLM2 ")


@pytest.mark.parametrize("level", LEVELS)
def test_env_matches_set_simd(tail_model, tmp_path, level):
    """SINKLAB_SIMD=<level> at import selects the same kernels as set_simd(<level>)."""
    ids = rm.random_ids(TAIL_SPEC.vocab_size, 61, seed=26)
    want = _at(level, lambda: _run(tail_model["sl"], ids, ("attn", "resid", "logits")))
    ids_path = tmp_path / "ids.npy"
    np.save(ids_path, ids)
    env = dict(os.environ, SINKLAB_SIMD=level)
    r = subprocess.run([sys.executable, "-c", _CHILD, str(tail_model["path"]), str(ids_path), "2"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"SIMD={level}" in r.stdout, r.stdout[-2000:]
    got = dict(np.load(str(ids_path) + ".out.npz"))
    _assert_bitwise(want, got, f"SINKLAB_SIMD={level} subprocess vs set_simd({level!r})")


def _float64_attention(q, k, scale):
    """Causal softmax of scale * q k^T in float64 from float32 q (H, T, hd) and k (G, T, hd).

    Returns p (H, T, T), the row entropies (H, T), the max-shifted scores s - max (H, T, T,
    zero above the diagonal) and err (H, T, T): a bound on how far the log-weight the kernel
    exponentiates, fl32(fl32(q.k) * scale) - max, can be from the exact scale * q.k - max:
    a float32 dot product of length hd in any order is off by <= gamma_hd * sum |q_j k_j|; the
    product with scale (and scale's own rounding) adds 2u |s|; the subtraction of the max u |s - max|."""
    H, T, hd = q.shape
    kk = np.repeat(k.astype(np.float64), H // k.shape[0], axis=0)
    qq = q.astype(np.float64)
    causal = np.tril(np.ones((T, T), dtype=bool))
    s = np.where(causal, scale * np.einsum("htd,hsd->hts", qq, kk), -np.inf)
    shifted = np.where(causal, s - s.max(axis=-1, keepdims=True), 0.0)
    e = np.where(causal, np.exp(shifted), 0.0)
    p = e / e.sum(axis=-1, keepdims=True)
    ent = -np.sum(np.where(causal, p * np.log(np.where(causal & (p > 0), p, 1.0)), 0.0), axis=-1)
    gamma = hd * U / (1 - hd * U)
    absdot = scale * np.einsum("htd,hsd->hts", np.abs(qq), np.abs(kk))
    err = np.where(causal, gamma * absdot + 2 * U * np.abs(np.where(causal, s, 0.0)) + U * np.abs(shifted), 0.0)
    return p, ent, shifted, err


@pytest.mark.parametrize("level", LEVELS)
def test_softmax_entropy_vs_float64(smol, level):
    """Attention probabilities and row entropies at each level against float64 NumPy computed
    from the captured (post-RoPE) q and k of the same run.

    With err_j the bound on key j's log-weight error (see _float64_attention), the kernel's
    log p_i is off by at most err_i + log(sum_j p_j exp(err_j)) from the exact one; the exp
    (vector polynomial <= 2 ulp = 4u, expf <= 1 ulp), the double sums, the 1/Z multiply add
    at most 6u relative. Hence, per element,
        |p_i - p64_i| <= p64_i * expm1(err_i + log1p(sum_j p_j expm1(err_j)) + 6u) + 1e-30
    (the absolute term covers probabilities the vector exp clamps at exp(-87.3)). For the
    entropy H = log Z - E_p[s], log-weight perturbations e_j give dH = -Cov_p(s, e), so
        |H - H64| <= (max_j err_j + 6u) * E_p|s - E_p s| + 2u |H64| + 1e-6
    (the last terms: the float32 result and second-order terms). Both bounds are per row and
    tight to a few ulp, so a wrong exp, a wrong sum or a lost tail element fails them."""
    ids = rm.random_ids(49152, 80, seed=27)
    layers = [0, 7, 29]      # an early layer, a middle one, the last
    tr = _at(level, lambda: smol.run(ids, capture=("attn", "stats", "q", "k"), layers=layers,
                                     progress=False))
    scale = 1.0 / np.sqrt(smol.config.head_dim)
    attn, ent = np.asarray(tr.attn), np.asarray(tr.stats.entropy)
    for i, l in enumerate(layers):
        p64, h64, sh, err = _float64_attention(np.asarray(tr.q)[i], np.asarray(tr.k)[i], scale)
        norm = np.log1p(np.sum(p64 * np.expm1(err), axis=-1, keepdims=True))
        bound = p64 * np.expm1(err + norm + 6 * U) + 1e-30
        excess = np.abs(attn[i].astype(np.float64) - p64) - bound
        assert excess.max() <= 0, (
            f"{level} layer {l}: attention off float64 by more than the bound "
            f"(worst excess {excess.max():.3e} at {np.unravel_index(np.argmax(excess), excess.shape)})")
        spread = np.sum(p64 * np.abs(sh - np.sum(p64 * sh, axis=-1, keepdims=True)), axis=-1)
        hb = (err.max(axis=-1) + 6 * U) * spread + 2 * U * np.abs(h64) + 1e-6
        herr = np.abs(ent[i].astype(np.float64) - h64)
        assert np.all(herr <= hb), (
            f"{level} layer {l}: entropy off float64 by {herr.max():.3e} "
            f"(bound there {hb.flat[np.argmax(herr - hb)]:.3e})")
        # the statistics read the same probabilities the attn capture holds
        assert np.array_equal(np.asarray(tr.stats.to_first)[i], attn[i][..., 0])

"""SGEMM (C = op(A) @ op(B), fp32): accuracy against float64 NumPy, determinism, dispatch, errors.

The first part tests the forward layout C = A @ B.T (sgemm_nt); the section "All four layouts"
tests sgemm(A, B, trans_a, trans_b) with A stored (M, K) or (K, M) and B stored (N, K) or (K, N),
as the backward pass uses them (dx = dy @ W: NN; dW += dy.T @ x: TN).

Error bound used throughout. Every C element is one sequential chain c = c + a_k*b_k (k in order),
one rounding per step (FMA) or two (generic), so |C - C_exact| <= gamma * sum_k |a_k*b_k| with
gamma = (2K + 2) * u, u = 2**-24 (standard bound for recursive summation, Higham 2002 §3.1; the
+2 covers the product roundings and the final store). The bound is rigorous, yet tight enough to
catch a dropped or doubled term: that costs ~ sum|ab| / K, which exceeds gamma * sum|ab| by
orders of magnitude for every K used here (K * gamma <= 1536 * 3074 * 6e-8 = 0.28 < 1).
"""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import sinklab._core as core

U = 2.0**-24
ROOT = Path(__file__).resolve().parents[1]
BEST = core.simd_best()
HAS_AVX2 = BEST in ("avx2", "avx512")
LEVELS = {"generic": ["generic"], "avx2": ["generic", "avx2"], "avx512": ["generic", "avx2", "avx512"]}[BEST]


@pytest.fixture(autouse=True)
def _restore_state():
    simd, threads = core.simd(), core.get_num_threads()
    yield
    core.set_simd(simd)
    core.set_num_threads(threads)


def rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def check_close(C, A, B, C0=None):
    """C against float64 A @ B.T (+ C0), elementwise within the rigorous chain bound."""
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    ref = A64 @ B64.T
    scale = np.abs(A64) @ np.abs(B64).T
    if C0 is not None:
        ref = ref + C0
        scale = scale + np.abs(C0)
    K = A.shape[1]
    tol = (2 * K + 2) * U * scale + 1e-30
    err = np.abs(C.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err - tol), err.shape) if err.size else None
    assert np.all(err <= tol), f"max excess at {worst}: err {err[worst]:.3g} > tol {tol[worst]:.3g}"


SHAPES = [
    (1, 1, 1), (1, 7, 24), (1, 576, 576), (2, 3, 5), (5, 17, 9), (6, 16, 8), (7, 33, 24),
    (13, 15, 31), (64, 64, 64), (64, 200, 64), (64, 64, 200), (96, 48, 257), (100, 1000, 3),
    (128, 576, 576), (130, 1030, 70), (37, 2051, 19), (512, 64, 300), (3, 4100, 11),
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_matches_float64(level, M, N, K):
    rng = np.random.default_rng(M * 1000003 + N * 1009 + K)
    A, B = rand(rng, M, K), rand(rng, N, K)
    assert core.set_simd(level) == level
    C = core.sgemm_nt(A, B)
    assert C.shape == (M, N) and C.dtype == np.float32
    check_close(C, A, B)


@pytest.mark.parametrize("level", LEVELS)
def test_smollm2_shapes(level):
    rng = np.random.default_rng(1)
    core.set_simd(level)
    for M, N, K in [(128, 576, 576), (128, 1536, 576), (128, 576, 1536), (512, 576, 1536)]:
        A, B = rand(rng, M, K), rand(rng, N, K)
        check_close(core.sgemm_nt(A, B), A, B)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("M,N,K", [(1, 7, 24), (9, 40, 300), (128, 576, 576)])
def test_accumulate(level, M, N, K):
    rng = np.random.default_rng(7)
    A, B, C0 = rand(rng, M, K), rand(rng, N, K), rand(rng, M, N)
    core.set_simd(level)
    C = C0.copy()
    out = core.sgemm_nt(A, B, C, accumulate=True)
    assert out is C or np.shares_memory(out, C)
    check_close(C, A, B, C0.astype(np.float64))
    # without accumulate, C is overwritten (old contents ignored, even NaN)
    C[:] = np.nan
    core.sgemm_nt(A, B, C)
    check_close(C, A, B)


def test_zero_k():
    A, B = np.zeros((3, 0), np.float32), np.zeros((4, 0), np.float32)
    assert np.array_equal(core.sgemm_nt(A, B), np.zeros((3, 4), np.float32))
    C = np.ones((3, 4), np.float32)
    core.sgemm_nt(A, B, C, accumulate=True)
    assert np.array_equal(C, np.ones((3, 4), np.float32))
    assert core.sgemm_nt(np.zeros((0, 5), np.float32), np.zeros((4, 5), np.float32)).shape == (0, 4)


@pytest.mark.parametrize("level", LEVELS)
def test_generic_emulation_and_chain(level):
    """The reduction is exactly the sequential chain over k: splitting K and continuing with
    accumulate=True reproduces the one-shot result bit for bit (whatever the K blocking), and the
    generic path equals a float32 emulation c = fl(c + fl(a*b)) bit for bit."""
    rng = np.random.default_rng(3)
    M, N, K = 19, 37, 700
    A, B = rand(rng, M, K), rand(rng, N, K)
    core.set_simd(level)
    full = core.sgemm_nt(A, B)
    for k1 in (1, 255, 256, 333):
        C = core.sgemm_nt(np.ascontiguousarray(A[:, :k1]), np.ascontiguousarray(B[:, :k1]))
        core.sgemm_nt(np.ascontiguousarray(A[:, k1:]), np.ascontiguousarray(B[:, k1:]), C, accumulate=True)
        assert np.array_equal(C, full), f"split at k={k1} changed the bits"
    if level == "generic":
        emu = np.zeros((M, N), np.float32)
        for k in range(K):
            emu = emu + np.outer(A[:, k], B[:, k])  # float32 product, then float32 add
        assert np.array_equal(emu, full)


def test_generic_vs_avx2():
    if not HAS_AVX2:
        pytest.skip("CPU has no AVX2+FMA")
    rng = np.random.default_rng(11)
    for M, N, K in [(128, 576, 1536), (64, 64, 64), (7, 33, 24), (512, 1536, 576)]:
        A, B = rand(rng, M, K), rand(rng, N, K)
        core.set_simd("generic")
        g = core.sgemm_nt(A, B)
        core.set_simd("avx2")
        v = core.sgemm_nt(A, B)
        ref = np.abs(A.astype(np.float64) @ B.T.astype(np.float64)).max()
        # FMA vs separate multiply-add: only rounding differs (typically ~sqrt(K)*u*|C|).
        assert np.abs(g.astype(np.float64) - v).max() <= 1e-6 * ref


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("M,N,K", [(128, 576, 576), (512, 64, 300), (6, 5000, 40), (257, 1537, 129)])
def test_threads_bitwise(level, M, N, K):
    rng = np.random.default_rng(5)
    A, B = rand(rng, M, K), rand(rng, N, K)
    core.set_simd(level)
    out = {}
    for n in (1, 2, 3):
        core.set_num_threads(n)
        out[n] = core.sgemm_nt(A, B)
    assert np.array_equal(out[1], out[2]) and np.array_equal(out[1], out[3])


@pytest.mark.parametrize("level", LEVELS)
def test_batch_invariance(level):
    """A row (or column) of C does not depend on which other rows/columns are computed with it:
    the M/N tiling never changes the reduction."""
    rng = np.random.default_rng(9)
    A, B = rand(rng, 77, 600), rand(rng, 1100, 600)
    core.set_simd(level)
    full = core.sgemm_nt(A, B)
    for i in (0, 5, 6, 76):
        assert np.array_equal(core.sgemm_nt(A[i:i + 1].copy(), B)[0], full[i])
    for j0, j1 in ((0, 1), (3, 20), (1000, 1100)):
        assert np.array_equal(core.sgemm_nt(A, B[j0:j1].copy()), full[:, j0:j1])


def test_special_values():
    rng = np.random.default_rng(2)
    A, B = rand(rng, 8, 20), rand(rng, 18, 20)
    A[3, 4] = np.nan
    B[17, 0] = np.inf
    for level in LEVELS:
        core.set_simd(level)
        C = core.sgemm_nt(A, B)
        assert np.all(np.isnan(C[3])) and np.all(np.isinf(C[np.arange(8) != 3, 17]))
        assert np.isfinite(np.delete(np.delete(C, 3, 0), 17, 1)).all()


def test_bad_inputs():
    f = np.ones((4, 5), np.float32)
    with pytest.raises((TypeError, ValueError)):
        core.sgemm_nt(f.astype(np.float64), f)
    with pytest.raises((TypeError, ValueError)):
        core.sgemm_nt(np.ones(5, np.float32), f)
    with pytest.raises(ValueError):
        core.sgemm_nt(f, np.ones((3, 6), np.float32))  # inner sizes differ
    with pytest.raises((TypeError, ValueError)):
        core.sgemm_nt(f, f, np.ones((4, 3), np.float32))  # C has the wrong shape
    with pytest.raises((TypeError, ValueError)):
        core.sgemm_nt(f, f, np.ones((4, 4), np.float64))
    with pytest.raises(ValueError):
        core.sgemm_nt(f, f, accumulate=True)  # nothing to accumulate into
    with pytest.raises((TypeError, ValueError)):
        core.sgemm_nt("x", f)
    with pytest.raises(ValueError):
        core.set_simd("avx9000")


def test_simd_env_var():
    code = "import sinklab._core as c; print(c.simd())"
    env = dict(os.environ, SINKLAB_SIMD="generic")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "generic"
    for name, want in [("auto", BEST), ("avx2", "avx2" if HAS_AVX2 else "generic"), ("avx512", BEST)]:
        env["SINKLAB_SIMD"] = name
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
        assert out.stdout.strip() == want, f"SINKLAB_SIMD={name}"


# ---------------------------------------------------------------------------------------------
# All four layouts: op(A) = A (stored (M, K)) or A.T (stored (K, M)); op(B) = B.T (stored (N, K))
# or B (stored (K, N)). Same chain bound as above, with the same K.

LAYOUTS = [(False, True), (False, False), (True, False), (True, True)]
LAYOUT_IDS = ["NT", "NN", "TN", "TT"]
MR, NR, KC, MC, NC = 6, 16, 256, 96, 512  # the tiling of csrc/sgemm.c: edge sizes sit around these
MR5, NR5, KC5, MC5 = 14, 32, 256, 112  # the AVX-512 path's tile and blocking


def stored(rng, M, N, K, ta, tb):
    """Random operands in the stored layouts: A (K, M) if ta else (M, K), B (N, K) if tb else (K, N)."""
    return rand(rng, *((K, M) if ta else (M, K))), rand(rng, *((N, K) if tb else (K, N)))


def as_nt(A, B, ta, tb):
    """The same operands as contiguous op(A) (M, K) and op(B).T (N, K)."""
    return np.ascontiguousarray(A.T if ta else A), np.ascontiguousarray(B if tb else B.T)


LAYOUT_SHAPES = [
    (1, 1, 1), (1, 17, 7), (13, 1, 300), (MR - 1, NR - 1, KC - 1), (MR, NR, KC), (MR + 1, NR + 1, KC + 1),
    (2 * MR + 1, 3 * NR - 1, 2 * KC + 1), (MC - 1, NC + 1, 9), (MC + 1, NC - 1, 33), (1, 600, 5),
    (200, 30, 520), (64, 1030, 70), (37, 20, 1000),
    (MR5 - 1, NR5 - 1, 40), (MR5 + 1, NR5 + 1, KC5 + 1), (MC5 + 1, 2 * NR5 + 17, 3), (2 * MC5 - 1, 48, 17),
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("M,N,K", LAYOUT_SHAPES)
def test_layouts_match_float64(level, ta, tb, M, N, K):
    rng = np.random.default_rng(M * 1000003 + N * 1009 + K)
    A, B = stored(rng, M, N, K, ta, tb)
    assert core.set_simd(level) == level
    C = core.sgemm(A, B, trans_a=ta, trans_b=tb)
    assert C.shape == (M, N) and C.dtype == np.float32
    check_close(C, *as_nt(A, B, ta, tb))


@pytest.mark.parametrize("level", LEVELS)
def test_backward_shapes(level):
    """SmolLM2-135M's backward products (d = 576, F = 1536, kv = 192, T = 512): input gradients
    dx = dy @ W (NN) and weight gradients dW = dy.T @ x (TN)."""
    rng = np.random.default_rng(4)
    core.set_simd(level)
    T = 512
    for out, inp in [(576, 576), (192, 576), (1536, 576), (576, 1536)]:
        W, dy, x = rand(rng, out, inp), rand(rng, T, out), rand(rng, T, inp)
        check_close(core.sgemm(dy, W, trans_b=False), dy, np.ascontiguousarray(W.T))  # (T, in)
        check_close(core.sgemm(dy, x, trans_a=True, trans_b=False),
                    np.ascontiguousarray(dy.T), np.ascontiguousarray(x.T))  # (out, in)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("M,N,K", [(1, 7, 24), (9, 40, 300), (130, 100, 513)])
def test_layouts_accumulate(level, ta, tb, M, N, K):
    rng = np.random.default_rng(8)
    A, B = stored(rng, M, N, K, ta, tb)
    C0 = rand(rng, M, N)
    core.set_simd(level)
    C = C0.copy()
    out = core.sgemm(A, B, C, trans_a=ta, trans_b=tb, accumulate=True)
    assert np.shares_memory(out, C)
    check_close(C, *as_nt(A, B, ta, tb), C0.astype(np.float64))
    C[:] = np.nan  # without accumulate the old contents are ignored
    core.sgemm(A, B, C, trans_a=ta, trans_b=tb)
    check_close(C, *as_nt(A, B, ta, tb))


@pytest.mark.parametrize("level", LEVELS)
def test_layouts_same_chain(level):
    """Every layout runs the same chain per element, so the four layouts of the same product are
    bitwise equal, splitting K and continuing with accumulate=True changes no bit, and the generic
    path equals the float32 emulation c = fl(c + fl(a*b)) over k in order."""
    rng = np.random.default_rng(6)
    M, N, K = 19, 37, 700
    opA, opBt = rand(rng, M, K), rand(rng, N, K)  # op(A) (M, K), op(B).T (N, K)
    core.set_simd(level)
    store = {  # the stored operands for each layout
        (ta, tb): (np.ascontiguousarray(opA.T) if ta else opA, opBt if tb else np.ascontiguousarray(opBt.T))
        for ta, tb in LAYOUTS
    }
    full = core.sgemm(opA, opBt)
    if level == "generic":
        emu = np.zeros((M, N), np.float32)
        for k in range(K):
            emu = emu + np.outer(opA[:, k], opBt[:, k])  # float32 product, then float32 add
        assert np.array_equal(emu, full)
    for (ta, tb), (A, B) in store.items():
        assert np.array_equal(core.sgemm(A, B, trans_a=ta, trans_b=tb), full), (ta, tb)
        for k1 in (1, 255, 256, 333):
            A1, A2 = (A[:k1], A[k1:]) if ta else (A[:, :k1], A[:, k1:])
            B1, B2 = (B[:, :k1], B[:, k1:]) if tb else (B[:k1], B[k1:])
            C = core.sgemm(np.ascontiguousarray(A1), np.ascontiguousarray(B1), trans_a=ta, trans_b=tb)
            core.sgemm(np.ascontiguousarray(A2), np.ascontiguousarray(B2), C, trans_a=ta, trans_b=tb,
                       accumulate=True)
            assert np.array_equal(C, full), f"layout {(ta, tb)}: split at k={k1} changed the bits"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("M,N,K", [(128, 576, 576), (576, 576, 512), (6, 5000, 40), (257, 1537, 129)])
def test_layouts_threads_bitwise(level, ta, tb, M, N, K):
    rng = np.random.default_rng(5)
    A, B = stored(rng, M, N, K, ta, tb)
    core.set_simd(level)
    out = {}
    for n in (1, 2, 3):
        core.set_num_threads(n)
        out[n] = core.sgemm(A, B, trans_a=ta, trans_b=tb)
    assert np.array_equal(out[1], out[2]) and np.array_equal(out[1], out[3])


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
def test_layouts_generic_vs_avx2(ta, tb):
    if not HAS_AVX2:
        pytest.skip("CPU has no AVX2+FMA")
    rng = np.random.default_rng(12)
    for M, N, K in [(512, 576, 1536), (576, 1536, 512), (7, 33, 24), (64, 64, 64)]:
        A, B = stored(rng, M, N, K, ta, tb)
        core.set_simd("generic")
        g = core.sgemm(A, B, trans_a=ta, trans_b=tb)
        core.set_simd("auto")
        v = core.sgemm(A, B, trans_a=ta, trans_b=tb)
        a64, b64 = as_nt(A, B, ta, tb)
        ref = np.abs(a64.astype(np.float64) @ b64.T.astype(np.float64)).max()
        assert np.abs(g.astype(np.float64) - v).max() <= 1e-6 * ref


# Edge sizes around both tilings (6x16 and 14x32 tiles, K blocks of 256, M blocks of 96 and 112),
# plus the shapes of real layers.
AVX512_SHAPES = [
    (1, 1, 1), (1, 31, 7), (13, 33, 255), (MR5, NR5, KC5), (MR5 + 1, NR5 - 1, KC5 + 1), (15, 16, 8),
    (MC5 - 1, 3 * NR5 + 5, 2 * KC5 + 3), (MC5 + 1, NC + 1, 9), (MC + 5, 17, 700), (128, 128, 896),
    (128, 576, 576), (300, 192, 130), (20, 40, 1024), (15, 33, 2048),
]


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
def test_avx512_bitwise_equals_avx2(ta, tb):
    """The AVX-512 kernel runs the same fused multiply-add chain per element as the AVX2 kernel, on
    a different tile and blocking, so both give the same bits: every layout, ragged edges, with and
    without accumulate, on 1 and 2 threads."""
    if BEST != "avx512":
        pytest.skip("CPU has no AVX-512 F/BW/VL/DQ")
    rng = np.random.default_rng(13)
    for M, N, K in AVX512_SHAPES:
        A, B = stored(rng, M, N, K, ta, tb)
        C0 = rand(rng, M, N)
        out = {}
        for level in ("avx2", "avx512"):
            assert core.set_simd(level) == level
            for threads in (1, 2):
                core.set_num_threads(threads)
                C = C0.copy()
                core.sgemm(A, B, C, trans_a=ta, trans_b=tb, accumulate=True)
                out[level, threads] = (core.sgemm(A, B, trans_a=ta, trans_b=tb), C)
        ref = out["avx2", 1]
        for key, (plain, acc) in out.items():
            assert np.array_equal(plain, ref[0]), f"{(M, N, K)} {key}: differs from avx2 on 1 thread"
            assert np.array_equal(acc, ref[1]), f"{(M, N, K)} {key} accumulate: differs from avx2 on 1 thread"
        check_close(ref[0], *as_nt(A, B, ta, tb))  # and both are right, not just equal


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
def test_layouts_special_values(ta, tb):
    """A NaN in op(A)[3, 4] fills row 3 of C; an inf in op(B)[0, 17] fills column 17 (other rows)."""
    rng = np.random.default_rng(2)
    opA, opBt = rand(rng, 8, 20), rand(rng, 18, 20)
    opA[3, 4] = np.nan
    opBt[17, 0] = np.inf
    A = np.ascontiguousarray(opA.T) if ta else opA
    B = opBt if tb else np.ascontiguousarray(opBt.T)
    for level in LEVELS:
        core.set_simd(level)
        C = core.sgemm(A, B, trans_a=ta, trans_b=tb)
        assert np.all(np.isnan(C[3])) and np.all(np.isinf(C[np.arange(8) != 3, 17]))
        assert np.isfinite(np.delete(np.delete(C, 3, 0), 17, 1)).all()


def test_layouts_bad_inputs():
    a = np.ones((4, 5), np.float32)
    with pytest.raises(ValueError):
        core.sgemm(a, np.ones((4, 3), np.float32), trans_b=False)  # op(A) (4, 5) @ (4, 3)
    with pytest.raises(ValueError):
        core.sgemm(a, np.ones((3, 5), np.float32), trans_a=True)  # op(A) (5, 4) @ (5, 3).T
    core.sgemm(a, np.ones((4, 3), np.float32), trans_a=True, trans_b=False)  # (5, 4) @ (4, 3): fine
    with pytest.raises((TypeError, ValueError)):
        core.sgemm(a, np.ones((5, 3), np.float32), np.ones((3, 4), np.float32), trans_b=False)  # C is (M, N)


# ---------------------------------------------------------------------------------------------
# The C API directly: leading dimensions, argument checks, calls from inside a parallel region.

DRIVER = textwrap.dedent(r"""
    #include <math.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include "cpu.h"
    #include "sgemm.h"
    #include "sl_common.h"

    static int fails = 0;
    #define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL line %d: ", __LINE__); \
        printf(__VA_ARGS__); printf("\n"); } } while (0)

    static float frand(unsigned *s) { *s = *s * 1664525u + 1013904223u; return (float)(*s >> 8) / 16777216.0f - 0.5f; }

    /* C = op(A)·op(B) with every matrix inside a larger buffer (ld > row length), padding set to
     * NaN in A and B (must never be read) and to a sentinel in C (must never be written).
     * A is stored (K, M) when ta, else (M, K); B is stored (N, K) when tb, else (K, N). */
    static void strided(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t pa, int64_t pb, int64_t pc,
                        int par) {
        int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
        int64_t lda = ca + pa, ldb = cb + pb, ldc = N + pc;
        float *A = malloc(sizeof(float) * (ra * lda + 1)), *B = malloc(sizeof(float) * (rb * ldb + 1));
        float *C = malloc(sizeof(float) * (M * ldc + 1));
        unsigned s = 1234u + (unsigned)(M * 7 + N * 13 + K);
        for (int64_t i = 0; i < ra * lda; i++) A[i] = (i % lda) < ca ? frand(&s) : NAN;
        for (int64_t i = 0; i < rb * ldb; i++) B[i] = (i % ldb) < cb ? frand(&s) : NAN;
        for (int64_t i = 0; i < M * ldc; i++) C[i] = -7.0f;
        int rc = ta == 0 && tb == 1 ? sl_sgemm_nt(M, N, K, A, lda, B, ldb, C, ldc, 0, par)
                                    : sl_sgemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, 0, par);
        CHECK(rc == SL_OK, "strided rc %d", rc);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < ldc; j++) {
                float c = C[i * ldc + j];
                if (j >= N) { CHECK(c == -7.0f, "C padding written at (%lld,%lld)", (long long)i, (long long)j); continue; }
                double ref = 0, sc = 0;
                for (int64_t k = 0; k < K; k++) {
                    double a = ta ? A[k * lda + i] : A[i * lda + k], b = tb ? B[j * ldb + k] : B[k * ldb + j];
                    ref += a * b; sc += fabs(a * b);
                }
                double tol = (2.0 * K + 2) * ldexp(1.0, -24) * sc + 1e-30;
                CHECK(fabs(c - ref) <= tol, "ta=%d tb=%d M=%lld N=%lld K=%lld (%lld,%lld): %g vs %g", ta, tb,
                      (long long)M, (long long)N, (long long)K, (long long)i, (long long)j, c, ref);
            }
        free(A); free(B); free(C);
    }

    int main(void) {
        for (int lvl = 0; lvl < 3; lvl++) {
            if (sl_set_simd((sl_simd_level)lvl) != (sl_simd_level)lvl) continue;
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    strided(ta, tb, 1, 7, 24, 3, 1, 5, 1);
                    strided(ta, tb, 13, 35, 70, 1, 9, 3, 1);
                    strided(ta, tb, 64, 64, 64, 64, 0, 64, 0);
                    strided(ta, tb, 130, 300, 260, 5, 7, 1, 1);
                    strided(ta, tb, 6, 16, 8, 1, 1, 1, 0);
                    strided(ta, tb, 5, 17, 257, 2, 3, 0, 0);
                }
        }
        float x[64] = {0};
        CHECK(sl_sgemm_nt(-1, 2, 2, x, 2, x, 2, x, 2, 0, 1) == SL_ERR_VALUE, "negative M");
        CHECK(sl_sgemm_nt(2, -2, 2, x, 2, x, 2, x, 2, 0, 1) == SL_ERR_VALUE, "negative N");
        CHECK(sl_sgemm_nt(2, 2, -2, x, 2, x, 2, x, 2, 0, 1) == SL_ERR_VALUE, "negative K");
        CHECK(sl_sgemm_nt(2, 2, 3, x, 2, x, 3, x, 2, 0, 1) == SL_ERR_VALUE, "lda < K");
        CHECK(sl_sgemm_nt(2, 2, 3, x, 3, x, 2, x, 2, 0, 1) == SL_ERR_VALUE, "ldb < K");
        CHECK(sl_sgemm_nt(2, 4, 3, x, 3, x, 3, x, 3, 0, 1) == SL_ERR_VALUE, "ldc < N");
        CHECK(sl_sgemm_nt(2, 2, 2, NULL, 2, x, 2, x, 2, 0, 1) == SL_ERR_VALUE, "A NULL");
        CHECK(sl_sgemm_nt(2, 2, 2, x, 2, NULL, 2, x, 2, 0, 1) == SL_ERR_VALUE, "B NULL");
        CHECK(sl_sgemm_nt(2, 2, 2, x, 2, x, 2, NULL, 2, 0, 1) == SL_ERR_VALUE, "C NULL");
        CHECK(sl_sgemm_nt(3, 2, 2, x, INT64_MAX, x, 2, x, 2, 0, 1) == SL_ERR_VALUE, "lda overflow");
        /* leading dimensions are checked against the stored row length of each layout */
        CHECK(sl_sgemm(1, 0, 4, 3, 2, x, 3, x, 3, x, 3, 0, 1) == SL_ERR_VALUE, "TN: lda < M");
        CHECK(sl_sgemm(1, 0, 4, 3, 2, x, 4, x, 2, x, 3, 0, 1) == SL_ERR_VALUE, "TN: ldb < N");
        CHECK(sl_sgemm(0, 0, 4, 3, 5, x, 4, x, 3, x, 3, 0, 1) == SL_ERR_VALUE, "NN: lda < K");
        CHECK(sl_sgemm(1, 0, 4, 3, 2, x, 4, x, 3, x, 3, 0, 1) == SL_OK, "TN: tight leading dimensions");
        CHECK(sl_sgemm(0, 0, 4, 3, 5, x, 5, x, 3, x, 3, 0, 1) == SL_OK, "NN: tight leading dimensions");
        CHECK(sl_sgemm(1, 0, 2, 2, INT64_MAX / 2, x, 2, x, 2, x, 2, 0, 1) == SL_ERR_VALUE, "huge K");
        CHECK(strlen(sl_last_error()) > 0, "no message");
        CHECK(sl_sgemm_nt(0, 0, 0, NULL, 0, NULL, 0, NULL, 0, 0, 1) == SL_OK, "empty");
        CHECK(sl_sgemm_nt(0, 5, 3, NULL, 3, x, 3, NULL, 5, 0, 1) == SL_OK, "M = 0");

        /* parallel == 0 from inside a parallel region: re-entrant, same bits as a serial call */
        enum { M = 64, N = 96, K = 64, H = 8 };
        /* per h: NT from A (M,K), B (N,K); NN from the same A and Bt (K,N); TN from At (K,M), Bt */
        static float A[H][M * K], B[H][N * K], At[H][K * M], Bt[H][K * N];
        static float C[3][H][M * N], R[3][H][M * N];
        unsigned s = 99u;
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < M * K; i++) A[h][i] = frand(&s);
            for (int i = 0; i < N * K; i++) B[h][i] = frand(&s);
            for (int i = 0; i < M; i++)
                for (int k = 0; k < K; k++) At[h][k * M + i] = A[h][i * K + k];
            for (int j = 0; j < N; j++)
                for (int k = 0; k < K; k++) Bt[h][k * N + j] = B[h][j * K + k];
            sl_sgemm_nt(M, N, K, A[h], K, B[h], K, R[0][h], N, 0, 0);
            sl_sgemm(0, 0, M, N, K, A[h], K, Bt[h], N, R[1][h], N, 0, 0);
            sl_sgemm(1, 0, M, N, K, At[h], M, Bt[h], N, R[2][h], N, 0, 0);
        }
        /* the three layouts run the same chains: the same bits */
        CHECK(memcmp(R[0], R[1], sizeof R[0]) == 0 && memcmp(R[0], R[2], sizeof R[0]) == 0, "layouts differ");
        int bad = 0;
        #pragma omp parallel for num_threads(4) reduction(+ : bad)
        for (int h = 0; h < H; h++) {
            for (int rep = 0; rep < 20; rep++) {
                for (int par = 0; par < 2; par++) {
                    bad += sl_sgemm_nt(M, N, K, A[h], K, B[h], K, C[0][h], N, 0, par) != SL_OK;
                    bad += sl_sgemm(0, 0, M, N, K, A[h], K, Bt[h], N, C[1][h], N, 0, par) != SL_OK;
                    bad += sl_sgemm(1, 0, M, N, K, At[h], M, Bt[h], N, C[2][h], N, 0, par) != SL_OK;
                }
            }
        }
        CHECK(bad == 0, "errors inside parallel region");
        CHECK(memcmp(C, R, sizeof C) == 0, "results from inside a parallel region differ");
        printf("%s\n", fails ? "FAILED" : "OK");
        return fails != 0;
    }
""")


@pytest.mark.cdriver
@pytest.mark.parametrize("defines", [[], ["-DSL_SGEMM_PORTABLE_ONLY"]], ids=["dispatch", "portable-only"])
def test_c_api(tmp_path, defines):
    """The portable-only build is what aarch64 and other non-x86 machines compile."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "drv.c"
    src.write_text(DRIVER)
    exe = tmp_path / "drv"
    csrc = ROOT / "csrc"
    if not (csrc / "sgemm.c").exists():
        pytest.skip("C sources not available")
    files = [str(src)] + [str(csrc / f) for f in ("sgemm.c", "quant.c", "cpu.c", "common.c")]
    base = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", f"-I{csrc}", "-o", str(exe)] + defines
    build = subprocess.run(base + ["-fopenmp", "-DSL_HAVE_OPENMP=1"] + files + ["-lm"], capture_output=True, text=True)
    if build.returncode != 0:  # compiler without OpenMP: the pragmas are ignored
        build = subprocess.run(base + ["-DSL_HAVE_OPENMP=0", "-Wno-unknown-pragmas"] + files + ["-lm"],
                               capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stdout + run.stderr

"""Linear layers on weights kept in their file's format (csrc/sgemm.c: sl_linear_nt, sl_linear_nn,
sl_weight_rows, sl_weight_cols), which decode the quantized blocks while packing the weight panel.

The contract is bitwise: every product equals sl_dequantize followed by sl_sgemm on the float32
matrix, for every type, SIMD level, thread count, layout (NT forward, NN input gradient) and
accumulate flag. A C driver (built here from csrc/, as in tests/test_sgemm.py) checks that on
random blocks, since the functions have no Python binding of their own. Independently of the C
code, the same outputs are compared with gguf-py: the driver's dequantized matrix bit for bit with
gguf.quants.dequantize, and the products with a float64 product of gguf's matrix, within the
float32 summation bound (2K + 2) * 2^-24 * sum |a w|.
"""
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

pytestmark = pytest.mark.cdriver  # compiles csrc/ into a driver (or library) and runs it

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"

# byte offsets of the fp16 scale fields in one block
SCALE_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q4_K: [0, 2],
                T.Q5_K: [0, 2], T.Q6_K: [208]}
TYPES = [T.F32, T.F16, T.BF16] + list(SCALE_FIELDS)
MS = [1, 7, 128, 513]


def shapes(qtype):
    """(rows, cols): a small one and one of several K blocks, neither a multiple of the tiles
    (rows 37 and 300 against tiles of 16 and 32; a ragged last K block where the block allows)."""
    be, _ = GGML_QUANT_SIZES[qtype]
    if be == 1:
        return [(37, 77), (300, 739)]
    if be == 32:
        return [(37, 96), (300, 736)]  # 736 = 23 blocks: K blocks of 256, 256, 224
    return [(37, 512), (300, 1280)]


def random_weight(rng, qtype, rows, cols):
    """Raw bytes (rows, row_bytes) uint8: random quants with finite fp16 scales of the size of real
    weights' (so the products stay finite), or random finite floats for the plain types."""
    be, bb = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    if qtype == T.F16:
        return (rng.standard_normal((rows, cols)) * 0.1).astype(np.float16).view(np.uint8)
    if qtype == T.BF16:
        f = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    nb = rows * cols // be
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        h = rng.uniform(1e-3, 2e-3, nb) * rng.choice([-1, 1], nb)
        raw[:, off:off + 2] = h.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, cols // be * bb)


DRIVER = textwrap.dedent(r"""
    #include <math.h>
    #include <stdint.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include "cpu.h"
    #include "quant.h"
    #include "sgemm.h"
    #include "sl_common.h"

    static int fails = 0;
    #define CHECK(c, ...) do { if (!(c)) { if (fails++ < 20) { printf("FAIL line %d: ", __LINE__); \
        printf(__VA_ARGS__); printf("\n"); } } } while (0)

    static unsigned char *slurp(const char *path, long *n) {
        FILE *f = fopen(path, "rb");
        if (!f) return NULL;
        fseek(f, 0, SEEK_END); *n = ftell(f); fseek(f, 0, SEEK_SET);
        unsigned char *p = malloc((size_t)*n + 1);
        if (fread(p, 1, (size_t)*n, f) != (size_t)*n) { free(p); p = NULL; }
        fclose(f);
        return p;
    }

    /* M × K activations at row stride K + 3, the padding NaN: it must never be read. */
    static float *padded(const float *a, int64_t M, int64_t K) {
        float *p = malloc(sizeof(float) * (size_t)(M * (K + 3) + 1));
        for (int64_t i = 0; i < M; i++) {
            memcpy(p + i * (K + 3), a + i * K, sizeof(float) * (size_t)K);
            for (int j = 0; j < 3; j++) p[i * (K + 3) + K + j] = NAN;
        }
        return p;
    }

    /* C (M, N) at row stride N + 2: accumulate ? start values : garbage; padding -7 (never written). */
    static void fill_c(float *c, int64_t M, int64_t N, int acc) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N + 2; j++)
                c[i * (N + 2) + j] = j >= N ? -7.0f : acc ? (float)((i * 31 + j * 17) % 23) * 0.25f - 2.0f : 1e30f;
    }

    /* One layout (nt: C = A·Wᵀ, else C = A·W) at the level in use: every thread count, serial and
     * parallel, accumulate or not, against sl_sgemm on the dequantized F. */
    static void check_layout(const sl_weight *W, const float *F, int nt, const float *A0, int64_t M, float *out) {
        const int64_t K = nt ? W->cols : W->rows, N = nt ? W->rows : W->cols, lda = K + 3, ldc = N + 2;
        float *A = padded(A0, M, K);
        size_t cbytes = sizeof(float) * (size_t)(M * ldc);
        float *ref = malloc(cbytes), *c = malloc(cbytes);
        for (int acc = 0; acc < 2; acc++) {
            sl_set_num_threads(1);
            fill_c(ref, M, N, acc);
            CHECK(sl_sgemm(0, nt, M, N, K, A, lda, F, W->cols, ref, ldc, acc, 0) == SL_OK, "sgemm");
            static const int thr[] = {1, 1, 2, 4};
            for (int t = 0; t < 4; t++) {
                int par = t > 0;
                sl_set_num_threads(thr[t]);
                fill_c(c, M, N, acc);
                int rc = nt ? sl_linear_nt(M, A, lda, W, c, ldc, acc, par) : sl_linear_nn(M, A, lda, W, c, ldc, acc, par);
                CHECK(rc == SL_OK, "rc %d: %s", rc, sl_last_error());
                CHECK(memcmp(c, ref, cbytes) == 0, "%s type %d %lldx%lld M=%lld level %s threads %d par %d acc %d: "
                      "differs from dequantize + sgemm", nt ? "NT" : "NN", W->type, (long long)W->rows,
                      (long long)W->cols, (long long)M, sl_simd_name(sl_simd()), thr[t], par, acc);
            }
            if (out && !acc)
                for (int64_t i = 0; i < M; i++) memcpy(out + i * N, c + i * ldc, sizeof(float) * (size_t)N);
        }
        sl_set_num_threads(1);
        free(A); free(ref); free(c);
    }

    /* argv: type rows cols offset in.bin out.bin. in.bin: raw weight, then A for NT (513 × cols)
     * and A for NN (513 × rows). out.bin: sl_dequantize's F, C_nt and C_nn for M = 513. */
    static int products(char **argv) {
        const int type = atoi(argv[1]), off = atoi(argv[4]);
        const int64_t rows = atoll(argv[2]), cols = atoll(argv[3]), MMAX = 513;
        const int64_t be = sl_quant_block_elems(type), bb = sl_quant_block_bytes(type);
        const int64_t nbytes = rows * (cols / be * bb);
        long n;
        unsigned char *in = slurp(argv[5], &n);
        if (!in || n != (long)(nbytes + 4 * MMAX * (cols + rows))) { printf("bad input\n"); return 2; }
        /* the weight at an odd address when off: as a tensor in a memory-mapped file may be */
        unsigned char *buf = malloc((size_t)nbytes + 64), *raw = buf + off;
        memcpy(raw, in, (size_t)nbytes);
        float *Ant = malloc(sizeof(float) * (size_t)(MMAX * cols)), *Ann = malloc(sizeof(float) * (size_t)(MMAX * rows));
        memcpy(Ant, in + nbytes, sizeof(float) * (size_t)(MMAX * cols));
        memcpy(Ann, in + nbytes + 4 * MMAX * cols, sizeof(float) * (size_t)(MMAX * rows));
        sl_weight W;
        CHECK(sl_weight_init(&W, type, raw, nbytes, rows, cols) == SL_OK, "init: %s", sl_last_error());
        size_t fbytes = sizeof(float) * (size_t)(rows * cols);
        float *F = malloc(fbytes), *G = malloc(fbytes);
        sl_set_simd(SL_SIMD_GENERIC);
        CHECK(sl_dequantize(type, raw, nbytes, F, rows * cols, 0) == SL_OK, "dequantize");
        float *Cnt = malloc(sizeof(float) * (size_t)(MMAX * rows)), *Cnn = malloc(sizeof(float) * (size_t)(MMAX * cols));
        static const int64_t Ms[] = {1, 7, 128, 513};
        for (int lvl = 0; lvl < 3; lvl++) {
            if (sl_set_simd((sl_simd_level)lvl) != (sl_simd_level)lvl) continue;
            /* every level decodes to the same floats */
            CHECK(sl_dequantize(type, raw, nbytes, G, rows * cols, 1) == SL_OK, "dequantize");
            CHECK(memcmp(F, G, fbytes) == 0, "dequantize at level %d differs from generic", lvl);
            for (int m = 0; m < 4; m++) {
                check_layout(&W, F, 1, Ant, Ms[m], Ms[m] == MMAX ? Cnt : NULL);
                check_layout(&W, F, 0, Ann, Ms[m], Ms[m] == MMAX ? Cnn : NULL);
            }
            /* embedding rows and a column slice decode only what they need, to the same floats */
            int64_t ids[4] = {rows - 1, 0, rows / 2, rows - 1};
            CHECK(sl_weight_rows(&W, ids, 4, G) == SL_OK, "rows");
            for (int i = 0; i < 4; i++)
                CHECK(memcmp(G + i * cols, F + ids[i] * cols, sizeof(float) * (size_t)cols) == 0, "row %d", i);
            int64_t slices[4][2] = {{0, cols}, {cols / 3, cols / 2}, {cols - 1, 1}, {be == 1 ? 5 : be + 3, 64 < cols - be - 3 ? 64 : 1}};
            for (int s = 0; s < 4; s++) {
                int64_t c0 = slices[s][0], w = slices[s][1];
                CHECK(sl_weight_cols(&W, c0, w, G) == SL_OK, "cols");
                int same = 1;
                for (int64_t r = 0; r < rows; r++)
                    same &= memcmp(G + r * w, F + r * cols + c0, sizeof(float) * (size_t)w) == 0;
                CHECK(same, "cols [%lld, +%lld) differ", (long long)c0, (long long)w);
            }
        }
        FILE *f = fopen(argv[6], "wb");
        fwrite(F, 1, fbytes, f);
        fwrite(Cnt, sizeof(float), (size_t)(MMAX * rows), f);
        fwrite(Cnn, sizeof(float), (size_t)(MMAX * cols), f);
        fclose(f);
        free(in); free(buf); free(Ant); free(Ann); free(F); free(G); free(Cnt); free(Cnn);
        printf("%s\n", fails ? "FAILED" : "OK");
        return fails != 0;
    }

    static int errors(void) {
        sl_weight W;
        unsigned char raw[4 * 144] = {0};
        float x[4096];
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, raw, 4 * 144, 2, 512) == SL_OK, "valid");
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, raw, 4 * 144, 4, 256) == SL_OK, "valid");
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, raw, 4 * 144, 1, 1024) == SL_OK, "valid");
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, raw, 4 * 144 - 1, 2, 512) == SL_ERR_VALUE, "short");
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, raw, 4 * 144, 8, 128) == SL_ERR_VALUE, "partial block");
        CHECK(sl_weight_init(&W, 9, raw, 4 * 144, 2, 512) == SL_ERR_VALUE, "Q8_1 unsupported");
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, NULL, 4 * 144, 2, 512) == SL_ERR_VALUE, "NULL data");
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, raw, 4 * 144, 0, 512) == SL_ERR_VALUE, "no rows");
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, raw, 4 * 144, INT64_MAX / 2, 512) == SL_ERR_VALUE, "overflow");
        CHECK(sl_weight_init(&W, SL_GGML_Q4_K, raw, 4 * 144, 2, 512) == SL_OK, "valid");
        int64_t ids[2] = {1, 2};
        CHECK(sl_weight_rows(&W, ids, 2, x) == SL_ERR_VALUE, "row 2 of 2");
        ids[1] = -1;
        CHECK(sl_weight_rows(&W, ids, 2, x) == SL_ERR_VALUE, "row -1");
        ids[1] = 0;
        CHECK(sl_weight_rows(&W, ids, 2, x) == SL_OK, "rows");
        CHECK(sl_weight_cols(&W, 500, 13, x) == SL_ERR_VALUE, "cols past the end");
        CHECK(sl_weight_cols(&W, -1, 3, x) == SL_ERR_VALUE, "negative column");
        CHECK(sl_weight_cols(&W, 500, 12, x) == SL_OK, "last columns");
        CHECK(sl_linear_nt(2, x, 100, &W, x, 2, 0, 1) == SL_ERR_VALUE, "lda < cols");
        CHECK(sl_linear_nn(2, x, 1, &W, x, 512, 0, 1) == SL_ERR_VALUE, "lda < rows");
        CHECK(sl_linear_nt(2, x, 512, &W, x, 1, 0, 1) == SL_ERR_VALUE, "ldc < rows");
        CHECK(sl_linear_nt(2, x, 512, NULL, x, 2, 0, 1) == SL_ERR_VALUE, "NULL weight");
        CHECK(sl_linear_nt(2, NULL, 512, &W, x, 2, 0, 1) == SL_ERR_VALUE, "NULL A");
        CHECK(sl_linear_nt(0, x, 512, &W, x, 2, 0, 1) == SL_OK, "M = 0");
        sl_weight bad = W;
        bad.row_bytes += 1;
        CHECK(sl_linear_nt(2, x, 512, &bad, x, 2, 0, 1) == SL_ERR_VALUE, "inconsistent row_bytes");
        CHECK(strlen(sl_last_error()) > 0, "no message");
        printf("%s\n", fails ? "FAILED" : "OK");
        return fails != 0;
    }

    int main(int argc, char **argv) {
        if (argc == 2 && !strcmp(argv[1], "errors")) return errors();
        if (argc == 7) return products(argv);
        printf("usage\n");
        return 2;
    }
""")


def _build(tmp_path_factory, defines):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    if not (CSRC / "sgemm.c").exists():
        pytest.skip("C sources not available")
    d = tmp_path_factory.mktemp("linq")
    src = d / "drv.c"
    src.write_text(DRIVER)
    exe = d / "drv"
    files = [str(src)] + [str(CSRC / f) for f in ("sgemm.c", "quant.c", "cpu.c", "common.c")]
    base = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", f"-I{CSRC}", "-o", str(exe)] + defines
    build = subprocess.run(base + ["-fopenmp", "-DSL_HAVE_OPENMP=1"] + files + ["-lm"], capture_output=True,
                           text=True)
    if build.returncode != 0:  # compiler without OpenMP: the pragmas are ignored
        build = subprocess.run(base + ["-DSL_HAVE_OPENMP=0", "-Wno-unknown-pragmas"] + files + ["-lm"],
                               capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return exe


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return _build(tmp_path_factory, [])


@pytest.fixture(scope="module")
def driver_portable(tmp_path_factory):
    """What aarch64 and other non-x86 machines compile: scalar decoders, generic kernels."""
    return _build(tmp_path_factory, ["-DSL_SGEMM_PORTABLE_ONLY"])


def gguf_matrix(qtype, raw, rows, cols):
    f = gguf.quants.dequantize(raw, qtype)
    return np.asarray(f, dtype=np.float32).reshape(rows, cols)


def assert_close_f64(got, a, w):
    """got (float32) against a @ w in float64, within the bound of a float32 chain of K products."""
    ref = a.astype(np.float64) @ w.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(w).astype(np.float64)
    tol = (2.0 * a.shape[1] + 2) * 2.0 ** -24 * scale + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    assert np.isfinite(got).all()
    assert (err <= tol).all(), f"max error {err.max()} (tolerance there {tol.flat[np.argmax(err)]})"


def run_case(exe, tmp_path, qtype, rows, cols, seed, offset):
    rng = np.random.default_rng(seed)
    raw = random_weight(rng, qtype, rows, cols)
    a_nt = rng.standard_normal((513, cols)).astype(np.float32)
    a_nn = rng.standard_normal((513, rows)).astype(np.float32)
    inp, out = tmp_path / "in.bin", tmp_path / "out.bin"
    inp.write_bytes(raw.tobytes() + a_nt.tobytes() + a_nn.tobytes())
    run = subprocess.run([str(exe), str(int(qtype)), str(rows), str(cols), str(offset), str(inp), str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stdout + run.stderr
    res = np.fromfile(out, dtype=np.float32)
    F = res[:rows * cols].reshape(rows, cols)
    c_nt = res[rows * cols:rows * cols + 513 * rows].reshape(513, rows)
    c_nn = res[rows * cols + 513 * rows:].reshape(513, cols)
    ref = gguf_matrix(qtype, raw, rows, cols)
    assert np.array_equal(F.view(np.uint32), ref.view(np.uint32)), "sl_dequantize differs from gguf"
    assert_close_f64(c_nt, a_nt, ref.T)
    assert_close_f64(c_nn, a_nn, ref)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape_i", [0, 1], ids=["small", "large"])
def test_linear_bitwise_dequantize_then_sgemm(driver, tmp_path, qtype, shape_i):
    """NT and NN, M in 1/7/128/513, every level, 1/2/4 threads, serial and parallel, accumulate 0/1:
    bitwise sl_dequantize + sl_sgemm; and gguf's decoding times A in float64 within rounding. The
    small shape puts the weight at an odd address."""
    rows, cols = shapes(qtype)[shape_i]
    run_case(driver, tmp_path, qtype, rows, cols, seed=100 * int(qtype) + shape_i, offset=1 - shape_i)


@pytest.mark.parametrize("qtype", [T.F16, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_linear_portable_build(driver_portable, tmp_path, qtype):
    rows, cols = shapes(qtype)[0]
    run_case(driver_portable, tmp_path, qtype, rows, cols, seed=7 + int(qtype), offset=0)


def test_weight_argument_errors(driver):
    run = subprocess.run([str(driver), "errors"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stdout + run.stderr

/* bf16 linear layers (gemm_bf16.h): fp32 -> bf16 rounding, weight packing into bf16 panels, and
 * the product C = bf16(A) · Wᵀ (+ C) with fp32 accumulation in vdpbf16ps's order.
 *
 * Blocking: W is packed once, for all of K (a panel is 32 outputs × K, K*64 bytes), so a call
 * only rounds A to bf16 (M × kp) and walks tasks of 112-448 rows (mb) × NBP panels; within a
 * task, panel by panel, each register tile (14 rows × 32 columns, 28 zmm accumulators + 2 B
 * vectors + 1 broadcast) runs its whole K chain. Since every C element is one chain over all of K
 * in order, nothing about the tiling, the task grid or the thread count reaches the result.
 *
 * Paths: AVX512-BF16 (vdpbf16ps, compiled with a target attribute, picked at run time) and a
 * portable C emulation of the same instruction, step by step: it rounds each step as the fused
 * step does and applies the instruction's DAZ/FTZ, so both give the same bits (NaN payloads
 * aside). AMX-BF16 tiles are not implemented (no machine with AMX was available to test one). */
#include "gemm_bf16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"
#include "quant.h"
#include "sl_common.h"

#if defined(_OPENMP) && (!defined(SL_HAVE_OPENMP) || SL_HAVE_OPENMP)
#include <omp.h>
#define SL_BF16_OMP 1
#else
#define SL_BF16_OMP 0
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(SL_SGEMM_PORTABLE_ONLY)
#include <immintrin.h>
#define SL_BF16_X86 1
#define SL_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,avx2")))
#else
#define SL_BF16_X86 0
#endif

enum {
    MRB = 14,            /* rows of the register tile: 2 accumulators each, 28 of 32 zmm */
    MB_MIN = 112,        /* rows of a task, at least */
    MB_MAX = 448,        /* and at most */
    A_BLOCK = 384 << 10, /* bytes of a task's bf16 A block, which stays in L2 while its panels pass */
    NBP = 4,             /* panels of a task (128 outputs) */
};

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static inline uint32_t f2u(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float u2f(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ------------------------------------------------------------------------------------------
 * Rounding: vcvtneps2bf16's pseudocode (Intel SDM, convert_fp32_to_bfloat16). */

sl_bf16 sl_bf16_from_f32(float x) {
    uint32_t u = f2u(x);
    const uint32_t e = u & 0x7F800000u;
    if (e == 0) return (sl_bf16)((u >> 16) & 0x8000u); /* zero or denormal: a zero of its sign */
    if (e == 0x7F800000u) {
        if (u & 0x007FFFFFu) return (sl_bf16)((u >> 16) | 0x0040u); /* NaN: truncated, made quiet */
        return (sl_bf16)(u >> 16);                                 /* ±inf */
    }
    u += 0x7FFFu + ((u >> 16) & 1u); /* nearest, ties to even; a carry past the top exponent is ±inf */
    return (sl_bf16)(u >> 16);
}

float sl_bf16_to_f32(sl_bf16 h) { return u2f((uint32_t)h << 16); }

static void round_portable(const float *src, sl_bf16 *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = sl_bf16_from_f32(src[i]);
}

#if SL_BF16_X86
SL_AVX512BF16 static void round_avx512(const float *src, sl_bf16 *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), (__m256i)r);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m256bh r = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)r);
    }
}
#endif

/* n values of src rounded into dst: AVX512-BF16 when the path has it (the same bits). */
static void round_short(const float *src, sl_bf16 *dst, int64_t n, int path) {
#if SL_BF16_X86
    if (path == SL_BF16_AVX512) {
        round_avx512(src, dst, n);
        return;
    }
#endif
    (void)path;
    round_portable(src, dst, n);
}

int sl_bf16_path(int requested) {
#if SL_BF16_X86
    const int have = sl_cpu_has_avx512_bf16();
    if (requested == SL_BF16_AUTO) return have && sl_simd() >= SL_SIMD_AVX512 ? SL_BF16_AVX512 : SL_BF16_PORTABLE;
    if (requested == SL_BF16_AVX512) return have ? SL_BF16_AVX512 : -1;
#else
    if (requested == SL_BF16_AUTO) return SL_BF16_PORTABLE;
#endif
    return requested == SL_BF16_PORTABLE ? SL_BF16_PORTABLE : -1;
}

const char *sl_bf16_path_name(int path) {
    return path == SL_BF16_AVX512 ? "avx512_bf16" : path == SL_BF16_PORTABLE ? "portable" : "none";
}

static int resolve_path(int requested, int *path) {
    *path = sl_bf16_path(requested);
    if (*path < 0)
        return sl_fail(SL_ERR_VALUE, "bf16: path %d is not available on this CPU (it has no AVX512-BF16)",
                       requested);
    return SL_OK;
}

int sl_bf16_round(const float *src, sl_bf16 *dst, int64_t n, int path) {
    if (n < 0) return sl_fail(SL_ERR_VALUE, "bf16: negative length %lld", (long long)n);
    if (n > 0 && (!src || !dst)) return sl_fail(SL_ERR_VALUE, "bf16: NULL buffer");
    SL_TRY(resolve_path(path, &path));
#if SL_BF16_X86
    if (path == SL_BF16_AVX512) {
        round_avx512(src, dst, n);
        return SL_OK;
    }
#endif
    round_portable(src, dst, n);
    return SL_OK;
}

/* ------------------------------------------------------------------------------------------
 * The portable emulation of one vdpbf16ps lane step: acc + x·y, x and y bf16 values. */

/* A bf16 operand as the instruction reads it: denormals as a zero of their sign (DAZ). */
static inline float bf16_daz(sl_bf16 h) {
    return u2f((h & 0x7F80u) ? (uint32_t)h << 16 : (uint32_t)(h & 0x8000u) << 16);
}

/* An fp32 accumulator read with DAZ. */
static inline float f32_daz(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

/* One fused step, rounded to nearest even with FTZ. x·y is exact in double (8-bit significands)
 * and acc + x·y is either exact in double or has its smaller term below 2^-37 of the larger, far
 * from half a float ulp: rounding the double sum to float is then the single rounding of the
 * fused step. Near underflow the sum is rounded to 24 bits with an unbounded exponent (scaled by
 * 2^64, exact) and flushed when that lands below 2^-126: the instruction detects tininess after
 * rounding, as measured on Zen 5 (2^-126 - 0.75·2^-150 gives 0, not 2^-126). */
static inline float dp_step(float acc, float x, float y) {
    const double s = (double)acc + (double)x * (double)y;
    if (!(fabs(s) < 0x1p-125)) return (float)s; /* also ±inf and NaN */
    const float r = (float)(s * 0x1p64);
    return fabsf(r) < 0x1p-62f ? copysignf(0.0f, r) : r * 0x1p-64f;
}

/* One register tile, portable: c[i][j] (i < mr, j < nr) continues its chain over nq pairs of a
 * (rows a + i*lda) and the panel b. */
static void tile_portable(int64_t nq, const sl_bf16 *a, int64_t lda, const sl_bf16 *b, float *c, int64_t ldc,
                          int mr, int nr, int load) {
    for (int i = 0; i < mr; i++) {
        float acc[SL_BF16_NR];
        for (int j = 0; j < SL_BF16_NR; j++) acc[j] = load && j < nr ? f32_daz(c[i * ldc + j]) : 0.0f;
        const sl_bf16 *ai = a + i * lda;
        for (int64_t q = 0; q < nq; q++) {
            const float a0 = bf16_daz(ai[2 * q]), a1 = bf16_daz(ai[2 * q + 1]);
            const sl_bf16 *bq = b + q * 2 * SL_BF16_NR;
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < 16; j++) {
                    float *x = &acc[16 * h + j];
                    *x = dp_step(*x, a1, bf16_daz(bq[32 * h + 2 * j + 1])); /* the odd element first */
                    *x = dp_step(*x, a0, bf16_daz(bq[32 * h + 2 * j]));
                }
        }
        memcpy(c + i * ldc, acc, (size_t)nr * sizeof(float));
    }
}

#if SL_BF16_X86
/* 14×32 in zmm registers, inlined with a constant mr; columns past nr masked off. */
SL_AVX512BF16 static inline __attribute__((always_inline)) void tile_avx512_rows(
    const int mr, int64_t nq, const sl_bf16 *restrict a, int64_t lda, const sl_bf16 *restrict b,
    float *restrict c, int64_t ldc, __mmask16 m0, __mmask16 m1, int load) {
    __m512 c0_0 = _mm512_setzero_ps(), c0_1 = c0_0, c1_0 = c0_0, c1_1 = c0_0, c2_0 = c0_0, c2_1 = c0_0;
    __m512 c3_0 = c0_0, c3_1 = c0_0, c4_0 = c0_0, c4_1 = c0_0, c5_0 = c0_0, c5_1 = c0_0;
    __m512 c6_0 = c0_0, c6_1 = c0_0, c7_0 = c0_0, c7_1 = c0_0, c8_0 = c0_0, c8_1 = c0_0;
    __m512 c9_0 = c0_0, c9_1 = c0_0, c10_0 = c0_0, c10_1 = c0_0, c11_0 = c0_0, c11_1 = c0_0;
    __m512 c12_0 = c0_0, c12_1 = c0_0, c13_0 = c0_0, c13_1 = c0_0;
#define SL_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define SL_LOAD_ROW(i)                                            \
    if (mr > i) {                                                 \
        c##i##_0 = _mm512_maskz_loadu_ps(m0, c + (i) * ldc);      \
        c##i##_1 = _mm512_maskz_loadu_ps(m1, c + (i) * ldc + 16); \
    }
    if (load) {
        SL_ROWS(SL_LOAD_ROW)
    }
#undef SL_LOAD_ROW
    /* a pair (a[i][2q], a[i][2q+1]) broadcast as one dword to all 16 lanes */
#define SL_DP_ROW(i)                                                  \
    if (mr > i) {                                                     \
        int32_t w;                                                    \
        memcpy(&w, a + (i) * lda, sizeof w);                          \
        const __m512bh ai = (__m512bh)_mm512_set1_epi32(w);           \
        c##i##_0 = _mm512_dpbf16_ps(c##i##_0, b0, ai);                \
        c##i##_1 = _mm512_dpbf16_ps(c##i##_1, b1, ai);                \
    }
#pragma GCC unroll 2
    for (int64_t q = 0; q < nq; q++) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)b);
        const __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(b + 32));
        SL_ROWS(SL_DP_ROW)
        a += 2;
        b += 2 * SL_BF16_NR;
    }
#undef SL_DP_ROW
#define SL_STORE_ROW(i)                                           \
    if (mr > i) {                                                 \
        _mm512_mask_storeu_ps(c + (i) * ldc, m0, c##i##_0);       \
        _mm512_mask_storeu_ps(c + (i) * ldc + 16, m1, c##i##_1);  \
    }
    SL_ROWS(SL_STORE_ROW)
#undef SL_STORE_ROW
#undef SL_ROWS
}

SL_AVX512BF16 static void tile_avx512(int64_t nq, const sl_bf16 *a, int64_t lda, const sl_bf16 *b, float *c,
                                      int64_t ldc, int mr, int nr, int load) {
    const __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1u);
    const __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xFFFFu : nr <= 16 ? 0u : (1u << (nr - 16)) - 1u);
    switch (mr) {
#define SL_CASE(n) \
    case n: tile_avx512_rows(n, nq, a, lda, b, c, ldc, m0, m1, load); break;
        SL_CASE(14) SL_CASE(13) SL_CASE(12) SL_CASE(11) SL_CASE(10) SL_CASE(9) SL_CASE(8)
        SL_CASE(7) SL_CASE(6) SL_CASE(5) SL_CASE(4) SL_CASE(3) SL_CASE(2)
#undef SL_CASE
    default: tile_avx512_rows(1, nq, a, lda, b, c, ldc, m0, m1, load); break;
    }
}
#endif

/* ------------------------------------------------------------------------------------------
 * Packing. */

void sl_bf16_panels_free(sl_bf16_panels *p) {
    if (!p) return;
    free(p->data);
    free(p);
}

/* Row r of W as bf16 into t16 (kp values, the last one zero when k is odd); f: k floats of scratch. */
static void weight_row_bf16(const sl_weight *W, sl_dequant_fn dec, int64_t nblocks, int64_t r, float *f,
                            sl_bf16 *t16, int64_t kp, int path) {
    const uint8_t *src = (const uint8_t *)W->data + r * W->row_bytes;
    if (W->type == SL_GGML_BF16) {
        memcpy(t16, src, (size_t)W->cols * sizeof(sl_bf16)); /* little-endian bf16, as the file holds it */
    } else {
        dec(src, f, nblocks);
        round_short(f, t16, W->cols, path);
    }
    if (kp > W->cols) t16[W->cols] = 0;
}

/* Threads that pack panels: the caller's team size when asked to run in parallel from outside a
 * region, at most one per panel. */
static int pack_threads(int parallel, int64_t np) {
    int nthr = 1;
#if SL_BF16_OMP
    if (parallel && !omp_in_parallel()) nthr = (int)min64(sl_num_threads(), np);
#else
    (void)parallel;
    (void)np;
#endif
    return nthr;
}

/* sl_bf16_pack (reuse NULL: new panels into *out) and sl_bf16_repack (into reuse, whose shape
 * must be W's). */
static int pack_impl(const sl_weight *W, int parallel, sl_bf16_panels *reuse, sl_bf16_panels **out) {
    if (!out) return sl_fail(SL_ERR_VALUE, "bf16: NULL output");
    *out = NULL;
    if (!W || !W->data) return sl_fail(SL_ERR_VALUE, "bf16: NULL weight");
    const int64_t be = sl_quant_block_elems(W->type), bb = sl_quant_block_bytes(W->type);
    const sl_dequant_fn dec = sl_dequant_kernel(W->type);
    if (be <= 0 || !dec) return sl_fail(SL_ERR_VALUE, "bf16: unsupported weight type %d", W->type);
    if (W->rows <= 0 || W->cols <= 0 || W->cols % be || W->row_bytes != W->cols / be * bb ||
        W->rows > (INT64_MAX >> 8) || W->cols > (INT64_MAX >> 8))
        return sl_fail(SL_ERR_VALUE, "bf16: inconsistent %lld x %lld weight of type %d", (long long)W->rows,
                       (long long)W->cols, W->type);
    const int64_t n = W->rows, k = W->cols, kp = k + (k & 1), np = ceil_div(n, SL_BF16_NR);
    int64_t elems, bytes;
    if (!sl_mul_size(np * SL_BF16_NR, kp, &elems) || !sl_mul_size(elems, 2, &bytes) || bytes > INT64_MAX - 64)
        return sl_fail(SL_ERR_MEMORY, "bf16: panels of a %lld x %lld weight overflow", (long long)n, (long long)k);
    if (reuse && (reuse->n != n || reuse->k != k || reuse->bytes != bytes || !reuse->data))
        return sl_fail(SL_ERR_VALUE, "bf16: repacking a %lld x %lld weight into %lld x %lld panels", (long long)n,
                       (long long)k, (long long)reuse->n, (long long)reuse->k);
    sl_bf16_panels *p = reuse ? reuse : calloc(1, sizeof *p);
    if (!p) return sl_fail(SL_ERR_MEMORY, "bf16: cannot allocate panels");
    if (!reuse) {
        p->n = n, p->k = k, p->kp = kp, p->bytes = bytes;
        p->data = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
    }
    int nthr = pack_threads(parallel, np);
    /* scratch per thread: k decoded floats and kp bf16 values */
    const int64_t per = (k * 4 + kp * 2 + 63) / 64 * 64;
    char *scratch = p->data ? aligned_alloc(64, (size_t)(per * nthr)) : NULL;
    if (!p->data || !scratch) {
        free(scratch);
        if (!reuse) sl_bf16_panels_free(p);
        return sl_fail(SL_ERR_MEMORY, "bf16: cannot allocate %lld bytes of panels", (long long)bytes);
    }
    const int64_t nblocks = k / be;
    const int path = sl_bf16_path(SL_BF16_AUTO);
#pragma omp parallel for num_threads(nthr) schedule(dynamic, 1) if (nthr > 1)
    for (int64_t pi = 0; pi < np; pi++) {
        int t = 0;
#if SL_BF16_OMP
        t = omp_get_thread_num();
#endif
        float *f = (float *)(void *)(scratch + t * per);
        sl_bf16 *t16 = (sl_bf16 *)(void *)(scratch + t * per + k * 4);
        sl_bf16 *dst = p->data + pi * kp * SL_BF16_NR;
        memset(dst, 0, (size_t)(kp * SL_BF16_NR) * sizeof(sl_bf16));
        for (int64_t r = 0; r < SL_BF16_NR && pi * SL_BF16_NR + r < n; r++) {
            weight_row_bf16(W, dec, nblocks, pi * SL_BF16_NR + r, f, t16, kp, path);
            const int64_t h = r / 16, j = r % 16;
            sl_bf16 *d = dst + h * 32 + 2 * j;
            for (int64_t q = 0; q < kp / 2; q++) {
                d[q * 2 * SL_BF16_NR] = t16[2 * q];
                d[q * 2 * SL_BF16_NR + 1] = t16[2 * q + 1];
            }
        }
    }
    free(scratch);
    *out = p;
    return SL_OK;
}

int sl_bf16_pack(const sl_weight *W, int parallel, sl_bf16_panels **out) { return pack_impl(W, parallel, NULL, out); }

int sl_bf16_repack(const sl_weight *W, int parallel, sl_bf16_panels *p) {
    sl_bf16_panels *out;
    if (!p) return sl_fail(SL_ERR_VALUE, "bf16: NULL panels to repack");
    return pack_impl(W, parallel, p, &out);
}

/* Panel pi of Bᵀ (see sl_bf16_pack_t) into data, zero past n and past k: each pair of B's rows
 * (k pair q) rounded, then interleaved into the panel's 64 values of that pair. */
static void pack_t_panel(const float *B, int64_t k, int64_t n, int64_t ldb, int64_t kp, int64_t pi, sl_bf16 *data,
                         int path) {
    sl_bf16 *dst = data + pi * kp * SL_BF16_NR;
    const int64_t j0 = pi * SL_BF16_NR, nj = min64(SL_BF16_NR, n - j0);
    sl_bf16 r[2][SL_BF16_NR];
    for (int64_t q = 0; q < kp / 2; q++) {
        for (int e = 0; e < 2; e++) {
            memset(r[e], 0, sizeof r[e]);
            if (2 * q + e < k) round_short(B + (2 * q + e) * ldb + j0, r[e], nj, path);
        }
        sl_bf16 *d = dst + q * 2 * SL_BF16_NR;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 16; j++) {
                d[32 * h + 2 * j] = r[0][16 * h + j];
                d[32 * h + 2 * j + 1] = r[1][16 * h + j];
            }
    }
}

static int pack_t_impl(const float *B, int64_t k, int64_t n, int64_t ldb, int parallel, sl_bf16_panels *reuse,
                       sl_bf16_panels **out) {
    if (!out) return sl_fail(SL_ERR_VALUE, "bf16: NULL output");
    *out = NULL;
    if (!B) return sl_fail(SL_ERR_VALUE, "bf16: NULL matrix");
    if (k <= 0 || n <= 0 || ldb < n || k > (INT64_MAX >> 8) || n > (INT64_MAX >> 8))
        return sl_fail(SL_ERR_VALUE, "bf16: bad transposed matrix %lld x %lld (row stride %lld)", (long long)k,
                       (long long)n, (long long)ldb);
    int64_t span;
    if (!sl_mul_size(k - 1, ldb, &span)) return sl_fail(SL_ERR_VALUE, "bf16: matrix too large");
    const int64_t kp = k + (k & 1), np = ceil_div(n, SL_BF16_NR);
    int64_t elems, bytes;
    if (!sl_mul_size(np * SL_BF16_NR, kp, &elems) || !sl_mul_size(elems, 2, &bytes) || bytes > INT64_MAX - 64)
        return sl_fail(SL_ERR_MEMORY, "bf16: panels of a %lld x %lld matrix overflow", (long long)k, (long long)n);
    if (reuse && (reuse->n != n || reuse->k != k || reuse->bytes != bytes || !reuse->data))
        return sl_fail(SL_ERR_VALUE, "bf16: repacking a transposed %lld x %lld matrix into %lld x %lld panels",
                       (long long)k, (long long)n, (long long)reuse->k, (long long)reuse->n);
    sl_bf16_panels *p = reuse ? reuse : calloc(1, sizeof *p);
    if (!p) return sl_fail(SL_ERR_MEMORY, "bf16: cannot allocate panels");
    if (!reuse) {
        p->n = n, p->k = k, p->kp = kp, p->bytes = bytes;
        p->data = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
    }
    if (!p->data) {
        if (!reuse) sl_bf16_panels_free(p);
        return sl_fail(SL_ERR_MEMORY, "bf16: cannot allocate %lld bytes of panels", (long long)bytes);
    }
    int nthr = pack_threads(parallel, np);
    if ((double)k * (double)n < 1e5) nthr = 1;
    const int path = sl_bf16_path(SL_BF16_AUTO);
#pragma omp parallel for num_threads(nthr) schedule(static) if (nthr > 1)
    for (int64_t pi = 0; pi < np; pi++) pack_t_panel(B, k, n, ldb, kp, pi, p->data, path);
    (void)nthr; /* unused when OpenMP is off */
    *out = p;
    return SL_OK;
}

int sl_bf16_pack_t(const float *B, int64_t k, int64_t n, int64_t ldb, int parallel, sl_bf16_panels **out) {
    return pack_t_impl(B, k, n, ldb, parallel, NULL, out);
}

int sl_bf16_repack_t(const float *B, int64_t k, int64_t n, int64_t ldb, int parallel, sl_bf16_panels *p) {
    sl_bf16_panels *out;
    if (!p) return sl_fail(SL_ERR_VALUE, "bf16: NULL panels to repack");
    return pack_t_impl(B, k, n, ldb, parallel, p, &out);
}

/* ------------------------------------------------------------------------------------------
 * The product. */

typedef struct {
    int64_t M, N, kp, lda, ldc, tn, np, mb;
    const sl_bf16 *A; /* (M, kp) bf16, row stride lda */
    const sl_bf16_panels *W;
    float *C;
    int load, path;
} bf16_job;

/* Task t of the grid (row-major over M blocks × panel groups). */
static void run_task(const bf16_job *g, int64_t t) {
    const int64_t m0 = t / g->tn * g->mb, m1 = min64(m0 + g->mb, g->M);
    const int64_t p0 = t % g->tn * NBP, p1 = min64(p0 + NBP, g->np);
    const int64_t nq = g->kp / 2;
    for (int64_t p = p0; p < p1; p++) {
        const sl_bf16 *b = g->W->data + p * g->kp * SL_BF16_NR;
        const int64_t n0 = p * SL_BF16_NR;
        const int nr = (int)min64(SL_BF16_NR, g->N - n0);
        for (int64_t i0 = m0; i0 < m1; i0 += MRB) {
            const int mr = (int)min64(MRB, m1 - i0);
            const sl_bf16 *a = g->A + i0 * g->lda;
            float *c = g->C + i0 * g->ldc + n0;
#if SL_BF16_X86
            if (g->path == SL_BF16_AVX512) {
                tile_avx512(nq, a, g->lda, b, c, g->ldc, mr, nr, g->load);
                continue;
            }
#endif
            tile_portable(nq, a, g->lda, b, c, g->ldc, mr, nr, g->load);
        }
    }
}

/* Row i of A rounded into the bf16 block (row stride ldb, kp values used). */
static void round_row(const float *A, int64_t lda, int64_t k, int64_t kp, int64_t ldb, int64_t i, sl_bf16 *Ab,
                      int path) {
#if SL_BF16_X86
    if (path == SL_BF16_AVX512)
        round_avx512(A + i * lda, Ab + i * ldb, k);
    else
#endif
        round_portable(A + i * lda, Ab + i * ldb, k);
    (void)path;
    if (kp > k) Ab[i * ldb + k] = 0;
}

/* Rows [i0, i1) of the transposed A (A (K, M), row stride lda) rounded into the bf16 block, in
 * tiles of 64 rows × 32 k: each K row's 64 values rounded at once (256 contiguous bytes read),
 * the tile then written row by row from L1. */
static void round_rows_t(const float *A, int64_t lda, int64_t k, int64_t kp, int64_t ldb, int64_t i0, int64_t i1,
                         sl_bf16 *Ab, int path) {
    enum { TI = 64, TK = 32 };
    sl_bf16 tile[TK][TI];
    for (int64_t b0 = i0; b0 < i1; b0 += TI) {
        const int64_t ib = min64(TI, i1 - b0);
        for (int64_t k0 = 0; k0 < k; k0 += TK) {
            const int64_t kb = min64(TK, k - k0);
            for (int64_t kk = 0; kk < kb; kk++) round_short(A + (k0 + kk) * lda + b0, tile[kk], ib, path);
            for (int64_t i = 0; i < ib; i++) {
                sl_bf16 *out = Ab + (b0 + i) * ldb + k0;
                for (int64_t kk = 0; kk < kb; kk++) out[kk] = tile[kk][i];
            }
        }
        if (kp > k)
            for (int64_t i = b0; i < b0 + ib; i++) Ab[i * ldb + k] = 0;
    }
}

/* C[j] = A · W[j]ᵀ (+ C[j]) for the n <= SL_SHARED_MAX weights of one input A, in one parallel
 * region: A's rows rounded once, then every product's tiles. trans != 0: A is stored transposed
 * (K, M) with row stride lda (sl_bf16_linear_tn); only the reading of A differs, the rounded
 * block and so every result bit are the same. pro (NULL: none; not with trans) writes row i of A
 * just before that row is rounded, by the same thread. */
static int bf16_linear(const char *what, int trans, int64_t M, const float *A, int64_t lda, int n,
                       const sl_bf16_panels *const *W, float *const *C, const int64_t *ldc, int accumulate,
                       int parallel, int path, const sl_row_prologue *pro) {
    if (n < 1 || n > SL_SHARED_MAX) return sl_fail(SL_ERR_VALUE, "%s: %d products of one input", what, n);
    if (trans && pro) return sl_fail(SL_ERR_INTERNAL, "%s: a row prologue needs A stored by rows", what);
    if (!W[0] || !W[0]->data) return sl_fail(SL_ERR_VALUE, "%s: NULL panels", what);
    const int64_t K = W[0]->k, kp = W[0]->kp;
    if (M < 0 || M > (INT64_MAX >> 8)) return sl_fail(SL_ERR_VALUE, "%s: bad row count %lld", what, (long long)M);
    double flops = 0.0;
    for (int j = 0; j < n; j++) {
        if (!W[j] || !W[j]->data) return sl_fail(SL_ERR_VALUE, "%s: NULL panels", what);
        const int64_t N = W[j]->n;
        if (W[j]->k != K) return sl_fail(SL_ERR_VALUE, "%s: products of one input with K %lld and %lld", what,
                                         (long long)K, (long long)W[j]->k);
        if ((trans ? lda < M : lda < K) || ldc[j] < N)
            return sl_fail(SL_ERR_VALUE, "%s: lda %lld < %s %lld or ldc %lld < N %lld", what, (long long)lda,
                           trans ? "M" : "K", (long long)(trans ? M : K), (long long)ldc[j], (long long)N);
        if (W[j]->kp != K + (K & 1) || N <= 0 || K <= 0) return sl_fail(SL_ERR_VALUE, "%s: inconsistent panels", what);
        flops += (double)M * (double)N * (double)K;
    }
    SL_TRY(resolve_path(path, &path));
    if (M == 0) return SL_OK;
    if (!A) return sl_fail(SL_ERR_VALUE, "%s: A or C is NULL", what);
    int64_t span;
    for (int j = 0; j < n; j++) {
        if (!C[j]) return sl_fail(SL_ERR_VALUE, "%s: A or C is NULL", what);
        if (!sl_mul_size(trans ? K - 1 : M - 1, lda, &span) || !sl_mul_size(M - 1, ldc[j], &span))
            return sl_fail(SL_ERR_VALUE, "%s: matrix too large", what);
    }
    /* Rows of the bf16 A block an odd number of cache lines apart: with a stride that is a
     * multiple of 4 KiB (K = 2048) the 14 rows a tile broadcasts from share one L1 set, more than
     * its ways, and each step would miss (measured: 2048^3 at 71 % of the peak before). */
    int64_t ldb = (kp + 31) / 32 * 32;
    if ((ldb / 32) % 2 == 0) ldb += 32;
    int64_t ab_elems;
    if (!sl_mul_size(M, ldb, &ab_elems) || ab_elems > (INT64_MAX >> 2))
        return sl_fail(SL_ERR_MEMORY, "%s: A block overflows", what);
    sl_bf16 *Ab = aligned_alloc(64, (size_t)((ab_elems * 2 + 63) / 64 * 64));
    if (!Ab) return sl_fail(SL_ERR_MEMORY, "%s: cannot allocate %lld bf16 values", what, (long long)ab_elems);

    /* Taller tasks read each panel from memory fewer times (the LM head's 49152 × 576 panels are
     * 56 MB: at 112 rows a T = 512 call streamed them 5 times); the block size changes no result. */
    int64_t mb = A_BLOCK / (kp * 2) / MRB * MRB;
    mb = mb < MB_MIN ? MB_MIN : mb > MB_MAX ? MB_MAX : mb;
    bf16_job g[SL_SHARED_MAX];
    int64_t first[SL_SHARED_MAX + 1] = {0}; /* product j's tasks are [first[j], first[j + 1]) */
    for (int j = 0; j < n; j++) {
        const int64_t np = ceil_div(W[j]->n, SL_BF16_NR);
        g[j] = (bf16_job){M, W[j]->n, kp, ldb, ldc[j], ceil_div(np, NBP), np, mb, Ab, W[j], C[j], accumulate != 0, path};
        first[j + 1] = first[j] + ceil_div(M, mb) * g[j].tn;
    }
    const int64_t ntasks = first[n];
    int nthr = 1;
#if SL_BF16_OMP
    if (parallel && !omp_in_parallel()) nthr = sl_num_threads();
#else
    (void)parallel;
#endif
    if (flops < 5e5) nthr = 1; /* waking threads costs more */
    if (nthr > ntasks) nthr = (int)ntasks;
    const int64_t nrb = ceil_div(M, 64); /* row blocks of the transposed rounding */
    if (nthr <= 1) {
        if (trans)
            round_rows_t(A, lda, K, kp, ldb, 0, M, Ab, path);
        else
            for (int64_t i = 0; i < M; i++) {
                if (pro) pro->fn(pro->arg, i);
                round_row(A, lda, K, kp, ldb, i, Ab, path);
            }
        for (int j = 0; j < n; j++)
            for (int64_t t = 0; t < first[j + 1] - first[j]; t++) run_task(&g[j], t);
    } else {
        /* one region: the rows of A rounded, then the tiles (dynamic: a thread slowed by another
         * process on its core takes fewer) */
#pragma omp parallel num_threads(nthr)
        {
            if (trans) {
#pragma omp for schedule(static)
                for (int64_t r = 0; r < nrb; r++)
                    round_rows_t(A, lda, K, kp, ldb, 64 * r, min64(64 * r + 64, M), Ab, path);
            } else {
#pragma omp for schedule(static)
                for (int64_t i = 0; i < M; i++) {
                    if (pro) pro->fn(pro->arg, i);
                    round_row(A, lda, K, kp, ldb, i, Ab, path);
                }
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < ntasks; t++) {
                int j = 0;
                while (t >= first[j + 1]) j++;
                run_task(&g[j], t - first[j]);
            }
        }
    }
    free(Ab);
    return SL_OK;
}

int sl_bf16_linear_nt(int64_t M, const float *A, int64_t lda, const sl_bf16_panels *W, float *C, int64_t ldc,
                      int accumulate, int parallel, int path) {
    return bf16_linear("bf16 linear", 0, M, A, lda, 1, &W, &C, &ldc, accumulate, parallel, path, NULL);
}

int sl_bf16_linear_tn(int64_t M, const float *A, int64_t lda, const sl_bf16_panels *W, float *C, int64_t ldc,
                      int accumulate, int parallel, int path) {
    return bf16_linear("bf16 linear (A transposed)", 1, M, A, lda, 1, &W, &C, &ldc, accumulate, parallel, path, NULL);
}

int sl_bf16_linear_nt_prologue(int64_t M, float *A, int64_t lda, const sl_bf16_panels *W, float *C, int64_t ldc,
                               int path, const sl_row_prologue *pro) {
    return bf16_linear("bf16 linear", 0, M, A, lda, 1, &W, &C, &ldc, 0, 1, path, pro);
}

int sl_bf16_linear_nt_shared(int64_t M, const float *A, int64_t lda, int n, const sl_bf16_panels *const *W,
                             float *const *C, const int64_t *ldc, int path) {
    return bf16_linear("bf16 linear", 0, M, A, lda, n, W, C, ldc, 0, 1, path, NULL);
}

/* ------------------------------------------------------------------------------------------
 * The register-only peak. */

static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC); /* C11 (clock_gettime needs POSIX, absent under -std=c11 with clang) */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if SL_BF16_X86
SL_AVX512BF16 static double peak_avx512(int64_t iters) {
    volatile float seed = 1e-3f;
    const __m512bh x = (__m512bh)_mm512_set1_epi32((int)(0x3F80u << 16 | 0x3F80u)); /* (1, 1) */
    const __m512bh y = (__m512bh)_mm512_set1_epi32((int)((uint32_t)sl_bf16_from_f32(seed) * 0x10001u));
    /* 24 independent chains (enough to cover the instruction's latency), each from its own start
     * value, so that the compiler cannot merge identical chains */
    const float s0 = seed;
#define SL_INIT(i) _mm512_set1_ps(s0 + (float)(i))
    __m512 a0 = SL_INIT(0), a1 = SL_INIT(1), a2 = SL_INIT(2), a3 = SL_INIT(3), a4 = SL_INIT(4), a5 = SL_INIT(5);
    __m512 a6 = SL_INIT(6), a7 = SL_INIT(7), a8 = SL_INIT(8), a9 = SL_INIT(9), a10 = SL_INIT(10), a11 = SL_INIT(11);
    __m512 a12 = SL_INIT(12), a13 = SL_INIT(13), a14 = SL_INIT(14), a15 = SL_INIT(15), a16 = SL_INIT(16);
    __m512 a17 = SL_INIT(17), a18 = SL_INIT(18), a19 = SL_INIT(19), a20 = SL_INIT(20), a21 = SL_INIT(21);
    __m512 a22 = SL_INIT(22), a23 = SL_INIT(23);
#undef SL_INIT
    const double t0 = now_s();
    for (int64_t i = 0; i < iters; i++) {
#define SL_DP(r) r = _mm512_dpbf16_ps(r, x, y);
        SL_DP(a0) SL_DP(a1) SL_DP(a2) SL_DP(a3) SL_DP(a4) SL_DP(a5) SL_DP(a6) SL_DP(a7)
        SL_DP(a8) SL_DP(a9) SL_DP(a10) SL_DP(a11) SL_DP(a12) SL_DP(a13) SL_DP(a14) SL_DP(a15)
        SL_DP(a16) SL_DP(a17) SL_DP(a18) SL_DP(a19) SL_DP(a20) SL_DP(a21) SL_DP(a22) SL_DP(a23)
#undef SL_DP
    }
    const double dt = now_s() - t0;
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a16, a17), _mm512_add_ps(a18, a19)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a20, a21), _mm512_add_ps(a22, a23)));
    seed = _mm512_reduce_add_ps(s);
    /* 24 instructions × 16 lanes × 2 products × 2 flops */
    return dt > 0 ? (double)iters * 24 * 64 / dt * 1e-9 : -1.0;
}
#endif

double sl_bf16_peak_gflops(int64_t iters) {
#if SL_BF16_X86
    if (sl_cpu_has_avx512_bf16() && iters > 0) return peak_avx512(iters);
#endif
    (void)iters;
    return -1.0;
}

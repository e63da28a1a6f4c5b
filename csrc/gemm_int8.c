/* int8 linear layers: activations quantized per row in blocks of 32, weights as unsigned bytes
 * with per-block float32 scales (and offsets), block dots in exact integer arithmetic (vpdpbusd on
 * AVX512-VNNI), the float part in one fixed order on every path. The contract, the rounding, the
 * weight formats and the overflow bound are in gemm_int8.h.
 *
 * Layout. The quantized activations stay row-major (q: M×K int8); the VNNI kernel broadcasts each
 * row's 4-byte k-groups straight from there. The weight is packed once (sl_int8_weight_init) into
 * panels of 32 outputs: per K block of 32, 8 k-groups × 32 outputs × 4 bytes, so one k-group of a
 * panel is two zmm loads whose lane i holds output i's 4 inputs; vpdpbusd(acc, u, bcast(q)) then
 * adds the 4 products of each lane. The register tile is 6 rows × 32 outputs: 12 int32
 * accumulators (reset to -zp·s per block), 12 float accumulators, 2 weight vectors, 1 broadcast.
 *
 * Why unsigned weights: vpdpbusd multiplies unsigned by signed bytes. Q4/Q5 quants are unsigned
 * already (the zero point moves into the accumulator's start value, -zp·s, s the activation
 * block's sum); int8 weights are biased by 128 (u = q + 128, zp = 128), so the same -zp·s start
 * undoes the bias and one kernel serves every format. llama.cpp's Q8_0 × Q8_0 instead moves the
 * weight's sign onto the activation (|w| × sign(q, w), vpsignb), which needs a sign instruction per
 * product and has no zmm form; the AVX2 kernel here uses that trick (vpmaddubsw saturates at
 * int16, and u = q + 128 would overflow it).
 *
 * Threads. Tasks are (row chunk, panel of 32 outputs): chunks of at most 96 rows, all of equal
 * size; each output is computed by one task over all of K, so the thread count cannot change a
 * result. The activation quantization is per row, also thread-independent. */
#include "gemm_int8.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"
#include "quant.h"
#include "sl_common.h"

#if defined(_OPENMP) && (!defined(SL_HAVE_OPENMP) || SL_HAVE_OPENMP)
#include <omp.h>
#define SL_I8_OMP 1
#else
#define SL_I8_OMP 0
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(SL_SGEMM_PORTABLE_ONLY)
#include <immintrin.h>
#define SL_I8_X86 1
#define SL_VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,avx2")))
#define SL_I8_AVX2 __attribute__((target("avx2,fma")))
#if defined(__clang__) || __GNUC__ >= 11
#define SL_I8_HAVE_AVXVNNI 1
#define SL_I8_AVXVNNI __attribute__((target("avx2,fma,avxvnni")))
#else
#define SL_I8_HAVE_AVXVNNI 0
#endif
#else
#define SL_I8_X86 0
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#ifndef SL_MR8
#define SL_MR8 6
#endif
#ifndef SL_MC8
#define SL_MC8 96
#endif
enum { QB = SL_INT8_BLOCK, NP = SL_INT8_PANEL, PANEL_BLOCK_BYTES = QB * NP, MR8 = SL_MR8, MC8 = SL_MC8 };
_Static_assert(MC8 % MR8 == 0, "row chunks hold whole tiles");

static const float TINY = 0x1p-100f; /* blocks with amax below this quantize to zero */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ------------------------------------------------------------------------------------------
 * Formats. */

int sl_int8_weight_supported(int type) {
    switch (type) {
    case SL_GGML_F32: case SL_GGML_F16: case SL_GGML_BF16: case SL_GGML_Q4_0: case SL_GGML_Q4_1:
    case SL_GGML_Q5_0: case SL_GGML_Q5_1: case SL_GGML_Q8_0: case SL_GGML_Q4_K: case SL_GGML_Q5_K:
    case SL_GGML_Q6_K:
        return sl_quant_block_elems(type) > 0;
    default: return 0;
    }
}

int sl_int8_weight_exact(int type) {
    switch (type) {
    case SL_GGML_Q4_0: case SL_GGML_Q4_1: case SL_GGML_Q5_0: case SL_GGML_Q5_1: case SL_GGML_Q8_0:
    case SL_GGML_Q4_K: case SL_GGML_Q5_K:
        return 1;
    default: return 0;
    }
}

static int type_zp(int type) {
    switch (type) {
    case SL_GGML_Q4_0: return 8;
    case SL_GGML_Q5_0: return 16;
    case SL_GGML_Q4_1: case SL_GGML_Q5_1: case SL_GGML_Q4_K: case SL_GGML_Q5_K: return 0;
    default: return 128; /* Q8_0 and every requantized type */
    }
}

static int type_has_min(int type) {
    return type == SL_GGML_Q4_1 || type == SL_GGML_Q5_1 || type == SL_GGML_Q4_K || type == SL_GGML_Q5_K;
}

/* ------------------------------------------------------------------------------------------
 * The quantizer (activations, and weights that are requantized). */

/* clamp to [-127, 127] with maxps/minps semantics (a NaN becomes -127), then round half to even
 * by integer arithmetic: the truncation and t - trunc(t) are exact for |t| <= 127. */
static inline int32_t round_clamp(float t) {
    t = t > -127.0f ? t : -127.0f;
    t = t < 127.0f ? t : 127.0f;
    const int32_t i = (int32_t)t;
    const float f = t - (float)i;
    /* without branches: on real data they would be mispredicted half the time */
    const int32_t odd = i & 1;
    const int32_t up = (f > 0.5f) | ((f == 0.5f) & odd), down = (f < -0.5f) | ((f == -0.5f) & odd);
    return i + up - down;
}

/* The block's scale and inverse: 0 normal, 1 zero block, 2 non-finite block (d = NaN). */
static inline int block_scales(float amax, int bad, float *d, float *id) {
    if (bad || !(amax <= FLT_MAX)) {
        *d = __builtin_nanf(""), *id = 0.0f;
        return 2;
    }
    if (!(amax >= TINY)) {
        *d = 0.0f, *id = 0.0f;
        return 1;
    }
    *d = amax / 127.0f, *id = 127.0f / amax;
    return 0;
}

static void quantize_block_generic(const float *x, int8_t *q, float *d, int32_t *s) {
    float amax = 0.0f;
    int bad = 0;
    for (int j = 0; j < QB; j++) {
        const float a = x[j] < 0.0f ? -x[j] : x[j];
        amax = a > amax ? a : amax; /* NaN ignored, as maxps(a, amax) */
        bad |= x[j] != x[j];
    }
    float id;
    if (block_scales(amax, bad, d, &id)) {
        memset(q, 0, QB);
        *s = 0;
        return;
    }
    int32_t sum = 0;
    for (int j = 0; j < QB; j++) {
        const int32_t v = round_clamp(x[j] * id);
        q[j] = (int8_t)v;
        sum += v;
    }
    *s = sum;
}

#if SL_I8_X86
SL_VNNI512 static void quantize_block_avx512(const float *x, int8_t *q, float *d, int32_t *s) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
    const __mmask16 nan = _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q);
    /* max(a, m) returns m where a is NaN: NaNs ignored, as in the generic loop */
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, _mm512_max_ps(a1, _mm512_setzero_ps())));
    float id;
    if (block_scales(amax, nan != 0, d, &id)) {
        memset(q, 0, QB);
        *s = 0;
        return;
    }
    const __m512 vid = _mm512_set1_ps(id), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512 t0 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x0, vid), lo), hi);
    __m512 t1 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x1, vid), lo), hi);
    const __m512i i0 = _mm512_cvt_roundps_epi32(t0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i i1 = _mm512_cvt_roundps_epi32(t1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)(void *)q, _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)(void *)(q + 16), _mm512_cvtepi32_epi8(i1));
    *s = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
}
#endif

#if SL_I8_X86
/* AVX2: the same operations; the rounding by vroundps with an explicit round-to-nearest-even
 * immediate (independent of MXCSR), then an exact truncating conversion of the integral value */
SL_I8_AVX2 static void quantize_block_avx2(const float *x, int8_t *q, float *d, int32_t *s) {
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    __m256 xv[4], m = _mm256_setzero_ps();
    int nan = 0;
    for (int i = 0; i < 4; i++) {
        xv[i] = _mm256_loadu_ps(x + 8 * i);
        nan |= _mm256_movemask_ps(_mm256_cmp_ps(xv[i], xv[i], _CMP_UNORD_Q));
        m = _mm256_max_ps(_mm256_andnot_ps(signbit, xv[i]), m); /* NaN lanes keep m */
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const float amax = _mm_cvtss_f32(h);
    float id;
    if (block_scales(amax, nan != 0, d, &id)) {
        memset(q, 0, QB);
        *s = 0;
        return;
    }
    const __m256 vid = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    int32_t v[QB];
    for (int i = 0; i < 4; i++) {
        const __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(xv[i], vid), lo), hi);
        const __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(void *)(v + 8 * i), _mm256_cvttps_epi32(r));
    }
    int32_t sum = 0;
    for (int j = 0; j < QB; j++) {
        q[j] = (int8_t)v[j];
        sum += v[j];
    }
    *s = sum;
}
#endif

typedef void (*quantize_block_fn)(const float *x, int8_t *q, float *d, int32_t *s);

/* The kernels, best first: one is usable when this build has it, the CPU has its instructions
 * and sl_simd() allows its level. sl_int8_force_kernel (tests) caps the choice at a kernel. */
static int kernel_usable(int k) {
    switch (k) {
#if SL_I8_X86
    case SL_INT8_VNNI512: return sl_simd() >= SL_SIMD_AVX512 && sl_cpu_has_avx512_vnni();
#if SL_I8_HAVE_AVXVNNI
    case SL_INT8_AVXVNNI: return sl_simd() >= SL_SIMD_AVX2 && sl_cpu_has_avx_vnni();
#endif
    case SL_INT8_AVX2: return sl_simd() >= SL_SIMD_AVX2 && sl_cpu_has_avx2_fma();
#endif
    case SL_INT8_GENERIC: return 1;
    default: return 0;
    }
}

static int kernel_cap = SL_INT8_VNNI512; /* written by the test hook only */

int sl_int8_kernel(void) {
    for (int k = kernel_cap; k > SL_INT8_GENERIC; k--)
        if (kernel_usable(k)) return k;
    return SL_INT8_GENERIC;
}

int sl_int8_force_kernel(int k) {
    kernel_cap = k < SL_INT8_GENERIC || k > SL_INT8_VNNI512 ? SL_INT8_VNNI512 : k;
    return sl_int8_kernel();
}

const char *sl_int8_kernel_name(int k) {
    switch (k) {
    case SL_INT8_VNNI512: return "avx512_vnni";
    case SL_INT8_AVXVNNI: return "avx_vnni";
    case SL_INT8_AVX2: return "avx2";
    default: return "generic";
    }
}


static quantize_block_fn pick_quantizer(void) {
#if SL_I8_X86
    const int k = sl_int8_kernel();
    if (k == SL_INT8_VNNI512) return quantize_block_avx512;
    if (k == SL_INT8_AVXVNNI || k == SL_INT8_AVX2) return quantize_block_avx2;
#endif
    return quantize_block_generic;
}

int sl_int8_quantize_rows(int64_t M, int64_t K, const float *A, int64_t lda, int8_t *q, float *d, int32_t *s,
                          int parallel) {
    if (M < 0 || K <= 0 || K % QB || lda < K)
        return sl_fail(SL_ERR_VALUE, "int8 quantize: M %lld, K %lld (a positive multiple of %d), lda %lld >= K",
                       (long long)M, (long long)K, QB, (long long)lda);
    if (M == 0) return SL_OK;
    if (!A || !q || !d || !s) return sl_fail(SL_ERR_VALUE, "int8 quantize: NULL buffer");
    const quantize_block_fn fn = pick_quantizer();
    const int64_t nb = K / QB;
    (void)parallel; /* unused without OpenMP */
#pragma omp parallel for schedule(dynamic, 16) num_threads(sl_num_threads()) if (parallel && M > 16)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) fn(A + m * lda + b * QB, q + m * K + b * QB, d + m * nb + b, s + m * nb + b);
    return SL_OK;
}

/* ------------------------------------------------------------------------------------------
 * Packing the weight. Each source block of 32 becomes u[32], dw, mw (see the header). */

/* f16 bytes to float through quant.h's own F16 decoder: the same conversion as every other path */
static inline float f16_at(sl_dequant_fn f16, const uint8_t *p) {
    float v;
    f16(p, &v, 1);
    return v;
}

static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Source row `row` of W (nb blocks of 32) into u (nb*32 bytes), dw, mw (nb floats each). `tmp`
 * holds cols floats for the requantized types. */
static void unpack_row(const sl_weight *W, int64_t row, sl_dequant_fn f16, sl_dequant_fn dec, float *tmp,
                       uint8_t *u, float *dw, float *mw) {
    const uint8_t *src = (const uint8_t *)W->data + row * W->row_bytes;
    const int64_t nb = W->cols / QB;
    switch (W->type) {
    case SL_GGML_Q8_0:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = src + 34 * b;
            dw[b] = f16_at(f16, p);
            for (int j = 0; j < 32; j++) u[32 * b + j] = (uint8_t)(p[2 + j] ^ 0x80); /* int8 + 128 */
        }
        return;
    case SL_GGML_Q4_0: case SL_GGML_Q4_1: {
        const int bb = W->type == SL_GGML_Q4_0 ? 18 : 20, off = W->type == SL_GGML_Q4_0 ? 2 : 4;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = src + bb * b;
            dw[b] = f16_at(f16, p);
            if (mw) mw[b] = f16_at(f16, p + 2);
            for (int j = 0; j < 16; j++) {
                u[32 * b + j] = p[off + j] & 0x0F;
                u[32 * b + j + 16] = p[off + j] >> 4;
            }
        }
        return;
    }
    case SL_GGML_Q5_0: case SL_GGML_Q5_1: {
        const int bb = W->type == SL_GGML_Q5_0 ? 22 : 24, hoff = W->type == SL_GGML_Q5_0 ? 2 : 4;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = src + bb * b;
            dw[b] = f16_at(f16, p);
            if (mw) mw[b] = f16_at(f16, p + 2);
            const uint32_t qh = (uint32_t)p[hoff] | ((uint32_t)p[hoff + 1] << 8) | ((uint32_t)p[hoff + 2] << 16) |
                                ((uint32_t)p[hoff + 3] << 24);
            const uint8_t *qs = p + hoff + 4;
            for (int j = 0; j < 16; j++) {
                u[32 * b + j] = (uint8_t)((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10));
                u[32 * b + j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
            }
        }
        return;
    }
    case SL_GGML_Q4_K: case SL_GGML_Q5_K: {
        const int five = W->type == SL_GGML_Q5_K, bb = five ? 176 : 144;
        for (int64_t sb = 0; sb < nb / 8; sb++) { /* super-blocks of 256 = 8 blocks of 32 */
            const uint8_t *p = src + bb * sb;
            const float d = f16_at(f16, p), dmin = f16_at(f16, p + 2);
            const uint8_t *scales = p + 4, *qh = p + 16, *ql = p + (five ? 48 : 16);
            for (int c = 0; c < 4; c++) { /* 64-element chunks: low nibbles, then high nibbles */
                for (int h = 0; h < 2; h++) {
                    const int64_t b = sb * 8 + 2 * c + h;
                    uint8_t sc, m;
                    get_scale_min_k4(2 * c + h, scales, &sc, &m);
                    dw[b] = d * (float)sc;
                    mw[b] = -(dmin * (float)m);
                    const unsigned bit = 1u << (2 * c + h);
                    for (int l = 0; l < 32; l++) {
                        const uint8_t q4 = h ? (uint8_t)(ql[32 * c + l] >> 4) : (uint8_t)(ql[32 * c + l] & 0xF);
                        u[32 * b + l] = (uint8_t)(q4 + (five && (qh[l] & bit) ? 16 : 0));
                    }
                }
            }
        }
        return;
    }
    default: /* requantize the exact dequantized floats (Q6_K, F32, F16, BF16) */
        dec(src, tmp, W->cols / sl_quant_block_elems(W->type));
        for (int64_t b = 0; b < nb; b++) {
            int8_t q[QB];
            int32_t s;
            quantize_block_generic(tmp + QB * b, q, &dw[b], &s);
            for (int j = 0; j < QB; j++) u[32 * b + j] = (uint8_t)((uint8_t)q[j] ^ 0x80);
        }
        return;
    }
}

void sl_int8_weight_free(sl_int8_weight *pw) {
    if (!pw) return;
    free(pw->u);
    free(pw->dw);
    free(pw->mw);
    memset(pw, 0, sizeof *pw);
}

/* The checks of sl_weight_init on a filled-in weight, plus the int8 ones. */
static int check_weight_int8(const sl_weight *W) {
    if (!W) return sl_fail(SL_ERR_VALUE, "int8 weight: NULL sl_weight");
    if (!sl_int8_weight_supported(W->type))
        return sl_fail(SL_ERR_VALUE, "int8 weight: unsupported tensor type %d", W->type);
    const int64_t be = sl_quant_block_elems(W->type), bb = sl_quant_block_bytes(W->type);
    if (W->rows <= 0 || W->cols <= 0 || W->cols % be || W->cols % QB || W->row_bytes != W->cols / be * bb ||
        W->rows > (INT64_MAX >> 12) || W->cols > (INT64_MAX >> 12))
        return sl_fail(SL_ERR_VALUE,
                       "int8 weight: %lld x %lld weight of type %d (%lld bytes per row) is not whole %d-element "
                       "blocks",
                       (long long)W->rows, (long long)W->cols, W->type, (long long)W->row_bytes, QB);
    int64_t total;
    if (!sl_mul_size(W->rows, W->row_bytes, &total)) return sl_fail(SL_ERR_VALUE, "int8 weight: size overflow");
    if (!W->data) return sl_fail(SL_ERR_VALUE, "int8 weight: data is NULL");
    return SL_OK;
}

int sl_int8_weight_usable(const sl_weight *W) {
    if (!W || !W->data || !sl_int8_weight_supported(W->type)) return 0;
    const int64_t be = sl_quant_block_elems(W->type), bb = sl_quant_block_bytes(W->type);
    int64_t total;
    return W->rows > 0 && W->cols > 0 && W->cols % be == 0 && W->cols % QB == 0 &&
           W->row_bytes == W->cols / be * bb && W->rows <= (INT64_MAX >> 12) && W->cols <= (INT64_MAX >> 12) &&
           sl_mul_size(W->rows, W->row_bytes, &total);
}

int sl_int8_weight_init(sl_int8_weight *pw, const sl_weight *W, int parallel) {
    if (!pw) return sl_fail(SL_ERR_VALUE, "int8 weight: NULL packed weight");
    memset(pw, 0, sizeof *pw);
    SL_TRY(check_weight_int8(W));
    const int64_t N = W->rows, K = W->cols, nb = K / QB, npanels = (N + NP - 1) / NP;
    int64_t nblk, nbytes;
    if (!sl_mul_size(npanels, nb, &nblk) || !sl_mul_size(nblk, PANEL_BLOCK_BYTES, &nbytes))
        return sl_fail(SL_ERR_MEMORY, "int8 weight: %lld x %lld is too large", (long long)N, (long long)K);
    const int has_min = type_has_min(W->type);
    pw->u = malloc((size_t)nbytes);
    pw->dw = calloc((size_t)nblk * NP, sizeof(float));
    pw->mw = has_min ? calloc((size_t)nblk * NP, sizeof(float)) : NULL;
    if (!pw->u || !pw->dw || (has_min && !pw->mw)) {
        sl_int8_weight_free(pw);
        return sl_fail(SL_ERR_MEMORY, "int8 weight: cannot allocate %lld bytes", (long long)nbytes);
    }
    pw->type = W->type, pw->zp = type_zp(W->type), pw->has_min = has_min, pw->exact = sl_int8_weight_exact(W->type);
    pw->rows = N, pw->cols = K, pw->nb = nb, pw->npanels = npanels;
    const sl_dequant_fn f16 = sl_dequant_kernel(SL_GGML_F16), dec = sl_dequant_kernel(W->type);
    int failed = 0;
    (void)parallel;
#pragma omp parallel num_threads(sl_num_threads()) if (parallel && npanels > 1)
    {
        /* one panel's rows unpacked: 32 × (K bytes + 2 nb floats), plus one row of floats */
        uint8_t *ur = malloc((size_t)(NP * K));
        float *sr = malloc((size_t)(2 * NP * nb) * sizeof(float));
        float *tmp = malloc((size_t)K * sizeof(float));
        const int have = ur && sr && tmp;
        /* every thread reaches the worksharing loop (skipping it would hang the team); one
         * without buffers marks the call failed and leaves its panels */
#pragma omp for schedule(static)
        for (int64_t p = 0; p < npanels; p++) {
            if (!have) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            {
                const int64_t nr = min64(NP, N - p * NP);
                memset(ur, 0, (size_t)(NP * K)); /* padding rows: u = 0 (with dw = mw = 0) */
                memset(sr, 0, (size_t)(2 * NP * nb) * sizeof(float));
                for (int64_t i = 0; i < nr; i++)
                    unpack_row(W, p * NP + i, f16, dec, tmp, ur + i * K, sr + i * nb,
                               has_min ? sr + (NP + i) * nb : NULL);
                for (int64_t b = 0; b < nb; b++) {
                    uint8_t *dst = pw->u + (p * nb + b) * PANEL_BLOCK_BYTES;
                    for (int g = 0; g < QB / 4; g++)
                        for (int i = 0; i < NP; i++) memcpy(dst + g * 4 * NP + 4 * i, ur + i * K + b * QB + 4 * g, 4);
                    float *dwp = pw->dw + (p * nb + b) * NP;
                    for (int i = 0; i < NP; i++) dwp[i] = sr[i * nb + b];
                    if (has_min) {
                        float *mwp = pw->mw + (p * nb + b) * NP;
                        for (int i = 0; i < NP; i++) mwp[i] = sr[(NP + i) * nb + b];
                    }
                }
            }
        }
        free(ur);
        free(sr);
        free(tmp);
    }
    if (failed) {
        sl_int8_weight_free(pw);
        return sl_fail(SL_ERR_MEMORY, "int8 weight: cannot allocate the packing buffers");
    }
    return SL_OK;
}

/* ------------------------------------------------------------------------------------------
 * The product. The quantized activations of one call. */
typedef struct {
    const int8_t *q;    /* M×K */
    const float *d;     /* M×nb */
    const int32_t *zs;  /* M×nb: -zp * s, the integer accumulators' start */
    const float *ds;    /* M×nb: d * (float)s, for the offsets (NULL when none) */
} qacts;

/* Rows [m0, m0 + mr) × panel p, portable: the same integer sums and the same float operations,
 * in the same order, as the VNNI tile. */
static void tile_generic(const qacts *a, const sl_int8_weight *pw, int64_t K, int64_t m0, int mr, int64_t p,
                         float *C, int64_t ldc, int accumulate) {
    const int64_t nb = pw->nb, n0 = p * NP, nc = min64(NP, pw->rows - n0);
    for (int r = 0; r < mr; r++) {
        const int64_t m = m0 + r;
        float acc[NP];
        for (int i = 0; i < NP; i++) acc[i] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *u = pw->u + (p * nb + b) * PANEL_BLOCK_BYTES;
            const int8_t *q = a->q + m * K + b * QB;
            const float *dw = pw->dw + (p * nb + b) * NP;
            const float da = a->d[m * nb + b];
            int32_t isum[NP];
            for (int i = 0; i < NP; i++) isum[i] = a->zs[m * nb + b];
            for (int g = 0; g < QB / 4; g++)
                for (int i = 0; i < NP; i++)
                    for (int t = 0; t < 4; t++) isum[i] += (int32_t)u[g * 4 * NP + 4 * i + t] * (int32_t)q[4 * g + t];
            for (int i = 0; i < NP; i++) acc[i] = acc[i] + (float)isum[i] * (da * dw[i]);
            if (pw->has_min) {
                const float *mw = pw->mw + (p * nb + b) * NP;
                const float ds = a->ds[m * nb + b];
                for (int i = 0; i < NP; i++) acc[i] = acc[i] + ds * mw[i];
            }
        }
        float *c = C + m * ldc + n0;
        for (int64_t i = 0; i < nc; i++) c[i] = accumulate ? c[i] + acc[i] : acc[i];
    }
}

#if SL_I8_X86
SL_VNNI512 static inline __attribute__((always_inline)) void tile_vnni(const qacts *a, const sl_int8_weight *pw,
                                                                        int64_t K, int64_t m0, const int mr,
                                                                        int64_t p, float *C, int64_t ldc,
                                                                        int accumulate) {
    const int64_t nb = pw->nb, n0 = p * NP, nc = min64(NP, pw->rows - n0);
    __m512 f[MR8][2];
    for (int r = 0; r < mr; r++) f[r][0] = f[r][1] = _mm512_setzero_ps();
    const int8_t *qr = a->q + m0 * K;
    const float *dr = a->d + m0 * nb, *dsr = a->ds ? a->ds + m0 * nb : NULL;
    const int32_t *zr = a->zs + m0 * nb;
    const uint8_t *u = pw->u + p * nb * PANEL_BLOCK_BYTES;
    const float *dwp = pw->dw + p * nb * NP, *mwp = pw->mw ? pw->mw + p * nb * NP : NULL;
    for (int64_t b = 0; b < nb; b++, u += PANEL_BLOCK_BYTES, dwp += NP) {
        __m512i acc[MR8][2];
        for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_set1_epi32(zr[r * nb + b]);
        for (int g = 0; g < QB / 4; g++) {
            const __m512i w0 = _mm512_loadu_si512((const void *)(u + g * 4 * NP));
            const __m512i w1 = _mm512_loadu_si512((const void *)(u + g * 4 * NP + 64));
            for (int r = 0; r < mr; r++) {
                int32_t x;
                memcpy(&x, qr + r * K + b * QB + 4 * g, 4);
                const __m512i bx = _mm512_set1_epi32(x);
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, bx);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, bx);
            }
        }
        const __m512 dw0 = _mm512_loadu_ps(dwp), dw1 = _mm512_loadu_ps(dwp + 16);
        for (int r = 0; r < mr; r++) {
            const __m512 da = _mm512_set1_ps(dr[r * nb + b]);
            f[r][0] = _mm512_add_ps(f[r][0], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][0]), _mm512_mul_ps(da, dw0)));
            f[r][1] = _mm512_add_ps(f[r][1], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][1]), _mm512_mul_ps(da, dw1)));
        }
        if (mwp) {
            const __m512 mw0 = _mm512_loadu_ps(mwp), mw1 = _mm512_loadu_ps(mwp + 16);
            mwp += NP;
            for (int r = 0; r < mr; r++) {
                const __m512 ds = _mm512_set1_ps(dsr[r * nb + b]);
                f[r][0] = _mm512_add_ps(f[r][0], _mm512_mul_ps(ds, mw0));
                f[r][1] = _mm512_add_ps(f[r][1], _mm512_mul_ps(ds, mw1));
            }
        }
    }
    const __mmask16 k0 = (__mmask16)(nc >= 16 ? 0xFFFF : (1u << nc) - 1u);
    const __mmask16 k1 = (__mmask16)(nc >= 32 ? 0xFFFF : nc <= 16 ? 0 : (1u << (nc - 16)) - 1u);
    for (int r = 0; r < mr; r++) {
        float *c = C + (m0 + r) * ldc + n0;
        __m512 v0 = f[r][0], v1 = f[r][1];
        if (accumulate) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(k0, c), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(k1, c + 16), v1);
        }
        _mm512_mask_storeu_ps(c, k0, v0);
        _mm512_mask_storeu_ps(c + 16, k1, v1);
    }
}

SL_VNNI512 static void tile_vnni_any(const qacts *a, const sl_int8_weight *pw, int64_t K, int64_t m0, int mr,
                                     int64_t p, float *C, int64_t ldc, int accumulate) {
    switch (mr) {
    case 6: tile_vnni(a, pw, K, m0, 6, p, C, ldc, accumulate); break;
    case 5: tile_vnni(a, pw, K, m0, 5, p, C, ldc, accumulate); break;
    case 4: tile_vnni(a, pw, K, m0, 4, p, C, ldc, accumulate); break;
    case 3: tile_vnni(a, pw, K, m0, 3, p, C, ldc, accumulate); break;
    case 2: tile_vnni(a, pw, K, m0, 2, p, C, ldc, accumulate); break;
    default: tile_vnni(a, pw, K, m0, 1, p, C, ldc, accumulate); break;
    }
}
#endif

#if SL_I8_X86
enum { RA = 3 }; /* rows per AVX2 tile: 6 int32 accumulators, 6 float ones (16 ymm registers) */
/* The AVX2 tiles: rows in groups of 3, each half (16 outputs) of the panel in 2 ymm per row. The same
 * integer sums as the VNNI tile, by one of two exact routes:
 *   AVX-VNNI  vpdpbusd on ymm, from -zp*s, as the AVX-512 kernel;
 *   AVX2      vpmaddubsw (u8 x s8 pairs to s16, saturating) then vpmaddwd by ones (to s32). Pairs
 *             cannot saturate: for zp <= 16 (u <= 31) |pair| <= 2*31*127 = 7874; for zp = 128 the
 *             weight is used signed, w = u - 128, as |w| x sign(q, w) (llama.cpp's trick), |pair|
 *             <= 2*128*127 = 32512 < 32767, and sum w*q = sum u*q - 128*s, so the accumulator
 *             starts at 0 instead of -128*s.
 * The float part is the same operations in the same order as every other path. */
#define SL_I8_TILE_AVX2(NAME, ATTR, DOT_INIT, DOT_STEP)                                                        \
    ATTR static inline __attribute__((always_inline)) void NAME##_rows(                                        \
        const qacts *a, const sl_int8_weight *pw, int64_t K, int64_t m0, const int rr, int64_t p, float *C,   \
        int64_t ldc, int accumulate) {                                                                         \
        const int64_t nb = pw->nb, n0 = p * NP, nc = min64(NP, pw->rows - n0);                                 \
        const int signed_w = pw->zp == 128;                                                                    \
        (void)signed_w;                                                                                        \
        for (int h = 0; h < 2; h++) {                                                                          \
            __m256 f[RA][2];                                                                                   \
            for (int r = 0; r < rr; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();                              \
            for (int64_t b = 0; b < nb; b++) {                                                                 \
                const uint8_t *u = pw->u + (p * nb + b) * PANEL_BLOCK_BYTES + h * 64;                          \
                __m256i acc[RA][2];                                                                            \
                for (int r = 0; r < rr; r++) {                                                                 \
                    const int64_t m = m0 + r;                                                                  \
                    acc[r][0] = acc[r][1] = _mm256_set1_epi32(DOT_INIT);                                       \
                }                                                                                              \
                for (int g = 0; g < QB / 4; g++) {                                                             \
                    const __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)(u + g * 4 * NP));    \
                    const __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(u + g * 4 * NP + 32)); \
                    for (int r = 0; r < rr; r++) {                                                             \
                        int32_t x;                                                                             \
                        memcpy(&x, a->q + (m0 + r) * K + b * QB + 4 * g, 4);                                   \
                        const __m256i bx = _mm256_set1_epi32(x);                                               \
                        acc[r][0] = DOT_STEP(acc[r][0], w0, bx);                                               \
                        acc[r][1] = DOT_STEP(acc[r][1], w1, bx);                                               \
                    }                                                                                          \
                }                                                                                              \
                const float *dw = pw->dw + (p * nb + b) * NP + h * 16;                                         \
                const __m256 dw0 = _mm256_loadu_ps(dw), dw1 = _mm256_loadu_ps(dw + 8);                         \
                for (int r = 0; r < rr; r++) {                                                                 \
                    const __m256 da = _mm256_set1_ps(a->d[(m0 + r) * nb + b]);                                 \
                    f[r][0] = _mm256_add_ps(f[r][0], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][0]), _mm256_mul_ps(da, dw0))); \
                    f[r][1] = _mm256_add_ps(f[r][1], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][1]), _mm256_mul_ps(da, dw1))); \
                }                                                                                              \
                if (pw->has_min) {                                                                             \
                    const float *mw = pw->mw + (p * nb + b) * NP + h * 16;                                     \
                    const __m256 mw0 = _mm256_loadu_ps(mw), mw1 = _mm256_loadu_ps(mw + 8);                     \
                    for (int r = 0; r < rr; r++) {                                                             \
                        const __m256 ds = _mm256_set1_ps(a->ds[(m0 + r) * nb + b]);                            \
                        f[r][0] = _mm256_add_ps(f[r][0], _mm256_mul_ps(ds, mw0));                              \
                        f[r][1] = _mm256_add_ps(f[r][1], _mm256_mul_ps(ds, mw1));                              \
                    }                                                                                          \
                }                                                                                              \
            }                                                                                                  \
            for (int r = 0; r < rr; r++) {                                                                     \
                float out[16];                                                                                 \
                _mm256_storeu_ps(out, f[r][0]);                                                                \
                _mm256_storeu_ps(out + 8, f[r][1]);                                                            \
                float *c = C + (m0 + r) * ldc + n0 + h * 16;                                                   \
                for (int64_t i = 0; i < 16 && h * 16 + i < nc; i++) c[i] = accumulate ? c[i] + out[i] : out[i]; \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    ATTR static void NAME(const qacts *a, const sl_int8_weight *pw, int64_t K, int64_t m0, int mr, int64_t p,   \
                          float *C, int64_t ldc, int accumulate) {                                             \
        for (int r0 = 0; r0 < mr; r0 += RA) {                                                                  \
            switch (mr - r0 >= RA ? RA : mr - r0) {                                                            \
            case 3: NAME##_rows(a, pw, K, m0 + r0, 3, p, C, ldc, accumulate); break;                           \
            case 2: NAME##_rows(a, pw, K, m0 + r0, 2, p, C, ldc, accumulate); break;                           \
            default: NAME##_rows(a, pw, K, m0 + r0, 1, p, C, ldc, accumulate); break;                          \
            }                                                                                                  \
        }                                                                                                      \
    }

/* u8 x s8 in 4-byte groups to s32, exact (see above); `sw`: the weight is u - 128, used signed */
SL_I8_AVX2 static inline __attribute__((always_inline)) __m256i dot4_avx2(__m256i acc, __m256i u, __m256i q, int sw) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i pairs;
    if (sw) {
        const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
        pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(q, w));
    } else {
        pairs = _mm256_maddubs_epi16(u, q);
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
}
#define SL_I8_DOT_AVX2(acc, u, q) dot4_avx2(acc, u, q, signed_w)
#define SL_I8_INIT_AVX2 (signed_w ? 0 : a->zs[m * nb + b])
SL_I8_TILE_AVX2(tile_avx2, SL_I8_AVX2, SL_I8_INIT_AVX2, SL_I8_DOT_AVX2)

#if SL_I8_HAVE_AVXVNNI
#define SL_I8_DOT_AVXVNNI(acc, u, q) _mm256_dpbusd_avx_epi32(acc, u, q)
SL_I8_TILE_AVX2(tile_avxvnni, SL_I8_AVXVNNI, a->zs[m * nb + b], SL_I8_DOT_AVXVNNI)
#endif
#endif

typedef void (*tile_fn)(const qacts *a, const sl_int8_weight *pw, int64_t K, int64_t m0, int mr, int64_t p,
                        float *C, int64_t ldc, int accumulate);

static int check_packed(const sl_int8_weight *pw) {
    if (!pw || !pw->u || !pw->dw || pw->rows <= 0 || pw->cols <= 0 || pw->cols % QB || pw->nb != pw->cols / QB ||
        pw->npanels != (pw->rows + NP - 1) / NP || (pw->has_min && !pw->mw))
        return sl_fail(SL_ERR_VALUE, "int8 linear: the weight is not packed (sl_int8_weight_init)");
    return SL_OK;
}

void sl_int8_acts_free(sl_int8_acts *qa) {
    if (!qa) return;
    free(qa->q);
    free(qa->d);
    free(qa->s);
    memset(qa, 0, sizeof *qa);
}

/* qa's buffers for M×K activations, not yet written. */
static int acts_alloc(sl_int8_acts *qa, int64_t M, int64_t K) {
    int64_t nq, ns;
    if (!sl_mul_size(M, K, &nq) || !sl_mul_size(M, K / QB, &ns) || ns > (INT64_MAX / 16))
        return sl_fail(SL_ERR_MEMORY, "int8 activations: %lld x %lld is too large", (long long)M, (long long)K);
    qa->M = M, qa->K = K;
    if (M == 0) return SL_OK;
    qa->q = malloc((size_t)nq);
    qa->d = malloc((size_t)ns * sizeof(float));
    qa->s = malloc((size_t)ns * sizeof(int32_t));
    if (!qa->q || !qa->d || !qa->s) {
        sl_int8_acts_free(qa);
        return sl_fail(SL_ERR_MEMORY, "int8 activations: cannot allocate %lld bytes", (long long)nq);
    }
    return SL_OK;
}

int sl_int8_acts_init(sl_int8_acts *qa, int64_t M, int64_t K, const float *A, int64_t lda, int parallel) {
    if (!qa) return sl_fail(SL_ERR_VALUE, "int8 activations: NULL sl_int8_acts");
    memset(qa, 0, sizeof *qa);
    if (M < 0 || K <= 0 || K % QB || lda < K)
        return sl_fail(SL_ERR_VALUE, "int8 activations: M %lld, K %lld (a positive multiple of %d), lda %lld >= K",
                       (long long)M, (long long)K, QB, (long long)lda);
    if (M > 0 && !A) return sl_fail(SL_ERR_VALUE, "int8 activations: A is NULL");
    SL_TRY(acts_alloc(qa, M, K));
    if (M == 0) return SL_OK;
    const int rc = sl_int8_quantize_rows(M, K, A, lda, qa->q, qa->d, qa->s, parallel);
    if (rc != SL_OK) sl_int8_acts_free(qa);
    return rc;
}

/* One product's plan: the activations' block sums against this weight, the tile kernel and the
 * task grid. */
typedef struct {
    qacts acts;
    int32_t *zs;
    float *ds;
    tile_fn tile;
    int64_t ntasks, mcr;
} int8_plan;

static void plan_free(int8_plan *pl) {
    free(pl->zs);
    free(pl->ds);
}

/* The plan for M rows of qa (its buffers allocated; its values may come later, see plan_sums). */
static int plan_init(int8_plan *pl, const sl_int8_acts *qa, const sl_int8_weight *pw) {
    const int64_t M = qa->M, ns = M * pw->nb;
    memset(pl, 0, sizeof *pl);
    /* the weight's zero point and offsets, per activation block: M * K/32 values, small */
    pl->zs = malloc((size_t)ns * sizeof(int32_t));
    pl->ds = pw->has_min ? malloc((size_t)ns * sizeof(float)) : NULL;
    if (!pl->zs || (pw->has_min && !pl->ds)) {
        plan_free(pl);
        return sl_fail(SL_ERR_MEMORY, "int8 linear: cannot allocate %lld block sums", (long long)ns);
    }
    pl->acts = (qacts){qa->q, qa->d, pl->zs, pl->ds};
    pl->tile = tile_generic;
#if SL_I8_X86
    switch (sl_int8_kernel()) {
    case SL_INT8_VNNI512: pl->tile = tile_vnni_any; break;
#if SL_I8_HAVE_AVXVNNI
    case SL_INT8_AVXVNNI: pl->tile = tile_avxvnni; break;
#endif
    case SL_INT8_AVX2: pl->tile = tile_avx2; break;
    default: break;
    }
#endif
    /* chunks of at most MC8 rows, of equal size (in whole tiles), so that the tasks are balanced
     * (M = 128 is 66 + 62 rows, not 96 + 32); handed out dynamically, so that a thread whose core
     * is taken by another process does not hold the others back (which thread computes a task
     * never changes its result) */
    const int64_t nmc = (M + MC8 - 1) / MC8;
    pl->ntasks = nmc * pw->npanels;
    pl->mcr = ((M + nmc - 1) / nmc + MR8 - 1) / MR8 * MR8;
    return SL_OK;
}

/* Row m's block sums, from its quantized scales and sums. */
static void plan_sums(int8_plan *pl, const sl_int8_acts *qa, const sl_int8_weight *pw, int64_t m) {
    for (int64_t i = m * pw->nb; i < (m + 1) * pw->nb; i++) {
        pl->zs[i] = -pw->zp * qa->s[i];
        if (pl->ds) pl->ds[i] = qa->d[i] * (float)qa->s[i];
    }
}

static void plan_task(const int8_plan *pl, const sl_int8_weight *pw, int64_t M, int64_t t, float *C, int64_t ldc,
                      int accumulate) {
    const int64_t mc = t / pw->npanels, p = t % pw->npanels;
    const int64_t m1 = min64(M, (mc + 1) * pl->mcr);
    for (int64_t m0 = mc * pl->mcr; m0 < m1; m0 += MR8)
        pl->tile(&pl->acts, pw, pw->cols, m0, (int)min64(MR8, m1 - m0), p, C, ldc, accumulate);
}

int sl_linear_nt_int8_acts(const sl_int8_acts *qa, const sl_int8_weight *pw, float *C, int64_t ldc, int accumulate,
                           int parallel) {
    SL_TRY(check_packed(pw));
    if (!qa || qa->M < 0 || qa->K != pw->cols || (qa->M > 0 && (!qa->q || !qa->d || !qa->s)))
        return sl_fail(SL_ERR_VALUE, "int8 linear: activations (K %lld) not quantized for this weight (K %lld)",
                       qa ? (long long)qa->K : -1LL, (long long)pw->cols);
    const int64_t M = qa->M, N = pw->rows;
    if (M == 0) return SL_OK;
    if (!C) return sl_fail(SL_ERR_VALUE, "int8 linear: C is NULL");
    if (ldc < N) return sl_fail(SL_ERR_VALUE, "int8 linear: ldc %lld < N %lld", (long long)ldc, (long long)N);
    int8_plan pl;
    SL_TRY(plan_init(&pl, qa, pw));
    for (int64_t m = 0; m < M; m++) plan_sums(&pl, qa, pw, m);
    const int64_t ntasks = pl.ntasks;
    (void)parallel;
#pragma omp parallel for schedule(dynamic, 1) num_threads(sl_num_threads()) if (parallel && ntasks > 1)
    for (int64_t t = 0; t < ntasks; t++) plan_task(&pl, pw, M, t, C, ldc, accumulate);
    plan_free(&pl);
    return SL_OK;
}

/* Quantizing A and the product in one parallel region (two as sl_int8_acts_init then
 * sl_linear_nt_int8_acts, and a third fork for every product of a forward): the same row
 * quantizer and block sums, then the same tasks, so the same bits. */
/* C[j] = A · W[j]ᵀ (+ C[j]) for the n <= SL_SHARED_MAX packed weights of one input A (the same K),
 * in one parallel region: A's rows quantized once (pro, NULL or not, writing each row first, by
 * the thread that quantizes it), then every product's tasks. */
static int int8_linear(int64_t M, const float *A, int64_t lda, int n, const sl_int8_weight *const *pw,
                       float *const *C, const int64_t *ldc, int accumulate, int parallel,
                       const sl_row_prologue *pro) {
    if (n < 1 || n > SL_SHARED_MAX) return sl_fail(SL_ERR_VALUE, "int8 linear: %d products of one input", n);
    for (int j = 0; j < n; j++) SL_TRY(check_packed(pw[j]));
    if (M < 0) return sl_fail(SL_ERR_VALUE, "int8 linear: negative M %lld", (long long)M);
    if (M == 0) return SL_OK;
    const int64_t K = pw[0]->cols, nb = pw[0]->nb;
    for (int j = 0; j < n; j++) {
        if (!A || !C[j]) return sl_fail(SL_ERR_VALUE, "int8 linear: A or C is NULL");
        if (lda < pw[j]->cols || ldc[j] < pw[j]->rows)
            return sl_fail(SL_ERR_VALUE, "int8 linear: lda %lld < K %lld or ldc %lld < N %lld", (long long)lda,
                           (long long)pw[j]->cols, (long long)ldc[j], (long long)pw[j]->rows);
        if (pw[j]->cols != K)
            return sl_fail(SL_ERR_VALUE, "int8 linear: products of one input with K %lld and %lld", (long long)K,
                           (long long)pw[j]->cols);
    }
    sl_int8_acts qa = {0};
    SL_TRY(acts_alloc(&qa, M, K));
    int8_plan pl[SL_SHARED_MAX];
    int64_t first[SL_SHARED_MAX + 1] = {0}; /* product j's tasks are [first[j], first[j + 1]) */
    for (int j = 0; j < n; j++) {
        const int rc = plan_init(&pl[j], &qa, pw[j]); /* frees what it allocated when it fails */
        if (rc != SL_OK) {
            while (j-- > 0) plan_free(&pl[j]);
            sl_int8_acts_free(&qa);
            return rc;
        }
        first[j + 1] = first[j] + pl[j].ntasks;
    }
    const quantize_block_fn quantize = pick_quantizer();
    const int64_t ntasks = first[n];
    (void)parallel;
#pragma omp parallel num_threads(sl_num_threads()) if (parallel && (ntasks > 1 || M > 16))
    {
#pragma omp for schedule(dynamic, 16)
        for (int64_t m = 0; m < M; m++) {
            if (pro) pro->fn(pro->arg, m); /* row m of A, by the thread that quantizes it */
            for (int64_t b = 0; b < nb; b++)
                quantize(A + m * lda + b * QB, qa.q + m * K + b * QB, qa.d + m * nb + b, qa.s + m * nb + b);
            for (int j = 0; j < n; j++) plan_sums(&pl[j], &qa, pw[j], m);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntasks; t++) {
            int j = 0;
            while (t >= first[j + 1]) j++;
            plan_task(&pl[j], pw[j], M, t - first[j], C[j], ldc[j], accumulate);
        }
    }
    for (int j = 0; j < n; j++) plan_free(&pl[j]);
    sl_int8_acts_free(&qa);
    return SL_OK;
}

int sl_linear_nt_int8_packed(int64_t M, const float *A, int64_t lda, const sl_int8_weight *pw, float *C,
                             int64_t ldc, int accumulate, int parallel) {
    return int8_linear(M, A, lda, 1, &pw, &C, &ldc, accumulate, parallel, NULL);
}

int sl_linear_nt_int8_prologue(int64_t M, float *A, int64_t lda, const sl_int8_weight *pw, float *C, int64_t ldc,
                               const sl_row_prologue *pro) {
    return int8_linear(M, A, lda, 1, &pw, &C, &ldc, 0, 1, pro);
}

int sl_linear_nt_int8_shared(int64_t M, const float *A, int64_t lda, int n, const sl_int8_weight *const *pw,
                             float *const *C, const int64_t *ldc) {
    return int8_linear(M, A, lda, n, pw, C, ldc, 0, 1, NULL);
}

int sl_linear_nt_int8(int64_t M, const float *A, int64_t lda, const sl_weight *W, float *C, int64_t ldc,
                      int accumulate, int parallel) {
    SL_TRY(check_weight_int8(W));
    if (M < 0) return sl_fail(SL_ERR_VALUE, "int8 linear: negative M %lld", (long long)M);
    if (M == 0) return SL_OK;
    if (!A || !C) return sl_fail(SL_ERR_VALUE, "int8 linear: A or C is NULL");
    if (lda < W->cols || ldc < W->rows)
        return sl_fail(SL_ERR_VALUE, "int8 linear: lda %lld < K %lld or ldc %lld < N %lld", (long long)lda,
                       (long long)W->cols, (long long)ldc, (long long)W->rows);
    sl_int8_weight pw;
    SL_TRY(sl_int8_weight_init(&pw, W, parallel));
    const int rc = sl_linear_nt_int8_packed(M, A, lda, &pw, C, ldc, accumulate, parallel);
    sl_int8_weight_free(&pw);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Peak: 24 independent vpdpbusd chains, nothing but registers. */

#if SL_I8_X86
static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC); /* C11, as common.c times */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

#if SL_I8_X86
#define SL_I8_X24(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) \
    X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
/* 24 named accumulators (not an array: an array of vectors is kept in memory), 26 zmm in all */
SL_VNNI512 static int32_t vnni_loop(int64_t iters) {
    const __m512i a = _mm512_set1_epi32(0x01010101), b = _mm512_set1_epi32(0x01FF01FF);
#define SL_I8_DECL(i) __m512i acc##i = _mm512_set1_epi32(i);
#define SL_I8_STEP(i) acc##i = _mm512_dpbusd_epi32(acc##i, a, b);
#define SL_I8_KEEP(i) __asm__ volatile("" : "+v"(acc##i));
#define SL_I8_SUM(i) s = _mm512_add_epi32(s, acc##i);
    SL_I8_X24(SL_I8_DECL)
    for (int64_t it = 0; it < iters; it++) {
        SL_I8_X24(SL_I8_STEP)
        SL_I8_X24(SL_I8_KEEP)
    }
    __m512i s = _mm512_setzero_si512();
    SL_I8_X24(SL_I8_SUM)
    return _mm512_reduce_add_epi32(s);
#undef SL_I8_DECL
#undef SL_I8_STEP
#undef SL_I8_KEEP
#undef SL_I8_SUM
}
#endif

#if SL_I8_X86 && SL_I8_HAVE_AVXVNNI
#define SL_I8_X12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* the same on ymm with the VEX (AVX-VNNI) form: 12 chains, 14 of the 16 ymm registers */
SL_I8_AVXVNNI static int32_t avxvnni_loop(int64_t iters) {
    const __m256i a = _mm256_set1_epi32(0x01010101), b = _mm256_set1_epi32(0x01FF01FF);
#define SL_I8_DECL(i) __m256i acc##i = _mm256_set1_epi32(i);
#define SL_I8_STEP(i) acc##i = _mm256_dpbusd_avx_epi32(acc##i, a, b);
#define SL_I8_KEEP(i) __asm__ volatile("" : "+x"(acc##i));
#define SL_I8_SUM(i) s = _mm256_add_epi32(s, acc##i);
    SL_I8_X12(SL_I8_DECL)
    for (int64_t it = 0; it < iters; it++) {
        SL_I8_X12(SL_I8_STEP)
        SL_I8_X12(SL_I8_KEEP)
    }
    __m256i s = _mm256_setzero_si256();
    SL_I8_X12(SL_I8_SUM)
    return _mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7);
#undef SL_I8_DECL
#undef SL_I8_STEP
#undef SL_I8_KEEP
#undef SL_I8_SUM
}
#endif

static volatile int32_t peak_sink;

double sl_int8_peak(int kernel, int64_t iters, double *seconds) {
    *seconds = 0.0;
    if (iters <= 0) return 0.0;
#if SL_I8_X86
    if (kernel == SL_INT8_VNNI512 && sl_cpu_has_avx512_vnni() && sl_cpu_has_avx512()) {
        const double t0 = now_s();
        peak_sink = vnni_loop(iters);
        *seconds = now_s() - t0;
        return (double)iters * 24.0 * 16.0 * 4.0 * 2.0;
    }
#if SL_I8_HAVE_AVXVNNI
    if (kernel == SL_INT8_AVXVNNI && sl_cpu_has_avx_vnni()) {
        const double t0 = now_s();
        peak_sink = avxvnni_loop(iters);
        *seconds = now_s() - t0;
        return (double)iters * 12.0 * 8.0 * 4.0 * 2.0;
    }
#endif
#endif
    (void)kernel;
    return 0.0;
}

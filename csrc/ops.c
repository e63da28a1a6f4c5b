/* Row-wise ops of the LLaMA block. Loops are OpenMP over rows (or over fixed chunks of an
 * elementwise op): each output is computed by one thread in a fixed order, so results do not
 * depend on the thread count. Team sizes come from the call context (sl_num_threads), not from
 * the calling thread's OpenMP setting.
 *
 * Run-time dispatch (cpu.h): softmax with entropy, RMSNorm, LayerNorm, SwiGLU, GELU-tanh and
 * GeGLU, soft-capping, the residual and bias adds have AVX2+FMA and AVX-512 kernels beside the
 * portable C (erf GELU and all backward/JVP products are portable only); the level is read once per call, so all
 * rows of one call use one path. Within a path every element is computed by the same lane-wise
 * sequence wherever it falls (row tails use masked or padded vectors, never a scalar fallback
 * that a chunk boundary could select). Across paths, results differ by rounding only:
 *   - softmax/entropy: the vector exp (Cephes polynomial, <= 2 ulp) vs libm expf (<= 1 ulp),
 *     and the order of the double sums Z and sum p*(x-max);
 *   - RMSNorm: only the order of the double sum of squares (products of floats are exact in
 *     double), so 1/rms differs by at most 1 ulp of float and the outputs by <= 2 ulp;
 *   - SwiGLU: the vector exp vs expf inside the sigmoid, a few ulp of silu(g);
 *   - LayerNorm: only the order of the double sums of x and (x - mean)^2, so mean and rstd differ
 *     by at most 1 ulp (measured: bitwise on test rows); the per-element step is the same;
 *   - GELU-tanh / GeGLU: the vector exp vs expf in x / (1 + exp(-2z)), measured <= 5 ulp;
 *   - soft-capping: Cephes' vector tanh vs libm tanhf, measured <= 3 ulp (both within 4 ulp of
 *     float64);
 *   - the residual and bias adds are bitwise the same on every path.
 * The AVX2 and AVX-512 exps (and tanh) run the same lane-wise operations, so the elementwise
 * kernels agree bitwise between those two levels. */
#include "ops.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "sl_common.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define SL_X86 1
#include <immintrin.h>
#define SL_AVX2 __attribute__((target("avx2,fma")))
#define SL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2")))
#else
#define SL_X86 0
#endif

/* Elementwise ops are split over threads in chunks of this many elements (a multiple of 16,
 * so vector blocks never straddle two threads; not that it would change a bit). */
#define SL_CHUNK 8192

/* GELU constants as torch writes them (sqrt(2/pi), 0.044715, 1/sqrt(2), 1/sqrt(2 pi)). */
#define SL_GELU_BETA 0.7978845608028654f /* sqrt(2 / pi) */
#define SL_GELU_KAPPA 0.044715f
#define SL_INV_SQRT2 0.7071067811865476f
#define SL_INV_SQRT_2PI 0.3989422804014327f

/* ------------------------------------------------------------------------------------------
 * SIMD kernels. Each works on one row (or one run of elements) and is called from the same
 * OpenMP loops as the portable code. */
#if SL_X86
/* exp on 8 lanes, Cephes' single-precision polynomial (about 1 ulp for the arguments <= 0 that
 * softmax produces); below -87.3 it returns a tiny positive value instead of 0 or a denormal.
 * The clamps take x as the second operand of max/min, which is the one returned for a NaN, so a
 * NaN stays a NaN instead of becoming exp(-87.3). */
SL_AVX2 static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), x);
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* exp on 16 lanes: exp8's operations lane for lane (same constants, same FMA chain, floor by
 * roundscale), so the AVX2 and AVX-512 paths get the same bits from it. */
SL_AVX512 static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x);
    x = _mm512_min_ps(_mm512_set1_ps(88.3f), x);
    __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

/* The first k < 16 lanes, or all 16 when k >= 16. */
static inline __mmask16 lanes16(int64_t k) {
    return k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << k) - 1u);
}

SL_AVX2 static double hsum4d(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* Lanes [0, 8) and [8, 16) of a float vector, widened to double. */
SL_AVX512 static inline __m512d lo8d(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
SL_AVX512 static inline __m512d hi8d(__m512 v) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); }

SL_AVX2 static float softmax_entropy_avx2(float *x, int64_t n, double *lse) {
    const int64_t n8 = n & ~(int64_t)7;
    __m256 vmax = _mm256_set1_ps(x[0]);
    for (int64_t i = 0; i < n8; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    float mx = lanes[0];
    for (int k = 1; k < 8; k++) mx = lanes[k] > mx ? lanes[k] : mx;
    for (int64_t i = n8; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    /* Sums in double, as in the portable path: entropy is log Z - E[x - max]. */
    __m256d z = _mm256_setzero_pd(), zs = _mm256_setzero_pd();
    const __m256 m = _mm256_set1_ps(mx);
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 sh = _mm256_sub_ps(_mm256_loadu_ps(x + i), m);
        __m256 e = exp8(sh);
        _mm256_storeu_ps(x + i, e);
        __m256d e_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(e)), e_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1));
        __m256d s_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(sh)), s_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(sh, 1));
        z = _mm256_add_pd(z, _mm256_add_pd(e_lo, e_hi));
        zs = _mm256_fmadd_pd(e_lo, s_lo, _mm256_fmadd_pd(e_hi, s_hi, zs));
    }
    double zt = hsum4d(z), zst = hsum4d(zs);
    for (int64_t i = n8; i < n; i++) {
        float sh = x[i] - mx;
        x[i] = expf(sh);
        zt += x[i];
        zst += (double)x[i] * sh;
    }
    const __m256 inv = _mm256_set1_ps((float)(1.0 / zt));
    for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (int64_t i = n8; i < n; i++) x[i] *= (float)(1.0 / zt);
    if (lse) *lse = log(zt) + mx;
    return (float)(log(zt) - zst / zt);
}

/* As the AVX2 kernel, 16 lanes wide; the row's tail is one masked block (masked-off lanes
 * contribute exact zeros to both sums), so no element goes through libm. */
SL_AVX512 static float softmax_entropy_avx512(float *x, int64_t n, double *lse) {
    __m512 vmax = _mm512_set1_ps(x[0]);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes16(n - i);
        vmax = _mm512_mask_max_ps(vmax, k, vmax, _mm512_maskz_loadu_ps(k, x + i));
    }
    const float mx = _mm512_reduce_max_ps(vmax);
    const __m512 m = _mm512_set1_ps(mx);
    __m512d z = _mm512_setzero_pd(), zs = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes16(n - i);
        const __m512 sh = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + i), m);
        const __m512 e = _mm512_maskz_mov_ps(k, exp16(sh));
        _mm512_mask_storeu_ps(x + i, k, e);
        const __m512d e_lo = lo8d(e), e_hi = hi8d(e);
        z = _mm512_add_pd(z, _mm512_add_pd(e_lo, e_hi));
        zs = _mm512_fmadd_pd(e_lo, lo8d(sh), _mm512_fmadd_pd(e_hi, hi8d(sh), zs));
    }
    const double zt = _mm512_reduce_add_pd(z), zst = _mm512_reduce_add_pd(zs);
    const __m512 inv = _mm512_set1_ps((float)(1.0 / zt));
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes16(n - i);
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
    }
    if (lse) *lse = log(zt) + mx;
    return (float)(log(zt) - zst / zt);
}

/* RMSNorm of one row; returns 1/rms. The squares of floats are exact in double, so only the
 * summation order (4 lanes, then the scalar tail) differs from the portable loop. */
SL_AVX2 static float rmsnorm_row_avx2(float *o, const float *xr, const float *w, int64_t d, float eps) {
    const int64_t d8 = d & ~(int64_t)7;
    __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
    for (int64_t i = 0; i < d8; i += 8) {
        const __m256 v = _mm256_loadu_ps(xr + i);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a = _mm256_fmadd_pd(lo, lo, a);
        b = _mm256_fmadd_pd(hi, hi, b);
    }
    double ss = hsum4d(_mm256_add_pd(a, b));
    for (int64_t i = d8; i < d; i++) ss += (double)xr[i] * xr[i];
    const float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    const __m256 vi = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < d8; i += 8)
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), vi)));
    for (int64_t i = d8; i < d; i++) o[i] = w[i] * (xr[i] * inv);
    return inv;
}

SL_AVX512 static float rmsnorm_row_avx512(float *o, const float *xr, const float *w, int64_t d, float eps) {
    __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
    for (int64_t i = 0; i < d; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(lanes16(d - i), xr + i);
        const __m512d lo = lo8d(v), hi = hi8d(v);
        a = _mm512_fmadd_pd(lo, lo, a);
        b = _mm512_fmadd_pd(hi, hi, b);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(a, b));
    const float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    const __m512 vi = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 k = lanes16(d - i);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + i), _mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + i), vi));
        _mm512_mask_storeu_ps(o + i, k, v);
    }
    return inv;
}

/* h = (g / (1 + exp(-g))) * u on n elements: the portable expression with the vector exp. The
 * tail goes through the same vector code on a zero-padded copy. */
SL_AVX2 static inline __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 e = exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

SL_AVX2 static void swiglu_avx2(float *h, const float *g, const float *u, int64_t n) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(h + i, swiglu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (n8 == n) return;
    float gt[8] = {0}, ut[8] = {0}, ht[8];
    memcpy(gt, g + n8, (size_t)(n - n8) * sizeof(float));
    memcpy(ut, u + n8, (size_t)(n - n8) * sizeof(float));
    _mm256_storeu_ps(ht, swiglu8(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut)));
    memcpy(h + n8, ht, (size_t)(n - n8) * sizeof(float));
}

SL_AVX512 static void swiglu_avx512(float *h, const float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), neg = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(k, g + i);
        const __m512 e = exp16(_mm512_xor_ps(x, neg));
        const __m512 r = _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(k, u + i));
        _mm512_mask_storeu_ps(h + i, k, r);
    }
}

/* out = a + b (out may alias a): one rounding per element on every path, so these agree
 * bitwise with the portable loop. */
SL_AVX2 static void add_avx2(float *out, const float *a, const float *b, int64_t n) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8)
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (int64_t i = n8; i < n; i++) out[i] = a[i] + b[i];
}

SL_AVX512 static void add_avx512(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes16(n - i);
        _mm512_mask_storeu_ps(out + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i)));
    }
}

/* LayerNorm statistics of one row, sums in double as in the portable path (only their order
 * differs: lanes, then the lane reduction). Masked-off lanes add exact zeros. */
SL_AVX2 static void layernorm_stats_avx2(float *mean, float *rstd, const float *xr, int64_t d, float eps) {
    const int64_t d8 = d & ~(int64_t)7;
    __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
    for (int64_t i = 0; i < d8; i += 8) {
        const __m256 v = _mm256_loadu_ps(xr + i);
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    double s = hsum4d(_mm256_add_pd(a, b));
    for (int64_t i = d8; i < d; i++) s += xr[i];
    const double mu = s / (double)d;
    const __m256d vmu = _mm256_set1_pd(mu);
    a = _mm256_setzero_pd();
    b = _mm256_setzero_pd();
    for (int64_t i = 0; i < d8; i += 8) {
        const __m256 v = _mm256_loadu_ps(xr + i);
        const __m256d lo = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vmu);
        const __m256d hi = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vmu);
        a = _mm256_fmadd_pd(lo, lo, a);
        b = _mm256_fmadd_pd(hi, hi, b);
    }
    double ss = hsum4d(_mm256_add_pd(a, b));
    for (int64_t i = d8; i < d; i++) {
        const double c = (double)xr[i] - mu;
        ss += c * c;
    }
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
}

/* ((x - m) * r) * w (+ b): the portable operations lane for lane (no FMA), so the same bits;
 * the scalar tail runs the same operations. */
SL_AVX2 static void layernorm_apply_avx2(float *o, const float *xr, const float *w, const float *b, int64_t d,
                                         float m, float r) {
    const int64_t d8 = d & ~(int64_t)7;
    const __m256 vm = _mm256_set1_ps(m), vr = _mm256_set1_ps(r);
    for (int64_t i = 0; i < d8; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vm), vr), _mm256_loadu_ps(w + i));
        if (b) v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(o + i, v);
    }
    for (int64_t i = d8; i < d; i++) {
        const float v = (xr[i] - m) * r * w[i];
        o[i] = b ? v + b[i] : v;
    }
}

SL_AVX512 static void layernorm_stats_avx512(float *mean, float *rstd, const float *xr, int64_t d, float eps) {
    __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
    for (int64_t i = 0; i < d; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(lanes16(d - i), xr + i);
        a = _mm512_add_pd(a, lo8d(v));
        b = _mm512_add_pd(b, hi8d(v));
    }
    const double mu = _mm512_reduce_add_pd(_mm512_add_pd(a, b)) / (double)d;
    const __m512d vmu = _mm512_set1_pd(mu);
    a = _mm512_setzero_pd();
    b = _mm512_setzero_pd();
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 k = lanes16(d - i);
        const __m512 v = _mm512_maskz_loadu_ps(k, xr + i);
        const __m512d lo = _mm512_maskz_sub_pd((__mmask8)(k & 0xFF), lo8d(v), vmu);
        const __m512d hi = _mm512_maskz_sub_pd((__mmask8)(k >> 8), hi8d(v), vmu);
        a = _mm512_fmadd_pd(lo, lo, a);
        b = _mm512_fmadd_pd(hi, hi, b);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(a, b));
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
}

SL_AVX512 static void layernorm_apply_avx512(float *o, const float *xr, const float *w, const float *b, int64_t d,
                                           float m, float r) {
    const __m512 vm = _mm512_set1_ps(m), vr = _mm512_set1_ps(r);
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 k = lanes16(d - i);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + i), vm), vr),
                                 _mm512_maskz_loadu_ps(k, w + i));
        if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, b + i));
        _mm512_mask_storeu_ps(o + i, k, v);
    }
}

/* GELU-tanh as x / (1 + exp(-2z)): the portable expression with the vector exp; z is computed
 * by the same float operations. */
SL_AVX2 static inline __m256 gelu_tanh8(__m256 x) {
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 z = _mm256_mul_ps(_mm256_set1_ps(SL_GELU_BETA), _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(SL_GELU_KAPPA), x3)));
    const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), z));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

SL_AVX512 static inline __m512 gelu_tanh16(__m512 x) {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 z = _mm512_mul_ps(_mm512_set1_ps(SL_GELU_BETA), _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(SL_GELU_KAPPA), x3)));
    const __m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), z));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* tanh on 8 lanes, Cephes' single-precision tanhf (a few ulp): an odd polynomial below 0.625,
 * 1 - 2 / (exp(2|x|) + 1) with the sign restored above (the exp clamp keeps it finite: 1). */
SL_AVX2 static inline __m256 tanh8(__m256 x) {
    const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
    const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                     _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(exp8(_mm256_add_ps(ax, ax)), _mm256_set1_ps(1.0f))));
    const __m256 s = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_add_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(-3.33332819422e-1f));
    const __m256 small = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, s), x), x);
    const __m256 is_big = _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_GE_OQ);
    return _mm256_blendv_ps(small, _mm256_or_ps(big, sign), is_big);
}

SL_AVX512 static inline __m512 tanh16(__m512 x) {
    const __m512 sign = _mm512_and_ps(x, _mm512_set1_ps(-0.0f));
    const __m512 ax = _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x);
    const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                                     _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(exp16(_mm512_add_ps(ax, ax)), _mm512_set1_ps(1.0f))));
    const __m512 s = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
    p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(2.06390887954e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(-5.37397155531e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(1.33314422036e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(-3.33332819422e-1f));
    const __m512 small = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, s), x), x);
    const __mmask16 is_big = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_GE_OQ);
    return _mm512_mask_blend_ps(is_big, small, _mm512_or_ps(big, sign));
}

/* Elementwise kernels: AVX-512 masks the tail; AVX2 runs it through the same vector code on a
 * zero-padded copy (as swiglu_avx2), so no element depends on where a chunk ends. */
SL_AVX2 static void gelu_tanh_avx2(float *h, const float *u, int64_t n) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(h + i, gelu_tanh8(_mm256_loadu_ps(u + i)));
    if (n8 == n) return;
    float ut[8] = {0}, ht[8];
    memcpy(ut, u + n8, (size_t)(n - n8) * sizeof(float));
    _mm256_storeu_ps(ht, gelu_tanh8(_mm256_loadu_ps(ut)));
    memcpy(h + n8, ht, (size_t)(n - n8) * sizeof(float));
}

SL_AVX512 static void gelu_tanh_avx512(float *h, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes16(n - i);
        _mm512_mask_storeu_ps(h + i, k, gelu_tanh16(_mm512_maskz_loadu_ps(k, u + i)));
    }
}

SL_AVX2 static void geglu_tanh_avx2(float *h, const float *g, const float *u, int64_t n) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8)
        _mm256_storeu_ps(h + i, _mm256_mul_ps(gelu_tanh8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    if (n8 == n) return;
    float gt[8] = {0}, ut[8] = {0}, ht[8];
    memcpy(gt, g + n8, (size_t)(n - n8) * sizeof(float));
    memcpy(ut, u + n8, (size_t)(n - n8) * sizeof(float));
    _mm256_storeu_ps(ht, _mm256_mul_ps(gelu_tanh8(_mm256_loadu_ps(gt)), _mm256_loadu_ps(ut)));
    memcpy(h + n8, ht, (size_t)(n - n8) * sizeof(float));
}

SL_AVX512 static void geglu_tanh_avx512(float *h, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes16(n - i);
        const __m512 v = _mm512_mul_ps(gelu_tanh16(_mm512_maskz_loadu_ps(k, g + i)), _mm512_maskz_loadu_ps(k, u + i));
        _mm512_mask_storeu_ps(h + i, k, v);
    }
}

/* cap * tanh(x / cap), the portable operations around the vector tanh. */
SL_AVX2 static void softcap_avx2(float *x, int64_t n, float cap) {
    const __m256 c = _mm256_set1_ps(cap);
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(x + i), c))));
    if (n8 == n) return;
    float t[8] = {0};
    memcpy(t, x + n8, (size_t)(n - n8) * sizeof(float));
    _mm256_storeu_ps(t, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(t), c))));
    memcpy(x + n8, t, (size_t)(n - n8) * sizeof(float));
}

SL_AVX512 static void softcap_avx512(float *x, int64_t n, float cap) {
    const __m512 c = _mm512_set1_ps(cap);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = lanes16(n - i);
        const __m512 v = _mm512_mul_ps(c, tanh16(_mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), c)));
        _mm512_mask_storeu_ps(x + i, k, v);
    }
}
#endif

/* ------------------------------------------------------------------------------------------
 * Portable row kernels and the dispatchers. */

typedef float (*rmsnorm_row_fn)(float *, const float *, const float *, int64_t, float);
typedef void (*elementwise2_fn)(float *, const float *, const float *, int64_t);

static float rmsnorm_row_generic(float *o, const float *xr, const float *w, int64_t d, float eps) {
    double ss = 0.0; /* double: the mean of squares is the one reduction that matters here */
    for (int64_t i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
    const float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    for (int64_t i = 0; i < d; i++) o[i] = w[i] * (xr[i] * inv);
    return inv;
}

static rmsnorm_row_fn rmsnorm_row_for(sl_simd_level level) {
#if SL_X86
    if (level >= SL_SIMD_AVX512) return rmsnorm_row_avx512;
    if (level >= SL_SIMD_AVX2) return rmsnorm_row_avx2;
#endif
    (void)level;
    return rmsnorm_row_generic;
}

static void swiglu_generic(float *h, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        h[i] = (x / (1.0f + expf(-x))) * u[i];
    }
}

static elementwise2_fn swiglu_for(sl_simd_level level) {
#if SL_X86
    if (level >= SL_SIMD_AVX512) return swiglu_avx512;
    if (level >= SL_SIMD_AVX2) return swiglu_avx2;
#endif
    (void)level;
    return swiglu_generic;
}

static void add_generic(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static elementwise2_fn add_for(sl_simd_level level) {
#if SL_X86
    if (level >= SL_SIMD_AVX512) return add_avx512;
    if (level >= SL_SIMD_AVX2) return add_avx2;
#endif
    (void)level;
    return add_generic;
}

/* out = f(a, b) elementwise over n, in SL_CHUNK pieces split over threads. */
static void elementwise_chunks(elementwise2_fn f, float *out, const float *a, const float *b, int64_t n) {
    const int64_t chunks = (n + SL_CHUNK - 1) / SL_CHUNK;
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t i0 = c * SL_CHUNK, len = n - i0 < SL_CHUNK ? n - i0 : SL_CHUNK;
        f(out + i0, a + i0, b + i0, len);
    }
}

void sl_rmsnorm(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps) {
    const rmsnorm_row_fn row = rmsnorm_row_for(sl_simd());
#pragma omp parallel for schedule(static) if (T * d > 32768) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) {
        const float inv = row(out + t * d, x + t * d, w, d, eps);
        if (rstd) rstd[t] = inv;
    }
}

/* The residual add that closes a block and the RMSNorm that opens the next, in one parallel
 * region instead of two: row t is x[t] += y[t] and then out[t] = rmsnorm(x[t]), both by one
 * thread, with the kernels sl_add_inplace and sl_rmsnorm use (the add is exact elementwise and
 * each row's sum of squares keeps its order), so the bits are those of the two calls. out may be
 * y (the block's output is read before its row is overwritten). */
void sl_residual_rmsnorm(float *x, const float *y, float *out, float *rstd, const float *w, int64_t T, int64_t d,
                         float eps) {
    const sl_simd_level level = sl_simd();
    const rmsnorm_row_fn row = rmsnorm_row_for(level);
    const elementwise2_fn add = add_for(level);
#pragma omp parallel for schedule(static) if (T * d > 32768) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) {
        add(x + t * d, x + t * d, y + t * d, d);
        const float inv = row(out + t * d, x + t * d, w, d, eps);
        if (rstd) rstd[t] = inv;
    }
}

/* y = w * x * r with r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / d, so
 *   dx_j = r * (w_j dy_j - x_j * r^2 * sum_i(w_i dy_i x_i) / d),   dw_i += dy_i * x_i * r. */
void sl_rmsnorm_backward(float *dx, int accumulate, float *dw, const float *dy, const float *x,
                         const float *w, const float *rstd, int64_t rows, int64_t T, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768) num_threads(sl_num_threads())
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r % T;
        const float *xr = x + t * d, *g = dy + r * d;
        float *o = dx + r * d;
        const float inv = rstd[t];
        double dot = 0.0;
        for (int64_t i = 0; i < d; i++) dot += (double)w[i] * g[i] * xr[i];
        const float c = (float)(dot * (double)inv * (double)inv / (double)d);
        for (int64_t i = 0; i < d; i++) {
            const float v = inv * (w[i] * g[i] - xr[i] * c);
            o[i] = accumulate ? o[i] + v : v;
        }
    }
    if (!dw) return;
    /* One chain per weight over rows in order: the same sum for any thread count. */
#pragma omp parallel for schedule(static) if (rows * d > 32768) num_threads(sl_num_threads())
    for (int64_t i = 0; i < d; i++) {
        float acc = dw[i];
        for (int64_t r = 0; r < rows; r++) {
            const int64_t t = r % T;
            acc += dy[r * d + i] * (x[t * d + i] * rstd[t]);
        }
        dw[i] = acc;
    }
}

/* Forward-mode derivative of the norm along dx: the same linear map as the backward (the
 * norm's Jacobian w r (I - r^2 x x^T / d) is symmetric up to the diagonal weight). */
void sl_rmsnorm_jvp(float *dy, const float *dx, const float *x, const float *w, const float *rstd,
                    int64_t rows, int64_t T, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768) num_threads(sl_num_threads())
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r % T;
        const float *xr = x + t * d, *g = dx + r * d;
        float *o = dy + r * d;
        const float inv = rstd[t];
        double dot = 0.0;
        for (int64_t i = 0; i < d; i++) dot += (double)xr[i] * g[i];
        const float c = (float)(dot * (double)inv * (double)inv / (double)d);
        for (int64_t i = 0; i < d; i++) o[i] = w[i] * inv * (g[i] - xr[i] * c);
    }
}

void sl_rope_tables(float *cosv, float *sinv, const float *inv_freq, int64_t T, int64_t half) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            cosv[t * half + i] = (float)cos((double)angle);
            sinv[t * half + i] = (float)sin((double)angle);
        }
}

/* Rotation by +angle (forward, and its JVP: RoPE is linear) or by -angle (the backward: the
 * transpose of a rotation is its inverse). */
static void rope_row(float *x, int64_t n_heads, int64_t head_dim, const float *c, const float *s, int layout,
                     float sign) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = x + h * head_dim;
        for (int64_t i = 0; i < half; i++) {
            int64_t a = layout == SL_ROPE_ADJACENT ? 2 * i : i;
            int64_t b = layout == SL_ROPE_ADJACENT ? 2 * i + 1 : i + half;
            float x0 = v[a], x1 = v[b], sn = sign * s[i];
            v[a] = x0 * c[i] - x1 * sn;
            v[b] = x1 * c[i] + x0 * sn;
        }
    }
}

static void rope_rotate(float *x, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                        const float *cosv, const float *sinv, int layout, float sign) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (T * n_heads * head_dim > 32768) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) rope_row(x + t * stride, n_heads, head_dim, cosv + t * half, sinv + t * half,
                                             layout, sign);
}

void sl_rope_apply(float *x, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                   const float *cosv, const float *sinv, int layout) {
    rope_rotate(x, T, stride, n_heads, head_dim, cosv, sinv, layout, 1.0f);
}

void sl_rope_row(float *x, int64_t n_heads, int64_t head_dim, const float *cosv, const float *sinv, int layout) {
    rope_row(x, n_heads, head_dim, cosv, sinv, layout, 1.0f);
}

/* RoPE of a layer's queries and keys in one parallel region (two with sl_rope_apply): row t of
 * q, then row t of k, by one thread; each element is rotated by the same two products as in
 * sl_rope_apply, so the bits are the same. */
void sl_rope_apply_qk(float *q, int64_t q_stride, int64_t q_heads, float *k, int64_t k_stride, int64_t k_heads,
                      int64_t T, int64_t head_dim, const float *cosv, const float *sinv, int layout) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (T * (q_heads + k_heads) * head_dim > 32768) \
    num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) {
        rope_row(q + t * q_stride, q_heads, head_dim, cosv + t * half, sinv + t * half, layout, 1.0f);
        rope_row(k + t * k_stride, k_heads, head_dim, cosv + t * half, sinv + t * half, layout, 1.0f);
    }
}

void sl_rope_backward(float *dx, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                      const float *cosv, const float *sinv, int layout) {
    rope_rotate(dx, T, stride, n_heads, head_dim, cosv, sinv, layout, -1.0f);
}

void sl_swiglu(float *h, const float *g, const float *u, int64_t n) {
    elementwise_chunks(swiglu_for(sl_simd()), h, g, u, n);
}

/* silu(g) = g s with s = sigmoid(g); silu'(g) = s (1 + g (1 - s)). The partial derivatives of
 * h = silu(g) u are taken once per sequence, so a batch of directions costs two multiplies each. */
void sl_swiglu_partials(float *dh_dg, float *dh_du, const float *g, const float *u, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i], s = 1.0f / (1.0f + expf(-x));
        dh_dg[i] = u[i] * (s * (1.0f + x * (1.0f - s)));
        dh_du[i] = x * s;
    }
}

void sl_swiglu_backward(float *dg, float *du, const float *dh, const float *dh_dg, const float *dh_du,
                        int64_t n, int64_t period) {
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t r = 0; r < n / period; r++) {
        const float *h = dh + r * period;
        float *og = dg ? dg + r * period : NULL, *ou = du + r * period;
        if (og)
            for (int64_t i = 0; i < period; i++) og[i] = h[i] * dh_dg[i];
        for (int64_t i = 0; i < period; i++) ou[i] = h[i] * dh_du[i];
    }
}

void sl_swiglu_jvp(float *dh, const float *dg, const float *du, const float *dh_dg, const float *dh_du,
                   int64_t n, int64_t period) {
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t r = 0; r < n / period; r++) {
        const float *u = du + r * period;
        float *o = dh + r * period;
        if (dg && dh_dg) {
            const float *g = dg + r * period;
            for (int64_t i = 0; i < period; i++) o[i] = g[i] * dh_dg[i] + u[i] * dh_du[i];
        } else { /* plain activation: h depends on u alone */
            for (int64_t i = 0; i < period; i++) o[i] = u[i] * dh_du[i];
        }
    }
}

static float softmax_entropy_generic(float *x, int64_t n, double *lse) {
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double z = 0.0, zs = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float shifted = x[i] - mx;
        x[i] = expf(shifted);
        z += x[i];
        zs += (double)x[i] * shifted;
    }
    float inv = (float)(1.0 / z);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
    if (lse) *lse = log(z) + mx;
    return (float)(log(z) - zs / z);
}


/* The softmax kernel of this CPU's level; lse (NULL or out) receives log sum exp(x) in double. */
static float softmax_kernel(float *x, int64_t n, double *lse) {
#if SL_X86
    const sl_simd_level level = sl_simd();
    if (level >= SL_SIMD_AVX512) return softmax_entropy_avx512(x, n, lse);
    if (level >= SL_SIMD_AVX2) return softmax_entropy_avx2(x, n, lse);
#endif
    return softmax_entropy_generic(x, n, lse);
}

float sl_softmax_entropy(float *x, int64_t n) { return n <= 0 ? 0.0f : softmax_kernel(x, n, NULL); }

/* The sink's share leaves each key the fraction c = Z / (Z + e^s) of its softmax probability
 * (Z = sum exp(x)), so the vectorised softmax and one scale give the variant: p'_j = c p_j and
 * H' = -sum p'_j log p'_j = c (H - log c). */
float sl_softmax_sink_entropy(float *x, int64_t n, float sink) {
    if (n <= 0) return 0.0f;
    double lse = 0.0;
    const double h = softmax_kernel(x, n, &lse);
    const double c = 1.0 / (1.0 + exp((double)sink - lse));
    const float cf = (float)c;
    for (int64_t i = 0; i < n; i++) x[i] *= cf;
    return c > 0.0 ? (float)(c * (h - log(c))) : 0.0f;
}

double sl_softmax_lse(float *x, int64_t n) {
    double lse = 0.0;
    if (n > 0) softmax_kernel(x, n, &lse);
    return lse;
}

void sl_add_inplace(float *x, const float *y, int64_t n) {
    elementwise_chunks(add_for(sl_simd()), x, x, y, n);
}

void sl_embed(float *out, const float *table, const int64_t *ids, int64_t T, int64_t d) {
    for (int64_t t = 0; t < T; t++) memcpy(out + t * d, table + ids[t] * d, (size_t)d * sizeof(float));
}

/* Serial in position order: a repeated token sums its rows in one fixed order. */
void sl_embed_backward(float *dtable, const float *dout, const int64_t *ids, int64_t T, int64_t d) {
    for (int64_t t = 0; t < T; t++) {
        float *row = dtable + ids[t] * d;
        const float *g = dout + t * d;
        for (int64_t i = 0; i < d; i++) row[i] += g[i];
    }
}

/* ------------------------------------------------------------------------------------------
 * LayerNorm, biases, soft-capping and the GELU family (model families beyond LLaMA). */

/* The row's mean and 1/sqrt(var + eps), sums in double (two passes: the shifted squares do not
 * cancel the way E[x^2] - E[x]^2 would). */
static void layernorm_stats_generic(float *mean, float *rstd, const float *xr, int64_t d, float eps) {
    double s = 0.0;
    for (int64_t i = 0; i < d; i++) s += xr[i];
    const double mu = s / (double)d;
    double ss = 0.0;
    for (int64_t i = 0; i < d; i++) {
        const double c = (double)xr[i] - mu;
        ss += c * c;
    }
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
}

/* out = ((x - mean) * rstd) * w (+ b), one rounding per operation, no FMA: every path computes
 * these bits from the same mean and rstd. */
static void layernorm_apply_generic(float *o, const float *xr, const float *w, const float *b, int64_t d,
                                    float m, float r) {
    if (b)
        for (int64_t i = 0; i < d; i++) o[i] = (xr[i] - m) * r * w[i] + b[i];
    else
        for (int64_t i = 0; i < d; i++) o[i] = (xr[i] - m) * r * w[i];
}

typedef void (*layernorm_stats_fn)(float *, float *, const float *, int64_t, float);
typedef void (*layernorm_apply_fn)(float *, const float *, const float *, const float *, int64_t, float, float);

typedef struct {
    layernorm_stats_fn stats;
    layernorm_apply_fn apply;
} layernorm_kernels;

static layernorm_kernels layernorm_for(sl_simd_level level) {
    layernorm_kernels k = {layernorm_stats_generic, layernorm_apply_generic};
#if SL_X86
    if (level >= SL_SIMD_AVX512) {
        k.stats = layernorm_stats_avx512;
        k.apply = layernorm_apply_avx512;
    } else if (level >= SL_SIMD_AVX2) {
        k.stats = layernorm_stats_avx2;
        k.apply = layernorm_apply_avx2;
    }
#endif
    (void)level;
    return k;
}

static void layernorm_row(layernorm_kernels k, float *o, float *mean, float *rstd, const float *xr, const float *w,
                          const float *b, int64_t d, float eps) {
    float m, r;
    k.stats(&m, &r, xr, d, eps);
    k.apply(o, xr, w, b, d, m, r);
    if (mean) *mean = m;
    if (rstd) *rstd = r;
}

void sl_layernorm(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                  int64_t T, int64_t d, float eps) {
    const layernorm_kernels k = layernorm_for(sl_simd());
#pragma omp parallel for schedule(static) if (T * d > 32768) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++)
        layernorm_row(k, out + t * d, mean ? mean + t : NULL, rstd ? rstd + t : NULL, x + t * d, w, b, d, eps);
}

/* sl_residual_rmsnorm with a LayerNorm: x[t] += y[t], out[t] = layernorm(x[t]), one region. */
void sl_residual_layernorm(float *x, const float *y, float *out, float *mean, float *rstd, const float *w,
                           const float *b, int64_t T, int64_t d, float eps) {
    const sl_simd_level level = sl_simd();
    const layernorm_kernels k = layernorm_for(level);
    const elementwise2_fn add = add_for(level);
#pragma omp parallel for schedule(static) if (T * d > 32768) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) {
        add(x + t * d, x + t * d, y + t * d, d);
        layernorm_row(k, out + t * d, mean ? mean + t : NULL, rstd ? rstd + t : NULL, x + t * d, w, b, d, eps);
    }
}

/* One LayerNorm Jacobian product for a row. With xh = (x - mean) r and v = w_in * vin,
 *   o = w_out * r (v - mean(v) - xh mean(v xh)).
 * The normalisation's Jacobian r (I - 1 1^T / d - xh xh^T / d) is symmetric, so the backward
 * (w_in = w, w_out = NULL: J^T dy) and the JVP (w_in = NULL, w_out = w: J dx) share it. The two
 * dot products are summed in double over the row in order. */
static void layernorm_jac_row(float *o, int accumulate, const float *vin, const float *w_in, const float *w_out,
                              const float *xr, int64_t d, float m, float r) {
    double sv = 0.0, svx = 0.0;
    for (int64_t i = 0; i < d; i++) {
        const float v = w_in ? w_in[i] * vin[i] : vin[i], xh = (xr[i] - m) * r;
        sv += v;
        svx += (double)v * xh;
    }
    const float a = (float)(sv / (double)d), c = (float)(svx / (double)d);
    for (int64_t i = 0; i < d; i++) {
        const float v = w_in ? w_in[i] * vin[i] : vin[i], xh = (xr[i] - m) * r;
        float val = r * (v - a - xh * c);
        if (w_out) val *= w_out[i];
        o[i] = accumulate ? o[i] + val : val;
    }
}

/* Column blocks for the weight/bias gradient sums: each column's sum runs over the rows in
 * order in one thread (any thread count gives the same bits), and a block's rows are read
 * contiguously. */
#define SL_COLBLOCK 256

void sl_layernorm_backward(float *dx, int accumulate, float *dw, float *db, const float *dy, const float *x,
                           const float *w, const float *mean, const float *rstd, int64_t rows, int64_t T,
                           int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768) num_threads(sl_num_threads())
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r % T;
        layernorm_jac_row(dx + r * d, accumulate, dy + r * d, w, NULL, x + t * d, d, mean[t], rstd[t]);
    }
    if (!dw && !db) return;
    const int64_t blocks = (d + SL_COLBLOCK - 1) / SL_COLBLOCK;
#pragma omp parallel for schedule(static) if (rows * d > 32768) num_threads(sl_num_threads())
    for (int64_t bk = 0; bk < blocks; bk++) {
        const int64_t i0 = bk * SL_COLBLOCK, n = d - i0 < SL_COLBLOCK ? d - i0 : SL_COLBLOCK;
        double aw[SL_COLBLOCK], ab[SL_COLBLOCK];
        for (int64_t i = 0; i < n; i++) {
            aw[i] = dw ? dw[i0 + i] : 0.0;
            ab[i] = db ? db[i0 + i] : 0.0;
        }
        for (int64_t r = 0; r < rows; r++) {
            const int64_t t = r % T;
            const float *g = dy + r * d + i0, *xr = x + t * d + i0;
            const float m = mean[t], rs = rstd[t];
            for (int64_t i = 0; i < n; i++) {
                aw[i] += (double)g[i] * ((xr[i] - m) * rs);
                ab[i] += g[i];
            }
        }
        for (int64_t i = 0; i < n; i++) {
            if (dw) dw[i0 + i] = (float)aw[i];
            if (db) db[i0 + i] = (float)ab[i];
        }
    }
}

void sl_layernorm_jvp(float *dy, const float *dx, const float *x, const float *w, const float *mean,
                      const float *rstd, int64_t rows, int64_t T, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768) num_threads(sl_num_threads())
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r % T;
        layernorm_jac_row(dy + r * d, 0, dx + r * d, NULL, w, x + t * d, d, mean[t], rstd[t]);
    }
}

void sl_bias_add(float *x, const float *b, int64_t T, int64_t d, int64_t ld) {
    const elementwise2_fn add = add_for(sl_simd());
#pragma omp parallel for schedule(static) if (T * d > 65536) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) add(x + t * ld, x + t * ld, b, d);
}

void sl_bias_backward(float *db, const float *dy, int64_t rows, int64_t d, int64_t ld) {
    const int64_t blocks = (d + SL_COLBLOCK - 1) / SL_COLBLOCK;
#pragma omp parallel for schedule(static) if (rows * d > 65536) num_threads(sl_num_threads())
    for (int64_t bk = 0; bk < blocks; bk++) {
        const int64_t i0 = bk * SL_COLBLOCK, n = d - i0 < SL_COLBLOCK ? d - i0 : SL_COLBLOCK;
        double acc[SL_COLBLOCK];
        for (int64_t i = 0; i < n; i++) acc[i] = db[i0 + i];
        for (int64_t r = 0; r < rows; r++) {
            const float *g = dy + r * ld + i0;
            for (int64_t i = 0; i < n; i++) acc[i] += g[i];
        }
        for (int64_t i = 0; i < n; i++) db[i0 + i] = (float)acc[i];
    }
}

/* Soft-capping and its derivative, 1 - tanh^2 = 1 - (y / cap)^2 from the output. cap <= 0 (the
 * configuration's "none") leaves x as it is. */
static void softcap_generic(float *x, int64_t n, float cap) {
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void sl_softcap(float *x, int64_t n, float cap) {
    if (!(cap > 0.0f)) return;
    void (*f)(float *, int64_t, float) = softcap_generic;
#if SL_X86
    const sl_simd_level level = sl_simd();
    if (level >= SL_SIMD_AVX512) f = softcap_avx512;
    else if (level >= SL_SIMD_AVX2) f = softcap_avx2;
#endif
    const int64_t chunks = (n + SL_CHUNK - 1) / SL_CHUNK;
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t i0 = c * SL_CHUNK;
        f(x + i0, n - i0 < SL_CHUNK ? n - i0 : SL_CHUNK, cap);
    }
}

void sl_softcap_backward(float *dx, const float *dy, const float *y, int64_t n, float cap) {
    if (!(cap > 0.0f)) {
        if (dx != dy) memcpy(dx, dy, (size_t)n * sizeof(float));
        return;
    }
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t i = 0; i < n; i++) {
        const float t = y[i] / cap;
        dx[i] = dy[i] * (1.0f - t * t);
    }
}

/* GELU with the tanh approximation, 0.5 x (1 + tanh(z)) with z = sqrt(2/pi) (x + 0.044715 x^3),
 * computed as x sigmoid(2z) = x / (1 + exp(-2z)) (the same function: 1 + tanh(z) = 2 sigmoid(2z)),
 * which has no cancellation for negative x and needs only exp on the vector paths. z is
 * computed as torch does, in float. */

static inline float gelu_tanh_arg(float x) { return SL_GELU_BETA * (x + SL_GELU_KAPPA * (x * x * x)); }

static void gelu_tanh_generic(float *h, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = u[i];
        h[i] = x / (1.0f + expf(-2.0f * gelu_tanh_arg(x)));
    }
}

static void geglu_tanh_generic(float *h, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        h[i] = (x / (1.0f + expf(-2.0f * gelu_tanh_arg(x)))) * u[i];
    }
}

/* Exact GELU as torch writes it: x * 0.5 * (1 + erf(x / sqrt(2))). */
static void gelu_erf_generic(float *h, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = u[i];
        h[i] = x * 0.5f * (1.0f + erff(x * SL_INV_SQRT2));
    }
}

typedef void (*elementwise1_fn)(float *, const float *, int64_t);

static elementwise1_fn gelu_tanh_for(sl_simd_level level) {
#if SL_X86
    if (level >= SL_SIMD_AVX512) return gelu_tanh_avx512;
    if (level >= SL_SIMD_AVX2) return gelu_tanh_avx2;
#endif
    (void)level;
    return gelu_tanh_generic;
}

static elementwise2_fn geglu_tanh_for(sl_simd_level level) {
#if SL_X86
    if (level >= SL_SIMD_AVX512) return geglu_tanh_avx512;
    if (level >= SL_SIMD_AVX2) return geglu_tanh_avx2;
#endif
    (void)level;
    return geglu_tanh_generic;
}

static elementwise1_fn gelu_erf_for(sl_simd_level level) {
    (void)level;
    return gelu_erf_generic;
}

static void unary_chunks(elementwise1_fn f, float *out, const float *a, int64_t n) {
    const int64_t chunks = (n + SL_CHUNK - 1) / SL_CHUNK;
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t i0 = c * SL_CHUNK, len = n - i0 < SL_CHUNK ? n - i0 : SL_CHUNK;
        f(out + i0, a + i0, len);
    }
}

void sl_mlp_act(int act, float *h, const float *g, const float *u, int64_t n) {
    switch (act) {
    case SL_ACT_SWIGLU: sl_swiglu(h, g, u, n); break;
    case SL_ACT_GEGLU_TANH: elementwise_chunks(geglu_tanh_for(sl_simd()), h, g, u, n); break;
    case SL_ACT_GELU_TANH: unary_chunks(gelu_tanh_for(sl_simd()), h, u, n); break;
    case SL_ACT_GELU_ERF: unary_chunks(gelu_erf_for(sl_simd()), h, u, n); break;
    default: break; /* the model validates act when it is built */
    }
}

/* sl_mlp_act's kernels run on one stretch by the calling thread: every element gets the same
 * lane-wise sequence wherever a stretch starts (see the top of this file), so any split of the
 * n elements into stretches gives sl_mlp_act's bits. */
void sl_mlp_act_serial(int act, float *h, const float *g, const float *u, int64_t n) {
    const sl_simd_level level = sl_simd();
    switch (act) {
    case SL_ACT_SWIGLU: swiglu_for(level)(h, g, u, n); break;
    case SL_ACT_GEGLU_TANH: geglu_tanh_for(level)(h, g, u, n); break;
    case SL_ACT_GELU_TANH: gelu_tanh_for(level)(h, u, n); break;
    case SL_ACT_GELU_ERF: gelu_erf_for(level)(h, u, n); break;
    default: break;
    }
}

/* gelu_tanh'(x) = s + 2 x s (1 - s) z'(x) with s = sigmoid(2z), z' = sqrt(2/pi) (1 + 3 0.044715 x^2)
 * (from 1 + tanh = 2s and 1 - tanh^2 = 4 s (1 - s)); gelu_erf'(x) = Phi(x) + x phi(x). The value
 * returned in *val is the forward's portable expression, bit for bit. */
static inline float gelu_tanh_deriv(float x, float *val) {
    const float e = expf(-2.0f * gelu_tanh_arg(x));
    const float s = 1.0f / (1.0f + e);
    *val = x / (1.0f + e);
    const float dz = SL_GELU_BETA * (1.0f + 3.0f * SL_GELU_KAPPA * (x * x));
    return s + 2.0f * x * (s * (1.0f - s)) * dz;
}

static inline float gelu_erf_deriv(float x) {
    const float cdf = 0.5f * (1.0f + erff(x * SL_INV_SQRT2));
    const float pdf = expf(-0.5f * x * x) * SL_INV_SQRT_2PI;
    return cdf + x * pdf;
}

void sl_mlp_act_partials(int act, float *dh_dg, float *dh_du, const float *g, const float *u, int64_t n) {
    if (act == SL_ACT_SWIGLU) {
        sl_swiglu_partials(dh_dg, dh_du, g, u, n);
        return;
    }
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t i = 0; i < n; i++) {
        float val;
        switch (act) {
        case SL_ACT_GEGLU_TANH: {
            const float d = gelu_tanh_deriv(g[i], &val);
            dh_dg[i] = u[i] * d;
            dh_du[i] = val;
            break;
        }
        case SL_ACT_GELU_TANH: dh_du[i] = gelu_tanh_deriv(u[i], &val); break;
        case SL_ACT_GELU_ERF: dh_du[i] = gelu_erf_deriv(u[i]); break;
        default: break;
        }
    }
}

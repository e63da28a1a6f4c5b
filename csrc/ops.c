/* Row-wise ops of the LLaMA block. Loops are OpenMP over rows: each output is computed by one
 * thread in a fixed order, so results do not depend on the thread count. Team sizes come from
 * the call context (sl_num_threads), not from the calling thread's OpenMP setting. */
#include "ops.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "sl_common.h"

#if defined(__x86_64__) || defined(__i386__)
#define SL_X86 1
#include <immintrin.h>
#else
#define SL_X86 0
#endif

void sl_rmsnorm(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps) {
#pragma omp parallel for schedule(static) if (T * d > 32768) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * d;
        float *o = out + t * d;
        double ss = 0.0; /* double: the mean of squares is the one reduction that matters here */
        for (int64_t i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
        if (rstd) rstd[t] = inv;
        for (int64_t i = 0; i < d; i++) o[i] = w[i] * (xr[i] * inv);
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
static void rope_rotate(float *x, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                        const float *cosv, const float *sinv, int layout, float sign) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (T * n_heads * head_dim > 32768) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) {
        const float *c = cosv + t * half, *s = sinv + t * half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + t * stride + h * head_dim;
            for (int64_t i = 0; i < half; i++) {
                int64_t a = layout == SL_ROPE_ADJACENT ? 2 * i : i;
                int64_t b = layout == SL_ROPE_ADJACENT ? 2 * i + 1 : i + half;
                float x0 = v[a], x1 = v[b], sn = sign * s[i];
                v[a] = x0 * c[i] - x1 * sn;
                v[b] = x1 * c[i] + x0 * sn;
            }
        }
    }
}

void sl_rope_apply(float *x, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                   const float *cosv, const float *sinv, int layout) {
    rope_rotate(x, T, stride, n_heads, head_dim, cosv, sinv, layout, 1.0f);
}

void sl_rope_backward(float *dx, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                      const float *cosv, const float *sinv, int layout) {
    rope_rotate(dx, T, stride, n_heads, head_dim, cosv, sinv, layout, -1.0f);
}

void sl_swiglu(float *h, const float *g, const float *u, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        h[i] = (x / (1.0f + expf(-x))) * u[i];
    }
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
        float *og = dg + r * period, *ou = du + r * period;
        for (int64_t i = 0; i < period; i++) {
            og[i] = h[i] * dh_dg[i];
            ou[i] = h[i] * dh_du[i];
        }
    }
}

void sl_swiglu_jvp(float *dh, const float *dg, const float *du, const float *dh_dg, const float *dh_du,
                   int64_t n, int64_t period) {
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t r = 0; r < n / period; r++) {
        const float *g = dg + r * period, *u = du + r * period;
        float *o = dh + r * period;
        for (int64_t i = 0; i < period; i++) o[i] = g[i] * dh_dg[i] + u[i] * dh_du[i];
    }
}

static float softmax_entropy_generic(float *x, int64_t n) {
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
    return (float)(log(z) - zs / z);
}

#if SL_X86
/* exp on 8 lanes, Cephes' single-precision polynomial (about 1 ulp for the arguments <= 0 that
 * softmax produces); below -87.3 it returns a tiny positive value instead of 0 or a denormal. */
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
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

__attribute__((target("avx2,fma"))) static double hsum4d(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

__attribute__((target("avx2,fma"))) static float softmax_entropy_avx2(float *x, int64_t n) {
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
    return (float)(log(zt) - zst / zt);
}
#endif

float sl_softmax_entropy(float *x, int64_t n) {
    if (n <= 0) return 0.0f;
#if SL_X86
    if (sl_simd() >= SL_SIMD_AVX2) return softmax_entropy_avx2(x, n);
#endif
    return softmax_entropy_generic(x, n);
}

void sl_add_inplace(float *x, const float *y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536) num_threads(sl_num_threads())
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
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

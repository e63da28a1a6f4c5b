/* Row-wise ops of the LLaMA block. Loops are OpenMP over rows: each output is computed by one
 * thread in a fixed order, so results do not depend on the thread count. */
#include "ops.h"

#include <math.h>
#include <string.h>

void sl_rmsnorm(float *out, const float *x, const float *w, int64_t T, int64_t d, float eps) {
#pragma omp parallel for schedule(static) if (T * d > 32768)
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * d;
        float *o = out + t * d;
        double ss = 0.0; /* double: the mean of squares is the one reduction that matters here */
        for (int64_t i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
        for (int64_t i = 0; i < d; i++) o[i] = w[i] * (xr[i] * inv);
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

void sl_rope_apply(float *x, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                   const float *cosv, const float *sinv, int layout) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (T * n_heads * head_dim > 32768)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cosv + t * half, *s = sinv + t * half;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + t * stride + h * head_dim;
            for (int64_t i = 0; i < half; i++) {
                int64_t a = layout == SL_ROPE_ADJACENT ? 2 * i : i;
                int64_t b = layout == SL_ROPE_ADJACENT ? 2 * i + 1 : i + half;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c[i] - x1 * s[i];
                v[b] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}

void sl_swiglu(float *h, const float *g, const float *u, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        h[i] = (x / (1.0f + expf(-x))) * u[i];
    }
}

float sl_softmax_entropy(float *x, int64_t n) {
    if (n <= 0) return 0.0f;
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

void sl_embed(float *out, const float *table, const int64_t *ids, int64_t T, int64_t d) {
    for (int64_t t = 0; t < T; t++) memcpy(out + t * d, table + ids[t] * d, (size_t)d * sizeof(float));
}

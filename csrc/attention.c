/* Causal attention, one (head, block of queries) per task: scores = q kᵀ·scale via the serial
 * SGEMM, causal softmax per row, then out = P·V with Vᵀ packed once per call. Each output row is
 * produced by one task in a fixed order, so results are the same for any thread count. */
#include "attention.h"

#include <string.h>

#include "ops.h"
#include "sgemm.h"
#include "sl_common.h"

#define SL_ATTN_QBLOCK 64

/* Vᵀ per kv head: vt[(g*hd + e)*T + t] = v[t*kv_stride + g*hd + e], so P·V is an NT product. */
static void transpose_values(float *vt, const float *v, int64_t kv_stride, int64_t T,
                             int64_t n_kv, int64_t hd) {
#pragma omp parallel for schedule(static)
    for (int64_t ge = 0; ge < n_kv * hd; ge++)
        for (int64_t t = 0; t < T; t++) vt[ge * T + t] = v[t * kv_stride + ge];
}

/* Scores of queries [i0, i1) against keys [0, i1), masked and normalised in place: row r of
 * `p` (stride ld) becomes the attention distribution of query i0 + r. */
static int causal_probs_block(const sl_attn_shape *s, const float *qh, int64_t q_stride,
                              const float *kh, int64_t kv_stride, int64_t i0, int64_t i1,
                              float *p, int64_t ld) {
    const int64_t nk = i1; /* keys past the block's last query are never needed */
    SL_TRY(sl_sgemm_nt(i1 - i0, nk, s->head_dim, qh + i0 * q_stride, q_stride, kh, kv_stride, p,
                       ld, 0, 0));
    for (int64_t i = i0; i < i1; i++) {
        float *row = p + (i - i0) * ld;
        for (int64_t j = 0; j <= i; j++) row[j] *= s->scale;
        sl_softmax_inplace(row, i + 1);
        for (int64_t j = i + 1; j < ld; j++) row[j] = 0.0f;
    }
    return SL_OK;
}

int sl_attention_forward(const sl_attn_shape *s, const float *q, int64_t q_stride, const float *k,
                         const float *v, int64_t kv_stride, float *out, float *probs) {
    const int64_t T = s->T, H = s->n_heads, G = s->n_kv_heads, hd = s->head_dim;
    if (T <= 0 || H <= 0 || G <= 0 || hd <= 0 || H % G != 0)
        return sl_fail(SL_ERR_VALUE, "attention: bad shape T=%lld heads=%lld kv_heads=%lld",
                       (long long)T, (long long)H, (long long)G);
    const int64_t group = H / G, out_stride = H * hd;
    const int64_t n_blocks = (T + SL_ATTN_QBLOCK - 1) / SL_ATTN_QBLOCK;
    int64_t n_vt;
    if (!sl_mul_size(G * hd, T, &n_vt)) return sl_fail(SL_ERR_MEMORY, "attention: size overflow");
    float *vt = sl_alloc_floats(n_vt);
    if (!vt) return sl_fail(SL_ERR_MEMORY, "attention: cannot allocate %lld floats", (long long)n_vt);
    transpose_values(vt, v, kv_stride, T, G, hd);

    int status = SL_OK;
#pragma omp parallel
    {
        /* One scratch block per thread: SL_ATTN_QBLOCK rows of T scores, O(T) memory. */
        float *scratch = probs ? NULL : sl_alloc_floats(SL_ATTN_QBLOCK * T);
        int ok = probs != NULL || scratch != NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < H * n_blocks; task++) {
            if (!ok) continue;
            const int64_t h = task / n_blocks, b = task % n_blocks, g = h / group;
            const int64_t i0 = b * SL_ATTN_QBLOCK;
            const int64_t i1 = i0 + SL_ATTN_QBLOCK < T ? i0 + SL_ATTN_QBLOCK : T;
            /* With capture, the probabilities are computed in place in the caller's buffer. */
            float *p = probs ? probs + (h * T + i0) * T : scratch;
            int rc = causal_probs_block(s, q + h * hd, q_stride, k + g * hd, kv_stride, i0, i1, p, T);
            if (rc == SL_OK)
                rc = sl_sgemm_nt(i1 - i0, hd, i1, p, T, vt + g * hd * T, T, out + i0 * out_stride + h * hd,
                                 out_stride, 0, 0);
            if (rc != SL_OK) {
#pragma omp critical(sl_attn_err)
                status = rc;
            }
        }
        if (!ok) {
#pragma omp critical(sl_attn_err)
            status = sl_fail(SL_ERR_MEMORY, "attention: cannot allocate scratch of %lld floats",
                             (long long)(SL_ATTN_QBLOCK * T));
        }
        sl_free(scratch);
    }
    sl_free(vt);
    return status;
}

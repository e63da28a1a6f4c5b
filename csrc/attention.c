/* Causal attention, one (head, block of queries) per task: scores = q kᵀ·scale via the serial
 * SGEMM, causal softmax per row, then out = P·V with Vᵀ packed once per call. Each output row is
 * produced by one task in a fixed order, so results are the same for any thread count.
 *
 * Statistics are computed from each block as it is produced, so a long context needs O(T)
 * memory per thread, never a (T, T) buffer. */
#include "attention.h"

#include <math.h>
#include <string.h>

#include "ops.h"
#include "sgemm.h"
#include "sl_common.h"

#define SL_ATTN_QBLOCK 64

/* Vᵀ per kv head: vt[(g*hd + e)*T + t] = v[t*kv_stride + g*hd + e], so P·V is an NT product. */
static void transpose_values(float *vt, const float *v, int64_t kv_stride, int64_t T,
                             int64_t n_kv, int64_t hd) {
#pragma omp parallel for schedule(static) num_threads(sl_num_threads())
    for (int64_t ge = 0; ge < n_kv * hd; ge++)
        for (int64_t t = 0; t < T; t++) vt[ge * T + t] = v[t * kv_stride + ge];
}

/* Per-head view of the interventions and statistics. */
typedef struct {
    int mask_first, zero_first_value;
    float scale;
    float *to_first, *entropy; /* NULL or (T) for this head */
    double *colsum;            /* NULL or (T): running sum over queries of A[i, k] */
} head_opts;

/* Probabilities of queries [i0, i1) over keys [0, i1) in place in p (row stride ld; columns
 * past the query's own position are zero), with the per-row statistics. */
static int causal_probs_block(const sl_attn_shape *s, const head_opts *o, const float *qh,
                              int64_t q_stride, const float *kh, int64_t kv_stride, int64_t i0,
                              int64_t i1, float *p, int64_t ld) {
    SL_TRY(sl_sgemm_nt(i1 - i0, i1, s->head_dim, qh + i0 * q_stride, q_stride, kh, kv_stride, p,
                       ld, 0, 0));
    for (int64_t i = i0; i < i1; i++) {
        float *row = p + (i - i0) * ld;
        for (int64_t j = 0; j <= i; j++) row[j] *= s->scale;
        /* Masking key 0 leaves query 0 alone: it has no other key to renormalise onto. */
        const int64_t first = o->mask_first && i > 0 ? 1 : 0;
        float h = sl_softmax_entropy(row + first, i + 1 - first);
        if (first) row[0] = 0.0f;
        for (int64_t j = i + 1; j < ld; j++) row[j] = 0.0f;
        if (o->entropy) o->entropy[i] = h;
        if (o->to_first) o->to_first[i] = row[0];
        if (o->colsum)
            for (int64_t j = 0; j <= i; j++) o->colsum[j] += row[j];
    }
    return SL_OK;
}

/* out rows [i0, i1) of one head = P·V (with v_0 taken as zero where asked), times the head scale. */
static int weighted_values_block(const head_opts *o, const float *p, int64_t ld, const float *vth,
                                 int64_t T, int64_t hd, int64_t i0, int64_t i1, float *out,
                                 int64_t out_stride) {
    /* Leaving key 0 out of the product is exact zeroing of v_0, for every row of the block. */
    const int64_t skip = o->zero_first_value != SL_ZFV_NONE ? 1 : 0;
    float *o0 = out + i0 * out_stride;
    if (i1 - skip > 0) {
        SL_TRY(sl_sgemm_nt(i1 - i0, hd, i1 - skip, p + skip, ld, vth + skip, T, o0, out_stride, 0, 0));
    } else {
        for (int64_t i = i0; i < i1; i++) memset(out + i * out_stride, 0, (size_t)hd * sizeof(float));
    }
    if (o->zero_first_value == SL_ZFV_OTHERS && i0 == 0) {
        /* Query 0 keeps its own value. Its row of P has p00 and zeros after it, so the plain
         * product sums p00·v0 with exact zeros; p00·v0 alone is therefore bitwise that row. */
        for (int64_t e = 0; e < hd; e++) out[e] = p[0] * vth[e * T];
    }
    if (o->scale != 1.0f)
        for (int64_t i = i0; i < i1; i++)
            for (int64_t e = 0; e < hd; e++) out[i * out_stride + e] *= o->scale;
    return SL_OK;
}

static head_opts options_for_head(const sl_attn_intervention *iv, const sl_attn_stats *st,
                                  int64_t h, int64_t T, double *colsum) {
    head_opts o = {0, 0, 1.0f, NULL, NULL, NULL};
    if (iv) {
        o.mask_first = iv->mask_first && iv->mask_first[h];
        o.zero_first_value = iv->zero_first_value ? iv->zero_first_value[h] : SL_ZFV_NONE;
        o.scale = iv->head_scale ? iv->head_scale[h] : 1.0f;
    }
    if (st) {
        o.to_first = st->to_first ? st->to_first + h * T : NULL;
        o.entropy = st->entropy ? st->entropy + h * T : NULL;
        o.colsum = st->importance ? colsum : NULL;
    }
    return o;
}

/* One block of one head: probabilities (in the capture buffer or scratch), then outputs. */
static int attend_block(const sl_attn_shape *s, const head_opts *o, int64_t h, int64_t b,
                        const float *q, int64_t q_stride, const float *k, int64_t kv_stride,
                        const float *vt, float *out, float *probs, float *scratch) {
    const int64_t T = s->T, hd = s->head_dim, g = h / (s->n_heads / s->n_kv_heads);
    const int64_t i0 = b * SL_ATTN_QBLOCK;
    const int64_t i1 = i0 + SL_ATTN_QBLOCK < T ? i0 + SL_ATTN_QBLOCK : T;
    float *p = probs ? probs + (h * T + i0) * T : scratch;
    /* Without capture, rows need only i1 columns; the capture buffer has T. */
    const int64_t ld = probs ? T : i1;
    SL_TRY(causal_probs_block(s, o, q + h * hd, q_stride, k + g * hd, kv_stride, i0, i1, p, ld));
    return weighted_values_block(o, p, ld, vt + g * hd * T, T, hd, i0, i1, out + h * hd,
                                 s->n_heads * hd);
}

/* Importance needs, per head, a sum over all query blocks. Each head's blocks are cut into a
 * fixed number of segments (independent of the thread count); every segment sums into its own
 * O(T) partial, and the partials are added in segment order afterwards. */
#define SL_ATTN_SEGMENTS 4

int sl_attention_forward(const sl_attn_shape *s, const float *q, int64_t q_stride, const float *k,
                         const float *v, int64_t kv_stride, float *out, float *probs,
                         const sl_attn_intervention *iv, const sl_attn_stats *st) {
    const int64_t T = s->T, H = s->n_heads, G = s->n_kv_heads, hd = s->head_dim;
    if (T <= 0 || H <= 0 || G <= 0 || hd <= 0 || H % G != 0)
        return sl_fail(SL_ERR_VALUE, "attention: bad shape T=%lld heads=%lld kv_heads=%lld",
                       (long long)T, (long long)H, (long long)G);
    if (iv && iv->zero_first_value)
        for (int64_t h = 0; h < H; h++)
            if (iv->zero_first_value[h] > SL_ZFV_ALL)
                return sl_fail(SL_ERR_VALUE,
                               "attention: zero_first_value[%lld]=%d, expected 0 (none), 1 (others) or 2 (all)",
                               (long long)h, (int)iv->zero_first_value[h]);
    const int64_t n_blocks = (T + SL_ATTN_QBLOCK - 1) / SL_ATTN_QBLOCK;
    const int need_colsum = st && st->importance;
    const int64_t n_seg = need_colsum ? (n_blocks < SL_ATTN_SEGMENTS ? n_blocks : SL_ATTN_SEGMENTS) : n_blocks;
    int64_t n_vt, n_part = 0;
    if (!sl_mul_size(G * hd, T, &n_vt) || (need_colsum && !sl_mul_size(2 * H * n_seg, T, &n_part)))
        return sl_fail(SL_ERR_MEMORY, "attention: size overflow");
    float *vt = sl_alloc_floats(n_vt);
    double *partial = need_colsum ? (double *)sl_alloc_floats(n_part) : NULL;
    if (!vt || (need_colsum && !partial)) {
        sl_free(vt);
        sl_free(partial);
        return sl_fail(SL_ERR_MEMORY, "attention: cannot allocate buffers for T=%lld", (long long)T);
    }
    transpose_values(vt, v, kv_stride, T, G, hd);

    int status = SL_OK;
    /* Workers are other OS threads: each registers the caller's context, so that what fails in
     * the serial SGEMM under attend_block reports to this call, not to the worker's own. */
    sl_ctx *ctx = sl_ctx_current();
#pragma omp parallel num_threads(ctx->num_threads)
    {
        sl_ctx *prev = sl_ctx_enter(ctx);
        /* Per thread: one block of scores, O(T). */
        float *scratch = probs ? NULL : sl_alloc_floats(SL_ATTN_QBLOCK * T);
        int ok = probs != NULL || scratch != NULL;
        if (!ok) {
#pragma omp critical(sl_attn_err)
            status = sl_fail_ctx(ctx, SL_ERR_MEMORY, "attention: cannot allocate scratch for T=%lld", (long long)T);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < H * n_seg; task++) {
            if (!ok) continue;
            const int64_t h = task / n_seg, seg = task % n_seg;
            const int64_t b0 = seg * n_blocks / n_seg, b1 = (seg + 1) * n_blocks / n_seg;
            head_opts o = options_for_head(iv, st, h, T, need_colsum ? partial + task * T : NULL);
            int rc = SL_OK;
            for (int64_t b = b0; b < b1 && rc == SL_OK; b++)
                rc = attend_block(s, &o, h, b, q, q_stride, k, kv_stride, vt, out, probs, scratch);
            if (rc != SL_OK) {
#pragma omp critical(sl_attn_err)
                status = rc;
            }
        }
        sl_free(scratch);
        if (need_colsum && status == SL_OK) {
#pragma omp for schedule(static)
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < T; j++) {
                    double sum = 0.0;
                    for (int64_t g = 0; g < n_seg; g++) sum += partial[(h * n_seg + g) * T + j];
                    st->importance[h * T + j] = (float)(sum / (double)(T - j));
                }
        }
        sl_ctx_leave(prev);
    }
    sl_free(vt);
    sl_free(partial);
    return status;
}

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

/* ------------------------------------------------------------------------------------------
 * Backward and forward-mode derivatives. Both read the probabilities of the whole layer,
 * recomputed once per call by sl_attention_probs with the forward's own code (so bitwise the
 * probabilities the forward used): H*T*T floats, one layer at a time; the alternative, saving
 * them for every layer during the forward, would hold L*H*T*T. */

/* Runs task(arg, i, scratch) for i in [0, n) over the call's threads, each thread with its own
 * scratch of scratch_floats floats; returns the first failure (by status, not by order). */
typedef int (*attn_task_fn)(void *arg, int64_t task, float *scratch);

static int run_tasks(int64_t n, int64_t scratch_floats, attn_task_fn fn, void *arg) {
    int status = SL_OK;
    sl_ctx *ctx = sl_ctx_current();
#pragma omp parallel num_threads(ctx->num_threads)
    {
        sl_ctx *prev = sl_ctx_enter(ctx);
        float *scratch = scratch_floats > 0 ? sl_alloc_floats(scratch_floats) : NULL;
        int ok = scratch_floats <= 0 || scratch != NULL;
        if (!ok) {
#pragma omp critical(sl_attn_err)
            status = sl_fail_ctx(ctx, SL_ERR_MEMORY, "attention: cannot allocate %lld floats of scratch",
                                 (long long)scratch_floats);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) {
            if (!ok) continue;
            int rc = fn(arg, i, scratch);
            if (rc != SL_OK) {
#pragma omp critical(sl_attn_err)
                status = rc;
            }
        }
        sl_free(scratch);
        sl_ctx_leave(prev);
    }
    return status;
}

typedef struct {
    const sl_attn_shape *s;
    const sl_attn_intervention *iv;
    int64_t B;
    const float *q, *k, *v, *probs;       /* primal, (T, ·) dense; probs (H, T, T) */
    const float *dout;                    /* backward: (B*T, H*hd) */
    float *dq, *dk, *dv;                  /* backward outputs; JVP inputs (tangents) */
    float *tout;                          /* JVP output (B*T, H*hd) */
    float *pk, *pv;                       /* backward: where each head's dk, dv go (row stride ld_kv) */
    int64_t ld_kv;
    float *probs_out;                     /* sl_attention_probs output */
} attn_grad_job;

static int64_t n_query_blocks(int64_t T) { return (T + SL_ATTN_QBLOCK - 1) / SL_ATTN_QBLOCK; }

static int probs_task(void *arg, int64_t task, float *scratch) {
    (void)scratch;
    const attn_grad_job *j = arg;
    const sl_attn_shape *s = j->s;
    const int64_t T = s->T, hd = s->head_dim, nb = n_query_blocks(T);
    const int64_t h = task / nb, b = task % nb, g = h / (s->n_heads / s->n_kv_heads);
    const int64_t i0 = b * SL_ATTN_QBLOCK, i1 = i0 + SL_ATTN_QBLOCK < T ? i0 + SL_ATTN_QBLOCK : T;
    head_opts o = options_for_head(j->iv, NULL, h, T, NULL);
    return causal_probs_block(s, &o, j->q + h * hd, s->n_heads * hd, j->k + g * hd, s->n_kv_heads * hd, i0,
                              i1, j->probs_out + (h * T + i0) * T, T);
}

int sl_attention_probs(const sl_attn_shape *s, const float *q, const float *k, float *probs,
                       const sl_attn_intervention *iv) {
    attn_grad_job j = {.s = s, .iv = iv, .q = q, .k = k, .probs_out = probs};
    return run_tasks(s->n_heads * n_query_blocks(s->T), 0, probs_task, &j);
}

/* Whether query row i reads v_0 as zero under this head's zero_first_value. */
static int zeroes_first_value(const head_opts *o, int64_t i) {
    return o->zero_first_value == SL_ZFV_ALL || (o->zero_first_value == SL_ZFV_OTHERS && i > 0);
}

/* One (cotangent b, query head h), query blocks in order:
 *   do_i = scale_h dout_i,  dP_ij = do_i . v'_j,  dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij') / sqrt(hd)
 *   dq_i = sum_j dS_ij k_j,  dk_j += sum_i dS_ij q_i,  dv_j += sum_i P_ij do_i
 * with v'_0 = 0 (and no dv_0 from that row) where zero_first_value applies. The head's dk, dv go
 * to its own rows of pk, pv (row stride ld_kv): the kv head's gradient when it has one query head,
 * per-head partials summed in head order afterwards when several share it. Scratch: a block of dS
 * and of do. */
static int backward_task(void *arg, int64_t task, float *scratch) {
    const attn_grad_job *j = arg;
    const sl_attn_shape *s = j->s;
    const int64_t T = s->T, H = s->n_heads, G = s->n_kv_heads, hd = s->head_dim;
    const int64_t qd = H * hd, kvd = G * hd;
    const int64_t b = task / H, h = task % H, g = h / (H / G);
    float *dk = j->pk + b * T * j->ld_kv + (H == G ? g : h) * hd;
    float *dv = j->pv + b * T * j->ld_kv + (H == G ? g : h) * hd;
    const int64_t ld = j->ld_kv;
    for (int64_t t = 0; t < T; t++) {
        memset(dk + t * ld, 0, (size_t)hd * sizeof(float));
        memset(dv + t * ld, 0, (size_t)hd * sizeof(float));
    }
    float *ds = scratch, *dob = scratch + SL_ATTN_QBLOCK * T;
    head_opts o = options_for_head(j->iv, NULL, h, T, NULL);
    for (int64_t i0 = 0; i0 < T; i0 += SL_ATTN_QBLOCK) {
        const int64_t i1 = i0 + SL_ATTN_QBLOCK < T ? i0 + SL_ATTN_QBLOCK : T, nb = i1 - i0, nk = i1;
        const float *p = j->probs + (h * T + i0) * T;
        for (int64_t i = 0; i < nb; i++)
            for (int64_t e = 0; e < hd; e++) dob[i * hd + e] = o.scale * j->dout[(b * T + i0 + i) * qd + h * hd + e];
        SL_TRY(sl_sgemm(0, 1, nb, nk, hd, dob, hd, j->v + g * hd, kvd, ds, nk, 0, 0));
        for (int64_t i = 0; i < nb; i++) {
            float *row = ds + i * nk;
            const float *pr = p + i * T;
            if (zeroes_first_value(&o, i0 + i)) row[0] = 0.0f;
            double dot = 0.0;
            for (int64_t c = 0; c < nk; c++) dot += (double)pr[c] * row[c];
            for (int64_t c = 0; c < nk; c++) row[c] = pr[c] * (row[c] - (float)dot) * s->scale;
        }
        SL_TRY(sl_sgemm(0, 0, nb, hd, nk, ds, nk, j->k + g * hd, kvd, j->dq + (b * T + i0) * qd + h * hd, qd, 0, 0));
        SL_TRY(sl_sgemm(1, 0, nk, hd, nb, ds, nk, j->q + i0 * qd + h * hd, qd, dk, ld, 1, 0));
        /* dv: key 0 takes nothing from the rows that read it as zero. */
        const int64_t skip = o.zero_first_value != SL_ZFV_NONE ? 1 : 0;
        SL_TRY(sl_sgemm(1, 0, nk - skip, hd, nb, p + skip, T, dob, hd, dv + skip * ld, ld, 1, 0));
        if (o.zero_first_value == SL_ZFV_OTHERS && i0 == 0)
            for (int64_t e = 0; e < hd; e++) dv[e] += p[0] * dob[e];
    }
    return SL_OK;
}

/* dk, dv (B*T, G*hd) = the sums of the per-head partials (B*T, H*hd) over each group, in head order. */
static void sum_group_partials(const sl_attn_shape *s, int64_t B, const float *pk, const float *pv, float *dk,
                               float *dv) {
    const int64_t H = s->n_heads, G = s->n_kv_heads, hd = s->head_dim, rep = H / G;
#pragma omp parallel for schedule(static) num_threads(sl_num_threads())
    for (int64_t r = 0; r < B * s->T; r++)
        for (int64_t g = 0; g < G; g++)
            for (int64_t e = 0; e < hd; e++) {
                float ak = 0.0f, av = 0.0f;
                for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
                    ak += pk[(r * H + h) * hd + e];
                    av += pv[(r * H + h) * hd + e];
                }
                dk[(r * G + g) * hd + e] = ak;
                dv[(r * G + g) * hd + e] = av;
            }
}

int sl_attention_backward(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                          const float *probs, const float *dout, float *dq, float *dk, float *dv, float *pk,
                          float *pv, const sl_attn_intervention *iv) {
    const int shared = s->n_heads != s->n_kv_heads;
    if (shared && (!pk || !pv)) return sl_fail(SL_ERR_VALUE, "attention backward: grouped heads need partial buffers");
    attn_grad_job j = {.s = s, .iv = iv, .B = B, .q = q, .k = k, .v = v, .probs = probs, .dout = dout,
                       .dq = dq, .dk = dk, .dv = dv, .pk = shared ? pk : dk, .pv = shared ? pv : dv,
                       .ld_kv = (shared ? s->n_heads : s->n_kv_heads) * s->head_dim};
    SL_TRY(run_tasks(B * s->n_heads, SL_ATTN_QBLOCK * (s->T + s->head_dim), backward_task, &j));
    if (shared) sum_group_partials(s, B, pk, pv, dk, dv);
    return SL_OK;
}

/* One (tangent b, query head h, query block):
 *   dS_ij = (tq_i . k_j + q_i . tk_j) / sqrt(hd),  dP_ij = P_ij (dS_ij - sum_j' P_ij' dS_ij')
 *   tout_i = scale_h (sum_j dP_ij v'_j + P_ij tv'_j)
 * with v'_0 = tv'_0 = 0 where zero_first_value applies. Scratch: a block of dS. */
static int jvp_task(void *arg, int64_t task, float *scratch) {
    const attn_grad_job *j = arg;
    const sl_attn_shape *s = j->s;
    const int64_t T = s->T, H = s->n_heads, G = s->n_kv_heads, hd = s->head_dim;
    const int64_t qd = H * hd, kvd = G * hd, nblk = n_query_blocks(T);
    const int64_t b = task / (H * nblk), h = (task / nblk) % H, blk = task % nblk, g = h / (H / G);
    const int64_t i0 = blk * SL_ATTN_QBLOCK, i1 = i0 + SL_ATTN_QBLOCK < T ? i0 + SL_ATTN_QBLOCK : T;
    const int64_t nb = i1 - i0, nk = i1;
    head_opts o = options_for_head(j->iv, NULL, h, T, NULL);
    const float *p = j->probs + (h * T + i0) * T;
    const float *tq = j->dq + (b * T + i0) * qd + h * hd, *tk = j->dk + b * T * kvd + g * hd;
    const float *tv = j->dv + b * T * kvd + g * hd;
    float *ds = scratch, *out = j->tout + (b * T + i0) * qd + h * hd;
    SL_TRY(sl_sgemm(0, 1, nb, nk, hd, tq, qd, j->k + g * hd, kvd, ds, nk, 0, 0));
    SL_TRY(sl_sgemm(0, 1, nb, nk, hd, j->q + i0 * qd + h * hd, qd, tk, kvd, ds, nk, 1, 0));
    for (int64_t i = 0; i < nb; i++) {
        float *row = ds + i * nk;
        const float *pr = p + i * T;
        double dot = 0.0;
        for (int64_t c = 0; c < nk; c++) dot += (double)pr[c] * row[c];
        const float mean = (float)(dot * (double)s->scale);
        for (int64_t c = 0; c < nk; c++) row[c] = pr[c] * (row[c] * s->scale - mean);
    }
    const int64_t skip = o.zero_first_value != SL_ZFV_NONE ? 1 : 0;
    if (nk - skip > 0) {
        SL_TRY(sl_sgemm(0, 0, nb, hd, nk - skip, ds + skip, nk, j->v + g * hd + skip * kvd, kvd, out, qd, 0, 0));
        SL_TRY(sl_sgemm(0, 0, nb, hd, nk - skip, p + skip, T, tv + skip * kvd, kvd, out, qd, 1, 0));
    } else {
        for (int64_t i = 0; i < nb; i++) memset(out + i * qd, 0, (size_t)hd * sizeof(float));
    }
    if (o.zero_first_value == SL_ZFV_OTHERS && i0 == 0) /* query 0 keeps its own value */
        for (int64_t e = 0; e < hd; e++) out[e] = ds[0] * j->v[g * hd + e] + p[0] * tv[e];
    if (o.scale != 1.0f)
        for (int64_t i = 0; i < nb; i++)
            for (int64_t e = 0; e < hd; e++) out[i * qd + e] *= o.scale;
    return SL_OK;
}

int sl_attention_jvp(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                     const float *probs, const float *tq, const float *tk, const float *tv, float *tout,
                     const sl_attn_intervention *iv) {
    attn_grad_job j = {.s = s, .iv = iv, .B = B, .q = q, .k = k, .v = v, .probs = probs,
                       .dq = (float *)tq, .dk = (float *)tk, .dv = (float *)tv, .tout = tout};
    return run_tasks(B * s->n_heads * n_query_blocks(s->T), SL_ATTN_QBLOCK * s->T, jvp_task, &j);
}

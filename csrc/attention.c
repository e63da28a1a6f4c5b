/* Multi-head attention (causal, sliding-window or bidirectional, optionally soft-capped), one
 * (head, block of queries) per task: scores = q kᵀ·scale via the serial SGEMM over the keys the
 * block can see, masked softmax per row, then out = P·V with Vᵀ packed once per call. Each output
 * row is produced by one task in a fixed order, so results are the same for any thread count.
 *
 * Statistics are computed from each block as it is produced, so a long context needs O(T)
 * memory per thread, never a (T, T) buffer.
 *
 * Key ranges. Query i sees keys [lo(i), hi(i)]; a block of queries [i0, i1) sees the union
 * [ka, kb): [0, i1) causal, [max(0, i0 - window + 1), i1) with a window, [0, n) bidirectional.
 * Products run over [ka, kb) only, so a window skips every key block no query of the block can
 * see (its cost is O(T·window), not O(T²)); keys inside [ka, kb) but outside a row's own range
 * get probability exactly zero. With no window (or window >= T) [ka, kb) is what the causal
 * kernel always used, so those results are bitwise unchanged. The training mask (key_start:
 * intra-document masking, keep_first: a fixed ⟨bos⟩) narrows lo(i) to the query's document start
 * and, with keep_first, adds key 0 back as a separate key; the statistics count queries that
 * cannot see a key as 0, as with a window. */
#include "attention.h"

#include <math.h>
#include <string.h>

#include "ops.h"
#include "sgemm.h"
#include "sl_common.h"

#if SL_HAVE_OPENMP
#include <omp.h>
#endif

#define SL_ATTN_QBLOCK 64

/* Per-head view of the interventions and statistics. */
typedef struct {
    int mask_first, zero_first_value;
    float scale;
    const int64_t *key_start; /* NULL or (n): intra-document masking */
    int64_t keep;             /* keys [0, keep) visible to every query despite a window or key_start */
    float *to_first, *entropy; /* NULL or (n) for this head */
    double *colsum;            /* NULL or (n): running sum over queries of A[i, k] */
    int sink;                  /* a sink logit in the denominator (sl_attn_shape.variant) */
    float sink_logit;          /* s_h: sinks[h], or 0 for softmax-plus-one */
} head_opts;

/* Keys [*lo, *hi] of query i in a sequence of n, and the kept first keys [*fa, *fe) that are
 * visible too although lo > 0 (the first `keep` keys: a fixed ⟨bos⟩ under intra-document masking,
 * StreamingLLM's sinks under a window); empty (fa == fe) when none. mask_first removes key 0 from
 * every query i >= 1 that would see it; query 0 keeps it: causally it has no other key to
 * renormalise onto, and with bidirectional attention it is left as is too, so that in every mode
 * the intervention means the same ("positions after the first cannot read it") and row 0 is
 * unchanged. */
static inline void query_keys(const sl_attn_shape *s, const head_opts *o, int64_t i, int64_t n, int64_t *lo,
                              int64_t *hi, int64_t *fa, int64_t *fe) {
    int64_t a = 0, b = i;
    if (s->bidirectional) b = n - 1;
    else if (s->window > 0 && i - s->window + 1 > 0) a = i - s->window + 1;
    if (o->key_start && o->key_start[i] > a) a = o->key_start[i];
    *fe = o->keep < a ? o->keep : a;
    *fa = o->mask_first && *fe > 0 ? 1 : 0;
    if (*fe < *fa) *fe = *fa;
    if (o->mask_first && i > 0 && a == 0) a = 1;
    *lo = a, *hi = b;
}

/* Keys [*ka, *kb) that some query of the block [i0, i1) sees (before mask_first): with
 * intra-document masking and no fixed first key, the block's first document start bounds them
 * (key_start is nondecreasing). Kept first keys under a window that lie before ka are computed as
 * nf = keep separate columns (*nf > 0), so the block costs O(window + keep) keys, not O(i1);
 * under key_start, or when ka <= keep, the range simply starts at 0 (*nf = 0). */
static inline void block_keys(const sl_attn_shape *s, const head_opts *o, int64_t i0, int64_t i1, int64_t n,
                              int64_t *ka, int64_t *kb, int64_t *nf) {
    *nf = 0;
    if (s->bidirectional) {
        *ka = 0, *kb = n;
        return;
    }
    *ka = s->window > 0 && i0 - s->window + 1 > 0 ? i0 - s->window + 1 : 0;
    if (o->keep && o->key_start) *ka = 0;
    else if (o->key_start && o->key_start[i0] > *ka) *ka = o->key_start[i0];
    if (o->keep && !o->key_start) {
        if (*ka <= o->keep) *ka = 0;
        else *nf = o->keep;
    }
    *kb = i1;
}

/* The same range without separate columns (the derivatives read the whole probability rows,
 * zeros included, from key 0). */
static inline void dense_block_keys(const sl_attn_shape *s, const head_opts *o, int64_t i0, int64_t i1, int64_t n,
                                    int64_t *ka, int64_t *kb) {
    int64_t nf;
    block_keys(s, o, i0, i1, n, ka, kb, &nf);
    if (nf > 0) *ka = 0;
}

/* row[c] = 0 for c in [a, b) ∩ [c0, c1). */
static inline void zero_span(float *row, int64_t a, int64_t b, int64_t c0, int64_t c1) {
    if (a < c0) a = c0;
    if (b > c1) b = c1;
    if (b > a) memset(row + a, 0, (size_t)(b - a) * sizeof(float));
}

/* Zeroes row[c] for c in [c0, c1) outside the visible keys [fa, fe) ∪ [lo, hi] (fa <= fe <= lo,
 * as query_keys gives them). */
static void zero_hidden(float *row, int64_t c0, int64_t c1, int64_t fa, int64_t fe, int64_t lo, int64_t hi) {
    zero_span(row, c0, fa, c0, c1);
    zero_span(row, fe, lo, c0, c1);
    zero_span(row, hi + 1, c1, c0, c1);
}

/* keep_first is a count of kept first keys; the mean-ablation of v_0 averages one range of other
 * keys, so it takes at most one kept key. */
static int check_keep(const sl_attn_shape *s, const sl_attn_intervention *iv) {
    if (!iv) return SL_OK;
    if (iv->keep_first < 0)
        return sl_fail(SL_ERR_VALUE, "attention: keep_first=%d, expected a count >= 0 of first keys", iv->keep_first);
    for (int64_t h = 0; iv->keep_first > 1 && iv->zero_first_value && h < s->n_heads; h++)
        if (iv->zero_first_value[h] == SL_ZFV_MEAN)
            return sl_fail(SL_ERR_VALUE, "attention: zero_first_value 3 (mean) takes keep_first <= 1, not %d",
                           iv->keep_first);
    return SL_OK;
}

static int check_variant(const sl_attn_shape *s) {
    if (s->variant < SL_ATTN_SOFTMAX || s->variant > SL_ATTN_SOFTMAX1)
        return sl_fail(SL_ERR_VALUE, "attention: variant=%d, expected 0 (softmax), 1 (sink logit) or 2 (softmax-plus-one)",
                       s->variant);
    if (s->variant != SL_ATTN_SINK_LOGIT) return SL_OK;
    if (!s->sinks) return sl_fail(SL_ERR_VALUE, "attention: the sink-logit variant needs sinks (n_heads floats)");
    for (int64_t h = 0; h < s->n_heads; h++)
        if (!isfinite(s->sinks[h]))
            return sl_fail(SL_ERR_VALUE, "attention: sinks[%lld]=%g, expected a finite logit", (long long)h,
                           (double)s->sinks[h]);
    return SL_OK;
}

static int check_mask(const sl_attn_shape *s) {
    SL_TRY(check_variant(s));
    if (!s->bidirectional && s->window < 0)
        return sl_fail(SL_ERR_VALUE, "attention: window=%lld, expected >= 0 (0: no window)", (long long)s->window);
    if (!(s->softcap >= 0.0f) || isinf(s->softcap))
        return sl_fail(SL_ERR_VALUE, "attention: softcap=%g, expected a finite value >= 0 (0: none)",
                       (double)s->softcap);
    return SL_OK;
}

/* Gemma 2's soft-capped score of a raw product x = q·k, in Hugging Face's order of operations
 * (scale, divide, tanh, multiply) so that the rounding matches its eager attention. */
static inline float capped_score(float x, float scale, float cap) { return tanhf(x * scale / cap) * cap; }


/* Probabilities of queries [i0, i1) over the block's keys [ka, kb) in place in p (p points at
 * key ka of query i0, row stride ld; keys outside a query's range are zero), with the per-row
 * statistics. With nf > 0 separate first keys, key j < nf sits at p[j - fo] of its row: fo = ka
 * in a capture buffer (its own column), fo = nf in scratch (the nf columns before p). When p lies
 * in a capture buffer of `width` columns (capture != 0), every other column of its rows is
 * zeroed too. */
static int probs_block(const sl_attn_shape *s, const head_opts *o, const float *qh, int64_t q_stride,
                       const float *kh, int64_t kv_stride, int64_t n, int64_t i0, int64_t i1, int64_t ka,
                       int64_t kb, int64_t nf, float *p, int64_t ld, int capture, int64_t width) {
    const int64_t fo = capture ? ka : nf;
    SL_TRY(sl_sgemm_nt(i1 - i0, kb - ka, s->head_dim, qh + i0 * q_stride, q_stride, kh + ka * kv_stride, kv_stride,
                       p, ld, 0, 0));
    if (nf > 0) SL_TRY(sl_sgemm_nt(i1 - i0, nf, s->head_dim, qh + i0 * q_stride, q_stride, kh, kv_stride, p - fo, ld, 0, 0));
    const float cap = s->softcap;
    for (int64_t i = i0; i < i1; i++) {
        float *row = p + (i - i0) * ld; /* row[j - ka] is key j of the range, row[j - fo] kept key j */
        int64_t lo, hi, fa, fe;
        query_keys(s, o, i, n, &lo, &hi, &fa, &fe);
        if (cap > 0.0f)
            for (int64_t j = lo; j <= hi; j++) row[j - ka] = capped_score(row[j - ka], s->scale, cap);
        else
            for (int64_t j = lo; j <= hi; j++) row[j - ka] *= s->scale;
        /* keys [fa, fe) ∪ [lo, hi]: the kept keys' scores move next to the range, one softmax
         * over both, and back */
        const int64_t nk1 = fe - fa;
        float *seg = row + (lo - ka) - nk1;
        if (nk1 > 0) {
            memmove(seg, row + fa - fo, (size_t)nk1 * sizeof(float));
            for (int64_t c = 0; c < nk1; c++) seg[c] = cap > 0.0f ? capped_score(seg[c], s->scale, cap) : seg[c] * s->scale;
        }
        const float h = o->sink ? sl_softmax_sink_entropy(seg, nk1 + hi + 1 - lo, o->sink_logit)
                                : sl_softmax_entropy(seg, nk1 + hi + 1 - lo);
        if (nk1 > 0) memmove(row + fa - fo, seg, (size_t)nk1 * sizeof(float));
        if (capture) {
            zero_hidden(row - ka, 0, width, fa, fe, lo, hi);
        } else if (fo == ka) {
            zero_hidden(row - ka, ka, kb, fa, fe, lo, hi);
        } else { /* separate scratch columns: [0, nf) before p, then [ka, kb) */
            zero_hidden(row - fo, 0, nf, fa, fe, nf, nf - 1);
            zero_hidden(row - ka, ka, kb, 0, 0, lo, hi);
        }
        if (o->entropy) o->entropy[i] = h;
        if (o->to_first) o->to_first[i] = ka == 0 || nf > 0 ? row[-fo] : 0.0f;
        if (o->colsum) {
            for (int64_t j = fa; j < fe; j++) o->colsum[j] += row[j - fo];
            for (int64_t j = lo; j <= hi; j++) o->colsum[j] += row[j - ka];
        }
    }
    return SL_OK;
}

/* SL_ZFV_MEAN: whether query i >= 1 sees key 0, and then the other keys it sees, [*a, *b]
 * (never empty: i itself is one), whose values' mean replaces v_0 for it. */
static inline int other_keys(const sl_attn_shape *s, const head_opts *o, int64_t i, int64_t n, int64_t *a,
                             int64_t *b) {
    int64_t lo, hi, fa, fe;
    query_keys(s, o, i, n, &lo, &hi, &fa, &fe);
    *a = lo > 0 ? lo : 1, *b = hi;
    return lo == 0 || (fa == 0 && fe > 0); /* keep > 1 with the mean is refused (check_keep) */
}

/* out rows [i0, i1) of one head = P·V over the block's keys [ka, kb) (p at key ka, v_0 taken
 * as zero or as the mean of the other values where asked), times the head scale. vth is the
 * head's Vᵀ with row stride n (the sequence's length); vsh its value prefix sums (SL_ZFV_MEAN
 * only, else NULL). */
static int weighted_values_block(const sl_attn_shape *s, const head_opts *o, const float *p, int64_t ld,
                                 const float *vth, const double *vsh, int64_t n, int64_t hd, int64_t i0,
                                 int64_t i1, int64_t ka, int64_t kb, int64_t nf, int64_t fo, float *out,
                                 int64_t out_stride) {
    /* Leaving key 0 out of the product is exact zeroing of v_0, for every row of the block. */
    const int64_t skip = o->zero_first_value != SL_ZFV_NONE && ka == 0 ? 1 : 0;
    float *o0 = out + i0 * out_stride;
    if (kb - ka - skip > 0) {
        SL_TRY(sl_sgemm_nt(i1 - i0, hd, kb - ka - skip, p + skip, ld, vth + ka + skip, n, o0, out_stride, 0, 0));
    } else {
        for (int64_t i = i0; i < i1; i++) memset(out + i * out_stride, 0, (size_t)hd * sizeof(float));
    }
    if (nf > 0) { /* the kept first keys' columns (before ka), added to the range's product */
        const int64_t fskip = o->zero_first_value != SL_ZFV_NONE ? 1 : 0;
        if (nf - fskip > 0)
            SL_TRY(sl_sgemm_nt(i1 - i0, hd, nf - fskip, p - fo + fskip, ld, vth + fskip, n, o0, out_stride, 1, 0));
    }
    if ((o->zero_first_value == SL_ZFV_OTHERS || o->zero_first_value == SL_ZFV_MEAN) && i0 == 0) {
        if (s->bidirectional) {
            /* Query 0 keeps its own value and sees every key: its row over all keys, which the
             * SGEMM's per-element chains make bitwise the un-intervened row. */
            SL_TRY(sl_sgemm_nt(1, hd, kb, p, ld, vth, n, out, out_stride, 0, 0));
        } else {
            /* Query 0 sees key 0 only: its row of P has p00 and zeros after it, so the plain
             * product sums p00·v0 with exact zeros; p00·v0 alone is therefore bitwise that row. */
            for (int64_t e = 0; e < hd; e++) out[e] = p[0] * vth[e * n];
        }
    }
    if (o->zero_first_value == SL_ZFV_MEAN && (ka == 0 || nf > 0)) {
        /* The product above left key 0 out; each row i >= 1 that sees it adds A_i0 times the mean
         * of its other keys' values, from the prefix sums (double, so the difference of two is
         * as good as a direct sum). */
        for (int64_t i = i0 > 0 ? i0 : 1; i < i1; i++) {
            int64_t a, b;
            if (!other_keys(s, o, i, n, &a, &b)) continue;
            float *row = out + i * out_stride;
            const float a0 = p[(i - i0) * ld - fo];
            const double c = (double)(b - a + 1);
            for (int64_t e = 0; e < hd; e++) row[e] += a0 * (float)((vsh[e * n + b] - vsh[e * n + a - 1]) / c);
        }
    }
    if (o->scale != 1.0f)
        for (int64_t i = i0; i < i1; i++)
            for (int64_t e = 0; e < hd; e++) out[i * out_stride + e] *= o->scale;
    return SL_OK;
}

/* Head h's options; statistics rows have stride `ld` (the padded length of the capture). */
static head_opts options_for_head(const sl_attn_shape *s, const sl_attn_intervention *iv, const sl_attn_stats *st,
                                  int64_t h, int64_t ld, double *colsum) {
    head_opts o = {0, 0, 1.0f, NULL, 0, NULL, NULL, NULL, 0, 0.0f};
    o.sink = s->variant != SL_ATTN_SOFTMAX;
    o.sink_logit = s->variant == SL_ATTN_SINK_LOGIT ? s->sinks[h] : 0.0f;
    if (iv) {
        o.key_start = iv->key_start;
        o.keep = iv->keep_first;
        o.mask_first = iv->mask_first && iv->mask_first[h];
        o.zero_first_value = iv->zero_first_value ? iv->zero_first_value[h] : SL_ZFV_NONE;
        o.scale = iv->head_scale ? iv->head_scale[h] : 1.0f;
    }
    if (st) {
        o.to_first = st->to_first ? st->to_first + h * ld : NULL;
        o.entropy = st->entropy ? st->entropy + h * ld : NULL;
        o.colsum = st->importance ? colsum : NULL;
    }
    return o;
}

/* Importance needs, per head, a sum over all query blocks. Each head's blocks are cut into a
 * fixed number of segments (independent of the thread count and of the rest of the batch);
 * every segment sums into its own O(n) partial, and the partials are added in segment order
 * afterwards. */
#define SL_ATTN_SEGMENTS 4

static int64_t n_query_blocks(int64_t T) { return (T + SL_ATTN_QBLOCK - 1) / SL_ATTN_QBLOCK; }

/* Tasks of sequence b: one per (head, segment) with importance, else one per (head, block). */
static int64_t seq_segments(const sl_attn_batch *bt, int64_t b) {
    const int64_t nb = n_query_blocks(bt->len[b]);
    return bt->importance && nb > SL_ATTN_SEGMENTS ? SL_ATTN_SEGMENTS : nb;
}

int64_t sl_attn_batch_floats(const sl_attn_shape *s, const sl_attn_batch *bt, int n_threads,
                             int64_t sizes[3]) {
    int64_t rows = bt->off[bt->B], part = 0;
    for (int64_t b = 0; b < bt->B && bt->importance; b++) part += s->n_heads * seq_segments(bt, b) * bt->len[b];
    sizes[0] = rows * s->n_kv_heads * s->head_dim; /* vt */
    sizes[1] = 2 * part;                            /* partial, doubles */
    sizes[2] = (int64_t)n_threads * SL_ATTN_QBLOCK * bt->T_pad; /* scores, per thread */
    return sizes[0] + sizes[1] + sizes[2];
}

int64_t sl_attn_row_floats(const sl_attn_shape *s) {
    return s->n_kv_heads * s->head_dim + 2 * s->n_heads * SL_ATTN_SEGMENTS;
}

/* Everything one sequence's tasks need, resolved once per task. */
typedef struct {
    int64_t n, off, n_seg;
    float *probs;             /* NULL or (H, T_pad, T_pad) */
    sl_attn_stats st;         /* (H, T_pad) each or NULL */
    const float *vt;          /* (G*hd, n) */
    const double *vsum;       /* (G*hd, n) value prefix sums (SL_ZFV_MEAN), else NULL */
    double *partial;          /* (H*n_seg, n) or NULL */
} seq_view;

static seq_view seq_at(const sl_attn_shape *s, const sl_attn_batch *bt, int64_t b) {
    seq_view v;
    v.n = bt->len[b], v.off = bt->off[b], v.n_seg = seq_segments(bt, b);
    v.probs = bt->probs ? bt->probs[b] : NULL;
    v.st.importance = bt->importance ? bt->importance[b] : NULL;
    v.st.to_first = bt->to_first ? bt->to_first[b] : NULL;
    v.st.entropy = bt->entropy ? bt->entropy[b] : NULL;
    v.vt = bt->vt + v.off * s->n_kv_heads * s->head_dim;
    v.vsum = NULL;
    v.partial = bt->importance ? bt->partial + bt->part_off[b] : NULL;
    return v;
}

/* One (sequence, head, segment) task: its query blocks in order, probabilities (in the capture
 * buffer or the thread's scratch) then outputs. */
static int attend_task(const sl_attn_shape *s, const sl_attn_batch *bt, int64_t b, int64_t h, int64_t seg,
                       const float *q, int64_t q_stride, const float *k, int64_t kv_stride, float *out,
                       const sl_attn_intervention *iv, float *scratch, const double *vsum) {
    seq_view v = seq_at(s, bt, b);
    v.vsum = vsum ? vsum + v.off * s->n_kv_heads * s->head_dim : NULL;
    const int64_t T = bt->T_pad, hd = s->head_dim, g = h / (s->n_heads / s->n_kv_heads);
    const int64_t nb = n_query_blocks(v.n), b0 = seg * nb / v.n_seg, b1 = (seg + 1) * nb / v.n_seg;
    head_opts o = options_for_head(s, iv, &v.st, h, T, v.partial ? v.partial + (h * v.n_seg + seg) * v.n : NULL);
    const float *qs = q + v.off * q_stride + h * hd, *ks = k + v.off * kv_stride + g * hd;
    float *os = out + v.off * s->n_heads * hd + h * hd;
    for (int64_t blk = b0; blk < b1; blk++) {
        const int64_t i0 = blk * SL_ATTN_QBLOCK, i1 = i0 + SL_ATTN_QBLOCK < v.n ? i0 + SL_ATTN_QBLOCK : v.n;
        int64_t ka, kb, nf;
        block_keys(s, &o, i0, i1, v.n, &ka, &kb, &nf);
        /* Without capture, rows need only the block's nf + kb - ka keys; the capture buffer has
         * T_pad columns, and those outside them (padding included) are zeroed by probs_block. */
        float *p = v.probs ? v.probs + (h * T + i0) * T + ka : scratch + nf;
        const int64_t ld = v.probs ? T : nf + kb - ka, fo = v.probs ? ka : nf;
        SL_TRY(probs_block(s, &o, qs, q_stride, ks, kv_stride, v.n, i0, i1, ka, kb, nf, p, ld, v.probs != NULL, T));
        SL_TRY(weighted_values_block(s, &o, p, ld, v.vt + g * hd * v.n, v.vsum ? v.vsum + g * hd * v.n : NULL, v.n,
                                     hd, i0, i1, ka, kb, nf, fo, os, s->n_heads * hd));
    }
    return SL_OK;
}

/* Importance of (b, h) from its segment partials, and the zeros of every capture at positions
 * >= the sequence's length. */
static void finish_head(const sl_attn_shape *s, const sl_attn_batch *bt, int64_t b, int64_t h) {
    const seq_view v = seq_at(s, bt, b);
    const int64_t T = bt->T_pad, n = v.n;
    if (v.st.importance) {
        float *imp = v.st.importance + h * T;
        for (int64_t j = 0; j < n; j++) {
            double sum = 0.0;
            for (int64_t g = 0; g < v.n_seg; g++) sum += v.partial[(h * v.n_seg + g) * n + j];
            /* Causal: the queries i >= j (with a window, those that cannot see j add 0);
             * bidirectional: every query sees j. */
            imp[j] = (float)(sum / (double)(s->bidirectional ? n : n - j));
        }
        memset(imp + n, 0, (size_t)(T - n) * sizeof(float));
    }
    if (v.st.to_first) memset(v.st.to_first + h * T + n, 0, (size_t)(T - n) * sizeof(float));
    if (v.st.entropy) memset(v.st.entropy + h * T + n, 0, (size_t)(T - n) * sizeof(float));
    if (v.probs) memset(v.probs + (h * T + n) * T, 0, (size_t)((T - n) * T) * sizeof(float));
}

/* Index of the sequence whose tasks include `task` (task_off is nondecreasing, B+1 entries). */
static int64_t find_seq(const int64_t *task_off, int64_t B, int64_t task) {
    int64_t lo = 0, hi = B - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (task_off[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int sl_attention_forward_batch(const sl_attn_shape *s, const sl_attn_batch *bt, const float *q,
                               int64_t q_stride, const float *k, const float *v, int64_t kv_stride,
                               float *out, const sl_attn_intervention *iv) {
    const int64_t H = s->n_heads, G = s->n_kv_heads, hd = s->head_dim, B = bt->B, kvd = G * hd;
    if (B <= 0 || H <= 0 || G <= 0 || hd <= 0 || H % G != 0)
        return sl_fail(SL_ERR_VALUE, "attention: bad shape B=%lld heads=%lld kv_heads=%lld",
                       (long long)B, (long long)H, (long long)G);
    SL_TRY(check_mask(s));
    SL_TRY(check_keep(s, iv));
    int value_mean = 0; /* some head of this call uses SL_ZFV_MEAN */
    if (iv && iv->zero_first_value)
        for (int64_t h = 0; h < H; h++) {
            if (iv->zero_first_value[h] > SL_ZFV_MEAN)
                return sl_fail(SL_ERR_VALUE,
                               "attention: zero_first_value[%lld]=%d, expected 0 (none), 1 (others), 2 (all) or 3 (mean)",
                               (long long)h, (int)iv->zero_first_value[h]);
            value_mean |= iv->zero_first_value[h] == SL_ZFV_MEAN;
        }
    /* task_off: tasks of the sequences before b; part_off: their partials (set here, read by
     * seq_at; the caller sized both arrays). The partials are summed into, so zeroed first. */
    int64_t *task_off = bt->task_off, n_part = 0;
    task_off[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        task_off[b + 1] = task_off[b] + H * seq_segments(bt, b);
        if (bt->importance) {
            bt->part_off[b] = n_part;
            n_part += H * seq_segments(bt, b) * bt->len[b];
        }
    }
    if (bt->importance) memset(bt->partial, 0, (size_t)n_part * sizeof(double));
    /* SL_ZFV_MEAN's prefix sums, (G*hd, n) per sequence like Vᵀ: allocated here, only when used,
     * so that the batch layout and its sizing stay as they are for every other call. */
    double *vsum = NULL;
    if (value_mean && !(vsum = (double *)sl_alloc_floats_uninit(2 * bt->off[B] * kvd)))
        return sl_fail(SL_ERR_MEMORY, "attention: cannot allocate the value prefix sums (%lld rows)",
                       (long long)bt->off[B]);
    const int64_t n_tasks = task_off[B];

    int status = SL_OK;
    /* One parallel region per layer for the whole batch (few barriers: a busy core stalls a
     * team at each one). Workers are other OS threads: each registers the caller's context, so
     * that what fails in the serial SGEMM under attend_task reports to this call. */
    sl_ctx *ctx = sl_ctx_current();
#pragma omp parallel num_threads(ctx->num_threads)
    {
        sl_ctx *prev = sl_ctx_enter(ctx);
#if SL_HAVE_OPENMP
        float *scratch = bt->scratch + (int64_t)omp_get_thread_num() * SL_ATTN_QBLOCK * bt->T_pad;
#else
        float *scratch = bt->scratch;
#endif
        /* nowait: the Vᵀ loop below reads only v, and its barrier comes before any task. */
        if (bt->prologue) {
#pragma omp for schedule(static) nowait
            for (int64_t r = 0; r < bt->off[B]; r++) bt->prologue(bt->prologue_arg, r);
        }
        /* Vᵀ per sequence and kv head: vt[off*kvd + (g*hd + e)*n + t] = v[(off + t)*kv_stride + g*hd + e],
         * so P·V is an NT product. */
#pragma omp for schedule(static)
        for (int64_t bge = 0; bge < B * kvd; bge++) {
            const int64_t b = bge / kvd, ge = bge % kvd, n = bt->len[b], off = bt->off[b];
            float *vt = bt->vt + off * kvd + ge * n;
            for (int64_t t = 0; t < n; t++) vt[t] = v[(off + t) * kv_stride + ge];
            if (value_mean) { /* prefix sums over keys 1..t, in order: the same for any thread count */
                double *vs = vsum + off * kvd + ge * n, acc = 0.0;
                vs[0] = 0.0;
                for (int64_t t = 1; t < n; t++) vs[t] = acc += (double)vt[t];
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            const int64_t b = find_seq(task_off, B, task), r = task - task_off[b], n_seg = seq_segments(bt, b);
            int rc = sl_check_interrupt();   /* Ctrl-C waits for one (head, query segment) at most */
            if (rc == SL_OK)
                rc = attend_task(s, bt, b, r / n_seg, r % n_seg, q, q_stride, k, kv_stride, out, iv, scratch, vsum);
            if (rc != SL_OK) {
#pragma omp critical(sl_attn_err)
                status = rc;
            }
        }
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; bh++) finish_head(s, bt, bh / H, bh % H);
        sl_ctx_leave(prev);
    }
    sl_free(vsum);
    return status;
}

int sl_attention_forward(const sl_attn_shape *s, const float *q, int64_t q_stride, const float *k,
                         const float *v, int64_t kv_stride, float *out, float *probs,
                         const sl_attn_intervention *iv, const sl_attn_stats *st) {
    if (s->T <= 0) return sl_fail(SL_ERR_VALUE, "attention: bad shape T=%lld", (long long)s->T);
    int64_t off[2] = {0, s->T}, len[1] = {s->T}, task_off[2], part_off[1], sizes[3];
    float *pr[1] = {probs}, *imp[1] = {st ? st->importance : NULL}, *tf[1] = {st ? st->to_first : NULL},
          *en[1] = {st ? st->entropy : NULL};
    sl_attn_batch bt = {.B = 1, .T_pad = s->T, .off = off, .len = len, .probs = probs ? pr : NULL,
                        .importance = imp[0] ? imp : NULL, .to_first = tf[0] ? tf : NULL,
                        .entropy = en[0] ? en : NULL, .task_off = task_off, .part_off = part_off};
    const int n_threads = sl_num_threads();
    const int64_t total = sl_attn_batch_floats(s, &bt, n_threads, sizes);
    float *buf = sl_alloc_floats_uninit(total);
    if (!buf) return sl_fail(SL_ERR_MEMORY, "attention: cannot allocate buffers for T=%lld", (long long)s->T);
    bt.vt = buf, bt.partial = (double *)(buf + sizes[0]), bt.scratch = buf + sizes[0] + sizes[1];
    int rc = sl_attention_forward_batch(s, &bt, q, q_stride, k, v, kv_stride, out, iv);
    sl_free(buf);
    return rc;
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
            int rc = sl_check_interrupt();
            if (rc == SL_OK) rc = fn(arg, i, scratch);
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
    float *dsinks;                        /* backward: NULL or (B, H), each sink logit's gradient */
    const float *tsinks;                  /* JVP: NULL or (B, H), each sink logit's tangent */
} attn_grad_job;

static int probs_task(void *arg, int64_t task, float *scratch) {
    (void)scratch;
    const attn_grad_job *j = arg;
    const sl_attn_shape *s = j->s;
    const int64_t T = s->T, hd = s->head_dim, nb = n_query_blocks(T);
    const int64_t h = task / nb, b = task % nb, g = h / (s->n_heads / s->n_kv_heads);
    const int64_t i0 = b * SL_ATTN_QBLOCK, i1 = i0 + SL_ATTN_QBLOCK < T ? i0 + SL_ATTN_QBLOCK : T;
    head_opts o = options_for_head(s, j->iv, NULL, h, T, NULL);
    int64_t ka, kb, nf;
    block_keys(s, &o, i0, i1, T, &ka, &kb, &nf);
    return probs_block(s, &o, j->q + h * hd, s->n_heads * hd, j->k + g * hd, s->n_kv_heads * hd, T, i0, i1, ka, kb,
                       nf, j->probs_out + (h * T + i0) * T + ka, T, 1, T);
}

int sl_attention_probs(const sl_attn_shape *s, const float *q, const float *k, float *probs,
                       const sl_attn_intervention *iv) {
    SL_TRY(check_mask(s));
    SL_TRY(check_keep(s, iv));
    attn_grad_job j = {.s = s, .iv = iv, .q = q, .k = k, .probs_out = probs};
    return run_tasks(s->n_heads * n_query_blocks(s->T), 0, probs_task, &j);
}

/* Whether query row i reads v_0 as zero under this head's zero_first_value. */
static int zeroes_first_value(const head_opts *o, int64_t i) {
    return o->zero_first_value == SL_ZFV_ALL || (o->zero_first_value == SL_ZFV_OTHERS && i > 0);
}

/* Whether query row 0 reads its own v_0 although the head leaves key 0 out of its products. */
static int keeps_row0_value(const head_opts *o) {
    return o->zero_first_value == SL_ZFV_OTHERS || o->zero_first_value == SL_ZFV_MEAN;
}

static int any_value_mean(const sl_attn_shape *s, const sl_attn_intervention *iv) {
    for (int64_t h = 0; iv && iv->zero_first_value && h < s->n_heads; h++)
        if (iv->zero_first_value[h] == SL_ZFV_MEAN) return 1;
    return 0;
}

/* ps[t*hd + e] = sum of x_j[e] over j = 1..t for t in [0, n) (row stride ld): the prefix sums
 * that SL_ZFV_MEAN's means are differences of, in double and in order. */
static void value_prefix(const float *x, int64_t ld, int64_t n, int64_t hd, double *ps) {
    for (int64_t e = 0; e < hd; e++) ps[e] = 0.0;
    for (int64_t t = 1; t < n; t++)
        for (int64_t e = 0; e < hd; e++) ps[t * hd + e] = ps[(t - 1) * hd + e] + (double)x[t * ld + e];
}

/* The mean of x over keys [a, b] from its prefix sums, element e. */
static inline float prefix_mean(const double *ps, int64_t hd, int64_t a, int64_t b, int64_t e) {
    return (float)((ps[b * hd + e] - ps[(a - 1) * hd + e]) / (double)(b - a + 1));
}

/* With soft-capping, the derivative of the capped score c = cap·tanh(x·scale/cap) with respect
 * to the raw product x = q·k is scale·(1 - tanh²): dcap (nb, nk) receives that factor for the
 * block's queries [i0, i1) and keys [ka, kb), from the products recomputed exactly as the forward
 * computed them (the probabilities alone do not give back the scores). */
static int softcap_factors(const sl_attn_shape *s, const float *qh, int64_t q_stride, const float *kh,
                           int64_t kv_stride, int64_t i0, int64_t i1, int64_t ka, int64_t kb, float *dcap) {
    const int64_t nb = i1 - i0, nk = kb - ka;
    SL_TRY(sl_sgemm_nt(nb, nk, s->head_dim, qh + i0 * q_stride, q_stride, kh + ka * kv_stride, kv_stride, dcap, nk,
                       0, 0));
    for (int64_t c = 0; c < nb * nk; c++) {
        const float t = tanhf(dcap[c] * s->scale / s->softcap);
        dcap[c] = (1.0f - t * t) * s->scale;
    }
    return SL_OK;
}

/* p_sink = 1 - sum of a row's key probabilities (pr[0..nk): every key the query sees), in double. */
static double sink_mass(const float *pr, int64_t nk) {
    double sum = 0.0;
    for (int64_t c = 0; c < nk; c++) sum += (double)pr[c];
    return 1.0 - sum;
}

/* One (cotangent b, query head h), query blocks in order, each over its keys [ka, kb):
 *   do_i = scale_h dout_i,  dP_ij = do_i . v'_j,  dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij') c'_ij
 *   dq_i = sum_j dS_ij k_j,  dk_j += sum_i dS_ij q_i,  dv_j += sum_i P_ij do_i
 * where c'_ij is the derivative of the (capped) score by q_i·k_j (scale, or scale·(1 - tanh²)),
 * with v'_0 = 0 (and no dv_0 from that row) where zero_first_value applies. Under SL_ZFV_MEAN
 * v'_0 = m_i, the mean of v over query i's other keys [a_i, b_i], so dP_i0 = do_i . m_i and each
 * v_j of [a_i, b_i] gets P_i0 do_i / (b_i - a_i + 1): added through a difference array over j,
 * summed once after the last block. The head's dk, dv go to its own rows of pk, pv (row stride
 * ld_kv): the kv head's gradient when it has one query head, per-head partials summed in head
 * order afterwards when several share it. Scratch: a block of dS, of do and, with a softcap, of
 * c'; with SL_ZFV_MEAN anywhere, the prefix sums of v and the difference array (doubles). */
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
    float *ds = scratch, *dob = scratch + SL_ATTN_QBLOCK * T, *dcap = dob + SL_ATTN_QBLOCK * hd;
    head_opts o = options_for_head(s, j->iv, NULL, h, T, NULL);
    const int mean = o.zero_first_value == SL_ZFV_MEAN;
    double *vps = NULL, *dmean = NULL; /* (T, hd) and (T + 1, hd), after dcap's block */
    double dsink = 0.0;                /* ds_h = -sum_i p_i,sink (p_i . dP_i), queries in order */
    if (mean) {
        vps = (double *)(dcap + (s->softcap > 0.0f ? SL_ATTN_QBLOCK * T : 0)), dmean = vps + T * hd;
        value_prefix(j->v + g * hd, kvd, T, hd, vps);
        memset(dmean, 0, (size_t)((T + 1) * hd) * sizeof(double));
    }
    for (int64_t i0 = 0; i0 < T; i0 += SL_ATTN_QBLOCK) {
        const int64_t i1 = i0 + SL_ATTN_QBLOCK < T ? i0 + SL_ATTN_QBLOCK : T, nb = i1 - i0;
        SL_TRY(sl_check_interrupt()); /* a task is a whole head: ~1 s at T = 8192 */
        int64_t ka, kb;
        dense_block_keys(s, &o, i0, i1, T, &ka, &kb);
        const int64_t nk = kb - ka;
        const float *p = j->probs + (h * T + i0) * T + ka;
        for (int64_t i = 0; i < nb; i++)
            for (int64_t e = 0; e < hd; e++) dob[i * hd + e] = o.scale * j->dout[(b * T + i0 + i) * qd + h * hd + e];
        SL_TRY(sl_sgemm(0, 1, nb, nk, hd, dob, hd, j->v + g * hd + ka * kvd, kvd, ds, nk, 0, 0));
        if (s->softcap > 0.0f)
            SL_TRY(softcap_factors(s, j->q + h * hd, qd, j->k + g * hd, kvd, i0, i1, ka, kb, dcap));
        for (int64_t i = 0; i < nb; i++) {
            float *row = ds + i * nk;
            const float *pr = p + i * T;
            if (ka == 0 && zeroes_first_value(&o, i0 + i)) row[0] = 0.0f;
            int64_t a, bk;
            if (mean && ka == 0 && i0 + i > 0 && other_keys(s, &o, i0 + i, T, &a, &bk)) {
                const float *di = dob + i * hd;
                const double w = (double)pr[0] / (double)(bk - a + 1);
                double dm = 0.0;
                for (int64_t e = 0; e < hd; e++) {
                    dm += (double)di[e] * prefix_mean(vps, hd, a, bk, e);
                    dmean[a * hd + e] += w * di[e];
                    dmean[(bk + 1) * hd + e] -= w * di[e];
                }
                row[0] = (float)dm;
            }
            double dot = 0.0;
            for (int64_t c = 0; c < nk; c++) dot += (double)pr[c] * row[c];
            if (o.sink) dsink -= sink_mass(pr, nk) * dot;
            if (s->softcap > 0.0f) {
                const float *f = dcap + i * nk;
                for (int64_t c = 0; c < nk; c++) row[c] = pr[c] * (row[c] - (float)dot) * f[c];
            } else {
                for (int64_t c = 0; c < nk; c++) row[c] = pr[c] * (row[c] - (float)dot) * s->scale;
            }
        }
        SL_TRY(sl_sgemm(0, 0, nb, hd, nk, ds, nk, j->k + g * hd + ka * kvd, kvd, j->dq + (b * T + i0) * qd + h * hd,
                        qd, 0, 0));
        SL_TRY(sl_sgemm(1, 0, nk, hd, nb, ds, nk, j->q + i0 * qd + h * hd, qd, dk + ka * ld, ld, 1, 0));
        /* dv: key 0 takes nothing from the rows that read it as zero. */
        const int64_t skip = o.zero_first_value != SL_ZFV_NONE && ka == 0 ? 1 : 0;
        SL_TRY(sl_sgemm(1, 0, nk - skip, hd, nb, p + skip, T, dob, hd, dv + (ka + skip) * ld, ld, 1, 0));
        if (keeps_row0_value(&o) && i0 == 0) /* query 0 reads v_0 (ka == 0 here) */
            for (int64_t e = 0; e < hd; e++) dv[e] += p[0] * dob[e];
    }
    if (j->dsinks) j->dsinks[b * H + h] = (float)dsink;
    if (mean) { /* dv_j += the running sum of the difference array: what the means took from v_j */
        for (int64_t e = 0; e < hd; e++) dmean[e] = 0.0; /* j = 0 is never among the other keys */
        for (int64_t t = 1; t < T; t++)
            for (int64_t e = 0; e < hd; e++) {
                dmean[t * hd + e] += dmean[(t - 1) * hd + e];
                dv[t * ld + e] += (float)dmean[t * hd + e];
            }
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
    return sl_attention_backward_sink(s, B, q, k, v, probs, dout, dq, dk, dv, pk, pv, iv, NULL);
}

int sl_attention_backward_sink(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                               const float *probs, const float *dout, float *dq, float *dk, float *dv, float *pk,
                               float *pv, const sl_attn_intervention *iv, float *dsinks) {
    SL_TRY(check_mask(s));
    SL_TRY(check_keep(s, iv));
    const int shared = s->n_heads != s->n_kv_heads;
    if (shared && (!pk || !pv)) return sl_fail(SL_ERR_VALUE, "attention backward: grouped heads need partial buffers");
    attn_grad_job j = {.s = s, .iv = iv, .B = B, .q = q, .k = k, .v = v, .probs = probs, .dout = dout,
                       .dq = dq, .dk = dk, .dv = dv, .pk = shared ? pk : dk, .pv = shared ? pv : dv,
                       .ld_kv = (shared ? s->n_heads : s->n_kv_heads) * s->head_dim, .dsinks = dsinks};
    const int64_t scratch = SL_ATTN_QBLOCK * (s->T + s->head_dim + (s->softcap > 0.0f ? s->T : 0)) +
                            (any_value_mean(s, iv) ? 2 * (2 * s->T + 1) * s->head_dim : 0);
    SL_TRY(run_tasks(B * s->n_heads, scratch, backward_task, &j));
    if (shared) sum_group_partials(s, B, pk, pv, dk, dv);
    return SL_OK;
}

/* One (tangent b, query head h, query block), over the block's keys [ka, kb):
 *   dS_ij = c'_ij (tq_i . k_j + q_i . tk_j),  dP_ij = P_ij (dS_ij - sum_j' P_ij' dS_ij')
 *   tout_i = scale_h (sum_j dP_ij v'_j + P_ij tv'_j)
 * with c'_ij as in backward_task and v'_0 = tv'_0 = 0 where zero_first_value applies; under
 * SL_ZFV_MEAN v'_0, tv'_0 are the means of v, tv over query i's other keys. Scratch: a block of dS
 * and, with a softcap, of c'; with SL_ZFV_MEAN anywhere, the prefix sums of v and tv (doubles). */
static int jvp_task(void *arg, int64_t task, float *scratch) {
    const attn_grad_job *j = arg;
    const sl_attn_shape *s = j->s;
    const int64_t T = s->T, H = s->n_heads, G = s->n_kv_heads, hd = s->head_dim;
    const int64_t qd = H * hd, kvd = G * hd, nblk = n_query_blocks(T);
    const int64_t b = task / (H * nblk), h = (task / nblk) % H, blk = task % nblk, g = h / (H / G);
    const int64_t i0 = blk * SL_ATTN_QBLOCK, i1 = i0 + SL_ATTN_QBLOCK < T ? i0 + SL_ATTN_QBLOCK : T;
    head_opts o = options_for_head(s, j->iv, NULL, h, T, NULL);
    int64_t ka, kb;
    dense_block_keys(s, &o, i0, i1, T, &ka, &kb);
    const int64_t nb = i1 - i0, nk = kb - ka;
    const float *p = j->probs + (h * T + i0) * T + ka;
    const float *tq = j->dq + (b * T + i0) * qd + h * hd, *tk = j->dk + b * T * kvd + g * hd;
    const float *tv = j->dv + b * T * kvd + g * hd, *vh = j->v + g * hd;
    float *ds = scratch, *dcap = scratch + SL_ATTN_QBLOCK * T, *out = j->tout + (b * T + i0) * qd + h * hd;
    /* the sink's tangent enters each row's mean as p_i,sink ts_h */
    const double ts = o.sink && j->tsinks ? (double)j->tsinks[b * H + h] : 0.0;
    SL_TRY(sl_sgemm(0, 1, nb, nk, hd, tq, qd, j->k + g * hd + ka * kvd, kvd, ds, nk, 0, 0));
    SL_TRY(sl_sgemm(0, 1, nb, nk, hd, j->q + i0 * qd + h * hd, qd, tk + ka * kvd, kvd, ds, nk, 1, 0));
    if (s->softcap > 0.0f) {
        SL_TRY(softcap_factors(s, j->q + h * hd, qd, j->k + g * hd, kvd, i0, i1, ka, kb, dcap));
        for (int64_t i = 0; i < nb; i++) {
            float *row = ds + i * nk;
            const float *pr = p + i * T, *f = dcap + i * nk;
            double dot = 0.0;
            for (int64_t c = 0; c < nk; c++) {
                row[c] *= f[c];
                dot += (double)pr[c] * row[c];
            }
            if (ts != 0.0) dot += sink_mass(pr, nk) * ts;
            for (int64_t c = 0; c < nk; c++) row[c] = pr[c] * (row[c] - (float)dot);
        }
    } else {
        for (int64_t i = 0; i < nb; i++) {
            float *row = ds + i * nk;
            const float *pr = p + i * T;
            double dot = 0.0;
            for (int64_t c = 0; c < nk; c++) dot += (double)pr[c] * row[c];
            const float mean = (float)(dot * (double)s->scale + (ts != 0.0 ? sink_mass(pr, nk) * ts : 0.0));
            for (int64_t c = 0; c < nk; c++) row[c] = pr[c] * (row[c] * s->scale - mean);
        }
    }
    const int64_t skip = o.zero_first_value != SL_ZFV_NONE && ka == 0 ? 1 : 0;
    if (nk - skip > 0) {
        SL_TRY(sl_sgemm(0, 0, nb, hd, nk - skip, ds + skip, nk, vh + (ka + skip) * kvd, kvd, out, qd, 0, 0));
        SL_TRY(sl_sgemm(0, 0, nb, hd, nk - skip, p + skip, T, tv + (ka + skip) * kvd, kvd, out, qd, 1, 0));
    } else {
        for (int64_t i = 0; i < nb; i++) memset(out + i * qd, 0, (size_t)hd * sizeof(float));
    }
    if (keeps_row0_value(&o) && i0 == 0) { /* query 0 keeps its own value (ka == 0 here) */
        if (s->bidirectional) { /* and sees every key: its whole row */
            SL_TRY(sl_sgemm(0, 0, 1, hd, nk, ds, nk, vh, kvd, out, qd, 0, 0));
            SL_TRY(sl_sgemm(0, 0, 1, hd, nk, p, T, tv, kvd, out, qd, 1, 0));
        } else {
            for (int64_t e = 0; e < hd; e++) out[e] = ds[0] * vh[e] + p[0] * tv[e];
        }
    }
    if (o.zero_first_value == SL_ZFV_MEAN && ka == 0) {
        /* prefix sums over the keys the block's rows can see: [0, i1) causal, [0, T) bidirectional */
        const int64_t n = s->bidirectional ? T : i1;
        double *vps = (double *)(dcap + (s->softcap > 0.0f ? SL_ATTN_QBLOCK * T : 0)), *tps = vps + T * hd;
        value_prefix(vh, kvd, n, hd, vps);
        value_prefix(tv, kvd, n, hd, tps);
        for (int64_t i = i0 > 0 ? i0 : 1; i < i1; i++) {
            int64_t a, bk;
            if (!other_keys(s, &o, i, T, &a, &bk)) continue;
            const float d0 = ds[(i - i0) * nk], p0 = p[(i - i0) * T];
            for (int64_t e = 0; e < hd; e++)
                out[(i - i0) * qd + e] += d0 * prefix_mean(vps, hd, a, bk, e) + p0 * prefix_mean(tps, hd, a, bk, e);
        }
    }
    if (o.scale != 1.0f)
        for (int64_t i = 0; i < nb; i++)
            for (int64_t e = 0; e < hd; e++) out[i * qd + e] *= o.scale;
    return SL_OK;
}

int sl_attention_jvp(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                     const float *probs, const float *tq, const float *tk, const float *tv, float *tout,
                     const sl_attn_intervention *iv) {
    return sl_attention_jvp_sink(s, B, q, k, v, probs, tq, tk, tv, NULL, tout, iv);
}

int sl_attention_jvp_sink(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                          const float *probs, const float *tq, const float *tk, const float *tv, const float *tsinks,
                          float *tout, const sl_attn_intervention *iv) {
    SL_TRY(check_mask(s));
    SL_TRY(check_keep(s, iv));
    attn_grad_job j = {.s = s, .iv = iv, .B = B, .q = q, .k = k, .v = v, .probs = probs,
                       .dq = (float *)tq, .dk = (float *)tk, .dv = (float *)tv, .tout = tout, .tsinks = tsinks};
    const int64_t scratch = SL_ATTN_QBLOCK * s->T * (s->softcap > 0.0f ? 2 : 1) +
                            (any_value_mean(s, iv) ? 4 * s->T * s->head_dim : 0);
    return run_tasks(B * s->n_heads * n_query_blocks(s->T), scratch, jvp_task, &j);
}

/* ------------------------------------------------------------------------------------------
 * Gated attention's elementwise gate (attention.h). Elements are independent: any split over
 * threads gives the same bits. */

static inline float gate_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

void sl_attn_gate_forward(float *zg, const float *z, const float *g, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(sl_num_threads()) if (n > 65536)
    for (int64_t i = 0; i < n; i++) zg[i] = z[i] * gate_sigmoid(g[i]);
}

void sl_attn_gate_backward(float *dz, float *dg, const float *dzg, const float *z, const float *g, int64_t n,
                           int64_t period) {
#pragma omp parallel for schedule(static) num_threads(sl_num_threads()) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = i % period;
        const float sg = gate_sigmoid(g[t]), d = dzg[i];
        dg[i] = d * z[t] * sg * (1.0f - sg);
        dz[i] = d * sg;
    }
}

void sl_attn_gate_jvp(float *tzg, const float *tz, const float *tg, const float *z, const float *g, int64_t n,
                      int64_t period) {
#pragma omp parallel for schedule(static) num_threads(sl_num_threads()) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = i % period;
        const float sg = gate_sigmoid(g[t]);
        tzg[i] = tz[i] * sg + (tg ? z[t] * sg * (1.0f - sg) * tg[i] : 0.0f);
    }
}

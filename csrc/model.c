/* The transformer forward, layer by layer, in the order of Hugging Face's LlamaDecoderLayer:
 *   x += Wo · attention(rope(Wq·n1(x)), rope(Wk·n1(x)), Wv·n1(x))
 *   x += Wdown · (silu(Wgate·n2(x)) * Wup·n2(x))
 * A batch of sequences is packed row after row (only the real tokens of each), so every weight
 * product runs once over all of them; RoPE and attention are per sequence. Activations live in
 * one workspace, cached in the model between calls (sl_ws_cache: fresh pages are slow to touch);
 * weights are only read. Captures (sl_capture) are copies out of that workspace, taken as each
 * tensor is produced, scattered to each sequence's padded buffers.
 *
 * Each residual add is x + (W·h) with the product summed on its own first, as the reference
 * does: accumulating the dot product straight onto x would round every term at the scale of x,
 * and residual streams carry "massive activations" (hundreds to 10^4 in SmolLM2). */
#include "model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "ops.h"
#include "sgemm.h"
#include "sl_common.h"

/* The workspace: packed-row activations, RoPE tables, the attention's scratch and the batch's
 * index arrays, each a buffer grown on demand (never shrunk while cached). Fields are written
 * before they are read in every call, so nothing is zeroed and a cached workspace needs no
 * clearing. */
enum { WS_X, WS_XB, WS_Q, WS_K, WS_V, WS_ATT, WS_GATE, WS_UP, WS_COS, WS_SIN, WS_COSB, WS_SINB,
       WS_VT, WS_PART, WS_SCRATCH, WS_IDX, WS_N };

struct sl_workspace {
    float *buf[WS_N];
    int64_t cap[WS_N]; /* floats */
};

static void ws_destroy(sl_workspace *w) {
    if (!w) return;
    for (int i = 0; i < WS_N; i++) sl_free(w->buf[i]);
    sl_free(w);
}

static int64_t ws_bytes(const sl_workspace *w) {
    int64_t n = 0;
    for (int i = 0; i < WS_N; i++) n += w->cap[i];
    return 4 * n;
}

/* Grows the fields [first, last) to at least need[i] floats, freeing each old buffer first. */
static int ws_reserve(sl_workspace *w, const int64_t *need, int first, int last) {
    for (int i = first; i < last; i++) {
        if (w->cap[i] >= need[i]) continue;
        sl_free(w->buf[i]);
        w->cap[i] = 0;
        if (!(w->buf[i] = sl_alloc_floats_uninit(need[i] > 0 ? need[i] : 1)))
            return sl_fail(SL_ERR_MEMORY, "forward: cannot allocate %lld bytes of activations",
                           (long long)(4 * need[i]));
        w->cap[i] = need[i];
    }
    return SL_OK;
}

static sl_workspace *ws_take(sl_ws_cache *c) {
    sl_workspace *w = c ? atomic_exchange(&c->slot, NULL) : NULL;
    return w ? w : calloc(1, sizeof(sl_workspace));
}

/* Back into the cache when it is empty and w is small enough, else freed. */
static void ws_put(sl_ws_cache *c, sl_workspace *w) {
    if (!w) return;
    if (c && ws_bytes(w) <= SL_WS_CACHE_MAX_BYTES) {
        sl_workspace *empty = NULL;
        if (atomic_compare_exchange_strong(&c->slot, &empty, w)) return;
    }
    ws_destroy(w);
}

void sl_ws_cache_clear(sl_ws_cache *c) { ws_destroy(atomic_exchange(&c->slot, NULL)); }

int64_t sl_ws_cache_bytes(sl_ws_cache *c) {
    /* Only a peek for tests and reports: take it and put it back. */
    sl_workspace *w = atomic_exchange(&c->slot, NULL);
    if (!w) return 0;
    const int64_t n = ws_bytes(w);
    ws_put(c, w);
    return n;
}

/* One call's view of the workspace: packed activations (rows = off[B]) and the batch. */
typedef struct {
    float *x, *xb, *q, *k, *v, *att, *gate, *up, *cosv, *sinv; /* (rows, ·) */
    float *cosb, *sinb;                                        /* (T, hd/2): positions 0..T-1 */
    sl_attn_batch ab;                                          /* B, T_pad, off, len, scratch */
    float **lists;                                             /* 4*B: ab's per-layer pointers */
} acts;

/* Binds w to a batch of B sequences padded to T with the given lengths (NULL: all T), growing
 * it as needed. */
static int acts_bind(acts *a, sl_workspace *w, const sl_model *m, int64_t B, int64_t T, const int64_t *lengths,
                     int need_importance) {
    const int64_t d = m->d_model, qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    const int64_t half = m->head_dim / 2, F = m->d_ff;
    int64_t need[WS_N] = {0};
    /* Index arrays first (int64, pointers): off B+1, len B, task_off B+1, part_off B, lists 4B. */
    need[WS_IDX] = 2 * (8 * B + 2);
    SL_TRY(ws_reserve(w, need, WS_IDX, WS_IDX + 1));
    int64_t *idx = (int64_t *)w->buf[WS_IDX], *off = idx, *len = idx + B + 1, rows = 0;
    off[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        len[b] = lengths ? lengths[b] : T;
        if (len[b] > INT64_MAX / 16 - rows) return sl_fail(SL_ERR_MEMORY, "forward: size overflow");
        off[b + 1] = rows += len[b];
    }
    memset(&a->ab, 0, sizeof a->ab);
    a->ab.B = B, a->ab.T_pad = T, a->ab.off = off, a->ab.len = len;
    a->ab.task_off = idx + 2 * B + 1, a->ab.part_off = idx + 3 * B + 2;
    a->lists = (float **)(idx + 4 * B + 2);
    a->ab.importance = need_importance ? a->lists : NULL; /* only read for its NULL-ness below */
    const sl_attn_shape s = {.T = T, .n_heads = m->n_heads, .n_kv_heads = m->n_kv_heads, .head_dim = m->head_dim, .scale = 1.0f};
    int64_t att[3], per_row[WS_COSB] = {d, d, qd, kvd, kvd, qd, F, F, half, half};
    sl_attn_batch_floats(&s, &a->ab, sl_num_threads(), att);
    a->ab.importance = NULL;
    for (int i = 0; i < WS_COSB; i++)
        if (!sl_mul_size(per_row[i], rows, &need[i])) return sl_fail(SL_ERR_MEMORY, "forward: size overflow");
    need[WS_COSB] = need[WS_SINB] = T * half;
    need[WS_VT] = att[0], need[WS_PART] = att[1], need[WS_SCRATCH] = att[2];
    SL_TRY(ws_reserve(w, need, 0, WS_IDX));
    a->x = w->buf[WS_X], a->xb = w->buf[WS_XB], a->q = w->buf[WS_Q], a->k = w->buf[WS_K];
    a->v = w->buf[WS_V], a->att = w->buf[WS_ATT], a->gate = w->buf[WS_GATE], a->up = w->buf[WS_UP];
    a->cosv = w->buf[WS_COS], a->sinv = w->buf[WS_SIN], a->cosb = w->buf[WS_COSB], a->sinb = w->buf[WS_SINB];
    a->ab.vt = w->buf[WS_VT], a->ab.partial = (double *)w->buf[WS_PART], a->ab.scratch = w->buf[WS_SCRATCH];
    return SL_OK;
}

static int check_model(const sl_model *m) {
    if (m->n_layers <= 0 || m->n_heads <= 0 || m->n_kv_heads <= 0 || m->d_model <= 0 ||
        m->head_dim <= 0 || m->head_dim % 2 || m->d_ff <= 0 || m->vocab_size <= 0 ||
        m->n_heads % m->n_kv_heads)
        return sl_fail(SL_ERR_VALUE, "forward: inconsistent model dimensions");
    return SL_OK;
}

/* Rejects a zero_first_value code the kernel does not know before any layer runs, naming where. */
static int check_intervention(const sl_model *m, const sl_intervention *iv) {
    if (!iv || !iv->zero_first_value) return SL_OK;
    for (int64_t l = 0; l < m->n_layers; l++)
        for (int64_t h = 0; h < m->n_heads; h++) {
            const int v = iv->zero_first_value[l * m->n_heads + h];
            if (v > SL_ZFV_ALL)
                return sl_fail(SL_ERR_VALUE,
                               "forward: zero_first_value[layer %lld, head %lld]=%d, expected 0 (none), "
                               "1 (others) or 2 (all)", (long long)l, (long long)h, v);
        }
    return SL_OK;
}

void sl_layer_intervention(const sl_model *m, const sl_intervention *iv, int64_t l, sl_attn_intervention *aiv) {
    memset(aiv, 0, sizeof *aiv);
    if (!iv) return;
    const int64_t off = l * m->n_heads;
    aiv->mask_first = iv->mask_first ? iv->mask_first + off : NULL;
    aiv->zero_first_value = iv->zero_first_value ? iv->zero_first_value + off : NULL;
    aiv->head_scale = iv->head_scale ? iv->head_scale + off : NULL;
}

/* cap->name[b*n + l] (n = entries per sequence), or NULL when not asked for. */
static float *cap_at(float **list, int64_t n, int64_t b, int64_t l) { return list ? list[b * n + l] : NULL; }

/* Sets the attention batch's per-sequence capture lists to layer l's entries (NULL lists when
 * the capture is not asked for at all). */
static void layer_lists(acts *a, const sl_model *m, const sl_capture *cap, int64_t l) {
    const int64_t B = a->ab.B, L = m->n_layers;
    float **src[4] = {cap ? cap->attn : NULL, cap ? cap->importance : NULL, cap ? cap->to_first : NULL,
                      cap ? cap->entropy : NULL};
    float ***dst[4] = {&a->ab.probs, &a->ab.importance, &a->ab.to_first, &a->ab.entropy};
    for (int c = 0; c < 4; c++) {
        float **list = a->lists + c * B;
        int any = 0;
        for (int64_t b = 0; b < B; b++) any |= (list[b] = cap_at(src[c], L, b, l)) != NULL;
        *dst[c] = any ? list : NULL;
    }
}

/* Each sequence's dst (n_heads, T, hd) from its packed token-major rows of src (row stride
 * `stride`): the head-major layout of the capture API, zeros at positions >= its length. With
 * the interleaved-pair RoPE layout (GGUF) each head is gathered back into the rotate-half layout
 * (element 2i -> i, 2i+1 -> i + hd/2, inverting llama.cpp's permutation of the Q/K rows), so
 * captures do not depend on the file format. A copy, serial: it is O(rows·H·hd), small beside
 * the products around it. */
static void capture_heads(float **list, int64_t n_list, int64_t l, const acts *a, const float *src,
                          int64_t stride, int64_t n_heads, int64_t hd, int adjacent) {
    const int64_t half = hd / 2, T = a->ab.T_pad;
    for (int64_t b = 0; b < a->ab.B; b++) {
        float *dst = cap_at(list, n_list, b, l);
        if (!dst) continue;
        const int64_t n = a->ab.len[b];
        const float *sb = src + a->ab.off[b] * stride;
        for (int64_t h = 0; h < n_heads; h++) {
            for (int64_t t = 0; t < n; t++) {
                const float *s = sb + t * stride + h * hd;
                float *o = dst + (h * T + t) * hd;
                if (!adjacent) {
                    memcpy(o, s, (size_t)hd * sizeof(float));
                    continue;
                }
                for (int64_t i = 0; i < half; i++) {
                    o[i] = s[2 * i];
                    o[i + half] = s[2 * i + 1];
                }
            }
            memset(dst + (h * T + n) * hd, 0, (size_t)((T - n) * hd) * sizeof(float));
        }
    }
}

/* Each sequence's (T, d) block at dst + `at` from its packed rows of src, zeros after its length. */
static void capture_rows(float **list, int64_t n_list, int64_t l, int64_t at, const acts *a, const float *src,
                         int64_t d) {
    const int64_t T = a->ab.T_pad;
    for (int64_t b = 0; b < a->ab.B; b++) {
        float *dst = cap_at(list, n_list, b, l);
        if (!dst) continue;
        const int64_t n = a->ab.len[b];
        memcpy(dst + at, src + a->ab.off[b] * d, (size_t)(n * d) * sizeof(float));
        memset(dst + at + n * d, 0, (size_t)((T - n) * d) * sizeof(float));
    }
}

static void tape_copy(float *dst, const float *src, int64_t rows, int64_t d) {
    if (dst) memcpy(dst, src, (size_t)(rows * d) * sizeof(float));
}

/* With a tape (lt != NULL, one sequence) the layer's activations are written straight into it
 * (q, k, v, z, gate, up) or copied there (x, the norm outputs, h), for the backward and the JVP. */
static int attention_block(const sl_model *m, const sl_layer_weights *lw, acts *w, const sl_capture *cap,
                           int64_t l, const sl_attn_intervention *aiv, sl_layer_tape *lt) {
    const int64_t d = m->d_model, hd = m->head_dim, H = m->n_heads, G = m->n_kv_heads, L = m->n_layers;
    const int64_t qd = H * hd, kvd = G * hd, rows = w->ab.off[w->ab.B];
    const int adjacent = m->rope_layout == SL_ROPE_ADJACENT;
    acts view = *w;
    if (lt) {
        view.q = lt->q, view.k = lt->k, view.v = lt->v, view.att = lt->z;
        w = &view;
        tape_copy(lt->x, w->x, rows, d);
    }
    sl_rmsnorm(w->xb, lt ? lt->rstd1 : NULL, w->x, lw->attn_norm, rows, d, m->norm_eps);
    if (lt) tape_copy(lt->xn1, w->xb, rows, d);
    SL_TRY(sl_sgemm_nt(rows, qd, d, w->xb, d, lw->wq, d, w->q, qd, 0, 1));
    SL_TRY(sl_sgemm_nt(rows, kvd, d, w->xb, d, lw->wk, d, w->k, kvd, 0, 1));
    SL_TRY(sl_sgemm_nt(rows, kvd, d, w->xb, d, lw->wv, d, w->v, kvd, 0, 1));
    /* cosv/sinv hold each packed row's own position, so one call rotates every sequence. */
    sl_rope_apply(w->q, rows, qd, H, hd, w->cosv, w->sinv, m->rope_layout);
    sl_rope_apply(w->k, rows, kvd, G, hd, w->cosv, w->sinv, m->rope_layout);
    if (cap) {
        capture_heads(cap->q, L, l, w, w->q, qd, H, hd, adjacent);
        capture_heads(cap->k, L, l, w, w->k, kvd, G, hd, adjacent);
        capture_heads(cap->v, L, l, w, w->v, kvd, G, hd, 0); /* V rows are never permuted */
    }
    layer_lists(w, m, cap, l);
    sl_attn_shape s = {.T = w->ab.T_pad, .n_heads = H, .n_kv_heads = G, .head_dim = hd, .scale = (float)(1.0 / sqrt((double)hd))};
    SL_TRY(sl_attention_forward_batch(&s, &w->ab, w->q, qd, w->k, w->v, kvd, w->att, aiv));
    if (cap) capture_heads(cap->z, L, l, w, w->att, qd, H, hd, 0);
    /* Head h's share of the W_O product, from its hd columns of W_O, for all rows at once into
     * xb (free until the W_O product): summed over heads it is attn_out up to rounding (a
     * different summation order over the H*hd inputs). */
    int any_head = 0;
    for (int64_t b = 0; b < w->ab.B && cap && cap->head_out; b++) any_head |= cap_at(cap->head_out, L, b, l) != NULL;
    for (int64_t h = 0; h < H && any_head; h++) {
        SL_TRY(sl_sgemm_nt(rows, d, hd, w->att + h * hd, qd, lw->wo + h * hd, qd, w->xb, d, 0, 1));
        capture_rows(cap->head_out, L, l, h * w->ab.T_pad * d, w, w->xb, d);
    }
    SL_TRY(sl_sgemm_nt(rows, d, qd, w->att, qd, lw->wo, qd, w->xb, d, 0, 1));
    if (cap) capture_rows(cap->attn_out, L, l, 0, w, w->xb, d);
    sl_add_inplace(w->x, w->xb, rows * d);
    if (lt) tape_copy(lt->h, w->x, rows, d);
    return SL_OK;
}

static int mlp_block(const sl_model *m, const sl_layer_weights *lw, acts *w, const sl_capture *cap, int64_t l,
                     sl_layer_tape *lt) {
    const int64_t d = m->d_model, F = m->d_ff, rows = w->ab.off[w->ab.B];
    float *gate = lt ? lt->gate : w->gate, *up = lt ? lt->up : w->up;
    sl_rmsnorm(w->xb, lt ? lt->rstd2 : NULL, w->x, lw->ffn_norm, rows, d, m->norm_eps);
    if (lt) tape_copy(lt->xn2, w->xb, rows, d);
    SL_TRY(sl_sgemm_nt(rows, F, d, w->xb, d, lw->w_gate, d, gate, F, 0, 1));
    SL_TRY(sl_sgemm_nt(rows, F, d, w->xb, d, lw->w_up, d, up, F, 0, 1));
    sl_swiglu(w->gate, gate, up, rows * F); /* the workspace's gate buffer holds the activation */
    SL_TRY(sl_sgemm_nt(rows, d, F, w->gate, F, lw->w_down, F, w->xb, d, 0, 1));
    if (cap) capture_rows(cap->mlp_out, m->n_layers, l, 0, w, w->xb, d);
    sl_add_inplace(w->x, w->xb, rows * d);
    return SL_OK;
}

static void capture_resid(const sl_model *m, const sl_capture *cap, int64_t l, const acts *w) {
    if (cap) capture_rows(cap->resid, m->n_layers + 1, l, 0, w, w->x, m->d_model);
}

/* Checks shared by every entry point that runs the model on ids: B rows of T ids each. */
static int check_run(const sl_model *m, const int64_t *ids, int64_t B, int64_t T, const int64_t *lengths,
                     const sl_intervention *iv) {
    SL_TRY(check_model(m));
    SL_TRY(check_intervention(m, iv));
    if (T <= 0) return sl_fail(SL_ERR_VALUE, "forward: empty sequence");
    if (B <= 0) return sl_fail(SL_ERR_VALUE, "forward: empty batch");
    for (int64_t b = 0; b < B && lengths; b++)
        if (lengths[b] < 1 || lengths[b] > T)
            return sl_fail(SL_ERR_VALUE, "forward: lengths[%lld]=%lld outside [1, %lld]", (long long)b,
                           (long long)lengths[b], (long long)T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const int64_t id = ids[b * T + t];
            if (id < 0 || id >= m->vocab_size) {
                if (B == 1)
                    return sl_fail(SL_ERR_VALUE, "forward: token id %lld at position %lld is outside [0, %lld)",
                                   (long long)id, (long long)t, (long long)m->vocab_size);
                return sl_fail(SL_ERR_VALUE,
                               "forward: token id %lld at position %lld of sequence %lld is outside [0, %lld)",
                               (long long)id, (long long)t, (long long)b, (long long)m->vocab_size);
            }
        }
    return SL_OK;
}

/* Layers [0, n_run) on the embedded ids (row stride T), leaving resid[n_run] in w->x. */
static int run_layers(const sl_model *m, const int64_t *ids, int64_t n_run, acts *w, const sl_capture *cap,
                      const sl_intervention *iv, sl_layer_tape *tapes) {
    const int64_t d = m->d_model, half = m->head_dim / 2, T = w->ab.T_pad;
    sl_rope_tables(w->cosb, w->sinb, m->rope_inv_freq, T, half);
    for (int64_t b = 0; b < w->ab.B; b++) {
        const int64_t n = w->ab.len[b], off = w->ab.off[b];
        sl_embed(w->x + off * d, m->tok_embd, ids + b * T, n, d);
        memcpy(w->cosv + off * half, w->cosb, (size_t)(n * half) * sizeof(float));
        memcpy(w->sinv + off * half, w->sinb, (size_t)(n * half) * sizeof(float));
    }
    for (int64_t l = 0; l < n_run; l++) {
        capture_resid(m, cap, l, w);
        sl_attn_intervention aiv;
        sl_layer_intervention(m, iv, l, &aiv);
        sl_layer_tape *lt = tapes ? &tapes[l] : NULL;
        SL_TRY(attention_block(m, &m->layers[l], w, cap, l, &aiv, lt));
        SL_TRY(mlp_block(m, &m->layers[l], w, cap, l, lt));
    }
    return SL_OK;
}

/* The final norm and the output head on positions logits_from.. of each sequence, packed into
 * xb; one product when no sequence is shorter than T, else one per sequence (each writes its own
 * block of the (B, T - logits_from, V) output, the rest of which is zeroed). */
static int logits_head(const sl_model *m, acts *w, const sl_capture *cap) {
    const int64_t d = m->d_model, V = m->vocab_size, from = cap->logits_from, T = w->ab.T_pad, nl = T - from;
    int64_t r = 0;
    int ragged = 0;
    for (int64_t b = 0; b < w->ab.B; b++) {
        const int64_t n = w->ab.len[b] > from ? w->ab.len[b] - from : 0;
        memcpy(w->xb + r * d, w->x + (w->ab.off[b] + from) * d, (size_t)(n * d) * sizeof(float));
        r += n;
        ragged |= n != nl;
    }
    sl_rmsnorm(w->xb, NULL, w->xb, m->out_norm, r, d, m->norm_eps);
    if (!ragged) return sl_sgemm_nt(r, V, d, w->xb, d, m->lm_head, d, cap->logits, V, 0, 1);
    r = 0;
    for (int64_t b = 0; b < w->ab.B; b++) {
        const int64_t n = w->ab.len[b] > from ? w->ab.len[b] - from : 0;
        float *out = cap->logits + b * nl * V;
        if (n > 0) SL_TRY(sl_sgemm_nt(n, V, d, w->xb + r * d, d, m->lm_head, d, out, V, 0, 1));
        memset(out + n * V, 0, (size_t)((nl - n) * V) * sizeof(float));
        r += n;
    }
    return SL_OK;
}

int sl_model_forward_batch(const sl_model *m, const int64_t *ids, int64_t B, int64_t T,
                           const int64_t *lengths, const sl_capture *cap, const sl_intervention *iv,
                           sl_ws_cache *cache) {
    SL_TRY(check_run(m, ids, B, T, lengths, iv));
    if (cap && cap->logits && (cap->logits_from < 0 || cap->logits_from >= T))
        return sl_fail(SL_ERR_VALUE, "forward: logits_from=%lld outside [0, %lld)",
                       (long long)cap->logits_from, (long long)T);
    sl_workspace *ws = ws_take(cache);
    if (!ws) return sl_fail(SL_ERR_MEMORY, "forward: cannot allocate the workspace");
    acts w;
    int rc = acts_bind(&w, ws, m, B, T, lengths, cap && cap->importance);
    if (rc == SL_OK) rc = run_layers(m, ids, m->n_layers, &w, cap, iv, NULL);
    if (rc == SL_OK) capture_resid(m, cap, m->n_layers, &w);
    if (rc == SL_OK && cap && cap->logits) rc = logits_head(m, &w, cap);
    ws_put(cache, ws);
    return rc;
}

int sl_model_forward(const sl_model *m, const int64_t *ids, int64_t T, const sl_capture *cap,
                     const sl_intervention *iv) {
    return sl_model_forward_batch(m, ids, 1, T, NULL, cap, iv, NULL);
}

/* ------------------------------------------------------------------------------------------
 * Tapes: what the backward and the JVP read of the forward. */

/* Floats of each tape field for T tokens, in the order of sl_layer_tape's fields. */
static void tape_sizes(const sl_model *m, int64_t sizes[12]) {
    const int64_t d = m->d_model, qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    const int64_t per_token[12] = {d, d, 1, qd, kvd, kvd, qd, d, d, 1, m->d_ff, m->d_ff};
    memcpy(sizes, per_token, sizeof per_token);
}

int64_t sl_layer_tape_floats(const sl_model *m, int64_t T) {
    int64_t sizes[12], total = 0, n;
    tape_sizes(m, sizes);
    for (int i = 0; i < 12; i++) {
        if (!sl_mul_size(sizes[i], T, &n) || n > INT64_MAX - 16 - total) return -1;
        total += (n + 15) / 16 * 16; /* each field 64-byte aligned */
    }
    return total;
}

int sl_layer_tape_bind(const sl_model *m, int64_t T, float *buf, sl_layer_tape *lt) {
    int64_t sizes[12];
    tape_sizes(m, sizes);
    float **fields[12] = {&lt->x, &lt->xn1, &lt->rstd1, &lt->q, &lt->k, &lt->v, &lt->z, &lt->h, &lt->xn2,
                          &lt->rstd2, &lt->gate, &lt->up};
    for (int i = 0; i < 12; i++) {
        *fields[i] = buf;
        buf += (sizes[i] * T + 15) / 16 * 16;
    }
    return SL_OK;
}

int sl_model_forward_tape(const sl_model *m, const int64_t *ids, int64_t T, int64_t n_run,
                          sl_layer_tape *tapes, const sl_intervention *iv, float *x_out, float *cosv,
                          float *sinv) {
    SL_TRY(check_run(m, ids, 1, T, NULL, iv));
    if (n_run < 0 || n_run > m->n_layers)
        return sl_fail(SL_ERR_VALUE, "forward: %lld layers asked of a model with %lld", (long long)n_run,
                       (long long)m->n_layers);
    sl_workspace *ws = ws_take(NULL);
    if (!ws) return sl_fail(SL_ERR_MEMORY, "forward: cannot allocate the workspace");
    acts w;
    int rc = acts_bind(&w, ws, m, 1, T, NULL, 0);
    if (rc == SL_OK) rc = run_layers(m, ids, n_run, &w, NULL, iv, tapes);
    const int64_t d = m->d_model, half = m->head_dim / 2;
    if (rc == SL_OK && x_out) memcpy(x_out, w.x, (size_t)(T * d) * sizeof(float));
    if (rc == SL_OK && cosv) memcpy(cosv, w.cosv, (size_t)(T * half) * sizeof(float));
    if (rc == SL_OK && sinv) memcpy(sinv, w.sinv, (size_t)(T * half) * sizeof(float));
    ws_destroy(ws);
    return rc;
}

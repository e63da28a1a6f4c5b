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
 * and residual streams carry "massive activations" (hundreds to 10^4 in SmolLM2).
 *
 * Parallel regions (each one a fork/join, and a stall whenever a thread of the team waits for a
 * shared core): 7 per layer at any precision (T >= 64), from 15 (fp32/bf16) and 22 (int8): Q, K
 * and V as one call (linear_shared: the three products' tiles in one region; bf16 and int8 also
 * round or quantize the input once); the attention, which also applies RoPE to q and k
 * (sl_attn_batch's prologue); W_O; the residual add fused with the MLP's pre-norm; gate and up as
 * one call; W_down, whose prologue computes the activation row by row; the residual add fused
 * with the next layer's pre-norm. Each fusion keeps every op's per-element arithmetic and the
 * order of every reduction, so the bits are those of the separate ops; where something reads the
 * tensor in between (a capture of attn_out, mlp_out, q or k; a tape, for the add and norm) that
 * layer runs those ops one by one. At 2 threads a SmolLM2 forward (30 layers) forks 213 teams,
 * from 452 (fp32/bf16) and 663 (int8) at T = 512; benchmarks/bench_regions.py counts them. */
#include "model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "gemm_bf16.h"
#include "gemm_int8.h"
#include "ops.h"
#include "quant.h"
#include "sgemm.h"
#include "sl_common.h"

/* The workspace: packed-row activations, RoPE tables, the attention's scratch and the batch's
 * index arrays, each a buffer grown on demand (never shrunk while cached). Fields are written
 * before they are read in every call, so nothing is zeroed and a cached workspace needs no
 * clearing. */
enum { WS_X, WS_XB, WS_Q, WS_K, WS_V, WS_ATT, WS_GATE, WS_UP, WS_COS, WS_SIN, WS_AG, WS_COSB, WS_SINB,
       WS_FREQ, WS_VT, WS_PART, WS_SCRATCH, WS_IDX, WS_N };

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
    float *ag;                                                 /* (rows, H*hd) W_g a, gated attention */
    float *cosb, *sinb;                                        /* (T, hd/2): positions 0..T-1 */
    float *freq;                                               /* (hd/2): what cosb/sinb were made of */
    int freq_valid;
    int xb_normed; /* xb already holds the next block's pre-norm of x (see block_output) */
    sl_attn_batch ab;                                          /* B, T_pad, off, len, scratch */
    float **lists;                                             /* 4*B: ab's per-layer pointers */
} acts;

/* Floats per packed row of the workspace fields [WS_X, WS_COSB), in their order. */
static void act_row_floats(const sl_model *m, int64_t per_row[WS_COSB]) {
    const int64_t d = m->d_model, qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    const int64_t half = m->head_dim / 2, F = m->d_ff;
    const int64_t gated = m->attn_variant == SL_ATTN_GATED;
    const int64_t n[WS_COSB] = {d, d, qd, kvd, kvd, qd, F, F, half, half, gated * qd};
    memcpy(per_row, n, sizeof n);
}

int64_t sl_model_forward_floats(const sl_model *m, int64_t rows) {
    int64_t per_row[WS_COSB], total;
    act_row_floats(m, per_row);
    const sl_attn_shape s = {.n_heads = m->n_heads, .n_kv_heads = m->n_kv_heads, .head_dim = m->head_dim};
    int64_t sum = sl_attn_row_floats(&s);
    for (int i = 0; i < WS_COSB; i++) sum += per_row[i];
    return rows >= 0 && sl_mul_size(sum, rows, &total) ? total : -1;
}

int64_t sl_model_dim(const sl_model *m, sl_dim dim) {
    int64_t n;
    switch (dim) {
    case SL_DIM_D: return m->d_model;
    case SL_DIM_QD: return sl_mul_size(m->n_heads, m->head_dim, &n) ? n : -1;
    case SL_DIM_KVD: return sl_mul_size(m->n_kv_heads, m->head_dim, &n) ? n : -1;
    case SL_DIM_HD: return m->head_dim;
    case SL_DIM_F: return m->d_ff;
    case SL_DIM_V: return m->vocab_size;
    case SL_DIM_NPOS: return m->n_pos;
    case SL_DIM_H: return m->n_heads;
    default: return 1;
    }
}

const char *sl_dim_name(sl_dim dim) {
    static const char *names[SL_DIM_COUNT] = {"", "d", "qd", "kvd", "hd", "F", "V", "n_pos", "H"};
    return dim >= 0 && dim < SL_DIM_COUNT ? names[dim] : "";
}

const char *sl_kind_name(int kind) {
    static const char *names[] = {"matrix", "vector", "table"};
    return kind >= 0 && kind < 3 ? names[kind] : "";
}

const char *sl_role_name(int role) {
    static const char *names[] = {"embedding", "head", "norm", "norm_bias", "matrix", "bias", "sink"};
    return role >= 0 && role < 7 ? names[role] : "";
}

/* Binds w to a batch of B sequences padded to T with the given lengths (NULL: all T), growing
 * it as needed. */
static int acts_bind(acts *a, sl_workspace *w, const sl_model *m, int64_t B, int64_t T, const int64_t *lengths,
                     int need_importance) {
    const int64_t half = m->head_dim / 2;
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
    const sl_attn_shape s = {.T = T, .n_heads = m->n_heads, .n_kv_heads = m->n_kv_heads, .head_dim = m->head_dim,
                             .scale = 1.0f, .bidirectional = m->bidirectional};
    int64_t att[3], per_row[WS_COSB];
    act_row_floats(m, per_row);
    sl_attn_batch_floats(&s, &a->ab, sl_num_threads(), att);
    a->ab.importance = NULL;
    for (int i = 0; i < WS_COSB; i++)
        if (!sl_mul_size(per_row[i], rows, &need[i])) return sl_fail(SL_ERR_MEMORY, "forward: size overflow");
    need[WS_COSB] = need[WS_SINB] = T * half;
    need[WS_FREQ] = half;
    need[WS_VT] = att[0], need[WS_PART] = att[1], need[WS_SCRATCH] = att[2];
    SL_TRY(ws_reserve(w, need, 0, WS_IDX));
    a->x = w->buf[WS_X], a->xb = w->buf[WS_XB], a->q = w->buf[WS_Q], a->k = w->buf[WS_K];
    a->v = w->buf[WS_V], a->att = w->buf[WS_ATT], a->gate = w->buf[WS_GATE], a->up = w->buf[WS_UP];
    a->cosv = w->buf[WS_COS], a->sinv = w->buf[WS_SIN], a->cosb = w->buf[WS_COSB], a->sinb = w->buf[WS_SINB];
    a->ag = w->buf[WS_AG];
    a->freq = w->buf[WS_FREQ], a->freq_valid = 0;
    a->ab.vt = w->buf[WS_VT], a->ab.partial = (double *)w->buf[WS_PART], a->ab.scratch = w->buf[WS_SCRATCH];
    return SL_OK;
}

/* Whether layer l has each tensor of the schema (and RoPE frequencies), as a bit set, so all
 * layers can be compared. */
static unsigned layer_features(const sl_layer_weights *lw) {
#define HAS(grad, key, kind, weight, rows, cols, required, role) SL_HAS_##kind(lw->weight),
    const int has[] = {SL_LAYER_TENSORS(HAS) lw->rope_inv_freq != NULL};
#undef HAS
    _Static_assert(sizeof has / sizeof has[0] <= 32, "layer features must fit an unsigned");
    unsigned f = 0;
    for (unsigned i = 0; i < sizeof has / sizeof has[0]; i++) f |= (unsigned)(has[i] != 0) << i;
    return f;
}

static int is_gated(int act) { return act == SL_ACT_SWIGLU || act == SL_ACT_GEGLU_TANH; }

int sl_model_check(const sl_model *m) {
    if (m->n_layers <= 0 || m->n_heads <= 0 || m->n_kv_heads <= 0 || m->d_model <= 0 ||
        m->head_dim <= 0 || m->head_dim % 2 || m->d_ff <= 0 || m->vocab_size <= 0 ||
        m->n_heads % m->n_kv_heads)
        return sl_fail(SL_ERR_VALUE, "forward: inconsistent model dimensions");
    if (m->norm_kind != SL_NORM_RMS && m->norm_kind != SL_NORM_LAYER)
        return sl_fail(SL_ERR_VALUE, "model: norm kind %d is neither RMSNorm (0) nor LayerNorm (1)", m->norm_kind);
    if (m->act < SL_ACT_SWIGLU || m->act > SL_ACT_GELU_ERF)
        return sl_fail(SL_ERR_VALUE, "model: unknown activation %d", m->act);
    if (m->rope_layout != SL_ROPE_HALF_SPLIT && m->rope_layout != SL_ROPE_ADJACENT)
        return sl_fail(SL_ERR_VALUE, "model: rope_layout must be 0 or 1, got %d", m->rope_layout);
    if (!(m->attn_softcap >= 0.0f) || !(m->final_softcap >= 0.0f) || !(m->attn_scale > 0.0f) ||
        !(m->embd_scale > 0.0f))
        return sl_fail(SL_ERR_VALUE, "model: attention scale and embedding scale must be > 0, soft-caps >= 0");
    if (m->pos_embd && m->n_pos <= 0) return sl_fail(SL_ERR_VALUE, "model: learned positions need n_pos > 0");
    if (m->attn_variant < SL_ATTN_SOFTMAX || m->attn_variant > SL_ATTN_GATED)
        return sl_fail(SL_ERR_VALUE, "model: attn_variant %d is not 0 (softmax), 1 (sink logit), 2 (softmax-plus-one) "
                       "or 3 (gated)", m->attn_variant);
    if (!m->layers) return sl_fail(SL_ERR_VALUE, "model: no layers");
    const unsigned f0 = layer_features(&m->layers[0]);
    for (int64_t l = 0; l < m->n_layers; l++) {
        const sl_layer_weights *lw = &m->layers[l];
        if (layer_features(lw) != f0)
            return sl_fail(SL_ERR_VALUE, "model: layer %lld has a different set of optional tensors than layer 0",
                           (long long)l);
        if ((lw->w_gate.data != NULL) != is_gated(m->act))
            return sl_fail(SL_ERR_VALUE, "model: layer %lld: the activation %s a gate projection", (long long)l,
                           is_gated(m->act) ? "needs" : "takes no");
        if (lw->window < 0) return sl_fail(SL_ERR_VALUE, "model: layer %lld has a negative window", (long long)l);
        if ((lw->attn_sinks != NULL) != (m->attn_variant == SL_ATTN_SINK_LOGIT))
            return sl_fail(SL_ERR_VALUE, "model: layer %lld: attn_variant %d %s attn_sinks", (long long)l,
                           m->attn_variant, lw->attn_sinks ? "takes no" : "needs");
        if ((lw->attn_gate.data != NULL) != (m->attn_variant == SL_ATTN_GATED))
            return sl_fail(SL_ERR_VALUE, "model: layer %lld: attn_variant %d %s attn_gate", (long long)l,
                           m->attn_variant, lw->attn_gate.data ? "takes no" : "needs");
    }
    return SL_OK;
}

int64_t sl_model_max_positions(const sl_model *m) { return m->pos_embd ? m->n_pos : INT64_MAX; }

int sl_model_attn_kernel(const sl_model *m) {
    return m->attn_variant == SL_ATTN_GATED ? SL_ATTN_SOFTMAX : m->attn_variant;
}

/* Document starts must describe contiguous documents of a sequence of T positions. */
static int check_key_start(const int64_t *key_start, int64_t T) {
    for (int64_t i = 0; i < T; i++)
        if (key_start[i] < 0 || key_start[i] > i || (i > 0 && key_start[i] < key_start[i - 1]))
            return sl_fail(SL_ERR_VALUE,
                           "forward: key_start[%lld]=%lld, expected a nondecreasing document start in [0, %lld]",
                           (long long)i, (long long)key_start[i], (long long)i);
    return SL_OK;
}

/* Rejects a zero_first_value code the kernel does not know, or a malformed packing mask, before
 * any layer runs, naming where. */
static int check_intervention(const sl_model *m, const sl_intervention *iv, int64_t T) {
    if (iv && iv->key_start) SL_TRY(check_key_start(iv->key_start, T));
    if (!iv || !iv->zero_first_value) return SL_OK;
    for (int64_t l = 0; l < m->n_layers; l++)
        for (int64_t h = 0; h < m->n_heads; h++) {
            const int v = iv->zero_first_value[l * m->n_heads + h];
            if (v > SL_ZFV_MEAN)
                return sl_fail(SL_ERR_VALUE,
                               "forward: zero_first_value[layer %lld, head %lld]=%d, expected 0 (none), "
                               "1 (others), 2 (all) or 3 (mean)", (long long)l, (long long)h, v);
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
    aiv->key_start = iv->key_start;
    aiv->keep_first = iv->keep_first;
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

/* out = norm(x) over `rows` rows of width d with the model's norm kind; mean/rstd may be NULL. */
static void norm_rows(const sl_model *m, const sl_norm *n, float *out, float *mean, float *rstd, const float *x,
                      int64_t rows, int64_t d) {
    if (m->norm_kind == SL_NORM_LAYER)
        sl_layernorm(out, mean, rstd, x, n->w, n->b, rows, d, m->norm_eps);
    else
        sl_rmsnorm(out, rstd, x, n->w, rows, d, m->norm_eps);
}

/* ------------------------------------------------------------------------------------------
 * Precision: the panels of the low-precision paths and the one dispatch point. */

const char *sl_precision_name(int precision) {
    switch (precision) {
    case SL_PREC_FP32: return "fp32";
    case SL_PREC_BF16: return "bf16";
    case SL_PREC_INT8: return "int8";
    default: return "unknown";
    }
}

static void int8_weight_drop(void *p) {
    sl_int8_weight_free(p);
    free(p);
}

/* Empty slots (n of them) for one kind of panel. */
static _Atomic(void *) *slots_new(int64_t n) {
    _Atomic(void *) *s = calloc((size_t)n, sizeof *s);
    for (int64_t i = 0; s && i < n; i++) atomic_init(&s[i], NULL);
    return s;
}

static void slots_free(_Atomic(void *) *s, int64_t n, void (*drop)(void *)) {
    for (int64_t i = 0; s && i < n; i++) drop(atomic_exchange(&s[i], NULL));
    free((void *)s);
}

static void bf16_panels_drop(void *p) { sl_bf16_panels_free(p); }

/* The Wᵀ panels of one weight in K blocks (sl_packed_cache.bf16_t). */
typedef struct {
    int64_t nb;
    sl_bf16_panels *blk[];
} tblocks;

static void tblocks_drop(void *p) {
    tblocks *t = p;
    for (int64_t b = 0; t && b < t->nb; b++) sl_bf16_panels_free(t->blk[b]);
    free(t);
}

int sl_packed_cache_init(sl_packed_cache *c, int64_t n_layers) {
    c->n_slots = 0;
    c->bf16 = c->int8 = c->bf16_t = NULL;
    if (n_layers < 0 || n_layers > (INT64_MAX / SL_SLOTS_PER_LAYER) - 1)
        return sl_fail(SL_ERR_VALUE, "packed cache: bad layer count %lld", (long long)n_layers);
    const int64_t n = n_layers * SL_SLOTS_PER_LAYER + 1;
    c->bf16 = slots_new(n);
    c->int8 = slots_new(n);
    c->bf16_t = slots_new(n);
    if (!c->bf16 || !c->int8 || !c->bf16_t) {
        free((void *)c->bf16), free((void *)c->int8), free((void *)c->bf16_t);
        c->bf16 = c->int8 = c->bf16_t = NULL;
        return sl_fail(SL_ERR_MEMORY, "packed cache: cannot allocate %lld slots", (long long)n);
    }
    c->n_slots = n;
    return SL_OK;
}

void sl_packed_cache_clear(sl_packed_cache *c) {
    if (!c || !c->bf16) return;
    slots_free(c->bf16, c->n_slots, bf16_panels_drop);
    slots_free(c->int8, c->n_slots, int8_weight_drop);
    slots_free(c->bf16_t, c->n_slots, tblocks_drop);
    c->bf16 = c->int8 = c->bf16_t = NULL;
    c->n_slots = 0;
}

void sl_packed_cache_invalidate(sl_packed_cache *c) {
    for (int64_t i = 0; c && c->bf16 && i < c->n_slots; i++) {
        bf16_panels_drop(atomic_exchange(&c->bf16[i], NULL));
        int8_weight_drop(atomic_exchange(&c->int8[i], NULL));
        tblocks_drop(atomic_exchange(&c->bf16_t[i], NULL));
    }
}

/* Bytes of one packed int8 weight: its bytes, scales and offsets. */
static int64_t int8_weight_bytes(const sl_int8_weight *w) {
    const int64_t blocks = w->npanels * w->nb;
    return blocks * SL_INT8_PANEL * (SL_INT8_BLOCK + (int64_t)sizeof(float) * (w->mw ? 2 : 1));
}

int64_t sl_packed_cache_bytes(sl_packed_cache *c) {
    int64_t total = 0;
    for (int64_t i = 0; c && c->bf16 && i < c->n_slots; i++) {
        const sl_bf16_panels *p = atomic_load(&c->bf16[i]);
        const sl_int8_weight *q = atomic_load(&c->int8[i]);
        const tblocks *t = atomic_load(&c->bf16_t[i]);
        if (p) total += p->bytes;
        if (q) total += int8_weight_bytes(q);
        for (int64_t b = 0; t && b < t->nb; b++) total += t->blk[b]->bytes;
    }
    return total;
}

/* Weight product slots: layer l's matrices, then the LM head. */
enum { SLOT_Q = SL_SLOT_Q, SLOT_K = SL_SLOT_K, SLOT_V = SL_SLOT_V, SLOT_O = SL_SLOT_O, SLOT_GATE = SL_SLOT_GATE,
       SLOT_UP = SL_SLOT_UP, SLOT_DOWN = SL_SLOT_DOWN, SLOT_AGATE = SL_SLOT_AGATE };
_Static_assert(SLOT_AGATE + 1 == SL_SLOTS_PER_LAYER, "one slot per weight product of a layer");
static int64_t layer_slot(int64_t l, int which) { return l * SL_SLOTS_PER_LAYER + which; }
static int64_t head_slot(const sl_model *m) { return m->n_layers * SL_SLOTS_PER_LAYER; }

/* Packs w into a fresh panel of one kind (the bf16 panels, or the int8 weight). */
static int bf16_pack(const sl_weight *w, void **out) {
    sl_bf16_panels *p = NULL;
    SL_TRY(sl_bf16_pack(w, 1, &p));
    *out = p;
    return SL_OK;
}

static int int8_pack(const sl_weight *w, void **out) {
    sl_int8_weight *p = calloc(1, sizeof *p);
    if (!p) return sl_fail(SL_ERR_MEMORY, "int8 weight: cannot allocate");
    const int rc = sl_int8_weight_init(p, w, 1);
    if (rc != SL_OK) {
        free(p);
        return rc;
    }
    *out = p;
    return SL_OK;
}

/* The panel of slot `slot` (weight w) in `slots`, packed now if this is its first use at this
 * precision; concurrent first uses may both pack, one is kept (compare-and-swap). */
static int cached_panel(const sl_model *m, _Atomic(void *) *slots, int64_t slot, const sl_weight *w,
                        int (*pack)(const sl_weight *, void **), void (*drop)(void *), const void **out) {
    if (!slots || slot < 0 || slot >= m->packed->n_slots)
        return sl_fail(SL_ERR_INTERNAL, "forward: precision %s needs the model's panel cache (slot %lld)",
                       sl_precision_name(m->precision), (long long)slot);
    _Atomic(void *) *s = &slots[slot];
    void *p = atomic_load_explicit(s, memory_order_acquire);
    if (!p) {
        void *fresh = NULL;
        SL_TRY(pack(w, &fresh));
        void *expected = NULL;
        if (atomic_compare_exchange_strong(s, &expected, fresh)) {
            p = fresh;
        } else { /* another call packed it first: keep theirs */
            drop(fresh);
            p = expected;
        }
    }
    *out = p;
    return SL_OK;
}

/* y (rows, w->rows; row stride ldy) = x (rows, w->cols; row stride ldx) · Wᵀ at the call's
 * precision: the one place a precision picks a kernel. With pro (NULL: none) the product first
 * writes x's rows with it, inside its own parallel region (x is then written: the cast below). */
static int weight_product_pro(const sl_model *m, int64_t slot, int64_t rows, const float *x, int64_t ldx,
                              const sl_weight *w, float *y, int64_t ldy, const sl_row_prologue *pro) {
    float *xw = (float *)x; /* written only by pro, whose caller passed a writable x */
    const void *p = NULL;
    if (m->precision != SL_PREC_FP32 && !m->packed)
        return sl_fail(SL_ERR_INTERNAL, "forward: precision %s needs the model's panel cache",
                       sl_precision_name(m->precision));
    switch (m->precision) {
    case SL_PREC_FP32: return sl_linear_nt_prologue(rows, xw, ldx, w, y, ldy, pro);
    case SL_PREC_BF16:
        SL_TRY(cached_panel(m, m->packed->bf16, slot, w, bf16_pack, bf16_panels_drop, &p));
        return sl_bf16_linear_nt_prologue(rows, xw, ldx, p, y, ldy, SL_BF16_AUTO, pro);
    case SL_PREC_INT8:
        if (!sl_int8_weight_usable(w)) return sl_linear_nt_prologue(rows, xw, ldx, w, y, ldy, pro);
        SL_TRY(cached_panel(m, m->packed->int8, slot, w, int8_pack, int8_weight_drop, &p));
        return sl_linear_nt_int8_prologue(rows, xw, ldx, p, y, ldy, pro);
    default:
        return sl_fail(SL_ERR_VALUE, "forward: precision %d (%s) is not available; use fp32 (0), bf16 (1) or int8 (2)",
                       m->precision, sl_precision_name(m->precision));
    }
}

static int weight_product(const sl_model *m, int64_t slot, int64_t rows, const float *x, int64_t ldx,
                          const sl_weight *w, float *y, int64_t ldy) {
    return weight_product_pro(m, slot, rows, x, ldx, w, y, ldy, NULL);
}

int64_t sl_model_slot(const sl_model *m, int64_t layer, int which) {
    return layer < 0 ? head_slot(m) : layer_slot(layer, which);
}

int sl_model_product_nt(const sl_model *m, int64_t slot, int64_t rows, const float *x, int64_t ldx,
                        const sl_weight *w, float *y, int64_t ldy) {
    return weight_product(m, slot, rows, x, ldx, w, y, ldy);
}

/* Packs Wᵀ's panels (W float32) in K blocks of SL_BF16_KBLOCK rows of W. */
static int tblocks_pack(const sl_weight *w, void **out) {
    if (w->type != SL_GGML_F32 || w->row_bytes != w->cols * (int64_t)sizeof(float))
        return sl_fail(SL_ERR_VALUE, "bf16 backward: the weight must be float32 (type %d)", w->type);
    const int64_t nb = (w->rows + SL_BF16_KBLOCK - 1) / SL_BF16_KBLOCK;
    if (w->rows <= 0 || w->cols <= 0) return sl_fail(SL_ERR_VALUE, "bf16 backward: empty weight");
    tblocks *t = calloc(1, sizeof *t + (size_t)nb * sizeof(sl_bf16_panels *));
    if (!t) return sl_fail(SL_ERR_MEMORY, "bf16 backward: cannot allocate panels");
    t->nb = nb;
    const float *W = (const float *)w->data;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t k0 = b * SL_BF16_KBLOCK, kb = w->rows - k0 < SL_BF16_KBLOCK ? w->rows - k0 : SL_BF16_KBLOCK;
        const int rc = sl_bf16_pack_t(W + k0 * w->cols, kb, w->cols, w->cols, 1, &t->blk[b]);
        if (rc != SL_OK) {
            tblocks_drop(t);
            return rc;
        }
    }
    *out = t;
    return SL_OK;
}

/* Output rows per chunk of the multi-block product (bounds its double accumulators). */
#define SL_BF16_NN_ROWS 2016

int sl_model_product_nn_bf16(const sl_model *m, int64_t slot, int64_t rows, const float *dy, int64_t lddy,
                             const sl_weight *w, float *dx, int64_t lddx, int accumulate) {
    if (m->precision != SL_PREC_BF16 || !m->packed)
        return sl_fail(SL_ERR_INTERNAL, "bf16 backward: the call's precision is %s, or it has no panel cache",
                       sl_precision_name(m->precision));
    const void *p = NULL;
    SL_TRY(cached_panel(m, m->packed->bf16_t, slot, w, tblocks_pack, tblocks_drop, &p));
    const tblocks *t = p;
    const int64_t n = w->cols;
    if (rows < 0 || lddy < w->rows || lddx < n)
        return sl_fail(SL_ERR_VALUE, "bf16 backward: %lld rows, strides %lld, %lld for a %lld x %lld weight",
                       (long long)rows, (long long)lddy, (long long)lddx, (long long)w->rows, (long long)n);
    if (t->nb == 1) return sl_bf16_linear_nt(rows, dy, lddy, t->blk[0], dx, lddx, accumulate, 1, SL_BF16_AUTO);
    const int64_t mb_max = rows < SL_BF16_NN_ROWS ? rows : SL_BF16_NN_ROWS;
    int64_t cnt;
    if (!sl_mul_size(mb_max > 0 ? mb_max : 1, n, &cnt)) return sl_fail(SL_ERR_MEMORY, "bf16 backward: size overflow");
    float *part = sl_alloc_floats_uninit(cnt);
    double *acc = (double *)sl_alloc_floats_uninit(2 * cnt);
    int rc = part && acc ? SL_OK : sl_fail(SL_ERR_MEMORY, "bf16 backward: cannot allocate %lld floats",
                                           (long long)(3 * cnt));
    for (int64_t m0 = 0; m0 < rows && rc == SL_OK; m0 += SL_BF16_NN_ROWS) {
        const int64_t mb = rows - m0 < SL_BF16_NN_ROWS ? rows - m0 : SL_BF16_NN_ROWS;
        for (int64_t i = 0; i < mb; i++)
            for (int64_t j = 0; j < n; j++) acc[i * n + j] = accumulate ? dx[(m0 + i) * lddx + j] : 0.0;
        for (int64_t b = 0; b < t->nb && rc == SL_OK && (rc = sl_check_interrupt()) == SL_OK; b++) {
            rc = sl_bf16_linear_nt(mb, dy + m0 * lddy + b * SL_BF16_KBLOCK, lddy, t->blk[b], part, n, 0, 1,
                                   SL_BF16_AUTO);
            for (int64_t i = 0; i < mb * n && rc == SL_OK; i++) acc[i] += part[i];
        }
        for (int64_t i = 0; i < mb && rc == SL_OK; i++)
            for (int64_t j = 0; j < n; j++) dx[(m0 + i) * lddx + j] = (float)acc[i * n + j];
    }
    sl_free(part);
    sl_free(acc);
    return rc;
}

/* Slot `slot`'s forward (transposed == 0) or Wᵀ panels packed from w: into the panels the slot
 * holds (same shape: the weights are the same tensors), else new ones. */
static int repack_slot(const sl_model *mc, _Atomic(void *) *slots, int64_t slot, const sl_weight *w,
                       int transposed) {
    void *p = atomic_load(&slots[slot]);
    const void *q;
    if (!p)
        return transposed ? cached_panel(mc, slots, slot, w, tblocks_pack, tblocks_drop, &q)
                          : cached_panel(mc, slots, slot, w, bf16_pack, bf16_panels_drop, &q);
    if (!transposed) return sl_bf16_repack(w, 1, p);
    tblocks *t = p;
    const float *W = (const float *)w->data;
    if (w->type != SL_GGML_F32 || t->nb != (w->rows + SL_BF16_KBLOCK - 1) / SL_BF16_KBLOCK)
        return sl_fail(SL_ERR_VALUE, "bf16 backward: slot %lld holds panels of another weight", (long long)slot);
    for (int64_t b = 0; b < t->nb; b++) {
        const int64_t k0 = b * SL_BF16_KBLOCK, kb = w->rows - k0 < SL_BF16_KBLOCK ? w->rows - k0 : SL_BF16_KBLOCK;
        SL_TRY(sl_bf16_repack_t(W + k0 * w->cols, kb, w->cols, w->cols, 1, t->blk[b]));
    }
    return SL_OK;
}

int sl_model_pack_bf16(const sl_model *m) {
    if (!m->packed || m->packed->n_slots != head_slot(m) + 1)
        return sl_fail(SL_ERR_INTERNAL, "bf16: the model's panel cache does not match its %lld layers",
                       (long long)m->n_layers);
    const sl_model mc = (sl_model){.n_layers = m->n_layers, .precision = SL_PREC_BF16, .packed = m->packed};
    for (int64_t l = 0; l <= m->n_layers; l++) {
        const sl_layer_weights *lw = l < m->n_layers ? &m->layers[l] : NULL;
        const sl_weight *ws[SL_SLOTS_PER_LAYER] = {NULL};
        if (lw) {
            ws[SLOT_Q] = &lw->wq, ws[SLOT_K] = &lw->wk, ws[SLOT_V] = &lw->wv, ws[SLOT_O] = &lw->wo;
            ws[SLOT_GATE] = &lw->w_gate, ws[SLOT_UP] = &lw->w_up, ws[SLOT_DOWN] = &lw->w_down;
            ws[SLOT_AGATE] = &lw->attn_gate;
        } else {
            ws[0] = &m->lm_head;
        }
        for (int which = 0; which < SL_SLOTS_PER_LAYER; which++) {
            if (!ws[which] || !ws[which]->data) continue;
            const int64_t slot = lw ? layer_slot(l, which) : head_slot(m);
            SL_TRY(sl_check_interrupt());
            SL_TRY(repack_slot(&mc, m->packed->bf16, slot, ws[which], 0));
            SL_TRY(repack_slot(&mc, m->packed->bf16_t, slot, ws[which], 1));
        }
    }
    return SL_OK;
}

/* y = x Wᵀ + b over `rows` rows (b may be NULL), W being slot `slot`, after pro (NULL: none) has
 * written x's rows (x is then writable). */
static int linear_pro(const sl_model *m, int64_t slot, int64_t rows, const float *x, const sl_weight *w,
                      const float *b, float *y, const sl_row_prologue *pro) {
    SL_TRY(weight_product_pro(m, slot, rows, x, w->cols, w, y, w->rows, pro));
    if (b) sl_bias_add(y, b, rows, w->rows, w->rows);
    return SL_OK;
}

static int linear(const sl_model *m, int64_t slot, int64_t rows, const float *x, const sl_weight *w,
                  const float *b, float *y) {
    return linear_pro(m, slot, rows, x, w, b, y, NULL);
}

/* y[j] = x W[j]ᵀ + b[j] for the n <= SL_SHARED_MAX weights of layer l that read the same x (q, k,
 * v; gate, up), slots[j] being each one's slot: one call of the kernel's shared form, i.e. one
 * parallel region instead of n (bf16 and int8 also round or quantize x once); one product each
 * when an int8 call has weights with and without an int8 form. Each product's bits are those of
 * its own call. */
static int linear_shared(const sl_model *m, int64_t l, const int *slots, int n, int64_t rows, const float *x,
                         const sl_weight *const *w, const float *const *b, float *const *y) {
    const int prec = m->precision;
    int usable = 0; /* int8: how many of the weights have an int8 form */
    for (int j = 0; j < n; j++) usable += prec == SL_PREC_INT8 && sl_int8_weight_usable(w[j]);
    const int fp32 = prec == SL_PREC_FP32 || (prec == SL_PREC_INT8 && usable == 0);
    const int panels = (prec == SL_PREC_BF16 || (prec == SL_PREC_INT8 && usable == n)) && m->packed;
    if (n > SL_SHARED_MAX || (!fp32 && !panels)) { /* mixed int8, or an error for linear to report */
        for (int j = 0; j < n; j++) SL_TRY(linear(m, layer_slot(l, slots[j]), rows, x, w[j], b[j], y[j]));
        return SL_OK;
    }
    int64_t ldy[SL_SHARED_MAX];
    for (int j = 0; j < n; j++) ldy[j] = w[j]->rows;
    if (fp32) {
        SL_TRY(sl_linear_nt_shared(rows, x, w[0]->cols, n, w, y, ldy));
    } else {
        const void *p[SL_SHARED_MAX];
        for (int j = 0; j < n; j++) {
            const int64_t slot = layer_slot(l, slots[j]);
            if (prec == SL_PREC_BF16)
                SL_TRY(cached_panel(m, m->packed->bf16, slot, w[j], bf16_pack, bf16_panels_drop, &p[j]));
            else
                SL_TRY(cached_panel(m, m->packed->int8, slot, w[j], int8_pack, int8_weight_drop, &p[j]));
        }
        if (prec == SL_PREC_BF16)
            SL_TRY(sl_bf16_linear_nt_shared(rows, x, w[0]->cols, n, (const sl_bf16_panels *const *)p, y, ldy,
                                            SL_BF16_AUTO));
        else
            SL_TRY(sl_linear_nt_int8_shared(rows, x, w[0]->cols, n, (const sl_int8_weight *const *)p, y, ldy));
    }
    for (int j = 0; j < n; j++)
        if (b[j]) sl_bias_add(y[j], b[j], rows, w[j]->rows, w[j]->rows);
    return SL_OK;
}

/* One row of the MLP's activation, h = act(gate, up), as the down product's prologue: the
 * activation then runs in that product's parallel region instead of one of its own. */
typedef struct {
    int act;
    float *h;
    const float *g, *u; /* g NULL: an ungated activation */
    int64_t F;
} act_rows;

static void act_row(void *arg, int64_t r) {
    const act_rows *a = arg;
    sl_mlp_act_serial(a->act, a->h + r * a->F, a->g ? a->g + r * a->F : NULL, a->u + r * a->F, a->F);
}

/* x += y, then out = the norm n of x: a residual add and the next block's pre-norm in one
 * parallel region (bitwise the two ops in turn). */
static void residual_norm(const sl_model *m, const sl_norm *n, float *x, const float *y, float *out, int64_t rows,
                          int64_t d) {
    if (m->norm_kind == SL_NORM_LAYER)
        sl_residual_layernorm(x, y, out, NULL, NULL, n->w, n->b, rows, d, m->norm_eps);
    else
        sl_residual_rmsnorm(x, y, out, NULL, n->w, rows, d, m->norm_eps);
}

/* Whether the residual add that closes a block may also compute the next block's pre-norm `next`
 * into xb, over the block's output: not when that output is captured (it is read from xb after
 * the add), nor with a tape (it copies each norm's input, output and statistics), nor when a
 * residual norm comes between the add and the next block. */
static const sl_norm *fusable_next(const sl_norm *next, const sl_norm *res, int captured, const sl_layer_tape *lt) {
    return next && next->w && !res->w && !captured && !lt ? next : NULL;
}

/* Whether any sequence of the batch asks for layer l's entry of a capture list. */
static int captures_layer(float **list, int64_t n_list, int64_t l, const acts *a) {
    for (int64_t b = 0; b < a->ab.B && list; b++)
        if (cap_at(list, n_list, b, l)) return 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Patches (patch.h), applied where each activation is produced. */

/* Patches of (point, l) onto a packed activation data (row stride `stride`, width floats per head). */
static void patch_rows(const sl_patch_table *pt, int point, int64_t l, const acts *w, float *data, int64_t stride,
                       int64_t width, int adjacent) {
    if (!sl_patch_any(pt, point, l)) return;
    const sl_patch_target t = {data, stride, w->ab.off, w->ab.len, adjacent};
    sl_patch_apply(pt, point, l, width, &t);
}

/* Pattern patches of layer l: z[t, h] = head_scale_h * (P'[t, :] · V_g) for a replaced row of
 * probabilities P', z[t, h] += head_scale_h * (ΔP[t, :] · V_g) for an added ΔP (z is linear in P),
 * over the sequence's keys s < len; V is the layer's (unintervened: sl_patch_check refuses
 * mask_first and zero_first_value on these heads). The attn capture, when taken, is rewritten to
 * show P' (P + ΔP); the streamed statistics (importance, to_first, entropy) stay those of the
 * model's own probabilities. */
static void patch_pattern(const sl_model *m, const sl_patch_table *pt, int64_t l, const acts *w,
                          const sl_attn_intervention *aiv, const sl_capture *cap) {
    if (!sl_patch_any(pt, SL_PATCH_PATTERN, l)) return;
    const int64_t H = m->n_heads, hd = m->head_dim, qd = H * hd, kvd = m->n_kv_heads * hd, T = w->ab.T_pad;
    const int64_t group = H / m->n_kv_heads;
    for (int64_t n = 0; n < pt->n; n++) {
        const sl_patch *p = &pt->p[n];
        if (p->point != SL_PATCH_PATTERN || p->layer != l) continue;
        for (int64_t i = 0; i < p->n_rows; i++) {
            const int64_t b = p->rows[i], len = w->ab.len[b], off = w->ab.off[b];
            float *attn = cap_at(cap ? cap->attn : NULL, m->n_layers, b, l);
            for (int64_t j = 0; j < p->n_heads; j++) {
                const int64_t h = p->heads[j], g = h / group;
                const float scale = aiv->head_scale ? aiv->head_scale[h] : 1.0f;
                for (int64_t k = 0; k < p->n_pos; k++) {
                    const int64_t t = p->pos[k];
                    if (t >= len) continue;
                    const float *pv = sl_patch_entry(p, i, j, k, T);
                    float *z = w->att + (off + t) * qd + h * hd;
                    if (p->mode == SL_PATCH_REPLACE) memset(z, 0, (size_t)hd * sizeof(float));
                    /* key by key, so V's rows are read contiguously; the sum over keys runs in
                     * key order, the same for any thread count */
                    for (int64_t s = 0; s < len; s++) {
                        const float ps = scale * pv[s], *vs = w->v + (off + s) * kvd + g * hd;
                        if (ps != 0.0f)
                            for (int64_t e = 0; e < hd; e++) z[e] += ps * vs[e];
                    }
                    float *row = attn ? attn + (h * T + t) * T : NULL;
                    for (int64_t s = 0; row && s < len; s++) row[s] = p->mode == SL_PATCH_ADD ? row[s] + pv[s] : pv[s];
                }
            }
        }
    }
}

/* head_out patches of layer l on o = W_O z + b_O (in xb): o += v - z_h W_O[:, h]ᵀ for a replaced
 * head output v, o += v for an added one; the head_out capture, taken before, is rewritten to
 * show the patched value. */
static int patch_head_out(const sl_model *m, const sl_layer_weights *lw, const sl_patch_table *pt, int64_t l,
                          const acts *w, float *o, const sl_capture *cap) {
    if (!sl_patch_any(pt, SL_PATCH_HEAD_OUT, l)) return SL_OK;
    const int64_t d = m->d_model, hd = m->head_dim, qd = m->n_heads * hd, T = w->ab.T_pad;
    float *decoded = NULL, *own = NULL;
    const float *wo = (const float *)lw->wo.data;
    int rc = SL_OK;
    if (lw->wo.type != SL_GGML_F32) {
        if (!(decoded = sl_alloc_floats_uninit(d * qd)))
            return sl_fail(SL_ERR_MEMORY, "forward: cannot allocate a decoded W_O");
        rc = sl_weight_cols(&lw->wo, 0, qd, decoded);
        wo = decoded;
    }
    /* the largest position list: one product per (row, head) over its positions */
    int64_t most = 0;
    for (int64_t n = 0; n < pt->n; n++)
        if (pt->p[n].point == SL_PATCH_HEAD_OUT && pt->p[n].layer == l && pt->p[n].n_pos > most) most = pt->p[n].n_pos;
    float *zrows = NULL;
    if (rc == SL_OK && (!(own = sl_alloc_floats_uninit(most * d)) || !(zrows = sl_alloc_floats_uninit(most * hd))))
        rc = sl_fail(SL_ERR_MEMORY, "forward: cannot allocate a head_out patch's scratch");
    for (int64_t n = 0; n < pt->n && rc == SL_OK; n++) {
        const sl_patch *p = &pt->p[n];
        if (p->point != SL_PATCH_HEAD_OUT || p->layer != l) continue;
        for (int64_t i = 0; i < p->n_rows && rc == SL_OK; i++) {
            const int64_t b = p->rows[i];
            float *hcap = cap_at(cap ? cap->head_out : NULL, m->n_layers, b, l);
            for (int64_t j = 0; j < p->n_heads && rc == SL_OK; j++) {
                const int64_t h = p->heads[j];
                if (p->mode == SL_PATCH_REPLACE) {
                    /* this head's own share at the patched positions (as capture_head_out computes
                     * it), gathered into one product */
                    for (int64_t k = 0; k < p->n_pos; k++) {
                        const int64_t t = p->pos[k] < w->ab.len[b] ? p->pos[k] : 0;
                        memcpy(zrows + k * hd, w->att + (w->ab.off[b] + t) * qd + h * hd, (size_t)hd * sizeof(float));
                    }
                    rc = sl_sgemm_nt(p->n_pos, d, hd, zrows, hd, wo + h * hd, qd, own, d, 0, 1);
                }
                for (int64_t k = 0; k < p->n_pos && rc == SL_OK; k++) {
                    const int64_t t = p->pos[k], r = w->ab.off[b] + t;
                    if (t >= w->ab.len[b]) continue;
                    const float *val = sl_patch_entry(p, i, j, k, d);
                    float *orow = o + r * d, *crow = hcap ? hcap + (h * T + t) * d : NULL;
                    if (p->mode == SL_PATCH_REPLACE)
                        for (int64_t e = 0; e < d; e++) orow[e] += val[e] - own[k * d + e];
                    else
                        for (int64_t e = 0; e < d; e++) orow[e] += val[e];
                    for (int64_t e = 0; crow && e < d; e++) crow[e] = p->mode == SL_PATCH_ADD ? crow[e] + val[e] : val[e];
                }
            }
        }
    }
    sl_free(zrows);
    sl_free(own);
    sl_free(decoded);
    return rc;
}

/* The end of a block: s = the block's output in `out` (rows, d); out = post_norm(out); x += out;
 * x = res_norm(x), saving each norm's input and statistics when a tape asks. With `next` (from
 * fusable_next) the add also leaves next(x) in out, and this returns 1; the next block then skips
 * its pre-norm: one parallel region fewer per block (two on a short sequence, whose add alone runs
 * on one thread). */
static int block_output(const sl_model *m, const sl_norm *post, const sl_norm *res, float *x, float *out,
                        int64_t rows, float *t_in, float *t_mean, float *t_rstd, float *r_in, float *r_mean,
                        float *r_rstd, const sl_norm *next, const sl_patch_table *pt, int point, int64_t l,
                        const acts *w) {
    const int64_t d = m->d_model;
    if (post->w) {
        tape_copy(t_in, out, rows, d);
        norm_rows(m, post, out, t_mean, t_rstd, out, rows, d);
    }
    patch_rows(pt, point, l, w, out, d, d, 0); /* attn_out / mlp_out: after the post-norm, before the add */
    if (next) {
        residual_norm(m, next, x, out, out, rows, d);
        return 1;
    }
    sl_add_inplace(x, out, rows * d);
    if (res->w) {
        tape_copy(r_in, x, rows, d);
        norm_rows(m, res, x, r_mean, r_rstd, x, rows, d);
    }
    return 0;
}

/* RoPE tables for each packed row from this layer's frequencies, rebuilt only when they differ
 * from the frequencies the current tables were made with (Gemma 3 alternates two bases). */
static void rope_for_layer(const sl_model *m, const sl_layer_weights *lw, acts *w) {
    const int64_t half = m->head_dim / 2, T = w->ab.T_pad;
    if (w->freq_valid && !memcmp(w->freq, lw->rope_inv_freq, (size_t)half * sizeof(float))) return;
    memcpy(w->freq, lw->rope_inv_freq, (size_t)half * sizeof(float));
    w->freq_valid = 1;
    sl_rope_tables(w->cosb, w->sinb, lw->rope_inv_freq, T, half);
    for (int64_t b = 0; b < w->ab.B; b++) {
        const int64_t n = w->ab.len[b], off = w->ab.off[b];
        memcpy(w->cosv + off * half, w->cosb, (size_t)(n * half) * sizeof(float));
        memcpy(w->sinv + off * half, w->sinb, (size_t)(n * half) * sizeof(float));
    }
}

/* q (rows, heads*hd) after its bias: the QK-norm per head (when norm_w), saving the pre-norm
 * rows and statistics when a tape asks. */
static void qk_norm(const sl_model *m, const acts *w, float *q, int64_t heads, const float *norm_w, float *t_pre,
                    float *t_rstd) {
    const int64_t rows = w->ab.off[w->ab.B], hd = m->head_dim;
    if (!norm_w) return;
    tape_copy(t_pre, q, rows, heads * hd);
    sl_rmsnorm(q, t_rstd, q, norm_w, rows * heads, hd, m->norm_eps);
}

/* q and k after their biases: the QK-norms, then (with `rope`) RoPE of both in one parallel
 * region. q and k are independent, so normalising k before rotating q changes no bit. */
static void position_qk(const sl_model *m, const sl_layer_weights *lw, acts *w, const sl_layer_tape *lt, int rope) {
    const int64_t rows = w->ab.off[w->ab.B], hd = m->head_dim, H = m->n_heads, G = m->n_kv_heads;
    qk_norm(m, w, w->q, H, lw->attn_q_norm, lt->qr, lt->q_rstd);
    qk_norm(m, w, w->k, G, lw->attn_k_norm, lt->kr, lt->k_rstd);
    if (rope) sl_rope_apply_qk(w->q, H * hd, H, w->k, G * hd, G, rows, hd, w->cosv, w->sinv, m->rope_layout);
}

/* RoPE of one packed row of q and of k, as the attention's prologue (sl_attn_batch): the rows
 * sl_rope_apply_qk would rotate, in the attention's parallel region instead of one of their own. */
typedef struct {
    float *q, *k;
    const float *cosv, *sinv; /* (rows, hd/2) */
    int64_t q_heads, k_heads, hd;
    int layout;
} rope_rows;

static void rope_row_qk(void *arg, int64_t r) {
    const rope_rows *a = arg;
    const int64_t half = a->hd / 2;
    sl_rope_row(a->q + r * a->q_heads * a->hd, a->q_heads, a->hd, a->cosv + r * half, a->sinv + r * half, a->layout);
    sl_rope_row(a->k + r * a->k_heads * a->hd, a->k_heads, a->hd, a->cosv + r * half, a->sinv + r * half, a->layout);
}

/* Head h's share of the W_O product (z_h W_O[:, h]ᵀ, no bias) for all rows into xb, for every head
 * a sequence asks for; a quantized W_O is decoded once for all heads (its blocks span heads). */
static int capture_head_out(const sl_model *m, const sl_layer_weights *lw, acts *w, const sl_capture *cap,
                            int64_t l) {
    const int64_t L = m->n_layers, d = m->d_model, hd = m->head_dim, H = m->n_heads, qd = H * hd;
    const int64_t rows = w->ab.off[w->ab.B];
    int any = 0;
    for (int64_t b = 0; b < w->ab.B && cap && cap->head_out; b++) any |= cap_at(cap->head_out, L, b, l) != NULL;
    if (!any) return SL_OK;
    float *decoded = NULL;
    const float *wo = (const float *)lw->wo.data;
    if (lw->wo.type != SL_GGML_F32) {
        if (!(decoded = sl_alloc_floats_uninit(d * qd)))
            return sl_fail(SL_ERR_MEMORY, "forward: cannot allocate a decoded W_O");
        wo = decoded;
    }
    int rc = decoded ? sl_weight_cols(&lw->wo, 0, qd, decoded) : SL_OK;
    for (int64_t h = 0; h < H && rc == SL_OK; h++) {
        rc = sl_sgemm_nt(rows, d, hd, w->att + h * hd, qd, wo + h * hd, qd, w->xb, d, 0, 1);
        if (rc == SL_OK) capture_rows(cap->head_out, L, l, h * w->ab.T_pad * d, w, w->xb, d);
    }
    sl_free(decoded);
    return rc;
}

/* With a tape (lt != NULL, one sequence) the layer's activations are written straight into it
 * (q, k, v, z, gate, up) or copied there (the norms' inputs and outputs), for the backward and
 * the JVP. */
static int attention_block(const sl_model *m, const sl_layer_weights *lw, acts *w, const sl_capture *cap,
                           int64_t l, const sl_attn_intervention *aiv, sl_layer_tape *lt, const sl_patch_table *pt) {
    const int64_t d = m->d_model, hd = m->head_dim, H = m->n_heads, G = m->n_kv_heads, L = m->n_layers;
    const int64_t qd = H * hd, kvd = G * hd, rows = w->ab.off[w->ab.B];
    const int adjacent = m->rope_layout == SL_ROPE_ADJACENT;
    acts *const w0 = w, view = *w;
    const int normed = w->xb_normed; /* the previous block's add left n1(x) in xb */
    w->xb_normed = 0;
    const sl_norm *next = fusable_next(&lw->ffn_norm, &lw->attn_res_norm,
                                     captures_layer(cap ? cap->attn_out : NULL, L, l, w), lt);
    sl_layer_tape none = {0};
    if (lt) {
        view.q = lt->q, view.k = lt->k, view.v = lt->v, view.att = lt->z;
        w = &view;
        tape_copy(lt->x, w->x, rows, d);
    } else {
        lt = &none;
    }
    const float *a = w->x;
    if (lw->attn_norm.w) {
        if (!normed) norm_rows(m, &lw->attn_norm, w->xb, lt->mean1, lt->rstd1, w->x, rows, d);
        if (lt->xn1 != lt->x) tape_copy(lt->xn1, w->xb, rows, d);
        a = w->xb;
    }
    const int qkv_slots[3] = {SLOT_Q, SLOT_K, SLOT_V};
    const sl_weight *qkv[3] = {&lw->wq, &lw->wk, &lw->wv};
    const float *qkv_bias[3] = {lw->bq, lw->bk, lw->bv};
    float *qkv_out[3] = {w->q, w->k, w->v};
    SL_TRY(linear_shared(m, l, qkv_slots, 3, rows, a, qkv, qkv_bias, qkv_out));
    /* gated attention: the gate's pre-activation W_g a, read after the attention */
    float *ag = lt->ag ? lt->ag : w->ag;
    if (lw->attn_gate.data) SL_TRY(linear(m, layer_slot(l, SLOT_AGATE), rows, a, &lw->attn_gate, NULL, ag));
    if (lw->rope_inv_freq) rope_for_layer(m, lw, w);
    /* RoPE goes into the attention's parallel region, unless q or k is captured or patched: the
     * captures are copied, and the patches applied, before the attention and after RoPE. */
    const int qk_patched = sl_patch_any(pt, SL_PATCH_Q, l) || sl_patch_any(pt, SL_PATCH_K, l);
    const int rope_in_attention = lw->rope_inv_freq && !captures_layer(cap ? cap->q : NULL, L, l, w) &&
                                  !captures_layer(cap ? cap->k : NULL, L, l, w) && !qk_patched;
    position_qk(m, lw, w, lt, lw->rope_inv_freq && !rope_in_attention);
    patch_rows(pt, SL_PATCH_Q, l, w, w->q, qd, hd, adjacent);
    patch_rows(pt, SL_PATCH_K, l, w, w->k, kvd, hd, adjacent);
    patch_rows(pt, SL_PATCH_V, l, w, w->v, kvd, hd, 0);
    if (cap) {
        capture_heads(cap->q, L, l, w, w->q, qd, H, hd, adjacent);
        capture_heads(cap->k, L, l, w, w->k, kvd, G, hd, adjacent);
        capture_heads(cap->v, L, l, w, w->v, kvd, G, hd, 0); /* V rows are never permuted */
    }
    layer_lists(w, m, cap, l);
    const sl_attn_shape s = {.T = w->ab.T_pad, .n_heads = H, .n_kv_heads = G, .head_dim = hd,
                             .scale = m->attn_scale, .bidirectional = m->bidirectional, .window = lw->window,
                             .softcap = m->attn_softcap, .variant = sl_model_attn_kernel(m), .sinks = lw->attn_sinks};
    rope_rows rr = {w->q, w->k, w->cosv, w->sinv, H, G, hd, m->rope_layout};
    w->ab.prologue = rope_in_attention ? rope_row_qk : NULL;
    w->ab.prologue_arg = rope_in_attention ? &rr : NULL;
    const int rc = sl_attention_forward_batch(&s, &w->ab, w->q, qd, w->k, w->v, kvd, w->att, aiv);
    w->ab.prologue = NULL, w->ab.prologue_arg = NULL;
    SL_TRY(rc);
    patch_pattern(m, pt, l, w, aiv, cap);
    if (lw->attn_gate.data) { /* z' = z ⊙ sigmoid(W_g a): what W_O, the captures and z patches see */
        if (lt->za) tape_copy(lt->za, w->att, rows, qd);
        sl_attn_gate_forward(w->att, w->att, ag, rows * qd);
    }
    patch_rows(pt, SL_PATCH_Z, l, w, w->att, qd, hd, 0);
    if (cap) capture_heads(cap->z, L, l, w, w->att, qd, H, hd, 0);
    SL_TRY(capture_head_out(m, lw, w, cap, l));
    SL_TRY(linear(m, layer_slot(l, SLOT_O), rows, w->att, &lw->wo, lw->bo, w->xb));
    SL_TRY(patch_head_out(m, lw, pt, l, w, w->xb, cap));
    w0->xb_normed = block_output(m, &lw->attn_post_norm, &lw->attn_res_norm, w->x, w->xb, rows, lt->o, lt->o_mean,
                                 lt->o_rstd, lt->hr, lt->hr_mean, lt->hr_rstd, next, pt, SL_PATCH_ATTN_OUT, l, w);
    /* What the block adds to the stream (after the post-norm; before a residual norm). */
    if (cap) capture_rows(cap->attn_out, L, l, 0, w, w->xb, d);
    tape_copy(lt->h, w->x, rows, d);
    return SL_OK;
}

/* next_norm: the next layer's pre-norm (NULL after the last layer run), for block_output. */
static int mlp_block(const sl_model *m, const sl_layer_weights *lw, acts *w, const sl_capture *cap, int64_t l,
                     sl_layer_tape *lt, const sl_norm *next_norm, const sl_patch_table *pt) {
    const int64_t d = m->d_model, F = m->d_ff, rows = w->ab.off[w->ab.B];
    const int normed = w->xb_normed; /* the attention block's add left n2(x) in xb */
    w->xb_normed = 0;
    const sl_norm *next = fusable_next(next_norm, &lw->ffn_res_norm,
                                     captures_layer(cap ? cap->mlp_out : NULL, m->n_layers, l, w), lt);
    sl_layer_tape none = {0};
    if (!lt) lt = &none;
    float *gate = lt->gate ? lt->gate : w->gate, *up = lt->up ? lt->up : w->up;
    const float *a = w->x;
    if (lw->ffn_norm.w) {
        if (!normed) norm_rows(m, &lw->ffn_norm, w->xb, lt->mean2, lt->rstd2, w->x, rows, d);
        if (lt->xn2 != lt->h) tape_copy(lt->xn2, w->xb, rows, d);
        a = w->xb;
    }
    const int gu_slots[2] = {SLOT_GATE, SLOT_UP};
    const sl_weight *gu[2] = {&lw->w_gate, &lw->w_up};
    const float *gu_bias[2] = {lw->b_gate, lw->b_up};
    float *gu_out[2] = {gate, up};
    const int g0 = lw->w_gate.data ? 0 : 1; /* an ungated MLP has only the up product */
    SL_TRY(linear_shared(m, l, gu_slots + g0, 2 - g0, rows, a, gu + g0, gu_bias + g0, gu_out + g0));
    /* The workspace's gate buffer holds the activation (a tape keeps its own gate and up),
     * computed row by row inside the down product's region. */
    const act_rows ar = {m->act, w->gate, lw->w_gate.data ? gate : NULL, up, F};
    const sl_row_prologue act = {act_row, (void *)&ar};
    SL_TRY(linear_pro(m, layer_slot(l, SLOT_DOWN), rows, w->gate, &lw->w_down, lw->b_down, w->xb, &act));
    w->xb_normed = block_output(m, &lw->ffn_post_norm, &lw->ffn_res_norm, w->x, w->xb, rows, lt->mo, lt->mo_mean,
                                lt->mo_rstd, lt->yr, lt->yr_mean, lt->yr_rstd, next, pt, SL_PATCH_MLP_OUT, l, w);
    if (cap) capture_rows(cap->mlp_out, m->n_layers, l, 0, w, w->xb, d);
    return SL_OK;
}

/* resid[l]'s patches, then its capture. A patch makes the previous block's fused pre-norm of x
 * (left in xb) stale, so the next block computes it again. */
static void capture_resid(const sl_model *m, const sl_capture *cap, int64_t l, acts *w, const sl_patch_table *pt) {
    if (sl_patch_any(pt, SL_PATCH_RESID, l)) {
        patch_rows(pt, SL_PATCH_RESID, l, w, w->x, m->d_model, m->d_model, 0);
        w->xb_normed = 0;
    }
    if (cap) capture_rows(cap->resid, m->n_layers + 1, l, 0, w, w->x, m->d_model);
}

/* Checks shared by every entry point that runs the model on ids: B rows of T ids each. */
static int check_run(const sl_model *m, const int64_t *ids, int64_t B, int64_t T, const int64_t *lengths,
                     const sl_intervention *iv) {
    SL_TRY(sl_model_check(m));
    SL_TRY(check_intervention(m, iv, T));
    if (iv && iv->patch)
        SL_TRY(sl_patch_check(iv->patch, m->n_layers, m->n_heads, m->n_kv_heads, m->d_model, m->head_dim, B, T,
                              iv->mask_first, iv->zero_first_value));
    if (T <= 0) return sl_fail(SL_ERR_VALUE, "forward: empty sequence");
    if (B <= 0) return sl_fail(SL_ERR_VALUE, "forward: empty batch");
    if (T > sl_model_max_positions(m))
        return sl_fail(SL_ERR_VALUE, "forward: %lld tokens, but the model's learned positions cover %lld",
                       (long long)T, (long long)m->n_pos);
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

/* x (n, d) = the embedding of ids[0..n): tok_embd[id] * embd_scale (+ type_embd) (+ pos_embd[t]),
 * then embd_norm (its input and statistics saved when et asks). */
static int embed(const sl_model *m, float *x, const int64_t *ids, int64_t n, sl_embd_tape *et) {
    const int64_t d = m->d_model;
    SL_TRY(sl_weight_rows(&m->tok_embd, ids, n, x));
    if (m->embd_scale != 1.0f)
        for (int64_t i = 0; i < n * d; i++) x[i] *= m->embd_scale;
    for (int64_t t = 0; t < n && m->type_embd; t++)
        for (int64_t i = 0; i < d; i++) x[t * d + i] += m->type_embd[i];
    if (m->pos_embd) sl_add_inplace(x, m->pos_embd, n * d);
    if (m->embd_norm.w) {
        if (et) tape_copy(et->in, x, n, d);
        norm_rows(m, &m->embd_norm, x, et ? et->mean : NULL, et ? et->rstd : NULL, x, n, d);
    }
    return SL_OK;
}

/* Layers [0, n_run) on the embedded ids (row stride T), leaving resid[n_run] in w->x. */
static int run_layers(const sl_model *m, const int64_t *ids, int64_t n_run, acts *w, const sl_capture *cap,
                      const sl_intervention *iv, sl_layer_tape *tapes, sl_embd_tape *et) {
    const int64_t d = m->d_model;
    const sl_patch_table *pt = iv ? iv->patch : NULL;
    w->freq_valid = 0;
    w->xb_normed = 0;
    for (int64_t b = 0; b < w->ab.B; b++)
        SL_TRY(embed(m, w->x + w->ab.off[b] * d, ids + b * w->ab.T_pad, w->ab.len[b], et));
    for (int64_t l = 0; l < n_run; l++) {
        SL_TRY(sl_check_interrupt());
        capture_resid(m, cap, l, w, pt);
        sl_attn_intervention aiv;
        sl_layer_intervention(m, iv, l, &aiv);
        sl_layer_tape *lt = tapes ? &tapes[l] : NULL;
        const sl_layer_weights *lw = &m->layers[l];
        sl_layer_weights windowed; /* the layer with the call's window override */
        if (iv && iv->window > 0 && (lw->window == 0 || iv->window < lw->window)) {
            windowed = *lw;
            windowed.window = iv->window;
            lw = &windowed;
        }
        SL_TRY(attention_block(m, lw, w, cap, l, &aiv, lt, pt));
        SL_TRY(sl_check_interrupt()); /* the MLP's three products are the layer's longest stretch */
        SL_TRY(mlp_block(m, &m->layers[l], w, cap, l, lt, l + 1 < n_run ? &m->layers[l + 1].attn_norm : NULL, pt));
    }
    return SL_OK;
}

/* The final norm and the output head on positions logits_from.. of each sequence, packed into
 * xb; one product when no sequence is shorter than T, else one per sequence (each writes its own
 * block of the (B, T - logits_from, V) output, the rest of which is zeroed). */
/* The final norm and the output head on the positions cap->logits_at, gathered into xb a chunk of
 * rows at a time (xb holds one row per token of the batch, so any number of chosen rows fits):
 * row b*R + r of the (B, R, V) output is position logits_at[b*R + r] of sequence b. Rows are
 * independent, so each is bitwise the row logits_from would give. */
static int logits_at_rows(const sl_model *m, acts *w, const sl_capture *cap) {
    const int64_t d = m->d_model, V = m->vocab_size, R = cap->logits_rows, n = w->ab.B * R;
    const int64_t tokens = w->ab.off[w->ab.B], chunk = tokens < SL_HEAD_ROWS ? tokens : SL_HEAD_ROWS;
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        const int64_t k = n - r0 < chunk ? n - r0 : chunk;
        float *out = cap->logits + r0 * V;
        SL_TRY(sl_check_interrupt());
        for (int64_t i = 0; i < k; i++) {
            const int64_t b = (r0 + i) / R;
            memcpy(w->xb + i * d, w->x + (w->ab.off[b] + cap->logits_at[r0 + i]) * d, (size_t)d * sizeof(float));
        }
        if (m->out_norm.w) norm_rows(m, &m->out_norm, w->xb, NULL, NULL, w->xb, k, d);
        SL_TRY(weight_product(m, head_slot(m), k, w->xb, d, &m->lm_head, out, V));
        if (m->final_softcap > 0.0f) sl_softcap(out, k * V, m->final_softcap);
    }
    return SL_OK;
}

/* cap->logits_at's positions each inside its sequence (lengths NULL: all T long). */
static int check_logits_at(const sl_capture *cap, int64_t B, int64_t T, const int64_t *lengths) {
    if (cap->logits_rows < 1)
        return sl_fail(SL_ERR_VALUE, "forward: logits_at has %lld rows per sequence, need >= 1",
                       (long long)cap->logits_rows);
    if (cap->logits_from != 0)
        return sl_fail(SL_ERR_VALUE, "forward: logits_at and logits_from=%lld are exclusive",
                       (long long)cap->logits_from);
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = lengths ? lengths[b] : T;
        for (int64_t r = 0; r < cap->logits_rows; r++) {
            const int64_t p = cap->logits_at[b * cap->logits_rows + r];
            if (p < 0 || p >= len)
                return sl_fail(SL_ERR_VALUE, "forward: logits_at[%lld, %lld]=%lld outside sequence %lld's [0, %lld)",
                               (long long)b, (long long)r, (long long)p, (long long)b, (long long)len);
        }
    }
    return SL_OK;
}

static int logits_head(const sl_model *m, acts *w, const sl_capture *cap) {
    if (cap->logits_at) return logits_at_rows(m, w, cap);
    const int64_t d = m->d_model, V = m->vocab_size, from = cap->logits_from, T = w->ab.T_pad, nl = T - from;
    int64_t r = 0;
    int ragged = 0;
    for (int64_t b = 0; b < w->ab.B; b++) {
        const int64_t n = w->ab.len[b] > from ? w->ab.len[b] - from : 0;
        memcpy(w->xb + r * d, w->x + (w->ab.off[b] + from) * d, (size_t)(n * d) * sizeof(float));
        r += n;
        ragged |= n != nl;
    }
    if (m->out_norm.w) norm_rows(m, &m->out_norm, w->xb, NULL, NULL, w->xb, r, d);
    if (!ragged) {
        /* in row chunks, so that Ctrl-C waits for at most one chunk of this long product (rows
         * are independent: the same bits as one product) */
        for (int64_t r0 = 0; r0 < r; r0 += SL_HEAD_ROWS) {
            const int64_t n = r - r0 < SL_HEAD_ROWS ? r - r0 : SL_HEAD_ROWS;
            SL_TRY(sl_check_interrupt());
            SL_TRY(weight_product(m, head_slot(m), n, w->xb + r0 * d, d, &m->lm_head, cap->logits + r0 * V, V));
        }
        if (m->final_softcap > 0.0f) sl_softcap(cap->logits, r * V, m->final_softcap);
        return SL_OK;
    }
    r = 0;
    for (int64_t b = 0; b < w->ab.B; b++) {
        const int64_t n = w->ab.len[b] > from ? w->ab.len[b] - from : 0;
        float *out = cap->logits + b * nl * V;
        SL_TRY(sl_check_interrupt());
        if (n > 0) SL_TRY(weight_product(m, head_slot(m), n, w->xb + r * d, d, &m->lm_head, out, V));
        if (n > 0 && m->final_softcap > 0.0f) sl_softcap(out, n * V, m->final_softcap);
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
    if (cap && cap->logits && !m->lm_head.data)
        return sl_fail(SL_ERR_VALUE, "forward: the model has no LM head, so no logits");
    if (cap && cap->logits && cap->logits_at) SL_TRY(check_logits_at(cap, B, T, lengths));
    sl_workspace *ws = ws_take(cache);
    if (!ws) return sl_fail(SL_ERR_MEMORY, "forward: cannot allocate the workspace");
    acts w;
    int rc = acts_bind(&w, ws, m, B, T, lengths, cap && cap->importance);
    if (rc == SL_OK) rc = run_layers(m, ids, m->n_layers, &w, cap, iv, NULL, NULL);
    if (rc == SL_OK) capture_resid(m, cap, m->n_layers, &w, iv ? iv->patch : NULL);
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

/* The tape's fields with their floats per token (0: unused by this model, left NULL), in one
 * table so sizing and binding cannot disagree. Features are layer 0's (sl_model_check makes every
 * layer alike). */
enum { TAPE_FIELDS = 32 };
static void tape_table(const sl_model *m, sl_layer_tape *lt, float **fields[TAPE_FIELDS], int64_t sizes[TAPE_FIELDS]) {
    const sl_layer_weights *lw = &m->layers[0];
    const int64_t d = m->d_model, H = m->n_heads, G = m->n_kv_heads, qd = H * m->head_dim, kvd = G * m->head_dim;
    const int64_t F = m->d_ff, ln = m->norm_kind == SL_NORM_LAYER;
    const int64_t n1 = lw->attn_norm.w != NULL, n2 = lw->ffn_norm.w != NULL, qn = lw->attn_q_norm != NULL;
    const int64_t kn = lw->attn_k_norm != NULL, p1 = lw->attn_post_norm.w != NULL, r1 = lw->attn_res_norm.w != NULL;
    const int64_t p2 = lw->ffn_post_norm.w != NULL, r2 = lw->ffn_res_norm.w != NULL;
    const int64_t gated = lw->w_gate.data != NULL, ag = lw->attn_gate.data != NULL;
    float **f[TAPE_FIELDS] = {&lt->x, &lt->xn1, &lt->mean1, &lt->rstd1, &lt->qr, &lt->kr, &lt->q_rstd, &lt->k_rstd,
                              &lt->q, &lt->k, &lt->v, &lt->z, &lt->o, &lt->o_mean, &lt->o_rstd, &lt->hr,
                              &lt->hr_mean, &lt->hr_rstd, &lt->h, &lt->xn2, &lt->mean2, &lt->rstd2, &lt->gate,
                              &lt->up, &lt->mo, &lt->mo_mean, &lt->mo_rstd, &lt->yr, &lt->yr_mean, &lt->yr_rstd,
                              &lt->za, &lt->ag};
    const int64_t n[TAPE_FIELDS] = {d, n1 * d, n1 * ln, n1, qn * qd, kn * kvd, qn * H, kn * G,
                                    qd, kvd, kvd, qd, p1 * d, p1 * ln, p1, r1 * d,
                                    r1 * ln, r1, d, n2 * d, n2 * ln, n2, gated * F,
                                    F, p2 * d, p2 * ln, p2, r2 * d, r2 * ln, r2, ag * qd, ag * qd};
    memcpy(fields, f, sizeof f);
    memcpy(sizes, n, sizeof n);
}
int64_t sl_layer_tape_floats(const sl_model *m, int64_t T) {
    sl_layer_tape lt;
    float **fields[TAPE_FIELDS];
    int64_t sizes[TAPE_FIELDS], total = 0, n;
    tape_table(m, &lt, fields, sizes);
    for (int i = 0; i < TAPE_FIELDS; i++) {
        if (!sl_mul_size(sizes[i], T, &n) || n > INT64_MAX - 16 - total) return -1;
        total += (n + 15) / 16 * 16; /* each field 64-byte aligned */
    }
    return total;
}

int sl_layer_tape_bind(const sl_model *m, int64_t T, float *buf, sl_layer_tape *lt) {
    float **fields[TAPE_FIELDS];
    int64_t sizes[TAPE_FIELDS];
    memset(lt, 0, sizeof *lt);
    tape_table(m, lt, fields, sizes);
    for (int i = 0; i < TAPE_FIELDS; i++) {
        *fields[i] = sizes[i] ? buf : NULL;
        buf += (sizes[i] * T + 15) / 16 * 16;
    }
    /* Without a pre-norm, what the products read is the stream itself. */
    if (!lt->xn1) lt->xn1 = lt->x;
    if (!lt->xn2) lt->xn2 = lt->h;
    return SL_OK;
}

int sl_model_forward_tape(const sl_model *m, const int64_t *ids, int64_t T, int64_t n_run,
                          sl_layer_tape *tapes, const sl_intervention *iv, float *x_out, sl_embd_tape *et) {
    SL_TRY(check_run(m, ids, 1, T, NULL, iv));
    if (n_run < 0 || n_run > m->n_layers)
        return sl_fail(SL_ERR_VALUE, "forward: %lld layers asked of a model with %lld", (long long)n_run,
                       (long long)m->n_layers);
    sl_workspace *ws = ws_take(NULL);
    if (!ws) return sl_fail(SL_ERR_MEMORY, "forward: cannot allocate the workspace");
    acts w;
    int rc = acts_bind(&w, ws, m, 1, T, NULL, 0);
    if (rc == SL_OK) rc = run_layers(m, ids, n_run, &w, NULL, iv, tapes, et);
    if (rc == SL_OK) capture_resid(m, NULL, n_run, &w, iv ? iv->patch : NULL);
    if (rc == SL_OK && x_out) memcpy(x_out, w.x, (size_t)(T * m->d_model) * sizeof(float));
    ws_destroy(ws);
    return rc;
}

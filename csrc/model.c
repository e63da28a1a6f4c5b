/* The transformer forward, layer by layer, in the order of Hugging Face's LlamaDecoderLayer:
 *   x += Wo · attention(rope(Wq·n1(x)), rope(Wk·n1(x)), Wv·n1(x))
 *   x += Wdown · (silu(Wgate·n2(x)) * Wup·n2(x))
 * Activations live in one workspace allocated per call; weights are only read. Captures
 * (sl_capture) are copies out of that workspace, taken as each tensor is produced.
 *
 * Each residual add is x + (W·h) with the product summed on its own first, as the reference
 * does: accumulating the dot product straight onto x would round every term at the scale of x,
 * and residual streams carry "massive activations" (hundreds to 10^4 in SmolLM2). */
#include "model.h"

#include <math.h>
#include <string.h>

#include "attention.h"
#include "ops.h"
#include "sgemm.h"
#include "sl_common.h"

typedef struct {
    float *x, *xb, *q, *k, *v, *att, *gate, *up, *cosv, *sinv;
} workspace;

static void workspace_free(workspace *w) {
    float **p = (float **)w;
    for (size_t i = 0; i < sizeof *w / sizeof(float *); i++) sl_free(p[i]);
    memset(w, 0, sizeof *w);
}

static int workspace_alloc(workspace *w, const sl_model *m, int64_t T) {
    const int64_t d = m->d_model, qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    const int64_t sizes[] = {d, d, qd, kvd, kvd, qd, m->d_ff, m->d_ff, m->head_dim / 2, m->head_dim / 2};
    float **p = (float **)w;
    memset(w, 0, sizeof *w);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int64_t n;
        if (!sl_mul_size(sizes[i], T, &n) || !(p[i] = sl_alloc_floats(n))) {
            workspace_free(w);
            return sl_fail(SL_ERR_MEMORY, "forward: cannot allocate activations for T=%lld",
                           (long long)T);
        }
    }
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

/* The per-layer slices of the capture and intervention arrays for the attention kernel. */
static void layer_views(const sl_model *m, const sl_capture *cap, const sl_intervention *iv,
                        int64_t l, sl_attn_stats *st, sl_attn_intervention *aiv) {
    memset(st, 0, sizeof *st);
    if (cap) {
        st->importance = cap->importance ? cap->importance[l] : NULL;
        st->to_first = cap->to_first ? cap->to_first[l] : NULL;
        st->entropy = cap->entropy ? cap->entropy[l] : NULL;
    }
    sl_layer_intervention(m, iv, l, aiv);
}

/* cap->name[l], or NULL when that capture or that layer is not asked for. */
#define CAP(cap, name, l) ((cap) && (cap)->name ? (cap)->name[l] : NULL)

/* dst (n_heads, T, hd) from the token-major src (T, ·) with row stride `stride`: the head-major
 * layout of the capture API. With the interleaved-pair RoPE layout (GGUF) each head is gathered
 * back into the rotate-half layout (element 2i -> i, 2i+1 -> i + hd/2, inverting llama.cpp's
 * permutation of the Q/K rows), so captures do not depend on the file format. A copy, serial:
 * it is O(T·H·hd), small beside the products around it. */
static void capture_heads(float *dst, const float *src, int64_t T, int64_t stride, int64_t n_heads,
                          int64_t hd, int adjacent) {
    const int64_t half = hd / 2;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t t = 0; t < T; t++) {
            const float *s = src + t * stride + h * hd;
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
}

static void capture_rows(float *dst, const float *src, int64_t T, int64_t d) {
    if (dst) memcpy(dst, src, (size_t)(T * d) * sizeof(float));
}

/* With a tape (lt != NULL) the layer's activations are written straight into it (q, k, v, z,
 * gate, up) or copied there (x, the norm outputs, h), for the backward and the JVP. */
static int attention_block(const sl_model *m, const sl_layer_weights *lw, workspace *w, int64_t T,
                           const sl_capture *cap, int64_t l, const sl_attn_intervention *aiv,
                           const sl_attn_stats *st, sl_layer_tape *lt) {
    const int64_t d = m->d_model, hd = m->head_dim, H = m->n_heads, G = m->n_kv_heads;
    const int64_t qd = H * hd, kvd = G * hd;
    const int adjacent = m->rope_layout == SL_ROPE_ADJACENT;
    float *cq = CAP(cap, q, l), *ck = CAP(cap, k, l), *cv = CAP(cap, v, l), *cz = CAP(cap, z, l);
    float *chead = CAP(cap, head_out, l);
    workspace view = *w;
    if (lt) {
        view.q = lt->q, view.k = lt->k, view.v = lt->v, view.att = lt->z;
        w = &view;
        capture_rows(lt->x, w->x, T, d);
    }
    sl_rmsnorm(w->xb, lt ? lt->rstd1 : NULL, w->x, lw->attn_norm, T, d, m->norm_eps);
    if (lt) capture_rows(lt->xn1, w->xb, T, d);
    SL_TRY(sl_sgemm_nt(T, qd, d, w->xb, d, lw->wq, d, w->q, qd, 0, 1));
    SL_TRY(sl_sgemm_nt(T, kvd, d, w->xb, d, lw->wk, d, w->k, kvd, 0, 1));
    SL_TRY(sl_sgemm_nt(T, kvd, d, w->xb, d, lw->wv, d, w->v, kvd, 0, 1));
    sl_rope_apply(w->q, T, qd, H, hd, w->cosv, w->sinv, m->rope_layout);
    sl_rope_apply(w->k, T, kvd, G, hd, w->cosv, w->sinv, m->rope_layout);
    if (cq) capture_heads(cq, w->q, T, qd, H, hd, adjacent);
    if (ck) capture_heads(ck, w->k, T, kvd, G, hd, adjacent);
    if (cv) capture_heads(cv, w->v, T, kvd, G, hd, 0); /* V rows are never permuted */
    sl_attn_shape s = {T, H, G, hd, (float)(1.0 / sqrt((double)hd))};
    SL_TRY(sl_attention_forward(&s, w->q, qd, w->k, w->v, kvd, w->att, CAP(cap, attn, l), aiv, st));
    if (cz) capture_heads(cz, w->att, T, qd, H, hd, 0);
    /* Head h's share of the W_O product, from its hd columns of W_O: summed over heads it is
     * attn_out up to rounding (a different summation order over the H*hd inputs). */
    if (chead)
        for (int64_t h = 0; h < H; h++)
            SL_TRY(sl_sgemm_nt(T, d, hd, w->att + h * hd, qd, lw->wo + h * hd, qd, chead + h * T * d, d,
                               0, 1));
    SL_TRY(sl_sgemm_nt(T, d, qd, w->att, qd, lw->wo, qd, w->xb, d, 0, 1));
    capture_rows(CAP(cap, attn_out, l), w->xb, T, d);
    sl_add_inplace(w->x, w->xb, T * d);
    if (lt) capture_rows(lt->h, w->x, T, d);
    return SL_OK;
}

static int mlp_block(const sl_model *m, const sl_layer_weights *lw, workspace *w, int64_t T,
                     const sl_capture *cap, int64_t l, sl_layer_tape *lt) {
    const int64_t d = m->d_model, F = m->d_ff;
    float *gate = lt ? lt->gate : w->gate, *up = lt ? lt->up : w->up;
    sl_rmsnorm(w->xb, lt ? lt->rstd2 : NULL, w->x, lw->ffn_norm, T, d, m->norm_eps);
    if (lt) capture_rows(lt->xn2, w->xb, T, d);
    SL_TRY(sl_sgemm_nt(T, F, d, w->xb, d, lw->w_gate, d, gate, F, 0, 1));
    SL_TRY(sl_sgemm_nt(T, F, d, w->xb, d, lw->w_up, d, up, F, 0, 1));
    sl_swiglu(w->gate, gate, up, T * F); /* the workspace's gate buffer holds the activation */
    SL_TRY(sl_sgemm_nt(T, d, F, w->gate, F, lw->w_down, F, w->xb, d, 0, 1));
    capture_rows(CAP(cap, mlp_out, l), w->xb, T, d);
    sl_add_inplace(w->x, w->xb, T * d);
    return SL_OK;
}

static void capture_resid(const sl_capture *cap, int64_t l, const float *x, int64_t T, int64_t d) {
    if (cap && cap->resid && cap->resid[l]) memcpy(cap->resid[l], x, (size_t)(T * d) * sizeof(float));
}

/* Checks shared by every entry point that runs the model on ids. */
static int check_run(const sl_model *m, const int64_t *ids, int64_t T, const sl_intervention *iv) {
    SL_TRY(check_model(m));
    SL_TRY(check_intervention(m, iv));
    if (T <= 0) return sl_fail(SL_ERR_VALUE, "forward: empty sequence");
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= m->vocab_size)
            return sl_fail(SL_ERR_VALUE, "forward: token id %lld at position %lld is outside [0, %lld)",
                           (long long)ids[t], (long long)t, (long long)m->vocab_size);
    return SL_OK;
}

/* Layers [0, n_run) on the embedded ids, leaving resid[n_run] in w->x. */
static int run_layers(const sl_model *m, const int64_t *ids, int64_t T, int64_t n_run, workspace *w,
                      const sl_capture *cap, const sl_intervention *iv, sl_layer_tape *tapes) {
    const int64_t d = m->d_model;
    sl_embed(w->x, m->tok_embd, ids, T, d);
    sl_rope_tables(w->cosv, w->sinv, m->rope_inv_freq, T, m->head_dim / 2);
    for (int64_t l = 0; l < n_run; l++) {
        capture_resid(cap, l, w->x, T, d);
        sl_attn_stats st;
        sl_attn_intervention aiv;
        layer_views(m, cap, iv, l, &st, &aiv);
        sl_layer_tape *lt = tapes ? &tapes[l] : NULL;
        SL_TRY(attention_block(m, &m->layers[l], w, T, cap, l, &aiv, &st, lt));
        SL_TRY(mlp_block(m, &m->layers[l], w, T, cap, l, lt));
    }
    return SL_OK;
}

int sl_model_forward(const sl_model *m, const int64_t *ids, int64_t T, const sl_capture *cap,
                     const sl_intervention *iv) {
    SL_TRY(check_run(m, ids, T, iv));
    if (cap && cap->logits && (cap->logits_from < 0 || cap->logits_from >= T))
        return sl_fail(SL_ERR_VALUE, "forward: logits_from=%lld outside [0, %lld)",
                       (long long)cap->logits_from, (long long)T);
    workspace w;
    SL_TRY(workspace_alloc(&w, m, T));
    const int64_t d = m->d_model;
    int rc = run_layers(m, ids, T, m->n_layers, &w, cap, iv, NULL);
    if (rc == SL_OK) capture_resid(cap, m->n_layers, w.x, T, d);
    if (rc == SL_OK && cap && cap->logits) {
        /* Only the requested rows go through the final norm and the (large) output head. */
        const int64_t from = cap->logits_from, n = T - from;
        sl_rmsnorm(w.xb, NULL, w.x + from * d, m->out_norm, n, d, m->norm_eps);
        rc = sl_sgemm_nt(n, m->vocab_size, d, w.xb, d, m->lm_head, d, cap->logits, m->vocab_size, 0, 1);
    }
    workspace_free(&w);
    return rc;
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
    SL_TRY(check_run(m, ids, T, iv));
    if (n_run < 0 || n_run > m->n_layers)
        return sl_fail(SL_ERR_VALUE, "forward: %lld layers asked of a model with %lld", (long long)n_run,
                       (long long)m->n_layers);
    workspace w;
    SL_TRY(workspace_alloc(&w, m, T));
    int rc = run_layers(m, ids, T, n_run, &w, NULL, iv, tapes);
    const int64_t d = m->d_model, half = m->head_dim / 2;
    if (rc == SL_OK && x_out) memcpy(x_out, w.x, (size_t)(T * d) * sizeof(float));
    if (rc == SL_OK && cosv) memcpy(cosv, w.cosv, (size_t)(T * half) * sizeof(float));
    if (rc == SL_OK && sinv) memcpy(sinv, w.sinv, (size_t)(T * half) * sizeof(float));
    workspace_free(&w);
    return rc;
}

/* Reverse- and forward-mode derivatives of the transformer, layer by layer over the tape that
 * sl_model_forward_tape saves (model.h), with the ops' own backward/JVP kernels (ops.h,
 * attention.h). Layer l, as the forward computes it:
 *   h = x + Wo·z,   z = attention(rope(Wq·n1(x)), rope(Wk·n1(x)), Wv·n1(x))
 *   y = h + Wdown·(silu(Wgate·n2(h)) * Wup·n2(h))
 * A batch of B directions (cotangents or tangents) for one sequence is held as B*T rows, so each
 * linear layer's derivative is one product with B*T rows: the d cotangents of a Jacobian cost one
 * GEMM per weight, not d calls. Memory: the tape (sl_layer_tape_floats per layer), the layer's
 * probabilities (H*T*T floats, recomputed per layer) and about (2d + 2*H*hd + 2*G*hd) floats per
 * row of directions (2 more H*hd when kv heads are shared, for per-head partials); the MLP's F-wide buffers are taken a few sequences at a time. */
#include "grad.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "jacobian.h"
#include "quant.h"
#include "ops.h"
#include "sgemm.h"
#include "sl_common.h"

/* MLP rows (of B*T) per block of the F-wide buffers. */
#define SL_GRAD_MLP_ROWS 8192

typedef struct {
    int64_t T, B, chunk;                  /* chunk: directions per MLP block */
    float *tape_buf, *cosv, *sinv, *probs;
    float *dx, *dz, *dq, *dk, *dv, *dxn;  /* (B*T, ·) */
    float *dact, *dg, *du;                /* (chunk*T, F) */
    float *act;                           /* (T, F), parameter gradients only */
    float *dh_dg, *dh_du;                 /* (T, F): the SwiGLU partials of the current layer */
    float *pk, *pv;                       /* (B*T, H*hd): per-head dk, dv when kv heads are shared */
    sl_layer_tape *tapes;
} grad_bufs;

static void grad_bufs_free(grad_bufs *g) {
    float **p[] = {&g->tape_buf, &g->cosv, &g->sinv, &g->probs, &g->dx, &g->dz, &g->dq, &g->dk, &g->dv,
                   &g->dxn, &g->dact, &g->dg, &g->du, &g->act, &g->dh_dg, &g->dh_du, &g->pk, &g->pv};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        sl_free(*p[i]);
        *p[i] = NULL;
    }
    free(g->tapes);
    g->tapes = NULL;
}

/* *out = a*b*c with overflow checks. */
static int mul3(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t ab;
    return sl_mul_size(a, b, &ab) && sl_mul_size(ab, c, out);
}

/* Tapes for n_tape layers and direction buffers for B directions; params: the (T, F) activation. */
static int grad_bufs_alloc(grad_bufs *g, const sl_model *m, int64_t T, int64_t B, int64_t n_tape, int params) {
    memset(g, 0, sizeof *g);
    const int64_t d = m->d_model, qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    const int64_t F = m->d_ff, H = m->n_heads, half = m->head_dim / 2;
    g->T = T, g->B = B;
    g->chunk = SL_GRAD_MLP_ROWS / T > 0 ? SL_GRAD_MLP_ROWS / T : 1;
    if (g->chunk > B) g->chunk = B;
    const int64_t per_layer = sl_layer_tape_floats(m, T);
    int64_t n_tape_f, n_probs, n_d, n_qd, n_kvd, n_f, n_half, n_tf;
    int ok = per_layer >= 0 && sl_mul_size(per_layer, n_tape > 0 ? n_tape : 1, &n_tape_f) &&
             mul3(H, T, T, &n_probs) && mul3(B, T, d, &n_d) && mul3(B, T, qd, &n_qd) && mul3(B, T, kvd, &n_kvd) &&
             mul3(g->chunk, T, F, &n_f) && sl_mul_size(T, half, &n_half) && sl_mul_size(T, F, &n_tf);
    if (!ok) return sl_fail(SL_ERR_MEMORY, "gradient: sizes overflow for T=%lld and %lld directions", (long long)T,
                            (long long)B);
    g->tapes = n_tape > 0 ? calloc((size_t)n_tape, sizeof(sl_layer_tape)) : NULL;
    /* Every buffer is written before it is read (tape by the forward, the rest by each layer). */
    g->tape_buf = sl_alloc_floats_uninit(n_tape_f);
    g->cosv = sl_alloc_floats_uninit(n_half);
    g->sinv = sl_alloc_floats_uninit(n_half);
    g->probs = sl_alloc_floats_uninit(n_probs);
    g->dx = sl_alloc_floats_uninit(n_d);
    g->dz = sl_alloc_floats_uninit(n_qd);
    g->dq = sl_alloc_floats_uninit(n_qd);
    g->dk = sl_alloc_floats_uninit(n_kvd);
    g->dv = sl_alloc_floats_uninit(n_kvd);
    g->dxn = sl_alloc_floats_uninit(n_d);
    g->dact = sl_alloc_floats_uninit(n_f);
    g->dg = sl_alloc_floats_uninit(n_f);
    g->du = sl_alloc_floats_uninit(n_f);
    g->act = params ? sl_alloc_floats_uninit(n_tf) : NULL;
    g->dh_dg = sl_alloc_floats_uninit(n_tf);
    g->dh_du = sl_alloc_floats_uninit(n_tf);
    const int shared = m->n_heads != m->n_kv_heads;
    g->pk = shared ? sl_alloc_floats_uninit(n_qd) : NULL;
    g->pv = shared ? sl_alloc_floats_uninit(n_qd) : NULL;
    if ((n_tape > 0 && !g->tapes) || !g->tape_buf || !g->cosv || !g->sinv || !g->probs || !g->dx || !g->dz ||
        !g->dq || !g->dk || !g->dv || !g->dxn || !g->dact || !g->dg || !g->du || (params && !g->act) ||
        !g->dh_dg || !g->dh_du || (shared && (!g->pk || !g->pv))) {
        grad_bufs_free(g);
        double gb = 4.0 * ((double)per_layer * (double)n_tape + 2.0 * (double)n_d + 4.0 * (double)n_qd +
                           2.0 * (double)n_kvd + 3.0 * (double)n_f + (double)n_probs) / 1e9;
        return sl_fail(SL_ERR_MEMORY, "gradient: cannot allocate %.2f GB for T=%lld and %lld directions "
                       "(fewer directions at once, or fewer tokens)", gb, (long long)T, (long long)B);
    }
    for (int64_t l = 0; l < n_tape; l++) sl_layer_tape_bind(m, T, g->tape_buf + l * per_layer, &g->tapes[l]);
    return SL_OK;
}

static sl_attn_shape attn_shape(const sl_model *m, const sl_layer_weights *lw, int64_t T) {
    sl_attn_shape s = {.T = T, .n_heads = m->n_heads, .n_kv_heads = m->n_kv_heads, .head_dim = m->head_dim,
                       .scale = m->attn_scale, .bidirectional = m->bidirectional, .window = lw->window,
                       .softcap = m->attn_softcap};
    return s;
}

/* A weight as float32: its own data, or a decoded copy (*owned = 1) the caller frees. */
static const float *weight_f32(const sl_weight *w, int *owned) {
    *owned = 0;
    if (w->type == SL_GGML_F32) return (const float *)w->data;
    float *f = sl_alloc_floats_uninit(w->rows * w->cols);
    if (f && sl_dequantize(w->type, w->data, w->rows * w->row_bytes, f, w->rows * w->cols, 1) != SL_OK) {
        sl_free(f);
        return NULL;
    }
    *owned = f != NULL;
    return f;
}

/* Parts of the descriptor the derivatives below do not follow yet: an error naming the first. */
static int check_differentiable(const sl_model *m) {
    const sl_layer_weights *lw = &m->layers[0];
    const char *what = m->norm_kind != SL_NORM_RMS ? "LayerNorm"
                       : m->act != SL_ACT_SWIGLU ? "activations other than SwiGLU"
                       : (lw->bq || lw->bk || lw->bv || lw->bo || lw->b_gate || lw->b_up || lw->b_down) ? "biases"
                       : (lw->attn_q_norm || lw->attn_k_norm) ? "QK-norm"
                       : (lw->attn_post_norm.w || lw->ffn_post_norm.w) ? "post-norms"
                       : (lw->attn_res_norm.w || lw->ffn_res_norm.w || !lw->attn_norm.w || !lw->ffn_norm.w) ? "post-LN blocks"
                       : (m->embd_scale != 1.0f || m->pos_embd || m->type_embd || m->embd_norm.w) ? "this embedding"
                       : m->final_softcap > 0.0f ? "final soft-capping"
                       : !lw->rope_inv_freq ? "models without RoPE"
                       : NULL;
    return what ? sl_fail(SL_ERR_VALUE, "gradients: %s not supported yet", what) : SL_OK;
}

/* Applies RoPE's backward (inverse rotation) or its JVP (the rotation) to B sequences of rows. */
static void rope_tables_for(const sl_model *m, const sl_layer_weights *lw, grad_bufs *g) {
    sl_rope_tables(g->cosv, g->sinv, lw->rope_inv_freq, g->T, m->head_dim / 2);
}

static void rope_rows(const sl_model *m, const grad_bufs *g, float *x, int64_t stride, int64_t heads, int inverse) {
    for (int64_t b = 0; b < g->B; b++) {
        float *xb = x + b * g->T * stride;
        if (inverse)
            sl_rope_backward(xb, g->T, stride, heads, m->head_dim, g->cosv, g->sinv, m->rope_layout);
        else
            sl_rope_apply(xb, g->T, stride, heads, m->head_dim, g->cosv, g->sinv, m->rope_layout);
    }
}

/* Reduction length per block of the products whose K is long. */
#define SL_GRAD_K_BLOCK 2048

/* C (+)= op(A) . B (B stored (K, N); A stored (M, K), or (K, M) with trans_a) for the long K of the
 * LM head's backward (the vocabulary) and of weight gradients over many positions: K is cut into
 * fixed blocks, each block's product one float chain, the blocks (and C when accumulating) summed
 * in double in order. A single float chain over ~50k terms loses about 1e-4 relative; the blocks
 * depend on K only, so results stay the same for any thread count. */
static int sgemm_long_k(int trans_a, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate) {
    if (K <= SL_GRAD_K_BLOCK) return sl_sgemm(trans_a, 0, M, N, K, A, lda, B, ldb, C, ldc, accumulate, 1);
    int64_t n;
    if (!sl_mul_size(M, N, &n)) return sl_fail(SL_ERR_MEMORY, "gradient: size overflow");
    float *part = sl_alloc_floats(n);
    double *acc = (double *)sl_alloc_floats(2 * n);
    int rc = part && acc ? SL_OK : sl_fail(SL_ERR_MEMORY, "gradient: cannot allocate %lld floats", (long long)(3 * n));
    for (int64_t i = 0; i < M && rc == SL_OK && accumulate; i++)
        for (int64_t j = 0; j < N; j++) acc[i * N + j] = C[i * ldc + j];
    for (int64_t k0 = 0; k0 < K && rc == SL_OK; k0 += SL_GRAD_K_BLOCK) {
        const int64_t kb = K - k0 < SL_GRAD_K_BLOCK ? K - k0 : SL_GRAD_K_BLOCK;
        const float *a = trans_a ? A + k0 * lda : A + k0;
        rc = sl_sgemm(trans_a, 0, M, N, kb, a, lda, B + k0 * ldb, ldb, part, N, 0, 1);
        for (int64_t i = 0; i < n && rc == SL_OK; i++) acc[i] += part[i];
    }
    for (int64_t i = 0; i < M && rc == SL_OK; i++)
        for (int64_t j = 0; j < N; j++) C[i * ldc + j] = (float)acc[i * N + j];
    sl_free(part);
    sl_free(acc);
    return rc;
}

/* dW (out x in) += dY^T X over `rows` rows: a weight's gradient. */
static int weight_grad(float *dw, int64_t out, int64_t in, int64_t rows, const float *dy, const float *x) {
    return sgemm_long_k(1, out, in, rows, dy, out, x, in, dw, in, 1);
}

/* ------------------------------------------------------------------------------------------
 * Reverse mode. g->dx holds the gradient w.r.t. the layer's output on entry and w.r.t. its input
 * (resid[l]) on exit. Parameter gradients (lg, B == 1 only) use the tape's inputs of each product. */

static int mlp_backward(const sl_model *m, const sl_layer_weights *lw, const sl_layer_tape *lt, grad_bufs *g,
                        sl_layer_grads *lg) {
    const int64_t T = g->T, d = m->d_model, F = m->d_ff;
    if (lg) sl_swiglu(g->act, lt->gate, lt->up, T * F);
    sl_swiglu_partials(g->dh_dg, g->dh_du, lt->gate, lt->up, T * F);
    for (int64_t b0 = 0; b0 < g->B; b0 += g->chunk) {
        const int64_t nb = g->B - b0 < g->chunk ? g->B - b0 : g->chunk, rows = nb * T;
        float *dx = g->dx + b0 * T * d, *dxn = g->dxn + b0 * T * d;
        SL_TRY(sl_linear_nn(rows, dx, d, &lw->w_down, g->dact, F, 0, 1));
        if (lg) SL_TRY(weight_grad(lg->w_down, d, F, rows, dx, g->act));
        sl_swiglu_backward(g->dg, g->du, g->dact, g->dh_dg, g->dh_du, rows * F, T * F);
        SL_TRY(sl_linear_nn(rows, g->dg, F, &lw->w_gate, dxn, d, 0, 1));
        SL_TRY(sl_linear_nn(rows, g->du, F, &lw->w_up, dxn, d, 1, 1));
        if (lg) {
            SL_TRY(weight_grad(lg->w_gate, F, d, rows, g->dg, lt->xn2));
            SL_TRY(weight_grad(lg->w_up, F, d, rows, g->du, lt->xn2));
        }
        /* The residual path: d/dh = dy + n2's backward of dxn. */
        sl_rmsnorm_backward(dx, 1, lg ? lg->ffn_norm : NULL, dxn, lt->h, lw->ffn_norm.w, lt->rstd2, rows, T, d);
    }
    return SL_OK;
}

static int attention_backward(const sl_model *m, const sl_layer_weights *lw, const sl_layer_tape *lt,
                              grad_bufs *g, const sl_attn_intervention *aiv, sl_layer_grads *lg) {
    const int64_t T = g->T, rows = g->B * T, d = m->d_model;
    const int64_t qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    const sl_attn_shape s = attn_shape(m, lw, T);
    rope_tables_for(m, lw, g);
    SL_TRY(sl_linear_nn(rows, g->dx, d, &lw->wo, g->dz, qd, 0, 1));
    if (lg) SL_TRY(weight_grad(lg->wo, d, qd, rows, g->dx, lt->z));
    SL_TRY(sl_attention_probs(&s, lt->q, lt->k, g->probs, aiv));
    SL_TRY(sl_attention_backward(&s, g->B, lt->q, lt->k, lt->v, g->probs, g->dz, g->dq, g->dk, g->dv, g->pk, g->pv,
                                 aiv));
    rope_rows(m, g, g->dq, qd, m->n_heads, 1);
    rope_rows(m, g, g->dk, kvd, m->n_kv_heads, 1);
    SL_TRY(sl_linear_nn(rows, g->dq, qd, &lw->wq, g->dxn, d, 0, 1));
    SL_TRY(sl_linear_nn(rows, g->dk, kvd, &lw->wk, g->dxn, d, 1, 1));
    SL_TRY(sl_linear_nn(rows, g->dv, kvd, &lw->wv, g->dxn, d, 1, 1));
    if (lg) {
        SL_TRY(weight_grad(lg->wq, qd, d, rows, g->dq, lt->xn1));
        SL_TRY(weight_grad(lg->wk, kvd, d, rows, g->dk, lt->xn1));
        SL_TRY(weight_grad(lg->wv, kvd, d, rows, g->dv, lt->xn1));
    }
    sl_rmsnorm_backward(g->dx, 1, lg ? lg->attn_norm : NULL, g->dxn, lt->x, lw->attn_norm.w, lt->rstd1, rows, T, d);
    return SL_OK;
}

static int layer_backward(const sl_model *m, const sl_intervention *iv, int64_t l, grad_bufs *g,
                          sl_layer_grads *lg) {
    sl_attn_intervention aiv;
    sl_layer_intervention(m, iv, l, &aiv);
    SL_TRY(mlp_backward(m, &m->layers[l], &g->tapes[l], g, lg));
    return attention_backward(m, &m->layers[l], &g->tapes[l], g, &aiv, lg);
}

/* Copies and reduces the gradient w.r.t. resid[l] as out asks. */
static int record_layer(sl_vjp_out *out, int64_t l, const grad_bufs *g, int64_t d) {
    if (!out) return SL_OK;
    if (out->dresid && out->dresid[l]) memcpy(out->dresid[l], g->dx, (size_t)(g->B * g->T * d) * sizeof(float));
    if (out->sqnorm && out->sqnorm[l]) sl_block_sqnorms(g->dx, g->B, g->T, d, out->sqnorm[l]);
    if (out->spectral && out->spectral[l]) {
        int it = sl_block_spectral(g->dx, g->B, g->T, d, out->spectral_rtol, out->spectral_max_iter, out->spectral[l]);
        if (it < 0) return -it;
        if (it > out->spectral_iters) out->spectral_iters = it;
    }
    return SL_OK;
}

/* The lowest layer boundary out asks anything of (at when it asks nothing). */
static int64_t lowest_requested(const sl_vjp_out *out, int64_t at) {
    if (!out) return at;
    for (int64_t l = 0; l < at; l++)
        if ((out->dresid && out->dresid[l]) || (out->sqnorm && out->sqnorm[l]) || (out->spectral && out->spectral[l]))
            return l;
    return at;
}

static int check_directions(const sl_model *m, int64_t at, int64_t B, const void *dirs, const char *what) {
    SL_TRY(sl_model_check(m));
    SL_TRY(check_differentiable(m));
    if (at < 0 || at > m->n_layers)
        return sl_fail(SL_ERR_VALUE, "%s: layer %lld outside [0, %lld]", what, (long long)at, (long long)m->n_layers);
    if (B < 1 || !dirs) return sl_fail(SL_ERR_VALUE, "%s: need at least one direction", what);
    return SL_OK;
}

int sl_model_vjp(const sl_model *m, const int64_t *ids, int64_t T, const sl_intervention *iv, int64_t at,
                 int64_t B, const float *cot, sl_vjp_out *out) {
    SL_TRY(check_directions(m, at, B, cot, "vjp"));
    if (out) out->spectral_iters = 0;
    const int64_t low = lowest_requested(out, at), d = m->d_model;
    grad_bufs g;
    SL_TRY(grad_bufs_alloc(&g, m, T > 0 ? T : 1, B, at, 0));
    int rc = sl_model_forward_tape(m, ids, T, at, g.tapes, iv, NULL, NULL);
    if (rc == SL_OK) {
        memcpy(g.dx, cot, (size_t)(B * T * d) * sizeof(float));
        rc = record_layer(out, at, &g, d);
    }
    for (int64_t l = at - 1; l >= low && rc == SL_OK; l--) {
        rc = layer_backward(m, iv, l, &g, NULL);
        if (rc == SL_OK) rc = record_layer(out, l, &g, d);
    }
    grad_bufs_free(&g);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The language-model loss. */

/* Cross-entropy of each row with a target; dlogits (in place of the logits) = (softmax -
 * onehot) / n for those rows, zero for the others. Rows in parallel, each row's loss kept and
 * the losses summed in position order (in double), so the loss is the same for any thread count. */
static int cross_entropy(float *logits, const int64_t *targets, int64_t T, int64_t V, double *loss) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++) {
        if (targets[t] >= V)
            return sl_fail(SL_ERR_VALUE, "loss: target %lld at position %lld is outside [0, %lld)",
                           (long long)targets[t], (long long)t, (long long)V);
        n += targets[t] >= 0;
    }
    if (n == 0) return sl_fail(SL_ERR_VALUE, "loss: no position has a target (all are negative)");
    double *row_loss = (double *)sl_alloc_floats(2 * T);
    if (!row_loss) return sl_fail(SL_ERR_MEMORY, "loss: cannot allocate %lld doubles", (long long)T);
#pragma omp parallel for schedule(static) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) {
        float *row = logits + t * V;
        if (targets[t] < 0) {
            memset(row, 0, (size_t)V * sizeof(float));
            continue;
        }
        float mx = row[0];
        for (int64_t i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
        double z = 0.0;
        for (int64_t i = 0; i < V; i++) z += exp((double)row[i] - mx);
        row_loss[t] = log(z) + mx - row[targets[t]];
        for (int64_t i = 0; i < V; i++) row[i] = (float)(exp((double)row[i] - mx) / z / (double)n);
        row[targets[t]] -= (float)(1.0 / (double)n);
    }
    double total = 0.0;
    for (int64_t t = 0; t < T; t++) total += row_loss[t]; /* zero for rows without a target */
    sl_free(row_loss);
    *loss = total / (double)n;
    return SL_OK;
}

int sl_model_loss_grad(const sl_model *m, const int64_t *ids, const int64_t *targets, int64_t T,
                       const sl_intervention *iv, double *loss, const sl_model_grads *pg) {
    if (!pg || !pg->tok_embd || !pg->out_norm || !pg->lm_head || !pg->layers)
        return sl_fail(SL_ERR_VALUE, "loss: every parameter gradient buffer is needed");
    SL_TRY(sl_model_check(m));
    SL_TRY(check_differentiable(m));
    if (!m->lm_head.data) return sl_fail(SL_ERR_VALUE, "loss: the model has no LM head");
    const int64_t d = m->d_model, V = m->vocab_size, L = m->n_layers;
    grad_bufs g;
    SL_TRY(grad_bufs_alloc(&g, m, T > 0 ? T : 1, 1, L, 1));
    int64_t n_logits, n_x;
    float *xf = sl_mul_size(T, d, &n_x) ? sl_alloc_floats(n_x) : NULL, *rstd = sl_alloc_floats(T);
    float *logits = sl_mul_size(T, V, &n_logits) ? sl_alloc_floats(n_logits) : NULL;
    int rc = (!xf || !rstd || !logits) ? sl_fail(SL_ERR_MEMORY, "loss: cannot allocate the logits (%lld x %lld)",
                                                  (long long)T, (long long)V)
                                       : sl_model_forward_tape(m, ids, T, L, g.tapes, iv, g.dx, NULL);
    if (rc == SL_OK) {
        /* dx holds resid[L]; xf its final norm; the logits become their gradient in place. */
        sl_rmsnorm(xf, rstd, g.dx, m->out_norm.w, T, d, m->norm_eps);
        rc = sl_linear_nt(T, xf, d, &m->lm_head, logits, V, 0, 1);
    }
    if (rc == SL_OK) rc = cross_entropy(logits, targets, T, V, loss);
    if (rc == SL_OK) rc = weight_grad(pg->lm_head, V, d, T, logits, xf);
    if (rc == SL_OK) {
        int owned = 0;
        const float *head = weight_f32(&m->lm_head, &owned);
        rc = head ? sgemm_long_k(0, T, d, V, logits, V, head, d, g.dxn, d, 0)
                  : sl_fail(SL_ERR_MEMORY, "loss: cannot decode the LM head");
        if (owned) sl_free((float *)head);
    }
    if (rc == SL_OK) {
        memcpy(xf, g.dx, (size_t)(T * d) * sizeof(float)); /* resid[L], the final norm's input */
        sl_rmsnorm_backward(g.dx, 0, pg->out_norm, g.dxn, xf, m->out_norm.w, rstd, T, T, d);
    }
    for (int64_t l = L - 1; l >= 0 && rc == SL_OK; l--) rc = layer_backward(m, iv, l, &g, &pg->layers[l]);
    if (rc == SL_OK) sl_embed_backward(pg->tok_embd, g.dx, ids, T, d);
    sl_free(xf);
    sl_free(rstd);
    sl_free(logits);
    grad_bufs_free(&g);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Forward mode. g->dx holds the tangent of the layer's input on entry and of its output on exit;
 * each addition to the stream is formed on its own first, then added, as in the forward. */

static int attention_jvp(const sl_model *m, const sl_layer_weights *lw, const sl_layer_tape *lt, grad_bufs *g,
                         const sl_attn_intervention *aiv) {
    const int64_t T = g->T, rows = g->B * T, d = m->d_model;
    const int64_t qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    const sl_attn_shape s = attn_shape(m, lw, T);
    rope_tables_for(m, lw, g);
    sl_rmsnorm_jvp(g->dxn, g->dx, lt->x, lw->attn_norm.w, lt->rstd1, rows, T, d);
    SL_TRY(sl_linear_nt(rows, g->dxn, d, &lw->wq, g->dq, qd, 0, 1));
    SL_TRY(sl_linear_nt(rows, g->dxn, d, &lw->wk, g->dk, kvd, 0, 1));
    SL_TRY(sl_linear_nt(rows, g->dxn, d, &lw->wv, g->dv, kvd, 0, 1));
    rope_rows(m, g, g->dq, qd, m->n_heads, 0);
    rope_rows(m, g, g->dk, kvd, m->n_kv_heads, 0);
    SL_TRY(sl_attention_probs(&s, lt->q, lt->k, g->probs, aiv));
    SL_TRY(sl_attention_jvp(&s, g->B, lt->q, lt->k, lt->v, g->probs, g->dq, g->dk, g->dv, g->dz, aiv));
    SL_TRY(sl_linear_nt(rows, g->dz, qd, &lw->wo, g->dxn, d, 0, 1));
    sl_add_inplace(g->dx, g->dxn, rows * d);
    return SL_OK;
}

static int mlp_jvp(const sl_model *m, const sl_layer_weights *lw, const sl_layer_tape *lt, grad_bufs *g) {
    const int64_t T = g->T, d = m->d_model, F = m->d_ff;
    sl_swiglu_partials(g->dh_dg, g->dh_du, lt->gate, lt->up, T * F);
    for (int64_t b0 = 0; b0 < g->B; b0 += g->chunk) {
        const int64_t nb = g->B - b0 < g->chunk ? g->B - b0 : g->chunk, rows = nb * T;
        float *dx = g->dx + b0 * T * d, *dxn = g->dxn + b0 * T * d;
        sl_rmsnorm_jvp(dxn, dx, lt->h, lw->ffn_norm.w, lt->rstd2, rows, T, d);
        SL_TRY(sl_linear_nt(rows, dxn, d, &lw->w_gate, g->dg, F, 0, 1));
        SL_TRY(sl_linear_nt(rows, dxn, d, &lw->w_up, g->du, F, 0, 1));
        sl_swiglu_jvp(g->dact, g->dg, g->du, g->dh_dg, g->dh_du, rows * F, T * F);
        SL_TRY(sl_linear_nt(rows, g->dact, F, &lw->w_down, dxn, d, 0, 1));
        sl_add_inplace(dx, dxn, rows * d);
    }
    return SL_OK;
}

int sl_model_jvp(const sl_model *m, const int64_t *ids, int64_t T, const sl_intervention *iv, int64_t at,
                 int64_t B, const float *tangent, float **tout) {
    SL_TRY(check_directions(m, at, B, tangent, "jvp"));
    const int64_t L = m->n_layers, d = m->d_model;
    grad_bufs g;
    SL_TRY(grad_bufs_alloc(&g, m, T > 0 ? T : 1, B, L, 0));
    int rc = sl_model_forward_tape(m, ids, T, L, g.tapes, iv, NULL, NULL);
    if (rc == SL_OK) memcpy(g.dx, tangent, (size_t)(B * T * d) * sizeof(float));
    if (rc == SL_OK && tout && tout[at]) memcpy(tout[at], g.dx, (size_t)(B * T * d) * sizeof(float));
    for (int64_t l = at; l < L && rc == SL_OK; l++) {
        sl_attn_intervention aiv;
        sl_layer_intervention(m, iv, l, &aiv);
        rc = attention_jvp(m, &m->layers[l], &g.tapes[l], &g, &aiv);
        if (rc == SL_OK) rc = mlp_jvp(m, &m->layers[l], &g.tapes[l], &g);
        if (rc == SL_OK && tout && tout[l + 1]) memcpy(tout[l + 1], g.dx, (size_t)(B * T * d) * sizeof(float));
    }
    grad_bufs_free(&g);
    return rc;
}

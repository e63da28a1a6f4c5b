/* Reverse- and forward-mode derivatives of the transformer, layer by layer over the tape that
 * sl_model_forward_tape saves (model.h), with the ops' own backward/JVP kernels (ops.h,
 * attention.h). Layer l, as the forward computes it (every optional piece shown, model.h):
 *   a = n1(x);  q = rope(qn(Wq a + bq)),  k = rope(kn(Wk a + bk)),  v = Wv a + bv
 *   h = r1(x + p1(Wo·attention(q, k, v) + bo))
 *   y = r2(h + p2(Wdown·act(Wgate·n2(h) + bg, Wup·n2(h) + bu) + bd))
 * (n: pre-norms, qn/kn: per-head QK-norms, p: post-norms, r: post-LN residual norms.)
 * A batch of B directions (cotangents or tangents) for one sequence is held as B*T rows, so each
 * linear layer's derivative is one product with B*T rows: the d cotangents of a Jacobian cost one
 * GEMM per weight, not d calls. Memory: the tape (sl_layer_tape_floats per layer), the layer's
 * probabilities (H*T*T floats, recomputed per layer) and about (2d + 2*H*hd + 2*G*hd) floats per
 * row of directions (2 more H*hd when kv heads are shared, for per-head partials; H*hd more with
 * QK-norm, d more with post-norms or post-LN in the forward mode); the MLP's F-wide buffers are
 * taken a few sequences at a time. */
#include "grad.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "gemm_bf16.h"
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
    float *dr;                            /* (B*T, H*hd): the QK-norm's out-of-place result, or NULL */
    float *ds;                            /* (B*T, d): the JVP's post-norm scratch, or NULL */
    float *dag;                           /* (B*T, H*hd): gated attention's W_g a derivative, or NULL */
    float *dsinks;                        /* (B, H): the sink logits' gradients, or NULL */
    sl_layer_tape *tapes;
} grad_bufs;

static void grad_bufs_free(grad_bufs *g) {
    float **p[] = {&g->tape_buf, &g->cosv, &g->sinv, &g->probs, &g->dx, &g->dz, &g->dq, &g->dk, &g->dv,
                   &g->dxn, &g->dact, &g->dg, &g->du, &g->act, &g->dh_dg, &g->dh_du, &g->pk, &g->pv, &g->dr, &g->ds,
                   &g->dag, &g->dsinks};
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

/* Floats of each buffer grad_bufs_alloc takes, in one place so sizing (sl_model_grad_floats)
 * and allocation cannot disagree: chunk directions per MLP block, per_layer floats of tape,
 * n_probs (H, T, T), n_d, n_qd, n_kvd (B*T rows of d, H*hd, G*hd), n_f (chunk*T, F), n_half
 * (T, hd/2), n_tf (T, F); which optional buffers the model needs. 0 on overflow. */
typedef struct {
    int64_t chunk, per_layer, n_probs, n_d, n_qd, n_kvd, n_f, n_half, n_tf, n_sinks;
    int shared, qk_norm, post, gated;
} grad_sizes;

static int grad_sizes_of(const sl_model *m, int64_t T, int64_t B, grad_sizes *z) {
    const int64_t d = m->d_model, qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    const int64_t F = m->d_ff, H = m->n_heads, half = m->head_dim / 2;
    const sl_layer_weights *lw = &m->layers[0];
    z->chunk = SL_GRAD_MLP_ROWS / T > 0 ? SL_GRAD_MLP_ROWS / T : 1;
    if (z->chunk > B) z->chunk = B;
    z->per_layer = sl_layer_tape_floats(m, T);
    z->shared = m->n_heads != m->n_kv_heads;
    z->qk_norm = lw->attn_q_norm || lw->attn_k_norm;
    z->post = lw->attn_post_norm.w || lw->ffn_post_norm.w || lw->attn_res_norm.w || lw->ffn_res_norm.w;
    z->gated = lw->attn_gate.data != NULL;
    z->n_sinks = lw->attn_sinks ? B * H : 0;
    return z->per_layer >= 0 && mul3(H, T, T, &z->n_probs) && mul3(B, T, d, &z->n_d) && mul3(B, T, qd, &z->n_qd) &&
           mul3(B, T, kvd, &z->n_kvd) && mul3(z->chunk, T, F, &z->n_f) && sl_mul_size(T, half, &z->n_half) &&
           sl_mul_size(T, F, &z->n_tf);
}

/* sum of n[0..k) times their factors c[0..k), -1 on overflow */
static int64_t weighted_sum(const int64_t *n, const int64_t *c, int k) {
    int64_t total = 0, t;
    for (int i = 0; i < k; i++) {
        if (!sl_mul_size(n[i], c[i], &t) || t > INT64_MAX - total) return -1;
        total += t;
    }
    return total;
}

int64_t sl_model_grad_floats(const sl_model *m, int64_t T, int64_t B, int64_t n_tape) {
    grad_sizes z;
    if (T < 1 || B < 0 || n_tape < 0 || n_tape > m->n_layers || !grad_sizes_of(m, T, B, &z)) return -1;
    /* tape, probs, dx+dxn (+ds), dz+dq (+pk+pv, +dr, +dag), dk+dv, dact+dg+du, dh_dg+dh_du, dsinks */
    const int64_t n[] = {z.per_layer, z.n_probs, z.n_d, z.n_qd, z.n_kvd, z.n_f, z.n_tf, z.n_sinks};
    const int64_t c[] = {n_tape, 1, 2 + z.post, 2 + 2 * z.shared + z.qk_norm + z.gated, 2, 3, 2, 1};
    return weighted_sum(n, c, 8);
}

/* Tapes for n_tape layers and direction buffers for B directions; params: the (T, F) activation;
 * scratch: the forward mode's (B*T, d) post-norm buffer. */
static int grad_bufs_alloc(grad_bufs *g, const sl_model *m, int64_t T, int64_t B, int64_t n_tape, int params,
                           int scratch) {
    memset(g, 0, sizeof *g);
    g->T = T, g->B = B;
    grad_sizes z;
    int64_t n_tape_f;
    int ok = grad_sizes_of(m, T, B, &z) && sl_mul_size(z.per_layer, n_tape > 0 ? n_tape : 1, &n_tape_f);
    if (!ok) return sl_fail(SL_ERR_MEMORY, "gradient: sizes overflow for T=%lld and %lld directions", (long long)T,
                            (long long)B);
    g->chunk = z.chunk;
    const int64_t per_layer = z.per_layer, n_probs = z.n_probs, n_d = z.n_d, n_qd = z.n_qd, n_kvd = z.n_kvd;
    const int64_t n_f = z.n_f, n_half = z.n_half, n_tf = z.n_tf;
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
    const int shared = z.shared, qk_norm = z.qk_norm, post = scratch && z.post;
    g->pk = shared ? sl_alloc_floats_uninit(n_qd) : NULL;
    g->pv = shared ? sl_alloc_floats_uninit(n_qd) : NULL;
    g->dr = qk_norm ? sl_alloc_floats_uninit(n_qd) : NULL;
    g->ds = post ? sl_alloc_floats_uninit(n_d) : NULL;
    g->dag = z.gated ? sl_alloc_floats_uninit(n_qd) : NULL;
    g->dsinks = z.n_sinks ? sl_alloc_floats_uninit(z.n_sinks) : NULL;
    if ((n_tape > 0 && !g->tapes) || !g->tape_buf || !g->cosv || !g->sinv || !g->probs || !g->dx || !g->dz ||
        !g->dq || !g->dk || !g->dv || !g->dxn || !g->dact || !g->dg || !g->du || (params && !g->act) ||
        !g->dh_dg || !g->dh_du || (shared && (!g->pk || !g->pv)) || (qk_norm && !g->dr) || (post && !g->ds) ||
        (z.gated && !g->dag) || (z.n_sinks && !g->dsinks)) {
        grad_bufs_free(g);
        double gb = 4.0 * ((double)per_layer * (double)n_tape + 3.0 * (double)n_d + 5.0 * (double)n_qd +
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
                       .softcap = m->attn_softcap, .variant = sl_model_attn_kernel(m), .sinks = lw->attn_sinks};
    return s;
}

/* RoPE tables of the layer's frequencies for positions 0..T-1 (layers without RoPE: none). */
static void rope_tables_for(const sl_model *m, const sl_layer_weights *lw, grad_bufs *g) {
    if (lw->rope_inv_freq) sl_rope_tables(g->cosv, g->sinv, lw->rope_inv_freq, g->T, m->head_dim / 2);
}

/* Applies RoPE's backward (inverse rotation) or its JVP (the rotation) to B sequences of rows. */
static void rope_rows(const sl_model *m, const sl_layer_weights *lw, const grad_bufs *g, float *x, int64_t stride,
                      int64_t heads, int inverse) {
    if (!lw->rope_inv_freq) return;
    for (int64_t b = 0; b < g->B; b++) {
        float *xb = x + b * g->T * stride;
        if (inverse)
            sl_rope_backward(xb, g->T, stride, heads, m->head_dim, g->cosv, g->sinv, m->rope_layout);
        else
            sl_rope_apply(xb, g->T, stride, heads, m->head_dim, g->cosv, g->sinv, m->rope_layout);
    }
}

/* dx (+)= J^T dy of the model's norm kind at input x (T rows, statistics mean/rstd), over `rows`
 * rows of directions; dw, db (each NULL or d) += its weight and bias gradients. */
static void norm_backward(const sl_model *m, const sl_norm *n, float *dx, int accumulate, float *dw, float *db,
                          const float *dy, const float *x, const float *mean, const float *rstd, int64_t rows,
                          int64_t T, int64_t d) {
    if (m->norm_kind == SL_NORM_LAYER)
        sl_layernorm_backward(dx, accumulate, dw, db, dy, x, n->w, mean, rstd, rows, T, d);
    else
        sl_rmsnorm_backward(dx, accumulate, dw, dy, x, n->w, rstd, rows, T, d);
}

/* dy = J dx of the model's norm kind at input x. */
static void norm_jvp(const sl_model *m, const sl_norm *n, float *dy, const float *dx, const float *x,
                     const float *mean, const float *rstd, int64_t rows, int64_t T, int64_t d) {
    if (m->norm_kind == SL_NORM_LAYER)
        sl_layernorm_jvp(dy, dx, x, n->w, mean, rstd, rows, T, d);
    else
        sl_rmsnorm_jvp(dy, dx, x, n->w, rstd, rows, T, d);
}

/* The per-head QK-norm (always RMSNorm) of `heads` heads per row, in place on the directions d
 * (B*T rows of heads*hd, laid out as B*T*heads rows of hd) through the scratch dr: its backward
 * (dw += the weight gradient) or its JVP. pre/rstd: the tape's pre-norm rows and statistics. */
static void qk_norm(const sl_model *m, const grad_bufs *g, float *dd, const float *w, float *dw, const float *pre,
                    const float *rstd, int64_t heads, int backward) {
    const int64_t hd = m->head_dim, rows = g->B * g->T * heads;
    if (!w) return;
    if (backward)
        sl_rmsnorm_backward(g->dr, 0, dw, dd, pre, w, rstd, rows, g->T * heads, hd);
    else
        sl_rmsnorm_jvp(g->dr, dd, pre, w, rstd, rows, g->T * heads, hd);
    memcpy(dd, g->dr, (size_t)(rows * hd) * sizeof(float));
}

/* Reduction length per block of the products whose K is long. */
#define SL_GRAD_K_BLOCK 2048
/* Output rows per chunk of those products: a multiple of every register and cache tile height
 * (6, 12, 14, 112, 168), so chunks fall on the tiles' own boundaries. Chunks bound the scratch
 * memory and the time between Ctrl-C checks (~5 GFLOP per chunk x K block at d = 576). */
#define SL_GRAD_M_BLOCK 2016

/* One chunk of sgemm_long_k: rows [m0, m0 + mb) of C, its K blocks summed in double in order. */
static int sgemm_long_k_rows(int trans_a, int64_t m0, int64_t mb, int64_t N, int64_t K, const float *A, int64_t lda,
                             const float *B, const sl_weight *Bw, int64_t ldb, float *C, int64_t ldc, int accumulate,
                             float *part, double *acc) {
    int rc = SL_OK;
    for (int64_t i = 0; i < mb; i++)
        for (int64_t j = 0; j < N; j++) acc[i * N + j] = accumulate ? C[(m0 + i) * ldc + j] : 0.0;
    for (int64_t k0 = 0; k0 < K && rc == SL_OK && (rc = sl_check_interrupt()) == SL_OK; k0 += SL_GRAD_K_BLOCK) {
        const int64_t kb = K - k0 < SL_GRAD_K_BLOCK ? K - k0 : SL_GRAD_K_BLOCK;
        const float *a = trans_a ? A + k0 * lda + m0 : A + m0 * lda + k0;
        if (Bw) {
            const sl_weight rows = {Bw->type, (const uint8_t *)Bw->data + k0 * Bw->row_bytes, kb, Bw->cols,
                                    Bw->row_bytes};
            rc = sl_linear_nn(mb, a, lda, &rows, part, N, 0, 1);
        } else {
            rc = sl_sgemm(trans_a, 0, mb, N, kb, a, lda, B + k0 * ldb, ldb, part, N, 0, 1);
        }
        for (int64_t i = 0; i < mb * N && rc == SL_OK; i++) acc[i] += part[i];
    }
    for (int64_t i = 0; i < mb && rc == SL_OK; i++)
        for (int64_t j = 0; j < N; j++) C[(m0 + i) * ldc + j] = (float)acc[i * N + j];
    return rc;
}

/* C (+)= op(A) . B (B stored (K, N); A stored (M, K), or (K, M) with trans_a) for the long K of the
 * LM head's backward (the vocabulary) and of weight gradients over many positions. B is floats, or
 * (Bw != NULL, trans_a == 0) a weight of K rows in its file encoding, whose row blocks go through
 * sl_linear_nn, so a quantized LM head is never decoded whole. K is cut into
 * fixed blocks, each block's product one float chain, the blocks (and C when accumulating) summed
 * in double in order. A single float chain over ~50k terms loses about 1e-4 relative; the blocks
 * depend on K only, so results stay the same for any thread count. Output rows go in chunks
 * (each element's sum is unchanged), with a Ctrl-C check before every block. */
static int sgemm_long_k(int trans_a, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                        const float *B, const sl_weight *Bw, int64_t ldb, float *C, int64_t ldc, int accumulate) {
    if (K <= SL_GRAD_K_BLOCK && !Bw) return sl_sgemm(trans_a, 0, M, N, K, A, lda, B, ldb, C, ldc, accumulate, 1);
    const int64_t mb_max = M < SL_GRAD_M_BLOCK ? M : SL_GRAD_M_BLOCK;
    int64_t n;
    if (!sl_mul_size(mb_max, N, &n)) return sl_fail(SL_ERR_MEMORY, "gradient: size overflow");
    float *part = sl_alloc_floats_uninit(n);
    double *acc = (double *)sl_alloc_floats_uninit(2 * n);
    int rc = part && acc ? SL_OK : sl_fail(SL_ERR_MEMORY, "gradient: cannot allocate %lld floats", (long long)(3 * n));
    for (int64_t m0 = 0; m0 < M && rc == SL_OK; m0 += SL_GRAD_M_BLOCK) {
        const int64_t mb = M - m0 < SL_GRAD_M_BLOCK ? M - m0 : SL_GRAD_M_BLOCK;
        rc = sgemm_long_k_rows(trans_a, m0, mb, N, K, A, lda, B, Bw, ldb, C, ldc, accumulate, part, acc);
    }
    sl_free(part);
    sl_free(acc);
    return rc;
}

/* The bf16 weight gradients of n weights that read the same input X: dW_i (out_i x in) +=
 * bf16(dY_i)^T bf16(X) over `rows` rows, X packed once into panels per K block of SL_GRAD_K_BLOCK
 * rows, each block one fp32 chain (vdpbf16ps's order); one block continues dW's chain, several
 * are summed (with dW) in double in order, as sgemm_long_k. Output rows go in chunks of
 * SL_GRAD_M_BLOCK (each element's sum unchanged). */
static int weight_grads_bf16(int n, float *const *dws, const int64_t *outs, int64_t in, int64_t rows,
                             const float *const *dys, const float *x) {
    const int64_t nb = (rows + SL_GRAD_K_BLOCK - 1) / SL_GRAD_K_BLOCK;
    if (rows <= 0) return SL_OK;
    sl_bf16_panels **px = calloc((size_t)nb, sizeof *px);
    int rc = px ? SL_OK : sl_fail(SL_ERR_MEMORY, "gradient: cannot allocate %lld panel blocks", (long long)nb);
    for (int64_t b = 0; b < nb && rc == SL_OK; b++) {
        const int64_t k0 = b * SL_GRAD_K_BLOCK, kb = rows - k0 < SL_GRAD_K_BLOCK ? rows - k0 : SL_GRAD_K_BLOCK;
        rc = sl_bf16_pack_t(x + k0 * in, kb, in, in, 1, &px[b]);
    }
    float *part = NULL;
    double *acc = NULL;
    int64_t mb_max = 0, cnt = 0;
    for (int w = 0; w < n; w++)
        if (outs[w] > mb_max) mb_max = outs[w] < SL_GRAD_M_BLOCK ? outs[w] : SL_GRAD_M_BLOCK;
    if (rc == SL_OK && nb > 1) {
        if (!sl_mul_size(mb_max, in, &cnt)) rc = sl_fail(SL_ERR_MEMORY, "gradient: size overflow");
        part = rc == SL_OK ? sl_alloc_floats_uninit(cnt) : NULL;
        acc = rc == SL_OK ? (double *)sl_alloc_floats_uninit(2 * cnt) : NULL;
        if (rc == SL_OK && (!part || !acc))
            rc = sl_fail(SL_ERR_MEMORY, "gradient: cannot allocate %lld floats", (long long)(3 * cnt));
    }
    for (int w = 0; w < n && rc == SL_OK; w++) {
        const int64_t out = outs[w];
        float *dw = dws[w];
        const float *dy = dys[w];
        for (int64_t m0 = 0; m0 < out && rc == SL_OK; m0 += SL_GRAD_M_BLOCK) {
            const int64_t mb = out - m0 < SL_GRAD_M_BLOCK ? out - m0 : SL_GRAD_M_BLOCK;
            if (nb == 1) {
                rc = sl_bf16_linear_tn(mb, dy + m0, out, px[0], dw + m0 * in, in, 1, 1, SL_BF16_AUTO);
                continue;
            }
            for (int64_t i = 0; i < mb * in; i++) acc[i] = dw[m0 * in + i];
            for (int64_t b = 0; b < nb && rc == SL_OK && (rc = sl_check_interrupt()) == SL_OK; b++) {
                rc = sl_bf16_linear_tn(mb, dy + b * SL_GRAD_K_BLOCK * out + m0, out, px[b], part, in, 0, 1,
                                       SL_BF16_AUTO);
                for (int64_t i = 0; i < mb * in && rc == SL_OK; i++) acc[i] += part[i];
            }
            for (int64_t i = 0; i < mb * in && rc == SL_OK; i++) dw[m0 * in + i] = (float)acc[i];
        }
    }
    for (int64_t b = 0; px && b < nb; b++) sl_bf16_panels_free(px[b]);
    free(px);
    sl_free(part);
    sl_free(acc);
    return rc;
}

/* dW_i (out_i x in) += dY_i^T X over `rows` rows for n weights reading the same X (n <= 3; a NULL
 * dW_i is skipped): the weights' gradients, at the model's precision (fp32: sgemm_long_k each;
 * bf16: weight_grads_bf16, X packed once). */
static int weight_grads(const sl_model *m, int n, float *const *dws, const int64_t *outs, int64_t in, int64_t rows,
                        const float *const *dys, const float *x) {
    float *dw[3];
    int64_t out[3];
    const float *dy[3];
    int k = 0;
    for (int i = 0; i < n && i < 3; i++)
        if (dws[i]) dw[k] = dws[i], out[k] = outs[i], dy[k] = dys[i], k++;
    if (m->precision == SL_PREC_BF16) return weight_grads_bf16(k, dw, out, in, rows, dy, x);
    for (int i = 0; i < k; i++) SL_TRY(sgemm_long_k(1, out[i], in, rows, dy[i], out[i], x, NULL, in, dw[i], in, 1));
    return SL_OK;
}

/* dW (out x in) += dY^T X over `rows` rows: one weight's gradient (weight_grads). */
static int weight_grad(const sl_model *m, float *dw, int64_t out, int64_t in, int64_t rows, const float *dy,
                       const float *x) {
    return weight_grads(m, 1, &dw, &out, in, rows, &dy, x);
}

/* dx (rows, w->cols) (+)= dy (rows, w->rows) · W, W being layer l's product `which` (l < 0: the
 * LM head), at the model's precision: fp32 sl_linear_nn, bf16 sl_model_product_nn_bf16. */
static int product_nn(const sl_model *m, int64_t l, int which, int64_t rows, const float *dy, const sl_weight *w,
                      float *dx, int accumulate) {
    if (m->precision == SL_PREC_BF16)
        return sl_model_product_nn_bf16(m, sl_model_slot(m, l, which), rows, dy, w->rows, w, dx, w->cols, accumulate);
    return sl_linear_nn(rows, dy, w->rows, w, dx, w->cols, accumulate, 1);
}

/* ------------------------------------------------------------------------------------------
 * Reverse mode. g->dx holds the gradient w.r.t. the layer's output on entry and w.r.t. its input
 * (resid[l]) on exit. Parameter gradients (lg, B == 1 only) use the tape's inputs of each product. */

/* The end of a block backwards, on `rows` rows of directions: dx holds the gradient w.r.t. the
 * block's output (after its residual norm) and receives the gradient w.r.t. the residual sum's
 * stream input; returns where the gradient w.r.t. the block's own product output (before its
 * post-norm) lies: dx itself, or dxn when a post-norm sits in between. Norm parameter gradients
 * go to the four buffers (NULL: not asked). */
static float *block_output_backward(const sl_model *m, const sl_norm *post, const sl_norm *res, float *dx,
                                    float *dxn, int64_t rows, int64_t T, const float *p_in, const float *p_mean,
                                    const float *p_rstd, const float *r_in, const float *r_mean,
                                    const float *r_rstd, float *dpw, float *dpb, float *drw, float *drb) {
    const int64_t d = m->d_model;
    if (res->w) { /* post-LN: both the stream and the block output see the norm's backward */
        norm_backward(m, res, dxn, 0, drw, drb, dx, r_in, r_mean, r_rstd, rows, T, d);
        memcpy(dx, dxn, (size_t)(rows * d) * sizeof(float));
    }
    if (!post->w) return dx;
    norm_backward(m, post, dxn, 0, dpw, dpb, dx, p_in, p_mean, p_rstd, rows, T, d);
    return dxn;
}

/* ------------------------------------------------------------------------------------------
 * Patches (patch.h) in the derivatives: a "replace" patch makes its entries constants, so no
 * derivative flows through them (the cotangent into them, or their tangent, is zero there); an
 * "add" patch adds a constant and changes no derivative. The forward's tape already holds the
 * patched values. */

static int replaces(const sl_intervention *iv, int point, int64_t l) {
    for (int64_t i = 0; iv && iv->patch && i < iv->patch->n; i++) {
        const sl_patch *p = &iv->patch->p[i];
        if (p->point == point && p->layer == l && p->mode == SL_PATCH_REPLACE) return 1;
    }
    return 0;
}

/* Zeroes the entries layer l's replace patches of `point` cover, in each of nb directions'
 * (T, stride) block of buf (heads of `width` floats; the stream points have one). */
static void cut_patched(const sl_intervention *iv, int point, int64_t l, float *buf, int64_t nb, int64_t T,
                        int64_t stride, int64_t width) {
    for (int64_t i = 0; iv && iv->patch && i < iv->patch->n; i++) {
        const sl_patch *p = &iv->patch->p[i];
        if (p->point != point || p->layer != l || p->mode != SL_PATCH_REPLACE) continue;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t j = 0; j < p->n_heads; j++)
                for (int64_t k = 0; k < p->n_pos; k++) {
                    const int64_t h = p->heads ? p->heads[j] : 0;
                    memset(buf + (b * T + p->pos[k]) * stride + h * width, 0, (size_t)width * sizeof(float));
                }
    }
}

/* What the derivatives cannot take: a replaced attn_out / mlp_out under a post-LN residual norm. */
static int check_grad_patches(const sl_model *m, const sl_intervention *iv) {
    for (int64_t i = 0; iv && iv->patch && i < iv->patch->n; i++) {
        const sl_patch *p = &iv->patch->p[i];
        if ((p->point == SL_PATCH_ATTN_OUT || p->point == SL_PATCH_MLP_OUT) && p->mode == SL_PATCH_REPLACE &&
            (m->layers[0].attn_res_norm.w || m->layers[0].ffn_res_norm.w))
            return sl_fail(SL_ERR_VALUE, "patch %lld: the derivatives of a post-LN model do not take replaced "
                                         "attn_out / mlp_out", (long long)i);
    }
    return SL_OK;
}

/* The cotangent of a block's product output (before its post-norm) when the block's output
 * (after the post-norm: attn_out / mlp_out) is replaced at some entries: dx with those entries
 * zeroed (in `cut`, rows x d), through the post-norm's backward into dxn when there is one.
 * Without a residual norm (check_grad_patches) dx itself is the cotangent of the block's output. */
static const float *cut_block_output(const sl_model *m, const sl_norm *post, const sl_intervention *iv, int point,
                                     int64_t l, const float *dx, float *dxn, float *cut, int64_t nb, int64_t T,
                                     const float *p_in, const float *p_mean, const float *p_rstd) {
    const int64_t d = m->d_model, rows = nb * T;
    memcpy(cut, dx, (size_t)(rows * d) * sizeof(float));
    cut_patched(iv, point, l, cut, nb, T, d, d);
    if (!post->w) return cut;
    norm_backward(m, post, dxn, 0, NULL, NULL, cut, p_in, p_mean, p_rstd, rows, T, d);
    return dxn;
}

/* cut: NULL, or scratch for chunk*T rows when mlp_out is replaced (cut_block_output). */
/* Pattern patches of layer l in the derivatives. A patched query row t of head h computes
 * z[t, h] = c_h · P'[t, :] · V_g (replace) or z[t, h] = c_h · (P[t, :] + ΔP[t, :]) · V_g (add), c_h
 * its head_scale, over the keys s < T of the one sequence (direction b's rows start at b*T). */

/* Entries (direction, patched row, head) of layer l's pattern patches, each hd floats of `saved`. */
static int64_t pattern_entries(const sl_intervention *iv, int64_t l) {
    int64_t n = 0;
    for (int64_t i = 0; iv && iv->patch && i < iv->patch->n; i++) {
        const sl_patch *p = &iv->patch->p[i];
        if (p->point == SL_PATCH_PATTERN && p->layer == l) n += p->n_heads * p->n_pos;
    }
    return n;
}

/* Runs BODY for every (patch p, head j, position k) of layer l's pattern patches, with h, its kv
 * head g, the position t, its head_scale c and e the running entry number. */
#define FOR_PATTERN_ENTRY(iv, aiv, l, H, group, BODY)                                                    \
    do {                                                                                             \
        int64_t e_ = 0;                                                                              \
        for (int64_t i_ = 0; (iv) && (iv)->patch && i_ < (iv)->patch->n; i_++) {                     \
            const sl_patch *p = &(iv)->patch->p[i_];                                                 \
            if (p->point != SL_PATCH_PATTERN || p->layer != (l)) continue;                           \
            for (int64_t j = 0; j < p->n_heads; j++)                                                 \
                for (int64_t k = 0; k < p->n_pos; k++, e_++) {                                        \
                    const int64_t h = p->heads[j], g = h / (group), t = p->pos[k], e = e_;           \
                    const float c = (aiv)->head_scale ? (aiv)->head_scale[h] : 1.0f;                 \
                    (void)g, (void)c, (void)e, (void)t;                                              \
                    BODY                                                                             \
                }                                                                                    \
        }                                                                                            \
    } while (0)

/* Reverse mode, before the attention's backward: each patched row's cotangent dz[t, h] copied
 * to saved (n_entries x nb x hd) and, for a replaced row, taken out of dz (its softmax does not
 * reach z). */
static void pattern_take(const sl_model *m, const sl_intervention *iv, const sl_attn_intervention *aiv, int64_t l,
                         float *dz, float *saved, int64_t nb, int64_t T) {
    const int64_t H = m->n_heads, hd = m->head_dim, qd = H * hd, group = H / m->n_kv_heads;
    FOR_PATTERN_ENTRY(iv, aiv, l, H, group, {
        for (int64_t b = 0; b < nb; b++) {
            float *zt = dz + (b * T + t) * qd + h * hd;
            memcpy(saved + (e * nb + b) * hd, zt, (size_t)hd * sizeof(float));
            if (p->mode == SL_PATCH_REPLACE) memset(zt, 0, (size_t)hd * sizeof(float));
        }
    });
}

/* Reverse mode, after it: dV_g[s] += c_h · P'[t, s] · dz[t, h] (replace; ΔP for add). */
static void pattern_give(const sl_model *m, const sl_intervention *iv, const sl_attn_intervention *aiv, int64_t l,
                         float *dv, const float *saved, int64_t nb, int64_t T) {
    const int64_t H = m->n_heads, hd = m->head_dim, kvd = m->n_kv_heads * hd, group = H / m->n_kv_heads;
    FOR_PATTERN_ENTRY(iv, aiv, l, H, group, {
        const float *pv = sl_patch_entry(p, 0, j, k, T);
        for (int64_t b = 0; b < nb; b++) {
            const float *dzt = saved + (e * nb + b) * hd;
            for (int64_t s = 0; s < T; s++) {
                const float w = c * pv[s];
                float *vs = dv + (b * T + s) * kvd + g * hd;
                for (int64_t q = 0; q < hd && w != 0.0f; q++) vs[q] += w * dzt[q];
            }
        }
    });
}

/* Forward mode, after the attention's JVP: a replaced row's tangent is c_h · P' · tV, an added
 * one gains c_h · ΔP · tV. */
static void pattern_jvp(const sl_model *m, const sl_intervention *iv, const sl_attn_intervention *aiv, int64_t l,
                        float *tz, const float *tv, int64_t nb, int64_t T) {
    const int64_t H = m->n_heads, hd = m->head_dim, qd = H * hd, kvd = m->n_kv_heads * hd, group = H / m->n_kv_heads;
    FOR_PATTERN_ENTRY(iv, aiv, l, H, group, {
        const float *pv = sl_patch_entry(p, 0, j, k, T);
        for (int64_t b = 0; b < nb; b++) {
            float *zt = tz + (b * T + t) * qd + h * hd;
            if (p->mode == SL_PATCH_REPLACE) memset(zt, 0, (size_t)hd * sizeof(float));
            for (int64_t s = 0; s < T; s++) {
                const float w = c * pv[s];
                const float *vs = tv + (b * T + s) * kvd + g * hd;
                for (int64_t q = 0; q < hd && w != 0.0f; q++) zt[q] += w * vs[q];
            }
        }
    });
}
#undef FOR_PATTERN_ENTRY

static int mlp_backward_cut(const sl_model *m, int64_t l, const sl_layer_weights *lw, const sl_layer_tape *lt,
                            grad_bufs *g, sl_layer_grads *lg, const sl_intervention *iv, float *cut) {
    const int64_t T = g->T, d = m->d_model, F = m->d_ff;
    const int gated = lw->w_gate.data != NULL;
    const float *gate = gated ? lt->gate : NULL;
    if (lg) sl_mlp_act(m->act, g->act, gate, lt->up, T * F);
    sl_mlp_act_partials(m->act, gated ? g->dh_dg : NULL, g->dh_du, gate, lt->up, T * F);
    for (int64_t b0 = 0; b0 < g->B; b0 += g->chunk) {
        const int64_t nb = g->B - b0 < g->chunk ? g->B - b0 : g->chunk, rows = nb * T;
        float *dx = g->dx + b0 * T * d, *dxn = g->dxn + b0 * T * d;
        const float *dm = cut ? cut_block_output(m, &lw->ffn_post_norm, iv, SL_PATCH_MLP_OUT, l, dx, dxn, cut, nb, T,
                                                 lt->mo, lt->mo_mean, lt->mo_rstd)
                              : block_output_backward(
            m, &lw->ffn_post_norm, &lw->ffn_res_norm, dx, dxn, rows, T, lt->mo, lt->mo_mean, lt->mo_rstd, lt->yr,
            lt->yr_mean, lt->yr_rstd, lg ? lg->ffn_post_norm : NULL, lg ? lg->ffn_post_norm_b : NULL,
            lg ? lg->ffn_res_norm : NULL, lg ? lg->ffn_res_norm_b : NULL);
        /* Ctrl-C checks between the products: with many directions (B * T rows) each is long */
        SL_TRY(sl_check_interrupt());
        SL_TRY(product_nn(m, l, SL_SLOT_DOWN, rows, dm, &lw->w_down, g->dact, 0));
        if (lg) SL_TRY(weight_grad(m, lg->w_down, d, F, rows, dm, g->act));
        if (lg && lg->b_down) sl_bias_backward(lg->b_down, dm, rows, d, d);
        sl_swiglu_backward(gated ? g->dg : NULL, g->du, g->dact, gated ? g->dh_dg : NULL, g->dh_du, rows * F, T * F);
        SL_TRY(sl_check_interrupt());
        if (gated) SL_TRY(product_nn(m, l, SL_SLOT_GATE, rows, g->dg, &lw->w_gate, dxn, 0));
        SL_TRY(sl_check_interrupt());
        SL_TRY(product_nn(m, l, SL_SLOT_UP, rows, g->du, &lw->w_up, dxn, gated));
        if (lg) {
            float *const dws[] = {gated ? lg->w_gate : NULL, lg->w_up};
            const int64_t outs[] = {F, F};
            const float *const dys[] = {g->dg, g->du};
            SL_TRY(weight_grads(m, 2, dws, outs, d, rows, dys, lt->xn2));
            if (lg->b_gate) sl_bias_backward(lg->b_gate, g->dg, rows, F, F);
            if (lg->b_up) sl_bias_backward(lg->b_up, g->du, rows, F, F);
        }
        /* The residual path: d/dh = dy + n2's backward of dxn. */
        if (lw->ffn_norm.w)
            norm_backward(m, &lw->ffn_norm, dx, 1, lg ? lg->ffn_norm : NULL, lg ? lg->ffn_norm_b : NULL, dxn, lt->h,
                          lt->mean2, lt->rstd2, rows, T, d);
        else
            sl_add_inplace(dx, dxn, rows * d);
    }
    return SL_OK;
}

static int mlp_backward(const sl_model *m, int64_t l, const sl_layer_weights *lw, const sl_layer_tape *lt,
                        grad_bufs *g, sl_layer_grads *lg, const sl_intervention *iv) {
    float *cut = NULL;
    if (replaces(iv, SL_PATCH_MLP_OUT, l) && !(cut = sl_alloc_floats_uninit(g->chunk * g->T * m->d_model)))
        return sl_fail(SL_ERR_MEMORY, "vjp: cannot allocate a patch cotangent");
    const int rc = mlp_backward_cut(m, l, lw, lt, g, lg, iv, cut);
    sl_free(cut);
    return rc;
}

static int attention_backward_cut(const sl_model *m, int64_t l, const sl_layer_weights *lw, const sl_layer_tape *lt,
                                  grad_bufs *g, const sl_attn_intervention *aiv, sl_layer_grads *lg,
                                  const sl_intervention *iv, float *cut, float *saved) {
    const int64_t T = g->T, rows = g->B * T, d = m->d_model, hd = m->head_dim;
    const int64_t H = m->n_heads, G = m->n_kv_heads, qd = H * m->head_dim, kvd = G * m->head_dim;
    const sl_attn_shape s = attn_shape(m, lw, T);
    rope_tables_for(m, lw, g);
    const float *dout = cut ? cut_block_output(m, &lw->attn_post_norm, iv, SL_PATCH_ATTN_OUT, l, g->dx, g->dxn, cut,
                                               g->B, T, lt->o, lt->o_mean, lt->o_rstd)
                            : block_output_backward(
        m, &lw->attn_post_norm, &lw->attn_res_norm, g->dx, g->dxn, rows, T, lt->o, lt->o_mean, lt->o_rstd, lt->hr,
        lt->hr_mean, lt->hr_rstd, lg ? lg->attn_post_norm : NULL, lg ? lg->attn_post_norm_b : NULL,
        lg ? lg->attn_res_norm : NULL, lg ? lg->attn_res_norm_b : NULL);
    SL_TRY(sl_check_interrupt()); /* between the products, as in mlp_backward */
    SL_TRY(product_nn(m, l, SL_SLOT_O, rows, dout, &lw->wo, g->dz, 0));
    if (lg) SL_TRY(weight_grad(m, lg->wo, d, qd, rows, dout, lt->z));
    if (lg && lg->bo) sl_bias_backward(lg->bo, dout, rows, d, d);
    /* a replaced head output or z is a constant: nothing flows into that head's z there */
    cut_patched(iv, SL_PATCH_HEAD_OUT, l, g->dz, g->B, T, qd, hd);
    cut_patched(iv, SL_PATCH_Z, l, g->dz, g->B, T, qd, hd);
    /* gated attention: dz' -> dz (before the gate) in place, and the gate pre-activation's dag */
    if (lw->attn_gate.data) sl_attn_gate_backward(g->dz, g->dag, g->dz, lt->za, lt->ag, rows * qd, T * qd);
    SL_TRY(sl_attention_probs(&s, lt->q, lt->k, g->probs, aiv));
    if (saved) pattern_take(m, iv, aiv, l, g->dz, saved, g->B, T);
    float *dsinks = lg && lg->attn_sinks ? g->dsinks : NULL; /* parameter gradients: B == 1 */
    SL_TRY(sl_attention_backward_sink(&s, g->B, lt->q, lt->k, lt->v, g->probs, g->dz, g->dq, g->dk, g->dv, g->pk,
                                      g->pv, aiv, dsinks));
    if (dsinks)
        for (int64_t h = 0; h < H; h++) lg->attn_sinks[h] += dsinks[h];
    if (saved) pattern_give(m, iv, aiv, l, g->dv, saved, g->B, T);
    cut_patched(iv, SL_PATCH_Q, l, g->dq, g->B, T, qd, hd);
    cut_patched(iv, SL_PATCH_K, l, g->dk, g->B, T, kvd, hd);
    cut_patched(iv, SL_PATCH_V, l, g->dv, g->B, T, kvd, hd);
    rope_rows(m, lw, g, g->dq, qd, H, 1);
    rope_rows(m, lw, g, g->dk, kvd, G, 1);
    qk_norm(m, g, g->dq, lw->attn_q_norm, lg ? lg->attn_q_norm : NULL, lt->qr, lt->q_rstd, H, 1);
    qk_norm(m, g, g->dk, lw->attn_k_norm, lg ? lg->attn_k_norm : NULL, lt->kr, lt->k_rstd, G, 1);
    SL_TRY(sl_check_interrupt());
    SL_TRY(product_nn(m, l, SL_SLOT_Q, rows, g->dq, &lw->wq, g->dxn, 0));
    SL_TRY(sl_check_interrupt());
    SL_TRY(product_nn(m, l, SL_SLOT_K, rows, g->dk, &lw->wk, g->dxn, 1));
    SL_TRY(product_nn(m, l, SL_SLOT_V, rows, g->dv, &lw->wv, g->dxn, 1));
    if (lw->attn_gate.data) SL_TRY(product_nn(m, l, SL_SLOT_AGATE, rows, g->dag, &lw->attn_gate, g->dxn, 1));
    if (lg && lg->attn_gate) SL_TRY(weight_grad(m, lg->attn_gate, qd, d, rows, g->dag, lt->xn1));
    if (lg) {
        float *const dws[] = {lg->wq, lg->wk, lg->wv};
        const int64_t outs[] = {qd, kvd, kvd};
        const float *const dys[] = {g->dq, g->dk, g->dv};
        SL_TRY(weight_grads(m, 3, dws, outs, d, rows, dys, lt->xn1));
        if (lg->bq) sl_bias_backward(lg->bq, g->dq, rows, qd, qd);
        if (lg->bk) sl_bias_backward(lg->bk, g->dk, rows, kvd, kvd);
        if (lg->bv) sl_bias_backward(lg->bv, g->dv, rows, kvd, kvd);
    }
    if (lw->attn_norm.w)
        norm_backward(m, &lw->attn_norm, g->dx, 1, lg ? lg->attn_norm : NULL, lg ? lg->attn_norm_b : NULL, g->dxn,
                      lt->x, lt->mean1, lt->rstd1, rows, T, d);
    else
        sl_add_inplace(g->dx, g->dxn, rows * d);
    return SL_OK;
}

static int attention_backward(const sl_model *m, int64_t l, const sl_layer_weights *lw, const sl_layer_tape *lt,
                              grad_bufs *g, const sl_attn_intervention *aiv, sl_layer_grads *lg,
                              const sl_intervention *iv) {
    float *cut = NULL, *saved = NULL;
    const int64_t n_pat = pattern_entries(iv, l);
    if ((replaces(iv, SL_PATCH_ATTN_OUT, l) && !(cut = sl_alloc_floats_uninit(g->B * g->T * m->d_model))) ||
        (n_pat && !(saved = sl_alloc_floats_uninit(n_pat * g->B * m->head_dim)))) {
        sl_free(cut);
        return sl_fail(SL_ERR_MEMORY, "vjp: cannot allocate a patch cotangent");
    }
    const int rc = attention_backward_cut(m, l, lw, lt, g, aiv, lg, iv, cut, saved);
    sl_free(cut);
    sl_free(saved);
    return rc;
}

static int layer_backward(const sl_model *m, const sl_intervention *iv, int64_t l, grad_bufs *g,
                          sl_layer_grads *lg) {
    sl_attn_intervention aiv;
    sl_layer_intervention(m, iv, l, &aiv);
    SL_TRY(mlp_backward(m, l, &m->layers[l], &g->tapes[l], g, lg, iv));
    return attention_backward(m, l, &m->layers[l], &g->tapes[l], g, &aiv, lg, iv);
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
    if (at < 0 || at > m->n_layers)
        return sl_fail(SL_ERR_VALUE, "%s: layer %lld outside [0, %lld]", what, (long long)at, (long long)m->n_layers);
    if (B < 1 || !dirs) return sl_fail(SL_ERR_VALUE, "%s: need at least one direction", what);
    return SL_OK;
}

int sl_model_vjp(const sl_model *m, const int64_t *ids, int64_t T, const sl_intervention *iv, int64_t at,
                 int64_t B, const float *cot, sl_vjp_out *out) {
    SL_TRY(check_directions(m, at, B, cot, "vjp"));
    SL_TRY(check_grad_patches(m, iv));
    if (out) out->spectral_iters = 0;
    const int64_t low = lowest_requested(out, at), d = m->d_model;
    grad_bufs g;
    SL_TRY(grad_bufs_alloc(&g, m, T > 0 ? T : 1, B, at, 0, 0));
    int rc = sl_model_forward_tape(m, ids, T, at, g.tapes, iv, NULL, NULL);
    if (rc == SL_OK) {
        memcpy(g.dx, cot, (size_t)(B * T * d) * sizeof(float));
        rc = record_layer(out, at, &g, d);
    }
    /* dresid[l] is the gradient w.r.t. the (patched) stream; what lies below a replaced entry gets none */
    if (rc == SL_OK) cut_patched(iv, SL_PATCH_RESID, at, g.dx, B, T, d, d);
    for (int64_t l = at - 1; l >= low && rc == SL_OK && (rc = sl_check_interrupt()) == SL_OK; l--) {
        rc = layer_backward(m, iv, l, &g, NULL);
        if (rc == SL_OK) rc = record_layer(out, l, &g, d);
        if (rc == SL_OK) cut_patched(iv, SL_PATCH_RESID, l, g.dx, B, T, d, d);
    }
    grad_bufs_free(&g);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The language-model loss. */

/* Positions with a target (targets[t] >= 0); an error for a target outside the vocabulary. */
static int count_targets(const int64_t *targets, int64_t T, int64_t V, int64_t *n) {
    *n = 0;
    for (int64_t t = 0; t < T; t++) {
        if (targets[t] >= V)
            return sl_fail(SL_ERR_VALUE, "loss: target %lld at position %lld is outside [0, %lld)",
                           (long long)targets[t], (long long)t, (long long)V);
        *n += targets[t] >= 0;
    }
    return SL_OK;
}

/* Cross-entropy of each row with a target, summed into *loss_sum (nats); dlogits (in place of
 * the logits) = (softmax - onehot) / denom for those rows, zero for the others. Rows in
 * parallel, each row's loss kept and the losses summed in position order (in double), so the
 * sum is the same for any thread count. */
static int cross_entropy(float *logits, const int64_t *targets, int64_t T, int64_t V, double denom,
                         double *loss_sum) {
    double *row_loss = (double *)sl_alloc_floats(2 * T);
    if (!row_loss) return sl_fail(SL_ERR_MEMORY, "loss: cannot allocate %lld doubles", (long long)T);
    const float inv = (float)(1.0 / denom);
#pragma omp parallel for schedule(static) num_threads(sl_num_threads())
    for (int64_t t = 0; t < T; t++) {
        float *row = logits + t * V;
        row_loss[t] = 0.0;
        if (targets[t] < 0) {
            memset(row, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float x_target = row[targets[t]];
        row_loss[t] = sl_softmax_lse(row, V) - (double)x_target;
        for (int64_t i = 0; i < V; i++) row[i] *= inv;
        row[targets[t]] -= inv;
    }
    double total = 0.0;
    for (int64_t t = 0; t < T; t++) total += row_loss[t];
    sl_free(row_loss);
    *loss_sum += total;
    return SL_OK;
}

/* The parameter gradient buffers pg must hold for m (one per tensor of the schema the model
 * has): an error naming the first one missing. */
static int check_grads(const sl_model *m, const sl_model_grads *pg) {
    if (!pg || !pg->tok_embd || !pg->lm_head || !pg->layers)
        return sl_fail(SL_ERR_VALUE, "loss: the gradient buffers of tok_embd, lm_head and the layers are needed");
#define GLOBAL(grad, key, kind, weight, rows, cols, required, role) \
    if (SL_HAS_##kind(m->weight) && !pg->grad) return sl_fail(SL_ERR_VALUE, "loss: no gradient buffer for %s", key);
    SL_GLOBAL_TENSORS(GLOBAL)
#undef GLOBAL
    for (int64_t l = 0; l < m->n_layers; l++) {
        const sl_layer_weights *lw = &m->layers[l];
        const sl_layer_grads *lg = &pg->layers[l];
#define LAYER(grad, key, kind, weight, rows, cols, required, role)                                        \
    if (SL_HAS_##kind(lw->weight) && !lg->grad)                                                           \
        return sl_fail(SL_ERR_VALUE, "loss: layer %lld lacks a gradient buffer for %s", (long long)l, key);
        SL_LAYER_TENSORS(LAYER)
#undef LAYER
    }
    return SL_OK;
}

/* The embedding's backward from dx = the gradient w.r.t. resid[0] (overwritten), with tmp (T, d)
 * scratch: embd_norm's backward, then pos_embd's rows 0..T-1, type_embd's sum over positions and
 * tok_embd's rows (times embd_scale). */
static void embed_backward(const sl_model *m, const sl_model_grads *pg, const int64_t *ids, int64_t T, float *dx,
                           float *tmp, const sl_embd_tape *et) {
    const int64_t d = m->d_model;
    float *de = dx;
    if (m->embd_norm.w) {
        norm_backward(m, &m->embd_norm, tmp, 0, pg->embd_norm, pg->embd_norm_b, dx, et->in, et->mean, et->rstd, T, T,
                      d);
        de = tmp;
    }
    if (m->pos_embd) sl_add_inplace(pg->pos_embd, de, T * d);
    if (m->type_embd) sl_bias_backward(pg->type_embd, de, T, d, d);
    if (m->embd_scale != 1.0f)
        for (int64_t i = 0; i < T * d; i++) de[i] *= m->embd_scale;
    sl_embed_backward(pg->tok_embd, de, ids, T, d);
}

int sl_model_loss_grad(const sl_model *m, const int64_t *ids, const int64_t *targets, int64_t T,
                       const sl_intervention *iv, double *loss, const sl_model_grads *pg) {
    int64_t n;
    SL_TRY(count_targets(targets, T, m->vocab_size, &n));
    if (n == 0) return sl_fail(SL_ERR_VALUE, "loss: no position has a target (all are negative)");
    double sum = 0.0;
    SL_TRY(sl_model_loss_grad_sum(m, ids, targets, T, iv, (double)n, &sum, pg));
    *loss = sum / (double)n;
    return SL_OK;
}

int sl_model_loss_grad_sum(const sl_model *m, const int64_t *ids, const int64_t *targets, int64_t T,
                           const sl_intervention *iv, double denom, double *loss_sum, const sl_model_grads *pg) {
    SL_TRY(sl_model_check(m));
    SL_TRY(check_grads(m, pg));
    if (!m->lm_head.data) return sl_fail(SL_ERR_VALUE, "loss: the model has no LM head");
    int64_t n_targets;
    SL_TRY(count_targets(targets, T, m->vocab_size, &n_targets));
    if (!(denom > 0.0)) return sl_fail(SL_ERR_VALUE, "loss: the normaliser must be > 0, got %g", denom);
    const int64_t d = m->d_model, V = m->vocab_size, L = m->n_layers;
    const float cap = m->final_softcap;
    const int en = m->embd_norm.w != NULL;
    grad_bufs g;
    SL_TRY(grad_bufs_alloc(&g, m, T > 0 ? T : 1, 1, L, 1, 0));
    int64_t n_logits = 0, n_x = 0;
    int ok = sl_mul_size(T, d, &n_x) && sl_mul_size(T, V, &n_logits);
    /* xf, logits and capped are written whole before they are read: not zeroed, since zeroing
     * T x V floats (1.6 GB at T = 8192) takes most of a second with no Ctrl-C check */
    float *xf = ok ? sl_alloc_floats_uninit(n_x) : NULL, *mean = sl_alloc_floats(T), *rstd = sl_alloc_floats(T);
    float *logits = ok ? sl_alloc_floats_uninit(n_logits) : NULL;
    float *capped = ok && cap > 0.0f ? sl_alloc_floats_uninit(n_logits) : NULL; /* the soft-capped logits */
    sl_embd_tape et = {en && ok ? sl_alloc_floats(n_x) : NULL, en ? sl_alloc_floats(T) : NULL,
                       en ? sl_alloc_floats(T) : NULL};
    int rc = (!xf || !mean || !rstd || !logits || (cap > 0.0f && !capped) || (en && (!et.in || !et.mean || !et.rstd)))
                 ? sl_fail(SL_ERR_MEMORY, "loss: cannot allocate the logits (%lld x %lld)", (long long)T, (long long)V)
                 : sl_model_forward_tape(m, ids, T, L, g.tapes, iv, g.dx, en ? &et : NULL);
    if (rc == SL_OK) {
        /* dx holds resid[L]; xf its final norm; the logits become their gradient in place. */
        if (m->out_norm.w && m->norm_kind == SL_NORM_LAYER)
            sl_layernorm(xf, mean, rstd, g.dx, m->out_norm.w, m->out_norm.b, T, d, m->norm_eps);
        else if (m->out_norm.w)
            sl_rmsnorm(xf, rstd, g.dx, m->out_norm.w, T, d, m->norm_eps);
        else
            memcpy(xf, g.dx, (size_t)(T * d) * sizeof(float));
        /* in row chunks with Ctrl-C checks between them (rows are independent: the same bits) */
        for (int64_t r0 = 0; r0 < T && rc == SL_OK; r0 += SL_HEAD_ROWS) {
            const int64_t n = T - r0 < SL_HEAD_ROWS ? T - r0 : SL_HEAD_ROWS;
            rc = sl_check_interrupt();
            if (rc == SL_OK && m->precision == SL_PREC_BF16)
                rc = sl_model_product_nt(m, sl_model_slot(m, -1, 0), n, xf + r0 * d, d, &m->lm_head, logits + r0 * V, V);
            else if (rc == SL_OK)
                rc = sl_linear_nt(n, xf + r0 * d, d, &m->lm_head, logits + r0 * V, V, 0, 1);
        }
    }
    if (rc == SL_OK && capped) {
        sl_softcap(logits, T * V, cap);
        memcpy(capped, logits, (size_t)(T * V) * sizeof(float));
    }
    if (rc == SL_OK) rc = cross_entropy(logits, targets, T, V, denom, loss_sum);
    if (rc == SL_OK && capped) sl_softcap_backward(logits, logits, capped, T * V, cap);
    if (rc == SL_OK) rc = sl_check_interrupt();
    if (rc == SL_OK) rc = weight_grad(m, pg->lm_head, V, d, T, logits, xf);
    if (rc == SL_OK) rc = sl_check_interrupt();
    if (rc == SL_OK && m->precision == SL_PREC_BF16) {
        rc = sl_model_product_nn_bf16(m, sl_model_slot(m, -1, 0), T, logits, V, &m->lm_head, g.dxn, d, 0);
    } else if (rc == SL_OK) {
        const int f32 = m->lm_head.type == SL_GGML_F32;
        rc = sgemm_long_k(0, T, d, V, logits, V, f32 ? (const float *)m->lm_head.data : NULL,
                          f32 ? NULL : &m->lm_head, d, g.dxn, d, 0);
    }
    if (rc == SL_OK && m->out_norm.w) {
        memcpy(xf, g.dx, (size_t)(T * d) * sizeof(float)); /* resid[L], the final norm's input */
        norm_backward(m, &m->out_norm, g.dx, 0, pg->out_norm, pg->out_norm_b, g.dxn, xf, mean, rstd, T, T, d);
    } else if (rc == SL_OK) {
        memcpy(g.dx, g.dxn, (size_t)(T * d) * sizeof(float));
    }
    for (int64_t l = L - 1; l >= 0 && rc == SL_OK && (rc = sl_check_interrupt()) == SL_OK; l--)
        rc = layer_backward(m, iv, l, &g, &pg->layers[l]);
    if (rc == SL_OK) embed_backward(m, pg, ids, T, g.dx, g.dxn, &et);
    float *owned[] = {xf, mean, rstd, logits, capped, et.in, et.mean, et.rstd};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) sl_free(owned[i]);
    grad_bufs_free(&g);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Forward mode. g->dx holds the tangent of the layer's input on entry and of its output on exit;
 * each addition to the stream is formed on its own first, then added, as in the forward. */

/* The end of a block forwards: dout (rows, d) the tangent of the block's product output;
 * dx += post_norm'(dout), then dx = res_norm'(dx), through the scratch ds. */
static void block_output_jvp(const sl_model *m, const sl_norm *post, const sl_norm *res, float *dx, float *dout,
                             float *ds, int64_t rows, int64_t T, const float *p_in, const float *p_mean,
                             const float *p_rstd, const float *r_in, const float *r_mean, const float *r_rstd,
                             const sl_intervention *iv, int point, int64_t l) {
    const int64_t d = m->d_model;
    if (post->w) {
        norm_jvp(m, post, ds, dout, p_in, p_mean, p_rstd, rows, T, d);
        dout = ds;
    }
    cut_patched(iv, point, l, dout, rows / T, T, d, d); /* a replaced block output has no tangent */
    sl_add_inplace(dx, dout, rows * d);
    if (res->w) {
        norm_jvp(m, res, ds, dx, r_in, r_mean, r_rstd, rows, T, d);
        memcpy(dx, ds, (size_t)(rows * d) * sizeof(float));
    }
}

static int attention_jvp(const sl_model *m, int64_t l, const sl_layer_weights *lw, const sl_layer_tape *lt,
                         grad_bufs *g, const sl_attn_intervention *aiv, const sl_intervention *iv) {
    const int64_t T = g->T, rows = g->B * T, d = m->d_model, hd = m->head_dim;
    const int64_t H = m->n_heads, G = m->n_kv_heads, qd = H * m->head_dim, kvd = G * m->head_dim;
    const sl_attn_shape s = attn_shape(m, lw, T);
    rope_tables_for(m, lw, g);
    const float *a = g->dx;
    if (lw->attn_norm.w) {
        norm_jvp(m, &lw->attn_norm, g->dxn, g->dx, lt->x, lt->mean1, lt->rstd1, rows, T, d);
        a = g->dxn;
    }
    SL_TRY(sl_linear_nt(rows, a, d, &lw->wq, g->dq, qd, 0, 1));
    SL_TRY(sl_linear_nt(rows, a, d, &lw->wk, g->dk, kvd, 0, 1));
    SL_TRY(sl_linear_nt(rows, a, d, &lw->wv, g->dv, kvd, 0, 1));
    if (lw->attn_gate.data) SL_TRY(sl_linear_nt(rows, a, d, &lw->attn_gate, g->dag, qd, 0, 1));
    qk_norm(m, g, g->dq, lw->attn_q_norm, NULL, lt->qr, lt->q_rstd, H, 0);
    qk_norm(m, g, g->dk, lw->attn_k_norm, NULL, lt->kr, lt->k_rstd, G, 0);
    rope_rows(m, lw, g, g->dq, qd, H, 0);
    rope_rows(m, lw, g, g->dk, kvd, G, 0);
    cut_patched(iv, SL_PATCH_Q, l, g->dq, g->B, T, qd, hd);
    cut_patched(iv, SL_PATCH_K, l, g->dk, g->B, T, kvd, hd);
    cut_patched(iv, SL_PATCH_V, l, g->dv, g->B, T, kvd, hd);
    SL_TRY(sl_attention_probs(&s, lt->q, lt->k, g->probs, aiv));
    SL_TRY(sl_attention_jvp(&s, g->B, lt->q, lt->k, lt->v, g->probs, g->dq, g->dk, g->dv, g->dz, aiv));
    pattern_jvp(m, iv, aiv, l, g->dz, g->dv, g->B, T);
    if (lw->attn_gate.data) sl_attn_gate_jvp(g->dz, g->dz, g->dag, lt->za, lt->ag, rows * qd, T * qd);
    cut_patched(iv, SL_PATCH_Z, l, g->dz, g->B, T, qd, hd);
    cut_patched(iv, SL_PATCH_HEAD_OUT, l, g->dz, g->B, T, qd, hd);
    SL_TRY(sl_linear_nt(rows, g->dz, qd, &lw->wo, g->dxn, d, 0, 1));
    block_output_jvp(m, &lw->attn_post_norm, &lw->attn_res_norm, g->dx, g->dxn, g->ds, rows, T, lt->o, lt->o_mean,
                     lt->o_rstd, lt->hr, lt->hr_mean, lt->hr_rstd, iv, SL_PATCH_ATTN_OUT, l);
    return SL_OK;
}

static int mlp_jvp(const sl_model *m, int64_t l, const sl_layer_weights *lw, const sl_layer_tape *lt, grad_bufs *g,
                   const sl_intervention *iv) {
    const int64_t T = g->T, d = m->d_model, F = m->d_ff;
    const int gated = lw->w_gate.data != NULL;
    sl_mlp_act_partials(m->act, gated ? g->dh_dg : NULL, g->dh_du, gated ? lt->gate : NULL, lt->up, T * F);
    for (int64_t b0 = 0; b0 < g->B; b0 += g->chunk) {
        const int64_t nb = g->B - b0 < g->chunk ? g->B - b0 : g->chunk, rows = nb * T;
        float *dx = g->dx + b0 * T * d, *dxn = g->dxn + b0 * T * d, *ds = g->ds ? g->ds + b0 * T * d : NULL;
        const float *a = dx;
        if (lw->ffn_norm.w) {
            norm_jvp(m, &lw->ffn_norm, dxn, dx, lt->h, lt->mean2, lt->rstd2, rows, T, d);
            a = dxn;
        }
        if (gated) SL_TRY(sl_linear_nt(rows, a, d, &lw->w_gate, g->dg, F, 0, 1));
        SL_TRY(sl_linear_nt(rows, a, d, &lw->w_up, g->du, F, 0, 1));
        sl_swiglu_jvp(g->dact, gated ? g->dg : NULL, g->du, gated ? g->dh_dg : NULL, g->dh_du, rows * F, T * F);
        SL_TRY(sl_linear_nt(rows, g->dact, F, &lw->w_down, dxn, d, 0, 1));
        block_output_jvp(m, &lw->ffn_post_norm, &lw->ffn_res_norm, dx, dxn, ds, rows, T, lt->mo, lt->mo_mean,
                         lt->mo_rstd, lt->yr, lt->yr_mean, lt->yr_rstd, iv, SL_PATCH_MLP_OUT, l);
    }
    return SL_OK;
}

int sl_model_jvp(const sl_model *m, const int64_t *ids, int64_t T, const sl_intervention *iv, int64_t at,
                 int64_t B, const float *tangent, float **tout) {
    SL_TRY(check_directions(m, at, B, tangent, "jvp"));
    SL_TRY(check_grad_patches(m, iv));
    const int64_t L = m->n_layers, d = m->d_model;
    grad_bufs g;
    SL_TRY(grad_bufs_alloc(&g, m, T > 0 ? T : 1, B, L, 0, 1));
    int rc = sl_model_forward_tape(m, ids, T, L, g.tapes, iv, NULL, NULL);
    if (rc == SL_OK) memcpy(g.dx, tangent, (size_t)(B * T * d) * sizeof(float));
    if (rc == SL_OK && tout && tout[at]) memcpy(tout[at], g.dx, (size_t)(B * T * d) * sizeof(float));
    for (int64_t l = at; l < L && rc == SL_OK && (rc = sl_check_interrupt()) == SL_OK; l++) {
        sl_attn_intervention aiv;
        sl_layer_intervention(m, iv, l, &aiv);
        rc = attention_jvp(m, l, &m->layers[l], &g.tapes[l], &g, &aiv, iv);
        if (rc == SL_OK) rc = mlp_jvp(m, l, &m->layers[l], &g.tapes[l], &g, iv);
        /* the tangent of the (patched) stream: none on a replaced entry */
        if (rc == SL_OK) cut_patched(iv, SL_PATCH_RESID, l + 1, g.dx, B, T, d, d);
        if (rc == SL_OK && tout && tout[l + 1]) memcpy(tout[l + 1], g.dx, (size_t)(B * T * d) * sizeof(float));
    }
    grad_bufs_free(&g);
    return rc;
}

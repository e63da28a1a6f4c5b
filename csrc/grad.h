/* Derivatives of the model: reverse mode (vector-Jacobian products, parameter gradients) and
 * forward mode (Jacobian-vector products), both over the forward's tape (model.h). */
#ifndef SL_GRAD_H
#define SL_GRAD_H

#include <stdint.h>

#include "model.h"

/* Parameter gradients, same shapes as sl_model's weights; every buffer is added to (+=), so the
 * caller zeroes them first (or accumulates over several sequences). lm_head may point to the same
 * buffer as tok_embd (tied embeddings): both contributions are added into it, in a fixed order.
 * A buffer is needed for every tensor the model has, and read for no other (NULL there). */
typedef struct {
    float *attn_norm, *attn_norm_b, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
    float *attn_q_norm, *attn_k_norm;
    float *attn_post_norm, *attn_post_norm_b, *attn_res_norm, *attn_res_norm_b;
    float *ffn_norm, *ffn_norm_b, *w_gate, *w_up, *w_down, *b_gate, *b_up, *b_down;
    float *ffn_post_norm, *ffn_post_norm_b, *ffn_res_norm, *ffn_res_norm_b;
} sl_layer_grads;

typedef struct {
    float *tok_embd, *out_norm, *lm_head;
    sl_layer_grads *layers; /* n_layers entries */
    float *out_norm_b;      /* (d) */
    float *pos_embd;        /* (n_pos, d): rows >= T stay untouched */
    float *type_embd;       /* (d) */
    float *embd_norm, *embd_norm_b;
} sl_model_grads;

/* What the VJP returns at each layer boundary l in [0, at]; every array and entry may be NULL.
 * The backward stops at the lowest layer anything is asked for. */
typedef struct {
    float **dresid;     /* n_layers+1 entries: NULL or (B, T, d), the gradient w.r.t. resid[l] */
    double **sqnorm;    /* n_layers+1 entries: NULL or (B, T), ||dresid[l][b, t, :]||^2 */
    double **spectral;  /* n_layers+1 entries: NULL or (T), largest singular value of the
                           (B x d) block dresid[l][:, t, :] (see sl_block_spectral) */
    double spectral_rtol;
    int spectral_max_iter;
    int spectral_iters; /* out: the most Lanczos steps any block took */
} sl_vjp_out;

/* B cotangents cot (B, T, d) on resid[at] (0 <= at <= n_layers) pushed back through layers
 * at-1 .. 0 together: one forward (saving layers [0, at)), then every linear layer's backward is
 * one product with B*T rows. */
int sl_model_vjp(const sl_model *m, const int64_t *ids, int64_t T, const sl_intervention *iv, int64_t at,
                 int64_t B, const float *cot, sl_vjp_out *out);

/* loss = mean over positions t with targets[t] >= 0 of the cross-entropy of the logits at t
 * against targets[t] (nats), and its gradient w.r.t. every parameter, added into pg. */
int sl_model_loss_grad(const sl_model *m, const int64_t *ids, const int64_t *targets, int64_t T,
                       const sl_intervention *iv, double *loss, const sl_model_grads *pg);

/* The same for one window of a training batch: *loss_sum += the cross-entropy summed over the
 * positions with a target (nats), and pg += the gradient of that sum / denom (denom: the targets
 * of the whole batch, so that the windows' gradients add up to the batch mean's). */
int sl_model_loss_grad_sum(const sl_model *m, const int64_t *ids, const int64_t *targets, int64_t T,
                           const sl_intervention *iv, double denom, double *loss_sum, const sl_model_grads *pg);

/* B tangents (B, T, d) on resid[at]: tout[l] (n_layers+1 entries, NULL or (B, T, d)) receives the
 * tangent of resid[l] for l >= at. */
int sl_model_jvp(const sl_model *m, const int64_t *ids, int64_t T, const sl_intervention *iv, int64_t at,
                 int64_t B, const float *tangent, float **tout);

#endif

/* Derivatives of the model: reverse mode (vector-Jacobian products, parameter gradients) and
 * forward mode (Jacobian-vector products), both over the forward's tape (model.h). */
#ifndef SL_GRAD_H
#define SL_GRAD_H

#include <stdint.h>

#include "model.h"

/* Parameter gradients, one buffer per row of the tensor schema (model.h), same shapes as the
 * weights; every buffer is added to (+=), so the caller zeroes them first (or accumulates over
 * several sequences). lm_head may point to the same buffer as tok_embd (tied embeddings): both
 * contributions are added into it, in a fixed order. A buffer is needed for every tensor the
 * model has, and read for no other (NULL there); pos_embd's rows >= T stay untouched. */
#define SL_GRAD_FIELD(grad, key, kind, weight, rows, cols, required, role) float *grad;
typedef struct {
    SL_LAYER_TENSORS(SL_GRAD_FIELD)
} sl_layer_grads;

typedef struct {
    SL_GLOBAL_TENSORS(SL_GRAD_FIELD)
    sl_layer_grads *layers; /* n_layers entries */
} sl_model_grads;
#undef SL_GRAD_FIELD

/* Floats sl_model_vjp / sl_model_jvp allocate for B directions on T tokens with the tape of
 * n_tape layers, besides the outputs (-1 on overflow or T < 1): the tapes, one layer's
 * probabilities (H*T*T), the direction buffers (B*T rows of 2d + 2*H*hd + 2*G*hd, + 2*H*hd
 * with grouped kv heads, + H*hd with QK-norms, + d with post-norms or post-LN: the JVP's
 * scratch), the MLP's three F-wide blocks of up to SL_GRAD_MLP_ROWS rows and its two (T, F)
 * partials. Not counted: the (T, hd) RoPE tables, at least one layer's tape when n_tape is 0
 * and the loss's (T, F) activation. Model.grad_bytes is 4 times this. */
int64_t sl_model_grad_floats(const sl_model *m, int64_t T, int64_t B, int64_t n_tape);

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

/* Training: one optimizer step of a language model from scratch on a batch of packed windows
 * (cross-entropy through the LM head, the backward of grad.c, global-norm clipping, AdamW), on
 * parameters, gradients and Adam moments held in flat contiguous buffers (as llm.c does), the
 * model's weights being views into the parameter buffer. */
#ifndef SL_TRAIN_H
#define SL_TRAIN_H

#include <stdint.h>

#include "grad.h"
#include "model.h"

/* AdamW as torch.optim.AdamW (decoupled weight decay, bias-corrected moments). */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_clip; /* largest global L2 norm of the gradient; <= 0: no clipping */
    int64_t step;     /* 1 on the first update: the bias corrections use beta^step */
} sl_adamw;

/* B windows of T tokens each, row-major. key_start (NULL: causal over the window) gives each
 * window's document starts (intra-document masking, see sl_attn_intervention); keep_first keeps
 * key 0 (a fixed ⟨bos⟩) visible to every query under it. */
typedef struct {
    int64_t B, T;
    const int64_t *ids, *targets; /* (B, T); a negative target leaves the position out */
    const int64_t *key_start;     /* NULL or (B, T) */
    int keep_first;
} sl_train_batch;

/* n floats each; grads holds every buffer of the sl_model_grads handed with it, m's weights (all
 * float32) lie in params. decay: n_decay ranges [a, b) of params that take weight decay (the
 * matrices; norms and embeddings usually not). */
typedef struct {
    float *params, *grads, *mom, *vel;
    int64_t n;
    const int64_t *decay;
    int64_t n_decay;
    /* The batch's windows are cut into n_groups fixed groups (1 <= n_groups <= B), each summing
     * its windows' gradients in order into its own buffer (group 0: grads; group g: group_grads
     * + (g-1)*n), the groups then added in order. Groups run in parallel (each single-threaded
     * when there are as many threads as groups), so the result depends on n_groups, never on
     * the thread count, and there is no barrier inside a window's work for a busy core to stall. */
    float *group_grads;
    int64_t n_groups;
    /* SL_PREC_FP32 (0: the exact engine) or SL_PREC_BF16: the weight products of the forward and
     * of the backward (dX = dY·W, dW = dYᵀ·X) take bf16-rounded inputs with fp32 accumulation
     * (gemm_bf16.h), every weight packed into bf16 panels from the fp32 parameters once per step;
     * attention, norms, activations, the loss, the gradient sums across windows and groups,
     * clipping and AdamW stay fp32, the parameters and moments fp32 master copies. */
    int precision;
    /* bf16: where the step's panels are kept between steps, repacked in place at each step (no new
     * memory after the first); NULL: a cache of the step's own, freed before the update. Not
     * shared by concurrent steps. */
    sl_packed_cache *panels;
} sl_train_state;

/* sqrt(sum of x^2) over n floats, summed in double over fixed blocks added in order, so the
 * same for any thread count. */
double sl_global_norm(const float *x, int64_t n);

/* The AdamW update of every parameter from st->grads (already clipped). */
int sl_adamw_update(sl_train_state *st, const sl_adamw *hp);

/* Zeroes the gradients, adds each window's loss gradient (the batch's mean cross-entropy over
 * its targets), clips to hp->grad_clip and applies AdamW, at st->precision. *loss: the batch mean
 * (nats); *grad_norm: the global norm before clipping. Afterwards m->packed (the model's inference
 * panels, if any) is emptied: they were packed from weights the update has changed. */
int sl_train_step(const sl_model *m, const sl_model_grads *pg, sl_train_state *st, const sl_train_batch *b,
                  const sl_adamw *hp, double *loss, double *grad_norm);

#endif

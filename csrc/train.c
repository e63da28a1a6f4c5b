/* One training step: gradients window by window (each window's forward and backward with its
 * weight products over the window's T rows), then global-norm clipping and AdamW over the flat
 * buffers. Every reduction has a fixed order, so a step gives the same bits for any thread
 * count, which is what makes a resumed run continue bitwise. */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

#include "sl_common.h"

/* Floats per block of the global norm's sum: blocks are summed in parallel, then in order. */
#define SL_NORM_BLOCK 65536

double sl_global_norm(const float *x, int64_t n) {
    const int64_t nb = (n + SL_NORM_BLOCK - 1) / SL_NORM_BLOCK;
    double *part = (double *)sl_alloc_floats(2 * (nb > 0 ? nb : 1));
    if (!part) return NAN;
#pragma omp parallel for schedule(static) num_threads(sl_num_threads())
    for (int64_t k = 0; k < nb; k++) {
        const int64_t a = k * SL_NORM_BLOCK, b = a + SL_NORM_BLOCK < n ? a + SL_NORM_BLOCK : n;
        double s = 0.0;
        for (int64_t i = a; i < b; i++) s += (double)x[i] * x[i];
        part[k] = s;
    }
    double total = 0.0;
    for (int64_t k = 0; k < nb; k++) total += part[k];
    sl_free(part);
    return sqrt(total);
}

static int check_hyper(const sl_adamw *hp) {
    if (!(hp->lr >= 0.0) || !(hp->beta1 >= 0.0 && hp->beta1 < 1.0) || !(hp->beta2 >= 0.0 && hp->beta2 < 1.0) ||
        !(hp->eps > 0.0) || !(hp->weight_decay >= 0.0) || isnan(hp->grad_clip) || hp->step < 1)
        return sl_fail(SL_ERR_VALUE,
                       "adamw: need lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0 and step >= 1 "
                       "(got lr=%g beta1=%g beta2=%g eps=%g weight_decay=%g step=%lld)",
                       hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, (long long)hp->step);
    return SL_OK;
}

/* Elements [a, b) with or without decay, in torch.optim.AdamW's order of operations:
 * p *= 1 - lr*wd; m += (1-b1)(g - m); v = b2 v + (1-b2) g^2;
 * p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
static void adamw_range(sl_train_state *st, const sl_adamw *hp, int64_t a, int64_t b, int decay) {
    const float decay_mul = (float)(1.0 - hp->lr * hp->weight_decay);
    const float one_b1 = (float)(1.0 - hp->beta1), b2 = (float)hp->beta2, one_b2 = (float)(1.0 - hp->beta2);
    const double bc1 = 1.0 - pow(hp->beta1, (double)hp->step), bc2 = 1.0 - pow(hp->beta2, (double)hp->step);
    const float step_size = (float)(hp->lr / bc1), bc2_sqrt = (float)sqrt(bc2), eps = (float)hp->eps;
    float *p = st->params, *g = st->grads, *m = st->mom, *v = st->vel;
#pragma omp parallel for simd schedule(static) num_threads(sl_num_threads())
    for (int64_t i = a; i < b; i++) {
        if (decay) p[i] *= decay_mul;
        m[i] += one_b1 * (g[i] - m[i]);
        v[i] = b2 * v[i] + one_b2 * (g[i] * g[i]);
        p[i] -= step_size * (m[i] / (sqrtf(v[i]) / bc2_sqrt + eps));
    }
}

int sl_adamw_update(sl_train_state *st, const sl_adamw *hp) {
    SL_TRY(check_hyper(hp));
    int64_t at = 0;
    for (int64_t r = 0; r < st->n_decay; r++) {
        const int64_t a = st->decay[2 * r], b = st->decay[2 * r + 1];
        if (a < at || b < a || b > st->n)
            return sl_fail(SL_ERR_VALUE, "adamw: decay range %lld [%lld, %lld) is not sorted, disjoint and inside "
                           "[0, %lld)", (long long)r, (long long)a, (long long)b, (long long)st->n);
        adamw_range(st, hp, at, a, 0);
        adamw_range(st, hp, a, b, 1);
        at = b;
    }
    adamw_range(st, hp, at, st->n, 0);
    return SL_OK;
}

static void scale_floats(float *x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) num_threads(sl_num_threads())
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static void zero_floats(float *x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(sl_num_threads())
    for (int64_t k = 0; k < (n + SL_NORM_BLOCK - 1) / SL_NORM_BLOCK; k++) {
        const int64_t a = k * SL_NORM_BLOCK, b = a + SL_NORM_BLOCK < n ? a + SL_NORM_BLOCK : n;
        memset(x + a, 0, (size_t)(b - a) * sizeof(float));
    }
}

/* pg with every buffer moved from the flat gradient `from` to the same offset in `to`; out's
 * layers go to `layers` (n_layers entries). Both gradient structs hold only float pointers. */
static void shift_grads(const sl_model *m, const sl_model_grads *pg, const float *from, float *to,
                        sl_layer_grads *layers, sl_model_grads *out) {
    *out = *pg;
    out->layers = layers;
    float **g = (float **)out;
    for (size_t i = 0; i < sizeof *out / sizeof(float *); i++)
        if (g[i] && (void *)&g[i] != (void *)&out->layers) g[i] = to + (g[i] - from);
    for (int64_t l = 0; l < m->n_layers; l++) {
        layers[l] = pg->layers[l];
        float **f = (float **)&layers[l];
        for (size_t i = 0; i < sizeof layers[l] / sizeof(float *); i++)
            if (f[i]) f[i] = to + (f[i] - from);
    }
}

/* Windows [w0, w1) of the batch, their loss gradients summed in order into pg. */
static int group_gradient(const sl_model *m, const sl_model_grads *pg, const sl_train_batch *b, int64_t w0,
                          int64_t w1, double denom, double *loss_sum) {
    for (int64_t w = w0; w < w1; w++) {
        const sl_intervention iv = {.key_start = b->key_start ? b->key_start + w * b->T : NULL,
                                    .keep_first = b->keep_first};
        SL_TRY(sl_model_loss_grad_sum(m, b->ids + w * b->T, b->targets + w * b->T, b->T, &iv, denom, loss_sum,
                                      pg));
    }
    return SL_OK;
}

/* Every group's gradient, groups in parallel: each worker registers a context of its own share
 * of the threads, so the ops inside run with that many (their results do not depend on it). */
static int batch_gradient(const sl_model *m, const sl_model_grads *pg, sl_train_state *st, const sl_train_batch *b,
                          double denom, double *loss) {
    const int64_t G = st->n_groups, L = m->n_layers;
    sl_layer_grads *layers = calloc((size_t)(G * L), sizeof *layers);
    sl_model_grads *gp = calloc((size_t)G, sizeof *gp);
    double *sums = calloc((size_t)G, sizeof *sums);
    int status = layers && gp && sums ? SL_OK : sl_fail(SL_ERR_MEMORY, "train: cannot allocate group state");
    for (int64_t g = 0; g < G && status == SL_OK; g++) {
        if (g == 0) gp[0] = *pg;
        else shift_grads(m, pg, st->grads, st->group_grads + (g - 1) * st->n, layers + g * L, &gp[g]);
        if (g > 0) zero_floats(st->group_grads + (g - 1) * st->n, st->n);
    }
    sl_ctx *ctx = sl_ctx_current();
    const int threads = ctx->num_threads, outer = threads < G ? threads : (int)G;
    const int inner = threads / outer > 0 ? threads / outer : 1;
    if (status == SL_OK) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(outer)
        for (int64_t g = 0; g < G; g++) {
            sl_ctx mine = {.num_threads = inner, .interruptible = ctx->interruptible};
            mine.err[0] = 0;
            sl_ctx *prev = sl_ctx_enter(&mine);
            const int rc = group_gradient(m, &gp[g], b, g * b->B / G, (g + 1) * b->B / G, denom, &sums[g]);
            sl_ctx_leave(prev);
            if (rc != SL_OK) {
#pragma omp critical(sl_train_err)
                status = sl_fail_ctx(ctx, rc, "%s", mine.err);
            }
        }
    }
    /* The groups' sums, added in group order. */
    for (int64_t g = 1; g < G && status == SL_OK; g++) sl_add_inplace(st->grads, st->group_grads + (g - 1) * st->n,
                                                                     st->n);
    double total = 0.0;
    for (int64_t g = 0; g < G && status == SL_OK; g++) total += sums[g];
    *loss = total;
    free(layers);
    free(gp);
    free(sums);
    return status;
}

int sl_train_step(const sl_model *m, const sl_model_grads *pg, sl_train_state *st, const sl_train_batch *b,
                  const sl_adamw *hp, double *loss, double *grad_norm) {
    SL_TRY(check_hyper(hp));
    if (b->B < 1 || b->T < 1) return sl_fail(SL_ERR_VALUE, "train: empty batch (%lld x %lld)", (long long)b->B,
                                             (long long)b->T);
    if (st->n_groups < 1 || st->n_groups > b->B || (st->n_groups > 1 && !st->group_grads))
        return sl_fail(SL_ERR_VALUE, "train: %lld gradient groups for %lld windows (need 1..B, and a buffer of "
                       "(groups - 1) x n floats beyond one)", (long long)st->n_groups, (long long)b->B);
    int64_t n_targets = 0;
    for (int64_t i = 0; i < b->B * b->T; i++) n_targets += b->targets[i] >= 0;
    if (n_targets == 0) return sl_fail(SL_ERR_VALUE, "train: no position of the batch has a target");
    if (st->precision != SL_PREC_FP32 && st->precision != SL_PREC_BF16)
        return sl_fail(SL_ERR_VALUE, "train: precision %d (%s) is not available for training: fp32 (0) or bf16 (1)",
                       st->precision, sl_precision_name(st->precision));
    zero_floats(st->grads, st->n);
    double sum = 0.0;
    if (st->precision == SL_PREC_BF16) {
        /* this step's descriptor: bf16 products through panels of the current weights, packed
         * here once for every window and group (into st->panels' buffers when it has them) */
        sl_model mc = *m;
        sl_packed_cache pc;
        if (!st->panels) SL_TRY(sl_packed_cache_init(&pc, m->n_layers));
        mc.precision = SL_PREC_BF16;
        mc.packed = st->panels ? st->panels : &pc;
        int rc = sl_model_pack_bf16(&mc);
        if (rc == SL_OK) rc = batch_gradient(&mc, pg, st, b, (double)n_targets, &sum);
        if (!st->panels) sl_packed_cache_clear(&pc);
        SL_TRY(rc);
    } else {
        SL_TRY(batch_gradient(m, pg, st, b, (double)n_targets, &sum));
    }
    const double norm = sl_global_norm(st->grads, st->n);
    if (!isfinite(norm))
        return sl_fail(SL_ERR_VALUE, "train: the gradient's norm is %g (loss %g): not applying this update", norm,
                       sum / (double)n_targets);
    /* torch.nn.utils.clip_grad_norm_: g *= min(1, clip / (norm + 1e-6)). */
    if (hp->grad_clip > 0.0) {
        const double coef = hp->grad_clip / (norm + 1e-6);
        if (coef < 1.0) scale_floats(st->grads, st->n, (float)coef);
    }
    SL_TRY(sl_adamw_update(st, hp));
    sl_packed_cache_invalidate(m->packed); /* panels of the old weights */
    *loss = sum / (double)n_targets;
    *grad_norm = norm;
    return SL_OK;
}

/* Elementwise and row-wise ops of the LLaMA block, each next to the backward it will need.
 *
 * sl_rmsnorm, sl_layernorm, sl_swiglu, sl_mlp_act (except erf GELU), sl_softcap,
 * sl_softmax_entropy, sl_add_inplace and sl_bias_add dispatch at run time (cpu.h) to AVX-512,
 * AVX2+FMA or portable kernels. Within one level the result is the same for any thread count;
 * across levels it agrees to rounding (see ops.c for what differs and the measured ulps: the
 * vector exp/tanh and the order of double sums), except the adds, which are bitwise the same on
 * every level. */
#ifndef SL_OPS_H
#define SL_OPS_H

#include <stdint.h>

/* Batched backward and JVP convention: the primal tensors (x, rstd, g, u) hold T rows (one
 * sequence); the cotangents/tangents hold rows = B*T rows (B directions for that sequence), row r
 * reading primal row r % T. */

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for T rows of width d (out may alias x);
 * rstd (NULL or T) receives 1/sqrt(mean(x[t]^2) + eps) for the backward. */
void sl_rmsnorm(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps);
/* x[t] += y[t], then out[t] = rmsnorm(x[t]) (rstd as above): a residual add and the next
 * block's pre-norm in one parallel region, bitwise sl_add_inplace then sl_rmsnorm; out may be y. */
void sl_residual_rmsnorm(float *x, const float *y, float *out, float *rstd, const float *w, int64_t T, int64_t d,
                         float eps);
/* dx (+)= J^T dy for each of `rows` rows; dw (NULL or d) += the weight gradient summed over rows. */
void sl_rmsnorm_backward(float *dx, int accumulate, float *dw, const float *dy, const float *x,
                         const float *w, const float *rstd, int64_t rows, int64_t T, int64_t d);
/* dy = J dx for each of `rows` rows. */
void sl_rmsnorm_jvp(float *dy, const float *dx, const float *x, const float *w, const float *rstd,
                    int64_t rows, int64_t T, int64_t d);

/* LayerNorm: out[t] = (x[t] - mean) * rstd * w + b (b NULL: no bias), T rows of width d, out may
 * alias x; mean, rstd (each NULL or T) receive the row's mean and 1/sqrt(var + eps) (biased
 * variance, as torch.nn.LayerNorm) for the backward. */
void sl_layernorm(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                  int64_t T, int64_t d, float eps);
/* The same with a LayerNorm: bitwise sl_add_inplace then sl_layernorm; out may be y. */
void sl_residual_layernorm(float *x, const float *y, float *out, float *mean, float *rstd, const float *w,
                           const float *b, int64_t T, int64_t d, float eps);
/* dx (+)= J^T dy for each of `rows` rows (row r reads primal row r % T); dw, db (each NULL or d)
 * += the weight and bias gradients summed over rows. */
void sl_layernorm_backward(float *dx, int accumulate, float *dw, float *db, const float *dy, const float *x,
                           const float *w, const float *mean, const float *rstd, int64_t rows, int64_t T,
                           int64_t d);
/* dy = J dx for each of `rows` rows (the bias does not enter the tangent). */
void sl_layernorm_jvp(float *dy, const float *dx, const float *x, const float *w, const float *mean,
                      const float *rstd, int64_t rows, int64_t T, int64_t d);

/* x[t] += b for T rows of width d, row stride ld (a linear layer's bias). */
void sl_bias_add(float *x, const float *b, int64_t T, int64_t d, int64_t ld);
/* db[j] += sum over rows of dy[r, j] (row stride ld), summed in double in row order. */
void sl_bias_backward(float *db, const float *dy, int64_t rows, int64_t d, int64_t ld);

/* x = cap * tanh(x / cap) in place over n elements (Gemma 2's final-logit soft-capping);
 * cap <= 0 (the configuration's "none") leaves x unchanged, and the backward copies dy. */
void sl_softcap(float *x, int64_t n, float cap);
/* dx = dy * (1 - (y / cap)^2) from the capped output y: the backward and (with dy a tangent) the
 * JVP; dx may alias dy. */
void sl_softcap_backward(float *dx, const float *dy, const float *y, int64_t n, float cap);

/* Rotary tables for positions 0..T-1: cos/sin[t*half + i] of angle t * inv_freq[i].
 * The angle is rounded to fp32 first, as the reference implementations do. */
void sl_rope_tables(float *cosv, float *sinv, const float *inv_freq, int64_t T, int64_t half);

enum { SL_ROPE_HALF_SPLIT = 0, /* pairs (i, i+hd/2): Hugging Face layout */
       SL_ROPE_ADJACENT = 1 /* pairs (2i, 2i+1): GGUF/llama.cpp layout (Q/K rows permuted) */ };

/* Rotates n_heads heads of head_dim in each of T rows (row stride `stride` floats) in place. */
void sl_rope_apply(float *x, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                   const float *cosv, const float *sinv, int layout);
/* One row of sl_rope_apply: n_heads heads of head_dim at x, by the angles of one position
 * (cos and sin, head_dim/2 each). */
void sl_rope_row(float *x, int64_t n_heads, int64_t head_dim, const float *cosv, const float *sinv, int layout);
/* sl_rope_apply on q (q_heads per row) and on k (k_heads per row) of the same T positions, in
 * one parallel region: the same bits as two calls. */
void sl_rope_apply_qk(float *q, int64_t q_stride, int64_t q_heads, float *k, int64_t k_stride, int64_t k_heads,
                      int64_t T, int64_t head_dim, const float *cosv, const float *sinv, int layout);

/* The inverse rotation (rotation by -angle), which is RoPE's transpose: the backward of
 * sl_rope_apply. Its JVP is sl_rope_apply itself (RoPE is linear). */
void sl_rope_backward(float *dx, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                      const float *cosv, const float *sinv, int layout);

/* MLP activations. Gated ones compute h = act(g) * u from the gate and up projections; plain
 * ones compute h = act(u) from the up projection alone (g, dh_dg, dg are then unused and may be
 * NULL). GELU-tanh is Hugging Face's gelu_pytorch_tanh / gelu_new, GELU-erf its exact "gelu". */
enum { SL_ACT_SWIGLU = 0, SL_ACT_GEGLU_TANH = 1, SL_ACT_GELU_TANH = 2, SL_ACT_GELU_ERF = 3 };
/* h = act(g, u) for n elements; h may alias g or u. */
void sl_mlp_act(int act, float *h, const float *g, const float *u, int64_t n);
/* The same on the calling thread, no parallel region (for a row of a product's prologue): the
 * same bits for any stretch of the elements. */
void sl_mlp_act_serial(int act, float *h, const float *g, const float *u, int64_t n);
/* The partials of h: dh_dg = u act'(g), dh_du = act(g) (gated); dh_du = act'(u) (plain). Feed
 * them to sl_swiglu_backward / sl_swiglu_jvp, which are activation-agnostic products. */
void sl_mlp_act_partials(int act, float *dh_dg, float *dh_du, const float *g, const float *u, int64_t n);

/* h = silu(g) * u elementwise (SwiGLU); h may alias g. The SIMD levels use a vector exp (Cephes
 * polynomial, <= 2 ulp) where the portable path uses expf, so silu(g) differs by a few ulp. */
void sl_swiglu(float *h, const float *g, const float *u, int64_t n);
/* The partials of h = silu(g) u: dh_dg = u silu'(g), dh_du = silu(g), for n elements. */
void sl_swiglu_partials(float *dh_dg, float *dh_du, const float *g, const float *u, int64_t n);
/* Backward: dg = dh * dh_dg, du = dh * dh_du; JVP: dh = dg * dh_dg + du * dh_du. n is a multiple
 * of period, the partials' length (one sequence). Any activation: with a plain (ungated) one,
 * dg and dh_dg are NULL and only du / the du term is computed. */
void sl_swiglu_backward(float *dg, float *du, const float *dh, const float *dh_dg, const float *dh_du,
                        int64_t n, int64_t period);
void sl_swiglu_jvp(float *dh, const float *dg, const float *du, const float *dh_dg, const float *dh_du,
                   int64_t n, int64_t period);

/* Numerically safe softmax of x[0..n) in place (max subtracted, sums in double); returns the
 * entropy of the result in nats, from log Z - E[x - max] so no per-element log is needed. */
float sl_softmax_entropy(float *x, int64_t n);
/* The softmax with an extra logit `sink` in the denominator, exp(x_j) / (exp(sink) + sum_i exp(x_i)),
 * in place; returns the entropy of the keys' probabilities (the sink's mass left out). */
float sl_softmax_sink_entropy(float *x, int64_t n, float sink);
/* The same softmax in place; returns log(sum_i exp(x_i)) (the cross-entropy's normaliser) in double. */
double sl_softmax_lse(float *x, int64_t n);

/* x[i] += y[i] for i < n (the residual connection). */
void sl_add_inplace(float *x, const float *y, int64_t n);

/* out[t] = table[ids[t]]; every id must already be checked against vocab (done by the caller). */
void sl_embed(float *out, const float *table, const int64_t *ids, int64_t T, int64_t d);
/* dtable[ids[t]] += dout[t]: the embedding's weight gradient. */
void sl_embed_backward(float *dtable, const float *dout, const int64_t *ids, int64_t T, int64_t d);

#endif

/* Elementwise and row-wise ops of the LLaMA block, each next to the backward it will need.
 *
 * sl_rmsnorm, sl_swiglu, sl_softmax_entropy and sl_add_inplace dispatch at run time (cpu.h) to
 * AVX-512, AVX2+FMA or portable kernels. Within one level the result is the same for any thread
 * count; across levels it agrees to rounding (see ops.c for what differs: the vector exp and
 * the order of double sums), except sl_add_inplace, which is bitwise the same on every level. */
#ifndef SL_OPS_H
#define SL_OPS_H

#include <stdint.h>

/* Batched backward and JVP convention: the primal tensors (x, rstd, g, u) hold T rows (one
 * sequence); the cotangents/tangents hold rows = B*T rows (B directions for that sequence), row r
 * reading primal row r % T. */

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for T rows of width d (out may alias x);
 * rstd (NULL or T) receives 1/sqrt(mean(x[t]^2) + eps) for the backward. */
void sl_rmsnorm(float *out, float *rstd, const float *x, const float *w, int64_t T, int64_t d, float eps);
/* dx (+)= J^T dy for each of `rows` rows; dw (NULL or d) += the weight gradient summed over rows. */
void sl_rmsnorm_backward(float *dx, int accumulate, float *dw, const float *dy, const float *x,
                         const float *w, const float *rstd, int64_t rows, int64_t T, int64_t d);
/* dy = J dx for each of `rows` rows. */
void sl_rmsnorm_jvp(float *dy, const float *dx, const float *x, const float *w, const float *rstd,
                    int64_t rows, int64_t T, int64_t d);

/* Rotary tables for positions 0..T-1: cos/sin[t*half + i] of angle t * inv_freq[i].
 * The angle is rounded to fp32 first, as the reference implementations do. */
void sl_rope_tables(float *cosv, float *sinv, const float *inv_freq, int64_t T, int64_t half);

enum { SL_ROPE_HALF_SPLIT = 0, /* pairs (i, i+hd/2): Hugging Face layout */
       SL_ROPE_ADJACENT = 1 /* pairs (2i, 2i+1): GGUF/llama.cpp layout (Q/K rows permuted) */ };

/* Rotates n_heads heads of head_dim in each of T rows (row stride `stride` floats) in place. */
void sl_rope_apply(float *x, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                   const float *cosv, const float *sinv, int layout);

/* The inverse rotation (rotation by -angle), which is RoPE's transpose: the backward of
 * sl_rope_apply. Its JVP is sl_rope_apply itself (RoPE is linear). */
void sl_rope_backward(float *dx, int64_t T, int64_t stride, int64_t n_heads, int64_t head_dim,
                      const float *cosv, const float *sinv, int layout);

/* h = silu(g) * u elementwise (SwiGLU); h may alias g. The SIMD levels use a vector exp (Cephes
 * polynomial, <= 2 ulp) where the portable path uses expf, so silu(g) differs by a few ulp. */
void sl_swiglu(float *h, const float *g, const float *u, int64_t n);
/* The partials of h = silu(g) u: dh_dg = u silu'(g), dh_du = silu(g), for n elements. */
void sl_swiglu_partials(float *dh_dg, float *dh_du, const float *g, const float *u, int64_t n);
/* Backward: dg = dh * dh_dg, du = dh * dh_du; JVP: dh = dg * dh_dg + du * dh_du. n is a multiple
 * of period, the partials' length (one sequence). */
void sl_swiglu_backward(float *dg, float *du, const float *dh, const float *dh_dg, const float *dh_du,
                        int64_t n, int64_t period);
void sl_swiglu_jvp(float *dh, const float *dg, const float *du, const float *dh_dg, const float *dh_du,
                   int64_t n, int64_t period);

/* Numerically safe softmax of x[0..n) in place (max subtracted, sums in double); returns the
 * entropy of the result in nats, from log Z - E[x - max] so no per-element log is needed. */
float sl_softmax_entropy(float *x, int64_t n);

/* x[i] += y[i] for i < n (the residual connection). */
void sl_add_inplace(float *x, const float *y, int64_t n);

/* out[t] = table[ids[t]]; every id must already be checked against vocab (done by the caller). */
void sl_embed(float *out, const float *table, const int64_t *ids, int64_t T, int64_t d);
/* dtable[ids[t]] += dout[t]: the embedding's weight gradient. */
void sl_embed_backward(float *dtable, const float *dout, const int64_t *ids, int64_t T, int64_t d);

#endif

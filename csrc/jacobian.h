/* Norms of Jacobian blocks, taken from a batch of B cotangents pushed through the backward
 * together: g (B, T, d) holds rows u_b^T J_t of the (B x d) block J_t for each source position t. */
#ifndef SL_JACOBIAN_H
#define SL_JACOBIAN_H

#include <stdint.h>

/* sq[b*T + t] = ||g[b, t, :]||^2, summed in double. With the B unit cotangents of a Jacobian,
 * summing over b gives the block's squared Frobenius norm; with B random probes, their mean is
 * an unbiased estimate of it. */
void sl_block_sqnorms(const float *g, int64_t B, int64_t T, int64_t d, double *sq);

/* spec[t] = the largest singular value of the (B x d) block g[:, t, :]: Lanczos on J_t^T J_t
 * (float vectors, fully reorthogonalised; coefficients in double) from the block's largest row,
 * until the largest Ritz value changes by less than `rtol` relatively, or after max_iter steps.
 * The Ritz value never exceeds sigma^2 and increases to it. Returns the largest number of steps
 * any block took, or minus an error code. */
int sl_block_spectral(const float *g, int64_t B, int64_t T, int64_t d, double rtol, int max_iter,
                      double *spec);

#endif

/* Single-precision matrix multiply, activations times transposed weights, as every linear layer
 * of the model needs: C[M×N] = A[M×K] · B[N×K]ᵀ (+ C when accumulate), all row-major with
 * leading dimensions lda, ldb, ldc (in elements). B is a weight matrix stored (out, in).
 *
 * Determinism: every C element is reduced over K in one fixed order that depends neither on the
 * thread count nor on the tiling of M and N, so results are bitwise identical for any number of
 * threads. The AVX2 and generic paths agree to rounding. */
#ifndef SL_SGEMM_H
#define SL_SGEMM_H

#include <stdint.h>

/* parallel != 0: OpenMP over output tiles (call from outside a parallel region);
 * parallel == 0: runs on the calling thread (safe inside a parallel region). */
int sl_sgemm_nt(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, int accumulate, int parallel);

#endif

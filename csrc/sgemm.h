/* Single-precision matrix multiply, activations times transposed weights, as every linear layer
 * of the model needs: C[M×N] = A[M×K] · B[N×K]ᵀ (+ C when accumulate), all row-major with
 * leading dimensions lda, ldb, ldc (in elements). B is a weight matrix stored (out, in).
 *
 * Determinism: every C element is reduced over K in one fixed order that depends neither on the
 * thread count nor on the tiling of M and N, so results are bitwise identical for any number of
 * threads. The AVX2 and AVX-512 paths run the same fused multiply-add chains and give the same
 * bits; the generic path (separate multiply and add) agrees with them to rounding. */
#ifndef SL_SGEMM_H
#define SL_SGEMM_H

#include <stdint.h>

/* General form, BLAS conventions: C[M×N] = op(A)·op(B) (+ C), op(A) (M×K), op(B) (K×N).
 * trans_a == 0: A is stored (M, K); trans_a != 0: A is stored (K, M) and op(A) = Aᵀ.
 * trans_b == 0: B is stored (K, N); trans_b != 0: B is stored (N, K) and op(B) = Bᵀ.
 * The backward pass needs all three layouts of a linear layer y = x·Wᵀ:
 *   forward  y  = x · Wᵀ   (trans_b = 1, "NT"),
 *   input    dx = dy · W   (NN),
 *   weight   dW += dyᵀ · x (trans_a = 1, "TN", accumulate).
 * Same determinism contract for every layout: each C element is one chain over k in order. */
int sl_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
             const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate, int parallel);

/* sl_sgemm(0, 1, ...): activations times transposed weights. */
/* parallel != 0: OpenMP over output tiles (call from outside a parallel region);
 * parallel == 0: runs on the calling thread (safe inside a parallel region). */
int sl_sgemm_nt(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, int accumulate, int parallel);

#endif

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

/* A weight matrix (rows = outputs, cols = inputs) held in its file's format: float32, F16, BF16
 * or a GGUF block-quantized type (quant.h), row after row, each row a whole number of blocks
 * (row_bytes = cols / block_elems * block_bytes). Quantized weights stay in this form in memory
 * (memory-mapped from the file); the products below decode them block by block while packing
 * the weight panel, into exactly the floats sl_dequantize gives, then run the same kernel on
 * them: results are bitwise those of dequantize-then-sl_sgemm. */
typedef struct {
    int type;         /* SL_GGML_* */
    const void *data; /* rows * row_bytes bytes */
    int64_t rows, cols, row_bytes;
} sl_weight;

/* Fills w after checking the type, that cols is a whole number of blocks and that nbytes is
 * exactly rows * row_bytes. */
int sl_weight_init(sl_weight *w, int type, const void *data, int64_t nbytes, int64_t rows, int64_t cols);

/* A float32 matrix (rows, cols), row stride cols, as an sl_weight. */
sl_weight sl_weight_f32(const float *data, int64_t rows, int64_t cols);

/* The forward of a linear layer: C[M×rows] = A[M×cols] · Wᵀ (+ C). Bitwise sl_sgemm_nt on the
 * dequantized W, for any thread count. */
int sl_linear_nt(int64_t M, const float *A, int64_t lda, const sl_weight *W, float *C, int64_t ldc, int accumulate,
                 int parallel);

/* Work a product does on each row i < M of its A, inside its own parallel region and before it
 * reads A, each row by one thread: fn(arg, i) writes row i of A (the forward's MLP activation,
 * which then needs no parallel region of its own). The same bits as running fn over the rows
 * first, whatever the thread count. */
typedef struct {
    void (*fn)(void *arg, int64_t row);
    void *arg;
} sl_row_prologue;

/* The most products of one input a *_shared call takes (q, k, v). */
enum { SL_SHARED_MAX = 3 };

/* sl_linear_nt(M, A, lda, W, C, ldc, 0, 1) after pro (NULL: none) has written A's rows. */
int sl_linear_nt_prologue(int64_t M, float *A, int64_t lda, const sl_weight *W, float *C, int64_t ldc,
                          const sl_row_prologue *pro);
/* Products of one input (the forward's q, k, v; gate, up): C[j] = A · W[j]ᵀ for n <= SL_SHARED_MAX
 * weights of the same cols, in one parallel region: bitwise n calls of
 * sl_linear_nt(M, A, lda, W[j], C[j], ldc[j], 0, 1). */
int sl_linear_nt_shared(int64_t M, const float *A, int64_t lda, int n, const sl_weight *const *W, float *const *C,
                        const int64_t *ldc);

/* The input gradient of a linear layer: C[M×cols] = A[M×rows] · W (+ C). Bitwise sl_sgemm(0, 0,
 * ...) on the dequantized W. */
int sl_linear_nn(int64_t M, const float *A, int64_t lda, const sl_weight *W, float *C, int64_t ldc, int accumulate,
                 int parallel);

/* dst[i, :] = row ids[i] of W dequantized (cols floats each), for n rows (embedding lookups);
 * every id must be in [0, rows) (checked). */
int sl_weight_rows(const sl_weight *W, const int64_t *ids, int64_t n, float *dst);

/* Columns [c0, c0 + n) of W as float32 (rows, n) into dst (row stride n): a slice of W_O for
 * one head's output. */
int sl_weight_cols(const sl_weight *W, int64_t c0, int64_t n, float *dst);

#endif

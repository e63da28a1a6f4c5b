/* bf16 linear layers: C[M×N] = A[M×K] · Wᵀ (+ C) with W packed once into bf16 panels, A rounded to
 * bf16 at the product's input, every product accumulated in fp32. The bf16 precision of the
 * forward (model.h's sl_precision) runs its weight products through this.
 *
 * Rounding (sl_bf16_from_f32) is exactly vcvtneps2bf16: round to nearest even; denormal inputs
 * become a zero of their sign (the instruction treats them as zero); ±inf stay; a NaN keeps its
 * sign and top payload bits and is made quiet (bits >> 16 | 0x0040); a finite value that rounds
 * past the largest bf16 becomes ±inf.
 *
 * Summation: each C element is one chain over k pairs in order, exactly vdpbf16ps's: starting
 * from +0 (or from C when accumulating), for q = 0, 1, ..: acc += a[2q+1]·b[2q+1], then
 * acc += a[2q]·b[2q] (the odd element first), each step one fused multiply-add rounded to
 * nearest even, with DAZ (a denormal bf16 input or accumulator reads as a zero of its sign) and
 * FTZ (a result whose 24-bit rounding is below 2^-126 in magnitude becomes a zero of its sign:
 * tininess after rounding). An odd K is padded with one zero pair element. The order depends
 * neither on the thread count nor on the tiling, so results are bitwise identical for any thread
 * count, and the portable path emulates the instruction exactly: it gives the same bits as the
 * AVX512-BF16 path (verified on an AVX512-BF16 machine by tests/test_precision_bf16.py, special
 * values included). NaN results stay NaN; their payload may differ between paths. */
#ifndef SL_GEMM_BF16_H
#define SL_GEMM_BF16_H

#include <stdint.h>

#include "sgemm.h"

typedef uint16_t sl_bf16;

/* fp32 -> bf16 bits (see above), and bf16 bits -> fp32 (exact). */
sl_bf16 sl_bf16_from_f32(float x);
float sl_bf16_to_f32(sl_bf16 h);
/* dst[i] = sl_bf16_from_f32(src[i]) for n values (AVX512-BF16 when the path has it: same bits). */
int sl_bf16_round(const float *src, sl_bf16 *dst, int64_t n, int path);

/* Kernel paths. AUTO: AVX512-BF16 when the CPU has it and sl_simd() is avx512, else PORTABLE
 * (so SINKLAB_SIMD=generic or avx2 runs the portable path). Asking for AVX512-BF16 on a CPU
 * without it is an error. */
enum { SL_BF16_AUTO = 0, SL_BF16_PORTABLE = 1, SL_BF16_AVX512 = 2 };
int sl_bf16_path(int requested); /* the path a request resolves to, -1 when unavailable */
const char *sl_bf16_path_name(int path);

/* Columns per panel: two zmm registers of 16 fp32 accumulators. */
enum { SL_BF16_NR = 32 };

/* A weight (n outputs × k inputs) in bf16 panels: panel p holds outputs [32p, 32p + 32), for each
 * k pair q the 64 values data[p*kp*32 + q*64 + h*32 + 2j + e] = W[32p + 16h + j][2q + e]
 * (zero past n and past k), kp = k rounded up to even: what one vdpbf16ps reads per half panel. */
typedef struct {
    int64_t n, k, kp;
    int64_t bytes; /* of data */
    sl_bf16 *data; /* 64-byte aligned */
} sl_bf16_panels;

/* Packs W into new panels (*out; free with sl_bf16_panels_free). W's values: F32 rounded by
 * sl_bf16_from_f32; BF16 taken bit for bit; F16 and the block-quantized types decoded into the
 * floats sl_dequantize gives, then rounded by sl_bf16_from_f32. OpenMP over panels when
 * parallel != 0. */
int sl_bf16_pack(const sl_weight *W, int parallel, sl_bf16_panels **out);
void sl_bf16_panels_free(sl_bf16_panels *p);
/* Packs the panels of Bᵀ: B (k, n) float32, row-major with row stride ldb >= n, read as the
 * weight of n outputs × k inputs whose output j is column j of B, each value rounded by
 * sl_bf16_from_f32. The backward's products use it: dX = dY·W reads W (out, in) as (k, n), and a
 * weight gradient dYᵀ·X reads the activations X (rows, in) as (k, n). OpenMP over panels when
 * parallel != 0. */
int sl_bf16_pack_t(const float *B, int64_t k, int64_t n, int64_t ldb, int parallel, sl_bf16_panels **out);
/* The same into panels already allocated for this shape (an error otherwise): a training step
 * repacks the weights it changed without new memory (and its page faults). */
int sl_bf16_repack(const sl_weight *W, int parallel, sl_bf16_panels *p);
int sl_bf16_repack_t(const float *B, int64_t k, int64_t n, int64_t ldb, int parallel, sl_bf16_panels *p);

/* C[M×n] = bf16(A[M×k]) · Wᵀ (+ C when accumulate), summed as above; A (M, k) with row stride
 * lda, C (M, n) with row stride ldc. parallel != 0: OpenMP over output tiles (from outside a
 * parallel region); path: SL_BF16_*. */
int sl_bf16_linear_nt(int64_t M, const float *A, int64_t lda, const sl_bf16_panels *W, float *C, int64_t ldc,
                      int accumulate, int parallel, int path);
/* sl_bf16_linear_nt(M, A, lda, W, C, ldc, 0, 1, path) after pro (sgemm.h; NULL: none) has written
 * A's rows: each row in the product's own region, just before it is rounded to bf16. */
int sl_bf16_linear_nt_prologue(int64_t M, float *A, int64_t lda, const sl_bf16_panels *W, float *C, int64_t ldc,
                               int path, const sl_row_prologue *pro);
/* Products of one input (the forward's q, k, v; gate, up): C[j] = A · W[j]ᵀ for n <= SL_SHARED_MAX
 * panels of the same K, in one parallel region, A rounded to bf16 once: bitwise n calls of
 * sl_bf16_linear_nt(M, A, lda, W[j], C[j], ldc[j], 0, 1, path). */
int sl_bf16_linear_nt_shared(int64_t M, const float *A, int64_t lda, int n, const sl_bf16_panels *const *W,
                             float *const *C, const int64_t *ldc, int path);

/* The same with A stored transposed: A (k, M) row-major with row stride lda >= M, so that
 * C[i][j] = sum_kk bf16(A[kk][i]) · W[j][kk], in the same order and with the same rounding as
 * sl_bf16_linear_nt on the transposed matrix (the same bits). A weight gradient dW (out × in) +=
 * dYᵀ X over `rows` rows is sl_bf16_linear_tn(out, dY, out, panels of X by sl_bf16_pack_t, dW, in, 1, ...). */
int sl_bf16_linear_tn(int64_t M, const float *A, int64_t lda, const sl_bf16_panels *W, float *C, int64_t ldc,
                      int accumulate, int parallel, int path);

/* The register-only vdpbf16ps rate of the calling thread (GFLOP/s, 2 flops per bf16 product)
 * over `iters` loop iterations of 24 independent chains, or -1 without AVX512-BF16: the peak the
 * benchmarks quote fractions of. */
double sl_bf16_peak_gflops(int64_t iters);

#endif

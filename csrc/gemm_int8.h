/* int8 linear layers (issue 24, item 3): C[M×N] = A[M×K] · Wᵀ (+ C) with the activations quantized
 * per row to int8 in blocks of 32 and the weight used as 8-bit integers with its own per-block
 * scales, as llama.cpp's Q8_0 × Q8_0 / Q4_1 × Q8_1 dot products do. Forward only.
 *
 * Activations (sl_int8_quantize_rows). Each row of A is cut into blocks of 32; per block
 *   amax = max |x|                      (exact; NaN ignored)
 *   d    = amax / 127.0f,  id = 127.0f / amax          (float32, correctly rounded)
 *   q_j  = round_half_even(clamp(x_j * id, -127, 127)) (int8 in [-127, 127])
 *   s    = sum_j q_j                    (int32, in [-4064, 4064])
 * with two special cases: a block holding a NaN or an infinity gets d = NaN and q = 0 (so every
 * output of that row is NaN, as an fp32 product would be NaN or infinite), and a block with
 * amax < 2^-100 (all zeros, or values no model activation has) gets d = 0 and q = 0. The scale d
 * is kept in float32, not in fp16 as llama.cpp's Q8_0/Q8_1 blocks store it: llama.cpp stores the
 * activation blocks in fp16 to halve their memory traffic in its dot products, but here the
 * quantized rows are transient and small next to the weights (K/32 floats per row), and fp32
 * avoids a second rounding of d (up to 2^-11 relative per block) and fp16's range limits (scales
 * under 6e-8 or over 65504 would flush or overflow). For fidelity the choice hardly matters: on
 * SmolLM2's q and v matrices (layers 1, 15, 29) a NumPy simulation of fp16 scales gives the same
 * relative error to 3 digits (e.g. 9.087e-3 here, 9.083e-3 with fp16 d); the rounding of the
 * quants dominates. It is range and simplicity. The rounding is ties-to-even on every path
 * (AVX-512 by embedded rounding, AVX2 by vroundps with an explicit rounding immediate, the
 * portable path by integer arithmetic), independent of the floating-point environment.
 *
 * Weights (sl_int8_weight_init, once per weight; the caller caches it on the model). Every
 * 32-element block becomes 32 unsigned bytes u_j, a float32 scale dw, optionally a float32 offset
 * mw, and one zero point zp per matrix, so that w_j = dw * (u_j - zp) + mw:
 *   Q8_0  u = q + 128, zp = 128, dw = d            exact (the file's own int8 quants)
 *   Q4_0  u = nibble,  zp = 8,   dw = d            exact
 *   Q4_1  u = nibble,  zp = 0,   dw = d, mw = m    exact
 *   Q5_0  u = 5 bits,  zp = 16,  dw = d            exact
 *   Q5_1  u = 5 bits,  zp = 0,   dw = d, mw = m    exact
 *   Q4_K  u = nibble,  zp = 0,   dw = d*sc, mw = -(dmin*m)   exact: each 32-element sub-block of
 *   Q5_K  u = 5 bits,  zp = 0,   dw = d*sc, mw = -(dmin*m)   a K-quant is affine in its quants
 *   Q6_K, F32, F16, BF16: requantized once, from the exact dequantized floats, with the
 *         activations' quantizer above (u = q + 128, zp = 128, dw = amax/127 in fp32): the only
 *         formats whose int8 form is not exact. The cost is that quantizer's rounding, at most
 *         dw/2 = amax/254 per element (Q6_K: a 32-block holds two 16-element sub-blocks with their
 *         own 8-bit scales, so its 6-bit quants times scale do not fit in 8 bits).
 * sl_int8_weight_supported(type) says which types (all of quant.h's) are accepted and
 * sl_int8_weight_exact(type) which are used exactly.
 *
 * The product. For output (m, n), with the integer block dot
 *   isum_b = sum_j u[n, 32b + j] * q[m, 32b + j] - zp * s[m, b]     (exact, int32)
 * the float part is, in this order, in float32 with separate multiplies and adds (no FMA):
 *   acc = 0
 *   for b = 0 .. K/32 - 1:
 *       acc = acc + (float)isum_b * (d[m, b] * dw[n, b])
 *       if the weight has offsets:  acc = acc + (d[m, b] * (float)s[m, b]) * mw[n, b]
 *   C[m, n] = accumulate ? C[m, n] + acc : acc
 * Every kernel below runs exactly these operations, and every output is computed by one thread
 * over all of K, so the result is bitwise the same on every path (AVX-512 VNNI, AVX-VNNI, AVX2,
 * portable) and for every thread count and tiling.
 *
 * Integer overflow: none. The VNNI kernel multiplies u (unsigned, <= 255) by q (signed, |q| <=
 * 127): every product is at most 255 * 127 = 32385 in magnitude, a block's 32 of them at most
 * 1,036,320, and the accumulator starts at -zp * s, |zp * s| <= 128 * 4064 = 520,192; so
 * |isum_b| <= 1,556,512 < 2^24: far from int32's 2^31, and exactly representable as a float, so
 * (float)isum_b is exact too. Each block's integer sum is converted and scaled on its own; nothing
 * accumulates in integers across blocks, so K (any multiple of 32, e.g. 8192) does not matter.
 * The AVX2 kernel (no VNNI) forms int16 pairs first (vpmaddubsw saturates at 32767): u <= 31 for
 * the 4/5-bit formats gives |pair| <= 2 * 31 * 127 = 7874; the int8-coded formats (zp = 128) use
 * the weight signed, |w| * sign(q, w) with |w| <= 128, so |pair| <= 2 * 128 * 127 = 32512; no
 * pair saturates, and the int32 sums are those above.
 *
 * Kernels, picked at run time (sl_int8_kernel), all giving the same bits:
 *   avx512_vnni  vpdpbusd on zmm, 6 rows × 32 outputs per register tile (sl_simd() avx512 and
 *                the CPU has AVX512-VNNI);
 *   avx_vnni     vpdpbusd on ymm (VEX), 3 rows × 16 outputs (sl_simd() >= avx2, AVX-VNNI: Intel
 *                Alder Lake and later, AMD Zen 5);
 *   avx2         vpmaddubsw + vpmaddwd, 3 rows × 16 outputs (any AVX2 CPU);
 *   generic      portable C (SINKLAB_SIMD=generic, other architectures): ~14 int GOP/s on one
 *                Zen 5 core, far below the fp32 SGEMM there; a precision dispatch should treat
 *                int8 on sl_int8_kernel() == SL_INT8_GENERIC as a fidelity mode, not a speed-up.
 *
 * Wiring into a precision dispatch (model.c): keep one sl_int8_weight per weight matrix (built
 * with sl_int8_weight_init on first use, freed with sl_int8_weight_free with the model; only for
 * weights sl_int8_weight_usable accepts, the others stay on sl_linear_nt), and call
 *     case SL_PRECISION_INT8: rc = sl_linear_nt_int8_packed(M, A, lda, &packed[w], C, ldc, acc, par);
 * in place of sl_linear_nt(M, A, lda, &w, C, ldc, acc, par); same arguments, same contract
 * (parallel != 0: OpenMP inside, call from outside a parallel region; parallel == 0: on the
 * calling thread, safe inside a region). sl_linear_nt_int8 does the same with a weight packed for
 * that one call (for tests and one-off products). Products that share an input (q/k/v, gate/up)
 * can quantize it once: sl_int8_acts_init, then sl_linear_nt_int8_acts per weight (same bits); on
 * SmolLM2 at T = 512 quantizing A is ~20 % of a 192-output product's time. */
#ifndef SL_GEMM_INT8_H
#define SL_GEMM_INT8_H

#include <stdint.h>

#include "sgemm.h"

enum { SL_INT8_BLOCK = 32, SL_INT8_PANEL = 32 /* outputs per packed weight panel */ };

/* 1 when sl_int8_weight_init accepts a weight of this SL_GGML_* type (every type quant.h decodes:
 * F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), else 0. */
int sl_int8_weight_supported(int type);
/* 1 when sl_int8_weight_init would accept W (type supported, consistent sizes, cols a multiple of
 * 32), else 0; sets no error. A precision dispatch keeps sl_linear_nt for the others (e.g. the
 * tiny test models' 232-wide layers). */
int sl_int8_weight_usable(const sl_weight *W);
/* 1 when the int8 form of this type is its own quants (no requantization; see above), else 0. */
int sl_int8_weight_exact(int type);

/* Quantizes M rows of K floats (row stride lda >= K; K a positive multiple of 32) as described
 * above: q (M×K int8, row stride K), d (M×K/32 float32) and s (M×K/32 int32, row stride K/32).
 * OpenMP over rows when parallel != 0. Returns SL_OK or SL_ERR_VALUE (bad sizes, NULL). */
int sl_int8_quantize_rows(int64_t M, int64_t K, const float *A, int64_t lda, int8_t *q, float *d, int32_t *s,
                          int parallel);

/* A weight in the kernel's layout, for N = rows outputs and K = cols inputs. Panels of 32
 * outputs (the last padded with zero weights and scales); in panel p, block b, the 1024 bytes
 * u are [k-group g of 4 inputs (8)][output i (32)][input 4g + t (4)], and dw (mw) hold the
 * panel's 32 scales (offsets) of that block. Owns its memory (about K bytes per output, ~2× a
 * Q4 file's size, ~1/4 of fp32). */
typedef struct {
    int type;               /* the source weight's SL_GGML_* type */
    int zp;                 /* zero point: 0, 8, 16 or 128 */
    int has_min;            /* mw is used */
    int exact;              /* sl_int8_weight_exact(type) */
    int64_t rows, cols;     /* N, K */
    int64_t nb, npanels;    /* K/32, ceil(N/32) */
    uint8_t *u;             /* npanels * nb * 1024 bytes */
    float *dw;              /* npanels * nb * 32 */
    float *mw;              /* the same, or NULL when !has_min */
} sl_int8_weight;

/* Packs W (checked as sl_linear_nt checks it; rows, cols and row_bytes consistent, cols a multiple
 * of 32, type supported). OpenMP over panels when parallel != 0. On failure *pw is left empty
 * (safe to free) and the core's error code is returned (SL_ERR_VALUE, SL_ERR_MEMORY). */
int sl_int8_weight_init(sl_int8_weight *pw, const sl_weight *W, int parallel);
/* Frees what init allocated and empties *pw; safe on an empty or zeroed struct and on NULL. */
void sl_int8_weight_free(sl_int8_weight *pw);

/* C[M×N] = A[M×K] · Wᵀ (+ C) in int8 as above, W packed. Checks: pw packed, M >= 0 (0: nothing),
 * A and C non-NULL, lda >= K, ldc >= N; errors return SL_ERR_VALUE, allocation failures
 * SL_ERR_MEMORY; never writes C on an error. */
int sl_linear_nt_int8_packed(int64_t M, const float *A, int64_t lda, const sl_int8_weight *pw, float *C,
                             int64_t ldc, int accumulate, int parallel);
/* sl_linear_nt_int8_packed(M, A, lda, pw, C, ldc, 0, 1) after pro (sgemm.h; NULL: none) has
 * written A's rows: each row in the product's own region, just before it is quantized. */
int sl_linear_nt_int8_prologue(int64_t M, float *A, int64_t lda, const sl_int8_weight *pw, float *C, int64_t ldc,
                               const sl_row_prologue *pro);
/* Products of one input (the forward's q, k, v; gate, up): C[j] = A · pw[j]ᵀ for n <= SL_SHARED_MAX
 * packed weights of the same K, in one parallel region, A quantized once: bitwise n calls of
 * sl_linear_nt_int8_packed(M, A, lda, pw[j], C[j], ldc[j], 0, 1). */
int sl_linear_nt_int8_shared(int64_t M, const float *A, int64_t lda, int n, const sl_int8_weight *const *pw,
                             float *const *C, const int64_t *ldc);

/* Quantized activations, to share between the products that read the same input (q, k and v;
 * gate and up): quantize once with sl_int8_acts_init, then one sl_linear_nt_int8_acts per weight.
 * Bitwise the same results as sl_linear_nt_int8_packed on A. */
typedef struct {
    int64_t M, K;
    int8_t *q;  /* M×K */
    float *d;   /* M×K/32 */
    int32_t *s; /* M×K/32 */
} sl_int8_acts;
/* Quantizes A (M×K, row stride lda >= K, K a positive multiple of 32) into qa, which owns the
 * buffers; on failure qa is left empty. */
int sl_int8_acts_init(sl_int8_acts *qa, int64_t M, int64_t K, const float *A, int64_t lda, int parallel);
void sl_int8_acts_free(sl_int8_acts *qa);
/* C[M×N] = A·Wᵀ (+ C) from quantized activations (qa->K must be pw->cols). */
int sl_linear_nt_int8_acts(const sl_int8_acts *qa, const sl_int8_weight *pw, float *C, int64_t ldc, int accumulate,
                           int parallel);

/* The same signature and contract as sl_linear_nt (sgemm.h), in int8: packs W for this call, runs
 * sl_linear_nt_int8_packed, frees the packed copy. */
int sl_linear_nt_int8(int64_t M, const float *A, int64_t lda, const sl_weight *W, float *C, int64_t ldc,
                      int accumulate, int parallel);

/* The kernels, best first. */
enum { SL_INT8_GENERIC = 0, SL_INT8_AVX2 = 1, SL_INT8_AVXVNNI = 2, SL_INT8_VNNI512 = 3 };
/* The kernel in use now: the best one this build has, the CPU supports and sl_simd() allows. */
int sl_int8_kernel(void);
/* Test hook: caps the choice at kernel k (SL_INT8_VNNI512 or an out-of-range k: no cap) and
 * returns the kernel now in use. Process-wide; not for concurrent use. */
int sl_int8_force_kernel(int k);
/* "avx512_vnni", "avx_vnni", "avx2" or "generic". */
const char *sl_int8_kernel_name(int k);

/* Register-only vpdpbusd throughput on the calling thread, for kernel SL_INT8_VNNI512 (`iters`
 * iterations of 24 independent zmm vpdpbusd, each 16 × 4 multiply-adds = 128 integer ops) or
 * SL_INT8_AVXVNNI (12 independent ymm ones, 64 ops each). Writes the seconds taken and returns
 * the integer ops done (0, with *seconds = 0, for another kernel or a CPU without it). */
double sl_int8_peak(int kernel, int64_t iters, double *seconds);

#endif

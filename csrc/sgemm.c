/* SGEMM for linear layers and their backward pass: C[M×N] = op(A)·op(B) (+ C), all row-major,
 * A stored (M,K) or (K,M), B stored (N,K) or (K,N) (see sgemm.h).
 *
 * BLIS-style: K is cut into blocks of about KC, N into task-sized blocks (at most NC wide), M into
 * blocks of MC rows. For each block, B is packed into NR-wide panels (for every k, NR consecutive
 * outputs) and A into MR-row panels (for every k, MR consecutive rows), so the micro-kernel reads
 * both with unit stride. The layout only changes the packers: an operand stored with K along its
 * rows ((M,K) A, (N,K) B) is transposed while packing, one stored with K down its columns ((K,M) A,
 * (K,N) B) is copied row by row. Everything after packing is the same code for all four layouts.
 * The AVX-512 kernel can also broadcast A straight from its (M,K) storage (NT, NN), which saves
 * packing A: that costs most at T = 128 with narrow N, where few B panels share each A panel.
 * A weight kept in its file's format (sl_linear_nt/nn) changes only the packer of B too: it decodes
 * the K block's quant blocks of 8 rows at a time into a small buffer and transposes them into the
 * panel (NT), or decodes each row's run of blocks and copies it into the panels (NN), with the
 * decoders of sl_dequantize, so the kernel sees the floats dequantize-then-multiply would.
 *
 * Each SIMD level has its own tile and blocking (sgemm_level below):
 *   generic  6×16, vector extension (SSE2 / NEON), separate multiply and add;
 *   AVX2     6×16 in 12 ymm accumulators (+ 2 B vectors + 1 broadcast of A = 15 of 16 registers);
 *   AVX-512 14×32 in 28 zmm accumulators (+ 2 B vectors + 1 broadcast = 31 of 32 registers), ragged
 *            right edges by masked loads and stores instead of a copy of the tile.
 *
 * Determinism: each C element is one chain c = c + a_k·b_k over k = 0..K-1 in order, starting
 * from 0 (or from C when accumulating). K blocks are walked in order and each block continues the
 * chain from the value left in C, so the block sizes, the M/N tiling and the thread count never
 * change the result. Threads own disjoint tiles of C. The AVX2 and AVX-512 kernels run the same
 * fused multiply-add chain, so they give the same bits; the generic path runs it with a separate
 * multiply and add, hence "equal to rounding". */
#include "sgemm.h"

#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define SL_SGEMM_CACHE 1
#else
#define SL_SGEMM_CACHE 0
#endif

#include "cpu.h"
#include "quant.h"
#include "sl_common.h"

#if defined(_OPENMP) && (!defined(SL_HAVE_OPENMP) || SL_HAVE_OPENMP)
#include <omp.h>
#define SL_SGEMM_OMP 1
#else
#define SL_SGEMM_OMP 0
#endif

/* SL_SGEMM_PORTABLE_ONLY builds without the x86 kernels, to check the other platforms' path. */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(SL_SGEMM_PORTABLE_ONLY)
#include <immintrin.h>
#define SL_SGEMM_X86 1
#define SL_AVX2 __attribute__((target("avx2,fma")))
#define SL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2")))
#else
#define SL_SGEMM_X86 0
#endif

/* Tiles and blocking of the generic and AVX2 paths. */
enum {
    MR = 6,    /* rows of the register tile */
    NR = 16,   /* columns of the register tile: two ymm vectors */
    KC = 256,  /* K block: one packed B panel (KC×NR floats, 16 KiB) stays in L1 */
    MC = 96,   /* M block: the packed A block (MC×KC) stays in L2 */
    NC = 512,  /* widest N block of one task: its packed B (NC×KC, 512 KiB) stays in L2 */
};

/* The AVX-512 path. The SL_*512 macros exist only to sweep the blocking from a test build
 * (-DSL_KC512=...); on Zen 5 MR 12 or 14, KC 192-512 and MC 112-168 measured within noise of each
 * other, because the core's FMA rate in flops is the same for zmm as for ymm and the kernel runs at
 * ~98% of it once its operands are packed. */
#ifndef SL_MR512
#define SL_MR512 14
#endif
#ifndef SL_KC512
#define SL_KC512 256
#endif
#ifndef SL_MC512
#define SL_MC512 112
#endif
#ifndef SL_NC512
#define SL_NC512 512
#endif
enum {
    MR512 = SL_MR512, /* rows of the register tile (at most 14): 2 accumulators each, 28 of 32 zmm */
    NR512 = 32,       /* columns: two zmm vectors */
    KC512 = SL_KC512, /* one packed B panel (KC512×32 floats, 32 KiB) stays in Zen 5's 48 KiB L1 */
    MC512 = SL_MC512, /* the A block (MC512×KC512, 112 KiB) stays in L2 */
    NC512 = SL_NC512, /* widest N block of one task: its packed B (512 KiB) stays in L2 */
};
_Static_assert(MR512 >= 1 && MR512 <= 14, "the AVX-512 kernel has accumulators for 14 rows");
_Static_assert(KC512 % 8 == 0 && MC512 % MR512 == 0, "K blocks feed 8×8 transposes; M blocks hold whole tiles");

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/* ------------------------------------------------------------------------------------------
 * Packing. A panel of width W holds rows [0, rows) of src (row stride ld) transposed: for every
 * k < kb, W consecutive floats dst[k*W + i] = src[i*ld + k], zero for i >= rows. */

static void pack_panel_generic(const float *src, int64_t ld, int64_t rows, int64_t width, int64_t kb,
                               float *dst) {
    for (int64_t k = 0; k < kb; k++) {
        for (int64_t i = 0; i < width; i++) dst[k * width + i] = i < rows ? src[i * ld + k] : 0.0f;
    }
}

#if SL_SGEMM_X86
/* In-register 8×8 transpose: r[i] = row i in, r[k] = column k out. */
SL_AVX2 static inline __attribute__((always_inline)) void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* A full NR=16-row panel, 8×8 blocks at a time. */
SL_AVX2 static void pack_panel16_avx2(const float *src, int64_t ld, int64_t kb, float *dst) {
    int64_t k = 0;
    for (; k + 8 <= kb; k += 8) {
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (h * 8 + i) * ld + k);
            transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_store_ps(dst + (k + i) * NR + h * 8, r[i]);
        }
    }
    for (; k < kb; k++)
        for (int i = 0; i < NR; i++) dst[k * NR + i] = src[i * ld + k];
}

/* A full MR=6-row panel: transpose 8×8 with two zero rows, keep 6 of each column. */
SL_AVX2 static void pack_panel6_avx2(const float *src, int64_t ld, int64_t kb, float *dst) {
    int64_t k = 0;
    for (; k + 8 <= kb; k += 8) {
        __m256 r[8];
        for (int i = 0; i < 6; i++) r[i] = _mm256_loadu_ps(src + i * ld + k);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8(r);
        for (int i = 0; i < 8; i++) {
            float *d = dst + (k + i) * MR;
            _mm_storeu_ps(d, _mm256_castps256_ps128(r[i]));
            _mm_storel_pi((__m64 *)(void *)(d + 4), _mm256_extractf128_ps(r[i], 1));
        }
    }
    for (; k < kb; k++)
        for (int i = 0; i < MR; i++) dst[k * MR + i] = src[i * ld + k];
}

/* Any panel (rows <= width) for the AVX-512 path: groups of 8 rows transposed 8×8 at a time, rows
 * past `rows` read as zero, each group's columns stored with a mask (the last group of a 14-wide
 * panel keeps 6 of 8). One group walks all of k before the next starts: only its 8 source rows
 * are live in L1 at a time. Walking k outside the groups would keep all 32 rows of a B panel live,
 * and when they are 4 KiB apart (K = 1024, 2048) they share one L1 set, more than its ways, so
 * each line would be fetched twice. */
SL_AVX512 static void pack_panel_avx512(const float *src, int64_t ld, int64_t rows, const int width, int64_t kb,
                                        float *dst) {
    const int64_t k8 = kb & ~(int64_t)7;
    for (int g = 0; g < width; g += 8) {
        const __mmask8 keep = (__mmask8)(width - g >= 8 ? 0xFF : (1u << (width - g)) - 1u);
        for (int64_t k = 0; k < k8; k += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = g + i < rows ? _mm256_loadu_ps(src + (g + i) * ld + k) : _mm256_setzero_ps();
            transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_mask_storeu_ps(dst + (k + i) * width + g, keep, r[i]);
        }
    }
    for (int64_t k = k8; k < kb; k++)
        for (int i = 0; i < width; i++) dst[k * width + i] = i < rows ? src[i * ld + k] : 0.0f;
}
#endif

/* A panel from a k-major source (element (i, k) at src[k*ld + i]): for every k the panel's row is
 * already `rows` consecutive floats of src, so packing is a straight copy plus zero padding.
 * Inlined with a constant width, so the full-panel copy is a fixed-size move. */
static inline __attribute__((always_inline)) void pack_panel_copy(const float *restrict src, int64_t ld,
                                                                  int64_t rows, const int64_t width, int64_t kb,
                                                                  float *restrict dst) {
    if (rows == width) {
        for (int64_t k = 0; k < kb; k++) memcpy(dst + k * width, src + k * ld, (size_t)width * sizeof(float));
    } else {
        for (int64_t k = 0; k < kb; k++) {
            memcpy(dst + k * width, src + k * ld, (size_t)rows * sizeof(float));
            memset(dst + k * width + rows, 0, (size_t)(width - rows) * sizeof(float));
        }
    }
}

/* A whole block from a k-major source, KT rows of k at a time across all its panels: the source
 * is read in short runs of KT rows that each span the block's width, rather than panel by panel
 * down all kb rows (kb pages apart when ld is large, e.g. the (T, 49152) cotangent in the tied
 * embedding's gradient: a TLB miss per row and panel). Inlined with a constant width. */
static inline __attribute__((always_inline)) void pack_block_kmajor(const float *src, int64_t ld, int64_t rows,
                                                                    const int64_t width, int64_t kb,
                                                                    float *dst) {
    enum { KT = 8 };
    for (int64_t k0 = 0; k0 < kb; k0 += KT) {
        int64_t kt = min64(KT, kb - k0);
        for (int64_t i0 = 0; i0 < rows; i0 += width)
            pack_panel_copy(src + k0 * ld + i0, ld, min64(width, rows - i0), width, kt, dst + i0 * kb + k0 * width);
    }
}

/* Block packers: a rows × kb block of the operand into ceil(rows/width) panels of the level's
 * width (MR for A, NR for B). kmajor == 0: element (i, k) is src[i*ld + k] (A stored (M,K), B
 * stored (N,K)): transposing pack. kmajor != 0: element (i, k) is src[k*ld + i] (A stored (K,M),
 * B stored (K,N)): straight copy. Either way panel p holds dst[p*width*kb + k*width + i], so one
 * micro-kernel serves all layouts. A packer is all a new storage format of B needs (e.g. one that
 * dequantizes weights while packing). */
typedef void (*pack_fn)(const float *src, int64_t ld, int kmajor, int64_t rows, int64_t kb, float *dst);

/* Transposing pack of full panels by `full` (NULL: none), partial ones generically. */
static inline __attribute__((always_inline)) void pack_rows(const float *src, int64_t ld, int64_t rows,
                                                            const int64_t width, int64_t kb, float *dst,
                                                            void (*full)(const float *, int64_t, int64_t,
                                                                         float *)) {
    for (int64_t i0 = 0; i0 < rows; i0 += width) {
        int64_t r = min64(width, rows - i0);
        if (full && r == width)
            full(src + i0 * ld, ld, kb, dst + i0 * kb);
        else
            pack_panel_generic(src + i0 * ld, ld, r, width, kb, dst + i0 * kb);
    }
}

static void pack_a_generic(const float *src, int64_t ld, int kmajor, int64_t rows, int64_t kb, float *dst) {
    if (kmajor)
        pack_block_kmajor(src, ld, rows, MR, kb, dst);
    else
        pack_rows(src, ld, rows, MR, kb, dst, NULL);
}

static void pack_b_generic(const float *src, int64_t ld, int kmajor, int64_t rows, int64_t kb, float *dst) {
    if (kmajor)
        pack_block_kmajor(src, ld, rows, NR, kb, dst);
    else
        pack_rows(src, ld, rows, NR, kb, dst, NULL);
}

#if SL_SGEMM_X86
static void pack_a_avx2(const float *src, int64_t ld, int kmajor, int64_t rows, int64_t kb, float *dst) {
    if (kmajor)
        pack_block_kmajor(src, ld, rows, MR, kb, dst);
    else
        pack_rows(src, ld, rows, MR, kb, dst, pack_panel6_avx2);
}

static void pack_b_avx2(const float *src, int64_t ld, int kmajor, int64_t rows, int64_t kb, float *dst) {
    if (kmajor)
        pack_block_kmajor(src, ld, rows, NR, kb, dst);
    else
        pack_rows(src, ld, rows, NR, kb, dst, pack_panel16_avx2);
}

static void pack_a_avx512(const float *src, int64_t ld, int kmajor, int64_t rows, int64_t kb, float *dst) {
    if (kmajor) {
        pack_block_kmajor(src, ld, rows, MR512, kb, dst);
        return;
    }
    for (int64_t i0 = 0; i0 < rows; i0 += MR512)
        pack_panel_avx512(src + i0 * ld, ld, min64(MR512, rows - i0), MR512, kb, dst + i0 * kb);
}

static void pack_b_avx512(const float *src, int64_t ld, int kmajor, int64_t rows, int64_t kb, float *dst) {
    if (kmajor) {
        pack_block_kmajor(src, ld, rows, NR512, kb, dst);
        return;
    }
    for (int64_t i0 = 0; i0 < rows; i0 += NR512)
        pack_panel_avx512(src + i0 * ld, ld, min64(NR512, rows - i0), NR512, kb, dst + i0 * kb);
}
#endif

/* Columns [0, 8) of a panel `width` wide from 8 decoded weight rows (row i at src + i*ld, k along
 * the row; rows from nv on read as zero): dst[k*width + i] = src[i*ld + k] for k < kb. The weight
 * packer (below) decodes 8 rows of a K block into a small buffer and transposes them with this. */
typedef void (*pack8_fn)(const float *src, int64_t ld, int nv, int64_t kb, float *dst, int64_t width);

static void pack8_generic(const float *src, int64_t ld, int nv, int64_t kb, float *dst, int64_t width) {
    for (int64_t k = 0; k < kb; k++)
        for (int i = 0; i < 8; i++) dst[k * width + i] = i < nv ? src[i * ld + k] : 0.0f;
}

#if SL_SGEMM_X86
SL_AVX2 static void pack8_avx2(const float *src, int64_t ld, int nv, int64_t kb, float *dst, int64_t width) {
    const int64_t k8 = kb & ~(int64_t)7;
    for (int64_t k = 0; k < k8; k += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; i++) r[i] = i < nv ? _mm256_loadu_ps(src + i * ld + k) : _mm256_setzero_ps();
        transpose8(r);
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + (k + i) * width, r[i]);
    }
    for (int64_t k = k8; k < kb; k++)
        for (int i = 0; i < 8; i++) dst[k * width + i] = i < nv ? src[i * ld + k] : 0.0f;
}
#endif

/* ------------------------------------------------------------------------------------------
 * Micro-kernels: c[i][j] for i < mr, j < nr continues its chain over kc packed steps:
 * c = (load ? c : 0) + a[k*MRl+i]·b[k*NRl+j] for k = 0..kc-1 in order (MRl, NRl: the level's
 * tile). Rows past mr and columns past nr are computed from the zero padding and not stored. */

typedef void (*ukernel_fn)(int64_t kc, const float *a, int64_t a_ld, const float *b, float *c, int64_t ldc,
                           int mr, int nr, int load);

/* The 6×16 kernels handle a ragged right edge (nr < NR) on a copy of the full tile. */
#define SL_RAGGED_TILE(full_call)                                                                       \
    do {                                                                                                \
        if (nr == NR) {                                                                                 \
            full_call(c, ldc);                                                                          \
        } else {                                                                                        \
            float tile[MR * NR];                                                                        \
            memset(tile, 0, sizeof tile);                                                               \
            if (load)                                                                                   \
                for (int i = 0; i < mr; i++) memcpy(tile + i * NR, c + i * ldc, (size_t)nr * sizeof(float)); \
            full_call(tile, NR);                                                                        \
            for (int i = 0; i < mr; i++) memcpy(c + i * ldc, tile + i * NR, (size_t)nr * sizeof(float));  \
        }                                                                                               \
    } while (0)

#if defined(__GNUC__)
/* GCC/Clang vector extension: SSE2 on any x86-64, NEON on aarch64. 16-byte aligned: packed B is. */
typedef float v4f __attribute__((vector_size(16)));

static void ukernel_generic_full(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                                 int64_t ldc, int mr, int load) {
    /* Two passes over 8 columns each: 12 accumulators fit the 16 registers of SSE2. */
    for (int h = 0; h < NR; h += 8) {
        v4f acc[MR][2];
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < 2; v++) {
                acc[i][v] = (v4f){0.0f, 0.0f, 0.0f, 0.0f};
                if (load && i < mr) memcpy(&acc[i][v], c + i * ldc + h + 4 * v, sizeof(v4f));
            }
        for (int64_t k = 0; k < kc; k++) {
            const v4f b0 = *(const v4f *)(b + k * NR + h), b1 = *(const v4f *)(b + k * NR + h + 4);
            for (int i = 0; i < MR; i++) {
                const float ai = a[k * MR + i];
                acc[i][0] += ai * b0;
                acc[i][1] += ai * b1;
            }
        }
        for (int i = 0; i < mr; i++) memcpy(c + i * ldc + h, acc[i], 2 * sizeof(v4f));
    }
}
#else
static void ukernel_generic_full(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                                 int64_t ldc, int mr, int load) {
    float acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = load ? c[i * ldc + j] : 0.0f;
    for (int64_t k = 0; k < kc; k++)
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < NR; j++) acc[i][j] += a[k * MR + i] * b[k * NR + j];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NR; j++) c[i * ldc + j] = acc[i][j];
}
#endif

/* a_ld: always 0 (packed A) on this path. */
static void ukernel_generic(int64_t kc, const float *a, int64_t a_ld, const float *b, float *c, int64_t ldc,
                            int mr, int nr, int load) {
    (void)a_ld;
#define SL_CALL(cc, ld) ukernel_generic_full(kc, a, b, cc, ld, mr, load)
    SL_RAGGED_TILE(SL_CALL);
#undef SL_CALL
}

#if SL_SGEMM_X86
/* Inlined with a constant mr, so rows past mr cost nothing. */
SL_AVX2 static inline __attribute__((always_inline)) void ukernel_avx2_rows(const int mr, int64_t kc,
                                                                          const float *restrict a,
                                                                          const float *restrict b,
                                                                          float *restrict c, int64_t ldc,
                                                                          int load) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define SL_LOAD_ROW(i)                                    \
    if (mr > i) {                                         \
        c##i##0 = _mm256_loadu_ps(c + (i) * ldc);         \
        c##i##1 = _mm256_loadu_ps(c + (i) * ldc + 8);     \
    }
    if (load) {
        SL_LOAD_ROW(0) SL_LOAD_ROW(1) SL_LOAD_ROW(2) SL_LOAD_ROW(3) SL_LOAD_ROW(4) SL_LOAD_ROW(5)
    }
#undef SL_LOAD_ROW
#define SL_FMA_ROW(i)                                     \
    if (mr > i) {                                         \
        __m256 ai = _mm256_broadcast_ss(a + (i));         \
        c##i##0 = _mm256_fmadd_ps(ai, b0, c##i##0);       \
        c##i##1 = _mm256_fmadd_ps(ai, b1, c##i##1);       \
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        SL_FMA_ROW(0) SL_FMA_ROW(1) SL_FMA_ROW(2) SL_FMA_ROW(3) SL_FMA_ROW(4) SL_FMA_ROW(5)
        a += MR;
        b += NR;
    }
#undef SL_FMA_ROW
#define SL_STORE_ROW(i)                                   \
    if (mr > i) {                                         \
        _mm256_storeu_ps(c + (i) * ldc, c##i##0);         \
        _mm256_storeu_ps(c + (i) * ldc + 8, c##i##1);     \
    }
    SL_STORE_ROW(0) SL_STORE_ROW(1) SL_STORE_ROW(2) SL_STORE_ROW(3) SL_STORE_ROW(4) SL_STORE_ROW(5)
#undef SL_STORE_ROW
}

SL_AVX2 static void ukernel_avx2_full(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr,
                                      int load) {
    switch (mr) {
    case 6: ukernel_avx2_rows(6, kc, a, b, c, ldc, load); break;
    case 5: ukernel_avx2_rows(5, kc, a, b, c, ldc, load); break;
    case 4: ukernel_avx2_rows(4, kc, a, b, c, ldc, load); break;
    case 3: ukernel_avx2_rows(3, kc, a, b, c, ldc, load); break;
    case 2: ukernel_avx2_rows(2, kc, a, b, c, ldc, load); break;
    default: ukernel_avx2_rows(1, kc, a, b, c, ldc, load); break;
    }
}

/* a_ld: always 0 (packed A) on this path. */
static void ukernel_avx2(int64_t kc, const float *a, int64_t a_ld, const float *b, float *c, int64_t ldc, int mr,
                         int nr, int load) {
    (void)a_ld;
#define SL_CALL(cc, ld) ukernel_avx2_full(kc, a, b, cc, ld, mr, load)
    SL_RAGGED_TILE(SL_CALL);
#undef SL_CALL
}

/* 14×32 in zmm registers, inlined with a constant mr. Columns past nr are masked off on load and
 * store (masked-off lanes never fault), so a ragged right edge needs no copy. */
SL_AVX512 static inline __attribute__((always_inline)) void ukernel_avx512_rows(const int mr, int64_t kc,
                                                                              const float *restrict a,
                                                                              const int64_t ars,
                                                                              const int64_t aks,
                                                                              const float *restrict b,
                                                                              float *restrict c, int64_t ldc,
                                                                              __mmask16 m0, __mmask16 m1,
                                                                              int load) {
    __m512 c0_0 = _mm512_setzero_ps(), c0_1 = c0_0, c1_0 = c0_0, c1_1 = c0_0, c2_0 = c0_0, c2_1 = c0_0;
    __m512 c3_0 = c0_0, c3_1 = c0_0, c4_0 = c0_0, c4_1 = c0_0, c5_0 = c0_0, c5_1 = c0_0;
    __m512 c6_0 = c0_0, c6_1 = c0_0, c7_0 = c0_0, c7_1 = c0_0, c8_0 = c0_0, c8_1 = c0_0;
    __m512 c9_0 = c0_0, c9_1 = c0_0, c10_0 = c0_0, c10_1 = c0_0, c11_0 = c0_0, c11_1 = c0_0;
    __m512 c12_0 = c0_0, c12_1 = c0_0, c13_0 = c0_0, c13_1 = c0_0;
#define SL_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define SL_LOAD_ROW(i)                                                \
    if (mr > i) {                                                     \
        c##i##_0 = _mm512_maskz_loadu_ps(m0, c + (i) * ldc);          \
        c##i##_1 = _mm512_maskz_loadu_ps(m1, c + (i) * ldc + 16);     \
    }
    if (load) {
        SL_ROWS(SL_LOAD_ROW)
    }
#undef SL_LOAD_ROW
#define SL_FMA_ROW(i)                                     \
    if (mr > i) {                                         \
        __m512 ai = _mm512_set1_ps(a[(i) * ars]);         \
        c##i##_0 = _mm512_fmadd_ps(ai, b0, c##i##_0);     \
        c##i##_1 = _mm512_fmadd_ps(ai, b1, c##i##_1);     \
    }
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
        SL_ROWS(SL_FMA_ROW)
        a += aks;
        b += NR512;
    }
#undef SL_FMA_ROW
#define SL_STORE_ROW(i)                                           \
    if (mr > i) {                                                 \
        _mm512_mask_storeu_ps(c + (i) * ldc, m0, c##i##_0);       \
        _mm512_mask_storeu_ps(c + (i) * ldc + 16, m1, c##i##_1);  \
    }
    SL_ROWS(SL_STORE_ROW)
#undef SL_STORE_ROW
#undef SL_ROWS
}

/* a_ld == 0: A packed (element (i, k) at a[k*MR512 + i]); a_ld > 0: A read in place from its
 * (M, K) storage (element (i, k) at a[i*a_ld + k]), which saves packing it when N is narrow. */
SL_AVX512 static void ukernel_avx512(int64_t kc, const float *a, int64_t a_ld, const float *b, float *c,
                                     int64_t ldc, int mr, int nr, int load) {
    const __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1u);
    const __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xFFFFu : nr <= 16 ? 0u : (1u << (nr - 16)) - 1u);
    if (a_ld == 0) {
        switch (mr) {
#define SL_CASE(n) \
    case n: ukernel_avx512_rows(n, kc, a, 1, MR512, b, c, ldc, m0, m1, load); break;
            SL_CASE(14) SL_CASE(13) SL_CASE(12) SL_CASE(11) SL_CASE(10) SL_CASE(9) SL_CASE(8)
            SL_CASE(7) SL_CASE(6) SL_CASE(5) SL_CASE(4) SL_CASE(3) SL_CASE(2)
#undef SL_CASE
        default: ukernel_avx512_rows(1, kc, a, 1, MR512, b, c, ldc, m0, m1, load); break;
        }
    } else {
        switch (mr) {
#define SL_CASE(n) \
    case n: ukernel_avx512_rows(n, kc, a, a_ld, 1, b, c, ldc, m0, m1, load); break;
            SL_CASE(14) SL_CASE(13) SL_CASE(12) SL_CASE(11) SL_CASE(10) SL_CASE(9) SL_CASE(8)
            SL_CASE(7) SL_CASE(6) SL_CASE(5) SL_CASE(4) SL_CASE(3) SL_CASE(2)
#undef SL_CASE
        default: ukernel_avx512_rows(1, kc, a, a_ld, 1, b, c, ldc, m0, m1, load); break;
        }
    }
}
#endif

/* ------------------------------------------------------------------------------------------
 * Blocking and threads. */

/* One SIMD level's tile, blocking, kernel and packers. */
typedef struct {
    int mr, nr;        /* register tile */
    int64_t kc, mc, nc; /* target K block, M block, widest N block of a task */
    ukernel_fn uk;
    pack_fn pack_a, pack_b;
    int direct_a;  /* the kernel can read an (M, K) A in place (a_ld > 0) */
    pack8_fn pack8; /* transposes decoded weight rows into B panels */
} sgemm_level;

static const sgemm_level LEVEL_GENERIC = {MR, NR, KC, MC, NC, ukernel_generic, pack_a_generic, pack_b_generic, 0,
                                          pack8_generic};
#if SL_SGEMM_X86
static const sgemm_level LEVEL_AVX2 = {MR, NR, KC, MC, NC, ukernel_avx2, pack_a_avx2, pack_b_avx2, 0,
                                       pack8_avx2};
static const sgemm_level LEVEL_AVX512 = {MR512, NR512, KC512, MC512, NC512, ukernel_avx512, pack_a_avx512,
                                         pack_b_avx512, 1, pack8_avx2};
#endif

typedef struct {
    int64_t M, N, K, lda, ldb, ldc, kc;
    const float *A, *B;
    float *C;
    int a_kmajor, b_kmajor; /* A stored (K,M) (trans_a); B stored (K,N) (!trans_b) */
    int accumulate;
    int a_direct; /* A (M, K) is read in place, not packed */
    const sgemm_level *lv;
    /* B as a weight in its file's format (B == NULL), decoded while packing: */
    const uint8_t *wdata;  /* row r of W at wdata + r * wrow_bytes */
    int64_t wrow_bytes, wbe, wbb; /* bytes per row, elements and bytes per block */
    sl_dequant_fn wdec;
} sgemm_job;

/* ------------------------------------------------------------------------------------------
 * Packing B from a weight W (rows, cols) kept in its file's format. Each decoded float is the one
 * sl_dequantize gives (the same decoder), put where the float packer would put it, so the kernel
 * runs the same chains on the same operands: the products are bitwise dequantize-then-multiply. */

/* NT (B = W, N = rows, K = cols): rows [n0, n0+nb), K block [k0, k0+kb) of whole quant blocks
 * (kc is a multiple of the block length), decoded 8 rows at a time into tmp (8 × kb floats, stays
 * in L1) and transposed into the panels. */
/* Asks for bytes [p, p + n) in cache ahead of their decoding. The rows of a K block are a row
 * apart: no hardware prefetcher follows, and one row's decoding is too long for out-of-order
 * execution to reach the next row's loads, so without this every row waits for memory. */
static inline void prefetch_run(const uint8_t *p, int64_t n) {
    for (int64_t o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, 3);
    __builtin_prefetch(p + n - 1, 0, 3);
}

enum { PREFETCH_ROWS = 8 }; /* how many rows ahead of the decoding the prefetch runs */

static void pack_weight_nt(const sgemm_job *g, int64_t n0, int64_t nb, int64_t k0, int64_t kb, float *dst,
                           float *tmp) {
    const int64_t width = g->lv->nr, nblocks = kb / g->wbe, run = nblocks * g->wbb;
    const uint8_t *base = g->wdata + n0 * g->wrow_bytes + k0 / g->wbe * g->wbb;
    for (int64_t j = 0; j < min64(PREFETCH_ROWS, nb); j++) prefetch_run(base + j * g->wrow_bytes, run);
    for (int64_t p0 = 0; p0 < nb; p0 += width) {
        const int64_t r = min64(width, nb - p0);
        for (int64_t i0 = 0; i0 < width; i0 += 8) {
            const int nv = r <= i0 ? 0 : (int)min64(8, r - i0);
            for (int i = 0; i < nv; i++) {
                const int64_t j = p0 + i0 + i;
                if (j + PREFETCH_ROWS < nb) prefetch_run(base + (j + PREFETCH_ROWS) * g->wrow_bytes, run);
                g->wdec(base + j * g->wrow_bytes, tmp + i * kb, nblocks);
            }
            g->lv->pack8(tmp, kb, nv, kb, dst + p0 * kb + i0, width);
        }
    }
}

/* NN (B = W, K = rows, N = cols): for each row k0..k0+kb-1, the blocks covering columns
 * [n0, n0+nb) decoded into tmp (at most nb + 2 blocks), then copied into the panels' rows. */
static void pack_weight_nn(const sgemm_job *g, int64_t n0, int64_t nb, int64_t k0, int64_t kb, float *dst,
                           float *tmp) {
    const int64_t width = g->lv->nr, be = g->wbe;
    const int64_t b0 = n0 / be, nblocks = ceil_div(n0 + nb, be) - b0;
    const float *run = tmp + (n0 - b0 * be);
    const uint8_t *base = g->wdata + k0 * g->wrow_bytes + b0 * g->wbb;
    for (int64_t k = 0; k < min64(PREFETCH_ROWS, kb); k++) prefetch_run(base + k * g->wrow_bytes, nblocks * g->wbb);
    for (int64_t k = 0; k < kb; k++) {
        if (k + PREFETCH_ROWS < kb) prefetch_run(base + (k + PREFETCH_ROWS) * g->wrow_bytes, nblocks * g->wbb);
        g->wdec(base + k * g->wrow_bytes, tmp, nblocks);
        for (int64_t p0 = 0; p0 < nb; p0 += width) {
            const int64_t r = min64(width, nb - p0);
            float *d = dst + p0 * kb + k * width;
            memcpy(d, run + p0, (size_t)r * sizeof(float));
            if (r < width) memset(d + r, 0, (size_t)(width - r) * sizeof(float));
        }
    }
}

/* All register tiles of one C block [mb×nb] for one K block, from packed Bp and packed Ap (or,
 * when g->a_direct, Ap pointing at the block's first element in A itself). */
static void macro_kernel(const sgemm_job *g, int64_t mb, int64_t nb, int64_t kb, const float *Ap,
                         const float *Bp, float *C, int load) {
    const int mrl = g->lv->mr, nrl = g->lv->nr;
    const ukernel_fn uk = g->lv->uk;
    const int64_t a_ld = g->a_direct ? g->lda : 0;
    const int64_t a_row = g->a_direct ? g->lda : kb; /* distance between rows of A's panels */
    for (int64_t j0 = 0; j0 < nb; j0 += nrl) {
        int nr = (int)min64(nrl, nb - j0);
        const float *bp = Bp + j0 * kb;
        for (int64_t i0 = 0; i0 < mb; i0 += mrl) {
            int mr = (int)min64(mrl, mb - i0);
            const float *ap = Ap + i0 * a_row;
            float *c = C + i0 * g->ldc + j0;
            /* Prefetch the next tile of C while this one computes: once C outgrows the caches (tall
             * M, e.g. a batch of cotangents), waiting for its rows at every tile's start and end
             * otherwise costs more than the tile's arithmetic. */
            int64_t ni = i0 + mrl < mb ? i0 + mrl : 0, nj = i0 + mrl < mb ? j0 : j0 + nrl;
            if (nj < nb) {
                const float *cn = C + ni * g->ldc + nj;
                int64_t rows = min64(mrl, mb - ni), last = min64(nrl, nb - nj) - 1;
                for (int64_t i = 0; i < rows; i++) {
                    __builtin_prefetch(cn + i * g->ldc, 1, 3);
                    __builtin_prefetch(cn + i * g->ldc + last, 1, 3);
                }
            }
            uk(kb, ap, a_ld, bp, c, g->ldc, mr, nr, load);
        }
    }
}

/* C[m0:m1, n0:n1] over all of K. Ap holds an mc×kc block of A, Bp an (n1-n0)×kc block of B, Wp
 * the weight decoder's scratch. */
static void run_task(const sgemm_job *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float *Ap,
                     float *Bp, float *Wp) {
    int64_t nb = n1 - n0, mc = g->lv->mc;
    for (int64_t k0 = 0; k0 < g->K; k0 += g->kc) {
        int64_t kb = min64(g->kc, g->K - k0);
        int load = g->accumulate || k0 > 0; /* continue each chain from C after the first block */
        if (!g->B) {
            if (g->b_kmajor)
                pack_weight_nn(g, n0, nb, k0, kb, Bp, Wp);
            else
                pack_weight_nt(g, n0, nb, k0, kb, Bp, Wp);
        } else {
            const float *b = g->b_kmajor ? g->B + k0 * g->ldb + n0 : g->B + n0 * g->ldb + k0;
            g->lv->pack_b(b, g->ldb, g->b_kmajor, nb, kb, Bp);
        }
        for (int64_t i0 = m0; i0 < m1; i0 += mc) {
            int64_t mb = min64(mc, m1 - i0);
            const float *a = g->a_kmajor ? g->A + k0 * g->lda + i0 : g->A + i0 * g->lda + k0;
            if (!g->a_direct) g->lv->pack_a(a, g->lda, g->a_kmajor, mb, kb, Ap);
            macro_kernel(g, mb, nb, kb, g->a_direct ? a : Ap, Bp, g->C + i0 * g->ldc + n0, load);
        }
    }
}

typedef struct {
    int64_t tn, wn, hm; /* N blocks, their width, height of the M blocks */
} task_grid;

/* Task i of the grid (row-major over M blocks × N blocks). */
static void run_grid_task(const sgemm_job *g, const task_grid *t, int64_t i, float *Ap, float *Bp, float *Wp) {
    int64_t m0 = (i / t->tn) * t->hm, n0 = (i % t->tn) * t->wn;
    run_task(g, m0, min64(m0 + t->hm, g->M), n0, min64(n0 + t->wn, g->N), Ap, Bp, Wp);
}

/* Checks that rows × ld (with the last row only `cols` long) is addressable without overflow. */
static int check_matrix(const char *name, const void *p, int64_t rows, int64_t cols, int64_t ld) {
    if (ld < cols) return sl_fail(SL_ERR_VALUE, "sgemm: leading dimension of %s (%lld) < row length %lld", name,
                                  (long long)ld, (long long)cols);
    if (rows == 0 || cols == 0) return SL_OK;
    if (!p) return sl_fail(SL_ERR_VALUE, "sgemm: %s is NULL", name);
    int64_t span;
    if (!sl_mul_size(rows - 1, ld, &span) || span > INT64_MAX - cols)
        return sl_fail(SL_ERR_VALUE, "sgemm: %s is too large (%lld rows, ld %lld)", name, (long long)rows,
                       (long long)ld);
    return SL_OK;
}

/* ------------------------------------------------------------------------------------------
 * Packing buffers: one per calling OS thread, kept between calls (freed when the thread exits),
 * so that a stream of small products, e.g. a layer's projections at T = 128, pays neither malloc
 * nor the page faults of fresh memory on every call. Above CACHE_MAX the buffer is allocated and
 * freed per call: such products run long enough not to notice. */

enum { CACHE_MAX = 16 << 20 }; /* bytes */

#if SL_SGEMM_CACHE
typedef struct {
    float *p;
    size_t bytes;
} pack_cache;

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static int cache_ok;

static void cache_release(void *c) {
    free(((pack_cache *)c)->p);
    free(c);
}

static void cache_init(void) { cache_ok = pthread_key_create(&cache_key, cache_release) == 0; }

/* The calling thread's cached buffer grown to `bytes` (64-byte aligned), or NULL. */
static float *cache_get(size_t bytes) {
    pthread_once(&cache_once, cache_init);
    if (!cache_ok) return NULL;
    pack_cache *c = pthread_getspecific(cache_key);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return NULL;
        if (pthread_setspecific(cache_key, c) != 0) {
            free(c);
            return NULL;
        }
    }
    if (c->bytes < bytes) {
        float *p = aligned_alloc(64, bytes);
        if (!p) return NULL;
        free(c->p);
        c->p = p;
        c->bytes = bytes;
    }
    return c->p;
}
#endif

/* A packing buffer of `floats` floats, 64-byte aligned; *owned says whether to free it after. */
static float *pack_buffer(int64_t floats, int *owned) {
    *owned = 0;
    if ((uint64_t)floats > (uint64_t)SIZE_MAX / sizeof(float) / 2) return NULL;
    size_t bytes = round_up(floats, 16) * sizeof(float); /* aligned_alloc: a multiple of 64 bytes */
#if SL_SGEMM_CACHE
    if (bytes <= CACHE_MAX) {
        float *p = cache_get(bytes);
        if (p) return p;
    }
#endif
    *owned = 1;
    return aligned_alloc(64, bytes);
}

/* The kernels and blocking for the SIMD level in use. */
static const sgemm_level *current_level(void) {
#if SL_SGEMM_X86
    sl_simd_level s = sl_simd();
    if (s >= SL_SIMD_AVX512) return &LEVEL_AVX512;
    if (s >= SL_SIMD_AVX2) return &LEVEL_AVX2;
#endif
    return &LEVEL_GENERIC;
}

/* sl_sgemm, with B either float32 (B, ldb) or, when B == NULL, the weight W decoded while packing
 * (trans_b != 0: op(B) = Wᵀ, N = W->rows, K = W->cols; trans_b == 0: op(B) = W). */
static void prologue_rows(const sl_row_prologue *pro, int64_t M) {
    for (int64_t i = 0; pro && i < M; i++) pro->fn(pro->arg, i);
}

/* One product of a call: its job, task grid and per-thread buffer sizes (floats). */
typedef struct {
    sgemm_job g;
    task_grid grid;
    int64_t ntasks, ap, bp, wp;
} sgemm_plan;

/* The size and matrix checks of one product. */
static int check_product(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                         const float *B, int64_t ldb, const sl_weight *W, const float *C, int64_t ldc) {
    if (M < 0 || N < 0 || K < 0)
        return sl_fail(SL_ERR_VALUE, "sgemm: negative size M=%lld N=%lld K=%lld", (long long)M, (long long)N,
                       (long long)K);
    /* far beyond any real matrix; keeps the tiling arithmetic below free of overflow */
    if (M > (INT64_MAX >> 8) || N > (INT64_MAX >> 8) || K > (INT64_MAX >> 8))
        return sl_fail(SL_ERR_VALUE, "sgemm: size too large M=%lld N=%lld K=%lld", (long long)M, (long long)N,
                       (long long)K);
    SL_TRY(trans_a ? check_matrix("A", A, K, M, lda) : check_matrix("A", A, M, K, lda));
    if (!W) SL_TRY(trans_b ? check_matrix("B", B, N, K, ldb) : check_matrix("B", B, K, N, ldb));
    return check_matrix("C", C, M, N, ldc);
}

/* The call's team: its thread count, not omp_get_max_threads() (that is per OS thread, and a
 * Python thread other than the one that called set_num_threads would see OpenMP's default), and
 * one thread below ~1 MFLOP in all: waking threads costs a few microseconds. */
static int team_size(int parallel, double flops) {
    int nthr = 1;
#if SL_SGEMM_OMP
    if (parallel && !omp_in_parallel()) nthr = sl_num_threads();
#else
    (void)parallel;
#endif
    return flops < 5e5 ? 1 : nthr;
}

/* The plan of one product with M, N, K > 0 (checked) for a team of nthr; the grid changes which
 * thread computes a tile, never its bits. */
static int plan_product(sgemm_plan *pl, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A,
                        int64_t lda, const float *B, int64_t ldb, const sl_weight *W, float *C, int64_t ldc,
                        int accumulate, int nthr) {
    const sgemm_level *lv = current_level();
    const int64_t mr = lv->mr, nr = lv->nr;
    sgemm_job g = {M, N, K, lda, ldb, ldc, 0, A, B, C, trans_a != 0, trans_b == 0, accumulate != 0, 0, lv,
                   NULL, 0, 1, 0, NULL};
    if (W) {
        g.B = NULL;
        g.wdata = W->data, g.wrow_bytes = W->row_bytes;
        g.wbe = sl_quant_block_elems(W->type), g.wbb = sl_quant_block_bytes(W->type);
        g.wdec = sl_dequant_kernel(W->type);
        if (!g.wdec) return sl_fail(SL_ERR_INTERNAL, "linear: no decoder for type %d", W->type);
    }
    /* Reading A in place skips its packing (measured 2-5% faster at T = 128), except when its rows
     * are a multiple of 4 KiB apart: all MR512 rows then map to one L1 set, more than its ways. */
    g.a_direct = lv->direct_a && !g.a_kmajor && lda % 1024 != 0;
    /* Equal K blocks near kc (a multiple of 8 for the vector packers); any choice gives the same bits. */
    g.kc = min64(round_up(ceil_div(K, ceil_div(K, lv->kc)), 8), K);
    /* NT weight: K blocks of whole quant blocks (K itself is), so each row's part decodes alone. */
    if (W && !g.b_kmajor && g.wbe > 1) g.kc = min64(round_up(g.kc, g.wbe), K);

    /* Tasks: a grid of N blocks (at most nc wide) × M blocks, balanced over the threads. */
    int64_t n_panels = ceil_div(N, nr), m_panels = ceil_div(M, mr);
    int64_t tn = ceil_div(N, lv->nc), tm = 1;
    if (nthr > 1) {
        if (tn < 4 * nthr) tn = round_up(tn, nthr); /* few blocks: make their count a multiple */
        /* With A read in place, narrower N blocks cost nothing more (no A packing to repeat), and
         * several tasks per thread let the dynamic schedule move work off a thread that another
         * process slows down. */
        if (g.a_direct && tn < 4 * nthr) tn = 4 * nthr;
        if (tn > n_panels) tn = n_panels;
        if (tn < nthr) tm = min64(ceil_div(nthr, tn), m_panels);
    }
    int64_t wn = round_up(ceil_div(N, tn), nr), hm = round_up(ceil_div(M, tm), mr);
    /* NN weight: N blocks that start on quant block boundaries decode no block twice, when that
     * still leaves a block for every thread. */
    if (W && g.b_kmajor && g.wbe > nr && ceil_div(N, round_up(wn, g.wbe)) >= min64(nthr, tn))
        wn = round_up(wn, g.wbe);
    tn = ceil_div(N, wn);
    tm = ceil_div(M, hm);

    /* Per-thread packing buffers, allocated by the caller so that no allocation fails inside the team. */
    const int64_t ap_size = g.a_direct ? 0 : round_up(min64(hm, lv->mc), mr) * g.kc;
    const int64_t bp_size = round_up(min64(wn, N), nr) * g.kc;
    /* the weight decoder's scratch: 8 rows of a K block (NT) or one row's run of blocks (NN) */
    const int64_t wp_size = !W ? 0 : g.b_kmajor ? round_up(min64(wn, N), g.wbe) + 2 * g.wbe : 8 * g.kc;
    pl->g = g;
    pl->grid = (task_grid){tn, wn, hm};
    pl->ntasks = tn * tm;
    pl->ap = round_up(ap_size, 16), pl->bp = round_up(bp_size, 16), pl->wp = round_up(wp_size, 16);
    return SL_OK;
}

static void run_plan_task(const sgemm_plan *pl, int64_t i, float *buf) {
    run_grid_task(&pl->g, &pl->grid, i, buf, buf + pl->ap, buf + pl->ap + pl->bp);
}

/* The n plans' tasks (after pro, NULL or not, on A's M rows) in one parallel region of at most
 * nthr threads, each with one packing buffer that fits any plan. */
static int run_plans(const sgemm_plan *pl, int n, int nthr, int64_t M, const sl_row_prologue *pro) {
    int64_t first[SL_SHARED_MAX + 1] = {0}, per_thread = 0, total; /* plan j's tasks: [first[j], first[j + 1]) */
    for (int j = 0; j < n; j++) {
        first[j + 1] = first[j] + pl[j].ntasks;
        per_thread = per_thread > pl[j].ap + pl[j].bp + pl[j].wp ? per_thread : pl[j].ap + pl[j].bp + pl[j].wp;
    }
    const int64_t ntasks = first[n];
    if (nthr > ntasks) nthr = (int)ntasks;
    if (!sl_mul_size(per_thread, nthr, &total)) return sl_fail(SL_ERR_MEMORY, "sgemm: buffer size overflow");
    /* Not sl_alloc_floats: the packers write every float they later read, so skip the zeroing. */
    int owned;
    float *buf = pack_buffer(total, &owned);
    if (!buf) return sl_fail(SL_ERR_MEMORY, "sgemm: cannot allocate %lld floats for packing", (long long)total);

    if (nthr == 1) {
        prologue_rows(pro, M);
        for (int j = 0; j < n; j++)
            for (int64_t i = 0; i < pl[j].ntasks; i++) run_plan_task(&pl[j], i, buf);
    } else {
#if SL_SGEMM_OMP
#pragma omp parallel num_threads(nthr)
        {
            float *Ap = buf + omp_get_thread_num() * per_thread;
            if (pro) { /* its barrier: every row of A is written before any task reads it */
#pragma omp for schedule(static)
                for (int64_t i = 0; i < M; i++) pro->fn(pro->arg, i);
            }
            /* dynamic: a thread slowed by another process on its core takes fewer tiles */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < ntasks; i++) {
                int j = 0;
                while (i >= first[j + 1]) j++;
                run_plan_task(&pl[j], i - first[j], Ap);
            }
        }
#endif
    }
    if (owned) free(buf);
    return SL_OK;
}

static int sgemm_run(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                     const float *B, int64_t ldb, const sl_weight *W, float *C, int64_t ldc, int accumulate,
                     int parallel, const sl_row_prologue *pro) {
    SL_TRY(check_product(trans_a, trans_b, M, N, K, A, lda, B, ldb, W, C, ldc));
    if (M == 0 || N == 0 || K == 0) prologue_rows(pro, M);
    if (M == 0 || N == 0) return SL_OK;
    if (K == 0) {
        if (!accumulate)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
        return SL_OK;
    }
    const int nthr = team_size(parallel, (double)M * (double)N * (double)K);
    sgemm_plan pl;
    SL_TRY(plan_product(&pl, trans_a, trans_b, M, N, K, A, lda, B, ldb, W, C, ldc, accumulate, nthr));
    return run_plans(&pl, 1, nthr, M, pro);
}

int sl_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
             const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate, int parallel) {
    return sgemm_run(trans_a, trans_b, M, N, K, A, lda, B, ldb, NULL, C, ldc, accumulate, parallel, NULL);
}

int sl_sgemm_nt(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                float *C, int64_t ldc, int accumulate, int parallel) {
    return sl_sgemm(0, 1, M, N, K, A, lda, B, ldb, C, ldc, accumulate, parallel);
}

/* ------------------------------------------------------------------------------------------
 * Weights in their file's format. */

int sl_weight_init(sl_weight *w, int type, const void *data, int64_t nbytes, int64_t rows, int64_t cols) {
    const int64_t be = sl_quant_block_elems(type), bb = sl_quant_block_bytes(type);
    if (!w) return sl_fail(SL_ERR_VALUE, "weight: NULL sl_weight");
    if (be <= 0) return sl_fail(SL_ERR_VALUE, "weight: unsupported tensor type %d", type);
    if (rows <= 0 || cols <= 0 || cols % be)
        return sl_fail(SL_ERR_VALUE, "weight: %lld x %lld is not a whole number of %lld-element blocks per row",
                       (long long)rows, (long long)cols, (long long)be);
    if (rows > (INT64_MAX >> 8) || cols > (INT64_MAX >> 8))
        return sl_fail(SL_ERR_VALUE, "weight: %lld x %lld is too large", (long long)rows, (long long)cols);
    int64_t total;
    const int64_t row_bytes = cols / be * bb;
    if (!sl_mul_size(rows, row_bytes, &total) || total != nbytes)
        return sl_fail(SL_ERR_VALUE, "weight: %lld bytes given, a %lld x %lld matrix of type %d needs %lld",
                       (long long)nbytes, (long long)rows, (long long)cols, type, (long long)total);
    if (!data) return sl_fail(SL_ERR_VALUE, "weight: data is NULL");
    w->type = type, w->data = data, w->rows = rows, w->cols = cols, w->row_bytes = row_bytes;
    return SL_OK;
}

sl_weight sl_weight_f32(const float *data, int64_t rows, int64_t cols) {
    sl_weight w = {SL_GGML_F32, data, rows, cols, cols * (int64_t)sizeof(float)};
    return w;
}

/* The checks of sl_weight_init on a filled-in sl_weight (sl_weight_f32 checks nothing). */
static int check_weight(const sl_weight *W) {
    if (!W) return sl_fail(SL_ERR_VALUE, "weight: NULL sl_weight");
    const int64_t be = sl_quant_block_elems(W->type), bb = sl_quant_block_bytes(W->type);
    if (be <= 0) return sl_fail(SL_ERR_VALUE, "weight: unsupported tensor type %d", W->type);
    if (W->rows <= 0 || W->cols <= 0 || W->cols % be || W->row_bytes != W->cols / be * bb ||
        W->rows > (INT64_MAX >> 8) || W->cols > (INT64_MAX >> 8))
        return sl_fail(SL_ERR_VALUE, "weight: inconsistent %lld x %lld weight of type %d (%lld bytes per row)",
                       (long long)W->rows, (long long)W->cols, W->type, (long long)W->row_bytes);
    int64_t total;
    if (!sl_mul_size(W->rows, W->row_bytes, &total)) return sl_fail(SL_ERR_VALUE, "weight: size overflow");
    if (!W->data) return sl_fail(SL_ERR_VALUE, "weight: data is NULL");
    return SL_OK;
}

/* Float32 data the float kernels can read as floats: anything else (a misaligned F32 tensor in a
 * memory-mapped file) goes through the decoding packer, whose F32 decoder copies bytes. */
static int weight_is_float_array(const sl_weight *W) {
    return W->type == SL_GGML_F32 && (uintptr_t)W->data % sizeof(float) == 0;
}

int sl_linear_nt(int64_t M, const float *A, int64_t lda, const sl_weight *W, float *C, int64_t ldc, int accumulate,
                 int parallel) {
    SL_TRY(check_weight(W));
    if (weight_is_float_array(W))
        return sl_sgemm(0, 1, M, W->rows, W->cols, A, lda, W->data, W->cols, C, ldc, accumulate, parallel);
    return sgemm_run(0, 1, M, W->rows, W->cols, A, lda, NULL, 0, W, C, ldc, accumulate, parallel, NULL);
}

int sl_linear_nt_prologue(int64_t M, float *A, int64_t lda, const sl_weight *W, float *C, int64_t ldc,
                          const sl_row_prologue *pro) {
    SL_TRY(check_weight(W));
    if (weight_is_float_array(W))
        return sgemm_run(0, 1, M, W->rows, W->cols, A, lda, W->data, W->cols, NULL, C, ldc, 0, 1, pro);
    return sgemm_run(0, 1, M, W->rows, W->cols, A, lda, NULL, 0, W, C, ldc, 0, 1, pro);
}

int sl_linear_nt_shared(int64_t M, const float *A, int64_t lda, int n, const sl_weight *const *W, float *const *C,
                        const int64_t *ldc) {
    if (n < 1 || n > SL_SHARED_MAX) return sl_fail(SL_ERR_VALUE, "linear: %d products of one input", n);
    double flops = 0.0;
    for (int j = 0; j < n; j++) {
        SL_TRY(check_weight(W[j]));
        if (W[j]->cols != W[0]->cols)
            return sl_fail(SL_ERR_VALUE, "linear: products of one input with K %lld and %lld",
                           (long long)W[0]->cols, (long long)W[j]->cols);
        const int f = weight_is_float_array(W[j]);
        SL_TRY(check_product(0, 1, M, W[j]->rows, W[j]->cols, A, lda, f ? (const float *)W[j]->data : NULL, W[j]->cols,
                             f ? NULL : W[j], C[j], ldc[j]));
        flops += (double)M * (double)W[j]->rows * (double)W[j]->cols;
    }
    if (M == 0) return SL_OK;
    const int nthr = team_size(1, flops);
    sgemm_plan pl[SL_SHARED_MAX];
    for (int j = 0; j < n; j++) {
        const int f = weight_is_float_array(W[j]);
        SL_TRY(plan_product(&pl[j], 0, 1, M, W[j]->rows, W[j]->cols, A, lda, f ? (const float *)W[j]->data : NULL, W[j]->cols,
                            f ? NULL : W[j], C[j], ldc[j], 0, nthr));
    }
    return run_plans(pl, n, nthr, M, NULL);
}

int sl_linear_nn(int64_t M, const float *A, int64_t lda, const sl_weight *W, float *C, int64_t ldc, int accumulate,
                 int parallel) {
    SL_TRY(check_weight(W));
    if (weight_is_float_array(W))
        return sl_sgemm(0, 0, M, W->cols, W->rows, A, lda, W->data, W->cols, C, ldc, accumulate, parallel);
    return sgemm_run(0, 0, M, W->cols, W->rows, A, lda, NULL, 0, W, C, ldc, accumulate, parallel, NULL);
}

int sl_weight_rows(const sl_weight *W, const int64_t *ids, int64_t n, float *dst) {
    SL_TRY(check_weight(W));
    if (n < 0) return sl_fail(SL_ERR_VALUE, "weight: negative row count %lld", (long long)n);
    if (n > 0 && (!ids || !dst)) return sl_fail(SL_ERR_VALUE, "weight: ids or dst is NULL");
    const sl_dequant_fn dec = sl_dequant_kernel(W->type);
    const int64_t nblocks = W->cols / sl_quant_block_elems(W->type);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= W->rows)
            return sl_fail(SL_ERR_VALUE, "weight: row %lld outside [0, %lld)", (long long)ids[i], (long long)W->rows);
    for (int64_t i = 0; i < n; i++) dec((const uint8_t *)W->data + ids[i] * W->row_bytes, dst + i * W->cols, nblocks);
    return SL_OK;
}

int sl_weight_cols(const sl_weight *W, int64_t c0, int64_t n, float *dst) {
    SL_TRY(check_weight(W));
    if (c0 < 0 || n < 0 || c0 > W->cols - n)
        return sl_fail(SL_ERR_VALUE, "weight: columns [%lld, %lld + %lld) outside [0, %lld)", (long long)c0,
                       (long long)c0, (long long)n, (long long)W->cols);
    if (n == 0) return SL_OK;
    if (!dst) return sl_fail(SL_ERR_VALUE, "weight: dst is NULL");
    /* only the blocks that hold columns [c0, c0 + n) */
    const int64_t be = sl_quant_block_elems(W->type), bb = sl_quant_block_bytes(W->type);
    const int64_t b0 = c0 / be, nblocks = ceil_div(c0 + n, be) - b0;
    const sl_dequant_fn dec = sl_dequant_kernel(W->type);
    float *run = sl_alloc_floats_uninit(nblocks * be);
    if (!run) return sl_fail(SL_ERR_MEMORY, "weight: cannot allocate %lld floats", (long long)(nblocks * be));
    for (int64_t r = 0; r < W->rows; r++) {
        dec((const uint8_t *)W->data + r * W->row_bytes + b0 * bb, run, nblocks);
        memcpy(dst + r * n, run + (c0 - b0 * be), (size_t)n * sizeof(float));
    }
    sl_free(run);
    return SL_OK;
}

/* Dequantisation of GGUF/ggml tensor block formats to fp32.
 *
 * Each decoder follows ggml's reference dequantize_row_* (ggml-quants.c) operation for operation,
 * in float32 and in the same order (e.g. Q4_K: (d*sc)*q - dmin*m), so the result is bit-identical
 * to ggml's scalar path and to gguf-py's gguf.quants.dequantize. That requires that the compiler
 * does not contract a*b+c into an FMA: GCC in ISO C mode (-std=c11, as setup.py builds) defaults
 * to -ffp-contract=off, and for clang the pragma below says so.
 *
 * All reads of the source go byte by byte (little-endian, any alignment), so a tensor that sits at
 * an odd offset in a memory-mapped file is fine. Nothing here depends on the floating-point
 * environment (rounding mode, FTZ/DAZ): see sl_fp16_to_fp32_bits.
 *
 * Block layouts (bytes; f16 = IEEE half, little-endian):
 *   Q4_0  32 elems 18 B: f16 d; u8 qs[16]                      y = (q - 8) * d
 *   Q4_1  32 elems 20 B: f16 d, m; u8 qs[16]                   y = q * d + m
 *   Q5_0  32 elems 22 B: f16 d; u8 qh[4]; u8 qs[16]            y = (q - 16) * d
 *   Q5_1  32 elems 24 B: f16 d, m; u8 qh[4]; u8 qs[16]         y = q * d + m
 *   Q8_0  32 elems 34 B: f16 d; i8 qs[32]                      y = q * d
 *   Q4_K 256 elems 144 B: f16 d, dmin; u8 scales[12]; u8 qs[128]
 *   Q5_K 256 elems 176 B: f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *   Q6_K 256 elems 210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
 * In the 32-element formats the low nibbles of qs[0..15] are elements 0..15 and the high nibbles
 * elements 16..31; bit j of the little-endian uint32 qh is the fifth bit of element j.
 */
#include "quant.h"

#include <string.h>

#include "cpu.h"
#include "sl_common.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define QK_K 256

/* ------------------------------------------------------------------------------------------ */
/* scalar helpers                                                                             */

static inline uint16_t rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | ((unsigned)p[1] << 8)); }

static inline uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Exact IEEE binary16 -> binary32 widening. Every half value is representable as a float, so
 * this is a pure re-encoding: zeros keep their sign, subnormals become the equal normal float,
 * infinities stay infinite, and NaNs keep sign and payload (the payload is shifted into the top
 * of the float mantissa; the quiet bit is not forced, as NumPy's float16 -> float32 does).
 * Written without branches so the F16 loop vectorises. The subnormal case uses one float
 * multiply, (float)m * 2^-24 with integer 1 <= m < 1024: exact, and both operand and result are
 * normal floats, so neither rounding mode nor FTZ/DAZ can change it. */
static inline uint32_t sl_fp16_to_fp32_bits(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu; /* exponent and mantissa */
    /* normal: shift into place and rebias the exponent 15 -> 127 */
    const uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23);
    /* inf/nan: exponent 31 -> 255, i.e. rebias by a further 112 */
    const uint32_t infnan = normal + ((uint32_t)(127 - 15) << 23);
    /* zero and subnormal: value = em * 2^-24 */
    uint32_t sub;
    const float fsub = (float)(int32_t)em * 0x1p-24f;
    memcpy(&sub, &fsub, sizeof sub);
    const uint32_t is_infnan = 0u - (uint32_t)(em >= 0x7c00u); /* all ones or zero */
    const uint32_t is_normal = (0u - (uint32_t)(em >= 0x0400u)) & ~is_infnan;
    const uint32_t is_sub = ~(is_infnan | is_normal);
    return sign | (infnan & is_infnan) | (normal & is_normal) | (sub & is_sub);
}

static inline float sl_fp16_to_fp32(uint16_t h) { return f32_from_bits(sl_fp16_to_fp32_bits(h)); }

static inline float rd_f16(const uint8_t *p) { return sl_fp16_to_fp32(rd_u16(p)); }

/* ggml's get_scale_min_k4: 8 pairs of 6-bit (scale, min) packed into 12 bytes. */
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* per-type decoders: nb blocks from src into dst                                             */

static void deq_f32(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(dst, src, (size_t)nb * sizeof(float));
#else
    for (int64_t i = 0; i < nb; ++i) dst[i] = f32_from_bits(rd_u32(src + 4 * i));
#endif
}

static void deq_f16(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) dst[i] = rd_f16(src + 2 * i);
}

static void deq_bf16(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) dst[i] = f32_from_bits((uint32_t)rd_u16(src + 2 * i) << 16);
}

static void deq_q4_0(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 18 * i;
        float *y = dst + 32 * i;
        const float d = rd_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; ++j) {
            const int x0 = (qs[j] & 0x0F) - 8;
            const int x1 = (qs[j] >> 4) - 8;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
    }
}

static void deq_q4_1(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 20 * i;
        float *y = dst + 32 * i;
        const float d = rd_f16(b);
        const float m = rd_f16(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; ++j) {
            const int x0 = qs[j] & 0x0F;
            const int x1 = qs[j] >> 4;
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

static void deq_q5_0(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 22 * i;
        float *y = dst + 32 * i;
        const float d = rd_f16(b);
        const uint32_t qh = rd_u32(b + 2);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < 16; ++j) {
            const int xh0 = (int)(((qh >> j) << 4) & 0x10);
            const int xh1 = (int)((qh >> (j + 12)) & 0x10);
            const int x0 = ((qs[j] & 0x0F) | xh0) - 16;
            const int x1 = ((qs[j] >> 4) | xh1) - 16;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
    }
}

static void deq_q5_1(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 24 * i;
        float *y = dst + 32 * i;
        const float d = rd_f16(b);
        const float m = rd_f16(b + 2);
        const uint32_t qh = rd_u32(b + 4);
        const uint8_t *qs = b + 8;
        for (int j = 0; j < 16; ++j) {
            const int xh0 = (int)(((qh >> j) << 4) & 0x10);
            const int xh1 = (int)((qh >> (j + 12)) & 0x10);
            const int x0 = (qs[j] & 0x0F) | xh0;
            const int x1 = (qs[j] >> 4) | xh1;
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

static void deq_q8_0(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 34 * i;
        float *y = dst + 32 * i;
        const float d = rd_f16(b);
        for (int j = 0; j < 32; ++j) {
            const int q = (int)b[2 + j] - ((b[2 + j] & 0x80) ? 256 : 0); /* int8 */
            y[j] = (float)q * d;
        }
    }
}

static void deq_q4_k(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 144 * i;
        float *y = dst + QK_K * i;
        const float d = rd_f16(b);
        const float min = rd_f16(b + 2);
        const uint8_t *scales = b + 4;
        const uint8_t *q = b + 16;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * (float)sc;
            const float m1 = min * (float)m;
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * (float)sc;
            const float m2 = min * (float)m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (float)(q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static void deq_q5_k(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 176 * i;
        float *y = dst + QK_K * i;
        const float d = rd_f16(b);
        const float min = rd_f16(b + 2);
        const uint8_t *scales = b + 4;
        const uint8_t *qh = b + 16;
        const uint8_t *ql = b + 48;
        int is = 0;
        unsigned u1 = 1, u2 = 2;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * (float)sc;
            const float m1 = min * (float)m;
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * (float)sc;
            const float m2 = min * (float)m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (float)((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static void deq_q6_k(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 210 * i;
        float *y = dst + QK_K * i;
        const uint8_t *ql = b;
        const uint8_t *qh = b + 128;
        const uint8_t *scb = b + 192;
        const float d = rd_f16(b + 208);
        int sc[16];
        for (int k = 0; k < 16; ++k) sc[k] = (int)scb[k] - ((scb[k] & 0x80) ? 256 : 0); /* int8 */
        const int *s = sc;
        for (int n = 0; n < QK_K; n += 128) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                /* ggml: y = d * sc[is] * q, i.e. (d * sc) * q in float */
                y[l + 0] = d * (float)s[is + 0] * (float)q1;
                y[l + 32] = d * (float)s[is + 2] * (float)q2;
                y[l + 64] = d * (float)s[is + 4] * (float)q3;
                y[l + 96] = d * (float)s[is + 6] * (float)q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            s += 8;
        }
    }
}


/* ------------------------------------------------------------------------------------------ */
/* vector decoders (AVX2; F16 and BF16 also AVX-512), used by the weight products' packing     */
/*                                                                                            */
/* Each one computes exactly the scalar decoder's float operations on the same operands, lane  */
/* by lane: integer quants widen exactly to int32 and convert exactly to float, per-block       */
/* scales are the scalar code's own float products, and a*b+c stays a multiply then an add:    */
/* the targets below leave out "fma", so the compiler cannot fuse them whatever -ffp-contract   */
/* says. Hence bit-identical results, which tests/test_quant.py checks at every level.          */

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(SL_SGEMM_PORTABLE_ONLY)
#include <immintrin.h>
#define SL_QUANT_X86 1
#define SL_QAVX2 __attribute__((target("avx2")))
#define SL_QAVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2")))
#else
#define SL_QUANT_X86 0
#endif

#if SL_QUANT_X86
/* Low 8 bytes of b as unsigned / signed int32 lanes, to float (exact). */
SL_QAVX2 static inline __m256 u8x8_ps(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
SL_QAVX2 static inline __m256 i8x8_ps(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

/* 32 signed byte quants q (as 32 lanes of a ymm) to y[0..31] = q * d. */
SL_QAVX2 static inline void put32_mul(float *y, __m256i q, __m256 d) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y + 0, _mm256_mul_ps(i8x8_ps(lo), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(i8x8_ps(_mm_srli_si128(lo, 8)), d));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(i8x8_ps(hi), d));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(i8x8_ps(_mm_srli_si128(hi, 8)), d));
}

/* 16 signed byte quants to y[0..15] = q * d. */
SL_QAVX2 static inline void put16_mul(float *y, __m128i q, __m256 d) {
    _mm256_storeu_ps(y + 0, _mm256_mul_ps(i8x8_ps(q), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(i8x8_ps(_mm_srli_si128(q, 8)), d));
}

/* 16 unsigned byte quants to y[0..15] = q * d + m (Q4_1, Q5_1). */
SL_QAVX2 static inline void put16_mul_add(float *y, __m128i q, __m256 d, __m256 m) {
    _mm256_storeu_ps(y + 0, _mm256_add_ps(_mm256_mul_ps(u8x8_ps(q), d), m));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(u8x8_ps(_mm_srli_si128(q, 8)), d), m));
}

/* 32 unsigned byte quants to y[0..31] = d * q - m (Q4_K, Q5_K). */
SL_QAVX2 static inline void put32_mul_sub(float *y, __m256i q, __m256 d, __m256 m) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y + 0, _mm256_sub_ps(_mm256_mul_ps(d, u8x8_ps(lo)), m));
    _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(d, u8x8_ps(_mm_srli_si128(lo, 8))), m));
    _mm256_storeu_ps(y + 16, _mm256_sub_ps(_mm256_mul_ps(d, u8x8_ps(hi)), m));
    _mm256_storeu_ps(y + 24, _mm256_sub_ps(_mm256_mul_ps(d, u8x8_ps(_mm_srli_si128(hi, 8))), m));
}

/* The 32 fifth bits of a Q5_0/Q5_1 block as bytes 0 or 16: element j takes bit j of qh. */
SL_QAVX2 static inline __m256i q5_high_bits(uint32_t qh) {
    /* byte j of the result tests bit j: spread byte j/8 of qh to 8 lanes, mask by 1 << (j%8) */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                                                2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

/* A 32-element block's 16 bytes of nibbles as 32 bytes: low nibbles (elements 0..15), then high. */
SL_QAVX2 static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)qs);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

SL_QAVX2 static void deq_q4_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 18 * i;
        const __m256i q = _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8));
        put32_mul(dst + 32 * i, q, _mm256_set1_ps(rd_f16(b)));
    }
}

SL_QAVX2 static void deq_q4_1_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 20 * i;
        const __m256 d = _mm256_set1_ps(rd_f16(b)), m = _mm256_set1_ps(rd_f16(b + 2));
        const __m256i q = nibbles32(b + 4);
        put16_mul_add(dst + 32 * i, _mm256_castsi256_si128(q), d, m);
        put16_mul_add(dst + 32 * i + 16, _mm256_extracti128_si256(q, 1), d, m);
    }
}

SL_QAVX2 static void deq_q5_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 22 * i;
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles32(b + 6), q5_high_bits(rd_u32(b + 2))),
                                          _mm256_set1_epi8(16));
        put32_mul(dst + 32 * i, q, _mm256_set1_ps(rd_f16(b)));
    }
}

SL_QAVX2 static void deq_q5_1_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 24 * i;
        const __m256 d = _mm256_set1_ps(rd_f16(b)), m = _mm256_set1_ps(rd_f16(b + 2));
        const __m256i q = _mm256_or_si256(nibbles32(b + 8), q5_high_bits(rd_u32(b + 4)));
        put16_mul_add(dst + 32 * i, _mm256_castsi256_si128(q), d, m);
        put16_mul_add(dst + 32 * i + 16, _mm256_extracti128_si256(q, 1), d, m);
    }
}

SL_QAVX2 static void deq_q8_0_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 34 * i;
        put32_mul(dst + 32 * i, _mm256_loadu_si256((const __m256i *)(const void *)(b + 2)), _mm256_set1_ps(rd_f16(b)));
    }
}

SL_QAVX2 static void deq_q4_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 144 * i;
        float *y = dst + QK_K * i;
        const float d = rd_f16(b), min = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *q = b + 16;
        for (int j = 0; j < 4; ++j) {
            uint8_t sc1, m1, sc2, m2;
            get_scale_min_k4(2 * j, scales, &sc1, &m1);
            get_scale_min_k4(2 * j + 1, scales, &sc2, &m2);
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(const void *)(q + 32 * j));
            put32_mul_sub(y + 64 * j, _mm256_and_si256(qv, m4), _mm256_set1_ps(d * (float)sc1),
                          _mm256_set1_ps(min * (float)m1));
            put32_mul_sub(y + 64 * j + 32, _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4),
                          _mm256_set1_ps(d * (float)sc2), _mm256_set1_ps(min * (float)m2));
        }
    }
}

SL_QAVX2 static void deq_q5_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 176 * i;
        float *y = dst + QK_K * i;
        const float d = rd_f16(b), min = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *ql = b + 48;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16));
        for (int j = 0; j < 4; ++j) {
            uint8_t sc1, m1, sc2, m2;
            get_scale_min_k4(2 * j, scales, &sc1, &m1);
            get_scale_min_k4(2 * j + 1, scales, &sc2, &m2);
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32 * j));
            /* fifth bits 2j and 2j+1 of each qh byte, moved to bit 4 (16) */
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4);
            const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4);
            put32_mul_sub(y + 64 * j, _mm256_or_si256(_mm256_and_si256(qv, m4), h1), _mm256_set1_ps(d * (float)sc1),
                          _mm256_set1_ps(min * (float)m1));
            put32_mul_sub(y + 64 * j + 32, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qv, 4), m4), h2),
                          _mm256_set1_ps(d * (float)sc2), _mm256_set1_ps(min * (float)m2));
        }
    }
}

SL_QAVX2 static void deq_q6_k_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t *b = src + 210 * i;
        float *y = dst + QK_K * i;
        const float d = rd_f16(b + 208);
        const int8_t *sc = (const int8_t *)(const void *)(b + 192);
        for (int n = 0; n < 2; ++n) {
            const uint8_t *ql = b + 64 * n, *qhp = b + 128 + 32 * n;
            const int8_t *s = sc + 8 * n;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)qhp);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
            for (int t = 0; t < 4; ++t) {
                const __m256i qs = _mm256_sub_epi8(q[t], c32);
                /* ggml: (d * sc) * q; elements l < 16 of the 32 take scale 2t, the rest 2t + 1 */
                put16_mul(y + 128 * n + 32 * t, _mm256_castsi256_si128(qs), _mm256_set1_ps(d * (float)s[2 * t]));
                put16_mul(y + 128 * n + 32 * t + 16, _mm256_extracti128_si256(qs, 1),
                          _mm256_set1_ps(d * (float)s[2 * t + 1]));
            }
        }
    }
}

/* sl_fp16_to_fp32_bits on 8 lanes of int32 holding halves: the same three cases, selected. */
SL_QAVX2 static inline __m256 f16x8_ps(__m256i x) {
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x8000)), 16);
    const __m256i em = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff));
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(em, 13), _mm256_set1_epi32((127 - 15) << 23));
    const __m256i infnan = _mm256_add_epi32(normal, _mm256_set1_epi32((127 - 15) << 23));
    const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0x1p-24f)));
    __m256i r = _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x03ff)));
    r = _mm256_blendv_epi8(r, infnan, _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7bff)));
    return _mm256_castsi256_ps(_mm256_or_si256(r, sign));
}

/* Not F16C's vcvtph2ps: it sets the quiet bit of signalling NaNs, which the scalar path keeps. */
SL_QAVX2 static void deq_f16_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8)
        _mm256_storeu_ps(dst + i, f16x8_ps(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i)))));
    for (; i < nb; ++i) dst[i] = rd_f16(src + 2 * i);
}

SL_QAVX2 static void deq_bf16_avx2(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
    }
    for (; i < nb; ++i) dst[i] = f32_from_bits((uint32_t)rd_u16(src + 2 * i) << 16);
}

SL_QAVX512 static void deq_f16_avx512(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    const __m512i m_sign = _mm512_set1_epi32(0x8000), m_em = _mm512_set1_epi32(0x7fff);
    const __m512i rebias = _mm512_set1_epi32((127 - 15) << 23);
    int64_t i = 0;
    for (; i + 16 <= nb; i += 16) {
        const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i)));
        const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, m_sign), 16);
        const __m512i em = _mm512_and_si512(x, m_em);
        const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(em, 13), rebias);
        const __m512i infnan = _mm512_add_epi32(normal, rebias);
        __m512i r = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(0x1p-24f)));
        r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epi32_mask(em, _mm512_set1_epi32(0x03ff)), normal);
        r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epi32_mask(em, _mm512_set1_epi32(0x7bff)), infnan);
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_or_si512(r, sign)));
    }
    deq_f16_avx2(src + 2 * i, dst + i, nb - i);
}

SL_QAVX512 static void deq_bf16_avx512(const uint8_t *restrict src, float *restrict dst, int64_t nb) {
    int64_t i = 0;
    for (; i + 16 <= nb; i += 16) {
        const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)));
    }
    deq_bf16_avx2(src + 2 * i, dst + i, nb - i);
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* type table                                                                                 */

typedef struct {
    int64_t elems, bytes;
    sl_dequant_fn fn;
} sl_qtype;

static int sl_qtype_get(int type, sl_qtype *out) {
    switch (type) {
    case SL_GGML_F32: *out = (sl_qtype){1, 4, deq_f32}; return 1;
    case SL_GGML_F16: *out = (sl_qtype){1, 2, deq_f16}; return 1;
    case SL_GGML_BF16: *out = (sl_qtype){1, 2, deq_bf16}; return 1;
    case SL_GGML_Q4_0: *out = (sl_qtype){32, 18, deq_q4_0}; return 1;
    case SL_GGML_Q4_1: *out = (sl_qtype){32, 20, deq_q4_1}; return 1;
    case SL_GGML_Q5_0: *out = (sl_qtype){32, 22, deq_q5_0}; return 1;
    case SL_GGML_Q5_1: *out = (sl_qtype){32, 24, deq_q5_1}; return 1;
    case SL_GGML_Q8_0: *out = (sl_qtype){32, 34, deq_q8_0}; return 1;
    case SL_GGML_Q4_K: *out = (sl_qtype){QK_K, 144, deq_q4_k}; return 1;
    case SL_GGML_Q5_K: *out = (sl_qtype){QK_K, 176, deq_q5_k}; return 1;
    case SL_GGML_Q6_K: *out = (sl_qtype){QK_K, 210, deq_q6_k}; return 1;
    default: return 0;
    }
}

/* Names of ggml type ids (ggml.h), for error messages; NULL for ids never or no longer used. */
static const char *sl_ggml_type_name(int type) {
    static const char *const names[] = {
        "F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2 (removed)", "Q4_3 (removed)", "Q5_0",
        "Q5_1",    "Q8_0",   "Q8_1",    "Q2_K",  "Q3_K",           "Q4_K",           "Q5_K",
        "Q6_K",    "Q8_K",   "IQ2_XXS", "IQ2_XS", "IQ3_XXS",       "IQ1_S",          "IQ4_NL",
        "IQ3_S",   "IQ2_S",  "IQ4_XS",  "I8",    "I16",            "I32",            "I64",
        "F64",     "IQ1_M",  "BF16",    NULL,    NULL,             NULL,             "TQ1_0",
        "TQ2_0",   NULL,     NULL,      NULL,    "MXFP4",
    };
    if (type < 0 || type >= (int)(sizeof names / sizeof names[0])) return NULL;
    return names[type];
}

sl_dequant_fn sl_dequant_kernel(int type) {
    sl_qtype t;
    if (!sl_qtype_get(type, &t)) return NULL;
#if SL_QUANT_X86
    const sl_simd_level level = sl_simd();
    if (level >= SL_SIMD_AVX512) {
        if (type == SL_GGML_F16) return deq_f16_avx512;
        if (type == SL_GGML_BF16) return deq_bf16_avx512;
    }
    if (level >= SL_SIMD_AVX2) {
        switch (type) {
        case SL_GGML_F16: return deq_f16_avx2;
        case SL_GGML_BF16: return deq_bf16_avx2;
        case SL_GGML_Q4_0: return deq_q4_0_avx2;
        case SL_GGML_Q4_1: return deq_q4_1_avx2;
        case SL_GGML_Q5_0: return deq_q5_0_avx2;
        case SL_GGML_Q5_1: return deq_q5_1_avx2;
        case SL_GGML_Q8_0: return deq_q8_0_avx2;
        case SL_GGML_Q4_K: return deq_q4_k_avx2;
        case SL_GGML_Q5_K: return deq_q5_k_avx2;
        case SL_GGML_Q6_K: return deq_q6_k_avx2;
        default: break;
        }
    }
#endif
    return t.fn;
}

int64_t sl_quant_block_elems(int type) {
    sl_qtype t;
    return sl_qtype_get(type, &t) ? t.elems : 0;
}

int64_t sl_quant_block_bytes(int type) {
    sl_qtype t;
    return sl_qtype_get(type, &t) ? t.bytes : 0;
}

/* ------------------------------------------------------------------------------------------ */

/* Blocks per work item: about 8192 output floats (32 KiB), enough to amortise scheduling. */
static int64_t sl_chunk_blocks(int64_t block_elems) {
    int64_t c = 8192 / block_elems;
    return c > 0 ? c : 1;
}

int sl_dequantize_check(int type, int64_t nbytes, int64_t n_elements) {
    sl_qtype t;
    if (!sl_qtype_get(type, &t)) {
        const char *name = sl_ggml_type_name(type);
        return sl_fail(SL_ERR_FORMAT,
                       "dequantize: unsupported ggml type id %d (%s); supported: F32, F16, BF16, "
                       "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K",
                       type, name ? name : "unknown type id");
    }
    const char *name = sl_ggml_type_name(type);
    if (n_elements < 0)
        return sl_fail(SL_ERR_VALUE, "dequantize: n_elements must be >= 0, got %lld",
                       (long long)n_elements);
    if (nbytes < 0)
        return sl_fail(SL_ERR_VALUE, "dequantize: nbytes must be >= 0, got %lld", (long long)nbytes);
    if (n_elements % t.elems != 0)
        return sl_fail(SL_ERR_FORMAT,
                       "dequantize: n_elements %lld is not a multiple of the %s block size %lld",
                       (long long)n_elements, name, (long long)t.elems);
    const int64_t nb = n_elements / t.elems;
    int64_t want;
    if (!sl_mul_size(nb, t.bytes, &want))
        return sl_fail(SL_ERR_MEMORY, "dequantize: byte size of %lld %s blocks overflows",
                       (long long)nb, name);
    if (nbytes != want)
        return sl_fail(SL_ERR_FORMAT,
                       "dequantize: %s data has %lld bytes, expected %lld (%lld elements = %lld "
                       "blocks of %lld bytes)",
                       name, (long long)nbytes, (long long)want, (long long)n_elements, (long long)nb,
                       (long long)t.bytes);
    return SL_OK;
}

int sl_dequantize(int type, const uint8_t *src, int64_t nbytes, float *dst, int64_t n_elements,
                  int parallel) {
    SL_TRY(sl_dequantize_check(type, nbytes, n_elements));
    sl_qtype t;
    if (!sl_qtype_get(type, &t)) return sl_fail(SL_ERR_INTERNAL, "dequantize: type %d vanished", type);
    const int64_t nb = n_elements / t.elems;
    if (nb == 0) return SL_OK;
    if (src == NULL) return sl_fail(SL_ERR_VALUE, "dequantize: source pointer is NULL");
    if (dst == NULL) return sl_fail(SL_ERR_VALUE, "dequantize: destination pointer is NULL");

    const int64_t chunk = sl_chunk_blocks(t.elems);
    const int64_t n_chunks = (nb + chunk - 1) / chunk;
    const sl_dequant_fn fn = sl_dequant_kernel(type);
    const int64_t be = t.elems, bb = t.bytes;
#if defined(_OPENMP)
    const int use_omp = parallel != 0 && n_chunks > 1 && !omp_in_parallel();
    const int nthr = use_omp ? sl_num_threads() : 1; /* the call context's count */
#pragma omp parallel for schedule(static) if (use_omp) num_threads(nthr)
#else
    (void)parallel;
#endif
    for (int64_t c = 0; c < n_chunks; ++c) {
        const int64_t b0 = c * chunk;
        const int64_t n = (nb - b0) < chunk ? (nb - b0) : chunk;
        fn(src + b0 * bb, dst + b0 * be, n);
    }
    return SL_OK;
}

/* Run-time CPU feature dispatch. The AVX2+FMA and AVX-512 kernels are compiled with target
 * attributes, so the extension itself needs no -mavx2/-mavx512f and runs on any x86-64 (and on
 * aarch64 through the portable path). Levels are ordered: a kernel written for level X is used
 * whenever sl_simd() >= X and no kernel for a higher level exists. */
#ifndef SL_CPU_H
#define SL_CPU_H

typedef enum { SL_SIMD_GENERIC = 0, SL_SIMD_AVX2 = 1, SL_SIMD_AVX512 = 2 } sl_simd_level;

/* The level in use: the best the CPU supports, unless SINKLAB_SIMD=generic|avx2|avx512 (read at
 * the first call; a level above the CPU's best falls back to the best) or sl_set_simd() forced
 * another. */
sl_simd_level sl_simd(void);
/* Forces a level; returns the level now in use (one the CPU lacks falls back to the best below). */
sl_simd_level sl_set_simd(sl_simd_level level);
/* The best level this CPU supports. */
sl_simd_level sl_simd_best(void);
const char *sl_simd_name(sl_simd_level level);
/* Level named "generic", "avx2", "avx512" or "auto" (the best); -1 for any other name. */
int sl_simd_parse(const char *name);
int sl_cpu_has_avx2_fma(void);
/* AVX-512 F, BW, VL and DQ: what the AVX-512 kernels are compiled for. */
int sl_cpu_has_avx512(void);
/* AVX512-VNNI (vpdpbusd on zmm; the int8 kernels, gemm_int8.h) and AVX-VNNI (its VEX form on ymm). */
int sl_cpu_has_avx512_vnni(void);
int sl_cpu_has_avx_vnni(void);

#endif

/* Run-time CPU feature dispatch. The AVX2+FMA kernels are compiled with target attributes, so
 * the extension itself needs no -mavx2 and runs on any x86-64 (and aarch64 via the fallback). */
#ifndef SL_CPU_H
#define SL_CPU_H

typedef enum { SL_SIMD_GENERIC = 0, SL_SIMD_AVX2 = 1 } sl_simd_level;

/* The level in use: the best the CPU supports, unless SINKLAB_SIMD=generic (read at first call)
 * or sl_set_simd() forced another. */
sl_simd_level sl_simd(void);
/* Forces a level; returns the level now in use (a level the CPU lacks falls back to generic). */
sl_simd_level sl_set_simd(sl_simd_level level);
const char *sl_simd_name(sl_simd_level level);
int sl_cpu_has_avx2_fma(void);

#endif

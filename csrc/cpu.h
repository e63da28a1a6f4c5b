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
/* AVX-VNNI: vpdpbusd's VEX form on ymm (the int8 kernels, gemm_int8.h; AVX512-VNNI is below). */
int sl_cpu_has_avx_vnni(void);

/* Features beyond the fp32 kernels, each read from CPUID and checked against the state the OS
 * saves (XCR0): AVX512-BF16 (vdpbf16ps, vcvtneps2bf16; also needs sl_cpu_has_avx512), AVX512-VNNI
 * (vpdpbusd), AMX-BF16 and AMX-INT8 (tile registers: CPUID AMX-TILE plus the format, and XCR0's
 * XTILECFG and XTILEDATA bits). The AMX bits say the hardware and OS support tiles; a process
 * must still ask Linux for permission before its first tile instruction (sl_cpu_amx_request). */
int sl_cpu_has_avx512_bf16(void);
int sl_cpu_has_avx512_vnni(void);
int sl_cpu_has_amx_bf16(void);
int sl_cpu_has_amx_int8(void);
/* Asks the OS once for the AMX tile data state (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA)); 1 when tiles may be used now, 0 when the CPU has no AMX or the request
 * was refused (elsewhere than Linux: 1 when the CPU and XCR0 have AMX). The result is cached. */
int sl_cpu_amx_request(void);

#endif

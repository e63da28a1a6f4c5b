/* Run-time CPU feature dispatch: pick the AVX-512 or AVX2+FMA kernels when the CPU has them,
 * unless SINKLAB_SIMD (read once, at the first call) asks for a lower level. */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define SL_CPU_X86 1
#else
#define SL_CPU_X86 0
#endif

int sl_cpu_has_avx2_fma(void) {
#if SL_CPU_X86
    static int cached = -1; /* racing threads all write the same value */
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
#else
    return 0;
#endif
}

int sl_cpu_has_avx512(void) {
#if SL_CPU_X86
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = sl_cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512dq");
    }
    return cached;
#else
    return 0;
#endif
}

int sl_cpu_has_avx512_vnni(void) {
#if SL_CPU_X86
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = sl_cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
    }
    return cached;
#else
    return 0;
#endif
}

int sl_cpu_has_avx_vnni(void) {
#if SL_CPU_X86 && (defined(__clang__) || __GNUC__ >= 11)
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = sl_cpu_has_avx2_fma() && __builtin_cpu_supports("avxvnni");
    }
    return cached;
#else
    return 0;
#endif
}

/* -1: not decided yet. Otherwise an sl_simd_level. */
static int sl_simd_level_now = -1;

sl_simd_level sl_simd_best(void) {
    if (sl_cpu_has_avx512()) return SL_SIMD_AVX512;
    return sl_cpu_has_avx2_fma() ? SL_SIMD_AVX2 : SL_SIMD_GENERIC;
}

int sl_simd_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "generic")) return SL_SIMD_GENERIC;
    if (!strcmp(name, "avx2")) return SL_SIMD_AVX2;
    if (!strcmp(name, "avx512")) return SL_SIMD_AVX512;
    if (!strcmp(name, "auto")) return sl_simd_best();
    return -1;
}

static sl_simd_level clamp_to_cpu(int level) {
    const sl_simd_level best = sl_simd_best();
    return level < 0 || level > (int)best ? best : (sl_simd_level)level;
}

sl_simd_level sl_simd(void) {
    int level = sl_simd_level_now;
    if (level < 0) {
        /* unset or unknown: the best available (the Python package warns about unknown names) */
        level = clamp_to_cpu(sl_simd_parse(getenv("SINKLAB_SIMD")));
        sl_simd_level_now = level;
    }
    return (sl_simd_level)level;
}

sl_simd_level sl_set_simd(sl_simd_level level) {
    sl_simd_level_now = clamp_to_cpu((int)level);
    return (sl_simd_level)sl_simd_level_now;
}

const char *sl_simd_name(sl_simd_level level) {
    switch (level) {
    case SL_SIMD_AVX512: return "avx512";
    case SL_SIMD_AVX2: return "avx2";
    default: return "generic";
    }
}

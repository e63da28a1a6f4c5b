/* Run-time CPU feature dispatch: pick the AVX2+FMA kernels when the CPU has them, unless
 * SINKLAB_SIMD=generic asks for the portable path (read once, at the first call). */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

int sl_cpu_has_avx2_fma(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
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

/* -1: not decided yet. Otherwise an sl_simd_level. */
static int sl_simd_level_now = -1;

static sl_simd_level best_available(void) {
    return sl_cpu_has_avx2_fma() ? SL_SIMD_AVX2 : SL_SIMD_GENERIC;
}

sl_simd_level sl_simd(void) {
    int level = sl_simd_level_now;
    if (level < 0) {
        level = best_available();
        const char *env = getenv("SINKLAB_SIMD");
        /* "avx2", "auto", unset or unknown: best available (avx2 on a CPU without it falls back) */
        if (env && !strcmp(env, "generic")) level = SL_SIMD_GENERIC;
        sl_simd_level_now = level;
    }
    return (sl_simd_level)level;
}

sl_simd_level sl_set_simd(sl_simd_level level) {
    if (level == SL_SIMD_AVX2 && !sl_cpu_has_avx2_fma()) level = SL_SIMD_GENERIC;
    if (level != SL_SIMD_AVX2) level = SL_SIMD_GENERIC;
    sl_simd_level_now = level;
    return level;
}

const char *sl_simd_name(sl_simd_level level) {
    return level == SL_SIMD_AVX2 ? "avx2" : "generic";
}

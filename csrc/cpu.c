/* Run-time CPU feature dispatch: pick the AVX-512 or AVX2+FMA kernels when the CPU has them,
 * unless SINKLAB_SIMD (read once, at the first call) asks for a lower level. */
/* syscall() is not in strict C11's headers: ask glibc for the default (BSD/SVID) ones */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE
#endif
#include "cpu.h"

#include <stdint.h>

#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define SL_CPU_X86 1
#include <cpuid.h>
#else
#define SL_CPU_X86 0
#endif
#if SL_CPU_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
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

/* ------------------------------------------------------------------------------------------
 * CPUID leaf 7 bits and XCR0. __builtin_cpu_supports has no name for AMX in gcc 12 and none for
 * avx512bf16 before gcc 11, so these read CPUID themselves. */

#if SL_CPU_X86
/* XCR0 (the state components the OS saves on a context switch), 0 without OSXSAVE. */
static uint64_t xcr0(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* CPUID.(7, sub).{ebx, ecx, edx, eax}[which], 0 when leaf 7 is absent. */
static unsigned leaf7(unsigned sub, int which) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, sub, a, b, c, d);
    return which == 0 ? b : which == 1 ? c : which == 2 ? d : a;
}

/* opmask, upper halves of zmm0-15 and zmm16-31 (bits 5-7) with SSE and AVX state (bits 1-2) */
static int os_saves_zmm(void) { return (xcr0() & 0xE6) == 0xE6; }
/* XTILECFG and XTILEDATA (bits 17-18) */
static int os_saves_tiles(void) { return (xcr0() & (3ull << 17)) == (3ull << 17); }
#endif

int sl_cpu_has_avx512_bf16(void) {
#if SL_CPU_X86
    static int cached = -1;
    if (cached < 0) cached = sl_cpu_has_avx512() && os_saves_zmm() && (leaf7(1, 3) >> 5 & 1); /* 7.1:EAX[5] */
    return cached;
#else
    return 0;
#endif
}

/* read from CPUID (not __builtin_cpu_supports: clang 14 does not know "avxvnni") */
int sl_cpu_has_avx_vnni(void) {
#if SL_CPU_X86
    static int cached = -1;
    if (cached < 0) cached = sl_cpu_has_avx2_fma() && (leaf7(1, 3) >> 4 & 1); /* 7.1:EAX[4] */
    return cached;
#else
    return 0;
#endif
}

int sl_cpu_has_avx512_vnni(void) {
#if SL_CPU_X86
    static int cached = -1;
    if (cached < 0) cached = sl_cpu_has_avx512() && os_saves_zmm() && (leaf7(0, 1) >> 11 & 1); /* 7.0:ECX[11] */
    return cached;
#else
    return 0;
#endif
}

#if SL_CPU_X86
/* AMX-TILE (7.0:EDX[24]) with the given format bit (EDX[22] BF16, EDX[25] INT8), tiles in XCR0 */
static int has_amx(int format_bit) {
    const unsigned d = leaf7(0, 2);
    return (d >> 24 & 1) && (d >> format_bit & 1) && os_saves_tiles();
}
#endif

int sl_cpu_has_amx_bf16(void) {
#if SL_CPU_X86
    static int cached = -1;
    if (cached < 0) cached = has_amx(22);
    return cached;
#else
    return 0;
#endif
}

int sl_cpu_has_amx_int8(void) {
#if SL_CPU_X86
    static int cached = -1;
    if (cached < 0) cached = has_amx(25);
    return cached;
#else
    return 0;
#endif
}

int sl_cpu_amx_request(void) {
#if SL_CPU_X86
    static int cached = -1;
    if (cached < 0) {
        int ok = sl_cpu_has_amx_bf16() || sl_cpu_has_amx_int8();
#if defined(__linux__) && defined(SYS_arch_prctl)
        /* Linux 5.16+ keeps tile data disabled (XFD) until the process asks; the first tile
         * instruction without this permission kills the process with SIGILL. */
        enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
        if (ok) ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
        cached = ok;
    }
    return cached;
#else
    return 0;
#endif
}

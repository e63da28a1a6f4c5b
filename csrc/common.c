/* Call contexts (error message and thread count per call) and checked allocation. */
#include "sl_common.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(_OPENMP) && (!defined(SL_HAVE_OPENMP) || SL_HAVE_OPENMP)
#include <omp.h>
#define SL_COMMON_OMP 1
#else
#define SL_COMMON_OMP 0
#endif

/* 0: not set, use the OpenMP default. Atomic because any Python thread may set it while
 * others start calls; a call reads it once, at sl_ctx_begin, so it never changes mid-call. */
static atomic_int sl_threads_setting = 0;
/* The calling OS thread's own count (0: none), which wins over the process-wide one: a Python
 * thread is an OS thread, so two Python threads can run calls with different counts at once. */
static _Thread_local int sl_threads_this_thread = 0;

/* The context registered by the calling thread (NULL: none), and the thread's fallback. */
static _Thread_local sl_ctx *sl_ctx_registered = NULL;
static _Thread_local sl_ctx sl_ctx_default = {{0}, 0, 0};

/* Set from a signal handler: a lock-free atomic store is async-signal-safe. */
static atomic_int sl_interrupt_flag = 0;

void sl_interrupt_set(int on) { atomic_store(&sl_interrupt_flag, on ? 1 : 0); }

static double sl_gap_last, sl_gap_max; /* under critical(sl_check_gaps): workers check too */
static int64_t sl_gap_count;

static double seconds_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void note_check_gap(void) {
    const double now = seconds_now();
#pragma omp critical(sl_check_gaps)
    {
        if (now - sl_gap_last > sl_gap_max) sl_gap_max = now - sl_gap_last;
        sl_gap_last = now;
        sl_gap_count++;
    }
}

void sl_check_gaps_begin(void) {
#pragma omp critical(sl_check_gaps)
    {
        sl_gap_last = seconds_now();
        sl_gap_max = 0.0;
        sl_gap_count = 0;
    }
}

void sl_check_gaps_end(int64_t *n_checks, double *max_gap_s) {
    note_check_gap(); /* the stretch from the last check to the return */
#pragma omp critical(sl_check_gaps)
    {
        *n_checks = sl_gap_count - 1;
        *max_gap_s = sl_gap_max;
    }
}

int sl_check_interrupt(void) {
    const sl_ctx *c = sl_ctx_current();
    if (!c->interruptible) return SL_OK;
    note_check_gap();
    if (atomic_load_explicit(&sl_interrupt_flag, memory_order_relaxed))
        return sl_fail(SL_ERR_INTERRUPTED, "interrupted (SIGINT or SIGTERM)");
    return SL_OK;
}

void sl_set_num_threads(int n) { atomic_store(&sl_threads_setting, n < 1 ? 0 : n); }

int sl_set_thread_num_threads(int n) {
    const int prev = sl_threads_this_thread;
    sl_threads_this_thread = n < 1 ? 0 : n;
    return prev;
}

int sl_get_num_threads(void) {
    if (sl_threads_this_thread > 0) return sl_threads_this_thread;
    int n = atomic_load(&sl_threads_setting);
    if (n > 0) return n;
#if SL_COMMON_OMP
    n = omp_get_max_threads();
#endif
    return n > 0 ? n : 1;
}

sl_ctx *sl_ctx_begin(sl_ctx *ctx) {
    ctx->err[0] = '\0';
    ctx->num_threads = sl_get_num_threads();
    ctx->interruptible = 0;
    return sl_ctx_enter(ctx);
}

void sl_ctx_end(sl_ctx *prev) { sl_ctx_leave(prev); }

sl_ctx *sl_ctx_enter(sl_ctx *ctx) {
    sl_ctx *prev = sl_ctx_registered;
    sl_ctx_registered = ctx;
    return prev;
}

void sl_ctx_leave(sl_ctx *prev) { sl_ctx_registered = prev; }

sl_ctx *sl_ctx_current(void) {
    if (sl_ctx_registered) return sl_ctx_registered;
    /* No registration: follow the process-wide setting as of now. */
    sl_ctx_default.num_threads = sl_get_num_threads();
    return &sl_ctx_default;
}

int sl_num_threads(void) {
    const sl_ctx *c = sl_ctx_registered;
    return c ? c->num_threads : sl_get_num_threads();
}

static int sl_vfail(sl_ctx *ctx, int code, const char *fmt, va_list ap) {
    /* Workers of one call share its context; failures are rare, so one lock is enough. */
#pragma omp critical(sl_ctx_err)
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    return code;
}

int sl_fail_ctx(sl_ctx *ctx, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sl_vfail(ctx ? ctx : sl_ctx_current(), code, fmt, ap);
    va_end(ap);
    return code;
}

int sl_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sl_vfail(sl_ctx_current(), code, fmt, ap);
    va_end(ap);
    return code;
}

const char *sl_last_error(void) {
    const sl_ctx *c = sl_ctx_current();
    return c->err[0] ? c->err : "unknown error in sinklab core";
}

int sl_mul_size(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* Bytes allocated for n floats: a positive multiple of 64; 0 on overflow or negative n. */
static size_t float_bytes(int64_t n) {
    int64_t bytes;
    if (n < 0 || !sl_mul_size(n, (int64_t)sizeof(float), &bytes) || bytes > INT64_MAX - 64) return 0;
    if (bytes == 0) bytes = 64;
    bytes = (bytes + 63) & ~(int64_t)63;
    return (uint64_t)bytes > (uint64_t)SIZE_MAX ? 0 : (size_t)bytes;
}

float *sl_alloc_floats_uninit(int64_t n) {
    const size_t bytes = float_bytes(n);
    float *p = bytes ? (float *)aligned_alloc(64, bytes) : NULL;
#ifdef SL_POISON_UNINIT
    /* Test builds: NaN everywhere, so a float read before it is written shows in the results. */
    if (p) memset(p, 0xff, bytes);
#endif
    return p;
}

float *sl_alloc_floats(int64_t n) {
    float *p = sl_alloc_floats_uninit(n);
    if (p) memset(p, 0, float_bytes(n));
    return p;
}

void sl_free(void *p) { free(p); }

/* Shared definitions of the sinklab C core: status codes, the call context (error message and
 * thread count of one call), checked sizes.
 * The core never sees a PyObject; every function returns SL_OK or an error code and leaves a
 * message in the current call context, which the binding turns into a Python exception. */
#ifndef SL_COMMON_H
#define SL_COMMON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    SL_OK = 0,
    SL_ERR_VALUE = 1,   /* bad argument: maps to ValueError */
    SL_ERR_MEMORY = 2,  /* allocation failed or size overflow: MemoryError */
    SL_ERR_FORMAT = 3,  /* corrupt or unsupported data: ValueError */
    SL_ERR_INTERNAL = 4, /* should not happen: RuntimeError */
    SL_ERR_INTERRUPTED = 5 /* SIGINT arrived during the call: KeyboardInterrupt */
} sl_status;

/* Call context. The binding puts one on its own stack at each entry point and registers it for
 * the calling thread (sl_ctx_begin/sl_ctx_end); the core reads the thread count from it and
 * writes error messages into it, so two Python threads calling at once never see each other's
 * message, and the thread count means the same in every Python thread (an OpenMP
 * omp_set_num_threads would change only the calling thread's setting).
 *
 * OpenMP workers are other OS threads, with their own (empty) registration: a parallel region
 * whose body can fail captures the caller's context before the region (sl_ctx_current) and
 * either reports through it (sl_fail_ctx) or registers it in each worker (sl_ctx_enter) so
 * that nested calls to sl_fail reach it. Writes to a context are serialised, since the workers
 * of one call share it.
 *
 * A thread that never registered a context (a C program using the core directly) gets a
 * per-thread default one that follows the process-wide thread count. */
#define SL_ERR_LEN 512

typedef struct sl_ctx {
    char err[SL_ERR_LEN]; /* last error message of this call; "" while none */
    int num_threads;      /* OpenMP team size for this call's parallel regions, >= 1 */
    int interruptible;    /* sl_check_interrupt may stop this call (the binding's SIGINT guard is on) */
} sl_ctx;

/* Process-wide thread count (atomic). n < 1 restores the OpenMP default (omp_get_max_threads()
 * of the calling thread, 1 without OpenMP). */
void sl_set_num_threads(int n);
/* The calling thread's own count, which overrides the process-wide one (n < 1: none); returns
 * the previous one (0: none). */
int sl_set_thread_num_threads(int n);
/* The count a context begun now on this thread starts with: the thread's own, else the
 * process-wide one. */
int sl_get_num_threads(void);

/* Initialises ctx (empty message, this thread's thread count), registers it for the calling
 * thread and returns the previous registration, to be given back to sl_ctx_end. */
sl_ctx *sl_ctx_begin(sl_ctx *ctx);
void sl_ctx_end(sl_ctx *prev);

/* Registers ctx (already initialised, e.g. captured from the caller of a parallel region) for
 * the calling thread; returns the previous registration for sl_ctx_leave. */
sl_ctx *sl_ctx_enter(sl_ctx *ctx);
void sl_ctx_leave(sl_ctx *prev);

/* The calling thread's context: the registered one or the thread's default. Never NULL. */
sl_ctx *sl_ctx_current(void);

/* Team size for a parallel region opened by the calling thread: the current context's. */
int sl_num_threads(void);

/* Records a printf-style message in ctx (sl_fail: the current context) and returns code. */
int sl_fail_ctx(sl_ctx *ctx, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int sl_fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Ctrl-C. The binding, when Python's main thread enters a long call, installs a SIGINT handler
 * that sets a process-wide flag (and chains to Python's own handler) and marks the call's context
 * interruptible. Long loops call sl_check_interrupt between blocks (layers, chunks): it returns
 * SL_ERR_INTERRUPTED once the flag is set, so the call unwinds through its normal error path,
 * freeing what it allocated, and Python raises KeyboardInterrupt. */
void sl_interrupt_set(int on);
int sl_check_interrupt(void);
/* The spacing of those checks in the interruptible call now running (one at a time: the main
 * thread's), which bounds Ctrl-C's latency whenever the signal lands: _begin at its start,
 * _end at its return gives the number of checks and the longest time (s) without one. */
void sl_check_gaps_begin(void);
void sl_check_gaps_end(int64_t *n_checks, double *max_gap_s);

/* The current context's message (a generic text while none was recorded). */
const char *sl_last_error(void);

/* a*b into *out; returns 0 (and leaves *out untouched) on overflow or negative input. */
int sl_mul_size(int64_t a, int64_t b, int64_t *out);

/* Aligned allocation of n floats (64-byte aligned, zeroed); NULL on failure or overflow. */
float *sl_alloc_floats(int64_t n);
/* The same without zeroing, for buffers every float of which is written before it is read
 * (a zeroing pass over the backward's hundreds of MB costs a few percent of it). */
float *sl_alloc_floats_uninit(int64_t n);
void sl_free(void *p);

#define SL_TRY(expr)                  \
    do {                              \
        int sl_rc_ = (expr);          \
        if (sl_rc_ != SL_OK) return sl_rc_; \
    } while (0)

#endif

/* Ctrl-C during long calls of the binding. While Python's main thread runs a long call with the
 * GIL released, Python's SIGINT handler only trips a flag that nothing reads until the call
 * returns, so Ctrl-C would wait for the whole computation. The guard swaps in a handler that
 * also sets the core's interrupt flag (read between layers by sl_check_interrupt) and chains to
 * Python's handler, then restores it. SIGTERM is guarded the same way where Python handles it
 * (sinklab.runtime.sigterm_as_interrupt: the CLI, a campaign's workers). A signal that is ignored
 * (SIG_IGN) or left to the default action is not touched. Include after Python.h (it defines
 * the POSIX feature macros that struct sigaction needs under -std=c11). */
#ifndef SL_INTERRUPT_H
#define SL_INTERRUPT_H

#include <signal.h>
#include <stdint.h>

#include "sl_common.h"

#if defined(__unix__) || defined(__APPLE__)
#define SL_HAVE_SIGINT_GUARD 1
#else
#define SL_HAVE_SIGINT_GUARD 0
#endif

#define SL_GUARDED_SIGNALS 2 /* SIGINT, SIGTERM */

typedef struct {
    int on;
#if SL_HAVE_SIGINT_GUARD
    unsigned char guarded[SL_GUARDED_SIGNALS];
    struct sigaction prev[SL_GUARDED_SIGNALS];
#endif
} sl_sigint_guard;

/* Records the calling thread as Python's main thread (the module's init runs there, as a rule):
 * only calls from that thread are guarded, since only it runs Python's signal handlers. */
void sl_sigint_init(void);

/* Whether guards also take SIGTERM (set while sinklab.runtime.sigterm_as_interrupt installs
 * Python's handler for it); returns the previous setting. Main thread, GIL held. */
int sl_set_guard_sigterm(int on);

/* Call with the GIL held, after sl_ctx_begin(ctx): guards the call (ctx->interruptible set) when
 * it runs on the main thread and Python handles SIGINT (or SIGTERM, see above). */
void sl_sigint_guard_begin(sl_sigint_guard *g, sl_ctx *ctx);
void sl_sigint_guard_end(sl_sigint_guard *g);

/* The last guarded call's Ctrl-C checks: their count (-1: no guarded call yet) and the longest
 * time without one in seconds, for the tests. */
void sl_sigint_last_checks(int64_t *checks, double *longest_gap_s);

#endif

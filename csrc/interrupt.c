/* The binding's interrupt guard (interrupt.h): SIGINT, and SIGTERM where Python handles it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "interrupt.h"

#include <string.h>

static int64_t sl_last_checks = -1;
/* SIGTERM is guarded only while sinklab's own handler (Terminated) is Python's: another
 * handler (one that logs, say) must not stop a computation it did not ask to stop */
static int sl_guard_sigterm = 0;
static double sl_last_check_gap = 0.0;

#if SL_HAVE_SIGINT_GUARD
static unsigned long sl_main_thread;
static const int sl_guarded[SL_GUARDED_SIGNALS] = {SIGINT, SIGTERM};
/* Python's handlers, chained to, set while a guard is on (index: position in sl_guarded) */
static struct sigaction sl_python_handler[SL_GUARDED_SIGNALS];

static void sl_on_signal(int sig) {
    sl_interrupt_set(1);
    const struct sigaction *py = &sl_python_handler[sig == SIGTERM];
    if (py->sa_handler != SIG_DFL && py->sa_handler != SIG_IGN) py->sa_handler(sig);
}

/* Python handles sig at the C level (its handler is neither the default action nor ignored) */
static int sl_python_handles(int sig, struct sigaction *cur) {
    return sigaction(sig, NULL, cur) == 0 && !(cur->sa_flags & SA_SIGINFO) && cur->sa_handler != SIG_IGN &&
           cur->sa_handler != SIG_DFL && cur->sa_handler != sl_on_signal;
}
#endif

void sl_sigint_init(void) {
#if SL_HAVE_SIGINT_GUARD
    sl_main_thread = PyThread_get_thread_ident();
#endif
}

int sl_set_guard_sigterm(int on) {
    int prev = sl_guard_sigterm;
    sl_guard_sigterm = on != 0;
    return prev;
}

void sl_sigint_guard_begin(sl_sigint_guard *g, sl_ctx *ctx) {
    g->on = 0;
#if SL_HAVE_SIGINT_GUARD
    if (PyThread_get_thread_ident() != sl_main_thread) return;
    sl_interrupt_set(0);
    for (int i = 0; i < SL_GUARDED_SIGNALS; i++) {
        g->guarded[i] = 0;
        struct sigaction cur;
        if ((sl_guarded[i] == SIGTERM && !sl_guard_sigterm) || !sl_python_handles(sl_guarded[i], &cur)) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = sl_on_signal;
        sigemptyset(&sa.sa_mask);
        sl_python_handler[i] = cur;
        if (sigaction(sl_guarded[i], &sa, &g->prev[i]) != 0) continue;
        g->guarded[i] = 1;
        g->on = 1;
    }
    if (g->on) {
        ctx->interruptible = 1;
        sl_check_gaps_begin();
    }
#else
    (void)ctx;
#endif
}

void sl_sigint_guard_end(sl_sigint_guard *g) {
#if SL_HAVE_SIGINT_GUARD
    if (g->on) {
        for (int i = 0; i < SL_GUARDED_SIGNALS; i++)
            if (g->guarded[i]) sigaction(sl_guarded[i], &g->prev[i], NULL);
        sl_check_gaps_end(&sl_last_checks, &sl_last_check_gap);
    }
#endif
    g->on = 0;
}

void sl_sigint_last_checks(int64_t *checks, double *longest_gap_s) {
    *checks = sl_last_checks;
    *longest_gap_s = sl_last_check_gap;
}

/* The binding's SIGINT guard (interrupt.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "interrupt.h"

#include <string.h>

static int64_t sl_last_checks = -1;
static double sl_last_check_gap = 0.0;

#if SL_HAVE_SIGINT_GUARD
static unsigned long sl_main_thread;
static struct sigaction sl_python_sigint; /* the handler chained to, set while a guard is on */

static void sl_on_sigint(int sig) {
    sl_interrupt_set(1);
    if (sl_python_sigint.sa_handler != SIG_DFL && sl_python_sigint.sa_handler != SIG_IGN)
        sl_python_sigint.sa_handler(sig);
}
#endif

void sl_sigint_init(void) {
#if SL_HAVE_SIGINT_GUARD
    sl_main_thread = PyThread_get_thread_ident();
#endif
}

void sl_sigint_guard_begin(sl_sigint_guard *g, sl_ctx *ctx) {
    g->on = 0;
#if SL_HAVE_SIGINT_GUARD
    if (PyThread_get_thread_ident() != sl_main_thread) return;
    struct sigaction cur;
    if (sigaction(SIGINT, NULL, &cur) != 0 || (cur.sa_flags & SA_SIGINFO) || cur.sa_handler == SIG_IGN ||
        cur.sa_handler == SIG_DFL || cur.sa_handler == sl_on_sigint)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sl_on_sigint;
    sigemptyset(&sa.sa_mask);
    sl_python_sigint = cur;
    sl_interrupt_set(0);
    if (sigaction(SIGINT, &sa, &g->prev) != 0) return;
    ctx->interruptible = 1;
    g->on = 1;
    sl_check_gaps_begin();
#else
    (void)ctx;
#endif
}

void sl_sigint_guard_end(sl_sigint_guard *g) {
#if SL_HAVE_SIGINT_GUARD
    if (g->on) {
        sigaction(SIGINT, &g->prev, NULL);
        sl_check_gaps_end(&sl_last_checks, &sl_last_check_gap);
    }
#endif
    g->on = 0;
}

void sl_sigint_last_checks(int64_t *checks, double *longest_gap_s) {
    *checks = sl_last_checks;
    *longest_gap_s = sl_last_check_gap;
}

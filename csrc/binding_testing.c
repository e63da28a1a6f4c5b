/* Test-only entry points of the binding: what the tests read of a call that the public API does
 * not show (the team size a kernel gets, the spacing of Ctrl-C checks), without timing. */
#include "binding.h"

#include "interrupt.h"
#include "sl_common.h"

#if SL_HAVE_OPENMP
#include <omp.h>
#endif

PyObject *sl_py_interrupt_check_gaps(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    int64_t checks;
    double gap;
    sl_sigint_last_checks(&checks, &gap);
    return Py_BuildValue("(Ld)", (long long)checks, gap);
}

/* The team size a kernel's parallel region gets when called from this Python thread now (a
 * region opened exactly as the kernels open theirs, from a fresh call context). */
static int team_of_call(void *p) {
    int team = 1;
#pragma omp parallel num_threads(sl_num_threads())
    {
#if SL_HAVE_OPENMP
#pragma omp single
        team = omp_get_num_threads();
#endif
    }
    *(int *)p = team;
    return SL_OK;
}

PyObject *sl_py_team_size(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    int team = 1;
    if (sl_py_call(team_of_call, &team, 0) < 0) return NULL;
    return PyLong_FromLong(team);
}

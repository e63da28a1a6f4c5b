/* Test-only entry points of the binding: what the tests read of a call that the public API does
 * not show (the team size a kernel gets, the spacing of Ctrl-C checks), without timing. */
#include "binding.h"

#include "gemm_bf16.h"
#include "interrupt.h"
#include "quant.h"
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

/* ---------------------------------------------------------------- bf16 kernels (test hooks) */

typedef struct {
    const float *src;
    sl_bf16 *dst;
    int64_t n;
    int path;
} bf16_round_call;

static int run_bf16_round(void *p) {
    const bf16_round_call *c = p;
    return sl_bf16_round(c->src, c->dst, c->n, c->path);
}

/* _bf16_round(x float32 (n,), path=0) -> uint16 (n,): sl_bf16_round on the given path. */
PyObject *sl_py_bf16_round(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "path", NULL};
    PyObject *xo;
    int path = SL_BF16_AUTO;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i", kwlist, &xo, &path)) return NULL;
    PyArrayObject *x = sl_py_check_array(xo, "x", NPY_FLOAT32, 1, NULL, 0);
    if (!x) return NULL;
    npy_intp dims[1] = {PyArray_DIM(x, 0)};
    PyArrayObject *out = (PyArrayObject *)PyArray_EMPTY(1, dims, NPY_UINT16, 0);
    if (!out) return NULL;
    bf16_round_call c = {PyArray_DATA(x), PyArray_DATA(out), dims[0], path};
    if (sl_py_call(run_bf16_round, &c, 0) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return (PyObject *)out;
}

typedef struct {
    sl_weight w;
    int64_t M, lda;
    const float *a;
    float *c;
    int accumulate, path;
    long long repeat;
} bf16_linear_call;

static int run_bf16_linear(void *p) {
    const bf16_linear_call *c = p;
    sl_bf16_panels *pan;
    SL_TRY(sl_bf16_pack(&c->w, 1, &pan));
    int rc = SL_OK;
    for (long long r = 0; r < c->repeat && rc == SL_OK; r++)
        rc = sl_bf16_linear_nt(c->M, c->a, c->lda, pan, c->c, c->w.rows, c->accumulate, 1, c->path);
    sl_bf16_panels_free(pan);
    return rc;
}

/* _bf16_linear(A float32 (M, K), W, type=0, rows=0, C=None, accumulate=False, path=0, repeat=1) -> C (M, N):
 * W packed into bf16 panels (a float32 (N, K) array with type 0, or the raw uint8 bytes of N = rows
 * rows of ggml type `type`), then C = bf16(A) · Wᵀ (+ C) on the given path (0 auto, 1 portable,
 * 2 AVX512-BF16); the product runs `repeat` times on the panels packed once (benchmarks time the
 * difference between repeat counts to leave packing out). */
PyObject *sl_py_bf16_linear(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"A", "W", "type", "rows", "C", "accumulate", "path", "repeat", NULL};
    PyObject *ao, *wo, *co = Py_None;
    int type = 0, accumulate = 0, path = SL_BF16_AUTO;
    long long rows = 0, repeat = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|iLOpiL", kwlist, &ao, &wo, &type, &rows, &co, &accumulate, &path,
                                     &repeat))
        return NULL;
    if (repeat < 1) return PyErr_Format(PyExc_ValueError, "repeat must be >= 1, got %lld", repeat);
    PyArrayObject *a = sl_py_check_array(ao, "A", NPY_FLOAT32, 2, NULL, 0);
    if (!a) return NULL;
    const npy_intp M = PyArray_DIM(a, 0), K = PyArray_DIM(a, 1);
    bf16_linear_call c = {{0}, M, K, PyArray_DATA(a), NULL, accumulate, path, repeat};
    if (type == SL_GGML_F32 && PyArray_Check(wo) && PyArray_TYPE((PyArrayObject *)wo) == NPY_FLOAT32) {
        npy_intp wd[2] = {-1, K};
        PyArrayObject *w = sl_py_check_array(wo, "W", NPY_FLOAT32, 2, wd, 0);
        if (!w) return NULL;
        if (PyArray_DIM(w, 0) < 1 || K < 1) return PyErr_Format(PyExc_ValueError, "W must be non-empty");
        c.w = sl_weight_f32(PyArray_DATA(w), PyArray_DIM(w, 0), K);
    } else {
        PyArrayObject *w = sl_py_check_array(wo, "W", NPY_UINT8, 1, NULL, 0);
        if (!w) return NULL;
        if (sl_weight_init(&c.w, type, PyArray_DATA(w), PyArray_DIM(w, 0), rows, K) != SL_OK)
            return PyErr_Format(PyExc_ValueError, "W: %s", sl_last_error());
    }
    npy_intp dims[2] = {M, (npy_intp)c.w.rows};
    PyArrayObject *out;
    if (co == Py_None) {
        if (accumulate) return PyErr_Format(PyExc_ValueError, "accumulate=True needs C");
        out = (PyArrayObject *)PyArray_ZEROS(2, dims, NPY_FLOAT32, 0);
        if (!out) return NULL;
    } else {
        if (!sl_py_check_array(co, "C", NPY_FLOAT32, 2, dims, 1)) return NULL;
        out = (PyArrayObject *)co;
        Py_INCREF(out);
    }
    c.c = PyArray_DATA(out);
    if (sl_py_call(run_bf16_linear, &c, 0) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return (PyObject *)out;
}

/* _bf16_path(requested) -> "avx512_bf16" | "portable" | None: what a kernel path request resolves to. */
PyObject *sl_py_bf16_path(PyObject *self, PyObject *arg) {
    (void)self;
    long r = PyLong_AsLong(arg);
    if (r == -1 && PyErr_Occurred()) return NULL;
    const int p = sl_bf16_path((int)r);
    if (p < 0) Py_RETURN_NONE;
    return PyUnicode_FromString(sl_bf16_path_name(p));
}

typedef struct {
    long long iters;
    double gflops;
} bf16_peak_call;

static int run_bf16_peak(void *p) {
    bf16_peak_call *c = p;
    c->gflops = sl_bf16_peak_gflops(c->iters);
    return SL_OK;
}

/* _bf16_peak(iters) -> GFLOP/s of register-only vdpbf16ps on the calling thread (-1 without it). */
PyObject *sl_py_bf16_peak(PyObject *self, PyObject *arg) {
    (void)self;
    long long iters = PyLong_AsLongLong(arg);
    if (iters == -1 && PyErr_Occurred()) return NULL;
    if (iters < 1) return PyErr_Format(PyExc_ValueError, "iters must be >= 1, got %lld", iters);
    bf16_peak_call c = {iters, 0.0};
    if (sl_py_call(run_bf16_peak, &c, 0) < 0) return NULL;
    return PyFloat_FromDouble(c.gflops);
}

/* Test-only entry points of the binding: what the tests read of a call that the public API does
 * not show (the team size a kernel gets, the spacing of Ctrl-C checks), without timing. */
#include "binding.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "gemm_int8.h"
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

/* ---------------------------------------------------------------- int8 linear layers (gemm_int8.h)
 * Test and benchmark entries only: the model does not use int8 yet. */
#define SL_INT8_CAPSULE "sinklab.int8_weight"

static void int8_weight_destroy(PyObject *capsule) {
    sl_int8_weight *pw = PyCapsule_GetPointer(capsule, SL_INT8_CAPSULE);
    if (!pw) return;
    sl_int8_weight_free(pw);
    PyMem_Free(pw);
}

typedef struct {
    sl_weight w;
    int type;
    const void *data;
    int64_t nbytes, rows, cols;
    sl_int8_weight *pw;
} int8_pack_call;

static int run_int8_pack(void *p) {
    int8_pack_call *c = p;
    SL_TRY(sl_weight_init(&c->w, c->type, c->data, c->nbytes, c->rows, c->cols));
    return sl_int8_weight_init(c->pw, &c->w, 1);
}

PyObject *sl_py_int8_prepack(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data;
    int type;
    long long rows, cols;
    if (!PyArg_ParseTuple(args, "OiLL", &data, &type, &rows, &cols)) return NULL;
    PyArrayObject *src = sl_py_check_array(data, "weight_bytes", NPY_UINT8, 1, NULL, 0);
    if (!src) return NULL;
    sl_int8_weight *pw = PyMem_Calloc(1, sizeof *pw);
    if (!pw) return PyErr_NoMemory();
    int8_pack_call c = {{0, NULL, 0, 0, 0}, type, PyArray_DATA(src), (int64_t)PyArray_NBYTES(src), rows, cols, pw};
    if (sl_py_call(run_int8_pack, &c, 0) < 0) {
        PyMem_Free(pw);
        return NULL;
    }
    PyObject *cap = PyCapsule_New(pw, SL_INT8_CAPSULE, int8_weight_destroy);
    if (!cap) {
        sl_int8_weight_free(pw);
        PyMem_Free(pw);
    }
    return cap;
}

typedef struct {
    int64_t M;
    const float *a;
    int64_t lda;
    const sl_int8_weight *pw;
    sl_weight w;
    int packed;
    float *c;
    int64_t ldc;
    int accumulate;
} int8_linear_call;

static int run_int8_linear(void *p) {
    const int8_linear_call *c = p;
    if (c->packed) return sl_linear_nt_int8_packed(c->M, c->a, c->lda, c->pw, c->c, c->ldc, c->accumulate, 1);
    return sl_linear_nt_int8(c->M, c->a, c->lda, &c->w, c->c, c->ldc, c->accumulate, 1);
}

typedef struct {
    sl_weight *w;
    int type;
    const void *data;
    int64_t nbytes, rows, cols;
} weight_init_call;

static int run_weight_init(void *p) {
    weight_init_call *c = p;
    return sl_weight_init(c->w, c->type, c->data, c->nbytes, c->rows, c->cols);
}

/* _linear_int8(a (M, K) f32, weight, type=-1, rows=-1, cols=-1, out=None, accumulate=False):
 * weight is the raw bytes (uint8) of a (rows, cols) matrix of ggml type `type`, packed for this
 * call, or a capsule from _int8_prepack (type, rows, cols then unused). Returns out (M, rows). */
PyObject *sl_py_linear_int8(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"a", "weight", "type", "rows", "cols", "out", "accumulate", NULL};
    PyObject *ao, *wo, *co = Py_None;
    int type = -1, accumulate = 0;
    long long rows = -1, cols = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|iLLOp", kwlist, &ao, &wo, &type, &rows, &cols, &co, &accumulate))
        return NULL;
    PyArrayObject *a = sl_py_check_array(ao, "a", NPY_FLOAT32, 2, NULL, 0);
    if (!a) return NULL;
    int8_linear_call call;
    memset(&call, 0, sizeof call);
    if (PyCapsule_CheckExact(wo)) {
        call.pw = PyCapsule_GetPointer(wo, SL_INT8_CAPSULE);
        if (!call.pw) return NULL;
        call.packed = 1;
        rows = call.pw->rows, cols = call.pw->cols;
    } else {
        PyArrayObject *src = sl_py_check_array(wo, "weight", NPY_UINT8, 1, NULL, 0);
        if (!src) return NULL;
        weight_init_call wi = {&call.w, type, PyArray_DATA(src), (int64_t)PyArray_NBYTES(src), rows, cols};
        if (sl_py_call(run_weight_init, &wi, 0) < 0) return NULL;
    }
    if (PyArray_DIM(a, 1) != cols)
        return PyErr_Format(PyExc_ValueError, "a has %zd columns, the weight %lld", (Py_ssize_t)PyArray_DIM(a, 1),
                            cols);
    npy_intp dims[2] = {PyArray_DIM(a, 0), (npy_intp)rows};
    PyArrayObject *c;
    if (co == Py_None) {
        if (accumulate) return PyErr_Format(PyExc_ValueError, "accumulate=True needs out");
        c = (PyArrayObject *)PyArray_ZEROS(2, dims, NPY_FLOAT32, 0);
        if (!c) return NULL;
    } else {
        if (!sl_py_check_array(co, "out", NPY_FLOAT32, 2, dims, 1)) return NULL;
        c = (PyArrayObject *)co;
        Py_INCREF(c);
    }
    call.M = dims[0], call.a = PyArray_DATA(a), call.lda = PyArray_DIM(a, 1);
    call.c = PyArray_DATA(c), call.ldc = rows, call.accumulate = accumulate;
    if (sl_py_call(run_int8_linear, &call, 0) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

typedef struct {
    int64_t M, K;
    const float *a;
    int8_t *q;
    float *d;
    int32_t *s;
} int8_quant_call;

static int run_int8_quantize(void *p) {
    const int8_quant_call *c = p;
    return sl_int8_quantize_rows(c->M, c->K, c->a, c->K, c->q, c->d, c->s, 1);
}

/* _int8_quantize(a (M, K) f32) -> (q int8 (M, K), d f32 (M, K/32), s int32 (M, K/32)). */
PyObject *sl_py_int8_quantize(PyObject *self, PyObject *arg) {
    (void)self;
    PyArrayObject *a = sl_py_check_array(arg, "a", NPY_FLOAT32, 2, NULL, 0);
    if (!a) return NULL;
    const npy_intp M = PyArray_DIM(a, 0), K = PyArray_DIM(a, 1);
    if (K <= 0 || K % SL_INT8_BLOCK)
        return PyErr_Format(PyExc_ValueError, "K = %zd is not a positive multiple of %d", (Py_ssize_t)K,
                            SL_INT8_BLOCK);
    npy_intp dq[2] = {M, K}, ds[2] = {M, K / SL_INT8_BLOCK};
    PyObject *q = PyArray_EMPTY(2, dq, NPY_INT8, 0), *d = PyArray_EMPTY(2, ds, NPY_FLOAT32, 0),
             *s = PyArray_EMPTY(2, ds, NPY_INT32, 0);
    if (q && d && s) {
        int8_quant_call c = {M, K, PyArray_DATA(a), PyArray_DATA((PyArrayObject *)q),
                             PyArray_DATA((PyArrayObject *)d), PyArray_DATA((PyArrayObject *)s)};
        if (sl_py_call(run_int8_quantize, &c, 0) == 0) return Py_BuildValue("(NNN)", q, d, s);
    }
    Py_XDECREF(q), Py_XDECREF(d), Py_XDECREF(s);
    return NULL;
}

/* _int8_weight_unpack(capsule) -> dict: u uint8 (N, K) (row n, input k), dw f32 (N, K/32), mw f32
 * (N, K/32) or None, zp, exact, type: the packed form read back, so a test can rebuild
 * w = dw * (u - zp) + mw and compare it with the file's dequantized weight. */
PyObject *sl_py_int8_weight_unpack(PyObject *self, PyObject *capsule) {
    (void)self;
    const sl_int8_weight *pw = PyCapsule_GetPointer(capsule, SL_INT8_CAPSULE);
    if (!pw) return NULL;
    const int64_t N = pw->rows, K = pw->cols, nb = pw->nb;
    npy_intp du[2] = {(npy_intp)N, (npy_intp)K}, dsz[2] = {(npy_intp)N, (npy_intp)nb};
    PyObject *u = PyArray_EMPTY(2, du, NPY_UINT8, 0), *dw = PyArray_EMPTY(2, dsz, NPY_FLOAT32, 0);
    PyObject *mw = pw->has_min ? PyArray_EMPTY(2, dsz, NPY_FLOAT32, 0) : (Py_INCREF(Py_None), Py_None);
    if (!u || !dw || !mw) {
        Py_XDECREF(u), Py_XDECREF(dw), Py_XDECREF(mw);
        return NULL;
    }
    uint8_t *up = PyArray_DATA((PyArrayObject *)u);
    float *dwp = PyArray_DATA((PyArrayObject *)dw), *mwp = pw->has_min ? PyArray_DATA((PyArrayObject *)mw) : NULL;
    for (int64_t n = 0; n < N; n++) {
        const int64_t p = n / SL_INT8_PANEL, i = n % SL_INT8_PANEL;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = pw->u + (p * nb + b) * SL_INT8_BLOCK * SL_INT8_PANEL;
            for (int k = 0; k < SL_INT8_BLOCK; k++)
                up[n * K + b * SL_INT8_BLOCK + k] = blk[(k / 4) * 4 * SL_INT8_PANEL + 4 * i + k % 4];
            dwp[n * nb + b] = pw->dw[(p * nb + b) * SL_INT8_PANEL + i];
            if (mwp) mwp[n * nb + b] = pw->mw[(p * nb + b) * SL_INT8_PANEL + i];
        }
    }
    return Py_BuildValue("{s:N,s:N,s:N,s:i,s:i,s:i}", "u", u, "dw", dw, "mw", mw, "zp", pw->zp, "exact", pw->exact,
                         "type", pw->type);
}

/* _int8_info() -> dict: kernel (the int8 kernel in use now), cpu_avx512_vnni, cpu_avx_vnni. */
PyObject *sl_py_int8_info(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    return Py_BuildValue("{s:s,s:O,s:O}", "kernel", sl_int8_kernel_name(sl_int8_kernel()), "cpu_avx512_vnni",
                         sl_cpu_has_avx512_vnni() ? Py_True : Py_False, "cpu_avx_vnni",
                         sl_cpu_has_avx_vnni() ? Py_True : Py_False);
}

/* _int8_force_kernel(name) -> the kernel now in use: caps the int8 kernel at "generic", "avx2",
 * "avx_vnni" or "avx512_vnni" (= no cap; also "auto"). */
PyObject *sl_py_int8_force_kernel(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    int k = -1;
    for (int i = SL_INT8_GENERIC; i <= SL_INT8_VNNI512; i++)
        if (!strcmp(name, sl_int8_kernel_name(i))) k = i;
    if (!strcmp(name, "auto")) k = SL_INT8_VNNI512;
    if (k < 0) return PyErr_Format(PyExc_ValueError, "unknown int8 kernel %R", arg);
    return PyUnicode_FromString(sl_int8_kernel_name(sl_int8_force_kernel(k)));
}

typedef struct {
    int64_t iters;
    int kernel;
    double ops, seconds;
} int8_peak_call;

/* every thread of one region runs the register-only loop; ops summed, the slowest thread's time */
static int run_int8_peak(void *p) {
    int8_peak_call *c = p;
    double ops = 0.0, secs = 0.0;
#pragma omp parallel num_threads(sl_num_threads()) reduction(+ : ops) reduction(max : secs)
    {
        double s;
        ops += sl_int8_peak(c->kernel, c->iters, &s);
        secs = s > secs ? s : secs;
    }
    c->ops = ops, c->seconds = secs;
    return SL_OK;
}

/* _int8_peak(iters, kernel="avx512_vnni") -> (int ops, seconds) of the register-only vpdpbusd loop
 * (zmm for "avx512_vnni", ymm VEX for "avx_vnni") on every thread of the current thread count
 * ((0, 0.0) when the CPU lacks it). */
PyObject *sl_py_int8_peak(PyObject *self, PyObject *args) {
    (void)self;
    long long iters;
    const char *name = "avx512_vnni";
    if (!PyArg_ParseTuple(args, "L|s", &iters, &name)) return NULL;
    if (iters <= 0 || iters > (1LL << 40)) return PyErr_Format(PyExc_ValueError, "iters must be in [1, 2^40]");
    int kernel = -1;
    if (!strcmp(name, "avx512_vnni")) kernel = SL_INT8_VNNI512;
    if (!strcmp(name, "avx_vnni")) kernel = SL_INT8_AVXVNNI;
    if (kernel < 0) return PyErr_Format(PyExc_ValueError, "no peak loop for %s (avx512_vnni or avx_vnni)", name);
    int8_peak_call c = {iters, kernel, 0.0, 0.0};
    if (sl_py_call(run_int8_peak, &c, 0) < 0) return NULL;
    return Py_BuildValue("(dd)", c.ops, c.seconds);
}

typedef struct {
    int64_t M, K;
    const float *a;
    Py_ssize_t n;
    const sl_int8_weight **pw;
    float **c;
} int8_shared_call;

static int run_int8_shared(void *p) {
    const int8_shared_call *c = p;
    sl_int8_acts qa;
    SL_TRY(sl_int8_acts_init(&qa, c->M, c->K, c->a, c->K, 1));
    int rc = SL_OK;
    for (Py_ssize_t i = 0; i < c->n && rc == SL_OK; i++)
        rc = sl_linear_nt_int8_acts(&qa, c->pw[i], c->c[i], c->pw[i]->rows, 0, 1);
    sl_int8_acts_free(&qa);
    return rc;
}

/* _linear_int8_shared(a (M, K) f32, [capsules]) -> [(M, rows_i) f32]: a quantized once
 * (sl_int8_acts_init), then one sl_linear_nt_int8_acts per packed weight. */
PyObject *sl_py_linear_int8_shared(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ao, *lo;
    if (!PyArg_ParseTuple(args, "OO!", &ao, &PyList_Type, &lo)) return NULL;
    PyArrayObject *a = sl_py_check_array(ao, "a", NPY_FLOAT32, 2, NULL, 0);
    if (!a) return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(lo);
    PyObject *outs = PyList_New(n);
    const sl_int8_weight **pw = PyMem_Calloc((size_t)n + 1, sizeof *pw);
    float **cs = PyMem_Calloc((size_t)n + 1, sizeof *cs);
    int ok = outs && pw && cs;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        pw[i] = PyCapsule_GetPointer(PyList_GET_ITEM(lo, i), SL_INT8_CAPSULE);
        if (!pw[i]) {
            ok = 0;
            break;
        }
        npy_intp dims[2] = {PyArray_DIM(a, 0), (npy_intp)pw[i]->rows};
        PyObject *c = PyArray_ZEROS(2, dims, NPY_FLOAT32, 0);
        if (!c) {
            ok = 0;
            break;
        }
        PyList_SET_ITEM(outs, i, c);
        cs[i] = PyArray_DATA((PyArrayObject *)c);
    }
    if (ok) {
        int8_shared_call c = {PyArray_DIM(a, 0), PyArray_DIM(a, 1), PyArray_DATA(a), n, pw, cs};
        ok = sl_py_call(run_int8_shared, &c, 0) == 0;
    } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    PyMem_Free(pw);
    PyMem_Free(cs);
    if (!ok) {
        Py_XDECREF(outs);
        return NULL;
    }
    return outs;
}

/* _int8_usable(weight_bytes uint8, type, rows, cols) -> bool: sl_int8_weight_usable on the weight
 * (False too when sl_weight_init rejects it). */
PyObject *sl_py_int8_usable(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data;
    int type;
    long long rows, cols;
    if (!PyArg_ParseTuple(args, "OiLL", &data, &type, &rows, &cols)) return NULL;
    PyArrayObject *src = sl_py_check_array(data, "weight_bytes", NPY_UINT8, 1, NULL, 0);
    if (!src) return NULL;
    sl_weight w;
    const int64_t be = sl_quant_block_elems(type), bb = sl_quant_block_bytes(type);
    if (be <= 0 || rows <= 0 || cols <= 0 || cols % be) Py_RETURN_FALSE;
    w.type = type, w.data = PyArray_DATA(src), w.rows = rows, w.cols = cols, w.row_bytes = cols / be * bb;
    int64_t total;
    if (!sl_mul_size(rows, w.row_bytes, &total) || (int64_t)PyArray_NBYTES(src) != total) Py_RETURN_FALSE;
    return PyBool_FromLong(sl_int8_weight_usable(&w));
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

typedef struct {
    const float *at, *b;
    float *c;
    int64_t M, N, K;
    int path;
} bf16_tn_call;

static int run_bf16_tn(void *p) {
    const bf16_tn_call *c = p;
    sl_bf16_panels *pan;
    SL_TRY(sl_bf16_pack_t(c->b, c->K, c->N, c->N, 1, &pan));
    const int rc = sl_bf16_linear_tn(c->M, c->at, c->M, pan, c->c, c->N, 0, 1, c->path);
    sl_bf16_panels_free(pan);
    return rc;
}

/* _bf16_linear_tn(At float32 (K, M), B float32 (K, N), path=0) -> C (M, N) = bf16(At)ᵀ · bf16(B): B
 * packed by sl_bf16_pack_t, the product by sl_bf16_linear_tn (the backward's layouts). Test-only. */
PyObject *sl_py_bf16_linear_tn(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"At", "B", "path", NULL};
    PyObject *ao, *bo;
    int path = SL_BF16_AUTO;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|i", kwlist, &ao, &bo, &path)) return NULL;
    PyArrayObject *a = sl_py_check_array(ao, "At", NPY_FLOAT32, 2, NULL, 0);
    if (!a) return NULL;
    npy_intp bd[2] = {PyArray_DIM(a, 0), -1};
    PyArrayObject *b = sl_py_check_array(bo, "B", NPY_FLOAT32, 2, bd, 0);
    if (!b) return NULL;
    const npy_intp K = PyArray_DIM(a, 0), M = PyArray_DIM(a, 1), N = PyArray_DIM(b, 1);
    if (K < 1 || M < 1 || N < 1) return PyErr_Format(PyExc_ValueError, "At and B must be non-empty");
    npy_intp dims[2] = {M, N};
    PyArrayObject *out = (PyArrayObject *)PyArray_ZEROS(2, dims, NPY_FLOAT32, 0);
    if (!out) return NULL;
    bf16_tn_call c = {PyArray_DATA(a), PyArray_DATA(b), PyArray_DATA(out), M, N, K, path};
    if (sl_py_call(run_bf16_tn, &c, 0) < 0) {
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

typedef struct {
    int64_t M, K;
    const float *a;
    int n, precision;
    sl_weight w[SL_SHARED_MAX];
    float *c[SL_SHARED_MAX];
} shared_call;

/* The shared-input products of the forward's linear_shared at one precision, each weight packed
 * here as the model packs it. */
static int run_shared(void *p) {
    shared_call *c = p;
    int64_t ldc[SL_SHARED_MAX];
    const sl_weight *w[SL_SHARED_MAX];
    sl_bf16_panels *bp[SL_SHARED_MAX] = {0};
    sl_int8_weight iw[SL_SHARED_MAX];
    const sl_int8_weight *ip[SL_SHARED_MAX];
    memset(iw, 0, sizeof iw);
    int rc = SL_OK;
    for (int j = 0; j < c->n && rc == SL_OK; j++) {
        ldc[j] = c->w[j].rows, w[j] = &c->w[j], ip[j] = &iw[j];
        if (c->precision == SL_PREC_BF16) rc = sl_bf16_pack(&c->w[j], 1, &bp[j]);
        if (c->precision == SL_PREC_INT8) rc = sl_int8_weight_init(&iw[j], &c->w[j], 1);
    }
    if (rc == SL_OK && c->precision == SL_PREC_FP32) rc = sl_linear_nt_shared(c->M, c->a, c->K, c->n, w, c->c, ldc);
    if (rc == SL_OK && c->precision == SL_PREC_BF16)
        rc = sl_bf16_linear_nt_shared(c->M, c->a, c->K, c->n, (const sl_bf16_panels *const *)bp, c->c, ldc,
                                      SL_BF16_AUTO);
    if (rc == SL_OK && c->precision == SL_PREC_INT8) rc = sl_linear_nt_int8_shared(c->M, c->a, c->K, c->n, ip, c->c, ldc);
    for (int j = 0; j < c->n; j++) {
        sl_bf16_panels_free(bp[j]);
        sl_int8_weight_free(&iw[j]);
    }
    return rc;
}

/* _linear_shared(a (M, K) f32, [w_j (N_j, K) f32], precision 0|1|2) -> [(M, N_j) f32]: the products
 * of one input in one call (sl_linear_nt_shared, sl_bf16_linear_nt_shared, sl_linear_nt_int8_shared). */
PyObject *sl_py_linear_shared(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ao, *lo;
    int precision;
    if (!PyArg_ParseTuple(args, "OO!i", &ao, &PyList_Type, &lo, &precision)) return NULL;
    if (precision < SL_PREC_FP32 || precision > SL_PREC_INT8)
        return PyErr_Format(PyExc_ValueError, "precision must be 0, 1 or 2");
    PyArrayObject *a = sl_py_check_array(ao, "a", NPY_FLOAT32, 2, NULL, 0);
    if (!a) return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(lo);
    if (n < 1 || n > SL_SHARED_MAX) return PyErr_Format(PyExc_ValueError, "1 to %d weights", (int)SL_SHARED_MAX);
    shared_call c = {PyArray_DIM(a, 0), PyArray_DIM(a, 1), PyArray_DATA(a), (int)n, precision, {{0}}, {0}};
    PyObject *outs = PyList_New(n);
    if (!outs) return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyArrayObject *w = sl_py_check_array(PyList_GET_ITEM(lo, j), "w", NPY_FLOAT32, 2, NULL, 0);
        if (!w) {
            Py_DECREF(outs);
            return NULL;
        }
        c.w[j] = sl_weight_f32(PyArray_DATA(w), PyArray_DIM(w, 0), PyArray_DIM(w, 1));
        npy_intp dims[2] = {PyArray_DIM(a, 0), PyArray_DIM(w, 0)};
        PyObject *o = PyArray_ZEROS(2, dims, NPY_FLOAT32, 0);
        if (!o) {
            Py_DECREF(outs);
            return NULL;
        }
        PyList_SET_ITEM(outs, j, o);
        c.c[j] = PyArray_DATA((PyArrayObject *)o);
    }
    if (sl_py_call(run_shared, &c, 0) < 0) {
        Py_DECREF(outs);
        return NULL;
    }
    return outs;
}

/* ---------------------------------------------------------------- attention variants (attention.h)
 * Test entries: the attention op alone (softmax, sink logit, softmax-plus-one) with its backward
 * and JVP, and gated attention's elementwise gate, on arrays from Python. */

typedef struct {
    sl_attn_shape s;
    sl_attn_intervention iv;
    int64_t B_bwd, B_jvp;
    const float *q, *k, *v, *dout, *tq, *tk, *tv, *tsinks;
    float *out, *probs, *dq, *dk, *dv, *pk, *pv, *dsinks, *tout;
} attn_op_call;

static int run_attn_op(void *p) {
    attn_op_call *c = p;
    const int64_t qd = c->s.n_heads * c->s.head_dim, kvd = c->s.n_kv_heads * c->s.head_dim;
    SL_TRY(sl_attention_forward(&c->s, c->q, qd, c->k, c->v, kvd, c->out, c->probs, &c->iv, NULL));
    if (c->dout)
        SL_TRY(sl_attention_backward_sink(&c->s, c->B_bwd, c->q, c->k, c->v, c->probs, c->dout, c->dq, c->dk, c->dv,
                                          c->pk, c->pv, &c->iv, c->dsinks));
    if (c->tq)
        SL_TRY(sl_attention_jvp_sink(&c->s, c->B_jvp, c->q, c->k, c->v, c->probs, c->tq, c->tk, c->tv, c->tsinks,
                                     c->tout, &c->iv));
    return SL_OK;
}

/* An optional float32 array argument of shape (rows, cols) (rows < 0: any multiple of `unit`), or
 * NULL (None); *ok = 0 with an exception set on a mismatch. */
static PyArrayObject *optional_rows(PyObject *o, const char *name, npy_intp rows, npy_intp cols, npy_intp unit,
                                    int *ok) {
    if (o == Py_None || !*ok) return NULL;
    npy_intp dims[2] = {rows, cols};
    PyArrayObject *a = sl_py_check_array(o, name, NPY_FLOAT32, 2, dims, 0);
    if (a && rows < 0 && (PyArray_DIM(a, 0) == 0 || PyArray_DIM(a, 0) % unit)) {
        PyErr_Format(PyExc_ValueError, "%s has %zd rows, expected a positive multiple of T = %zd", name,
                     (Py_ssize_t)PyArray_DIM(a, 0), (Py_ssize_t)unit);
        a = NULL;
    }
    if (!a) *ok = 0;
    return a;
}

static int dict_put(PyObject *d, const char *key, PyObject *v) {
    if (!v) return 0;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc == 0;
}

static PyObject *new_f32(int nd, npy_intp *dims, float **data) {
    PyObject *a = PyArray_ZEROS(nd, dims, NPY_FLOAT32, 0);
    if (a) *data = PyArray_DATA((PyArrayObject *)a);
    return a;
}

/* _attention(q (T, H*hd), k, v (T, G*hd), n_heads, n_kv_heads, variant=0, sinks=None, window=0,
 * softcap=0.0, key_start=None, keep_first=0, dout=None, tq=None, tk=None, tv=None, tsinks=None)
 * -> dict: out (T, H*hd), probs (H, T, T); with dout (B*T, H*hd): dq, dk, dv, dsinks (B, H); with
 * tq, tk, tv: tout (B*T, H*hd). The scale is 1/sqrt(hd); causal unless a window is given. */
PyObject *sl_py_attention(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"q", "k", "v", "n_heads", "n_kv_heads", "variant", "sinks", "window", "softcap",
                             "key_start", "keep_first", "dout", "tq", "tk", "tv", "tsinks", NULL};
    PyObject *qo, *ko, *vo, *sinks_o = Py_None, *ks_o = Py_None, *dout_o = Py_None, *tq_o = Py_None;
    PyObject *tk_o = Py_None, *tv_o = Py_None, *ts_o = Py_None;
    long long H, G, window = 0;
    int variant = 0, keep_first = 0;
    float softcap = 0.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOLL|iOLfOiOOOOO", kwlist, &qo, &ko, &vo, &H, &G, &variant, &sinks_o,
                                     &window, &softcap, &ks_o, &keep_first, &dout_o, &tq_o, &tk_o, &tv_o, &ts_o))
        return NULL;
    if (H <= 0 || G <= 0 || H % G)
        return PyErr_Format(PyExc_ValueError, "n_heads=%lld, n_kv_heads=%lld: both positive, G dividing H", H, G);
    PyArrayObject *q = sl_py_check_array(qo, "q", NPY_FLOAT32, 2, NULL, 0);
    if (!q) return NULL;
    const npy_intp T = PyArray_DIM(q, 0), qd = PyArray_DIM(q, 1);
    if (T <= 0 || qd <= 0 || qd % H) return PyErr_Format(PyExc_ValueError, "q is (%zd, %zd), expected (T > 0, n_heads * hd)",
                                                         (Py_ssize_t)T, (Py_ssize_t)qd);
    const npy_intp hd = qd / H, kvd = G * hd;
    npy_intp kv_dims[2] = {T, kvd}, h_dims[1] = {(npy_intp)H}, t_dims[1] = {T};
    PyArrayObject *k = sl_py_check_array(ko, "k", NPY_FLOAT32, 2, kv_dims, 0);
    PyArrayObject *v = k ? sl_py_check_array(vo, "v", NPY_FLOAT32, 2, kv_dims, 0) : NULL;
    if (!v) return NULL;
    attn_op_call c;
    memset(&c, 0, sizeof c);
    c.s = (sl_attn_shape){.T = T, .n_heads = H, .n_kv_heads = G, .head_dim = hd, .scale = (float)(1.0 / sqrt((double)hd)),
                          .window = window, .softcap = softcap, .variant = variant};
    if (sinks_o != Py_None) {
        PyArrayObject *sk = sl_py_check_array(sinks_o, "sinks", NPY_FLOAT32, 1, h_dims, 0);
        if (!sk) return NULL;
        c.s.sinks = PyArray_DATA(sk);
    }
    if (ks_o != Py_None) {
        PyArrayObject *ks = sl_py_check_array(ks_o, "key_start", NPY_INT64, 1, t_dims, 0);
        if (!ks) return NULL;
        const int64_t *st = PyArray_DATA(ks);
        for (npy_intp i = 0; i < T; i++) /* the kernel trusts its packing mask: checked here */
            if (st[i] < 0 || st[i] > i || (i > 0 && st[i] < st[i - 1]))
                return PyErr_Format(PyExc_ValueError, "key_start[%zd]=%lld, expected a nondecreasing start in [0, %zd]",
                                    (Py_ssize_t)i, (long long)st[i], (Py_ssize_t)i);
        c.iv.key_start = st;
    }
    c.iv.keep_first = keep_first;
    int ok = 1;
    PyArrayObject *dout = optional_rows(dout_o, "dout", -1, qd, T, &ok);
    PyArrayObject *tq = optional_rows(tq_o, "tq", -1, qd, T, &ok);
    const npy_intp Bj = tq ? PyArray_DIM(tq, 0) / T : 0;
    PyArrayObject *tk = optional_rows(tk_o, "tk", tq ? Bj * T : -1, kvd, T, &ok);
    PyArrayObject *tv = optional_rows(tv_o, "tv", tq ? Bj * T : -1, kvd, T, &ok);
    if (!ok) return NULL;
    if ((tq != NULL) != (tk != NULL) || (tq != NULL) != (tv != NULL))
        return PyErr_Format(PyExc_ValueError, "the JVP needs all three tangents tq, tk, tv");
    if (ts_o != Py_None) {
        npy_intp ts_dims[2] = {Bj, (npy_intp)H};
        PyArrayObject *ts = tq ? sl_py_check_array(ts_o, "tsinks", NPY_FLOAT32, 2, ts_dims, 0) : NULL;
        if (!ts) return tq ? NULL : PyErr_Format(PyExc_ValueError, "tsinks needs tq, tk, tv");
        c.tsinks = PyArray_DATA(ts);
    }
    c.q = PyArray_DATA(q), c.k = PyArray_DATA(k), c.v = PyArray_DATA(v);
    PyObject *res = PyDict_New(), *keep = PyList_New(0);
    if (!res || !keep) goto fail;
    npy_intp out_dims[2] = {T, qd}, p_dims[3] = {(npy_intp)H, T, T};
    if (!dict_put(res, "out", new_f32(2, out_dims, &c.out)) || !dict_put(res, "probs", new_f32(3, p_dims, &c.probs)))
        goto fail;
    if (dout) {
        const npy_intp B = PyArray_DIM(dout, 0) / T;
        npy_intp dq_dims[2] = {B * T, qd}, dkv_dims[2] = {B * T, kvd}, ds_dims[2] = {B, (npy_intp)H};
        c.B_bwd = B, c.dout = PyArray_DATA(dout);
        if (!dict_put(res, "dq", new_f32(2, dq_dims, &c.dq)) || !dict_put(res, "dk", new_f32(2, dkv_dims, &c.dk)) ||
            !dict_put(res, "dv", new_f32(2, dkv_dims, &c.dv)) || !dict_put(res, "dsinks", new_f32(2, ds_dims, &c.dsinks)))
            goto fail;
        if (G != H) { /* the per-head partials: scratch kept alive in `keep` */
            PyObject *pk = new_f32(2, dq_dims, &c.pk), *pv = new_f32(2, dq_dims, &c.pv);
            int added = pk && pv && PyList_Append(keep, pk) == 0 && PyList_Append(keep, pv) == 0;
            Py_XDECREF(pk);
            Py_XDECREF(pv);
            if (!added) goto fail;
        }
    }
    if (tq) {
        npy_intp to_dims[2] = {Bj * T, qd};
        c.B_jvp = Bj, c.tq = PyArray_DATA(tq), c.tk = PyArray_DATA(tk), c.tv = PyArray_DATA(tv);
        if (!dict_put(res, "tout", new_f32(2, to_dims, &c.tout))) goto fail;
    }
    if (sl_py_call(run_attn_op, &c, 1) < 0) goto fail;
    Py_DECREF(keep);
    return res;
fail:
    Py_XDECREF(res);
    Py_XDECREF(keep);
    return NULL;
}

typedef struct {
    int64_t n, period;
    const float *z, *g, *dzg, *tz, *tg;
    float *zg, *dz, *dg, *tzg;
} gate_call;

static int run_gate(void *p) {
    const gate_call *c = p;
    sl_attn_gate_forward(c->zg, c->z, c->g, c->period);
    if (c->dzg) sl_attn_gate_backward(c->dz, c->dg, c->dzg, c->z, c->g, c->n, c->period);
    if (c->tz) sl_attn_gate_jvp(c->tzg, c->tz, c->tg, c->z, c->g, c->n, c->period);
    return SL_OK;
}

/* _attn_gate(z (T, W), g (T, W), dzg=None, tz=None, tg=None) -> dict: zg = z * sigmoid(g); with dzg
 * (B*T, W): dz, dg; with tz (and tg, optional) (B*T, W): tzg. Directions share the one tape (z, g). */
PyObject *sl_py_attn_gate(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"z", "g", "dzg", "tz", "tg", NULL};
    PyObject *zo, *go, *dzg_o = Py_None, *tz_o = Py_None, *tg_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOO", kwlist, &zo, &go, &dzg_o, &tz_o, &tg_o)) return NULL;
    PyArrayObject *z = sl_py_check_array(zo, "z", NPY_FLOAT32, 2, NULL, 0);
    if (!z) return NULL;
    npy_intp dims[2] = {PyArray_DIM(z, 0), PyArray_DIM(z, 1)};
    if (dims[0] <= 0 || dims[1] <= 0) return PyErr_Format(PyExc_ValueError, "z must not be empty");
    PyArrayObject *g = sl_py_check_array(go, "g", NPY_FLOAT32, 2, dims, 0);
    if (!g) return NULL;
    int ok = 1;
    PyArrayObject *dzg = optional_rows(dzg_o, "dzg", -1, dims[1], dims[0], &ok);
    PyArrayObject *tz = optional_rows(tz_o, "tz", -1, dims[1], dims[0], &ok);
    PyArrayObject *tg = optional_rows(tg_o, "tg", tz ? PyArray_DIM(tz, 0) : -1, dims[1], dims[0], &ok);
    if (!ok) return NULL;
    if (tg && !tz) return PyErr_Format(PyExc_ValueError, "tg needs tz");
    gate_call c;
    memset(&c, 0, sizeof c);
    c.period = dims[0] * dims[1], c.z = PyArray_DATA(z), c.g = PyArray_DATA(g);
    PyObject *res = PyDict_New();
    if (!res || !dict_put(res, "zg", new_f32(2, dims, &c.zg))) goto fail;
    if (dzg && tz && PyArray_DIM(dzg, 0) != PyArray_DIM(tz, 0)) {
        PyErr_Format(PyExc_ValueError, "dzg and tz must hold the same number of directions");
        goto fail;
    }
    if (dzg) {
        npy_intp dd[2] = {PyArray_DIM(dzg, 0), dims[1]};
        c.n = dd[0] * dd[1], c.dzg = PyArray_DATA(dzg);
        if (!dict_put(res, "dz", new_f32(2, dd, &c.dz)) || !dict_put(res, "dg", new_f32(2, dd, &c.dg))) goto fail;
    }
    if (tz) {
        npy_intp dd[2] = {PyArray_DIM(tz, 0), dims[1]};
        c.n = dd[0] * dd[1], c.tz = PyArray_DATA(tz), c.tg = tg ? PyArray_DATA(tg) : NULL;
        if (!dict_put(res, "tzg", new_f32(2, dd, &c.tzg))) goto fail;
    }
    if (sl_py_call(run_gate, &c, 0) < 0) goto fail;
    return res;
fail:
    Py_XDECREF(res);
    return NULL;
}

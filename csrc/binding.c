/* sinklab._core: the CPython/NumPy binding. It converts and checks arguments, releases the GIL
 * around every computation and turns core status codes into Python exceptions. No numerics. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL sinklab_ARRAY_API
#include <numpy/arrayobject.h>

#include <math.h>
#include <signal.h>
#include <string.h>

#include "cpu.h"
#include "grad.h"
#include "model.h"
#include "ops.h"
#include "quant.h"
#include "sgemm.h"
#include "sl_common.h"
#include "train.h"

#if SL_HAVE_OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------- errors and array checks */

/* Every entry point that calls the core puts an sl_ctx on its stack: sl_ctx_begin registers it
 * for this OS thread (and reads the process-wide thread count into it) while the GIL is held,
 * the core runs with the GIL released, and the message is read back from this call's own
 * context, never from a buffer another Python thread may be writing at the same moment. */
static PyObject *raise_status(const sl_ctx *ctx, int rc) {
    if (rc == SL_ERR_INTERRUPTED) {
        /* Python's own handler ran (chained) and tripped its flag: this runs the Python-level
         * handler, KeyboardInterrupt by default; if that handler raised nothing, raise it here */
        if (PyErr_CheckSignals() < 0) return NULL;
        PyErr_SetNone(PyExc_KeyboardInterrupt);
        return NULL;
    }
    PyObject *type = rc == SL_ERR_MEMORY ? PyExc_MemoryError
                     : rc == SL_ERR_INTERNAL ? PyExc_RuntimeError
                                             : PyExc_ValueError;
    PyErr_SetString(type, ctx->err[0] ? ctx->err : "unknown error in sinklab core");
    return NULL;
}

/* ---------------------------------------------------------------- Ctrl-C during long calls */

/* While Python's main thread runs a long call with the GIL released, Python's SIGINT handler only
 * trips a flag that nothing reads until the call returns, so Ctrl-C would wait for the whole
 * computation. The guard swaps in a handler that also sets the core's interrupt flag (read
 * between layers by sl_check_interrupt) and chains to Python's handler, then restores it. A
 * SIGINT that is ignored (SIG_IGN) or left to the default action is not touched. */
#if defined(__unix__) || defined(__APPLE__)
#define SL_HAVE_SIGINT_GUARD 1
static unsigned long sl_main_thread;
static struct sigaction sl_python_sigint; /* the handler chained to, set while a guard is on */

static void sl_on_sigint(int sig) {
    sl_interrupt_set(1);
    if (sl_python_sigint.sa_handler != SIG_DFL && sl_python_sigint.sa_handler != SIG_IGN)
        sl_python_sigint.sa_handler(sig);
}
#else
#define SL_HAVE_SIGINT_GUARD 0
#endif

typedef struct {
    int on;
#if SL_HAVE_SIGINT_GUARD
    struct sigaction prev;
#endif
} sigint_guard;

/* Call with the GIL held, after sl_ctx_begin(ctx). */
static void sigint_guard_begin(sigint_guard *g, sl_ctx *ctx) {
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

/* The last guarded call's Ctrl-C checks (count, longest time without one in s), for the tests. */
static int64_t sl_last_checks = -1;
static double sl_last_check_gap = 0.0;

static void sigint_guard_end(sigint_guard *g) {
#if SL_HAVE_SIGINT_GUARD
    if (g->on) {
        sigaction(SIGINT, &g->prev, NULL);
        sl_check_gaps_end(&sl_last_checks, &sl_last_check_gap);
    }
#endif
    g->on = 0;
}

static PyObject *py_interrupt_check_gaps(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    return Py_BuildValue("(Ld)", (long long)sl_last_checks, sl_last_check_gap);
}

/* Checks that obj is a C-contiguous, aligned ndarray of dtype `type` with `ndim` dims; dims[i]
 * >= 0 must match exactly, -1 accepts any size. Never copies: a silent copy of an output buffer
 * would lose what the core writes, and of a weight would double memory. */
static PyArrayObject *check_array(PyObject *obj, const char *name, int type, int ndim,
                                  const npy_intp *dims, int writable) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy array, got %s", name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != type) {
        PyArray_Descr *want = PyArray_DescrFromType(type);
        PyErr_Format(PyExc_TypeError, "%s must have dtype %S, got %S", name, (PyObject *)want,
                     (PyObject *)PyArray_DESCR(a));
        Py_XDECREF(want);
        return NULL;
    }
    if (PyArray_NDIM(a) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must have %d dimensions, got %d", name, ndim, PyArray_NDIM(a));
        return NULL;
    }
    for (int i = 0; i < ndim; i++)
        if (dims && dims[i] >= 0 && PyArray_DIM(a, i) != dims[i]) {
            PyErr_Format(PyExc_ValueError, "%s has size %zd on axis %d, expected %zd", name,
                         (Py_ssize_t)PyArray_DIM(a, i), i, (Py_ssize_t)dims[i]);
            return NULL;
        }
    if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous and aligned (use np.ascontiguousarray)", name);
        return NULL;
    }
    if (writable && !PyArray_ISWRITEABLE(a)) {
        PyErr_Format(PyExc_ValueError, "%s must be writeable", name);
        return NULL;
    }
    return a;
}

/* ---------------------------------------------------------------- threads and SIMD */

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1) return PyErr_Format(PyExc_ValueError, "number of threads must be >= 1, got %ld", n);
    if (n > 4096) return PyErr_Format(PyExc_ValueError, "number of threads must be <= 4096, got %ld", n);
    /* Process-wide, not omp_set_num_threads: that sets only the calling OS thread's value. */
    sl_set_num_threads((int)n);
    Py_RETURN_NONE;
}

/* The calling thread's own count (0 clears it); returns the previous one (0: none). Calls this
 * Python thread starts use it instead of the process-wide setting. */
static PyObject *py_set_thread_num_threads(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "number of threads must be >= 1 (or 0 to clear), got %ld", n);
    if (n > 4096) return PyErr_Format(PyExc_ValueError, "number of threads must be <= 4096, got %ld", n);
    return PyLong_FromLong(sl_set_thread_num_threads((int)n));
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
#if SL_HAVE_OPENMP
    return PyLong_FromLong(sl_get_num_threads());
#else
    return PyLong_FromLong(1);
#endif
}

/* Test-only: the team size a kernel's parallel region gets when called from this Python thread
 * now (a region opened exactly as the kernels open theirs, from a fresh call context). It lets
 * the tests check the per-call thread count without timing. */
static PyObject *py_team_size(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    int team = 1;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(sl_num_threads())
    {
#if SL_HAVE_OPENMP
#pragma omp single
        team = omp_get_num_threads();
#endif
    }
    Py_END_ALLOW_THREADS
    sl_ctx_end(prev);
    return PyLong_FromLong(team);
}

static PyObject *py_simd(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    return PyUnicode_FromString(sl_simd_name(sl_simd()));
}

static PyObject *py_set_simd(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    int level = sl_simd_parse(name);
    if (level < 0)
        return PyErr_Format(PyExc_ValueError, "unknown SIMD level %R (use 'generic', 'avx2', 'avx512' or 'auto')",
                            arg);
    return PyUnicode_FromString(sl_simd_name(sl_set_simd((sl_simd_level)level)));
}

static PyObject *py_simd_best(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    return PyUnicode_FromString(sl_simd_name(sl_simd_best()));
}

/* ---------------------------------------------------------------- build information */

/* Facts fixed when the extension was compiled (the compiler's own macros, the flags and NumPy
 * setup.py passed in) and those read from the machine now (CPU features, the OpenMP runtime,
 * the NumPy loaded). sinklab.build_info() assembles the public dict from this one. */
#ifndef SL_BUILD_CC
#define SL_BUILD_CC "unknown"
#endif
#ifndef SL_BUILD_CFLAGS
#define SL_BUILD_CFLAGS "unknown"
#endif
#ifndef SL_BUILD_NUMPY
#define SL_BUILD_NUMPY "unknown"
#endif
#ifndef SL_BUILD_OPENMP_REQUEST
#define SL_BUILD_OPENMP_REQUEST "auto"
#endif

#define SL_STR_(x) #x
#define SL_STR(x) SL_STR_(x)
#if defined(__INTEL_LLVM_COMPILER)
#define SL_COMPILER_FAMILY "icx"
#elif defined(__clang__) && defined(__apple_build_version__)
#define SL_COMPILER_FAMILY "apple-clang"
#elif defined(__clang__)
#define SL_COMPILER_FAMILY "clang"
#elif defined(__GNUC__)
#define SL_COMPILER_FAMILY "gcc"
#else
#define SL_COMPILER_FAMILY "unknown"
#endif
#if defined(__clang__)
#define SL_COMPILER_VERSION SL_STR(__clang_major__) "." SL_STR(__clang_minor__) "." SL_STR(__clang_patchlevel__)
#elif defined(__GNUC__)
#define SL_COMPILER_VERSION SL_STR(__GNUC__) "." SL_STR(__GNUC_MINOR__) "." SL_STR(__GNUC_PATCHLEVEL__)
#else
#define SL_COMPILER_VERSION "unknown"
#endif
#ifdef __VERSION__
#define SL_COMPILER_BANNER __VERSION__
#else
#define SL_COMPILER_BANNER "unknown"
#endif

static int dict_set(PyObject *d, const char *key, PyObject *value) {
    if (!value) return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

/* v, or None for 0 (a fact this build cannot know) */
static PyObject *long_or_none(long v) {
    if (v) return PyLong_FromLong(v);
    Py_RETURN_NONE;
}

/* The CPU features the kernels care about, as the CPU (and OS) report them now. */
static PyObject *cpu_features(void) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    const struct { const char *name; int on; } feats[] = {
        {"avx", __builtin_cpu_supports("avx")},           {"avx2", __builtin_cpu_supports("avx2")},
        {"fma", __builtin_cpu_supports("fma")},           {"avx512f", __builtin_cpu_supports("avx512f")},
        {"avx512bw", __builtin_cpu_supports("avx512bw")}, {"avx512vl", __builtin_cpu_supports("avx512vl")},
        {"avx512dq", __builtin_cpu_supports("avx512dq")},
    };
    for (size_t i = 0; i < sizeof feats / sizeof feats[0]; i++)
        if (dict_set(d, feats[i].name, PyBool_FromLong(feats[i].on)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
#endif
    return d;
}

static PyObject *py_build_info(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#if SL_HAVE_OPENMP && defined(_OPENMP)
    /* _OPENMP: the date of the OpenMP specification the compiler implements (201511 = 4.5) */
    const long omp_date = (long)_OPENMP, omp_max = omp_get_max_threads(), omp_procs = omp_get_num_procs();
#else
    const long omp_date = 0, omp_max = 1, omp_procs = 0;
#endif
    if (dict_set(d, "compiler_family", PyUnicode_FromString(SL_COMPILER_FAMILY)) < 0 ||
        dict_set(d, "compiler_version", PyUnicode_FromString(SL_COMPILER_VERSION)) < 0 ||
        dict_set(d, "compiler_banner", PyUnicode_FromString(SL_COMPILER_BANNER)) < 0 ||
        dict_set(d, "cc", PyUnicode_FromString(SL_BUILD_CC)) < 0 ||
        dict_set(d, "cflags", PyUnicode_FromString(SL_BUILD_CFLAGS)) < 0 ||
        dict_set(d, "openmp", PyBool_FromLong(SL_HAVE_OPENMP)) < 0 ||
        dict_set(d, "openmp_request", PyUnicode_FromString(SL_BUILD_OPENMP_REQUEST)) < 0 ||
        dict_set(d, "openmp_date", long_or_none(omp_date)) < 0 ||
        dict_set(d, "omp_max_threads", PyLong_FromLong(omp_max)) < 0 ||
        dict_set(d, "omp_num_procs", long_or_none(omp_procs)) < 0 ||
        dict_set(d, "num_threads", PyLong_FromLong(SL_HAVE_OPENMP ? sl_get_num_threads() : 1)) < 0 ||
        dict_set(d, "simd", PyUnicode_FromString(sl_simd_name(sl_simd()))) < 0 ||
        dict_set(d, "simd_best", PyUnicode_FromString(sl_simd_name(sl_simd_best()))) < 0 ||
        dict_set(d, "cpu_features", cpu_features()) < 0 ||
        dict_set(d, "numpy_build", PyUnicode_FromString(SL_BUILD_NUMPY)) < 0 ||
        dict_set(d, "numpy_build_abi", PyLong_FromUnsignedLong(NPY_ABI_VERSION)) < 0 ||
        dict_set(d, "numpy_build_api", PyLong_FromUnsignedLong(NPY_API_VERSION)) < 0 ||
        dict_set(d, "numpy_target_api", PyLong_FromUnsignedLong(NPY_FEATURE_VERSION)) < 0 ||
        dict_set(d, "numpy_runtime_abi", PyLong_FromUnsignedLong(PyArray_GetNDArrayCVersion())) < 0 ||
        dict_set(d, "numpy_runtime_api", PyLong_FromUnsignedLong(PyArray_GetNDArrayCFeatureVersion())) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ---------------------------------------------------------------- SGEMM */

/* sgemm(A, B, C=None, trans_a=False, trans_b=True, accumulate=False): C = op(A)·op(B) (+ C). */
static PyObject *py_sgemm(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"A", "B", "C", "trans_a", "trans_b", "accumulate", NULL};
    PyObject *ao, *bo, *co = Py_None;
    int accumulate = 0, ta = 0, tb = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Oppp", kwlist, &ao, &bo, &co, &ta, &tb, &accumulate))
        return NULL;
    PyArrayObject *a = check_array(ao, "A", NPY_FLOAT32, 2, NULL, 0);
    if (!a) return NULL;
    PyArrayObject *b = check_array(bo, "B", NPY_FLOAT32, 2, NULL, 0);
    if (!b) return NULL;
    npy_intp M = PyArray_DIM(a, ta ? 1 : 0), K = PyArray_DIM(a, ta ? 0 : 1);
    npy_intp N = PyArray_DIM(b, tb ? 0 : 1), Kb = PyArray_DIM(b, tb ? 1 : 0);
    if (Kb != K)
        return PyErr_Format(PyExc_ValueError, "op(A) is (%zd, %zd) but op(B) is (%zd, %zd): inner sizes differ",
                            (Py_ssize_t)M, (Py_ssize_t)K, (Py_ssize_t)Kb, (Py_ssize_t)N);
    PyArrayObject *c;
    npy_intp dims[2] = {M, N};
    if (co == Py_None) {
        if (accumulate) return PyErr_Format(PyExc_ValueError, "accumulate=True needs C");
        c = (PyArrayObject *)PyArray_ZEROS(2, dims, NPY_FLOAT32, 0);
        if (!c) return NULL;
    } else {
        if (!check_array(co, "C", NPY_FLOAT32, 2, dims, 1)) return NULL;
        c = (PyArrayObject *)co;
        Py_INCREF(c);
    }
    int rc;
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    Py_BEGIN_ALLOW_THREADS
    rc = sl_sgemm(ta, tb, M, N, K, PyArray_DATA(a), PyArray_DIM(a, 1), PyArray_DATA(b), PyArray_DIM(b, 1),
                  PyArray_DATA(c), N, accumulate, 1);
    Py_END_ALLOW_THREADS
    sl_ctx_end(prev);
    if (rc != SL_OK) {
        Py_DECREF(c);
        return raise_status(&ctx, rc);
    }
    return (PyObject *)c;
}

/* sgemm_nt(A, B, C=None, accumulate=False): C = A·Bᵀ, the layout of every forward linear layer. */
static PyObject *py_sgemm_nt(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"A", "B", "C", "accumulate", NULL};
    PyObject *ao, *bo, *co = Py_None;
    int accumulate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Op", kwlist, &ao, &bo, &co, &accumulate)) return NULL;
    PyObject *kwargs = Py_BuildValue("{s:O,s:O,s:O,s:O}", "C", co, "trans_a", Py_False, "trans_b", Py_True,
                                     "accumulate", accumulate ? Py_True : Py_False);
    PyObject *pos = kwargs ? PyTuple_Pack(2, ao, bo) : NULL;
    PyObject *out = pos ? py_sgemm(self, pos, kwargs) : NULL;
    Py_XDECREF(pos);
    Py_XDECREF(kwargs);
    return out;
}

/* ---------------------------------------------------------------- dequantisation */

static PyObject *py_quant_block_size(PyObject *self, PyObject *arg) {
    (void)self;
    long type = PyLong_AsLong(arg);
    if (type == -1 && PyErr_Occurred()) return NULL;
    int64_t be = sl_quant_block_elems((int)type), bb = sl_quant_block_bytes((int)type);
    if (be <= 0 || bb <= 0) return PyErr_Format(PyExc_ValueError, "unsupported ggml tensor type %ld", type);
    return Py_BuildValue("(LL)", (long long)be, (long long)bb);
}

static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    (void)self;
    int type;
    PyObject *data;
    long long n;
    if (!PyArg_ParseTuple(args, "iOL", &type, &data, &n)) return NULL;
    PyArrayObject *src = check_array(data, "data", NPY_UINT8, 1, NULL, 0);
    if (!src) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "n_elements must be >= 0, got %lld", n);
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    /* Size checks before allocating, so a bogus n_elements is a ValueError, not a MemoryError. */
    int rc = sl_dequantize_check(type, PyArray_DIM(src, 0), n);
    PyArrayObject *out = NULL;
    if (rc == SL_OK) {
        npy_intp dims[1] = {(npy_intp)n};
        out = (PyArrayObject *)PyArray_EMPTY(1, dims, NPY_FLOAT32, 0);
    }
    if (rc == SL_OK && out) {
        Py_BEGIN_ALLOW_THREADS
        rc = sl_dequantize(type, PyArray_DATA(src), PyArray_DIM(src, 0), PyArray_DATA(out), n, 1);
        Py_END_ALLOW_THREADS
    }
    sl_ctx_end(prev);
    if (rc != SL_OK) {
        Py_XDECREF(out);
        return raise_status(&ctx, rc);
    }
    if (!out) return NULL;
    return (PyObject *)out;
}

/* ---------------------------------------------------------------- model handle */

/* The handle owns the C structs and a reference to every weight array they point into. */
typedef struct {
    sl_model model;
    sl_layer_weights *layers;
    PyObject *keep;     /* list of the arrays */
    sl_ws_cache cache;  /* the forward's activations, kept between calls (model.h) */
} model_handle;

static void handle_destroy(PyObject *capsule) {
    model_handle *h = PyCapsule_GetPointer(capsule, "sinklab.model");
    if (!h) return;
    sl_ws_cache_clear(&h->cache); /* no call can be running: each holds a reference */
    Py_XDECREF(h->keep);
    PyMem_Free(h->layers);
    PyMem_Free(h);
}

static int cfg_int(PyObject *cfg, const char *key, int64_t *out) {
    PyObject *v = PyDict_GetItemString(cfg, key);
    if (!v) {
        PyErr_Format(PyExc_KeyError, "model config is missing %s", key);
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return 0;
    if (x <= 0 || x > (1LL << 40)) {
        PyErr_Format(PyExc_ValueError, "model config %s=%lld is out of range", key, x);
        return 0;
    }
    *out = x;
    return 1;
}

/* The parameter gradients loss_grad fills: field of sl_layer_grads, canonical key, shape in
 * terms of d, qd = H*hd, kvd = G*hd, hd and F (numpy order (out, in)), and whether layer lw has
 * the tensor (a buffer is taken only then). */
#define GRAD_TENSORS(X)                                                    \
    X(attn_norm, "attn_norm", 1, d, 0, lw->attn_norm.w)                    \
    X(attn_norm_b, "attn_norm_b", 1, d, 0, lw->attn_norm.b)                \
    X(wq, "attn_q", 2, qd, d, lw->wq.data)                                 \
    X(wk, "attn_k", 2, kvd, d, lw->wk.data)                                \
    X(wv, "attn_v", 2, kvd, d, lw->wv.data)                                \
    X(wo, "attn_output", 2, d, qd, lw->wo.data)                            \
    X(bq, "attn_q_b", 1, qd, 0, lw->bq)                                    \
    X(bk, "attn_k_b", 1, kvd, 0, lw->bk)                                   \
    X(bv, "attn_v_b", 1, kvd, 0, lw->bv)                                   \
    X(bo, "attn_output_b", 1, d, 0, lw->bo)                                \
    X(attn_q_norm, "attn_q_norm", 1, hd, 0, lw->attn_q_norm)               \
    X(attn_k_norm, "attn_k_norm", 1, hd, 0, lw->attn_k_norm)               \
    X(attn_post_norm, "attn_post_norm", 1, d, 0, lw->attn_post_norm.w)     \
    X(attn_post_norm_b, "attn_post_norm_b", 1, d, 0, lw->attn_post_norm.b) \
    X(attn_res_norm, "attn_res_norm", 1, d, 0, lw->attn_res_norm.w)        \
    X(attn_res_norm_b, "attn_res_norm_b", 1, d, 0, lw->attn_res_norm.b)    \
    X(ffn_norm, "ffn_norm", 1, d, 0, lw->ffn_norm.w)                       \
    X(ffn_norm_b, "ffn_norm_b", 1, d, 0, lw->ffn_norm.b)                   \
    X(w_gate, "ffn_gate", 2, F, d, lw->w_gate.data)                        \
    X(w_up, "ffn_up", 2, F, d, lw->w_up.data)                              \
    X(w_down, "ffn_down", 2, d, F, lw->w_down.data)                        \
    X(b_gate, "ffn_gate_b", 1, F, 0, lw->b_gate)                           \
    X(b_up, "ffn_up_b", 1, F, 0, lw->b_up)                                 \
    X(b_down, "ffn_down_b", 1, d, 0, lw->b_down)                           \
    X(ffn_post_norm, "ffn_post_norm", 1, d, 0, lw->ffn_post_norm.w)        \
    X(ffn_post_norm_b, "ffn_post_norm_b", 1, d, 0, lw->ffn_post_norm.b)    \
    X(ffn_res_norm, "ffn_res_norm", 1, d, 0, lw->ffn_res_norm.w)           \
    X(ffn_res_norm_b, "ffn_res_norm_b", 1, d, 0, lw->ffn_res_norm.b)

/* The same for the model-wide tensors: field of sl_model_grads, key, shape, presence in m. */
#define GRAD_GLOBALS(X)                                       \
    X(tok_embd, "tok_embd", 2, V, d, m->tok_embd.data)        \
    X(lm_head, "lm_head", 2, V, d, m->lm_head.data)           \
    X(out_norm, "out_norm", 1, d, 0, m->out_norm.w)           \
    X(out_norm_b, "out_norm_b", 1, d, 0, m->out_norm.b)       \
    X(pos_embd, "pos_embd", 2, m->n_pos, d, m->pos_embd)      \
    X(type_embd, "type_embd", 1, d, 0, m->type_embd)          \
    X(embd_norm, "embd_norm", 1, d, 0, m->embd_norm.w)        \
    X(embd_norm_b, "embd_norm_b", 1, d, 0, m->embd_norm.b)

/* Reads tensors[name] (NULL with no error when absent and optional) and records the name as used. */
static PyObject *tensor_item(PyObject *tensors, PyObject *used, const char *name, int required) {
    PyObject *o = PyDict_GetItemString(tensors, name);
    if (!o) {
        if (required) PyErr_Format(PyExc_KeyError, "missing tensor %s", name);
        return NULL;
    }
    PyObject *key = PyUnicode_FromString(name);
    if (!key || PySet_Add(used, key) < 0) {
        Py_XDECREF(key);
        return NULL;
    }
    Py_DECREF(key);
    return o;
}

/* A float32 tensor of exactly dims (a -1 entry: any size), kept alive by `keep`. *out stays NULL
 * when the tensor is absent and optional; returns 0 with an exception set on error. */
static int float_tensor(PyObject *tensors, PyObject *used, PyObject *keep, const char *name, int ndim,
                        const npy_intp *dims, int required, const float **out) {
    *out = NULL;
    PyObject *o = tensor_item(tensors, used, name, required);
    if (!o) return !PyErr_Occurred();
    PyArrayObject *a = check_array(o, name, NPY_FLOAT32, ndim, dims, 0);
    if (!a || PyList_Append(keep, o) < 0) return 0;
    *out = PyArray_DATA(a);
    return 1;
}

static int vector_tensor(PyObject *tensors, PyObject *used, PyObject *keep, const char *name, npy_intp n,
                         int required, const float **out) {
    npy_intp dims[1] = {n};
    return float_tensor(tensors, used, keep, name, 1, dims, required, out);
}

/* A matrix (rows, cols): a float32 array, or a tuple (ggml_type, 1-D uint8 array of the file's
 * bytes) kept resident and decoded inside the products. w->data stays NULL when absent and optional. */
static int matrix_tensor(PyObject *tensors, PyObject *used, PyObject *keep, const char *name, npy_intp rows,
                         npy_intp cols, int required, sl_weight *w) {
    memset(w, 0, sizeof *w);
    PyObject *o = tensor_item(tensors, used, name, required);
    if (!o) return !PyErr_Occurred();
    if (!PyTuple_Check(o)) {
        npy_intp dims[2] = {rows, cols};
        PyArrayObject *a = check_array(o, name, NPY_FLOAT32, 2, dims, 0);
        if (!a || PyList_Append(keep, o) < 0) return 0;
        *w = sl_weight_f32(PyArray_DATA(a), rows, cols);
        return 1;
    }
    int type;
    PyObject *raw;
    if (!PyArg_ParseTuple(o, "iO;a quantized tensor is (ggml_type: int, data: uint8 array)", &type, &raw)) return 0;
    PyArrayObject *a = check_array(raw, name, NPY_UINT8, 1, NULL, 0);
    if (!a || PyList_Append(keep, raw) < 0) return 0;
    if (sl_weight_init(w, type, PyArray_DATA(a), PyArray_DIM(a, 0), rows, cols) != SL_OK) {
        PyErr_Format(PyExc_ValueError, "tensor %s: %s", name, sl_last_error());
        return 0;
    }
    return 1;
}

/* A norm's weight (d) and optional bias "<name>_b"; absent weight: no such norm. */
static int norm_tensor(PyObject *tensors, PyObject *used, PyObject *keep, const char *name, npy_intp d, sl_norm *n) {
    char bias[96];
    snprintf(bias, sizeof bias, "%s_b", name);
    return vector_tensor(tensors, used, keep, name, d, 0, &n->w) && vector_tensor(tensors, used, keep, bias, d, 0, &n->b);
}

static int cfg_float(PyObject *cfg, const char *key, double dflt, float *out) {
    PyObject *v = PyDict_GetItemString(cfg, key);
    double x = v && v != Py_None ? PyFloat_AsDouble(v) : dflt;
    if (x == -1.0 && PyErr_Occurred()) return 0;
    *out = (float)x;
    return 1;
}

static int cfg_small_int(PyObject *cfg, const char *key, int dflt, int *out) {
    PyObject *v = PyDict_GetItemString(cfg, key);
    long x = v && v != Py_None ? PyLong_AsLong(v) : dflt;
    if (x == -1 && PyErr_Occurred()) return 0;
    if (x < 0 || x > 64) {
        PyErr_Format(PyExc_ValueError, "model config %s=%ld is out of range", key, x);
        return 0;
    }
    *out = (int)x;
    return 1;
}

/* config["window"]: None or a list of n_layers sliding-window lengths (0: full attention). */
static int cfg_windows(PyObject *cfg, sl_layer_weights *layers, int64_t L) {
    PyObject *v = PyDict_GetItemString(cfg, "window");
    if (!v || v == Py_None) return 1;
    if (!PyList_Check(v) || PyList_GET_SIZE(v) != L) {
        PyErr_Format(PyExc_ValueError, "model config window must be None or a list of %lld ints", (long long)L);
        return 0;
    }
    for (int64_t l = 0; l < L; l++) {
        long long x = PyLong_AsLongLong(PyList_GET_ITEM(v, l));
        if (x == -1 && PyErr_Occurred()) return 0;
        if (x < 0) {
            PyErr_Format(PyExc_ValueError, "model config window[%lld]=%lld is negative", (long long)l, x);
            return 0;
        }
        layers[l].window = x;
    }
    return 1;
}

static int model_config(PyObject *cfg, sl_model *m) {
    int64_t layout;
    if (!cfg_int(cfg, "n_layers", &m->n_layers) || !cfg_int(cfg, "n_heads", &m->n_heads) ||
        !cfg_int(cfg, "n_kv_heads", &m->n_kv_heads) || !cfg_int(cfg, "d_model", &m->d_model) ||
        !cfg_int(cfg, "head_dim", &m->head_dim) || !cfg_int(cfg, "d_ff", &m->d_ff) ||
        !cfg_int(cfg, "vocab_size", &m->vocab_size))
        return 0;
    PyObject *eps = PyDict_GetItemString(cfg, "norm_eps"), *lay = PyDict_GetItemString(cfg, "rope_layout");
    if (!eps || !lay) {
        PyErr_SetString(PyExc_KeyError, "model config needs norm_eps and rope_layout");
        return 0;
    }
    m->norm_eps = (float)PyFloat_AsDouble(eps);
    layout = PyLong_AsLongLong(lay);
    if (PyErr_Occurred()) return 0;
    if (layout != SL_ROPE_HALF_SPLIT && layout != SL_ROPE_ADJACENT) {
        PyErr_Format(PyExc_ValueError, "rope_layout must be 0 or 1, got %lld", (long long)layout);
        return 0;
    }
    m->rope_layout = (int)layout;
    if (m->n_heads % m->n_kv_heads || m->head_dim % 2) {
        PyErr_Format(PyExc_ValueError, "n_heads (%lld) must be a multiple of n_kv_heads (%lld) and head_dim even",
                     (long long)m->n_heads, (long long)m->n_kv_heads);
        return 0;
    }
    return cfg_small_int(cfg, "norm_kind", SL_NORM_RMS, &m->norm_kind) && cfg_small_int(cfg, "act", SL_ACT_SWIGLU, &m->act) &&
           cfg_small_int(cfg, "bidirectional", 0, &m->bidirectional) && cfg_float(cfg, "embd_scale", 1.0, &m->embd_scale) &&
           cfg_float(cfg, "attn_scale", 1.0 / sqrt((double)m->head_dim), &m->attn_scale) &&
           cfg_float(cfg, "attn_softcap", 0.0, &m->attn_softcap) && cfg_float(cfg, "final_softcap", 0.0, &m->final_softcap);
}

static int global_tensors(PyObject *tensors, PyObject *used, PyObject *keep, sl_model *m) {
    const npy_intp d = m->d_model, V = m->vocab_size;
    npy_intp pos_dims[2] = {-1, d};
    if (!matrix_tensor(tensors, used, keep, "tok_embd", V, d, 1, &m->tok_embd) ||
        !matrix_tensor(tensors, used, keep, "lm_head", V, d, 0, &m->lm_head) ||
        !float_tensor(tensors, used, keep, "pos_embd", 2, pos_dims, 0, &m->pos_embd) ||
        !vector_tensor(tensors, used, keep, "type_embd", d, 0, &m->type_embd) ||
        !norm_tensor(tensors, used, keep, "embd_norm", d, &m->embd_norm) ||
        !norm_tensor(tensors, used, keep, "out_norm", d, &m->out_norm))
        return 0;
    if (m->pos_embd) m->n_pos = PyArray_DIM((PyArrayObject *)PyDict_GetItemString(tensors, "pos_embd"), 0);
    return 1;
}

static int layer_tensors(PyObject *tensors, PyObject *used, PyObject *keep, const sl_model *m, int64_t l,
                         const float *rope, int rope_shared, sl_layer_weights *lw) {
    const npy_intp d = m->d_model, hd = m->head_dim, qd = m->n_heads * hd, kvd = m->n_kv_heads * hd, F = m->d_ff;
    char n[64];
#define NAME(key) (snprintf(n, sizeof n, "blk.%lld." key, (long long)l), n)
    int ok = norm_tensor(tensors, used, keep, NAME("attn_norm"), d, &lw->attn_norm) &&
             norm_tensor(tensors, used, keep, NAME("attn_post_norm"), d, &lw->attn_post_norm) &&
             norm_tensor(tensors, used, keep, NAME("attn_res_norm"), d, &lw->attn_res_norm) &&
             norm_tensor(tensors, used, keep, NAME("ffn_norm"), d, &lw->ffn_norm) &&
             norm_tensor(tensors, used, keep, NAME("ffn_post_norm"), d, &lw->ffn_post_norm) &&
             norm_tensor(tensors, used, keep, NAME("ffn_res_norm"), d, &lw->ffn_res_norm) &&
             vector_tensor(tensors, used, keep, NAME("attn_q_norm"), hd, 0, &lw->attn_q_norm) &&
             vector_tensor(tensors, used, keep, NAME("attn_k_norm"), hd, 0, &lw->attn_k_norm) &&
             matrix_tensor(tensors, used, keep, NAME("attn_q"), qd, d, 1, &lw->wq) &&
             matrix_tensor(tensors, used, keep, NAME("attn_k"), kvd, d, 1, &lw->wk) &&
             matrix_tensor(tensors, used, keep, NAME("attn_v"), kvd, d, 1, &lw->wv) &&
             matrix_tensor(tensors, used, keep, NAME("attn_output"), d, qd, 1, &lw->wo) &&
             vector_tensor(tensors, used, keep, NAME("attn_q_b"), qd, 0, &lw->bq) &&
             vector_tensor(tensors, used, keep, NAME("attn_k_b"), kvd, 0, &lw->bk) &&
             vector_tensor(tensors, used, keep, NAME("attn_v_b"), kvd, 0, &lw->bv) &&
             vector_tensor(tensors, used, keep, NAME("attn_output_b"), d, 0, &lw->bo) &&
             matrix_tensor(tensors, used, keep, NAME("ffn_gate"), F, d, 0, &lw->w_gate) &&
             matrix_tensor(tensors, used, keep, NAME("ffn_up"), F, d, 1, &lw->w_up) &&
             matrix_tensor(tensors, used, keep, NAME("ffn_down"), d, F, 1, &lw->w_down) &&
             vector_tensor(tensors, used, keep, NAME("ffn_gate_b"), F, 0, &lw->b_gate) &&
             vector_tensor(tensors, used, keep, NAME("ffn_up_b"), F, 0, &lw->b_up) &&
             vector_tensor(tensors, used, keep, NAME("ffn_down_b"), d, 0, &lw->b_down);
#undef NAME
    lw->rope_inv_freq = rope ? rope + (rope_shared ? 0 : l * (hd / 2)) : NULL;
    return ok;
}

/* The first key of tensors that no field read (a typo, or a tensor of a feature not built). */
static int no_unknown_tensors(PyObject *tensors, PyObject *used) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(tensors, &pos, &key, &value)) {
        int in = PySet_Contains(used, key);
        if (in < 0) return 0;
        if (!in) {
            PyErr_Format(PyExc_ValueError, "unknown tensor %R: not part of the canonical schema", key);
            return 0;
        }
    }
    return 1;
}

static PyObject *py_model_new(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cfg, *tensors, *used = NULL;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &cfg, &PyDict_Type, &tensors)) return NULL;
    model_handle *h = PyMem_Calloc(1, sizeof *h);
    if (!h) return PyErr_NoMemory();
    sl_model *m = &h->model;
    PyObject *capsule = NULL;
    if (!(h->keep = PyList_New(0)) || !(used = PySet_New(NULL)) || !model_config(cfg, m)) goto fail;
    /* rope_inv_freq: (n_layers, hd/2), one row per layer, or (hd/2) shared by every layer. */
    PyObject *rope_o = PyDict_GetItemString(tensors, "rope_inv_freq");
    const int rope_shared = rope_o && PyArray_Check(rope_o) && PyArray_NDIM((PyArrayObject *)rope_o) == 1;
    npy_intp rope_dims[2] = {rope_shared ? m->head_dim / 2 : m->n_layers, m->head_dim / 2};
    const float *rope;
    if (!float_tensor(tensors, used, h->keep, "rope_inv_freq", rope_shared ? 1 : 2, rope_dims, 0, &rope) ||
        !global_tensors(tensors, used, h->keep, m))
        goto fail;
    if (!(h->layers = PyMem_Calloc((size_t)m->n_layers, sizeof *h->layers))) {
        PyErr_NoMemory();
        goto fail;
    }
    for (int64_t l = 0; l < m->n_layers; l++)
        if (!layer_tensors(tensors, used, h->keep, m, l, rope, rope_shared, &h->layers[l])) goto fail;
    if (!cfg_windows(cfg, h->layers, m->n_layers) || !no_unknown_tensors(tensors, used)) goto fail;
    m->layers = h->layers;
    if (sl_model_check(m) != SL_OK) {
        PyErr_Format(PyExc_ValueError, "%s", sl_last_error());
        goto fail;
    }
    Py_DECREF(used);
    capsule = PyCapsule_New(h, "sinklab.model", handle_destroy);
    if (capsule) return capsule;
    used = NULL;
fail:
    Py_XDECREF(used);
    Py_XDECREF(h->keep);
    PyMem_Free(h->layers);
    PyMem_Free(h);
    return NULL;
}

/* Fills ptrs[0..n) from a list of None-or-array of dtype `type` with the given per-entry shape. */
static int array_list(PyObject *lst, const char *name, Py_ssize_t n, int type, int ndim, const npy_intp *dims,
                      void **ptrs) {
    for (Py_ssize_t i = 0; i < n; i++) ptrs[i] = NULL;
    if (lst == Py_None) return 1;
    if (!PyList_Check(lst) || PyList_GET_SIZE(lst) != n) {
        PyErr_Format(PyExc_ValueError, "%s must be a list of %zd entries (None or array)", name, n);
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(lst, i);
        if (o == Py_None) continue;
        PyArrayObject *a = check_array(o, name, type, ndim, dims, 1);
        if (!a) return 0;
        ptrs[i] = PyArray_DATA(a);
    }
    return 1;
}

static int capture_list(PyObject *lst, const char *name, Py_ssize_t n, int ndim, const npy_intp *dims,
                        float **ptrs) {
    return array_list(lst, name, n, NPY_FLOAT32, ndim, dims, (void **)ptrs);
}

/* An optional (L, H) intervention array of the given dtype, or NULL for None. */
static int intervention_array(PyObject *o, const char *name, int type, const sl_model *m, const void **out) {
    *out = NULL;
    if (o == Py_None) return 1;
    npy_intp dims[2] = {m->n_layers, m->n_heads};
    PyArrayObject *a = check_array(o, name, type, 2, dims, 0);
    if (!a) return 0;
    *out = PyArray_DATA(a);
    return 1;
}

static int interventions(const sl_model *m, PyObject *mask_o, PyObject *zero_o, PyObject *scale_o,
                         sl_intervention *iv) {
    return intervention_array(mask_o, "mask_first", NPY_UINT8, m, (const void **)&iv->mask_first) &&
           intervention_array(zero_o, "zero_first_value", NPY_UINT8, m, (const void **)&iv->zero_first_value) &&
           intervention_array(scale_o, "head_scale", NPY_FLOAT32, m, (const void **)&iv->head_scale);
}

/* The packing mask of training: key_start None or an int64 array of T document starts (checked
 * by the core), keep_first a fixed ⟨bos⟩ that stays visible. */
static int packing_mask(PyObject *ks_o, int keep_first, npy_intp T, sl_intervention *iv) {
    iv->keep_first = keep_first;
    if (ks_o == Py_None) return 1;
    npy_intp dims[1] = {T};
    PyArrayObject *a = check_array(ks_o, "key_start", NPY_INT64, 1, dims, 0);
    if (a) iv->key_start = PyArray_DATA(a);
    return a != NULL;
}

/* Fills ptrs[b*n + l] (B*n entries) for one capture given as None; as a list of n per-layer
 * entries, None or an array of shape dims (the historical form, one sequence only); or as one
 * array of shape (B, n_sel) + dims ((n_sel,) + dims when the ids are 1-D) whose slot s is layer
 * sel[s] (sel NULL: n_sel = n and slot l is layer l). */
static int capture_arg(PyObject *o, const char *name, npy_intp B, int batched, Py_ssize_t n, const int64_t *sel,
                       Py_ssize_t n_sel, int ndim, const npy_intp *dims, float **ptrs) {
    for (npy_intp i = 0; i < B * n; i++) ptrs[i] = NULL;
    if (o == Py_None) return 1;
    if (PyList_Check(o)) {
        if (batched) {
            PyErr_Format(PyExc_ValueError, "%s: per-layer lists need 1-D ids; pass one (B, L', ...) array", name);
            return 0;
        }
        return capture_list(o, name, n, ndim, dims, ptrs);
    }
    npy_intp full[6];
    int k = 0;
    if (batched) full[k++] = B;
    full[k++] = sel ? n_sel : n;
    npy_intp per_slot = 1;
    for (int i = 0; i < ndim; i++) full[k++] = dims[i], per_slot *= dims[i];
    PyArrayObject *a = check_array(o, name, NPY_FLOAT32, k, full, 1);
    if (!a) return 0;
    float *data = PyArray_DATA(a);
    const Py_ssize_t slots = sel ? n_sel : n;
    for (npy_intp b = 0; b < B; b++)
        for (Py_ssize_t sl = 0; sl < slots; sl++)
            ptrs[b * n + (sel ? sel[sl] : sl)] = data + (b * slots + sl) * per_slot;
    return 1;
}

/* layers: None, or strictly increasing layer indices in [0, L); *sel stays NULL for None. */
static int layer_selection(PyObject *o, npy_intp L, int64_t **sel, Py_ssize_t *n_sel) {
    *sel = NULL, *n_sel = L;
    if (o == Py_None) return 1;
    PyObject *seq = PySequence_Fast(o, "layers must be None or a sequence of layer indices");
    if (!seq) return 0;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *out = PyMem_Calloc((size_t)n + 1, sizeof(int64_t));
    int ok = out != NULL;
    if (!ok) PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) ok = 0;
        else if (v < 0 || v >= L || (i > 0 && v <= out[i - 1])) {
            PyErr_Format(PyExc_ValueError, "layers must be increasing indices in [0, %zd), got %lld at %zd",
                         (Py_ssize_t)L, v, i);
            ok = 0;
        } else {
            out[i] = v;
        }
    }
    Py_DECREF(seq);
    if (!ok) {
        PyMem_Free(out);
        return 0;
    }
    *sel = out, *n_sel = n;
    return 1;
}

static PyObject *py_model_forward(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "ids", "attn", "resid", "logits", "logits_from", "importance",
                             "to_first", "entropy", "mask_first", "zero_first_value", "head_scale",
                             "q", "k", "v", "z", "head_out", "attn_out", "mlp_out", "lengths", "layers", "key_start",
                             "keep_first", NULL};
    PyObject *capsule, *ids_o, *attn_o = Py_None, *resid_o = Py_None, *logits_o = Py_None;
    PyObject *imp_o = Py_None, *first_o = Py_None, *ent_o = Py_None;
    PyObject *mask_o = Py_None, *zero_o = Py_None, *scale_o = Py_None;
    PyObject *q_o = Py_None, *k_o = Py_None, *v_o = Py_None, *z_o = Py_None, *head_o = Py_None;
    PyObject *aout_o = Py_None, *mout_o = Py_None, *len_o = Py_None, *layers_o = Py_None, *ks_o = Py_None;
    long long logits_from = 0;
    int keep_first = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOLOOOOOOOOOOOOOOOOp", kwlist, &capsule, &ids_o, &attn_o,
                                     &resid_o, &logits_o, &logits_from, &imp_o, &first_o, &ent_o, &mask_o,
                                     &zero_o, &scale_o, &q_o, &k_o, &v_o, &z_o, &head_o, &aout_o, &mout_o,
                                     &len_o, &layers_o, &ks_o, &keep_first))
        return NULL;
    model_handle *h = PyCapsule_GetPointer(capsule, "sinklab.model");
    if (!h) return NULL;
    const sl_model *m = &h->model;
    if (!PyArray_Check(ids_o) || (PyArray_NDIM((PyArrayObject *)ids_o) != 1 && PyArray_NDIM((PyArrayObject *)ids_o) != 2))
        return PyErr_Format(PyExc_ValueError, "ids must be a numpy array of shape (T,) or (B, T)");
    const int batched = PyArray_NDIM((PyArrayObject *)ids_o) == 2;
    PyArrayObject *ids = check_array(ids_o, "ids", NPY_INT64, batched ? 2 : 1, NULL, 0);
    if (!ids) return NULL;
    const npy_intp B = batched ? PyArray_DIM(ids, 0) : 1, T = PyArray_DIM(ids, batched ? 1 : 0);
    if (T == 0 || B == 0) return PyErr_Format(PyExc_ValueError, "ids is empty: need at least one token");
    if (logits_from < 0 || logits_from >= T)
        return PyErr_Format(PyExc_ValueError, "logits_from=%lld outside [0, %zd)", logits_from, (Py_ssize_t)T);
    const int64_t *lengths = NULL;
    if (len_o != Py_None) {
        npy_intp ldims[1] = {B};
        PyArrayObject *la = check_array(len_o, "lengths", NPY_INT64, 1, ldims, 0);
        if (!la) return NULL;
        lengths = PyArray_DATA(la);
    }
    const npy_intp L = m->n_layers;
    int64_t *sel;
    Py_ssize_t n_sel;
    if (!layer_selection(layers_o, L, &sel, &n_sel)) return NULL;
    /* One block of pointers: resid has B*(L+1) entries, each of the 11 other per-layer captures B*L. */
    float **ptrs = PyMem_Calloc((size_t)(B * (12 * L + 1)), sizeof(float *));
    if (!ptrs) {
        PyMem_Free(sel);
        return PyErr_NoMemory();
    }
    float **next = ptrs + B * (2 * L + 1); /* after attn (B*L) and resid (B*(L + 1)) */
#define TAKE() (next += B * L, next - B * L)
    sl_capture cap = {.attn = ptrs, .resid = ptrs + B * L, .logits = NULL, .logits_from = logits_from};
    cap.importance = TAKE(), cap.to_first = TAKE(), cap.entropy = TAKE();
    cap.q = TAKE(), cap.k = TAKE(), cap.v = TAKE(), cap.z = TAKE(), cap.head_out = TAKE();
    cap.attn_out = TAKE(), cap.mlp_out = TAKE();
#undef TAKE
    sl_intervention iv = {0};
    const npy_intp H = m->n_heads, G = m->n_kv_heads, hd = m->head_dim, d = m->d_model;
    npy_intp attn_dims[3] = {H, T, T}, resid_dims[2] = {T, d}, logit_dims[3] = {B, T - logits_from, m->vocab_size},
             stat_dims[2] = {H, T}, q_dims[3] = {H, T, hd}, kv_dims[3] = {G, T, hd},
             head_dims[3] = {H, T, d};
#define CAPTURE(o, name, field, nd, dims) capture_arg(o, name, B, batched, L, sel, n_sel, nd, dims, cap.field)
    int ok = CAPTURE(attn_o, "attn", attn, 3, attn_dims) &&
             capture_arg(resid_o, "resid", B, batched, L + 1, NULL, L + 1, 2, resid_dims, cap.resid) &&
             CAPTURE(imp_o, "importance", importance, 2, stat_dims) &&
             CAPTURE(first_o, "to_first", to_first, 2, stat_dims) &&
             CAPTURE(ent_o, "entropy", entropy, 2, stat_dims) &&
             CAPTURE(q_o, "q", q, 3, q_dims) && CAPTURE(k_o, "k", k, 3, kv_dims) && CAPTURE(v_o, "v", v, 3, kv_dims) &&
             CAPTURE(z_o, "z", z, 3, q_dims) && CAPTURE(head_o, "head_out", head_out, 3, head_dims) &&
             CAPTURE(aout_o, "attn_out", attn_out, 2, resid_dims) &&
             CAPTURE(mout_o, "mlp_out", mlp_out, 2, resid_dims) &&
             interventions(m, mask_o, zero_o, scale_o, &iv) && packing_mask(ks_o, keep_first, T, &iv);
#undef CAPTURE
    if (ok && logits_o != Py_None) {
        PyArrayObject *lg = check_array(logits_o, "logits", NPY_FLOAT32, batched ? 3 : 2,
                                        batched ? logit_dims : logit_dims + 1, 1);
        ok = lg != NULL;
        if (ok) cap.logits = PyArray_DATA(lg);
    }
    int rc = SL_OK;
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    if (ok) {
        sigint_guard guard;
        sigint_guard_begin(&guard, &ctx);
        Py_BEGIN_ALLOW_THREADS
        rc = sl_model_forward_batch(m, PyArray_DATA(ids), B, T, lengths, &cap, &iv, &h->cache);
        Py_END_ALLOW_THREADS
        sigint_guard_end(&guard);
    }
    sl_ctx_end(prev);
    PyMem_Free(ptrs);
    PyMem_Free(sel);
    if (!ok) return NULL;
    if (rc != SL_OK) return raise_status(&ctx, rc);
    Py_RETURN_NONE;
}

static PyObject *py_model_workspace_bytes(PyObject *self, PyObject *capsule) {
    (void)self;
    model_handle *h = PyCapsule_GetPointer(capsule, "sinklab.model");
    if (!h) return NULL;
    return PyLong_FromLongLong((long long)sl_ws_cache_bytes(&h->cache));
}

static PyObject *py_model_tape_floats(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule;
    long long T;
    if (!PyArg_ParseTuple(args, "OL", &capsule, &T)) return NULL;
    model_handle *h = PyCapsule_GetPointer(capsule, "sinklab.model");
    if (!h) return NULL;
    if (T < 1) return PyErr_Format(PyExc_ValueError, "T=%lld must be >= 1", T);
    const int64_t n = sl_layer_tape_floats(&h->model, T);
    if (n < 0) return PyErr_Format(PyExc_OverflowError, "tape size overflows for T=%lld", T);
    return PyLong_FromLongLong((long long)n);
}

static PyObject *py_model_release_workspace(PyObject *self, PyObject *capsule) {
    (void)self;
    model_handle *h = PyCapsule_GetPointer(capsule, "sinklab.model");
    if (!h) return NULL;
    /* Only the cached one: a call running now holds its own and puts it back afterwards. */
    sl_ws_cache_clear(&h->cache);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- derivatives */

/* The model handle and (T,) int64 ids of a derivative call. */
static const sl_model *model_and_ids(PyObject *capsule, PyObject *ids_o, PyArrayObject **ids) {
    model_handle *h = PyCapsule_GetPointer(capsule, "sinklab.model");
    if (!h) return NULL;
    *ids = check_array(ids_o, "ids", NPY_INT64, 1, NULL, 0);
    if (!*ids) return NULL;
    if (PyArray_DIM(*ids, 0) == 0) {
        PyErr_SetString(PyExc_ValueError, "ids is empty: need at least one token");
        return NULL;
    }
    return &h->model;
}

/* (B, T, d) float32 directions (cotangents or tangents) for a sequence of T tokens. */
static PyArrayObject *directions(PyObject *o, const char *name, const sl_model *m, npy_intp T) {
    npy_intp dims[3] = {-1, T, m->d_model};
    PyArrayObject *a = check_array(o, name, NPY_FLOAT32, 3, dims, 0);
    if (a && PyArray_DIM(a, 0) < 1) {
        PyErr_Format(PyExc_ValueError, "%s needs at least one direction", name);
        return NULL;
    }
    return a;
}

/* The model, (T,) ids and (B, T, d) directions of a VJP/JVP call, with `at` checked against
 * [0, n_layers]; NULL with an exception set on any problem. */
static const sl_model *direction_call(PyObject *capsule, PyObject *ids_o, PyObject *dirs_o, const char *name,
                                      long long at, PyArrayObject **ids, PyArrayObject **dirs) {
    const sl_model *m = model_and_ids(capsule, ids_o, ids);
    if (!m || !(*dirs = directions(dirs_o, name, m, PyArray_DIM(*ids, 0)))) return NULL;
    if (at < 0 || at > m->n_layers) {
        PyErr_Format(PyExc_ValueError, "at=%lld outside [0, %lld]", at, (long long)m->n_layers);
        return NULL;
    }
    return m;
}

static PyObject *py_model_vjp(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "ids", "cotangent", "at", "dresid", "sqnorm", "spectral",
                             "spectral_rtol", "spectral_max_iter", "mask_first", "zero_first_value",
                             "head_scale", NULL};
    PyObject *capsule, *ids_o, *cot_o, *dresid_o = Py_None, *sq_o = Py_None, *spec_o = Py_None;
    PyObject *mask_o = Py_None, *zero_o = Py_None, *scale_o = Py_None;
    long long at;
    double rtol = 1e-9;
    int max_iter = 300;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOL|OOOdiOOO", kwlist, &capsule, &ids_o, &cot_o, &at, &dresid_o,
                                     &sq_o, &spec_o, &rtol, &max_iter, &mask_o, &zero_o, &scale_o))
        return NULL;
    PyArrayObject *ids, *cot;
    const sl_model *m = direction_call(capsule, ids_o, cot_o, "cotangent", at, &ids, &cot);
    if (!m) return NULL;
    const npy_intp T = PyArray_DIM(ids, 0), L = m->n_layers;
    if (!(rtol > 0.0) || max_iter < 1)
        return PyErr_Format(PyExc_ValueError, "spectral_rtol must be > 0 and spectral_max_iter >= 1");
    const npy_intp B = PyArray_DIM(cot, 0);
    void **ptrs = PyMem_Calloc((size_t)(3 * (L + 1)), sizeof(void *));
    if (!ptrs) return PyErr_NoMemory();
    npy_intp g_dims[3] = {B, T, m->d_model}, sq_dims[2] = {B, T}, spec_dims[1] = {T};
    sl_vjp_out out = {(float **)ptrs, (double **)(ptrs + L + 1), (double **)(ptrs + 2 * (L + 1)), rtol, max_iter, 0};
    sl_intervention iv = {0};
    int ok = array_list(dresid_o, "dresid", L + 1, NPY_FLOAT32, 3, g_dims, ptrs) &&
             array_list(sq_o, "sqnorm", L + 1, NPY_FLOAT64, 2, sq_dims, ptrs + L + 1) &&
             array_list(spec_o, "spectral", L + 1, NPY_FLOAT64, 1, spec_dims, ptrs + 2 * (L + 1)) &&
             interventions(m, mask_o, zero_o, scale_o, &iv);
    int rc = SL_OK;
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    if (ok) {
        sigint_guard guard;
        sigint_guard_begin(&guard, &ctx);
        Py_BEGIN_ALLOW_THREADS
        rc = sl_model_vjp(m, PyArray_DATA(ids), T, &iv, at, B, PyArray_DATA(cot), &out);
        Py_END_ALLOW_THREADS
        sigint_guard_end(&guard);
    }
    sl_ctx_end(prev);
    PyMem_Free(ptrs);
    if (!ok) return NULL;
    if (rc != SL_OK) return raise_status(&ctx, rc);
    return PyLong_FromLong(out.spectral_iters);
}

static PyObject *py_model_jvp(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "ids", "tangent", "at", "tout", "mask_first", "zero_first_value",
                             "head_scale", NULL};
    PyObject *capsule, *ids_o, *tan_o, *tout_o = Py_None, *mask_o = Py_None, *zero_o = Py_None, *scale_o = Py_None;
    long long at;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOL|OOOO", kwlist, &capsule, &ids_o, &tan_o, &at, &tout_o, &mask_o,
                                     &zero_o, &scale_o))
        return NULL;
    PyArrayObject *ids, *tan;
    const sl_model *m = direction_call(capsule, ids_o, tan_o, "tangent", at, &ids, &tan);
    if (!m) return NULL;
    const npy_intp T = PyArray_DIM(ids, 0), L = m->n_layers;
    float **tout = PyMem_Calloc((size_t)(L + 1), sizeof(float *));
    if (!tout) return PyErr_NoMemory();
    npy_intp dims[3] = {PyArray_DIM(tan, 0), T, m->d_model};
    sl_intervention iv = {0};
    int ok = capture_list(tout_o, "tout", L + 1, 3, dims, tout) && interventions(m, mask_o, zero_o, scale_o, &iv);
    int rc = SL_OK;
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    if (ok) {
        sigint_guard guard;
        sigint_guard_begin(&guard, &ctx);
        Py_BEGIN_ALLOW_THREADS
        rc = sl_model_jvp(m, PyArray_DATA(ids), T, &iv, at, dims[0], PyArray_DATA(tan), tout);
        Py_END_ALLOW_THREADS
        sigint_guard_end(&guard);
    }
    sl_ctx_end(prev);
    PyMem_Free(tout);
    if (!ok) return NULL;
    if (rc != SL_OK) return raise_status(&ctx, rc);
    Py_RETURN_NONE;
}

/* grads[name], a writable float32 array shaped like the weight of that name; *n_used counts it. */
static float *grad_buffer(PyObject *grads, const char *name, int ndim, npy_intp d0, npy_intp d1, Py_ssize_t *n_used) {
    PyObject *o = PyDict_GetItemString(grads, name);
    if (!o) {
        PyErr_Format(PyExc_KeyError, "grads has no buffer for %s", name);
        return NULL;
    }
    npy_intp dims[2] = {d0, d1};
    PyArrayObject *a = check_array(o, name, NPY_FLOAT32, ndim, dims, 1);
    if (a) ++*n_used;
    return a ? PyArray_DATA(a) : NULL;
}

/* pg (its layers lg, n_layers entries) pointing at grads[name] for every tensor m has; every
 * entry of grads must be used. */
static int parse_grads(const sl_model *m, PyObject *grads, sl_model_grads *pg, sl_layer_grads *lg) {
    const npy_intp L = m->n_layers, d = m->d_model, hd = m->head_dim, qd = m->n_heads * hd;
    const npy_intp kvd = m->n_kv_heads * hd, F = m->d_ff, V = m->vocab_size;
    memset(pg, 0, sizeof *pg);
    pg->layers = lg;
    /* A buffer per tensor the model has; a tied head's key may name the embedding's buffer. */
    Py_ssize_t used = 0;
    int ok = 1;
#define G(field, key, nd, a, b, present) \
    if (ok && (present)) ok = (pg->field = grad_buffer(grads, key, nd, a, b, &used)) != NULL;
    GRAD_GLOBALS(G)
#undef G
    for (npy_intp l = 0; l < L && ok; l++) {
        const sl_layer_weights *lw = &m->layers[l];
        char name[64];
#define G(field, key, nd, a, b, present)                                              \
    if (ok && (present)) {                                                             \
        snprintf(name, sizeof name, "blk.%lld." key, (long long)l);                    \
        ok = (lg[l].field = grad_buffer(grads, name, nd, a, b, &used)) != NULL;        \
    }
        GRAD_TENSORS(G)
#undef G
    }
    if (ok && used != PyDict_Size(grads)) {
        PyErr_Format(PyExc_ValueError, "grads has %zd entries, but the model has %zd trainable tensors: "
                     "an entry names a tensor the model lacks", PyDict_Size(grads), used);
        ok = 0;
    }
    return ok;
}

static PyObject *py_model_loss_grad(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "ids", "targets", "grads", "mask_first", "zero_first_value", "head_scale",
                             "key_start", "keep_first", NULL};
    PyObject *capsule, *ids_o, *tg_o, *grads, *mask_o = Py_None, *zero_o = Py_None, *scale_o = Py_None;
    PyObject *ks_o = Py_None;
    int keep_first = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO!|OOOOp", kwlist, &capsule, &ids_o, &tg_o, &PyDict_Type, &grads,
                                     &mask_o, &zero_o, &scale_o, &ks_o, &keep_first))
        return NULL;
    PyArrayObject *ids;
    const sl_model *m = model_and_ids(capsule, ids_o, &ids);
    if (!m) return NULL;
    const npy_intp T = PyArray_DIM(ids, 0);
    npy_intp tdims[1] = {T};
    PyArrayObject *targets = check_array(tg_o, "targets", NPY_INT64, 1, tdims, 0);
    if (!targets) return NULL;
    if (!m->lm_head.data) {
        PyErr_SetString(PyExc_ValueError, "loss: the model has no LM head");
        return NULL;
    }
    sl_layer_grads *lg = PyMem_Calloc((size_t)m->n_layers, sizeof *lg);
    if (!lg) return PyErr_NoMemory();
    sl_model_grads pg;
    sl_intervention iv = {0};
    int ok = parse_grads(m, grads, &pg, lg) && interventions(m, mask_o, zero_o, scale_o, &iv) &&
             packing_mask(ks_o, keep_first, T, &iv);
    double loss = 0.0;
    int rc = SL_OK;
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    if (ok) {
        sigint_guard guard;
        sigint_guard_begin(&guard, &ctx);
        Py_BEGIN_ALLOW_THREADS
        rc = sl_model_loss_grad(m, PyArray_DATA(ids), PyArray_DATA(targets), T, &iv, &loss, &pg);
        Py_END_ALLOW_THREADS
        sigint_guard_end(&guard);
    }
    sl_ctx_end(prev);
    PyMem_Free(lg);
    if (!ok) return NULL;
    if (rc != SL_OK) return raise_status(&ctx, rc);
    return PyFloat_FromDouble(loss);
}

/* ---------------------------------------------------------------- training */

static void flat_destroy(PyObject *capsule) { sl_free(PyCapsule_GetPointer(capsule, "sinklab.flat")); }

/* A zeroed, 64-byte aligned buffer of n floats owned by the core, as a numpy array whose base
 * object frees it. */
static PyObject *flat_array(npy_intp n) {
    float *p = sl_alloc_floats(n > 0 ? n : 1);
    if (!p) return PyErr_NoMemory();
    PyObject *cap = PyCapsule_New(p, "sinklab.flat", flat_destroy);
    if (!cap) {
        sl_free(p);
        return NULL;
    }
    npy_intp dims[1] = {n};
    PyObject *arr = PyArray_SimpleNewFromData(1, dims, NPY_FLOAT32, p);
    if (!arr || PyArray_SetBaseObject((PyArrayObject *)arr, cap) < 0) {
        Py_XDECREF(arr);
        Py_DECREF(cap);
        return NULL;
    }
    return arr;
}

static PyObject *py_train_buffers(PyObject *self, PyObject *args) {
    (void)self;
    long long n, count;
    if (!PyArg_ParseTuple(args, "LL", &n, &count)) return NULL;
    if (n < 1 || n > ((long long)1 << 40) || count < 1 || count > 16)
        return PyErr_Format(PyExc_ValueError, "train_buffers: need 1 <= n <= 2^40 and 1 <= count <= 16, got %lld, %lld",
                            n, count);
    PyObject *out = PyTuple_New((Py_ssize_t)count);
    for (long long i = 0; out && i < count; i++) {
        PyObject *a = flat_array((npy_intp)n);
        if (!a) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, a);
    }
    return out;
}

/* Whether [p, p + bytes) lies inside the flat buffer base of n floats. */
static int inside(const void *p, int64_t bytes, const float *base, int64_t n) {
    const char *c = p, *b = (const char *)base;
    return c >= b && bytes >= 0 && c + bytes <= b + 4 * n;
}

/* Every gradient buffer of pg in grads (n floats), and every weight of m float32 inside params:
 * zeroing the flat gradient and updating the flat parameters then covers exactly the model. */
static int check_flat_views(const sl_model *m, const sl_model_grads *pg, const float *params, const float *grads,
                            int64_t n) {
    const npy_intp L = m->n_layers, d = m->d_model, hd = m->head_dim, qd = m->n_heads * hd;
    const npy_intp kvd = m->n_kv_heads * hd, F = m->d_ff, V = m->vocab_size;
    const char *bad = NULL;
    /* The weight `present` of shape (a) or (a, b) and its gradient buffer `g`. */
#define CHECK(g, key, nd, a, b, present)                                                        \
    if (!bad && (present)) {                                                                     \
        const int64_t bytes = 4 * (int64_t)(a) * ((nd) == 2 ? (int64_t)(b) : 1);                 \
        if (!inside((g), bytes, grads, n) || !inside((present), bytes, params, n)) bad = key;    \
    }
#define GG(field, key, nd, a, b, present) CHECK(pg->field, key, nd, a, b, present)
#define GL(field, key, nd, a, b, present) CHECK(pg->layers[l].field, key, nd, a, b, present)
    GRAD_GLOBALS(GG)
    for (npy_intp l = 0; l < L && !bad; l++) {
        const sl_layer_weights *lw = &m->layers[l];
        GRAD_TENSORS(GL)
    }
#undef GL
#undef GG
#undef CHECK
    if (bad) {
        PyErr_Format(PyExc_ValueError, "train_step: tensor %s is not a view into the flat parameter and gradient "
                     "buffers", bad);
        return 0;
    }
    const sl_weight *w[] = {&m->tok_embd, &m->lm_head};
    for (int i = 0; i < 2; i++)
        if (w[i]->data && w[i]->type != SL_GGML_F32) {
            PyErr_SetString(PyExc_ValueError, "train_step: every weight must be float32 to be trained");
            return 0;
        }
    for (npy_intp l = 0; l < L; l++) {
        const sl_layer_weights *lw = &m->layers[l];
        const sl_weight *lws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int i = 0; i < 7; i++)
            if (lws[i]->data && lws[i]->type != SL_GGML_F32) {
                PyErr_SetString(PyExc_ValueError, "train_step: every weight must be float32 to be trained");
                return 0;
            }
    }
    return 1;
}

static PyObject *py_train_step(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "grads", "params", "flat_grads", "mom", "vel", "decay", "ids", "targets",
                             "key_start", "keep_first", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip",
                             "step", "group_grads", NULL};
    PyObject *capsule, *grads, *p_o, *g_o, *m_o, *v_o, *dec_o, *ids_o, *tg_o, *ks_o = Py_None, *gg_o = Py_None;
    int keep_first = 0;
    sl_adamw hp = {0};
    long long step = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!OOOOOOOOpddddddL|O", kwlist, &capsule, &PyDict_Type, &grads, &p_o,
                                     &g_o, &m_o, &v_o, &dec_o, &ids_o, &tg_o, &ks_o, &keep_first, &hp.lr, &hp.beta1,
                                     &hp.beta2, &hp.eps, &hp.weight_decay, &hp.grad_clip, &step, &gg_o))
        return NULL;
    hp.step = step;
    model_handle *h = PyCapsule_GetPointer(capsule, "sinklab.model");
    if (!h) return NULL;
    const sl_model *m = &h->model;
    PyArrayObject *pa = check_array(p_o, "params", NPY_FLOAT32, 1, NULL, 1);
    if (!pa) return NULL;
    npy_intp fdims[1] = {PyArray_DIM(pa, 0)}, ddims[2] = {-1, 2};
    PyArrayObject *ga = check_array(g_o, "flat_grads", NPY_FLOAT32, 1, fdims, 1);
    PyArrayObject *ma = ga ? check_array(m_o, "mom", NPY_FLOAT32, 1, fdims, 1) : NULL;
    PyArrayObject *va = ma ? check_array(v_o, "vel", NPY_FLOAT32, 1, fdims, 1) : NULL;
    PyArrayObject *da = va ? check_array(dec_o, "decay", NPY_INT64, 2, ddims, 0) : NULL;
    PyArrayObject *ids = da ? check_array(ids_o, "ids", NPY_INT64, 2, NULL, 0) : NULL;
    if (!ids) return NULL;
    npy_intp bdims[2] = {PyArray_DIM(ids, 0), PyArray_DIM(ids, 1)};
    PyArrayObject *tg = check_array(tg_o, "targets", NPY_INT64, 2, bdims, 0);
    PyArrayObject *ks = tg && ks_o != Py_None ? check_array(ks_o, "key_start", NPY_INT64, 2, bdims, 0) : NULL;
    if (!tg || (ks_o != Py_None && !ks)) return NULL;
    if (bdims[0] < 1 || bdims[1] < 1) return PyErr_Format(PyExc_ValueError, "ids is empty: need (B, T) with B, T >= 1");
    if (!m->lm_head.data) return PyErr_Format(PyExc_ValueError, "train_step: the model has no LM head");
    sl_layer_grads *lg = PyMem_Calloc((size_t)m->n_layers, sizeof *lg);
    if (!lg) return PyErr_NoMemory();
    sl_model_grads pg;
    const int64_t n = PyArray_DIM(pa, 0);
    int ok = parse_grads(m, grads, &pg, lg) &&
             check_flat_views(m, &pg, PyArray_DATA(pa), PyArray_DATA(ga), n);
    /* group_grads: None (one group) or (groups - 1, n) float32 scratch for the other groups. */
    PyArrayObject *gga = NULL;
    if (ok && gg_o != Py_None) {
        npy_intp gdims[2] = {-1, n};
        gga = check_array(gg_o, "group_grads", NPY_FLOAT32, 2, gdims, 1);
        ok = gga != NULL;
    }
    sl_train_state st = {PyArray_DATA(pa), PyArray_DATA(ga), PyArray_DATA(ma), PyArray_DATA(va), n,
                         PyArray_DATA(da), PyArray_DIM(da, 0), gga ? PyArray_DATA(gga) : NULL,
                         gga ? 1 + PyArray_DIM(gga, 0) : 1};
    sl_train_batch b = {bdims[0], bdims[1], PyArray_DATA(ids), PyArray_DATA(tg), ks ? PyArray_DATA(ks) : NULL,
                        keep_first};
    double loss = 0.0, norm = 0.0;
    int rc = SL_OK;
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    if (ok) {
        sigint_guard guard;
        sigint_guard_begin(&guard, &ctx);
        Py_BEGIN_ALLOW_THREADS
        rc = sl_train_step(m, &pg, &st, &b, &hp, &loss, &norm);
        Py_END_ALLOW_THREADS
        sigint_guard_end(&guard);
    }
    sl_ctx_end(prev);
    PyMem_Free(lg);
    if (!ok) return NULL;
    if (rc != SL_OK) return raise_status(&ctx, rc);
    return Py_BuildValue("(dd)", loss, norm);
}

/* ---------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"set_num_threads", py_set_num_threads, METH_O,
     "set_num_threads(n): OpenMP threads for every later call, from any Python thread (process-wide)."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS,
     "get_num_threads() -> int: the count a call started now from this thread uses."},
    {"_interrupt_check_gaps", py_interrupt_check_gaps, METH_NOARGS,
     "_interrupt_check_gaps() -> (checks, longest_gap_s) of the last main-thread call guarded for Ctrl-C "
     "(-1 checks: none yet). Test-only."},
    {"set_thread_num_threads", py_set_thread_num_threads, METH_O,
     "set_thread_num_threads(n) -> previous: this OS thread's own count (0 clears), over the process-wide one."},
    {"_team_size", py_team_size, METH_NOARGS,
     "_team_size() -> int: test-only; team size a kernel's parallel region gets from this thread now."},
    {"simd", py_simd, METH_NOARGS, "simd() -> 'avx512' | 'avx2' | 'generic': the kernel family in use."},
    {"simd_best", py_simd_best, METH_NOARGS, "simd_best() -> the best kernel family this CPU supports."},
    {"build_info", py_build_info, METH_NOARGS,
     "build_info() -> dict: the compiler, flags, OpenMP and NumPy of this build; CPU features and threads now."},
    {"set_simd", py_set_simd, METH_O,
     "set_simd('generic' | 'avx2' | 'avx512' | 'auto') -> the level now in use (a level the CPU lacks\n"
     "falls back to the best it has)."},
    {"sgemm", (PyCFunction)(void (*)(void))py_sgemm, METH_VARARGS | METH_KEYWORDS,
     "sgemm(A, B, C=None, trans_a=False, trans_b=True, accumulate=False) -> C = op(A)·op(B) (+ C); "
     "A is (M, K), or (K, M) with trans_a; B is (N, K) with trans_b, else (K, N)."},
    {"sgemm_nt", (PyCFunction)(void (*)(void))py_sgemm_nt, METH_VARARGS | METH_KEYWORDS,
     "sgemm_nt(A (M,K) f32, B (N,K) f32, C=None, accumulate=False) -> C (M,N) = A @ B.T (+ C)."},
    {"quant_block_size", py_quant_block_size, METH_O, "quant_block_size(ggml_type) -> (elements, bytes) per block."},
    {"dequantize", py_dequantize, METH_VARARGS,
     "dequantize(ggml_type, data uint8 (nbytes,), n_elements) -> float32 (n_elements,)."},
    {"model_new", py_model_new, METH_VARARGS, "model_new(config: dict, tensors: dict) -> handle."},
    {"model_vjp", (PyCFunction)(void (*)(void))py_model_vjp, METH_VARARGS | METH_KEYWORDS,
     "model_vjp(handle, ids, cotangent (B,T,d), at, dresid=None, sqnorm=None, spectral=None, spectral_rtol=1e-9, "
     "spectral_max_iter=300, mask_first=None, zero_first_value=None, head_scale=None) -> the most Lanczos steps any spectral norm took"},
    {"model_jvp", (PyCFunction)(void (*)(void))py_model_jvp, METH_VARARGS | METH_KEYWORDS,
     "model_jvp(handle, ids, tangent (B,T,d), at, tout=None, mask_first=None, zero_first_value=None, head_scale=None)"},
    {"train_buffers", py_train_buffers, METH_VARARGS,
     "train_buffers(n, count) -> tuple of count zeroed float32 arrays of n elements, owned by the core "
     "(64-byte aligned): flat parameters, gradients and Adam moments."},
    {"train_step", (PyCFunction)(void (*)(void))py_train_step, METH_VARARGS | METH_KEYWORDS,
     "train_step(handle, grads, params, flat_grads, mom, vel, decay, ids, targets, key_start, keep_first, lr, "
     "beta1, beta2, eps, weight_decay, grad_clip, step) -> (loss, grad_norm): one AdamW step on a (B, T) batch."},
    {"model_loss_grad", (PyCFunction)(void (*)(void))py_model_loss_grad, METH_VARARGS | METH_KEYWORDS,
     "model_loss_grad(handle, ids, targets, grads: dict, mask_first=None, zero_first_value=None, head_scale=None) "
     "-> mean cross-entropy (nats); gradients are added into grads"},
    {"model_forward", (PyCFunction)(void (*)(void))py_model_forward, METH_VARARGS | METH_KEYWORDS,
     "model_forward(handle, ids int64 (T,) or (B, T), attn=None, resid=None, logits=None, logits_from=0,\n"
     "importance=None, to_first=None, entropy=None, mask_first=None, zero_first_value=None,\n"
     "head_scale=None, q=None, k=None, v=None, z=None, head_out=None, attn_out=None, mlp_out=None,\n"
     "lengths=None, layers=None):\n"
     "runs all B sequences in one call (their tokens packed through every weight product).\n"
     "Each per-layer capture is None or one float32 array (B, L', ...) (no B axis for (T,) ids)\n"
     "whose slot s is layer layers[s] (layers: increasing indices, default all): attn (H, T, T);\n"
     "importance, to_first, entropy (H, T); q, z (H, T, hd); k, v (G, T, hd); head_out (H, T, d);\n"
     "attn_out, mlp_out (T, d); resid is (B, L+1, T, d) and logits (B, T-logits_from, V). With (T,)\n"
     "ids a capture may also be a list of L per-layer arrays or None. lengths: None or int64 (B,)\n"
     "in [1, T], sequence b being its first lengths[b] ids (the rest padding, still valid ids);\n"
     "captures are zero at positions >= lengths[b]. Interventions are (L, H): mask_first uint8\n"
     "(0/1), zero_first_value uint8 (0 none, 1 queries i >= 1 only, 2 every query including 0,\n"
     "3 queries i >= 1 read v_0 as the mean of their other keys' values; other values raise\n"
     "ValueError), head_scale float32."},
    {"model_tape_floats", py_model_tape_floats, METH_VARARGS,
     "model_tape_floats(handle, T) -> floats one layer's saved activations take for T tokens (the backward's tape)."},
    {"model_workspace_bytes", py_model_workspace_bytes, METH_O,
     "model_workspace_bytes(handle) -> bytes of the activations workspace the model keeps between forward calls."},
    {"model_release_workspace", py_model_release_workspace, METH_O,
     "model_release_workspace(handle): frees the cached activations workspace (the next call allocates anew)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_core",
                                       "sinklab C core (kernels and the transformer forward).", -1,
                                       methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    PyObject *mod = PyModule_Create(&moduledef);
    if (!mod) return NULL;
    /* Pin the default (OMP_NUM_THREADS or the core count, as seen by the importing thread) so
     * that every Python thread starts from the same count. */
    sl_set_num_threads(sl_get_num_threads());
#if SL_HAVE_SIGINT_GUARD
    sl_main_thread = PyThread_get_thread_ident();  /* Python imports in its main thread, as a rule */
#endif
    if (PyModule_AddIntConstant(mod, "has_openmp", SL_HAVE_OPENMP) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}

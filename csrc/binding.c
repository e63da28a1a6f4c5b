/* sinklab._core: the CPython/NumPy binding. It converts and checks arguments, calls the core
 * through one skeleton (sl_py_call: the GIL released, the Ctrl-C guard on, the status raised)
 * and turns core status codes into Python exceptions. No numerics. Build information, the
 * SIGINT guard, training and the test-only entry points live in build_info.c, interrupt.c,
 * binding_train.c and binding_testing.c. */
#define SL_BINDING_MAIN
#include "binding.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "interrupt.h"
#include "ops.h"
#include "quant.h"
#include "sgemm.h"
#include "sl_common.h"

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

int sl_py_call(sl_py_core_fn fn, void *arg, int interruptible) {
    int rc;
    sl_ctx ctx;
    sl_ctx *prev = sl_ctx_begin(&ctx);
    sl_sigint_guard guard = {0};
    if (interruptible) sl_sigint_guard_begin(&guard, &ctx);
    Py_BEGIN_ALLOW_THREADS
    rc = fn(arg);
    Py_END_ALLOW_THREADS
    sl_sigint_guard_end(&guard);
    sl_ctx_end(prev);
    if (rc == SL_OK) return 0;
    raise_status(&ctx, rc);
    return -1;
}

PyArrayObject *sl_py_check_array(PyObject *obj, const char *name, int type, int ndim, const npy_intp *dims,
                                 int writable) {
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

static PyObject *py_guard_sigterm(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    return PyBool_FromLong(sl_set_guard_sigterm(on));
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
#if SL_HAVE_OPENMP
    return PyLong_FromLong(sl_get_num_threads());
#else
    return PyLong_FromLong(1);
#endif
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

/* ---------------------------------------------------------------- SGEMM */

typedef struct {
    int ta, tb;
    int64_t M, N, K;
    const float *a;
    int64_t lda;
    const float *b;
    int64_t ldb;
    float *c;
    int accumulate;
} sgemm_call;

static int run_sgemm(void *p) {
    const sgemm_call *c = p;
    return sl_sgemm(c->ta, c->tb, c->M, c->N, c->K, c->a, c->lda, c->b, c->ldb, c->c, c->N, c->accumulate, 1);
}

/* sgemm(A, B, C=None, trans_a=False, trans_b=True, accumulate=False): C = op(A)·op(B) (+ C). */
static PyObject *py_sgemm(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"A", "B", "C", "trans_a", "trans_b", "accumulate", NULL};
    PyObject *ao, *bo, *co = Py_None;
    int accumulate = 0, ta = 0, tb = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Oppp", kwlist, &ao, &bo, &co, &ta, &tb, &accumulate))
        return NULL;
    PyArrayObject *a = sl_py_check_array(ao, "A", NPY_FLOAT32, 2, NULL, 0);
    if (!a) return NULL;
    PyArrayObject *b = sl_py_check_array(bo, "B", NPY_FLOAT32, 2, NULL, 0);
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
        if (!sl_py_check_array(co, "C", NPY_FLOAT32, 2, dims, 1)) return NULL;
        c = (PyArrayObject *)co;
        Py_INCREF(c);
    }
    sgemm_call call = {ta, tb, M, N, K, PyArray_DATA(a), PyArray_DIM(a, 1), PyArray_DATA(b), PyArray_DIM(b, 1),
                       PyArray_DATA(c), accumulate};
    if (sl_py_call(run_sgemm, &call, 0) < 0) {
        Py_DECREF(c);
        return NULL;
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

typedef struct {
    int type;
    const uint8_t *src;
    int64_t nbytes;
    float *dst;
    int64_t n;
} dequantize_call;

static int run_dequantize_check(void *p) {
    const dequantize_call *c = p;
    return sl_dequantize_check(c->type, c->nbytes, c->n);
}

static int run_dequantize(void *p) {
    const dequantize_call *c = p;
    return sl_dequantize(c->type, c->src, c->nbytes, c->dst, c->n, 1);
}

static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    (void)self;
    int type;
    PyObject *data;
    long long n;
    if (!PyArg_ParseTuple(args, "iOL", &type, &data, &n)) return NULL;
    PyArrayObject *src = sl_py_check_array(data, "data", NPY_UINT8, 1, NULL, 0);
    if (!src) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "n_elements must be >= 0, got %lld", n);
    /* Size checks before allocating, so a bogus n_elements is a ValueError, not a MemoryError. */
    dequantize_call c = {type, PyArray_DATA(src), PyArray_DIM(src, 0), NULL, n};
    if (sl_py_call(run_dequantize_check, &c, 0) < 0) return NULL;
    npy_intp dims[1] = {(npy_intp)n};
    PyArrayObject *out = (PyArrayObject *)PyArray_EMPTY(1, dims, NPY_FLOAT32, 0);
    if (!out) return NULL;
    c.dst = PyArray_DATA(out);
    if (sl_py_call(run_dequantize, &c, 0) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return (PyObject *)out;
}

/* ---------------------------------------------------------------- model handle */

sl_py_model *sl_py_model_of(PyObject *capsule) { return PyCapsule_GetPointer(capsule, "sinklab.model"); }

static void handle_destroy(PyObject *capsule) {
    sl_py_model *h = PyCapsule_GetPointer(capsule, "sinklab.model");
    if (!h) return;
    sl_ws_cache_clear(&h->cache); /* no call can be running: each holds a reference */
    sl_packed_cache_clear(&h->packed);
    sl_packed_cache_clear(&h->train_packed);
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
    PyArrayObject *a = sl_py_check_array(o, name, NPY_FLOAT32, ndim, dims, 0);
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
        PyArrayObject *a = sl_py_check_array(o, name, NPY_FLOAT32, 2, dims, 0);
        if (!a || PyList_Append(keep, o) < 0) return 0;
        *w = sl_weight_f32(PyArray_DATA(a), rows, cols);
        return 1;
    }
    int type;
    PyObject *raw;
    if (!PyArg_ParseTuple(o, "iO;a quantized tensor is (ggml_type: int, data: uint8 array)", &type, &raw)) return 0;
    PyArrayObject *a = sl_py_check_array(raw, name, NPY_UINT8, 1, NULL, 0);
    if (!a || PyList_Append(keep, raw) < 0) return 0;
    if (sl_weight_init(w, type, PyArray_DATA(a), PyArray_DIM(a, 0), rows, cols) != SL_OK) {
        PyErr_Format(PyExc_ValueError, "tensor %s: %s", name, sl_last_error());
        return 0;
    }
    return 1;
}

/* The parsers of the schema's kinds (model.h): MATRIX into an sl_weight, VECTOR (rows) and TABLE
 * (any, cols) into a float pointer; absent and optional: left NULL. */
static int parse_MATRIX(PyObject *tensors, PyObject *used, PyObject *keep, const char *name, npy_intp rows,
                        npy_intp cols, int required, sl_weight *w) {
    return matrix_tensor(tensors, used, keep, name, rows, cols, required, w);
}

static int parse_VECTOR(PyObject *tensors, PyObject *used, PyObject *keep, const char *name, npy_intp rows,
                        npy_intp cols, int required, const float **out) {
    (void)cols;
    return vector_tensor(tensors, used, keep, name, rows, required, out);
}

static int parse_TABLE(PyObject *tensors, PyObject *used, PyObject *keep, const char *name, npy_intp rows,
                       npy_intp cols, int required, const float **out) {
    (void)rows; /* the table's length is the file's (n_pos) */
    npy_intp dims[2] = {-1, cols};
    return float_tensor(tensors, used, keep, name, 2, dims, required, out);
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
    /* n_kv_heads <= n_heads then, so n_kv_heads * head_dim is in range too */
    if (m->n_heads > (1LL << 40) / m->head_dim) {
        PyErr_Format(PyExc_ValueError, "model config n_heads * head_dim = %lld * %lld is out of range",
                     (long long)m->n_heads, (long long)m->head_dim);
        return 0;
    }
    if (m->n_heads % m->n_kv_heads || m->head_dim % 2) {
        PyErr_Format(PyExc_ValueError, "n_heads (%lld) must be a multiple of n_kv_heads (%lld) and head_dim even",
                     (long long)m->n_heads, (long long)m->n_kv_heads);
        return 0;
    }
    return cfg_small_int(cfg, "norm_kind", SL_NORM_RMS, &m->norm_kind) && cfg_small_int(cfg, "act", SL_ACT_SWIGLU, &m->act) &&
           cfg_small_int(cfg, "bidirectional", 0, &m->bidirectional) && cfg_float(cfg, "embd_scale", 1.0, &m->embd_scale) &&
           cfg_float(cfg, "attn_scale", 1.0 / sqrt((double)m->head_dim), &m->attn_scale) &&
           cfg_float(cfg, "attn_softcap", 0.0, &m->attn_softcap) && cfg_float(cfg, "final_softcap", 0.0, &m->final_softcap) &&
           cfg_small_int(cfg, "attn_variant", SL_ATTN_SOFTMAX, &m->attn_variant);
}

/* The schema's global tensors of m, then n_pos from the learned positions' length. */
static int global_tensors(PyObject *tensors, PyObject *used, PyObject *keep, sl_model *m) {
    int ok = 1;
#define PARSE(grad, key, kind, weight, rows, cols, required, role)                                           \
    ok = ok && parse_##kind(tensors, used, keep, key, sl_model_dim(m, SL_DIM_##rows), sl_model_dim(m, SL_DIM_##cols), \
                            required, &m->weight);
    SL_GLOBAL_TENSORS(PARSE)
#undef PARSE
    if (!ok) return 0;
    if (m->pos_embd) m->n_pos = PyArray_DIM((PyArrayObject *)PyDict_GetItemString(tensors, "pos_embd"), 0);
    return 1;
}

/* Layer l's tensors of the schema ("blk.<l>.<key>") and its slice of the RoPE frequencies. */
static int layer_tensors(PyObject *tensors, PyObject *used, PyObject *keep, const sl_model *m, int64_t l,
                         const float *rope, int rope_shared, sl_layer_weights *lw) {
    char n[64];
    int ok = 1;
#define PARSE(grad, key, kind, weight, rows, cols, required, role)                                              \
    ok = ok && (snprintf(n, sizeof n, "blk.%lld." key, (long long)l), 1) &&                                    \
         parse_##kind(tensors, used, keep, n, sl_model_dim(m, SL_DIM_##rows), sl_model_dim(m, SL_DIM_##cols), \
                      required, &lw->weight);
    SL_LAYER_TENSORS(PARSE)
#undef PARSE
    const npy_intp hd = m->head_dim;
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
    sl_py_model *h = PyMem_Calloc(1, sizeof *h);
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
    if (sl_packed_cache_init(&h->packed, m->n_layers) != SL_OK) {
        PyErr_NoMemory();
        goto fail;
    }
    m->packed = &h->packed;
    m->precision = SL_PREC_FP32;
    Py_DECREF(used);
    capsule = PyCapsule_New(h, "sinklab.model", handle_destroy);
    if (capsule) return capsule;
    used = NULL;
fail:
    Py_XDECREF(used);
    Py_XDECREF(h->keep);
    sl_packed_cache_clear(&h->packed);
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
        PyArrayObject *a = sl_py_check_array(o, name, type, ndim, dims, 1);
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
    PyArrayObject *a = sl_py_check_array(o, name, type, 2, dims, 0);
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
 * by the core), keep_first the count of first keys (a fixed ⟨bos⟩, sinks) that stay visible. */
static int packing_mask(PyObject *ks_o, int keep_first, npy_intp T, sl_intervention *iv) {
    iv->keep_first = keep_first;
    if (ks_o == Py_None) return 1;
    npy_intp dims[1] = {T};
    PyArrayObject *a = sl_py_check_array(ks_o, "key_start", NPY_INT64, 1, dims, 0);
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
    PyArrayObject *a = sl_py_check_array(o, name, NPY_FLOAT32, k, full, 1);
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

/* The patch table from a list of (point, mode, layer, rows, heads, positions, value) tuples:
 * rows, positions int64 (n,) arrays, heads None (stream points) or an int64 array, value a
 * float32 C-contiguous array (never copied: the list keeps it alive for the call). The core checks
 * every index and size (sl_patch_check); *table stays NULL for None. */
static int patch_table(PyObject *o, sl_patch_table *pt, sl_patch **table) {
    *table = NULL;
    pt->p = NULL, pt->n = 0;
    if (o == Py_None) return 1;
    if (!PyList_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "patch must be None or a list of (point, mode, layer, rows, heads, "
                                         "positions, value) tuples");
        return 0;
    }
    const Py_ssize_t n = PyList_GET_SIZE(o);
    if (n == 0) return 1;
    sl_patch *p = PyMem_Calloc((size_t)n, sizeof *p);
    if (!p) {
        PyErr_NoMemory();
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rows_o, *heads_o, *pos_o, *val_o;
        int point, mode;
        long long layer;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(o, i), "iiLOOOO;a patch is (point, mode, layer, rows, heads, "
                              "positions, value)", &point, &mode, &layer, &rows_o, &heads_o, &pos_o, &val_o))
            goto fail;
        PyArrayObject *rows = sl_py_check_array(rows_o, "patch rows", NPY_INT64, 1, NULL, 0);
        PyArrayObject *pos = rows ? sl_py_check_array(pos_o, "patch positions", NPY_INT64, 1, NULL, 0) : NULL;
        PyArrayObject *heads = NULL;
        if (pos && heads_o != Py_None && !(heads = sl_py_check_array(heads_o, "patch heads", NPY_INT64, 1, NULL, 0)))
            goto fail;
        if (!pos) goto fail;
        if (!PyArray_Check(val_o) || PyArray_TYPE((PyArrayObject *)val_o) != NPY_FLOAT32 ||
            !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)val_o) || !PyArray_ISALIGNED((PyArrayObject *)val_o)) {
            PyErr_Format(PyExc_ValueError, "patch %zd: value must be a C-contiguous float32 array", i);
            goto fail;
        }
        PyArrayObject *val = (PyArrayObject *)val_o;
        p[i] = (sl_patch){.point = point, .mode = mode, .layer = layer, .n_rows = PyArray_DIM(rows, 0),
                          .n_heads = heads ? PyArray_DIM(heads, 0) : 1, .n_pos = PyArray_DIM(pos, 0),
                          .rows = PyArray_DATA(rows), .heads = heads ? PyArray_DATA(heads) : NULL,
                          .pos = PyArray_DATA(pos), .value = PyArray_DATA(val), .n_value = PyArray_SIZE(val)};
    }
    pt->p = p, pt->n = n;
    *table = p;
    return 1;
fail:
    PyMem_Free(p);
    return 0;
}

typedef struct {
    const sl_model *m;
    const int64_t *ids;
    int64_t B, T;
    const int64_t *lengths;
    const sl_capture *cap;
    const sl_intervention *iv;
    sl_ws_cache *cache;
} forward_call;

static int run_forward(void *p) {
    const forward_call *c = p;
    return sl_model_forward_batch(c->m, c->ids, c->B, c->T, c->lengths, c->cap, c->iv, c->cache);
}

static PyObject *py_model_forward(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "ids", "attn", "resid", "logits", "logits_from", "importance",
                             "to_first", "entropy", "mask_first", "zero_first_value", "head_scale",
                             "q", "k", "v", "z", "head_out", "attn_out", "mlp_out", "lengths", "layers", "key_start",
                             "keep_first", "precision", "window", "patch", "logits_at", NULL};
    PyObject *patch_o = Py_None, *at_o = Py_None;
    PyObject *capsule, *ids_o, *attn_o = Py_None, *resid_o = Py_None, *logits_o = Py_None;
    PyObject *imp_o = Py_None, *first_o = Py_None, *ent_o = Py_None;
    PyObject *mask_o = Py_None, *zero_o = Py_None, *scale_o = Py_None;
    PyObject *q_o = Py_None, *k_o = Py_None, *v_o = Py_None, *z_o = Py_None, *head_o = Py_None;
    PyObject *aout_o = Py_None, *mout_o = Py_None, *len_o = Py_None, *layers_o = Py_None, *ks_o = Py_None;
    long long logits_from = 0;
    int keep_first = 0, precision = SL_PREC_FP32;
    long long window = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOLOOOOOOOOOOOOOOOOiiLOO", kwlist, &capsule, &ids_o, &attn_o,
                                     &resid_o, &logits_o, &logits_from, &imp_o, &first_o, &ent_o, &mask_o,
                                     &zero_o, &scale_o, &q_o, &k_o, &v_o, &z_o, &head_o, &aout_o, &mout_o,
                                     &len_o, &layers_o, &ks_o, &keep_first, &precision, &window, &patch_o, &at_o))
        return NULL;
    if (keep_first < 0 || window < 0)
        return PyErr_Format(PyExc_ValueError, "keep_first=%d and window=%lld must be >= 0", keep_first, window);
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    if (precision != SL_PREC_FP32 && precision != SL_PREC_BF16 && precision != SL_PREC_INT8)
        return PyErr_Format(PyExc_ValueError, "precision %d (%s) is not available: 0 (fp32), 1 (bf16) or 2 (int8)",
                            precision, sl_precision_name(precision));
    /* this call's descriptor: the handle's, with the call's precision */
    sl_model mcall = h->model;
    mcall.precision = precision;
    const sl_model *m = &mcall;
    if (!PyArray_Check(ids_o) || (PyArray_NDIM((PyArrayObject *)ids_o) != 1 && PyArray_NDIM((PyArrayObject *)ids_o) != 2))
        return PyErr_Format(PyExc_ValueError, "ids must be a numpy array of shape (T,) or (B, T)");
    const int batched = PyArray_NDIM((PyArrayObject *)ids_o) == 2;
    PyArrayObject *ids = sl_py_check_array(ids_o, "ids", NPY_INT64, batched ? 2 : 1, NULL, 0);
    if (!ids) return NULL;
    const npy_intp B = batched ? PyArray_DIM(ids, 0) : 1, T = PyArray_DIM(ids, batched ? 1 : 0);
    if (T == 0 || B == 0) return PyErr_Format(PyExc_ValueError, "ids is empty: need at least one token");
    if (logits_from < 0 || logits_from >= T)
        return PyErr_Format(PyExc_ValueError, "logits_from=%lld outside [0, %zd)", logits_from, (Py_ssize_t)T);
    /* logits_at: (R,) or (B, R) positions; the core checks each against its sequence's length */
    const int64_t *logits_at = NULL;
    npy_intp logit_rows = T - logits_from;
    if (at_o != Py_None) {
        npy_intp adims[2] = {B, -1};
        PyArrayObject *aa = sl_py_check_array(at_o, "logits_at", NPY_INT64, batched ? 2 : 1, batched ? adims : adims + 1, 0);
        if (!aa) return NULL;
        logit_rows = PyArray_DIM(aa, batched ? 1 : 0);
        logits_at = PyArray_DATA(aa);
    }
    const int64_t *lengths = NULL;
    if (len_o != Py_None) {
        npy_intp ldims[1] = {B};
        PyArrayObject *la = sl_py_check_array(len_o, "lengths", NPY_INT64, 1, ldims, 0);
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
    sl_capture cap = {.attn = ptrs, .resid = ptrs + B * L, .logits = NULL, .logits_from = logits_from,
                      .logits_at = logits_at, .logits_rows = logit_rows};
    cap.importance = TAKE(), cap.to_first = TAKE(), cap.entropy = TAKE();
    cap.q = TAKE(), cap.k = TAKE(), cap.v = TAKE(), cap.z = TAKE(), cap.head_out = TAKE();
    cap.attn_out = TAKE(), cap.mlp_out = TAKE();
#undef TAKE
    sl_intervention iv = {0};
    const npy_intp H = m->n_heads, G = m->n_kv_heads, hd = m->head_dim, d = m->d_model;
    npy_intp attn_dims[3] = {H, T, T}, resid_dims[2] = {T, d}, logit_dims[3] = {B, logit_rows, m->vocab_size},
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
    iv.window = (int64_t)window;
#undef CAPTURE
    sl_patch_table pt;
    sl_patch *patches = NULL;
    ok = ok && patch_table(patch_o, &pt, &patches);
    if (patches) iv.patch = &pt;
    if (ok && logits_o != Py_None) {
        PyArrayObject *lg = sl_py_check_array(logits_o, "logits", NPY_FLOAT32, batched ? 3 : 2,
                                        batched ? logit_dims : logit_dims + 1, 1);
        ok = lg != NULL;
        if (ok) cap.logits = PyArray_DATA(lg);
    }
    forward_call c = {m, PyArray_DATA(ids), B, T, lengths, &cap, &iv, &h->cache};
    ok = ok && sl_py_call(run_forward, &c, 1) == 0;
    PyMem_Free(patches);
    PyMem_Free(ptrs);
    PyMem_Free(sel);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_model_workspace_bytes(PyObject *self, PyObject *capsule) {
    (void)self;
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    return PyLong_FromLongLong((long long)sl_ws_cache_bytes(&h->cache));
}

static PyObject *py_model_tape_floats(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule;
    long long T;
    if (!PyArg_ParseTuple(args, "OL", &capsule, &T)) return NULL;
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    if (T < 1) return PyErr_Format(PyExc_ValueError, "T=%lld must be >= 1", T);
    const int64_t n = sl_layer_tape_floats(&h->model, T);
    if (n < 0) return PyErr_Format(PyExc_OverflowError, "tape size overflows for T=%lld", T);
    return PyLong_FromLongLong((long long)n);
}

/* model_grad_floats(handle, T, B=1, n_tape=None): sl_model_grad_floats (n_tape None: every layer). */
static PyObject *py_model_grad_floats(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "T", "B", "n_tape", NULL};
    PyObject *capsule, *tape_o = Py_None;
    long long T, B = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OL|LO", kwlist, &capsule, &T, &B, &tape_o)) return NULL;
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    const int64_t L = h->model.n_layers;
    long long n_tape = L;
    if (tape_o != Py_None && (n_tape = PyLong_AsLongLong(tape_o)) == -1 && PyErr_Occurred()) return NULL;
    if (T < 1 || B < 0 || n_tape < 0 || n_tape > L)
        return PyErr_Format(PyExc_ValueError, "model_grad_floats: need T >= 1, B >= 0 and n_tape in [0, %lld], got "
                            "T=%lld, B=%lld, n_tape=%lld", (long long)L, T, B, n_tape);
    const int64_t n = sl_model_grad_floats(&h->model, T, B, n_tape);
    if (n < 0) return PyErr_Format(PyExc_OverflowError, "gradient buffer size overflows for T=%lld, B=%lld", T, B);
    return PyLong_FromLongLong((long long)n);
}

static PyObject *py_model_forward_floats(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule;
    long long rows;
    if (!PyArg_ParseTuple(args, "OL", &capsule, &rows)) return NULL;
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    if (rows < 0) return PyErr_Format(PyExc_ValueError, "rows=%lld must be >= 0", rows);
    const int64_t n = sl_model_forward_floats(&h->model, rows);
    if (n < 0) return PyErr_Format(PyExc_OverflowError, "workspace size overflows for %lld rows", rows);
    return PyLong_FromLongLong((long long)n);
}

/* One row of the schema as (scope, key, kind, shape, required, role); shape is the dimension
 * names of the axes. */
static PyObject *schema_row(const char *scope, const char *key, int kind, sl_dim rows, sl_dim cols, int required,
                            int role) {
    PyObject *shape = cols == SL_DIM_NONE ? Py_BuildValue("(s)", sl_dim_name(rows))
                                          : Py_BuildValue("(ss)", sl_dim_name(rows), sl_dim_name(cols));
    if (!shape) return NULL;
    PyObject *row = Py_BuildValue("(sssNOs)", scope, key, sl_kind_name(kind), shape, required ? Py_True : Py_False,
                                  sl_role_name(role));
    return row;
}

static PyObject *py_tensor_schema(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    PyObject *out = PyList_New(0), *row;
    if (!out) return NULL;
#define ROW(scope, grad, key, kind, weight, rows, cols, required, role)                                        \
    if (!(row = schema_row(scope, key, SL_KIND_##kind, SL_DIM_##rows, SL_DIM_##cols, required, SL_ROLE_##role)) || \
        PyList_Append(out, row) < 0) {                                                                         \
        Py_XDECREF(row);                                                                                       \
        Py_DECREF(out);                                                                                        \
        return NULL;                                                                                           \
    }                                                                                                          \
    Py_DECREF(row);
#define GLOBAL(...) ROW("global", __VA_ARGS__)
#define LAYER(...) ROW("layer", __VA_ARGS__)
    SL_GLOBAL_TENSORS(GLOBAL)
    SL_LAYER_TENSORS(LAYER)
#undef LAYER
#undef GLOBAL
#undef ROW
    PyObject *t = PyList_AsTuple(out);
    Py_DECREF(out);
    return t;
}

static PyObject *py_model_packed_bytes(PyObject *self, PyObject *capsule) {
    (void)self;
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    return PyLong_FromLongLong((long long)sl_packed_cache_bytes(&h->packed));
}

static PyObject *py_model_release_workspace(PyObject *self, PyObject *capsule) {
    (void)self;
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    /* Only the cached one: a call running now holds its own and puts it back afterwards. */
    sl_ws_cache_clear(&h->cache);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- derivatives */

/* The model handle and (T,) int64 ids of a derivative call. */
static const sl_model *model_and_ids(PyObject *capsule, PyObject *ids_o, PyArrayObject **ids) {
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    *ids = sl_py_check_array(ids_o, "ids", NPY_INT64, 1, NULL, 0);
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
    PyArrayObject *a = sl_py_check_array(o, name, NPY_FLOAT32, 3, dims, 0);
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

/* The arguments of a VJP (out) or JVP (tout) call. */
typedef struct {
    const sl_model *m;
    const int64_t *ids;
    int64_t T;
    const sl_intervention *iv;
    int64_t at, B;
    const float *dirs;
    sl_vjp_out *out;
    float **tout;
} derivative_call;

static int run_vjp(void *p) {
    const derivative_call *c = p;
    return sl_model_vjp(c->m, c->ids, c->T, c->iv, c->at, c->B, c->dirs, c->out);
}

static int run_jvp(void *p) {
    const derivative_call *c = p;
    return sl_model_jvp(c->m, c->ids, c->T, c->iv, c->at, c->B, c->dirs, c->tout);
}

static PyObject *py_model_vjp(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "ids", "cotangent", "at", "dresid", "sqnorm", "spectral",
                             "spectral_rtol", "spectral_max_iter", "mask_first", "zero_first_value",
                             "head_scale", "patch", NULL};
    PyObject *capsule, *ids_o, *cot_o, *dresid_o = Py_None, *sq_o = Py_None, *spec_o = Py_None;
    PyObject *mask_o = Py_None, *zero_o = Py_None, *scale_o = Py_None, *patch_o = Py_None;
    long long at;
    double rtol = 1e-9;
    int max_iter = 300;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOL|OOOdiOOOO", kwlist, &capsule, &ids_o, &cot_o, &at, &dresid_o,
                                     &sq_o, &spec_o, &rtol, &max_iter, &mask_o, &zero_o, &scale_o, &patch_o))
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
    sl_patch_table pt;
    sl_patch *patches = NULL;
    ok = ok && patch_table(patch_o, &pt, &patches);
    if (patches) iv.patch = &pt;
    derivative_call c = {m, PyArray_DATA(ids), T, &iv, at, B, PyArray_DATA(cot), &out, NULL};
    ok = ok && sl_py_call(run_vjp, &c, 1) == 0;
    PyMem_Free(patches);
    PyMem_Free(ptrs);
    if (!ok) return NULL;
    return PyLong_FromLong(out.spectral_iters);
}

static PyObject *py_model_jvp(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "ids", "tangent", "at", "tout", "mask_first", "zero_first_value",
                             "head_scale", "patch", NULL};
    PyObject *capsule, *ids_o, *tan_o, *tout_o = Py_None, *mask_o = Py_None, *zero_o = Py_None, *scale_o = Py_None;
    PyObject *patch_o = Py_None;
    long long at;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOL|OOOOO", kwlist, &capsule, &ids_o, &tan_o, &at, &tout_o, &mask_o,
                                     &zero_o, &scale_o, &patch_o))
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
    sl_patch_table pt;
    sl_patch *patches = NULL;
    ok = ok && patch_table(patch_o, &pt, &patches);
    if (patches) iv.patch = &pt;
    derivative_call c = {m, PyArray_DATA(ids), T, &iv, at, dims[0], PyArray_DATA(tan), NULL, tout};
    ok = ok && sl_py_call(run_jvp, &c, 1) == 0;
    PyMem_Free(patches);
    PyMem_Free(tout);
    if (!ok) return NULL;
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
    PyArrayObject *a = sl_py_check_array(o, name, NPY_FLOAT32, ndim, dims, 1);
    if (a) ++*n_used;
    return a ? PyArray_DATA(a) : NULL;
}

int sl_py_parse_grads(const sl_model *m, PyObject *grads, sl_model_grads *pg, sl_layer_grads *lg) {
    memset(pg, 0, sizeof *pg);
    pg->layers = lg;
    /* A buffer per tensor the model has; a tied head's key may name the embedding's buffer. */
    Py_ssize_t used = 0;
    int ok = 1;
#define G(grad, key, kind, weight, rows, cols, required, role)                                          \
    if (ok && SL_HAS_##kind(m->weight))                                                                 \
        ok = (pg->grad = grad_buffer(grads, key, SL_NDIM(cols), sl_model_dim(m, SL_DIM_##rows),         \
                                     sl_model_dim(m, SL_DIM_##cols), &used)) != NULL;
    SL_GLOBAL_TENSORS(G)
#undef G
    for (int64_t l = 0; l < m->n_layers && ok; l++) {
        const sl_layer_weights *lw = &m->layers[l];
        char name[64];
#define G(grad, key, kind, weight, rows, cols, required, role)                                          \
    if (ok && SL_HAS_##kind(lw->weight)) {                                                              \
        snprintf(name, sizeof name, "blk.%lld." key, (long long)l);                                     \
        ok = (lg[l].grad = grad_buffer(grads, name, SL_NDIM(cols), sl_model_dim(m, SL_DIM_##rows),      \
                                       sl_model_dim(m, SL_DIM_##cols), &used)) != NULL;                 \
    }
        SL_LAYER_TENSORS(G)
#undef G
    }
    if (ok && used != PyDict_Size(grads)) {
        PyErr_Format(PyExc_ValueError, "grads has %zd entries, but the model has %zd trainable tensors: "
                     "an entry names a tensor the model lacks", PyDict_Size(grads), used);
        ok = 0;
    }
    return ok;
}

typedef struct {
    const sl_model *m;
    const int64_t *ids, *targets;
    int64_t T;
    const sl_intervention *iv;
    double loss;
    const sl_model_grads *pg;
} loss_call;

static int run_loss_grad(void *p) {
    loss_call *c = p;
    return sl_model_loss_grad(c->m, c->ids, c->targets, c->T, c->iv, &c->loss, c->pg);
}

static PyObject *py_model_loss_grad(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "ids", "targets", "grads", "mask_first", "zero_first_value", "head_scale",
                             "key_start", "keep_first", NULL};
    PyObject *capsule, *ids_o, *tg_o, *grads, *mask_o = Py_None, *zero_o = Py_None, *scale_o = Py_None;
    PyObject *ks_o = Py_None;
    int keep_first = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO!|OOOOi", kwlist, &capsule, &ids_o, &tg_o, &PyDict_Type, &grads,
                                     &mask_o, &zero_o, &scale_o, &ks_o, &keep_first))
        return NULL;
    PyArrayObject *ids;
    const sl_model *m = model_and_ids(capsule, ids_o, &ids);
    if (!m) return NULL;
    const npy_intp T = PyArray_DIM(ids, 0);
    npy_intp tdims[1] = {T};
    PyArrayObject *targets = sl_py_check_array(tg_o, "targets", NPY_INT64, 1, tdims, 0);
    if (!targets) return NULL;
    if (!m->lm_head.data) {
        PyErr_SetString(PyExc_ValueError, "loss: the model has no LM head");
        return NULL;
    }
    sl_layer_grads *lg = PyMem_Calloc((size_t)m->n_layers, sizeof *lg);
    if (!lg) return PyErr_NoMemory();
    sl_model_grads pg;
    sl_intervention iv = {0};
    int ok = sl_py_parse_grads(m, grads, &pg, lg) && interventions(m, mask_o, zero_o, scale_o, &iv) &&
             packing_mask(ks_o, keep_first, T, &iv);
    loss_call c = {m, PyArray_DATA(ids), PyArray_DATA(targets), T, &iv, 0.0, &pg};
    ok = ok && sl_py_call(run_loss_grad, &c, 1) == 0;
    PyMem_Free(lg);
    if (!ok) return NULL;
    return PyFloat_FromDouble(c.loss);
}

/* ---------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"set_num_threads", py_set_num_threads, METH_O,
     "set_num_threads(n): OpenMP threads for every later call, from any Python thread (process-wide)."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS,
     "get_num_threads() -> int: the count a call started now from this thread uses."},
    {"guard_sigterm", py_guard_sigterm, METH_O,
     "guard_sigterm(on) -> previous: whether long calls also stop for SIGTERM (Python's handler then runs)."},
    {"_interrupt_check_gaps", sl_py_interrupt_check_gaps, METH_NOARGS,
     "_interrupt_check_gaps() -> (checks, longest_gap_s) of the last main-thread call guarded for Ctrl-C "
     "(-1 checks: none yet). Test-only."},
    {"set_thread_num_threads", py_set_thread_num_threads, METH_O,
     "set_thread_num_threads(n) -> previous: this OS thread's own count (0 clears), over the process-wide one."},
    {"_attention", (PyCFunction)(void (*)(void))sl_py_attention, METH_VARARGS | METH_KEYWORDS,
     "_attention(q (T, H*hd), k, v (T, G*hd), n_heads, n_kv_heads, variant=0, sinks=None, window=0, softcap=0.0,\n"
     "key_start=None, keep_first=0, dout=None, tq=None, tk=None, tv=None, tsinks=None) -> dict: test-only; the\n"
     "attention op (variant 0 softmax, 1 sink logit, 2 softmax-plus-one): out, probs; with dout (B*T, H*hd) dq, dk,\n"
     "dv, dsinks (B, H); with tq, tk, tv (and tsinks (B, H)) tout."},
    {"_attn_gate", (PyCFunction)(void (*)(void))sl_py_attn_gate, METH_VARARGS | METH_KEYWORDS,
     "_attn_gate(z (T, W), g (T, W), dzg=None, tz=None, tg=None) -> dict: test-only; gated attention's gate\n"
     "zg = z * sigmoid(g), with dzg (B*T, W) its backward dz, dg, with tz (and tg) its JVP tzg."},
    {"_team_size", sl_py_team_size, METH_NOARGS,
     "_team_size() -> int: test-only; team size a kernel's parallel region gets from this thread now."},
    {"_int8_prepack", sl_py_int8_prepack, METH_VARARGS,
     "_int8_prepack(weight_bytes uint8, type, rows, cols) -> capsule: the weight packed for _linear_int8. Test-only."},
    {"_linear_int8", (PyCFunction)(void (*)(void))sl_py_linear_int8, METH_VARARGS | METH_KEYWORDS,
     "_linear_int8(a (M, K) f32, weight (uint8 bytes or an _int8_prepack capsule), type=-1, rows=-1, cols=-1,\n"
     "out=None, accumulate=False) -> (M, rows) f32: sl_linear_nt_int8. Test-only."},
    {"_linear_int8_shared", sl_py_linear_int8_shared, METH_VARARGS,
     "_linear_int8_shared(a (M, K) f32, [capsules]) -> [(M, rows) f32]: a quantized once, one product per\n"
     "packed weight (sl_int8_acts_init + sl_linear_nt_int8_acts). Test-only."},
    {"_linear_shared", sl_py_linear_shared, METH_VARARGS,
     "_linear_shared(a (M, K) f32, [w (N, K) f32], precision 0|1|2) -> [(M, N) f32]: the products of one input\n"
     "in one call, as the forward's q/k/v and gate/up (fp32, bf16 or int8, each w packed first). Test-only."},
    {"_int8_usable", sl_py_int8_usable, METH_VARARGS,
     "_int8_usable(weight_bytes uint8, type, rows, cols) -> bool: sl_int8_weight_usable. Test-only."},
    {"_int8_quantize", sl_py_int8_quantize, METH_O,
     "_int8_quantize(a (M, K) f32) -> (q int8, d f32 (M, K/32), s int32 (M, K/32)). Test-only."},
    {"_int8_weight_unpack", sl_py_int8_weight_unpack, METH_O,
     "_int8_weight_unpack(capsule) -> dict(u, dw, mw, zp, exact, type): the packed weight read back. Test-only."},
    {"_int8_info", sl_py_int8_info, METH_NOARGS,
     "_int8_info() -> dict(kernel, cpu_avx512_vnni, cpu_avx_vnni). Test-only."},
    {"_int8_force_kernel", sl_py_int8_force_kernel, METH_O,
     "_int8_force_kernel('generic' | 'avx2' | 'avx_vnni' | 'avx512_vnni' | 'auto') -> the int8 kernel now in use\n"
     "(the best one at or below the cap that the CPU and simd() allow). Test-only."},
    {"_int8_peak", sl_py_int8_peak, METH_VARARGS,
     "_int8_peak(iters, kernel='avx512_vnni' | 'avx_vnni') -> (int ops, seconds): register-only vpdpbusd\n"
     "loop (zmm / ymm) on every thread. Benchmark-only."},
    {"_bf16_round", (PyCFunction)(void (*)(void))sl_py_bf16_round, METH_VARARGS | METH_KEYWORDS,
     "_bf16_round(x float32 (n,), path=0) -> uint16 (n,) bf16 bits (round to nearest even, as vcvtneps2bf16). "
     "Test-only; path 0 auto, 1 portable, 2 AVX512-BF16."},
    {"_bf16_linear_tn", (PyCFunction)(void (*)(void))sl_py_bf16_linear_tn, METH_VARARGS | METH_KEYWORDS,
     "_bf16_linear_tn(At float32 (K,M), B float32 (K,N), path=0) -> C (M,N) = bf16(At)^T bf16(B) (sl_bf16_pack_t, "
     "sl_bf16_linear_tn). Test-only."},
    {"_bf16_linear", (PyCFunction)(void (*)(void))sl_py_bf16_linear, METH_VARARGS | METH_KEYWORDS,
     "_bf16_linear(A float32 (M,K), W float32 (N,K) | uint8 raw, type=0, rows=0, C=None, accumulate=False, "
     "path=0) -> C = bf16(A) @ bf16(W).T (+ C), fp32 accumulation in vdpbf16ps order. Test-only."},
    {"_bf16_path", sl_py_bf16_path, METH_O,
     "_bf16_path(requested 0|1|2) -> 'avx512_bf16' | 'portable' | None. Test-only."},
    {"_bf16_peak", sl_py_bf16_peak, METH_O,
     "_bf16_peak(iters) -> GFLOP/s of a register-only vdpbf16ps loop on this thread (-1 without AVX512-BF16)."},
    {"simd", py_simd, METH_NOARGS, "simd() -> 'avx512' | 'avx2' | 'generic': the kernel family in use."},
    {"simd_best", py_simd_best, METH_NOARGS, "simd_best() -> the best kernel family this CPU supports."},
    {"build_info", sl_py_build_info, METH_NOARGS,
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
     "spectral_max_iter=300, mask_first=None, zero_first_value=None, head_scale=None, patch=None) -> the most Lanczos steps any spectral norm took"},
    {"model_jvp", (PyCFunction)(void (*)(void))py_model_jvp, METH_VARARGS | METH_KEYWORDS,
     "model_jvp(handle, ids, tangent (B,T,d), at, tout=None, mask_first=None, zero_first_value=None, head_scale=None, patch=None)"},
    {"train_buffers", sl_py_train_buffers, METH_VARARGS,
     "train_buffers(n, count) -> tuple of count zeroed float32 arrays of n elements, owned by the core "
     "(64-byte aligned): flat parameters, gradients and Adam moments."},
    {"train_step", (PyCFunction)(void (*)(void))sl_py_train_step, METH_VARARGS | METH_KEYWORDS,
     "train_step(handle, grads, params, flat_grads, mom, vel, decay, ids, targets, key_start, keep_first, lr, "
     "beta1, beta2, eps, weight_decay, grad_clip, step, group_grads=None, precision=0) -> (loss, grad_norm): one "
     "AdamW step on a (B, T) batch; precision 0 fp32 (exact), 1 bf16 (weight products of forward and backward in "
     "bf16, fp32 master weights and AdamW)."},
    {"model_loss_grad", (PyCFunction)(void (*)(void))py_model_loss_grad, METH_VARARGS | METH_KEYWORDS,
     "model_loss_grad(handle, ids, targets, grads: dict, mask_first=None, zero_first_value=None, head_scale=None) "
     "-> mean cross-entropy (nats); gradients are added into grads"},
    {"model_forward", (PyCFunction)(void (*)(void))py_model_forward, METH_VARARGS | METH_KEYWORDS,
     "model_forward(handle, ids int64 (T,) or (B, T), attn=None, resid=None, logits=None, logits_from=0,\n"
     "importance=None, to_first=None, entropy=None, mask_first=None, zero_first_value=None,\n"
     "head_scale=None, q=None, k=None, v=None, z=None, head_out=None, attn_out=None, mlp_out=None,\n"
     "lengths=None, layers=None, key_start=None, keep_first=0, precision=0, window=0, patch=None,\n"
     "logits_at=None):\n"
     "runs all B sequences in one call (their tokens packed through every weight product).\n"
     "Each per-layer capture is None or one float32 array (B, L', ...) (no B axis for (T,) ids)\n"
     "whose slot s is layer layers[s] (layers: increasing indices, default all): attn (H, T, T);\n"
     "importance, to_first, entropy (H, T); q, z (H, T, hd); k, v (G, T, hd); head_out (H, T, d);\n"
     "attn_out, mlp_out (T, d); resid is (B, L+1, T, d) and logits (B, T-logits_from, V), or\n"
     "(B, R, V) with logits_at int64 (B, R): the rows at those positions only (logits_from 0). With (T,)\n"
     "ids a capture may also be a list of L per-layer arrays or None. lengths: None or int64 (B,)\n"
     "in [1, T], sequence b being its first lengths[b] ids (the rest padding, still valid ids);\n"
     "captures are zero at positions >= lengths[b]. Interventions are (L, H): mask_first uint8\n"
     "(0/1), zero_first_value uint8 (0 none, 1 queries i >= 1 only, 2 every query including 0,\n"
     "3 queries i >= 1 read v_0 as the mean of their other keys' values; other values raise\n"
     "ValueError), head_scale float32. precision: 0 fp32 (exact, the default), 1 bf16 (weight products\n"
     "in bf16 with fp32 accumulation) or 2 int8 (weights as int8 with per-block scales, activations\n"
     "quantized per row in blocks of 32); the model's panels built at first use; others raise ValueError.\n"
     "patch: None or a list of (point, mode, layer, rows, heads, positions, value) (csrc/patch.h)."},
    {"model_tape_floats", py_model_tape_floats, METH_VARARGS,
     "model_tape_floats(handle, T) -> floats one layer's saved activations take for T tokens (the backward's tape)."},
    {"model_grad_floats", (PyCFunction)(void (*)(void))py_model_grad_floats, METH_VARARGS | METH_KEYWORDS,
     "model_grad_floats(handle, T, B=1, n_tape=None) -> floats the VJP/JVP allocate for B directions on T tokens\n"
     "with the saved activations of n_tape layers (default all), besides the outputs: the tapes, one layer's\n"
     "(H, T, T) probabilities, the direction buffers and the MLP's F-wide blocks (not the (T, hd) RoPE tables)."},
    {"model_forward_floats", py_model_forward_floats, METH_VARARGS,
     "model_forward_floats(handle, rows) -> floats of the forward's workspace that grow with rows packed token\n"
     "rows (activations, V transposed, importance partials at most; not the per-thread score blocks)."},
    {"tensor_schema", py_tensor_schema, METH_NOARGS,
     "tensor_schema() -> tuple of (scope, key, kind, shape, required, role): every tensor the core reads, globals\n"
     "first. scope 'global' or 'layer' (key prefixed 'blk.<l>.'); kind 'matrix' (float32 or quantized), 'vector'\n"
     "or 'table' (learned positions, any length); shape: dimension names among 'd', 'qd' (n_heads*head_dim),\n"
     "'kvd' (n_kv_heads*head_dim), 'hd', 'F', 'V', 'n_pos'; role 'embedding', 'head', 'norm', 'norm_bias',\n"
     "'matrix' or 'bias'. rope_inv_freq ((hd/2) or (n_layers, hd/2)) is read besides these."},
    {"model_workspace_bytes", py_model_workspace_bytes, METH_O,
     "model_workspace_bytes(handle) -> bytes of the activations workspace the model keeps between forward calls."},
    {"model_packed_bytes", py_model_packed_bytes, METH_O,
     "model_packed_bytes(handle) -> bytes of the bf16 weight panels built so far (at their first bf16 use)."},
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
    sl_sigint_init(); /* Python imports in its main thread, as a rule */
    if (PyModule_AddIntConstant(mod, "has_openmp", SL_HAVE_OPENMP) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}

/* The binding's training entry points: the core-owned flat buffers (train_buffers) and one AdamW
 * step (train_step), with the check that every parameter and gradient tensor is a view into
 * those flat buffers. Conversion and checks only; the step itself is train.c's. */
#include "binding.h"

#include "quant.h"
#include "sl_common.h"
#include "train.h"

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

PyObject *sl_py_train_buffers(PyObject *self, PyObject *args) {
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

/* Whether [p, p + bytes) lies inside the flat buffer base of n floats (compared as addresses, so
 * that a pointer outside the buffer is never offset). */
static int inside(const void *p, int64_t bytes, const float *base, int64_t n) {
    const uintptr_t c = (uintptr_t)p, b = (uintptr_t)base;
    return bytes >= 0 && n >= 0 && c >= b && (uint64_t)(c - b) <= (uint64_t)4 * (uint64_t)n &&
           (uint64_t)bytes <= (uint64_t)4 * (uint64_t)n - (uint64_t)(c - b);
}

/* Bytes of a float32 tensor of dims (rows, cols) of m (cols NONE: a vector); -1 on overflow. */
static int64_t tensor_bytes(const sl_model *m, sl_dim rows, sl_dim cols) {
    int64_t n, bytes;
    return sl_mul_size(sl_model_dim(m, rows), sl_model_dim(m, cols), &n) && sl_mul_size(n, 4, &bytes) ? bytes : -1;
}

/* Every gradient buffer of pg in grads (n floats), and every weight of m float32 inside params:
 * zeroing the flat gradient and updating the flat parameters then covers exactly the model. */
static int check_flat_views(const sl_model *m, const sl_model_grads *pg, const float *params, const float *grads,
                            int64_t n) {
    const char *bad = NULL;
    /* The schema's weight (its data pointer) and its gradient buffer g, when the model has it. */
#define DATA_MATRIX(w) ((const void *)(w).data)
#define DATA_VECTOR(w) ((const void *)(w))
#define DATA_TABLE(w) ((const void *)(w))
#define CHECK(g, key, kind, w, rows, cols)                                                          \
    if (!bad && SL_HAS_##kind(w)) {                                                                 \
        const int64_t bytes = tensor_bytes(m, SL_DIM_##rows, SL_DIM_##cols);                        \
        if (!inside((g), bytes, grads, n) || !inside(DATA_##kind(w), bytes, params, n)) bad = key;  \
    }
#define GLOBAL(grad, key, kind, weight, rows, cols, required, role) CHECK(pg->grad, key, kind, m->weight, rows, cols)
#define LAYER(grad, key, kind, weight, rows, cols, required, role) \
    CHECK(pg->layers[l].grad, key, kind, lw->weight, rows, cols)
    SL_GLOBAL_TENSORS(GLOBAL)
    for (int64_t l = 0; l < m->n_layers && !bad; l++) {
        const sl_layer_weights *lw = &m->layers[l];
        SL_LAYER_TENSORS(LAYER)
    }
#undef LAYER
#undef GLOBAL
#undef CHECK
    if (bad) {
        PyErr_Format(PyExc_ValueError, "train_step: tensor %s is not a view into the flat parameter and gradient "
                     "buffers", bad);
        return 0;
    }
    /* Every matrix float32: a quantized one has no float parameters to update. */
#define QUANT_MATRIX(w) ((w).data && (w).type != SL_GGML_F32)
#define QUANT_VECTOR(w) 0
#define QUANT_TABLE(w) 0
#define GLOBAL(grad, key, kind, weight, rows, cols, required, role) || QUANT_##kind(m->weight)
#define LAYER(grad, key, kind, weight, rows, cols, required, role) || QUANT_##kind(lw->weight)
    int quantized = 0 SL_GLOBAL_TENSORS(GLOBAL);
    for (int64_t l = 0; l < m->n_layers && !quantized; l++) {
        const sl_layer_weights *lw = &m->layers[l];
        quantized = 0 SL_LAYER_TENSORS(LAYER);
    }
#undef LAYER
#undef GLOBAL
#undef QUANT_MATRIX
#undef QUANT_VECTOR
#undef QUANT_TABLE
#undef DATA_MATRIX
#undef DATA_VECTOR
#undef DATA_TABLE
    if (quantized) {
        PyErr_SetString(PyExc_ValueError, "train_step: every weight must be float32 to be trained");
        return 0;
    }
    return 1;
}

typedef struct {
    const sl_model *m;
    const sl_model_grads *pg;
    sl_train_state *st;
    const sl_train_batch *b;
    const sl_adamw *hp;
    double loss, norm;
} train_call;

static int run_train_step(void *p) {
    train_call *c = p;
    return sl_train_step(c->m, c->pg, c->st, c->b, c->hp, &c->loss, &c->norm);
}

PyObject *sl_py_train_step(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"handle", "grads", "params", "flat_grads", "mom", "vel", "decay", "ids", "targets",
                             "key_start", "keep_first", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip",
                             "step", "group_grads", "precision", NULL};
    PyObject *capsule, *grads, *p_o, *g_o, *m_o, *v_o, *dec_o, *ids_o, *tg_o, *ks_o = Py_None, *gg_o = Py_None;
    int keep_first = 0;
    sl_adamw hp = {0};
    long long step = 0;
    int precision = SL_PREC_FP32;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!OOOOOOOOpddddddL|Oi", kwlist, &capsule, &PyDict_Type, &grads, &p_o,
                                     &g_o, &m_o, &v_o, &dec_o, &ids_o, &tg_o, &ks_o, &keep_first, &hp.lr, &hp.beta1,
                                     &hp.beta2, &hp.eps, &hp.weight_decay, &hp.grad_clip, &step, &gg_o,
                                     &precision))
        return NULL;
    if (precision != SL_PREC_FP32 && precision != SL_PREC_BF16)
        return PyErr_Format(PyExc_ValueError, "train_step: precision %d (%s) is not available for training: 0 (fp32) "
                            "or 1 (bf16)", precision, sl_precision_name(precision));
    hp.step = step;
    sl_py_model *h = sl_py_model_of(capsule);
    if (!h) return NULL;
    const sl_model *m = &h->model;
    PyArrayObject *pa = sl_py_check_array(p_o, "params", NPY_FLOAT32, 1, NULL, 1);
    if (!pa) return NULL;
    npy_intp fdims[1] = {PyArray_DIM(pa, 0)}, ddims[2] = {-1, 2};
    PyArrayObject *ga = sl_py_check_array(g_o, "flat_grads", NPY_FLOAT32, 1, fdims, 1);
    PyArrayObject *ma = ga ? sl_py_check_array(m_o, "mom", NPY_FLOAT32, 1, fdims, 1) : NULL;
    PyArrayObject *va = ma ? sl_py_check_array(v_o, "vel", NPY_FLOAT32, 1, fdims, 1) : NULL;
    PyArrayObject *da = va ? sl_py_check_array(dec_o, "decay", NPY_INT64, 2, ddims, 0) : NULL;
    PyArrayObject *ids = da ? sl_py_check_array(ids_o, "ids", NPY_INT64, 2, NULL, 0) : NULL;
    if (!ids) return NULL;
    npy_intp bdims[2] = {PyArray_DIM(ids, 0), PyArray_DIM(ids, 1)};
    PyArrayObject *tg = sl_py_check_array(tg_o, "targets", NPY_INT64, 2, bdims, 0);
    PyArrayObject *ks = tg && ks_o != Py_None ? sl_py_check_array(ks_o, "key_start", NPY_INT64, 2, bdims, 0) : NULL;
    if (!tg || (ks_o != Py_None && !ks)) return NULL;
    if (bdims[0] < 1 || bdims[1] < 1) return PyErr_Format(PyExc_ValueError, "ids is empty: need (B, T) with B, T >= 1");
    if (!m->lm_head.data) return PyErr_Format(PyExc_ValueError, "train_step: the model has no LM head");
    sl_layer_grads *lg = PyMem_Calloc((size_t)m->n_layers, sizeof *lg);
    if (!lg) return PyErr_NoMemory();
    sl_model_grads pg;
    const int64_t n = PyArray_DIM(pa, 0);
    int ok = sl_py_parse_grads(m, grads, &pg, lg) && check_flat_views(m, &pg, PyArray_DATA(pa), PyArray_DATA(ga), n);
    /* group_grads: None (one group) or (groups - 1, n) float32 scratch for the other groups. */
    PyArrayObject *gga = NULL;
    if (ok && gg_o != Py_None) {
        npy_intp gdims[2] = {-1, n};
        gga = sl_py_check_array(gg_o, "group_grads", NPY_FLOAT32, 2, gdims, 1);
        ok = gga != NULL;
    }
    sl_train_state st = {PyArray_DATA(pa), PyArray_DATA(ga), PyArray_DATA(ma), PyArray_DATA(va), n,
                         PyArray_DATA(da), PyArray_DIM(da, 0), gga ? PyArray_DATA(gga) : NULL,
                         gga ? 1 + PyArray_DIM(gga, 0) : 1, precision, NULL};
    sl_train_batch b = {bdims[0], bdims[1], PyArray_DATA(ids), PyArray_DATA(tg), ks ? PyArray_DATA(ks) : NULL,
                        keep_first};
    if (ok && precision == SL_PREC_BF16 && !h->train_packed.bf16 &&
        sl_packed_cache_init(&h->train_packed, m->n_layers) != SL_OK) {
        PyErr_NoMemory();
        ok = 0;
    }
    st.panels = precision == SL_PREC_BF16 ? &h->train_packed : NULL;
    train_call c = {m, &pg, &st, &b, &hp, 0.0, 0.0};
    ok = ok && sl_py_call(run_train_step, &c, 1) == 0;
    PyMem_Free(lg);
    if (!ok) return NULL;
    return Py_BuildValue("(dd)", c.loss, c.norm);
}

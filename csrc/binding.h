/* What the binding's files (binding.c, build_info.c, binding_train.c, binding_testing.c) share:
 * CPython and the NumPy C API (one API table, imported by binding.c, which defines
 * SL_BINDING_MAIN), array checks, the model handle and the one call skeleton. Only the binding
 * includes this; the core never sees a Python object. */
#ifndef SL_BINDING_H
#define SL_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL sinklab_ARRAY_API
#ifndef SL_BINDING_MAIN
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "grad.h"
#include "model.h"

/* Checks that obj is a C-contiguous, aligned ndarray of dtype `type` with `ndim` dims; dims[i]
 * >= 0 must match exactly, -1 accepts any size. Never copies: a silent copy of an output buffer
 * would lose what the core writes, and of a weight would double memory. NULL with an exception
 * set on a mismatch. */
PyArrayObject *sl_py_check_array(PyObject *obj, const char *name, int type, int ndim, const npy_intp *dims,
                                 int writable);

/* The handle owns the C structs and a reference to every weight array they point into. */
typedef struct {
    sl_model model;
    sl_layer_weights *layers;
    PyObject *keep;     /* list of the arrays */
    sl_ws_cache cache;  /* the forward's activations, kept between calls (model.h) */
    sl_packed_cache packed; /* bf16 weight panels, built at their first bf16 use (model.h) */
    sl_packed_cache train_packed; /* a bf16 training step's panels, repacked in place every step
                                     (allocated at the first one; zeroed: none yet) */
} sl_py_model;

/* The handle inside a "sinklab.model" capsule, or NULL with an exception set. */
sl_py_model *sl_py_model_of(PyObject *capsule);

/* The one skeleton of every call into the core: fn(arg) runs with the GIL released inside a
 * call context of its own (sl_ctx: this call's thread count and error message) and, when
 * interruptible, under the Ctrl-C guard (interrupt.h). Returns 0, or -1 with the core's status
 * raised as a Python exception (KeyboardInterrupt, MemoryError, RuntimeError, ValueError). */
typedef int (*sl_py_core_fn)(void *arg);
int sl_py_call(sl_py_core_fn fn, void *arg, int interruptible);

/* pg (its layers lg, n_layers entries) pointing at grads[key] for every tensor of the schema m
 * has, each checked to be a writable float32 array of the weight's shape; every entry of grads
 * must be used. 0 with an exception set on any problem. */
int sl_py_parse_grads(const sl_model *m, PyObject *grads, sl_model_grads *pg, sl_layer_grads *lg);

/* The entry points of the other binding files, for the module table in binding.c. */
PyObject *sl_py_build_info(PyObject *self, PyObject *noargs);
PyObject *sl_py_train_buffers(PyObject *self, PyObject *args);
PyObject *sl_py_train_step(PyObject *self, PyObject *args, PyObject *kw);
PyObject *sl_py_team_size(PyObject *self, PyObject *noargs);
PyObject *sl_py_interrupt_check_gaps(PyObject *self, PyObject *noargs);
/* int8 linear layers, test and benchmark entries (binding_testing.c) */
PyObject *sl_py_int8_prepack(PyObject *self, PyObject *args);
PyObject *sl_py_linear_int8(PyObject *self, PyObject *args, PyObject *kw);
PyObject *sl_py_int8_quantize(PyObject *self, PyObject *arg);
PyObject *sl_py_int8_weight_unpack(PyObject *self, PyObject *capsule);
PyObject *sl_py_int8_info(PyObject *self, PyObject *noargs);
PyObject *sl_py_int8_force_kernel(PyObject *self, PyObject *arg);
PyObject *sl_py_int8_peak(PyObject *self, PyObject *args);
PyObject *sl_py_linear_int8_shared(PyObject *self, PyObject *args);
PyObject *sl_py_linear_shared(PyObject *self, PyObject *args);
PyObject *sl_py_int8_usable(PyObject *self, PyObject *args);
PyObject *sl_py_bf16_round(PyObject *self, PyObject *args, PyObject *kw);
PyObject *sl_py_bf16_linear(PyObject *self, PyObject *args, PyObject *kw);
PyObject *sl_py_bf16_linear_tn(PyObject *self, PyObject *args, PyObject *kw);
PyObject *sl_py_bf16_path(PyObject *self, PyObject *arg);
PyObject *sl_py_bf16_peak(PyObject *self, PyObject *arg);
/* attention variants and the attention gate, test entries (binding_testing.c) */
PyObject *sl_py_attention(PyObject *self, PyObject *args, PyObject *kw);
PyObject *sl_py_attn_gate(PyObject *self, PyObject *args, PyObject *kw);

#endif

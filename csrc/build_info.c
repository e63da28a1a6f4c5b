/* build_info(): facts fixed when the extension was compiled (the compiler's own macros, the
 * flags and NumPy setup.py passed in) and those read from the machine now (CPU features, the
 * OpenMP runtime, the NumPy loaded). sinklab.build_info() assembles the public dict from this
 * one. */
#include "binding.h"

#include "cpu.h"
#include "sl_common.h"

#if SL_HAVE_OPENMP
#include <omp.h>
#endif

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
        {"avx512_bf16", sl_cpu_has_avx512_bf16()},        {"avx512_vnni", sl_cpu_has_avx512_vnni()},
        {"amx_bf16", sl_cpu_has_amx_bf16()},              {"amx_int8", sl_cpu_has_amx_int8()},
    };
    for (size_t i = 0; i < sizeof feats / sizeof feats[0]; i++)
        if (dict_set(d, feats[i].name, PyBool_FromLong(feats[i].on)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
#endif
    return d;
}

PyObject *sl_py_build_info(PyObject *self, PyObject *noargs) {
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

/* Shared definitions of the sinklab C core: status codes, error reporting, checked sizes.
 * The core never sees a PyObject; every function returns SL_OK or an error code and leaves a
 * message in a thread-local buffer that the binding turns into a Python exception. */
#ifndef SL_COMMON_H
#define SL_COMMON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    SL_OK = 0,
    SL_ERR_VALUE = 1,   /* bad argument: maps to ValueError */
    SL_ERR_MEMORY = 2,  /* allocation failed or size overflow: MemoryError */
    SL_ERR_FORMAT = 3,  /* corrupt or unsupported data: ValueError */
    SL_ERR_INTERNAL = 4 /* should not happen: RuntimeError */
} sl_status;

/* Records a printf-style message for the current thread and returns code. */
int sl_fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *sl_last_error(void);

/* a*b into *out; returns 0 (and leaves *out untouched) on overflow or negative input. */
int sl_mul_size(int64_t a, int64_t b, int64_t *out);

/* Aligned allocation of n floats (64-byte aligned, zeroed); NULL on failure or overflow. */
float *sl_alloc_floats(int64_t n);
void sl_free(void *p);

#define SL_TRY(expr)                  \
    do {                              \
        int sl_rc_ = (expr);          \
        if (sl_rc_ != SL_OK) return sl_rc_; \
    } while (0)

#endif

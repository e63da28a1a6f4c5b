/* Error buffer and checked allocation shared by the core. */
#include "sl_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One process-wide buffer, not thread-local: a failure inside an OpenMP worker must reach the
 * binding, which reads it on the calling thread. Writes are serialised. */
static char sl_errbuf[512];

int sl_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
#pragma omp critical(sl_errbuf)
    vsnprintf(sl_errbuf, sizeof sl_errbuf, fmt, ap);
    va_end(ap);
    return code;
}

const char *sl_last_error(void) { return sl_errbuf[0] ? sl_errbuf : "unknown error in sinklab core"; }

int sl_mul_size(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

float *sl_alloc_floats(int64_t n) {
    int64_t bytes;
    if (n < 0 || !sl_mul_size(n, (int64_t)sizeof(float), &bytes)) return NULL;
    if (bytes == 0) bytes = 64;
    bytes = (bytes + 63) & ~(int64_t)63;
    if ((uint64_t)bytes > (uint64_t)SIZE_MAX) return NULL;
    void *p = aligned_alloc(64, (size_t)bytes);
    if (p) memset(p, 0, (size_t)bytes);
    return (float *)p;
}

void sl_free(void *p) { free(p); }

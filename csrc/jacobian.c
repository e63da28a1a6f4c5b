/* Norms of Jacobian blocks held as B rows per source position (see jacobian.h). Each block is
 * reduced by one thread in a fixed order, so results do not depend on the thread count. */
#include "jacobian.h"

#include <math.h>
#include <stdlib.h>

#include "sl_common.h"

void sl_block_sqnorms(const float *g, int64_t B, int64_t T, int64_t d, double *sq) {
#pragma omp parallel for schedule(static) if (B * T * d > 65536) num_threads(sl_num_threads())
    for (int64_t r = 0; r < B * T; r++) {
        const float *row = g + r * d;
        double s = 0.0;
        for (int64_t i = 0; i < d; i++) s += (double)row[i] * row[i];
        sq[r] = s;
    }
}

/* u = M v (B), w = M^T u (d), for the block of position t (rows at stride T*d). */
static void normal_matvec(const float *g, int64_t B, int64_t T, int64_t d, int64_t t, const double *v,
                          double *u, double *w) {
    for (int64_t i = 0; i < d; i++) w[i] = 0.0;
    for (int64_t b = 0; b < B; b++) {
        const float *row = g + (b * T + t) * d;
        double s = 0.0;
        for (int64_t i = 0; i < d; i++) s += row[i] * v[i];
        u[b] = s;
        for (int64_t i = 0; i < d; i++) w[i] += s * row[i];
    }
}

static double norm2(const double *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += x[i] * x[i];
    return sqrt(s);
}

/* Largest singular value of one block; *iters receives the steps taken. */
static double block_spectral(const float *g, int64_t B, int64_t T, int64_t d, int64_t t, double rtol,
                             int max_iter, double *v, double *u, double *w, int *iters) {
    int64_t best = 0;
    double best_sq = -1.0;
    for (int64_t b = 0; b < B; b++) {
        const float *row = g + (b * T + t) * d;
        double s = 0.0;
        for (int64_t i = 0; i < d; i++) s += (double)row[i] * row[i];
        if (s > best_sq) best_sq = s, best = b;
    }
    *iters = 0;
    if (best_sq <= 0.0) return 0.0;
    const float *start = g + (best * T + t) * d;
    const double n0 = sqrt(best_sq);
    for (int64_t i = 0; i < d; i++) v[i] = start[i] / n0;
    double sigma = 0.0;
    for (int k = 1; k <= max_iter; k++) {
        normal_matvec(g, B, T, d, t, v, u, w);
        /* ||M v||^2 = v^T M^T M v for unit v: the Rayleigh quotient, a lower bound on sigma^2. */
        const double est = norm2(u, B), wn = norm2(w, d);
        *iters = k;
        const int done = k > 1 && fabs(est - sigma) <= rtol * est;
        sigma = est;
        if (done || wn == 0.0) break;
        for (int64_t i = 0; i < d; i++) v[i] = w[i] / wn;
    }
    return sigma;
}

int sl_block_spectral(const float *g, int64_t B, int64_t T, int64_t d, double rtol, int max_iter,
                      double *spec) {
    int worst = 0, failed = 0;
#pragma omp parallel num_threads(sl_num_threads())
    {
        double *v = malloc(sizeof(double) * (size_t)(2 * d + B));
        if (!v) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1) reduction(max : worst)
        for (int64_t t = 0; t < T; t++) {
            if (!v) continue;
            int it = 0;
            spec[t] = block_spectral(g, B, T, d, t, rtol, max_iter, v, v + 2 * d, v + d, &it);
            if (it > worst) worst = it;
        }
        free(v);
    }
    if (failed) return -sl_fail(SL_ERR_MEMORY, "spectral norms: cannot allocate %lld doubles", (long long)(2 * d + B));
    return worst;
}

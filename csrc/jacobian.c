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

/* u = M v (B), w = M^T u (d), for the block of position t (rows at stride T*d), in one pass over
 * the rows: each row's dot product and its update of w while the row is in cache. Float lanes
 * (the block is float32), vectorised by the compiler. */
static void normal_matvec(const float *g, int64_t B, int64_t T, int64_t d, int64_t t, const float *v,
                          float *u, float *w) {
    for (int64_t i = 0; i < d; i++) w[i] = 0.0f;
    for (int64_t b = 0; b < B; b++) {
        const float *row = g + (b * T + t) * d;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < d; i++) s += row[i] * v[i];
        u[b] = s;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) w[i] += s * row[i];
    }
}

static double norm2(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

/* Largest eigenvalue of the symmetric tridiagonal matrix with diagonal a[0..n) and off-diagonal
 * b[0..n-1), by bisection on the Sturm count (the number of eigenvalues below x). */
static double tridiag_max_eig(const double *a, const double *b, int n) {
    double lo = a[0], hi = a[0];
    for (int i = 0; i < n; i++) { /* Gershgorin bounds */
        const double r = (i > 0 ? fabs(b[i - 1]) : 0.0) + (i < n - 1 ? fabs(b[i]) : 0.0);
        lo = fmin(lo, a[i] - r);
        hi = fmax(hi, a[i] + r);
    }
    for (int it = 0; it < 200 && hi - lo > 1e-15 * fmax(fabs(lo), fabs(hi)); it++) {
        const double x = 0.5 * (lo + hi);
        int below = 0;
        double q = 1.0;
        for (int i = 0; i < n; i++) {
            q = a[i] - x - (i > 0 ? b[i - 1] * b[i - 1] / q : 0.0);
            if (q == 0.0) q = -1e-300;
            below += q < 0.0;
        }
        if (below == n) hi = x; else lo = x;
    }
    return hi;
}

/* Largest singular value of one block: Lanczos on M^T M with full reorthogonalisation, from the
 * block's largest row, until the largest Ritz value (a lower bound on sigma^2 that increases to
 * it) changes by less than rtol relatively, the Krylov space is exhausted, or after max_iter
 * steps. Work: q (max_iter x d) Lanczos vectors, u (B), w (d), ab (2 max_iter doubles). */
static double block_spectral(const float *g, int64_t B, int64_t T, int64_t d, int64_t t, double rtol,
                             int max_iter, float *q, float *u, float *w, double *ab, int *iters) {
    double *alpha = ab, *beta = ab + max_iter;
    int64_t best = 0;
    double best_norm = -1.0;
    for (int64_t b = 0; b < B; b++) {
        const double s = norm2(g + (b * T + t) * d, d);
        if (s > best_norm) best_norm = s, best = b;
    }
    *iters = 0;
    if (best_norm <= 0.0) return 0.0;
    const float *start = g + (best * T + t) * d;
    for (int64_t i = 0; i < d; i++) q[i] = (float)(start[i] / best_norm);
    double theta = 0.0;
    for (int j = 0; j < max_iter; j++) {
        float *qj = q + (int64_t)j * d;
        normal_matvec(g, B, T, d, t, qj, u, w);
        double a = 0.0;
        for (int64_t i = 0; i < d; i++) a += (double)qj[i] * w[i];
        alpha[j] = a;
        /* Full reorthogonalisation against every earlier vector, twice ("twice is enough"). */
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k <= j; k++) {
                const float *qk = q + (int64_t)k * d;
                double c = 0.0;
                for (int64_t i = 0; i < d; i++) c += (double)qk[i] * w[i];
                for (int64_t i = 0; i < d; i++) w[i] -= (float)c * qk[i];
            }
        const double prev = theta;
        theta = tridiag_max_eig(alpha, beta, j + 1);
        *iters = j + 1;
        const double bn = norm2(w, d);
        if ((j > 0 && fabs(theta - prev) <= rtol * theta) || bn <= 1e-7 * sqrt(fabs(theta)) || j + 1 == max_iter ||
            j + 1 >= d)
            break;
        beta[j] = bn;
        float *next = q + (int64_t)(j + 1) * d;
        for (int64_t i = 0; i < d; i++) next[i] = (float)(w[i] / bn);
    }
    return sqrt(theta > 0.0 ? theta : 0.0);
}

int sl_block_spectral(const float *g, int64_t B, int64_t T, int64_t d, double rtol, int max_iter,
                      double *spec) {
    int worst = 0, failed = 0;
#pragma omp parallel num_threads(sl_num_threads())
    {
        /* Lanczos vectors, u, w; the tridiagonal's coefficients. */
        float *v = malloc(sizeof(float) * (size_t)((max_iter + 1) * d + B));
        double *ab = malloc(sizeof(double) * 2 * (size_t)max_iter);
        if (!v || !ab) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1) reduction(max : worst)
        for (int64_t t = 0; t < T; t++) {
            if (!v || !ab) continue;
            int it = 0;
            float *u = v + (int64_t)max_iter * d, *w = u + B;
            spec[t] = block_spectral(g, B, T, d, t, rtol, max_iter, v, u, w, ab, &it);
            if (it > worst) worst = it;
        }
        free(v);
        free(ab);
    }
    if (failed) return -sl_fail(SL_ERR_MEMORY, "spectral norms: cannot allocate %lld floats",
                             (long long)((max_iter + 1) * d + B));
    return worst;
}

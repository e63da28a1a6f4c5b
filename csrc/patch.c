/* The patch table: checks and the copy or add into a packed activation. Serial: a patch touches
 * a few rows, small beside the products around it, and a fixed order keeps the bits the same
 * for any thread count. */
#include "patch.h"

#include <string.h>

#include "sl_common.h"

static const char *point_name(int point) {
    static const char *names[SL_PATCH_N_POINTS] = {"resid", "attn_out", "mlp_out", "head_out", "z",
                                                   "q", "k", "v", "pattern"};
    return point >= 0 && point < SL_PATCH_N_POINTS ? names[point] : "?";
}

int64_t sl_patch_width(int point, int64_t d, int64_t hd, int64_t T) {
    switch (point) {
    case SL_PATCH_RESID: case SL_PATCH_ATTN_OUT: case SL_PATCH_MLP_OUT: case SL_PATCH_HEAD_OUT: return d;
    case SL_PATCH_PATTERN: return T;
    default: return hd;
    }
}

int64_t sl_patch_n_heads(int point, int64_t H, int64_t G) {
    switch (point) {
    case SL_PATCH_RESID: case SL_PATCH_ATTN_OUT: case SL_PATCH_MLP_OUT: return 0;
    case SL_PATCH_K: case SL_PATCH_V: return G;
    default: return H;
    }
}

static int check_indices(const int64_t *idx, int64_t n, int64_t hi, int64_t which, const char *what) {
    if (n <= 0 || !idx) return sl_fail(SL_ERR_VALUE, "patch %lld: no %s selected", (long long)which, what);
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= hi)
            return sl_fail(SL_ERR_VALUE, "patch %lld: %s %lld outside [0, %lld)", (long long)which, what,
                           (long long)idx[i], (long long)hi);
    return SL_OK;
}

static int check_one(const sl_patch *p, int64_t i, int64_t L, int64_t H, int64_t G, int64_t d, int64_t hd,
                     int64_t B, int64_t T, const uint8_t *mask_first, const uint8_t *zero_first_value) {
    if (p->point < 0 || p->point >= SL_PATCH_N_POINTS)
        return sl_fail(SL_ERR_VALUE, "patch %lld: unknown point %d", (long long)i, p->point);
    if (p->mode != SL_PATCH_REPLACE && p->mode != SL_PATCH_ADD)
        return sl_fail(SL_ERR_VALUE, "patch %lld: mode %d is neither replace (0) nor add (1)", (long long)i, p->mode);
    const int64_t top = p->point == SL_PATCH_RESID ? L : L - 1;
    if (p->layer < 0 || p->layer > top)
        return sl_fail(SL_ERR_VALUE, "patch %lld (%s): layer %lld outside [0, %lld]", (long long)i,
                       point_name(p->point), (long long)p->layer, (long long)top);
    SL_TRY(check_indices(p->rows, p->n_rows, B, i, "batch row"));
    SL_TRY(check_indices(p->pos, p->n_pos, T, i, "position"));
    const int64_t nh = sl_patch_n_heads(p->point, H, G);
    if (nh == 0 && (p->n_heads != 1 || p->heads))
        return sl_fail(SL_ERR_VALUE, "patch %lld (%s): the stream points take no heads", (long long)i,
                       point_name(p->point));
    if (nh > 0) SL_TRY(check_indices(p->heads, p->n_heads, nh, i, "head"));
    int64_t n;
    if (!sl_mul_size(p->n_rows, p->n_heads, &n) || !sl_mul_size(n, p->n_pos, &n) ||
        !sl_mul_size(n, sl_patch_width(p->point, d, hd, T), &n))
        return sl_fail(SL_ERR_VALUE, "patch %lld: size overflow", (long long)i);
    if (!p->value || n != p->n_value)
        return sl_fail(SL_ERR_VALUE, "patch %lld (%s): value holds %lld floats, the selection needs %lld",
                       (long long)i, point_name(p->point), (long long)p->n_value, (long long)n);
    for (int64_t j = 0; p->point == SL_PATCH_PATTERN && j < p->n_heads; j++) {
        const int64_t at = p->layer * H + p->heads[j];
        if ((mask_first && mask_first[at]) || (zero_first_value && zero_first_value[at]))
            return sl_fail(SL_ERR_VALUE,
                           "patch %lld: a pattern patch on layer %lld head %lld, which also has mask_first or "
                           "zero_first_value; patch the pattern or intervene, not both",
                           (long long)i, (long long)p->layer, (long long)p->heads[j]);
    }
    return SL_OK;
}

int sl_patch_check(const sl_patch_table *pt, int64_t L, int64_t H, int64_t G, int64_t d, int64_t hd, int64_t B,
                   int64_t T, const uint8_t *mask_first, const uint8_t *zero_first_value) {
    if (!pt || pt->n == 0) return SL_OK;
    if (pt->n < 0 || !pt->p) return sl_fail(SL_ERR_VALUE, "patch: malformed table (%lld patches)", (long long)pt->n);
    for (int64_t i = 0; i < pt->n; i++)
        SL_TRY(check_one(&pt->p[i], i, L, H, G, d, hd, B, T, mask_first, zero_first_value));
    return SL_OK;
}

int sl_patch_any(const sl_patch_table *pt, int point, int64_t layer) {
    for (int64_t i = 0; pt && i < pt->n; i++)
        if (pt->p[i].point == point && pt->p[i].layer == layer) return 1;
    return 0;
}

static void put(float *dst, const float *src, int64_t n, int mode, int adjacent) {
    const int64_t half = n / 2;
    for (int64_t i = 0; i < n; i++) {
        /* rotate-half index i lands on 2i (first half) or 2(i - half) + 1 (second half) */
        const int64_t o = !adjacent ? i : i < half ? 2 * i : 2 * (i - half) + 1;
        dst[o] = mode == SL_PATCH_ADD ? dst[o] + src[i] : src[i];
    }
}

void sl_patch_apply(const sl_patch_table *pt, int point, int64_t layer, int64_t width, const sl_patch_target *t) {
    for (int64_t n = 0; pt && n < pt->n; n++) {
        const sl_patch *p = &pt->p[n];
        if (p->point != point || p->layer != layer) continue;
        for (int64_t i = 0; i < p->n_rows; i++) {
            const int64_t b = p->rows[i];
            for (int64_t j = 0; j < p->n_heads; j++) {
                const int64_t h = p->heads ? p->heads[j] : 0;
                for (int64_t k = 0; k < p->n_pos; k++) {
                    const int64_t pos = p->pos[k];
                    if (pos >= t->len[b]) continue;
                    float *dst = t->data + (t->off[b] + pos) * t->stride + h * width;
                    put(dst, sl_patch_entry(p, i, j, k, width), width, p->mode, t->adjacent);
                }
            }
        }
    }
}

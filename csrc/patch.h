/* Activation patching: a table of arrays that replace, or are added to, activations of the
 * forward at its capture points, for chosen layers, batch rows, positions and heads. The forward
 * (model.c) applies each one right after computing the activation and before anything reads or
 * captures it, so captures show the patched value. */
#ifndef SL_PATCH_H
#define SL_PATCH_H

#include <stdint.h>

/* The points, in the capture names' order of sinklab.patching.POINTS. */
typedef enum {
    SL_PATCH_RESID,    /* (T, d) the stream entering layer `layer` (layer n_layers: before the final norm) */
    SL_PATCH_ATTN_OUT, /* (T, d) what the attention block adds to the stream */
    SL_PATCH_MLP_OUT,  /* (T, d) what the MLP adds */
    SL_PATCH_HEAD_OUT, /* (H, T, d) head h's share of the W_O product, z_h W_O[:, h]ᵀ */
    SL_PATCH_Z,        /* (H, T, hd) each head's attention output, what W_O reads */
    SL_PATCH_Q,        /* (H, T, hd) queries after RoPE, rotate-half layout */
    SL_PATCH_K,        /* (G, T, hd) keys after RoPE, rotate-half layout */
    SL_PATCH_V,        /* (G, T, hd) values */
    SL_PATCH_PATTERN,  /* (H, T, T) attention probabilities of query rows */
    SL_PATCH_N_POINTS
} sl_patch_point;

enum { SL_PATCH_REPLACE = 0, SL_PATCH_ADD = 1 };

/* One patch: value is (n_rows, n_heads, n_pos, width) floats (n_heads 1 and heads NULL for the
 * stream points resid, attn_out, mlp_out), entry [i, j, k] going to batch row rows[i], head
 * heads[j], position pos[k]; width is sl_patch_width. Positions at or after a sequence's length
 * (padding, never computed) are skipped. */
typedef struct {
    int point, mode;
    int64_t layer;
    int64_t n_rows, n_heads, n_pos;
    const int64_t *rows, *heads, *pos;
    const float *value;
    int64_t n_value; /* floats value holds: checked against the sizes above */
} sl_patch;

typedef struct {
    const sl_patch *p;
    int64_t n;
} sl_patch_table;

/* Floats per (head, position) entry of a point: d, hd, or T keys for the pattern. */
int64_t sl_patch_width(int point, int64_t d, int64_t hd, int64_t T);

/* The heads a head-indexed point has (H, or G for k and v), 0 for the stream points. */
int64_t sl_patch_n_heads(int point, int64_t H, int64_t G);

/* Checks every patch against a model of L layers (H query heads, G kv heads, width d, head
 * dimension hd) run on B sequences of T positions: point and mode known, layer in range (resid:
 * [0, L]), every index in range, value's size that of the indices; a pattern patch's head must
 * not also carry mask_first or zero_first_value (both NULL or (L, H)), whose effect on V the
 * patched probabilities would silently bypass. */
int sl_patch_check(const sl_patch_table *pt, int64_t L, int64_t H, int64_t G, int64_t d, int64_t hd, int64_t B,
                   int64_t T, const uint8_t *mask_first, const uint8_t *zero_first_value);

/* Whether the table patches `point` at `layer` (pt may be NULL). */
int sl_patch_any(const sl_patch_table *pt, int point, int64_t layer);

/* A packed activation of the forward: sequence b's position t, head h, at
 * data + (off[b] + t) * stride + h * hd_or_width, len[b] real positions. `adjacent`: q/k rows are
 * in llama.cpp's interleaved-pair RoPE layout, so a value in rotate-half layout is scattered back
 * (i -> 2i, i + hd/2 -> 2i + 1). */
typedef struct {
    float *data;
    int64_t stride;
    const int64_t *off, *len;
    int adjacent;
} sl_patch_target;

/* Applies every patch of (point, layer) to t, in table order (a later patch sees an earlier
 * one's result). Not for head_out and pattern, which model.c applies (they are not a copy). */
void sl_patch_apply(const sl_patch_table *pt, int point, int64_t layer, int64_t width, const sl_patch_target *t);

/* The value entry of patch p for its i-th row, j-th head, k-th position (width floats). */
static inline const float *sl_patch_entry(const sl_patch *p, int64_t i, int64_t j, int64_t k, int64_t width) {
    return p->value + ((i * p->n_heads + j) * p->n_pos + k) * width;
}

#endif

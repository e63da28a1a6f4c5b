/* Causal multi-head attention with grouped-query heads, optional capture of probabilities. */
#ifndef SL_ATTENTION_H
#define SL_ATTENTION_H

#include <stdint.h>

typedef struct {
    int64_t T, n_heads, n_kv_heads, head_dim;
    float scale; /* applied to q·k before softmax; 1/sqrt(head_dim) for LLaMA */
} sl_attn_shape;

/* q: (T, n_heads*head_dim) row stride q_stride; k, v: (T, n_kv_heads*head_dim) row stride
 * kv_stride. out: (T, n_heads*head_dim) dense. probs: NULL or (n_heads, T, T), filled with the
 * full causal probability matrix (zeros above the diagonal). Query head h reads kv head
 * h / (n_heads / n_kv_heads), as in Hugging Face's repeat_kv. */
int sl_attention_forward(const sl_attn_shape *s, const float *q, int64_t q_stride, const float *k,
                         const float *v, int64_t kv_stride, float *out, float *probs);

#endif

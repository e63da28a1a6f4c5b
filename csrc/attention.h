/* Multi-head attention with grouped-query heads (causal, sliding-window or bidirectional, with
 * optional soft-capping of the scores), optional capture of probabilities, per-head streaming
 * statistics, and the paper's interventions on the first token. */
#ifndef SL_ATTENTION_H
#define SL_ATTENTION_H

#include <stdint.h>

typedef struct {
    int64_t T, n_heads, n_kv_heads, head_dim;
    float scale; /* applied to q·k before softmax; 1/sqrt(head_dim) for LLaMA */
    /* Which keys query i sees, and how scores are shaped; zero-initialised means LLaMA's causal
     * attention without capping:
     *   bidirectional != 0: every key 0..T-1 (encoders such as BERT); window is then ignored;
     *   window > 0: causal keys j with i - window < j <= i only (sliding-window attention as
     *     Hugging Face's Mistral/Gemma masks define it: `window` keys including i itself);
     *   softcap > 0: each scaled score s becomes softcap * tanh(s / softcap) before the
     *     softmax (Gemma 2's attention-logit soft-capping).
     * A window < 0 (when not bidirectional) or a softcap < 0 or not finite is an error
     * (SL_ERR_VALUE). Keys a query does not see get probability exactly 0. A window skips the
     * key blocks no query of a block can see, so it costs O(T·window) rather than O(T²). */
    int bidirectional;
    int64_t window;
    float softcap;
    /* The normaliser of the probabilities (SL_ATTN_*; 0, zero-initialised, is the softmax). With
     * a sink logit s_h for query head h the probabilities of the keys j that query i sees are
     *   p_ij = exp(z_ij) / (exp(s_h) + sum_{j' visible} exp(z_ij'))
     * (z the scaled, possibly capped score; s_h is neither scaled nor capped): the sink absorbs
     * mass but contributes no value, so a row sums to 1 - p_i,sink < 1 and probabilities, captures
     * and statistics are those of the real keys. SL_ATTN_SINK_LOGIT reads s_h from sinks (n_heads
     * finite floats: gpt-oss's learned "attention sinks"); SL_ATTN_SOFTMAX1 fixes s_h = 0 (Miller's
     * softmax-plus-one, "off-by-one": exp(z) / (1 + sum exp(z)), no parameter). Computed with the
     * usual max-subtraction, the max taken over the visible scores and s_h, so a large s_h never
     * overflows. An unknown variant, or SL_ATTN_SINK_LOGIT without sinks or with a non-finite one,
     * is an error (SL_ERR_VALUE). */
    int variant;
    const float *sinks;
} sl_attn_shape;

/* Values of sl_attn_shape.variant. Gated attention (Qiu et al. 2025) is not one: it multiplies the
 * output after the softmax attention (sl_attn_gate_forward below). */
enum { SL_ATTN_SOFTMAX = 0, SL_ATTN_SINK_LOGIT = 1, SL_ATTN_SOFTMAX1 = 2 };

/* Values of a zero_first_value entry. */
enum {
    SL_ZFV_NONE = 0,
    /* Queries i >= 1 take v_0 as zero; query 0 keeps its own value. Row 0 of the output (and,
     * the model being causal, position 0's whole residual stream) is bitwise that of the
     * un-intervened run, and this layer's attention probabilities are unchanged: position 0
     * stays a sink but what is read from it is nothing (the paper's reading of the sink as a
     * no-op, its §3.2-3.3). */
    SL_ZFV_OTHERS = 1,
    /* Every query, query 0 included, takes v_0 as zero, so position 0 also loses its own
     * attention update; on SmolLM2 this changes ⟨bos⟩'s residual stream so much that the sink
     * disappears from the later layers. */
    SL_ZFV_ALL = 2,
    /* Queries i >= 1 that see key 0 read v_0 as the mean of the values of the other keys they
     * see (keys 1..i when causal; [lo, hi] in general, key 0 excluded); query 0 keeps its own
     * value, and the probabilities are unchanged. The sink stays where it is, but what it
     * passes on is an average value: the mean-ablation control of its content. */
    SL_ZFV_MEAN = 3
};

/* Interventions, each an array over the n_heads query heads or NULL for none. */
typedef struct {
    const uint8_t *mask_first;       /* nonzero: queries i >= 1 may not attend to key 0
                                        (renormalised over their other keys); query 0 is left as
                                        is in every mode: causally it has no other key, and with
                                        bidirectional attention keeping it makes the intervention
                                        mean the same ("later positions cannot read position 0")
                                        and leaves row 0 unchanged. With a window, a query whose
                                        window already excludes key 0 is unaffected. */
    const uint8_t *zero_first_value; /* SL_ZFV_NONE, SL_ZFV_OTHERS, SL_ZFV_ALL or SL_ZFV_MEAN; any
                                        other value is an error (SL_ERR_VALUE) */
    const float *head_scale;         /* multiplies the head's output (before W_O) */
    /* A packing mask (the paper's §5 training strategies), not an intervention on a head, but
     * applied the same way in the forward, the probabilities, the backward and the JVP:
     * key_start NULL or (T) entries, query i then sees only keys j >= key_start[i] of its own
     * document (intra-document masking; 0 <= key_start[i] <= i, nondecreasing in i); with
     * keep_first = k > 0 the first k keys [0, k) stay visible to every query as well, whatever
     * hides them (a document start, the window): a fixed ⟨bos⟩ that every document may read,
     * StreamingLLM's sink tokens beside a sliding window. Under a window (no key_start) they are
     * computed as k separate key columns, so the cost stays O(T·(window + k)). mask_first, when
     * also set for a head, removes key 0 all the same; SL_ZFV_MEAN takes k <= 1. */
    const int64_t *key_start;
    int keep_first;
} sl_attn_intervention;

/* Streaming statistics, each NULL or (n_heads, T); computed from each block of probabilities
 * as it is produced, so no (T, T) buffer is needed. */
typedef struct {
    float *importance; /* a_k = mean over queries i >= k of A[i, k] (Gu et al.); with a window
                          the same mean, queries that cannot see k counting as 0; with
                          bidirectional attention, the mean over every query i (all see k) */
    float *to_first;   /* A[i, 0] for every query i (0 where i cannot see key 0) */
    float *entropy;    /* -sum_k A[i, k] log A[i, k] in nats, for every query i */
} sl_attn_stats;

/* q: (T, n_heads*head_dim) row stride q_stride; k, v: (T, n_kv_heads*head_dim) row stride
 * kv_stride. out: (T, n_heads*head_dim) dense. probs: NULL or (n_heads, T, T), filled with the
 * whole probability matrix (zeros where a query does not see a key: above the diagonal when
 * causal, outside the window; bidirectional rows are full). Query head h reads kv head
 * h / (n_heads / n_kv_heads), as in Hugging Face's repeat_kv. iv and st may be NULL. */
int sl_attention_forward(const sl_attn_shape *s, const float *q, int64_t q_stride, const float *k,
                         const float *v, int64_t kv_stride, float *out, float *probs,
                         const sl_attn_intervention *iv, const sl_attn_stats *st);

/* A batch of B sequences packed row after row in q, k, v and out: sequence b has len[b] rows
 * starting at packed row off[b] (off has B+1 entries, off[B] the total), positions restart at 0
 * for each. Captures are per sequence, laid out for T_pad >= max(len) positions: probs[b] NULL or
 * (H, T_pad, T_pad), importance/to_first/entropy[b] NULL or (H, T_pad); entries at positions
 * >= len[b] (rows and columns) are written as zeros. Each list may itself be NULL. Every result
 * is bitwise what sl_attention_forward gives for that sequence alone. */
typedef struct {
    int64_t B, T_pad;
    const int64_t *off, *len;
    float **probs, **importance, **to_first, **entropy;
    /* Scratch the caller provides, sized by sl_attn_batch_floats: */
    float *vt;          /* sizes[0] floats */
    double *partial;    /* sizes[1] floats (as doubles), only with importance */
    float *scratch;     /* sizes[2] floats: one block of scores per thread */
    int64_t *task_off;  /* B+1 entries */
    int64_t *part_off;  /* B entries */
    /* NULL, or work on each packed row [0, off[B]) of q and k that the attention's own parallel
     * region does before anything reads them, each row by one thread: the forward's RoPE, which
     * then needs no region of its own. */
    void (*prologue)(void *arg, int64_t row);
    void *prologue_arg;
} sl_attn_batch;

/* Floats of the three scratch buffers (sizes[0..2]) for n_threads threads; returns their sum.
 * Reads B, T_pad, off, len and whether importance is asked. */
int64_t sl_attn_batch_floats(const sl_attn_shape *s, const sl_attn_batch *bt, int n_threads, int64_t sizes[3]);

/* The most floats sl_attn_batch_floats asks per packed row (Vᵀ and, with importance, the
 * partials of SL_ATTN_SEGMENTS query segments per head, as doubles); reads the head counts and
 * head_dim of s. */
int64_t sl_attn_row_floats(const sl_attn_shape *s);

/* The whole batch in one parallel region: Vᵀ, then (sequence, head, query segment) tasks, then
 * each (sequence, head)'s importance sums and padding zeros. s->T is not read. With a head under
 * SL_ZFV_MEAN the call allocates the values' prefix sums itself (rows * G*hd doubles). */
int sl_attention_forward_batch(const sl_attn_shape *s, const sl_attn_batch *bt, const float *q,
                               int64_t q_stride, const float *k, const float *v, int64_t kv_stride,
                               float *out, const sl_attn_intervention *iv);

/* Derivatives. q, k, v are the forward's dense tensors after RoPE: (T, H*hd), (T, G*hd),
 * (T, G*hd); cotangents and tangents hold B directions for that one sequence, (B*T, ·) dense.
 * Interventions are differentiated as applied: a masked key has zero probability and zero
 * gradient, a zeroed value contributes nothing and receives no gradient from the rows that read
 * it as zero, a value replaced by a mean (SL_ZFV_MEAN) passes its gradient on to the values it
 * averages, head_scale multiplies the head's derivative. */

/* probs (H, T, T): every head's probabilities (zeros for keys a query does not see), bitwise as
 * the forward computes them. */
int sl_attention_probs(const sl_attn_shape *s, const float *q, const float *k, float *probs,
                       const sl_attn_intervention *iv);

/* With a softcap, the score's derivative by q·k is scale·(1 - tanh²(s/softcap)) (s the scaled
 * score); both derivatives recompute those products per block, exactly as the forward did. */

/* Reverse mode: from dout, the gradient of the attention output (what W_O reads), the gradients
 * dq (B*T, H*hd), dk, dv (B*T, G*hd), all overwritten. Tasks are (b, query head), each summing
 * its head's dk, dv over query blocks in order; with grouped heads (G < H) they go to the
 * per-head partials pk, pv (B*T, H*hd each, scratch) and are then summed over each group in head
 * order, so results do not depend on the thread count (pk, pv may be NULL when G == H). */
int sl_attention_backward(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                          const float *probs, const float *dout, float *dq, float *dk, float *dv, float *pk,
                          float *pv, const sl_attn_intervention *iv);

/* Forward mode: the output tangent tout (B*T, H*hd) from the tangents of q, k (after RoPE) and v. */
int sl_attention_jvp(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                     const float *probs, const float *tq, const float *tk, const float *tv, float *tout,
                     const sl_attn_intervention *iv);

/* With a sink logit (s->variant != SL_ATTN_SOFTMAX) the same formulas hold for the real keys, the
 * rows of probs summing to 1 - p_sink (the sink has no value, so its dP is 0):
 *   dz_ij = p_ij (dP_ij - sum_j' p_ij' dP_ij'),  ds_h = -sum_i p_i,sink sum_j p_ij dP_ij
 * and forward, the sink's tangent ts_h enters each row's mean: dp_ij = p_ij (dz_ij - sum_j' p_ij'
 * dz_ij' - p_i,sink ts_h), p_i,sink = 1 - sum_j p_ij (in double). The two calls below are
 * sl_attention_backward / sl_attention_jvp with the sink's own derivative: dsinks NULL or (B, H),
 * overwritten with ds_h for each direction (also for SL_ATTN_SOFTMAX1, whose s_h = 0 is fixed:
 * what a parameter there would get); tsinks NULL (no tangent) or (B, H). Each (b, h)'s ds_h is
 * summed over its queries in order, so it is the same for any thread count. */
int sl_attention_backward_sink(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                               const float *probs, const float *dout, float *dq, float *dk, float *dv, float *pk,
                               float *pv, const sl_attn_intervention *iv, float *dsinks);
int sl_attention_jvp_sink(const sl_attn_shape *s, int64_t B, const float *q, const float *k, const float *v,
                          const float *probs, const float *tq, const float *tk, const float *tv, const float *tsinks,
                          float *tout, const sl_attn_intervention *iv);

/* Gated attention (Qiu et al. 2025, "Gated Attention for LLMs", the elementwise gate on the SDPA
 * output, their G1): z'_h = z_h ⊙ sigmoid(g_h) with g = a W_gᵀ, a the layer's normed input (what
 * W_q reads) and W_g (n_heads*head_dim, d_model) per layer, no bias; W_O then reads z'. These are
 * the elementwise part, over n entries; the product a W_gᵀ is the model's (model.c, grad.c).
 * Forward: zg = z ⊙ sigmoid(g) (zg may be z). Reverse, for n = B*period entries of directions over
 * one (period,) tape of z and g: dz = dzg ⊙ sigmoid(g), dg = dzg ⊙ z ⊙ sigmoid(g)(1 - sigmoid(g))
 * (dz may be dzg). Forward mode: tzg = tz ⊙ sigmoid(g) + z ⊙ sigmoid'(g) ⊙ tg (tzg may be tz; tg
 * NULL: no gate tangent). sigmoid(g) = 1 / (1 + exp(-g)): exact 0 or 1 at large |g|, never NaN. */
void sl_attn_gate_forward(float *zg, const float *z, const float *g, int64_t n);
void sl_attn_gate_backward(float *dz, float *dg, const float *dzg, const float *z, const float *g, int64_t n,
                           int64_t period);
void sl_attn_gate_jvp(float *tzg, const float *tz, const float *tg, const float *z, const float *g, int64_t n,
                      int64_t period);

#endif

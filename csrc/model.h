/* The transformer forward pass (every supported family) with capture of what the paper measures. */
#ifndef SL_MODEL_H
#define SL_MODEL_H

#include <stdatomic.h>
#include <stdint.h>

#include "attention.h"
#include "ops.h"
#include "patch.h"
#include "sgemm.h"

/* The architecture is data: one block structure covers the LLaMA, Mistral, Qwen2/3, Gemma 1-3,
 * GPT-2 and BERT families, each feature switched on by a descriptor field or by an optional
 * tensor being present (NULL when absent). Layer l, with every optional piece shown:
 *
 *   a = norm(x; attn_norm)                     (skipped when attn_norm is NULL: BERT)
 *   q = Wq a + bq,  k = Wk a + bk,  v = Wv a + bv
 *   q, k = rmsnorm per head (attn_q_norm, attn_k_norm)          (QK-norm: Qwen3, Gemma 3)
 *   q, k = rope(q, k; layer's inv_freq)        (when the model has rotary positions)
 *   z = attention(q, k, v; scale, softcap, window[l], bidirectional; attn_variant, attn_sinks)
 *   z = z ⊙ sigmoid(W_g a)                     (gated attention: attn_gate; attn_variant GATED)
 *   o = Wo z + bo;  o = norm(o; attn_post_norm)                 (Gemma 2/3)
 *   x = x + o;      x = norm(x; attn_res_norm)                  (post-LN: BERT)
 *   the MLP the same way: ffn_norm, [gate], up, act, down, ffn_post_norm, ffn_res_norm.
 *
 * Embedding: x = tok_embd[id] * embd_scale (+ pos_embd[t]) (+ type_embd[0]), then
 * norm(x; embd_norm) when present. Output: norm(x; out_norm) when present, logits = lm_head x,
 * then final_softcap. A norm is RMSNorm or LayerNorm (norm_kind) for every norm of the model
 * except the QK-norms, always RMSNorm; its weight is the multiplier itself (Gemma's 1 + w is
 * added when the file is read), its bias (LayerNorm only) may be NULL. */
typedef struct {
    const float *w, *b; /* (d) each; w NULL: no such norm; b NULL: no bias */
} sl_norm;

typedef struct {
    sl_norm attn_norm, attn_post_norm, attn_res_norm;
    sl_norm ffn_norm, ffn_post_norm, ffn_res_norm;
    const float *attn_q_norm, *attn_k_norm; /* (hd) each, or NULL */
    sl_weight wq, wk, wv, wo;               /* (H*hd, d), (G*hd, d), (G*hd, d), (d, H*hd) */
    const float *bq, *bk, *bv, *bo;         /* NULL or (H*hd), (G*hd), (G*hd), (d) */
    sl_weight w_gate, w_up, w_down;         /* (F, d), (F, d), (d, F); w_gate.data NULL: ungated */
    const float *b_gate, *b_up, *b_down;    /* NULL or (F), (F), (d) */
    const float *attn_sinks;                /* NULL or (H): learned sink logits s_h (SL_ATTN_SINK_LOGIT) */
    sl_weight attn_gate;                    /* (H*hd, d) gated attention's W_g; data NULL: ungated */
    const float *rope_inv_freq;             /* (hd/2): this layer's RoPE frequencies, or NULL */
    int64_t window;                         /* sliding-window length, 0: full attention */
} sl_layer_weights;

enum { SL_NORM_RMS = 0, SL_NORM_LAYER = 1 };

/* sl_model.attn_variant beyond the kernel's SL_ATTN_* (attention.h): softmax attention whose output
 * each layer gates elementwise, z ⊙ sigmoid(W_g a) (Qiu et al. 2025, G1). */
enum { SL_ATTN_GATED = 3 };

/* ---------------------------------------------------------------- the tensor schema
 * Every tensor the core reads, written once: the binding parses weights and gradient buffers
 * from these tables, checks training's flat views with them, and exports them to Python
 * (sinklab._core.tensor_schema(), read by sinklab.families.base); grad.h builds the gradient
 * structs from them. A row is
 *   X(grad, key, kind, weight, rows, cols, required, role)
 * grad: the field of sl_layer_grads / sl_model_grads; key: the canonical name (per-layer keys
 * are prefixed "blk.<l>."); kind: MATRIX (sl_weight: float32 or a file's quantized blocks),
 * VECTOR (const float *, (rows)) or TABLE (const float *, (any, cols): learned positions);
 * weight: the member of sl_layer_weights / sl_model; rows, cols: the shape (numpy order (out,
 * in)) in dimensions SL_DIM_<rows>, SL_DIM_<cols> (NONE: a vector); required: every model has
 * it; role: SL_ROLE_<role>, what the tensor is to Python. Rows are in the order the Python side
 * lays canonical tensors out (globals) and the gradient parser reads them (layers). */
#define SL_LAYER_TENSORS(X)                                                              \
    X(attn_norm, "attn_norm", VECTOR, attn_norm.w, D, NONE, 0, NORM)                     \
    X(attn_norm_b, "attn_norm_b", VECTOR, attn_norm.b, D, NONE, 0, NORM_BIAS)            \
    X(wq, "attn_q", MATRIX, wq, QD, D, 1, MATRIX)                                        \
    X(wk, "attn_k", MATRIX, wk, KVD, D, 1, MATRIX)                                       \
    X(wv, "attn_v", MATRIX, wv, KVD, D, 1, MATRIX)                                       \
    X(wo, "attn_output", MATRIX, wo, D, QD, 1, MATRIX)                                   \
    X(bq, "attn_q_b", VECTOR, bq, QD, NONE, 0, BIAS)                                     \
    X(bk, "attn_k_b", VECTOR, bk, KVD, NONE, 0, BIAS)                                    \
    X(bv, "attn_v_b", VECTOR, bv, KVD, NONE, 0, BIAS)                                    \
    X(bo, "attn_output_b", VECTOR, bo, D, NONE, 0, BIAS)                                 \
    X(attn_q_norm, "attn_q_norm", VECTOR, attn_q_norm, HD, NONE, 0, NORM)                \
    X(attn_k_norm, "attn_k_norm", VECTOR, attn_k_norm, HD, NONE, 0, NORM)                \
    X(attn_post_norm, "attn_post_norm", VECTOR, attn_post_norm.w, D, NONE, 0, NORM)      \
    X(attn_post_norm_b, "attn_post_norm_b", VECTOR, attn_post_norm.b, D, NONE, 0, NORM_BIAS) \
    X(attn_res_norm, "attn_res_norm", VECTOR, attn_res_norm.w, D, NONE, 0, NORM)         \
    X(attn_res_norm_b, "attn_res_norm_b", VECTOR, attn_res_norm.b, D, NONE, 0, NORM_BIAS) \
    X(ffn_norm, "ffn_norm", VECTOR, ffn_norm.w, D, NONE, 0, NORM)                        \
    X(ffn_norm_b, "ffn_norm_b", VECTOR, ffn_norm.b, D, NONE, 0, NORM_BIAS)               \
    X(w_gate, "ffn_gate", MATRIX, w_gate, F, D, 0, MATRIX)                               \
    X(w_up, "ffn_up", MATRIX, w_up, F, D, 1, MATRIX)                                     \
    X(w_down, "ffn_down", MATRIX, w_down, D, F, 1, MATRIX)                               \
    X(b_gate, "ffn_gate_b", VECTOR, b_gate, F, NONE, 0, BIAS)                            \
    X(b_up, "ffn_up_b", VECTOR, b_up, F, NONE, 0, BIAS)                                  \
    X(b_down, "ffn_down_b", VECTOR, b_down, D, NONE, 0, BIAS)                            \
    X(ffn_post_norm, "ffn_post_norm", VECTOR, ffn_post_norm.w, D, NONE, 0, NORM)         \
    X(ffn_post_norm_b, "ffn_post_norm_b", VECTOR, ffn_post_norm.b, D, NONE, 0, NORM_BIAS) \
    X(ffn_res_norm, "ffn_res_norm", VECTOR, ffn_res_norm.w, D, NONE, 0, NORM)            \
    X(ffn_res_norm_b, "ffn_res_norm_b", VECTOR, ffn_res_norm.b, D, NONE, 0, NORM_BIAS)            \
    X(attn_sinks, "attn_sinks", VECTOR, attn_sinks, H, NONE, 0, SINK)                    \
    X(attn_gate, "attn_gate", MATRIX, attn_gate, QD, D, 0, MATRIX)

#define SL_GLOBAL_TENSORS(X)                                                             \
    X(tok_embd, "tok_embd", MATRIX, tok_embd, V, D, 1, EMBEDDING)                        \
    X(pos_embd, "pos_embd", TABLE, pos_embd, NPOS, D, 0, EMBEDDING)                      \
    X(type_embd, "type_embd", VECTOR, type_embd, D, NONE, 0, EMBEDDING)                  \
    X(embd_norm, "embd_norm", VECTOR, embd_norm.w, D, NONE, 0, NORM)                     \
    X(embd_norm_b, "embd_norm_b", VECTOR, embd_norm.b, D, NONE, 0, NORM_BIAS)            \
    X(out_norm, "out_norm", VECTOR, out_norm.w, D, NONE, 0, NORM)                        \
    X(out_norm_b, "out_norm_b", VECTOR, out_norm.b, D, NONE, 0, NORM_BIAS)               \
    X(lm_head, "lm_head", MATRIX, lm_head, V, D, 0, HEAD)

/* The dimensions shapes are written in: d_model, n_heads*head_dim, n_kv_heads*head_dim,
 * head_dim, d_ff, vocab_size, n_pos, n_heads; NONE (size 1) is the missing second axis of a vector. */
typedef enum { SL_DIM_NONE, SL_DIM_D, SL_DIM_QD, SL_DIM_KVD, SL_DIM_HD, SL_DIM_F, SL_DIM_V, SL_DIM_NPOS,
               SL_DIM_H, SL_DIM_COUNT } sl_dim;
enum { SL_KIND_MATRIX, SL_KIND_VECTOR, SL_KIND_TABLE };
enum { SL_ROLE_EMBEDDING, SL_ROLE_HEAD, SL_ROLE_NORM, SL_ROLE_NORM_BIAS, SL_ROLE_MATRIX, SL_ROLE_BIAS, SL_ROLE_SINK };
/* Whether the model has a tensor of the given kind (its weight member w). */
#define SL_HAS_MATRIX(w) ((w).data != NULL)
#define SL_HAS_VECTOR(w) ((w) != NULL)
#define SL_HAS_TABLE(w) ((w) != NULL)
/* Axes of a tensor whose second dimension is cols: 1 for a vector, else 2. */
#define SL_NDIM(cols) (SL_DIM_##cols == SL_DIM_NONE ? 1 : 2)



/* The arithmetic of the forward's weight products (the linear layers and the LM head); attention's
 * QK and PV products, softmax, norms, the residual stream and every statistic stay fp32 at every
 * precision. FP32: sl_linear_nt, exact as it has always been. BF16: gemm_bf16.h (W in bf16
 * panels built at the weight's first bf16 product and kept in the model's sl_packed_cache, A
 * rounded to bf16, fp32 accumulation). INT8: gemm_int8.h (W as 8-bit integers with per-block
 * scales, its own quants where the format allows, packed at its first int8 product and kept in
 * the cache; A quantized per row in blocks of 32); a weight the int8 kernel cannot take (cols not
 * a multiple of 32) stays on the fp32 product. The one place that picks the kernel is
 * weight_product() in model.c. */
typedef enum { SL_PREC_FP32 = 0, SL_PREC_BF16 = 1, SL_PREC_INT8 = 2 } sl_precision;
const char *sl_precision_name(int precision);

/* A model's low-precision weight panels, one slot per weight product (SL_SLOTS_PER_LAYER per layer,
 * then the LM head), each NULL until its first use; a slot is filled once, by compare-and-swap, so
 * concurrent forwards may race to build a panel but only one is kept. */
enum { SL_SLOTS_PER_LAYER = 8 };
/* Layer l's weight products are slots l * SL_SLOTS_PER_LAYER + SL_SLOT_*; the LM head's is
 * n_layers * SL_SLOTS_PER_LAYER (sl_model_slot). */
enum { SL_SLOT_Q, SL_SLOT_K, SL_SLOT_V, SL_SLOT_O, SL_SLOT_GATE, SL_SLOT_UP, SL_SLOT_DOWN, SL_SLOT_AGATE };
typedef struct {
    int64_t n_slots;
    _Atomic(void *) *bf16;   /* sl_bf16_panels * */
    _Atomic(void *) *int8;   /* sl_int8_weight * */
    _Atomic(void *) *bf16_t; /* Wᵀ's bf16 panels in K blocks of SL_BF16_KBLOCK rows of W: the
                                backward's dX = dY·W at bf16 (training) */
} sl_packed_cache;
/* Allocates the (empty) slots for m; sl_packed_cache_clear frees every panel and the slots. */
int sl_packed_cache_init(sl_packed_cache *c, int64_t n_layers);
void sl_packed_cache_clear(sl_packed_cache *c);
/* Frees every panel and empties the slots (kept allocated): after the weights change (a training
 * step), so that the next low-precision product packs the new weights. Not while a call that reads
 * the cache runs on the model. */
void sl_packed_cache_invalidate(sl_packed_cache *c);
/* Bytes of the panels built so far. */
int64_t sl_packed_cache_bytes(sl_packed_cache *c);


typedef struct {
    int64_t n_layers, n_heads, n_kv_heads, d_model, head_dim, d_ff, vocab_size;
    float norm_eps;
    int norm_kind;       /* SL_NORM_RMS or SL_NORM_LAYER */
    int act;             /* SL_ACT_* (ops.h) */
    int rope_layout;     /* SL_ROPE_HALF_SPLIT or SL_ROPE_ADJACENT */
    int bidirectional;   /* 0: causal decoder; 1: encoder (every query sees every key) */
    float embd_scale;    /* multiplies the token embedding (Gemma: sqrt(d)); 1 for none */
    float attn_scale;    /* multiplies q·k; 1/sqrt(head_dim) unless the family overrides it */
    float attn_softcap;  /* 0: none */
    float final_softcap; /* 0: none */
    int attn_variant;    /* SL_ATTN_SOFTMAX, SL_ATTN_SINK_LOGIT (every layer has attn_sinks),
                            SL_ATTN_SOFTMAX1 (sink logit 0, no tensor) or SL_ATTN_GATED (softmax
                            attention, every layer has attn_gate); see attention.h */
    sl_weight tok_embd;             /* (V, d) */
    const float *pos_embd;          /* NULL or (n_pos, d): learned absolute positions */
    int64_t n_pos;
    const float *type_embd;         /* NULL or (d): the token-type embedding added to every token */
    sl_norm embd_norm, out_norm;
    sl_weight lm_head;              /* (V, d), may share tok_embd's data; data NULL: no logits */
    const sl_layer_weights *layers; /* n_layers entries */
    int precision;                  /* sl_precision of the weight products (per call: the binding
                                       runs a copy of the handle's descriptor with it set) */
    sl_packed_cache *packed;        /* where bf16 panels are kept; NULL: none (fp32 only) */
} sl_model;

/* Where the forward writes what it captures; every pointer may be NULL. Buffers belong to the
 * caller and must hold the documented number of floats. For a batch of B sequences padded to T
 * tokens (sl_model_forward_batch), every per-layer list holds B*n_layers entries (resid
 * B*(n_layers+1)), sequence-major: entry [b*n_layers + l] is sequence b's buffer for layer l;
 * logits is one (B, T - logits_from, V) block. Each buffer is laid out for the padded T, and its
 * entries at positions >= the sequence's length are written as zeros. */
typedef struct {
    float **attn;   /* n_layers entries: NULL or (H, T, T) attention probabilities */
    float **resid;  /* n_layers+1 entries: NULL or (T, d), the stream entering layer l;
                       entry n_layers is the last layer's output before the final norm */
    float *logits;  /* NULL or (T - logits_from, V): logits of positions logits_from..T-1 */
    int64_t logits_from;
    /* NULL, or (B, logits_rows) positions, each in [0, that sequence's length), any order and
     * repeats allowed: logits is then (B, logits_rows, V), row (b, r) the logits of position
     * logits_at[b * logits_rows + r] of sequence b (logits_from must be 0). Only these rows go
     * through the output head, which costs V * d per row (for a 262k vocabulary more than a layer). */
    const int64_t *logits_at;
    int64_t logits_rows;
    /* n_layers entries each, NULL or (H, T): see sl_attn_stats */
    float **importance, **to_first, **entropy;
    /* Activations inside layer l, n_layers entries each, NULL or head-major buffers:
     *   q (H, T, hd) and k (G, T, hd) after RoPE, v (G, T, hd): always in Hugging Face's
     *     rotate-half layout (pairs (i, i+hd/2)), also for GGUF files whose Q/K rows are stored
     *     in llama.cpp's interleaved-pair layout, so they compare with any HF-based tool;
     *     q·k is the same in either layout;
     *   z (H, T, hd): each head's attention output as W_O reads it (after every intervention);
     *   head_out (H, T, d): z_h · W_O[:, h*hd:(h+1)*hd]ᵀ, head h's addition to the residual
     *     stream (H extra (T×hd)·(hd×d) products, as many flops as the W_O product itself);
     *   attn_out, mlp_out (T, d): what the attention block and the MLP add to the stream. */
    float **q, **k, **v, **z, **head_out, **attn_out, **mlp_out;
} sl_capture;

/* A model's cached activation workspace: the forward takes it (an atomic exchange with NULL),
 * grows it if the call needs more, and puts it back when the slot is still empty; a concurrent
 * second caller finds the slot empty and allocates its own, which it frees afterwards unless
 * the slot is free again by then. So at most one workspace is held between calls, and only one
 * of at most SL_WS_CACHE_MAX_BYTES: a larger one is freed at the end of its call. Zero-initialise
 * the struct; sl_ws_cache_clear frees what it holds (when no call can be running). */
#define SL_WS_CACHE_MAX_BYTES ((int64_t)1 << 30)

/* Rows per chunk of the output head's products (T x V x d, the longest in a call), with a Ctrl-C
 * check between chunks: 512 x 49152 x 576 is ~30 GFLOP, well under a second even on a busy core. */
#define SL_HEAD_ROWS 512
typedef struct sl_workspace sl_workspace;
typedef struct {
    _Atomic(sl_workspace *) slot;
} sl_ws_cache;
void sl_ws_cache_clear(sl_ws_cache *c);
/* Bytes held by the cached workspace now (0 when none, or while a call has it). */
int64_t sl_ws_cache_bytes(sl_ws_cache *c);

/* Interventions over (layer, head), each NULL or n_layers*n_heads entries, layer-major; see
 * sl_attn_intervention (attention.h) for what each entry means. */
typedef struct {
    const uint8_t *mask_first;       /* 0 or nonzero */
    const uint8_t *zero_first_value; /* 0 none, 1 queries i >= 1 only (SL_ZFV_OTHERS), 2 every
                                        query including 0 (SL_ZFV_ALL), 3 v_0 read as the mean of
                                        the other visible values (SL_ZFV_MEAN); checked before
                                        the run */
    const float *head_scale;
    /* The packing mask of training (see sl_attn_intervention): NULL or (T) document starts,
     * shared by every layer and head, and keep_first, the count k of first keys [0, k) that stay
     * visible to every query of every layer whatever hides them (a document start, a window: a
     * fixed ⟨bos⟩, StreamingLLM's sink tokens). */
    const int64_t *key_start;
    int keep_first;
    /* 0: each layer keeps its own attention; w > 0: every layer's causal attention sees at most
     * the w most recent keys (a sliding window); a layer with its own, smaller window keeps it
     * (the window is the smaller of the two). The forward only (sl_model_forward); the
     * derivatives use each layer's own window. */
    int64_t window;
    /* Activation patches (patch.h), NULL: none; checked against the call's batch before the run.
     * The forward (and the derivatives' tape forward) applies them; grad.c cuts the derivative
     * through replaced entries. */
    const sl_patch_table *patch;
} sl_intervention;

/* Layer l's slice of iv (NULL: none) as the attention kernel reads it. */
void sl_layer_intervention(const sl_model *m, const sl_intervention *iv, int64_t l, sl_attn_intervention *aiv);

/* The slot of layer `layer`'s product `which` (SL_SLOT_*), or of the LM head when layer < 0. */
int64_t sl_model_slot(const sl_model *m, int64_t layer, int which);

/* y (rows, w->rows; row stride ldy) = x (rows, w->cols; row stride ldx) · Wᵀ at m->precision, W
 * being slot `slot`: the forward's weight product (weight_product in model.c), for the loss's LM
 * head. */
int sl_model_product_nt(const sl_model *m, int64_t slot, int64_t rows, const float *x, int64_t ldx,
                        const sl_weight *w, float *y, int64_t ldy);

/* Reduction length of each K block of the bf16 backward products (as grad.c's fp32 long-K sums). */
#define SL_BF16_KBLOCK 2048

/* The backward's dx (rows, w->cols; row stride lddx) (+)= dy (rows, w->rows; row stride lddy) · W
 * in bf16 (m->precision must be SL_PREC_BF16; W float32): dy rounded to bf16, Wᵀ's panels taken
 * from m->packed (packed at first use), fp32 accumulation within each K block of SL_BF16_KBLOCK,
 * the blocks (and dx when accumulating) summed in double in order when there are several (the LM
 * head's K = vocab); one block continues dx's fp32 chain. The same bits for any thread count. */
int sl_model_product_nn_bf16(const sl_model *m, int64_t slot, int64_t rows, const float *dy, int64_t lddy,
                             const sl_weight *w, float *dx, int64_t lddx, int accumulate);

/* Packs every weight product's bf16 panels (forward, and Wᵀ for the backward) into m->packed
 * now, each pack parallel over its panels, into the panels a slot already holds (repacked in
 * place: no new memory) or new ones: a training step at bf16 packs its fp32 master weights once,
 * before its windows run in parallel. */
int sl_model_pack_bf16(const sl_model *m);

/* Runs the model on ids[0..T) (each checked to be in [0, vocab)). cap and iv may be NULL. */
int sl_model_forward(const sl_model *m, const int64_t *ids, int64_t T, const sl_capture *cap,
                     const sl_intervention *iv);

/* Runs B sequences at once: ids (B, T) row-major, sequence b made of its first lengths[b] tokens
 * (lengths NULL: all T; else each in [1, T]); every id, padding included, must be in [0, vocab).
 * The real tokens of all sequences are packed into sum(lengths) rows that go through every
 * weight product together (and the final norm and output head for the logits rows asked for);
 * RoPE positions restart at 0 for each sequence and attention never crosses sequences. cap (see
 * sl_capture for the batch layout) and iv (the same for every sequence) may be NULL; cache
 * (NULL: allocate per call) supplies the activations workspace. Results are bitwise those of
 * sl_model_forward on each sequence's own tokens, for any thread count. */
int sl_model_forward_batch(const sl_model *m, const int64_t *ids, int64_t B, int64_t T,
                           const int64_t *lengths, const sl_capture *cap, const sl_intervention *iv,
                           sl_ws_cache *cache);

/* One layer's saved activations (its tape), T rows each, for the backward and the JVP. q and k
 * rows are in the weights' layout, after QK-norm and RoPE. A field the model does not use is
 * NULL (sized 0); a norm the model lacks leaves its output field pointing at its input (xn1 at x,
 * xn2 at h). mean* fields are only used with LayerNorm. */
typedef struct {
    float *x;                    /* (T, d) resid[l], the stream entering the layer */
    float *xn1, *mean1, *rstd1;  /* (T, d) what Q/K/V read: attn_norm(x) (x itself without it); (T), (T) */
    float *qr, *kr;              /* (T, H*hd), (T, G*hd) q, k (with biases) before the QK-norm */
    float *q_rstd, *k_rstd;      /* (T*H), (T*G) the QK-norm's 1/rms per row and head */
    float *q, *k, *v;            /* (T, H*hd), (T, G*hd), (T, G*hd) */
    float *z;                    /* (T, H*hd) attention output after interventions: what W_O reads */
    float *za, *ag;              /* (T, H*hd) gated attention: z before the gate, and W_g a, the gate's
                                    pre-activation (NULL when ungated) */
    float *o, *o_mean, *o_rstd;  /* (T, d) Wo z + bo, the attn_post_norm's input; its statistics */
    float *hr, *hr_mean, *hr_rstd; /* (T, d) x + o, the attn_res_norm's input; its statistics */
    float *h;                    /* (T, d) the stream after the attention block */
    float *xn2, *mean2, *rstd2;  /* (T, d) what the MLP reads: ffn_norm(h) (h itself without it) */
    float *gate, *up;            /* (T, F) pre-activations (with biases); gate NULL when ungated */
    float *mo, *mo_mean, *mo_rstd; /* (T, d) Wdown act + bdown, the ffn_post_norm's input */
    float *yr, *yr_mean, *yr_rstd; /* (T, d) h + mo, the ffn_res_norm's input */
} sl_layer_tape;

/* The embedding's tape: the sum before embd_norm and that norm's statistics (all NULL when the
 * model has no embd_norm). */
typedef struct {
    float *in, *mean, *rstd; /* (T, d), (T), (T) */
} sl_embd_tape;

/* Floats one layer's tape needs for T tokens (-1 on overflow), and the binding of a tape's
 * fields to a buffer of that many floats. */
int64_t sl_layer_tape_floats(const sl_model *m, int64_t T);
int sl_layer_tape_bind(const sl_model *m, int64_t T, float *buf, sl_layer_tape *lt);

/* Runs layers [0, n_run) saving each one's tape (tapes: n_run entries); x_out (NULL or (T, d))
 * receives resid[n_run]; et (NULL, or fields of (T, d), (T), (T) floats) the embedding's tape. */
int sl_model_forward_tape(const sl_model *m, const int64_t *ids, int64_t T, int64_t n_run,
                          sl_layer_tape *tapes, const sl_intervention *iv, float *x_out, sl_embd_tape *et);

/* Checks the descriptor: dimensions, that every layer has the same optional tensors, and that the
 * activation matches the presence of the gate. */
int sl_model_check(const sl_model *m);

/* The size of dimension dim in m (1 for SL_DIM_NONE, n_pos for SL_DIM_NPOS), or -1 when the
 * product overflows; its name ("d", "qd", "kvd", "hd", "F", "V", "n_pos"; "" for NONE). */
int64_t sl_model_dim(const sl_model *m, sl_dim dim);
const char *sl_dim_name(sl_dim dim);
/* Names of SL_KIND_* ("matrix", "vector", "table") and SL_ROLE_* ("embedding", "head", "norm",
 * "norm_bias", "matrix", "bias"). */
const char *sl_kind_name(int kind);
const char *sl_role_name(int role);

/* Floats of the forward's workspace that grow with the packed token rows, for `rows` rows (-1 on
 * overflow): the activations acts_bind sizes per row, Vᵀ and the importance partials at their
 * most (SL_ATTN_SEGMENTS per head); the per-thread score blocks and the (T, hd) RoPE tables
 * are not counted. Model.max_rows_per_call sizes calls with it. */
int64_t sl_model_forward_floats(const sl_model *m, int64_t rows);

/* The attention kernel's variant (SL_ATTN_*, attention.h) of m: its attn_variant, softmax for a gated model. */
int sl_model_attn_kernel(const sl_model *m);

/* The token positions a model can run: n_pos with learned positions, else no limit (INT64_MAX). */
int64_t sl_model_max_positions(const sl_model *m);

#endif

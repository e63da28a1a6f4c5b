/* The LLaMA-family transformer forward pass with capture of what the paper measures. */
#ifndef SL_MODEL_H
#define SL_MODEL_H

#include <stdatomic.h>
#include <stdint.h>

#include "attention.h"

typedef struct {
    const float *attn_norm;              /* (d) */
    const float *wq, *wk, *wv, *wo;      /* (H*hd, d), (G*hd, d), (G*hd, d), (d, H*hd) */
    const float *ffn_norm;               /* (d) */
    const float *w_gate, *w_up, *w_down; /* (F, d), (F, d), (d, F) */
} sl_layer_weights;

typedef struct {
    int64_t n_layers, n_heads, n_kv_heads, d_model, head_dim, d_ff, vocab_size;
    float norm_eps;
    int rope_layout;            /* SL_ROPE_HALF_SPLIT or SL_ROPE_ADJACENT */
    const float *rope_inv_freq; /* (head_dim/2), any frequency scaling already applied */
    const float *tok_embd;      /* (V, d) */
    const float *out_norm;      /* (d) */
    const float *lm_head;       /* (V, d); may be tok_embd (tied) */
    const sl_layer_weights *layers; /* n_layers entries */
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
                                        query including 0 (SL_ZFV_ALL); checked before the run */
    const float *head_scale;
} sl_intervention;

/* Layer l's slice of iv (NULL: none) as the attention kernel reads it. */
void sl_layer_intervention(const sl_model *m, const sl_intervention *iv, int64_t l, sl_attn_intervention *aiv);

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

/* One layer's saved activations (its tape), T rows each, for the backward and the JVP:
 * Q/K rows in the file's layout (as the weights), q and k after RoPE. */
typedef struct {
    float *x;            /* (T, d) resid[l], the stream entering the layer */
    float *xn1, *rstd1;  /* (T, d) attention-norm output, (T) its 1/rms */
    float *q, *k, *v;    /* (T, H*hd), (T, G*hd), (T, G*hd) */
    float *z;            /* (T, H*hd) attention output after interventions: what W_O reads */
    float *h;            /* (T, d) the stream after the attention block */
    float *xn2, *rstd2;  /* (T, d), (T) the MLP norm's */
    float *gate, *up;    /* (T, F) pre-activations */
} sl_layer_tape;

/* Floats one layer's tape needs for T tokens (-1 on overflow), and the binding of a tape's
 * fields to a buffer of that many floats. */
int64_t sl_layer_tape_floats(const sl_model *m, int64_t T);
int sl_layer_tape_bind(const sl_model *m, int64_t T, float *buf, sl_layer_tape *lt);

/* Runs layers [0, n_run) saving each one's tape (tapes: n_run entries); x_out (NULL or (T, d))
 * receives resid[n_run]; cosv/sinv (NULL or (T, hd/2)) the RoPE tables. */
int sl_model_forward_tape(const sl_model *m, const int64_t *ids, int64_t T, int64_t n_run,
                          sl_layer_tape *tapes, const sl_intervention *iv, float *x_out, float *cosv,
                          float *sinv);

#endif

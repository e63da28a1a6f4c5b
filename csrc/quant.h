/* Dequantisation of GGUF/ggml tensor block formats to fp32. */
#ifndef SL_QUANT_H
#define SL_QUANT_H

#include <stdint.h>

/* ggml type ids, as in ggml.h / gguf.GGMLQuantizationType */
enum {
    SL_GGML_F32 = 0, SL_GGML_F16 = 1, SL_GGML_Q4_0 = 2, SL_GGML_Q4_1 = 3, SL_GGML_Q5_0 = 6,
    SL_GGML_Q5_1 = 7, SL_GGML_Q8_0 = 8, SL_GGML_Q4_K = 12, SL_GGML_Q5_K = 13, SL_GGML_Q6_K = 14,
    SL_GGML_BF16 = 30
};

/* Elements per block and bytes per block of a type; 0 when sinklab does not support it. */
int64_t sl_quant_block_elems(int type);
int64_t sl_quant_block_bytes(int type);

/* The size checks of sl_dequantize alone (supported type, whole blocks, exact byte count), so a
 * caller can validate before allocating the output. */
int sl_dequantize_check(int type, int64_t nbytes, int64_t n_elements);

/* Decodes n_elements values of `type` from src (exactly nbytes long) into dst.
 * Checks that n_elements is a whole number of blocks and nbytes is exactly their size.
 * OpenMP over blocks when parallel != 0. */
int sl_dequantize(int type, const uint8_t *src, int64_t nbytes, float *dst, int64_t n_elements,
                  int parallel);

/* A decoder of nb whole blocks of one type: src (nb * block bytes, any alignment) into dst
 * (nb * block elems floats). Every level's decoder gives the same floats, bit for bit. */
typedef void (*sl_dequant_fn)(const uint8_t *restrict src, float *restrict dst, int64_t nb);

/* The decoder of `type` for the SIMD level in use (cpu.h), or NULL for an unsupported type.
 * sl_dequantize and the weight products (sgemm.h) decode through it. */
sl_dequant_fn sl_dequant_kernel(int type);

#endif

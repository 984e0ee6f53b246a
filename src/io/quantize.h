/* MLX affine quantization on the writing side (docs/design.md §5): the quantizer mlx-lm's
 * `convert` runs, the little-endian bit-stream packing of every supported width, and float
 * stores in the dtypes a checkpoint may hold. The kernels only ever read what this writes. */
#ifndef NX_IO_QUANTIZE_H
#define NX_IO_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* bits ∈ {2,3,4,5,6,8} and group ∈ {32,64,128}, the combinations MLX accepts. */
bool nx_quant_supported(int bits, int group);

/* Packs n values q[i] < 2^bits into the row bit stream: element i occupies stream bits
 * [i·bits, (i+1)·bits), word w holds stream bits 32w..32w+31 LSB first. n·bits must be a
 * multiple of 32; out receives n·bits/32 words (host order, written little-endian on x86). */
void nx_quant_pack(const uint8_t *q, int64_t n, int bits, uint32_t *out);

/* Element i of a packed row (the inverse of nx_quant_pack). */
uint8_t nx_quant_unpack(const uint32_t *row, int64_t i, int bits);

/* Quantizes one row of n floats (n a multiple of group) as MLX does per group:
 *   scale = max((wmax − wmin)/(2^bits − 1), 1e−7), negated unless |wmin| > |wmax|;
 *   edge  = the larger-magnitude extreme; q0 = rint(edge/scale); if q0 ≠ 0 then
 *           scale = edge/q0 and bias = edge (that extreme is then exact), else bias = 0;
 *   q     = clamp(rint((w − bias)/scale), 0, 2^bits − 1).
 * Arithmetic is f32; scales and biases are stored as sdtype (F32, F16 or BF16, rounded to
 * nearest even), q is computed with the unrounded f32 scale, as MLX does. Writes n·bits/32
 * words to q_out and n/group values to scales and biases. */
void nx_quantize_row(const float *w, int64_t n, int bits, int group, nx_dtype sdtype, uint32_t *q_out,
                     void *scales, void *biases);

/* w[i] = scales[g]·q[i] + biases[g] in f32 (g = i / group): the dequantization formula. */
void nx_dequantize_row(const uint32_t *q, const void *scales, const void *biases, nx_dtype sdtype,
                       int64_t n, int bits, int group, float *out);

/* Stores n floats as dtype (F32, F16 or BF16, round to nearest even; NaN stays NaN) at dst. */
void nx_store_floats(nx_dtype dtype, const float *src, void *dst, int64_t n);

/* One f32 → bf16 / f16 conversion with round to nearest even. */
uint16_t nx_f32_to_bf16(float f);
uint16_t nx_f32_to_f16(float f);

#endif

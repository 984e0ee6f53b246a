/* Element types as stored in checkpoints: sizes, safetensors spellings, and the stored byte
 * count of a linear layer (used by the loader's shape checks and the MoE traffic counters). */
#include "kernels/kernels_internal.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[NX_DTYPE_COUNT] = {
    [NX_DTYPE_F32] = {"F32", 4},         [NX_DTYPE_F16] = {"F16", 2},
    [NX_DTYPE_BF16] = {"BF16", 2},       [NX_DTYPE_U32] = {"U32", 4},
    [NX_DTYPE_I32] = {"I32", 4},         [NX_DTYPE_U8] = {"U8", 1},
    [NX_DTYPE_I8] = {"I8", 1},           [NX_DTYPE_U16] = {"U16", 2},
    [NX_DTYPE_I16] = {"I16", 2},         [NX_DTYPE_I64] = {"I64", 8},
    [NX_DTYPE_U64] = {"U64", 8},         [NX_DTYPE_F64] = {"F64", 8},
    [NX_DTYPE_BOOL] = {"BOOL", 1},       [NX_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [NX_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

size_t nx_dtype_size(nx_dtype t) {
    if ((unsigned)t >= NX_DTYPE_COUNT) return 0;
    return dtype_table[t].size;
}

const char *nx_dtype_name(nx_dtype t) {
    if ((unsigned)t >= NX_DTYPE_COUNT) return "?";
    return dtype_table[t].name;
}

int nx_dtype_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < NX_DTYPE_COUNT; i++)
        if (strcmp(dtype_table[i].name, name) == 0) return i;
    return -1;
}

size_t nx_linear_weight_row_bytes(const nx_linear *W) {
    if (W->dtype == NX_DTYPE_U32 && W->bits > 0) return (size_t)W->in * (size_t)W->bits / 8;
    return (size_t)W->in * nx_dtype_size(W->dtype);
}

size_t nx_linear_row_bytes(const nx_linear *W) {
    if (!W) return 0;
    size_t n = nx_linear_weight_row_bytes(W);
    if (W->dtype == NX_DTYPE_U32 && W->group > 0) {
        /* a quantized row is only usable together with its scales and biases */
        size_t srow = (size_t)(W->in / W->group) * nx_dtype_size(W->sdtype);
        if (W->scales) n += srow;
        if (W->biases) n += srow;
    }
    return n;
}

size_t nx_linear_bytes(const nx_linear *W) {
    if (!W || W->out <= 0) return 0;
    return (size_t)W->out * nx_linear_row_bytes(W);
}


nx_linear nx_linear_rows(const nx_linear *W, int64_t r0, int64_t n) {
    nx_linear v = *W;
    v.out = n;
    v.w = (const uint8_t *)W->w + (size_t)r0 * nx_linear_weight_row_bytes(W);
    if (W->dtype == NX_DTYPE_U32 && W->group > 0) {
        const size_t srow = (size_t)(W->in / W->group) * nx_dtype_size(W->sdtype);
        if (W->scales) v.scales = (const uint8_t *)W->scales + (size_t)r0 * srow;
        if (W->biases) v.biases = (const uint8_t *)W->biases + (size_t)r0 * srow;
    }
    return v;
}

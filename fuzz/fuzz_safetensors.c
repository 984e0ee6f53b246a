/* libFuzzer target for the safetensors header parser: any input is a candidate file image.
 * Beyond "no crash", every accepted tensor must lie inside the input with the size its shape
 * and dtype imply, so a validation gap shows up as an abort, not as a silent bad view. */
#include <stdint.h>
#include <stdlib.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nx_tensor *t = NULL;
    size_t n = 0;
    nx_error err;
    if (nx_safetensors_parse(data, size, "fuzz.safetensors", &t, &n, &err) != NX_OK) return 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t count = 1;
        for (int d = 0; d < t[i].n_dims; d++) count *= (uint64_t)t[i].shape[d];
        if (count * nx_dtype_size(t[i].dtype) != t[i].nbytes) abort();
        if (t[i].data < data + 8 || t[i].data + t[i].nbytes > data + size) abort();
        volatile uint8_t sink = 0;
        if (t[i].nbytes) sink ^= t[i].data[0] ^ t[i].data[t[i].nbytes - 1];
        (void)sink;
    }
    nx_safetensors_free_parsed(t, n);
    return 0;
}

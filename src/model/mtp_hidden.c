/* The stored MTP-fed trunk hidden states, read out for training a head (nextn.h). */
#include <string.h>

#include "base/error.h"
#include "model/model_internal.h"

nx_status nx_ctx_mtp_hidden(const nx_ctx *c, int32_t from, int32_t n, float *out, nx_error *err) {
    if (from < 0 || n < 0 || from + n > c->n_past)
        return nx_fail(err, NX_E_ARG, "hidden rows [%d, %d): the trunk cache holds %d rows", from, from + n, c->n_past);
    const size_t H = (size_t)c->m->cfg.hidden_size;
    memcpy(out, c->hidden + (size_t)from * H, sizeof(float) * H * (size_t)n);
    return NX_OK;
}

/* Checks that keep broken numbers and changed files from turning into silent output: a scan of
 * the weights at load, a check of the logits of every forward pass, and a check that the
 * mapped checkpoint files are still the ones loaded. */
#ifndef NX_MODEL_VALIDATE_H
#define NX_MODEL_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "io/weights.h"
#include "nextn.h"

/* Scans the weights where a NaN or an infinity would spread to every token (see validate.c for
 * which and how much): NX_E_FORMAT naming the tensor and the element. */
nx_status nx_weights_validate(const nx_weights *w, const nx_config *cfg, nx_error *err);

/* Index of the first element of x[0..n) that is NaN or infinite, or -1. */
int64_t nx_first_nonfinite_f32(const float *x, size_t n);

/* NX_E_STATE naming the row and the value when rows logits [rows, V) hold a NaN or an infinity
 * in their first n_valid columns (the rest may be -inf on purpose); what = "trunk" / "MTP". */
nx_status nx_logits_check(const float *logits, int32_t rows, int32_t V, int32_t n_valid, const char *what,
                          nx_error *err);

#endif

/* Timing of the part of a decode step that does not depend on routing, and the read bandwidth
 * next to the steps, for `nextn bench`. */
#ifndef NX_MODEL_DENSE_TIMING_H
#define NX_MODEL_DENSE_TIMING_H

#include "base/membw.h"
#include "nextn.h"

/* Runs every matmul of a trunk step that every token pays — each layer's attention projections,
 * its router and shared expert (MoE layers) or dense FFN, and lm_head — on T rows of random
 * input, as the forward pass groups them. *seconds = the fastest of reps passes (after one
 * warm-up), *bytes = weight bytes one pass reads. T in 1..64, reps >= 1. */
nx_status nx_model_time_dense(nx_model *m, int32_t T, int reps, double *seconds, double *bytes,
                              nx_error *err);

/* The machine's read bandwidth right now, on the model's own threads: one pass of each
 * nx_membw pattern over b, the best one in GB/s (nextn bench --membw pairs it with the next
 * decode step). */
double nx_model_read_bandwidth(nx_model *m, nx_membw *b);

#endif

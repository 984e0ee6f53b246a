/* What --draft auto has measured on a context (generate.c), kept across generations in the
 * context's decoder slot (model/step.h): costs belong to the model and the machine, not to a
 * request, so later requests start from them instead of paying for the exploration again
 * (nx_ctx_reset_auto forgets them). */
#ifndef NX_DECODE_DRAFT_AUTO_H
#define NX_DECODE_DRAFT_AUTO_H

#include "nextn.h"

#define NX_AUTO_COST_WINDOW 15 /* samples per median */
typedef struct nx_auto_state {
    /* recent costs (seconds) of r-row trunk forwards (slot r = 1..NX_MAX_DRAFT+1) and of MTP
     * forwards (slot 0): the choice works on their medians, robust to page faults, warm-up and
     * other processes' bursts */
    double hist[NX_MAX_DRAFT + 2][NX_AUTO_COST_WINDOW];
    int32_t hist_n[NX_MAX_DRAFT + 2];
    double acc_n[NX_MAX_DRAFT], acc_d[NX_MAX_DRAFT]; /* acceptance per chain position (decayed counts) */
    /* seconds those forwards waited on streamed experts' reads (a moving average per slot, the
     * median above then covering the compute alone): reads are a steady part of the cost when
     * experts stream, their spread (hits, misses) is no outlier to be filtered out */
    double io[NX_MAX_DRAFT + 2];
    int32_t io_n[NX_MAX_DRAFT + 2];
    int32_t probe_every; /* plain steps between probes while drafting does not pay (0: not set yet) */
} nx_auto_state;

/* The context's measurements (zero before the first generation with --draft auto, and after
 * nx_ctx_reset_auto); NULL when out of memory. */
nx_auto_state *nx_auto_of(nx_ctx *c);

#endif

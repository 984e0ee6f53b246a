/* Server counters exported at GET /metrics in the Prometheus text format: requests by route and
 * status, tokens, decode speed, the speculative counters of every finished generation (drafts,
 * drafted, accepted, per chain position) and MoE expert traffic per trunk step. */
#ifndef NX_SERVE_METRICS_H
#define NX_SERVE_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "nextn.h"
#include "serve/slots.h"

#define NX_METRICS_MAX_SERIES 64

typedef struct nx_metrics {
    pthread_mutex_t mu;
    struct {
        char route[40];
        int status;
        int64_t count;
    } req[NX_METRICS_MAX_SERIES];
    int n_req;
    int64_t n_generations, n_cancelled, n_timeouts;
    int64_t prompt_tokens, completion_tokens;
    double t_prefill, t_decode, t_draft, t_verify;
    double last_decode_tps;
    double ttft_sum; /* seconds from arrival to first token, over generations */
    int64_t ttft_n;
    double queue_wait_sum;
    int64_t n_steps, n_drafts, n_drafted, n_accepted;
    int64_t drafted_at[NX_MAX_DRAFT], accepted_at[NX_MAX_DRAFT];
    double expert_bytes_ar, expert_bytes_verify;
    int64_t n_ar_steps, n_verify_steps;
    int64_t slot_actions[NX_SLOT_ERASE + 1]; /* finished slot actions, by nx_slot_action */
} nx_metrics;

void nx_metrics_init(nx_metrics *m);
void nx_metrics_destroy(nx_metrics *m);

void nx_metrics_count_request(nx_metrics *m, const char *route, int status);
/* Adds one finished (or cancelled) generation's statistics. */
void nx_metrics_add_generation(nx_metrics *m, const nx_gen_stats *s, double ttft, double queue_wait);
void nx_metrics_count_cancel(nx_metrics *m, bool timeout);
/* Counts one finished slot action (POST /slots/0). */
void nx_metrics_count_slot(nx_metrics *m, nx_slot_action a);

/* Live gauges supplied by the server at render time. */
typedef struct nx_metrics_gauges {
    const char *model_id, *mtp;
    int32_t draft; /* server default; NX_DRAFT_AUTO = auto */
    int queue_depth, queue_capacity, active;
    double uptime;
    nx_prompt_cache_stats pcache; /* the prompt cache (--cache-ram) */
    int n_slots;                  /* sequence slots (--parallel), and per slot: */
    const bool *slot_busy;        /* generating now */
    const int64_t *slot_jobs, *slot_tokens; /* generations and tokens it has produced */
    const nx_batch_stats *batch;  /* its batch's forwards (NULL: one slot, no batch) */
} nx_metrics_gauges;

/* The exposition text (malloc'd), or NULL when out of memory. */
char *nx_metrics_render(nx_metrics *m, const nx_metrics_gauges *g);

#endif

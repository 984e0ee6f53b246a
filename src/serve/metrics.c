/* Prometheus exposition of the server's counters. Totals are counters (a scraper derives rates);
 * ratios that need both operands at once (tokens/s, acceptance, bytes per step) are exported as
 * gauges computed over the server's lifetime so a single scrape is meaningful. */
#include "serve/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"

void nx_metrics_init(nx_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void nx_metrics_destroy(nx_metrics *m) {
    if (m) pthread_mutex_destroy(&m->mu);
}

void nx_metrics_count_request(nx_metrics *m, const char *route, int status) {
    pthread_mutex_lock(&m->mu);
    int i;
    for (i = 0; i < m->n_req; i++)
        if (m->req[i].status == status && strcmp(m->req[i].route, route) == 0) break;
    if (i == m->n_req && m->n_req < NX_METRICS_MAX_SERIES) {
        snprintf(m->req[i].route, sizeof m->req[i].route, "%s", route);
        m->req[i].status = status;
        m->n_req++;
    }
    if (i < m->n_req) m->req[i].count++;
    pthread_mutex_unlock(&m->mu);
}

void nx_metrics_add_generation(nx_metrics *m, const nx_gen_stats *s, double ttft,
                               double queue_wait) {
    pthread_mutex_lock(&m->mu);
    m->n_generations++;
    m->prompt_tokens += s->n_prompt;
    m->completion_tokens += s->n_generated;
    m->t_prefill += s->t_prefill;
    m->t_decode += s->t_decode;
    m->t_draft += s->t_draft;
    m->t_verify += s->t_verify;
    if (s->t_decode > 0 && s->n_generated > 1)
        m->last_decode_tps = (double)(s->n_generated - 1) / s->t_decode;
    if (ttft >= 0) {
        m->ttft_sum += ttft;
        m->ttft_n++;
    }
    m->queue_wait_sum += queue_wait;
    m->n_steps += s->n_steps;
    m->n_drafts += s->n_drafts;
    m->n_drafted += s->n_drafted;
    m->n_accepted += s->n_accepted;
    for (int i = 0; i < NX_MAX_DRAFT; i++) {
        m->drafted_at[i] += s->drafted_at[i];
        m->accepted_at[i] += s->accepted_at[i];
    }
    m->expert_bytes_ar += s->expert_bytes_ar;
    m->expert_bytes_verify += s->expert_bytes_verify;
    m->n_ar_steps += s->n_ar_steps;
    m->n_verify_steps += s->n_verify_steps;
    pthread_mutex_unlock(&m->mu);
}

void nx_metrics_count_cancel(nx_metrics *m, bool timeout) {
    pthread_mutex_lock(&m->mu);
    if (timeout) m->n_timeouts++;
    else m->n_cancelled++;
    pthread_mutex_unlock(&m->mu);
}

void nx_metrics_count_slot(nx_metrics *m, nx_slot_action a) {
    if ((size_t)a >= sizeof m->slot_actions / sizeof m->slot_actions[0]) return;
    pthread_mutex_lock(&m->mu);
    m->slot_actions[a]++;
    pthread_mutex_unlock(&m->mu);
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

/* Label values may not hold quotes, backslashes or newlines unescaped. */
static void put_label(nx_strbuf *b, const char *s) {
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') nx_strbuf_append(b, "\\", 1), nx_strbuf_append(b, s, 1);
        else if (*s == '\n') nx_strbuf_puts(b, "\\n");
        else nx_strbuf_append(b, s, 1);
    }
}

static void metric(nx_strbuf *b, const char *name, const char *type, const char *help) {
    nx_strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A metric with a single unlabelled sample: the header, then "name value" with the value
 * formatted by fmt, so the name is spelled once. */
static void metric_value(nx_strbuf *b, const char *name, const char *type, const char *help,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void metric_value(nx_strbuf *b, const char *name, const char *type, const char *help,
                         const char *fmt, ...) {
    metric(b, name, type, help);
    nx_strbuf_printf(b, "%s ", name);
    va_list ap;
    va_start(ap, fmt);
    nx_strbuf_vprintf(b, fmt, ap);
    va_end(ap);
    nx_strbuf_puts(b, "\n");
}

/* The slots and the batch: per-slot gauges and counters, and a histogram of the sequences each
 * batched forward held. */
static void render_slots(nx_strbuf *b, const nx_metrics_gauges *g) {
    metric_value(b, "nextn_slots", "gauge", "Sequence slots (--parallel).", "%d", g->n_slots);
    metric(b, "nextn_slot_processing", "gauge", "Whether the slot is generating now.");
    for (int i = 0; i < g->n_slots; i++)
        nx_strbuf_printf(b, "nextn_slot_processing{slot=\"%d\"} %d\n", i, g->slot_busy[i] ? 1 : 0);
    metric(b, "nextn_slot_generations_total", "counter", "Generation requests each slot has run.");
    for (int i = 0; i < g->n_slots; i++)
        nx_strbuf_printf(b, "nextn_slot_generations_total{slot=\"%d\"} %lld\n", i, (long long)g->slot_jobs[i]);
    metric(b, "nextn_slot_completion_tokens_total", "counter", "Tokens each slot has generated.");
    for (int i = 0; i < g->n_slots; i++)
        nx_strbuf_printf(b, "nextn_slot_completion_tokens_total{slot=\"%d\"} %lld\n", i,
                         (long long)g->slot_tokens[i]);
    if (!g->batch) return;
    const nx_batch_stats *s = g->batch;
    metric(b, "nextn_batch_sequences", "histogram", "Sequences (slots) per batched forward.");
    int64_t cum = 0, sum = 0;
    for (int n = 1; n <= NX_BATCH_STAT_SEQS; n++) {
        cum += s->n_by_seqs[n];
        sum += (int64_t)n * s->n_by_seqs[n];
        if (n == 1 || n == 2 || n == 3 || n == 4 || n == 6 || n == 8 || n == 12)
            nx_strbuf_printf(b, "nextn_batch_sequences_bucket{le=\"%d\"} %lld\n", n, (long long)cum);
    }
    nx_strbuf_printf(b, "nextn_batch_sequences_bucket{le=\"+Inf\"} %lld\n", (long long)s->forwards);
    nx_strbuf_printf(b, "nextn_batch_sequences_sum %lld\n", (long long)sum);
    nx_strbuf_printf(b, "nextn_batch_sequences_count %lld\n", (long long)s->forwards);
    metric_value(b, "nextn_batch_rows_total", "counter", "Rows of all batched forwards.", "%lld", (long long)s->rows);
    metric_value(b, "nextn_batch_seconds_total", "counter", "Seconds of all batched forwards.", "%.6f", s->seconds);
}

char *nx_metrics_render(nx_metrics *m, const nx_metrics_gauges *g) {
    nx_strbuf b = {0};
    pthread_mutex_lock(&m->mu);
    nx_metrics c = *m; /* a consistent snapshot; render without holding the lock */
    pthread_mutex_unlock(&m->mu);

    metric(&b, "nextn_info", "gauge", "Served model and its MTP status.");
    nx_strbuf_puts(&b, "nextn_info{model=\"");
    put_label(&b, g->model_id);
    nx_strbuf_puts(&b, "\",mtp=\"");
    put_label(&b, g->mtp);
    if (g->draft == NX_DRAFT_AUTO) nx_strbuf_puts(&b, "\",draft=\"auto\"} 1\n");
    else nx_strbuf_printf(&b, "\",draft=\"%d\"} 1\n", g->draft);
    metric_value(&b, "nextn_uptime_seconds", "gauge", "Seconds since the server started.",
                 "%.3f", g->uptime);

    metric(&b, "nextn_requests_total", "counter", "HTTP requests by route and status code.");
    for (int i = 0; i < c.n_req; i++) {
        nx_strbuf_puts(&b, "nextn_requests_total{route=\"");
        put_label(&b, c.req[i].route);
        nx_strbuf_printf(&b, "\",status=\"%d\"} %lld\n", c.req[i].status,
                         (long long)c.req[i].count);
    }
    metric_value(&b, "nextn_queue_depth", "gauge", "Requests (generations and slot actions) waiting for the worker.",
                 "%d", g->queue_depth);
    metric_value(&b, "nextn_queue_capacity", "gauge",
                 "Requests the queue admits before answering 503.", "%d", g->queue_capacity);
    metric_value(&b, "nextn_requests_active", "gauge", "Generations running now.", "%d", g->active);
    metric_value(&b, "nextn_prompt_cache_entries", "gauge", "Saved prompt prefixes (--cache-ram).", "%lld",
                 (long long)g->pcache.entries);
    metric_value(&b, "nextn_prompt_cache_bytes", "gauge", "Memory the saved prompt prefixes take.", "%lld",
                 (long long)g->pcache.bytes);
    metric_value(&b, "nextn_prompt_cache_budget_bytes", "gauge", "The prompt cache's budget (--cache-ram).",
                 "%lld", (long long)g->pcache.budget_bytes);
    metric_value(&b, "nextn_prompt_cache_saves_total", "counter",
                 "Prompt prefixes saved before a request replaced them in the context.", "%lld",
                 (long long)g->pcache.saves);
    metric_value(&b, "nextn_prompt_cache_restores_total", "counter",
                 "Requests whose prompt prefix was loaded from the prompt cache.", "%lld",
                 (long long)g->pcache.restores);
    metric_value(&b, "nextn_prompt_cache_restored_tokens_total", "counter",
                 "Prompt tokens loaded from the prompt cache instead of prefilled.", "%lld",
                 (long long)g->pcache.restored_tokens);
    metric_value(&b, "nextn_prompt_cache_evictions_total", "counter",
                 "Saved prompt prefixes evicted to stay within the budget.", "%lld",
                 (long long)g->pcache.evictions);
    metric(&b, "nextn_slot_actions_total", "counter",
           "Slot actions done (POST /slots/0?action=..., with --slot-save-path).");
    static const char *const actions[] = {[NX_SLOT_SAVE] = "save", [NX_SLOT_RESTORE] = "restore",
                                          [NX_SLOT_ERASE] = "erase"};
    for (size_t i = 0; i < sizeof actions / sizeof actions[0]; i++)
        nx_strbuf_printf(&b, "nextn_slot_actions_total{action=\"%s\"} %lld\n", actions[i],
                         (long long)c.slot_actions[i]);
    metric_value(&b, "nextn_generations_total", "counter", "Finished generations (one per prompt).",
                 "%lld", (long long)c.n_generations);
    metric_value(&b, "nextn_cancelled_total", "counter",
                 "Generations cancelled by a client disconnect.", "%lld", (long long)c.n_cancelled);
    metric_value(&b, "nextn_timeouts_total", "counter", "Requests that ran past --timeout.",
                 "%lld", (long long)c.n_timeouts);

    metric_value(&b, "nextn_prompt_tokens_total", "counter", "Prompt tokens prefilled.",
                 "%lld", (long long)c.prompt_tokens);
    metric_value(&b, "nextn_completion_tokens_total", "counter", "Tokens generated.",
                 "%lld", (long long)c.completion_tokens);
    metric_value(&b, "nextn_prefill_seconds_total", "counter", "Seconds spent in prefill.",
                 "%.6f", c.t_prefill);
    metric_value(&b, "nextn_decode_seconds_total", "counter",
                 "Seconds spent decoding after prefill.", "%.6f", c.t_decode);
    metric_value(&b, "nextn_draft_seconds_total", "counter",
                 "Decode seconds spent in MTP drafting.", "%.6f", c.t_draft);
    metric_value(&b, "nextn_verify_seconds_total", "counter",
                 "Decode seconds spent verifying drafts.", "%.6f", c.t_verify);
    metric_value(&b, "nextn_decode_tokens_per_second", "gauge",
                 "Decode speed over the server's lifetime (tokens after the first / decode seconds).",
                 "%.3f", ratio((double)(c.completion_tokens - c.n_generations), c.t_decode));
    metric_value(&b, "nextn_last_decode_tokens_per_second", "gauge",
                 "Decode speed of the most recent generation.", "%.3f", c.last_decode_tps);
    metric(&b, "nextn_time_to_first_token_seconds", "summary",
           "Seconds from a request's arrival to its first token.");
    nx_strbuf_printf(&b, "nextn_time_to_first_token_seconds_sum %.6f\n", c.ttft_sum);
    nx_strbuf_printf(&b, "nextn_time_to_first_token_seconds_count %lld\n", (long long)c.ttft_n);
    metric_value(&b, "nextn_queue_wait_seconds_total", "counter",
                 "Seconds requests waited in the queue.", "%.6f", c.queue_wait_sum);

    metric_value(&b, "nextn_spec_steps_total", "counter",
                 "Trunk forwards during decode (AR + verify).", "%lld", (long long)c.n_steps);
    metric_value(&b, "nextn_spec_drafts_total", "counter",
                 "Decode cycles that drafted with the MTP head.", "%lld", (long long)c.n_drafts);
    metric_value(&b, "nextn_spec_drafted_tokens_total", "counter", "Draft tokens proposed.",
                 "%lld", (long long)c.n_drafted);
    metric_value(&b, "nextn_spec_accepted_tokens_total", "counter", "Draft tokens accepted.",
                 "%lld", (long long)c.n_accepted);
    metric_value(&b, "nextn_spec_acceptance_rate", "gauge", "Accepted / drafted over the lifetime.",
                 "%.6f", ratio((double)c.n_accepted, (double)c.n_drafted));
    metric_value(&b, "nextn_spec_tokens_per_step", "gauge", "Generated tokens per trunk forward.",
                 "%.6f", ratio((double)c.completion_tokens, (double)c.n_steps));
    metric(&b, "nextn_spec_drafted_at_total", "counter", "Drafts proposed at each chain position.");
    for (int i = 0; i < NX_MAX_DRAFT; i++)
        nx_strbuf_printf(&b, "nextn_spec_drafted_at_total{position=\"%d\"} %lld\n", i + 1,
                         (long long)c.drafted_at[i]);
    metric(&b, "nextn_spec_accepted_at_total", "counter", "Drafts accepted at each chain position.");
    for (int i = 0; i < NX_MAX_DRAFT; i++)
        nx_strbuf_printf(&b, "nextn_spec_accepted_at_total{position=\"%d\"} %lld\n", i + 1,
                         (long long)c.accepted_at[i]);

    metric(&b, "nextn_steps_total", "counter", "Trunk decode steps by kind.");
    nx_strbuf_printf(&b, "nextn_steps_total{kind=\"ar\"} %lld\n", (long long)c.n_ar_steps);
    nx_strbuf_printf(&b, "nextn_steps_total{kind=\"verify\"} %lld\n", (long long)c.n_verify_steps);
    metric(&b, "nextn_expert_bytes_total", "counter", "Routed-expert weight bytes read, by step kind.");
    nx_strbuf_printf(&b, "nextn_expert_bytes_total{kind=\"ar\"} %.0f\n", c.expert_bytes_ar);
    nx_strbuf_printf(&b, "nextn_expert_bytes_total{kind=\"verify\"} %.0f\n", c.expert_bytes_verify);
    metric(&b, "nextn_expert_bytes_per_step", "gauge",
           "Routed-expert weight bytes read per trunk step, by step kind.");
    nx_strbuf_printf(&b, "nextn_expert_bytes_per_step{kind=\"ar\"} %.0f\n",
                     ratio(c.expert_bytes_ar, (double)c.n_ar_steps));
    nx_strbuf_printf(&b, "nextn_expert_bytes_per_step{kind=\"verify\"} %.0f\n",
                     ratio(c.expert_bytes_verify, (double)c.n_verify_steps));
    nx_strbuf_printf(&b, "nextn_expert_bytes_per_step{kind=\"all\"} %.0f\n",
                     ratio(c.expert_bytes_ar + c.expert_bytes_verify,
                           (double)(c.n_ar_steps + c.n_verify_steps)));
    render_slots(&b, g);
    if (!b.data) return NULL;
    return nx_strbuf_take(&b);
}

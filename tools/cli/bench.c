/* `nextn bench`: plain decoding vs MTP speculative decoding (k = 1, 2, 3, auto) on the same
 * prompts and settings in one run, with the speedup each mode should reach from its measured
 * acceptance and costs, E / (C(k+1)/C(1) + k·c), so hidden overhead in the loop shows up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nextn_tools.h"

static const char *usage =
    "usage: nextn bench [-m DIR] [-p TEXT | -f FILE | --prompt-tokens IDS] [-n N] [--modes LIST]\n"
    "                   [--temp T ...] [--synthetic-accept A] [--repeat R] [--membw MB]\n"
    "\n"
    "Decodes N tokens (default 128, end-of-sequence ignored) from each prompt in every mode of\n"
    "LIST (default ar,1,2,3,auto) and prints tokens/s and the ratio to plain decoding (ar).\n"
    "Without a prompt, a built-in code prompt and prose prompt are used (token ids 1..16 for\n"
    "models without a tokenizer). --synthetic-accept A accepts each draft with probability A,\n"
    "whatever the head says: the loop's speed ceiling on models whose head is meaningless.\n"
    "--repeat R runs each mode R times and keeps the fastest. --draft auto keeps what it measures\n"
    "from one generation to the next on a context (as a server does); each mode starts afresh.\n"
    "Where a mode ran one-row steps, ar_step_us splits their trunk forward into attention,\n"
    "feed-forward (router and experts, or dense FFN) and head (final norm, lm_head), each with\n"
    "its microseconds and weight read rate, and the rest (embedding, norms, residual adds);\n"
    "outside_us (plain decoding) is the time per token spent outside the forward (sampling).\n"
    "The last line times the step's routing-independent matmuls (attention, router, shared\n"
    "expert or dense FFN, lm_head) alone at 1 row and at 2 rows (a k = 1 verify).\n"
    "--membw MB reads the machine's bandwidth on the decoding threads (an MB-megabyte pass in\n"
    "each pattern of build/bench/membw, the best one; MB well above the last-level cache, 1024\n"
    "or more: on a Zen 5 VM 256 MB passes read 6-15% above 1 and 4 GB ones, partly from cache)\n"
    "before every third step of the ar mode, and pairs each reading with the second step after\n"
    "it (the first, slowed by the reading, is timed apart: settle_step/step is the ratio of the\n"
    "two medians): weight_frac is the median over the pairs of the step's weight read rate over\n"
    "the reading, so a machine whose bandwidth shifts from second to second is measured at one\n"
    "level on both sides of each ratio. membw_GB_s is the median reading (membw_lo/hi_GB_s the range),\n"
    "weight_frac_top the median over the pairs whose reading is at least 3/4 of the highest\n"
    "(pairs_top of them). Reading time is left out of tok_s.\n"
    "Under mpirun with --split, net_* give rank 0's network traffic per step and per verify cycle\n"
    "and job_net_* the whole job's per generated token (prefill included).\n"
    CLI_SPLIT_USAGE;

static const char *builtin_prompts[] = {
    "#include <stdio.h>\n#include <stdlib.h>\n\nstatic int compare(const void *a, const void *b)\n{\n",
    "The history of the city begins in the early years of the century, when",
};

typedef struct mode_result {
    char name[16];
    double tokens, seconds;
    double prefill_tokens, prefill_seconds;
    nx_gen_stats agg;
} mode_result;

static double avg(double s, int64_t n) { return n > 0 ? s / (double)n : 0.0; }

static void add_stats(nx_gen_stats *a, const nx_gen_stats *b) {
    a->n_drafts += b->n_drafts;
    a->n_drafted += b->n_drafted;
    a->n_accepted += b->n_accepted;
    for (int i = 0; i < NX_MAX_DRAFT + 2; i++) {
        a->cost_rows[i] += b->cost_rows[i];
        a->cost_rows_n[i] += b->cost_rows_n[i];
    }
    a->cost_mtp_row += b->cost_mtp_row;
    a->cost_mtp_n += b->cost_mtp_n;
    a->expert_bytes_ar += b->expert_bytes_ar;
    a->expert_bytes_verify += b->expert_bytes_verify;
    a->n_ar_steps += b->n_ar_steps;
    a->n_verify_steps += b->n_verify_steps;
    a->experts_touched_ar += b->experts_touched_ar;
    a->experts_touched_verify += b->experts_touched_verify;
    a->mtp_bytes += b->mtp_bytes;
    for (int p = 0; p < NX_PHASES; p++) {
        a->ar_phase_s[p] += b->ar_phase_s[p];
        a->ar_phase_bytes[p] += b->ar_phase_bytes[p];
    }
    for (int k = 0; k < 3; k++) {
        a->net_bytes[k] += b->net_bytes[k];
        a->net_s[k] += b->net_s[k];
        a->net_msgs[k] += b->net_msgs[k];
    }
}

/* A split model: rank 0's traffic per plain step, per verify and per verify cycle (verify and
 * drafts; KB sent + received, messages, ms waiting on the other ranks), and the whole job's bytes
 * and messages per generated token (net0: the job's counters before the mode). */
static void print_net(nx_model *m, const nx_gen_stats *a, double tokens, const double net0[2]) {
    if (a->net_msgs[0] + a->net_msgs[1] + a->net_msgs[2] == 0) return;
    if (a->n_ar_steps > 0)
        printf(" net_KB_ar_step=%.2f net_msgs_ar_step=%.1f net_ms_ar_step=%.3f", avg(a->net_bytes[0], a->n_ar_steps) / 1e3,
               avg((double)a->net_msgs[0], a->n_ar_steps), 1e3 * avg(a->net_s[0], a->n_ar_steps));
    if (a->n_drafts > 0)
        printf(" net_KB_verify=%.2f net_KB_cycle=%.2f net_msgs_cycle=%.1f net_ms_cycle=%.3f",
               avg(a->net_bytes[1], a->n_verify_steps) / 1e3, avg(a->net_bytes[1] + a->net_bytes[2], a->n_drafts) / 1e3,
               avg((double)(a->net_msgs[1] + a->net_msgs[2]), a->n_drafts), 1e3 * avg(a->net_s[1] + a->net_s[2], a->n_drafts));
    double bytes = 0, secs = 0;
    int64_t msgs = 0;
    nx_error err = {0};
    if (tokens > 0 && nx_model_net(m, &bytes, &msgs, &secs, &err) == NX_OK)
        printf(" job_net_KB_token=%.2f job_msgs_token=%.1f", (bytes - net0[0]) / tokens / 1e3,
               ((double)msgs - net0[1]) / tokens);
}

/* Where a plain step's time went: per NX_PHASE_* its microseconds and weight read rate, the
 * rest of the forward (embedding, norms, residuals), and, in plain decoding, the time between
 * forwards (sampling, bookkeeping). */
static void print_ar_split(const nx_gen_stats *a, double decode_s, bool plain) {
    static const char *const names[NX_PHASES] = {"attn", "ffn", "head"};
    const double n = (double)a->n_ar_steps, step = a->cost_rows[1] / n;
    double parts = 0;
    printf(" ar_step_us=%.2f", step * 1e6);
    for (int p = 0; p < NX_PHASES; p++) {
        const double t = a->ar_phase_s[p] / n;
        parts += t;
        printf(" %s_us=%.2f %s_GB_s=%.2f", names[p], t * 1e6, names[p],
               a->ar_phase_s[p] > 0 ? a->ar_phase_bytes[p] / a->ar_phase_s[p] / 1e9 : 0.0);
    }
    printf(" rest_us=%.2f", (step - parts) * 1e6);
    if (plain) printf(" outside_us=%.1f", (decode_s / n - step) * 1e6);
}

/* --membw: bandwidth readings taken from the token callback (one plain step per token). A
 * reading is paired with the second step after it, not the first: the step right after a
 * reading runs slower (its caches were emptied by the pass, and an idle decoding thread's core
 * was handed back; a sleep in place of the reading slows it too), so it is timed apart as the
 * settling step. Step times are kept per generation and turned into weight rates once the
 * generation's bytes per step are known. */
typedef struct bw_pairs {
    nx_model *m;
    nx_membw *b;
    double t_mark;    /* end of the last callback: the running step started there */
    int phase;        /* the running step: 0 other, 1 settling (after a reading), 2 paired */
    double reading;   /* the last reading, GB/s */
    int64_t calls;
    double reading_s; /* seconds spent reading, summed */
    /* this generation's pairs: step seconds and reading */
    double *step_s, *gen_bw;
    int n_gen;
    /* all pairs: weight rate over reading, and the reading; settling and paired step seconds */
    double *frac, *bw, *settle_s, *paired_s;
    int n, cap, n_settle, n_paired;
} bw_pairs;

static int bw_pairs_token(void *user, int32_t id, const float *probs) {
    (void)id;
    (void)probs;
    bw_pairs *P = user;
    const double t = nx_now_s();
    if (P->phase == 1 && P->n_settle < P->cap) P->settle_s[P->n_settle++] = t - P->t_mark;
    if (P->phase == 2 && P->n_gen < P->cap) {
        P->step_s[P->n_gen] = t - P->t_mark;
        P->gen_bw[P->n_gen++] = P->reading;
        if (P->n_paired < P->cap) P->paired_s[P->n_paired++] = t - P->t_mark;
    }
    P->phase = (int)(P->calls++ % 3 == 0 ? 1 : P->phase == 1 ? 2 : 0);
    if (P->phase == 1) {
        P->reading = nx_model_read_bandwidth(P->m, P->b);
        P->reading_s += nx_now_s() - t;
    }
    P->t_mark = nx_now_s();
    return 0;
}

/* Ends a generation: its pairs become weight rates at bytes_per_step. */
static void bw_pairs_close(bw_pairs *P, double bytes_per_step) {
    for (int i = 0; i < P->n_gen && P->n < P->cap; i++) {
        P->frac[P->n] = bytes_per_step / P->step_s[i] / 1e9 / P->gen_bw[i];
        P->bw[P->n++] = P->gen_bw[i];
    }
    P->n_gen = 0;
    P->phase = 0;
    P->calls = 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v; scratch copies, so the pairs stay aligned). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void bw_pairs_print(bw_pairs *P) {
    const int n = P->n;
    double *w = n ? malloc(sizeof(double) * (size_t)n * 3) : NULL;
    if (!w) {
        printf(" membw_pairs=0");
        return;
    }
    double hi = 0, lo = P->bw[0];
    int nt = 0;
    for (int i = 0; i < n; i++) hi = P->bw[i] > hi ? P->bw[i] : hi, lo = P->bw[i] < lo ? P->bw[i] : lo;
    for (int i = 0; i < n; i++) {
        w[i] = P->bw[i], w[n + i] = P->frac[i];
        if (P->bw[i] >= 0.75 * hi) w[2 * n + nt++] = P->frac[i];
    }
    printf(" membw_pairs=%d membw_GB_s=%.2f membw_lo_GB_s=%.2f membw_hi_GB_s=%.2f weight_frac=%.3f"
           " weight_frac_top=%.3f pairs_top=%d",
           n, median(w, n), lo, hi, median(w + n, n), median(w + 2 * n, nt), nt);
    if (P->n_settle && P->n_paired) /* medians sort these buffers: their order is not used again */
        printf(" settle_step/step=%.3f", median(P->settle_s, P->n_settle) / median(P->paired_s, P->n_paired));
    free(w);
}


int cli_bench(int argc, char **argv) {
    cli_opts o;
    int rc = cli_parse("bench", usage, argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    nx_model *m = cli_load_model(&o);
    if (!m) return 1;
    const nx_model_info *info = nx_model_get_info(m);
    int32_t *prompts[8] = {0};
    size_t plen[8] = {0};
    int np = 0;
    rc = 1;
    if (o.prompt || o.prompt_file || o.prompt_tokens) {
        if (!cli_prompt_ids(&o, m, &prompts[0], &plen[0])) goto done;
        np = 1;
    } else if (nx_model_tokenizer(m)) {
        for (int i = 0; i < 2; i++) {
            nx_error err = {0};
            if (nx_tokenizer_encode(nx_model_tokenizer(m), builtin_prompts[i], strlen(builtin_prompts[i]), false,
                                    &prompts[i], &plen[i], &err) != NX_OK) {
                fprintf(stderr, "nextn bench: %s\n", err.msg);
                goto done;
            }
        }
        np = 2;
    } else {
        prompts[0] = malloc(16 * sizeof(int32_t));
        for (int i = 0; i < 16; i++) prompts[0][i] = (1 + i) % info->vocab_size;
        plen[0] = 16;
        np = 1;
    }
    const int32_t n_gen = o.n_predict > 0 ? o.n_predict : 128;
    size_t maxp = 0;
    for (int i = 0; i < np; i++) maxp = plen[i] > maxp ? plen[i] : maxp;
    nx_ctx *ctx = NULL;
    nx_error err = {0};
    if (nx_ctx_new(m, (int32_t)maxp + n_gen + NX_MAX_DRAFT + 2, &ctx, &err) != NX_OK) {
        fprintf(stderr, "nextn bench: %s\n", err.msg);
        goto done;
    }
    char modes[256];
    snprintf(modes, sizeof modes, "%s", o.modes ? o.modes : "ar,1,2,3,auto");
    bw_pairs pairs = {.m = m};
    if (o.membw_mb > 0) {
        bool has_ar = false;
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", modes);
        for (char *sv = NULL, *t = strtok_r(tmp, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) has_ar |= !strcmp(t, "ar");
        if (!has_ar) {
            fprintf(stderr, "nextn bench: --membw pairs readings with plain steps: it needs the ar mode in --modes\n");
            nx_ctx_free(ctx);
            rc = 2;
            goto done;
        }
        pairs.cap = (int)(n_gen + 1) * np * o.repeat;
        pairs.b = nx_membw_new((size_t)o.membw_mb << 20);
        pairs.step_s = malloc(sizeof(double) * (size_t)pairs.cap);
        pairs.gen_bw = malloc(sizeof(double) * (size_t)pairs.cap);
        pairs.frac = malloc(sizeof(double) * (size_t)pairs.cap);
        pairs.bw = malloc(sizeof(double) * (size_t)pairs.cap);
        pairs.settle_s = malloc(sizeof(double) * (size_t)pairs.cap);
        pairs.paired_s = malloc(sizeof(double) * (size_t)pairs.cap);
        if (!pairs.b || !pairs.step_s || !pairs.gen_bw || !pairs.frac || !pairs.bw || !pairs.settle_s || !pairs.paired_s) {
            fprintf(stderr, "nextn bench: out of memory for a %d MB bandwidth buffer (--membw)\n", o.membw_mb);
            nx_ctx_free(ctx);
            goto done;
        }
    }
    mode_result res[16];
    int nres = 0;
    printf("model %s | %s | kv %s | isa %s%s | threads %s | %d prompt(s) x %d tokens | temp %.2f%s\n", cli_model_dir(&o),
           info->weight_dtype, info->kv_type, nx_kernels_isa(), o.load.act_bits != 16 ? " (int8 activations)" : "", o.threads > 0 ? "set" : "all cores", np, n_gen,
           (double)o.gen.sampling.temperature,
           o.gen.synthetic_accept >= 0 ? " | synthetic acceptance" : "");
    const double huge = nx_model_huge_share(m);
    if (huge >= 0) printf("weights_on_2MB_pages=%.2f recached_files=%d\n", huge, info->recached_files);
    for (char *save = NULL, *tokm = strtok_r(modes, ",", &save); tokm && nres < 16; tokm = strtok_r(NULL, ",", &save)) {
        nx_gen_params gp = o.gen;
        gp.max_tokens = n_gen;
        gp.ignore_eos = true;
        if (!strcmp(tokm, "ar")) gp.draft = 0;
        else if (!strcmp(tokm, "auto")) gp.draft = NX_DRAFT_AUTO;
        else {
            char *end;
            long k = strtol(tokm, &end, 10);
            if (*end || k < 1 || k > NX_MAX_DRAFT) {
                fprintf(stderr, "nextn bench: mode '%s': expected ar, auto or 1..%d\n", tokm, NX_MAX_DRAFT);
                nx_ctx_free(ctx);
                goto done;
            }
            gp.draft = (int32_t)k;
        }
        nx_ctx_reset_auto(ctx); /* each mode starts from nothing measured (auto learns within it) */
        mode_result *r = &res[nres++];
        pairs.n = pairs.n_settle = pairs.n_paired = 0; /* a mode's own pairs */
        double net0[2] = {0, 0}, nsec;
        int64_t nmsg = 0;
        nx_error nerr = {0};
        if (o.split && nx_model_net(m, &net0[0], &nmsg, &nsec, &nerr) == NX_OK) net0[1] = (double)nmsg;
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "%s", tokm);
        double best = -1;
        for (int rep = 0; rep < o.repeat; rep++) {
            mode_result cur = *r;
            for (int i = 0; i < np; i++) {
                nx_gen_stats st;
                nx_ctx_truncate(ctx, 0); /* every run prefills its whole prompt (prefill_tok_s) */
                const bool paired = pairs.b && gp.draft == 0;
                const double read_before = pairs.reading_s;
                if (nx_generate(ctx, prompts[i], plen[i], &gp, paired ? bw_pairs_token : NULL, paired ? &pairs : NULL,
                                &st, &err) != NX_OK) {
                    fprintf(stderr, "nextn bench: %s\n", err.msg);
                    nx_ctx_free(ctx);
                    goto done;
                }
                if (paired) {
                    st.t_decode -= pairs.reading_s - read_before;
                    if (st.n_ar_steps > 0)
                        bw_pairs_close(&pairs, (double)info->step_bytes_dense + st.expert_bytes_ar / (double)st.n_ar_steps);
                }
                cur.tokens += (double)(st.n_generated - 1);
                cur.seconds += st.t_decode;
                cur.prefill_tokens += (double)st.n_prompt;
                cur.prefill_seconds += st.t_prefill;
                add_stats(&cur.agg, &st);
            }
            if (best < 0 || cur.tokens / cur.seconds > best) {
                best = cur.tokens / cur.seconds;
                *r = cur;
            }
        }
        double tps = r->tokens / r->seconds;
        const nx_gen_stats *a = &r->agg;
        double ar_tps = nres > 1 && !strcmp(res[0].name, "ar") ? res[0].tokens / res[0].seconds : 0.0;
        printf("mode=%s tok_s=%.2f prefill_tok_s=%.1f", r->name, tps,
               r->prefill_seconds > 0 ? r->prefill_tokens / r->prefill_seconds : 0.0);
        {
            /* weight bytes streamed per second: dense part per trunk forward + experts touched */
            double steps = (double)(a->n_ar_steps + a->n_verify_steps);
            double bytes = steps * (double)info->step_bytes_dense + a->expert_bytes_ar + a->expert_bytes_verify;
            printf(" weight_GB_s=%.2f", bytes / r->seconds / 1e9);
        }
        if (ar_tps > 0) printf(" ratio=%.3f", tps / ar_tps);
        if (a->n_drafted > 0) {
            double acc = (double)a->n_accepted / (double)a->n_drafted;
            double tau = 1.0 + (double)a->n_accepted / (double)(a->n_drafts > 0 ? a->n_drafts : 1);
            double c1 = avg(a->cost_rows[1], a->cost_rows_n[1]);
            if (c1 == 0 && !strcmp(res[0].name, "ar")) c1 = avg(res[0].agg.cost_rows[1], res[0].agg.cost_rows_n[1]);
            double cyc = 0, kk = (double)a->n_drafted / (double)(a->n_drafts > 0 ? a->n_drafts : 1);
            int64_t nv = 0;
            for (int rr = 2; rr <= NX_MAX_DRAFT + 1; rr++) {
                cyc += a->cost_rows[rr];
                nv += a->cost_rows_n[rr];
            }
            double cm = avg(a->cost_mtp_row, a->cost_mtp_n);
            double ratio_c = c1 > 0 ? avg(cyc, nv) / c1 : 0;
            double c = c1 > 0 ? cm / c1 : 0;
            double predicted = tau / (ratio_c + kk * c);
            printf(" acceptance=%.3f tau=%.3f drafts_per_cycle=%.2f cost_verify/C1=%.3f c_mtp=%.3f predicted=%.3f", acc,
                   tau, kk, ratio_c, c, predicted);
            if (ar_tps > 0 && predicted > 0) printf(" efficiency=%.3f", (tps / ar_tps) / predicted);
            /* The byte ceiling: tokens per cycle over the weight bytes a cycle reads (verify +
             * drafts) relative to one plain step, with the AR run's bytes per step. */
            const nx_gen_stats *ar = !strcmp(res[0].name, "ar") ? &res[0].agg : NULL;
            if (ar && ar->n_ar_steps > 0 && a->n_verify_steps > 0) {
                double ar_bytes = (double)info->step_bytes_dense + ar->expert_bytes_ar / (double)ar->n_ar_steps;
                double cyc_bytes = (double)info->step_bytes_dense + a->expert_bytes_verify / (double)a->n_verify_steps +
                                   a->mtp_bytes / (double)a->n_verify_steps;
                double ceiling = tau / (cyc_bytes / ar_bytes);
                printf(" byte_ceiling=%.3f", ceiling);
                if (ar_tps > 0) printf(" of_byte_ceiling=%.3f", (tps / ar_tps) / ceiling);
            }
        }
        if (a->n_ar_steps > 0 && a->expert_bytes_ar > 0)
            printf(" expert_MB_ar=%.3f experts_ar=%.1f", avg(a->expert_bytes_ar, a->n_ar_steps) / 1e6,
                   avg(a->experts_touched_ar, a->n_ar_steps));
        if (a->n_verify_steps > 0 && a->expert_bytes_verify > 0)
            printf(" expert_MB_verify=%.3f experts_verify=%.1f", avg(a->expert_bytes_verify, a->n_verify_steps) / 1e6,
                   avg(a->experts_touched_verify, a->n_verify_steps));
        if (a->n_ar_steps > 0 && a->cost_rows_n[1] == a->n_ar_steps)
            print_ar_split(a, r->seconds, a->n_verify_steps == 0 && a->n_drafts == 0);
        if (pairs.b && gp.draft == 0) bw_pairs_print(&pairs);
        if (o.split) print_net(m, a, r->tokens + (double)o.repeat * np, net0); /* + each run's first token */
        printf("\n");
        fflush(stdout);
    }
    if (!o.split) { /* split: rank 0 would read weights of layers other ranks hold */
        /* the routing-independent matmuls of a step (attention, router, shared expert or dense
         * FFN, lm_head) at 1 row and at the 2 rows of a k = 1 verify; the two are timed in
         * alternating rounds and each keeps its best, so a shift in the machine's speed
         * between them does not land on one side of the ratio */
        double s1 = 0, s2 = 0, b1 = 0, b2 = 0;
        for (int round = 0; round < 4; round++) {
            double t1, t2;
            if (nx_model_time_dense(m, 1, 2, &t1, &b1, &err) != NX_OK ||
                nx_model_time_dense(m, 2, 2, &t2, &b2, &err) != NX_OK) {
                fprintf(stderr, "nextn bench: %s\n", err.msg);
                nx_ctx_free(ctx);
                goto done;
            }
            if (round == 0 || t1 < s1) s1 = t1;
            if (round == 0 || t2 < s2) s2 = t2;
        }
        printf("dense_step_ms=%.4f dense_GB_s=%.2f dense_verify2_ms=%.4f dense_verify2/step=%.3f dense_MB=%.1f\n",
               s1 * 1e3, b1 / s1 / 1e9, s2 * 1e3, s2 / s1, b1 / 1e6);
    }
    nx_ctx_free(ctx);
    rc = 0;
done:
    nx_membw_free(pairs.b);
    free(pairs.step_s);
    free(pairs.gen_bw);
    free(pairs.frac);
    free(pairs.bw);
    free(pairs.settle_s);
    free(pairs.paired_s);
    for (int i = 0; i < 8; i++) free(prompts[i]);
    nx_model_free(m);
    return rc;
}

/* The numbers behind a generation, printed by `nextn run --stats` and the benchmarks, with the
 * definitions of docs/design.md §7: draft acceptance rate = accepted / drafted (not the share of
 * emitted tokens that came from drafts), mean acceptance length τ = 1 + accepted / drafts. */
#include <stdio.h>

#include "nextn.h"

static double safe_div(double a, double b) { return b > 0 ? a / b : 0.0; }

/* Streamed experts, per kind of trunk step: the expert cache's hit rate, bytes read from disk
 * per step and per token, seconds waiting for reads per step. A verify reads once for the
 * tokens it accepts, so its bytes per token are divided by them (accepted drafts + 1 each). */
static void print_streaming(const nx_gen_stats *s, FILE *f) {
    static const char *const kind[2] = {"AR", "verify"};
    const double steps[2] = {(double)s->n_ar_steps, (double)s->n_verify_steps};
    const double tokens[2] = {steps[0], (double)(s->n_verify_steps + s->n_accepted)};
    if (s->cache_hits[0] + s->cache_misses[0] + s->cache_hits[1] + s->cache_misses[1] == 0) return;
    fprintf(f, "streamed experts:");
    for (int k = 0; k < 2; k++) {
        const double looks = (double)(s->cache_hits[k] + s->cache_misses[k]);
        if (steps[k] <= 0 || looks <= 0) continue;
        fprintf(f, " %s hit rate %.3f, %.2f MB read per step (%.2f MB per token), I/O wait %.3f ms per step;",
                kind[k], (double)s->cache_hits[k] / looks, s->disk_bytes[k] / steps[k] / 1e6,
                safe_div(s->disk_bytes[k], tokens[k]) / 1e6, 1e3 * s->io_wait_s[k] / steps[k]);
    }
    const double all = s->disk_bytes[0] + s->disk_bytes[1];
    const double ahead = (double)(s->ahead_reads[0] + s->ahead_reads[1]);
    fprintf(f, " %.2f MB read per generated token", safe_div(all, (double)s->n_generated) / 1e6);
    if (ahead > 0)
        fprintf(f, "; %.0f experts read ahead (pre-gated), %.1f%% of them used",
                ahead, 100.0 * (double)(s->ahead_used[0] + s->ahead_used[1]) / ahead);
    fprintf(f, "\n");
}

/* A split model: rank 0's network traffic per plain step, per verify and per verify cycle (the
 * verify and the cycle's MTP forwards), and the seconds it waited on the other ranks. */
static void print_network(const nx_gen_stats *s, FILE *f) {
    if (s->net_msgs[0] + s->net_msgs[1] + s->net_msgs[2] == 0) return;
    fprintf(f, "network (rank 0):");
    if (s->n_ar_steps > 0) {
        const double n = (double)s->n_ar_steps;
        fprintf(f, " AR step %.1f KB, %.1f messages, %.3f ms waiting on ranks;", s->net_bytes[0] / n / 1e3,
                (double)s->net_msgs[0] / n, 1e3 * s->net_s[0] / n);
    }
    if (s->n_verify_steps > 0) {
        const double n = (double)s->n_verify_steps;
        fprintf(f, " verify %.1f KB, %.1f messages, %.3f ms;", s->net_bytes[1] / n / 1e3, (double)s->net_msgs[1] / n,
                1e3 * s->net_s[1] / n);
    }
    if (s->n_drafts > 0) {
        const double n = (double)s->n_drafts;
        fprintf(f, " verify cycle (drafts + verify) %.1f KB, %.1f messages, %.3f ms;",
                (s->net_bytes[1] + s->net_bytes[2]) / n / 1e3, (double)(s->net_msgs[1] + s->net_msgs[2]) / n,
                1e3 * (s->net_s[1] + s->net_s[2]) / n);
    }
    fprintf(f, " %.1f KB per generated token\n",
            safe_div(s->net_bytes[0] + s->net_bytes[1] + s->net_bytes[2], (double)s->n_generated) / 1e3);
}

void nx_gen_stats_print(const nx_gen_stats *s, void *file) {
    FILE *f = file;
    fprintf(f, "prompt %lld tokens, prefill %.3f s (%.1f tok/s)\n", (long long)s->n_prompt,
            s->t_prefill, safe_div((double)s->n_prompt, s->t_prefill));
    fprintf(f, "generated %lld tokens, decode %.3f s (%.2f tok/s), %lld trunk forwards\n",
            (long long)s->n_generated, s->t_decode,
            safe_div((double)(s->n_generated > 0 ? s->n_generated - 1 : 0), s->t_decode), (long long)s->n_steps);
    fprintf(f, "drafts %lld, drafted %lld, accepted %lld, draft acceptance rate %.3f, mean acceptance length %.3f\n",
            (long long)s->n_drafts, (long long)s->n_drafted, (long long)s->n_accepted,
            safe_div((double)s->n_accepted, (double)s->n_drafted),
            1.0 + safe_div((double)s->n_accepted, (double)s->n_drafts));
    fprintf(f, "acceptance per position:");
    for (int i = 0; i < NX_MAX_DRAFT && s->drafted_at[i] > 0; i++)
        fprintf(f, " [%d] %lld/%lld=%.3f", i + 1, (long long)s->accepted_at[i], (long long)s->drafted_at[i],
                safe_div((double)s->accepted_at[i], (double)s->drafted_at[i]));
    fprintf(f, "\n");
    fprintf(f, "time split: draft %.3f s, trunk (AR steps + verify) %.3f s, sample/accept %.3f s\n",
            s->t_draft, s->t_verify, s->t_sample);
    if (s->n_rewinds > 0)
        fprintf(f, "recurrent state rollback: %lld rewinds over %lld verify cycles, %.3f ms and %.2f MB of state each "
                "(%.1f%% of decode time)\n", (long long)s->n_rewinds, (long long)s->n_drafts,
                1e3 * s->t_rewind / (double)s->n_rewinds, s->rewind_bytes / (double)s->n_rewinds / 1e6,
                100.0 * safe_div(s->t_rewind, s->t_decode));
    double c1 = safe_div(s->cost_rows[1], (double)s->cost_rows_n[1]);
    fprintf(f, "trunk forward cost: C(1) %s", c1 > 0 ? "" : "not measured (no plain steps)");
    if (c1 > 0) fprintf(f, "%.3f ms", c1 * 1e3);
    for (int r = 2; r <= NX_MAX_DRAFT + 1; r++)
        if (s->cost_rows_n[r] > 0) {
            double cr = s->cost_rows[r] / (double)s->cost_rows_n[r];
            fprintf(f, ", C(%d)/C(1) %.3f", r, c1 > 0 ? cr / c1 : 0.0);
        }
    double cm = safe_div(s->cost_mtp_row, (double)s->cost_mtp_n);
    fprintf(f, "; MTP forward %.3f ms (c = %.3f of C(1))\n", cm * 1e3, c1 > 0 ? cm / c1 : 0.0);
    if (s->expert_bytes_ar + s->expert_bytes_verify > 0) {
        double ar = safe_div(s->expert_bytes_ar, (double)s->n_ar_steps);
        double vf = safe_div(s->expert_bytes_verify, (double)s->n_verify_steps);
        fprintf(f, "experts per step:");
        if (s->n_ar_steps > 0)
            fprintf(f, " AR %.1f distinct, %.2f MB;", safe_div(s->experts_touched_ar, (double)s->n_ar_steps), ar / 1e6);
        if (s->n_verify_steps > 0) {
            fprintf(f, " verify %.1f distinct, %.2f MB", safe_div(s->experts_touched_verify, (double)s->n_verify_steps),
                    vf / 1e6);
            if (ar > 0) fprintf(f, " (%.2fx AR)", vf / ar);
        }
        fprintf(f, "\n");
        if (s->n_drafts > 0)
            fprintf(f, "MTP head reads %.2f MB per drafting cycle\n", s->mtp_bytes / (double)s->n_drafts / 1e6);
        fprintf(f, "top-k overlap of consecutive positions: %.3f experts per layer\n",
                safe_div(s->topk_overlap_sum, (double)s->topk_overlap_n));
    }
    print_streaming(s, f);
    print_network(s, f);
}

/* `nextn probe`: the MTP head's teacher-forced acceptance ceiling over text files, per file and
 * per chain position, so code and prose can be compared (docs/design.md §9). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nextn_tools.h"

static const char *usage =
    "usage: nextn probe [-m DIR] [--k K] [--temp T [--top-k K --top-p P --min-p M]] [--ctx W]\n"
    "                   (FILE... | --tokens IDS)\n"
    "\n"
    "For every position of each file, feeds the MTP head the trunk hidden and the true next token\n"
    "with its full context and reports how often its draft would be accepted:\n"
    "  greedy vs trunk  the draft equals the trunk's own argmax (the live greedy loop's ceiling)\n"
    "  greedy vs text   the draft equals the file's next-next token\n"
    "  E[min(p,q)]      expected residual-rule acceptance at the given temperature\n"
    "--k K probes chained drafts (positions 1..K, chained on the head's own hidden, true tokens).\n"
    "--ctx W sets the window (default 512): longer files are probed in windows of W tokens.\n"
    "--simulate-from N (with --tokens): replays the greedy k = 1 loop over the tokens after a prompt\n"
    "of N tokens and prints the acceptance that loop must reach when it feeds the head every row.\n"
    "--router-stats FILE adds the trunk's expert choices over the files to FILE (the statistics\n"
    "`inspect --memory N --router-stats FILE` plans with).\n";

static void print_result(const char *name, const nx_probe_result *r) {
    printf("%s: %lld tokens\n", name, (long long)r->n_tokens);
    for (int j = 0; j < r->k; j++) {
        double n = r->n[j] > 0 ? (double)r->n[j] : 1.0;
        printf("  position %d: n=%lld greedy vs trunk %.4f, greedy vs text %.4f", j + 1, (long long)r->n[j],
               r->hit_trunk[j] / n, r->hit_text[j] / n);
        if (r->sampled) printf(", E[min(p,q)] %.4f", r->overlap[j] / n);
        printf("\n");
    }
}

/* The greedy k = 1 loop over a text it produced itself: after the prompt's first sampled token,
 * each cycle drafts from the head row before the newest token and advances by 2 on a hit, 1 on
 * a miss; the last token is always a plain step (nx_generate never drafts past max_tokens). */
static int simulate(nx_model *m, const int32_t *ids, size_t n, int32_t window, int32_t n_prompt) {
    if ((size_t)n_prompt >= n) {
        return cli_usage_error("probe", "--simulate-from %d: no generated tokens after the prompt", n_prompt);
    }
    uint8_t *hits = malloc(n);
    nx_error err = {0};
    if (!hits || nx_probe_hits(m, ids, n, window, hits, &err) != NX_OK) {
        fprintf(stderr, "nextn probe: %s\n", hits ? err.msg : "out of memory");
        free(hits);
        return 1;
    }
    const int64_t max_tokens = (int64_t)n - n_prompt;
    int64_t gen = 1, drafted = 0, accepted = 0, L = n_prompt; /* t[L] is the newest token */
    while (gen < max_tokens) {
        if (max_tokens - gen < 2) { /* room for no draft: a plain step */
            gen++;
            L++;
            continue;
        }
        drafted++;
        if (hits[L - 1]) {
            accepted++;
            gen += 2;
            L += 2;
        } else {
            gen++;
            L++;
        }
    }
    printf("simulated greedy k=1 loop: drafted %lld, accepted %lld\n", (long long)drafted, (long long)accepted);
    free(hits);
    return 0;
}

int cli_probe(int argc, char **argv) {
    cli_opts o;
    int rc = cli_parse("probe", usage, argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if (o.n_args < 1 && !o.tokens) {
        return cli_usage_error("probe", "expected at least one FILE (or --tokens IDS)");
    }
    nx_model *m = cli_load_model(&o);
    if (!m) return 1;
    int32_t window = o.n_ctx > 0 ? o.n_ctx : 512;
    if (o.tokens) {
        int32_t *ids = NULL;
        size_t n = 0;
        char msg[256];
        nx_error err = {0};
        nx_probe_result r = {0};
        rc = 1;
        if (!cli_parse_ids(o.tokens, &ids, &n, msg, sizeof msg))
            fprintf(stderr, "nextn probe: --tokens: %s\n", msg);
        else if (nx_probe_tokens(m, ids, n, o.probe_k, window, &o.gen.sampling, &r, &err) != NX_OK)
            fprintf(stderr, "nextn probe: %s\n", err.msg);
        else {
            print_result("tokens", &r);
            rc = 0;
            if (o.simulate_from > 0) rc = simulate(m, ids, n, window, o.simulate_from);
        }
        free(ids);
        return cli_free_model(&o, m, rc);
    }
    const nx_tokenizer *tok = nx_model_tokenizer(m);
    if (!tok) {
        fprintf(stderr, "nextn probe: the model ships no tokenizer.json\n");
        nx_model_free(m);
        return 1;
    }
    nx_probe_result total = {0};
    rc = 0;
    for (int i = 0; i < o.n_args; i++) {
        size_t len = 0;
        char *text = cli_read_file(o.args[i], &len);
        if (!text) {
            fprintf(stderr, "nextn probe: cannot read %s: %s\n", o.args[i], strerror(errno));
            rc = 1;
            continue;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        nx_error err = {0};
        nx_probe_result r = {0};
        if (nx_tokenizer_encode(tok, text, len, false, &ids, &n, &err) != NX_OK ||
            nx_probe_tokens(m, ids, n, o.probe_k, window, &o.gen.sampling, &r, &err) != NX_OK) {
            fprintf(stderr, "nextn probe: %s: %s\n", o.args[i], err.msg);
            rc = 1;
        } else {
            print_result(o.args[i], &r);
            total.k = r.k;
            total.sampled = r.sampled;
            total.n_tokens += r.n_tokens;
            for (int j = 0; j < r.k; j++) {
                total.n[j] += r.n[j];
                total.hit_text[j] += r.hit_text[j];
                total.hit_trunk[j] += r.hit_trunk[j];
                total.overlap[j] += r.overlap[j];
            }
        }
        free(ids);
        free(text);
    }
    if (o.n_args > 1 && total.k > 0) print_result("all files", &total);
    return cli_free_model(&o, m, rc);
}

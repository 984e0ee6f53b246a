/* `nextn run`: generate a continuation, streaming text (or ids), then report speed and, with
 * --stats, the speculative counters. --n-samples draws independent continuations, one line
 * of ids each (used by the distribution tests). --prompt-cache keeps the prompt's rows in a
 * state file between runs (llama.cpp's option of the same name). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char *usage =
    "usage: nextn run [-m DIR] (-p TEXT | -f FILE | --prompt-tokens IDS) [options]\n"
    "\n"
    "  -m, --model DIR         checkpoint directory (default: the shipped default model)\n"
    "  -p, --prompt TEXT       prompt text      -f, --file FILE   prompt from a file\n"
    "      --prompt-tokens IDS prompt as token ids (1,2,3) for models without a tokenizer\n"
    "      --chat              wrap the prompt in the model's chat template\n"
    "  -n, --n-predict N       tokens to generate (default 128)\n"
    "      --temp T            temperature, 0 = greedy (default 0)\n"
    "      --top-k K --top-p P --min-p M\n"
    "      --repeat-penalty R --presence-penalty P --frequency-penalty F\n"
    "      --seed S            RNG seed (default 0)\n"
    "      --logit-bias ID+B   add B (in [-100, 100]) to token ID's logit; ID-B subtracts; repeatable\n"
    "      --json-object       the output is one JSON object (the mask of OpenAI's json_object mode)\n"
    "      --json-schema JSON  the output is one JSON object matching this JSON Schema (the subset of\n"
    "                          OpenAI's structured outputs; other keywords are refused by name)\n"
    "      --draft auto|N      drafts per cycle: auto (default), 0 = plain decoding, 1..8\n"
    "      --verify residual|match   acceptance rule for sampled decoding (default residual;\n"
    "                          match: seeded output independent of the draft length)\n"
    "      --draft-p-min P     stop drafting when the draft distribution's top probability < P\n"
    "      --ignore-eos        keep generating past end-of-sequence tokens\n"
    "      --print-ids         print generated token ids instead of text\n"
    "      --n-samples N       N independent continuations (seeds S, S+1, ...), one line of ids each\n"
    "      --stats             print drafts, acceptance per position, costs and expert traffic\n"
    "      --ctx N             context size (default: prompt + n + margin)\n"
    "      --prompt-cache FILE load the rows of an earlier prompt from FILE (its shared prefix with\n"
    "                          this prompt is not computed again), then save this prompt's rows to it\n"
    "      --prompt-cache-all  save the generated rows too      --prompt-cache-ro  never write FILE\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --act-bits 8|16     activations of 2-6-bit matmuls: int8 (default, as llama.cpp: each\n"
    "                          input within 1/254 of its group's largest) or int16 (finer, slower)\n"
    "      --kv-type f32|f16   KV cache elements: f32 (default, exact) or f16 (half the memory and\n"
    "                          attention reads; keys and values rounded to f16, as llama.cpp's cache)\n"
    "      --max-memory N      keep at most N bytes of weights in memory (K/M/G suffixes): all but the\n"
    "                          routed experts stay resident, the experts stream from disk into a cache\n"
    "      --mlock             read the resident weights in at load and lock them in memory\n"
    "      --router-stats FILE add this run's expert choices to FILE (router statistics, which\n"
    "                          inspect --memory N --router-stats FILE plans with)\n"
    "      --no-mtp            ignore the MTP head\n"
    "      --draft-vocab N     the head drafts over token ids < N only (cheaper drafts, still exact)\n"
    "      --mtp-hidden post|pre  --mtp-concat embed-first|hidden-first  --mtp-recycle normed|raw\n"
    "      --mtp-hnorm on|off  --mtp-window N  --mtp-rope-theta T   MTP wiring overrides\n"
    CLI_SPLIT_USAGE;

typedef struct stream {
    nx_detok *detok;
    bool ids;
    bool first;
    FILE *out;
} stream;

static int on_token(void *user, int32_t id, const float *probs) {
    (void)probs;
    stream *s = user;
    if (s->ids) {
        fprintf(s->out, s->first ? "%d" : " %d", id);
        s->first = false;
        fflush(s->out);
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    if (nx_detok_push(s->detok, id, &text, &len, NULL) == NX_OK && len) {
        fwrite(text, 1, len, s->out);
        fflush(s->out);
    }
    free(text);
    return 0;
}

int cli_run(int argc, char **argv) {
    cli_opts o;
    int rc = cli_parse("run", usage, argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if (o.n_args) {
        return cli_usage_error("run", "unexpected argument '%s'", o.args[0]);
    }
    nx_model *m = cli_load_model(&o);
    if (!m) return 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    nx_ctx *ctx = NULL;
    nx_detok *detok = NULL;
    nx_json_vocab *jv = NULL;
    nx_json_schema *schema = NULL;
    rc = 1;
    if (!cli_prompt_ids(&o, m, &ids, &n_ids)) goto done;
    if (n_ids == 0) {
        fprintf(stderr, "nextn run: the prompt is empty\n");
        goto done;
    }
    o.gen.max_tokens = o.n_predict >= 0 ? o.n_predict : 128;
    const nx_model_info *info = nx_model_get_info(m);
    int64_t want = o.n_ctx > 0 ? o.n_ctx : (int64_t)n_ids + o.gen.max_tokens + NX_MAX_DRAFT + 2;
    if (info->max_positions > 0 && want > info->max_positions) want = info->max_positions;
    nx_error err = {0};
    if (nx_ctx_new(m, (int32_t)want, &ctx, &err) != NX_OK) {
        fprintf(stderr, "nextn run: %s\n", err.msg);
        goto done;
    }
    if (o.json_object) {
        if (nx_json_vocab_for_model(m, &jv, &err) != NX_OK) {
            fprintf(stderr, "nextn run: --json-object: %s\n", err.msg);
            goto done;
        }
        o.gen.sampling.json = jv;
        if (o.json_schema && nx_json_schema_new(o.json_schema, strlen(o.json_schema), &schema, &err) != NX_OK) {
            fprintf(stderr, "nextn run: --json-schema: %s\n", err.msg);
            goto done;
        }
        o.gen.sampling.json_schema = schema;
    }
    if (o.prompt_cache && access(o.prompt_cache, F_OK) == 0) {
        int32_t n_loaded = 0;
        if (nx_state_load(ctx, o.prompt_cache, &n_loaded, NULL, &err) != NX_OK)
            fprintf(stderr, "nextn run: --prompt-cache: %s; starting from an empty context\n", err.msg);
        else if (!o.quiet)
            fprintf(stderr, "prompt cache: %d rows loaded from %s\n", n_loaded, o.prompt_cache);
    }
    const bool ids_out = o.print_ids || o.n_samples > 1 || !nx_model_tokenizer(m);
    for (int32_t s = 0; s < o.n_samples; s++) {
        stream st = {NULL, ids_out, true, stdout};
        if (!ids_out && nx_detok_new(nx_model_tokenizer(m), false, &detok, &err) != NX_OK) {
            fprintf(stderr, "nextn run: %s\n", err.msg);
            goto done;
        }
        st.detok = detok;
        nx_gen_params gp = o.gen;
        gp.sampling.seed = o.gen.sampling.seed + (uint64_t)s;
        nx_gen_stats stats;
        if (nx_generate(ctx, ids, n_ids, &gp, on_token, &st, &stats, &err) != NX_OK) {
            fprintf(stderr, "\nnextn run: %s\n", err.msg);
            goto done;
        }
        if (detok) {
            char *tail = NULL;
            size_t len = 0;
            if (nx_detok_flush(detok, &tail, &len, NULL) == NX_OK && len) fwrite(tail, 1, len, stdout);
            free(tail);
            nx_detok_free(detok);
            detok = NULL;
        }
        fputc('\n', stdout);
        fflush(stdout);
        if (o.n_samples == 1 && !o.quiet) {
            char cached[48] = "";
            if (stats.n_cached > 0) snprintf(cached, sizeof cached, " (%lld cached)", (long long)stats.n_cached);
            fprintf(stderr, "prefill: %lld tokens%s, %.1f tok/s | decode: %lld tokens, %.2f tok/s\n",
                    (long long)stats.n_prompt, cached,
                    stats.t_prefill > 0 ? (double)(stats.n_prompt - stats.n_cached) / stats.t_prefill : 0.0,
                    (long long)stats.n_generated,
                    stats.t_decode > 0 && stats.n_generated > 1 ? (double)(stats.n_generated - 1) / stats.t_decode : 0.0);
        }
        if (o.stats) nx_gen_stats_print(&stats, stderr);
        if (o.stats && o.split) cli_split_print_net(m, (double)stats.n_generated, stderr);
    }
    if (o.prompt_cache && !o.prompt_cache_ro) {
        int32_t n_saved = 0;
        if (nx_state_save(ctx, o.prompt_cache, o.prompt_cache_all ? -1 : (int32_t)n_ids, &n_saved, NULL, &err) !=
            NX_OK) {
            fprintf(stderr, "nextn run: --prompt-cache: %s\n", err.msg);
            goto done;
        }
        if (!o.quiet) fprintf(stderr, "prompt cache: %d rows saved to %s\n", n_saved, o.prompt_cache);
    }
    rc = 0;
done:
    nx_detok_free(detok);
    nx_json_vocab_free(jv);
    nx_json_schema_free(schema);
    nx_ctx_free(ctx);
    free(ids);
    return cli_free_model(&o, m, rc);
}

/* `nextn eval` (logits as .npy for parity checks), `tokenize`, `detokenize` and `inspect`. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nextn_tools.h"

static const char *usage_eval =
    "usage: nextn eval [-m DIR] --tokens IDS --logits OUT.npy [--mtp-logits OUT2.npy]\n"
    "\n"
    "Teacher-forced forward over the token ids. Writes float32 trunk logits [T, vocab] and, with\n"
    "--mtp-logits, the MTP head's logits [T-1, vocab] (row p: trunk hidden at p with token p+1,\n"
    "at position p).\n";

int cli_eval(int argc, char **argv) {
    cli_opts o;
    int rc = cli_parse("eval", usage_eval, argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if (!o.tokens || (!o.logits_out && !o.mtp_logits_out)) {
        return cli_usage_error("eval", "needs --tokens and --logits and/or --mtp-logits");
    }
    int32_t *ids = NULL;
    size_t n = 0;
    char msg[256];
    if (!cli_parse_ids(o.tokens, &ids, &n, msg, sizeof msg) || n == 0) {
        fprintf(stderr, "nextn eval: --tokens: %s\n", n == 0 ? "empty" : msg);
        free(ids);
        return 2;
    }
    nx_model *m = cli_load_model(&o);
    if (!m) {
        free(ids);
        return 1;
    }
    nx_ctx *ctx = NULL;
    float *logits = NULL, *mlogits = NULL;
    nx_error err = {0};
    const int64_t V = nx_model_get_info(m)->vocab_size;
    rc = 1;
    if (nx_ctx_new(m, (int32_t)n, &ctx, &err) != NX_OK) goto fail;
    logits = malloc(sizeof(float) * (size_t)V * n);
    mlogits = malloc(sizeof(float) * (size_t)V * n);
    if (!logits || !mlogits) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto fail;
    }
    if (nx_ctx_eval(ctx, ids, (int32_t)n, 0, logits, &err) != NX_OK) goto fail;
    if (o.logits_out) {
        int64_t shape[2] = {(int64_t)n, V};
        if (nx_npy_write_f32(o.logits_out, logits, 2, shape, &err) != NX_OK) goto fail;
    }
    if (o.mtp_logits_out) {
        if (n < 2) {
            snprintf(err.msg, sizeof err.msg, "--mtp-logits needs at least 2 tokens");
            goto fail;
        }
        if (nx_ctx_eval_mtp(ctx, ids, (int32_t)n, mlogits, &err) != NX_OK) goto fail;
        int64_t shape[2] = {(int64_t)n - 1, V};
        if (nx_npy_write_f32(o.mtp_logits_out, mlogits, 2, shape, &err) != NX_OK) goto fail;
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "nextn eval: %s\n", err.msg);
done:
    free(logits);
    free(mlogits);
    free(ids);
    nx_ctx_free(ctx);
    nx_model_free(m);
    return rc;
}

static const char *usage_tokenize =
    "usage: nextn tokenize [-m DIR] TEXT\n"
    "Prints the token ids of TEXT on one line, space-separated (special-token strings in TEXT\n"
    "become their ids).\n";

int cli_tokenize(int argc, char **argv) {
    cli_opts o;
    int rc = cli_parse("tokenize", usage_tokenize, argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if (o.n_args != 1) {
        return cli_usage_error("tokenize", "expected one TEXT argument");
    }
    o.load.no_mtp = true;
    o.quiet = true;
    nx_model *m = cli_load_model(&o);
    if (!m) return 1;
    const nx_tokenizer *tok = nx_model_tokenizer(m);
    nx_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    rc = 1;
    if (!tok)
        fprintf(stderr, "nextn tokenize: the model ships no tokenizer.json\n");
    else if (nx_tokenizer_encode(tok, o.args[0], strlen(o.args[0]), true, &ids, &n, &err) != NX_OK)
        fprintf(stderr, "nextn tokenize: %s\n", err.msg);
    else {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        rc = 0;
    }
    free(ids);
    nx_model_free(m);
    return rc;
}

static const char *usage_detokenize =
    "usage: nextn detokenize [-m DIR] IDS\n"
    "Prints the text of the token ids (space- or comma-separated).\n";

int cli_detokenize(int argc, char **argv) {
    cli_opts o;
    int rc = cli_parse("detokenize", usage_detokenize, argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if (o.n_args < 1) {
        return cli_usage_error("detokenize", "expected token ids");
    }
    /* ids may come as several arguments */
    size_t total = 1;
    for (int i = 0; i < o.n_args; i++) total += strlen(o.args[i]) + 1;
    char *joined = calloc(total, 1);
    for (int i = 0; i < o.n_args; i++) {
        strcat(joined, o.args[i]);
        strcat(joined, " ");
    }
    int32_t *ids = NULL;
    size_t n = 0;
    char msg[256];
    if (!cli_parse_ids(joined, &ids, &n, msg, sizeof msg)) {
        fprintf(stderr, "nextn detokenize: %s\n", msg);
        free(joined);
        return 2;
    }
    free(joined);
    o.load.no_mtp = true;
    o.quiet = true;
    nx_model *m = cli_load_model(&o);
    if (!m) {
        free(ids);
        return 1;
    }
    const nx_tokenizer *tok = nx_model_tokenizer(m);
    nx_error err = {0};
    char *text = NULL;
    rc = 1;
    if (!tok)
        fprintf(stderr, "nextn detokenize: the model ships no tokenizer.json\n");
    else if (nx_tokenizer_decode(tok, ids, n, false, &text, &err) != NX_OK)
        fprintf(stderr, "nextn detokenize: %s\n", err.msg);
    else {
        printf("%s\n", text);
        rc = 0;
    }
    free(text);
    free(ids);
    nx_model_free(m);
    return rc;
}

static const char *usage_inspect =
    "usage: nextn inspect [-m DIR] [--json] [--memory N [--router-stats FILE]]\n"
    "Describes a checkpoint: family, layout, dtypes/quantization, the MTP head (inline, sidecar,\n"
    "none), parameters total and active per token, and the memory a context needs. Reads only the\n"
    "headers and the small tensors it checks, never the whole weights.\n"
    "  --memory N   the residency plan under --max-memory N (K/M/G suffixes): what stays resident,\n"
    "               the expert cache, the expected hit rate and bytes read from disk per token\n"
    "  --router-stats FILE  the expectations from these router statistics (read, never written)\n";

static void human(double bytes, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, n, "%.2f %s", bytes, u[i]);
}

#define B(x) ((x) ? "true" : "false")

/* The residency plan under --memory N (docs/design.md, "Bigger than memory"). */
static void print_plan(const nx_model_info *in, uint64_t cap) {
    char cb[32], rb[32], eb[32], sb[32], db[32];
    human((double)cap, cb, sizeof cb);
    human((double)in->resident_bytes, rb, sizeof rb);
    human((double)in->routed_expert_bytes, eb, sizeof eb);
    human((double)in->cache_bytes, sb, sizeof sb);
    human(in->expected_disk_bytes_per_token, db, sizeof db);
    if (in->cache_slots == 0) {
        printf("residency     %s cap: every weight fits, nothing streams\n", cb);
        return;
    }
    printf("residency     %s cap: %s resident (all but the routed experts), %lld routed experts (%s) stream "
           "through a cache of %lld (%s)\n", cb, rb, (long long)in->n_routed_experts, eb, (long long)in->cache_slots, sb);
    printf("disk reads    expected hit rate %.3f (%s), %s read per token\n", in->expected_hit_rate,
           in->plan_from_stats ? "router statistics" : "uniform routing", db);
}

int cli_inspect(int argc, char **argv) {
    cli_opts o;
    int rc = cli_parse("inspect", usage_inspect, argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    o.quiet = true;
    o.router_stats_ro = true;
    o.load.prefault = NX_PREFAULT_NEVER;
    nx_model *m = cli_load_model(&o);
    if (!m) return 1;
    const nx_model_info *in = nx_model_get_info(m);
    int64_t ctx = in->max_positions > 0 && in->max_positions < 4096 ? in->max_positions : 4096;
    double mem = (double)in->weight_bytes + (double)in->kv_bytes_per_token * (double)ctx + (double)in->linear_state_bytes;
    if (o.json) {
        printf("{\"family\":\"%s\",\"layout\":\"%s\",\"dtype\":\"%s\",\"mtp\":\"%s\",\"vocab_size\":%d,"
               "\"hidden_size\":%d,\"layers\":%d,\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"experts\":%d,"
               "\"top_k\":%d,\"mtp_experts\":%d,\"params\":%llu,\"params_active\":%llu,\"params_mtp\":%llu,"
               "\"weight_bytes\":%llu,\"kv_bytes_per_token\":%llu,\"kv_type\":\"%s\",\"tokenizer\":%s,",
               in->family, in->layout, in->weight_dtype, in->mtp, in->vocab_size, in->hidden_size, in->n_layers,
               in->n_heads, in->n_kv_heads, in->head_dim, in->n_experts, in->top_k, in->mtp_n_experts,
               (unsigned long long)in->n_params, (unsigned long long)in->n_params_active,
               (unsigned long long)in->n_params_mtp, (unsigned long long)in->weight_bytes,
               (unsigned long long)in->kv_bytes_per_token, in->kv_type, nx_model_tokenizer(m) ? "true" : "false");
        printf("\"family_name\":\"%s\",\"rotary_dim\":%d,\"rope\":\"%s\",\"attn_bias\":%s,\"qk_norm\":%s,"
               "\"router\":\"%s\",\"n_group\":%d,\"topk_group\":%d,\"norm_topk_prob\":%s,\"routed_scaling\":%g,"
               "\"shared_experts\":%d,\"dense_layers\":%d,\"mtp_concat\":\"%s\",\"mtp_recycle\":\"%s\","
               "\"mtp_zero_pos0\":%s,\"mtp_embed\":\"%s\",\"mtp_head\":\"%s\",",
               in->family_name, in->rotary_dim, in->rope, B(in->attn_bias), B(in->qk_norm), in->router, in->n_group,
               in->topk_group, B(in->norm_topk_prob), (double)in->routed_scaling, in->n_shared_experts,
               in->n_dense_layers, in->mtp_concat, in->mtp_recycle, B(in->mtp_zero_pos0), in->mtp_embed,
               in->mtp_head);
        printf("\"layer_types\":{\"linear_attention\":%d,\"full_attention\":%d},\"linear_state_bytes\":%llu,",
               in->n_linear_layers, in->n_layers - in->n_linear_layers, (unsigned long long)in->linear_state_bytes);
        printf("\"attention\":\"%s\",\"rope_scaling\":\"%s\",\"q_lora_rank\":%d,\"kv_lora_rank\":%d,"
               "\"qk_nope_head_dim\":%d,\"qk_rope_head_dim\":%d,\"v_head_dim\":%d,\"kv_bytes_per_token_expanded\":%llu,",
               in->attention, in->rope_scaling, in->q_lora_rank, in->kv_lora_rank, in->qk_nope_head_dim,
               in->qk_rope_head_dim, in->v_head_dim, (unsigned long long)in->kv_bytes_per_token_expanded);
        printf("\"residency\":{\"max_memory\":%llu,\"resident_bytes\":%llu,\"routed_expert_bytes\":%llu,"
               "\"routed_experts\":%lld,\"cache_slots\":%lld,\"cache_bytes\":%llu,\"expected_hit_rate\":%.4f,"
               "\"disk_bytes_per_token\":%.0f,\"from_router_stats\":%s}}\n",
               (unsigned long long)o.load.max_memory, (unsigned long long)in->resident_bytes,
               (unsigned long long)in->routed_expert_bytes, (long long)in->n_routed_experts,
               (long long)in->cache_slots, (unsigned long long)in->cache_bytes, in->expected_hit_rate,
               in->expected_disk_bytes_per_token, B(in->plan_from_stats));
    } else {
        char wb[32], kb[32], mb[32];
        human((double)in->weight_bytes, wb, sizeof wb);
        human((double)in->kv_bytes_per_token, kb, sizeof kb);
        human(mem, mb, sizeof mb);
        printf("model         %s\n", cli_model_dir(&o));
        printf("family        %s, %s (layout: %s)\n", in->family, in->family_name, in->layout);
        printf("weights       %s, %s mapped\n", in->weight_dtype, wb);
        printf("shape         vocab %d, hidden %d, %d layers, %d heads / %d kv heads x %d\n", in->vocab_size,
               in->hidden_size, in->n_layers, in->n_heads, in->n_kv_heads, in->head_dim);
        if (in->kv_lora_rank)
            printf("attention     latent (MLA): q LoRA %d, kv latent %d, heads of %d nope + %d rope dims, values "
                   "%d; rope %s%s\n", in->q_lora_rank, in->kv_lora_rank, in->qk_nope_head_dim, in->qk_rope_head_dim,
                   in->v_head_dim, in->rope, strcmp(in->rope_scaling, "none") ? " + yarn" : "");
        else if (in->n_linear_layers) {
            char sb[32];
            human((double)in->linear_state_bytes, sb, sizeof sb);
            printf("attention     hybrid: %d Gated DeltaNet layers (recurrent state %s per sequence), %d gated "
                   "attention layers, rope %s on %d of %d dims\n", in->n_linear_layers, sb,
                   in->n_layers - in->n_linear_layers, in->rope, in->rotary_dim, in->head_dim);
        } else
            printf("attention     rope %s%s on %d of %d dims, q/k/v bias %s, qk-norm %s\n", in->rope,
                   strcmp(in->rope_scaling, "none") ? " + yarn" : "", in->rotary_dim, in->head_dim,
                   in->attn_bias ? "yes" : "no", in->qk_norm ? "yes" : "no");
        printf("experts       %d routed, top-%d (MTP layer: %d), %d shared, %d dense layers\n", in->n_experts,
               in->top_k, in->mtp_n_experts, in->n_shared_experts, in->n_dense_layers);
        printf("router        %s, groups %d keep %d, norm_topk_prob %s, scaling %g\n", in->router, in->n_group,
               in->topk_group, in->norm_topk_prob ? "yes" : "no", (double)in->routed_scaling);
        printf("parameters    %.3f M total, %.3f M active per token, MTP head %.3f M\n", in->n_params / 1e6,
               in->n_params_active / 1e6, in->n_params_mtp / 1e6);
        printf("mtp head      %s\n", in->mtp);
        printf("mtp wiring    concat [%s], chained drafts get the %s hidden, embedding at position 0 %s, "
               "embedding %s, head %s\n", in->mtp_concat, in->mtp_recycle, in->mtp_zero_pos0 ? "zeroed" : "kept",
               in->mtp_embed, in->mtp_head);
        printf("tokenizer     %s\n", nx_model_tokenizer(m) ? "tokenizer.json" : "none");
        printf("chat template %s\n", nx_model_chat_template(m) ? "yes" : "no");
        if (in->kv_bytes_per_token_expanded != in->kv_bytes_per_token) {
            char xb[32];
            human((double)in->kv_bytes_per_token_expanded, xb, sizeof xb);
            printf("kv cache      %s per token (%s; full keys and values would take %s)\n", kb, in->kv_type, xb);
        } else {
            printf("kv cache      %s per token (%s)\n", kb, in->kv_type);
        }
        printf("memory        %s for a %lld-token context\n", mb, (long long)ctx);
        if (o.load.max_memory) print_plan(in, o.load.max_memory);
    }
    nx_model_free(m);
    return 0;
}

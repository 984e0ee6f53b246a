/* `nextn convert` and `nextn graft`: option parsing, the progress bar (only on a terminal),
 * notes and the summary line around nx_convert / nx_graft (converter.c). */
#include "convert.h"

#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "converter.h"

static const char *usage_convert =
    "usage: nextn convert SRC DST [--bits B] [--group-size G] [--mtp-bits B2] [--mtp-group-size G2]\n"
    "                     [--keep PATTERN=SPEC ...] [--no-mtp] [--shard-size GB] [--force] [--quiet]\n"
    "\n"
    "Converts a hy_v3, glm4_moe, glm4_moe_lite, deepseek_v3, qwen3_5_moe or qwen3_next checkpoint\n"
    "(HF/Tencent or MLX layout; bf16/f16/f32, MLX affine quantized, or FP8 E4M3 with block scales as\n"
    "DeepSeek ships it) into an MLX-layout affine-quantized one as mlx-lm writes it: stacked\n"
    "switch_mlp experts (fused gate_up_proj split), latent attention's kv_b_proj split per head into\n"
    "embed_q (key half, transposed) and unembed_out (value half), the Gated-DeltaNet hybrids' norms\n"
    "stored as 1 + w and conv1d as [C, K, 1], a vision-language wrapper's language model under\n"
    "language_model. (its vision tower dropped), a `quantization` block with per-module overrides\n"
    "in config.json, model.safetensors (or shards of at most --shard-size GB, default 5) and\n"
    "model.safetensors.index.json. FP8 weights are dequantized with their weight_scale_inv blocks\n"
    "(float: bf16, as mlx-lm).\n"
    "\n"
    "  --bits B            trunk bits: 2, 3, 4, 5, 6 or 8 (default 4)\n"
    "  --group-size G      32, 64 or 128 (default 64)\n"
    "  --mtp-bits B2       quantize every module of the MTP head at B2 bits; by default the head is\n"
    "                      kept more precise than the trunk: 8-bit, with its input projection\n"
    "                      (eh_proj, Qwen's mtp.fc) in its float dtype\n"
    "  --mtp-group-size G2 group of the head (default: the trunk's)\n"
    "  --keep PATTERN=SPEC precision of the modules whose path (post-sanitize MLX name without\n"
    "                      .weight) matches the glob PATTERN: bf16, f16, f32 or float (as stored)\n"
    "                      keep it unquantized, B or B:G quantize it. Repeatable; the last match wins.\n"
    "                      e.g. --keep 'mtp.*=bf16'  --keep '*.self_attn.*=8'  --keep '*=bf16'\n"
    "  --no-mtp            drop the MTP head (a headless checkpoint)\n"
    "  --force             replace the model files of an existing DST\n"
    "  --quiet             no notes\n"
    "\n"
    "The router gate follows the family's mlx-lm recipe (hy_v3, qwen3_5_moe, qwen3_next: 8-bit group\n"
    "64, Qwen's shared_expert_gate too; the others: float); norms, expert_bias, conv1d, A_log and\n"
    "dt_bias stay float; a module whose input dim the group does not divide stays float (as mlx-lm\n"
    "does). The head goes to model-mtp.safetensors.\n";

static const char *usage_graft =
    "usage: nextn graft BASE HEAD_SOURCE [-o DST] [--bits B [--group-size G] | --keep-dtype]\n"
    "                   [--keep PATTERN=SPEC ...] [--force] [--quiet]\n"
    "\n"
    "Adds (or replaces) the MTP head of checkpoint BASE with the head of HEAD_SOURCE, a checkpoint of\n"
    "the same family in any layout, written as model-mtp.safetensors into DST (default: BASE, in\n"
    "place). The head may have another expert count than the trunk. config.json and the index are\n"
    "updated.\n"
    "\n"
    "  --bits B, --group-size G   quantize the head at B bits (router 8-bit g64)\n"
    "  --keep-dtype               copy the head's tensors as stored\n"
    "  (neither: on a quantized BASE the head is 8-bit with eh_proj / fc float, else copied as stored)\n"
    "  --keep PATTERN=SPEC        per-module precision, as for `nextn convert`\n"
    "  --force                    replace the model files of an existing DST\n";

enum { O_BITS = 1000, O_GROUP, O_MTP_BITS, O_MTP_GROUP, O_KEEP, O_NO_MTP, O_SHARD, O_FORCE, O_QUIET, O_KEEP_DTYPE };

static const struct option opts[] = {
    {"bits", required_argument, 0, O_BITS},
    {"group-size", required_argument, 0, O_GROUP},
    {"mtp-bits", required_argument, 0, O_MTP_BITS},
    {"mtp-group-size", required_argument, 0, O_MTP_GROUP},
    {"keep", required_argument, 0, O_KEEP},
    {"no-mtp", no_argument, 0, O_NO_MTP},
    {"shard-size", required_argument, 0, O_SHARD},
    {"force", no_argument, 0, O_FORCE},
    {"quiet", no_argument, 0, O_QUIET},
    {"keep-dtype", no_argument, 0, O_KEEP_DTYPE},
    {"output", required_argument, 0, 'o'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* ================================================================ progress and notes */

typedef struct ui {
    const char *cmd;
    bool tty, quiet, drawn;
    double t0, last;
} ui;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_progress(void *user, uint64_t done, uint64_t total) {
    ui *u = user;
    if (!u->tty || total == 0) return;
    double t = now();
    if (done < total && t - u->last < 0.1) return;
    u->last = t;
    double f = (double)done / (double)total, el = t - u->t0;
    char eta[32] = "--:--";
    if (f > 0.01 && done < total) {
        long s = (long)(el / f - el + 0.5);
        snprintf(eta, sizeof eta, "%ld:%02ld", s / 60, s % 60);
    } else if (done >= total) {
        snprintf(eta, sizeof eta, "0:00");
    }
    char bar[31];
    int fill = (int)(f * 30.0);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r%s [%s] %3.0f%%  %.2f / %.2f GB  ETA %s ", u->cmd, bar, f * 100.0, (double)done / 1e9,
            (double)total / 1e9, eta);
    u->drawn = true;
}

static void clear_bar(ui *u) {
    if (u->drawn) fprintf(stderr, "\r%*s\r", 79, "");
    u->drawn = false;
}

static void on_note(void *user, const char *msg) {
    ui *u = user;
    if (u->quiet) return;
    clear_bar(u);
    fprintf(stderr, "nextn %s: note: %s\n", u->cmd, msg);
}

/* ================================================================ option values */

static bool parse_int(const char *s, int lo, int hi, int *out) {
    long long v;
    if (!cli_parse_int(s, lo, hi, &v)) return false;
    *out = (int)v;
    return true;
}

/* "PATTERN=SPEC" → rule; SPEC is bf16 | f16 | f32 | float | B | B:G. */
static bool parse_rule(char *arg, nx_quant_rule *r) {
    char *eq = strrchr(arg, '=');
    if (!eq || eq == arg) return false;
    *eq = 0;
    const char *spec = eq + 1;
    memset(r, 0, sizeof *r);
    r->pattern = arg;
    r->dtype = NX_DTYPE_COUNT;
    if (!strcmp(spec, "bf16")) r->dtype = NX_DTYPE_BF16;
    else if (!strcmp(spec, "f16")) r->dtype = NX_DTYPE_F16;
    else if (!strcmp(spec, "f32")) r->dtype = NX_DTYPE_F32;
    else if (!strcmp(spec, "float")) r->dtype = NX_DTYPE_COUNT;
    else {
        char b[16];
        const char *colon = strchr(spec, ':');
        size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
        if (n == 0 || n >= sizeof b) return false;
        memcpy(b, spec, n);
        b[n] = 0;
        if (!parse_int(b, 2, 8, &r->bits) || r->bits == 7) return false;
        if (colon && (!parse_int(colon + 1, 32, 128, &r->group) || (r->group != 32 && r->group != 64 && r->group != 128)))
            return false;
    }
    return true;
}

typedef struct args {
    int bits, group, mtp_bits, mtp_group;
    bool bits_set, group_set, no_mtp, force, quiet, keep_dtype;
    double shard_gb;
    const char *out;
    nx_quant_rule *rules;
    size_t n_rules;
    const char *pos[2];
    int n_pos;
} args;

/* Returns 0 on success, 1 after --help, 2 on a bad option (message printed). */
static int parse(const char *cmd, const char *usage, int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->bits = 4;
    a->group = 64;
    optind = 1;
    opterr = 0;
    int c;
#define BAD(...) return cli_usage_error(cmd, __VA_ARGS__)
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case O_BITS:
            if (!parse_int(optarg, 2, 8, &a->bits) || a->bits == 7) BAD("--bits %s: expected 2, 3, 4, 5, 6 or 8", optarg);
            a->bits_set = true;
            break;
        case O_GROUP:
            if (!parse_int(optarg, 32, 128, &a->group) || (a->group != 32 && a->group != 64 && a->group != 128))
                BAD("--group-size %s: expected 32, 64 or 128", optarg);
            a->group_set = true;
            break;
        case O_MTP_BITS:
            if (!parse_int(optarg, 2, 8, &a->mtp_bits) || a->mtp_bits == 7)
                BAD("--mtp-bits %s: expected 2, 3, 4, 5, 6 or 8", optarg);
            break;
        case O_MTP_GROUP:
            if (!parse_int(optarg, 32, 128, &a->mtp_group) ||
                (a->mtp_group != 32 && a->mtp_group != 64 && a->mtp_group != 128))
                BAD("--mtp-group-size %s: expected 32, 64 or 128", optarg);
            break;
        case O_KEEP: {
            nx_quant_rule *r = realloc(a->rules, (a->n_rules + 1) * sizeof *r);
            if (!r) BAD("out of memory");
            a->rules = r;
            if (!parse_rule(optarg, &a->rules[a->n_rules]))
                BAD("--keep %s: expected PATTERN=SPEC with SPEC bf16, f16, f32, float, BITS or BITS:GROUP", optarg);
            a->n_rules++;
            break;
        }
        case O_NO_MTP: a->no_mtp = true; break;
        case O_SHARD: {
            char *end;
            errno = 0;
            a->shard_gb = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(a->shard_gb > 0.0 && a->shard_gb < 1e6))
                BAD("--shard-size %s: expected a size in GB", optarg);
            break;
        }
        case O_FORCE: a->force = true; break;
        case O_QUIET: a->quiet = true; break;
        case O_KEEP_DTYPE: a->keep_dtype = true; break;
        case 'o': a->out = optarg; break;
        case 'h': fputs(usage, stdout); return 1;
        default:
            if (optopt >= 1000 || (optopt > 0 && optopt < 256 && optopt == 'o')) BAD("option %s needs a value", argv[optind - 1]);
            BAD("unknown option %s", argv[optind - 1]);
        }
    }
    for (int i = optind; i < argc; i++) {
        if (a->n_pos == 2) BAD("unexpected argument %s", argv[i]);
        a->pos[a->n_pos++] = argv[i];
    }
    return 0;
#undef BAD
}

static void summary(const char *cmd, const char *dst, const nx_convert_stats *s, double secs) {
    char head[96] = "no MTP head";
    if (s->has_mtp) snprintf(head, sizeof head, "MTP head (%d experts) in model-mtp.safetensors", s->mtp_experts);
    fprintf(stderr,
            "nextn %s: wrote %s: %lld tensors (%lld modules quantized, %lld float), %d file%s, %s; "
            "%.1f MB -> %.1f MB in %.1f s\n",
            cmd, dst, (long long)s->n_tensors, (long long)s->n_quantized, (long long)s->n_float, s->n_files,
            s->n_files == 1 ? "" : "s", head, (double)s->src_bytes / 1e6, (double)s->dst_bytes / 1e6, secs);
}

/* ================================================================ commands */

int cli_convert(int argc, char **argv) {
    args a;
    int rc = parse("convert", usage_convert, argc, argv, &a);
    if (rc) {
        free(a.rules);
        return rc == 1 ? 0 : rc;
    }
    if (a.n_pos != 2 || a.out || a.keep_dtype) {
        fprintf(stderr, "nextn convert: %s\n(see `nextn convert --help`)\n",
                a.n_pos != 2 ? "needs SRC and DST" : "-o and --keep-dtype belong to `nextn graft`");
        free(a.rules);
        return 2;
    }
    ui u = {.cmd = "convert", .tty = isatty(2), .quiet = a.quiet, .t0 = now()};
    nx_convert_opts o;
    nx_convert_opts_default(&o);
    o.bits = a.bits;
    o.group = a.group;
    o.mtp_bits = a.mtp_bits;
    o.mtp_group = a.mtp_group;
    o.no_mtp = a.no_mtp;
    o.rules = a.rules;
    o.n_rules = a.n_rules;
    o.shard_bytes = a.shard_gb > 0 ? (uint64_t)(a.shard_gb * 1e9) : 0;
    o.force = a.force;
    o.hooks = (nx_convert_hooks){.progress = on_progress, .note = on_note, .user = &u};
    nx_convert_stats st;
    nx_error err = {0};
    nx_status s = nx_convert(a.pos[0], a.pos[1], &o, &st, &err);
    clear_bar(&u);
    free(a.rules);
    if (s != NX_OK) {
        fprintf(stderr, "nextn convert: %s\n", err.msg);
        return 1;
    }
    summary("convert", a.pos[1], &st, now() - u.t0);
    return 0;
}

int cli_graft(int argc, char **argv) {
    args a;
    int rc = parse("graft", usage_graft, argc, argv, &a);
    if (rc) {
        free(a.rules);
        return rc == 1 ? 0 : rc;
    }
    const char *bad = a.n_pos != 2                  ? "needs BASE and HEAD_SOURCE"
                      : a.keep_dtype && a.bits_set  ? "--bits and --keep-dtype exclude each other"
                      : a.no_mtp || a.mtp_bits || a.mtp_group || a.shard_gb > 0
                          ? "--no-mtp, --mtp-bits, --mtp-group-size and --shard-size belong to `nextn convert`"
                          : NULL;
    if (bad) {
        fprintf(stderr, "nextn graft: %s\n(see `nextn graft --help`)\n", bad);
        free(a.rules);
        return 2;
    }
    ui u = {.cmd = "graft", .tty = isatty(2), .quiet = a.quiet, .t0 = now()};
    nx_graft_opts o = {.dst = a.out, .rules = a.rules, .n_rules = a.n_rules, .force = a.force};
    o.mode = a.keep_dtype ? NX_GRAFT_KEEP_DTYPE : a.bits_set || a.group_set ? NX_GRAFT_QUANT : NX_GRAFT_AUTO;
    o.bits = a.bits;
    o.group = a.group;
    o.hooks = (nx_convert_hooks){.progress = on_progress, .note = on_note, .user = &u};
    nx_convert_stats st;
    nx_error err = {0};
    nx_status s = nx_graft(a.pos[0], a.pos[1], &o, &st, &err);
    clear_bar(&u);
    free(a.rules);
    if (s != NX_OK) {
        fprintf(stderr, "nextn graft: %s\n", err.msg);
        return 1;
    }
    summary("graft", a.out ? a.out : a.pos[0], &st, now() - u.t0);
    return 0;
}

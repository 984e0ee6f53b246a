/* `nextn`: subcommand dispatch and the option parsing shared by every subcommand. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "convert.h"
#include "nextn_tools.h"
#include "serve.h"

#define DEFAULT_MODEL "models/nextn-hy3-tiny"

enum {
    OPT_TEMP = 1000, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REP, OPT_PRES, OPT_FREQ, OPT_SEED,
    OPT_DRAFT, OPT_VERIFY, OPT_PMIN, OPT_SYNTH, OPT_STATS, OPT_IDS, OPT_NSAMPLES, OPT_CTX,
    OPT_NOMTP, OPT_MTP_HIDDEN, OPT_MTP_CONCAT, OPT_MTP_RECYCLE, OPT_MTP_HNORM, OPT_MTP_WINDOW,
    OPT_MTP_THETA, OPT_IGNORE_EOS, OPT_CHAT, OPT_TOKENS, OPT_LOGITS, OPT_MTP_LOGITS, OPT_JSON,
    OPT_PTOKENS, OPT_K, OPT_MODES, OPT_REPEAT, OPT_QUIET, OPT_DRAFT_VOCAB, OPT_SIMULATE, OPT_ACT_BITS, OPT_MEMBW,
    OPT_KV_TYPE,
    OPT_LOGIT_BIAS,
    OPT_JSON_OBJECT,
    OPT_JSON_SCHEMA,
    OPT_PROMPT_CACHE,
    OPT_PROMPT_CACHE_ALL,
    OPT_PROMPT_CACHE_RO,
    OPT_MAX_MEMORY,
    OPT_MEMORY,
    OPT_MLOCK,
    OPT_ROUTER_STATS,
    OPT_SPLIT,
    OPT_SPLIT_TIMEOUT,
};

static const struct option long_opts[] = {
    {"model", required_argument, 0, 'm'},
    {"prompt", required_argument, 0, 'p'},
    {"file", required_argument, 0, 'f'},
    {"n-predict", required_argument, 0, 'n'},
    {"threads", required_argument, 0, 't'},
    {"help", no_argument, 0, 'h'},
    {"temp", required_argument, 0, OPT_TEMP},
    {"top-k", required_argument, 0, OPT_TOP_K},
    {"top-p", required_argument, 0, OPT_TOP_P},
    {"min-p", required_argument, 0, OPT_MIN_P},
    {"repeat-penalty", required_argument, 0, OPT_REP},
    {"presence-penalty", required_argument, 0, OPT_PRES},
    {"frequency-penalty", required_argument, 0, OPT_FREQ},
    {"seed", required_argument, 0, OPT_SEED},
    {"draft", required_argument, 0, OPT_DRAFT},
    {"verify", required_argument, 0, OPT_VERIFY},
    {"draft-p-min", required_argument, 0, OPT_PMIN},
    {"synthetic-accept", required_argument, 0, OPT_SYNTH},
    {"stats", no_argument, 0, OPT_STATS},
    {"print-ids", no_argument, 0, OPT_IDS},
    {"n-samples", required_argument, 0, OPT_NSAMPLES},
    {"ctx", required_argument, 0, OPT_CTX},
    {"no-mtp", no_argument, 0, OPT_NOMTP},
    {"mtp-hidden", required_argument, 0, OPT_MTP_HIDDEN},
    {"mtp-concat", required_argument, 0, OPT_MTP_CONCAT},
    {"mtp-recycle", required_argument, 0, OPT_MTP_RECYCLE},
    {"mtp-hnorm", required_argument, 0, OPT_MTP_HNORM},
    {"mtp-window", required_argument, 0, OPT_MTP_WINDOW},
    {"mtp-rope-theta", required_argument, 0, OPT_MTP_THETA},
    {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
    {"chat", no_argument, 0, OPT_CHAT},
    {"tokens", required_argument, 0, OPT_TOKENS},
    {"logits", required_argument, 0, OPT_LOGITS},
    {"mtp-logits", required_argument, 0, OPT_MTP_LOGITS},
    {"json", no_argument, 0, OPT_JSON},
    {"json-object", no_argument, 0, OPT_JSON_OBJECT},
    {"json-schema", required_argument, 0, OPT_JSON_SCHEMA},
    {"prompt-tokens", required_argument, 0, OPT_PTOKENS},
    {"k", required_argument, 0, OPT_K},
    {"modes", required_argument, 0, OPT_MODES},
    {"repeat", required_argument, 0, OPT_REPEAT},
    {"membw", required_argument, 0, OPT_MEMBW},
    {"quiet", no_argument, 0, OPT_QUIET},
    {"draft-vocab", required_argument, 0, OPT_DRAFT_VOCAB},
    {"simulate-from", required_argument, 0, OPT_SIMULATE},
    {"act-bits", required_argument, 0, OPT_ACT_BITS},
    {"kv-type", required_argument, 0, OPT_KV_TYPE},
    {"logit-bias", required_argument, 0, OPT_LOGIT_BIAS},
    {"prompt-cache", required_argument, 0, OPT_PROMPT_CACHE},
    {"prompt-cache-all", no_argument, 0, OPT_PROMPT_CACHE_ALL},
    {"prompt-cache-ro", no_argument, 0, OPT_PROMPT_CACHE_RO},
    {"max-memory", required_argument, 0, OPT_MAX_MEMORY},
    {"memory", required_argument, 0, OPT_MEMORY},
    {"mlock", no_argument, 0, OPT_MLOCK},
    {"router-stats", required_argument, 0, OPT_ROUTER_STATS},
    {"split", required_argument, 0, OPT_SPLIT},
    {"split-timeout", required_argument, 0, OPT_SPLIT_TIMEOUT},
    {0, 0, 0, 0},
};

int cli_env_act_bits(void) {
    const char *env = getenv("NX_ACT_BITS");
    return env && strcmp(env, "16") == 0 ? 16 : 8;
}

bool cli_parse_kv_type(const char *s, nx_kv_type *out) {
    if (!strcmp(s, "f32")) *out = NX_KV_F32;
    else if (!strcmp(s, "f16")) *out = NX_KV_F16;
    else return false;
    return true;
}

bool cli_parse_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (!s || !(*s >= '0' && *s <= '9')) return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return false;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    default: break;
    }
    if (shift) end++;
    if (*end == 'i' && shift) end++; /* 96GiB reads as 96G */
    if (*end == 'B' && shift) end++;
    if (*end || v == 0 || v > (UINT64_MAX >> shift)) return false;
    *out = (uint64_t)v << shift;
    return true;
}

bool cli_parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nextn %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see `nextn %s --help`)\n", cmd);
    va_end(ap);
    return 2;
}

int cli_parse(const char *cmd, const char *usage, int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof *o);
    nx_gen_params_default(&o->gen);
    nx_load_params_default(&o->load);
    o->load.act_bits = cli_env_act_bits();
    o->n_predict = -1;
    o->n_samples = 1;
    o->probe_k = 1;
    o->repeat = 1;
    optind = 1;
    opterr = 0;
    int c;
    long long iv;
    double dv;
#define BAD(...) return cli_usage_error(cmd, __VA_ARGS__)
#define INT_OPT(name, lo, hi, dst) \
    if (!cli_parse_int(optarg, lo, hi, &iv)) BAD("%s %s: expected an integer in [%lld, %lld]", name, optarg, (long long)(lo), (long long)(hi)); \
    dst = iv
#define DBL_OPT(name, lo, hi, dst) \
    if (!cli_parse_double(optarg, lo, hi, &dv)) BAD("%s %s: expected a number in [%g, %g]", name, optarg, (double)(lo), (double)(hi)); \
    dst = dv
    while ((c = getopt_long(argc, argv, "m:p:f:n:t:h", long_opts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'f': o->prompt_file = optarg; break;
        case 'n': INT_OPT("-n", 0, INT32_MAX, o->n_predict); break;
        case 't': INT_OPT("--threads", 0, 1024, o->threads); o->load.n_threads = o->threads; break;
        case 'h': fputs(usage, stdout); return 1;
        case OPT_TEMP: DBL_OPT("--temp", 0, 100, o->gen.sampling.temperature); o->temp_set = true; break;
        case OPT_TOP_K: INT_OPT("--top-k", 0, INT32_MAX, o->gen.sampling.top_k); break;
        case OPT_TOP_P: DBL_OPT("--top-p", 1e-9, 1, o->gen.sampling.top_p); break;
        case OPT_MIN_P: DBL_OPT("--min-p", 0, 1, o->gen.sampling.min_p); break;
        case OPT_REP: DBL_OPT("--repeat-penalty", 1e-6, 10, o->gen.sampling.repetition_penalty); break;
        case OPT_PRES: DBL_OPT("--presence-penalty", -2, 2, o->gen.sampling.presence_penalty); break;
        case OPT_FREQ: DBL_OPT("--frequency-penalty", -2, 2, o->gen.sampling.frequency_penalty); break;
        case OPT_SEED: INT_OPT("--seed", 0, LLONG_MAX, o->gen.sampling.seed); break;
        case OPT_LOGIT_BIAS: { /* llama.cpp's form: TOKEN_ID+BIAS or TOKEN_ID-BIAS */
            const size_t nb = o->gen.sampling.n_logit_bias;
            const char *sign = optarg + strspn(optarg, "0123456789");
            char idbuf[16];
            const size_t idlen = (size_t)(sign - optarg);
            if (nb >= sizeof o->logit_bias / sizeof o->logit_bias[0]) BAD("--logit-bias: at most 64");
            if (idlen == 0 || idlen >= sizeof idbuf || (*sign != '+' && *sign != '-'))
                BAD("--logit-bias %s: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1)", optarg);
            memcpy(idbuf, optarg, idlen);
            idbuf[idlen] = '\0';
            if (!cli_parse_int(idbuf, 0, INT32_MAX, &iv) || !cli_parse_double(sign, -100, 100, &dv))
                BAD("--logit-bias %s: expected a token id and a bias in [-100, 100]", optarg);
            o->logit_bias[nb] = (nx_logit_bias){(int32_t)iv, (float)dv};
            o->gen.sampling.logit_bias = o->logit_bias;
            o->gen.sampling.n_logit_bias = nb + 1;
            break;
        }
        case OPT_DRAFT:
            if (!strcmp(optarg, "auto")) o->gen.draft = NX_DRAFT_AUTO;
            else { INT_OPT("--draft", 0, NX_MAX_DRAFT, o->gen.draft); }
            break;
        case OPT_VERIFY:
            if (!strcmp(optarg, "residual")) o->gen.verify = NX_VERIFY_RESIDUAL;
            else if (!strcmp(optarg, "match")) o->gen.verify = NX_VERIFY_MATCH;
            else BAD("--verify %s: expected residual or match", optarg);
            break;
        case OPT_PMIN: DBL_OPT("--draft-p-min", 0, 1, o->gen.draft_p_min); break;
        case OPT_SYNTH: DBL_OPT("--synthetic-accept", 0, 1, o->gen.synthetic_accept); break;
        case OPT_STATS: o->stats = true; break;
        case OPT_IDS: o->print_ids = true; break;
        case OPT_NSAMPLES: INT_OPT("--n-samples", 1, 10000000, o->n_samples); break;
        case OPT_CTX: INT_OPT("--ctx", 1, INT32_MAX, o->n_ctx); break;
        case OPT_NOMTP: o->load.no_mtp = true; break;
        case OPT_MTP_HIDDEN:
            if (!strcmp(optarg, "post")) o->load.wiring.hidden = NX_MTP_HIDDEN_POST_NORM;
            else if (!strcmp(optarg, "pre")) o->load.wiring.hidden = NX_MTP_HIDDEN_PRE_NORM;
            else BAD("--mtp-hidden %s: expected post or pre", optarg);
            break;
        case OPT_MTP_CONCAT:
            if (!strcmp(optarg, "embed-first")) o->load.wiring.concat = NX_MTP_CONCAT_EMBED_FIRST;
            else if (!strcmp(optarg, "hidden-first")) o->load.wiring.concat = NX_MTP_CONCAT_HIDDEN_FIRST;
            else BAD("--mtp-concat %s: expected embed-first or hidden-first", optarg);
            break;
        case OPT_MTP_RECYCLE:
            if (!strcmp(optarg, "normed")) o->load.wiring.recycle = NX_MTP_RECYCLE_NORMED;
            else if (!strcmp(optarg, "raw")) o->load.wiring.recycle = NX_MTP_RECYCLE_RAW;
            else BAD("--mtp-recycle %s: expected normed or raw", optarg);
            break;
        case OPT_MTP_HNORM:
            if (!strcmp(optarg, "on")) o->load.wiring.hnorm = 1;
            else if (!strcmp(optarg, "off")) o->load.wiring.hnorm = -1;
            else BAD("--mtp-hnorm %s: expected on or off", optarg);
            break;
        case OPT_MTP_WINDOW: INT_OPT("--mtp-window", 0, INT32_MAX, o->load.wiring.sliding_window); break;
        case OPT_MTP_THETA: DBL_OPT("--mtp-rope-theta", 1, 1e12, o->load.wiring.rope_theta); break;
        case OPT_IGNORE_EOS: o->gen.ignore_eos = true; break;
        case OPT_CHAT: o->chat = true; break;
        case OPT_TOKENS: o->tokens = optarg; break;
        case OPT_LOGITS: o->logits_out = optarg; break;
        case OPT_MTP_LOGITS: o->mtp_logits_out = optarg; break;
        case OPT_JSON: o->json = true; break;
        case OPT_JSON_OBJECT: o->json_object = true; break;
        case OPT_JSON_SCHEMA: o->json_schema = optarg, o->json_object = true; break;
        case OPT_PTOKENS: o->prompt_tokens = optarg; break;
        case OPT_K: INT_OPT("--k", 1, NX_MAX_DRAFT, o->probe_k); break;
        case OPT_MODES: o->modes = optarg; break;
        case OPT_REPEAT: INT_OPT("--repeat", 1, 1000, o->repeat); break;
        case OPT_MEMBW: INT_OPT("--membw", 16, 65536, o->membw_mb); break;
        case OPT_QUIET: o->quiet = true; break;
        case OPT_SIMULATE: INT_OPT("--simulate-from", 1, INT32_MAX, o->simulate_from); break;
        case OPT_DRAFT_VOCAB: INT_OPT("--draft-vocab", 0, INT32_MAX, o->load.draft_vocab); break;
        case OPT_ACT_BITS:
            if (!cli_parse_int(optarg, 8, 16, &iv) || (iv != 8 && iv != 16))
                BAD("--act-bits %s: expected 8 or 16", optarg);
            o->load.act_bits = (int)iv;
            break;
        case OPT_KV_TYPE:
            if (!cli_parse_kv_type(optarg, &o->load.kv_type)) BAD("--kv-type %s: expected f32 or f16", optarg);
            break;
        case OPT_PROMPT_CACHE:
            if (!*optarg) BAD("--prompt-cache: empty file name");
            o->prompt_cache = optarg;
            break;
        case OPT_PROMPT_CACHE_ALL: o->prompt_cache_all = true; break;
        case OPT_PROMPT_CACHE_RO: o->prompt_cache_ro = true; break;
        case OPT_MAX_MEMORY:
        case OPT_MEMORY:
            if (!cli_parse_size(optarg, &o->load.max_memory))
                BAD("%s %s: expected a size in bytes, with an optional K, M, G or T suffix (powers of 1024), "
                    "e.g. 96G", c == OPT_MEMORY ? "--memory" : "--max-memory", optarg);
            break;
        case OPT_MLOCK: o->load.prefault = NX_PREFAULT_LOCK; break;
        case OPT_ROUTER_STATS:
            if (!*optarg) BAD("--router-stats: empty file name");
            o->load.router_stats = optarg;
            break;
        case OPT_SPLIT:
            if (strcmp(optarg, "pipeline") && strcmp(optarg, "experts")) BAD("--split %s: expected pipeline or experts", optarg);
            o->split = optarg;
            break;
        case OPT_SPLIT_TIMEOUT: DBL_OPT("--split-timeout", 1, 1e6, o->split_timeout); break;
        case '?':
        default:
            if (optopt) BAD("option -%c needs a value or is unknown", optopt);
            BAD("unknown option %s", argv[optind - 1]);
        }
    }
    if (o->split && !strcmp(o->split, "pipeline") && o->load.router_stats)
        BAD("--router-stats with --split pipeline: rank 0 routes only its own layers (use --split experts)");
    o->args = (const char **)(argv + optind);
    o->n_args = argc - optind;
    return 0;
#undef BAD
#undef INT_OPT
#undef DBL_OPT
}

const char *cli_model_dir(const cli_opts *o) {
    if (o->model) return o->model;
    const char *env = getenv("NEXTN_MODEL");
    if (env && *env) return env;
    if (access(DEFAULT_MODEL "/config.json", R_OK) == 0) return DEFAULT_MODEL;
    /* next to the binary: build/nextn → ../models */
    static char path[PATH_MAX + 64];
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(path, sizeof path, "%s/../" DEFAULT_MODEL, exe);
            if (access(path, R_OK) == 0) return path;
        }
    }
    return DEFAULT_MODEL;
}

static void progress(void *user, double f) {
    (void)user;
    if (isatty(2)) fprintf(stderr, "\rloading %3.0f%%%s", f * 100.0, f >= 1.0 ? "\r              \r" : "");
}

static nx_dist *split_dist;

static void split_leave(void) {
    nx_dist_finish(split_dist, false);
    split_dist = NULL;
}

int cli_split_join(const char *cmd, const char *split, double timeout_s, nx_load_params *lp) {
    if (!split) return 0;
    nx_error err = {0};
    if (nx_dist_init(NULL, NULL, timeout_s, &split_dist, &err) != NX_OK) {
        fprintf(stderr, "nextn %s: %s\n", cmd, err.msg);
        return 2;
    }
    atexit(split_leave);
    lp->dist = split_dist;
    lp->split = !strcmp(split, "experts") ? NX_SPLIT_EXPERTS : NX_SPLIT_PIPELINE;
    if (nx_dist_rank(split_dist) > 0) lp->progress = NULL; /* rank 0 speaks for the job */
    return 0;
}

void cli_split_follow(nx_model *m, const nx_load_params *lp) {
    if (!lp->dist) return;
    if (!m) { /* a rank that could not load ends the job: the others would wait for it */
        nx_dist_finish(split_dist, true);
        return;
    }
    if (nx_dist_rank(lp->dist) == 0) return;
    nx_error err = {0};
    const nx_status st = nx_model_follow(m, &err);
    if (st != NX_OK) fprintf(stderr, "nextn: %s\n", err.msg);
    nx_model_free(m);
    exit(st == NX_OK ? 0 : 1);
}

void cli_split_print_net(nx_model *m, double tokens, FILE *f) {
    double bytes = 0, secs = 0;
    int64_t msgs = 0;
    nx_error err = {0};
    if (nx_model_net(m, &bytes, &msgs, &secs, &err) != NX_OK) {
        fprintf(f, "network: %s\n", err.msg);
        return;
    }
    if (msgs == 0) return;
    fprintf(f, "network (all ranks): %.3f MB sent in %lld messages, %.1f KB and %.1f messages per token; "
            "ranks waited %.3f s in all\n", bytes / 1e6, (long long)msgs, tokens > 0 ? bytes / tokens / 1e3 : 0.0,
            tokens > 0 ? (double)msgs / tokens : 0.0, secs);
}

nx_model *cli_load_model(const cli_opts *o) {
    nx_load_params p = o->load;
    p.progress = progress;
    nx_model *m = NULL;
    nx_error err = {0};
    const char *dir = cli_model_dir(o);
    if (cli_split_join("run", o->split, o->split_timeout, &p) != 0) return NULL;
    if (nx_model_load(dir, &p, &m, &err) != NX_OK) {
        fprintf(stderr, "nextn: cannot load model: %s\n", err.msg);
        cli_split_follow(NULL, &p);
        return NULL;
    }
    cli_split_follow(m, &p);
    const nx_model_info *in = nx_model_get_info(m);
    if (!o->quiet && !strncmp(in->mtp, "none (headless", 14))
        fprintf(stderr, "nextn: %s ships no MTP weights; decoding without speculation\n", dir);
    return m;
}

int cli_free_model(const cli_opts *o, nx_model *m, int rc) {
    nx_error err = {0};
    if (m && rc == 0 && o->load.router_stats && !o->router_stats_ro &&
        nx_model_router_stats_save(m, o->load.router_stats, &err) != NX_OK) {
        fprintf(stderr, "nextn: --router-stats: %s\n", err.msg);
        rc = 1;
    }
    nx_model_free(m);
    return rc;
}

bool cli_parse_ids(const char *s, int32_t **ids, size_t *n, char *msg, size_t msg_len) {
    size_t cap = 16, cnt = 0;
    int32_t *a = malloc(cap * sizeof *a);
    if (!a) return false;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            snprintf(msg, msg_len, "token list: '%.20s' is not a token id", p);
            free(a);
            return false;
        }
        if (cnt == cap) {
            int32_t *b = realloc(a, (cap *= 2) * sizeof *a);
            if (!b) { free(a); return false; }
            a = b;
        }
        a[cnt++] = (int32_t)v;
        p = end;
        if (*p && *p != ' ' && *p != ',' && *p != '\n' && *p != '\t') {
            snprintf(msg, msg_len, "token list: unexpected '%c'", *p);
            free(a);
            return false;
        }
    }
    *ids = a;
    *n = cnt;
    return true;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *b = realloc(buf, (cap *= 2) + 1);
            if (!b) { free(buf); buf = NULL; break; }
            buf = b;
        }
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

bool cli_prompt_ids(const cli_opts *o, nx_model *m, int32_t **ids, size_t *n) {
    char msg[256];
    if (o->prompt_tokens) {
        if (!cli_parse_ids(o->prompt_tokens, ids, n, msg, sizeof msg)) {
            fprintf(stderr, "nextn: --prompt-tokens: %s\n", msg);
            return false;
        }
        return true;
    }
    const nx_tokenizer *tok = nx_model_tokenizer(m);
    if (!tok) {
        fprintf(stderr, "nextn: this model ships no tokenizer.json; use --prompt-tokens\n");
        return false;
    }
    char *text = NULL;
    size_t len = 0;
    if (o->prompt_file) {
        text = cli_read_file(o->prompt_file, &len);
        if (!text) {
            fprintf(stderr, "nextn: cannot read %s: %s\n", o->prompt_file, strerror(errno));
            return false;
        }
    } else if (o->prompt) {
        text = strdup(o->prompt);
        len = strlen(text);
    } else {
        fprintf(stderr, "nextn: no prompt: give -p TEXT, -f FILE or --prompt-tokens IDS\n");
        return false;
    }
    nx_error err = {0};
    if (o->chat) {
        const char *tmpl = nx_model_chat_template(m);
        if (!tmpl) {
            fprintf(stderr, "nextn: --chat: the model has no chat_template\n");
            free(text);
            return false;
        }
        json_t *msgs = json_pack("[{s:s, s:s%}]", "role", "user", "content", text, len);
        char *rendered = NULL;
        nx_status st = nx_chat_render(tmpl, msgs, NULL, true, NULL, "", "", &rendered, &err);
        json_decref(msgs);
        free(text);
        if (st != NX_OK) {
            fprintf(stderr, "nextn: chat template: %s\n", err.msg);
            return false;
        }
        text = rendered;
        len = strlen(text);
    }
    nx_status st = nx_tokenizer_encode(tok, text, len, true, ids, n, &err);
    free(text);
    if (st != NX_OK) {
        fprintf(stderr, "nextn: tokenize: %s\n", err.msg);
        return false;
    }
    return true;
}

static const char *usage_main =
    "usage: nextn COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  run         generate text (MTP self-speculative decoding by default)\n"
    "  serve       OpenAI-compatible HTTP server\n"
    "  eval        write trunk and teacher-forced MTP logits of a token sequence as .npy\n"
    "  probe       teacher-forced MTP acceptance ceiling over text files\n"
    "  bench       AR vs MTP decoding speed on the same prompts\n"
    "  tokenize    text -> token ids\n"
    "  detokenize  token ids -> text\n"
    "  inspect     describe a checkpoint: layout, dtypes, MTP head, parameters, memory\n"
    "  convert     make an MLX-layout affine-quantized checkpoint (MTP head in a sidecar)\n"
    "  graft       add or replace a checkpoint's MTP head with another checkpoint's\n"
    "  forge       train a checkpoint's MTP head on its own trunk (self-distillation)\n"
    "  shard       cut a checkpoint into per-rank shares for a multi-node --split job\n"
    "\n"
    "`nextn COMMAND --help` describes each command. The default model is " DEFAULT_MODEL ".\n";

/* The weights are mapped from the checkpoint's files: a file truncated (or rewritten shorter) in
 * place while a forward pass reads it faults the reading thread with SIGBUS, and no thread can
 * go on with weights that are gone. The process says so and exits with EX_TEMPFAIL (75), so a
 * supervisor restarts it on the files as they are now, instead of dying without a word. Files
 * changed before a generation starts are caught then, with an error (docs/server.md). */
static void on_sigbus(int sig) {
    static const char msg[] = "nextn: a model file was truncated or rewritten in place while the weights were "
                              "being read (SIGBUS); exiting. Replace checkpoint files by rename, never in place.\n";
    (void)sig;
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
    _exit(75);
}

int main(int argc, char **argv) {
    struct sigaction sa = {.sa_handler = on_sigbus};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(usage_main, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {
        {"run", cli_run},         {"eval", cli_eval},   {"probe", cli_probe},
        {"bench", cli_bench},     {"tokenize", cli_tokenize}, {"detokenize", cli_detokenize},
        {"inspect", cli_inspect}, {"serve", nx_cli_serve},   {"convert", cli_convert},
        {"graft", cli_graft},     {"forge", cli_forge},   {"shard", cli_shard},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "nextn: unknown command '%s'\n\n%s", cmd, usage_main);
    return 2;
}

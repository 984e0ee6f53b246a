/* `nextn serve`: loads the model with a progress indicator, starts the OpenAI-compatible server
 * and runs until SIGINT/SIGTERM, then shuts down cleanly (queued clients get an error). */
#include "serve.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "nextn_tools.h"

static const char *usage =
    "usage: nextn serve [options]\n"
    "\n"
    "A chat page at GET / and an OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions\n"
    "(streaming and not), POST /tokenize and /detokenize, GET /v1/models, GET /health,\n"
    "GET /metrics (Prometheus), and llama.cpp's POST /slots/0?action=save|restore|erase\n"
    "(with --slot-save-path).\n"
    "The weights are mapped from the checkpoint files: replace a checkpoint by rename (a new\n"
    "file), never by overwriting it in place; a file changed in place fails every generation\n"
    "with an error naming it until the server is restarted.\n"
    "MTP self-speculative decoding is on by default; requests may override it with\n"
    "\"speculative\": {\"draft\": \"auto\"|0..8, \"verify\": \"residual\"|\"match\"}.\n"
    "\n"
    "options:\n"
    "  -m, --model DIR         checkpoint directory (default models/nextn-hy3-tiny)\n"
    "      --model-id NAME     the model name clients send (default: the directory's name)\n"
    "      --host ADDR         address to bind (default 127.0.0.1)\n"
    "      --port N            port (default 8080; 0 = any free port)\n"
    "      --api-key KEY       require 'Authorization: Bearer KEY' (or $NEXTN_API_KEY; an\n"
    "                          empty key is an error)\n"
    "      --max-body BYTES    largest request body, suffix k/m allowed (default 4m)\n"
    "      --timeout SEC       per-request limit, queueing included; 0 = none (default 600)\n"
    "      --queue N           requests waiting for the model before 503 (default 64)\n"
    "      --max-connections N open connections at once (default queue + 64); 4 more are\n"
    "                          kept for GET /health\n"
    "      --max-conns-per-ip N  open connections from one address (default a quarter of\n"
    "                          --max-connections; 0 = no limit)\n"
    "      --header-timeout SEC  time for a request's whole head (default 10)\n"
    "      --body-timeout SEC  time for its body once the head is in (default 60)\n"
    "      --sse-keepalive SEC a stream silent this long (a long prefill, a queue) gets an SSE\n"
    "                          comment line, which clients ignore (default 15; 0 = never)\n"
    "      --max-request-tokens N  tokens one request may generate, prompts x n x\n"
    "                          max_tokens (default 32768, or --ctx if larger); more is a\n"
    "                          400\n"
    "      --max-unsent BYTES  stream output a client may leave unread before its request is\n"
    "                          cancelled (default 1m)\n"
    "      --shutdown-grace SEC  on SIGTERM/SIGINT, time the running request may take to\n"
    "                          finish before it is cancelled (default 10)\n"
    "      --host-allow LIST   without an API key, Host names accepted besides the bound\n"
    "                          address and localhost (comma-separated; * = any)\n"
    "      --cors LIST         origins whose web pages may call the server (comma-separated\n"
    "                          scheme://host[:port]; * = any); others get 403\n"
    "      --ctx N             context tokens, prompt + completion (default 4096), per slot\n"
    "      --parallel N        sequence slots (also --np), each its own context: N requests\n"
    "                          generate at once, their steps batched into one forward\n"
    "                          (default: what half the free memory holds, at most 4)\n"
    "      --cache-ram MIB     memory for saved prompt prefixes, so requests that alternate\n"
    "                          between conversations keep each one's cache (default 1024;\n"
    "                          0 = off)\n"
    "      --ctx-checkpoints N  hybrid models (Qwen3.5/3.6, Qwen3-Next): recurrent-state\n"
    "                          checkpoints each slot keeps, so a chat's next turn or another\n"
    "                          question on the same document prefills from the last one within\n"
    "                          the shared prefix, not from the start (default 4, 0..64; each\n"
    "                          holds the model's recurrent state, ~63 MiB on Qwen3.6-35B-A3B)\n"
    "      --checkpoint-every N  prompt tokens between the checkpoints a prefill makes\n"
    "                          (default 2048; 0 = only the one at the prompt's end)\n"
    "      --slot-save-path DIR  POST /slots/0?action=save|restore with {\"filename\": NAME}\n"
    "                          writes / loads the context's rows as DIR/NAME (an existing\n"
    "                          directory); action=erase empties the context (default: off,\n"
    "                          slot actions answer 501)\n"
    "      --slot-save-quota MIB  disk the slot directory's files may take; a save\n"
    "                          past it is refused (default 4096)\n"
    "      --draft auto|N      default draft length, 0 = plain decoding (default auto)\n"
    "      --verify RULE       residual or match (default residual); both lossless, match\n"
    "                          makes seeded output independent of the draft length\n"
    "      --reasoning-format split|none  chat: <think>...</think> as reasoning_content (split,\n"
    "                          the default) or left in the content (none)\n"
    "  -t, --threads N         compute threads (default: all cores)\n"
    "      --act-bits 8|16     activations of 2-6-bit matmuls: int8 (default) or int16 (finer)\n"
    "      --kv-type f32|f16   KV cache elements: f32 (default, exact) or f16 (half the memory)\n"
    "      --no-mtp            load the trunk only (no speculation)\n"
    "      --no-webui          no chat page at GET / (the API alone)\n"
    CLI_SPLIT_USAGE
    "      --max-memory N      keep at most N bytes of weights in memory (K/M/G suffixes): the routed\n"
    "                          experts beyond that stream from disk into an expert cache\n"
    "      --mlock             read the resident weights in at load and lock them in memory\n"
    "      --router-stats FILE add the experts every request chose to FILE at shutdown (router\n"
    "                          statistics: inspect --memory N --router-stats FILE plans with them)\n"
    "  -q, --quiet             no start-up banner\n";

enum { O_HOST = 1000, O_PORT, O_KEY, O_BODY, O_TIMEOUT, O_QUEUE, O_CTX, O_DRAFT, O_VERIFY,
       O_NOMTP, O_ID, O_MAXCONN, O_ACT, O_KV, O_REASONING, O_CACHE, O_SLOTS, O_PERIP, O_HEADT,
       O_BODYT, O_MAXTOK, O_UNSENT, O_GRACE, O_HOSTS, O_CORS, O_QUOTA, O_NOWEB, O_MAXMEM, O_MLOCK, O_SPLIT,
       O_SPLIT_TIMEOUT, O_PARALLEL, O_ROUTER_STATS, O_SSEKA, O_CKPTS, O_CKEVERY };

static const struct option opts[] = {
    {"model", required_argument, 0, 'm'},     {"model-id", required_argument, 0, O_ID},
    {"host", required_argument, 0, O_HOST},   {"port", required_argument, 0, O_PORT},
    {"api-key", required_argument, 0, O_KEY}, {"max-body", required_argument, 0, O_BODY},
    {"timeout", required_argument, 0, O_TIMEOUT}, {"queue", required_argument, 0, O_QUEUE},
    {"max-connections", required_argument, 0, O_MAXCONN},
    {"ctx", required_argument, 0, O_CTX},     {"draft", required_argument, 0, O_DRAFT},
    {"verify", required_argument, 0, O_VERIFY}, {"threads", required_argument, 0, 't'},
    {"no-mtp", no_argument, 0, O_NOMTP},      {"act-bits", required_argument, 0, O_ACT},
    {"kv-type", required_argument, 0, O_KV},      {"quiet", no_argument, 0, 'q'},
    {"max-memory", required_argument, 0, O_MAXMEM}, {"mlock", no_argument, 0, O_MLOCK},
    {"router-stats", required_argument, 0, O_ROUTER_STATS},
    {"reasoning-format", required_argument, 0, O_REASONING}, {"cache-ram", required_argument, 0, O_CACHE},
    {"slot-save-path", required_argument, 0, O_SLOTS}, {"slot-save-quota", required_argument, 0, O_QUOTA},
    {"max-conns-per-ip", required_argument, 0, O_PERIP}, {"header-timeout", required_argument, 0, O_HEADT},
    {"body-timeout", required_argument, 0, O_BODYT}, {"max-request-tokens", required_argument, 0, O_MAXTOK},
    {"sse-keepalive", required_argument, 0, O_SSEKA},
    {"ctx-checkpoints", required_argument, 0, O_CKPTS}, {"checkpoint-every", required_argument, 0, O_CKEVERY},
    {"max-unsent", required_argument, 0, O_UNSENT}, {"shutdown-grace", required_argument, 0, O_GRACE},
    {"host-allow", required_argument, 0, O_HOSTS}, {"cors", required_argument, 0, O_CORS},
    {"no-webui", no_argument, 0, O_NOWEB},    {"parallel", required_argument, 0, O_PARALLEL},
    {"np", required_argument, 0, O_PARALLEL},
    {"split", required_argument, 0, O_SPLIT}, {"split-timeout", required_argument, 0, O_SPLIT_TIMEOUT},
    {"help", no_argument, 0, 'h'},            {0, 0, 0, 0},
};

/* "4096", "64k", "4m" */
static bool parse_bytes(const char *s, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return false;
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024, end++;
    else if (*end == 'm' || *end == 'M') mul = 1024 * 1024, end++;
    if (*end || v == 0 || v > (1ull << 40) / mul) return false;
    *out = (size_t)(v * mul);
    return true;
}

/* Seconds: a number in [lo, 1e7]. */
static bool parse_seconds(const char *s, double lo, double *out) {
    char *end;
    double t = strtod(s, &end);
    if (end == s || *end || !(t >= lo && t <= 1e7)) return false;
    *out = t;
    return true;
}

static void progress(void *user, double f) {
    int *last = user;
    int pct = (int)(f * 100.0 + 0.5);
    if (isatty(2)) {
        int w = 30, fill = (int)(f * w + 0.5);
        fprintf(stderr, "\rloading [%.*s%*s] %3d%%", fill, "##############################", w - fill,
                "", pct);
        if (f >= 1.0) fputc('\n', stderr);
    } else if (pct / 25 != *last / 25 || (pct == 100 && *last != 100)) {
        fprintf(stderr, "loading %d%%\n", pct);
    }
    *last = pct;
    fflush(stderr);
}

/* The directory's last component, for the default model id. */
static char *dir_name(const char *dir) {
    char *d = strdup(dir);
    if (!d) return NULL;
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/') d[--n] = '\0';
    const char *slash = strrchr(d, '/');
    char *name = strdup(slash ? slash + 1 : d);
    free(d);
    return name;
}

/* Seconds a server whose split job failed keeps answering 503 before it stops: the requests in
 * flight and those that arrive meanwhile get the error naming the failure, not a closed socket. */
#define RANK_FAILURE_DRAIN_S 2

/* Waits for SIGINT or SIGTERM (returned), or for the model's job to fail (a rank died or stopped
 * answering; 0 returned after the drain): its forwards then fail at once, so the server says so
 * and stops with a non-zero status, and a supervisor restarts the job. */
static int wait_for_end(const sigset_t *set, nx_model *m) {
    const struct timespec tick = {0, 200 * 1000 * 1000}, drain = {RANK_FAILURE_DRAIN_S, 0};
    nx_error e = {0};
    for (;;) {
        const int sig = sigtimedwait(set, NULL, &tick);
        if (sig > 0) return sig;
        if (!nx_model_failed(m, &e)) continue;
        fprintf(stderr, "nextn serve: %s; answering 503 for %d s, then exiting\n", e.msg, RANK_FAILURE_DRAIN_S);
        fflush(stderr);
        const int late = sigtimedwait(set, NULL, &drain);
        return late > 0 ? late : 0;
    }
}

int nx_cli_serve(int argc, char **argv) {
    nx_server_opts so;
    nx_server_opts_default(&so);
    so.web = nx_web_files;
    so.n_web = nx_web_n_files;
    nx_load_params lp;
    nx_load_params_default(&lp);
    lp.act_bits = cli_env_act_bits();
    const char *model_dir = NULL, *model_id = NULL;
    bool quiet = false, ctx_set = false;
    const char *split = NULL;
    double split_timeout = 0;
    long long v;
    int c;
    optind = 1;
    opterr = 0;
#define BAD(...) return cli_usage_error("serve", __VA_ARGS__)
    while ((c = getopt_long(argc, argv, "m:t:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case O_ID: model_id = optarg; break;
        case O_HOST: so.host = optarg; break;
        case O_PORT:
            if (!cli_parse_int(optarg, 0, 65535, &v)) BAD("--port %s: expected 0..65535", optarg);
            so.port = (int)v;
            break;
        case O_KEY:
            if (!*optarg) BAD("--api-key: empty key (an unset variable?); leave the option out to run without one");
            so.api_key = optarg;
            break;
        case O_BODY:
            if (!parse_bytes(optarg, &so.max_body)) BAD("--max-body %s: expected bytes, e.g. 65536 or 4m", optarg);
            break;
        case O_TIMEOUT: {
            char *end;
            double t = strtod(optarg, &end);
            if (end == optarg || *end || !(t >= 0 && t <= 1e7)) BAD("--timeout %s: expected seconds >= 0", optarg);
            so.timeout = t;
            break;
        }
        case O_QUEUE:
            if (!cli_parse_int(optarg, 1, 100000, &v)) BAD("--queue %s: expected 1..100000", optarg);
            so.queue = (int)v;
            break;
        case O_MAXCONN:
            if (!cli_parse_int(optarg, 1, 100000, &v)) BAD("--max-connections %s: expected 1..100000", optarg);
            so.max_connections = (int)v;
            break;
        case O_PARALLEL:
            if (!cli_parse_int(optarg, 1, 64, &v)) BAD("--parallel %s: expected 1..64", optarg);
            so.parallel = (int)v;
            break;
        case O_CTX:
            if (!cli_parse_int(optarg, 2, INT32_MAX, &v)) BAD("--ctx %s: expected an integer >= 2", optarg);
            so.n_ctx = (int32_t)v;
            ctx_set = true;
            break;
        case O_DRAFT:
            if (!strcmp(optarg, "auto")) so.draft = NX_DRAFT_AUTO;
            else if (cli_parse_int(optarg, 0, NX_MAX_DRAFT, &v)) so.draft = (int32_t)v;
            else BAD("--draft %s: expected auto or 0..%d", optarg, NX_MAX_DRAFT);
            break;
        case O_VERIFY:
            if (!strcmp(optarg, "residual")) so.verify = NX_VERIFY_RESIDUAL;
            else if (!strcmp(optarg, "match")) so.verify = NX_VERIFY_MATCH;
            else BAD("--verify %s: expected residual or match", optarg);
            break;
        case O_CACHE:
            if (!cli_parse_int(optarg, 0, 1LL << 30, &v)) BAD("--cache-ram %s: expected MiB >= 0", optarg);
            so.cache_ram = (size_t)v << 20;
            break;
        case O_SLOTS: so.slot_save_path = optarg; break;
        case O_CKPTS:
            if (!cli_parse_int(optarg, 0, NX_CTX_CHECKPOINTS_MAX, &v))
                BAD("--ctx-checkpoints %s: expected 0..%d", optarg, NX_CTX_CHECKPOINTS_MAX);
            so.ctx_checkpoints = (int32_t)v;
            break;
        case O_CKEVERY:
            if (!cli_parse_int(optarg, 0, 1 << 30, &v)) BAD("--checkpoint-every %s: expected tokens >= 0", optarg);
            so.checkpoint_every = (int32_t)v;
            break;
        case O_PERIP:
            if (!cli_parse_int(optarg, 0, 100000, &v)) BAD("--max-conns-per-ip %s: expected 0..100000", optarg);
            so.max_conns_per_ip = v == 0 ? -1 : (int)v;
            break;
        case O_HEADT:
            if (!parse_seconds(optarg, 0.1, &so.header_timeout)) BAD("--header-timeout %s: expected seconds >= 0.1", optarg);
            break;
        case O_BODYT:
            if (!parse_seconds(optarg, 0.1, &so.body_timeout)) BAD("--body-timeout %s: expected seconds >= 0.1", optarg);
            break;
        case O_SSEKA:
            if (!parse_seconds(optarg, 0, &so.sse_keepalive) || so.sse_keepalive >= 60)
                BAD("--sse-keepalive %s: expected seconds, 0 (never) to under 60", optarg);
            break;
        case O_GRACE:
            if (!parse_seconds(optarg, 0, &so.shutdown_grace)) BAD("--shutdown-grace %s: expected seconds >= 0", optarg);
            break;
        case O_MAXTOK:
            if (!cli_parse_int(optarg, 1, INT64_MAX, &v)) BAD("--max-request-tokens %s: expected an integer >= 1", optarg);
            so.max_request_tokens = v;
            break;
        case O_UNSENT:
            if (!parse_bytes(optarg, &so.max_unsent)) BAD("--max-unsent %s: expected bytes, e.g. 65536 or 1m", optarg);
            break;
        case O_HOSTS: so.host_allow = optarg; break;
        case O_CORS: so.cors = optarg; break;
        case O_QUOTA:
            if (!cli_parse_int(optarg, 0, 1LL << 40, &v)) BAD("--slot-save-quota %s: expected MiB >= 0", optarg);
            so.slot_save_quota = (uint64_t)v << 20;
            break;
        case O_REASONING:
            if (!strcmp(optarg, "split")) so.split_reasoning = true;
            else if (!strcmp(optarg, "none")) so.split_reasoning = false;
            else BAD("--reasoning-format %s: expected split or none", optarg);
            break;
        case 't':
            if (!cli_parse_int(optarg, 0, 1024, &v)) BAD("--threads %s: expected 0..1024", optarg);
            lp.n_threads = (int)v;
            break;
        case O_NOMTP: lp.no_mtp = true; break;
        case O_NOWEB: so.web = NULL, so.n_web = 0; break;
        case O_ACT:
            if (!cli_parse_int(optarg, 8, 16, &v) || (v != 8 && v != 16)) BAD("--act-bits %s: expected 8 or 16", optarg);
            lp.act_bits = (int)v;
            break;
        case O_KV:
            if (!cli_parse_kv_type(optarg, &lp.kv_type)) BAD("--kv-type %s: expected f32 or f16", optarg);
            break;
        case O_MAXMEM:
            if (!cli_parse_size(optarg, &lp.max_memory))
                BAD("--max-memory %s: expected a size in bytes, with an optional K, M, G or T suffix (powers of "
                    "1024), e.g. 96G", optarg);
            break;
        case O_MLOCK: lp.prefault = NX_PREFAULT_LOCK; break;
        case O_ROUTER_STATS:
            if (!*optarg) BAD("--router-stats: empty file name");
            lp.router_stats = optarg;
            break;
        case O_SPLIT:
            if (strcmp(optarg, "pipeline") && strcmp(optarg, "experts")) BAD("--split %s: expected pipeline or experts", optarg);
            split = optarg;
            break;
        case O_SPLIT_TIMEOUT:
            if (!parse_seconds(optarg, 1, &split_timeout)) BAD("--split-timeout %s: expected seconds >= 1", optarg);
            break;
        case 'q': quiet = true; break;
        case 'h': fputs(usage, stdout); return 0;
        default:
            if (optopt) BAD("option -%c needs a value or is unknown", optopt);
            BAD("unknown option %s", argv[optind - 1]);
        }
    }
#undef BAD
    if (optind < argc) {
        return cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
    }
    if (split && so.parallel > 1)
        return cli_usage_error("serve", "--parallel %d with --split: a split model serves one request at a time",
                               so.parallel);
    if (split) so.parallel = 1;
    if (split && !strcmp(split, "pipeline") && lp.router_stats)
        return cli_usage_error("serve", "--router-stats with --split pipeline: rank 0 routes only its own layers "
                               "(use --split experts)");
    if (!so.api_key && (so.api_key = getenv("NEXTN_API_KEY")) && !*so.api_key)
        return cli_usage_error("serve", "NEXTN_API_KEY is set but empty; unset it to run without a key");
    cli_opts co;
    memset(&co, 0, sizeof co);
    co.model = model_dir;
    const char *dir = cli_model_dir(&co);

    if (!quiet) fprintf(stderr, "nextn serve: loading %s\n", dir);
    int last = -1;
    lp.progress = quiet ? NULL : progress;
    lp.progress_user = &last;
    nx_model *m = NULL;
    nx_error err = {0};
    const int jc = cli_split_join("serve", split, split_timeout, &lp);
    if (jc != 0) return jc;
    if (nx_model_load(dir, &lp, &m, &err) != NX_OK) {
        fprintf(stderr, "nextn serve: cannot load model: %s\n", err.msg);
        cli_split_follow(NULL, &lp);
        return 1;
    }
    cli_split_follow(m, &lp); /* ranks other than 0 follow rank 0 here, and exit */
    const nx_model_info *in = nx_model_get_info(m);
    if (!ctx_set && in->max_positions > 1 && in->max_positions < so.n_ctx)
        so.n_ctx = (int32_t)in->max_positions;
    char *id = model_id ? strdup(model_id) : dir_name(dir);
    so.model_id = id;

    /* Signals go to sigwait below, never to the server's threads (they inherit this mask). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    nx_server *srv = NULL;
    if (nx_server_start(m, &so, &srv, &err) != NX_OK) {
        fprintf(stderr, "nextn serve: %s\n", err.msg);
        free(id);
        nx_model_free(m);
        return 1;
    }
    bool mtp = in->mtp && strncmp(in->mtp, "none", 4) != 0 && strcmp(in->mtp, "disabled") != 0;
    char draft[16];
    if (so.draft == NX_DRAFT_AUTO) snprintf(draft, sizeof draft, "auto");
    else snprintf(draft, sizeof draft, "%d", so.draft);
    if (!quiet) {
        fprintf(stderr, "nextn serve: model %s (%s, %s layout, %s, %.1fM params, %d layers)\n", id,
                in->family, in->layout, in->weight_dtype, (double)in->n_params / 1e6, in->n_layers);
        if (mtp)
            fprintf(stderr, "nextn serve: MTP %s: speculative decoding on, draft %s, verify %s\n",
                    in->mtp, draft, so.verify == NX_VERIFY_MATCH ? "match" : "residual");
        else
            fprintf(stderr, "nextn serve: MTP %s: plain decoding (no speculation)\n", in->mtp);
        fprintf(stderr, "nextn serve: context %d tokens, prompt cache %zu MiB, queue %d, timeout %gs, max body %zu bytes%s\n",
                so.n_ctx, so.cache_ram >> 20, so.queue, so.timeout, so.max_body, so.api_key ? ", API key required" : "");
        if (so.parallel) fprintf(stderr, "nextn serve: %d slot%s\n", so.parallel, so.parallel == 1 ? "" : "s");
        else fprintf(stderr, "nextn serve: slots sized from memory (at most 4)\n");
        if (so.slot_save_path) fprintf(stderr, "nextn serve: slot files in %s\n", so.slot_save_path);
    }
    /* Always printed: scripts read the port from this line. */
    const char *h = so.host;
    bool v6 = strchr(h, ':') != NULL;
    fprintf(stderr, "nextn serve: listening on http://%s%s%s:%d/v1\n", v6 ? "[" : "", h, v6 ? "]" : "",
            nx_server_port(srv));
    if (!quiet && so.web)
        fprintf(stderr, "nextn serve: chat page at http://%s%s%s:%d/\n", v6 ? "[" : "", h, v6 ? "]" : "",
                nx_server_port(srv));
    fflush(stderr);

    const int sig = wait_for_end(&set, m);
    if (!quiet && sig) fprintf(stderr, "nextn serve: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
    if (!nx_server_stop(srv)) {
        /* the worker is inside one long step and still uses the model: exit without it */
        fprintf(stderr, "nextn serve: a request did not stop within the shutdown grace period; exiting anyway\n");
        fflush(stderr);
        _exit(1);
    }
    int rc = nx_model_failed(m, &err) ? 1 : 0;
    if (!rc && lp.router_stats && nx_model_router_stats_save(m, lp.router_stats, &err) != NX_OK) {
        fprintf(stderr, "nextn serve: --router-stats: %s\n", err.msg);
        rc = 1;
    }
    nx_model_free(m);
    free(id);
    return rc;
}

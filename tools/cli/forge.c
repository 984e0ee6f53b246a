/* `nextn forge`: fits a checkpoint's MTP head to its own trunk by self-distillation
 * (docs/forge.md). The engine runs the trunk over a corpus and writes a training shard (the
 * hidden states the head is fed, the tokens, the trunk's top-k log-probabilities); the PyTorch
 * trainer (tools/forge/train_head.py, spawned as a tool) checks its forward of the head against
 * the engine's, trains the head alone and writes it; `graft` puts it beside the trunk in the
 * trunk's layout and precision; `probe` on held-out text before and after is the judge. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "converter.h"
#include "nextn_tools.h"

static const char *usage =
    "usage: nextn forge -m MODEL --corpus FILE... -o OUT [--init current|random|graft:DIR]\n"
    "                   [--steps N] [--minutes M] [--heldout FILE...] [--tokens N] [--ctx T]\n"
    "                   [--top-k K] [--work DIR] [--lr LR] [--batch B] [--ce-weight W] [-t THREADS]\n"
    "                   [--dump-only] [--force]\n"
    "\n"
    "Trains the MTP head of MODEL on its own trunk (self-distillation) and writes MODEL with the new\n"
    "head (model-mtp.safetensors, in MODEL's layout and precision) to OUT, with forge.json and a\n"
    "model card section: corpus, steps, wall time, acceptance before and after.\n"
    "\n"
    "  --corpus FILE...  training text: plain text files, or .jsonl with one {\"text\": ...} per line\n"
    "  --init current    start from MODEL's own head (default when it has one)\n"
    "  --init random     start from a random head (default when MODEL has none)\n"
    "  --init graft:DIR  start from the head of checkpoint DIR (same family)\n"
    "  --steps N         training steps (default 2000); --minutes M stops earlier, the learning\n"
    "                    rate schedule following whichever ends first\n"
    "  --heldout FILE... text `nextn probe` measures acceptance on, before and after\n"
    "  --tokens N        corpus tokens in the shard (default 4000000; windows spread evenly)\n"
    "  --ctx T           window length (default 256); --top-k K trunk log-probabilities kept (32)\n"
    "  --work DIR        shard and intermediate heads (default OUT.work; reused when it holds a\n"
    "                    shard of the same model and settings)\n"
    "  --lr, --batch, --ce-weight   trainer settings (1e-3 / 3e-3 random, 16 windows, 0.1)\n"
    "  --dump-only       write the shard and stop (then run tools/forge/train_head.py yourself)\n"
    "\n"
    "The trainer runs with $NEXTN_PYTHON (default /usr/bin/python3, with torch and numpy) from\n"
    "$NEXTN_FORGE_TRAINER or tools/forge/train_head.py beside the nextn binary's source tree.\n";

enum { O_CORPUS = 1000, O_INIT, O_STEPS, O_MINUTES, O_HELDOUT, O_TOKENS, O_CTX, O_TOPK, O_WORK, O_LR, O_BATCH,
       O_CE, O_DUMP_ONLY, O_FORCE };

static const struct option opts[] = {
    {"model", required_argument, 0, 'm'},    {"output", required_argument, 0, 'o'},
    {"threads", required_argument, 0, 't'},  {"help", no_argument, 0, 'h'},
    {"corpus", required_argument, 0, O_CORPUS}, {"init", required_argument, 0, O_INIT},
    {"steps", required_argument, 0, O_STEPS}, {"minutes", required_argument, 0, O_MINUTES},
    {"heldout", required_argument, 0, O_HELDOUT}, {"tokens", required_argument, 0, O_TOKENS},
    {"ctx", required_argument, 0, O_CTX},    {"top-k", required_argument, 0, O_TOPK},
    {"work", required_argument, 0, O_WORK},  {"lr", required_argument, 0, O_LR},
    {"batch", required_argument, 0, O_BATCH}, {"ce-weight", required_argument, 0, O_CE},
    {"dump-only", no_argument, 0, O_DUMP_ONLY}, {"force", no_argument, 0, O_FORCE},
    {0, 0, 0, 0},
};

#define MAX_FILES 256

typedef struct forge_args {
    const char *model, *out, *init, *work;
    const char *corpus[MAX_FILES], *heldout[MAX_FILES];
    int n_corpus, n_heldout;
    long long steps, tokens;
    double minutes, lr, ce_weight;
    int ctx, top_k, batch, threads;
    bool dump_only, force;
    char work_buf[PATH_MAX];
} forge_args;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ================================================================ options */

/* Options that take several values (--corpus A B C) collect the arguments after them up to the
 * next option. */
static int take_files(int argc, char **argv, const char **dst, int *n, const char *opt) {
    dst[(*n)++] = optarg;
    while (optind < argc && argv[optind][0] != '-') {
        if (*n == MAX_FILES) return cli_usage_error("forge", "%s: more than %d files", opt, MAX_FILES);
        dst[(*n)++] = argv[optind++];
    }
    return 0;
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out) {
    if (!cli_parse_double(s, lo, hi, out)) return cli_usage_error("forge", "%s %s: expected a number in [%g, %g]", opt, s, lo, hi);
    return 0;
}

static int parse_option(int c, int argc, char **argv, forge_args *a) {
    double v = 0;
    int rc = 0;
    switch (c) {
    case 'm': a->model = optarg; break;
    case 'o': a->out = optarg; break;
    case 't': rc = parse_num("-t", optarg, 1, 1024, &v), a->threads = (int)v; break;
    case O_CORPUS: return a->n_corpus == MAX_FILES ? cli_usage_error("forge", "too many --corpus files")
                                                   : take_files(argc, argv, a->corpus, &a->n_corpus, "--corpus");
    case O_HELDOUT: return a->n_heldout == MAX_FILES ? cli_usage_error("forge", "too many --heldout files")
                                                     : take_files(argc, argv, a->heldout, &a->n_heldout, "--heldout");
    case O_INIT: a->init = optarg; break;
    case O_STEPS: rc = parse_num("--steps", optarg, 0, 1e9, &v), a->steps = (long long)v; break;
    case O_MINUTES: rc = parse_num("--minutes", optarg, 0.01, 1e6, &a->minutes); break;
    case O_TOKENS: rc = parse_num("--tokens", optarg, 16, 1e11, &v), a->tokens = (long long)v; break;
    case O_CTX: rc = parse_num("--ctx", optarg, 8, 65536, &v), a->ctx = (int)v; break;
    case O_TOPK: rc = parse_num("--top-k", optarg, 1, 1024, &v), a->top_k = (int)v; break;
    case O_WORK: a->work = optarg; break;
    case O_LR: rc = parse_num("--lr", optarg, 1e-8, 1, &a->lr); break;
    case O_BATCH: rc = parse_num("--batch", optarg, 1, 4096, &v), a->batch = (int)v; break;
    case O_CE: rc = parse_num("--ce-weight", optarg, 0, 100, &a->ce_weight); break;
    case O_DUMP_ONLY: a->dump_only = true; break;
    case O_FORCE: a->force = true; break;
    case 'h': fputs(usage, stdout); return 1;
    default:
        if (optopt) return cli_usage_error("forge", "option %s needs a value", argv[optind - 1]);
        return cli_usage_error("forge", "unknown option %s", argv[optind - 1]);
    }
    return rc;
}

static int parse_args(int argc, char **argv, forge_args *a) {
    memset(a, 0, sizeof *a);
    a->steps = 2000;
    a->tokens = 4000000;
    a->ctx = 256;
    a->top_k = 32;
    a->batch = 16;
    a->ce_weight = 0.1;
    a->threads = 1;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "m:o:t:h", opts, NULL)) != -1) {
        int rc = parse_option(c, argc, argv, a);
        if (rc) return rc;
    }
    if (optind < argc) return cli_usage_error("forge", "unexpected argument %s", argv[optind]);
    if (!a->model) return cli_usage_error("forge", "needs -m MODEL");
    if (!a->n_corpus) return cli_usage_error("forge", "needs --corpus FILE...");
    if (!a->out && !a->dump_only) return cli_usage_error("forge", "needs -o OUT");
    if (a->init && strcmp(a->init, "current") && strcmp(a->init, "random") && strncmp(a->init, "graft:", 6))
        return cli_usage_error("forge", "--init %s: expected current, random or graft:DIR", a->init);
    if (a->init && !strncmp(a->init, "graft:", 6) && !a->init[6])
        return cli_usage_error("forge", "--init graft: needs a checkpoint directory after the colon");
    if (!a->work) {
        if (!a->out) return cli_usage_error("forge", "--dump-only needs --work DIR or -o OUT");
        snprintf(a->work_buf, sizeof a->work_buf, "%s.work", a->out);
        a->work = a->work_buf;
    }
    return 0;
}

/* ================================================================ small helpers */

static bool make_dir(const char *path) { return mkdir(path, 0777) == 0 || errno == EEXIST; }

/* dir/name into buf; a path that does not fit is cut to "" (which every later open refuses). */
static void path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) buf[0] = 0;
}

static bool has_head(const nx_model *m) {
    const char *s = nx_model_get_info(m)->mtp;
    return !strcmp(s, "inline") || !strcmp(s, "sidecar");
}

static nx_model *load(const char *dir, int threads) {
    nx_load_params p;
    nx_load_params_default(&p);
    p.n_threads = threads;
    nx_model *m = NULL;
    nx_error err = {0};
    if (nx_model_load(dir, &p, &m, &err) != NX_OK) {
        fprintf(stderr, "nextn forge: cannot load %s: %s\n", dir, err.msg);
        return NULL;
    }
    return m;
}

/* ================================================================ token files */

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* A .ids file holds token ids (separated by spaces, commas or newlines): text already
 * tokenized, or the corpus of a checkpoint that ships no tokenizer. Ids at or past vocab_size
 * are an error naming the file. */
static bool read_ids(const char *path, int32_t V, int32_t **ids, size_t *n) {
    char *text = cli_read_file(path, NULL);
    char msg[256];
    if (!text) {
        fprintf(stderr, "nextn forge: cannot read %s: %s\n", path, strerror(errno));
        return false;
    }
    bool ok = cli_parse_ids(text, ids, n, msg, sizeof msg);
    free(text);
    if (!ok) {
        fprintf(stderr, "nextn forge: %s: %s\n", path, msg);
        return false;
    }
    for (size_t i = 0; i < *n; i++)
        if ((*ids)[i] >= V) {
            fprintf(stderr, "nextn forge: %s: token %d at index %zu is past the vocabulary (%d)\n", path, (*ids)[i], i, V);
            free(*ids);
            *ids = NULL;
            return false;
        }
    return true;
}

/* ================================================================ acceptance (probe) */

typedef struct accept {
    double greedy, overlap; /* greedy vs trunk, E[min(p,q)] at T = 0.9 */
    int64_t n;
} accept;

/* The held-out file's tokens: a .ids file, or text for the model's tokenizer (no special tokens,
 * as `nextn probe` reads files). */
static bool heldout_ids(nx_model *m, const char *path, int32_t **ids, size_t *n) {
    if (ends_with(path, ".ids")) return read_ids(path, nx_model_get_info(m)->vocab_size, ids, n);
    const nx_tokenizer *tok = nx_model_tokenizer(m);
    size_t len = 0;
    char *text = tok ? cli_read_file(path, &len) : NULL;
    nx_error err = {0};
    bool ok = text && nx_tokenizer_encode(tok, text, len, false, ids, n, &err) == NX_OK;
    if (!ok)
        fprintf(stderr, "nextn forge: %s: %s\n", path,
                !tok ? "the model ships no tokenizer.json (give token ids in a .ids file)" : !text ? strerror(errno) : err.msg);
    free(text);
    return ok;
}

/* Probes every held-out file (k = 1, windows of 512, T = 0.9) into acc[i]. */
static bool probe_files(nx_model *m, const forge_args *a, accept *acc) {
    nx_sampler_params sp;
    nx_sampler_params_default(&sp);
    sp.temperature = 0.9f;
    for (int i = 0; i < a->n_heldout; i++) {
        size_t n = 0;
        int32_t *ids = NULL;
        nx_error err = {0};
        nx_probe_result r = {0};
        if (!heldout_ids(m, a->heldout[i], &ids, &n)) return false;
        bool ok = nx_probe_tokens(m, ids, n, 1, 512, &sp, &r, &err) == NX_OK;
        if (!ok) fprintf(stderr, "nextn forge: probe %s: %s\n", a->heldout[i], err.msg);
        free(ids);
        if (!ok) return false;
        double d = r.n[0] > 0 ? (double)r.n[0] : 1.0;
        acc[i] = (accept){r.hit_trunk[0] / d, r.overlap[0] / d, r.n[0]};
    }
    return true;
}

static void print_accept(const char *when, const forge_args *a, const accept *acc) {
    for (int i = 0; i < a->n_heldout; i++)
        fprintf(stderr, "nextn forge: %s: %s: greedy vs trunk %.4f, E[min(p,q)] T=0.9 %.4f (%lld rows)\n", when,
                a->heldout[i], acc[i].greedy, acc[i].overlap, (long long)acc[i].n);
}

/* ================================================================ corpus */

typedef struct tokbuf {
    int32_t *ids;
    size_t n, cap;
} tokbuf;

static bool tokbuf_add(tokbuf *b, const int32_t *ids, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n) cap *= 2;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p) return false;
        b->ids = p;
        b->cap = cap;
    }
    memcpy(b->ids + b->n, ids, n * sizeof *ids);
    b->n += n;
    return true;
}

/* Appends one document's tokens (with the tokenizer's begin-of-sequence token, if it adds one). */
static bool add_doc(const nx_tokenizer *tok, const char *text, size_t len, tokbuf *b, const char *file) {
    int32_t *ids = NULL;
    size_t n = 0;
    nx_error err = {0};
    if (nx_tokenizer_encode(tok, text, len, true, &ids, &n, &err) != NX_OK) {
        fprintf(stderr, "nextn forge: %s: %s\n", file, err.msg);
        return false;
    }
    bool ok = tokbuf_add(b, ids, n);
    free(ids);
    if (!ok) fprintf(stderr, "nextn forge: out of memory reading the corpus\n");
    return ok;
}

/* A .jsonl file: one JSON object per line whose "text" string is a document. */
static bool add_jsonl(const nx_tokenizer *tok, char *text, tokbuf *b, const char *file) {
    long line = 0;
    for (char *p = text, *nl; p && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        if (nl) *nl = 0;
        line++;
        if (!*p) continue;
        json_error_t je;
        json_t *o = json_loads(p, 0, &je);
        json_t *t = o ? json_object_get(o, "text") : NULL;
        if (!json_is_string(t)) {
            fprintf(stderr, "nextn forge: %s:%ld: %s\n", file, line, o ? "no \"text\" string" : je.text);
            json_decref(o);
            return false;
        }
        bool ok = add_doc(tok, json_string_value(t), json_string_length(t), b, file);
        json_decref(o);
        if (!ok) return false;
    }
    return true;
}

static bool read_corpus(nx_model *m, const forge_args *a, tokbuf *b) {
    const nx_tokenizer *tok = nx_model_tokenizer(m);
    for (int i = 0; i < a->n_corpus; i++) {
        if (ends_with(a->corpus[i], ".ids")) {
            int32_t *ids = NULL;
            size_t n = 0;
            bool ok = read_ids(a->corpus[i], nx_model_get_info(m)->vocab_size, &ids, &n) && tokbuf_add(b, ids, n);
            free(ids);
            if (!ok) return false;
            continue;
        }
        if (!tok) {
            fprintf(stderr, "nextn forge: %s: %s ships no tokenizer.json (give token ids in a .ids file)\n",
                    a->corpus[i], a->model);
            return false;
        }
        size_t len = 0;
        char *text = cli_read_file(a->corpus[i], &len);
        if (!text) {
            fprintf(stderr, "nextn forge: cannot read %s: %s\n", a->corpus[i], strerror(errno));
            return false;
        }
        bool ok = ends_with(a->corpus[i], ".jsonl") ? add_jsonl(tok, text, b, a->corpus[i])
                                                    : add_doc(tok, text, len, b, a->corpus[i]);
        free(text);
        if (!ok) return false;
    }
    return true;
}

/* ================================================================ the shard */

/* Restores the min-heap order (by x[idx[.]]) of idx[0..n) below node r. */
static void sift_down(const float *x, int32_t *idx, int n, int r) {
    for (;;) {
        int l = 2 * r + 1, s = r;
        if (l < n && x[idx[l]] < x[idx[s]]) s = l;
        if (l + 1 < n && x[idx[l + 1]] < x[idx[s]]) s = l + 1;
        if (s == r) return;
        int32_t t = idx[r];
        idx[r] = idx[s];
        idx[s] = t;
        r = s;
    }
}

/* The k largest of x[0..n) (k <= n) by value, largest first: a min-heap of the best k so far,
 * then heap-sorted. */
static void top_k(const float *x, int32_t n, int k, int32_t *idx) {
    for (int i = 0; i < k; i++) idx[i] = i;
    for (int r = k / 2 - 1; r >= 0; r--) sift_down(x, idx, k, r);
    for (int32_t i = k; i < n; i++) {
        if (x[i] <= x[idx[0]]) continue;
        idx[0] = i;
        sift_down(x, idx, k, 0);
    }
    for (int e = k - 1; e > 0; e--) {
        int32_t t = idx[0];
        idx[0] = idx[e];
        idx[e] = t;
        sift_down(x, idx, e, 0);
    }
}

typedef struct shard_files {
    FILE *tokens, *hidden, *ids, *logp;
} shard_files;

static void close_files(shard_files *f) {
    if (f->tokens) fclose(f->tokens);
    if (f->hidden) fclose(f->hidden);
    if (f->ids) fclose(f->ids);
    if (f->logp) fclose(f->logp);
}

static nx_status open_files(const char *dir, int64_t N, int64_t T, int64_t H, int64_t K, shard_files *f,
                            nx_error *err) {
    char p[PATH_MAX];
    int64_t s2[2] = {N, T}, s3h[3] = {N, T, H}, s3k[3] = {N, T, K};
    nx_status st;
    path_join(p, sizeof p, dir, "tokens.npy");
    if ((st = nx_npy_begin(p, "<i4", 2, s2, &f->tokens, err))) return st;
    path_join(p, sizeof p, dir, "hidden.npy");
    if ((st = nx_npy_begin(p, "<f2", 3, s3h, &f->hidden, err))) return st;
    path_join(p, sizeof p, dir, "topk_ids.npy");
    if ((st = nx_npy_begin(p, "<i4", 3, s3k, &f->ids, err))) return st;
    path_join(p, sizeof p, dir, "topk_logp.npy");
    return nx_npy_begin(p, "<f4", 3, s3k, &f->logp, err);
}

typedef struct dump_bufs {
    float *logits, *hidden, *logp;
    uint16_t *h16;
    int32_t *ids;
} dump_bufs;

/* One window's rows: tokens, hidden (f16), the trunk's top-k ids and log-probabilities. */
static bool write_window(const shard_files *f, const int32_t *t, int32_t T, int32_t H, int32_t V, int K,
                         dump_bufs *b) {
    for (size_t i = 0; i < (size_t)T * (size_t)H; i++) b->h16[i] = nx_f32_to_f16(b->hidden[i]);
    for (int32_t r = 0; r < T; r++) {
        const float *x = b->logits + (size_t)r * (size_t)V;
        float mx = x[0];
        for (int32_t v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
        double s = 0;
        for (int32_t v = 0; v < V; v++) s += exp((double)(x[v] - mx));
        float lse = mx + (float)log(s);
        int32_t *id = b->ids + (size_t)r * (size_t)K;
        top_k(x, V, K, id);
        for (int j = 0; j < K; j++) b->logp[(size_t)r * (size_t)K + (size_t)j] = x[id[j]] - lse;
    }
    size_t nk = (size_t)T * (size_t)K;
    return fwrite(t, sizeof *t, (size_t)T, f->tokens) == (size_t)T &&
           fwrite(b->h16, 2, (size_t)T * (size_t)H, f->hidden) == (size_t)T * (size_t)H &&
           fwrite(b->ids, sizeof(int32_t), nk, f->ids) == nk && fwrite(b->logp, sizeof(float), nk, f->logp) == nk;
}

/* The engine's own teacher-forced head logits over window 0, with its exact f32 hidden: the
 * trainer's forward must reproduce them before it trains. */
static nx_status write_check(nx_ctx *c, const char *dir, const int32_t *t, int32_t T, int32_t H, int32_t V,
                             dump_bufs *b, nx_error *err) {
    char p[PATH_MAX];
    nx_status st;
    if ((st = nx_ctx_eval_mtp(c, t, T, b->logits, err))) return st;
    int64_t sl[2] = {T - 1, V}, sh[2] = {T, H};
    path_join(p, sizeof p, dir, "check_mtp_logits.npy");
    if ((st = nx_npy_write_f32(p, b->logits, 2, sl, err))) return st;
    path_join(p, sizeof p, dir, "check_hidden.npy");
    return nx_npy_write_f32(p, b->hidden, 2, sh, err);
}

static void dump_progress(int64_t w, int64_t N, int32_t T, double t0) {
    if (!isatty(2) && w + 1 != N && (w + 1) % 256) return;
    double el = now() - t0, rate = (double)(w + 1) * T / (el > 0 ? el : 1e-9);
    double eta = (double)(N - w - 1) * T / (rate > 0 ? rate : 1);
    fprintf(stderr, "%snextn forge: shard %lld/%lld windows, %.0f tokens/s, ETA %d:%02d%s", isatty(2) ? "\r" : "",
            (long long)(w + 1), (long long)N, rate, (int)eta / 60, (int)eta % 60,
            isatty(2) && w + 1 != N ? "  " : "\n");
}

/* Runs the trunk over N windows of T tokens spread evenly over the corpus stream. */
static nx_status dump_windows(nx_model *m, const tokbuf *b, int64_t N, int32_t T, int K, const char *dir,
                              nx_error *err) {
    const nx_model_info *in = nx_model_get_info(m);
    const int32_t H = in->hidden_size, V = in->vocab_size;
    shard_files f = {0};
    dump_bufs d = {0};
    nx_ctx *c = NULL;
    nx_status st = open_files(dir, N, T, H, K, &f, err);
    if (!st) st = nx_ctx_new(m, T, &c, err);
    d.logits = malloc(sizeof(float) * (size_t)T * (size_t)V);
    d.hidden = malloc(sizeof(float) * (size_t)T * (size_t)H);
    d.logp = malloc(sizeof(float) * (size_t)T * (size_t)K);
    d.h16 = malloc(2 * (size_t)T * (size_t)H);
    d.ids = malloc(sizeof(int32_t) * (size_t)T * (size_t)K);
    if (!st && (!d.logits || !d.hidden || !d.logp || !d.h16 || !d.ids)) st = nx_fail(err, NX_E_NOMEM, "out of memory");
    double t0 = now();
    for (int64_t w = 0; !st && w < N; w++) {
        const int32_t *t = b->ids + (size_t)((double)w * (double)(b->n - (size_t)T) / (double)(N > 1 ? N - 1 : 1));
        nx_ctx_truncate(c, 0);
        if ((st = nx_ctx_eval(c, t, T, 0, d.logits, err)) || (st = nx_ctx_mtp_hidden(c, 0, T, d.hidden, err))) break;
        if (!write_window(&f, t, T, H, V, K, &d)) st = nx_fail(err, NX_E_IO, "%s: write failed: %s", dir, strerror(errno));
        if (!st && w == 0 && has_head(m)) st = write_check(c, dir, t, T, H, V, &d, err);
        if (!st) dump_progress(w, N, T, t0);
    }
    nx_ctx_free(c);
    close_files(&f);
    free(d.logits);
    free(d.hidden);
    free(d.logp);
    free(d.h16);
    free(d.ids);
    return st;
}

/* meta.json: what the shard holds and what the trainer needs to know about the head's wiring. */
static bool write_meta(const char *dir, const char *model, nx_model *m, const forge_args *a, int64_t N,
                       size_t corpus_tokens, double secs) {
    const nx_model_info *in = nx_model_get_info(m);
    json_t *files = json_array();
    for (int i = 0; i < a->n_corpus; i++) json_array_append_new(files, json_string(a->corpus[i]));
    json_t *o = json_pack("{sssssisisisisisIsIsosbsssfsb}", "model", model, "family", in->family, "windows", (int)N,
                          "ctx", a->ctx, "top_k", a->top_k, "hidden_size", in->hidden_size, "vocab_size",
                          in->vocab_size, "tokens", (json_int_t)(N * a->ctx), "corpus_tokens",
                          (json_int_t)corpus_tokens, "corpus", files, "mtp_zero_pos0", in->mtp_zero_pos0,
                          "mtp_concat", in->mtp_concat, "seconds", secs, "check", has_head(m));
    json_object_set_new(o, "requested_tokens", json_integer(a->tokens));
    char p[PATH_MAX];
    path_join(p, sizeof p, dir, "meta.json");
    int rc = o ? json_dump_file(o, p, JSON_INDENT(1)) : -1;
    json_decref(o);
    return rc == 0;
}

/* Whether work/shard already holds a complete shard of this model, corpus and settings (its
 * meta.json is written last), so a second run (other trainer settings) skips the dump. */
static bool shard_reusable(const char *shard, const char *model, const forge_args *a) {
    char p[PATH_MAX];
    path_join(p, sizeof p, shard, "meta.json");
    json_error_t je;
    json_t *o = json_load_file(p, 0, &je);
    json_t *files = o ? json_object_get(o, "corpus") : NULL;
    bool same = o && json_is_array(files) && json_array_size(files) == (size_t)a->n_corpus &&
                !strcmp(json_string_value(json_object_get(o, "model")) ? json_string_value(json_object_get(o, "model")) : "", model) &&
                json_integer_value(json_object_get(o, "ctx")) == a->ctx &&
                json_integer_value(json_object_get(o, "top_k")) == a->top_k &&
                json_integer_value(json_object_get(o, "requested_tokens")) == a->tokens;
    for (int i = 0; same && i < a->n_corpus; i++) {
        const char *f = json_string_value(json_array_get(files, (size_t)i));
        same = f && !strcmp(f, a->corpus[i]);
    }
    json_decref(o);
    return same;
}

/* Writes the shard of `a` for model dir `model` into work/shard (or keeps the one there). */
static bool make_shard(nx_model *m, const char *model, const forge_args *a, char *shard, size_t cap) {
    path_join(shard, cap, a->work, "shard");
    if (shard_reusable(shard, model, a)) {
        fprintf(stderr, "nextn forge: reusing the shard in %s\n", shard);
        return true;
    }
    char meta[PATH_MAX];
    path_join(meta, sizeof meta, shard, "meta.json");
    unlink(meta);
    if (!make_dir(a->work) || !make_dir(shard)) {
        fprintf(stderr, "nextn forge: cannot create %s: %s\n", shard, strerror(errno));
        return false;
    }
    double t0 = now();
    tokbuf b = {0};
    if (!read_corpus(m, a, &b)) {
        free(b.ids);
        return false;
    }
    if (b.n < (size_t)a->ctx + 2) {
        fprintf(stderr, "nextn forge: the corpus holds %zu tokens, fewer than one window of --ctx %d\n", b.n, a->ctx);
        free(b.ids);
        return false;
    }
    int64_t want = a->tokens / a->ctx, have = (int64_t)(b.n / (size_t)a->ctx);
    int64_t N = want < have ? want : have;
    if (N < 1) N = 1;
    fprintf(stderr, "nextn forge: corpus %zu tokens; shard of %lld windows of %d (%lld tokens) in %s\n", b.n,
            (long long)N, a->ctx, (long long)N * a->ctx, shard);
    nx_error err = {0};
    bool ok = dump_windows(m, &b, N, a->ctx, a->top_k, shard, &err) == NX_OK;
    if (!ok) fprintf(stderr, "nextn forge: shard: %s\n", err.msg);
    ok = ok && write_meta(shard, model, m, a, N, b.n, now() - t0);
    free(b.ids);
    return ok;
}

/* ================================================================ the trainer */

static void trainer_path(char *buf, size_t cap) {
    const char *env = getenv("NEXTN_FORGE_TRAINER");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        int k = snprintf(buf, cap, "%s/../tools/forge/train_head.py", exe);
        if (k > 0 && (size_t)k < cap && access(buf, R_OK) == 0) return;
    }
    snprintf(buf, cap, "tools/forge/train_head.py");
}

/* Runs the trainer with argv (NULL-terminated, argv[0] the script is prepended with python);
 * its output goes to the terminal. */
static bool run_trainer(const char *const *args) {
    const char *py = getenv("NEXTN_PYTHON");
    if (!py || !*py) py = "/usr/bin/python3";
    char script[PATH_MAX];
    trainer_path(script, sizeof script);
    const char *argv[64];
    int n = 0;
    argv[n++] = py;
    argv[n++] = script;
    for (; *args && n < 63; args++) argv[n++] = *args;
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    /* Ctrl-C at the terminal reaches the trainer too, which stops early and writes its head:
     * forge carries on with it (as system() does, the parent ignores SIGINT meanwhile) */
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGINT, &ign, &old);
    pid_t pid = fork();
    if (pid < 0) {
        sigaction(SIGINT, &old, NULL);
        fprintf(stderr, "nextn forge: fork: %s\n", strerror(errno));
        return false;
    }
    if (pid == 0) {
        sigaction(SIGINT, &old, NULL);
        execv(py, (char *const *)argv);
        fprintf(stderr, "nextn forge: cannot run %s: %s\n", py, strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    sigaction(SIGINT, &old, NULL);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
    if (WIFEXITED(status))
        fprintf(stderr, "nextn forge: the trainer (%s %s) failed with status %d\n", py, script, WEXITSTATUS(status));
    else
        fprintf(stderr, "nextn forge: the trainer (%s %s) was killed by signal %d\n", py, script, WTERMSIG(status));
    return false;
}

/* ================================================================ heads */

static bool graft(const char *base, const char *head, const char *dst, bool force) {
    nx_graft_opts o = {.dst = dst, .mode = NX_GRAFT_AUTO, .force = force};
    nx_convert_stats st;
    nx_error err = {0};
    if (nx_graft(base, head, &o, &st, &err) != NX_OK) {
        fprintf(stderr, "nextn forge: graft %s onto %s: %s\n", head, base, err.msg);
        return false;
    }
    return true;
}

/* The checkpoint the head starts from: MODEL itself (current), or MODEL with the head of DIR or
 * a random head grafted on, in work/init. */
static bool init_model(const forge_args *a, const char *init, char *w, size_t cap) {
    if (!strcmp(init, "current")) {
        snprintf(w, cap, "%s", a->model);
        return true;
    }
    path_join(w, cap, a->work, "init");
    if (!make_dir(a->work)) {
        fprintf(stderr, "nextn forge: cannot create %s: %s\n", a->work, strerror(errno));
        return false;
    }
    char head[PATH_MAX];
    if (!strncmp(init, "graft:", 6)) {
        snprintf(head, sizeof head, "%s", init + 6);
    } else {
        path_join(head, sizeof head, a->work, "random-head");
        const char *args[] = {"--random-head", head, "--model", a->model, NULL};
        if (!run_trainer(args)) return false;
    }
    return graft(a->model, head, w, true);
}

/* ================================================================ model card */

static json_t *accept_json(const forge_args *a, const accept *acc) {
    json_t *o = json_object();
    for (int i = 0; i < a->n_heldout; i++)
        json_object_set_new(o, a->heldout[i], json_pack("{sfsfsI}", "greedy_vs_trunk", acc[i].greedy,
                                                         "overlap_t0.9", acc[i].overlap, "rows", (json_int_t)acc[i].n));
    return o;
}

/* forge.json and a section of README.md in OUT. train.json (written by the trainer) gives the
 * steps, tokens, losses and wall time. */
static bool write_card(const forge_args *a, const char *init, const accept *before, const accept *after,
                       double secs) {
    char p[PATH_MAX];
    path_join(p, sizeof p, a->work, "head/train.json");
    json_error_t je;
    json_t *train = json_load_file(p, 0, &je);
    json_t *files = json_array();
    for (int i = 0; i < a->n_corpus; i++) json_array_append_new(files, json_string(a->corpus[i]));
    json_t *o = json_pack("{sssssosososf}", "base", a->model, "init", init, "corpus", files, "before",
                          accept_json(a, before), "after", accept_json(a, after), "wall_seconds", secs);
    json_object_set_new(o, "training", train ? train : json_null());
    path_join(p, sizeof p, a->out, "forge.json");
    bool ok = json_dump_file(o, p, JSON_INDENT(1)) == 0;
    json_t *steps = train ? json_object_get(train, "steps") : NULL;
    json_t *tsec = train ? json_object_get(train, "seconds") : NULL;
    path_join(p, sizeof p, a->out, "README.md");
    FILE *f = ok ? fopen(p, "a") : NULL;
    if (f) {
        fprintf(f, "\n## Forged MTP head\n\nThe MTP head was fitted to this trunk by `nextn forge` (self-distillation on the "
                   "trunk's own top-%d distribution, docs/forge.md), starting from the %s head: %lld steps, "
                   "%.1f min training, %.1f min in all (forge.json). Corpus:",
                a->top_k, init, steps ? (long long)json_integer_value(steps) : 0LL,
                tsec ? json_number_value(tsec) / 60.0 : 0.0, secs / 60.0);
        for (int i = 0; i < a->n_corpus; i++) fprintf(f, " `%s`", a->corpus[i]);
        fprintf(f, ".\n\n| held-out text | greedy vs trunk before | after | E[min(p,q)] T=0.9 before | after |\n"
                   "|---|---|---|---|---|\n");
        for (int i = 0; i < a->n_heldout; i++)
            fprintf(f, "| `%s` | %.4f | %.4f | %.4f | %.4f |\n", a->heldout[i], before[i].greedy, after[i].greedy,
                    before[i].overlap, after[i].overlap);
        ok = fclose(f) == 0;
    }
    json_decref(o);
    if (!ok) fprintf(stderr, "nextn forge: cannot write the model card in %s\n", a->out);
    return ok;
}

/* ================================================================ the command */

static int forge(const forge_args *a, double t0) {
    nx_model *m = load(a->model, a->threads);
    if (!m) return 1;
    const char *init = a->init ? a->init : has_head(m) ? "current" : "random";
    if (!strcmp(init, "current") && !has_head(m)) {
        fprintf(stderr, "nextn forge: --init current: %s has no MTP head (use --init random or graft:DIR)\n", a->model);
        nx_model_free(m);
        return 1;
    }
    nx_model_free(m);
    char w[PATH_MAX], shard[PATH_MAX], head[PATH_MAX];
    if (!init_model(a, init, w, sizeof w) || !(m = load(w, a->threads))) return 1;
    accept before[MAX_FILES], after[MAX_FILES];
    bool ok = probe_files(m, a, before);
    if (ok) print_accept("before", a, before);
    ok = ok && make_shard(m, w, a, shard, sizeof shard);
    nx_model_free(m);
    if (!ok) return 1;
    if (a->dump_only) return 0;
    path_join(head, sizeof head, a->work, "head");
    char steps[32], minutes[32], lr[32], batch[32], ce[32], threads[16];
    snprintf(steps, sizeof steps, "%lld", a->steps);
    snprintf(minutes, sizeof minutes, "%g", a->minutes);
    snprintf(lr, sizeof lr, "%g", a->lr > 0 ? a->lr : !strcmp(init, "random") ? 3e-3 : 1e-3);
    snprintf(batch, sizeof batch, "%d", a->batch);
    snprintf(ce, sizeof ce, "%g", a->ce_weight);
    snprintf(threads, sizeof threads, "%d", a->threads);
    const char *args[] = {"--model", w, "--shard", shard, "--out", head, "--steps", steps, "--minutes", minutes,
                          "--lr", lr, "--batch", batch, "--ce-weight", ce, "--threads", threads, NULL};
    if (!run_trainer(args) || !graft(a->model, head, a->out, a->force) || !(m = load(a->out, a->threads))) return 1;
    ok = probe_files(m, a, after);
    nx_model_free(m);
    if (!ok) return 1;
    print_accept("after", a, after);
    double secs = now() - t0;
    if (!write_card(a, init, before, after, secs)) return 1;
    fprintf(stderr, "nextn forge: wrote %s (head in model-mtp.safetensors, forge.json) in %.1f min\n", a->out,
            secs / 60.0);
    return 0;
}

int cli_forge(int argc, char **argv) {
    double t0 = now();
    forge_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    return forge(&a, t0);
}

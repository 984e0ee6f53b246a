/* The `nextn` command line: shared option parsing and helpers for the subcommands. Only the
 * CLI prints and exits; the library reports errors through nx_error. */
#ifndef NX_CLI_H
#define NX_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nextn.h"

typedef struct cli_opts {
    const char *model;
    const char *prompt;
    const char *prompt_file;
    const char *prompt_tokens;
    const char *tokens;      /* eval */
    const char *logits_out;  /* eval */
    const char *mtp_logits_out;
    int32_t n_predict;
    int32_t n_ctx;
    int threads;
    int32_t n_samples;
    int32_t probe_k;
    int32_t simulate_from; /* probe */
    bool stats, print_ids, chat, json, quiet;
    bool json_object;        /* run --json-object */
    const char *json_schema; /* run --json-schema */
    const char *prompt_cache;        /* run --prompt-cache FILE */
    bool prompt_cache_all;           /* run --prompt-cache-all: save the generated rows too */
    bool prompt_cache_ro;            /* run --prompt-cache-ro: load, never write */
    bool temp_set;
    nx_gen_params gen;       /* gen.sampling.logit_bias points into logit_bias */
    nx_logit_bias logit_bias[64]; /* --logit-bias, repeatable */
    nx_load_params load;
    bool router_stats_ro; /* inspect: --router-stats is read, never written */
    const char *modes; /* bench */
    int32_t repeat;    /* bench */
    int32_t membw_mb;  /* bench --membw: MB per bandwidth reading (0: none) */
    const char *split;      /* --split pipeline|experts (NULL: one process) */
    double split_timeout;   /* --split-timeout SEC */
    const char **args; /* positional arguments */
    int n_args;
} cli_opts;

/* Parses argv for subcommand `cmd`; prints usage and returns 1 on --help, 2 on a bad option,
 * 0 on success. */
int cli_parse(const char *cmd, const char *usage, int argc, char **argv, cli_opts *o);

/* Strict number parsing for option values: the whole string, within [lo, hi]. */
bool cli_parse_int(const char *s, long long lo, long long hi, long long *out);
bool cli_parse_double(const char *s, double lo, double hi, double *out);
/* A size in bytes, > 0: digits with an optional K, M, G or T suffix (powers of 1024; "GiB",
 * "GB" read the same). */
bool cli_parse_size(const char *s, uint64_t *out);
/* "f32" or "f16" (--kv-type). */
bool cli_parse_kv_type(const char *s, nx_kv_type *out);
/* --act-bits' default: NX_ACT_BITS=16 in the environment gives 16, else 8. */
int cli_env_act_bits(void);

/* Prints "nextn CMD: <message>" and a pointer to --help; returns 2 (the usage-error exit code). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The model directory: -m, else $NEXTN_MODEL, else the shipped default model. */
const char *cli_model_dir(const cli_opts *o);

/* --split NAME: joins the MPI job and sets lp->dist and lp->split (the job is left at exit).
 * Returns 0, or prints the error and returns the exit code. */
int cli_split_join(const char *cmd, const char *split, double timeout_s, nx_load_params *lp);
/* After loading with a dist: a rank other than 0 follows rank 0 and exits when it is done (or
 * failed); rank 0 returns. m NULL (the load failed): the job is aborted. */
void cli_split_follow(nx_model *m, const nx_load_params *lp);
/* Job-wide network traffic of a split model, one line to f (nothing for one process). */
void cli_split_print_net(nx_model *m, double tokens, FILE *f);
#define CLI_SPLIT_USAGE \
    "      --split MODE        under mpirun: one model across the ranks, MODE pipeline (layer ranges)\n" \
    "                          or experts (routed experts divided); docs/multinode.md\n" \
    "      --split-timeout S   seconds a rank waits for another before the run fails (default 300)\n"

/* Loads the model with a progress line on stderr; prints the error and returns NULL on failure. */
nx_model *cli_load_model(const cli_opts *o);
/* Frees the model after a command that ended with rc, first saving its router statistics to
 * --router-stats FILE when rc is 0 (the file's counts plus this run's); returns rc, or 1 when
 * that save fails (the message printed). */
int cli_free_model(const cli_opts *o, nx_model *m, int rc);

/* Parses "1,2,3" or "1 2 3" into a malloc'd array. Returns false with a message on bad input. */
bool cli_parse_ids(const char *s, int32_t **ids, size_t *n, char *msg, size_t msg_len);

/* The prompt's token ids from --prompt-tokens, -p or -f (with --chat rendering). */
bool cli_prompt_ids(const cli_opts *o, nx_model *m, int32_t **ids, size_t *n);

char *cli_read_file(const char *path, size_t *len);

int cli_run(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_probe(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_forge(int argc, char **argv);
int cli_shard(int argc, char **argv);

#endif

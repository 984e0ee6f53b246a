/* `nextn shard`: cuts a checkpoint into one share per rank of a split (nx_model_shard, share.h),
 * so each node of a multi-node job holds only the weights its rank reads. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nextn_tools.h"

static const char *usage_shard =
    "usage: nextn shard [-m MODEL] --split pipeline|experts --ranks R -o DIR\n"
    "\n"
    "Cuts checkpoint MODEL (default: $NEXTN_MODEL, else the shipped model) into DIR/rank-0 ..\n"
    "DIR/rank-(R-1): each a checkpoint directory with the config, tokenizer and chat-template files\n"
    "and only the tensors that rank of `mpirun -n R nextn ... --split MODE` reads, their bytes\n"
    "copied as they are (same layout and precision), and nextn-share.json saying what the share is.\n"
    "  pipeline  the rank's trunk layers; the embedding on the first and last ranks; final norm,\n"
    "            lm_head and the MTP head on the last\n"
    "  experts   everything but the routed experts on every rank, and of those the rank's id range\n"
    "            (stacked experts, MLX switch_mlp or fused gate_up_proj: a tensor of the range's rows)\n"
    "Copy DIR/rank-N to node N (or share DIR) and run with -m DIR: each rank loads DIR/rank-<rank>.\n"
    "A share is refused by a job of another split, rank count or rank, and when its tensors are not\n"
    "those of the checkpoint it was cut from (docs/multinode.md).\n"
    "\n"
    "  -m, --model DIR     the checkpoint to cut\n"
    "      --split MODE    pipeline or experts\n"
    "      --ranks R       ranks of the job, 2 to 64\n"
    "  -o, --out DIR       where rank-0 .. rank-(R-1) are written (they must not exist)\n";

int cli_shard(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"split", required_argument, 0, 's'},
                                         {"ranks", required_argument, 0, 'r'}, {"out", required_argument, 0, 'o'},
                                         {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    cli_opts o = {0};
    const char *out = NULL, *split = NULL;
    long long ranks = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "m:o:h", opts, NULL)) != -1;) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'o': out = optarg; break;
        case 's':
            if (strcmp(optarg, "pipeline") && strcmp(optarg, "experts"))
                return cli_usage_error("shard", "--split %s: expected pipeline or experts", optarg);
            split = optarg;
            break;
        case 'r':
            if (!cli_parse_int(optarg, 2, 64, &ranks)) return cli_usage_error("shard", "--ranks %s: 2 to 64", optarg);
            break;
        case 'h': fputs(usage_shard, stdout); return 0;
        default: return cli_usage_error("shard", "unknown option");
        }
    }
    if (optind < argc) return cli_usage_error("shard", "unexpected argument '%s'", argv[optind]);
    if (!split || !ranks || !out) return cli_usage_error("shard", "--split, --ranks and -o are required");
    const char *src = cli_model_dir(&o);
    uint64_t bytes[64], total = 0;
    nx_error err = {0};
    const nx_split s = !strcmp(split, "pipeline") ? NX_SPLIT_PIPELINE : NX_SPLIT_EXPERTS;
    if (nx_model_shard(src, out, s, (int)ranks, bytes, &total, &err) != NX_OK) {
        fprintf(stderr, "nextn shard: %s\n", err.msg);
        return 1;
    }
    for (int r = 0; r < ranks; r++)
        printf("%s/rank-%d: %.3f MB of weights (%.1f%% of %s's %.3f MB)\n", out, r, (double)bytes[r] / 1e6,
               total ? 100.0 * (double)bytes[r] / (double)total : 0.0, src, (double)total / 1e6);
    return 0;
}

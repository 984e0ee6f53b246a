/* Checkpoint conversion: a checkpoint of any supported family (HF/Tencent or MLX layout, float or
 * already affine-quantized) → an MLX-layout, affine-quantized one as mlx-lm writes it, with
 * the MTP head in a model-mtp.safetensors sidecar; and grafting a head from one checkpoint
 * onto another of the same family. An offline tool linked into the nextn command, not part of
 * the runtime library (libnextn.a); reports progress and notes via callbacks. */
#ifndef NX_CLI_CONVERTER_H
#define NX_CLI_CONVERTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn_tools.h"

/* A per-module precision rule. `pattern` is an fnmatch glob on the module path after MLX
 * sanitizing (no ".weight"), e.g. "mtp.*", "*.self_attn.*", "lm_head". bits == 0 keeps the
 * module float in `dtype` (NX_DTYPE_COUNT = the source's float dtype); bits > 0 quantizes it
 * with `group` (0 = the group that would otherwise apply). */
typedef struct nx_quant_rule {
    const char *pattern;
    int bits, group;
    nx_dtype dtype;
} nx_quant_rule;

/* Progress over output bytes; note() receives one-line remarks (a module kept float because
 * its input dim is not divisible by the group, a dropped tensor, ...). Both may be NULL. */
typedef struct nx_convert_hooks {
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void (*note)(void *user, const char *msg);
    void *user;
} nx_convert_hooks;

typedef struct nx_convert_opts {
    int bits, group;          /* trunk quantization; bits == 0 keeps the trunk float */
    int mtp_bits, mtp_group;  /* head; mtp_bits == 0: default 8-bit with eh_proj float;
                                 mtp_group == 0: the trunk group (64 if the trunk is float) */
    bool no_mtp;              /* drop the MTP head */
    const nx_quant_rule *rules; /* applied after the defaults; the last matching rule wins */
    size_t n_rules;
    uint64_t shard_bytes;     /* max tensor bytes per trunk file; 0 = 5 GB (mlx-lm's default) */
    bool force;               /* DST may already hold a checkpoint: its model files are replaced */
    nx_convert_hooks hooks;
} nx_convert_opts;

/* What was written (for the CLI's summary line). */
typedef struct nx_convert_stats {
    uint64_t src_bytes, dst_bytes; /* tensor bytes read / written */
    int64_t n_tensors;             /* tensors written */
    int64_t n_quantized, n_float;  /* linear modules written quantized / float */
    int n_files;                   /* safetensors files written (sidecar included) */
    bool has_mtp;
    int32_t mtp_experts;           /* experts of the written head (0: no head) */
} nx_convert_stats;

void nx_convert_opts_default(nx_convert_opts *o); /* 4-bit g64, head 8-bit + eh_proj float */

/* Converts the checkpoint directory `src` into `dst` (created if missing; refused if it holds
 * model files unless o->force, and refused if it is `src`). Writes model.safetensors or
 * model-XXXXX-of-YYYYY.safetensors shards with metadata {"format":"mlx"}, the head in
 * model-mtp.safetensors, model.safetensors.index.json, config.json with the quantization
 * block (duplicated as quantization_config), and copies of the tokenizer / generation files.
 * Files are written under temporary names and renamed at the end. */
nx_status nx_convert(const char *src, const char *dst, const nx_convert_opts *o, nx_convert_stats *stats,
                     nx_error *err);

typedef enum nx_graft_mode {
    NX_GRAFT_AUTO = 0,   /* quantized base: head 8-bit with eh_proj float; float base: as stored */
    NX_GRAFT_KEEP_DTYPE, /* the head's tensors as stored (float stays float, quantized stays) */
    NX_GRAFT_QUANT,      /* every head module at bits/group (router 8-bit g64, as mlx-lm) */
} nx_graft_mode;

typedef struct nx_graft_opts {
    const char *dst;     /* NULL: in place into the base directory */
    nx_graft_mode mode;
    int bits, group;     /* NX_GRAFT_QUANT */
    const nx_quant_rule *rules;
    size_t n_rules;
    bool force;          /* dst (≠ base) may already hold a checkpoint */
    nx_convert_hooks hooks;
} nx_graft_opts;

/* Adds or replaces the MTP head of checkpoint `base` with the head of `head_src` (any
 * supported layout): written as model-mtp.safetensors in the destination, any previous head
 * removed (trunk files holding one are rewritten without it), config.json updated
 * (num_nextn_predict_layers ≥ 1, quantization overrides of the head's modules) and the index
 * if there is one. Families, hidden size, vocabulary and the per-layer shapes the head shares
 * with the trunk must agree; the head's expert count may differ. */
nx_status nx_graft(const char *base, const char *head_src, const nx_graft_opts *o, nx_convert_stats *stats,
                   nx_error *err);

#endif

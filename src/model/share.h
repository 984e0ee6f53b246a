/* One rank's share of a checkpoint (docs/multinode.md §1): `nextn shard` cuts a checkpoint for a
 * split over R ranks into DIR/rank-0 .. DIR/rank-(R-1), each a checkpoint directory with the
 * config, tokenizer and chat-template files and only the tensors its rank reads, their bytes
 * copied as they are, and nextn-share.json saying what it is:
 *  - pipeline: the trunk layers of the rank's range; the embedding on rank 0 and the last rank;
 *    final norm, lm_head and the MTP head (inline or a sidecar) on the last rank;
 *  - experts: everything but the routed experts on every rank, and of those the rank's id range:
 *    per-expert tensors whole, stacked ones ([E, ...]: MLX switch_mlp, fused gate_up_proj) as a
 *    tensor of the range's rows under the stacked tensor's name.
 * nextn-share.json: {"format": "nextn-share", "version": 1, "split", "ranks", "rank", "source",
 * "source_digest" (nx_store_digest of the source), "layers": [lo, hi] and "head" (pipeline),
 * "experts": [e0, e1, E] (experts: the trunk's routed experts), "absent": the source's tensors
 * the share lacks, "rows": those it holds rows of ({"name", "dtype", "shape", "rows": [lo, hi]}).
 * A rank loading a share declares those to the store (nx_store_declare), so the model loads as
 * the source checkpoint whose bytes this rank never reads are absent. */
#ifndef NX_MODEL_SHARE_H
#define NX_MODEL_SHARE_H

#include <stdint.h>

#include "base/error.h"
#include "nextn.h"

/* Cuts the checkpoint at src into out/rank-0 .. out/rank-(ranks-1) for split over ranks ranks
 * (2..64). bytes[r] (ranks entries, may be NULL) receives the tensor bytes of rank r's share and
 * *src_bytes the source's. Refuses an out/rank-N that exists, and a share as the source. */
nx_status nx_model_shard(const char *src, const char *out, nx_split split, int ranks, uint64_t *bytes,
                         uint64_t *src_bytes, nx_error *err);

/* Loading (model.c): the directory rank `rank` loads from dir: dir/rank-<rank> when dir holds
 * no config.json but that subdirectory does, else dir (into buf of cap bytes). */
const char *nx_share_dir(const char *dir, int rank, char *buf, size_t cap);
/* After the store is opened: a share's nextn-share.json checked against the job (split, ranks,
 * this rank) and its tensors declared to the store; nothing without that file. */
nx_status nx_share_open(nx_model *m, const char *dir, const nx_load_params *p, nx_error *err);
/* After the weights are loaded: the share's tensors are those of the checkpoint it names. */
nx_status nx_share_check(const nx_model *m, const char *dir, nx_error *err);

#endif

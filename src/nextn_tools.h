/* The interface of the programs in tools/ (the nextn command line and its checkpoint converter)
 * beyond the public API in include/nextn.h: the internal declarations they may use, each with
 * the reason. Tools include nextn.h and this header, never a module header (src/MODULE/NAME.h)
 * directly, so everything the tools depend on inside the library is listed here. */
#ifndef NX_TOOLS_H
#define NX_TOOLS_H

#include "nextn.h"

#include "base/clock.h"         /* nx_now_s: bench timing */
#include "base/pool.h"          /* converter: the worker pool that converts row chunks */
#include "decode/probe.h"       /* nextn probe: MTP acceptance probing */
#include "io/config.h"          /* converter: config.json of the source checkpoint */
#include "io/npy.h"             /* nextn eval: logits written as .npy */
#include "io/quantize.h"        /* converter: the MLX affine quantizer */
#include "io/safetensors.h"     /* converter: reading and writing shards */
#include "kernels/kernels.h"    /* bench: the dispatched ISA and activation width */
#include "model/dense_timing.h" /* bench: dense-equivalent decode timing */
#include "model/share.h"        /* nextn shard: cutting a checkpoint into per-rank shares */
#include "serve/server.h"       /* nextn serve */
#include "text/chat.h"          /* --chat: chat template rendering */

#endif

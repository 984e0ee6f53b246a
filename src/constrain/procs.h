/* JSON mode and tool-call mode as logits processors (nx_logits_proc in nextn.h). */
#ifndef NX_CONSTRAIN_PROCS_H
#define NX_CONSTRAIN_PROCS_H

#include "nextn.h"

/* JSON mode over vocab v (schema may be NULL); with wait, the mask starts after token `after`
 * is generated. Everything passed must outlive the processor; ops->free releases it. */
nx_status nx_json_proc_new(const nx_json_vocab *v, const nx_json_schema *schema, bool wait, int32_t after,
                           int32_t n_vocab, nx_logits_proc *out, nx_error *err);
/* Tool-call mode under grammar g (must outlive the processor). */
nx_status nx_tool_proc_new(const nx_tool_grammar *g, int32_t n_vocab, nx_logits_proc *out, nx_error *err);

/* The processors the json / tools fields of p ask for, into out (room for one): tool-call
 * mode, else JSON mode, else none. *n receives the count. */
nx_status nx_constrain_procs(const nx_sampler_params *p, int32_t n_vocab, nx_logits_proc *out, size_t *n,
                             nx_error *err);

#endif

/* Chat templates: turns an OpenAI-style message list into the prompt text a model was trained
 * on, by rendering the model's Jinja chat template the way transformers' apply_chat_template
 * does, and reads that template and the bos/eos strings from tokenizer_config.json. */
#ifndef NX_TEXT_CHAT_H
#define NX_TEXT_CHAT_H

#include <jansson.h>
#include <stdbool.h>

#include "nextn.h"
#include "text/jinja.h"

/* Builds the render context transformers passes: messages, tools (JSON null when absent, as
 * transformers passes tools=None), add_generation_prompt, bos_token / eos_token (omitted when
 * NULL), then every key of extra_kwargs (enable_thinking, reasoning_effort, ...), which override.
 * Returns a new reference, or NULL when out of memory. */
json_t *nx_chat_context_new(const json_t *messages, const json_t *tools, bool add_generation_prompt,
                            const json_t *extra_kwargs, const char *bos_token, const char *eos_token);

/* Renders an already parsed template with the context above. *out is malloc'd, owned by the
 * caller. raise_exception() in the template fails with NX_E_ARG and the template's message. */
nx_status nx_chat_render_parsed(const nx_jinja *tmpl, const json_t *messages, const json_t *tools,
                                bool add_generation_prompt, const json_t *extra_kwargs,
                                const char *bos_token, const char *eos_token, char **out,
                                nx_error *err);

/* Parses template_src and renders it once (nx_chat_render_parsed for repeated use). */
nx_status nx_chat_render(const char *template_src, const json_t *messages, const json_t *tools,
                         bool add_generation_prompt, const json_t *extra_kwargs,
                         const char *bos_token, const char *eos_token, char **out, nx_error *err);

/* Reads tokenizer_config.json: `chat_template` as a string, or a list of {name, template} from
 * which "default" is taken; when the key is absent (or null), a chat_template.jinja file next to
 * the config is used (newer Hugging Face repositories), and when that is absent too the model has
 * no template: NX_OK with *template_src NULL (a base model). A file that is not a JSON object, a
 * chat_template of another type, a list entry that is not {name, template} strings or a list
 * without "default" is NX_E_CONFIG / NX_E_FORMAT naming the problem. bos_token / eos_token may be strings or
 * {"content": ...} objects; an absent or null token yields NULL. token_suffix is the string Hy3
 * spells its output markers with (":opensource"), NULL when absent; it is read whenever the file
 * is a JSON object, even when the template then fails (a base model's config has none). All
 * outputs are malloc'd and owned by the caller; bos, eos and token_suffix may be NULL when not
 * wanted. */
nx_status nx_chat_template_from_config(const char *tokenizer_config_json_path, char **template_src,
                                       char **bos, char **eos, char **token_suffix, nx_error *err);

#endif

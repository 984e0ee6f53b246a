/* Chat template front end: builds transformers' apply_chat_template context around a message
 * list and renders the model's Jinja template with it; reads the template and special-token
 * strings from tokenizer_config.json (or a sibling chat_template.jinja). */
#include "text/chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/file.h"

json_t *nx_chat_context_new(const json_t *messages, const json_t *tools, bool add_generation_prompt,
                            const json_t *extra_kwargs, const char *bos_token, const char *eos_token) {
    json_t *ctx = json_object();
    if (!ctx) return NULL;
    json_t *msgs = messages ? json_incref((json_t *)messages) : json_array();
    json_t *tl = tools ? json_incref((json_t *)tools) : json_null();
    if (json_object_set_new(ctx, "messages", msgs) || json_object_set_new(ctx, "tools", tl) ||
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt)))
        goto fail;
    if (bos_token && json_object_set_new(ctx, "bos_token", json_string(bos_token))) goto fail;
    if (eos_token && json_object_set_new(ctx, "eos_token", json_string(eos_token))) goto fail;
    if (extra_kwargs && json_is_object(extra_kwargs) && json_object_update(ctx, (json_t *)extra_kwargs)) goto fail;
    return ctx;
fail:
    json_decref(ctx);
    return NULL;
}

nx_status nx_chat_render_parsed(const nx_jinja *tmpl, const json_t *messages, const json_t *tools,
                                bool add_generation_prompt, const json_t *extra_kwargs,
                                const char *bos_token, const char *eos_token, char **out,
                                nx_error *err) {
    *out = NULL;
    if (messages && !json_is_array(messages)) return nx_fail(err, NX_E_ARG, "chat: messages must be a JSON array");
    if (tools && !json_is_array(tools) && !json_is_null(tools))
        return nx_fail(err, NX_E_ARG, "chat: tools must be a JSON array");
    if (extra_kwargs && !json_is_object(extra_kwargs) && !json_is_null(extra_kwargs))
        return nx_fail(err, NX_E_ARG, "chat: template kwargs must be a JSON object");
    json_t *ctx = nx_chat_context_new(messages, tools, add_generation_prompt, extra_kwargs, bos_token, eos_token);
    if (!ctx) return nx_fail(err, NX_E_NOMEM, "chat: out of memory");
    nx_status st = nx_jinja_render(tmpl, ctx, out, NULL, err);
    json_decref(ctx);
    return st;
}

nx_status nx_chat_render(const char *template_src, const json_t *messages, const json_t *tools,
                         bool add_generation_prompt, const json_t *extra_kwargs,
                         const char *bos_token, const char *eos_token, char **out, nx_error *err) {
    *out = NULL;
    if (!template_src) return nx_fail(err, NX_E_ARG, "chat: no chat template");
    nx_jinja *t = NULL;
    nx_status st = nx_jinja_parse(template_src, strlen(template_src), &t, err);
    if (st != NX_OK) {
        nx_error_prefix(err, "chat template");
        return st;
    }
    st = nx_chat_render_parsed(t, messages, tools, add_generation_prompt, extra_kwargs, bos_token, eos_token, out, err);
    nx_jinja_free(t);
    return st;
}

/* Reads a whole file into a NUL-terminated malloc'd buffer. */
static nx_status read_text_file(const char *path, char **out, nx_error *err) {
    return nx_file_read_all(path, NX_JSON_FILE_MAX, out, NULL, err);
}

/* A special token as a string: "text", {"content": "text", ...}, or absent/null -> NULL. */
static nx_status token_string(const json_t *root, const char *key, const char *path, char **out, nx_error *err) {
    *out = NULL;
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return NX_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return nx_fail(err, NX_E_CONFIG, "%s: %s is neither a string nor {content: string}", path, key);
    if (!(*out = strdup(json_string_value(v)))) return nx_fail(err, NX_E_NOMEM, "%s: out of memory", path);
    return NX_OK;
}

nx_status nx_chat_template_from_config(const char *path, char **template_src, char **bos, char **eos,
                                       char **token_suffix, nx_error *err) {
    *template_src = NULL;
    if (bos) *bos = NULL;
    if (eos) *eos = NULL;
    if (token_suffix) *token_suffix = NULL;
    char *text = NULL, *sibling = NULL;
    json_t *root = NULL;
    nx_status st = read_text_file(path, &text, err);
    if (st != NX_OK) return st;
    json_error_t je;
    root = json_loads(text, 0, &je);
    free(text);
    if (!root || !json_is_object(root)) {
        st = nx_fail(err, NX_E_FORMAT, "%s: line %d: %s", path, root ? 1 : je.line, root ? "not a JSON object" : je.text);
        goto fail;
    }
    const char *suffix = json_string_value(json_object_get(root, "token_suffix"));
    if (token_suffix && suffix && !(*token_suffix = strdup(suffix))) goto nomem;
    const json_t *ct = json_object_get(root, "chat_template");
    if (json_is_string(ct)) {
        if (!(*template_src = strdup(json_string_value(ct)))) goto nomem;
    } else if (json_is_array(ct)) {
        size_t i;
        const json_t *item;
        json_array_foreach(ct, i, item) {
            const json_t *name = json_object_get(item, "name"), *tmpl = json_object_get(item, "template");
            if (!json_is_string(name) || !json_is_string(tmpl)) {
                st = nx_fail(err, NX_E_CONFIG, "%s: chat_template[%zu] is not a {name: string, template: string} object",
                             path, i);
                goto fail;
            }
            if (!strcmp(json_string_value(name), "default")) {
                if (!(*template_src = strdup(json_string_value(tmpl)))) goto nomem;
                break;
            }
        }
        if (!*template_src) {
            st = nx_fail(err, NX_E_CONFIG, "%s: chat_template list has no \"default\" entry", path);
            goto fail;
        }
    } else if (!ct || json_is_null(ct)) {
        const char *slash = strrchr(path, '/');
        size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
        static const char name[] = "chat_template.jinja";
        if (!(sibling = malloc(dir + sizeof name))) goto nomem;
        memcpy(sibling, path, dir);
        memcpy(sibling + dir, name, sizeof name);
        /* neither: a base model, no template (NX_OK, NULL); a sibling that cannot be read is an error */
        struct stat sb;
        if ((lstat(sibling, &sb) == 0 || errno != ENOENT) &&
            (st = read_text_file(sibling, template_src, err)) != NX_OK)
            goto fail;
    } else {
        st = nx_fail(err, NX_E_CONFIG, "%s: chat_template must be a string or a list of {name, template}", path);
        goto fail;
    }
    if (bos && (st = token_string(root, "bos_token", path, bos, err)) != NX_OK) goto fail;
    if (eos && (st = token_string(root, "eos_token", path, eos, err)) != NX_OK) goto fail;
    free(sibling);
    json_decref(root);
    return NX_OK;
nomem:
    st = nx_fail(err, NX_E_NOMEM, "%s: out of memory", path);
fail:
    free(sibling);
    json_decref(root);
    free(*template_src);
    *template_src = NULL;
    if (bos) {
        free(*bos);
        *bos = NULL;
    }
    if (eos) {
        free(*eos);
        *eos = NULL;
    }
    return st;
}

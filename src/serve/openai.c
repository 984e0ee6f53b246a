/* OpenAI request parsing/validation and response building. Every field a client can send is
 * checked for type and range here, and each failure names the field the way OpenAI's own API
 * does ("Invalid 'temperature': ..."), so clients get an actionable 400 rather than a crash. */
#include "serve/openai.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ errors */

void nx_oai_error_set(nx_oai_error *e, int http_status, const char *type, const char *param,
                      const char *code, const char *fmt, ...) {
    if (!e) return;
    e->http_status = http_status;
    e->type = type ? type : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* A JSON string from arbitrary bytes: invalid UTF-8 becomes U+FFFD rather than failing. */
static json_t *jstr(const char *s, size_t len) {
    size_t n = 0;
    char *clean = nx_oai_utf8_sanitize(s ? s : "", s ? len : 0, &n);
    if (!clean) return NULL;
    json_t *j = json_stringn_nocheck(clean, n);
    free(clean);
    return j;
}

static json_t *jstr_or_null(const char *s) { return (s && *s) ? jstr(s, strlen(s)) : json_null(); }

static char *dump(json_t *j) {
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(j);
    return s;
}

char *nx_oai_error_json(const nx_oai_error *e) {
    json_t *inner = json_object();
    json_t *root = json_object();
    if (!inner || !root) {
        json_decref(inner);
        json_decref(root);
        return NULL;
    }
    json_object_set_new(inner, "message", jstr(e->message, strlen(e->message)));
    json_object_set_new(inner, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(inner, "param", jstr_or_null(e->param));
    json_object_set_new(inner, "code", jstr_or_null(e->code));
    json_object_set_new(root, "error", inner);
    return dump(root);
}

/* ================================================================ UTF-8 */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is invalid or truncated. Rejects
 * overlong forms, surrogates and code points above U+10FFFF. */
static size_t utf8_valid_len(const unsigned char *s, size_t avail) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
    else return 0;
    if (avail < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return n;
}

char *nx_oai_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    /* Worst case every byte becomes the 3-byte U+FFFD. */
    if (len > (SIZE_MAX - 1) / 3) return NULL;
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_valid_len(u + i, len - i);
        if (n == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += 1;
        } else {
            memcpy(out + o, u + i, n);
            o += n;
            i += n;
        }
    }
    out[o] = '\0';
    if (out_len) *out_len = o;
    return out;
}

/* ================================================================ request fields */

static const char *type_name(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}

static nx_status bad_type(nx_oai_error *e, const char *param, const char *want, const json_t *got) {
    nx_oai_error_set(e, 400, "invalid_request_error", param, "invalid_type",
                     "Invalid type for '%s': expected %s, but got %s instead.", param, want,
                     type_name(got));
    return NX_E_ARG;
}

static nx_status bad_value(nx_oai_error *e, const char *param, const char *code, const char *fmt,
                           ...) __attribute__((format(printf, 4, 5)));
static nx_status bad_value(nx_oai_error *e, const char *param, const char *code, const char *fmt,
                           ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nx_oai_error_set(e, 400, "invalid_request_error", param, code, "Invalid '%s': %s", param, msg);
    return NX_E_ARG;
}

/* A present, non-null field, or NULL. OpenAI treats an explicit null as "not given". */
static json_t *field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

static nx_status opt_bool(json_t *obj, const char *key, bool *out, nx_oai_error *e) {
    json_t *v = field(obj, key);
    if (!v) return NX_OK;
    if (!json_is_boolean(v)) return bad_type(e, key, "a boolean", v);
    *out = json_is_true(v);
    return NX_OK;
}

/* Integers may arrive as integral decimals (10.0) from some clients; accept those. */
static nx_status opt_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                         bool *present, nx_oai_error *e) {
    json_t *v = field(obj, key);
    if (present) *present = false;
    if (!v) return NX_OK;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d == floor(d)) || d < -9.2e18 || d > 9.2e18) return bad_type(e, key, "an integer", v);
        x = (int64_t)d;
    } else {
        return bad_type(e, key, "an integer", v);
    }
    if (x < lo)
        return bad_value(e, key, "integer_below_min_value",
                         "integer below minimum value. Expected a value >= %lld, but got %lld "
                         "instead.",
                         (long long)lo, (long long)x);
    if (x > hi)
        return bad_value(e, key, "integer_above_max_value",
                         "integer above maximum value. Expected a value <= %lld, but got %lld "
                         "instead.",
                         (long long)hi, (long long)x);
    *out = x;
    if (present) *present = true;
    return NX_OK;
}

/* A number in [lo, hi] (or (lo, hi] when lo_open). */
static nx_status opt_real(json_t *obj, const char *key, double lo, double hi, bool lo_open,
                          double *out, bool *present, nx_oai_error *e) {
    json_t *v = field(obj, key);
    if (present) *present = false;
    if (!v) return NX_OK;
    if (!json_is_number(v)) return bad_type(e, key, "a decimal", v);
    double x = json_number_value(v);
    if (!isfinite(x)) return bad_type(e, key, "a finite decimal", v);
    if (lo_open ? x <= lo : x < lo)
        return bad_value(e, key, "decimal_below_min_value",
                         "decimal below minimum value. Expected a value %s %g, but got %g "
                         "instead.",
                         lo_open ? ">" : ">=", lo, x);
    if (x > hi)
        return bad_value(e, key, "decimal_above_max_value",
                         "decimal above maximum value. Expected a value <= %g, but got %g "
                         "instead.",
                         hi, x);
    *out = x;
    if (present) *present = true;
    return NX_OK;
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static nx_status oom(nx_oai_error *e) {
    nx_oai_error_set(e, 500, "server_error", NULL, NULL, "The server ran out of memory.");
    return NX_E_NOMEM;
}

/* ---------------------------------------------------------------- stop */

static nx_status parse_stop(json_t *root, nx_oai_request *r, nx_oai_error *e) {
    json_t *v = field(root, "stop");
    if (!v) return NX_OK;
    size_t n;
    if (json_is_string(v)) n = 1;
    else if (json_is_array(v)) n = json_array_size(v);
    else return bad_type(e, "stop", "a string or an array of strings", v);
    if (n > NX_OAI_MAX_STOP)
        return bad_value(e, "stop", "array_above_max_length",
                         "array too long. Expected an array with maximum length %d, but got an "
                         "array with length %zu instead.",
                         NX_OAI_MAX_STOP, n);
    if (n == 0) return NX_OK;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop) return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        char param[32];
        snprintf(param, sizeof param, json_is_string(v) ? "stop" : "stop[%zu]", i);
        if (!json_is_string(s)) return bad_type(e, param, "a string", s);
        size_t len = json_string_length(s);
        if (len == 0)
            return bad_value(e, param, "empty_string",
                             "empty string. Expected a string with minimum length 1.");
        if (len > NX_OAI_MAX_STOP_LEN)
            return bad_value(e, param, "string_above_max_length",
                             "string too long. Expected a string with maximum length %d, but got "
                             "a string with length %zu instead.",
                             NX_OAI_MAX_STOP_LEN, len);
        if (memchr(json_string_value(s), '\0', len))
            return bad_value(e, param, "invalid_value", "the string contains a NUL character.");
        r->stop[i] = dup_bytes(json_string_value(s), len);
        if (!r->stop[i]) return oom(e);
        r->n_stop = i + 1;
    }
    return NX_OK;
}

/* ---------------------------------------------------------------- speculative */

static nx_status parse_speculative(json_t *root, nx_oai_request *r, nx_oai_error *e) {
    json_t *v = field(root, "speculative");
    if (!v) return NX_OK;
    if (!json_is_object(v)) return bad_type(e, "speculative", "an object", v);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (strcmp(key, "draft") != 0 && strcmp(key, "verify") != 0) {
            char param[128];
            snprintf(param, sizeof param, "speculative.%.60s", key);
            nx_oai_error_set(e, 400, "invalid_request_error", param, "unknown_parameter",
                             "Unrecognized parameter '%s': 'speculative' accepts 'draft' and "
                             "'verify'.",
                             param);
            return NX_E_ARG;
        }
    }
    json_t *d = field(v, "draft");
    if (d) {
        if (json_is_string(d)) {
            if (strcmp(json_string_value(d), "auto") != 0)
                return bad_value(e, "speculative.draft", "invalid_value",
                                 "expected \"auto\" or an integer in 0..%d, got \"%.60s\".",
                                 NX_MAX_DRAFT, json_string_value(d));
            r->draft = NX_DRAFT_AUTO;
        } else {
            int64_t k = 0;
            nx_status st = opt_int(v, "draft", 0, NX_MAX_DRAFT, &k, NULL, e);
            if (st != NX_OK) {
                /* Re-label the field with its full path. */
                char msg[sizeof e->message];
                snprintf(msg, sizeof msg, "%s", e->message);
                nx_oai_error_set(e, 400, "invalid_request_error", "speculative.draft", e->code,
                                 "%s (speculative.draft accepts \"auto\" or 0..%d)", msg,
                                 NX_MAX_DRAFT);
                return st;
            }
            r->draft = (int32_t)k;
        }
        r->has_draft = true;
    }
    json_t *ver = field(v, "verify");
    if (ver) {
        if (!json_is_string(ver)) return bad_type(e, "speculative.verify", "a string", ver);
        const char *s = json_string_value(ver);
        if (strcmp(s, "residual") == 0) r->verify = NX_VERIFY_RESIDUAL;
        else if (strcmp(s, "match") == 0) r->verify = NX_VERIFY_MATCH;
        else
            return bad_value(e, "speculative.verify", "invalid_value",
                             "expected \"residual\" or \"match\", got \"%.60s\".", s);
        r->has_verify = true;
    }
    return NX_OK;
}

/* ---------------------------------------------------------------- chat messages */

static bool role_known(const char *role) {
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool",
                                        "function"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(role, roles[i]) == 0) return true;
    return false;
}

/* Flattens a list of content parts to one string; only text parts can reach a text model. */
static nx_status flatten_parts(json_t *parts, size_t mi, json_t **out, nx_oai_error *e) {
    size_t total = 0, n = json_array_size(parts);
    char param[128];
    for (size_t j = 0; j < n; j++) {
        json_t *p = json_array_get(parts, j);
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", mi, j);
        if (!json_is_object(p)) return bad_type(e, param, "an object", p);
        json_t *type = json_object_get(p, "type");
        if (!json_is_string(type)) {
            snprintf(param, sizeof param, "messages[%zu].content[%zu].type", mi, j);
            return type ? bad_type(e, param, "a string", type)
                        : bad_value(e, param, "missing_required_parameter",
                                    "missing required field.");
        }
        const char *t = json_string_value(type);
        if (strcmp(t, "text") != 0 && strcmp(t, "input_text") != 0) {
            snprintf(param, sizeof param, "messages[%zu].content[%zu].type", mi, j);
            return bad_value(e, param, "unsupported_value",
                             "content parts of type '%.40s' are not supported by this text-only "
                             "model; use 'text'.",
                             t);
        }
        json_t *text = json_object_get(p, "text");
        if (!json_is_string(text)) {
            snprintf(param, sizeof param, "messages[%zu].content[%zu].text", mi, j);
            return bad_type(e, param, "a string", text ? text : json_null());
        }
        total += json_string_length(text) + 1;
    }
    char *buf = malloc(total + 1);
    if (!buf) return oom(e);
    size_t o = 0;
    for (size_t j = 0; j < n; j++) {
        json_t *text = json_object_get(json_array_get(parts, j), "text");
        if (j) buf[o++] = '\n';
        memcpy(buf + o, json_string_value(text), json_string_length(text));
        o += json_string_length(text);
    }
    *out = json_stringn_nocheck(buf, o);
    free(buf);
    return *out ? NX_OK : oom(e);
}

static nx_status parse_tool_calls(json_t *calls, size_t mi, bool args_as_text, nx_oai_error *e) {
    char param[128];
    snprintf(param, sizeof param, "messages[%zu].tool_calls", mi);
    if (!json_is_array(calls)) return bad_type(e, param, "an array", calls);
    for (size_t j = 0; j < json_array_size(calls); j++) {
        json_t *c = json_array_get(calls, j);
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu]", mi, j);
        if (!json_is_object(c)) return bad_type(e, param, "an object", c);
        json_t *fn = json_object_get(c, "function");
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function", mi, j);
        if (!json_is_object(fn)) return bad_type(e, param, "an object", fn ? fn : json_null());
        json_t *name = json_object_get(fn, "name");
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function.name", mi, j);
        if (!json_is_string(name)) return bad_type(e, param, "a string", name ? name : json_null());
        json_t *args = json_object_get(fn, "arguments");
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function.arguments", mi, j);
        if (args && !json_is_string(args) && !json_is_object(args))
            return bad_type(e, param, "a string", args);
        /* OpenAI sends the arguments as a JSON string; templates read them as a mapping
         * (Hy3's writes one <arg_key>/<arg_value> pair per key), so an object string becomes the
         * object, as vLLM and llama.cpp pass it; a template that writes them as text (DeepSeek-V3.1's
         * concatenates them) gets the string, an object serialized */
        if (args_as_text) {
            char *t = json_is_object(args) ? json_dumps(args, JSON_COMPACT) : NULL;
            if (json_is_object(args) && (!t || json_object_set_new(fn, "arguments", json_string(t)) != 0)) {
                free(t);
                return oom(e);
            }
            free(t);
            continue;
        }
        json_t *obj = json_is_string(args) ? json_loadb(json_string_value(args), json_string_length(args), 0, NULL)
                                           : NULL;
        if (json_is_object(obj)) json_object_set(fn, "arguments", obj);
        json_decref(obj);
    }
    return NX_OK;
}

static nx_status parse_messages(json_t *root, nx_oai_request *r, bool args_as_text, nx_oai_error *e) {
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs || json_is_null(msgs)) {
        nx_oai_error_set(e, 400, "invalid_request_error", "messages",
                         "missing_required_parameter", "Missing required parameter: 'messages'.");
        return NX_E_ARG;
    }
    if (!json_is_array(msgs)) return bad_type(e, "messages", "an array", msgs);
    size_t n = json_array_size(msgs);
    if (n == 0)
        return bad_value(e, "messages", "empty_array",
                         "empty array. Expected an array with minimum length 1, but got an empty "
                         "array instead.");
    r->messages = json_array();
    if (!r->messages) return oom(e);
    char param[128];
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return bad_type(e, param, "an object", m);
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role) {
            nx_oai_error_set(e, 400, "invalid_request_error", param, "missing_required_parameter",
                             "Missing required parameter: '%s'.", param);
            return NX_E_ARG;
        }
        if (!json_is_string(role)) return bad_type(e, param, "a string", role);
        const char *rs = json_string_value(role);
        if (!role_known(rs))
            return bad_value(e, param, "invalid_value",
                             "unknown role '%.40s'. Supported values are: 'system', 'developer', "
                             "'user', 'assistant', 'tool' and 'function'.",
                             rs);
        bool assistant = strcmp(rs, "assistant") == 0;

        json_t *copy = json_deep_copy(m);
        if (!copy) return oom(e);
        if (json_array_append_new(r->messages, copy) != 0) return oom(e);

        json_t *content = json_object_get(m, "content");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (!content || json_is_null(content)) {
            /* An assistant turn that only calls tools has no content. */
            if (!assistant) {
                nx_oai_error_set(e, 400, "invalid_request_error", param,
                                 "missing_required_parameter", "Missing required parameter: '%s'.",
                                 param);
                return NX_E_ARG;
            }
        } else if (json_is_array(content)) {
            json_t *flat = NULL;
            nx_status st = flatten_parts(content, i, &flat, e);
            if (st != NX_OK) return st;
            json_object_set_new(copy, "content", flat);
        } else if (!json_is_string(content)) {
            return bad_type(e, param, "a string or an array of content parts", content);
        }
        json_t *name = json_object_get(m, "name");
        if (name && !json_is_null(name) && !json_is_string(name)) {
            snprintf(param, sizeof param, "messages[%zu].name", i);
            return bad_type(e, param, "a string", name);
        }
        json_t *calls = json_object_get(copy, "tool_calls");
        if (calls && !json_is_null(calls)) {
            nx_status st = parse_tool_calls(calls, i, args_as_text, e);
            if (st != NX_OK) return st;
        }
        json_t *tcid = json_object_get(m, "tool_call_id");
        if (tcid && !json_is_null(tcid) && !json_is_string(tcid)) {
            snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
            return bad_type(e, param, "a string", tcid);
        }
    }
    return NX_OK;
}

static nx_status parse_tools(json_t *root, nx_oai_request *r, nx_oai_error *e) {
    json_t *tools = field(root, "tools");
    bool use_tools = true;
    json_t *choice = field(root, "tool_choice");
    if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (strcmp(c, "none") == 0) use_tools = false;
        else if (strcmp(c, "required") == 0) r->tool_required = true;
        else if (strcmp(c, "auto") != 0)
            return bad_value(e, "tool_choice", "invalid_value",
                             "'%.40s' is not a tool choice: use \"auto\", \"none\", \"required\" or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}.", c);
    } else if (json_is_object(choice)) {
        json_t *type = json_object_get(choice, "type"), *fn = json_object_get(choice, "function");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return bad_value(e, "tool_choice.type", "invalid_value", "the tool choice's type must be \"function\".");
        json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name))
            return bad_type(e, "tool_choice.function.name", "a string", name ? name : json_null());
        r->tool_name = strdup(json_string_value(name));
        if (!r->tool_name) return oom(e);
        r->tool_required = true;
    } else if (choice) {
        return bad_type(e, "tool_choice", "a string or an object", choice);
    }
    if (!tools && !r->tool_required) return NX_OK;
    if (tools && !json_is_array(tools)) return bad_type(e, "tools", "an array", tools);
    char param[128];
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *t = json_array_get(tools, i);
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (!json_is_object(t)) return bad_type(e, param, "an object", t);
        json_t *type = json_object_get(t, "type");
        snprintf(param, sizeof param, "tools[%zu].type", i);
        if (type && !json_is_null(type) &&
            !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0))
            return bad_value(e, param, "unsupported_value", "only 'function' tools are supported.");
        json_t *fn = json_object_get(t, "function");
        snprintf(param, sizeof param, "tools[%zu].function", i);
        if (!json_is_object(fn)) return bad_type(e, param, "an object", fn ? fn : json_null());
        json_t *name = json_object_get(fn, "name");
        snprintf(param, sizeof param, "tools[%zu].function.name", i);
        if (!json_is_string(name)) return bad_type(e, param, "a string", name ? name : json_null());
    }
    if (use_tools && json_array_size(tools) > 0) r->tools = json_incref(tools);
    if (r->tool_required && !r->tools)
        return bad_value(e, "tool_choice", "invalid_value", "tool_choice asks for a tool call, but no tools are given.");
    if (r->tool_name) {
        size_t i;
        json_t *t;
        json_array_foreach(r->tools, i, t) {
            const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            if (n && strcmp(n, r->tool_name) == 0) return NX_OK;
        }
        return bad_value(e, "tool_choice.function.name", "invalid_value",
                         "tool_choice names the function '%.60s', which is not among the tools.", r->tool_name);
    }
    return NX_OK;
}

/* ---------------------------------------------------------------- completions prompt */

static nx_status parse_ids(json_t *arr, const char *param, const nx_oai_limits *lim,
                           nx_oai_prompt *p, nx_oai_error *e) {
    size_t n = json_array_size(arr);
    p->ids = malloc((n ? n : 1) * sizeof *p->ids);
    if (!p->ids) return oom(e);
    int64_t hi = (lim && lim->vocab_size > 0) ? lim->vocab_size - 1 : INT32_MAX;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(arr, i);
        if (!json_is_integer(t)) return bad_type(e, param, "an array of token ids", t);
        json_int_t id = json_integer_value(t);
        if (id < 0 || id > hi)
            return bad_value(e, param, "invalid_value",
                             "token id %lld is outside the vocabulary (0..%lld).", (long long)id,
                             (long long)hi);
        p->ids[i] = (int32_t)id;
    }
    p->n_ids = n;
    return NX_OK;
}

static nx_status parse_prompt(json_t *root, const nx_oai_limits *lim, nx_oai_request *r,
                              nx_oai_error *e) {
    json_t *v = json_object_get(root, "prompt");
    if (!v || json_is_null(v)) {
        nx_oai_error_set(e, 400, "invalid_request_error", "prompt", "missing_required_parameter",
                         "Missing required parameter: 'prompt'.");
        return NX_E_ARG;
    }
    const char *want = "a string, an array of strings, an array of token ids or an array of "
                       "token-id arrays";
    if (json_is_string(v)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) return oom(e);
        r->n_prompts = 1;
        r->prompts[0].text = dup_bytes(json_string_value(v), json_string_length(v));
        if (!r->prompts[0].text) return oom(e);
        r->prompts[0].text_len = json_string_length(v);
        return NX_OK;
    }
    if (!json_is_array(v)) return bad_type(e, "prompt", want, v);
    size_t n = json_array_size(v);
    if (n == 0)
        return bad_value(e, "prompt", "empty_array",
                         "empty array. Expected a prompt or a list of prompts.");
    json_t *first = json_array_get(v, 0);
    if (json_is_integer(first)) { /* one pre-tokenized prompt */
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) return oom(e);
        r->n_prompts = 1;
        return parse_ids(v, "prompt", lim, &r->prompts[0], e);
    }
    if (n > NX_OAI_MAX_PROMPTS)
        return bad_value(e, "prompt", "array_above_max_length",
                         "array too long. Expected at most %d prompts, but got %zu.",
                         NX_OAI_MAX_PROMPTS, n);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts) return oom(e);
    r->n_prompts = n;
    char param[32];
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(v, i);
        snprintf(param, sizeof param, "prompt[%zu]", i);
        if (json_is_string(p)) {
            if (!json_is_string(first)) return bad_type(e, param, "an array of token ids", p);
            r->prompts[i].text = dup_bytes(json_string_value(p), json_string_length(p));
            if (!r->prompts[i].text) return oom(e);
            r->prompts[i].text_len = json_string_length(p);
        } else if (json_is_array(p)) {
            if (!json_is_array(first)) return bad_type(e, param, "a string", p);
            nx_status st = parse_ids(p, param, lim, &r->prompts[i], e);
            if (st != NX_OK) return st;
        } else {
            return bad_type(e, param, json_is_string(first) ? "a string" : "an array of token ids",
                            p);
        }
    }
    return NX_OK;
}

/* ---------------------------------------------------------------- the request */

/* logit_bias: {"token id": bias in [-100, 100]} (OpenAI's form; ids as decimal strings). */
static nx_status parse_logit_bias(json_t *root, const nx_oai_limits *lim, nx_oai_request *r, nx_oai_error *e) {
    json_t *lb = field(root, "logit_bias");
    if (!lb) return NX_OK;
    if (!json_is_object(lb)) return bad_type(e, "logit_bias", "an object", lb);
    const size_t n = json_object_size(lb);
    if (n == 0) return NX_OK;
    const int64_t vocab = lim && lim->vocab_size > 0 ? lim->vocab_size : INT32_MAX;
    if ((int64_t)n > vocab)
        return bad_value(e, "logit_bias", "invalid_value", "logit_bias has %zu entries, more than the %lld tokens.",
                         n, (long long)vocab);
    r->logit_bias = calloc(n, sizeof *r->logit_bias);
    if (!r->logit_bias) return oom(e);
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        char *end = NULL;
        errno = 0;
        const long long id = key[0] >= '0' && key[0] <= '9' ? strtoll(key, &end, 10) : -1;
        if (id < 0 || errno || !end || *end || id >= vocab)
            return bad_value(e, "logit_bias", "invalid_value",
                             "logit_bias keys must be token ids in [0, %lld), but got '%.40s'.", (long long)vocab,
                             key);
        const double b = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(b >= -100.0 && b <= 100.0))
            return bad_value(e, "logit_bias", "invalid_value",
                             "logit_bias values must be numbers in [-100, 100], but token %lld has %s.", id,
                             json_is_number(v) ? "one out of range" : type_name(v));
        r->logit_bias[r->n_logit_bias++] = (nx_logit_bias){(int32_t)id, (float)b};
    }
    r->sampling.logit_bias = r->logit_bias;
    r->sampling.n_logit_bias = r->n_logit_bias;
    return NX_OK;
}

static nx_status parse_common(json_t *root, const nx_oai_limits *lim, nx_oai_request *r,
                              nx_oai_error *e) {
    nx_status st;
    json_t *model = field(root, "model");
    if (model) {
        if (!json_is_string(model)) return bad_type(e, "model", "a string", model);
        r->model = dup_bytes(json_string_value(model), json_string_length(model));
        if (!r->model) return oom(e);
        if (lim && lim->model_id && strcmp(r->model, lim->model_id) != 0) {
            nx_oai_error_set(e, 400, "invalid_request_error", "model", "model_not_found",
                             "The model '%.200s' does not exist. This server serves '%.200s'.",
                             r->model, lim->model_id);
            return NX_E_ARG;
        }
    }

    /* max_completion_tokens supersedes the deprecated max_tokens when both are sent. */
    int64_t mt = 0;
    bool has = false;
    if ((st = opt_int(root, "max_tokens", 1, 1 << 30, &mt, &has, e)) != NX_OK) return st;
    if (has) r->max_tokens = (int32_t)mt;
    if ((st = opt_int(root, "max_completion_tokens", 1, 1 << 30, &mt, &has, e)) != NX_OK) return st;
    if (has) r->max_tokens = (int32_t)mt;

    double x;
    nx_sampler_params *sp = &r->sampling;
    if ((st = opt_real(root, "temperature", 0, 2, false, &x, &has, e)) != NX_OK) return st;
    if (has) sp->temperature = (float)x;
    if ((st = opt_real(root, "top_p", 0, 1, false, &x, &has, e)) != NX_OK) return st;
    if (has) {
        /* top_p = 0 keeps only the most likely token: greedy. */
        if (x <= 0) sp->temperature = 0, sp->top_p = 1;
        else sp->top_p = (float)x;
    }
    int64_t k = 0;
    if ((st = opt_int(root, "top_k", -1, 1 << 30, &k, &has, e)) != NX_OK) return st;
    if (has) sp->top_k = k < 0 ? 0 : (int32_t)k; /* -1 is vLLM's "off" */
    if ((st = opt_real(root, "min_p", 0, 1, false, &x, &has, e)) != NX_OK) return st;
    if (has) sp->min_p = (float)x;
    if ((st = opt_real(root, "presence_penalty", -2, 2, false, &x, &has, e)) != NX_OK) return st;
    if (has) sp->presence_penalty = (float)x;
    if ((st = opt_real(root, "frequency_penalty", -2, 2, false, &x, &has, e)) != NX_OK) return st;
    if (has) sp->frequency_penalty = (float)x;
    if ((st = opt_real(root, "repetition_penalty", 0, 10, true, &x, &has, e)) != NX_OK) return st;
    if (has) sp->repetition_penalty = (float)x;
    int64_t seed = 0;
    if ((st = opt_int(root, "seed", INT64_MIN, INT64_MAX, &seed, &r->has_seed, e)) != NX_OK)
        return st;
    if (r->has_seed) sp->seed = (uint64_t)seed;

    int64_t n = 1;
    if ((st = opt_int(root, "n", 1, NX_OAI_MAX_N, &n, NULL, e)) != NX_OK) return st;
    r->n = (int32_t)n;
    if (r->kind == NX_OAI_COMPLETION) {
        int64_t best_of = 1;
        if ((st = opt_int(root, "best_of", INT64_MIN, INT64_MAX, &best_of, NULL, e)) != NX_OK)
            return st;
        if (best_of != 1)
            return bad_value(e, "best_of", "unsupported_value", "only best_of=1 is supported.");
    }

    if ((st = parse_stop(root, r, e)) != NX_OK) return st;

    if ((st = opt_bool(root, "stream", &r->stream, e)) != NX_OK) return st;
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) return bad_type(e, "stream_options", "an object", so);
        if (!r->stream) {
            nx_oai_error_set(e, 400, "invalid_request_error", "stream_options", "invalid_value",
                             "The 'stream_options' parameter is only allowed when 'stream' is "
                             "enabled.");
            return NX_E_ARG;
        }
        json_t *iu = field(so, "include_usage");
        if (iu) {
            if (!json_is_boolean(iu)) return bad_type(e, "stream_options.include_usage", "a boolean", iu);
            r->include_usage = json_is_true(iu);
        }
    }

    if (r->kind == NX_OAI_CHAT) {
        if ((st = opt_bool(root, "logprobs", &r->logprobs, e)) != NX_OK) return st;
        int64_t tl = 0;
        if ((st = opt_int(root, "top_logprobs", 0, NX_OAI_MAX_TOP_LOGPROBS, &tl, &has, e)) != NX_OK)
            return st;
        if (has && !r->logprobs) {
            nx_oai_error_set(e, 400, "invalid_request_error", "top_logprobs", "invalid_value",
                             "Invalid 'top_logprobs': 'logprobs' must be set to true when "
                             "'top_logprobs' is used.");
            return NX_E_ARG;
        }
        r->top_logprobs = (int32_t)tl;
    } else {
        /* Completions: logprobs is the number of alternatives (0..5), presence turns it on. */
        int64_t lp = 0;
        if ((st = opt_int(root, "logprobs", 0, 5, &lp, &has, e)) != NX_OK) return st;
        r->logprobs = has;
        r->top_logprobs = (int32_t)lp;
        if ((st = opt_bool(root, "echo", &r->echo, e)) != NX_OK) return st;
        json_t *suffix = field(root, "suffix");
        if (suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0))
            return bad_value(e, "suffix", "unsupported_value", "suffix is not supported.");
    }

    if ((st = parse_logit_bias(root, lim, r, e)) != NX_OK) return st;
    json_t *rf = field(root, "response_format");
    if (rf) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_object(rf)) return bad_type(e, "response_format", "an object", rf);
        if (!json_is_string(t))
            return bad_value(e, "response_format", "invalid_value", "response_format.type must be a string.");
        if (strcmp(json_string_value(t), "json_object") == 0) r->json_object = true;
        else if (strcmp(json_string_value(t), "json_schema") == 0) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!schema)
                return bad_value(e, "response_format", "invalid_value",
                                 "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}.");
            char *text = json_dumps(schema, JSON_ENCODE_ANY | JSON_COMPACT);
            nx_error err = {0};
            nx_status cs = text ? nx_json_schema_new(text, strlen(text), &r->json_schema, &err) : NX_E_NOMEM;
            free(text);
            if (cs == NX_E_NOMEM) {
                nx_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
                return NX_E_NOMEM;
            }
            if (cs != NX_OK) return bad_value(e, "response_format", "unsupported_value", "%s.", err.msg);
            r->json_object = true;
        }
        else if (strcmp(json_string_value(t), "text") != 0)
            return bad_value(e, "response_format", "invalid_value",
                             "response_format.type must be \"text\" or \"json_object\".");
    }

    if ((st = parse_speculative(root, r, e)) != NX_OK) return st;
    if ((st = opt_bool(root, "ignore_eos", &r->ignore_eos, e)) != NX_OK) return st;
    int64_t min_tokens = 0;
    if ((st = opt_int(root, "min_tokens", 0, 1 << 30, &min_tokens, NULL, e)) != NX_OK) return st;
    r->min_tokens = (int32_t)min_tokens;
    json_t *ids = field(root, "stop_token_ids");
    if (ids) {
        if (!json_is_array(ids)) return bad_type(e, "stop_token_ids", "an array of token ids", ids);
        if (json_array_size(ids) > NX_OAI_MAX_STOP_IDS)
            return bad_value(e, "stop_token_ids", "array_above_max_length", "stop_token_ids: at most %d ids.",
                             NX_OAI_MAX_STOP_IDS);
        const int64_t vocab = lim && lim->vocab_size > 0 ? lim->vocab_size : INT32_MAX;
        r->stop_token_ids = malloc(sizeof(int32_t) * (json_array_size(ids) + 1));
        if (!r->stop_token_ids) {
            nx_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            return NX_E_NOMEM;
        }
        for (size_t i = 0; i < json_array_size(ids); i++) {
            json_t *v = json_array_get(ids, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
                return bad_value(e, "stop_token_ids", "invalid_value",
                                 "stop_token_ids[%zu] must be a token id in [0, %lld).", i, (long long)vocab);
            r->stop_token_ids[r->n_stop_token_ids++] = (int32_t)json_integer_value(v);
        }
    }
    return NX_OK;
}

nx_status nx_oai_request_parse(nx_oai_kind kind, const char *body, size_t len,
                               const nx_oai_limits *lim, nx_oai_request *out, nx_oai_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    /* OpenAI's defaults: temperature 1, everything else off. */
    out->sampling.temperature = 1.0f;
    out->sampling.top_p = 1.0f;
    out->sampling.top_k = 0;
    out->sampling.min_p = 0.0f;
    out->sampling.repetition_penalty = 1.0f;
    out->sampling.presence_penalty = 0.0f;
    out->sampling.frequency_penalty = 0.0f;
    out->sampling.seed = 0;
    out->add_generation_prompt = true;
    out->draft = NX_DRAFT_AUTO;
    out->verify = NX_VERIFY_RESIDUAL;

    json_error_t je;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        nx_oai_error_set(e, 400, "invalid_request_error", NULL, "invalid_json",
                         "We could not parse the JSON body of your request: %s (line %d, column "
                         "%d). The body must be a JSON object.",
                         je.text, je.line, je.column);
        return NX_E_ARG;
    }
    nx_status st;
    if (!json_is_object(root)) {
        nx_oai_error_set(e, 400, "invalid_request_error", NULL, "invalid_json",
                         "The request body must be a JSON object, but got %s.", type_name(root));
        st = NX_E_ARG;
        goto done;
    }
    if ((st = parse_common(root, lim, out, e)) != NX_OK) goto done;
    if (kind == NX_OAI_CHAT) {
        if ((st = parse_messages(root, out, lim && lim->args_as_text, e)) != NX_OK) goto done;
        if ((st = parse_tools(root, out, e)) != NX_OK) goto done;
        if ((st = opt_bool(root, "add_generation_prompt", &out->add_generation_prompt, e)) != NX_OK)
            goto done;
        json_t *kw = field(root, "chat_template_kwargs");
        if (kw) {
            if (!json_is_object(kw)) {
                st = bad_type(e, "chat_template_kwargs", "an object", kw);
                goto done;
            }
            /* the variables the renderer sets from validated fields, and the template's globals,
             * are not the request's to replace */
            static const char *const reserved[] = {"messages", "tools", "bos_token", "eos_token",
                                                   "add_generation_prompt", "raise_exception", "strftime_now",
                                                   "namespace", "range", "dict"};
            for (size_t k = 0; k < sizeof reserved / sizeof reserved[0]; k++)
                if (json_object_get(kw, reserved[k])) {
                    nx_oai_error_set(e, 400, "invalid_request_error", "chat_template_kwargs", "reserved_name",
                                     "chat_template_kwargs may not set '%s': the server sets it.", reserved[k]);
                    st = NX_E_ARG;
                    goto done;
                }
            out->template_kwargs = json_incref(kw);
        }
    } else {
        if ((st = parse_prompt(root, lim, out, e)) != NX_OK) goto done;
    }
done:
    json_decref(root);
    return st;
}

void nx_oai_request_free(nx_oai_request *r) {
    if (!r) return;
    free(r->model);
    json_decref(r->messages);
    json_decref(r->tools);
    free(r->tool_name);
    json_decref(r->template_kwargs);
    for (size_t i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    if (r->stop)
        for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->logit_bias);
    free(r->stop_token_ids);
    nx_json_schema_free(r->json_schema);
    memset(r, 0, sizeof *r);
}

/* ================================================================ responses */

static const char *object_name(nx_oai_kind k, bool chunk) {
    if (k == NX_OAI_CHAT) return chunk ? "chat.completion.chunk" : "chat.completion";
    return "text_completion";
}

static json_t *envelope(const nx_oai_meta *m, bool chunk) {
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "id", json_string(m->id ? m->id : ""));
    json_object_set_new(o, "object", json_string(object_name(m->kind, chunk)));
    json_object_set_new(o, "created", json_integer(m->created));
    json_object_set_new(o, "model", jstr(m->model ? m->model : "", m->model ? strlen(m->model) : 0));
    json_object_set_new(o, "system_fingerprint", json_string("nextn"));
    return o;
}

/* OpenAI reports -9999 for tokens the distribution gives (almost) no mass; JSON has no -inf. */
static json_t *jlogprob(float lp) {
    double d = lp;
    if (!isfinite(d) || d < -9999.0) d = -9999.0;
    return json_real(d);
}

/* The token's raw bytes, via the caller's callback; *buf is malloc'd. */
static size_t token_bytes(const nx_oai_meta *m, int32_t id, char **buf) {
    char small[64];
    size_t n = m->token_text ? m->token_text(m->token_user, id, small, sizeof small) : 0;
    *buf = malloc(n + 1);
    if (!*buf) return 0;
    if (n <= sizeof small) memcpy(*buf, small, n);
    else n = m->token_text(m->token_user, id, *buf, n) < n ? 0 : n;
    (*buf)[n] = '\0';
    return n;
}

static json_t *jbytes(const char *b, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

/* Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}. */
static json_t *chat_logprobs(const nx_oai_meta *m, const nx_oai_choice *c) {
    json_t *content = json_array();
    if (!content) return NULL;
    for (size_t i = 0; i < c->n_lp; i++) {
        const nx_oai_logprob *lp = &c->lp[i];
        json_t *item = json_object();
        char *b = NULL;
        size_t n = token_bytes(m, lp->id, &b);
        json_object_set_new(item, "token", jstr(b, n));
        json_object_set_new(item, "logprob", jlogprob(lp->logprob));
        json_object_set_new(item, "bytes", jbytes(b, n));
        free(b);
        json_t *tops = json_array();
        for (int32_t t = 0; t < lp->n_top && t < NX_OAI_MAX_TOP_LOGPROBS; t++) {
            json_t *top = json_object();
            n = token_bytes(m, lp->top_id[t], &b);
            json_object_set_new(top, "token", jstr(b, n));
            json_object_set_new(top, "logprob", jlogprob(lp->top_logprob[t]));
            json_object_set_new(top, "bytes", jbytes(b, n));
            free(b);
            json_array_append_new(tops, top);
        }
        json_object_set_new(item, "top_logprobs", tops);
        json_array_append_new(content, item);
    }
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "refusal", json_null());
    return o;
}

/* Completions: {"tokens", "token_logprobs", "top_logprobs": [{tok: lp}], "text_offset"}. */
static json_t *completion_logprobs(const nx_oai_meta *m, const nx_oai_choice *c) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    size_t off = c->text_offset;
    for (size_t i = 0; i < c->n_lp; i++) {
        const nx_oai_logprob *lp = &c->lp[i];
        char *b = NULL;
        size_t n = token_bytes(m, lp->id, &b);
        json_array_append_new(tokens, jstr(b, n));
        free(b);
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += n;
        if (lp->none) { /* an echoed prompt's first token */
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, jlogprob(lp->logprob));
        json_t *top = json_object();
        for (int32_t t = 0; t < lp->n_top && t < NX_OAI_MAX_TOP_LOGPROBS; t++) {
            n = token_bytes(m, lp->top_id[t], &b);
            size_t clean_n = 0;
            char *key = nx_oai_utf8_sanitize(b ? b : "", b ? n : 0, &clean_n);
            free(b);
            /* Object keys cannot hold NUL; a NUL-byte token gets its escaped form. */
            if (key && !memchr(key, '\0', clean_n))
                json_object_set_new(top, key, jlogprob(lp->top_logprob[t]));
            else if (key)
                json_object_set_new(top, "\\u0000", jlogprob(lp->top_logprob[t]));
            free(key);
        }
        json_array_append_new(tops, top);
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", tokens);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

static json_t *usage_json(const nx_oai_usage *u) {
    json_t *o = json_object();
    json_object_set_new(o, "prompt_tokens", json_integer(u->prompt_tokens));
    json_object_set_new(o, "completion_tokens", json_integer(u->completion_tokens));
    json_object_set_new(o, "total_tokens", json_integer(u->prompt_tokens + u->completion_tokens));
    json_t *details = json_object(); /* OpenAI's: prompt tokens served from the cache */
    json_object_set_new(details, "cached_tokens", json_integer(u->cached_tokens));
    json_object_set_new(o, "prompt_tokens_details", details);
    json_t *s = json_object();
    json_object_set_new(s, "draft", u->draft == NX_DRAFT_AUTO ? json_string("auto")
                                                              : json_integer(u->draft));
    json_object_set_new(s, "verify", json_string(u->verify ? u->verify : "residual"));
    json_object_set_new(s, "drafts", json_integer(u->drafts));
    json_object_set_new(s, "drafted", json_integer(u->drafted));
    json_object_set_new(s, "accepted", json_integer(u->accepted));
    json_object_set_new(s, "acceptance_rate",
                        u->drafted > 0 ? json_real((double)u->accepted / (double)u->drafted)
                                       : json_null());
    /* docs/design.md §7: tokens per verify cycle, and the counts per chain position up to the
     * last position drafted */
    json_object_set_new(s, "mean_acceptance_length",
                        u->drafts > 0 ? json_real(1.0 + (double)u->accepted / (double)u->drafts) : json_null());
    int positions = 0;
    for (int k = 0; k < NX_MAX_DRAFT; k++)
        if (u->drafted_at[k] > 0) positions = k + 1;
    json_t *dat = json_array(), *aat = json_array();
    for (int k = 0; k < positions; k++) {
        json_array_append_new(dat, json_integer(u->drafted_at[k]));
        json_array_append_new(aat, json_integer(u->accepted_at[k]));
    }
    json_object_set_new(s, "drafted_at", dat);
    json_object_set_new(s, "accepted_at", aat);
    json_object_set_new(o, "speculative", s);
    return o;
}

/* llama.cpp's server's "timings", which its clients read: prefill and decode tokens, times and
 * speeds, and the drafts (decode excludes each choice's first token, which the prefill gives). */
static json_t *timings_json(const nx_oai_usage *u) {
    const double pms = u->t_prefill * 1e3, dms = u->t_decode * 1e3;
    return json_pack("{s:I, s:f, s:f, s:I, s:f, s:f, s:I, s:I}", "prompt_n", (json_int_t)u->prefilled, "prompt_ms",
                     pms, "prompt_per_second", pms > 0 ? (double)u->prefilled * 1e3 / pms : 0.0, "predicted_n",
                     (json_int_t)u->decoded, "predicted_ms", dms, "predicted_per_second",
                     dms > 0 ? (double)u->decoded * 1e3 / dms : 0.0, "draft_n", (json_int_t)u->drafted,
                     "draft_n_accepted", (json_int_t)u->accepted);
}

/* The choice's "nextn" member in a stream chunk: where each token since the last chunk came from. */
static json_t *token_sources_json(const nx_oai_choice *c) {
    json_t *d = json_array(), *k = json_array();
    for (size_t i = 0; i < c->n_tokens; i++) {
        json_array_append_new(d, json_boolean(c->drafted[i]));
        json_array_append_new(k, json_integer(c->draft_k[i]));
    }
    return json_pack("{s:o, s:o}", "drafted", d, "draft_k", k);
}

char *nx_oai_response_json(const nx_oai_meta *m, const nx_oai_choice *c, size_t n,
                           const nx_oai_usage *u) {
    json_t *o = envelope(m, false);
    if (!o) return NULL;
    json_t *choices = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *ch = json_object();
        json_object_set_new(ch, "index", json_integer(c[i].index));
        if (m->kind == NX_OAI_CHAT) {
            json_t *msg = json_object();
            const bool calls = c[i].tool_calls && json_array_size(c[i].tool_calls) > 0;
            json_object_set_new(msg, "role", json_string("assistant"));
            /* an answer that only calls tools has no content (null, as OpenAI sends it) */
            json_object_set_new(msg, "content",
                                calls && c[i].text_len == 0 ? json_null() : jstr(c[i].text, c[i].text_len));
            if (c[i].reasoning_len > 0)
                json_object_set_new(msg, "reasoning_content", jstr(c[i].reasoning, c[i].reasoning_len));
            if (calls) json_object_set_new(msg, "tool_calls", json_deep_copy(c[i].tool_calls));
            json_object_set_new(msg, "refusal", json_null());
            json_object_set_new(ch, "message", msg);
            json_object_set_new(ch, "logprobs", m->logprobs ? chat_logprobs(m, &c[i]) : json_null());
        } else {
            json_object_set_new(ch, "text", jstr(c[i].text, c[i].text_len));
            json_object_set_new(ch, "logprobs",
                                m->logprobs ? completion_logprobs(m, &c[i]) : json_null());
        }
        json_object_set_new(ch, "finish_reason", jstr_or_null(c[i].finish_reason));
        json_array_append_new(choices, ch);
    }
    json_object_set_new(o, "choices", choices);
    if (u) {
        json_object_set_new(o, "usage", usage_json(u));
        json_object_set_new(o, "timings", timings_json(u));
    }
    return dump(o);
}

/* Wraps a JSON document as one server-sent event. */
static char *sse(char *json) {
    if (!json) return NULL;
    size_t n = strlen(json);
    char *ev = malloc(n + 9);
    if (ev) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, json, n);
        memcpy(ev + 6 + n, "\n\n", 3);
    }
    free(json);
    return ev;
}

char *nx_oai_stream_chunk(const nx_oai_meta *m, const nx_oai_choice *c, bool role_chunk,
                          bool include_usage) {
    json_t *o = envelope(m, true);
    if (!o) return NULL;
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(c->index));
    if (m->kind == NX_OAI_CHAT) {
        json_t *delta = json_object();
        const bool calls = c->tool_calls && json_array_size(c->tool_calls) > 0;
        if (role_chunk) {
            json_object_set_new(delta, "role", json_string("assistant"));
            json_object_set_new(delta, "content", jstr(c->text, c->text_len));
        } else if (c->text_len > 0 || (!c->finish_reason && c->reasoning_len == 0 && !calls)) {
            json_object_set_new(delta, "content", jstr(c->text, c->text_len));
        }
        if (c->reasoning_len > 0)
            json_object_set_new(delta, "reasoning_content", jstr(c->reasoning, c->reasoning_len));
        if (calls) { /* OpenAI's delta form: each entry with its call's index (its place in the list
                      * unless it names one) */
            json_t *arr = json_array();
            size_t k;
            const json_t *tc;
            json_array_foreach(c->tool_calls, k, tc) {
                json_t *d = json_deep_copy(tc);
                if (!json_object_get(d, "index")) json_object_set_new(d, "index", json_integer((json_int_t)k));
                json_array_append_new(arr, d);
            }
            json_object_set_new(delta, "tool_calls", arr);
        }
        json_object_set_new(ch, "delta", delta);
        json_object_set_new(ch, "logprobs",
                            m->logprobs && c->n_lp ? chat_logprobs(m, c) : json_null());
    } else {
        json_object_set_new(ch, "text", jstr(c->text, c->text_len));
        json_object_set_new(ch, "logprobs",
                            m->logprobs && c->n_lp ? completion_logprobs(m, c) : json_null());
    }
    json_object_set_new(ch, "finish_reason", jstr_or_null(c->finish_reason));
    if (c->n_tokens > 0) json_object_set_new(ch, "nextn", token_sources_json(c));
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(o, "choices", choices);
    if (include_usage) json_object_set_new(o, "usage", json_null());
    return sse(dump(o));
}

char *nx_oai_stream_usage(const nx_oai_meta *m, const nx_oai_usage *u) {
    json_t *o = envelope(m, true);
    if (!o) return NULL;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_json(u));
    json_object_set_new(o, "timings", timings_json(u));
    return sse(dump(o));
}

char *nx_oai_stream_error(const nx_oai_error *e) { return sse(nx_oai_error_json(e)); }

char *nx_oai_models_json(const char *model_id, int64_t created, const char *owned_by) {
    json_t *m = json_object();
    json_object_set_new(m, "id", jstr(model_id, strlen(model_id)));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(created));
    json_object_set_new(m, "owned_by", json_string(owned_by ? owned_by : "nextn"));
    json_t *data = json_array();
    json_array_append_new(data, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    return dump(o);
}

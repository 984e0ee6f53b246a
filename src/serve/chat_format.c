/* Chat output formats and the streaming reasoning / content / tool-call split (chat_format.h). */
#include "serve/chat_format.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "serve/dsv31_output.h"
#include "serve/glm_output.h"
#include "serve/hy_output.h"
#include "serve/qwen_output.h"

/* ---------------------------------------------------------------- the formats */

static void copy(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src);
}

static void hy_spell(nx_chat_markers *m, const char *suffix) {
    nx_hy_markers hm;
    nx_hy_markers_init(&hm, suffix, NULL);
    copy(m->think_open, sizeof m->think_open, hm.text[NX_HY_THINK_OPEN]);
    copy(m->think_close, sizeof m->think_close, hm.text[NX_HY_THINK_CLOSE]);
    copy(m->tools_open, sizeof m->tools_open, hm.text[NX_HY_CALLS_OPEN]);
    m->tools_open_kept = false;
    copy(m->suffix, sizeof m->suffix, suffix && strlen(suffix) <= 40 ? suffix : "");
    static const int tm[NX_TM_N] = {
        [NX_TM_CALL_OPEN] = NX_HY_CALL_OPEN,   [NX_TM_CALL_CLOSE] = NX_HY_CALL_CLOSE,
        [NX_TM_CALLS_CLOSE] = NX_HY_CALLS_CLOSE, [NX_TM_SEP] = NX_HY_SEP,
        [NX_TM_KEY_OPEN] = NX_HY_KEY_OPEN,     [NX_TM_KEY_CLOSE] = NX_HY_KEY_CLOSE,
        [NX_TM_VALUE_OPEN] = NX_HY_VALUE_OPEN, [NX_TM_VALUE_CLOSE] = NX_HY_VALUE_CLOSE};
    for (int i = 0; i < NX_TM_N; i++) copy(m->tool[i], sizeof m->tool[i], hm.text[tm[i]]);
    m->newline_sep = m->open_end = m->string_exact = m->bare_name = m->json_args = false;
    copy(m->name_end, sizeof m->name_end, hm.text[NX_HY_SEP]);
    m->preamble[0] = '\0';
    m->preamble_after_open = m->think_prompt_only = false;
}

static json_t *hy_parse(const char *text, size_t len, const nx_chat_markers *m, const json_t *tools) {
    nx_hy_markers hm;
    nx_hy_markers_init(&hm, m->suffix, NULL);
    return nx_hy_parse_tool_calls(text, len, &hm, tools);
}

/* GLM's markers have one spelling: the suffix is ignored. */
static void glm_markers(nx_chat_markers *m, const char *suffix) {
    (void)suffix;
    copy(m->think_open, sizeof m->think_open, "<think>");
    copy(m->think_close, sizeof m->think_close, "</think>");
    copy(m->tools_open, sizeof m->tools_open, "<tool_call>");
    m->tools_open_kept = true;
    m->suffix[0] = '\0';
    static const char *const tm[NX_TM_N] = {
        [NX_TM_CALL_OPEN] = "<tool_call>", [NX_TM_CALL_CLOSE] = "</tool_call>", [NX_TM_CALLS_CLOSE] = "",
        [NX_TM_SEP] = "",                  [NX_TM_KEY_OPEN] = "<arg_key>",     [NX_TM_KEY_CLOSE] = "</arg_key>",
        [NX_TM_VALUE_OPEN] = "<arg_value>", [NX_TM_VALUE_CLOSE] = "</arg_value>"};
    for (int i = 0; i < NX_TM_N; i++) copy(m->tool[i], sizeof m->tool[i], tm[i]);
    m->open_end = m->string_exact = true;
    m->bare_name = m->json_args = m->preamble_after_open = m->think_prompt_only = false;
}

static void glm_spell(nx_chat_markers *m, const char *suffix) {
    glm_markers(m, suffix);
    /* GLM-4.5's calls: "<tool_call>NAME\n<arg_key>…", no wrapper, the end (<|observation|>, an
     * end id) after the last; its template writes an answer without reasoning after
     * "<|assistant|>" as "\n<think></think>" then "\n<tool_call>" */
    m->newline_sep = m->trim_lead = true;
    copy(m->name_end, sizeof m->name_end, "\n");
    copy(m->preamble, sizeof m->preamble, "\n<think></think>\n");
}

static void glm47_spell(nx_chat_markers *m, const char *suffix) {
    glm_markers(m, suffix);
    /* GLM-4.7's calls: "<tool_call>NAME<arg_key>…" (the name ends at the first marker); its
     * template ends the generation prompt in "<think>" (thinking) or "</think>" (not), and writes
     * an answer without reasoning as "</think>" then the calls */
    m->newline_sep = false;
    m->bare_name = m->trim_lead = true;
    m->name_end[0] = '\0';
    copy(m->preamble, sizeof m->preamble, "</think>");
}

/* DeepSeek-V3.1's markers are its tokenizer's special tokens, one spelling. */
static void dsv31_spell(nx_chat_markers *m, const char *suffix) {
    (void)suffix;
    memset(m, 0, sizeof *m);
    copy(m->think_open, sizeof m->think_open, "<think>");
    copy(m->think_close, sizeof m->think_close, "</think>");
    copy(m->tools_open, sizeof m->tools_open, NX_DSV31_CALLS_BEGIN);
    copy(m->tool[NX_TM_CALL_OPEN], sizeof m->tool[0], NX_DSV31_CALL_BEGIN);
    copy(m->tool[NX_TM_CALL_CLOSE], sizeof m->tool[0], NX_DSV31_CALL_END);
    copy(m->tool[NX_TM_CALLS_CLOSE], sizeof m->tool[0], NX_DSV31_CALLS_END);
    copy(m->tool[NX_TM_SEP], sizeof m->tool[0], NX_DSV31_SEP);
    /* "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}<｜tool▁call▁end｜>"; the template's
     * generation prompt ends in "<think>" (thinking) or "</think>" (not, the default) */
    m->json_args = m->think_prompt_only = true;
    copy(m->name_end, sizeof m->name_end, NX_DSV31_SEP);
    copy(m->preamble, sizeof m->preamble, "</think>");
    m->preamble_after_open = true;
}

static json_t *dsv31_parse(const char *text, size_t len, const nx_chat_markers *m, const json_t *tools) {
    (void)m;
    return nx_dsv31_parse_tool_calls(text, len, tools);
}

static json_t *glm_parse(const char *text, size_t len, const nx_chat_markers *m, const json_t *tools) {
    (void)m;
    return nx_glm_parse_tool_calls(text, len, tools);
}

/* Qwen's markers: <think>, </think>, <tool_call> and </tool_call> are tokens with one spelling
 * (the suffix is ignored); the call between the last two is text. The templates end the
 * generation prompt in "<think>\n" when thinking (the reasoning is opened by the prompt, the
 * split looks past the newline) and in "<think>\n\n</think>\n\n" or "assistant\n" when not. */
static void qwen_spell(nx_chat_markers *m, const char *suffix) {
    (void)suffix;
    memset(m, 0, sizeof *m);
    copy(m->think_open, sizeof m->think_open, "<think>");
    copy(m->think_close, sizeof m->think_close, "</think>");
    copy(m->tools_open, sizeof m->tools_open, "<tool_call>");
    copy(m->tool[NX_TM_CALL_OPEN], sizeof m->tool[0], "<tool_call>");
    copy(m->tool[NX_TM_CALL_CLOSE], sizeof m->tool[0], "</tool_call>");
    m->tools_open_kept = m->text_calls = true;
}

static json_t *qwen_xml_parse(const char *text, size_t len, const nx_chat_markers *m, const json_t *tools) {
    (void)m;
    return nx_qwen_xml_parse_tool_calls(text, len, tools);
}

static json_t *qwen_json_parse(const char *text, size_t len, const nx_chat_markers *m, const json_t *tools) {
    (void)m;
    return nx_qwen_json_parse_tool_calls(text, len, tools);
}

static const nx_chat_format formats[] = {
    {"hy3", "hy_v3", hy_spell, hy_parse},
    {"glm45", "glm4_moe", glm_spell, glm_parse},
    {"glm47", "glm4_moe_lite", glm47_spell, glm_parse},
    {"deepseek_v31", "deepseek_v3", dsv31_spell, dsv31_parse},
    {"qwen35", "qwen3_5_moe", qwen_spell, qwen_xml_parse},
    {"qwen3_next", "qwen3_next", qwen_spell, qwen_json_parse},
};

const nx_chat_format *nx_chat_format_by_name(const char *name) {
    for (size_t i = 0; name && i < sizeof formats / sizeof formats[0]; i++)
        if (strcmp(formats[i].name, name) == 0) return &formats[i];
    return NULL;
}

const nx_chat_format *nx_chat_format_for_family(const char *model_type) {
    for (size_t i = 0; model_type && i < sizeof formats / sizeof formats[0]; i++)
        if (strcmp(formats[i].family, model_type) == 0) return &formats[i];
    return NULL;
}

/* ---------------------------------------------------------------- the split */

void nx_chat_stream_init(nx_chat_stream *s, const nx_chat_format *f, const char *suffix, bool tools, bool reasoning,
                         bool in_reasoning) {
    memset(s, 0, sizeof *s);
    s->f = f;
    f->spell(&s->m, suffix);
    s->tools = tools && s->m.tools_open[0];
    s->reasoning = reasoning && s->m.think_open[0] && s->m.think_close[0] && (in_reasoning || !s->m.think_prompt_only);
    s->part = s->reasoning && in_reasoning ? NX_CHAT_REASONING : NX_CHAT_CONTENT;
    s->lead = s->m.trim_lead && s->reasoning && s->part == NX_CHAT_CONTENT;
}

/* The leading whitespace of t[0..n) while nothing else has come (see trim_lead). */
static size_t lead_ws(bool *lead, const char *t, size_t n) {
    size_t k = 0;
    while (*lead && k < n && isspace((unsigned char)t[k])) k++;
    if (k < n) *lead = false;
    return k;
}

/* The markers that act in the current part (NULL-terminated, at most 2). */
static void acting(const nx_chat_stream *s, const char *out[3]) {
    int n = 0;
    if (s->part == NX_CHAT_CONTENT) {
        if (s->reasoning) out[n++] = s->m.think_open;
        if (s->tools) out[n++] = s->m.tools_open;
    } else if (s->part == NX_CHAT_REASONING) {
        out[n++] = s->m.think_close;
    }
    out[n] = NULL;
}

/* The earliest whole marker of mk in t[0..n): its index in mk and position, or -1. */
static int earliest(const char *t, size_t n, const char *const *mk, size_t *at) {
    int best = -1;
    for (int i = 0; mk[i]; i++) {
        const size_t k = strlen(mk[i]);
        for (size_t p = 0; p + k <= n && (best < 0 || p < *at); p++)
            if (memcmp(t + p, mk[i], k) == 0) {
                best = i, *at = p;
                break;
            }
    }
    return best;
}

/* The length of the longest tail of t[0..n) that is a proper prefix of a marker of mk. */
static size_t partial_tail(const char *t, size_t n, const char *const *mk) {
    size_t best = 0;
    for (int i = 0; mk[i]; i++) {
        const size_t k = strlen(mk[i]);
        for (size_t l = k - 1 < n ? k - 1 : n; l > best; l--)
            if (memcmp(t + n - l, mk[i], l) == 0) {
                best = l;
                break;
            }
    }
    return best;
}

/* Appends t[0..n) to the current part's buffer. */
static nx_status emit(nx_chat_stream *s, const char *t, size_t n, nx_strbuf *content, nx_strbuf *reasoning) {
    const size_t k = s->part == NX_CHAT_CONTENT && n ? lead_ws(&s->lead, t, n) : 0;
    if (k) t += k, n -= k;
    nx_strbuf *to = s->part == NX_CHAT_TOOLS ? &s->tool_text : s->part == NX_CHAT_REASONING ? reasoning : content;
    return to && n ? nx_strbuf_append(to, t, n) : NX_OK;
}

/* Moves what the held bytes decide out of them: text before each whole marker, the part
 * switches, and all but a possible marker start. */
static nx_status drain(nx_chat_stream *s, nx_strbuf *content, nx_strbuf *reasoning) {
    for (;;) {
        const char *mk[3];
        acting(s, mk);
        const char *t = s->held.data;
        const size_t n = s->held.len;
        size_t at = 0;
        const int w = earliest(t, n, mk, &at);
        if (w < 0) {
            const size_t keep = partial_tail(t, n, mk);
            nx_status st = emit(s, t, n - keep, content, reasoning);
            if (st == NX_OK) nx_strbuf_consume(&s->held, n - keep);
            return st;
        }
        nx_status st = emit(s, t, at, content, reasoning);
        if (st != NX_OK) return st;
        const char *m = mk[w];
        const size_t k = strlen(m);
        s->lead = false;
        if (m == s->m.tools_open) {
            s->part = NX_CHAT_TOOLS;
            if (s->m.tools_open_kept && (st = nx_strbuf_append(&s->tool_text, m, k)) != NX_OK) return st;
        } else {
            s->part = m == s->m.think_open ? NX_CHAT_REASONING : NX_CHAT_CONTENT;
        }
        nx_strbuf_consume(&s->held, at + k);
    }
}

nx_status nx_chat_stream_feed(nx_chat_stream *s, const char *text, size_t n, nx_strbuf *content, nx_strbuf *reasoning) {
    if (!n) return NX_OK;
    if (s->part == NX_CHAT_TOOLS) return nx_strbuf_append(&s->tool_text, text, n);
    nx_status st = nx_strbuf_append(&s->held, text, n);
    return st == NX_OK ? drain(s, content, reasoning) : st;
}

nx_status nx_chat_stream_finish(nx_chat_stream *s, nx_strbuf *content, nx_strbuf *reasoning) {
    nx_status st = emit(s, s->held.data, s->held.len, content, reasoning);
    if (st == NX_OK) nx_strbuf_consume(&s->held, s->held.len);
    return st;
}

json_t *nx_chat_stream_tool_calls(const nx_chat_stream *s, const json_t *tools) {
    return s->f->parse_tool_calls(s->tool_text.data ? s->tool_text.data : "", s->tool_text.len, &s->m, tools);
}

void nx_chat_stream_free(nx_chat_stream *s) {
    nx_strbuf_free(&s->held);
    nx_strbuf_free(&s->tool_text);
}

/* ---------------------------------------------------------------- token by token */

static int32_t id_of(const nx_tokenizer *tok, const char *text) {
    return tok && text[0] ? nx_tokenizer_token_id(tok, text) : -1;
}

void nx_chat_tokens_init(nx_chat_tokens *t, const nx_chat_format *f, const char *suffix, const nx_tokenizer *tok) {
    memset(t, 0, sizeof *t);
    t->f = f;
    f->spell(&t->m, suffix);
    t->think_open = id_of(tok, t->m.think_open);
    t->think_close = id_of(tok, t->m.think_close);
    t->tools_open = id_of(tok, t->m.tools_open);
    for (int i = 0; i < NX_TM_N; i++) t->tool[i] = id_of(tok, t->m.tool[i]);
}

bool nx_chat_tokens_tools(const nx_chat_tokens *t) {
    if (t->tools_open < 0) return false;
    if (t->m.text_calls) return t->tool[NX_TM_CALL_OPEN] >= 0 && t->tool[NX_TM_CALL_CLOSE] >= 0;
    nx_tool_markers mk;
    nx_chat_tokens_grammar(t, &mk);
    for (int i = 0; i < NX_TM_N; i++)
        if (t->tool[i] < 0 && nx_tool_marker_used(&mk, i)) return false;
    return true;
}

bool nx_chat_tokens_forced(const nx_chat_tokens *t) { return !t->m.text_calls && nx_chat_tokens_tools(t); }

bool nx_chat_tokens_reasoning(const nx_chat_tokens *t) { return t->think_open >= 0 && t->think_close >= 0; }

void nx_chat_tokens_grammar(const nx_chat_tokens *t, nx_tool_markers *mk) {
    memset(mk, 0, sizeof *mk);
    for (int i = 0; i < NX_TM_N; i++) mk->id[i] = t->tool[i];
    mk->newline_sep = t->m.newline_sep;
    mk->open_end = t->m.open_end;
    mk->string_exact = t->m.string_exact;
    mk->bare_name = t->m.bare_name;
    mk->json_args = t->m.json_args;
}

void nx_chat_split_init(nx_chat_split *s, const nx_chat_tokens *t, bool tools, bool reasoning, int32_t prompt_last) {
    s->t = t;
    s->tools = tools && nx_chat_tokens_tools(t);
    const bool opened = prompt_last >= 0 && prompt_last == t->think_open;
    s->reasoning = reasoning && nx_chat_tokens_reasoning(t) && (opened || !t->m.think_prompt_only);
    s->part = s->reasoning && opened ? NX_CHAT_REASONING : NX_CHAT_CONTENT;
    s->lead = t->m.trim_lead && s->reasoning && s->part == NX_CHAT_CONTENT;
}

size_t nx_chat_split_lead(nx_chat_split *s, const char *text, size_t n) { return lead_ws(&s->lead, text, n); }

/* The text of marker id, or NULL when id is none of t's markers. */
static const char *marker_text(const nx_chat_tokens *t, int32_t id) {
    if (id == t->think_open) return t->m.think_open;
    if (id == t->think_close) return t->m.think_close;
    if (id == t->tools_open) return t->m.tools_open;
    for (int i = 0; i < NX_TM_N; i++)
        if (id == t->tool[i]) return t->m.tool[i];
    return NULL;
}

int nx_chat_split_token(nx_chat_split *s, int32_t id, const char **marker) {
    const nx_chat_tokens *t = s->t;
    *marker = NULL;
    if (id < 0) return (int)s->part;
    if (s->part == NX_CHAT_TOOLS) {
        *marker = marker_text(t, id);
        return NX_CHAT_TOOLS;
    }
    if (s->tools && id == t->tools_open) {
        s->part = NX_CHAT_TOOLS;
        s->lead = false;
        if (!t->m.tools_open_kept) return -1;
        *marker = t->m.tools_open;
        return NX_CHAT_TOOLS;
    }
    if (s->reasoning && (id == t->think_open || id == t->think_close)) {
        s->part = id == t->think_open ? NX_CHAT_REASONING : NX_CHAT_CONTENT;
        s->lead = false;
        return -1;
    }
    return (int)s->part;
}

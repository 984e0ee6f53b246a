/* Unit tests of the OpenAI wire format (request validation, JSON/SSE builders), stop-string
 * matching across token boundaries, and the Prometheus metrics text. No model needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/stop.h"

static const nx_oai_limits LIM = {.model_id = "tiny", .vocab_size = 1000};

static nx_status parse(nx_oai_kind kind, const char *body, nx_oai_request *r, nx_oai_error *e) {
    memset(e, 0, sizeof *e);
    return nx_oai_request_parse(kind, body, strlen(body), &LIM, r, e);
}

/* Expects a 400 naming `param` (NULL: no param) with a message containing `needle`. */
static void expect_400(nx_oai_kind kind, const char *body, const char *param, const char *needle) {
    nx_oai_request r;
    nx_oai_error e;
    nx_status st = parse(kind, body, &r, &e);
    if (st == NX_OK) fprintf(stderr, "accepted: %s\n", body);
    assert_int_equal(st, NX_E_ARG);
    assert_int_equal(e.http_status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    if (param) assert_string_equal(e.param, param);
    else assert_string_equal(e.param, "");
    if (needle && !strstr(e.message, needle)) {
        fprintf(stderr, "message for %s: %s\n", body, e.message);
        fail();
    }
    nx_oai_request_free(&r);
}

/* ---------------------------------------------------------------- requests */

static void test_chat_minimal_defaults(void **state) {
    (void)state;
    nx_oai_request r;
    nx_oai_error e;
    assert_int_equal(parse(NX_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                           &r, &e),
                     NX_OK);
    assert_int_equal(r.kind, NX_OAI_CHAT);
    assert_null(r.model);
    assert_int_equal(json_array_size(r.messages), 1);
    assert_float_equal(r.sampling.temperature, 1.0, 0);
    assert_float_equal(r.sampling.top_p, 1.0, 0);
    assert_float_equal(r.sampling.repetition_penalty, 1.0, 0);
    assert_int_equal(r.max_tokens, 0);
    assert_int_equal(r.n, 1);
    assert_false(r.stream);
    assert_false(r.logprobs);
    assert_int_equal(r.draft, NX_DRAFT_AUTO);
    assert_false(r.has_draft);
    assert_int_equal(r.verify, NX_VERIFY_RESIDUAL);
    assert_true(r.add_generation_prompt);
    assert_null(r.tools);
    assert_int_equal(r.n_stop, 0);
    nx_oai_request_free(&r);
    nx_oai_request_free(&r); /* freeing twice is harmless: free resets the struct */
    assert_int_equal(parse(NX_OAI_COMPLETION, "{\"prompt\":\"x\",\"n\":16}", &r, &e), NX_OK);
    assert_int_equal(r.n, 16);
    nx_oai_request_free(&r);
}

/* A past call's arguments reach the template as an object (decoded from OpenAI's string), or,
 * for a template that writes them as text (args_as_text: DeepSeek-V3.1's), as a string (an object
 * sent serialized). */
static void test_chat_tool_call_arguments(void **state) {
    (void)state;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                       "\"content\":null,\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":"
                       "{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}},{\"id\":\"b\",\"type\":\"function\","
                       "\"function\":{\"name\":\"g\",\"arguments\":{\"y\":[true]}}}]}]}";
    for (int as_text = 0; as_text < 2; as_text++) {
        const nx_oai_limits lim = {.args_as_text = as_text};
        nx_oai_request r;
        nx_oai_error e;
        assert_int_equal(nx_oai_request_parse(NX_OAI_CHAT, body, strlen(body), &lim, &r, &e), NX_OK);
        const json_t *calls = json_object_get(json_array_get(r.messages, 1), "tool_calls");
        const json_t *a = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
        const json_t *b = json_object_get(json_object_get(json_array_get(calls, 1), "function"), "arguments");
        if (as_text) {
            assert_string_equal(json_string_value(a), "{\"x\": 1}"); /* as sent */
            assert_string_equal(json_string_value(b), "{\"y\":[true]}");
        } else {
            assert_true(json_is_object(a) && json_integer_value(json_object_get(a, "x")) == 1);
            assert_true(json_is_object(b));
        }
        nx_oai_request_free(&r);
    }
}

static void test_chat_all_fields(void **state) {
    (void)state;
    const char *body =
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
        "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
        "\"max_tokens\":7,\"max_completion_tokens\":9,\"temperature\":0.5,\"top_p\":0.9,"
        "\"top_k\":40,\"min_p\":0.05,\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
        "\"repetition_penalty\":1.1,\"seed\":-3,\"stop\":[\"x\",\"yz\"],\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":3,"
        "\"n\":1,\"speculative\":{\"draft\":2,\"verify\":\"match\"},\"user\":\"ignored\","
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
        "\"chat_template_kwargs\":{\"enable_thinking\":false},\"ignore_eos\":true,"
        "\"logit_bias\":{\"5\":-100,\"999\":2.5,\"0\":100}}";
    nx_oai_request r;
    nx_oai_error e;
    nx_status st = parse(NX_OAI_CHAT, body, &r, &e);
    if (st != NX_OK) fprintf(stderr, "%s\n", e.message);
    assert_int_equal(st, NX_OK);
    assert_string_equal(r.model, "tiny");
    assert_int_equal(json_array_size(r.messages), 4);
    /* content parts are flattened to one string */
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.messages, 1), "content")),
                        "a\nb");
    assert_int_equal(r.max_tokens, 9);
    assert_float_equal(r.sampling.temperature, 0.5, 1e-6);
    assert_float_equal(r.sampling.top_p, 0.9, 1e-6);
    assert_int_equal(r.sampling.top_k, 40);
    assert_float_equal(r.sampling.min_p, 0.05, 1e-6);
    assert_float_equal(r.sampling.presence_penalty, 0.5, 1e-6);
    assert_float_equal(r.sampling.frequency_penalty, -0.5, 1e-6);
    assert_float_equal(r.sampling.repetition_penalty, 1.1, 1e-6);
    assert_true(r.has_seed);
    assert_true(r.sampling.seed == (uint64_t)(int64_t)-3);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "yz");
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_true(r.has_draft);
    assert_int_equal(r.draft, 2);
    assert_true(r.has_verify);
    assert_int_equal(r.verify, NX_VERIFY_MATCH);
    assert_non_null(r.tools);
    assert_non_null(r.template_kwargs);
    assert_true(r.ignore_eos);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.sampling.n_logit_bias, 3);
    assert_true(r.sampling.logit_bias == r.logit_bias);
    assert_int_equal(r.logit_bias[0].id, 5);
    assert_float_equal(r.logit_bias[0].bias, -100.0, 0);
    assert_int_equal(r.logit_bias[1].id, 999);
    assert_float_equal(r.logit_bias[1].bias, 2.5, 0);
    assert_int_equal(r.logit_bias[2].id, 0);
    assert_float_equal(r.logit_bias[2].bias, 100.0, 0);
    nx_oai_request_free(&r);
}

static void test_chat_speculative_auto_and_nulls(void **state) {
    (void)state;
    nx_oai_request r;
    nx_oai_error e;
    assert_int_equal(parse(NX_OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"\"}],"
                           "\"speculative\":{\"draft\":\"auto\"},\"temperature\":null,"
                           "\"stop\":null,\"max_tokens\":5.0,\"top_p\":0,\"tool_choice\":\"none\","
                           "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
                           &r, &e),
                     NX_OK);
    assert_true(r.has_draft);
    assert_int_equal(r.draft, NX_DRAFT_AUTO);
    assert_float_equal(r.sampling.temperature, 0.0, 0); /* top_p 0 = greedy */
    assert_int_equal(r.max_tokens, 5);                  /* integral decimal accepted */
    assert_null(r.tools);                               /* tool_choice none drops the tools */
    assert_false(r.tool_required);
    nx_oai_request_free(&r);
    /* "required", and a named function: the request keeps its tools and says what to force */
    assert_int_equal(parse(NX_OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\","
                           "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
                           &r, &e),
                     NX_OK);
    assert_true(r.tool_required);
    assert_null(r.tool_name);
    assert_non_null(r.tools);
    nx_oai_request_free(&r);
    assert_int_equal(parse(NX_OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}},"
                           "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                           "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]}",
                           &r, &e),
                     NX_OK);
    assert_true(r.tool_required);
    assert_string_equal(r.tool_name, "g");
    nx_oai_request_free(&r);
    /* response_format: json_object asks for JSON mode, text for nothing */
    assert_int_equal(parse(NX_OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"response_format\":{\"type\":\"json_object\"}}",
                           &r, &e),
                     NX_OK);
    assert_true(r.json_object);
    assert_null(r.json_schema);
    nx_oai_request_free(&r);
    assert_int_equal(parse(NX_OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
                           "\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"object\"}}}}",
                           &r, &e),
                     NX_OK);
    assert_true(r.json_object);
    assert_non_null(r.json_schema);
    nx_oai_request_free(&r);
    assert_int_equal(parse(NX_OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"response_format\":{\"type\":\"text\"}}",
                           &r, &e),
                     NX_OK);
    assert_false(r.json_object);
    nx_oai_request_free(&r);
}

static void test_request_error_matrix(void **state) {
    (void)state;
    const nx_oai_kind C = NX_OAI_CHAT;
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
    expect_400(C, "", NULL, "could not parse");
    expect_400(C, "{", NULL, "could not parse");
    expect_400(C, "{\"messages\": [}", NULL, "could not parse");
    expect_400(C, "[1,2]", NULL, "JSON object");
    expect_400(C, "\"str\"", NULL, "could not parse");
    expect_400(C, "{\"a\":1,\"a\":2," MSGS "}", NULL, "duplicate");
    expect_400(C, "{}", "messages", "Missing required parameter");
    expect_400(C, "{\"messages\":{}}", "messages", "expected an array");
    expect_400(C, "{\"messages\":[]}", "messages", "empty array");
    expect_400(C, "{\"messages\":[1]}", "messages[0]", "expected an object");
    expect_400(C, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role", "Missing");
    expect_400(C, "{\"messages\":[{\"role\":7,\"content\":\"x\"}]}", "messages[0].role",
               "expected a string");
    expect_400(C, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role",
               "unknown role");
    expect_400(C, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "Missing");
    expect_400(C, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content",
               "expected a string");
    expect_400(C,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
               "\"image_url\":{\"url\":\"x\"}}]}]}",
               "messages[0].content[0].type", "not supported");
    expect_400(C, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":{}}]}",
               "messages[0].tool_calls", "expected an array");
    expect_400(C, "{\"model\":\"gpt-4\"," MSGS "}", "model", "does not exist");
    expect_400(C, "{\"model\":3," MSGS "}", "model", "expected a string");
    expect_400(C, "{\"temperature\":\"hot\"," MSGS "}", "temperature", "expected a decimal");
    expect_400(C, "{\"temperature\":2.5," MSGS "}", "temperature", "<= 2");
    expect_400(C, "{\"temperature\":-1," MSGS "}", "temperature", ">= 0");
    expect_400(C, "{\"top_p\":1.5," MSGS "}", "top_p", "<= 1");
    expect_400(C, "{\"top_k\":\"5\"," MSGS "}", "top_k", "expected an integer");
    expect_400(C, "{\"top_k\":-2," MSGS "}", "top_k", ">= -1");
    expect_400(C, "{\"min_p\":2," MSGS "}", "min_p", "<= 1");
    expect_400(C, "{\"presence_penalty\":-2.5," MSGS "}", "presence_penalty", ">= -2");
    expect_400(C, "{\"frequency_penalty\":3," MSGS "}", "frequency_penalty", "<= 2");
    expect_400(C, "{\"repetition_penalty\":0," MSGS "}", "repetition_penalty", "> 0");
    expect_400(C, "{\"max_tokens\":0," MSGS "}", "max_tokens", ">= 1");
    expect_400(C, "{\"max_tokens\":1.5," MSGS "}", "max_tokens", "expected an integer");
    expect_400(C, "{\"max_tokens\":\"10\"," MSGS "}", "max_tokens", "expected an integer");
    expect_400(C, "{\"max_completion_tokens\":-4," MSGS "}", "max_completion_tokens", ">= 1");
    expect_400(C, "{\"seed\":\"1\"," MSGS "}", "seed", "expected an integer");
    expect_400(C, "{\"n\":17," MSGS "}", "n", "<= 16");
    expect_400(C, "{\"n\":0," MSGS "}", "n", ">= 1");
    expect_400(C, "{\"n\":1.5," MSGS "}", "n", "expected an integer");
    expect_400(C, "{\"stream\":\"yes\"," MSGS "}", "stream", "expected a boolean");
    expect_400(C, "{\"stream_options\":{\"include_usage\":true}," MSGS "}", "stream_options",
               "only allowed");
    expect_400(C, "{\"stream\":true,\"stream_options\":{\"include_usage\":1}," MSGS "}",
               "stream_options.include_usage", "expected a boolean");
    expect_400(C, "{\"stop\":5," MSGS "}", "stop", "expected a string or an array");
    expect_400(C, "{\"stop\":[\"a\",3]," MSGS "}", "stop[1]", "expected a string");
    expect_400(C, "{\"stop\":\"\"," MSGS "}", "stop", "empty string");
    expect_400(C,
               "{\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
               "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]," MSGS "}",
               "stop", "maximum length");
    expect_400(C, "{\"logprobs\":1," MSGS "}", "logprobs", "expected a boolean");
    expect_400(C, "{\"logprobs\":true,\"top_logprobs\":21," MSGS "}", "top_logprobs", "<= 20");
    expect_400(C, "{\"top_logprobs\":2," MSGS "}", "top_logprobs", "'logprobs' must be");
    expect_400(C, "{\"logit_bias\":[5]," MSGS "}", "logit_bias", "expected an object");
    expect_400(C, "{\"logit_bias\":{\"1000\":1}," MSGS "}", "logit_bias", "token ids in [0, 1000)");
    expect_400(C, "{\"logit_bias\":{\"-1\":1}," MSGS "}", "logit_bias", "token ids");
    expect_400(C, "{\"logit_bias\":{\"a5\":1}," MSGS "}", "logit_bias", "'a5'");
    expect_400(C, "{\"logit_bias\":{\"5x\":1}," MSGS "}", "logit_bias", "'5x'");
    expect_400(C, "{\"logit_bias\":{\"99999999999999999999\":1}," MSGS "}", "logit_bias", "token ids");
    expect_400(C, "{\"logit_bias\":{\"5\":100.5}," MSGS "}", "logit_bias", "[-100, 100]");
    expect_400(C, "{\"logit_bias\":{\"5\":\"1\"}," MSGS "}", "logit_bias", "a string");
    expect_400(C, "{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}," MSGS "}", "response_format",
               "needs {\"json_schema\"");
    expect_400(C,
               "{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\","
               "\"properties\":{\"a\":{\"format\":\"uri\"}}}}}," MSGS "}",
               "response_format", "#/properties/a: format 'uri' is not supported");
    expect_400(C, "{\"response_format\":{\"type\":\"yaml\"}," MSGS "}", "response_format", "\"json_object\"");
    expect_400(C, "{\"response_format\":{\"type\":7}," MSGS "}", "response_format", "a string");
    expect_400(C, "{\"response_format\":\"json\"," MSGS "}", "response_format", "an object");
    expect_400(C, "{\"speculative\":3," MSGS "}", "speculative", "expected an object");
    expect_400(C, "{\"speculative\":{\"draft\":9}," MSGS "}", "speculative.draft", "<= 8");
    expect_400(C, "{\"speculative\":{\"draft\":-2}," MSGS "}", "speculative.draft", ">= 0");
    expect_400(C, "{\"speculative\":{\"draft\":\"lots\"}," MSGS "}", "speculative.draft", "auto");
    expect_400(C, "{\"speculative\":{\"verify\":\"maybe\"}," MSGS "}", "speculative.verify",
               "residual");
    expect_400(C, "{\"speculative\":{\"verify\":1}," MSGS "}", "speculative.verify",
               "expected a string");
    expect_400(C, "{\"speculative\":{\"drafts\":1}," MSGS "}", "speculative.drafts",
               "Unrecognized");
    expect_400(C, "{\"tools\":{}," MSGS "}", "tools", "expected an array");
    expect_400(C, "{\"tools\":[{\"type\":\"function\"}]," MSGS "}", "tools[0].function",
               "expected an object");
#define TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
    expect_400(C, "{\"tool_choice\":\"required\"," MSGS "}", "tool_choice", "no tools are given");
    expect_400(C, "{\"tool_choice\":\"maybe\"," TOOLS MSGS "}", "tool_choice", "'maybe' is not a tool choice");
    expect_400(C, "{\"tool_choice\":7," TOOLS MSGS "}", "tool_choice", "a string or an object");
    expect_400(C, "{\"tool_choice\":{\"type\":\"function\"}," TOOLS MSGS "}", "tool_choice.function.name",
               "expected a string");
    expect_400(C, "{\"tool_choice\":{\"type\":\"tool\",\"function\":{\"name\":\"f\"}}," TOOLS MSGS "}",
               "tool_choice.type", "must be");
    expect_400(C, "{\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}," TOOLS MSGS "}",
               "tool_choice.function.name", "'g', which is not among the tools");
    expect_400(C, "{\"chat_template_kwargs\":[]," MSGS "}", "chat_template_kwargs",
               "expected an object");
    expect_400(C, "{\"ignore_eos\":1," MSGS "}", "ignore_eos", "expected a boolean");
#undef MSGS
}

static void test_completion_prompts(void **state) {
    (void)state;
    nx_oai_request r;
    nx_oai_error e;
    assert_int_equal(parse(NX_OAI_COMPLETION, "{\"prompt\":\"Once\",\"logprobs\":2}", &r, &e),
                     NX_OK);
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "Once");
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 2);
    nx_oai_request_free(&r);

    assert_int_equal(parse(NX_OAI_COMPLETION, "{\"prompt\":[\"a\",\"bc\"]}", &r, &e), NX_OK);
    assert_int_equal(r.n_prompts, 2);
    assert_string_equal(r.prompts[1].text, "bc");
    assert_false(r.logprobs);
    nx_oai_request_free(&r);

    assert_int_equal(parse(NX_OAI_COMPLETION, "{\"prompt\":[1,2,999]}", &r, &e), NX_OK);
    assert_int_equal(r.n_prompts, 1);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 999);
    nx_oai_request_free(&r);

    assert_int_equal(parse(NX_OAI_COMPLETION, "{\"prompt\":[[1],[2,3]],\"logprobs\":0}", &r, &e),
                     NX_OK);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[1].n_ids, 2);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    nx_oai_request_free(&r);

    const nx_oai_kind P = NX_OAI_COMPLETION;
    expect_400(P, "{}", "prompt", "Missing");
    expect_400(P, "{\"prompt\":5}", "prompt", "expected a string");
    expect_400(P, "{\"prompt\":[]}", "prompt", "empty array");
    expect_400(P, "{\"prompt\":[1,1000]}", "prompt", "outside the vocabulary");
    expect_400(P, "{\"prompt\":[1,-1]}", "prompt", "outside the vocabulary");
    expect_400(P, "{\"prompt\":[1,\"a\"]}", "prompt", "token ids");
    expect_400(P, "{\"prompt\":[\"a\",[1]]}", "prompt[1]", "expected a string");
    expect_400(P, "{\"prompt\":[[1],\"a\"]}", "prompt[1]", "token ids");
    expect_400(P, "{\"prompt\":[{}]}", "prompt[0]", NULL);
    expect_400(P, "{\"prompt\":\"a\",\"logprobs\":6}", "logprobs", "<= 5");
    expect_400(P, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs", "expected an integer");
    expect_400(P, "{\"prompt\":\"a\",\"echo\":\"yes\"}", "echo", "a boolean");
    expect_400(P, "{\"prompt\":\"a\",\"best_of\":3}", "best_of", "best_of=1");
    expect_400(P, "{\"prompt\":\"a\",\"suffix\":\"z\"}", "suffix", "not supported");
    expect_400(P, "{\"prompt\":\"a\",\"model\":\"other\"}", "model", "does not exist");
}

static void test_error_json_shape(void **state) {
    (void)state;
    nx_oai_error e;
    nx_oai_error_set(&e, 401, "authentication_error", NULL, "invalid_api_key", "bad key %d", 7);
    char *s = nx_oai_error_json(&e);
    assert_non_null(s);
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    json_t *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "bad key 7");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "authentication_error");
    assert_true(json_is_null(json_object_get(err, "param")));
    assert_string_equal(json_string_value(json_object_get(err, "code")), "invalid_api_key");
    json_decref(j);
    free(s);
    char *ev = nx_oai_stream_error(&e);
    assert_true(strncmp(ev, "data: {\"error\":", 15) == 0);
    assert_true(strcmp(ev + strlen(ev) - 2, "\n\n") == 0);
    free(ev);
}

/* ---------------------------------------------------------------- responses */

/* Token i's text is "t<i>"; token 99 is a lone UTF-8 lead byte (a partial character). */
static size_t fake_token_text(void *user, int32_t id, char *buf, size_t cap) {
    (void)user;
    char tmp[32];
    int n = id == 99 ? snprintf(tmp, sizeof tmp, "\xE2") : snprintf(tmp, sizeof tmp, "t%d", id);
    if ((size_t)n <= cap) memcpy(buf, tmp, (size_t)n);
    return (size_t)n;
}

static json_t *parse_sse(const char *ev) {
    assert_true(strncmp(ev, "data: ", 6) == 0);
    size_t n = strlen(ev);
    assert_true(n > 8 && ev[n - 1] == '\n' && ev[n - 2] == '\n');
    json_error_t je;
    json_t *j = json_loadb(ev + 6, n - 8, 0, &je);
    assert_non_null(j);
    return j;
}

static void test_chat_response_json(void **state) {
    (void)state;
    nx_oai_logprob lp[2] = {{.id = 5, .logprob = -0.25f, .n_top = 2, .top_id = {5, 6},
                             .top_logprob = {-0.25f, -1.5f}},
                            {.id = 99, .logprob = -INFINITY, .n_top = 0}};
    nx_oai_meta m = {.kind = NX_OAI_CHAT, .id = "chatcmpl-x", .created = 123, .model = "tiny",
                     .logprobs = true, .token_text = fake_token_text};
    nx_oai_choice c = {.index = 0, .text = "hi \xff there", .text_len = 10,
                       .finish_reason = "stop", .lp = lp, .n_lp = 2};
    nx_oai_usage u = {.prompt_tokens = 4, .cached_tokens = 3, .completion_tokens = 2, .drafts = 1, .drafted = 2,
                      .accepted = 1, .draft = 2, .verify = "residual"};
    char *s = nx_oai_response_json(&m, &c, 1, &u);
    assert_non_null(s);
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    assert_string_equal(json_string_value(json_object_get(j, "id")), "chatcmpl-x");
    assert_int_equal(json_integer_value(json_object_get(j, "created")), 123);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    /* the invalid byte became U+FFFD */
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "hi \xEF\xBF\xBD there");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_t *content = json_object_get(json_object_get(ch, "logprobs"), "content");
    assert_int_equal(json_array_size(content), 2);
    json_t *t0 = json_array_get(content, 0);
    assert_string_equal(json_string_value(json_object_get(t0, "token")), "t5");
    assert_float_equal(json_number_value(json_object_get(t0, "logprob")), -0.25, 1e-6);
    assert_int_equal(json_array_size(json_object_get(t0, "bytes")), 2);
    json_t *tops = json_object_get(t0, "top_logprobs");
    assert_int_equal(json_array_size(tops), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(tops, 1), "token")), "t6");
    json_t *t1 = json_array_get(content, 1);
    assert_float_equal(json_number_value(json_object_get(t1, "logprob")), -9999.0, 0);
    /* a partial character keeps its raw byte in "bytes" */
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t1, "bytes"), 0)), 0xE2);
    json_t *usage = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 6);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens")),
                     3);
    json_t *spec = json_object_get(usage, "speculative");
    assert_int_equal(json_integer_value(json_object_get(spec, "drafted")), 2);
    assert_int_equal(json_integer_value(json_object_get(spec, "accepted")), 1);
    assert_float_equal(json_number_value(json_object_get(spec, "acceptance_rate")), 0.5, 1e-9);
    json_decref(j);
    free(s);

    u.drafted = 0;
    m.logprobs = false;
    s = nx_oai_response_json(&m, &c, 1, &u);
    j = json_loads(s, 0, NULL);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_true(json_is_null(json_object_get(ch, "logprobs")));
    spec = json_object_get(json_object_get(j, "usage"), "speculative");
    assert_true(json_is_null(json_object_get(spec, "acceptance_rate")));
    json_decref(j);
    free(s);
}

static void test_chat_stream_chunks(void **state) {
    (void)state;
    nx_oai_meta m = {.kind = NX_OAI_CHAT, .id = "chatcmpl-y", .created = 1, .model = "tiny"};
    nx_oai_choice c = {.index = 0, .text = "", .text_len = 0};
    char *ev = nx_oai_stream_chunk(&m, &c, true, true);
    json_t *j = parse_sse(ev);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(ch, "delta");
    assert_string_equal(json_string_value(json_object_get(delta, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(delta, "content")), "");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    assert_true(json_is_null(json_object_get(ch, "logprobs")));
    assert_non_null(json_object_get(j, "usage"));
    assert_true(json_is_null(json_object_get(j, "usage")));
    json_decref(j);
    free(ev);

    c.text = "Hello";
    c.text_len = 5;
    ev = nx_oai_stream_chunk(&m, &c, false, false);
    j = parse_sse(ev);
    delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    assert_null(json_object_get(delta, "role"));
    assert_string_equal(json_string_value(json_object_get(delta, "content")), "Hello");
    assert_null(json_object_get(j, "usage"));
    json_decref(j);
    free(ev);

    c.text = "";
    c.text_len = 0;
    c.finish_reason = "length";
    ev = nx_oai_stream_chunk(&m, &c, false, false);
    j = parse_sse(ev);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(ch, "delta")), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_decref(j);
    free(ev);

    nx_oai_usage u = {.prompt_tokens = 3, .completion_tokens = 4};
    ev = nx_oai_stream_usage(&m, &u);
    j = parse_sse(ev);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")),
                     7);
    json_decref(j);
    free(ev);
    assert_string_equal(NX_OAI_STREAM_DONE, "data: [DONE]\n\n");
}

static void test_completion_response_and_chunk(void **state) {
    (void)state;
    nx_oai_logprob lp[2] = {{.id = 1, .logprob = -0.5f, .n_top = 1, .top_id = {1},
                             .top_logprob = {-0.5f}},
                            {.id = 22, .logprob = -2.0f, .n_top = 1, .top_id = {3},
                             .top_logprob = {-0.1f}}};
    nx_oai_meta m = {.kind = NX_OAI_COMPLETION, .id = "cmpl-z", .created = 9, .model = "tiny",
                     .logprobs = true, .token_text = fake_token_text};
    nx_oai_choice c[2] = {{.index = 0, .text = "t1t22", .text_len = 5, .finish_reason = "length",
                           .lp = lp, .n_lp = 2},
                          {.index = 1, .text = "b", .text_len = 1, .finish_reason = "stop"}};
    nx_oai_usage u = {.prompt_tokens = 2, .completion_tokens = 3};
    char *s = nx_oai_response_json(&m, c, 2, &u);
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    json_t *choices = json_object_get(j, "choices");
    assert_int_equal(json_array_size(choices), 2);
    json_t *c0 = json_array_get(choices, 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), "t1t22");
    json_t *lpj = json_object_get(c0, "logprobs");
    assert_string_equal(json_string_value(json_array_get(json_object_get(lpj, "tokens"), 1)), "t22");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(lpj, "text_offset"), 1)), 2);
    json_t *top1 = json_array_get(json_object_get(lpj, "top_logprobs"), 1);
    assert_float_equal(json_number_value(json_object_get(top1, "t3")), -0.1, 1e-6);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(choices, 1), "index")), 1);
    json_decref(j);
    free(s);

    m.logprobs = false;
    char *ev = nx_oai_stream_chunk(&m, &c[1], false, true);
    j = parse_sse(ev);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "b");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_decref(j);
    free(ev);
}

static void test_models_json(void **state) {
    (void)state;
    char *s = nx_oai_models_json("tiny", 5, NULL);
    json_t *j = json_loads(s, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(m, "id")), "tiny");
    assert_string_equal(json_string_value(json_object_get(m, "object")), "model");
    json_decref(j);
    free(s);
}

static void test_utf8_sanitize(void **state) {
    (void)state;
    size_t n;
    char *s = nx_oai_utf8_sanitize("a\xC0\xAF" "b\xED\xA0\x80" "c\xF0\x9F\x98\x80", 12, &n);
    /* overlong and surrogate forms are replaced byte by byte; the emoji survives */
    assert_string_equal(s, "a\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                           "c\xF0\x9F\x98\x80");
    assert_int_equal(n, strlen(s));
    free(s);
}

/* ---------------------------------------------------------------- stop strings */

/* Feeds tokens through a matcher and returns everything released (caller frees). */
static char *run_stop(char *const *stops, size_t n_stop, const char *const *toks, size_t n_tok,
                      bool *stopped, size_t *stop_at) {
    nx_stop_matcher m;
    nx_stop_init(&m, stops, n_stop);
    nx_strbuf out = {0};
    *stopped = false;
    *stop_at = n_tok;
    for (size_t i = 0; i < n_tok; i++) {
        bool s = false;
        assert_int_equal(nx_stop_push(&m, toks[i], strlen(toks[i]), &out, &s), NX_OK);
        if (s && !*stopped) *stopped = true, *stop_at = i;
    }
    assert_int_equal(nx_stop_flush(&m, &out), NX_OK);
    nx_stop_free(&m);
    return nx_strbuf_take(&out);
}

static void test_stop_across_tokens(void **state) {
    (void)state;
    char *stops[] = {"lo Wo", "END"};
    bool stopped;
    size_t at;
    const char *t1[] = {"Hel", "lo W", "orld", "!"};
    char *s = run_stop(stops, 2, t1, 4, &stopped, &at);
    assert_true(stopped);
    assert_int_equal(at, 2);
    assert_string_equal(s, "Hel");
    free(s);

    /* a near-miss prefix is held back and then released */
    const char *t2[] = {"abcE", "N", "x", "yz"};
    s = run_stop(stops, 2, t2, 4, &stopped, &at);
    assert_false(stopped);
    assert_string_equal(s, "abcENxyz");
    free(s);

    /* the stop string at the very start, inside one token */
    const char *t3[] = {"END of", " it"};
    s = run_stop(stops, 2, t3, 2, &stopped, &at);
    assert_true(stopped);
    assert_int_equal(at, 0);
    assert_string_equal(s, "");
    free(s);

    /* the earliest of several stop strings wins */
    char *stops2[] = {"cd", "b"};
    const char *t4[] = {"abcd"};
    s = run_stop(stops2, 2, t4, 1, &stopped, &at);
    assert_string_equal(s, "a");
    free(s);

    /* no stops: everything passes straight through */
    const char *t5[] = {"x", "y"};
    s = run_stop(NULL, 0, t5, 2, &stopped, &at);
    assert_false(stopped);
    assert_string_equal(s, "xy");
    free(s);

    /* a held-back prefix at the end is flushed as ordinary text */
    const char *t6[] = {"the E", "N"};
    s = run_stop(stops, 2, t6, 2, &stopped, &at);
    assert_false(stopped);
    assert_string_equal(s, "the EN");
    free(s);

    /* multi-byte stop string split across tokens at byte level */
    char *stops3[] = {"\xC3\xA9t\xC3\xA9"}; /* "été" */
    const char *t7[] = {"un \xC3\xA9", "t", "\xC3\xA9 chaud"};
    s = run_stop(stops3, 1, t7, 3, &stopped, &at);
    assert_true(stopped);
    assert_string_equal(s, "un ");
    free(s);
}

static void test_stop_release_is_incremental(void **state) {
    (void)state;
    /* Streaming must release text as soon as it cannot begin a stop string. */
    char *stops[] = {"STOP"};
    nx_stop_matcher m;
    nx_stop_init(&m, stops, 1);
    nx_strbuf out = {0};
    bool stopped;
    nx_stop_push(&m, "hello S", 7, &out, &stopped);
    assert_int_equal(out.len, 6); /* "hello " released, "S" held */
    nx_stop_push(&m, "T", 1, &out, &stopped);
    assert_int_equal(out.len, 6);
    nx_stop_push(&m, "x", 1, &out, &stopped);
    assert_string_equal(out.data, "hello STx");
    nx_stop_push(&m, "SSTO", 4, &out, &stopped);
    assert_string_equal(out.data, "hello STxS"); /* "STO" held */
    nx_stop_push(&m, "P and more", 10, &out, &stopped);
    assert_true(stopped);
    assert_string_equal(out.data, "hello STxS");
    nx_stop_push(&m, "ignored", 7, &out, &stopped);
    assert_true(stopped);
    assert_string_equal(out.data, "hello STxS");
    nx_strbuf_free(&out);
    nx_stop_free(&m);
}

/* ---------------------------------------------------------------- metrics, strbuf */

static void test_metrics_render(void **state) {
    (void)state;
    nx_metrics m;
    nx_metrics_init(&m);
    nx_metrics_count_request(&m, "/v1/chat/completions", 200);
    nx_metrics_count_request(&m, "/v1/chat/completions", 200);
    nx_metrics_count_request(&m, "/v1/chat/completions", 400);
    nx_gen_stats s;
    memset(&s, 0, sizeof s);
    s.n_prompt = 10;
    s.n_generated = 21;
    s.t_decode = 2.0;
    s.n_drafts = 5;
    s.n_drafted = 10;
    s.n_accepted = 6;
    s.drafted_at[0] = 5;
    s.accepted_at[0] = 4;
    s.drafted_at[1] = 5;
    s.accepted_at[1] = 2;
    s.expert_bytes_ar = 1000;
    s.n_ar_steps = 10;
    s.expert_bytes_verify = 900;
    s.n_verify_steps = 3;
    nx_metrics_add_generation(&m, &s, 0.25, 0.0);
    nx_metrics_gauges g = {.model_id = "ti\"ny", .mtp = "inline", .draft = NX_DRAFT_AUTO,
                           .queue_depth = 1, .queue_capacity = 8, .active = 1};
    char *t = nx_metrics_render(&m, &g);
    assert_non_null(t);
    assert_non_null(strstr(t, "nextn_info{model=\"ti\\\"ny\",mtp=\"inline\",draft=\"auto\"} 1\n"));
    assert_non_null(strstr(t, "nextn_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n"));
    assert_non_null(strstr(t, "status=\"400\"} 1\n"));
    assert_non_null(strstr(t, "nextn_completion_tokens_total 21\n"));
    assert_non_null(strstr(t, "nextn_decode_tokens_per_second 10.000\n"));
    assert_non_null(strstr(t, "nextn_spec_drafts_total 5\n"));
    assert_non_null(strstr(t, "nextn_spec_drafted_tokens_total 10\n"));
    assert_non_null(strstr(t, "nextn_spec_accepted_tokens_total 6\n"));
    assert_non_null(strstr(t, "nextn_spec_acceptance_rate 0.600000\n"));
    assert_non_null(strstr(t, "nextn_spec_accepted_at_total{position=\"2\"} 2\n"));
    assert_non_null(strstr(t, "nextn_expert_bytes_per_step{kind=\"ar\"} 100\n"));
    assert_non_null(strstr(t, "nextn_expert_bytes_per_step{kind=\"verify\"} 300\n"));
    assert_non_null(strstr(t, "# TYPE nextn_requests_total counter\n"));
    free(t);
    nx_metrics_destroy(&m);
}

static void test_strbuf(void **state) {
    (void)state;
    nx_strbuf b = {0};
    for (int i = 0; i < 1000; i++) assert_int_equal(nx_strbuf_printf(&b, "%d,", i % 10), NX_OK);
    assert_int_equal(b.len, 2000);
    nx_strbuf_consume(&b, 1998);
    assert_string_equal(b.data, "9,");
    nx_strbuf_consume(&b, 10);
    assert_int_equal(b.len, 0);
    char *s = nx_strbuf_take(&b);
    assert_string_equal(s, "");
    free(s);
    nx_strbuf_free(&b);
    nx_strbuf_free(NULL);

    /* reserve alone (as the tokenizer's detokenizer does) still leaves a C string */
    assert_int_equal(nx_strbuf_reserve(&b, 0), NX_OK);
    assert_non_null(b.data);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    assert_int_equal(nx_strbuf_reserve(&b, 100), NX_OK);
    assert_true(b.cap >= 101);
    memcpy(b.data, "abc", 3); /* the caller writes into the reserved room itself */
    b.len = 3;
    assert_int_equal(nx_strbuf_printf(&b, "%s", "d"), NX_OK);
    assert_string_equal(b.data, "abcd");
    assert_int_equal(nx_strbuf_reserve(&b, SIZE_MAX), NX_E_NOMEM);
    assert_string_equal(b.data, "abcd"); /* unchanged on failure */
    s = nx_strbuf_take(&b);
    assert_string_equal(s, "abcd");
    free(s);
    assert_int_equal(nx_strbuf_reserve(&b, 0), NX_OK);
    s = nx_strbuf_take(&b);
    assert_string_equal(s, "");
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_minimal_defaults),
        cmocka_unit_test(test_chat_all_fields),
        cmocka_unit_test(test_chat_tool_call_arguments),
        cmocka_unit_test(test_chat_speculative_auto_and_nulls),
        cmocka_unit_test(test_request_error_matrix),
        cmocka_unit_test(test_completion_prompts),
        cmocka_unit_test(test_error_json_shape),
        cmocka_unit_test(test_chat_response_json),
        cmocka_unit_test(test_chat_stream_chunks),
        cmocka_unit_test(test_completion_response_and_chunk),
        cmocka_unit_test(test_models_json),
        cmocka_unit_test(test_utf8_sanitize),
        cmocka_unit_test(test_stop_across_tokens),
        cmocka_unit_test(test_stop_release_is_incremental),
        cmocka_unit_test(test_metrics_render),
        cmocka_unit_test(test_strbuf),
    };
    return cmocka_run_group_tests_name("openai", tests, NULL, NULL);
}

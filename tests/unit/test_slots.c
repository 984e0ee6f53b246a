/* The server's slot requests (POST /slots/ID?action=...): which file names stay inside the slot
 * directory (llama.cpp's fs_validate_filename rules), the slot id and action checks, the body's
 * 400s naming their field, and the answers' JSON read back with jansson. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve/slots.h"

static void test_filenames(void **state) {
    (void)state;
    static const char *const good[] = {"a.bin", "slot_1", "conversation-2026.state", "\xe5\x90\x8d\xe5\x89\x8d.bin",
                                       "a.b.c", "x"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_null(nx_slot_filename_problem(good[i], strlen(good[i])));
    char longest[NX_SLOT_NAME_MAX + 2];
    memset(longest, 'a', sizeof longest);
    assert_null(nx_slot_filename_problem(longest, NX_SLOT_NAME_MAX));
    static const struct {
        const char *name;
        size_t len;
        const char *why;
    } bad[] = {
        {"", 0, "empty"},
        {"a/b", 3, "path separator"},
        {"a\\b", 3, "path separator"},
        {"/etc", 4, "path separator"},
        {".", 1, "starts with '.'"},
        {"..", 2, "starts with '.'"},
        {".hidden", 7, "starts with '.'"},
        {"a..b", 4, "'..'"},
        {"a\0b", 3, "NUL"},
        {"a\x01" "b", 3, "control"},
        {"a\x7f", 2, "control"},
        {"a\xe2\x88\x95" "b", 5, "control or reserved"}, /* U+2215 division slash */
        {"a:b", 3, "reserved"},
        {"a\xff" "b", 3, "UTF-8"},
        {"\xc3", 1, "UTF-8"},
        {" a", 2, "space"},
        {"a ", 2, "space"},
        {"a.", 2, "ends with '.'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *why = nx_slot_filename_problem(bad[i].name, bad[i].len);
        assert_non_null(why);
        if (!strstr(why, bad[i].why)) fail_msg("'%s': %s (expected '%s')", bad[i].name, why, bad[i].why);
    }
    assert_non_null(strstr(nx_slot_filename_problem(longest, NX_SLOT_NAME_MAX + 1), "255"));
}

/* A request that must fail: 400, the named field and the code. */
static void expect_400_of(int n_slots, const char *id, const char *action, const char *body, const char *param, const char *code) {
    nx_slot_request r;
    nx_oai_error e;
    memset(&e, 0, sizeof e);
    assert_int_equal(nx_slot_request_parse(id, action, body, body ? strlen(body) : 0, n_slots, &r, &e), NX_E_ARG);
    assert_int_equal(e.http_status, 400);
    if (strcmp(e.param, param ? param : "") != 0 || strcmp(e.code, code) != 0)
        fail_msg("id %s action %s body %s: param '%s' code '%s' (%s)", id, action ? action : "(none)",
                 body ? body : "(none)", e.param, e.code, e.message);
}

static void expect_400(const char *id, const char *action, const char *body, const char *param, const char *code) {
    expect_400_of(1, id, action, body, param, code);
}

static void test_requests(void **state) {
    (void)state;
    nx_slot_request r;
    nx_oai_error e;
    const char *body = "{\"filename\": \"chat.state\"}";
    assert_int_equal(nx_slot_request_parse("0", "save", body, strlen(body), 1, &r, &e), NX_OK);
    assert_int_equal(r.action, NX_SLOT_SAVE);
    assert_string_equal(r.filename, "chat.state");
    assert_int_equal(nx_slot_request_parse("00", "restore", body, strlen(body), 1, &r, &e), NX_OK);
    assert_int_equal(r.action, NX_SLOT_RESTORE);
    assert_int_equal(nx_slot_request_parse("0", "erase", NULL, 0, 1, &r, &e), NX_OK);
    assert_int_equal(r.action, NX_SLOT_ERASE);

    expect_400("1", "save", body, "id_slot", "invalid_slot");
    /* with --parallel 4, slots 0..3 */
    assert_int_equal(nx_slot_request_parse("3", "save", body, strlen(body), 4, &r, &e), NX_OK);
    assert_int_equal(r.id, 3);
    assert_int_equal(nx_slot_request_parse("002", "erase", NULL, 0, 4, &r, &e), NX_OK);
    assert_int_equal(r.id, 2);
    expect_400_of(4, "4", "save", body, "id_slot", "invalid_slot");
    expect_400_of(4, "99999999999", "erase", NULL, "id_slot", "invalid_slot");
    expect_400("abc", "save", body, "id_slot", "invalid_slot");
    expect_400("", "erase", NULL, "id_slot", "invalid_slot");
    expect_400("-0", "erase", NULL, "id_slot", "invalid_slot");
    expect_400("0", NULL, body, "action", "missing_required_parameter");
    expect_400("0", "", body, "action", "missing_required_parameter");
    expect_400("0", "delete", body, "action", "invalid_value");
    expect_400("0", "save", NULL, NULL, "invalid_json");
    expect_400("0", "save", "{\"filename\": ", NULL, "invalid_json");
    expect_400("0", "save", "[\"a\"]", NULL, "invalid_json");
    expect_400("0", "restore", "{}", "filename", "missing_required_parameter");
    expect_400("0", "restore", "{\"filename\": 3}", "filename", "invalid_type");
    expect_400("0", "restore", "{\"filename\": \"../etc/passwd\"}", "filename", "invalid_filename");
    expect_400("0", "save", "{\"filename\": \"a\\u0000b\"}", "filename", "invalid_filename");

    /* a save writes NAME.tmp.PID first, so its names are shorter than a restore's */
    char big[NX_SLOT_SAVE_NAME_MAX + 40];
    char name[NX_SLOT_SAVE_NAME_MAX + 2];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(big, sizeof big, "{\"filename\": \"%s\"}", name);
    assert_int_equal(nx_slot_request_parse("0", "restore", big, strlen(big), 1, &r, &e), NX_OK);
    expect_400("0", "save", big, "filename", "invalid_filename");
    name[NX_SLOT_SAVE_NAME_MAX] = '\0';
    snprintf(big, sizeof big, "{\"filename\": \"%s\"}", name);
    assert_int_equal(nx_slot_request_parse("0", "save", big, strlen(big), 1, &r, &e), NX_OK);
    assert_int_equal(strlen(r.filename), NX_SLOT_SAVE_NAME_MAX);
}

static void test_responses(void **state) {
    (void)state;
    nx_slot_request r = {.action = NX_SLOT_SAVE};
    snprintf(r.filename, sizeof r.filename, "x.state");
    const nx_slot_result res = {.n = 35, .bytes = 123456789012LL, .ms = 2.5};
    const char *const counts[3][2] = {{"n_saved", "n_written"}, {"n_restored", "n_read"}, {"n_erased", NULL}};
    const char *const timings[3] = {"save_ms", "restore_ms", NULL};
    for (int a = 0; a < 3; a++) {
        r.action = (nx_slot_action)a;
        char *text = nx_slot_response_json(&r, &res);
        assert_non_null(text);
        json_t *j = json_loads(text, 0, NULL);
        assert_non_null(j);
        assert_int_equal(json_integer_value(json_object_get(j, "id_slot")), 0);
        assert_true(json_is_integer(json_object_get(j, "id_slot")));
        assert_int_equal(json_integer_value(json_object_get(j, counts[a][0])), 35);
        if (counts[a][1]) {
            assert_string_equal(json_string_value(json_object_get(j, "filename")), "x.state");
            assert_int_equal(json_integer_value(json_object_get(j, counts[a][1])), 123456789012LL);
            assert_true(json_real_value(json_object_get(json_object_get(j, "timings"), timings[a])) == 2.5);
            assert_int_equal(json_object_size(j), 5);
        } else {
            assert_int_equal(json_object_size(j), 2);
        }
        json_decref(j);
        free(text);
    }
}

/* The save quota counts the directory's regular files (not subdirectories, FIFOs or links)
 * plus the new file; GET /slots reports used and limit. */
static void test_quota(void **state) {
    (void)state;
    char dir[] = "/tmp/nx_slot_quota_XXXXXX", p[128];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/a.bin", dir);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    for (int i = 0; i < 1000; i++) fputc('x', f);
    fclose(f);
    snprintf(p, sizeof p, "%s/sub", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/pipe", dir);
    assert_int_equal(mkfifo(p, 0600), 0);
    snprintf(p, sizeof p, "%s/link", dir);
    assert_int_equal(symlink("a.bin", p), 0);
    uint64_t used = 7;
    assert_int_equal(nx_slot_dir_bytes(dir, &used, NULL), NX_OK);
    assert_int_equal(used, 1000);
    nx_error err = {0};
    assert_int_equal(nx_slot_quota_check(dir, 24, 1024, &err), NX_OK);
    assert_int_equal(nx_slot_quota_check(dir, 25, 1024, &err), NX_E_ARG);
    assert_non_null(strstr(err.msg, "slot save quota exceeded"));
    assert_non_null(strstr(err.msg, "--slot-save-quota"));
    json_t *slot = json_object();
    nx_slot_quota_json(slot, dir, 1024);
    json_t *q = json_object_get(slot, "save_quota");
    assert_int_equal(json_integer_value(json_object_get(q, "used_bytes")), 1000);
    assert_int_equal(json_integer_value(json_object_get(q, "limit_bytes")), 1024);
    json_decref(slot);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(nx_slot_dir_bytes(dir, &used, &err), NX_E_IO);
    assert_null(strstr(err.msg, dir)); /* the server's path is not in a message clients may see */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filenames),
        cmocka_unit_test(test_requests),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_quota),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* safetensors parser and tensor store tests: good files (single, sharded with an index, MLX
 * sidecar, unaligned data) and every class of hostile header the parser must reject with a
 * message naming the file and the tensor; plus the dtype table the parser relies on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_builder.h"
#include "io/safetensors.h"

/* ---------------------------------------------------------------- dtype table */

static void test_dtype_table(void **state) {
    (void)state;
    assert_int_equal(nx_dtype_size(NX_DTYPE_F32), 4);
    assert_int_equal(nx_dtype_size(NX_DTYPE_BF16), 2);
    assert_int_equal(nx_dtype_size(NX_DTYPE_F16), 2);
    assert_int_equal(nx_dtype_size(NX_DTYPE_U32), 4);
    assert_int_equal(nx_dtype_size(NX_DTYPE_I64), 8);
    assert_int_equal(nx_dtype_size(NX_DTYPE_BOOL), 1);
    assert_int_equal(nx_dtype_size(NX_DTYPE_F8_E4M3), 1);
    for (int i = 0; i < NX_DTYPE_COUNT; i++) {
        assert_true(nx_dtype_size((nx_dtype)i) > 0);
        assert_int_equal(nx_dtype_from_name(nx_dtype_name((nx_dtype)i)), i);
    }
    assert_string_equal(nx_dtype_name(NX_DTYPE_BF16), "BF16");
    assert_int_equal(nx_dtype_from_name("bf16"), -1); /* case matters in safetensors */
    assert_int_equal(nx_dtype_from_name("F8_E8M0"), -1);
    assert_int_equal(nx_dtype_from_name(NULL), -1);
    assert_int_equal(nx_dtype_size(NX_DTYPE_COUNT), 0);
}

static void test_linear_bytes(void **state) {
    (void)state;
    nx_linear f = {.dtype = NX_DTYPE_BF16, .out = 3, .in = 64};
    assert_int_equal(nx_linear_row_bytes(&f), 128);
    assert_int_equal(nx_linear_bytes(&f), 384);
    static uint8_t dummy[4];
    /* 4-bit, group 32, bf16 scales: 64*4/8 = 32 packed bytes + 2 groups * 2 B * (scales+biases) */
    nx_linear q = {.dtype = NX_DTYPE_U32, .out = 5, .in = 64, .bits = 4, .group = 32,
                   .sdtype = NX_DTYPE_BF16, .w = dummy, .scales = dummy, .biases = dummy};
    assert_int_equal(nx_linear_row_bytes(&q), 32 + 4 + 4);
    assert_int_equal(nx_linear_bytes(&q), 5 * 40);
    q.bits = 3;
    assert_int_equal(nx_linear_row_bytes(&q), 24 + 8);
    assert_int_equal(nx_linear_row_bytes(NULL), 0);
    assert_int_equal(nx_linear_bytes(NULL), 0);
}

/* ---------------------------------------------------------------- parse: hostile headers */

/* Parses a literal header + dlen data bytes; returns the status and leaves the message. */
static nx_status parse_hdr(const char *hdr, size_t dlen, nx_error *e) {
    size_t len;
    uint8_t *b = st_image(hdr, dlen, 0, &len);
    nx_tensor *t = NULL;
    size_t n = 0;
    memset(e, 0, sizeof *e);
    nx_status st = nx_safetensors_parse(b, len, "bad.safetensors", &t, &n, e);
    if (st == NX_OK) nx_safetensors_free_parsed(t, n);
    else assert_null(t);
    free(b);
    return st;
}

static void expect_bad(const char *hdr, size_t dlen, const char *must_contain) {
    nx_error e;
    nx_status st = parse_hdr(hdr, dlen, &e);
    if (st != NX_E_FORMAT) print_error("header accepted or wrong status %d: %s\n", st, hdr);
    assert_int_equal(st, NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "bad.safetensors"));
    if (must_contain && !strstr(e.msg, must_contain)) {
        print_error("message \"%s\" lacks \"%s\"\n", e.msg, must_contain);
        fail();
    }
}

static void test_parse_good(void **state) {
    (void)state;
    nx_error e;
    const char *h = "{\"__metadata__\":{\"format\":\"mlx\"},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[24,27]},"
                    "\"c\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[27,29]},"
                    "\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[27,27]}}";
    size_t len;
    uint8_t *b = st_image(h, 29, 0, &len);
    nx_tensor *t;
    size_t n;
    assert_int_equal(nx_safetensors_parse(b, len, "x", &t, &n, &e), NX_OK);
    assert_int_equal(n, 4);
    const uint8_t *data = b + 8 + strlen(h);
    assert_string_equal(t[0].name, "a");
    assert_int_equal(t[0].dtype, NX_DTYPE_F32);
    assert_int_equal(t[0].n_dims, 2);
    assert_int_equal(t[0].shape[1], 3);
    assert_ptr_equal(t[0].data, data);
    assert_int_equal(t[0].nbytes, 24);
    assert_ptr_equal(t[2].data, data + 27); /* scalar at an odd (unaligned) offset */
    assert_int_equal(t[2].n_dims, 0);
    assert_int_equal(t[3].nbytes, 0);
    nx_safetensors_free_parsed(t, n);
    free(b);
    /* empty header object: no tensors, still valid */
    assert_int_equal(parse_hdr("{}", 0, &e), NX_OK);
    /* trailing spaces (HF pads to 8 bytes) */
    assert_int_equal(parse_hdr("{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}   ", 4, &e),
                     NX_OK);
}

static void test_parse_truncated(void **state) {
    (void)state;
    nx_error e;
    nx_tensor *t;
    size_t n;
    uint8_t small[5] = {1, 0, 0, 0, 0};
    assert_int_equal(nx_safetensors_parse(small, sizeof small, "bad.safetensors", &t, &n, &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "bad.safetensors"));
    /* header length larger than what follows */
    size_t len;
    uint8_t *b = st_image("{}", 0, 100, &len);
    assert_int_equal(nx_safetensors_parse(b, len, "bad.safetensors", &t, &n, &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "exceeds the file size"));
    free(b);
    /* beyond the 100 MB cap, and a length that would wrap 8 + N */
    b = st_image("{}", 0, 200ull * 1000 * 1000, &len);
    assert_int_equal(nx_safetensors_parse(b, len, "bad.safetensors", &t, &n, &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "100 MB"));
    free(b);
    b = st_image("{}", 0, UINT64_MAX - 3, &len);
    assert_int_equal(nx_safetensors_parse(b, len, "bad.safetensors", &t, &n, &e), NX_E_FORMAT);
    free(b);
    /* data cut short: tensor ends past the buffer */
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 15, "w");
}

static void test_parse_bad_entries(void **state) {
    (void)state;
    expect_bad("[1,2]", 0, "not a JSON object");
    expect_bad("{\"a\":", 0, "not valid JSON");
    expect_bad("", 0, "JSON");
    expect_bad("{\"a\":1,\"a\":2}", 0, NULL); /* duplicate keys */
    expect_bad("{\"w\":5}", 0, "w");
    expect_bad("{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "F33");
    nx_error ue;
    assert_int_equal(parse_hdr("{\"s\":{\"dtype\":\"F8_E8M0\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &ue),
                     NX_E_UNSUPPORTED);
    assert_non_null(strstr(ue.msg, "F8_E8M0"));
    expect_bad("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    expect_bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "shape");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "shape");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               "dimensions");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "w");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "w");
    /* out of bounds */
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 4, "outside");
    /* size != shape x dtype */
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "needs 8");
    expect_bad("{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "w");
    /* element count / byte size overflow */
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
               "overflows");
    expect_bad("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
               "overflows");
    /* overlap */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 8, "overlap");
    /* metadata must map strings to strings */
    expect_bad("{\"__metadata__\":{\"format\":1}}", 0, "__metadata__");
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__");
    /* NUL inside the header is not JSON */
    size_t len;
    uint8_t *b = st_image("{\"a\" :{}}", 0, 0, &len);
    b[12] = 0;
    nx_tensor *t;
    size_t n;
    nx_error e;
    assert_int_equal(nx_safetensors_parse(b, len, "bad.safetensors", &t, &n, &e), NX_E_FORMAT);
    free(b);
    /* zero-size tensors may share an offset with others */
    assert_int_equal(parse_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                               "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]}}", 4, &e),
                     NX_OK);
}

/* ---------------------------------------------------------------- the store */

static void test_store_single(void **state) {
    (void)state;
    char *dir = tmpdir_new();
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint8_t u[3] = {7, 8, 9};
    uint16_t h[2] = {0x3f80, 0xc000}; /* bf16 1, -2 */
    nx_tensor ts[3] = {
        {.name = "u", .dtype = NX_DTYPE_U8, .n_dims = 1, .shape = {3}, .data = u, .nbytes = 3},
        {.name = "a", .dtype = NX_DTYPE_F32, .n_dims = 2, .shape = {2, 3}, .data = (uint8_t *)a, .nbytes = 24},
        {.name = "h", .dtype = NX_DTYPE_BF16, .n_dims = 1, .shape = {2}, .data = (uint8_t *)h, .nbytes = 4},
    };
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    nx_error e;
    for (int align = 1; align <= 8; align += 7) {
        assert_int_equal(nx_safetensors_write(p, ts, 3, align, "{\"format\":\"pt\"}", &e), NX_OK);
        nx_store *st = NULL;
        assert_int_equal(nx_store_open(dir, &st, &e), NX_OK);
        assert_int_equal(nx_store_count(st), 3);
        assert_int_equal(nx_store_n_files(st), 1);
        const nx_tensor *t = nx_store_find(st, "a");
        assert_non_null(t);
        assert_string_equal(nx_store_file_of(st, t), "model.safetensors");
        float got[6];
        memcpy(got, t->data, sizeof got); /* may be unaligned (align 1) */
        assert_memory_equal(got, a, sizeof a);
        assert_memory_equal(nx_store_find(st, "u")->data, u, 3);
        assert_memory_equal(nx_store_find(st, "h")->data, h, 4);
        assert_null(nx_store_find(st, "missing"));
        assert_int_equal(nx_store_tensor_bytes(st), 31);
        assert_true(nx_store_mapped_bytes(st) > 31);
        assert_string_equal(nx_store_dir(st), dir);
        assert_null(nx_store_tensor(st, 3));
        nx_store_free(st);
    }
    nx_store_free(NULL);
    assert_null(nx_store_find(NULL, "a"));
    tmpdir_free(dir);
}

/* A share's store (nx_store_declare): rows of a stacked tensor mapped where the whole tensor's
 * rows are, absent tensors reading as zeros, the digest of the whole checkpoint, and declarations
 * that contradict the files refused. Rows of 8400 bytes after a 1-byte tensor (unpadded) start at
 * offsets that are no multiple of the page size in the file or in the tensor. */
static void test_store_declare(void **state) {
    (void)state;
    char *full = tmpdir_new(), *share = tmpdir_new();
    const int64_t E = 5, R = 3, C = 700, lo = 1, hi = 4;
    float *w = malloc(sizeof(float) * (size_t)(E * R * C));
    for (int64_t i = 0; i < E * R * C; i++) w[i] = (float)i + 0.5f;
    float n[4] = {1, 2, 3, 4};
    uint8_t odd = 7;
    const size_t row = sizeof(float) * (size_t)(R * C);
    nx_tensor ts[3] = {
        {.name = "odd", .dtype = NX_DTYPE_U8, .n_dims = 1, .shape = {1}, .data = &odd, .nbytes = 1},
        {.name = "w", .dtype = NX_DTYPE_F32, .n_dims = 3, .shape = {E, R, C}, .data = (uint8_t *)w, .nbytes = row * E},
        {.name = "n", .dtype = NX_DTYPE_F32, .n_dims = 1, .shape = {4}, .data = (uint8_t *)n, .nbytes = 16},
    };
    char p[1024];
    nx_error e;
    snprintf(p, sizeof p, "%s/model.safetensors", full);
    assert_int_equal(nx_safetensors_write(p, ts, 3, 1, NULL, &e), NX_OK);
    ts[1].shape[0] = hi - lo;
    ts[1].data = (uint8_t *)w + row * lo;
    ts[1].nbytes = row * (hi - lo);
    snprintf(p, sizeof p, "%s/model.safetensors", share);
    assert_int_equal(nx_safetensors_write(p, ts, 2, 1, NULL, &e), NX_OK);
    nx_store *a, *b;
    assert_int_equal(nx_store_open(full, &a, &e), NX_OK);
    assert_int_equal(nx_store_open_lazy(share, &b, &e), NX_OK);
    assert_true(nx_store_digest(a) != nx_store_digest(b));
    const nx_tensor_decl d[2] = {{.name = "w", .dtype = NX_DTYPE_F32, .n_dims = 3, .shape = {E, R, C}, .rows_lo = lo,
                                  .rows_hi = hi},
                                 {.name = "n", .dtype = NX_DTYPE_F32, .n_dims = 1, .shape = {4}}};
    assert_int_equal(nx_store_declare(b, d, 2, "nextn-share.json", &e), NX_OK);
    assert_int_equal(nx_store_count(b), 3);
    assert_true(nx_store_digest(a) == nx_store_digest(b));
    assert_int_equal(nx_store_tensor_bytes(a), nx_store_tensor_bytes(b));
    const nx_tensor *tw = nx_store_find(b, "w"), *tn = nx_store_find(b, "n");
    assert_int_equal(tw->shape[0], E);
    assert_int_equal(tw->nbytes, row * E);
    assert_true(nx_store_holds(b, tw));
    assert_memory_equal(tw->data + row * lo, (const uint8_t *)w + row * lo, row * (hi - lo));
    assert_false(nx_store_holds(b, tn));
    assert_string_equal(nx_store_file_of(b, tn), "nextn-share.json");
    static const uint8_t zeros[16];
    assert_memory_equal(tn->data, zeros, 16);
    nx_store_free(b);

    /* declarations the files contradict */
    const nx_tensor_decl held = {.name = "odd", .dtype = NX_DTYPE_U8, .n_dims = 1, .shape = {1}};
    assert_int_equal(nx_store_open_lazy(share, &b, &e), NX_OK);
    assert_int_equal(nx_store_declare(b, &held, 1, "nextn-share.json", &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "declares tensor odd absent"));
    nx_store_free(b);
    nx_tensor_decl other = d[0];
    other.rows_hi = hi + 1;
    assert_int_equal(nx_store_open_lazy(share, &b, &e), NX_OK);
    assert_int_equal(nx_store_declare(b, &other, 1, "nextn-share.json", &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "not rows 1-5"));
    nx_store_free(b);
    other = d[0];
    other.name = "gone";
    assert_int_equal(nx_store_open_lazy(share, &b, &e), NX_OK);
    assert_int_equal(nx_store_declare(b, &other, 1, "nextn-share.json", &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "missing tensor gone"));
    nx_store_free(b);
    nx_store_free(a);
    free(w);
    tmpdir_free(full);
    tmpdir_free(share);
}

static void test_store_unaligned(void **state) {
    (void)state;
    /* MLX does not pad: with a 1-byte tensor first every later tensor sits at an odd address */
    char *dir = tmpdir_new();
    ck *c = calloc(1, sizeof *c);
    ck_add(c, 0, "odd", NX_DTYPE_U8, 1, (int64_t)1);
    ck_add(c, 0, "w", NX_DTYPE_F32, 2, (int64_t)3, (int64_t)5);
    const char *names[] = {"model.safetensors"};
    assert_int_equal(ck_write(c, dir, names, 1, 1, NULL), NX_OK);
    nx_store *st;
    nx_error e;
    assert_int_equal(nx_store_open(dir, &st, &e), NX_OK);
    const nx_tensor *w = nx_store_find(st, "w");
    const nx_tensor *o = nx_store_find(st, "odd");
    assert_ptr_equal(w->data, o->data + 1);
    assert_memory_equal(w->data, ck_get(c, "w")->data, 60);
    nx_store_free(st);
    ck_free(c);
    free(c);
    tmpdir_free(dir);
}

static void test_store_sharded_and_sidecar(void **state) {
    (void)state;
    char *dir = tmpdir_new();
    ck *c = calloc(1, sizeof *c);
    ck_add(c, 0, "model.embed_tokens.weight", NX_DTYPE_BF16, 2, (int64_t)4, (int64_t)8);
    ck_add(c, 0, "model.layers.0.x", NX_DTYPE_F32, 1, (int64_t)8);
    ck_add(c, 1, "model.layers.1.x", NX_DTYPE_F32, 1, (int64_t)8);
    ck_add(c, 1, "lm_head.weight", NX_DTYPE_BF16, 2, (int64_t)4, (int64_t)8);
    ck_add(c, 2, "mtp.eh_proj.weight", NX_DTYPE_BF16, 2, (int64_t)8, (int64_t)16);
    const char *names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model-mtp.safetensors"};
    int idx[] = {1, 1, 0}; /* the sidecar is not in the index */
    assert_int_equal(ck_write(c, dir, names, 3, 8, idx), NX_OK);
    write_text(dir, "other.safetensors", "garbage, never opened");
    nx_store *st;
    nx_error e;
    assert_int_equal(nx_store_open(dir, &st, &e), NX_OK);
    assert_int_equal(nx_store_n_files(st), 3);
    assert_int_equal(nx_store_count(st), 5);
    assert_string_equal(nx_store_file_of(st, nx_store_find(st, "lm_head.weight")), names[1]);
    assert_string_equal(nx_store_file_of(st, nx_store_find(st, "model.layers.0.x")), names[0]);
    assert_string_equal(nx_store_file_of(st, nx_store_find(st, "mtp.eh_proj.weight")), names[2]);
    assert_memory_equal(nx_store_find(st, "model.layers.1.x")->data, ck_get(c, "model.layers.1.x")->data, 32);
    nx_store_free(st);

    /* an index naming a tensor its file does not hold */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"model.layers.0.x\":\"model-00001-of-00002.safetensors\","
               "\"ghost.weight\":\"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    assert_null(st);
    assert_non_null(strstr(e.msg, "ghost.weight"));
    assert_non_null(strstr(e.msg, "model-00002-of-00002.safetensors"));
    /* an index pointing at the wrong file */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"model.layers.0.x\":\"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "model.layers.0.x"));
    /* an index naming a file that does not exist, or escaping the directory */
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"gone.safetensors\"}}");
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_IO);
    assert_non_null(strstr(e.msg, "gone.safetensors"));
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":3}}");
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    write_text(dir, "model.safetensors.index.json", "[]");
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "weight_map"));
    write_text(dir, "model.safetensors.index.json", "{not json");
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    ck_free(c);
    free(c);
    tmpdir_free(dir);
}

static void test_store_duplicate(void **state) {
    (void)state;
    char *dir = tmpdir_new();
    ck *c = calloc(1, sizeof *c);
    ck_add(c, 0, "model.norm.weight", NX_DTYPE_F32, 1, (int64_t)8);
    ck_add(c, 1, "model.norm.weight", NX_DTYPE_F32, 1, (int64_t)8);
    const char *names[] = {"model.safetensors", "model-mtp.safetensors"};
    assert_int_equal(ck_write(c, dir, names, 2, 8, NULL), NX_OK);
    nx_store *st;
    nx_error e;
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "model.norm.weight"));
    assert_non_null(strstr(e.msg, "model.safetensors"));
    assert_non_null(strstr(e.msg, "model-mtp.safetensors"));
    ck_free(c);
    free(c);
    tmpdir_free(dir);
}

static void test_store_bad_files(void **state) {
    (void)state;
    char *dir = tmpdir_new();
    nx_store *st;
    nx_error e;
    /* empty directory */
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_IO);
    assert_non_null(strstr(e.msg, "model*.safetensors"));
    /* not a directory */
    assert_int_equal(nx_store_open("/nonexistent/dir", &st, &e), NX_E_IO);
    /* a file shorter than 8 bytes */
    write_text(dir, "model.safetensors", "abc");
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "model.safetensors"));
    /* a good file truncated on disk: the error names the file and the tensor */
    float x[16] = {0};
    nx_tensor t = {.name = "blk.w", .dtype = NX_DTYPE_F32, .n_dims = 1, .shape = {16}, .data = (uint8_t *)x,
                   .nbytes = 64};
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(nx_safetensors_write(p, &t, 1, 8, NULL, &e), NX_OK);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    assert_int_equal(truncate(p, size - 4), 0);
    assert_int_equal(nx_store_open(dir, &st, &e), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "model.safetensors"));
    assert_non_null(strstr(e.msg, "blk.w"));
    /* the writer refuses inconsistent input */
    t.nbytes = 60;
    assert_int_equal(nx_safetensors_write(p, &t, 1, 8, NULL, &e), NX_E_ARG);
    t.nbytes = 64;
    assert_int_equal(nx_safetensors_write(p, &t, 1, 8, "[1]", &e), NX_E_ARG);
    tmpdir_free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_linear_bytes),
        cmocka_unit_test(test_parse_good),
        cmocka_unit_test(test_parse_truncated),
        cmocka_unit_test(test_parse_bad_entries),
        cmocka_unit_test(test_store_single),
        cmocka_unit_test(test_store_unaligned),
        cmocka_unit_test(test_store_sharded_and_sidecar),
        cmocka_unit_test(test_store_duplicate),
        cmocka_unit_test(test_store_bad_files),
        cmocka_unit_test(test_store_declare),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

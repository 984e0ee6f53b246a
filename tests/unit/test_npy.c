/* .npy tests: round trips of float32 arrays of rank 0..3 (and empty ones), the exact header
 * numpy.save writes (64-byte aligned data), headers of other dtypes for arrays written in pieces
 * (nx_npy_begin), versions 2/3 headers, and rejection of wrong
 * dtypes, Fortran order, truncated or oversized data and malformed header dicts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_builder.h"
#include "io/npy.h"

static char *path_in(const char *dir, const char *name) {
    char *p = malloc(1024);
    snprintf(p, 1024, "%s/%s", dir, name);
    return p;
}

static void roundtrip(const char *dir, int nd, const int64_t *shape) {
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= (size_t)shape[i];
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)i * 0.25f - 3.0f;
    char *p = path_in(dir, "rt.npy");
    nx_error e;
    assert_int_equal(nx_npy_write_f32(p, x, nd, shape, &e), NX_OK);
    float *y = NULL;
    int ynd = -1;
    int64_t ys[NX_NPY_MAX_DIMS];
    assert_int_equal(nx_npy_read_f32(p, &y, &ynd, ys, &e), NX_OK);
    assert_non_null(y);
    assert_int_equal(ynd, nd);
    for (int i = 0; i < nd; i++) assert_int_equal(ys[i], shape[i]);
    if (n) assert_memory_equal(x, y, n * sizeof *x);
    /* numpy's layout: magic, v1.0, a header padded so the data starts at a multiple of 64 */
    FILE *f = fopen(p, "rb");
    uint8_t h[10];
    assert_int_equal(fread(h, 1, 10, f), 10);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    assert_memory_equal(h, "\x93NUMPY\x01\x00", 8);
    size_t hlen = (size_t)h[8] | (size_t)h[9] << 8;
    assert_int_equal((10 + hlen) % 64, 0);
    assert_int_equal((size_t)size, 10 + hlen + n * 4);
    free(x);
    free(y);
    free(p);
}

/* nx_npy_begin: the header of any dtype, the caller's rows after it; '<f4' reads back whole. */
static void test_begin(void **state) {
    (void)state;
    char *dir = tmpdir_new();
    char *p = path_in(dir, "ids.npy");
    nx_error e;
    FILE *f = NULL;
    int64_t shape[2] = {2, 3};
    int32_t ids[6] = {1, -2, 3, 40000, 5, 6};
    assert_int_equal(nx_npy_begin(p, "<i4", 2, shape, &f, &e), NX_OK);
    assert_int_equal(fwrite(ids, 4, 3, f), 3); /* in two pieces */
    assert_int_equal(fwrite(ids + 3, 4, 3, f), 3);
    assert_int_equal(fclose(f), 0);
    f = fopen(p, "rb");
    char buf[256];
    size_t got = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t hlen = (size_t)(uint8_t)buf[8] | (size_t)(uint8_t)buf[9] << 8;
    assert_int_equal((10 + hlen) % 64, 0);
    assert_int_equal(got, 10 + hlen + sizeof ids);
    buf[10 + hlen - 1] = 0;
    assert_non_null(strstr(buf + 10, "'descr': '<i4'"));
    assert_non_null(strstr(buf + 10, "'shape': (2, 3)"));
    assert_memory_equal(buf + 10 + hlen, ids, sizeof ids);
    float x[6] = {0.5f, -1, 2, 3, 4, 5};
    assert_int_equal(nx_npy_begin(p, "<f4", 2, shape, &f, &e), NX_OK);
    assert_int_equal(fwrite(x, 4, 6, f), 6);
    assert_int_equal(fclose(f), 0);
    float *y = NULL;
    int nd = 0;
    int64_t ys[NX_NPY_MAX_DIMS];
    assert_int_equal(nx_npy_read_f32(p, &y, &nd, ys, &e), NX_OK);
    assert_int_equal(nd, 2);
    assert_memory_equal(x, y, sizeof x);
    free(y);
    int64_t bad[1] = {-1};
    assert_int_equal(nx_npy_begin(p, "<i4", 1, bad, &f, &e), NX_E_ARG);
    assert_null(f);
    free(p);
    tmpdir_free(dir);
}

static void test_roundtrip(void **state) {
    (void)state;
    char *dir = tmpdir_new();
    int64_t s3[3] = {2, 3, 4}, s1[1] = {7}, s2[2] = {5, 1}, s0[2] = {0, 3}, big[1] = {100000};
    roundtrip(dir, 3, s3);
    roundtrip(dir, 1, s1);
    roundtrip(dir, 2, s2);
    roundtrip(dir, 0, NULL);
    roundtrip(dir, 2, s0);
    roundtrip(dir, 1, big);
    int64_t s8[8] = {1, 2, 1, 2, 1, 2, 1, 2};
    roundtrip(dir, 8, s8);
    tmpdir_free(dir);
}

/* Writes a file: magic + version + header dict (padded as given) + n data floats. */
static void write_npy(const char *dir, int version, const char *dict, size_t n_floats) {
    size_t dl = strlen(dict), hoff = version == 1 ? 10 : 12;
    size_t len = hoff + dl + n_floats * 4;
    uint8_t *b = calloc(1, len);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (uint8_t)version;
    if (version == 1) {
        b[8] = (uint8_t)dl;
        b[9] = (uint8_t)(dl >> 8);
    } else {
        for (int i = 0; i < 4; i++) b[8 + i] = (uint8_t)(dl >> (8 * i));
    }
    memcpy(b + hoff, dict, dl);
    write_bytes(dir, "t.npy", b, len);
    free(b);
}

static nx_status read_t(const char *dir, nx_error *e, int *nd, int64_t *shape) {
    char *p = path_in(dir, "t.npy");
    float *d = NULL;
    nx_status st = nx_npy_read_f32(p, &d, nd, shape, e);
    if (st != NX_OK) assert_null(d);
    free(d);
    free(p);
    return st;
}

static void expect_read(const char *dir, int version, const char *dict, size_t n, nx_status want,
                        const char *msg) {
    write_npy(dir, version, dict, n);
    nx_error e;
    int nd;
    int64_t shape[NX_NPY_MAX_DIMS];
    nx_status st = read_t(dir, &e, &nd, shape);
    if (st != want || (want != NX_OK && msg && !strstr(e.msg, msg))) {
        print_error("dict %s: status %d (want %d): %s\n", dict, st, want, st ? e.msg : "");
        fail();
    }
}

static void test_headers(void **state) {
    (void)state;
    char *dir = tmpdir_new();
    /* numpy's own spellings, any key order, versions 2 and 3, Python-2 long suffixes */
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }      \n", 6, NX_OK, NULL);
    expect_read(dir, 2, "{'shape': (4,), 'fortran_order': False, 'descr': '<f4'}\n", 4, NX_OK, NULL);
    expect_read(dir, 3, "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": ()}\n", 1, NX_OK, NULL);
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }\n", 6, NX_OK, NULL);
    /* rejections */
    expect_read(dir, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n", 4, NX_E_UNSUPPORTED, "<f8");
    expect_read(dir, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", 2, NX_E_UNSUPPORTED, ">f4");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n", 4, NX_E_UNSUPPORTED, "Fortran");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 5, NX_E_FORMAT, "shape needs");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 7, NX_E_FORMAT, "shape needs");
    expect_read(dir, 1, "{'descr': '<f4', 'shape': (2,), }\n", 2, NX_E_FORMAT, "lacks");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}\n", 2, NX_E_FORMAT, "'x'");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", 2, NX_E_FORMAT, "shape");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,3\n", 6, NX_E_FORMAT, "shape");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n", 1,
                NX_E_FORMAT, "shape");
    expect_read(dir, 1,
                "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }\n", 0,
                NX_E_FORMAT, "overflows");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", 0,
                NX_E_FORMAT, "shape");
    expect_read(dir, 1, "['descr', '<f4']\n", 0, NX_E_FORMAT, "dict");
    expect_read(dir, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} trailing\n", 1, NX_E_FORMAT,
                "trailing");
    expect_read(dir, 7, "{}", 0, NX_E_UNSUPPORTED, "version");

    nx_error e;
    int nd;
    int64_t shape[NX_NPY_MAX_DIMS];
    write_bytes(dir, "t.npy", "\x93NUMPX\x01\x00\x00\x00", 10);
    assert_int_equal(read_t(dir, &e, &nd, shape), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "magic"));
    /* header length beyond the file */
    write_bytes(dir, "t.npy", "\x93NUMPY\x01\x00\xff\x00{}", 12);
    assert_int_equal(read_t(dir, &e, &nd, shape), NX_E_FORMAT);
    assert_non_null(strstr(e.msg, "truncated"));
    write_bytes(dir, "t.npy", "\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12);
    assert_int_equal(read_t(dir, &e, &nd, shape), NX_E_FORMAT);
    write_bytes(dir, "t.npy", "\x93NU", 3);
    assert_int_equal(read_t(dir, &e, &nd, shape), NX_E_FORMAT);
    char *p = path_in(dir, "missing.npy");
    float *d;
    assert_int_equal(nx_npy_read_f32(p, &d, &nd, shape, &e), NX_E_IO);
    assert_non_null(strstr(e.msg, "missing.npy"));
    /* writer argument checks */
    float x = 1;
    int64_t neg[1] = {-1};
    assert_int_equal(nx_npy_write_f32(p, &x, 9, neg, &e), NX_E_ARG);
    assert_int_equal(nx_npy_write_f32(p, &x, 1, neg, &e), NX_E_ARG);
    assert_int_equal(nx_npy_write_f32("/nonexistent/dir/x.npy", &x, 0, NULL, &e), NX_E_IO);
    free(p);
    tmpdir_free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_begin),
        cmocka_unit_test(test_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

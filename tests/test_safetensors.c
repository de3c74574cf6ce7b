/* test_safetensors.c: .safetensors write -> read round trip, every malformed-header refusal (a
 * negative code and a message naming the file/tensor, never a crash), sharded folders with
 * model.safetensors.index.json, and special files (FIFOs, devices, symlink loops) in their place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "model/safetensors.h"

#define ASSERT_ERR(expr, code, needle)                                                             \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != (code) || !strstr(cvllm_last_error(), (needle)))                                \
            fail_msg("expected %d containing \"%s\", got %d: %s", (code), (needle), rc_,           \
                     cvllm_last_error());                                                          \
    } while (0)

static char *g_dir;

static int setup(void **state) {
    (void)state;
    char tmpl[] = "/tmp/cvllm_test_st_XXXXXX";
    g_dir = xstrdup(mkdtemp(tmpl));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    DIR *d = opendir(g_dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = path_join(g_dir, e->d_name);
        unlink(p);
        free(p);
    }
    if (d) closedir(d);
    rmdir(g_dir);
    free(g_dir);
    return 0;
}

static char *tmp_path(const char *name) { return path_join(g_dir, name); }

/* A raw file: 8-byte length, header text as given (no padding), then data_len bytes of 0x11. */
static uint8_t *raw_image(const char *header, size_t data_len, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *b = xmalloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, 0x11, data_len);
    return b;
}

static void write_bytes(const char *path, const void *b, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
}

/* Opens a raw image both from a file and from memory; both must give code and message. */
static void expect_raw(const char *header, size_t data_len, int code, const char *needle) {
    size_t len;
    uint8_t *b = raw_image(header, data_len, &len);
    SafeTensors *st = (SafeTensors *)1;
    ASSERT_ERR(safetensors_open_buffer(b, len, &st), code, needle);
    assert_null(st);
    char *p = tmp_path("raw.safetensors");
    write_bytes(p, b, len);
    ASSERT_ERR(safetensors_open_file(p, &st), code, needle);
    assert_null(st);
    assert_non_null(strstr(cvllm_last_error(), p)); /* the file is named */
    free(p);
    free(b);
}

static void test_round_trip(void **state) {
    (void)state;
    float a[6] = {1, -2, 3.5f, 4, 5, 6};
    uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};
    uint16_t bf[3] = {0x3f80, 0x4000, 0xbf80};
    float c3[24];
    for (int i = 0; i < 24; i++) c3[i] = (float)i * 0.25f;
    StTensor t[5] = {
        {.name = "a.weight", .dtype = DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "h", .dtype = DTYPE_F16, .ndim = 1, .shape = {4}, .data = h},
        {.name = "b \"quoted\" name", .dtype = DTYPE_BF16, .ndim = 1, .shape = {3}, .data = bf},
        {.name = "c3", .dtype = DTYPE_F32, .ndim = 3, .shape = {2, 3, 4}, .data = c3},
        {.name = "empty", .dtype = DTYPE_F32, .ndim = 2, .shape = {0, 7}, .data = NULL},
    };
    char *p = tmp_path("rt.safetensors");
    assert_int_equal(safetensors_write(p, t, 5), 0);

    /* header: 8-byte aligned, space-padded, __metadata__ format pt */
    size_t len;
    char *bytes = read_file(p, &len);
    assert_non_null(bytes);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (uint8_t)bytes[i];
    assert_int_equal(hlen % 8, 0);
    assert_int_equal(len, 8 + hlen + 24 + 8 + 6 + 96);
    assert_non_null(strstr(bytes + 8, "\"__metadata__\":{\"format\":\"pt\"}"));

    SafeTensors *st;
    assert_int_equal(safetensors_open_file(p, &st), 0);
    assert_int_equal(safetensors_count(st), 5);
    const StTensor *x = safetensors_find(st, "a.weight");
    assert_non_null(x);
    assert_int_equal(x->dtype, DTYPE_F32);
    assert_int_equal(x->ndim, 2);
    assert_int_equal(x->shape[0], 2);
    assert_int_equal(x->shape[1], 3);
    assert_int_equal(x->nbytes, 24);
    assert_memory_equal(x->data, a, 24);
    assert_int_equal((uintptr_t)x->data % 4, 0);
    x = safetensors_find(st, "h");
    assert_int_equal(x->dtype, DTYPE_F16);
    assert_memory_equal(x->data, h, 8);
    x = safetensors_find(st, "b \"quoted\" name");
    assert_non_null(x);
    assert_int_equal(x->dtype, DTYPE_BF16);
    assert_memory_equal(x->data, bf, 6);
    x = safetensors_find(st, "c3");
    assert_int_equal(x->ndim, 3);
    assert_int_equal(x->shape[2], 4);
    assert_memory_equal(x->data, c3, sizeof c3);
    x = safetensors_find(st, "empty");
    assert_int_equal(x->nbytes, 0);
    assert_null(safetensors_find(st, "nope"));
    for (int i = 1; i < safetensors_count(st); i++) /* sorted by name */
        assert_true(strcmp(safetensors_at(st, i - 1)->name, safetensors_at(st, i)->name) < 0);
    safetensors_close(st);

    /* the same bytes from memory */
    assert_int_equal(safetensors_open_buffer(bytes, len, &st), 0);
    assert_int_equal(safetensors_count(st), 5);
    assert_memory_equal(safetensors_find(st, "c3")->data, c3, sizeof c3);
    safetensors_close(st);
    safetensors_close(NULL);
    free(bytes);
    free(p);
}

static void test_streaming_writer(void **state) {
    (void)state;
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    StTensor spec[2] = {{.name = "x", .dtype = DTYPE_F32, .ndim = 1, .shape = {5}},
                        {.name = "y", .dtype = DTYPE_F32, .ndim = 1, .shape = {3}}};
    char *p = tmp_path("stream.safetensors");
    StWriter *w;
    assert_int_equal(safetensors_writer_begin(p, spec, 2, &w), 0);
    assert_int_equal(safetensors_writer_append(w, v, 12), 0);
    assert_int_equal(safetensors_writer_append(w, v + 3, 8), 0);
    assert_int_equal(safetensors_writer_append(w, v + 5, 12), 0);
    assert_int_equal(safetensors_writer_finish(w), 0);
    SafeTensors *st;
    assert_int_equal(safetensors_open_file(p, &st), 0);
    assert_memory_equal(safetensors_find(st, "y")->data, v + 5, 12);
    safetensors_close(st);
    /* finishing short is an error */
    assert_int_equal(safetensors_writer_begin(p, spec, 2, &w), 0);
    assert_int_equal(safetensors_writer_append(w, v, 12), 0);
    ASSERT_ERR(safetensors_writer_finish(w), CVLLM_EINVAL, "12 of 32 data bytes");
    /* unwritable path */
    ASSERT_ERR(safetensors_writer_begin("/nonexistent/dir/x.safetensors", spec, 2, &w), CVLLM_EIO,
               "cannot create");
    free(p);
}

static void test_truncated(void **state) {
    (void)state;
    float a[64] = {0};
    StTensor t = {.name = "w", .dtype = DTYPE_F32, .ndim = 2, .shape = {8, 8}, .data = a};
    char *p = tmp_path("trunc.safetensors");
    assert_int_equal(safetensors_write(p, &t, 1), 0);
    assert_int_equal(truncate(p, 8 + 64 + 100), 0); /* data area cut short */
    SafeTensors *st = NULL;
    ASSERT_ERR(safetensors_open_file(p, &st), CVLLM_EFORMAT, "tensor w: data_offsets [0, 256] run past");
    assert_int_equal(truncate(p, 20), 0); /* header cut short */
    ASSERT_ERR(safetensors_open_file(p, &st), CVLLM_EFORMAT, "header length");
    assert_int_equal(truncate(p, 5), 0);
    ASSERT_ERR(safetensors_open_file(p, &st), CVLLM_EFORMAT, "too short");
    assert_int_equal(truncate(p, 0), 0);
    ASSERT_ERR(safetensors_open_file(p, &st), CVLLM_EFORMAT, "too short");
    ASSERT_ERR(safetensors_open_buffer(NULL, 0, &st), CVLLM_EFORMAT, "too short");
    ASSERT_ERR(safetensors_open_file("/nonexistent.safetensors", &st), CVLLM_EIO,
               "/nonexistent.safetensors: No such file or directory");
    ASSERT_ERR(safetensors_open_file("/tmp", &st), CVLLM_EIO, "not a regular file");
    free(p);
}

static void test_header_length_past_eof(void **state) {
    (void)state;
    uint8_t b[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    SafeTensors *st;
    ASSERT_ERR(safetensors_open_buffer(b, sizeof b, &st), CVLLM_EFORMAT,
               "header length 18446744073709551615 runs past the end of the file (16 bytes)");
    b[0] = 9, memset(b + 1, 0, 7);
    ASSERT_ERR(safetensors_open_buffer(b, sizeof b, &st), CVLLM_EFORMAT, "runs past");
}

static void test_bad_headers(void **state) {
    (void)state;
    expect_raw("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]", 4,
               CVLLM_EFORMAT, "header is not valid JSON");
    expect_raw("[1, 2, 3]", 0, CVLLM_EFORMAT, "header is not a JSON object");
    expect_raw("{\"a\": {\"dtype\": \"F32\", \"shape\": [1, 99999999999999999999], \"data_offsets\": [0, 4]}}",
               4, CVLLM_EFORMAT, "header: shape[1] (99999999999999999999) is out of range");
    expect_raw("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
               "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
               8, CVLLM_EFORMAT, "not valid JSON");
    expect_raw("{\"__metadata__\": [1]}", 0, CVLLM_EFORMAT, "__metadata__ is not an object");
    expect_raw("{\"t\": 5}", 0, CVLLM_EFORMAT, "tensor t: entry is not an object");
    expect_raw("{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, CVLLM_EFORMAT,
               "tensor t: needs dtype");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4,
               CVLLM_EFORMAT, "tensor t: needs dtype");
    /* dtypes */
    expect_raw("{\"ids\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8,
               CVLLM_EUNSUPPORTED, "tensor ids: dtype I64 is not supported");
    expect_raw("{\"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4,
               CVLLM_EUNSUPPORTED, "dtype F8_E4M3");
    /* shapes */
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24,
               CVLLM_EFORMAT, "tensor t: shape [2, 3] of F32 needs 24 bytes, data_offsets give 20");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
               CVLLM_EFORMAT, "shape[0] is not a non-negative integer");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
               CVLLM_EFORMAT, "shape[0]");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4,
               CVLLM_EUNSUPPORTED, "5 dimensions");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4611686018427387904], "
               "\"data_offsets\": [0, 0]}}",
               0, CVLLM_EFORMAT, "overflows");
    expect_raw("{\"t\": {\"dtype\": \"BF16\", \"shape\": [9223372036854775807, 2], "
               "\"data_offsets\": [0, 0]}}",
               0, CVLLM_EFORMAT, "overflows");
    /* offsets */
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4,
               CVLLM_EFORMAT, "tensor t: data_offsets [0, 8] run past the data area (4 bytes)");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8,
               CVLLM_EFORMAT, "begin <= end");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 8,
               CVLLM_EFORMAT, "data_offsets");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8,
               CVLLM_EFORMAT, "data_offsets");
    expect_raw("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", 4]}}", 8,
               CVLLM_EFORMAT, "data_offsets");
    /* overlaps */
    expect_raw("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
               "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
               12, CVLLM_EFORMAT, "tensors a and b overlap");
    expect_raw("{\"big\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}, "
               "\"in\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [8, 12]}}",
               16, CVLLM_EFORMAT, "overlap");
    expect_raw("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
               "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
               4, CVLLM_EFORMAT, "overlap");
}

static void test_odd_but_valid(void **state) {
    (void)state;
    /* empty tensors may share an offset; holes are allowed; unpadded header -> misaligned F32 data
     * (header of odd length) is copied to an aligned buffer with the same bytes */
    const char *hdr = "{\"e1\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]}, "
                      "\"e2\": {\"dtype\": \"F32\", \"shape\": [3, 0], \"data_offsets\": [4, 4]}, "
                      "\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}";
    size_t len;
    uint8_t *b = raw_image(hdr, 16, &len);
    SafeTensors *st;
    assert_int_equal(safetensors_open_buffer(b, len, &st), 0);
    assert_int_equal(safetensors_count(st), 3);
    const StTensor *w = safetensors_find(st, "w");
    assert_int_equal((uintptr_t)w->data % 4, 0);
    assert_memory_equal(w->data, b + 8 + strlen(hdr) + 8, 8);
    safetensors_close(st);
    free(b);
    /* a header with only metadata */
    b = raw_image("{\"__metadata__\": {\"format\": \"pt\"}}", 0, &len);
    assert_int_equal(safetensors_open_buffer(b, len, &st), 0);
    assert_int_equal(safetensors_count(st), 0);
    safetensors_close(st);
    free(b);
}

/* ---- sharded folders ---- */

static void write_text(const char *name, const char *text) {
    char *p = tmp_path(name);
    write_bytes(p, text, strlen(text));
    free(p);
}

static void write_shard(const char *name, const char *t1, const char *t2) {
    static float v[4] = {1, 2, 3, 4};
    StTensor t[2] = {{.name = (char *)t1, .dtype = DTYPE_F32, .ndim = 1, .shape = {2}, .data = v},
                     {.name = (char *)t2, .dtype = DTYPE_F32, .ndim = 1, .shape = {2}, .data = v + 2}};
    char *p = tmp_path(name);
    assert_int_equal(safetensors_write(p, t, t2 ? 2 : 1), 0);
    free(p);
}

static void test_sharded(void **state) {
    (void)state;
    SafeTensors *st = NULL;
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EIO, "no model.safetensors");
    write_shard("model-00001-of-00002.safetensors", "a", "b");
    write_shard("model-00002-of-00002.safetensors", "c", NULL);
    write_text("model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {"
               "\"a\": \"model-00001-of-00002.safetensors\", "
               "\"b\": \"model-00001-of-00002.safetensors\", "
               "\"c\": \"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(safetensors_open(g_dir, &st), 0);
    assert_int_equal(safetensors_count(st), 3);
    const float *c = safetensors_find(st, "c")->data;
    assert_true(c[0] == 1.0f && c[1] == 2.0f);
    const float *b = safetensors_find(st, "b")->data;
    assert_true(b[0] == 3.0f);
    safetensors_close(st);

    /* a tensor mapped to a shard that does not have it */
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
               "\"c\": \"model-00001-of-00002.safetensors\"}}");
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EFORMAT,
               "model-00001-of-00002.safetensors: tensor c listed in model.safetensors.index.json "
               "is missing from that shard");
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"zz\": \"model-00002-of-00002.safetensors\"}}");
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EFORMAT, "tensor zz");
    /* a missing shard file */
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"model-00001-of-00003.safetensors\"}}");
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EIO, "model-00001-of-00003.safetensors");
    /* paths outside the folder */
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EFORMAT, "not a file in the folder");
    /* a tensor defined in two shards */
    write_shard("dup.safetensors", "c", NULL);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"c\": \"model-00002-of-00002.safetensors\", \"d\": \"dup.safetensors\"}}");
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EFORMAT, "tensor c is defined in both");
    /* malformed index */
    write_text("model.safetensors.index.json", "{\"weight_map\": [1]}");
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EFORMAT, "weight_map");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}");
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EFORMAT, "weight_map[a]");
    write_text("model.safetensors.index.json", "{oops");
    ASSERT_ERR(safetensors_open(g_dir, &st), CVLLM_EFORMAT, "invalid JSON");
    /* model.safetensors, when present, wins over the index */
    write_shard("model.safetensors", "single", NULL);
    assert_int_equal(safetensors_open(g_dir, &st), 0);
    assert_int_equal(safetensors_count(st), 1);
    assert_non_null(safetensors_find(st, "single"));
    safetensors_close(st);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_safetensors: blocked on a special file\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

/* safetensors_open(g_dir) must fail at once (an alarm catches a blocking open). */
static void expect_open_error(int code, const char *needle) {
    SafeTensors *st = (SafeTensors *)1;
    alarm(10);
    int rc = safetensors_open(g_dir, &st);
    alarm(0);
    ASSERT_ERR(rc, code, needle);
    assert_null(st);
}

/* Special files in place of the weights: refused before any read, never a hang or a huge read;
 * a symlink loop is not "absent". */
static void test_special_files(void **state) {
    (void)state;
    signal(SIGALRM, on_alarm);
    char *single = tmp_path("model.safetensors"), *index = tmp_path("model.safetensors.index.json"),
         *shard = tmp_path("shard.safetensors");
    assert_int_equal(mkfifo(single, 0644), 0);
    expect_open_error(CVLLM_EIO, "model.safetensors: a FIFO (named pipe), not a regular file");
    unlink(single);
    assert_int_equal(symlink("/dev/zero", single), 0);
    expect_open_error(CVLLM_EIO, "model.safetensors: a character device, not a regular file");
    unlink(single);
    assert_int_equal(symlink("model.safetensors", single), 0);
    expect_open_error(CVLLM_EIO, "model.safetensors: Too many levels of symbolic links");
    unlink(single);
    assert_int_equal(symlink("blobs/abc", single), 0); /* a broken Hugging Face cache link */
    expect_open_error(CVLLM_EIO, "model.safetensors: a symbolic link to a missing file");
    unlink(single);
    assert_int_equal(mkdir(single, 0755), 0);
    expect_open_error(CVLLM_EIO, "model.safetensors: a directory, not a regular file");
    rmdir(single);
    /* the index and its shards */
    assert_int_equal(mkfifo(index, 0644), 0);
    expect_open_error(CVLLM_EIO, "model.safetensors.index.json: a FIFO");
    unlink(index);
    assert_int_equal(symlink("model.safetensors.index.json", index), 0);
    expect_open_error(CVLLM_EIO, "Too many levels of symbolic links");
    unlink(index);
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"shard.safetensors\"}}");
    assert_int_equal(mkfifo(shard, 0644), 0);
    expect_open_error(CVLLM_EIO, "shard.safetensors: a FIFO");
    unlink(shard);
    assert_int_equal(symlink("/dev/urandom", shard), 0);
    expect_open_error(CVLLM_EIO, "shard.safetensors: a character device");
    unlink(shard);
    write_text("model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 184467440737095516150}, \"weight_map\": {}}");
    expect_open_error(CVLLM_EFORMAT, "total_size (184467440737095516150) is out of range");
    FILE *f = fopen(index, "wb"); /* a sparse 65 MiB index: over the cap, refused unread */
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), (off_t)65 << 20), 0);
    fclose(f);
    expect_open_error(CVLLM_EIO, "too large");
    unlink(index);
    expect_open_error(CVLLM_EIO, "no model.safetensors or model.safetensors.index.json");
    free(single), free(index), free(shard);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streaming_writer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_length_past_eof, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_odd_but_valid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_special_files, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

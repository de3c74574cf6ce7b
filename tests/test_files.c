/* test_files.c: the helpers in common.c through which every loader and every CLI input file is
 * read (file_read, file_open_regular, path_probe), the JSON parser wrapper that names what is wrong
 * (cvllm_json_parse), cvllm_error_wrap not naming a path twice, and parse_bytes. Special files
 * (FIFOs, devices, directories, symlink loops) must give an error at once: an alarm turns a
 * blocking open into a failure instead of a hang. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define ASSERT_ERR_MSG(needle)                                                                     \
    do {                                                                                           \
        if (!strstr(cvllm_last_error(), (needle)))                                                 \
            fail_msg("expected a message containing \"%s\", got: %s", (needle), cvllm_last_error()); \
    } while (0)

static char g_dir[64];

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_files: blocked on a special file\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static int setup(void **state) {
    (void)state;
    strcpy(g_dir, "/tmp/cvllm_test_files_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    signal(SIGALRM, on_alarm);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static char *path(const char *name) { return path_join(g_dir, name); }

static void write_text(const char *name, const char *text, size_t len) {
    char *p = path(name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
    free(p);
}

/* file_read must refuse p at once, with a message starting with p and containing needle. */
static void expect_refused(const char *p, size_t max, const char *needle) {
    size_t len = 12345;
    alarm(10);
    char *s = file_read(p, max, &len);
    alarm(0);
    if (s) fail_msg("%s: read %zu bytes, expected a refusal", p, len);
    ASSERT_ERR_MSG(needle);
    if (strncmp(cvllm_last_error(), p, strlen(p)) != 0)
        fail_msg("the message does not start with the path: %s", cvllm_last_error());
}

static void test_regular_files(void **state) {
    (void)state;
    write_text("a.txt", "hello\0world", 11);
    char *p = path("a.txt");
    size_t len = 0;
    char *s = file_read(p, 11, &len);
    assert_non_null(s);
    assert_int_equal(len, 11); /* NUL bytes kept, length exact */
    assert_memory_equal(s, "hello\0world", 12);
    free(s);
    expect_refused(p, 10, "too large"); /* over the cap: refused before reading */
    write_text("empty", "", 0);
    char *e = path("empty");
    s = file_read(e, 0, &len);
    assert_non_null(s);
    assert_int_equal(len, 0);
    assert_string_equal(s, "");
    free(s);
    /* a sparse file far over its cap costs nothing to refuse */
    char *big = path("big");
    int fd = open(big, O_CREAT | O_WRONLY, 0644);
    assert_true(fd >= 0 && ftruncate(fd, (off_t)5 << 20) == 0);
    close(fd);
    expect_refused(big, (size_t)4 << 20, "limit for this file is 4 MiB");
    assert_int_equal(path_probe(p), 1);
    free(p), free(e), free(big);
}

static void test_special_files(void **state) {
    (void)state;
    char *fifo = path("fifo"), *zero = path("zero"), *urandom = path("urandom"), *sub = path("sub"),
         *loop = path("loop"), *loop2 = path("loop2"), *dangling = path("dangling"),
         *missing = path("missing");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    assert_int_equal(symlink("/dev/zero", zero), 0);
    assert_int_equal(symlink("/dev/urandom", urandom), 0);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(symlink("loop2", loop), 0);
    assert_int_equal(symlink("loop", loop2), 0);
    assert_int_equal(symlink("nowhere", dangling), 0);
    expect_refused(fifo, 1 << 20, "a FIFO (named pipe), not a regular file");
    expect_refused(zero, 1 << 20, "a character device, not a regular file");
    expect_refused(urandom, 1 << 20, "a character device, not a regular file");
    expect_refused("/dev/null", 1 << 20, "not a regular file");
    expect_refused(sub, 1 << 20, "a directory, not a regular file");
    expect_refused(loop, 1 << 20, "symbolic links");
    expect_refused(dangling, 1 << 20, "a symbolic link to a missing file");
    expect_refused(missing, 1 << 20, "No such file or directory");
    alarm(10);
    assert_true(file_open_regular(fifo, 1 << 20, NULL) < 0);
    alarm(0);
    /* path_probe: absent is 0, a loop or a dangling link is an error (not "absent") */
    assert_int_equal(path_probe(missing), 0);
    char *in_missing = path("missing/x");
    assert_int_equal(path_probe(in_missing), 0);
    assert_int_equal(path_probe(fifo), 1);
    assert_int_equal(path_probe(loop), CVLLM_EIO);
    ASSERT_ERR_MSG("symbolic links");
    assert_int_equal(path_probe(dangling), CVLLM_EIO);
    ASSERT_ERR_MSG("a symbolic link to a missing file");
    /* read_file goes through the same checks */
    alarm(10);
    assert_null(read_file(fifo, NULL));
    alarm(0);
    free(fifo), free(zero), free(urandom), free(sub), free(loop), free(loop2), free(dangling);
    free(missing), free(in_missing);
}

/* cvllm_json_parse: the message for each kind of failure. */
static void expect_json_error(const char *text, const char *needle) {
    json_t *j = cvllm_json_parse(text, strlen(text), JSON_REJECT_DUPLICATES, "f.json");
    if (j) fail_msg("parsed '%s'", text);
    ASSERT_ERR_MSG(needle);
    assert_int_equal(strncmp(cvllm_last_error(), "f.json: ", 8), 0);
}

static void test_json_messages(void **state) {
    (void)state;
    json_t *j = cvllm_json_parse("{\"a\": [1, 2]}", 13, 0, "f.json");
    assert_non_null(j);
    json_decref(j);
    expect_json_error("{\"vocab_size\": 99999999999999999999}", "vocab_size (99999999999999999999) is out of range");
    expect_json_error("{\"a\": 1,\n \"b\" :\t-99999999999999999999 }", "b (-99999999999999999999) is out of range");
    expect_json_error("{\"eos\": [1, 2, 99999999999999999999]}", "eos[2] (99999999999999999999) is out of range");
    expect_json_error("{\"x\": {\"y\": [[1], \"a]\\\"[\", 1e999]}}", "y[2] (1e999) is out of range");
    expect_json_error("[7, 99999999999999999999]", "[1] (99999999999999999999) is out of range");
    expect_json_error("99999999999999999999", "the number 99999999999999999999 is out of range");
    expect_json_error("{\"k\\\"ey\": 99999999999999999999}", "k\\\"ey (");
    expect_json_error("{\"a\": \"x\\u0000y\"}", "f.json: contains a NUL character");
    expect_json_error("{\"a\\u0000\": 1}", "f.json: contains a NUL character");
    expect_json_error("{\"a\": 1,}", "invalid JSON at column");
    expect_json_error("{\n\"a\": 1,\n}", "invalid JSON at line 3 column");
    expect_json_error("{\"a\": 1, \"a\": 2}", "duplicate");
    expect_json_error("", "invalid JSON");
    /* a raw NUL byte: the same message as \u0000 */
    j = cvllm_json_parse("{\"a\": \"x\0y\"}", 12, 0, "f.json");
    assert_null(j);
    assert_string_equal(cvllm_last_error(), "f.json: contains a NUL character");
    /* with JSON_ALLOW_NUL the escape is a character like any other */
    j = cvllm_json_parse("\"x\\u0000y\"", 10, JSON_DECODE_ANY | JSON_ALLOW_NUL, "f.json");
    assert_non_null(j);
    assert_int_equal(json_string_length(j), 3);
    json_decref(j);
}

static void test_error_wrap(void **state) {
    (void)state;
    cvllm_errorf(CVLLM_EIO, "models/x/config.json: No such file or directory");
    assert_int_equal(cvllm_error_wrap(CVLLM_EIO, "%s", "models/x"), CVLLM_EIO);
    assert_string_equal(cvllm_last_error(), "models/x/config.json: No such file or directory");
    cvllm_errorf(CVLLM_EFORMAT, "models/x: config.json: bad");
    cvllm_error_wrap(CVLLM_EFORMAT, "%s", "models/x");
    assert_string_equal(cvllm_last_error(), "models/x: config.json: bad");
    cvllm_error_wrap(CVLLM_EFORMAT, "%s", "models/x/");
    assert_string_equal(cvllm_last_error(), "models/x: config.json: bad");
    cvllm_errorf(CVLLM_EFORMAT, "models/xy: bad"); /* another folder: named */
    cvllm_error_wrap(CVLLM_EFORMAT, "%s", "models/x");
    assert_string_equal(cvllm_last_error(), "models/x: models/xy: bad");
    cvllm_errorf(CVLLM_EFORMAT, "missing tensor t");
    cvllm_error_wrap(CVLLM_EFORMAT, "%s", "m");
    assert_string_equal(cvllm_last_error(), "m: missing tensor t");
}

static void test_parse_bytes(void **state) {
    (void)state;
    assert_int_equal(parse_bytes("2G"), 2LL << 30);
    assert_int_equal(parse_bytes("512MiB"), 512LL << 20);
    assert_int_equal(parse_bytes("1048576"), 1048576);
    assert_int_equal(parse_bytes("1.5k"), 1536);
    const char *bad[] = {"", "12Q", "-1", "+1", " 2G", "2G ", "nan", "inf", "0x10", "1e999", "1e30",
                         "G", ".", "1..2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (parse_bytes(bad[i]) != -1) fail_msg("parse_bytes(\"%s\") = %lld", bad[i], (long long)parse_bytes(bad[i]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regular_files), cmocka_unit_test(test_special_files),
        cmocka_unit_test(test_json_messages), cmocka_unit_test(test_error_wrap),
        cmocka_unit_test(test_parse_bytes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

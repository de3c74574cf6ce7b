/* test_tokenizer.c: the tokenizer on a tiny handcrafted byte-level BPE tokenizer.json (built here):
 * both merge forms, merges through strings missing from the vocabulary, added tokens with
 * lstrip / rstrip / single_word, ignore_merges, the NFC normalizer, decoding (skip_special, U+FFFD),
 * the streaming detokenizer on split multi-byte characters and emoji, ids past the vocabulary (decoded
 * as nothing), NUL bytes, tokenizer_config.json, the error paths (invalid UTF-8, malformed JSON,
 * unsupported model / normalizer / pre-tokenizer) and the files of a folder (special files refused).
 * Expected ids follow tokenizers.js semantics (tests/test_tokenizer_ref.sh checks the real thing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "tokenizer/tokenizer.h"

/* ---------------------------------------------------------------- building tokenizer.json */

static int byte_cp(int b) { /* GPT-2 byte -> code point */
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    if (printable) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) n++;
    return 256 + n;
}

static void put_cp(char **p, int cp) {
    if (cp == '"' || cp == '\\') *(*p)++ = '\\';
    if (cp < 0x80) *(*p)++ = (char)cp;
    else {
        *(*p)++ = (char)(0xC0 | (cp >> 6));
        *(*p)++ = (char)(0x80 | (cp & 0x3F));
    }
}

/* ids: 0..255 bytes; 256 he, 257 ll, 258 hell, 259 hello, 260 Ġw, 261 Ġwor, 262 abc;
 * merges: h e, l l, he ll, hell o, Ġ w, Ġw o (-> "Ġwo", not in vocab), Ġwo r.
 * added: 300 <s> (special), 301 [MASK] (lstrip, rstrip), 302 word (single_word), 303 <|x|> (special). */
static char *make_json(int pair_merges, const char *normalizer, const char *model_type,
                       const char *pre_tok, int ignore_merges) {
    char *buf = xmalloc(1 << 16), *p = buf;
    p += sprintf(p, "{\"version\":\"1.0\",\"normalizer\":%s,\"pre_tokenizer\":%s,"
                    "\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":["
                    "{\"id\":300,\"content\":\"<s>\",\"special\":true},"
                    "{\"id\":301,\"content\":\"[MASK]\",\"lstrip\":true,\"rstrip\":true,\"special\":false,\"normalized\":false},"
                    "{\"id\":302,\"content\":\"word\",\"single_word\":true,\"special\":false,\"normalized\":false},"
                    "{\"id\":303,\"content\":\"<|x|>\",\"special\":true,\"normalized\":false}],"
                    "\"model\":{\"type\":\"%s\",\"ignore_merges\":%s,\"vocab\":{",
                 normalizer, pre_tok, model_type, ignore_merges ? "true" : "false");
    for (int b = 0; b < 256; b++) {
        *p++ = '"';
        put_cp(&p, byte_cp(b));
        p += sprintf(p, "\":%d,", b);
    }
    p += sprintf(p, "\"he\":256,\"ll\":257,\"hell\":258,\"hello\":259,\"\xc4\xa0w\":260,"
                    "\"\xc4\xa0wor\":261,\"abc\":262},\"merges\":");
    if (pair_merges)
        p += sprintf(p, "[[\"h\",\"e\"],[\"l\",\"l\"],[\"he\",\"ll\"],[\"hell\",\"o\"],[\"\xc4\xa0\",\"w\"],"
                        "[\"\xc4\xa0w\",\"o\"],[\"\xc4\xa0wo\",\"r\"]]}}");
    else
        p += sprintf(p, "[\"h e\",\"l l\",\"he ll\",\"hell o\",\"\xc4\xa0 w\",\"\xc4\xa0w o\","
                        "\"\xc4\xa0wo r\"]}}");
    return buf;
}

#define BL_REGEX "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"

static Tokenizer *load(int pair_merges, const char *normalizer, int ignore_merges, const char *cfg) {
    char *j = make_json(pair_merges, normalizer, "BPE", BL_REGEX, ignore_merges);
    Tokenizer *t = NULL;
    int rc = tokenizer_load_from_strings(j, strlen(j), cfg, &t);
    if (rc < 0) fprintf(stderr, "load failed: %s\n", cvllm_last_error());
    assert_int_equal(rc, 0);
    free(j);
    return t;
}

static void expect_ids(const Tokenizer *t, const char *text, const int32_t *want, int n) {
    int32_t *ids;
    int got = tokenizer_encode(t, text, strlen(text), &ids);
    if (got != n || (n > 0 && memcmp(ids, want, (size_t)n * sizeof(int32_t)) != 0)) {
        fprintf(stderr, "encode(\"%s\"): got", text);
        for (int i = 0; i < got; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
        fputc('\n', stderr);
        fail();
    }
    free(ids);
}
#define EXPECT(t, text, ...)                                                                       \
    do {                                                                                           \
        const int32_t w_[] = {__VA_ARGS__};                                                        \
        expect_ids(t, text, w_, (int)(sizeof(w_) / sizeof(w_[0])));                                \
    } while (0)

#define G 32 /* the id of byte ' ' (Ġ) */

/* ---------------------------------------------------------------- tests */

static void test_bpe_both_merge_forms(void **state) {
    (void)state;
    for (int form = 0; form < 2; form++) {
        Tokenizer *t = load(form, "null", 0, NULL);
        EXPECT(t, "hello", 259);
        EXPECT(t, "hello hello", 259, G, 259); /* "Ġhello": Ġ + hello, no merge joins them */
        EXPECT(t, "hell", 258);
        EXPECT(t, "helo", 256, 'l', 'o');
        EXPECT(t, " wor", 261);     /* through "Ġwo", which is not in the vocab */
        expect_ids(t, " wo", NULL, 0); /* "Ġwo" has no id and there is no unk: dropped, as in HF */
        EXPECT(t, "abc", 'a', 'b', 'c'); /* in the vocab, but no merges lead there */
        expect_ids(t, "", NULL, 0);
        assert_int_equal(tokenizer_vocab_size(t), 304);
        assert_int_equal(tokenizer_token_to_id(t, "hello"), 259);
        assert_int_equal(tokenizer_token_to_id(t, "\xc4\xa0wo"), -1);
        assert_string_equal(tokenizer_id_to_token(t, 258), "hell");
        assert_null(tokenizer_id_to_token(t, 280)); /* a hole */
        assert_null(tokenizer_id_to_token(t, 304));
        tokenizer_free(t);
    }
}

static void test_ignore_merges(void **state) {
    (void)state;
    Tokenizer *t = load(0, "null", 1, NULL);
    EXPECT(t, "abc", 262);
    EXPECT(t, "hello", 259);
    EXPECT(t, "abd", 'a', 'b', 'd');
    tokenizer_free(t);
}

static void test_added_tokens(void **state) {
    (void)state;
    Tokenizer *t = load(0, "null", 0, NULL);
    EXPECT(t, "hello<s>hello", 259, 300, 259);
    EXPECT(t, "<s><s>", 300, 300);
    EXPECT(t, "<s", '<', 's');
    EXPECT(t, "a  [MASK]  b", 'a', 301, 'b'); /* lstrip + rstrip eat the spaces */
    EXPECT(t, "a\t\n[MASK]\xc2\xa0" "b", 'a', 301, 'b');
    EXPECT(t, "a word b", 'a', G, 302, G, 'b');
    EXPECT(t, "word", 302);
    EXPECT(t, "swordfish", 's', 'w', 'o', 'r', 'd', 'f', 'i', 's', 'h'); /* single_word */
    EXPECT(t, "<|x|>hello", 303, 259);
    assert_true(tokenizer_is_special(t, 300));
    assert_false(tokenizer_is_special(t, 301));
    tokenizer_free(t);
}

static void test_nfc_normalizer(void **state) {
    (void)state;
    Tokenizer *t = load(0, "{\"type\":\"NFC\"}", 0, NULL);
    EXPECT(t, "e\xcc\x81", 0xC3, 0xA9); /* e + U+0301 -> U+00E9 -> bytes C3 A9 */
    EXPECT(t, "\xc3\xa9", 0xC3, 0xA9);
    tokenizer_free(t);
    t = load(0, "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFD\"}]}", 0, NULL);
    EXPECT(t, "\xc3\xa9", 'e', 0xCC, 0x81);
    tokenizer_free(t);
}

static void test_decode(void **state) {
    (void)state;
    Tokenizer *t = load(0, "null", 0, "{\"clean_up_tokenization_spaces\": false}");
    const int32_t ids[] = {259, G, 300, 0xC3, 0xA9, 301};
    char *s = tokenizer_decode(t, ids, 6, 0);
    assert_string_equal(s, "hello <s>\xc3\xa9[MASK]");
    free(s);
    s = tokenizer_decode(t, ids, 6, 1);
    assert_string_equal(s, "hello \xc3\xa9[MASK]"); /* [MASK] is not special */
    free(s);
    const int32_t bad[] = {0xC3, 300, 0xFF, 'a'}; /* cut sequence, invalid byte -> U+FFFD */
    s = tokenizer_decode(t, bad, 4, 0);
    assert_string_equal(s, "\xef\xbf\xbd<s>\xef\xbf\xbd" "a");
    free(s);
    /* ids past the tokenizer's vocabulary (a model's padding ids) decode as nothing, as in HF, and
     * do not cut a character in two; negative ids are errors */
    const int32_t past[] = {'a', 304, 0xC3, 5000, INT32_MAX, 0xA9, 303, 100000};
    s = tokenizer_decode(t, past, 8, 0);
    assert_string_equal(s, "a\xc3\xa9<|x|>");
    free(s);
    s = tokenizer_decode(t, past + 1, 1, 1);
    assert_string_equal(s, "");
    free(s);
    const int32_t negative[] = {1, -1};
    assert_null(tokenizer_decode(t, negative, 2, 0));
    assert_non_null(strstr(cvllm_last_error(), "-1"));
    const int32_t very_negative[] = {INT32_MIN};
    assert_null(tokenizer_decode(t, very_negative, 1, 1));
    tokenizer_free(t);
    /* clean_up_tokenization_spaces defaults to true, as in tokenizers.js */
    t = load(0, "null", 0, NULL);
    const int32_t sp[] = {'a', G, '.', G, '?'};
    s = tokenizer_decode(t, sp, 5, 0);
    assert_string_equal(s, "a.?");
    free(s);
    tokenizer_free(t);
}

/* Every piece the stream returns must be valid UTF-8 and the pieces must add up to decode(). */
static void check_stream(const Tokenizer *t, const char *text) {
    int32_t *ids;
    int n = tokenizer_encode(t, text, strlen(text), &ids);
    assert_true(n > 0);
    DetokStream *ds = detok_stream_create(t, 0);
    char all[4096] = "";
    for (int i = 0; i < n; i++) {
        char *piece = detok_stream_push(ds, ids[i]);
        assert_non_null(piece);
        int32_t *tmp;
        int k = tokenizer_encode(t, piece, strlen(piece), &tmp); /* fails on invalid UTF-8 */
        assert_true(k >= 0);
        free(tmp);
        strcat(all, piece);
        free(piece);
    }
    char *rest = detok_stream_flush(ds);
    assert_string_equal(rest, "");
    free(rest);
    char *whole = tokenizer_decode(t, ids, n, 0);
    assert_string_equal(all, whole);
    assert_string_equal(all, text);
    free(whole);
    free(ids);
    detok_stream_free(ds);
}

static void test_stream(void **state) {
    (void)state;
    Tokenizer *t = load(0, "null", 0, "{\"clean_up_tokenization_spaces\": false}");
    check_stream(t, "h\xc3\xa9llo w\xc3\xb6rld");
    check_stream(t, "\xe4\xbd\xa0\xe5\xa5\xbd<s>\xf0\x9f\xa4\x97!");          /* CJK, emoji */
    check_stream(t, "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd"); /* ZWJ, skin tone */
    /* an emoji cut short: held back, then U+FFFD at flush */
    DetokStream *ds = detok_stream_create(t, 0);
    const int32_t part[] = {0xF0, 0x9F, 0xA4};
    for (int i = 0; i < 3; i++) {
        char *p = detok_stream_push(ds, part[i]);
        assert_string_equal(p, "");
        free(p);
    }
    char *p = detok_stream_flush(ds);
    assert_string_equal(p, "\xef\xbf\xbd");
    free(p);
    /* an invalid byte inside is replaced at once; an added token cuts the pending bytes */
    p = detok_stream_push(ds, 0xC3);
    assert_string_equal(p, "");
    free(p);
    p = detok_stream_push(ds, 300);
    assert_string_equal(p, "\xef\xbf\xbd<s>");
    free(p);
    p = detok_stream_push(ds, 0xFF);
    assert_string_equal(p, "\xef\xbf\xbd");
    free(p);
    assert_null(detok_stream_push(ds, -1));
    /* a padding id (past the vocabulary) gives "" and keeps the pending bytes */
    p = detok_stream_push(ds, 0xC3);
    assert_string_equal(p, "");
    free(p);
    const int32_t pads[] = {304, 5000, INT32_MAX};
    for (int i = 0; i < 3; i++) {
        p = detok_stream_push(ds, pads[i]);
        assert_string_equal(p, "");
        free(p);
    }
    p = detok_stream_push(ds, 0xA9);
    assert_string_equal(p, "\xc3\xa9");
    free(p);
    detok_stream_free(ds);
    /* skip_special */
    ds = detok_stream_create(t, 1);
    p = detok_stream_push(ds, 300);
    assert_string_equal(p, "");
    free(p);
    detok_stream_free(ds);
    tokenizer_free(t);
}

/* NUL bytes are text like any other to the tokenizer (the command line refuses them earlier). */
static void test_nul_bytes(void **state) {
    (void)state;
    Tokenizer *t = load(0, "null", 0, "{\"clean_up_tokenization_spaces\": false}");
    int32_t *ids;
    int n = tokenizer_encode(t, "a\0hello\0", 8, &ids);
    const int32_t want[] = {'a', 0, 259, 0};
    assert_int_equal(n, 4);
    assert_memory_equal(ids, want, sizeof want);
    size_t len;
    char *s = tokenizer_decode_len(t, ids, n, 0, &len);
    assert_int_equal(len, 8);
    assert_memory_equal(s, "a\0hello\0", 8);
    free(s);
    free(ids);
    tokenizer_free(t);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    Tokenizer *t = load(0, "null", 0, NULL);
    const char *bad[] = {"\xff", "ab\xe2\x82", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80", "\x80", "a\xc3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int32_t *ids = (int32_t *)1;
        assert_int_equal(tokenizer_encode(t, bad[i], strlen(bad[i]), &ids), CVLLM_EINVAL);
        assert_null(ids);
        assert_non_null(strstr(cvllm_last_error(), "not valid UTF-8"));
    }
    tokenizer_free(t);
}

static void expect_load_error(const char *json, int code, const char *msg_part) {
    Tokenizer *t = (Tokenizer *)1;
    int rc = tokenizer_load_from_strings(json, strlen(json), NULL, &t);
    if (rc != code || !strstr(cvllm_last_error(), msg_part))
        fprintf(stderr, "rc %d, message: %s\n", rc, cvllm_last_error());
    assert_int_equal(rc, code);
    assert_null(t);
    assert_non_null(strstr(cvllm_last_error(), msg_part));
}

static void test_load_errors(void **state) {
    (void)state;
    expect_load_error("{", CVLLM_EFORMAT, "invalid JSON");
    expect_load_error("", CVLLM_EFORMAT, "invalid JSON");
    expect_load_error("[1,2]", CVLLM_EFORMAT, "");
    expect_load_error("{\"model\": 3}", CVLLM_EFORMAT, "model");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]", CVLLM_EFORMAT, "invalid JSON");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", CVLLM_EFORMAT, "bad id");
    expect_load_error("{\"added_tokens\": [{\"id\": 99999999999999999999, \"content\": \"x\"}], \"model\": {}}",
                      CVLLM_EFORMAT, "tokenizer.json: added_tokens: id (99999999999999999999) is out of range");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", CVLLM_EFORMAT, "no space");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}", CVLLM_EFORMAT, "pair");
    char *j = make_json(0, "null", "WordPiece", BL_REGEX, 0);
    expect_load_error(j, CVLLM_EUNSUPPORTED, "WordPiece");
    free(j);
    j = make_json(0, "{\"type\":\"Lowercase\"}", "BPE", BL_REGEX, 0);
    expect_load_error(j, CVLLM_EUNSUPPORTED, "Lowercase");
    free(j);
    j = make_json(0, "null", "BPE", "{\"type\":\"Whitespace\"}", 0);
    expect_load_error(j, CVLLM_EUNSUPPORTED, "Whitespace");
    free(j);
    j = make_json(0, "null", "BPE",
                  "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\"}", 0);
    expect_load_error(j, CVLLM_EUNSUPPORTED, "regex");
    free(j);
    /* missing folder */
    Tokenizer *t;
    assert_int_equal(tokenizer_load("/nonexistent/dir", &t), CVLLM_EIO);
    assert_null(t);
}

/* ---------------------------------------------------------------- files of a tokenizer folder */

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_tokenizer: tokenizer_load blocked on a special file\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* tokenizer_load(dir) must fail at once with code and a message naming dir once and saying why. */
static void expect_dir_error(const char *dir, int code, const char *why) {
    Tokenizer *t = (Tokenizer *)1;
    alarm(10);
    int rc = tokenizer_load(dir, &t);
    alarm(0);
    if (rc != code || !strstr(cvllm_last_error(), why) || count(cvllm_last_error(), dir) != 1)
        fail_msg("expected %d with \"%s\" naming %s once, got %d: %s", code, why, dir, rc,
                 cvllm_last_error());
    assert_null(t);
}

static void test_load_files(void **state) {
    (void)state;
    char dir[] = "/tmp/cvllm_test_tok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    signal(SIGALRM, on_alarm);
    char *tj = path_join(dir, "tokenizer.json"), *tc = path_join(dir, "tokenizer_config.json"),
         *ct = path_join(dir, "chat_template.jinja"), *json = make_json(0, "null", "BPE", BL_REGEX, 0);
    FILE *f = fopen(tj, "wb");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    Tokenizer *t;
    assert_int_equal(tokenizer_load(dir, &t), 0);
    assert_null(tokenizer_chat_template(t));
    tokenizer_free(t);
    /* the optional files: absent is fine; anything but a regular file is an error, never a hang */
    const char *optional[] = {tc, ct};
    for (int i = 0; i < 2; i++) {
        const char *p = optional[i];
        assert_int_equal(mkfifo(p, 0644), 0);
        expect_dir_error(dir, CVLLM_EIO, "a FIFO (named pipe), not a regular file");
        unlink(p);
        assert_int_equal(symlink("/dev/zero", p), 0);
        expect_dir_error(dir, CVLLM_EIO, "a character device");
        unlink(p);
        assert_int_equal(symlink(p, p), 0); /* a loop */
        expect_dir_error(dir, CVLLM_EIO, "symbolic links");
        unlink(p);
        assert_int_equal(symlink("nowhere", p), 0);
        expect_dir_error(dir, CVLLM_EIO, "a symbolic link to a missing file");
        unlink(p);
        assert_int_equal(mkdir(p, 0755), 0);
        expect_dir_error(dir, CVLLM_EIO, "a directory");
        rmdir(p);
    }
    /* a chat template with a NUL byte would be cut there: refused */
    f = fopen(ct, "wb");
    fwrite("{{ x }}\0{{ y }}", 1, 15, f);
    fclose(f);
    expect_dir_error(dir, CVLLM_EFORMAT, "contains a NUL character");
    unlink(ct);
    /* tokenizer_config.json: numbers out of range are named */
    f = fopen(tc, "wb");
    fputs("{\"model_max_length\": 1000000000000000019884624838656}", f);
    fclose(f);
    expect_dir_error(dir, CVLLM_EFORMAT, "model_max_length (1000000000000000019884624838656) is out of range");
    unlink(tc);
    /* tokenizer.json itself */
    unlink(tj);
    expect_dir_error(dir, CVLLM_EIO, "No such file or directory");
    assert_int_equal(symlink("/dev/urandom", tj), 0);
    expect_dir_error(dir, CVLLM_EIO, "a character device");
    unlink(tj);
    assert_int_equal(mkfifo(tj, 0644), 0);
    expect_dir_error(dir, CVLLM_EIO, "a FIFO");
    unlink(tj);
    f = fopen(tj, "wb");
    fputs("{\"model\": 3}", f);
    fclose(f);
    expect_dir_error(dir, CVLLM_EFORMAT, "tokenizer.json: missing \"model\"");
    unlink(tj);
    rmdir(dir);
    free(tj), free(tc), free(ct), free(json);
}

static void test_config(void **state) {
    (void)state;
    Tokenizer *t = load(1, "null", 0,
                        "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"<|x|>\","
                        " \"pad_token\": null, \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                        " {\"name\": \"default\", \"template\": \"{{ messages }}\"}]}");
    assert_string_equal(tokenizer_bos_token(t), "<s>");
    assert_string_equal(tokenizer_eos_token(t), "<|x|>");
    assert_int_equal(tokenizer_eos_id(t), 303);
    assert_int_equal(tokenizer_bos_id(t), 300);
    assert_null(tokenizer_pad_token(t));
    assert_string_equal(tokenizer_chat_template(t), "{{ messages }}");
    tokenizer_free(t);
    t = load(1, "null", 0, "{\"chat_template\": \"hi\"}");
    assert_string_equal(tokenizer_chat_template(t), "hi");
    assert_null(tokenizer_eos_token(t));
    assert_int_equal(tokenizer_eos_id(t), -1);
    tokenizer_free(t);
    char *j = make_json(0, "null", "BPE", BL_REGEX, 0);
    assert_int_equal(tokenizer_load_from_strings(j, strlen(j), "{bad", &t), CVLLM_EFORMAT);
    free(j);
    tokenizer_free(NULL);
}

/* The Split pre-tokenizer with Qwen's regex: (?i:'s) folds ASCII only, \s is White_Space. */
static void test_split_regex(void **state) {
    (void)state;
    const char *pre =
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
        "\"use_regex\":false}]}";
    char *j = make_json(0, "null", "BPE", pre, 0);
    Tokenizer *t;
    int rc = tokenizer_load_from_strings(j, strlen(j), NULL, &t);
    if (rc < 0) fprintf(stderr, "%s\n", cvllm_last_error());
    assert_int_equal(rc, 0);
    free(j);
    EXPECT(t, "12", '1', '2'); /* \p{N} one digit at a time: no merge across pieces */
    EXPECT(t, "'S", '\'', 'S');
    tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_both_merge_forms), cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_added_tokens),         cmocka_unit_test(test_nfc_normalizer),
        cmocka_unit_test(test_decode),               cmocka_unit_test(test_stream),
        cmocka_unit_test(test_invalid_utf8),         cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_config),               cmocka_unit_test(test_split_regex),
        cmocka_unit_test(test_nul_bytes),            cmocka_unit_test(test_load_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

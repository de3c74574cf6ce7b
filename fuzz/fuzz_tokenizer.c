/* fuzz_tokenizer.c: libFuzzer target for the tokenizer (src/tokenizer/tok_*.c).
 *
 * A small byte-level BPE tokenizer.json is built once at start-up (no files, no node): the 256 byte
 * tokens, a few merges (every merge result is in the vocabulary), Qwen's Split regex, NFC, and
 * added tokens. Each input is then
 *   - if it starts with '{': loaded as a tokenizer.json (any error is fine; no crash, no leak);
 *   - otherwise: encoded; valid UTF-8 must round-trip up to canonical equivalence
 *     (NFC(decode(encode(x))) == NFC(x)), invalid UTF-8 must give CVLLM_EINVAL. Not byte for byte
 *     with NFC(x): an added token with "normalized": false is cut out of the raw text first and the
 *     pieces around it are normalized apart, so "word" + U+030C (a combining caron the "word"
 *     token leaves behind) stays uncomposed where NFC of the whole text composes d + caron; then the same bytes, read as 16-bit ids (some out of range), are
 *     decoded in one go and streamed, and the two texts must agree. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common.h"
#include "tokenizer/tokenizer.h"

static Tokenizer *g_tok;

static int byte_cp(int b) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    if (printable) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) n++;
    return 256 + n;
}

static char *build_json(void) {
    char *buf = malloc(1 << 16), *p = buf;
    p += sprintf(p,
                 "{\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                 "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+"
                 "|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
                 "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                 "\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":["
                 "{\"id\":300,\"content\":\"<|im_start|>\",\"special\":true},"
                 "{\"id\":301,\"content\":\"<|im_end|>\",\"special\":true},"
                 "{\"id\":302,\"content\":\"<think>\",\"special\":false,\"normalized\":false},"
                 "{\"id\":303,\"content\":\"word\",\"single_word\":true,\"normalized\":false}],"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        int cp = byte_cp(b);
        *p++ = '"';
        if (cp == '"' || cp == '\\') *p++ = '\\';
        if (cp < 0x80) *p++ = (char)cp;
        else {
            *p++ = (char)(0xC0 | (cp >> 6));
            *p++ = (char)(0x80 | (cp & 0x3F));
        }
        p += sprintf(p, "\":%d,", b);
    }
    p += sprintf(p, "\"he\":256,\"ll\":257,\"hell\":258,\"hello\":259,\"\xc4\xa0\xc4\xa0\":260,"
                    "\"\xc3\x83\xc2\xa9\":261,\"in\":262},\"merges\":[\"h e\",\"l l\",\"he ll\","
                    "[\"hell\",\"o\"],\"\xc4\xa0 \xc4\xa0\",\"\xc3\x83 \xc2\xa9\",\"i n\"]}}");
    return buf;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char *j = build_json();
    int rc = tokenizer_load_from_strings(j, strlen(j), "{\"clean_up_tokenization_spaces\":false}", &g_tok);
    free(j);
    CHECK(rc == 0, "embedded tokenizer does not load: %s", cvllm_last_error());
    return 0;
}

static void fuzz_load(const uint8_t *data, size_t size) {
    Tokenizer *t = NULL;
    if (tokenizer_load_from_strings((const char *)data, size, NULL, &t) < 0) return;
    int32_t *ids;
    int n = tokenizer_encode(t, "Hello world <|im_end|> 123", 26, &ids);
    if (n >= 0) {
        free(tokenizer_decode(t, ids, n, 1));
        free(ids);
    }
    tokenizer_free(t);
}

static void fuzz_encode(const uint8_t *data, size_t size) {
    int32_t *ids;
    int n = tokenizer_encode(g_tok, (const char *)data, size, &ids);
    if (n < 0) {
        CHECK(n == CVLLM_EINVAL, "encode returned %d", n);
        CHECK(strstr(cvllm_last_error(), "UTF-8"), "message: %s", cvllm_last_error());
        return;
    }
    size_t len;
    char *back = tokenizer_decode_len(g_tok, ids, n, 0, &len);
    CHECK(back, "decode failed: %s", cvllm_last_error());
    utf8proc_uint8_t *nfc = NULL, *nfc_back = NULL;
    utf8proc_ssize_t nl = utf8proc_map(data, (utf8proc_ssize_t)size, &nfc,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    CHECK(nl >= 0, "utf8proc rejected valid input");
    utf8proc_ssize_t bl = utf8proc_map((const utf8proc_uint8_t *)back, (utf8proc_ssize_t)len,
                                       &nfc_back, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    CHECK(bl >= 0, "decode gave invalid UTF-8");
    CHECK(nl == bl && memcmp(nfc, nfc_back, (size_t)nl) == 0,
          "round trip differs (%zu vs %zu bytes after NFC)", (size_t)nl, (size_t)bl);
    free(nfc);
    free(nfc_back);
    free(back);
    free(ids);
}

static void fuzz_decode(const uint8_t *data, size_t size) {
    int n = (int)(size / 2);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof(int32_t));
    int vs = tokenizer_vocab_size(g_tok);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((data[2 * i] | (data[2 * i + 1] << 8)) % (vs + 2)) - 1;
    size_t len;
    char *whole = tokenizer_decode_len(g_tok, ids, n, data[0] & 1, &len);
    DetokStream *s = detok_stream_create(g_tok, data[0] & 1);
    size_t cap = 64, got = 0;
    char *acc = malloc(cap);
    int failed = 0;
    for (int i = 0; i < n && !failed; i++) {
        char *piece = detok_stream_push(s, ids[i]);
        if (!piece) {
            failed = 1;
            break;
        }
        size_t pl = strlen(piece);
        if (got + pl + 1 > cap) acc = realloc(acc, cap = 2 * (got + pl + 1));
        memcpy(acc + got, piece, pl);
        got += pl;
        free(piece);
    }
    char *rest = detok_stream_flush(s);
    size_t rl = strlen(rest);
    if (got + rl + 1 > cap) acc = realloc(acc, cap = got + rl + 1);
    memcpy(acc + got, rest, rl);
    got += rl;
    free(rest);
    detok_stream_free(s);
    CHECK((whole == NULL) == failed, "decode and stream disagree on a bad id");
    /* pieces are C strings, so compare up to the first NUL of the whole text */
    if (whole && strlen(whole) == len) CHECK(got == len && memcmp(acc, whole, len) == 0, "stream != decode");
    free(acc);
    free(whole);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == '{') {
        fuzz_load(data, size);
        return 0;
    }
    fuzz_encode(data, size);
    if (size > 0) fuzz_decode(data, size);
    return 0;
}

/* bench_tokenize.c: `cvllm bench tokenize MODEL_DIR [--file F] [--repeat N]`, dispatched from
 * cmd_bench.c. Prototype (for cmd_bench.c / commands.h):
 *
 *   int bench_tokenize(int argc, char **argv);   // argv[0] = "tokenize"; returns the exit code
 *
 * Measures the time to load MODEL_DIR's tokenizer files and the single-thread encode throughput
 * (MB/s of UTF-8 input) on F, or on ~10 MB of deterministic English-like text when no file is
 * given. Prints one line per figure; the best of N encode runs is reported along with the mean. */
#include <string.h>

#include "cli/cli_util.h"
#include "common.h"
#include "tokenizer/tokenizer.h"

int bench_tokenize(int argc, char **argv);

static const char *WORDS[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which", "but",
    "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has",
    "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people",
    "system", "government", "information", "development", "important", "between", "through",
    "language", "model", "inference", "engine", "memory", "token", "sequence", "attention",
    "performance", "although", "however", "experiment", "particularly", "understanding",
    "university", "2024", "100", "3.5", "don't", "it's", "we're", "John", "London", "Monday",
    "internationalization", "quickly", "brown", "fox", "jumps", "over", "lazy", "dog", "water",
    "history", "because", "example", "different", "following", "without", "another", "number"};
#define N_WORDS (sizeof(WORDS) / sizeof(WORDS[0]))

/* ~target bytes of sentences and paragraphs from a fixed LCG: the same text on every run. */
static char *make_text(size_t target, size_t *len) {
    char *buf = xmalloc(target + 256);
    size_t n = 0;
    uint64_t state = 0x2545F4914F6CDD1Dull;
    int in_sentence = 0, sentences = 0;
    while (n < target) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(state >> 33);
        const char *w = WORDS[r % N_WORDS];
        size_t wl = strlen(w);
        if (!in_sentence && w[0] >= 'a' && w[0] <= 'z') {
            buf[n++] = (char)(w[0] - 32);
            memcpy(buf + n, w + 1, wl - 1);
            n += wl - 1;
        } else {
            memcpy(buf + n, w, wl);
            n += wl;
        }
        in_sentence++;
        uint32_t p = (r >> 8) % 100;
        if (in_sentence > 6 && p < 12) {
            buf[n++] = p < 9 ? '.' : (p < 11 ? '?' : '!');
            in_sentence = 0;
            if (++sentences % 5 == 0) {
                buf[n++] = '\n';
                buf[n++] = '\n';
                continue;
            }
        } else if (p < 18) {
            buf[n++] = ',';
        }
        buf[n++] = ' ';
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static const char USAGE[] =
    "usage: cvllm bench tokenize MODEL_DIR [--file F] [--repeat N]\n"
    "  load time of the tokenizer files and encode throughput on one core;\n"
    "  --file F     the text to encode (default: ~10 MB of generated English-like text)\n"
    "  --repeat N   runs of each, 1..1000; the best is reported (default 3)\n";

int bench_tokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *v;
    long long repeat = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (!strcmp(a, "--file")) {
            if (!(file = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--repeat")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 1, 1000, &repeat) < 0) return 2;
        } else if (a[0] != '-' && !dir) {
            dir = a;
        } else {
            fprintf(stderr, "cvllm bench tokenize: %s '%s'\n\n%s",
                    a[0] == '-' ? "unknown option" : "unexpected argument", a, USAGE);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "cvllm bench tokenize: MODEL_DIR is required\n\n%s", USAGE);
        return 2;
    }
    size_t len;
    char *text = file ? file_read(file, FILE_MAX_DEFAULT, &len) : make_text(10u << 20, &len);
    if (!text) {
        fprintf(stderr, "cvllm bench tokenize: --file: %s\n", cvllm_last_error());
        return 1;
    }
    Tokenizer *t = NULL;
    double best_load = 1e30;
    for (int r = 0; r < repeat; r++) { /* load: best of N (the first run also warms the page cache) */
        tokenizer_free(t);
        double t0 = now_seconds();
        if (tokenizer_load(dir, &t) < 0) {
            fprintf(stderr, "cvllm bench tokenize: %s\n", cvllm_last_error());
            free(text);
            return 1;
        }
        double dt = now_seconds() - t0;
        if (dt < best_load) best_load = dt;
    }
    printf("tokenizer load:  %.1f ms (best of %d) from %s\n", best_load * 1e3, (int)repeat, dir);
    double best = 1e30, total = 0;
    int n_ids = 0;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        double t0 = now_seconds();
        n_ids = tokenizer_encode(t, text, len, &ids);
        double dt = now_seconds() - t0;
        if (n_ids < 0) {
            fprintf(stderr, "cvllm bench tokenize: %s\n", cvllm_last_error());
            tokenizer_free(t);
            free(text);
            return 1;
        }
        free(ids);
        total += dt;
        if (dt < best) best = dt;
    }
    double mb = (double)len / 1e6;
    printf("input:           %.2f MB (%s), %d tokens, %.2f bytes/token\n", mb,
           file ? file : "generated English-like text", n_ids, n_ids ? (double)len / n_ids : 0.0);
    printf("encode:          %.1f MB/s best, %.1f MB/s mean of %d (one thread), %.2f M tokens/s\n",
           mb / best, mb * repeat / total, (int)repeat, n_ids / best / 1e6);
    tokenizer_free(t);
    free(text);
    return 0;
}

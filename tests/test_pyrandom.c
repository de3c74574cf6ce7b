/* test_pyrandom.c: the benchmark generator reproduces CPython's random module, and the default
 * workload is exactly nano-vllm bench.py's (totals published with it: 142,827 prompt tokens and
 * 133,966 output tokens for 256 sequences). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "bench/pyrandom.h"

/* python3 -c "import random; random.seed(0); print([random.getrandbits(32) for _ in range(3)])" */
static void test_getrandbits_matches_cpython(void **state) {
    (void)state;
    PyRandom r;
    pyrandom_seed(&r, 0);
    assert_int_equal(pyrandom_getrandbits(&r, 32), 3626764237u);
    assert_int_equal(pyrandom_getrandbits(&r, 32), 1654615998u);
    assert_int_equal(pyrandom_getrandbits(&r, 32), 3255389356u);
}

/* python3 -c "import random; random.seed(0); print([random.randint(0, 10000) for _ in range(5)])" */
static void test_randint_matches_cpython(void **state) {
    (void)state;
    PyRandom r;
    pyrandom_seed(&r, 0);
    static const int64_t expect[5] = {6311, 6890, 663, 4242, 8376};
    for (int i = 0; i < 5; i++) assert_int_equal(pyrandom_randint(&r, 0, 10000), expect[i]);
}

static void test_nanovllm_workload_totals(void **state) {
    (void)state;
    BenchWorkload w;
    bench_workload_nanovllm(&w, 256, 1024, 1024);
    assert_int_equal(w.num_seqs, 256);
    assert_int_equal(w.total_prompt_tokens, 142827);
    assert_int_equal(w.total_output_tokens, 133966);
    for (int i = 0; i < w.num_seqs; i++) {
        assert_true(w.prompt_lens[i] >= 100 && w.prompt_lens[i] <= 1024);
        assert_true(w.max_tokens[i] >= 100 && w.max_tokens[i] <= 1024);
    }
    bench_workload_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_getrandbits_matches_cpython),
        cmocka_unit_test(test_randint_matches_cpython),
        cmocka_unit_test(test_nanovllm_workload_totals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

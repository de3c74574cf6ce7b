/* test_engine_threads.c: one thread runs the engine (cvllm_engine_run) while client threads
 * submit and abort requests and receive their outputs by callback, as the server does. Every
 * request gets exactly one final output, aborted or not; its text is the concatenation of its
 * step outputs' new text; no KV block is held at the end; shutdown refuses new work. Run under
 * ThreadSanitizer by `make tsan`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cvllm.h"

#define CLIENTS 4
#define PER_CLIENT 12

typedef struct {
    atomic_int finals, outputs;
    atomic_int tokens;   /* new tokens summed over outputs */
    atomic_int last_num; /* num_tokens of the final output */
    atomic_int reason;
} Slot;

static Slot g_slots[CLIENTS][PER_CLIENT];
static char g_model[256];

static void on_output(void *user, const CvllmRequestOutput *o) {
    Slot *s = user;
    atomic_fetch_add(&s->outputs, 1);
    atomic_fetch_add(&s->tokens, o->num_new_tokens);
    if (o->finish_reason != CVLLM_FINISH_NONE) {
        atomic_store(&s->last_num, o->num_tokens);
        atomic_store(&s->reason, (int)o->finish_reason);
        atomic_fetch_add(&s->finals, 1);
    }
}

typedef struct {
    CvllmEngine *e;
    int c;
} ClientArgs;

static void *client(void *arg) {
    ClientArgs *a = arg;
    unsigned seed = 77u * (unsigned)a->c + 1;
    for (int i = 0; i < PER_CLIENT; i++) {
        int32_t prompt[24];
        int n = 4 + (int)(rand_r(&seed) % 20);
        for (int k = 0; k < n; k++) prompt[k] = (int32_t)(rand_r(&seed) % 500);
        CvllmRequest r = {.prompt_token_ids = prompt, .num_prompt_tokens = n,
                          .on_output = on_output, .user = &g_slots[a->c][i]};
        cvllm_sampling_params_default(&r.params);
        r.params.max_tokens = 6 + (int)(rand_r(&seed) % 20);
        r.params.ignore_eos = 1;
        r.params.seed = i;
        int64_t id = cvllm_engine_submit(a->e, &r);
        assert_true(id >= 0);
        if (i % 3 == 1) { /* abort some: at once, or after a moment */
            if (i % 2) usleep(2000);
            cvllm_engine_abort_request(a->e, id);
        }
    }
    return NULL;
}

static void *engine_thread(void *arg) {
    return (void *)(intptr_t)cvllm_engine_run((CvllmEngine *)arg);
}

static void test_clients_and_engine_thread(void **state) {
    (void)state;
    CvllmEngineOptions o;
    cvllm_engine_options_default(&o);
    o.device = CVLLM_DEVICE_CPU;
    o.max_model_len = 128;
    o.max_num_seqs = 8;
    o.kv_cache_memory = 48 * 12288; /* 48 blocks: some preemption */
    o.num_threads = 1;
    o.verbose = 0;
    CvllmEngine *e = NULL;
    assert_int_equal(cvllm_engine_create(g_model, &o, &e), 0);
    pthread_t et, ct[CLIENTS];
    pthread_create(&et, NULL, engine_thread, e);
    ClientArgs args[CLIENTS];
    for (int c = 0; c < CLIENTS; c++) {
        args[c] = (ClientArgs){e, c};
        pthread_create(&ct[c], NULL, client, &args[c]);
    }
    for (int c = 0; c < CLIENTS; c++) pthread_join(ct[c], NULL);
    cvllm_engine_shutdown(e, 1); /* drain: what was submitted finishes */
    void *rc;
    pthread_join(et, &rc);
    assert_int_equal((int)(intptr_t)rc, 0);
    int aborted = 0;
    for (int c = 0; c < CLIENTS; c++)
        for (int i = 0; i < PER_CLIENT; i++) {
            Slot *s = &g_slots[c][i];
            assert_int_equal(atomic_load(&s->finals), 1);
            assert_int_equal(atomic_load(&s->tokens), atomic_load(&s->last_num));
            int reason = atomic_load(&s->reason);
            if (reason == CVLLM_FINISH_ABORT) aborted++;
            else assert_int_equal(reason, CVLLM_FINISH_LENGTH);
            if (i % 3 != 1) assert_int_equal(reason, CVLLM_FINISH_LENGTH);
        }
    assert_true(aborted >= 1);
    CvllmStats st;
    cvllm_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.num_running + st.num_waiting, 0);
    assert_int_equal(st.requests_added, CLIENTS * PER_CLIENT);
    assert_int_equal(st.requests_finished, CLIENTS * PER_CLIENT);
    /* after shutdown, submissions are refused */
    int32_t p[2] = {1, 2};
    assert_int_equal(cvllm_engine_add_request(e, p, 2, NULL), CVLLM_ESHUTDOWN);
    cvllm_engine_destroy(e);
}

static int make_model(void **state) {
    (void)state;
    snprintf(g_model, sizeof g_model, "%s/test_threads_model_%d",
             getenv("CVLLM_BUILD_DIR") ? getenv("CVLLM_BUILD_DIR") : "/tmp", (int)getpid());
    const char *bin = getenv("CVLLM_BIN") ? getenv("CVLLM_BIN") : "build/cvllm";
    char cmd[600];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset test-qwen3 --seed 5 '%s' >/dev/null", bin, g_model);
    return system(cmd) == 0 ? 0 : -1;
}

static int remove_model(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_model);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clients_and_engine_thread),
    };
    return cmocka_run_group_tests(tests, make_model, remove_model);
}

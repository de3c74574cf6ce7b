/* backend_cpu.h: what the CPU backend exposes beyond backend.h, for tests and benchmarks. */
#ifndef CVLLM_BACKEND_CPU_H
#define CVLLM_BACKEND_CPU_H

#include <stddef.h>

#include "backend/backend.h"

/* Creates the CPU backend over weights (borrowed: must outlive the backend). */
int backend_cpu_create(const ModelConfig *cfg, const ModelWeights *w, const BackendOptions *o,
                       Backend **out);
/* Its registry entry (backend.c). */
extern const BackendEntry backend_cpu_entry;
/* `cvllm bench ops` for the CPU (bench_ops.c). */
int bench_cpu_ops(int argc, char **argv);

/* The KV cache of a CPU backend (NULL before init_kv_cache):
 * [2, num_layers, num_blocks, block_size, kv_heads, head_dim] f32, *num_floats elements. */
float *backend_cpu_kv_cache(Backend *b, size_t *num_floats);
/* Number of threads the backend computes with. */
int backend_cpu_num_threads(Backend *b);
/* Its thread pool (benchmarks run their own jobs on the same threads between steps). */
struct ThreadPool *backend_cpu_pool(Backend *b);

#endif

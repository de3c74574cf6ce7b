/* graph_edges.h: a captured decode graph's programmatic edges moved to launch completion
 * (graph_edges.c tells why and when that is safe). */
#ifndef CVLLM_GRAPH_EDGES_H
#define CVLLM_GRAPH_EDGES_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    GRAPH_EDGES_KEEP = 0,   /* as captured */
    GRAPH_EDGES_LC = 1,     /* the programmatic edges out of library kernels (cuBLASLt's) at
                             * launch completion, into the decode attention only those into
                             * attention_decode_tma_kernel (default) */
    GRAPH_EDGES_LC_ALL = 2, /* every programmatic edge */
    GRAPH_EDGES_LIBRARY = 3, /* also the ordinary edges into library kernels: wrong results
                              * (cuBLASLt's kernels do not wait); test_graph_edges' failure check */
    GRAPH_EDGES_LC_ATT = 4   /* as LC, and those into every decode attention kernel */
};
/* The decode graphs' mode: CVLLM_CUDA_GRAPH_LC (0, 1, 2 or 4, default 1), KEEP below compute
 * capability 9.0 or with programmatic launch off; decided once a process. */
int cuda_graph_edges_mode(void);
/* Moves g's edges as mode says from their upstream kernel's programmatic port to its launch
 * completion port; *moved: how many. dump: print every edge (its type and port, both kernels'
 * names and launch shapes) to stderr first. Returns 0 or a CVLLM_E* code with
 * the message set. */
int cuda_graph_edges_launch_completion(cudaGraph_t g, int mode, int dump, int *moved);

#ifdef __cplusplus
}
#endif
#endif

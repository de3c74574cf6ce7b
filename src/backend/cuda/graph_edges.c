/* graph_edges.c: the edges of a captured decode graph, made earlier where that is safe.
 *
 * Stream capture turns a kernel launched with programmatic dependent launch (pdl_launch,
 * cuda_util.cuh) into a node whose edge from the kernel before it is programmatic from that
 * kernel's "programmatic" port: the kernel may be scheduled once every block of the one before
 * has called griddepcontrol.launch_dependents or exited, and it waits for that kernel's completion
 * and memory in griddepcontrol.wait (pdl_wait) before reading what it wrote. Our kernels trigger
 * as soon as their own wait returns, so that port opens once they run; cuBLASLt's kernels never
 * trigger, so after a cuBLASLt product (qkv, o, gate/up, down: four a layer from 17 tokens up) the
 * port opens only as its last block exits, and the next kernel's launch and block scheduling
 * follow the product's end.
 *
 * cuda_graph_edges_launch_completion moves programmatic edges to the upstream kernel's "launch
 * completion" port: the downstream kernel may be scheduled once every block of the upstream one
 * has started (for a product of one wave: at once), so its blocks become resident beside the
 * product's and wait in pdl_wait. What may run before that wait is the same as before (pdl_wait's
 * contract: nothing the upstream kernel writes), so results do not change, only when the
 * downstream kernel starts. Only the edges out of library kernels are moved by default: our
 * kernels trigger as soon as their own wait returns, so an edge out of one gains nothing, and
 * at launch completion a chain of ours (a batch-1 step's ~300 small kernels) piles up grids
 * resident and waiting on each other (batch-1 decode -10% with every edge moved). Into the decode
 * attention only the 16-bit cache's copy-engine kernel (attention_decode_tma_kernel), which sets
 * up and asks for its first tiles before its wait (attention.cu, dtc_pre_wait): bf16 default
 * workload +1.0%, 256 x 562/523 +1.1%; the same edges into the fp8 cache's kernel cost the fp8
 * default workload 1.0%, and 1.4% before that kernel's setup came before its wait, so they stay.
 * Measured on an H200: docs/BENCHMARKS.md, rounds 18 and 19.
 *
 * Edges into cuBLASLt's kernels stay full dependencies: those kernels do not wait in
 * griddepcontrol.wait (GRAPH_EDGES_LIBRARY below moves them too, and the products then read their
 * inputs before they are written: test_graph_edges fails with it, as it should).
 *
 * CVLLM_CUDA_GRAPH_LC=0 keeps the edges as captured, 2 moves every programmatic edge, 4 those out
 * of library kernels into any kernel (default 1: those out of library kernels, into the decode
 * attention only attention_decode_tma_kernel). CVLLM_CUDA_GRAPH_DUMP=1 prints
 * the largest decode graph's edges (type, port, both kernels' names and launch shapes; "?" for a
 * node that is not a kernel) to stderr. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/graph_edges.h"
#include "backend/cuda/kernels.h"
#include "common.h"

int cuda_graph_edges_mode(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CVLLM_CUDA_GRAPH_LC");
        v = e && *e ? atoi(e) : GRAPH_EDGES_LC;
        if ((v < GRAPH_EDGES_KEEP || v > GRAPH_EDGES_LC_ALL) && v != GRAPH_EDGES_LC_ATT)
            v = GRAPH_EDGES_LC;
        if (!cuda_pdl_enabled()) v = GRAPH_EDGES_KEEP; /* no programmatic edges below sm_90 */
    }
    return v;
}

/* A kernel node's launch parameters and function name (NULL where the driver cannot tell it:
 * cuBLASLt's kernels are the driver's CUfunctions, so the driver is asked, its entry points found
 * at run time). */
typedef CUresult (*NodeParamsFn)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
typedef CUresult (*FuncNameFn)(const char **, CUfunction);
typedef CUresult (*KernelNameFn)(const char **, CUkernel);
static void *driver_fn(const char *sym, int version) {
    enum cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion(sym, &fn, version, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}
static const char *kernel_name(cudaGraphNode_t n, CUDA_KERNEL_NODE_PARAMS *kp) {
    static NodeParamsFn params;
    static FuncNameFn fname;
    static KernelNameFn kname;
    if (!params) {
        params = (NodeParamsFn)driver_fn("cuGraphKernelNodeGetParams", 12000);
        fname = (FuncNameFn)driver_fn("cuFuncGetName", 12030);
        kname = (KernelNameFn)driver_fn("cuKernelGetName", 12030);
    }
    enum cudaGraphNodeType t;
    const char *name = NULL;
    memset(kp, 0, sizeof *kp);
    if (cudaGraphNodeGetType(n, &t) != cudaSuccess || t != cudaGraphNodeTypeKernel || !params ||
        params((CUgraphNode)n, kp) != CUDA_SUCCESS)
        return NULL;
    if (kp->func && fname) fname(&name, kp->func);
    if (!name && kp->kern && kname) kname(&name, kp->kern);
    return name;
}

/* Kernels of ours are C++ kernels of the *.cu files, their names mangled ("_Z..."); cuBLASLt's
 * and NCCL's have plain names (nvjet_..., ncclDevKernel_...). Unknown: neither. */
enum { K_NONE, K_OURS, K_LIBRARY };
static int kernel_kind(const char *name) {
    return !name ? K_NONE : strncmp(name, "_Z", 2) == 0 ? K_OURS : K_LIBRARY;
}

static void dump_edge(size_t i, cudaGraphNode_t from, cudaGraphNode_t to,
                      const cudaGraphEdgeData *ed) {
    CUDA_KERNEL_NODE_PARAMS kp[2];
    const char *name[2] = {kernel_name(from, &kp[0]), kernel_name(to, &kp[1])};
    fprintf(stderr, "cvllm: graph edge %zu: type %d port %d:", i, (int)ed->type,
            (int)ed->from_port);
    for (int k = 0; k < 2; k++)
        fprintf(stderr, "%s %s <<<(%u,%u,%u), %u, %u>>>", k ? " ->" : "", name[k] ? name[k] : "?",
                kp[k].gridDimX, kp[k].gridDimY, kp[k].gridDimZ,
                kp[k].blockDimX * kp[k].blockDimY * kp[k].blockDimZ, kp[k].sharedMemBytes);
    fputc('\n', stderr);
}

int cuda_graph_edges_launch_completion(cudaGraph_t g, int mode, int dump, int *moved) {
    size_t ne = 0;
    *moved = 0;
    cudaError_t e = cudaGraphGetEdges(g, NULL, NULL, NULL, &ne);
    if (e != cudaSuccess) return cuda_error(e, __FILE__, __LINE__, "cudaGraphGetEdges");
    if (ne == 0) return 0;
    cudaGraphNode_t *from = malloc(ne * sizeof *from), *to = malloc(ne * sizeof *to);
    cudaGraphEdgeData *ed = malloc(ne * sizeof *ed);
    if (!from || !to || !ed) {
        free(from), free(to), free(ed);
        return cvllm_errorf(CVLLM_ENOMEM, "cuda graph edges: out of host memory");
    }
    int rc = 0;
    e = cudaGraphGetEdges(g, from, to, ed, &ne);
    if (e != cudaSuccess) {
        rc = cuda_error(e, __FILE__, __LINE__, "cudaGraphGetEdges");
        goto out;
    }
    for (size_t i = 0; i < ne; i++) {
        CUDA_KERNEL_NODE_PARAMS kp;
        const char *up = kernel_name(from[i], &kp), *down = kernel_name(to[i], &kp);
        if (dump) dump_edge(i, from[i], to[i], &ed[i]);
        if (mode == GRAPH_EDGES_KEEP) continue;
        const int prog = ed[i].type == cudaGraphDependencyTypeProgrammatic &&
                         ed[i].from_port == cudaGraphKernelNodePortProgrammatic;
        /* an ordinary edge between two kernels into a library kernel */
        const int lib = mode == GRAPH_EDGES_LIBRARY &&
                        ed[i].type == cudaGraphDependencyTypeDefault && up &&
                        kernel_kind(down) == K_LIBRARY;
        if (!prog && !lib) continue;
        /* the default (and LC_ATT): out of a kernel known to be a library's; into the decode
         * attention only the copy-engine 16-bit kernel (LC_ATT: into any) */
        if ((mode == GRAPH_EDGES_LC || mode == GRAPH_EDGES_LC_ATT) &&
            (kernel_kind(up) != K_LIBRARY || !down))
            continue;
        if (mode == GRAPH_EDGES_LC && strstr(down, "attention_decode") &&
            !strstr(down, "attention_decode_tma_kernel"))
            continue;
        cudaGraphEdgeData nd = ed[i];
        nd.type = cudaGraphDependencyTypeProgrammatic;
        nd.from_port = cudaGraphKernelNodePortLaunchCompletion;
        e = cudaGraphRemoveDependencies(g, &from[i], &to[i], &ed[i], 1);
        if (e == cudaSuccess) e = cudaGraphAddDependencies(g, &from[i], &to[i], &nd, 1);
        if (e != cudaSuccess) {
            rc = cuda_error(e, __FILE__, __LINE__, "graph edge to launch completion");
            goto out;
        }
        (*moved)++;
    }
out:
    free(from), free(to), free(ed);
    return rc;
}

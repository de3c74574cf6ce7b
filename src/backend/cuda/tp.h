/* tp.h: the tensor-parallel group of the CUDA backend: one process per GPU, rank 0 being the
 * engine's process. This file knows nothing of the model: it starts and watches the ranks, carries
 * the control messages (TCP, rank 0 <-> each worker) and the collectives (NCCL).
 *
 * Start-up: rank 0 listens on a TCP address (127.0.0.1 and a free port by default), starts the
 * local workers (ranks 1..local_ranks-1) by running its own executable again with CVLLM_TP_WORKER
 * in the environment (the rest of the environment inherited, NCCL_NVLS_ENABLE included), and
 * waits for every rank to connect (`cvllm worker --connect HOST:PORT --rank R` on other hosts).
 * Each worker gets NCCL's unique id over its connection, then the communicator is created on all
 * ranks at once (non-blocking, so that a rank lost meanwhile is an error, not a hang).
 *
 * Failure: while any rank waits on the GPU (tp_stream_wait), it also watches its peers: a closed
 * connection (a worker killed, rank 0 gone), an error message from a worker, or an NCCL error
 * fails the group for good: every later call returns the same error. Rank 0 then ends the
 * workers it started (SIGTERM, then SIGKILL after 5 s); a worker exits. The communicator is not
 * aborted (ncclCommAbort waits for every rank of the host, the lost one included, so it can hang
 * forever): a kernel may still spin on the lost rank until the process exits, and the engine
 * above stops. */
#ifndef CVLLM_TP_H
#define CVLLM_TP_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

typedef struct TpGroup TpGroup;

/* Control messages (rank 0 -> workers, and replies). */
enum {
    TP_MSG_CREATE = 1, /* model folder + backend options: load the weights, join NCCL */
    TP_MSG_BUDGET,     /* measure the activation peak, reply the KV budget in bytes */
    TP_MSG_INIT_KV,    /* allocate the KV cache (spec) */
    TP_MSG_WARMUP,     /* capture the decode graphs */
    TP_MSG_STEP,       /* run one step's model (no reply) */
    TP_MSG_SHUTDOWN,   /* free everything and exit 0 */
    TP_MSG_REPLY,      /* worker -> rank 0: int64 value (0: ok) */
    TP_MSG_ERROR,      /* worker -> rank 0: the error text; the worker then exits */
};

/* Rank 0: listens on addr ("HOST:PORT"; NULL: 127.0.0.1, any free port), starts ranks
 * 1..local_ranks-1 on this host (local_ranks <= 0: all of them; rank r on GPU r), and waits up to
 * timeout_s for all size-1 workers to connect. */
int tp_group_start(TpGroup **out, int size, const char *addr, int local_ranks, double timeout_s,
                   int verbose);
/* A worker: connects to rank 0 at addr as rank (retrying until timeout_s). */
int tp_group_join(TpGroup **out, const char *addr, int rank, double timeout_s);
int tp_rank(const TpGroup *g);
int tp_size(const TpGroup *g);
/* 1 once the group has failed (a rank lost): the message says which and how. */
int tp_failed(const TpGroup *g);

/* Rank 0: sends one message (type, two payload parts) to every worker. */
int tp_send_all(TpGroup *g, uint32_t type, const void *a, size_t na, const void *b, size_t nb);
/* A worker: the next message from rank 0 (blocking; *payload malloc'd, caller frees). */
int tp_recv(TpGroup *g, uint32_t *type, void **payload, size_t *n);
/* A worker: replies value, or (err != NULL) the error text. */
int tp_reply(TpGroup *g, int64_t value, const char *err);
/* Rank 0: one reply from every worker; *min_value = the smallest value (rank 0's own included as
 * own). A worker's error becomes this call's error, naming the rank. */
int tp_gather_replies(TpGroup *g, int64_t own, int64_t *min_value);

/* NCCL on every rank (after the workers got their CREATE message): on device. */
int tp_nccl_init(TpGroup *g, int device);
/* In-place sum over the ranks of n floats (stream-ordered; can be captured in a CUDA graph). */
int tp_all_reduce_sum(TpGroup *g, float *buf, size_t n, cudaStream_t st);
/* Rank 0 receives every rank's n floats into recv [size][n] (its own at recv[0], copied from
 * send); a worker sends its n floats. */
int tp_gather_to_root(TpGroup *g, const float *send, float *recv, size_t n, cudaStream_t st);
/* n int32 from rank 0's send to every rank's recv (rank 0's too; stream-ordered): asynchronous
 * steps' token ids, which only rank 0 samples. */
int tp_broadcast_i32(TpGroup *g, const int32_t *send, int32_t *recv, size_t n,
                     cudaStream_t st);
/* Waits until the stream is done, watching the peers and NCCL (see the file's comment). */
int tp_stream_wait(TpGroup *g, cudaStream_t st);
/* The same for the work recorded before ev. */
int tp_event_wait(TpGroup *g, cudaEvent_t ev);

/* Rank 0: tells the workers to exit and reaps the ones it started (SIGKILL after timeout).
 * A worker: closes its connection. Frees g (NULL: nothing). */
void tp_group_close(TpGroup *g);

#endif

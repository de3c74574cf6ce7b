/* tp.c: the tensor-parallel group (see tp.h): TCP control connections, the worker processes,
 * NCCL's communicator and collectives, and the watch on the peers while waiting on the GPU. */
#include "backend/cuda/tp.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "common.h"

extern char **environ;

#define TP_MAGIC 0x43565450u /* "CVTP" */
#define PEER_CHECK_S 0.002   /* how often a wait looks at the peers */

/* CVLLM_TP_TRACE=1: every message, collective and wait of every rank on stderr (debugging). */
static int tp_trace = -1;
#define TRACE(g, ...)                                                                              \
    do {                                                                                           \
        if (tp_trace < 0) tp_trace = getenv("CVLLM_TP_TRACE") && *getenv("CVLLM_TP_TRACE") != '0'; \
        if (tp_trace) {                                                                            \
            fprintf(stderr, "[tp rank %d %.6f] ", (g)->rank, now_seconds());                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

typedef struct {
    uint32_t magic, type;
    uint64_t len;
} MsgHeader;

typedef struct {
    uint32_t magic;
    int32_t rank;
} Hello;

typedef struct {
    uint32_t magic;
    int32_t size;
    ncclUniqueId id;
} Welcome;

struct TpGroup {
    int rank, size, verbose;
    int *fd;    /* rank 0: fd[r] for r >= 1; a worker: fd[0] */
    pid_t *pid; /* rank 0: the local workers it started (0: none for that rank) */
    int listen_fd;
    ncclUniqueId id;
    ncclComm_t comm;
    int failed;
    char err[600];
};

/* ---------------------------------------------------------------- failure */

static void end_workers(TpGroup *g, double grace_s);

/* Fails the group for good (first reason kept), aborts NCCL, ends the local workers. */
static int group_fail(TpGroup *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int group_fail(TpGroup *g, const char *fmt, ...) {
    if (!g->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->err, sizeof g->err, fmt, ap);
        va_end(ap);
        g->failed = 1;
        /* No ncclCommAbort: with a rank gone it can wait forever for that rank (NCCL needs every
         * rank of a host to abort). The communicator is left as it is (a kernel may still spin
         * on the lost rank); the engine stops and the process exits, which frees it all. */
        if (g->rank == 0) end_workers(g, 5.0);
    }
    return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
}

int tp_rank(const TpGroup *g) { return g->rank; }
int tp_size(const TpGroup *g) { return g->size; }
int tp_failed(const TpGroup *g) { return g->failed; }

/* "pid P killed by signal S, NAME" or "pid P exited with status N" from a waitpid status. */
static void status_text(pid_t p, int st, char *buf, size_t n) {
    if (WIFSIGNALED(st))
        snprintf(buf, n, "pid %d killed by signal %d, %s", (int)p, WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "pid %d exited with status %d", (int)p, WEXITSTATUS(st));
}

/* How a local worker ended, " (...)", or "" if still running / not ours. */
static void describe_exit(TpGroup *g, int r, char *buf, size_t n) {
    buf[0] = '\0';
    if (g->rank != 0 || !g->pid || g->pid[r] <= 0) return;
    int st = 0;
    pid_t p = 0;
    for (int i = 0; i < 1000 && (p = waitpid(g->pid[r], &st, WNOHANG)) == 0; i++)
        usleep(2000); /* up to 2 s: a process with a GPU context takes a moment to end */
    if (p != g->pid[r]) return;
    g->pid[r] = 0;
    char s[120];
    status_text(p, st, s, sizeof s);
    snprintf(buf, n, " (%s)", s);
}

/* ---------------------------------------------------------------- sockets */

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r, n -= (size_t)r;
    }
    return 0;
}

static int send_msg(int fd, uint32_t type, const void *a, size_t na, const void *b, size_t nb) {
    MsgHeader h = {TP_MAGIC, type, (uint64_t)(na + nb)};
    struct iovec iov[3] = {{&h, sizeof h}, {(void *)a, na}, {(void *)b, nb}};
    int cnt = 3;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
    size_t left = sizeof h + na + nb;
    while (left > 0) {
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        left -= (size_t)w;
        while (w > 0 && m.msg_iovlen > 0) { /* advance over what went out */
            if ((size_t)w >= m.msg_iov[0].iov_len) {
                w -= (ssize_t)m.msg_iov[0].iov_len;
                m.msg_iov++, m.msg_iovlen--;
            } else {
                m.msg_iov[0].iov_base = (char *)m.msg_iov[0].iov_base + w;
                m.msg_iov[0].iov_len -= (size_t)w;
                w = 0;
            }
        }
    }
    return 0;
}

/* Reads one message; *payload malloc'd (NUL-terminated for texts). -1: connection lost / bad. */
static int recv_msg(int fd, uint32_t *type, void **payload, size_t *n) {
    MsgHeader h;
    if (read_all(fd, &h, sizeof h) < 0 || h.magic != TP_MAGIC || h.len > ((uint64_t)1 << 34))
        return -1;
    char *p = malloc(h.len + 1);
    if (!p || (h.len && read_all(fd, p, h.len) < 0)) {
        free(p);
        return -1;
    }
    p[h.len] = '\0';
    *type = h.type;
    *payload = p;
    if (n) *n = h.len;
    return 0;
}

static void tune_socket(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* "HOST:PORT" (HOST may be empty: 127.0.0.1) into a socket address. */
static int parse_addr(const char *addr, int passive, struct sockaddr_storage *ss, socklen_t *len) {
    char host[256] = "127.0.0.1", port[32] = "0";
    if (addr && *addr) {
        const char *c = strrchr(addr, ':');
        if (!c || strlen(c + 1) == 0 || strlen(c + 1) >= sizeof port || (size_t)(c - addr) >= sizeof host)
            return cvllm_errorf(CVLLM_EINVAL, "tensor parallelism: address \"%s\" is not HOST:PORT",
                                addr);
        if (c > addr) {
            memcpy(host, addr, (size_t)(c - addr));
            host[c - addr] = '\0';
        }
        snprintf(port, sizeof port, "%s", c + 1);
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
                             .ai_flags = passive ? AI_PASSIVE : 0},
                    *res = NULL;
    int e = getaddrinfo(host, port, &hints, &res);
    if (e || !res)
        return cvllm_errorf(CVLLM_EINVAL, "tensor parallelism: cannot resolve \"%s:%s\": %s", host,
                            port, gai_strerror(e));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* ---------------------------------------------------------------- start / join */

static TpGroup *group_new(int rank, int size) {
    TpGroup *g = xcalloc(1, sizeof *g);
    g->rank = rank, g->size = size;
    g->listen_fd = -1;
    g->fd = xmalloc((size_t)size * sizeof(int));
    g->pid = xcalloc((size_t)size, sizeof(pid_t));
    for (int r = 0; r < size; r++) g->fd[r] = -1;
    return g;
}

static int spawn_worker(TpGroup *g, int r, const char *connect_addr) {
    int n = 0;
    while (environ[n]) n++;
    char **env = xcalloc((size_t)n + 2, sizeof(char *));
    int k = 0;
    for (int i = 0; i < n; i++) /* the environment as it is (NCCL_* included), ours replaced */
        if (strncmp(environ[i], CVLLM_TP_WORKER_ENV "=", strlen(CVLLM_TP_WORKER_ENV) + 1) != 0)
            env[k++] = environ[i];
    char var[400];
    snprintf(var, sizeof var, "%s=%s %d %d", CVLLM_TP_WORKER_ENV, connect_addr, r, r);
    env[k++] = var;
    env[k] = NULL;
    char name[32];
    snprintf(name, sizeof name, "cvllm-tp-rank%d", r);
    char *argv[] = {name, NULL};
    int e = posix_spawn(&g->pid[r], "/proc/self/exe", NULL, NULL, argv, env);
    free(env);
    if (e)
        return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: cannot start rank %d: %s", r,
                            strerror(e));
    return 0;
}

int tp_group_start(TpGroup **out, int size, const char *addr, int local_ranks, double timeout_s,
                   int verbose) {
    *out = NULL;
    if (local_ranks <= 0 || local_ranks > size) local_ranks = size;
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = parse_addr(addr, 1, &ss, &sl);
    if (rc) return rc;
    TpGroup *g = group_new(0, size);
    g->verbose = verbose;
    ncclResult_t nr = ncclGetUniqueId(&g->id);
    if (nr != ncclSuccess) {
        rc = cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: ncclGetUniqueId: %s",
                          ncclGetErrorString(nr));
        goto fail;
    }
    g->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (g->listen_fd < 0 || bind(g->listen_fd, (struct sockaddr *)&ss, sl) < 0 ||
        listen(g->listen_fd, size) < 0) {
        rc = cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: cannot listen on %s: %s",
                          addr ? addr : "127.0.0.1", strerror(errno));
        goto fail;
    }
    struct sockaddr_in bound;
    socklen_t bl = sizeof bound;
    getsockname(g->listen_fd, (struct sockaddr *)&bound, &bl);
    const int port = ntohs(bound.sin_port);
    char connect_addr[300];
    snprintf(connect_addr, sizeof connect_addr, "127.0.0.1:%d", port);
    if (verbose)
        fprintf(stderr,
                "cvllm: tensor parallel: %d ranks, rank 0 listening on port %d, %d started here\n",
                size, port, local_ranks);
    for (int r = 1; r < local_ranks; r++)
        if ((rc = spawn_worker(g, r, connect_addr))) goto fail;
    const double deadline = now_seconds() + timeout_s;
    int joined = 0;
    while (joined < size - 1) {
        for (int r = 1; r < local_ranks; r++) { /* a local worker that died before joining */
            char why[160];
            if (g->fd[r] < 0 && g->pid[r] > 0) {
                int st;
                if (waitpid(g->pid[r], &st, WNOHANG) == g->pid[r]) {
                    status_text(g->pid[r], st, why, sizeof why);
                    g->pid[r] = 0;
                    rc = cvllm_errorf(CVLLM_EBACKEND,
                                      "tensor parallelism: rank %d (%s) ended before it connected (a "
                                      "program using tensor parallelism calls "
                                      "cvllm_worker_main() first thing in main)",
                                      r, why);
                    goto fail;
                }
            }
        }
        if (now_seconds() > deadline) {
            rc = cvllm_errorf(CVLLM_EBACKEND,
                              "tensor parallelism: %d of %d workers connected within %.0f s "
                              "(start the others with `cvllm worker --connect HOST:%d --rank R`)",
                              joined, size - 1, timeout_s, port);
            goto fail;
        }
        struct pollfd p = {g->listen_fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        int fd = accept4(g->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        tune_socket(fd);
        struct timeval tv = {10, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        Hello h;
        if (read_all(fd, &h, sizeof h) < 0 || h.magic != TP_MAGIC || h.rank < 1 ||
            h.rank >= size || g->fd[h.rank] >= 0) {
            close(fd); /* not one of ours, or a rank twice */
            continue;
        }
        tv.tv_sec = 0;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        Welcome w = {TP_MAGIC, size, g->id};
        if (write_all(fd, &w, sizeof w) < 0) {
            close(fd);
            continue;
        }
        g->fd[h.rank] = fd;
        joined++;
    }
    close(g->listen_fd);
    g->listen_fd = -1;
    *out = g;
    return 0;
fail:
    tp_group_close(g);
    return rc;
}

int tp_group_join(TpGroup **out, const char *addr, int rank, double timeout_s) {
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = parse_addr(addr, 0, &ss, &sl);
    if (rc) return rc;
    const double deadline = now_seconds() + timeout_s;
    int fd = -1;
    for (;;) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&ss, sl) == 0) break;
        int err = errno;
        if (fd >= 0) close(fd);
        if (now_seconds() > deadline)
            return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: cannot connect to %s: %s",
                                addr, strerror(err));
        usleep(200000);
    }
    tune_socket(fd);
    Hello h = {TP_MAGIC, rank};
    Welcome w;
    if (write_all(fd, &h, sizeof h) < 0 || read_all(fd, &w, sizeof w) < 0 ||
        w.magic != TP_MAGIC || rank >= w.size) {
        close(fd);
        return cvllm_errorf(CVLLM_EBACKEND,
                            "tensor parallelism: rank 0 at %s refused rank %d (a rank taken "
                            "twice, or beyond the group's size)",
                            addr, rank);
    }
    TpGroup *g = group_new(rank, w.size);
    g->fd[0] = fd;
    g->id = w.id;
    *out = g;
    return 0;
}

/* ---------------------------------------------------------------- messages */

int tp_send_all(TpGroup *g, uint32_t type, const void *a, size_t na, const void *b, size_t nb) {
    TRACE(g, "send message %u (%zu bytes)", type, na + nb);
    if (g->failed) return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
    for (int r = 1; r < g->size; r++)
        if (send_msg(g->fd[r], type, a, na, b, nb) < 0) {
            char why[160];
            describe_exit(g, r, why, sizeof why);
            return group_fail(g, "rank %d is gone%s", r, why);
        }
    return 0;
}

int tp_recv(TpGroup *g, uint32_t *type, void **payload, size_t *n) {
    if (recv_msg(g->fd[0], type, payload, n) < 0)
        return group_fail(g, "rank %d: the connection to rank 0 closed", g->rank);
    TRACE(g, "received message %u (%zu bytes)", *type, n ? *n : 0);
    return 0;
}

int tp_reply(TpGroup *g, int64_t value, const char *err) {
    int r = err ? send_msg(g->fd[0], TP_MSG_ERROR, err, strlen(err), NULL, 0)
                : send_msg(g->fd[0], TP_MSG_REPLY, &value, sizeof value, NULL, 0);
    return r < 0 ? group_fail(g, "rank %d: the connection to rank 0 closed", g->rank) : 0;
}

/* Looks at the peers without blocking: 0, or the group's failure. Rank 0: a worker's closed
 * connection or its ERROR message (a REPLY waiting is left for tp_gather_replies); a worker:
 * rank 0's closed connection (a STEP waiting is normal: rank 0 runs ahead). */
static int check_peers(TpGroup *g) {
    if (g->failed) return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
    for (int r = 0; r < g->size; r++) {
        if (g->fd[r] < 0) continue;
        struct pollfd p = {g->fd[r], POLLIN | POLLRDHUP, 0};
        if (poll(&p, 1, 0) <= 0) continue;
        if (g->rank == 0 && (p.revents & POLLIN)) {
            MsgHeader h;
            ssize_t k = recv(g->fd[r], &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
            if (k == (ssize_t)sizeof h && h.magic == TP_MAGIC && h.type == TP_MSG_ERROR) {
                uint32_t type;
                void *msg = NULL;
                if (recv_msg(g->fd[r], &type, &msg, NULL) == 0) {
                    int rc = group_fail(g, "rank %d failed: %s", r, (char *)msg);
                    free(msg);
                    return rc;
                }
            }
            if (k == (ssize_t)sizeof h && !(p.revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
        }
        if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) {
            char why[160];
            describe_exit(g, r, why, sizeof why);
            if (g->rank == 0) return group_fail(g, "rank %d is gone%s", r, why);
            return group_fail(g, "rank %d: rank 0 is gone", g->rank);
        }
    }
    return 0;
}

int tp_gather_replies(TpGroup *g, int64_t own, int64_t *min_value) {
    int64_t m = own;
    for (int r = 1; r < g->size; r++) {
        for (;;) {
            if (g->failed) return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
            struct pollfd p = {g->fd[r], POLLIN, 0};
            if (poll(&p, 1, 100) > 0) break;
            int rc = check_peers(g);
            if (rc) return rc;
        }
        uint32_t type;
        void *msg = NULL;
        size_t n = 0;
        if (recv_msg(g->fd[r], &type, &msg, &n) < 0) {
            char why[160];
            describe_exit(g, r, why, sizeof why);
            return group_fail(g, "rank %d is gone%s", r, why);
        }
        if (type == TP_MSG_ERROR) {
            int rc = group_fail(g, "rank %d failed: %s", r, (char *)msg);
            free(msg);
            return rc;
        }
        int64_t v = 0;
        if (type != TP_MSG_REPLY || n != sizeof v) {
            free(msg);
            return group_fail(g, "rank %d sent a malformed reply", r);
        }
        memcpy(&v, msg, sizeof v);
        free(msg);
        if (v < m) m = v;
    }
    if (min_value) *min_value = m;
    return 0;
}

/* ---------------------------------------------------------------- NCCL */

/* Completes a non-blocking NCCL call, watching the peers. */
static int nccl_wait(TpGroup *g, ncclResult_t r, const char *what) {
    TRACE(g, "%s: returned %d", what, (int)r);
    double next = now_seconds() + PEER_CHECK_S;
    while (r == ncclInProgress) {
        if (!g->comm) break;
        ncclCommGetAsyncError(g->comm, &r);
        if (r != ncclInProgress) break;
        if (now_seconds() > next) {
            int rc = check_peers(g);
            if (rc) return rc;
            next = now_seconds() + PEER_CHECK_S;
        }
        sched_yield();
    }
    TRACE(g, "%s: done (%d)", what, (int)r);
    if (r != ncclSuccess && r != ncclInProgress)
        return group_fail(g, "rank %d: %s: %s (%s)", g->rank, what, ncclGetErrorString(r),
                          g->comm ? ncclGetLastError(g->comm) : "");
    return 0;
}

int tp_nccl_init(TpGroup *g, int device) {
    if (g->failed) return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return group_fail(g, "rank %d: GPU %d: %s", g->rank, device, cudaGetErrorString(ce));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    const char *bl = getenv("CVLLM_NCCL_BLOCKING"); /* 1: a blocking communicator (debugging) */
    cfg.blocking = bl && *bl == '1';
    ncclResult_t r = ncclCommInitRankConfig(&g->comm, g->size, g->id, g->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return group_fail(g, "rank %d: ncclCommInitRank: %s", g->rank, ncclGetErrorString(r));
    return nccl_wait(g, r, "ncclCommInitRank");
}

int tp_all_reduce_sum(TpGroup *g, float *buf, size_t n, cudaStream_t st) {
    if (g->failed) return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
    return nccl_wait(g, ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, g->comm, st),
                     "all-reduce");
}

int tp_gather_to_root(TpGroup *g, const float *send, float *recv, size_t n, cudaStream_t st) {
    if (g->failed) return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
    ncclResult_t r = ncclGroupStart();
    if (g->rank == 0) {
        for (int k = 1; k < g->size && (r == ncclSuccess || r == ncclInProgress); k++)
            r = ncclRecv(recv + (size_t)k * n, n, ncclFloat, k, g->comm, st);
    } else if (r == ncclSuccess || r == ncclInProgress) {
        r = ncclSend(send, n, ncclFloat, 0, g->comm, st);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = r2;
    int rc = nccl_wait(g, r, "gather of the logits");
    if (rc) return rc;
    if (g->rank == 0 && recv != send) {
        cudaError_t e = cudaMemcpyAsync(recv, send, n * sizeof(float), cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess)
            return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: copy: %s",
                                cudaGetErrorString(e));
    }
    return 0;
}

int tp_broadcast_i32(TpGroup *g, const int32_t *send, int32_t *recv, size_t n,
                     cudaStream_t st) {
    if (g->failed) return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
    return nccl_wait(g, ncclBroadcast(send, recv, n, ncclInt32, 0, g->comm, st), "broadcast");
}

/* The stream's work (ev NULL) or the work before ev done, watching the peers and NCCL */
static int wait_done(TpGroup *g, cudaStream_t st, cudaEvent_t ev) {
    double next = now_seconds() + PEER_CHECK_S, report = now_seconds() + 5;
    TRACE(g, "stream wait");
    for (;;) {
        if (g->failed) return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: %s", g->err);
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(st);
        if (e == cudaSuccess) {
            TRACE(g, "stream done");
            return 0;
        }
        if (now_seconds() > report) {
            TRACE(g, "stream still busy");
            report = now_seconds() + 5;
        }
        if (e != cudaErrorNotReady)
            return group_fail(g, "rank %d: the GPU failed: %s", g->rank, cudaGetErrorString(e));
        if (g->comm) {
            ncclResult_t r = ncclSuccess;
            ncclCommGetAsyncError(g->comm, &r);
            if (r != ncclSuccess && r != ncclInProgress)
                return group_fail(g, "rank %d: NCCL: %s", g->rank, ncclGetErrorString(r));
        }
        double t = now_seconds();
        if (t > next) {
            int rc = check_peers(g);
            if (rc) return rc;
            next = t + PEER_CHECK_S;
        }
    }
}

int tp_stream_wait(TpGroup *g, cudaStream_t st) { return wait_done(g, st, NULL); }

int tp_event_wait(TpGroup *g, cudaEvent_t ev) { return wait_done(g, NULL, ev); }

/* ---------------------------------------------------------------- close */

static void end_workers(TpGroup *g, double grace_s) {
    for (int pass = 0; pass < 2; pass++) {
        int any = 0;
        for (int r = 1; r < g->size; r++)
            if (g->pid[r] > 0) {
                if (pass == 0 && g->failed) kill(g->pid[r], SIGTERM);
                if (pass == 1) kill(g->pid[r], SIGKILL);
                any = 1;
            }
        if (!any) return;
        const double deadline = now_seconds() + grace_s;
        for (;;) {
            int left = 0;
            for (int r = 1; r < g->size; r++) {
                if (g->pid[r] <= 0) continue;
                int st;
                if (waitpid(g->pid[r], &st, WNOHANG) == g->pid[r]) g->pid[r] = 0;
                else left++;
            }
            if (!left || now_seconds() > deadline) break;
            usleep(10000);
        }
        if (pass == 1) {
            for (int r = 1; r < g->size; r++)
                if (g->pid[r] > 0) waitpid(g->pid[r], NULL, 0), g->pid[r] = 0;
        }
    }
}

void tp_group_close(TpGroup *g) {
    if (!g) return;
    if (g->rank == 0 && !g->failed)
        for (int r = 1; r < g->size; r++)
            if (g->fd[r] >= 0) send_msg(g->fd[r], TP_MSG_SHUTDOWN, NULL, 0, NULL, 0);
    /* every rank frees its communicator at the same time (NCCL synchronizes the ranks of a host
     * there); a failed group's is left alone (see group_fail) */
    if (g->comm && !g->failed) ncclCommAbort(g->comm);
    g->comm = NULL;
    if (g->rank == 0) end_workers(g, 10.0);
    for (int r = 0; r < g->size; r++)
        if (g->fd[r] >= 0) close(g->fd[r]);
    if (g->listen_fd >= 0) close(g->listen_fd);
    free(g->fd);
    free(g->pid);
    free(g);
}

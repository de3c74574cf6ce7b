/* http.c: libmicrohttpd glue (see http.h). One thread per connection: libmicrohttpd's internal
 * thread accepts, each connection's own thread reads the request, calls the handler (which may
 * block until its generation is done) and writes the response, calling a stream's reader as the
 * socket drains. */
#include "server/http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"

struct HttpServer {
    struct MHD_Daemon *d;
    HttpHandler handler;
    void *cls;
    size_t max_body;
    atomic_int active;
    int quiesced;
    MHD_socket listen_fd;
};

typedef struct {
    HttpRequest req;
    size_t cap;
    int too_large;
    int counted;
} Conn;

static int reply_error(HttpRequest *r, int status, const char *type, const char *msg) {
    json_t *j = json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", msg, "type", type, "param",
                          "code");
    return http_reply_json(r, status, j);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    HttpServer *s = cls;
    Conn *k = *con_cls;
    if (!k) {
        k = xcalloc(1, sizeof *k);
        k->req.conn = c;
        k->req.method = method;
        k->req.url = url;
        *con_cls = k;
        atomic_fetch_add(&s->active, 1);
        k->counted = 1;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->max_body) {
            k->too_large = 1;
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes", s->max_body);
            reply_error(&k->req, 413, "invalid_request_error", msg);
            return MHD_YES;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_large) {
            if (k->req.body_len + *upload_size > s->max_body) {
                k->too_large = 1;
                free(k->req.body);
                k->req.body = NULL;
                k->req.body_len = 0;
            } else {
                if (k->req.body_len + *upload_size + 1 > k->cap) {
                    k->cap = (k->req.body_len + *upload_size + 1) * 2;
                    if (k->cap > s->max_body + 1) k->cap = s->max_body + 1;
                    k->req.body = xrealloc(k->req.body, k->cap);
                }
                memcpy(k->req.body + k->req.body_len, upload, *upload_size);
                k->req.body_len += *upload_size;
                k->req.body[k->req.body_len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->req.replied) return MHD_YES; /* answered early (413 from Content-Length) */
    if (k->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes", s->max_body);
        reply_error(&k->req, 413, "invalid_request_error", msg);
        return MHD_YES;
    }
    if (!k->req.body) k->req.body = xcalloc(1, 1);
    s->handler(s->cls, &k->req);
    if (!k->req.replied) reply_error(&k->req, 500, "server_error", "the handler did not reply");
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    HttpServer *s = cls;
    Conn *k = *con_cls;
    if (!k) return;
    if (k->counted) atomic_fetch_sub(&s->active, 1);
    free(k->req.body);
    free(k);
    *con_cls = NULL;
}

HttpServer *http_start(const HttpOptions *o, HttpHandler h, void *cls) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) {
        fprintf(stderr, "cvllm serve: --host %s: %s\n", o->host, gai_strerror(gai));
        return NULL;
    }
    HttpServer *s = xcalloc(1, sizeof *s);
    s->handler = h;
    s->cls = cls;
    s->max_body = o->max_body;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->connection_timeout,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        fprintf(stderr, "cvllm serve: cannot listen on %s:%d: %s\n", o->host, o->port,
                errno ? strerror(errno) : "libmicrohttpd failed to start");
        free(s);
        return NULL;
    }
    return s;
}

int http_port(HttpServer *s) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? (int)di->port : -1;
}

void http_quiesce(HttpServer *s) {
    if (s->quiesced) return;
    s->quiesced = 1;
    s->listen_fd = MHD_quiesce_daemon(s->d);
}

int http_active_requests(HttpServer *s) { return atomic_load(&s->active); }

void http_stop(HttpServer *s) {
    if (!s) return;
    MHD_stop_daemon(s->d);
    if (s->quiesced && s->listen_fd != MHD_INVALID_SOCKET) close(s->listen_fd);
    free(s);
}

static int queue(HttpRequest *r, int status, struct MHD_Response *resp, const char *content_type) {
    if (!resp) return -1;
    if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->replied = 1;
    return ok == MHD_YES ? 0 : -1;
}

int http_reply(HttpRequest *r, int status, const char *content_type, char *body, size_t len) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) free(body);
    return queue(r, status, resp, content_type);
}

int http_reply_json(HttpRequest *r, int status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) s = xstrdup("{}");
    return http_reply(r, status, "application/json", s, strlen(s));
}

typedef struct {
    HttpStreamFn fn;
    HttpStreamFree free_fn;
    void *cls;
} Stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    Stream *st = cls;
    ssize_t n = st->fn(st->cls, buf, max);
    if (n == HTTP_STREAM_END) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n == HTTP_STREAM_ERROR || n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return n;
}

static void stream_free(void *cls) {
    Stream *st = cls;
    st->free_fn(st->cls);
    free(st);
}

int http_reply_stream(HttpRequest *r, int status, const char *content_type, HttpStreamFn fn,
                      HttpStreamFree free_fn, void *cls) {
    Stream *st = xmalloc(sizeof *st);
    st->fn = fn;
    st->free_fn = free_fn;
    st->cls = cls;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        r->replied = 1;
        return -1;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return queue(r, status, resp, content_type);
}

const char *http_header(HttpRequest *r, const char *name) {
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

int http_fd(HttpRequest *r) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

int http_fd_closed(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return 1;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return 1;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    }
    return 0;
}

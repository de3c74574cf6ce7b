/* http.h: the server's HTTP layer over libmicrohttpd: one thread per connection (so a handler may
 * block while its request generates), request bodies collected up to a limit (413 beyond it),
 * whole and streamed responses, and a check for a client that has gone away. */
#ifndef CVLLM_SERVER_HTTP_H
#define CVLLM_SERVER_HTTP_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct HttpServer HttpServer;

typedef struct {
    void *conn;          /* struct MHD_Connection * */
    const char *method;  /* "GET", "POST", ... */
    const char *url;     /* the path, without the query string */
    char *body;          /* NUL-terminated (the body may contain NUL bytes) */
    size_t body_len;
    int replied;
} HttpRequest;

/* Called once per request, after its body is read, on the connection's thread. It must reply
 * with one of the http_reply* functions (otherwise the client gets a 500). */
typedef void (*HttpHandler)(void *cls, HttpRequest *r);

/* Streamed bodies: fn writes up to max bytes into buf and returns how many (> 0), or
 * HTTP_STREAM_END (the body is complete) or HTTP_STREAM_ERROR (close the connection). It may
 * block (its connection's thread is its own). free_fn(cls) is called exactly once when the
 * response is done with, whether it completed or the client went away. */
#define HTTP_STREAM_END ((ssize_t)-1)
#define HTTP_STREAM_ERROR ((ssize_t)-2)
typedef ssize_t (*HttpStreamFn)(void *cls, char *buf, size_t max);
typedef void (*HttpStreamFree)(void *cls);

typedef struct {
    const char *host;        /* "127.0.0.1", "0.0.0.0", "::" ... */
    int port;
    size_t max_body;         /* bytes; larger bodies get 413 */
    int max_connections;
    int connection_timeout;  /* seconds of inactivity before an idle connection is closed */
} HttpOptions;

/* Starts listening; NULL (message on stderr) on failure. */
HttpServer *http_start(const HttpOptions *o, HttpHandler h, void *cls);
/* The port it listens on (the one chosen when asked for port 0). */
int http_port(HttpServer *s);
/* Stops accepting new connections (open ones continue). */
void http_quiesce(HttpServer *s);
/* Number of requests being handled (from the body read to the response's end). */
int http_active_requests(HttpServer *s);
/* Closes everything and frees. */
void http_stop(HttpServer *s);

/* Replies; body (len bytes, malloc'd) is taken over. Returns 0, or -1 if the connection failed. */
int http_reply(HttpRequest *r, int status, const char *content_type, char *body, size_t len);
int http_reply_json(HttpRequest *r, int status, json_t *j); /* takes the reference */
int http_reply_stream(HttpRequest *r, int status, const char *content_type, HttpStreamFn fn,
                      HttpStreamFree free_fn, void *cls);
/* A request header (case-insensitive name) or NULL. */
const char *http_header(HttpRequest *r, const char *name);
/* The connection's socket (for http_fd_closed). */
int http_fd(HttpRequest *r);
/* 1 if the peer of socket fd has closed its side (or the socket failed). Never blocks. */
int http_fd_closed(int fd);

#endif

/* safetensors.c: read (mmap, validate) and write .safetensors files.
 *
 * Format (https://github.com/huggingface/safetensors): u64 little-endian header length N, N bytes
 * of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then
 * the data area; offsets are relative to the start of the data area. Everything in the header is
 * checked before a tensor is handed out: the JSON, dtypes (F32/F16/BF16), shapes against byte
 * sizes (overflow-safe), offsets inside the data area, no two tensors overlapping. A tensor whose
 * data is not aligned to its element size (possible only with a hand-made, unpadded header) is
 * copied to an aligned buffer so that backends may read it as float / uint16_t arrays. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

/* The reference implementation refuses headers above 100 MB. */
#define ST_MAX_HEADER 100000000ull

typedef struct {
    StTensor t;
    int file; /* index into SafeTensors.files */
} Entry;

typedef struct {
    char *path;        /* owned; "<buffer>" for safetensors_open_buffer */
    void *map;         /* mmap base, NULL for a caller's buffer */
    size_t len;
} StFile;

struct SafeTensors {
    Entry *entries; /* sorted by name once loading is complete */
    int n, cap;
    StFile *files;
    int nfiles, files_cap;
    void **copies; /* owned aligned copies of misaligned tensors */
    int ncopies, copies_cap;
};

static int entry_cmp_name(const void *a, const void *b) {
    return strcmp(((const Entry *)a)->t.name, ((const Entry *)b)->t.name);
}

void safetensors_close(SafeTensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free(st->entries[i].t.name);
    free(st->entries);
    for (int i = 0; i < st->nfiles; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].len);
        free(st->files[i].path);
    }
    free(st->files);
    for (int i = 0; i < st->ncopies; i++) free(st->copies[i]);
    free(st->copies);
    free(st);
}

/* ---- header parsing ------------------------------------------------------------------------ */

static int parse_dtype(const char *s, DType *out) {
    if (!strcmp(s, "F32")) *out = DTYPE_F32;
    else if (!strcmp(s, "F16")) *out = DTYPE_F16;
    else if (!strcmp(s, "BF16")) *out = DTYPE_BF16;
    else return -1;
    return 0;
}

/* A non-negative JSON integer as uint64. */
static int get_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

typedef struct {
    uint64_t begin, end;
    const char *name;
} Span;

static int span_cmp(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Parses one file image buf[0..len) and appends its tensors to st as file index `file`.
 * label names the file in messages. */
static int parse_image(SafeTensors *st, const uint8_t *buf, size_t len, const char *label, int file) {
    if (len < 8)
        return cvllm_errorf(CVLLM_EFORMAT,
                            "%s: file is %zu bytes, too short for the 8-byte header length", label,
                            len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > len - 8)
        return cvllm_errorf(CVLLM_EFORMAT,
                            "%s: header length %llu runs past the end of the file (%zu bytes); "
                            "truncated or not a safetensors file",
                            label, (unsigned long long)hlen, len);
    if (hlen > ST_MAX_HEADER)
        return cvllm_errorf(CVLLM_EFORMAT, "%s: header length %llu exceeds the 100 MB limit", label,
                            (unsigned long long)hlen);
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && json_error_code(&jerr) == json_error_numeric_overflow) { /* name the field */
        char what[4200];
        snprintf(what, sizeof what, "%s: header", label);
        json_decref(cvllm_json_parse((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, what));
        return CVLLM_EFORMAT;
    }
    if (!root)
        return cvllm_errorf(CVLLM_EFORMAT, "%s: header is not valid JSON (column %d: %s)", label,
                            jerr.column, jerr.text);
    int rc = 0;
    Span *spans = NULL;
    int nspans = 0;
    int first_new = st->n;
    if (!json_is_object(root)) {
        rc = cvllm_errorf(CVLLM_EFORMAT, "%s: header is not a JSON object", label);
        goto done;
    }
    spans = xmalloc((json_object_size(root) + 1) * sizeof *spans);

    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val)) {
                rc = cvllm_errorf(CVLLM_EFORMAT, "%s: __metadata__ is not an object", label);
                goto done;
            }
            continue;
        }
        if (!json_is_object(val)) {
            rc = cvllm_errorf(CVLLM_EFORMAT, "%s: tensor %s: entry is not an object", label, key);
            goto done;
        }
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo)) {
            rc = cvllm_errorf(CVLLM_EFORMAT,
                              "%s: tensor %s: needs dtype (string), shape (list) and data_offsets "
                              "(list)",
                              label, key);
            goto done;
        }
        DType dt;
        if (parse_dtype(json_string_value(jd), &dt) < 0) {
            rc = cvllm_errorf(CVLLM_EUNSUPPORTED,
                              "%s: tensor %s: dtype %s is not supported (F32, F16, BF16 only)",
                              label, key, json_string_value(jd));
            goto done;
        }
        size_t ndim = json_array_size(js);
        if (ndim > ST_MAX_DIMS) {
            rc = cvllm_errorf(CVLLM_EUNSUPPORTED, "%s: tensor %s: %zu dimensions (at most %d)",
                              label, key, ndim, ST_MAX_DIMS);
            goto done;
        }
        StTensor t = {0};
        t.dtype = dt;
        t.ndim = (int)ndim;
        uint64_t nbytes = dtype_size(dt);
        int overflow = 0, zero = 0;
        for (size_t d = 0; d < ndim; d++) {
            uint64_t dim;
            if (get_u64(json_array_get(js, d), &dim) < 0) {
                rc = cvllm_errorf(CVLLM_EFORMAT,
                                  "%s: tensor %s: shape[%zu] is not a non-negative integer", label,
                                  key, d);
                goto done;
            }
            t.shape[d] = (int64_t)dim;
            zero |= dim == 0;
            overflow |= __builtin_mul_overflow(nbytes, dim, &nbytes);
        }
        if (zero) nbytes = 0; /* a zero dim makes the product 0 however large the rest */
        else if (overflow) {
            rc = cvllm_errorf(CVLLM_EFORMAT, "%s: tensor %s: shape overflows the byte size", label,
                              key);
            goto done;
        }
        uint64_t b, e;
        if (json_array_size(jo) != 2 || get_u64(json_array_get(jo, 0), &b) < 0 ||
            get_u64(json_array_get(jo, 1), &e) < 0 || b > e) {
            rc = cvllm_errorf(CVLLM_EFORMAT,
                              "%s: tensor %s: data_offsets must be [begin, end] with 0 <= begin <= "
                              "end",
                              label, key);
            goto done;
        }
        if (e > data_len) {
            rc = cvllm_errorf(CVLLM_EFORMAT,
                              "%s: tensor %s: data_offsets [%llu, %llu] run past the data area "
                              "(%llu bytes); truncated file?",
                              label, key, (unsigned long long)b, (unsigned long long)e,
                              (unsigned long long)data_len);
            goto done;
        }
        if (e - b != nbytes) {
            char shp[128];
            int k = snprintf(shp, sizeof shp, "[");
            for (size_t d = 0; d < ndim; d++)
                k += snprintf(shp + k, sizeof shp - k, "%s%lld", d ? ", " : "",
                              (long long)t.shape[d]);
            snprintf(shp + k, sizeof shp - k, "]");
            rc = cvllm_errorf(CVLLM_EFORMAT,
                              "%s: tensor %s: shape %s of %s needs %llu bytes, data_offsets give %llu",
                              label, key, shp, json_string_value(jd), (unsigned long long)nbytes,
                              (unsigned long long)(e - b));
            goto done;
        }
        spans[nspans++] = (Span){b, e, key};
        t.nbytes = (size_t)nbytes;
        t.data = data + b;
        if (((uintptr_t)t.data % dtype_size(dt)) != 0) {
            void *copy = xmalloc(t.nbytes);
            memcpy(copy, t.data, t.nbytes);
            DA_PUSH(st->copies, st->ncopies, st->copies_cap, copy);
            t.data = copy;
        }
        t.name = xstrdup(key);
        Entry ent = {t, file};
        DA_PUSH(st->entries, st->n, st->cap, ent);
    }

    /* No two tensors may share bytes (empty tensors share nothing). */
    if (nspans > 1) qsort(spans, nspans, sizeof *spans, span_cmp);
    uint64_t reach = 0;
    const char *reach_name = NULL;
    for (int i = 0; i < nspans; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (reach_name && spans[i].begin < reach) {
            rc = cvllm_errorf(CVLLM_EFORMAT, "%s: tensors %s and %s overlap in the data area",
                              label, reach_name, spans[i].name);
            goto done;
        }
        if (spans[i].end > reach) reach = spans[i].end, reach_name = spans[i].name;
    }

done:
    if (rc < 0) { /* drop what this file added */
        for (int i = first_new; i < st->n; i++) free(st->entries[i].t.name);
        st->n = first_new;
    }
    free(spans);
    json_decref(root);
    return rc;
}

/* Sorts by name and refuses a name defined twice (possible across shards). */
static int finish(SafeTensors *st) {
    if (st->n > 1) qsort(st->entries, st->n, sizeof *st->entries, entry_cmp_name);
    for (int i = 1; i < st->n; i++)
        if (!strcmp(st->entries[i].t.name, st->entries[i - 1].t.name))
            return cvllm_errorf(CVLLM_EFORMAT, "tensor %s is defined in both %s and %s",
                                st->entries[i].t.name, st->files[st->entries[i - 1].file].path,
                                st->files[st->entries[i].file].path);
    return 0;
}

/* mmaps path read-only and parses it into st; returns the new file's index or a negative code. */
static int add_file(SafeTensors *st, const char *path) {
    size_t len;
    int fd = file_open_regular(path, SIZE_MAX, &len); /* regular files only: never a FIFO */
    if (fd < 0) return fd;
    void *map = NULL;
    if (len >= 8) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cvllm_errorf(CVLLM_EIO, "%s: cannot mmap: %s", path, strerror(e));
        }
    }
    close(fd);
    StFile f = {xstrdup(path), map, len};
    DA_PUSH(st->files, st->nfiles, st->files_cap, f);
    static const uint8_t empty[8];
    int rc = parse_image(st, map ? (const uint8_t *)map : empty, len, path, st->nfiles - 1);
    return rc < 0 ? rc : st->nfiles - 1;
}

int safetensors_open_file(const char *path, SafeTensors **out) {
    *out = NULL;
    SafeTensors *st = xcalloc(1, sizeof *st);
    int rc = add_file(st, path);
    if (rc >= 0) rc = finish(st);
    if (rc < 0) {
        safetensors_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

int safetensors_open_buffer(const void *buf, size_t len, SafeTensors **out) {
    *out = NULL;
    SafeTensors *st = xcalloc(1, sizeof *st);
    StFile f = {xstrdup("<buffer>"), NULL, len};
    DA_PUSH(st->files, st->nfiles, st->files_cap, f);
    static const uint8_t empty[1];
    int rc = parse_image(st, buf ? buf : empty, buf ? len : 0, "<buffer>", 0);
    if (rc >= 0) rc = finish(st);
    if (rc < 0) {
        safetensors_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

/* ---- sharded checkpoints: model.safetensors.index.json ------------------------------------- */

static int open_index(const char *model_dir, const char *index_path, SafeTensors **out) {
    const char *I = "model.safetensors.index.json";
    size_t len;
    char *text = file_read(index_path, FILE_MAX_INDEX, &len);
    if (!text) return CVLLM_EIO;
    json_t *root = cvllm_json_parse(text, len, JSON_REJECT_DUPLICATES, index_path);
    free(text);
    if (!root) return CVLLM_EFORMAT;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        json_decref(root);
        return cvllm_errorf(CVLLM_EFORMAT, "%s: weight_map is missing or not an object", index_path);
    }
    SafeTensors *st = xcalloc(1, sizeof *st);
    char **shard_names = NULL; /* parallel to st->files */
    int nshards = 0, shards_cap = 0, rc = 0;
    const char *name;
    json_t *file;
    /* Pass 1: open each distinct shard once. */
    json_object_foreach(wm, name, file) {
        if (!json_is_string(file)) {
            rc = cvllm_errorf(CVLLM_EFORMAT, "%s: weight_map[%s] is not a file name", I, name);
            goto done;
        }
        const char *fn = json_string_value(file);
        if (fn[0] == '\0' || fn[0] == '/' || strstr(fn, "..")) {
            rc = cvllm_errorf(CVLLM_EFORMAT, "%s: weight_map[%s] = '%s' is not a file in the folder",
                              I, name, fn);
            goto done;
        }
        int seen = 0;
        for (int i = 0; i < nshards && !seen; i++) seen = !strcmp(shard_names[i], fn);
        if (seen) continue;
        char *p = path_join(model_dir, fn);
        rc = add_file(st, p);
        free(p);
        if (rc < 0) goto done;
        rc = 0;
        DA_PUSH(shard_names, nshards, shards_cap, (char *)fn);
    }
    if ((rc = finish(st)) < 0) goto done;
    /* Pass 2: every mapped tensor must be in the shard the index names. */
    json_object_foreach(wm, name, file) {
        const char *fn = json_string_value(file);
        Entry key = {.t = {.name = (char *)name}};
        Entry *e = st->n ? bsearch(&key, st->entries, st->n, sizeof *st->entries, entry_cmp_name)
                         : NULL;
        int shard = 0;
        while (strcmp(shard_names[shard], fn) != 0) shard++;
        if (!e || e->file != shard) {
            char *p = path_join(model_dir, fn);
            rc = cvllm_errorf(CVLLM_EFORMAT, "%s: tensor %s listed in %s is missing from that shard",
                              p, name, I);
            free(p);
            goto done;
        }
    }
done:
    free(shard_names);
    json_decref(root);
    if (rc < 0) {
        safetensors_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

int safetensors_open(const char *model_dir, SafeTensors **out) {
    *out = NULL;
    char *single = path_join(model_dir, "model.safetensors");
    char *index = path_join(model_dir, "model.safetensors.index.json");
    int rc, have_single = path_probe(single), have_index = 0;
    if (have_single == 0) have_index = path_probe(index);
    if (have_single < 0 || have_index < 0) /* a symlink loop, a dangling link: not "absent" */
        rc = CVLLM_EIO;
    else if (have_single) /* transformers prefers the single file too */
        rc = safetensors_open_file(single, out);
    else if (have_index)
        rc = open_index(model_dir, index, out);
    else
        rc = cvllm_errorf(CVLLM_EIO, "%s: no model.safetensors or model.safetensors.index.json",
                          model_dir);
    free(single);
    free(index);
    return rc;
}

const StTensor *safetensors_find(const SafeTensors *st, const char *name) {
    if (!st || st->n == 0) return NULL;
    Entry key = {.t = {.name = (char *)name}};
    Entry *e = bsearch(&key, st->entries, st->n, sizeof *st->entries, entry_cmp_name);
    return e ? &e->t : NULL;
}

int safetensors_count(const SafeTensors *st) { return st ? st->n : 0; }

const StTensor *safetensors_at(const SafeTensors *st, int i) {
    CHECK(st && i >= 0 && i < st->n, "tensor index %d out of range [0, %d)", i, st ? st->n : 0);
    return &st->entries[i].t;
}

/* ---- writing ------------------------------------------------------------------------------- */

struct StWriter {
    FILE *f;
    char *path;
    uint64_t expected, written; /* data bytes */
};

static const char *st_dtype_str(DType t) {
    switch (t) {
    case DTYPE_F32: return "F32";
    case DTYPE_F16: return "F16";
    case DTYPE_BF16: return "BF16";
    case DTYPE_FP8_E4M3: break; /* a KV cache type, never written as a weight */
    }
    return "?";
}

int safetensors_writer_begin(const char *path, const StTensor *specs, int n, StWriter **out) {
    *out = NULL;
    json_t *root = json_object();
    json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const StTensor *t = &specs[i];
        CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "tensor %s: ndim %d", t->name, t->ndim);
        CHECK(t->dtype != DTYPE_FP8_E4M3, "tensor %s: dtype %s", t->name, dtype_name(t->dtype));
        uint64_t nb = dtype_size(t->dtype);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] >= 0, "tensor %s: negative dim", t->name);
            nb *= (uint64_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        CHECK(t->nbytes == 0 || t->nbytes == nb, "tensor %s: nbytes %zu != shape size %llu",
              t->name, t->nbytes, (unsigned long long)nb);
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(st_dtype_str(t->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets",
                            json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + nb)));
        json_object_set_new(root, t->name, e);
        off += nb;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    CHECK(hdr != NULL, "json_dumps failed");
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7; /* pad with spaces to 8 bytes */
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return cvllm_errorf(CVLLM_EIO, "cannot create %s: %s", path, strerror(errno));
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenbuf, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = hlen; i < padded && ok; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    if (!ok) {
        fclose(f);
        return cvllm_errorf(CVLLM_EIO, "error writing %s: %s", path, strerror(errno));
    }
    StWriter *w = xcalloc(1, sizeof *w);
    w->f = f;
    w->path = xstrdup(path);
    w->expected = off;
    *out = w;
    return 0;
}

int safetensors_writer_append(StWriter *w, const void *data, size_t nbytes) {
    CHECK(w->written + nbytes <= w->expected, "%s: %llu bytes appended past the declared %llu",
          w->path, (unsigned long long)(w->written + nbytes), (unsigned long long)w->expected);
    if (nbytes && fwrite(data, 1, nbytes, w->f) != nbytes)
        return cvllm_errorf(CVLLM_EIO, "error writing %s: %s", w->path, strerror(errno));
    w->written += nbytes;
    return 0;
}

int safetensors_writer_finish(StWriter *w) {
    if (!w) return 0;
    int rc = 0;
    if (w->written != w->expected)
        rc = cvllm_errorf(CVLLM_EINVAL, "%s: %llu of %llu data bytes written", w->path,
                          (unsigned long long)w->written, (unsigned long long)w->expected);
    if (fclose(w->f) != 0 && rc == 0)
        rc = cvllm_errorf(CVLLM_EIO, "error writing %s: %s", w->path, strerror(errno));
    free(w->path);
    free(w);
    return rc;
}

int safetensors_write(const char *path, const StTensor *tensors, int n) {
    StWriter *w;
    int rc = safetensors_writer_begin(path, tensors, n, &w);
    if (rc < 0) return rc;
    for (int i = 0; i < n && rc == 0; i++) {
        size_t nb = dtype_size(tensors[i].dtype);
        for (int d = 0; d < tensors[i].ndim; d++) nb *= (size_t)tensors[i].shape[d];
        rc = safetensors_writer_append(w, tensors[i].data, nb);
    }
    if (rc < 0) {
        fclose(w->f);
        free(w->path);
        free(w);
        return rc;
    }
    return safetensors_writer_finish(w);
}

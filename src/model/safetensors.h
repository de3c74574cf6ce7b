/* safetensors.h: mmapped .safetensors files (one, or shards listed by
 * model.safetensors.index.json). The header is validated in full: JSON shape, dtypes, shapes,
 * offsets inside the file, no overlaps. Tensor data is used in place (no copies). */
#ifndef CVLLM_MODEL_SAFETENSORS_H
#define CVLLM_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

#define ST_MAX_DIMS 4

typedef struct {
    char *name;                 /* owned */
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;           /* points into the mmap */
    size_t nbytes;
} StTensor;

typedef struct SafeTensors SafeTensors; /* opaque: the set of mapped files and their tensors */

/* Opens model_dir/model.safetensors, or the shards named by model_dir/model.safetensors.index.json.
 * Returns 0 or a negative code (message names the file and what is wrong). */
int safetensors_open(const char *model_dir, SafeTensors **out);
/* Opens one file (for tests). */
int safetensors_open_file(const char *path, SafeTensors **out);
/* Parses a header + data already in memory (fuzzing); buf must outlive the result. */
int safetensors_open_buffer(const void *buf, size_t len, SafeTensors **out);
void safetensors_close(SafeTensors *st); /* accepts NULL */

const StTensor *safetensors_find(const SafeTensors *st, const char *name); /* NULL if absent */
int safetensors_count(const SafeTensors *st);
const StTensor *safetensors_at(const SafeTensors *st, int i);

/* Writes tensors to one .safetensors file (used by mkmodel and tests). The header carries
 * __metadata__ {"format": "pt"} (transformers expects it) and is space-padded to 8 bytes. */
int safetensors_write(const char *path, const StTensor *tensors, int n);

/* Streaming writer for files too large to hold in memory: begin writes the header from specs
 * (name, dtype, ndim, shape; data ignored), then append each tensor's bytes in the same order,
 * then finish (closes; an error if fewer bytes than declared were appended). */
typedef struct StWriter StWriter;
int safetensors_writer_begin(const char *path, const StTensor *specs, int n, StWriter **out);
int safetensors_writer_append(StWriter *w, const void *data, size_t nbytes);
int safetensors_writer_finish(StWriter *w);

#endif

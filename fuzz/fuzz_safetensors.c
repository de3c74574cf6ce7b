/* fuzz_safetensors.c: safetensors_open_buffer on arbitrary bytes must return a result or a
 * negative code, never crash or read outside the buffer. On success every tensor's bytes are
 * touched so that ASan checks the bounds the parser promised. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a heap copy of exactly `size` bytes so that overreads hit the redzone */
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    SafeTensors *st = NULL;
    if (safetensors_open_buffer(buf, size, &st) == 0) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < safetensors_count(st); i++) {
            const StTensor *t = safetensors_at(st, i);
            if (safetensors_find(st, t->name) != t) __builtin_trap();
            size_t n = dtype_size(t->dtype);
            for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
            if (n != t->nbytes) __builtin_trap();
            const uint8_t *p = t->data;
            for (size_t k = 0; k < t->nbytes; k++) sink ^= p[k];
        }
        (void)sink;
        safetensors_close(st);
    } else if (st != NULL) {
        __builtin_trap();
    }
    free(buf);
    return 0;
}

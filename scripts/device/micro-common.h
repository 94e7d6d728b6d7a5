// What the CPU micro-benchmarks (cpu-experts.c, dense-rows.c) share: a
// monotonic clock in microseconds, a xorshift generator, and random Q4_0
// weights.
#pragma once

#include "ggml.h"
#include "ggml-backend.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

// one set of the whole tensor: the repacking buffer type takes no partial sets
static void fill_random(struct ggml_tensor * t) {
    const size_t n = ggml_nbytes(t);
    uint64_t * buf = malloc(n + 8);
    for (size_t i = 0; i < (n + 7) / 8; i++) {
        // Q4_0 blocks start with an fp16 scale: keep it finite (exponent below 31)
        buf[i] = next() & 0xbfffbfffbfffbfffull;
    }
    ggml_backend_tensor_set(t, buf, 0, n);
    free(buf);
}

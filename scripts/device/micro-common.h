// What the CPU micro-benchmarks (cpu-experts.c, dense-rows.c) share: a
// monotonic clock in microseconds, a xorshift generator, random Q4_0
// weights, and the CPU backend module with its repacking buffer type.
#pragma once

#include "ggml.h"
#include "ggml-backend.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

// The CPU backend module at PATH, its registry in *REG, running THREADS
// threads; NULL (with a message) where it cannot be loaded
static ggml_backend_t load_cpu(const char * path, int n_threads, ggml_backend_reg_t * reg) {
    *reg = ggml_backend_load(path);
    if (*reg == NULL) {
        fprintf(stderr, "cannot load %s\n", path);
        return NULL;
    }
    ggml_backend_t cpu = ggml_backend_dev_init(ggml_backend_reg_dev_get(*reg, 0), NULL);
    ((ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(*reg, "ggml_backend_set_n_threads"))(cpu, n_threads);
    return cpu;
}

// The module's repacking buffer type (the last extra one named *REPACK*), or
// FALLBACK where it has none
static ggml_backend_buffer_type_t repack_buft(ggml_backend_reg_t reg, ggml_backend_buffer_type_t fallback) {
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * e = get_extra ? get_extra(ggml_backend_reg_dev_get(reg, 0)) : NULL; e && *e; e++) {
        if (strstr(ggml_backend_buft_name(*e), "REPACK")) {
            fallback = *e;
        }
    }
    return fallback;
}

// What the CPU's share of a MoE layer costs in decode, split into its parts.
// Builds the CPU part of a hybrid-experts layer as llama.cpp's build_moe_ffn
// does with patch 0006 (Qwen3-30B-A3B shape in Q4_0: up and gate
// 2048 -> 768, down 768 -> 2048, 128 experts; k of them for one token, chosen
// at random each time), and times ggml_backend_graph_compute on the CPU
// backend module:
//   moe     up, gate, swiglu, down, weights, the sum over the k experts
//   mmid    up, gate, swiglu, down (no weights, no sum)
//   up      one MUL_MAT_ID
//   addN    N chained ADDs of 2048 floats (what a graph and its barriers cost)
// Between two graphs the host spins GAP us, as it waits for the GPU in a step.
//   gcc -O2 -I<ggml>/include cpu-experts.c -L<lib> -lggml -lggml-base -o cpu-experts
//   cpu-experts CPU_MODULE.so THREADS ITERS GAP_US [plain|plain-thp|repack|repack-thp]
// With "repack" the experts live in the CPU module's repacking buffer type
// (Q4_0 interleaved 8x8 for its AVX2/AVX-512 GEMV), as llama.cpp's CPU-only
// loads do, instead of a plain host buffer as the hybrid experts' are;
// "-thp" asks for transparent huge pages for them (madvise).
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "micro-common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

enum { N_EMBD = 2048, N_FF = 768, N_EXPERT = 128, N_USED = 8 };

struct bench {
    ggml_backend_t       cpu;
    struct ggml_tensor * up, * gate, * down, * cur, * sel, * weights;
    int                  iters;
    double               gap_us;
};

// times one graph over the iterations, new experts each time; prints mean and median
static void run(struct bench * b, const char * name, int k, int n_mat, struct ggml_cgraph * gf, struct ggml_gallocr * ga) {
    if (!ggml_gallocr_alloc_graph(ga, gf)) {
        fprintf(stderr, "%s: graph allocation failed\n", name);
        exit(1);
    }
    double * t = malloc(sizeof(double) * b->iters);
    for (int it = -20; it < b->iters; it++) {
        int32_t ids[N_USED];
        for (int i = 0; i < N_USED; i++) {
            int e, dup;
            do {
                e = (int) (next() % N_EXPERT);
                dup = 0;
                for (int j = 0; j < i; j++) dup |= ids[j] == e;
            } while (dup);
            ids[i] = e;
        }
        ggml_backend_tensor_set(b->sel, ids, 0, sizeof(ids));
        const double g0 = now_us();
        while (now_us() - g0 < b->gap_us) {
        }
        const double t0 = now_us();
        if (ggml_backend_graph_compute(b->cpu, gf) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "%s: compute failed\n", name);
            exit(1);
        }
        if (it >= 0) {
            t[it] = now_us() - t0;
        }
    }
    double sum = 0;
    for (int i = 0; i < b->iters; i++) sum += t[i];
    qsort(t, b->iters, sizeof(double), cmp_double);
    const double mb = (double) k * n_mat * ggml_nbytes(b->up) / N_EXPERT / 1e6;
    printf("%-6s k=%d nodes=%3d: mean %7.1f us, median %7.1f us, p90 %7.1f us", name, k, ggml_graph_n_nodes(gf),
           sum / b->iters, t[b->iters / 2], t[b->iters * 9 / 10]);
    if (k > 0) {
        printf(", %.1f GB/s of experts at the median", mb * 1e3 / t[b->iters / 2]);
    }
    printf("\n");
    free(t);
}

static struct ggml_context * graph_ctx(void) {
    struct ggml_init_params p = { ggml_tensor_overhead() * 256 + ggml_graph_overhead(), NULL, true };
    return ggml_init(p);
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s CPU_MODULE.so THREADS ITERS GAP_US\n", argv[0]);
        return 2;
    }
    const int n_threads = atoi(argv[2]);
    ggml_backend_reg_t reg;
    struct bench b = { 0 };
    b.cpu = load_cpu(argv[1], n_threads, &reg);
    if (b.cpu == NULL) {
        return 1;
    }
    b.iters  = atoi(argv[3]);
    b.gap_us = atof(argv[4]);
    printf("%s, %d threads, %d iterations, %.0f us between graphs\n", ggml_backend_name(b.cpu), n_threads, b.iters, b.gap_us);

    struct ggml_init_params wp = { ggml_tensor_overhead() * 16, NULL, true };
    struct ggml_context * wctx = ggml_init(wp);
    b.up      = ggml_new_tensor_3d(wctx, GGML_TYPE_Q4_0, N_EMBD, N_FF, N_EXPERT);
    b.gate    = ggml_new_tensor_3d(wctx, GGML_TYPE_Q4_0, N_EMBD, N_FF, N_EXPERT);
    b.down    = ggml_new_tensor_3d(wctx, GGML_TYPE_Q4_0, N_FF, N_EMBD, N_EXPERT);
    ggml_backend_buffer_type_t wbuft = ggml_backend_get_default_buffer_type(b.cpu);
    if (argc > 5 && strncmp(argv[5], "repack", 6) == 0) {
        wbuft = repack_buft(reg, wbuft);
    }
    printf("experts in %s\n", ggml_backend_buft_name(wbuft));
    // the experts in one buffer, the activations, ids and weights in a plain one
    struct ggml_init_params ap = { ggml_tensor_overhead() * 8, NULL, true };
    struct ggml_context * actx = ggml_init(ap);
    b.cur     = ggml_new_tensor_3d(actx, GGML_TYPE_F32, N_EMBD, 1, 1);
    b.sel     = ggml_new_tensor_2d(actx, GGML_TYPE_I32, N_USED, 1);
    b.weights = ggml_new_tensor_3d(actx, GGML_TYPE_F32, 1, N_USED, 1);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft);
    ggml_backend_buffer_t abuf = ggml_backend_alloc_ctx_tensors(actx, b.cpu);
    if (wbuf == NULL || abuf == NULL) {
        fprintf(stderr, "cannot allocate the weights\n");
        return 1;
    }
    if (argc > 5 && strstr(argv[5], "-thp")) {
        // huge pages for the experts, before the first touch (as patch 0039 asks for its copies)
        const uintptr_t page  = 2u << 20;
        const uintptr_t base  = (uintptr_t) ggml_backend_buffer_get_base(wbuf);
        const uintptr_t begin = (base + page - 1) & ~(page - 1);
        const uintptr_t end   = (base + ggml_backend_buffer_get_size(wbuf)) & ~(page - 1);
        printf("madvise(MADV_HUGEPAGE): %d\n", end > begin ? madvise((void *) begin, end - begin, MADV_HUGEPAGE) : -1);
    }
    fill_random(b.up);
    fill_random(b.gate);
    fill_random(b.down);
    float x[N_EMBD], w[N_USED];
    for (int i = 0; i < N_EMBD; i++) x[i] = (float) (next() % 2000) / 1000.0f - 1.0f;
    for (int i = 0; i < N_USED; i++) w[i] = 1.0f / N_USED;
    ggml_backend_tensor_set(b.cur, x, 0, sizeof(x));
    ggml_backend_tensor_set(b.weights, w, 0, sizeof(w));

    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(b.cpu));
    for (int variant = 0; variant < 3; variant++) {
        static const char * names[] = { "moe", "mmid", "up" };
        for (int k = 1; k <= 4; k++) {
            struct ggml_context * ctx = graph_ctx();
            struct ggml_cgraph * gf = ggml_new_graph(ctx);
            struct ggml_tensor * ids = ggml_view_2d(ctx, b.sel, k, 1, b.sel->nb[1], (N_USED - k) * b.sel->nb[0]);
            struct ggml_tensor * wk  = ggml_view_3d(ctx, b.weights, 1, k, 1, b.weights->nb[1], b.weights->nb[2],
                    (N_USED - k) * b.weights->nb[1]);
            struct ggml_tensor * out = ggml_mul_mat_id(ctx, b.up, b.cur, ids);
            if (variant < 2) {
                struct ggml_tensor * gate = ggml_mul_mat_id(ctx, b.gate, b.cur, ids);
                struct ggml_tensor * act  = ggml_swiglu_split(ctx, gate, out);
                out = ggml_mul_mat_id(ctx, b.down, act, ids);
            }
            if (variant == 0) {
                out = ggml_mul(ctx, out, wk);
                struct ggml_tensor * sum = NULL;
                for (int i = 0; i < k; i++) {
                    struct ggml_tensor * e = ggml_view_2d(ctx, out, N_EMBD, 1, out->nb[2], i * out->nb[1]);
                    sum = sum ? ggml_add(ctx, sum, e) : e;
                    if (k == 1) sum = ggml_cont(ctx, sum);
                }
                out = sum;
            }
            ggml_build_forward_expand(gf, out);
            run(&b, names[variant], k, variant < 2 ? 3 : 1, gf, ga);
            ggml_free(ctx);
        }
    }
    for (int n = 1; n <= 16; n *= 4) {
        struct ggml_context * ctx = graph_ctx();
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        struct ggml_tensor * v = ggml_reshape_1d(ctx, b.cur, N_EMBD);
        struct ggml_tensor * x = ggml_reshape_1d(ctx, b.cur, N_EMBD);
        for (int i = 0; i < n; i++) v = ggml_add(ctx, v, x);
        ggml_build_forward_expand(gf, v);
        char name[16];
        snprintf(name, sizeof(name), "add%d", n);
        run(&b, name, 0, 0, gf, ga);
        ggml_free(ctx);
    }
    ggml_gallocr_free(ga);
    ggml_backend_buffer_free(wbuf);
    ggml_backend_buffer_free(abuf);
    ggml_free(wctx);
    ggml_free(actx);
    ggml_backend_free(b.cpu);
    return 0;
}

// What the CPU's part of a dense row split (patch 0017) costs in decode, per
// token. Builds the CPU's rows of every layer of a Llama-3.1-8B shape in
// Q4_0 (up and gate 4096 -> 14336, down 14336 -> 4096, 32 layers) and times
// ggml_backend_graph_compute on the CPU backend module, one token at a time:
//   rows   per layer two graphs, as patch 0017 splits them: the CPU's rows of
//          up and gate, then (after a gap) its rows of down
//   cols   per layer one graph: the CPU's rows of up and gate, the SwiGLU, and
//          the matching columns of down (a column split of down)
// SHARE is the CPU's share of each weight's rows (of up, gate and down).
// Between two graphs the host spins GAP us, as it waits for the GPU in a step.
//   gcc -O2 -I<ggml>/include dense-rows.c -L<lib> -lggml -lggml-base -lm -o dense-rows
//   dense-rows CPU_MODULE.so THREADS TOKENS GAP_US plain|repack SHARE
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "micro-common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>

enum { N_EMBD = 4096, N_FF = 14336, N_LAYER = 32 };

static struct ggml_context * graph_ctx(void) {
    struct ggml_init_params p = { ggml_tensor_overhead() * 64 + ggml_graph_overhead(), NULL, true };
    return ggml_init(p);
}

// The largest difference between the repacked and the plain kernels' products of the same random K x ROWS
// weights, relative to the largest product
static double check_repack(ggml_backend_t cpu, ggml_backend_buffer_type_t repack, int64_t k, int64_t rows, const float * xv) {
    struct ggml_init_params p = { ggml_tensor_overhead() * 2, NULL, true };
    struct ggml_context * cw = ggml_init(p), * cr = ggml_init(p), * cx = ggml_init(p);
    struct ggml_tensor * w_plain = ggml_new_tensor_2d(cw, GGML_TYPE_Q4_0, k, rows);
    struct ggml_tensor * w_rep   = ggml_new_tensor_2d(cr, GGML_TYPE_Q4_0, k, rows);
    struct ggml_tensor * x       = ggml_new_tensor_1d(cx, GGML_TYPE_F32, k);
    ggml_backend_buffer_t bw = ggml_backend_alloc_ctx_tensors(cw, cpu);
    ggml_backend_buffer_t br = ggml_backend_alloc_ctx_tensors_from_buft(cr, repack);
    ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, cpu);
    fill_random(w_plain);
    void * raw = malloc(ggml_nbytes(w_plain));
    ggml_backend_tensor_get(w_plain, raw, 0, ggml_nbytes(w_plain));
    ggml_backend_tensor_set(w_rep, raw, 0, ggml_nbytes(w_rep));
    free(raw);
    ggml_backend_tensor_set(x, xv, 0, sizeof(float) * k);
    struct ggml_context * cg = graph_ctx();
    struct ggml_cgraph * gf = ggml_new_graph(cg);
    struct ggml_tensor * yp = ggml_mul_mat(cg, w_plain, x);
    struct ggml_tensor * yr = ggml_mul_mat(cg, w_rep, x);
    ggml_build_forward_expand(gf, yp);
    ggml_build_forward_expand(gf, yr);
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(cpu));
    double rel = -1;
    if (ggml_gallocr_alloc_graph(ga, gf) && ggml_backend_graph_compute(cpu, gf) == GGML_STATUS_SUCCESS) {
        float * a = malloc(sizeof(float) * rows), * b = malloc(sizeof(float) * rows);
        ggml_backend_tensor_get(yp, a, 0, sizeof(float) * rows);
        ggml_backend_tensor_get(yr, b, 0, sizeof(float) * rows);
        double d = 0, m = 0;
        for (int64_t i = 0; i < rows; i++) {
            d = fmax(d, fabs((double) a[i] - b[i]));
            m = fmax(m, fabs((double) a[i]));
        }
        rel = m > 0 ? d / m : d;
        free(a);
        free(b);
    }
    ggml_gallocr_free(ga);
    ggml_free(cg);
    ggml_backend_buffer_free(bw);
    ggml_backend_buffer_free(br);
    ggml_backend_buffer_free(bx);
    ggml_free(cw);
    ggml_free(cr);
    ggml_free(cx);
    return rel;
}

int main(int argc, char ** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s CPU_MODULE.so THREADS TOKENS GAP_US plain|repack SHARE\n", argv[0]);
        return 2;
    }
    const int    n_threads = atoi(argv[2]);
    const int    n_tokens  = atoi(argv[3]);
    const double gap_us    = atof(argv[4]);
    const double share     = atof(argv[6]);
    ggml_backend_reg_t reg;
    ggml_backend_t cpu = load_cpu(argv[1], n_threads, &reg);
    if (cpu == NULL) {
        return 1;
    }
    ggml_backend_buffer_type_t wbuft = ggml_backend_get_default_buffer_type(cpu);
    if (strcmp(argv[5], "repack") == 0) {
        wbuft = repack_buft(reg, wbuft);
    }
    // rows of up and gate (and columns of down) in multiples of 256, rows of down in multiples of 8 (the
    // repacked layout's interleave)
    const int64_t r_ff   = ((int64_t) (N_FF * share) + 255) / 256 * 256;
    const int64_t r_embd = ((int64_t) (N_EMBD * share) + 7) / 8 * 8;
    const int64_t c_ff   = r_ff;
    printf("%s, %d threads, weights in %s, CPU share %.2f: up/gate %lld rows, down %lld rows (rows) or %lld columns (cols), gap %.0f us\n",
           ggml_backend_name(cpu), n_threads, ggml_backend_buft_name(wbuft), share, (long long) r_ff, (long long) r_embd,
           (long long) c_ff, gap_us);

    struct ggml_init_params wp = { ggml_tensor_overhead() * 4 * N_LAYER, NULL, true };
    struct ggml_context * wctx = ggml_init(wp);
    struct ggml_tensor * up[N_LAYER], * gate[N_LAYER], * down_r[N_LAYER], * down_c[N_LAYER];
    for (int l = 0; l < N_LAYER; l++) {
        up[l]     = ggml_new_tensor_2d(wctx, GGML_TYPE_Q4_0, N_EMBD, r_ff);
        gate[l]   = ggml_new_tensor_2d(wctx, GGML_TYPE_Q4_0, N_EMBD, r_ff);
        down_r[l] = ggml_new_tensor_2d(wctx, GGML_TYPE_Q4_0, N_FF, r_embd);
        down_c[l] = ggml_new_tensor_2d(wctx, GGML_TYPE_Q4_0, c_ff, N_EMBD);
    }
    struct ggml_init_params ap = { ggml_tensor_overhead() * 4, NULL, true };
    struct ggml_context * actx = ggml_init(ap);
    struct ggml_tensor * x = ggml_new_tensor_1d(actx, GGML_TYPE_F32, N_EMBD);
    struct ggml_tensor * h = ggml_new_tensor_1d(actx, GGML_TYPE_F32, N_FF);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft);
    ggml_backend_buffer_t abuf = ggml_backend_alloc_ctx_tensors(actx, cpu);
    if (wbuf == NULL || abuf == NULL) {
        fprintf(stderr, "cannot allocate the weights\n");
        return 1;
    }
    for (int l = 0; l < N_LAYER; l++) {
        fill_random(up[l]);
        fill_random(gate[l]);
        fill_random(down_r[l]);
        fill_random(down_c[l]);
    }
    static float xv[N_FF];
    for (int i = 0; i < N_FF; i++) xv[i] = (float) (next() % 2000) / 1000.0f - 1.0f;
    ggml_backend_tensor_set(x, xv, 0, sizeof(float) * N_EMBD);
    ggml_backend_tensor_set(h, xv, 0, sizeof(float) * N_FF);

    if (wbuft != ggml_backend_get_default_buffer_type(cpu)) {
        // the repacked kernels against the plain ones (must be float rounding, ~1e-6)
        printf("check: repacked against plain, largest difference / largest value: up %.2e, down %.2e\n",
               check_repack(cpu, wbuft, N_EMBD, r_ff, xv), check_repack(cpu, wbuft, N_FF, r_embd, xv));
    }

    const double rows_bytes = (double) N_LAYER * (ggml_nbytes(up[0]) + ggml_nbytes(gate[0]) + ggml_nbytes(down_r[0]));
    const double cols_bytes = (double) N_LAYER * (ggml_nbytes(up[0]) + ggml_nbytes(gate[0]) + ggml_nbytes(down_c[0]));
    for (int mode = 0; mode < 2; mode++) {
        // per layer: rows = graph 0 (up, gate), graph 1 (down); cols = graph 0 (the whole part)
        const int n_g = mode == 0 ? 2 : 1;
        struct ggml_context * ctx[N_LAYER][2];
        struct ggml_cgraph * gf[N_LAYER][2];
        ggml_gallocr_t ga[N_LAYER][2];
        for (int l = 0; l < N_LAYER; l++) {
            for (int g = 0; g < n_g; g++) {
                ctx[l][g] = graph_ctx();
                gf[l][g]  = ggml_new_graph(ctx[l][g]);
                struct ggml_tensor * out;
                if (mode == 0 && g == 1) {
                    out = ggml_mul_mat(ctx[l][g], down_r[l], h);
                } else {
                    struct ggml_tensor * u  = ggml_mul_mat(ctx[l][g], up[l], x);
                    struct ggml_tensor * gt = ggml_mul_mat(ctx[l][g], gate[l], x);
                    if (mode == 0) {
                        ggml_build_forward_expand(gf[l][g], u);
                        out = gt;
                    } else {
                        out = ggml_mul_mat(ctx[l][g], down_c[l], ggml_swiglu_split(ctx[l][g], gt, u));
                    }
                }
                ggml_build_forward_expand(gf[l][g], out);
                ga[l][g] = ggml_gallocr_new(ggml_backend_get_default_buffer_type(cpu));
                if (!ggml_gallocr_alloc_graph(ga[l][g], gf[l][g])) {
                    fprintf(stderr, "graph allocation failed\n");
                    return 1;
                }
            }
        }
        double busy = 0, wall0 = 0;
        for (int t = -2; t < n_tokens; t++) {
            if (t == 0) {
                busy  = 0;
                wall0 = now_us();
            }
            for (int l = 0; l < N_LAYER; l++) {
                for (int g = 0; g < n_g; g++) {
                    const double g0 = now_us();
                    while (now_us() - g0 < gap_us) {
                    }
                    const double t0 = now_us();
                    if (ggml_backend_graph_compute(cpu, gf[l][g]) != GGML_STATUS_SUCCESS) {
                        fprintf(stderr, "compute failed\n");
                        return 1;
                    }
                    busy += now_us() - t0;
                }
            }
        }
        const double wall  = now_us() - wall0;
        const double bytes = mode == 0 ? rows_bytes : cols_bytes;
        printf("%-4s %.3f GB per token: computing %.2f ms per token (%.1f GB/s), with the gaps %.2f ms\n",
               mode == 0 ? "rows" : "cols", bytes / 1e9, busy / n_tokens / 1e3, bytes / (busy / n_tokens) / 1e3,
               wall / n_tokens / 1e3);
        for (int l = 0; l < N_LAYER; l++) {
            for (int g = 0; g < n_g; g++) {
                ggml_gallocr_free(ga[l][g]);
                ggml_free(ctx[l][g]);
            }
        }
    }
    ggml_backend_buffer_free(wbuf);
    ggml_backend_buffer_free(abuf);
    ggml_free(wctx);
    ggml_free(actx);
    ggml_backend_free(cpu);
    return 0;
}

// The CPU's batch-1 GEMV (MUL_MAT, and MUL_MAT_ID over routed experts) per
// weight type, through ggml's CPU backend with the buffer type pipeshard's
// placement gives host weights: the CPU's repacking buffer type where it
// takes the type (patch 0039's copies), else plain host memory. Prints the
// rate in the weight's file bytes per second, and checks each repacked
// product against the plain buffer's (ggml's reference path).
//
//   gemv-bench [-t THREADS] [-g GIB] [-s SECONDS] [TYPE...]
//     TYPE: q4_0 q4_K q6_K q8_0 mxfp4 (default: all)
//     -g: weights allocated per case, in GiB (default 1: more than a
//         last-level cache holds, so a repetition reads them from memory,
//         as decode does)
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct shape {
    const char * name;
    int64_t k, n;        // row length, rows
    int64_t n_expert;    // 0: dense MUL_MAT
    int64_t n_used;
};

static const shape shapes[] = {
    { "4096x14336",      4096, 14336, 0,   0 },
    { "14336x4096",     14336,  4096, 0,   0 },
    { "exp 2048x768",    2048,   768, 32,  8 },
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand() {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float) ((rng >> 40) / (double) (1ull << 24)) - 0.5f;
}

static ggml_backend_buffer_type_t repack_buft(ggml_backend_t cpu) {
    ggml_backend_dev_t dev = ggml_backend_get_device(cpu);
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get ? get(dev) : nullptr; b && *b; b++) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) {
            return *b;
        }
    }
    return nullptr;
}

struct bench {
    ggml_context * ctx = nullptr, * wctx = nullptr;  // the graph's tensors; the weights
    ggml_backend_buffer_t wbuf = nullptr, abuf = nullptr;
    ggml_cgraph * graph = nullptr;
    std::vector<ggml_tensor *> w, out;
    ggml_tensor * x = nullptr, * ids = nullptr;
    ~bench() {
        if (wbuf) ggml_backend_buffer_free(wbuf);
        if (abuf) ggml_backend_buffer_free(abuf);
        if (ctx) ggml_free(ctx);
        if (wctx) ggml_free(wctx);
    }
};

enum built { BUILT, NO_MEMORY, NOT_TAKEN };

// layers weights of shape s and type t in buft (null: plain CPU memory), the same quantized data in each; NOT_TAKEN
// where buft's kernels do not compute the product
static built build(bench & b, ggml_type t, const shape & s, int layers, ggml_backend_buffer_type_t buft,
                  const std::vector<uint8_t> & data, int64_t tokens) {
    ggml_init_params p = { ggml_tensor_overhead() * (3 * layers + 4) + ggml_graph_overhead() + 1024, nullptr, true };
    b.ctx = ggml_init(p);
    const int64_t ne2 = s.n_expert ? s.n_expert : 1;
    b.x = s.n_expert ? ggml_new_tensor_3d(b.ctx, GGML_TYPE_F32, s.k, s.n_used, tokens) : ggml_new_tensor_2d(b.ctx, GGML_TYPE_F32, s.k, tokens);
    if (s.n_expert) {
        b.ids = ggml_new_tensor_2d(b.ctx, GGML_TYPE_I32, s.n_used, tokens);
    }
    ggml_init_params wp = { ggml_tensor_overhead() * (layers + 1), nullptr, true };
    b.wctx = ggml_init(wp);
    for (int l = 0; l < layers; l++) {
        b.w.push_back(ggml_new_tensor_3d(b.wctx, t, s.k, s.n, ne2));
    }
    b.wbuf = ggml_backend_alloc_ctx_tensors_from_buft(b.wctx, buft ? buft : ggml_backend_cpu_buffer_type());
    if (!b.wbuf) {
        return NO_MEMORY;
    }
    b.graph = ggml_new_graph(b.ctx);
    for (int l = 0; l < layers; l++) {
        ggml_tensor * y = s.n_expert ? ggml_mul_mat_id(b.ctx, b.w[l], b.x, b.ids) : ggml_mul_mat(b.ctx, b.w[l], b.x);
        b.out.push_back(y);
        ggml_build_forward_expand(b.graph, y);
    }
    if (buft && !ggml_backend_dev_supports_op(ggml_backend_buft_get_device(buft), b.out[0])) {
        return NOT_TAKEN;
    }
    for (int l = 0; l < layers; l++) {
        ggml_backend_tensor_set(b.w[l], data.data(), 0, ggml_nbytes(b.w[l]));
    }
    b.abuf = ggml_backend_alloc_ctx_tensors_from_buft(b.ctx, ggml_backend_cpu_buffer_type());
    std::vector<float> xv(ggml_nelements(b.x));
    for (float & v : xv) v = frand();
    ggml_backend_tensor_set(b.x, xv.data(), 0, ggml_nbytes(b.x));
    if (b.ids) {
        std::vector<int32_t> iv;
        for (int64_t i = 0; i < tokens; i++) {
            const size_t first = iv.size();
            while ((int64_t) (iv.size() - first) < s.n_used) {
                int32_t e = (int32_t) ((rng = rng * 6364136223846793005ull + 1) >> 33) % (int32_t) s.n_expert;
                if (std::find(iv.begin() + first, iv.end(), e) == iv.end()) iv.push_back(e);
            }
        }
        ggml_backend_tensor_set(b.ids, iv.data(), 0, iv.size() * 4);
    }
    return BUILT;
}

static double seconds_per_layer(ggml_backend_t cpu, bench & b, int layers, double min_s) {
    ggml_backend_graph_compute(cpu, b.graph);
    double best = 1e30;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 3 || std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < min_s; r++) {
        auto t = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(cpu, b.graph);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
    }
    return best / layers;
}

static std::vector<float> result(bench & b) {
    std::vector<float> y(ggml_nelements(b.out[0]));
    ggml_backend_tensor_get(b.out[0], y.data(), 0, y.size() * 4);
    return y;
}

int main(int argc, char ** argv) {
    int threads = 2;
    double gib = 1.0, min_s = 1.0;
    std::vector<std::string> names;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-g") && i + 1 < argc) gib = atof(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) min_s = atof(argv[++i]);
        else names.push_back(argv[i]);
    }
    if (names.empty()) names = { "q4_0", "q4_K", "q6_K", "q8_0", "mxfp4" };
    ggml_cpu_init();
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, threads);
    ggml_backend_buffer_type_t repack = repack_buft(cpu);
    printf("threads %d, %.2f GiB of weights per repetition\n", threads, gib);
    printf("%-6s %-13s %-10s %10s %10s %12s\n", "type", "shape", "buffer", "us/weight", "GB/s", "check");
    int failures = 0;
    for (const std::string & name : names) {
        ggml_type t = GGML_TYPE_COUNT;
        for (int i = 0; i < GGML_TYPE_COUNT; i++) {
            const char * tn = ggml_type_name((ggml_type) i);
            if (tn && strcasecmp(tn, name.c_str()) == 0) t = (ggml_type) i;
        }
        if (t == GGML_TYPE_COUNT) {
            fprintf(stderr, "unknown type %s\n", name.c_str());
            return 1;
        }
        for (const shape & s : shapes) {
            const int64_t ne2 = s.n_expert ? s.n_expert : 1;
            const size_t wbytes = ggml_row_size(t, s.k) * s.n * ne2;
            const size_t read = ggml_row_size(t, s.k) * s.n * (s.n_expert ? s.n_used : 1);
            const int layers = (int) std::max<double>(2, std::min<double>(64, gib * (1 << 30) / wbytes));
            // up to 1 Mi random values, quantized once and tiled over the rows (the rate does not depend on them)
            const int64_t qrows = std::min<int64_t>(s.n, std::max<int64_t>(8, (1 << 20) / s.k));
            std::vector<float> f(s.k * qrows);
            for (float & v : f) v = 0.1f * frand();
            std::vector<uint8_t> data(wbytes);
            const size_t qbytes = ggml_quantize_chunk(t, f.data(), data.data(), 0, qrows, s.k, nullptr);
            for (size_t off = qbytes; off < wbytes; off += qbytes) {
                memcpy(data.data() + off, data.data(), std::min(qbytes, wbytes - off));
            }
            // batch 1, timed; then a batch of 5 (4 rows through the GEMM, 1 through the GEMV), checked only
            for (int64_t tokens : { 1, 5 }) {
                std::vector<float> ref;
                for (int pass = 0; pass < 2; pass++) {
                    ggml_backend_buffer_type_t buft = pass ? repack : nullptr;
                    if (pass && !buft) break;
                    bench b;
                    rng = 12345;  // the same activations and experts in both passes
                    const int nl = tokens == 1 ? layers : 1;
                    const built r = build(b, t, s, nl, buft, data, tokens);
                    if (r != BUILT) {
                        printf("%-6s %-13s %-10s %10s\n", name.c_str(), s.name, pass ? "repack" : "plain",
                               r == NO_MEMORY ? "(no memory)" : "(not taken)");
                        continue;
                    }
                    const double sec = tokens == 1 ? seconds_per_layer(cpu, b, nl, min_s) : (ggml_backend_graph_compute(cpu, b.graph), 0.0);
                    char check[32] = "ref";
                    if (pass) {
                        std::vector<float> y = result(b);
                        double diff = 0, top = 0;
                        for (size_t i = 0; i < y.size(); i++) {
                            diff = std::max(diff, (double) std::fabs(y[i] - ref[i]));
                            top = std::max(top, (double) std::fabs(ref[i]));
                        }
                        const bool ok = diff <= 1e-3 * top + 1e-6;
                        failures += !ok;
                        snprintf(check, sizeof(check), "%s %.1e", ok ? "ok" : "FAIL", top > 0 ? diff / top : diff);
                    } else {
                        ref = result(b);
                    }
                    const char * where = pass ? "repack" : "plain";
                    if (tokens == 1) {
                        printf("%-6s %-13s %-10s %10.1f %10.2f %12s\n", name.c_str(), s.name, where, sec * 1e6, read / sec / 1e9, check);
                    } else if (pass) {
                        printf("%-6s %-13s %-10s %10s %10s %12s\n", name.c_str(), s.name, "repack x5", "", "", check);
                    }
                    fflush(stdout);
                }
            }
        }
    }
    ggml_backend_free(cpu);
    return failures ? 2 : 0;
}

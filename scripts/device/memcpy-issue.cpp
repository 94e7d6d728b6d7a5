// What issuing a decode step's expert copies costs the host: N copies of one
// expert tensor each (Qwen3-30B-A3B in Q4_0: 768 x 2048 -> 884736 bytes), from
// scattered places of a pinned host buffer to a device buffer, on two streams
// taken in turn (as patch 0031 does), one call each, against the same copies
// issued in batches of a layer's experts (cudaMemcpyBatchAsync, CUDA >= 12.8).
// Prints the host's time to issue them and the time until the device is done.
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include memcpy-issue.cpp -L/usr/local/cuda/lib64 -lcudart
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char ** argv) {
    const size_t expert = 884736;
    const int    n      = argc > 1 ? atoi(argv[1]) : 640;   // copies per step
    const int    batch  = argc > 2 ? atoi(argv[2]) : 15;    // copies per layer
    const size_t host_n = 384;                              // experts in the host buffer
    char * host = nullptr;
    char * dev  = nullptr;
    CHECK(cudaHostAlloc((void **) &host, host_n * expert, cudaHostAllocDefault));
    CHECK(cudaMalloc((void **) &dev, 64 * expert));
    for (size_t i = 0; i < host_n * expert; i += 4096) {
        host[i] = (char) i;
    }
    cudaStream_t s[2];
    CHECK(cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking));
    std::vector<size_t> src(n);
    srand(1);
    for (int i = 0; i < n; i++) {
        src[i] = (size_t) (rand() % host_n) * expert;
    }

    for (int rep = 0; rep < 4; rep++) {
        // one call per copy, streams in turn
        double t0 = now_us();
        for (int i = 0; i < n; i++) {
            CHECK(cudaMemcpyAsync(dev + (i % 64) * expert, host + src[i], expert, cudaMemcpyHostToDevice, s[i & 1]));
        }
        double t1 = now_us();
        CHECK(cudaStreamSynchronize(s[0]));
        CHECK(cudaStreamSynchronize(s[1]));
        double t2 = now_us();
        printf("single  n=%d: issue %.0f us (%.2f us per copy), done after %.0f us, %.1f GB/s\n", n, t1 - t0,
               (t1 - t0) / n, t2 - t0, n * expert / (t2 - t0) / 1e3);

        // one call per copy, one stream
        t0 = now_us();
        for (int i = 0; i < n; i++) {
            CHECK(cudaMemcpyAsync(dev + (i % 64) * expert, host + src[i], expert, cudaMemcpyHostToDevice, s[0]));
        }
        t1 = now_us();
        CHECK(cudaStreamSynchronize(s[0]));
        t2 = now_us();
        printf("single1 n=%d: issue %.0f us (%.2f us per copy), done after %.0f us, %.1f GB/s\n", n, t1 - t0,
               (t1 - t0) / n, t2 - t0, n * expert / (t2 - t0) / 1e3);

#if CUDART_VERSION >= 12080
        // batches of a layer's copies, streams in turn
        std::vector<void *>       dsts(batch);
        std::vector<const void *> srcs(batch);
        std::vector<size_t>       sizes(batch, expert);
        cudaMemcpyAttributes attr = {};
        attr.srcAccessOrder       = cudaMemcpySrcAccessOrderStream;
        attr.flags                = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t attr_idx           = 0;
        t0 = now_us();
        for (int i = 0, b = 0; i < n; i += batch, b++) {
            const int k = i + batch <= n ? batch : n - i;
            for (int j = 0; j < k; j++) {
                dsts[j] = dev + ((i + j) % 64) * expert;
                srcs[j] = host + src[i + j];
            }
#if CUDART_VERSION >= 13000
            CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), k, &attr, &attr_idx, 1, s[b & 1]));
#else
            size_t fail = 0;
            CHECK(cudaMemcpyBatchAsync(dsts.data(), (void **) srcs.data(), sizes.data(), k, &attr, &attr_idx, 1, &fail, s[b & 1]));
#endif
        }
        t1 = now_us();
        CHECK(cudaStreamSynchronize(s[0]));
        CHECK(cudaStreamSynchronize(s[1]));
        t2 = now_us();
        printf("batch%-2d n=%d: issue %.0f us (%.2f us per copy), done after %.0f us, %.1f GB/s\n", batch, n, t1 - t0,
               (t1 - t0) / n, t2 - t0, n * expert / (t2 - t0) / 1e3);
#endif
        // the same bytes in one copy
        t0 = now_us();
        CHECK(cudaMemcpyAsync(dev, host, 64 * expert, cudaMemcpyHostToDevice, s[0]));
        CHECK(cudaStreamSynchronize(s[0]));
        t2 = now_us();
        printf("whole   64 experts: %.0f us, %.1f GB/s\n", t2 - t0, 64 * expert / (t2 - t0) / 1e3);
    }
    return 0;
}

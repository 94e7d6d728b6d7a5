// What reading a layer's router results back costs the host in decode. After
// a kernel that stands for the layer's attention and router (it spins ~40 us),
// the host needs four small pieces of device memory (Qwen3-30B-A3B, hybrid
// experts: the normed hidden state 8192 B, the CPU's ids and weights 8 B each,
// the GPU's ids 24 B). Timed from queueing everything to the host's sync:
//   none      the kernel alone
//   memcpy    one cudaMemcpyAsync each into pinned memory
//   pageable  the same, the last into pageable memory (as the scheduler did)
//   batch     one cudaMemcpyBatchAsync of the four (CUDA >= 12.8)
//   kernel    one kernel that writes the four into pinned (mapped) memory
//   nvcc -O2 -std=c++17 d2h-latency.cu -o d2h-latency
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__global__ void spin(long long cycles, int * out) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    out[threadIdx.x] = (int) (clock64() & 0xff);
}

struct piece { const char * src; char * dst; int size; };
struct pieces { piece p[4]; int n; };

__global__ void gather(pieces ps) {
    for (int i = 0; i < ps.n; i++) {
        const piece p = ps.p[i];
        for (int j = threadIdx.x * 4; j < p.size; j += blockDim.x * 4) {
            if (j + 4 <= p.size) {
                *(int *) (p.dst + j) = *(const int *) (p.src + j);
            } else {
                for (int b = j; b < p.size; b++) p.dst[b] = p.src[b];
            }
        }
    }
}

int main(int argc, char ** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 2000;
    const int sizes[4] = { 8192, 8, 8, 24 };
    char * dev = nullptr;
    char * pinned = nullptr;
    int * scratch = nullptr;
    CHECK(cudaMalloc((void **) &dev, 1 << 16));
    CHECK(cudaMalloc((void **) &scratch, 4096));
    CHECK(cudaHostAlloc((void **) &pinned, 1 << 16, cudaHostAllocDefault));
    std::vector<char> pageable(1 << 16);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int rate_khz = 0;
    CHECK(cudaDeviceGetAttribute(&rate_khz, cudaDevAttrClockRate, 0));
    const long long cycles = (long long) rate_khz * 40 / 1000;   // ~40 us

    size_t src_off[4], dst_off[4];
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        src_off[i] = off * 2 + 4096;
        dst_off[i] = off;
        off += (sizes[i] + 255) / 256 * 256;
    }
    const char * names[5] = { "none", "memcpy", "pageable", "batch", "kernel" };
    for (int rep = 0; rep < 2; rep++) {
        for (int v = 0; v < 5; v++) {
            std::vector<double> t;
            for (int it = -50; it < iters; it++) {
                const double t0 = now_us();
                spin<<<1, 32, 0, s>>>(cycles, scratch);
                if (v == 1 || v == 2) {
                    for (int i = 0; i < 4; i++) {
                        char * dst = (v == 2 && i == 3) ? pageable.data() + dst_off[i] : pinned + dst_off[i];
                        CHECK(cudaMemcpyAsync(dst, dev + src_off[i], sizes[i], cudaMemcpyDeviceToHost, s));
                    }
                } else if (v == 3) {
#if CUDART_VERSION >= 12080
                    void * dsts[4]; const void * srcs[4]; size_t szs[4];
                    for (int i = 0; i < 4; i++) { dsts[i] = pinned + dst_off[i]; srcs[i] = dev + src_off[i]; szs[i] = sizes[i]; }
                    cudaMemcpyAttributes attr = {};
                    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
                    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
                    size_t idx = 0;
#if CUDART_VERSION >= 13000
                    CHECK(cudaMemcpyBatchAsync((void **) dsts, (const void **) srcs, szs, 4, &attr, &idx, 1, s));
#else
                    size_t fail = 0;
                    CHECK(cudaMemcpyBatchAsync((void **) dsts, (void **) srcs, szs, 4, &attr, &idx, 1, &fail, s));
#endif
#endif
                } else if (v == 4) {
                    pieces ps;
                    ps.n = 4;
                    for (int i = 0; i < 4; i++) ps.p[i] = { dev + src_off[i], pinned + dst_off[i], sizes[i] };
                    gather<<<1, 256, 0, s>>>(ps);
                }
                CHECK(cudaStreamSynchronize(s));
                if (it >= 0) t.push_back(now_us() - t0);
            }
            std::sort(t.begin(), t.end());
            double sum = 0;
            for (double x : t) sum += x;
            printf("%-9s mean %6.1f us, median %6.1f us, p10 %6.1f us, p90 %6.1f us\n", names[v], sum / t.size(),
                   t[t.size() / 2], t[t.size() / 10], t[t.size() * 9 / 10]);
        }
    }
    return 0;
}

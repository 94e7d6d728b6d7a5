// Pinned host-to-device copies in a loop for SECONDS, as the link's expert
// streaming reads host memory, with a blocking wait (no spinning core), so
// that a CPU benchmark beside it sees the DMA's memory traffic alone. The
// copies read HOST_MIB of host memory (default 64) in turn, 64 MiB at a
// time: a buffer far larger than the CPU's caches reads from DRAM only, as
// the streamed weights do.
//   nvcc -O2 h2d-load.cu -o h2d-load && ./h2d-load SECONDS [HOST_MIB]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>

int main(int argc, char ** argv) {
    const double secs  = argc > 1 ? atof(argv[1]) : 10.0;
    const size_t bytes = 64u << 20;
    const size_t n_host = argc > 2 ? std::max<size_t>(1, atoll(argv[2]) / 64) : 1;
    cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    void * h = nullptr;
    void * d = nullptr;
    if (cudaHostAlloc(&h, bytes * n_host, cudaHostAllocDefault) != cudaSuccess || cudaMalloc(&d, bytes) != cudaSuccess) {
        fprintf(stderr, "h2d-load: allocation failed\n");
        return 1;
    }
    memset(h, 1, bytes * n_host);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventBlockingSync | cudaEventDisableTiming);
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    size_t n = 0;
    while (elapsed < secs) {
        for (int i = 0; i < 8; i++) {
            cudaMemcpyAsync(d, (char *) h + (n % n_host) * bytes, bytes, cudaMemcpyHostToDevice, s);
            n++;
        }
        cudaEventRecord(e, s);
        cudaEventSynchronize(e);
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    printf("h2d-load: %.1f GB/s over %.1f s\n", n * (double) bytes / elapsed / 1e9, elapsed);
    return 0;
}

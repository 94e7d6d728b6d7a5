// Pinned host-to-device copies in a loop for SECONDS, as the link's expert
// streaming reads host memory, with a blocking wait (no spinning core), so
// that a CPU benchmark beside it sees the DMA's memory traffic alone.
//   nvcc -O2 h2d-load.cu -o h2d-load && ./h2d-load SECONDS
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char ** argv) {
    const double secs  = argc > 1 ? atof(argv[1]) : 10.0;
    const size_t bytes = 64u << 20;
    cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    void * h = nullptr;
    void * d = nullptr;
    if (cudaHostAlloc(&h, bytes, cudaHostAllocDefault) != cudaSuccess || cudaMalloc(&d, bytes) != cudaSuccess) {
        fprintf(stderr, "h2d-load: allocation failed\n");
        return 1;
    }
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventBlockingSync | cudaEventDisableTiming);
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    size_t n = 0;
    while (elapsed < secs) {
        for (int i = 0; i < 8; i++) {
            cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s);
        }
        cudaEventRecord(e, s);
        cudaEventSynchronize(e);
        n += 8;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    printf("h2d-load: %.1f GB/s over %.1f s\n", n * (double) bytes / elapsed / 1e9, elapsed);
    return 0;
}

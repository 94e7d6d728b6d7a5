// Host memory read bandwidth with THREADS threads, each summing its own part
// of a SIZE_GIB buffer over and over for SECONDS (AVX2 loads, 4 KiB pages
// as the weights' pinned buffers have). Run alone, then beside the link's
// copies (h2d-load) to see what the two share.
//   gcc -O2 -mavx2 -fopenmp host-bw.c -o host-bw && ./host-bw THREADS SIZE_GIB SECONDS
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char ** argv) {
    const int    threads = argc > 1 ? atoi(argv[1]) : 16;
    const size_t bytes   = (size_t) (argc > 2 ? atof(argv[2]) : 8.0) * (1ull << 30);
    const double secs    = argc > 3 ? atof(argv[3]) : 5.0;
    char * buf = aligned_alloc(4096, bytes);
    if (buf == NULL) {
        fprintf(stderr, "host-bw: cannot allocate %zu bytes\n", bytes);
        return 1;
    }
    memset(buf, 1, bytes);
    const size_t part = bytes / threads / 64 * 64;
    double total = 0, elapsed = 0;
    volatile double sink = 0;
    const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        const char * p = buf + part * omp_get_thread_num();
        __m256i acc = _mm256_setzero_si256();
        while (omp_get_wtime() - t0 < secs) {
            for (size_t i = 0; i < part; i += 128) {
                acc = _mm256_add_epi64(acc, _mm256_load_si256((const __m256i *) (p + i)));
                acc = _mm256_add_epi64(acc, _mm256_load_si256((const __m256i *) (p + i + 32)));
                acc = _mm256_add_epi64(acc, _mm256_load_si256((const __m256i *) (p + i + 64)));
                acc = _mm256_add_epi64(acc, _mm256_load_si256((const __m256i *) (p + i + 96)));
            }
            total += part;
        }
        long long out[4];
        _mm256_storeu_si256((__m256i *) out, acc);
        sink += out[0];
    }
    elapsed = omp_get_wtime() - t0;
    printf("host-bw: %d threads, %.1f GB/s over %.1f s\n", threads, total / elapsed / 1e9, elapsed);
    free(buf);
    return 0;
}

// A GPU timeline for machines without Nsight Systems: loaded by the CUDA
// driver through CUDA_INJECTION64_PATH, it records every kernel, memcpy and
// memset of the process with CUPTI's activity API and writes one CSV line
// each to $CUPTI_TRACE_OUT at exit:
//   K,start_ns,end_ns,stream,name     (kernels)
//   M,start_ns,end_ns,stream,bytes,copy_kind   (memcpy: 1 = H2D, 2 = D2H, 8 = D2D)
//   S,start_ns,end_ns,stream,bytes    (memset)
//   A,start_ns,end_ns,thread,name     (CUDA runtime API calls, host side, with CUPTI_TRACE_API=1: where the
//                                      host issues work and where it waits; same clock as the device records)
// Built on the GPU machine by scripts/device/gpu-session.sh (po_trace_build),
// which passes the record structures of its CUPTI version as KREC and MREC.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#ifndef KREC
#define KREC CUpti_ActivityKernel9
#endif
#ifndef MREC
#define MREC CUpti_ActivityMemcpy5
#endif
#ifndef SREC
#define SREC CUpti_ActivityMemset4
#endif

static FILE *     trace_out;
static std::mutex trace_mutex;

static void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    *size        = 16u << 20;
    *buffer      = (uint8_t *) aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t * buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(trace_mutex);
    CUpti_Activity * record = NULL;
    while (trace_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        switch (record->kind) {
            case CUPTI_ACTIVITY_KIND_KERNEL:
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                const KREC * k = (const KREC *) record;
                fprintf(trace_out, "K,%llu,%llu,%u,%.80s\n", (unsigned long long) k->start, (unsigned long long) k->end,
                        k->streamId, k->name ? k->name : "?");
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                const MREC * m = (const MREC *) record;
                fprintf(trace_out, "M,%llu,%llu,%u,%llu,%d\n", (unsigned long long) m->start, (unsigned long long) m->end,
                        m->streamId, (unsigned long long) m->bytes, (int) m->copyKind);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMSET: {
                const SREC * s = (const SREC *) record;
                fprintf(trace_out, "S,%llu,%llu,%u,%llu\n", (unsigned long long) s->start, (unsigned long long) s->end,
                        s->streamId, (unsigned long long) s->bytes);
                break;
            }
            case CUPTI_ACTIVITY_KIND_RUNTIME: {
                const CUpti_ActivityAPI * a    = (const CUpti_ActivityAPI *) record;
                const char *              name = NULL;
                if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || !name) {
                    name = "?";
                }
                fprintf(trace_out, "A,%llu,%llu,%u,%.60s\n", (unsigned long long) a->start, (unsigned long long) a->end,
                        a->threadId, name);
                break;
            }
            default:
                break;
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped > 0 && trace_out) {
        fprintf(trace_out, "D,%zu\n", dropped);
    }
    free(buffer);
}

static void trace_flush(void) {
    cuptiActivityFlushAll(1);
    std::lock_guard<std::mutex> lock(trace_mutex);
    if (trace_out) {
        fclose(trace_out);
        trace_out = NULL;
    }
}

extern "C" int InitializeInjection(void) {
    const char * path = getenv("CUPTI_TRACE_OUT");
    trace_out = fopen(path ? path : "cupti-trace.csv", "w");
    if (!trace_out) {
        return 0;
    }
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    const char * api = getenv("CUPTI_TRACE_API");
    if (api && atoi(api) != 0) {
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    }
    atexit(trace_flush);
    return 1;
}

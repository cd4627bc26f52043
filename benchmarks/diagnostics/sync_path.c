// Diagnostic: where a synchronous round trip's time goes, with the driver API alone (no
// runtime), so the same binary runs natively and over Flyt's libcuda.so.1. Prints the cost of
// a clock read, cuStreamQuery on an idle stream, and an empty PTX kernel launch followed by
// cuCtxSynchronize / cuStreamSynchronize. Arguments: [iterations] [blocking]. Build: cc -O2 sync_path.c -I$CUDA/include -ldl
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../timing.h"

static void report(const char *what, double *us, int n) {
    qsort(us, n, sizeof *us, by_value);
    printf("%-34s p50 %8.3f us  p99 %8.3f us\n", what, us[n / 2], us[n * 99 / 100]);
}

#define CK(call)                                                              \
    do {                                                                      \
        CUresult r_ = (call);                                                 \
        if (r_ != CUDA_SUCCESS) {                                             \
            printf("%s failed: %d\n", #call, (int)r_);                        \
            return 1;                                                         \
        }                                                                     \
    } while (0)

// Times n rounds of the statements given (each round's microseconds into us, n and us those of
// main) and reports them as `what`.
#define TIMED(what, ...)                  \
    do {                                  \
        for (int i = 0; i < n; i++) {     \
            double t = now_us();          \
            __VA_ARGS__;                  \
            us[i] = now_us() - t;         \
        }                                 \
        report(what, us, n);              \
    } while (0)

static const char *ptx =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry empty()\n{\n ret;\n}\n";

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    unsigned stream_flags = argc > 2 && strcmp(argv[2], "blocking") == 0 ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING;
    double *us = malloc(n * sizeof *us);
    double t0 = now_us();
    for (int i = 0; i < 1000000; i++) now_us();
    printf("%-34s %8.1f ns\n", "clock_gettime", (now_us() - t0) * 1e3 / 1e6);

    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&stream, stream_flags));
    printf("stream: %s\n", stream_flags == CU_STREAM_DEFAULT ? "blocking" : "non-blocking");
    for (int i = 0; i < 2000; i++) cuStreamQuery(stream);
    TIMED("cuStreamQuery (idle)", CK(cuStreamQuery(stream)));
    TIMED("cuCtxSynchronize (idle)", CK(cuCtxSynchronize()));

    CUmodule module;
    CUfunction empty;
    if (cuModuleLoadData(&module, ptx) != CUDA_SUCCESS || cuModuleGetFunction(&empty, module, "empty") != CUDA_SUCCESS) {
        printf("no kernels here (emulated device?): launch rows skipped\n");
        return 0;
    }
    for (int i = 0; i < 2000; i++) {
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxSynchronize());
    }
    TIMED("launch + cuCtxSynchronize",
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxSynchronize()));
    TIMED("launch + cuStreamSynchronize",
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        CK(cuStreamSynchronize(stream)));
    for (int i = 0; i < n; i++) {
        double t = now_us();
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        us[i] = now_us() - t;
        CK(cuStreamSynchronize(stream));
    }
    report("launch alone (then sync, untimed)", us, n);
    TIMED("launch + poll cuStreamQuery",
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        CUresult state;
        while ((state = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) {
        }
        CK(state));
    CUevent event;
    CK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
    TIMED("launch + record + cuEventSynchronize",
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        CK(cuEventRecord(event, stream));
        CK(cuEventSynchronize(event)));
    // The server's own patterns, natively: a context-wide wait polled stream by stream, and a
    // stream wait through a private event.
    TIMED("server's ctx wait: poll both streams",
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        for (;;) {
            CUresult a = cuStreamQuery(NULL), b = cuStreamQuery(stream);
            if (a != CUDA_ERROR_NOT_READY && b != CUDA_ERROR_NOT_READY) break;
        });
    TIMED("server's stream wait: private event",
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        if (cuStreamQuery(stream) == CUDA_ERROR_NOT_READY) {
            CK(cuEventRecord(event, stream));
            while (cuEventQuery(event) == CUDA_ERROR_NOT_READY) {
            }
            CK(cuEventSynchronize(event));
        });
    double launched = 0, waited = 0;
    for (int i = 0; i < n; i++) {
        double t = now_us();
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        double m = now_us();
        CK(cuCtxSynchronize());
        launched += m - t;
        waited += now_us() - m;
    }
    printf("%-34s launch %.3f us + sync %.3f us (means)\n", "launch + cuCtxSynchronize split", launched / n, waited / n);
    return 0;
}

// Diagnostic: empty kernel launch + synchronize, round after round, with nothing else in the
// process's life after the warm-up, so FLYT_TIMELINE's marks fall into clean rounds (see
// timeline.sh). Prints the round's p50 and p99. Arguments: [rounds] [ctx|stream].
// Build: cc -O2 launch_timeline.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../timing.h"

static const char *ptx =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry empty()\n{\n ret;\n}\n";

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    int by_stream = argc > 2 && strcmp(argv[2], "stream") == 0;
    double *us = malloc(n * sizeof *us);
    CUdevice dev;
    CUcontext ctx;
    CUstream stream = NULL;
    CUmodule module;
    CUfunction empty;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
        (by_stream && cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)) || cuModuleLoadData(&module, ptx) ||
        cuModuleGetFunction(&empty, module, "empty")) {
        printf("setup failed\n");
        return 1;
    }
    for (int i = 0; i < 2000; i++) {
        cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
        by_stream ? cuStreamSynchronize(stream) : cuCtxSynchronize();
    }
    for (int i = 0; i < n; i++) {
        double t = now_us();
        CUresult launched = cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
        CUresult synced = by_stream ? cuStreamSynchronize(stream) : cuCtxSynchronize();
        us[i] = now_us() - t;
        if (launched || synced) {
            printf("round %d failed: %d %d\n", i, (int)launched, (int)synced);
            return 1;
        }
    }
    qsort(us, n, sizeof *us, by_value);
    printf("launch + %s p50 %.3f us  p99 %.3f us  (%d rounds)\n", by_stream ? "cuStreamSynchronize" : "cuCtxSynchronize",
           us[n / 2], us[n * 99 / 100], n);
    return 0;
}

// Diagnostic: 256 MiB pinned copies each way through the driver API, repeated, printing GB/s; run
// natively or over Flyt (e.g. TCP under TLS) while a profiler watches. Arguments: [rounds].
// Build: cc -O2 tls_copy.c -I$CUDA/include -lcuda
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    size_t n = (size_t)256 << 20;
    CUcontext ctx;
    CUdevice dev;
    CUdeviceptr buffer;
    unsigned char *up, *down;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) || cuMemAlloc(&buffer, n) ||
        cuMemAllocHost((void **)&up, n) || cuMemAllocHost((void **)&down, n)) {
        printf("setup failed\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) up[i] = (unsigned char)(i * 7);
    for (int round = 0; round < rounds; round++) {
        double t0 = now();
        if (cuMemcpyHtoDAsync(buffer, up, n, NULL) || cuStreamSynchronize(NULL)) return printf("H2D failed\n"), 1;
        double t1 = now();
        if (cuMemcpyDtoHAsync(down, buffer, n, NULL) || cuStreamSynchronize(NULL)) return printf("D2H failed\n"), 1;
        double t2 = now();
        if (memcmp(up, down, n) != 0) return printf("bytes differ\n"), 1;
        printf("round %d: H2D %.2f GB/s, D2H %.2f GB/s\n", round, n / (t1 - t0) / 1e9, n / (t2 - t1) / 1e9);
    }
    return 0;
}

// Diagnostic: pinned and pageable copies each way through the driver API, repeated, printing
// GB/s per round (bytes checked after each round trip); run natively or over Flyt (e.g. TCP
// under TLS). Arguments: [rounds] [MiB]. Build: cc -O2 tls_copy.c -I$CUDA/include -lcuda
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../timing.h"

// One round trip through `buffer`; prints the two rates, or why it failed (returns non-zero).
static int round_trip(const char *kind, int round, CUdeviceptr buffer, unsigned char *up, unsigned char *down, size_t n) {
    memset(down, 0, n);
    double t0 = now();
    if (cuMemcpyHtoDAsync(buffer, up, n, NULL) || cuStreamSynchronize(NULL)) return printf("%s H2D failed\n", kind), 1;
    double t1 = now();
    if (cuMemcpyDtoHAsync(down, buffer, n, NULL) || cuStreamSynchronize(NULL)) return printf("%s D2H failed\n", kind), 1;
    double t2 = now();
    if (memcmp(up, down, n) != 0) return printf("%s bytes differ\n", kind), 1;
    printf("round %d %s: H2D %.3f GB/s, D2H %.3f GB/s\n", round, kind, n / (t1 - t0) / 1e9, n / (t2 - t1) / 1e9);
    return 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    size_t n = (size_t)(argc > 2 ? atoi(argv[2]) : 256) << 20;
    CUcontext ctx;
    CUdevice dev;
    CUdeviceptr buffer;
    unsigned char *up, *down;
    unsigned char *pageable_up = malloc(n), *pageable_down = malloc(n);
    if (!pageable_up || !pageable_down || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuMemAlloc(&buffer, n) || cuMemAllocHost((void **)&up, n) || cuMemAllocHost((void **)&down, n)) {
        printf("setup failed\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) up[i] = pageable_up[i] = (unsigned char)(i * 7);
    for (int round = 0; round < rounds; round++) {
        if (round_trip("pinned", round, buffer, up, down, n) || round_trip("pageable", round, buffer, pageable_up, pageable_down, n)) return 1;
    }
    return 0;
}

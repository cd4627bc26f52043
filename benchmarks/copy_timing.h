// What guest_copy.c and remote_copy.c share: synchronous driver-API copies of one size, timed.
#pragma once

#include <cuda.h>
#include <stdio.h>
#include <string.h>

#include "driver_check.h"
#include "timing.h"

// Device 0's primary context made current, and `largest` bytes of device memory (dev) and of
// pinned host memory (pinned); 1 after a failed call (CHECK's line printed).
static inline int copy_buffers(size_t largest, CUdeviceptr *dev, unsigned char **pinned) {
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(dev, largest));
    CHECK(cuMemAllocHost((void **)pinned, largest));
    return 0;
}

// How a program prints one case's times (LABEL MEM DIR BYTES and the REPS times, which it may sort).
typedef void (*copy_report)(const char *label, const char *mem, const char *dir, size_t bytes, double *seconds, int reps);

// For pinned, then pageable memory: a warm-up copy of BYTES to dev, REPS timed host-to-device
// copies, then (with `back`) one copy back into `back` checked against what went, and REPS timed
// device-to-host copies; each direction's times handed to report. 1 after a failed call (CHECK's
// line printed) or bytes that came back changed.
static inline int time_copies(const char *label, CUdeviceptr dev, unsigned char *pinned, unsigned char *pageable,
                              unsigned char *back, size_t bytes, double *seconds, int reps, copy_report report) {
    for (int mem = 0; mem < 2; mem++) {
        unsigned char *host = mem ? pageable : pinned;
        const char *kind = mem ? "pageable" : "pinned";
        CHECK(cuMemcpyHtoD(dev, host, bytes)); // warm-up
        for (int r = 0; r < reps; r++) {
            double start = now();
            CHECK(cuMemcpyHtoD(dev, host, bytes));
            seconds[r] = now() - start;
        }
        report(label, kind, "H2D", bytes, seconds, reps);
        if (back) {
            memset(back, 0, bytes);
            CHECK(cuMemcpyDtoH(back, dev, bytes)); // warm-up, and the bytes checked
            if (memcmp(back, host, bytes) != 0) {
                printf("FAIL %s %zu bytes came back changed\n", kind, bytes);
                return 1;
            }
        }
        for (int r = 0; r < reps; r++) {
            double start = now();
            CHECK(cuMemcpyDtoH(host, dev, bytes));
            seconds[r] = now() - start;
        }
        report(label, kind, "D2H", bytes, seconds, reps);
    }
    return 0;
}

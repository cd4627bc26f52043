// For gpu-tests programs that also call the driver API (linked with -lcuda): CHECK_CU, the
// driver's counterpart of common.h's CHECK (an unexpected failure prints its name and ends the
// program).
#pragma once

#include <cuda.h>

#include "common.h"

#define CHECK_CU(call)                                                                 \
    do {                                                                               \
        CUresult check_r_ = (call);                                                    \
        if (check_r_ != CUDA_SUCCESS) {                                                \
            const char *name_ = "?";                                                   \
            cuGetErrorName(check_r_, &name_);                                          \
            printf("FAIL: %s (line %d): %s\n", #call, __LINE__, name_);                \
            printf("%s: FAIL\n", g_test_name);                                         \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

// The start of a program mixing runtime and driver calls: test_init(name), the runtime's primary
// context current on this thread, the driver initialized; returns device 0.
static inline CUdevice start_on_primary_context(const char *name) {
    test_init(name);
    CHECK(cudaFree(0));  // the runtime's primary context, current on this thread
    CHECK_CU(cuInit(0));
    CUdevice dev;
    CHECK_CU(cuDeviceGet(&dev, 0));
    return dev;
}

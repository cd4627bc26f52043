// For the benchmark programs in C that call the driver API from main: CHECK(call) prints
// "FAIL CALL: ERROR_NAME" and returns 1 when the call does not succeed.
#pragma once

#include <cuda.h>
#include <stdio.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        CUresult r_ = (call);                                                            \
        if (r_ != CUDA_SUCCESS) {                                                        \
            const char *name_ = "?";                                                     \
            cuGetErrorName(r_, &name_);                                                  \
            printf("FAIL %s: %s\n", #call, name_);                                       \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

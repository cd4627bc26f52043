// Kernels of the two-device programs: words `seed ^ i` written, and words summed.
#pragma once

#include "common.h"

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = seed ^ (unsigned)i;
}

// Sums `n` words at `p` (another device's memory, under peer or pool access) into `*out`.
__global__ void sum(const unsigned *p, size_t n, unsigned long long *out) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) local += p[i];
    atomicAdd(out, local);
}

// The word pattern the memory-sharing programs write and check: word i of seed s, a kernel that
// fills a buffer with it and one that counts the words that differ.
#pragma once

#include "common.h"

static __host__ __device__ uint32_t word(size_t i, uint32_t seed) { return (uint32_t)i * 2654435761u + seed; }

static __global__ void fill(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = word(i, seed);
}

static __global__ void count_wrong(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *wrong) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (p[i] != word(i, seed)) atomicAdd(wrong, 1ull);
}

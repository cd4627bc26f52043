// The kernels that graph_nodes.cu (driver API) and graph_nodes_runtime.cu (runtime API) put in
// their graphs, and add_kernel.
#pragma once

#include "graph_add_kernel.h"

__global__ void fill(int *p, int n, int scale) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = i * scale;
}

__global__ void copy_plus(int *out, const int *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += in[i];
}

// One thread: counts, and keeps the loop going until the count reaches `limit`.
__global__ void count_step(int *counter, int limit, cudaGraphConditionalHandle handle) {
    int next = ++*counter;
    cudaGraphSetConditional(handle, next < limit ? 1 : 0);
}

__global__ void set_condition(cudaGraphConditionalHandle handle, unsigned value) { cudaGraphSetConditional(handle, value); }

__global__ void add_one(int *p) { *p += 1; }

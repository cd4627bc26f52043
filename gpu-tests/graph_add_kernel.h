// A kernel node added through the runtime's cudaKernelNodeParams, and a memory allocation node
// added through the runtime's cudaMemAllocNodeParams, for the graph programs.
#pragma once

#include "common.h"

static cudaGraphNode_t add_kernel(cudaGraph_t g, const cudaGraphNode_t *deps, size_t ndeps, void *func, dim3 grid, dim3 block,
                                  void **args) {
    cudaKernelNodeParams p = {};
    p.func = func;
    p.gridDim = grid;
    p.blockDim = block;
    p.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, deps, ndeps, &p));
    return node;
}

// An allocation node of `bytes` of pinned memory on device 0; `alloc` gets the parameters it was
// added with, its dptr the graph memory's address.
static cudaGraphNode_t add_device_alloc(cudaGraph_t g, const cudaGraphNode_t *deps, size_t ndeps, size_t bytes,
                                        cudaMemAllocNodeParams *alloc) {
    *alloc = {};
    alloc->poolProps.allocType = cudaMemAllocationTypePinned;
    alloc->poolProps.location.type = cudaMemLocationTypeDevice;
    alloc->poolProps.location.id = 0;
    alloc->bytesize = bytes;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddMemAllocNode(&node, g, deps, ndeps, alloc));
    return node;
}

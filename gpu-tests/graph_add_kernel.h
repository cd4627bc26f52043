// A kernel node added through the runtime's cudaKernelNodeParams, for the graph programs.
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

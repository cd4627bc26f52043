// cluster_occupancy: thread block cluster queries and a cluster launch.
// Covers: cudaOccupancyMaxPotentialClusterSize and cudaOccupancyMaxActiveClusters for a kernel
// launched with cluster dimensions (a launch configuration attribute), with and without dynamic
// shared memory, an unsupported cluster size refused, and a cluster launch through
// cudaLaunchKernelEx whose blocks report their cluster rank.
#include "common.h"

// The block's rank in its cluster (PTX's %cluster_ctarank; cooperative_groups needs CCCL headers
// CI's toolkit lacks).
__device__ unsigned cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

__global__ void __cluster_dims__(2, 1, 1) fixed_pairs(int *out) {
    out[blockIdx.x] = (int)cluster_rank();
}

__global__ void ranks(int *out) {
    out[blockIdx.x] = (int)cluster_rank();
}

static cudaLaunchConfig_t config_for(unsigned grid, unsigned block, size_t shared, cudaLaunchAttribute *attribute, unsigned cluster) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(block);
    config.dynamicSmemBytes = shared;
    attribute->id = cudaLaunchAttributeClusterDimension;
    attribute->val.clusterDim.x = cluster;
    attribute->val.clusterDim.y = 1;
    attribute->val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = cluster ? 1 : 0;
    return config;
}

int main() {
    test_init("cluster_occupancy");
    cudaLaunchAttribute attribute;
    cudaLaunchConfig_t config = config_for(64, 128, 0, &attribute, 0);
    int size = 0;
    CHECK(cudaOccupancyMaxPotentialClusterSize(&size, (void *)ranks, &config));
    printf("largest portable cluster for 128-thread blocks: %d\n", size);
    for (unsigned cluster : {1u, 2u, 4u, 8u}) {
        for (size_t shared : {(size_t)0, (size_t)48 << 10}) {
            config = config_for(64, 128, shared, &attribute, cluster);
            int clusters = 0;
            CHECK(cudaOccupancyMaxActiveClusters(&clusters, (void *)ranks, &config));
            printf("cluster %u, %zu KiB dynamic shared memory: %d active clusters\n", cluster, shared >> 10, clusters);
        }
    }
    config = config_for(64, 128, 0, &attribute, 0);
    int fixed = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&fixed, (void *)fixed_pairs, &config));
    printf("compiled-in clusters of 2: %d active clusters\n", fixed);
    config = config_for(64, 128, 0, &attribute, 64);
    int too_big = 0;
    cudaError_t refused = cudaOccupancyMaxActiveClusters(&too_big, (void *)ranks, &config);
    printf("a cluster of 64 blocks: %s\n", cudaGetErrorName(refused));
    cudaGetLastError();

    int *out = nullptr;
    CHECK(cudaMalloc(&out, 64 * sizeof(int)));
    config = config_for(64, 128, 0, &attribute, 4);
    CHECK(cudaLaunchKernelEx(&config, ranks, out));
    CHECK(cudaDeviceSynchronize());
    int host[64];
    CHECK(cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost));
    bool right = true;
    for (int i = 0; i < 64; i++) right &= host[i] == i % 4;
    printf("clusters of 4 launched: block ranks %s\n", right ? "right" : "wrong");
    CHECK(cudaFree(out));
    return test_finish();
}

// cooperative: a cooperative launch whose blocks synchronize grid-wide: phase 1 writes per-block
// partial sums, every block waits at a grid barrier (a counter all blocks must reach: it only
// returns when every block of the grid is resident at once, which a cooperative launch
// guarantees), phase 2 has block 0 add them up; the grid is as large as can be resident at once
// (occupancy times SMs).
// Launched with cudaLaunchCooperativeKernel and with cudaLaunchKernelEx and the cooperative
// attribute; the device reports cooperative launch support. Results checked against the host.
#include "common.h"

// A one-use grid barrier: each block arrives once, then waits for all.
__device__ void grid_barrier(unsigned *arrived) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrived, 1u);
        while (atomicAdd(arrived, 0u) < gridDim.x) {
        }
        __threadfence();
    }
    __syncthreads();
}

__global__ void two_phase_sum(const int *in, int n, long long *partial, long long *total, unsigned *arrived) {
    __shared__ long long block_sum;
    if (threadIdx.x == 0) block_sum = 0;
    __syncthreads();
    long long mine = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) mine += in[i];
    atomicAdd((unsigned long long *)&block_sum, (unsigned long long)mine);
    __syncthreads();
    if (threadIdx.x == 0) partial[blockIdx.x] = block_sum;
    grid_barrier(arrived);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        long long sum = 0;
        for (unsigned b = 0; b < gridDim.x; b++) sum += partial[b];
        *total = sum;
    }
}

int main() {
    test_init("cooperative");
    int supported = 0, sms = 0, per_sm = 0;
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrCooperativeLaunch, 0));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("cooperative launch supported: %s\n", supported ? "yes" : "no");
    const int threads = 256;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, two_phase_sum, threads, 0));
    int blocks = sms * per_sm;
    const int n = 1 << 22;
    int *in = nullptr;
    long long *partial = nullptr, *total = nullptr;
    unsigned *arrived = nullptr;
    CHECK(cudaMalloc(&arrived, sizeof(unsigned)));
    CHECK(cudaMalloc(&in, n * sizeof(int)));
    CHECK(cudaMalloc(&partial, blocks * sizeof(long long)));
    CHECK(cudaMalloc(&total, sizeof(long long)));
    int *host = (int *)malloc(n * sizeof(int));
    long long want = 0;
    for (int i = 0; i < n; i++) {
        host[i] = (i * 7) % 1000 - 300;
        want += host[i];
    }
    CHECK(cudaMemcpy(in, host, n * sizeof(int), cudaMemcpyHostToDevice));

    int count = n;
    void *args[] = {&in, &count, &partial, &total, &arrived};
    long long got = 0;
    CHECK(cudaMemset(total, 0, sizeof(long long)));
    CHECK(cudaMemset(arrived, 0, sizeof(unsigned)));
    CHECK(cudaLaunchCooperativeKernel((void *)two_phase_sum, dim3(blocks), dim3(threads), args, 0, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost));
    printf("cudaLaunchCooperativeKernel over a full grid: %s\n", got == want ? "sum right" : "SUM WRONG");
    EXPECT(got == want, "sum %lld, want %lld", got, want);

    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.attrs = &attribute;
    config.numAttrs = 1;
    CHECK(cudaMemset(total, 0, sizeof(long long)));
    CHECK(cudaMemset(arrived, 0, sizeof(unsigned)));
    CHECK(cudaLaunchKernelEx(&config, two_phase_sum, (const int *)in, count, partial, total, arrived));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost));
    printf("cudaLaunchKernelEx with the cooperative attribute: %s\n", got == want ? "sum right" : "SUM WRONG");
    EXPECT(got == want, "sum %lld, want %lld", got, want);

    free(host);
    CHECK(cudaFree(in));
    CHECK(cudaFree(partial));
    CHECK(cudaFree(total));
    CHECK(cudaFree(arrived));
    return test_finish();
}

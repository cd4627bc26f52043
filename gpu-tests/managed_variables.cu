// managed_variables: `__managed__` variables, which host code and kernels both use by name.
// Covers: a scalar and an array declared __managed__ with initial values, kernels updating them
// (atomics across blocks), the host reading them after a sync and writing them between launches,
// a kernel handed a pointer to one, cudaMemcpy to and from one, several kernels on two streams,
// and a CUDA graph launch.
//
// Through Flyt they work over every transport: the app reaches each through a mirror kept
// coherent at launches and synchronizations.
#include "common.h"

__managed__ int counter = 5;
__managed__ unsigned table[256];
__managed__ double weights[4] = {0.5, 1.5, 2.5, 3.5};

__global__ void bump(int by) { atomicAdd(&counter, by); }

__global__ void fill_table(unsigned salt) {
    unsigned i = threadIdx.x;
    table[i] = i * 3 + salt + (unsigned)counter;
}

__global__ void scale_weights(double *w, double factor) {
    unsigned i = threadIdx.x;
    if (i < 4) w[i] *= factor;
}

int main() {
    test_init("managed_variables");
    printf("initial counter: %d, weights: %.1f %.1f %.1f %.1f\n", counter, weights[0], weights[1], weights[2], weights[3]);

    bump<<<4, 32>>>(1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("after 128 increments: %d\n", counter);
    EXPECT(counter == 133, "counter %d", counter);

    // The host writes; the next kernel sees it.
    counter = 1000;
    fill_table<<<1, 256>>>(7);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    unsigned bad = 0;
    for (unsigned i = 0; i < 256; i++) bad += table[i] != i * 3 + 7 + 1000;
    printf("table filled with the host's counter: %s\n", bad ? "WRONG" : "right");
    EXPECT(bad == 0, "%u table entries wrong", bad);

    // A kernel given a pointer to one.
    scale_weights<<<1, 4>>>(weights, 2.0);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("weights doubled: %.1f %.1f %.1f %.1f\n", weights[0], weights[1], weights[2], weights[3]);

    // Copies to and from one, as host memory.
    double fresh[4] = {10, 20, 30, 40};
    CHECK(cudaMemcpy(weights, fresh, sizeof fresh, cudaMemcpyDefault));
    double *device = nullptr;
    CHECK(cudaMalloc(&device, sizeof fresh));
    CHECK(cudaMemcpy(device, weights, sizeof fresh, cudaMemcpyDefault));
    scale_weights<<<1, 4>>>(device, 0.5);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(weights, device, sizeof fresh, cudaMemcpyDefault));
    printf("weights through device memory: %.1f %.1f %.1f %.1f\n", weights[0], weights[1], weights[2], weights[3]);

    // Two streams, each bumping; the host reads after both.
    cudaStream_t a, b;
    CHECK(cudaStreamCreate(&a));
    CHECK(cudaStreamCreate(&b));
    counter = 0;
    for (int i = 0; i < 10; i++) {
        bump<<<1, 64, 0, a>>>(1);
        bump<<<1, 64, 0, b>>>(2);
    }
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(a));
    CHECK(cudaStreamSynchronize(b));
    printf("after two streams: %d\n", counter);
    EXPECT(counter == 1920, "counter %d", counter);

    // A captured graph of three bumps, launched twice.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 3; i++) bump<<<1, 10, 0, a>>>(1);
    CHECK(cudaStreamEndCapture(a, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    counter = 7;
    CHECK(cudaGraphLaunch(exec, a));
    CHECK(cudaGraphLaunch(exec, a));
    CHECK(cudaStreamSynchronize(a));
    printf("after two graph launches: %d\n", counter);
    EXPECT(counter == 67, "counter %d", counter);

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK_EACH(cudaStreamDestroy, a, b);
    CHECK(cudaFree(device));
    return test_finish();
}

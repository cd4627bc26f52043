// assert_fail: a device assert that fails in exactly one thread.
//
// CUDA prints the assert message on the app's stderr when the failure is reported (at the next
// synchronizing call), e.g.
//   assert_fail.cu:NN: void check_values(const int *, int): block: [0,0,0], thread: [37,0,0]
//   Assertion `v[i] != 7` failed.
// and the context fails with the sticky cudaErrorAssert: cudaDeviceSynchronize returns it, and so do
// cudaGetLastError and every later call (cudaMalloc, cudaMemcpy, another synchronize). Output a kernel
// printed before the failing kernel was synchronized is on stdout as usual.
// Exit 0 when all of that happened as CUDA documents it. The runner compares stderr as well.
#include "common.h"

#include <cassert>

__global__ void fill(int *v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = 1000 + i;
}

__global__ void poke(int *v, int i, int value) { v[i] = value; }

__global__ void check_values(const int *v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) assert(v[i] != 7);
}

__global__ void say_hello(int n) {
    if (threadIdx.x == 0 && blockIdx.x == 0) printf("device: about to check %d values\n", n);
}

int main() {
    test_init("assert_fail");
    const int n = 100;
    int *d = nullptr, h[n];
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    fill<<<2, 64>>>(d, n);
    CHECK_LAUNCH();

    // A passing check first: no message, no error.
    check_values<<<2, 64>>>(d, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("check with no bad value: ok\n");

    say_hello<<<1, 1>>>(n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    fflush(stdout);

    // Exactly one element (index 37: block 0, thread 37) now fails the assert.
    poke<<<1, 1>>>(d, 37, 7);
    CHECK_LAUNCH();
    check_values<<<2, 64>>>(d, n);
    expect_err("launch of the failing check", cudaGetLastError(), cudaSuccess);
    fflush(stdout);
    expect_err("cudaDeviceSynchronize after the failed assert", cudaDeviceSynchronize(), cudaErrorAssert);
    fflush(stderr);

    // Sticky: the context is unusable from now on.
    expect_err("cudaGetLastError after the assert", cudaGetLastError(), cudaErrorAssert);
    void *p = nullptr;
    expect_err("cudaMalloc after the assert", cudaMalloc(&p, 4096), cudaErrorAssert);
    expect_err("cudaMemcpy after the assert", cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), cudaErrorAssert);
    fill<<<2, 64>>>(d, n);
    cudaGetLastError();
    expect_err("cudaDeviceSynchronize again", cudaDeviceSynchronize(), cudaErrorAssert);
    printf("error string: %s\n", cudaGetErrorString(cudaErrorAssert));
    return test_finish();
}

// first_kernel: how long a program waits for its GPU. From the start of main to (a) the first CUDA
// call returning (cudaFree(0): the driver's cuInit and the primary context; through Flyt, finding the
// server and the session handshake), and to (b) the first kernel's result being back on the host
// (loading the program's module on first use, the launch, the copy). One record per process; the
// harness runs it several times against a warm server.
#include "common.h"

__global__ void add_one(int *x) { x[threadIdx.x] += 1 + threadIdx.x; }

static int run(const bench::Args &) {
    auto t0 = bench::Clock::now();
    CK(cudaFree(nullptr));
    auto t1 = bench::Clock::now();
    int *d, h[32] = {};
    CK(cudaMalloc(&d, sizeof h));
    CK(cudaMemset(d, 0, sizeof h));
    add_one<<<1, 32>>>(d);
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    auto t2 = bench::Clock::now();
    for (int i = 0; i < 32; i++)
        if (h[i] != 1 + i) throw bench::CudaFailure("first_kernel: a wrong result");
    bench::Json("first_kernel").num("init_ms", bench::us_between(t0, t1) / 1e3).num("first_result_ms", bench::us_between(t0, t2) / 1e3).emit();
    CK(cudaFree(d));
    return 0;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

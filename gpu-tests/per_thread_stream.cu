// per_thread_stream: built with `nvcc --default-stream per-thread` (the runner's flag table says so),
// so <<<>>> launches go through __cudaLaunchKernel_ptsz and stream 0 means each host thread's own
// default stream. Deliberately small: besides the _ptsz launch it uses only cudaMemcpy (which the
// header maps to cudaMemcpy_ptds in this mode), cudaMalloc/cudaFree, cudaDeviceSynchronize,
// cudaGetLastError and cudaGetErrorName.
//
// Several threads each launch a chain of kernels on their per-thread default stream and copy the
// result back; one thread's long kernel must not delay another's results being correct.
#include "common.h"

#include <string>
#include <thread>
#include <vector>

#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "per_thread_stream.cu must be built with --default-stream per-thread"
#endif

__global__ void chain_step(int *x, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 3 + k + i;
}

static void worker(int t, std::string &out) {
    const int n = 100000 + t * 17;
    std::vector<int> h(n), want(n);
    for (int i = 0; i < n; i++) h[i] = want[i] = i ^ t;
    int *d;
    cudaError_t e = cudaMalloc(&d, n * sizeof(int));
    if (e != cudaSuccess) {
        out = std::string("FAIL: cudaMalloc: ") + cudaGetErrorName(e);
        return;
    }
    if ((e = cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice)) != cudaSuccess) {
        out = std::string("FAIL: cudaMemcpy H2D: ") + cudaGetErrorName(e);
        return;
    }
    // Thread 0 also runs a 200 ms spin on its own default stream first.
    if (t == 0) spin_kernel<<<1, 1>>>(200ull * 1000000ull, nullptr, 0);
    for (int k = 0; k < 50; k++) {
        chain_step<<<(n + 255) / 256, 256>>>(d, n, k + t);
        for (int i = 0; i < n; i++) want[i] = want[i] * 3 + k + t + i;
    }
    if ((e = cudaGetLastError()) != cudaSuccess) {
        out = std::string("FAIL: launch: ") + cudaGetErrorName(e);
        return;
    }
    // cudaMemcpy (cudaMemcpy_ptds) is ordered after this thread's launches on its default stream.
    if ((e = cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost)) != cudaSuccess) {
        out = std::string("FAIL: cudaMemcpy D2H: ") + cudaGetErrorName(e);
        return;
    }
    cudaFree(d);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != want[i];
    out = bad ? "FAIL: " + std::to_string(bad) + " wrong" : "ok";
}

int main() {
    test_init("per_thread_stream");
    const int T = 6;
    std::vector<std::string> results(T);
    std::vector<std::thread> threads;
    for (int t = 0; t < T; t++) threads.emplace_back(worker, t, std::ref(results[t]));
    for (auto &th : threads) th.join();
    for (int t = 0; t < T; t++) {
        printf("thread %d, 50 kernels on its per-thread default stream: %s\n", t, results[t].c_str());
        if (results[t] != "ok") g_failures++;
    }

    // The main thread's own default stream.
    const int n = 4096;
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    std::vector<int> h(n, 1);
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    chain_step<<<n / 256, 256>>>(d, n, 1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != 3 + 1 + i;
    printf("main thread per-thread default stream: %s\n", bad ? "wrong" : "ok");
    EXPECT(bad == 0, "main thread: %d wrong", bad);
    CHECK(cudaFree(d));
    return test_finish();
}

// async_overlap: kernels that run long enough (hundreds of ms) that asynchrony is observable.
// Launches must return at once, the host works meanwhile, queries say "not ready" while the kernel
// runs, synchronizing calls wait, and async copies queued behind a kernel return before it finishes.
// Covers: <<<>>> of a long kernel, cudaStreamQuery (cudaErrorNotReady, then cudaSuccess),
// cudaEventRecord/cudaEventQuery/cudaEventSynchronize, cudaMemcpyAsync D2H into pinned memory queued
// behind a kernel, cudaStreamSynchronize, cudaDeviceSynchronize waiting for several streams, the legacy
// default stream ordering a synchronous cudaMemcpy after a kernel.
// Only yes/no answers that are deterministic for a >= 300 ms kernel are printed; times go to stderr.
#include "common.h"

#include <chrono>
#include <cmath>
#include <vector>

using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
// Spins for `ns` of GPU time, then every thread writes its slot: the result proves it ran to the end.
__global__ void long_kernel(unsigned long long ns, int *out, int n, int v) {
    unsigned long long start = gpu_ns();
    while (gpu_ns() - start < ns) {
    }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v + i;
}

// Host work that takes a few tens of milliseconds and whose result is checked (so it is not elided).
static double host_work() {
    double acc = 0;
    for (int i = 1; i < 4000000; i++) acc += std::sqrt((double)i) / i;
    return acc;
}

int main() {
    test_init("async_overlap");
    const unsigned long long MS = 1000000ull;
    const int n = 4096;
    const size_t bytes = n * sizeof(int);

    int *d_a, *d_b, *h_pinned;
    CHECK(cudaMalloc(&d_a, bytes));
    CHECK(cudaMalloc(&d_b, bytes));
    CHECK(cudaMallocHost((void **)&h_pinned, bytes));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreate(&s2));
    // Warm up (module loading, first-launch costs) so the timings on stderr mean something.
    long_kernel<<<n / 256, 256, 0, s1>>>(0, d_a, n, 0);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s1));

    // 1. Launch a 400 ms kernel, query at once, do host work, query again, then wait.
    {
        auto t0 = Clock::now();
        long_kernel<<<n / 256, 256, 0, s1>>>(400 * MS, d_a, n, 1000);
        CHECK_LAUNCH();
        double launch_ms = ms_since(t0);
        cudaError_t q1 = cudaStreamQuery(s1);
        double w = host_work();
        double host_ms = ms_since(t0);
        cudaError_t q2 = cudaStreamQuery(s1);
        if (q1 != cudaSuccess && q1 != cudaErrorNotReady) CHECK(q1);
        if (q2 != cudaSuccess && q2 != cudaErrorNotReady) CHECK(q2);
        int not_ready = (q1 == cudaErrorNotReady) + (q2 == cudaErrorNotReady);
        printf("cudaStreamQuery right after the launch: %s\n", cudaGetErrorName(q1));
        printf("stream reported not ready at least once while the kernel ran: %s\n", yes(not_ready > 0));
        EXPECT(q1 == cudaErrorNotReady, "cudaStreamQuery right after a 400 ms launch was not cudaErrorNotReady");
        CHECK(cudaStreamSynchronize(s1));
        double total_ms = ms_since(t0);
        fprintf(stderr, "launch %.3f ms, host work done at %.1f ms (w=%.3f), kernel done at %.1f ms\n", launch_ms,
                host_ms, w, total_ms);
        // The host work takes tens of ms, the kernel 400: the kernel must still be running after it.
        printf("stream still not ready after the host work: %s\n", yes(q2 == cudaErrorNotReady));
        EXPECT(q2 == cudaErrorNotReady, "kernel finished during tens of ms of host work");
        expect_err("cudaStreamQuery after cudaStreamSynchronize", cudaStreamQuery(s1), cudaSuccess);
        CHECK(cudaMemcpy(h_pinned, d_a, bytes, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < n; i++)
            if (h_pinned[i] != 1000 + i) bad++;
        EXPECT(bad == 0, "long kernel result: %d wrong", bad);
        if (!bad) printf("long kernel result: ok\n");
    }

    // 2. An async D2H copy queued behind a 300 ms kernel returns at once; an event after it is not
    //    ready until the kernel and the copy are done.
    {
        cudaEvent_t ev;
        CHECK(cudaEventCreate(&ev));
        memset(h_pinned, 0, bytes);
        long_kernel<<<n / 256, 256, 0, s1>>>(300 * MS, d_a, n, 2000);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(h_pinned, d_a, bytes, cudaMemcpyDeviceToHost, s1));
        CHECK(cudaEventRecord(ev, s1));
        expect_err("cudaEventQuery behind the kernel and the copy", cudaEventQuery(ev), cudaErrorNotReady);
        printf("pinned buffer untouched while the kernel runs: %s\n", yes(h_pinned[0] == 0 && h_pinned[n - 1] == 0));
        CHECK(cudaEventSynchronize(ev));
        expect_err("cudaEventQuery after cudaEventSynchronize", cudaEventQuery(ev), cudaSuccess);
        int bad = 0;
        for (int i = 0; i < n; i++)
            if (h_pinned[i] != 2000 + i) bad++;
        EXPECT(bad == 0, "async copy behind the kernel: %d wrong", bad);
        if (!bad) printf("async copy queued behind the kernel: ok\n");
        CHECK(cudaEventDestroy(ev));
    }

    // 3. Two streams each run a 300 ms kernel; cudaDeviceSynchronize waits for both.
    {
        auto t0 = Clock::now();
        long_kernel<<<n / 256, 256, 0, s1>>>(300 * MS, d_a, n, 3000);
        CHECK_LAUNCH();
        long_kernel<<<n / 256, 256, 0, s2>>>(300 * MS, d_b, n, 4000);
        CHECK_LAUNCH();
        expect_err("cudaStreamQuery(s1) with both kernels queued", cudaStreamQuery(s1), cudaErrorNotReady);
        expect_err("cudaStreamQuery(s2) with both kernels queued", cudaStreamQuery(s2), cudaErrorNotReady);
        CHECK(cudaDeviceSynchronize());
        fprintf(stderr, "two 300 ms kernels on two streams took %.1f ms (concurrent if well under 600)\n",
                ms_since(t0));
        expect_err("cudaStreamQuery(s1) after cudaDeviceSynchronize", cudaStreamQuery(s1), cudaSuccess);
        expect_err("cudaStreamQuery(s2) after cudaDeviceSynchronize", cudaStreamQuery(s2), cudaSuccess);
        std::vector<int> a(n), b(n);
        CHECK(cudaMemcpy(a.data(), d_a, bytes, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(b.data(), d_b, bytes, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < n; i++) bad += (a[i] != 3000 + i) + (b[i] != 4000 + i);
        EXPECT(bad == 0, "two-stream kernels: %d wrong", bad);
        if (!bad) printf("two streams, cudaDeviceSynchronize waits for both: ok\n");
    }

    // 4. The legacy default stream: a synchronous cudaMemcpy after a kernel on stream 0 sees its result.
    {
        long_kernel<<<n / 256, 256>>>(200 * MS, d_b, n, 5000);
        CHECK_LAUNCH();
        std::vector<int> b(n, 0);
        CHECK(cudaMemcpy(b.data(), d_b, bytes, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < n; i++) bad += (b[i] != 5000 + i);
        EXPECT(bad == 0, "cudaMemcpy after a default-stream kernel: %d wrong", bad);
        if (!bad) printf("synchronous cudaMemcpy waits for a default-stream kernel: ok\n");
    }

    CHECK_EACH(cudaStreamDestroy, s1, s2);
    CHECK(cudaFreeHost(h_pinned));
    CHECK_EACH(cudaFree, d_a, d_b);
    return test_finish();
}

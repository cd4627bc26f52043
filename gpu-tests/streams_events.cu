// streams_events: several streams, events, cross-stream waits, queries, elapsed time, async copies
// with pinned memory, memsets.
// Covers: cudaStreamCreate, cudaStreamCreateWithFlags, cudaStreamCreateWithPriority,
// cudaStreamDestroy, cudaStreamSynchronize, cudaStreamQuery, cudaStreamWaitEvent, cudaEventCreate,
// cudaEventCreateWithFlags, cudaEventRecord, cudaEventSynchronize, cudaEventQuery,
// cudaEventElapsedTime (> 0 only; the value goes to stderr), cudaEventDestroy, cudaMallocHost,
// cudaHostAlloc, cudaFreeHost, cudaMemcpyAsync (H2D, D2H, D2D), cudaMemset, cudaMemsetAsync,
// the special handles cudaStreamLegacy and cudaStreamPerThread.
#include "common.h"

#include <vector>

__global__ void scale_add(const int *in, int *out, int n, int mul, int add) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = out[i] + in[i] * mul + add;
}

__global__ void times3(const int *x, int *y) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *y = *x * 3;
}

int main() {
    test_init("streams_events");
    const unsigned long long MS = 1000000ull;

    // Streams of every creation flavour.
    const int NS = 4;
    cudaStream_t st[NS];
    CHECK(cudaStreamCreate(&st[0]));
    CHECK(cudaStreamCreateWithFlags(&st[1], cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithPriority(&st[2], cudaStreamDefault, 0));
    CHECK(cudaStreamCreateWithPriority(&st[3], cudaStreamNonBlocking, -1));
    for (int i = 0; i < NS; i++) expect_err("cudaStreamQuery on a new stream", cudaStreamQuery(st[i]), cudaSuccess);

    // Pinned host memory from both allocators.
    const int n = 1 << 20;  // per stream
    const size_t bytes = (size_t)n * sizeof(int);
    int *h_in = nullptr, *h_out = nullptr, *h_tmp = nullptr;
    CHECK(cudaMallocHost((void **)&h_in, NS * bytes));
    CHECK(cudaHostAlloc((void **)&h_out, NS * bytes, cudaHostAllocDefault));
    CHECK(cudaHostAlloc((void **)&h_tmp, NS * bytes, cudaHostAllocPortable));
    for (int i = 0; i < NS * n; i++) h_in[i] = i % 100003;
    memset(h_out, 0, NS * bytes);

    int *d_in[NS], *d_out[NS];
    for (int i = 0; i < NS; i++) {
        CHECK(cudaMalloc(&d_in[i], bytes));
        CHECK(cudaMalloc(&d_out[i], bytes));
    }

    // Independent pipelines, one per stream: memset, H2D, kernel, kernel, D2H.
    for (int i = 0; i < NS; i++) {
        CHECK(cudaMemsetAsync(d_out[i], 0, bytes, st[i]));
        CHECK(cudaMemcpyAsync(d_in[i], h_in + (size_t)i * n, bytes, cudaMemcpyHostToDevice, st[i]));
        scale_add<<<n / 256, 256, 0, st[i]>>>(d_in[i], d_out[i], n, i + 2, i);
        CHECK_LAUNCH();
        scale_add<<<n / 256, 256, 0, st[i]>>>(d_in[i], d_out[i], n, 1, 1);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(h_out + (size_t)i * n, d_out[i], bytes, cudaMemcpyDeviceToHost, st[i]));
    }
    for (int i = 0; i < NS; i++) CHECK(cudaStreamSynchronize(st[i]));
    for (int i = 0; i < NS; i++) {
        int bad = 0;
        for (int j = 0; j < n; j++) {
            int x = h_in[(size_t)i * n + j];
            if (h_out[(size_t)i * n + j] != x * (i + 2) + i + x + 1) bad++;
        }
        EXPECT(bad == 0, "stream %d pipeline: %d wrong", i, bad);
        if (!bad) printf("stream %d pipeline (memsetAsync, H2D, 2 kernels, D2H): ok\n", i);
    }
    for (int i = 0; i < NS; i++) expect_err("cudaStreamQuery after sync", cudaStreamQuery(st[i]), cudaSuccess);

    // Cross-stream wait: st[0] spins 150 ms then writes x = 7; st[1] waits on an event recorded after
    // that and computes y = 3x. Without the wait, y would be 0.
    {
        int *d_x, *d_y;
        CHECK(cudaMalloc(&d_x, sizeof(int)));
        CHECK(cudaMalloc(&d_y, sizeof(int)));
        CHECK(cudaMemset(d_x, 0, sizeof(int)));
        CHECK(cudaMemset(d_y, 0, sizeof(int)));
        CHECK(cudaDeviceSynchronize());
        cudaEvent_t ev;
        CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        expect_err("cudaEventQuery on a never-recorded event", cudaEventQuery(ev), cudaSuccess);
        spin_kernel<<<1, 1, 0, st[0]>>>(150 * MS, d_x, 7);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(ev, st[0]));
        expect_err("cudaEventQuery while the spin kernel runs", cudaEventQuery(ev), cudaErrorNotReady);
        expect_err("cudaStreamQuery while the spin kernel runs", cudaStreamQuery(st[0]), cudaErrorNotReady);
        CHECK(cudaStreamWaitEvent(st[1], ev, 0));
        times3<<<1, 1, 0, st[1]>>>(d_x, d_y);
        CHECK_LAUNCH();
        int *h_y = h_tmp;
        *h_y = -1;
        CHECK(cudaMemcpyAsync(h_y, d_y, sizeof(int), cudaMemcpyDeviceToHost, st[1]));
        CHECK(cudaStreamSynchronize(st[1]));
        printf("cross-stream wait: y = %d (want 21)\n", *h_y);
        EXPECT(*h_y == 21, "cudaStreamWaitEvent did not order the streams");
        CHECK(cudaEventSynchronize(ev));
        expect_err("cudaEventQuery after cudaEventSynchronize", cudaEventQuery(ev), cudaSuccess);
        // Timing is disabled on this event: elapsed time must be refused.
        float ms = 0;
        expect_err("cudaEventElapsedTime on a cudaEventDisableTiming event", cudaEventElapsedTime(&ms, ev, ev),
                   cudaErrorInvalidResourceHandle);
        report("cudaGetLastError after it", cudaGetLastError());
        expect_err("cudaGetLastError again", cudaGetLastError(), cudaSuccess);
        CHECK(cudaEventDestroy(ev));
        CHECK(cudaFree(d_x));
        CHECK(cudaFree(d_y));
    }

    // Elapsed time around a 20 ms spin on a priority stream.
    {
        cudaEvent_t start, stop, blocking;
        CHECK(cudaEventCreate(&start));
        CHECK(cudaEventCreate(&stop));
        CHECK(cudaEventCreateWithFlags(&blocking, cudaEventBlockingSync));
        CHECK(cudaEventRecord(start, st[2]));
        spin_kernel<<<1, 1, 0, st[2]>>>(20 * MS, nullptr, 0);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(stop, st[2]));
        CHECK(cudaEventRecord(blocking, st[2]));
        CHECK(cudaEventSynchronize(blocking));
        CHECK(cudaEventSynchronize(stop));
        float ms = -1;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        fprintf(stderr, "elapsed time around a 20 ms spin: %.3f ms\n", ms);
        printf("elapsed time > 0: %s\n", yes(ms > 0));
        printf("elapsed time >= 15 ms for a 20 ms spin: %s\n", yes(ms >= 15.0f));
        EXPECT(ms >= 15.0f, "elapsed time too small");
        float back = 1;
        CHECK(cudaEventElapsedTime(&back, stop, start));
        printf("elapsed time stop->start < 0: %s\n", yes(back < 0));
        CHECK(cudaEventDestroy(start));
        CHECK(cudaEventDestroy(stop));
        CHECK(cudaEventDestroy(blocking));
    }

    // Memsets: synchronous and async, odd sizes and unaligned starts; bytes outside stay untouched.
    {
        const size_t m = 1000003;
        unsigned char *d_m;
        CHECK(cudaMalloc(&d_m, m));
        CHECK(cudaMemset(d_m, 0xAB, m));
        // cudaMemset on device memory is asynchronous with respect to the host, and st[3] is a
        // non-blocking stream that does not wait for the legacy stream: order them explicitly.
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemsetAsync(d_m + 1, 0x5C, m - 2, st[3]));
        CHECK(cudaMemsetAsync(d_m + 4096, 0x00, 3, st[3]));
        unsigned char *h_m = (unsigned char *)h_tmp;
        CHECK(cudaMemcpyAsync(h_m, d_m, m, cudaMemcpyDeviceToHost, st[3]));
        CHECK(cudaStreamSynchronize(st[3]));
        int bad = 0;
        for (size_t i = 0; i < m; i++) {
            unsigned char want = (i == 0 || i == m - 1) ? 0xAB : (i >= 4096 && i < 4099) ? 0x00 : 0x5C;
            if (h_m[i] != want) bad++;
        }
        EXPECT(bad == 0, "memsets: %d wrong bytes", bad);
        if (!bad) printf("cudaMemset/cudaMemsetAsync (odd size, unaligned, edges kept): ok\n");
        CHECK(cudaFree(d_m));
    }

    // Async device-to-device copy, then the special stream handles.
    {
        CHECK(cudaMemcpyAsync(d_out[1], d_in[0], bytes, cudaMemcpyDeviceToDevice, st[1]));
        CHECK(cudaMemcpyAsync(h_tmp, d_out[1], bytes, cudaMemcpyDeviceToHost, st[1]));
        CHECK(cudaStreamSynchronize(st[1]));
        EXPECT(memcmp(h_tmp, h_in, bytes) == 0, "async D2D copy differs");
        if (memcmp(h_tmp, h_in, bytes) == 0) printf("cudaMemcpyAsync device-to-device: ok\n");

        memset(h_tmp, 0, bytes);
        CHECK(cudaMemcpyAsync(d_out[2], h_in + n, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread));
        scale_add<<<n / 256, 256, 0, cudaStreamPerThread>>>(d_in[0], d_out[2], n, 0, 5);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(h_tmp, d_out[2], bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread));
        CHECK(cudaStreamSynchronize(cudaStreamPerThread));
        int bad = 0;
        for (int j = 0; j < n; j++)
            if (h_tmp[j] != h_in[n + j] + 5) bad++;
        EXPECT(bad == 0, "cudaStreamPerThread: %d wrong", bad);
        if (!bad) printf("cudaStreamPerThread handle: ok\n");

        memset(h_tmp, 0, bytes);
        scale_add<<<n / 256, 256, 0, cudaStreamLegacy>>>(d_in[0], d_out[2], n, 0, 1);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(h_tmp, d_out[2], bytes, cudaMemcpyDeviceToHost, cudaStreamLegacy));
        CHECK(cudaStreamSynchronize(cudaStreamLegacy));
        bad = 0;
        for (int j = 0; j < n; j++)
            if (h_tmp[j] != h_in[n + j] + 6) bad++;
        EXPECT(bad == 0, "cudaStreamLegacy: %d wrong", bad);
        if (!bad) printf("cudaStreamLegacy handle: ok\n");
    }

    // Destroying a stream with work still queued is allowed: the work completes.
    {
        cudaStream_t tmp;
        CHECK(cudaStreamCreate(&tmp));
        spin_kernel<<<1, 1, 0, tmp>>>(30 * MS, d_out[3], 99);
        CHECK_LAUNCH();
        CHECK(cudaStreamDestroy(tmp));
        CHECK(cudaDeviceSynchronize());
        int v = 0;
        CHECK(cudaMemcpy(&v, d_out[3], sizeof(int), cudaMemcpyDeviceToHost));
        printf("work queued on a destroyed stream completed: %s\n", yes(v == 99));
        EXPECT(v == 99, "work on destroyed stream: %d", v);
    }

    for (int i = 0; i < NS; i++) {
        CHECK(cudaStreamDestroy(st[i]));
        CHECK(cudaFree(d_in[i]));
        CHECK(cudaFree(d_out[i]));
    }
    CHECK(cudaFreeHost(h_in));
    CHECK(cudaFreeHost(h_out));
    CHECK(cudaFreeHost(h_tmp));
    return test_finish();
}

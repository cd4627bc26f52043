// graph_capture: a typical CUDA-graphs program. A stream capture records a few kernels and a
// device-to-device copy; the graph is instantiated and launched in a loop, timed with events (the
// time goes to stderr); the result is checked against the same steps done on the host; a second
// capture is applied with cudaGraphExecUpdate. Then:
//  - a capture that forks to a second stream and joins back (cudaEventRecord on the capturing
//    stream, cudaStreamWaitEvent on the other, a kernel there, an event back, a wait on the origin),
//    with cudaStreamGetCaptureInfo (status, a nonzero capture id) and cudaStreamIsCapturing on both;
//  - captures in cudaStreamCaptureModeThreadLocal and cudaStreamCaptureModeRelaxed;
//  - cudaMalloc during a global-mode capture (an unsafe call there: the error names of the
//    cudaMalloc and of the cudaStreamEndCapture are printed, the native run is the reference);
//  - cudaThreadExchangeStreamCaptureMode to relaxed around a cudaMalloc during a global-mode
//    capture (allowed), the new allocation used by the captured kernels;
//  - global-mode captures begun right after large copies from pageable memory.
// Every call is checked.
#include "common.h"

#include <vector>

__global__ void scale(float *x, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a;
}

__global__ void add_index(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + (float)(i % 7);
}

__global__ void clamp_to(float *x, int n, float hi) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && x[i] > hi) x[i] = hi;
}

__global__ void fill_mod5(float *z, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = (float)(i % 5);
}

__global__ void add_from(float *x, const float *z, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += z[i];
}

// Copies x back and compares it with the host's steps.
// The captured steps: x = min(x * a + i % 7, 100); y = x.
static void enqueue_steps(cudaStream_t s, float *x, float *y, int n, float a) {
    scale<<<(n + 255) / 256, 256, 0, s>>>(x, n, a);
    CHECK_LAUNCH();
    add_index<<<(n + 255) / 256, 256, 0, s>>>(x, n);
    CHECK_LAUNCH();
    clamp_to<<<(n + 255) / 256, 256, 0, s>>>(x, n, 100.0f);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
}

static void check_x(const float *x, const std::vector<float> &want, std::vector<float> &h, const char *what) {
    CHECK(cudaMemcpy(h.data(), x, want.size() * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < want.size(); i++)
        if (h[i] != want[i]) bad++;
    EXPECT(bad == 0, "%s: %d of %zu results differ from the host's", what, bad, want.size());
    printf("%s: %s\n", what, bad ? "wrong" : "ok");
}

int main() {
    test_init("graph_capture");
    const int n = 1 << 16, launches = 200;
    const size_t bytes = n * sizeof(float);
    std::vector<float> h(n), want(n);
    for (int i = 0; i < n; i++) want[i] = h[i] = (float)(i % 13);

    float *x = nullptr, *y = nullptr;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMemcpy(x, h.data(), bytes, cudaMemcpyHostToDevice));

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // Capture: x = min(x * 0.5 + i % 7, 100); y = x.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CHECK(cudaStreamIsCapturing(s, &status));
    printf("capturing before begin: %s\n", status == cudaStreamCaptureStatusNone ? "no" : "yes");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaStreamIsCapturing(s, &status));
    printf("capturing after begin: %s\n", status == cudaStreamCaptureStatusActive ? "yes" : "no");
    enqueue_steps(s, x, y, n, 0.5f);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph));
    EXPECT(graph != nullptr, "cudaStreamEndCapture gave no graph");
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    printf("graph nodes: %zu\n", nodes);

    cudaGraphExec_t exec = nullptr;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));

    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start, s));
    for (int i = 0; i < launches; i++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaStreamSynchronize(s));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    fprintf(stderr, "%d graph launches: %.3f ms (%.2f us each)\n", launches, ms, ms * 1000.0f / launches);
    printf("graph launches: %d, elapsed time positive: %s\n", launches, ms > 0 ? "yes" : "no");

    // The same steps on the host (exact in float: small integers and halves).
    for (int l = 0; l < launches; l++)
        for (int i = 0; i < n; i++) {
            float v = want[i] * 0.5f + (float)(i % 7);
            want[i] = v > 100.0f ? 100.0f : v;
        }
    CHECK(cudaMemcpy(h.data(), y, bytes, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (h[i] != want[i]) bad++;
    EXPECT(bad == 0, "%d of %d results differ from the host's", bad, n);
    printf("results after %d graph launches: %s\n", launches, bad ? "wrong" : "ok");

    // Update a kernel parameter by capturing again and updating the executable graph in place.
    cudaGraph_t graph2 = nullptr;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enqueue_steps(s, x, y, n, 0.25f);
    CHECK(cudaStreamEndCapture(s, &graph2));
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(exec, graph2, &info));
    printf("graph update: %s\n", info.result == cudaGraphExecUpdateSuccess ? "in place" : "refused");
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) {
        float v = want[i] * 0.25f + (float)(i % 7);
        want[i] = v > 100.0f ? 100.0f : v;
    }
    CHECK(cudaMemcpy(h.data(), y, bytes, cudaMemcpyDeviceToHost));
    bad = 0;
    for (int i = 0; i < n; i++)
        if (h[i] != want[i]) bad++;
    EXPECT(bad == 0, "%d of %d results differ after the update", bad, n);
    printf("results after the update: %s\n", bad ? "wrong" : "ok");

    CHECK(cudaGraphExecDestroy(exec));

    // Fork/join: x = x * 0.5 on s, z = i % 5 on s2, then x += z on s.
    cudaStream_t s2;
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    float *z = nullptr;
    CHECK(cudaMalloc(&z, bytes));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    unsigned long long id = 0;
    CHECK(cudaStreamGetCaptureInfo(s, &status, &id));
    printf("capture info: %s, capture id nonzero: %s\n",
           status == cudaStreamCaptureStatusActive ? "active" : "not active", id != 0 ? "yes" : "no");
    EXPECT(status == cudaStreamCaptureStatusActive && id != 0, "cudaStreamGetCaptureInfo: status %d, id %llu",
           (int)status, id);
    scale<<<(n + 255) / 256, 256, 0, s>>>(x, n, 0.5f);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(fork, s));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    CHECK(cudaStreamIsCapturing(s2, &status));
    printf("second stream capturing after the fork: %s\n", status == cudaStreamCaptureStatusActive ? "yes" : "no");
    fill_mod5<<<(n + 255) / 256, 256, 0, s2>>>(z, n);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s, join, 0));
    add_from<<<(n + 255) / 256, 256, 0, s>>>(x, z, n);
    CHECK_LAUNCH();
    cudaGraph_t forked = nullptr;
    CHECK(cudaStreamEndCapture(s, &forked));
    CHECK(cudaStreamIsCapturing(s2, &status));
    printf("second stream capturing after the end: %s\n", status == cudaStreamCaptureStatusNone ? "no" : "yes");
    CHECK(cudaGraphGetNodes(forked, nullptr, &nodes));
    printf("fork/join graph nodes: %zu\n", nodes);
    CHECK(cudaGraphInstantiate(&exec, forked, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) want[i] = want[i] * 0.5f + (float)(i % 5);
    check_x(x, want, h, "fork/join graph");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(forked));

    // Thread-local and relaxed capture modes: x = x * 0.5 + i % 7, launched twice.
    const cudaStreamCaptureMode modes[] = {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed};
    const char *mode_names[] = {"thread-local", "relaxed"};
    for (int m = 0; m < 2; m++) {
        cudaGraph_t mg = nullptr;
        CHECK(cudaStreamBeginCapture(s, modes[m]));
        scale<<<(n + 255) / 256, 256, 0, s>>>(x, n, 0.5f);
        CHECK_LAUNCH();
        add_index<<<(n + 255) / 256, 256, 0, s>>>(x, n);
        CHECK_LAUNCH();
        CHECK(cudaStreamEndCapture(s, &mg));
        CHECK(cudaGraphInstantiate(&exec, mg, 0));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        for (int l = 0; l < 2; l++)
            for (int i = 0; i < n; i++) want[i] = want[i] * 0.5f + (float)(i % 7);
        check_x(x, want, h, mode_names[m]);
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(mg));
    }

    // cudaMalloc during a global-mode capture: refused, and the capture is invalidated.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    scale<<<(n + 255) / 256, 256, 0, s>>>(x, n, 0.5f);
    CHECK_LAUNCH();
    void *p = nullptr;
    cudaError_t e = report("cudaMalloc during a global capture", cudaMalloc(&p, 1 << 20));
    if (e == cudaSuccess) CHECK(cudaFree(p));
    cudaGraph_t bad_graph = nullptr;
    e = report("cudaStreamEndCapture after it", cudaStreamEndCapture(s, &bad_graph));
    printf("graph after it: %s\n", bad_graph ? "yes" : "none");
    if (bad_graph) CHECK(cudaGraphDestroy(bad_graph));
    cudaGetLastError();
    CHECK(cudaStreamIsCapturing(s, &status));
    printf("capturing afterwards: %s\n", status == cudaStreamCaptureStatusNone ? "no" : "yes");
    // The scale kernel was captured, never run: x is unchanged.
    check_x(x, want, h, "x after the invalidated capture");

    // The same with the thread's mode exchanged to relaxed around the cudaMalloc: allowed.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    printf("thread capture mode before the exchange: %s\n", mode == cudaStreamCaptureModeGlobal ? "global" : "other");
    float *w = nullptr;
    CHECK(cudaMalloc(&w, bytes));
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    printf("mode given back by the second exchange: %s\n", mode == cudaStreamCaptureModeRelaxed ? "relaxed" : "other");
    fill_mod5<<<(n + 255) / 256, 256, 0, s>>>(w, n);
    CHECK_LAUNCH();
    add_from<<<(n + 255) / 256, 256, 0, s>>>(x, w, n);
    CHECK_LAUNCH();
    cudaGraph_t relaxed_graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &relaxed_graph));
    CHECK(cudaGraphInstantiate(&exec, relaxed_graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) want[i] = want[i] + (float)(i % 5);
    check_x(x, want, h, "cudaMalloc with the mode exchanged");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(relaxed_graph));
    CHECK(cudaFree(w));

    // Global-mode captures begun right after large copies from pageable memory, synchronous and
    // asynchronous on another stream: whatever the copies left behind (in Flyt, the staging
    // slots' waits) must not invalidate the captures.
    const size_t big_n = 8 << 20;
    std::vector<float> big_h(big_n, 1.0f);
    float *big = nullptr;
    CHECK(cudaMalloc(&big, big_n * sizeof(float)));
    const int rounds = 40;
    int valid = 0;
    for (int r = 0; r < rounds; r++) {
        if (r % 2 == 0)
            CHECK(cudaMemcpy(big, big_h.data(), big_n * sizeof(float), cudaMemcpyHostToDevice));
        else
            CHECK(cudaMemcpyAsync(big, big_h.data(), big_n * sizeof(float), cudaMemcpyHostToDevice, s2));
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        scale<<<(n + 255) / 256, 256, 0, s>>>(x, n, 1.0f);
        CHECK_LAUNCH();
        cudaGraph_t round_graph = nullptr;
        cudaError_t ended = cudaStreamEndCapture(s, &round_graph);
        if (ended == cudaSuccess && round_graph) valid++;
        else fprintf(stderr, "round %d: cudaStreamEndCapture: %s\n", r, cudaGetErrorName(ended));
        if (round_graph) CHECK(cudaGraphDestroy(round_graph));
        cudaGetLastError();
        CHECK(cudaStreamSynchronize(s2));
    }
    printf("captures begun after large copies: %d of %d valid\n", valid, rounds);
    EXPECT(valid == rounds, "%d of %d captures after large copies were invalidated", rounds - valid, rounds);
    CHECK_EACH(cudaFree, big, z);
    CHECK_EACH(cudaEventDestroy, fork, join);
    CHECK(cudaStreamDestroy(s2));

    CHECK_EACH(cudaGraphDestroy, graph, graph2);
    CHECK_EACH(cudaEventDestroy, start, stop);
    CHECK(cudaStreamDestroy(s));
    CHECK_EACH(cudaFree, x, y);
    return test_finish();
}

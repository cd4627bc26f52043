// graph_capture: a typical CUDA-graphs program. A stream capture records a few kernels and a
// device-to-device copy; the graph is instantiated and launched in a loop, timed with events; the
// result is checked against the same steps done on the host. Every call is checked.
//
// Natively it must PASS. Flyt does not support graphs: through Flyt the first graph call must fail
// (the program prints which and exits 1) and the shim names the function on stderr. It must never
// exit 0 there: a graph program that "succeeds" without running its graph produces garbage.
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
    scale<<<(n + 255) / 256, 256, 0, s>>>(x, n, 0.5f);
    CHECK_LAUNCH();
    add_index<<<(n + 255) / 256, 256, 0, s>>>(x, n);
    CHECK_LAUNCH();
    clamp_to<<<(n + 255) / 256, 256, 0, s>>>(x, n, 100.0f);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s));
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
    scale<<<(n + 255) / 256, 256, 0, s>>>(x, n, 0.25f);
    CHECK_LAUNCH();
    add_index<<<(n + 255) / 256, 256, 0, s>>>(x, n);
    CHECK_LAUNCH();
    clamp_to<<<(n + 255) / 256, 256, 0, s>>>(x, n, 100.0f);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s));
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
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaGraphDestroy(graph2));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    return test_finish();
}

// What the driver answers to cuStreamEndCapture(stream, NULL): after a capture into a graph the
// app made (cuStreamBeginCaptureToGraph, as NVIDIA's graphConditionalNodes does for a do-while
// body) and after an ordinary capture; and whether the stream still captures afterwards.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>

__global__ void empty_kernel() {}

static const char *name(CUresult r) {
    const char *s = nullptr;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

int main() {
    cudaFree(nullptr);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    cudaStreamCaptureStatus status;

    cudaGraph_t graph;
    cudaGraphCreate(&graph, 0);
    cudaError_t begin = cudaStreamBeginCaptureToGraph(stream, graph, nullptr, nullptr, 0, cudaStreamCaptureModeGlobal);
    empty_kernel<<<1, 1, 0, stream>>>();
    CUresult end = cuStreamEndCapture((CUstream)stream, nullptr);
    cudaStreamIsCapturing(stream, &status);
    size_t nodes = 0;
    cudaGraphGetNodes(graph, nullptr, &nodes);
    printf("to-graph: begin %d, end(NULL) %s, capturing after %d, graph nodes %zu\n", (int)begin, name(end), (int)status, nodes);
    if (status != cudaStreamCaptureStatusNone) cuStreamEndCapture((CUstream)stream, (CUgraph *)&graph);

    cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    empty_kernel<<<1, 1, 0, stream>>>();
    end = cuStreamEndCapture((CUstream)stream, nullptr);
    cudaStreamIsCapturing(stream, &status);
    printf("ordinary: end(NULL) %s, capturing after %d\n", name(end), (int)status);
    if (status != cudaStreamCaptureStatusNone) {
        cudaGraph_t g2 = nullptr;
        CUresult again = cuStreamEndCapture((CUstream)stream, (CUgraph *)&g2);
        printf("ordinary: second end %s, graph %s\n", name(again), g2 ? "made" : "NULL");
    }
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    return 0;
}

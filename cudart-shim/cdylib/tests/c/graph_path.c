/* What a typical CUDA graphs program does, without kernels (the emulated device runs none): work
 * captured on a stream, forked onto a second stream and joined back, the graph instantiated and
 * launched in a loop; a capture that meets a copy to host memory, which a graph served over a
 * socket cannot hold; a host function in stream order. Every call is checked; the program prints
 * what it saw and exits 0 when all of it is as CUDA documents.
 *
 * Built twice: as is, and with CUDA_API_PER_THREAD_DEFAULT_STREAM (the `_ptsz` entry points). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N (1 << 16)
#define LAUNCHES 100

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "CUDA error %s (%s) at line %d: %s\n", cudaGetErrorName(err_),         \
                    cudaGetErrorString(err_), __LINE__, #call);                                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int all_equal(const unsigned char *bytes, unsigned char value) {
    for (int i = 0; i < N; i++)
        if (bytes[i] != value) return 0;
    return 1;
}

static void CUDART_CB count(void *counter) { ++*(volatile int *)counter; }

int main(void) {
    cudaStream_t stream, forked;
    cudaEvent_t inside, joined;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone, forked_status = cudaStreamCaptureStatusNone;
    unsigned long long capture_id = 0;
    unsigned char *a = NULL, *b = NULL, *back = malloc(N);
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&forked, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&inside, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
    CHECK(cudaMalloc((void **)&a, N));
    CHECK(cudaMalloc((void **)&b, N));
    CHECK(cudaMemset(a, 0x11, N));
    CHECK(cudaMemset(b, 0x11, N));

    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK(cudaEventRecord(inside, stream));
    CHECK(cudaStreamWaitEvent(forked, inside, 0));
    CHECK(cudaMemsetAsync(a, 0x33, N, forked));
    CHECK(cudaStreamIsCapturing(forked, &forked_status));
    CHECK(cudaEventRecord(joined, forked));
    CHECK(cudaStreamWaitEvent(stream, joined, 0));
    CHECK(cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, stream));
    CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture_id, NULL, NULL, NULL, NULL));
    CHECK(cudaStreamEndCapture(stream, &graph));
    printf("capture seen: %s, forked stream joined: %s, capture id set: %s\n",
           status == cudaStreamCaptureStatusActive ? "yes" : "no",
           forked_status == cudaStreamCaptureStatusActive ? "yes" : "no", capture_id ? "yes" : "no");
    CHECK(cudaStreamIsCapturing(forked, &forked_status));
    printf("forked stream left the capture: %s\n", forked_status == cudaStreamCaptureStatusNone ? "yes" : "no");
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, NULL, &nodes));
    printf("graph nodes: %zu\n", nodes);
    CHECK(cudaMemcpy(back, b, N, cudaMemcpyDeviceToHost));
    printf("captured work waited for the launch: %s\n", all_equal(back, 0x11) ? "yes" : "no");
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphUpload(exec, stream));
    for (int i = 0; i < LAUNCHES; i++) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(back, b, N, cudaMemcpyDeviceToHost));
    printf("graph ran: %s\n", all_equal(back, 0x33) ? "yes" : "no");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    /* A copy to this process's memory is recorded as a node: each launch writes the host
     * memory with the device's bytes of that launch, in order with the graph's other work. */
    memset(back, 0, N);
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(a, 0x44, N, stream));
    cudaError_t copied = cudaMemcpyAsync(back, a, N, cudaMemcpyDeviceToHost, stream);
    cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    printf("capture with a copy to host memory: copy %s, end %s, graph %s, host memory untouched: %s\n", cudaGetErrorName(copied),
           cudaGetErrorName(ended), graph ? "SET" : "none", all_equal(back, 0) ? "yes" : "no");
    if (graph) {
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaStreamSynchronize(stream));
        printf("the launch wrote the host memory: %s\n", all_equal(back, 0x44) ? "yes" : "no");
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
    }

    volatile int counter = 0;
    CHECK(cudaLaunchHostFunc(stream, count, (void *)&counter));
    CHECK(cudaLaunchHostFunc(stream, count, (void *)&counter));
    CHECK(cudaStreamSynchronize(stream));
    printf("host functions ran: %d\n", counter);
    free(back);
    return 0;
}

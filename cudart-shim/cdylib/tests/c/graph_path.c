/* What a typical CUDA graphs program does, without kernels (the emulated device runs none): work
 * captured on a stream, the graph instantiated and launched in a timed loop, events around it.
 * Flyt does not support graphs; this program shows how that reaches the app.
 *
 *   graph_path checked    checks every call as careful programs do: must stop at the first
 *                         refused call, exit 1, and say which.
 *   graph_path unchecked  checks nothing on the graph path, as the program that printed nonsense
 *                         timings did: prints `call <what> -> <error name>` for every call, then
 *                         whether the captured work ran anyway, then what its synchronization
 *                         said. The test requires an error from each call of the path.
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

/* Unchecked: the result is only printed, and the program goes on. */
#define CALL(what, call) printf("call %s -> %s\n", what, cudaGetErrorName(call))

static int checked(void) {
    cudaStream_t stream;
    cudaEvent_t start, stop;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void *a = NULL, *b = NULL;
    float ms = 0;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaMalloc(&a, N));
    CHECK(cudaMalloc(&b, N));
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int step = 0; step < 4; step++) {
        CHECK(cudaMemsetAsync(a, step, N, stream));
        CHECK(cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, stream));
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < LAUNCHES; i++) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    printf("%.3f us per graph launch\n", 1000.0f * ms / LAUNCHES);
    return 0;
}

static int unchecked(void) {
    cudaStream_t stream, forked;
    cudaEvent_t start, stop, inside, joined;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaGraphNode_t nodes[8];
    size_t node_count = 0;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long capture_id = 0;
    unsigned char *a = NULL, *back = malloc(N);
    float ms = -1;

    /* Set up (outside the graph path: these must work). */
    if (cudaStreamCreate(&stream) != cudaSuccess || cudaStreamCreate(&forked) != cudaSuccess ||
        cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess ||
        cudaEventCreate(&inside) != cudaSuccess || cudaEventCreate(&joined) != cudaSuccess ||
        cudaMalloc((void **)&a, N) != cudaSuccess || cudaMemset(a, 0x11, N) != cudaSuccess) {
        printf("setup failed\n");
        return 2;
    }

    /* The graph path. */
    CALL("cudaStreamBeginCapture", cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CALL("cudaEventRecord in capture", cudaEventRecord(inside, stream));
    /* Fork a second stream into the capture and join it back, as multi-stream captures do. */
    CALL("cudaStreamWaitEvent forking a second stream", cudaStreamWaitEvent(forked, inside, 0));
    CALL("cudaMemsetAsync on the forked stream", cudaMemsetAsync(a, 0x33, N, forked));
    CALL("cudaEventRecord on the forked stream", cudaEventRecord(joined, forked));
    CALL("cudaStreamWaitEvent joining the forked stream", cudaStreamWaitEvent(stream, joined, 0));
    CALL("cudaMemsetAsync in capture", cudaMemsetAsync(a, 0x22, N, stream));
    CALL("cudaMemcpyAsync in capture", cudaMemcpyAsync(back, a, N, cudaMemcpyDeviceToHost, stream));
    CALL("cudaStreamWaitEvent in capture", cudaStreamWaitEvent(stream, start, 0));
    CALL("cudaStreamQuery in capture", cudaStreamQuery(stream));
    CALL("cudaEventSynchronize on an event of the capture", cudaEventSynchronize(inside));
    CALL("cudaStreamIsCapturing", cudaStreamIsCapturing(stream, &status));
    CALL("cudaStreamGetCaptureInfo", cudaStreamGetCaptureInfo(stream, &status, &capture_id, NULL, NULL, NULL, NULL));
    CALL("cudaStreamEndCapture", cudaStreamEndCapture(stream, &graph));
    CALL("cudaGraphGetNodes", cudaGraphGetNodes(graph, nodes, &node_count));
    CALL("cudaGraphInstantiate", cudaGraphInstantiate(&exec, graph, 0));
    CALL("cudaGraphUpload", cudaGraphUpload(exec, stream));
    printf("outside cudaStreamQuery on the forked stream after the capture -> %s\n", cudaGetErrorName(cudaStreamQuery(forked)));
    /* The timed loop. Recording on the stream works again once the capture has ended. */
    printf("outside cudaEventRecord start -> %s\n", cudaGetErrorName(cudaEventRecord(start, stream)));
    for (int i = 0; i < LAUNCHES; i++) {
        cudaError_t launched = cudaGraphLaunch(exec, stream);
        if (i == 0) printf("call cudaGraphLaunch -> %s\n", cudaGetErrorName(launched));
    }
    printf("outside cudaEventRecord stop -> %s\n", cudaGetErrorName(cudaEventRecord(stop, stream)));
    CALL("cudaEventSynchronize after the graph launches", cudaEventSynchronize(stop));
    CALL("cudaEventElapsedTime from an event recorded in capture", cudaEventElapsedTime(&ms, inside, stop));
    CALL("cudaGraphExecDestroy", cudaGraphExecDestroy(exec));
    CALL("cudaGraphDestroy", cudaGraphDestroy(graph));

    /* What the device holds: the work "captured" must not have run behind the app's back. */
    memset(back, 0, N);
    cudaError_t copied = cudaMemcpy(back, a, N, cudaMemcpyDeviceToHost);
    int untouched = copied == cudaSuccess;
    for (int i = 0; i < N && untouched; i++) untouched = back[i] == 0x11;
    printf("captured work did not run: %s\n", untouched ? "yes" : "no");
    printf("a later synchronization is clean: %s\n", cudaDeviceSynchronize() == cudaSuccess ? "yes" : "no");
    printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
    free(back);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "checked") == 0) return checked();
    if (argc == 2 && strcmp(argv[1], "unchecked") == 0) return unchecked();
    fprintf(stderr, "usage: graph_path checked|unchecked\n");
    return 2;
}

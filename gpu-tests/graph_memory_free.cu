// graph_memory_free: graph memory freed outside its graph, as NVIDIA's graphMemoryNodes sample
// does: an explicit graph (allocation node, kernel writing the memory, copy out) and a captured
// one (cudaMallocAsync, kernel, copy out, no free), each launched twice with cudaFree of the
// graph's memory after every launch; the copied values, the results of the frees (printed: the
// native run is the reference), the graph memory attributes and a trim.
#include "graph_add_kernel.h"

__global__ void fill(int *p, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = value + i;
}

static const int N = 1 << 18;

static bool right(const int *host, int value) {
    for (int i = 0; i < N; i++)
        if (host[i] != value + i) return false;
    return true;
}

// Instantiates graph g (`which`: explicit or captured) and launches it twice on s: after each
// launch, whether out holds value + i, and what cudaFree of the graph's memory mem answers.
static cudaGraphExec_t launch_twice_freeing(const char *which, cudaGraph_t g, cudaStream_t s, const int *out, int *host, int value,
                                           void *mem) {
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    char freed[64];
    snprintf(freed, sizeof freed, "%s graph memory freed with cudaFree", which);
    for (int round = 0; round < 2; round++) {
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(host, out, N * sizeof(int), cudaMemcpyDeviceToHost));
        printf("%s graph, launch %d: values right: %s\n", which, round, right(host, value) ? "yes" : "no");
        report(freed, cudaFree(mem));
    }
    return exec;
}

int main() {
    test_init("graph_memory_free");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *out;
    CHECK(cudaMalloc(&out, N * sizeof(int)));
    int *host = (int *)malloc(N * sizeof(int));

    // Explicit: allocation node -> kernel -> copy out.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams alloc;
    cudaGraphNode_t alloc_node = add_device_alloc(g, NULL, 0, N * sizeof(int), &alloc);
    int *mem = (int *)alloc.dptr;
    int n = N, value = 7;
    void *args[] = {&mem, &n, &value};
    cudaGraphNode_t kernel_node = add_kernel(g, &alloc_node, 1, (void *)fill, dim3((N + 255) / 256), dim3(256), args);
    cudaGraphNode_t copy_node;
    CHECK(cudaGraphAddMemcpyNode1D(&copy_node, g, &kernel_node, 1, out, mem, N * sizeof(int), cudaMemcpyDeviceToDevice));
    cudaGraphExec_t exec = launch_twice_freeing("explicit", g, s, out, host, 7, mem);
    size_t reserved = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &reserved));
    printf("graph memory reserved > 0: %s\n", reserved > 0 ? "yes" : "no");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // Captured: cudaMallocAsync -> kernel -> copy out, no free in the graph.
    cudaGraph_t captured;
    int *cmem = NULL;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMallocAsync((void **)&cmem, N * sizeof(int), s));
    fill<<<(N + 255) / 256, 256, 0, s>>>(cmem, N, 11);
    CHECK(cudaMemcpyAsync(out, cmem, N * sizeof(int), cudaMemcpyDeviceToDevice, s));
    CHECK(cudaStreamEndCapture(s, &captured));
    exec = launch_twice_freeing("captured", captured, s, out, host, 11, cmem);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(captured));
    CHECK(cudaDeviceSynchronize());
    report("cudaDeviceGraphMemTrim", cudaDeviceGraphMemTrim(0));
    size_t used = 1;
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
    printf("graph memory in use after the frees and the trim: %zu\n", used);
    free(host);
    CHECK(cudaFree(out));
    CHECK(cudaStreamDestroy(s));
    return test_finish();
}

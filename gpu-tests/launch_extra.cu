// Kernel arguments passed as one buffer (cuLaunchKernel's `extra`: CU_LAUNCH_PARAM_BUFFER_POINTER
// and _SIZE), as NCCL launches its kernels: a buffer of the parameters' exact size, and one
// shorter than a large declared parameter (NCCL fills only the work it has of its 4 KiB argument
// storage; the driver takes it). Both through cuLaunchKernel and cuLaunchKernelEx, and the kernel
// node of a graph made with `extra`. The kernel copies what it was given into device memory,
// read back and printed.
#include "driver_check.h"

#include <cstddef>

struct Small {
    int a;
    long long b;
};

// A large parameter of which callers fill the head only.
struct Storage {
    unsigned count;
    unsigned words[1023];
};

static __global__ void copy_small(Small s, int *out) {
    out[0] = s.a;
    out[1] = (int)(s.b >> 32);
    out[2] = (int)s.b;
}

static __global__ void copy_storage(int *out, Storage storage) {
    for (unsigned i = 0; i < storage.count && i < 16; i++) out[i] = (int)storage.words[i];
    out[16] = (int)storage.count;
}

static void show(const char *what, const int *device, int n) {
    int host[17] = {0};
    CHECK(cudaMemcpy(host, device, n * sizeof(int), cudaMemcpyDeviceToHost));
    printf("%s:", what);
    for (int i = 0; i < n; i++) printf(" %d", host[i]);
    printf("\n");
}

int main() {
    test_init("launch_extra");
    CHECK(cudaFree(0));
    int *out = nullptr;
    CHECK(cudaMalloc(&out, 17 * sizeof(int)));
    CUfunction small_fn, storage_fn;
    CHECK(cudaGetFuncBySymbol(&small_fn, (const void *)copy_small));
    CHECK(cudaGetFuncBySymbol(&storage_fn, (const void *)copy_storage));

    // Exact size: the parameters as the kernel lays them out.
    struct {
        Small s;
        int *out;
    } exact = {{7, (5LL << 32) | 9}, out};
    size_t exact_size = sizeof exact;
    void *exact_extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &exact, CU_LAUNCH_PARAM_BUFFER_SIZE, &exact_size, CU_LAUNCH_PARAM_END};
    CHECK(cudaMemset(out, 0, 17 * sizeof(int)));
    CHECK_CU(cuLaunchKernel(small_fn, 1, 1, 1, 1, 1, 1, 0, 0, nullptr, exact_extra));
    show("exact buffer", out, 3);

    // Short: the pointer, then the storage's count and its first 5 words of 1023.
    struct {
        int *out;
        unsigned count;
        unsigned words[5];
    } head = {out, 5, {11, 22, 33, 44, 55}};
    size_t head_size = sizeof head;
    void *short_extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &head, CU_LAUNCH_PARAM_BUFFER_SIZE, &head_size, CU_LAUNCH_PARAM_END};
    CHECK(cudaMemset(out, 0, 17 * sizeof(int)));
    CHECK_CU(cuLaunchKernel(storage_fn, 1, 1, 1, 1, 1, 1, 0, 0, nullptr, short_extra));
    show("short buffer", out, 17);

    CUlaunchAttribute attribute;
    attribute.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attribute.value.priority = 0;
    CUlaunchConfig config = {};
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = config.blockDimY = config.blockDimZ = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    head.words[0] = 99;
    CHECK(cudaMemset(out, 0, 17 * sizeof(int)));
    CHECK_CU(cuLaunchKernelEx(&config, storage_fn, nullptr, short_extra));
    show("short buffer, cuLaunchKernelEx", out, 17);

    // A graph kernel node made with the short buffer.
    CUgraph graph;
    CUgraphExec exec;
    CHECK_CU(cuGraphCreate(&graph, 0));
    CUDA_KERNEL_NODE_PARAMS node = {};
    node.func = storage_fn;
    node.gridDimX = node.gridDimY = node.gridDimZ = 1;
    node.blockDimX = node.blockDimY = node.blockDimZ = 1;
    node.extra = short_extra;
    head.words[1] = 77;
    CUgraphNode kernel;
    CHECK_CU(cuGraphAddKernelNode(&kernel, graph, nullptr, 0, &node));
    CHECK_CU(cuGraphInstantiate(&exec, graph, 0));
    CHECK(cudaMemset(out, 0, 17 * sizeof(int)));
    CHECK_CU(cuGraphLaunch(exec, 0));
    CHECK(cudaDeviceSynchronize());
    show("short buffer, graph node", out, 17);
    CHECK_CU(cuGraphExecDestroy(exec));
    CHECK_CU(cuGraphDestroy(graph));
    CHECK(cudaFree(out));
    return test_finish();
}

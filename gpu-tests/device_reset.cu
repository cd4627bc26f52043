// device_reset: what cudaDeviceReset gives back. CUDA destroys the primary context, so limits the
// app changed (printf FIFO, stack size, malloc heap) return to their defaults, and a kernel that
// used printf before the reset does not pin the FIFO size for the new context. What the app
// registered stays usable: kernels launch, module variables start from their initial values
// again, and new memory (device, pinned, pageable copies) works after the reset.
#include "common.h"

__device__ int counter = 40;

__global__ void hello_kernel(int v) { printf("kernel %d\n", v); }
__global__ void bump(int *out) { out[0] = ++counter; }
__global__ void scale(float *data, int n, float by) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] *= by;
}

// One round of copies and a kernel through fresh memory: pageable and pinned, sync and async.
static void copies_round(const char *when) {
    const int n = 1 << 20;
    float *host = (float *)malloc(n * sizeof(float)), *pinned = NULL, *device = NULL;
    for (int i = 0; i < n; i++) host[i] = (float)(i % 1000);
    CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
    CHECK(cudaMalloc(&device, n * sizeof(float)));
    CHECK(cudaMemcpy(device, host, n * sizeof(float), cudaMemcpyHostToDevice));
    scale<<<(n + 255) / 256, 256>>>(device, n, 2.0f);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, device, n * sizeof(float), cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaMemcpy(host, device, n * sizeof(float), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += host[i] != 2.0f * (float)(i % 1000) || pinned[i] != host[i];
    printf("copies %s the reset: %d wrong\n", when, wrong);
    EXPECT(wrong == 0, "copies %s the reset", when);
    CHECK(cudaFree(device));
    CHECK(cudaFreeHost(pinned));
    free(host);
}

static int bump_counter() {
    int *out = NULL, value = 0;
    CHECK(cudaMalloc(&out, sizeof(int)));
    bump<<<1, 1>>>(out);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&value, out, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(out));
    return value;
}

int main() {
    test_init("device_reset");
    copies_round("before");
    printf("counter before the reset: %d\n", bump_counter());
    int seven = 7;
    CHECK(cudaMemcpyToSymbol(counter, &seven, sizeof(int)));
    printf("counter after setting 7: %d\n", bump_counter());
    size_t fifo_default = 0, stack_default = 0, heap_default = 0, value = 0;
    CHECK(cudaDeviceGetLimit(&fifo_default, cudaLimitPrintfFifoSize));
    CHECK(cudaDeviceGetLimit(&stack_default, cudaLimitStackSize));
    CHECK(cudaDeviceGetLimit(&heap_default, cudaLimitMallocHeapSize));
    printf("defaults: printf fifo %zu, stack %zu, malloc heap %zu\n", fifo_default, stack_default, heap_default);
    CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 1 << 20));
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, stack_default * 2));
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, heap_default * 2));
    hello_kernel<<<1, 1>>>(1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaDeviceGetLimit(&value, cudaLimitPrintfFifoSize));
    printf("printf fifo after setting 1 MiB: %zu\n", value);
    CHECK(cudaDeviceReset());
    CHECK(cudaDeviceGetLimit(&value, cudaLimitPrintfFifoSize));
    printf("printf fifo after the reset: %zu (default: %s)\n", value, value == fifo_default ? "yes" : "no");
    EXPECT(value == fifo_default, "printf fifo not back to its default");
    CHECK(cudaDeviceGetLimit(&value, cudaLimitStackSize));
    printf("stack size after the reset: default: %s\n", value == stack_default ? "yes" : "no");
    EXPECT(value == stack_default, "stack size not back to its default");
    CHECK(cudaDeviceGetLimit(&value, cudaLimitMallocHeapSize));
    printf("malloc heap after the reset: default: %s\n", value == heap_default ? "yes" : "no");
    EXPECT(value == heap_default, "malloc heap not back to its default");
    hello_kernel<<<1, 1>>>(2);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("counter after the reset: %d\n", bump_counter());
    CHECK(cudaMemcpyToSymbol(counter, &seven, sizeof(int)));
    printf("counter after setting 7 again: %d\n", bump_counter());
    copies_round("after");
    return test_finish();
}

// device_reset: what cudaDeviceReset gives back. CUDA destroys the primary context, so limits the
// app changed (printf FIFO, stack size, malloc heap) return to their defaults, and a kernel that
// used printf before the reset does not pin the FIFO size for the new context.
#include "common.h"

__global__ void hello_kernel(int v) { printf("kernel %d\n", v); }

int main() {
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
    return test_finish();
}

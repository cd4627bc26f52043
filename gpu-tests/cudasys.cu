// Driver entry points the server calls through the generated driver table (flyt-cuda-sys's
// DriverTable) that no other program reaches, with what they answer printed for the comparison
// with the native run: stream attributes (cudaStreamSetAttribute/GetAttribute: synchronization
// policy and an access policy window), a kernel's parameter layout (cuFuncGetParamInfo, which
// the server asks when it loads a function) and name (cuFuncGetName), context limits
// (cudaDeviceSetLimit/GetLimit: stack size and malloc heap), and an empty batch of
// decompressions (cuMemBatchDecompressAsync: the answer's name). A kernel then runs and its
// result is checked, so a call through a wrong signature that broke the context shows.
#include "driver_check.h"

struct Three {
    int x, y, z;
};

__global__ void params_kernel(char a, double b, Three c, float *d) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *d = (float)a + (float)b + (float)(c.x + c.y + c.z);
}

int main() {
    test_init("cudasys");
    CHECK(cudaSetDevice(0));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // Stream attributes: set, then read back.
    cudaStreamAttrValue value = {};
    value.syncPolicy = cudaSyncPolicyYield;
    CHECK(cudaStreamSetAttribute(stream, cudaStreamAttributeSynchronizationPolicy, &value));
    cudaStreamAttrValue read = {};
    CHECK(cudaStreamGetAttribute(stream, cudaStreamAttributeSynchronizationPolicy, &read));
    printf("stream synchronization policy: %d\n", (int)read.syncPolicy);

    float *window = nullptr;
    CHECK(cudaMalloc(&window, 1 << 20));
    int max_window = 0;
    CHECK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, 0));
    value = {};
    value.accessPolicyWindow.base_ptr = window;
    value.accessPolicyWindow.num_bytes = (size_t)(max_window < (1 << 20) ? max_window : (1 << 20));
    value.accessPolicyWindow.hitRatio = 0.5f;
    value.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    value.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    cudaError_t set = cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value);
    printf("access policy window set: %s\n", cudaGetErrorName(set));
    if (set == cudaSuccess) {
        read = {};
        CHECK(cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &read));
        printf("access policy window: base is the allocation %s, bytes asked %s, hit ratio %.2f, hit %d, miss %d\n",
               read.accessPolicyWindow.base_ptr == (void *)window ? "yes" : "no",
               read.accessPolicyWindow.num_bytes == value.accessPolicyWindow.num_bytes ? "yes" : "no",
               read.accessPolicyWindow.hitRatio, (int)read.accessPolicyWindow.hitProp,
               (int)read.accessPolicyWindow.missProp);
    }
    cudaGetLastError();

    // A kernel's parameters and name, as the driver lays them out.
    cudaFunction_t function;
    CHECK(cudaGetFuncBySymbol(&function, (const void *)params_kernel));
    CUfunction cu_function = (CUfunction)function;
    for (size_t index = 0;; index++) {
        size_t offset = 0, size = 0;
        CUresult info = cuFuncGetParamInfo(cu_function, index, &offset, &size);
        if (info != CUDA_SUCCESS) {
            const char *name = "?";
            cuGetErrorName(info, &name);
            printf("parameter %zu: %s\n", index, name);
            break;
        }
        printf("parameter %zu: offset %zu, size %zu\n", index, offset, size);
        if (index > 16) {
            printf("FAIL: more parameters than the kernel has\n");
            g_failures++;
            break;
        }
    }
    const char *kernel_name = nullptr;
    CHECK_CU(cuFuncGetName(&kernel_name, cu_function));
    printf("kernel name: %s\n", kernel_name ? kernel_name : "(null)");

    // Context limits: set, then read back (the driver may round them up: the native run decides).
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
    size_t limit = 0;
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitStackSize));
    printf("stack size limit: %zu\n", limit);
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 16 << 20));
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitMallocHeapSize));
    printf("malloc heap limit: %zu\n", limit);

    // An empty batch of decompressions: only the answer's name.
    size_t error_index = 12345;
    CUresult decompress = cuMemBatchDecompressAsync(nullptr, 0, 0, &error_index, (CUstream)stream);
    const char *decompress_name = "?";
    cuGetErrorName(decompress, &decompress_name);
    printf("empty decompression batch: %s\n", decompress_name);

    // The context still works.
    float *result = nullptr;
    CHECK(cudaMalloc(&result, sizeof(float)));
    params_kernel<<<1, 32, 0, stream>>>(1, 2.5, Three{3, 4, 5}, result);
    CHECK_LAUNCH();
    float host = 0;
    CHECK(cudaMemcpyAsync(&host, result, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("kernel result: %.1f\n", host);
    EXPECT(host == 15.5f, "kernel result %.1f, expected 15.5", host);

    CHECK_EACH(cudaFree, result, window);
    CHECK(cudaStreamDestroy(stream));
    return test_finish();
}

// Diagnostic: CPU cost of cuLaunchKernel per argument-passing style (kernelParams array vs one
// packed buffer through CU_LAUNCH_PARAM_BUFFER_POINTER, which flyt-rpc-server uses), measured
// with the driver API alone. Build: nvcc -O2 -arch=sm_90 launch_paths.cu -lcuda
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cuda.h>

extern "C" __global__ void empty3(int a, float *b, long long c) {}

static const char *ptx_or_die(CUresult r, const char *what) {
    if (r != CUDA_SUCCESS) { const char *s; cuGetErrorName(r, &s); printf("%s: %s\n", what, s); exit(1); }
    return nullptr;
}
#define CK(x) ptx_or_die((x), #x)

int main() {
    CK(cuInit(0));
    CUdevice dev; CK(cuDeviceGet(&dev, 0));
    CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    // The runtime registers the kernel; take its driver handle through the runtime API.
    cudaFunction_t rt; cudaGetFuncBySymbol(&rt, (const void *)empty3);
    CUfunction f = (CUfunction)rt;
    int a = 1; float *b = nullptr; long long c = 3;
    void *params[] = {&a, &b, &c};
    unsigned char packed[24]; memset(packed, 0, sizeof packed);
    memcpy(packed, &a, 4); memcpy(packed + 8, &b, 8); memcpy(packed + 16, &c, 8);
    size_t size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    const int n = 100000;
    for (int style = 0; style < 2; style++) {
        for (int i = 0; i < 1000; i++) CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, style ? nullptr : params, style ? extra : nullptr));
        CK(cuCtxSynchronize());
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; i++) CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, style ? nullptr : params, style ? extra : nullptr));
        auto t1 = std::chrono::steady_clock::now();
        CK(cuCtxSynchronize());
        auto t2 = std::chrono::steady_clock::now();
        double call = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
        double total = std::chrono::duration<double>(t2 - t0).count();
        printf("%-14s cuLaunchKernel CPU %.3f us/launch, %.0f launches/s to completion\n",
               style ? "packed buffer" : "kernelParams", call, n / total);
    }
    return 0;
}

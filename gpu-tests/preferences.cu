// preferences: the small calls real programs make around their kernels, each compared with native:
// cudaFuncSetCacheConfig and cudaDeviceSetCacheConfig/GetCacheConfig (preferences the server's
// driver applies; a kernel launched after them still computes the right result), the profiler
// range calls (no profiler attached: both succeed), cudaCtxResetPersistingL2Cache, and
// cudaDeviceGetP2PAttribute on a single device (a device is no peer of itself).
#include <cstdio>

#include <cuda_runtime.h>

// cuda_profiler_api.h's two declarations (the header is missing from some CUDA packages).
extern "C" cudaError_t cudaProfilerStart(void);
extern "C" cudaError_t cudaProfilerStop(void);

__global__ void scale(float *x, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= by;
}

static int failures = 0;
static void say(const char *what, cudaError_t error) {
    printf("%s: %s\n", what, cudaGetErrorName(error));
    cudaGetLastError();
}

int main() {
    enum cudaFuncCache cache = cudaFuncCachePreferShared;
    say("device get cache config", cudaDeviceGetCacheConfig(&cache));
    printf("initial cache config: %d\n", (int)cache);
    say("device set cache config L1", cudaDeviceSetCacheConfig(cudaFuncCachePreferL1));
    say("device get cache config", cudaDeviceGetCacheConfig(&cache));
    printf("cache config now: %d\n", (int)cache);
    say("device set cache config 7", cudaDeviceSetCacheConfig((enum cudaFuncCache)7));
    say("func set cache config shared", cudaFuncSetCacheConfig((const void *)scale, cudaFuncCachePreferShared));
    say("func set cache config 9", cudaFuncSetCacheConfig((const void *)scale, (enum cudaFuncCache)9));
    say("func set cache config on a host function", cudaFuncSetCacheConfig((const void *)say, cudaFuncCachePreferL1));

    const int n = 1 << 16;
    float *x = nullptr;
    float host[4] = {0};
    say("malloc", cudaMalloc(&x, n * sizeof(float)));
    say("memset", cudaMemset(x, 0, n * sizeof(float)));
    float ones[n];
    for (int i = 0; i < n; i++) ones[i] = 1.5f;
    say("copy in", cudaMemcpy(x, ones, sizeof ones, cudaMemcpyHostToDevice));
    say("profiler start", cudaProfilerStart());
    scale<<<n / 256, 256>>>(x, 2.0f, n);
    say("launch", cudaGetLastError());
    say("profiler stop", cudaProfilerStop());
    say("copy out", cudaMemcpy(host, x + n - 4, sizeof host, cudaMemcpyDeviceToHost));
    printf("scaled: %g %g %g %g\n", host[0], host[1], host[2], host[3]);
    if (host[3] != 3.0f) failures++;
    say("reset persisting L2", cudaCtxResetPersistingL2Cache());

    int value = -1;
    say("p2p attribute of a device with itself", cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrAccessSupported, 0, 0));
    say("p2p attribute with device 1", cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrAccessSupported, 0, 1));
    say("p2p attribute into NULL", cudaDeviceGetP2PAttribute(nullptr, cudaDevP2PAttrAccessSupported, 0, 0));
    printf("p2p value untouched: %d\n", value);
    say("free", cudaFree(x));
    printf("%s\n", failures ? "FAILED" : "PASSED");
    return failures ? 1 : 0;
}

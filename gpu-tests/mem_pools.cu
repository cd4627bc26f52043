// mem_pools: stream-ordered allocation as programs use it. Buffers allocated with cudaMallocAsync
// on two streams, used by kernels and freed with cudaFreeAsync in a loop; the default pool's
// release threshold set and read back, its used-memory counter rising while buffers are live and
// falling after they are freed; a pool of the program's own made the device's current pool; a
// cudaFree of a stream-ordered allocation; cudaMemPoolTrimTo. Results checked on the host.
#include "common.h"

__global__ void fill(int *x, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value + i % 5;
}

__global__ void add(int *dst, const int *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

int main() {
    test_init("mem_pools");
    int supported = 0;
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0));
    printf("memory pools supported: %s\n", supported ? "yes" : "no");
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    unsigned long long threshold = 256ull << 20, read = 0;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &read));
    printf("release threshold reads back: %s\n", read == threshold ? "yes" : "no");

    const int n = 1 << 20;
    const size_t bytes = n * sizeof(int);
    cudaStream_t s[2];
    for (auto &stream : s) CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int *host = nullptr;
    CHECK(cudaMallocHost((void **)&host, bytes));
    int bad = 0;
    unsigned long long used_live = 0, used_after = 0;
    for (int round = 0; round < 20; round++) {
        cudaStream_t st = s[round % 2];
        int *a = nullptr, *b = nullptr;
        CHECK(cudaMallocAsync((void **)&a, bytes, st));
        CHECK(cudaMallocAsync((void **)&b, bytes, st));
        fill<<<n / 256, 256, 0, st>>>(a, n, round);
        fill<<<n / 256, 256, 0, st>>>(b, n, 1000);
        add<<<n / 256, 256, 0, st>>>(a, b, n);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(host, a, bytes, cudaMemcpyDeviceToHost, st));
        if (round == 0) {
            CHECK(cudaStreamSynchronize(st));
            CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used_live));
        }
        CHECK(cudaFreeAsync(a, st));
        CHECK(cudaFreeAsync(b, st));
        CHECK(cudaStreamSynchronize(st));
        for (int i = 0; i < n; i++)
            if (host[i] != round + 1000 + 2 * (i % 5)) bad++;
    }
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used_after));
    printf("20 rounds of allocate, compute, free: %s\n", bad == 0 ? "all values right" : "WRONG VALUES");
    EXPECT(bad == 0, "%d wrong values", bad);
    printf("pool memory in use while live: %s; after the frees: %s\n", used_live >= 2 * bytes ? "both buffers" : "LESS",
           used_after == 0 ? "none" : "SOME");
    EXPECT(used_live >= 2 * bytes && used_after == 0, "used %llu live, %llu after", used_live, used_after);

    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t mine, current;
    CHECK(cudaMemPoolCreate(&mine, &props));
    CHECK(cudaDeviceSetMemPool(0, mine));
    CHECK(cudaDeviceGetMemPool(&current, 0));
    printf("the program's pool is current: %s\n", current == mine ? "yes" : "no");
    int *c = nullptr;
    CHECK(cudaMallocAsync((void **)&c, bytes, s[0]));
    fill<<<n / 256, 256, 0, s[0]>>>(c, n, 7);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(host, c, bytes, cudaMemcpyDeviceToHost, s[0]));
    CHECK(cudaStreamSynchronize(s[0]));
    printf("allocation from the program's pool: %s\n", host[n - 1] == 7 + (n - 1) % 5 ? "right" : "WRONG");
    CHECK(cudaFree(c));
    CHECK(cudaMemPoolTrimTo(mine, 0));
    CHECK(cudaDeviceSetMemPool(0, pool));
    CHECK(cudaMemPoolDestroy(mine));
    CHECK(cudaMemPoolTrimTo(pool, 0));
    for (auto &stream : s) CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFreeHost(host));
    return test_finish();
}

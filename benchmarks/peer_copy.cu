// peer_copy: cudaMemcpyPeer bandwidth between GPU 0 and GPU 1 (run natively and through Flyt on
// a machine with two GPUs, both visible): 1 GiB each way, 3 warm-up copies, then 10 timed ones
// (each synchronized, timed on the host); prints the median and p99 in GB/s, first without peer
// access (the driver stages through host memory), then with it enabled both ways (NVLink or PCIe
// peer to peer where the GPUs are peers). Also a device-to-device copy inside GPU 0 for scale.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(call)                                                                         \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            printf("FAIL: %s: %s\n", #call, cudaGetErrorName(e_));                          \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

static const size_t BYTES = 1ull << 30;

template <typename Copy>
static int measure(const char *what, Copy copy) {
    std::vector<double> seconds;
    for (int i = 0; i < 13; i++) {
        auto start = std::chrono::steady_clock::now();
        if (copy() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
            printf("FAIL: %s: %s\n", what, cudaGetErrorName(cudaGetLastError()));
            return 1;
        }
        double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (i >= 3) seconds.push_back(took);
    }
    std::sort(seconds.begin(), seconds.end());
    double p50 = seconds[seconds.size() / 2], p99 = seconds.back();
    printf("%s 1 GiB: p50 %.1f GB/s (%.3f ms), p99 %.1f GB/s\n", what, BYTES / p50 / 1e9, p50 * 1e3, BYTES / p99 / 1e9);
    return 0;
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    if (count < 2) {
        printf("peer_copy: needs two GPUs, %d seen\n", count);
        return 0;
    }
    void *a, *b, *c;
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&b, BYTES));
    CHECK(cudaMemset(b, 1, BYTES));
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&a, BYTES));
    CHECK(cudaMalloc(&c, BYTES));
    CHECK(cudaMemset(a, 2, BYTES));
    int can = 0;
    CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
    printf("peer access 0->1: %d\n", can);
    int failed = measure("cudaMemcpyPeer 1 -> 0", [&] { return cudaMemcpyPeer(a, 0, b, 1, BYTES); });
    failed |= measure("cudaMemcpyPeer 0 -> 1", [&] { return cudaMemcpyPeer(b, 1, a, 0, BYTES); });
    if (can) {
        CHECK(cudaDeviceEnablePeerAccess(1, 0));
        CHECK(cudaSetDevice(1));
        CHECK(cudaDeviceEnablePeerAccess(0, 0));
        CHECK(cudaSetDevice(0));
        failed |= measure("peer access: cudaMemcpyPeer 1 -> 0", [&] { return cudaMemcpyPeer(a, 0, b, 1, BYTES); });
        failed |= measure("peer access: cudaMemcpyPeer 0 -> 1", [&] { return cudaMemcpyPeer(b, 1, a, 0, BYTES); });
    }
    failed |= measure("cudaMemcpy on GPU 0", [&] { return cudaMemcpy(c, a, BYTES, cudaMemcpyDeviceToDevice); });
    return failed;
}

// Device limits the driver computes per request (CUDA 13): the longest 1D texture over linear
// memory for several element formats (cudaDeviceGetTexture1DLinearMaxWidth), and the atomic
// capabilities of every atomic operation between the device and the host
// (cudaDeviceGetHostAtomicCapabilities) and of the device with itself
// (cudaDeviceGetP2PAtomicCapabilities: a value, or the error the driver gives).
#include "common.h"

int main() {
    test_init("device_limits");
    struct Format {
        const char *name;
        cudaChannelFormatDesc desc;
    } formats[] = {
        {"float", cudaCreateChannelDesc<float>()},
        {"float4", cudaCreateChannelDesc<float4>()},
        {"uchar1", cudaCreateChannelDesc<uchar1>()},
        {"short2", cudaCreateChannelDesc<short2>()},
        {"half", cudaCreateChannelDescHalf()},
    };
    for (const Format &f : formats) {
        size_t width = 0;
        CHECK(cudaDeviceGetTexture1DLinearMaxWidth(&width, &f.desc, 0));
        printf("1D linear texture of %s: up to %zu elements\n", f.name, width);
    }
    const int count = 13;
    cudaAtomicOperation ops[count];
    for (int i = 0; i < count; i++) ops[i] = (cudaAtomicOperation)i;
    unsigned int host[count] = {}, peer[count] = {};
    CHECK(cudaDeviceGetHostAtomicCapabilities(host, ops, count, 0));
    cudaError_t peer_result = cudaDeviceGetP2PAtomicCapabilities(peer, ops, count, 0, 0);
    cudaGetLastError();
    for (int i = 0; i < count; i++) printf("atomic operation %d: host capabilities 0x%x\n", i, host[i]);
    if (peer_result == cudaSuccess) {
        for (int i = 0; i < count; i++) printf("atomic operation %d: with itself 0x%x\n", i, peer[i]);
    } else {
        printf("peer atomics of the device with itself: %s\n", cudaGetErrorName(peer_result));
    }
    printf("device_limits: PASS\n");
    return 0;
}

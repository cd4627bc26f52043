// multi_gpu_pools: memory pools of two GPUs in one process (run with gpu-tests/run.sh --gpus 0,1):
// each device's default pool its own (and its current pool at first); cudaMallocAsync on each
// device's stream, a kernel writing the device's pattern, its pointer attributes naming the device
// and its pool's used-memory counter counting it (the other device's not); the release threshold
// set on device 1's pool only; trimming; device 1's pool opened to device 0 with
// cudaMemPoolSetAccess (where the devices are peers) and read in place by a kernel on device 0; a
// pool made on device 1 as device 1's current pool (device 0's unchanged, and refused as device
// 0's), the next cudaMallocAsync on device 1 coming from it, and device 1 back on its default
// pool once it is destroyed. On one GPU it says so and passes (the native run does the same).
#include <vector>

#include "common.h"
#include "seed_words.h"

static const size_t N = 8u << 20;  // words: 32 MiB
static const size_t BYTES = N * sizeof(unsigned);

static bool pattern_right(const std::vector<unsigned> &host, unsigned seed) {
    for (size_t i = 0; i < host.size(); i += 4093)
        if (host[i] != (seed ^ (unsigned)i)) return false;
    return host.back() == (seed ^ (unsigned)(host.size() - 1));
}

static cudaMemLocation on_device(int device) {
    cudaMemLocation location;
    memset(&location, 0, sizeof location);
    location.type = cudaMemLocationTypeDevice;
    location.id = device;
    return location;
}

static unsigned long long used(cudaMemPool_t pool) {
    unsigned long long bytes = 0;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &bytes));
    return bytes;
}

int main() {
    test_init("multi_gpu_pools");
    int count = printed_device_count();
    if (count < 2) return test_finish();

    cudaMemPool_t defaults[2], current;
    for (int d = 0; d < 2; d++) CHECK(cudaDeviceGetDefaultMemPool(&defaults[d], d));
    printf("a default pool per device, distinct: %s\n", defaults[0] != defaults[1] ? "yes" : "no");
    EXPECT(defaults[0] != defaults[1], "default pools distinct");
    CHECK(cudaDeviceGetMemPool(&current, 1));
    printf("device 1's current pool is its default pool: %s\n", current == defaults[1] ? "yes" : "no");
    cudaMemLocation at0 = on_device(0), at1 = on_device(1);
    CHECK(cudaMemGetDefaultMemPool(&current, &at1, cudaMemAllocationTypePinned));
    printf("by location too: %s\n", current == defaults[1] ? "yes" : "no");

    // Per device: a stream, a stream-ordered allocation from the device's pool, its pattern.
    cudaStream_t streams[2];
    unsigned *bufs[2];
    std::vector<unsigned> host(N);
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
        CHECK(cudaMallocAsync((void **)&bufs[d], BYTES, streams[d]));
        fill<<<264, 256, 0, streams[d]>>>(bufs[d], N, 0x1000u * (d + 1));
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(host.data(), bufs[d], BYTES, cudaMemcpyDeviceToHost, streams[d]));
        CHECK(cudaStreamSynchronize(streams[d]));
        printf("device %d: its kernel's pattern in its pool memory: %s\n", d, pattern_right(host, 0x1000u * (d + 1)) ? "right" : "WRONG");
        cudaPointerAttributes attributes;
        CHECK(cudaPointerGetAttributes(&attributes, bufs[d]));
        printf("device %d: allocation's device %d, type %d\n", d, attributes.device, (int)attributes.type);
    }
    printf("each pool counts its own device's allocation: %s\n",
           used(defaults[0]) >= BYTES && used(defaults[1]) >= BYTES && used(defaults[1]) < 2 * BYTES ? "yes" : "no");

    // Attributes and trimming act on the pool named.
    unsigned long long threshold = 256ull << 20, read = 1;
    CHECK(cudaMemPoolSetAttribute(defaults[1], cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK(cudaMemPoolGetAttribute(defaults[1], cudaMemPoolAttrReleaseThreshold, &read));
    printf("device 1's release threshold: %llu MiB\n", read >> 20);
    CHECK(cudaMemPoolGetAttribute(defaults[0], cudaMemPoolAttrReleaseThreshold, &read));
    printf("device 0's release threshold: %llu MiB\n", read >> 20);
    CHECK(cudaMemPoolTrimTo(defaults[1], 0));

    // Access: device 1's pool opened to device 0, read in place by a kernel on device 0.
    cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    CHECK(cudaMemPoolGetAccess(&flags, defaults[1], &at1));
    printf("device 1's access to its own pool: %d\n", (int)flags);
    CHECK(cudaMemPoolGetAccess(&flags, defaults[1], &at0));
    printf("device 0's access to device 1's pool at first: %d\n", (int)flags);
    int can01 = 0;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    printf("peers: 0->1 %d\n", can01);
    if (can01) {
        cudaMemAccessDesc grant = {at0, cudaMemAccessFlagsProtReadWrite};
        CHECK(cudaMemPoolSetAccess(defaults[1], &grant, 1));
        CHECK(cudaMemPoolGetAccess(&flags, defaults[1], &at0));
        printf("device 0's access to device 1's pool, granted: %d\n", (int)flags);
        CHECK(cudaMemPoolGetAccess(&flags, defaults[0], &at1));
        printf("device 1's access to device 0's pool, untouched: %d\n", (int)flags);
        CHECK(cudaSetDevice(0));
        unsigned long long *total;
        CHECK(cudaMallocAsync((void **)&total, sizeof *total, streams[0]));
        CHECK(cudaMemsetAsync(total, 0, sizeof *total, streams[0]));
        sum<<<264, 256, 0, streams[0]>>>(bufs[1], N, total);
        CHECK_LAUNCH();
        unsigned long long got = 0, want = 0;
        CHECK(cudaMemcpyAsync(&got, total, sizeof got, cudaMemcpyDeviceToHost, streams[0]));
        CHECK(cudaStreamSynchronize(streams[0]));
        for (size_t i = 0; i < N; i++) want += 0x2000u ^ (unsigned)i;
        printf("device 0 kernel summing device 1's pool memory: %s\n", got == want ? "right" : "WRONG");
        EXPECT(got == want, "peer read of pool memory");
        CHECK(cudaFreeAsync(total, streams[0]));
    }

    // A pool made on device 1 becomes device 1's current pool, not device 0's.
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location = at1;
    cudaMemPool_t made;
    CHECK(cudaMemPoolCreate(&made, &props));
    CHECK(cudaDeviceSetMemPool(1, made));
    CHECK(cudaDeviceGetMemPool(&current, 1));
    printf("device 1's current pool is the one made: %s\n", current == made ? "yes" : "no");
    CHECK(cudaDeviceGetMemPool(&current, 0));
    printf("device 0's current pool unchanged: %s\n", current == defaults[0] ? "yes" : "no");
    expect_some_err("device 1's pool as device 0's", cudaDeviceSetMemPool(0, made));
    cudaGetLastError();
    CHECK(cudaSetDevice(1));
    unsigned *from_made;
    CHECK(cudaMallocAsync((void **)&from_made, BYTES, streams[1]));
    CHECK(cudaStreamSynchronize(streams[1]));
    printf("the next allocation on device 1 comes from it: %s\n", used(made) >= BYTES ? "yes" : "no");
    cudaPointerAttributes attributes;
    CHECK(cudaPointerGetAttributes(&attributes, from_made));
    printf("its device: %d\n", attributes.device);
    CHECK(cudaFreeAsync(from_made, streams[1]));
    CHECK(cudaStreamSynchronize(streams[1]));
    CHECK(cudaMemPoolDestroy(made));
    CHECK(cudaDeviceGetMemPool(&current, 1));
    printf("device 1 back on its default pool: %s\n", current == defaults[1] ? "yes" : "no");

    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaFreeAsync(bufs[d], streams[d]));
        CHECK(cudaStreamSynchronize(streams[d]));
        CHECK(cudaStreamDestroy(streams[d]));
    }
    return test_finish();
}

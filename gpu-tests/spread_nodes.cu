// spread_nodes: one process on two GPUs that may be on two nodes (issue 45: run by
// gpu-tests/spread.sh through two flyt-rpc-servers, one per GPU, FLYT_SERVER=a,b; by run.sh
// --gpus 0,1 through one server; natively on two GPUs of one machine). Prints only what holds in
// all three: per device a kernel filling its own pattern and a copy back; peer access behaving as
// the peer answer says (the answer itself differs: GPUs of two nodes have no path); kernels on
// device 1 counting what a cudaMemcpyPeer of 24 MiB (plus an odd tail) brought from device 0, and
// on device 0 what cudaMemcpyPeerAsync brought back; cudaMemcpyDefault between the devices at odd
// offsets; a stream of device 1 waiting for an event of device 0, then copying what device 0's
// kernel wrote; two host threads each driving its own device at once. On one GPU it says so and
// passes (the native run does the same).
#include <thread>
#include <vector>

#include "common.h"

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = seed ^ (unsigned)(i * 2654435761u);
}

// Counts the words of `p` that are not `seed`'s pattern into `*wrong`.
__global__ void count_wrong(const unsigned *p, size_t n, unsigned seed, unsigned long long *wrong) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        local += p[i] != (seed ^ (unsigned)(i * 2654435761u));
    if (local) atomicAdd(wrong, local);
}

// Spins for about `cycles` clock cycles, then writes `value` to `*flag`.
__global__ void late_write(unsigned *flag, unsigned value, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    *flag = value;
}

static const size_t N = (6u << 20) + 1025;  // words: 24 MiB and an odd tail

static bool pattern_right(const std::vector<unsigned> &host, size_t from, size_t count, unsigned seed) {
    for (size_t i = 0; i < count; i++)
        if (host[i] != (seed ^ (unsigned)((from + i) * 2654435761u))) return false;
    return true;
}

// Launches count_wrong on the current device over `n` words of `p` and returns the count.
static unsigned long long wrong_words(const unsigned *p, size_t n, unsigned seed, cudaStream_t stream) {
    unsigned long long *wrong = nullptr, host = ~0ull;
    CHECK(cudaMalloc(&wrong, sizeof *wrong));
    CHECK(cudaMemsetAsync(wrong, 0, sizeof *wrong, stream));
    count_wrong<<<256, 256, 0, stream>>>(p, n, seed, wrong);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(&host, wrong, sizeof host, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaFree(wrong));
    return host;
}

int main() {
    test_init("spread_nodes");
    int count = printed_device_count();
    if (count < 2) return test_finish();
    cudaDeviceProp props[2];
    for (int d = 0; d < 2; d++) {
        CHECK(cudaGetDeviceProperties(&props[d], d));
        printf("device %d: %s, %d SMs\n", d, props[d].name, props[d].multiProcessorCount);
    }
    EXPECT(memcmp(&props[0].uuid, &props[1].uuid, sizeof props[0].uuid) != 0, "two devices, one UUID");

    // Peer access as the answer says: enabled where there is a path, refused where there is none.
    bool agrees = true;
    for (int d = 0; d < 2; d++) {
        int can = -1, access = -1;
        CHECK(cudaDeviceCanAccessPeer(&can, d, 1 - d));
        CHECK(cudaDeviceGetP2PAttribute(&access, cudaDevP2PAttrAccessSupported, d, 1 - d));
        CHECK(cudaSetDevice(d));
        cudaError_t enabled = cudaDeviceEnablePeerAccess(1 - d, 0);
        (void)cudaGetLastError();
        agrees = agrees && (can == access) && (can ? enabled == cudaSuccess : enabled == cudaErrorPeerAccessUnsupported);
        if (can && enabled == cudaSuccess) CHECK(cudaDeviceDisablePeerAccess(1 - d));
    }
    printf("peer access as the peer answer says: %s\n", agrees ? "yes" : "no");
    EXPECT(agrees, "peer access disagrees with cudaDeviceCanAccessPeer");

    unsigned *bufs[2];
    cudaStream_t streams[2];
    std::vector<unsigned> host(N);
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
        CHECK(cudaMalloc(&bufs[d], N * sizeof(unsigned)));
        fill<<<256, 256>>>(bufs[d], N, 0x1000u * (d + 1));
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(host.data(), bufs[d], N * sizeof(unsigned), cudaMemcpyDeviceToHost));
        bool right = pattern_right(host, 0, N, 0x1000u * (d + 1));
        printf("device %d fills its own memory: %s\n", d, right ? "yes" : "no");
        EXPECT(right, "device %d's pattern", d);
        cudaPointerAttributes attributes;
        CHECK(cudaPointerGetAttributes(&attributes, bufs[d]));
        EXPECT(attributes.device == d && attributes.type == cudaMemoryTypeDevice, "pointer attributes of device %d's buffer", d);
    }

    // Device 0 -> device 1, then a kernel on device 1 checks every word.
    CHECK(cudaMemcpyPeer(bufs[1], 1, bufs[0], 0, N * sizeof(unsigned)));
    CHECK(cudaSetDevice(1));
    unsigned long long wrong = wrong_words(bufs[1], N, 0x1000u, streams[1]);
    printf("cudaMemcpyPeer 0 -> 1, words wrong on device 1: %llu\n", wrong);
    EXPECT(wrong == 0, "peer copy to device 1");

    // Device 1 fills anew; back to device 0 on device 1's stream, checked by a kernel on device 0.
    fill<<<256, 256, 0, streams[1]>>>(bufs[1], N, 0x3000u);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyPeerAsync(bufs[0], 0, bufs[1], 1, N * sizeof(unsigned), streams[1]));
    CHECK(cudaStreamSynchronize(streams[1]));
    CHECK(cudaSetDevice(0));
    wrong = wrong_words(bufs[0], N, 0x3000u, streams[0]);
    printf("cudaMemcpyPeerAsync 1 -> 0, words wrong on device 0: %llu\n", wrong);
    EXPECT(wrong == 0, "peer copy back to device 0");

    // Unified addressing between the devices, at odd word offsets (device 0 current).
    const size_t from = 12345, words = 1000003, to = 777;
    CHECK(cudaMemcpy(bufs[1] + to, bufs[0] + from, words * sizeof(unsigned), cudaMemcpyDefault));
    CHECK(cudaMemcpy(host.data(), bufs[1] + to, words * sizeof(unsigned), cudaMemcpyDefault));
    bool right = pattern_right(host, from, words, 0x3000u);
    printf("cudaMemcpyDefault between the devices at offsets: %s\n", right ? "yes" : "no");
    EXPECT(right, "cudaMemcpyDefault between devices");

    // A stream of device 1 waits for an event of device 0 recorded after a slow kernel.
    unsigned *flag0 = nullptr, *flag1 = nullptr, seen = 0;
    cudaEvent_t written;
    CHECK(cudaMalloc(&flag0, sizeof *flag0));
    CHECK(cudaMemset(flag0, 0, sizeof *flag0));
    CHECK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    late_write<<<1, 1, 0, streams[0]>>>(flag0, 42u, 200000000ll);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(written, streams[0]));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&flag1, sizeof *flag1));
    CHECK(cudaMemset(flag1, 0, sizeof *flag1));
    CHECK(cudaStreamWaitEvent(streams[1], written, 0));
    CHECK(cudaMemcpyPeerAsync(flag1, 1, flag0, 0, sizeof *flag0, streams[1]));
    CHECK(cudaMemcpyAsync(&seen, flag1, sizeof seen, cudaMemcpyDeviceToHost, streams[1]));
    CHECK(cudaStreamSynchronize(streams[1]));
    printf("device 1's stream waited for device 0's event: %s\n", seen == 42u ? "yes" : "no");
    EXPECT(seen == 42u, "the wait for another device's event (saw %u)", seen);

    // Two host threads, each driving its own device.
    bool thread_right[2] = {false, false};
    std::vector<std::thread> threads;
    for (int d = 0; d < 2; d++) {
        threads.emplace_back([d, &bufs, &thread_right] {
            if (cudaSetDevice(d) != cudaSuccess) return;
            std::vector<unsigned> mine(N);
            bool right = true;
            for (unsigned round = 0; round < 8 && right; round++) {
                unsigned seed = 0x10000u * (d + 1) + round;
                fill<<<256, 256>>>(bufs[d], N, seed);
                right = cudaGetLastError() == cudaSuccess &&
                        cudaMemcpy(mine.data(), bufs[d], N * sizeof(unsigned), cudaMemcpyDeviceToHost) == cudaSuccess &&
                        pattern_right(mine, 0, N, seed);
            }
            thread_right[d] = right;
        });
    }
    for (auto &thread : threads) thread.join();
    printf("two threads on two devices at once: %s\n", thread_right[0] && thread_right[1] ? "yes" : "no");
    EXPECT(thread_right[0] && thread_right[1], "a thread's device work");

    CHECK(cudaEventDestroy(written));
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaStreamDestroy(streams[d]));
        CHECK(cudaFree(bufs[d]));
    }
    CHECK(cudaFree(flag1));
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(flag0));
    return test_finish();
}

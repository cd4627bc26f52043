// multi_gpu: one process on every GPU it sees (run with gpu-tests/run.sh --gpus 0,1): device
// names and peer answers; per device an allocation, a kernel writing the device's own pattern and
// a copy back; pointer attributes naming each allocation's device; cudaMemcpyPeer and
// cudaMemcpyDefault between devices (64 MiB); peer access, where the devices are peers, with a
// kernel on device 0 reading device 1's memory directly; an event recorded on device 1 that a
// stream of device 0 waits for; two host threads each driving its own device. On one GPU it
// says so and passes (the native run does the same).
#include <thread>
#include <vector>

#include "common.h"
#include "seed_words.h"

// Spins until `*flag` is set, then writes `value` to `*out`: ordered after the event it waits for.
__global__ void after(volatile unsigned *flag, unsigned *out, unsigned value) { *out = *flag ? value : 0u; }

static const size_t N = 16u << 20;  // words: 64 MiB

static bool pattern_right(const std::vector<unsigned> &host, unsigned seed) {
    for (size_t i = 0; i < host.size(); i += 4093)
        if (host[i] != (seed ^ (unsigned)i)) return false;
    return host.back() == (seed ^ (unsigned)(host.size() - 1));
}

int main() {
    test_init("multi_gpu");
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    printf("devices: %d\n", count);
    for (int d = 0; d < count; d++) {
        cudaDeviceProp prop;
        CHECK(cudaGetDeviceProperties(&prop, d));
        printf("device %d: %s, %d SMs, cc %d.%d\n", d, prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    }
    if (count < 2) {
        printf("one device: nothing between devices to test\n");
        return test_finish();
    }
    int can01 = 0, can10 = 0, rank = -1, atomics = -1;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    CHECK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, 0, 1));
    CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, 0, 1));
    printf("peers: 0->1 %d, 1->0 %d, rank %d, native atomics %d\n", can01, can10, rank, atomics);

    std::vector<unsigned *> bufs(2);
    std::vector<unsigned> host(N);
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaMalloc(&bufs[d], N * sizeof(unsigned)));
        fill<<<264, 256>>>(bufs[d], N, 0x1000u * (d + 1));
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(host.data(), bufs[d], N * sizeof(unsigned), cudaMemcpyDeviceToHost));
        printf("device %d: its kernel's pattern: %s\n", d, pattern_right(host, 0x1000u * (d + 1)) ? "right" : "WRONG");
        cudaPointerAttributes attributes;
        CHECK(cudaPointerGetAttributes(&attributes, bufs[d]));
        printf("device %d: allocation's device %d, type %d\n", d, attributes.device, (int)attributes.type);
    }

    // Device 1's pattern into device 0's buffer, and back the other way through unified addressing.
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemcpyPeer(bufs[0], 0, bufs[1], 1, N * sizeof(unsigned)));
    CHECK(cudaMemcpy(host.data(), bufs[0], N * sizeof(unsigned), cudaMemcpyDeviceToHost));
    printf("cudaMemcpyPeer 1 -> 0: %s\n", pattern_right(host, 0x2000u) ? "right" : "WRONG");
    fill<<<264, 256>>>(bufs[0], N, 0x3000u);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(bufs[1], bufs[0], N * sizeof(unsigned), cudaMemcpyDefault));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemcpy(host.data(), bufs[1], N * sizeof(unsigned), cudaMemcpyDeviceToHost));
    printf("cudaMemcpyDefault 0 -> 1: %s\n", pattern_right(host, 0x3000u) ? "right" : "WRONG");

    // Peer access: a kernel on device 0 sums device 1's buffer in place.
    if (can01) {
        CHECK(cudaSetDevice(1));
        fill<<<264, 256>>>(bufs[1], N, 0x4000u);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(0));
        CHECK(cudaDeviceEnablePeerAccess(1, 0));
        printf("enable again: %s\n", cudaGetErrorName(cudaDeviceEnablePeerAccess(1, 0)));
        cudaGetLastError();  // that error is also the runtime's last error: cleared
        unsigned long long *total;
        CHECK(cudaMalloc(&total, sizeof *total));
        CHECK(cudaMemset(total, 0, sizeof *total));
        sum<<<264, 256>>>(bufs[1], N, total);
        CHECK_LAUNCH();
        unsigned long long got = 0, want = 0;
        CHECK(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < N; i++) want += 0x4000u ^ (unsigned)i;
        printf("device 0 kernel summing device 1 memory: %s\n", got == want ? "right" : "WRONG");
        CHECK(cudaFree(total));
        CHECK(cudaDeviceDisablePeerAccess(1));
    }

    // An event of device 1 that device 0's stream waits for: a flag set on device 1, copied to
    // device 0 behind the wait, read there by a kernel.
    unsigned *flag1, *flag0, *out;
    cudaStream_t s0, s1;
    cudaEvent_t done;
    CHECK(cudaSetDevice(1));
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&flag1, sizeof *flag1));
    CHECK(cudaMemset(flag1, 0, sizeof *flag1));
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CHECK(cudaMemsetAsync(flag1, 1, sizeof *flag1, s1));
    CHECK(cudaEventRecord(done, s1));
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&flag0, sizeof *flag0));
    CHECK(cudaMalloc(&out, sizeof *out));
    CHECK(cudaStreamWaitEvent(s0, done, 0));
    CHECK(cudaMemcpyPeerAsync(flag0, 0, flag1, 1, sizeof *flag0, s0));
    after<<<1, 1, 0, s0>>>(flag0, out, 77);
    CHECK_LAUNCH();
    unsigned seen = 0;
    CHECK(cudaMemcpyAsync(&seen, out, sizeof seen, cudaMemcpyDeviceToHost, s0));
    CHECK(cudaStreamSynchronize(s0));
    printf("stream of device 0 after an event of device 1: %u\n", seen);

    // Two host threads, each on its own device.
    std::vector<int> right(2, 0);
    std::vector<std::thread> threads;
    for (int d = 0; d < 2; d++) {
        threads.emplace_back([&, d] {
            std::vector<unsigned> mine(N);
            cudaSetDevice(d);
            bool ok = true;
            for (int round = 0; round < 20 && ok; round++) {
                fill<<<264, 256>>>(bufs[d], N, 0x100u * round + d);
                ok = cudaMemcpy(mine.data(), bufs[d], N * sizeof(unsigned), cudaMemcpyDeviceToHost) == cudaSuccess &&
                     pattern_right(mine, 0x100u * round + d);
            }
            right[d] = ok;
        });
    }
    for (auto &t : threads) t.join();
    printf("two threads on two devices: %s\n", right[0] && right[1] ? "right" : "WRONG");

    CHECK_EACH(cudaFree, out, flag0);
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(s0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaFree(flag1));
    CHECK(cudaStreamDestroy(s1));
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaFree(bufs[d]));
    }
    return test_finish();
}

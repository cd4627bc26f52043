// churn: the victim of the runner's abrupt-kill soak. Loops, as fast as it can, over everything that
// holds resources on the GPU side: device allocations of 4 KiB to 64 MiB (up to 12 alive, one of
// 256 MiB kept throughout), pinned host memory (cudaMallocHost, cudaHostAlloc, cudaHostRegister) of up to 64 MiB,
// synchronous and asynchronous copies both ways, memsets, kernel launches on several streams, stream
// and event creation, synchronizations. The runner SIGKILLs it at a random moment after it printed
// "churn: ready", so the kill lands mid-copy, mid-launch or mid-allocation; afterwards the server must
// hold none of its memory.
//
// Copies are checked as it goes: a wrong byte prints FAIL and exits 1 (the runner counts that as a
// failure of the soak). Without being killed it stops after CHURN_SECONDS (default 60) and exits 0.
#include "common.h"

#include <chrono>
#include <unistd.h>
#include <vector>

__global__ void bump(uint32_t *p, size_t n, uint32_t add) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) p[i] += add;
}

static uint64_t rng_state;
static uint32_t rnd() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)rng_state;
}
static size_t rnd_size(size_t lo, size_t hi) { return lo + rnd() % (hi - lo + 1); }

int main() {
    test_init("churn");
    rng_state = 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 16) ^
                (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
    const char *sec = getenv("CHURN_SECONDS");
    const double limit_s = sec ? atof(sec) : 60.0;
    auto t0 = std::chrono::steady_clock::now();

    const int NS = 3;
    cudaStream_t st[NS];
    for (int i = 0; i < NS; i++) CHECK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
    void *big = nullptr, *rt = nullptr;  // big: kernels and memsets; rt: only the checked round trips
    CHECK(cudaMalloc(&big, 256 << 20));
    CHECK(cudaMemset(big, 0, 256 << 20));
    CHECK(cudaMalloc(&rt, 32 << 20));

    const size_t HBYTES = 64 << 20;
    uint8_t *pageable = (uint8_t *)malloc(HBYTES), *back = (uint8_t *)malloc(HBYTES);
    if (!pageable || !back) {
        printf("FAIL: malloc\n");
        return 1;
    }
    fill_pattern(pageable, HBYTES, 1);
    std::vector<void *> live;
    bool ready = false;
    unsigned long iter = 0;
    for (;; iter++) {
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (el > limit_s) break;
        // Device allocations come and go.
        if (live.size() < 12 || rnd() % 2) {
            void *p = nullptr;
            CHECK(cudaMalloc(&p, rnd_size(4096, 64 << 20)));
            live.push_back(p);
        } else {
            size_t k = rnd() % live.size();
            CHECK(cudaFree(live[k]));
            live.erase(live.begin() + k);
        }
        // A checked round trip through the device, pageable or pinned.
        size_t n = rnd_size(1, 32 << 20);
        uint32_t seed = rnd();
        int kind = rnd() % 4;
        uint8_t *src = pageable, *dst = back;
        void *pinned = nullptr;
        if (kind == 1) CHECK(cudaMallocHost(&pinned, 2 * n));
        if (kind == 2) CHECK(cudaHostAlloc(&pinned, 2 * n, cudaHostAllocPortable));
        if (kind == 3) {
            pinned = malloc(2 * n);
            CHECK(cudaHostRegister(pinned, 2 * n, cudaHostRegisterDefault));
        }
        if (pinned) {
            src = (uint8_t *)pinned;
            dst = src + n;
        }
        fill_pattern(src, n < 4096 ? n : 4096, seed);
        cudaStream_t s = st[rnd() % NS];
        if (rnd() % 2) {
            CHECK(cudaMemcpy(rt, src, n, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(dst, rt, n, cudaMemcpyDeviceToHost));
        } else {
            CHECK(cudaMemcpyAsync(rt, src, n, cudaMemcpyHostToDevice, s));
            CHECK(cudaMemcpyAsync(dst, rt, n, cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
        }
        size_t chk = n < 4096 ? n : 4096;
        if (memcmp(src, dst, chk) != 0) {
            printf("FAIL: round trip of %zu bytes came back wrong (iteration %lu)\n", n, iter);
            return 1;
        }
        if (kind == 1 || kind == 2) CHECK(cudaFreeHost(pinned));
        if (kind == 3) {
            CHECK(cudaHostUnregister(pinned));
            free(pinned);
        }
        // Launches and memsets on several streams, a stream and an event that live briefly.
        for (int k = 0; k < 20; k++) {
            bump<<<64, 256, 0, st[k % NS]>>>((uint32_t *)big, (64 << 20) / 4, 1);
            CHECK_LAUNCH();
        }
        CHECK(cudaMemsetAsync(big, 0, rnd_size(1, 64 << 20), st[rnd() % NS]));
        cudaStream_t tmp;
        cudaEvent_t ev;
        CHECK(cudaStreamCreate(&tmp));
        CHECK(cudaEventCreate(&ev));
        bump<<<8, 128, 0, tmp>>>((uint32_t *)big, 1 << 20, 3);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(ev, tmp));
        CHECK(cudaStreamWaitEvent(st[0], ev, 0));
        CHECK(cudaEventDestroy(ev));
        CHECK(cudaStreamDestroy(tmp));
        if (iter % 4 == 0) CHECK(cudaDeviceSynchronize());
        if (!ready) {
            printf("churn: ready\n");
            fflush(stdout);
            ready = true;
        }
    }
    CHECK(cudaDeviceSynchronize());
    for (void *p : live) CHECK(cudaFree(p));
    CHECK(cudaFree(big));
    CHECK(cudaFree(rt));
    fprintf(stderr, "churn: %lu iterations\n", iter);
    return test_finish();
}

// bulk_copies: large copies between host and device, as they travel striped over a session's
// data connections through Flyt over TCP or a Unix socket (1 MiB and more): 64 MiB and 1 GiB + 4093
// bytes, and sizes around the 1 MiB threshold and the 4 MiB chunk; pageable, cudaMallocHost and
// cudaHostAlloc memory; cudaMemcpy and cudaMemcpyAsync (created stream and the legacy stream); a
// kernel between the two directions transforms every byte (so the device's copy is what comes back,
// in stream order: the H2D before the kernel, the D2H after it); cudaMemcpy2D with rows of 3 MiB;
// four host threads copying at once, each on its own stream. Every byte checked; FNV-1a checksums of
// what came back printed (deterministic). Bandwidths go to stderr.
#include "common.h"

#include <chrono>
#include <thread>
#include <vector>

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + seed + (i >> 13));
}

// Each byte becomes a function of its value and its place.
__global__ void transform(unsigned char *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned char)((p[i] ^ 0x5A) + (unsigned char)(i >> 7));
}

static unsigned char expected(unsigned char v, size_t i) { return (unsigned char)((v ^ 0x5A) + (unsigned char)(i >> 7)); }

static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

enum HostKind { PAGEABLE, MALLOC_HOST, HOST_ALLOC };
static const char *kind_name[] = {"pageable", "cudaMallocHost", "cudaHostAlloc"};

static unsigned char *host_alloc(HostKind k, size_t n) {
    unsigned char *p = nullptr;
    if (k == PAGEABLE) {
        p = (unsigned char *)malloc(n);
        if (!p) {
            printf("FAIL: malloc of %zu bytes\n", n);
            exit(1);
        }
    } else if (k == MALLOC_HOST) {
        CHECK(cudaMallocHost((void **)&p, n));
    } else {
        CHECK(cudaHostAlloc((void **)&p, n, cudaHostAllocPortable));
    }
    return p;
}

static void host_free(HostKind k, unsigned char *p) {
    if (k == PAGEABLE) free(p);
    else CHECK(cudaFreeHost(p));
}

// src -> device (+offset) -> transform -> back, for one size, memory kind and API.
static void round_trip(unsigned char *dev, unsigned char *src, unsigned char *back, size_t n, HostKind kind, int api, cudaStream_t s) {
    const size_t offset = 3;
    fill(src, n, (unsigned)(n % 251) + kind * 7 + api);
    memset(back, 0, n);
    auto t0 = std::chrono::steady_clock::now();
    if (api == 0) {
        CHECK(cudaMemcpy(dev + offset, src, n, cudaMemcpyHostToDevice));
    } else {
        CHECK(cudaMemcpyAsync(dev + offset, src, n, cudaMemcpyHostToDevice, api == 1 ? s : 0));
    }
    double up = seconds_since(t0);
    transform<<<264, 256, 0, api == 1 ? s : 0>>>(dev + offset, n);
    CHECK_LAUNCH();
    t0 = std::chrono::steady_clock::now();
    if (api == 0) {
        CHECK(cudaMemcpy(back, dev + offset, n, cudaMemcpyDeviceToHost));
    } else {
        CHECK(cudaMemcpyAsync(back, dev + offset, n, cudaMemcpyDeviceToHost, api == 1 ? s : 0));
        CHECK(cudaStreamSynchronize(api == 1 ? s : 0));
    }
    double down = seconds_since(t0);
    size_t bad = n;
    for (size_t i = 0; i < n; i++)
        if (back[i] != expected(src[i], i)) {
            bad = i;
            break;
        }
    const char *api_name[] = {"cudaMemcpy", "cudaMemcpyAsync(stream)", "cudaMemcpyAsync(legacy)"};
    EXPECT(bad == n, "%zu bytes %s %s: byte %zu differs", n, kind_name[kind], api_name[api], bad);
    printf("%zu bytes %s %s: %s, checksum %016llx\n", n, kind_name[kind], api_name[api], bad == n ? "ok" : "differs",
           (unsigned long long)fnv1a(back, n));
    if (n >= (64u << 20))
        fprintf(stderr, "%zu bytes %s %s: H2D %.2f GB/s (call), D2H %.2f GB/s\n", n, kind_name[kind], api_name[api], n / up / 1e9,
                n / down / 1e9);
}

int main() {
    test_init("bulk_copies");
    const size_t big = (1ull << 30) + 4093;
    unsigned char *dev;
    CHECK(cudaMalloc(&dev, big + 64));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t sizes[] = {(1u << 20) - 1, 1u << 20, (1u << 20) + 1, (4u << 20) + 3, (9u << 20) + 4093, 64u << 20};
    for (int k = 0; k < 3; k++) {
        HostKind kind = (HostKind)k;
        unsigned char *src = host_alloc(kind, 64u << 20), *back = host_alloc(kind, 64u << 20);
        for (size_t n : sizes)
            for (int api = 0; api < 3; api++) round_trip(dev, src, back, n, kind, api, s);
        host_free(kind, src);
        host_free(kind, back);
    }
    // 1 GiB and a bit: pageable and pinned, synchronous and on a stream.
    for (int k = 0; k < 2; k++) {
        HostKind kind = (HostKind)k;
        unsigned char *src = host_alloc(kind, big), *back = host_alloc(kind, big);
        for (int api = 0; api < 2; api++) round_trip(dev, src, back, big, kind, api, s);
        host_free(kind, src);
        host_free(kind, back);
    }

    // 2D: rows of 3 MiB + 5, host and device pitches differing.
    {
        size_t width = (3u << 20) + 5, height = 7, hpitch = width + 100, dpitch = 4u << 20;
        std::vector<unsigned char> h(hpitch * height), b(hpitch * height, 0);
        fill(h.data(), h.size(), 77);
        CHECK(cudaMemcpy2D(dev, dpitch, h.data(), hpitch, width, height, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy2D(b.data(), hpitch, dev, dpitch, width, height, cudaMemcpyDeviceToHost));
        bool ok = true;
        for (size_t row = 0; row < height; row++) ok &= memcmp(h.data() + row * hpitch, b.data() + row * hpitch, width) == 0;
        EXPECT(ok, "2D copies of 3 MiB rows");
        printf("2D copies of 3 MiB rows, 7 rows, pitched both sides: %s\n", ok ? "ok" : "differs");
    }

    // Four threads at once, each its own stream and range.
    {
        const size_t each = (48u << 20) + 17;
        std::vector<std::thread> threads;
        int ok[4] = {0, 0, 0, 0};
        for (int t = 0; t < 4; t++)
            threads.emplace_back([&, t] {
                cudaStream_t ts;
                if (cudaStreamCreateWithFlags(&ts, cudaStreamNonBlocking) != cudaSuccess) return;
                std::vector<unsigned char> src(each), back(each);
                unsigned char *at = dev + t * (64u << 20);
                bool good = true;
                for (int round = 0; round < 3; round++) {
                    fill(src.data(), each, 1000 + t * 10 + round);
                    good &= cudaMemcpyAsync(at, src.data(), each, cudaMemcpyHostToDevice, ts) == cudaSuccess;
                    good &= cudaMemcpyAsync(back.data(), at, each, cudaMemcpyDeviceToHost, ts) == cudaSuccess;
                    good &= cudaStreamSynchronize(ts) == cudaSuccess;
                    good &= memcmp(src.data(), back.data(), each) == 0;
                }
                cudaStreamDestroy(ts);
                ok[t] = good;
            });
        for (auto &thread : threads) thread.join();
        bool all = ok[0] && ok[1] && ok[2] && ok[3];
        EXPECT(all, "four threads copying at once");
        printf("four threads copying 48 MiB + 17 at once, 3 rounds each: %s\n", all ? "ok" : "differs");
    }

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dev));
    return test_finish();
}

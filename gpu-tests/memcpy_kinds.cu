// memcpy_kinds: every cudaMemcpyKind, with pageable and pinned host memory, sizes from 1 byte to
// 64 MiB, unaligned offsets, synchronous and async, verified byte-exact against a pattern.
// Covers: cudaMemcpy with cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
// cudaMemcpyHostToHost and cudaMemcpyDefault (each direction inferred); cudaMemcpyAsync with the same
// kinds on a created stream and on the legacy default stream; host memory from malloc (pageable),
// cudaMallocHost and cudaHostAlloc; cudaMemset to poison destinations; cudaMalloc/cudaFree;
// cudaStreamSynchronize.
//
// For each size, host memory kind, API (sync/async) and kind mode (explicit/Default):
//   src --H2D--> dev_a+off_a --D2D--> dev_b+off_b --D2H--> dst --H2H--> dst2
// and both dst and dst2 must equal src, while the bytes around the device ranges stay poisoned.
#include "common.h"

#include <vector>

enum HostKind { PAGEABLE, MALLOC_HOST, HOST_ALLOC, N_HOST };
static const char *host_name[N_HOST] = {"pageable", "cudaMallocHost", "cudaHostAlloc"};

struct HostBuf {
    unsigned char *p = nullptr;
    HostKind kind;
};

static HostBuf host_alloc(HostKind k, size_t n) {
    HostBuf b;
    b.kind = k;
    if (k == PAGEABLE) {
        b.p = (unsigned char *)malloc(n);
        if (!b.p) {
            printf("FAIL: malloc of %zu bytes\n", n);
            exit(1);
        }
    } else if (k == MALLOC_HOST) {
        CHECK(cudaMallocHost((void **)&b.p, n));
    } else {
        CHECK(cudaHostAlloc((void **)&b.p, n, cudaHostAllocPortable));
    }
    return b;
}

static void host_free(HostBuf &b) {
    if (b.kind == PAGEABLE)
        free(b.p);
    else
        CHECK(cudaFreeHost(b.p));
    b.p = nullptr;
}

int main() {
    test_init("memcpy_kinds");
    const size_t MiB = 1 << 20;
    const size_t sizes[] = {1, 2, 3, 7, 64, 4095, 4096, 4097, 65536, 65543, MiB, MiB + 1, 4 * MiB + 13, 16 * MiB, 64 * MiB};
    const size_t MAX = 64 * MiB, PAD = 4096;
    const unsigned char POISON = 0xA5;

    unsigned char *dev_a, *dev_b;
    CHECK(cudaMalloc(&dev_a, MAX + 2 * PAD));
    CHECK(cudaMalloc(&dev_b, MAX + 2 * PAD));
    HostBuf src[N_HOST], dst[N_HOST], dst2[N_HOST];
    for (int k = 0; k < N_HOST; k++) {
        src[k] = host_alloc((HostKind)k, MAX + PAD);
        dst[k] = host_alloc((HostKind)k, MAX + PAD);
        dst2[k] = host_alloc((HostKind)k, MAX + PAD);
    }
    std::vector<unsigned char> guard(PAD);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    uint32_t seed = 1;
    int total_combos = 0;
    for (size_t n : sizes) {
        int combos = 0, failed = 0;
        for (int hk = 0; hk < N_HOST; hk++) {
            for (int async = 0; async < 2; async++) {
                for (int dflt = 0; dflt < 2; dflt++) {
                    // Offsets: aligned for even seeds, odd for odd seeds (host and device both).
                    const size_t off_h = (seed & 1) ? 3 : 0, off_a = (seed & 1) ? 1 : 0, off_b = (seed & 1) ? 4093 : PAD;
                    const cudaStream_t st = (async && (seed & 2)) ? (cudaStream_t)0 : s;
                    unsigned char *hs = src[hk].p + off_h, *hd = dst[hk].p + off_h, *hd2 = dst2[hk].p + off_h;
                    fill_pattern(hs, n, seed);
                    memset(hd, 0, n);
                    memset(hd2, 0, n);
                    CHECK(cudaMemset(dev_a, POISON, MAX + 2 * PAD));
                    CHECK(cudaMemset(dev_b, POISON, MAX + 2 * PAD));
                    const cudaMemcpyKind h2d = dflt ? cudaMemcpyDefault : cudaMemcpyHostToDevice;
                    const cudaMemcpyKind d2d = dflt ? cudaMemcpyDefault : cudaMemcpyDeviceToDevice;
                    const cudaMemcpyKind d2h = dflt ? cudaMemcpyDefault : cudaMemcpyDeviceToHost;
                    const cudaMemcpyKind h2h = dflt ? cudaMemcpyDefault : cudaMemcpyHostToHost;
                    if (async) {
                        CHECK(cudaMemcpyAsync(dev_a + off_a, hs, n, h2d, st));
                        CHECK(cudaMemcpyAsync(dev_b + off_b, dev_a + off_a, n, d2d, st));
                        CHECK(cudaMemcpyAsync(hd, dev_b + off_b, n, d2h, st));
                        CHECK(cudaStreamSynchronize(st));
                        CHECK(cudaMemcpyAsync(hd2, hd, n, h2h, st));
                        CHECK(cudaStreamSynchronize(st));
                    } else {
                        CHECK(cudaMemcpy(dev_a + off_a, hs, n, h2d));
                        CHECK(cudaMemcpy(dev_b + off_b, dev_a + off_a, n, d2d));
                        CHECK(cudaMemcpy(hd, dev_b + off_b, n, d2h));
                        CHECK(cudaMemcpy(hd2, hd, n, h2h));
                    }
                    size_t bad1 = check_pattern(hd, n, seed), bad2 = check_pattern(hd2, n, seed);
                    // The bytes just before and after the device destination range stay poisoned.
                    size_t before = off_b < PAD ? off_b : PAD;
                    CHECK(cudaMemcpy(guard.data(), dev_b + off_b - before, before, cudaMemcpyDeviceToHost));
                    bool guard_ok = true;
                    for (size_t i = 0; i < before; i++) guard_ok &= guard[i] == POISON;
                    CHECK(cudaMemcpy(guard.data(), dev_b + off_b + n, PAD, cudaMemcpyDeviceToHost));
                    for (size_t i = 0; i < PAD; i++) guard_ok &= guard[i] == POISON;
                    if (bad1 != n || bad2 != n || !guard_ok) {
                        failed++;
                        printf("FAIL: size %zu, %s, %s, %s kinds: ", n, host_name[hk], async ? "async" : "sync",
                               dflt ? "cudaMemcpyDefault" : "explicit");
                        if (bad1 != n)
                            printf("after H2D/D2D/D2H byte %zu differs; ", bad1);
                        else if (bad2 != n)
                            printf("after H2H byte %zu differs; ", bad2);
                        if (!guard_ok) printf("bytes outside the D2D destination changed");
                        printf("\n");
                    }
                    combos++;
                    seed++;
                }
            }
        }
        total_combos += combos;
        g_failures += failed;
        printf("size %zu: %d combinations, %s\n", n, combos, failed ? "FAILED" : "ok");
    }
    printf("%d combinations of size, host memory, sync/async and explicit/default kinds checked\n", total_combos);

    // Mixed host memory kinds in one chain: pageable -> device -> pinned -> device -> cudaHostAlloc.
    {
        const size_t n = 8 * MiB + 5;
        fill_pattern(src[PAGEABLE].p, n, 999);
        CHECK(cudaMemcpy(dev_a, src[PAGEABLE].p, n, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dst[MALLOC_HOST].p, dev_a, n, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpyAsync(dev_b + 1, dst[MALLOC_HOST].p, n, cudaMemcpyHostToDevice, s));
        CHECK(cudaMemcpyAsync(dst[HOST_ALLOC].p, dev_b + 1, n, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        size_t bad = check_pattern(dst[HOST_ALLOC].p, n, 999);
        EXPECT(bad == n, "mixed chain: byte %zu differs", bad);
        if (bad == n) printf("pageable -> device -> pinned -> device -> cudaHostAlloc chain: ok\n");
    }

    CHECK(cudaStreamDestroy(s));
    for (int k = 0; k < N_HOST; k++) {
        host_free(src[k]);
        host_free(dst[k]);
        host_free(dst2[k]);
    }
    CHECK(cudaFree(dev_a));
    CHECK(cudaFree(dev_b));
    return test_finish();
}

// stall_pair MODE: the two apps of the "client that stops reading" soak row (through Flyt only).
//   reader   256 MiB device-to-host copies into pageable memory, back to back, checking every 8th;
//            creates $FLYT_TEST_SYNC_DIR/ready after its first two copies and goes on until
//            $FLYT_TEST_SYNC_DIR/stop exists (at most 120 s), then checks a last copy. The runner
//            SIGSTOPs it mid-copy (so it stops reading its socket), runs `steady` meanwhile, then
//            SIGCONTs it: it must finish correctly.
//   steady   a fixed workload: 300 empty launch + cudaDeviceSynchronize pairs, then 24 rounds of a
//            16 MiB host-to-device copy, a kernel and a 16 MiB device-to-host copy, all checked. The
//            runner times it alone and while the reader is stopped; the two times must be close.
// Prints `stall_pair: <mode>: PASS` or FAIL lines; counts and times go to stderr.
#include "common.h"

#include <string>
#include <sys/stat.h>
#include <time.h>
#include <vector>

__global__ void empty() {}

__global__ void fill_words(uint32_t *p, size_t n, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) p[i] = (uint32_t)i * 2654435761u ^ seed;
}

__global__ void add_one(uint32_t *p, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) p[i] += 1;
}

static bool check_words(const uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ((uint32_t)i * 2654435761u ^ seed)) return false;
    return true;
}

static double mono_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool exists(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}

static int reader() {
    const char *dir = getenv("FLYT_TEST_SYNC_DIR");
    const size_t n = 64 << 20;  // words: 256 MiB
    uint32_t *d = nullptr;
    CHECK(cudaMalloc(&d, n * 4));
    fill_words<<<1024, 256>>>(d, n, 0xabcdef);
    CHECK_LAUNCH();
    std::vector<uint32_t> h(n);
    double t0 = mono_s();
    int copies = 0, checked = 0;
    bool ok = true;
    for (;;) {
        CHECK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
        copies++;
        if (copies % 8 == 1) {
            checked++;
            if (!check_words(h.data(), n, 0xabcdef)) ok = false;
        }
        if (copies == 2 && dir) {
            FILE *f = fopen((std::string(dir) + "/ready").c_str(), "w");
            if (f) fclose(f);
        }
        if (!dir && copies >= 16) break;
        if (dir && exists(std::string(dir) + "/stop")) break;
        if (mono_s() - t0 > 120) {
            printf("FAIL: reader: no stop file within 120 s\n");
            return 1;
        }
    }
    memset(h.data(), 0, n * 4);
    CHECK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    if (!check_words(h.data(), n, 0xabcdef)) ok = false;
    fprintf(stderr, "reader: %d copies of 256 MiB in %.1f s, %d checked\n", copies, mono_s() - t0, checked + 1);
    EXPECT(ok, "reader: a copy came back wrong");
    printf("stall_pair: reader: copies %s\n", ok ? "ok" : "WRONG");
    return 0;
}

static int steady() {
    double t0 = mono_s();
    for (int i = 0; i < 300; i++) {
        empty<<<1, 1>>>();
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
    }
    const size_t n = 4 << 20;  // words: 16 MiB
    uint32_t *d = nullptr;
    CHECK(cudaMalloc(&d, n * 4));
    std::vector<uint32_t> a(n), b(n);
    bool ok = true;
    for (int r = 0; r < 24; r++) {
        for (size_t i = 0; i < n; i++) a[i] = (uint32_t)(i * 7 + r);
        CHECK(cudaMemcpy(d, a.data(), n * 4, cudaMemcpyHostToDevice));
        add_one<<<256, 256>>>(d, n);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(b.data(), d, n * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++)
            if (b[i] != a[i] + 1) {
                ok = false;
                break;
            }
    }
    CHECK(cudaFree(d));
    fprintf(stderr, "steady: %.3f s\n", mono_s() - t0);
    EXPECT(ok, "steady: a copy came back wrong");
    printf("stall_pair: steady: work %s\n", ok ? "ok" : "WRONG");
    return 0;
}

int main(int argc, char **argv) {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "reader") {
        test_init("stall_pair: reader");
        if (reader()) return 1;
    } else if (mode == "steady") {
        test_init("stall_pair: steady");
        if (steady()) return 1;
    } else {
        printf("usage: stall_pair reader|steady\n");
        return 2;
    }
    return test_finish();
}

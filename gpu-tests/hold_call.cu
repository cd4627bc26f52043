// hold_call MODE: sits in a long blocking CUDA call so that the runner can kill the server's worker
// process under it (the "worker killed mid-call" soak row; through Flyt only).
//   kernel   cudaDeviceSynchronize on a 10 s kernel
//   copies   64 MiB device-to-host cudaMemcpy (pageable) in a loop for up to 10 s
// It creates $FLYT_TEST_SYNC_DIR/ready just before the blocking part. When a call fails it prints
//   hold_call: <mode>: <call> failed with <error name> after <s> s in the blocking part
//   hold_call: error at unix ns <CLOCK_REALTIME>
// (the runner subtracts its own kill time from the second line), then checks that a later call fails
// too, and exits 0. A blocking part that ends without an error (the worker's death went unnoticed)
// prints FAIL and exits 1.
#include "common.h"

#include <string>
#include <time.h>
#include <vector>

static long long realtime_ns() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static double mono_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    test_init("hold_call");
    std::string mode = argc > 1 ? argv[1] : "kernel";
    if (mode != "kernel" && mode != "copies") {
        printf("usage: hold_call kernel|copies\n");
        return 2;
    }
    const size_t bytes = 64 << 20;
    void *d = nullptr;
    CHECK(cudaMalloc(&d, bytes));
    CHECK(cudaMemset(d, 0x5a, bytes));
    std::vector<unsigned char> h(bytes);
    CHECK(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
    spin_kernel<<<1, 1>>>(1000000ull, nullptr, 0);  // loads the module; 1 ms
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());

    const char *dir = getenv("FLYT_TEST_SYNC_DIR");
    if (dir) {
        std::string path = std::string(dir) + "/ready";
        FILE *f = fopen(path.c_str(), "w");
        if (f) fclose(f);
    }
    const char *what = "";
    cudaError_t e = cudaSuccess;
    double t0 = mono_s();
    if (mode == "kernel") {
        spin_kernel<<<1, 1>>>(10000000000ull, nullptr, 0);
        e = cudaGetLastError();
        what = "kernel launch";
        if (e == cudaSuccess) {
            e = cudaDeviceSynchronize();
            what = "cudaDeviceSynchronize";
        }
    } else {
        what = "cudaMemcpy";
        while (e == cudaSuccess && mono_s() - t0 < 10.0) e = cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost);
    }
    long long at = realtime_ns();
    double held = mono_s() - t0;
    if (e == cudaSuccess) {
        printf("FAIL: %s: the blocking part ended after %.3f s without an error\n", mode.c_str(), held);
        return 1;
    }
    printf("hold_call: %s: %s failed with %s after %.3f s in the blocking part\n", mode.c_str(), what,
           cudaGetErrorName(e), held);
    printf("hold_call: error at unix ns %lld\n", at);
    void *p = nullptr;
    cudaError_t later = cudaMalloc(&p, 4096);
    printf("hold_call: a later cudaMalloc: %s\n", cudaGetErrorName(later));
    EXPECT(later != cudaSuccess, "a later cudaMalloc succeeded on a session whose worker is gone");
    return test_finish();
}

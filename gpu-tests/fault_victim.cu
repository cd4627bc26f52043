// fault_victim: the well-behaved half of the fault-isolation pair (the other half is fault_kernel).
// Keeps a 16 MiB device state, a __constant__ and a __device__ variable, and runs loops of kernels
// for several seconds, checking the whole state against a host mirror after every iteration. It must
// keep running correctly while fault_kernel faults on the same GPU / the same flyt-rpc-server.
//
// Coordination with the runner (env FLYT_TEST_SYNC_DIR=<dir>):
//   - after its first verified iterations it creates <dir>/victim.ready;
//   - it keeps iterating until <dir>/faulter.done exists (created by the runner once fault_kernel has
//     exited), then runs POST_ITERS more iterations, so work before, during and after the fault is
//     checked; it gives up (FAIL) if faulter.done does not appear within 100 s.
// Without FLYT_TEST_SYNC_DIR it runs a fixed number of iterations (a few seconds) and prints the same.
#include "common.h"

#include <chrono>
#include <string>
#include <sys/stat.h>
#include <vector>

__constant__ unsigned int c_mul[8];
__device__ unsigned int d_iter;

__global__ void lcg_step(unsigned int *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * c_mul[i & 7] + d_iter + (unsigned int)i;
}

__global__ void bump_iter() { d_iter += 1; }

static bool exists(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

int main() {
    test_init("fault_victim");
    const char *sync_dir = getenv("FLYT_TEST_SYNC_DIR");
    const int READY_AFTER = 5, MIN_ITERS = 30, POST_ITERS = 30, STANDALONE_ITERS = 100, KERNELS_PER_ITER = 8;
    const double GIVE_UP_S = 100.0;

    const int n = 4 << 20;  // 16 MiB of unsigned int
    const size_t bytes = (size_t)n * sizeof(unsigned int);
    const unsigned int mul[8] = {1664525u, 22695477u, 1103515245u, 134775813u, 214013u, 69069u, 1u, 3u};
    std::vector<unsigned int> mirror(n), back(n);
    for (int i = 0; i < n; i++) mirror[i] = (unsigned int)i * 2654435761u;
    unsigned int iter = 0;

    unsigned int *d_x;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&d_x, bytes));
    CHECK(cudaMemcpy(d_x, mirror.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyToSymbol(c_mul, mul, sizeof(mul)));
    CHECK(cudaMemcpyToSymbol(d_iter, &iter, sizeof(iter)));
    printf("victim: setup ok\n");

    auto t0 = std::chrono::steady_clock::now();
    bool ready_sent = false, saw_done = false, gave_up = false;
    int done_at = -1, it = 0;
    for (;; it++) {
        if (!sync_dir && it >= STANDALONE_ITERS) break;
        if (sync_dir && saw_done && it >= done_at + POST_ITERS && it >= MIN_ITERS) break;
        for (int k = 0; k < KERNELS_PER_ITER; k++) {
            bump_iter<<<1, 1, 0, s>>>();
            CHECK_LAUNCH();
            lcg_step<<<(n + 255) / 256, 256, 0, s>>>(d_x, n);
            CHECK_LAUNCH();
            iter++;
            for (int i = 0; i < n; i++) mirror[i] = mirror[i] * mul[i & 7] + iter + (unsigned int)i;
        }
        CHECK(cudaMemcpyAsync(back.data(), d_x, bytes, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        if (memcmp(back.data(), mirror.data(), bytes) != 0) {
            printf("FAIL: device state differs from the host mirror\n");
            fprintf(stderr, "fault_victim: mismatch at iteration %d\n", it);
            g_failures++;
            break;
        }
        unsigned int dev_iter = 0;
        CHECK(cudaMemcpyFromSymbol(&dev_iter, d_iter, sizeof(dev_iter)));
        if (dev_iter != iter) {
            printf("FAIL: __device__ iteration counter differs from the host's\n");
            g_failures++;
            break;
        }
        if (sync_dir) {
            if (!ready_sent && it + 1 >= READY_AFTER) {
                std::string ready = std::string(sync_dir) + "/victim.ready";
                FILE *f = fopen(ready.c_str(), "w");
                if (!f) {
                    printf("FAIL: cannot create the ready file\n");
                    return 1;
                }
                fclose(f);
                ready_sent = true;
                fprintf(stderr, "fault_victim: ready after %d iterations\n", it + 1);
            }
            if (!saw_done && exists(std::string(sync_dir) + "/faulter.done")) {
                saw_done = true;
                done_at = it;
                fprintf(stderr, "fault_victim: faulter done seen at iteration %d\n", it);
            }
            double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (!saw_done && elapsed > GIVE_UP_S) {
                gave_up = true;
                break;
            }
        }
    }
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fprintf(stderr, "fault_victim: %d iterations (%d kernels) in %.2f s\n", it, it * KERNELS_PER_ITER * 2, elapsed);
    if (sync_dir) {
        printf("victim: kept running while the faulting app ran and after it ended: %s\n",
               (saw_done && !gave_up && g_failures == 0) ? "yes" : "no");
        EXPECT(saw_done, "faulter.done never appeared");
    }
    if (g_failures == 0) printf("victim: every iteration verified\n");

    // Everything still usable at the end, and nothing leaked into this context's error state.
    expect_err("victim cudaGetLastError at the end", cudaGetLastError(), cudaSuccess);
    CHECK(cudaFree(d_x));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaDeviceSynchronize());
    return test_finish();
}

// paging: processes taking turns with large allocations, as tenants of an oversubscribed GPU do
// (docs/design/paging.md). The parent (which never calls CUDA) forks N children; each allocates
// FRACTION of the GPU's memory in one cudaMalloc, fills it with a kernel, and then, on each of its
// turns, checks every word with a kernel (the bytes must be what it wrote last turn) and writes
// new ones. Turns go round-robin, one child at a time, so stdout is in a fixed order.
//
// Arguments: paging [processes=3] [fraction=0.25] [rounds=4]. Natively (and through a plain
// server) the processes must fit together: 3 x 0.25. Through a server started with
// --oversubscribe 2.0 and a quota of twice the GPU, run it with 3 0.6: the children then fit
// only by being paged out while idle (the server's --idle-page-out-ms, 1 s by default, passes
// while they wait for their turn). Each turn's first call's time (the page-in, after the page-out
// that made room for it) goes to stderr, with the rate it makes for the process's bytes.
// benchmarks/paging.sh runs it so on a GPU and prints the server's own per-phase timings of each
// page-out and page-in (wait, map, copy, release) and whether a 40 GiB page-in takes <= 1.5 s.
// A child that fails (its CUDA call errs, it dies) ends the run at once: the parent stops the
// others and exits non-zero.
#include "take_turns.h"

__host__ __device__ inline uint32_t word_at(size_t i, uint32_t seed) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed * 40503u ^ (uint32_t)(i >> 32);
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return x;
}

__global__ void fill(uint32_t *words, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        words[i] = word_at(i, seed);
}

__global__ void count_wrong(const uint32_t *words, size_t n, uint32_t seed, unsigned long long *wrong) {
    unsigned long long mine = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        mine += words[i] != word_at(i, seed);
    if (mine) atomicAdd(wrong, mine);
}

static uint32_t seed_of(int child, int round) { return (uint32_t)(child * 1000 + round + 1); }

// One child: its allocation and its turns (a byte from the parent starts each; one back ends it).
static int child(int index, int rounds, double fraction, int turn_fd, int done_fd) {
    if (!receive(turn_fd)) return 3;
    size_t free_bytes = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total));
    size_t bytes = (size_t)(total * fraction) & ~(size_t)((2 << 20) - 1);
    size_t n = bytes / sizeof(uint32_t);
    uint32_t *words = nullptr;
    unsigned long long *wrong = nullptr;
    CHECK(cudaMalloc(&words, bytes));
    CHECK(cudaMalloc(&wrong, sizeof(*wrong)));
    fill<<<1024, 256>>>(words, n, seed_of(index, 0));
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("process %d: holds %.2f of the GPU's memory\n", index, fraction);
    send_byte(done_fd);
    int failures = 0;
    for (int round = 0; round < rounds; round++) {
        if (!receive(turn_fd)) return 3;
        double started = now_ms();
        CHECK(cudaMemset(wrong, 0, sizeof(*wrong)));
        double first_ms = now_ms() - started;
        fprintf(stderr, "process %d turn %d: first call took %.1f ms (%.1f GB/s for its %.2f GiB)\n", index, round, first_ms,
                first_ms > 0 ? bytes / first_ms / 1e6 : 0.0, bytes / 1073741824.0);
        count_wrong<<<1024, 256>>>(words, n, seed_of(index, round), wrong);
        CHECK_LAUNCH();
        unsigned long long host_wrong = 0;
        CHECK(cudaMemcpy(&host_wrong, wrong, sizeof(host_wrong), cudaMemcpyDeviceToHost));
        printf("process %d turn %d: %s\n", index, round, host_wrong == 0 ? "every word as written" : "WORDS CHANGED");
        if (host_wrong != 0) {
            printf("FAIL: process %d turn %d: %llu words changed\n", index, round, host_wrong);
            failures++;
        }
        fill<<<1024, 256>>>(words, n, seed_of(index, round + 1));
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        fprintf(stderr, "process %d turn %d: took %.1f ms\n", index, round, now_ms() - started);
        send_byte(done_fd);
    }
    CHECK(cudaFree(words));
    CHECK(cudaFree(wrong));
    return failures ? 1 : 0;
}

int main(int argc, char **argv) { return take_turns(argc, argv, "paging", "rounds", 3, 0.25, child); }

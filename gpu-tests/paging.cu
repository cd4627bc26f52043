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
#include "common.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

static double now_ms() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Waits up to 10 minutes for one byte on `fd`; false on end of file, error or timeout.
static bool receive(int fd) {
    pollfd p = {fd, POLLIN, 0};
    char byte;
    return poll(&p, 1, 600000) == 1 && read(fd, &byte, 1) == 1;
}

static void send_byte(int fd) {
    char byte = 't';
    if (write(fd, &byte, 1) != 1) exit(3);
}

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

int main(int argc, char **argv) {
    test_init("paging");
    int processes = argc > 1 ? atoi(argv[1]) : 3;
    double fraction = argc > 2 ? atof(argv[2]) : 0.25;
    int rounds = argc > 3 ? atoi(argv[3]) : 4;
    if (processes < 1 || processes > 16 || fraction <= 0 || fraction > 1 || rounds < 1) {
        printf("usage: paging [processes 1-16] [fraction 0-1] [rounds]\n");
        return 2;
    }
    printf("%d processes, %d turns each\n", processes, rounds);
    int turn[16][2], done[16][2];
    pid_t pids[16];
    for (int i = 0; i < processes; i++) {
        if (pipe(turn[i]) != 0 || pipe(done[i]) != 0) return 2;
        fflush(stdout);
        pids[i] = fork();
        if (pids[i] < 0) return 2;
        if (pids[i] == 0) {
            close(turn[i][1]);
            close(done[i][0]);
            // The earlier children's pipe ends the parent keeps: held here, a child's turn pipe
            // would never close for it when the parent gives up.
            for (int j = 0; j < i; j++) {
                close(turn[j][1]);
                close(done[j][0]);
            }
            exit(child(i, rounds, fraction, turn[i][0], done[i][1]));
        }
        close(turn[i][0]);
        close(done[i][1]);
    }
    // One at a time: allocations first, then the turns, round-robin.
    signal(SIGPIPE, SIG_IGN);
    int lost = -1;
    for (int round = -1; round < rounds && lost < 0; round++) {
        for (int i = 0; i < processes && lost < 0; i++) {
            char byte = 't';
            if (write(turn[i][1], &byte, 1) != 1 || !receive(done[i][0])) {
                printf("FAIL: process %d did not finish its turn %d\n", i, round);
                lost = i;
            }
        }
    }
    int failed = lost >= 0 ? 1 : 0;
    if (lost >= 0) {
        // The others wait for turns that will not come: stopped now, not at a timeout.
        for (int i = 0; i < processes; i++)
            if (i != lost) kill(pids[i], SIGKILL);
    }
    for (int i = 0; i < processes; i++) {
        close(turn[i][1]);
        int status = 0;
        // The lost child ends by itself (its pipe closed: it exited) or is stopped after 30 s.
        double deadline = now_ms() + 30000;
        while (waitpid(pids[i], &status, WNOHANG) == 0) {
            if (now_ms() > deadline) {
                kill(pids[i], SIGKILL);
                waitpid(pids[i], &status, 0);
                break;
            }
            usleep(10000);
        }
        if (lost >= 0 && i != lost) continue;  // stopped by the parent
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (WIFSIGNALED(status))
                printf("FAIL: process %d ended by signal %d\n", i, WTERMSIG(status));
            else
                printf("FAIL: process %d ended with status %d\n", i, WEXITSTATUS(status));
            failed++;
        }
    }
    g_failures += failed;
    return test_finish();
}

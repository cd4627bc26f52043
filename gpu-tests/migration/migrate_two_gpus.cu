// migrate_two_gpus: a CUDA runtime program on two GPUs to move while it runs (gpu-tests/migrate.sh,
// row "two-gpus": both servers serve the session's two GPUs, `--gpu A,B`). On each GPU: device
// memory, a stream, an event and a module global (one copy per device); peer access enabled both
// ways. Every round a kernel on each GPU steps its own memory, a kernel on GPU 0 reads GPU 1's
// memory through peer access, a slice of GPU 0's memory is copied to GPU 1 (cudaMemcpyPeerAsync)
// after GPU 1's event, and GPU 0's stream waits for GPU 1's event; every tenth round each GPU's
// checksums and global come back and are printed. Integer arithmetic only: the output is the same
// natively and through Flyt, moved or not. The pointers are printed at the start and at the end
// ("pointers: ..."): a move must keep them.
//
// Arguments: rounds (default 200), milliseconds between rounds (default 10), and a gate file:
// halfway, GPU 1 current, the program keeps GPU 1's stream busy with kernels on a scratch buffer
// until that file exists, so a script can move it as often as it likes mid-run; then it checks
// that GPU 1 is still current and each pointer's device.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>

#include "../common.h"  // CHECK

constexpr size_t WORDS = 1 << 22;  // 16 MiB a GPU
constexpr size_t SLICE = 1 << 16;  // words copied GPU 0 -> GPU 1 each round

__device__ unsigned long long steps;  // one per GPU: each counts its own kernels' rounds

__global__ void fill(unsigned *words, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) words[i] = (unsigned)(i * 2654435761u) ^ seed;
}

__global__ void step(unsigned *words, size_t n, unsigned round) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) words[i] = words[i] * 1664525u + 1013904223u + round;
    if (blockIdx.x == 0 && threadIdx.x == 0) steps += 1;
}

// On GPU 0: mixes GPU 1's words in, read through peer access.
__global__ void mix_peer(unsigned *mine, const unsigned *peer, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) mine[i] ^= peer[(i * 7) % n] >> 3;
}

__global__ void checksum(const unsigned *words, size_t n, unsigned long long *sum) {
    unsigned long long mine = 0;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) mine += words[i] ^ (unsigned)i;
    atomicAdd(sum, mine);
}

__global__ void busy(unsigned *scratch, unsigned spin) {
    scratch[threadIdx.x] = scratch[threadIdx.x] * 3 + spin;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 10;
    const char *gate = argc > 3 ? argv[3] : nullptr;
    timespec nap = {0, (long)pause_ms * 1000000L};
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    if (count < 2) {
        printf("two GPUs needed, %d seen\n", count);
        return 1;
    }
    unsigned *words[2], *scratch = nullptr;
    unsigned long long *sums[2], *sums_host = nullptr;
    cudaStream_t streams[2];
    cudaEvent_t events[2];
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaMalloc(&words[d], WORDS * sizeof(unsigned)));
        CHECK(cudaMalloc(&sums[d], 2 * sizeof(unsigned long long)));
        CHECK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
        CHECK(cudaEventCreateWithFlags(&events[d], cudaEventDisableTiming));
        CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
        unsigned long long zero = 0;
        CHECK(cudaMemcpyToSymbol(steps, &zero, sizeof zero));
        fill<<<128, 256, 0, streams[d]>>>(words[d], WORDS, 0x9e3779b9u * (d + 1));
    }
    CHECK(cudaMalloc(&scratch, 1024 * sizeof(unsigned)));  // on GPU 1
    CHECK(cudaMallocHost(&sums_host, 2 * sizeof(unsigned long long)));
    printf("pointers: %p %p %p %p %p\n", (void *)words[0], (void *)words[1], (void *)sums[0], (void *)sums[1], (void *)scratch);
    fflush(stdout);
    for (int round = 0; round < rounds; round++) {
        CHECK(cudaSetDevice(1));
        step<<<128, 256, 0, streams[1]>>>(words[1], WORDS, round);
        CHECK(cudaEventRecord(events[1], streams[1]));
        CHECK(cudaSetDevice(0));
        CHECK(cudaStreamWaitEvent(streams[0], events[1], 0));
        step<<<128, 256, 0, streams[0]>>>(words[0], WORDS, round);
        mix_peer<<<128, 256, 0, streams[0]>>>(words[0], words[1], WORDS);
        CHECK(cudaMemcpyPeerAsync(words[1] + (round % 16) * SLICE, 1, words[0], 0, SLICE * sizeof(unsigned), streams[0]));
        CHECK(cudaEventRecord(events[0], streams[0]));
        CHECK(cudaSetDevice(1));
        CHECK(cudaStreamWaitEvent(streams[1], events[0], 0));
        if ((round + 1) % 10 == 0) {
            printf("round %d:", round + 1);
            for (int d = 0; d < 2; d++) {
                CHECK(cudaSetDevice(d));
                CHECK(cudaMemsetAsync(sums[d], 0, sizeof(unsigned long long), streams[d]));
                checksum<<<64, 256, 0, streams[d]>>>(words[d], WORDS, sums[d]);
                CHECK(cudaMemcpyAsync(sums_host, sums[d], sizeof(unsigned long long), cudaMemcpyDeviceToHost, streams[d]));
                CHECK(cudaMemcpyFromSymbolAsync(sums_host + 1, steps, sizeof(unsigned long long), 0, cudaMemcpyDeviceToHost, streams[d]));
                CHECK(cudaStreamSynchronize(streams[d]));
                printf(" gpu %d %016llx steps %llu", d, sums_host[0], sums_host[1]);
            }
            printf("\n");
            fflush(stdout);
        }
        if (gate && round == rounds / 2) {
            CHECK(cudaSetDevice(1));
            fprintf(stderr, "holding until %s exists\n", gate);
            for (unsigned spin = 0; access(gate, F_OK) != 0; spin++) {
                busy<<<1, 1024, 0, streams[1]>>>(scratch, spin);
                CHECK(cudaStreamSynchronize(streams[1]));
                nanosleep(&nap, nullptr);
            }
            int current = -1;
            CHECK(cudaGetDevice(&current));
            cudaPointerAttributes on[2];
            CHECK(cudaPointerGetAttributes(&on[0], words[0]));
            CHECK(cudaPointerGetAttributes(&on[1], words[1]));
            printf("after the gate: current GPU %d, memory of GPU %d and GPU %d\n", current, on[0].device, on[1].device);
        }
        nanosleep(&nap, nullptr);
    }
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamSynchronize(streams[d]));
    }
    printf("pointers: %p %p %p %p %p\n", (void *)words[0], (void *)words[1], (void *)sums[0], (void *)sums[1], (void *)scratch);
    for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamDestroy(streams[d]));
        CHECK(cudaEventDestroy(events[d]));
        CHECK(cudaFree(words[d]));
        CHECK(cudaFree(sums[d]));
    }
    CHECK(cudaFree(scratch));
    CHECK(cudaFreeHost(sums_host));
    printf("PASSED\n");
    return 0;
}

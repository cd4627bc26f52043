// migrate_app: a CUDA runtime program to move while it runs (gpu-tests/migrate.sh; kept out of
// run.sh, whose native and Flyt outputs would differ in its pointer lines). It holds
// device memory in many sizes (arg 1: MiB in all), four streams (one of high priority), events
// that chain them, and a module with globals (__device__ state the kernels update, a
// __constant__ table the host rewrites, both read back with cudaMemcpyFromSymbol). Every round
// each allocation's window is stepped on its stream, stream 0 waits for the others through events
// and steps the globals; every tenth round the windows' checksums come back through page-locked
// memory and are printed. At the end every allocation is summed whole. Integer arithmetic only,
// so the output is the same natively and through Flyt, moved or not. The allocations' and
// symbols' addresses are printed at the start and at the end ("pointers: ..."): a move must keep
// them.
//
// Arguments: MiB (default 1024), rounds (default 300), milliseconds between rounds (default 10),
// and a gate file: halfway, the program keeps its streams busy with kernels on a scratch buffer
// (which the output does not show) until that file exists, so a script can move it as often as
// it likes mid-run.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>
#include <vector>

#include "../common.h"  // CHECK

__device__ unsigned int g_launches;
__device__ unsigned int g_table[256];
__constant__ unsigned int c_mult[4];

__device__ unsigned int mix(size_t i, unsigned int seed) {
    unsigned int x = (unsigned int)(i * 2654435761u) ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    return x ^ (x >> 13);
}

__global__ void fill(unsigned int *data, size_t words, unsigned int seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
        data[i] = mix(i, seed);
}

__global__ void step(unsigned int *data, size_t words, size_t start, size_t window, unsigned int round) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < window; i += (size_t)gridDim.x * blockDim.x) {
        size_t at = (start + i) % words;
        data[at] = data[at] * c_mult[at & 3] + round + g_table[at & 255];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&g_launches, 1u);
}

__global__ void step_table(unsigned int round) {
    unsigned int t = threadIdx.x;
    g_table[t] = g_table[t] * 1664525u + 1013904223u + round + t;
}

__global__ void churn(unsigned int *scratch, size_t words) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x) scratch[i] += 1;
}

// Sum of data[i] * (i | 1) over [start, start + len), modulo 2^64: order does not matter.
__global__ void checksum(const unsigned int *data, size_t start, size_t len, unsigned long long *out) {
    unsigned long long sum = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len; i += (size_t)gridDim.x * blockDim.x)
        sum += (unsigned long long)data[start + i] * ((start + i) | 1);
    atomicAdd(out, sum);
}

static unsigned long long fnv(unsigned long long hash, unsigned long long value) {
    for (int byte = 0; byte < 8; byte++) hash = (hash ^ ((value >> (8 * byte)) & 0xff)) * 1099511628211ull;
    return hash;
}

static void print_pointers(const std::vector<unsigned int *> &buffers) {
    void *launches, *table, *mult;
    CHECK(cudaGetSymbolAddress(&launches, g_launches));
    CHECK(cudaGetSymbolAddress(&table, g_table));
    CHECK(cudaGetSymbolAddress(&mult, c_mult));
    unsigned long long hash = 1469598103934665603ull;
    for (unsigned int *buffer : buffers) hash = fnv(hash, (unsigned long long)buffer);
    printf("pointers: %zu allocations %p..%p hash %016llx; symbols %p %p %p\n", buffers.size(), (void *)buffers.front(),
           (void *)buffers.back(), hash, launches, table, mult);
    fflush(stdout);
}

int main(int argc, char **argv) {
    size_t total = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 300;
    int pause_ms = argc > 3 ? atoi(argv[3]) : 10;
    const char *gate = argc > 4 ? argv[4] : NULL;
    const size_t sizes[] = {4096, 65536 + 128, (1 << 20) + 12, 64 << 20, 512 << 20};
    std::vector<unsigned int *> buffers;
    std::vector<size_t> words;
    for (size_t held = 0, i = 0; held < total; i++) {
        size_t size = sizes[i % 5];
        if (size > total - held) size = (total - held + 3) / 4 * 4;
        unsigned int *buffer;
        CHECK(cudaMalloc(&buffer, size));
        buffers.push_back(buffer);
        words.push_back(size / 4);
        held += size;
    }
    const int nstreams = 4;
    cudaStream_t streams[nstreams];
    int least, greatest;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (int s = 0; s < nstreams; s++) CHECK(cudaStreamCreateWithPriority(&streams[s], cudaStreamNonBlocking, s == 1 ? greatest : least));
    cudaEvent_t joined[nstreams];
    for (int s = 0; s < nstreams; s++) CHECK(cudaEventCreateWithFlags(&joined[s], cudaEventDisableTiming));
    cudaEvent_t stepped;
    CHECK(cudaEventCreateWithFlags(&stepped, cudaEventDisableTiming));
    unsigned long long *sums, *host_sums;
    CHECK(cudaMalloc(&sums, buffers.size() * sizeof *sums));
    CHECK(cudaMallocHost(&host_sums, buffers.size() * sizeof *host_sums));
    unsigned int mult[4] = {3, 5, 7, 11}, zero = 0, table[256];
    for (int t = 0; t < 256; t++) table[t] = t * 40503u;
    CHECK(cudaMemcpyToSymbol(c_mult, mult, sizeof mult));
    CHECK(cudaMemcpyToSymbol(g_table, table, sizeof table));
    CHECK(cudaMemcpyToSymbol(g_launches, &zero, sizeof zero));
    for (size_t b = 0; b < buffers.size(); b++) fill<<<256, 256, 0, streams[b % nstreams]>>>(buffers[b], words[b], (unsigned int)b);
    CHECK(cudaDeviceSynchronize());
    print_pointers(buffers);
    const size_t window = 1 << 16;
    struct timespec nap = {pause_ms / 1000, (long)(pause_ms % 1000) * 1000000L};
    unsigned int *scratch;
    CHECK(cudaMalloc(&scratch, 16 << 20));
    for (int round = 0; round < rounds; round++) {
        if (gate && round == rounds / 2) {
            fprintf(stderr, "holding at round %d until %s exists\n", round, gate);
            for (int turn = 0; access(gate, F_OK) != 0; turn++) {
                churn<<<64, 256, 0, streams[turn % nstreams]>>>(scratch, (16 << 20) / 4);
                CHECK(cudaEventRecord(joined[0], streams[turn % nstreams]));
                CHECK(cudaEventSynchronize(joined[0]));
                nanosleep(&nap, NULL);
            }
            CHECK(cudaDeviceSynchronize());
        }
        if (round % 50 == 25) {
            // No kernel may read the table while it changes.
            CHECK(cudaDeviceSynchronize());
            for (int m = 0; m < 4; m++) mult[m] += 2;
            CHECK(cudaMemcpyToSymbolAsync(c_mult, mult, sizeof mult, 0, cudaMemcpyHostToDevice, streams[0]));
            CHECK(cudaStreamSynchronize(streams[0]));
        }
        for (size_t b = 0; b < buffers.size(); b++) {
            size_t span = words[b] < window ? words[b] : window;
            size_t start = ((size_t)round * 7919u * 64) % words[b];
            step<<<64, 256, 0, streams[b % nstreams]>>>(buffers[b], words[b], start, span, (unsigned int)round);
        }
        for (int s = 1; s < nstreams; s++) {
            CHECK(cudaEventRecord(joined[s], streams[s]));
            CHECK(cudaStreamWaitEvent(streams[0], joined[s], 0));
        }
        step_table<<<1, 256, 0, streams[0]>>>((unsigned int)round);
        CHECK(cudaGetLastError());
        // The next round's steps read the table this one stepped.
        CHECK(cudaEventRecord(stepped, streams[0]));
        for (int s = 1; s < nstreams; s++) CHECK(cudaStreamWaitEvent(streams[s], stepped, 0));
        if (round % 10 == 9) {
            CHECK(cudaMemsetAsync(sums, 0, buffers.size() * sizeof *sums, streams[0]));
            for (size_t b = 0; b < buffers.size(); b++) {
                size_t span = words[b] < window ? words[b] : window;
                checksum<<<32, 256, 0, streams[0]>>>(buffers[b], 0, span, sums + b);
            }
            CHECK(cudaMemcpyAsync(host_sums, sums, buffers.size() * sizeof *sums, cudaMemcpyDeviceToHost, streams[0]));
            CHECK(cudaEventRecord(joined[0], streams[0]));
            CHECK(cudaEventSynchronize(joined[0]));
            unsigned long long all = 1469598103934665603ull;
            for (size_t b = 0; b < buffers.size(); b++) all = fnv(all, host_sums[b]);
            unsigned int launches;
            CHECK(cudaMemcpyFromSymbol(&launches, g_launches, sizeof launches));
            CHECK(cudaMemcpyFromSymbol(table, g_table, sizeof table));
            printf("round %d: windows %016llx launches %u table[0] %08x table[255] %08x\n", round, all, launches, table[0], table[255]);
            fflush(stdout);
        }
        nanosleep(&nap, NULL);
    }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemset(sums, 0, buffers.size() * sizeof *sums));
    for (size_t b = 0; b < buffers.size(); b++) checksum<<<1024, 256>>>(buffers[b], 0, words[b], sums + b);
    CHECK(cudaMemcpy(host_sums, sums, buffers.size() * sizeof *sums, cudaMemcpyDeviceToHost));
    unsigned long long all = 1469598103934665603ull;
    for (size_t b = 0; b < buffers.size(); b++) all = fnv(all, host_sums[b]);
    printf("whole memory (%zu MiB in %zu allocations): %016llx\n", total >> 20, buffers.size(), all);
    print_pointers(buffers);
    for (unsigned int *buffer : buffers) CHECK(cudaFree(buffer));
    CHECK(cudaFree(sums));
    CHECK(cudaFree(scratch));
    CHECK(cudaFreeHost(host_sums));
    CHECK(cudaEventDestroy(stepped));
    for (int s = 0; s < nstreams; s++) {
        CHECK(cudaEventDestroy(joined[s]));
        CHECK(cudaStreamDestroy(streams[s]));
    }
    printf("PASSED\n");
    return 0;
}

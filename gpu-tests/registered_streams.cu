// registered_streams: async device-to-host copies on many streams, into every kind of host memory,
// checked byte for byte after every kind of synchronization CUDA defines.
//
// Per iteration, for each of N streams: a kernel writes a slice on the device, cudaMemcpyAsync copies
// it back into that stream's slice of one host buffer (slices packed back to back, so odd sizes give
// unaligned host addresses), and an event is recorded. Then the iteration synchronizes in one of five
// ways and checks every byte of every slice:
//   stream   cudaStreamSynchronize on each stream
//   event    cudaEventSynchronize on each event
//   device   cudaDeviceSynchronize
//   query    cudaStreamQuery (even iterations) or cudaEventQuery (odd) polled until cudaSuccess
//   chain    stream k waits (cudaStreamWaitEvent) for an event recorded on stream k-1 after its own
//            wait; one cudaStreamSynchronize of the last stream covers all copies
// Host memory: malloc + cudaHostRegister, pageable (malloc), cudaMallocHost, cudaHostAlloc. For
// pageable memory CUDA also documents that a device-to-host cudaMemcpyAsync returns only once the
// copy has completed: that is checked right after each call, before any synchronization.
// Streams: 4, 8, 16; slice sizes 4 KiB to 16 MiB, odd sizes included; each (memory, streams)
// configuration runs ITERS iterations (default 100; the first argument overrides it), covering every
// (sync, size) pair. Each byte's value depends on the iteration and the stream, and changes in every
// byte from one iteration to the next, so a copy that has not landed, landed in the wrong slice or
// landed partly is found.
#include "common.h"

#include <sched.h>
#include <vector>

static const uint64_t MUL = 0x9E3779B97F4A7C15ull;

// Word w of a slice is w * MUL ^ key; key repeats one byte, so every byte changes with the key.
__host__ __device__ static inline uint64_t word_value(uint64_t w, uint64_t key) { return w * MUL ^ key; }

__global__ void fill_slice(uint8_t *dst, size_t n, uint64_t key) {
    size_t words = n / 8;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
        reinterpret_cast<uint64_t *>(dst)[w] = word_value(w, key);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        uint64_t last = word_value(words, key);
        for (size_t i = words * 8; i < n; i++) dst[i] = (uint8_t)(last >> (8 * (i % 8)));
    }
}

static uint64_t key_for(int cfg, int it, int stream) {
    uint64_t b = (uint64_t)((it * 77 + stream * 31 + cfg * 13 + 1) & 0xFF);
    return b * 0x0101010101010101ull;
}

// Index of the first wrong byte, or n.
static size_t check_slice(const uint8_t *p, size_t n, uint64_t key) {
    size_t words = n / 8;
    for (size_t w = 0; w < words; w++) {
        uint64_t got;
        memcpy(&got, p + w * 8, 8);
        uint64_t want = word_value(w, key);
        if (got != want) {
            for (size_t i = 0; i < 8; i++)
                if ((uint8_t)(got >> (8 * i)) != (uint8_t)(want >> (8 * i))) return w * 8 + i;
        }
    }
    uint64_t last = word_value(words, key);
    for (size_t i = words * 8; i < n; i++)
        if (p[i] != (uint8_t)(last >> (8 * (i % 8)))) return i;
    return n;
}

enum Mem { REGISTERED, PAGEABLE, MALLOC_HOST, HOST_ALLOC, MEM_KINDS };
static const char *mem_name[] = {"registered", "pageable", "cudaMallocHost", "cudaHostAlloc"};
enum Sync { STREAM, EVENT, DEVICE, QUERY, CHAIN, SYNC_KINDS };
static const char *sync_name[] = {"stream", "event", "device", "query", "chain"};

static const size_t SIZES[] = {
    4096,      4099,     12289,      65536,  65543,   131071,  262147,   500001,     1048576, 1048583,
    4096 + 8,  2097152,  3145731,    777777, 8191,    16384,   16777216, 4194304 - 1, 33333,  1000000,
};
static const int N_SIZES = sizeof(SIZES) / sizeof(SIZES[0]);
static const size_t MAX_SIZE = 16777216;
static const int MAX_STREAMS = 16;
static const size_t DEV_STRIDE = MAX_SIZE;  // device slices are 16 MiB apart (aligned)

int main(int argc, char **argv) {
    test_init("registered_streams");
    int iters = argc > 1 ? atoi(argv[1]) : 100;
    if (iters < 1) iters = 1;
    printf("iterations per configuration: %d\n", iters);

    uint8_t *dev = nullptr;
    CHECK(cudaMalloc(&dev, DEV_STRIDE * MAX_STREAMS));
    cudaStream_t st[MAX_STREAMS];
    cudaEvent_t ev[MAX_STREAMS], chain[MAX_STREAMS];
    for (int s = 0; s < MAX_STREAMS; s++) {
        CHECK(cudaStreamCreateWithFlags(&st[s], s % 2 ? cudaStreamNonBlocking : cudaStreamDefault));
        CHECK(cudaEventCreateWithFlags(&ev[s], cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&chain[s], cudaEventDisableTiming));
    }
    const size_t host_bytes = MAX_SIZE * MAX_STREAMS;
    const int stream_counts[] = {4, 8, 16};
    int cfg = 0;
    for (int m = 0; m < MEM_KINDS; m++) {
        uint8_t *host = nullptr;
        switch (m) {
            case REGISTERED:
            case PAGEABLE:
                host = (uint8_t *)malloc(host_bytes);
                if (!host) {
                    printf("FAIL: malloc of %zu bytes\n", host_bytes);
                    return 1;
                }
                memset(host, 0, host_bytes);
                if (m == REGISTERED) CHECK(cudaHostRegister(host, host_bytes, cudaHostRegisterDefault));
                break;
            case MALLOC_HOST: CHECK(cudaMallocHost((void **)&host, host_bytes)); break;
            case HOST_ALLOC: CHECK(cudaHostAlloc((void **)&host, host_bytes, cudaHostAllocDefault)); break;
        }
        memset(host, 0, host_bytes);
        for (int nsi = 0; nsi < 3; nsi++, cfg++) {
            const int ns = stream_counts[nsi];
            int bad_iters = 0, early_bad = 0, early_checked = 0;
            unsigned long long bytes_checked = 0;
            for (int it = 0; it < iters; it++) {
                const Sync mode = (Sync)(it % SYNC_KINDS);
                const size_t size = SIZES[(it / SYNC_KINDS + cfg) % N_SIZES];
                for (int s = 0; s < ns; s++) {
                    uint64_t key = key_for(cfg, it, s);
                    fill_slice<<<64, 256, 0, st[s]>>>(dev + s * DEV_STRIDE, size, key);
                    CHECK_LAUNCH();
                    CHECK(cudaMemcpyAsync(host + s * size, dev + s * DEV_STRIDE, size, cudaMemcpyDeviceToHost,
                                          st[s]));
                    if (m == PAGEABLE) {
                        // Documented: to pageable memory the call returns once the copy is done.
                        early_checked++;
                        if (check_slice(host + s * size, size, key) != size) early_bad++;
                    }
                    CHECK(cudaEventRecord(ev[s], st[s]));
                }
                switch (mode) {
                    case STREAM:
                        for (int s = 0; s < ns; s++) CHECK(cudaStreamSynchronize(st[s]));
                        break;
                    case EVENT:
                        for (int s = 0; s < ns; s++) CHECK(cudaEventSynchronize(ev[s]));
                        break;
                    case DEVICE: CHECK(cudaDeviceSynchronize()); break;
                    case QUERY:
                        for (int s = 0; s < ns; s++) {
                            cudaError_t e;
                            while ((e = (it / SYNC_KINDS) % 2 ? cudaEventQuery(ev[s]) : cudaStreamQuery(st[s])) ==
                                   cudaErrorNotReady)
                                sched_yield();
                            CHECK(e);
                        }
                        break;
                    case CHAIN:
                        CHECK(cudaEventRecord(chain[0], st[0]));
                        for (int s = 1; s < ns; s++) {
                            CHECK(cudaStreamWaitEvent(st[s], chain[s - 1], 0));
                            CHECK(cudaEventRecord(chain[s], st[s]));
                        }
                        CHECK(cudaStreamSynchronize(st[ns - 1]));
                        break;
                    default: break;
                }
                bool iter_bad = false;
                for (int s = 0; s < ns; s++) {
                    size_t at = check_slice(host + s * size, size, key_for(cfg, it, s));
                    bytes_checked += size;
                    if (at != size) {
                        if (!iter_bad && bad_iters < 5)
                            printf("WRONG: %s, %d streams, iteration %d, sync %s, slice size %zu: stream %d, "
                                   "first wrong byte at %zu\n",
                                   mem_name[m], ns, it, sync_name[mode], size, s, at);
                        iter_bad = true;
                    }
                }
                if (iter_bad) bad_iters++;
                if (mode == CHAIN) CHECK(cudaDeviceSynchronize());  // the other streams, before reuse
            }
            printf("%s, %d streams: %d iterations, %d with wrong bytes\n", mem_name[m], ns, iters, bad_iters);
            EXPECT(bad_iters == 0, "%s, %d streams: %d iterations with wrong bytes", mem_name[m], ns, bad_iters);
            if (m == PAGEABLE) {
                printf("%s, %d streams: copies complete when cudaMemcpyAsync returned: %s\n", mem_name[m], ns,
                       early_bad == 0 ? "yes" : "no");
                EXPECT(early_bad == 0, "%d of %d pageable async copies were not complete on return", early_bad,
                       early_checked);
            }
            fprintf(stderr, "%s, %d streams: %.1f MiB checked\n", mem_name[m], ns, bytes_checked / 1048576.0);
        }
        switch (m) {
            case REGISTERED:
                CHECK(cudaHostUnregister(host));
                free(host);
                break;
            case PAGEABLE: free(host); break;
            default: CHECK(cudaFreeHost(host)); break;
        }
    }
    for (int s = 0; s < MAX_STREAMS; s++) {
        CHECK(cudaStreamDestroy(st[s]));
        CHECK(cudaEventDestroy(ev[s]));
        CHECK(cudaEventDestroy(chain[s]));
    }
    CHECK(cudaFree(dev));
    return test_finish();
}

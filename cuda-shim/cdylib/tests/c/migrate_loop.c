// migrate_loop: a program that keeps device memory, a stream and an event busy while its
// session is checkpointed or moved under it. Allocations of several sizes; every round first
// reads each one back and checks it still holds what the last round wrote (so memory that did
// not come along, or came back at another address, fails), then writes a new pattern. Prints
// its pointers at the start and at the end ("pointers: ..."), then "PASSED: 0 failure(s)".
// Arguments: rounds, milliseconds between rounds, MiB of one more allocation (default 0) filled
// once at the start and checked at the end (for timing moves of much memory), and "pinned" (1)
// to copy through page-locked host memory (cuMemAllocHost) and keep a mapped host block
// (cuMemHostAlloc DEVICEMAP) whose device pointer is printed with the others and read through
// the device every round.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver_expect.h"

#define BUFFERS 5

static unsigned char pattern(size_t i, unsigned round, unsigned buffer) {
    return (unsigned char)((i * 131u + round * 7u + buffer * 29u) ^ (i >> 9));
}

static void print_pointers(const CUdeviceptr *buffers, CUdeviceptr mapped) {
    printf("pointers:");
    for (int b = 0; b < BUFFERS; b++) printf(" %llx", (unsigned long long)buffers[b]);
    if (mapped) printf(" mapped %llx", (unsigned long long)mapped);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 10;
    use_primary_context(NULL);
    const size_t sizes[BUFFERS] = {256, 4096, (1 << 20) + 3, 8 << 20, 300};
    CUdeviceptr buffers[BUFFERS];
    for (int b = 0; b < BUFFERS; b++) EXPECT(cuMemAlloc(&buffers[b], sizes[b]), CUDA_SUCCESS);
    CUstream stream;
    CUevent done;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    size_t big_len = (argc > 3 ? (size_t)atol(argv[3]) : 0) << 20;
    CUdeviceptr big = 0;
    if (big_len) {
        EXPECT(cuMemAlloc(&big, big_len), CUDA_SUCCESS);
        for (size_t at = 0; at < big_len; at += 1 << 20) EXPECT(cuMemsetD8(big + at, (unsigned char)(at >> 20), 1 << 20), CUDA_SUCCESS);
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    }
    int pinned = argc > 4 && atoi(argv[4]) != 0;
    unsigned char *host, *back, *mapped_host = NULL;
    CUdeviceptr mapped = 0;
    if (pinned) {
        EXPECT(cuMemAllocHost((void **)&host, 16 << 20), CUDA_SUCCESS);
        EXPECT(cuMemAllocHost((void **)&back, 8 << 20), CUDA_SUCCESS);
        EXPECT(cuMemHostAlloc((void **)&mapped_host, 4096, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
        EXPECT(cuMemHostGetDevicePointer(&mapped, mapped_host, 0), CUDA_SUCCESS);
    } else {
        host = malloc(16 << 20);
        back = malloc(8 << 20);
    }
    print_pointers(buffers, mapped);
    struct timespec nap = {0, (long)pause_ms * 1000000L};
    // Each buffer's pattern has its own host range: an asynchronous copy from page-locked memory
    // reads it after the call returns.
    size_t at[BUFFERS], next = 0;
    for (int b = 0; b < BUFFERS; b++) {
        at[b] = next;
        next += (sizes[b] + 4095) / 4096 * 4096;
    }
    for (int round = 0; round < rounds && failures == 0; round++) {
        for (int b = 0; b < BUFFERS; b++) {
            if (round > 0) read_last_round(buffers[b], back, sizes[b], stream, pattern, round, b, "buffer", b);
            for (size_t i = 0; i < sizes[b]; i++) host[at[b] + i] = pattern(i, round, b);
            EXPECT(cuMemcpyHtoDAsync(buffers[b], host + at[b], sizes[b], stream), CUDA_SUCCESS);
        }
        EXPECT(cuEventRecord(done, stream), CUDA_SUCCESS);
        EXPECT(cuEventSynchronize(done), CUDA_SUCCESS);
        if (mapped) {
            // The device reads the app's mapped page through its device pointer.
            for (size_t i = 0; i < 4096; i++) mapped_host[i] = pattern(i, round, 7);
            EXPECT(cuMemcpyDtoH(back, mapped, 4096), CUDA_SUCCESS);
            FAIL_WHEN(memcmp(back, mapped_host, 4096) != 0,
                      "FAIL round %d: the device does not see the mapped host page\n", round);
        }
        nanosleep(&nap, NULL);
    }
    for (size_t at = 0; at < big_len && failures == 0; at += 1 << 20) {
        unsigned char first = 0, last = 0;
        EXPECT(cuMemcpyDtoH(&first, big + at, 1), CUDA_SUCCESS);
        EXPECT(cuMemcpyDtoH(&last, big + at + (1 << 20) - 1, 1), CUDA_SUCCESS);
        FAIL_WHEN(first != (unsigned char)(at >> 20) || last != (unsigned char)(at >> 20),
                  "FAIL: MiB %zu of the large allocation holds %u/%u\n", at >> 20, first, last);
    }
    if (big) EXPECT(cuMemFree(big), CUDA_SUCCESS);
    if (mapped) {
        CUdeviceptr again = 0;
        EXPECT(cuMemHostGetDevicePointer(&again, mapped_host, 0), CUDA_SUCCESS);
        mapped = again;
    }
    print_pointers(buffers, mapped);
    if (pinned) {
        EXPECT(cuMemFreeHost(host), CUDA_SUCCESS);
        EXPECT(cuMemFreeHost(back), CUDA_SUCCESS);
        EXPECT(cuMemFreeHost(mapped_host), CUDA_SUCCESS);
    }
    for (int b = 0; b < BUFFERS; b++) EXPECT(cuMemFree(buffers[b]), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(done), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    return finish();
}

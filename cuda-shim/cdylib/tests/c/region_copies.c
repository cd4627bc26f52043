// region_copies: a copy-heavy program for a VM guest's ivshmem channel. Host-to-device and
// device-to-host copies of pageable and pinned memory, several sizes (one byte to past a staging
// slot), synchronous and asynchronous on several streams; every byte is checked. Prints its
// totals; "PASSED: 0 failure(s)" at the end. An argument repeats the whole round N times.
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

#define STREAMS 4

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)((i * 131u + seed * 7u) ^ (i >> 9)); }

static int check(const unsigned char *bytes, size_t len, unsigned seed, const char *what) {
    for (size_t i = 0; i < len; i++) {
        if (bytes[i] != pattern(i, seed)) {
            printf("FAIL %s: byte %zu of %zu is %u, expected %u\n", what, i, len, bytes[i], pattern(i, seed));
            failures++;
            return 0;
        }
    }
    return 1;
}

static void fill(unsigned char *bytes, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) bytes[i] = pattern(i, seed);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    use_primary_context(NULL);
    const size_t sizes[] = {1, 4096, 1 << 20, (9 << 20) + 123};
    const size_t largest = sizes[3];
    CUdeviceptr dev = 0;
    EXPECT(cuMemAlloc(&dev, largest * STREAMS), CUDA_SUCCESS);
    unsigned char *pageable = malloc(largest * STREAMS), *back = malloc(largest * STREAMS);
    unsigned char *pinned = NULL, *pinned_back = NULL;
    EXPECT(cuMemAllocHost((void **)&pinned, largest * STREAMS), CUDA_SUCCESS);
    EXPECT(cuMemAllocHost((void **)&pinned_back, largest * STREAMS), CUDA_SUCCESS);
    CUstream streams[STREAMS];
    for (int s = 0; s < STREAMS; s++) EXPECT(cuStreamCreate(&streams[s], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    if (!pageable || !back || !pinned || !pinned_back || failures) {
        printf("FAIL: setup\n");
        return 1;
    }
    unsigned long long bytes = 0;
    for (int round = 0; round < rounds && failures == 0; round++) {
        for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t len = sizes[k];
            unsigned seed = round * 16 + k;
            // Synchronous, pageable.
            fill(pageable, len, seed);
            memset(back, 0, len);
            EXPECT(cuMemcpyHtoD(dev, pageable, len), CUDA_SUCCESS);
            EXPECT(cuMemcpyDtoH(back, dev, len), CUDA_SUCCESS);
            check(back, len, seed, "pageable round trip");
            // Asynchronous on every stream: pinned and pageable, each stream its own slice.
            for (int s = 0; s < STREAMS; s++) {
                fill(pinned + s * largest, len, seed + s + 1);
                memset(pinned_back + s * largest, 0, len);
                memset(back + s * largest, 0, len);
            }
            for (int s = 0; s < STREAMS; s++) {
                EXPECT(cuMemcpyHtoDAsync(dev + s * largest, pinned + s * largest, len, streams[s]), CUDA_SUCCESS);
                EXPECT(cuMemcpyDtoHAsync(pinned_back + s * largest, dev + s * largest, len, streams[s]), CUDA_SUCCESS);
                EXPECT(cuMemcpyDtoHAsync(back + s * largest, dev + s * largest, len, streams[s]), CUDA_SUCCESS);
            }
            for (int s = 0; s < STREAMS; s++) {
                EXPECT(cuStreamSynchronize(streams[s]), CUDA_SUCCESS);
                check(pinned_back + s * largest, len, seed + s + 1, "pinned async round trip");
                check(back + s * largest, len, seed + s + 1, "pinned to pageable async");
            }
            bytes += (unsigned long long)len * (2 + 3 * STREAMS);
        }
    }
    printf("copied %llu bytes in %d round(s)\n", bytes, rounds);
    for (int s = 0; s < STREAMS; s++) EXPECT(cuStreamDestroy(streams[s]), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(pinned), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(pinned_back), CUDA_SUCCESS);
    EXPECT(cuMemFree(dev), CUDA_SUCCESS);
    return finish();
}

// paging_turns: one tenant of an oversubscribed server (docs/design/paging.md), driven by its
// test over stdin: it allocates its memory (two allocations of MiB/2 each), fills it, prints
// "ready", then for each line on stdin ("turn") checks every byte is what it wrote last time,
// writes new bytes, synchronizes and prints "turn N ok" (or what differed). Between turns it
// makes no call: the server may page it out. Ends at end of input with "PASSED: 0 failure(s)".
// Arguments: index (for distinct bytes), MiB in all.
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

static unsigned char pattern(size_t i, unsigned index, unsigned round, unsigned buffer) {
    return (unsigned char)((i * 131u + round * 7u + buffer * 29u + index * 53u) ^ (i >> 11));
}

int main(int argc, char **argv) {
    unsigned index = argc > 1 ? (unsigned)atoi(argv[1]) : 0;
    size_t half = (argc > 2 ? (size_t)atoi(argv[2]) : 4) << 19;
    use_primary_context(NULL);
    CUdeviceptr buffers[2];
    unsigned char *host = malloc(half), *back = malloc(half);
    if (!host || !back) return 2;
    for (unsigned b = 0; b < 2; b++) {
        EXPECT(cuMemAlloc(&buffers[b], half), CUDA_SUCCESS);
        for (size_t i = 0; i < half; i++) host[i] = pattern(i, index, 0, b);
        EXPECT(cuMemcpyHtoD(buffers[b], host, half), CUDA_SUCCESS);
    }
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    unsigned round = 0;
    while (fgets(line, sizeof line, stdin)) {
        int wrong = 0;
        for (unsigned b = 0; b < 2; b++) {
            EXPECT(cuMemcpyDtoH(back, buffers[b], half), CUDA_SUCCESS);
            for (size_t i = 0; i < half; i++) wrong += back[i] != pattern(i, index, round, b);
        }
        round++;
        for (unsigned b = 0; b < 2; b++) {
            for (size_t i = 0; i < half; i++) host[i] = pattern(i, index, round, b);
            EXPECT(cuMemcpyHtoD(buffers[b], host, half), CUDA_SUCCESS);
        }
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
        if (wrong) {
            printf("FAIL turn %u: %d bytes differ\n", round, wrong);
            failures++;
        }
        printf("turn %u %s\n", round, wrong || failures ? "failed" : "ok");
        fflush(stdout);
    }
    for (unsigned b = 0; b < 2; b++) EXPECT(cuMemFree(buffers[b]), CUDA_SUCCESS);
    return finish();
}

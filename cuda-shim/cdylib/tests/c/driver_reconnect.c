// A copy-and-check loop for the reconnection test (`tests/reconnect.rs`): prints "ready", then
// runs iterations until a line arrives on stdin, each one a host-to-device copy, a memset and a
// device-to-device copy on a stream, an asynchronous copy back and a synchronize, every byte
// checked. (The emulated device runs no kernels; its memsets and copies are real.) The first
// failed call stops the loop: "stopped by NAME after N iteration(s) in S s". With the argument
// "large", copies are 24 MiB and more (striped over data connections; the copy back is a
// synchronous one into pageable memory, striped too), and "copy up N" is printed before each
// iteration's host-to-device copy.
#include "driver_expect.h"

#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_BYTES (32 * 1024 * 1024)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int stop_asked(void) {
    struct pollfd in = {.fd = 0, .events = POLLIN};
    return poll(&in, 1, 0) > 0;
}

static unsigned char pattern(int iteration, size_t offset) {
    return (unsigned char)(offset * 31 + (offset >> 11) + iteration * 7);
}

int main(int argc, char **argv) {
    int large = argc > 1 && strcmp(argv[1], "large") == 0;
    size_t base = large ? 24 * 1024 * 1024 : 256 * 1024;
    CUstream stream;
    CUdeviceptr a, b;
    unsigned char *source = malloc(MAX_BYTES);
    unsigned char *pageable = malloc(MAX_BYTES);
    unsigned char *back;
    double started;
    use_primary_context(NULL);
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&a, MAX_BYTES), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&b, MAX_BYTES), CUDA_SUCCESS);
    EXPECT(cuMemAllocHost((void **)&back, MAX_BYTES), CUDA_SUCCESS);
    if (failures) {
        printf("PASSED: %d failure(s)\n", failures);
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    int iteration = 0, wrong = 0;
    started = now();
    while (!stop_asked()) {
        // Sizes vary, so frames and copies end at ever different offsets of the stream.
        size_t len = (base + (size_t)(iteration % 97) * 4093) & ~(size_t)3;
        size_t half = len / 2 & ~(size_t)3;
        unsigned int word = 0x01010101u * (unsigned int)(iteration & 0xff);
        for (size_t k = 0; k < len; k++) source[k] = pattern(iteration, k);
        CUresult steps[6];
        if (large) {
            printf("copy up %d\n", iteration);
            fflush(stdout);
        }
        steps[0] = cuMemcpyHtoD(a, source, len);
        steps[1] = cuMemsetD32Async(b, word, len / 4, stream);
        steps[2] = cuMemcpyDtoDAsync(b, a, half, stream);
        if (large) {
            steps[3] = cuStreamSynchronize(stream);
            steps[4] = cuMemcpyDtoH(pageable, b, len);
            memcpy(back, pageable, len);
        } else {
            steps[3] = cuMemcpyDtoHAsync(back, b, len, stream);
            steps[4] = cuStreamSynchronize(stream);
        }
        size_t free_bytes, total_bytes;
        steps[5] = cuMemGetInfo(&free_bytes, &total_bytes);
        for (int s = 0; s < 6; s++) {
            if (steps[s] != CUDA_SUCCESS) {
                printf("stopped by %s after %d iteration(s) in %.1f s\n", name_of(steps[s]), iteration, now() - started);
                fflush(stdout);
                return 1;
            }
        }
        int right = memcmp(back, source, half) == 0;
        for (size_t k = half; right && k < len; k += 4) {
            unsigned int got;
            memcpy(&got, back + k, 4);
            right = got == word;
        }
        if (!right) {
            wrong++;
            printf("iteration %d: wrong bytes\n", iteration);
        }
        iteration++;
    }
    printf("iterations: %d, wrong: %d\n", iteration, wrong);
    EXPECT(cuMemFree(a), CUDA_SUCCESS);
    EXPECT(cuMemFree(b), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(back), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    failures += wrong;
    return finish();
}

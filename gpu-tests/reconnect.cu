// A copy-launch-check loop (issue 46, docs/design/reconnect.md): what an app whose TCP connection
// drops must see through Flyt is this program's native output. Each iteration copies a pattern up
// (sizes vary, so frames end at ever different places of the stream), runs a kernel that mixes
// every word with the iteration, sets a tail with cudaMemsetAsync, copies a slice device to device,
// brings everything back asynchronously into pinned memory and checks every word on the host.
// Prints a checksum every 50 iterations. Argument: iterations (default 300).
#include "common.h"

__global__ void mix(uint32_t *out, const uint32_t *in, size_t n, uint32_t iteration) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * 2654435761u + iteration;
}

static uint32_t pattern(int iteration, size_t i) {
    return (uint32_t)(i * 31u + (i >> 7) + (uint32_t)iteration * 7919u);
}

int main(int argc, char **argv) {
    test_init("reconnect");
    int iterations = argc > 1 ? atoi(argv[1]) : 300;
    const size_t max_words = 1 << 18;
    uint32_t *source = (uint32_t *)malloc(max_words * 4);
    uint32_t *back;
    uint32_t *in, *out, *copy;
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&in, max_words * 4));
    CHECK(cudaMalloc(&out, max_words * 4));
    CHECK(cudaMalloc(&copy, max_words * 4));
    CHECK(cudaMallocHost(&back, max_words * 4));
    int wrong = 0;
    uint64_t checksum = 1469598103934665603ull;
    for (int it = 0; it < iterations; it++) {
        size_t n = (1 << 16) + (size_t)(it % 97) * 1021;
        size_t tail = n / 8;
        for (size_t i = 0; i < n; i++) source[i] = pattern(it, i);
        // On the kernel's stream: a pageable cudaMemcpy returns once its bytes are staged, and a
        // non-blocking stream's kernel may read `in` before the DMA lands (natively it did).
        CHECK(cudaMemcpyAsync(in, source, n * 4, cudaMemcpyHostToDevice, stream));
        mix<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, in, n, (uint32_t)it);
        CHECK_LAUNCH();
        CHECK(cudaMemsetAsync(out + (n - tail), it & 0xff, tail * 4, stream));
        CHECK(cudaMemcpyAsync(copy, out, n * 4, cudaMemcpyDeviceToDevice, stream));
        CHECK(cudaMemcpyAsync(back, copy, n * 4, cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        uint32_t filler = 0x01010101u * (uint32_t)(it & 0xff);
        int right = 1;
        for (size_t i = 0; i < n; i++) {
            uint32_t want = i < n - tail ? pattern(it, i) * 2654435761u + (uint32_t)it : filler;
            if (back[i] != want) right = 0;
            checksum = (checksum ^ back[i]) * 1099511628211ull;
        }
        if (!right) {
            wrong++;
            printf("iteration %d: wrong words\n", it);
        }
        if ((it + 1) % 50 == 0) printf("after %d iterations: checksum %016llx\n", it + 1, (unsigned long long)checksum);
    }
    printf("iterations: %d, wrong: %d\n", iterations, wrong);
    EXPECT(wrong == 0, "%d iteration(s) wrong", wrong);
    CHECK(cudaFreeHost(back));
    CHECK_EACH(cudaFree, in, out, copy);
    CHECK(cudaStreamDestroy(stream));
    free(source);
    return test_finish();
}

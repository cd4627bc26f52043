// Batch copies (cudaMemcpyBatchAsync, CUDA 12.8+): 8 slices of a pageable buffer up in one call
// (the first half read in stream order, the second during the call, whose sources are then
// overwritten at once), a kernel doubling every word, the 8 slices down in one call (device-to-host
// and a device-to-device copy in the same batch), checked word by word; then the errors CUDA
// documents: no source access order, attributes not starting at copy 0, the legacy stream.
#include <vector>

#include "common.h"

static const size_t N = 1 << 20;  // words
static const int SLICES = 8;

static __global__ void twice(uint32_t *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] *= 2;
}

int main() {
    test_init("batch_copies");
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    uint32_t *dev = nullptr, *copy = nullptr;
    CHECK(cudaMalloc(&dev, N * 4));
    CHECK(cudaMalloc(&copy, N * 4));
    std::vector<uint32_t> up(N), down(N, 0);
    for (size_t i = 0; i < N; i++) up[i] = (uint32_t)i * 2654435761u;
    std::vector<uint32_t> expected(up);

    const size_t slice = N / SLICES;
    void *dsts[SLICES];
    const void *srcs[SLICES];
    size_t sizes[SLICES];
    for (int s = 0; s < SLICES; s++) {
        dsts[s] = dev + s * slice;
        srcs[s] = up.data() + s * slice;
        sizes[s] = slice * 4;
    }
    cudaMemcpyAttributes attrs[2] = {};
    attrs[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs[1].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    size_t starts[2] = {0, SLICES / 2};
    CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, SLICES, attrs, starts, 2, stream));
    // Sources read during the call may change now.
    for (size_t i = N / 2; i < N; i++) up[i] = 0xdeadbeef;
    twice<<<256, 256, 0, stream>>>(dev, N);
    CHECK(cudaGetLastError());

    // Down: slices 0..6 to the host, slice 7 to another device buffer (then down by itself).
    void *back_dsts[SLICES];
    const void *back_srcs[SLICES];
    for (int s = 0; s < SLICES; s++) {
        back_dsts[s] = s == SLICES - 1 ? (void *)copy : (void *)(down.data() + s * slice);
        back_srcs[s] = dev + s * slice;
    }
    CHECK(cudaMemcpyBatchAsync(back_dsts, back_srcs, sizes, SLICES, attrs, starts, 1, stream));
    CHECK(cudaMemcpyAsync(down.data() + (SLICES - 1) * slice, copy, slice * 4, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    size_t wrong = 0;
    for (size_t i = 0; i < N; i++) wrong += down[i] != expected[i] * 2;
    printf("batch up, kernel, batch down: %zu wrong words of %zu\n", wrong, N);

    cudaMemcpyAttributes none[1] = {};
    size_t late[1] = {1};
    printf("no source access order: %s\n", cudaGetErrorName(cudaMemcpyBatchAsync(dsts, srcs, sizes, SLICES, none, starts, 1, stream)));
    printf("attributes from copy 1: %s\n", cudaGetErrorName(cudaMemcpyBatchAsync(dsts, srcs, sizes, SLICES, attrs, late, 1, stream)));
    printf("the legacy stream: %s\n", cudaGetErrorName(cudaMemcpyBatchAsync(dsts, srcs, sizes, SLICES, attrs, starts, 1, cudaStreamLegacy)));
    cudaGetLastError();
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaFree(dev));
    CHECK(cudaFree(copy));
    CHECK(cudaStreamDestroy(stream));
    printf("batch_copies: %s\n", wrong == 0 ? "PASS" : "FAIL");
    return wrong == 0 ? 0 : 1;
}

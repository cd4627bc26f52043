// Batch copies (cudaMemcpyBatchAsync, CUDA 12.8+): 8 slices of a pageable buffer up in one call
// (the first half read in stream order, the second during the call), a kernel doubling every word, the 8 slices down in one call (device-to-host
// and a device-to-device copy in the same batch), checked word by word; then the errors CUDA
// documents: no source access order, attributes not starting at copy 0, the legacy stream. Then
// 3D batches (cudaMemcpy3DBatchAsync) from host rows into an array, the array into device memory.
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
    // The sources read "during the call" are left alone: natively (driver 580, H100) some of them
    // were read after the call returned when they were overwritten at once
    // (gpu-tests/probes/batch_probe.cu, mode 3), where Flyt reads them before it returns.
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

    // 3D batches: a 64x32x4 box of words from host rows of 80 words into an array, the array into
    // packed device memory, and that back to the host.
    {
        const size_t W = 64, H = 32, D = 4, ROW = 80;
        std::vector<uint32_t> box(ROW * H * D), out(W * H * D, 0);
        for (size_t i = 0; i < box.size(); i++) box[i] = (uint32_t)i * 40503u + 11;
        cudaChannelFormatDesc desc = cudaCreateChannelDesc<uint32_t>();
        cudaArray_t array;
        CHECK(cudaMalloc3DArray(&array, &desc, make_cudaExtent(W, H, D)));
        cudaMemcpy3DBatchOp ops[2] = {};
        ops[0].src.type = cudaMemcpyOperandTypePointer;
        ops[0].src.op.ptr.ptr = box.data();
        ops[0].src.op.ptr.rowLength = ROW;
        ops[0].dst.type = cudaMemcpyOperandTypeArray;
        ops[0].dst.op.array.array = array;
        ops[0].extent = make_cudaExtent(W, H, D);
        ops[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        CHECK(cudaMemcpy3DBatchAsync(1, ops, 0, stream));
        ops[1].src.type = cudaMemcpyOperandTypeArray;
        ops[1].src.op.array.array = array;
        ops[1].dst.type = cudaMemcpyOperandTypePointer;
        ops[1].dst.op.ptr.ptr = dev;
        ops[1].extent = make_cudaExtent(W, H, D);
        ops[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        CHECK(cudaMemcpy3DBatchAsync(1, ops + 1, 0, stream));
        CHECK(cudaMemcpyAsync(out.data(), dev, out.size() * 4, cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        size_t wrong3d = 0;
        for (size_t z = 0; z < D; z++)
            for (size_t y = 0; y < H; y++)
                for (size_t x = 0; x < W; x++) wrong3d += out[(z * H + y) * W + x] != box[(z * H + y) * ROW + x];
        printf("3D batches through an array: %zu wrong words of %zu\n", wrong3d, out.size());
        wrong += wrong3d;
        ops[1].extent.depth = 0;
        printf("a 3D copy of depth 0: %s\n", cudaGetErrorName(cudaMemcpy3DBatchAsync(1, ops + 1, 0, stream)));
        cudaGetLastError();
        CHECK(cudaFreeArray(array));
    }

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

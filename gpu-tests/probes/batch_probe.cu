// Probe (not a gpu-tests program): how the driver's batch copies treat pageable sources.
//   nvcc -o batch_probe gpu-tests/probes/batch_probe.cu && ./batch_probe MODE
// MODE bits: 1 the second half of the up batch is read DURING_API_CALL; 2 those sources are
// overwritten right after the call; 4 plain copy up instead of a batch; 8 no kernel; 16 plain
// copy down instead of a batch. On an H100 with driver 580.159.04 (2026-11-24) modes 3 and 19
// found 50-70k wrong words in the overwritten half: the driver read some "during the call"
// sources after the call returned.
#include <cstdio>
#include <vector>
#include <cstdint>
#include <cuda_runtime.h>
static __global__ void twice(uint32_t *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] *= 2;
}
int main(int argc, char **argv) {
    int mode = atoi(argv[1]);
    const size_t N = 1 << 20; const int S = 8; const size_t slice = N / S;
    cudaStream_t stream; cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    uint32_t *dev; cudaMalloc(&dev, N * 4);
    std::vector<uint32_t> up(N), down(N, 0), expected(N);
    for (size_t i = 0; i < N; i++) up[i] = expected[i] = (uint32_t)i * 2654435761u;
    void *dsts[S]; const void *srcs[S]; size_t sizes[S];
    for (int s = 0; s < S; s++) { dsts[s] = dev + s * slice; srcs[s] = up.data() + s * slice; sizes[s] = slice * 4; }
    cudaMemcpyAttributes attrs[2] = {};
    attrs[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs[1].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    size_t starts[2] = {0, S / 2};
    int nattrs = (mode & 1) ? 2 : 1;
    if (mode & 4) cudaMemcpyAsync(dev, up.data(), N * 4, cudaMemcpyHostToDevice, stream);
    else printf("up: %s\n", cudaGetErrorName(cudaMemcpyBatchAsync(dsts, srcs, sizes, S, attrs, starts, nattrs, stream)));
    if (mode & 2) for (size_t i = N / 2; i < N; i++) up[i] = 0xdeadbeef;
    if (!(mode & 8)) twice<<<256, 256, 0, stream>>>(dev, N);
    void *bd[S]; const void *bs[S];
    for (int s = 0; s < S; s++) { bd[s] = down.data() + s * slice; bs[s] = dev + s * slice; }
    if (mode & 16) cudaMemcpyAsync(down.data(), dev, N * 4, cudaMemcpyDeviceToHost, stream);
    else printf("down: %s\n", cudaGetErrorName(cudaMemcpyBatchAsync(bd, bs, sizes, S, attrs, starts, 1, stream)));
    cudaStreamSynchronize(stream);
    size_t wrong = 0, first = N;
    int k = (mode & 8) ? 1 : 2;
    for (size_t i = 0; i < N; i++) if (down[i] != expected[i] * k) { wrong++; if (first == N) first = i; }
    printf("mode %d: %zu wrong, first at %zu (slice %zu)\n", mode, wrong, first, first / slice);
}

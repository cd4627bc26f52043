// mapped_memory: kernels that read and write host memory in place (zero-copy), as cuDNN and
// PyTorch's pinned-memory paths do.
// Covers: cudaHostAlloc with cudaHostAllocMapped, cudaHostGetDevicePointer, cudaHostGetFlags,
// cudaPointerGetAttributes on mapped memory, kernels dereferencing the host pointer itself (unified
// addressing) and cudaMallocHost memory used the same way, cudaMemsetAsync/cudaMemcpyAsync on mapped
// memory, host writes seen by a later kernel, kernel writes seen by the host after a sync.
//
// Through Flyt the cudaMallocHost part needs the shared-memory channel (the GPU server on the
// app's host): over a socket alone mapped memory is mirrored device memory, but cudaMallocHost
// memory is not device-accessible, and the memset into it fails loudly, which gpu-tests/run.sh
// expects.
#include "common.h"

__global__ void write_squares(unsigned *out, unsigned n, unsigned salt) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * i + salt;
}

__global__ void sum_into(const unsigned *in, unsigned n, unsigned long long *total) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(total, (unsigned long long)in[i]);
}

static int check_squares(const char *what, const unsigned *p, unsigned n, unsigned salt) {
    for (unsigned i = 0; i < n; i++) {
        if (p[i] != i * i + salt) {
            printf("FAIL: %s: element %u is %u, expected %u\n", what, i, p[i], i * i + salt);
            return 1;
        }
    }
    printf("%s: %u elements as the kernel wrote them\n", what, n);
    return 0;
}

int main() {
    test_init("mapped_memory");
    const unsigned N = 1 << 20;
    const size_t bytes = N * sizeof(unsigned);
    CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));

    unsigned *mapped = nullptr, *device_view = nullptr;
    CHECK(cudaHostAlloc((void **)&mapped, bytes, cudaHostAllocMapped));
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, mapped));
    printf("flags include cudaHostAllocMapped: %s\n", (flags & cudaHostAllocMapped) ? "yes" : "no");
    CHECK(cudaHostGetDevicePointer((void **)&device_view, mapped, 0));
    printf("device pointer equals the host pointer (unified addressing): %s\n", device_view == mapped ? "yes" : "no");
    cudaPointerAttributes attributes;
    CHECK(cudaPointerGetAttributes(&attributes, mapped + 7));
    printf("attributes: type host %s, device pointer %s\n", attributes.type == cudaMemoryTypeHost ? "yes" : "no",
           attributes.devicePointer == (void *)(device_view + 7) ? "matches" : "differs");

    // The kernel writes the host's pages; the host reads them after a sync, no copy.
    write_squares<<<(N + 255) / 256, 256>>>(device_view, N, 3);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    g_failures += check_squares("kernel into mapped memory", mapped, N, 3);

    // The host writes; a kernel reads the host pointer itself.
    for (unsigned i = 0; i < N; i++) mapped[i] = i % 1000;
    unsigned long long *total = nullptr, host_total = 0;
    CHECK(cudaMalloc(&total, sizeof *total));
    CHECK(cudaMemset(total, 0, sizeof *total));
    sum_into<<<(N + 255) / 256, 256>>>(mapped, N, total);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&host_total, total, sizeof host_total, cudaMemcpyDeviceToHost));
    unsigned long long expected = 0;
    for (unsigned i = 0; i < N; i++) expected += i % 1000;
    printf("kernel sum of host-written mapped memory: %llu (%s)\n", host_total, host_total == expected ? "right" : "WRONG");
    if (host_total != expected) g_failures++;

    // cudaMallocHost memory is mapped too under unified addressing, on a stream, after copies.
    unsigned *pinned = nullptr;
    CHECK(cudaMallocHost((void **)&pinned, bytes));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMemsetAsync(pinned, 0, bytes, stream));
    write_squares<<<(N + 255) / 256, 256, 0, stream>>>(pinned, N, 11);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(mapped, pinned, bytes, cudaMemcpyDefault, stream));
    CHECK(cudaStreamSynchronize(stream));
    g_failures += check_squares("kernel into cudaMallocHost memory", pinned, N, 11);
    g_failures += check_squares("copied from pinned into mapped memory", mapped, N, 11);

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(total));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFreeHost(mapped));
    return test_finish();
}

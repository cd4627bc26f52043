// mapped_malloc: the process's own malloc'd memory registered for the device
// (cudaHostRegister with cudaHostRegisterMapped), as CUDA samples and zero-copy code do: a kernel
// writes through the device pointer and the host reads it in place, the host writes and a kernel
// reads it, at an unaligned start, then cudaHostUnregister and the memory still the app's.
// Through Flyt this needs the shared-memory channel (the pages become a shared mapping the server
// maps at the same address); over a socket alone the registration fails loudly (run.sh expects it).
#include "common.h"

__global__ void write_squares(unsigned *p, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = i * i + 1;
}

__global__ void sum(const unsigned *p, unsigned n, unsigned long long *total) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(total, (unsigned long long)p[i]);
}

int main() {
    test_init("mapped_malloc");
    const unsigned n = (1 << 20) + 37;
    unsigned char *raw = (unsigned char *)malloc(n * sizeof(unsigned) + 256);
    unsigned *host = (unsigned *)(raw + 20);
    for (unsigned i = 0; i < n; i++) host[i] = 5;
    CHECK(cudaHostRegister(host, n * sizeof(unsigned), cudaHostRegisterMapped));
    unsigned *device = NULL;
    CHECK(cudaHostGetDevicePointer((void **)&device, host, 0));
    printf("device pointer is the host pointer: %s\n", device == host ? "yes" : "no");
    write_squares<<<(n + 255) / 256, 256>>>(device, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    bool right = true;
    for (unsigned i = 0; i < n; i++) right &= host[i] == i * i + 1;
    EXPECT(right, "the kernel's writes seen by the host in place");
    printf("kernel writes seen in place: %s\n", right ? "yes" : "no");
    unsigned long long expected = 0;
    for (unsigned i = 0; i < n; i++) {
        host[i] = i % 1000;
        expected += i % 1000;
    }
    unsigned long long *total;
    CHECK(cudaMalloc(&total, sizeof *total));
    CHECK(cudaMemset(total, 0, sizeof *total));
    sum<<<(n + 255) / 256, 256>>>(device, n, total);
    CHECK_LAUNCH();
    unsigned long long got = 0;
    CHECK(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got == expected, "the host's writes read by a kernel: %llu, expected %llu", got, expected);
    printf("host writes read by a kernel: %s\n", got == expected ? "yes" : "no");
    CHECK(cudaHostUnregister(host));
    printf("still the app's memory after unregistering: %s\n", host[999] == 999 ? "yes" : "no");
    CHECK(cudaFree(total));
    free(raw);
    return test_finish();
}

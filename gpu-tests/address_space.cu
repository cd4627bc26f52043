// One address space for host and device memory (unified addressing): host memory cannot be
// mapped at a device allocation's address, so a pointer is either host or device memory and a
// cudaMemcpyDefault copy can tell which. Natively the driver reserves device addresses in the
// process; through Flyt the device's addresses are the server's, and Flyt reserves them in the app
// (without it, a host buffer could land on a device address and be copied as device memory).
// Checks cudaMalloc'ed and cudaMallocAsync'ed memory, then a host-to-device cudaMemcpyDefault copy.
#include <sys/mman.h>

#include <vector>

#include "common.h"

static const char *try_map(void *at) {
    void *got = mmap(at, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (got == MAP_FAILED) return "refused";
    munmap(got, 4096);
    return got == at ? "MAPPED" : "placed elsewhere";
}

int main() {
    test_init("address_space");
    void *plain = nullptr, *pooled = nullptr;
    CHECK(cudaMalloc(&plain, 64 << 20));
    printf("host memory at a cudaMalloc allocation's address: %s\n", try_map((char *)plain + (32 << 20)));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMallocAsync(&pooled, 8 << 20, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("host memory at a cudaMallocAsync allocation's address: %s\n", try_map(pooled));
    std::vector<unsigned char> host(1 << 20, 7), back(1 << 20, 0);
    CHECK(cudaMemcpy(plain, host.data(), host.size(), cudaMemcpyDefault));
    CHECK(cudaMemcpy(back.data(), plain, back.size(), cudaMemcpyDefault));
    printf("cudaMemcpyDefault round trip: %s\n", back == host ? "equal" : "DIFFERENT");
    CHECK(cudaFreeAsync(pooled, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaFree(plain));
    CHECK(cudaStreamDestroy(stream));
    printf("address_space: PASS\n");
    return 0;
}

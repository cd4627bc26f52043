// CUDA virtual memory management through the driver API (cuMem*), as PyTorch's expandable segments
// use it: granularity (minimum and recommended), a reserved address range of 4 granules, two
// physical allocations of 2 granules mapped back to back into it, access set and read back, one
// kernel writing over both allocations through one pointer, runtime copies and a memset straddling
// the seam, cuMemRetainAllocationHandle and cuMemGetAllocationPropertiesFromHandle, a copy from an
// unmapped half (must fail; the error name is printed), the same handle mapped again at the same
// place (its contents kept), one cuMemUnmap over both mappings, releases, cuMemAddressFree, and a
// reservation at a fixed address hint. Built with -lcuda.
#include <vector>

#include "driver_check.h"

static __host__ __device__ uint32_t word(size_t i, uint32_t seed) { return (uint32_t)i * 2654435761u + seed; }

static __global__ void fill(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = word(i, seed);
}

// Index of the first word of host[from, to) that is not word(i, seed), or `to` when all are.
static size_t first_bad(const std::vector<uint32_t> &host, size_t from, size_t to, uint32_t seed) {
    for (size_t i = from; i < to; i++)
        if (host[i] != word(i, seed)) return i;
    return to;
}

// Whether every word of host[from, to) is 0x5A5A5A5A (what the memset below writes).
static bool all_5a(const std::vector<uint32_t> &host, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (host[i] != 0x5A5A5A5Au) return false;
    return true;
}

int main() {
    CUdevice dev = start_on_primary_context("vmm");

    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0, rec = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK_CU(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("granularity minimum: %zu, recommended: %zu\n", gran, rec);
    EXPECT(gran > 0 && rec >= gran && rec % gran == 0, "granularities %zu, %zu", gran, rec);

    // 4 granules reserved, two allocations of 2 granules mapped back to back.
    const size_t half = 2 * gran, total = 4 * gran;
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, total, 0, 0, 0));
    printf("reserved: %s, aligned to the granularity: %s\n", base ? "yes" : "no", base % gran == 0 ? "yes" : "no");
    CUmemGenericAllocationHandle h[2];
    CHECK_CU(cuMemCreate(&h[0], half, &prop, 0));
    CHECK_CU(cuMemCreate(&h[1], half, &prop, 0));
    CHECK_CU(cuMemMap(base, half, 0, h[0], 0));
    CHECK_CU(cuMemMap(base + half, half, 0, h[1], 0));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(cuMemSetAccess(base, total, &access, 1));
    unsigned long long flags = 0;
    CHECK_CU(cuMemGetAccess(&flags, &prop.location, base + half + 4096));
    printf("access: %s\n", flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "read/write" : "not read/write");
    EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "cuMemGetAccess flags %llu", flags);

    // One kernel over both allocations through one pointer; copied back with the runtime.
    const size_t n = total / 4, n_half = half / 4;
    uint32_t *p = (uint32_t *)(uintptr_t)base;
    std::vector<uint32_t> host(n);
    fill<<<256, 256>>>(p, n, 7);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(host.data(), p, total, cudaMemcpyDeviceToHost));
    size_t bad = first_bad(host, 0, n, 7);
    printf("kernel pattern over both allocations: %s\n", bad == n ? "correct" : "WRONG");
    EXPECT(bad == n, "word %zu wrong after the kernel", bad);

    // A memset straddling the seam: granules 1 and 2 become 0x5A bytes, granules 0 and 3 keep the pattern.
    CHECK(cudaMemset((char *)p + gran, 0x5A, half));
    CHECK(cudaMemcpy(host.data(), p, total, cudaMemcpyDeviceToHost));
    const size_t g = gran / 4;
    bool set = all_5a(host, g, 3 * g);
    bool kept = first_bad(host, 0, g, 7) == g && first_bad(host, 3 * g, n, 7) == n;
    printf("memset across the seam: %s, around it untouched: %s\n", set ? "correct" : "WRONG", kept ? "yes" : "no");
    EXPECT(set && kept, "memset across the seam");

    // The handle behind an address inside the second allocation, and its properties.
    CUmemGenericAllocationHandle retained = 0;
    CHECK_CU(cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)(base + half + 12345)));
    printf("retained handle is the second allocation's: %s\n", retained == h[1] ? "yes" : "no");
    EXPECT(retained == h[1], "cuMemRetainAllocationHandle gave another handle");
    CHECK_CU(cuMemRelease(retained));
    CUmemAllocationProp got = {};
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&got, h[1]));
    printf("properties: type %d, location type %d, location id %d\n", (int)got.type, (int)got.location.type,
           got.location.id);
    EXPECT(got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
               got.location.id == dev,
           "allocation properties");

    // Second half unmapped: copies from it fail, the first half still reads.
    CHECK_CU(cuMemUnmap(base + half, half));
    report("copy from the unmapped half", cudaMemcpy(host.data(), p + n_half, 4096, cudaMemcpyDeviceToHost));
    cudaGetLastError();  // that failure is not sticky; clear the thread's last error
    CHECK(cudaMemcpy(host.data(), p, half, cudaMemcpyDeviceToHost));
    kept = first_bad(host, 0, g, 7) == g && all_5a(host, g, n_half);
    printf("first half after unmapping the second: %s\n", kept ? "intact" : "WRONG");
    EXPECT(kept, "first half changed by unmapping the second");

    // The same handle mapped at the same place again: access set anew, contents kept.
    CHECK_CU(cuMemMap(base + half, half, 0, h[1], 0));
    CHECK_CU(cuMemSetAccess(base + half, half, &access, 1));
    CHECK(cudaMemcpy(host.data() + n_half, p + n_half, half, cudaMemcpyDeviceToHost));
    kept = all_5a(host, n_half, 3 * g) && first_bad(host, 3 * g, n, 7) == n;
    printf("second allocation after remapping: %s\n", kept ? "contents kept" : "WRONG");
    EXPECT(kept, "contents lost across unmap/remap");
    fill<<<256, 256>>>(p, n, 99);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(host.data(), p, total, cudaMemcpyDeviceToHost));
    printf("kernel over the remapped range: %s\n", first_bad(host, 0, n, 99) == n ? "correct" : "WRONG");
    EXPECT(first_bad(host, 0, n, 99) == n, "kernel over the remapped range");

    // One unmap over both mappings, then the handles and the range go.
    CHECK_CU(cuMemUnmap(base, total));
    CHECK_CU(cuMemRelease(h[0]));
    CHECK_CU(cuMemRelease(h[1]));
    CHECK_CU(cuMemAddressFree(base, total));
    printf("unmapped, released, freed\n");

    // A reservation at a fixed address hint: the range just freed.
    CUdeviceptr again = 0;
    CHECK_CU(cuMemAddressReserve(&again, total, 0, base, 0));
    printf("reserve at the freed base: hint honoured: %s\n", again == base ? "yes" : "no");
    CHECK_CU(cuMemAddressFree(again, total));
    CHECK(cudaDeviceSynchronize());
    return test_finish();
}

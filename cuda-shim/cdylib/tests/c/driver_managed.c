// Managed memory through Flyt's libcuda.so.1 on the emulated device (no kernels), on every
// transport: with the shared-memory channel it is shared pages, over a socket alone or TCP a mirror
// of device memory. Either way cuMemAllocManaged memory is used at one address by the host and by
// copies, memsets and stream memory operations, coherent at synchronizations; prefetches and advice
// are checked and read back, pointer queries call it managed; odd sizes, many allocations and a
// large one work; bad frees and ranges are refused.
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

static CUmemLocation device0(void) {
    CUmemLocation l = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    return l;
}

static CUmemLocation host(void) {
    CUmemLocation l = {CU_MEM_LOCATION_TYPE_HOST, 0};
    return l;
}

int main(void) {
    use_primary_context(NULL);
    int managed_attribute = -1, concurrent = -1;
    EXPECT(cuDeviceGetAttribute(&managed_attribute, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0), CUDA_SUCCESS);
    const size_t N = 3 << 20;  // crosses the copy chunk and a shared-memory slot
    CUdeviceptr m = 0;
    // Concurrent access only with the channel (the test checks which): a mirror is coherent at
    // synchronizations only.
    printf("concurrent managed access: %d\n", concurrent);
    EXPECT(cuMemAllocManaged(&m, N, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    CHECK("device reports managed memory", managed_attribute == 1);
    EXPECT(cuMemAllocManaged(&m, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocManaged(&m, 64, 8), CUDA_ERROR_INVALID_VALUE);

    // The host writes it in place; a device copy reads it; a memset writes it; the host sees it.
    unsigned char *p = (unsigned char *)(uintptr_t)m;
    for (size_t i = 0; i < N; i++) p[i] = (unsigned char)(i * 13 + 1);
    CUdeviceptr d = 0;
    EXPECT(cuMemAlloc(&d, N), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoD(d, p, N), CUDA_SUCCESS);  // managed memory as the host side
    EXPECT(cuMemsetD8(m, 0x5a, N), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    int all_set = 1;
    for (size_t i = 0; i < N; i++) all_set &= p[i] == 0x5a;
    CHECK("memset seen by the host", all_set);
    EXPECT(cuMemcpyDtoD(m, d, N), CUDA_SUCCESS);  // managed memory as a device side
    int same = 1;
    for (size_t i = 0; i < N; i++) same &= p[i] == (unsigned char)(i * 13 + 1);
    CHECK("device-to-device copy into managed memory", same);
    EXPECT(cuMemsetD8(d, 0, N), CUDA_SUCCESS);
    EXPECT(cuMemcpy(d, m, N), CUDA_SUCCESS);
    unsigned char *back = malloc(N);
    EXPECT(cuMemcpyDtoH(back, d, N), CUDA_SUCCESS);
    CHECK("unified copy from managed memory", memcmp(back, p, N) == 0);

    // Pointer queries.
    unsigned is_managed = 0, type = 0;
    CUdeviceptr start = 0, device_pointer = 0;
    size_t size = 0;
    EXPECT(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 100), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m + 100), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&device_pointer, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, m + 100), CUDA_SUCCESS);
    EXPECT(cuMemGetAddressRange(&start, &size, m + 100), CUDA_SUCCESS);
    CHECK("pointer is managed, device memory type, same device pointer", is_managed == 1 && type == CU_MEMORYTYPE_DEVICE && device_pointer == m + 100);
    CHECK("address range is the allocation", start == m && size == N);
    int ordinal = -1;
    EXPECT(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, m + 100), CUDA_SUCCESS);
    CHECK("managed memory's device ordinal is 0", ordinal == 0);
    CUpointer_attribute batch_names[2] = {CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
    unsigned batch_managed = 0, batch_type = 0;
    void *batch_values[2] = {&batch_managed, &batch_type};
    EXPECT(cuPointerGetAttributes(2, batch_names, batch_values, m + N - 1), CUDA_SUCCESS);
    CHECK("pointer attributes in a batch: managed, device type", batch_managed == 1 && batch_type == CU_MEMORYTYPE_DEVICE);
    EXPECT(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, d), CUDA_SUCCESS);
    CHECK("device memory is not managed", is_managed == 0);

    // Prefetches and advice, read back.
    CUstream s;
    EXPECT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    // Device writes on a stream, a prefetch to the CPU in stream order: the host sees the device's
    // bytes once the stream synchronized. A host write meanwhile to other bytes survives.
    EXPECT(cuMemsetD32Async(m, 0x01020304u, N / 8, s), CUDA_SUCCESS);
    EXPECT(cuMemPrefetchAsync(m, N, host(), 0, s), CUDA_SUCCESS);
    EXPECT(cuStreamWriteValue32(s, m + N - 64, 0xfeedbeefu, 0), CUDA_SUCCESS);
    p[N / 2 + 1] = 0x77;
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    int words = 1;
    for (size_t i = 0; i < N / 8; i++) words &= ((unsigned *)p)[i] == 0x01020304u;
    CHECK("prefetch to the CPU: device writes seen after the stream synchronized", words && p[N / 2] == (unsigned char)((N / 2) * 13 + 1) && p[N / 2 + 1] == 0x77);
    CHECK("stream memory operation on managed memory seen by the host", *(unsigned *)(p + N - 64) == 0xfeedbeefu);
    // A host write, then a prefetch to the device and a device copy read it.
    p[N / 2 + 3] = 0xa5;
    EXPECT(cuMemPrefetchAsync(m, N, device0(), 0, s), CUDA_SUCCESS);
    unsigned char seen[8] = {0};
    EXPECT(cuMemcpyDtoHAsync(seen, m + N / 2, sizeof seen, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK("a copy out of managed memory reads the host's last write", seen[3] == 0xa5 && seen[1] == 0x77 && seen[0] == (unsigned char)((N / 2) * 13 + 1));
    EXPECT(cuMemPrefetchAsync(m, N, device0(), 0, s), CUDA_SUCCESS);
    int location = 7;
    EXPECT(cuMemRangeGetAttribute(&location, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, N), CUDA_SUCCESS);
    CHECK("last prefetch location is device 0", location == 0);
    EXPECT(cuMemPrefetchAsync(m, N / 2, host(), 0, s), CUDA_SUCCESS);
    EXPECT(cuMemRangeGetAttribute(&location, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, N / 4), CUDA_SUCCESS);
    CHECK("first quarter last prefetched to the host", location == CU_DEVICE_CPU);
    EXPECT(cuMemRangeGetAttribute(&location, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, N), CUDA_SUCCESS);
    CHECK("whole range has no common prefetch location", location == CU_DEVICE_INVALID);
    EXPECT(cuMemAdvise(m, N, CU_MEM_ADVISE_SET_READ_MOSTLY, device0()), CUDA_SUCCESS);
    EXPECT(cuMemAdvise(m + 4096, 4096, CU_MEM_ADVISE_UNSET_READ_MOSTLY, device0()), CUDA_SUCCESS);
    EXPECT(cuMemAdvise(m, N, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device0()), CUDA_SUCCESS);
    EXPECT(cuMemAdvise(m, N, CU_MEM_ADVISE_SET_ACCESSED_BY, device0()), CUDA_SUCCESS);
    EXPECT(cuMemAdvise(m, N, CU_MEM_ADVISE_SET_ACCESSED_BY, host()), CUDA_SUCCESS);
    int read_mostly = 7, preferred = 7, accessed[3] = {7, 7, 7}, preferred_type = 7;
    EXPECT(cuMemRangeGetAttribute(&read_mostly, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 4096), CUDA_SUCCESS);
    CHECK("first page read mostly", read_mostly == 1);
    EXPECT(cuMemRangeGetAttribute(&read_mostly, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, N), CUDA_SUCCESS);
    CHECK("whole range not read mostly (one page unset)", read_mostly == 0);
    EXPECT(cuMemRangeGetAttribute(&preferred, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, N), CUDA_SUCCESS);
    EXPECT(cuMemRangeGetAttribute(&preferred_type, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, m, N), CUDA_SUCCESS);
    CHECK("preferred location device 0", preferred == 0 && preferred_type == CU_MEM_LOCATION_TYPE_DEVICE);
    EXPECT(cuMemRangeGetAttribute(accessed, sizeof accessed, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, m, N), CUDA_SUCCESS);
    CHECK("accessed by device 0 and the host", accessed[0] == 0 && accessed[1] == CU_DEVICE_CPU && accessed[2] == CU_DEVICE_INVALID);
    EXPECT(cuMemRangeGetAttribute(&preferred, 3, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, N), CUDA_ERROR_INVALID_VALUE);

    // Attach to a stream: the whole allocation only.
    EXPECT(cuStreamAttachMemAsync(s, m, 0, CU_MEM_ATTACH_SINGLE), CUDA_SUCCESS);
    EXPECT(cuStreamAttachMemAsync(s, m, N, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuStreamAttachMemAsync(s, m + 64, 0, CU_MEM_ATTACH_SINGLE), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamAttachMemAsync(NULL, m, 0, CU_MEM_ATTACH_SINGLE), CUDA_ERROR_INVALID_VALUE);

    // A batch prefetch, and a discard.
    CUdeviceptr ptrs[2] = {m, m + N / 2};
    size_t sizes[2] = {N / 2, N / 2};
    CUmemLocation locations[2] = {host(), device0()};
    size_t starts[2] = {0, 1};
    EXPECT(cuMemPrefetchBatchAsync(ptrs, sizes, 2, locations, starts, 2, 0, s), CUDA_SUCCESS);
    EXPECT(cuMemRangeGetAttribute(&location, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m + N / 2, N / 2), CUDA_SUCCESS);
    CHECK("batch prefetch: second half to device 0", location == 0);
    EXPECT(cuMemDiscardBatchAsync(ptrs, sizes, 2, 0, s), CUDA_SUCCESS);

    // Errors: device memory is not managed, a bad device, flags, a range past the end.
    EXPECT(cuMemPrefetchAsync(d, N, device0(), 0, s), CUDA_ERROR_INVALID_VALUE);
    CUmemLocation bad = {CU_MEM_LOCATION_TYPE_DEVICE, 9};
    EXPECT(cuMemPrefetchAsync(m, N, bad, 0, s), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuMemPrefetchAsync(m, N, device0(), 1, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAdvise(m, N + 1, CU_MEM_ADVISE_SET_READ_MOSTLY, device0()), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAdvise(m, N, (CUmem_advise)99, device0()), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemRangeGetAttribute(&location, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, d, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);  // managed memory is freed with cuMemFree
    EXPECT(cuMemPrefetchAsync(m + N - 16, 32, device0(), 0, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree(m + 16), CUDA_ERROR_INVALID_VALUE);  // not the allocation's start

    // A size no page multiple, attached to the host: host bytes kept, a memset across a page
    // boundary to the very end seen, copies in and out.
    const size_t S = 5000;
    CUdeviceptr small = 0;
    EXPECT(cuMemAllocManaged(&small, S, CU_MEM_ATTACH_HOST), CUDA_SUCCESS);
    unsigned char *q = (unsigned char *)(uintptr_t)small;
    for (size_t i = 0; i < S; i++) q[i] = (unsigned char)(i * 7);
    EXPECT(cuMemsetD8(small + 4000, 0xee, S - 4000), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    int odd = 1;
    for (size_t i = 0; i < S; i++) odd &= q[i] == (i >= 4000 ? 0xee : (unsigned char)(i * 7));
    CHECK("odd-sized allocation: host bytes kept, memset to its end seen", odd);
    unsigned char *staging = malloc(S);
    memset(staging, 0x33, S);
    EXPECT(cuMemcpyHtoD(small, staging, 100), CUDA_SUCCESS);
    int copied_in = q[99] == 0x33 && q[100] == (unsigned char)(100 * 7);
    q[4500] = 0x11;
    EXPECT(cuMemcpyDtoH(staging, small, S), CUDA_SUCCESS);
    CHECK("copies into and out of an odd-sized allocation", copied_in && staging[0] == 0x33 && staging[4500] == 0x11 && staging[4999] == 0xee);
    // 2D copies: into managed memory as a device side (rows of 100 at a pitch of 1000), then out
    // of it as a unified side after a host write.
    memset(staging, 0x44, S);
    CUDA_MEMCPY2D shaped = copy_2d(host_side(staging, 100, 0), device_side(small, 1000, 0), 100, 4);
    EXPECT(cuMemcpy2D(&shaped), CUDA_SUCCESS);
    int rows_in = q[0] == 0x44 && q[99] == 0x44 && q[100] == (unsigned char)(100 * 7) && q[3099] == 0x44 && q[3100] == (unsigned char)(3100 * 7);
    q[2050] = 0x99;
    shaped = copy_2d(unified_side(small + 2000, 1000), host_side(staging, 100, 0), 100, 2);
    EXPECT(cuMemcpy2D(&shaped), CUDA_SUCCESS);
    CHECK("2D copies into and out of managed memory", rows_in && staging[0] == 0x44 && staging[50] == 0x99 && staging[199] == 0x44);
    EXPECT(cuMemFree(small), CUDA_SUCCESS);
    free(staging);

    // Many allocations of odd sizes, each filled by the host, read through a device copy, freed.
    enum { MANY = 48 };
    CUdeviceptr many[MANY];
    int many_ok = 1;
    for (int k = 0; k < MANY; k++) {
        size_t bytes = 1000 + (size_t)k * 4099;
        EXPECT(cuMemAllocManaged(&many[k], bytes, k % 2 ? CU_MEM_ATTACH_HOST : CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
        memset((void *)(uintptr_t)many[k], k + 1, bytes);
    }
    for (int k = 0; k < MANY; k++) {
        size_t bytes = 1000 + (size_t)k * 4099;
        EXPECT(cuMemcpy(d, many[k], bytes), CUDA_SUCCESS);
        EXPECT(cuMemcpyDtoH(back, d, bytes), CUDA_SUCCESS);
        for (size_t i = 0; i < bytes; i++) many_ok &= back[i] == (unsigned char)(k + 1);
    }
    // Every other one freed, new ones made in their place: none overlaps one still live.
    for (int k = 1; k < MANY; k += 2) EXPECT(cuMemFree(many[k]), CUDA_SUCCESS);
    for (int k = 1; k < MANY; k += 2) {
        EXPECT(cuMemAllocManaged(&many[k], 3000, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
        memset((void *)(uintptr_t)many[k], 0xc0 + k, 3000);
    }
    for (int k = 0; k < MANY; k++) {
        size_t bytes = k % 2 ? 3000 : 1000 + (size_t)k * 4099;
        unsigned char want = k % 2 ? (unsigned char)(0xc0 + k) : (unsigned char)(k + 1);
        EXPECT(cuMemcpy(d, many[k], bytes), CUDA_SUCCESS);
        EXPECT(cuMemcpyDtoH(back, d, bytes), CUDA_SUCCESS);
        for (size_t i = 0; i < bytes; i++) many_ok &= back[i] == want;
    }
    for (int k = 0; k < MANY; k++) EXPECT(cuMemFree(many[k]), CUDA_SUCCESS);
    CHECK("48 allocations filled, read through the device and freed", many_ok);
    EXPECT(cuMemFree(many[0]), CUDA_ERROR_INVALID_VALUE);
    // A second free of one of two small allocations (which may share device memory), and
    // cuMemFree of mapped memory, are refused and harm neither.
    CUdeviceptr first = 0, second = 0;
    EXPECT(cuMemAllocManaged(&first, 100, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemAllocManaged(&second, 100, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemFree(first), CUDA_SUCCESS);
    EXPECT(cuMemFree(first), CUDA_ERROR_INVALID_VALUE);
    void *mapped = NULL;
    EXPECT(cuMemHostAlloc(&mapped, 4096, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    EXPECT(cuMemFree((CUdeviceptr)(uintptr_t)mapped), CUDA_ERROR_INVALID_VALUE);
    memset((void *)(uintptr_t)second, 0x3c, 100);
    memset(mapped, 0x4d, 4096);
    unsigned char kept = 0;
    EXPECT(cuMemcpyDtoH(&kept, second + 99, 1), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    CHECK("bad frees refused, the memory beside them kept", kept == 0x3c && ((unsigned char *)mapped)[4095] == 0x4d);
    EXPECT(cuMemFreeHost(mapped), CUDA_SUCCESS);
    EXPECT(cuMemFree(second), CUDA_SUCCESS);
    EXPECT(cuMemFree(second), CUDA_ERROR_INVALID_VALUE);

    // A large allocation (copied in pieces): the host fills it, a memset in its middle and a
    // copy out at its end see the latest bytes on both sides.
    const size_t L = 64 << 20;
    CUdeviceptr large = 0;
    EXPECT(cuMemAllocManaged(&large, L, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    unsigned *lw = (unsigned *)(uintptr_t)large;
    for (size_t i = 0; i < L / 4; i++) lw[i] = (unsigned)i;
    EXPECT(cuMemsetD32(large + L / 2, 7, 1024), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    int large_ok = 1;
    for (size_t i = 0; i < L / 4; i++) large_ok &= lw[i] == (i >= L / 8 && i < L / 8 + 1024 ? 7u : (unsigned)i);
    lw[L / 4 - 1] = 0xabcdef01u;
    unsigned last[4] = {0};
    EXPECT(cuMemcpyDtoH(last, large + L - sizeof last, sizeof last), CUDA_SUCCESS);
    CHECK("64 MiB allocation: host fill, memset and copy out agree", large_ok && last[3] == 0xabcdef01u && last[0] == (unsigned)(L / 4 - 4));
    EXPECT(cuMemFree(large), CUDA_SUCCESS);

    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    RELEASE(STREAM(s), MEMORY(m));
    EXPECT(cuMemFree(m), CUDA_ERROR_INVALID_VALUE);
    RELEASE(MEMORY(d));
    free(back);
    return finish();
}

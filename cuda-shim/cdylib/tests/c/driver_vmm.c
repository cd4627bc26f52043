// Virtual memory management through Flyt's libcuda.so.1 on the emulated device, as NCCL and
// PyTorch's expandable segments use it: granularity, a reserved range, two physical allocations
// mapped back to back, access, a copy across the seam, retained handles and their properties,
// contents kept across an unmap and a new map, and the refusals of what is not the app's own.
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

int main(void) {
    CUdevice device;
    use_primary_context(&device);

    size_t granularity = 0;
    CUmemAllocationProp prop = device_memory_prop(0, &granularity);
    printf("granularity a power of two: %s\n", granularity && !(granularity & (granularity - 1)) ? "yes" : "no");
    // Host memory: its granularity is answered (NCCL stops if the query fails), an allocation
    // of it refused (NCCL then takes its /dev/shm path).
    size_t host_granularity = 0;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    EXPECT(cuMemGetAllocationGranularity(&host_granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    printf("host granularity a power of two: %s\n", host_granularity && !(host_granularity & (host_granularity - 1)) ? "yes" : "no");
    CUmemGenericAllocationHandle host_memory;
    EXPECT(cuMemCreate(&host_memory, host_granularity, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;

    CUdeviceptr base = 0;
    size_t size = 4 * granularity, half = 2 * granularity;
    EXPECT(cuMemAddressReserve(&base, size, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle first = 0, second = 0, retained = 0;
    EXPECT(cuMemCreate(&first, half, &prop, 0), CUDA_SUCCESS);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    EXPECT(cuMemCreate(&second, half, &prop, 0), CUDA_SUCCESS);
    // FABRIC is made as the driver makes it where there is no fabric (XLA asks for it on every
    // GPU); only exporting such a handle is refused.
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    EXPECT(cuMemCreate(&retained, half, &prop, 0), CUDA_SUCCESS);
    CUmemFabricHandle fabric;
    EXPECT(cuMemExportToShareableHandle(&fabric, retained, CU_MEM_HANDLE_TYPE_FABRIC, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemRelease(retained), CUDA_SUCCESS);
    retained = 0;
    EXPECT(cuMemMap(base, half, 0, first, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(base + granularity, half, 0, second, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMap(base + half, half, 0, second, 0), CUDA_SUCCESS);
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT(cuMemSetAccess(base, size, &access, 1), CUDA_SUCCESS);
    unsigned long long flags = 0;
    EXPECT(cuMemGetAccess(&flags, &access.location, base + half + 1), CUDA_SUCCESS);
    printf("access read back: %s\n", flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "read-write" : "WRONG");

    // The emulated device keeps each mapping apart: the copies stay on one side of the seam.
    unsigned char *bytes = malloc(half), *back = malloc(half);
    for (size_t i = 0; i < half; i++) bytes[i] = (unsigned char)(i * 13 + 1);
    EXPECT(cuMemcpyHtoD(base + half, bytes, half), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(base, 0x77, half), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(back, base + half, half), CUDA_SUCCESS);
    printf("second allocation holds the copy: %s\n", memcmp(bytes, back, half) == 0 ? "yes" : "no");

    EXPECT(cuMemRetainAllocationHandle(&retained, (void *)(base + half + 5)), CUDA_SUCCESS);
    printf("retained handle is the second allocation: %s\n", retained == second ? "yes" : "no");
    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    EXPECT(cuMemGetAllocationPropertiesFromHandle(&got, retained), CUDA_SUCCESS);
    printf("properties: type %d, location %d/%d, handle types %d\n", (int)got.type, (int)got.location.type, got.location.id,
           (int)got.requestedHandleTypes);
    EXPECT(cuMemRelease(retained), CUDA_SUCCESS);

    EXPECT(cuMemUnmap(base + half, granularity), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAddressFree(base, size), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemUnmap(base + half, half), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(back, base + half, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMap(base + half, half, 0, second, 0), CUDA_SUCCESS);
    memset(back, 0, half);
    EXPECT(cuMemcpyDtoH(back, base + half, half), CUDA_SUCCESS);
    printf("kept across unmap and map: %s\n", memcmp(bytes, back, half) == 0 ? "yes" : "no");
    EXPECT(cuMemUnmap(base, size), CUDA_SUCCESS);
    EXPECT(cuMemRelease(first), CUDA_SUCCESS);
    EXPECT(cuMemRelease(second), CUDA_SUCCESS);
    EXPECT(cuMemRelease(second), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAddressFree(base, size), CUDA_SUCCESS);
    free(bytes);
    free(back);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

// What the driver answers on a thread with no current context (XLA's stream executor and NCCL ask
// device-level questions before or without making one current): each call's result name is
// printed, so a Flyt answer that differs from the driver's shows as a different line. Device
// queries, allocation granularity for every handle type, virtual address reservation, physical
// allocation, mapping and access (the VMM calls take a device, not a context), memory pools of
// the device, pointer attributes of memory made in a context, and the calls that do need one.
// Built with -lcuda.
#include "driver_check.h"

static const char *name_of(CUresult r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    return name;
}

#define SAY(what, call) printf("%-44s %s\n", what, name_of(call))

int main() {
    test_init("no_context");
    CHECK_CU(cuInit(0));
    CUcontext none = (CUcontext)1;
    CHECK_CU(cuCtxGetCurrent(&none));
    printf("current context at start is NULL: %s\n", none == NULL ? "yes" : "no");

    CUdevice dev;
    int value = 0;
    size_t bytes = 0;
    char name[256];
    SAY("cuDeviceGet", cuDeviceGet(&dev, 0));
    SAY("cuDeviceGetName", cuDeviceGetName(name, sizeof name, dev));
    SAY("cuDeviceGetAttribute", cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    SAY("cuDeviceTotalMem", cuDeviceTotalMem(&bytes, dev));
    CUuuid uuid;
    SAY("cuDeviceGetUuid", cuDeviceGetUuid(&uuid, dev));
    unsigned flags = 0;
    int active = 0;
    SAY("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("primary context active: %d\n", active);
    SAY("cuDeviceCanAccessPeer (itself)", cuDeviceCanAccessPeer(&value, dev, dev));

    // Granularity: every handle type XLA and NCCL ask for, minimum and recommended.
    const struct {
        const char *what;
        int types;
    } kinds[] = {
        {"none", CU_MEM_HANDLE_TYPE_NONE},
        {"posix fd", CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
        {"fabric", CU_MEM_HANDLE_TYPE_FABRIC},
        {"fabric + posix fd", CU_MEM_HANDLE_TYPE_FABRIC | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
    };
    for (const auto &kind : kinds) {
        CUmemAllocationProp prop = {};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        prop.requestedHandleTypes = (CUmemAllocationHandleType)kind.types;
        size_t minimum = 0, recommended = 0;
        char what[96];
        snprintf(what, sizeof what, "granularity, %s, minimum", kind.what);
        SAY(what, cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        snprintf(what, sizeof what, "granularity, %s, recommended", kind.what);
        SAY(what, cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    }

    // Reserve, create, map, set access, unmap, release: the VMM calls name a device.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granule = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle handle = 0;
    CUresult reserved = cuMemAddressReserve(&va, granule, 0, 0, 0);
    SAY("cuMemAddressReserve", reserved);
    CUresult created = cuMemCreate(&handle, granule, &prop, 0);
    SAY("cuMemCreate", created);
    if (reserved == CUDA_SUCCESS && created == CUDA_SUCCESS) {
        SAY("cuMemMap", cuMemMap(va, granule, 0, handle, 0));
        CUmemAccessDesc access = {};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        SAY("cuMemSetAccess", cuMemSetAccess(va, granule, &access, 1));
        unsigned long long got = 0;
        SAY("cuMemGetAccess", cuMemGetAccess(&got, &access.location, va));
        CUmemAllocationProp back = {};
        SAY("cuMemGetAllocationPropertiesFromHandle", cuMemGetAllocationPropertiesFromHandle(&back, handle));
        SAY("cuMemUnmap", cuMemUnmap(va, granule));
    }
    if (created == CUDA_SUCCESS) SAY("cuMemRelease", cuMemRelease(handle));
    if (reserved == CUDA_SUCCESS) SAY("cuMemAddressFree", cuMemAddressFree(va, granule));

    CUmemoryPool pool;
    SAY("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool(&pool, dev));
    SAY("cuDeviceGetMemPool", cuDeviceGetMemPool(&pool, dev));

    // Calls that need a context refuse without one.
    CUdeviceptr p = 0;
    size_t free_bytes = 0, total = 0;
    CUstream stream;
    CUevent event;
    SAY("cuMemAlloc", cuMemAlloc(&p, 4096));
    SAY("cuMemGetInfo", cuMemGetInfo(&free_bytes, &total));
    SAY("cuStreamCreate", cuStreamCreate(&stream, 0));
    SAY("cuEventCreate", cuEventCreate(&event, 0));
    SAY("cuCtxSynchronize", cuCtxSynchronize());
    CUdevice got_dev;
    SAY("cuCtxGetDevice", cuCtxGetDevice(&got_dev));

    // Memory made in a context answers pointer queries from a thread with none.
    CUcontext primary;
    CHECK_CU(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CU(cuMemAlloc(&p, 1 << 20));
    CHECK_CU(cuCtxSetCurrent(NULL));
    int ordinal = -1;
    SAY("cuPointerGetAttribute (device ordinal)", cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    printf("pointer's device ordinal: %d\n", ordinal);
    SAY("cuDevicePrimaryCtxGetState (retained)", cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("primary context active: %d\n", active);
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CU(cuMemFree(p));
    CHECK_CU(cuDevicePrimaryCtxRelease(dev));
    printf("no_context: PASS\n");
    return 0;
}

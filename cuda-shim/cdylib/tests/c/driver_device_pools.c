// Memory pools of each device (an emulated server with two GPUs, --gpu 0,1), through Flyt's
// libcuda.so.1: each device has its own default pool and its own current pool; a stream-ordered
// allocation on a stream of device 1 comes from device 1's current pool, which its pointer
// attributes name with the device; attributes, trimming and access act on the pool named; device
// 0 given access to device 1's pool; ordinals past the session's are refused.
#include <string.h>

#include "driver_expect.h"

enum { N = 1 << 20 };

static int pointer_device(CUdeviceptr ptr) {
    int ordinal = -1;
    EXPECT(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr), CUDA_SUCCESS);
    return ordinal;
}

static CUmemoryPool pointer_pool(CUdeviceptr ptr) {
    CUmemoryPool pool = NULL;
    EXPECT(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr), CUDA_SUCCESS);
    return pool;
}

int main(void) {
    int count = count_devices(0, 0);
    if (count < 2) {
        return finish();
    }
    CUdevice dev0, dev1, beyond;
    EXPECT(cuDeviceGet(&dev0, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev1, 1), CUDA_SUCCESS);
    CHECK("an ordinal past the session's refused", cuDeviceGet(&beyond, count) == CUDA_ERROR_INVALID_DEVICE);

    // Default pools: one per device, each its own.
    CUmemoryPool default0 = NULL, default1 = NULL, again = NULL, beyond_pool = NULL;
    EXPECT(cuDeviceGetDefaultMemPool(&default0, dev0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetDefaultMemPool(&default1, dev1), CUDA_SUCCESS);
    CHECK("a default pool per device, distinct", default0 != NULL && default1 != NULL && default0 != default1);
    EXPECT(cuDeviceGetDefaultMemPool(&again, dev1), CUDA_SUCCESS);
    CHECK("the same handle when asked again", again == default1);
    CHECK("no default pool past the session's devices", cuDeviceGetDefaultMemPool(&beyond_pool, count) == CUDA_ERROR_INVALID_DEVICE);
    CUmemLocation at1 = mem_location(CU_MEM_LOCATION_TYPE_DEVICE, 1);
    EXPECT(cuMemGetDefaultMemPool(&again, &at1, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_SUCCESS);
    CHECK("by location too", again == default1);
    EXPECT(cuDeviceGetMemPool(&again, dev1), CUDA_SUCCESS);
    CHECK("device 1's current pool is its default pool", again == default1);

    // Allocations on each device's stream come from that device's current pool.
    CUcontext ctx0, ctx1;
    EXPECT(cuDevicePrimaryCtxRetain(&ctx0, dev0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx1, dev1), CUDA_SUCCESS);
    CUstream stream0, stream1;
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuStreamCreate(&stream0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuStreamCreate(&stream1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr on1 = 0, on0 = 0;
    EXPECT(cuMemAllocAsync(&on1, N, stream1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemAllocAsync(&on0, N, stream0), CUDA_SUCCESS);
    CHECK("device 1's allocation names device 1 and its default pool", pointer_device(on1) == 1 && pointer_pool(on1) == default1);
    CHECK("device 0's allocation names device 0 and its default pool", pointer_device(on0) == 0 && pointer_pool(on0) == default0);
    unsigned char host[64];
    EXPECT(cuMemsetD8Async(on1, 0x71, N, stream1), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream1), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(host, on1 + N - sizeof host, sizeof host), CUDA_SUCCESS);
    CHECK("device 1's pool memory holds what was written", host[0] == 0x71 && host[sizeof host - 1] == 0x71);

    // Attributes and trimming act on the pool named.
    cuuint64_t threshold = 64 << 20, read = 0;
    EXPECT(cuMemPoolSetAttribute(default1, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);
    EXPECT(cuMemPoolGetAttribute(default1, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &read), CUDA_SUCCESS);
    CHECK("device 1's pool keeps its release threshold", read == threshold);
    EXPECT(cuMemPoolGetAttribute(default0, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &read), CUDA_SUCCESS);
    CHECK("device 0's pool keeps its own", read == 0);
    EXPECT(cuMemPoolTrimTo(default1, 0), CUDA_SUCCESS);

    // Access: device 1's own pool is read-write for it, closed to device 0 until granted.
    CUmemLocation at0 = mem_location(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemAccess_flags flags = 7;
    EXPECT(cuMemPoolGetAccess(&flags, default1, &at1), CUDA_SUCCESS);
    CHECK("a pool's own device reads and writes it", flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    EXPECT(cuMemPoolGetAccess(&flags, default1, &at0), CUDA_SUCCESS);
    CHECK("the peer has no access at first", flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CUmemAccessDesc grant = {at0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT(cuMemPoolSetAccess(default1, &grant, 1), CUDA_SUCCESS);
    EXPECT(cuMemPoolGetAccess(&flags, default1, &at0), CUDA_SUCCESS);
    CHECK("the peer granted access", flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    EXPECT(cuMemPoolGetAccess(&flags, default0, &at1), CUDA_SUCCESS);
    CHECK("device 0's pool untouched", flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
    CUmemLocation nowhere = mem_location(CU_MEM_LOCATION_TYPE_DEVICE, count);
    CUmemAccessDesc foreign = {nowhere, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK("access for a device outside the session refused", cuMemPoolSetAccess(default1, &foreign, 1) == CUDA_ERROR_INVALID_DEVICE);

    // A pool made on device 1 becomes its current pool, not device 0's.
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location = at1;
    CUmemoryPool made = NULL;
    EXPECT(cuMemPoolCreate(&made, &props), CUDA_SUCCESS);
    EXPECT(cuDeviceSetMemPool(dev1, made), CUDA_SUCCESS);
    EXPECT(cuDeviceGetMemPool(&again, dev1), CUDA_SUCCESS);
    CHECK("device 1's current pool is the one made", again == made);
    EXPECT(cuDeviceGetMemPool(&again, dev0), CUDA_SUCCESS);
    CHECK("device 0's current pool unchanged", again == default0);
    CHECK("device 1's pool cannot be device 0's", cuDeviceSetMemPool(dev0, made) != CUDA_SUCCESS);
    CUdeviceptr from_made = 0;
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemAllocAsync(&from_made, N, stream1), CUDA_SUCCESS);
    CHECK("the next allocation on device 1 comes from it", pointer_device(from_made) == 1 && pointer_pool(from_made) == made);
    EXPECT(cuMemFreeAsync(from_made, stream1), CUDA_SUCCESS);
    EXPECT(cuMemFreeAsync(on1, stream1), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream1), CUDA_SUCCESS);
    EXPECT(cuMemPoolDestroy(made), CUDA_SUCCESS);
    EXPECT(cuDeviceGetMemPool(&again, dev1), CUDA_SUCCESS);
    CHECK("a destroyed pool's device goes back to its default pool", again == default1);

    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemFreeAsync(on0, stream0), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream0), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(stream0), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(stream1), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease(dev0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease(dev1), CUDA_SUCCESS);
    return finish();
}

// A session with two GPUs (an emulated server started with --gpu 0,1) through Flyt's
// libcuda.so.1: both devices listed with their own identities and peer answers; each device's
// primary context; allocations on the device whose context is current, which their pointer
// attributes name; a peer copy and a copy through unified addressing between them; peer access;
// two threads working on different devices at once, each seeing its own device's results.
// Prints each device's name, so a run under CUDA_VISIBLE_DEVICES shows which it sees.
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

enum { N = 1 << 20, ROUNDS = 50 };

struct worker {
    CUcontext ctx;
    CUdeviceptr buf;
    unsigned char value;
    int right;
};

// Fills its device's buffer with its value, again and again, reading it back each time.
static void *work_on(void *arg) {
    struct worker *w = arg;
    unsigned char *host = malloc(N);
    w->right = host != NULL && cuCtxSetCurrent(w->ctx) == CUDA_SUCCESS;
    for (int round = 0; round < ROUNDS && w->right; round++) {
        unsigned char value = (unsigned char)(w->value + round);
        w->right = cuMemsetD8(w->buf, value, N) == CUDA_SUCCESS && cuMemcpyDtoH(host, w->buf, N) == CUDA_SUCCESS &&
                   host[0] == value && host[N - 1] == value;
        int device = -1;
        w->right = w->right && cuCtxGetDevice(&device) == CUDA_SUCCESS;
    }
    free(host);
    return NULL;
}

int main(void) {
    int count = count_devices(1, 0);
    if (count < 2) {
        return finish();
    }
    check_two_identities();

    int can01 = -1, can00 = -1, access = -1;
    EXPECT(cuDeviceCanAccessPeer(&can01, 0, 1), CUDA_SUCCESS);
    EXPECT(cuDeviceCanAccessPeer(&can00, 0, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetP2PAttribute(&access, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 1, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetP2PAttribute(&access, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 1, 1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceCanAccessPeer(&can00, 0, 2), CUDA_ERROR_INVALID_DEVICE);
    CHECK("peer answers: 0 and 1 are peers, a device is not its own", can01 == 1 && can00 == 0 && access == 1);

    CUcontext ctx0, ctx1;
    EXPECT(cuDevicePrimaryCtxRetain(&ctx0, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
    CUdeviceptr on0 = 0, on1 = 0;
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&on0, N), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&on1, N), CUDA_SUCCESS);
    int ordinal0 = -1, ordinal1 = -1;
    CUcontext owner1 = NULL;
    EXPECT(cuPointerGetAttribute(&ordinal0, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on0), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&ordinal1, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&owner1, CU_POINTER_ATTRIBUTE_CONTEXT, on1), CUDA_SUCCESS);
    CHECK("allocations on the current device, named by their attributes", ordinal0 == 0 && ordinal1 == 1 && owner1 == ctx1);
    CHECK("disjoint addresses", on0 + N <= on1 || on1 + N <= on0);

    unsigned char *host = malloc(N);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(on1, 0x33, N), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemcpyPeer(on0, ctx0, on1, ctx1, N), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(host, on0, N), CUDA_SUCCESS);
    int peer_copied = host[0] == 0x33 && host[N - 1] == 0x33;
    EXPECT(cuMemsetD8(on0, 0x44, N), CUDA_SUCCESS);
    EXPECT(cuMemcpy(on1, on0, N), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(host, on1, N), CUDA_SUCCESS);
    CHECK("copies between the devices", peer_copied && host[0] == 0x44 && host[N - 1] == 0x44);

    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuCtxEnablePeerAccess(ctx1, 0), CUDA_SUCCESS);
    EXPECT(cuCtxEnablePeerAccess(ctx1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    EXPECT(cuCtxEnablePeerAccess(ctx0, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    EXPECT(cuCtxDisablePeerAccess(ctx1), CUDA_SUCCESS);
    EXPECT(cuCtxDisablePeerAccess(ctx1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);

    // A memset of device 1's memory on a stream of device 0 needs peer access, as natively (the
    // error comes at once or at the stream's synchronize).
    CUstream stream0;
    EXPECT(cuStreamCreate(&stream0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUresult without = cuMemsetD8Async(on1, 0x55, N, stream0);
    if (without == CUDA_SUCCESS) without = cuStreamSynchronize(stream0);
    EXPECT(cuCtxEnablePeerAccess(ctx1, 0), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(on1, 0x55, N, stream0), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream0), CUDA_SUCCESS);
    EXPECT(cuCtxDisablePeerAccess(ctx1), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(stream0), CUDA_SUCCESS);
    CHECK("a memset across devices needs peer access", without == CUDA_ERROR_INVALID_VALUE);
    // Mapped host memory on device 0, then on device 1 (without the channel, device memory the
    // client zeroes and exchanges on a stream of its own device).
    unsigned char *mapped0 = NULL, *mapped1 = NULL;
    EXPECT(cuMemHostAlloc((void **)&mapped0, 4096, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemHostAlloc((void **)&mapped1, 4096, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    CHECK("mapped host memory on each device, zeroed", mapped0 && mapped1 && mapped1[0] == 0 && mapped1[4095] == 0);
    EXPECT(cuMemFreeHost(mapped1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(mapped0), CUDA_SUCCESS);

    // Physical memory on device 1 made while device 0 is current, mapped, readable by both.
    size_t granularity = 0;
    CUmemAllocationProp prop = device_memory_prop(1, &granularity);
    CUmemGenericAllocationHandle physical = 0;
    CUdeviceptr mapped = 0;
    EXPECT(cuMemCreate(&physical, granularity, &prop, 0), CUDA_SUCCESS);
    EXPECT(cuMemAddressReserve(&mapped, granularity, 0, 0, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(mapped, granularity, 0, physical, 0), CUDA_SUCCESS);
    CUmemAccessDesc both[2];
    memset(both, 0, sizeof both);
    for (int d = 0; d < 2; d++) {
        both[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        both[d].location.id = d;
        both[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    EXPECT(cuMemSetAccess(mapped, granularity, both, 2), CUDA_SUCCESS);
    both[0].location.id = 5;
    EXPECT(cuMemSetAccess(mapped, granularity, both, 1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuMemsetD8(mapped, 0x66, granularity), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(host, mapped, 64), CUDA_SUCCESS);
    unsigned long long access_flags = 0;
    CUmemLocation on_one = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
    EXPECT(cuMemGetAccess(&access_flags, &on_one, mapped), CUDA_SUCCESS);
    CHECK("physical memory of device 1 mapped for both", host[0] == 0x66 && host[63] == 0x66 && access_flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    EXPECT(cuMemUnmap(mapped, granularity), CUDA_SUCCESS);
    EXPECT(cuMemRelease(physical), CUDA_SUCCESS);
    EXPECT(cuMemAddressFree(mapped, granularity), CUDA_SUCCESS);

    struct worker workers[2] = {{ctx0, on0, 0x10, 0}, {ctx1, on1, 0x80, 0}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, work_on, &workers[i]);
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    CHECK("two threads on two devices at once", workers[0].right && workers[1].right);

    size_t free0 = 0, free1 = 0, total = 0;
    EXPECT(cuMemGetInfo(&free0, &total), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemGetInfo(&free1, &total), CUDA_SUCCESS);
    EXPECT(cuMemFree(on1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemFree(on0), CUDA_SUCCESS);
    free(host);
    EXPECT(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
    return finish();
}

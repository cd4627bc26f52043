// A tenant's app on a server of one GPU of a host with more (an emulated server started with
// --gpu 1) tries to reach another GPU through Flyt's libcuda.so.1: ordinals past its one device
// (cuDeviceGet, a primary context, peer queries, a default pool), peer access to and copies with
// a context it was never given. Each is refused with a CUDA error (names printed); its own device
// is the host's GPU 1, and it keeps working.
#include <stdint.h>
#include <string.h>

#include "driver_expect.h"

enum { N = 1 << 16 };

static void refused(const char *what, CUresult got) {
    printf("%s: %s\n", what, name_of(got));
    if (got == CUDA_SUCCESS) failures++;
}

int main(void) {
    count_devices(0, 0);
    CUuuid uuid;
    memset(&uuid, 0, sizeof uuid);
    EXPECT(cuDeviceGetUuid(&uuid, 0), CUDA_SUCCESS);
    printf("device 0 is the host's: %.16s\n", uuid.bytes);

    CUdevice device = -1;
    refused("cuDeviceGet(1)", cuDeviceGet(&device, 1));
    refused("cuDeviceGet(-1)", cuDeviceGet(&device, -1));
    CUcontext other = NULL;
    refused("cuDevicePrimaryCtxRetain(1)", cuDevicePrimaryCtxRetain(&other, 1));
    int can = -1;
    refused("cuDeviceCanAccessPeer(0, 1)", cuDeviceCanAccessPeer(&can, 0, 1));
    CUmemoryPool pool = NULL;
    refused("cuDeviceGetDefaultMemPool(1)", cuDeviceGetDefaultMemPool(&pool, 1));
    char name[64];
    refused("cuDeviceGetName(1)", cuDeviceGetName(name, sizeof name, 1));

    CUcontext ctx;
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    // A context handle the app was never given, made up.
    CUcontext forged = (CUcontext)(uintptr_t)0x5a5a5a5a5a5a0000ull;
    refused("cuCtxEnablePeerAccess(a made-up context)", cuCtxEnablePeerAccess(forged, 0));
    refused("cuCtxEnablePeerAccess(its own context)", cuCtxEnablePeerAccess(ctx, 0));
    CUdeviceptr mine = 0;
    EXPECT(cuMemAlloc(&mine, N), CUDA_SUCCESS);
    refused("cuMemcpyPeer from a made-up context", cuMemcpyPeer(mine, ctx, mine, forged, N));
    refused("cuMemcpyPeer to a made-up context", cuMemcpyPeer(mine, forged, mine, ctx, N));

    // Its own device works as before.
    unsigned char host[N];
    EXPECT(cuMemsetD8(mine, 0x42, N), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(host, mine, N), CUDA_SUCCESS);
    CHECK("its own memory still works", host[0] == 0x42 && host[N - 1] == 0x42);
    EXPECT(cuMemFree(mine), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    return finish();
}

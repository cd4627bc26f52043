// A session spread over two servers (two emulated servers, each --gpu 0, the second with
// --address-window 1; FLYT_SERVER names both) through Flyt's libcuda.so.1: the devices numbered
// server by server, each with its server's identity; no peer path between them (peer access
// refused as the driver refuses it between GPUs without a path); allocations on each at
// addresses of their own; peer copies and copies through unified addressing of a few MiB from
// device 0 to device 1 and back, staged through the app, with every byte checked; streams and
// events of each device used from a thread whose current device is the other.
// Prints each device's name and UUID, so a run under CUDA_VISIBLE_DEVICES shows which it sees.
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

// Not a multiple of the copy chunk, so the last staged piece is a short one.
enum { N = (5 << 20) + 4096 + 17 };

static void CUDA_CB mark(void *flag) { *(volatile int *)flag = 1; }

static void pattern(unsigned char *bytes, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) bytes[i] = (unsigned char)((i * 2654435761u + seed) >> 7);
}

int main(void) {
    int count = count_devices(1, 1);
    if (count < 2) {
        // One server's GPU alone: it works as a session on that server.
        CUcontext ctx;
        CUdeviceptr ptr = 0;
        unsigned char *host = malloc(N), *back = malloc(N);
        pattern(host, N, 3);
        EXPECT(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        EXPECT(cuMemAlloc(&ptr, N), CUDA_SUCCESS);
        EXPECT(cuMemcpyHtoD(ptr, host, N), CUDA_SUCCESS);
        EXPECT(cuMemcpyDtoH(back, ptr, N), CUDA_SUCCESS);
        CHECK("one device alone copies", memcmp(host, back, N) == 0);
        return finish();
    }
    check_two_identities();

    int can01 = -1, can10 = -1, access = -1, atomics = -1;
    EXPECT(cuDeviceCanAccessPeer(&can01, 0, 1), CUDA_SUCCESS);
    EXPECT(cuDeviceCanAccessPeer(&can10, 1, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetP2PAttribute(&access, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, 1), CUDA_SUCCESS);
    EXPECT(cuDeviceGetP2PAttribute(&atomics, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, 1, 0), CUDA_SUCCESS);
    CHECK("no peer path between the servers' GPUs", can01 == 0 && can10 == 0 && access == 0 && atomics == 0);

    CUcontext ctx0, ctx1;
    EXPECT(cuDevicePrimaryCtxRetain(&ctx0, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuCtxEnablePeerAccess(ctx1, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    EXPECT(cuCtxDisablePeerAccess(ctx1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    printf("peer access refused: yes\n");

    CUdeviceptr on0 = 0, on1 = 0, also0 = 0;
    EXPECT(cuMemAlloc(&on0, N), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&on1, N), CUDA_SUCCESS);
    int ordinal0 = -1, ordinal1 = -1;
    EXPECT(cuPointerGetAttribute(&ordinal0, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on0), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&ordinal1, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, on1), CUDA_SUCCESS);
    CHECK("allocations named by their devices", ordinal0 == 0 && ordinal1 == 1);
    CHECK("disjoint addresses", on0 != 0 && on1 != 0 && (on1 >= on0 + N || on0 >= on1 + N));
    // The emulated device's window 1 starts 16 TiB above its first address, 0x2b0000000000.
    CHECK("each server's addresses in its window", (on0 >= 0x3b0000000000ull) != (on1 >= 0x3b0000000000ull));

    unsigned char *host = malloc(N), *back = malloc(N);
    pattern(host, N, 1);
    // Device 0's bytes, written while device 1 is current (the pointer names its server).
    EXPECT(cuMemcpyHtoD(on0, host, N), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(on1, 0, N), CUDA_SUCCESS);
    EXPECT(cuMemcpyPeer(on1, ctx1, on0, ctx0, N), CUDA_SUCCESS);
    memset(back, 0, N);
    EXPECT(cuMemcpyDtoH(back, on1, N), CUDA_SUCCESS);
    CHECK("peer copy from device 0 to device 1", memcmp(host, back, N) == 0);

    // And back, asynchronously on a stream of device 1, through unified addressing.
    pattern(host, N, 2);
    CUstream stream1;
    EXPECT(cuStreamCreate(&stream1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoDAsync(on1, host, N, stream1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(on0, 0, N), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemcpyAsync(on0, on1, N, stream1), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    memset(back, 0, N);
    EXPECT(cuMemcpyDtoH(back, on0, N), CUDA_SUCCESS);
    CHECK("copy back from device 1 to device 0", memcmp(host, back, N) == 0);

    // A part in the middle, peer-async, then a copy on device 0 of what arrived.
    EXPECT(cuMemAlloc(&also0, N), CUDA_SUCCESS);
    EXPECT(cuMemcpyPeerAsync(also0 + 4096, ctx0, on1 + 8192, ctx1, 1 << 20, NULL), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    memset(back, 0, N);
    EXPECT(cuMemcpyDtoH(back, also0 + 4096, 1 << 20), CUDA_SUCCESS);
    CHECK("a part at offsets", memcmp(host + 8192, back, 1 << 20) == 0);

    // A pitched box between the servers' memory, and read back from the other server's, with
    // device 0 current: staged and routed as flat copies are.
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(on1, 0, N), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    CUDA_MEMCPY2D box = copy_2d(box_at(device_side(on0, 4096, 0), 8, 0, 0), device_side(on1, 2048, 0), 1000, 300);
    EXPECT(cuMemcpy2D(&box), CUDA_SUCCESS);
    CUDA_MEMCPY2D out = copy_2d(device_side(on1, 2048, 0), host_side(back, 1000, 0), 1000, 300);
    memset(back, 0xee, N);
    EXPECT(cuMemcpy2D(&out), CUDA_SUCCESS);
    int rows_right = 1;
    for (int y = 0; y < 300; y++) rows_right = rows_right && memcmp(back + (size_t)y * 1000, host + 8 + (size_t)y * 4096, 1000) == 0;
    CHECK("a pitched box between the devices", rows_right);

    // A 2D memset of device 1's memory with device 0 current goes to device 1's server.
    EXPECT(cuMemsetD2D8(on1, 2048, 0x5a, 1000, 300), CUDA_SUCCESS);
    memset(back, 0, N);
    EXPECT(cuMemcpy2D(&out), CUDA_SUCCESS);
    int set_right = 1;
    for (size_t i = 0; i < 1000 * 300; i++) set_right = set_right && back[i] == 0x5a;
    CHECK("a 2D memset of the other server's memory", set_right);

    // Device 1's stream and event, used while device 0 is current: they go to their server.
    CUevent done1;
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuEventCreate(&done1, 0), CUDA_SUCCESS);
    EXPECT(cuEventRecord(done1, stream1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    CUstream stream0;
    EXPECT(cuStreamCreate(&stream0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream1), CUDA_SUCCESS);
    EXPECT(cuEventSynchronize(done1), CUDA_SUCCESS);
    EXPECT(cuEventQuery(done1), CUDA_SUCCESS);
    // Waited for in the app: no server can make one node's stream wait for another's event.
    EXPECT(cuStreamWaitEvent(stream0, done1, 0), CUDA_SUCCESS);
    EXPECT(cuEventRecord(done1, stream0), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamSynchronize(stream0), CUDA_SUCCESS);
    printf("streams and events find their servers: yes\n");

    // Host functions on each server's stream, the second's queued while device 0 is current: each
    // server's call is answered to that server.
    volatile int ran0 = 0, ran1 = 0;
    EXPECT(cuLaunchHostFunc(stream1, mark, (void *)&ran1), CUDA_SUCCESS);
    EXPECT(cuLaunchHostFunc(stream0, mark, (void *)&ran0), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream1), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream0), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    ran1 = 0;
    EXPECT(cuLaunchHostFunc(stream1, mark, (void *)&ran1), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    CHECK("host functions on both servers' streams", ran0 == 1 && ran1 == 1);

    RELEASE(STREAM(stream0), EVENT(done1), STREAM(stream1), MEMORY(on1), MEMORY(on0), MEMORY(also0));
    free(host);
    free(back);
    return finish();
}

// A session of two GPUs (servers started with --gpu 0,1) moved while it runs: before the move
// it allocates on each device, fills, copies across them, makes a stream and an event on each,
// enables peer access from device 0 to device 1 and tries a module on each; then it writes
// MARKER and, device 1 current, waits (polling its streams) for MARKER.next, which the test
// writes once it has moved the session. After the move: the same pointers, every byte on both
// devices as it was, each pointer's DEVICE_ORDINAL, the peer access still enabled, copies across
// the devices again on the streams of both, an event of one awaited by the other's stream, and a
// thread on device 0 while the main one stays on device 1.
// Usage: migrate_two_devices MARKER [pool]: with `pool`, device 1 also holds a stream-ordered
// allocation throughout (a move is refused with the reason: the app's checks pass unmoved).
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver_expect.h"

enum { N0 = (1 << 20) + 4096, N1 = 3 << 18, N2 = 65536 };  // N1 < N0: host buffers are N0 long

// A byte of buffer `which` at offset `i`: every buffer its own pattern.
static unsigned char pattern(int which, size_t i) {
    return (unsigned char)(i * 7 + (size_t)which * 31 + (i >> 12));
}

static void fill(unsigned char *host, int which, size_t len) {
    for (size_t i = 0; i < len; i++) host[i] = pattern(which, i);
}

// Whether `ptr` holds buffer `which`'s pattern for `len` bytes.
static int holds(CUdeviceptr ptr, int which, size_t len) {
    unsigned char *host = malloc(len);
    int right = host != NULL && cuMemcpyDtoH(host, ptr, len) == CUDA_SUCCESS;
    for (size_t i = 0; right && i < len; i++) right = host[i] == pattern(which, i);
    free(host);
    return right;
}

static int ordinal_of(CUdeviceptr ptr) {
    int ordinal = -1;
    EXPECT(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr), CUDA_SUCCESS);
    return ordinal;
}

static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
                          ".visible .global .align 4 .u32 counter = 17;\n"
                          ".visible .entry k() { ret; }\n";

// Objects of the device whose context `ctx` is (made current): buffers `a` and `b` of `a_len` and
// `b_len` bytes, stream `s` made with `stream_flags`, event `e`, module `m` (what loading it
// returned is returned).
static CUresult make_objects(CUcontext ctx, CUdeviceptr *a, size_t a_len, CUdeviceptr *b, size_t b_len, CUstream *s, unsigned stream_flags,
                             CUevent *e, CUmodule *m) {
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(a, a_len), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(b, b_len), CUDA_SUCCESS);
    EXPECT(cuStreamCreate(s, stream_flags), CUDA_SUCCESS);
    EXPECT(cuEventCreate(e, CU_EVENT_DEFAULT), CUDA_SUCCESS);
    return cuModuleLoadData(m, ptx);
}

struct on_device_zero {
    CUcontext ctx;
    CUdeviceptr buf;
    CUstream stream;
    int right;
};

// Device 0 from another thread while the main one stays on device 1.
static void *use_device_zero(void *arg) {
    struct on_device_zero *w = arg;
    int device = -1;
    w->right = cuCtxSetCurrent(w->ctx) == CUDA_SUCCESS && cuCtxGetDevice(&device) == CUDA_SUCCESS && device == 0;
    w->right = w->right && cuMemsetD8Async(w->buf, 0x5c, N2, w->stream) == CUDA_SUCCESS &&
               cuStreamSynchronize(w->stream) == CUDA_SUCCESS;
    unsigned char host[16];
    w->right = w->right && cuMemcpyDtoH(host, w->buf + N2 - 16, 16) == CUDA_SUCCESS && host[0] == 0x5c && host[15] == 0x5c;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MARKER\n", argv[0]);
        return 2;
    }
    const char *marker = argv[1];
    int pool = argc > 2 && strcmp(argv[2], "pool") == 0;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    int count = 0;
    EXPECT(cuDeviceGetCount(&count), CUDA_SUCCESS);
    if (count < 2) {
        printf("devices: %d (two needed)\nPASSED: %d failure(s)\n", count, failures + 1);
        return 1;
    }
    CUcontext ctx0, ctx1;
    EXPECT(cuDevicePrimaryCtxRetain(&ctx0, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);

    // Device 0: two buffers, a stream, an event, a module.
    CUdeviceptr a0 = 0, a1 = 0, b1 = 0, c0 = 0;
    CUstream s0, s1;
    CUevent e0, e1;
    CUmodule m0 = NULL, m1 = NULL;
    CUresult loaded0 = make_objects(ctx0, &a0, N0, &c0, N2, &s0, CU_STREAM_NON_BLOCKING, &e0, &m0);
    // Device 1: two buffers, a stream, an event, a module.
    CUresult loaded1 = make_objects(ctx1, &a1, N1, &b1, N0, &s1, CU_STREAM_DEFAULT, &e1, &m1);
    CUdeviceptr from_pool = 0;
    if (pool) {
        EXPECT(cuMemAllocAsync(&from_pool, N2, s1), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);
    }
    CHECK("the module loads alike on both devices", loaded0 == loaded1);
    // A real GPU runs the module: its variable on device 1 is set before the move.
    CUdeviceptr counter1 = 0;
    size_t counter_size = 0;
    if (loaded1 == CUDA_SUCCESS) {
        unsigned value = 4242;
        EXPECT(cuModuleGetGlobal(&counter1, &counter_size, m1, "counter"), CUDA_SUCCESS);
        EXPECT(cuMemcpyHtoD(counter1, &value, sizeof value), CUDA_SUCCESS);
    }

    unsigned char *host = malloc(N0);
    fill(host, 0, N0);
    EXPECT(cuMemcpyHtoDAsync(a0, host, N0, s0), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s0), CUDA_SUCCESS);
    fill(host, 1, N1);
    EXPECT(cuMemcpyHtoD(a1, host, N1), CUDA_SUCCESS);
    // Device 0's pattern into device 1's second buffer, peer to peer.
    EXPECT(cuMemcpyPeerAsync(b1, ctx1, a0, ctx0, N0, s1), CUDA_SUCCESS);
    EXPECT(cuEventRecord(e1, s1), CUDA_SUCCESS);
    EXPECT(cuEventSynchronize(e1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(c0, 0x3d, N2), CUDA_SUCCESS);
    EXPECT(cuCtxEnablePeerAccess(ctx1, 0), CUDA_SUCCESS);
    EXPECT(cuEventRecord(e0, s0), CUDA_SUCCESS);
    CHECK("before the move: every buffer holds its bytes", holds(a0, 0, N0) && holds(b1, 0, N0));
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    CHECK("before the move: device 1's own buffer", holds(a1, 1, N1));
    printf("pointers: %llx %llx %llx %llx\n", (unsigned long long)a0, (unsigned long long)a1, (unsigned long long)b1,
           (unsigned long long)c0);
    fflush(stdout);

    // Moved while device 1 is current on this thread.
    char path[4096];
    snprintf(path, sizeof path, "%s", marker);
    FILE *file = fopen(path, "w");
    if (file) fclose(file);
    snprintf(path, sizeof path, "%s.next", marker);
    int waited = 0;
    for (; waited < 12000 && access(path, F_OK) != 0; waited++) {
        EXPECT(cuStreamQuery(s1), CUDA_SUCCESS);
        usleep(10000);
    }
    CHECK("the test said the move is done", waited < 12000);

    // The first calls after the move, device 1 still current with no context change in between:
    // the server must run them on device 1 (peer access from device 1 to device 0).
    EXPECT(cuCtxEnablePeerAccess(ctx0, 0), CUDA_SUCCESS);
    EXPECT(cuCtxDisablePeerAccess(ctx0), CUDA_SUCCESS);
    CUdeviceptr d1 = 0;
    EXPECT(cuMemAlloc(&d1, N2), CUDA_SUCCESS);
    int device = -1;
    EXPECT(cuCtxGetDevice(&device), CUDA_SUCCESS);
    CHECK("after the move: device 1 is still current", device == 1);
    CHECK("after the move: a new allocation is device 1's", ordinal_of(d1) == 1);
    printf("pointers: %llx %llx %llx %llx\n", (unsigned long long)a0, (unsigned long long)a1, (unsigned long long)b1,
           (unsigned long long)c0);
    CHECK("after the move: every byte on device 1", holds(a1, 1, N1) && holds(b1, 0, N0));
    CHECK("after the move: every byte on device 0 (read from device 1)", holds(a0, 0, N0));
    CHECK("after the move: each pointer's DEVICE_ORDINAL",
          ordinal_of(a0) == 0 && ordinal_of(c0) == 0 && ordinal_of(a1) == 1 && ordinal_of(b1) == 1);
    if (loaded1 == CUDA_SUCCESS) {
        unsigned value = 0;
        EXPECT(cuMemcpyDtoH(&value, counter1, sizeof value), CUDA_SUCCESS);
        CHECK("after the move: device 1's module variable, at the address the app knows", value == 4242 && counter_size == 4);
    }

    // Device 0's buffer through device 1's stream: a peer copy, after device 0's event.
    EXPECT(cuStreamWaitEvent(s1, e0, 0), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(a1, 0x21, N1, s1), CUDA_SUCCESS);
    EXPECT(cuEventRecord(e1, s1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuStreamWaitEvent(s0, e1, 0), CUDA_SUCCESS);
    EXPECT(cuMemcpyPeerAsync(a0, ctx0, a1, ctx1, N1, s0), CUDA_SUCCESS);
    EXPECT(cuEventRecord(e0, s0), CUDA_SUCCESS);
    EXPECT(cuEventSynchronize(e0), CUDA_SUCCESS);
    EXPECT(cuEventQuery(e1), CUDA_SUCCESS);
    memset(host, 0, N0);
    EXPECT(cuMemcpyDtoH(host, a0, N0), CUDA_SUCCESS);
    int copied = 1;
    for (size_t i = 0; i < N0; i++) copied &= host[i] == (i < N1 ? 0x21 : pattern(0, i));
    CHECK("after the move: a peer copy on device 0's stream after device 1's event", copied);
    EXPECT(cuMemcpyDtoD(b1, a0, N0), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(host, b1 + N0 - 16, 16), CUDA_SUCCESS);
    CHECK("after the move: a copy across devices by unified addressing", host[0] == pattern(0, N0 - 16) && host[15] == pattern(0, N0 - 1));

    // The peer access enabled before the move is enabled still.
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuCtxEnablePeerAccess(ctx1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    EXPECT(cuCtxDisablePeerAccess(ctx1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);

    struct on_device_zero zero = {ctx0, c0, s0, 0};
    pthread_t thread;
    pthread_create(&thread, NULL, use_device_zero, &zero);
    pthread_join(thread, NULL);
    CHECK("after the move: another thread on device 0", zero.right);
    EXPECT(cuMemsetD8Async(d1, 0x77, N2, s1), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(host, d1 + N2 - 1, 1), CUDA_SUCCESS);
    CHECK("after the move: device 1's stream on the main thread", host[0] == 0x77);

    if (pool) {
        EXPECT(cuMemFreeAsync(from_pool, s1), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);
    }
    RELEASE(STREAM(s1), EVENT(e1), MEMORY(d1), MEMORY(b1), MEMORY(a1));
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    RELEASE(STREAM(s0), EVENT(e0), MEMORY(c0), MEMORY(a0));
    free(host);
    EXPECT(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    return finish();
}

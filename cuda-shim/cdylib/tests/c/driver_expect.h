// What the driver-API test programs share: a failure count, error names and EXPECT, which
// compares a call's CUresult with the one expected and counts a mismatch.
#include <cuda.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

static const char *name_of(CUresult r) {
    const char *name = NULL;
    cuGetErrorName(r, &name);
    return name ? name : "?";
}

#define EXPECT(call, expected)                                                                      \
    do {                                                                                            \
        CUresult got_ = (call);                                                                     \
        if (got_ != (expected)) {                                                                   \
            printf("FAIL line %d: %s: %s, expected %s\n", __LINE__, #call, name_of(got_),          \
                   name_of(expected));                                                              \
            failures++;                                                                             \
        }                                                                                           \
    } while (0)

// Prints "WHAT: yes" or "WHAT: no" (the tests look for the line) and counts a "no" as a failure.
#define CHECK(what, condition)                                                                      \
    do {                                                                                            \
        int ok_ = (condition);                                                                      \
        printf("%s: %s\n", what, ok_ ? "yes" : "no");                                              \
        if (!ok_) failures++;                                                                       \
    } while (0)

// The programs' last line ("PASSED: N failure(s)", which the tests look for) and exit code.
static inline int finish(void) {
    printf("PASSED: %d failure(s)\n", failures);
    return failures != 0;
}

// The usual start: cuInit, device 0's primary context retained and made current (returned for
// the programs that use it again). `device` receives device 0's handle from cuDeviceGet; NULL
// names ordinal 0 directly, as some programs do (no cuDeviceGet call).
static inline CUcontext use_primary_context(CUdevice *device) {
    CUcontext ctx = NULL;
    CUdevice ordinal = 0;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    if (device) {
        EXPECT(cuDeviceGet(device, 0), CUDA_SUCCESS);
        ordinal = *device;
    }
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, ordinal), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    return ctx;
}

// The usual start of the multi-device programs: cuInit and the session's device count, printed
// ("devices: N"); with `names`, a line per device ("device D: NAME"), its UUID in hex after
// " uuid " with `uuids` too.
static inline int count_devices(int names, int uuids) {
    int count = 0;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetCount(&count), CUDA_SUCCESS);
    printf("devices: %d\n", count);
    for (int d = 0; names && d < count; d++) {
        char name[256] = {0};
        EXPECT(cuDeviceGetName(name, sizeof name, d), CUDA_SUCCESS);
        printf("device %d: %s", d, name);
        if (uuids) {
            CUuuid uuid;
            EXPECT(cuDeviceGetUuid_v2(&uuid, d), CUDA_SUCCESS);
            printf(" uuid ");
            for (int i = 0; i < 16; i++) printf("%02x", (unsigned char)uuid.bytes[i]);
        }
        printf("\n");
    }
    return count;
}

// Checks that devices 0 and 1 are two GPUs: their UUIDs differ ("two identities: yes").
static inline void check_two_identities(void) {
    CUuuid a, b;
    EXPECT(cuDeviceGetUuid_v2(&a, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetUuid_v2(&b, 1), CUDA_SUCCESS);
    CHECK("two identities", memcmp(&a, &b, sizeof a) != 0);
}

// A graph memset node's parameters: `n` bytes of `value` at `dst` (one row).
static inline CUDA_MEMSET_NODE_PARAMS byte_memset_params(CUdeviceptr dst, unsigned value, size_t n) {
    CUDA_MEMSET_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.dst = dst;
    p.value = value;
    p.elementSize = 1;
    p.width = n;
    p.height = 1;
    p.pitch = n;
    return p;
}

// A graph copy node's parameters: `n` bytes from device memory `src` to device memory `dst`.
static inline CUDA_MEMCPY3D device_copy_params(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dst;
    c.WidthInBytes = n;
    c.Height = 1;
    c.Depth = 1;
    return c;
}

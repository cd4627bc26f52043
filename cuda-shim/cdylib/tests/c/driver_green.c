// Green contexts through Flyt's libcuda.so.1 on the emulated device (no kernels): the device's SM
// resource, a split into groups, descriptors, a green context of one group with its own context,
// streams made in it (explicitly, or with its context current, whose NULL stream is its own),
// memsets and copies on them, events recorded and waited through it, and its destruction, which
// takes its context and streams along. Bad input gets the driver's errors.
//
// `driver_green hold MARKER` holds a green context for a checkpoint to be refused (tests/migration.rs):
// it makes one, creates MARKER and works until MARKER.next appears; then destroys it, creates
// MARKER.freed and works until MARKER.end appears.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver_expect.h"

static int filled(const unsigned char *bytes, size_t len, unsigned char value) {
    for (size_t i = 0; i < len; i++)
        if (bytes[i] != value) return 0;
    return 1;
}

static void touch(const char *marker, const char *suffix) {
    char path[4096];
    snprintf(path, sizeof path, "%s%s", marker, suffix);
    FILE *file = fopen(path, "w");
    if (file) fclose(file);
}

/// Syncs `stream` every 10 ms (each call a point where a checkpoint can pause the app) until
/// MARKER`suffix` exists, for at most a minute.
static void work_until(CUstream stream, const char *marker, const char *suffix) {
    char path[4096];
    snprintf(path, sizeof path, "%s%s", marker, suffix);
    for (int i = 0; i < 6000 && access(path, F_OK) != 0; i++) {
        EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
        usleep(10000);
    }
}

static int hold(const char *marker) {
    CUdevice dev;
    use_primary_context(&dev);
    CUdevResource sms;
    CUdevResourceDesc desc;
    CUgreenCtx green;
    CUstream stream;
    EXPECT(cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    EXPECT(cuDevResourceGenerateDesc(&desc, &sms, 1), CUDA_SUCCESS);
    EXPECT(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
    EXPECT(cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    touch(marker, "");
    work_until(stream, marker, ".next");
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    EXPECT(cuGreenCtxDestroy(green), CUDA_SUCCESS);
    touch(marker, ".freed");
    work_until(NULL, marker, ".end");
    return finish();
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "hold") == 0) return hold(argv[2]);
    CUdevice dev;
    CUcontext primary;
    primary = use_primary_context(&dev);
    int sms = 0;
    EXPECT(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), CUDA_SUCCESS);
    CHECK("CUdevResource is 144 bytes", sizeof(CUdevResource) == 144);

    // The device's SMs, as the session's context has them.
    CUdevResource device_sms, ctx_sms, scratch;
    memset(&device_sms, 0, sizeof device_sms);
    EXPECT(cuDeviceGetDevResource(dev, &device_sms, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    printf("device SMs: %u (attribute %d), min partition %u, alignment %u\n", device_sms.sm.smCount, sms,
           device_sms.sm.minSmPartitionSize, device_sms.sm.smCoscheduledAlignment);
    CHECK("the device's SM resource counts its SMs", device_sms.type == CU_DEV_RESOURCE_TYPE_SM && (int)device_sms.sm.smCount == sms);
    EXPECT(cuCtxGetDevResource(primary, &ctx_sms, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    CHECK("the primary context has them all", ctx_sms.sm.smCount == device_sms.sm.smCount);
    EXPECT(cuDeviceGetDevResource(dev, &scratch, (CUdevResourceType)7), CUDA_ERROR_INVALID_RESOURCE_TYPE);
    EXPECT(cuDeviceGetDevResource(dev, &scratch, CU_DEV_RESOURCE_TYPE_INVALID), CUDA_ERROR_INVALID_RESOURCE_TYPE);
    EXPECT(cuDeviceGetDevResource(5, &scratch, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceGetDevResource(dev, NULL, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_VALUE);

    // Splits: counted, made, and refused when they ask too much.
    unsigned int count = 0;
    EXPECT(cuDevSmResourceSplitByCount(NULL, &count, &device_sms, NULL, 0, 16), CUDA_SUCCESS);
    printf("groups of 16 SMs that fit: %u\n", count);
    CUdevResource groups[2], rest;
    unsigned int two = 2;
    EXPECT(cuDevSmResourceSplitByCount(groups, &two, &device_sms, &rest, 0, 16), CUDA_SUCCESS);
    CHECK("two groups of 16 and the rest", two == 2 && groups[0].sm.smCount == 16 && groups[1].sm.smCount == 16 &&
                                               (int)rest.sm.smCount == sms - 32);
    unsigned int one = 1;
    EXPECT(cuDevSmResourceSplitByCount(groups, NULL, &device_sms, NULL, 0, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDevSmResourceSplitByCount(&scratch, &one, &device_sms, NULL, 0, (unsigned)sms + 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDevSmResourceSplitByCount(&scratch, &one, &groups[0], NULL, 0, 8), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    CUdevResource forged;
    memset(&forged, 0, sizeof forged);
    forged.type = CU_DEV_RESOURCE_TYPE_SM;
    forged.sm.smCount = 8;
    EXPECT(cuDevSmResourceSplitByCount(&scratch, &one, &forged, NULL, 0, 8), CUDA_ERROR_INVALID_VALUE);
    forged.type = CU_DEV_RESOURCE_TYPE_INVALID;
    EXPECT(cuDevSmResourceSplitByCount(&scratch, &one, &forged, NULL, 0, 8), CUDA_ERROR_INVALID_RESOURCE_TYPE);

    // Descriptors: one group, or both groups of one split.
    CUdevResourceDesc desc, both, unused;
    EXPECT(cuDevResourceGenerateDesc(&desc, &groups[0], 1), CUDA_SUCCESS);
    EXPECT(cuDevResourceGenerateDesc(&both, groups, 2), CUDA_SUCCESS);
    EXPECT(cuDevResourceGenerateDesc(&unused, groups, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDevResourceGenerateDesc(NULL, groups, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDevResourceGenerateDesc(&unused, &forged, 1), CUDA_ERROR_INVALID_RESOURCE_TYPE);

    // A green context of the first group, and its context.
    CUgreenCtx green = NULL;
    EXPECT(cuGreenCtxCreate(&green, desc, dev, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGreenCtxCreate(&green, desc, 3, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
    CUdevResource green_sms;
    EXPECT(cuGreenCtxGetDevResource(green, &green_sms, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    CHECK("the green context has its group's 16 SMs", green_sms.sm.smCount == 16);
    CUcontext green_ctx = NULL, again = NULL;
    EXPECT(cuCtxFromGreenCtx(&green_ctx, green), CUDA_SUCCESS);
    EXPECT(cuCtxFromGreenCtx(&again, green), CUDA_SUCCESS);
    CHECK("its context is its own, the same each time", green_ctx != NULL && green_ctx != primary && again == green_ctx);
    EXPECT(cuCtxGetDevResource(green_ctx, &scratch, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    CHECK("its context has its SMs", scratch.sm.smCount == 16);
    unsigned long long green_id = 0, ctx_id = 0, current_id = 0;
    EXPECT(cuGreenCtxGetId(green, &green_id), CUDA_SUCCESS);
    EXPECT(cuCtxGetId(green_ctx, &ctx_id), CUDA_SUCCESS);
    EXPECT(cuGreenCtxGetId(NULL, &current_id), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuGreenCtxDestroy((CUgreenCtx)primary), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxDestroy(green_ctx), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuGreenCtxGetDevResource(green, &scratch, (CUdevResourceType)2), CUDA_ERROR_INVALID_RESOURCE_TYPE);

    // Its streams: explicit ones, non-blocking only.
    CUstream stream = NULL, plain = NULL, leftover = NULL;
    EXPECT(cuGreenCtxStreamCreate(&stream, green, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGreenCtxStreamCreate(&stream, (CUgreenCtx)primary, CU_STREAM_NON_BLOCKING, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, -1), CUDA_SUCCESS);
    EXPECT(cuGreenCtxStreamCreate(&leftover, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    EXPECT(cuStreamCreate(&plain, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    CUgreenCtx of_stream = NULL, of_plain = (CUgreenCtx)1;
    CUcontext stream_ctx = NULL, v2_ctx = NULL;
    EXPECT(cuStreamGetGreenCtx(stream, &of_stream), CUDA_SUCCESS);
    EXPECT(cuStreamGetGreenCtx(plain, &of_plain), CUDA_SUCCESS);
    EXPECT(cuStreamGetCtx(stream, &stream_ctx), CUDA_SUCCESS);
    CHECK("a green stream names its green context and its context", of_stream == green && of_plain == NULL && stream_ctx == green_ctx);
    of_stream = NULL;
    EXPECT(cuStreamGetCtx_v2(stream, &v2_ctx, &of_stream), CUDA_SUCCESS);
    CHECK("cuStreamGetCtx_v2: the primary context and the green context", v2_ctx == primary && of_stream == green);
    int priority = 0;
    unsigned int flags = 0;
    EXPECT(cuStreamGetPriority(stream, &priority), CUDA_SUCCESS);
    EXPECT(cuStreamGetFlags(stream, &flags), CUDA_SUCCESS);
    CHECK("its flags and priority", flags == CU_STREAM_NON_BLOCKING && priority == -1);

    // Memsets and copies on it.
    enum { LEN = 4096 };
    static unsigned char host[LEN], pattern[LEN];
    CUdeviceptr d = 0;
    EXPECT(cuMemAlloc(&d, LEN), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(d, 0x5a, LEN, stream), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoHAsync(host, d, LEN, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    CHECK("a memset and a copy on the green stream", filled(host, LEN, 0x5a));
    memset(pattern, 0x21, LEN);
    EXPECT(cuMemcpyHtoDAsync(d, pattern, LEN, stream), CUDA_SUCCESS);

    // Events through the green context, and through its context.
    CUevent event;
    EXPECT(cuEventCreate(&event, CU_EVENT_DEFAULT), CUDA_SUCCESS);
    EXPECT(cuGreenCtxRecordEvent(green, event), CUDA_SUCCESS);
    EXPECT(cuEventSynchronize(event), CUDA_SUCCESS);
    EXPECT(cuStreamWaitEvent(plain, event, 0), CUDA_SUCCESS);
    EXPECT(cuGreenCtxWaitEvent(green, event), CUDA_SUCCESS);
    EXPECT(cuCtxRecordEvent(green_ctx, event), CUDA_SUCCESS);
    EXPECT(cuCtxWaitEvent(green_ctx, event), CUDA_SUCCESS);
    EXPECT(cuGreenCtxRecordEvent(green, (CUevent)(uintptr_t)0x777), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuGreenCtxWaitEvent((CUgreenCtx)(uintptr_t)0x777, event), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuMemcpyDtoH(host, d, LEN), CUDA_SUCCESS);
    CHECK("the copy before the event landed", filled(host, LEN, 0x21));

    // With its context current: the NULL stream is the green context's, and so are new streams.
    EXPECT(cuCtxPushCurrent(green_ctx), CUDA_SUCCESS);
    EXPECT(cuGreenCtxGetId(NULL, &current_id), CUDA_SUCCESS);
    CHECK("the current green context's id", current_id == green_id && green_id != 0);
    of_stream = NULL;
    EXPECT(cuStreamGetGreenCtx(NULL, &of_stream), CUDA_SUCCESS);
    CHECK("the NULL stream is the green context's", of_stream == green);
    EXPECT(cuStreamGetCtx_v2(CU_STREAM_PER_THREAD, &v2_ctx, &of_stream), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuMemsetD8Async(d, 0x33, LEN, NULL), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(host, d, LEN), CUDA_SUCCESS);
    CHECK("NULL-stream work in the green context", filled(host, LEN, 0x33));
    CUstream made_in = NULL;
    EXPECT(cuStreamCreate(&made_in, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    of_stream = NULL;
    EXPECT(cuStreamGetGreenCtx(made_in, &of_stream), CUDA_SUCCESS);
    CHECK("a stream made with its context current is the green context's", of_stream == green);
    EXPECT(cuMemsetD8Async(d, 0x44, LEN, made_in), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(made_in), CUDA_SUCCESS);
    CUcontext popped = NULL;
    EXPECT(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    CHECK("popped the green context's context", popped == green_ctx);
    EXPECT(cuMemcpyDtoH(host, d, LEN), CUDA_SUCCESS);
    CHECK("its stream's memset landed", filled(host, LEN, 0x44));

    // Destroyed: its context and the stream it still had go with it.
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    EXPECT(cuGreenCtxDestroy(green), CUDA_SUCCESS);
    EXPECT(cuGreenCtxDestroy(green), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT(cuCtxFromGreenCtx(&again, green), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT(cuCtxPushCurrent(green_ctx), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT(cuStreamDestroy(leftover), CUDA_ERROR_CONTEXT_IS_DESTROYED);

    // A green context of both groups.
    CUgreenCtx wide = NULL;
    EXPECT(cuGreenCtxCreate(&wide, both, dev, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
    EXPECT(cuGreenCtxGetDevResource(wide, &scratch, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    CHECK("a green context of both groups has 32 SMs", scratch.sm.smCount == 32);
    EXPECT(cuGreenCtxDestroy(wide), CUDA_SUCCESS);

    EXPECT(cuStreamDestroy(plain), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(event), CUDA_SUCCESS);
    EXPECT(cuMemFree(d), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    return finish();
}

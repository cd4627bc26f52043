// Batch copies (cuMemcpyBatchAsync, both versions) and the small context calls through Flyt's
// libcuda.so.1 on the emulated device: copies up and down in one call each, with source access
// orders, the failing copy's index, the refusals the driver documents (no attributes, attributes
// not starting at copy 0, the legacy stream); cuCtxSetFlags read back; the fixed shared memory bank
// size; the CUDA 3.x destroy entry points.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

// The bank size calls are deprecated (fixed since Maxwell) but still exported and called.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// cuda.h names the current versions; these are the first ones' symbols.
#undef cuMemcpyBatchAsync
#undef cuEventDestroy
#undef cuStreamDestroy
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
                            size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream);
CUresult cuEventDestroy(CUevent event);
CUresult cuStreamDestroy(CUstream stream);

enum { N = 1 << 16, PARTS = 4 };

int main(void) {
    CUdevice device;
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&device, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, device), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CUstream stream;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr dev = 0;
    EXPECT(cuMemAlloc(&dev, N), CUDA_SUCCESS);
    unsigned char *up = malloc(N), *down = calloc(1, N);
    for (size_t i = 0; i < N; i++) up[i] = (unsigned char)(i * 31 + 7);

    CUdeviceptr dsts[PARTS], srcs[PARTS], back_dsts[PARTS], back_srcs[PARTS];
    size_t sizes[PARTS];
    for (int i = 0; i < PARTS; i++) {
        sizes[i] = N / PARTS;
        dsts[i] = dev + i * (N / PARTS);
        srcs[i] = (CUdeviceptr)(uintptr_t)(up + i * (N / PARTS));
        back_dsts[i] = (CUdeviceptr)(uintptr_t)(down + i * (N / PARTS));
        back_srcs[i] = dsts[i];
    }
    CUmemcpyAttributes attrs[2];
    memset(attrs, 0, sizeof attrs);
    size_t starts[2] = {0, 2}, fail = 0;
    EXPECT(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, PARTS, attrs, starts, 2, stream), CUDA_ERROR_INVALID_VALUE);
    attrs[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attrs[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    size_t late[2] = {1, 2};
    EXPECT(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, PARTS, attrs, late, 2, stream), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, PARTS, attrs, starts, 2, CU_STREAM_LEGACY), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, PARTS, attrs, starts, 2, stream), CUDA_SUCCESS);
    // The sources read during the call may change at once.
    memset(up + 2 * (N / PARTS), 0xee, 2 * (N / PARTS));
    EXPECT(cuMemcpyBatchAsync_v2(back_dsts, back_srcs, sizes, PARTS, attrs, starts, 1, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    for (size_t i = 2 * (N / PARTS); i < N; i++) up[i] = (unsigned char)(i * 31 + 7);
    printf("batch round trip: %s\n", memcmp(up, down, N) == 0 ? "equal" : "DIFFERENT");

    // The third copy runs past the allocation: its index comes back.
    size_t too_long[PARTS] = {16, 16, N, 16};
    EXPECT(cuMemcpyBatchAsync(back_dsts, back_srcs, too_long, PARTS, attrs, starts, 1, &fail, stream), CUDA_ERROR_INVALID_VALUE);
    printf("failing copy: %zu\n", fail);

    unsigned int flags = 0;
    EXPECT(cuCtxSetFlags(CU_CTX_SCHED_BLOCKING_SYNC), CUDA_SUCCESS);
    EXPECT(cuCtxGetFlags(&flags), CUDA_SUCCESS);
    printf("context flags read back: %s\n", flags == CU_CTX_SCHED_BLOCKING_SYNC ? "yes" : "no");
    EXPECT(cuCtxSetFlags(0x80000000u), CUDA_ERROR_INVALID_VALUE);
    CUsharedconfig banks = CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE;
    EXPECT(cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE), CUDA_SUCCESS);
    EXPECT(cuCtxGetSharedMemConfig(&banks), CUDA_SUCCESS);
    printf("banks: %s\n", banks == CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE ? "four bytes" : "OTHER");
    EXPECT(cuCtxSetSharedMemConfig((CUsharedconfig)7), CUDA_ERROR_INVALID_VALUE);

    CUevent event;
    EXPECT(cuEventCreate(&event, 0), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(event), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(event), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    EXPECT(cuMemFree(dev), CUDA_SUCCESS);
    free(up);
    free(down);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

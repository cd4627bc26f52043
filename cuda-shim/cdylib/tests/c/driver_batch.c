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
#undef cuMemcpy3DBatchAsync
CUresult cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx, unsigned long long flags,
                              CUstream hStream);
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
                            size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream);
CUresult cuEventDestroy(CUevent event);
CUresult cuStreamDestroy(CUstream stream);

enum { N = 1 << 16, PARTS = 4 };

static int logged_failures = 0;
static void CUDA_CB on_log(void *data, CUlogLevel level, char *message, size_t length) {
    (void)level;
    if (data == &logged_failures && strstr(message, "cuMemAlloc_v2 returned CUDA_ERROR_INVALID_VALUE") && strlen(message) == length)
        logged_failures++;
}

int main(void) {
    CUdevice device;
    use_primary_context(&device);
    CUstream stream = new_stream(CU_STREAM_NON_BLOCKING);
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

    // 3D batches: a box of 16x8x2 words from a host buffer with longer rows into device memory
    // and into an array, then both back into packed host buffers.
    {
        enum { W = 16, H = 8, D = 2, ROW = 20 };
        uint32_t *box = malloc(ROW * H * D * 4), *from_dev = calloc(W * H * D, 4), *from_array = calloc(W * H * D, 4);
        for (int i = 0; i < ROW * H * D; i++) box[i] = (uint32_t)i * 2654435761u;
        CUDA_ARRAY3D_DESCRIPTOR desc = {W, H, D, CU_AD_FORMAT_UNSIGNED_INT32, 1, 0};
        CUarray array;
        EXPECT(cuArray3DCreate(&array, &desc), CUDA_SUCCESS);
        CUDA_MEMCPY3D_BATCH_OP ops[4];
        memset(ops, 0, sizeof ops);
        CUmemcpy3DOperand host_in = {.type = CU_MEMCPY_OPERAND_TYPE_POINTER};
        host_in.op.ptr.ptr = (CUdeviceptr)(uintptr_t)box;
        host_in.op.ptr.rowLength = ROW * 4;
        CUmemcpy3DOperand device = {.type = CU_MEMCPY_OPERAND_TYPE_POINTER};
        device.op.ptr.ptr = dev;
        CUmemcpy3DOperand in_array = {.type = CU_MEMCPY_OPERAND_TYPE_ARRAY};
        in_array.op.array.array = array;
        CUmemcpy3DOperand array_in = host_in;
        array_in.op.ptr.rowLength = ROW;
        ops[0].src = host_in, ops[0].dst = device, ops[0].extent = (CUextent3D){W * 4, H, D};
        ops[1].src = array_in, ops[1].dst = in_array, ops[1].extent = (CUextent3D){W, H, D};
        for (int i = 0; i < 2; i++) ops[i].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        EXPECT(cuMemcpy3DBatchAsync_v2(2, ops, 0, stream), CUDA_SUCCESS);
        CUmemcpy3DOperand dev_out = {.type = CU_MEMCPY_OPERAND_TYPE_POINTER}, arr_out = dev_out;
        dev_out.op.ptr.ptr = (CUdeviceptr)(uintptr_t)from_dev;
        arr_out.op.ptr.ptr = (CUdeviceptr)(uintptr_t)from_array;
        ops[2].src = device, ops[2].dst = dev_out, ops[2].extent = (CUextent3D){W * 4, H, D};
        ops[3].src = in_array, ops[3].dst = arr_out, ops[3].extent = (CUextent3D){W, H, D};
        for (int i = 2; i < 4; i++) ops[i].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        EXPECT(cuMemcpy3DBatchAsync_v2(2, ops + 2, 0, stream), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
        int same = 1;
        for (int z = 0; z < D; z++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    uint32_t want = box[(z * H + y) * ROW + x];
                    same &= from_dev[(z * H + y) * W + x] == want && from_array[(z * H + y) * W + x] == want;
                }
        printf("3D batch through device memory and an array: %s\n", same ? "equal" : "DIFFERENT");
        ops[2].extent.depth = 0;
        EXPECT(cuMemcpy3DBatchAsync(2, ops + 2, &fail, 0, stream), CUDA_ERROR_INVALID_VALUE);
        printf("failing 3D copy: %zu\n", fail);
        EXPECT(cuMemcpy3DBatchAsync_v2(2, ops + 2, 0, CU_STREAM_LEGACY), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuArrayDestroy(array), CUDA_SUCCESS);
        free(box);
        free(from_dev);
        free(from_array);
    }

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

    int supported = -1, sms = 0;
    EXPECT(cuDeviceGetExecAffinitySupport(&supported, CU_EXEC_AFFINITY_TYPE_SM_COUNT, device), CUDA_SUCCESS);
    EXPECT(cuDeviceGetExecAffinitySupport(&supported, (CUexecAffinityType)5, device), CUDA_ERROR_INVALID_VALUE);
    CUexecAffinityParam affinity;
    memset(&affinity, 0, sizeof affinity);
    EXPECT(cuCtxGetExecAffinity(&affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), CUDA_SUCCESS);
    printf("affinity: supported %d, the context's SMs are the device's: %s\n", supported,
           affinity.param.smCount.val == (unsigned)sms ? "yes" : "no");

    unsigned int sync = 1, read_back = 0;
    EXPECT(cuPointerSetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, dev + 64), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&read_back, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, dev), CUDA_SUCCESS);
    printf("sync memops read back: %u\n", read_back);
    EXPECT(cuPointerSetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)(uintptr_t)up), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuPointerSetAttribute(&sync, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev), CUDA_ERROR_INVALID_VALUE);

    // The error log: a failing call reaches a callback and a dump from an iterator.
    CUlogsCallbackHandle handle = NULL;
    CUlogIterator iterator = 0;
    EXPECT(cuLogsRegisterCallback(on_log, &logged_failures, &handle), CUDA_SUCCESS);
    EXPECT(cuLogsCurrent(&iterator, 0), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&dev, 0), CUDA_ERROR_INVALID_VALUE);
    char logged[4096];
    size_t logged_size = sizeof logged;
    EXPECT(cuLogsDumpToMemory(&iterator, logged, &logged_size, 0), CUDA_SUCCESS);
    printf("log: callback saw the failure %d time(s); the dump holds it: %s\n", logged_failures,
           strstr(logged, "cuMemAlloc_v2 returned CUDA_ERROR_INVALID_VALUE") && logged_size == strlen(logged) ? "yes" : "no");
    logged_size = sizeof logged;
    EXPECT(cuLogsDumpToMemory(&iterator, logged, &logged_size, 0), CUDA_SUCCESS);
    printf("log: nothing new after the iterator: %s\n", logged_size == 0 ? "yes" : "no");
    EXPECT(cuLogsUnregisterCallback(handle), CUDA_SUCCESS);
    EXPECT(cuLogsUnregisterCallback(handle), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLogsCurrent(&iterator, 1), CUDA_ERROR_INVALID_VALUE);

    CUevent event;
    EXPECT(cuEventCreate(&event, 0), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(event), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(event), CUDA_ERROR_INVALID_HANDLE);
    RELEASE(STREAM(stream), MEMORY(dev));
    free(up);
    free(down);
    return finish();
}

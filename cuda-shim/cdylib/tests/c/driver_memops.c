// Stream memory operations, tensor maps, stream and peer queries, peer copies, pool access and
// context events through Flyt's libcuda.so.1 on the emulated device (no kernels): writes land
// at submission and read back, satisfied waits pass, a wait no earlier write satisfied fails
// at the call (never passes), flushes of remote writes and tensor-map
// encoding are refused clearly, and the one-device answers match the driver's.
#include <stdint.h>
#include <string.h>

#include "driver_expect.h"

// Batch operations: a 32- or 64-bit write of `value`, a 32-bit wait for `value` under `flags`
// (CU_STREAM_WAIT_VALUE_*), a memory barrier.
static CUstreamBatchMemOpParams write_op(CUdeviceptr address, cuuint64_t value, int bits) {
    CUstreamBatchMemOpParams op;
    memset(&op, 0, sizeof op);
    op.writeValue.operation = bits == 64 ? CU_STREAM_MEM_OP_WRITE_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = address;
    if (bits == 64) op.writeValue.value64 = value;
    else op.writeValue.value = (cuuint32_t)value;
    return op;
}

static CUstreamBatchMemOpParams wait_op(CUdeviceptr address, cuuint32_t value, unsigned int flags) {
    CUstreamBatchMemOpParams op;
    memset(&op, 0, sizeof op);
    op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    op.waitValue.address = address;
    op.waitValue.value = value;
    op.waitValue.flags = flags;
    return op;
}

static CUstreamBatchMemOpParams barrier_op(unsigned int flags) {
    CUstreamBatchMemOpParams op;
    memset(&op, 0, sizeof op);
    op.memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
    op.memoryBarrier.flags = flags;
    return op;
}

static void stream_memory_operations(CUstream stream, CUdeviceptr d) {
    int attr64 = -1, nor = -1, flush = -1;
    EXPECT(cuDeviceGetAttribute(&attr64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&nor, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&flush, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, 0), CUDA_SUCCESS);
    CHECK("memop attributes 64-bit, NOR, no flush", attr64 == 1 && nor == 1 && flush == 0);

    EXPECT(cuMemsetD8(d, 0, 64), CUDA_SUCCESS);
    EXPECT(cuStreamWriteValue32(stream, d, 0x11223344u, 0), CUDA_SUCCESS);
    EXPECT(cuStreamWriteValue64(stream, d + 8, 0x0102030405060708ull, 0), CUDA_SUCCESS);
    // The v1 form (what cuda.h before 12.0 named cuStreamWriteValue32) takes NO_MEMORY_BARRIER; the
    // v2 form refuses it.
    void *v1 = NULL;
    CUdriverProcAddressQueryResult found;
    EXPECT(cuGetProcAddress("cuStreamWriteValue32", &v1, 11000, 0, &found), CUDA_SUCCESS);
    if (v1 != NULL) {
        CUresult (*write_v1)(CUstream, CUdeviceptr, cuuint32_t, unsigned) = (CUresult(*)(CUstream, CUdeviceptr, cuuint32_t, unsigned))v1;
        EXPECT(write_v1(stream, d + 16, 5, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER), CUDA_SUCCESS);
    }
    EXPECT(cuStreamWriteValue32_v2(stream, d + 20, 6, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamWaitValue32(stream, d, 0x11223344u, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
    EXPECT(cuStreamWaitValue32_v2(stream, d, 0x11223300u, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    EXPECT(cuStreamWaitValue64(stream, d + 8, 0x8, CU_STREAM_WAIT_VALUE_AND), CUDA_SUCCESS);
    EXPECT(cuStreamWaitValue64_v2(stream, d + 24, 0, CU_STREAM_WAIT_VALUE_NOR), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    uint32_t words[6] = {0};
    EXPECT(cuMemcpyDtoH(words, d, sizeof words), CUDA_SUCCESS);
    uint64_t wide = (uint64_t)words[3] << 32 | words[2];
    CHECK("32- and 64-bit writes read back", words[0] == 0x11223344u && wide == 0x0102030405060708ull && words[4] == 5);

    // Checked at the call: alignment, the session's memory, flags; flushes are refused.
    EXPECT(cuStreamWriteValue32(stream, d + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamWriteValue64(stream, d + 4, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamWriteValue32(stream, 0xdead0000, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamWaitValue32(stream, d, 1, 7), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamWaitValue32(stream, d, 1, CU_STREAM_WAIT_VALUE_FLUSH), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuStreamWriteValue32((CUstream)(uintptr_t)0x777, d, 1, 0), CUDA_ERROR_INVALID_HANDLE);

    // A batch: write, GPU barrier, 64-bit write, a wait the writes satisfy.
    CUstreamBatchMemOpParams ops[4] = {write_op(d + 32, 77, 32), barrier_op(CU_STREAM_MEMORY_BARRIER_TYPE_GPU),
                                       write_op(d + 40, 0xfeedfacecafebeefull, 64), wait_op(d + 32, 77, CU_STREAM_WAIT_VALUE_EQ)};
    EXPECT(cuStreamBatchMemOp_v2(stream, 4, ops, 0), CUDA_SUCCESS);
    EXPECT(cuStreamBatchMemOp_v2(stream, 4, ops, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamBatchMemOp_v2(stream, 256, ops, 0), CUDA_ERROR_INVALID_VALUE);
    // Barriers are v2 only.
    void *batch_v1 = NULL;
    EXPECT(cuGetProcAddress("cuStreamBatchMemOp", &batch_v1, 11000, 0, &found), CUDA_SUCCESS);
    if (batch_v1 != NULL) {
        CUresult (*v1_batch)(CUstream, unsigned, CUstreamBatchMemOpParams *, unsigned) =
            (CUresult(*)(CUstream, unsigned, CUstreamBatchMemOpParams *, unsigned))batch_v1;
        EXPECT(v1_batch(stream, 2, ops, 0), CUDA_ERROR_INVALID_VALUE);
    }
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    uint64_t batch[2] = {0};
    EXPECT(cuMemcpyDtoH(batch, d + 32, sizeof batch), CUDA_SUCCESS);
    CHECK("batch writes read back", (uint32_t)batch[0] == 77 && batch[1] == 0xfeedfacecafebeefull);

    // 77 >= 78 does not hold, and nothing could ever make it: refused at the call, and the write
    // behind it in the batch does not happen.
    CUstreamBatchMemOpParams never[2] = {wait_op(d + 32, 78, CU_STREAM_WAIT_VALUE_GEQ), write_op(d + 32, 99, 32)};
    CUresult reported = cuStreamBatchMemOp(stream, 2, never, 0);
    uint32_t after = 0;
    EXPECT(cuMemcpyDtoH(&after, d + 32, 4), CUDA_SUCCESS);
    CHECK("an unsatisfiable wait fails at the call", reported == CUDA_ERROR_NOT_SUPPORTED && after == 77);
    EXPECT(cuStreamWaitValue32(stream, d + 32, 100, CU_STREAM_WAIT_VALUE_EQ), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);

    // Mapped pinned memory (shared pages with the channel, mirrored without it): the host sees
    // the stream's write after a sync, and a wait sees the host's write made before it.
    volatile uint32_t *flag = NULL;
    EXPECT(cuMemHostAlloc((void **)&flag, 4096, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    if (flag != NULL) {
        CUdeviceptr flag_device = 0;
        EXPECT(cuMemHostGetDevicePointer(&flag_device, (void *)flag, 0), CUDA_SUCCESS);
        flag[0] = 0;
        EXPECT(cuStreamWriteValue32(stream, flag_device, 42, 0), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
        CHECK("a write to mapped pinned memory seen by the host", flag[0] == 42);
        flag[1] = 9;
        EXPECT(cuStreamWaitValue32(stream, flag_device + 4, 9, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
        EXPECT(cuMemFreeHost((void *)flag), CUDA_SUCCESS);
    }
}

static void tensor_maps(CUdeviceptr d) {
    CUtensorMap map;
    cuuint64_t dims[2] = {16, 16};
    cuuint64_t strides[1] = {64};
    cuuint32_t box[2] = {8, 8};
    cuuint32_t element_strides[2] = {1, 1};
    EXPECT(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 0, (void *)d, dims, strides, box, element_strides,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuTensorMapEncodeTiled(NULL, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)d, dims, strides, box, element_strides,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           CUDA_ERROR_INVALID_VALUE);
    // Not the session's memory.
    EXPECT(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)(uintptr_t)0xdead0000, dims, strides, box,
                                  element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           CUDA_ERROR_INVALID_VALUE);
    // The emulated device has no driver to encode the GPU's format: refused, never faked.
    EXPECT(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)d, dims, strides, box, element_strides,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           CUDA_ERROR_NOT_SUPPORTED);
    cuuint64_t dims4[4] = {8, 4, 4, 2};
    cuuint64_t strides4[3] = {32, 128, 512};
    cuuint32_t estrides4[4] = {1, 1, 1, 1};
    int lower[2] = {0, 0}, upper[2] = {0, 0};
    EXPECT(cuTensorMapEncodeIm2col(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)d, dims, strides, lower, upper, 8, 16,
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                   CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuTensorMapEncodeIm2col(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, (void *)d, dims4, strides4, lower, upper, 8, 16,
                                   estrides4, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                   CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           CUDA_ERROR_NOT_SUPPORTED);
    // A map the server did not encode has no known extent.
    memset(&map, 0, sizeof map);
    EXPECT(cuTensorMapReplaceAddress(&map, (void *)d), CUDA_ERROR_INVALID_VALUE);
    printf("tensor maps refused on the emulated device: yes\n");
}

static void streams_and_peers(CUcontext ctx, CUstream stream, CUdeviceptr d) {
    CUdevice dev = -1, dev_null = -1;
    EXPECT(cuStreamGetDevice(stream, &dev), CUDA_SUCCESS);
    EXPECT(cuStreamGetDevice(CU_STREAM_PER_THREAD, &dev_null), CUDA_SUCCESS);
    CHECK("streams on device 0", dev == 0 && dev_null == 0);
    CUcontext got = NULL, got_null = NULL, got_v2 = NULL;
    CUgreenCtx green = (CUgreenCtx)(uintptr_t)1;
    EXPECT(cuStreamGetCtx(stream, &got), CUDA_SUCCESS);
    EXPECT(cuStreamGetCtx(CU_STREAM_LEGACY, &got_null), CUDA_SUCCESS);
    EXPECT(cuStreamGetCtx_v2(stream, &got_v2, &green), CUDA_SUCCESS);
    CHECK("stream contexts", got == ctx && got_null == ctx && got_v2 == ctx && green == NULL);
    EXPECT(cuStreamGetCtx((CUstream)(uintptr_t)0x777, &got), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamGetDevice(stream, NULL), CUDA_ERROR_INVALID_VALUE);

    int can = -1;
    EXPECT(cuDeviceCanAccessPeer(&can, 0, 0), CUDA_SUCCESS);
    CHECK("a device is not its own peer", can == 0);
    EXPECT(cuDeviceCanAccessPeer(&can, 0, 1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuCtxEnablePeerAccess(ctx, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    EXPECT(cuCtxEnablePeerAccess(ctx, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuCtxEnablePeerAccess((CUcontext)(uintptr_t)0x777, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxDisablePeerAccess(ctx), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);

    // Peer copies within the one device.
    unsigned char src[256], dst[256];
    for (int i = 0; i < 256; i++) src[i] = (unsigned char)(i * 7 + 3);
    EXPECT(cuMemcpyHtoD(d, src, sizeof src), CUDA_SUCCESS);
    EXPECT(cuMemcpyPeer(d + 1024, ctx, d, ctx, 256), CUDA_SUCCESS);
    EXPECT(cuMemcpyPeerAsync(d + 2048, ctx, d + 1024, ctx, 256, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(dst, d + 2048, sizeof dst), CUDA_SUCCESS);
    CHECK("peer copies within the device", memcmp(src, dst, sizeof src) == 0);
    EXPECT(cuMemcpyPeer(d + 1024, (CUcontext)(uintptr_t)0x777, d, ctx, 256), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuMemcpyPeer(d + 1024, ctx, (CUdeviceptr)(uintptr_t)src, ctx, 256), CUDA_ERROR_INVALID_VALUE);

    // Context events.
    CUevent event;
    EXPECT(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    EXPECT(cuCtxRecordEvent(ctx, event), CUDA_SUCCESS);
    EXPECT(cuEventSynchronize(event), CUDA_SUCCESS);
    EXPECT(cuCtxWaitEvent(ctx, event), CUDA_SUCCESS);
    EXPECT(cuCtxRecordEvent(ctx, (CUevent)(uintptr_t)0x777), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuEventDestroy(event), CUDA_SUCCESS);
}

static void pools(void) {
    CUmemoryPool device_default, by_location, current, created;
    CUmemLocation dev0 = mem_location(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemLocation dev1 = mem_location(CU_MEM_LOCATION_TYPE_DEVICE, 1);
    CUmemLocation host = mem_location(CU_MEM_LOCATION_TYPE_HOST, 0);
    EXPECT(cuDeviceGetDefaultMemPool(&device_default, 0), CUDA_SUCCESS);
    EXPECT(cuMemGetDefaultMemPool(&by_location, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_SUCCESS);
    CHECK("location default pool is the device's", by_location == device_default);
    EXPECT(cuMemGetDefaultMemPool(&by_location, &dev1, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuMemGetDefaultMemPool(&by_location, &host, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemGetDefaultMemPool(&by_location, &dev0, CU_MEM_ALLOCATION_TYPE_MANAGED), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemGetDefaultMemPool(&by_location, &dev0, CU_MEM_ALLOCATION_TYPE_INVALID), CUDA_ERROR_INVALID_VALUE);

    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location = dev0;
    EXPECT(cuMemPoolCreate(&created, &props), CUDA_SUCCESS);
    EXPECT(cuMemSetMemPool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, created), CUDA_SUCCESS);
    EXPECT(cuMemGetMemPool(&current, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_SUCCESS);
    CHECK("set pool is current", current == created);
    EXPECT(cuDeviceGetMemPool(&current, 0), CUDA_SUCCESS);
    CHECK("the device agrees", current == created);
    EXPECT(cuMemSetMemPool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, device_default), CUDA_SUCCESS);

    CUmemAccess_flags flags = (CUmemAccess_flags)-1;
    EXPECT(cuMemPoolGetAccess(&flags, created, &dev0), CUDA_SUCCESS);
    CHECK("a pool's device reads and writes it", flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CUmemAccessDesc desc = {dev0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT(cuMemPoolSetAccess(created, &desc, 1), CUDA_SUCCESS);
    desc.location = dev1;
    EXPECT(cuMemPoolSetAccess(created, &desc, 1), CUDA_ERROR_INVALID_DEVICE);
    desc.location = dev0;
    desc.flags = (CUmemAccess_flags)5;
    EXPECT(cuMemPoolSetAccess(created, &desc, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolGetAccess(&flags, created, &host), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolDestroy(created), CUDA_SUCCESS);
}

int main(void) {
    CUcontext ctx = use_primary_context(NULL);
    CUstream stream;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr d = 0;
    EXPECT(cuMemAlloc(&d, 1 << 16), CUDA_SUCCESS);
    stream_memory_operations(stream, d);
    tensor_maps(d);
    streams_and_peers(ctx, stream, d);
    pools();
    EXPECT(cuMemFree(d), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    return finish();
}

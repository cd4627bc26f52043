// What NVIDIA's libraries ask of the driver beyond kernels, over Flyt's libcuda.so.1 against the
// emulated device (host memory): pitched 2D copies (cublasSetMatrix, the static runtime's
// host-to-host cudaMemcpy), stream ids, pointer attributes as cudaPointerGetAttributes asks for
// them, and the private ToolsContext/ToolsModule/runtime-log entries cuBLAS, cuSOLVER, cuFFT and
// the runtime call (their meanings measured on the real driver by gpu-tests/probes).
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

// Counts a failure, saying where, unless `condition` holds (nothing printed when it does).
#define EXPECT_TRUE(what, condition) FAIL_WHEN(!(condition), "FAIL line %d: %s\n", __LINE__, what)

static const CUuuid TOOLS_CONTEXT = {{0x21, 0x31, (char)0x8c, 0x60, (char)0x97, 0x14, 0x32, 0x48, (char)0x8c, (char)0xa6, 0x41,
                                      (char)0xff, 0x73, 0x24, (char)0xc8, (char)0xf2}};
static const CUuuid TOOLS_MODULE = {{0x6e, 0x16, 0x3f, (char)0xbe, (char)0xb9, 0x58, 0x44, 0x4d, (char)0x83, 0x5c, (char)0xe1,
                                     (char)0x82, (char)0xaf, (char)0xf1, (char)0x99, 0x1e}};
static const CUuuid RUNTIME_LOG = {{(char)0xf8, (char)0xcf, (char)0xf9, 0x51, 0x21, 0x46, (char)0x8b, 0x4e, (char)0xb9, (char)0xe2,
                                    (char)0xfb, 0x46, (char)0x9e, 0x7c, 0x0d, (char)0xd9}};

typedef CUresult (*context_kind_fn)(CUcontext, uint64_t *);
typedef CUresult (*stream_object_fn)(CUcontext, CUstream, void **, unsigned);
typedef CUresult (*stream_id_fn)(CUcontext, void *, uint64_t *);
typedef void (*visit_fn)(void *, CUfunction, const char *);
typedef size_t (*each_function_fn)(CUcontext, CUmodule, visit_fn, void *);
typedef CUresult (*log_fn)(const char *, int, const char *, void *);

static int visits;
static void visit(void *opaque, CUfunction function, const char *name) {
    (void)opaque, (void)function, (void)name;
    visits++;
}

// A rectangle of `rows` x `width` bytes at `pitch`, filled with a pattern that names each byte.
static void fill(unsigned char *p, size_t rows, size_t width, size_t pitch, unsigned char salt) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < pitch; c++) p[r * pitch + c] = c < width ? (unsigned char)(r * 31 + c + salt) : 0xee;
}

static int same_rect(const unsigned char *a, size_t a_pitch, const unsigned char *b, size_t b_pitch, size_t rows, size_t width) {
    for (size_t r = 0; r < rows; r++)
        if (memcmp(a + r * a_pitch, b + r * b_pitch, width)) return 0;
    return 1;
}

int main(void) {
    CUdevice device;
    CUcontext context = use_primary_context(&device);

    // Pitched copies: host (pitch 24) -> device (pitch 32) -> host (pitch 20), device -> device
    // (pitch 40), and contiguous rectangles in one piece; the bytes between rows stay untouched.
    enum { ROWS = 9, WIDTH = 17 };
    unsigned char src[ROWS * 24], back[ROWS * 20], again[ROWS * 20], flat[ROWS * WIDTH], host_copy[ROWS * 28];
    fill(src, ROWS, WIDTH, 24, 3);
    memset(back, 0x55, sizeof back);
    memset(again, 0x66, sizeof again);
    CUdeviceptr pitched = 0, other = 0, contiguous = 0;
    EXPECT(cuMemAlloc(&pitched, ROWS * 32), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&other, ROWS * 40), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&contiguous, ROWS * WIDTH), CUDA_SUCCESS);
    CUDA_MEMCPY2D c = copy_2d(host_side(src, 24, 0), device_side(pitched, 32, 0), WIDTH, ROWS);
    EXPECT(cuMemcpy2D(&c), CUDA_SUCCESS);
    c = copy_2d(device_side(pitched, 32, 0), host_side(back, 20, 0), WIDTH, ROWS);
    EXPECT(cuMemcpy2D(&c), CUDA_SUCCESS);
    EXPECT_TRUE("host -> device -> host rectangle", same_rect(src, 24, back, 20, ROWS, WIDTH));
    EXPECT_TRUE("bytes past the width untouched", back[WIDTH] == 0x55 && back[19] == 0x55);
    CUstream stream;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    c = copy_2d(unified_side(pitched, 32), unified_side(other, 40), WIDTH, ROWS);
    EXPECT(cuMemcpy2DAsync(&c, stream), CUDA_SUCCESS);
    c = copy_2d(device_side(other, 40, 0), host_side(again, 20, 0), WIDTH, ROWS);
    EXPECT(cuMemcpy2DAsync(&c, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT_TRUE("device -> device rectangle, async", same_rect(src, 24, again, 20, ROWS, WIDTH));
    c = copy_2d(device_side(pitched, 32, 0), device_side(contiguous, WIDTH, 0), WIDTH, ROWS);
    EXPECT(cuMemcpy2DUnaligned(&c), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(flat, contiguous, sizeof flat), CUDA_SUCCESS);
    EXPECT_TRUE("pitched -> contiguous", same_rect(src, 24, flat, WIDTH, ROWS, WIDTH));
    // An offset sub-rectangle: rows 2.. and columns 5.. of the source.
    unsigned char sub[4 * 6];
    c = copy_2d(box_at(device_side(pitched, 32, 0), 5, 2, 0), host_side(sub, 6, 0), 6, 4);
    EXPECT(cuMemcpy2D(&c), CUDA_SUCCESS);
    EXPECT_TRUE("sub-rectangle", same_rect(src + 2 * 24 + 5, 24, sub, 6, 4, 6));
    // Host to host (the static runtime's cudaMemcpy with cudaMemcpyHostToHost takes this path).
    c = copy_2d(host_side(src, 24, 0), host_side(host_copy, 28, 0), WIDTH, ROWS);
    EXPECT(cuMemcpy2DUnaligned(&c), CUDA_SUCCESS);
    EXPECT_TRUE("host -> host rectangle", same_rect(src, 24, host_copy, 28, ROWS, WIDTH));
    // Refused: a pitch narrower than a row, a device side that is host memory, an unknown array, NULL.
    c = copy_2d(host_side(src, 8, 0), device_side(pitched, 32, 0), WIDTH, ROWS);
    EXPECT(cuMemcpy2D(&c), CUDA_ERROR_INVALID_VALUE);
    c = copy_2d(host_side(src, 24, 0), device_side((CUdeviceptr)(size_t)back, 32, 0), WIDTH, ROWS);
    EXPECT(cuMemcpy2D(&c), CUDA_ERROR_INVALID_VALUE);
    c = copy_2d(host_side(src, 24, 0), array_side((CUarray)(size_t)0x1000), WIDTH, ROWS);
    EXPECT(cuMemcpy2D(&c), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpy2D(NULL), CUDA_ERROR_INVALID_VALUE);

    // Pointer attributes as the static runtime's cudaPointerGetAttributes asks for them: device
    // memory has no host pointer, which is NULL among several attributes and an error alone.
    CUpointer_attribute attributes[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                         CU_POINTER_ATTRIBUTE_HOST_POINTER};
    unsigned int memory_type = 0;
    CUdeviceptr device_pointer = 0;
    void *host_pointer = (void *)1;
    void *data[3] = {&memory_type, &device_pointer, &host_pointer};
    EXPECT(cuPointerGetAttributes(3, attributes, data, pitched + 4), CUDA_SUCCESS);
    EXPECT_TRUE("memory type", memory_type == CU_MEMORYTYPE_DEVICE);
    EXPECT_TRUE("device pointer", device_pointer == pitched + 4);
    EXPECT_TRUE("host pointer of device memory", host_pointer == NULL);
    // Buffer ids (cuFFT asks): the same for a block's interior, different across blocks.
    unsigned long long id_a = 0, id_b = 0, id_c = 0;
    EXPECT(cuPointerGetAttribute(&id_a, CU_POINTER_ATTRIBUTE_BUFFER_ID, pitched), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&id_b, CU_POINTER_ATTRIBUTE_BUFFER_ID, pitched + 100), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&id_c, CU_POINTER_ATTRIBUTE_BUFFER_ID, other), CUDA_SUCCESS);
    EXPECT_TRUE("buffer ids", id_a != 0 && id_a == id_b && id_a != id_c);
    // CUDA IPC (between sessions on one GPU) exports cuMemAlloc and cuMemAllocPitch memory, not
    // pool allocations, as natively.
    unsigned int ipc = 0;
    EXPECT(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, pitched + 8), CUDA_SUCCESS);
    EXPECT_TRUE("pitched memory is CUDA IPC capable", ipc == 1);
    ipc = 0;
    EXPECT(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, other), CUDA_SUCCESS);
    EXPECT_TRUE("cuMemAlloc memory is CUDA IPC capable", ipc == 1);
    CUdeviceptr pooled = 0;
    EXPECT(cuMemAllocAsync(&pooled, 4096, NULL), CUDA_SUCCESS);
    ipc = 1;
    EXPECT(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, pooled), CUDA_SUCCESS);
    EXPECT_TRUE("a pool allocation is not CUDA IPC capable", ipc == 0);
    EXPECT(cuMemFreeAsync(pooled, NULL), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&host_pointer, CU_POINTER_ATTRIBUTE_HOST_POINTER, pitched), CUDA_ERROR_INVALID_VALUE);

    // Memsets of 2- and 4-byte elements whose bytes differ (PyTorch's fill_ of a half or int
    // tensor), synchronous and on a stream; misaligned ones are refused.
    CUdeviceptr pattern_buffer = 0;
    unsigned char pattern_back[64];
    EXPECT(cuMemAlloc(&pattern_buffer, sizeof pattern_back), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(pattern_buffer, 0xee, sizeof pattern_back), CUDA_SUCCESS);
    EXPECT(cuMemsetD16(pattern_buffer + 2, 0x3c01, 5), CUDA_SUCCESS);
    EXPECT(cuMemsetD32Async(pattern_buffer + 16, 0xdeadbeef, 3, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(pattern_back, pattern_buffer, sizeof pattern_back), CUDA_SUCCESS);
    int pattern_ok = pattern_back[0] == 0xee && pattern_back[1] == 0xee && pattern_back[12] == 0xee && pattern_back[28] == 0xee;
    for (int i = 0; i < 5; i++) pattern_ok &= pattern_back[2 + 2 * i] == 0x01 && pattern_back[3 + 2 * i] == 0x3c;
    for (int i = 0; i < 3; i++) {
        unsigned int word;
        memcpy(&word, pattern_back + 16 + 4 * i, 4);
        pattern_ok &= word == 0xdeadbeef;
    }
    EXPECT_TRUE("16- and 32-bit patterns", pattern_ok);
    EXPECT(cuMemsetD32(pattern_buffer + 2, 0x01020304, 2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemsetD16(pattern_buffer + 1, 0x0102, 2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree(pattern_buffer), CUDA_SUCCESS);

    // Pinned host memory: over the shared-memory channel the server maps it at the app's address
    // (unified addressing), so it has a device pointer, its own address; over a socket alone the
    // GPU cannot reach it, and mapped memory is mirrored device memory.
    const char *shm = getenv("FLYT_SHM");
    int channel = shm && strcmp(shm, "on") == 0;
    void *mapped = NULL, *pinned = NULL;
    CUdeviceptr mapped_device = 0;
    EXPECT(cuMemAllocHost(&pinned, 4096), CUDA_SUCCESS);
    // Mapped memory: shared pages with the channel, mirrored device memory without it; either
    // way its device pointer is its host address.
    EXPECT(cuMemHostAlloc(&mapped, 3 * 4096 + 5, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    EXPECT(cuMemHostGetDevicePointer(&mapped_device, (char *)mapped + 4100, 0), CUDA_SUCCESS);
    EXPECT_TRUE("mapped memory's device pointer is its host address", mapped_device == (CUdeviceptr)(size_t)mapped + 4100);
    EXPECT(cuPointerGetAttribute(&mapped_device, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (CUdeviceptr)(size_t)mapped + 8), CUDA_SUCCESS);
    EXPECT_TRUE("its device pointer attribute", mapped_device == (CUdeviceptr)(size_t)mapped + 8);
    EXPECT(cuMemHostGetDevicePointer(&mapped_device, mapped, 1), CUDA_ERROR_INVALID_VALUE);
    // A device write (a memset at the device pointer) reaches the host at the next sync, and the
    // host's own writes elsewhere in the block survive it.
    memset(mapped, 7, 3 * 4096 + 5);
    EXPECT(cuMemsetD8((CUdeviceptr)(size_t)mapped + 4100, 0x5a, 16), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    const unsigned char *bytes = mapped;
    EXPECT_TRUE("the device's write seen by the host", bytes[4100] == 0x5a && bytes[4115] == 0x5a);
    EXPECT_TRUE("the host's writes around it kept", bytes[4099] == 7 && bytes[4116] == 7 && bytes[3 * 4096 + 4] == 7);
    // A blocking copy waits for the work before it: a device write queued before it is seen after it.
    unsigned char word[4];
    CUdeviceptr scratch = 0;
    EXPECT(cuMemAlloc(&scratch, 4), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async((CUdeviceptr)(size_t)mapped + 200, 0x33, 4, NULL), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(word, scratch, 4), CUDA_SUCCESS);
    EXPECT_TRUE("a device write seen after a blocking copy", bytes[200] == 0x33 && bytes[203] == 0x33);
    EXPECT(cuMemFree(scratch), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(mapped), CUDA_SUCCESS);
    EXPECT(cuMemHostGetDevicePointer(&mapped_device, mapped, 0), CUDA_ERROR_INVALID_VALUE);
    if (channel) {
        EXPECT(cuMemHostGetDevicePointer(&mapped_device, pinned, 0), CUDA_SUCCESS);
        EXPECT_TRUE("all pinned memory is mapped, as under unified addressing", mapped_device == (CUdeviceptr)(size_t)pinned);
    } else {
        EXPECT(cuMemHostGetDevicePointer(&mapped_device, pinned, 0), CUDA_ERROR_INVALID_VALUE);
    }
    EXPECT(cuMemHostGetDevicePointer(&mapped_device, src, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFreeHost(pinned), CUDA_SUCCESS);

    // Stream ids: unique per stream, the legacy stream's too.
    CUstream second;
    EXPECT(cuStreamCreate(&second, 0), CUDA_SUCCESS);
    unsigned long long legacy_id = 0, null_id = 0, stream_id = 0, second_id = 0, per_thread_id = 0;
    EXPECT(cuStreamGetId(CU_STREAM_LEGACY, &legacy_id), CUDA_SUCCESS);
    EXPECT(cuStreamGetId(NULL, &null_id), CUDA_SUCCESS);
    EXPECT(cuStreamGetId(stream, &stream_id), CUDA_SUCCESS);
    EXPECT(cuStreamGetId(second, &second_id), CUDA_SUCCESS);
    EXPECT(cuStreamGetId(CU_STREAM_PER_THREAD, &per_thread_id), CUDA_SUCCESS);
    EXPECT_TRUE("NULL is the legacy stream", null_id == legacy_id);
    EXPECT_TRUE("stream ids differ", legacy_id != stream_id && stream_id != second_id && second_id != legacy_id && per_thread_id != legacy_id &&
                                   per_thread_id != stream_id);
    EXPECT(cuStreamGetId((CUstream)(size_t)0x777777, &stream_id), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamGetId(stream, NULL), CUDA_ERROR_INVALID_VALUE);

    // ToolsContext: entry 4 says what kind a context is (1 primary, 2 created, 0 for NULL); entry
    // 51 gives a stream's object (the same one each time) and entry 39 its id, as cuStreamGetId.
    const void **tools = NULL;
    EXPECT(cuGetExportTable((const void **)&tools, &TOOLS_CONTEXT), CUDA_SUCCESS);
    EXPECT_TRUE("ToolsContext size word", tools && (size_t)tools[0] == 93 * 8);
    uint64_t kind = 0;
    EXPECT(((context_kind_fn)tools[4])(context, &kind), CUDA_SUCCESS);
    EXPECT_TRUE("the primary context's kind", kind == 1);
    CUcontext created;
    EXPECT(cuCtxCreate(&created, NULL, 0, device), CUDA_SUCCESS);
    EXPECT(((context_kind_fn)tools[4])(created, &kind), CUDA_SUCCESS);
    EXPECT_TRUE("a created context's kind", kind == 2);
    EXPECT(cuCtxDestroy(created), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(context), CUDA_SUCCESS);
    EXPECT(((context_kind_fn)tools[4])(NULL, &kind), CUDA_SUCCESS);
    EXPECT_TRUE("NULL's kind", kind == 0);
    void *object = NULL, *object_again = NULL, *legacy_object = NULL;
    EXPECT(((stream_object_fn)tools[51])(context, stream, &object, 0), CUDA_SUCCESS);
    EXPECT(((stream_object_fn)tools[51])(context, stream, &object_again, 0), CUDA_SUCCESS);
    EXPECT(((stream_object_fn)tools[51])(context, NULL, &legacy_object, 0), CUDA_SUCCESS);
    EXPECT_TRUE("one object per stream", object && object == object_again && legacy_object && legacy_object != object);
    EXPECT_TRUE("object begins as the driver's", object && ((uint64_t *)object)[0] == 1 && ((uint64_t *)object)[5] == 1);
    uint64_t id = 0;
    EXPECT(((stream_id_fn)tools[39])(context, object, &id), CUDA_SUCCESS);
    EXPECT_TRUE("entry 39 is cuStreamGetId", id == stream_id);
    EXPECT(((stream_id_fn)tools[39])(context, legacy_object, &id), CUDA_SUCCESS);
    EXPECT_TRUE("entry 39 of the legacy stream", id == legacy_id);
    uint64_t not_an_object[9] = {1, 0, 0, 0, 0, 1, 0, 0, 5};
    EXPECT(((stream_id_fn)tools[39])(context, not_an_object, &id), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(((stream_object_fn)tools[51])(context, (CUstream)(size_t)0x777777, &object, 0), CUDA_ERROR_INVALID_HANDLE);

    // ToolsModule entry 7 visits a module's kernels; the emulated device loads no code, so it
    // visits none and answers 0, as do the public enumerations' errors.
    const void **module_tools = NULL;
    EXPECT(cuGetExportTable((const void **)&module_tools, &TOOLS_MODULE), CUDA_SUCCESS);
    static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { ret; }\n";
    CUmodule module = NULL;
    CUresult loaded = cuModuleLoadData(&module, ptx);
    EXPECT_TRUE("the emulated device loads no code", loaded != CUDA_SUCCESS);
    CUlibrary library = NULL;
    EXPECT(cuLibraryLoadData(&library, ptx, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
    unsigned int count = 99;
    EXPECT(cuLibraryGetKernelCount(&count, library), loaded);
    EXPECT_TRUE("no count written on error", count == 99);
    CUmodule library_module = NULL;
    EXPECT(cuLibraryGetModule(&library_module, library), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunctionCount(&count, library_module), loaded);
    CUfunction functions[4];
    EXPECT(cuModuleEnumerateFunctions(functions, 4, library_module), loaded);
    visits = 0;
    size_t visited = ((each_function_fn)module_tools[7])(context, library_module, visit, NULL);
    EXPECT_TRUE("no kernels visited", visited == 0 && visits == 0);
    EXPECT(cuModuleGetFunctionCount(&count, (CUmodule)(size_t)0x5678), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuLibraryUnload(library), CUDA_SUCCESS);

    // The runtime's error log takes a message and answers success.
    const void **log = NULL;
    EXPECT(cuGetExportTable((const void **)&log, &RUNTIME_LOG), CUDA_SUCCESS);
    EXPECT(((log_fn)log[1])("CUDA", 0, "invalid device ordinal %d", NULL), CUDA_SUCCESS);

    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(second), CUDA_SUCCESS);
    EXPECT(cuMemFree(pitched), CUDA_SUCCESS);
    EXPECT(cuMemFree(other), CUDA_SUCCESS);
    EXPECT(cuMemFree(contiguous), CUDA_SUCCESS);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

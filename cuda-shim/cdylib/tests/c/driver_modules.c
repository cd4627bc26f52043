// The driver API's module, kernel and launch entry points over Flyt's libcuda.so.1 against the
// emulated device, which loads no GPU code: every path that needs code must fail with the driver's
// error at the call (never a silent success), and everything answered in the process (lazy library
// loads, handles, capture state, pointer attributes, address ranges, priorities) must be right.
// Built against CUDA 13's cuda.h and linked with -lcuda (Flyt's, found on LD_LIBRARY_PATH).
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

#define EXPECT_ERROR(call)                                                                          \
    do {                                                                                            \
        CUresult got_ = (call);                                                                     \
        if (got_ == CUDA_SUCCESS) {                                                                 \
            printf("FAIL line %d: %s succeeded on a device that loads no code\n", __LINE__, #call); \
            failures++;                                                                             \
        } else {                                                                                    \
            printf("%s: %s\n", #call, name_of(got_));                                               \
        }                                                                                           \
    } while (0)

#define CHECK_EQ(what, got, want)                                                                   \
    do {                                                                                            \
        if ((got) != (want)) {                                                                      \
            printf("FAIL line %d: %s = %lld, expected %lld\n", __LINE__, what, (long long)(got),    \
                   (long long)(want));                                                              \
            failures++;                                                                             \
        }                                                                                           \
    } while (0)

static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                          ".visible .entry k(.param .u64 p) { ret; }\n";

// The same kernel padded to 320 KiB with comment lines: large enough that Flyt offers it to the
// server's image cache by digest before sending its bytes.
static char *large_ptx(void) {
    const size_t size = 320 << 10;
    char *text = malloc(size);
    if (!text) return NULL;
    size_t used = (size_t)snprintf(text, size, "%s", ptx);
    const char line[] = "// padding that makes this image large enough to be cached by digest\n";
    while (used + sizeof line < size) {
        memcpy(text + used, line, sizeof line - 1);
        used += sizeof line - 1;
    }
    text[used] = 0;
    return text;
}

int main(void) {
    CUdevice device;
    use_primary_context(&device);

    // Modules load at the call: the emulated device refuses code, and the error says so.
    CUmodule module = NULL;
    EXPECT_ERROR(cuModuleLoadData(&module, ptx));
    EXPECT(cuModuleLoad(&module, "/nonexistent/flyt-test.cubin"), CUDA_ERROR_FILE_NOT_FOUND);
    CUjit_option option = CU_JIT_MAX_REGISTERS;
    void *value = (void *)(size_t)32;
    EXPECT(cuModuleLoadDataEx(&module, ptx, 1, &option, &value), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuModuleLoadData(NULL, ptx), CUDA_ERROR_INVALID_VALUE);

    // A large image answers as a small one does, whether the server had it cached or its bytes
    // had to follow the digest; lazily, the first lookup reports the load's error, not its own.
    CUresult no_code = cuModuleLoadData(&module, ptx);
    char *large = large_ptx();
    EXPECT(cuModuleLoadData(&module, large), no_code);
    CUlibrary large_library = NULL;
    EXPECT(cuLibraryLoadData(&large_library, large, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
    CUkernel large_kernel = NULL;
    EXPECT(cuLibraryGetKernel(&large_kernel, large_library, "k"), no_code);
    EXPECT(cuLibraryUnload(large_library), CUDA_SUCCESS);
    free(large);

    // Libraries load lazily: the load succeeds, the first kernel lookup reports the load's error.
    CUlibrary library = NULL;
    CUlibraryOption preserve = CU_LIBRARY_BINARY_IS_PRESERVED;
    void *yes = (void *)1;
    EXPECT(cuLibraryLoadData(&library, ptx, NULL, NULL, 0, &preserve, &yes, 1), CUDA_SUCCESS);
    CUkernel kernel = NULL;
    EXPECT_ERROR(cuLibraryGetKernel(&kernel, library, "k"));
    CUdeviceptr global = 0;
    size_t global_size = 0;
    EXPECT_ERROR(cuLibraryGetGlobal(&global, &global_size, library, "g"));
    CUmodule library_module = NULL;
    EXPECT(cuLibraryGetModule(&library_module, library), CUDA_SUCCESS);
    EXPECT(cuLibraryUnload(library), CUDA_SUCCESS);
    EXPECT(cuLibraryUnload(library), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuLibraryGetKernel(&kernel, library, "k"), CUDA_ERROR_INVALID_HANDLE);
    // A library never used is never sent: unloading it costs the server nothing.
    EXPECT(cuLibraryLoadData(&library, ptx, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
    EXPECT(cuLibraryUnload(library), CUDA_SUCCESS);
    // The preserved-binary option without a values array (how cuBLASLt loads its kernels): the
    // option says so by being there. An unknown library option is refused.
    EXPECT(cuLibraryLoadData(&library, ptx, NULL, NULL, 0, &preserve, NULL, 1), CUDA_SUCCESS);
    EXPECT(cuLibraryUnload(library), CUDA_SUCCESS);
    CUlibraryOption unknown_option = CU_LIBRARY_NUM_OPTIONS;
    EXPECT(cuLibraryLoadData(&library, ptx, NULL, NULL, 0, &unknown_option, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLibraryLoadData(&library, ptx, NULL, NULL, 0, NULL, NULL, 1), CUDA_ERROR_INVALID_VALUE);

    // JIT linking runs on the server. The emulated device has no linker: each step fails with
    // the device's error, and the error log the app gave says why; the log's filled size is
    // written back into its option slot, as the driver does.
    char error_log[256] = "untouched", info_log[256] = "untouched";
    CUjit_option link_options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                                   CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_WALL_TIME};
    void *link_values[] = {error_log, (void *)sizeof error_log, info_log, (void *)sizeof info_log, (void *)3, NULL};
    CUlinkState link = NULL;
    EXPECT(cuLinkCreate(6, link_options, link_values, &link), CUDA_SUCCESS);
    EXPECT(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)ptx, sizeof ptx, "k.ptx", 0, NULL, NULL), no_code);
    if (!strstr(error_log, "no JIT linker")) {
        printf("FAIL line %d: error log '%s'\n", __LINE__, error_log);
        failures++;
    }
    CHECK_EQ("error log size", (size_t)link_values[1], strlen(error_log));
    CHECK_EQ("info log", info_log[0], 0);
    EXPECT(cuLinkAddFile(link, CU_JIT_INPUT_PTX, "/nonexistent/flyt-test.ptx", 0, NULL, NULL), CUDA_ERROR_FILE_NOT_FOUND);
    void *cubin = NULL;
    size_t cubin_size = 0;
    EXPECT(cuLinkComplete(link, &cubin, &cubin_size), no_code);
    CHECK_EQ("cubin", (size_t)cubin, 0);
    EXPECT(cuLinkComplete(link, NULL, &cubin_size), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLinkDestroy(link), CUDA_SUCCESS);
    EXPECT(cuLinkDestroy(link), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuLinkAddData((CUlinkState)(size_t)0x1234, CU_JIT_INPUT_PTX, (void *)ptx, sizeof ptx, NULL, 0, NULL, NULL),
           CUDA_ERROR_INVALID_HANDLE);
    // An option that hands the linker host pointers (symbol tables) cannot cross to the server.
    CUjit_option symbol_names = CU_JIT_GLOBAL_SYMBOL_NAMES;
    void *no_names = NULL;
    EXPECT(cuLinkCreate(1, &symbol_names, &no_names, &link), CUDA_ERROR_NOT_SUPPORTED);

    // Handles Flyt never gave out are refused, never dereferenced.
    CUfunction bogus = (CUfunction)(size_t)0x1234;
    int attribute = 0;
    EXPECT(cuLaunchKernel(bogus, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuFuncGetAttribute(&attribute, CU_FUNC_ATTRIBUTE_NUM_REGS, bogus), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuModuleGetFunction(&bogus, (CUmodule)(size_t)0x5678, "k"), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuModuleUnload((CUmodule)(size_t)0x5678), CUDA_ERROR_INVALID_HANDLE);
    CUlaunchConfig config;
    memset(&config, 0, sizeof config);
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = config.blockDimY = config.blockDimZ = 1;
    EXPECT(cuLaunchKernelEx(&config, bogus, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);

    // No stream is ever capturing (capture is not supported yet); the mode is per thread.
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    EXPECT(cuStreamIsCapturing(NULL, &status), CUDA_SUCCESS);
    CHECK_EQ("capture status", status, CU_STREAM_CAPTURE_STATUS_NONE);
    EXPECT(cuStreamIsCapturing((CUstream)(size_t)0x777777, &status), CUDA_ERROR_INVALID_HANDLE);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    EXPECT(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    CHECK_EQ("previous capture mode", mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
    EXPECT(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    CHECK_EQ("exchanged capture mode", mode, CU_STREAM_CAPTURE_MODE_RELAXED);
    mode = (CUstreamCaptureMode)7;
    EXPECT(cuThreadExchangeStreamCaptureMode(&mode), CUDA_ERROR_INVALID_VALUE);

    // Pointer attributes and address ranges, answered in the process.
    CUdeviceptr dptr = 0;
    EXPECT(cuMemAlloc(&dptr, 4096), CUDA_SUCCESS);
    CUdeviceptr base = 0;
    size_t size = 0;
    EXPECT(cuMemGetAddressRange(&base, &size, dptr + 100), CUDA_SUCCESS);
    CHECK_EQ("range base", base, dptr);
    CHECK_EQ("range size", size, 4096);
    EXPECT(cuMemGetAddressRange(&base, &size, 0x10), CUDA_ERROR_NOT_FOUND);
    CUpointer_attribute attributes[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                         CU_POINTER_ATTRIBUTE_DEVICE_POINTER};
    unsigned int memory_type = 99;
    size_t range_size = 0;
    CUdeviceptr device_pointer = 0;
    void *data[3] = {&memory_type, &range_size, &device_pointer};
    EXPECT(cuPointerGetAttributes(3, attributes, data, dptr + 8), CUDA_SUCCESS);
    CHECK_EQ("memory type", memory_type, CU_MEMORYTYPE_DEVICE);
    CHECK_EQ("range size attribute", range_size, 4096);
    CHECK_EQ("device pointer", device_pointer, dptr + 8);
    int host_value = 0;
    EXPECT(cuPointerGetAttributes(3, attributes, data, (CUdeviceptr)(size_t)&host_value), CUDA_SUCCESS);
    CHECK_EQ("unknown memory type", memory_type, 0);
    CHECK_EQ("unknown range size", range_size, 0);

    // Priorities and event records.
    int least = 99, greatest = 99;
    EXPECT(cuCtxGetStreamPriorityRange(&least, &greatest), CUDA_SUCCESS);
    CHECK_EQ("least priority", least, 0);
    if (greatest >= least) {
        printf("FAIL: greatest priority %d is not above least %d\n", greatest, least);
        failures++;
    }
    CUevent event;
    EXPECT(cuEventCreate(&event, 0), CUDA_SUCCESS);
    EXPECT(cuEventRecordWithFlags(event, NULL, CU_EVENT_RECORD_EXTERNAL), CUDA_SUCCESS);
    EXPECT(cuEventRecordWithFlags(event, NULL, 0x2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuEventSynchronize(event), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(event), CUDA_SUCCESS);
    EXPECT(cuMemFree(dptr), CUDA_SUCCESS);

    CUmoduleLoadingMode loading;
    EXPECT(cuModuleGetLoadingMode(&loading), CUDA_SUCCESS);
    printf("loading mode: %s\n", loading == CU_MODULE_LAZY_LOADING ? "lazy" : "eager");
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

/* The audit of every implemented export of libcudart.so.13 (Flyt), against a flyt-rpc-server on
 * the emulated device. For each export, after `audited <name>`: calls with invalid input that must
 * fail with CUDA's documented error, and a call that succeeds whose effect is then seen through
 * another path (a memset through a copy back, a flag through its getter...), so that no export
 * can answer success without doing its work. Where the emulated device cannot do the work (it runs
 * no GPU code: kernels, module variables), the audit requires the error that says so.
 *
 * The test (audit.rs) compares the `audited` names with the export table and requires no
 * `FAILED` line. */
#include <cuda_runtime_api.h>
/* The bank size calls are deprecated (fixed since Maxwell) but still exported and called. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

/* nvcc's registration and launch hooks (declared by its C++ headers only). */
extern void **__cudaRegisterFatBinary(void *fat_cubin);
extern void __cudaRegisterFatBinaryEnd(void **handle);
extern void __cudaUnregisterFatBinary(void **handle);
extern void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *device_name,
                                   int thread_limit, uint3 *tid, uint3 *bid, dim3 *block, dim3 *grid, int *warp_size);
extern void __cudaRegisterVar(void **handle, char *host_var, char *device_address, const char *device_name, int ext,
                              size_t size, int constant, int global);
extern char __cudaInitModule(void **handle);
extern void __cudaRegisterManagedVar(void **handle, void **host_var_ptr_address, char *device_address, const char *device_name,
                                     int ext, size_t size, int constant, int global);
extern unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_mem, cudaStream_t stream);
extern cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared_mem, void *stream);
extern cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *host_fun);
extern cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared_mem,
                                      cudaStream_t stream);
extern cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void **args,
                                           size_t shared_mem, cudaStream_t stream);
/* The per-thread-default-stream entry points (what CUDA_API_PER_THREAD_DEFAULT_STREAM selects). */
extern cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                                     enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                          size_t height, enum cudaMemcpyKind kind, cudaStream_t stream);
extern cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                        cudaStream_t stream);
extern cudaError_t cudaMemset_ptds(void *dev, int value, size_t count);
extern cudaError_t cudaMemsetAsync_ptsz(void *dev, int value, size_t count, cudaStream_t stream);
extern cudaError_t cudaMemcpyBatchAsync_ptsz(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t count,
                                             struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, cudaStream_t stream);
extern cudaError_t cudaMemcpy3DBatchAsync_ptsz(size_t numOps, struct cudaMemcpy3DBatchOp *opList, unsigned long long flags,
                                               cudaStream_t stream);
extern cudaError_t cudaMemcpyToSymbol_ptds(const void *symbol, const void *src, size_t count, size_t offset,
                                           enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpyFromSymbol_ptds(void *dst, const void *symbol, size_t count, size_t offset,
                                             enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpyToSymbolAsync_ptsz(const void *symbol, const void *src, size_t count, size_t offset,
                                                enum cudaMemcpyKind kind, cudaStream_t stream);
extern cudaError_t cudaMemcpyFromSymbolAsync_ptsz(void *dst, const void *symbol, size_t count, size_t offset,
                                                  enum cudaMemcpyKind kind, cudaStream_t stream);
extern cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
extern cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream);
extern cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned flags);
extern cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t stream, unsigned *flags);
extern cudaError_t cudaStreamGetPriority_ptsz(cudaStream_t stream, int *priority);
extern cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t *dependencies,
                                                      const cudaGraphEdgeData *edges, size_t count, enum cudaStreamCaptureMode mode);
extern cudaError_t cudaStreamUpdateCaptureDependencies_ptsz(cudaStream_t stream, cudaGraphNode_t *dependencies, const cudaGraphEdgeData *edges,
                                                           size_t count, unsigned int flags);
extern cudaError_t cudaStreamSetAttribute_ptsz(cudaStream_t stream, cudaStreamAttrID attr, const cudaStreamAttrValue *value);
extern cudaError_t cudaStreamGetAttribute_ptsz(cudaStream_t stream, cudaStreamAttrID attr, cudaStreamAttrValue *value);
extern cudaError_t cudaStreamCopyAttributes_ptsz(cudaStream_t dst, cudaStream_t src);
extern cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream);
extern cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream, unsigned flags);
extern cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shared_mem,
                                         cudaStream_t stream);
/* The per-thread forms of the pitched, 3D and array entry points. */
extern cudaError_t cudaMemset2D_ptds(void *dev, size_t pitch, int value, size_t width, size_t height);
extern cudaError_t cudaMemset2DAsync_ptsz(void *dev, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream);
extern cudaError_t cudaMemset3D_ptds(struct cudaPitchedPtr target, int value, struct cudaExtent extent);
extern cudaError_t cudaMemset3DAsync_ptsz(struct cudaPitchedPtr target, int value, struct cudaExtent extent, cudaStream_t stream);
extern cudaError_t cudaMemcpy3D_ptds(const struct cudaMemcpy3DParms *p);
extern cudaError_t cudaMemcpy3DAsync_ptsz(const struct cudaMemcpy3DParms *p, cudaStream_t stream);
extern cudaError_t cudaMemcpy3DPeer_ptds(const struct cudaMemcpy3DPeerParms *p);
extern cudaError_t cudaMemcpy3DPeerAsync_ptsz(const struct cudaMemcpy3DPeerParms *p, cudaStream_t stream);
extern cudaError_t cudaMemcpy2DToArray_ptds(cudaArray_t dst, size_t w_offset, size_t h_offset, const void *src, size_t spitch,
                                            size_t width, size_t height, enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpy2DToArrayAsync_ptsz(cudaArray_t dst, size_t w_offset, size_t h_offset, const void *src,
                                                 size_t spitch, size_t width, size_t height, enum cudaMemcpyKind kind,
                                                 cudaStream_t stream);
extern cudaError_t cudaMemcpy2DFromArray_ptds(void *dst, size_t dpitch, cudaArray_const_t src, size_t w_offset, size_t h_offset,
                                              size_t width, size_t height, enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpy2DFromArrayAsync_ptsz(void *dst, size_t dpitch, cudaArray_const_t src, size_t w_offset,
                                                   size_t h_offset, size_t width, size_t height, enum cudaMemcpyKind kind,
                                                   cudaStream_t stream);
extern cudaError_t cudaMemcpy2DArrayToArray_ptds(cudaArray_t dst, size_t w_dst, size_t h_dst, cudaArray_const_t src, size_t w_src,
                                                 size_t h_src, size_t width, size_t height, enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpyToArray_ptds(cudaArray_t dst, size_t w_offset, size_t h_offset, const void *src, size_t count,
                                          enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpyToArrayAsync_ptsz(cudaArray_t dst, size_t w_offset, size_t h_offset, const void *src, size_t count,
                                               enum cudaMemcpyKind kind, cudaStream_t stream);
extern cudaError_t cudaMemcpyFromArray_ptds(void *dst, cudaArray_const_t src, size_t w_offset, size_t h_offset, size_t count,
                                            enum cudaMemcpyKind kind);
extern cudaError_t cudaMemcpyFromArrayAsync_ptsz(void *dst, cudaArray_const_t src, size_t w_offset, size_t h_offset,
                                                 size_t count, enum cudaMemcpyKind kind, cudaStream_t stream);
/* The per-thread forms of the managed-memory entry points. */
extern cudaError_t cudaMemPrefetchAsync_ptsz(const void *dev, size_t count, struct cudaMemLocation location, unsigned flags,
                                             cudaStream_t stream);
extern cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void *dev, size_t length, unsigned flags);
extern cudaError_t cudaMemPrefetchBatchAsync_ptsz(void **dptrs, size_t *sizes, size_t count, struct cudaMemLocation *locations,
                                                  size_t *location_starts, size_t num_locations, unsigned long long flags,
                                                  cudaStream_t stream);
extern cudaError_t cudaMemDiscardBatchAsync_ptsz(void **dptrs, size_t *sizes, size_t count, unsigned long long flags,
                                                 cudaStream_t stream);
extern cudaError_t cudaMemDiscardAndPrefetchBatchAsync_ptsz(void **dptrs, size_t *sizes, size_t count,
                                                            struct cudaMemLocation *locations, size_t *location_starts,
                                                            size_t num_locations, unsigned long long flags, cudaStream_t stream);
extern cudaError_t cudaMemcpyArrayToArray_ptds(cudaArray_t dst, size_t w_dst, size_t h_dst, cudaArray_const_t src, size_t w_src,
                                               size_t h_src, size_t count, enum cudaMemcpyKind kind);

extern cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **func, unsigned long long flags,
                                                enum cudaDriverEntryPointQueryResult *status);
extern cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **func, unsigned int version,
                                                         unsigned long long flags, enum cudaDriverEntryPointQueryResult *status);

static int failures = 0;

#define AUDIT(name) printf("audited %s\n", name)

#define EXPECT(what, cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAILED: %s (line %d)\n", what, __LINE__);                                      \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define EXPECT_CODE(what, call, code)                                                              \
    do {                                                                                           \
        cudaError_t got_ = (call);                                                                 \
        if (got_ != (code)) {                                                                      \
            printf("FAILED: %s -> %s, expected %s (line %d)\n", what, cudaGetErrorName(got_),      \
                   cudaGetErrorName(code), __LINE__);                                              \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define OK(what, call) EXPECT_CODE(what, call, cudaSuccess)

#define N 4096
#define BOGUS_STREAM ((cudaStream_t)0x123456)
#define BOGUS_EVENT ((cudaEvent_t)0x654321)
#define BOGUS_GRAPH_EXEC ((cudaGraphExec_t)0x777777)
#define BOGUS_GRAPH ((cudaGraph_t)0x777778)

static unsigned char host_a[N], host_b[N];

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131u + seed);
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char value) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != value) return 0;
    return 1;
}

/* Reads device memory back with a blocking copy. */
static int device_bytes_are(const void *dev, size_t n, unsigned char value) {
    static unsigned char back[N];
    memset(back, value ^ 0xff, sizeof back);
    if (cudaMemcpy(back, dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
    return all_bytes(back, n, value);
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* A fatbinary wrapper around an empty fatbinary: registration accepts it, the emulated device
 * cannot load it (as it loads no GPU code). */
static const unsigned long long fake_fatbin[2] = {
    0xBA55ED50ull | (1ull << 32) | (16ull << 48), /* magic, version 1, header size 16 */
    0,                                            /* no entries */
};
static struct {
    int magic, version;
    const unsigned long long *data;
    void *filename_or_fatbins;
} fake_wrapper = {0x466243b1, 1, fake_fatbin, NULL}, bad_wrapper = {0x12345678, 1, fake_fatbin, NULL};

static volatile int stub_calls;
static void fake_kernel(void) { stub_calls += 1; }
static void not_a_kernel(void) { stub_calls += 2; }
static char fake_symbol[64];
static char unregistered_symbol[64];

static void audit_async_callback(cudaAsyncNotificationInfo_t *info, void *data, cudaAsyncCallbackHandle_t handle) {
    (void)info, (void)data, (void)handle;
}

static int log_callback_calls = 0;
static void log_callback(void *data, cudaLogLevel level, char *message, size_t length) {
    (void)data, (void)level, (void)message, (void)length;
    log_callback_calls++;
}

static void device_and_errors(void) {
    int count = -1, device = -1, value = 0;
    unsigned flags = 0;
    struct cudaDeviceProp prop;

    AUDIT("cudaGetDeviceCount");
    EXPECT_CODE("cudaGetDeviceCount(NULL)", cudaGetDeviceCount(NULL), cudaErrorInvalidValue);
    OK("cudaGetDeviceCount", cudaGetDeviceCount(&count));
    EXPECT("one device", count == 1);
    EXPECT_CODE("the device past the count does not exist", cudaSetDevice(count), cudaErrorInvalidDevice);

    AUDIT("cudaSetDevice");
    EXPECT_CODE("cudaSetDevice(-1)", cudaSetDevice(-1), cudaErrorInvalidDevice);
    OK("cudaSetDevice(0)", cudaSetDevice(0));

    AUDIT("cudaGetDevice");
    EXPECT_CODE("cudaGetDevice(NULL)", cudaGetDevice(NULL), cudaErrorInvalidValue);
    OK("cudaGetDevice", cudaGetDevice(&device));
    EXPECT("the device set is the device", device == 0);

    AUDIT("cudaSetDeviceFlags");
    EXPECT_CODE("unknown device flag", cudaSetDeviceFlags(0x100), cudaErrorInvalidValue);
    OK("cudaSetDeviceFlags", cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync | cudaDeviceSyncMemops));
    AUDIT("cudaGetDeviceFlags");
    EXPECT_CODE("cudaGetDeviceFlags(NULL)", cudaGetDeviceFlags(NULL), cudaErrorInvalidValue);
    OK("cudaGetDeviceFlags", cudaGetDeviceFlags(&flags));
    EXPECT("device flags kept", flags == (cudaDeviceScheduleBlockingSync | cudaDeviceSyncMemops));

    AUDIT("cudaGetDeviceProperties");
    EXPECT_CODE("cudaGetDeviceProperties(NULL)", cudaGetDeviceProperties(NULL, 0), cudaErrorInvalidValue);
    EXPECT_CODE("cudaGetDeviceProperties(device 1)", cudaGetDeviceProperties(&prop, 1), cudaErrorInvalidDevice);
    memset(&prop, 0xff, sizeof prop);
    OK("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0));
    EXPECT("the emulated device says what it is", strstr(prop.name, "Emulated") != NULL);

    AUDIT("cudaDeviceGetAttribute");
    EXPECT_CODE("unknown attribute", cudaDeviceGetAttribute(&value, (enum cudaDeviceAttr)100000, 0), cudaErrorInvalidValue);
    EXPECT_CODE("negative attribute", cudaDeviceGetAttribute(&value, (enum cudaDeviceAttr)-1, 0), cudaErrorInvalidValue);
    EXPECT_CODE("attribute of device 1", cudaDeviceGetAttribute(&value, cudaDevAttrWarpSize, 1), cudaErrorInvalidDevice);
    EXPECT_CODE("attribute into NULL", cudaDeviceGetAttribute(NULL, cudaDevAttrWarpSize, 0), cudaErrorInvalidValue);
    OK("cudaDeviceGetAttribute", cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0));
    EXPECT("attribute and property agree", value == prop.multiProcessorCount && value > 0);
    OK("cudaDeviceGetAttribute(warp size)", cudaDeviceGetAttribute(&value, cudaDevAttrWarpSize, 0));
    EXPECT("warp size agrees", value == prop.warpSize && value == 32);
    /* Mapped host memory needs the shared-memory channel: without it the device does not claim it. */
    const char *shm_mode = getenv("FLYT_SHM");
    int maps_host = shm_mode && strcmp(shm_mode, "on") == 0;
    value = -1;
    OK("cudaDeviceGetAttribute(can map host memory)", cudaDeviceGetAttribute(&value, cudaDevAttrCanMapHostMemory, 0));
    EXPECT("mapped host memory only with the channel, attribute and property", value == maps_host && prop.canMapHostMemory == maps_host);

    AUDIT("cudaDriverGetVersion");
    EXPECT_CODE("cudaDriverGetVersion(NULL)", cudaDriverGetVersion(NULL), cudaErrorInvalidValue);
    OK("cudaDriverGetVersion", cudaDriverGetVersion(&value));
    EXPECT("a CUDA 13 driver", value >= 13000);
    AUDIT("cudaRuntimeGetVersion");
    EXPECT_CODE("cudaRuntimeGetVersion(NULL)", cudaRuntimeGetVersion(NULL), cudaErrorInvalidValue);
    OK("cudaRuntimeGetVersion", cudaRuntimeGetVersion(&value));
    EXPECT("runtime 13.0", value == 13000);

    AUDIT("cudaGetLastError");
    AUDIT("cudaPeekAtLastError");
    (void)cudaGetLastError();
    EXPECT_CODE("a failing call", cudaSetDevice(7), cudaErrorInvalidDevice);
    EXPECT_CODE("peek sees it", cudaPeekAtLastError(), cudaErrorInvalidDevice);
    EXPECT_CODE("peek keeps it", cudaPeekAtLastError(), cudaErrorInvalidDevice);
    EXPECT_CODE("get returns it", cudaGetLastError(), cudaErrorInvalidDevice);
    EXPECT_CODE("get cleared it", cudaGetLastError(), cudaSuccess);

    AUDIT("cudaGetErrorName");
    EXPECT("name of an unknown code", strcmp(cudaGetErrorName((cudaError_t)123456), "unrecognized error code") == 0);
    EXPECT("name", strcmp(cudaGetErrorName(cudaErrorStreamCaptureInvalidated), "cudaErrorStreamCaptureInvalidated") == 0);
    AUDIT("cudaGetErrorString");
    EXPECT("message of an unknown code", strcmp(cudaGetErrorString((cudaError_t)123456), "unrecognized error code") == 0);
    EXPECT("message", strcmp(cudaGetErrorString(cudaErrorNotSupported), "operation not supported") == 0);

    AUDIT("cudaCreateChannelDesc");
    struct cudaChannelFormatDesc desc = cudaCreateChannelDesc(8, 16, 0, 32, cudaChannelFormatKindFloat);
    EXPECT("channel description", desc.x == 8 && desc.y == 16 && desc.z == 0 && desc.w == 32 &&
                                      desc.f == cudaChannelFormatKindFloat);

    AUDIT("cudaDeviceSetLimit");
    AUDIT("cudaDeviceGetLimit");
    size_t limit = 0;
    EXPECT_CODE("an undefined limit", cudaDeviceSetLimit((enum cudaLimit)99, 1), cudaErrorUnsupportedLimit);
    EXPECT_CODE("a limit compute capability 9.0 does not have", cudaDeviceSetLimit(cudaLimitDevRuntimeSyncDepth, 4),
                cudaErrorUnsupportedLimit);
    EXPECT_CODE("get an undefined limit", cudaDeviceGetLimit(&limit, (enum cudaLimit)99), cudaErrorUnsupportedLimit);
    EXPECT_CODE("get into NULL", cudaDeviceGetLimit(NULL, cudaLimitStackSize), cudaErrorInvalidValue);
    OK("cudaDeviceSetLimit(stack)", cudaDeviceSetLimit(cudaLimitStackSize, 4096));
    OK("cudaDeviceGetLimit(stack)", cudaDeviceGetLimit(&limit, cudaLimitStackSize));
    EXPECT("the stack limit set is the stack limit", limit == 4096);
    {
        // Limits are asked once and remembered; a set is asked again (the device may clamp it).
        size_t first = 0, again = 0;
        OK("cudaDeviceGetLimit(heap)", cudaDeviceGetLimit(&first, cudaLimitMallocHeapSize));
        OK("cudaDeviceGetLimit(heap) again", cudaDeviceGetLimit(&again, cudaLimitMallocHeapSize));
        EXPECT("the heap limit twice", first == again && first > 0);
        OK("cudaDeviceGetLimit(L2 fetch)", cudaDeviceGetLimit(&first, cudaLimitMaxL2FetchGranularity));
        OK("cudaDeviceSetLimit(L2 fetch)", cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, 4096));
        OK("cudaDeviceGetLimit(L2 fetch) after the set", cudaDeviceGetLimit(&again, cudaLimitMaxL2FetchGranularity));
        EXPECT("the L2 fetch granularity as the device clamped it", again == 128 && first != again);
        OK("cudaDeviceSetLimit(L2 fetch) back", cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, first));
    }

    AUDIT("cudaDeviceSetCacheConfig");
    AUDIT("cudaDeviceGetCacheConfig");
    enum cudaFuncCache cache = cudaFuncCachePreferShared;
    OK("cudaDeviceGetCacheConfig", cudaDeviceGetCacheConfig(&cache));
    EXPECT("no cache preference before one is set", cache == cudaFuncCachePreferNone);
    EXPECT_CODE("a cache preference past the last", cudaDeviceSetCacheConfig((enum cudaFuncCache)4), cudaErrorInvalidValue);
    EXPECT_CODE("get the cache preference into NULL", cudaDeviceGetCacheConfig(NULL), cudaErrorInvalidValue);
    OK("cudaDeviceSetCacheConfig(prefer L1)", cudaDeviceSetCacheConfig(cudaFuncCachePreferL1));
    OK("cudaDeviceGetCacheConfig after a set", cudaDeviceGetCacheConfig(&cache));
    EXPECT("the cache preference set is the one read", cache == cudaFuncCachePreferL1);
    OK("cudaDeviceSetCacheConfig(prefer none)", cudaDeviceSetCacheConfig(cudaFuncCachePreferNone));

    AUDIT("cudaDeviceSetSharedMemConfig");
    AUDIT("cudaDeviceGetSharedMemConfig");
    /* Bank sizes are fixed at 4 bytes since Maxwell: a valid setting is taken without effect. */
    enum cudaSharedMemConfig banks = cudaSharedMemBankSizeEightByte;
    EXPECT_CODE("a bank size past the last", cudaDeviceSetSharedMemConfig((enum cudaSharedMemConfig)3), cudaErrorInvalidValue);
    OK("cudaDeviceSetSharedMemConfig(eight bytes)", cudaDeviceSetSharedMemConfig(cudaSharedMemBankSizeEightByte));
    OK("cudaDeviceGetSharedMemConfig", cudaDeviceGetSharedMemConfig(&banks));
    EXPECT("banks are four bytes wide", banks == cudaSharedMemBankSizeFourByte);

    /* The error log: a failing call is in a dump from an iterator taken before it. */
    AUDIT("cudaLogsRegisterCallback");
    AUDIT("cudaLogsUnregisterCallback");
    AUDIT("cudaLogsCurrent");
    AUDIT("cudaLogsDumpToMemory");
    AUDIT("cudaLogsDumpToFile");
    {
        cudaLogIterator iterator = 0;
        cudaLogsCallbackHandle handle = NULL;
        EXPECT_CODE("register no callback", cudaLogsRegisterCallback(NULL, NULL, &handle), cudaErrorInvalidValue);
        OK("cudaLogsRegisterCallback", cudaLogsRegisterCallback(log_callback, NULL, &handle));
        OK("cudaLogsCurrent", cudaLogsCurrent(&iterator, 0));
        EXPECT_CODE("cudaLogsCurrent with flags", cudaLogsCurrent(&iterator, 1), cudaErrorInvalidValue);
        EXPECT_CODE("a cache preference past the last (logged)", cudaDeviceSetCacheConfig((enum cudaFuncCache)9), cudaErrorInvalidValue);
        cudaGetLastError();
        char text[4096];
        size_t size = sizeof text;
        cudaLogIterator from = iterator;
        OK("cudaLogsDumpToMemory", cudaLogsDumpToMemory(&iterator, text, &size, 0));
        EXPECT("the failure is in the dump", strstr(text, "cuCtxSetCacheConfig returned CUDA_ERROR_INVALID_VALUE") != NULL);
        EXPECT("the callback saw it", log_callback_calls > 0);
        char path[] = "/tmp/flyt-audit-logs-XXXXXX";
        int fd = mkstemp(path);
        EXPECT("a temporary file", fd >= 0);
        if (fd >= 0) close(fd);
        OK("cudaLogsDumpToFile", cudaLogsDumpToFile(&from, path, 0));
        FILE *file = fopen(path, "r");
        size_t read = file ? fread(text, 1, sizeof text - 1, file) : 0;
        text[read] = 0;
        if (file) fclose(file);
        unlink(path);
        EXPECT("the file holds the failure", strstr(text, "cuCtxSetCacheConfig returned CUDA_ERROR_INVALID_VALUE") != NULL);
        OK("cudaLogsUnregisterCallback", cudaLogsUnregisterCallback(handle));
        EXPECT_CODE("unregister twice", cudaLogsUnregisterCallback(handle), cudaErrorInvalidValue);
    }

    /* Async notifications: registered and unregistered through the driver (the over-budget
     * notice itself is tested with the driver's, cuda-shim's tests/notifications.rs). */
    AUDIT("cudaDeviceRegisterAsyncNotification");
    AUDIT("cudaDeviceUnregisterAsyncNotification");
    {
        cudaAsyncCallbackHandle_t handle = NULL, second = NULL;
        EXPECT_CODE("register no callback", cudaDeviceRegisterAsyncNotification(0, NULL, NULL, &handle), cudaErrorInvalidValue);
        EXPECT_CODE("register on another device", cudaDeviceRegisterAsyncNotification(3, audit_async_callback, NULL, &handle),
                    cudaErrorInvalidDevice);
        EXPECT_CODE("register", cudaDeviceRegisterAsyncNotification(0, audit_async_callback, NULL, &handle), cudaSuccess);
        EXPECT_CODE("register another", cudaDeviceRegisterAsyncNotification(0, audit_async_callback, NULL, &second), cudaSuccess);
        EXPECT("two registrations get two handles", handle != second);
        EXPECT_CODE("unregister", cudaDeviceUnregisterAsyncNotification(0, handle), cudaSuccess);
        EXPECT_CODE("unregister twice", cudaDeviceUnregisterAsyncNotification(0, handle), cudaErrorInvalidValue);
        EXPECT_CODE("unregister the other", cudaDeviceUnregisterAsyncNotification(0, second), cudaSuccess);
    }

    /* Texture width and atomic capabilities are the server driver's; the emulated device has
     * neither texture hardware nor kernels to describe. */
    AUDIT("cudaDeviceGetTexture1DLinearMaxWidth");
    AUDIT("cudaDeviceGetHostAtomicCapabilities");
    AUDIT("cudaDeviceGetP2PAtomicCapabilities");
    {
        size_t width = 0;
        struct cudaChannelFormatDesc floats = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
        EXPECT_CODE("a width for no description", cudaDeviceGetTexture1DLinearMaxWidth(&width, NULL, 0), cudaErrorInvalidValue);
        EXPECT_CODE("a width on another device", cudaDeviceGetTexture1DLinearMaxWidth(&width, &floats, 3), cudaErrorInvalidDevice);
        EXPECT_CODE("a width the emulated device cannot give", cudaDeviceGetTexture1DLinearMaxWidth(&width, &floats, 0), cudaErrorNotSupported);
        unsigned int caps[2];
        enum cudaAtomicOperation ops[2] = {cudaAtomicOperationIntegerAdd, cudaAtomicOperationFloatAdd};
        EXPECT_CODE("capabilities of no operations", cudaDeviceGetHostAtomicCapabilities(caps, ops, 0, 0), cudaErrorInvalidValue);
        EXPECT_CODE("host atomics the emulated device cannot describe", cudaDeviceGetHostAtomicCapabilities(caps, ops, 2, 0),
                    cudaErrorNotSupported);
        EXPECT_CODE("peer atomics with a device not there", cudaDeviceGetP2PAtomicCapabilities(caps, ops, 2, 0, 1), cudaErrorInvalidDevice);
        EXPECT_CODE("peer atomics the emulated device cannot describe", cudaDeviceGetP2PAtomicCapabilities(caps, ops, 2, 0, 0),
                    cudaErrorNotSupported);
        cudaGetLastError();
    }

    AUDIT("cudaCtxResetPersistingL2Cache");
    OK("cudaCtxResetPersistingL2Cache", cudaCtxResetPersistingL2Cache());
    AUDIT("cudaProfilerStart");
    AUDIT("cudaProfilerStop");
    // No profiler is attached to the server: both succeed, as the driver's do then.
    OK("cudaProfilerStart", cudaProfilerStart());
    OK("cudaProfilerStop", cudaProfilerStop());

    AUDIT("cudaDeviceGetP2PAttribute");
    int p2p = -1;
    EXPECT_CODE("a device is no peer of itself", cudaDeviceGetP2PAttribute(&p2p, cudaDevP2PAttrAccessSupported, 0, 0),
                cudaErrorInvalidDevice);
    EXPECT_CODE("a peer past the last device", cudaDeviceGetP2PAttribute(&p2p, cudaDevP2PAttrAccessSupported, 0, 1),
                cudaErrorInvalidDevice);
    EXPECT_CODE("a P2P attribute into NULL", cudaDeviceGetP2PAttribute(NULL, cudaDevP2PAttrAccessSupported, 0, 0),
                cudaErrorInvalidValue);
    EXPECT("the peer attribute was not written", p2p == -1);
}

static void memory(void) {
    void *dev = NULL, *dev2 = NULL, *huge = NULL;
    size_t free_before = 0, free_after = 0, total = 0;
    cudaStream_t stream;
    OK("a stream for the memory audit", cudaStreamCreate(&stream));

    AUDIT("cudaMemGetInfo");
    EXPECT_CODE("cudaMemGetInfo(NULL, total)", cudaMemGetInfo(NULL, &total), cudaErrorInvalidValue);
    OK("cudaMemGetInfo", cudaMemGetInfo(&free_before, &total));

    AUDIT("cudaMalloc");
    EXPECT_CODE("cudaMalloc(NULL)", cudaMalloc(NULL, N), cudaErrorInvalidValue);
    EXPECT_CODE("more than the device", cudaMalloc(&huge, (size_t)1 << 50), cudaErrorMemoryAllocation);
    OK("cudaMalloc 64 MiB", cudaMalloc(&dev2, 64 << 20));
    OK("cudaMemGetInfo after", cudaMemGetInfo(&free_after, &total));
    EXPECT("the allocation counts", free_before - free_after >= (64 << 20) && free_after <= total);
    OK("cudaMalloc", cudaMalloc(&dev, N));

    AUDIT("cudaMemset");
    EXPECT_CODE("memset past the end", cudaMemset((char *)dev + N - 1, 0, 2), cudaErrorInvalidValue);
    EXPECT_CODE("memset of a host pointer", cudaMemset(host_a, 0, 16), cudaErrorInvalidValue);
    OK("cudaMemset", cudaMemset(dev, 0x3c, N));
    EXPECT("memset bytes read back", device_bytes_are(dev, N, 0x3c));
    AUDIT("cudaMemset_ptds");
    EXPECT_CODE("memset_ptds past the end", cudaMemset_ptds((char *)dev + 1, 0, N), cudaErrorInvalidValue);
    OK("cudaMemset_ptds", cudaMemset_ptds(dev, 0x3d, N));
    EXPECT("memset_ptds bytes read back", device_bytes_are(dev, N, 0x3d));
    AUDIT("cudaMemsetAsync");
    EXPECT_CODE("memsetAsync on an unknown stream", cudaMemsetAsync(dev, 0, N, BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    OK("cudaMemsetAsync", cudaMemsetAsync(dev, 0x3e, N, stream));
    OK("sync", cudaStreamSynchronize(stream));
    EXPECT("memsetAsync bytes read back", device_bytes_are(dev, N, 0x3e));
    AUDIT("cudaMemsetAsync_ptsz");
    EXPECT_CODE("memsetAsync_ptsz past the end", cudaMemsetAsync_ptsz(dev, 0, N + 1, NULL), cudaErrorInvalidValue);
    OK("cudaMemsetAsync_ptsz", cudaMemsetAsync_ptsz(dev, 0x3f, N, NULL));
    EXPECT("memsetAsync_ptsz bytes read back", device_bytes_are(dev, N, 0x3f));

    AUDIT("cudaMemcpy");
    fill(host_a, N, 1);
    EXPECT_CODE("invalid kind", cudaMemcpy(host_b, dev, N, (enum cudaMemcpyKind)42), cudaErrorInvalidMemcpyDirection);
    EXPECT_CODE("past the end", cudaMemcpy(host_b, (char *)dev + 1, N, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    EXPECT_CODE("a host pointer as the device side", cudaMemcpy(host_a, host_b, N, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_CODE("NULL source", cudaMemcpy(dev, NULL, N, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    OK("cudaMemcpy H2D", cudaMemcpy(dev, host_a, N, cudaMemcpyHostToDevice));
    OK("cudaMemcpy D2D", cudaMemcpy(dev2, dev, N, cudaMemcpyDeviceToDevice));
    memset(host_b, 0, N);
    OK("cudaMemcpy D2H", cudaMemcpy(host_b, dev2, N, cudaMemcpyDeviceToHost));
    EXPECT("round trip through two allocations", memcmp(host_a, host_b, N) == 0);
    memset(host_b, 0, N);
    OK("cudaMemcpy H2H", cudaMemcpy(host_b, host_a, N, cudaMemcpyHostToHost));
    EXPECT("host to host", memcmp(host_a, host_b, N) == 0);
    AUDIT("cudaMemcpy_ptds");
    fill(host_a, N, 2);
    EXPECT_CODE("memcpy_ptds invalid kind", cudaMemcpy_ptds(host_b, dev, N, (enum cudaMemcpyKind)-1), cudaErrorInvalidMemcpyDirection);
    OK("cudaMemcpy_ptds H2D", cudaMemcpy_ptds(dev, host_a, N, cudaMemcpyDefault));
    memset(host_b, 0, N);
    OK("cudaMemcpy_ptds D2H", cudaMemcpy_ptds(host_b, dev, N, cudaMemcpyDefault));
    EXPECT("memcpy_ptds round trip", memcmp(host_a, host_b, N) == 0);
    AUDIT("cudaMemcpyAsync");
    fill(host_a, N, 3);
    EXPECT_CODE("memcpyAsync on an unknown stream", cudaMemcpyAsync(dev, host_a, N, cudaMemcpyHostToDevice, BOGUS_STREAM),
                cudaErrorInvalidResourceHandle);
    OK("cudaMemcpyAsync H2D", cudaMemcpyAsync(dev, host_a, N, cudaMemcpyHostToDevice, stream));
    memset(host_b, 0, N);
    OK("cudaMemcpyAsync D2H", cudaMemcpyAsync(host_b, dev, N, cudaMemcpyDeviceToHost, stream));
    OK("sync", cudaStreamSynchronize(stream));
    EXPECT("memcpyAsync round trip by the sync", memcmp(host_a, host_b, N) == 0);
    AUDIT("cudaMemcpyAsync_ptsz");
    fill(host_a, N, 4);
    EXPECT_CODE("memcpyAsync_ptsz past the end", cudaMemcpyAsync_ptsz(dev, host_a, N + 1, cudaMemcpyHostToDevice, NULL),
                cudaErrorInvalidValue);
    OK("cudaMemcpyAsync_ptsz H2D", cudaMemcpyAsync_ptsz(dev, host_a, N, cudaMemcpyHostToDevice, NULL));
    memset(host_b, 0, N);
    OK("cudaMemcpyAsync_ptsz D2H", cudaMemcpyAsync_ptsz(host_b, dev, N, cudaMemcpyDeviceToHost, NULL));
    OK("sync the per-thread stream", cudaStreamSynchronize_ptsz(NULL));
    EXPECT("memcpyAsync_ptsz round trip", memcmp(host_a, host_b, N) == 0);

    /* A batch: two halves up, then two halves down, in one call each; its checks. */
    AUDIT("cudaMemcpyBatchAsync");
    AUDIT("cudaMemcpyBatchAsync_ptsz");
    {
        fill(host_a, N, 6);
        memset(host_b, 0, N);
        void *up_dsts[2] = {dev, (char *)dev + N / 2}, *down_dsts[2] = {host_b, host_b + N / 2};
        const void *up_srcs[2] = {host_a, host_a + N / 2}, *down_srcs[2] = {dev, (char *)dev + N / 2};
        size_t sizes[2] = {N / 2, N / 2}, first[1] = {0}, bad_first[1] = {1};
        struct cudaMemcpyAttributes attrs[1];
        memset(attrs, 0, sizeof attrs);
        EXPECT_CODE("a batch without a source access order", cudaMemcpyBatchAsync(up_dsts, up_srcs, sizes, 2, attrs, first, 1, stream),
                    cudaErrorInvalidValue);
        attrs[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        EXPECT_CODE("a batch whose first attributes start past copy 0",
                    cudaMemcpyBatchAsync(up_dsts, up_srcs, sizes, 2, attrs, bad_first, 1, stream), cudaErrorInvalidValue);
        EXPECT_CODE("a batch on the legacy stream", cudaMemcpyBatchAsync(up_dsts, up_srcs, sizes, 2, attrs, first, 1, cudaStreamLegacy),
                    cudaErrorInvalidValue);
        OK("cudaMemcpyBatchAsync up", cudaMemcpyBatchAsync(up_dsts, up_srcs, sizes, 2, attrs, first, 1, stream));
        OK("cudaMemcpyBatchAsync_ptsz down", cudaMemcpyBatchAsync_ptsz(down_dsts, down_srcs, sizes, 2, attrs, first, 1, stream));
        OK("sync", cudaStreamSynchronize(stream));
        EXPECT("batch round trip by the sync", memcmp(host_a, host_b, N) == 0);
    }

    /* A 3D batch: the buffer as 16 rows of 256 bytes up and down, each in one call. */
    AUDIT("cudaMemcpy3DBatchAsync");
    AUDIT("cudaMemcpy3DBatchAsync_ptsz");
    {
        fill(host_a, N, 7);
        memset(host_b, 0, N);
        struct cudaMemcpy3DBatchOp op;
        memset(&op, 0, sizeof op);
        op.src.type = cudaMemcpyOperandTypePointer;
        op.src.op.ptr.ptr = host_a;
        op.dst.type = cudaMemcpyOperandTypePointer;
        op.dst.op.ptr.ptr = dev;
        op.extent = (struct cudaExtent){256, N / 256, 1};
        EXPECT_CODE("a 3D batch without a source access order", cudaMemcpy3DBatchAsync(1, &op, 0, stream), cudaErrorInvalidValue);
        op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        EXPECT_CODE("a 3D batch on the legacy stream", cudaMemcpy3DBatchAsync(1, &op, 0, cudaStreamLegacy), cudaErrorInvalidValue);
        OK("cudaMemcpy3DBatchAsync up", cudaMemcpy3DBatchAsync(1, &op, 0, stream));
        op.src.op.ptr.ptr = dev;
        op.dst.op.ptr.ptr = host_b;
        OK("cudaMemcpy3DBatchAsync_ptsz down", cudaMemcpy3DBatchAsync_ptsz(1, &op, 0, stream));
        OK("sync", cudaStreamSynchronize(stream));
        EXPECT("3D batch round trip by the sync", memcmp(host_a, host_b, N) == 0);
    }

    /* Pitched copies: 16 rows of 100 bytes, host pitch 128 -> device pitch 256 -> host pitch 100. */
    AUDIT("cudaMemcpy2D");
    fill(host_a, N, 5);
    EXPECT_CODE("2D pitch below the width", cudaMemcpy2D(dev, 64, host_a, 128, 100, 16, cudaMemcpyHostToDevice),
                cudaErrorInvalidPitchValue);
    EXPECT_CODE("2D host pointer as the device side", cudaMemcpy2D(host_b, 256, host_a, 128, 100, 16, cudaMemcpyHostToDevice),
                cudaErrorInvalidValue);
    OK("cudaMemcpy2D H2D", cudaMemcpy2D(dev, 256, host_a, 128, 100, 16, cudaMemcpyHostToDevice));
    memset(host_b, 0, N);
    OK("cudaMemcpy2D D2H", cudaMemcpy2D(host_b, 100, dev, 256, 100, 16, cudaMemcpyDeviceToHost));
    int rows_ok = 1;
    for (int r = 0; r < 16; r++) rows_ok &= memcmp(host_b + r * 100, host_a + r * 128, 100) == 0;
    EXPECT("2D rows round trip", rows_ok);
    AUDIT("cudaMemcpy2D_ptds");
    OK("cudaMemcpy2D_ptds D2D", cudaMemcpy2D_ptds(dev2, 100, dev, 256, 100, 16, cudaMemcpyDeviceToDevice));
    memset(host_b, 0, N);
    OK("packed rows back", cudaMemcpy(host_b, dev2, 1600, cudaMemcpyDeviceToHost));
    rows_ok = 1;
    for (int r = 0; r < 16; r++) rows_ok &= memcmp(host_b + r * 100, host_a + r * 128, 100) == 0;
    EXPECT("2D device to device packs the rows", rows_ok);
    AUDIT("cudaMemcpy2DAsync");
    fill(host_a, N, 6);
    EXPECT_CODE("2DAsync on an unknown stream", cudaMemcpy2DAsync(dev, 256, host_a, 128, 100, 16, cudaMemcpyHostToDevice, BOGUS_STREAM),
                cudaErrorInvalidResourceHandle);
    OK("cudaMemcpy2DAsync H2D", cudaMemcpy2DAsync(dev, 256, host_a, 128, 100, 16, cudaMemcpyDefault, stream));
    memset(host_b, 0, N);
    OK("cudaMemcpy2DAsync D2H", cudaMemcpy2DAsync(host_b, 128, dev, 256, 100, 16, cudaMemcpyDefault, stream));
    OK("sync", cudaStreamSynchronize(stream));
    rows_ok = 1;
    for (int r = 0; r < 16; r++) rows_ok &= memcmp(host_b + r * 128, host_a + r * 128, 100) == 0;
    EXPECT("2DAsync rows round trip by the sync", rows_ok);
    AUDIT("cudaMemcpy2DAsync_ptsz");
    OK("cudaMemcpy2DAsync_ptsz H2H", cudaMemcpy2DAsync_ptsz(host_b, 100, host_a, 128, 100, 16, cudaMemcpyHostToHost, NULL));
    OK("sync the per-thread stream", cudaStreamSynchronize_ptsz(NULL));
    rows_ok = 1;
    for (int r = 0; r < 16; r++) rows_ok &= memcmp(host_b + r * 100, host_a + r * 128, 100) == 0;
    EXPECT("2D host to host", rows_ok);

    AUDIT("cudaPointerGetAttributes");
    struct cudaPointerAttributes attributes;
    EXPECT_CODE("attributes into NULL", cudaPointerGetAttributes(NULL, dev), cudaErrorInvalidValue);
    OK("attributes of device memory", cudaPointerGetAttributes(&attributes, (char *)dev + 5));
    EXPECT("device memory", attributes.type == cudaMemoryTypeDevice && attributes.devicePointer == (char *)dev + 5);
    OK("attributes of pageable memory", cudaPointerGetAttributes(&attributes, host_a));
    EXPECT("pageable memory is unregistered", attributes.type == cudaMemoryTypeUnregistered);

    AUDIT("cudaFree");
    EXPECT_CODE("free of an interior pointer", cudaFree((char *)dev + 1), cudaErrorInvalidValue);
    EXPECT_CODE("free of a host pointer", cudaFree(host_a), cudaErrorInvalidValue);
    OK("cudaFree(NULL)", cudaFree(NULL));
    OK("cudaFree", cudaFree(dev));
    EXPECT_CODE("freed memory is gone", cudaMemcpy(host_b, dev, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    EXPECT_CODE("double free", cudaFree(dev), cudaErrorInvalidValue);
    OK("cudaFree 64 MiB", cudaFree(dev2));
    OK("cudaMemGetInfo at the end", cudaMemGetInfo(&free_after, &total));
    EXPECT("the memory is back", free_after == free_before);

    /* Pinned and registered host memory. */
    unsigned char *pinned = NULL, *alloc = NULL, *mapped = NULL;
    unsigned flags = 0;
    OK("cudaMalloc for the pinned audit", cudaMalloc(&dev, N));
    AUDIT("cudaMallocHost");
    EXPECT_CODE("cudaMallocHost(NULL)", cudaMallocHost(NULL, N), cudaErrorInvalidValue);
    OK("cudaMallocHost", cudaMallocHost((void **)&pinned, N));
    OK("its flags", cudaHostGetFlags(&flags, pinned + 10));
    EXPECT("default flags", flags == 0);
    OK("its attributes", cudaPointerGetAttributes(&attributes, pinned));
    EXPECT("pinned memory is host memory", attributes.type == cudaMemoryTypeHost);
    fill(pinned, N, 5);
    OK("H2D from pinned", cudaMemcpy(dev, pinned, N, cudaMemcpyHostToDevice));
    memset(host_b, 0, N);
    OK("D2H", cudaMemcpy(host_b, dev, N, cudaMemcpyDeviceToHost));
    EXPECT("pinned round trip", memcmp(pinned, host_b, N) == 0);

    AUDIT("cudaHostAlloc");
    EXPECT_CODE("unknown flag", cudaHostAlloc((void **)&alloc, N, 0x10), cudaErrorInvalidValue);
    /* Mapped memory: over the shared-memory channel the server maps the block at the app's
       address, so kernels use the app's pointer (unified addressing); over a socket alone it is
       device memory mirrored at the same address here, exchanged at launches and syncs. */
    const char *shm = getenv("FLYT_SHM");
    int channel = shm && strcmp(shm, "on") == 0;
    void *device_view = NULL;
    OK("mapped memory", cudaHostAlloc((void **)&mapped, N, cudaHostAllocMapped));
    OK("its flags", cudaHostGetFlags(&flags, mapped));
    EXPECT("mapped flag kept", flags == cudaHostAllocMapped);
    AUDIT("cudaHostGetDevicePointer");
    OK("cudaHostGetDevicePointer", cudaHostGetDevicePointer(&device_view, mapped + 8, 0));
    EXPECT("the device sees it at its host address", device_view == mapped + 8);
    OK("attributes of mapped memory", cudaPointerGetAttributes(&attributes, mapped + 8));
    EXPECT("mapped memory: host memory with a device pointer",
           attributes.type == cudaMemoryTypeHost && attributes.devicePointer == mapped + 8 && attributes.hostPointer == mapped + 8);
    EXPECT_CODE("flags must be 0", cudaHostGetDevicePointer(&device_view, mapped, 1), cudaErrorInvalidValue);
    EXPECT_CODE("into NULL", cudaHostGetDevicePointer(NULL, mapped, 0), cudaErrorInvalidValue);
    EXPECT_CODE("pageable memory has none", cudaHostGetDevicePointer(&device_view, host_a, 0), cudaErrorInvalidValue);
    EXPECT_CODE("device memory is no host memory", cudaHostGetDevicePointer(&device_view, dev, 0), cudaErrorInvalidValue);
    fill(mapped, N, 7);
    OK("H2D from mapped memory", cudaMemcpy(dev, mapped, N, cudaMemcpyHostToDevice));
    memset(host_b, 0, N);
    OK("D2H", cudaMemcpy(host_b, dev, N, cudaMemcpyDeviceToHost));
    EXPECT("mapped round trip", memcmp(mapped, host_b, N) == 0);
    OK("memset of mapped memory (the device writes the app's pages)", cudaMemset(mapped + 16, 0x5a, 100));
    int memset_ok = mapped[15] != 0x5a && mapped[116] != 0x5a;
    for (int i = 16; i < 116; i++) memset_ok &= mapped[i] == 0x5a;
    EXPECT("memset landed in place", memset_ok);
    EXPECT_CODE("memset past the block", cudaMemset(mapped + N - 4, 0, 4096 * 4), cudaErrorInvalidValue);
    OK("cudaFreeHost of mapped memory", cudaFreeHost(mapped));
    EXPECT_CODE("freed mapped memory has no device pointer", cudaHostGetDevicePointer(&device_view, mapped, 0), cudaErrorInvalidValue);
    if (!channel) {
        EXPECT_CODE("pinned memory the GPU cannot reach has no device pointer", cudaHostGetDevicePointer(&device_view, pinned, 0),
                    cudaErrorInvalidValue);
    }
    OK("cudaHostAlloc", cudaHostAlloc((void **)&alloc, N, cudaHostAllocPortable | cudaHostAllocWriteCombined));
    AUDIT("cudaHostGetFlags");
    EXPECT_CODE("flags of pageable memory", cudaHostGetFlags(&flags, host_a), cudaErrorInvalidValue);
    EXPECT_CODE("flags into NULL", cudaHostGetFlags(NULL, alloc), cudaErrorInvalidValue);
    OK("cudaHostGetFlags", cudaHostGetFlags(&flags, alloc + N - 1));
    EXPECT("flags kept", flags == (cudaHostAllocPortable | cudaHostAllocWriteCombined));
    fill(alloc, N, 6);
    OK("async H2D from cudaHostAlloc memory", cudaMemcpyAsync(dev, alloc, N, cudaMemcpyHostToDevice, stream));
    memset(pinned, 0, N);
    OK("async D2H into pinned memory", cudaMemcpyAsync(pinned, dev, N, cudaMemcpyDeviceToHost, stream));
    OK("sync", cudaStreamSynchronize(stream));
    EXPECT("pinned to pinned through the device", memcmp(alloc, pinned, N) == 0);
    /* A host-to-host copy is stream-ordered and synchronous with the host: it comes after the
       stream's device-to-host copy into its source. */
    fill(alloc, N, 9);
    OK("H2D", cudaMemcpy(dev, alloc, N, cudaMemcpyHostToDevice));
    memset(pinned, 0, N);
    memset(host_b, 0, N);
    OK("async D2H into pinned memory", cudaMemcpyAsync(pinned, dev, N, cudaMemcpyDeviceToHost, stream));
    OK("async H2H out of it", cudaMemcpyAsync(host_b, pinned, N, cudaMemcpyHostToHost, stream));
    EXPECT("the host-to-host copy came after the device-to-host one", memcmp(host_b, alloc, N) == 0);

    AUDIT("cudaFreeHost");
    EXPECT_CODE("cudaFreeHost of pageable memory", cudaFreeHost(host_a), cudaErrorInvalidValue);
    EXPECT_CODE("cudaFreeHost of device memory", cudaFreeHost(dev), cudaErrorInvalidValue);
    OK("cudaFreeHost(NULL)", cudaFreeHost(NULL));
    OK("cudaFreeHost", cudaFreeHost(alloc));
    EXPECT_CODE("freed pinned memory has no flags", cudaHostGetFlags(&flags, alloc), cudaErrorInvalidValue);
    OK("cudaFreeHost", cudaFreeHost(pinned));
    OK("attributes after cudaFreeHost", cudaPointerGetAttributes(&attributes, pinned));
    EXPECT("freed pinned memory is not host memory any more", attributes.type == cudaMemoryTypeUnregistered);

    AUDIT("cudaHostRegister");
    unsigned char *mine = malloc(1 << 16);
    EXPECT_CODE("register NULL", cudaHostRegister(NULL, 4096, 0), cudaErrorInvalidValue);
    EXPECT_CODE("register 0 bytes", cudaHostRegister(mine, 0, 0), cudaErrorInvalidValue);
    EXPECT_CODE("unknown flag", cudaHostRegister(mine, 1 << 16, 0x10), cudaErrorInvalidValue);
    // With the shared-memory channel the app's own memory is made a mapping the server maps too;
    // over a socket alone kernels cannot reach it.
    const char *shm_setting = getenv("FLYT_SHM");
    if (shm_setting && strcmp(shm_setting, "on") == 0) {
        OK("mapped (the channel maps the app's own memory for the server)", cudaHostRegister(mine, 1 << 16, cudaHostRegisterMapped));
        OK("mapped registration undone", cudaHostUnregister(mine));
    } else {
        EXPECT_CODE("mapped (kernels cannot reach the app's own memory without the channel)",
                    cudaHostRegister(mine, 1 << 16, cudaHostRegisterMapped), cudaErrorNotSupported);
    }
    EXPECT_CODE("I/O memory", cudaHostRegister(mine, 1 << 16, cudaHostRegisterIoMemory), cudaErrorNotSupported);
    EXPECT_CODE("a refused registration registers nothing", cudaHostGetFlags(&flags, mine), cudaErrorInvalidValue);
    OK("cudaHostRegister", cudaHostRegister(mine, 1 << 16, cudaHostRegisterPortable | cudaHostRegisterReadOnly));
    EXPECT_CODE("registering it again", cudaHostRegister(mine + 4096, 4096, 0), cudaErrorHostMemoryAlreadyRegistered);
    OK("flags of registered memory", cudaHostGetFlags(&flags, mine + 100));
    EXPECT("registration flags kept", flags == (cudaHostRegisterPortable | cudaHostRegisterReadOnly));
    OK("attributes of registered memory", cudaPointerGetAttributes(&attributes, mine + 10));
    EXPECT("registered memory is host memory", attributes.type == cudaMemoryTypeHost);
    AUDIT("cudaHostUnregister");
    EXPECT_CODE("unregister NULL", cudaHostUnregister(NULL), cudaErrorInvalidValue);
    EXPECT_CODE("unregister pageable memory", cudaHostUnregister(host_a), cudaErrorHostMemoryNotRegistered);
    EXPECT_CODE("cudaFreeHost of registered memory", cudaFreeHost(mine), cudaErrorInvalidValue);
    OK("cudaHostUnregister", cudaHostUnregister(mine));
    EXPECT_CODE("unregistered memory has no flags", cudaHostGetFlags(&flags, mine), cudaErrorInvalidValue);
    EXPECT_CODE("unregister again", cudaHostUnregister(mine), cudaErrorHostMemoryNotRegistered);
    free(mine);
    OK("cudaFree", cudaFree(dev));
    OK("cudaStreamDestroy", cudaStreamDestroy(stream));
}

/* One int range attribute of managed memory, or -99 where the query fails. */
static int range_int(enum cudaMemRangeAttribute attribute, const void *ptr, size_t count) {
    int value = -99;
    if (cudaMemRangeGetAttribute(&value, sizeof value, attribute, ptr, count) != cudaSuccess) return -99;
    return value;
}

static struct cudaMemLocation location(enum cudaMemLocationType type, int id) {
    struct cudaMemLocation at;
    at.type = type;
    at.id = id;
    return at;
}

/* Managed memory: over the shared-memory channel a block the server maps at the app's address, so
   the host and the device use the same bytes; over a socket alone device memory mirrored at the
   same address, coherent at copies and synchronizations. Prefetches and advice move nothing
   here, but are checked as CUDA checks them and read back through the range queries. */
static void managed_memory(void) {
    const char *shm = getenv("FLYT_SHM");
    int channel = shm && strcmp(shm, "on") == 0;
    const struct cudaMemLocation device0 = location(cudaMemLocationTypeDevice, 0), host = location(cudaMemLocationTypeHost, 0);
    /* Four pages: prefetches and advice apply to whole pages, and some here cover one. */
    const size_t M = 4 * N;
    unsigned char *managed = NULL, *other = NULL, *dev = NULL;
    cudaStream_t stream;
    OK("a stream for the managed audit", cudaStreamCreate(&stream));
    OK("device memory beside it", cudaMalloc((void **)&dev, N));

    AUDIT("cudaMallocManaged");
    int can_manage = -1, concurrent = -1;
    OK("cudaDeviceGetAttribute(managed memory)", cudaDeviceGetAttribute(&can_manage, cudaDevAttrManagedMemory, 0));
    OK("cudaDeviceGetAttribute(concurrent managed access)", cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
    // Managed memory is claimed on every transport (mirrors without the channel); concurrent
    // access only with the channel, where host and device share the pages.
    EXPECT("the device claims managed memory, concurrent access only with the channel", can_manage == 1 && concurrent == channel);
    EXPECT_CODE("into NULL", cudaMallocManaged(NULL, N, cudaMemAttachGlobal), cudaErrorInvalidValue);
    EXPECT_CODE("0 bytes", cudaMallocManaged((void **)&managed, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
    EXPECT_CODE("attached to a single stream", cudaMallocManaged((void **)&managed, N, cudaMemAttachSingle), cudaErrorInvalidValue);
    EXPECT_CODE("an unknown flag", cudaMallocManaged((void **)&managed, N, 0x10), cudaErrorInvalidValue);
    EXPECT("nothing handed out on a refusal", managed == NULL);

    AUDIT("cudaMemPrefetchAsync");
    AUDIT("cudaMemPrefetchAsync_ptsz");
    AUDIT("cudaMemAdvise");
    AUDIT("cudaMemRangeGetAttribute");
    AUDIT("cudaMemRangeGetAttributes");
    AUDIT("cudaStreamAttachMemAsync");
    AUDIT("cudaStreamAttachMemAsync_ptsz");
    AUDIT("cudaMemPrefetchBatchAsync");
    AUDIT("cudaMemPrefetchBatchAsync_ptsz");
    AUDIT("cudaMemDiscardBatchAsync");
    AUDIT("cudaMemDiscardBatchAsync_ptsz");
    AUDIT("cudaMemDiscardAndPrefetchBatchAsync");
    AUDIT("cudaMemDiscardAndPrefetchBatchAsync_ptsz");
    /* Memory that is not managed takes no hints, with or without the channel. */
    void *not_managed[1] = {dev};
    size_t one_size[1] = {N}, first[1] = {0};
    int value = -99;
    EXPECT_CODE("prefetch of device memory", cudaMemPrefetchAsync(dev, N, device0, 0, stream), cudaErrorInvalidValue);
    EXPECT_CODE("prefetch of pageable memory", cudaMemPrefetchAsync_ptsz(host_a, N, host, 0, NULL), cudaErrorInvalidValue);
    EXPECT_CODE("advice on device memory", cudaMemAdvise(dev, N, cudaMemAdviseSetReadMostly, device0), cudaErrorInvalidValue);
    EXPECT_CODE("range attribute of device memory",
                cudaMemRangeGetAttribute(&value, sizeof value, cudaMemRangeAttributeReadMostly, dev, N), cudaErrorInvalidValue);
    EXPECT_CODE("attach device memory", cudaStreamAttachMemAsync(stream, dev, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
    EXPECT_CODE("a batch prefetch of device memory",
                cudaMemPrefetchBatchAsync(not_managed, one_size, 1, (struct cudaMemLocation *)&device0, first, 1, 0, stream),
                cudaErrorInvalidValue);
    EXPECT_CODE("a batch discard of device memory", cudaMemDiscardBatchAsync(not_managed, one_size, 1, 0, stream), cudaErrorInvalidValue);

    OK("cudaMallocManaged", cudaMallocManaged((void **)&managed, M, cudaMemAttachGlobal));
    OK("cudaMallocManaged attached to the host", cudaMallocManaged((void **)&other, N, cudaMemAttachHost));
    EXPECT("two managed blocks", managed != NULL && other != NULL && managed != other);

    /* The host's writes are what the device reads, and the device's writes what the host reads. */
    fill(managed, N, 21);
    OK("D2D out of managed memory", cudaMemcpy(dev, managed, N, cudaMemcpyDeviceToDevice));
    memset(host_b, 0, N);
    OK("D2H of the copy", cudaMemcpy(host_b, dev, N, cudaMemcpyDeviceToHost));
    EXPECT("the device read the host's writes", memcmp(host_b, managed, N) == 0);
    OK("memset of managed memory", cudaMemset(managed + 16, 0x6b, 100));
    OK("synchronize before the host reads", cudaDeviceSynchronize());
    int memset_ok = managed[15] != 0x6b && managed[116] != 0x6b;
    for (int i = 16; i < 116; i++) memset_ok &= managed[i] == 0x6b;
    EXPECT("the host reads the memset in place", memset_ok);
    EXPECT_CODE("memset past the block", cudaMemset(managed + M - 4, 0, 8), cudaErrorInvalidValue);
    EXPECT_CODE("copy into managed memory past the block", cudaMemcpy(managed + M - 1, host_a, 2, cudaMemcpyHostToDevice),
                cudaErrorInvalidValue);
    EXPECT_CODE("copy out of managed memory past the block", cudaMemcpy(host_b, managed + M - 1, 2, cudaMemcpyDefault),
                cudaErrorInvalidValue);
    unsigned host_flags = 0;
    EXPECT_CODE("host flags of managed memory", cudaHostGetFlags(&host_flags, managed), cudaErrorInvalidValue);
    OK("memsetAsync of managed memory", cudaMemsetAsync(managed, 0x6c, N, stream));
    OK("sync", cudaStreamSynchronize(stream));
    EXPECT("the host reads the async memset", all_bytes(managed, N, 0x6c));

    /* Copies of every kind, managed memory on either side. */
    fill(host_a, N, 22);
    OK("H2D into managed memory", cudaMemcpy(managed, host_a, N, cudaMemcpyHostToDevice));
    EXPECT("H2D landed in place", memcmp(managed, host_a, N) == 0);
    memset(host_b, 0, N);
    OK("D2H out of managed memory", cudaMemcpy(host_b, managed, N, cudaMemcpyDeviceToHost));
    EXPECT("D2H read it", memcmp(host_b, host_a, N) == 0);
    fill(host_a, N, 23);
    OK("H2H into managed memory", cudaMemcpy(managed, host_a, N, cudaMemcpyHostToHost));
    EXPECT("H2H landed in place", memcmp(managed, host_a, N) == 0);
    memset(host_b, 0, N);
    OK("H2H out of managed memory", cudaMemcpy(host_b, managed, N, cudaMemcpyHostToHost));
    EXPECT("H2H read it", memcmp(host_b, host_a, N) == 0);
    OK("memset device memory", cudaMemset(dev, 0x71, N));
    OK("D2D into managed memory", cudaMemcpy(managed, dev, N, cudaMemcpyDeviceToDevice));
    EXPECT("D2D landed in place", all_bytes(managed, N, 0x71));
    fill(managed, N, 24);
    OK("default copy out of managed memory", cudaMemcpy(dev, managed, N, cudaMemcpyDefault));
    memset(host_b, 0, N);
    OK("read it back", cudaMemcpy(host_b, dev, N, cudaMemcpyDeviceToHost));
    EXPECT("default copy out of managed memory", memcmp(host_b, managed, N) == 0);
    OK("memset device memory", cudaMemset(dev, 0x72, N));
    OK("default copy into managed memory", cudaMemcpy(managed, dev, N, cudaMemcpyDefault));
    EXPECT("default copy into managed memory", all_bytes(managed, N, 0x72));
    fill(host_a, N, 25);
    OK("default copy from the host into managed memory", cudaMemcpy(managed + 8, host_a, 1000, cudaMemcpyDefault));
    EXPECT("default copy from the host, at an offset", memcmp(managed + 8, host_a, 1000) == 0 && managed[7] == 0x72);
    OK("managed to managed", cudaMemcpy(other, managed, N, cudaMemcpyDefault));
    EXPECT("managed to managed", memcmp(other, managed, N) == 0);
    fill(host_a, N, 26);
    OK("async H2D into managed memory", cudaMemcpyAsync(managed, host_a, N, cudaMemcpyHostToDevice, stream));
    OK("async D2D out of it", cudaMemcpyAsync(dev, managed, N, cudaMemcpyDeviceToDevice, stream));
    OK("sync", cudaStreamSynchronize(stream));
    memset(host_b, 0, N);
    OK("read the device copy", cudaMemcpy(host_b, dev, N, cudaMemcpyDeviceToHost));
    EXPECT("async copies through managed memory", memcmp(managed, host_a, N) == 0 && memcmp(host_b, host_a, N) == 0);

    /* Pointer attributes: managed memory has one address on both sides. */
    struct cudaPointerAttributes attributes;
    OK("attributes of managed memory", cudaPointerGetAttributes(&attributes, managed + 5));
    EXPECT("managed memory", attributes.type == cudaMemoryTypeManaged && attributes.device == 0 &&
                                 attributes.devicePointer == managed + 5 && attributes.hostPointer == managed + 5);
    OK("attributes of device memory beside it", cudaPointerGetAttributes(&attributes, dev));
    EXPECT("device memory stays device memory", attributes.type == cudaMemoryTypeDevice && attributes.hostPointer == NULL);

    /* Prefetches, read back as the last prefetch location. */
    EXPECT("never prefetched", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, M) == cudaInvalidDeviceId);
    OK("cudaMemPrefetchAsync to device 0", cudaMemPrefetchAsync(managed, M, device0, 0, stream));
    EXPECT("last prefetch: device 0", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, M) == 0);
    EXPECT("last prefetch type: a device",
           range_int(cudaMemRangeAttributeLastPrefetchLocationType, managed, M) == cudaMemLocationTypeDevice);
    EXPECT("last prefetch id: 0", range_int(cudaMemRangeAttributeLastPrefetchLocationId, managed, M) == 0);
    OK("cudaMemPrefetchAsync_ptsz to the host", cudaMemPrefetchAsync_ptsz(managed, M, host, 0, NULL));
    EXPECT("last prefetch: the CPU", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, M) == cudaCpuDeviceId);
    EXPECT("last prefetch type: the host",
           range_int(cudaMemRangeAttributeLastPrefetchLocationType, managed, M) == cudaMemLocationTypeHost);
    OK("prefetch the second page to device 0", cudaMemPrefetchAsync(managed + N + 8, 100, device0, 0, stream));
    EXPECT("the page's last prefetch", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed + N, N) == 0);
    EXPECT("the other pages' last prefetch", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, N) == cudaCpuDeviceId);
    EXPECT("no common last prefetch over the whole", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, M) == cudaInvalidDeviceId);
    EXPECT_CODE("prefetch to a device that does not exist", cudaMemPrefetchAsync(managed, M, location(cudaMemLocationTypeDevice, 7), 0, stream),
                cudaErrorInvalidDevice);
    EXPECT_CODE("prefetch to an invalid location", cudaMemPrefetchAsync(managed, M, location(cudaMemLocationTypeInvalid, 0), 0, stream),
                cudaErrorInvalidValue);
    EXPECT_CODE("prefetch with flags", cudaMemPrefetchAsync(managed, M, device0, 1, stream), cudaErrorInvalidValue);
    EXPECT_CODE("prefetch past the block", cudaMemPrefetchAsync(managed, M + 1, device0, 0, stream), cudaErrorInvalidValue);
    EXPECT_CODE("prefetch on an unknown stream", cudaMemPrefetchAsync(managed, M, device0, 0, BOGUS_STREAM),
                cudaErrorInvalidResourceHandle);
    EXPECT("refused prefetches recorded nothing", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, N) == cudaCpuDeviceId);

    /* Advice, read back through the range attributes. */
    EXPECT("not read-mostly before the advice", range_int(cudaMemRangeAttributeReadMostly, managed, M) == 0);
    OK("cudaMemAdvise read-mostly", cudaMemAdvise(managed, M, cudaMemAdviseSetReadMostly, device0));
    EXPECT("read-mostly", range_int(cudaMemRangeAttributeReadMostly, managed, M) == 1);
    OK("unset read-mostly on the first page", cudaMemAdvise(managed, 100, cudaMemAdviseUnsetReadMostly, device0));
    EXPECT("not read-mostly as a whole", range_int(cudaMemRangeAttributeReadMostly, managed, M) == 0);
    EXPECT("read-mostly where still set", range_int(cudaMemRangeAttributeReadMostly, managed + N, M - N) == 1);
    EXPECT("no preferred location before the advice", range_int(cudaMemRangeAttributePreferredLocation, managed, M) == cudaInvalidDeviceId);
    EXPECT("no preferred location type before the advice",
           range_int(cudaMemRangeAttributePreferredLocationType, managed, M) == cudaMemLocationTypeInvalid);
    OK("preferred location device 0", cudaMemAdvise(managed, M, cudaMemAdviseSetPreferredLocation, device0));
    EXPECT("preferred location: device 0", range_int(cudaMemRangeAttributePreferredLocation, managed, M) == 0);
    EXPECT("preferred location type: a device",
           range_int(cudaMemRangeAttributePreferredLocationType, managed, M) == cudaMemLocationTypeDevice);
    EXPECT("preferred location id: 0", range_int(cudaMemRangeAttributePreferredLocationId, managed, M) == 0);
    OK("preferred location the host for the last page", cudaMemAdvise(managed + 3 * N, N, cudaMemAdviseSetPreferredLocation, host));
    EXPECT("preferred location: the CPU", range_int(cudaMemRangeAttributePreferredLocation, managed + 3 * N, N) == cudaCpuDeviceId);
    EXPECT("no common preferred location", range_int(cudaMemRangeAttributePreferredLocation, managed, M) == cudaInvalidDeviceId);
    OK("unset the preferred location", cudaMemAdvise(managed, M, cudaMemAdviseUnsetPreferredLocation, host));
    EXPECT("no preferred location after the unset", range_int(cudaMemRangeAttributePreferredLocation, managed, M) == cudaInvalidDeviceId);
    int accessed[3] = {-99, -99, -99};
    OK("nothing accessed-by yet", cudaMemRangeGetAttribute(accessed, sizeof accessed, cudaMemRangeAttributeAccessedBy, managed, M));
    EXPECT("no device listed", accessed[0] == cudaInvalidDeviceId && accessed[1] == cudaInvalidDeviceId && accessed[2] == cudaInvalidDeviceId);
    OK("accessed by device 0", cudaMemAdvise(managed, M, cudaMemAdviseSetAccessedBy, device0));
    OK("accessed-by", cudaMemRangeGetAttribute(accessed, sizeof accessed, cudaMemRangeAttributeAccessedBy, managed, M));
    EXPECT("device 0 listed, the rest invalid", accessed[0] == 0 && accessed[1] == cudaInvalidDeviceId && accessed[2] == cudaInvalidDeviceId);
    OK("no longer accessed by device 0 on a page", cudaMemAdvise(managed + N, N, cudaMemAdviseUnsetAccessedBy, device0));
    OK("accessed-by over the whole", cudaMemRangeGetAttribute(accessed, sizeof accessed, cudaMemRangeAttributeAccessedBy, managed, M));
    EXPECT("a device listed only for the whole range", accessed[0] == cudaInvalidDeviceId);
    EXPECT_CODE("accessed-by into 6 bytes", cudaMemRangeGetAttribute(accessed, 6, cudaMemRangeAttributeAccessedBy, managed, M),
                cudaErrorInvalidValue);
    EXPECT_CODE("advice to a device that does not exist",
                cudaMemAdvise(managed, M, cudaMemAdviseSetPreferredLocation, location(cudaMemLocationTypeDevice, 7)), cudaErrorInvalidDevice);
    EXPECT_CODE("an unknown advice", cudaMemAdvise(managed, M, (enum cudaMemoryAdvise)99, device0), cudaErrorInvalidValue);
    EXPECT_CODE("advice past the block", cudaMemAdvise(managed, M + 1, cudaMemAdviseSetReadMostly, device0), cudaErrorInvalidValue);
    EXPECT_CODE("advice on 0 bytes", cudaMemAdvise(managed, 0, cudaMemAdviseSetReadMostly, device0), cudaErrorInvalidValue);

    /* Several attributes at once. */
    int read_mostly = -99, preferred = -99, last = -99;
    void *data[3] = {&read_mostly, &preferred, &last};
    size_t data_sizes[3] = {sizeof read_mostly, sizeof preferred, sizeof last};
    enum cudaMemRangeAttribute asked[3] = {cudaMemRangeAttributeReadMostly, cudaMemRangeAttributePreferredLocation,
                                           cudaMemRangeAttributeLastPrefetchLocation};
    OK("cudaMemRangeGetAttributes", cudaMemRangeGetAttributes(data, data_sizes, asked, 3, managed + 2 * N + 200, 300));
    EXPECT("three attributes at once", read_mostly == 1 && preferred == cudaInvalidDeviceId && last == cudaCpuDeviceId);
    EXPECT_CODE("no attributes", cudaMemRangeGetAttributes(data, data_sizes, asked, 0, managed, M), cudaErrorInvalidValue);
    EXPECT_CODE("attributes into NULL", cudaMemRangeGetAttributes(NULL, data_sizes, asked, 3, managed, M), cudaErrorInvalidValue);
    EXPECT_CODE("an int attribute of 8 bytes", cudaMemRangeGetAttribute(&value, 8, cudaMemRangeAttributeReadMostly, managed, M),
                cudaErrorInvalidValue);
    EXPECT_CODE("an attribute into NULL", cudaMemRangeGetAttribute(NULL, 4, cudaMemRangeAttributeReadMostly, managed, M),
                cudaErrorInvalidValue);
    EXPECT_CODE("an unknown attribute", cudaMemRangeGetAttribute(&value, sizeof value, (enum cudaMemRangeAttribute)99, managed, M),
                cudaErrorInvalidValue);
    EXPECT_CODE("a range past the block", cudaMemRangeGetAttribute(&value, sizeof value, cudaMemRangeAttributeReadMostly, managed, M + 1),
                cudaErrorInvalidValue);

    /* Stream attachment: the whole allocation, by length 0 or its size. */
    OK("cudaStreamAttachMemAsync single", cudaStreamAttachMemAsync(stream, managed, 0, cudaMemAttachSingle));
    OK("attach the whole size", cudaStreamAttachMemAsync(stream, managed, M, cudaMemAttachGlobal));
    OK("attach to the host", cudaStreamAttachMemAsync(stream, other, 0, cudaMemAttachHost));
    OK("sync the attachments", cudaStreamSynchronize(stream));
    OK("cudaStreamAttachMemAsync_ptsz", cudaStreamAttachMemAsync_ptsz(NULL, managed, 0, cudaMemAttachGlobal));
    EXPECT_CODE("attach a part", cudaStreamAttachMemAsync(stream, managed, M / 2, cudaMemAttachGlobal), cudaErrorInvalidValue);
    EXPECT_CODE("attach from inside", cudaStreamAttachMemAsync(stream, managed + 8, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
    EXPECT_CODE("attach singly to the NULL stream", cudaStreamAttachMemAsync(NULL, managed, 0, cudaMemAttachSingle), cudaErrorInvalidValue);
    EXPECT_CODE("an unknown attach flag", cudaStreamAttachMemAsync(stream, managed, 0, 8), cudaErrorInvalidValue);
    EXPECT_CODE("attach on an unknown stream", cudaStreamAttachMemAsync(BOGUS_STREAM, managed, 0, cudaMemAttachGlobal),
                cudaErrorInvalidResourceHandle);

    /* Batches: the first range to device 0, the second to the host. */
    void *both[2] = {managed, other};
    size_t sizes[2] = {M, N}, starts[2] = {0, 1}, bad_starts[2] = {1, 0};
    struct cudaMemLocation where[2] = {device0, host};
    OK("cudaMemPrefetchBatchAsync", cudaMemPrefetchBatchAsync(both, sizes, 2, where, starts, 2, 0, stream));
    EXPECT("the batch's first range on device 0", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, M) == 0);
    EXPECT("the batch's second range on the host", range_int(cudaMemRangeAttributeLastPrefetchLocation, other, N) == cudaCpuDeviceId);
    OK("cudaMemPrefetchBatchAsync_ptsz, one location for both", cudaMemPrefetchBatchAsync_ptsz(both, sizes, 2, where + 1, starts, 1, 0, stream));
    EXPECT("both on the host", range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, M) == cudaCpuDeviceId &&
                                   range_int(cudaMemRangeAttributeLastPrefetchLocation, other, N) == cudaCpuDeviceId);
    EXPECT_CODE("a first location index that is not 0", cudaMemPrefetchBatchAsync(both, sizes, 2, where, bad_starts, 2, 0, stream),
                cudaErrorInvalidValue);
    EXPECT_CODE("more locations than ranges", cudaMemPrefetchBatchAsync(both, sizes, 1, where, starts, 2, 0, stream), cudaErrorInvalidValue);
    EXPECT_CODE("an empty batch", cudaMemPrefetchBatchAsync(both, sizes, 0, where, starts, 1, 0, stream), cudaErrorInvalidValue);
    EXPECT_CODE("a batch with flags", cudaMemPrefetchBatchAsync(both, sizes, 2, where, starts, 2, 1, stream), cudaErrorInvalidValue);
    OK("cudaMemDiscardBatchAsync", cudaMemDiscardBatchAsync(both, sizes, 2, 0, stream));
    OK("cudaMemDiscardBatchAsync_ptsz", cudaMemDiscardBatchAsync_ptsz(both, sizes, 1, 0, stream));
    EXPECT_CODE("a discard with flags", cudaMemDiscardBatchAsync(both, sizes, 2, 1, stream), cudaErrorInvalidValue);
    EXPECT_CODE("an empty discard", cudaMemDiscardBatchAsync(both, sizes, 0, 0, stream), cudaErrorInvalidValue);
    void *mixed[2] = {managed, dev};
    EXPECT_CODE("a discard of device memory among managed", cudaMemDiscardBatchAsync(mixed, sizes, 2, 0, stream), cudaErrorInvalidValue);
    OK("cudaMemDiscardAndPrefetchBatchAsync", cudaMemDiscardAndPrefetchBatchAsync(both, sizes, 2, where, starts, 2, 0, stream));
    EXPECT("discarded and prefetched: device 0, the host",
           range_int(cudaMemRangeAttributeLastPrefetchLocation, managed, M) == 0 &&
               range_int(cudaMemRangeAttributeLastPrefetchLocation, other, N) == cudaCpuDeviceId);
    OK("cudaMemDiscardAndPrefetchBatchAsync_ptsz", cudaMemDiscardAndPrefetchBatchAsync_ptsz(both, sizes, 2, where, starts, 1, 0, stream));
    EXPECT("discarded and prefetched: both on device 0", range_int(cudaMemRangeAttributeLastPrefetchLocation, other, N) == 0);
    EXPECT_CODE("a discard and prefetch to a device that does not exist",
                cudaMemDiscardAndPrefetchBatchAsync(both, sizes, 2, (struct cudaMemLocation[]){location(cudaMemLocationTypeDevice, 7)}, starts, 1, 0, stream),
                cudaErrorInvalidDevice);
    OK("sync the batches", cudaStreamSynchronize(stream));

    /* cudaFree of managed memory. */
    EXPECT_CODE("free from inside", cudaFree(managed + 1), cudaErrorInvalidValue);
    EXPECT_CODE("cudaFreeHost of managed memory", cudaFreeHost(managed), cudaErrorInvalidValue);
    OK("cudaFree of managed memory", cudaFree(managed));
    EXPECT_CODE("freed managed memory takes no prefetch", cudaMemPrefetchAsync(managed, M, device0, 0, stream), cudaErrorInvalidValue);
    OK("attributes after the free", cudaPointerGetAttributes(&attributes, managed));
    EXPECT("freed managed memory is no memory of CUDA's", attributes.type == cudaMemoryTypeUnregistered);
    EXPECT_CODE("double free", cudaFree(managed), cudaErrorInvalidValue);
    OK("cudaFree of the other", cudaFree(other));
    OK("cudaFree", cudaFree(dev));
    OK("cudaStreamDestroy", cudaStreamDestroy(stream));
}

static void streams_and_events(void) {
    cudaStream_t stream = NULL, other = NULL;
    cudaEvent_t start = NULL, stop = NULL, untimed = NULL, shared = NULL;
    unsigned flags = 99;
    int priority = 99, least = 99, greatest = 99;
    float ms = -1;
    void *dev = NULL;
    OK("cudaMalloc for the stream audit", cudaMalloc(&dev, N));

    AUDIT("cudaStreamCreate");
    EXPECT_CODE("cudaStreamCreate(NULL)", cudaStreamCreate(NULL), cudaErrorInvalidValue);
    OK("cudaStreamCreate", cudaStreamCreate(&stream));
    OK("a new stream is idle", cudaStreamQuery(stream));
    AUDIT("cudaStreamGetFlags");
    EXPECT_CODE("flags of an unknown stream", cudaStreamGetFlags(BOGUS_STREAM, &flags), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("flags into NULL", cudaStreamGetFlags(stream, NULL), cudaErrorInvalidValue);
    OK("cudaStreamGetFlags", cudaStreamGetFlags(stream, &flags));
    EXPECT("default stream flags", flags == cudaStreamDefault);
    OK("cudaStreamDestroy", cudaStreamDestroy(stream));

    AUDIT("cudaStreamCreateWithFlags");
    EXPECT_CODE("unknown stream flag", cudaStreamCreateWithFlags(&stream, 0x2), cudaErrorInvalidValue);
    OK("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    OK("its flags", cudaStreamGetFlags(stream, &flags));
    EXPECT("non-blocking kept", flags == cudaStreamNonBlocking);
    AUDIT("cudaStreamGetFlags_ptsz");
    EXPECT_CODE("flags_ptsz of an unknown stream", cudaStreamGetFlags_ptsz(BOGUS_STREAM, &flags), cudaErrorInvalidResourceHandle);
    OK("flags_ptsz of a created stream", cudaStreamGetFlags_ptsz(stream, &flags));
    EXPECT("flags_ptsz agrees", flags == cudaStreamNonBlocking);
    flags = 99;
    OK("flags_ptsz of the per-thread stream", cudaStreamGetFlags_ptsz(NULL, &flags));
    EXPECT("the per-thread stream blocks", flags == cudaStreamDefault);

    AUDIT("cudaDeviceGetStreamPriorityRange");
    OK("both out-pointers may be NULL", cudaDeviceGetStreamPriorityRange(NULL, NULL));
    OK("cudaDeviceGetStreamPriorityRange", cudaDeviceGetStreamPriorityRange(&least, &greatest));
    EXPECT("priorities run from least to greatest", greatest <= least);
    AUDIT("cudaStreamCreateWithPriority");
    EXPECT_CODE("cudaStreamCreateWithPriority(NULL)", cudaStreamCreateWithPriority(NULL, 0, 0), cudaErrorInvalidValue);
    EXPECT_CODE("unknown flag", cudaStreamCreateWithPriority(&other, 0x4, 0), cudaErrorInvalidValue);
    OK("beyond the range", cudaStreamCreateWithPriority(&other, cudaStreamNonBlocking, greatest - 100));
    AUDIT("cudaStreamGetPriority");
    EXPECT_CODE("priority of an unknown stream", cudaStreamGetPriority(BOGUS_STREAM, &priority), cudaErrorInvalidResourceHandle);
    OK("cudaStreamGetPriority", cudaStreamGetPriority(other, &priority));
    EXPECT("clamped to the greatest priority", priority == greatest);
    AUDIT("cudaStreamGetPriority_ptsz");
    EXPECT_CODE("priority_ptsz into NULL", cudaStreamGetPriority_ptsz(other, NULL), cudaErrorInvalidValue);
    OK("priority_ptsz", cudaStreamGetPriority_ptsz(other, &priority));
    EXPECT("priority_ptsz agrees", priority == greatest);
    OK("priority_ptsz of the per-thread stream", cudaStreamGetPriority_ptsz(NULL, &priority));
    EXPECT("the per-thread stream has the default priority", priority == 0);

    // Stream attributes: an access policy window over the app's memory, copied to another stream.
    void *window_memory = NULL;
    OK("cudaMalloc for a window", cudaMalloc(&window_memory, 1 << 16));
    cudaStreamAttrValue window, window_back;
    memset(&window, 0, sizeof window);
    window.accessPolicyWindow.base_ptr = window_memory;
    window.accessPolicyWindow.num_bytes = 1 << 16;
    window.accessPolicyWindow.hitRatio = 0.25f;
    window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    AUDIT("cudaStreamSetAttribute");
    OK("cudaStreamSetAttribute", cudaStreamSetAttribute(other, cudaStreamAttributeAccessPolicyWindow, &window));
    AUDIT("cudaStreamSetAttribute_ptsz");
    OK("cudaStreamSetAttribute_ptsz", cudaStreamSetAttribute_ptsz(other, cudaStreamAttributeAccessPolicyWindow, &window));
    AUDIT("cudaStreamCopyAttributes");
    cudaStream_t copied = NULL;
    OK("a stream to copy into", cudaStreamCreate(&copied));
    OK("cudaStreamCopyAttributes", cudaStreamCopyAttributes(copied, other));
    AUDIT("cudaStreamCopyAttributes_ptsz");
    OK("cudaStreamCopyAttributes_ptsz", cudaStreamCopyAttributes_ptsz(copied, other));
    AUDIT("cudaStreamGetAttribute");
    memset(&window_back, 0, sizeof window_back);
    OK("cudaStreamGetAttribute", cudaStreamGetAttribute(copied, cudaStreamAttributeAccessPolicyWindow, &window_back));
    EXPECT("the window was copied", window_back.accessPolicyWindow.base_ptr == window_memory &&
                                        window_back.accessPolicyWindow.num_bytes == (1 << 16) &&
                                        window_back.accessPolicyWindow.hitRatio == 0.25f);
    AUDIT("cudaStreamGetAttribute_ptsz");
    EXPECT_CODE("an attribute streams do not take", cudaStreamGetAttribute_ptsz(copied, cudaLaunchAttributeCooperative, &window_back),
                cudaErrorInvalidValue);
    window.accessPolicyWindow.base_ptr = (void *)&window;
    EXPECT_CODE("a window over host memory", cudaStreamSetAttribute(other, cudaStreamAttributeAccessPolicyWindow, &window),
                cudaErrorInvalidValue);
    OK("destroy the copy", cudaStreamDestroy(copied));
    OK("free the window", cudaFree(window_memory));

    // CUDA IPC: the emulated device's memory lives in its worker process, which no other
    // session's worker can map, so exporting and opening are refused (gpu-tests/ipc.cu runs them
    // between two processes on a GPU); closing what was never opened is invalid everywhere.
    void *ipc_memory = NULL;
    OK("cudaMalloc to export", cudaMalloc(&ipc_memory, 4096));
    cudaIpcMemHandle_t mem_handle;
    memset(&mem_handle, 0, sizeof mem_handle);
    AUDIT("cudaIpcGetMemHandle");
    EXPECT_CODE("exporting host memory", cudaIpcGetMemHandle(&mem_handle, (void *)&mem_handle), cudaErrorInvalidValue);
    EXPECT_CODE("exporting on the emulated device", cudaIpcGetMemHandle(&mem_handle, ipc_memory), cudaErrorNotSupported);
    AUDIT("cudaIpcOpenMemHandle");
    void *opened = NULL;
    EXPECT_CODE("an unknown flag", cudaIpcOpenMemHandle(&opened, mem_handle, 0x2), cudaErrorInvalidValue);
    EXPECT_CODE("opening on the emulated device", cudaIpcOpenMemHandle(&opened, mem_handle, cudaIpcMemLazyEnablePeerAccess),
                cudaErrorNotSupported);
    AUDIT("cudaIpcCloseMemHandle");
    EXPECT_CODE("closing an allocation of one's own", cudaIpcCloseMemHandle(ipc_memory), cudaErrorInvalidValue);
    OK("free the memory", cudaFree(ipc_memory));
    cudaIpcEventHandle_t event_handle;
    memset(&event_handle, 0, sizeof event_handle);
    AUDIT("cudaIpcGetEventHandle");
    EXPECT_CODE("an unknown event", cudaIpcGetEventHandle(&event_handle, (cudaEvent_t)BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    AUDIT("cudaIpcOpenEventHandle");
    cudaEvent_t ipc_event = NULL;
    EXPECT_CODE("opening on the emulated device", cudaIpcOpenEventHandle(&ipc_event, event_handle), cudaErrorNotSupported);

    AUDIT("cudaEventCreate");
    EXPECT_CODE("cudaEventCreate(NULL)", cudaEventCreate(NULL), cudaErrorInvalidValue);
    OK("cudaEventCreate", cudaEventCreate(&start));
    OK("a new event is complete", cudaEventQuery(start));
    AUDIT("cudaEventCreateWithFlags");
    EXPECT_CODE("unknown event flag", cudaEventCreateWithFlags(&stop, 0x8), cudaErrorInvalidValue);
    EXPECT_CODE("interprocess without DisableTiming", cudaEventCreateWithFlags(&shared, cudaEventInterprocess),
                cudaErrorInvalidValue);
    OK("interprocess", cudaEventCreateWithFlags(&shared, cudaEventInterprocess | cudaEventDisableTiming));
    OK("blocking sync", cudaEventCreateWithFlags(&stop, cudaEventBlockingSync));
    OK("without timing", cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));

    AUDIT("cudaEventElapsedTime");
    EXPECT_CODE("elapsed into NULL", cudaEventElapsedTime(NULL, start, stop), cudaErrorInvalidValue);
    EXPECT_CODE("elapsed of events never recorded", cudaEventElapsedTime(&ms, start, stop), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("elapsed of an unknown event", cudaEventElapsedTime(&ms, BOGUS_EVENT, stop), cudaErrorInvalidResourceHandle);

    AUDIT("cudaEventRecord");
    EXPECT_CODE("record of an unknown event", cudaEventRecord(BOGUS_EVENT, stream), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("record on an unknown stream", cudaEventRecord(start, BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    OK("cudaEventRecord start", cudaEventRecord(start, stream));
    sleep_ms(30);
    AUDIT("cudaEventRecord_ptsz");
    EXPECT_CODE("record_ptsz of an unknown event", cudaEventRecord_ptsz(BOGUS_EVENT, NULL), cudaErrorInvalidResourceHandle);
    OK("cudaEventRecord_ptsz stop", cudaEventRecord_ptsz(stop, stream));
    AUDIT("cudaEventSynchronize");
    EXPECT_CODE("synchronize an unknown event", cudaEventSynchronize(BOGUS_EVENT), cudaErrorInvalidResourceHandle);
    OK("cudaEventSynchronize", cudaEventSynchronize(stop));
    AUDIT("cudaEventQuery");
    EXPECT_CODE("query an unknown event", cudaEventQuery(BOGUS_EVENT), cudaErrorInvalidResourceHandle);
    OK("cudaEventQuery", cudaEventQuery(stop));
    OK("cudaEventElapsedTime", cudaEventElapsedTime(&ms, start, stop));
    EXPECT("30 ms between the records are measured", ms >= 10.0f && ms < 10000.0f);
    OK("cudaEventRecord untimed", cudaEventRecord(untimed, stream));
    EXPECT_CODE("an event without timing has no time", cudaEventElapsedTime(&ms, start, untimed),
                cudaErrorInvalidResourceHandle);
    /* A record that fails leaves the event without the time the app meant: no elapsed time. */
    EXPECT_CODE("a failed record", cudaEventRecord(stop, BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("no elapsed time from an event whose record failed", cudaEventElapsedTime(&ms, start, stop),
                cudaErrorInvalidResourceHandle);
    OK("recording it again", cudaEventRecord(stop, stream));
    OK("elapsed time again", cudaEventElapsedTime(&ms, start, stop));

    AUDIT("cudaEventRecordWithFlags");
    EXPECT_CODE("unknown record flag", cudaEventRecordWithFlags(start, stream, 0x2), cudaErrorInvalidValue);
    /* cudaEventRecordExternal changes only what a capture records; outside capture it is a record. */
    OK("cudaEventRecordWithFlags(External)", cudaEventRecordWithFlags(start, stream, cudaEventRecordExternal));
    sleep_ms(20);
    AUDIT("cudaEventRecordWithFlags_ptsz");
    EXPECT_CODE("unknown record flag (ptsz)", cudaEventRecordWithFlags_ptsz(stop, NULL, 0x4), cudaErrorInvalidValue);
    OK("cudaEventRecordWithFlags_ptsz", cudaEventRecordWithFlags_ptsz(stop, stream, cudaEventRecordDefault));
    OK("elapsed time of the flagged records", cudaEventElapsedTime(&ms, start, stop));
    EXPECT("the flagged records fired when recorded", ms >= 5.0f && ms < 10000.0f);

    AUDIT("cudaStreamWaitEvent");
    EXPECT_CODE("wait for an unknown event", cudaStreamWaitEvent(stream, BOGUS_EVENT, 0), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("wait on an unknown stream", cudaStreamWaitEvent(BOGUS_STREAM, stop, 0), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("unknown wait flag", cudaStreamWaitEvent(stream, stop, 0x2), cudaErrorInvalidValue);
    OK("cudaStreamWaitEvent", cudaStreamWaitEvent(other, stop, 0));
    OK("cudaStreamWaitEvent(External)", cudaStreamWaitEvent(other, stop, cudaEventWaitExternal));
    OK("the waiting stream drains", cudaStreamSynchronize(other));
    AUDIT("cudaStreamWaitEvent_ptsz");
    EXPECT_CODE("wait_ptsz for an unknown event", cudaStreamWaitEvent_ptsz(NULL, BOGUS_EVENT, 0), cudaErrorInvalidResourceHandle);
    OK("cudaStreamWaitEvent_ptsz", cudaStreamWaitEvent_ptsz(NULL, stop, 0));

    AUDIT("cudaStreamSynchronize");
    EXPECT_CODE("synchronize an unknown stream", cudaStreamSynchronize(BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    memset(host_b, 0, N);
    OK("memset on the stream", cudaMemsetAsync(dev, 0x42, N, stream));
    OK("D2H on the stream", cudaMemcpyAsync(host_b, dev, N, cudaMemcpyDeviceToHost, stream));
    OK("cudaStreamSynchronize", cudaStreamSynchronize(stream));
    EXPECT("the stream's work is done at its synchronization", all_bytes(host_b, N, 0x42));
    AUDIT("cudaStreamSynchronize_ptsz");
    EXPECT_CODE("synchronize_ptsz an unknown stream", cudaStreamSynchronize_ptsz(BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    memset(host_b, 0, N);
    OK("D2H on the per-thread stream", cudaMemcpyAsync_ptsz(host_b, dev, N, cudaMemcpyDeviceToHost, NULL));
    OK("cudaStreamSynchronize_ptsz", cudaStreamSynchronize_ptsz(NULL));
    EXPECT("the per-thread stream's work is done", all_bytes(host_b, N, 0x42));
    AUDIT("cudaStreamQuery");
    EXPECT_CODE("query an unknown stream", cudaStreamQuery(BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    memset(host_b, 0, N);
    OK("memset on the stream", cudaMemsetAsync(dev, 0x43, N, stream));
    OK("D2H on the stream", cudaMemcpyAsync(host_b, dev, N, cudaMemcpyDeviceToHost, stream));
    OK("cudaStreamQuery", cudaStreamQuery(stream));
    EXPECT("a query that answers success means the work is done", all_bytes(host_b, N, 0x43));
    AUDIT("cudaStreamQuery_ptsz");
    EXPECT_CODE("query_ptsz an unknown stream", cudaStreamQuery_ptsz(BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    OK("cudaStreamQuery_ptsz", cudaStreamQuery_ptsz(NULL));

    AUDIT("cudaEventDestroy");
    EXPECT_CODE("destroy an unknown event", cudaEventDestroy(BOGUS_EVENT), cudaErrorInvalidResourceHandle);
    OK("cudaEventDestroy", cudaEventDestroy(start));
    EXPECT_CODE("a destroyed event is gone", cudaEventQuery(start), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("destroy it again", cudaEventDestroy(start), cudaErrorInvalidResourceHandle);
    OK("destroy the others", cudaEventDestroy(stop));
    OK("destroy the others", cudaEventDestroy(untimed));
    OK("destroy the others", cudaEventDestroy(shared));

    AUDIT("cudaStreamDestroy");
    EXPECT_CODE("destroy an unknown stream", cudaStreamDestroy(BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("destroy the legacy stream", cudaStreamDestroy(NULL), cudaErrorInvalidResourceHandle);
    OK("cudaStreamDestroy", cudaStreamDestroy(stream));
    EXPECT_CODE("a destroyed stream is gone", cudaStreamQuery(stream), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("destroy it again", cudaStreamDestroy(stream), cudaErrorInvalidResourceHandle);
    OK("destroy the other", cudaStreamDestroy(other));

    AUDIT("cudaDeviceSynchronize");
    memset(host_b, 0, N);
    OK("memset on the legacy stream", cudaMemsetAsync(dev, 0x44, N, NULL));
    OK("D2H on the legacy stream", cudaMemcpyAsync(host_b, dev, N, cudaMemcpyDeviceToHost, NULL));
    OK("cudaDeviceSynchronize", cudaDeviceSynchronize());
    EXPECT("all work is done at the device synchronization", all_bytes(host_b, N, 0x44));
    /* An asynchronous call the server refused is reported at the next synchronization, once. */
    OK("a launch of a graph that does not exist is queued", cudaGraphLaunch(BOGUS_GRAPH_EXEC, NULL));
    EXPECT_CODE("the synchronization after it", cudaDeviceSynchronize(), cudaErrorInvalidValue);
    OK("and the one after that", cudaDeviceSynchronize());
    OK("cudaFree", cudaFree(dev));
}


static volatile int host_calls = 0;
static void CUDART_CB count_host_call(void *counter) { ++*(volatile int *)counter; }
static void CUDART_CB count_stream_callback(cudaStream_t stream, cudaError_t status, void *counter) {
    (void)stream;
    if (status == cudaSuccess) ++*(volatile int *)counter;
}

/* Graphs without kernels (the emulated device runs none): capture, explicit nodes, launches,
 * updates and host functions, each read back. */
static void graphs(void) {
    unsigned char *a = NULL, *b = NULL;
    cudaStream_t stream, side;
    cudaEvent_t event;
    cudaGraph_t graph = NULL, child = NULL, clone = NULL, captured = NULL;
    cudaGraphExec_t exec = NULL, other = NULL;
    cudaGraphNode_t set = NULL, copy = NULL, empty = NULL, sub = NULL, record = NULL, wait = NULL, host = NULL, found = NULL;
    cudaGraphNode_t listed[16];
    size_t count = 0;
    enum cudaGraphNodeType type = cudaGraphNodeTypeCount;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    unsigned long long id = 0;
    cudaGraph_t capture_graph = NULL;
    const cudaGraphNode_t *deps = NULL;
    OK("graph memory", cudaMalloc((void **)&a, N));
    OK("graph memory", cudaMalloc((void **)&b, N));
    OK("a graph stream", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    OK("a second graph stream", cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    OK("a graph event", cudaEventCreateWithFlags(&event, cudaEventDisableTiming));

    AUDIT("cudaThreadExchangeStreamCaptureMode");
    OK("cudaThreadExchangeStreamCaptureMode", cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT("the previous mode is global", mode == cudaStreamCaptureModeGlobal);
    OK("back to global", cudaThreadExchangeStreamCaptureMode(&mode));

    AUDIT("cudaStreamBeginCapture");
    AUDIT("cudaStreamIsCapturing");
    AUDIT("cudaStreamGetCaptureInfo");
    AUDIT("cudaStreamEndCapture");
    EXPECT_CODE("the legacy stream cannot be captured", cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal),
                cudaErrorStreamCaptureUnsupported);
    EXPECT_CODE("end a capture never begun", cudaStreamEndCapture(stream, &captured), cudaErrorIllegalState);
    OK("cudaStreamIsCapturing outside a capture", cudaStreamIsCapturing(stream, &status));
    EXPECT("not capturing", status == cudaStreamCaptureStatusNone);
    OK("cudaStreamBeginCapture", cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    OK("memset in the capture", cudaMemsetAsync(a, 0x21, N, stream));
    OK("cudaStreamIsCapturing", cudaStreamIsCapturing(stream, &status));
    EXPECT("capturing", status == cudaStreamCaptureStatusActive);
    OK("cudaStreamGetCaptureInfo", cudaStreamGetCaptureInfo(stream, &status, &id, &capture_graph, &deps, NULL, &count));
    EXPECT("the capture's id, graph and one dependency", id != 0 && capture_graph != NULL && count == 1 && deps != NULL);
    OK("copy in the capture", cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, stream));
    OK("cudaStreamEndCapture", cudaStreamEndCapture(stream, &captured));
    EXPECT("the graph is the capture's", captured == capture_graph);
    EXPECT("the captured work did not run", device_bytes_are(b, N, 0) || !device_bytes_are(b, N, 0x21));
    AUDIT("cudaStreamBeginCapture_ptsz");
    AUDIT("cudaStreamIsCapturing_ptsz");
    AUDIT("cudaStreamGetCaptureInfo_ptsz");
    AUDIT("cudaStreamEndCapture_ptsz");
    OK("cudaStreamBeginCapture_ptsz", cudaStreamBeginCapture_ptsz(stream, cudaStreamCaptureModeRelaxed));
    OK("cudaStreamIsCapturing_ptsz", cudaStreamIsCapturing_ptsz(stream, &status));
    OK("cudaStreamGetCaptureInfo_ptsz", cudaStreamGetCaptureInfo_ptsz(stream, &status, &id, NULL, NULL, NULL, NULL));
    EXPECT("capturing through _ptsz", status == cudaStreamCaptureStatusActive);
    OK("cudaStreamEndCapture_ptsz", cudaStreamEndCapture_ptsz(stream, &graph));
    OK("an empty captured graph is destroyed", cudaGraphDestroy(graph));

    AUDIT("cudaGraphGetNodes");
    AUDIT("cudaGraphNodeGetType");
    OK("cudaGraphGetNodes", cudaGraphGetNodes(captured, NULL, &count));
    EXPECT("two captured nodes", count == 2);
    count = 16;
    OK("cudaGraphGetNodes into an array", cudaGraphGetNodes(captured, listed, &count));
    OK("cudaGraphNodeGetType", cudaGraphNodeGetType(listed[0], &type));
    EXPECT("the first is the memset", count == 2 && type == cudaGraphNodeTypeMemset);
    EXPECT_CODE("an unknown graph", cudaGraphGetNodes(BOGUS_GRAPH, NULL, &count), cudaErrorInvalidValue);

    AUDIT("cudaGraphInstantiate");
    AUDIT("cudaGraphLaunch");
    AUDIT("cudaGraphUpload");
    AUDIT("cudaGraphExecDestroy");
    OK("cudaGraphInstantiate", cudaGraphInstantiate(&exec, captured, 0));
    OK("cudaGraphUpload", cudaGraphUpload(exec, stream));
    OK("cudaGraphLaunch", cudaGraphLaunch(exec, stream));
    OK("synchronize the launch", cudaStreamSynchronize(stream));
    EXPECT("the captured graph ran", device_bytes_are(b, N, 0x21));
    AUDIT("cudaGraphLaunch_ptsz");
    AUDIT("cudaGraphUpload_ptsz");
    OK("cudaGraphUpload_ptsz", cudaGraphUpload_ptsz(exec, stream));
    OK("cudaMemset", cudaMemset(b, 0, N));
    OK("cudaGraphLaunch_ptsz", cudaGraphLaunch_ptsz(exec, stream));
    OK("synchronize the _ptsz launch", cudaStreamSynchronize(stream));
    EXPECT("the _ptsz launch ran", device_bytes_are(b, N, 0x21));
    OK("cudaGraphExecDestroy", cudaGraphExecDestroy(exec));
    OK("destroy the captured graph", cudaGraphDestroy(captured));

    AUDIT("cudaGraphCreate");
    AUDIT("cudaGraphAddMemsetNode");
    AUDIT("cudaGraphAddMemcpyNode1D");
    AUDIT("cudaGraphAddEmptyNode");
    AUDIT("cudaGraphAddChildGraphNode");
    AUDIT("cudaGraphAddEventRecordNode");
    AUDIT("cudaGraphAddEventWaitNode");
    AUDIT("cudaGraphAddHostNode");
    AUDIT("cudaGraphAddMemcpyNode");
    AUDIT("cudaGraphAddKernelNode");
    AUDIT("cudaGraphAddDependencies");
    AUDIT("cudaGraphRemoveDependencies");
    AUDIT("cudaGraphGetRootNodes");
    EXPECT_CODE("flags must be 0", cudaGraphCreate(&graph, 1), cudaErrorInvalidValue);
    OK("cudaGraphCreate", cudaGraphCreate(&graph, 0));
    struct cudaMemsetParams memset_params = {a, 0, 0x5a, 1, N, 1};
    OK("cudaGraphAddMemsetNode", cudaGraphAddMemsetNode(&set, graph, NULL, 0, &memset_params));
    OK("cudaGraphAddMemcpyNode1D", cudaGraphAddMemcpyNode1D(&copy, graph, &set, 1, b, a, N, cudaMemcpyDeviceToDevice));
    cudaGraphNode_t to_host;
    memset(host_a, 0, N);
    OK("a copy node into host memory", cudaGraphAddMemcpyNode1D(&to_host, graph, &copy, 1, host_a, b, N, cudaMemcpyDeviceToHost));
    struct cudaMemcpy3DParms copy3d;
    memset(&copy3d, 0, sizeof copy3d);
    copy3d.srcPtr.ptr = b;
    copy3d.srcPtr.pitch = copy3d.srcPtr.xsize = N / 4;
    copy3d.srcPtr.ysize = 4;
    copy3d.dstPtr = copy3d.srcPtr;
    copy3d.dstPtr.ptr = a;
    copy3d.extent.width = N / 4;
    copy3d.extent.height = 4;
    copy3d.extent.depth = 1;
    copy3d.kind = cudaMemcpyDeviceToDevice;
    OK("cudaGraphAddMemcpyNode (pitched, back again)", cudaGraphAddMemcpyNode(&found, graph, &copy, 1, &copy3d));
    OK("cudaGraphAddEmptyNode", cudaGraphAddEmptyNode(&empty, graph, NULL, 0));
    OK("a child graph", cudaGraphCreate(&child, 0));
    OK("a node of the child", cudaGraphAddEmptyNode(&sub, child, NULL, 0));
    OK("cudaGraphAddChildGraphNode", cudaGraphAddChildGraphNode(&sub, graph, &empty, 1, child));
    OK("cudaGraphAddEventRecordNode", cudaGraphAddEventRecordNode(&record, graph, &found, 1, event));
    OK("cudaGraphAddEventWaitNode", cudaGraphAddEventWaitNode(&wait, graph, NULL, 0, event));
    struct cudaHostNodeParams host_params = {count_host_call, (void *)&host_calls};
    OK("cudaGraphAddHostNode", cudaGraphAddHostNode(&host, graph, &record, 1, &host_params));
    struct cudaKernelNodeParams kernel_params;
    memset(&kernel_params, 0, sizeof kernel_params);
    kernel_params.func = (void *)not_a_kernel;
    kernel_params.gridDim.x = kernel_params.gridDim.y = kernel_params.gridDim.z = 1;
    kernel_params.blockDim = kernel_params.gridDim;
    EXPECT_CODE("cudaGraphAddKernelNode of a host function", cudaGraphAddKernelNode(&found, graph, NULL, 0, &kernel_params),
                cudaErrorInvalidDeviceFunction);
    OK("cudaGraphGetRootNodes", cudaGraphGetRootNodes(graph, NULL, &count));
    EXPECT("three roots: the memset, the empty node and the wait", count == 3);
    OK("cudaGraphAddDependencies", cudaGraphAddDependencies(graph, &set, &wait, NULL, 1));
    OK("roots after the edge", cudaGraphGetRootNodes(graph, NULL, &count));
    EXPECT("two roots after the edge", count == 2);
    OK("cudaGraphRemoveDependencies", cudaGraphRemoveDependencies(graph, &set, &wait, NULL, 1));
    EXPECT_CODE("remove it again", cudaGraphRemoveDependencies(graph, &set, &wait, NULL, 1), cudaErrorInvalidValue);

    AUDIT("cudaGraphInstantiateWithFlags");
    AUDIT("cudaGraphInstantiateWithParams");
    AUDIT("cudaGraphInstantiateWithParams_ptsz");
    host_calls = 0;
    OK("cudaGraphInstantiateWithFlags", cudaGraphInstantiateWithFlags(&exec, graph, 0));
    OK("launch the built graph", cudaGraphLaunch(exec, stream));
    OK("launch it again", cudaGraphLaunch(exec, stream));
    OK("synchronize the built graph", cudaStreamSynchronize(stream));
    EXPECT("the memset and the copies ran", device_bytes_are(a, N, 0x5a) && device_bytes_are(b, N, 0x5a));
    EXPECT("the host node ran once per launch", host_calls == 2);
    int host_copied = 1;
    for (size_t i = 0; i < N; i++) host_copied &= host_a[i] == 0x5a;
    EXPECT("the copy node into host memory wrote the device's bytes", host_copied);
    cudaGraphInstantiateParams instantiate = {0, stream, NULL, cudaGraphInstantiateError};
    OK("cudaGraphInstantiateWithParams", cudaGraphInstantiateWithParams(&other, graph, &instantiate));
    EXPECT("instantiated", instantiate.result_out == cudaGraphInstantiateSuccess);
    OK("destroy it", cudaGraphExecDestroy(other));
    instantiate.flags = cudaGraphInstantiateFlagUpload;
    OK("cudaGraphInstantiateWithParams_ptsz", cudaGraphInstantiateWithParams_ptsz(&other, graph, &instantiate));
    OK("destroy that", cudaGraphExecDestroy(other));

    AUDIT("cudaGraphMemsetNodeSetParams");
    AUDIT("cudaGraphExecMemsetNodeSetParams");
    AUDIT("cudaGraphMemcpyNodeSetParams1D");
    AUDIT("cudaGraphExecMemcpyNodeSetParams1D");
    AUDIT("cudaGraphMemcpyNodeSetParams");
    AUDIT("cudaGraphExecMemcpyNodeSetParams");
    AUDIT("cudaGraphHostNodeSetParams");
    AUDIT("cudaGraphExecHostNodeSetParams");
    AUDIT("cudaGraphExecChildGraphNodeSetParams");
    AUDIT("cudaGraphEventRecordNodeSetEvent");
    AUDIT("cudaGraphExecEventRecordNodeSetEvent");
    AUDIT("cudaGraphEventWaitNodeSetEvent");
    AUDIT("cudaGraphExecEventWaitNodeSetEvent");
    AUDIT("cudaGraphKernelNodeGetParams");
    AUDIT("cudaGraphKernelNodeSetParams");
    AUDIT("cudaGraphExecKernelNodeSetParams");
    memset_params.value = 0x6b;
    OK("cudaGraphExecMemsetNodeSetParams", cudaGraphExecMemsetNodeSetParams(exec, set, &memset_params));
    OK("launch after it", cudaGraphLaunch(exec, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    EXPECT("the new memset value ran", device_bytes_are(b, N, 0x6b));
    OK("cudaGraphMemsetNodeSetParams", cudaGraphMemsetNodeSetParams(set, &memset_params));
    OK("cudaGraphMemcpyNodeSetParams1D", cudaGraphMemcpyNodeSetParams1D(copy, b, a, N, cudaMemcpyDeviceToDevice));
    OK("cudaGraphExecMemcpyNodeSetParams1D", cudaGraphExecMemcpyNodeSetParams1D(exec, copy, b, a, N, cudaMemcpyDeviceToDevice));
    OK("cudaGraphMemcpyNodeSetParams", cudaGraphMemcpyNodeSetParams(found, &copy3d));
    OK("cudaGraphExecMemcpyNodeSetParams", cudaGraphExecMemcpyNodeSetParams(exec, found, &copy3d));
    EXPECT_CODE("a memset's parameters on a copy node", cudaGraphMemsetNodeSetParams(copy, &memset_params), cudaErrorInvalidValue);
    OK("cudaGraphHostNodeSetParams", cudaGraphHostNodeSetParams(host, &host_params));
    OK("cudaGraphExecHostNodeSetParams", cudaGraphExecHostNodeSetParams(exec, host, &host_params));
    OK("cudaGraphExecChildGraphNodeSetParams", cudaGraphExecChildGraphNodeSetParams(exec, sub, child));
    OK("cudaGraphEventRecordNodeSetEvent", cudaGraphEventRecordNodeSetEvent(record, event));
    OK("cudaGraphExecEventRecordNodeSetEvent", cudaGraphExecEventRecordNodeSetEvent(exec, record, event));
    OK("cudaGraphEventWaitNodeSetEvent", cudaGraphEventWaitNodeSetEvent(wait, event));
    OK("cudaGraphExecEventWaitNodeSetEvent", cudaGraphExecEventWaitNodeSetEvent(exec, wait, event));
    EXPECT_CODE("cudaGraphKernelNodeGetParams of a memset node", cudaGraphKernelNodeGetParams(set, &kernel_params), cudaErrorInvalidValue);
    EXPECT_CODE("cudaGraphKernelNodeSetParams of a host function", cudaGraphKernelNodeSetParams(set, &kernel_params),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("cudaGraphExecKernelNodeSetParams of a host function", cudaGraphExecKernelNodeSetParams(exec, set, &kernel_params),
                cudaErrorInvalidDeviceFunction);

    AUDIT("cudaGraphClone");
    AUDIT("cudaGraphNodeFindInClone");
    AUDIT("cudaGraphExecUpdate");
    AUDIT("cudaGraphDebugDotPrint");
    AUDIT("cudaGraphDestroyNode");
    AUDIT("cudaGraphDestroy");
    OK("cudaGraphClone", cudaGraphClone(&clone, graph));
    OK("cudaGraphNodeFindInClone", cudaGraphNodeFindInClone(&found, set, clone));
    EXPECT("the clone's memset is another node", found != NULL && found != set);
    cudaGraphExecUpdateResultInfo update;
    memset(&update, 0, sizeof update);
    OK("cudaGraphExecUpdate from the clone", cudaGraphExecUpdate(exec, clone, &update));
    EXPECT("updated", update.result == cudaGraphExecUpdateSuccess);
    OK("cudaGraphDestroyNode", cudaGraphDestroyNode(found));
    EXPECT_CODE("the destroyed node is gone", cudaGraphNodeGetType(found, &type), cudaErrorInvalidValue);
    EXPECT_CODE("an update from a graph of another shape", cudaGraphExecUpdate(exec, clone, &update), cudaErrorGraphExecUpdateFailure);
    char path[] = "/tmp/flyt-audit-graph-XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    OK("cudaGraphDebugDotPrint", cudaGraphDebugDotPrint(graph, path, 0));
    FILE *dot = fopen(path, "r");
    char first[16] = {0};
    EXPECT("the DOT file was written", dot != NULL && fgets(first, sizeof first, dot) != NULL && strncmp(first, "digraph", 7) == 0);
    if (dot) fclose(dot);
    unlink(path);
    OK("destroy the exec", cudaGraphExecDestroy(exec));
    OK("cudaGraphDestroy", cudaGraphDestroy(clone));
    OK("destroy the child", cudaGraphDestroy(child));
    OK("destroy the graph", cudaGraphDestroy(graph));
    EXPECT_CODE("a destroyed graph is gone", cudaGraphGetNodes(graph, NULL, &count), cudaErrorInvalidValue);

    AUDIT("cudaLaunchHostFunc");
    AUDIT("cudaLaunchHostFunc_ptsz");
    AUDIT("cudaStreamAddCallback");
    AUDIT("cudaStreamAddCallback_ptsz");
    host_calls = 0;
    EXPECT_CODE("a NULL host function", cudaLaunchHostFunc(stream, NULL, NULL), cudaErrorInvalidValue);
    OK("cudaLaunchHostFunc", cudaLaunchHostFunc(stream, count_host_call, (void *)&host_calls));
    OK("cudaLaunchHostFunc_ptsz", cudaLaunchHostFunc_ptsz(side, count_host_call, (void *)&host_calls));
    EXPECT_CODE("callback flags must be 0", cudaStreamAddCallback(stream, count_stream_callback, (void *)&host_calls, 1),
                cudaErrorInvalidValue);
    OK("cudaStreamAddCallback", cudaStreamAddCallback(stream, count_stream_callback, (void *)&host_calls, 0));
    OK("cudaStreamAddCallback_ptsz", cudaStreamAddCallback_ptsz(side, count_stream_callback, (void *)&host_calls, 0));
    OK("synchronize the host functions", cudaDeviceSynchronize());
    EXPECT("every host function ran", host_calls == 4);

    OK("free", cudaFree(a));
    OK("free", cudaFree(b));
    OK("destroy", cudaStreamDestroy(stream));
    OK("destroy", cudaStreamDestroy(side));
    OK("destroy", cudaEventDestroy(event));
}

/* Stream-ordered allocation: the default pool, a pool of the program's, attributes, trim. */
static void pools(void) {
    cudaStream_t stream;
    cudaMemPool_t pool = NULL, current = NULL, mine = NULL;
    unsigned char *a = NULL, *b = NULL;
    OK("a pool stream", cudaStreamCreate(&stream));
    AUDIT("cudaDeviceGetDefaultMemPool");
    AUDIT("cudaDeviceGetMemPool");
    AUDIT("cudaDeviceSetMemPool");
    OK("cudaDeviceGetDefaultMemPool", cudaDeviceGetDefaultMemPool(&pool, 0));
    EXPECT_CODE("of a device that does not exist", cudaDeviceGetDefaultMemPool(&pool, 7), cudaErrorInvalidDevice);
    OK("cudaDeviceGetMemPool", cudaDeviceGetMemPool(&current, 0));
    EXPECT("the current pool is the default", current == pool);

    AUDIT("cudaMemPoolSetAttribute");
    AUDIT("cudaMemPoolGetAttribute");
    unsigned long long threshold = 64 << 20, read = 0;
    OK("cudaMemPoolSetAttribute", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    OK("cudaMemPoolGetAttribute", cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &read));
    EXPECT("the threshold reads back", read == threshold);
    int reuse = -1;
    OK("an int attribute", cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &reuse));
    EXPECT("reuse is on by default", reuse == 1);
    EXPECT_CODE("an attribute that does not exist", cudaMemPoolGetAttribute(pool, (enum cudaMemPoolAttr)99, &read),
                cudaErrorInvalidValue);

    AUDIT("cudaMemPoolCreate");
    AUDIT("cudaMemPoolDestroy");
    AUDIT("cudaMemPoolTrimTo");
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    OK("cudaMemPoolCreate", cudaMemPoolCreate(&mine, &props));
    OK("cudaDeviceSetMemPool", cudaDeviceSetMemPool(0, mine));
    OK("the current pool again", cudaDeviceGetMemPool(&current, 0));
    EXPECT("the current pool is the program's", current == mine);

    AUDIT("cudaMallocAsync");
    AUDIT("cudaMallocAsync_ptsz");
    AUDIT("cudaMallocFromPoolAsync");
    AUDIT("cudaMallocFromPoolAsync_ptsz");
    AUDIT("cudaFreeAsync");
    AUDIT("cudaFreeAsync_ptsz");
    EXPECT_CODE("into NULL", cudaMallocAsync(NULL, N, stream), cudaErrorInvalidValue);
    OK("cudaMallocAsync", cudaMallocAsync((void **)&a, N, stream));
    OK("cudaMallocFromPoolAsync", cudaMallocFromPoolAsync((void **)&b, N, pool, stream));
    OK("memset in stream order", cudaMemsetAsync(a, 0x4d, N, stream));
    OK("copy in stream order", cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    EXPECT("the pool memory holds the copy", device_bytes_are(b, N, 0x4d));
    OK("cudaFreeAsync", cudaFreeAsync(a, stream));
    OK("cudaFreeAsync_ptsz", cudaFreeAsync_ptsz(b, stream));
    EXPECT_CODE("free it again", cudaFreeAsync(a, stream), cudaErrorInvalidValue);
    OK("cudaMallocAsync_ptsz", cudaMallocAsync_ptsz((void **)&a, N, stream));
    OK("cudaMallocFromPoolAsync_ptsz", cudaMallocFromPoolAsync_ptsz((void **)&b, N, mine, stream));
    OK("cudaFree of a stream-ordered allocation", cudaFree(a));
    OK("free the other", cudaFreeAsync(b, stream));
    OK("synchronize the frees", cudaStreamSynchronize(stream));
    OK("cudaMemPoolTrimTo", cudaMemPoolTrimTo(mine, 0));
    OK("cudaMemPoolDestroy", cudaMemPoolDestroy(mine));
    OK("the current pool after the destroy", cudaDeviceGetMemPool(&current, 0));
    EXPECT("back to the default pool", current == pool);
    EXPECT_CODE("the default pool is not the program's to destroy", cudaMemPoolDestroy(pool), cudaErrorInvalidValue);

    /* Pools shared between processes through a POSIX file descriptor; here the process imports
     * its own export (driver_pool_share.c shares one between two processes). */
    int handle_types = -1;
    OK("the pool handle types", cudaDeviceGetAttribute(&handle_types, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
    EXPECT("pools are shared through POSIX descriptors", handle_types == cudaMemHandleTypePosixFileDescriptor);
    AUDIT("cudaMemPoolExportToShareableHandle");
    AUDIT("cudaMemPoolImportFromShareableHandle");
    AUDIT("cudaMemPoolExportPointer");
    AUDIT("cudaMemPoolImportPointer");
    cudaMemPool_t shared = NULL, imported = NULL, refused = NULL;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    OK("a pool to share", cudaMemPoolCreate(&shared, &props));
    OK("an allocation to share", cudaMallocFromPoolAsync((void **)&a, N, shared, stream));
    OK("its bytes", cudaMemsetAsync(a, 0x6b, N, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    int fd = -1;
    EXPECT_CODE("a fabric handle", cudaMemPoolExportToShareableHandle(&fd, shared, cudaMemHandleTypeFabric, 0), cudaErrorNotSupported);
    EXPECT_CODE("a pool made without the handle type",
                cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0), cudaErrorInvalidValue);
    EXPECT_CODE("into NULL", cudaMemPoolExportToShareableHandle(NULL, shared, cudaMemHandleTypePosixFileDescriptor, 0),
                cudaErrorInvalidValue);
    OK("cudaMemPoolExportToShareableHandle", cudaMemPoolExportToShareableHandle(&fd, shared, cudaMemHandleTypePosixFileDescriptor, 0));
    int pipe_fds[2] = {-1, -1};
    EXPECT("a pipe", pipe(pipe_fds) == 0);
    EXPECT_CODE("a descriptor that is no pool's",
                cudaMemPoolImportFromShareableHandle(&refused, (void *)(intptr_t)pipe_fds[0], cudaMemHandleTypePosixFileDescriptor, 0),
                cudaErrorInvalidValue);
    OK("cudaMemPoolImportFromShareableHandle",
       cudaMemPoolImportFromShareableHandle(&imported, (void *)(intptr_t)fd, cudaMemHandleTypePosixFileDescriptor, 0));
    EXPECT_CODE("an imported pool makes no allocations", cudaMallocFromPoolAsync((void **)&b, N, imported, stream),
                cudaErrorInvalidValue);
    struct cudaMemPoolPtrExportData data, forged;
    void *plain = NULL;
    OK("cudaMalloc memory", cudaMalloc(&plain, N));
    EXPECT_CODE("cudaMalloc memory is no pool's", cudaMemPoolExportPointer(&data, plain), cudaErrorInvalidValue);
    OK("cudaMemPoolExportPointer", cudaMemPoolExportPointer(&data, a));
    forged = data;
    forged.reserved[10] ^= 1;
    EXPECT_CODE("forged export data", cudaMemPoolImportPointer((void **)&b, imported, &forged), cudaErrorInvalidValue);
    OK("cudaMemPoolImportPointer", cudaMemPoolImportPointer((void **)&b, imported, &data));
    EXPECT("the import holds the allocation's bytes", device_bytes_are(b, N, 0x6b));
    OK("write through the import", cudaMemset(b, 0x6c, N));
    EXPECT("the allocation holds the import's writes", device_bytes_are(a, N, 0x6c));
    OK("the importer frees first", cudaFree(b));
    OK("then the exporter", cudaFreeAsync(a, stream));
    OK("synchronize the frees", cudaStreamSynchronize(stream));
    OK("destroy the imported pool", cudaMemPoolDestroy(imported));
    OK("destroy the shared pool", cudaMemPoolDestroy(shared));
    OK("free the plain memory", cudaFree(plain));
    close(fd);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    OK("destroy the pool stream", cudaStreamDestroy(stream));
}

static void modules_kernels_symbols(void) {
    void **handle, **bad;
    cudaKernel_t kernel = NULL, unknown = NULL;
    int blocks = -1;
    size_t size = 0;
    struct cudaFuncAttributes attributes;
    dim3 one = {1, 1, 1}, too_wide = {2048, 1, 1}, grid = {0, 0, 0}, block = {0, 0, 0};
    size_t shared = 99;
    cudaStream_t popped = NULL, mine = NULL;
    unsigned char bytes[16] = {0};
    void *address = NULL;
    OK("a stream for the launch audit", cudaStreamCreate(&mine));

    AUDIT("__cudaRegisterFatBinary");
    bad = __cudaRegisterFatBinary(&bad_wrapper);
    EXPECT("a wrapper that is not nvcc's is refused", bad == NULL);
    handle = __cudaRegisterFatBinary(&fake_wrapper);
    EXPECT("a fatbinary is registered", handle != NULL);
    AUDIT("__cudaInitModule");
    EXPECT("no module behind NULL", __cudaInitModule(NULL) == 0);
    EXPECT("the module is known", __cudaInitModule(handle) == 1);
    AUDIT("__cudaRegisterFunction");
    __cudaRegisterFunction(NULL, (const char *)not_a_kernel, "not_a_kernel", "not_a_kernel", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(handle, (const char *)fake_kernel, "fake_kernel", "fake_kernel", -1, NULL, NULL, NULL, NULL, NULL);
    AUDIT("__cudaRegisterVar");
    __cudaRegisterVar(NULL, unregistered_symbol, "unregistered_symbol", "unregistered_symbol", 0, 64, 0, 0);
    __cudaRegisterVar(handle, fake_symbol, "fake_symbol", "fake_symbol", 0, sizeof fake_symbol, 0, 0);
    AUDIT("__cudaRegisterFatBinaryEnd");
    __cudaRegisterFatBinaryEnd(handle);

    // A __managed__ variable: its pointer is filled when the module initializes. The emulated
    // device loads no GPU code, so the initialization fails and leaves the pointer alone.
    AUDIT("__cudaRegisterManagedVar");
    void **managed_module = __cudaRegisterFatBinary(&fake_wrapper);
    void *managed_pointer = NULL;
    __cudaRegisterManagedVar(NULL, &managed_pointer, "fake_managed", "fake_managed", 0, 4, 0, 0);
    __cudaRegisterManagedVar(managed_module, NULL, "fake_managed", "fake_managed", 0, 4, 0, 0);
    __cudaRegisterManagedVar(managed_module, &managed_pointer, "fake_managed", "fake_managed", 0, 4, 0, 0);
    EXPECT("a module with a managed variable the device cannot load does not initialize",
           __cudaInitModule(managed_module) == 0 && managed_pointer == NULL);
    EXPECT("its error is the thread's last error", cudaGetLastError() != cudaSuccess);

    AUDIT("__cudaGetKernel");
    EXPECT_CODE("the kernel of a function never registered", __cudaGetKernel(&unknown, (const void *)not_a_kernel),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("into NULL", __cudaGetKernel(NULL, (const void *)fake_kernel), cudaErrorInvalidValue);
    OK("__cudaGetKernel", __cudaGetKernel(&kernel, (const void *)fake_kernel));
    EXPECT("a kernel handle", kernel != NULL);

    AUDIT("__cudaPushCallConfiguration");
    AUDIT("__cudaPopCallConfiguration");
    EXPECT_CODE("pop with nothing pushed", __cudaPopCallConfiguration(&grid, &block, &shared, &popped),
                cudaErrorMissingConfiguration);
    dim3 pushed_grid = {3, 4, 5}, pushed_block = {32, 2, 1};
    EXPECT("push", __cudaPushCallConfiguration(pushed_grid, pushed_block, 128, mine) == 0);
    OK("pop", __cudaPopCallConfiguration(&grid, &block, &shared, &popped));
    EXPECT("the configuration pushed is the configuration popped",
           grid.x == 3 && grid.y == 4 && grid.z == 5 && block.x == 32 && block.y == 2 && block.z == 1 &&
               shared == 128 && popped == mine);

    /* The emulated device runs no GPU code: every launch that would run must say so, never
     * succeed. Invalid launches fail as CUDA says first. */
    AUDIT("__cudaLaunchKernel");
    EXPECT_CODE("an unknown kernel handle", __cudaLaunchKernel((cudaKernel_t)0x7777, one, one, NULL, 0, NULL),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("2048 threads per block", __cudaLaunchKernel(kernel, one, too_wide, NULL, 0, NULL), cudaErrorInvalidValue);
    EXPECT_CODE("an unknown stream", __cudaLaunchKernel(kernel, one, one, NULL, 0, BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("a launch the emulated device cannot run", __cudaLaunchKernel(kernel, one, one, NULL, 0, mine),
                cudaErrorNotSupported);
    AUDIT("__cudaLaunchKernel_ptsz");
    EXPECT_CODE("ptsz: an empty grid", __cudaLaunchKernel_ptsz(kernel, grid = (dim3){0, 1, 1}, one, NULL, 0, NULL),
                cudaErrorInvalidValue);
    EXPECT_CODE("ptsz: a launch the emulated device cannot run", __cudaLaunchKernel_ptsz(kernel, one, one, NULL, 0, NULL),
                cudaErrorNotSupported);
    AUDIT("cudaLaunchKernel");
    EXPECT_CODE("cudaLaunchKernel(NULL)", cudaLaunchKernel(NULL, one, one, NULL, 0, NULL), cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("cudaLaunchKernel of a function that is no kernel",
                cudaLaunchKernel((const void *)not_a_kernel, one, one, NULL, 0, NULL), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("cudaLaunchKernel the emulated device cannot run",
                cudaLaunchKernel((const void *)fake_kernel, one, one, NULL, 0, NULL), cudaErrorNotSupported);
    AUDIT("cudaLaunchKernel_ptsz");
    EXPECT_CODE("cudaLaunchKernel_ptsz(NULL)", cudaLaunchKernel_ptsz(NULL, one, one, NULL, 0, NULL), cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("cudaLaunchKernel_ptsz the emulated device cannot run",
                cudaLaunchKernel_ptsz((const void *)fake_kernel, one, one, NULL, 0, NULL), cudaErrorNotSupported);
    AUDIT("cudaLaunchKernelExC");
    AUDIT("cudaLaunchKernelExC_ptsz");
    {
        cudaLaunchAttribute attribute;
        memset(&attribute, 0, sizeof attribute);
        attribute.id = cudaLaunchAttributeCooperative;
        attribute.val.cooperative = 1;
        cudaLaunchConfig_t config;
        memset(&config, 0, sizeof config);
        config.gridDim = one;
        config.blockDim = one;
        config.attrs = &attribute;
        config.numAttrs = 1;
        EXPECT_CODE("cudaLaunchKernelExC of a function that is no kernel", cudaLaunchKernelExC(&config, (const void *)not_a_kernel, NULL),
                    cudaErrorInvalidResourceHandle);
        EXPECT_CODE("cudaLaunchKernelExC the emulated device cannot run", cudaLaunchKernelExC(&config, (const void *)fake_kernel, NULL),
                    cudaErrorNotSupported);
        EXPECT_CODE("cudaLaunchKernelExC_ptsz the emulated device cannot run",
                    cudaLaunchKernelExC_ptsz(&config, (const void *)fake_kernel, NULL), cudaErrorNotSupported);
        EXPECT_CODE("cudaLaunchKernelExC without a config", cudaLaunchKernelExC(NULL, (const void *)fake_kernel, NULL),
                    cudaErrorInvalidValue);
    }
    AUDIT("cudaLaunchCooperativeKernel");
    AUDIT("cudaLaunchCooperativeKernel_ptsz");
    EXPECT_CODE("cudaLaunchCooperativeKernel(NULL)", cudaLaunchCooperativeKernel(NULL, one, one, NULL, 0, NULL),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("a cooperative launch of a function that is no kernel",
                cudaLaunchCooperativeKernel((const void *)not_a_kernel, one, one, NULL, 0, NULL), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("a cooperative launch the emulated device cannot run",
                cudaLaunchCooperativeKernel((const void *)fake_kernel, one, one, NULL, 0, NULL), cudaErrorNotSupported);
    EXPECT_CODE("cudaLaunchCooperativeKernel_ptsz the emulated device cannot run",
                cudaLaunchCooperativeKernel_ptsz((const void *)fake_kernel, one, one, NULL, 0, NULL), cudaErrorNotSupported);

    AUDIT("cudaFuncGetAttributes");
    EXPECT_CODE("attributes of a function that is no kernel", cudaFuncGetAttributes(&attributes, (const void *)not_a_kernel),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("attributes of a kernel the emulated device cannot load",
                cudaFuncGetAttributes(&attributes, (const void *)fake_kernel), cudaErrorNotSupported);
    AUDIT("cudaFuncSetAttribute");
    EXPECT_CODE("set on a function that is no kernel",
                cudaFuncSetAttribute((const void *)not_a_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 0),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("an attribute that cannot be set", cudaFuncSetAttribute((const void *)fake_kernel, (enum cudaFuncAttribute)0, 1),
                cudaErrorInvalidValue);
    EXPECT_CODE("an attribute past the last", cudaFuncSetAttribute((const void *)fake_kernel, cudaFuncAttributeMax, 1),
                cudaErrorInvalidValue);
    EXPECT_CODE("set on a kernel the emulated device cannot load",
                cudaFuncSetAttribute((const void *)fake_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024),
                cudaErrorNotSupported);
    AUDIT("cudaFuncSetCacheConfig");
    EXPECT_CODE("a cache preference for a function that is no kernel",
                cudaFuncSetCacheConfig((const void *)not_a_kernel, cudaFuncCachePreferL1), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("a cache preference for a kernel the emulated device cannot load",
                cudaFuncSetCacheConfig((const void *)fake_kernel, cudaFuncCachePreferL1), cudaErrorNotSupported);
    AUDIT("cudaFuncGetName");
    AUDIT("cudaFuncGetParamInfo");
    {
        const char *name = NULL;
        size_t offset = 0, size = 0;
        EXPECT_CODE("the name of a function that is no kernel", cudaFuncGetName(&name, (const void *)not_a_kernel),
                    cudaErrorInvalidDeviceFunction);
        EXPECT_CODE("the name into NULL", cudaFuncGetName(NULL, (const void *)fake_kernel), cudaErrorInvalidValue);
        EXPECT_CODE("the name of a kernel the emulated device cannot load", cudaFuncGetName(&name, (const void *)fake_kernel),
                    cudaErrorNotSupported);
        EXPECT_CODE("a parameter of a function that is no kernel", cudaFuncGetParamInfo((const void *)not_a_kernel, 0, &offset, &size),
                    cudaErrorInvalidDeviceFunction);
        EXPECT_CODE("a parameter of a kernel the emulated device cannot load",
                    cudaFuncGetParamInfo((const void *)fake_kernel, 0, &offset, &size), cudaErrorNotSupported);
    }
    /* Libraries the app loads: lazily, as the driver does, so the load succeeds and the first
     * lookup is where the emulated device says it runs no GPU code. */
    AUDIT("cudaLibraryLoadData");
    AUDIT("cudaLibraryLoadFromFile");
    AUDIT("cudaLibraryUnload");
    AUDIT("cudaLibraryGetKernel");
    AUDIT("cudaLibraryGetKernelCount");
    AUDIT("cudaLibraryEnumerateKernels");
    AUDIT("cudaLibraryGetGlobal");
    AUDIT("cudaLibraryGetManaged");
    {
        static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .global .u32 g;\n.visible .entry k() { ret; }\n";
        cudaLibrary_t library = NULL;
        cudaKernel_t kernel = NULL, kernels[2];
        unsigned int count = 0;
        void *global = NULL;
        size_t bytes = 0;
        EXPECT_CODE("load into NULL", cudaLibraryLoadData(NULL, ptx, NULL, NULL, 0, NULL, NULL, 0), cudaErrorInvalidValue);
        EXPECT_CODE("load a file that is not there", cudaLibraryLoadFromFile(&library, "/nonexistent/flyt.cubin", NULL, NULL, 0, NULL, NULL, 0),
                    cudaErrorFileNotFound);
        OK("cudaLibraryLoadData", cudaLibraryLoadData(&library, ptx, NULL, NULL, 0, NULL, NULL, 0));
        EXPECT_CODE("a kernel into NULL", cudaLibraryGetKernel(NULL, library, "k"), cudaErrorInvalidValue);
        EXPECT_CODE("a kernel the emulated device cannot load", cudaLibraryGetKernel(&kernel, library, "k"), cudaErrorNotSupported);
        EXPECT_CODE("the count of kernels it cannot load", cudaLibraryGetKernelCount(&count, library), cudaErrorNotSupported);
        EXPECT_CODE("enumerate into NULL", cudaLibraryEnumerateKernels(NULL, 2, library), cudaErrorInvalidValue);
        EXPECT_CODE("enumerate kernels it cannot load", cudaLibraryEnumerateKernels(kernels, 2, library), cudaErrorNotSupported);
        EXPECT_CODE("a global it cannot load", cudaLibraryGetGlobal(&global, &bytes, library, "g"), cudaErrorNotSupported);
        EXPECT_CODE("a managed variable it cannot load", cudaLibraryGetManaged(&global, &bytes, library, "g"), cudaErrorNotSupported);
        OK("cudaLibraryUnload", cudaLibraryUnload(library));
        EXPECT_CODE("unload twice", cudaLibraryUnload(library), cudaErrorInvalidResourceHandle);
        cudaGetLastError();
    }
    AUDIT("cudaFuncSetSharedMemConfig");
    EXPECT_CODE("a bank size for a function that is no kernel",
                cudaFuncSetSharedMemConfig((const void *)not_a_kernel, cudaSharedMemBankSizeFourByte), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("a bank size for a kernel the emulated device cannot load",
                cudaFuncSetSharedMemConfig((const void *)fake_kernel, cudaSharedMemBankSizeFourByte), cudaErrorNotSupported);
    AUDIT("cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    EXPECT_CODE("occupancy into NULL", cudaOccupancyMaxActiveBlocksPerMultiprocessor(NULL, (const void *)fake_kernel, 128, 0),
                cudaErrorInvalidValue);
    EXPECT_CODE("occupancy of a function that is no kernel",
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)not_a_kernel, 128, 0),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("occupancy of a kernel the emulated device cannot load",
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)fake_kernel, 128, 0), cudaErrorNotSupported);
    AUDIT("cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
    EXPECT_CODE("unknown occupancy flag",
                cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, (const void *)fake_kernel, 128, 0, 0x2),
                cudaErrorInvalidValue);
    EXPECT_CODE("occupancy with flags of a kernel the emulated device cannot load",
                cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, (const void *)fake_kernel, 128, 0,
                                                                       cudaOccupancyDisableCachingOverride),
                cudaErrorNotSupported);
    EXPECT("no answer was written", blocks == -1);

    AUDIT("cudaOccupancyMaxActiveClusters");
    AUDIT("cudaOccupancyMaxPotentialClusterSize");
    cudaLaunchConfig_t cluster_config;
    memset(&cluster_config, 0, sizeof cluster_config);
    cluster_config.gridDim.x = 4;
    cluster_config.gridDim.y = cluster_config.gridDim.z = 1;
    cluster_config.blockDim.x = 128;
    cluster_config.blockDim.y = cluster_config.blockDim.z = 1;
    int clusters = -1;
    EXPECT_CODE("clusters into NULL", cudaOccupancyMaxActiveClusters(NULL, (const void *)fake_kernel, &cluster_config),
                cudaErrorInvalidValue);
    EXPECT_CODE("clusters without a configuration", cudaOccupancyMaxActiveClusters(&clusters, (const void *)fake_kernel, NULL),
                cudaErrorInvalidValue);
    EXPECT_CODE("clusters of a function that is no kernel",
                cudaOccupancyMaxActiveClusters(&clusters, (const void *)not_a_kernel, &cluster_config), cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("clusters of a kernel the emulated device cannot load",
                cudaOccupancyMaxActiveClusters(&clusters, (const void *)fake_kernel, &cluster_config), cudaErrorNotSupported);
    EXPECT_CODE("cluster size into NULL", cudaOccupancyMaxPotentialClusterSize(NULL, (const void *)fake_kernel, &cluster_config),
                cudaErrorInvalidValue);
    EXPECT_CODE("cluster size of a function that is no kernel",
                cudaOccupancyMaxPotentialClusterSize(&clusters, (const void *)not_a_kernel, &cluster_config),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("cluster size of a kernel the emulated device cannot load",
                cudaOccupancyMaxPotentialClusterSize(&clusters, (const void *)fake_kernel, &cluster_config), cudaErrorNotSupported);
    EXPECT("no cluster answer was written", clusters == -1);

    /* Symbols: the size is the app's own registration; the address needs the loaded module. */
    AUDIT("cudaGetSymbolSize");
    EXPECT_CODE("size of a variable never registered", cudaGetSymbolSize(&size, unregistered_symbol), cudaErrorInvalidSymbol);
    OK("cudaGetSymbolSize", cudaGetSymbolSize(&size, fake_symbol));
    EXPECT("the registered size", size == sizeof fake_symbol);
    AUDIT("cudaGetSymbolAddress");
    EXPECT_CODE("address of a variable never registered", cudaGetSymbolAddress(&address, unregistered_symbol),
                cudaErrorInvalidSymbol);
    EXPECT_CODE("address of a variable the emulated device cannot load", cudaGetSymbolAddress(&address, fake_symbol),
                cudaErrorNotSupported);
#define SYMBOL_AUDIT(name, call_unknown, call_past_end, call_bad_kind, call_ok)                                 \
    AUDIT(name);                                                                                                        \
    EXPECT_CODE(name ": a variable never registered", call_unknown, cudaErrorInvalidSymbol);                             \
    EXPECT_CODE(name ": past the variable's end", call_past_end, cudaErrorInvalidValue);                                \
    EXPECT_CODE(name ": a direction symbols do not take", call_bad_kind, cudaErrorInvalidMemcpyDirection);              \
    EXPECT_CODE(name ": a variable the emulated device cannot load", call_ok, cudaErrorNotSupported)
    SYMBOL_AUDIT("cudaMemcpyToSymbol", cudaMemcpyToSymbol(unregistered_symbol, bytes, 16, 0, cudaMemcpyHostToDevice),
                 cudaMemcpyToSymbol(fake_symbol, bytes, 16, 60, cudaMemcpyHostToDevice),
                 cudaMemcpyToSymbol(fake_symbol, bytes, 16, 0, cudaMemcpyDeviceToHost),
                 cudaMemcpyToSymbol(fake_symbol, bytes, 16, 0, cudaMemcpyHostToDevice));
    SYMBOL_AUDIT("cudaMemcpyToSymbol_ptds", cudaMemcpyToSymbol_ptds(unregistered_symbol, bytes, 16, 0, cudaMemcpyHostToDevice),
                 cudaMemcpyToSymbol_ptds(fake_symbol, bytes, 65, 0, cudaMemcpyHostToDevice),
                 cudaMemcpyToSymbol_ptds(fake_symbol, bytes, 16, 0, cudaMemcpyHostToHost),
                 cudaMemcpyToSymbol_ptds(fake_symbol, bytes, 16, 0, cudaMemcpyDefault));
    SYMBOL_AUDIT("cudaMemcpyToSymbolAsync",
                 cudaMemcpyToSymbolAsync(unregistered_symbol, bytes, 16, 0, cudaMemcpyHostToDevice, mine),
                 cudaMemcpyToSymbolAsync(fake_symbol, bytes, 16, 49, cudaMemcpyHostToDevice, mine),
                 cudaMemcpyToSymbolAsync(fake_symbol, bytes, 16, 0, cudaMemcpyDeviceToHost, mine),
                 cudaMemcpyToSymbolAsync(fake_symbol, bytes, 16, 0, cudaMemcpyHostToDevice, mine));
    SYMBOL_AUDIT("cudaMemcpyToSymbolAsync_ptsz",
                 cudaMemcpyToSymbolAsync_ptsz(unregistered_symbol, bytes, 16, 0, cudaMemcpyHostToDevice, NULL),
                 cudaMemcpyToSymbolAsync_ptsz(fake_symbol, bytes, 16, 64, cudaMemcpyHostToDevice, NULL),
                 cudaMemcpyToSymbolAsync_ptsz(fake_symbol, bytes, 16, 0, cudaMemcpyDeviceToHost, NULL),
                 cudaMemcpyToSymbolAsync_ptsz(fake_symbol, bytes, 16, 0, cudaMemcpyHostToDevice, NULL));
    SYMBOL_AUDIT("cudaMemcpyFromSymbol", cudaMemcpyFromSymbol(bytes, unregistered_symbol, 16, 0, cudaMemcpyDeviceToHost),
                 cudaMemcpyFromSymbol(bytes, fake_symbol, 16, 60, cudaMemcpyDeviceToHost),
                 cudaMemcpyFromSymbol(bytes, fake_symbol, 16, 0, cudaMemcpyHostToDevice),
                 cudaMemcpyFromSymbol(bytes, fake_symbol, 16, 0, cudaMemcpyDeviceToHost));
    SYMBOL_AUDIT("cudaMemcpyFromSymbol_ptds",
                 cudaMemcpyFromSymbol_ptds(bytes, unregistered_symbol, 16, 0, cudaMemcpyDeviceToHost),
                 cudaMemcpyFromSymbol_ptds(bytes, fake_symbol, 65, 0, cudaMemcpyDeviceToHost),
                 cudaMemcpyFromSymbol_ptds(bytes, fake_symbol, 16, 0, cudaMemcpyHostToHost),
                 cudaMemcpyFromSymbol_ptds(bytes, fake_symbol, 16, 0, cudaMemcpyDefault));
    SYMBOL_AUDIT("cudaMemcpyFromSymbolAsync",
                 cudaMemcpyFromSymbolAsync(bytes, unregistered_symbol, 16, 0, cudaMemcpyDeviceToHost, mine),
                 cudaMemcpyFromSymbolAsync(bytes, fake_symbol, 16, 49, cudaMemcpyDeviceToHost, mine),
                 cudaMemcpyFromSymbolAsync(bytes, fake_symbol, 16, 0, cudaMemcpyHostToDevice, mine),
                 cudaMemcpyFromSymbolAsync(bytes, fake_symbol, 16, 0, cudaMemcpyDeviceToHost, mine));
    SYMBOL_AUDIT("cudaMemcpyFromSymbolAsync_ptsz",
                 cudaMemcpyFromSymbolAsync_ptsz(bytes, unregistered_symbol, 16, 0, cudaMemcpyDeviceToHost, NULL),
                 cudaMemcpyFromSymbolAsync_ptsz(bytes, fake_symbol, 16, 64, cudaMemcpyDeviceToHost, NULL),
                 cudaMemcpyFromSymbolAsync_ptsz(bytes, fake_symbol, 16, 0, cudaMemcpyHostToDevice, NULL),
                 cudaMemcpyFromSymbolAsync_ptsz(bytes, fake_symbol, 16, 0, cudaMemcpyDeviceToHost, NULL));

    /* Unregistering a module the server never loaded must not come back as an error later. */
    AUDIT("__cudaUnregisterFatBinary");
    __cudaUnregisterFatBinary(handle);
    OK("no error from the unregistration at the next synchronization", cudaDeviceSynchronize());
    OK("cudaStreamDestroy", cudaStreamDestroy(mine));
    EXPECT("the stubs never ran", stub_calls == 0);
}

/* Pitched and 3D memory, arrays, texture and surface objects. What a call wrote is read back
 * and compared with a host model of the memory (`model`, `model2`). */
#define BOGUS_ARRAY ((cudaArray_t)0x888888)
static unsigned char model[1 << 16], model2[1 << 16], back[1 << 16];

/* Whether `bytes` of device memory read back are the model's. */
static int device_matches(const void *dev, const unsigned char *expected, size_t bytes) {
    memset(back, 0xee, bytes);
    if (cudaMemcpy(back, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
    return memcmp(back, expected, bytes) == 0;
}

/* The model of a 2D memset. */
static void set_rows(unsigned char *at, size_t pitch, int value, size_t width, size_t height) {
    for (size_t y = 0; y < height; y++) memset(at + y * pitch, value, width);
}

/* The model of a pitched copy. */
static void copy_rows(unsigned char *dst, size_t dpitch, const unsigned char *src, size_t spitch, size_t width, size_t height) {
    for (size_t y = 0; y < height; y++) memcpy(dst + y * dpitch, src + y * spitch, width);
}

static struct cudaExtent extent_of(size_t width, size_t height, size_t depth) {
    struct cudaExtent e = {width, height, depth};
    return e;
}

static struct cudaPitchedPtr pitched_at(void *ptr, size_t pitch, size_t xsize, size_t ysize) {
    struct cudaPitchedPtr p = {ptr, pitch, xsize, ysize};
    return p;
}

static void pitched_memory(void) {
    void *pitched = NULL, *empty = (void *)1;
    size_t pitch = 0, empty_pitch = 1;
    cudaStream_t stream;
    OK("a stream for the pitched audit", cudaStreamCreate(&stream));

    AUDIT("cudaMallocPitch");
    EXPECT_CODE("cudaMallocPitch(NULL)", cudaMallocPitch(NULL, &pitch, 100, 16), cudaErrorInvalidValue);
    EXPECT_CODE("the pitch into NULL", cudaMallocPitch(&pitched, NULL, 100, 16), cudaErrorInvalidValue);
    OK("an empty pitched allocation", cudaMallocPitch(&empty, &empty_pitch, 0, 16));
    EXPECT("an empty allocation is NULL", empty == NULL && empty_pitch == 0);
    OK("cudaMallocPitch", cudaMallocPitch(&pitched, &pitch, 100, 16));
    EXPECT("the pitch holds a row", pitched != NULL && pitch >= 100 && pitch * 16 <= sizeof model);
    memset(model, 0, pitch * 16);
    OK("zero it", cudaMemset(pitched, 0, pitch * 16));
    EXPECT("all rows are device memory", device_matches(pitched, model, pitch * 16));

    AUDIT("cudaMemset2D");
    EXPECT_CODE("2D memset with a pitch below the width", cudaMemset2D(pitched, 50, 0, 60, 2), cudaErrorInvalidValue);
    EXPECT_CODE("2D memset past the allocation", cudaMemset2D(pitched, pitch, 0, 60, 17), cudaErrorInvalidValue);
    EXPECT_CODE("2D memset of host memory", cudaMemset2D(host_a, 128, 0, 60, 2), cudaErrorInvalidValue);
    OK("an empty 2D memset", cudaMemset2D(NULL, 0, 0, 0, 0));
    OK("cudaMemset2D", cudaMemset2D(pitched, pitch, 0x7a, 60, 10));
    set_rows(model, pitch, 0x7a, 60, 10);
    EXPECT("2D memset rows read back", device_matches(pitched, model, pitch * 16));
    AUDIT("cudaMemset2D_ptds");
    OK("cudaMemset2D_ptds", cudaMemset2D_ptds((char *)pitched + 3 * pitch + 20, pitch, 0x7b, 80, 5));
    set_rows(model + 3 * pitch + 20, pitch, 0x7b, 80, 5);
    EXPECT("2D memset_ptds rows read back", device_matches(pitched, model, pitch * 16));
    AUDIT("cudaMemset2DAsync");
    EXPECT_CODE("2D memset on an unknown stream", cudaMemset2DAsync(pitched, pitch, 0, 10, 10, BOGUS_STREAM),
                cudaErrorInvalidResourceHandle);
    OK("cudaMemset2DAsync", cudaMemset2DAsync((char *)pitched + 10 * pitch, pitch, 0x7c, 100, 5, stream));
    OK("sync", cudaStreamSynchronize(stream));
    set_rows(model + 10 * pitch, pitch, 0x7c, 100, 5);
    EXPECT("2D memsetAsync rows read back by the sync", device_matches(pitched, model, pitch * 16));
    AUDIT("cudaMemset2DAsync_ptsz");
    OK("cudaMemset2DAsync_ptsz: one row, whose pitch is unused",
       cudaMemset2DAsync_ptsz((char *)pitched + 15 * pitch, 0, 0x7d, 100, 1, NULL));
    OK("sync the per-thread stream", cudaStreamSynchronize_ptsz(NULL));
    set_rows(model + 15 * pitch, pitch, 0x7d, 100, 1);
    EXPECT("2D memsetAsync_ptsz row read back", device_matches(pitched, model, pitch * 16));
    OK("cudaFree of pitched memory", cudaFree(pitched));

    /* A volume of 4 slices of 8 rows of 100 bytes, and a second one. */
    struct cudaPitchedPtr volume, other, none;
    struct cudaExtent box = extent_of(100, 8, 4);
    AUDIT("cudaMalloc3D");
    EXPECT_CODE("cudaMalloc3D(NULL)", cudaMalloc3D(NULL, box), cudaErrorInvalidValue);
    OK("an empty 3D allocation", cudaMalloc3D(&none, extent_of(100, 8, 0)));
    EXPECT("an empty 3D allocation is NULL", none.ptr == NULL);
    OK("cudaMalloc3D", cudaMalloc3D(&volume, box));
    EXPECT("a pitched pointer of the logical size",
           volume.ptr != NULL && volume.pitch >= 100 && volume.xsize == 100 && volume.ysize == 8 && volume.pitch * 32 <= sizeof model);
    OK("a second volume", cudaMalloc3D(&other, box));
    size_t vp = volume.pitch, bytes = vp * 32;
    memset(model, 0, bytes);
    memset(model2, 0, bytes);
    OK("zero it", cudaMemset(volume.ptr, 0, bytes));
    OK("zero the second", cudaMemset(other.ptr, 0, bytes));
    EXPECT("a volume is height * depth rows of device memory", device_matches(volume.ptr, model, bytes));

    AUDIT("cudaMemset3D");
    EXPECT_CODE("3D memset of more rows than a slice", cudaMemset3D(volume, 0, extent_of(100, 9, 2)), cudaErrorInvalidValue);
    OK("an empty 3D memset", cudaMemset3D(volume, 0, extent_of(100, 8, 0)));
    OK("cudaMemset3D (whole slices)", cudaMemset3D(volume, 0x11, box));
    set_rows(model, vp, 0x11, 100, 32);
    EXPECT("3D memset read back", device_matches(volume.ptr, model, bytes));
    AUDIT("cudaMemset3D_ptds");
    OK("cudaMemset3D_ptds (3 rows of each slice)",
       cudaMemset3D_ptds(pitched_at((char *)volume.ptr + vp + 10, vp, 100, 8), 0x22, extent_of(50, 3, 4)));
    for (int z = 0; z < 4; z++) set_rows(model + (z * 8 + 1) * vp + 10, vp, 0x22, 50, 3);
    EXPECT("3D memset_ptds of part of each slice read back", device_matches(volume.ptr, model, bytes));
    AUDIT("cudaMemset3DAsync");
    EXPECT_CODE("3D memset on an unknown stream", cudaMemset3DAsync(volume, 0, box, BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    OK("cudaMemset3DAsync (the last two slices)",
       cudaMemset3DAsync(pitched_at((char *)volume.ptr + 16 * vp, vp, 100, 8), 0x33, extent_of(100, 8, 2), stream));
    OK("sync", cudaStreamSynchronize(stream));
    set_rows(model + 16 * vp, vp, 0x33, 100, 16);
    EXPECT("3D memsetAsync read back by the sync", device_matches(volume.ptr, model, bytes));
    AUDIT("cudaMemset3DAsync_ptsz");
    OK("cudaMemset3DAsync_ptsz (a corner of three slices)", cudaMemset3DAsync_ptsz(volume, 0x44, extent_of(4, 2, 3), NULL));
    OK("sync the per-thread stream", cudaStreamSynchronize_ptsz(NULL));
    for (int z = 0; z < 3; z++) set_rows(model + z * 8 * vp, vp, 0x44, 4, 2);
    EXPECT("3D memsetAsync_ptsz read back", device_matches(volume.ptr, model, bytes));

    /* 3D copies between packed host rows (pitch 100), the volume and the second volume. */
    struct cudaMemcpy3DParms p, bad;
    AUDIT("cudaMemcpy3D");
    fill(host_a, N, 11);
    memset(&p, 0, sizeof p);
    p.srcPtr = pitched_at(host_a, 100, 100, 8);
    p.dstPtr = volume;
    p.extent = box;
    p.kind = cudaMemcpyHostToDevice;
    EXPECT_CODE("cudaMemcpy3D(NULL)", cudaMemcpy3D(NULL), cudaErrorInvalidValue);
    bad = p;
    bad.kind = (enum cudaMemcpyKind)9;
    EXPECT_CODE("3D copy of an invalid kind", cudaMemcpy3D(&bad), cudaErrorInvalidMemcpyDirection);
    bad = p;
    bad.dstArray = BOGUS_ARRAY;
    EXPECT_CODE("a destination both array and memory", cudaMemcpy3D(&bad), cudaErrorInvalidValue);
    bad = p;
    bad.srcPtr.ptr = NULL;
    EXPECT_CODE("no source", cudaMemcpy3D(&bad), cudaErrorInvalidValue);
    bad = p;
    bad.srcPtr.pitch = 50;
    EXPECT_CODE("3D copy with a pitch below the width", cudaMemcpy3D(&bad), cudaErrorInvalidPitchValue);
    bad = p;
    bad.srcPtr.ysize = 4;
    EXPECT_CODE("3D copy of more rows than a slice", cudaMemcpy3D(&bad), cudaErrorInvalidValue);
    bad = p;
    bad.kind = cudaMemcpyDeviceToDevice;
    EXPECT_CODE("3D copy with host memory as the device side", cudaMemcpy3D(&bad), cudaErrorInvalidValue);
    bad = p;
    bad.extent.depth = 5;
    EXPECT_CODE("3D copy past the volume", cudaMemcpy3D(&bad), cudaErrorInvalidValue);
    OK("cudaMemcpy3D H2D", cudaMemcpy3D(&p));
    copy_rows(model, vp, host_a, 100, 100, 32);
    EXPECT("3D copy H2D read back", device_matches(volume.ptr, model, bytes));
    AUDIT("cudaMemcpy3D_ptds");
    memset(&p, 0, sizeof p);
    p.srcPtr = volume;
    p.srcPos.x = 10, p.srcPos.y = 2, p.srcPos.z = 1;
    p.dstPtr = other;
    p.dstPos.y = 1;
    p.extent = extent_of(40, 5, 3);
    p.kind = cudaMemcpyDeviceToDevice;
    OK("cudaMemcpy3D_ptds D2D at offsets", cudaMemcpy3D_ptds(&p));
    for (int z = 0; z < 3; z++) copy_rows(model2 + (z * 8 + 1) * vp, vp, model + ((1 + z) * 8 + 2) * vp + 10, vp, 40, 5);
    EXPECT("3D copy D2D at offsets read back", device_matches(other.ptr, model2, bytes));
    AUDIT("cudaMemcpy3DAsync");
    memset(&p, 0, sizeof p);
    p.srcPtr = volume;
    p.dstPtr = pitched_at(host_b, 100, 100, 8);
    p.extent = box;
    p.kind = cudaMemcpyDeviceToHost;
    EXPECT_CODE("3D copy on an unknown stream", cudaMemcpy3DAsync(&p, BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    memset(host_b, 0, N);
    OK("cudaMemcpy3DAsync D2H", cudaMemcpy3DAsync(&p, stream));
    OK("sync", cudaStreamSynchronize(stream));
    int rows_ok = 1;
    for (int r = 0; r < 32; r++) rows_ok &= memcmp(host_b + r * 100, model + r * vp, 100) == 0;
    EXPECT("3D copyAsync D2H by the sync", rows_ok);
    AUDIT("cudaMemcpy3DAsync_ptsz");
    fill(host_a, N, 12);
    memset(&p, 0, sizeof p);
    p.srcPtr = pitched_at(host_a, 100, 100, 8);
    p.dstPtr = other;
    p.dstPos.z = 3;
    p.extent = extent_of(100, 8, 1);
    p.kind = cudaMemcpyDefault;
    OK("cudaMemcpy3DAsync_ptsz into the last slice", cudaMemcpy3DAsync_ptsz(&p, NULL));
    OK("sync the per-thread stream", cudaStreamSynchronize_ptsz(NULL));
    copy_rows(model2 + 24 * vp, vp, host_a, 100, 100, 8);
    EXPECT("3D copyAsync_ptsz read back", device_matches(other.ptr, model2, bytes));

    /* Peer copies: the one device is both sides' device. */
    struct cudaMemcpy3DPeerParms peer, bad_peer;
    memset(&peer, 0, sizeof peer);
    peer.srcPtr = other;
    peer.dstPtr = volume;
    peer.extent = box;
    AUDIT("cudaMemcpy3DPeer");
    EXPECT_CODE("cudaMemcpy3DPeer(NULL)", cudaMemcpy3DPeer(NULL), cudaErrorInvalidValue);
    bad_peer = peer;
    bad_peer.srcDevice = 1;
    EXPECT_CODE("a source device that does not exist", cudaMemcpy3DPeer(&bad_peer), cudaErrorInvalidDevice);
    bad_peer = peer;
    bad_peer.dstDevice = -1;
    EXPECT_CODE("a destination device that does not exist", cudaMemcpy3DPeer(&bad_peer), cudaErrorInvalidDevice);
    OK("cudaMemcpy3DPeer", cudaMemcpy3DPeer(&peer));
    copy_rows(model, vp, model2, vp, 100, 32);
    EXPECT("peer copy read back", device_matches(volume.ptr, model, bytes));
    AUDIT("cudaMemcpy3DPeer_ptds");
    fill(host_a, N, 13);
    OK("new bytes in the volume", cudaMemcpy(volume.ptr, host_a, N, cudaMemcpyHostToDevice));
    memcpy(model, host_a, N);
    peer.srcPtr = volume;
    peer.dstPtr = other;
    peer.dstPos.x = 50;
    peer.extent = extent_of(50, 8, 4);
    OK("cudaMemcpy3DPeer_ptds at an offset", cudaMemcpy3DPeer_ptds(&peer));
    copy_rows(model2 + 50, vp, model, vp, 50, 32);
    EXPECT("peer copy_ptds read back", device_matches(other.ptr, model2, bytes));
    AUDIT("cudaMemcpy3DPeerAsync");
    memset(&peer.dstPos, 0, sizeof peer.dstPos);
    peer.extent = box;
    EXPECT_CODE("peer copy on an unknown stream", cudaMemcpy3DPeerAsync(&peer, BOGUS_STREAM), cudaErrorInvalidResourceHandle);
    OK("cudaMemcpy3DPeerAsync", cudaMemcpy3DPeerAsync(&peer, stream));
    OK("sync", cudaStreamSynchronize(stream));
    copy_rows(model2, vp, model, vp, 100, 32);
    EXPECT("peer copyAsync read back by the sync", device_matches(other.ptr, model2, bytes));
    AUDIT("cudaMemcpy3DPeerAsync_ptsz");
    peer.srcPtr = pitched_at(host_b, 100, 100, 8);
    peer.dstPtr = volume;
    peer.extent = extent_of(100, 8, 1);
    fill(host_b, N, 14);
    OK("cudaMemcpy3DPeerAsync_ptsz from host memory", cudaMemcpy3DPeerAsync_ptsz(&peer, NULL));
    OK("sync the per-thread stream", cudaStreamSynchronize_ptsz(NULL));
    copy_rows(model, vp, host_b, 100, 100, 8);
    EXPECT("peer copyAsync_ptsz read back", device_matches(volume.ptr, model, bytes));

    OK("cudaFree of a volume", cudaFree(volume.ptr));
    OK("cudaFree of a volume", cudaFree(other.ptr));
    OK("cudaStreamDestroy", cudaStreamDestroy(stream));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* cudaMemcpy{To,From}Array and cudaMemcpyArrayToArray */
static void arrays(void) {
    /* 16 rows of 64 floats: 256 bytes a row, N bytes in all. */
    const size_t W = 64, H = 16, ROW = W * sizeof(float);
    struct cudaChannelFormatDesc f32 = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
    struct cudaChannelFormatDesc u8 = cudaCreateChannelDesc(8, 0, 0, 0, cudaChannelFormatKindUnsigned);
    struct cudaChannelFormatDesc u8x4 = cudaCreateChannelDesc(8, 8, 8, 8, cudaChannelFormatKindUnsigned);
    struct cudaChannelFormatDesc got;
    struct cudaExtent extent;
    unsigned flags = 99;
    cudaArray_t array = NULL, other = NULL, line = NULL, bytes8 = NULL, volume = NULL, layered = NULL, level = NULL;
    cudaMipmappedArray_t mipmap = NULL;
    cudaStream_t stream;
    void *dev = NULL;
    int rows_ok;
    OK("a stream for the array audit", cudaStreamCreate(&stream));
    OK("cudaMalloc for the array audit", cudaMalloc(&dev, N));

    AUDIT("cudaMallocArray");
    EXPECT_CODE("cudaMallocArray(NULL)", cudaMallocArray(NULL, &f32, W, H, 0), cudaErrorInvalidValue);
    EXPECT_CODE("an array without a channel description", cudaMallocArray(&array, NULL, W, H, 0), cudaErrorInvalidValue);
    struct cudaChannelFormatDesc invalid[] = {
        cudaCreateChannelDesc(8, 16, 0, 0, cudaChannelFormatKindUnsigned),               /* two sizes */
        cudaCreateChannelDesc(8, 8, 8, 0, cudaChannelFormatKindSigned),                  /* three channels */
        cudaCreateChannelDesc(8, 0, 8, 0, cudaChannelFormatKindUnsigned),                /* a gap */
        cudaCreateChannelDesc(8, 0, 0, 0, cudaChannelFormatKindFloat),                   /* an 8-bit float */
        cudaCreateChannelDesc(24, 0, 0, 0, cudaChannelFormatKindSigned),                 /* a 24-bit integer */
        cudaCreateChannelDesc(0, 0, 0, 0, cudaChannelFormatKindNone),                    /* no channels */
        cudaCreateChannelDesc(32, 0, 0, 0, (enum cudaChannelFormatKind)99),              /* no kind */
        cudaCreateChannelDesc(8, 8, 0, 0, cudaChannelFormatKindUnsignedNormalized8X1),   /* not its kind's sizes */
    };
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++)
        EXPECT_CODE("an invalid channel description", cudaMallocArray(&array, &invalid[i], W, H, 0),
                    cudaErrorInvalidChannelDescriptor);
    EXPECT("no array handed out", array == NULL);
    OK("cudaMallocArray (2D, for surfaces)", cudaMallocArray(&array, &f32, W, H, cudaArraySurfaceLoadStore));
    OK("a second 2D array", cudaMallocArray(&other, &f32, W, H, 0));
    OK("a 1D array (height 0)", cudaMallocArray(&line, &u8x4, 256, 0, 0));
    OK("an array of bytes", cudaMallocArray(&bytes8, &u8, 64, 16, 0));

    AUDIT("cudaArrayGetInfo");
    memset(&got, 0, sizeof got);
    OK("cudaArrayGetInfo", cudaArrayGetInfo(&got, &extent, &flags, array));
    EXPECT("the channels, extent and flags the array was made with",
           got.x == 32 && got.y == 0 && got.z == 0 && got.w == 0 && got.f == cudaChannelFormatKindFloat && extent.width == W &&
               extent.height == H && extent.depth == 0 && flags == cudaArraySurfaceLoadStore);
    OK("any out-pointer may be NULL", cudaArrayGetInfo(NULL, &extent, NULL, line));
    EXPECT("a 1D array has height 0", extent.width == 256 && extent.height == 0 && extent.depth == 0);
    EXPECT_CODE("info of an unknown array", cudaArrayGetInfo(&got, &extent, &flags, BOGUS_ARRAY), cudaErrorInvalidValue);
    AUDIT("cudaGetChannelDesc");
    EXPECT_CODE("a channel description into NULL", cudaGetChannelDesc(NULL, line), cudaErrorInvalidValue);
    EXPECT_CODE("the channel description of an unknown array", cudaGetChannelDesc(&got, BOGUS_ARRAY), cudaErrorInvalidValue);
    OK("cudaGetChannelDesc", cudaGetChannelDesc(&got, line));
    EXPECT("four unsigned 8-bit channels", got.x == 8 && got.y == 8 && got.z == 8 && got.w == 8 && got.f == cudaChannelFormatKindUnsigned);

    /* 2D copies (offsets and widths in bytes). */
    AUDIT("cudaMemcpy2DToArray");
    fill(host_a, N, 31);
    EXPECT_CODE("to an array with a pitch below the width", cudaMemcpy2DToArray(array, 0, 0, host_a, 100, ROW, H, cudaMemcpyHostToDevice),
                cudaErrorInvalidPitchValue);
    EXPECT_CODE("past the end of the rows", cudaMemcpy2DToArray(array, 4, 0, host_a, ROW, ROW, H, cudaMemcpyHostToDevice),
                cudaErrorInvalidValue);
    EXPECT_CODE("past the last row", cudaMemcpy2DToArray(array, 0, 1, host_a, ROW, ROW, H, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_CODE("to an array, an invalid kind", cudaMemcpy2DToArray(array, 0, 0, host_a, ROW, ROW, H, (enum cudaMemcpyKind)7),
                cudaErrorInvalidMemcpyDirection);
    EXPECT_CODE("host memory as the device side", cudaMemcpy2DToArray(array, 0, 0, host_a, ROW, ROW, H, cudaMemcpyDeviceToDevice),
                cudaErrorInvalidValue);
    EXPECT_CODE("to an unknown array", cudaMemcpy2DToArray(BOGUS_ARRAY, 0, 0, host_a, ROW, ROW, H, cudaMemcpyHostToDevice),
                cudaErrorInvalidValue);
    OK("cudaMemcpy2DToArray", cudaMemcpy2DToArray(array, 0, 0, host_a, ROW, ROW, H, cudaMemcpyHostToDevice));
    AUDIT("cudaMemcpy2DFromArray");
    EXPECT_CODE("from an unknown array", cudaMemcpy2DFromArray(host_b, ROW, BOGUS_ARRAY, 0, 0, ROW, H, cudaMemcpyDeviceToHost),
                cudaErrorInvalidValue);
    memset(host_b, 0, N);
    OK("cudaMemcpy2DFromArray", cudaMemcpy2DFromArray(host_b, ROW, array, 0, 0, ROW, H, cudaMemcpyDeviceToHost));
    EXPECT("the array round trip", memcmp(host_a, host_b, N) == 0);
    memset(host_b, 0, N);
    OK("a window of the array", cudaMemcpy2DFromArray(host_b, 40, array, 16, 2, 32, 5, cudaMemcpyDefault));
    rows_ok = 1;
    for (int r = 0; r < 5; r++) rows_ok &= memcmp(host_b + r * 40, host_a + (2 + r) * ROW + 16, 32) == 0;
    EXPECT("the window's rows", rows_ok);
    AUDIT("cudaMemcpy2DToArray_ptds");
    fill(host_a, N, 32);
    OK("bytes for the device", cudaMemcpy(dev, host_a, N, cudaMemcpyHostToDevice));
    OK("cudaMemcpy2DToArray_ptds from device memory", cudaMemcpy2DToArray_ptds(other, 0, 0, dev, ROW, ROW, H, cudaMemcpyDeviceToDevice));
    AUDIT("cudaMemcpy2DFromArray_ptds");
    OK("clear the device memory", cudaMemset(dev, 0, N));
    OK("cudaMemcpy2DFromArray_ptds to device memory", cudaMemcpy2DFromArray_ptds(dev, ROW, other, 0, 0, ROW, H, cudaMemcpyDeviceToDevice));
    EXPECT("device memory through an array", device_matches(dev, host_a, N));
    AUDIT("cudaMemcpy2DToArrayAsync");
    fill(host_a, N, 33);
    EXPECT_CODE("to an array on an unknown stream",
                cudaMemcpy2DToArrayAsync(array, 0, 0, host_a, ROW, ROW, H, cudaMemcpyHostToDevice, BOGUS_STREAM),
                cudaErrorInvalidResourceHandle);
    OK("cudaMemcpy2DToArrayAsync", cudaMemcpy2DToArrayAsync(array, 0, 0, host_a, ROW, ROW, H, cudaMemcpyHostToDevice, stream));
    AUDIT("cudaMemcpy2DFromArrayAsync");
    memset(host_b, 0, N);
    OK("cudaMemcpy2DFromArrayAsync", cudaMemcpy2DFromArrayAsync(host_b, ROW, array, 0, 0, ROW, H, cudaMemcpyDeviceToHost, stream));
    OK("sync", cudaStreamSynchronize(stream));
    EXPECT("the asynchronous array round trip by the sync", memcmp(host_a, host_b, N) == 0);
    AUDIT("cudaMemcpy2DToArrayAsync_ptsz");
    fill(host_a, N, 34);
    OK("cudaMemcpy2DToArrayAsync_ptsz", cudaMemcpy2DToArrayAsync_ptsz(other, 0, 0, host_a, ROW, ROW, H, cudaMemcpyHostToDevice, NULL));
    AUDIT("cudaMemcpy2DFromArrayAsync_ptsz");
    memset(host_b, 0, N);
    OK("cudaMemcpy2DFromArrayAsync_ptsz", cudaMemcpy2DFromArrayAsync_ptsz(host_b, ROW, other, 0, 0, ROW, H, cudaMemcpyDeviceToHost, NULL));
    OK("sync the per-thread stream", cudaStreamSynchronize_ptsz(NULL));
    EXPECT("the per-thread array round trip", memcmp(host_a, host_b, N) == 0);
    AUDIT("cudaMemcpy2DArrayToArray");
    EXPECT_CODE("between arrays, an invalid kind", cudaMemcpy2DArrayToArray(other, 0, 0, array, 0, 0, ROW, H, (enum cudaMemcpyKind)-1),
                cudaErrorInvalidMemcpyDirection);
    OK("cudaMemcpy2DArrayToArray", cudaMemcpy2DArrayToArray(other, 0, 0, array, 0, 0, ROW, H, cudaMemcpyDeviceToDevice));
    fill(model, N, 33);
    OK("read it back", cudaMemcpy2DFromArray(host_b, ROW, other, 0, 0, ROW, H, cudaMemcpyDeviceToHost));
    EXPECT("one array into the other", memcmp(model, host_b, N) == 0);
    AUDIT("cudaMemcpy2DArrayToArray_ptds");
    fill(host_a, N, 35);
    OK("new bytes in the second array", cudaMemcpy2DToArray(other, 0, 0, host_a, ROW, ROW, H, cudaMemcpyHostToDevice));
    OK("cudaMemcpy2DArrayToArray_ptds (a window)", cudaMemcpy2DArrayToArray_ptds(other, 128, 8, array, 8, 1, 64, 4, cudaMemcpyDefault));
    memcpy(model2, host_a, N);
    copy_rows(model2 + 8 * ROW + 128, ROW, model + ROW + 8, ROW, 64, 4);
    OK("read it back", cudaMemcpy2DFromArray(host_b, ROW, other, 0, 0, ROW, H, cudaMemcpyDeviceToHost));
    EXPECT("the window between arrays", memcmp(model2, host_b, N) == 0);

    /* The deprecated 1D copies run on along the array's rows. */
    AUDIT("cudaMemcpyToArray");
    fill(host_a, N, 36);
    EXPECT_CODE("1D copy past the end of the array", cudaMemcpyToArray(array, 4, 0, host_a, N, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_CODE("1D copy from past the row", cudaMemcpyToArray(array, ROW, 0, host_a, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_CODE("1D copy of an invalid kind", cudaMemcpyToArray(array, 0, 0, host_a, N, (enum cudaMemcpyKind)5),
                cudaErrorInvalidMemcpyDirection);
    EXPECT_CODE("1D copy to an unknown array", cudaMemcpyToArray(BOGUS_ARRAY, 0, 0, host_a, N, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    OK("cudaMemcpyToArray (the whole array from packed rows)", cudaMemcpyToArray(array, 0, 0, host_a, N, cudaMemcpyHostToDevice));
    memcpy(model, host_a, N);
    OK("read it back", cudaMemcpy2DFromArray(back, ROW, array, 0, 0, ROW, H, cudaMemcpyDeviceToHost));
    EXPECT("the whole array", memcmp(model, back, N) == 0);
    fill(host_b, 600, 37);
    OK("from the middle of a row over three rows", cudaMemcpyToArray(array, 8, 2, host_b, 600, cudaMemcpyHostToDevice));
    memcpy(model + 2 * ROW + 8, host_b, 600);
    OK("read it back", cudaMemcpy2DFromArray(back, ROW, array, 0, 0, ROW, H, cudaMemcpyDeviceToHost));
    EXPECT("the bytes ran on along the rows", memcmp(model, back, N) == 0);
    AUDIT("cudaMemcpyFromArray");
    EXPECT_CODE("1D copy from past the end", cudaMemcpyFromArray(host_b, array, 0, 1, N, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    memset(host_b, 0, N);
    OK("cudaMemcpyFromArray (the whole array)", cudaMemcpyFromArray(host_b, array, 0, 0, N, cudaMemcpyDeviceToHost));
    EXPECT("the whole array out", memcmp(model, host_b, N) == 0);
    memset(host_b, 0, N);
    OK("from the middle of a row", cudaMemcpyFromArray(host_b, array, 100, 5, 1000, cudaMemcpyDefault));
    EXPECT("the bytes ran on along the rows", memcmp(model + 5 * ROW + 100, host_b, 1000) == 0);
    AUDIT("cudaMemcpyToArray_ptds");
    fill(host_a, N, 38);
    OK("bytes for the device", cudaMemcpy(dev, host_a, N, cudaMemcpyHostToDevice));
    OK("cudaMemcpyToArray_ptds from device memory", cudaMemcpyToArray_ptds(other, 0, 0, dev, N, cudaMemcpyDeviceToDevice));
    memcpy(model2, host_a, N);
    AUDIT("cudaMemcpyFromArray_ptds");
    OK("clear the device memory", cudaMemset(dev, 0, N));
    OK("cudaMemcpyFromArray_ptds to device memory", cudaMemcpyFromArray_ptds(dev, other, 0, 0, N, cudaMemcpyDeviceToDevice));
    EXPECT("device memory through an array, 1D", device_matches(dev, model2, N));
    AUDIT("cudaMemcpyToArrayAsync");
    fill(host_b, 700, 39);
    EXPECT_CODE("1D copy on an unknown stream", cudaMemcpyToArrayAsync(other, 20, 3, host_b, 700, cudaMemcpyHostToDevice, BOGUS_STREAM),
                cudaErrorInvalidResourceHandle);
    OK("cudaMemcpyToArrayAsync", cudaMemcpyToArrayAsync(other, 20, 3, host_b, 700, cudaMemcpyHostToDevice, stream));
    memcpy(model2 + 3 * ROW + 20, host_b, 700);
    AUDIT("cudaMemcpyFromArrayAsync");
    memset(back, 0, N);
    OK("cudaMemcpyFromArrayAsync", cudaMemcpyFromArrayAsync(back, other, 0, 0, N, cudaMemcpyDeviceToHost, stream));
    OK("sync", cudaStreamSynchronize(stream));
    EXPECT("1D asynchronous copies by the sync", memcmp(model2, back, N) == 0);
    AUDIT("cudaMemcpyToArrayAsync_ptsz");
    fill(host_b, ROW, 40);
    OK("cudaMemcpyToArrayAsync_ptsz (the last row)", cudaMemcpyToArrayAsync_ptsz(other, 0, H - 1, host_b, ROW, cudaMemcpyHostToDevice, NULL));
    memcpy(model2 + (H - 1) * ROW, host_b, ROW);
    AUDIT("cudaMemcpyFromArrayAsync_ptsz");
    memset(back, 0, N);
    OK("cudaMemcpyFromArrayAsync_ptsz", cudaMemcpyFromArrayAsync_ptsz(back, other, 0, 0, N, cudaMemcpyDeviceToHost, NULL));
    OK("sync the per-thread stream", cudaStreamSynchronize_ptsz(NULL));
    EXPECT("1D per-thread copies", memcmp(model2, back, N) == 0);
    AUDIT("cudaMemcpyArrayToArray");
    EXPECT_CODE("1D between arrays past the end", cudaMemcpyArrayToArray(array, 0, 1, other, 0, 0, N, cudaMemcpyDeviceToDevice),
                cudaErrorInvalidValue);
    OK("cudaMemcpyArrayToArray (rows out of step)", cudaMemcpyArrayToArray(array, 4, 1, other, 12, 3, 500, cudaMemcpyDeviceToDevice));
    memcpy(model + ROW + 4, model2 + 3 * ROW + 12, 500);
    OK("read it back", cudaMemcpy2DFromArray(back, ROW, array, 0, 0, ROW, H, cudaMemcpyDeviceToHost));
    EXPECT("1D between arrays", memcmp(model, back, N) == 0);
    AUDIT("cudaMemcpyArrayToArray_ptds");
    OK("cudaMemcpyArrayToArray_ptds (whole rows and a part)", cudaMemcpyArrayToArray_ptds(array, 0, 10, other, 0, 12, 3 * ROW + 20, cudaMemcpyDefault));
    memcpy(model + 10 * ROW, model2 + 12 * ROW, 3 * ROW + 20);
    OK("read it back", cudaMemcpy2DFromArray(back, ROW, array, 0, 0, ROW, H, cudaMemcpyDeviceToHost));
    EXPECT("1D between arrays, whole rows", memcmp(model, back, N) == 0);

    /* 3D arrays, and 3D copies that count the array's elements (16 floats: 64 bytes a row). */
    struct cudaExtent vol = extent_of(16, 8, 4);
    AUDIT("cudaMalloc3DArray");
    EXPECT_CODE("cudaMalloc3DArray(NULL)", cudaMalloc3DArray(NULL, &f32, vol, 0), cudaErrorInvalidValue);
    EXPECT_CODE("a 3D array of an invalid channel description", cudaMalloc3DArray(&volume, &invalid[0], vol, 0),
                cudaErrorInvalidChannelDescriptor);
    OK("cudaMalloc3DArray", cudaMalloc3DArray(&volume, &f32, vol, 0));
    OK("its info", cudaArrayGetInfo(&got, &extent, &flags, volume));
    EXPECT("a 3D array's extent", extent.width == 16 && extent.height == 8 && extent.depth == 4 && flags == 0 && got.x == 32);
    OK("a layered array", cudaMalloc3DArray(&layered, &u8x4, extent_of(16, 8, 3), cudaArrayLayered));
    OK("its info", cudaArrayGetInfo(&got, &extent, &flags, layered));
    EXPECT("a layered array's layers and flag", extent.depth == 3 && flags == cudaArrayLayered && got.w == 8);
    struct cudaMemcpy3DParms p;
    fill(host_a, N, 41);
    memset(&p, 0, sizeof p);
    p.srcPtr = pitched_at(host_a, 64, 64, 8);
    p.dstArray = volume;
    p.extent = vol;
    p.kind = cudaMemcpyHostToDevice;
    OK("cudaMemcpy3D into a 3D array (extent in elements)", cudaMemcpy3D(&p));
    memset(&p, 0, sizeof p);
    p.srcArray = volume;
    p.srcPos.x = 4, p.srcPos.y = 2, p.srcPos.z = 1;
    /* Next to an array, memory's x counts the array's elements too, as CUDA 13 takes it. */
    p.dstPtr = pitched_at(host_b, 48, 48, 3);
    p.dstPos.x = 2;
    p.extent = extent_of(8, 3, 2);
    p.kind = cudaMemcpyDeviceToHost;
    memset(host_b, 0, N);
    OK("cudaMemcpy3D out of a 3D array (positions in elements)", cudaMemcpy3D(&p));
    rows_ok = 1;
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 3; y++)
            rows_ok &= memcmp(host_b + (z * 3 + y) * 48 + 8, host_a + ((1 + z) * 8 + 2 + y) * 64 + 16, 32) == 0 &&
                       all_bytes(host_b + (z * 3 + y) * 48, 8, 0);
    EXPECT("a box of a 3D array", rows_ok);
    memset(&p.dstPos, 0, sizeof p.dstPos);
    p.srcArray = array;
    memset(&p.srcPos, 0, sizeof p.srcPos);
    p.dstPtr.ptr = NULL;
    p.dstArray = bytes8;
    p.extent = extent_of(16, 4, 1);
    EXPECT_CODE("3D copy between arrays of elements of two sizes", cudaMemcpy3D(&p), cudaErrorInvalidValue);
    p.dstArray = other;
    p.kind = cudaMemcpyDeviceToDevice;
    OK("cudaMemcpy3D between 2D arrays (depth 1)", cudaMemcpy3D(&p));
    copy_rows(model2, ROW, model, ROW, 64, 4);
    OK("read it back", cudaMemcpy2DFromArray(back, ROW, other, 0, 0, ROW, H, cudaMemcpyDeviceToHost));
    EXPECT("3D copy between arrays", memcmp(model2, back, N) == 0);

    /* Mipmapped arrays. */
    AUDIT("cudaMallocMipmappedArray");
    EXPECT_CODE("cudaMallocMipmappedArray(NULL)", cudaMallocMipmappedArray(NULL, &f32, extent_of(32, 32, 0), 3, 0), cudaErrorInvalidValue);
    EXPECT_CODE("a mipmapped array of an invalid channel description",
                cudaMallocMipmappedArray(&mipmap, &invalid[1], extent_of(32, 32, 0), 3, 0), cudaErrorInvalidChannelDescriptor);
    OK("cudaMallocMipmappedArray", cudaMallocMipmappedArray(&mipmap, &f32, extent_of(32, 32, 0), 3, 0));
    AUDIT("cudaGetMipmappedArrayLevel");
    EXPECT_CODE("a level into NULL", cudaGetMipmappedArrayLevel(NULL, mipmap, 0), cudaErrorInvalidValue);
    EXPECT_CODE("a level of no mipmapped array", cudaGetMipmappedArrayLevel(&level, NULL, 0), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("a level past the last", cudaGetMipmappedArrayLevel(&level, mipmap, 3), cudaErrorInvalidValue);
    OK("cudaGetMipmappedArrayLevel", cudaGetMipmappedArrayLevel(&level, mipmap, 1));
    OK("the level's info", cudaArrayGetInfo(&got, &extent, &flags, level));
    EXPECT("level 1 is half the size", extent.width == 16 && extent.height == 16 && extent.depth == 0 && got.x == 32);
    fill(host_a, N, 42);
    OK("into the level", cudaMemcpy2DToArray(level, 0, 0, host_a, 64, 64, 16, cudaMemcpyHostToDevice));
    memset(host_b, 0, N);
    OK("out of the level", cudaMemcpy2DFromArray(host_b, 64, level, 0, 0, 64, 16, cudaMemcpyDeviceToHost));
    EXPECT("a level holds its bytes", memcmp(host_a, host_b, 1024) == 0);

    /* The planes of an NV12 array; sparse and deferred-mapping arrays (the driver's answers). */
    struct cudaChannelFormatDesc nv12 = cudaCreateChannelDesc(8, 8, 8, 0, cudaChannelFormatKindNV12);
    cudaArray_t frame = NULL, luma = NULL, chroma = NULL, sparse_array = NULL, deferred = NULL;
    OK("an NV12 array", cudaMallocArray(&frame, &nv12, 64, 32, 0));
    AUDIT("cudaArrayGetPlane");
    EXPECT_CODE("a plane into NULL", cudaArrayGetPlane(NULL, frame, 0), cudaErrorInvalidValue);
    EXPECT_CODE("a plane of no array", cudaArrayGetPlane(&luma, NULL, 0), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("a third plane", cudaArrayGetPlane(&luma, frame, 2), cudaErrorInvalidValue);
    EXPECT_CODE("a plane of a float array", cudaArrayGetPlane(&luma, array, 0), cudaErrorInvalidValue);
    OK("cudaArrayGetPlane", cudaArrayGetPlane(&luma, frame, 0));
    OK("the chroma plane", cudaArrayGetPlane(&chroma, frame, 1));
    OK("the chroma plane's info", cudaArrayGetInfo(&got, &extent, &flags, chroma));
    EXPECT("chroma: half the size, two 8-bit channels",
           extent.width == 32 && extent.height == 16 && got.x == 8 && got.y == 8 && got.z == 0 && got.f == cudaChannelFormatKindUnsigned);
    fill(host_a, N, 43);
    OK("into the luma plane", cudaMemcpy2DToArray(luma, 0, 0, host_a, 64, 64, 32, cudaMemcpyHostToDevice));
    memset(host_b, 0, N);
    OK("out of it", cudaMemcpy2DFromArray(host_b, 64, luma, 0, 0, 64, 32, cudaMemcpyDeviceToHost));
    EXPECT("the luma plane holds its bytes", memcmp(host_a, host_b, 2048) == 0);
    EXPECT_CODE("a plane goes with its array", cudaFreeArray(luma), cudaErrorInvalidValue);
    OK("free the NV12 array", cudaFreeArray(frame));
    EXPECT_CODE("its planes went with it", cudaArrayGetInfo(&got, &extent, &flags, chroma), cudaErrorInvalidValue);

    struct cudaArraySparseProperties sparse_props;
    struct cudaArrayMemoryRequirements requirements;
    cudaMipmappedArray_t sparse_mipmap = NULL, deferred_mipmap = NULL;
    AUDIT("cudaArrayGetSparseProperties");
    OK("a sparse array", cudaMallocArray(&sparse_array, &f32, 1000, 600, cudaArraySparse));
    EXPECT_CODE("properties into NULL", cudaArrayGetSparseProperties(NULL, sparse_array), cudaErrorInvalidValue);
    EXPECT_CODE("properties of an array that is not sparse", cudaArrayGetSparseProperties(&sparse_props, array), cudaErrorInvalidValue);
    OK("cudaArrayGetSparseProperties", cudaArrayGetSparseProperties(&sparse_props, sparse_array));
    EXPECT("64 KiB tiles of floats",
           sparse_props.tileExtent.width == 128 && sparse_props.tileExtent.height == 128 && sparse_props.tileExtent.depth == 1);
    AUDIT("cudaMipmappedArrayGetSparseProperties");
    EXPECT_CODE("a mipmapped array that is not sparse", cudaMipmappedArrayGetSparseProperties(&sparse_props, mipmap),
                cudaErrorInvalidValue);
    OK("a sparse mipmapped array", cudaMallocMipmappedArray(&sparse_mipmap, &f32, extent_of(1024, 1024, 0), 8, cudaArraySparse));
    OK("cudaMipmappedArrayGetSparseProperties", cudaMipmappedArrayGetSparseProperties(&sparse_props, sparse_mipmap));
    EXPECT("its mip tail", sparse_props.miptailFirstLevel == 4 && sparse_props.miptailSize == 65536);
    AUDIT("cudaArrayGetMemoryRequirements");
    OK("a deferred-mapping array", cudaMallocArray(&deferred, &f32, 100, 100, cudaArrayDeferredMapping));
    EXPECT_CODE("requirements into NULL", cudaArrayGetMemoryRequirements(NULL, deferred, 0), cudaErrorInvalidValue);
    EXPECT_CODE("requirements on no device", cudaArrayGetMemoryRequirements(&requirements, deferred, 7), cudaErrorInvalidDevice);
    EXPECT_CODE("requirements of a sparse array", cudaArrayGetMemoryRequirements(&requirements, sparse_array, 0), cudaErrorInvalidValue);
    OK("cudaArrayGetMemoryRequirements", cudaArrayGetMemoryRequirements(&requirements, deferred, 0));
    EXPECT("a size of whole tiles", requirements.size == 65536 && requirements.alignment == 65536);
    AUDIT("cudaMipmappedArrayGetMemoryRequirements");
    EXPECT_CODE("a mipmapped array that is not deferred", cudaMipmappedArrayGetMemoryRequirements(&requirements, sparse_mipmap, 0),
                cudaErrorInvalidValue);
    OK("a deferred-mapping mipmapped array",
       cudaMallocMipmappedArray(&deferred_mipmap, &f32, extent_of(256, 256, 0), 2, cudaArrayDeferredMapping));
    OK("cudaMipmappedArrayGetMemoryRequirements", cudaMipmappedArrayGetMemoryRequirements(&requirements, deferred_mipmap, 0));
    EXPECT("two levels of whole tiles", requirements.size == 5 * 65536 && requirements.alignment == 65536);
    OK("free the sparse array", cudaFreeArray(sparse_array));
    OK("free the deferred-mapping array", cudaFreeArray(deferred));
    OK("free the sparse mipmapped array", cudaFreeMipmappedArray(sparse_mipmap));
    OK("free the deferred-mapping mipmapped array", cudaFreeMipmappedArray(deferred_mipmap));

    /* Texture objects: what they were made with comes back. */
    cudaTextureObject_t texture = 0, linear = 0, linear_int = 0, viewed = 0, mipmapped = 0, integer = 0;
    struct cudaResourceDesc res, linear_res, bad_res, res_back;
    struct cudaTextureDesc desc, linear_desc, bad_desc, desc_back;
    struct cudaResourceViewDesc view, view_back;
    memset(&res, 0, sizeof res);
    res.resType = cudaResourceTypeArray;
    res.res.array.array = array;
    memset(&desc, 0, sizeof desc);
    desc.addressMode[0] = cudaAddressModeWrap;
    desc.addressMode[1] = cudaAddressModeMirror;
    desc.addressMode[2] = cudaAddressModeBorder;
    desc.filterMode = cudaFilterModeLinear;
    desc.readMode = cudaReadModeElementType;
    desc.borderColor[0] = 0.25f, desc.borderColor[1] = 0.5f, desc.borderColor[2] = 0.75f, desc.borderColor[3] = 1.0f;
    desc.normalizedCoords = 1;
    desc.maxAnisotropy = 4;
    desc.mipmapFilterMode = cudaFilterModeLinear;
    desc.mipmapLevelBias = 0.5f;
    desc.maxMipmapLevelClamp = 2.0f;
    desc.disableTrilinearOptimization = 1;
    memset(&linear_res, 0, sizeof linear_res);
    linear_res.resType = cudaResourceTypeLinear;
    linear_res.res.linear.devPtr = dev;
    linear_res.res.linear.desc = u8;
    linear_res.res.linear.sizeInBytes = N;
    memset(&linear_desc, 0, sizeof linear_desc);
    linear_desc.addressMode[0] = cudaAddressModeWrap;
    linear_desc.readMode = cudaReadModeNormalizedFloat;
    linear_desc.sRGB = 1;
    AUDIT("cudaCreateTextureObject");
    EXPECT_CODE("a texture into NULL", cudaCreateTextureObject(NULL, &res, &desc, NULL), cudaErrorInvalidValue);
    EXPECT_CODE("a texture of no resource", cudaCreateTextureObject(&texture, NULL, &desc, NULL), cudaErrorInvalidValue);
    EXPECT_CODE("a texture without a description", cudaCreateTextureObject(&texture, &res, NULL, NULL), cudaErrorInvalidValue);
    bad_res = res;
    bad_res.resType = (enum cudaResourceType)9;
    EXPECT_CODE("a texture of an unknown resource type", cudaCreateTextureObject(&texture, &bad_res, &desc, NULL), cudaErrorInvalidValue);
    bad_res = res;
    bad_res.res.array.array = BOGUS_ARRAY;
    EXPECT_CODE("a texture of an unknown array", cudaCreateTextureObject(&texture, &bad_res, &desc, NULL), cudaErrorInvalidValue);
    bad_res = linear_res;
    bad_res.res.linear.desc = invalid[2];
    EXPECT_CODE("a texture of memory with an invalid channel description", cudaCreateTextureObject(&texture, &bad_res, &desc, NULL),
                cudaErrorInvalidChannelDescriptor);
    bad_desc = desc;
    bad_desc.readMode = (enum cudaTextureReadMode)3;
    EXPECT_CODE("a texture of an unknown read mode", cudaCreateTextureObject(&texture, &res, &bad_desc, NULL), cudaErrorInvalidValue);
    memset(&view, 0, sizeof view);
    view.format = cudaResViewFormatFloat1;
    view.width = W;
    view.height = H;
    EXPECT_CODE("a view of memory", cudaCreateTextureObject(&texture, &linear_res, &linear_desc, &view), cudaErrorInvalidValue);
    EXPECT("no texture handed out", texture == 0);
    OK("cudaCreateTextureObject (a float array)", cudaCreateTextureObject(&texture, &res, &desc, NULL));
    OK("a texture of integers in memory, read as normalized floats", cudaCreateTextureObject(&linear, &linear_res, &linear_desc, NULL));
    linear_desc.readMode = cudaReadModeElementType;
    OK("a texture of integers in memory, read as integers", cudaCreateTextureObject(&linear_int, &linear_res, &linear_desc, NULL));
    OK("a texture through a view", cudaCreateTextureObject(&viewed, &res, &desc, &view));
    res.resType = cudaResourceTypeMipmappedArray;
    res.res.mipmap.mipmap = mipmap;
    OK("a texture of a mipmapped array", cudaCreateTextureObject(&mipmapped, &res, &desc, NULL));
    res.resType = cudaResourceTypeArray;
    res.res.array.array = line;
    bad_desc = desc;
    bad_desc.filterMode = cudaFilterModePoint; /* integers are not interpolated */
    OK("a texture of an integer array, read as integers", cudaCreateTextureObject(&integer, &res, &bad_desc, NULL));
    res.res.array.array = array;
    EXPECT("six textures", texture && linear && linear_int && viewed && mipmapped && integer);
    AUDIT("cudaGetTextureObjectTextureDesc");
    EXPECT_CODE("a texture description into NULL", cudaGetTextureObjectTextureDesc(NULL, texture), cudaErrorInvalidValue);
    EXPECT_CODE("the description of an unknown texture", cudaGetTextureObjectTextureDesc(&desc_back, 0x123), cudaErrorInvalidValue);
    memset(&desc_back, 0xff, sizeof desc_back);
    OK("cudaGetTextureObjectTextureDesc", cudaGetTextureObjectTextureDesc(&desc_back, texture));
    EXPECT("the description it was made with", memcmp(&desc, &desc_back, sizeof desc) == 0);
    OK("of the mipmapped array's", cudaGetTextureObjectTextureDesc(&desc_back, mipmapped));
    EXPECT("a float mipmapped array is read as it is", desc_back.readMode == cudaReadModeElementType);
    OK("of the integer array's", cudaGetTextureObjectTextureDesc(&desc_back, integer));
    EXPECT("integers read as integers", desc_back.readMode == cudaReadModeElementType && desc_back.normalizedCoords == 1);
    OK("of the normalized integers'", cudaGetTextureObjectTextureDesc(&desc_back, linear));
    EXPECT("integers read as normalized floats; unnormalized coordinates clamp instead of wrapping",
           desc_back.readMode == cudaReadModeNormalizedFloat && desc_back.sRGB == 1 && desc_back.normalizedCoords == 0 &&
               desc_back.addressMode[0] == cudaAddressModeClamp);
    OK("of the integers in memory", cudaGetTextureObjectTextureDesc(&desc_back, linear_int));
    EXPECT("integers in memory read as integers", desc_back.readMode == cudaReadModeElementType);
    AUDIT("cudaGetTextureObjectResourceDesc");
    EXPECT_CODE("a resource description into NULL", cudaGetTextureObjectResourceDesc(NULL, texture), cudaErrorInvalidValue);
    memset(&res_back, 0xff, sizeof res_back);
    OK("cudaGetTextureObjectResourceDesc", cudaGetTextureObjectResourceDesc(&res_back, texture));
    EXPECT("the array", res_back.resType == cudaResourceTypeArray && res_back.res.array.array == array && res_back.flags == 0);
    OK("of the texture of memory", cudaGetTextureObjectResourceDesc(&res_back, linear));
    EXPECT("the memory and its channels",
           res_back.resType == cudaResourceTypeLinear && res_back.res.linear.devPtr == dev && res_back.res.linear.sizeInBytes == N &&
               memcmp(&res_back.res.linear.desc, &u8, sizeof u8) == 0);
    AUDIT("cudaGetTextureObjectResourceViewDesc");
    EXPECT_CODE("a view into NULL", cudaGetTextureObjectResourceViewDesc(NULL, viewed), cudaErrorInvalidValue);
    memset(&view_back, 0xff, sizeof view_back);
    OK("cudaGetTextureObjectResourceViewDesc", cudaGetTextureObjectResourceViewDesc(&view_back, viewed));
    EXPECT("the view it was made with", memcmp(&view, &view_back, sizeof view) == 0);
    AUDIT("cudaDestroyTextureObject");
    OK("cudaDestroyTextureObject", cudaDestroyTextureObject(texture));
    EXPECT_CODE("destroy it again", cudaDestroyTextureObject(texture), cudaErrorInvalidValue);
    EXPECT_CODE("a destroyed texture has no description", cudaGetTextureObjectResourceDesc(&res_back, texture), cudaErrorInvalidValue);
    OK("destroy the others", cudaDestroyTextureObject(linear));
    OK("destroy the others", cudaDestroyTextureObject(linear_int));
    OK("destroy the others", cudaDestroyTextureObject(viewed));
    OK("destroy the others", cudaDestroyTextureObject(mipmapped));
    OK("destroy the others", cudaDestroyTextureObject(integer));

    /* Surface objects, over arrays made for them. */
    cudaSurfaceObject_t surface = 0;
    AUDIT("cudaCreateSurfaceObject");
    EXPECT_CODE("a surface into NULL", cudaCreateSurfaceObject(NULL, &res), cudaErrorInvalidValue);
    EXPECT_CODE("a surface of no resource", cudaCreateSurfaceObject(&surface, NULL), cudaErrorInvalidValue);
    EXPECT_CODE("a surface of memory", cudaCreateSurfaceObject(&surface, &linear_res), cudaErrorInvalidValue);
    OK("cudaCreateSurfaceObject", cudaCreateSurfaceObject(&surface, &res));
    AUDIT("cudaGetSurfaceObjectResourceDesc");
    EXPECT_CODE("a surface's resource into NULL", cudaGetSurfaceObjectResourceDesc(NULL, surface), cudaErrorInvalidValue);
    memset(&res_back, 0xff, sizeof res_back);
    OK("cudaGetSurfaceObjectResourceDesc", cudaGetSurfaceObjectResourceDesc(&res_back, surface));
    EXPECT("the surface's array", res_back.resType == cudaResourceTypeArray && res_back.res.array.array == array);
    AUDIT("cudaDestroySurfaceObject");
    OK("cudaDestroySurfaceObject", cudaDestroySurfaceObject(surface));
    EXPECT_CODE("destroy it again", cudaDestroySurfaceObject(surface), cudaErrorInvalidValue);

    AUDIT("cudaFreeMipmappedArray");
    OK("cudaFreeMipmappedArray(NULL)", cudaFreeMipmappedArray(NULL));
    OK("cudaFreeMipmappedArray", cudaFreeMipmappedArray(mipmap));
    EXPECT_CODE("a freed mipmapped array has no levels", cudaGetMipmappedArrayLevel(&level, mipmap, 0), cudaErrorInvalidValue);
    EXPECT_CODE("free it again", cudaFreeMipmappedArray(mipmap), cudaErrorInvalidValue);
    AUDIT("cudaFreeArray");
    OK("cudaFreeArray(NULL)", cudaFreeArray(NULL));
    OK("cudaFreeArray", cudaFreeArray(array));
    EXPECT_CODE("a freed array has no info", cudaArrayGetInfo(&got, &extent, &flags, array), cudaErrorInvalidValue);
    EXPECT_CODE("free it again", cudaFreeArray(array), cudaErrorInvalidValue);
    cudaArray_t rest[] = {other, line, bytes8, volume, layered};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) OK("free the others", cudaFreeArray(rest[i]));
    OK("cudaFree", cudaFree(dev));
    OK("cudaStreamDestroy", cudaStreamDestroy(stream));
}
#pragma GCC diagnostic pop

static void reset(void) {
    void *dev = NULL;
    cudaStream_t stream;
    cudaEvent_t event;
    AUDIT("cudaDeviceReset");
    OK("cudaMalloc before the reset", cudaMalloc(&dev, N));
    OK("a stream before the reset", cudaStreamCreate(&stream));
    OK("an event before the reset", cudaEventCreate(&event));
    OK("a launch of a graph that does not exist before the reset", cudaGraphLaunch(BOGUS_GRAPH_EXEC, stream));
    OK("cudaDeviceReset", cudaDeviceReset());
    OK("the reset dropped what was owed to the next synchronization", cudaDeviceSynchronize());
    EXPECT_CODE("allocations are gone", cudaFree(dev), cudaErrorInvalidValue);
    EXPECT_CODE("streams are gone", cudaStreamQuery(stream), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("events are gone", cudaEventQuery(event), cudaErrorInvalidResourceHandle);
    OK("new work after the reset", cudaMalloc(&dev, N));
    OK("memset after the reset", cudaMemset(dev, 0x55, N));
    EXPECT("memset after the reset read back", device_bytes_are(dev, N, 0x55));
    OK("cudaFree after the reset", cudaFree(dev));
}

// Capture into a graph of the app's, after one of its nodes, and moving the capture's
// dependencies (memsets are captured on the emulated device; nothing runs here). Edge data goes
// to the server's device: default data is none; a programmatic edge is refused there, as the
// emulated device has no kernel nodes.
static void capture_to_graph(void) {
    cudaStream_t stream = NULL;
    void *memory = NULL;
    OK("a stream to capture", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    OK("memory to set", cudaMalloc(&memory, 4096));
    cudaGraph_t graph = NULL, ended = NULL;
    cudaGraphNode_t first = NULL;
    OK("a graph of the app's", cudaGraphCreate(&graph, 0));
    OK("its first node", cudaGraphAddEmptyNode(&first, graph, NULL, 0));
    cudaGraphEdgeData plain, programmatic;
    memset(&plain, 0, sizeof plain);
    memset(&programmatic, 0, sizeof programmatic);
    programmatic.from_port = cudaGraphKernelNodePortProgrammatic;
    programmatic.type = cudaGraphDependencyTypeProgrammatic;
    AUDIT("cudaStreamBeginCaptureToGraph");
    EXPECT_CODE("a programmatic edge on a device without kernel nodes",
                cudaStreamBeginCaptureToGraph(stream, graph, &first, &programmatic, 1, cudaStreamCaptureModeGlobal), cudaErrorNotSupported);
    OK("cudaStreamBeginCaptureToGraph", cudaStreamBeginCaptureToGraph(stream, graph, &first, NULL, 1, cudaStreamCaptureModeGlobal));
    OK("a memset captured", cudaMemsetAsync(memory, 1, 4096, stream));
    AUDIT("cudaStreamUpdateCaptureDependencies");
    EXPECT_CODE("an unknown flag", cudaStreamUpdateCaptureDependencies(stream, &first, NULL, 1, 7), cudaErrorInvalidValue);
    EXPECT_CODE("a programmatic dependency on a device without kernel nodes",
                cudaStreamUpdateCaptureDependencies(stream, &first, &programmatic, 1, cudaStreamSetCaptureDependencies), cudaErrorNotSupported);
    OK("set the dependencies back to the first node, with default edge data",
       cudaStreamUpdateCaptureDependencies(stream, &first, &plain, 1, cudaStreamSetCaptureDependencies));
    const cudaGraphNode_t *deps = NULL;
    const cudaGraphEdgeData *edges = &plain;
    size_t count = 0;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    OK("the capture's dependencies with their edge data", cudaStreamGetCaptureInfo(stream, &status, NULL, NULL, &deps, &edges, &count));
    EXPECT("the first node, by a default edge (no edge data)", count == 1 && deps[0] == first && edges == NULL);
    OK("a second memset captured", cudaMemsetAsync(memory, 2, 4096, stream));
    OK("end the capture", cudaStreamEndCapture(stream, &ended));
    EXPECT("the capture ended in the app's graph", ended == graph);
    size_t nodes = 0, roots = 0;
    OK("count nodes", cudaGraphGetNodes(graph, NULL, &nodes));
    OK("count roots", cudaGraphGetRootNodes(graph, NULL, &roots));
    EXPECT("three nodes, the first the only root", nodes == 3 && roots == 1);
    AUDIT("cudaStreamBeginCaptureToGraph_ptsz");
    OK("cudaStreamBeginCaptureToGraph_ptsz", cudaStreamBeginCaptureToGraph_ptsz(stream, graph, NULL, NULL, 0, cudaStreamCaptureModeRelaxed));
    AUDIT("cudaStreamUpdateCaptureDependencies_ptsz");
    OK("cudaStreamUpdateCaptureDependencies_ptsz", cudaStreamUpdateCaptureDependencies_ptsz(stream, &first, NULL, 1, cudaStreamAddCaptureDependencies));
    OK("end the second capture", cudaStreamEndCapture(stream, &ended));
    OK("destroy the graph", cudaGraphDestroy(graph));
    OK("free", cudaFree(memory));
    OK("destroy the stream", cudaStreamDestroy(stream));
}

/* Peers (a session serves one device, which is not its own peer), stream queries, device
 * identity, pool access and CUDA 13's location-based pools. */
static void peers_and_queries(void) {
    int count = 0;
    OK("a device count", cudaGetDeviceCount(&count));

    AUDIT("cudaDeviceCanAccessPeer");
    int can = -1;
    OK("cudaDeviceCanAccessPeer", cudaDeviceCanAccessPeer(&can, 0, 0));
    EXPECT("a device is not its own peer", can == 0);
    EXPECT_CODE("a peer that does not exist", cudaDeviceCanAccessPeer(&can, 0, count), cudaErrorInvalidDevice);
    EXPECT_CODE("into NULL", cudaDeviceCanAccessPeer(NULL, 0, 0), cudaErrorInvalidValue);
    AUDIT("cudaDeviceEnablePeerAccess");
    EXPECT_CODE("the current device as its own peer", cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessUnsupported);
    EXPECT_CODE("flags", cudaDeviceEnablePeerAccess(0, 1), cudaErrorInvalidValue);
    EXPECT_CODE("a peer that does not exist", cudaDeviceEnablePeerAccess(count, 0), cudaErrorInvalidDevice);
    AUDIT("cudaDeviceDisablePeerAccess");
    EXPECT_CODE("access never enabled", cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    EXPECT_CODE("a peer that does not exist", cudaDeviceDisablePeerAccess(count), cudaErrorInvalidDevice);

    AUDIT("cudaMemcpyPeer");
    AUDIT("cudaMemcpyPeerAsync");
    unsigned char *a = NULL, *b = NULL;
    cudaStream_t stream;
    OK("a stream", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    OK("a", cudaMalloc((void **)&a, N));
    OK("b", cudaMalloc((void **)&b, N));
    OK("fill a", cudaMemset(a, 0x3c, N));
    OK("cudaMemcpyPeer", cudaMemcpyPeer(b, 0, a, 0, N));
    EXPECT("the peer copy landed", device_bytes_are(b, N, 0x3c));
    OK("fill a again", cudaMemset(a, 0x3d, N));
    OK("cudaMemcpyPeerAsync", cudaMemcpyPeerAsync(b, 0, a, 0, N, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    EXPECT("the asynchronous peer copy landed", device_bytes_are(b, N, 0x3d));
    EXPECT_CODE("a device that does not exist", cudaMemcpyPeer(b, count, a, 0, N), cudaErrorInvalidDevice);
    EXPECT_CODE("past the end", cudaMemcpyPeer(b + 1, 0, a, 0, N), cudaErrorInvalidValue);

    AUDIT("cudaStreamGetDevice");
    AUDIT("cudaStreamGetDevice_ptsz");
    int device = -1, device_ptsz = -1;
    OK("cudaStreamGetDevice", cudaStreamGetDevice(stream, &device));
    OK("cudaStreamGetDevice_ptsz", cudaStreamGetDevice_ptsz(NULL, &device_ptsz));
    EXPECT("the streams are on device 0", device == 0 && device_ptsz == 0);
    EXPECT_CODE("of a stream that does not exist", cudaStreamGetDevice(BOGUS_STREAM, &device), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("into NULL", cudaStreamGetDevice(stream, NULL), cudaErrorInvalidValue);
    AUDIT("cudaStreamGetId");
    AUDIT("cudaStreamGetId_ptsz");
    unsigned long long id = 0, legacy = 0, per_thread = 0;
    OK("cudaStreamGetId", cudaStreamGetId(stream, &id));
    OK("of the legacy stream", cudaStreamGetId(cudaStreamLegacy, &legacy));
    OK("cudaStreamGetId_ptsz", cudaStreamGetId_ptsz(NULL, &per_thread));
    EXPECT("stream ids differ", id != 0 && legacy != 0 && per_thread != 0 && id != legacy && per_thread != legacy && id != per_thread);
    EXPECT_CODE("of a stream that does not exist", cudaStreamGetId(BOGUS_STREAM, &id), cudaErrorInvalidResourceHandle);

    AUDIT("cudaDeviceGetPCIBusId");
    AUDIT("cudaDeviceGetByPCIBusId");
    /* The emulated device is on no PCI bus: it reports no PCI location, and the driver answers
     * as for a device without one. */
    char bus[32] = {0};
    EXPECT_CODE("the emulated device's bus id", cudaDeviceGetPCIBusId(bus, sizeof bus, 0), cudaErrorInvalidValue);
    EXPECT("no bus id was written", bus[0] == 0);
    int by_bus = -1;
    EXPECT_CODE("a device that does not exist", cudaDeviceGetPCIBusId(bus, sizeof bus, count), cudaErrorInvalidDevice);
    EXPECT_CODE("a bus id that names none", cudaDeviceGetByPCIBusId(&by_bus, "ffff:ff:1f.0"), cudaErrorInvalidDevice);
    EXPECT_CODE("a bus id that is no bus id", cudaDeviceGetByPCIBusId(&by_bus, "bus"), cudaErrorInvalidValue);
    EXPECT("no device was written", by_bus == -1);

    AUDIT("cudaChooseDevice");
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    prop.major = 9;
    int chosen = -1;
    OK("cudaChooseDevice", cudaChooseDevice(&chosen, &prop));
    EXPECT("the session's device", chosen == 0);
    EXPECT_CODE("without properties", cudaChooseDevice(&chosen, NULL), cudaErrorInvalidValue);
    AUDIT("cudaInitDevice");
    OK("cudaInitDevice", cudaInitDevice(0, 0, 0));
    EXPECT_CODE("flags", cudaInitDevice(0, 0, 2), cudaErrorInvalidValue);
    EXPECT_CODE("device flags that do not exist", cudaInitDevice(0, 0x1000, cudaInitDeviceFlagsAreValid), cudaErrorInvalidValue);
    EXPECT_CODE("a device that does not exist", cudaInitDevice(count, 0, 0), cudaErrorInvalidDevice);
    AUDIT("cudaSetValidDevices");
    int valid[1] = {0};
    OK("cudaSetValidDevices", cudaSetValidDevices(valid, 1));
    int invalid[1] = {count};
    EXPECT_CODE("a device that does not exist", cudaSetValidDevices(invalid, 1), cudaErrorInvalidDevice);
    EXPECT_CODE("a list that is NULL", cudaSetValidDevices(NULL, 1), cudaErrorInvalidValue);

    AUDIT("cudaMemGetDefaultMemPool");
    AUDIT("cudaMemGetMemPool");
    AUDIT("cudaMemSetMemPool");
    AUDIT("cudaMemPoolSetAccess");
    AUDIT("cudaMemPoolGetAccess");
    struct cudaMemLocation dev0 = {cudaMemLocationTypeDevice, 0}, host = {cudaMemLocationTypeHost, 0};
    cudaMemPool_t by_device = NULL, by_location = NULL, current = NULL, mine = NULL;
    OK("the device's default pool", cudaDeviceGetDefaultMemPool(&by_device, 0));
    OK("cudaMemGetDefaultMemPool", cudaMemGetDefaultMemPool(&by_location, &dev0, cudaMemAllocationTypePinned));
    EXPECT("the same pool", by_device == by_location);
    EXPECT_CODE("host memory pools", cudaMemGetDefaultMemPool(&by_location, &host, cudaMemAllocationTypePinned),
                cudaErrorNotSupported);
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    OK("a pool", cudaMemPoolCreate(&mine, &props));
    OK("cudaMemSetMemPool", cudaMemSetMemPool(&dev0, cudaMemAllocationTypePinned, mine));
    OK("cudaMemGetMemPool", cudaMemGetMemPool(&current, &dev0, cudaMemAllocationTypePinned));
    EXPECT("the pool set is current", current == mine);
    OK("the device agrees", cudaDeviceGetMemPool(&current, 0));
    EXPECT("the device's current pool", current == mine);
    EXPECT_CODE("an allocation type that does not exist", cudaMemGetMemPool(&current, &dev0, (enum cudaMemAllocationType)7),
                cudaErrorInvalidValue);
    struct cudaMemAccessDesc desc = {dev0, cudaMemAccessFlagsProtReadWrite};
    OK("cudaMemPoolSetAccess", cudaMemPoolSetAccess(mine, &desc, 1));
    enum cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    OK("cudaMemPoolGetAccess", cudaMemPoolGetAccess(&flags, mine, &dev0));
    EXPECT("the device reads and writes its pool", flags == cudaMemAccessFlagsProtReadWrite);
    struct cudaMemAccessDesc elsewhere = {{cudaMemLocationTypeDevice, count}, cudaMemAccessFlagsProtReadWrite};
    EXPECT_CODE("a device that does not exist", cudaMemPoolSetAccess(mine, &elsewhere, 1), cudaErrorInvalidDevice);
    EXPECT_CODE("into NULL", cudaMemPoolGetAccess(NULL, mine, &dev0), cudaErrorInvalidValue);
    OK("the default pool again", cudaMemSetMemPool(&dev0, cudaMemAllocationTypePinned, by_device));
    OK("destroy the pool", cudaMemPoolDestroy(mine));
    OK("free a", cudaFree(a));
    OK("free b", cudaFree(b));
    OK("destroy the stream", cudaStreamDestroy(stream));
}

/* Launches `graph` once on `stream` and waits for it. */
static void launch_once(cudaGraph_t graph, cudaStream_t stream) {
    cudaGraphExec_t exec = NULL;
    OK("instantiate", cudaGraphInstantiate(&exec, graph, 0));
    OK("launch", cudaGraphLaunch(exec, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    OK("destroy the exec", cudaGraphExecDestroy(exec));
}

/* Memory, conditional and generic graph nodes, graph queries and node getters (no kernels:
 * memsets and copies do the work; the emulated device holds a conditional at the value each
 * launch assigns). */
static void graph_node_kinds(void) {
    unsigned char *out = NULL;
    cudaStream_t stream;
    cudaEvent_t event;
    cudaGraph_t graph = NULL, child = NULL, inner = NULL;
    cudaGraphExec_t exec = NULL;
    cudaGraphNode_t alloc_node, set_node, copy_node, free_node, unused, record, wait, child_node, empty;
    cudaGraphNode_t nodes[4] = {NULL, NULL, NULL, NULL}, from[4], to[4];
    cudaGraphEdgeData data[4];
    size_t count = 0, room = 4;
    OK("graph output memory", cudaMalloc((void **)&out, N));
    OK("a stream", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    OK("an event", cudaEventCreateWithFlags(&event, cudaEventDisableTiming));

    AUDIT("cudaGraphAddMemAllocNode");
    AUDIT("cudaGraphAddMemFreeNode");
    AUDIT("cudaGraphMemAllocNodeGetParams");
    AUDIT("cudaGraphMemFreeNodeGetParams");
    AUDIT("cudaGraphNodeGetDependencies");
    AUDIT("cudaGraphNodeGetDependentNodes");
    AUDIT("cudaGraphGetEdges");
    OK("a graph", cudaGraphCreate(&graph, 0));
    struct cudaMemAllocNodeParams alloc;
    memset(&alloc, 0, sizeof alloc);
    alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    alloc.poolProps.location.type = cudaMemLocationTypeDevice;
    alloc.poolProps.location.id = 0;
    alloc.bytesize = N;
    EXPECT_CODE("cudaGraphAddMemAllocNode without parameters", cudaGraphAddMemAllocNode(&unused, graph, NULL, 0, NULL), cudaErrorInvalidValue);
    struct cudaMemAllocNodeParams elsewhere = alloc;
    elsewhere.poolProps.location.id = 5;
    EXPECT_CODE("graph memory on a device the session lacks", cudaGraphAddMemAllocNode(&unused, graph, NULL, 0, &elsewhere),
                cudaErrorInvalidDevice);
    OK("cudaGraphAddMemAllocNode", cudaGraphAddMemAllocNode(&alloc_node, graph, NULL, 0, &alloc));
    EXPECT("the allocation node gave an address", alloc.dptr != NULL);
    struct cudaMemsetParams fill = {alloc.dptr, 0, 0x5a, 1, N, 1};
    OK("fill the graph memory", cudaGraphAddMemsetNode(&set_node, graph, &alloc_node, 1, &fill));
    OK("copy it out", cudaGraphAddMemcpyNode1D(&copy_node, graph, &set_node, 1, out, alloc.dptr, N, cudaMemcpyDeviceToDevice));
    OK("cudaGraphAddMemFreeNode", cudaGraphAddMemFreeNode(&free_node, graph, &copy_node, 1, alloc.dptr));
    EXPECT_CODE("a free node for memory no node made", cudaGraphAddMemFreeNode(&unused, graph, NULL, 0, out), cudaErrorInvalidValue);
    struct cudaMemAllocNodeParams back;
    memset(&back, 0, sizeof back);
    OK("cudaGraphMemAllocNodeGetParams", cudaGraphMemAllocNodeGetParams(alloc_node, &back));
    EXPECT("the allocation's parameters read back",
           back.bytesize == N && back.dptr == alloc.dptr && back.poolProps.allocType == cudaMemAllocationTypePinned);
    EXPECT_CODE("allocation parameters of a memset node", cudaGraphMemAllocNodeGetParams(set_node, &back), cudaErrorInvalidValue);
    void *freed = NULL;
    OK("cudaGraphMemFreeNodeGetParams", cudaGraphMemFreeNodeGetParams(free_node, &freed));
    EXPECT("the free node names the allocation", freed == alloc.dptr);
    OK("cudaGraphNodeGetDependencies (count)", cudaGraphNodeGetDependencies(copy_node, NULL, NULL, &count));
    OK("cudaGraphNodeGetDependencies", cudaGraphNodeGetDependencies(copy_node, nodes, NULL, &room));
    EXPECT("the copy depends on the memset alone", count == 1 && room == 1 && nodes[0] == set_node && nodes[1] == NULL);
    room = 4;
    OK("cudaGraphNodeGetDependentNodes", cudaGraphNodeGetDependentNodes(alloc_node, nodes, data, &room));
    EXPECT("the memset depends on the allocation, by a default edge", room == 1 && nodes[0] == set_node && data[0].type == 0);
    count = 4;
    OK("cudaGraphGetEdges", cudaGraphGetEdges(graph, from, to, data, &count));
    EXPECT("three default edges, the first from the allocation",
           count == 3 && from[0] == alloc_node && to[0] == set_node && data[0].from_port == 0 && data[2].type == 0);
    EXPECT_CODE("edges into one array without the other", cudaGraphGetEdges(graph, NULL, to, NULL, &count), cudaErrorInvalidValue);

    AUDIT("cudaDeviceGetGraphMemAttribute");
    AUDIT("cudaDeviceSetGraphMemAttribute");
    AUDIT("cudaDeviceGraphMemTrim");
    OK("clear the output", cudaMemset(out, 0, N));
    launch_once(graph, stream);
    EXPECT("graph memory was filled and copied out", device_bytes_are(out, N, 0x5a));
    unsigned long long used = 0, zero = 0;
    OK("cudaDeviceGetGraphMemAttribute", cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &used));
    EXPECT("graph memory counted", used >= N);
    EXPECT_CODE("an attribute of a device the session lacks", cudaDeviceGetGraphMemAttribute(7, cudaGraphMemAttrUsedMemHigh, &used),
                cudaErrorInvalidDevice);
    OK("cudaDeviceSetGraphMemAttribute", cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero));
    EXPECT_CODE("the current use cannot be set", cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &zero),
                cudaErrorInvalidValue);
    OK("destroy the graph", cudaGraphDestroy(graph));
    OK("cudaDeviceGraphMemTrim", cudaDeviceGraphMemTrim(0));
    EXPECT_CODE("trim a device the session lacks", cudaDeviceGraphMemTrim(7), cudaErrorInvalidDevice);

    AUDIT("cudaGraphConditionalHandleCreate");
    AUDIT("cudaGraphAddNode");
    for (unsigned value = 0; value < 2; value++) {
        cudaGraphConditionalHandle handle = 0;
        OK("a conditional graph", cudaGraphCreate(&graph, 0));
        OK("cudaGraphConditionalHandleCreate", cudaGraphConditionalHandleCreate(&handle, graph, value, cudaGraphCondAssignDefault));
        struct cudaGraphNodeParams params;
        memset(&params, 0, sizeof params);
        params.type = cudaGraphNodeTypeConditional;
        params.conditional.handle = handle;
        params.conditional.type = cudaGraphCondTypeIf;
        params.conditional.size = 1;
        OK("cudaGraphAddNode (conditional IF)", cudaGraphAddNode(&unused, graph, NULL, NULL, 0, &params));
        EXPECT("the conditional node has a body", params.conditional.phGraph_out != NULL && params.conditional.phGraph_out[0] != NULL);
        if (params.conditional.phGraph_out == NULL) break;
        struct cudaGraphNodeParams set;
        memset(&set, 0, sizeof set);
        set.type = cudaGraphNodeTypeMemset;
        set.memset.dst = out;
        set.memset.value = 0x11 + value;
        set.memset.elementSize = 1;
        set.memset.width = N;
        set.memset.height = 1;
        OK("cudaGraphAddNode (memset in the body)", cudaGraphAddNode(&unused, params.conditional.phGraph_out[0], NULL, NULL, 0, &set));
        OK("clear the output", cudaMemset(out, 0, N));
        launch_once(graph, stream);
        EXPECT("the condition chose", value ? device_bytes_are(out, N, 0x12) : device_bytes_are(out, N, 0));
        OK("destroy the conditional graph", cudaGraphDestroy(graph));
    }

    /* Generic allocation, memset, copy (the runtime's pitched form) and free nodes. */
    AUDIT("cudaGraphNodeSetParams");
    AUDIT("cudaGraphExecNodeSetParams");
    OK("a generic graph", cudaGraphCreate(&graph, 0));
    struct cudaGraphNodeParams generic;
    memset(&generic, 0, sizeof generic);
    generic.type = cudaGraphNodeTypeMemAlloc;
    generic.alloc.poolProps = alloc.poolProps;
    generic.alloc.bytesize = N;
    OK("cudaGraphAddNode (allocation)", cudaGraphAddNode(&alloc_node, graph, NULL, NULL, 0, &generic));
    EXPECT("the generic allocation gave an address", generic.alloc.dptr != NULL && generic.alloc.dptr != alloc.dptr);
    void *memory = generic.alloc.dptr;
    struct cudaGraphNodeParams set;
    memset(&set, 0, sizeof set);
    set.type = cudaGraphNodeTypeMemset;
    set.memset.dst = memory;
    set.memset.value = 0x33;
    set.memset.elementSize = 1;
    set.memset.width = N;
    set.memset.height = 1;
    cudaGraphEdgeData ported = {1, 0, 0, {0}};
    EXPECT_CODE("an edge from a port", cudaGraphAddNode(&unused, graph, &alloc_node, &ported, 1, &set), cudaErrorNotSupported);
    OK("cudaGraphAddNode (memset)", cudaGraphAddNode(&set_node, graph, &alloc_node, NULL, 1, &set));
    struct cudaGraphNodeParams copy;
    memset(&copy, 0, sizeof copy);
    copy.type = cudaGraphNodeTypeMemcpy;
    copy.memcpy.copyParams.srcPtr.ptr = memory;
    copy.memcpy.copyParams.srcPtr.pitch = copy.memcpy.copyParams.srcPtr.xsize = N / 4;
    copy.memcpy.copyParams.srcPtr.ysize = 4;
    copy.memcpy.copyParams.dstPtr = copy.memcpy.copyParams.srcPtr;
    copy.memcpy.copyParams.dstPtr.ptr = out;
    copy.memcpy.copyParams.extent.width = N / 4;
    copy.memcpy.copyParams.extent.height = 4;
    copy.memcpy.copyParams.extent.depth = 1;
    copy.memcpy.copyParams.kind = cudaMemcpyDeviceToDevice;
    OK("cudaGraphAddNode (pitched copy)", cudaGraphAddNode(&copy_node, graph, &set_node, NULL, 1, &copy));
    struct cudaGraphNodeParams release;
    memset(&release, 0, sizeof release);
    release.type = cudaGraphNodeTypeMemFree;
    release.free.dptr = memory;
    OK("cudaGraphAddNode (free)", cudaGraphAddNode(&free_node, graph, &copy_node, NULL, 1, &release));
    struct cudaGraphNodeParams kernel;
    memset(&kernel, 0, sizeof kernel);
    kernel.type = cudaGraphNodeTypeKernel;
    kernel.kernel.func = (void *)not_a_kernel;
    kernel.kernel.gridDim.x = kernel.kernel.gridDim.y = kernel.kernel.gridDim.z = 1;
    kernel.kernel.blockDim = kernel.kernel.gridDim;
    EXPECT_CODE("cudaGraphAddNode (a kernel node of a host function)", cudaGraphAddNode(&unused, graph, NULL, NULL, 0, &kernel),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("cudaGraphAddNode without parameters", cudaGraphAddNode(&unused, graph, NULL, NULL, 0, NULL), cudaErrorInvalidValue);
    OK("clear the output", cudaMemset(out, 0, N));
    launch_once(graph, stream);
    EXPECT("generic nodes allocated, filled, copied out", device_bytes_are(out, N, 0x33));
    set.memset.value = 0x44;
    OK("cudaGraphNodeSetParams (memset)", cudaGraphNodeSetParams(set_node, &set));
    EXPECT_CODE("cudaGraphNodeSetParams without parameters", cudaGraphNodeSetParams(set_node, NULL), cudaErrorInvalidValue);
    OK("cudaGraphInstantiate", cudaGraphInstantiate(&exec, graph, 0));
    OK("launch", cudaGraphLaunch(exec, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    EXPECT("the node's new value ran", device_bytes_are(out, N, 0x44));
    set.memset.value = 0x55;
    OK("cudaGraphExecNodeSetParams (memset)", cudaGraphExecNodeSetParams(exec, set_node, &set));
    OK("launch", cudaGraphLaunch(exec, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    EXPECT("the executable graph's new value ran", device_bytes_are(out, N, 0x55));
    EXPECT_CODE("cudaGraphExecNodeSetParams of a kernel node from a host function", cudaGraphExecNodeSetParams(exec, set_node, &kernel),
                cudaErrorInvalidDeviceFunction);
    OK("destroy the exec", cudaGraphExecDestroy(exec));
    OK("destroy the generic graph", cudaGraphDestroy(graph));

    AUDIT("cudaGraphNodeSetEnabled");
    AUDIT("cudaGraphNodeGetEnabled");
    AUDIT("cudaGraphExecGetFlags");
    AUDIT("cudaGraphEventRecordNodeGetEvent");
    AUDIT("cudaGraphEventWaitNodeGetEvent");
    AUDIT("cudaGraphChildGraphNodeGetGraph");
    OK("a graph of getters", cudaGraphCreate(&graph, 0));
    OK("a child graph", cudaGraphCreate(&child, 0));
    OK("a node of the child", cudaGraphAddEmptyNode(&empty, child, NULL, 0));
    struct cudaMemsetParams fill2 = {out, 0, 0x77, 1, N, 1};
    OK("a memset", cudaGraphAddMemsetNode(&set_node, graph, NULL, 0, &fill2));
    OK("an event record", cudaGraphAddEventRecordNode(&record, graph, &set_node, 1, event));
    OK("an event wait", cudaGraphAddEventWaitNode(&wait, graph, &record, 1, event));
    OK("a child graph node", cudaGraphAddChildGraphNode(&child_node, graph, &wait, 1, child));
    cudaEvent_t got = NULL;
    OK("cudaGraphEventRecordNodeGetEvent", cudaGraphEventRecordNodeGetEvent(record, &got));
    EXPECT("the record node names the event", got == event);
    got = NULL;
    OK("cudaGraphEventWaitNodeGetEvent", cudaGraphEventWaitNodeGetEvent(wait, &got));
    EXPECT("the wait node names the event", got == event);
    EXPECT_CODE("the wait event of a record node", cudaGraphEventWaitNodeGetEvent(record, &got), cudaErrorInvalidValue);
    OK("cudaGraphChildGraphNodeGetGraph", cudaGraphChildGraphNodeGetGraph(child_node, &inner));
    count = 0;
    OK("nodes of the child node's graph", cudaGraphGetNodes(inner, NULL, &count));
    EXPECT("the child node's graph has its one node", inner != NULL && count == 1);
    OK("instantiate with a flag", cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    unsigned long long flags = 0;
    OK("cudaGraphExecGetFlags", cudaGraphExecGetFlags(exec, &flags));
    EXPECT("the instantiation flags read back", flags == cudaGraphInstantiateFlagAutoFreeOnLaunch);
    unsigned enabled = 9;
    OK("cudaGraphNodeGetEnabled", cudaGraphNodeGetEnabled(exec, set_node, &enabled));
    EXPECT("nodes start enabled", enabled == 1);
    OK("cudaGraphNodeSetEnabled", cudaGraphNodeSetEnabled(exec, set_node, 0));
    OK("enabled after it", cudaGraphNodeGetEnabled(exec, set_node, &enabled));
    OK("clear the output", cudaMemset(out, 0, N));
    OK("launch", cudaGraphLaunch(exec, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    EXPECT("a disabled memset does not run", enabled == 0 && device_bytes_are(out, N, 0));
    OK("enable it again", cudaGraphNodeSetEnabled(exec, set_node, 1));
    OK("launch", cudaGraphLaunch(exec, stream));
    OK("synchronize", cudaStreamSynchronize(stream));
    EXPECT("enabled again, it runs", device_bytes_are(out, N, 0x77));
    EXPECT_CODE("an event node cannot be disabled", cudaGraphNodeSetEnabled(exec, record, 0), cudaErrorInvalidValue);
    OK("destroy the exec", cudaGraphExecDestroy(exec));
    OK("destroy the graph", cudaGraphDestroy(graph));
    OK("destroy the child", cudaGraphDestroy(child));
    OK("destroy the event", cudaEventDestroy(event));
    OK("destroy the stream", cudaStreamDestroy(stream));
    OK("free the output", cudaFree(out));
}

static int user_object_destroyed = 0;
static void CUDART_CB user_object_destroy(void *weight) {
    __atomic_add_fetch(&user_object_destroyed, *(int *)weight, __ATOMIC_SEQ_CST);
}

/* Node getters, kernel node attributes, symbol copy nodes and user objects (after
 * modules_kernels_symbols registered fake_symbol). */
static void graph_getters_and_user_objects(void) {
    unsigned char *out = NULL;
    cudaStream_t stream;
    cudaGraph_t graph = NULL;
    cudaGraphNode_t set_node, copy_node, host_node, unused;
    OK("getter output memory", cudaMalloc((void **)&out, N));
    OK("a stream", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    OK("a graph", cudaGraphCreate(&graph, 0));
    struct cudaMemsetParams set = {0};
    set.dst = out;
    set.value = 0x3c;
    set.elementSize = 1;
    set.width = 512;
    set.height = 1;
    OK("a memset node", cudaGraphAddMemsetNode(&set_node, graph, NULL, 0, &set));
    OK("a copy node", cudaGraphAddMemcpyNode1D(&copy_node, graph, &set_node, 1, out + 1024, out + 8, 256, cudaMemcpyDeviceToDevice));
    volatile int runs = 0;
    struct cudaHostNodeParams host = {count_host_call, (void *)&runs};
    OK("a host node", cudaGraphAddHostNode(&host_node, graph, &copy_node, 1, &host));

    AUDIT("cudaGraphMemsetNodeGetParams");
    struct cudaMemsetParams set_back;
    memset(&set_back, 0, sizeof set_back);
    OK("cudaGraphMemsetNodeGetParams", cudaGraphMemsetNodeGetParams(set_node, &set_back));
    EXPECT("the memset node reads back", set_back.dst == out && set_back.value == 0x3c && set_back.width == 512);
    EXPECT_CODE("a copy node is not a memset node", cudaGraphMemsetNodeGetParams(copy_node, &set_back), cudaErrorInvalidValue);
    AUDIT("cudaGraphMemcpyNodeGetParams");
    struct cudaMemcpy3DParms copy_back;
    memset(&copy_back, 0, sizeof copy_back);
    OK("cudaGraphMemcpyNodeGetParams", cudaGraphMemcpyNodeGetParams(copy_node, &copy_back));
    EXPECT("the copy node reads back",
           copy_back.srcPtr.ptr == out + 8 && copy_back.dstPtr.ptr == out + 1024 && copy_back.extent.width == 256 &&
               copy_back.extent.height == 1 && copy_back.kind == cudaMemcpyDefault);
    EXPECT_CODE("a NULL struct", cudaGraphMemcpyNodeGetParams(copy_node, NULL), cudaErrorInvalidValue);
    AUDIT("cudaGraphHostNodeGetParams");
    struct cudaHostNodeParams host_back = {NULL, NULL};
    OK("cudaGraphHostNodeGetParams", cudaGraphHostNodeGetParams(host_node, &host_back));
    EXPECT("the host node reads back", host_back.fn == count_host_call && host_back.userData == (void *)&runs);

    /* Kernel node attributes: the emulated device has no kernel nodes; events are refused. */
    cudaLaunchAttributeValue value;
    memset(&value, 0, sizeof value);
    AUDIT("cudaGraphKernelNodeGetAttribute");
    EXPECT_CODE("cudaGraphKernelNodeGetAttribute of a memset node",
                cudaGraphKernelNodeGetAttribute(set_node, cudaLaunchAttributePriority, &value), cudaErrorInvalidValue);
    AUDIT("cudaGraphKernelNodeSetAttribute");
    EXPECT_CODE("cudaGraphKernelNodeSetAttribute of a memset node",
                cudaGraphKernelNodeSetAttribute(set_node, cudaLaunchAttributePriority, &value), cudaErrorInvalidValue);
    EXPECT_CODE("an event attribute", cudaGraphKernelNodeSetAttribute(set_node, cudaLaunchAttributeProgrammaticEvent, &value),
                cudaErrorNotSupported);
    AUDIT("cudaGraphKernelNodeCopyAttributes");
    EXPECT_CODE("cudaGraphKernelNodeCopyAttributes between memset nodes", cudaGraphKernelNodeCopyAttributes(set_node, set_node),
                cudaErrorInvalidValue);

    /* Copy nodes to and from __device__ variables. */
    unsigned char *bytes = out;
#define GRAPH_SYMBOL_AUDIT(name, call_unknown, call_past_end, call_bad_kind, call_ok)                                   \
    AUDIT(name);                                                                                                        \
    EXPECT_CODE(name ": a variable never registered", call_unknown, cudaErrorInvalidSymbol);                             \
    EXPECT_CODE(name ": past the variable's end", call_past_end, cudaErrorInvalidValue);                                \
    EXPECT_CODE(name ": a direction symbols do not take", call_bad_kind, cudaErrorInvalidMemcpyDirection);              \
    EXPECT_CODE(name ": a variable the emulated device cannot load", call_ok, cudaErrorNotSupported)
    GRAPH_SYMBOL_AUDIT(
        "cudaGraphAddMemcpyNodeToSymbol",
        cudaGraphAddMemcpyNodeToSymbol(&unused, graph, NULL, 0, unregistered_symbol, bytes, 16, 0, cudaMemcpyDeviceToDevice),
        cudaGraphAddMemcpyNodeToSymbol(&unused, graph, NULL, 0, fake_symbol, bytes, 16, 60, cudaMemcpyDeviceToDevice),
        cudaGraphAddMemcpyNodeToSymbol(&unused, graph, NULL, 0, fake_symbol, bytes, 16, 0, cudaMemcpyDeviceToHost),
        cudaGraphAddMemcpyNodeToSymbol(&unused, graph, NULL, 0, fake_symbol, bytes, 16, 0, cudaMemcpyDeviceToDevice));
    GRAPH_SYMBOL_AUDIT(
        "cudaGraphAddMemcpyNodeFromSymbol",
        cudaGraphAddMemcpyNodeFromSymbol(&unused, graph, NULL, 0, bytes, unregistered_symbol, 16, 0, cudaMemcpyDeviceToDevice),
        cudaGraphAddMemcpyNodeFromSymbol(&unused, graph, NULL, 0, bytes, fake_symbol, 65, 0, cudaMemcpyDeviceToDevice),
        cudaGraphAddMemcpyNodeFromSymbol(&unused, graph, NULL, 0, bytes, fake_symbol, 16, 0, cudaMemcpyHostToDevice),
        cudaGraphAddMemcpyNodeFromSymbol(&unused, graph, NULL, 0, bytes, fake_symbol, 16, 0, cudaMemcpyDefault));
    GRAPH_SYMBOL_AUDIT("cudaGraphMemcpyNodeSetParamsToSymbol",
                       cudaGraphMemcpyNodeSetParamsToSymbol(copy_node, unregistered_symbol, bytes, 16, 0, cudaMemcpyDefault),
                       cudaGraphMemcpyNodeSetParamsToSymbol(copy_node, fake_symbol, bytes, 16, 49, cudaMemcpyDefault),
                       cudaGraphMemcpyNodeSetParamsToSymbol(copy_node, fake_symbol, bytes, 16, 0, cudaMemcpyHostToHost),
                       cudaGraphMemcpyNodeSetParamsToSymbol(copy_node, fake_symbol, bytes, 16, 0, cudaMemcpyDefault));
    GRAPH_SYMBOL_AUDIT("cudaGraphMemcpyNodeSetParamsFromSymbol",
                       cudaGraphMemcpyNodeSetParamsFromSymbol(copy_node, bytes, unregistered_symbol, 16, 0, cudaMemcpyDefault),
                       cudaGraphMemcpyNodeSetParamsFromSymbol(copy_node, bytes, fake_symbol, 16, 49, cudaMemcpyDefault),
                       cudaGraphMemcpyNodeSetParamsFromSymbol(copy_node, bytes, fake_symbol, 16, 0, cudaMemcpyHostToHost),
                       cudaGraphMemcpyNodeSetParamsFromSymbol(copy_node, bytes, fake_symbol, 16, 0, cudaMemcpyDefault));
    cudaGraphExec_t exec = NULL;
    OK("instantiate", cudaGraphInstantiate(&exec, graph, 0));
    GRAPH_SYMBOL_AUDIT(
        "cudaGraphExecMemcpyNodeSetParamsToSymbol",
        cudaGraphExecMemcpyNodeSetParamsToSymbol(exec, copy_node, unregistered_symbol, bytes, 16, 0, cudaMemcpyDefault),
        cudaGraphExecMemcpyNodeSetParamsToSymbol(exec, copy_node, fake_symbol, bytes, 16, 49, cudaMemcpyDefault),
        cudaGraphExecMemcpyNodeSetParamsToSymbol(exec, copy_node, fake_symbol, bytes, 16, 0, cudaMemcpyDeviceToHost),
        cudaGraphExecMemcpyNodeSetParamsToSymbol(exec, copy_node, fake_symbol, bytes, 16, 0, cudaMemcpyDefault));
    GRAPH_SYMBOL_AUDIT(
        "cudaGraphExecMemcpyNodeSetParamsFromSymbol",
        cudaGraphExecMemcpyNodeSetParamsFromSymbol(exec, copy_node, bytes, unregistered_symbol, 16, 0, cudaMemcpyDefault),
        cudaGraphExecMemcpyNodeSetParamsFromSymbol(exec, copy_node, bytes, fake_symbol, 16, 49, cudaMemcpyDefault),
        cudaGraphExecMemcpyNodeSetParamsFromSymbol(exec, copy_node, bytes, fake_symbol, 16, 0, cudaMemcpyHostToDevice),
        cudaGraphExecMemcpyNodeSetParamsFromSymbol(exec, copy_node, bytes, fake_symbol, 16, 0, cudaMemcpyDefault));

    /* User objects: the destructor runs once, after the app, the graph, the executable graph and
     * its launch let go. */
    int weight = 1;
    cudaUserObject_t object = NULL;
    AUDIT("cudaUserObjectCreate");
    EXPECT_CODE("cudaUserObjectCreate without the required flag", cudaUserObjectCreate(&object, &weight, user_object_destroy, 1, 0),
                cudaErrorInvalidValue);
    OK("cudaUserObjectCreate", cudaUserObjectCreate(&object, &weight, user_object_destroy, 1, cudaUserObjectNoDestructorSync));
    AUDIT("cudaGraphRetainUserObject");
    OK("cudaGraphRetainUserObject", cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove));
    EXPECT_CODE("cudaGraphRetainUserObject with unknown flags", cudaGraphRetainUserObject(graph, object, 1, 8), cudaErrorInvalidValue);
    AUDIT("cudaGraphReleaseUserObject");
    EXPECT_CODE("cudaGraphReleaseUserObject of more than the graph holds", cudaGraphReleaseUserObject(graph, object, 2),
                cudaErrorInvalidValue);
    AUDIT("cudaUserObjectRetain");
    OK("cudaUserObjectRetain", cudaUserObjectRetain(object, 1));
    AUDIT("cudaUserObjectRelease");
    OK("cudaUserObjectRelease", cudaUserObjectRelease(object, 1));
    OK("destroy the exec", cudaGraphExecDestroy(exec));
    OK("instantiate again", cudaGraphInstantiate(&exec, graph, 0));
    OK("launch", cudaGraphLaunch(exec, stream));
    OK("destroy the graph", cudaGraphDestroy(graph));
    OK("destroy the exec", cudaGraphExecDestroy(exec));
    OK("synchronize", cudaStreamSynchronize(stream));
    for (int i = 0; i < 1000 && __atomic_load_n(&user_object_destroyed, __ATOMIC_SEQ_CST) < 1; i++) sleep_ms(1);
    sleep_ms(20);
    EXPECT("the destructor ran once", __atomic_load_n(&user_object_destroyed, __ATOMIC_SEQ_CST) == 1 && runs == 1);
    EXPECT_CODE("released after it was destroyed", cudaUserObjectRelease(object, 1), cudaErrorInvalidValue);
    OK("destroy the stream", cudaStreamDestroy(stream));
    OK("free the output", cudaFree(out));
}

/* Driver entry points through Flyt's libcuda.so.1, kernels by symbol, per-device kernel
 * attributes (the emulated device loads no kernel, so the calls that need one say so). */
static void entry_points_and_kernels(void) {
    void *legacy = NULL, *per_thread = NULL, *fn = NULL;
    enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    AUDIT("cudaGetDriverEntryPoint");
    OK("cudaGetDriverEntryPoint", cudaGetDriverEntryPoint("cuMemcpyAsync", &legacy, cudaEnableDefault, &status));
    EXPECT("a driver function found", legacy != NULL && status == cudaDriverEntryPointSuccess);
    OK("an unknown name", cudaGetDriverEntryPoint("cuNoSuchFunction", &fn, cudaEnableDefault, &status));
    EXPECT("an unknown name: NULL and not found", fn == NULL && status == cudaDriverEntryPointSymbolNotFound);
    EXPECT_CODE("no name", cudaGetDriverEntryPoint(NULL, &fn, cudaEnableDefault, &status), cudaErrorInvalidValue);
    AUDIT("cudaGetDriverEntryPoint_ptsz");
    OK("cudaGetDriverEntryPoint_ptsz", cudaGetDriverEntryPoint_ptsz("cuMemcpyAsync", &per_thread, cudaEnableDefault, NULL));
    EXPECT("the per-thread default is another function", per_thread != NULL && per_thread != legacy);
    AUDIT("cudaGetDriverEntryPointByVersion");
    OK("cudaGetDriverEntryPointByVersion",
       cudaGetDriverEntryPointByVersion("cuMemcpyAsync", &fn, 13000, cudaEnablePerThreadDefaultStream, &status));
    EXPECT("per-thread by version", fn == per_thread && status == cudaDriverEntryPointSuccess);
    OK("a version before the function",
       cudaGetDriverEntryPointByVersion("cuStreamBeginCaptureToGraph", &fn, 12000, cudaEnableDefault, &status));
    EXPECT("a version before the function: not sufficient", fn == NULL && status == cudaDriverEntryPointVersionNotSufficent);
    AUDIT("cudaGetDriverEntryPointByVersion_ptsz");
    OK("cudaGetDriverEntryPointByVersion_ptsz",
       cudaGetDriverEntryPointByVersion_ptsz("cuMemcpyAsync", &fn, 13000, cudaEnableLegacyStream, &status));
    EXPECT("legacy asked by the per-thread entry", fn == legacy);

    cudaFunction_t function = NULL;
    AUDIT("cudaGetFuncBySymbol");
    EXPECT_CODE("a function that is no kernel", cudaGetFuncBySymbol(&function, (const void *)not_a_kernel),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("a kernel the emulated device cannot load", cudaGetFuncBySymbol(&function, (const void *)fake_kernel),
                cudaErrorNotSupported);
    cudaKernel_t kernel = NULL;
    AUDIT("cudaGetKernel");
    EXPECT_CODE("the kernel of a function that is no kernel", cudaGetKernel(&kernel, (const void *)not_a_kernel),
                cudaErrorInvalidDeviceFunction);
    OK("cudaGetKernel", cudaGetKernel(&kernel, (const void *)fake_kernel));
    EXPECT("a kernel handle", kernel != NULL);
    size_t smem = 0;
    AUDIT("cudaOccupancyAvailableDynamicSMemPerBlock");
    EXPECT_CODE("into NULL", cudaOccupancyAvailableDynamicSMemPerBlock(NULL, (const void *)fake_kernel, 1, 128), cudaErrorInvalidValue);
    EXPECT_CODE("of a function that is no kernel",
                cudaOccupancyAvailableDynamicSMemPerBlock(&smem, (const void *)not_a_kernel, 1, 128), cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("of a kernel the emulated device cannot load",
                cudaOccupancyAvailableDynamicSMemPerBlock(&smem, (const void *)fake_kernel, 1, 128), cudaErrorNotSupported);
    AUDIT("cudaKernelSetAttributeForDevice");
    EXPECT_CODE("an unknown kernel handle",
                cudaKernelSetAttributeForDevice((cudaKernel_t)0x7777, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024, 0),
                cudaErrorInvalidDeviceFunction);
    EXPECT_CODE("an attribute that cannot be set", cudaKernelSetAttributeForDevice(kernel, (enum cudaFuncAttribute)0, 1, 0),
                cudaErrorInvalidValue);
    EXPECT_CODE("a kernel the emulated device cannot load",
                cudaKernelSetAttributeForDevice(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024, 0), cudaErrorNotSupported);
}

int main(void) {
    device_and_errors();
    peers_and_queries();
    memory();
    managed_memory();
    streams_and_events();
    graphs();
    graph_node_kinds();
    pools();
    capture_to_graph();
    pitched_memory();
    arrays();
    modules_kernels_symbols();
    graph_getters_and_user_objects();
    entry_points_and_kernels();
    reset();
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

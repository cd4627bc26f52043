// Built with nvcc's default (static) CUDA runtime: NVIDIA's own runtime, linked into this program,
// finds the driver library by name. Run over Flyt's libcuda.so.1 it must see the server's device
// and move bytes through it. The emulated device in CI runs no kernels: the one launch here must
// fail at the call with the error the server gave for the module, and the session must go on.
// Compiled as plain C++ (no nvcc: CI links CUDA 12.9's static runtime this way) it has no kernel.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#ifdef __CUDACC__
__global__ void fill(unsigned char *out, unsigned char value) { out[threadIdx.x] = value; }
#endif
#define CHECK(call, expected)                                                                        \
    do {                                                                                             \
        cudaError_t got_ = (call);                                                                   \
        if (got_ != (expected)) {                                                                    \
            printf("FAIL %s:%d %s: %s (%d), expected %d\n", __FILE__, __LINE__, #call,              \
                   cudaGetErrorName(got_), (int)got_, (int)(expected));                              \
            failures++;                                                                              \
        }                                                                                            \
    } while (0)

// A thread's first CUDA call asks what two pointers are (PyTorch's pin-memory thread does this
// before anything else): no context is current on it yet, and the answer must not need one.
struct Pointers {
    void *pinned, *device;
    int ok;
};
static void *ask_from_a_new_thread(void *arg) {
    struct Pointers *pointers = (struct Pointers *)arg;
    cudaPointerAttributes host_attributes, device_attributes;
    cudaError_t host_asked = cudaPointerGetAttributes(&host_attributes, pointers->pinned);
    cudaError_t device_asked = cudaPointerGetAttributes(&device_attributes, pointers->device);
    pointers->ok = host_asked == cudaSuccess && host_attributes.type == cudaMemoryTypeHost && device_asked == cudaSuccess &&
                   device_attributes.type == cudaMemoryTypeDevice && device_attributes.device == 0;
    if (!pointers->ok)
        printf("FAIL new thread: pointer attributes %s type %d, %s type %d\n", cudaGetErrorName(host_asked),
               (int)host_attributes.type, cudaGetErrorName(device_asked), (int)device_attributes.type);
    void *more = NULL;
    if (cudaHostAlloc(&more, 4096, cudaHostAllocDefault) != cudaSuccess || cudaFreeHost(more) != cudaSuccess) pointers->ok = 0;
    return NULL;
}

// Host functions run in stream order in this process; the driver permits no CUDA call there.
static volatile int host_runs = 0;
static cudaError_t call_inside = cudaSuccess;
static void CUDART_CB count_run(void *counter) {
    int device = -1;
    call_inside = cudaGetDevice(&device);
    (*(volatile int *)counter)++;
}
static void CUDART_CB count_callback(cudaStream_t stream, cudaError_t status, void *counter) {
    (void)stream;
    if (status == cudaSuccess) (*(volatile int *)counter)++;
}

int main(void) {
    int count = -1;
    CHECK(cudaGetDeviceCount(&count), cudaSuccess);
    printf("devices: %d\n", count);
    if (count < 1) {
        printf("FAILED: no device\n");
        return 1;
    }
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    CHECK(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    printf("device 0: %s, compute %d.%d, %zu MiB\n", prop.name, prop.major, prop.minor, prop.totalGlobalMem >> 20);
    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver), cudaSuccess);
    CHECK(cudaRuntimeGetVersion(&runtime), cudaSuccess);
    printf("driver %d runtime %d\n", driver, runtime);

    const size_t n = 1 << 20;
    unsigned char *host = (unsigned char *)malloc(n), *back = (unsigned char *)malloc(n);
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i * 7 + 3);
    unsigned char *dev = NULL, *dev2 = NULL;
    CHECK(cudaMalloc((void **)&dev, n), cudaSuccess);
    CHECK(cudaMalloc((void **)&dev2, n), cudaSuccess);
    size_t free_mem = 0, total_mem = 0;
    CHECK(cudaMemGetInfo(&free_mem, &total_mem), cudaSuccess);
    printf("memory: total %zu MiB, free below total: %s\n", total_mem >> 20, free_mem < total_mem ? "yes" : "no");

    CHECK(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK(cudaMemcpy(dev2, dev, n, cudaMemcpyDeviceToDevice), cudaSuccess);
    CHECK(cudaMemcpy(back, dev2, n, cudaMemcpyDeviceToHost), cudaSuccess);
    printf("round trip: %s\n", memcmp(host, back, n) == 0 ? "equal" : "DIFFERENT");
    if (memcmp(host, back, n) != 0) failures++;

    CHECK(cudaMemset(dev, 0x5a, n / 2), cudaSuccess);
    CHECK(cudaMemcpy(back, dev, n, cudaMemcpyDefault), cudaSuccess);
    int memset_ok = 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char want = i < n / 2 ? 0x5a : (unsigned char)(i * 7 + 3);
        if (back[i] != want) { memset_ok = 0; break; }
    }
    printf("memset: %s\n", memset_ok ? "ok" : "WRONG");
    if (!memset_ok) failures++;

    // Streams and events, with pinned memory and asynchronous copies.
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start), cudaSuccess);
    CHECK(cudaEventCreate(&stop), cudaSuccess);
    unsigned char *pinned = NULL;
    CHECK(cudaMallocHost((void **)&pinned, n), cudaSuccess);
    memset(pinned, 0, n);
    CHECK(cudaEventRecord(start, stream), cudaSuccess);
    CHECK(cudaMemcpyAsync(dev2, host, n, cudaMemcpyHostToDevice, stream), cudaSuccess);
    CHECK(cudaMemsetAsync(dev2, 0x11, 16, stream), cudaSuccess);
    CHECK(cudaMemcpyAsync(pinned, dev2, n, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    CHECK(cudaEventRecord(stop, stream), cudaSuccess);
    CHECK(cudaStreamSynchronize(stream), cudaSuccess);
    CHECK(cudaEventSynchronize(stop), cudaSuccess);
    CHECK(cudaEventQuery(stop), cudaSuccess);
    CHECK(cudaStreamQuery(stream), cudaSuccess);
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    int async_ok = pinned[0] == 0x11 && pinned[15] == 0x11 && memcmp(pinned + 16, host + 16, n - 16) == 0;
    printf("async copies: %s, elapsed time %s\n", async_ok ? "ok" : "WRONG", ms >= 0.0f ? "measured" : "MISSING");
    if (!async_ok) failures++;
    CHECK(cudaStreamWaitEvent(stream, stop, 0), cudaSuccess);
    CHECK(cudaDeviceSynchronize(), cudaSuccess);

    // A pointer that is no allocation is refused, and the session goes on.
    CHECK(cudaMemcpy(back, (void *)0x10, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(cudaMemcpy(back, dev, 16, cudaMemcpyDeviceToHost), cudaSuccess);

    // Graphs without kernels (the emulated device runs none): a captured memset and copy, and an
    // explicit graph with a memset and a host node; host functions in stream order.
    {
        cudaGraph_t captured = NULL;
        cudaStreamCaptureStatus during = cudaStreamCaptureStatusNone, after = cudaStreamCaptureStatusActive;
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
        CHECK(cudaStreamIsCapturing(stream, &during), cudaSuccess);
        CHECK(cudaMemsetAsync(dev, 0x42, 4096, stream), cudaSuccess);
        CHECK(cudaMemcpyAsync(dev2, dev, 4096, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
        CHECK(cudaStreamEndCapture(stream, &captured), cudaSuccess);
        CHECK(cudaStreamIsCapturing(stream, &after), cudaSuccess);
        size_t nodes = 0;
        CHECK(cudaGraphGetNodes(captured, NULL, &nodes), cudaSuccess);
        CHECK(cudaMemset(dev2, 0, 4096), cudaSuccess);
        cudaGraphExec_t exec = NULL;
        CHECK(cudaGraphInstantiate(&exec, captured, 0), cudaSuccess);
        CHECK(cudaGraphLaunch(exec, stream), cudaSuccess);
        CHECK(cudaStreamSynchronize(stream), cudaSuccess);
        CHECK(cudaMemcpy(back, dev2, 4096, cudaMemcpyDeviceToHost), cudaSuccess);
        int seen = during == cudaStreamCaptureStatusActive && after == cudaStreamCaptureStatusNone;
        int replayed = back[0] == 0x42 && back[4095] == 0x42;
        printf("captured graph: %s, %zu nodes, %s\n", seen ? "capture seen" : "CAPTURE STATUS WRONG", nodes, replayed ? "replayed" : "NOT REPLAYED");
        if (!seen || nodes != 2 || !replayed) failures++;
        CHECK(cudaGraphExecDestroy(exec), cudaSuccess);
        CHECK(cudaGraphDestroy(captured), cudaSuccess);

        cudaGraph_t built = NULL;
        CHECK(cudaGraphCreate(&built, 0), cudaSuccess);
        cudaGraphNode_t set = NULL, run = NULL;
        cudaMemsetParams memset_params;
        memset(&memset_params, 0, sizeof memset_params);
        memset_params.dst = dev;
        memset_params.value = 0x24;
        memset_params.elementSize = 1;
        memset_params.width = 4096;
        memset_params.height = 1;
        CHECK(cudaGraphAddMemsetNode(&set, built, NULL, 0, &memset_params), cudaSuccess);
        cudaHostNodeParams host_params = {count_run, (void *)&host_runs};
        CHECK(cudaGraphAddHostNode(&run, built, &set, 1, &host_params), cudaSuccess);
        CHECK(cudaGraphInstantiate(&exec, built, 0), cudaSuccess);
        for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(exec, stream), cudaSuccess);
        CHECK(cudaLaunchHostFunc(stream, count_run, (void *)&host_runs), cudaSuccess);
        CHECK(cudaStreamAddCallback(stream, count_callback, (void *)&host_runs, 0), cudaSuccess);
        CHECK(cudaStreamSynchronize(stream), cudaSuccess);
        CHECK(cudaMemcpy(back, dev, 16, cudaMemcpyDeviceToHost), cudaSuccess);
        printf("host functions: ran %d of 5 times, memset node %s\n", host_runs, back[0] == 0x24 ? "ran" : "DID NOT RUN");
        printf("CUDA call in a host function: %s\n", cudaGetErrorName(call_inside));
        if (host_runs != 5 || back[0] != 0x24) failures++;
        CHECK(cudaGraphExecDestroy(exec), cudaSuccess);
        CHECK(cudaGraphDestroy(built), cudaSuccess);
    }

    // Stream-ordered allocation from the default pool and from a pool of the program's own.
    {
        int pools = 0;
        CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0), cudaSuccess);
        cudaMemPool_t pool = NULL, mine = NULL;
        CHECK(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
        unsigned long long threshold = 1ull << 30, read = 0;
        CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), cudaSuccess);
        CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &read), cudaSuccess);
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        CHECK(cudaMemPoolCreate(&mine, &props), cudaSuccess);
        unsigned char *a = NULL, *b = NULL;
        CHECK(cudaMallocAsync((void **)&a, 4096, stream), cudaSuccess);
        CHECK(cudaMallocFromPoolAsync((void **)&b, 4096, mine, stream), cudaSuccess);
        CHECK(cudaMemsetAsync(b, 0x2b, 4096, stream), cudaSuccess);
        CHECK(cudaMemcpyAsync(a, b, 4096, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
        CHECK(cudaStreamSynchronize(stream), cudaSuccess);
        CHECK(cudaMemcpy(back, a, 4096, cudaMemcpyDeviceToHost), cudaSuccess);
        int ok = pools == 1 && read == threshold && back[0] == 0x2b && back[4095] == 0x2b;
        CHECK(cudaFreeAsync(a, stream), cudaSuccess);
        CHECK(cudaFreeAsync(b, stream), cudaSuccess);
        CHECK(cudaStreamSynchronize(stream), cudaSuccess);
        CHECK(cudaMemPoolTrimTo(mine, 0), cudaSuccess);
        CHECK(cudaMemPoolDestroy(mine), cudaSuccess);
        printf("stream-ordered allocation: %s\n", ok ? "ok" : "WRONG");
        if (!ok) failures++;
    }

    // Managed memory through NVIDIA's runtime (cuMemAllocManaged underneath): shared pages with
    // the channel, mirrored device memory without it; the same answers either way.
    {
        const size_t m_len = 10000;  // no page multiple
        unsigned char *m = NULL, *d = NULL, *out = (unsigned char *)malloc(m_len);
        CHECK(cudaMallocManaged((void **)&m, m_len, cudaMemAttachGlobal), cudaSuccess);
        CHECK(cudaMalloc((void **)&d, m_len), cudaSuccess);
        for (size_t i = 0; i < m_len; i++) m[i] = (unsigned char)(i * 3);
        CHECK(cudaMemsetAsync(m + 5000, 0x7e, 100, stream), cudaSuccess);
        struct cudaMemLocation cpu;
        memset(&cpu, 0, sizeof cpu);
        cpu.type = cudaMemLocationTypeHost;
        CHECK(cudaMemPrefetchAsync(m, m_len, cpu, 0, stream), cudaSuccess);
        CHECK(cudaStreamSynchronize(stream), cudaSuccess);
        int ok = m[4999] == (unsigned char)(4999 * 3) && m[5000] == 0x7e && m[5099] == 0x7e && m[5100] == (unsigned char)(5100 * 3);
        m[9999] = 0x55;
        CHECK(cudaMemcpy(d, m, m_len, cudaMemcpyDefault), cudaSuccess);
        CHECK(cudaMemcpy(out, d, m_len, cudaMemcpyDeviceToHost), cudaSuccess);
        ok &= memcmp(out, m, m_len) == 0 && out[9999] == 0x55;
        CHECK(cudaMemset(d, 0x11, m_len), cudaSuccess);
        CHECK(cudaMemcpy(m, d, 64, cudaMemcpyDeviceToDevice), cudaSuccess);
        ok &= m[0] == 0x11 && m[63] == 0x11 && m[64] == (unsigned char)(64 * 3);
        struct cudaPointerAttributes managed_attributes;
        CHECK(cudaPointerGetAttributes(&managed_attributes, m + 7), cudaSuccess);
        ok &= managed_attributes.type == cudaMemoryTypeManaged && managed_attributes.devicePointer == m + 7;
        CHECK(cudaFree(m), cudaSuccess);
        CHECK(cudaFree(d), cudaSuccess);
        free(out);
        printf("managed memory: %s\n", ok ? "ok" : "WRONG");
        if (!ok) failures++;
    }

    // NVIDIA's runtime loaded this program's fat binary through cuLibraryLoadData; the kernel is
    // looked up at its first launch, where the emulated device's refusal must surface.
#ifdef __CUDACC__
    fill<<<1, 32>>>(dev, 7);
    cudaError_t launched = cudaGetLastError();
    printf("kernel launch: %s\n", launched == cudaSuccess ? "SUCCEEDED on a device without GPU code" : "refused");
    if (launched == cudaSuccess) failures++;
#else
    printf("kernel launch: none (built without nvcc)\n");
#endif
    CHECK(cudaMemcpy(back, dev, 16, cudaMemcpyDeviceToHost), cudaSuccess);

    struct Pointers pointers = {pinned, dev, 0};
    pthread_t asker;
    if (pthread_create(&asker, NULL, ask_from_a_new_thread, &pointers) != 0 || pthread_join(asker, NULL) != 0) pointers.ok = 0;
    printf("new thread: pointer attributes %s\n", pointers.ok ? "ok" : "WRONG");
    if (!pointers.ok) failures++;

    CHECK(cudaEventDestroy(start), cudaSuccess);
    CHECK(cudaEventDestroy(stop), cudaSuccess);
    CHECK(cudaStreamDestroy(stream), cudaSuccess);
    CHECK(cudaFreeHost(pinned), cudaSuccess);
    CHECK(cudaFree(dev), cudaSuccess);
    CHECK(cudaFree(dev2), cudaSuccess);
    free(host);
    free(back);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

/* Drives libcudart.so.13 (the Flyt shim) against a flyt-rpc-server on the emulated device, as an
 * unmodified C program built against the real CUDA 13 headers would. Every check can fail; the
 * program prints one line per check and exits 1 if any failed. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_expect.h"

#define EXPECT_CODE(what, call, code)                                                              \
    do {                                                                                           \
        cudaError_t got_ = (call);                                                                 \
        if (got_ == (code)) {                                                                      \
            printf("ok: %s -> %s\n", what, cudaGetErrorName(got_));                                \
        } else {                                                                                   \
            printf("FAILED: %s -> %s, expected %s (line %d)\n", what, cudaGetErrorName(got_),      \
                   cudaGetErrorName(code), __LINE__);                                              \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31u + seed);
}

struct worker { int id; int ok; };

/* Each thread owns a stream and a buffer and round-trips data through the device. */
static void *thread_main(void *arg) {
    struct worker *w = arg;
    size_t n = (1 << 20) + 17 * (size_t)w->id;
    unsigned char *host = malloc(n), *back = malloc(n);
    void *dev = NULL;
    cudaStream_t s;
    w->ok = 1;
    fill(host, n, (unsigned)w->id);
    for (int round = 0; round < 20 && w->ok; round++) {
        if (cudaStreamCreate(&s) != cudaSuccess || cudaMalloc(&dev, n) != cudaSuccess) { w->ok = 0; break; }
        memset(back, 0, n);
        if (cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s) != cudaSuccess) w->ok = 0;
        if (cudaMemcpyAsync(back, dev, n, cudaMemcpyDeviceToHost, s) != cudaSuccess) w->ok = 0;
        if (cudaStreamSynchronize(s) != cudaSuccess) w->ok = 0;
        if (memcmp(host, back, n) != 0) w->ok = 0;
        if (cudaFree(dev) != cudaSuccess || cudaStreamDestroy(s) != cudaSuccess) w->ok = 0;
    }
    free(host);
    free(back);
    return NULL;
}

int main(void) {
    /* device */
    int count = -1, device = -1, version = 0;
    EXPECT_CODE("cudaGetDeviceCount", cudaGetDeviceCount(&count), cudaSuccess);
    EXPECT("one device", count == 1);
    if (count != 1) {
        printf("FAILED: no session, nothing else to check\n");
        return 1;
    }
    EXPECT_CODE("cudaGetDevice", cudaGetDevice(&device), cudaSuccess);
    EXPECT("device 0", device == 0);
    EXPECT_CODE("cudaSetDevice(1)", cudaSetDevice(1), cudaErrorInvalidDevice);
    EXPECT_CODE("last error after a bad cudaSetDevice", cudaGetLastError(), cudaErrorInvalidDevice);
    EXPECT_CODE("last error is cleared", cudaGetLastError(), cudaSuccess);
    EXPECT_CODE("cudaRuntimeGetVersion", cudaRuntimeGetVersion(&version), cudaSuccess);
    EXPECT("runtime 13.0", version == 13000);
    struct cudaDeviceProp prop;
    memset(&prop, 0xff, sizeof prop);
    EXPECT_CODE("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    int sms = 0, major = 0, warp = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&warp, cudaDevAttrWarpSize, 0);
    EXPECT("properties agree with attributes (CUDA 13 layout)",
           prop.multiProcessorCount == sms && prop.major == major && prop.warpSize == warp && sms > 0);
    EXPECT("the emulated device says what it is", strstr(prop.name, "Emulated") != NULL);
    size_t free_mem = 0, total_mem = 0;
    EXPECT_CODE("cudaMemGetInfo", cudaMemGetInfo(&free_mem, &total_mem), cudaSuccess);
    EXPECT("memory matches totalGlobalMem", total_mem == prop.totalGlobalMem && free_mem <= total_mem);

    /* memory and copies in every direction */
    size_t n = 3 * (4 << 20) + 12345; /* several server chunks and a ragged tail */
    unsigned char *host = malloc(n), *back = malloc(n);
    fill(host, n, 7);
    void *dev = NULL, *dev2 = NULL;
    EXPECT_CODE("cudaMalloc", cudaMalloc(&dev, n), cudaSuccess);
    EXPECT_CODE("cudaMalloc second", cudaMalloc(&dev2, n), cudaSuccess);
    EXPECT_CODE("H2D", cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_CODE("D2D", cudaMemcpy(dev2, dev, n, cudaMemcpyDeviceToDevice), cudaSuccess);
    memset(back, 0, n);
    EXPECT_CODE("D2H", cudaMemcpy(back, dev2, n, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT("round trip is byte-exact", memcmp(host, back, n) == 0);
    EXPECT_CODE("memset", cudaMemset((char *)dev + 100, 0xab, 1000), cudaSuccess);
    unsigned char probe[1200];
    EXPECT_CODE("D2H with cudaMemcpyDefault", cudaMemcpy(probe, (char *)dev + 50, sizeof probe, cudaMemcpyDefault), cudaSuccess);
    EXPECT("memset landed exactly", probe[49] == host[99] && probe[50] == 0xab && probe[1049] == 0xab && probe[1050] == host[1100]);
    EXPECT_CODE("H2H", cudaMemcpy(back, host, 64, cudaMemcpyHostToHost), cudaSuccess);

    /* bad pointers and ranges never reach the device */
    EXPECT_CODE("copy past the end", cudaMemcpy(back, (char *)dev + n - 10, 11, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    EXPECT_CODE("copy to a never-allocated address", cudaMemcpy((void *)0x1000, host, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_CODE("memset past the end", cudaMemset((char *)dev + n - 1, 0, 2), cudaErrorInvalidValue);
    EXPECT_CODE("invalid copy kind", cudaMemcpy(back, dev, 16, (enum cudaMemcpyKind)42), cudaErrorInvalidMemcpyDirection);
    EXPECT_CODE("free of an interior pointer", cudaFree((char *)dev + 1), cudaErrorInvalidValue);
    EXPECT_CODE("cudaFree(NULL)", cudaFree(NULL), cudaSuccess);

    /* pinned memory, streams, events */
    unsigned char *pinned = NULL, *pinned2 = NULL;
    EXPECT_CODE("cudaMallocHost", cudaMallocHost((void **)&pinned, n), cudaSuccess);
    EXPECT_CODE("cudaHostAlloc", cudaHostAlloc((void **)&pinned2, 4096, cudaHostAllocPortable), cudaSuccess);
    EXPECT("pinned memory is page aligned", ((size_t)pinned & 4095) == 0);
    struct cudaPointerAttributes attributes;
    EXPECT_CODE("attributes of device memory", cudaPointerGetAttributes(&attributes, (char *)dev + 5), cudaSuccess);
    EXPECT("device memory is device memory", attributes.type == cudaMemoryTypeDevice);
    EXPECT_CODE("attributes of pinned memory", cudaPointerGetAttributes(&attributes, pinned), cudaSuccess);
    EXPECT("pinned memory is host memory", attributes.type == cudaMemoryTypeHost);
    EXPECT_CODE("attributes of pageable memory", cudaPointerGetAttributes(&attributes, host), cudaSuccess);
    EXPECT("pageable memory is unregistered", attributes.type == cudaMemoryTypeUnregistered);

    cudaStream_t stream;
    cudaEvent_t start, stop;
    EXPECT_CODE("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    unsigned flags = 0;
    EXPECT_CODE("cudaStreamGetFlags", cudaStreamGetFlags(stream, &flags), cudaSuccess);
    EXPECT("stream flags kept", flags == cudaStreamNonBlocking);
    int least = 1, greatest = 1, priority = 1;
    cudaStream_t urgent;
    EXPECT_CODE("cudaDeviceGetStreamPriorityRange", cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
    EXPECT("priorities run from least to greatest", greatest <= least);
    EXPECT_CODE("stream with a priority beyond the range", cudaStreamCreateWithPriority(&urgent, 0, greatest - 100), cudaSuccess);
    EXPECT_CODE("cudaStreamGetPriority", cudaStreamGetPriority(urgent, &priority), cudaSuccess);
    EXPECT("the priority is clamped to the range", priority == greatest);
    EXPECT_CODE("cudaStreamDestroy urgent", cudaStreamDestroy(urgent), cudaSuccess);
    EXPECT_CODE("cudaEventCreate", cudaEventCreate(&start), cudaSuccess);
    EXPECT_CODE("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&stop, cudaEventBlockingSync), cudaSuccess);
    EXPECT_CODE("cudaEventRecord", cudaEventRecord(start, stream), cudaSuccess);
    fill(pinned, n, 9);
    EXPECT_CODE("async H2D from pinned", cudaMemcpyAsync(dev, pinned, n, cudaMemcpyHostToDevice, stream), cudaSuccess);
    EXPECT_CODE("async memset", cudaMemsetAsync(dev2, 0x5a, n, stream), cudaSuccess);
    memset(back, 0, n);
    EXPECT_CODE("async D2H", cudaMemcpyAsync(back, dev, n, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    EXPECT_CODE("cudaEventRecord stop", cudaEventRecord(stop, stream), cudaSuccess);
    EXPECT_CODE("cudaStreamWaitEvent", cudaStreamWaitEvent(0, stop, 0), cudaSuccess);
    EXPECT_CODE("cudaEventSynchronize", cudaEventSynchronize(stop), cudaSuccess);
    EXPECT("async D2H landed by the sync point", memcmp(back, pinned, n) == 0);
    EXPECT_CODE("cudaEventQuery", cudaEventQuery(stop), cudaSuccess);
    EXPECT_CODE("cudaStreamQuery", cudaStreamQuery(stream), cudaSuccess);
    float ms = -1;
    EXPECT_CODE("cudaEventElapsedTime", cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    EXPECT("elapsed time is not negative", ms >= 0);
    EXPECT_CODE("cudaEventDestroy", cudaEventDestroy(start), cudaSuccess);
    EXPECT_CODE("destroyed event is invalid", cudaEventRecord(start, stream), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("cudaStreamDestroy", cudaStreamDestroy(stream), cudaSuccess);
    EXPECT_CODE("destroyed stream is invalid", cudaStreamSynchronize(stream), cudaErrorInvalidResourceHandle);
    EXPECT_CODE("per-thread default stream", cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    EXPECT_CODE("cudaDeviceSynchronize", cudaDeviceSynchronize(), cudaSuccess);

    /* two threads at once */
    pthread_t threads[2];
    struct worker workers[2] = {{1, 0}, {2, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, thread_main, &workers[i]);
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    EXPECT("two threads copied concurrently", workers[0].ok && workers[1].ok);

    /* errors: names, messages, unsupported calls */
    EXPECT("cudaGetErrorName", strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0);
    EXPECT("cudaGetErrorString", strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
    EXPECT("unknown codes", strcmp(cudaGetErrorName((cudaError_t)123456), "unrecognized error code") == 0);
    cudaExternalMemory_t external = NULL;
    struct cudaExternalMemoryHandleDesc external_desc;
    memset(&external_desc, 0, sizeof external_desc);
    EXPECT_CODE("an unsupported call says so", cudaImportExternalMemory(&external, &external_desc), cudaErrorNotSupported);
    EXPECT_CODE("peek keeps the error", cudaPeekAtLastError(), cudaErrorNotSupported);
    EXPECT_CODE("get returns and clears it", cudaGetLastError(), cudaErrorNotSupported);
    void *huge = NULL;
    EXPECT_CODE("allocation beyond the device", cudaMalloc(&huge, (size_t)1 << 50), cudaErrorMemoryAllocation);

    /* app memory registered with cudaHostRegister */
    unsigned char *mine = malloc(1 << 20);
    unsigned mine_flags = 0;
    EXPECT_CODE("cudaHostRegister", cudaHostRegister(mine, 1 << 20, cudaHostRegisterPortable), cudaSuccess);
    EXPECT_CODE("registering it twice", cudaHostRegister(mine + 4096, 4096, 0), cudaErrorHostMemoryAlreadyRegistered);
    EXPECT_CODE("cudaHostGetFlags", cudaHostGetFlags(&mine_flags, mine + 100), cudaSuccess);
    EXPECT("flags kept", mine_flags == cudaHostRegisterPortable);
    EXPECT_CODE("attributes of registered memory", cudaPointerGetAttributes(&attributes, mine + 10), cudaSuccess);
    EXPECT("registered memory is host memory", attributes.type == cudaMemoryTypeHost);
    fill(mine, 1 << 20, 3);
    EXPECT_CODE("H2D from registered memory", cudaMemcpyAsync(dev, mine, 1 << 20, cudaMemcpyHostToDevice, 0), cudaSuccess);
    memset(back, 0, 1 << 20);
    EXPECT_CODE("D2H back", cudaMemcpy(back, dev, 1 << 20, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT("registered memory round trip", memcmp(mine, back, 1 << 20) == 0);
    EXPECT_CODE("cudaFreeHost of registered memory", cudaFreeHost(mine), cudaErrorInvalidValue);
    EXPECT_CODE("cudaHostUnregister", cudaHostUnregister(mine), cudaSuccess);
    EXPECT_CODE("cudaHostUnregister again", cudaHostUnregister(mine), cudaErrorHostMemoryNotRegistered);
    free(mine);

    EXPECT_CODE("cudaFreeHost", cudaFreeHost(pinned), cudaSuccess);
    EXPECT_CODE("cudaFreeHost of a non-pinned pointer", cudaFreeHost(host), cudaErrorInvalidValue);
    EXPECT_CODE("cudaFreeHost second", cudaFreeHost(pinned2), cudaSuccess);
    EXPECT_CODE("cudaFree", cudaFree(dev), cudaSuccess);
    EXPECT_CODE("double free", cudaFree(dev), cudaErrorInvalidValue);
    EXPECT_CODE("cudaFree second", cudaFree(dev2), cudaSuccess);
    EXPECT_CODE("cudaDeviceReset", cudaDeviceReset(), cudaSuccess);
    free(host);
    free(back);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

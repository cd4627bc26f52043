/* One process, two APIs: Flyt's runtime (libcudart.so.13) and Flyt's driver (libcuda.so.1) called
 * side by side, as a program that uses the runtime and a library carrying its own (cuBLAS, PyTorch
 * extensions) does. Pointers, streams and events made through one API are used through the other,
 * which works only if both share one session and one address space. Every check can fail; the
 * program prints one line per check and exits 1 if any failed. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "runtime_expect.h"

#define RT(what, call) EXPECT(what, (call) == cudaSuccess)
#define DRV(what, call) EXPECT(what, (call) == CUDA_SUCCESS)

enum { N = 1 << 16 };
static unsigned char host[N], back[N];

/* The distinct driver libraries mapped in this process: files named like libcuda but not the
 * runtime (Flyt's driver is built as libflyt_libcuda.so; the name links to it). */
static int driver_libraries(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096], seen[8][1024];
    int count = 0;
    if (!maps) return -1;
    while (fgets(line, sizeof line, maps)) {
        char *path = strchr(line, '/');
        if (!path || !strstr(path, "libcuda") || strstr(path, "libcudart")) continue;
        path[strcspn(path, "\n")] = 0;
        int known = 0;
        for (int i = 0; i < count; i++) known |= strcmp(seen[i], path) == 0;
        if (!known && count < 8) snprintf(seen[count++], sizeof seen[0], "%s", path);
    }
    fclose(maps);
    return count;
}

int main(void) {
    for (int i = 0; i < N; i++) host[i] = (unsigned char)(i * 7 + 3);

    RT("cudaFree(0) sets up the runtime's context", cudaFree(0));
    CUcontext current = NULL, primary = NULL;
    DRV("cuCtxGetCurrent", cuCtxGetCurrent(&current));
    DRV("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&primary, 0));
    EXPECT("the runtime made the primary context current, as NVIDIA's does", current != NULL && current == primary);

    /* An app that pops the context the runtime set up: the runtime sets it up again. */
    CUcontext popped = NULL;
    DRV("cuCtxPopCurrent", cuCtxPopCurrent(&popped));
    DRV("no context current now", cuCtxGetCurrent(&current));
    EXPECT("the popped context was the primary one, and none is current", popped == primary && current == NULL);
    void *probe = NULL;
    RT("cudaMalloc with no context current", cudaMalloc(&probe, 256));
    DRV("cuCtxGetCurrent after it", cuCtxGetCurrent(&current));
    EXPECT("the runtime made the primary context current again", current == primary);
    RT("cudaFree", cudaFree(probe));

    /* Driver allocation, runtime copies. */
    CUdeviceptr d = 0;
    DRV("cuMemAlloc", cuMemAlloc(&d, N));
    RT("cudaMemcpy host to a cuMemAlloc pointer", cudaMemcpy((void *)d, host, N, cudaMemcpyHostToDevice));
    memset(back, 0, N);
    DRV("cuMemcpyDtoH of what the runtime wrote", cuMemcpyDtoH(back, d, N));
    EXPECT("the bytes came back", memcmp(host, back, N) == 0);
    struct cudaPointerAttributes attributes;
    RT("cudaPointerGetAttributes of a driver allocation", cudaPointerGetAttributes(&attributes, (void *)d));
    EXPECT("the runtime sees device memory", attributes.type == cudaMemoryTypeDevice);

    /* Runtime allocation, driver memset, runtime copy back. */
    void *p = NULL;
    RT("cudaMalloc", cudaMalloc(&p, N));
    DRV("cuMemsetD8 of a cudaMalloc pointer", cuMemsetD8((CUdeviceptr)p, 0x5a, N));
    RT("cudaMemcpy back", cudaMemcpy(back, p, N, cudaMemcpyDeviceToHost));
    int all = 1;
    for (int i = 0; i < N; i++) all &= back[i] == 0x5a;
    EXPECT("the driver's memset is what the runtime reads", all);
    DRV("cuMemcpyDtoD between the two APIs' allocations", cuMemcpyDtoD((CUdeviceptr)p, d, N));
    RT("cudaMemcpy of the copy", cudaMemcpy(back, p, N, cudaMemcpyDeviceToHost));
    EXPECT("device-to-device across APIs", memcmp(host, back, N) == 0);

    /* Streams and events across APIs. */
    cudaStream_t stream = NULL;
    RT("cudaStreamCreate", cudaStreamCreate(&stream));
    DRV("cuMemsetD8Async on a runtime stream", cuMemsetD8Async(d, 0x11, N, (CUstream)stream));
    cudaEvent_t event = NULL;
    RT("cudaEventCreate", cudaEventCreate(&event));
    DRV("cuEventRecord of a runtime event on a runtime stream", cuEventRecord((CUevent)event, (CUstream)stream));
    RT("cudaEventSynchronize", cudaEventSynchronize(event));
    DRV("cuStreamSynchronize of a runtime stream", cuStreamSynchronize((CUstream)stream));
    RT("cudaMemcpy after the async memset", cudaMemcpy(back, (void *)d, N, cudaMemcpyDeviceToHost));
    all = 1;
    for (int i = 0; i < N; i++) all &= back[i] == 0x11;
    EXPECT("the memset queued on the runtime's stream ran", all);
    DRV("cuStreamDestroy of a runtime stream", cuStreamDestroy((CUstream)stream));
    EXPECT("the runtime no longer knows a stream the driver destroyed", cudaStreamSynchronize(stream) != cudaSuccess);
    cudaGetLastError();

    RT("cudaFree of a driver allocation", cudaFree((void *)d));
    DRV("cuMemFree of a runtime allocation", cuMemFree((CUdeviceptr)p));
    EXPECT("one driver library in the process", driver_libraries() == 1);

    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

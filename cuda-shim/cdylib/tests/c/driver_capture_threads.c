// Capture interaction modes across app threads through Flyt's libcuda.so.1 on the emulated
// device. The server makes every app thread's calls on one session thread, which therefore holds
// every capture; each request must still run under the rule the driver applies to the app thread
// that made it: another thread's thread-local capture prohibits nothing here (as XLA's command
// buffers on one GPU's thread meet NCCL's allocations on another's), a global-mode capture
// prohibits unsafe calls of every thread that is not relaxed, and a relaxed capturing thread may
// make them.
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <string.h>

#include "driver_expect.h"

#define THREAD_LOCAL CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
#define GLOBAL CU_STREAM_CAPTURE_MODE_GLOBAL
#define RELAXED CU_STREAM_CAPTURE_MODE_RELAXED

static CUcontext ctx;
static CUresult other_result;
static int other_relaxed;

// Another app thread allocates while the main thread captures.
static void *other(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    CUstreamCaptureMode previous = RELAXED;
    if (other_relaxed) cuThreadExchangeStreamCaptureMode(&previous);
    CUdeviceptr p = 0;
    other_result = cuMemAlloc(&p, 1 << 20);
    if (other_result == CUDA_SUCCESS) cuMemFree(p);
    if (other_relaxed) cuThreadExchangeStreamCaptureMode(&previous);
    return NULL;
}

static CUresult from_other_thread(int relaxed) {
    pthread_t thread;
    other_relaxed = relaxed;
    pthread_create(&thread, NULL, other, NULL);
    pthread_join(thread, NULL);
    return other_result;
}

int main(void) {
    CUdevice device;
    ctx = use_primary_context(&device);
    CUstream stream;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    CUgraph graph;

    // A thread-local capture here: another thread allocates freely.
    EXPECT(cuStreamBeginCapture(stream, THREAD_LOCAL), CUDA_SUCCESS);
    CUresult r = from_other_thread(0);
    printf("another thread's allocation during a thread-local capture: %s\n", name_of(r));
    EXPECT(r, CUDA_SUCCESS);
    // This thread, relaxed for the call, may allocate too.
    CUstreamCaptureMode mode = RELAXED;
    EXPECT(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    r = cuMemAlloc(&p, 4096);
    printf("the capturing thread's allocation, relaxed: %s\n", name_of(r));
    EXPECT(r, CUDA_SUCCESS);
    EXPECT(cuMemFree(p), CUDA_SUCCESS);
    EXPECT(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    EXPECT(cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(graph), CUDA_SUCCESS);

    // A global capture: another thread's allocation is prohibited, unless it is relaxed.
    EXPECT(cuStreamBeginCapture(stream, GLOBAL), CUDA_SUCCESS);
    r = from_other_thread(0);
    printf("another thread's allocation during a global capture: %s\n", name_of(r));
    EXPECT(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    r = from_other_thread(1);
    printf("a relaxed thread's allocation during a global capture: %s\n", name_of(r));
    EXPECT(r, CUDA_SUCCESS);
    cuStreamEndCapture(stream, &graph);
    if (graph) cuGraphDestroy(graph);

    // Afterwards, with no capture, everyone allocates.
    r = from_other_thread(0);
    printf("another thread's allocation after the captures: %s\n", name_of(r));
    EXPECT(r, CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
    EXPECT(cuMemFree(p), CUDA_SUCCESS);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures != 0;
}

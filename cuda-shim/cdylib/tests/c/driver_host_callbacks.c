// Stream callbacks from several host threads (the shape of NVIDIA's simpleCallback sample): each
// of WORKLOADS threads makes a stream, copies data in, fills a range, copies it out and adds a
// callback; the callback starts a thread that checks the result and frees the memory, the pinned
// buffer and the stream while other streams' callbacks still wait (cuMemFree waits for the whole
// device, those callbacks included). Nothing may wait forever: the main thread gives up after
// 30 s and says so.
#include "driver_expect.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { WORKLOADS = 8, ELEMENTS = 100000 };

struct workload {
    int id;
    CUcontext context;
    CUstream stream;
    CUdeviceptr device;
    unsigned *host;
    int right;
    CUresult freed, freed_host, destroyed;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_done = PTHREAD_COND_INITIALIZER;
static int finished = 0;

static void *postprocess(void *arg) {
    struct workload *w = arg;
    cuCtxSetCurrent(w->context);
    w->right = 1;
    for (int i = 0; i < ELEMENTS; i++) {
        unsigned expected = i < ELEMENTS / 2 ? 0x01010101u * (unsigned)(w->id + 1) : (unsigned)(w->id + i);
        if (w->host[i] != expected) w->right = 0;
    }
    w->freed = cuMemFree(w->device);
    w->freed_host = cuMemFreeHost(w->host);
    w->destroyed = cuStreamDestroy(w->stream);
    pthread_mutex_lock(&lock);
    finished++;
    pthread_cond_signal(&all_done);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void CUDA_CB slow_host_function(void *data) {
    usleep(300000);
    *(volatile int *)data = 1;
}

static void CUDA_CB callback(CUstream stream, CUresult status, void *data) {
    (void)stream;
    (void)status;
    // A callback may make no CUDA call: the work goes on in a thread of its own.
    pthread_t thread;
    pthread_create(&thread, NULL, postprocess, data);
    pthread_detach(thread);
}

static void *launch(void *arg) {
    struct workload *w = arg;
    size_t bytes = ELEMENTS * sizeof(unsigned);
    cuCtxSetCurrent(w->context);
    EXPECT(cuStreamCreate(&w->stream, 0), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&w->device, bytes), CUDA_SUCCESS);
    EXPECT(cuMemHostAlloc((void **)&w->host, bytes, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
    for (int i = 0; i < ELEMENTS; i++) w->host[i] = (unsigned)(w->id + i);
    EXPECT(cuMemcpyHtoDAsync(w->device, w->host, bytes, w->stream), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(w->device, (unsigned char)(w->id + 1), bytes / 2, w->stream), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoHAsync(w->host, w->device, bytes, w->stream), CUDA_SUCCESS);
    EXPECT(cuStreamAddCallback(w->stream, callback, w, 0), CUDA_SUCCESS);
    return NULL;
}

int main(void) {
    CUcontext context;
    context = use_primary_context(NULL);

    static struct workload workloads[WORKLOADS];
    pthread_t threads[WORKLOADS];
    for (int i = 0; i < WORKLOADS; i++) {
        workloads[i].id = i;
        workloads[i].context = context;
        pthread_create(&threads[i], NULL, launch, &workloads[i]);
    }
    for (int i = 0; i < WORKLOADS; i++) pthread_join(threads[i], NULL);

    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 30;
    pthread_mutex_lock(&lock);
    int timed_out = 0;
    while (finished < WORKLOADS && !timed_out) timed_out = pthread_cond_timedwait(&all_done, &lock, &deadline) == ETIMEDOUT;
    int done = finished;
    pthread_mutex_unlock(&lock);
    if (timed_out) {
        printf("FAIL: %d of %d workloads finished in 30 s: a hang\n", done, WORKLOADS);
        fflush(stdout);
        _exit(3);
    }
    int right = 0;
    for (int i = 0; i < WORKLOADS; i++) {
        struct workload *w = &workloads[i];
        right += w->right;
        EXPECT(w->freed, CUDA_SUCCESS);
        EXPECT(w->freed_host, CUDA_SUCCESS);
        EXPECT(w->destroyed, CUDA_SUCCESS);
    }
    printf("workloads finished: %d of %d, results right: %d\n", done, WORKLOADS, right);
    if (right != WORKLOADS) failures++;

    // A module load (its image the request's bulk) waits for the device, so for a host
    // function still running: the function's answer must get past the load's request.
    static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry nothing()\n{\n ret;\n}\n";
    CUstream stream;
    CUmodule module;
    volatile int ran = 0;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuLaunchHostFunc(stream, slow_host_function, (void *)&ran), CUDA_SUCCESS);
    usleep(50000);
    CUresult loaded = cuModuleLoadData(&module, ptx);
    printf("module load behind a running host function returned; the function had run: %s\n", ran ? "yes" : "no");
    if (loaded == CUDA_SUCCESS) cuModuleUnload(module);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    return finish();
}

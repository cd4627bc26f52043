// Stream callbacks from several host threads (the shape of NVIDIA's simpleCallback sample): each
// of 8 threads makes a stream, copies its data in, runs a kernel, copies the result out and adds
// a callback; the callback starts a thread that checks the result and frees the device memory,
// the pinned buffer and the stream (cudaFree waits for the whole device, other streams'
// callbacks included). The main thread waits at most 60 s: a hang is reported, not waited out.
#include <pthread.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>

#include "common.h"

enum { WORKLOADS = 8, ELEMENTS = 100000 };

struct Workload {
    int id;
    cudaStream_t stream;
    int *device;
    int *host;
    bool right;
    cudaError_t freed, freed_host, destroyed;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_done = PTHREAD_COND_INITIALIZER;
static int finished = 0;

__global__ void increment(int *data, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i]++;
}

static void *postprocess(void *arg) {
    Workload *w = (Workload *)arg;
    cudaSetDevice(0);
    w->right = true;
    for (int i = 0; i < ELEMENTS; i++) w->right &= w->host[i] == w->id + i + 1;
    w->freed = cudaFree(w->device);
    w->freed_host = cudaFreeHost(w->host);
    w->destroyed = cudaStreamDestroy(w->stream);
    pthread_mutex_lock(&lock);
    finished++;
    pthread_cond_signal(&all_done);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void CUDART_CB callback(cudaStream_t, cudaError_t status, void *data) {
    if (status != cudaSuccess) printf("FAIL: callback status %s\n", cudaGetErrorName(status));
    pthread_t thread;
    pthread_create(&thread, NULL, postprocess, data);
    pthread_detach(thread);
}

static void *launch(void *arg) {
    Workload *w = (Workload *)arg;
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreate(&w->stream));
    CHECK(cudaMalloc(&w->device, ELEMENTS * sizeof(int)));
    CHECK(cudaHostAlloc(&w->host, ELEMENTS * sizeof(int), cudaHostAllocPortable));
    for (int i = 0; i < ELEMENTS; i++) w->host[i] = w->id + i;
    CHECK(cudaMemcpyAsync(w->device, w->host, ELEMENTS * sizeof(int), cudaMemcpyHostToDevice, w->stream));
    increment<<<(ELEMENTS + 511) / 512, 512, 0, w->stream>>>(w->device, ELEMENTS);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(w->host, w->device, ELEMENTS * sizeof(int), cudaMemcpyDeviceToHost, w->stream));
    CHECK(cudaStreamAddCallback(w->stream, callback, w, 0));
    return NULL;
}

int main() {
    test_init("callback_threads");
    static Workload workloads[WORKLOADS];
    pthread_t threads[WORKLOADS];
    for (int i = 0; i < WORKLOADS; i++) {
        workloads[i].id = i;
        pthread_create(&threads[i], NULL, launch, &workloads[i]);
    }
    for (int i = 0; i < WORKLOADS; i++) pthread_join(threads[i], NULL);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 60;
    pthread_mutex_lock(&lock);
    bool timed_out = false;
    while (finished < WORKLOADS && !timed_out) timed_out = pthread_cond_timedwait(&all_done, &lock, &deadline) == ETIMEDOUT;
    int done = finished;
    pthread_mutex_unlock(&lock);
    if (timed_out) {
        printf("FAIL: %d of %d workloads finished in 60 s: a hang\ncallback_threads: FAIL\n", done, WORKLOADS);
        fflush(stdout);
        _exit(1);
    }
    int right = 0;
    for (int i = 0; i < WORKLOADS; i++) {
        Workload &w = workloads[i];
        right += w.right;
        if (w.freed != cudaSuccess || w.freed_host != cudaSuccess || w.destroyed != cudaSuccess) {
            printf("FAIL: workload %d: free %s, free host %s, stream destroy %s\n", i, cudaGetErrorName(w.freed),
                   cudaGetErrorName(w.freed_host), cudaGetErrorName(w.destroyed));
            g_failures++;
        }
    }
    printf("workloads finished: %d of %d, results right: %d\n", done, WORKLOADS, right);
    if (right != WORKLOADS) g_failures++;
    return test_finish();
}

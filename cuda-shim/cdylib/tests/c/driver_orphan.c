// A client that dies while its session's thread is held: a host function that never returns
// holds a stream, and a second thread's cuMemFree waits for the device behind it. The runner
// kills this program once it prints "held"; the server must end the session anyway.
#include "driver_expect.h"

#include <pthread.h>
#include <unistd.h>

static CUdeviceptr memory;
static CUcontext context;

static void CUDA_CB never_returns(void *data) {
    (void)data;
    for (;;) pause();
}

static void *free_it(void *arg) {
    (void)arg;
    cuCtxSetCurrent(context);
    cuMemFree(memory);
    return NULL;
}

int main(void) {
    CUstream stream;
    context = use_primary_context(NULL);
    EXPECT(cuMemAlloc(&memory, 1 << 20), CUDA_SUCCESS);
    EXPECT(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    EXPECT(cuLaunchHostFunc(stream, never_returns, NULL), CUDA_SUCCESS);
    usleep(200000);
    pthread_t thread;
    pthread_create(&thread, NULL, free_it, NULL);
    usleep(300000);
    printf("held\n");
    fflush(stdout);
    for (;;) pause();
}

// The reply timeout (FLYT_REPLY_TIMEOUT): "long" waits 4 s for a host function through
// cuStreamSynchronize, which must succeed however short the timeout (a live server says so
// while the work lasts); "stopped" prints "ready", waits for a line on stdin (the runner has
// stopped the server's worker meanwhile) and makes a call, which must fail, not wait for ever.
#include "driver_expect.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

static void CUDA_CB slow(void *data) {
    (void)data;
    sleep(4);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    CUstream stream;
    use_primary_context(NULL);
    EXPECT(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    if (argc > 1 && strcmp(argv[1], "long") == 0) {
        EXPECT(cuLaunchHostFunc(stream, slow, NULL), CUDA_SUCCESS);
        double started = now();
        CUresult waited = cuStreamSynchronize(stream);
        printf("a 4 s wait: %s after %d s\n", name_of(waited), (int)(now() - started + 0.5));
    } else {
        printf("ready\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 2;
        double started = now();
        CUdeviceptr p;
        CUresult got = cuMemAlloc(&p, 4096);
        printf("a call to a stopped server: %s within %d s\n", name_of(got), (int)(now() - started + 0.5));
    }
    fflush(stdout);
    _exit(0);
}

// sync_copies SIZE MODE COUNT: COUNT synchronous driver-API calls of one kind, timed one by one; prints
// p50 and p99 in us. MODE: h pageable HtoD, p pinned HtoD, d pageable DtoH, s cuCtxSynchronize. For
// A/B runs of two builds in turns (e.g. 4 KiB copies: `sync_copies 4096 h 20000`).
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r) { const char *s; cuGetErrorName(r, &s); fprintf(stderr, "%s: %s\n", #x, s); exit(1);} } while (0)
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
int cmp(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    size_t n = atol(argv[1]); char mode = argv[2][0]; int count = atoi(argv[3]);
    double *t = calloc(count, sizeof *t);
    CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c, d)); CK(cuCtxSetCurrent(c));
    char *h; if (mode == 'p') CK(cuMemAllocHost((void **)&h, n)); else h = malloc(n);
    memset(h, 1, n);
    CUdeviceptr a; CK(cuMemAlloc(&a, n));
    for (int i = 0; i < count; i++) {
        double t0 = now();
        switch (mode) {
        case 'h': case 'p': CK(cuMemcpyHtoD(a, h, n)); break;
        case 'd': CK(cuMemcpyDtoH(h, a, n)); break;
        default: CK(cuCtxSynchronize());
        }
        t[i] = now() - t0;
    }
    qsort(t, count, sizeof *t, cmp);
    printf("%c %zu x%d p50 %.2f us p99 %.2f us\n", mode, n, count, t[count / 2], t[count * 99 / 100]);
    return 0;
}

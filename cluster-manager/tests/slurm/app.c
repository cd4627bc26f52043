/* A CUDA driver-API program for the Slurm test (declared by hand: no CUDA headers needed). It
 * opens a session through whatever libcuda.so.1 the library path gives it (Flyt's, which the
 * SPANK plugin put first), round-trips 1024 numbers through device memory, prints their sum,
 * then holds its session for the number of seconds in argv[1] (a job scancel or its time limit
 * ends). Exit 1 when a call fails. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice device);
CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext context);
CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr pointer);

#define CHECK(call)                                                  \
    do {                                                             \
        CUresult result_ = (call);                                   \
        if (result_ != 0) {                                          \
            printf("FAILED: %s returned %d\n", #call, result_);      \
            return 1;                                                \
        }                                                            \
    } while (0)

int main(int argc, char **argv) {
    int hold = argc > 1 ? atoi(argv[1]) : 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUdevice device;
    CUcontext context;
    char name[128] = {0};
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDeviceGetName(name, sizeof name, device));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    printf("device 0: %s\n", name);
    unsigned int values[1024], back[1024];
    for (int i = 0; i < 1024; i++) {
        values[i] = (unsigned int)i + 1;
        back[i] = 0;
    }
    CUdeviceptr buffer;
    CHECK(cuMemAlloc_v2(&buffer, sizeof values));
    CHECK(cuMemcpyHtoD_v2(buffer, values, sizeof values));
    CHECK(cuMemcpyDtoH_v2(back, buffer, sizeof back));
    unsigned long long sum = 0;
    for (int i = 0; i < 1024; i++) sum += back[i];
    printf("sum of 1024 values read back: %llu\n", sum);
    if (hold > 0) {
        printf("holding the session for %d s\n", hold);
        sleep((unsigned int)hold);
    }
    CHECK(cuMemFree_v2(buffer));
    printf("done\n");
    return 0;
}

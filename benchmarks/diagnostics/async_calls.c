// async_calls COUNT [memset|dtoh]: COUNT asynchronous cuMemsetD8Async of 64 KiB on one stream, then
// one cuStreamSynchronize; or COUNT synchronous cuMemcpyDtoH of 4 bytes (a step's small result).
// Under callgrind (async_calls.sh) the client's instructions per call, the difference of two
// counts over the difference of their calls, leaving start-up out.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CK(x) do { CUresult r = (x); if (r) { const char *s; cuGetErrorName(r, &s); fprintf(stderr, "%s: %s\n", #x, s); exit(1);} } while (0)
int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 1000;
    int dtoh = argc > 2 && strcmp(argv[2], "dtoh") == 0;
    CK(cuInit(0));
    CUdevice device;
    CK(cuDeviceGet(&device, 0));
    CUcontext context;
    CK(cuDevicePrimaryCtxRetain(&context, device));
    CK(cuCtxSetCurrent(context));
    CUstream stream;
    CK(cuStreamCreate(&stream, 0));
    CUdeviceptr buffer;
    CK(cuMemAlloc(&buffer, 65536));
    unsigned result = 0;
    for (int i = 0; i < count; i++) {
        if (dtoh) CK(cuMemcpyDtoH(&result, buffer, sizeof result));
        else CK(cuMemsetD8Async(buffer, (unsigned char)i, 65536, stream));
    }
    CK(cuStreamSynchronize(stream));
    printf("%d calls\n", count);
    return 0;
}

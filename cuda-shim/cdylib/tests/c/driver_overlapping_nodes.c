// Two servers whose device addresses may coincide (both emulated with --emulated-fixed-base; the
// second in the same address window as the first, or in another): an allocation on device 1 at
// addresses device 0's memory holds is refused (CUDA_ERROR_OUT_OF_MEMORY, and a line naming both
// servers on stderr); in another window it is made. Prints which.
#include <stdlib.h>

#include "driver_expect.h"

int main(void) {
    count_devices(0, 0);
    CUcontext ctx0, ctx1;
    CUdeviceptr on0 = 0, on1 = 0;
    EXPECT(cuDevicePrimaryCtxRetain(&ctx0, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&on0, 1 << 20), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    CUresult second = cuMemAlloc(&on1, 1 << 20);
    printf("allocation on device 1: %s\n", name_of(second));
    if (second == CUDA_SUCCESS) {
        printf("disjoint: %s\n", on1 >= on0 + (1 << 20) || on0 >= on1 + (1 << 20) ? "yes" : "no");
        EXPECT(cuMemFree(on1), CUDA_SUCCESS);
    }
    EXPECT(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    EXPECT(cuMemFree(on0), CUDA_SUCCESS);
    return finish();
}

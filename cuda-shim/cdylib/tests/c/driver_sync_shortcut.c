// A device-to-host copy into pageable memory returns once its stream's work is done, so the
// cuStreamSynchronize right after it (`.item()` in PyTorch) needs no round trip; one after new
// work does, and sees that work done. tests/static_runtime.rs counts the round trips
// (FLYT_STATS); tests/migration.rs's green-context test pauses an app that only polls them.
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

#define ROUNDS 20
#define BYTES 4096

int main(void) {
    CUdevice dev;
    CUstream stream;
    CUdeviceptr device;
    use_primary_context(&dev);
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&device, BYTES), CUDA_SUCCESS);
    unsigned char *host = malloc(BYTES);
    int wrong = 0;
    for (int round = 0; round < ROUNDS; round++) {
        EXPECT(cuMemsetD8Async(device, (unsigned char)round, BYTES, stream), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
        memset(host, 0xff, BYTES);
        EXPECT(cuMemcpyDtoHAsync(host, device, BYTES, stream), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
        wrong += host[0] != round || host[BYTES - 1] != round;
    }
    CHECK("every copy read the memset before it", wrong == 0);
    free(host);
    EXPECT(cuMemFree(device), CUDA_SUCCESS);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures != 0;
}

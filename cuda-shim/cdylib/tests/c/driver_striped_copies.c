// Large copies through Flyt's libcuda.so.1 on the emulated device, over whichever transport the
// test picks (with FLYT_SHM=off, copies of 1 MiB and more over TCP, 4 MiB and more over a Unix
// socket, are striped over the session's data connections): odd sizes (not multiples of the
// chunk) at odd device offsets, pinned and pageable host memory, synchronous and asynchronous, 2D
// copies, two threads copying at once, and a copy ordered between a memset and a device-to-device
// copy on one stream. Every byte is checked.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + seed + (i >> 13));
}

static CUcontext ctx;
static CUdeviceptr dev;
static const size_t DEVICE_BYTES = 48 << 20;

struct worker {
    size_t offset, len;
    unsigned seed;
    int ok;
};

static void *copy_round_trips(void *arg) {
    struct worker *w = arg;
    cuCtxSetCurrent(ctx);
    unsigned char *src = malloc(w->len), *back = malloc(w->len);
    w->ok = 1;
    for (int round = 0; round < 4; round++) {
        fill(src, w->len, w->seed + round);
        memset(back, 0, w->len);
        if (cuMemcpyHtoD(dev + w->offset, src, w->len) != CUDA_SUCCESS) w->ok = 0;
        if (cuMemcpyDtoH(back, dev + w->offset, w->len) != CUDA_SUCCESS) w->ok = 0;
        if (memcmp(src, back, w->len) != 0) w->ok = 0;
    }
    free(src);
    free(back);
    return NULL;
}

int main(void) {
    ctx = use_primary_context(NULL);
    EXPECT(cuMemAlloc(&dev, DEVICE_BYTES), CUDA_SUCCESS);
    const size_t largest = 21 << 20;
    unsigned char *pinned_src, *pinned_back;
    unsigned char *pageable_src = malloc(largest), *pageable_back = malloc(largest);
    EXPECT(cuMemAllocHost((void **)&pinned_src, largest), CUDA_SUCCESS);
    EXPECT(cuMemAllocHost((void **)&pinned_back, largest), CUDA_SUCCESS);
    CUstream stream;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    // Just under, at and over the striping threshold, and sizes that end mid-chunk.
    const size_t sizes[] = {(1 << 20) - 1, 1 << 20, (1 << 20) + 1, (5 << 20) + 123, (17 << 20) + 4093, 21 << 20};
    int sync_ok = 1, async_ok = 1;
    for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        for (int pinned = 0; pinned < 2; pinned++) {
            unsigned char *src = pinned ? pinned_src : pageable_src, *back = pinned ? pinned_back : pageable_back;
            CUdeviceptr at = dev + 3 + k;
            fill(src, n, k * 2 + pinned);
            memset(back, 0, n);
            EXPECT(cuMemcpyHtoD(at, src, n), CUDA_SUCCESS);
            EXPECT(cuMemcpyDtoH(back, at, n), CUDA_SUCCESS);
            if (memcmp(src, back, n) != 0) {
                printf("sync %s %zu bytes differ\n", pinned ? "pinned" : "pageable", n);
                sync_ok = 0;
            }
            fill(src, n, k * 2 + pinned + 100);
            memset(back, 0, n);
            EXPECT(cuMemcpyHtoDAsync(at, src, n, stream), CUDA_SUCCESS);
            EXPECT(cuMemcpyDtoHAsync(back, at, n, stream), CUDA_SUCCESS);
            EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
            if (memcmp(src, back, n) != 0) {
                printf("async %s %zu bytes differ\n", pinned ? "pinned" : "pageable", n);
                async_ok = 0;
            }
        }
    }
    CHECK("synchronous copies of odd sizes, pinned and pageable, came back intact", sync_ok);
    CHECK("asynchronous copies of odd sizes, pinned and pageable, came back intact", async_ok);

    // Stream order: memset, a large copy over part of it, a device-to-device copy of the result.
    {
        size_t n = (3 << 20) + 77;
        fill(pageable_src, n, 7);
        EXPECT(cuMemsetD8Async(dev, 0xAB, 8 << 20, stream), CUDA_SUCCESS);
        EXPECT(cuMemcpyHtoDAsync(dev + 4096, pageable_src, n, stream), CUDA_SUCCESS);
        EXPECT(cuMemcpyDtoDAsync(dev + (16 << 20), dev, 8 << 20, stream), CUDA_SUCCESS);
        EXPECT(cuMemcpyDtoH(pageable_back, dev + (16 << 20), 8 << 20), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
        int ok = pageable_back[0] == 0xAB && pageable_back[4095] == 0xAB && memcmp(pageable_back + 4096, pageable_src, n) == 0 &&
                 pageable_back[4096 + n] == 0xAB && pageable_back[(8 << 20) - 1] == 0xAB;
        CHECK("a large copy keeps its place between a memset and a device copy", ok);
    }

    // 2D: rows of 1 MiB and more, pitched on both sides.
    {
        size_t width = (1 << 20) + 333, height = 5, host_pitch = width + 64, dev_pitch = (2 << 20);
        unsigned char *h = malloc(host_pitch * height), *b = calloc(host_pitch, height);
        fill(h, host_pitch * height, 42);
        CUDA_MEMCPY2D up = copy_2d(host_side(h, host_pitch, 0), device_side(dev + (20 << 20), dev_pitch, 0), width, height);
        EXPECT(cuMemcpy2D(&up), CUDA_SUCCESS);
        CUDA_MEMCPY2D down = copy_2d(device_side(dev + (20 << 20), dev_pitch, 0), host_side(b, host_pitch, 0), width, height);
        EXPECT(cuMemcpy2D(&down), CUDA_SUCCESS);
        int ok = 1;
        for (size_t row = 0; row < height; row++) ok &= memcmp(h + row * host_pitch, b + row * host_pitch, width) == 0;
        CHECK("2D copies of wide rows came back intact", ok);
        free(h);
        free(b);
    }

    // Two threads striping at once, each on its own range.
    {
        pthread_t threads[2];
        struct worker workers[2] = {{30 << 20, (6 << 20) + 5, 1, 0}, {38 << 20, (7 << 20) + 9, 2, 0}};
        for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, copy_round_trips, &workers[i]);
        for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
        CHECK("two threads copying at once both got their bytes", workers[0].ok && workers[1].ok);
    }

    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(pinned_src), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(pinned_back), CUDA_SUCCESS);
    EXPECT(cuMemFree(dev), CUDA_SUCCESS);
    return finish();
}

// migrate_objects: a program whose session holds what a plain allocation does not: memory pools
// (one of its own, current for the device, and the default one) with attributes it set and
// stream-ordered allocations from both; a 2D array, a layered 3D array, a mipmapped array
// with two levels it named and an NV12 array with both its planes named; texture objects over an array and over linear memory, and a surface
// object; an address reservation of its own with two physical allocations mapped in it, one of
// which it has released (the mapping keeps it). It is checkpointed or moved under it. Every round it reads back what the round before
// wrote into each allocation and array, then writes a new pattern. At the end it checks the
// pools' attributes and the current pool, frees the pool allocations in stream order, allocates
// from the pools again and destroys its objects by the handles it was given (the server knows
// them only if they came back under those handles). Prints "pointers: ..." at the start and at
// the end, then "PASSED: 0 failure(s)". Arguments: rounds, milliseconds between rounds, and
// `sparse` to hold a sparse array too from its first call on (such a session cannot move).
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver_expect.h"

#define POOLED 3
#define MAPPED 2

static unsigned char pattern(size_t i, unsigned round, unsigned what) {
    return (unsigned char)((i * 37u + round * 11u + what * 53u) ^ (i >> 7));
}

// The bytes of one array (or level): width in bytes, rows, slices.
struct array_bytes {
    CUarray array;
    size_t width, height, depth;
};

static void array_copy(struct array_bytes *a, unsigned char *host, int to_array) {
    copy_side h = host_side(host, a->width, a->height), array = array_side(a->array);
    CUDA_MEMCPY3D c = to_array ? copy_3d(h, array, a->width, a->height, a->depth) : copy_3d(array, h, a->width, a->height, a->depth);
    EXPECT(cuMemcpy3D(&c), CUDA_SUCCESS);
}

static void print_pointers(const CUdeviceptr *pooled, CUdeviceptr reserved, CUtexObject t1, CUtexObject t2, CUsurfObject s) {
    printf("pointers:");
    for (int p = 0; p < POOLED; p++) printf(" %llx", (unsigned long long)pooled[p]);
    printf(" reserved %llx", (unsigned long long)reserved);
    printf(" objects %llu %llu %llu\n", (unsigned long long)t1, (unsigned long long)t2, (unsigned long long)s);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 10;
    int with_sparse = argc > 3 && strcmp(argv[3], "sparse") == 0;
    CUdevice device = 0;
    use_primary_context(NULL);
    // The session's first call, so a move asked for once the session exists finds it.
    CUarray sparse = NULL;
    CUDA_ARRAY3D_DESCRIPTOR sparse_desc = {1024, 1024, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE};
    if (with_sparse) EXPECT(cuArray3DCreate(&sparse, &sparse_desc), CUDA_SUCCESS);
    CUstream stream;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    // Pools: one of the app's own, made current, and the default one, each with a threshold.
    CUmemoryPool own, fallback;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    EXPECT(cuMemPoolCreate(&own, &props), CUDA_SUCCESS);
    EXPECT(cuDeviceGetDefaultMemPool(&fallback, device), CUDA_SUCCESS);
    cuuint64_t own_threshold = 48 << 20, fallback_threshold = 16 << 20;
    EXPECT(cuMemPoolSetAttribute(own, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &own_threshold), CUDA_SUCCESS);
    EXPECT(cuMemPoolSetAttribute(fallback, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &fallback_threshold), CUDA_SUCCESS);
    int opportunistic = 0;
    EXPECT(cuMemPoolSetAttribute(own, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &opportunistic), CUDA_SUCCESS);
    EXPECT(cuDeviceSetMemPool(device, own), CUDA_SUCCESS);
    const size_t pooled_len[POOLED] = {4096, (2 << 20) + 17, 300};
    CUdeviceptr pooled[POOLED];
    EXPECT(cuMemAllocAsync(&pooled[0], pooled_len[0], stream), CUDA_SUCCESS);
    EXPECT(cuMemAllocFromPoolAsync(&pooled[1], pooled_len[1], fallback, stream), CUDA_SUCCESS);
    EXPECT(cuMemAllocFromPoolAsync(&pooled[2], pooled_len[2], own, stream), CUDA_SUCCESS);

    // Arrays: 2D floats, a layered 3D array of uchar4 (surface load/store), a mipmapped array.
    CUDA_ARRAY3D_DESCRIPTOR plane_desc = {64, 32, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    CUDA_ARRAY3D_DESCRIPTOR layers_desc = {16, 8, 4, CU_AD_FORMAT_UNSIGNED_INT8, 4, CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST};
    CUDA_ARRAY3D_DESCRIPTOR mip_desc = {32, 16, 0, CU_AD_FORMAT_UNSIGNED_INT16, 2, 0};
    CUarray plane, layers, level0, level2;
    CUmipmappedArray mip;
    EXPECT(cuArray3DCreate(&plane, &plane_desc), CUDA_SUCCESS);
    EXPECT(cuArray3DCreate(&layers, &layers_desc), CUDA_SUCCESS);
    EXPECT(cuMipmappedArrayCreate(&mip, &mip_desc, 3), CUDA_SUCCESS);
    EXPECT(cuMipmappedArrayGetLevel(&level0, mip, 0), CUDA_SUCCESS);
    EXPECT(cuMipmappedArrayGetLevel(&level2, mip, 2), CUDA_SUCCESS);
    // An NV12 frame: its planes move with it (luma 64 x 32 bytes, chroma 32 x 16 U, V pairs).
    CUDA_ARRAY3D_DESCRIPTOR nv12_desc = {64, 32, 0, CU_AD_FORMAT_NV12, 3, 0};
    CUarray frame, luma, chroma;
    EXPECT(cuArray3DCreate(&frame, &nv12_desc), CUDA_SUCCESS);
    EXPECT(cuArrayGetPlane(&luma, frame, 0), CUDA_SUCCESS);
    EXPECT(cuArrayGetPlane(&chroma, frame, 1), CUDA_SUCCESS);
#define ARRAYS 6
    struct array_bytes arrays[ARRAYS] = {{plane, 64 * 4, 32, 1},  {layers, 16 * 4, 8, 4}, {level0, 32 * 4, 16, 1},
                                         {level2, 8 * 4, 4, 1}, {luma, 64, 32, 1},      {chroma, 32 * 2, 16, 1}};

    // Objects: a texture over the plane, one over a pool allocation, a surface over the layers.
    CUDA_RESOURCE_DESC res = array_resource(plane);
    CUDA_TEXTURE_DESC tex = texture_desc(CU_TR_ADDRESS_MODE_CLAMP, CU_TR_FILTER_MODE_LINEAR, CU_TRSF_NORMALIZED_COORDINATES);
    CUtexObject on_plane = 0, on_linear = 0;
    EXPECT(cuTexObjectCreate(&on_plane, &res, &tex, NULL), CUDA_SUCCESS);
    // A texture made and destroyed leaves a gap in the handles.
    CUtexObject gone = 0;
    EXPECT(cuTexObjectCreate(&gone, &res, &tex, NULL), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_LINEAR;
    res.res.linear.devPtr = pooled[1];
    res.res.linear.format = CU_AD_FORMAT_UNSIGNED_INT8;
    res.res.linear.numChannels = 1;
    res.res.linear.sizeInBytes = 1 << 20;
    tex.filterMode = CU_TR_FILTER_MODE_POINT;
    tex.flags = CU_TRSF_READ_AS_INTEGER;
    EXPECT(cuTexObjectCreate(&on_linear, &res, &tex, NULL), CUDA_SUCCESS);
    EXPECT(cuTexObjectDestroy(gone), CUDA_SUCCESS);
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = layers;
    CUsurfObject surface = 0;
    EXPECT(cuSurfObjectCreate(&surface, &res), CUDA_SUCCESS);
    // Virtual memory: a reservation, two physical allocations mapped side by side, one released.
    size_t page = 0;
    CUmemAllocationProp prop = device_memory_prop(device, &page);
    CUdeviceptr reserved = 0;
    EXPECT(cuMemAddressReserve(&reserved, 4 * page, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle physical[MAPPED];
    CUmemAccessDesc access = {prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    for (int m = 0; m < MAPPED; m++) {
        EXPECT(cuMemCreate(&physical[m], page, &prop, 0), CUDA_SUCCESS);
        EXPECT(cuMemMap(reserved + m * page, page, 0, physical[m], 0), CUDA_SUCCESS);
    }
    EXPECT(cuMemSetAccess(reserved, MAPPED * page, &access, 1), CUDA_SUCCESS);
    EXPECT(cuMemRelease(physical[1]), CUDA_SUCCESS);
    print_pointers(pooled, reserved, on_plane, on_linear, surface);

    size_t largest = pooled_len[1];
    unsigned char *host = malloc(largest), *back = malloc(largest);
    struct timespec nap = {0, (long)pause_ms * 1000000L};
    for (int round = 0; round < rounds && failures == 0; round++) {
        for (int p = 0; p < POOLED; p++) {
            if (round > 0) read_last_round(pooled[p], back, pooled_len[p], stream, pattern, round, p, "pool allocation", p);
            for (size_t i = 0; i < pooled_len[p]; i++) host[i] = pattern(i, round, p);
            EXPECT(cuMemcpyHtoD(pooled[p], host, pooled_len[p]), CUDA_SUCCESS);
        }
        for (int m = 0; m < MAPPED; m++) {
            CUdeviceptr at = reserved + m * page + 1000;
            if (round > 0) {
                EXPECT(cuMemcpyDtoH(back, at, 4096), CUDA_SUCCESS);
                expect_last_round(back, 4096, pattern, round, 20 + m, "mapping", m);
            }
            for (size_t i = 0; i < 4096; i++) host[i] = pattern(i, round, 20 + m);
            EXPECT(cuMemcpyHtoD(at, host, 4096), CUDA_SUCCESS);
        }
        for (int a = 0; a < ARRAYS; a++) {
            size_t len = arrays[a].width * arrays[a].height * arrays[a].depth;
            if (round > 0) {
                array_copy(&arrays[a], back, 0);
                expect_last_round(back, len, pattern, round, 10 + a, "array", a);
            }
            for (size_t i = 0; i < len; i++) host[i] = pattern(i, round, 10 + a);
            array_copy(&arrays[a], host, 1);
        }
        nanosleep(&nap, NULL);
    }

    // The pools as the app set them up.
    cuuint64_t threshold = 0;
    EXPECT(cuMemPoolGetAttribute(own, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);
    FAIL_WHEN(threshold != own_threshold,
              "FAIL: the app's pool has a release threshold of %llu\n", (unsigned long long)threshold);
    EXPECT(cuMemPoolGetAttribute(fallback, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), CUDA_SUCCESS);
    FAIL_WHEN(threshold != fallback_threshold,
              "FAIL: the default pool has a release threshold of %llu\n", (unsigned long long)threshold);
    int flag = 1;
    EXPECT(cuMemPoolGetAttribute(own, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag), CUDA_SUCCESS);
    FAIL_WHEN(flag != 0, "FAIL: the app's pool allows opportunistic reuse again\n");
    CUmemoryPool current = NULL;
    EXPECT(cuDeviceGetMemPool(&current, device), CUDA_SUCCESS);
    FAIL_WHEN(current != own, "FAIL: the device's current pool is not the app's\n");
    print_pointers(pooled, reserved, on_plane, on_linear, surface);
    for (int p = 0; p < POOLED; p++) EXPECT(cuMemFreeAsync(pooled[p], stream), CUDA_SUCCESS);
    CUdeviceptr fresh = 0;
    EXPECT(cuMemAllocAsync(&fresh, 1 << 20, stream), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(fresh, 0x5a, 1 << 20, stream), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoHAsync(back, fresh, 1 << 20, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    FAIL_WHEN(back[0] != 0x5a || back[(1 << 20) - 1] != 0x5a, "FAIL: a new pool allocation does not hold what was set\n");
    EXPECT(cuMemFreeAsync(fresh, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuMemUnmap(reserved, MAPPED * page), CUDA_SUCCESS);
    EXPECT(cuMemRelease(physical[0]), CUDA_SUCCESS);
    EXPECT(cuMemAddressFree(reserved, 4 * page), CUDA_SUCCESS);
    RELEASE(TEXTURE(on_plane), TEXTURE(on_linear), SURFACE(surface), ARRAY(plane), ARRAY(layers), MIPMAP(mip));
    EXPECT(cuArrayDestroy(luma), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuArrayDestroy(frame), CUDA_SUCCESS);
    if (with_sparse) EXPECT(cuArrayDestroy(sparse), CUDA_SUCCESS);
    EXPECT(cuDeviceSetMemPool(device, fallback), CUDA_SUCCESS);
    EXPECT(cuMemPoolDestroy(own), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    free(host);
    free(back);
    return finish();
}

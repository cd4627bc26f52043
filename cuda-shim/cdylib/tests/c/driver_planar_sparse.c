// Planar (NV12), sparse and deferred-mapping arrays and batch decompression through Flyt's
// libcuda.so.1 on the emulated device: an NV12 array and its two planes (their descriptors,
// copies into each plane and back, checked byte for byte, a texture over the luma plane, the
// planes going with their array); sparse properties and memory requirements; tile pools and the
// map entries refused before any device sees them (a valid one is refused by the emulated device,
// which maps nothing, with its line); decompression batches with bad parameters refused with the
// index they name, and a valid one answered by the device (none has a decompression engine here).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

// The per-thread-stream exports, which cuda.h names only through its macros.
CUresult CUDAAPI cuMemMapArrayAsync_ptsz(CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream);
CUresult CUDAAPI cuMemBatchDecompressAsync_ptsz(CUmemDecompressParams *paramsArray, size_t count, unsigned int flags, size_t *errorIndex,
                                                CUstream stream);

// Copies `rows` rows of `width` bytes between host memory (`host`, packed) and an array.
static CUresult copy_plane(CUarray array, void *host, size_t width, size_t rows, int to_host, CUstream stream) {
    copy_side h = host_side(host, width, 0), a = array_side(array);
    CUDA_MEMCPY2D c = to_host ? copy_2d(a, h, width, rows) : copy_2d(h, a, width, rows);
    return stream ? cuMemcpy2DAsync(&c, stream) : cuMemcpy2D(&c);
}

static void planar(CUstream stream) {
    const size_t W = 64, H = 32;
    CUDA_ARRAY3D_DESCRIPTOR nv12 = {W, H, 0, CU_AD_FORMAT_NV12, 3, CUDA_ARRAY3D_SURFACE_LDST};
    CUarray frame, luma, chroma, again;
    EXPECT(cuArray3DCreate(&frame, &nv12), CUDA_SUCCESS);
    CUDA_ARRAY3D_DESCRIPTOR got;
    EXPECT(cuArray3DGetDescriptor(&got, frame), CUDA_SUCCESS);
    CHECK("NV12 descriptor read back", got.Width == W && got.Height == H && got.Format == CU_AD_FORMAT_NV12 && got.NumChannels == 3);
    EXPECT(cuArrayGetPlane(&luma, frame, 0), CUDA_SUCCESS);
    EXPECT(cuArrayGetPlane(&chroma, frame, 1), CUDA_SUCCESS);
    EXPECT(cuArrayGetPlane(&again, frame, 2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuArrayGetPlane(NULL, frame, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuArrayGetPlane(&again, luma, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuArrayGetPlane(&again, frame, 0), CUDA_SUCCESS);
    CHECK("a plane is the same array each time", again == luma);
    EXPECT(cuArray3DGetDescriptor(&got, luma), CUDA_SUCCESS);
    printf("luma plane: %zu x %zu, format %d, %u channel(s)\n", got.Width, got.Height, (int)got.Format, got.NumChannels);
    EXPECT(cuArray3DGetDescriptor(&got, chroma), CUDA_SUCCESS);
    printf("chroma plane: %zu x %zu, format %d, %u channel(s)\n", got.Width, got.Height, (int)got.Format, got.NumChannels);
    CUDA_ARRAY_DESCRIPTOR flat;
    EXPECT(cuArrayGetDescriptor(&flat, chroma), CUDA_SUCCESS);
    CHECK("2D descriptor of the chroma plane", flat.Width == W / 2 && flat.Height == H / 2 && flat.NumChannels == 2);

    // Each plane holds its own bytes: luma rows of W bytes, chroma rows of W/2 (U, V) pairs.
    size_t luma_len = W * H, chroma_len = W * (H / 2);
    unsigned char *y = malloc(luma_len), *uv = malloc(chroma_len), *y_back = malloc(luma_len), *uv_back = malloc(chroma_len);
    for (size_t i = 0; i < luma_len; i++) y[i] = (unsigned char)(i * 7 + 3);
    for (size_t i = 0; i < chroma_len; i++) uv[i] = (unsigned char)(i * 5 + 1);
    memset(y_back, 0, luma_len);
    memset(uv_back, 0, chroma_len);
    EXPECT(copy_plane(luma, y, W, H, 0, stream), CUDA_SUCCESS);
    EXPECT(copy_plane(chroma, uv, W, H / 2, 0, stream), CUDA_SUCCESS);
    EXPECT(copy_plane(luma, y_back, W, H, 1, stream), CUDA_SUCCESS);
    EXPECT(copy_plane(chroma, uv_back, W, H / 2, 1, stream), CUDA_SUCCESS);
    if (stream) EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    CHECK(stream ? "luma plane round trip, on a stream" : "luma plane round trip", memcmp(y, y_back, luma_len) == 0);
    CHECK(stream ? "chroma plane round trip, on a stream" : "chroma plane round trip", memcmp(uv, uv_back, chroma_len) == 0);
    // One element of the chroma plane is two bytes: the copies and bounds are the plane's.
    unsigned char pair[2];
    EXPECT(cuMemcpyAtoH(pair, chroma, 2 * 5, 2), CUDA_SUCCESS);
    CHECK("chroma element 5 is its U, V pair", pair[0] == uv[10] && pair[1] == uv[11]);
    EXPECT(copy_plane(chroma, uv_back, W, H / 2 + 1, 1, 0), CUDA_ERROR_INVALID_VALUE);
    // The frame itself is copied plane by plane.
    EXPECT(copy_plane(frame, y_back, 16, 1, 1, 0), CUDA_ERROR_INVALID_VALUE);

    // A texture reads the luma plane (kernels are gpu-tests' business).
    CUDA_RESOURCE_DESC resource = array_resource(luma);
    CUDA_TEXTURE_DESC texture = texture_desc(CU_TR_ADDRESS_MODE_WRAP, CU_TR_FILTER_MODE_POINT, 0);
    CUtexObject tex;
    EXPECT(cuTexObjectCreate(&tex, &resource, &texture, NULL), CUDA_SUCCESS);
    EXPECT(cuTexObjectDestroy(tex), CUDA_SUCCESS);

    // A plane goes with its array, and only with it.
    EXPECT(cuArrayDestroy(luma), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuArrayDestroy(frame), CUDA_SUCCESS);
    EXPECT(cuArray3DGetDescriptor(&got, chroma), CUDA_ERROR_INVALID_VALUE);
    free(y);
    free(uv);
    free(y_back);
    free(uv_back);
}

static CUarrayMapInfo tile_map(CUarray array, CUmemGenericAllocationHandle pool, unsigned int x, unsigned int y, unsigned int width,
                               unsigned int height) {
    CUarrayMapInfo info;
    memset(&info, 0, sizeof info);
    info.resourceType = CU_RESOURCE_TYPE_ARRAY;
    info.resource.array = array;
    info.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
    info.subresource.sparseLevel.offsetX = x;
    info.subresource.sparseLevel.offsetY = y;
    info.subresource.sparseLevel.extentWidth = width;
    info.subresource.sparseLevel.extentHeight = height;
    info.subresource.sparseLevel.extentDepth = 1;
    info.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
    info.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
    info.memHandle.memHandle = pool;
    info.deviceBitMask = 1;
    return info;
}

static void sparse(CUstream stream) {
    CUDA_ARRAY3D_DESCRIPTOR desc = {1000, 600, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE};
    CUarray array, dense, deferred, level;
    EXPECT(cuArray3DCreate(&array, &desc), CUDA_SUCCESS);
    CUDA_ARRAY_SPARSE_PROPERTIES props;
    memset(&props, 0xff, sizeof props);
    EXPECT(cuArrayGetSparseProperties(&props, array), CUDA_SUCCESS);
    printf("sparse tile: %u x %u x %u, mip tail %llu bytes\n", props.tileExtent.width, props.tileExtent.height, props.tileExtent.depth,
           props.miptailSize);
    EXPECT(cuArrayGetSparseProperties(NULL, array), CUDA_ERROR_INVALID_VALUE);
    CUDA_ARRAY3D_DESCRIPTOR plain = {8, 8, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    EXPECT(cuArray3DCreate(&dense, &plain), CUDA_SUCCESS);
    EXPECT(cuArrayGetSparseProperties(&props, dense), CUDA_ERROR_INVALID_VALUE);

    CUDA_ARRAY3D_DESCRIPTOR mip_desc = {1024, 1024, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE};
    CUmipmappedArray mipmap;
    EXPECT(cuMipmappedArrayCreate(&mipmap, &mip_desc, 8), CUDA_SUCCESS);
    EXPECT(cuMipmappedArrayGetSparseProperties(&props, mipmap), CUDA_SUCCESS);
    printf("mip tail from level %u, %llu bytes\n", props.miptailFirstLevel, props.miptailSize);
    EXPECT(cuMipmappedArrayGetLevel(&level, mipmap, 0), CUDA_SUCCESS);
    EXPECT(cuArrayGetSparseProperties(&props, level), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMipmappedArrayGetSparseProperties(&props, (CUmipmappedArray)array), CUDA_ERROR_INVALID_VALUE);

    CUDA_ARRAY3D_DESCRIPTOR deferred_desc = {100, 100, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_DEFERRED_MAPPING};
    EXPECT(cuArray3DCreate(&deferred, &deferred_desc), CUDA_SUCCESS);
    CUDA_ARRAY_MEMORY_REQUIREMENTS requirements;
    memset(&requirements, 0, sizeof requirements);
    EXPECT(cuArrayGetMemoryRequirements(&requirements, deferred, 0), CUDA_SUCCESS);
    printf("memory requirements: %zu bytes, aligned to %zu\n", requirements.size, requirements.alignment);
    EXPECT(cuArrayGetMemoryRequirements(&requirements, deferred, 1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuArrayGetMemoryRequirements(&requirements, array, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMipmappedArrayGetMemoryRequirements(&requirements, mipmap, 0), CUDA_ERROR_INVALID_VALUE);

    // A tile pool, and memory that is none.
    size_t granularity = 0;
    CUmemAllocationProp prop = device_memory_prop(0, &granularity);
    CUmemGenericAllocationHandle plain_memory, pool;
    EXPECT(cuMemCreate(&plain_memory, granularity, &prop, 0), CUDA_SUCCESS);
    prop.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
    EXPECT(cuMemCreate(&pool, granularity, &prop, 0), CUDA_SUCCESS);
    CUmemAllocationProp got;
    EXPECT(cuMemGetAllocationPropertiesFromHandle(&got, pool), CUDA_SUCCESS);
    // As the driver (580, H200) answers: the usage is not read back.
    CHECK("a tile pool's usage is not read back", got.allocFlags.usage == 0);
    prop.allocFlags.usage = 0x80;
    EXPECT(cuMemCreate(&plain_memory, granularity, &prop, 0), CUDA_ERROR_INVALID_VALUE);

    // Entries refused before any device sees them.
    CUarrayMapInfo good = tile_map(array, pool, 0, 0, 128, 128), bad;
    bad = good;
    bad.flags = 1;
    EXPECT(cuMemMapArrayAsync(&bad, 1, stream), CUDA_ERROR_INVALID_VALUE);
    bad = good;
    bad.memHandleType = 7;
    EXPECT(cuMemMapArrayAsync(&bad, 1, stream), CUDA_ERROR_INVALID_VALUE);
    bad = good;
    bad.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
    EXPECT(cuMemMapArrayAsync(&bad, 1, stream), CUDA_ERROR_INVALID_VALUE);
    bad = good;
    bad.deviceBitMask = 2;
    EXPECT(cuMemMapArrayAsync(&bad, 1, stream), CUDA_ERROR_INVALID_VALUE);
    bad = good;
    bad.memHandle.memHandle = plain_memory;
    EXPECT(cuMemMapArrayAsync(&bad, 1, stream), CUDA_ERROR_INVALID_VALUE);
    bad = good;
    bad.offset = 4096;
    EXPECT(cuMemMapArrayAsync(&bad, 1, stream), CUDA_ERROR_INVALID_VALUE);
    bad = tile_map(array, pool, 64, 0, 128, 128);
    EXPECT(cuMemMapArrayAsync(&bad, 1, stream), CUDA_ERROR_INVALID_VALUE);
    bad = tile_map(dense, pool, 0, 0, 8, 8);
    EXPECT(cuMemMapArrayAsync(&bad, 1, stream), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMapArrayAsync(&good, 0, stream), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMapArrayAsync(NULL, 1, stream), CUDA_ERROR_INVALID_VALUE);
    // A valid entry reaches the device: the emulated device maps no memory into arrays.
    CUresult mapped = cuMemMapArrayAsync(&good, 1, stream);
    printf("tile map on this device: %s\n", name_of(mapped));
    CUarrayMapInfo whole = good;
    whole.resource.array = deferred;
    whole.subresourceType = 99;  // ignored for a deferred-mapping array
    printf("deferred map on this device: %s\n", name_of(cuMemMapArrayAsync_ptsz(&whole, 1, stream)));
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    // Nothing is mapped into the sparse array here, so no copy into it can mean anything: refused
    // at the call.
    static float tile[128 * 128];
    CUDA_MEMCPY2D into = copy_2d(host_side(tile, 128 * sizeof(float), 0), array_side(array), 128 * sizeof(float), 128);
    printf("copy into a sparse array on this device: %s\n", name_of(cuMemcpy2D(&into)));

    EXPECT(cuArrayDestroy(level), CUDA_ERROR_INVALID_VALUE);
    RELEASE(MIPMAP(mipmap), ARRAY(array), ARRAY(dense), ARRAY(deferred), PHYSICAL(pool), PHYSICAL(plain_memory));
}

static void decompression_arguments(CUstream stream, CUmemDecompressParams params[2], CUmemDecompressParams bad[2]);

static void decompression(CUstream stream) {
    CUdeviceptr buffer;
    EXPECT(cuMemAlloc(&buffer, 1 << 16), CUDA_SUCCESS);
    CUmemDecompressParams params[2];
    memset(params, 0, sizeof params);
    for (int i = 0; i < 2; i++) {
        params[i].srcNumBytes = 1000;
        params[i].dstNumBytes = 4096;
        params[i].src = (const void *)(uintptr_t)(buffer + i * 8192);
        params[i].dst = (void *)(uintptr_t)(buffer + 16384 + i * 8192);
        params[i].dstActBytes = (cuuint32_t *)(uintptr_t)(buffer + 65536 - 16 + i * 4);
        params[i].algo = CU_MEM_DECOMPRESS_ALGORITHM_DEFLATE;
    }
    size_t index = 77;
    CUmemDecompressParams bad[2];
    memcpy(bad, params, 2 * sizeof *params);
    static unsigned char host[4096];
    bad[1].src = host;
    CUdevice device;
    int engine = 0;
    EXPECT(cuCtxGetDevice(&device), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&engine, CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK, device), CUDA_SUCCESS);
    if (engine == 0) {
        // As the driver on a GPU without the engine (an H200): every batch is refused, even an
        // empty one, its arguments unread.
        EXPECT(cuMemBatchDecompressAsync(bad, 2, 0, &index, stream), CUDA_ERROR_NOT_SUPPORTED);
        EXPECT(cuMemBatchDecompressAsync(params, 0, 0, &index, stream), CUDA_ERROR_NOT_SUPPORTED);
        EXPECT(cuMemBatchDecompressAsync(NULL, 0, 1, &index, stream), CUDA_ERROR_NOT_SUPPORTED);
        CHECK("no decompression engine: every batch refused unread, index untouched", index == 77);
    } else {
        decompression_arguments(stream, params, bad);
    }
    index = 77;
    CUresult answered = cuMemBatchDecompressAsync_ptsz(params, 2, 0, &index, stream);
    printf("decompression on this device: %s, index %s\n", name_of(answered),
           index == 77 ? "untouched" : index == SIZE_MAX ? "SIZE_MAX" : "another");
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuMemFree(buffer), CUDA_SUCCESS);
}

/// A device with the engine checks each batch's arguments: `bad` is `params` with host memory as
/// operation 1's source.
static void decompression_arguments(CUstream stream, CUmemDecompressParams params[2], CUmemDecompressParams bad[2]) {
    size_t index = 77;
    EXPECT(cuMemBatchDecompressAsync(bad, 2, 0, &index, stream), CUDA_ERROR_INVALID_VALUE);
    CHECK("host memory to decompress: refused, index 1", index == 1);
    memcpy(bad, params, 2 * sizeof *params);
    bad[0].padding[3] = 1;
    EXPECT(cuMemBatchDecompressAsync(bad, 2, 0, &index, stream), CUDA_ERROR_INVALID_VALUE);
    CHECK("padding not zeroed: refused, index 0", index == 0);
    EXPECT(cuMemBatchDecompressAsync(params, 2, 1, &index, stream), CUDA_ERROR_INVALID_VALUE);
    CHECK("flags: refused, the batch as a whole", index == SIZE_MAX);
    EXPECT(cuMemBatchDecompressAsync(params, 0, 0, NULL, stream), CUDA_ERROR_INVALID_VALUE);
    memcpy(bad, params, 2 * sizeof *params);
    bad[1].algo = (CUmemDecompressAlgorithm)8;
    EXPECT(cuMemBatchDecompressAsync(bad, 2, 0, NULL, stream), CUDA_ERROR_INVALID_VALUE);
}

int main(void) {
    CUdevice device;
    use_primary_context(&device);
    CUstream stream;
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    planar(0);
    planar(stream);
    CUDA_ARRAY3D_DESCRIPTOR nv12 = {64, 32, 0, CU_AD_FORMAT_NV12, 3, 0};
    CUmipmappedArray refused;
    EXPECT(cuMipmappedArrayCreate(&refused, &nv12, 2), CUDA_ERROR_NOT_SUPPORTED);
    sparse(stream);
    decompression(stream);

    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    return finish();
}

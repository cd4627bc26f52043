// Planar, sparse and deferred-mapping CUDA arrays and hardware decompression, through the driver API
// (linked with -lcuda, like vmm) and the runtime: an NV12 array (cuArray3DCreate, three channels)
// and its two planes (cuArrayGetPlane: descriptors printed, the same array when asked again),
// host rows copied into each plane and back byte for byte, a texture over the luma plane read by a
// kernel (every texel), one over the chroma plane (U, V pairs), the planes going with their array;
// the runtime's cudaArrayGetPlane of an NV12 array made with cudaMallocArray (plane infos printed);
// a sparse 2D array of floats with surface load/store: its sparse properties printed, a tile pool
// (cuMemCreate with CU_MEM_CREATE_USAGE_TILE_POOL), one cuMemMapArrayAsync mapping the first row of
// tiles and one more tile below it at another offset of the pool, a kernel writing every mapped
// texel through a surface, the mapped region copied back and checked, host rows copied into a
// mapped tile and read back, then everything unmapped; a sparse mipmapped array's properties (mip
// tail) printed; a deferred-mapping array: its memory requirements printed, mapped whole onto a
// pool, written and read back, unmapped; a deferred-mapping mipmapped array's requirements
// printed; cuMemBatchDecompressAsync of a small Snappy and DEFLATE input where the device
// decompresses (CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK), else the error the driver
// answers (its name and index printed: Hopper has no decompression engine). Built with -lcuda.
#include <vector>

#include "driver_check.h"

static __global__ void read_luma(cudaTextureObject_t tex, unsigned char *out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<unsigned char>(tex, x + 0.5f, y + 0.5f);
}

static __global__ void read_chroma(cudaTextureObject_t tex, uchar2 *out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<uchar2>(tex, x + 0.5f, y + 0.5f);
}

static __host__ __device__ float texel(int x, int y, int seed) { return (float)(x * 3 + y * 1000 + seed); }

// Writes texel(x, y, seed) over the rectangle at (x0, y0) of width w and height h.
static __global__ void write_rect(cudaSurfaceObject_t surf, int x0, int y0, int w, int h, int seed) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) surf2Dwrite(texel(x0 + x, y0 + y, seed), surf, (x0 + x) * (int)sizeof(float), y0 + y);
}

static CUarrayMapInfo map_level(CUarray array, unsigned x, unsigned y, unsigned w, unsigned h, CUmemGenericAllocationHandle pool,
                                unsigned long long offset, CUdevice dev) {
    CUarrayMapInfo info;
    memset(&info, 0, sizeof info);
    info.resourceType = CU_RESOURCE_TYPE_ARRAY;
    info.resource.array = array;
    info.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
    info.subresource.sparseLevel.offsetX = x;
    info.subresource.sparseLevel.offsetY = y;
    info.subresource.sparseLevel.extentWidth = w;
    info.subresource.sparseLevel.extentHeight = h;
    info.subresource.sparseLevel.extentDepth = 1;
    info.memOperationType = pool ? CU_MEM_OPERATION_TYPE_MAP : CU_MEM_OPERATION_TYPE_UNMAP;
    info.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
    info.memHandle.memHandle = pool;
    info.offset = offset;
    info.deviceBitMask = 1u << dev;
    return info;
}

static CUtexObject point_texture(CUarray array) {
    CUDA_RESOURCE_DESC res;
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = array;
    CUDA_TEXTURE_DESC td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
    td.filterMode = CU_TR_FILTER_MODE_POINT;
    td.flags = CU_TRSF_READ_AS_INTEGER;
    CUtexObject tex = 0;
    CHECK_CU(cuTexObjectCreate(&tex, &res, &td, nullptr));
    return tex;
}

static void print_desc(const char *what, CUarray array) {
    CUDA_ARRAY3D_DESCRIPTOR d;
    CHECK_CU(cuArray3DGetDescriptor(&d, array));
    printf("%s: %zu x %zu x %zu, format 0x%x, %u channel(s), flags 0x%x\n", what, d.Width, d.Height, d.Depth, (unsigned)d.Format,
           d.NumChannels, d.Flags);
}

static void planar() {
    const int W = 256, H = 128;
    // The driver documents no descriptor for NV12 arrays; each candidate's answer is printed (the
    // same GPU and driver answer the same natively and through Flyt), the first accepted is used.
    const CUDA_ARRAY3D_DESCRIPTOR candidates[] = {
        {W, H, 0, CU_AD_FORMAT_NV12, 3, 0},
        {W, H, 0, CU_AD_FORMAT_NV12, 3, CUDA_ARRAY3D_SURFACE_LDST},
        {W, H, 0, CU_AD_FORMAT_NV12, 1, 0},
        {W, H, 0, CU_AD_FORMAT_NV12, 2, 0},
    };
    CUarray frame = nullptr, luma, chroma, again;
    for (const CUDA_ARRAY3D_DESCRIPTOR &desc : candidates) {
        CUresult made = cuArray3DCreate(&frame, &desc);
        const char *made_name = "?";
        cuGetErrorName(made, &made_name);
        printf("NV12 array of %u channel(s), flags 0x%x: %s\n", desc.NumChannels, desc.Flags, made_name);
        if (made == CUDA_SUCCESS) break;
        frame = nullptr;
    }
    if (!frame) {
        printf("no NV12 array on this GPU: planes not tried\n");
        return;
    }
    print_desc("NV12 array", frame);
    CHECK_CU(cuArrayGetPlane(&luma, frame, 0));
    CHECK_CU(cuArrayGetPlane(&chroma, frame, 1));
    print_desc("plane 0", luma);
    print_desc("plane 1", chroma);
    CHECK_CU(cuArrayGetPlane(&again, frame, 0));
    printf("plane 0 asked again: %s\n", again == luma ? "the same array" : "another array");
    CUresult third = cuArrayGetPlane(&again, frame, 2);
    const char *name = "?";
    cuGetErrorName(third, &name);
    printf("plane 2: %s\n", name);
    EXPECT(third != CUDA_SUCCESS, "an NV12 array has two planes");

    std::vector<unsigned char> y(W * H), uv(W * (H / 2)), y_back(W * H), uv_back(W * (H / 2));
    fill_pattern(y.data(), y.size(), 1);
    fill_pattern(uv.data(), uv.size(), 2);
    CHECK(cudaMemcpy2DToArray((cudaArray_t)luma, 0, 0, y.data(), W, W, H, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DToArray((cudaArray_t)chroma, 0, 0, uv.data(), W, W, H / 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DFromArray(y_back.data(), W, (cudaArray_t)luma, 0, 0, W, H, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy2DFromArray(uv_back.data(), W, (cudaArray_t)chroma, 0, 0, W, H / 2, cudaMemcpyDeviceToHost));
    printf("luma plane round trip: %s\n", y == y_back ? "equal" : "DIFFERENT");
    printf("chroma plane round trip: %s\n", uv == uv_back ? "equal" : "DIFFERENT");
    EXPECT(y == y_back && uv == uv_back, "plane round trips");

    // Textures over each plane, read by kernels at every texel centre.
    CUtexObject luma_tex = point_texture(luma), chroma_tex = point_texture(chroma);
    unsigned char *dy;
    uchar2 *duv;
    CHECK(cudaMalloc(&dy, W * H));
    CHECK(cudaMalloc(&duv, (W / 2) * (H / 2) * sizeof(uchar2)));
    dim3 block(16, 16);
    read_luma<<<dim3(W / 16, H / 16), block>>>(luma_tex, dy, W, H);
    CHECK_LAUNCH();
    read_chroma<<<dim3(W / 32, H / 32), block>>>(chroma_tex, duv, W / 2, H / 2);
    CHECK_LAUNCH();
    std::fill(y_back.begin(), y_back.end(), 0);
    std::fill(uv_back.begin(), uv_back.end(), 0);
    CHECK(cudaMemcpy(y_back.data(), dy, W * H, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(uv_back.data(), duv, uv_back.size(), cudaMemcpyDeviceToHost));
    printf("texture over the luma plane reads every texel: %s\n", y == y_back ? "yes" : "NO");
    printf("texture over the chroma plane reads every U, V pair: %s\n", uv == uv_back ? "yes" : "NO");
    EXPECT(y == y_back && uv == uv_back, "texture reads of the planes");
    CHECK_CU(cuTexObjectDestroy(luma_tex));
    CHECK_CU(cuTexObjectDestroy(chroma_tex));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(duv));
    CHECK_CU(cuArrayDestroy(frame));

    // The runtime's own NV12 array and planes.
    cudaChannelFormatDesc nv12 = cudaCreateChannelDesc(8, 8, 8, 0, cudaChannelFormatKindNV12);
    cudaArray_t rt_frame, rt_plane;
    CHECK(cudaMallocArray(&rt_frame, &nv12, 64, 32));
    for (unsigned plane = 0; plane < 2; plane++) {
        CHECK(cudaArrayGetPlane(&rt_plane, rt_frame, plane));
        cudaChannelFormatDesc got;
        cudaExtent extent;
        unsigned flags;
        CHECK(cudaArrayGetInfo(&got, &extent, &flags, rt_plane));
        printf("runtime plane %u: %zu x %zu, channels %d %d %d %d, kind %d\n", plane, extent.width, extent.height, got.x, got.y, got.z,
               got.w, (int)got.f);
    }
    CHECK(cudaFreeArray(rt_frame));
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Prints `<what> supported: <attribute's value>`; whether it is nonzero.
static bool supported(CUdevice dev, CUdevice_attribute attribute, const char *what) {
    int value = 0;
    CHECK_CU(cuDeviceGetAttribute(&value, attribute, dev));
    printf("%s supported: %d\n", what, value);
    return value != 0;
}

static void sparse(CUdevice dev, cudaStream_t stream, size_t granularity) {
    if (!supported(dev, CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED, "sparse arrays")) return;
    const int W = 1024, H = 512;
    // As for NV12: each candidate's answer is printed, the first accepted is used (the H200's
    // driver 580 refused the first natively).
    const CUDA_ARRAY3D_DESCRIPTOR candidates[] = {
        {W, H, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_SURFACE_LDST},
        {W, H, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE},
        {W, H, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, CUDA_ARRAY3D_SPARSE},
    };
    CUarray array = nullptr;
    bool surface = false;
    for (const CUDA_ARRAY3D_DESCRIPTOR &desc : candidates) {
        CUresult made = cuArray3DCreate(&array, &desc);
        const char *made_name = "?";
        cuGetErrorName(made, &made_name);
        printf("sparse array, format 0x%x, %u channel(s), flags 0x%x: %s\n", (unsigned)desc.Format, desc.NumChannels, desc.Flags,
               made_name);
        if (made == CUDA_SUCCESS) {
            surface = desc.Flags & CUDA_ARRAY3D_SURFACE_LDST;
            if (desc.Format != CU_AD_FORMAT_FLOAT) {
                printf("sparse arrays of floats refused: maps not tried\n");
                CHECK_CU(cuArrayDestroy(array));
                return;
            }
            break;
        }
        array = nullptr;
    }
    if (!array) {
        printf("no sparse array on this GPU: maps not tried\n");
        return;
    }
    CUDA_ARRAY_SPARSE_PROPERTIES props;
    CHECK_CU(cuArrayGetSparseProperties(&props, array));
    printf("sparse properties: tile %u x %u x %u, mip tail from level %u, %llu bytes, flags 0x%x\n", props.tileExtent.width,
           props.tileExtent.height, props.tileExtent.depth, props.miptailFirstLevel, props.miptailSize, props.flags);
    const unsigned tw = props.tileExtent.width, th = props.tileExtent.height;
    const unsigned row_tiles = W / tw;

    // A tile pool of whole granules, enough for a row of tiles and one more.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
    const size_t tile_bytes = 64 << 10;
    size_t pool_size = round_up((row_tiles + 1) * tile_bytes, granularity);
    CUmemGenericAllocationHandle pool;
    CHECK_CU(cuMemCreate(&pool, pool_size, &prop, 0));
    CUmemAllocationProp got = {};
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&got, pool));
    printf("tile pool usage: 0x%x\n", (unsigned)got.allocFlags.usage);

    // The first row of tiles at the pool's start, the tile below the first at the next free tile.
    CUarrayMapInfo maps[2] = {map_level(array, 0, 0, W, th, pool, 0, dev),
                              map_level(array, 0, th, tw, th, pool, row_tiles * tile_bytes, dev)};
    CHECK_CU(cuMemMapArrayAsync(maps, 2, (CUstream)stream));
    printf("mapped: %u tiles of row 0 and one of row 1\n", row_tiles);

    cudaSurfaceObject_t surf = 0;
    if (surface) {
        cudaResourceDesc res = {};
        res.resType = cudaResourceTypeArray;
        res.res.array.array = (cudaArray_t)array;
        CHECK(cudaCreateSurfaceObject(&surf, &res));
        dim3 block(16, 16);
        write_rect<<<dim3(W / 16, th / 16), block, 0, stream>>>(surf, 0, 0, W, th, 7);
        CHECK_LAUNCH();
        write_rect<<<dim3(tw / 16, th / 16), block, 0, stream>>>(surf, 0, th, tw, th, 7);
        CHECK_LAUNCH();
    } else {
        // No surface: the same texels go in by copies.
        std::vector<float> rect(W * 2 * th);
        for (unsigned y = 0; y < 2 * th; y++)
            for (int x = 0; x < W; x++) rect[y * W + x] = texel(x, y, 7);
        CHECK(cudaMemcpy2DToArrayAsync((cudaArray_t)array, 0, 0, rect.data(), W * sizeof(float), W * sizeof(float), th,
                                       cudaMemcpyHostToDevice, stream));
        CHECK(cudaMemcpy2DToArrayAsync((cudaArray_t)array, 0, th, rect.data() + W * th, W * sizeof(float), tw * sizeof(float), th,
                                       cudaMemcpyHostToDevice, stream));
    }
    CHECK(cudaStreamSynchronize(stream));
    std::vector<float> back(W * th);
    CHECK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), (cudaArray_t)array, 0, 0, W * sizeof(float), th, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (unsigned y = 0; y < th; y++)
        for (int x = 0; x < W; x++) bad += back[y * W + x] != texel(x, y, 7);
    std::vector<float> below(tw * th);
    CHECK(cudaMemcpy2DFromArray(below.data(), tw * sizeof(float), (cudaArray_t)array, 0, th, tw * sizeof(float), th,
                                cudaMemcpyDeviceToHost));
    for (unsigned y = 0; y < th; y++)
        for (unsigned x = 0; x < tw; x++) bad += below[y * tw + x] != texel(x, th + y, 7);
    printf("%s every mapped texel: %s\n", surface ? "kernel wrote through a surface" : "copies wrote", bad == 0 ? "yes" : "NO");
    EXPECT(bad == 0, "%zu mapped texels wrong", bad);

    // Host rows into the tile of row 1, back out.
    std::vector<float> rows(tw * th), rows_back(tw * th);
    for (size_t i = 0; i < rows.size(); i++) rows[i] = (float)(i % 9973) + 0.5f;
    CHECK(cudaMemcpy2DToArray((cudaArray_t)array, 0, th, rows.data(), tw * sizeof(float), tw * sizeof(float), th, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DFromArray(rows_back.data(), tw * sizeof(float), (cudaArray_t)array, 0, th, tw * sizeof(float), th,
                                cudaMemcpyDeviceToHost));
    printf("copy into a mapped tile and back: %s\n", rows == rows_back ? "equal" : "DIFFERENT");
    EXPECT(rows == rows_back, "copy through a mapped tile");

    if (surface) CHECK(cudaDestroySurfaceObject(surf));
    CUarrayMapInfo unmaps[2] = {map_level(array, 0, 0, W, th, 0, 0, dev), map_level(array, 0, th, tw, th, 0, 0, dev)};
    CHECK_CU(cuMemMapArrayAsync(unmaps, 2, (CUstream)stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("unmapped\n");
    CHECK_CU(cuMemRelease(pool));
    CHECK_CU(cuArrayDestroy(array));

    // A sparse mipmapped array: its mip tail.
    CUDA_ARRAY3D_DESCRIPTOR mip_desc = {1024, 1024, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE};
    CUmipmappedArray mipmap;
    CUresult mip_made = cuMipmappedArrayCreate(&mipmap, &mip_desc, 11);
    const char *mip_name = "?";
    cuGetErrorName(mip_made, &mip_name);
    printf("sparse mipmapped array: %s\n", mip_name);
    if (mip_made != CUDA_SUCCESS) return;
    CHECK_CU(cuMipmappedArrayGetSparseProperties(&props, mipmap));
    printf("sparse mipmapped properties: tile %u x %u x %u, mip tail from level %u, %llu bytes, flags 0x%x\n", props.tileExtent.width,
           props.tileExtent.height, props.tileExtent.depth, props.miptailFirstLevel, props.miptailSize, props.flags);
    CHECK_CU(cuMipmappedArrayDestroy(mipmap));
}

static void deferred(CUdevice dev, cudaStream_t stream, size_t granularity) {
    if (!supported(dev, CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED, "deferred-mapping arrays")) return;
    const int W = 300, H = 200;
    CUDA_ARRAY3D_DESCRIPTOR desc = {W, H, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_DEFERRED_MAPPING};
    CUarray array;
    CUresult made = cuArray3DCreate(&array, &desc);
    const char *made_name = "?";
    cuGetErrorName(made, &made_name);
    printf("deferred-mapping array: %s\n", made_name);
    if (made != CUDA_SUCCESS) return;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    CHECK_CU(cuArrayGetMemoryRequirements(&req, array, dev));
    printf("deferred-mapping array memory requirements: %zu bytes, alignment %zu\n", req.size, req.alignment);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
    CUmemGenericAllocationHandle pool;
    CHECK_CU(cuMemCreate(&pool, round_up(req.size, granularity), &prop, 0));
    CUarrayMapInfo whole = map_level(array, 0, 0, 0, 0, pool, 0, dev);
    CHECK_CU(cuMemMapArrayAsync(&whole, 1, (CUstream)stream));
    std::vector<float> rows(W * H), rows_back(W * H);
    for (size_t i = 0; i < rows.size(); i++) rows[i] = (float)i * 0.25f;
    CHECK(cudaMemcpy2DToArrayAsync((cudaArray_t)array, 0, 0, rows.data(), W * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice,
                                   stream));
    CHECK(cudaMemcpy2DFromArrayAsync(rows_back.data(), W * sizeof(float), (cudaArray_t)array, 0, 0, W * sizeof(float), H,
                                     cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("deferred-mapping array mapped whole, round trip: %s\n", rows == rows_back ? "equal" : "DIFFERENT");
    EXPECT(rows == rows_back, "deferred-mapping array round trip");
    CUarrayMapInfo unmap = map_level(array, 0, 0, 0, 0, 0, 0, dev);
    CHECK_CU(cuMemMapArrayAsync(&unmap, 1, (CUstream)stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK_CU(cuMemRelease(pool));
    CHECK_CU(cuArrayDestroy(array));

    CUDA_ARRAY3D_DESCRIPTOR mip_desc = {512, 512, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, CUDA_ARRAY3D_DEFERRED_MAPPING};
    CUmipmappedArray mipmap;
    CHECK_CU(cuMipmappedArrayCreate(&mipmap, &mip_desc, 4));
    CHECK_CU(cuMipmappedArrayGetMemoryRequirements(&req, mipmap, dev));
    printf("deferred-mapping mipmapped array memory requirements: %zu bytes, alignment %zu\n", req.size, req.alignment);
    CHECK_CU(cuMipmappedArrayDestroy(mipmap));
}

// "Hello, Flyt! Hello, Flyt!" (25 bytes) in Snappy's raw format (a varint length, one literal) and
// as a raw DEFLATE stored block.
static const char PLAIN[] = "Hello, Flyt! Hello, Flyt!";
static const unsigned char SNAPPY[] = {25, (25 - 1) << 2, 'H', 'e', 'l', 'l', 'o', ',', ' ', 'F', 'l', 'y', 't', '!', ' ',
                                       'H', 'e', 'l', 'l', 'o', ',', ' ', 'F', 'l', 'y', 't', '!'};
static const unsigned char DEFLATE[] = {0x01, 25, 0, 0xe6, 0xff, 'H', 'e', 'l', 'l', 'o', ',', ' ', 'F', 'l', 'y', 't', '!', ' ',
                                        'H', 'e', 'l', 'l', 'o', ',', ' ', 'F', 'l', 'y', 't', '!'};

static void decompress_one(const char *what, const unsigned char *input, size_t len, CUmemDecompressAlgorithm algo, bool expected,
                           cudaStream_t stream) {
    unsigned char *src, *dst;
    uint32_t *actual;
    CHECK(cudaMalloc(&src, 256));
    CHECK(cudaMalloc(&dst, 256));
    CHECK(cudaMalloc(&actual, sizeof(uint32_t)));
    CHECK(cudaMemcpy(src, input, len, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dst, 0, 256));
    CHECK(cudaMemset(actual, 0, sizeof(uint32_t)));
    CUmemDecompressParams params;
    memset(&params, 0, sizeof params);
    params.srcNumBytes = len;
    params.dstNumBytes = sizeof PLAIN - 1;
    params.dstActBytes = actual;
    params.src = src;
    params.dst = dst;
    params.algo = algo;
    size_t index = 12345;
    CUresult r = cuMemBatchDecompressAsync(&params, 1, 0, &index, (CUstream)stream);
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("%s: %s", what, name);
    if (r != CUDA_SUCCESS) {
        printf(", error index %s\n", index == SIZE_MAX ? "SIZE_MAX" : index == 12345 ? "untouched" : "of an operation");
        EXPECT(!expected, "%s: the device reports the algorithm but answered %s", what, name);
    } else {
        CHECK(cudaStreamSynchronize(stream));
        char out[256] = {};
        uint32_t written = 0;
        CHECK(cudaMemcpy(out, dst, sizeof PLAIN - 1, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(&written, actual, sizeof written, cudaMemcpyDeviceToHost));
        bool ok = written == sizeof PLAIN - 1 && memcmp(out, PLAIN, sizeof PLAIN - 1) == 0;
        printf(", %u bytes written, %s\n", written, ok ? "the text" : "WRONG");
        EXPECT(ok, "%s decompressed wrongly", what);
    }
    CHECK(cudaFree(src));
    CHECK(cudaFree(dst));
    CHECK(cudaFree(actual));
}

static void decompression(CUdevice dev, cudaStream_t stream) {
    int mask = 0;
    CHECK_CU(cuDeviceGetAttribute(&mask, CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK, dev));
    printf("decompression algorithms: 0x%x\n", mask);
    decompress_one("Snappy batch", SNAPPY, sizeof SNAPPY, CU_MEM_DECOMPRESS_ALGORITHM_SNAPPY, mask & CU_MEM_DECOMPRESS_ALGORITHM_SNAPPY,
                   stream);
    decompress_one("DEFLATE batch", DEFLATE, sizeof DEFLATE, CU_MEM_DECOMPRESS_ALGORITHM_DEFLATE,
                   mask & CU_MEM_DECOMPRESS_ALGORITHM_DEFLATE, stream);
}

int main() {
    CUdevice dev = start_on_primary_context("arrays_planar_sparse");
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t granularity = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));

    planar();
    sparse(dev, stream, granularity);
    deferred(dev, stream, granularity);
    decompression(dev, stream);

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaDeviceSynchronize());
    return test_finish();
}

// Pitched memory, 3D copies, 2D memsets, arrays, mipmapped arrays, texture and surface objects
// through Flyt's libcuda.so.1 on the emulated device (no kernels: texture reads are gpu-tests'
// business). Every copy's bytes are checked against a host reference, including bytes that
// must stay untouched; large boxes cross the copy chunk and the shared-memory slot, so they
// travel as several pieces.
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + 3); }

// A 3D round trip: host box -> pitched device memory at an offset -> another host layout.
static void pitched_3d(CUstream stream, int pinned) {
    const size_t W = 1000, H = 70, D = 40, PITCH_ROWS = 80;  // 2.8 MB box, rows of 1000 bytes
    size_t pitch = 0;
    CUdeviceptr dev = 0;
    EXPECT(cuMemAllocPitch(&dev, &pitch, W + 24, PITCH_ROWS * (D + 1), 4), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(dev, 0xab, pitch * PITCH_ROWS * (D + 1)), CUDA_SUCCESS);
    size_t host_len = W * H * D;
    unsigned char *src, *back;
    if (pinned) {
        EXPECT(cuMemAllocHost((void **)&src, host_len), CUDA_SUCCESS);
        EXPECT(cuMemAllocHost((void **)&back, host_len + 4096), CUDA_SUCCESS);
    } else {
        src = malloc(host_len);
        back = malloc(host_len + 4096);
    }
    for (size_t i = 0; i < host_len; i++) src[i] = pattern(i);
    memset(back, 0x11, host_len + 4096);

    CUDA_MEMCPY3D c = copy_3d(host_side(src, W, H), box_at(device_side(dev, pitch, PITCH_ROWS), 24, 5, 1), W, H, D);
    EXPECT(stream ? cuMemcpy3DAsync(&c, stream) : cuMemcpy3D(&c), CUDA_SUCCESS);

    // Back into a host layout with a wider pitch (1024) and taller slices (72 rows).
    size_t out_len = 1024 * 72 * D;
    unsigned char *out = malloc(out_len);
    memset(out, 0x22, out_len);
    CUDA_MEMCPY3D r = copy_3d(box_at(device_side(dev, pitch, PITCH_ROWS), 24, 5, 1), host_side(out, 1024, 72), W, H, D);
    EXPECT(stream ? cuMemcpy3DAsync(&r, stream) : cuMemcpy3D(&r), CUDA_SUCCESS);
    if (stream) EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    int same = 1, untouched = 1;
    for (size_t z = 0; z < D; z++)
        for (size_t y = 0; y < 72; y++)
            for (size_t x = 0; x < 1024; x++) {
                unsigned char got = out[(z * 72 + y) * 1024 + x];
                if (y < H && x < W) same &= got == src[(z * H + y) * W + x];
                else untouched &= got == 0x22;
            }
    CHECK(pinned ? "3D box through pitched memory, pinned host" : "3D box through pitched memory, pageable host", same);
    CHECK("host padding untouched", untouched);
    // The device bytes around the box are as set: one row above it.
    unsigned char row[64];
    EXPECT(cuMemcpyDtoH(row, dev + pitch * PITCH_ROWS + 4 * pitch, sizeof row), CUDA_SUCCESS);
    CHECK("device row above the box untouched", memcmp(row, "\xab\xab\xab\xab\xab\xab\xab\xab", 8) == 0);
    // Refused at the call: a box past the end of the allocation.
    c.dstZ = 2;
    EXPECT(cuMemcpy3D(&c), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree(dev), CUDA_SUCCESS);
    if (pinned) {
        EXPECT(cuMemFreeHost(src), CUDA_SUCCESS);
        EXPECT(cuMemFreeHost(back), CUDA_SUCCESS);
    } else {
        free(src);
        free(back);
    }
    free(out);
}

int main(void) {
    CUdevice device;
    use_primary_context(&device);
    CUstream stream = new_stream(CU_STREAM_NON_BLOCKING);

    // Pitched memory and a 2D memset of a sub-rectangle.
    size_t pitch = 0;
    CUdeviceptr pitched = 0;
    EXPECT(cuMemAllocPitch(&pitched, &pitch, 100, 8, 4), CUDA_SUCCESS);
    printf("pitch for 100-byte rows: %zu\n", pitch);
    EXPECT(cuMemAllocPitch(&pitched, &pitch, 100, 8, 3), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocPitch(&pitched, &pitch, 100, 8, 4), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(pitched, 0, pitch * 8), CUDA_SUCCESS);
    EXPECT(cuMemsetD2D32(pitched + pitch + 16, pitch, 0x01020304, 10, 3), CUDA_SUCCESS);
    EXPECT(cuMemsetD2D16Async(pitched + 5 * pitch, pitch, 0xbeef, 4, 2, stream), CUDA_SUCCESS);
    EXPECT(cuMemsetD2D8(pitched, pitch, 1, 600, 2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    unsigned int words[8 * 128];
    EXPECT(cuMemcpyDtoH(words, pitched, pitch * 8), CUDA_SUCCESS);
    unsigned int per_row = (unsigned int)(pitch / 4);
    CHECK("2D memset fills its rectangle",
          words[per_row + 4] == 0x01020304 && words[per_row + 13] == 0x01020304 && words[3 * per_row + 13] == 0x01020304);
    CHECK("2D memset leaves the rest", words[per_row + 3] == 0 && words[per_row + 14] == 0 && words[4 * per_row + 4] == 0);
    CHECK("16-bit 2D memset", words[5 * per_row] == 0xbeefbeef && words[6 * per_row + 1] == 0xbeefbeef && words[6 * per_row + 2] == 0);

    pitched_3d(0, 0);
    pitched_3d(stream, 1);

    // A 3D array of 64 x 32 x 4 float2, host -> array -> pitched -> host.
    CUDA_ARRAY3D_DESCRIPTOR d3 = {64, 32, 4, CU_AD_FORMAT_FLOAT, 2, CUDA_ARRAY3D_SURFACE_LDST};
    CUarray volume;
    EXPECT(cuArray3DCreate(&volume, &d3), CUDA_SUCCESS);
    CUDA_ARRAY3D_DESCRIPTOR got3;
    EXPECT(cuArray3DGetDescriptor(&got3, volume), CUDA_SUCCESS);
    CHECK("3D descriptor read back", got3.Width == 64 && got3.Height == 32 && got3.Depth == 4 && got3.Format == CU_AD_FORMAT_FLOAT &&
                                         got3.NumChannels == 2 && got3.Flags == CUDA_ARRAY3D_SURFACE_LDST);
    size_t row_bytes = 64 * 8, volume_len = row_bytes * 32 * 4;
    unsigned char *vol = malloc(volume_len), *vol_back = malloc(volume_len);
    for (size_t i = 0; i < volume_len; i++) vol[i] = pattern(i * 3);
    CUDA_MEMCPY3D c = copy_3d(host_side(vol, row_bytes, 32), array_side(volume), row_bytes, 32, 4);
    EXPECT(cuMemcpy3D(&c), CUDA_SUCCESS);
    CUdeviceptr flat = 0;
    EXPECT(cuMemAlloc(&flat, volume_len), CUDA_SUCCESS);
    CUDA_MEMCPY3D a = copy_3d(array_side(volume), device_side(flat, row_bytes, 32), row_bytes, 32, 4);
    EXPECT(cuMemcpy3DAsync(&a, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(vol_back, flat, volume_len), CUDA_SUCCESS);
    CHECK("host -> 3D array -> device", memcmp(vol, vol_back, volume_len) == 0);
    // One slice, rows 3..5, columns 8..15 (in elements) of the array straight to the host.
    unsigned char part[3 * 64];
    CUDA_MEMCPY3D p = copy_3d(box_at(array_side(volume), 64, 3, 2), host_side(part, 64, 3), 64, 3, 1);
    EXPECT(cuMemcpy3D(&p), CUDA_SUCCESS);
    int part_ok = 1;
    for (size_t y = 0; y < 3; y++) part_ok &= memcmp(part + y * 64, vol + (2 * 32 + 3 + y) * row_bytes + 64, 64) == 0;
    CHECK("sub-box of a 3D array to the host", part_ok);
    p.srcZ = 4;
    EXPECT(cuMemcpy3D(&p), CUDA_ERROR_INVALID_VALUE);

    // 2D arrays: 1D copies in and out, array to array, a 2D copy with an array side.
    CUDA_ARRAY_DESCRIPTOR d2 = {16, 4, CU_AD_FORMAT_UNSIGNED_INT32, 1};
    CUarray plane, twin;
    EXPECT(cuArrayCreate(&plane, &d2), CUDA_SUCCESS);
    EXPECT(cuArrayCreate(&twin, &d2), CUDA_SUCCESS);
    CUDA_ARRAY_DESCRIPTOR got2;
    EXPECT(cuArrayGetDescriptor(&got2, plane), CUDA_SUCCESS);
    CHECK("2D descriptor read back", got2.Width == 16 && got2.Height == 4 && got2.Format == CU_AD_FORMAT_UNSIGNED_INT32 && got2.NumChannels == 1);
    unsigned int cells[64], cells_back[64];
    for (unsigned int i = 0; i < 64; i++) cells[i] = i * 1000 + 7;
    CUDA_MEMCPY2D m = copy_2d(host_side(cells, 64, 0), array_side(plane), 64, 4);
    EXPECT(cuMemcpy2D(&m), CUDA_SUCCESS);
    EXPECT(cuMemcpyAtoA(twin, 0, plane, 0, 64), CUDA_SUCCESS);
    EXPECT(cuMemcpyAtoH(cells_back, twin, 16, 32), CUDA_SUCCESS);
    CHECK("array -> array -> host, first row", memcmp(cells_back, cells + 4, 32) == 0);
    EXPECT(cuMemcpyHtoA(twin, 4, cells, 8), CUDA_SUCCESS);
    EXPECT(cuMemcpyAtoD(flat, twin, 0, 16), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(cells_back, flat, 16), CUDA_SUCCESS);
    CHECK("host -> array at an offset -> device", cells_back[0] == 7 && cells_back[1] == 7 && cells_back[2] == 1007 && cells_back[3] == 3007);
    EXPECT(cuMemcpyHtoA(twin, 60, cells, 8), CUDA_ERROR_INVALID_VALUE);
    // Whole elements only: 6 bytes of 4-byte elements fail at the call, array to array too.
    EXPECT(cuMemcpyAtoA(twin, 0, plane, 0, 6), CUDA_ERROR_INVALID_VALUE);

    // Texture and surface objects, and what they were made with.
    CUDA_RESOURCE_DESC res = array_resource(plane);
    CUDA_TEXTURE_DESC tex = texture_desc(CU_TR_ADDRESS_MODE_CLAMP, CU_TR_FILTER_MODE_POINT, CU_TRSF_READ_AS_INTEGER);
    tex.borderColor[2] = 0.5f;
    CUtexObject texture = 0;
    EXPECT(cuTexObjectCreate(&texture, &res, &tex, NULL), CUDA_SUCCESS);
    CUDA_RESOURCE_DESC res_back;
    CUDA_TEXTURE_DESC tex_back;
    CUDA_RESOURCE_VIEW_DESC view_back;
    EXPECT(cuTexObjectGetResourceDesc(&res_back, texture), CUDA_SUCCESS);
    EXPECT(cuTexObjectGetTextureDesc(&tex_back, texture), CUDA_SUCCESS);
    CHECK("texture descriptors read back", res_back.resType == CU_RESOURCE_TYPE_ARRAY && res_back.res.array.hArray == plane &&
                                              tex_back.flags == CU_TRSF_READ_AS_INTEGER && tex_back.borderColor[2] == 0.5f);
    EXPECT(cuTexObjectGetResourceViewDesc(&view_back, texture), CUDA_ERROR_INVALID_VALUE);
    res.resType = CU_RESOURCE_TYPE_LINEAR;
    res.res.linear.devPtr = flat;
    res.res.linear.format = CU_AD_FORMAT_FLOAT;
    res.res.linear.numChannels = 1;
    res.res.linear.sizeInBytes = volume_len + 4;
    // A linear texture declared wider than its buffer is made, as the driver makes it (NVIDIA's
    // convolutionFFT2D pads its spectrum textures so); one over memory not the session's is not.
    CUtexObject beyond = 0;
    EXPECT(cuTexObjectCreate(&beyond, &res, &tex, NULL), CUDA_SUCCESS);
    EXPECT(cuTexObjectDestroy(beyond), CUDA_SUCCESS);
    res.res.linear.devPtr = 0x10;
    EXPECT(cuTexObjectCreate(&beyond, &res, &tex, NULL), CUDA_ERROR_INVALID_VALUE);
    res.res.linear.devPtr = flat;
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = volume;
    CUsurfObject surface = 0;
    EXPECT(cuSurfObjectCreate(&surface, &res), CUDA_SUCCESS);
    EXPECT(cuSurfObjectGetResourceDesc(&res_back, surface), CUDA_SUCCESS);
    CHECK("surface descriptor read back", res_back.res.array.hArray == volume);
    EXPECT(cuTexObjectDestroy(surface), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuSurfObjectDestroy(surface), CUDA_SUCCESS);
    EXPECT(cuTexObjectDestroy(texture), CUDA_SUCCESS);
    EXPECT(cuTexObjectDestroy(texture), CUDA_ERROR_INVALID_VALUE);

    // A mipmapped array: levels halve, the same level is the same array.
    CUDA_ARRAY3D_DESCRIPTOR dm = {32, 16, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
    CUmipmappedArray mipmap;
    EXPECT(cuMipmappedArrayCreate(&mipmap, &dm, 4), CUDA_SUCCESS);
    CUarray level2, again;
    EXPECT(cuMipmappedArrayGetLevel(&level2, mipmap, 2), CUDA_SUCCESS);
    EXPECT(cuMipmappedArrayGetLevel(&again, mipmap, 2), CUDA_SUCCESS);
    EXPECT(cuArray3DGetDescriptor(&got3, level2), CUDA_SUCCESS);
    CHECK("level 2 is 8 x 4, the same array each time", got3.Width == 8 && got3.Height == 4 && level2 == again);
    EXPECT(cuMipmappedArrayGetLevel(&again, mipmap, 4), CUDA_ERROR_INVALID_VALUE);
    unsigned char texels[8 * 4 * 4], texels_back[8 * 4 * 4];
    for (size_t i = 0; i < sizeof texels; i++) texels[i] = pattern(i + 100);
    EXPECT(cuMemcpyHtoA(level2, 0, texels, 32), CUDA_SUCCESS);
    EXPECT(cuMemcpyAtoH(texels_back, level2, 0, 32), CUDA_SUCCESS);
    CHECK("level round trip", memcmp(texels, texels_back, 32) == 0);
    EXPECT(cuArrayDestroy(level2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMipmappedArrayDestroy(mipmap), CUDA_SUCCESS);

    // A format Flyt does not serve fails with a message; three channels is no format at all.
    CUDA_ARRAY3D_DESCRIPTOR bc = {16, 16, 0, CU_AD_FORMAT_BC1_UNORM, 4, 0};
    CUarray refused;
    EXPECT(cuArray3DCreate(&refused, &bc), CUDA_ERROR_NOT_SUPPORTED);
    CUDA_ARRAY_DESCRIPTOR three = {16, 16, CU_AD_FORMAT_FLOAT, 3};
    EXPECT(cuArrayCreate(&refused, &three), CUDA_ERROR_INVALID_VALUE);

    // Stream attributes: an access policy window over the session's memory reads back; one over
    // memory that is not the app's is refused; copying attributes carries the window over.
    CUstreamAttrValue window, window_back;
    memset(&window, 0, sizeof window);
    window.accessPolicyWindow.base_ptr = (void *)flat;
    window.accessPolicyWindow.num_bytes = 4096;
    window.accessPolicyWindow.hitRatio = 0.5f;
    window.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
    window.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
    EXPECT(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &window), CUDA_SUCCESS);
    CUstream other;
    EXPECT(cuStreamCreate(&other, 0), CUDA_SUCCESS);
    EXPECT(cuStreamCopyAttributes(other, stream), CUDA_SUCCESS);
    memset(&window_back, 0, sizeof window_back);
    EXPECT(cuStreamGetAttribute(other, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &window_back), CUDA_SUCCESS);
    CHECK("access policy window copied to another stream",
          window_back.accessPolicyWindow.base_ptr == (void *)flat && window_back.accessPolicyWindow.num_bytes == 4096 &&
              window_back.accessPolicyWindow.hitRatio == 0.5f);
    window.accessPolicyWindow.base_ptr = (void *)vol;
    EXPECT(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &window), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamGetAttribute(stream, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &window_back), CUDA_ERROR_INVALID_VALUE);
    RELEASE(STREAM(other), ARRAY(plane), ARRAY(twin), ARRAY(volume));
    EXPECT(cuArrayDestroy(volume), CUDA_ERROR_INVALID_VALUE);
    RELEASE(MEMORY(flat), MEMORY(pitched));
    free(vol);
    free(vol_back);
    return finish();
}

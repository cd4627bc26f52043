// textures: CUDA arrays, texture objects and surface objects through the runtime API.
// Covers: cudaCreateChannelDesc (template and C forms), cudaMallocArray (1D, 2D, surface), cudaMalloc3DArray
// (3D, cudaArrayLayered, cudaArrayCubemap, cudaArraySurfaceLoadStore), cudaMallocMipmappedArray,
// cudaGetMipmappedArrayLevel, cudaArrayGetInfo, cudaGetChannelDesc; cudaMemcpy2DToArray/FromArray (and
// their Async forms on a stream), cudaMemcpy2DArrayToArray, cudaMemcpyToArray/FromArray (deprecated, still
// exported), cudaMemcpy3D to and from a 3D and a layered array with positions, array -> device -> array;
// texture objects over a 2D array (point filtering with clamp and border addressing, linear filtering with
// normalized coordinates against a CPU bilinear reference, cudaReadModeNormalizedFloat on uchar4), over linear
// memory (tex1Dfetch<int>) and pitched memory (cudaResourceTypePitch2D), a layered array (tex2DLayered), a
// 3D array (tex3D), a cubemap (texCubemap), a mipmapped array (tex2DLod per level);
// cudaGetTextureObjectResourceDesc/TextureDesc; surface objects (surf2Dwrite/surf2Dread, surf3Dwrite),
// cudaGetSurfaceObjectResourceDesc; an out-of-range cudaMemcpy2DToArray (error printed by name), after which
// a texture read still works; every object destroyed and every array freed.
// Exact values are checked exactly; only filtered reads have a tolerance, and print only ok / not ok.
#include "common.h"

#include <cmath>
#include <vector>

// cudaMemcpyToArray/FromArray are deprecated but exported: programs still call them.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#pragma nv_diag_suppress 1444
#pragma nv_diag_suppress 1215

typedef std::vector<float> Floats;

__global__ void read2d(cudaTextureObject_t t, const float2 *c, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex2D<float>(t, c[i].x, c[i].y);
}
__global__ void read2d4(cudaTextureObject_t t, const float2 *c, float4 *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex2D<float4>(t, c[i].x, c[i].y);
}
__global__ void fetch1d(cudaTextureObject_t t, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<int>(t, i);
}
__global__ void read_layered(cudaTextureObject_t t, float *out, int w, int h, int layers) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h * layers) out[i] = tex2DLayered<float>(t, i % w + 0.5f, i / w % h + 0.5f, i / (w * h));
}
__global__ void read3d(cudaTextureObject_t t, float *out, int w, int h, int d) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h * d) out[i] = tex3D<float>(t, i % w + 0.5f, i / w % h + 0.5f, i / (w * h) + 0.5f);
}
__global__ void read_cube(cudaTextureObject_t t, const float4 *dir, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = texCubemap<float>(t, dir[i].x, dir[i].y, dir[i].z);
}
__global__ void read_lod(cudaTextureObject_t t, const float *lod, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex2DLod<float>(t, 0.3f, 0.7f, lod[i]);
}
__device__ __host__ float surf_value(int x, int y, int z) { return x * 3.0f + y * 1000.0f + z * 100000.0f + 0.5f; }
__global__ void surf_write(cudaSurfaceObject_t s, int w, int h) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h) surf2Dwrite(surf_value(i % w, i / w, 0), s, (i % w) * (int)sizeof(float), i / w);
}
__global__ void surf_read(cudaSurfaceObject_t s, float *out, int w, int h) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h) out[i] = surf2Dread<float>(s, (i % w) * (int)sizeof(float), i / w);
}
__global__ void surf3_write(cudaSurfaceObject_t s, int w, int h, int d) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w * h * d) surf3Dwrite(surf_value(i % w, i / w % h, i / (w * h)), s, (i % w) * 4, i / w % h, i / (w * h));
}

static int blocks(int n) { return (n + 127) / 128; }

// Copies `n` items to the device, returns the device pointer.
template <class T>
static T *to_dev(const std::vector<T> &v) {
    T *d;
    CHECK(cudaMalloc((void **)&d, v.size() * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T>
static std::vector<T> from_dev(T *d, size_t n) {
    std::vector<T> v(n);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d));
    return v;
}

// `<what>: ok` when the floats are equal (within tol), else the first difference (a failure).
static bool verdict(const char *what, const Floats &got, const Floats &want, float tol = 0.0f) {
    for (size_t i = 0; i < want.size(); i++) {
        if (!(fabsf(got[i] - want[i]) <= tol)) {
            printf("%s: WRONG (item %zu of %zu)\n", what, i, want.size());
            g_failures++;
            return false;
        }
    }
    printf("%s: ok\n", what);
    return true;
}

static void print_desc(const char *what, const cudaChannelFormatDesc &d) {
    printf("%s: x %d y %d z %d w %d kind %d\n", what, d.x, d.y, d.z, d.w, (int)d.f);
}
static void print_array(const char *what, cudaArray_t a) {
    cudaChannelFormatDesc d, d2;
    cudaExtent e;
    unsigned int flags;
    CHECK(cudaArrayGetInfo(&d, &e, &flags, a));
    CHECK(cudaGetChannelDesc(&d2, a));
    printf("%s: desc %d,%d,%d,%d kind %d, extent %zu x %zu x %zu, flags 0x%x, cudaGetChannelDesc %s\n", what, d.x,
           d.y, d.z, d.w, (int)d.f, e.width, e.height, e.depth, flags, memcmp(&d, &d2, sizeof d) ? "DIFFERS" : "same");
}

static cudaResourceDesc array_res(cudaArray_t a) {
    cudaResourceDesc r;
    memset(&r, 0, sizeof r);
    r.resType = cudaResourceTypeArray;
    r.res.array.array = a;
    return r;
}
static cudaTextureObject_t make_tex(const cudaResourceDesc &r, cudaTextureFilterMode f, cudaTextureAddressMode a,
                                    int normalized, cudaTextureReadMode rm = cudaReadModeElementType) {
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = a;
    td.filterMode = f;
    td.readMode = rm;
    td.normalizedCoords = normalized;
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &r, &td, nullptr));
    return t;
}

// Reads a 2D float texture at the given coordinates.
static Floats sample2d(cudaTextureObject_t t, const std::vector<float2> &c) {
    float2 *dc = to_dev(c);
    float *out;
    CHECK(cudaMalloc((void **)&out, c.size() * sizeof(float)));
    read2d<<<blocks((int)c.size()), 128>>>(t, dc, out, (int)c.size());
    CHECK_LAUNCH();
    Floats r = from_dev(out, c.size());
    CHECK(cudaFree(dc));
    return r;
}

// The 64 x 48 image: x + 100 y + 0.25 (exact in float).
static const int W = 64, H = 48;
static float img_value(int x, int y) { return x + 100.0f * y + 0.25f; }
static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// The centre of every texel of the image's first w x h into c, the image's value there into want.
static void texel_centres(int w, int h, std::vector<float2> &c, Floats &want) {
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            c.push_back(make_float2(x + 0.5f, y + 0.5f));
            want.push_back(img_value(x, y));
        }
}

// Point-filtered, clamp-addressed reads of every texel centre plus out-of-range coordinates.
static void point_reads(const char *what, cudaTextureObject_t t, bool border) {
    std::vector<float2> c;
    Floats want;
    texel_centres(W, H, c, want);
    const float odd[][2] = {{3.9f, 4.1f}, {-3.0f, 2.5f}, {70.2f, 10.5f}, {5.5f, -1.0f}, {5.5f, 100.0f}, {1e6f, -1e6f}};
    for (auto &o : odd) {
        c.push_back(make_float2(o[0], o[1]));
        int x = (int)floorf(o[0]), y = (int)floorf(o[1]);
        bool out = x < 0 || x >= W || y < 0 || y >= H;
        want.push_back(border && out ? 0.0f : img_value(clampi(x, 0, W - 1), clampi(y, 0, H - 1)));
    }
    verdict(what, sample2d(t, c), want);
}

int main() {
    test_init("textures");
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    // 1. Channel descriptors.
    const cudaChannelFormatDesc df = cudaCreateChannelDesc<float>();
    const cudaChannelFormatDesc du4 = cudaCreateChannelDesc<uchar4>();
    print_desc("cudaCreateChannelDesc<float>", df);
    print_desc("cudaCreateChannelDesc<uchar4>", du4);
    print_desc("cudaCreateChannelDesc<float2>", cudaCreateChannelDesc<float2>());
    const cudaChannelFormatDesc di = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindSigned);
    print_desc("cudaCreateChannelDesc(32,0,0,0,Signed)", di);

    // 2. Arrays.
    cudaArray_t a1, img, img2, img3, img4, rgba, lin, vol, lay, cube, surf, surf3;
    CHECK(cudaMallocArray(&a1, &df, 1000));
    CHECK(cudaMallocArray(&img, &df, W, H));
    CHECK(cudaMallocArray(&img2, &df, W, H));
    CHECK(cudaMallocArray(&img3, &df, W, H));
    CHECK(cudaMallocArray(&img4, &df, W, H));
    CHECK(cudaMallocArray(&rgba, &du4, 8, 4));
    CHECK(cudaMallocArray(&lin, &df, 16, 12));
    CHECK(cudaMallocArray(&surf, &df, 40, 30, cudaArraySurfaceLoadStore));
    CHECK(cudaMalloc3DArray(&vol, &df, make_cudaExtent(32, 16, 8)));
    CHECK(cudaMalloc3DArray(&lay, &df, make_cudaExtent(32, 16, 4), cudaArrayLayered));
    CHECK(cudaMalloc3DArray(&cube, &df, make_cudaExtent(8, 8, 6), cudaArrayCubemap));
    CHECK(cudaMalloc3DArray(&surf3, &df, make_cudaExtent(16, 8, 4), cudaArraySurfaceLoadStore));
    print_array("1D float array", a1);
    print_array("2D float array", img);
    print_array("2D uchar4 array", rgba);
    print_array("2D surface array", surf);
    print_array("3D array", vol);
    print_array("layered array", lay);
    print_array("cubemap array", cube);
    print_array("3D surface array", surf3);

    // 3. 2D copies to and from arrays. Models: img_m for img, m2 for img2, m3 for img3.
    Floats img_m(W * H), m2(W * H, 0.0f), m3(W * H, 0.0f);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) img_m[y * W + x] = img_value(x, y);
    const size_t row = W * sizeof(float);
    CHECK(cudaMemcpy2DToArray(img, 0, 0, img_m.data(), row, row, H, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DToArray(img2, 0, 0, m2.data(), row, row, H, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2DToArray(img3, 0, 0, m3.data(), row, row, H, cudaMemcpyHostToDevice));
    {
        const size_t hp = W + 3;  // host pitch in floats; the 3 pad floats must stay untouched
        Floats back(hp * H, -7.0f), want(hp * H, -7.0f);
        CHECK(cudaMemcpy2DFromArray(back.data(), hp * 4, img, 0, 0, row, H, cudaMemcpyDeviceToHost));
        for (int y = 0; y < H; y++) memcpy(&want[y * hp], &img_m[y * W], row);
        verdict("cudaMemcpy2DToArray / cudaMemcpy2DFromArray round trip (host pitch 268)", back, want);

        Floats sub(20 * 10);
        for (int i = 0; i < 200; i++) sub[i] = 5000.0f + i;
        CHECK(cudaMemcpy2DToArray(img2, 5 * 4, 3, sub.data(), 20 * 4, 20 * 4, 10, cudaMemcpyHostToDevice));
        for (int y = 0; y < 10; y++)
            for (int x = 0; x < 20; x++) m2[(3 + y) * W + 5 + x] = sub[y * 20 + x];
        Floats all(W * H);
        CHECK(cudaMemcpy2DFromArray(all.data(), row, img2, 0, 0, row, H, cudaMemcpyDeviceToHost));
        verdict("cudaMemcpy2DToArray 20 x 10 at column 5, row 3", all, m2);

        float *pin;
        CHECK(cudaMallocHost((void **)&pin, W * H * sizeof(float)));
        for (int i = 0; i < W * H; i++) pin[i] = -1.0f * i;
        CHECK(cudaMemcpy2DToArrayAsync(img2, 32 * 4, 40, pin, 16 * 4, 16 * 4, 8, cudaMemcpyHostToDevice, s));
        for (int y = 0; y < 8; y++)
            for (int x = 0; x < 16; x++) m2[(40 + y) * W + 32 + x] = pin[y * 16 + x];
        CHECK(cudaMemcpy2DFromArrayAsync(pin, 30 * 4, img2, 30 * 4, 36, 30 * 4, 12, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        Floats got(pin, pin + 30 * 12), want2(30 * 12);
        for (int y = 0; y < 12; y++)
            for (int x = 0; x < 30; x++) want2[y * 30 + x] = m2[(36 + y) * W + 30 + x];
        verdict("cudaMemcpy2DToArrayAsync / FromArrayAsync (pinned, stream, offsets)", got, want2);
        CHECK(cudaFreeHost(pin));

        CHECK(cudaMemcpy2DArrayToArray(img3, 8 * 4, 6, img, 2 * 4, 1, 30 * 4, 20, cudaMemcpyDeviceToDevice));
        for (int y = 0; y < 20; y++)
            for (int x = 0; x < 30; x++) m3[(6 + y) * W + 8 + x] = img_m[(1 + y) * W + 2 + x];
        CHECK(cudaMemcpyToArray(img3, 50 * 4, 47, sub.data(), 14 * 4, cudaMemcpyHostToDevice));
        for (int x = 0; x < 14; x++) m3[47 * W + 50 + x] = sub[x];
        CHECK(cudaMemcpy2DFromArray(all.data(), row, img3, 0, 0, row, H, cudaMemcpyDeviceToHost));
        verdict("cudaMemcpy2DArrayToArray 30 x 20 (2,1) -> (8,6), cudaMemcpyToArray in row 47", all, m3);

        // Array -> pitched device memory -> another array.
        float *dp;
        size_t pitch;
        CHECK(cudaMallocPitch((void **)&dp, &pitch, row, H));
        CHECK(cudaMemcpy2DFromArray(dp, pitch, img, 0, 0, row, H, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemcpy2DToArray(img4, 0, 0, dp, pitch, row, H, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemcpy2DFromArray(all.data(), row, img4, 0, 0, row, H, cudaMemcpyDeviceToHost));
        verdict("array -> pitched device memory -> array", all, img_m);
        CHECK(cudaFree(dp));
    }

    // 4. The deprecated 1D calls on a 1D array.
    {
        Floats m(1000), part(50), back(1000);
        for (int i = 0; i < 1000; i++) m[i] = i * 0.5f;
        for (int i = 0; i < 50; i++) part[i] = -100.0f - i;
        CHECK(cudaMemcpyToArray(a1, 0, 0, m.data(), 4000, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpyToArray(a1, 100 * 4, 0, part.data(), 50 * 4, cudaMemcpyHostToDevice));
        for (int i = 0; i < 50; i++) m[100 + i] = part[i];
        CHECK(cudaMemcpyFromArray(back.data(), a1, 0, 0, 4000, cudaMemcpyDeviceToHost));
        verdict("cudaMemcpyToArray / cudaMemcpyFromArray (1D array, offset 400 bytes)", back, m);
        Floats mid(20);
        CHECK(cudaMemcpyFromArray(mid.data(), a1, 140 * 4, 0, 20 * 4, cudaMemcpyDeviceToHost));
        verdict("cudaMemcpyFromArray at offset 560 bytes", mid, Floats(m.begin() + 140, m.begin() + 160));
    }

    // 5. cudaMemcpy3D to and from a 3D array and a layered array; the extent in array elements. The
    //    documentation says a host pointer's position is in bytes, but with an array on the other side
    //    CUDA 13.0's runtime takes its x in array elements too (seen on an H100: srcPos.x 8 of a float
    //    array read from byte 32; x 16 with width 10 in an 80-byte pitch is cudaErrorInvalidValue), so
    //    these positions are elements on both sides, as programs that work natively write them.
    Floats vol_m(32 * 16 * 8), lay_m(32 * 16 * 4);
    for (size_t i = 0; i < vol_m.size(); i++) vol_m[i] = (float)i + 0.125f;
    for (size_t i = 0; i < lay_m.size(); i++) lay_m[i] = 7.0f * i;
    for (int pass = 0; pass < 2; pass++) {
        cudaArray_t a = pass ? lay : vol;
        Floats &m = pass ? lay_m : vol_m;
        const int d = pass ? 4 : 8;
        cudaMemcpy3DParms p = {};
        p.srcPtr = make_cudaPitchedPtr(m.data(), 32 * 4, 32, 16);
        p.dstArray = a;
        p.extent = make_cudaExtent(32, 16, d);
        p.kind = cudaMemcpyHostToDevice;
        CHECK(cudaMemcpy3D(&p));
        // A 10 x 6 x 2 box from a 20 x 10 x 3 host volume at (4,2,1) to (3,5,d-3).
        Floats box(20 * 10 * 3);
        for (size_t i = 0; i < box.size(); i++) box[i] = 90000.0f + i + pass;
        p = {};
        p.srcPtr = make_cudaPitchedPtr(box.data(), 20 * 4, 20, 10);
        p.srcPos = make_cudaPos(4, 2, 1);
        p.dstArray = a;
        p.dstPos = make_cudaPos(3, 5, d - 3);
        p.extent = make_cudaExtent(10, 6, 2);
        p.kind = cudaMemcpyHostToDevice;
        CHECK(cudaMemcpy3D(&p));
        for (int z = 0; z < 2; z++)
            for (int y = 0; y < 6; y++)
                for (int x = 0; x < 10; x++)
                    m[((d - 3 + z) * 16 + 5 + y) * 32 + 3 + x] = box[((1 + z) * 10 + 2 + y) * 20 + 4 + x];
        Floats all(32 * 16 * d);
        p = {};
        p.srcArray = a;
        p.dstPtr = make_cudaPitchedPtr(all.data(), 32 * 4, 32, 16);
        p.extent = make_cudaExtent(32, 16, d);
        p.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&p));
        printf("%s:\n", pass ? "layered array (4 layers)" : "3D array 32 x 16 x 8");
        verdict("  cudaMemcpy3D whole, then a box from (4,2,1) to (3,5,depth-3), read back whole", all, m);
        // A box read out of the array at (1,2,1) into a 40 x 12 x 3 host volume at (5,1,0).
        Floats out(40 * 12 * 3, -1.0f), want(40 * 12 * 3, -1.0f);
        p = {};
        p.srcArray = a;
        p.srcPos = make_cudaPos(1, 2, 1);
        p.dstPtr = make_cudaPitchedPtr(out.data(), 40 * 4, 40, 12);
        p.dstPos = make_cudaPos(5, 1, 0);
        p.extent = make_cudaExtent(30, 11, 3);
        p.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&p));
        for (int z = 0; z < 3; z++)
            for (int y = 0; y < 11; y++)
                for (int x = 0; x < 30; x++) want[(z * 12 + 1 + y) * 40 + 5 + x] = m[((1 + z) * 16 + 2 + y) * 32 + 1 + x];
        verdict("  cudaMemcpy3D box 30 x 11 x 3 from (1,2,1) to host (5,1,0)", out, want);
    }

    // 6. Texture objects over the 2D array: point filtering, clamp and border addressing.
    cudaTextureObject_t t_point = make_tex(array_res(img), cudaFilterModePoint, cudaAddressModeClamp, 0);
    cudaTextureObject_t t_border = make_tex(array_res(img), cudaFilterModePoint, cudaAddressModeBorder, 0);
    point_reads("tex2D point/clamp: 3072 texel centres and 6 other coordinates", t_point, false);
    point_reads("tex2D point/border: the same coordinates (outside reads 0)", t_border, true);

    // Linear filtering, normalized coordinates, against a CPU bilinear reference.
    Floats lin_m(16 * 12);
    for (int i = 0; i < 16 * 12; i++) lin_m[i] = (float)((i * 7 + (i / 16) * 13) % 17) / 16.0f;
    CHECK(cudaMemcpy2DToArray(lin, 0, 0, lin_m.data(), 16 * 4, 16 * 4, 12, cudaMemcpyHostToDevice));
    cudaTextureObject_t t_lin = make_tex(array_res(lin), cudaFilterModeLinear, cudaAddressModeClamp, 1);
    {
        std::vector<float2> c;
        Floats want;
        auto texel = [&](int x, int y) { return lin_m[clampi(y, 0, 11) * 16 + clampi(x, 0, 15)]; };
        for (int j = 0; j <= 20; j++)
            for (int i = 0; i <= 25; i++) {
                float u = -0.05f + 1.1f * i / 25, v = -0.05f + 1.1f * j / 20;
                c.push_back(make_float2(u, v));
                float xf = u * 16 - 0.5f, yf = v * 12 - 0.5f;
                int x0 = (int)floorf(xf), y0 = (int)floorf(yf);
                float a = xf - x0, b = yf - y0;
                want.push_back((1 - a) * (1 - b) * texel(x0, y0) + a * (1 - b) * texel(x0 + 1, y0) +
                               (1 - a) * b * texel(x0, y0 + 1) + a * b * texel(x0 + 1, y0 + 1));
            }
        verdict("tex2D linear filtering, normalized coordinates, 546 points (within 0.01 of CPU bilinear)",
                sample2d(t_lin, c), want, 0.01f);
    }

    // cudaReadModeNormalizedFloat on uchar4.
    cudaTextureObject_t t_rgba;
    {
        std::vector<uchar4> px(8 * 4);
        for (int i = 0; i < 32; i++) px[i] = make_uchar4(i * 8, 255 - i, i * 37 % 256, i == 0 ? 255 : i);
        CHECK(cudaMemcpy2DToArray(rgba, 0, 0, px.data(), 8 * 4, 8 * 4, 4, cudaMemcpyHostToDevice));
        t_rgba = make_tex(array_res(rgba), cudaFilterModePoint, cudaAddressModeClamp, 0, cudaReadModeNormalizedFloat);
        std::vector<float2> c;
        for (int i = 0; i < 32; i++) c.push_back(make_float2(i % 8 + 0.5f, i / 8 + 0.5f));
        float2 *dc = to_dev(c);
        float4 *out;
        CHECK(cudaMalloc((void **)&out, 32 * sizeof(float4)));
        read2d4<<<1, 32>>>(t_rgba, dc, out, 32);
        CHECK_LAUNCH();
        std::vector<float4> r = from_dev(out, 32);
        CHECK(cudaFree(dc));
        Floats got, want;
        for (int i = 0; i < 32; i++) {
            got.insert(got.end(), {r[i].x, r[i].y, r[i].z, r[i].w});
            want.insert(want.end(), {px[i].x / 255.0f, px[i].y / 255.0f, px[i].z / 255.0f, px[i].w / 255.0f});
        }
        verdict("tex2D<float4> uchar4 with cudaReadModeNormalizedFloat (within 1e-6 of c / 255)", got, want, 1e-6f);
    }

    // Linear memory (tex1Dfetch<int>) and pitched memory (cudaResourceTypePitch2D).
    cudaTextureObject_t t_linear, t_pitch;
    int *lin_raw;
    float *pitched;
    {
        int align = 0;
        CHECK(cudaDeviceGetAttribute(&align, cudaDevAttrTextureAlignment, 0));
        const int n = 1000;
        CHECK(cudaMalloc((void **)&lin_raw, n * sizeof(int) + align));
        int *dl = (int *)(((uintptr_t)lin_raw + align - 1) / align * align);
        std::vector<int> v(n);
        for (int i = 0; i < n; i++) v[i] = i * i - 50000;
        CHECK(cudaMemcpy(dl, v.data(), n * sizeof(int), cudaMemcpyHostToDevice));
        cudaResourceDesc r;
        memset(&r, 0, sizeof r);
        r.resType = cudaResourceTypeLinear;
        r.res.linear.devPtr = dl;
        r.res.linear.desc = di;
        r.res.linear.sizeInBytes = n * sizeof(int);
        t_linear = make_tex(r, cudaFilterModePoint, cudaAddressModeClamp, 0);
        int *out;
        CHECK(cudaMalloc((void **)&out, n * sizeof(int)));
        fetch1d<<<blocks(n), 128>>>(t_linear, out, n);
        CHECK_LAUNCH();
        std::vector<int> got = from_dev(out, n);
        printf("tex1Dfetch<int> over linear memory (1000 signed ints): %s\n", got == v ? "ok" : "WRONG");
        EXPECT(got == v, "tex1Dfetch values");

        const int pw = 50, ph = 20;
        size_t pitch;
        CHECK(cudaMallocPitch((void **)&pitched, &pitch, pw * sizeof(float), ph));
        CHECK(cudaMemcpy2D(pitched, pitch, img_m.data(), row, pw * sizeof(float), ph, cudaMemcpyHostToDevice));
        memset(&r, 0, sizeof r);
        r.resType = cudaResourceTypePitch2D;
        r.res.pitch2D.devPtr = pitched;
        r.res.pitch2D.desc = df;
        r.res.pitch2D.width = pw;
        r.res.pitch2D.height = ph;
        r.res.pitch2D.pitchInBytes = pitch;
        t_pitch = make_tex(r, cudaFilterModePoint, cudaAddressModeClamp, 0);
        std::vector<float2> c;
        Floats want;
        texel_centres(pw, ph, c, want);
        c.push_back(make_float2(60.5f, 25.5f));
        want.push_back(img_value(pw - 1, ph - 1));
        verdict("tex2D over cudaMallocPitch memory (cudaResourceTypePitch2D, 50 x 20, clamp)", sample2d(t_pitch, c), want);
    }

    // Layered, 3D, cubemap.
    cudaTextureObject_t t_lay = make_tex(array_res(lay), cudaFilterModePoint, cudaAddressModeClamp, 0);
    cudaTextureObject_t t_vol = make_tex(array_res(vol), cudaFilterModePoint, cudaAddressModeClamp, 0);
    {
        float *out;
        CHECK(cudaMalloc((void **)&out, lay_m.size() * sizeof(float)));
        read_layered<<<blocks((int)lay_m.size()), 128>>>(t_lay, out, 32, 16, 4);
        CHECK_LAUNCH();
        verdict("tex2DLayered: every texel of 4 layers", from_dev(out, lay_m.size()), lay_m);
        CHECK(cudaMalloc((void **)&out, vol_m.size() * sizeof(float)));
        read3d<<<blocks((int)vol_m.size()), 128>>>(t_vol, out, 32, 16, 8);
        CHECK_LAUNCH();
        verdict("tex3D: every texel of 32 x 16 x 8", from_dev(out, vol_m.size()), vol_m);
    }
    cudaTextureObject_t t_cube;
    {
        Floats faces(8 * 8 * 6);
        for (size_t i = 0; i < faces.size(); i++) faces[i] = (i / 64) * 10.0f + 1.5f;
        cudaMemcpy3DParms p = {};
        p.srcPtr = make_cudaPitchedPtr(faces.data(), 8 * 4, 8, 8);
        p.dstArray = cube;
        p.extent = make_cudaExtent(8, 8, 6);
        p.kind = cudaMemcpyHostToDevice;
        CHECK(cudaMemcpy3D(&p));
        t_cube = make_tex(array_res(cube), cudaFilterModePoint, cudaAddressModeClamp, 1);
        const std::vector<float4> dirs = {
            {1, 0, 0, 0},      {-1, 0, 0, 0},     {0, 1, 0, 0},     {0, -1, 0, 0},      {0, 0, 1, 0},
            {0, 0, -1, 0},     {0.9f, 0.2f, -0.3f, 0}, {-0.7f, 0.5f, 0.1f, 0}, {0.2f, 0.8f, -0.4f, 0},
            {0.1f, -0.9f, 0.3f, 0}, {-0.3f, 0.4f, 0.95f, 0}, {0.5f, -0.2f, -0.85f, 0}};
        Floats want;
        for (const float4 &d : dirs) {
            float ax = fabsf(d.x), ay = fabsf(d.y), az = fabsf(d.z);
            int face = ax >= ay && ax >= az ? (d.x < 0) : ay >= az ? 2 + (d.y < 0) : 4 + (d.z < 0);
            want.push_back(face * 10.0f + 1.5f);
        }
        float4 *dd = to_dev(dirs);
        float *out;
        CHECK(cudaMalloc((void **)&out, dirs.size() * sizeof(float)));
        read_cube<<<1, 32>>>(t_cube, dd, out, (int)dirs.size());
        CHECK_LAUNCH();
        verdict("texCubemap: 12 directions, one per face and 6 off-axis", from_dev(out, dirs.size()), want);
        CHECK(cudaFree(dd));
    }

    // Mipmapped array: 4 levels, each a constant.
    cudaMipmappedArray_t mm;
    cudaTextureObject_t t_mm;
    {
        CHECK(cudaMallocMipmappedArray(&mm, &df, make_cudaExtent(64, 64, 0), 4, 0));
        for (unsigned l = 0; l < 4; l++) {
            cudaArray_t level;
            CHECK(cudaGetMipmappedArrayLevel(&level, mm, l));
            char what[64];
            snprintf(what, sizeof what, "mipmap level %u", l);
            print_array(what, level);
            const int side = 64 >> l;
            Floats v(side * side, (l + 1) * 1.25f);
            CHECK(cudaMemcpy2DToArray(level, 0, 0, v.data(), side * 4, side * 4, side, cudaMemcpyHostToDevice));
        }
        cudaResourceDesc r;
        memset(&r, 0, sizeof r);
        r.resType = cudaResourceTypeMipmappedArray;
        r.res.mipmap.mipmap = mm;
        cudaTextureDesc td;
        memset(&td, 0, sizeof td);
        td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
        td.filterMode = cudaFilterModePoint;
        td.mipmapFilterMode = cudaFilterModePoint;
        td.normalizedCoords = 1;
        td.maxMipmapLevelClamp = 3.0f;
        CHECK(cudaCreateTextureObject(&t_mm, &r, &td, nullptr));
        const Floats lods = {0, 1, 2, 3, 7};
        float *dl = to_dev(lods), *out;
        CHECK(cudaMalloc((void **)&out, lods.size() * sizeof(float)));
        read_lod<<<1, 32>>>(t_mm, dl, out, (int)lods.size());
        CHECK_LAUNCH();
        Floats got = from_dev(out, lods.size());
        CHECK(cudaFree(dl));
        for (size_t i = 0; i < lods.size(); i++) printf("tex2DLod at level %g: %g\n", lods[i], got[i]);
        verdict("tex2DLod per level (level 7 clamped to 3)", got, Floats{1.25f, 2.5f, 3.75f, 5.0f, 5.0f});
    }

    // Descriptors read back from the objects.
    {
        cudaResourceDesc r;
        cudaTextureDesc td;
        CHECK(cudaGetTextureObjectResourceDesc(&r, t_point));
        printf("point texture resource: type %d, the same array: %s\n", (int)r.resType,
               r.res.array.array == img ? "yes" : "no");
        CHECK(cudaGetTextureObjectTextureDesc(&td, t_point));
        printf("point texture desc: address %d,%d filter %d read %d normalized %d\n", (int)td.addressMode[0],
               (int)td.addressMode[1], (int)td.filterMode, (int)td.readMode, td.normalizedCoords);
        CHECK(cudaGetTextureObjectTextureDesc(&td, t_lin));
        printf("linear texture desc: address %d,%d filter %d read %d normalized %d\n", (int)td.addressMode[0],
               (int)td.addressMode[1], (int)td.filterMode, (int)td.readMode, td.normalizedCoords);
        CHECK(cudaGetTextureObjectTextureDesc(&td, t_rgba));
        printf("uchar4 texture desc: filter %d read %d\n", (int)td.filterMode, (int)td.readMode);
        CHECK(cudaGetTextureObjectResourceDesc(&r, t_linear));
        printf("linear-memory texture resource: type %d, size %zu, desc %d kind %d\n", (int)r.resType,
               r.res.linear.sizeInBytes, r.res.linear.desc.x, (int)r.res.linear.desc.f);
        CHECK(cudaGetTextureObjectResourceDesc(&r, t_pitch));
        printf("pitch2D texture resource: type %d, %zu x %zu, the same pointer: %s\n", (int)r.resType,
               r.res.pitch2D.width, r.res.pitch2D.height, r.res.pitch2D.devPtr == pitched ? "yes" : "no");
        CHECK(cudaGetTextureObjectResourceDesc(&r, t_mm));
        printf("mipmapped texture resource: type %d, the same mipmapped array: %s\n", (int)r.resType,
               r.res.mipmap.mipmap == mm ? "yes" : "no");
    }

    // 7. Surface objects: 2D write then read, 3D write.
    {
        cudaSurfaceObject_t so, so3;
        cudaResourceDesc r = array_res(surf);
        CHECK(cudaCreateSurfaceObject(&so, &r));
        const int sw = 40, sh = 30;
        surf_write<<<blocks(sw * sh), 128>>>(so, sw, sh);
        CHECK_LAUNCH();
        float *out;
        CHECK(cudaMalloc((void **)&out, sw * sh * sizeof(float)));
        surf_read<<<blocks(sw * sh), 128>>>(so, out, sw, sh);
        CHECK_LAUNCH();
        Floats want(sw * sh), back(sw * sh);
        for (int i = 0; i < sw * sh; i++) want[i] = surf_value(i % sw, i / sw, 0);
        verdict("surf2Dwrite, then surf2Dread in another kernel", from_dev(out, sw * sh), want);
        CHECK(cudaMemcpy2DFromArray(back.data(), sw * 4, surf, 0, 0, sw * 4, sh, cudaMemcpyDeviceToHost));
        verdict("surf2Dwrite result read with cudaMemcpy2DFromArray", back, want);
        cudaResourceDesc got;
        CHECK(cudaGetSurfaceObjectResourceDesc(&got, so));
        printf("surface resource: type %d, the same array: %s\n", (int)got.resType,
               got.res.array.array == surf ? "yes" : "no");

        r = array_res(surf3);
        CHECK(cudaCreateSurfaceObject(&so3, &r));
        surf3_write<<<blocks(16 * 8 * 4), 128>>>(so3, 16, 8, 4);
        CHECK_LAUNCH();
        Floats v3(16 * 8 * 4), w3(16 * 8 * 4);
        cudaMemcpy3DParms p = {};
        p.srcArray = surf3;
        p.dstPtr = make_cudaPitchedPtr(v3.data(), 16 * 4, 16, 8);
        p.extent = make_cudaExtent(16, 8, 4);
        p.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&p));
        for (int i = 0; i < 16 * 8 * 4; i++) w3[i] = surf_value(i % 16, i / 16 % 8, i / 128);
        verdict("surf3Dwrite result read with cudaMemcpy3D", v3, w3);
        CHECK(cudaDestroySurfaceObject(so));
        CHECK(cudaDestroySurfaceObject(so3));
    }

    // 8. Errors: a copy past the array's width / height; the context and the texture still work.
    {
        Floats junk(64, 1.0f);
        expect_some_err("cudaMemcpy2DToArray 4 floats at column 62 of 64",
                        cudaMemcpy2DToArray(img, 62 * 4, 0, junk.data(), 16, 16, 1, cudaMemcpyHostToDevice));
        report("  cudaGetLastError", cudaGetLastError());
        expect_some_err("cudaMemcpy2DToArray 2 rows at row 47 of 48",
                        cudaMemcpy2DToArray(img, 0, 47, junk.data(), 16, 16, 2, cudaMemcpyHostToDevice));
        report("  cudaGetLastError", cudaGetLastError());
        expect_some_err("cudaMemcpy2DFromArray 65 floats wide",
                        cudaMemcpy2DFromArray(junk.data(), 65 * 4, img, 0, 0, 65 * 4, 1, cudaMemcpyDeviceToHost));
        report("  cudaGetLastError", cudaGetLastError());
        point_reads("tex2D point/clamp again after the errors (array unchanged)", t_point, false);
    }

    // 9. Clean up.
    for (cudaTextureObject_t t : {t_point, t_border, t_lin, t_rgba, t_linear, t_pitch, t_lay, t_vol, t_cube, t_mm})
        CHECK(cudaDestroyTextureObject(t));
    for (cudaArray_t a : {a1, img, img2, img3, img4, rgba, lin, vol, lay, cube, surf, surf3}) CHECK(cudaFreeArray(a));
    CHECK(cudaFreeMipmappedArray(mm));
    CHECK_EACH(cudaFree, lin_raw, pitched);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaDeviceSynchronize());
    return test_finish();
}

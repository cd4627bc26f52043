// memory_2d3d: pitched and 3D linear device memory, every byte checked against a host model.
// Covers: cudaMallocPitch (odd widths; pitches printed), cudaMalloc3D (pitch, xsize, ysize printed);
// cudaMemcpy2D host->device, device->host (another host pitch), device->device between sub-rectangles
// of two pitched allocations, cudaMemcpyDefault; cudaMemcpy2DAsync on a created stream with pageable
// and cudaMallocHost memory; cudaMemset2D/cudaMemset2DAsync on sub-rectangles; cudaMemcpy3D with
// make_cudaPitchedPtr/make_cudaExtent/make_cudaPos offsets host->device, device->host, device->device;
// cudaMemcpy3DAsync; cudaMemset3D/cudaMemset3DAsync on sub-boxes; cudaMemcpy3DPeer(Async) on device 0;
// kernels addressing pitched 2D and 3D memory through the pitch; 16 MiB 2D and 3D round trips through
// a kernel; errors (width > pitch, copies past the end of an allocation) printed by name.
//
// Every device allocation is initialised whole with cudaMemset and mirrored by a host model to which
// every operation is applied too; after each group the whole allocation (padding included) is read
// back raw and compared with the model, so a byte written outside its rectangle is found as well.
#include "common.h"

#include <vector>

static const int POISON = 0xA5;   // device bytes nothing has written yet
static const int HPOISON = 0x5C;  // host destination bytes nothing has written yet

typedef std::vector<uint8_t> Bytes;

// Reports a group: `<what>: ok`, or the first differing byte (a failure).
static bool verdict(const char *what, const uint8_t *got, const uint8_t *want, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            printf("%s: WRONG (first difference at byte %zu of %zu)\n", what, i, n);
            g_failures++;
            return false;
        }
    }
    printf("%s: ok\n", what);
    return true;
}

// Reads a whole device allocation back (padding included) and compares it with its model.
static bool check_dev(const char *what, const void *dev, const Bytes &model) {
    Bytes got(model.size());
    CHECK(cudaMemcpy(got.data(), dev, model.size(), cudaMemcpyDeviceToHost));
    return verdict(what, got.data(), model.data(), model.size());
}

// A box copy / set in the host model: pitch in bytes, rows = rows per slice, positions in bytes/rows.
static void model_copy(uint8_t *dst, size_t dpitch, size_t drows, cudaPos dp, const uint8_t *src, size_t spitch,
                       size_t srows, cudaPos sp, cudaExtent e) {
    for (size_t z = 0; z < e.depth; z++)
        for (size_t y = 0; y < e.height; y++)
            memcpy(dst + ((dp.z + z) * drows + dp.y + y) * dpitch + dp.x,
                   src + ((sp.z + z) * srows + sp.y + y) * spitch + sp.x, e.width);
}
static void model_set(uint8_t *dst, size_t pitch, size_t rows, cudaPos p, int v, cudaExtent e) {
    for (size_t z = 0; z < e.depth; z++)
        for (size_t y = 0; y < e.height; y++) memset(dst + ((p.z + z) * rows + p.y + y) * pitch + p.x, v, e.width);
}

// A pitched 2D allocation with its model.
struct Pitched {
    uint8_t *d = nullptr;
    size_t pitch = 0, w = 0, h = 0;
    Bytes model;
};
static Pitched pitched(size_t w, size_t h) {
    Pitched p;
    p.w = w;
    p.h = h;
    CHECK(cudaMallocPitch((void **)&p.d, &p.pitch, w, h));
    CHECK(cudaMemset(p.d, POISON, p.pitch * h));
    p.model.assign(p.pitch * h, (uint8_t)POISON);
    return p;
}

// A cudaMalloc3D allocation with its model.
struct Vol {
    cudaPitchedPtr p;
    size_t d = 0;
    Bytes model;
    size_t bytes() const { return p.pitch * p.ysize * d; }
};
static Vol vol(size_t w, size_t h, size_t d) {
    Vol v;
    v.d = d;
    CHECK(cudaMalloc3D(&v.p, make_cudaExtent(w, h, d)));
    CHECK(cudaMemset(v.p.ptr, POISON, v.bytes()));
    v.model.assign(v.bytes(), (uint8_t)POISON);
    return v;
}

// The same box of a cudaPitchedPtr as a pointer to its first byte (for cudaMemset3D).
// The parameters of a 3D copy of `extent` from src at sp to dst at dp (no arrays).
static cudaMemcpy3DParms params_3d(cudaPitchedPtr src, cudaPos sp, cudaPitchedPtr dst, cudaPos dp, cudaExtent extent,
                                   cudaMemcpyKind kind) {
    // In the struct's order: srcArray, srcPos, srcPtr, dstArray, dstPos, dstPtr, extent, kind.
    return cudaMemcpy3DParms{nullptr, sp, src, nullptr, dp, dst, extent, kind};
}

static cudaPitchedPtr at(const cudaPitchedPtr &p, cudaPos pos) {
    return make_cudaPitchedPtr((char *)p.ptr + (pos.z * p.ysize + pos.y) * p.pitch + pos.x, p.pitch, p.xsize - pos.x,
                               p.ysize);
}

__global__ void pitched_kernel(float *p, size_t pitch, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) {
        float *row = (float *)((char *)p + y * pitch);
        row[x] = row[x] * 2.0f + (float)x + 1000.0f * (float)y;
    }
}

__global__ void vol_kernel(cudaPitchedPtr p, int w, int h, int d) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y, z = blockIdx.z;
    if (x < w && y < h && z < d) {
        float *row = (float *)((char *)p.ptr + ((size_t)z * p.ysize + y) * p.pitch);
        row[x] = (float)x + 100.0f * (float)y + 10000.0f * (float)z;
    }
}

// Large cases: 4-byte elements changed in place, every bit kept meaningful (no float NaN games).
__global__ void xor_kernel(uint8_t *base, size_t pitch, size_t rows, int w, int h, int d) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y, z = blockIdx.z;
    if (x < w && y < h && z < d) {
        uint32_t *row = (uint32_t *)(base + ((size_t)z * rows + y) * pitch);
        row[x] ^= 0x9E3779B9u ^ (uint32_t)(x + 4096 * y + 16777216u * z);
    }
}
static uint32_t xor_value(uint32_t v, int x, int y, int z) {
    return v ^ 0x9E3779B9u ^ (uint32_t)(x + 4096 * y + 16777216u * z);
}

// Runs the 2D float kernel on a small pitched allocation and checks it: proves the context works.
static void verify_context(const char *after) {
    const int w = 37, h = 5;
    float *d;
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&d, &pitch, w * sizeof(float), h));
    std::vector<float> in(w * h), out(w * h);
    for (int i = 0; i < w * h; i++) in[i] = (float)(i % 97);
    CHECK(cudaMemcpy2D(d, pitch, in.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
    pitched_kernel<<<dim3(1, h), 64>>>(d, pitch, w, h);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy2D(out.data(), w * sizeof(float), d, pitch, w * sizeof(float), h, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d));
    int bad = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) bad += out[y * w + x] != in[y * w + x] * 2.0f + x + 1000.0f * y;
    printf("  context works after %s: %s\n", after, bad ? "no" : "yes");
    EXPECT(bad == 0, "kernel after %s: %d wrong", after, bad);
}

static void bad_call(const char *what, cudaError_t e) {
    expect_some_err(what, e);
    report("  cudaGetLastError", cudaGetLastError());
}

int main() {
    test_init("memory_2d3d");
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    // 1. Pitches: printed, so they must equal the native ones.
    const size_t widths[] = {1, 100, 511, 512, 1000, 4097, 8192, 65539};
    for (size_t w : widths) {
        void *p;
        size_t pitch = 0;
        CHECK(cudaMallocPitch(&p, &pitch, w, 3));
        printf("cudaMallocPitch width %zu height 3: pitch %zu\n", w, pitch);
        EXPECT(pitch >= w, "pitch %zu < width %zu", pitch, w);
        CHECK(cudaFree(p));
    }
    const cudaExtent exts[] = {make_cudaExtent(1, 1, 1), make_cudaExtent(100, 7, 5), make_cudaExtent(4097, 3, 2),
                               make_cudaExtent(1024, 256, 1)};
    for (const cudaExtent &e : exts) {
        cudaPitchedPtr p;
        CHECK(cudaMalloc3D(&p, e));
        printf("cudaMalloc3D %zu x %zu x %zu: pitch %zu xsize %zu ysize %zu\n", e.width, e.height, e.depth, p.pitch,
               p.xsize, p.ysize);
        EXPECT(p.pitch >= e.width && p.xsize == e.width && p.ysize == e.height, "cudaMalloc3D fields");
        CHECK(cudaFree(p.ptr));
    }

    // 2. 2D round trip: host (pitch W+13) -> pitched device -> host (pitch W+7).
    {
        const size_t W = 1000, H = 37, sp = W + 13, hp = W + 7;
        Pitched a = pitched(W, H);
        Bytes src(sp * H), dst(hp * H, (uint8_t)HPOISON), want(hp * H, (uint8_t)HPOISON);
        fill_pattern(src.data(), src.size(), 21);
        CHECK(cudaMemcpy2D(a.d, a.pitch, src.data(), sp, W, H, cudaMemcpyHostToDevice));
        model_copy(a.model.data(), a.pitch, H, make_cudaPos(0, 0, 0), src.data(), sp, H, make_cudaPos(0, 0, 0),
                   make_cudaExtent(W, H, 1));
        check_dev("2D H2D: device rows and padding", a.d, a.model);
        CHECK(cudaMemcpy2D(dst.data(), hp, a.d, a.pitch, W, H, cudaMemcpyDeviceToHost));
        model_copy(want.data(), hp, H, make_cudaPos(0, 0, 0), src.data(), sp, H, make_cudaPos(0, 0, 0),
                   make_cudaExtent(W, H, 1));
        verdict("2D H2D/D2H round trip (host pitches 1013 and 1007)", dst.data(), want.data(), dst.size());

        // 3. Device to device between sub-rectangles of two pitched allocations.
        Pitched b = pitched(1200, 60);
        CHECK(cudaMemcpy2D(b.d + 11 * b.pitch + 101, b.pitch, a.d + 5 * a.pitch + 37, a.pitch, 300, 20,
                           cudaMemcpyDeviceToDevice));
        model_copy(b.model.data(), b.pitch, 60, make_cudaPos(101, 11, 0), a.model.data(), a.pitch, H,
                   make_cudaPos(37, 5, 0), make_cudaExtent(300, 20, 1));
        CHECK(cudaMemcpy2D(b.d + 40 * b.pitch + 899, b.pitch, a.d + 30 * a.pitch + 1, a.pitch, 301, 7,
                           cudaMemcpyDefault));
        model_copy(b.model.data(), b.pitch, 60, make_cudaPos(899, 40, 0), a.model.data(), a.pitch, H,
                   make_cudaPos(1, 30, 0), make_cudaExtent(301, 7, 1));
        check_dev("2D D2D sub-rectangles (explicit kind and cudaMemcpyDefault)", b.d, b.model);

        // 4. cudaMemset2D / cudaMemset2DAsync on sub-rectangles; the bytes around stay as they were.
        CHECK(cudaMemset2D(b.d + 4 * b.pitch + 17, b.pitch, 0x3C, 123, 9));
        model_set(b.model.data(), b.pitch, 60, make_cudaPos(17, 4, 0), 0x3C, make_cudaExtent(123, 9, 1));
        CHECK(cudaMemset2DAsync(b.d + 20 * b.pitch + 1199, b.pitch, 0x77, 1, 33, s));
        model_set(b.model.data(), b.pitch, 60, make_cudaPos(1199, 20, 0), 0x77, make_cudaExtent(1, 33, 1));
        CHECK(cudaMemset2DAsync(b.d + 55 * b.pitch, b.pitch, 0, 1200, 5, s));
        model_set(b.model.data(), b.pitch, 60, make_cudaPos(0, 55, 0), 0, make_cudaExtent(1200, 5, 1));
        CHECK(cudaStreamSynchronize(s));
        check_dev("cudaMemset2D/cudaMemset2DAsync sub-rectangles", b.d, b.model);
        CHECK(cudaFree(a.d));
        CHECK(cudaFree(b.d));
    }

    // 5. cudaMemcpy2DAsync on a created stream, pageable and cudaMallocHost memory.
    for (int pinned = 0; pinned < 2; pinned++) {
        const size_t W = 777, H = 41, sp = 800, hp = 790;
        Pitched c = pitched(W, H);
        uint8_t *src, *dst;
        if (pinned) {
            CHECK(cudaMallocHost((void **)&src, sp * H));
            CHECK(cudaMallocHost((void **)&dst, hp * H));
        } else {
            src = (uint8_t *)malloc(sp * H);
            dst = (uint8_t *)malloc(hp * H);
        }
        fill_pattern(src, sp * H, 30 + pinned);
        memset(dst, HPOISON, hp * H);
        Bytes want(hp * H, (uint8_t)HPOISON);
        CHECK(cudaMemcpy2DAsync(c.d + 2 * c.pitch + 3, c.pitch, src + sp + 5, sp, 500, 30, cudaMemcpyHostToDevice, s));
        model_copy(c.model.data(), c.pitch, H, make_cudaPos(3, 2, 0), src, sp, H, make_cudaPos(5, 1, 0),
                   make_cudaExtent(500, 30, 1));
        CHECK(cudaMemcpy2DAsync(dst + 9, hp, c.d, c.pitch, W, H, cudaMemcpyDeviceToHost, s));
        model_copy(want.data(), hp, H, make_cudaPos(9, 0, 0), c.model.data(), c.pitch, H, make_cudaPos(0, 0, 0),
                   make_cudaExtent(W, H, 1));
        CHECK(cudaStreamSynchronize(s));
        printf("cudaMemcpy2DAsync, %s host memory:\n", pinned ? "cudaMallocHost" : "pageable");
        check_dev("  device allocation after H2D", c.d, c.model);
        verdict("  D2H into host pitch 790 at offset 9", dst, want.data(), hp * H);
        if (pinned) {
            CHECK(cudaFreeHost(src));
            CHECK(cudaFreeHost(dst));
        } else {
            free(src);
            free(dst);
        }
        CHECK(cudaFree(c.d));
    }

    // 6. Kernels addressing pitched memory through the pitch.
    {
        const int w = 333, h = 77;
        float *d;
        size_t pitch;
        CHECK(cudaMallocPitch((void **)&d, &pitch, w * sizeof(float), h));
        CHECK(cudaMemset(d, POISON, pitch * h));
        std::vector<float> in(w * h), out(w * h);
        for (int i = 0; i < w * h; i++) in[i] = (float)(i % 1009);
        CHECK(cudaMemcpy2D(d, pitch, in.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
        pitched_kernel<<<dim3((w + 127) / 128, h), 128>>>(d, pitch, w, h);
        CHECK_LAUNCH();
        Bytes raw(pitch * h);
        CHECK(cudaMemcpy(raw.data(), d, raw.size(), cudaMemcpyDeviceToHost));
        int bad = 0, pad_bad = 0;
        for (int y = 0; y < h; y++) {
            for (int x = 0; x < w; x++) {
                float v;
                memcpy(&v, &raw[y * pitch + x * sizeof(float)], sizeof v);
                bad += v != in[y * w + x] * 2.0f + x + 1000.0f * y;
            }
            for (size_t b = w * sizeof(float); b < pitch; b++) pad_bad += raw[y * pitch + b] != POISON;
        }
        printf("kernel on pitched 2D floats (333 x 77): values %s, padding %s\n", bad ? "WRONG" : "ok",
               pad_bad ? "CHANGED" : "untouched");
        EXPECT(bad == 0 && pad_bad == 0, "pitched kernel: %d values, %d padding bytes", bad, pad_bad);
        CHECK(cudaFree(d));

        const int vw = 45, vh = 13, vd = 7;
        Vol v = vol(vw * sizeof(float), vh, vd);
        vol_kernel<<<dim3(1, vh, vd), 64>>>(v.p, vw, vh, vd);
        CHECK_LAUNCH();
        std::vector<float> host(vw * vh * vd);
        cudaMemcpy3DParms p = {};
        p.srcPtr = v.p;
        p.dstPtr = make_cudaPitchedPtr(host.data(), vw * sizeof(float), vw * sizeof(float), vh);
        p.extent = make_cudaExtent(vw * sizeof(float), vh, vd);
        p.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&p));
        bad = 0;
        for (int z = 0; z < vd; z++)
            for (int y = 0; y < vh; y++)
                for (int x = 0; x < vw; x++) bad += host[(z * vh + y) * vw + x] != x + 100.0f * y + 10000.0f * z;
        printf("kernel on cudaMalloc3D floats (45 x 13 x 7), read with cudaMemcpy3D: %s\n", bad ? "WRONG" : "ok");
        EXPECT(bad == 0, "3D kernel: %d wrong", bad);
        CHECK(cudaFree(v.p.ptr));
    }

    // 7. cudaMemcpy3D with positions: host -> device, device -> host, device -> device, async, memsets, peer.
    {
        const size_t hw = 150, hh = 25, hd = 12;
        Bytes host(hw * hh * hd);
        fill_pattern(host.data(), host.size(), 40);
        Vol x = vol(200, 20, 10), y = vol(300, 30, 12);
        printf("cudaMalloc3D 200 x 20 x 10: pitch %zu; 300 x 30 x 12: pitch %zu\n", x.p.pitch, y.p.pitch);

        cudaMemcpy3DParms p = params_3d(make_cudaPitchedPtr(host.data(), hw, hw, hh), make_cudaPos(7, 3, 2), x.p, make_cudaPos(11, 4, 1),
                                        make_cudaExtent(120, 15, 8), cudaMemcpyHostToDevice);
        CHECK(cudaMemcpy3D(&p));
        model_copy(x.model.data(), x.p.pitch, 20, p.dstPos, host.data(), hw, hh, p.srcPos, p.extent);
        check_dev("3D H2D box 120 x 15 x 8 from (7,3,2) to (11,4,1)", x.p.ptr, x.model);

        const size_t dw = 230, dh = 22, dd = 11;
        Bytes dst(dw * dh * dd, (uint8_t)HPOISON), want(dst);
        p = params_3d(x.p, make_cudaPos(0, 0, 0), make_cudaPitchedPtr(dst.data(), dw, dw, dh), make_cudaPos(5, 1, 2),
                      make_cudaExtent(200, 20, 9), cudaMemcpyDeviceToHost);
        CHECK(cudaMemcpy3D(&p));
        model_copy(want.data(), dw, dh, p.dstPos, x.model.data(), x.p.pitch, 20, p.srcPos, p.extent);
        verdict("3D D2H 200 x 20 x 9 into host 230 x 22 x 11 at (5,1,2)", dst.data(), want.data(), dst.size());

        p = params_3d(x.p, make_cudaPos(10, 2, 1), y.p, make_cudaPos(100, 15, 5), make_cudaExtent(150, 12, 6), cudaMemcpyDeviceToDevice);
        CHECK(cudaMemcpy3D(&p));
        model_copy(y.model.data(), y.p.pitch, 30, p.dstPos, x.model.data(), x.p.pitch, 20, p.srcPos, p.extent);
        check_dev("3D D2D box 150 x 12 x 6 from (10,2,1) to (100,15,5)", y.p.ptr, y.model);

        uint8_t *pin_src, *pin_dst;
        const size_t pn = 64 * 16 * 4;
        CHECK(cudaMallocHost((void **)&pin_src, pn));
        CHECK(cudaMallocHost((void **)&pin_dst, pn));
        fill_pattern(pin_src, pn, 41);
        memset(pin_dst, HPOISON, pn);
        p = params_3d(make_cudaPitchedPtr(pin_src, 64, 64, 16), make_cudaPos(0, 0, 0), y.p, make_cudaPos(3, 1, 7),
                      make_cudaExtent(64, 16, 4), cudaMemcpyHostToDevice);
        CHECK(cudaMemcpy3DAsync(&p, s));
        model_copy(y.model.data(), y.p.pitch, 30, p.dstPos, pin_src, 64, 16, p.srcPos, p.extent);
        p = params_3d(y.p, make_cudaPos(3, 1, 7), make_cudaPitchedPtr(pin_dst, 64, 64, 16), make_cudaPos(0, 0, 0),
                      make_cudaExtent(64, 16, 4), cudaMemcpyDeviceToHost);
        CHECK(cudaMemcpy3DAsync(&p, s));
        CHECK(cudaStreamSynchronize(s));
        verdict("cudaMemcpy3DAsync H2D then D2H (cudaMallocHost memory)", pin_dst, pin_src, pn);
        check_dev("cudaMemcpy3DAsync: device allocation", y.p.ptr, y.model);
        CHECK(cudaFreeHost(pin_src));
        CHECK(cudaFreeHost(pin_dst));

        CHECK(cudaMemset3D(at(y.p, make_cudaPos(20, 3, 2)), 0x42, make_cudaExtent(50, 7, 3)));
        model_set(y.model.data(), y.p.pitch, 30, make_cudaPos(20, 3, 2), 0x42, make_cudaExtent(50, 7, 3));
        CHECK(cudaMemset3DAsync(at(y.p, make_cudaPos(299, 29, 0)), 0x01, make_cudaExtent(1, 1, 12), s));
        model_set(y.model.data(), y.p.pitch, 30, make_cudaPos(299, 29, 0), 0x01, make_cudaExtent(1, 1, 12));
        CHECK(cudaMemset3DAsync(at(y.p, make_cudaPos(0, 0, 10)), 0x00, make_cudaExtent(300, 30, 1), s));
        model_set(y.model.data(), y.p.pitch, 30, make_cudaPos(0, 0, 10), 0x00, make_cudaExtent(300, 30, 1));
        CHECK(cudaStreamSynchronize(s));
        check_dev("cudaMemset3D/cudaMemset3DAsync sub-boxes", y.p.ptr, y.model);

        cudaMemcpy3DPeerParms pp = {};
        pp.srcPtr = y.p;
        pp.srcDevice = 0;
        pp.srcPos = make_cudaPos(90, 10, 4);
        pp.dstPtr = x.p;
        pp.dstDevice = 0;
        pp.dstPos = make_cudaPos(0, 0, 0);
        pp.extent = make_cudaExtent(200, 20, 3);
        CHECK(cudaMemcpy3DPeer(&pp));
        model_copy(x.model.data(), x.p.pitch, 20, pp.dstPos, y.model.data(), y.p.pitch, 30, pp.srcPos, pp.extent);
        pp.srcPos = make_cudaPos(0, 0, 0);
        pp.dstPos = make_cudaPos(100, 10, 7);
        pp.extent = make_cudaExtent(100, 10, 3);
        CHECK(cudaMemcpy3DPeerAsync(&pp, s));
        model_copy(x.model.data(), x.p.pitch, 20, pp.dstPos, y.model.data(), y.p.pitch, 30, pp.srcPos, pp.extent);
        CHECK(cudaStreamSynchronize(s));
        check_dev("cudaMemcpy3DPeer/cudaMemcpy3DPeerAsync device 0 -> device 0", x.p.ptr, x.model);
        CHECK(cudaFree(x.p.ptr));
        CHECK(cudaFree(y.p.ptr));
    }

    // 8. Large: 2050 x 2048 4-byte elements (2D) and 256 x 256 x 64 (3D), through a kernel.
    {
        const int w = 2050, h = 2048;
        const size_t row = w * 4, sp = row + 24, hp = row + 40;
        uint32_t *d;
        size_t pitch;
        CHECK(cudaMallocPitch((void **)&d, &pitch, row, h));
        printf("large 2D: %d x %d 4-byte elements, pitch %zu\n", w, h, pitch);
        Bytes src(sp * h);
        fill_pattern(src.data(), src.size(), 50);
        uint8_t *dst;
        CHECK(cudaMallocHost((void **)&dst, hp * h));
        memset(dst, HPOISON, hp * h);
        CHECK(cudaMemcpy2D(d, pitch, src.data(), sp, row, h, cudaMemcpyHostToDevice));
        xor_kernel<<<dim3((w + 255) / 256, h, 1), 256>>>((uint8_t *)d, pitch, h, w, h, 1);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy2DAsync(dst, hp, d, pitch, row, h, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        Bytes want(hp * h, (uint8_t)HPOISON);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                uint32_t v;
                memcpy(&v, &src[y * sp + x * 4], 4);
                v = xor_value(v, x, y, 0);
                memcpy(&want[y * hp + x * 4], &v, 4);
            }
        verdict("large 2D H2D (pageable), kernel, D2H async (pinned): every byte", dst, want.data(), hp * h);
        CHECK(cudaFreeHost(dst));
        CHECK(cudaFree(d));

        const int vw = 256, vh = 256, vd = 64;
        cudaPitchedPtr v;
        CHECK(cudaMalloc3D(&v, make_cudaExtent(vw * 4, vh, vd)));
        printf("large 3D: %d x %d x %d 4-byte elements, pitch %zu\n", vw, vh, vd, v.pitch);
        Bytes vsrc((size_t)vw * 4 * vh * vd), vdst(vsrc.size(), (uint8_t)HPOISON);
        fill_pattern(vsrc.data(), vsrc.size(), 51);
        cudaMemcpy3DParms p = {};
        p.srcPtr = make_cudaPitchedPtr(vsrc.data(), vw * 4, vw * 4, vh);
        p.dstPtr = v;
        p.extent = make_cudaExtent(vw * 4, vh, vd);
        p.kind = cudaMemcpyHostToDevice;
        CHECK(cudaMemcpy3D(&p));
        xor_kernel<<<dim3(1, vh, vd), 256>>>((uint8_t *)v.ptr, v.pitch, v.ysize, vw, vh, vd);
        CHECK_LAUNCH();
        p = {};
        p.srcPtr = v;
        p.dstPtr = make_cudaPitchedPtr(vdst.data(), vw * 4, vw * 4, vh);
        p.extent = make_cudaExtent(vw * 4, vh, vd);
        p.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&p));
        for (size_t i = 0; i < vsrc.size(); i += 4) {
            uint32_t e;
            memcpy(&e, &vsrc[i], 4);
            size_t k = i / 4;
            e = xor_value(e, (int)(k % vw), (int)(k / vw % vh), (int)(k / vw / vh));
            memcpy(&vsrc[i], &e, 4);
        }
        verdict("large 3D H2D, kernel, D2H: every byte", vdst.data(), vsrc.data(), vsrc.size());
        CHECK(cudaFree(v.ptr));
    }

    // 9. Errors: printed by name (the native run is the reference); the context keeps working.
    {
        const size_t W = 4096, H = 512;  // 2 MiB: the end of the allocation is a granule boundary
        uint8_t *d;
        size_t pitch;
        CHECK(cudaMallocPitch((void **)&d, &pitch, W, H));
        Bytes host((pitch + 64) * (H + 8));
        bad_call("cudaMemcpy2D H2D with width > destination pitch",
                 cudaMemcpy2D(d, pitch, host.data(), pitch + 64, pitch + 1, 2, cudaMemcpyHostToDevice));
        bad_call("cudaMemcpy2D H2D with width > source pitch",
                 cudaMemcpy2D(d, pitch, host.data(), 16, 32, 2, cudaMemcpyHostToDevice));
        bad_call("cudaMemcpy2D D2H with width > source pitch",
                 cudaMemcpy2D(host.data(), pitch + 64, d, pitch, pitch + 1, 2, cudaMemcpyDeviceToHost));
        verify_context("width > pitch");
        bad_call("cudaMemcpy2D D2H of 8 rows past the end of the allocation",
                 cudaMemcpy2D(host.data(), W, d + (H - 4) * pitch, pitch, W, 12, cudaMemcpyDeviceToHost));
        bad_call("cudaMemcpy2D H2D of 8 rows past the end of the allocation",
                 cudaMemcpy2D(d + (H - 4) * pitch, pitch, host.data(), W, W, 12, cudaMemcpyHostToDevice));
        bad_call("cudaMemset2D of 8 rows past the end of the allocation",
                 cudaMemset2D(d + (H - 4) * pitch, pitch, 0, W, 12));
        verify_context("2D copies past the end");
        CHECK(cudaFree(d));
    }

    CHECK(cudaStreamDestroy(s));
    return test_finish();
}

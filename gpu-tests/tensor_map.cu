// Tensor maps through the driver API (linked with -lcuda), encoded by the driver that serves the
// program (through Flyt: the GPU server's), and the one-device queries beside them.
//
// A map embeds its tensor's address, which differs between runs, so no map is printed as it is:
// what is printed is address-independent. For pairs of maps of the same buffer that differ in one
// parameter (box, swizzle, data type, rank, interleave, L2 promotion, OOB fill, im2col corners,
// im2col-wide mode), the XOR of their 128 bytes in hex (the address cancels out); whether encoding
// twice gives the same bytes; whether cuTensorMapReplaceAddress to a second buffer gives the bytes
// of a map encoded there, and whether moving it back restores the first; the error names of
// invalid parameters (the driver validates them). Then cuDeviceCanAccessPeer,
// cuCtxEnablePeerAccess/DisablePeerAccess, cuMemPoolGetAccess of the default pool,
// cuStreamGetDevice/GetCtx and cudaStreamGetDevice/GetId, printed.
#include "driver_check.h"

static const char *cu_name(CUresult r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    return name;
}

// A tiled map of a `rows` x `cols` matrix at `base` (row pitch `cols` elements rounded up to 16
// bytes), with the box and options given.
struct Tiled {
    CUtensorMapDataType type;
    size_t element;
    cuuint32_t rank;
    cuuint64_t dims[5];
    cuuint32_t box[5];
    CUtensorMapInterleave interleave;
    CUtensorMapSwizzle swizzle;
    CUtensorMapL2promotion l2;
    CUtensorMapFloatOOBfill oob;
};

// A variant of a Tiled description: its label and what it changes.
struct Change {
    const char *what;
    void (*apply)(Tiled &t);
    Tiled applied_to(Tiled t) const {
        apply(t);
        return t;
    }
};

static CUresult encode_tiled(CUtensorMap *map, const Tiled &t, void *base) {
    cuuint64_t strides[4];
    cuuint64_t stride = t.dims[0] * t.element;
    for (cuuint32_t i = 1; i < t.rank; i++) {
        strides[i - 1] = stride;
        stride *= t.dims[i];
    }
    cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
    return cuTensorMapEncodeTiled(map, t.type, t.rank, base, t.dims, strides, t.box, element_strides, t.interleave, t.swizzle,
                                  t.l2, t.oob);
}

// A 4-D NHWC float tensor (n, h, w, c) for im2col maps.
static CUresult encode_im2col(CUtensorMap *map, void *base, int lower, int upper, cuuint32_t channels, cuuint32_t pixels,
                              CUtensorMapSwizzle swizzle) {
    cuuint64_t dims[4] = {64, 16, 16, 2};  // c, w, h, n
    cuuint64_t strides[3] = {64 * 4, 64 * 4 * 16, 64 * 4 * 16 * 16};
    int lo[2] = {lower, lower}, hi[2] = {upper, upper};
    cuuint32_t element_strides[4] = {1, 1, 1, 1};
    return cuTensorMapEncodeIm2col(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, base, dims, strides, lo, hi, channels, pixels,
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

static CUresult encode_im2col_wide(CUtensorMap *map, void *base, CUtensorMapIm2ColWideMode mode) {
    cuuint64_t dims[3] = {64, 32, 2};  // c, w, n
    cuuint64_t strides[2] = {64 * 4, 64 * 4 * 32};
    cuuint32_t element_strides[3] = {1, 1, 1};
    return cuTensorMapEncodeIm2colWide(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, base, dims, strides, -1, 1, 64, 32, element_strides,
                                       CU_TENSOR_MAP_INTERLEAVE_NONE, mode, CU_TENSOR_MAP_SWIZZLE_128B,
                                       CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

static void print_xor(const char *what, const CUtensorMap &a, const CUtensorMap &b) {
    const unsigned char *x = (const unsigned char *)&a, *y = (const unsigned char *)&b;
    printf("%s:", what);
    for (int i = 0; i < 128; i++) printf("%s%02x", i % 16 == 0 ? "\n  " : (i % 4 == 0 ? " " : ""), x[i] ^ y[i]);
    printf("\n");
}

static bool same(const CUtensorMap &a, const CUtensorMap &b) { return memcmp(&a, &b, sizeof a) == 0; }

// The XOR of two maps when the second encoding succeeded, else its error name (the native run is
// the reference for which parameter sets the driver takes).
static void show(const char *what, CUresult encoded, const CUtensorMap &a, const CUtensorMap &b) {
    if (encoded != CUDA_SUCCESS) {
        printf("%s: %s\n", what, cu_name(encoded));
        return;
    }
    print_xor(what, a, b);
}

int main() {
    test_init("tensor_map");
    CHECK(cudaFree(0));
    int major = 0;
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    const size_t bytes = 8 << 20;
    void *a, *b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));

    if (major < 9) {
        printf("tensor maps need compute capability 9.0 (Hopper) or newer: skipped\n");
    } else {
        const Tiled base = {CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 2, {256, 128}, {32, 16},
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE};
        CUtensorMap m0, m1, again;
        CHECK_CU(encode_tiled(&m0, base, a));
        CHECK_CU(encode_tiled(&again, base, a));
        printf("encoding twice gives the same map: %s\n", same(m0, again) ? "yes" : "no");
        EXPECT(same(m0, again), "deterministic encoding");

        const Change changes[] = {
            {"tiled, box 32x16 vs 64x8", [](Tiled &t) { t.box[0] = 64; t.box[1] = 8; }},
            {"tiled, swizzle none vs 128B", [](Tiled &t) { t.swizzle = CU_TENSOR_MAP_SWIZZLE_128B; }},
            {"tiled, L2 promotion none vs 128B", [](Tiled &t) { t.l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_128B; }},
            {"tiled, OOB fill none vs NaN", [](Tiled &t) { t.oob = CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA; }},
            // dims[0] 512: the same row pitch in bytes
            {"tiled, float32 vs float16", [](Tiled &t) { t.type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16; t.element = 2; t.dims[0] = 512; }},
            {"tiled, rank 2 vs 3", [](Tiled &t) { t.rank = 3; t.dims[1] = 64; t.dims[2] = 2; t.box[2] = 1; }},
            // box[0] 8: 32 bytes of float32
            {"tiled, interleave none vs 32B (swizzle 32B, box 8x16)",
             [](Tiled &t) { t.interleave = CU_TENSOR_MAP_INTERLEAVE_32B; t.swizzle = CU_TENSOR_MAP_SWIZZLE_32B; t.box[0] = 8; }},
        };
        for (const Change &c : changes) show(c.what, encode_tiled(&m1, c.applied_to(base), a), m0, m1);

        // Moving a map: cuTensorMapReplaceAddress to b equals encoding at b, and back restores it.
        CUtensorMap at_b, moved = m0;
        CHECK_CU(encode_tiled(&at_b, base, b));
        CHECK_CU(cuTensorMapReplaceAddress(&moved, b));
        printf("replace address equals encoding there: %s\n", same(moved, at_b) ? "yes" : "no");
        printf("the address is in the map: %s\n", same(m0, at_b) ? "no" : "yes");
        CHECK_CU(cuTensorMapReplaceAddress(&moved, a));
        printf("moving it back restores it: %s\n", same(moved, m0) ? "yes" : "no");
        EXPECT(same(moved, m0), "replace address round trip");

        // im2col and im2col-wide maps.
        CUtensorMap i0, i1;
        CUresult im2col = encode_im2col(&i0, a, -1, 1, 64, 32, CU_TENSOR_MAP_SWIZZLE_NONE);
        printf("im2col: %s\n", cu_name(im2col));
        if (im2col == CUDA_SUCCESS) {
            show("im2col, corners -1/1 vs 0/0", encode_im2col(&i1, a, 0, 0, 64, 32, CU_TENSOR_MAP_SWIZZLE_NONE), i0, i1);
            show("im2col, 64 channels x 32 pixels vs 32 x 64, swizzle 128B",
                 encode_im2col(&i1, a, -1, 1, 32, 64, CU_TENSOR_MAP_SWIZZLE_128B), i0, i1);
            print_xor("im2col vs tiled", i0, m0);
        }
        CUresult wide = encode_im2col_wide(&i0, a, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W);
        printf("im2col-wide (mode W): %s\n", cu_name(wide));
        if (wide == CUDA_SUCCESS) {
            CUresult w128 = encode_im2col_wide(&i1, a, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128);
            printf("im2col-wide (mode W128): %s\n", cu_name(w128));
            if (w128 == CUDA_SUCCESS) print_xor("im2col-wide, mode W vs W128", i0, i1);
        }

        // The driver validates: error names printed.
        CUtensorMap bad;
        const Change refused[] = {
            {"rank 0", [](Tiled &t) { t.rank = 0; }},
            {"rank 6", [](Tiled &t) { t.rank = 6; }},
            {"box wider than 256", [](Tiled &t) { t.box[0] = 512; }},
            {"unaligned stride", [](Tiled &t) { t.dims[0] = 255; }},  // a row pitch that is no multiple of 16 bytes
        };
        for (const Change &c : refused) printf("%s: %s\n", c.what, cu_name(encode_tiled(&bad, c.applied_to(base), a)));
        printf("unaligned address: %s\n", cu_name(encode_tiled(&bad, base, (char *)a + 8)));
        Tiled t = base;
        t.swizzle = CU_TENSOR_MAP_SWIZZLE_32B;  // a 128-byte inner box: wider than the swizzle span
        printf("box wider than the swizzle: %s\n", cu_name(encode_tiled(&bad, t, a)));
        printf("im2col of rank 2: %s\n",
               cu_name(cuTensorMapEncodeIm2col(&bad, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, a, base.dims, base.dims, NULL, NULL, 8,
                                               8, base.box, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)));
        printf("replace to an unaligned address: %s\n", cu_name(cuTensorMapReplaceAddress(&moved, (char *)b + 8)));
    }

    // One-device queries.
    CUdevice dev;
    CUcontext ctx;
    CHECK_CU(cuCtxGetDevice(&dev));
    CHECK_CU(cuCtxGetCurrent(&ctx));
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    int can = -1;
    CHECK_CU(cuDeviceCanAccessPeer(&can, dev, dev));
    printf("device can access itself as a peer: %d\n", can);
    CHECK(cudaDeviceCanAccessPeer(&can, 0, 0));
    printf("cudaDeviceCanAccessPeer(0, 0): %d\n", can);
    printf("cuDeviceCanAccessPeer of a device that does not exist: %s\n", cu_name(cuDeviceCanAccessPeer(&can, dev, count)));
    printf("cuCtxEnablePeerAccess(own context): %s\n", cu_name(cuCtxEnablePeerAccess(ctx, 0)));
    printf("cuCtxDisablePeerAccess(own context): %s\n", cu_name(cuCtxDisablePeerAccess(ctx)));
    printf("cudaDeviceEnablePeerAccess(0): %s\n", cudaGetErrorName(cudaDeviceEnablePeerAccess(0, 0)));
    printf("cudaDeviceDisablePeerAccess(0): %s\n", cudaGetErrorName(cudaDeviceDisablePeerAccess(0)));
    cudaGetLastError();

    CUmemoryPool pool;
    CHECK_CU(cuDeviceGetDefaultMemPool(&pool, dev));
    CUmemLocation here = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
    CUmemAccess_flags access;
    CHECK_CU(cuMemPoolGetAccess(&access, pool, &here));
    printf("default pool access from its device: %d\n", (int)access);
    CUmemAccessDesc desc = {here, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    printf("cuMemPoolSetAccess(read-write, its device): %s\n", cu_name(cuMemPoolSetAccess(pool, &desc, 1)));
    CUmemoryPool by_location;
    CHECK_CU(cuMemGetDefaultMemPool(&by_location, &here, CU_MEM_ALLOCATION_TYPE_PINNED));
    printf("cuMemGetDefaultMemPool is the device's default pool: %s\n", by_location == pool ? "yes" : "no");

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUdevice stream_dev = -1;
    CUcontext stream_ctx = NULL;
    CHECK_CU(cuStreamGetDevice((CUstream)s, &stream_dev));
    CHECK_CU(cuStreamGetCtx((CUstream)s, &stream_ctx));
    printf("stream device: %d, in the current context: %s\n", (int)stream_dev, stream_ctx == ctx ? "yes" : "no");
    int rt_dev = -1;
    unsigned long long id = 0, legacy = 0;
    CHECK(cudaStreamGetDevice(s, &rt_dev));
    CHECK(cudaStreamGetId(s, &id));
    CHECK(cudaStreamGetId(cudaStreamLegacy, &legacy));
    printf("cudaStreamGetDevice: %d, stream ids differ from the legacy stream's: %s\n", rt_dev, id != legacy ? "yes" : "no");

    // A peer copy within the device.
    CHECK(cudaMemset(a, 0x5c, 4096));
    CHECK(cudaMemcpyPeer(b, 0, a, 0, 4096));
    unsigned char host[4096];
    CHECK(cudaMemcpy(host, b, sizeof host, cudaMemcpyDeviceToHost));
    bool copied = true;
    for (size_t i = 0; i < sizeof host; i++) copied &= host[i] == 0x5c;
    printf("cudaMemcpyPeer within the device: %s\n", copied ? "yes" : "no");
    EXPECT(copied, "peer copy");

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    return test_finish();
}

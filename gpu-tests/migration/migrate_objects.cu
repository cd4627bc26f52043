// migrate_objects: a CUDA runtime program to move while it runs (gpu-tests/migrate.sh, row
// "objects"), holding what plain allocations do not: stream-ordered allocations from the default
// memory pool and from a pool of its own (made current, both with attributes it set), a 2D array
// read through a texture object, a mipmapped array read through a texture at level 1, and an
// array kernels write and read through a surface object, and memory it maps itself with the
// driver's virtual memory API (a reservation, two physical allocations, one of them released
// while mapped). Every round a kernel reads the
// textures and the surface and steps the pool memory and the surface; every tenth round the
// checksums come back and are printed. Integer arithmetic and point sampling only, so the output
// is the same natively and through Flyt, moved or not. The pool pointers and the objects'
// handles are printed at the start and at the end ("pointers: ..."): a move must keep them.
//
// Arguments: rounds (default 200), milliseconds between rounds (default 10), and a gate file:
// halfway, the program keeps a stream busy with kernels on a scratch buffer (which the output
// does not show) until that file exists, so a script can move it as often as it likes mid-run.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>

#include "../common.h"  // CHECK

constexpr int W = 64, H = 32;                 // the 2D array and the surface, in elements
constexpr int MW = 32, MH = 16;               // level 0 of the mipmapped array
constexpr size_t WORDS_A = 1 << 20, WORDS_B = 3000;  // pool allocations, in words

#define CHECK_DRIVER(call)                                                  \
    do {                                                                    \
        CUresult check_result = (call);                                     \
        if (check_result != CUDA_SUCCESS) {                                 \
            printf("FAIL line %d: %s: %d\n", __LINE__, #call, check_result); \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

__global__ void step_mapped(unsigned *v, size_t words, const unsigned *a, unsigned round) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
        v[i] = v[i] * 134775813u + a[i % WORDS_A] + round;
}

__global__ void step(unsigned *a, unsigned *b, cudaTextureObject_t plane, cudaTextureObject_t mip,
                     cudaSurfaceObject_t surface, unsigned round) {
    unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t i = t; i < WORDS_A; i += gridDim.x * blockDim.x) {
        int x = i % W, y = (i / W) % H;
        unsigned texel = tex2D<unsigned>(plane, x + 0.5f, y + 0.5f);
        // Level 1 is MW/2 x MH/2; a mipmapped texture takes normalized coordinates.
        unsigned lod = tex2DLod<unsigned>(mip, ((x % (MW / 2)) + 0.5f) / (MW / 2), ((y % (MH / 2)) + 0.5f) / (MH / 2), 1.0f);
        unsigned cell = surf2Dread<unsigned>(surface, x * 4, y);
        a[i] = a[i] * 1664525u + texel + 3 * lod + cell + round;
    }
    for (size_t i = t; i < WORDS_B; i += gridDim.x * blockDim.x)
        b[i] = b[i] * 22695477u + tex2D<unsigned>(plane, i % W + 0.5f, (i / W) % H + 0.5f) + round;
}

// Each surface cell takes in a word of the pool memory (one thread per cell).
__global__ void stir(const unsigned *a, cudaSurfaceObject_t surface, unsigned round) {
    int x = threadIdx.x, y = blockIdx.x;
    unsigned cell = surf2Dread<unsigned>(surface, x * 4, y);
    surf2Dwrite(cell * 69069u + a[(y * W + x) * 5] + round, surface, x * 4, y);
}

__global__ void checksum(const unsigned *a, size_t words, unsigned long long *out) {
    unsigned long long sum = 0;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) sum += a[i] ^ (i * 2654435761u);
    atomicAdd(out, sum);
}

__global__ void surface_sum(cudaSurfaceObject_t surface, unsigned long long *out) {
    unsigned cell = surf2Dread<unsigned>(surface, threadIdx.x * 4, blockIdx.x);
    atomicAdd(out, (unsigned long long)cell * (threadIdx.x + 1) * (blockIdx.x + 1));
}

__global__ void busy(unsigned *scratch, unsigned round) {
    scratch[threadIdx.x] = scratch[threadIdx.x] * 3u + round;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 10;
    const char *gate = argc > 3 ? argv[3] : nullptr;
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // Pools: the default one with a release threshold, one of the app's own made current.
    cudaMemPool_t fallback, own;
    CHECK(cudaDeviceGetDefaultMemPool(&fallback, 0));
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    CHECK(cudaMemPoolCreate(&own, &props));
    unsigned long long threshold = 64ull << 20;
    CHECK(cudaMemPoolSetAttribute(fallback, cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK(cudaMemPoolSetAttribute(own, cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK(cudaDeviceSetMemPool(0, own));
    unsigned *a, *b;
    CHECK(cudaMallocFromPoolAsync((void **)&a, WORDS_A * 4, fallback, stream));
    CHECK(cudaMallocAsync((void **)&b, WORDS_B * 4, stream));
    CHECK(cudaMemsetAsync(a, 0, WORDS_A * 4, stream));
    CHECK(cudaMemsetAsync(b, 0, WORDS_B * 4, stream));

    // A 2D array and its texture.
    cudaChannelFormatDesc word = cudaCreateChannelDesc<unsigned>();
    cudaArray_t plane, cells;
    CHECK(cudaMallocArray(&plane, &word, W, H));
    unsigned host[W * H];
    for (int i = 0; i < W * H; i++) host[i] = i * 2246822519u;
    CHECK(cudaMemcpy2DToArray(plane, 0, 0, host, W * 4, W * 4, H, cudaMemcpyHostToDevice));
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = plane;
    cudaTextureDesc tex = {};
    tex.addressMode[0] = tex.addressMode[1] = cudaAddressModeClamp;
    tex.filterMode = cudaFilterModePoint;
    tex.readMode = cudaReadModeElementType;
    cudaTextureObject_t plane_tex, mip_tex;
    CHECK(cudaCreateTextureObject(&plane_tex, &res, &tex, nullptr));

    // A mipmapped array, level 1 filled, and its texture.
    cudaMipmappedArray_t mip;
    CHECK(cudaMallocMipmappedArray(&mip, &word, make_cudaExtent(MW, MH, 0), 3));
    cudaArray_t level1;
    CHECK(cudaGetMipmappedArrayLevel(&level1, mip, 1));
    for (int i = 0; i < (MW / 2) * (MH / 2); i++) host[i] = i * 40503u + 7;
    CHECK(cudaMemcpy2DToArray(level1, 0, 0, host, (MW / 2) * 4, (MW / 2) * 4, MH / 2, cudaMemcpyHostToDevice));
    res.resType = cudaResourceTypeMipmappedArray;
    res.res.mipmap.mipmap = mip;
    tex.mipmapFilterMode = cudaFilterModePoint;
    tex.normalizedCoords = 1;
    tex.maxMipmapLevelClamp = 2;
    CHECK(cudaCreateTextureObject(&mip_tex, &res, &tex, nullptr));

    // An array kernels write through a surface.
    CHECK(cudaMallocArray(&cells, &word, W, H, cudaArraySurfaceLoadStore));
    for (int i = 0; i < W * H; i++) host[i] = i;
    CHECK(cudaMemcpy2DToArray(cells, 0, 0, host, W * 4, W * 4, H, cudaMemcpyHostToDevice));
    res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = cells;
    cudaSurfaceObject_t surface;
    CHECK(cudaCreateSurfaceObject(&surface, &res));

    // Memory mapped with the driver's virtual memory API.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t page = 0;
    CHECK_DRIVER(cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr reserved = 0;
    CHECK_DRIVER(cuMemAddressReserve(&reserved, 4 * page, 0, 0, 0));
    CUmemGenericAllocationHandle physical[2];
    for (int m = 0; m < 2; m++) {
        CHECK_DRIVER(cuMemCreate(&physical[m], page, &prop, 0));
        CHECK_DRIVER(cuMemMap(reserved + m * page, page, 0, physical[m], 0));
    }
    CUmemAccessDesc readwrite = {prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK_DRIVER(cuMemSetAccess(reserved, 2 * page, &readwrite, 1));
    CHECK_DRIVER(cuMemRelease(physical[1]));
    unsigned *v = (unsigned *)reserved;
    size_t words_v = 2 * page / 4;
    CHECK(cudaMemsetAsync(v, 0, 2 * page, stream));

    unsigned long long *sums, *sums_host;
    unsigned *scratch;
    CHECK(cudaMalloc((void **)&sums, 4 * sizeof(unsigned long long)));
    CHECK(cudaMalloc((void **)&scratch, 1024 * 4));
    CHECK(cudaMallocHost((void **)&sums_host, 4 * sizeof(unsigned long long)));
    printf("pointers: %p %p %p objects %llu %llu %llu\n", (void *)a, (void *)b, (void *)v, (unsigned long long)plane_tex,
           (unsigned long long)mip_tex, (unsigned long long)surface);
    fflush(stdout);

    struct timespec nap = {0, (long)pause_ms * 1000000L};
    for (int round = 0; round < rounds; round++) {
        step<<<64, 256, 0, stream>>>(a, b, plane_tex, mip_tex, surface, round);
        stir<<<H, W, 0, stream>>>(a, surface, round);
        step_mapped<<<64, 256, 0, stream>>>(v, words_v, a, round);
        CHECK(cudaGetLastError());
        if (round % 10 == 9) {
            CHECK(cudaMemsetAsync(sums, 0, 4 * sizeof(unsigned long long), stream));
            checksum<<<64, 256, 0, stream>>>(a, WORDS_A, sums);
            checksum<<<8, 256, 0, stream>>>(b, WORDS_B, sums + 1);
            surface_sum<<<H, W, 0, stream>>>(surface, sums + 2);
            checksum<<<64, 256, 0, stream>>>(v, words_v, sums + 3);
            CHECK(cudaMemcpyAsync(sums_host, sums, 4 * sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
            CHECK(cudaStreamSynchronize(stream));
            printf("round %d: pool %016llx %016llx surface %016llx mapped %016llx\n", round + 1, sums_host[0], sums_host[1], sums_host[2],
                   sums_host[3]);
            fflush(stdout);
        }
        if (gate && round == rounds / 2) {
            fprintf(stderr, "holding until %s exists\n", gate);
            for (unsigned spin = 0; access(gate, F_OK) != 0; spin++) {
                busy<<<1, 1024, 0, stream>>>(scratch, spin);
                CHECK(cudaStreamSynchronize(stream));
                nanosleep(&nap, nullptr);
            }
        }
        nanosleep(&nap, nullptr);
    }
    CHECK(cudaStreamSynchronize(stream));
    unsigned long long got = 0;
    CHECK(cudaMemPoolGetAttribute(own, cudaMemPoolAttrReleaseThreshold, &got));
    cudaMemPool_t current;
    CHECK(cudaDeviceGetMemPool(&current, 0));
    printf("pool threshold %llu, own pool current: %s\n", got, current == own ? "yes" : "no");
    printf("pointers: %p %p %p objects %llu %llu %llu\n", (void *)a, (void *)b, (void *)v, (unsigned long long)plane_tex,
           (unsigned long long)mip_tex, (unsigned long long)surface);
    CHECK_DRIVER(cuMemUnmap(reserved, 2 * page));
    CHECK_DRIVER(cuMemRelease(physical[0]));
    CHECK_DRIVER(cuMemAddressFree(reserved, 4 * page));
    CHECK(cudaFreeAsync(a, stream));
    CHECK(cudaFreeAsync(b, stream));
    CHECK(cudaMallocAsync((void **)&a, 1 << 20, stream));
    CHECK(cudaMemsetAsync(a, 1, 1 << 20, stream));
    CHECK(cudaFreeAsync(a, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK_EACH(cudaDestroyTextureObject, plane_tex, mip_tex);
    CHECK(cudaDestroySurfaceObject(surface));
    CHECK_EACH(cudaFreeArray, plane, cells);
    CHECK(cudaFreeMipmappedArray(mip));
    CHECK(cudaDeviceSetMemPool(0, fallback));
    CHECK(cudaMemPoolDestroy(own));
    printf("PASSED\n");
    return 0;
}

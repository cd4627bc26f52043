// What the driver-API test programs share: a failure count, error names and EXPECT, which
// compares a call's CUresult with the one expected and counts a mismatch; CHECK and FAIL_WHEN;
// RELEASE for what a program made; the usual start; and the parameters the programs build again
// and again (copies of two sides, memsets, memory locations and properties, texture
// descriptions).
#include <cuda.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

static const char *name_of(CUresult r) {
    const char *name = NULL;
    cuGetErrorName(r, &name);
    return name ? name : "?";
}

#define EXPECT(call, expected)                                                                      \
    do {                                                                                            \
        CUresult got_ = (call);                                                                     \
        if (got_ != (expected)) {                                                                   \
            printf("FAIL line %d: %s: %s, expected %s\n", __LINE__, #call, name_of(got_),          \
                   name_of(expected));                                                              \
            failures++;                                                                             \
        }                                                                                           \
    } while (0)

// Prints "WHAT: yes" or "WHAT: no" (the tests look for the line) and counts a "no" as a failure.
#define CHECK(what, condition)                                                                      \
    do {                                                                                            \
        int ok_ = (condition);                                                                      \
        printf("%s: %s\n", what, ok_ ? "yes" : "no");                                              \
        if (!ok_) failures++;                                                                       \
    } while (0)

// Counts a failure when `failed`, printing what follows it (printf's format and arguments).
#define FAIL_WHEN(failed, ...)                                                                      \
    do {                                                                                            \
        if (failed) {                                                                               \
            printf(__VA_ARGS__);                                                                    \
            failures++;                                                                             \
        }                                                                                           \
    } while (0)

// Checks that the `n` bytes read back into `got` are what the round before `round` wrote,
// `written(i, round - 1, what)`; the first that is not is counted and printed:
// "FAIL round R KIND INDEX: byte I is G, expected E".
static inline void expect_last_round(const unsigned char *got, size_t n, unsigned char (*written)(size_t, unsigned, unsigned), int round,
                                     unsigned what, const char *kind, int index) {
    size_t i = 0;
    while (i < n && got[i] == written(i, round - 1, what)) i++;
    FAIL_WHEN(i < n, "FAIL round %d %s %d: byte %zu is %u, expected %u\n", round, kind, index, i, got[i], written(i, round - 1, what));
}

// Reads the `n` bytes at `d` back into `got` (on `stream`, then synchronized) and checks them as
// expect_last_round does.
static inline void read_last_round(CUdeviceptr d, unsigned char *got, size_t n, CUstream stream,
                                   unsigned char (*written)(size_t, unsigned, unsigned), int round, unsigned what, const char *kind,
                                   int index) {
    EXPECT(cuMemcpyDtoHAsync(got, d, n, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    expect_last_round(got, n, written, round, what, kind, index);
}

// The programs' last line ("PASSED: N failure(s)", which the tests look for) and exit code.
static inline int finish(void) {
    printf("PASSED: %d failure(s)\n", failures);
    return failures != 0;
}

// What a program releases, named for RELEASE: MEMORY(ptr) (cuMemFree), ARRAY(a), MIPMAP(m),
// STREAM(s), EVENT(e), GRAPH(g), GRAPH_EXEC(x), POOL(p) (cuMemPoolDestroy), PHYSICAL(h)
// (cuMemRelease), TEXTURE(t), SURFACE(s).
typedef struct {
    enum {
        RELEASE_MEMORY,
        RELEASE_ARRAY,
        RELEASE_MIPMAP,
        RELEASE_STREAM,
        RELEASE_EVENT,
        RELEASE_GRAPH,
        RELEASE_GRAPH_EXEC,
        RELEASE_POOL,
        RELEASE_PHYSICAL,
        RELEASE_TEXTURE,
        RELEASE_SURFACE,
    } kind;
    union {
        CUdeviceptr memory;
        CUarray array;
        CUmipmappedArray mipmap;
        CUstream stream;
        CUevent event;
        CUgraph graph;
        CUgraphExec exec;
        CUmemoryPool pool;
        CUmemGenericAllocationHandle physical;
        CUtexObject texture;
        CUsurfObject surface;
    };
    const char *name;
} releasable;

#define MEMORY(p) ((releasable){.kind = RELEASE_MEMORY, .memory = (p), .name = #p})
#define ARRAY(a) ((releasable){.kind = RELEASE_ARRAY, .array = (a), .name = #a})
#define STREAM(s) ((releasable){.kind = RELEASE_STREAM, .stream = (s), .name = #s})
#define EVENT(e) ((releasable){.kind = RELEASE_EVENT, .event = (e), .name = #e})
#define GRAPH(g) ((releasable){.kind = RELEASE_GRAPH, .graph = (g), .name = #g})
#define GRAPH_EXEC(x) ((releasable){.kind = RELEASE_GRAPH_EXEC, .exec = (x), .name = #x})
#define POOL(p) ((releasable){.kind = RELEASE_POOL, .pool = (p), .name = #p})
#define MIPMAP(m) ((releasable){.kind = RELEASE_MIPMAP, .mipmap = (m), .name = #m})
#define PHYSICAL(h) ((releasable){.kind = RELEASE_PHYSICAL, .physical = (h), .name = #h})
#define TEXTURE(t) ((releasable){.kind = RELEASE_TEXTURE, .texture = (t), .name = #t})
#define SURFACE(s) ((releasable){.kind = RELEASE_SURFACE, .surface = (s), .name = #s})

static inline CUresult release_one(releasable item) {
    switch (item.kind) {
    case RELEASE_MEMORY: return cuMemFree(item.memory);
    case RELEASE_ARRAY: return cuArrayDestroy(item.array);
    case RELEASE_STREAM: return cuStreamDestroy(item.stream);
    case RELEASE_EVENT: return cuEventDestroy(item.event);
    case RELEASE_GRAPH: return cuGraphDestroy(item.graph);
    case RELEASE_GRAPH_EXEC: return cuGraphExecDestroy(item.exec);
    case RELEASE_POOL: return cuMemPoolDestroy(item.pool);
    case RELEASE_MIPMAP: return cuMipmappedArrayDestroy(item.mipmap);
    case RELEASE_PHYSICAL: return cuMemRelease(item.physical);
    case RELEASE_TEXTURE: return cuTexObjectDestroy(item.texture);
    case RELEASE_SURFACE: return cuSurfObjectDestroy(item.surface);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static inline void release_all(const releasable *items, size_t count, int line) {
    for (size_t i = 0; i < count; i++) {
        CUresult got = release_one(items[i]);
        if (got != CUDA_SUCCESS) {
            printf("FAIL line %d: releasing %s: %s, expected CUDA_SUCCESS\n", line, items[i].name, name_of(got));
            failures++;
        }
    }
}

// Releases each thing named, in order, expecting CUDA_SUCCESS of each (a mismatch is counted as
// EXPECT counts one): RELEASE(STREAM(s), EVENT(e), MEMORY(d)).
#define RELEASE(...) \
    release_all((releasable[]){__VA_ARGS__}, sizeof((releasable[]){__VA_ARGS__}) / sizeof(releasable), __LINE__)

// The usual start: cuInit, device 0's primary context retained and made current (returned for
// the programs that use it again). `device` receives device 0's handle from cuDeviceGet; NULL
// names ordinal 0 directly, as some programs do (no cuDeviceGet call).
static inline CUcontext use_primary_context(CUdevice *device) {
    CUcontext ctx = NULL;
    CUdevice ordinal = 0;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    if (device) {
        EXPECT(cuDeviceGet(device, 0), CUDA_SUCCESS);
        ordinal = *device;
    }
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, ordinal), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    return ctx;
}

// The usual start of the multi-device programs: cuInit and the session's device count, printed
// ("devices: N"); with `names`, a line per device ("device D: NAME"), its UUID in hex after
// " uuid " with `uuids` too.
static inline int count_devices(int names, int uuids) {
    int count = 0;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetCount(&count), CUDA_SUCCESS);
    printf("devices: %d\n", count);
    for (int d = 0; names && d < count; d++) {
        char name[256] = {0};
        EXPECT(cuDeviceGetName(name, sizeof name, d), CUDA_SUCCESS);
        printf("device %d: %s", d, name);
        if (uuids) {
            CUuuid uuid;
            EXPECT(cuDeviceGetUuid_v2(&uuid, d), CUDA_SUCCESS);
            printf(" uuid ");
            for (int i = 0; i < 16; i++) printf("%02x", (unsigned char)uuid.bytes[i]);
        }
        printf("\n");
    }
    return count;
}

// Checks that devices 0 and 1 are two GPUs: their UUIDs differ ("two identities: yes").
static inline void check_two_identities(void) {
    CUuuid a, b;
    EXPECT(cuDeviceGetUuid_v2(&a, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetUuid_v2(&b, 1), CUDA_SUCCESS);
    CHECK("two identities", memcmp(&a, &b, sizeof a) != 0);
}

// A graph memset node's parameters: `n` bytes of `value` at `dst` (one row).
static inline CUDA_MEMSET_NODE_PARAMS byte_memset_params(CUdeviceptr dst, unsigned value, size_t n) {
    CUDA_MEMSET_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.dst = dst;
    p.value = value;
    p.elementSize = 1;
    p.width = n;
    p.height = 1;
    p.pitch = n;
    return p;
}

// A memory location: its `type` (CU_MEM_LOCATION_TYPE_*) and `id`.
static inline CUmemLocation mem_location(CUmemLocationType type, int id) {
    CUmemLocation location = {type, id};
    return location;
}

// Pinned physical memory of device `ordinal`, for cuMemCreate; `granularity` receives its
// minimum granularity.
static inline CUmemAllocationProp device_memory_prop(int ordinal, size_t *granularity) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    EXPECT(cuMemGetAllocationGranularity(granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    return prop;
}

// A resource description of `array`, for texture and surface objects.
static inline CUDA_RESOURCE_DESC array_resource(CUarray array) {
    CUDA_RESOURCE_DESC res;
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = array;
    return res;
}

// A texture description: `address` mode in the first dimension, `filter` mode, CU_TRSF_ `flags`.
static inline CUDA_TEXTURE_DESC texture_desc(CUaddress_mode address, CUfilter_mode filter, unsigned int flags) {
    CUDA_TEXTURE_DESC tex;
    memset(&tex, 0, sizeof tex);
    tex.addressMode[0] = address;
    tex.filterMode = filter;
    tex.flags = flags;
    return tex;
}

// A new stream of the current context, made with `flags`.
static inline CUstream new_stream(unsigned int flags) {
    CUstream stream = NULL;
    EXPECT(cuStreamCreate(&stream, flags), CUDA_SUCCESS);
    return stream;
}

// One side of a copy: its memory type and memory (host, device or array; the others stay 0),
// the pitch of its rows and, for 3D copies, the height of its slices in rows; `box_at` moves the
// box within it. copy_2d and copy_3d make the driver's parameters of two sides.
typedef struct {
    CUmemorytype type;
    const void *host;
    CUdeviceptr device;
    CUarray array;
    size_t pitch, height;
    size_t x, y, z;
} copy_side;

static inline copy_side host_side(const void *host, size_t pitch, size_t height) {
    return (copy_side){.type = CU_MEMORYTYPE_HOST, .host = host, .pitch = pitch, .height = height};
}

static inline copy_side device_side(CUdeviceptr device, size_t pitch, size_t height) {
    return (copy_side){.type = CU_MEMORYTYPE_DEVICE, .device = device, .pitch = pitch, .height = height};
}

// Device memory named as unified memory (the driver finds what it is).
static inline copy_side unified_side(CUdeviceptr device, size_t pitch) {
    return (copy_side){.type = CU_MEMORYTYPE_UNIFIED, .device = device, .pitch = pitch};
}

static inline copy_side array_side(CUarray array) { return (copy_side){.type = CU_MEMORYTYPE_ARRAY, .array = array}; }

// The side with the box starting `x_bytes` into a row, at row `y` of slice `z`.
static inline copy_side box_at(copy_side side, size_t x_bytes, size_t y, size_t z) {
    side.x = x_bytes;
    side.y = y;
    side.z = z;
    return side;
}

// The fields CUDA_MEMCPY2D and CUDA_MEMCPY3D share, set from the sides `s` and `d` into `c`.
#define SET_COPY_SIDES(c, s, d)                                                                     \
    do {                                                                                            \
        memset(&(c), 0, sizeof(c));                                                                 \
        (c).srcMemoryType = (s).type, (c).dstMemoryType = (d).type;                                 \
        (c).srcHost = (s).host, (c).dstHost = (void *)(d).host;                                     \
        (c).srcDevice = (s).device, (c).dstDevice = (d).device;                                     \
        (c).srcArray = (s).array, (c).dstArray = (d).array;                                         \
        (c).srcPitch = (s).pitch, (c).dstPitch = (d).pitch;                                         \
        (c).srcXInBytes = (s).x, (c).dstXInBytes = (d).x;                                           \
        (c).srcY = (s).y, (c).dstY = (d).y;                                                         \
    } while (0)

// A 2D copy of `height` rows of `width` bytes from `src` to `dst` (the sides' heights unused).
static inline CUDA_MEMCPY2D copy_2d(copy_side src, copy_side dst, size_t width, size_t height) {
    CUDA_MEMCPY2D c;
    SET_COPY_SIDES(c, src, dst);
    c.WidthInBytes = width;
    c.Height = height;
    return c;
}

// A 3D copy of a box of `depth` slices of `height` rows of `width` bytes from `src` to `dst`.
static inline CUDA_MEMCPY3D copy_3d(copy_side src, copy_side dst, size_t width, size_t height, size_t depth) {
    CUDA_MEMCPY3D c;
    SET_COPY_SIDES(c, src, dst);
    c.srcHeight = src.height;
    c.dstHeight = dst.height;
    c.srcZ = src.z;
    c.dstZ = dst.z;
    c.WidthInBytes = width;
    c.Height = height;
    c.Depth = depth;
    return c;
}

// A graph copy node's parameters: `n` bytes from device memory `src` to device memory `dst`.
static inline CUDA_MEMCPY3D device_copy_params(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_3d(device_side(src, 0, 0), device_side(dst, 0, 0), n, 1, 1);
}

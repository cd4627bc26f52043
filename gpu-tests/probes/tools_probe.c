// A probe of the real driver, not part of Flyt: calls the private ToolsContext and ToolsModule
// entries NVIDIA's libraries use (cuBLAS, cuSOLVER, cuFFT) on objects whose public properties are
// known, so their meaning can be read off. Build: gcc tools_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef uint64_t (*fn6)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);
static const unsigned char TOOLS_CONTEXT[16] = {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2};
static const unsigned char GREEN_CONTEXT[16] = {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e};
static const unsigned char TOOLS_MODULE[16] = {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e};

static void words(const char *label, const void *p, int n) {
    const uint64_t *w = p;
    printf("  %s %p:", label, p);
    for (int i = 0; i < n; i++) printf(" %016lx", (unsigned long)w[i]);
    printf("\n");
}

static int visits;
static uint64_t visit(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5) {
    visits++;
    const char *name = NULL;
    CUresult r = cuFuncGetName(&name, (CUfunction)a1);
    printf("  callback %d (%#lx, %#lx, %#lx, %#lx, %#lx, %#lx): cuFuncGetName(a1) = %d %s; a2 as text: %s\n", visits, a0, a1, a2, a3, a4, a5, r,
           r ? "" : name, a2 > 4096 ? (const char *)a2 : "-");
    return 0;
}

static const char *PTX =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry first(.param .u64 p) { ret; }\n"
    ".visible .entry second(.param .u64 p) { ret; }\n"
    ".visible .entry third() { ret; }\n"
    ".visible .func helper() { ret; }\n";

int main(void) {
    CUdevice dev;
    CUcontext ctx, other;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    const uint64_t *tc = NULL, *tm = NULL;
    cuGetExportTable((const void **)&tc, (const CUuuid *)TOOLS_CONTEXT);
    cuGetExportTable((const void **)&tm, (const CUuuid *)TOOLS_MODULE);
    fn6 is_ctx = (fn6)tc[4], stream_obj = (fn6)tc[51], obj_value = (fn6)tc[39], each_function = (fn6)tm[7];

    printf("ToolsContext[4] (ctx, &out):\n");
    uint64_t out, r;
    CUcontext candidates[3];
    const char *labels[3] = {"primary ctx (current)", "NULL", "created ctx (current)"};
    cuCtxCreate(&other, NULL, 0, dev);
    candidates[0] = ctx;
    candidates[1] = NULL;
    candidates[2] = other;
    for (int i = 0; i < 3; i++) {
        out = 0xabababababababab;
        r = is_ctx((uint64_t)candidates[i], (uint64_t)&out, 0, 0, 0, 0);
        printf("  %s %p: r=%lu out=%#lx\n", labels[i], (void *)candidates[i], r, out);
    }
    cuCtxSetCurrent(ctx);
    out = 0xabababababababab;
    r = is_ctx((uint64_t)other, (uint64_t)&out, 0, 0, 0, 0);
    printf("  created ctx, not current: r=%lu out=%#lx\n", r, out);
    out = 0xabababababababab;
    r = is_ctx((uint64_t)ctx, (uint64_t)&out, 0, 0, 0, 0);
    printf("  primary ctx while current: r=%lu out=%#lx\n", r, out);
    cuCtxPopCurrent(NULL);
    out = 0xabababababababab;
    r = is_ctx((uint64_t)ctx, (uint64_t)&out, 0, 0, 0, 0);
    printf("  primary ctx, nothing current: r=%lu out=%#lx\n", r, out);
    uint32_t out32[2] = {0xabababab, 0xabababab};
    is_ctx((uint64_t)ctx, (uint64_t)out32, 0, 0, 0, 0);
    printf("  width: %#x %#x\n", out32[0], out32[1]);
    CUgreenCtx green;
    CUdevResource sms;
    CUdevResourceDesc desc;
    CUcontext green_ctx = NULL;
    if (!cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM) && !cuDevResourceGenerateDesc(&desc, &sms, 1) &&
        !cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM) && !cuCtxFromGreenCtx(&green_ctx, green)) {
        out = 0xabababababababab;
        r = is_ctx((uint64_t)green_ctx, (uint64_t)&out, 0, 0, 0, 0);
        printf("  green ctx %p: r=%lu out=%#lx\n", (void *)green_ctx, r, out);
        // GreenContext[2] (ctx, &type, &primary) and [3] (): what Flyt answers for a green
        // context's context is not measured yet (cuda-shim/src/export_tables.rs).
        const uint64_t *gc = NULL;
        if (!cuGetExportTable((const void **)&gc, (const CUuuid *)GREEN_CONTEXT)) {
            CUresult (*ctx_type)(CUcontext, unsigned *, CUcontext *) = (CUresult(*)(CUcontext, unsigned *, CUcontext *))gc[2];
            int (*supported)(void) = (int (*)(void))gc[3];
            CUcontext labels2[2] = {ctx, green_ctx};
            for (int i = 0; i < 2; i++) {
                unsigned kind = 0xabababab;
                CUcontext primary = (CUcontext)(uintptr_t)0xcdcdcdcd;
                CUresult t = ctx_type(labels2[i], &kind, &primary);
                printf("GreenContext[2] (%s): r=%d type=%u primary=%s\n", i ? "green ctx" : "primary ctx", t, kind,
                       primary == ctx ? "the primary ctx" : primary == (CUcontext)(uintptr_t)0xcdcdcdcd ? "untouched" : "other");
            }
            printf("GreenContext[3] (): %d\n", supported());
        }
    }
    cuCtxSetCurrent(ctx);
    cuCtxDestroy(other);
    cuCtxSetCurrent(ctx);

    printf("ToolsContext[51] (ctx, stream, &obj, 0) then [39] (ctx, obj, &value), beside public stream facts:\n");
    CUstream streams[7] = {0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
    const char *names[7] = {"NULL", "LEGACY", "PER_THREAD", "created default", "created non-blocking", "created priority -1", "created 2nd default"};
    cuStreamCreate(&streams[3], CU_STREAM_DEFAULT);
    cuStreamCreate(&streams[4], CU_STREAM_NON_BLOCKING);
    cuStreamCreateWithPriority(&streams[5], 0, -1);
    cuStreamCreate(&streams[6], CU_STREAM_DEFAULT);
    for (int i = 0; i < 7; i++) {
        uint64_t obj = 0xcdcdcdcdcdcdcdcd, value = 0xefefefefefefefef;
        uint64_t r51 = stream_obj((uint64_t)ctx, (uint64_t)streams[i], (uint64_t)&obj, 0, 0, 0);
        uint64_t r39 = r51 ? 999 : obj_value((uint64_t)ctx, obj, (uint64_t)&value, 0, 0, 0);
        unsigned long long id = 0;
        unsigned flags = 0;
        int priority = 0;
        CUresult rid = cuStreamGetId(streams[i], &id);
        cuStreamGetFlags(streams[i], &flags);
        cuStreamGetPriority(streams[i], &priority);
        printf("  %-22s handle %p: [51] r=%lu obj=%#lx; [39] r=%lu value=%#lx (%lu); cuStreamGetId %d id=%llu flags=%u priority=%d\n", names[i], (void *)streams[i],
               r51, obj, r39, value, value, rid, id, flags, priority);
        if (!r51) words("obj", (void *)obj, 8);
        if ((uintptr_t)streams[i] > 4096) words("handle", streams[i], 8);
    }
    uint64_t obj2 = 0;
    printf("  [51] twice on one stream gives the same obj: ");
    uint64_t first = 0;
    stream_obj((uint64_t)ctx, (uint64_t)streams[3], (uint64_t)&first, 0, 0, 0);
    stream_obj((uint64_t)ctx, (uint64_t)streams[3], (uint64_t)&obj2, 0, 0, 0);
    printf("%s\n", first == obj2 ? "yes" : "no");
    printf("  [51] with a3 = 1: r=%lu\n", stream_obj((uint64_t)ctx, (uint64_t)streams[3], (uint64_t)&obj2, 1, 0, 0));

    printf("ToolsModule[7] (ctx, module, callback, opaque):\n");
    CUmodule module;
    CUresult lr = cuModuleLoadData(&module, PTX);
    printf("  cuModuleLoadData %d; module %p\n", lr, (void *)module);
    words("module", module, 8);
    CUfunction f1, f2, f3;
    cuModuleGetFunction(&f1, module, "first");
    cuModuleGetFunction(&f2, module, "second");
    cuModuleGetFunction(&f3, module, "third");
    printf("  cuModuleGetFunction: first %p second %p third %p\n", (void *)f1, (void *)f2, (void *)f3);
    words("first", f1, 8);
    visits = 0;
    uint64_t opaque = 0x1234;
    uint64_t r7 = each_function((uint64_t)ctx, (uint64_t)module, (uint64_t)visit, (uint64_t)&opaque, 0, 0);
    printf("  callback returning 0: r=%lu, %d visits, opaque %#lx\n", r7, visits, opaque);
    CUmodule fresh;
    cuModuleLoadData(&fresh, PTX);
    visits = 0;
    r7 = each_function((uint64_t)ctx, (uint64_t)fresh, (uint64_t)visit, (uint64_t)&opaque, 0, 0);
    printf("  fresh module, no cuModuleGetFunction before: r=%lu, %d visits\n", r7, visits);
    return 0;
}

// Green contexts through the driver API (linked with -lcuda): the device's SM resource (and the
// primary context's), counted and real splits into groups, descriptors, two green contexts of two
// disjoint groups, their contexts and streams (explicit ones, and the NULL stream and a runtime
// stream while a green context is current), kernels that record the SM every block ran on, a
// memset and copies on a green stream, events recorded and waited through the green contexts, and
// their destruction.
//
// SM ids differ between runs, so none is printed: only counts the driver gives (SMs of the device,
// of each group and of the rest, groups that fit) and yes/no checks: every block ran, on at most
// as many SMs as its green context has, and the two green contexts' kernels used disjoint SMs (as
// documented without MPS or dynamic parallelism). Error names of bad calls are printed (the native
// run is the reference).
#include <vector>

#include "driver_check.h"

static const char *cu_name(CUresult r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    return name;
}

// Prints `what: <name>` of an expected driver error and checks it is one.
static void expect_cu_err(const char *what, CUresult r) {
    printf("%s: %s\n", what, cu_name(r));
    EXPECT(r != CUDA_SUCCESS, "%s: expected an error", what);
}

// Each block records the SM it ran on (+1, so 0 means it never ran) after spinning a while, so
// that blocks spread over every SM the kernel may use; thread 0 of block 0 records %nsmid.
static __global__ void record_sm(unsigned *sm_of_block, unsigned *nsmid, long long spin) {
    if (threadIdx.x != 0) return;
    unsigned sm, n;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    asm volatile("mov.u32 %0, %%nsmid;" : "=r"(n));
    long long start = clock64();
    while (clock64() - start < spin) {
    }
    sm_of_block[blockIdx.x] = sm + 1;
    if (blockIdx.x == 0) *nsmid = n;
}

const unsigned BLOCKS = 2048;

// What one run of `record_sm` on `stream` shows: whether every block ran on a valid SM, and the
// set of SMs used (a bitmap over %nsmid).
struct SmUse {
    bool all_ran = false;
    std::vector<bool> used;
    unsigned count() const {
        unsigned n = 0;
        for (bool u : used) n += u;
        return n;
    }
    bool disjoint(const SmUse &other) const {
        for (size_t i = 0; i < used.size() && i < other.used.size(); i++)
            if (used[i] && other.used[i]) return false;
        return true;
    }
};

static SmUse run_on(cudaStream_t stream, unsigned *d_sm, unsigned *d_nsmid) {
    CHECK(cudaMemsetAsync(d_sm, 0, BLOCKS * sizeof(unsigned), stream));
    record_sm<<<BLOCKS, 32, 0, stream>>>(d_sm, d_nsmid, 20000);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(stream));
    std::vector<unsigned> sm(BLOCKS);
    unsigned nsmid = 0;
    CHECK(cudaMemcpy(sm.data(), d_sm, BLOCKS * sizeof(unsigned), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&nsmid, d_nsmid, sizeof nsmid, cudaMemcpyDeviceToHost));
    SmUse use;
    use.all_ran = nsmid > 0;
    use.used.assign(nsmid, false);
    for (unsigned s : sm) {
        if (s == 0 || s > nsmid) {
            use.all_ran = false;
            continue;
        }
        use.used[s - 1] = true;
    }
    return use;
}

static bool filled(const std::vector<unsigned char> &bytes, unsigned char value) {
    for (unsigned char b : bytes)
        if (b != value) return false;
    return true;
}

int main() {
    CUdevice dev = start_on_primary_context("green_contexts");
    CUcontext primary;
    CHECK_CU(cuCtxGetCurrent(&primary));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

    // The device's SMs.
    CUdevResource device_sms, ctx_sms, scratch;
    CHECK_CU(cuDeviceGetDevResource(dev, &device_sms, CU_DEV_RESOURCE_TYPE_SM));
    printf("device SM resource: %u SMs, min partition %u, co-scheduled alignment %u\n", device_sms.sm.smCount,
           device_sms.sm.minSmPartitionSize, device_sms.sm.smCoscheduledAlignment);
    printf("as many as the device attribute: %s\n", (int)device_sms.sm.smCount == sms ? "yes" : "no");
    EXPECT((int)device_sms.sm.smCount == sms, "%u SMs, attribute %d", device_sms.sm.smCount, sms);
    CHECK_CU(cuCtxGetDevResource(primary, &ctx_sms, CU_DEV_RESOURCE_TYPE_SM));
    printf("the primary context has them all: %s\n", ctx_sms.sm.smCount == device_sms.sm.smCount ? "yes" : "no");
    expect_cu_err("cuDeviceGetDevResource of an unknown type", cuDeviceGetDevResource(dev, &scratch, (CUdevResourceType)7));

    // Splits: counted, made, refused.
    unsigned count = 0;
    CHECK_CU(cuDevSmResourceSplitByCount(NULL, &count, &device_sms, NULL, 0, 16));
    printf("groups of at least 16 SMs that fit: %u\n", count);
    CHECK_CU(cuDevSmResourceSplitByCount(NULL, &count, &device_sms, NULL, CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, 2));
    printf("groups of at least 2 SMs ignoring co-scheduling: %u\n", count);
    CUdevResource groups[2], rest;
    unsigned two = 2;
    CHECK_CU(cuDevSmResourceSplitByCount(groups, &two, &device_sms, &rest, 0, 16));
    printf("split: %u groups of %u and %u SMs, %u SMs left\n", two, groups[0].sm.smCount, groups[1].sm.smCount, rest.sm.smCount);
    EXPECT(two == 2 && groups[0].sm.smCount >= 16 && groups[1].sm.smCount >= 16, "split");
    EXPECT(groups[0].sm.smCount + groups[1].sm.smCount + rest.sm.smCount == device_sms.sm.smCount, "the split adds up");
    unsigned one = 1;
    expect_cu_err("a split asking for more SMs than there are",
                  cuDevSmResourceSplitByCount(&scratch, &one, &device_sms, NULL, 0, device_sms.sm.smCount + 1));
    expect_cu_err("a split of a split's group", cuDevSmResourceSplitByCount(&scratch, &one, &groups[0], NULL, 0, 8));

    // A green context per group.
    CUdevResourceDesc desc_a, desc_b;
    CHECK_CU(cuDevResourceGenerateDesc(&desc_a, &groups[0], 1));
    CHECK_CU(cuDevResourceGenerateDesc(&desc_b, &groups[1], 1));
    CUgreenCtx a, b;
    expect_cu_err("cuGreenCtxCreate without CU_GREEN_CTX_DEFAULT_STREAM", cuGreenCtxCreate(&a, desc_a, dev, 0));
    CHECK_CU(cuGreenCtxCreate(&a, desc_a, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CHECK_CU(cuGreenCtxCreate(&b, desc_b, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CHECK_CU(cuGreenCtxGetDevResource(a, &scratch, CU_DEV_RESOURCE_TYPE_SM));
    printf("green context A: %u SMs, its group's: %s\n", scratch.sm.smCount, scratch.sm.smCount == groups[0].sm.smCount ? "yes" : "no");
    CUcontext ctx_a, ctx_a_again;
    CHECK_CU(cuCtxFromGreenCtx(&ctx_a, a));
    CHECK_CU(cuCtxFromGreenCtx(&ctx_a_again, a));
    printf("its context: not the primary one: %s, the same each time: %s\n", ctx_a != primary ? "yes" : "no",
           ctx_a == ctx_a_again ? "yes" : "no");
    CHECK_CU(cuCtxGetDevResource(ctx_a, &scratch, CU_DEV_RESOURCE_TYPE_SM));
    printf("its context has its SMs: %s\n", scratch.sm.smCount == groups[0].sm.smCount ? "yes" : "no");
    unsigned long long id_a = 0, id_b = 0;
    CHECK_CU(cuGreenCtxGetId(a, &id_a));
    CHECK_CU(cuGreenCtxGetId(b, &id_b));
    printf("green context ids differ: %s\n", id_a != id_b ? "yes" : "no");

    // Their streams.
    CUstream sa, sb;
    expect_cu_err("cuGreenCtxStreamCreate without CU_STREAM_NON_BLOCKING", cuGreenCtxStreamCreate(&sa, a, 0, 0));
    CHECK_CU(cuGreenCtxStreamCreate(&sa, a, CU_STREAM_NON_BLOCKING, 0));
    CHECK_CU(cuGreenCtxStreamCreate(&sb, b, CU_STREAM_NON_BLOCKING, 0));
    CUgreenCtx of = NULL;
    CUcontext ctx = NULL, v2 = NULL;
    CHECK_CU(cuStreamGetGreenCtx(sa, &of));
    CHECK_CU(cuStreamGetCtx(sa, &ctx));
    printf("a green stream's green context and context: %s\n", of == a && ctx == ctx_a ? "yes" : "no");
    of = NULL;
    CHECK_CU(cuStreamGetCtx_v2(sa, &v2, &of));
    printf("cuStreamGetCtx_v2: the primary context and the green context: %s\n", v2 == primary && of == a ? "yes" : "no");
    cudaStream_t plain;
    CHECK(cudaStreamCreate(&plain));
    of = (CUgreenCtx)1;
    CHECK_CU(cuStreamGetGreenCtx((CUstream)plain, &of));
    printf("a primary context's stream has none: %s\n", of == NULL ? "yes" : "no");

    // Kernels on the green streams stay on their green context's SMs.
    unsigned *d_sm, *d_nsmid;
    CHECK(cudaMalloc(&d_sm, BLOCKS * sizeof(unsigned)));
    CHECK(cudaMalloc(&d_nsmid, sizeof(unsigned)));
    SmUse on_a = run_on((cudaStream_t)sa, d_sm, d_nsmid);
    SmUse on_b = run_on((cudaStream_t)sb, d_sm, d_nsmid);
    SmUse on_device = run_on(plain, d_sm, d_nsmid);
    printf("every block ran (A, B, the primary context): %s %s %s\n", on_a.all_ran ? "yes" : "no", on_b.all_ran ? "yes" : "no",
           on_device.all_ran ? "yes" : "no");
    bool within_a = on_a.count() <= groups[0].sm.smCount, within_b = on_b.count() <= groups[1].sm.smCount;
    printf("A's kernel ran on at most its %u SMs: %s\n", groups[0].sm.smCount, within_a ? "yes" : "no");
    printf("B's kernel ran on at most its %u SMs: %s\n", groups[1].sm.smCount, within_b ? "yes" : "no");
    printf("A's and B's kernels ran on disjoint SMs: %s\n", on_a.disjoint(on_b) ? "yes" : "no");
    EXPECT(on_a.all_ran && on_b.all_ran && on_device.all_ran && within_a && within_b && on_a.disjoint(on_b), "SM use");
    fprintf(stderr, "SMs used: A %u, B %u, primary context %u\n", on_a.count(), on_b.count(), on_device.count());

    // A memset and copies on a green stream.
    const size_t len = 1 << 20;
    unsigned char *d;
    CHECK(cudaMalloc(&d, len));
    std::vector<unsigned char> host(len), pattern(len, 0x21);
    CHECK(cudaMemsetAsync(d, 0x5a, len, (cudaStream_t)sa));
    CHECK(cudaMemcpyAsync(host.data(), d, len, cudaMemcpyDeviceToHost, (cudaStream_t)sa));
    CHECK(cudaStreamSynchronize((cudaStream_t)sa));
    printf("a memset and a copy on a green stream: %s\n", filled(host, 0x5a) ? "yes" : "no");
    CHECK(cudaMemcpyAsync(d, pattern.data(), len, cudaMemcpyHostToDevice, (cudaStream_t)sa));

    // Events through the green contexts: B waits for A's work.
    CUevent e;
    CHECK_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
    CHECK_CU(cuGreenCtxRecordEvent(a, e));
    CHECK_CU(cuGreenCtxWaitEvent(b, e));
    CHECK(cudaMemcpyAsync(host.data(), d, len, cudaMemcpyDeviceToHost, (cudaStream_t)sb));
    CHECK(cudaStreamSynchronize((cudaStream_t)sb));
    CHECK_CU(cuEventSynchronize(e));
    printf("B's copy after A's, through a green context event: %s\n", filled(host, 0x21) ? "yes" : "no");
    CHECK_CU(cuCtxRecordEvent(ctx_a, e));
    CHECK_CU(cuCtxWaitEvent(ctx_a, e));
    CHECK_CU(cuEventSynchronize(e));

    // With A's context current: the NULL stream and new runtime streams are A's.
    CHECK_CU(cuCtxPushCurrent(ctx_a));
    unsigned long long current_id = 0;
    CHECK_CU(cuGreenCtxGetId(NULL, &current_id));
    printf("the current green context's id: %s\n", current_id == id_a ? "yes" : "no");
    of = NULL;
    CHECK_CU(cuStreamGetGreenCtx(NULL, &of));
    printf("the NULL stream is A's: %s\n", of == a ? "yes" : "no");
    SmUse on_null = run_on(0, d_sm, d_nsmid);
    printf("a NULL-stream kernel in A's context: every block ran: %s, on at most A's SMs: %s, none of B's: %s\n",
           on_null.all_ran ? "yes" : "no", on_null.count() <= groups[0].sm.smCount ? "yes" : "no", on_null.disjoint(on_b) ? "yes" : "no");
    EXPECT(on_null.all_ran && on_null.count() <= groups[0].sm.smCount && on_null.disjoint(on_b), "NULL stream in a green context");
    cudaStream_t made_in_a;
    CHECK(cudaStreamCreateWithFlags(&made_in_a, cudaStreamNonBlocking));
    of = NULL;
    CHECK_CU(cuStreamGetGreenCtx((CUstream)made_in_a, &of));
    printf("a runtime stream made in A's context is A's: %s\n", of == a ? "yes" : "no");
    SmUse on_made = run_on(made_in_a, d_sm, d_nsmid);
    printf("its kernel: every block ran: %s, none of B's SMs: %s\n", on_made.all_ran ? "yes" : "no", on_made.disjoint(on_b) ? "yes" : "no");
    CHECK(cudaStreamDestroy(made_in_a));
    CHECK_CU(cuCtxSynchronize());
    CUcontext popped;
    CHECK_CU(cuCtxPopCurrent(&popped));
    printf("popped A's context: %s\n", popped == ctx_a ? "yes" : "no");

    CHECK_CU(cuEventDestroy(e));
    CHECK(cudaStreamDestroy(plain));
    for (CUstream x : {sa, sb}) CHECK_CU(cuStreamDestroy(x));
    for (CUgreenCtx x : {a, b}) CHECK_CU(cuGreenCtxDestroy(x));
    CHECK_EACH(cudaFree, d, d_sm, d_nsmid);
    CHECK(cudaDeviceSynchronize());
    return test_finish();
}

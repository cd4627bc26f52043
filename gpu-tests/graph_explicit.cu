// graph_explicit: a CUDA graph built node by node, instantiated, launched, changed and updated.
// The main graph (9 nodes):
//   memset(b = 1.0f) -> kernel affine(b += a * p.a + p.b + ((i >> p.shift) & 3) + extra; a struct
//   by value) -> memcpy 1D (c = b) -> empty -> kernel add_k(c += k) ..(cudaGraphAddDependencies)..>
//   memcpy 3D-params, 1D-shaped (d = c) -> spin 10 ms -> child graph (kernel: acc += d)
//   -> event record.
// A second graph waits for that event (event wait node) on another stream and computes e = acc - d.
// Checked: node counts (cudaGraphGetNodes, cudaGraphGetRootNodes before and after adding an edge),
// node types, cudaGraphKernelNodeGetParams (launch shape and the argument values read back),
// cudaGraphKernelNodeSetParams, cudaGraphClone, cudaGraphInstantiate, cudaGraphUpload, launches on
// non-blocking streams, cudaGraphExecKernelNodeSetParams, cudaGraphExecUpdate with a graph of the
// same topology, cudaGraphDebugDotPrint (only that a non-empty file was written). Every result is
// compared with the same steps done on the host (exact in float: small integers and quarters).
#include "common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <vector>

struct Affine {
    float a;
    float b;
    int shift;
};

__global__ void affine(float *out, const float *in, int n, Affine p, float extra) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += in[i] * p.a + p.b + (float)((i >> p.shift) & 3) + extra;
}

__global__ void add_k(float *x, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += (float)k;
}

__global__ void accumulate(float *acc, const float *d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += d[i];
}

__global__ void difference(float *e, const float *acc, const float *d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) e[i] = acc[i] - d[i];
}

static const int N = 1 << 16;
static const int BLOCK = 256;
static const Affine P = {2.0f, 0.5f, 3};
static const char *type_name(cudaGraphNodeType t) {
    switch (t) {
        case cudaGraphNodeTypeKernel: return "kernel";
        case cudaGraphNodeTypeMemcpy: return "memcpy";
        case cudaGraphNodeTypeMemset: return "memset";
        case cudaGraphNodeTypeHost: return "host";
        case cudaGraphNodeTypeGraph: return "graph";
        case cudaGraphNodeTypeEmpty: return "empty";
        case cudaGraphNodeTypeWaitEvent: return "wait_event";
        case cudaGraphNodeTypeEventRecord: return "event_record";
        default: return "other";
    }
}

static cudaKernelNodeParams kernel_params(void *func, void **args) {
    cudaKernelNodeParams kp = {};
    kp.func = func;
    kp.gridDim = dim3((N + BLOCK - 1) / BLOCK);
    kp.blockDim = dim3(BLOCK);
    kp.sharedMemBytes = 0;
    kp.kernelParams = args;
    kp.extra = nullptr;
    return kp;
}

struct Bufs {
    float *a, *b, *c, *d, *acc, *e;
};

// The nodes of one main graph, in the order they are added.
enum { MEMSET, AFFINE, COPY1D, EMPTY, ADDK, COPY3D, SPIN, CHILD, RECORD, NODES };

// Builds the main graph.
static cudaGraph_t build_main(const Bufs &m, cudaGraph_t child, cudaEvent_t ev, float extra, int k,
                              cudaGraphNode_t node[NODES], size_t *roots_before_edge) {
    const size_t bytes = N * sizeof(float);
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));

    float *a = m.a, *b = m.b, *c = m.c, *d = m.d;  // the nodes copy their arguments' values
    cudaMemsetParams ms = {};
    ms.dst = b;
    ms.pitch = bytes;
    ms.value = 0x3f800000u;  // 1.0f
    ms.elementSize = 4;
    ms.width = N;
    ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&node[MEMSET], g, nullptr, 0, &ms));

    int n = N;
    Affine p = P;
    void *affine_args[] = {&b, &a, &n, &p, &extra};
    cudaKernelNodeParams kp = kernel_params((void *)affine, affine_args);
    CHECK(cudaGraphAddKernelNode(&node[AFFINE], g, &node[MEMSET], 1, &kp));

    CHECK(cudaGraphAddMemcpyNode1D(&node[COPY1D], g, &node[AFFINE], 1, c, b, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaGraphAddEmptyNode(&node[EMPTY], g, &node[COPY1D], 1));

    void *addk_args[] = {&c, &n, &k};
    kp = kernel_params((void *)add_k, addk_args);
    CHECK(cudaGraphAddKernelNode(&node[ADDK], g, &node[EMPTY], 1, &kp));

    // No dependency at add time: the edge ADDK -> COPY3D comes from cudaGraphAddDependencies.
    cudaMemcpy3DParms cp = {};
    cp.srcPtr = make_cudaPitchedPtr(c, bytes, N, 1);
    cp.dstPtr = make_cudaPitchedPtr(d, bytes, N, 1);
    cp.extent = make_cudaExtent(bytes, 1, 1);
    cp.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaGraphAddMemcpyNode(&node[COPY3D], g, nullptr, 0, &cp));
    CHECK(cudaGraphGetRootNodes(g, nullptr, roots_before_edge));
    CHECK(cudaGraphAddDependencies(g, &node[ADDK], &node[COPY3D], nullptr, 1));

    // A 10 ms spin, so that the second graph's event wait is what orders it.
    unsigned long long ns = 10000000ull;
    int *no_out = nullptr;
    int value = 0;
    void *spin_args[] = {&ns, &no_out, &value};
    kp = kernel_params((void *)spin_kernel, spin_args);
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(32);
    CHECK(cudaGraphAddKernelNode(&node[SPIN], g, &node[COPY3D], 1, &kp));

    CHECK(cudaGraphAddChildGraphNode(&node[CHILD], g, &node[SPIN], 1, child));
    CHECK(cudaGraphAddEventRecordNode(&node[RECORD], g, &node[CHILD], 1, ev));
    return g;
}

// Host model of one launch of the main graph.
static void host_launch(const std::vector<float> &a, std::vector<float> &d, std::vector<float> &acc, float extra, int k) {
    for (int i = 0; i < N; i++) {
        float b = 1.0f + (a[i] * P.a + P.b + (float)((i >> P.shift) & 3) + extra);
        d[i] = b + (float)k;
        acc[i] += d[i];
    }
}

static int count_bad(const float *dev, const std::vector<float> &want) {
    std::vector<float> h(N);
    CHECK(cudaMemcpy(h.data(), dev, N * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (h[i] != want[i]) bad++;
    return bad;
}

static void check_state(const char *what, const Bufs &m, const std::vector<float> &d, const std::vector<float> &acc) {
    int bd = count_bad(m.d, d), ba = count_bad(m.acc, acc);
    EXPECT(bd == 0 && ba == 0, "%s: %d of d and %d of acc differ from the host's", what, bd, ba);
    printf("%s: d %s, acc %s\n", what, bd ? "wrong" : "ok", ba ? "wrong" : "ok");
}

int main() {
    test_init("graph_explicit");
    const size_t bytes = N * sizeof(float);
    std::vector<float> a(N), d(N, 0.0f), acc(N, 0.0f);
    for (int i = 0; i < N; i++) a[i] = (float)(i % 11);

    Bufs m;
    float **all[] = {&m.a, &m.b, &m.c, &m.d, &m.acc, &m.e};
    for (float **p : all) {
        CHECK(cudaMalloc(p, bytes));
        CHECK(cudaMemset(*p, 0, bytes));
    }
    CHECK(cudaMemcpy(m.a, a.data(), bytes, cudaMemcpyHostToDevice));

    cudaStream_t s, s2;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));

    // The child graph: one kernel node, acc += d.
    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    int n = N;
    void *acc_args[] = {&m.acc, &m.d, &n};
    cudaKernelNodeParams kp = kernel_params((void *)accumulate, acc_args);
    cudaGraphNode_t child_kernel;
    CHECK(cudaGraphAddKernelNode(&child_kernel, child, nullptr, 0, &kp));

    cudaGraphNode_t node[NODES];
    size_t roots_before = 0;
    cudaGraph_t g = build_main(m, child, ev, 0.5f, 1, node, &roots_before);

    // Structure.
    size_t count = 0, roots = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &count));
    CHECK(cudaGraphGetRootNodes(g, nullptr, &roots));
    printf("nodes: %zu, root nodes before the added edge: %zu, after: %zu\n", count, roots_before, roots);
    EXPECT(count == NODES && roots_before == 2 && roots == 1, "unexpected node or root counts");
    std::vector<cudaGraphNode_t> listed(count);
    CHECK(cudaGraphGetNodes(g, listed.data(), &count));
    int found = 0;
    for (int i = 0; i < NODES; i++)
        for (size_t j = 0; j < count; j++)
            if (listed[j] == node[i]) found++;
    printf("every added node listed: %s\n", yes(found == NODES));
    EXPECT(found == NODES, "cudaGraphGetNodes listed %d of the %d added nodes", found, NODES);
    cudaGraphNode_t root = nullptr;
    roots = 1;
    CHECK(cudaGraphGetRootNodes(g, &root, &roots));
    printf("root node is the memset: %s\n", yes(root == node[MEMSET]));
    printf("node types:");
    for (int i = 0; i < NODES; i++) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(node[i], &t));
        printf(" %s", type_name(t));
    }
    printf("\n");
    size_t child_count = 0;
    CHECK(cudaGraphGetNodes(child, nullptr, &child_count));
    printf("child graph nodes: %zu\n", child_count);

    // Kernel node parameters read back, then the add_k node's k set to 2 (before instantiation).
    cudaKernelNodeParams got = {};
    CHECK(cudaGraphKernelNodeGetParams(node[AFFINE], &got));
    printf("affine node: func matches: %s, grid %u, block %u, shared %u\n", yes(got.func == (void *)affine),
           got.gridDim.x, got.blockDim.x, got.sharedMemBytes);
    EXPECT(got.gridDim.x == (N + BLOCK - 1) / BLOCK && got.blockDim.x == BLOCK, "wrong launch shape read back");
    if (EXPECT(got.kernelParams != nullptr, "no kernelParams read back")) {
        int rn = *(int *)got.kernelParams[2];
        Affine rp = *(Affine *)got.kernelParams[3];
        float rextra = *(float *)got.kernelParams[4];
        bool ptrs = *(float **)got.kernelParams[0] == m.b && *(float **)got.kernelParams[1] == m.a;
        printf("affine node args: pointers match: %s, n %d, p {%g, %g, %d}, extra %g\n", yes(ptrs), rn, rp.a, rp.b,
               rp.shift, rextra);
        EXPECT(ptrs && rn == N && rp.a == P.a && rp.b == P.b && rp.shift == P.shift && rextra == 0.5f,
               "kernel node arguments read back differ");
    }
    int k = 2;
    void *addk_args[] = {&m.c, &n, &k};
    kp = kernel_params((void *)add_k, addk_args);
    CHECK(cudaGraphKernelNodeSetParams(node[ADDK], &kp));

    cudaGraph_t clone;
    CHECK(cudaGraphClone(&clone, g));
    size_t clone_count = 0;
    CHECK(cudaGraphGetNodes(clone, nullptr, &clone_count));
    printf("clone nodes: %zu\n", clone_count);

    // The waiting graph: event wait -> e = acc - d.
    cudaGraph_t waiter;
    CHECK(cudaGraphCreate(&waiter, 0));
    cudaGraphNode_t wait_node, diff_node;
    CHECK(cudaGraphAddEventWaitNode(&wait_node, waiter, nullptr, 0, ev));
    void *diff_args[] = {&m.e, &m.acc, &m.d, &n};
    kp = kernel_params((void *)difference, diff_args);
    CHECK(cudaGraphAddKernelNode(&diff_node, waiter, &wait_node, 1, &kp));

    // Instantiate, upload, launch three times.
    cudaGraphExec_t exec, wait_exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphInstantiate(&wait_exec, waiter, 0));
    CHECK(cudaGraphUpload(exec, s));
    for (int i = 0; i < 3; i++) {
        CHECK(cudaGraphLaunch(exec, s));
        host_launch(a, d, acc, 0.5f, 2);
    }
    // On the other stream, ordered only by the event wait node behind the third launch.
    CHECK(cudaGraphLaunch(wait_exec, s2));
    CHECK(cudaStreamSynchronize(s2));
    std::vector<float> e(N);
    for (int i = 0; i < N; i++) e[i] = acc[i] - d[i];
    int be = count_bad(m.e, e);
    EXPECT(be == 0, "%d of e differ: the event wait node did not wait", be);
    printf("event wait graph on another stream: %s\n", be ? "wrong" : "ok");
    CHECK(cudaStreamSynchronize(s));
    check_state("after 3 launches", m, d, acc);

    // A scalar argument changed in the executable graph.
    k = 5;
    kp = kernel_params((void *)add_k, addk_args);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, node[ADDK], &kp));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    host_launch(a, d, acc, 0.5f, 5);
    check_state("after cudaGraphExecKernelNodeSetParams (k 5)", m, d, acc);

    // The executable graph updated from a graph of the same topology (extra 0.25, k 7).
    cudaGraphNode_t node2[NODES];
    size_t roots2 = 0;
    cudaGraph_t g2 = build_main(m, child, ev, 0.25f, 7, node2, &roots2);
    cudaGraphExecUpdateResultInfo info = {};
    CHECK(cudaGraphExecUpdate(exec, g2, &info));
    printf("cudaGraphExecUpdate: %s\n", info.result == cudaGraphExecUpdateSuccess ? "in place" : "refused");
    EXPECT(info.result == cudaGraphExecUpdateSuccess, "update refused (result %d)", (int)info.result);
    for (int i = 0; i < 2; i++) {
        CHECK(cudaGraphLaunch(exec, s));
        host_launch(a, d, acc, 0.25f, 7);
    }
    CHECK(cudaStreamSynchronize(s));
    check_state("after the update and 2 launches", m, d, acc);

    // The clone (made after k was set to 2) runs on its own.
    cudaGraphExec_t clone_exec;
    CHECK(cudaGraphInstantiate(&clone_exec, clone, 0));
    CHECK(cudaGraphLaunch(clone_exec, s2));
    CHECK(cudaStreamSynchronize(s2));
    host_launch(a, d, acc, 0.5f, 2);
    check_state("after a launch of the clone", m, d, acc);

    // DOT output: only that a non-empty file was written (its content names addresses).
    char path[64];
    snprintf(path, sizeof path, "/tmp/graph_explicit.%d.dot", (int)getpid());
    CHECK(cudaGraphDebugDotPrint(g, path, cudaGraphDebugDotFlagsVerbose));
    struct stat st;
    bool written = stat(path, &st) == 0 && st.st_size > 0;
    printf("dot file written: %s\n", yes(written));
    EXPECT(written, "cudaGraphDebugDotPrint wrote no file at %s", path);
    unlink(path);

    // Capture into a graph of the program's own, after its memset node; the second kernel is
    // set to follow the memset again (cudaStreamUpdateCaptureDependencies).
    {
        const int cn = 4096;
        float *x = NULL, *y = NULL;
        CHECK(cudaMalloc(&x, cn * sizeof(float)));
        CHECK(cudaMalloc(&y, cn * sizeof(float)));
        CHECK(cudaMemset(y, 0, cn * sizeof(float)));
        cudaGraph_t into;
        CHECK(cudaGraphCreate(&into, 0));
        cudaGraphNode_t set_x;
        cudaMemsetParams mp = {};
        mp.dst = x;
        mp.value = 0;
        mp.elementSize = 4;
        mp.width = cn;
        mp.height = 1;
        CHECK(cudaGraphAddMemsetNode(&set_x, into, NULL, 0, &mp));
        CHECK(cudaStreamBeginCaptureToGraph(s, into, &set_x, NULL, 1, cudaStreamCaptureModeGlobal));
        add_k<<<(cn + 255) / 256, 256, 0, s>>>(x, cn, 3);
        CHECK_LAUNCH();
        CHECK(cudaStreamUpdateCaptureDependencies(s, &set_x, NULL, 1, cudaStreamSetCaptureDependencies));
        add_k<<<(cn + 255) / 256, 256, 0, s>>>(y, cn, 5);
        CHECK_LAUNCH();
        cudaGraph_t ended = NULL;
        CHECK(cudaStreamEndCapture(s, &ended));
        size_t count = 0, root_count = 0;
        CHECK(cudaGraphGetNodes(into, NULL, &count));
        CHECK(cudaGraphGetRootNodes(into, NULL, &root_count));
        printf("capture into a graph: the same graph: %s, nodes %zu, roots %zu\n", yes(ended == into), count, root_count);
        cudaGraphExec_t into_exec;
        CHECK(cudaGraphInstantiate(&into_exec, into, 0));
        CHECK(cudaGraphLaunch(into_exec, s));
        CHECK(cudaGraphLaunch(into_exec, s));
        CHECK(cudaStreamSynchronize(s));
        std::vector<float> hx(cn), hy(cn);
        CHECK(cudaMemcpy(hx.data(), x, cn * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hy.data(), y, cn * sizeof(float), cudaMemcpyDeviceToHost));
        bool ok = true;
        for (int i = 0; i < cn; i++) ok &= hx[i] == 3.0f && hy[i] == 10.0f;
        printf("capture into a graph: after 2 launches x = 3 (set, then +3), y = 10: %s\n", yes(ok));
        EXPECT(ok, "capture into a graph: wrong values");
        CHECK(cudaGraphExecDestroy(into_exec));
        CHECK(cudaGraphDestroy(into));
        CHECK_EACH(cudaFree, x, y);
    }

    CHECK_EACH(cudaGraphExecDestroy, exec, wait_exec, clone_exec);
    CHECK_EACH(cudaGraphDestroy, g, g2, clone, waiter, child);
    CHECK(cudaEventDestroy(ev));
    CHECK_EACH(cudaStreamDestroy, s, s2);
    for (float **p : all) CHECK(cudaFree(*p));
    return test_finish();
}

// graph_getters: what graph nodes read back, kernel node attributes and user objects, through the
// driver API (linked with -lcuda) over runtime-built kernel nodes: memset, memcpy and host node
// parameters of nodes the app made and of captured ones; kernel node attributes set, read back,
// copied to another node and in effect at launch; the legacy cuGraphInstantiate export; user
// objects whose destructor runs once, after the graph, the executable graph and a slow launch
// all let go (and not while that launch still runs); the runtime front's counterparts.
#include <dlfcn.h>
#include <unistd.h>

#include <vector>

#include "driver_check.h"
#include "graph_add_kernel.h"

__global__ void scale(int *p, int n, int factor) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= factor;
}

// One thread spins about `cycles` clock ticks, then marks `flag`.
__global__ void spin_then_mark(int *flag, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    *flag = 1;
}

static void host_count(void *data) { ++*(int *)data; }

static int destroyed = 0;
static void destroy_object(void *weight) { __atomic_add_fetch(&destroyed, *(int *)weight, __ATOMIC_SEQ_CST); }

static int destroyed_now() { return __atomic_load_n(&destroyed, __ATOMIC_SEQ_CST); }

// Waits up to two seconds for the destructor count to reach `want`.
static int destroyed_after_wait(int want) {
    for (int i = 0; i < 2000 && destroyed_now() < want; i++) usleep(1000);
    return destroyed_now();
}


int main() {
    test_init("graph_getters");
    CHECK(cudaFree(0));
    CUcontext ctx;
    CHECK_CU(cuCtxGetCurrent(&ctx));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int n = 1 << 16;
    int *buf = nullptr;
    CHECK(cudaMalloc(&buf, 4 * n * sizeof(int)));
    CUdeviceptr d = (CUdeviceptr)buf;

    // 1. Nodes the app made read back as given.
    CUgraph g;
    CHECK_CU(cuGraphCreate(&g, 0));
    CUDA_MEMSET_NODE_PARAMS set = {};
    set.dst = d;
    set.value = 3;
    set.elementSize = 4;
    set.width = n;
    set.height = 1;
    CUgraphNode set_node, copy_node, host_node;
    CHECK_CU(cuGraphAddMemsetNode(&set_node, g, nullptr, 0, &set, ctx));
    CUDA_MEMCPY3D copy = {};
    copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.srcDevice = d;
    copy.srcXInBytes = 64;
    copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.dstDevice = d + n * sizeof(int);
    copy.WidthInBytes = (n - 16) * sizeof(int);
    copy.Height = 1;
    copy.Depth = 1;
    CHECK_CU(cuGraphAddMemcpyNode(&copy_node, g, &set_node, 1, &copy, ctx));
    int host_runs = 0;
    CUDA_HOST_NODE_PARAMS host = {host_count, &host_runs};
    CHECK_CU(cuGraphAddHostNode(&host_node, g, &copy_node, 1, &host));
    CUDA_MEMSET_NODE_PARAMS set_back = {};
    CHECK_CU(cuGraphMemsetNodeGetParams(set_node, &set_back));
    printf("memset node: value %u, element size %u, width %zu, height %zu, dst given: %s\n", set_back.value, set_back.elementSize,
           set_back.width, set_back.height, set_back.dst == d ? "yes" : "no");
    CUDA_MEMCPY3D copy_back = {};
    CHECK_CU(cuGraphMemcpyNodeGetParams(copy_node, &copy_back));
    printf("memcpy node: srcXInBytes %zu, width %zu, src and dst given: %s\n", copy_back.srcXInBytes, copy_back.WidthInBytes,
           copy_back.srcDevice == d && copy_back.dstDevice == d + n * sizeof(int) ? "yes" : "no");
    CUDA_HOST_NODE_PARAMS host_back = {};
    CHECK_CU(cuGraphHostNodeGetParams(host_node, &host_back));
    printf("host node: function and data given: %s\n", host_back.fn == host_count && host_back.userData == &host_runs ? "yes" : "no");
    CUresult wrong = cuGraphMemsetNodeGetParams(copy_node, &set_back);
    printf("memset getter on a copy node: %s\n", wrong == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : "other");
    set.value = 5;
    CHECK_CU(cuGraphMemsetNodeSetParams(set_node, &set));
    CHECK_CU(cuGraphMemsetNodeGetParams(set_node, &set_back));
    printf("memset node after a new value: %u\n", set_back.value);

    // The legacy cuGraphInstantiate export (cuda.h now maps the name to WithFlags).
    typedef CUresult (*legacy_instantiate)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
    legacy_instantiate instantiate = (legacy_instantiate)dlsym(RTLD_DEFAULT, "cuGraphInstantiate");
    printf("legacy cuGraphInstantiate exported: %s\n", instantiate ? "yes" : "no");
    CUgraphExec exec;
    CUgraphNode error_node = set_node;
    char log[32] = "unwritten";
    if (instantiate) {
        CHECK_CU(instantiate(&exec, g, &error_node, log, sizeof log));
    } else {
        CHECK_CU(cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    printf("legacy instantiate: error node %s, log %s\n", error_node ? "set" : "NULL", log[0] ? "written" : "empty");
    CHECK_CU(cuGraphLaunch(exec, (CUstream)s));
    CHECK(cudaStreamSynchronize(s));
    std::vector<int> host_copy(n);
    CHECK(cudaMemcpy(host_copy.data(), buf + n, (n - 16) * sizeof(int), cudaMemcpyDeviceToHost));
    bool copied = true;
    for (int i = 0; i < n - 16; i++) copied &= host_copy[i] == 5;
    printf("graph ran: copy of the memset %s, host node ran %d time(s)\n", copied ? "right" : "wrong", host_runs);
    CHECK_CU(cuGraphExecDestroy(exec));
    CHECK_CU(cuGraphDestroy(g));

    // 2. Captured nodes read back as the driver recorded them.
    cudaGraph_t captured;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK_CU(cuMemsetD8Async(d, 0x24, 512, (CUstream)s));
    CHECK_CU(cuMemcpyDtoDAsync(d + 2 * n * sizeof(int), d, 512, (CUstream)s));
    CHECK_CU(cuLaunchHostFunc((CUstream)s, host_count, &host_runs));
    CHECK(cudaStreamEndCapture(s, &captured));
    CUgraphNode nodes[8];
    size_t count = 8;
    CHECK_CU(cuGraphGetNodes((CUgraph)captured, nodes, &count));
    printf("captured nodes: %zu\n", count);
    for (size_t i = 0; i < count; i++) {
        CUgraphNodeType type;
        CHECK_CU(cuGraphNodeGetType(nodes[i], &type));
        if (type == CU_GRAPH_NODE_TYPE_MEMSET) {
            CHECK_CU(cuGraphMemsetNodeGetParams(nodes[i], &set_back));
            printf("captured memset: byte 0x%x, %zu bytes, dst right: %s\n", set_back.value & 0xff,
                   set_back.width * set_back.height * set_back.elementSize, set_back.dst == d ? "yes" : "no");
        } else if (type == CU_GRAPH_NODE_TYPE_MEMCPY) {
            CHECK_CU(cuGraphMemcpyNodeGetParams(nodes[i], &copy_back));
            bool ends = copy_back.srcDevice + copy_back.srcXInBytes == d && copy_back.dstDevice + copy_back.dstXInBytes == d + 2 * n * sizeof(int);
            printf("captured memcpy: %zu bytes, ends right: %s\n", copy_back.WidthInBytes * copy_back.Height * copy_back.Depth,
                   ends ? "yes" : "no");
        } else if (type == CU_GRAPH_NODE_TYPE_HOST) {
            CHECK_CU(cuGraphHostNodeGetParams(nodes[i], &host_back));
            printf("captured host node: the app's function and data: %s\n",
                   host_back.fn == host_count && host_back.userData == &host_runs ? "yes" : "no");
        }
    }
    cudaMemsetParams rt_set = {};
    for (size_t i = 0; i < count; i++) {
        CUgraphNodeType type;
        CHECK_CU(cuGraphNodeGetType(nodes[i], &type));
        if (type == CU_GRAPH_NODE_TYPE_MEMSET) CHECK(cudaGraphMemsetNodeGetParams((cudaGraphNode_t)nodes[i], &rt_set));
    }
    printf("runtime memset getter: byte 0x%x\n", rt_set.value & 0xff);
    CHECK(cudaGraphDestroy(captured));

    // 3. Kernel node attributes: set, read back, copied, in effect at launch.
    cudaGraph_t kg;
    CHECK(cudaGraphCreate(&kg, 0));
    int factor = 2, nn = n;
    void *args[] = {&buf, &nn, &factor};
    cudaGraphNode_t k1 = add_kernel(kg, nullptr, 0, (void *)scale, dim3((n + 255) / 256), dim3(256), args);
    cudaGraphNode_t k2 = add_kernel(kg, &k1, 1, (void *)scale, dim3((n + 255) / 256), dim3(256), args);
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUkernelNodeAttrValue value = {};
    value.priority = greatest;
    CHECK_CU(cuGraphKernelNodeSetAttribute((CUgraphNode)k1, CU_LAUNCH_ATTRIBUTE_PRIORITY, &value));
    value = {};
    value.accessPolicyWindow.base_ptr = buf;
    value.accessPolicyWindow.num_bytes = 4096;
    value.accessPolicyWindow.hitRatio = 0.5f;
    value.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
    value.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
    CHECK_CU(cuGraphKernelNodeSetAttribute((CUgraphNode)k1, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &value));
    CUkernelNodeAttrValue back = {};
    CHECK_CU(cuGraphKernelNodeGetAttribute((CUgraphNode)k1, CU_LAUNCH_ATTRIBUTE_PRIORITY, &back));
    printf("priority read back: %s\n", back.priority == greatest ? "the greatest" : "other");
    CHECK_CU(cuGraphKernelNodeGetAttribute((CUgraphNode)k1, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &back));
    printf("access policy window read back: base %s, %zu bytes, hit ratio %.2f\n", back.accessPolicyWindow.base_ptr == buf ? "given" : "other",
           back.accessPolicyWindow.num_bytes, back.accessPolicyWindow.hitRatio);
    CHECK_CU(cuGraphKernelNodeCopyAttributes((CUgraphNode)k2, (CUgraphNode)k1));
    cudaLaunchAttributeValue rt_back = {};
    CHECK(cudaGraphKernelNodeGetAttribute(k2, cudaLaunchAttributePriority, &rt_back));
    printf("copied to the second node (runtime getter): priority %s\n", rt_back.priority == greatest ? "the greatest" : "other");
    std::vector<int> ones(n, 1);
    CHECK(cudaMemcpy(buf, ones.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    cudaGraphExec_t kexec;
    CHECK(cudaGraphInstantiate(&kexec, kg, 0));
    CHECK(cudaGraphLaunch(kexec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(ones.data(), buf, n * sizeof(int), cudaMemcpyDeviceToHost));
    bool scaled = true;
    for (int i = 0; i < n; i++) scaled &= ones[i] == 4;
    printf("kernel nodes with attributes ran: %s\n", scaled ? "yes" : "no");
    CHECK(cudaGraphExecDestroy(kexec));
    CHECK(cudaGraphDestroy(kg));

    // 4. User objects: the destructor waits for the graph, the executable graph and a slow launch.
    int weight = 1;
    CUuserObject object;
    CHECK_CU(cuUserObjectCreate(&object, &weight, destroy_object, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    cudaGraph_t holder;
    CHECK(cudaGraphCreate(&holder, 0));
    int *flag = nullptr;
    CHECK(cudaMalloc(&flag, sizeof(int)));
    CHECK(cudaMemset(flag, 0, sizeof(int)));
    long long cycles = 400000000LL;  // a few hundred milliseconds
    void *spin_args[] = {&flag, &cycles};
    add_kernel(holder, nullptr, 0, (void *)spin_then_mark, dim3(1), dim3(1), spin_args);
    CHECK_CU(cuGraphRetainUserObject((CUgraph)holder, object, 1, CU_GRAPH_USER_OBJECT_MOVE));
    CHECK_CU(cuUserObjectRetain(object, 2));
    CHECK_CU(cuUserObjectRelease(object, 2));
    cudaGraphExec_t hexec;
    CHECK(cudaGraphInstantiate(&hexec, holder, 0));
    CHECK(cudaGraphLaunch(hexec, s));
    CHECK(cudaGraphDestroy(holder));
    CHECK(cudaGraphExecDestroy(hexec));
    usleep(20000);
    printf("while the launch runs: destructor ran %d time(s)\n", destroyed_now());
    CHECK(cudaStreamSynchronize(s));
    int after = destroyed_after_wait(1);
    usleep(50000);
    printf("after the launch: destructor ran %d time(s), and %d time(s) a moment later\n", after, destroyed_now());
    // A graph's reference released by the app, through the runtime front.
    cudaUserObject_t rt_object;
    CHECK(cudaUserObjectCreate(&rt_object, &weight, destroy_object, 1, cudaUserObjectNoDestructorSync));
    cudaGraph_t rt_holder;
    CHECK(cudaGraphCreate(&rt_holder, 0));
    CHECK(cudaGraphRetainUserObject(rt_holder, rt_object, 1, 0));
    CHECK(cudaUserObjectRelease(rt_object, 1));
    CHECK(cudaGraphReleaseUserObject(rt_holder, rt_object, 1));
    printf("released by its graph: destructor count %d\n", destroyed_after_wait(2));
    CHECK(cudaGraphDestroy(rt_holder));

    CHECK(cudaFree(flag));
    CHECK(cudaFree(buf));
    CHECK(cudaStreamDestroy(s));
    return test_finish();
}

// graph_nodes_runtime: graph_nodes.cu with the runtime API only, so that a -cudart=shared build
// exercises Flyt's runtime front (and a static build NVIDIA's runtime over Flyt's driver): a
// memory allocation node (cudaGraphAddMemAllocNode), kernels that fill and read that graph memory
// (the fill a generic kernel node, cudaGraphAddNode), a generic memory free node, launched three
// times; a conditional WHILE node (cudaGraphConditionalHandleCreate + cudaGraphAddNode) whose
// generic body kernel counts to 10 and clears the condition itself, and IF nodes whose condition a
// kernel sets; queries of dependencies, dependents and edges with their data; a kernel node
// disabled and enabled in the executable graph, and its arguments changed there
// (cudaGraphExecNodeSetParams); a generic pitched copy node and a memset node changed through
// cudaGraphNodeSetParams; instantiation flags, event and child graph getters; graph memory
// attributes.
#include <vector>

#include "common.h"
#include "graph_kernels.h"


// The generic form of a kernel node's parameters.
static cudaGraphNodeParams kernel_params(void *func, dim3 grid, dim3 block, void **args) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeKernel;
    p.kernel.func = func;
    p.kernel.gridDim = grid;
    p.kernel.blockDim = block;
    p.kernel.kernelParams = args;
    return p;
}

// A conditional node of one body graph on `handle`.
static cudaGraphNodeParams conditional_params(cudaGraphConditionalHandle handle, cudaGraphConditionalNodeType type) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = handle;
    p.conditional.type = type;
    p.conditional.size = 1;
    return p;
}

int main() {
    test_init("graph_nodes_runtime");
    CHECK(cudaFree(0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int n = 1 << 20;
    int *out = zeroed_ints(n, s);

    // 1. Graph memory: alloc -> fill (generic kernel node) -> out += it -> free (generic), launched
    // three times.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams alloc;
    cudaGraphNode_t alloc_node = add_device_alloc(g, nullptr, 0, n * sizeof(int), &alloc);
    int *gm = (int *)alloc.dptr;
    int scale = 3, count = n;
    void *fill_args[] = {&gm, &count, &scale};
    cudaGraphNodeParams fp = kernel_params((void *)fill, dim3(n / 256), dim3(256), fill_args);
    cudaGraphNode_t fill_node;
    CHECK(cudaGraphAddNode(&fill_node, g, &alloc_node, nullptr, 1, &fp));
    void *copy_args[] = {&out, &gm, &count};
    cudaGraphNode_t copy_node = add_kernel(g, &fill_node, 1, (void *)copy_plus, dim3(n / 256), dim3(256), copy_args);
    cudaGraphNodeParams freep = {};
    freep.type = cudaGraphNodeTypeMemFree;
    freep.free.dptr = alloc.dptr;
    cudaGraphNode_t free_node;
    CHECK(cudaGraphAddNode(&free_node, g, &copy_node, nullptr, 1, &freep));
    cudaMemAllocNodeParams back = {};
    CHECK(cudaGraphMemAllocNodeGetParams(alloc_node, &back));
    printf("allocation node: %zu bytes, same address: %s\n", back.bytesize, back.dptr == alloc.dptr ? "yes" : "no");
    EXPECT(back.bytesize == alloc.bytesize && back.dptr == alloc.dptr, "allocation node parameters read back wrong");
    void *freed = nullptr;
    CHECK(cudaGraphMemFreeNodeGetParams(free_node, &freed));
    printf("free node names it: %s\n", freed == alloc.dptr ? "yes" : "no");
    EXPECT(freed == alloc.dptr, "the free node names another address");
    size_t deps = 0, dependents = 0, edges = 0;
    CHECK(cudaGraphNodeGetDependencies(copy_node, nullptr, nullptr, &deps));
    CHECK(cudaGraphNodeGetDependentNodes(alloc_node, nullptr, nullptr, &dependents));
    CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
    cudaGraphNode_t dep = nullptr;
    cudaGraphEdgeData dep_data = {};
    dep_data.type = 0xff;
    size_t room = 1;
    CHECK(cudaGraphNodeGetDependencies(copy_node, &dep, &dep_data, &room));
    printf("copy node: %zu dependency (the fill: %s, default edge: %s); allocation: %zu dependent; edges: %zu\n", deps,
           dep == fill_node ? "yes" : "no", dep_data.type == 0 && dep_data.from_port == 0 ? "yes" : "no", dependents, edges);
    EXPECT(deps == 1 && dep == fill_node && dependents == 1 && edges == 3, "graph queries: %zu %zu %zu", deps, dependents, edges);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    launch_three_times(exec, s, out, n);
    unsigned long long high = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &high));
    printf("graph memory high watermark covers the allocation: %s\n", high >= alloc.bytesize ? "yes" : "no");
    EXPECT(high >= alloc.bytesize, "graph memory high watermark %llu", high);
    // Disable the copy kernel in the executable graph: the output stays; enabled again, it adds.
    unsigned enabled = 9;
    CHECK(cudaGraphNodeSetEnabled(exec, copy_node, 0));
    CHECK(cudaGraphNodeGetEnabled(exec, copy_node, &enabled));
    printf("copy kernel disabled: %s\n", enabled == 0 ? "yes" : "no");
    launch_and_wait(exec, s);
    int bad = wrong_values(out, n, 3 * 3);
    printf("a launch with it disabled leaves the output: %s\n", bad ? "changed" : "unchanged");
    EXPECT(bad == 0, "a disabled kernel node ran");
    CHECK(cudaGraphNodeSetEnabled(exec, copy_node, 1));
    launch_and_wait(exec, s);
    bad = wrong_values(out, n, 4 * 3);
    printf("enabled again, it runs: %s\n", bad ? "no" : "yes");
    EXPECT(bad == 0, "the re-enabled kernel node did not run");
    // New arguments for the fill kernel in the executable graph: out += 5 * i.
    int scale5 = 5;
    void *fill5_args[] = {&gm, &count, &scale5};
    cudaGraphNodeParams fp5 = kernel_params((void *)fill, dim3(n / 256), dim3(256), fill5_args);
    CHECK(cudaGraphExecNodeSetParams(exec, fill_node, &fp5));
    launch_and_wait(exec, s);
    bad = wrong_values(out, n, 4 * 3 + 5);
    printf("fill kernel's arguments changed in the executable graph: %s\n", bad ? "no" : "yes");
    EXPECT(bad == 0, "cudaGraphExecNodeSetParams: %d values wrong", bad);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // 2. A WHILE loop the body kernel ends, and IF nodes a kernel decides.
    int *counter = zeroed_ints(3, s);
    cudaGraph_t w;
    CHECK(cudaGraphCreate(&w, 0));
    cudaGraphConditionalHandle loop;
    CHECK(cudaGraphConditionalHandleCreate(&loop, w, 1, cudaGraphCondAssignDefault));
    cudaGraphNodeParams wp = conditional_params(loop, cudaGraphCondTypeWhile);
    cudaGraphNode_t while_node;
    CHECK(cudaGraphAddNode(&while_node, w, nullptr, nullptr, 0, &wp));
    int limit = 10;
    void *step_args[] = {&counter, &limit, &loop};
    cudaGraphNodeParams sp = kernel_params((void *)count_step, dim3(1), dim3(1), step_args);
    cudaGraphNode_t step_node;
    CHECK(cudaGraphAddNode(&step_node, wp.conditional.phGraph_out[0], nullptr, nullptr, 0, &sp));
    // IF on a handle a kernel sets to 1 (then body runs), and one set to 0 (body skipped).
    int *second = counter + 1, *third = counter + 2;
    cudaGraphNode_t prev = while_node;
    for (unsigned value = 0; value < 2; value++) {
        cudaGraphConditionalHandle h_if;
        CHECK(cudaGraphConditionalHandleCreate(&h_if, w, 0, 0));
        void *set_args[] = {&h_if, &value};
        cudaGraphNode_t last = add_kernel(w, &prev, 1, (void *)set_condition, dim3(1), dim3(1), set_args);
        cudaGraphNodeParams ip = conditional_params(h_if, cudaGraphCondTypeIf);
        cudaGraphNode_t if_node;
        CHECK(cudaGraphAddNode(&if_node, w, &last, nullptr, 1, &ip));
        void *one_args[] = {value ? &second : &third};
        add_kernel(ip.conditional.phGraph_out[0], nullptr, 0, (void *)add_one, dim3(1), dim3(1), one_args);
        prev = if_node;
    }
    run_conditional_graph(w, s, counter);

    // 3. Generic memset and pitched copy nodes; getters: instantiation flags, event nodes, a child
    // graph node's graph.
    cudaGraph_t e;
    CHECK(cudaGraphCreate(&e, 0));
    cudaGraph_t child = two_empty_nodes();
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    const int rows = 4, row = n / rows;
    cudaGraphNodeParams setp = {};
    setp.type = cudaGraphNodeTypeMemset;
    setp.memset.dst = counter;
    setp.memset.value = 7;
    setp.memset.elementSize = 4;
    setp.memset.width = 3;
    setp.memset.height = 1;
    cudaGraphNode_t set_node;
    CHECK(cudaGraphAddNode(&set_node, e, nullptr, nullptr, 0, &setp));
    setp.memset.value = 9;
    CHECK(cudaGraphNodeSetParams(set_node, &setp));
    cudaGraphNodeParams cp = {};
    cp.type = cudaGraphNodeTypeMemcpy;
    cp.memcpy.copyParams.srcPtr = make_cudaPitchedPtr(out, row * sizeof(int), row * sizeof(int), rows);
    cp.memcpy.copyParams.dstPtr = make_cudaPitchedPtr(out, row * sizeof(int), row * sizeof(int), rows);
    cp.memcpy.copyParams.srcPos = make_cudaPos(0, 1, 0);
    cp.memcpy.copyParams.extent = make_cudaExtent(row * sizeof(int), 1, 1);
    cp.memcpy.copyParams.kind = cudaMemcpyDeviceToDevice;
    cudaGraphNode_t pitched_node;
    CHECK(cudaGraphAddNode(&pitched_node, e, &set_node, nullptr, 1, &cp));
    cudaGraphNode_t rec, wait, child_node;
    CHECK(cudaGraphAddEventRecordNode(&rec, e, &pitched_node, 1, ev));
    CHECK(cudaGraphAddEventWaitNode(&wait, e, &rec, 1, ev));
    CHECK(cudaGraphAddChildGraphNode(&child_node, e, &wait, 1, child));
    cudaEvent_t got = nullptr;
    CHECK(cudaGraphEventRecordNodeGetEvent(rec, &got));
    printf("record node's event: %s\n", got == ev ? "the one given" : "another");
    EXPECT(got == ev, "the record node names another event");
    got = nullptr;
    CHECK(cudaGraphEventWaitNodeGetEvent(wait, &got));
    printf("wait node's event: %s\n", got == ev ? "the one given" : "another");
    EXPECT(got == ev, "the wait node names another event");
    cudaGraph_t inner = nullptr;
    CHECK(cudaGraphChildGraphNodeGetGraph(child_node, &inner));
    size_t inner_nodes = 0, inner_edges = 0;
    CHECK(cudaGraphGetNodes(inner, nullptr, &inner_nodes));
    CHECK(cudaGraphGetEdges(inner, nullptr, nullptr, nullptr, &inner_edges));
    printf("child node's graph: %zu nodes, %zu edge(s)\n", inner_nodes, inner_edges);
    EXPECT(inner_nodes == 2 && inner_edges == 1, "child graph: %zu nodes, %zu edges", inner_nodes, inner_edges);
    cudaGraphExec_t eexec;
    CHECK(cudaGraphInstantiateWithFlags(&eexec, e, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    unsigned long long flags = 0;
    CHECK(cudaGraphExecGetFlags(eexec, &flags));
    printf("instantiation flags read back: %s\n", flags == cudaGraphInstantiateFlagAutoFreeOnLaunch ? "yes" : "no");
    EXPECT(flags == cudaGraphInstantiateFlagAutoFreeOnLaunch, "instantiation flags %llu", flags);
    launch_and_wait(eexec, s);
    int counts[3] = {0, 0, 0};
    CHECK(cudaMemcpy(counts, counter, sizeof counts, cudaMemcpyDeviceToHost));
    std::vector<int> h(n);
    CHECK(cudaMemcpy(h.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int i = 0; i < row; i++) bad += h[i] != (4 * 3 + 5) * (row + i);
    printf("generic memset wrote its new value: %s; pitched copy moved row 1 to row 0: %s\n",
           counts[0] == 9 && counts[2] == 9 ? "yes" : "no", bad ? "no" : "yes");
    EXPECT(counts[0] == 9 && counts[2] == 9 && bad == 0, "generic memset %d, copy %d values wrong", counts[0], bad);
    CHECK(cudaGraphExecDestroy(eexec));
    CHECK_EACH(cudaGraphDestroy, e, child);
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaDeviceGraphMemTrim(0));

    CHECK_EACH(cudaFree, counter, out);
    CHECK(cudaStreamDestroy(s));
    return test_finish();
}

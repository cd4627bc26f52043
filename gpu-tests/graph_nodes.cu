// graph_nodes: CUDA graph node kinds beyond kernels and copies, built with the driver API over
// runtime-built kernel nodes (one session, both APIs): a memory allocation node, kernels that fill
// and read that graph memory, a memory free node, launched three times; a conditional WHILE node
// whose body kernel counts to 10 and clears the condition itself (cudaGraphSetConditional), and IF
// nodes whose condition a kernel sets; queries of dependencies, dependents and edges; a kernel node
// disabled and enabled in the executable graph; instantiation flags, event and child graph
// getters; graph memory attributes; batch memory operation nodes; a programmatic edge; stream
// capture with edge data (into an existing graph after a programmatic edge, and dependencies
// updated with one). Built with -lcuda.
#include <vector>

#include "driver_check.h"
#include "graph_kernels.h"

// A producer and a consumer joined by a programmatic edge: the consumer may start early and
// waits for the producer's trigger before it reads.
__global__ void produce(int *p) {
    p[0] = 5;
    __threadfence();
    cudaTriggerProgrammaticLaunchCompletion();
}

__global__ void consume(int *p) {
    cudaGridDependencySynchronize();
    p[1] = p[0] + 1;
}


static CUstreamBatchMemOpParams write32(CUdeviceptr address, unsigned value) {
    CUstreamBatchMemOpParams op = {};
    op.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = address;
    op.writeValue.value = value;
    return op;
}

// Instantiates g, runs it once on s, and reads the pair of ints its kernels wrote into got.
static void run_once_reading(cudaGraph_t g, cudaStream_t s, const int *pair, int got[2]) {
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    launch_and_wait(exec, s);
    CHECK(cudaMemcpy(got, pair, 2 * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaGraphExecDestroy(exec));
}

// Graph edges with data (driver API): a programmatic edge between two kernel nodes, read back
// and run.
static void programmatic_edge(cudaStream_t s) {
    int *pair = nullptr;
    CHECK(cudaMalloc(&pair, 2 * sizeof(int)));
    // On the stream the graph runs on: it does not wait for the legacy stream (non-blocking).
    CHECK(cudaMemsetAsync(pair, 0, 2 * sizeof(int), s));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    void *args[] = {&pair};
    cudaGraphNode_t producer = add_kernel(g, nullptr, 0, (void *)produce, 1, 1, args);
    cudaGraphNode_t consumer = add_kernel(g, nullptr, 0, (void *)consume, 1, 1, args);
    CUgraphEdgeData edge = {};
    edge.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
    edge.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    CUgraphNode from = (CUgraphNode)producer, to = (CUgraphNode)consumer;
    CHECK_CU(cuGraphAddDependencies_v2((CUgraph)g, &from, &to, &edge, 1));
    CUgraphNode edge_from[2], edge_to[2];
    CUgraphEdgeData data[2] = {};
    size_t count = 2;
    CHECK_CU(cuGraphGetEdges_v2((CUgraph)g, edge_from, edge_to, data, &count));
    int got[2] = {0, 0};
    run_once_reading(g, s, pair, got);
    printf("programmatic edge: %zu edge(s), from port %d, type %d; consumer read %d\n", count, (int)data[0].from_port,
           (int)data[0].type, got[1]);
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(pair));
}

// A capture's first dependency and its edge data, as cuStreamGetCaptureInfo gives them (the
// edge data is the default, all zero, where the driver gives none).
static size_t capture_dependency(cudaStream_t s, CUgraphNode *node, CUgraphEdgeData *data) {
    CUstreamCaptureStatus status;
    const CUgraphNode *deps = nullptr;
    const CUgraphEdgeData *edges = nullptr;
    size_t count = 0;
    CHECK_CU(cuStreamGetCaptureInfo_v3((CUstream)s, &status, nullptr, nullptr, &deps, &edges, &count));
    *data = {};
    if (count > 0) {
        *node = deps[0];
        if (edges != nullptr) *data = edges[0];
    }
    return count;
}

// The name of what cuStreamGetCaptureInfo answers when asked for dependencies without their
// edge data (CUDA_ERROR_LOSSY_QUERY where some is not the default).
static const char *lossy_query(cudaStream_t s) {
    CUstreamCaptureStatus status;
    const CUgraphNode *deps = nullptr;
    size_t count = 0;
    const char *name = "?";
    cuGetErrorName(cuStreamGetCaptureInfo_v3((CUstream)s, &status, nullptr, nullptr, &deps, nullptr, &count), &name);
    return name;
}

// Ends the capture on s with the consumer kernel reading pair; the graph captured.
static cudaGraph_t end_capture_with_consumer(cudaStream_t s, int *pair) {
    consume<<<1, 1, 0, s>>>(pair);
    CHECK(cudaGetLastError());
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s, &g));
    return g;
}

// The one edge of a graph of two nodes, run: its port and type, and what the consumer read.
static void print_captured_edge(const char *what, cudaGraph_t g, cudaStream_t s, int *pair) {
    CUgraphNode from[2], to[2];
    CUgraphEdgeData data[2] = {};
    size_t count = 2;
    CHECK_CU(cuGraphGetEdges_v2((CUgraph)g, from, to, data, &count));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    int got[2] = {0, 0};
    run_once_reading(g, s, pair, got);
    printf("%s: %zu node(s), %zu edge(s), from port %d, to port %d, type %d; consumer read %d\n", what, nodes, count,
           (int)data[0].from_port, (int)data[0].to_port, (int)data[0].type, got[1]);
}

// Stream capture with edge data (driver API): a capture into an existing graph whose first
// captured kernel follows a producer kernel node through a programmatic edge
// (cuStreamBeginCaptureToGraph with dependency data), and a capture whose dependencies are set
// again with a programmatic edge (cuStreamUpdateCaptureDependencies_v2); the capture's
// dependencies and edge data read back (cuStreamGetCaptureInfo), the captured edges read back
// (cuGraphGetEdges_v2), and the graphs run.
static void capture_with_edge_data(cudaStream_t s) {
    int *pair = nullptr;
    CHECK(cudaMalloc(&pair, 2 * sizeof(int)));
    CUgraphEdgeData edge = {};
    edge.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
    edge.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    void *args[] = {&pair};

    // 1. Into an existing graph, after its producer node by a programmatic edge.
    CHECK(cudaMemsetAsync(pair, 0, 2 * sizeof(int), s));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    CUgraphNode producer = (CUgraphNode)add_kernel(g, nullptr, 0, (void *)produce, 1, 1, args);
    CHECK_CU(cuStreamBeginCaptureToGraph((CUstream)s, (CUgraph)g, &producer, &edge, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUgraphNode first = nullptr;
    CUgraphEdgeData first_data;
    size_t count = capture_dependency(s, &first, &first_data);
    printf("capture into a graph begins after %zu node(s), the producer: %s, from port %d, type %d; without edge data: %s\n", count,
           first == producer ? "yes" : "no", (int)first_data.from_port, (int)first_data.type, lossy_query(s));
    cudaGraph_t ended = end_capture_with_consumer(s, pair);
    printf("the capture ended in the app's graph: %s\n", ended == g ? "yes" : "no");
    print_captured_edge("captured after a programmatic edge", g, s, pair);
    CHECK(cudaGraphDestroy(g));

    // 2. A capture whose dependencies are set again, to the captured producer by a programmatic
    // edge.
    CHECK(cudaMemsetAsync(pair, 0, 2 * sizeof(int), s));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    produce<<<1, 1, 0, s>>>(pair);
    CHECK(cudaGetLastError());
    CUgraphNode captured_producer = nullptr;
    CUgraphEdgeData plain;
    count = capture_dependency(s, &captured_producer, &plain);
    printf("after the captured producer: %zu dependency, from port %d, type %d\n", count, (int)plain.from_port, (int)plain.type);
    CHECK_CU(cuStreamUpdateCaptureDependencies_v2((CUstream)s, &captured_producer, &edge, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
    CUgraphNode again = nullptr;
    CUgraphEdgeData again_data;
    count = capture_dependency(s, &again, &again_data);
    printf("dependencies updated with edge data: %zu, the producer: %s, from port %d, type %d; without edge data: %s\n", count,
           again == captured_producer ? "yes" : "no", (int)again_data.from_port, (int)again_data.type, lossy_query(s));
    cudaGraph_t captured = end_capture_with_consumer(s, pair);
    print_captured_edge("captured with updated dependencies", captured, s, pair);
    CHECK(cudaGraphDestroy(captured));
    CHECK(cudaFree(pair));
}

// Batch memory operation nodes (driver API): writes and a wait, then a kernel that reads what
// they wrote; their parameters read back, changed in the executable graph; a node captured from
// cuStreamWriteValue32.
static void batch_mem_op_nodes(cudaStream_t s) {
    int *words = nullptr;
    CHECK(cudaMalloc(&words, 64));
    CHECK(cudaMemsetAsync(words, 0, 64, s));
    CUdeviceptr flag = (CUdeviceptr)words, wide = flag + 8;
    CUstreamBatchMemOpParams ops[3] = {write32(flag, 41), {}, {}};
    ops[1].operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    ops[1].writeValue.address = wide;
    ops[1].writeValue.value64 = 0x0102030405060708ull;
    ops[2].operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[2].waitValue.address = flag;
    ops[2].waitValue.value = 41;
    ops[2].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    CUDA_BATCH_MEM_OP_NODE_PARAMS params = {};
    CHECK_CU(cuCtxGetCurrent(&params.ctx));
    params.count = 3;
    params.paramArray = ops;
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    CUgraphNode memops;
    CHECK_CU(cuGraphAddBatchMemOpNode(&memops, (CUgraph)g, nullptr, 0, &params));
    void *args[] = {&words};
    cudaGraphNode_t dep = (cudaGraphNode_t)memops;
    add_kernel(g, &dep, 1, (void *)add_one, 1, 1, args);
    CUgraphNodeType type;
    CHECK_CU(cuGraphNodeGetType(memops, &type));
    CUDA_BATCH_MEM_OP_NODE_PARAMS back = {};
    CHECK_CU(cuGraphBatchMemOpNodeGetParams(memops, &back));
    printf("batch node: type %d, %u ops, first writes %u, flags %u\n", (int)type, back.count, back.paramArray[0].writeValue.value,
           back.flags);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    int got = 0;
    unsigned long long got_wide = 0;
    CHECK(cudaMemcpy(&got, words, 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&got_wide, words + 2, 8, cudaMemcpyDeviceToHost));
    printf("after launch: flag %d, wide %llx\n", got, got_wide);
    ops[0] = write32(flag, 99);
    ops[2].waitValue.value = 99;
    CHECK_CU(cuGraphExecBatchMemOpNodeSetParams((CUgraphExec)exec, memops, &params));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(&got, words, 4, cudaMemcpyDeviceToHost));
    CHECK_CU(cuGraphBatchMemOpNodeGetParams(memops, &back));
    printf("executable graph changed: flag %d; graph's node still writes %u\n", got, back.paramArray[0].writeValue.value);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    cudaGraph_t captured;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CHECK_CU(cuStreamWriteValue32((CUstream)s, flag + 16, 7, 0));
    CHECK(cudaStreamEndCapture(s, &captured));
    size_t count = 0;
    CHECK(cudaGraphGetNodes(captured, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CHECK(cudaGraphGetNodes(captured, nodes.data(), &count));
    for (cudaGraphNode_t node : nodes) {
        CHECK_CU(cuGraphNodeGetType((CUgraphNode)node, &type));
        if (type == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) {
            CHECK_CU(cuGraphBatchMemOpNodeGetParams((CUgraphNode)node, &back));
            printf("captured batch node: %u op(s), writes %u\n", back.count, back.paramArray[0].writeValue.value);
        } else {
            printf("captured node of type %d\n", (int)type);
        }
    }
    CHECK(cudaGraphInstantiate(&exec, captured, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(&got, words + 4, 4, cudaMemcpyDeviceToHost));
    printf("captured write ran: %d\n", got);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(captured));
    CHECK(cudaFree(words));
}

// A conditional node of one body graph on `handle`.
static CUgraphNodeParams conditional_params(CUgraphConditionalHandle handle, CUgraphConditionalNodeType type, CUcontext ctx) {
    CUgraphNodeParams p = {};
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.handle = handle;
    p.conditional.type = type;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    return p;
}

int main() {
    test_init("graph_nodes");
    CHECK(cudaFree(0));
    CUcontext ctx;
    CHECK_CU(cuCtxGetCurrent(&ctx));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int n = 1 << 20;
    int *out = zeroed_ints(n, s);

    // 1. Graph memory: alloc -> fill -> out += it -> free, launched three times.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS alloc = {};
    alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    alloc.poolProps.location.id = 0;
    alloc.bytesize = n * sizeof(int);
    CUgraphNode alloc_node;
    CHECK_CU(cuGraphAddMemAllocNode(&alloc_node, (CUgraph)g, nullptr, 0, &alloc));
    int *gm = (int *)alloc.dptr;
    int scale = 3, count = n;
    void *fill_args[] = {&gm, &count, &scale};
    cudaGraphNode_t fill_node = add_kernel(g, (cudaGraphNode_t *)&alloc_node, 1, (void *)fill, dim3(n / 256), dim3(256), fill_args);
    void *copy_args[] = {&out, &gm, &count};
    cudaGraphNode_t copy_node = add_kernel(g, &fill_node, 1, (void *)copy_plus, dim3(n / 256), dim3(256), copy_args);
    CUgraphNode free_node;
    CHECK_CU(cuGraphAddMemFreeNode(&free_node, (CUgraph)g, (CUgraphNode *)&copy_node, 1, alloc.dptr));
    CUDA_MEM_ALLOC_NODE_PARAMS back = {};
    CHECK_CU(cuGraphMemAllocNodeGetParams(alloc_node, &back));
    printf("allocation node: %zu bytes, same address: %s\n", back.bytesize, back.dptr == alloc.dptr ? "yes" : "no");
    CUdeviceptr freed = 0;
    CHECK_CU(cuGraphMemFreeNodeGetParams(free_node, &freed));
    printf("free node names it: %s\n", freed == alloc.dptr ? "yes" : "no");
    size_t deps = 0, dependents = 0, edges = 0;
    CHECK_CU(cuGraphNodeGetDependencies((CUgraphNode)copy_node, nullptr, nullptr, &deps));
    CHECK_CU(cuGraphNodeGetDependentNodes(alloc_node, nullptr, nullptr, &dependents));
    CHECK_CU(cuGraphGetEdges((CUgraph)g, nullptr, nullptr, nullptr, &edges));
    CUgraphNode dep = nullptr;
    size_t room = 1;
    CHECK_CU(cuGraphNodeGetDependencies((CUgraphNode)copy_node, &dep, nullptr, &room));
    printf("copy node: %zu dependency (the fill: %s); allocation: %zu dependent; edges: %zu\n", deps,
           dep == (CUgraphNode)fill_node ? "yes" : "no", dependents, edges);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    launch_three_times(exec, s, out, n);
    unsigned long long high = 0;
    CHECK_CU(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &high));
    printf("graph memory high watermark covers the allocation: %s\n", high >= alloc.bytesize ? "yes" : "no");
    // Disable the fill kernel in the executable graph: out += stale graph memory, so compare
    // against nothing; just check the flag round trip and that re-enabling restores the result.
    unsigned enabled = 9;
    CHECK_CU(cuGraphNodeSetEnabled((CUgraphExec)exec, (CUgraphNode)copy_node, 0));
    CHECK_CU(cuGraphNodeGetEnabled((CUgraphExec)exec, (CUgraphNode)copy_node, &enabled));
    printf("copy kernel disabled: %s\n", enabled == 0 ? "yes" : "no");
    launch_and_wait(exec, s);
    int bad = wrong_values(out, n, 3 * 3);
    printf("a launch with it disabled leaves the output: %s\n", bad ? "changed" : "unchanged");
    EXPECT(bad == 0, "a disabled kernel node ran");
    CHECK_CU(cuGraphNodeSetEnabled((CUgraphExec)exec, (CUgraphNode)copy_node, 1));
    launch_and_wait(exec, s);
    bad = wrong_values(out, n, 4 * 3);
    printf("enabled again, it runs: %s\n", bad ? "no" : "yes");
    EXPECT(bad == 0, "the re-enabled kernel node did not run");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // 2. A WHILE loop the body kernel ends, and IF nodes a kernel decides.
    int *counter = zeroed_ints(3, s);
    cudaGraph_t w;
    CHECK(cudaGraphCreate(&w, 0));
    CUgraphConditionalHandle loop;
    CHECK_CU(cuGraphConditionalHandleCreate(&loop, (CUgraph)w, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUgraphNodeParams wp = conditional_params(loop, CU_GRAPH_COND_TYPE_WHILE, ctx);
    CUgraphNode while_node;
    CHECK_CU(cuGraphAddNode(&while_node, (CUgraph)w, nullptr, nullptr, 0, &wp));
    int limit = 10;
    void *step_args[] = {&counter, &limit, &loop};
    add_kernel((cudaGraph_t)wp.conditional.phGraph_out[0], nullptr, 0, (void *)count_step, dim3(1), dim3(1), step_args);
    // IF on a handle a kernel sets to 1 (then body runs), and one set to 0 (body skipped).
    int *second = counter + 1, *third = counter + 2;
    cudaGraphNode_t last = nullptr;
    CUgraphNode prev = while_node;
    for (unsigned value = 0; value < 2; value++) {
        CUgraphConditionalHandle h_if;
        CHECK_CU(cuGraphConditionalHandleCreate(&h_if, (CUgraph)w, ctx, 0, 0));
        void *set_args[] = {&h_if, &value};
        last = add_kernel(w, (cudaGraphNode_t *)&prev, 1, (void *)set_condition, dim3(1), dim3(1), set_args);
        CUgraphNodeParams ip = conditional_params(h_if, CU_GRAPH_COND_TYPE_IF, ctx);
        CUgraphNode if_node;
        CHECK_CU(cuGraphAddNode(&if_node, (CUgraph)w, (CUgraphNode *)&last, nullptr, 1, &ip));
        void *one_args[] = {value ? &second : &third};
        add_kernel((cudaGraph_t)ip.conditional.phGraph_out[0], nullptr, 0, (void *)add_one, dim3(1), dim3(1), one_args);
        prev = if_node;
    }
    run_conditional_graph(w, s, counter);

    // 3. Getters: instantiation flags, event nodes, a child graph node's graph.
    cudaGraph_t e;
    CHECK(cudaGraphCreate(&e, 0));
    cudaGraph_t child = two_empty_nodes();
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    cudaGraphNode_t rec, wait, child_node;
    CHECK(cudaGraphAddEventRecordNode(&rec, e, nullptr, 0, ev));
    CHECK(cudaGraphAddEventWaitNode(&wait, e, &rec, 1, ev));
    CHECK(cudaGraphAddChildGraphNode(&child_node, e, &wait, 1, child));
    CUevent got = nullptr;
    CHECK_CU(cuGraphEventRecordNodeGetEvent((CUgraphNode)rec, &got));
    printf("record node's event: %s\n", got == (CUevent)ev ? "the one given" : "another");
    CHECK_CU(cuGraphEventWaitNodeGetEvent((CUgraphNode)wait, &got));
    printf("wait node's event: %s\n", got == (CUevent)ev ? "the one given" : "another");
    CUgraph inner = nullptr;
    CHECK_CU(cuGraphChildGraphNodeGetGraph((CUgraphNode)child_node, &inner));
    size_t inner_nodes = 0, inner_edges = 0;
    CHECK_CU(cuGraphGetNodes(inner, nullptr, &inner_nodes));
    CHECK_CU(cuGraphGetEdges(inner, nullptr, nullptr, nullptr, &inner_edges));
    printf("child node's graph: %zu nodes, %zu edge(s)\n", inner_nodes, inner_edges);
    cudaGraphExec_t eexec;
    CHECK(cudaGraphInstantiateWithFlags(&eexec, e, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    cuuint64_t flags = 0;
    CHECK_CU(cuGraphExecGetFlags((CUgraphExec)eexec, &flags));
    printf("instantiation flags read back: %s\n", flags == CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH ? "yes" : "no");
    CHECK(cudaGraphLaunch(eexec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGraphExecDestroy(eexec));
    CHECK(cudaGraphDestroy(e));
    CHECK(cudaGraphDestroy(child));
    CHECK(cudaEventDestroy(ev));
    CHECK_CU(cuDeviceGraphMemTrim(0));

    batch_mem_op_nodes(s);
    programmatic_edge(s);
    capture_with_edge_data(s);

    CHECK(cudaFree(counter));
    CHECK(cudaFree(out));
    CHECK(cudaStreamDestroy(s));
    return test_finish();
}

// Graph memory nodes, conditional nodes, generic node parameters and graph queries through
// Flyt's libcuda.so.1 on the emulated device (no kernels: memsets and copies do the work). The
// emulated device holds a conditional at the value each launch assigns (no kernel sets it).
// Then the node parameter getters (of nodes the app made and of captured ones), kernel node
// attributes on other nodes, the legacy cuGraphInstantiate and user objects; batch memory
// operation nodes; graph edges and capture dependencies with edge data.
#define _DEFAULT_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver_expect.h"

// Launches `graph` once and reads the first byte of `d`.
static unsigned char run_and_read(CUgraph graph, CUdeviceptr d, CUstream s, unsigned long long flags) {
    CUgraphExec exec;
    unsigned char first = 0xee;
    EXPECT(cuGraphInstantiateWithFlags(&exec, graph, flags), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(&first, d, 1), CUDA_SUCCESS);
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    return first;
}

static void host_fn(void *data) { (*(int *)data)++; }

static int destroyed = 0;
static void destroy_fn(void *data) { __atomic_add_fetch(&destroyed, *(int *)data, __ATOMIC_SEQ_CST); }

// Waits up to a second for the destructor count to reach `want`.
static int destroyed_after_wait(int want) {
    for (int i = 0; i < 1000 && __atomic_load_n(&destroyed, __ATOMIC_SEQ_CST) < want; i++) usleep(1000);
    return __atomic_load_n(&destroyed, __ATOMIC_SEQ_CST);
}

static void getters_attributes_and_user_objects(CUcontext ctx, CUstream s, CUdeviceptr out, size_t N) {
    // Nodes the app made read back as it gave them (a zero pitch stays zero, offsets stay offsets).
    CUgraph g;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS fill = byte_memset_params(out, 0x42, 256);
    fill.pitch = 0;
    CUgraphNode set_node, copy_node, host_node;
    EXPECT(cuGraphAddMemsetNode(&set_node, g, NULL, 0, &fill, ctx), CUDA_SUCCESS);
    CUDA_MEMCPY3D copy = device_copy_params(out + 4096, out, 256);
    copy.srcXInBytes = 16;
    EXPECT(cuGraphAddMemcpyNode(&copy_node, g, &set_node, 1, &copy, ctx), CUDA_SUCCESS);
    int host_runs = 0;
    CUDA_HOST_NODE_PARAMS host = {host_fn, &host_runs};
    EXPECT(cuGraphAddHostNode(&host_node, g, &copy_node, 1, &host), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS set_back;
    memset(&set_back, 0xff, sizeof set_back);
    EXPECT(cuGraphMemsetNodeGetParams(set_node, &set_back), CUDA_SUCCESS);
    CHECK("memset node reads back as given", set_back.dst == out && set_back.value == 0x42 && set_back.pitch == 0 && set_back.width == 256 && set_back.elementSize == 1);
    CUDA_MEMCPY3D copy_back;
    EXPECT(cuGraphMemcpyNodeGetParams(copy_node, &copy_back), CUDA_SUCCESS);
    CHECK("copy node reads back as given", copy_back.srcDevice == out && copy_back.srcXInBytes == 16 && copy_back.dstDevice == out + 4096 && copy_back.WidthInBytes == 256 && copy_back.srcMemoryType == CU_MEMORYTYPE_DEVICE);
    CUDA_HOST_NODE_PARAMS host_back = {NULL, NULL};
    EXPECT(cuGraphHostNodeGetParams(host_node, &host_back), CUDA_SUCCESS);
    CHECK("host node reads back as given", host_back.fn == host_fn && host_back.userData == &host_runs);
    EXPECT(cuGraphMemsetNodeGetParams(copy_node, &set_back), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphHostNodeGetParams(set_node, &host_back), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphMemcpyNodeGetParams(copy_node, NULL), CUDA_ERROR_INVALID_VALUE);
    fill.value = 0x43;
    EXPECT(cuGraphMemsetNodeSetParams(set_node, &fill), CUDA_SUCCESS);
    EXPECT(cuGraphMemsetNodeGetParams(set_node, &set_back), CUDA_SUCCESS);
    CHECK("memset node reads back its new value", set_back.value == 0x43);
    CUgraph clone;
    EXPECT(cuGraphClone(&clone, g), CUDA_SUCCESS);
    CUgraphNode cloned_copy = NULL;
    EXPECT(cuGraphNodeFindInClone(&cloned_copy, copy_node, clone), CUDA_SUCCESS);
    EXPECT(cuGraphMemcpyNodeGetParams(cloned_copy, &copy_back), CUDA_SUCCESS);
    CHECK("a clone's copy node reads back as the original", copy_back.srcXInBytes == 16 && copy_back.srcDevice == out);
    EXPECT(cuGraphDestroy(clone), CUDA_SUCCESS);

    // Kernel node attributes name kernel nodes (the emulated device has none); event attributes
    // are refused.
    CUkernelNodeAttrValue attr;
    memset(&attr, 0, sizeof attr);
    EXPECT(cuGraphKernelNodeGetAttribute(set_node, CU_LAUNCH_ATTRIBUTE_PRIORITY, &attr), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphKernelNodeSetAttribute(set_node, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, &attr), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuGraphKernelNodeCopyAttributes(set_node, copy_node), CUDA_ERROR_INVALID_VALUE);

    // The legacy cuGraphInstantiate: no error node, an empty log.
    CUgraphExec exec;
    CUgraphNode error_node = set_node;
    char log[16] = "unwritten";
    // cuda.h names cuGraphInstantiateWithFlags so now: CUDA 11 programs call the export itself.
    typedef CUresult (*legacy_instantiate)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
    legacy_instantiate instantiate = (legacy_instantiate)dlsym(RTLD_DEFAULT, "cuGraphInstantiate");
    CHECK("the legacy cuGraphInstantiate is exported", instantiate != NULL);
    if (instantiate == NULL) return;
    EXPECT(instantiate(&exec, g, &error_node, log, sizeof log), CUDA_SUCCESS);
    CHECK("legacy instantiate: empty log, no error node", log[0] == 0 && error_node == NULL);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK("the host node ran once", host_runs == 1);
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);

    // Captured nodes read back as the server's driver holds them, the host function as the app's.
    CUgraph captured;
    EXPECT(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(out, 0x24, 512, s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoDAsync(out + 8192, out, 512, s), CUDA_SUCCESS);
    EXPECT(cuLaunchHostFunc(s, host_fn, &host_runs), CUDA_SUCCESS);
    EXPECT(cuStreamEndCapture(s, &captured), CUDA_SUCCESS);
    CUgraphNode nodes[8];
    size_t count = 8;
    EXPECT(cuGraphGetNodes(captured, nodes, &count), CUDA_SUCCESS);
    int seen = 0;
    for (size_t i = 0; i < count; i++) {
        CUgraphNodeType type;
        EXPECT(cuGraphNodeGetType(nodes[i], &type), CUDA_SUCCESS);
        if (type == CU_GRAPH_NODE_TYPE_MEMSET) {
            EXPECT(cuGraphMemsetNodeGetParams(nodes[i], &set_back), CUDA_SUCCESS);
            if (set_back.dst == out && set_back.value == 0x24 && set_back.elementSize == 1 && set_back.width * set_back.height == 512) seen |= 1;
        } else if (type == CU_GRAPH_NODE_TYPE_MEMCPY) {
            EXPECT(cuGraphMemcpyNodeGetParams(nodes[i], &copy_back), CUDA_SUCCESS);
            if (copy_back.srcDevice + copy_back.srcXInBytes == out && copy_back.dstDevice + copy_back.dstXInBytes == out + 8192 && copy_back.WidthInBytes == 512) seen |= 2;
        } else if (type == CU_GRAPH_NODE_TYPE_HOST) {
            EXPECT(cuGraphHostNodeGetParams(nodes[i], &host_back), CUDA_SUCCESS);
            if (host_back.fn == host_fn && host_back.userData == &host_runs) seen |= 4;
        }
    }
    CHECK("captured memset, copy and host nodes read back", count == 3 && seen == 7);
    EXPECT(cuGraphDestroy(captured), CUDA_SUCCESS);

    // User objects: the destructor runs once, after the app, the graph, the executable graph and
    // its launch let go.
    int weight = 1;
    CUuserObject object;
    EXPECT(cuUserObjectCreate(&object, &weight, destroy_fn, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuUserObjectCreate(&object, &weight, destroy_fn, 0, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuUserObjectCreate(&object, &weight, destroy_fn, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC), CUDA_SUCCESS);
    CUgraph holder;
    EXPECT(cuGraphCreate(&holder, 0), CUDA_SUCCESS);
    CUgraphNode holder_set;
    CUDA_MEMSET_NODE_PARAMS fill3 = byte_memset_params(out, 0x31, 256);
    EXPECT(cuGraphAddMemsetNode(&holder_set, holder, NULL, 0, &fill3, ctx), CUDA_SUCCESS);
    EXPECT(cuGraphRetainUserObject(holder, object, 1, CU_GRAPH_USER_OBJECT_MOVE), CUDA_SUCCESS);
    EXPECT(cuGraphReleaseUserObject(holder, object, 2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuUserObjectRetain(object, 2), CUDA_SUCCESS);
    EXPECT(cuUserObjectRelease(object, 2), CUDA_SUCCESS);
    EXPECT(cuGraphInstantiateWithFlags(&exec, holder, 0), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(holder), CUDA_SUCCESS);
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    int after = destroyed_after_wait(1);
    usleep(20000);
    CHECK("user object destroyed once, after its graph, executable graph and launch", after == 1 && __atomic_load_n(&destroyed, __ATOMIC_SEQ_CST) == 1);
    EXPECT(cuUserObjectRelease(object, 1), CUDA_ERROR_INVALID_VALUE);
    // A graph's reference released by the app: the destructor runs then.
    EXPECT(cuUserObjectCreate(&object, &weight, destroy_fn, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC), CUDA_SUCCESS);
    EXPECT(cuGraphCreate(&holder, 0), CUDA_SUCCESS);
    EXPECT(cuGraphRetainUserObject(holder, object, 1, 0), CUDA_SUCCESS);
    EXPECT(cuUserObjectRelease(object, 1), CUDA_SUCCESS);
    EXPECT(cuGraphReleaseUserObject(holder, object, 1), CUDA_SUCCESS);
    CHECK("released by its graph, destroyed", destroyed_after_wait(2) == 2);
    EXPECT(cuGraphDestroy(holder), CUDA_SUCCESS);
}

static CUstreamBatchMemOpParams write_op(CUdeviceptr address, unsigned long long value, int wide) {
    CUstreamBatchMemOpParams op;
    memset(&op, 0, sizeof op);
    op.operation = wide ? CU_STREAM_MEM_OP_WRITE_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = address;
    if (wide)
        op.writeValue.value64 = value;
    else
        op.writeValue.value = (cuuint32_t)value;
    return op;
}

// Batch memory operation nodes: made, read back, changed in the graph and in an executable
// graph, through the generic entry points too, and captured from cuStreamBatchMemOp; the
// emulated device runs their writes and checks their waits at launch.
static void batch_mem_op_nodes(CUcontext ctx, CUstream s) {
    CUdeviceptr words;
    EXPECT(cuMemAlloc(&words, 64), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(words, 0, 64), CUDA_SUCCESS);
    CUgraph g;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUstreamBatchMemOpParams ops[3];
    ops[0] = write_op(words, 0x11223344u, 0);
    ops[1] = write_op(words + 8, 0x0102030405060708ull, 1);
    memset(&ops[2], 0, sizeof ops[2]);
    ops[2].operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[2].waitValue.address = words;
    ops[2].waitValue.value = 0x11223344u;
    ops[2].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    CUDA_BATCH_MEM_OP_NODE_PARAMS params;
    memset(&params, 0, sizeof params);
    params.ctx = ctx;
    params.count = 3;
    params.paramArray = ops;
    CUgraphNode node;
    EXPECT(cuGraphAddBatchMemOpNode(&node, g, NULL, 0, &params), CUDA_SUCCESS);
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    EXPECT(cuGraphNodeGetType(node, &type), CUDA_SUCCESS);
    CHECK("batch memory operation node type", type == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
    CUDA_BATCH_MEM_OP_NODE_PARAMS back;
    memset(&back, 0, sizeof back);
    EXPECT(cuGraphBatchMemOpNodeGetParams(node, &back), CUDA_SUCCESS);
    CHECK("batch node reads back as given",
          back.count == 3 && back.paramArray != NULL && back.flags == 0 &&
              back.paramArray[0].writeValue.address == words && back.paramArray[0].writeValue.value == 0x11223344u &&
              back.paramArray[1].writeValue.value64 == 0x0102030405060708ull &&
              back.paramArray[2].operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 &&
              back.paramArray[2].waitValue.flags == CU_STREAM_WAIT_VALUE_EQ);

    CUgraphExec exec;
    EXPECT(cuGraphInstantiate(&exec, g, 0), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    unsigned int low = 0;
    unsigned long long wide = 0;
    EXPECT(cuMemcpyDtoH(&low, words, 4), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(&wide, words + 8, 8), CUDA_SUCCESS);
    CHECK("batch node wrote both words", low == 0x11223344u && wide == 0x0102030405060708ull);

    // A new value in the executable graph only; then in the graph (read back from there).
    ops[0] = write_op(words, 0x55u, 0);
    ops[2].waitValue.value = 0x55u;
    EXPECT(cuGraphExecBatchMemOpNodeSetParams(exec, node, &params), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(&low, words, 4), CUDA_SUCCESS);
    EXPECT(cuGraphBatchMemOpNodeGetParams(node, &back), CUDA_SUCCESS);
    CHECK("executable graph's batch node changed, graph's kept", low == 0x55u && back.paramArray[0].writeValue.value == 0x11223344u);
    ops[0] = write_op(words, 0x66u, 0);
    ops[2].waitValue.value = 0x66u;
    EXPECT(cuGraphBatchMemOpNodeSetParams(node, &params), CUDA_SUCCESS);
    EXPECT(cuGraphBatchMemOpNodeGetParams(node, &back), CUDA_SUCCESS);
    CHECK("graph's batch node changed", back.count == 3 && back.paramArray[0].writeValue.value == 0x66u);

    // Refused as the driver refuses them: flags, an empty batch, memory that is not the
    // session's; NOT_SUPPORTED (with its line) for a flush of remote writes.
    params.flags = 1;
    EXPECT(cuGraphBatchMemOpNodeSetParams(node, &params), CUDA_ERROR_INVALID_VALUE);
    params.flags = 0;
    params.count = 0;
    EXPECT(cuGraphAddBatchMemOpNode(&node, g, NULL, 0, &params), CUDA_ERROR_INVALID_VALUE);
    params.count = 1;
    CUstreamBatchMemOpParams stray = write_op((CUdeviceptr)0x1000, 1, 0);
    params.paramArray = &stray;
    EXPECT(cuGraphAddBatchMemOpNode(&node, g, NULL, 0, &params), CUDA_ERROR_INVALID_VALUE);
    memset(&stray, 0, sizeof stray);
    stray.operation = CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES;
    EXPECT(cuGraphAddBatchMemOpNode(&node, g, NULL, 0, &params), CUDA_ERROR_NOT_SUPPORTED);

    // The generic entry point makes the same node.
    CUstreamBatchMemOpParams one = write_op(words + 16, 0x77u, 0);
    CUgraphNodeParams generic;
    memset(&generic, 0, sizeof generic);
    generic.type = CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
    generic.memOp.ctx = ctx;
    generic.memOp.count = 1;
    generic.memOp.paramArray = &one;
    CUgraphNode generic_node;
    EXPECT(cuGraphAddNode(&generic_node, g, NULL, NULL, 0, &generic), CUDA_SUCCESS);
    EXPECT(cuGraphBatchMemOpNodeGetParams(generic_node, &back), CUDA_SUCCESS);
    CHECK("generic batch node reads back", back.count == 1 && back.paramArray[0].writeValue.address == words + 16);
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT(cuGraphInstantiate(&exec, g, 0), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    unsigned int third = 0;
    EXPECT(cuMemcpyDtoH(&low, words, 4), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(&third, words + 16, 4), CUDA_SUCCESS);
    CHECK("both batch nodes ran", low == 0x66u && third == 0x77u);
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);

    // Captured from cuStreamBatchMemOp: a node the getter reads back from the server.
    CUgraph captured;
    CUstreamBatchMemOpParams later = write_op(words + 24, 0x99u, 0);
    EXPECT(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    EXPECT(cuStreamBatchMemOp(s, 1, &later, 0), CUDA_SUCCESS);
    EXPECT(cuStreamEndCapture(s, &captured), CUDA_SUCCESS);
    CUgraphNode nodes[4];
    size_t count = 4;
    EXPECT(cuGraphGetNodes(captured, nodes, &count), CUDA_SUCCESS);
    type = CU_GRAPH_NODE_TYPE_EMPTY;
    if (count == 1) EXPECT(cuGraphNodeGetType(nodes[0], &type), CUDA_SUCCESS);
    memset(&back, 0, sizeof back);
    if (type == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) EXPECT(cuGraphBatchMemOpNodeGetParams(nodes[0], &back), CUDA_SUCCESS);
    unsigned int before = 1;
    EXPECT(cuMemcpyDtoH(&before, words + 24, 4), CUDA_SUCCESS);
    EXPECT(cuGraphInstantiate(&exec, captured, 0), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    unsigned int after = 0;
    EXPECT(cuMemcpyDtoH(&after, words + 24, 4), CUDA_SUCCESS);
    CHECK("captured batch node reads back and runs at launch only",
          count == 1 && back.count == 1 && back.paramArray != NULL && back.paramArray[0].writeValue.value == 0x99u && before == 0 &&
              after == 0x99u);
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(captured), CUDA_SUCCESS);
    EXPECT(cuMemFree(words), CUDA_SUCCESS);
}

// Generic parameters (cuGraphAddNode) of a memset node setting `fill`, in context `ctx`.
static CUgraphNodeParams memset_node(CUDA_MEMSET_NODE_PARAMS fill, CUcontext ctx) {
    CUgraphNodeParams params;
    memset(&params, 0, sizeof params);
    params.type = CU_GRAPH_NODE_TYPE_MEMSET;
    params.memset.dst = fill.dst;
    params.memset.pitch = fill.pitch;
    params.memset.value = fill.value;
    params.memset.elementSize = fill.elementSize;
    params.memset.width = fill.width;
    params.memset.height = fill.height;
    params.memset.ctx = ctx;
    return params;
}

// A plain edge's data (all zero) and a programmatic edge's, which only kernel nodes take.
static void edge_kinds(CUgraphEdgeData *plain, CUgraphEdgeData *programmatic) {
    memset(plain, 0, sizeof *plain);
    memset(programmatic, 0, sizeof *programmatic);
    programmatic->from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
    programmatic->type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
}

// Edge data reaches the server's device: default data is a plain edge; a programmatic edge is
// one only kernel nodes take, and the emulated device has none, so it refuses it, and a node
// added with such a dependency is taken back out.
static void edge_data(CUcontext ctx, CUdeviceptr out) {
    CUgraph g;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS fill = byte_memset_params(out, 1, 64);
    CUgraphNode a, b;
    EXPECT(cuGraphAddMemsetNode(&a, g, NULL, 0, &fill, ctx), CUDA_SUCCESS);
    EXPECT(cuGraphAddMemsetNode(&b, g, NULL, 0, &fill, ctx), CUDA_SUCCESS);
    CUgraphEdgeData plain, programmatic;
    edge_kinds(&plain, &programmatic);
    CUresult refused = cuGraphAddDependencies(g, &a, &b, &programmatic, 1);
    EXPECT(cuGraphAddDependencies(g, &a, &b, &plain, 1), CUDA_SUCCESS);
    size_t edges = 0;
    EXPECT(cuGraphGetEdges(g, NULL, NULL, NULL, &edges), CUDA_SUCCESS);
    CUgraphNodeParams params = memset_node(fill, ctx);
    CUgraphNode c = NULL;
    CUresult refused_node = cuGraphAddNode(&c, g, &a, &programmatic, 1, &params);
    size_t nodes = 0;
    EXPECT(cuGraphGetNodes(g, NULL, &nodes), CUDA_SUCCESS);
    CHECK("edge data reaches the device: programmatic refused, plain made, no node left behind",
          refused == CUDA_ERROR_NOT_SUPPORTED && edges == 1 && refused_node == CUDA_ERROR_NOT_SUPPORTED && nodes == 2);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
}

// Capture into a graph of the app's with edge data. Default data is no data: the captured work
// follows the node as with NULL, and the capture's dependencies read back without edge data. A
// programmatic dependency reaches the server's device, which has no kernel nodes and refuses it
// when the capture begins (none begins) and when its dependencies are updated (it goes on).
static void capture_edge_data(CUcontext ctx, CUstream s, CUdeviceptr out) {
    CUgraph g;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS fill = byte_memset_params(out, 3, 64);
    CUgraphNode first;
    EXPECT(cuGraphAddMemsetNode(&first, g, NULL, 0, &fill, ctx), CUDA_SUCCESS);
    CUgraphEdgeData plain, programmatic;
    edge_kinds(&plain, &programmatic);

    CUresult refused_begin = cuStreamBeginCaptureToGraph(s, g, &first, &programmatic, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    EXPECT(cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
    int not_begun = status == CU_STREAM_CAPTURE_STATUS_NONE;

    EXPECT(cuStreamBeginCaptureToGraph(s, g, &first, &plain, 1, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    const CUgraphNode *deps = NULL;
    const CUgraphEdgeData *data = &plain;
    size_t count = 0;
    EXPECT(cuStreamGetCaptureInfo(s, &status, NULL, NULL, &deps, &data, &count), CUDA_SUCCESS);
    int plain_info = status == CU_STREAM_CAPTURE_STATUS_ACTIVE && count == 1 && deps != NULL && deps[0] == first && data == NULL;
    EXPECT(cuStreamGetCaptureInfo(s, &status, NULL, NULL, NULL, &data, &count), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemsetD8Async(out, 4, 64, s), CUDA_SUCCESS);
    CUresult refused_update = cuStreamUpdateCaptureDependencies(s, &first, &programmatic, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
    EXPECT(cuStreamUpdateCaptureDependencies(s, &first, &plain, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES), CUDA_SUCCESS);
    EXPECT(cuStreamGetCaptureInfo(s, &status, NULL, NULL, &deps, &data, &count), CUDA_SUCCESS);
    int updated = count == 1 && deps[0] == first && data == NULL;
    EXPECT(cuMemsetD8Async(out, 5, 64, s), CUDA_SUCCESS);
    CUgraph ended = NULL;
    EXPECT(cuStreamEndCapture(s, &ended), CUDA_SUCCESS);

    size_t nodes = 0, roots = 0, edges = 2;
    CUgraphNode from[2], to[2];
    CUgraphEdgeData edge_data[2];
    memset(edge_data, 0xff, sizeof edge_data);
    EXPECT(cuGraphGetNodes(g, NULL, &nodes), CUDA_SUCCESS);
    EXPECT(cuGraphGetRootNodes(g, NULL, &roots), CUDA_SUCCESS);
    EXPECT(cuGraphGetEdges(g, from, to, edge_data, &edges), CUDA_SUCCESS);
    int plain_edges = edges == 2 && from[0] == first && from[1] == first && edge_data[0].type == 0 && edge_data[0].from_port == 0 &&
                      edge_data[1].type == 0 && edge_data[1].from_port == 0;
    CHECK("capture edge data: default data is none, programmatic refused by the device",
          refused_begin == CUDA_ERROR_NOT_SUPPORTED && not_begun && plain_info && refused_update == CUDA_ERROR_NOT_SUPPORTED && updated &&
              ended == g && nodes == 3 && roots == 1 && plain_edges);

    // Ended with no out-pointer, as NVIDIA's graphConditionalNodes ends a capture into a body
    // graph: the driver ends it all the same (checked on an H200, 2026-11-28).
    EXPECT(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(out, 6, 64, s), CUDA_SUCCESS);
    EXPECT(cuStreamEndCapture(s, NULL), CUDA_SUCCESS);
    EXPECT(cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
    EXPECT(cuGraphGetNodes(g, NULL, &nodes), CUDA_SUCCESS);
    CHECK("a capture ended with a NULL graph pointer ends, its node recorded", status == CU_STREAM_CAPTURE_STATUS_NONE && nodes == 4);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
}

int main(void) {
    CUcontext ctx = use_primary_context(NULL);
    CUstream s;
    EXPECT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    const size_t N = 1 << 20;
    CUdeviceptr out;
    EXPECT(cuMemAlloc(&out, N), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(out, 0, N), CUDA_SUCCESS);

    // Graph memory: allocate, fill, copy out, free, all in one graph.
    CUgraph g;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUDA_MEM_ALLOC_NODE_PARAMS alloc;
    memset(&alloc, 0, sizeof alloc);
    alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    alloc.poolProps.location.id = 0;
    alloc.bytesize = N;
    CUgraphNode alloc_node, set_node, copy_node, free_node;
    EXPECT(cuGraphAddMemAllocNode(&alloc_node, g, NULL, 0, &alloc), CUDA_SUCCESS);
    CHECK("allocation node gave an address", alloc.dptr != 0);
    CUDA_MEMSET_NODE_PARAMS fill = byte_memset_params(alloc.dptr, 0x5a, N);
    EXPECT(cuGraphAddMemsetNode(&set_node, g, &alloc_node, 1, &fill, ctx), CUDA_SUCCESS);
    CUDA_MEMCPY3D copy = device_copy_params(out, alloc.dptr, N);
    EXPECT(cuGraphAddMemcpyNode(&copy_node, g, &set_node, 1, &copy, ctx), CUDA_SUCCESS);
    EXPECT(cuGraphAddMemFreeNode(&free_node, g, &copy_node, 1, alloc.dptr), CUDA_SUCCESS);
    CUDA_MEM_ALLOC_NODE_PARAMS back;
    EXPECT(cuGraphMemAllocNodeGetParams(alloc_node, &back), CUDA_SUCCESS);
    CHECK("allocation node parameters read back", back.bytesize == N && back.dptr == alloc.dptr && back.poolProps.allocType == CU_MEM_ALLOCATION_TYPE_PINNED);
    CUdeviceptr freed = 0;
    EXPECT(cuGraphMemFreeNodeGetParams(free_node, &freed), CUDA_SUCCESS);
    CHECK("free node names the allocation", freed == alloc.dptr);
    // Queries: dependencies, dependents, edges.
    size_t count = 0;
    EXPECT(cuGraphNodeGetDependencies(copy_node, NULL, NULL, &count), CUDA_SUCCESS);
    CUgraphNode deps[4] = {0};
    size_t room = 4;
    EXPECT(cuGraphNodeGetDependencies(copy_node, deps, NULL, &room), CUDA_SUCCESS);
    CHECK("the copy depends on the memset alone", count == 1 && room == 1 && deps[0] == set_node && deps[1] == NULL);
    room = 4;
    EXPECT(cuGraphNodeGetDependentNodes(alloc_node, deps, NULL, &room), CUDA_SUCCESS);
    CHECK("the memset depends on the allocation", room == 1 && deps[0] == set_node);
    CUgraphNode from[4], to[4];
    CUgraphEdgeData data[4];
    size_t edges = 4;
    EXPECT(cuGraphGetEdges_v2(g, from, to, data, &edges), CUDA_SUCCESS);
    int chain = edges == 3;
    for (size_t i = 0; i < edges; i++) chain &= data[i].from_port == 0 && data[i].type == 0;
    CHECK("three default edges", chain);
    EXPECT(cuGraphGetEdges(g, NULL, to, NULL, &edges), CUDA_ERROR_INVALID_VALUE);
    // Graph memory is device memory the copies may name while the graph lives.
    unsigned char first = run_and_read(g, out, s, 0);
    CHECK("graph memory filled and copied out", first == 0x5a);
    unsigned long long used = 0;
    EXPECT(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &used), CUDA_SUCCESS);
    CHECK("graph memory counted", used >= N);
    unsigned long long zero = 0;
    EXPECT(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
    EXPECT(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &zero), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGraphMemTrim(7), CUDA_ERROR_INVALID_DEVICE);
    // Bad allocation parameters: another device, shareable handles, a free of memory no node made.
    CUDA_MEM_ALLOC_NODE_PARAMS bad = alloc;
    bad.poolProps.location.id = 5;
    CUgraphNode unused;
    EXPECT(cuGraphAddMemAllocNode(&unused, g, NULL, 0, &bad), CUDA_ERROR_INVALID_DEVICE);
    bad = alloc;
    bad.bytesize = 0;
    EXPECT(cuGraphAddMemAllocNode(&unused, g, NULL, 0, &bad), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphAddMemFreeNode(&unused, g, NULL, 0, out), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);

    // Graph memory with no free node is freed outside the graph after each launch, with
    // cuMemFree (cudaFree), and the graph runs again; a pointer nobody made is still refused.
    CUgraph kept;
    CUgraphNode kept_alloc, kept_set;
    CUDA_MEM_ALLOC_NODE_PARAMS kept_params = alloc;
    kept_params.dptr = 0;
    EXPECT(cuGraphCreate(&kept, 0), CUDA_SUCCESS);
    EXPECT(cuGraphAddMemAllocNode(&kept_alloc, kept, NULL, 0, &kept_params), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS kept_fill = fill;
    kept_fill.dst = kept_params.dptr;
    EXPECT(cuGraphAddMemsetNode(&kept_set, kept, &kept_alloc, 1, &kept_fill, ctx), CUDA_SUCCESS);
    CUgraphExec kept_exec;
    EXPECT(cuGraphInstantiateWithFlags(&kept_exec, kept, 0), CUDA_SUCCESS);
    int freed_outside = 1;
    for (int round = 0; round < 2; round++) {
        EXPECT(cuGraphLaunch(kept_exec, s), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
        CUresult r = cuMemFree(kept_params.dptr);
        if (r != CUDA_SUCCESS) {
            printf("FAIL: cuMemFree of graph memory after launch %d: %s\n", round, name_of(r));
            freed_outside = 0;
        }
    }
    CHECK("graph memory freed with cuMemFree after each launch", freed_outside);
    EXPECT(cuMemFree(kept_params.dptr + 4096), CUDA_ERROR_INVALID_VALUE);
    // And in stream order (cuMemFreeAsync), as NVIDIA's graphMemoryNodes does after a launch.
    int freed_async = 1;
    for (int round = 0; round < 2; round++) {
        EXPECT(cuGraphLaunch(kept_exec, s), CUDA_SUCCESS);
        CUresult r = cuMemFreeAsync(kept_params.dptr, s);
        if (r != CUDA_SUCCESS) {
            printf("FAIL: cuMemFreeAsync of graph memory after launch %d: %s\n", round, name_of(r));
            freed_async = 0;
        }
        EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    }
    CHECK("graph memory freed with cuMemFreeAsync after each launch", freed_async);
    EXPECT(cuMemFreeAsync(kept_params.dptr + 4096, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphExecDestroy(kept_exec), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(kept), CUDA_SUCCESS);

    // Conditional IF nodes through cuGraphAddNode: the body runs when the handle's value is set.
    for (unsigned value = 0; value < 2; value++) {
        CUgraph cg;
        EXPECT(cuGraphCreate(&cg, 0), CUDA_SUCCESS);
        CUgraphConditionalHandle handle = 0;
        EXPECT(cuGraphConditionalHandleCreate(&handle, cg, ctx, value, CU_GRAPH_COND_ASSIGN_DEFAULT), CUDA_SUCCESS);
        CUgraphNodeParams params;
        memset(&params, 0, sizeof params);
        params.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
        params.conditional.handle = handle;
        params.conditional.type = CU_GRAPH_COND_TYPE_IF;
        params.conditional.size = 1;
        params.conditional.ctx = ctx;
        CUgraphNode cond;
        EXPECT(cuGraphAddNode(&cond, cg, NULL, NULL, 0, &params), CUDA_SUCCESS);
        CHECK("conditional node has a body graph", params.conditional.phGraph_out != NULL && params.conditional.phGraph_out[0] != NULL);
        CUgraph body = params.conditional.phGraph_out[0];
        CUgraphNodeParams set = memset_node(byte_memset_params(out, 0x11 + value, N), ctx);
        CUgraphNode in_body;
        EXPECT(cuGraphAddNode(&in_body, body, NULL, NULL, 0, &set), CUDA_SUCCESS);
        EXPECT(cuMemsetD8(out, 0, N), CUDA_SUCCESS);
        first = run_and_read(cg, out, s, 0);
        printf("IF with value %u: body %s\n", value, first == 0x11 + value ? "ran" : first == 0 ? "skipped" : "wrong");
        CHECK("the condition chose", value ? first == 0x12 : first == 0);
        EXPECT(cuGraphDestroy(cg), CUDA_SUCCESS);
    }

    // Disabled nodes, instantiation flags, event and child graph getters.
    CUgraph eg, child;
    EXPECT(cuGraphCreate(&eg, 0), CUDA_SUCCESS);
    EXPECT(cuGraphCreate(&child, 0), CUDA_SUCCESS);
    CUgraphNode empty_in_child, set2, record, wait, child_node;
    EXPECT(cuGraphAddEmptyNode(&empty_in_child, child, NULL, 0), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS fill2 = byte_memset_params(out, 0x77, N);
    EXPECT(cuGraphAddMemsetNode(&set2, eg, NULL, 0, &fill2, ctx), CUDA_SUCCESS);
    CUevent ev;
    EXPECT(cuEventCreate(&ev, CU_EVENT_DEFAULT), CUDA_SUCCESS);
    EXPECT(cuGraphAddEventRecordNode(&record, eg, &set2, 1, ev), CUDA_SUCCESS);
    EXPECT(cuGraphAddEventWaitNode(&wait, eg, &record, 1, ev), CUDA_SUCCESS);
    EXPECT(cuGraphAddChildGraphNode(&child_node, eg, &wait, 1, child), CUDA_SUCCESS);
    CUevent got_event = NULL;
    EXPECT(cuGraphEventRecordNodeGetEvent(record, &got_event), CUDA_SUCCESS);
    CHECK("record node names the event", got_event == ev);
    EXPECT(cuGraphEventWaitNodeGetEvent(wait, &got_event), CUDA_SUCCESS);
    CHECK("wait node names the event", got_event == ev);
    EXPECT(cuGraphEventWaitNodeGetEvent(record, &got_event), CUDA_ERROR_INVALID_VALUE);
    CUgraph inner = NULL;
    EXPECT(cuGraphChildGraphNodeGetGraph(child_node, &inner), CUDA_SUCCESS);
    size_t inner_nodes = 0;
    EXPECT(cuGraphGetNodes(inner, NULL, &inner_nodes), CUDA_SUCCESS);
    CHECK("the child node's graph has its one node", inner != NULL && inner_nodes == 1);
    CUgraphExec exec;
    EXPECT(cuGraphInstantiateWithFlags(&exec, eg, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH), CUDA_SUCCESS);
    cuuint64_t flags = 0;
    EXPECT(cuGraphExecGetFlags(exec, &flags), CUDA_SUCCESS);
    CHECK("instantiation flags read back", flags == CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    unsigned enabled = 9;
    EXPECT(cuGraphNodeGetEnabled(exec, set2, &enabled), CUDA_SUCCESS);
    CHECK("nodes start enabled", enabled == 1);
    EXPECT(cuGraphNodeSetEnabled(exec, set2, 0), CUDA_SUCCESS);
    EXPECT(cuGraphNodeGetEnabled(exec, set2, &enabled), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(out, 0, N), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(&first, out, 1), CUDA_SUCCESS);
    CHECK("a disabled memset does not run", enabled == 0 && first == 0);
    EXPECT(cuGraphNodeSetEnabled(exec, set2, 1), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(&first, out, 1), CUDA_SUCCESS);
    CHECK("enabled again, it runs", first == 0x77);
    EXPECT(cuGraphNodeSetEnabled(exec, record, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(eg), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(child), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(ev), CUDA_SUCCESS);

    getters_attributes_and_user_objects(ctx, s, out, N);
    batch_mem_op_nodes(ctx, s);
    edge_data(ctx, out);
    capture_edge_data(ctx, s, out);

    EXPECT(cuMemFree(out), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(s), CUDA_SUCCESS);
    return finish();
}

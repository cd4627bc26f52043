// Graph memory nodes, conditional nodes, generic node parameters and graph queries through
// Flyt's libcuda.so.1 on the emulated device (no kernels: memsets and copies do the work). The
// emulated device holds a conditional at the value each launch assigns (no kernel sets it).
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

#define CHECK(what, condition)                                      \
    do {                                                            \
        int ok_ = (condition);                                      \
        printf("%s: %s\n", what, ok_ ? "yes" : "no");               \
        if (!ok_) failures++;                                       \
    } while (0)

static CUDA_MEMSET_NODE_PARAMS memset_of(CUdeviceptr dst, unsigned value, size_t n) {
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

static CUDA_MEMCPY3D copy_of(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dst;
    c.WidthInBytes = n;
    c.Height = 1;
    c.Depth = 1;
    return c;
}

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

int main(void) {
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
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
    CUDA_MEMSET_NODE_PARAMS fill = memset_of(alloc.dptr, 0x5a, N);
    EXPECT(cuGraphAddMemsetNode(&set_node, g, &alloc_node, 1, &fill, ctx), CUDA_SUCCESS);
    CUDA_MEMCPY3D copy = copy_of(out, alloc.dptr, N);
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
        CUgraphNodeParams set;
        memset(&set, 0, sizeof set);
        set.type = CU_GRAPH_NODE_TYPE_MEMSET;
        set.memset.dst = out;
        set.memset.value = 0x11 + value;
        set.memset.elementSize = 1;
        set.memset.width = N;
        set.memset.height = 1;
        set.memset.pitch = N;
        set.memset.ctx = ctx;
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
    CUDA_MEMSET_NODE_PARAMS fill2 = memset_of(out, 0x77, N);
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

    EXPECT(cuMemFree(out), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(s), CUDA_SUCCESS);
    printf("PASSED: %d failure(s)\n", failures);
    return failures != 0;
}

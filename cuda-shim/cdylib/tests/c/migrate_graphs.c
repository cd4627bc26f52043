// migrate_graphs: a program whose session holds graphs and executable graphs while it is moved.
// Graph A (built by the API): a memset the app changes in its executable graph every other
// round, a copy after it, a memset the app changes in the graph after instantiating it (the
// executable graph keeps the old value), a memset it turns off in the executable graph, a host
// node, an event record node, a child graph node and an empty node. Graph B is captured (memset,
// copy, host function) and destroyed once instantiated. Graph F's executable graph is updated
// from F after a change. Every round launches the three executable graphs and checks every
// buffer, the host-function count and the event. At the end it reads the graphs' nodes back by
// the ids it was given (the child graph's node too), instantiates A again (which now has the
// changed value and no node off) and destroys everything. Prints "pointers: ..." at the start and
// at the end, then "PASSED: 0 failure(s)". Arguments: rounds, milliseconds between rounds.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver_expect.h"

#define N 4096

static int host_runs = 0;
static void count_run(void *data) { __atomic_add_fetch((int *)data, 1, __ATOMIC_SEQ_CST); }

// Checks that all N bytes at `d` are `value`.
static void expect_bytes(const char *what, int round, CUdeviceptr d, unsigned char value) {
    static unsigned char back[N];
    EXPECT(cuMemcpyDtoH(back, d, N), CUDA_SUCCESS);
    for (int i = 0; i < N; i++) {
        if (back[i] != value) {
            printf("FAIL round %d %s: byte %d is %u, expected %u\n", round, what, i, back[i], value);
            failures++;
            return;
        }
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 10;
    CUcontext ctx = use_primary_context(NULL);
    CUstream s;
    EXPECT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUevent done;
    EXPECT(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    // X, Y, V, W, Z: graph A's; C: the captured graph's; U: graph F's.
    CUdeviceptr x, y, v, w, z, c, u;
    CUdeviceptr *all[] = {&x, &y, &v, &w, &z, &c, &u};
    for (int b = 0; b < 7; b++) {
        EXPECT(cuMemAlloc(all[b], N), CUDA_SUCCESS);
        EXPECT(cuMemsetD8(*all[b], 0, N), CUDA_SUCCESS);
    }

    // Graph A.
    CUgraph a, kid;
    CUgraphNode m1, c1, m2, off, host, record, child, empty, kid_set;
    EXPECT(cuGraphCreate(&a, 0), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS p = byte_memset_params(x, 0x44, N);
    EXPECT(cuGraphAddMemsetNode(&m1, a, NULL, 0, &p, ctx), CUDA_SUCCESS);
    CUDA_MEMCPY3D copy = device_copy_params(y, x, N);
    EXPECT(cuGraphAddMemcpyNode(&c1, a, &m1, 1, &copy, ctx), CUDA_SUCCESS);
    p = byte_memset_params(v, 5, N);
    EXPECT(cuGraphAddMemsetNode(&m2, a, NULL, 0, &p, ctx), CUDA_SUCCESS);
    p = byte_memset_params(w, 0xdd, N);
    EXPECT(cuGraphAddMemsetNode(&off, a, NULL, 0, &p, ctx), CUDA_SUCCESS);
    CUDA_HOST_NODE_PARAMS hp = {count_run, &host_runs};
    EXPECT(cuGraphAddHostNode(&host, a, &c1, 1, &hp), CUDA_SUCCESS);
    EXPECT(cuGraphAddEventRecordNode(&record, a, &host, 1, done), CUDA_SUCCESS);
    EXPECT(cuGraphCreate(&kid, 0), CUDA_SUCCESS);
    p = byte_memset_params(z, 0x33, N);
    EXPECT(cuGraphAddMemsetNode(&kid_set, kid, NULL, 0, &p, ctx), CUDA_SUCCESS);
    EXPECT(cuGraphAddChildGraphNode(&child, a, NULL, 0, kid), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(kid), CUDA_SUCCESS);
    CUgraphNode before_empty[2] = {child, c1};
    EXPECT(cuGraphAddEmptyNode(&empty, a, before_empty, 2), CUDA_SUCCESS);
    CUgraphExec ea;
    EXPECT(cuGraphInstantiateWithFlags(&ea, a, 0), CUDA_SUCCESS);
    EXPECT(cuGraphNodeSetEnabled(ea, off, 0), CUDA_SUCCESS);
    p = byte_memset_params(v, 9, N);
    EXPECT(cuGraphMemsetNodeSetParams(m2, &p), CUDA_SUCCESS);
    // The child node's own graph and its node, by the handles the app is given.
    CUgraph inner;
    CUgraphNode inner_nodes[4];
    size_t inner_count = 4;
    EXPECT(cuGraphChildGraphNodeGetGraph(child, &inner), CUDA_SUCCESS);
    EXPECT(cuGraphGetNodes(inner, inner_nodes, &inner_count), CUDA_SUCCESS);
    FAIL_WHEN(inner_count != 1, "FAIL: the child graph has %zu nodes\n", inner_count);

    // Graph B, captured, its graph destroyed once instantiated.
    CUgraph b;
    CUgraphExec eb;
    EXPECT(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(c, 0x11, N / 2, s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoDAsync(c + N / 2, c, N / 2, s), CUDA_SUCCESS);
    EXPECT(cuLaunchHostFunc(s, count_run, &host_runs), CUDA_SUCCESS);
    EXPECT(cuStreamEndCapture(s, &b), CUDA_SUCCESS);
    EXPECT(cuGraphInstantiateWithFlags(&eb, b, 0), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(b), CUDA_SUCCESS);

    // Graph F, its executable graph updated after a change.
    CUgraph f;
    CUgraphNode f_set;
    CUgraphExec ef;
    EXPECT(cuGraphCreate(&f, 0), CUDA_SUCCESS);
    p = byte_memset_params(u, 1, N);
    EXPECT(cuGraphAddMemsetNode(&f_set, f, NULL, 0, &p, ctx), CUDA_SUCCESS);
    EXPECT(cuGraphInstantiateWithFlags(&ef, f, 0), CUDA_SUCCESS);
    p = byte_memset_params(u, 2, N);
    EXPECT(cuGraphMemsetNodeSetParams(f_set, &p), CUDA_SUCCESS);
    CUgraphExecUpdateResultInfo info;
    EXPECT(cuGraphExecUpdate(ef, f, &info), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(f), CUDA_SUCCESS);
    printf("pointers: %llx %llx %llx %llx %llx %llx %llx\n", (unsigned long long)x, (unsigned long long)y, (unsigned long long)v,
           (unsigned long long)w, (unsigned long long)z, (unsigned long long)c, (unsigned long long)u);
    fflush(stdout);

    struct timespec nap = {0, (long)pause_ms * 1000000L};
    unsigned char x_value = 0x44;
    for (int round = 1; round <= rounds && failures == 0; round++) {
        // Every other round: the executable graph's memset changes (a move in between must
        // keep the change).
        if (round % 2 == 0) {
            x_value = (unsigned char)round;
            p = byte_memset_params(x, x_value, N);
            EXPECT(cuGraphExecMemsetNodeSetParams(ea, m1, &p, ctx), CUDA_SUCCESS);
        }
        EXPECT(cuGraphLaunch(ea, s), CUDA_SUCCESS);
        EXPECT(cuGraphLaunch(eb, s), CUDA_SUCCESS);
        EXPECT(cuGraphLaunch(ef, s), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
        expect_bytes("x (set in the executable graph)", round, x, x_value);
        expect_bytes("y (copied from x)", round, y, x_value);
        expect_bytes("v (changed in the graph only)", round, v, 5);
        expect_bytes("w (its node off)", round, w, 0);
        expect_bytes("z (child graph)", round, z, 0x33);
        expect_bytes("c (captured)", round, c, 0x11);
        expect_bytes("u (updated)", round, u, 2);
        FAIL_WHEN(__atomic_load_n(&host_runs, __ATOMIC_SEQ_CST) != 2 * round,
                  "FAIL round %d: host functions ran %d times\n", round, host_runs);
        EXPECT(cuEventQuery(done), CUDA_SUCCESS);
        nanosleep(&nap, NULL);
    }

    // The graphs as the app knows them, by its handles.
    unsigned enabled = 1;
    EXPECT(cuGraphNodeGetEnabled(ea, off, &enabled), CUDA_SUCCESS);
    FAIL_WHEN(enabled != 0, "FAIL: the node turned off is on\n");
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    EXPECT(cuGraphNodeGetType(inner_nodes[0], &type), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS read;
    memset(&read, 0, sizeof read);
    EXPECT(cuGraphMemsetNodeGetParams(inner_nodes[0], &read), CUDA_SUCCESS);
    FAIL_WHEN(type != CU_GRAPH_NODE_TYPE_MEMSET || read.value != 0x33 || read.dst != z,
              "FAIL: the child graph's node reads back as type %d, value %u\n", (int)type, read.value);
    memset(&read, 0, sizeof read);
    EXPECT(cuGraphMemsetNodeGetParams(m2, &read), CUDA_SUCCESS);
    FAIL_WHEN(read.value != 9, "FAIL: the graph's changed memset reads back %u\n", read.value);
    CUgraphNode listed[16];
    size_t count = 16;
    EXPECT(cuGraphGetNodes(a, listed, &count), CUDA_SUCCESS);
    size_t edges = 0;
    EXPECT(cuGraphGetEdges(a, NULL, NULL, NULL, &edges), CUDA_SUCCESS);
    FAIL_WHEN(count != 8 || edges != 5, "FAIL: graph A has %zu nodes and %zu edges, not 8 and 5\n", count, edges);
    CUgraphNode deps[4];
    size_t dep_count = 4;
    EXPECT(cuGraphNodeGetDependencies(empty, deps, NULL, &dep_count), CUDA_SUCCESS);
    FAIL_WHEN(dep_count != 2 || !((deps[0] == child && deps[1] == c1) || (deps[0] == c1 && deps[1] == child)),
              "FAIL: the empty node's dependencies came back wrong (%zu)\n", dep_count);
    // Graph A instantiated again: the changed memset, the graph's own first memset, no node off.
    CUgraphExec again;
    EXPECT(cuGraphInstantiateWithFlags(&again, a, 0), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(again, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    expect_bytes("v (a new executable graph)", rounds + 1, v, 9);
    expect_bytes("w (a new executable graph)", rounds + 1, w, 0xdd);
    expect_bytes("x (a new executable graph)", rounds + 1, x, 0x44);
    printf("pointers: %llx %llx %llx %llx %llx %llx %llx\n", (unsigned long long)x, (unsigned long long)y, (unsigned long long)v,
           (unsigned long long)w, (unsigned long long)z, (unsigned long long)c, (unsigned long long)u);
    EXPECT(cuGraphExecDestroy(again), CUDA_SUCCESS);
    EXPECT(cuGraphExecDestroy(ea), CUDA_SUCCESS);
    EXPECT(cuGraphExecDestroy(eb), CUDA_SUCCESS);
    EXPECT(cuGraphExecDestroy(ef), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(a), CUDA_SUCCESS);
    for (int i = 0; i < 7; i++) EXPECT(cuMemFree(*all[i]), CUDA_SUCCESS);
    EXPECT(cuEventDestroy(done), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(s), CUDA_SUCCESS);
    return finish();
}

// Graphs that copy with the app's ordinary (pageable) host memory, through Flyt's libcuda.so.1
// on the emulated device (no kernels: memsets and copies do the work): a capture of
// host-to-device and device-to-host cuMemcpy*Async around device work records copy nodes that
// read and write the host memory at every launch; explicit copy nodes (1D and pitched 2D, with
// host sides) run in order with the graph's other nodes, read back as the app gave them, and
// take new host buffers in an executable graph; a host node after a device-to-host copy sees its
// bytes.
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <string.h>

#include "driver_expect.h"

static CUDA_MEMCPY3D host_copy(void *host, CUdeviceptr device, size_t n, int to_host) {
    copy_side h = host_side(host, 0, 0), d = device_side(device, 0, 0);
    return to_host ? copy_3d(d, h, n, 1, 1) : copy_3d(h, d, n, 1, 1);
}

static int all_are(const unsigned char *p, size_t n, unsigned char value) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != value) return 0;
    return 1;
}

// What the host node saw: the first byte of the copy's destination when it ran.
static unsigned char seen_by_host_node = 0;
static unsigned char *watched = NULL;
static void host_fn(void *data) {
    (void)data;
    seen_by_host_node = watched[0];
}

// Capture: host -> a, a -> b (device to device), memset of b's second half, b -> host.
static void captured_copies(CUstream s, CUdeviceptr a, CUdeviceptr b, size_t n) {
    unsigned char *in = malloc(n), *out = malloc(n);
    memset(in, 1, n);
    memset(out, 0xee, n);
    CUgraph graph;
    EXPECT(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoDAsync(a, in, n, s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoDAsync(b, a, n, s), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(b + n / 2, 0x77, n / 2, s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoHAsync(out, b, n, s), CUDA_SUCCESS);
    EXPECT(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
    CHECK("the capture left the host destination alone", all_are(out, n, 0xee));

    size_t count = 0;
    EXPECT(cuGraphGetNodes(graph, NULL, &count), CUDA_SUCCESS);
    CUgraphNode nodes[8];
    EXPECT(cuGraphGetNodes(graph, nodes, &count), CUDA_SUCCESS);
    int copies = 0, read_back = 0;
    for (size_t i = 0; i < count && i < 8; i++) {
        CUgraphNodeType type;
        EXPECT(cuGraphNodeGetType(nodes[i], &type), CUDA_SUCCESS);
        if (type != CU_GRAPH_NODE_TYPE_MEMCPY) continue;
        copies++;
        CUDA_MEMCPY3D back;
        EXPECT(cuGraphMemcpyNodeGetParams(nodes[i], &back), CUDA_SUCCESS);
        if (back.dstMemoryType == CU_MEMORYTYPE_HOST && back.dstHost == out && back.srcDevice == b) read_back++;
        if (back.srcMemoryType == CU_MEMORYTYPE_HOST && back.srcHost == in && back.dstDevice == a) read_back++;
    }
    printf("captured nodes: %zu, copies: %d\n", count, copies);
    CHECK("captured host copies read back with their host pointers", read_back == 2);

    CUgraphExec exec;
    EXPECT(cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
    int good = 0;
    for (int launch = 0; launch < 3; launch++) {
        memset(in, 10 + launch, n);
        memset(out, 0xee, n);
        EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
        int ok = all_are(out, n / 2, 10 + launch) && all_are(out + n / 2, n / 2, 0x77);
        printf("launch %d: first half %u, second half %u\n", launch, out[0], out[n - 1]);
        good += ok;
    }
    CHECK("every launch copied the host source of that moment, and back", good == 3);
    RELEASE(GRAPH_EXEC(exec), GRAPH(graph));
    free(in);
    free(out);
}

// A captured pitched copy: a host box (rows wider than the copy) up into a's rows and back down
// into another box with another pitch, each launch copying the box's bytes of that moment.
static void captured_2d(CUstream s, CUdeviceptr a) {
    enum { ROWS = 16, WIDTH = 40, UP_PITCH = 64, DOWN_PITCH = 56, DEVICE_PITCH = 48 };
    unsigned char *up = malloc(ROWS * UP_PITCH), *down = malloc(ROWS * DOWN_PITCH);
    memset(down, 0xee, ROWS * DOWN_PITCH);
    CUDA_MEMCPY2D to_device = copy_2d(host_side(up, UP_PITCH, 0), device_side(a, DEVICE_PITCH, 0), WIDTH, ROWS);
    CUDA_MEMCPY2D to_host = copy_2d(device_side(a, DEVICE_PITCH, 0), host_side(down, DOWN_PITCH, 0), WIDTH, ROWS);
    CUgraph graph;
    EXPECT(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemcpy2DAsync(&to_device, s), CUDA_SUCCESS);
    EXPECT(cuMemcpy2DAsync(&to_host, s), CUDA_SUCCESS);
    EXPECT(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
    CUgraphExec exec;
    EXPECT(cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
    int good = 0;
    for (int launch = 0; launch < 2; launch++) {
        for (int i = 0; i < ROWS * UP_PITCH; i++) up[i] = (unsigned char)(i * 7 + launch);
        EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
        int ok = 1;
        for (int r = 0; r < ROWS; r++) {
            if (memcmp(down + r * DOWN_PITCH, up + r * UP_PITCH, WIDTH) != 0) ok = 0;
            if (!all_are(down + r * DOWN_PITCH + WIDTH, DOWN_PITCH - WIDTH, 0xee)) ok = 0;
        }
        good += ok;
    }
    CHECK("captured pitched copies with host boxes ran at each launch", good == 2);
    RELEASE(GRAPH_EXEC(exec), GRAPH(graph));
    free(up);
    free(down);
}

// Explicit nodes: host -> a (1D), memset of a's first 16 bytes, a -> host (pitched 2D into a
// host box with a wider pitch), then a host node that reads the destination.
static void explicit_nodes(CUcontext ctx, CUstream s, CUdeviceptr a) {
    enum { ROWS = 8, WIDTH = 32, HOST_PITCH = 48 };
    const size_t n = ROWS * WIDTH;
    unsigned char *in = malloc(n), *box = malloc(ROWS * HOST_PITCH), *other = malloc(ROWS * HOST_PITCH);
    memset(box, 0xee, ROWS * HOST_PITCH);
    memset(other, 0xee, ROWS * HOST_PITCH);
    CUgraph graph;
    EXPECT(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
    CUgraphNode up, fill, down, host;
    CUDA_MEMCPY3D up_params = host_copy(in, a, n, 0);
    EXPECT(cuGraphAddMemcpyNode(&up, graph, NULL, 0, &up_params, ctx), CUDA_SUCCESS);
    CUDA_MEMSET_NODE_PARAMS set = byte_memset_params(a, 0x55, 16);
    EXPECT(cuGraphAddMemsetNode(&fill, graph, &up, 1, &set, ctx), CUDA_SUCCESS);
    CUDA_MEMCPY3D down_params = copy_3d(device_side(a, WIDTH, 0), host_side(box, HOST_PITCH, 0), WIDTH, ROWS, 1);
    EXPECT(cuGraphAddMemcpyNode(&down, graph, &fill, 1, &down_params, ctx), CUDA_SUCCESS);
    CUDA_HOST_NODE_PARAMS host_params = {host_fn, NULL};
    EXPECT(cuGraphAddHostNode(&host, graph, &down, 1, &host_params), CUDA_SUCCESS);

    CUgraphNodeType type;
    EXPECT(cuGraphNodeGetType(down, &type), CUDA_SUCCESS);
    CHECK("a copy node with host memory is a copy node", type == CU_GRAPH_NODE_TYPE_MEMCPY);
    CUDA_MEMCPY3D back;
    EXPECT(cuGraphMemcpyNodeGetParams(down, &back), CUDA_SUCCESS);
    CHECK("GetParams returns the host pointer and pitch as given",
          back.dstMemoryType == CU_MEMORYTYPE_HOST && back.dstHost == box && back.dstPitch == HOST_PITCH && back.Height == ROWS);

    CUgraphExec exec;
    EXPECT(cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
    int good = 0;
    for (int launch = 0; launch < 3; launch++) {
        for (size_t i = 0; i < n; i++) in[i] = (unsigned char)(launch * 50 + i % 40);
        watched = box;
        seen_by_host_node = 0;
        EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
        int ok = seen_by_host_node == 0x55;
        for (size_t r = 0; r < ROWS; r++) {
            for (size_t x = 0; x < WIDTH; x++) {
                size_t i = r * WIDTH + x;
                unsigned char want = i < 16 ? 0x55 : in[i];
                if (box[r * HOST_PITCH + x] != want) ok = 0;
            }
            if (!all_are(box + r * HOST_PITCH + WIDTH, HOST_PITCH - WIDTH, 0xee)) ok = 0;
        }
        good += ok;
    }
    CHECK("explicit host copies ran in order at every launch, pitch kept, host node after them", good == 3);

    // The executable graph's copy goes to another host buffer; the graph's node keeps its own.
    CUDA_MEMCPY3D moved = down_params;
    moved.dstHost = other;
    EXPECT(cuGraphExecMemcpyNodeSetParams(exec, down, &moved, ctx), CUDA_SUCCESS);
    memset(box, 0xee, ROWS * HOST_PITCH);
    memset(in, 0x21, n);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK("ExecMemcpyNodeSetParams: the copy lands in the new buffer only",
          other[0] == 0x55 && other[HOST_PITCH * (ROWS - 1) + WIDTH - 1] == 0x21 && box[0] == 0xee && box[HOST_PITCH * (ROWS - 1)] == 0xee);
    EXPECT(cuGraphMemcpyNodeGetParams(down, &back), CUDA_SUCCESS);
    CHECK("the graph's node still names its own buffer", back.dstHost == box);

    // The graph's own node changed: a new instantiation copies to `other` at the graph's pitch.
    memset(other, 0xee, ROWS * HOST_PITCH);
    EXPECT(cuGraphMemcpyNodeSetParams(down, &moved), CUDA_SUCCESS);
    CUgraphExec again;
    EXPECT(cuGraphInstantiate(&again, graph, 0), CUDA_SUCCESS);
    memset(in, 0x31, n);
    EXPECT(cuGraphLaunch(again, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK("MemcpyNodeSetParams: a new instantiation copies to the new buffer",
          other[HOST_PITCH * (ROWS - 1) + WIDTH - 1] == 0x31 && box[0] == 0xee);

    // A direction change is refused (the node's shape is fixed); so is an absurd host copy.
    CUDA_MEMCPY3D turned = host_copy(in, a, n, 0);
    EXPECT(cuGraphMemcpyNodeSetParams(down, &turned), CUDA_ERROR_INVALID_VALUE);
    CUgraphNode huge;
    CUDA_MEMCPY3D too_big = host_copy(in, a, (size_t)1 << 40, 0);
    CUresult refused = cuGraphAddMemcpyNode(&huge, graph, NULL, 0, &too_big, ctx);
    CHECK("a host copy larger than its device memory is refused", refused == CUDA_ERROR_INVALID_VALUE);

    // A clone runs the same copies.
    CUgraph clone;
    EXPECT(cuGraphClone(&clone, graph), CUDA_SUCCESS);
    CUgraphExec cloned;
    EXPECT(cuGraphInstantiate(&cloned, clone, 0), CUDA_SUCCESS);
    memset(in, 0x41, n);
    memset(other, 0xee, ROWS * HOST_PITCH);
    EXPECT(cuGraphLaunch(cloned, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK("a clone copies with host memory too", other[HOST_PITCH * (ROWS - 1) + WIDTH - 1] == 0x41 && other[0] == 0x55);

    RELEASE(GRAPH_EXEC(cloned), GRAPH(clone), GRAPH_EXEC(again), GRAPH_EXEC(exec), GRAPH(graph));
    free(in);
    free(box);
    free(other);
}

// A generic copy node (cuGraphAddNode) with a host source, and cuGraphExecUpdate to a graph of the
// same shape whose copies name other host buffers (the first graph then destroyed: its staging goes
// with the executable graph's own).
static CUgraph in_and_out(CUcontext ctx, CUdeviceptr a, unsigned char *in, unsigned char *out, size_t n) {
    CUgraph graph;
    EXPECT(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
    CUgraphNodeParams generic;
    memset(&generic, 0, sizeof generic);
    generic.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    generic.memcpy.copyCtx = ctx;
    generic.memcpy.copyParams = host_copy(in, a, n, 0);
    CUgraphNode up, down;
    EXPECT(cuGraphAddNode(&up, graph, NULL, NULL, 0, &generic), CUDA_SUCCESS);
    CUDA_MEMCPY3D back = host_copy(out, a, n, 1);
    EXPECT(cuGraphAddMemcpyNode(&down, graph, &up, 1, &back, ctx), CUDA_SUCCESS);
    return graph;
}

static void generic_nodes_and_update(CUcontext ctx, CUstream s, CUdeviceptr a) {
    const size_t n = 4096;
    unsigned char *in1 = malloc(n), *out1 = malloc(n), *in2 = malloc(n), *out2 = malloc(n);
    memset(in1, 0x61, n);
    memset(in2, 0x62, n);
    memset(out1, 0, n);
    memset(out2, 0, n);
    CUgraph first = in_and_out(ctx, a, in1, out1, n), second = in_and_out(ctx, a, in2, out2, n);
    CUgraphExec exec;
    EXPECT(cuGraphInstantiate(&exec, first, 0), CUDA_SUCCESS);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK("a generic copy node from host memory ran", all_are(out1, n, 0x61));
    CUgraphExecUpdateResultInfo info;
    EXPECT(cuGraphExecUpdate(exec, second, &info), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(second), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(first), CUDA_SUCCESS);
    memset(out1, 0, n);
    EXPECT(cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK("cuGraphExecUpdate: the copies name the new graph's host buffers", all_are(out2, n, 0x62) && all_are(out1, n, 0));
    EXPECT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    free(in1);
    free(out1);
    free(in2);
    free(out2);
}

int main(void) {
    CUcontext ctx = use_primary_context(NULL);
    CUstream s;
    EXPECT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    const size_t N = 1 << 16;
    CUdeviceptr a, b;
    EXPECT(cuMemAlloc(&a, N), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&b, N), CUDA_SUCCESS);

    captured_copies(s, a, b, N);
    captured_2d(s, a);
    explicit_nodes(ctx, s, a);
    generic_nodes_and_update(ctx, s, a);

    EXPECT(cuMemFree(a), CUDA_SUCCESS);
    EXPECT(cuMemFree(b), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(s), CUDA_SUCCESS);
    return finish();
}

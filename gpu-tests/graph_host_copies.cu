// graph_host_copies: graphs that copy with ordinary pageable host memory (malloc), as NVIDIA's
// jacobiCudaGraphs and conjugateGradientCudaGraphs samples do: a stream capture of a
// host-to-device cudaMemcpyAsync, a kernel and a device-to-host cudaMemcpyAsync, launched 3 times
// with the host source changed between launches (checksums of the host destination printed each
// time); a graph built node by node with a 1D host-to-device copy node, a kernel, a pitched 2D
// device-to-host copy node into a wider host box and a host node that sums what it finds there;
// cudaGraphMemcpyNodeGetParams returns the host pointers; cudaGraphExecMemcpyNodeSetParams moves
// the executable graph's 1D copy to another host source (and its answer for the pitched one is
// printed: the driver refuses it); a clone runs the same copies.
#include "common.h"

__global__ void scale(const int *in, int *out, int n, int factor) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * factor + i;
}

static const int N = 1 << 16;
static const int ROWS = 64, WIDTH = N / ROWS;  // ints per row
static const size_t HOST_PITCH = WIDTH * sizeof(int) + 96;

static unsigned long long checksum(const int *p, size_t n) {
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i++) sum = sum * 1000003ull + (unsigned)p[i];
    return sum;
}

static bool scaled_right(const int *in, const int *out, int factor) {
    for (int i = 0; i < N; i++)
        if (out[i] != in[i] * factor + i) return false;
    return true;
}

// The pitched host box's rows, packed back.
static void unpack(const unsigned char *box, int *packed) {
    for (int r = 0; r < ROWS; r++) memcpy(packed + r * WIDTH, box + r * HOST_PITCH, WIDTH * sizeof(int));
}

static bool padding_untouched(const unsigned char *box) {
    for (int r = 0; r < ROWS; r++)
        for (size_t x = WIDTH * sizeof(int); x < HOST_PITCH; x++)
            if (box[r * HOST_PITCH + x] != 0xee) return false;
    return true;
}

static unsigned long long host_node_sum = 0;
static const unsigned char *host_node_box = NULL;
static void CUDART_CB sum_box(void *) {
    unsigned long long sum = 0;
    for (int r = 0; r < ROWS; r++) {
        const int *row = (const int *)(host_node_box + r * HOST_PITCH);
        for (int x = 0; x < WIDTH; x++) sum += (unsigned)row[x];
    }
    host_node_sum = sum;
}

static unsigned long long packed_sum(const int *p) {
    unsigned long long sum = 0;
    for (int i = 0; i < N; i++) sum += (unsigned)p[i];
    return sum;
}

int main() {
    test_init("graph_host_copies");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, N * sizeof(int)));
    CHECK(cudaMalloc(&d_out, N * sizeof(int)));
    int *in = (int *)malloc(N * sizeof(int));
    int *out = (int *)malloc(N * sizeof(int));

    // Captured: pageable H2D, kernel, pageable D2H.
    for (int i = 0; i < N; i++) in[i] = i;
    memset(out, 0, N * sizeof(int));
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(d_in, in, N * sizeof(int), cudaMemcpyHostToDevice, s));
    scale<<<N / 256, 256, 0, s>>>(d_in, d_out, N, 3);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(out, d_out, N * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamEndCapture(s, &graph));
    bool untouched = true;
    for (int i = 0; i < N; i++) untouched &= out[i] == 0;
    printf("the capture left the host destination alone: %s\n", untouched ? "yes" : "no");
    size_t count = 0;
    CHECK(cudaGraphGetNodes(graph, NULL, &count));
    cudaGraphNode_t nodes[8];
    CHECK(cudaGraphGetNodes(graph, nodes, &count));
    int copies = 0, host_sides = 0;
    for (size_t i = 0; i < count && i < 8; i++) {
        cudaGraphNodeType type;
        CHECK(cudaGraphNodeGetType(nodes[i], &type));
        if (type != cudaGraphNodeTypeMemcpy) continue;
        copies++;
        cudaMemcpy3DParms back = {};
        CHECK(cudaGraphMemcpyNodeGetParams(nodes[i], &back));
        if (back.dstPtr.ptr == out || back.srcPtr.ptr == in) host_sides++;
    }
    printf("captured graph: %zu nodes, %d copies, %d naming the host buffers\n", count, copies, host_sides);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int launch = 0; launch < 3; launch++) {
        for (int i = 0; i < N; i++) in[i] = i * (launch + 1) + 7;
        memset(out, 0, N * sizeof(int));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        bool right = scaled_right(in, out, 3);
        printf("captured launch %d: right %s, checksum %llx\n", launch, right ? "yes" : "no", checksum(out, N));
        EXPECT(right, "captured launch %d", launch);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // Built node by node: 1D H2D copy node, kernel, pitched D2H copy node, host node.
    unsigned char *box = (unsigned char *)malloc(ROWS * HOST_PITCH);
    unsigned char *other = (unsigned char *)malloc(ROWS * HOST_PITCH);
    int *packed = (int *)malloc(N * sizeof(int));
    memset(box, 0xee, ROWS * HOST_PITCH);
    memset(other, 0xee, ROWS * HOST_PITCH);
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphNode_t up, kernel_node, down, host_node;
    CHECK(cudaGraphAddMemcpyNode1D(&up, graph, NULL, 0, d_in, in, N * sizeof(int), cudaMemcpyHostToDevice));
    int n = N, factor = 5;
    void *args[] = {&d_in, &d_out, &n, &factor};
    cudaKernelNodeParams kernel = {};
    kernel.func = (void *)scale;
    kernel.gridDim = dim3(N / 256);
    kernel.blockDim = dim3(256);
    kernel.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&kernel_node, graph, &up, 1, &kernel));
    cudaMemcpy3DParms down_params = {};
    down_params.srcPtr = make_cudaPitchedPtr(d_out, WIDTH * sizeof(int), WIDTH * sizeof(int), ROWS);
    down_params.dstPtr = make_cudaPitchedPtr(box, HOST_PITCH, WIDTH * sizeof(int), ROWS);
    down_params.extent = make_cudaExtent(WIDTH * sizeof(int), ROWS, 1);
    down_params.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaGraphAddMemcpyNode(&down, graph, &kernel_node, 1, &down_params));
    host_node_box = box;
    cudaHostNodeParams host_params = {sum_box, NULL};
    CHECK(cudaGraphAddHostNode(&host_node, graph, &down, 1, &host_params));
    cudaMemcpy3DParms back = {};
    CHECK(cudaGraphMemcpyNodeGetParams(down, &back));
    printf("the pitched copy node reads back its host box: %s\n",
           back.dstPtr.ptr == box && back.dstPtr.pitch == HOST_PITCH && back.extent.height == (size_t)ROWS ? "yes" : "no");
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int launch = 0; launch < 3; launch++) {
        for (int i = 0; i < N; i++) in[i] = (i % 1000) * (launch + 2);
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        unpack(box, packed);
        bool right = scaled_right(in, packed, 5) && padding_untouched(box);
        bool host_saw = host_node_sum == packed_sum(packed);
        printf("explicit launch %d: right %s, host node saw the copy %s, checksum %llx\n", launch, right ? "yes" : "no",
               host_saw ? "yes" : "no", checksum(packed, N));
        EXPECT(right && host_saw, "explicit launch %d", launch);
    }

    // The executable graph's 1D copy reads another host buffer; the graph keeps its own (the
    // driver updates 1D copies of an executable graph only: it refuses a pitched one natively).
    int *in2 = (int *)malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) in2[i] = N - i;
    cudaMemcpy3DParms up_moved = {};
    up_moved.srcPtr = make_cudaPitchedPtr(in2, N * sizeof(int), N, 1);
    up_moved.dstPtr = make_cudaPitchedPtr(d_in, N * sizeof(int), N, 1);
    up_moved.extent = make_cudaExtent(N * sizeof(int), 1, 1);
    up_moved.kind = cudaMemcpyHostToDevice;
    CHECK(cudaGraphExecMemcpyNodeSetParams(exec, up, &up_moved));
    for (int i = 0; i < N; i++) in[i] = 1;
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    unpack(box, packed);
    bool moved_right = scaled_right(in2, packed, 5) && padding_untouched(box);
    printf("after cudaGraphExecMemcpyNodeSetParams: the new source copied %s, checksum %llx\n", moved_right ? "yes" : "no",
           checksum(packed, N));
    EXPECT(moved_right, "exec memcpy node set params");
    cudaMemcpy3DParms up_back = {};
    CHECK(cudaGraphMemcpyNodeGetParams(up, &up_back));
    printf("the graph's node still names its own source: %s\n", up_back.srcPtr.ptr == in ? "yes" : "no");
    cudaMemcpy3DParms down_moved = down_params;
    down_moved.dstPtr.ptr = other;
    printf("a pitched copy of an executable graph moved to another host box: %s\n",
           cudaGetErrorName(cudaGraphExecMemcpyNodeSetParams(exec, down, &down_moved)));
    cudaGetLastError();
    free(in2);

    // A clone runs the same copies (into the graph's own box).
    cudaGraph_t clone;
    cudaGraphExec_t cloned;
    CHECK(cudaGraphClone(&clone, graph));
    CHECK(cudaGraphInstantiate(&cloned, clone, 0));
    for (int i = 0; i < N; i++) in[i] = i ^ 0x5a5a;
    CHECK(cudaGraphLaunch(cloned, s));
    CHECK(cudaStreamSynchronize(s));
    unpack(box, packed);
    bool clone_right = scaled_right(in, packed, 5);
    printf("the clone copied: %s, checksum %llx\n", clone_right ? "yes" : "no", checksum(packed, N));
    EXPECT(clone_right, "clone");

    CHECK_EACH(cudaGraphExecDestroy, cloned, exec);
    CHECK_EACH(cudaGraphDestroy, clone, graph);
    CHECK_EACH(cudaFree, d_in, d_out);
    CHECK(cudaStreamDestroy(s));
    free(in);
    free(out);
    free(box);
    free(other);
    free(packed);
    return test_finish();
}

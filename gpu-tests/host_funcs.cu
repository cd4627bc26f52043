// host_funcs: host functions in streams (cudaLaunchHostFunc, cudaStreamAddCallback) and in graphs.
//  1. Stream order: a kernel fills a device buffer, cudaMemcpyAsync copies it into cudaMallocHost
//     memory, a host function reads it (must see the kernel's values) and writes a value into
//     another pinned buffer, which a later cudaMemcpyAsync + kernel on the same stream must see.
//     The host function runs on a thread other than main; cudaGetDevice inside it is reported.
//  2. cudaStreamAddCallback: the callback's status argument is cudaSuccess; it runs after the
//     kernel before it.
//  3. Three streams chained by events (cudaStreamWaitEvent), each with a kernel and a host function:
//     the host functions run in the chain's order and see each kernel's result.
//  4. 10 host functions interleaved with kernels on one stream increment a counter; one on the
//     legacy default stream, waited for with cudaDeviceSynchronize.
//  5. A graph with a host node (cudaGraphAddHostNode) after a kernel node, launched 5 times.
//  6. Stream capture of kernel, cudaLaunchHostFunc, kernel: nothing runs during the capture; the
//     graph has a host node and each of 3 launches runs the host function once.
//  7. The main thread spins on an atomic flag set by a host function, calling no CUDA function
//     (10 s limit): host functions must run without the application calling into CUDA.
#include "common.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

__global__ void fill(int *x, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = base + 3 * i;
}

__global__ void add_first(int *x, int n, const int *v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v[0];
}

__global__ void step(int *x, int digit) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *x = *x * 10 + digit;
}

static std::thread::id g_main;

// 1. Reads the copied buffer and writes the value the next stage adds.
struct Stage {
    const int *host_in;
    int n, base;
    int *host_out;
    int bad = -1;
    bool other_thread = false;
    cudaError_t get_device = cudaErrorUnknown;
    int device = -1;
};
static void CUDART_CB stage_fn(void *p) {
    Stage *st = (Stage *)p;
    st->other_thread = std::this_thread::get_id() != g_main;
    int bad = 0;
    for (int i = 0; i < st->n; i++)
        if (st->host_in[i] != st->base + 3 * i) bad++;
    st->bad = bad;
    st->host_out[0] = 1000 + bad;
    st->get_device = cudaGetDevice(&st->device);
}

// 2.
struct CallbackSeen {
    cudaError_t status = cudaErrorUnknown;
    int value = -1;
    const int *host;
};
static void CUDART_CB callback_fn(cudaStream_t, cudaError_t status, void *p) {
    CallbackSeen *c = (CallbackSeen *)p;
    c->status = status;
    c->value = c->host[0];
}

// 3. A log of host functions across streams.
struct Log {
    std::mutex mu;
    std::string order;
};
struct Mark {
    Log *log;
    char name;
    const int *host_value;  // a pinned value copied from the device just before
    int seen = -1;
};
static void CUDART_CB mark_fn(void *p) {
    Mark *m = (Mark *)p;
    m->seen = *m->host_value;
    std::lock_guard<std::mutex> lock(m->log->mu);
    m->log->order += m->name;
}

// 4, 5, 6.
static void CUDART_CB count_fn(void *p) { ((std::atomic<int> *)p)->fetch_add(1); }

// 7.
static void CUDART_CB flag_fn(void *p) { ((std::atomic<int> *)p)->store(1); }

int main() {
    test_init("host_funcs");
    g_main = std::this_thread::get_id();
    const int n = 1 << 16;
    const size_t bytes = n * sizeof(int);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *dev = nullptr, *dev_v = nullptr, *host = nullptr, *host_v = nullptr;
    CHECK(cudaMalloc(&dev, bytes));
    CHECK(cudaMalloc(&dev_v, sizeof(int)));
    CHECK(cudaMallocHost((void **)&host, bytes));
    CHECK(cudaMallocHost((void **)&host_v, sizeof(int)));

    // 1. kernel -> D2H -> host function -> H2D -> kernel -> D2H, all on one stream.
    memset(host, 0, bytes);
    host_v[0] = -1;
    Stage st = {host, n, 7, host_v};
    fill<<<n / 256, 256, 0, s>>>(dev, n, 7);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, stage_fn, &st));
    CHECK(cudaMemcpyAsync(dev_v, host_v, sizeof(int), cudaMemcpyHostToDevice, s));
    add_first<<<n / 256, 256, 0, s>>>(dev, n, dev_v);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    printf("host func saw the kernel's values: %s\n", yes(st.bad == 0));
    EXPECT(st.bad == 0, "the host function saw %d wrong values", st.bad);
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (host[i] != 7 + 3 * i + 1000) bad++;
    printf("later stream work saw the host func's value: %s\n", yes(bad == 0));
    EXPECT(bad == 0, "%d values after the host function's stage are wrong", bad);
    printf("host func ran on another thread: %s\n", yes(st.other_thread));
    EXPECT(st.other_thread, "the host function ran on the main thread");
    printf("cudaGetDevice in a host func: %s, device %d\n", cudaGetErrorName(st.get_device), st.device);

    // 2. cudaStreamAddCallback after a kernel and a copy.
    CallbackSeen cb;
    cb.host = host_v;
    fill<<<1, 1, 0, s>>>(dev_v, 1, 4242);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(host_v, dev_v, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamAddCallback(s, callback_fn, &cb, 0));
    CHECK(cudaStreamSynchronize(s));
    printf("callback status: %s, value seen: %d\n", cudaGetErrorName(cb.status), cb.value);
    EXPECT(cb.status == cudaSuccess && cb.value == 4242, "callback saw status %s, value %d",
           cudaGetErrorName(cb.status), cb.value);

    // 3. Streams A -> B -> C -> A chained by events; A starts behind a 50 ms kernel.
    cudaStream_t ss[3];
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) {
        CHECK(cudaStreamCreateWithFlags(&ss[i], cudaStreamNonBlocking));
        CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    }
    int *chain = nullptr, *chain_host = nullptr;
    CHECK(cudaMalloc(&chain, sizeof(int)));
    CHECK(cudaMallocHost((void **)&chain_host, 4 * sizeof(int)));
    CHECK(cudaMemset(chain, 0, sizeof(int)));
    Log log;
    Mark marks[4] = {{&log, 'A', &chain_host[0]}, {&log, 'B', &chain_host[1]}, {&log, 'C', &chain_host[2]},
                     {&log, 'a', &chain_host[3]}};
    const int order[4] = {0, 1, 2, 0};  // stream of each stage
    for (int k = 0; k < 4; k++) {
        cudaStream_t x = ss[order[k]];
        if (k == 0)
            spin_kernel<<<1, 1, 0, x>>>(50000000ull, nullptr, 0);
        else
            CHECK(cudaStreamWaitEvent(x, ev[order[k - 1]], 0));
        step<<<1, 1, 0, x>>>(chain, k + 1);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(&chain_host[k], chain, sizeof(int), cudaMemcpyDeviceToHost, x));
        CHECK(cudaLaunchHostFunc(x, mark_fn, &marks[k]));
        CHECK(cudaEventRecord(ev[order[k]], x));
    }
    CHECK(cudaStreamSynchronize(ss[0]));
    printf("host funcs across streams ran in order: %s; values seen: %d %d %d %d\n", log.order.c_str(),
           marks[0].seen, marks[1].seen, marks[2].seen, marks[3].seen);
    EXPECT(log.order == "ABCa" && marks[3].seen == 1234, "cross-stream order %s, last value %d", log.order.c_str(),
           marks[3].seen);

    // 4. A counter incremented by 10 host functions between kernels, then one on the legacy stream.
    std::atomic<int> counter(0);
    for (int i = 0; i < 10; i++) {
        step<<<1, 1, 0, s>>>(dev_v, 1);
        CHECK_LAUNCH();
        CHECK(cudaLaunchHostFunc(s, count_fn, &counter));
    }
    CHECK(cudaStreamSynchronize(s));
    printf("counter after 10 host funcs: %d\n", counter.load());
    CHECK(cudaLaunchHostFunc(0, count_fn, &counter));
    CHECK(cudaDeviceSynchronize());
    printf("counter after one on the legacy stream: %d\n", counter.load());
    EXPECT(counter.load() == 11, "counter is %d, expected 11", counter.load());

    // 5. A graph: kernel node -> host node, launched 5 times.
    std::atomic<int> graph_count(0);
    // On s itself: s does not synchronize with the legacy stream (cudaStreamNonBlocking).
    CHECK(cudaMemsetAsync(chain, 0, sizeof(int), s));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    int digit = 1;
    void *args[] = {&chain, &digit};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)step;
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(1);
    kp.kernelParams = args;
    cudaGraphNode_t kn, hn;
    CHECK(cudaGraphAddKernelNode(&kn, g, nullptr, 0, &kp));
    cudaHostNodeParams hp = {};
    hp.fn = count_fn;
    hp.userData = &graph_count;
    CHECK(cudaGraphAddHostNode(&hn, g, &kn, 1, &hp));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int i = 0; i < 5; i++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    int chain_value = 0;
    CHECK(cudaMemcpy(&chain_value, chain, sizeof(int), cudaMemcpyDeviceToHost));
    printf("graph with a host node, 5 launches: host node ran %d times, kernel value %d\n", graph_count.load(),
           chain_value);
    EXPECT(graph_count.load() == 5 && chain_value == 11111, "host node count %d, kernel value %d",
           graph_count.load(), chain_value);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // 6. cudaLaunchHostFunc captured into a graph.
    std::atomic<int> captured_count(0);
    // On s itself: s does not synchronize with the legacy stream (cudaStreamNonBlocking).
    CHECK(cudaMemsetAsync(chain, 0, sizeof(int), s));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    step<<<1, 1, 0, s>>>(chain, 2);
    CHECK_LAUNCH();
    CHECK(cudaLaunchHostFunc(s, count_fn, &captured_count));
    step<<<1, 1, 0, s>>>(chain, 3);
    CHECK_LAUNCH();
    CHECK(cudaStreamEndCapture(s, &g));
    printf("host func ran during capture: %s\n", yes(captured_count.load() != 0));
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
    int host_nodes = 0;
    for (size_t i = 0; i < count; i++) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(nodes[i], &t));
        if (t == cudaGraphNodeTypeHost) host_nodes++;
    }
    printf("captured graph: %zu nodes, %d host node(s)\n", count, host_nodes);
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(&chain_value, chain, sizeof(int), cudaMemcpyDeviceToHost));
    printf("captured host func after 3 launches: ran %d times, kernel value %d\n", captured_count.load(), chain_value);
    EXPECT(captured_count.load() == 3 && chain_value == 232323 && host_nodes == 1, "captured: count %d, value %d",
           captured_count.load(), chain_value);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // 7. Spin on a flag without calling CUDA.
    std::atomic<int> flag(0);
    spin_kernel<<<1, 1, 0, s>>>(20000000ull, nullptr, 0);
    CHECK_LAUNCH();
    CHECK(cudaLaunchHostFunc(s, flag_fn, &flag));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (flag.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    bool seen = flag.load() != 0;
    printf("flag set by a host func seen without a CUDA call: %s\n", yes(seen));
    EXPECT(seen, "the host function did not run within 10 s while the main thread called no CUDA function");
    CHECK(cudaStreamSynchronize(s));

    for (int i = 0; i < 3; i++) {
        CHECK(cudaStreamDestroy(ss[i]));
        CHECK(cudaEventDestroy(ev[i]));
    }
    CHECK(cudaStreamDestroy(s));
    CHECK_EACH(cudaFree, chain, dev, dev_v);
    CHECK_EACH(cudaFreeHost, chain_host, host, host_v);
    return test_finish();
}

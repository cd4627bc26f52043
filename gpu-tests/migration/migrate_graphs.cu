// migrate_graphs: a CUDA runtime program to move while it runs (gpu-tests/migrate.sh, row
// "graphs"), holding CUDA graphs as PyTorch and inference servers do. Graph 1 is captured from
// two streams (a kernel, a device copy, a second kernel, a memset, a host function, and a kernel
// forked onto another stream and joined back through events) and its graph destroyed once
// instantiated. Graph 2 is built by the API (two kernel nodes and a copy between them); the
// program changes its first kernel's arguments in the executable graph every fifth round (a move
// in between must keep the change) and turns its copy node off halfway. Every round launches
// both; every tenth round the checksums come back and are printed. Integer arithmetic only, so
// the output is the same natively and through Flyt, moved or not. The buffers' pointers are
// printed at the start and at the end ("pointers: ..."): a move must keep them.
//
// Arguments: rounds (default 200), milliseconds between rounds (default 10), and a gate file:
// halfway, the program keeps launching a third captured graph on a scratch buffer (which the
// output does not show) until that file exists, so a script can move it as often as it likes
// while graph launches are in flight.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>

#include "../common.h"  // CHECK

constexpr size_t WORDS = 1 << 20;
constexpr int GRID = 256, BLOCK = 256;

__global__ void step(unsigned *a, size_t n, unsigned k) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        a[i] = a[i] * 1664525u + k + (unsigned)i;
}

__global__ void mix(unsigned *dst, const unsigned *src, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dst[i] ^= src[i] + 7u;
}

static int host_runs = 0;
static void count_run(void *data) { __atomic_add_fetch((int *)data, 1, __ATOMIC_SEQ_CST); }

static unsigned checksum(const unsigned *device, unsigned *host) {
    CHECK(cudaMemcpy(host, device, WORDS * sizeof(unsigned), cudaMemcpyDeviceToHost));
    unsigned sum = 2166136261u;
    for (size_t i = 0; i < WORDS; i++) sum = (sum ^ host[i]) * 16777619u;
    return sum;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 10;
    const char *gate = argc > 3 ? argv[3] : nullptr;
    const size_t bytes = WORDS * sizeof(unsigned);
    unsigned *a, *b, *c, *d, *e, *f, *scratch;
    unsigned **all[] = {&a, &b, &c, &d, &e, &f, &scratch};
    for (auto buffer : all) {
        CHECK(cudaMalloc(buffer, bytes));
        CHECK(cudaMemset(*buffer, 0, bytes));
    }
    cudaStream_t s, side;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    // Graph 1: captured from two streams, its graph destroyed once instantiated.
    cudaGraph_t graph;
    cudaGraphExec_t captured;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    step<<<GRID, BLOCK, 0, s>>>(a, WORDS, 3);
    CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaEventRecord(fork, s));
    CHECK(cudaStreamWaitEvent(side, fork, 0));
    step<<<GRID, BLOCK, 0, side>>>(d, WORDS, 11);
    CHECK(cudaEventRecord(join, side));
    mix<<<GRID, BLOCK, 0, s>>>(c, b, WORDS);
    CHECK(cudaMemsetAsync(e, 0x5a, bytes / 2, s));
    CHECK(cudaLaunchHostFunc(s, count_run, &host_runs));
    CHECK(cudaStreamWaitEvent(s, join, 0));
    mix<<<GRID, BLOCK, 0, s>>>(c, d, WORDS);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&captured, graph, 0));
    CHECK(cudaGraphDestroy(graph));

    // Graph 2: built by the API, kept; its first kernel's arguments change in the executable graph.
    cudaGraph_t built;
    cudaGraphNode_t first, copy, second;
    CHECK(cudaGraphCreate(&built, 0));
    size_t words = WORDS;
    unsigned k = 1;
    void *first_args[] = {&f, &words, &k};
    cudaKernelNodeParams kernel = {};
    kernel.func = (void *)step;
    kernel.gridDim = dim3(GRID);
    kernel.blockDim = dim3(BLOCK);
    kernel.kernelParams = first_args;
    CHECK(cudaGraphAddKernelNode(&first, built, nullptr, 0, &kernel));
    CHECK(cudaGraphAddMemcpyNode1D(&copy, built, &first, 1, scratch, f, bytes, cudaMemcpyDeviceToDevice));
    void *second_args[] = {&e, &f, &words};
    kernel.func = (void *)mix;
    kernel.kernelParams = second_args;
    CHECK(cudaGraphAddKernelNode(&second, built, &copy, 1, &kernel));
    cudaGraphExec_t changing;
    CHECK(cudaGraphInstantiate(&changing, built, 0));

    // Graph 3: what runs while the program is held at the gate.
    cudaGraph_t busy_graph;
    cudaGraphExec_t busy;
    CHECK(cudaStreamBeginCapture(side, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 4; i++) step<<<GRID, BLOCK, 0, side>>>(scratch, WORDS, i);
    CHECK(cudaStreamEndCapture(side, &busy_graph));
    CHECK(cudaGraphInstantiate(&busy, busy_graph, 0));
    CHECK(cudaGraphDestroy(busy_graph));

    printf("pointers: %p %p %p %p %p %p\n", (void *)a, (void *)b, (void *)c, (void *)d, (void *)e, (void *)f);
    fflush(stdout);
    unsigned *host = (unsigned *)malloc(bytes);
    struct timespec nap = {0, (long)pause_ms * 1000000L};
    for (int round = 1; round <= rounds; round++) {
        if (round % 5 == 0) {
            k = (unsigned)round;
            kernel.func = (void *)step;
            kernel.kernelParams = first_args;
            CHECK(cudaGraphExecKernelNodeSetParams(changing, first, &kernel));
        }
        if (round == rounds / 2) CHECK(cudaGraphNodeSetEnabled(changing, copy, 0));
        CHECK(cudaGraphLaunch(captured, s));
        CHECK(cudaGraphLaunch(changing, s));
        if (gate && round == rounds / 2) {
            fprintf(stderr, "holding until %s exists\n", gate);
            for (unsigned spin = 0; access(gate, F_OK) != 0; spin++) {
                CHECK(cudaGraphLaunch(busy, side));
                if (spin % 16 == 0) CHECK(cudaStreamSynchronize(side));
            }
            CHECK(cudaStreamSynchronize(side));
        }
        if (round % 10 == 0) {
            CHECK(cudaStreamSynchronize(s));
            printf("round %d:", round);
            for (unsigned *buffer : {a, b, c, d, e, f}) printf(" %08x", checksum(buffer, host));
            printf(" host functions %d\n", __atomic_load_n(&host_runs, __ATOMIC_SEQ_CST));
            fflush(stdout);
        }
        nanosleep(&nap, nullptr);
    }
    CHECK(cudaStreamSynchronize(s));
    unsigned enabled = 1;
    CHECK(cudaGraphNodeGetEnabled(changing, copy, &enabled));
    printf("copy node enabled: %u\n", enabled);
    printf("pointers: %p %p %p %p %p %p\n", (void *)a, (void *)b, (void *)c, (void *)d, (void *)e, (void *)f);
    CHECK(cudaGraphExecDestroy(captured));
    CHECK(cudaGraphExecDestroy(changing));
    CHECK(cudaGraphExecDestroy(busy));
    CHECK(cudaGraphDestroy(built));
    for (auto buffer : all) CHECK(cudaFree(*buffer));
    free(host);
    printf("PASSED\n");
    return 0;
}

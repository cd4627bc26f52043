// The kernels that graph_nodes.cu (driver API) and graph_nodes_runtime.cu (runtime API) put in
// their graphs, and add_kernel.
#pragma once

#include <vector>

#include "graph_add_kernel.h"

__global__ void fill(int *p, int n, int scale) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = i * scale;
}

__global__ void copy_plus(int *out, const int *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += in[i];
}

// One thread: counts, and keeps the loop going until the count reaches `limit`.
__global__ void count_step(int *counter, int limit, cudaGraphConditionalHandle handle) {
    int next = ++*counter;
    cudaGraphSetConditional(handle, next < limit ? 1 : 0);
}

__global__ void set_condition(cudaGraphConditionalHandle handle, unsigned value) { cudaGraphSetConditional(handle, value); }

__global__ void add_one(int *p) { *p += 1; }

// Counts the values of `out` (n ints) that are not i * factor.
static int wrong_values(const int *out, int n, int factor) {
    std::vector<int> h(n);
    CHECK(cudaMemcpy(h.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != factor * i;
    return bad;
}

static void launch_and_wait(cudaGraphExec_t exec, cudaStream_t s) {
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
}

// Section 2 of both programs: runs graph w (a WHILE loop counting counter[0] to 10, an IF set to 1
// adding one to counter[1], an IF set to 0 to counter[2]) once, prints and checks the counts, and
// destroys it.
static void run_conditional_graph(cudaGraph_t w, cudaStream_t s, const int *counter) {
    cudaGraphExec_t wexec;
    CHECK(cudaGraphInstantiate(&wexec, w, 0));
    launch_and_wait(wexec, s);
    int counts[3] = {0, 0, 0};
    CHECK(cudaMemcpy(counts, counter, sizeof counts, cudaMemcpyDeviceToHost));
    printf("while loop counted to %d; IF set to 1 ran %d time(s); IF set to 0 ran %d time(s)\n", counts[0], counts[1], counts[2]);
    EXPECT(counts[0] == 10 && counts[1] == 1 && counts[2] == 0, "conditional nodes: %d %d %d", counts[0], counts[1], counts[2]);
    CHECK(cudaGraphExecDestroy(wexec));
    CHECK(cudaGraphDestroy(w));
}

// The graph of section 3's child graph node: two empty nodes, the second after the first.
static cudaGraph_t two_empty_nodes() {
    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t c1, c2;
    CHECK(cudaGraphAddEmptyNode(&c1, child, nullptr, 0));
    CHECK(cudaGraphAddEmptyNode(&c2, child, &c1, 1));
    return child;
}

// n ints of device memory, set to 0 on stream s.
static int *zeroed_ints(int n, cudaStream_t s) {
    int *p = nullptr;
    CHECK(cudaMalloc(&p, n * sizeof(int)));
    CHECK(cudaMemsetAsync(p, 0, n * sizeof(int), s));
    return p;
}

// Section 1's first check: three launches of exec (alloc, fill 3 * i, out += it, free) leave
// out[i] = 9 * i.
static void launch_three_times(cudaGraphExec_t exec, cudaStream_t s, const int *out, int n) {
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    int bad = wrong_values(out, n, 3 * 3);
    printf("three launches through graph memory: %s\n", bad ? "wrong" : "right");
    EXPECT(bad == 0, "%d values wrong after graph memory launches", bad);
}

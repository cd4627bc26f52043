// probe: the smallest end-to-end check, run first on every transport. If it fails, the harness marks the
// transport "n/a" and runs nothing else over it. Allocates, sets, launches a kernel, copies back, checks.
#include "common.h"

__global__ void fill_index(int *out, int n, int add) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = out[i] + i + add;
}

static int run(const bench::Args &) {
    auto t0 = bench::Clock::now();
    CK(cudaFree(nullptr));  // context / session ready
    auto t1 = bench::Clock::now();
    bench::emit_meta("probe");

    const int n = 1 << 16;
    int *d = nullptr;
    CK(cudaMalloc(&d, n * sizeof(int)));
    CK(cudaMemset(d, 0, n * sizeof(int)));
    fill_index<<<(n + 255) / 256, 256>>>(d, n, 7);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<int> h(n, -1);
    CK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (h[i] != i + 7) bad++;
    if (bad) bench::note("probe: %d of %d elements wrong (h[1]=%d, want 8)", bad, n, h[1]);
    bench::Json("probe").boolean("ok", bad == 0).num("first_call_ms", bench::us_between(t0, t1) / 1e3).emit();
    return bad ? 2 : 0;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

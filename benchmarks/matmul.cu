// matmul: the compute-bound application. A tiled shared-memory SGEMM (32x32 tiles, 4 outputs per thread),
// C = A * B with N x N floats, repeated. Timed: 3 cudaMalloc, 2 H2D copies (pageable), the repetitions,
// cudaDeviceSynchronize, the D2H copy of C and 3 cudaFree -- the whole GPU part of the app, after the CUDA
// context exists. Checked against a CPU reference: fully on a small odd size, and 16 elements of the big C.
// Options: --n N (default 4096), --reps R (fixed repetitions), --target-s S (native calibration: pick R so
// that the repetitions take about S seconds, and report R so that the other transports run the same R),
// --quick (default target 1 s instead of 3 s).
#include "common.h"

#define TILE 32
#define ROWS 8  // blockDim.y; each thread computes TILE/ROWS = 4 rows

__global__ void sgemm_tiled(int n, const float *__restrict__ A, const float *__restrict__ B, float *__restrict__ C) {
    __shared__ float As[TILE][TILE + 1];
    __shared__ float Bs[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int col = blockIdx.x * TILE + tx;
    const int row0 = blockIdx.y * TILE + ty;
    float acc[TILE / ROWS] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < n; k0 += TILE) {
#pragma unroll
        for (int j = 0; j < TILE / ROWS; j++) {
            int r = row0 + ROWS * j, c = k0 + tx;
            As[ty + ROWS * j][tx] = (r < n && c < n) ? A[size_t(r) * n + c] : 0.f;
            int rb = k0 + ty + ROWS * j;
            Bs[ty + ROWS * j][tx] = (rb < n && col < n) ? B[size_t(rb) * n + col] : 0.f;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < TILE; k++) {
            float bv = Bs[k][tx];
#pragma unroll
            for (int j = 0; j < TILE / ROWS; j++) acc[j] += As[ty + ROWS * j][k] * bv;
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < TILE / ROWS; j++) {
        int r = row0 + ROWS * j;
        if (r < n && col < n) C[size_t(r) * n + col] = acc[j];
    }
}

static void launch(int n, const float *A, const float *B, float *C) {
    dim3 block(TILE, ROWS), grid((n + TILE - 1) / TILE, (n + TILE - 1) / TILE);
    sgemm_tiled<<<grid, block>>>(n, A, B, C);
}

static void init(std::vector<float> &m, unsigned seed) {
    unsigned x = seed;
    for (float &v : m) {
        x = x * 1664525u + 1013904223u;
        v = float(int(x >> 9) % 2001 - 1000) / 1000.f;
    }
}

// Compares C[r][c] with a double-precision CPU dot product; returns the number of bad elements.
static int check(int n, const std::vector<float> &A, const std::vector<float> &B, const std::vector<float> &C,
                 const std::vector<std::pair<int, int>> &at, double *max_rel) {
    int bad = 0;
    for (auto [r, c] : at) {
        double ref = 0, mag = 0;
        for (int k = 0; k < n; k++) {
            double p = double(A[size_t(r) * n + k]) * double(B[size_t(k) * n + c]);
            ref += p;
            mag += std::fabs(p);
        }
        double err = std::fabs(double(C[size_t(r) * n + c]) - ref);
        double rel = err / (mag + 1e-30);
        *max_rel = std::max(*max_rel, rel);
        if (err > 2e-4 * mag + 1e-5) {
            if (bad < 5) bench::note("matmul: C[%d][%d] = %.6f, CPU reference %.6f", r, c, C[size_t(r) * n + c], ref);
            bad++;
        }
    }
    return bad;
}

// A, B and C in device memory, `bytes` each.
struct Matrices {
    float *a, *b, *c;
    void release() {
        CK(cudaFree(a));
        CK(cudaFree(b));
        CK(cudaFree(c));
    }
};

// A and B copied from the host's (zeroed when not given), C as cudaMalloc leaves it.
static Matrices on_device(size_t bytes, const float *a, const float *b) {
    Matrices d;
    CK(cudaMalloc(&d.a, bytes));
    CK(cudaMalloc(&d.b, bytes));
    CK(cudaMalloc(&d.c, bytes));
    if (a) {
        CK(cudaMemcpy(d.a, a, bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d.b, b, bytes, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMemset(d.a, 0, bytes));
        CK(cudaMemset(d.b, 0, bytes));
    }
    return d;
}

static int run(const bench::Args &args) {
    const bool quick = args.has("--quick");
    const int n = int(args.num("--n", 4096));
    int reps = int(args.num("--reps", 0));
    const double target = args.num("--target-s", quick ? 1.0 : 3.0);

    CK(cudaFree(nullptr));
    bench::emit_meta("matmul");

    // --- correctness on a small, odd size ---
    {
        const int m = 197;
        std::vector<float> A(size_t(m) * m), B(size_t(m) * m), C(size_t(m) * m, -1.f);
        init(A, 1);
        init(B, 2);
        size_t bytes = sizeof(float) * m * m;
        Matrices d = on_device(bytes, A.data(), B.data());
        launch(m, d.a, d.b, d.c);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(C.data(), d.c, bytes, cudaMemcpyDeviceToHost));
        d.release();
        std::vector<std::pair<int, int>> at;
        for (int r = 0; r < m; r += 7)
            for (int c = 0; c < m; c += 5) at.push_back({r, c});
        at.push_back({m - 1, m - 1});
        double max_rel = 0;
        int bad = check(m, A, B, C, at, &max_rel);
        bench::Json("matmul_check")
            .integer("n", m)
            .integer("checked", (long long)at.size())
            .integer("bad", bad)
            .num("max_rel_err", max_rel)
            .boolean("ok", bad == 0)
            .emit();
        if (bad) return 2;
    }

    const size_t bytes = sizeof(float) * size_t(n) * n;
    std::vector<float> A(size_t(n) * n), B(size_t(n) * n), C(size_t(n) * n, 0.f);
    init(A, 3);
    init(B, 4);

    // --- calibration (native run): how many repetitions make about `target` seconds ---
    if (reps <= 0) {
        Matrices d = on_device(bytes, A.data(), B.data());
        launch(n, d.a, d.b, d.c);
        CK(cudaDeviceSynchronize());
        auto t0 = bench::Clock::now();
        for (int i = 0; i < 3; i++) launch(n, d.a, d.b, d.c);
        CK(cudaDeviceSynchronize());
        double one = bench::us_between(t0, bench::Clock::now()) / 3e6;
        reps = std::max(3, int(std::lround(target / one)));
        bench::note("matmul calibration: %.2f ms per %dx%d multiply -> %d repetitions for %.1f s", one * 1e3, n, n,
                    reps, target);
        d.release();
    } else {
        // The same warm-up as the calibrating run, so every transport starts with a loaded kernel.
        Matrices d = on_device(bytes, nullptr, nullptr);
        launch(n, d.a, d.b, d.c);
        CK(cudaDeviceSynchronize());
        d.release();
    }

    // --- the timed application ---
    auto t0 = bench::Clock::now();
    Matrices d = on_device(bytes, A.data(), B.data());
    auto t1 = bench::Clock::now();
    for (int i = 0; i < reps; i++) launch(n, d.a, d.b, d.c);
    CK(cudaDeviceSynchronize());
    auto t2 = bench::Clock::now();
    CK(cudaMemcpy(C.data(), d.c, bytes, cudaMemcpyDeviceToHost));
    d.release();
    auto t3 = bench::Clock::now();
    CK(cudaGetLastError());

    std::vector<std::pair<int, int>> at;
    for (int i = 0; i < 16; i++) at.push_back({(i * 977 + 13) % n, (i * 1511 + 7) % n});
    at.push_back({n - 1, n - 1});
    double max_rel = 0;
    int bad = check(n, A, B, C, at, &max_rel);

    double total = bench::us_between(t0, t3) / 1e6, kernels = bench::us_between(t1, t2) / 1e6;
    double tflops = 2.0 * double(n) * n * n * reps / kernels / 1e12;
    bench::Json("matmul")
        .integer("n", n)
        .integer("reps", reps)
        .num("total_s", total)
        .num("kernel_s", kernels)
        .num("setup_s", bench::us_between(t0, t1) / 1e6)
        .num("teardown_s", bench::us_between(t2, t3) / 1e6)
        .num("tflops", tflops)
        .boolean("ok", bad == 0)
        .num("max_rel_err", max_rel)
        .emit();
    bench::note("matmul %dx%d x%d: total %.3f s (kernels %.3f s, %.2f TFLOP/s), check %s", n, n, reps, total, kernels,
                tflops, bad ? "FAILED" : "ok");
    return bad ? 2 : 0;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

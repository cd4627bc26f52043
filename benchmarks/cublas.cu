// cublas: NVIDIA's library over Flyt. cuBLAS carries its own runtime and calls the driver itself,
// so through Flyt it runs over Flyt's libcuda.so.1 whichever runtime the program links (built here
// with nvcc's default static runtime). Two loads:
//  - sgemm_4096: C = A * B, 4096 x 4096 floats, repeated (one sync at the end); GFLOP/s. Checked
//    against a CPU reference on 16 elements.
//  - small_gemms: 1000 SGEMMs of 64 x 64 in a loop, then one sync: the cuBLAS-heavy pattern (many
//    small library calls, each a launch); total ms per 1000, repeated.
// Options: --quick (fewer repetitions).
#include <cublas_v2.h>

#include "common.h"

#define CB(call)                                                                                         \
    do {                                                                                                 \
        cublasStatus_t cb_status_ = (call);                                                              \
        if (cb_status_ != CUBLAS_STATUS_SUCCESS) {                                                       \
            char cb_msg_[256];                                                                           \
            snprintf(cb_msg_, sizeof cb_msg_, "%s:%d: %s failed: cuBLAS status %d", __FILE__, __LINE__, \
                     #call, int(cb_status_));                                                            \
            throw bench::CudaFailure(cb_msg_);                                                           \
        }                                                                                                \
    } while (0)

static std::vector<float> filled(size_t n, unsigned seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = float((i * 2654435761u + seed) % 1000) / 1000.0f - 0.5f;
    return v;
}

// C = A * B for n x n column-major floats: A and B filled on the host and uploaded, C on the device.
struct Gemm {
    int n;
    std::vector<float> a, b;
    float *da = nullptr, *db = nullptr, *dc = nullptr;

    Gemm(int n, unsigned seed) : n(n), a(filled(count(), seed)), b(filled(count(), seed + 1)) {
        CK(cudaMalloc(&da, bytes()));
        CK(cudaMalloc(&db, bytes()));
        CK(cudaMalloc(&dc, bytes()));
        CK(cudaMemcpy(da, a.data(), bytes(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, b.data(), bytes(), cudaMemcpyHostToDevice));
    }
    ~Gemm() {
        cudaFree(da);
        cudaFree(db);
        cudaFree(dc);
    }
    size_t count() const { return size_t(n) * n; }
    size_t bytes() const { return count() * sizeof(float); }

    void run(cublasHandle_t handle) const {
        const float one = 1.0f, zero = 0.0f;
        CB(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da, n, db, n, &zero, dc, n));
    }

    // Checks C[i, j] of the device's result `c` against a double-precision dot product.
    void check(const std::vector<float> &c, int i, int j, double tolerance, const char *bench) const {
        double want = 0;
        for (int k = 0; k < n; k++) want += double(a[i + size_t(k) * n]) * double(b[k + size_t(j) * n]);
        double got = c[i + size_t(j) * n];
        if (std::fabs(got - want) > tolerance * (1 + std::fabs(want)))
            throw bench::CudaFailure(std::string(bench) + ": C[" + std::to_string(i) + "," + std::to_string(j) + "] = " +
                                     std::to_string(got) + ", expected " + std::to_string(want));
    }

    std::vector<float> result() const {
        std::vector<float> c(count());
        CK(cudaMemcpy(c.data(), dc, bytes(), cudaMemcpyDeviceToHost));
        return c;
    }
};

static int run(const bench::Args &args) {
    const bool quick = args.has("--quick");
    CK(cudaFree(nullptr));
    bench::emit_meta("cublas");
    cublasHandle_t handle;
    CB(cublasCreate(&handle));

    bench::section("sgemm_4096", [&] {
        const int reps = quick ? 5 : 20;
        Gemm gemm(4096, 1);
        // Warm-up: cuBLAS picks and loads its kernel.
        gemm.run(handle);
        CK(cudaDeviceSynchronize());
        auto t0 = bench::Clock::now();
        for (int r = 0; r < reps; r++) gemm.run(handle);
        CK(cudaDeviceSynchronize());
        double s = bench::us_between(t0, bench::Clock::now()) / 1e6;
        auto c = gemm.result();
        for (int probe = 0; probe < 16; probe++) gemm.check(c, (probe * 977) % gemm.n, (probe * 1601 + 7) % gemm.n, 1e-2, "sgemm_4096");
        double gflops = 2.0 * gemm.n * double(gemm.n) * gemm.n * reps / s / 1e9;
        bench::Json("sgemm_4096").integer("n", gemm.n).integer("reps", reps).num("total_s", s).num("gflops", gflops).emit();
        bench::note("SGEMM 4096 x %d: %.3f s, %.0f GFLOP/s", reps, s, gflops);
    });

    bench::section("small_gemms", [&] {
        const int calls = 1000, rounds = quick ? 5 : 20;
        Gemm gemm(64, 3);
        gemm.run(handle);
        CK(cudaDeviceSynchronize());
        std::vector<double> ms;
        for (int r = 0; r < rounds; r++) {
            auto t0 = bench::Clock::now();
            for (int i = 0; i < calls; i++) gemm.run(handle);
            CK(cudaDeviceSynchronize());
            ms.push_back(bench::us_between(t0, bench::Clock::now()) / 1e3);
        }
        gemm.check(gemm.result(), 5, 9, 1e-3, "small_gemms");
        auto st = bench::stats(ms);
        bench::Json("small_gemms").integer("n", gemm.n).integer("calls", calls).integer("rounds", rounds)
            .num("p50_ms", st.p50).num("min_ms", st.min).num("mean_ms", st.mean).emit();
        bench::note("1000 SGEMMs of 64x64 + sync: p50 %.3f ms", st.p50);
    });
    CB(cublasDestroy(handle));
    return 0;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

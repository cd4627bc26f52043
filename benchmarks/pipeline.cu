// pipeline: Flyt's own benchmark shape, per buffer size n (256 KiB .. 2 GiB, x4 steps plus 2 GiB):
//   3 cudaMalloc(n), cudaMemset, 2 H2D cudaMemcpy (pageable), one kernel (c = a + b), cudaDeviceSynchronize,
//   3 D2H cudaMemcpy (pageable), 3 cudaFree -- all inside the timed region. Median wall time per size.
// Sizes that do not fit (3n of free device memory, 5n of available host memory, plus margins) are skipped.
// The result is checked at sampled positions after the first timed repetition of each size.
// Options: --quick (stop at 64 MiB, fewer repetitions), --max-bytes N.
#include "common.h"

#include <thread>

__global__ void add(const float *a, const float *b, float *c, size_t count) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
        c[i] = a[i] + b[i];
}

static size_t host_available() {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return SIZE_MAX;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb ? kb * 1024 : SIZE_MAX;
}

// Fill (and so fault in) host memory with several threads.
template <class F>
static void parallel_for(size_t count, F f) {
    unsigned t = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (unsigned k = 0; k < t; k++)
        th.emplace_back([=] {
            size_t lo = count * k / t, hi = count * (k + 1) / t;
            for (size_t i = lo; i < hi; i++) f(i);
        });
    for (auto &x : th) x.join();
}

static float va(size_t i) { return float(i % 1000); }
static float vb(size_t i) { return float(i % 777) * 0.5f; }

static int run(const bench::Args &args) {
    const bool quick = args.has("--quick");
    const size_t max_bytes = size_t(args.num("--max-bytes", quick ? 64.0 * 1048576 : 2048.0 * 1048576));

    CK(cudaFree(nullptr));
    bench::emit_meta("pipeline");

    std::vector<size_t> sizes;
    for (size_t n = 256 << 10; n <= max_bytes; n *= 4) sizes.push_back(n);
    if (sizes.back() < max_bytes) sizes.push_back(max_bytes);

    size_t dev_free = SIZE_MAX, dev_total = 0;
    if (cudaMemGetInfo(&dev_free, &dev_total) != cudaSuccess) {
        cudaGetLastError();
        dev_free = SIZE_MAX;
        bench::note("cudaMemGetInfo failed; trying every size");
    }
    const size_t host_avail = host_available();
    std::vector<size_t> fit;
    for (size_t n : sizes) {
        const char *why = nullptr;
        if (dev_free != SIZE_MAX && 3 * n + (512u << 20) > dev_free)
            why = "device memory";
        else if (host_avail != SIZE_MAX && 5 * n + (4ull << 30) > host_avail)
            why = "host memory";
        if (why) {
            bench::Json("pipeline").integer("bytes", (long long)n).str("skipped", why).emit();
            bench::note("pipeline %s: skipped (%s)", bench::human_bytes(n).c_str(), why);
        } else {
            fit.push_back(n);
        }
    }
    if (fit.empty()) return 0;
    const size_t nmax = fit.back(), cmax = nmax / sizeof(float);

    float *in_a = (float *)malloc(nmax), *in_b = (float *)malloc(nmax);
    float *out_a = (float *)malloc(nmax), *out_b = (float *)malloc(nmax), *out_c = (float *)malloc(nmax);
    if (!in_a || !in_b || !out_a || !out_b || !out_c) {
        bench::note("host malloc of 5 x %zu bytes failed", nmax);
        return 1;
    }
    parallel_for(cmax, [=](size_t i) {
        in_a[i] = va(i);
        in_b[i] = vb(i);
        out_a[i] = out_b[i] = out_c[i] = -1.f;
    });

    for (size_t n : fit) {
        const size_t count = n / sizeof(float);
        int reps = n <= (64u << 20) ? (quick ? 5 : 10) : n <= (256u << 20) ? 5 : 3;
        const bool warm = n <= (256u << 20);
        const double cap = quick ? 4.0 : 10.0;
        const unsigned grid = unsigned(std::min<size_t>((count + 255) / 256, 132 * 16));
        std::vector<double> ms;
        bool ok = true, oom = false;
        double end = bench::now_s() + cap;
        for (int r = -(warm ? 1 : 0); r < reps; r++) {
            auto t0 = bench::Clock::now();
            float *a = nullptr, *b = nullptr, *c = nullptr;
            cudaError_t e = cudaMalloc(&a, n);
            if (e == cudaSuccess) e = cudaMalloc(&b, n);
            if (e == cudaSuccess) e = cudaMalloc(&c, n);
            if (e != cudaSuccess) {
                bench::note("pipeline %s: cudaMalloc failed: %s", bench::human_bytes(n).c_str(), cudaGetErrorString(e));
                cudaGetLastError();
                if (a) cudaFree(a);
                if (b) cudaFree(b);
                oom = true;
                break;
            }
            CK(cudaMemset(c, 0, n));
            CK(cudaMemcpy(a, in_a, n, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(b, in_b, n, cudaMemcpyHostToDevice));
            add<<<grid, 256>>>(a, b, c, count);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(out_a, a, n, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(out_b, b, n, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(out_c, c, n, cudaMemcpyDeviceToHost));
            CK(cudaFree(a));
            CK(cudaFree(b));
            CK(cudaFree(c));
            auto t1 = bench::Clock::now();
            if (r >= 0) ms.push_back(bench::us_between(t0, t1) / 1e3);
            if (r == 0) {
                for (size_t k = 0; k < 4097; k++) {
                    size_t i = k == 4096 ? count - 1 : (k * 2654435761ull) % count;
                    if (out_c[i] != va(i) + vb(i) || out_a[i] != va(i) || out_b[i] != vb(i)) {
                        if (ok)
                            bench::note("pipeline %s: element %zu is %g, want %g", bench::human_bytes(n).c_str(), i,
                                        out_c[i], va(i) + vb(i));
                        ok = false;
                    }
                }
            }
            if (r >= 0 && bench::now_s() > end) break;
        }
        if (oom) {
            bench::Json("pipeline").integer("bytes", (long long)n).str("skipped", "cudaMalloc failed").emit();
            break;
        }
        auto st = bench::stats(ms);
        bench::Json("pipeline")
            .integer("bytes", (long long)n)
            .integer("reps", (long long)st.n)
            .num("median_ms", st.p50)
            .num("min_ms", st.min)
            .num("max_ms", st.max)
            .num("gbps", 5.0 * double(n) / (st.p50 * 1e-3) / 1e9)
            .boolean("ok", ok)
            .emit();
        bench::note("pipeline %10s: median %9.3f ms (min %.3f, %zu reps)%s", bench::human_bytes(n).c_str(), st.p50,
                    st.min, st.n, ok ? "" : "  WRONG RESULT");
        if (!ok) return 2;
    }
    free(in_a);
    free(in_b);
    free(out_a);
    free(out_b);
    free(out_c);
    return 0;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

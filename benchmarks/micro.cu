// micro: latency microbenchmarks of the runtime calls themselves.
//   null_call       cudaStreamQuery on an idle stream (a synchronizing call that does no GPU work)
//   launch_sync     empty kernel launch + cudaDeviceSynchronize
//   cpu_per_launch  caller's time per asynchronous empty launch (batches of 10k, no sync inside the batch)
//   launch_rate     100k empty launches, then one cudaDeviceSynchronize: launches per second
//   malloc_free     cudaMalloc + cudaFree of 1 MiB
// Options: --quick (fewer iterations), --iters N (null_call/launch_sync iterations).
#include "common.h"

__global__ void empty_kernel() {}

using bench::Clock;

// Times `body` per iteration: `warm` untimed iterations, then up to `iters` timed ones or `cap_s` seconds.
template <class F>
static bench::Stats time_each(int warm, int iters, double cap_s, F body) {
    for (int i = 0; i < warm; i++) body();
    std::vector<double> us;
    us.reserve(iters);
    double end = bench::now_s() + cap_s;
    for (int i = 0; i < iters; i++) {
        auto a = Clock::now();
        body();
        auto b = Clock::now();
        us.push_back(bench::us_between(a, b));
        if ((i & 255) == 255 && bench::now_s() > end) {
            bench::note("  stopped after %d of %d iterations (%.1f s cap)", i + 1, iters, cap_s);
            break;
        }
    }
    return bench::stats(std::move(us));
}

static int run(const bench::Args &args) {
    const bool quick = args.has("--quick");
    const int iters = int(args.num("--iters", quick ? 5000 : 20000));
    const int warm = quick ? 200 : 1000;
    const double cap = quick ? 2.0 : 5.0;

    CK(cudaFree(nullptr));
    bench::emit_meta("micro");

    // --- synchronizing null call ---
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    CK(cudaStreamSynchronize(s));
    bench::section("null_call", [&] {
        CK(cudaStreamQuery(s));
        cudaError_t last = cudaSuccess;
        auto st = time_each(warm, iters, cap, [&] {
            cudaError_t e = cudaStreamQuery(s);
            if (e != cudaSuccess) last = e;
        });
        CK(last);
        bench::Json("null_call").str("call", "cudaStreamQuery(idle stream)").lat(st).cdf(st).emit();
        bench::note("null call (cudaStreamQuery): p50 %.2f us, p99 %.2f us, p99.9 %.2f us (%zu iters)", st.p50, st.p99,
                    st.p999, st.n);
    });

    // --- empty launch + device synchronize ---
    bench::section("launch_sync", [&] {
        cudaError_t last = cudaSuccess;
        auto st = time_each(warm, iters, cap, [&] {
            empty_kernel<<<1, 1>>>();
            cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) last = e;
        });
        CK(last);
        CK(cudaGetLastError());
        bench::Json("launch_sync").lat(st).cdf(st).emit();
        bench::note("empty launch + sync: p50 %.2f us, p99 %.2f us, p99.9 %.2f us", st.p50, st.p99, st.p999);
    });

    // --- caller's time per asynchronous launch ---
    bench::section("cpu_per_launch", [&] {
        const int batch = 10000;
        const int batches = quick ? 4 : 10;
        for (int i = 0; i < 1000; i++) empty_kernel<<<1, 1>>>();
        CK(cudaDeviceSynchronize());
        std::vector<double> per_launch, thread_cpu, proc_cpu, drain;
        double end = bench::now_s() + 2 * cap;
        for (int b = 0; b < batches; b++) {
            double tc0 = bench::thread_cpu_s(), pc0 = bench::process_cpu_s();
            auto a = Clock::now();
            for (int i = 0; i < batch; i++) empty_kernel<<<1, 1>>>();
            auto m = Clock::now();
            double tc1 = bench::thread_cpu_s(), pc1 = bench::process_cpu_s();
            CK(cudaDeviceSynchronize());
            auto z = Clock::now();
            per_launch.push_back(bench::us_between(a, m) / batch);
            thread_cpu.push_back((tc1 - tc0) * 1e6 / batch);
            proc_cpu.push_back((pc1 - pc0) * 1e6 / batch);
            drain.push_back(bench::us_between(m, z));
            if (bench::now_s() > end) break;
        }
        CK(cudaGetLastError());
        // The same launches timed one by one, for the distribution of a single call.
        std::vector<double> each;
        each.reserve(batch);
        for (int i = 0; i < batch; i++) {
            auto a = Clock::now();
            empty_kernel<<<1, 1>>>();
            each.push_back(bench::us_between(a, Clock::now()));
        }
        CK(cudaDeviceSynchronize());
        auto st = bench::stats(each);
        bench::Json("cpu_per_launch")
            .integer("batch", batch)
            .integer("batches", (long long)per_launch.size())
            .num("mean_us", bench::median(per_launch))
            .num("thread_cpu_us", bench::median(thread_cpu))
            .num("process_cpu_us", bench::median(proc_cpu))
            .num("drain_sync_us", bench::median(drain))
            .num("each_p50_us", st.p50)
            .num("each_p99_us", st.p99)
            .num("each_p999_us", st.p999)
            .emit();
        bench::note(
            "async launch, caller's time: %.3f us per launch (batch mean), thread CPU %.3f us, process "
            "CPU %.3f us; single launch p50 %.3f p99 %.3f us; final sync %.0f us",
            bench::median(per_launch), bench::median(thread_cpu), bench::median(proc_cpu), st.p50, st.p99,
            bench::median(drain));
    });

    // --- launches per second: 100k launches, one sync ---
    bench::section("launch_rate", [&] {
        const int n = 100000;
        const int reps = quick ? 2 : 3;
        std::vector<double> rate;
        for (int r = 0; r < reps; r++) {
            auto a = Clock::now();
            for (int i = 0; i < n; i++) empty_kernel<<<1, 1>>>();
            CK(cudaDeviceSynchronize());
            double s_ = bench::us_between(a, Clock::now()) / 1e6;
            rate.push_back(n / s_);
            if (s_ > 10) break;
        }
        CK(cudaGetLastError());
        auto st = bench::stats(rate);
        bench::Json("launch_rate")
            .integer("launches", n)
            .integer("reps", (long long)rate.size())
            .num("per_s", st.p50)
            .num("min_per_s", st.min)
            .num("max_per_s", st.max)
            .emit();
        bench::note("launch rate: %.0f launches/s (median of %zu x %d)", st.p50, rate.size(), n);
    });

    // --- cudaMalloc + cudaFree, 1 MiB ---
    bench::section("malloc_free", [&] {
        const size_t sz = 1 << 20;
        cudaError_t last = cudaSuccess;
        auto st = time_each(quick ? 20 : 50, quick ? 500 : 2000, cap, [&] {
            void *p = nullptr;
            cudaError_t e = cudaMalloc(&p, sz);
            if (e == cudaSuccess) e = cudaFree(p);
            if (e != cudaSuccess) last = e;
        });
        CK(last);
        bench::Json("malloc_free").integer("bytes", sz).lat(st).emit();
        bench::note("cudaMalloc+cudaFree 1 MiB: p50 %.1f us, p99 %.1f us", st.p50, st.p99);
    });

    CK(cudaStreamDestroy(s));
    return 0;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

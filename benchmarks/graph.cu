// graph: a 1000-node CUDA graph (kernel nodes), built by stream capture of 1000 small kernel launches,
// instantiated once and launched 1000 times.
//   graph_launch   each launch timed host-side as cudaGraphLaunch + cudaStreamSynchronize (p50/p99/p99.9),
//                  plus the time of the capture, of cudaGraphInstantiate and of the cudaGraphLaunch call
//                  alone (p50 over the same launches, the sync excluded)
//   graph_vs_stream the same 1000 kernels launched one by one + cudaStreamSynchronize, median of 20 rounds
//                  (5 quick): what the graph saves
//   graph_update   llama.cpp's pattern: every step captures the graph again with new arguments,
//                  cudaGraphExecUpdate's the executable graph in place, launches it and syncs; 100 steps
//                  (20 quick), the p50 of each part and of the whole step
// Every kernel adds 1 to a counter, checked at the end.
// Options: --quick (200 launches), --nodes N (default 1000), --launches L (default 1000), --cap-s S.
#include "common.h"

__global__ void tiny(int *counter, int add) {
    if (threadIdx.x == 0) counter[0] += add;
}

using bench::Clock;

static int run(const bench::Args &args) {
    const bool quick = args.has("--quick");
    const int nodes = int(args.num("--nodes", 1000));
    const int launches = int(args.num("--launches", quick ? 200 : 1000));
    const int rounds = quick ? 5 : 20;
    const double cap = args.num("--cap-s", quick ? 10 : 30);

    CK(cudaFree(nullptr));
    bench::emit_meta("graph");
    int *d = bench::zeroed_counter();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    long long want = 0;
    // One launch outside the capture loads the kernel.
    tiny<<<1, 32, 0, s>>>(d, 1);
    want += 1;
    CK(cudaStreamSynchronize(s));

    bool ok = true;
    bench::section("graph_launch", [&] {
        auto t0 = Clock::now();
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < nodes; i++) tiny<<<1, 32, 0, s>>>(d, 1);
        cudaGraph_t g;
        CK(cudaStreamEndCapture(s, &g));
        double capture_ms = bench::us_between(t0, Clock::now()) / 1e3;
        size_t n = 0;
        CK(cudaGraphGetNodes(g, nullptr, &n));
        cudaGraphExec_t exec;
        t0 = Clock::now();
        CK(cudaGraphInstantiate(&exec, g, 0));
        double inst_ms = bench::us_between(t0, Clock::now()) / 1e3;

        for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(exec, s));  // warm-up
        CK(cudaStreamSynchronize(s));
        want += 3LL * nodes;
        std::vector<double> us, call_us;
        double end = bench::now_s() + cap;
        for (int i = 0; i < launches; i++) {
            auto a = Clock::now();
            CK(cudaGraphLaunch(exec, s));
            auto b = Clock::now();
            CK(cudaStreamSynchronize(s));
            auto c = Clock::now();
            us.push_back(bench::us_between(a, c));
            call_us.push_back(bench::us_between(a, b));
            if (bench::now_s() > end && i + 1 < launches) {
                bench::note("graph: stopped after %d of %d launches (%.0f s cap)", i + 1, launches, cap);
                break;
            }
        }
        want += (long long)us.size() * nodes;
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(g));
        auto st = bench::stats(us);
        auto call = bench::stats(call_us);
        bench::Json("graph_launch")
            .integer("nodes", (long long)n)
            .num("capture_ms", capture_ms)
            .num("instantiate_ms", inst_ms)
            .num("call_p50_us", call.p50)
            .lat(st)
            .emit();
        bench::note("graph: %zu nodes; capture %.2f ms, instantiate %.2f ms; launch + sync p50 %.1f us, p99 %.1f us "
                    "(%zu launches); the cudaGraphLaunch call alone p50 %.1f us",
                    n, capture_ms, inst_ms, st.p50, st.p99, st.n, call.p50);
    });

    bench::section("graph_vs_stream", [&] {
        std::vector<double> ms;
        for (int r = 0; r < rounds; r++) {
            auto t0 = Clock::now();
            for (int i = 0; i < nodes; i++) tiny<<<1, 32, 0, s>>>(d, 1);
            CK(cudaStreamSynchronize(s));
            ms.push_back(bench::us_between(t0, Clock::now()) / 1e3);
        }
        CK(cudaGetLastError());
        want += (long long)rounds * nodes;
        bench::Json("graph_vs_stream").integer("kernels", nodes).integer("rounds", rounds).num("p50_ms", bench::median(ms)).emit();
        bench::note("graph: the same %d kernels launched one by one + sync: median %.3f ms", nodes, bench::median(ms));
    });

    bench::section("graph_update", [&] {
        const int steps = quick ? 20 : 100;
        auto capture = [&](int add) {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < nodes; i++) tiny<<<1, 32, 0, s>>>(d, add);
            CK(cudaStreamEndCapture(s, &g));
            return g;
        };
        cudaGraph_t first = capture(1);
        cudaGraphExec_t exec;
        CK(cudaGraphInstantiate(&exec, first, 0));
        CK(cudaGraphDestroy(first));
        std::vector<double> capture_ms, update_ms, launch_ms, step_ms;
        for (int step = 0; step < steps; step++) {
            const int add = 1 + step % 2;
            auto t0 = Clock::now();
            cudaGraph_t g = capture(add);
            auto t1 = Clock::now();
            cudaGraphExecUpdateResultInfo info;
            CK(cudaGraphExecUpdate(exec, g, &info));
            if (info.result != cudaGraphExecUpdateSuccess) {
                bench::note("graph: update %d did not apply (result %d)", step, int(info.result));
                ok = false;
            }
            auto t2 = Clock::now();
            CK(cudaGraphLaunch(exec, s));
            CK(cudaStreamSynchronize(s));
            auto t3 = Clock::now();
            CK(cudaGraphDestroy(g));
            want += (long long)add * nodes;
            capture_ms.push_back(bench::us_between(t0, t1) / 1e3);
            update_ms.push_back(bench::us_between(t1, t2) / 1e3);
            launch_ms.push_back(bench::us_between(t2, t3) / 1e3);
            step_ms.push_back(bench::us_between(t0, t3) / 1e3);
        }
        CK(cudaGraphExecDestroy(exec));
        bench::Json("graph_update")
            .integer("nodes", nodes)
            .integer("steps", steps)
            .num("capture_p50_ms", bench::median(capture_ms))
            .num("update_p50_ms", bench::median(update_ms))
            .num("launch_p50_ms", bench::median(launch_ms))
            .num("step_p50_ms", bench::median(step_ms))
            .emit();
        bench::note("graph: %d steps of capture + update + launch + sync: p50 %.3f ms (capture %.3f, update %.3f, launch + sync %.3f)",
                    steps, bench::median(step_ms), bench::median(capture_ms), bench::median(update_ms), bench::median(launch_ms));
    });

    int got = 0;
    CK(cudaMemcpy(&got, d, sizeof(int), cudaMemcpyDeviceToHost));
    ok = ok && got == want;
    if (got != want) bench::note("graph: counter is %d, expected %lld", got, want);
    bench::Json("graph_check").boolean("ok", ok).emit();
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d));
    return ok ? 0 : 2;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

// launch_heavy: the launch-bound application. Each round launches 10,000 tiny kernels (one block of 32
// threads, two arguments; each adds to a counter) and then calls cudaDeviceSynchronize once. Reports the wall
// time per round (median and mean) and checks the counter at the end.
// Options: --rounds R (default 20, --quick 5), --launches L (default 10000), --cap-s S (stop early).
#include "common.h"

__global__ void tiny(int *counter, int add) {
    if (threadIdx.x == 0) counter[0] += add;
}

static int run(const bench::Args &args) {
    const bool quick = args.has("--quick");
    const int rounds = int(args.num("--rounds", quick ? 5 : 20));
    const int launches = int(args.num("--launches", 10000));
    const double cap = args.num("--cap-s", quick ? 10 : 30);

    CK(cudaFree(nullptr));
    bench::emit_meta("launch_heavy");
    int *d = bench::zeroed_counter();

    // warm-up round
    for (int i = 0; i < launches; i++) tiny<<<1, 32>>>(d, 1);
    CK(cudaDeviceSynchronize());

    std::vector<double> ms;
    double end = bench::now_s() + cap;
    for (int r = 0; r < rounds; r++) {
        auto t0 = bench::Clock::now();
        for (int i = 0; i < launches; i++) tiny<<<1, 32>>>(d, 1);
        CK(cudaDeviceSynchronize());
        ms.push_back(bench::us_between(t0, bench::Clock::now()) / 1e3);
        if (bench::now_s() > end && r + 1 < rounds) {
            bench::note("launch_heavy: stopped after %d of %d rounds (%.0f s cap)", r + 1, rounds, cap);
            break;
        }
    }
    CK(cudaGetLastError());
    int got = 0;
    CK(cudaMemcpy(&got, d, sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    long long want = (long long)(ms.size() + 1) * launches;
    bool ok = got == want;
    if (!ok) bench::note("launch_heavy: counter is %d, expected %lld", got, want);
    auto st = bench::stats(ms);
    double total = 0;
    for (double x : ms) total += x;
    bench::Json("launch_heavy")
        .integer("launches_per_round", launches)
        .integer("rounds", (long long)ms.size())
        .num("round_p50_ms", st.p50)
        .num("round_mean_ms", st.mean)
        .num("round_min_ms", st.min)
        .num("round_max_ms", st.max)
        .num("total_s", total / 1e3)
        .num("per_launch_us", st.mean * 1e3 / launches)
        .boolean("ok", ok)
        .emit();
    bench::note(
        "launch_heavy: %zu rounds of %d launches + sync: median %.2f ms, mean %.2f ms per round (%.2f us per "
        "launch)",
        ms.size(), launches, st.p50, st.mean, st.mean * 1e3 / launches);
    return ok ? 0 : 2;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

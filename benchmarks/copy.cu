// copy: synchronous cudaMemcpy latency and bandwidth.
//   copy_verify  data integrity of H2D/D2D/D2H round trips (pinned and pageable) before anything is timed
//   copy_4k      4 KiB cudaMemcpy latency, H2D and D2H, pinned and pageable (p50/p99/p99.9)
//   copy         bandwidth sweep over sizes 4 B .. 256 MiB (powers of 4): pinned and pageable H2D and D2H,
//                and D2D (cudaMemcpy + cudaDeviceSynchronize, since a D2D cudaMemcpy may return early);
//                per size the median of several timed repetitions after a warm-up, reported in GB/s (1e9 B/s)
// Pinned memory is cudaMallocHost; pageable memory is malloc'd and touched before timing.
// Options: --quick (fewer sizes and repetitions), --max-bytes N (largest size, default 256 MiB).
#include "common.h"

using bench::Clock;

struct Buffers {
    size_t max = 0, pinned_max = 0;
    unsigned char *pageable_a = nullptr, *pageable_b = nullptr, *pinned = nullptr;
    void *dev_a = nullptr, *dev_b = nullptr;
};

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 2654435761u + seed) >> 7);
}

// Without pinned memory (cudaMallocHost failed), pageable buffers stand in for it here.
static bool verify(Buffers &b, size_t n) {
    if (b.pinned && n > b.pinned_max) n = b.pinned_max;
    unsigned char *host = b.pinned ? b.pinned : b.pageable_b;
    bool ok = true;
    // pageable -> device -> device -> pinned
    fill(b.pageable_a, n, 11);
    memset(host, 0, n);
    CK(cudaMemcpy(b.dev_a, b.pageable_a, n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.dev_b, b.dev_a, n, cudaMemcpyDeviceToDevice));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(host, b.dev_b, n, cudaMemcpyDeviceToHost));
    if (memcmp(host, b.pageable_a, n)) {
        bench::note("copy_verify: pageable H2D -> D2D -> pinned D2H of %zu bytes differs", n);
        ok = false;
    }
    // pinned -> device -> pageable
    host = b.pinned ? b.pinned : b.pageable_a;
    fill(host, n, 99);
    memset(b.pageable_b, 0, n);
    CK(cudaMemcpy(b.dev_a, host, n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.pageable_b, b.dev_a, n, cudaMemcpyDeviceToHost));
    if (memcmp(b.pageable_b, host, n)) {
        bench::note("copy_verify: pinned H2D -> pageable D2H of %zu bytes differs", n);
        ok = false;
    }
    return ok;
}

struct Series {
    const char *mem, *dir;
};

static void copy_once(Buffers &b, const Series &s, size_t n) {
    bool pinned = !strcmp(s.mem, "pinned");
    if (!strcmp(s.dir, "H2D")) {
        CK(cudaMemcpy(b.dev_a, pinned ? b.pinned : b.pageable_a, n, cudaMemcpyHostToDevice));
    } else if (!strcmp(s.dir, "D2H")) {
        CK(cudaMemcpy(pinned ? b.pinned : b.pageable_b, b.dev_a, n, cudaMemcpyDeviceToHost));
    } else {
        CK(cudaMemcpy(b.dev_b, b.dev_a, n, cudaMemcpyDeviceToDevice));
        CK(cudaDeviceSynchronize());
    }
}

static int run(const bench::Args &args) {
    const bool quick = args.has("--quick");
    Buffers b;
    b.max = size_t(args.num("--max-bytes", 256.0 * 1024 * 1024));

    CK(cudaFree(nullptr));
    bench::emit_meta("copy");

    b.pageable_a = (unsigned char *)malloc(b.max);
    b.pageable_b = (unsigned char *)malloc(b.max);
    if (!b.pageable_a || !b.pageable_b) {
        bench::note("malloc of %zu bytes failed", b.max);
        return 1;
    }
    memset(b.pageable_a, 1, b.max);
    memset(b.pageable_b, 2, b.max);
    // Pinned memory may be limited (a shared-memory segment of a fixed size): take the largest power of
    // two that can be had, and sweep pinned copies only up to it.
    for (size_t n = b.max; n >= (1u << 20); n /= 2) {
        void *p = nullptr;
        if (cudaMallocHost(&p, n) == cudaSuccess) {
            b.pinned = (unsigned char *)p;
            b.pinned_max = n;
            break;
        }
        cudaGetLastError();
    }
    if (!b.pinned) {
        bench::note("cudaMallocHost failed for every size from %zu bytes down to 1 MiB: no pinned copies", b.max);
        bench::Json("copy").str("mem", "pinned").str("error", "cudaMallocHost failed").emit();
    } else {
        if (b.pinned_max < b.max)
            bench::note("cudaMallocHost(%zu) failed; pinned sweep stops at %zu bytes", b.max, b.pinned_max);
        memset(b.pinned, 3, b.pinned_max);
    }
    CK(cudaMalloc(&b.dev_a, b.max));
    CK(cudaMalloc(&b.dev_b, b.max));
    CK(cudaMemset(b.dev_a, 0, b.max));
    CK(cudaMemset(b.dev_b, 0, b.max));
    CK(cudaDeviceSynchronize());

    bool ok = verify(b, (4u << 20) + 3) && verify(b, b.max);
    bench::Json("copy_verify").boolean("ok", ok).integer("max_bytes", (long long)b.max).emit();
    if (!ok) return 2;

    const Series series[] = {
        {"pinned", "H2D"}, {"pinned", "D2H"}, {"pageable", "H2D"}, {"pageable", "D2H"}, {"device", "D2D"}};

    // --- 4 KiB latency ---
    {
        const int iters = quick ? 1000 : 5000;
        for (const Series &s : series) {
            if (!strcmp(s.dir, "D2D") || (!strcmp(s.mem, "pinned") && !b.pinned)) continue;
            bench::section("copy_4k", [&] {
                for (int i = 0; i < 100; i++) copy_once(b, s, 4096);
                std::vector<double> us;
                double end = bench::now_s() + (quick ? 1.5 : 3.0);
                for (int i = 0; i < iters; i++) {
                    auto t0 = Clock::now();
                    copy_once(b, s, 4096);
                    us.push_back(bench::us_between(t0, Clock::now()));
                    if ((i & 63) == 63 && bench::now_s() > end) break;
                }
                auto st = bench::stats(us);
                bench::Json("copy_4k").str("mem", s.mem).str("dir", s.dir).integer("bytes", 4096).lat(st).emit();
                bench::note("4 KiB %s %s: p50 %.2f us, p99 %.2f us", s.mem, s.dir, st.p50, st.p99);
            });
        }
    }

    // --- bandwidth sweep ---
    std::vector<size_t> sizes;
    for (size_t n = 4; n <= b.max; n *= 4)
        if (!quick || n == 4 || n >= (64u << 20) || ((63 - __builtin_clzll(n)) % 4) == 2) sizes.push_back(n);
    const double budget = quick ? 256.0 * 1024 * 1024 : 1024.0 * 1024 * 1024;  // bytes per point
    const int min_reps = quick ? 3 : 5, max_reps = quick ? 30 : 100;
    const double cap_s = quick ? 1.0 : 3.0;
    for (const Series &s : series) {
        bench::note("%s %s:", s.mem, s.dir);
        bench::section("copy", [&] {
            for (size_t n : sizes) {
                if (!strcmp(s.mem, "pinned") && n > b.pinned_max) continue;
                int reps = int(std::min<double>(max_reps, std::max<double>(min_reps, budget / double(n))));
                int warm = n >= (16u << 20) ? 1 : 3;
                for (int i = 0; i < warm; i++) copy_once(b, s, n);
                std::vector<double> us;
                double end = bench::now_s() + cap_s;
                for (int i = 0; i < reps; i++) {
                    auto t0 = Clock::now();
                    copy_once(b, s, n);
                    us.push_back(bench::us_between(t0, Clock::now()));
                    if (i + 1 >= 2 && bench::now_s() > end) break;
                }
                auto st = bench::stats(us);
                double gbps = double(n) / (st.p50 * 1e-6) / 1e9;
                bench::Json("copy")
                    .str("mem", s.mem)
                    .str("dir", s.dir)
                    .integer("bytes", (long long)n)
                    .integer("reps", (long long)st.n)
                    .num("median_us", st.p50)
                    .num("min_us", st.min)
                    .num("max_us", st.max)
                    .num("gbps", gbps)
                    .num("best_gbps", double(n) / (st.min * 1e-6) / 1e9)
                    .emit();
                bench::note("  %10s  %9.2f us  %8.3f GB/s  (%zu reps)", bench::human_bytes(n).c_str(), st.p50, gbps,
                            st.n);
            }
        });
    }

    CK(cudaFree(b.dev_a));
    CK(cudaFree(b.dev_b));
    if (b.pinned) CK(cudaFreeHost(b.pinned));
    free(b.pageable_a);
    free(b.pageable_b);
    return 0;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

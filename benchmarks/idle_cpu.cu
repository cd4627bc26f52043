// idle_cpu MODE: what waiting and idling cost in CPU time. The harness drives it over stdin/stdout:
// the program prints {"mark":"ready"} when it is set up and then waits for a line on stdin before the
// measured part, so the harness can sample the server's CPU time at the same moments.
//   blocked  one 2 s kernel and cudaDeviceSynchronize, started on "go": the process's CPU time over the
//            call (a native CUDA app spins in the driver; Flyt's shim should sleep)
//   bursts   on "go": 5 bursts of 100 empty launches + cudaDeviceSynchronize, one per second; the
//            process's CPU time in the gaps between bursts, whole and from 50 ms after each burst
//   idle     a burst, then {"mark":"ready"}; the process's CPU time between the "start" and "stop"
//            lines on stdin (the harness keeps the session idle in between)
// Results: one JSON line (bench idle_blocked / idle_bursts / idle_session) with cpu_s, wall_s and
// cpu_pct (percent of one core). The process's CPU time includes every thread (the shim's or the
// driver's helper threads too).
#include "common.h"

#include <unistd.h>

__global__ void empty_kernel() {}

__global__ void spin_ns(unsigned long long ns) {
    unsigned long long start, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - start < ns);
}

static void mark(const char *what) {
    printf("{\"mark\":\"%s\"}\n", what);
    fflush(stdout);
}

// Blocks until a line arrives on stdin (or EOF): the main thread sleeps in read().
static std::string wait_line() {
    std::string s;
    char c;
    while (read(0, &c, 1) == 1) {
        if (c == '\n') break;
        s += c;
    }
    return s;
}

static void burst(int n) {
    for (int i = 0; i < n; i++) empty_kernel<<<1, 1>>>();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
}

static void sleep_until(double t) {
    double now = bench::now_s();
    if (t > now) usleep((useconds_t)((t - now) * 1e6));
}

static int run(const bench::Args &args) {
    const char *mode = args.argc > 1 ? args.argv[1] : "";
    CK(cudaFree(nullptr));
    spin_ns<<<1, 1>>>(1000);  // loads the module
    CK(cudaGetLastError());
    burst(100);

    if (!strcmp(mode, "blocked")) {
        mark("ready");
        wait_line();
        double c0 = bench::process_cpu_s(), w0 = bench::now_s();
        spin_ns<<<1, 1>>>(2000000000ull);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        double c1 = bench::process_cpu_s(), w1 = bench::now_s();
        bench::Json("idle_blocked")
            .num("cpu_s", c1 - c0)
            .num("wall_s", w1 - w0)
            .num("cpu_pct", 100.0 * (c1 - c0) / (w1 - w0))
            .emit();
    } else if (!strcmp(mode, "bursts")) {
        mark("ready");
        wait_line();
        const int bursts = 5;
        double gap_cpu = 0, gap_wall = 0, late_cpu = 0, late_wall = 0, burst_ms = 0;
        double t0 = bench::now_s();
        for (int b = 0; b < bursts; b++) {
            double bs = bench::now_s();
            burst(100);
            double be = bench::now_s(), c_end = bench::process_cpu_s();
            burst_ms += (be - bs) * 1e3;
            if (b == bursts - 1) break;
            sleep_until(be + 0.050);
            double c_late = bench::process_cpu_s(), w_late = bench::now_s();
            sleep_until(t0 + (b + 1) * 1.0);
            double c_next = bench::process_cpu_s(), w_next = bench::now_s();
            gap_cpu += c_next - c_end;
            gap_wall += w_next - be;
            late_cpu += c_next - c_late;
            late_wall += w_next - w_late;
        }
        bench::Json("idle_bursts")
            .integer("bursts", bursts)
            .integer("launches_per_burst", 100)
            .num("burst_ms_mean", burst_ms / bursts)
            .num("gap_cpu_s", gap_cpu)
            .num("gap_wall_s", gap_wall)
            .num("gap_cpu_pct", 100.0 * gap_cpu / gap_wall)
            .num("after50_cpu_s", late_cpu)
            .num("after50_wall_s", late_wall)
            .num("after50_cpu_pct", 100.0 * late_cpu / late_wall)
            .emit();
    } else if (!strcmp(mode, "idle")) {
        mark("ready");
        wait_line();  // "start"
        double c0 = bench::process_cpu_s(), w0 = bench::now_s();
        wait_line();  // "stop"
        double c1 = bench::process_cpu_s(), w1 = bench::now_s();
        burst(10);  // the session still works
        bench::Json("idle_session")
            .num("cpu_s", c1 - c0)
            .num("wall_s", w1 - w0)
            .num("cpu_pct", 100.0 * (c1 - c0) / (w1 - w0))
            .emit();
    } else {
        bench::note("usage: idle_cpu blocked|bursts|idle");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) { return bench::guarded_main(argc, argv, run); }

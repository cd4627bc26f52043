// Shared helpers for the Flyt benchmark programs: timing, statistics, JSON lines, argument parsing.
//
// Every program prints its results as one JSON object per line on stdout (flushed after each line, so a
// run killed by a timeout still leaves what it measured) and its human commentary on stderr. Timings are
// taken in the program with std::chrono::steady_clock around each iteration.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <time.h>

namespace bench {

using Clock = std::chrono::steady_clock;

inline double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

inline double us_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
}

inline double thread_cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

inline double process_cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Commentary goes to stderr.
inline void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

// A failed CUDA call throws; `section` catches it, reports {"bench":NAME,"error":...} and lets the program go
// on with its next benchmark, and `guarded_main` turns an uncaught failure into exit status 1. The harness
// records the exit status and the stderr tail.
struct CudaFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

inline std::string fail_msg(const char *call, const char *file, int line, cudaError_t e) {
    char b[512];
    snprintf(b, sizeof b, "%s:%d: %s failed: %s (%d)", file, line, call, cudaGetErrorString(e), int(e));
    return b;
}

#define CK(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t ck_err_ = (call);                                                                              \
        if (ck_err_ != cudaSuccess) throw bench::CudaFailure(bench::fail_msg(#call, __FILE__, __LINE__, ck_err_)); \
    } while (0)

// --- statistics over per-iteration samples ---------------------------------------------------------

// Linear interpolation between closest ranks (numpy's default), on a sorted vector.
inline double pct_sorted(const std::vector<double> &s, double p) {
    if (s.empty()) return NAN;
    if (s.size() == 1) return s[0];
    double pos = p / 100.0 * double(s.size() - 1);
    size_t lo = size_t(std::floor(pos));
    size_t hi = std::min(lo + 1, s.size() - 1);
    double f = pos - double(lo);
    return s[lo] * (1.0 - f) + s[hi] * f;
}

struct Stats {
    size_t n = 0;
    double min = NAN, p50 = NAN, p90 = NAN, p99 = NAN, p999 = NAN, max = NAN, mean = NAN;
    std::vector<double> sorted;
};

inline Stats stats(std::vector<double> v) {
    Stats s;
    std::sort(v.begin(), v.end());
    s.n = v.size();
    if (v.empty()) return s;
    double sum = 0;
    for (double x : v) sum += x;
    s.mean = sum / double(v.size());
    s.min = v.front();
    s.max = v.back();
    s.p50 = pct_sorted(v, 50);
    s.p90 = pct_sorted(v, 90);
    s.p99 = pct_sorted(v, 99);
    s.p999 = pct_sorted(v, 99.9);
    s.sorted = std::move(v);
    return s;
}

inline double median(std::vector<double> v) { return stats(std::move(v)).p50; }

// --- JSON lines ------------------------------------------------------------------------------------

class Json {
  public:
    explicit Json(const char *bench) { str("bench", bench); }
    Json &str(const char *k, const std::string &v) {
        key(k);
        s_ += '"';
        for (char c : v) {
            if (c == '"' || c == '\\') {
                s_ += '\\';
                s_ += c;
            } else if (static_cast<unsigned char>(c) < 0x20) {
                char b[8];
                snprintf(b, sizeof b, "\\u%04x", c);
                s_ += b;
            } else {
                s_ += c;
            }
        }
        s_ += '"';
        return *this;
    }
    Json &num(const char *k, double v) {
        key(k);
        s_ += fmt(v);
        return *this;
    }
    Json &integer(const char *k, long long v) {
        key(k);
        s_ += std::to_string(v);
        return *this;
    }
    Json &boolean(const char *k, bool v) {
        key(k);
        s_ += v ? "true" : "false";
        return *this;
    }
    Json &arr(const char *k, const std::vector<double> &v) {
        key(k);
        s_ += '[';
        for (size_t i = 0; i < v.size(); i++) {
            if (i) s_ += ',';
            s_ += fmt(v[i]);
        }
        s_ += ']';
        return *this;
    }
    // p50/p90/p99/p99.9/min/max/mean of a latency sample in microseconds, with the given prefix-less names.
    Json &lat(const Stats &s) {
        integer("n", (long long)s.n);
        num("p50_us", s.p50).num("p90_us", s.p90).num("p99_us", s.p99).num("p999_us", s.p999);
        num("min_us", s.min).num("max_us", s.max).num("mean_us", s.mean);
        return *this;
    }
    // The latency distribution on a fixed percentile grid (for the harness's plots).
    Json &cdf(const Stats &s) {
        std::vector<double> ps, vs;
        for (int i = 0; i <= 198; i++) ps.push_back(i * 0.5);
        const double tail[] = {99.2, 99.4, 99.5, 99.6, 99.7, 99.8, 99.9, 99.95, 99.99, 100.0};
        for (double p : tail) ps.push_back(p);
        for (double p : ps) vs.push_back(pct_sorted(s.sorted, p));
        arr("cdf_p", ps);
        arr("cdf_us", vs);
        return *this;
    }
    void emit() {
        s_ += '}';
        fputs(s_.c_str(), stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }

  private:
    void key(const char *k) {
        s_ += s_.empty() ? '{' : ',';
        s_ += '"';
        s_ += k;
        s_ += "\":";
    }
    static std::string fmt(double v) {
        if (!std::isfinite(v)) return "null";
        char b[64];
        snprintf(b, sizeof b, "%.6g", v);
        return b;
    }
    std::string s_;
};

// --- arguments --------------------------------------------------------------------------------------

struct Args {
    int argc;
    char **argv;
    bool has(const char *flag) const {
        for (int i = 1; i < argc; i++)
            if (!strcmp(argv[i], flag)) return true;
        return false;
    }
    double num(const char *flag, double dflt) const {
        for (int i = 1; i + 1 < argc; i++)
            if (!strcmp(argv[i], flag)) return atof(argv[i + 1]);
        return dflt;
    }
    const char *str(const char *flag, const char *dflt) const {
        for (int i = 1; i + 1 < argc; i++)
            if (!strcmp(argv[i], flag)) return argv[i + 1];
        return dflt;
    }
};

// One line describing the device and the runtime, from every program. Calls that a shim might not
// support yet are tolerated: the field is left out.
inline void emit_meta(const char *program) {
    Json j("meta");
    j.str("program", program);
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
        j.str("gpu", p.name);
        j.integer("cc_major", p.major).integer("cc_minor", p.minor);
        j.integer("sms", p.multiProcessorCount);
        j.num("mem_mib", double(p.totalGlobalMem) / 1048576.0);
    }
    cudaGetLastError();
    int v = 0;
    if (cudaRuntimeGetVersion(&v) == cudaSuccess) j.integer("runtime_version", v);
    cudaGetLastError();
    if (cudaDriverGetVersion(&v) == cudaSuccess) j.integer("driver_version", v);
    cudaGetLastError();
    j.emit();
}

// One int of device memory, set to 0: the counter the launch-bound benchmarks' kernels add to.
inline int *zeroed_counter() {
    int *d;
    CK(cudaMalloc(&d, sizeof(int)));
    CK(cudaMemset(d, 0, sizeof(int)));
    return d;
}

// Runs one benchmark; a CUDA failure in it is reported as {"bench":name,"error":...} and returns false.
template <class F>
bool section(const char *name, F f) {
    try {
        f();
        return true;
    } catch (const CudaFailure &e) {
        note("%s: %s", name, e.what());
        Json(name).str("error", e.what()).emit();
        cudaGetLastError();
        return false;
    }
}

inline int guarded_main(int argc, char **argv, int (*run)(const Args &)) {
    try {
        return run(Args{argc, argv});
    } catch (const std::exception &e) {
        note("%s: %s", argv[0], e.what());
        fflush(stdout);
        return 1;
    }
}

inline std::string human_bytes(size_t b) {
    char s[32];
    if (b >= (1ull << 30) && b % (1ull << 30) == 0)
        snprintf(s, sizeof s, "%zu GiB", b >> 30);
    else if (b >= (1ull << 20) && b % (1ull << 20) == 0)
        snprintf(s, sizeof s, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(s, sizeof s, "%zu KiB", b >> 10);
    else
        snprintf(s, sizeof s, "%zu B", b);
    return s;
}

}  // namespace bench

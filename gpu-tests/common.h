// Shared helpers for the gpu-tests programs.
//
// Rules every program follows (the runner compares native and Flyt stdout byte for byte):
//  - stdout is deterministic: no pointer values, no timings, no thread-interleaving-dependent order;
//    timings, if printed at all, go to stderr;
//  - every CUDA call is checked: an unexpected failure prints `FAIL: <what>: <cudaGetErrorName>` and
//    exits 1;
//  - the last line is `<name>: PASS` (exit 0) or `<name>: FAIL (<n> checks failed)` (exit 1).
#pragma once

#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

static const char *g_test_name = "test";
static int g_failures = 0;

static inline void test_init(const char *name) {
    g_test_name = name;
    // Line buffered even when stdout is a file, so a crash loses nothing already printed.
    setvbuf(stdout, NULL, _IOLBF, 0);
}

// Fatal: an unexpected CUDA failure ends the program (the context may be unusable).
#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t check_e_ = (call);                                                     \
        if (check_e_ != cudaSuccess) {                                                     \
            printf("FAIL: %s (line %d): %s\n", #call, __LINE__, cudaGetErrorName(check_e_)); \
            printf("%s: FAIL\n", g_test_name);                                             \
            fflush(stdout);                                                                \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

// Kernel launch check: the launch itself (configuration) must have been accepted.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

// CHECK of one release call over several handles, in order: `CHECK_EACH(cudaFree, a, b, c)` is
// `CHECK(cudaFree(a)); CHECK(cudaFree(b)); CHECK(cudaFree(c));` (a failure names the call and the
// whole list).
template <typename T> struct check_each_arg {
    using type = T;
};
template <typename T>
static inline void check_each_impl(cudaError_t (*release)(T), const char *what, int line,
                                   std::initializer_list<typename check_each_arg<T>::type> handles) {
    for (T h : handles) {
        cudaError_t e = release(h);
        if (e != cudaSuccess) {
            printf("FAIL: %s (line %d): %s\n", what, line, cudaGetErrorName(e));
            printf("%s: FAIL\n", g_test_name);
            fflush(stdout);
            exit(1);
        }
    }
}
#define CHECK_EACH(release, ...) check_each_impl(release, #release "(" #__VA_ARGS__ ")", __LINE__, {__VA_ARGS__})

// Non-fatal host-side expectation: records a failure and goes on.
static inline bool expect_impl(bool ok, int line, const char *fmt, ...) {
    if (!ok) {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL: ");
        vprintf(fmt, ap);
        printf(" (line %d)\n", line);
        va_end(ap);
        g_failures++;
    }
    return ok;
}
#define EXPECT(cond, ...) expect_impl((cond), __LINE__, __VA_ARGS__)

// An expected CUDA error: prints `<what>: <name>` and checks it is the expected one.
static inline bool expect_err(const char *what, cudaError_t got, cudaError_t want) {
    printf("%s: %s\n", what, cudaGetErrorName(got));
    if (got != want) {
        printf("FAIL: %s: expected %s, got %s\n", what, cudaGetErrorName(want), cudaGetErrorName(got));
        g_failures++;
        return false;
    }
    return true;
}

// An error whose exact code the program does not pin (the native run is the reference; the runner
// compares the printed name): prints `<what>: <name>` and only checks that it is not cudaSuccess.
static inline bool expect_some_err(const char *what, cudaError_t got) {
    printf("%s: %s\n", what, cudaGetErrorName(got));
    if (got == cudaSuccess) {
        printf("FAIL: %s: expected an error, got cudaSuccess\n", what);
        g_failures++;
        return false;
    }
    return true;
}

// Prints `<what>: <name>` without judging it: the native run is the reference.
static inline cudaError_t report(const char *what, cudaError_t got) {
    printf("%s: %s\n", what, cudaGetErrorName(got));
    return got;
}

static inline const char *yes(bool b) { return b ? "yes" : "no"; }

// Copies n ints of device memory d back and frees d; counts the values v[i] != want(i).
template <typename Want> static inline int wrong_ints_then_free(int *d, int n, Want want) {
    std::vector<int> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (h[i] != want(i)) bad++;
    return bad;
}

static inline int test_finish() {
    if (g_failures == 0) {
        printf("%s: PASS\n", g_test_name);
        return 0;
    }
    printf("%s: FAIL (%d checks failed)\n", g_test_name, g_failures);
    return 1;
}

// For the programs about two devices: prints "devices: N" and, with fewer than two, that there is
// nothing between devices to test; the count.
static inline int printed_device_count() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    printf("devices: %d\n", count);
    if (count < 2) printf("one device: nothing between devices to test\n");
    return count;
}

// Deterministic byte pattern: depends on the index and a seed, never periodic in small powers of two.
static inline uint8_t pattern_byte(size_t i, uint32_t seed) {
    uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ (seed * 0x9E3779B9u);
    x ^= x >> 15;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    return (uint8_t)(x ^ (x >> 8));
}

static inline void fill_pattern(void *p, size_t n, uint32_t seed) {
    uint8_t *b = (uint8_t *)p;
    for (size_t i = 0; i < n; i++) b[i] = pattern_byte(i, seed);
}

// Returns the index of the first byte that differs from the pattern, or n when all match.
static inline size_t check_pattern(const void *p, size_t n, uint32_t seed) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != pattern_byte(i, seed)) return i;
    return n;
}

#ifdef __CUDACC__
// Nanosecond GPU clock: spins last the same wall time whatever the SM clock.
static __device__ __forceinline__ unsigned long long gpu_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One thread spins for `ns` nanoseconds of GPU time, then stores `value` to *out (when out != 0).
static __global__ void spin_kernel(unsigned long long ns, int *out, int value) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned long long start = gpu_ns();
        while (gpu_ns() - start < ns) {
        }
        if (out) *out = value;
    }
}
#endif

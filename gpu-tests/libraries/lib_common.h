// Helpers for the library programs: a fixed pseudo-random source (same inputs natively and through
// Flyt), the library status checks, and tolerance checks that print only yes/no (library kernels
// may pick algorithms whose rounding differs between runs; the verdict must not).
#pragma once
#include "../common.h"

#include <cmath>

static inline float lib_rand(uint32_t &state) {
    state = state * 1664525u + 1013904223u;
    return (float)((state >> 8) & 0xFFFF) / 65536.0f - 0.5f;
}

// A library call returning a status where 0 means success: a failure ends the program.
#define CHECK_LIB(call)                                                                   \
    do {                                                                                  \
        long long lib_status_ = (long long)(call);                                        \
        if (lib_status_ != 0) {                                                           \
            printf("FAIL: %s (line %d): status %lld\n", #call, __LINE__, lib_status_);    \
            printf("%s: FAIL\n", g_test_name);                                            \
            fflush(stdout);                                                               \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

// Largest |got - want| / max(1, |want|) over n values.
static inline double max_rel_error(const float *got, const float *want, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double denom = fabs((double)want[i]) > 1.0 ? fabs((double)want[i]) : 1.0;
        double e = fabs((double)got[i] - (double)want[i]) / denom;
        if (!(e <= worst)) worst = e;  // NaN counts as the worst
    }
    return worst;
}

// Prints `<what> within <tol>: yes|no` and records a failure for no.
static inline void expect_close(const char *what, const float *got, const float *want, size_t n, double tol) {
    double e = max_rel_error(got, want, n);
    printf("%s within %g: %s\n", what, tol, e <= tol ? "yes" : "no");
    if (!(e <= tol)) {
        printf("FAIL: %s: max relative error %g\n", what, e);
        g_failures++;
    }
}

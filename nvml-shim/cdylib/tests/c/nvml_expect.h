// What the NVML test programs share: a failure count, EXPECT (a call's return code against the
// one expected) and CHECK (a condition, with a printf-style message when it fails), each failure
// printed with its line and counted.
#pragma once

#include <stdio.h>

static int failures = 0;

#define EXPECT(call, expected)                                                                  \
    do {                                                                                        \
        int got_ = (int)(call);                                                                 \
        if (got_ != (int)(expected)) {                                                          \
            printf("FAIL line %d: %s = %d, expected %d\n", __LINE__, #call, got_, (int)(expected)); \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

#define CHECK(cond, ...)                        \
    do {                                        \
        if (!(cond)) {                          \
            printf("FAIL line %d: ", __LINE__); \
            printf(__VA_ARGS__);                \
            printf("\n");                       \
            failures++;                         \
        }                                       \
    } while (0)

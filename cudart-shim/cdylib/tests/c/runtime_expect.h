// What the runtime-API test programs that print a line per check share: a failure count and
// EXPECT, which prints "ok: WHAT" or "FAILED: WHAT (line N)" and counts a failure.
#pragma once

#include <stdio.h>

static int failures = 0;

#define EXPECT(what, cond)                                                    \
    do {                                                                      \
        if (cond) {                                                           \
            printf("ok: %s\n", what);                                         \
        } else {                                                              \
            printf("FAILED: %s (line %d)\n", what, __LINE__);                 \
            failures++;                                                       \
        }                                                                     \
    } while (0)

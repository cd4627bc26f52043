// Bytes as hexadecimal text and back: how the IPC programs pass handles on a command line or a pipe
// to the second process of themselves that they start (own_path).
#pragma once

#include <unistd.h>

#include <cstdio>

// Writes 2 * len hex digits and a NUL to `out`.
static void to_hex(const void *bytes, size_t len, char *out) {
    const unsigned char *b = (const unsigned char *)bytes;
    for (size_t i = 0; i < len; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void from_hex(const char *text, void *bytes, size_t len) {
    unsigned char *b = (unsigned char *)bytes;
    for (size_t i = 0; i < len; i++) sscanf(text + 2 * i, "%2hhx", &b[i]);
}

// This program's own path, to start a second process of it; false (after a FAIL line) when
// /proc/self/exe cannot be read.
static bool own_path(char *self, size_t size) {
    ssize_t len = readlink("/proc/self/exe", self, size - 1);
    if (len <= 0) {
        printf("FAIL: readlink /proc/self/exe\n");
        return false;
    }
    self[len] = 0;
    return true;
}

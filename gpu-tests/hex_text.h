// Bytes as hexadecimal text and back: how the IPC programs pass handles on a command line or a pipe.
#pragma once

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

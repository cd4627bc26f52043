// remote_copy: bulk copy bandwidth through whatever channel the session uses (native, or Flyt over
// TCP, a Unix socket or shared memory), for the sizes given: synchronous cuMemcpyHtoD/DtoH of pinned
// (cuMemAllocHost) and pageable memory, each timed REPS times after a warm-up, the bytes checked
// once per case. Prints one line per case: `bw LABEL MEM DIR BYTES median_gbps best_gbps`
// (GB/s = 1e9 B/s), then `remote_copy done`.
// Usage: remote_copy LABEL REPS SIZE[,SIZE...] [DATA]   (SIZE with K/M/G suffixes, powers of 1024)
// DATA: what the buffers hold: `pattern` (default; repeats every 256 bytes within 8 KiB runs),
// `weights` (bf16 values of a normal distribution, sigma 0.02, as in a checkpoint) or `random`.
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "copy_timing.h"

static void report(const char *label, const char *mem, const char *dir, size_t bytes, double *seconds, int reps) {
    qsort(seconds, reps, sizeof *seconds, by_value);
    printf("bw %s %s %s %zu %.3f %.3f\n", label, mem, dir, bytes, bytes / seconds[reps / 2] / 1e9, bytes / seconds[0] / 1e9);
    fflush(stdout);
}

static size_t parse_size(const char *text) {
    char *end;
    size_t value = strtoull(text, &end, 10);
    switch (*end) {
        case 'K': case 'k': return value << 10;
        case 'M': case 'm': return value << 20;
        case 'G': case 'g': return value << 30;
        default: return value;
    }
}

static uint64_t next_random(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static void fill(unsigned char *p, size_t n, const char *data) {
    uint64_t state = 0x9E3779B97F4A7C15ull;
    if (!strcmp(data, "random")) {
        for (size_t i = 0; i + 8 <= n; i += 8) {
            uint64_t v = next_random(&state);
            memcpy(p + i, &v, 8);
        }
        for (size_t i = n & ~(size_t)7; i < n; i++) p[i] = (unsigned char)next_random(&state);
    } else if (!strcmp(data, "weights")) {
        for (size_t i = 0; i + 2 <= n; i += 2) {
            // Sum of 4 uniforms: close to normal; scaled to sigma 0.02, then bf16 (the float's top half).
            double u = 0;
            for (int k = 0; k < 4; k++) u += (double)(next_random(&state) >> 11) / 9007199254740992.0;
            float w = (float)((u - 2.0) * 0.0346);
            uint32_t bits;
            memcpy(&bits, &w, 4);
            uint16_t bf16 = (uint16_t)(bits >> 16);
            memcpy(p + i, &bf16, 2);
        }
    } else {
        for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + (i >> 20));
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: remote_copy LABEL REPS SIZE[,SIZE...] [pattern|weights|random]\n");
        return 2;
    }
    const char *label = argv[1], *data = argc > 4 ? argv[4] : "pattern";
    int reps = atoi(argv[2]);
    if (reps < 1 || reps > 1000) reps = 5;
    size_t sizes[16], count = 0, largest = 0;
    for (char *token = strtok(argv[3], ","); token && count < 16; token = strtok(NULL, ",")) {
        sizes[count] = parse_size(token);
        if (sizes[count] > largest) largest = sizes[count];
        count++;
    }
    double *seconds = calloc(reps, sizeof *seconds);
    CUdeviceptr dev;
    unsigned char *pinned, *pageable = malloc(largest), *back = malloc(largest);
    if (copy_buffers(largest, &dev, &pinned)) return 1;
    fill(pageable, largest, data);
    memcpy(pinned, pageable, largest);
    for (size_t k = 0; k < count; k++) {
        if (time_copies(label, dev, pinned, pageable, back, sizes[k], seconds, reps, report)) return 1;
    }
    printf("remote_copy done\n");
    return 0;
}

// Probe: where does the CUDA driver put device addresses, and can a process steer it away from
// an address range? (Flyt's server allocates; its addresses must not be host memory of the app.)
// Prints the pointers cuMemAlloc returns, the process's mappings around them, and what happens
// to later allocations after (a) an mmap(PROT_NONE) reservation and (b) a cuMemAddressReserve
// covering the place the next allocation would go.
//   nvcc -o va_layout_probe va_layout_probe.c -lcuda && ./va_layout_probe [--list]
// --list: only the allocations' addresses, one line each (`device-addresses.sh` runs it through Flyt).
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CHECK(call)                                                            \
    do {                                                                       \
        CUresult r_ = (call);                                                  \
        if (r_ != CUDA_SUCCESS) {                                              \
            printf("%s failed: %d\n", #call, (int)r_);                         \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

// The mapping of /proc/self/maps holding addr, printed; or "unmapped".
static void where(const char *what, uint64_t addr) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    while (fgets(line, sizeof line, maps)) {
        unsigned long long start, end;
        if (sscanf(line, "%llx-%llx", &start, &end) == 2 && addr >= start && addr < end) {
            printf("  %-28s %#llx in %s", what, (unsigned long long)addr, line);
            fclose(maps);
            return;
        }
    }
    fclose(maps);
    printf("  %-28s %#llx unmapped in this process\n", what, (unsigned long long)addr);
}

static void summary(const char *when) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long long total = 0, biggest = 0, count = 0, big_start = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long long start, end;
        if (sscanf(line, "%llx-%llx", &start, &end) == 2) {
            count++;
            total += end - start;
            if (end - start > biggest && start < 0x7ff000000000ULL) {
                biggest = end - start;
                big_start = start;
            }
        }
    }
    fclose(maps);
    printf("%s: %llu mappings, %.1f GiB of address space, biggest %.1f GiB at %#llx\n", when, count,
           total / 1073741824.0, biggest / 1073741824.0, big_start);
}

int main(int argc, char **argv) {
    int list_only = argc > 1 && strcmp(argv[1], "--list") == 0;
    if (!list_only) summary("start");
    CHECK(cuInit(0));
    if (!list_only) summary("after cuInit");
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    if (!list_only) summary("after context");
    CUdeviceptr p[16];
    size_t sizes[] = {2 << 20, 2 << 20, 2 << 20, 64 << 20, 64 << 20, 1ULL << 30, 1ULL << 30, 4 << 10};
    for (int i = 0; i < 8; i++) {
        CHECK(cuMemAlloc(&p[i], sizes[i]));
        char what[64];
        snprintf(what, sizeof what, "cuMemAlloc %zu KiB", sizes[i] >> 10);
        if (list_only)
            printf("device address %#llx (%zu KiB)\n", (unsigned long long)p[i], sizes[i] >> 10);
        else
            where(what, p[i]);
    }
    if (list_only) return 0;
    summary("after allocations");

    // (a) Reserve with mmap where the next 2 MiB allocation would go.
    CUdeviceptr next;
    CHECK(cuMemAlloc(&next, 2 << 20));
    CHECK(cuMemFree(next));
    where("next 2 MiB would be", next);
    uint64_t lo = (next & ~((1ULL << 30) - 1)) - (2ULL << 30), len = 4ULL << 30;
    void *got = mmap((void *)lo, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    printf("(a) mmap PROT_NONE [%#llx, +4 GiB): %s\n", (unsigned long long)lo,
           got == MAP_FAILED ? strerror(errno) : (got == (void *)lo ? "reserved" : "placed elsewhere"));
    if (got != MAP_FAILED && got != (void *)lo) munmap(got, len);
    for (int i = 0; i < 3; i++) {
        CUdeviceptr q;
        CHECK(cuMemAlloc(&q, 2 << 20));
        printf("    after (a): 2 MiB at %#llx %s the window\n", (unsigned long long)q,
               q >= lo && q < lo + len ? "INSIDE" : "outside");
    }
    CUdeviceptr big;
    CHECK(cuMemAlloc(&big, 8ULL << 30));
    printf("    after (a): 8 GiB at %#llx %s the window\n", (unsigned long long)big,
           big < lo + len && big + (8ULL << 30) > lo ? "OVERLAPS" : "outside");
    CHECK(cuMemFree(big));

    // (b) cuMemAddressReserve at the next allocation's place.
    CHECK(cuMemAlloc(&next, 2 << 20));
    CHECK(cuMemFree(next));
    uint64_t hint = (next & ~((1ULL << 30) - 1));
    CUdeviceptr reserved;
    CUresult r = cuMemAddressReserve(&reserved, 2ULL << 30, 0, hint, 0);
    printf("(b) cuMemAddressReserve 2 GiB hint %#llx: result %d at %#llx (%s)\n", (unsigned long long)hint, (int)r,
           (unsigned long long)reserved, reserved == hint ? "hint honoured" : "elsewhere");
    for (int i = 0; i < 3; i++) {
        CUdeviceptr q;
        CHECK(cuMemAlloc(&q, 2 << 20));
        printf("    after (b): 2 MiB at %#llx %s the reservation\n", (unsigned long long)q,
               q >= reserved && q < reserved + (2ULL << 30) ? "INSIDE" : "outside");
    }
    // (c) A reservation of a small range exactly where the next allocation would go.
    CHECK(cuMemAlloc(&next, 2 << 20));
    CHECK(cuMemFree(next));
    r = cuMemAddressReserve(&reserved, 64 << 20, 0, next, 0);
    printf("(c) cuMemAddressReserve 64 MiB hint %#llx: result %d at %#llx (%s)\n", (unsigned long long)next, (int)r,
           (unsigned long long)reserved, reserved == next ? "hint honoured" : "elsewhere");
    CUdeviceptr q;
    CHECK(cuMemAlloc(&q, 2 << 20));
    printf("    after (c): 2 MiB at %#llx\n", (unsigned long long)q);
    summary("end");
    return 0;
}

// Probe: how much free address space around a hint does cuMemAddressReserve need to honour it?
// A Flyt worker holds most of its address space reserved (rpc-server/src/address_space.rs) and
// gives back the place of a moved session's allocation before reserving it with the driver. This
// reserves 128 GiB around X, frees [X - before, X + len + after), asks for len at X, and prints
// whether the hint was honoured, for several lengths and margins.
// --hold-first: the 128 GiB are reserved before cuInit (as a Flyt worker reserves before the
// driver loads), to see whether the driver honours hints in space it saw taken at init.
//   nvcc -o va_hint_probe va_hint_probe.c -lcuda && ./va_hint_probe [--hold-first]
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define GIB (1ULL << 30)
#define MIB (1ULL << 20)

static int hold(uint64_t start, uint64_t len) {
    void *got = mmap((void *)start, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    return got == (void *)start;
}

int main(int argc, char **argv) {
    const uint64_t x = 0x350000000000ULL;
    int hold_first = argc > 1 && strcmp(argv[1], "--hold-first") == 0;
    if (hold_first && !hold(x - 64 * GIB, 128 * GIB)) {
        printf("cannot reserve around %#llx\n", (unsigned long long)x);
        return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        printf("no context\n");
        return 1;
    }
    if (!hold_first && !hold(x - 64 * GIB, 128 * GIB)) {
        printf("cannot reserve around %#llx\n", (unsigned long long)x);
        return 1;
    }
    uint64_t lens[] = {2 * MIB, 64 * MIB, GIB, 4 * GIB};
    uint64_t margins[] = {0, 2 * MIB, 32 * MIB, 512 * MIB, GIB, 4 * GIB, 16 * GIB};
    printf("%-10s %-10s %-10s %s\n", "len", "before", "after", "hint");
    for (int l = 0; l < 4; l++) {
        for (int m = 0; m < 7; m++) {
            for (int side = 0; side < 3; side++) {
                if (margins[m] == 0 && side > 0) continue;
                uint64_t before = side == 2 ? 0 : margins[m], after = side == 1 ? 0 : margins[m];
                uint64_t from = x - before, span = before + lens[l] + after;
                munmap((void *)from, span);
                CUdeviceptr got = 0;
                CUresult r = cuMemAddressReserve(&got, lens[l], 0, x, 0);
                printf("%-10llu %-10llu %-10llu %s", (unsigned long long)(lens[l] / MIB), (unsigned long long)(before / MIB),
                       (unsigned long long)(after / MIB), r ? "error" : got == x ? "honoured" : "elsewhere");
                if (!r && got != x) printf(" (%#llx)", (unsigned long long)got);
                printf("\n");
                if (!r) cuMemAddressFree(got, lens[l]);
                if (!hold(from, span)) printf("  could not hold the range again\n");
            }
        }
    }
    return 0;
}

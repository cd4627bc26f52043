// guest_copy: copy bandwidth as a VM guest sees it, through whatever channel its Flyt session
// uses (ivshmem region, or TCP alone). Host-to-device and device-to-host copies of pinned
// (cuMemAllocHost) and pageable memory, 1 to 64 MiB, each timed REPS times; then the guest's own
// memcpy of the same sizes, the ceiling a guest under emulation (TCG) puts on any channel.
// Prints one line per case: `bw channel mem dir bytes median_gbps p90_gbps`.
// Usage: guest_copy CHANNEL-NAME [REPS]
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "copy_timing.h"

static void report(const char *channel, const char *mem, const char *dir, size_t bytes, double *seconds, int reps) {
    qsort(seconds, reps, sizeof *seconds, by_value);
    // The median time, and the time 90% of the copies beat, as bandwidth.
    double median = seconds[reps / 2], p90 = seconds[(reps * 9) / 10 < reps ? (reps * 9) / 10 : reps - 1];
    printf("bw %s %s %s %zu %.3f %.3f\n", channel, mem, dir, bytes, bytes / median / 1e9, bytes / p90 / 1e9);
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *channel = argc > 1 ? argv[1] : "flyt";
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    if (reps < 1 || reps > 1000) reps = 9;
    const size_t sizes[] = {1 << 20, 16 << 20, 64 << 20};
    const size_t largest = 64 << 20;
    double *seconds = calloc(reps, sizeof *seconds);
    CUdeviceptr dev;
    unsigned char *pinned, *pageable = malloc(largest), *other = malloc(largest);
    if (copy_buffers(largest, &dev, &pinned)) return 1;
    memset(pageable, 7, largest);
    memset(other, 9, largest);
    memset(pinned, 5, largest);
    for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t bytes = sizes[k];
        if (time_copies(channel, dev, pinned, pageable, NULL, bytes, seconds, reps, report)) return 1;
        for (int r = 0; r < reps; r++) {
            double start = now();
            memcpy(other, pageable, bytes);
            seconds[r] = now() - start;
            if (other[bytes - 1] != pageable[bytes - 1]) printf("FAIL memcpy\n"); // and the copy is used
        }
        report(channel, "memcpy", "-", bytes, seconds, reps);
    }
    printf("guest_copy done\n");
    return 0;
}

// Probe (not a gpu-tests program): what NVIDIA's NVML reports of per-process utilization, with and
// without MPS, for a process that keeps kernels running. Run by gpu-tests/probes/nvml-util.sh.
//   busy mode:  nvml_util_probe busy SECONDS   (spins kernels on one stream for SECONDS)
//   ask mode:   nvml_util_probe ask            (prints device and per-process utilization)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sys/time.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include <nvml.h>

static __global__ void spin(unsigned long long cycles) {
    unsigned long long start = clock64();
    while (clock64() - start < cycles) {}
}

static int busy(double seconds) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int launches = 0;
    for (;;) {
        spin<<<132, 128>>>(20000000ull);  // ~10 ms at 1.98 GHz
        cudaDeviceSynchronize();
        launches++;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds) break;
    }
    printf("busy: pid %d, %d launches, %s\n", getpid(), launches, cudaGetErrorName(cudaGetLastError()));
    return 0;
}

static int ask() {
    nvmlReturn_t r = nvmlInit_v2();
    if (r) { printf("nvmlInit: %s\n", nvmlErrorString(r)); return 1; }
    nvmlDevice_t dev;
    nvmlDeviceGetHandleByIndex_v2(0, &dev);
    nvmlUtilization_t u;
    r = nvmlDeviceGetUtilizationRates(dev, &u);
    printf("device utilization: %s gpu %u%% memory %u%%\n", nvmlErrorString(r), u.gpu, u.memory);
    struct timeval tv;
    gettimeofday(&tv, nullptr);
    unsigned long long now_us = tv.tv_sec * 1000000ull + tv.tv_usec;
    for (unsigned long long back_ms : {1000ull, 3000ull, 0ull}) {
        unsigned int count = 0;
        unsigned long long since = back_ms ? now_us - back_ms * 1000 : 0;
        r = nvmlDeviceGetProcessUtilization(dev, nullptr, &count, since);
        printf("process utilization since -%llu ms: size query %s count %u\n", back_ms, nvmlErrorString(r), count);
        if (count == 0) continue;
        nvmlProcessUtilizationSample_t *s = (nvmlProcessUtilizationSample_t *)calloc(count, sizeof *s);
        r = nvmlDeviceGetProcessUtilization(dev, s, &count, since);
        printf("  %s %u samples\n", nvmlErrorString(r), count);
        for (unsigned i = 0; i < count && i < 12; i++)
            printf("  pid %u ts -%lld ms sm %u mem %u enc %u dec %u\n", s[i].pid, (long long)(now_us - s[i].timeStamp) / 1000, s[i].smUtil, s[i].memUtil, s[i].encUtil, s[i].decUtil);
        free(s);
    }
    for (int mps = 0; mps < 2; mps++) {
        nvmlProcessInfo_t infos[32];
        unsigned int n = 32;
        r = mps ? nvmlDeviceGetMPSComputeRunningProcesses_v3(dev, &n, infos) : nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, infos);
        printf("%s processes: %s %u\n", mps ? "MPS compute" : "compute", nvmlErrorString(r), r ? 0 : n);
        for (unsigned i = 0; !r && i < n; i++) printf("  pid %u used %llu MiB\n", infos[i].pid, infos[i].usedGpuMemory >> 20);
    }
    nvmlShutdown();
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "busy")) return busy(atof(argv[2]));
    if (argc > 1 && !strcmp(argv[1], "ask")) return ask();
    fprintf(stderr, "usage: %s busy SECONDS | ask\n", argv[0]);
    return 2;
}

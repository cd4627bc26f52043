// launch_threads: async empty launches in batches of 10k (PTX, sm_90): the calling thread's and the process's CPU per launch, and
// the CPU each other thread of the process used during the batches (from /proc/self/task).
#include <cuda.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r) { const char *s; cuGetErrorName(r, &s); fprintf(stderr, "%s: %s\n", #x, s); exit(1);} } while (0)
static const char *ptx = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry empty() { ret; }\n";
static double cpu(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec / 1e9; }
#define MAXT 64
static int tids[MAXT]; static double ticks[MAXT]; static char names[MAXT][32];
static int threads(void) {
  DIR *d = opendir("/proc/self/task"); struct dirent *e; int n = 0;
  while ((e = readdir(d)) && n < MAXT) {
    if (e->d_name[0] == '.') continue;
    char p[96]; snprintf(p, sizeof p, "/proc/self/task/%s/stat", e->d_name);
    FILE *f = fopen(p, "r"); if (!f) continue; char buf[1024]; size_t k = fread(buf, 1, sizeof buf - 1, f); buf[k] = 0; fclose(f);
    char *l = strchr(buf, '('), *r = strrchr(buf, ')'); int len = r - l - 1; if (len > 31) len = 31;
    memcpy(names[n], l + 1, len); names[n][len] = 0;
    unsigned long ut, st; sscanf(r + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
    tids[n] = atoi(e->d_name); ticks[n] = (ut + st); n++;
  }
  closedir(d); return n;
}
int main(int argc, char **argv) {
  int batches = argc > 1 ? atoi(argv[1]) : 20;
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c, d)); CK(cuCtxSetCurrent(c));
  CUmodule m; CK(cuModuleLoadData(&m, ptx)); CUfunction f; CK(cuModuleGetFunction(&f, m, "empty"));
  for (int i = 0; i < 1000; i++) CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0));
  CK(cuCtxSynchronize());
  int t0n = threads(); int tid0[MAXT]; double tk0[MAXT]; memcpy(tid0, tids, sizeof tids); memcpy(tk0, ticks, sizeof ticks);
  double th = 0, pr = 0; double ths[100], prs[100];
  for (int b = 0; b < batches; b++) {
    double a = cpu(CLOCK_THREAD_CPUTIME_ID), p = cpu(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < 10000; i++) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
    ths[b] = (cpu(CLOCK_THREAD_CPUTIME_ID) - a) * 1e6 / 10000; prs[b] = (cpu(CLOCK_PROCESS_CPUTIME_ID) - p) * 1e6 / 10000;
    CK(cuCtxSynchronize());
  }
  int n = threads();
  // medians
  for (int i = 0; i < batches; i++) for (int j = i + 1; j < batches; j++) { if (ths[j] < ths[i]) { double x = ths[i]; ths[i] = ths[j]; ths[j] = x; } if (prs[j] < prs[i]) { double x = prs[i]; prs[i] = prs[j]; prs[j] = x; } }
  printf("thread %.3f process %.3f us/launch |", ths[batches / 2], prs[batches / 2]);
  for (int i = 0; i < n; i++) { double before = 0; for (int j = 0; j < t0n; j++) if (tid0[j] == tids[i]) before = tk0[j]; double dt = ticks[i] - before; if (dt > 0) printf(" %s:%.0f", names[i], dt); }
  printf(" (ticks)\n");
  return 0;
}

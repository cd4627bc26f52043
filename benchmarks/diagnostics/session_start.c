// session_start: from main to a driver-API context ready (cuInit, primary context: through Flyt, the
// server found and the session handshaken), then to a first allocation and two small copies; prints
// both in ms. Run many times against a warm server (`FLYT_SHM=off` for a socket session).
#include <cuda.h>
#include <stdio.h>
#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
int main() {
  double t0 = now();
  if (cuInit(0)) return 1; CUdevice d; cuDeviceGet(&d, 0); CUcontext c; if (cuDevicePrimaryCtxRetain(&c, d)) return 2; cuCtxSetCurrent(c);
  double t1 = now();
  CUdeviceptr p; if (cuMemAlloc(&p, 128)) return 3; int h[32]={0}; cuMemcpyHtoD(p, h, sizeof h); cuMemcpyDtoH(h, p, sizeof h);
  double t2 = now();
  printf("%.3f %.3f\n", t1 - t0, t2 - t0);
  return 0;
}

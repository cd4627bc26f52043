// fault_kernel: the faulting half of the fault-isolation pair (the other half is fault_victim).
// Does some correct work, then launches a kernel that writes through a null pointer. The fault
// surfaces as cudaErrorIllegalAddress at the next synchronizing call and is sticky: every later call
// returns it too. Exit 0 when all of that happened as CUDA specifies.
//
// Run alone it proves the error is reported; the runner runs it while fault_victim is running on the
// same GPU (natively) or the same flyt-rpc-server (through Flyt), and fault_victim must not notice.
#include "common.h"

__global__ void write_through(int *p, int v) { p[threadIdx.x] = v; }

int main() {
    test_init("fault_kernel");

    int *d, h[32];
    CHECK(cudaMalloc(&d, sizeof(h)));
    write_through<<<1, 32>>>(d, 5);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 32; i++)
        if (h[i] != 5) bad++;
    EXPECT(bad == 0, "work before the fault: %d wrong", bad);
    printf("work before the fault: %s\n", bad ? "wrong" : "ok");

    // The faulting kernel: a null-pointer write. Its launch is accepted; the fault comes later.
    write_through<<<1, 32>>>(nullptr, 7);
    expect_err("launch of the faulting kernel", cudaGetLastError(), cudaSuccess);
    expect_err("cudaDeviceSynchronize after the faulting kernel", cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    // The error is sticky: the context is unusable from now on.
    expect_err("cudaGetLastError after the fault", cudaGetLastError(), cudaErrorIllegalAddress);
    void *p = nullptr;
    expect_err("cudaMalloc after the fault", cudaMalloc(&p, 4096), cudaErrorIllegalAddress);
    expect_err("cudaMemcpy after the fault", cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost),
               cudaErrorIllegalAddress);
    expect_err("cudaDeviceSynchronize again", cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    return test_finish();
}

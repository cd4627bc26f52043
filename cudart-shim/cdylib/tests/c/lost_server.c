/* Opens a session, waits until the test has killed the server, then keeps calling: every call
 * must fail with a CUDA error, at once, instead of hanging. */
#include <cuda_runtime_api.h>
#include <stdio.h>

int main(void) {
    void *dev = NULL;
    char host[16], line[8];
    if (cudaMalloc(&dev, 1024) != cudaSuccess) return 2;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 3;
    cudaError_t copy = cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost);
    cudaError_t sync = cudaDeviceSynchronize();
    cudaError_t alloc = cudaMalloc(&dev, 16);
    cudaError_t memset_ = cudaMemset(dev, 0, 16);
    printf("%s %s %s %s\n", cudaGetErrorName(copy), cudaGetErrorName(sync), cudaGetErrorName(alloc),
           cudaGetErrorName(memset_));
    return 0;
}

/* An unmodified CUDA program (built against the CUDA 13 headers, linked with -lcudart) as a user
 * would start it with `flyt run`: it finds libcudart.so.13 only through the library path flyt
 * sets. It round-trips data through device memory and prints one line per check; exit 1 if any
 * check failed. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(what, call)                                                                  \
    do {                                                                                   \
        cudaError_t got_ = (call);                                                         \
        if (got_ == cudaSuccess) {                                                         \
            printf("ok: %s\n", what);                                                      \
        } else {                                                                           \
            printf("FAILED: %s -> %s: %s\n", what, cudaGetErrorName(got_), cudaGetErrorString(got_)); \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

int main(void) {
    int count = 0;
    CHECK("cudaGetDeviceCount", cudaGetDeviceCount(&count));
    if (count < 1) {
        printf("FAILED: no device\n");
        return 1;
    }
    struct cudaDeviceProp prop;
    CHECK("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s\n", prop.name);

    size_t n = (4 << 20) + 3;
    unsigned char *host = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i * 7u + 1);
    void *dev = NULL;
    CHECK("cudaMalloc", cudaMalloc(&dev, n));
    CHECK("cudaMemcpy host to device", cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice));
    memset(back, 0, n);
    CHECK("cudaMemcpy device to host", cudaMemcpy(back, dev, n, cudaMemcpyDeviceToHost));
    if (memcmp(host, back, n) != 0) {
        printf("FAILED: the data came back different\n");
        failures++;
    }
    CHECK("cudaMemset", cudaMemset(dev, 0xab, 4096));
    CHECK("cudaMemcpy after memset", cudaMemcpy(back, dev, 4096, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < 4096; i++) {
        if (back[i] != 0xab) {
            printf("FAILED: byte %zu is %d after cudaMemset\n", i, back[i]);
            failures++;
            break;
        }
    }
    CHECK("cudaFree", cudaFree(dev));
    free(host);
    free(back);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

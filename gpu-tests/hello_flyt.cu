// The README's sample: what an unmodified CUDA app sees through Flyt. It prints its device,
// moves data through it and runs a vector add. On a server with the emulated device (no GPU) the
// kernel cannot run: the sample says so and still checks the data path.
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        cudaError_t err_ = (call);                                                                   \
        if (err_ != cudaSuccess) {                                                                   \
            printf("FAIL: %s: %s (%s)\n", #call, cudaGetErrorName(err_), cudaGetErrorString(err_)); \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device 0 of %d: %s, %d SMs, %zu MiB\n", count, prop.name, prop.multiProcessorCount, prop.totalGlobalMem >> 20);

    const int n = 1 << 20;
    std::vector<float> a(n), b(n), c(n, 0.0f);
    for (int i = 0; i < n; i++) {
        a[i] = float(i);
        b[i] = float(2 * i);
    }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, n * sizeof(float)));
    CHECK(cudaMalloc(&db, n * sizeof(float)));
    CHECK(cudaMalloc(&dc, n * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dc, da, n * sizeof(float), cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
    bool copied = true;
    for (int i = 0; i < n; i++) copied &= c[i] == a[i];
    printf("copied %zu MiB to the device, across it and back: %s\n", (n * sizeof(float)) >> 20, copied ? "ok" : "WRONG");
    if (!copied) return 1;

    vector_add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    cudaError_t launched = cudaGetLastError();
    if (launched == cudaErrorNotSupported) {
        printf("vector add: not run: this server's device is emulated and cannot run kernels\n");
    } else {
        CHECK(launched);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
        int wrong = 0;
        for (int i = 0; i < n; i++) wrong += c[i] != a[i] + b[i];
        printf("vector add of %d floats on the GPU: %s\n", n, wrong ? "WRONG" : "ok");
        if (wrong) return 1;
    }
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    printf("hello_flyt: PASS\n");
    return 0;
}

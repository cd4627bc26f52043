// vector_add: a vector add that reads a __constant__ and a __device__ variable.
// Covers: <<<>>> launches (__cudaGetKernel/__cudaLaunchKernel), explicit cudaLaunchKernel,
// cudaGetDeviceProperties, cudaMalloc/cudaFree, cudaMemcpy H2D/D2H, cudaMemset,
// cudaMemcpyToSymbol/cudaMemcpyFromSymbol (with offsets, H2D and D2D), their Async forms,
// cudaGetSymbolAddress (copies and memsets through the returned address), cudaDeviceSynchronize.
#include "common.h"

#include <vector>

__constant__ float c_scale;
__constant__ float c_coef[4];
__device__ float d_bias;
__device__ unsigned int d_count;
__device__ int d_table[256];

__global__ void vadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = c_scale * a[i] + b[i] + d_bias + c_coef[i & 3];
        atomicAdd(&d_count, 1u);
    }
}

__global__ void table_step(int n, int add) {
    int i = threadIdx.x;
    if (i < n) d_table[i] = d_table[i] * 2 + i + add;
}

// All inputs are small integers or quarters, so every result is exact in float whatever the
// device's FMA contraction does: the host can compare with ==.
static float expected(float scale, const float *coef, float bias, const std::vector<float> &a,
                      const std::vector<float> &b, int i) {
    return scale * a[i] + b[i] + bias + coef[i & 3];
}

static int check_vadd(const char *what, const std::vector<float> &c, float scale, const float *coef,
                      float bias, const std::vector<float> &a, const std::vector<float> &b) {
    int bad = 0, first = -1;
    for (size_t i = 0; i < c.size(); i++) {
        if (c[i] != expected(scale, coef, bias, a, b, (int)i)) {
            if (first < 0) first = (int)i;
            bad++;
        }
    }
    if (bad)
        printf("FAIL: %s: %d wrong elements, first at %d\n", what, bad, first);
    else
        printf("%s: results ok\n", what);
    if (bad) g_failures++;
    return bad;
}

int main() {
    test_init("vector_add");

    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    EXPECT(prop.major >= 7, "compute capability major %d < 7", prop.major);
    EXPECT(prop.maxThreadsPerBlock >= 256, "maxThreadsPerBlock %d < 256", prop.maxThreadsPerBlock);

    const int n = (1 << 20) + 3;  // not a multiple of the block size
    std::vector<float> a(n), b(n), c(n);
    for (int i = 0; i < n; i++) {
        a[i] = (float)(i % 1000);
        b[i] = (float)((i * 7) % 513) - 256.0f;
    }
    const float scale = 2.0f, bias = 0.5f;
    const float coef[4] = {0.25f, -1.0f, 3.0f, 0.75f};

    float *d_a, *d_b, *d_c;
    CHECK(cudaMalloc(&d_a, n * sizeof(float)));
    CHECK(cudaMalloc(&d_b, n * sizeof(float)));
    CHECK(cudaMalloc(&d_c, n * sizeof(float)));
    CHECK(cudaMemcpy(d_a, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_c, 0xFF, n * sizeof(float)));

    // __constant__ and __device__ variables, whole and with offsets.
    CHECK(cudaMemcpyToSymbol(c_scale, &scale, sizeof(scale)));
    CHECK(cudaMemcpyToSymbol(c_coef, coef, sizeof(float)));                                // [0]
    CHECK(cudaMemcpyToSymbol(c_coef, coef + 1, 3 * sizeof(float), sizeof(float)));         // [1..3]
    CHECK(cudaMemcpyToSymbol(d_bias, &bias, sizeof(bias), 0, cudaMemcpyHostToDevice));
    unsigned int *p_count = nullptr;
    CHECK(cudaGetSymbolAddress((void **)&p_count, d_count));
    EXPECT(p_count != nullptr, "cudaGetSymbolAddress returned null");
    CHECK(cudaMemset(p_count, 0, sizeof(unsigned int)));

    float back[4] = {0, 0, 0, 0};
    CHECK(cudaMemcpyFromSymbol(back, c_coef, sizeof(back)));
    EXPECT(memcmp(back, coef, sizeof(back)) == 0, "c_coef read back differs");
    float back1 = 0;
    CHECK(cudaMemcpyFromSymbol(&back1, c_coef, sizeof(float), 2 * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(back1 == coef[2], "c_coef[2] read back with offset: %g", back1);
    printf("symbols written and read back\n");

    // <<<>>> launch.
    const int block = 256, grid = (n + block - 1) / block;
    vadd<<<grid, block>>>(d_a, d_b, d_c, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), d_c, n * sizeof(float), cudaMemcpyDeviceToHost));
    check_vadd("vadd <<<>>>", c, scale, coef, bias, a, b);
    unsigned int count = 0;
    CHECK(cudaMemcpyFromSymbol(&count, d_count, sizeof(count)));
    printf("d_count after <<<>>> launch: %u (n = %d)\n", count, n);
    EXPECT(count == (unsigned)n, "d_count %u != n", count);

    // Explicit cudaLaunchKernel with new symbol values; d_count reset through its symbol address.
    const float scale2 = -3.0f, bias2 = 1.25f;
    CHECK(cudaMemcpyToSymbol(c_scale, &scale2, sizeof(scale2)));
    CHECK(cudaMemcpyToSymbol(d_bias, &bias2, sizeof(bias2)));
    unsigned int zero = 0;
    CHECK(cudaMemcpy(p_count, &zero, sizeof(zero), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_c, 0, n * sizeof(float)));
    {
        int nn = n;
        void *args[] = {&d_a, &d_b, &d_c, &nn};
        CHECK(cudaLaunchKernel((const void *)vadd, dim3(grid), dim3(block), args, 0, 0));
    }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), d_c, n * sizeof(float), cudaMemcpyDeviceToHost));
    check_vadd("vadd cudaLaunchKernel", c, scale2, coef, bias2, a, b);
    CHECK(cudaMemcpy(&count, p_count, sizeof(count), cudaMemcpyDeviceToHost));
    printf("d_count after cudaLaunchKernel: %u (n = %d)\n", count, n);
    EXPECT(count == (unsigned)n, "d_count %u != n", count);

    // Async symbol copies on a stream, with pinned host memory.
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *h_tab;
    CHECK(cudaMallocHost(&h_tab, 256 * sizeof(int)));
    for (int i = 0; i < 256; i++) h_tab[i] = i * 3 - 100;
    CHECK(cudaMemcpyToSymbolAsync(d_table, h_tab, 256 * sizeof(int), 0, cudaMemcpyHostToDevice, s));
    table_step<<<1, 256, 0, s>>>(256, 5);
    CHECK_LAUNCH();
    int *h_out;
    CHECK(cudaMallocHost(&h_out, 256 * sizeof(int)));
    memset(h_out, 0, 256 * sizeof(int));
    CHECK(cudaMemcpyFromSymbolAsync(h_out, d_table, 256 * sizeof(int), 0, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    int bad = 0;
    for (int i = 0; i < 256; i++)
        if (h_out[i] != (i * 3 - 100) * 2 + i + 5) bad++;
    EXPECT(bad == 0, "async symbol round trip: %d wrong", bad);
    if (!bad) printf("async symbol copies: ok\n");

    // Symbol <-> device memory (cudaMemcpyDeviceToDevice), partial with an offset.
    int *d_src, *d_dst;
    CHECK(cudaMalloc(&d_src, 256 * sizeof(int)));
    CHECK(cudaMalloc(&d_dst, 256 * sizeof(int)));
    for (int i = 0; i < 256; i++) h_tab[i] = 1000 + i;
    CHECK(cudaMemcpy(d_src, h_tab, 256 * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyToSymbol(d_table, d_src, 128 * sizeof(int), 64 * sizeof(int), cudaMemcpyDeviceToDevice));
    CHECK(cudaMemset(d_dst, 0, 256 * sizeof(int)));
    CHECK(cudaMemcpyFromSymbol(d_dst, d_table, 256 * sizeof(int), 0, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(h_out, d_dst, 256 * sizeof(int), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int i = 0; i < 256; i++) {
        int want = (i >= 64 && i < 192) ? 1000 + (i - 64) : (i * 3 - 100) * 2 + i + 5;
        if (h_out[i] != want) bad++;
    }
    EXPECT(bad == 0, "device-to-device symbol copies: %d wrong", bad);
    if (!bad) printf("device-to-device symbol copies: ok\n");

    // Pointer arithmetic on a symbol address: write 4 ints at element 10, read them with an offset.
    int *p_tab = nullptr;
    CHECK(cudaGetSymbolAddress((void **)&p_tab, d_table));
    int four[4] = {-1, -2, -3, -4}, four_back[4] = {0, 0, 0, 0};
    CHECK(cudaMemcpy(p_tab + 10, four, sizeof(four), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyFromSymbol(four_back, d_table, sizeof(four_back), 10 * sizeof(int)));
    EXPECT(memcmp(four, four_back, sizeof(four)) == 0, "symbol address arithmetic mismatch");
    if (memcmp(four, four_back, sizeof(four)) == 0) printf("symbol address arithmetic: ok\n");

    CHECK_EACH(cudaFreeHost, h_tab, h_out);
    CHECK(cudaStreamDestroy(s));
    CHECK_EACH(cudaFree, d_src, d_dst, d_a, d_b, d_c);
    CHECK(cudaDeviceSynchronize());
    return test_finish();
}

// link: -lcublas
// cuBLAS through Flyt: SGEMM, GemmEx with fp16 and bf16 inputs on tensor cores (fp32 compute),
// strided batched SGEMM, and a handle bound to a created stream; each checked against a CPU GEMM.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <vector>

#include "lib_common.h"

// C (m x n) = A (m x k) * B (k x n), column-major as cuBLAS.
static void cpu_gemm(int m, int n, int k, const float *a, const float *b, float *c) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) s += (double)a[i + p * m] * b[p + j * k];
            c[i + j * m] = (float)s;
        }
}

int main() {
    test_init("cublas_gemm");
    const int m = 256, n = 192, k = 128, batches = 8;
    uint32_t seed = 12345;
    std::vector<float> a((size_t)m * k * batches), b((size_t)k * n * batches), want((size_t)m * n * batches), got(want.size());
    for (auto &x : a) x = lib_rand(seed);
    for (auto &x : b) x = lib_rand(seed);
    for (int i = 0; i < batches; i++)
        cpu_gemm(m, n, k, &a[(size_t)i * m * k], &b[(size_t)i * k * n], &want[(size_t)i * m * n]);

    cublasHandle_t handle;
    CHECK_LIB(cublasCreate(&handle));
    int version = 0;
    CHECK_LIB(cublasGetVersion(handle, &version));
    printf("cublas version known: %s\n", version > 0 ? "yes" : "no");
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, a.size() * sizeof(float)));
    CHECK(cudaMalloc(&db, b.size() * sizeof(float)));
    CHECK(cudaMalloc(&dc, want.size() * sizeof(float)));
    CHECK_LIB(cublasSetMatrix(m, k * batches, sizeof(float), a.data(), m, da, m));
    CHECK(cudaMemcpy(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
    const float one = 1.0f, zero = 0.0f;

    // SGEMM (pedantic math: no TF32, so the CPU result is the reference).
    CHECK_LIB(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
    CHECK_LIB(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k, &zero, dc, m));
    CHECK_LIB(cublasGetMatrix(m, n, sizeof(float), dc, m, got.data(), m));
    expect_close("sgemm", got.data(), want.data(), (size_t)m * n, 1e-4);

    // Strided batched SGEMM on a created stream.
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK_LIB(cublasSetStream(handle, stream));
    CHECK_LIB(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, (long long)m * k, db, k,
                                        (long long)k * n, &zero, dc, m, (long long)m * n, batches));
    CHECK(cudaMemcpyAsync(got.data(), dc, got.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    expect_close("sgemm strided batched", got.data(), want.data(), got.size(), 1e-4);
    CHECK_LIB(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));

    // GemmEx: fp16 and bf16 inputs, fp32 accumulation and output, tensor cores allowed.
    std::vector<__half> ha((size_t)m * k), hb((size_t)k * n);
    std::vector<__nv_bfloat16> ba((size_t)m * k), bb((size_t)k * n);
    std::vector<float> ra((size_t)m * k), rb((size_t)k * n), rwant((size_t)m * n);
    for (size_t i = 0; i < ha.size(); i++) { ha[i] = __float2half(a[i]); ra[i] = __half2float(ha[i]); }
    for (size_t i = 0; i < hb.size(); i++) { hb[i] = __float2half(b[i]); rb[i] = __half2float(hb[i]); }
    cpu_gemm(m, n, k, ra.data(), rb.data(), rwant.data());
    void *d16a, *d16b;
    CHECK(cudaMalloc(&d16a, ha.size() * 2));
    CHECK(cudaMalloc(&d16b, hb.size() * 2));
    // One GemmEx of 16-bit inputs of `type` (as many as ha and hb), checked against rwant.
    auto gemm_ex = [&](const char *what, const void *a16, const void *b16, cudaDataType type) {
        CHECK(cudaMemcpy(d16a, a16, ha.size() * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d16b, b16, hb.size() * 2, cudaMemcpyHostToDevice));
        CHECK_LIB(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, d16a, type, m, d16b, type, k, &zero, dc, CUDA_R_32F,
                               m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
        CHECK(cudaMemcpyAsync(got.data(), dc, (size_t)m * n * sizeof(float), cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        expect_close(what, got.data(), rwant.data(), (size_t)m * n, 1e-3);
    };
    gemm_ex("gemmex fp16", ha.data(), hb.data(), CUDA_R_16F);

    for (size_t i = 0; i < ba.size(); i++) { ba[i] = __float2bfloat16(a[i]); ra[i] = __bfloat162float(ba[i]); }
    for (size_t i = 0; i < bb.size(); i++) { bb[i] = __float2bfloat16(b[i]); rb[i] = __bfloat162float(bb[i]); }
    cpu_gemm(m, n, k, ra.data(), rb.data(), rwant.data());
    gemm_ex("gemmex bf16", ba.data(), bb.data(), CUDA_R_16BF);

    // 1000 small GEMMs back to back (the library's launch path under load), then one check.
    for (int i = 0; i < 1000; i++)
        CHECK_LIB(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 32, 32, 32, &one, da, m, db, k, &zero, dc, m));
    CHECK(cudaStreamSynchronize(stream));
    printf("1000 small sgemms: done\n");

    CHECK_LIB(cublasDestroy(handle));
    CHECK(cudaStreamDestroy(stream));
    CHECK_EACH(cudaFree, da, db, dc, d16a, d16b);
    return test_finish();
}

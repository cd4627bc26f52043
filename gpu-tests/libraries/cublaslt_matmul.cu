// link: -lcublasLt
// cuBLASLt through Flyt: a matmul descriptor, layouts, a preference with a workspace, the heuristic's
// first algorithm, cublasLtMatmul with bias epilogue; checked against a CPU GEMM plus bias.
#include <cublasLt.h>

#include <vector>

#include "lib_common.h"

int main() {
    test_init("cublaslt_matmul");
    const int m = 128, n = 96, k = 64;
    uint32_t seed = 777;
    std::vector<float> a((size_t)m * k), b((size_t)k * n), bias(m), want((size_t)m * n), got(want.size());
    for (auto &x : a) x = lib_rand(seed);
    for (auto &x : b) x = lib_rand(seed);
    for (auto &x : bias) x = lib_rand(seed);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = bias[i];
            for (int p = 0; p < k; p++) s += (double)a[i + p * m] * b[p + j * k];
            want[i + j * m] = (float)s;
        }
    cublasLtHandle_t lt;
    CHECK_LIB(cublasLtCreate(&lt));
    float *da, *db, *dc, *dbias;
    void *workspace;
    const size_t workspace_size = 4 << 20;
    CHECK(cudaMalloc(&da, a.size() * 4));
    CHECK(cudaMalloc(&db, b.size() * 4));
    CHECK(cudaMalloc(&dc, want.size() * 4));
    CHECK(cudaMalloc(&dbias, bias.size() * 4));
    CHECK(cudaMalloc(&workspace, workspace_size));
    CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dbias, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));

    cublasLtMatmulDesc_t op;
    CHECK_LIB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F));
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CHECK_LIB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    CHECK_LIB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_LIB(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m));
    CHECK_LIB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k));
    CHECK_LIB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m));
    cublasLtMatmulPreference_t pref;
    CHECK_LIB(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LIB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_size,
                                                    sizeof workspace_size));
    cublasLtMatmulHeuristicResult_t results[4];
    int found = 0;
    CHECK_LIB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 4, results, &found));
    printf("heuristic found an algorithm: %s\n", found > 0 ? "yes" : "no");
    if (found < 1) { g_failures++; return test_finish(); }
    const float one = 1.0f, zero = 0.0f;
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_LIB(cublasLtMatmul(lt, op, &one, da, la, db, lb, &zero, dc, lc, dc, lc, &results[0].algo, workspace, workspace_size,
                             stream));
    CHECK(cudaMemcpyAsync(got.data(), dc, got.size() * 4, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    expect_close("matmul + bias", got.data(), want.data(), got.size(), 1e-4);

    CHECK_LIB(cublasLtMatmulPreferenceDestroy(pref));
    for (cublasLtMatrixLayout_t l : {la, lb, lc}) CHECK_LIB(cublasLtMatrixLayoutDestroy(l));
    CHECK_LIB(cublasLtMatmulDescDestroy(op));
    CHECK_LIB(cublasLtDestroy(lt));
    CHECK(cudaStreamDestroy(stream));
    CHECK_EACH(cudaFree, da, db, dc, dbias, workspace);
    return test_finish();
}

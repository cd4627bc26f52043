// link: -lcusparse
// cuSPARSE through Flyt: a 1000 x 1000 CSR matrix (tridiagonal plus a far diagonal), the generic
// SpMV API with its buffer-size query and external buffer; y = 2 A x + 0.5 y against the CPU.
#include <cusparse.h>

#include <vector>

#include "lib_common.h"

int main() {
    test_init("cusparse_spmv");
    const int n = 1000;
    uint32_t seed = 99;
    std::vector<int> rows(n + 1), cols;
    std::vector<float> vals, x(n), y(n), want(n);
    for (int i = 0; i < n; i++) {
        rows[i] = (int)cols.size();
        for (int j : {i - 1, i, i + 1, (i + 500) % n}) {
            if (j < 0 || j >= n) continue;
            cols.push_back(j);
            vals.push_back(lib_rand(seed));
        }
    }
    rows[n] = (int)cols.size();
    for (auto &v : x) v = lib_rand(seed);
    for (auto &v : y) v = lib_rand(seed);
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int p = rows[i]; p < rows[i + 1]; p++) s += (double)vals[p] * x[cols[p]];
        want[i] = (float)(2.0 * s + 0.5 * y[i]);
    }
    int *drows, *dcols;
    float *dvals, *dx, *dy;
    CHECK(cudaMalloc(&drows, rows.size() * 4));
    CHECK(cudaMalloc(&dcols, cols.size() * 4));
    CHECK(cudaMalloc(&dvals, vals.size() * 4));
    CHECK(cudaMalloc(&dx, n * 4));
    CHECK(cudaMalloc(&dy, n * 4));
    CHECK(cudaMemcpy(drows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dcols, cols.data(), cols.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dvals, vals.data(), vals.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y.data(), n * 4, cudaMemcpyHostToDevice));

    cusparseHandle_t handle;
    CHECK_LIB(cusparseCreate(&handle));
    cusparseSpMatDescr_t a;
    cusparseDnVecDescr_t vx, vy;
    CHECK_LIB(cusparseCreateCsr(&a, n, n, (int64_t)cols.size(), drows, dcols, dvals, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    CHECK_LIB(cusparseCreateDnVec(&vx, n, dx, CUDA_R_32F));
    CHECK_LIB(cusparseCreateDnVec(&vy, n, dy, CUDA_R_32F));
    const float alpha = 2.0f, beta = 0.5f;
    size_t buffer_size = 0;
    CHECK_LIB(cusparseSpMV_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, a, vx, &beta, vy, CUDA_R_32F,
                                      CUSPARSE_SPMV_ALG_DEFAULT, &buffer_size));
    void *buffer = nullptr;
    if (buffer_size) CHECK(cudaMalloc(&buffer, buffer_size));
    CHECK_LIB(cusparseSpMV(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, a, vx, &beta, vy, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT,
                           buffer));
    std::vector<float> got(n);
    CHECK(cudaMemcpy(got.data(), dy, n * 4, cudaMemcpyDeviceToHost));
    expect_close("spmv csr", got.data(), want.data(), n, 1e-5);

    CHECK_LIB(cusparseDestroySpMat(a));
    CHECK_LIB(cusparseDestroyDnVec(vx));
    CHECK_LIB(cusparseDestroyDnVec(vy));
    CHECK_LIB(cusparseDestroy(handle));
    if (buffer) CHECK(cudaFree(buffer));
    for (void *p : {(void *)drows, (void *)dcols, (void *)dvals, (void *)dx, (void *)dy}) CHECK(cudaFree(p));
    return test_finish();
}

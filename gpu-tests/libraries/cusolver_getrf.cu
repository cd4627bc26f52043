// link: -lcusolver
// cuSOLVER through Flyt: LU factorization with pivoting (getrf, with its workspace query and
// devInfo) of a 64 x 64 diagonally dominant matrix, then getrs for two right-hand sides; the
// residual |A x - b| is checked on the CPU.
#include <cusolverDn.h>

#include <vector>

#include "lib_common.h"

int main() {
    test_init("cusolver_getrf");
    const int n = 64, nrhs = 2;
    uint32_t seed = 31337;
    std::vector<float> a((size_t)n * n), b((size_t)n * nrhs);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < n; i++) a[i + j * n] = lib_rand(seed) + (i == j ? (float)n : 0.0f);
    for (auto &v : b) v = lib_rand(seed);
    float *da, *db, *work;
    int *dpiv, *dinfo;
    CHECK(cudaMalloc(&da, a.size() * 4));
    CHECK(cudaMalloc(&db, b.size() * 4));
    CHECK(cudaMalloc(&dpiv, n * sizeof(int)));
    CHECK(cudaMalloc(&dinfo, sizeof(int)));
    CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    cusolverDnHandle_t handle;
    CHECK_LIB(cusolverDnCreate(&handle));
    int lwork = 0;
    CHECK_LIB(cusolverDnSgetrf_bufferSize(handle, n, n, da, n, &lwork));
    CHECK(cudaMalloc(&work, (size_t)(lwork > 0 ? lwork : 1) * 4));
    CHECK_LIB(cusolverDnSgetrf(handle, n, n, da, n, work, dpiv, dinfo));
    int info = -1;
    CHECK(cudaMemcpy(&info, dinfo, sizeof info, cudaMemcpyDeviceToHost));
    printf("getrf info: %d\n", info);
    CHECK_LIB(cusolverDnSgetrs(handle, CUBLAS_OP_N, n, nrhs, da, n, dpiv, db, n, dinfo));
    CHECK(cudaMemcpy(&info, dinfo, sizeof info, cudaMemcpyDeviceToHost));
    printf("getrs info: %d\n", info);
    std::vector<float> x(b.size());
    CHECK(cudaMemcpy(x.data(), db, x.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<float> ax(b.size());
    for (int r = 0; r < nrhs; r++)
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int j = 0; j < n; j++) s += (double)a[i + j * n] * x[j + r * n];
            ax[i + r * n] = (float)s;
        }
    expect_close("A x = b", ax.data(), b.data(), b.size(), 1e-4);
    CHECK_LIB(cusolverDnDestroy(handle));
    for (void *p : {(void *)da, (void *)db, (void *)work, (void *)dpiv, (void *)dinfo}) CHECK(cudaFree(p));
    return test_finish();
}

// link: -lcufft
// cuFFT through Flyt: 1D C2C forward + inverse (the round trip returns N x the input), 2D C2C the
// same way, and 1D R2C checked against a direct DFT on the CPU; plans on a created stream.
#include <cufft.h>

#include <vector>

#include "lib_common.h"

int main() {
    test_init("cufft_transforms");
    uint32_t seed = 4242;
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));

    // 1D and 2D C2C round trips.
    const int n1 = 4096, nx = 64, ny = 48;
    for (int dims = 1; dims <= 2; dims++) {
        const int count = dims == 1 ? n1 : nx * ny;
        std::vector<cufftComplex> in(count), out(count);
        for (auto &c : in) { c.x = lib_rand(seed); c.y = lib_rand(seed); }
        cufftComplex *d;
        CHECK(cudaMalloc(&d, count * sizeof(cufftComplex)));
        CHECK(cudaMemcpy(d, in.data(), count * sizeof(cufftComplex), cudaMemcpyHostToDevice));
        cufftHandle plan;
        if (dims == 1) CHECK_LIB(cufftPlan1d(&plan, n1, CUFFT_C2C, 1));
        else CHECK_LIB(cufftPlan2d(&plan, nx, ny, CUFFT_C2C));
        CHECK_LIB(cufftSetStream(plan, stream));
        CHECK_LIB(cufftExecC2C(plan, d, d, CUFFT_FORWARD));
        CHECK_LIB(cufftExecC2C(plan, d, d, CUFFT_INVERSE));
        CHECK(cudaMemcpyAsync(out.data(), d, count * sizeof(cufftComplex), cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        std::vector<float> got(2 * count), want(2 * count);
        for (int i = 0; i < count; i++) {
            got[2 * i] = out[i].x / count;
            got[2 * i + 1] = out[i].y / count;
            want[2 * i] = in[i].x;
            want[2 * i + 1] = in[i].y;
        }
        expect_close(dims == 1 ? "c2c 1d round trip" : "c2c 2d round trip", got.data(), want.data(), got.size(), 1e-4);
        CHECK_LIB(cufftDestroy(plan));
        CHECK(cudaFree(d));
    }

    // 1D R2C against a direct DFT.
    const int n = 256, bins = n / 2 + 1;
    std::vector<float> real(n);
    for (auto &x : real) x = lib_rand(seed);
    float *dr;
    cufftComplex *dc;
    CHECK(cudaMalloc(&dr, n * sizeof(float)));
    CHECK(cudaMalloc(&dc, bins * sizeof(cufftComplex)));
    CHECK(cudaMemcpy(dr, real.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cufftHandle plan;
    CHECK_LIB(cufftPlan1d(&plan, n, CUFFT_R2C, 1));
    CHECK_LIB(cufftExecR2C(plan, dr, dc));
    std::vector<cufftComplex> spectrum(bins);
    CHECK(cudaMemcpy(spectrum.data(), dc, bins * sizeof(cufftComplex), cudaMemcpyDeviceToHost));
    std::vector<float> got(2 * bins), want(2 * bins);
    for (int k = 0; k < bins; k++) {
        double re = 0, im = 0;
        for (int t = 0; t < n; t++) {
            double angle = -2.0 * M_PI * k * t / n;
            re += real[t] * cos(angle);
            im += real[t] * sin(angle);
        }
        want[2 * k] = (float)re;
        want[2 * k + 1] = (float)im;
        got[2 * k] = spectrum[k].x;
        got[2 * k + 1] = spectrum[k].y;
    }
    expect_close("r2c against a direct dft", got.data(), want.data(), got.size(), 1e-3);
    CHECK_LIB(cufftDestroy(plan));
    CHECK(cudaFree(dr));
    CHECK(cudaFree(dc));
    CHECK(cudaStreamDestroy(stream));
    return test_finish();
}

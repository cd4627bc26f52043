// link: -lcurand
// cuRAND's host API through Flyt: a seeded default generator on the device, uniform and normal
// floats; the first values are printed (the same seed gives the same numbers on the same GPU, so
// they must match the native run) and the moments are checked.
#include <curand.h>

#include <vector>

#include "lib_common.h"

int main() {
    test_init("curand_host");
    const size_t n = 1 << 20;
    float *d;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    curandGenerator_t gen;
    CHECK_LIB(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_DEFAULT));
    CHECK_LIB(curandSetPseudoRandomGeneratorSeed(gen, 20261123ULL));
    std::vector<float> h(n);

    CHECK_LIB(curandGenerateUniform(gen, d, n));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    bool in_range = true;
    for (float x : h) { sum += x; in_range &= x > 0.0f && x <= 1.0f; }
    printf("uniform first: %.6f %.6f %.6f %.6f\n", h[0], h[1], h[2], h[3]);
    printf("uniform in (0, 1]: %s, mean within 0.005 of 0.5: %s\n", in_range ? "yes" : "no", fabs(sum / n - 0.5) < 0.005 ? "yes" : "no");
    EXPECT(in_range && fabs(sum / n - 0.5) < 0.005, "uniform distribution");

    CHECK_LIB(curandGenerateNormal(gen, d, n, 1.0f, 2.0f));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    double s = 0, s2 = 0;
    for (float x : h) { s += x; s2 += (double)x * x; }
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    printf("normal first: %.5f %.5f %.5f %.5f\n", h[0], h[1], h[2], h[3]);
    printf("normal mean within 0.01 of 1: %s, sd within 0.01 of 2: %s\n", fabs(mean - 1) < 0.01 ? "yes" : "no", fabs(sd - 2) < 0.01 ? "yes" : "no");
    EXPECT(fabs(mean - 1) < 0.01 && fabs(sd - 2) < 0.01, "normal distribution");

    CHECK_LIB(curandDestroyGenerator(gen));
    CHECK(cudaFree(d));
    return test_finish();
}

// texture_padded: a texture object over linear memory of float2, declared wider than its buffer
// (as NVIDIA's convolutionFFT2D declares its spectrum textures, padding included), with linear
// filtering and wrap addressing asked for (linear memory ignores them); a kernel fetches the
// elements inside the buffer.
#include "common.h"

__global__ void fetch(cudaTextureObject_t tex, float2 *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float2>(tex, i);
}

int main() {
    test_init("texture_padded");
    const int n = 4096, padding = 16;
    float2 *src, *out;
    CHECK(cudaMalloc(&src, n * sizeof(float2)));
    CHECK(cudaMalloc(&out, n * sizeof(float2)));
    float2 *host = (float2 *)malloc(n * sizeof(float2));
    for (int i = 0; i < n; i++) host[i] = make_float2((float)i, (float)-i);
    CHECK(cudaMemcpy(src, host, n * sizeof(float2), cudaMemcpyHostToDevice));
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = src;
    res.res.linear.sizeInBytes = sizeof(float2) * (n + padding);
    res.res.linear.desc = cudaCreateChannelDesc<float2>();
    cudaTextureDesc desc = {};
    desc.normalizedCoords = false;
    desc.filterMode = cudaFilterModeLinear;
    desc.addressMode[0] = cudaAddressModeWrap;
    desc.readMode = cudaReadModeElementType;
    cudaTextureObject_t tex;
    CHECK(cudaCreateTextureObject(&tex, &res, &desc, NULL));
    fetch<<<(n + 255) / 256, 256>>>(tex, out, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(host, out, n * sizeof(float2), cudaMemcpyDeviceToHost));
    bool right = true;
    for (int i = 0; i < n; i++) right &= host[i].x == (float)i && host[i].y == (float)-i;
    EXPECT(right, "fetched values");
    printf("fetched through a padded float2 texture: %s\n", right ? "right" : "wrong");
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaFree(src));
    CHECK(cudaFree(out));
    free(host);
    return test_finish();
}

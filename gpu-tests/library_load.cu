// Libraries the app loads through the runtime (cudaLibraryLoadData, CUDA 12+), as apps that ship
// or generate their own kernels do: a PTX image (JIT-compiled at load) with two kernels and a
// __device__ variable; the kernel count, the kernels enumerated and found by name (the same
// handle both ways), a launch through cudaLaunchKernel with the cudaKernel_t as the function, the
// kernel's attributes, the variable's size and a copy from it after a kernel wrote it, the error
// for a name the library lacks, and the unload.
#include <vector>

#include "common.h"

static const char image[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .global .align 4 .u32 launches;\n"
    ".visible .entry add_one(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p<2>;\n  .reg .b32 %r<8>;\n  .reg .b64 %rd<5>;\n  .reg .f32 %f<3>;\n"
    "  ld.param.u64 %rd1, [p];\n  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n  mov.u32 %r3, %ntid.x;\n  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ne.u32 %p1, %r5, 0;\n  @%p1 bra WORK;\n"
    "  atom.global.add.u32 %r6, [launches], 1;\n"
    "WORK:\n"
    "  setp.ge.u32 %p1, %r5, %r1;\n  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n  mul.wide.u32 %rd3, %r5, 4;\n  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.f32 %f1, [%rd4];\n  add.f32 %f2, %f1, 0f3F800000;\n  st.global.f32 [%rd4], %f2;\n"
    "DONE:\n  ret;\n}\n"
    ".visible .entry nothing()\n{\n  ret;\n}\n";

int main() {
    test_init("library_load");
    cudaLibrary_t library;
    CHECK(cudaLibraryLoadData(&library, image, nullptr, nullptr, 0, nullptr, nullptr, 0));
    unsigned int count = 0;
    CHECK(cudaLibraryGetKernelCount(&count, library));
    printf("kernels: %u\n", count);
    std::vector<cudaKernel_t> all(count);
    CHECK(cudaLibraryEnumerateKernels(all.data(), count, library));
    cudaKernel_t add_one;
    CHECK(cudaLibraryGetKernel(&add_one, library, "add_one"));
    bool listed = false;
    for (cudaKernel_t k : all) listed |= k == add_one;
    printf("the kernel found by name is among those enumerated: %s\n", listed ? "yes" : "no");
    cudaKernel_t again;
    CHECK(cudaLibraryGetKernel(&again, library, "add_one"));
    printf("the same handle twice: %s\n", again == add_one ? "yes" : "no");
    cudaKernel_t missing;
    printf("a name the library lacks: %s\n", cudaGetErrorName(cudaLibraryGetKernel(&missing, library, "absent")));
    cudaGetLastError();

    const unsigned n = 1 << 16;
    float *data;
    CHECK(cudaMalloc(&data, n * sizeof(float)));
    std::vector<float> host(n);
    for (unsigned i = 0; i < n; i++) host[i] = (float)i;
    CHECK(cudaMemcpy(data, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    void *args[] = {&data, (void *)&n};
    for (int i = 0; i < 3; i++) CHECK(cudaLaunchKernel((const void *)add_one, dim3((n + 255) / 256), dim3(256), args, 0, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (unsigned i = 0; i < n; i++) wrong += host[i] != (float)i + 3.0f;
    printf("three launches: %zu wrong values of %u\n", wrong, n);

    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, (const void *)add_one));
    printf("attributes: max threads per block %d, registers %d\n", attributes.maxThreadsPerBlock, attributes.numRegs);

    void *launches_ptr = nullptr;
    size_t bytes = 0;
    CHECK(cudaLibraryGetGlobal(&launches_ptr, &bytes, library, "launches"));
    unsigned launches = 0;
    CHECK(cudaMemcpy(&launches, launches_ptr, sizeof launches, cudaMemcpyDeviceToHost));
    printf("variable: %zu bytes, counted %u launches\n", bytes, launches);

    CHECK(cudaFree(data));
    CHECK(cudaLibraryUnload(library));
    printf("library_load: %s\n", wrong == 0 && launches == 3 ? "PASS" : "FAIL");
    return wrong == 0 && launches == 3 ? 0 : 1;
}

// JIT linking through the driver API (cuLink*), as nvrtc and Triton-style users do: two PTX
// inputs, one calling a function the other defines, linked into one cubin, loaded and launched;
// then a broken PTX input, whose error and error log must come back. Built with -lcuda.
#include "driver_check.h"

static const char scale_ptx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .func (.param .b32 ret) scale(.param .b32 x)\n"
    "{\n"
    "  .reg .b32 %r<3>;\n"
    "  ld.param.b32 %r1, [x];\n"
    "  mul.lo.s32 %r2, %r1, 3;\n"
    "  st.param.b32 [ret], %r2;\n"
    "  ret;\n"
    "}\n";

static const char kernel_ptx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".extern .func (.param .b32 ret) scale(.param .b32 x);\n"
    ".visible .entry triple(.param .u64 out, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b32 %r<8>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [out];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %p1, %r5, %r1;\n"
    "  @%p1 bra DONE;\n"
    "  {\n"
    "    .param .b32 arg;\n"
    "    .param .b32 res;\n"
    "    st.param.b32 [arg], %r5;\n"
    "    call.uni (res), scale, (arg);\n"
    "    ld.param.b32 %r6, [res];\n"
    "  }\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  st.global.u32 [%rd4], %r6;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

static const char broken_ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                                 ".visible .entry broken() { this is not ptx; }\n";

int main() {
    test_init("jit_link");
    CHECK(cudaFree(0));  // the runtime's primary context, current on this thread
    CHECK_CU(cuInit(0));

    char info_log[8192] = "", error_log[8192] = "";
    float wall_ms = -1;
    CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                              CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_WALL_TIME};
    void *values[] = {info_log, (void *)sizeof info_log, error_log, (void *)sizeof error_log, (void *)4, NULL};
    CUlinkState link;
    CHECK_CU(cuLinkCreate(6, options, values, &link));
    CHECK_CU(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)scale_ptx, sizeof scale_ptx, "scale.ptx", 0, NULL, NULL));
    CHECK_CU(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)kernel_ptx, sizeof kernel_ptx, "triple.ptx", 0, NULL, NULL));
    void *cubin = NULL;
    size_t cubin_size = 0;
    CHECK_CU(cuLinkComplete(link, &cubin, &cubin_size));
    memcpy(&wall_ms, &values[5], sizeof wall_ms);
    fprintf(stderr, "link wall time %.3f ms, cubin %zu bytes\n", wall_ms, cubin_size);
    EXPECT(cubin != NULL && cubin_size > 64, "a cubin came back");
    EXPECT(cubin_size >= 4 && memcmp(cubin, "\x7f" "ELF", 4) == 0, "the cubin is an ELF image");
    EXPECT(wall_ms >= 0, "wall time written back (%f)", wall_ms);
    printf("linked 2 PTX inputs\n");

    // The cubin stays valid until cuLinkDestroy: load it, then destroy the link.
    CUmodule module;
    CHECK_CU(cuModuleLoadData(&module, cubin));
    CHECK_CU(cuLinkDestroy(link));
    CUfunction triple;
    CHECK_CU(cuModuleGetFunction(&triple, module, "triple"));
    const unsigned n = 1000;
    CUdeviceptr out;
    CHECK_CU(cuMemAlloc(&out, n * sizeof(int)));
    void *args[] = {&out, (void *)&n};
    CHECK_CU(cuLaunchKernel(triple, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
    int host[1000];
    CHECK_CU(cuMemcpyDtoH(host, out, sizeof host));
    int wrong = 0;
    for (unsigned i = 0; i < n; i++) wrong += host[i] != (int)(3 * i);
    EXPECT(wrong == 0, "%d of %u values wrong", wrong, n);
    printf("linked kernel: %s\n", wrong == 0 ? "correct" : "WRONG");
    CHECK_CU(cuMemFree(out));
    CHECK_CU(cuModuleUnload(module));

    // A broken input fails at cuLinkAddData, and the error log says why.
    error_log[0] = 0;
    CHECK_CU(cuLinkCreate(6, options, values, &link));
    CUresult broken = cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)broken_ptx, sizeof broken_ptx, "broken.ptx", 0, NULL, NULL);
    const char *name = "?";
    cuGetErrorName(broken, &name);
    printf("broken PTX: %s\n", name);
    EXPECT(broken != CUDA_SUCCESS, "broken PTX accepted");
    fprintf(stderr, "error log: %s\n", error_log);
    printf("error log written: %s\n", error_log[0] ? "yes" : "no");
    CHECK_CU(cuLinkDestroy(link));
    return test_finish();
}

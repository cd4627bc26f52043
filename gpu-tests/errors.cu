// errors: error paths that must not harm the context, and the error-reporting calls themselves.
// Covers: cudaGetErrorString/cudaGetErrorName of many codes (and an unknown one), bad launch
// configurations (block too large, grid too large, zero grid, too much dynamic shared memory; via
// <<<>>> and cudaLaunchKernel),
// cudaGetLastError vs cudaPeekAtLastError (peek keeps, get resets, a later success does not clear,
// a later error replaces),
// bad pointers (never allocated, null, freed, host pointer with a device kind), double/invalid frees,
// an invalid memcpy kind, out-of-range copies and memsets, symbol errors, huge allocations,
// cudaLaunchKernel of a non-kernel. After every error the program proves the context still works by
// running a kernel and checking its result.
// Exact error codes: where CUDA documents the code the program checks it; elsewhere it prints the name
// and only requires an error (the runner compares the printed names with the native run).
#include "common.h"

#include <vector>

__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

__device__ int d_sym[16];

static int g_context_checks = 0;

// Runs a kernel and checks its output: the context survived whatever came before.
static void verify_context(const char *after) {
    const int n = 1000;
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    fill<<<(n + 255) / 256, 256>>>(d, n, 17 + g_context_checks);
    CHECK_LAUNCH();
    int bad = wrong_ints_then_free(d, n, [](int i) { return 17 + g_context_checks + i; });
    g_context_checks++;
    printf("  context works after %s: %s\n", after, bad ? "no" : "yes");
    EXPECT(bad == 0, "kernel after %s: %d wrong", after, bad);
}

// A call that must fail: prints its error name, then what cudaGetLastError says (and clears it).
static void bad_call(const char *what, cudaError_t e) {
    expect_some_err(what, e);
    report("  cudaGetLastError", cudaGetLastError());
    expect_err("  cudaGetLastError again", cudaGetLastError(), cudaSuccess);
}

int main() {
    test_init("errors");

    // 1. Names and strings.
    const int codes[] = {0, 1, 2, 3, 9, 35, 46, 98, 100, 101, 200, 209, 400, 500, 600, 700, 701, 709, 710, 719, 801, 999};
    for (int c : codes)
        printf("code %d: %s / %s\n", c, cudaGetErrorName((cudaError_t)c), cudaGetErrorString((cudaError_t)c));
    printf("code 12345 (unknown): %s / %s\n", cudaGetErrorName((cudaError_t)12345),
           cudaGetErrorString((cudaError_t)12345));
    EXPECT(strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0, "name of 1");
    EXPECT(strcmp(cudaGetErrorName(cudaSuccess), "cudaSuccess") == 0, "name of 0");
    expect_err("cudaGetLastError at start", cudaGetLastError(), cudaSuccess);
    verify_context("start");

    // 2. Bad launch configurations: reported by cudaGetLastError right after the launch. (CUDA 13.0
    //    natively reports cudaErrorInvalidValue for these, not cudaErrorInvalidConfiguration; the
    //    program pins only "an error, the same one every time", and the runner compares the names.)
    fill<<<1, 2048>>>(nullptr, 0, 0);
    const cudaError_t cfg_err = cudaGetLastError();
    expect_some_err("<<<1, 2048>>> cudaGetLastError", cfg_err);
    expect_err("<<<1, 2048>>> cudaGetLastError again", cudaGetLastError(), cudaSuccess);
    verify_context("2048 threads per block");
    {
        int *p = nullptr, n = 0, v = 0;
        void *args[] = {&p, &n, &v};
        expect_some_err("cudaLaunchKernel with 2048 threads per block",
                        cudaLaunchKernel((const void *)fill, dim3(1), dim3(2048), args, 0, 0));
        report("  cudaGetLastError", cudaGetLastError());
        expect_err("  cudaGetLastError again", cudaGetLastError(), cudaSuccess);
    }

    fill<<<dim3(1, 65536, 1), 1>>>(nullptr, 0, 0);
    expect_some_err("grid (1, 65536, 1) cudaGetLastError", cudaGetLastError());
    fill<<<1, dim3(1, 1, 128)>>>(nullptr, 0, 0);
    expect_some_err("block (1, 1, 128) cudaGetLastError", cudaGetLastError());
    fill<<<0, 32>>>(nullptr, 0, 0);
    expect_some_err("<<<0, 32>>> cudaGetLastError", cudaGetLastError());
    fill<<<1, 32, 1 << 20>>>(nullptr, 0, 0);
    expect_some_err("1 MiB dynamic shared memory cudaGetLastError", cudaGetLastError());
    expect_err("cudaGetLastError after those", cudaGetLastError(), cudaSuccess);
    verify_context("bad grids and blocks");

    // 3. Peek vs get: peek keeps the error, get resets it, a later successful call does not clear it.
    fill<<<1, 4096>>>(nullptr, 0, 0);
    expect_err("peek 1", cudaPeekAtLastError(), cfg_err);
    expect_err("peek 2", cudaPeekAtLastError(), cfg_err);
    {
        int *d;
        CHECK(cudaMalloc(&d, 64));  // a success in between
        CHECK(cudaFree(d));
    }
    expect_err("peek 3 (after a successful cudaMalloc/cudaFree)", cudaPeekAtLastError(), cfg_err);
    expect_err("get 1", cudaGetLastError(), cfg_err);
    expect_err("get 2", cudaGetLastError(), cudaSuccess);
    expect_err("peek 4", cudaPeekAtLastError(), cudaSuccess);
    // A later, different error replaces the recorded one.
    fill<<<1, 4096>>>(nullptr, 0, 0);
    {
        void *p = nullptr;
        expect_err("cudaMalloc of 1 PiB after a bad launch", cudaMalloc(&p, (size_t)1 << 50), cudaErrorMemoryAllocation);
    }
    expect_err("get after a bad launch and a failed cudaMalloc", cudaGetLastError(), cudaErrorMemoryAllocation);
    expect_err("get again", cudaGetLastError(), cudaSuccess);
    verify_context("peek/get");

    // 4. Bad pointers.
    const size_t MiB = 1 << 20;
    std::vector<char> host(4 * MiB, 1), host2(4 * MiB, 2);
    {
        int *d_freed;
        CHECK(cudaMalloc(&d_freed, MiB));
        CHECK(cudaFree(d_freed));
        bad_call("cudaMemcpy H2D to a freed pointer", cudaMemcpy(d_freed, host.data(), 4096, cudaMemcpyHostToDevice));
        bad_call("cudaMemcpy D2H from a freed pointer", cudaMemcpy(host.data(), d_freed, 4096, cudaMemcpyDeviceToHost));
        bad_call("cudaMemset on a freed pointer", cudaMemset(d_freed, 0, 4096));
        bad_call("cudaFree of a freed pointer", cudaFree(d_freed));
        verify_context("freed pointers");
    }
    bad_call("cudaMemcpy H2D to nullptr", cudaMemcpy(nullptr, host.data(), 4096, cudaMemcpyHostToDevice));
    bad_call("cudaMemcpy H2D to a never-allocated address",
             cudaMemcpy((void *)(uintptr_t)0x1000, host.data(), 4096, cudaMemcpyHostToDevice));
    bad_call("cudaMemcpy D2H from a never-allocated address",
             cudaMemcpy(host.data(), (void *)(uintptr_t)0x1000, 4096, cudaMemcpyDeviceToHost));
    bad_call("cudaMemcpy H2D with a host destination",
             cudaMemcpy(host2.data(), host.data(), 4096, cudaMemcpyHostToDevice));
    bad_call("cudaMemcpy D2H with a host source", cudaMemcpy(host2.data(), host.data(), 4096, cudaMemcpyDeviceToHost));
    bad_call("cudaMemcpy D2D between host buffers",
             cudaMemcpy(host2.data(), host.data(), 4096, cudaMemcpyDeviceToDevice));
    bad_call("cudaMemset on a host pointer", cudaMemset(host.data(), 0, 4096));
    bad_call("cudaFree of a host pointer", cudaFree(host.data()));
    expect_err("cudaFree(nullptr)", cudaFree(nullptr), cudaSuccess);
    {
        int *d;
        CHECK(cudaMalloc(&d, 4096));
        bad_call("cudaMemcpy with an invalid kind", cudaMemcpy(d, host.data(), 4096, (cudaMemcpyKind)7));
        bad_call("cudaFreeHost of a device pointer", cudaFreeHost(d));
        CHECK(cudaFree(d));
    }
    verify_context("bad pointers");

    // 5. Out-of-range copies and memsets on a 4 MiB allocation (its own 2 MiB-aligned range).
    {
        const size_t size = 4 * MiB;
        char *d_a, *d_b;
        CHECK(cudaMalloc(&d_a, size));
        CHECK(cudaMalloc(&d_b, size));
        std::vector<char> big(16 * MiB, 3);
        bad_call("cudaMemcpy H2D 12 MiB into a 4 MiB allocation",
                 cudaMemcpy(d_a, big.data(), 12 * MiB, cudaMemcpyHostToDevice));
        bad_call("cudaMemcpy H2D of 2 MiB starting 1 MiB before the end",
                 cudaMemcpy(d_a + size - MiB, big.data(), 2 * MiB, cudaMemcpyHostToDevice));
        bad_call("cudaMemcpy D2H 12 MiB from a 4 MiB allocation",
                 cudaMemcpy(big.data(), d_a, 12 * MiB, cudaMemcpyDeviceToHost));
        bad_call("cudaMemcpy D2D 12 MiB between 4 MiB allocations",
                 cudaMemcpy(d_b, d_a, 12 * MiB, cudaMemcpyDeviceToDevice));
        bad_call("cudaMemset of 12 MiB on a 4 MiB allocation", cudaMemset(d_a, 0, 12 * MiB));
        // The in-range part of the allocation is intact and usable.
        CHECK(cudaMemcpy(d_a, host.data(), size, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(big.data(), d_a, size, cudaMemcpyDeviceToHost));
        EXPECT(memcmp(big.data(), host.data(), size) == 0, "in-range copy after out-of-range attempts differs");
        CHECK(cudaFree(d_a));
        CHECK(cudaFree(d_b));
        verify_context("out-of-range copies");
    }

    // 6. Symbols.
    {
        int vals[32] = {0};
        static int not_a_symbol[16];
        bad_call("cudaMemcpyToSymbol past the end of a 64-byte symbol", cudaMemcpyToSymbol(d_sym, vals, sizeof(vals)));
        bad_call("cudaMemcpyToSymbol with offset past the end",
                 cudaMemcpyToSymbol(d_sym, vals, 16, 60));
        bad_call("cudaMemcpyFromSymbol of a host variable",
                 cudaMemcpyFromSymbol(vals, not_a_symbol, sizeof(not_a_symbol)));
        void *addr = nullptr;
        bad_call("cudaGetSymbolAddress of a host variable", cudaGetSymbolAddress(&addr, not_a_symbol));
        CHECK(cudaMemcpyToSymbol(d_sym, vals, sizeof(d_sym)));
        verify_context("symbol errors");
    }

    // 7. Allocation failures and odd sizes.
    {
        void *p = nullptr;
        expect_err("cudaMalloc of 1 PiB", cudaMalloc(&p, (size_t)1 << 50), cudaErrorMemoryAllocation);
        expect_err("  cudaGetLastError", cudaGetLastError(), cudaErrorMemoryAllocation);
        expect_err("  cudaGetLastError again", cudaGetLastError(), cudaSuccess);
        p = (void *)(uintptr_t)1;
        expect_err("cudaMalloc of 0 bytes", cudaMalloc(&p, 0), cudaSuccess);
        printf("  cudaMalloc of 0 bytes gives null: %s\n", p == nullptr ? "yes" : "no");
        if (p) CHECK(cudaFree(p));
        verify_context("allocation failures");
    }

    // 8. Launching something that is not a kernel.
    {
        void *args[] = {nullptr};
        bad_call("cudaLaunchKernel of a host function",
                 cudaLaunchKernel((const void *)verify_context, dim3(1), dim3(1), args, 0, 0));
        bad_call("cudaLaunchKernel of nullptr", cudaLaunchKernel((const void *)nullptr, dim3(1), dim3(1), args, 0, 0));
        verify_context("launching non-kernels");
    }

    CHECK(cudaDeviceSynchronize());
    expect_err("cudaGetLastError at the end", cudaGetLastError(), cudaSuccess);
    return test_finish();
}

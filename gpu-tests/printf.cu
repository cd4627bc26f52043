// printf: device printf from several kernels on several streams, interleaved with host prints.
//
// CUDA writes device printf output to the process's stdout (file descriptor 1) only at flush points:
// the start of a kernel launch, cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
// blocking cudaMemcpy, module unload and context teardown (cudaDeviceReset). The program only prints
// from the host at points where every printing kernel launched so far is known to be flushed, and
// fflushes stdout before every CUDA call that can flush, so the byte order of stdout is the same on
// every run:
//   - kernels that print from several threads serialize them with __syncthreads;
//   - kernels on several streams are ordered with events, or their output is captured (fd 1
//     redirected to a temporary file around the kernels, as output-capturing tools do) and sorted;
//   - a kernel that prints more than a small FIFO holds is captured and only facts that do not
//     depend on how much CUDA dropped, where, or in what order the rest came out (the host may
//     drain the FIFO while the kernel runs, natively too): some lines arrived, no more than were
//     printed, each one whole.
// Also: cudaDeviceSetLimit/cudaDeviceGetLimit(cudaLimitPrintfFifoSize) round trip, printf of many
// argument types, a line built by several printf calls, output flushed by cudaDeviceReset.
// Nothing is printed on stderr (the runner compares stderr too).
#include "common.h"

#include <algorithm>
#include <string>
#include <unistd.h>
#include <vector>

__device__ char d_text[] = "device-memory string";

// One thread prints `lines` lines.
__global__ void lines_kernel(int id, int lines) {
    if (threadIdx.x == 0 && blockIdx.x == 0)
        for (int i = 0; i < lines; i++) printf("kernel %d: line %d of %d\n", id, i + 1, lines);
}

// Every thread of one block prints once, in thread order (one thread per barrier step).
__global__ void ordered_threads_kernel(int id) {
    for (int t = 0; t < (int)blockDim.x; t++) {
        if ((int)threadIdx.x == t) printf("kernel %d: thread %d of %d\n", id, t, (int)blockDim.x);
        __syncthreads();
    }
}

// Writes a value (for the blocking-copy flush) and prints it.
__global__ void store_kernel(int *out, int value) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        *out = value;
        printf("store kernel: wrote %d\n", value);
    }
}

__global__ void types_kernel() {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    printf("int: %d %i |%5d|%-5d|%05d| %+d\n", -42, 42, 7, 7, 7, 7);
    printf("unsigned: %u %x %X %#x %o %#o\n", 4000000000u, 0xbeefu, 0xbeefu, 255u, 8u, 8u);
    printf("long long: %lld %llu %llx\n", -9000000000000000000LL, 18000000000000000000ULL, 0x123456789abcdefULL);
    printf("long: %ld %lu\n", -1234567890123L, 1234567890123UL);
    printf("short and char: %hd %hu %hhd %c%c%c\n", (short)-1234, (unsigned short)60000, (signed char)-5, 'x', 'y',
           'z');
    printf("float: %f %.2f %e %.3E %g %G\n", 3.14159f, -2.5f, 12345.678f, 0.000123f, 1e-5f, 1e20f);
    printf("double: %.10f %le %lg %.17g\n", 1.0 / 3.0, 6.02214076e23, 2.0 / 3.0, 0.1);
    printf("hex float: %a %A\n", 1.0, -0.75);
    double zero = 0.0;
    printf("special: %f %f %d\n", 1.0 / zero, -1.0 / zero, (int)isnan(zero / zero));
    printf("strings: %s|%10s|%-10s|%.6s|%s\n", "literal", "right", "left", "truncated", d_text);
    printf("percent: 100%%\n");
    printf("null pointer: %p\n", (void *)0);
    printf("32 arguments: %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d "
           "%d %d\n",
           1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
           29, 30, 31, 32);
    printf("mixed: %d %.3f %s %llu %c %e\n", -1, 2.5, "three", 4ULL, '5', 6e6);
    printf("a line ");
    printf("from three ");
    printf("printf calls\n");
    printf("%s\n", "a long line: 0123456789012345678901234567890123456789012345678901234567890123456789"
                   "0123456789012345678901234567890123456789012345678901234567890123456789");
}

// Tagged single line from a kernel that runs concurrently with others (captured and sorted).
__global__ void tagged_kernel(int stream, int kernel) {
    if (threadIdx.x == 0 && blockIdx.x == 0) printf("concurrent: stream %02d kernel %d\n", stream, kernel);
}

// One thread prints `n` numbered lines: more than a small FIFO holds.
__global__ void flood_kernel(int n) {
    if (threadIdx.x == 0 && blockIdx.x == 0)
        for (int i = 0; i < n; i++) printf("flood %05d\n", i);
}

__global__ void partial_kernel() {
    if (threadIdx.x == 0 && blockIdx.x == 0) printf("device text without a newline, ");
}

// Host prints: always flushed before a CUDA call that may flush device output.
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

// fd 1 redirected to a temporary file for a while (what output-capturing tools do).
struct Capture {
    int saved = -1;
    FILE *file = nullptr;
    bool begin() {
        fflush(stdout);
        file = tmpfile();
        if (!file) return false;
        saved = dup(1);
        if (saved < 0 || dup2(fileno(file), 1) < 0) return false;
        return true;
    }
    std::vector<std::string> end() {
        std::vector<std::string> lines;
        fflush(stdout);
        if (saved >= 0) {
            dup2(saved, 1);
            close(saved);
        }
        if (!file) return lines;
        rewind(file);
        std::string cur;
        int c;
        while ((c = fgetc(file)) != EOF) {
            if (c == '\n') {
                lines.push_back(cur);
                cur.clear();
            } else {
                cur += (char)c;
            }
        }
        if (!cur.empty()) lines.push_back(cur + "<no newline>");
        fclose(file);
        return lines;
    }
};

int main() {
    test_init("printf");

    // 1. The FIFO limit: default, set, read back (before any kernel that prints has run).
    size_t fifo = 0;
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    say("printf fifo size, default: %zu\n", fifo);
    const size_t small_fifo = 64 << 10;
    CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, small_fifo));
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    say("printf fifo size, after setting %zu: %zu\n", small_fifo, fifo);

    cudaStream_t s[3];
    cudaEvent_t e[3];
    for (int i = 0; i < 3; i++) {
        CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
        CHECK(cudaEventCreateWithFlags(&e[i], cudaEventDisableTiming));
    }

    // 2. Three kernels on three streams, ordered by events; one stream synchronize flushes them all.
    say("A: three kernels on three streams, ordered by events\n");
    lines_kernel<<<1, 32, 0, s[0]>>>(1, 3);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(e[0], s[0]));
    CHECK(cudaStreamWaitEvent(s[1], e[0], 0));
    ordered_threads_kernel<<<1, 8, 0, s[1]>>>(2);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(e[1], s[1]));
    CHECK(cudaStreamWaitEvent(s[2], e[1], 0));
    lines_kernel<<<1, 32, 0, s[2]>>>(3, 2);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s[2]));
    say("A: after cudaStreamSynchronize of the last stream\n");

    // 3. Nothing appears before a flush point: the host line printed after the launch comes first.
    say("B: before the launch\n");
    lines_kernel<<<2, 64>>>(4, 2);
    CHECK_LAUNCH();
    say("B: launched, not synchronized yet\n");
    CHECK(cudaDeviceSynchronize());
    say("B: after cudaDeviceSynchronize\n");

    // 4. cudaEventSynchronize flushes.
    lines_kernel<<<1, 1, 0, s[1]>>>(5, 2);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(e[1], s[1]));
    say("C: before cudaEventSynchronize\n");
    CHECK(cudaEventSynchronize(e[1]));
    say("C: after cudaEventSynchronize\n");

    // 5. Blocking copies flush (the second copy starts after the kernel has certainly finished).
    int *d_val = nullptr, h_val = 0;
    CHECK(cudaMalloc(&d_val, sizeof(int)));
    say("D: before blocking copies\n");
    store_kernel<<<1, 1>>>(d_val, 1234);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&h_val, d_val, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&h_val, d_val, sizeof(int), cudaMemcpyDeviceToHost));
    say("D: after blocking copies, value %d\n", h_val);
    EXPECT(h_val == 1234, "store kernel value %d", h_val);

    // 6. Every argument type.
    say("E: argument types\n");
    types_kernel<<<1, 1, 0, s[0]>>>();
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s[0]));
    say("E: done\n");

    // 7. A partial line from the device is completed by the host: no newline may be added.
    partial_kernel<<<1, 1>>>();
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    say("completed by the host\n");

    // 8. Eight streams with two kernels each, running concurrently: every line arrives exactly once.
    {
        const int ns = 8;
        cudaStream_t cs[ns];
        for (int i = 0; i < ns; i++) CHECK(cudaStreamCreateWithFlags(&cs[i], cudaStreamNonBlocking));
        Capture cap;
        bool ok = cap.begin();
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < ns; i++) {
                tagged_kernel<<<1, 32, 0, cs[i]>>>(i, k);
                if (cudaGetLastError() != cudaSuccess) ok = false;
            }
        cudaError_t se = cudaDeviceSynchronize();
        std::vector<std::string> lines = cap.end();
        CHECK(se);
        EXPECT(ok, "capture or launch failed");
        std::sort(lines.begin(), lines.end());
        say("F: %zu lines from %d concurrent kernels (sorted):\n", lines.size(), 2 * ns);
        for (const auto &l : lines) say("  %s\n", l.c_str());
        for (int i = 0; i < ns; i++) CHECK(cudaStreamDestroy(cs[i]));
    }

    // 9. More output than the FIFO holds: CUDA drops what does not fit. Printed: facts that hold
    //    wherever the cut is.
    {
        const int n = 20000;  // at least 20000 records of >= 16 bytes: well over 64 KiB
        Capture cap;
        bool ok = cap.begin();
        flood_kernel<<<1, 1>>>(n);
        if (cudaGetLastError() != cudaSuccess) ok = false;
        cudaError_t se = cudaDeviceSynchronize();
        std::vector<std::string> lines = cap.end();
        CHECK(se);
        EXPECT(ok, "capture or launch failed");
        // How many lines are dropped, which ones, and in what order the rest arrive depends on
        // when the host drains the FIFO while the kernel runs (the driver does, natively too, and
        // natively the kept lines are not always in printing order), so only facts that hold for
        // any drain schedule are printed.
        bool whole = true;
        for (const auto &l : lines) {
            int v = -1;
            char extra = 0;
            if (l.size() != 11 || sscanf(l.c_str(), "flood %5d%c", &v, &extra) != 1 || v < 0 || v >= n) whole = false;
        }
        say("G: flood of %d lines through a %zu-byte FIFO\n", n, fifo);
        say("G: some lines arrived: %s\n", lines.empty() ? "no" : "yes");
        say("G: no more lines than printed arrived: %s\n", (int)lines.size() <= n ? "yes" : "no");
        say("G: every arrived line is whole: %s\n", whole ? "yes" : "no");
    }

    // 10. Output after the flood is complete again.
    lines_kernel<<<1, 1>>>(6, 2);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    say("H: after the flood\n");

    // 11. The FIFO size once kernels that print have run: whatever CUDA answers.
    report("cudaDeviceSetLimit(cudaLimitPrintfFifoSize) after printing kernels ran",
           cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 1 << 20));
    cudaGetLastError();
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    say("printf fifo size now: %zu\n", fifo);

    // 12. cudaDeviceReset flushes: the kernel has finished (event polled, no host output in between)
    //     and its lines come before the host's next line.
    for (int i = 0; i < 3; i++) {
        CHECK(cudaStreamDestroy(s[i]));
        CHECK(cudaEventDestroy(e[i]));
    }
    CHECK(cudaFree(d_val));
    say("I: before cudaDeviceReset\n");
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    lines_kernel<<<1, 1>>>(7, 2);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(done, 0));
    cudaError_t q;
    while ((q = cudaEventQuery(done)) == cudaErrorNotReady) usleep(1000);
    CHECK(q);
    CHECK(cudaEventDestroy(done));
    CHECK(cudaDeviceReset());
    say("I: after cudaDeviceReset\n");
    lines_kernel<<<1, 1>>>(8, 1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    say("J: kernels print after the reset\n");
    return test_finish();
}

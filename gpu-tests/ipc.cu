// CUDA IPC between two processes on one GPU, as Open MPI's smcuda and the vineyard GPU store use
// it: the parent exports a 16 MiB allocation and an interprocess event (recorded after a 200 ms
// kernel that writes a marker), starts a second process of this program, which opens both, waits
// on the event (so it must see the marker), checks every value, opens the handle again (the same
// pointer: a counted reference), writes the second half through the mapping, closes once (the
// mapping stays usable) and again; the parent then checks the second half. Through Flyt each
// process is its own session, served by its own worker on the same GPU.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "common.h"
#include "hex_text.h"

extern char **environ;

static const size_t N = 4 << 20;  // floats: 16 MiB
static const size_t MARKED = 1024;

static __global__ void fill(float *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = (float)(i % 1000) * 3.0f + 1.0f;
}

static __global__ void mark(float *p, size_t n, float value) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = value;
}

static int child(const char *mem_hex, const char *event_hex) {
    test_init("ipc child");
    cudaIpcMemHandle_t mem_handle;
    cudaIpcEventHandle_t event_handle;
    from_hex(mem_hex, &mem_handle, sizeof mem_handle);
    from_hex(event_hex, &event_handle, sizeof event_handle);
    float *p = NULL, *again = NULL;
    CHECK(cudaIpcOpenMemHandle((void **)&p, mem_handle, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t event;
    CHECK(cudaIpcOpenEventHandle(&event, event_handle));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaStreamWaitEvent(stream, event, 0));
    std::vector<float> host(N);
    CHECK(cudaMemcpyAsync(host.data(), p, N * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    bool marked = true, filled = true;
    for (size_t i = 0; i < N; i++) {
        if (i < MARKED) marked &= host[i] == -5.0f;
        else filled &= host[i] == (float)(i % 1000) * 3.0f + 1.0f;
    }
    printf("child: waited on the parent's event, marker seen: %s\n", marked ? "yes" : "no");
    printf("child: every exported value read: %s\n", filled ? "yes" : "no");
    CHECK(cudaIpcOpenMemHandle((void **)&again, mem_handle, cudaIpcMemLazyEnablePeerAccess));
    printf("child: opening again gives the same pointer: %s\n", again == p ? "yes" : "no");
    // Reopen and close 1000 times while the mapping is open (timing on stderr only).
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; i++) {
        float *q = NULL;
        CHECK(cudaIpcOpenMemHandle((void **)&q, mem_handle, cudaIpcMemLazyEnablePeerAccess));
        CHECK(cudaIpcCloseMemHandle(q));
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / 1000;
    fprintf(stderr, "child: reopen + close of an open handle: %.2f us per pair\n", us);
    mark<<<(unsigned)((N / 2 + 255) / 256), 256>>>(p + N / 2, N / 2, 7.0f);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaIpcCloseMemHandle(again));
    float probe = 0;
    CHECK(cudaMemcpy(&probe, p + N / 2, sizeof probe, cudaMemcpyDeviceToHost));
    printf("child: after one close the mapping still reads: %s\n", probe == 7.0f ? "yes" : "no");
    CHECK(cudaIpcCloseMemHandle(p));
    cudaError_t refused = cudaIpcCloseMemHandle(p);
    printf("child: closing a mapping no longer open: %s\n", cudaGetErrorName(refused));
    EXPECT(refused != cudaSuccess, "closing a closed mapping is refused");
    cudaGetLastError();
    CHECK(cudaEventDestroy(event));
    CHECK(cudaStreamDestroy(stream));
    return test_finish();
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "child") == 0) return child(argv[2], argv[3]);
    test_init("ipc");
    float *buf = NULL;
    CHECK(cudaMalloc(&buf, N * sizeof(float)));
    fill<<<(unsigned)((N + 255) / 256), 256>>>(buf, N);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t mem_handle;
    CHECK(cudaIpcGetMemHandle(&mem_handle, buf));
    cudaIpcMemHandle_t interior;
    CHECK(cudaIpcGetMemHandle(&interior, buf + 100));
    printf("a handle of an interior pointer names the same allocation: %s\n",
           memcmp(&interior, &mem_handle, sizeof interior) == 0 ? "yes" : "no");
    // Refusals whose exact code CUDA does not document: the names are compared with native's.
    cudaError_t refused = cudaIpcGetMemHandle(&interior, &interior);
    printf("a handle of host memory: %s\n", cudaGetErrorName(refused));
    EXPECT(refused != cudaSuccess, "a handle of host memory is refused");
    float *own = NULL;
    refused = cudaIpcOpenMemHandle((void **)&own, mem_handle, cudaIpcMemLazyEnablePeerAccess);
    printf("opening one's own handle: %s\n", cudaGetErrorName(refused));
    EXPECT(refused != cudaSuccess, "opening one's own handle is refused");
    cudaGetLastError();
    cudaEvent_t event;
    expect_err("an interprocess event must not time",
               cudaEventCreateWithFlags(&event, cudaEventInterprocess), cudaErrorInvalidValue);
    cudaGetLastError();
    CHECK(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming));
    // The marker lands 200 ms after the launch: the child sees it only by waiting on the event.
    spin_kernel<<<1, 1>>>(200ull * 1000 * 1000, NULL, 0);
    CHECK_LAUNCH();
    mark<<<(MARKED + 255) / 256, 256>>>(buf, MARKED, -5.0f);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(event, 0));
    cudaIpcEventHandle_t event_handle;
    CHECK(cudaIpcGetEventHandle(&event_handle, event));
    char mem_hex[2 * sizeof mem_handle + 1], event_hex[2 * sizeof event_handle + 1];
    to_hex(&mem_handle, sizeof mem_handle, mem_hex);
    to_hex(&event_handle, sizeof event_handle, event_hex);
    char self[4096];
    if (!own_path(self, sizeof self)) return 1;
    char child_arg[] = "child";
    char *child_argv[] = {self, child_arg, mem_hex, event_hex, NULL};
    fflush(stdout);
    pid_t pid;
    if (posix_spawn(&pid, self, NULL, NULL, child_argv, environ) != 0) {
        printf("FAIL: posix_spawn\n");
        return 1;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child process passed");
    std::vector<float> host(N);
    CHECK(cudaMemcpy(host.data(), buf, N * sizeof(float), cudaMemcpyDeviceToHost));
    bool written = true, kept = true;
    for (size_t i = MARKED; i < N; i++) {
        if (i >= N / 2) written &= host[i] == 7.0f;
        else kept &= host[i] == (float)(i % 1000) * 3.0f + 1.0f;
    }
    printf("the child's writes through the mapping are in the allocation: %s\n", written ? "yes" : "no");
    printf("the rest is untouched: %s\n", kept ? "yes" : "no");
    CHECK(cudaEventDestroy(event));
    CHECK(cudaFree(buf));
    return test_finish();
}

// CUDA IPC between two processes on two GPUs, as inference servers' tensor-parallel workers use
// it: each process sees both GPUs and works on its own (the parent on GPU 0, a second process of
// this program on GPU 1); they exchange IPC handles of their buffers over a pipe and peer-access
// each other's memory. The child opens the parent's buffer (on GPU 0) and a kernel on GPU 1 reads
// it; the parent opens the child's buffer (on GPU 1) and a kernel on GPU 0 writes into it; the
// child then checks those writes. Through Flyt both processes are sessions of one server holding
// both GPUs. Needs two GPUs that are peers; prints why not otherwise.
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common.h"
#include "hex_text.h"

extern char **environ;

static const size_t N = 8 << 20;  // ints: 32 MiB

static __global__ void fill(int *p, size_t n, int scale, int offset) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = (int)(i % 1000) * scale + offset;
}

// out = a + b, where one of them is the other GPU's memory.
static __global__ void add(const int *a, const int *b, int *out, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

static unsigned blocks() { return (unsigned)((N + 255) / 256); }

// Reads one line from fd, waiting at most 120 s (no wait here is unbounded).
static bool read_line(int fd, std::string &line) {
    line.clear();
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 120 * 1000) != 1) return false;
        char c;
        if (read(fd, &c, 1) != 1) return false;
        if (c == '\n') return true;
        line.push_back(c);
    }
}

static bool all_equal(const std::vector<int> &v, int scale, int offset) {
    for (size_t i = 0; i < v.size(); i++)
        if (v[i] != (int)(i % 1000) * scale + offset) return false;
    return true;
}

static int child(const char *parent_hex, int to_parent, int from_parent) {
    test_init("ipc_peers child");
    CHECK(cudaSetDevice(1));
    int *mine = NULL, *sum = NULL, *theirs = NULL;
    CHECK(cudaMalloc(&mine, N * sizeof(int)));
    CHECK(cudaMalloc(&sum, N * sizeof(int)));
    fill<<<blocks(), 256>>>(mine, N, 2, 1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t handle;
    from_hex(parent_hex, &handle, sizeof handle);
    CHECK(cudaIpcOpenMemHandle((void **)&theirs, handle, cudaIpcMemLazyEnablePeerAccess));
    cudaPointerAttributes attributes;
    CHECK(cudaPointerGetAttributes(&attributes, theirs));
    printf("child (GPU 1): the parent's buffer is device memory of GPU %d\n", attributes.device);
    add<<<blocks(), 256>>>(theirs, mine, sum, N);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    std::vector<int> host(N);
    CHECK(cudaMemcpy(host.data(), sum, N * sizeof(int), cudaMemcpyDeviceToHost));
    printf("child (GPU 1): a kernel read the parent's GPU 0 buffer: %s\n", all_equal(host, 3, 1) ? "right" : "WRONG");
    CHECK(cudaMemcpy(host.data(), theirs, N * sizeof(int), cudaMemcpyDeviceToHost));
    printf("child (GPU 1): a copy from the parent's buffer: %s\n", all_equal(host, 1, 0) ? "right" : "WRONG");

    CHECK(cudaIpcGetMemHandle(&handle, mine));
    char hex[2 * sizeof handle + 2];
    to_hex(&handle, sizeof handle, hex);
    strcat(hex, "\n");
    EXPECT(write(to_parent, hex, strlen(hex)) == (ssize_t)strlen(hex), "the handle went to the parent");
    std::string go;
    EXPECT(read_line(from_parent, go) && go == "written", "the parent wrote into this buffer");
    CHECK(cudaMemcpy(host.data(), mine, N * sizeof(int), cudaMemcpyDeviceToHost));
    // The parent added its own values (i % 1000) through its mapping of this buffer.
    printf("child (GPU 1): the parent's kernel on GPU 0 wrote into this buffer: %s\n", all_equal(host, 3, 1) ? "right" : "WRONG");
    CHECK(cudaIpcCloseMemHandle(theirs));
    CHECK(cudaFree(sum));
    CHECK(cudaFree(mine));
    return test_finish();
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "child") == 0) return child(argv[2], atoi(argv[3]), atoi(argv[4]));
    test_init("ipc_peers");
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    int peers = 0;
    if (count >= 2) CHECK(cudaDeviceCanAccessPeer(&peers, 0, 1));
    printf("devices: %d, GPU 0 can access GPU 1: %d\n", count, peers);
    if (count < 2 || !peers) {
        printf("ipc_peers: needs two GPUs that are peers\n");
        return test_finish();
    }
    CHECK(cudaSetDevice(0));
    int *mine = NULL, *theirs = NULL;
    CHECK(cudaMalloc(&mine, N * sizeof(int)));
    fill<<<blocks(), 256>>>(mine, N, 1, 0);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t handle;
    CHECK(cudaIpcGetMemHandle(&handle, mine));
    char hex[2 * sizeof handle + 1];
    to_hex(&handle, sizeof handle, hex);

    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
        printf("FAIL: pipe\n");
        return 1;
    }
    char self[4096];
    if (!own_path(self, sizeof self)) return 1;
    char write_fd[16], read_fd[16], child_arg[] = "child";
    snprintf(write_fd, sizeof write_fd, "%d", from_child[1]);
    snprintf(read_fd, sizeof read_fd, "%d", to_child[0]);
    char *child_argv[] = {self, child_arg, hex, write_fd, read_fd, NULL};
    fflush(stdout);
    pid_t pid;
    if (posix_spawn(&pid, self, NULL, NULL, child_argv, environ) != 0) {
        printf("FAIL: posix_spawn\n");
        return 1;
    }
    close(from_child[1]);
    close(to_child[0]);
    // The parent's lines wait until the child has finished, so the output's order is fixed.
    std::string child_hex;
    bool got = read_line(from_child[0], child_hex) && child_hex.size() == 2 * sizeof handle;
    bool wrote = false;
    cudaPointerAttributes attributes = {};
    if (got) {
        from_hex(child_hex.c_str(), &handle, sizeof handle);
        CHECK(cudaIpcOpenMemHandle((void **)&theirs, handle, cudaIpcMemLazyEnablePeerAccess));
        CHECK(cudaPointerGetAttributes(&attributes, theirs));
        // A kernel on GPU 0 adds this buffer's values into the child's GPU 1 buffer.
        add<<<blocks(), 256>>>(theirs, mine, theirs, N);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaIpcCloseMemHandle(theirs));
        wrote = write(to_child[1], "written\n", 8) == 8;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("parent (GPU 0): got the child's handle: %s\n", got ? "yes" : "no");
    printf("parent (GPU 0): the child's buffer is device memory of GPU %d\n", attributes.device);
    EXPECT(wrote, "the parent told the child it wrote");
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child process passed");
    CHECK(cudaFree(mine));
    return test_finish();
}

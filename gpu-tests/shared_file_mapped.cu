// shared_file_mapped: two processes share a /dev/shm file, each maps it and registers it for the
// device (cudaHostRegisterMapped), and one's kernels read what the other's wrote, as NCCL's ranks
// do with their /dev/shm segments when no peer-to-peer path is used.
// Covers: cudaHostRegister(Mapped) of a shared file mapping at an unaligned offset,
// cudaHostGetDevicePointer, cudaHostGetFlags, kernels writing and reading it in two processes
// (two sessions through Flyt), cudaMemsetAsync on it, cudaHostUnregister and registering again,
// and a private malloc'd buffer registered for copies.
//
// Through Flyt this needs the shared-memory channel (the server maps the same file at the same
// address); over a socket alone the registration fails loudly, which gpu-tests/run.sh expects.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

static const unsigned N = 1 << 18;
static const size_t HALF = N * sizeof(unsigned);
// The file: an unaligned header, then the child's half, then the parent's results, then 4 bytes
// into a last page (as NCCL's segments end).
static const size_t OFFSET = 192;
static const size_t FILE_BYTES = OFFSET + 2 * HALF + 4;

__global__ void write_pattern(unsigned *out, unsigned n, unsigned salt) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * 3 + salt;
}

__global__ void sum_and_double(const unsigned *in, unsigned *doubled, unsigned n, unsigned long long *total) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicAdd(total, (unsigned long long)in[i]);
        doubled[i] = 2 * in[i];
    }
}

// Maps the file; its descriptor stays open in *fd.
static unsigned char *map_file(const char *path, int *fd) {
    *fd = open(path, O_RDWR);
    if (*fd < 0) return nullptr;
    void *p = mmap(nullptr, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    return p == MAP_FAILED ? nullptr : (unsigned char *)p;
}

// The other process: writes the pattern into the first half with a kernel, through the mapping.
static int child(const char *path) {
    int fd = -1;
    unsigned char *file = map_file(path, &fd);
    if (!file) return 2;
    close(fd);
    unsigned *half = (unsigned *)(file + OFFSET);
    if (cudaHostRegister(half, HALF, cudaHostRegisterMapped | cudaHostRegisterPortable) != cudaSuccess) return 3;
    unsigned *device = nullptr;
    if (cudaHostGetDevicePointer((void **)&device, half, 0) != cudaSuccess) return 4;
    write_pattern<<<(N + 255) / 256, 256>>>(device, N, 7);
    if (cudaDeviceSynchronize() != cudaSuccess) return 5;
    if (cudaHostUnregister(half) != cudaSuccess) return 6;
    return 0;
}

int main() {
    test_init("shared_file_mapped");
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/flyt-shared-file-%d", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, FILE_BYTES) != 0) {
        printf("FAIL: no file in /dev/shm\n%s: FAIL\n", g_test_name);
        return 1;
    }
    close(fd);

    // The child starts before this process makes any CUDA call: a process of its own, as a rank.
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(child(path));
    int status = 0;
    waitpid(pid, &status, 0);
    printf("the other process wrote its half: %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "yes" : "no");
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        fprintf(stderr, "child status %d\n", status);
        g_failures++;
    }

    // Removed before it is registered, its descriptor still open, as NCCL's last rank to attach
    // does it.
    unsigned char *file = map_file(path, &fd);
    EXPECT(file != nullptr, "map %s", path);
    unlink(path);
    if (!file) return test_finish();
    unsigned *half = (unsigned *)(file + OFFSET);
    unsigned *results = half + N;
    CHECK(cudaHostRegister(half, 2 * HALF, cudaHostRegisterMapped));
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, half));
    printf("flags include cudaHostRegisterMapped: %s\n", (flags & cudaHostRegisterMapped) ? "yes" : "no");
    unsigned *device = nullptr;
    CHECK(cudaHostGetDevicePointer((void **)&device, half, 0));
    printf("device pointer equals the host pointer: %s\n", device == half ? "yes" : "no");

    unsigned long long *total = nullptr, host_total = 0;
    CHECK(cudaMalloc(&total, sizeof *total));
    CHECK(cudaMemset(total, 0, sizeof *total));
    sum_and_double<<<(N + 255) / 256, 256>>>(device, device + N, N, total);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&host_total, total, sizeof host_total, cudaMemcpyDeviceToHost));
    unsigned long long expected = 0;
    for (unsigned i = 0; i < N; i++) expected += i * 3 + 7;
    printf("sum of what the other process's kernel wrote: %llu (%s)\n", host_total, host_total == expected ? "right" : "WRONG");
    if (host_total != expected) g_failures++;
    unsigned wrong = 0;
    for (unsigned i = 0; i < N; i++) wrong += results[i] != 2 * (i * 3 + 7);
    printf("doubled by this process's kernel, read by the host: %u wrong\n", wrong);
    if (wrong) g_failures++;

    // A memset through the device pointer, then unregistered and registered again.
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMemsetAsync(device + N, 0x5a, 4096, stream));
    CHECK(cudaStreamSynchronize(stream));
    printf("memset seen by the host: %s\n", results[0] == 0x5a5a5a5au && results[1023] == 0x5a5a5a5au && results[1024] != 0x5a5a5a5au ? "yes" : "no");
    CHECK(cudaHostUnregister(half));
    expect_err("unregistering it twice", cudaHostUnregister(half), cudaErrorHostMemoryNotRegistered);
    cudaGetLastError();
    CHECK(cudaHostRegister(half, HALF, cudaHostRegisterMapped));
    write_pattern<<<(N + 255) / 256, 256, 0, stream>>>(half, N, 100);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(stream));
    wrong = 0;
    for (unsigned i = 0; i < N; i++) wrong += half[i] != i * 3 + 100;
    printf("registered again, a kernel's writes: %u wrong\n", wrong);
    if (wrong) g_failures++;
    CHECK(cudaHostUnregister(half));

    // Private memory registered for copies.
    unsigned *own = (unsigned *)malloc(HALF);
    CHECK(cudaHostRegister(own, HALF, cudaHostRegisterDefault));
    CHECK(cudaMemcpy(own, total, sizeof *total, cudaMemcpyDeviceToHost));
    printf("a copy into registered private memory: %s\n", *(unsigned long long *)own == expected ? "right" : "WRONG");
    CHECK(cudaHostUnregister(own));
    free(own);

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(total));
    munmap(file, FILE_BYTES);
    close(fd);
    return test_finish();
}

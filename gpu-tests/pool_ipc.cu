// A memory pool and an allocation of it shared between two processes on one GPU, as the CUDA
// sample streamOrderedAllocationIPC does: the parent makes a pool with the POSIX file descriptor
// handle type, allocates 16 MiB from it in stream order and fills it with a kernel, exports the
// pool (cudaMemPoolExportToShareableHandle) and the allocation (cudaMemPoolExportPointer), and
// sends the descriptor and the export data over a Unix socket (SCM_RIGHTS) to a forked child; the
// child imports the pool (cudaMemPoolImportFromShareableHandle, read-write access on its device)
// and the allocation (cudaMemPoolImportPointer), counts wrong words with a kernel, overwrites the
// second half with a kernel and says so; the parent checks both halves. The importer frees first,
// as CUDA requires, then the exporter frees and destroys the pool. Also the errors of exporting
// the default pool (made without a handle type), of export data for cudaMalloc memory and of
// allocating from an imported pool (names printed). Through Flyt each process is its own
// session.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "common.h"
#include "fd_passing.h"
#include "word_pattern.h"

static const size_t WORDS = 4 << 20;  // 16 MiB of uint32_t
static const size_t BYTES = WORDS * sizeof(uint32_t);

static unsigned long long wrong_words(const uint32_t *p, size_t words, uint32_t seed, cudaStream_t stream) {
    unsigned long long *wrong = nullptr, host = 0;
    CHECK(cudaMallocAsync((void **)&wrong, sizeof *wrong, stream));
    CHECK(cudaMemsetAsync(wrong, 0, sizeof *wrong, stream));
    count_wrong<<<256, 256, 0, stream>>>(p, words, seed, wrong);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(&host, wrong, sizeof host, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaFreeAsync(wrong, stream));
    CHECK(cudaStreamSynchronize(stream));
    return host;
}

// Either side's end: frees p on stream, tells the peer `done`, and once the peer answers `next`
// destroys the pool (its own or its import) and the stream; false when the peer answered otherwise.
static bool free_then_destroy(void *p, cudaMemPool_t pool, cudaStream_t stream, int sock, char done, char next) {
    CHECK(cudaFreeAsync(p, stream));
    CHECK(cudaStreamSynchronize(stream));
    signal_peer(sock, done);
    if (wait_peer(sock) != next) return false;
    CHECK(cudaMemPoolDestroy(pool));
    CHECK(cudaStreamDestroy(stream));
    return true;
}

static int exporter(int sock) {
    int handle_types = 0;
    CHECK(cudaDeviceGetAttribute(&handle_types, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
    printf("pools shareable through a POSIX descriptor: %s\n", handle_types & cudaMemHandleTypePosixFileDescriptor ? "yes" : "no");
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // Refusals whose exact code CUDA does not document: the names are compared with native's.
    cudaMemPool_t default_pool = nullptr;
    CHECK(cudaDeviceGetDefaultMemPool(&default_pool, 0));
    int fd = -1;
    expect_some_err("export of the default pool (made without a handle type)",
                    cudaMemPoolExportToShareableHandle(&fd, default_pool, cudaMemHandleTypePosixFileDescriptor, 0));
    cudaGetLastError();
    uint32_t *plain = nullptr;
    CHECK(cudaMalloc(&plain, 4096));
    cudaMemPoolPtrExportData data;
    memset(&data, 0, sizeof data);
    expect_some_err("export data of cudaMalloc memory", cudaMemPoolExportPointer(&data, plain));
    cudaGetLastError();
    CHECK(cudaFree(plain));

    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool = nullptr;
    CHECK(cudaMemPoolCreate(&pool, &props));
    uint32_t *p = nullptr;
    CHECK(cudaMallocFromPoolAsync((void **)&p, BYTES, pool, stream));
    fill<<<256, 256, 0, stream>>>(p, WORDS, 7);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
    CHECK(cudaMemPoolExportPointer(&data, p));
    printf("exported: the pool as a descriptor %s, the allocation's export data\n", fd >= 0 ? "yes" : "no");
    // The pool's descriptor travels with the allocation's export data as the message.
    send_with_fd(sock, fd, &data, sizeof data);
    close(fd);

    if (wait_peer(sock) != 'w') return 2;
    unsigned long long first = wrong_words(p, WORDS / 2, 7, stream);
    std::vector<uint32_t> host(WORDS);
    CHECK(cudaMemcpyAsync(host.data(), p, BYTES, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    size_t second_wrong = 0;
    for (size_t i = WORDS / 2; i < WORDS; i++) second_wrong += host[i] != word(i - WORDS / 2, 99);
    printf("exporter: first half kept: %llu wrong words; second half as the importer wrote it: %zu wrong words\n", first,
           second_wrong);
    EXPECT(first == 0 && second_wrong == 0, "both halves as expected");

    // The importer freed its import first; then the exporter frees and destroys the pool.
    if (wait_peer(sock) != 'f') return 2;
    if (!free_then_destroy(p, pool, stream, sock, 'r', 'd')) return 2;
    return 0;
}

static int importer(int sock) {
    cudaMemPoolPtrExportData data;
    int fd = receive_with_fd(sock, &data, sizeof data);
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaMemPool_t pool = nullptr;
    CHECK(cudaMemPoolImportFromShareableHandle(&pool, (void *)(intptr_t)fd, cudaMemHandleTypePosixFileDescriptor, 0));
    close(fd);
    // As the CUDA sample does: read-write access from this device, set if need be.
    cudaMemLocation location = {};
    location.type = cudaMemLocationTypeDevice;
    location.id = 0;
    cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    CHECK(cudaMemPoolGetAccess(&flags, pool, &location));
    if (flags != cudaMemAccessFlagsProtReadWrite) {
        cudaMemAccessDesc desc = {};
        desc.location = location;
        desc.flags = cudaMemAccessFlagsProtReadWrite;
        CHECK(cudaMemPoolSetAccess(pool, &desc, 1));
    }
    CHECK(cudaMemPoolGetAccess(&flags, pool, &location));
    printf("importer: the imported pool is read-write here: %s\n", flags == cudaMemAccessFlagsProtReadWrite ? "yes" : "no");
    uint32_t *own = nullptr;
    expect_some_err("importer: allocating from the imported pool", cudaMallocFromPoolAsync((void **)&own, 4096, pool, stream));
    cudaGetLastError();

    uint32_t *p = nullptr;
    CHECK(cudaMemPoolImportPointer((void **)&p, pool, &data));
    printf("importer: %llu wrong words of %zu\n", wrong_words(p, WORDS, 7, stream), WORDS);
    fill<<<256, 256, 0, stream>>>(p + WORDS / 2, WORDS / 2, 99);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(stream));
    signal_peer(sock, 'w');
    // Freed here before the exporter frees it, as CUDA requires.
    if (!free_then_destroy(p, pool, stream, sock, 'f', 'r')) return 2;
    signal_peer(sock, 'd');
    return g_failures ? 1 : 0;
}

int main() {
    test_init("pool_ipc");
    int status = 0;
    int code = run_parent_and_child(exporter, importer, NULL, &status);
    EXPECT(code == 0, "the exporter finished");
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the importer passed");
    return test_finish();
}

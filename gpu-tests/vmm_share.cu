// Physical memory shared between two processes on one GPU through a POSIX file descriptor
// (cuMemExportToShareableHandle / cuMemImportFromShareableHandle), as NCCL's cuMem transport and
// PyTorch's expandable segments share memory between processes: the parent makes a 2-granule
// allocation with the POSIX handle type, maps it, fills it with a kernel, exports it and sends the
// descriptor over a Unix socket (SCM_RIGHTS) to a forked child; the child imports it, maps it at
// an address of its own, checks every word with a kernel, overwrites the second granule with a
// kernel and says so; the parent checks both halves. Also the error an allocation made without
// the handle type gives on export. Through Flyt each process is its own session. Built with -lcuda.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "driver_check.h"
#include "fd_passing.h"
#include "word_pattern.h"

static CUmemAllocationProp prop_with(unsigned handle_types) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = (CUmemAllocationHandleType)handle_types;
    return prop;
}

static size_t granularity() {
    CUmemAllocationProp prop = prop_with(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    size_t g = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    return g;
}

static CUdeviceptr map(CUmemGenericAllocationHandle handle, size_t size) {
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, size, 0, 0, 0));
    CHECK_CU(cuMemMap(base, size, 0, handle, 0));
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(cuMemSetAccess(base, size, &access, 1));
    return base;
}

static unsigned long long wrong_words(CUdeviceptr base, size_t words, uint32_t seed) {
    unsigned long long *wrong = nullptr, host = 0;
    CHECK(cudaMalloc(&wrong, sizeof *wrong));
    CHECK(cudaMemset(wrong, 0, sizeof *wrong));
    count_wrong<<<256, 256>>>((const uint32_t *)base, words, seed, wrong);
    CHECK(cudaMemcpy(&host, wrong, sizeof host, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(wrong));
    return host;
}

static int exporter(int sock) {
    CHECK(cudaFree(0));
    size_t g = granularity(), size = 2 * g, words = size / 4;
    CUmemAllocationProp plain_prop = prop_with(CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle plain = 0, shared = 0;
    CHECK_CU(cuMemCreate(&plain, size, &plain_prop, 0));
    int fd = -1;
    const char *name = "?";
    cuGetErrorName(cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), &name);
    printf("export of an allocation made without the handle type: %s\n", name);
    CHECK_CU(cuMemRelease(plain));

    CUmemAllocationProp prop = prop_with(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK_CU(cuMemCreate(&shared, size, &prop, 0));
    CUdeviceptr base = map(shared, size);
    fill<<<256, 256>>>((uint32_t *)base, words, 7);
    CHECK(cudaDeviceSynchronize());
    CHECK_CU(cuMemExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    printf("exported: a descriptor %s\n", fd >= 0 ? "yes" : "no");
    send_fd(sock, fd);
    close(fd);

    if (wait_peer(sock) != 'w') return 2;
    unsigned long long first = wrong_words(base, words / 2, 7);
    std::vector<uint32_t> host(words);
    CHECK(cudaMemcpy(host.data(), (void *)base, size, cudaMemcpyDeviceToHost));
    size_t second_wrong = 0;
    for (size_t i = words / 2; i < words; i++) second_wrong += host[i] != word(i - words / 2, 99);
    printf("exporter: first granule kept: %llu wrong words; second granule as the importer wrote it: %zu wrong words\n", first,
           second_wrong);
    CHECK_CU(cuMemUnmap(base, size));
    CHECK_CU(cuMemAddressFree(base, size));
    CHECK_CU(cuMemRelease(shared));
    signal_peer(sock, 'r');
    return first == 0 && second_wrong == 0 ? 0 : 1;
}

static int importer(int sock) {
    CHECK(cudaFree(0));
    size_t g = granularity(), size = 2 * g, words = size / 4;
    int fd = receive_fd(sock);
    CUmemGenericAllocationHandle imported = 0;
    CHECK_CU(cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUmemAllocationProp got = {};
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&got, imported));
    printf("importer: handle types %d, location %d/%d\n", (int)got.requestedHandleTypes, (int)got.location.type, got.location.id);
    CUdeviceptr base = map(imported, size);
    printf("importer: %llu wrong words of %zu\n", wrong_words(base, words, 7), words);
    fill<<<256, 256>>>((uint32_t *)(base + g), words / 2, 99);
    CHECK(cudaDeviceSynchronize());
    signal_peer(sock, 'w');
    if (wait_peer(sock) != 'r') return 2;
    // The exporter released its handle: this process's mapping still holds the memory.
    printf("importer after the exporter's release: %llu wrong words in the second granule\n", wrong_words(base + g, words / 2, 99));
    CHECK_CU(cuMemUnmap(base, size));
    CHECK_CU(cuMemAddressFree(base, size));
    CHECK_CU(cuMemRelease(imported));
    return 0;
}

int main() {
    g_test_name = "vmm_share";
    int status = 0;
    int code = run_parent_and_child(exporter, importer, NULL, &status);
    int child_code = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    printf("vmm_share: %s\n", code == 0 && child_code == 0 ? "PASS" : "FAIL");
    return code || child_code;
}

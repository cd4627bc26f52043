// Physical allocations shared between two processes through a POSIX file descriptor
// (cuMemExportToShareableHandle / cuMemImportFromShareableHandle), as NCCL and PyTorch share
// memory between processes on one GPU: each process is its own Flyt session, the descriptor
// travels between them over a Unix socket (SCM_RIGHTS), and both see the same bytes. Also the
// refusals: an allocation made without the handle type, other handle types, a descriptor that
// is not a shareable handle, and an export its exporter released.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver_share.h"

static void start(CUmemAllocationProp *prop, size_t *granularity) {
    CUdevice device;
    use_primary_context(&device);
    *prop = device_memory_prop(0, granularity);
}

static CUdeviceptr map(CUmemGenericAllocationHandle handle, size_t size) {
    CUdeviceptr base = 0;
    EXPECT(cuMemAddressReserve(&base, size, 0, 0, 0), CUDA_SUCCESS);
    EXPECT(cuMemMap(base, size, 0, handle, 0), CUDA_SUCCESS);
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT(cuMemSetAccess(base, size, &access, 1), CUDA_SUCCESS);
    return base;
}

static void unmap(CUdeviceptr base, size_t size) {
    EXPECT(cuMemUnmap(base, size), CUDA_SUCCESS);
    EXPECT(cuMemAddressFree(base, size), CUDA_SUCCESS);
}

static int exporter(int sock) {
    CUmemAllocationProp prop;
    size_t granularity = 0;
    start(&prop, &granularity);
    size_t size = 2 * granularity;
    CUmemGenericAllocationHandle plain = 0, shared = 0;
    EXPECT(cuMemCreate(&plain, size, &prop, 0), CUDA_SUCCESS);
    int fd = -1;
    EXPECT(cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemRelease(plain), CUDA_SUCCESS);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    EXPECT(cuMemCreate(&shared, size, &prop, 0), CUDA_SUCCESS);
    EXPECT(cuMemExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_FABRIC, 0), CUDA_ERROR_NOT_SUPPORTED);
    CUdeviceptr base = map(shared, size);
    unsigned char *bytes = malloc(size), *back = malloc(size);
    for (size_t i = 0; i < size; i++) bytes[i] = (unsigned char)(i * 7 + 3);
    EXPECT(cuMemcpyHtoD(base, bytes, size), CUDA_SUCCESS);
    EXPECT(cuMemExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
    printf("exported as a descriptor: %s\n", fd >= 0 ? "yes" : "no");
    send_fd(sock, fd);
    close(fd);

    // The importer overwrote the second half.
    if (wait_peer(sock) != 'w') return 2;
    EXPECT(cuMemcpyDtoH(back, base, size), CUDA_SUCCESS);
    int first_kept = memcmp(back, bytes, granularity) == 0, second_written = 1;
    for (size_t i = granularity; i < size; i++) second_written &= back[i] == 0x5a;
    printf("exporter sees the importer's writes: %s\n", first_kept && second_written ? "yes" : "no");

    unmap(base, size);
    EXPECT(cuMemRelease(shared), CUDA_SUCCESS);
    signal_peer(sock, 'r');
    if (wait_peer(sock) != 'd') return 2;
    free(bytes);
    free(back);
    return verdict("exporter");
}

static int importer(int sock) {
    CUmemAllocationProp prop;
    size_t granularity = 0;
    start(&prop, &granularity);
    size_t size = 2 * granularity;
    int fd = receive_fd(sock);
    CUmemGenericAllocationHandle imported = 0, again = 0, bogus = 0;
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return 2;
    EXPECT(cuMemImportFromShareableHandle(&bogus, (void *)(intptr_t)pipe_fds[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), CUDA_SUCCESS);
    CUmemAllocationProp got;
    memset(&got, 0, sizeof got);
    EXPECT(cuMemGetAllocationPropertiesFromHandle(&got, imported), CUDA_SUCCESS);
    printf("imported handle types: %d\n", (int)got.requestedHandleTypes);

    CUdeviceptr base = map(imported, size);
    unsigned char *back = malloc(size), *expected = malloc(size);
    for (size_t i = 0; i < size; i++) expected[i] = (unsigned char)(i * 7 + 3);
    EXPECT(cuMemcpyDtoH(back, base, size), CUDA_SUCCESS);
    printf("importer reads the exporter's bytes: %s\n", memcmp(back, expected, size) == 0 ? "yes" : "no");
    EXPECT(cuMemsetD8(base + granularity, 0x5a, granularity), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    signal_peer(sock, 'w');

    // Once the exporter released the allocation, its export is over; the mapping made from it
    // stays valid here.
    if (wait_peer(sock) != 'r') return 2;
    EXPECT(cuMemImportFromShareableHandle(&again, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    memset(back, 0, size);
    EXPECT(cuMemcpyDtoH(back, base + granularity, 16), CUDA_SUCCESS);
    printf("imported mapping outlives the export: %s\n", back[0] == 0x5a && back[15] == 0x5a ? "yes" : "no");
    unmap(base, size);
    EXPECT(cuMemRelease(imported), CUDA_SUCCESS);
    close(fd);
    signal_peer(sock, 'd');
    free(back);
    free(expected);
    return verdict("importer");
}

int main(void) { return run_exporter_and_importer(exporter, importer); }

// Memory pools shared between two processes (cuMemPoolExportToShareableHandle /
// cuMemPoolImportFromShareableHandle with a POSIX file descriptor, cuMemPoolExportPointer /
// cuMemPoolImportPointer): each process is its own Flyt session; the pool's descriptor and an
// allocation's export data travel between them over a Unix socket (SCM_RIGHTS), and both see the
// same bytes. Also the refusals: pools and allocations made without the handle type, other
// handle types, a descriptor that is not a pool's shareable handle, allocating from an imported
// pool, forged export data, and exports their exporter ended (the allocation freed, the pool
// destroyed).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver_share.h"

#define SIZE (1u << 20)

static CUstream start(void) {
    CUdevice device;
    CUstream stream;
    use_primary_context(&device);
    EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    return stream;
}

static CUmemPoolProps pool_props(CUmemAllocationHandleType handle_types) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = handle_types;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    return props;
}

static int exporter(int sock) {
    CUstream stream = start();
    int handle_types = -1;
    EXPECT(cuDeviceGetAttribute(&handle_types, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0), CUDA_SUCCESS);
    printf("pool handle types: %d\n", handle_types);

    // Without the handle type, or with another one.
    CUmemoryPool plain = NULL, fabric = NULL, shared = NULL;
    CUmemPoolProps props = pool_props(CU_MEM_HANDLE_TYPE_NONE);
    EXPECT(cuMemPoolCreate(&plain, &props), CUDA_SUCCESS);
    CUdeviceptr plain_ptr = 0, legacy = 0, ptr = 0;
    EXPECT(cuMemAllocFromPoolAsync(&plain_ptr, SIZE, plain, stream), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&legacy, SIZE), CUDA_SUCCESS);
    int fd = -1;
    CUmemPoolPtrExportData data;
    EXPECT(cuMemPoolExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolExportPointer(&data, plain_ptr), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolExportPointer(&data, legacy), CUDA_ERROR_INVALID_VALUE);
    props = pool_props(CU_MEM_HANDLE_TYPE_FABRIC);
    EXPECT(cuMemPoolCreate(&fabric, &props), CUDA_ERROR_NOT_SUPPORTED);

    props = pool_props(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    EXPECT(cuMemPoolCreate(&shared, &props), CUDA_SUCCESS);
    EXPECT(cuMemPoolExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_FABRIC, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemPoolExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocFromPoolAsync(&ptr, SIZE, shared, stream), CUDA_SUCCESS);
    EXPECT(cuMemPoolExportPointer(&data, ptr + 4096), CUDA_ERROR_INVALID_VALUE);
    unsigned long long allowed = 99, plain_allowed = 99;
    CUmemoryPool of = NULL, plain_of = NULL;
    EXPECT(cuPointerGetAttribute(&allowed, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, ptr + 64), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&plain_allowed, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, plain_ptr), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&plain_of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, plain_ptr), CUDA_SUCCESS);
    printf("allocation's pool and handle types: %s, %llu (a plain pool's: %s, %llu)\n", of == shared ? "its pool" : "other", allowed,
           plain_of == plain ? "its pool" : "other", plain_allowed);
    unsigned char *bytes = malloc(SIZE), *back = malloc(SIZE);
    for (size_t i = 0; i < SIZE; i++) bytes[i] = (unsigned char)(i * 7 + 3);
    EXPECT(cuMemcpyHtoDAsync(ptr, bytes, SIZE, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuMemPoolExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
    memset(&data, 0, sizeof data);
    EXPECT(cuMemPoolExportPointer(&data, ptr), CUDA_SUCCESS);
    CUmemPoolPtrExportData again;
    EXPECT(cuMemPoolExportPointer(&again, ptr), CUDA_SUCCESS);
    printf("exported the pool as a descriptor: %s\n", fd >= 0 ? "yes" : "no");
    printf("one allocation, one export data: %s\n", memcmp(&data, &again, sizeof data) == 0 ? "yes" : "no");
    send_with_fd(sock, fd, &data, sizeof data);
    close(fd);

    // The importer overwrote the second half.
    if (wait_peer(sock) != 'w') return 2;
    EXPECT(cuMemcpyDtoH(back, ptr, SIZE), CUDA_SUCCESS);
    int first_kept = memcmp(back, bytes, SIZE / 2) == 0, second_written = 1;
    for (size_t i = SIZE / 2; i < SIZE; i++) second_written &= back[i] == 0x5a;
    printf("exporter sees the importer's writes: %s\n", first_kept && second_written ? "yes" : "no");

    // The importer freed its imports first, as CUDA requires; then the exporter's free ends the
    // allocation's export, and the pool's destruction the pool's.
    if (wait_peer(sock) != 'f') return 2;
    EXPECT(cuMemFreeAsync(ptr, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    signal_peer(sock, 'r');
    if (wait_peer(sock) != 'i') return 2;
    EXPECT(cuMemPoolDestroy(shared), CUDA_SUCCESS);
    signal_peer(sock, 'd');
    if (wait_peer(sock) != 'e') return 2;

    EXPECT(cuMemFreeAsync(plain_ptr, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    RELEASE(POOL(plain), MEMORY(legacy), STREAM(stream));
    free(bytes);
    free(back);
    return verdict("exporter");
}

static int importer(int sock) {
    CUstream stream = start();
    CUmemPoolPtrExportData data;
    int fd = receive_with_fd(sock, &data, sizeof data);
    CUmemoryPool pool = NULL, bogus = NULL, default_pool = NULL;
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return 2;
    EXPECT(cuMemPoolImportFromShareableHandle(&bogus, (void *)(intptr_t)pipe_fds[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolImportFromShareableHandle(&pool, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
    CUmemLocation device = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    EXPECT(cuMemPoolGetAccess(&access, pool, &device), CUDA_SUCCESS);
    printf("imported pool read-write on its device: %s\n", access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "yes" : "no");
    CUdeviceptr own = 0, ptr = 0, second = 0, refused = 0;
    EXPECT(cuMemAllocFromPoolAsync(&own, SIZE, pool, stream), CUDA_ERROR_INVALID_VALUE);

    CUmemPoolPtrExportData forged = data;
    forged.reserved[9] ^= 1;
    EXPECT(cuMemPoolImportPointer(&refused, pool, &forged), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGetDefaultMemPool(&default_pool, 0), CUDA_SUCCESS);
    EXPECT(cuMemPoolImportPointer(&refused, default_pool, &data), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolImportPointer(&ptr, pool, &data), CUDA_SUCCESS);
    unsigned long long allowed = 99;
    CUmemoryPool of = NULL;
    EXPECT(cuPointerGetAttribute(&allowed, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, ptr), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr), CUDA_SUCCESS);
    printf("imported allocation's pool and handle types: %s, %llu\n", of == pool ? "the imported pool" : "other", allowed);

    unsigned char *back = malloc(SIZE), *expected = malloc(SIZE);
    for (size_t i = 0; i < SIZE; i++) expected[i] = (unsigned char)(i * 7 + 3);
    EXPECT(cuMemcpyDtoH(back, ptr, SIZE), CUDA_SUCCESS);
    printf("importer reads the exporter's bytes: %s\n", memcmp(back, expected, SIZE) == 0 ? "yes" : "no");
    EXPECT(cuMemsetD8Async(ptr + SIZE / 2, 0x5a, SIZE / 2, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    signal_peer(sock, 'w');

    // Imported again: the same memory; each free drops one import.
    EXPECT(cuMemPoolImportPointer(&second, pool, &data), CUDA_SUCCESS);
    printf("imported again at the same address: %s\n", second == ptr ? "yes" : "no");
    EXPECT(cuMemFree(ptr), CUDA_SUCCESS);
    memset(back, 0, 16);
    EXPECT(cuMemcpyDtoH(back, ptr + SIZE / 2, 16), CUDA_SUCCESS);
    EXPECT(cuMemFreeAsync(ptr, stream), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(back + 16, ptr, 16), CUDA_ERROR_INVALID_VALUE);
    printf("freed twice, once per import: %s\n", back[0] == 0x5a && back[15] == 0x5a ? "yes" : "no");
    signal_peer(sock, 'f');

    if (wait_peer(sock) != 'r') return 2;
    EXPECT(cuMemPoolImportPointer(&refused, pool, &data), CUDA_ERROR_INVALID_VALUE);
    signal_peer(sock, 'i');
    if (wait_peer(sock) != 'd') return 2;
    EXPECT(cuMemPoolImportFromShareableHandle(&bogus, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolDestroy(pool), CUDA_SUCCESS);
    close(fd);
    EXPECT(cuStreamDestroy(stream), CUDA_SUCCESS);
    signal_peer(sock, 'e');
    free(back);
    free(expected);
    return verdict("importer");
}

int main(void) { return run_exporter_and_importer(exporter, importer); }

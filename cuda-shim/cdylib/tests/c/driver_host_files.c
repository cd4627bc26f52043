// The app's own shared mapping of a file, registered mapped (as NCCL's ranks register their
// /dev/shm segment): with the shared-memory channel the server maps the same file at the same
// address, so a memset through the device pointer lands in the file, where a second mapping of
// it in this process sees it; without the channel, a clear refusal. The process's own malloc'd
// memory registered mapped works the same way with the channel (its pages become a shared mapping
// in place, bytes kept); registered for copies it works everywhere.
//
// Prints `channel: yes` when the registration worked, `channel: no` when it was refused.
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver_expect.h"

#define PAGE 4096

static int all_words(const unsigned char *bytes, size_t words, uint32_t value) {
    for (size_t i = 0; i < words; i++) {
        uint32_t word;
        memcpy(&word, bytes + 4 * i, 4);
        if (word != value) return 0;
    }
    return 1;
}

int main(void) {
    use_primary_context(NULL);

    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    char path[256];
    snprintf(path, sizeof path, "%s/flyt-host-files-%d", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    // 4 bytes into its last page, as NCCL's segments end.
    size_t file_len = 3 * PAGE + 4;
    if (fd < 0 || ftruncate(fd, file_len) != 0) {
        printf("FAIL: no file at %s\n", path);
        return 1;
    }
    unsigned char *first = mmap(NULL, file_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    unsigned char *second = mmap(NULL, file_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (first == MAP_FAILED || second == MAP_FAILED) {
        printf("FAIL: mmap\n");
        return 1;
    }
    // Not page aligned, as NCCL's offsets need not be: the pages around it are mapped.
    unsigned char *range = first + PAGE + 256;
    size_t len = 2 * PAGE;
    CUresult registered = cuMemHostRegister(range, len, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
    printf("channel: %s (%s)\n", registered == CUDA_SUCCESS ? "yes" : "no", name_of(registered));
    if (registered == CUDA_SUCCESS) {
        CUdeviceptr device = 0;
        EXPECT(cuMemHostGetDevicePointer(&device, range, 0), CUDA_SUCCESS);
        CHECK("device pointer is the host pointer", device == (CUdeviceptr)(uintptr_t)range);
        unsigned int flags = 0;
        EXPECT(cuMemHostGetFlags(&flags, range), CUDA_SUCCESS);
        CHECK("flags read back", flags == (CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
        EXPECT(cuMemsetD32(device, 0xabcd1234u, len / 4), CUDA_SUCCESS);
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
        CHECK("a memset through the device pointer is in the file (another mapping)", all_words(second + PAGE + 256, len / 4, 0xabcd1234u));
        CHECK("and in the registered mapping", all_words(range, len / 4, 0xabcd1234u));
        CHECK("bytes around it untouched", second[PAGE + 255] == 0 && second[PAGE + 256 + len] == 0);
        EXPECT(cuMemHostRegister(range + 8, 16, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        EXPECT(cuMemHostUnregister(range), CUDA_SUCCESS);
        EXPECT(cuMemsetD32((CUdeviceptr)(uintptr_t)range, 1, 4), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemHostUnregister(range), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
        // The server let go of its mapping: the same pages map again.
        EXPECT(cuMemHostRegister(range, len, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
        EXPECT(cuMemsetD8((CUdeviceptr)(uintptr_t)range, 0x5a, 8), CUDA_SUCCESS);
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
        CHECK("registered again and set again", second[PAGE + 256] == 0x5a && second[PAGE + 263] == 0x5a && second[PAGE + 264] == 0x34);
        EXPECT(cuMemHostUnregister(range), CUDA_SUCCESS);
    } else {
        EXPECT(registered, CUDA_ERROR_NOT_SUPPORTED);
    }
    // Registered for copies only, the same memory is fine anywhere.
    EXPECT(cuMemHostRegister(range, len, 0), CUDA_SUCCESS);
    EXPECT(cuMemHostUnregister(range), CUDA_SUCCESS);

    // The process's own memory (malloc'd: not page aligned): with the channel its pages become a
    // shared mapping of a memory file in place, their bytes kept, and the server maps them too.
    size_t own_len = 5 * PAGE + 100;
    unsigned char *own = malloc(own_len + 64);
    unsigned char *buffer = own + 40;
    for (size_t i = 0; i < own_len; i++) buffer[i] = (unsigned char)(i * 7);
    CUresult own_registered = cuMemHostRegister(buffer, own_len, CU_MEMHOSTREGISTER_DEVICEMAP);
    if (registered == CUDA_SUCCESS) {
        EXPECT(own_registered, CUDA_SUCCESS);
        int kept = 1;
        for (size_t i = 0; i < own_len; i++) kept &= buffer[i] == (unsigned char)(i * 7);
        CHECK("malloc'd memory registered mapped keeps its bytes", kept);
        CUdeviceptr device = 0;
        EXPECT(cuMemHostGetDevicePointer(&device, buffer, 0), CUDA_SUCCESS);
        CHECK("malloc'd memory's device pointer is its host pointer", device == (CUdeviceptr)(uintptr_t)buffer);
        EXPECT(cuMemsetD8(device + PAGE, 0x77, 3 * PAGE), CUDA_SUCCESS);
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
        int seen = buffer[PAGE - 1] == (unsigned char)((PAGE - 1) * 7) && buffer[PAGE] == 0x77 && buffer[4 * PAGE - 1] == 0x77 &&
                   buffer[4 * PAGE] == (unsigned char)(4 * PAGE * 7);
        CHECK("a memset through its device pointer is seen by the host", seen);
        buffer[10] = 0x42;
        EXPECT(cuMemcpyDtoH(&seen, device + 10, 1), CUDA_SUCCESS);
        CHECK("and the host's writes by the device", (seen & 0xff) == 0x42);
        EXPECT(cuMemHostUnregister(buffer), CUDA_SUCCESS);
        CHECK("still the app's memory after unregistering", buffer[PAGE] == 0x77 && buffer[10] == 0x42);
    } else {
        EXPECT(own_registered, CUDA_ERROR_NOT_SUPPORTED);
    }
    EXPECT(cuMemHostRegister(buffer, own_len, 0), CUDA_SUCCESS);
    EXPECT(cuMemHostUnregister(buffer), CUDA_SUCCESS);
    free(own);

    // Removed, the file is found through the descriptor still open (NCCL's last rank to attach
    // removes the file before it registers it), here the whole mapping up to the file's end.
    unlink(path);
    CUresult held = cuMemHostRegister(first, file_len, CU_MEMHOSTREGISTER_DEVICEMAP);
    if (registered == CUDA_SUCCESS) {
        EXPECT(held, CUDA_SUCCESS);
        EXPECT(cuMemsetD8((CUdeviceptr)(uintptr_t)(first + file_len - 4), 0x11, 4), CUDA_SUCCESS);
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
        CHECK("a removed file registered through its descriptor, its last bytes set", second[file_len - 4] == 0x11 && second[file_len - 1] == 0x11 && second[file_len - 5] != 0x11);
        EXPECT(cuMemHostUnregister(first), CUDA_SUCCESS);
    } else {
        EXPECT(held, CUDA_ERROR_NOT_SUPPORTED);
    }
    // With no descriptor left it cannot be handed over.
    close(fd);
    EXPECT(cuMemHostRegister(range, len, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_ERROR_NOT_SUPPORTED);
    munmap(first, file_len);
    munmap(second, file_len);
    return finish();
}

// managed_memory: cudaMallocManaged memory used by the CPU and the GPU at one address, with the
// hints that go with it.
// Covers: cudaMallocManaged (cudaMemAttachGlobal and cudaMemAttachHost), host writes read by
// kernels and kernel writes read by the host after a sync, cudaMemset and cudaMemcpy (every kind)
// on managed memory, cudaMemPrefetchAsync to the device and to the host, cudaMemAdvise (read
// mostly, preferred location, accessed by) and cudaMemRangeGetAttribute reading them back,
// cudaStreamAttachMemAsync, cudaPointerGetAttributes, the managed-memory device attributes, and
// errors for a prefetch of memory that is not managed and for a bad device; a kernel incrementing a
// managed array over several launches with the host reading and writing it between
// synchronizations, a prefetch to the CPU after a kernel on a stream, a size no page multiple, and
// a 256 MiB allocation.
//
// Through Flyt the output is native's on every transport: with the shared-memory channel managed
// memory is a block of the segment the server maps at the app's address; over a socket alone or
// TCP it is device memory mirrored at the same address, coherent at launches, copies and
// synchronizations (concurrentManagedAccess then reads 0, so it is not printed: the program
// synchronizes before the host touches managed memory, as it must when it is 0).
#include "common.h"

__global__ void scale_add(float *data, unsigned n, float scale, float add) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = data[i] * scale + add;
}

__global__ void increment(int *data, size_t n, int by) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) data[i] += by;
}

__global__ void sum_into(const float *in, unsigned n, double *total) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(total, (double)in[i]);
}

static int check(const char *what, const float *p, unsigned n, float (*expected)(unsigned)) {
    for (unsigned i = 0; i < n; i++) {
        if (p[i] != expected(i)) {
            printf("FAIL: %s: element %u is %g, expected %g\n", what, i, p[i], expected(i));
            return 1;
        }
    }
    printf("%s: %u elements right\n", what, n);
    return 0;
}

static cudaMemLocation device_location(int id) {
    cudaMemLocation location = {};
    location.type = cudaMemLocationTypeDevice;
    location.id = id;
    return location;
}

static cudaMemLocation host_location() {
    cudaMemLocation location = {};
    location.type = cudaMemLocationTypeHost;
    return location;
}

int main() {
    test_init("managed_memory");
    int managed = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0));
    printf("managed memory: %d\n", managed);

    const unsigned N = 1 << 20;
    const size_t bytes = N * sizeof(float);
    float *data = nullptr;
    CHECK(cudaMallocManaged(&data, bytes));
    cudaPointerAttributes attributes;
    CHECK(cudaPointerGetAttributes(&attributes, data + 5));
    printf("attributes: type managed %s, device pointer %s, host pointer %s\n", attributes.type == cudaMemoryTypeManaged ? "yes" : "no",
           attributes.devicePointer == (void *)(data + 5) ? "same" : "differs", attributes.hostPointer == (void *)(data + 5) ? "same" : "differs");

    // The host fills it, a kernel changes it in place, the host reads it after a sync.
    for (unsigned i = 0; i < N; i++) data[i] = (float)(i % 1024);
    scale_add<<<(N + 255) / 256, 256>>>(data, N, 2.0f, 1.0f);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    g_failures += check("kernel on host-written managed memory", data, N, [](unsigned i) { return (float)(i % 1024) * 2.0f + 1.0f; });

    // Prefetches and advice: hints, read back as the app gave them.
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMemPrefetchAsync(data, bytes, device_location(0), 0, stream));
    int location = -7;
    CHECK(cudaMemRangeGetAttribute(&location, sizeof location, cudaMemRangeAttributeLastPrefetchLocation, data, bytes));
    printf("last prefetch location after a prefetch to the device: %d\n", location);
    CHECK(cudaMemAdvise(data, bytes / 2, cudaMemAdviseSetReadMostly, device_location(0)));
    CHECK(cudaMemAdvise(data, bytes, cudaMemAdviseSetPreferredLocation, device_location(0)));
    CHECK(cudaMemAdvise(data, bytes, cudaMemAdviseSetAccessedBy, host_location()));
    int read_mostly = -7;
    CHECK(cudaMemRangeGetAttribute(&read_mostly, sizeof read_mostly, cudaMemRangeAttributeReadMostly, data, bytes / 4));
    printf("read mostly (first quarter): %d\n", read_mostly);
    CHECK(cudaMemRangeGetAttribute(&read_mostly, sizeof read_mostly, cudaMemRangeAttributeReadMostly, data, bytes));
    printf("read mostly (whole range): %d\n", read_mostly);
    int preferred = -7;
    CHECK(cudaMemRangeGetAttribute(&preferred, sizeof preferred, cudaMemRangeAttributePreferredLocation, data, bytes));
    printf("preferred location: %d\n", preferred);
    int accessed_by[4] = {-7, -7, -7, -7};
    CHECK(cudaMemRangeGetAttribute(accessed_by, sizeof accessed_by, cudaMemRangeAttributeAccessedBy, data, bytes));
    printf("accessed by: %d %d %d %d\n", accessed_by[0], accessed_by[1], accessed_by[2], accessed_by[3]);
    scale_add<<<(N + 255) / 256, 256, 0, stream>>>(data, N, 1.0f, -1.0f);
    CHECK_LAUNCH();
    CHECK(cudaMemPrefetchAsync(data, bytes, host_location(), 0, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemRangeGetAttribute(&location, sizeof location, cudaMemRangeAttributeLastPrefetchLocation, data, bytes));
    printf("last prefetch location after a prefetch to the host: %d\n", location);
    g_failures += check("after a kernel on a stream and a prefetch to the host", data, N, [](unsigned i) { return (float)(i % 1024) * 2.0f; });

    // Copies and memsets: managed memory is a valid side of every kind.
    float *device = nullptr;
    CHECK(cudaMalloc(&device, bytes));
    CHECK(cudaMemcpy(device, data, bytes, cudaMemcpyDefault));
    CHECK(cudaMemset(data, 0, bytes));
    CHECK(cudaDeviceSynchronize());
    double zero_sum = 0;
    for (unsigned i = 0; i < N; i++) zero_sum += data[i];
    printf("after cudaMemset: sum %g\n", zero_sum);
    CHECK(cudaMemcpy(data, device, bytes, cudaMemcpyDeviceToDevice));
    g_failures += check("copied back device to managed (DeviceToDevice)", data, N, [](unsigned i) { return (float)(i % 1024) * 2.0f; });
    CHECK(cudaMemcpy(device, data, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(data, device, bytes, cudaMemcpyDeviceToHost));
    g_failures += check("round trip HostToDevice and DeviceToHost", data, N, [](unsigned i) { return (float)(i % 1024) * 2.0f; });

    // Attached to one stream: that stream's kernels use it, the host reads it after that stream.
    float *single = nullptr;
    CHECK(cudaMallocManaged(&single, bytes, cudaMemAttachHost));
    for (unsigned i = 0; i < N; i++) single[i] = 1.0f;
    CHECK(cudaStreamAttachMemAsync(stream, single, 0, cudaMemAttachSingle));
    scale_add<<<(N + 255) / 256, 256, 0, stream>>>(single, N, 3.0f, 0.5f);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(stream));
    g_failures += check("attached to a stream", single, N, [](unsigned) { return 3.5f; });

    // A kernel reads managed memory the host wrote, into device memory.
    double *total = nullptr;
    CHECK(cudaMallocManaged(&total, sizeof *total));
    *total = 0;
    sum_into<<<(N + 255) / 256, 256>>>(single, N, total);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("sum of the attached buffer: %.1f\n", *total);
    EXPECT(*total == 3.5 * N, "sum %.1f, expected %.1f", *total, 3.5 * N);

    // Several launches on one array the host filled (a size no page multiple), the host reading
    // it and writing some of it between synchronizations.
    const size_t M = 100003;
    int *counts = nullptr;
    CHECK(cudaMallocManaged(&counts, M * sizeof(int)));
    int *expected = (int *)malloc(M * sizeof(int));
    for (size_t i = 0; i < M; i++) counts[i] = expected[i] = (int)i;
    int rounds_right = 0;
    for (int round = 1; round <= 5; round++) {
        increment<<<(unsigned)((M + 255) / 256), 256>>>(counts, M, round);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        int right = 1;
        for (size_t i = 0; i < M; i++) {
            expected[i] += round;
            right &= counts[i] == expected[i];
        }
        rounds_right += right;
        // Host writes between launches, some on the last, partial page.
        for (size_t i = (size_t)round * 7919; i < M; i += 20011) {
            counts[i] += 1000;
            expected[i] += 1000;
        }
        counts[M - 1] -= round;
        expected[M - 1] -= round;
    }
    printf("five launches, the host reading and writing between them: %d rounds right\n", rounds_right);
    EXPECT(rounds_right == 5, "%d of 5 rounds right", rounds_right);

    // A kernel on a stream, a prefetch to the CPU in stream order: the host reads the kernel's
    // results once the stream synchronized.
    increment<<<(unsigned)((M + 255) / 256), 256, 0, stream>>>(counts, M, 7);
    CHECK_LAUNCH();
    CHECK(cudaMemPrefetchAsync(counts, M * sizeof(int), host_location(), 0, stream));
    CHECK(cudaStreamSynchronize(stream));
    int prefetched_right = 1;
    for (size_t i = 0; i < M; i++) prefetched_right &= counts[i] == expected[i] + 7;
    printf("kernel on a stream, then a prefetch to the CPU: %s\n", prefetched_right ? "right" : "wrong");
    EXPECT(prefetched_right, "host reads after a prefetch to the CPU");
    // Copies out of it read the latest bytes, the host's included.
    counts[12345] = -1;
    int copied[2] = {0, 0};
    CHECK(cudaMemcpy(copied, counts + 12344, sizeof copied, cudaMemcpyDefault));
    printf("copy out after a host write: %d %d\n", copied[0], copied[1]);
    EXPECT(copied[0] == expected[12344] + 7 && copied[1] == -1, "copy out after a host write");
    CHECK(cudaFree(counts));
    free(expected);

    // A large allocation: 256 MiB the host fills, a kernel changes, the host reads and changes
    // again, a second kernel sees.
    const size_t L = (size_t)256 << 20, words = L / sizeof(int);
    int *large = nullptr;
    CHECK(cudaMallocManaged(&large, L));
    for (size_t i = 0; i < words; i++) large[i] = (int)(i & 0xffff);
    increment<<<(unsigned)((words + 255) / 256), 256>>>(large, words, 1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    size_t large_wrong = 0;
    for (size_t i = 0; i < words; i++) large_wrong += large[i] != (int)(i & 0xffff) + 1;
    large[words / 2] = 100;
    increment<<<(unsigned)((words + 255) / 256), 256>>>(large, words, 1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    large_wrong += large[words / 2] != 101;
    large_wrong += large[words - 1] != (int)((words - 1) & 0xffff) + 2;
    printf("256 MiB managed: %zu wrong\n", large_wrong);
    EXPECT(large_wrong == 0, "%zu wrong", large_wrong);
    CHECK(cudaFree(large));

    // Errors: a prefetch of device memory, of a bad device, with flags.
    expect_err("prefetch of cudaMalloc memory", cudaMemPrefetchAsync(device, bytes, device_location(0), 0, stream), cudaErrorInvalidValue);
    expect_err("prefetch to device 99", cudaMemPrefetchAsync(data, bytes, device_location(99), 0, stream), cudaErrorInvalidDevice);
    expect_err("advice past the allocation", cudaMemAdvise(data, bytes * 2, cudaMemAdviseSetReadMostly, device_location(0)), cudaErrorInvalidValue);


    CHECK(cudaStreamDestroy(stream));
    CHECK_EACH(cudaFree, total, single, device, data);
    return test_finish();
}

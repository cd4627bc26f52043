// Stream memory operations through the driver API (linked with -lcuda): the device's memop
// attributes (64-bit ops, NOR waits; printed); cuStreamWriteValue32 on one stream releasing
// cuStreamWaitValue32 on another, which then runs a kernel that must see what the first stream's
// kernel wrote before the write (the write's default memory barrier); a kernel spinning on a flag
// that a stream op on another stream writes (a GPU-time limit turns a missed write into a printed
// failure instead of a hang); 64-bit writes and EQ/AND/NOR/GEQ waits; cuStreamBatchMemOp with
// 32- and 64-bit writes, a GPU barrier and a wait, read back; misaligned and out-of-range
// addresses and unknown flags (error names printed).
#include "driver_check.h"

static const char *cu_name(CUresult r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    return name;
}

// Writes `value + i` into data[i] after spinning `ns` of GPU time (so the other stream's wait
// really waits).
static __global__ void produce(unsigned long long ns, int *data, int n, int value) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned long long start = gpu_ns();
        while (gpu_ns() - start < ns) {
        }
    }
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) data[i] = value + i;
}

// Copies data into out, doubled.
static __global__ void consume(const int *data, int *out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = 2 * data[i];
}

// One thread spins until *flag == want (or `limit_ns` of GPU time passed), then records what it
// saw: result[0] = 1 when the flag arrived, result[1] = the value seen.
static __global__ void wait_for_flag(volatile unsigned *flag, unsigned want, unsigned long long limit_ns, unsigned *result) {
    unsigned long long start = gpu_ns();
    unsigned seen = *flag;
    while (seen != want && gpu_ns() - start < limit_ns) seen = *flag;
    result[0] = seen == want;
    result[1] = seen;
}

int main() {
    test_init("stream_memops");
    CHECK(cudaFree(0));
    CUdevice dev;
    CHECK_CU(cuCtxGetDevice(&dev));
    int wide = -1, nor = -1;
    CHECK_CU(cuDeviceGetAttribute(&wide, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
    CHECK_CU(cuDeviceGetAttribute(&nor, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev));
    printf("64-bit stream memops: %d\n", wide);
    printf("NOR waits: %d\n", nor);

    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    const int n = 1 << 16;
    int *data, *out;
    unsigned *flags, *result;
    CHECK(cudaMalloc(&data, n * sizeof(int)));
    CHECK(cudaMalloc(&out, n * sizeof(int)));
    CHECK(cudaMalloc(&flags, 4096));
    CHECK(cudaMalloc(&result, 64));
    CHECK(cudaMemset(flags, 0, 4096));
    CHECK(cudaMemset(out, 0, n * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    CUdeviceptr f = (CUdeviceptr)flags;

    // 1. Stream a: produce (100 ms), then write flag 1. Stream b: wait for it, then consume.
    produce<<<64, 256, 0, a>>>(100ull * 1000 * 1000, data, n, 7);
    CHECK_LAUNCH();
    CHECK_CU(cuStreamWriteValue32((CUstream)a, f, 1, 0));
    CHECK_CU(cuStreamWaitValue32((CUstream)b, f, 1, CU_STREAM_WAIT_VALUE_GEQ));
    consume<<<64, 256, 0, b>>>(data, out, n);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(b));
    int *host = (int *)malloc(n * sizeof(int));
    CHECK(cudaMemcpy(host, out, n * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (host[i] != 2 * (7 + i)) bad = i;
    printf("wait released by the other stream's write, saw its kernel's data: %s\n", bad < 0 ? "yes" : "no");
    EXPECT(bad < 0, "consume saw produce's data (first bad index %d)", bad);
    CHECK(cudaStreamSynchronize(a));

    // 2. A kernel on b spins on flag 1 (offset 4); stream a writes 42 there after a 50 ms kernel.
    produce<<<1, 32, 0, a>>>(50ull * 1000 * 1000, data, 1, 0);
    CHECK_LAUNCH();
    wait_for_flag<<<1, 1, 0, b>>>(flags + 1, 42, 5ull * 1000 * 1000 * 1000, result);
    CHECK_LAUNCH();
    CHECK_CU(cuStreamWriteValue32((CUstream)a, f + 4, 42, 0));
    CHECK(cudaDeviceSynchronize());
    unsigned seen[2] = {0, 0};
    CHECK(cudaMemcpy(seen, result, sizeof seen, cudaMemcpyDeviceToHost));
    printf("kernel saw the stream op's flag: %s (value %u)\n", seen[0] ? "yes" : "no", seen[1]);
    EXPECT(seen[0] == 1 && seen[1] == 42, "the spinning kernel saw 42");

    // 3. 64-bit writes and the wait conditions, each released by a write on the other stream.
    CUdeviceptr w = f + 64;  // 8-byte aligned
    if (wide) {
        CHECK_CU(cuStreamWriteValue64((CUstream)a, w, 0x0123456789abcdefull, 0));
        CHECK_CU(cuStreamWaitValue64((CUstream)b, w, 0x0123456789abcdefull, CU_STREAM_WAIT_VALUE_EQ));
        CHECK_CU(cuStreamWaitValue64((CUstream)b, w, 0x1ull << 40, CU_STREAM_WAIT_VALUE_AND));
        CHECK_CU(cuStreamWaitValue64((CUstream)b, w, 0x0123456789abcde0ull, CU_STREAM_WAIT_VALUE_GEQ));
        CHECK_CU(cuStreamWriteValue64((CUstream)b, w + 8, 0xfedcba9876543210ull, 0));
        CHECK(cudaDeviceSynchronize());
        unsigned long long back[2] = {0, 0};
        CHECK(cudaMemcpy(back, (void *)w, sizeof back, cudaMemcpyDeviceToHost));
        printf("64-bit writes and EQ/AND/GEQ waits: %s\n", back[0] == 0x0123456789abcdefull && back[1] == 0xfedcba9876543210ull ? "yes" : "no");
        EXPECT(back[0] == 0x0123456789abcdefull && back[1] == 0xfedcba9876543210ull, "64-bit values read back");
    }
    if (nor) {
        // ~(*addr | value) != 0: with *addr = 0 and value 0xffff0000, the low half answers.
        CHECK_CU(cuStreamWriteValue32((CUstream)a, f + 128, 0, 0));
        CHECK_CU(cuStreamWaitValue32((CUstream)b, f + 128, 0xffff0000u, CU_STREAM_WAIT_VALUE_NOR));
        CHECK_CU(cuStreamWriteValue32((CUstream)b, f + 132, 5, 0));
        CHECK(cudaDeviceSynchronize());
        unsigned v = 0;
        CHECK(cudaMemcpy(&v, (void *)(f + 132), 4, cudaMemcpyDeviceToHost));
        printf("NOR wait passed: %s\n", v == 5 ? "yes" : "no");
        EXPECT(v == 5, "the write after the NOR wait ran");
    }

    // 4. A batch: a 32-bit write, a GPU-scope barrier, a 64-bit write and a wait on the first.
    CUstreamBatchMemOpParams ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[0].writeValue.address = f + 256;
    ops[0].writeValue.value = 77;
    ops[1].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
    ops[1].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_GPU;
    int count = 2;
    if (wide) {
        ops[2].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
        ops[2].writeValue.address = f + 264;
        ops[2].writeValue.value64 = 0xabcdef0011223344ull;
        count = 3;
    }
    ops[count].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[count].waitValue.address = f + 256;
    ops[count].waitValue.value = 77;
    ops[count].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    count++;
    CHECK_CU(cuStreamBatchMemOp((CUstream)a, count, ops, 0));
    CHECK(cudaStreamSynchronize(a));
    unsigned batch[4] = {0, 0, 0, 0};
    CHECK(cudaMemcpy(batch, (void *)(f + 256), sizeof batch, cudaMemcpyDeviceToHost));
    unsigned long long batch64 = (unsigned long long)batch[3] << 32 | batch[2];
    bool batch_ok = batch[0] == 77 && (!wide || batch64 == 0xabcdef0011223344ull);
    printf("batch of %d ops read back: %s\n", count, batch_ok ? "yes" : "no");
    EXPECT(batch_ok, "batch values");

    // 5. Refusals, by name (the native run is the reference).
    printf("misaligned 32-bit write: %s\n", cu_name(cuStreamWriteValue32((CUstream)a, f + 2, 1, 0)));
    printf("misaligned 64-bit write: %s\n", cu_name(cuStreamWriteValue64((CUstream)a, f + 4, 1, 0)));
    printf("unknown wait flag: %s\n", cu_name(cuStreamWaitValue32((CUstream)a, f, 1, 7)));
    printf("batch flags: %s\n", cu_name(cuStreamBatchMemOp((CUstream)a, 1, ops, 1)));
    CHECK(cudaStreamSynchronize(a));
    CHECK(cudaGetLastError());

    free(host);
    CHECK_EACH(cudaFree, data, out, flags, result);
    CHECK_EACH(cudaStreamDestroy, a, b);
    return test_finish();
}

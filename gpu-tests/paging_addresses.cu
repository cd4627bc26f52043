// paging_addresses: many allocations of mixed sizes (4 B to 64 MiB) that processes keep across
// turns while others run, freeing and making some again each turn, as tenants of an
// oversubscribed GPU do (docs/design/paging.md, "Session memory while paging"). A paging server
// makes every cudaMalloc in addresses it reserves and pages out only the physical memory: every
// pointer a process holds must still reach its bytes after its page-in, small allocations packed
// several to a page included, and the addresses of memory freed and made again must come back
// too (the driver's own allocator keeps freed addresses, which failed page-ins on H200s).
//
// The parent (which never calls CUDA) forks N children; each makes 36 allocations cycling
// through 12 sizes from 4 B to 64 MiB, plus one ballast allocation bringing it to FRACTION of the
// GPU's memory, and fills them. On each of its turns (round-robin, one child at a time) it checks
// every byte of every allocation with a kernel (a checksum of them printed: the same natively and
// through Flyt), frees a third of the allocations and makes them again with other sizes, and
// writes new bytes into all of them: by kernel, by a host-to-device copy, or by a device-to-device
// copy from a scratch buffer, by turns. Pointer attributes of an interior pointer of a small
// allocation are printed once.
//
// Arguments: paging_addresses [processes=2] [fraction=0.3] [turns=4]. Natively (and through a
// plain server) the processes must fit together: 2 x 0.3. Through a server started with
// --oversubscribe 2.0 and a quota of twice the GPU (FLYT_RPC_OVERSUBSCRIBE=2.0
// FLYT_RPC_MEMORY_QUOTA=<twice the GPU>), run `paging_addresses 2 0.6 4`: the two then fit only
// by taking turns, each paged out while the other runs; stdout must equal the native run's (the
// fraction only sizes the ballast, which is checked but not in the checksums). Each turn's first
// call's time (its page-in) goes to stderr. A child that fails ends the run at once.
#include "take_turns.h"

#include <vector>

static const size_t MIB = 1 << 20;
// Sizes cycled through: packed ones (below a 2 MiB page), a page and more, up to 64 MiB.
static const size_t SIZES[] = {4,       13,          100,           512,           4096,    65543,
                               MIB,     MIB + 3,     2 * MIB + 4096, 3 * MIB + 5,   8 * MIB, 64 * MIB};
static const int NSIZES = sizeof(SIZES) / sizeof(SIZES[0]);
static const int COUNT = 36;

__host__ __device__ inline uint8_t byte_at(size_t i, uint32_t seed) {
    uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ (seed * 0x9E3779B9u);
    x ^= x >> 15;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    return (uint8_t)(x ^ (x >> 8));
}

__global__ void fill(uint8_t *bytes, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bytes[i] = byte_at(i, seed);
}

// Counts the bytes that differ from the pattern and adds a weighted sum of the bytes to `sum`.
__global__ void check(const uint8_t *bytes, size_t n, uint32_t seed, unsigned long long weight, unsigned long long *wrong,
                      unsigned long long *sum) {
    unsigned long long mine_wrong = 0, mine_sum = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint8_t b = bytes[i];
        mine_wrong += b != byte_at(i, seed);
        mine_sum += (unsigned long long)b * (i % 251 + 1);
    }
    if (mine_wrong) atomicAdd(wrong, mine_wrong);
    if (mine_sum) atomicAdd(sum, mine_sum * weight);
}

static unsigned blocks_for(size_t n) { return (unsigned)(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024); }

static uint32_t seed_of(int child, int generation, int index) { return (uint32_t)(child * 1000003 + generation * 1009 + index + 1); }

struct Allocation {
    uint8_t *ptr;
    size_t len;
    uint32_t seed;
};

// Writes allocation `a`'s bytes for `seed`, by a kernel, a host-to-device copy or a device-to-device
// copy from `scratch` (at least 64 MiB), as `how` says.
static void write_bytes(Allocation &a, uint32_t seed, int how, uint8_t *scratch, std::vector<uint8_t> &host) {
    a.seed = seed;
    if (how == 0) {
        fill<<<blocks_for(a.len), 256>>>(a.ptr, a.len, seed);
        CHECK_LAUNCH();
        return;
    }
    host.resize(a.len);
    for (size_t i = 0; i < a.len; i++) host[i] = byte_at(i, seed);
    if (how == 1) {
        CHECK(cudaMemcpy(a.ptr, host.data(), a.len, cudaMemcpyHostToDevice));
        return;
    }
    CHECK(cudaMemcpy(scratch, host.data(), a.len, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(a.ptr, scratch, a.len, cudaMemcpyDeviceToDevice));
}

static int child(int index, int turns, double fraction, int turn_fd, int done_fd) {
    if (!receive(turn_fd)) return 3;
    size_t free_bytes = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total));
    std::vector<Allocation> allocations(COUNT);
    std::vector<uint8_t> host;
    size_t mixed = 0;
    uint8_t *scratch = nullptr;
    unsigned long long *counters = nullptr;  // wrong bytes, checksum
    CHECK(cudaMalloc(&scratch, 64 * MIB));
    CHECK(cudaMalloc(&counters, 2 * sizeof(unsigned long long)));
    for (int i = 0; i < COUNT; i++) {
        Allocation &a = allocations[i];
        a.len = SIZES[i % NSIZES];
        CHECK(cudaMalloc(&a.ptr, a.len));
        write_bytes(a, seed_of(index, 0, i), i % 3, scratch, host);
        mixed += a.len;
    }
    // The ballast: the rest of FRACTION of the GPU, whole 2 MiB pages (checked, not summed: its
    // size follows the GPU's).
    size_t target = (size_t)(total * fraction) & ~(size_t)(2 * MIB - 1);
    size_t ballast_len = target > mixed + 66 * MIB + 2 * MIB ? target - mixed - 66 * MIB : 2 * MIB;
    Allocation ballast = {nullptr, ballast_len, 0};
    CHECK(cudaMalloc(&ballast.ptr, ballast.len));
    write_bytes(ballast, seed_of(index, 0, COUNT), 0, scratch, host);
    CHECK(cudaDeviceSynchronize());
    if (index == 0) {
        // An interior pointer of a small allocation: device memory, its device (the runtime's
        // answers, with the device pointer equal to the pointer asked about).
        cudaPointerAttributes attributes;
        CHECK(cudaPointerGetAttributes(&attributes, allocations[2].ptr + 50));
        printf("process 0: an interior pointer of a 100-byte allocation: type %d, device %d, same device pointer %s\n",
               (int)attributes.type, attributes.device, attributes.devicePointer == allocations[2].ptr + 50 ? "yes" : "no");
    }
    printf("process %d: %d allocations of 4 B to 64 MiB (%zu bytes) and a ballast\n", index, COUNT, mixed);
    send_byte(done_fd);
    int failures = 0;
    for (int turn = 0; turn < turns; turn++) {
        if (!receive(turn_fd)) return 3;
        double started = now_ms();
        CHECK(cudaMemset(counters, 0, 2 * sizeof(unsigned long long)));
        double first_ms = now_ms() - started;
        fprintf(stderr, "process %d turn %d: first call took %.1f ms\n", index, turn, first_ms);
        for (int i = 0; i < COUNT; i++) {
            Allocation &a = allocations[i];
            check<<<blocks_for(a.len), 256>>>(a.ptr, a.len, a.seed, (unsigned long long)i + 1, counters, counters + 1);
            CHECK_LAUNCH();
        }
        unsigned long long got[2] = {0, 0};
        CHECK(cudaMemcpy(got, counters, sizeof(got), cudaMemcpyDeviceToHost));
        CHECK(cudaMemset(counters, 0, sizeof(unsigned long long)));
        check<<<blocks_for(ballast.len), 256>>>(ballast.ptr, ballast.len, ballast.seed, 1, counters, counters + 1);
        CHECK_LAUNCH();
        unsigned long long ballast_wrong = 0;
        CHECK(cudaMemcpy(&ballast_wrong, counters, sizeof(ballast_wrong), cudaMemcpyDeviceToHost));
        bool intact = got[0] == 0 && ballast_wrong == 0;
        printf("process %d turn %d: %s, checksum %016llx\n", index, turn, intact ? "every byte as written" : "BYTES CHANGED", got[1]);
        if (!intact) {
            printf("FAIL: process %d turn %d: %llu bytes changed, %llu in the ballast\n", index, turn, got[0], ballast_wrong);
            failures++;
        }
        // A third freed and made again with another size; then new bytes everywhere.
        int remade = 0;
        mixed = 0;
        for (int i = 0; i < COUNT; i++) {
            Allocation &a = allocations[i];
            if ((i + turn) % 3 == 0) {
                CHECK(cudaFree(a.ptr));
                a.len = SIZES[(i + turn + 1) % NSIZES];
                CHECK(cudaMalloc(&a.ptr, a.len));
                remade++;
            }
            write_bytes(a, seed_of(index, turn + 1, i), (i / 3 + turn) % 3, scratch, host);
            mixed += a.len;
        }
        write_bytes(ballast, seed_of(index, turn + 1, COUNT), 0, scratch, host);
        CHECK(cudaDeviceSynchronize());
        printf("process %d turn %d: %d freed and made again, %zu bytes in all\n", index, turn, remade, mixed);
        fprintf(stderr, "process %d turn %d: took %.1f ms\n", index, turn, now_ms() - started);
        send_byte(done_fd);
    }
    for (Allocation &a : allocations) CHECK(cudaFree(a.ptr));
    CHECK(cudaFree(ballast.ptr));
    CHECK(cudaFree(scratch));
    CHECK(cudaFree(counters));
    return failures ? 1 : 0;
}

int main(int argc, char **argv) { return take_turns(argc, argv, "paging_addresses", "turns", 2, 0.3, child); }

// kernel_args: kernels with every kind of argument the parameter packing must get right.
// Covers: structs by value with padding and alignment ({char; double; int3}, __align__(16), a 1 KiB
// struct), pointers (including into the middle of an allocation, and null), char/unsigned char/short,
// bool, float, double, 64-bit integers (long long, unsigned long long, size_t), a kernel with many
// arguments, template kernels (int, float, double, long long, a non-type template parameter), a kernel
// without arguments, 3-D grids and blocks, dynamic shared memory, launches on a created stream, and
// the same struct kernel through explicit cudaLaunchKernel.
#include "common.h"

#include <vector>

struct Mixed {  // c@0, d@8, v@16..28, size 32 (padding after c and at the end)
    char c;
    double d;
    int3 v;
};
struct Small {  // a@0, b@2, size 4
    char a;
    short b;
};
struct __align__(16) Aligned16 {  // 16-byte aligned: the parameter lands on a 16-byte offset
    float x;
    int y;
    short z;
};
struct Big {  // 1 KiB by value
    int vals[256];
};

// Everything the kernels saw, written back for the host to compare.
struct Seen {
    char c;
    unsigned char uc;
    short s;
    int i;
    unsigned int u;
    long long ll;
    unsigned long long ull;
    size_t sz;
    float f;
    double d;
    bool b;
    int null_ptr_was_null;
    int mid_ptr_value;
    Mixed m;
    Small sm;
    Aligned16 al;
    long long big_sum;
    int big_first, big_last;
    char after_big;
    double after_big_d;
};

__global__ void k_scalars(char c, double d, unsigned char uc, long long ll, short s, size_t sz, int i,
                          unsigned long long ull, bool b, unsigned int u, float f, Seen *out) {
    out->c = c;
    out->d = d;
    out->uc = uc;
    out->ll = ll;
    out->s = s;
    out->sz = sz;
    out->i = i;
    out->ull = ull;
    out->b = b;
    out->u = u;
    out->f = f;
}

__global__ void k_pointers(const int *mid, const int *null_ptr, Seen *out) {
    out->null_ptr_was_null = (null_ptr == nullptr) ? 1 : 0;
    out->mid_ptr_value = mid[0];
}

__global__ void k_structs(char before, Mixed m, Small sm, Aligned16 al, Big big, char after, double after_d,
                          Seen *out) {
    out->c = before;
    out->m = m;
    out->sm = sm;
    out->al = al;
    long long sum = 0;
    for (int i = 0; i < 256; i++) sum += big.vals[i];
    out->big_sum = sum;
    out->big_first = big.vals[0];
    out->big_last = big.vals[255];
    out->after_big = after;
    out->after_big_d = after_d;
}

__global__ void k_many(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, double d0, int a8,
                       int a9, int a10, int a11, char c0, int a12, int a13, int a14, int a15, long long l0,
                       int a16, int a17, int a18, int a19, float f0, int a20, int a21, int a22, int a23,
                       long long *out) {
    long long ints = (long long)a0 + a1 * 2 + a2 * 3 + a3 * 4 + a4 * 5 + a5 * 6 + a6 * 7 + a7 * 8 + a8 * 9 +
                     a9 * 10 + a10 * 11 + a11 * 12 + a12 * 13 + a13 * 14 + a14 * 15 + a15 * 16 + a16 * 17 +
                     a17 * 18 + a18 * 19 + a19 * 20 + a20 * 21 + a21 * 22 + a22 * 23 + a23 * 24;
    out[0] = ints;
    out[1] = (long long)(d0 * 1000.0);
    out[2] = c0;
    out[3] = l0;
    out[4] = (long long)(f0 * 1000.0f);
}

template <typename T>
__global__ void k_axpy(T a, const T *x, T *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

template <int N>
__global__ void k_fill_n(int *out) {
    int i = threadIdx.x;
    if (i < N) out[i] = N * 100 + i;
}

__device__ int d_noargs_flag;
__global__ void k_noargs() { d_noargs_flag = 12345; }

__global__ void k_dims(int *out) {
    int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int nthreads = blockDim.x * blockDim.y * blockDim.z;
    out[bx * nthreads + tx] = (blockIdx.z << 24) | (blockIdx.y << 16) | (blockIdx.x << 8) |
                              (threadIdx.z << 6) | (threadIdx.y << 3) | threadIdx.x;
}

__global__ void k_dyn_smem(int *out, int n) {
    extern __shared__ int sh[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) sh[i] = i * 3;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = sh[n - 1 - i];
}

template <typename T>
static bool run_axpy(const char *name, T a, cudaStream_t s) {
    const int n = 1000;
    std::vector<T> x(n), y(n), want(n);
    for (int i = 0; i < n; i++) {
        x[i] = (T)(i % 50);
        y[i] = (T)(i % 7);
        want[i] = a * x[i] + y[i];
    }
    T *dx, *dy;
    CHECK(cudaMalloc(&dx, n * sizeof(T)));
    CHECK(cudaMalloc(&dy, n * sizeof(T)));
    CHECK(cudaMemcpy(dx, x.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    k_axpy<T><<<(n + 127) / 128, 128, 0, s>>>(a, dx, dy, n);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(y.data(), dy, n * sizeof(T), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (y[i] != want[i]) bad++;
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    EXPECT(bad == 0, "template k_axpy<%s>: %d wrong", name, bad);
    if (!bad) printf("template k_axpy<%s>: ok\n", name);
    return bad == 0;
}

int main() {
    test_init("kernel_args");

    Seen *d_seen;
    CHECK(cudaMalloc(&d_seen, sizeof(Seen)));
    Seen seen;

    // Scalars, ordered to force padding between parameters.
    {
        const char c = -7;
        const double d = 3.141592653589793;
        const unsigned char uc = 250;
        const long long ll = -0x123456789ABCDEFLL;
        const short s = -12345;
        const size_t sz = ((size_t)1 << 40) + 5;
        const int i = -2000000000;
        const unsigned long long ull = 0xFEDCBA9876543210ULL;
        const bool b = true;
        const unsigned int u = 0xDEADBEEFu;
        const float f = 1.5f;
        CHECK(cudaMemset(d_seen, 0, sizeof(Seen)));
        k_scalars<<<1, 1>>>(c, d, uc, ll, s, sz, i, ull, b, u, f, d_seen);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(&seen, d_seen, sizeof(Seen), cudaMemcpyDeviceToHost));
        bool ok = true;
        ok &= EXPECT(seen.c == c, "char: got %d", seen.c);
        ok &= EXPECT(memcmp(&seen.d, &d, sizeof(d)) == 0, "double: got %.17g", seen.d);
        ok &= EXPECT(seen.uc == uc, "unsigned char: got %u", seen.uc);
        ok &= EXPECT(seen.ll == ll, "long long: got %lld", seen.ll);
        ok &= EXPECT(seen.s == s, "short: got %d", seen.s);
        ok &= EXPECT(seen.sz == sz, "size_t: got %zu", seen.sz);
        ok &= EXPECT(seen.i == i, "int: got %d", seen.i);
        ok &= EXPECT(seen.ull == ull, "unsigned long long: got %llx", seen.ull);
        ok &= EXPECT(seen.b == b, "bool: got %d", (int)seen.b);
        ok &= EXPECT(seen.u == u, "unsigned int: got %x", seen.u);
        ok &= EXPECT(seen.f == f, "float: got %g", seen.f);
        if (ok) printf("scalar arguments (char, uchar, short, int, uint, long long, ull, size_t, float, double, bool): ok\n");
    }

    // Pointers: one into the middle of an allocation, one null.
    {
        int *d_arr;
        CHECK(cudaMalloc(&d_arr, 100 * sizeof(int)));
        std::vector<int> h(100);
        for (int i = 0; i < 100; i++) h[i] = i * 11;
        CHECK(cudaMemcpy(d_arr, h.data(), 100 * sizeof(int), cudaMemcpyHostToDevice));
        CHECK(cudaMemset(d_seen, 0, sizeof(Seen)));
        k_pointers<<<1, 1>>>(d_arr + 37, nullptr, d_seen);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(&seen, d_seen, sizeof(Seen), cudaMemcpyDeviceToHost));
        bool ok = true;
        ok &= EXPECT(seen.null_ptr_was_null == 1, "null pointer argument not null on the device");
        ok &= EXPECT(seen.mid_ptr_value == 37 * 11, "pointer into an allocation: read %d", seen.mid_ptr_value);
        if (ok) printf("pointer arguments (offset into an allocation, null): ok\n");
        CHECK(cudaFree(d_arr));
    }

    // Structs by value: padding, 16-byte alignment, 1 KiB, then scalars after the big one.
    Mixed m;
    memset(&m, 0, sizeof(m));
    m.c = 'Q';
    m.d = -2.5e300;
    m.v = make_int3(-1, 2, -3);
    Small sm;
    memset(&sm, 0, sizeof(sm));
    sm.a = 'z';
    sm.b = -32000;
    Aligned16 al;
    memset(&al, 0, sizeof(al));
    al.x = 0.125f;
    al.y = 77777;
    al.z = -5;
    Big big;
    long long big_sum = 0;
    for (int i = 0; i < 256; i++) {
        big.vals[i] = i * i - 1000;
        big_sum += big.vals[i];
    }
    const char before = 'B', after = 'A';
    const double after_d = 6.02214076e23;
    auto check_structs = [&](const char *how) {
        CHECK(cudaMemcpy(&seen, d_seen, sizeof(Seen), cudaMemcpyDeviceToHost));
        bool ok = true;
        ok &= EXPECT(seen.c == before, "%s: char before structs: %d", how, seen.c);
        ok &= EXPECT(seen.m.c == m.c && seen.m.d == m.d && seen.m.v.x == m.v.x && seen.m.v.y == m.v.y &&
                         seen.m.v.z == m.v.z,
                     "%s: struct {char; double; int3} differs", how);
        ok &= EXPECT(seen.sm.a == sm.a && seen.sm.b == sm.b, "%s: struct {char; short} differs", how);
        ok &= EXPECT(seen.al.x == al.x && seen.al.y == al.y && seen.al.z == al.z,
                     "%s: __align__(16) struct differs", how);
        ok &= EXPECT(seen.big_sum == big_sum && seen.big_first == big.vals[0] && seen.big_last == big.vals[255],
                     "%s: 1 KiB struct differs (sum %lld)", how, seen.big_sum);
        ok &= EXPECT(seen.after_big == after && seen.after_big_d == after_d, "%s: scalars after the 1 KiB struct differ",
                     how);
        if (ok) printf("struct arguments by value via %s: ok\n", how);
    };
    printf("sizeof(Mixed)=%zu alignof(Mixed)=%zu sizeof(Aligned16)=%zu sizeof(Big)=%zu\n", sizeof(Mixed),
           alignof(Mixed), sizeof(Aligned16), sizeof(Big));
    CHECK(cudaMemset(d_seen, 0, sizeof(Seen)));
    k_structs<<<1, 1>>>(before, m, sm, al, big, after, after_d, d_seen);
    CHECK_LAUNCH();
    check_structs("<<<>>>");
    CHECK(cudaMemset(d_seen, 0, sizeof(Seen)));
    {
        char before_v = before, after_v = after;
        double after_d_v = after_d;
        void *args[] = {&before_v, &m, &sm, &al, &big, &after_v, &after_d_v, &d_seen};
        CHECK(cudaLaunchKernel((const void *)k_structs, dim3(1), dim3(1), args, 0, 0));
    }
    CHECK(cudaDeviceSynchronize());
    check_structs("cudaLaunchKernel");

    // Many arguments.
    {
        long long *d_out;
        CHECK(cudaMalloc(&d_out, 5 * sizeof(long long)));
        CHECK(cudaMemset(d_out, 0, 5 * sizeof(long long)));
        k_many<<<1, 1>>>(1, 2, 3, 4, 5, 6, 7, 8, 2.75, 9, 10, 11, 12, 'x', 13, 14, 15, 16, 0x7000000000000001LL, 17,
                         18, 19, 20, -0.5f, 21, 22, 23, 24, d_out);
        CHECK_LAUNCH();
        long long out[5];
        CHECK(cudaMemcpy(out, d_out, sizeof(out), cudaMemcpyDeviceToHost));
        long long ints = 0;
        for (int k = 1; k <= 24; k++) ints += (long long)k * k;
        bool ok = true;
        ok &= EXPECT(out[0] == ints, "many args: int sum %lld, want %lld", out[0], ints);
        ok &= EXPECT(out[1] == 2750, "many args: double %lld", out[1]);
        ok &= EXPECT(out[2] == 'x', "many args: char %lld", out[2]);
        ok &= EXPECT(out[3] == 0x7000000000000001LL, "many args: long long %llx", out[3]);
        ok &= EXPECT(out[4] == -500, "many args: float %lld", out[4]);
        if (ok) printf("29 arguments of mixed types: ok\n");
        CHECK(cudaFree(d_out));
    }

    // Templates on a created stream.
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    run_axpy<int>("int", 3, s);
    run_axpy<float>("float", 0.5f, s);
    run_axpy<double>("double", -1.25, s);
    run_axpy<long long>("long long", 1LL << 33, s);
    {
        int *d_out;
        CHECK(cudaMalloc(&d_out, 64 * sizeof(int)));
        CHECK(cudaMemset(d_out, 0, 64 * sizeof(int)));
        k_fill_n<8><<<1, 64, 0, s>>>(d_out);
        CHECK_LAUNCH();
        k_fill_n<40><<<1, 64, 0, s>>>(d_out + 16);
        CHECK_LAUNCH();
        int h[64];
        CHECK(cudaMemcpyAsync(h, d_out, sizeof(h), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        int bad = 0;
        for (int i = 0; i < 64; i++) {
            int want = i < 8 ? 800 + i : (i < 16 ? 0 : (i < 56 ? 4000 + (i - 16) : 0));
            if (h[i] != want) bad++;
        }
        EXPECT(bad == 0, "non-type template kernels: %d wrong", bad);
        if (!bad) printf("non-type template kernels k_fill_n<8>, k_fill_n<40>: ok\n");
        CHECK(cudaFree(d_out));
    }
    CHECK(cudaStreamDestroy(s));

    // No arguments.
    {
        int zero = 0, flag = 0;
        CHECK(cudaMemcpyToSymbol(d_noargs_flag, &zero, sizeof(zero)));
        k_noargs<<<1, 1>>>();
        CHECK_LAUNCH();
        CHECK(cudaMemcpyFromSymbol(&flag, d_noargs_flag, sizeof(flag)));
        EXPECT(flag == 12345, "kernel without arguments: flag %d", flag);
        if (flag == 12345) printf("kernel without arguments: ok\n");
    }

    // 3-D grid and block.
    {
        const dim3 grid(3, 2, 2), block(4, 2, 3);
        const int total = 3 * 2 * 2 * 4 * 2 * 3;
        int *d_out;
        CHECK(cudaMalloc(&d_out, total * sizeof(int)));
        CHECK(cudaMemset(d_out, 0xFF, total * sizeof(int)));
        k_dims<<<grid, block>>>(d_out);
        CHECK_LAUNCH();
        std::vector<int> h(total);
        CHECK(cudaMemcpy(h.data(), d_out, total * sizeof(int), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int bz = 0; bz < 2; bz++)
            for (int by = 0; by < 2; by++)
                for (int bx = 0; bx < 3; bx++)
                    for (int tz = 0; tz < 3; tz++)
                        for (int ty = 0; ty < 2; ty++)
                            for (int tx = 0; tx < 4; tx++) {
                                int b = bx + 3 * (by + 2 * bz), t = tx + 4 * (ty + 2 * tz);
                                int want = (bz << 24) | (by << 16) | (bx << 8) | (tz << 6) | (ty << 3) | tx;
                                if (h[b * 24 + t] != want) bad++;
                            }
        EXPECT(bad == 0, "3-D grid/block: %d wrong", bad);
        if (!bad) printf("3-D grid (3,2,2) and block (4,2,3): ok\n");
        CHECK(cudaFree(d_out));
    }

    // Dynamic shared memory.
    {
        const int n = 8192;  // 32 KiB
        int *d_out;
        CHECK(cudaMalloc(&d_out, n * sizeof(int)));
        k_dyn_smem<<<1, 256, n * sizeof(int)>>>(d_out, n);
        CHECK_LAUNCH();
        std::vector<int> h(n);
        CHECK(cudaMemcpy(h.data(), d_out, n * sizeof(int), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < n; i++)
            if (h[i] != (n - 1 - i) * 3) bad++;
        EXPECT(bad == 0, "dynamic shared memory: %d wrong", bad);
        if (!bad) printf("dynamic shared memory (32 KiB): ok\n");
        CHECK(cudaFree(d_out));
    }

    CHECK(cudaFree(d_seen));
    CHECK(cudaDeviceSynchronize());
    return test_finish();
}

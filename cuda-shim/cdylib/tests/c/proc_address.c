/* Loads Flyt's libcuda.so.1 as NVIDIA's runtime does (dlopen + cuGetProcAddress_v2) and replays every
 * cuGetProcAddress_v2 request of the census file: the status must match the real driver's, and the pointer
 * must be Flyt's export of the same name (dladdr), or non-NULL where the real driver's was not nameable.
 * Also checks a few fixed answers (unknown names, the legacy 4-argument entry point, export tables, cuInit
 * with no server). Usage: proc_address LIBCUDA CENSUS. No CUDA headers needed: the prototypes are here. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef CUresult (*gpa_v2_t)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*gpa_v1_t)(const char *, void **, int, uint64_t);
typedef CUresult (*init_t)(unsigned);
typedef CUresult (*version_t)(int *);
typedef CUresult (*error_t)(CUresult, const char **);
typedef CUresult (*export_table_t)(const void **, const unsigned char *);

static int failures;
#define CHECK(cond, ...)                                                                                      \
    do {                                                                                                      \
        if (!(cond)) {                                                                                        \
            failures++;                                                                                       \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                              \
            fprintf(stderr, __VA_ARGS__);                                                                     \
            fputc('\n', stderr);                                                                              \
        }                                                                                                     \
    } while (0)

static void *must_sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "missing %s\n", name);
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s LIBCUDA CENSUS\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    gpa_v2_t gpa = (gpa_v2_t)must_sym(lib, "cuGetProcAddress_v2");
    gpa_v1_t gpa_v1 = (gpa_v1_t)must_sym(lib, "cuGetProcAddress");
    Dl_info self;
    CHECK(dladdr((void *)gpa, &self) && self.dli_sname && strcmp(self.dli_sname, "cuGetProcAddress_v2") == 0,
          "dladdr names cuGetProcAddress_v2");

    FILE *census = fopen(argv[2], "r");
    if (!census) {
        perror(argv[2]);
        return 2;
    }
    char line[512], symbol[256], resolved[256];
    int version, result, checked = 0;
    unsigned long long flags;
    while (fgets(line, sizeof line, census)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "%255s %d %llu %d %255s", symbol, &version, &flags, &result, resolved) != 5) {
            fprintf(stderr, "bad census line: %s", line);
            return 2;
        }
        const char *name = strcmp(symbol, "\"\"") == 0 ? "" : symbol;
        void *pfn = (void *)0x1;
        int status = -1;
        CUresult got = gpa(name, &pfn, version, flags, &status);
        CHECK(got == result, "%s %d %llu: result %d, driver %d", name, version, flags, got, result);
        if (strcmp(resolved, "-") == 0) {
            CHECK(pfn == NULL && status == 1, "%s %d %llu: expected NULL, not found", name, version, flags);
        } else if (strcmp(resolved, "(hidden)") == 0) {
            CHECK(pfn != NULL && status == 0, "%s %d %llu: expected a function", name, version, flags);
        } else {
            Dl_info info;
            int named = pfn && dladdr(pfn, &info) && info.dli_sname && info.dli_fbase == self.dli_fbase;
            CHECK(named && strcmp(info.dli_sname, resolved) == 0 && status == 0, "%s %d %llu: got %s, driver %s",
                  name, version, flags, named ? info.dli_sname : "(nothing of ours)", resolved);
        }
        checked++;
    }
    fclose(census);

    /* Fixed answers of the real driver (580). */
    void *pfn = (void *)0x1;
    int status = -1;
    CHECK(gpa("cuNoSuchFunction", &pfn, 12000, 0, &status) == 0 && pfn == NULL && status == 1, "unknown name");
    CHECK(gpa("cuCtxCreate", &pfn, 1000, 0, &status) == 0 && pfn == NULL && status == 2, "version too low");
    pfn = (void *)0x1;
    CHECK(gpa("cuMemAlloc", &pfn, 99000, 0, &status) == 1 && pfn == (void *)0x1, "version above the driver's");
    CHECK(gpa_v1("cuNoSuchFunction", &pfn, 12000, 0) == 500 && pfn == (void *)0x1, "v1: unknown name");
    CHECK(gpa_v1("", &pfn, 12000, 0) == 500 && pfn == (void *)0x1, "v1: empty name");
    CHECK(gpa_v1("cuCtxCreate", &pfn, 1000, 0) == 500 && pfn == (void *)0x1, "v1: version too low");
    CHECK(gpa_v1("cuMemcpyAsync", &pfn, 7000, 2) == 0 && pfn == dlsym(lib, "cuMemcpyAsync_ptsz"), "v1: per-thread");

    export_table_t export_table = (export_table_t)must_sym(lib, "cuGetExportTable");
    const unsigned char cudart[16] = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                      0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};
    const unsigned char heap_access[16] = {0x19, 0x5b, 0xcb, 0xf4, 0xd6, 0x7d, 0x02, 0x4a,
                                           0xac, 0xc5, 0x1d, 0x29, 0xce, 0xa6, 0x31, 0xae};
    const void *table1 = NULL, *table2 = NULL, *none = NULL;
    CHECK(export_table(&table1, cudart) == 0 && export_table(&table2, cudart) == 0 && table1 == table2 &&
              ((const uintptr_t *)table1)[0] == 13 * sizeof(void *),
          "CudartInterface: stable, 13 words");
    CHECK(export_table(&none, heap_access) == 1 && none == NULL, "unknown table: CUDA_ERROR_INVALID_VALUE");

    /* No server: cuInit succeeds without connecting anywhere; the first call that needs the devices
       fails with CUDA_ERROR_NO_DEVICE, and so does every later one. */
    init_t init = (init_t)must_sym(lib, "cuInit");
    version_t driver_version = (version_t)must_sym(lib, "cuDriverGetVersion");
    error_t error_name = (error_t)must_sym(lib, "cuGetErrorName");
    version_t device_count = (version_t)must_sym(lib, "cuDeviceGetCount");
    int v = 0, count = -1;
    CHECK(driver_version(&v) == 0 && v == 13000, "cuDriverGetVersion before cuInit: %d", v);
    CHECK(device_count(&count) == 3 && count == -1, "cuDeviceGetCount before cuInit");
    CHECK(init(0) == 0, "cuInit with no server connects nowhere");
    const char *text = NULL;
    CHECK(error_name(100, &text) == 0 && text && strcmp(text, "CUDA_ERROR_NO_DEVICE") == 0, "error name");
    CHECK(device_count(&count) == 100 && count == -1, "cuDeviceGetCount with no server");
    CHECK(device_count(&count) == 100 && count == -1, "cuDeviceGetCount with no server, again");
    CHECK(((CUresult(*)(void *, size_t))must_sym(lib, "cuMemAlloc_v2"))(NULL, 16) == 1, "cuMemAlloc_v2(NULL): invalid value");
    CHECK(((CUresult(*)(void *))must_sym(lib, "cuGraphicsUnregisterResource"))(NULL) == 801, "unsupported: 801");

    printf("checked %d requests, %d failures\n", checked, failures);
    return failures != 0;
}

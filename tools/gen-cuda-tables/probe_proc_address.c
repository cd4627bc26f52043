/* Records what the real driver's cuGetProcAddress_v2 answers, for tools/gen-cuda-tables/generate.
 * Usage (on a machine with NVIDIA's driver): cc -O2 -o probe tools/gen-cuda-tables/probe_proc_address.c -ldl &&
 *   ./probe cuda-shim/data/libcuda-580-exports.txt > cuda-shim/data/proc-address-580.txt
 *
 * For every export name and every base name (the name without _ptds/_ptsz and _vN), flags 0 and 2, and every
 * cudaVersion 1000, 1010, ..., 13020, it calls cuGetProcAddress_v2 and prints only the change points:
 *   NAME FLAGS FROM_VERSION RESULT RESOLVED
 * RESOLVED is the exported name dladdr gives for the returned pointer, (hidden) when the pointer is not the
 * start of an export of libcuda.so.1, (null:STATUS) for NULL with that symbolStatus, - when RESULT is not 0.
 * Names that are never found are left out. It also prints `driver_version N` and, for every code
 * cuGetErrorName knows, `error CODE NAME TEXT` (cuGetErrorString's text). No CUDA headers needed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef CUresult (*gpa_t)(const char *, void **, int, uint64_t, int *);

static void *libcuda;
static gpa_t gpa;
static Dl_info libcuda_info;

/* The answer for one request, as printed. */
static void answer(const char *name, int version, int flags, char *out, size_t size, int *result) {
    void *pfn = NULL;
    int status = -1;
    *result = gpa(name, &pfn, version, (uint64_t)flags, &status);
    if (*result != 0) {
        snprintf(out, size, "-");
        return;
    }
    if (!pfn) {
        snprintf(out, size, "(null:%d)", status);
        return;
    }
    Dl_info info;
    if (dladdr(pfn, &info) && info.dli_sname && info.dli_saddr == pfn && info.dli_fbase == libcuda_info.dli_fbase)
        snprintf(out, size, "%s", info.dli_sname);
    else
        snprintf(out, size, "(hidden)");
}

static void probe(const char *name) {
    for (int flags = 0; flags <= 2; flags += 2) {
        char previous[512] = "", current[512];
        int previous_result = -1, result, found = 0;
        static char lines[1300][600];
        int n = 0;
        for (int version = 1000; version <= 13020; version += 10) {
            answer(name, version, flags, current, sizeof current, &result);
            if (result == 0 && strncmp(current, "(null:1)", 8) != 0) found = 1;
            if (result != previous_result || strcmp(current, previous) != 0) {
                if (n < 1300) snprintf(lines[n++], sizeof lines[0], "%.255s %d %d %d %.255s", name, flags, version, result, current);
                previous_result = result;
                snprintf(previous, sizeof previous, "%s", current);
            }
        }
        if (found)
            for (int i = 0; i < n; i++) puts(lines[i]);
    }
}

/* name without _ptds/_ptsz, then without _vN */
static void base_name(const char *name, char *out, size_t size) {
    snprintf(out, size, "%s", name);
    size_t len = strlen(out);
    if (len > 5 && (strcmp(out + len - 5, "_ptds") == 0 || strcmp(out + len - 5, "_ptsz") == 0)) out[len -= 5] = 0;
    char *v = strrchr(out, '_');
    if (v && v[1] == 'v' && v[2]) {
        char *p = v + 2;
        while (*p >= '0' && *p <= '9') p++;
        if (*p == 0) *v = 0;
    }
}

static int seen(char names[][256], int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s EXPORT-LIST\n", argv[0]);
        return 2;
    }
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!libcuda) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    gpa = (gpa_t)dlsym(libcuda, "cuGetProcAddress_v2");
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(libcuda, "cuInit");
    CUresult (*driver_version)(int *) = (CUresult(*)(int *))dlsym(libcuda, "cuDriverGetVersion");
    CUresult (*error_name)(CUresult, const char **) = (CUresult(*)(CUresult, const char **))dlsym(libcuda, "cuGetErrorName");
    CUresult (*error_string)(CUresult, const char **) =
        (CUresult(*)(CUresult, const char **))dlsym(libcuda, "cuGetErrorString");
    if (!gpa || !init || !driver_version || !error_name || !error_string || !dladdr((void *)gpa, &libcuda_info)) {
        fprintf(stderr, "libcuda.so.1 lacks the entry points this probe needs\n");
        return 1;
    }
    init(0);
    int version = 0;
    driver_version(&version);
    printf("# cuGetProcAddress_v2 of the real driver: NAME FLAGS FROM_VERSION RESULT RESOLVED (probe_proc_address.c)\n");
    printf("driver_version %d\n", version);

    FILE *list = fopen(argv[1], "r");
    if (!list) {
        perror(argv[1]);
        return 1;
    }
    static char names[4096][256];
    int n = 0;
    char line[256], base[256];
    while (fgets(line, sizeof line, list) && n < 4094) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\n")] = 0;
        if (!seen(names, n, line)) snprintf(names[n++], sizeof names[0], "%s", line);
        base_name(line, base, sizeof base);
        if (!seen(names, n, base)) snprintf(names[n++], sizeof names[0], "%s", base);
    }
    fclose(list);
    for (int i = 0; i < n; i++) probe(names[i]);

    for (int code = 0; code < 1000; code++) {
        const char *name = NULL, *text = NULL;
        if (error_name(code, &name) == 0 && name && error_string(code, &text) == 0 && text)
            printf("error %d %s %s\n", code, name, text);
    }
    return 0;
}

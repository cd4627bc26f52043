// A probe of the real driver, not part of Flyt: preloaded into a program that runs natively, it
// replaces chosen entries of the driver's private export tables (the driver hands every caller the
// same table) with wrappers that log each call's arguments, the 64 bytes behind each argument that
// is a readable address (before and after the call, and one pointer deeper after it) and the result.
// What it prints is how Flyt learns what NVIDIA's libraries expect of an entry.
//   EXPORT_TRACE="21318c60:4,6e163fbe:7" EXPORT_TRACE_OUT=file LD_PRELOAD=export_trace.so ./program
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#include <pthread.h>

typedef uint64_t (*entry_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);
#define SLOTS 32
#define MAX_LOGGED 40
static entry_fn original[SLOTS];
static char slot_name[SLOTS][32];
static int calls[SLOTS];
static FILE *out;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int readable(uint64_t address, unsigned char *into, size_t n) {
    if (address < 4096) return 0;
    struct iovec local = {into, n}, remote = {(void *)address, n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n;
}

// How many bytes behind each argument to log (EXPORT_TRACE_BYTES, 64 to 1024, a multiple of 8).
static int dump_bytes = 64;

static void dump(const char *label, uint64_t address, int deeper) {
    unsigned char bytes[1024];
    int n = dump_bytes;
    while (n > 8 && !readable(address, bytes, n)) n /= 2;
    if (n < 8 || !readable(address, bytes, n)) return;
    fprintf(out, "    %s %#lx:", label, (unsigned long)address);
    for (int i = 0; i < n; i += 8) {
        uint64_t word;
        memcpy(&word, bytes + i, 8);
        fprintf(out, " %016lx", (unsigned long)word);
    }
    Dl_info info;
    if (dladdr((void *)address, &info) && info.dli_fname) fprintf(out, "  [%s%s%s]", info.dli_fname, info.dli_sname ? ":" : "", info.dli_sname ? info.dli_sname : "");
    fprintf(out, "\n");
    if (deeper) {
        uint64_t first;
        memcpy(&first, bytes, 8);
        dump("   ->", first, 0);
    }
}

// ToolsModule entry 7 calls back into the library once per function: log those calls too.
static __thread entry_fn module_callback;
static uint64_t logged_callback(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7) {
    uint64_t r = module_callback(a0, a1, a2, a3, a4, a5, a6, a7);
    pthread_mutex_lock(&mu);
    fprintf(out, "  module callback (%#lx, %#lx, %#lx, %#lx, %#lx, %#lx) returned %#lx\n", a0, a1, a2, a3, a4, a5, (unsigned long)r);
    dump("  cb a0", a0, 0);
    dump("  cb a1", a1, 1);
    pthread_mutex_unlock(&mu);
    return r;
}

// Experiments on how a library reacts (native runs only): EXPORT_FAIL="1734dc26[4]=801" makes that
// entry return the code without calling the driver; EXPORT_CLOBBER="1734dc26[13]=0:16" calls it, then
// zeroes bytes [16) behind argument 0 (what a library would see from a wrong answer).
static int find_knob(const char *env, const char *name, char *value, size_t n) {
    const char *spec = getenv(env);
    if (!spec) return 0;
    size_t len = strlen(name);
    for (const char *p = strstr(spec, name); p; p = strstr(p + 1, name)) {
        if (p[len] == '=') {
            size_t i = 0;
            for (p += len + 1; *p && *p != ',' && i + 1 < n; p++) value[i++] = *p;
            value[i] = 0;
            return 1;
        }
    }
    return 0;
}

static uint64_t traced(int slot, uint64_t a[8]) {
    char knob[32];
    if (find_knob("EXPORT_FAIL", slot_name[slot], knob, sizeof knob)) {
        pthread_mutex_lock(&mu);
        fprintf(out, "%s call %d failed on purpose with %s\n", slot_name[slot], ++calls[slot], knob);
        fflush(out);
        pthread_mutex_unlock(&mu);
        return strtoull(knob, NULL, 0);
    }
    pthread_mutex_lock(&mu);
    int n = ++calls[slot];
    int log = n <= MAX_LOGGED;
    if (log) {
        fprintf(out, "%s call %d (%#lx, %#lx, %#lx, %#lx, %#lx, %#lx, %#lx, %#lx)\n", slot_name[slot], n, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
        for (int i = 0; i < 6; i++) { char l[16]; snprintf(l, 16, "before a%d", i); dump(l, a[i], 0); }
    }
    pthread_mutex_unlock(&mu);
    if (!strcmp(slot_name[slot], "6e163fbe[7]") && a[2]) {
        module_callback = (entry_fn)a[2];
        a[2] = (uint64_t)logged_callback;
    }
    uint64_t r = original[slot](a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    int argument, bytes;
    if (find_knob("EXPORT_CLOBBER", slot_name[slot], knob, sizeof knob) && sscanf(knob, "%d:%d", &argument, &bytes) == 2 &&
        argument >= 0 && argument < 8 && a[argument]) {
        memset((void *)a[argument], 0, bytes);
        fprintf(out, "%s: zeroed %d bytes behind a%d after the call\n", slot_name[slot], bytes, argument);
    }
    pthread_mutex_lock(&mu);
    if (log) {
        fprintf(out, "%s call %d returned %#lx\n", slot_name[slot], n, (unsigned long)r);
        for (int i = 0; i < 6; i++) { char l[16]; snprintf(l, 16, "after  a%d", i); dump(l, a[i], 1); }
        fflush(out);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

#define WRAPPER(k) \
    static uint64_t wrapper##k(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7) { \
        uint64_t a[8] = {a0, a1, a2, a3, a4, a5, a6, a7}; \
        return traced(k, a); \
    }
WRAPPER(0) WRAPPER(1) WRAPPER(2) WRAPPER(3) WRAPPER(4) WRAPPER(5) WRAPPER(6) WRAPPER(7)
WRAPPER(8) WRAPPER(9) WRAPPER(10) WRAPPER(11) WRAPPER(12) WRAPPER(13) WRAPPER(14) WRAPPER(15)
WRAPPER(16) WRAPPER(17) WRAPPER(18) WRAPPER(19) WRAPPER(20) WRAPPER(21) WRAPPER(22) WRAPPER(23)
WRAPPER(24) WRAPPER(25) WRAPPER(26) WRAPPER(27) WRAPPER(28) WRAPPER(29) WRAPPER(30) WRAPPER(31)
static entry_fn wrappers[SLOTS] = {wrapper0, wrapper1, wrapper2, wrapper3, wrapper4, wrapper5, wrapper6, wrapper7,
    wrapper8, wrapper9, wrapper10, wrapper11, wrapper12, wrapper13, wrapper14, wrapper15,
    wrapper16, wrapper17, wrapper18, wrapper19, wrapper20, wrapper21, wrapper22, wrapper23,
    wrapper24, wrapper25, wrapper26, wrapper27, wrapper28, wrapper29, wrapper30, wrapper31};

static int parse_uuid(const char *text, unsigned char id[16]) {
    int n = 0;
    for (const char *p = text; *p && n < 32; p++) {
        if (*p == '-') continue;
        unsigned v;
        if (sscanf(p, "%1x", &v) != 1) return 0;
        if (n % 2 == 0) id[n / 2] = v << 4; else id[n / 2] |= v;
        n++;
    }
    return n == 32;
}

static const char *KNOWN[] = {"21318c60-9714-3248-8ca6-41ff7324c8f2", "6e163fbe-b958-444d-835c-e182aff1991e",
    "f8cff951-2146-8b4e-b9e2-fb469e7c0dd9", "69a28e9f-2449-8b47-b030-c5da330ea4e9", "1734dc26-800d-4745-8726-c0f1e7dd8bca",
    "da9151d3-3ae6-cc41-a5c0-4f26d533e328", "b10541e1-f7c7-c74a-9f64-f223be99f1e2", "263e8860-7cd2-6143-92f6-bbd5006dfa7e"};

__attribute__((constructor)) static void patch(void) {
    const char *spec = getenv("EXPORT_TRACE");
    if (!spec) return;
    const char *bytes = getenv("EXPORT_TRACE_BYTES");
    if (bytes && atoi(bytes) >= 64 && atoi(bytes) <= 1024) dump_bytes = atoi(bytes) / 8 * 8;
    const char *path = getenv("EXPORT_TRACE_OUT");
    out = path ? fopen(path, "a") : stderr;
    if (!out) out = stderr;
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!driver) { fprintf(out, "export_trace: %s\n", dlerror()); return; }
    int (*get)(const void **, const unsigned char *) = dlsym(driver, "cuGetExportTable");
    char *copy = strdup(spec);
    int slot = 0;
    for (char *item = strtok(copy, ","); item && slot < SLOTS; item = strtok(NULL, ",")) {
        char prefix[16]; int index;
        if (sscanf(item, "%15[0-9a-f]:%d", prefix, &index) != 2) continue;
        const char *full = NULL;
        for (unsigned k = 0; k < sizeof KNOWN / sizeof *KNOWN; k++) if (!strncmp(KNOWN[k], prefix, strlen(prefix))) full = KNOWN[k];
        unsigned char id[16];
        if (!full || !parse_uuid(full, id)) { fprintf(out, "export_trace: unknown table %s\n", prefix); continue; }
        const uint64_t *table = NULL;
        int r = get((const void **)&table, id);
        if (r || !table) { fprintf(out, "export_trace: table %s: error %d\n", prefix, r); continue; }
        uint64_t *entry = (uint64_t *)&table[index];
        long page = sysconf(_SC_PAGESIZE);
        uintptr_t start = (uintptr_t)entry & ~(uintptr_t)(page - 1);
        if (mprotect((void *)start, page, PROT_READ | PROT_WRITE)) { perror("export_trace: mprotect"); continue; }
        original[slot] = (entry_fn)*entry;
        snprintf(slot_name[slot], 32, "%s[%d]", prefix, index);
        Dl_info info;
        fprintf(out, "export_trace: %s size word %lu, entry at %p is %p (%s)\n", slot_name[slot], (unsigned long)table[0], (void *)entry, (void *)*entry,
                dladdr((void *)*entry, &info) && info.dli_sname ? info.dli_sname : "no symbol");
        *entry = (uint64_t)wrappers[slot];
        slot++;
    }
    free(copy);
    fflush(out);
}

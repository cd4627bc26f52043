/* The audit of every export Flyt does not support: for each name read from stdin (one a line),
 * the symbol as the dynamic linker binds it (default version) is called twice, and both calls
 * must answer cudaErrorNotSupported and leave it as the thread's last error. Prints `audited
 * <name>` for each; the test requires exactly one `flyt: <name> is not supported` line on stderr
 * per name (once per process, however often it is called).
 *
 * The calls pass eight zero arguments whatever the real signature: every unsupported export
 * ignores its arguments (the refused ones look only at a stream handle, here the legacy stream),
 * and on the x86-64 and AArch64 C calling conventions extra arguments are harmless. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef cudaError_t (*any_export)(void *, void *, void *, void *, void *, void *, void *, void *);

int main(void) {
    char line[256];
    int failures = 0, count = 0;
    int devices = 0;
    /* Open the session first, so every refused call meets a live one. */
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices != 1) {
        printf("FAILED: no session\n");
        return 1;
    }
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        any_export call = (any_export)dlsym(RTLD_DEFAULT, line);
        if (!call) {
            printf("FAILED: %s is not exported\n", line);
            failures++;
            continue;
        }
        (void)cudaGetLastError();
        for (int round = 0; round < 2; round++) {
            cudaError_t got = call(0, 0, 0, 0, 0, 0, 0, 0);
            cudaError_t last = cudaGetLastError();
            if (got != cudaErrorNotSupported || last != cudaErrorNotSupported) {
                printf("FAILED: %s -> %s, last error %s\n", line, cudaGetErrorName(got), cudaGetErrorName(last));
                failures++;
            }
        }
        printf("audited %s\n", line);
        count++;
    }
    printf("%s: %d failure(s), %d export(s)\n", failures ? "FAILED" : "PASSED", failures, count);
    return failures ? 1 : 0;
}

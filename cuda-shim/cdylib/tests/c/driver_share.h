// What the two-process driver-API test programs (driver_vmm_share.c, driver_pool_share.c) share:
// an exporter in this process, an importer in a forked one, the descriptor passed between them
// over a Unix socket (gpu-tests/fd_passing.h), and each process's verdict line.
#pragma once

#include <sys/wait.h>

#include "../../../../gpu-tests/fd_passing.h"
#include "driver_expect.h"

// Prints "ROLE PASSED: 0 failure(s)" (or FAILED and the count) and returns the process's exit code.
static int verdict(const char *role) {
    printf("%s %s: %d failure(s)\n", role, failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

// The whole program: `exporter` here and `importer` in a forked process (on the server named by
// IMPORTER_FLYT_SERVER where that is set); "PASSED: both processes" when both pass.
static int run_exporter_and_importer(int (*exporter)(int), int (*importer)(int)) {
    int status = 0;
    int code = run_parent_and_child(exporter, importer, "IMPORTER_FLYT_SERVER", &status);
    int child_code = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    printf("%s\n", code == 0 && child_code == 0 ? "PASSED: both processes" : "FAILED");
    return code || child_code;
}

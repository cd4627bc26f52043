/* hide_gpu LIST -- COMMAND [ARG...]: runs COMMAND with the local GPU hidden from it.
 *
 * In a new mount namespace (unshare(CLONE_NEWNS); mounts made private so nothing leaks out), for each
 * line of the file LIST:
 *   bind PATH    bind-mounts /dev/null over PATH (a device node such as /dev/nvidia0, or one driver
 *                library file such as /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05)
 *   tmpfs DIR    mounts an empty, read-only tmpfs over DIR (a folder of NVIDIA files only, such as
 *                /usr/local/nvidia/lib64 or /dev/nvidia-caps)
 * then execs COMMAND in the same process (same pid). Needs root (CAP_SYS_ADMIN). Any failure is fatal:
 * it prints "hide_gpu: ..." on stderr and exits 125 without running COMMAND, so a run is never
 * reported as hidden when it was not. Lines that are empty or start with '#' are skipped. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

static int fail(const char *what, const char *path) {
    fprintf(stderr, "hide_gpu: %s %s: %s\n", what, path ? path : "", strerror(errno));
    return 125;
}

int main(int argc, char **argv) {
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        fprintf(stderr, "usage: hide_gpu LIST -- COMMAND [ARG...]\n");
        return 125;
    }
    FILE *list = fopen(argv[1], "r");
    if (!list) return fail("cannot read", argv[1]);
    if (unshare(CLONE_NEWNS) != 0) return fail("unshare(CLONE_NEWNS)", NULL);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return fail("making mounts private", "/");
    char line[4096];
    while (fgets(line, sizeof line, list)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        char *path = strchr(line, ' ');
        if (!path) {
            errno = EINVAL;
            return fail("bad line", line);
        }
        *path++ = 0;
        if (!strcmp(line, "bind")) {
            if (mount("/dev/null", path, NULL, MS_BIND, NULL) != 0) return fail("bind /dev/null over", path);
        } else if (!strcmp(line, "tmpfs")) {
            if (mount("none", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=755") != 0)
                return fail("tmpfs over", path);
        } else {
            errno = EINVAL;
            return fail("unknown action", line);
        }
    }
    fclose(list);
    execvp(argv[3], argv + 3);
    return fail("exec", argv[3]);
}

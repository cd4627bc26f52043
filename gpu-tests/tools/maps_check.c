/* maps_check.so: LD_PRELOADed into every Flyt run of gpu-tests/run.sh. When the process exits
 * normally (exit or return from main: destructors run), it scans /proc/self/maps and appends one line
 * to the file named by FLYT_TEST_MAPS_OUT:
 *   maps_check pid=<pid> driver=<none | path,path...> cudart=<path of every libcudart.so* mapped>
 * "driver" lists every driver library mapped (libcuda.so*, libnvidia-*): through Flyt the only one
 * may be Flyt's own libcuda.so.1, which proves the app never used the local GPU; cudart must be
 * Flyt's library (or none, for a program with NVIDIA's static runtime inside).
 * It writes nothing when the variable is unset and never prints on stdout or stderr. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void add_unique(char *list, size_t cap, const char *path) {
    if (strstr(list, path)) return;
    size_t used = strlen(list);
    size_t need = strlen(path) + (used ? 1 : 0);
    if (used + need + 1 > cap) return;
    if (used) strcat(list, ",");
    strcat(list, path);
}

__attribute__((destructor)) static void maps_check_at_exit(void) {
    const char *out = getenv("FLYT_TEST_MAPS_OUT");
    if (!out || !*out) return;
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return;
    static char driver[8192], cudart[4096], line[4096];
    driver[0] = cudart[0] = 0;
    while (fgets(line, sizeof line, maps)) {
        char *path = strchr(line, '/');
        if (!path) continue;
        path[strcspn(path, "\n")] = 0;
        const char *base = strrchr(path, '/') + 1;
        if (!strncmp(base, "libcuda.so", 10) || !strncmp(base, "libnvidia-", 10) ||
            !strncmp(base, "libcudadebugger.so", 18))
            add_unique(driver, sizeof driver, path);
        else if (!strncmp(base, "libcudart.so", 12))
            add_unique(cudart, sizeof cudart, path);
    }
    fclose(maps);
    char buf[16384];
    int n = snprintf(buf, sizeof buf, "maps_check pid=%d driver=%s cudart=%s\n", (int)getpid(),
                     driver[0] ? driver : "none", cudart[0] ? cudart : "none");
    if (n <= 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    int fd = open(out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, buf, (size_t)n);
    (void)w;
    close(fd);
}

// region_scribble: a VM guest that scribbles over its own ivshmem region while a program of its
// own uses it. Maps the region's BAR (its `resource2`), starts the program, and writes random
// bytes, a MiB at a time, at random places past the first session slot's message rings until
// the program ends or SECONDS pass (then it stops the program and says so).
// Usage: region_scribble BAR SECONDS PROGRAM [ARGS...]
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// The first slot starts 2 MiB into the region; its rings and their headers fit in 4 MiB.
#define PAST_RINGS ((2u << 20) + (4u << 20))
#define NOISE (1u << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: region_scribble BAR SECONDS PROGRAM [ARGS...]\n");
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size < PAST_RINGS + 2 * NOISE) {
        perror(argv[1]);
        return 2;
    }
    size_t size = (size_t)st.st_size;
    unsigned char *region = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (region == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    pid_t program = fork();
    if (program == 0) {
        execvp(argv[3], argv + 3);
        perror(argv[3]);
        _exit(127);
    }
    // Let the program open its session first: it claims its slot, then copies.
    sleep(2);
    double deadline = now() + atof(argv[2]);
    uint64_t state = 0x2545f4914f6cdd1dull;
    static unsigned char noise[NOISE];
    unsigned long scribbles = 0;
    int status = 0;
    while (waitpid(program, &status, WNOHANG) == 0) {
        if (now() > deadline) {
            kill(program, SIGKILL);
            waitpid(program, &status, 0);
            printf("scribble: the program neither failed nor ended within %s s (%lu scribbles)\n", argv[2], scribbles);
            return 1;
        }
        for (size_t i = 0; i < NOISE; i += 8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            memcpy(noise + i, &state, 8);
        }
        size_t span = size - PAST_RINGS - NOISE;
        size_t offset = PAST_RINGS + (size_t)(state % span) / 4096 * 4096;
        memcpy(region + offset, noise, NOISE);
        scribbles++;
    }
    printf("scribble: the program ended with status %d after %lu scribbles\n",
           WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), scribbles);
    return 0;
}

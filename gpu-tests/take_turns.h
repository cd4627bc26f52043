// Processes that take turns on one GPU, one at a time, as tenants of an oversubscribed GPU do:
// the parent (which never calls CUDA) forks the children, then hands out turns round-robin over
// pipes (a byte to a child starts its turn; one back ends it), a first turn for allocations and
// then `turns` more. A child that fails or stops answering ends the run at once. paging.cu and
// paging_addresses.cu include it.
#pragma once

#include "common.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Waits up to 10 minutes for one byte on `fd`; false on end of file, error or timeout.
static bool receive(int fd) {
    pollfd p = {fd, POLLIN, 0};
    char byte;
    return poll(&p, 1, 600000) == 1 && read(fd, &byte, 1) == 1;
}

static void send_byte(int fd) {
    char byte = 't';
    if (write(fd, &byte, 1) != 1) exit(3);
}

// One child's work: its allocations and its turns, each started by a byte on `turn_fd` and ended
// by one sent on `done_fd`; returns its exit status.
typedef int (*TurnChild)(int index, int turns, double fraction, int turn_fd, int done_fd);

// The program's whole run: `program [processes 1-16] [fraction 0-1] [turns]` with these defaults;
// forks the children running `child`, gives out their turns, waits for them and returns
// test_finish()'s status (2 on bad arguments or a failed fork).
static int take_turns(int argc, char **argv, const char *name, const char *turns_word, int default_processes,
                      double default_fraction, TurnChild child) {
    test_init(name);
    int processes = argc > 1 ? atoi(argv[1]) : default_processes;
    double fraction = argc > 2 ? atof(argv[2]) : default_fraction;
    int turns = argc > 3 ? atoi(argv[3]) : 4;
    if (processes < 1 || processes > 16 || fraction <= 0 || fraction > 1 || turns < 1) {
        printf("usage: %s [processes 1-16] [fraction 0-1] [%s]\n", name, turns_word);
        return 2;
    }
    printf("%d processes, %d turns each\n", processes, turns);
    int turn[16][2], done[16][2];
    pid_t pids[16];
    for (int i = 0; i < processes; i++) {
        if (pipe(turn[i]) != 0 || pipe(done[i]) != 0) return 2;
        fflush(stdout);
        pids[i] = fork();
        if (pids[i] < 0) return 2;
        if (pids[i] == 0) {
            close(turn[i][1]);
            close(done[i][0]);
            // The earlier children's pipe ends the parent keeps: held here, a child's turn pipe
            // would never close for it when the parent gives up.
            for (int j = 0; j < i; j++) {
                close(turn[j][1]);
                close(done[j][0]);
            }
            exit(child(i, turns, fraction, turn[i][0], done[i][1]));
        }
        close(turn[i][0]);
        close(done[i][1]);
        // For gpu-tests/run.sh, which looks for each child's session (the parent opens none).
        fprintf(stderr, "forked pid %d\n", (int)pids[i]);
    }
    // One at a time: allocations first, then the turns, round-robin.
    signal(SIGPIPE, SIG_IGN);
    int lost = -1;
    for (int round = -1; round < turns && lost < 0; round++) {
        for (int i = 0; i < processes && lost < 0; i++) {
            char byte = 't';
            if (write(turn[i][1], &byte, 1) != 1 || !receive(done[i][0])) {
                printf("FAIL: process %d did not finish its turn %d\n", i, round);
                lost = i;
            }
        }
    }
    int failed = lost >= 0 ? 1 : 0;
    if (lost >= 0) {
        // The others wait for turns that will not come: stopped now, not at a timeout.
        for (int i = 0; i < processes; i++)
            if (i != lost) kill(pids[i], SIGKILL);
    }
    for (int i = 0; i < processes; i++) {
        close(turn[i][1]);
        int status = 0;
        // The lost child ends by itself (its pipe closed: it exited) or is stopped after 30 s.
        double deadline = now_ms() + 30000;
        while (waitpid(pids[i], &status, WNOHANG) == 0) {
            if (now_ms() > deadline) {
                kill(pids[i], SIGKILL);
                waitpid(pids[i], &status, 0);
                break;
            }
            usleep(10000);
        }
        if (lost >= 0 && i != lost) continue;  // stopped by the parent
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (WIFSIGNALED(status))
                printf("FAIL: process %d ended by signal %d\n", i, WTERMSIG(status));
            else
                printf("FAIL: process %d ended with status %d\n", i, WEXITSTATUS(status));
            failed++;
        }
    }
    g_failures += failed;
    return test_finish();
}

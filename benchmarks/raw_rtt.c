/* raw_rtt: the floor for a synchronizing call over each of Flyt's transports. Two processes (fork)
 * ping-pong a small message (64 bytes by default) and the client times every round trip:
 *   unix  a Unix stream socket (listen + connect, as Flyt's Unix transport)
 *   tcp   TCP loopback with TCP_NODELAY on both ends
 *   shm   a shared mapping (MAP_SHARED | MAP_ANONYMOUS): the client writes the message into one cache
 *         line and publishes a sequence number, the server spins on it, answers in another cache
 *         line, the client spins on that (what a shared-memory ring costs at the least)
 * Sockets are measured twice: with blocking reads ("blocking": the reader sleeps in the kernel and is
 * woken, as a thread that waits does) and with non-blocking reads in a busy loop ("spin": both ends
 * poll with MSG_DONTWAIT, as a thread that spins does). shm only spins.
 *
 *   raw_rtt [ITERS] [MSG_BYTES] [TRANSPORTS]     default 20000 64 unix,tcp,shm
 * Results: one JSON line per transport and mode on stdout, after WARM (ITERS / 10) untimed round trips:
 *   {"bench":"raw_rtt","transport":"unix","mode":"blocking","msg_bytes":64,"n":20000,"p50_us":..,
 *    "p90_us":..,"p99_us":..,"p999_us":..,"min_us":..,"mean_us":..}
 * Percentiles are interpolated between closest ranks (as numpy does), like the CUDA benchmarks'. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "timing.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

#define MAX_MSG 4096

static void die(const char *what) {
    fprintf(stderr, "raw_rtt: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double pct(const double *s, int n, double p) {
    if (n == 1) return s[0];
    double pos = p / 100.0 * (double)(n - 1);
    int lo = (int)pos;
    int hi = lo + 1 < n ? lo + 1 : n - 1;
    double f = pos - (double)lo;
    return s[lo] * (1.0 - f) + s[hi] * f;
}

static void report(const char *transport, const char *mode, int msg, double *us, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += us[i];
    qsort(us, (size_t)n, sizeof(double), by_value);
    printf("{\"bench\":\"raw_rtt\",\"transport\":\"%s\",\"mode\":\"%s\",\"msg_bytes\":%d,\"n\":%d,"
           "\"p50_us\":%.4g,\"p90_us\":%.4g,\"p99_us\":%.4g,\"p999_us\":%.4g,\"min_us\":%.4g,\"mean_us\":%.4g}\n",
           transport, mode, msg, n, pct(us, n, 50), pct(us, n, 90), pct(us, n, 99), pct(us, n, 99.9), us[0],
           sum / n);
    fflush(stdout);
    fprintf(stderr, "raw_rtt %s %s: p50 %.2f us, p99 %.2f us (%d round trips of %d B)\n", transport, mode,
            pct(us, n, 50), pct(us, n, 99), n, msg);
}

/* Reads exactly n bytes; spin: poll with MSG_DONTWAIT. Returns 0 on EOF before any byte. */
static int read_msg(int fd, char *p, int n, int spin) {
    int got = 0;
    while (got < n) {
        ssize_t r = recv(fd, p + got, (size_t)(n - got), spin ? MSG_DONTWAIT : 0);
        if (r > 0) {
            got += (int)r;
            continue;
        }
        if (r == 0) {
            if (got == 0) return 0;
            errno = EPIPE;
            die("recv");
        }
        if (errno == EINTR) continue;
        if (spin && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            CPU_RELAX();
            continue;
        }
        die("recv");
    }
    return 1;
}

static void write_msg(int fd, const char *p, int n) {
    int put = 0;
    while (put < n) {
        ssize_t w = send(fd, p + put, (size_t)(n - put), MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("send");
        put += (int)w;
    }
}

static void nodelay(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) die("TCP_NODELAY");
}

/* One socket transport, one mode: fork an echo server, time ITERS round trips. */
static void socket_rtt(int is_tcp, int spin, int iters, int warm, int msg) {
    int lfd = socket(is_tcp ? AF_INET : AF_UNIX, SOCK_STREAM, 0);
    if (lfd < 0) die("socket");
    struct sockaddr_in in = {0};
    struct sockaddr_un un = {0};
    char path[64];
    if (is_tcp) {
        int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        in.sin_family = AF_INET;
        in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        in.sin_port = 0;
        if (bind(lfd, (struct sockaddr *)&in, sizeof in)) die("bind");
        socklen_t len = sizeof in;
        if (getsockname(lfd, (struct sockaddr *)&in, &len)) die("getsockname");
    } else {
        snprintf(path, sizeof path, "/tmp/raw_rtt.%d.sock", (int)getpid());
        unlink(path);
        un.sun_family = AF_UNIX;
        snprintf(un.sun_path, sizeof un.sun_path, "%s", path);
        if (bind(lfd, (struct sockaddr *)&un, sizeof un)) die("bind");
    }
    if (listen(lfd, 1)) die("listen");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) die("accept");
        if (is_tcp) nodelay(fd);
        char buf[MAX_MSG];
        while (read_msg(fd, buf, msg, spin)) write_msg(fd, buf, msg);
        _exit(0);
    }
    int fd = socket(is_tcp ? AF_INET : AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (is_tcp) {
        if (connect(fd, (struct sockaddr *)&in, sizeof in)) die("connect");
        nodelay(fd);
    } else if (connect(fd, (struct sockaddr *)&un, sizeof un)) {
        die("connect");
    }
    close(lfd);
    if (!is_tcp) unlink(path);
    char out[MAX_MSG], back[MAX_MSG];
    memset(out, 0x5a, sizeof out);
    double *us = malloc(sizeof(double) * (size_t)iters);
    if (!us) die("malloc");
    for (int i = 0; i < warm + iters; i++) {
        out[0] = (char)i;
        double t0 = now_us();
        write_msg(fd, out, msg);
        if (!read_msg(fd, back, msg, spin)) die("server closed");
        double t1 = now_us();
        if (back[0] != out[0]) {
            errno = EPROTO;
            die("echo mismatch");
        }
        if (i >= warm) us[i - warm] = t1 - t0;
    }
    close(fd);
    waitpid(child, NULL, 0);
    report(is_tcp ? "tcp" : "unix", spin ? "spin" : "blocking", msg, us, iters);
    free(us);
}

/* Two cache lines (128 bytes apart, so the adjacent-line prefetcher does not couple them). */
struct line {
    volatile uint64_t seq;
    char data[120];
} __attribute__((aligned(128)));

struct shared {
    struct line ping;
    char pad[128];
    struct line pong;
};

static void shm_rtt(int iters, int warm, int msg) {
    if (msg > (int)sizeof(((struct line *)0)->data)) msg = (int)sizeof(((struct line *)0)->data);
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) die("mmap");
    memset(sh, 0, sizeof *sh);
    const uint64_t stop = ~0ull;
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        uint64_t last = 0;
        char buf[128];
        for (;;) {
            uint64_t s;
            while ((s = __atomic_load_n(&sh->ping.seq, __ATOMIC_ACQUIRE)) == last) CPU_RELAX();
            if (s == stop) _exit(0);
            memcpy(buf, (const void *)sh->ping.data, (size_t)msg);
            memcpy((void *)sh->pong.data, buf, (size_t)msg);
            __atomic_store_n(&sh->pong.seq, s, __ATOMIC_RELEASE);
            last = s;
        }
    }
    double *us = malloc(sizeof(double) * (size_t)iters);
    if (!us) die("malloc");
    char out[128], back[128];
    memset(out, 0x5a, sizeof out);
    for (int i = 0; i < warm + iters; i++) {
        uint64_t s = (uint64_t)i + 1;
        out[0] = (char)i;
        double t0 = now_us();
        memcpy((void *)sh->ping.data, out, (size_t)msg);
        __atomic_store_n(&sh->ping.seq, s, __ATOMIC_RELEASE);
        while (__atomic_load_n(&sh->pong.seq, __ATOMIC_ACQUIRE) != s) CPU_RELAX();
        memcpy(back, (const void *)sh->pong.data, (size_t)msg);
        double t1 = now_us();
        if (back[0] != out[0]) {
            errno = EPROTO;
            die("shm echo mismatch");
        }
        if (i >= warm) us[i - warm] = t1 - t0;
    }
    __atomic_store_n(&sh->ping.seq, stop, __ATOMIC_RELEASE);
    waitpid(child, NULL, 0);
    report("shm", "spin", msg, us, iters);
    free(us);
    munmap(sh, sizeof *sh);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20000;
    int msg = argc > 2 ? atoi(argv[2]) : 64;
    const char *which = argc > 3 ? argv[3] : "unix,tcp,shm";
    if (iters < 1 || msg < 1 || msg > MAX_MSG) {
        fprintf(stderr, "usage: raw_rtt [ITERS] [MSG_BYTES (1..%d)] [unix,tcp,shm]\n", MAX_MSG);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int warm = iters / 10 + 100;
    if (strstr(which, "unix")) {
        socket_rtt(0, 0, iters, warm, msg);
        socket_rtt(0, 1, iters, warm, msg);
    }
    if (strstr(which, "tcp")) {
        socket_rtt(1, 0, iters, warm, msg);
        socket_rtt(1, 1, iters, warm, msg);
    }
    if (strstr(which, "shm")) shm_rtt(iters, warm, msg);
    return 0;
}

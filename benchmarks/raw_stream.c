/* raw_stream: the floor for Flyt's socket transports. Streams BYTES over a TCP loopback or Unix stream
 * socket in 1 MiB writes and reports GB/s (1e9 B/s), median of RUNS timed runs after one warm-up run.
 *   c2s  client -> server, timed at the client from the first write until the server's 1-byte ack
 *        (the shape of a synchronous H2D cudaMemcpy)
 *   s2c  the client asks for BYTES and reads them (the shape of a synchronous D2H cudaMemcpy)
 * The client side (the app) sends from / receives into a buffer of the full size, touched beforehand; the
 * server side reuses one 1 MiB buffer (RAW_STREAM_SERVER_BUFFER: a larger one). TCP_NODELAY is set.
 *
 *   raw_stream server tcp HOST:PORT | unix PATH      listen; prints "raw_stream listening on ..." and serves
 *   raw_stream client tcp HOST:PORT | unix PATH BYTES[,BYTES...] RUNS [CONNS]
 *   raw_stream pair tcp|unix BYTES[,BYTES...] RUNS [CONNS]   both in one command (forks the server)
 * With CONNS > 1 (default 1, at most 64) each transfer is split in CONNS equal parts moved at once over
 * CONNS connections, one thread each on both sides: the ceiling for copies striped over as many
 * connections (Flyt's FLYT_STRIPES). The server serves each connection on a thread of its own.
 * BYTES accepts K/M/G suffixes (powers of 1024). Results: one JSON object per line on stdout.
 * RAW_STREAM_DEVICE=1 (server side): the server's buffer is pinned and every chunk it reads goes on to GPU 0
 * (cuMemcpyHtoDAsync), every chunk it writes comes from there first (cuMemcpyDtoHAsync, queued a buffer ahead):
 * what a server that lands the bytes on a device, as Flyt's does, could reach. The driver is loaded at run time.
 * Each result's "device" says so: 1 or 0 for `pair` (the server is its child), -1 (unknown) for `client`. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "timing.h"

#define CHUNK (1u << 20)

struct req {
    uint32_t op; /* 0 bye, 1 c2s, 2 s2c */
    uint32_t pad;
    uint64_t bytes;
};

static void die(const char *what) {
    fprintf(stderr, "raw_stream: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("write");
        c += w;
        n -= (size_t)w;
    }
}

/* Returns 0 on a clean EOF before any byte, 1 when n bytes were read. */
static int read_all(int fd, void *p, size_t n) {
    char *c = p;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, c + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0 && got == 0) return 0;
        if (r <= 0) die("read");
        got += (size_t)r;
    }
    return 1;
}

static void nodelay(int fd, int is_tcp) {
    int one = 1;
    if (is_tcp && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) die("TCP_NODELAY");
}

/* "HOST:PORT" (HOST an IPv4 address) as a socket address; HOST into host (host_len bytes). */
static struct sockaddr_in ipv4_address(const char *addr, char *host, size_t host_len) {
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= host_len) {
        fprintf(stderr, "raw_stream: bad address %s\n", addr);
        exit(2);
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) die("inet_pton");
    return sa;
}

/* addr: "HOST:PORT" for tcp, a path for unix. */
static int listen_on(int is_tcp, const char *addr, char *bound, size_t bound_len) {
    int fd = socket(is_tcp ? AF_INET : AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (is_tcp) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        char host[64];
        struct sockaddr_in sa = ipv4_address(addr, host, sizeof host);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa)) die("bind");
        socklen_t l = sizeof sa;
        getsockname(fd, (struct sockaddr *)&sa, &l);
        snprintf(bound, bound_len, "%s:%d", host, ntohs(sa.sin_port));
    } else {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(addr) >= sizeof sa.sun_path) {
            fprintf(stderr, "raw_stream: path too long\n");
            exit(2);
        }
        strcpy(sa.sun_path, addr);
        unlink(addr);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa)) die("bind");
        snprintf(bound, bound_len, "%s", addr);
    }
    if (listen(fd, 64)) die("listen");
    return fd;
}

static int connect_to(int is_tcp, const char *addr) {
    int fd = socket(is_tcp ? AF_INET : AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (is_tcp) {
        char host[64];
        struct sockaddr_in sa = ipv4_address(addr, host, sizeof host);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) die("connect");
    } else {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", addr);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) die("connect");
    }
    nodelay(fd, is_tcp);
    return fd;
}

/* The driver calls RAW_STREAM_DEVICE needs, loaded at run time (raw_stream builds without CUDA). */
static struct {
    int (*init)(unsigned);
    int (*device_get)(int *, int);
    int (*primary_retain)(void **, int);
    int (*set_current)(void *);
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*host_register)(void *, size_t, unsigned);
    int (*stream_create)(void **, unsigned);
    int (*event_create)(void **, unsigned);
    int (*event_record)(void *, void *);
    int (*event_synchronize)(void *);
    int (*stream_synchronize)(void *);
    int (*htod)(unsigned long long, const void *, size_t, void *);
    int (*dtoh)(void *, unsigned long long, size_t, void *);
    void *context;
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_check(int result, const char *what) {
    if (result) {
        fprintf(stderr, "raw_stream: %s: CUDA error %d\n", what, result);
        exit(1);
    }
}

static void cu_load(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "raw_stream: RAW_STREAM_DEVICE: %s\n", dlerror());
        exit(1);
    }
#define CU_SYM(field, name) \
    if (!(*(void **)&cu.field = dlsym(lib, name))) { fprintf(stderr, "raw_stream: no %s\n", name); exit(1); }
    CU_SYM(init, "cuInit")
    CU_SYM(device_get, "cuDeviceGet")
    CU_SYM(primary_retain, "cuDevicePrimaryCtxRetain")
    CU_SYM(set_current, "cuCtxSetCurrent")
    CU_SYM(mem_alloc, "cuMemAlloc_v2")
    CU_SYM(host_register, "cuMemHostRegister_v2")
    CU_SYM(stream_create, "cuStreamCreate")
    CU_SYM(event_create, "cuEventCreate")
    CU_SYM(event_record, "cuEventRecord")
    CU_SYM(event_synchronize, "cuEventSynchronize")
    CU_SYM(stream_synchronize, "cuStreamSynchronize")
    CU_SYM(htod, "cuMemcpyHtoDAsync_v2")
    CU_SYM(dtoh, "cuMemcpyDtoHAsync_v2")
#undef CU_SYM
    int device;
    cu_check(cu.init(0), "cuInit");
    cu_check(cu.device_get(&device, 0), "cuDeviceGet");
    cu_check(cu.primary_retain(&cu.context, device), "cuDevicePrimaryCtxRetain");
}

/* A connection's way to GPU 0: its buffer pinned, as much device memory, a stream, an event per chunk. */
struct device_side {
    unsigned long long dptr;
    void *stream;
    void **events;
};

static int device_side_open(struct device_side *d, char *buf, size_t len) {
    const char *wanted = getenv("RAW_STREAM_DEVICE");
    if (!wanted || strcmp(wanted, "1")) return 0;
    pthread_once(&cu_once, cu_load);
    cu_check(cu.set_current(cu.context), "cuCtxSetCurrent");
    cu_check(cu.host_register(buf, len, 0), "cuMemHostRegister");
    cu_check(cu.mem_alloc(&d->dptr, len), "cuMemAlloc");
    cu_check(cu.stream_create(&d->stream, 1), "cuStreamCreate");
    d->events = calloc(len / CHUNK, sizeof *d->events);
    if (!d->events) die("calloc");
    for (size_t i = 0; i < len / CHUNK; i++) cu_check(cu.event_create(&d->events[i], 2), "cuEventCreate");
    return 1;
}

struct served {
    int fd;
    int is_tcp;
};

/* The server side's buffer per connection: one 1 MiB chunk by default (it stays in the CPU's
 * cache); RAW_STREAM_SERVER_BUFFER=BYTES (a multiple of 1 MiB) makes it that large, walked chunk by
 * chunk, as a server landing bytes in staging memory for a device walks its slots. */
static size_t server_buffer_len(void) {
    const char *text = getenv("RAW_STREAM_SERVER_BUFFER");
    size_t len = text ? strtoull(text, NULL, 10) / CHUNK * CHUNK : 0;
    return len > CHUNK ? len : CHUNK;
}

static void *serve_connection(void *arg) {
    struct served *c = arg;
    int fd = c->fd;
    size_t len = server_buffer_len(), at = 0;
    char *buf = malloc(len);
    if (!buf) die("malloc");
    memset(buf, 0x5a, len);
    struct device_side dev;
    int device = device_side_open(&dev, buf, len);
    nodelay(fd, c->is_tcp);
    struct req q;
    while (read_all(fd, &q, sizeof q) && q.op != 0) {
        uint64_t left = q.bytes;
        if (q.op == 1) {
            size_t filled = 0;
            while (left) {
                /* A chunk's bytes wait for its last device copy to have read them. */
                if (device && filled == 0) cu_check(cu.event_synchronize(dev.events[at / CHUNK]), "cuEventSynchronize");
                size_t n = CHUNK - filled;
                if (n > left) n = (size_t)left;
                ssize_t r = read(fd, buf + at + filled, n);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) die("read");
                left -= (uint64_t)r;
                filled += (size_t)r;
                if (filled == CHUNK || left == 0) {
                    if (device) {
                        cu_check(cu.htod(dev.dptr + at, buf + at, filled, dev.stream), "cuMemcpyHtoDAsync");
                        cu_check(cu.event_record(dev.events[at / CHUNK], dev.stream), "cuEventRecord");
                    }
                    filled = 0, at = (at + CHUNK) % len;
                }
            }
            if (device) cu_check(cu.stream_synchronize(dev.stream), "cuStreamSynchronize");
            char ack = 1;
            write_all(fd, &ack, 1);
        } else {
            /* With a device: its copies queued up to a buffer ahead of the writes. */
            uint64_t queued = 0, total = left;
            size_t queue_at = at;
            while (left) {
                while (device && queued < total && queued - (total - left) < len) {
                    size_t n = total - queued < CHUNK ? (size_t)(total - queued) : CHUNK;
                    cu_check(cu.dtoh(buf + queue_at, dev.dptr + queue_at, n, dev.stream), "cuMemcpyDtoHAsync");
                    cu_check(cu.event_record(dev.events[queue_at / CHUNK], dev.stream), "cuEventRecord");
                    queue_at = (queue_at + CHUNK) % len;
                    queued += n;
                }
                size_t n = left < CHUNK ? (size_t)left : CHUNK;
                if (device) cu_check(cu.event_synchronize(dev.events[at / CHUNK]), "cuEventSynchronize");
                write_all(fd, buf + at, n);
                at = (at + CHUNK) % len;
                left -= n;
            }
        }
    }
    close(fd);
    free(buf);
    free(c);
    return NULL;
}

/* Serves each connection on a thread; with `once`, exactly `conns` connections, then returns. */
static void serve(int lfd, int is_tcp, int once, int conns) {
    pthread_t threads[64];
    int accepted = 0;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR) continue;
            die("accept");
        }
        struct served *c = malloc(sizeof *c);
        if (!c) die("malloc");
        c->fd = fd;
        c->is_tcp = is_tcp;
        pthread_t thread;
        if (pthread_create(&thread, NULL, serve_connection, c)) die("pthread_create");
        if (!once) {
            pthread_detach(thread);
            continue;
        }
        threads[accepted++] = thread;
        if (accepted == conns) break;
    }
    for (int i = 0; i < accepted; i++) pthread_join(threads[i], NULL);
}

static double run_once(int fd, int op, char *buf, uint64_t bytes) {
    struct req q = {.op = (uint32_t)op, .bytes = bytes};
    double t0 = now();
    write_all(fd, &q, sizeof q);
    if (op == 1) {
        for (uint64_t off = 0; off < bytes; off += CHUNK) {
            uint64_t n = bytes - off < CHUNK ? bytes - off : CHUNK;
            write_all(fd, buf + off, (size_t)n);
        }
        char ack;
        if (!read_all(fd, &ack, 1)) die("ack");
    } else {
        uint64_t off = 0;
        while (off < bytes) {
            uint64_t n = bytes - off < CHUNK ? bytes - off : CHUNK;
            ssize_t r = read(fd, buf + off, (size_t)n);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) die("read");
            off += (uint64_t)r;
        }
    }
    return now() - t0;
}

struct part {
    int fd, op;
    char *buf;
    uint64_t bytes;
};

static void *run_part(void *arg) {
    struct part *p = arg;
    run_once(p->fd, p->op, p->buf, p->bytes);
    return NULL;
}

/* One transfer of `bytes` split over `conns` connections at once; the time until all parts are done. */
static double run_split(int *fds, int conns, int op, char *buf, uint64_t bytes) {
    if (conns == 1) return run_once(fds[0], op, buf, bytes);
    pthread_t threads[64];
    struct part parts[64];
    uint64_t each = bytes / (uint64_t)conns;
    double t0 = now();
    for (int i = 0; i < conns; i++) {
        parts[i] = (struct part){fds[i], op, buf + (uint64_t)i * each, i == conns - 1 ? bytes - (uint64_t)i * each : each};
        if (pthread_create(&threads[i], NULL, run_part, &parts[i])) die("pthread_create");
    }
    for (int i = 0; i < conns; i++) pthread_join(threads[i], NULL);
    return now() - t0;
}

static uint64_t parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
        case 'k':
        case 'K':
            v *= 1024;
            break;
        case 'm':
        case 'M':
            v *= 1048576;
            break;
        case 'g':
        case 'G':
            v *= 1073741824.0;
            break;
        default:
            break;
    }
    return (uint64_t)v;
}

/* forked_server: the server is this process's child (`pair`), so its RAW_STREAM_DEVICE is ours. */
static void client(int is_tcp, const char *addr, const char *sizes, int runs, int conns, int forked_server) {
    uint64_t list[32];
    int nsizes = 0;
    uint64_t max = 0;
    char *copy = strdup(sizes), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && nsizes < 32; t = strtok_r(NULL, ",", &save)) {
        list[nsizes] = parse_bytes(t);
        if (list[nsizes] > max) max = list[nsizes];
        nsizes++;
    }
    free(copy);
    if (runs < 1) runs = 1;
    if (runs > 64) runs = 64;
    char *buf = malloc(max ? (size_t)max : 1);
    if (!buf) die("malloc");
    memset(buf, 0x33, (size_t)max);
    int fds[64];
    for (int i = 0; i < conns; i++) fds[i] = connect_to(is_tcp, addr);
    /* The server's setting: known for `pair`, -1 (unknown) for a server started apart. */
    const char *device_env = getenv("RAW_STREAM_DEVICE");
    int device = forked_server ? device_env && !strcmp(device_env, "1") : -1;
    for (int s = 0; s < nsizes; s++) {
        for (int op = 1; op <= 2; op++) {
            double t[64];
            run_split(fds, conns, op, buf, list[s]); /* warm-up */
            for (int r = 0; r < runs; r++) t[r] = run_split(fds, conns, op, buf, list[s]);
            qsort(t, (size_t)runs, sizeof t[0], by_value);
            double med = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
            printf(
                "{\"bench\":\"raw_stream\",\"socket\":\"%s\",\"dir\":\"%s\",\"bytes\":%llu,\"runs\":%d,"
                "\"chunk\":%u,\"conns\":%d,\"device\":%d,\"gbps\":%.4f,\"best_gbps\":%.4f,\"worst_gbps\":%.4f}\n",
                is_tcp ? "tcp" : "unix", op == 1 ? "c2s" : "s2c", (unsigned long long)list[s], runs, CHUNK, conns, device,
                (double)list[s] / med / 1e9, (double)list[s] / t[0] / 1e9, (double)list[s] / t[runs - 1] / 1e9);
            fflush(stdout);
            fprintf(stderr, "raw %s %s %llu bytes over %d connection(s): %.2f GB/s (median of %d)\n", is_tcp ? "tcp" : "unix",
                    op == 1 ? "client->server" : "server->client", (unsigned long long)list[s], conns,
                    (double)list[s] / med / 1e9, runs);
        }
    }
    struct req bye = {0};
    for (int i = 0; i < conns; i++) {
        write_all(fds[i], &bye, sizeof bye);
        close(fds[i]);
    }
    free(buf);
}

static int is_tcp_arg(const char *s) {
    if (!strcmp(s, "tcp")) return 1;
    if (!strcmp(s, "unix")) return 0;
    fprintf(stderr, "raw_stream: transport must be tcp or unix, not %s\n", s);
    exit(2);
}

static int conns_arg(const char *s) {
    int conns = atoi(s);
    if (conns < 1 || conns > 64) {
        fprintf(stderr, "raw_stream: CONNS must be 1 to 64, not %s\n", s);
        exit(2);
    }
    return conns;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    char bound[256];
    if (argc == 4 && !strcmp(argv[1], "server")) {
        int tcp = is_tcp_arg(argv[2]);
        int lfd = listen_on(tcp, argv[3], bound, sizeof bound);
        printf("raw_stream listening on %s:%s\n", tcp ? "tcp" : "unix", bound);
        fflush(stdout);
        serve(lfd, tcp, 0, 0);
        return 0;
    }
    if ((argc == 6 || argc == 7) && !strcmp(argv[1], "client")) {
        client(is_tcp_arg(argv[2]), argv[3], argv[4], atoi(argv[5]), conns_arg(argc == 7 ? argv[6] : "1"), 0);
        return 0;
    }
    if ((argc == 5 || argc == 6) && !strcmp(argv[1], "pair")) {
        int conns = conns_arg(argc == 6 ? argv[5] : "1");
        int tcp = is_tcp_arg(argv[2]);
        char dir[] = "/tmp/raw_stream.XXXXXX", path[128];
        if (!tcp) {
            if (!mkdtemp(dir)) die("mkdtemp");
            snprintf(path, sizeof path, "%s/sock", dir);
        }
        int lfd = listen_on(tcp, tcp ? "127.0.0.1:0" : path, bound, sizeof bound);
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            serve(lfd, tcp, 1, conns);
            _exit(0);
        }
        close(lfd);
        client(tcp, bound, argv[3], atoi(argv[4]), conns, 1);
        int st = 0;
        waitpid(pid, &st, 0);
        if (!tcp) {
            unlink(path);
            rmdir(dir);
        }
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    fprintf(stderr,
            "usage: raw_stream server tcp HOST:PORT | server unix PATH\n"
            "       raw_stream client tcp HOST:PORT|unix PATH BYTES[,BYTES...] RUNS [CONNS]\n"
            "       raw_stream pair tcp|unix BYTES[,BYTES...] RUNS [CONNS]\n");
    return 2;
}

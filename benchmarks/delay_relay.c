/* delay_relay: a TCP relay that delays every byte by a fixed time in each direction, for measuring
 * Flyt at a network's round trip where the kernel has no netem (benchmarks/remote.sh uses it then).
 *
 *   delay_relay LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_US [RATE_BYTES_PER_S]
 *
 * Each accepted connection gets a connection to TARGET; per direction a reader thread reads what
 * arrives (up to 1 MiB at a time), stamps it due DELAY_US later and queues it; a writer thread
 * writes each chunk when it is due (sleeping until shortly before, then spinning), so the delay
 * holds for small messages and bulk streams alike while throughput is kept (chunks in flight are
 * bounded by the queue: 256 chunks). TCP_NODELAY on every socket. Prints "delay_relay listening on
 * HOST:PORT" when ready. Runs until killed.
 * With RATE (bytes per second, e.g. 1e9), each direction is also a link of that rate shared by all
 * connections, as a shaped network is: a chunk leaves once the link has carried the chunks before
 * it and its own bytes (len / RATE later), so no direction passes more than RATE. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)
#define SLOTS 256

static long long delay_ns;
static double rate; /* bytes per second per direction, 0: unlimited */
static long long link_free_ns[2]; /* per direction: when the link has carried what it was given */
static pthread_mutex_t link_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sockaddr_in target;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

struct chunk {
    long long due;
    size_t len;
    char *bytes;
};

struct pipe_dir {
    int from, to;
    int direction; /* 0: app to target, 1: back */
    struct chunk slots[SLOTS];
    size_t head, tail; /* head: next to write out; tail: next to fill */
    int closed;
    pthread_mutex_t lock;
    pthread_cond_t changed;
};

static void *reader(void *arg) {
    struct pipe_dir *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (p->tail - p->head == SLOTS) pthread_cond_wait(&p->changed, &p->lock);
        struct chunk *c = &p->slots[p->tail % SLOTS];
        pthread_mutex_unlock(&p->lock);
        if (!c->bytes) c->bytes = malloc(CHUNK);
        ssize_t n = c->bytes ? read(p->from, c->bytes, CHUNK) : -1;
        pthread_mutex_lock(&p->lock);
        if (n <= 0) {
            p->closed = 1;
        } else {
            c->len = (size_t)n;
            c->due = now_ns() + delay_ns;
            p->tail++;
        }
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
        if (n <= 0) return NULL;
    }
}

static void sleep_until(long long due) {
    long long wait = due - now_ns();
    if (wait > 60000) {
        struct timespec t = {(wait - 50000) / 1000000000LL, (wait - 50000) % 1000000000LL};
        nanosleep(&t, NULL);
    }
    while (now_ns() < due) {
    }
}

/* With a rate: waits until the direction's link has carried `len` more bytes after what it
 * carries already. */
static void through_link(int direction, size_t len) {
    if (rate <= 0) return;
    pthread_mutex_lock(&link_lock);
    long long start = link_free_ns[direction] > now_ns() ? link_free_ns[direction] : now_ns();
    long long done = start + (long long)(len / rate * 1e9);
    link_free_ns[direction] = done;
    pthread_mutex_unlock(&link_lock);
    sleep_until(done);
}

static void *writer(void *arg) {
    struct pipe_dir *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (p->head == p->tail && !p->closed) pthread_cond_wait(&p->changed, &p->lock);
        if (p->head == p->tail) {
            pthread_mutex_unlock(&p->lock);
            shutdown(p->to, SHUT_WR);
            return NULL;
        }
        struct chunk *c = &p->slots[p->head % SLOTS];
        pthread_mutex_unlock(&p->lock);
        sleep_until(c->due);
        through_link(p->direction, c->len);
        size_t off = 0;
        while (off < c->len) {
            ssize_t n = write(p->to, c->bytes + off, c->len - off);
            if (n <= 0) {
                shutdown(p->from, SHUT_RD);
                return NULL;
            }
            off += (size_t)n;
        }
        pthread_mutex_lock(&p->lock);
        p->head++;
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
    }
}

static int parse(const char *text, struct sockaddr_in *addr) {
    char host[256];
    const char *colon = strrchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof host) return -1;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = 0;
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_port = htons((uint16_t)atoi(colon + 1));
    return inet_pton(AF_INET, host, &addr->sin_addr) == 1 ? 0 : -1;
}

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void *serve(void *arg) {
    int app = (int)(intptr_t)arg;
    int server = socket(AF_INET, SOCK_STREAM, 0);
    if (server < 0 || connect(server, (struct sockaddr *)&target, sizeof target) != 0) {
        perror("delay_relay: connect to target");
        close(app);
        if (server >= 0) close(server);
        return NULL;
    }
    nodelay(app);
    nodelay(server);
    struct pipe_dir *dirs = calloc(2, sizeof *dirs);
    dirs[0].from = app, dirs[0].to = server, dirs[0].direction = 0;
    dirs[1].from = server, dirs[1].to = app, dirs[1].direction = 1;
    pthread_t threads[4];
    for (int d = 0; d < 2; d++) {
        pthread_mutex_init(&dirs[d].lock, NULL);
        pthread_cond_init(&dirs[d].changed, NULL);
        pthread_create(&threads[2 * d], NULL, reader, &dirs[d]);
        pthread_create(&threads[2 * d + 1], NULL, writer, &dirs[d]);
    }
    for (int t = 0; t < 4; t++) pthread_join(threads[t], NULL);
    close(app);
    close(server);
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < SLOTS; s++) free(dirs[d].slots[s].bytes);
    free(dirs);
    return NULL;
}

int main(int argc, char **argv) {
    struct sockaddr_in listen_addr;
    if (argc < 4 || argc > 5 || parse(argv[1], &listen_addr) || parse(argv[2], &target)) {
        fprintf(stderr, "usage: delay_relay LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_US [RATE_BYTES_PER_S]\n");
        return 2;
    }
    delay_ns = (long long)(atof(argv[3]) * 1000);
    rate = argc == 5 ? atof(argv[4]) : 0;
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener, (struct sockaddr *)&listen_addr, sizeof listen_addr) != 0 || listen(listener, 64) != 0) {
        perror("delay_relay: listen");
        return 1;
    }
    printf("delay_relay listening on %s\n", argv[1]);
    fflush(stdout);
    for (;;) {
        int app = accept(listener, NULL, NULL);
        if (app < 0) continue;
        pthread_t thread;
        pthread_create(&thread, NULL, serve, (void *)(intptr_t)app);
        pthread_detach(thread);
    }
}

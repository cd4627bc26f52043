// A parent and its forked child talking over a Unix stream socket: a file descriptor sent with a
// message (SCM_RIGHTS), and one-byte signals. A short read or write ends the program (exit 2).
// C and C++: the gpu-tests programs and the driver-API test programs of cuda-shim/cdylib/tests/c
// include it.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

// A message of one buffer with room `space` for one descriptor.
static inline struct msghdr message_of(struct iovec *iov, char *space, size_t space_len) {
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    memset(space, 0, space_len);
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space;
    msg.msg_controllen = space_len;
    return msg;
}

// Sends `fd` with the `len` bytes at `data`.
static inline void send_with_fd(int sock, int fd, const void *data, size_t len) {
    struct iovec iov = {(void *)data, len};
    char space[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = message_of(&iov, space, sizeof space);
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
    if (sendmsg(sock, &msg, 0) != (ssize_t)len) {
        perror("sendmsg");
        exit(2);
    }
}

// Receives the `len` bytes of a message into `data`; the descriptor that came with it, or -1.
static inline int receive_with_fd(int sock, void *data, size_t len) {
    struct iovec iov = {data, len};
    char space[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = message_of(&iov, space, sizeof space);
    if (recvmsg(sock, &msg, MSG_WAITALL) != (ssize_t)len) {
        perror("recvmsg");
        exit(2);
    }
    int fd = -1;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    if (cmsg && cmsg->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(cmsg), sizeof fd);
    return fd;
}

// A descriptor alone (with one byte, as a message must carry one).
static inline void send_fd(int sock, int fd) {
    char byte = 'f';
    send_with_fd(sock, fd, &byte, 1);
}

static inline int receive_fd(int sock) {
    char byte;
    return receive_with_fd(sock, &byte, 1);
}

static inline void signal_peer(int sock, char what) {
    if (write(sock, &what, 1) != 1) exit(2);
}

static inline char wait_peer(int sock) {
    char what = 0;
    if (read(sock, &what, 1) != 1) exit(2);
    return what;
}

// Forks (before any CUDA call, so that each process makes its own context) and runs `parent` and
// `child` on the two ends of a Unix stream socket; the parent's code, the child's wait status in
// *child_status. Where `child_server_from` names a variable that is set, the child's FLYT_SERVER
// is its value (another server: another tenant of the same GPU).
static inline int run_parent_and_child(int (*parent)(int), int (*child)(int), const char *child_server_from,
                                       int *child_status) {
    int socks[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, socks) != 0) exit(2);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) exit(2);
    if (pid == 0) {
        close(socks[0]);
        const char *other = child_server_from ? getenv(child_server_from) : NULL;
        if (other) setenv("FLYT_SERVER", other, 1);
        int code = child(socks[1]);
        fflush(stdout);
        _exit(code);
    }
    close(socks[1]);
    int code = parent(socks[0]);
    *child_status = 0;
    waitpid(pid, child_status, 0);
    return code;
}

/* The receive floor of a loader that lands bytes in its own memory: one
 * thread, one keep-alive HTTP/1.1 connection, each object fetched with a
 * plain GET, its head read with small recv()s and its body received with
 * recv(MSG_WAITALL) of RECV bytes at a time into a rotating REGION of
 * anonymous memory (faulted in by the first pass over it, as an arena is).
 * Nothing is parsed or checked beyond Content-Length: this is what the
 * kernel's copy to user space costs, the bar ringfeed is held to.
 *
 * Build: cc -O2 -o recv_floor benches/recv_floor.c
 * Usage: recv_floor HOST PORT REGION_MiB RECV_MiB PATH...
 * Prints one JSON object: bytes (body bytes received), seconds (from before
 * connect to the last byte), cpu_seconds (user + system of this process).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "recv_floor: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: recv_floor HOST PORT REGION_MiB RECV_MiB PATH...\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]);
    size_t region_len = (size_t)atol(argv[3]) << 20;
    size_t recv_len = (size_t)atol(argv[4]) << 20;
    if (region_len == 0 || recv_len == 0 || recv_len > region_len) {
        fprintf(stderr, "recv_floor: bad REGION_MiB or RECV_MiB\n");
        return 2;
    }
    char *region = mmap(NULL, region_len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        die("mmap");
    double t0 = now();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        die("socket");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "recv_floor: HOST must be an IPv4 address\n");
        return 2;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    size_t pos = 0;
    unsigned long long total = 0;
    char head[8192];
    char req[2048];
    for (int i = 5; i < argc; i++) {
        int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s:%d\r\n\r\n",
                         argv[i], host, port);
        if (n <= 0 || (size_t)n >= sizeof req) {
            fprintf(stderr, "recv_floor: path too long\n");
            return 2;
        }
        if (send(fd, req, n, MSG_NOSIGNAL) != n)
            die("send");
        size_t got = 0;
        char *end = NULL;
        while (!end) {
            ssize_t r = recv(fd, head + got, sizeof head - 1 - got, 0);
            if (r <= 0)
                die("recv head");
            got += r;
            head[got] = 0;
            end = strstr(head, "\r\n\r\n");
            if (!end && got == sizeof head - 1) {
                fprintf(stderr, "recv_floor: response head too long\n");
                return 1;
            }
        }
        if (strncmp(head, "HTTP/1.1 200", 12) != 0) {
            fprintf(stderr, "recv_floor: %s: %.40s\n", argv[i], head);
            return 1;
        }
        char *cl = strcasestr(head, "\r\ncontent-length:");
        if (!cl || cl > end) {
            fprintf(stderr, "recv_floor: no Content-Length\n");
            return 1;
        }
        unsigned long long left = strtoull(cl + 17, NULL, 10);
        size_t body = got - (size_t)(end + 4 - head);
        if (body > left) {
            fprintf(stderr, "recv_floor: more bytes than Content-Length\n");
            return 1;
        }
        if (pos + body > region_len)
            pos = 0;
        memcpy(region + pos, end + 4, body);
        pos += body;
        left -= body;
        total += body;
        while (left > 0) {
            size_t want = left < recv_len ? left : recv_len;
            if (pos + want > region_len)
                pos = 0;
            ssize_t r = recv(fd, region + pos, want, MSG_WAITALL);
            if (r <= 0)
                die("recv body");
            pos += r;
            left -= r;
            total += r;
        }
    }
    double secs = now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
                 ru.ru_stime.tv_usec / 1e6;
    printf("{\"bytes\": %llu, \"seconds\": %.6f, \"gb_per_s\": %.4f, \"cpu_seconds\": %.4f, "
           "\"cpu_s_per_gb\": %.4f}\n",
           total, secs, total / secs / 1e9, cpu, cpu / (total / 1e9));
    close(fd);
    return 0;
}

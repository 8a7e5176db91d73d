/* StatsD UDP load generator for bench/ingest.py (compiled at bench time with gcc -O2).
 *
 *   sender HOST PORT RATE LINES_PER_DATAGRAM SECONDS SERIES [SOCKETS [TYPES]]
 *
 * Sends RATE lines/s (0 = as fast as possible) for SECONDS over loopback, SERIES distinct
 * series, the same lines as bench/ingest.py's Python generator:
 *   bench.m<i%100>:<i%97>|<c|ms|g|d>|#host:h<i/100>
 * TYPES (default "c,ms,g,d"; bench/soak.py passes its own) is the comma-separated cycle of
 * metric types: series i gets TYPES[i % len(TYPES)].
 * Datagrams are sent in batches with sendmmsg(2), paced against CLOCK_MONOTONIC. SOCKETS
 * (default 1) source sockets take the batches in turn: SO_REUSEPORT spreads senders over the
 * receivers by source address, so one socket would reach one receiver only.
 * Prints "<lines sent> <datagrams sent> <seconds>" on stdout.
 *
 * SENDER_GSO=1 in the environment: UDP generic segmentation offload (UDP_SEGMENT). Datagrams
 * of equal length go out as one buffer that the kernel cuts into separate datagrams (up to
 * GSO_SEGMENTS per buffer); the receiving socket still gets, and may drop, each datagram on
 * its own (it does not ask for UDP_GRO), so what the daemon under test sees is unchanged:
 * the same lines, one per datagram, sent in runs of equal length instead of series order.
 * On loopback the sender's syscall and the kernel's whole send and receive path run once
 * per buffer instead of once per datagram: on 2 shared cores the sender itself, not the
 * daemon, was the limit at 1 line per datagram (~500 k datagrams/s).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#define GSO_SEGMENTS 64 /* datagrams per GSO buffer (the kernel allows up to 64 or 128) */
#define GSO_BYTES 65000 /* a GSO buffer is one UDP payload: under 65,507 bytes */
#define GSO_BUFFERS 8   /* GSO buffers per sendmmsg */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int by_length(const void *a, const void *b, void *lens) {
    size_t la = ((size_t *)lens)[*(const int *)a], lb = ((size_t *)lens)[*(const int *)b];
    if (la != lb) return la < lb ? -1 : 1;
    return *(const int *)a - *(const int *)b; /* stable: series order within a length */
}

/* The SENDER_GSO=1 loop: the datagrams ordered by length, each send a run of equal ones. */
static int send_gso(int *fds, int nsock, char **dgrams, size_t *lens, int ndgrams, double rate,
                    int per, double seconds) {
    int *order = malloc(sizeof(int) * ndgrams);
    for (int d = 0; d < ndgrams; d++) order[d] = d;
    qsort_r(order, ndgrams, sizeof(int), by_length, lens);
    static char bufs[GSO_BUFFERS][GSO_BYTES];
    static char ctrl[GSO_BUFFERS][CMSG_SPACE(sizeof(uint16_t))];
    struct mmsghdr msgs[GSO_BUFFERS];
    struct iovec iovs[GSO_BUFFERS];
    int counts[GSO_BUFFERS];
    long long sent_dgrams = 0, batches = 0;
    int pos = 0;
    double start = now(), elapsed = 0;
    double dgram_rate = rate / per;
    while ((elapsed = now() - start) < seconds) {
        long long due = rate > 0 ? (long long)(elapsed * dgram_rate) + 1
                                 : sent_dgrams + GSO_BUFFERS * GSO_SEGMENTS;
        if (due <= sent_dgrams) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            continue;
        }
        long long want = due - sent_dgrams;
        int nmsg = 0;
        memset(msgs, 0, sizeof msgs);
        while (want > 0 && nmsg < GSO_BUFFERS) {
            size_t len = lens[order[pos]];
            int most = len ? (int)(GSO_BYTES / len) : GSO_SEGMENTS; /* whole datagrams only */
            if (most > GSO_SEGMENTS) most = GSO_SEGMENTS;
            int k = 0;
            while (k < most && k < want && lens[order[pos]] == len) {
                memcpy(bufs[nmsg] + (size_t)k * len, dgrams[order[pos]], len);
                k++;
                pos = (pos + 1) % ndgrams;
            }
            iovs[nmsg].iov_base = bufs[nmsg];
            iovs[nmsg].iov_len = (size_t)k * len;
            msgs[nmsg].msg_hdr.msg_iov = &iovs[nmsg];
            msgs[nmsg].msg_hdr.msg_iovlen = 1;
            if (k > 1) {
                msgs[nmsg].msg_hdr.msg_control = ctrl[nmsg];
                msgs[nmsg].msg_hdr.msg_controllen = sizeof ctrl[nmsg];
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msgs[nmsg].msg_hdr);
                cm->cmsg_level = SOL_UDP;
                cm->cmsg_type = UDP_SEGMENT;
                cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                *(uint16_t *)CMSG_DATA(cm) = (uint16_t)len;
            }
            counts[nmsg++] = k;
            want -= k;
        }
        int done = sendmmsg(fds[batches++ % nsock], msgs, nmsg, 0);
        if (done < 0) done = 0; /* ECONNREFUSED, ENOBUFS: nothing of this call was sent */
        int unsent = 0;
        for (int m = 0; m < nmsg; m++) {
            if (m < done) sent_dgrams += counts[m];
            else unsent += counts[m];
        }
        pos = (int)(((long long)pos - unsent % ndgrams + ndgrams) % ndgrams);
    }
    double duration = now() - start;
    printf("%lld %lld %.6f\n", sent_dgrams * per, sent_dgrams, duration);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 7 || argc > 9) {
        fprintf(stderr, "usage: sender HOST PORT RATE LINES_PER_DATAGRAM SECONDS SERIES "
                        "[SOCKETS [TYPES]]\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]);
    double rate = atof(argv[3]);
    int per = atoi(argv[4]);
    double seconds = atof(argv[5]);
    int series = atoi(argv[6]);
    int nsock = argc >= 8 ? atoi(argv[7]) : 1;
    if (nsock < 1 || nsock > 64) {
        fprintf(stderr, "SOCKETS must be 1..64\n");
        return 2;
    }
    static const char *default_types[] = {"c", "ms", "g", "d"};
    const char *types[16];
    int ntypes = 0;
    if (argc == 9) {
        char *list = strdup(argv[8]);
        for (char *tok = strtok(list, ","); tok && ntypes < 16; tok = strtok(NULL, ","))
            types[ntypes++] = tok;
    } else {
        for (; ntypes < 4; ntypes++) types[ntypes] = default_types[ntypes];
    }
    if (ntypes == 0) {
        fprintf(stderr, "TYPES must name at least one type\n");
        return 2;
    }

    /* One datagram per starting series index (per lines each, wrapping round). */
    int ndgrams = (series + per - 1) / per;
    char **dgrams = calloc(ndgrams, sizeof(char *));
    size_t *lens = calloc(ndgrams, sizeof(size_t));
    for (int d = 0; d < ndgrams; d++) {
        char *buf = malloc((size_t)per * 64 + 1);
        size_t n = 0;
        for (int j = 0; j < per; j++) {
            int i = (d * per + j) % series;
            if (j) buf[n++] = '\n';
            n += sprintf(buf + n, "bench.m%d:%d|%s|#host:h%d", i % 100, i % 97, types[i % ntypes],
                         i / 100);
        }
        dgrams[d] = buf;
        lens[d] = n;
    }

    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    inet_pton(AF_INET, host, &addr.sin_addr);
    int fds[64];
    for (int s = 0; s < nsock; s++) {
        fds[s] = socket(AF_INET, SOCK_DGRAM, 0);
        if (connect(fds[s], (struct sockaddr *)&addr, sizeof addr) != 0) {
            perror("connect");
            return 1;
        }
        int sndbuf = 4 << 20;
        setsockopt(fds[s], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    }
    long long batches = 0;
    if (getenv("SENDER_GSO") && atoi(getenv("SENDER_GSO")) == 1)
        return send_gso(fds, nsock, dgrams, lens, ndgrams, rate, per, seconds);

    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    long long sent_dgrams = 0;
    int index = 0;
    double start = now(), elapsed = 0;
    double dgram_rate = rate / per;
    while ((elapsed = now() - start) < seconds) {
        long long due = rate > 0 ? (long long)(elapsed * dgram_rate) + 1 : sent_dgrams + BATCH;
        if (due <= sent_dgrams) {
            /* ahead of schedule: sleep a little (short sleeps keep the pacing smooth) */
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            continue;
        }
        int n = (int)(due - sent_dgrams);
        if (n > BATCH) n = BATCH;
        memset(msgs, 0, sizeof msgs);
        for (int k = 0; k < n; k++) {
            iovs[k].iov_base = dgrams[index];
            iovs[k].iov_len = lens[index];
            msgs[k].msg_hdr.msg_iov = &iovs[k];
            msgs[k].msg_hdr.msg_iovlen = 1;
            index = (index + 1) % ndgrams;
        }
        int done = sendmmsg(fds[batches++ % nsock], msgs, n, 0);
        if (done < 0) {
            /* ECONNREFUSED from an earlier ICMP, ENOBUFS: the datagrams were not sent */
            index = (index - n % ndgrams + ndgrams) % ndgrams;
            continue;
        }
        if (done < n) index = (index - (n - done) % ndgrams + ndgrams) % ndgrams;
        sent_dgrams += done;
    }
    double duration = now() - start;
    printf("%lld %lld %.6f\n", sent_dgrams * per, sent_dgrams, duration);
    return 0;
}

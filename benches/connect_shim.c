/*
 * connect_shim.c: an LD_PRELOAD shim that puts a proxy on netperf's data path.
 *
 * netserver listens for a test's data connection on exactly the address the netperf client
 * connects to, so a proxy cannot be put in between by addressing alone. The benchmark fixes
 * the data port with netperf's test option `-P ,DATAPORT`, points the proxy's servers at
 * 127.0.0.1:DATAPORT, and loads this shim into the netperf client alone:
 *
 *   CONNECT_SHIM_FROM=127.0.0.1:DATAPORT CONNECT_SHIM_TO=127.0.0.1:PROXYPORT \
 *   LD_PRELOAD=target/connect_shim.so netperf ...
 *
 * Every connect(2) to CONNECT_SHIM_FROM goes to CONNECT_SHIM_TO instead; every other connect
 * (netperf's control connection to netserver among them) is left alone. On the first
 * redirection the shim writes one line on standard error, which the runner checks, so a shim
 * that silently did nothing cannot pass the direct path off as a proxy's figures.
 *
 * Built by benches/proxies: gcc -O2 -shared -fPIC -o target/connect_shim.so
 * benches/connect_shim.c -ldl. IPv4 only (the benchmark runs on 127.0.0.1).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static connect_fn real_connect;
static struct sockaddr_in from_addr, to_addr;
static int enabled;
static int announced;

/* "a.b.c.d:port" into a sockaddr_in; 0 on success. */
static int parse(const char *text, struct sockaddr_in *out)
{
    char host[64];
    const char *colon;
    long port;
    size_t len;

    if (text == NULL)
        return -1;
    colon = strrchr(text, ':');
    if (colon == NULL)
        return -1;
    len = (size_t)(colon - text);
    if (len == 0 || len >= sizeof host)
        return -1;
    memcpy(host, text, len);
    host[len] = '\0';
    port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535)
        return -1;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, host, &out->sin_addr) != 1)
        return -1;
    return 0;
}

__attribute__((constructor)) static void shim_init(void)
{
    real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    if (parse(getenv("CONNECT_SHIM_FROM"), &from_addr) == 0 &&
        parse(getenv("CONNECT_SHIM_TO"), &to_addr) == 0)
        enabled = 1;
    else
        fprintf(stderr, "connect_shim: CONNECT_SHIM_FROM and CONNECT_SHIM_TO must be "
                        "a.b.c.d:port; redirecting nothing\n");
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    if (real_connect == NULL)
        real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    if (enabled && addr != NULL && addr->sa_family == AF_INET &&
        len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        if (in->sin_port == from_addr.sin_port &&
            in->sin_addr.s_addr == from_addr.sin_addr.s_addr) {
            if (!announced) {
                announced = 1;
                fprintf(stderr, "connect_shim: redirecting %s:%d to the proxy at port %d\n",
                        inet_ntoa(in->sin_addr), ntohs(in->sin_port), ntohs(to_addr.sin_port));
            }
            return real_connect(fd, (const struct sockaddr *)&to_addr, sizeof to_addr);
        }
    }
    return real_connect(fd, addr, len);
}

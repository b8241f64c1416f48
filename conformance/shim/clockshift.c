/*
 * clockshift: an LD_PRELOAD shim that shifts the wall clock of one server process and of
 * every process it forks.
 *
 * Overrides clock_gettime() for CLOCK_REALTIME and CLOCK_REALTIME_COARSE, gettimeofday()
 * and time(). Each reads the real time with a raw syscall and adds an offset in
 * milliseconds. The offset is read from the file named by the environment variable
 * TENURE_CLOCK_OFFSET_FILE (a signed decimal integer; a missing or unreadable file means
 * 0), re-read at most every 10 ms (rate-limited with CLOCK_MONOTONIC, also via a raw
 * syscall; a forked child re-reads it at its first clock read). Other clocks pass straight
 * through.
 *
 * Evidence: whenever it reads an offset different from the last one it recorded, it writes
 * "<offset_ms> <pid>\n" to "<offset file>.applied" (a temporary file renamed into place),
 * where pid is the process the shim was loaded into (a forked child, such as a Postgres
 * backend, names its server; it records the offset at its own first clock read),
 * so a harness can tell that the server read the offset it applies.
 *
 * It uses no malloc, no stdio and no locks, so it is safe in allocators, signal handlers
 * and multi-threaded servers (libfaketime hangs Debian's jemalloc redis-server; this does
 * not).
 *
 * Build: cc -shared -fPIC -O2 -o clockshift.so clockshift.c
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define RECHECK_NS 10000000LL /* 10 ms */
#define NS_PER_SEC 1000000000LL

/* A copy: programs that set their process title (redis-server) overwrite the original
 * environment strings. */
static char offset_path_buf[4096];
static const char *offset_path;
static _Atomic long long offset_ms;
static _Atomic long long next_check_ns; /* 0: never checked */
static _Atomic int recorded;             /* whether last_recorded is valid */
static _Atomic long long last_recorded;
/* The process the shim was loaded into: a forked child keeps its parent's (the server). */
static long long root_pid;
#define APPLIED_SUFFIX ".applied"
#define TMP_SUFFIX ".applied.tmp."

/* A forked child (a Postgres backend) reads the offset file at its first clock read
 * instead of going on with its parent's offset until the parent's next re-read. */
static void clockshift_forked(void) {
    atomic_store(&next_check_ns, 0);
    atomic_store(&recorded, 0);
}

__attribute__((constructor)) static void clockshift_init(void) {
    const char *p = getenv("TENURE_CLOCK_OFFSET_FILE");
    size_t n = 0;
    if (p == NULL)
        return;
    while (p[n] != '\0' && n + 1 < sizeof offset_path_buf) {
        offset_path_buf[n] = p[n];
        n++;
    }
    if (p[n] != '\0' || n + sizeof TMP_SUFFIX + 24 >= sizeof offset_path_buf)
        return; /* too long: no shift rather than the wrong file */
    offset_path_buf[n] = '\0';
    offset_path = offset_path_buf;
    root_pid = (long long)syscall(SYS_getpid);
    pthread_atfork(NULL, NULL, clockshift_forked);
}

static long long mono_ns(void) {
    struct timespec ts;
    if (syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (long long)ts.tv_sec * NS_PER_SEC + ts.tv_nsec;
}

/* Parse an optionally signed decimal integer; anything else gives 0. */
static long long parse_ms(const char *s, long n) {
    long i = 0;
    int neg = 0;
    long long v = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t'))
        i++;
    if (i < n && (s[i] == '-' || s[i] == '+')) {
        neg = s[i] == '-';
        i++;
    }
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        v = v * 10 + (s[i] - '0');
    return neg ? -v : v;
}

/* Append the decimal form of v (may be negative) at dst; returns the length written. */
static int put_ll(char *dst, long long v) {
    char tmp[24];
    int n = 0, len = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0)
        dst[len++] = '-';
    while (n > 0)
        dst[len++] = tmp[--n];
    return len;
}

static int put_str(char *dst, const char *s) {
    int n = 0;
    while (s[n] != '\0') {
        dst[n] = s[n];
        n++;
    }
    return n;
}

/* Record "<v> <root pid>\n" in "<offset file>.applied", atomically (write, then rename). */
static void record_applied(long long v) {
    char applied[sizeof offset_path_buf + sizeof APPLIED_SUFFIX];
    char tmp[sizeof offset_path_buf + sizeof TMP_SUFFIX + 24];
    char line[64];
    long long pid = (long long)syscall(SYS_getpid);
    int n = put_str(applied, offset_path);
    n += put_str(applied + n, APPLIED_SUFFIX);
    applied[n] = '\0';
    n = put_str(tmp, offset_path);
    n += put_str(tmp + n, TMP_SUFFIX);
    n += put_ll(tmp + n, pid);
    tmp[n] = '\0';
    n = put_ll(line, v);
    line[n++] = ' ';
    n += put_ll(line + n, root_pid);
    line[n++] = '\n';
    int fd = (int)syscall(SYS_openat, AT_FDCWD, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                          0644);
    if (fd < 0)
        return;
    long w = (long)syscall(SYS_write, fd, line, n);
    syscall(SYS_close, fd);
    if (w == n)
        syscall(SYS_renameat, AT_FDCWD, tmp, AT_FDCWD, applied);
    else
        syscall(SYS_unlinkat, AT_FDCWD, tmp, 0);
}

static long long current_offset_ms(void) {
    long long now = mono_ns();
    long long due = atomic_load_explicit(&next_check_ns, memory_order_relaxed);
    if (offset_path != NULL && now >= due &&
        atomic_compare_exchange_strong(&next_check_ns, &due, now + RECHECK_NS)) {
        long long v = 0;
        int fd = (int)syscall(SYS_openat, AT_FDCWD, offset_path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char buf[64];
            long n = (long)syscall(SYS_read, fd, buf, sizeof buf);
            syscall(SYS_close, fd);
            if (n > 0)
                v = parse_ms(buf, n);
        }
        atomic_store(&offset_ms, v);
        if (!atomic_load(&recorded) || atomic_load(&last_recorded) != v) {
            record_applied(v);
            atomic_store(&last_recorded, v);
            atomic_store(&recorded, 1);
        }
    }
    return atomic_load(&offset_ms);
}

static void shift(struct timespec *ts) {
    long long off = current_offset_ms();
    long long ns = (long long)ts->tv_nsec + (off % 1000) * 1000000LL;
    long long sec = (long long)ts->tv_sec + off / 1000;
    while (ns < 0) {
        ns += NS_PER_SEC;
        sec -= 1;
    }
    while (ns >= NS_PER_SEC) {
        ns -= NS_PER_SEC;
        sec += 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE))
        shift(ts);
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    if (tz != NULL) {
        int r = (int)syscall(SYS_gettimeofday, NULL, tz);
        if (r != 0)
            return r;
    }
    /* glibc declares tv nonnull. */
    struct timespec ts;
    int r = (int)syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (r != 0)
        return r;
    shift(&ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    shift(&ts);
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

/*
 * abi_fallbacks.c — the degraded setups: a loader denied what it prefers
 * still streams every sample, reports what it got in the stats and says why
 * in the stats JSON notes; a configuration that requires the missing
 * feature fails with its documented status instead.
 *
 * Usage: abi_fallbacks SEED SAMPLES BYTES SHARD...   (as abi_stream)
 *
 * Each case runs in a forked child, so the privileges it drops and the
 * seccomp filter it installs stay there; the parent never opens a loader
 * (a loader must not cross fork()).
 *   (a) no CAP_IPC_LOCK and RLIMIT_MEMLOCK of 8 MiB under a 64 MiB budget:
 *       nothing locked, no registered buffers; lock_memory "on" fails.
 *   (b) io_uring_setup denied by seccomp (EPERM): the thread backend;
 *       io_backend "io_uring" fails.
 *   (c) memory_kind "thp", "normal" and "hugetlb", io_backend "threads".
 *   (d) the control: nothing denied, so what the process may lock is locked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425 /* the same number on every architecture */
#endif

static uint64_t seed, n_samples, n_bytes;
static char **shards;
static size_t n_shards;

/*
 * ASan intercepts mlock and munlock as no-ops that report success
 * (sanitizer_common's MlockIsUnsupported), which would hide from the library
 * exactly the refusal this program tests. Definitions in the executable come
 * first in symbol lookup, ahead of the ASan runtime, so these give the
 * library (and the probes below) the kernel's own answer.
 */
int mlock(const void *addr, size_t len) {
    return (int)syscall(SYS_mlock, addr, len);
}

int munlock(const void *addr, size_t len) {
    return (int)syscall(SYS_munlock, addr, len);
}

#define BUDGET (64u << 20)
#define SMALL "\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\""

static ringfeed_loader *open_with(const char *extra) {
    char *config = make_config(shards, n_shards, extra);
    ringfeed_loader *l = open_or_die(config);
    free(config);
    return l;
}

/* Opens `extra`, expecting `want` and a message that mentions `needle`. */
static void expect_open_fails(const char *extra, int32_t want, const char *needle) {
    char *config = make_config(shards, n_shards, extra);
    ringfeed_loader *l = NULL;
    int32_t st = ringfeed_loader_open(config, &l);
    if (st == RINGFEED_OK) {
        ringfeed_loader_close(l);
    }
    CHECK(st == want, "open of {%s} returned %s, wanted %s", extra, ringfeed_status_name(st),
          ringfeed_status_name(want));
    CHECK(l == NULL, "a failed open wrote a handle");
    CHECK(contains(last_error(), needle), "open of {%s}: the message does not mention \"%s\"",
          extra, needle);
    printf("  {%s}: %s: %s\n", extra, ringfeed_status_name(st), last_error());
    free(config);
}

/* Streams one whole epoch, checks it, and returns the stats (JSON in *json). */
static ringfeed_stats stream_all(ringfeed_loader *l, char **json) {
    stream_epoch(l, 0, seed, n_shards, n_samples, n_bytes, NULL);
    expect_finished(l);
    ringfeed_stats s;
    s.size = sizeof s;
    EXPECT_STATUS(ringfeed_loader_stats(l, &s), RINGFEED_OK);
    CHECK(s.samples_delivered == n_samples && s.bytes_delivered == n_bytes,
          "stats: samples_delivered %" PRIu64 ", bytes_delivered %" PRIu64, s.samples_delivered,
          s.bytes_delivered);
    *json = stats_json(l);
    return s;
}

/* VmLck of this process, in KiB, from /proc/self/status. */
static long locked_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL, "cannot read /proc/self/status");
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmLck: %ld kB", &kib) == 1) {
            break;
        }
    }
    fclose(f);
    CHECK(kib >= 0, "no VmLck in /proc/self/status");
    return kib;
}

static int has_cap_ipc_lock(void) {
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    CHECK(syscall(SYS_capget, &hdr, data) == 0, "capget: %s", strerror(errno));
    return (data[CAP_TO_INDEX(CAP_IPC_LOCK)].effective & CAP_TO_MASK(CAP_IPC_LOCK)) != 0;
}

/* Whether io_uring_setup works in this process. */
static int io_uring_works(void) {
    unsigned char params[120]; /* struct io_uring_params */
    memset(params, 0, sizeof params);
    long fd = syscall(__NR_io_uring_setup, 4, params);
    if (fd >= 0) {
        close((int)fd);
        return 1;
    }
    return 0;
}

/* (a) */
static void without_mlock(void) {
    printf("(a) no CAP_IPC_LOCK, RLIMIT_MEMLOCK 8 MiB:\n");
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    CHECK(syscall(SYS_capget, &hdr, data) == 0, "capget: %s", strerror(errno));
    data[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
    CHECK(syscall(SYS_capset, &hdr, data) == 0, "capset: %s", strerror(errno));
    CHECK(!has_cap_ipc_lock(), "CAP_IPC_LOCK is still effective");

    struct rlimit lim;
    CHECK(getrlimit(RLIMIT_MEMLOCK, &lim) == 0, "getrlimit: %s", strerror(errno));
    rlim_t want = 8u << 20;
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < want) {
        want = lim.rlim_max; /* already lower: keep it */
    }
    lim.rlim_cur = lim.rlim_max = want;
    CHECK(setrlimit(RLIMIT_MEMLOCK, &lim) == 0, "setrlimit: %s", strerror(errno));

    /* The setup really denies locking the budget. */
    void *probe = mmap(NULL, BUDGET, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(probe != MAP_FAILED, "mmap: %s", strerror(errno));
    CHECK(mlock(probe, BUDGET) != 0, "mlock of 64 MiB succeeded without CAP_IPC_LOCK");
    munmap(probe, BUDGET);

    ringfeed_loader *l = open_with(SMALL);
    char *json;
    ringfeed_stats s = stream_all(l, &json);
    printf("  %s\n", json);
    CHECK(s.memory_locked == 0, "memory_locked is %u; mlock cannot have succeeded",
          s.memory_locked);
    CHECK(locked_kib() == 0, "%ld KiB locked, yet the stats say nothing is", locked_kib());
    CHECK(s.buffers_registered == 0, "buffers_registered is %u; 64 MiB exceeds RLIMIT_MEMLOCK",
          s.buffers_registered);
    CHECK(contains(json, "mlock"), "the notes do not say why memory is not locked: %s", json);
    if (s.io_backend == RINGFEED_BACKEND_IO_URING) {
        CHECK(contains(json, "register"), "the notes do not say why buffers are not registered: %s",
              json);
    }
    int uring = s.io_backend == RINGFEED_BACKEND_IO_URING;
    free(json);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);

    expect_open_fails(SMALL ", \"lock_memory\": \"on\"", RINGFEED_ERR_MEMORY, "mlock");
    if (uring) {
        expect_open_fails(SMALL ", \"register_buffers\": \"on\"", RINGFEED_ERR_IO_URING,
                          "register");
    } else {
        printf("  (io_uring unavailable here: register_buffers \"on\" not checked)\n");
    }
    /* lock_memory "off" streams and locks nothing. */
    l = open_with(SMALL ", \"lock_memory\": \"off\", \"register_buffers\": \"off\"");
    s = stream_all(l, &json);
    CHECK(s.memory_locked == 0 && s.buffers_registered == 0, "locked %u, registered %u with off",
          s.memory_locked, s.buffers_registered);
    free(json);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
}

/* (b) */
static void without_io_uring(void) {
    printf("(b) io_uring_setup denied by seccomp:\n");
#if defined(__x86_64__)
    const uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    const uint32_t arch = AUDIT_ARCH_AARCH64;
#else
#error "add this architecture's AUDIT_ARCH_* here"
#endif
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof filter / sizeof filter[0]), filter};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS: %s",
          strerror(errno));
    CHECK(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0, "seccomp: %s",
          strerror(errno));
    errno = 0;
    CHECK(!io_uring_works() && errno == EPERM, "io_uring_setup still works (errno %d)", errno);

    ringfeed_loader *l = open_with(SMALL);
    char *json;
    ringfeed_stats s = stream_all(l, &json);
    printf("  %s\n", json);
    CHECK(s.io_backend == RINGFEED_BACKEND_THREADS, "io_backend %d without io_uring",
          (int)s.io_backend);
    CHECK(s.buffers_registered == 0, "buffers registered without io_uring");
    CHECK(contains(json, "\"io_backend\":\"threads\""), "stats JSON: %s", json);
    CHECK(contains(json, "io_uring unavailable"), "the notes do not say why: %s", json);
    free(json);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);

    expect_open_fails(SMALL ", \"io_backend\": \"io_uring\"", RINGFEED_ERR_IO_URING, "io_uring");
}

/* (c) */
static void chosen_kinds(void) {
    printf("(c) chosen memory kinds and backend:\n");
    struct {
        const char *extra;
        int32_t kind;
    } kinds[] = {
        {SMALL ", \"memory_kind\": \"thp\"", RINGFEED_MEMORY_THP},
        {SMALL ", \"memory_kind\": \"normal\"", RINGFEED_MEMORY_NORMAL},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        ringfeed_loader *l = open_with(kinds[i].extra);
        char *json;
        ringfeed_stats s = stream_all(l, &json);
        CHECK(s.memory_kind == kinds[i].kind, "{%s}: memory_kind %d", kinds[i].extra,
              (int)s.memory_kind);
        printf("  {%s}: memory_kind %d\n", kinds[i].extra, (int)s.memory_kind);
        free(json);
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    }
    /* hugetlb: huge pages are reserved here or not; either way it says so. */
    char *config = make_config(shards, n_shards, SMALL ", \"memory_kind\": \"hugetlb\"");
    ringfeed_loader *l = NULL;
    int32_t st = ringfeed_loader_open(config, &l);
    if (st == RINGFEED_OK) {
        char *json;
        ringfeed_stats s = stream_all(l, &json);
        CHECK(s.memory_kind == RINGFEED_MEMORY_HUGETLB, "hugetlb: memory_kind %d",
              (int)s.memory_kind);
        free(json);
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
        printf("  hugetlb: obtained\n");
    } else {
        CHECK(st == RINGFEED_ERR_MEMORY && contains(last_error(), "MAP_HUGETLB"),
              "hugetlb unavailable: %s, wanted RINGFEED_ERR_MEMORY naming MAP_HUGETLB",
              ringfeed_status_name(st));
        printf("  hugetlb: %s: %s\n", ringfeed_status_name(st), last_error());
    }
    free(config);

    l = open_with(SMALL ", \"io_backend\": \"threads\"");
    char *json;
    ringfeed_stats s = stream_all(l, &json);
    CHECK(s.io_backend == RINGFEED_BACKEND_THREADS && s.buffers_registered == 0,
          "threads: io_backend %d, buffers_registered %u", (int)s.io_backend,
          s.buffers_registered);
    free(json);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
}

/* (d) */
static void control(void) {
    printf("(d) nothing denied:\n");
    struct rlimit lim;
    CHECK(getrlimit(RLIMIT_MEMLOCK, &lim) == 0, "getrlimit: %s", strerror(errno));
    int can_lock = has_cap_ipc_lock() || lim.rlim_cur == RLIM_INFINITY;
    int uring = io_uring_works();
    ringfeed_loader *l = open_with(SMALL);
    char *json;
    ringfeed_stats s = stream_all(l, &json);
    printf("  %s\n", json);
    if (can_lock) {
        CHECK(s.memory_locked == 1, "memory_locked %u though this process may lock 64 MiB",
              s.memory_locked);
        CHECK(locked_kib() >= (long)(BUDGET >> 10), "memory_locked, but only %ld KiB locked",
              locked_kib());
    } else {
        printf("  (this process may not lock 64 MiB: locking not checked)\n");
    }
    if (uring) {
        CHECK(s.io_backend == RINGFEED_BACKEND_IO_URING,
              "io_uring works here, but the loader chose %d", (int)s.io_backend);
        if (can_lock) {
            CHECK(s.buffers_registered == 1,
                  "io_uring and locking allowed, buffers not registered");
        }
    }
    free(json);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
}

/* Runs `fn` in a child; returns whether it exited 0. */
static int in_child(const char *name, void (*fn)(void)) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        alarm(120);
        fn();
        fflush(stdout);
        exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
        fprintf(stderr, "%s: child failed (%s %d)\n", name,
                WIFEXITED(status) ? "exit status" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
    return ok;
}

int main(int argc, char **argv) {
    read_dataset_args(argc, argv, 1, "", &seed, &n_samples, &n_bytes, &shards, &n_shards);

    int ok = 1;
    ok &= in_child("(a) without mlock", without_mlock);
    ok &= in_child("(b) without io_uring", without_io_uring);
    ok &= in_child("(c) chosen kinds", chosen_kinds);
    ok &= in_child("(d) control", control);
    if (!ok) {
        return 1;
    }
    printf("abi_fallbacks: all checks passed\n");
    return 0;
}

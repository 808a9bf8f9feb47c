/*
 * abi_races.c — the C ABI used from several threads and across fork() the
 * way a careless host would: every outcome must be a status code or a clean
 * wake-up, every batch handed out must hold the generator's bytes, and no
 * sample may be lost or doubled. ASan/UBSan (tests/c_abi.rs) and valgrind
 * (tests/c_abi.rs too) watch the memory; alarm() turns a hang into a
 * failure.
 *
 * Usage: abi_races SEED SAMPLES BYTES SHARD...   (as abi_stream)
 *
 *   (a) consumers race: three threads take batches and hand each to another
 *       thread to release, while a fourth reads the stats, the stats JSON
 *       and the resume state in a loop; the epoch is whole.
 *   (b) double release race: two threads release copies of one batch at the
 *       same moment; exactly one gets RINGFEED_OK.
 *   (c) close races next and release: consumers poll with short time-outs
 *       while two threads close the loader at once (one RINGFEED_OK, one
 *       RINGFEED_ERR_INVALID_HANDLE); every batch taken stays readable and
 *       is released after the close.
 *   (d) two loaders: a batch struct carrying one loader's handle and the
 *       other's arrays releases the batch its handle names, and nothing
 *       else; closing one loader leaves the other's epoch whole.
 *   (e) fork in the middle: while two threads consume, the process forks
 *       (a dozen times); each child gets RINGFEED_ERR_INVALID_HANDLE from
 *       every entry point on the parent's loader and batch, then opens its
 *       own loader and streams a whole epoch; the parent's epoch is whole.
 *       Not in the ASan build (see main); the build without sanitizers
 *       runs it, natively and under valgrind.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

static uint64_t seed, n_samples, n_bytes;
static char **shards;
static size_t n_shards;

#define SMALL "\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\", \"batch_size\": 8"

static ringfeed_loader *open_small(void) {
    char *config = make_config(shards, n_shards, SMALL);
    ringfeed_loader *l = open_or_die(config);
    free(config);
    return l;
}

/* A key list shared by threads. */
typedef struct shared_keys {
    pthread_mutex_t lock;
    key_list keys;
} shared_keys;

static void shared_add_batch(shared_keys *k, const ringfeed_batch *b) {
    key_list mine = {0};
    check_batch(b, seed, &mine);
    pthread_mutex_lock(&k->lock);
    for (size_t i = 0; i < mine.len; i++) {
        key_list_add(&k->keys, mine.keys[i]);
    }
    pthread_mutex_unlock(&k->lock);
    free(mine.keys);
}

/* ---- (a) consumers race, releasing each other's batches ---- */

/* A one-slot hand-over between a consumer and the next one's releaser. */
#define N_CONSUMERS 3
typedef struct mailbox {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    ringfeed_batch slot[4];
    size_t len;
    int closed;
} mailbox;

typedef struct consumer {
    ringfeed_loader *loader;
    shared_keys *keys;
    mailbox *to_release; /* batches this thread takes go here */
    mailbox *mine;       /* batches this thread releases come from here */
    uint64_t taken, released;
} consumer;

static void mailbox_put(mailbox *m, const ringfeed_batch *b) {
    pthread_mutex_lock(&m->lock);
    while (m->len == 4) {
        pthread_cond_wait(&m->cond, &m->lock);
    }
    m->slot[m->len++] = *b;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
}

/* Takes one batch into *b; 0 when the box is closed and empty. */
static int mailbox_take(mailbox *m, ringfeed_batch *b) {
    pthread_mutex_lock(&m->lock);
    while (m->len == 0 && !m->closed) {
        pthread_cond_wait(&m->cond, &m->lock);
    }
    int got = m->len > 0;
    if (got) {
        *b = m->slot[--m->len];
        pthread_cond_broadcast(&m->cond);
    }
    pthread_mutex_unlock(&m->lock);
    return got;
}

static void mailbox_close(mailbox *m) {
    pthread_mutex_lock(&m->lock);
    m->closed = 1;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
}

static void *releaser(void *arg) {
    consumer *c = (consumer *)arg;
    ringfeed_batch b;
    while (mailbox_take(c->mine, &b)) {
        check_batch(&b, seed, NULL); /* still the generator's bytes */
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
        c->released++;
    }
    return NULL;
}

static void *taker(void *arg) {
    consumer *c = (consumer *)arg;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(c->loader, -1, &b);
        if (st == RINGFEED_END_OF_EPOCH || st == RINGFEED_FINISHED) {
            break;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        shared_add_batch(c->keys, &b);
        c->taken++;
        mailbox_put(c->to_release, &b);
    }
    return NULL;
}

typedef struct watcher {
    ringfeed_loader *loader;
    volatile int stop;
    uint64_t rounds;
} watcher;

static void *watch(void *arg) {
    watcher *w = (watcher *)arg;
    while (!w->stop) {
        ringfeed_stats s;
        s.size = sizeof s;
        EXPECT_STATUS(ringfeed_loader_stats(w->loader, &s), RINGFEED_OK);
        CHECK(s.samples_delivered <= n_samples, "stats: %" PRIu64 " samples of %" PRIu64,
              s.samples_delivered, n_samples);
        char *json = stats_json(w->loader);
        CHECK(json[0] == '{', "stats JSON: %s", json);
        free(json);
        char state[4096];
        size_t needed = 0;
        EXPECT_STATUS(ringfeed_loader_state(w->loader, state, sizeof state, &needed), RINGFEED_OK);
        CHECK(needed > 0 && strlen(state) == needed, "state of %zu bytes", needed);
        w->rounds++;
    }
    return NULL;
}

static void consumers_race(void) {
    printf("(a) consumers race, releasing each other's batches:\n");
    ringfeed_loader *l = open_small();
    shared_keys keys = {PTHREAD_MUTEX_INITIALIZER, {0}};
    mailbox boxes[N_CONSUMERS];
    consumer c[N_CONSUMERS];
    pthread_t takers[N_CONSUMERS], releasers[N_CONSUMERS], watcher_thread;
    for (int i = 0; i < N_CONSUMERS; i++) {
        memset(&boxes[i], 0, sizeof boxes[i]);
        pthread_mutex_init(&boxes[i].lock, NULL);
        pthread_cond_init(&boxes[i].cond, NULL);
    }
    for (int i = 0; i < N_CONSUMERS; i++) {
        c[i] = (consumer){l, &keys, &boxes[(i + 1) % N_CONSUMERS], &boxes[i], 0, 0};
    }
    watcher w = {l, 0, 0};
    CHECK(pthread_create(&watcher_thread, NULL, watch, &w) == 0, "pthread_create");
    for (int i = 0; i < N_CONSUMERS; i++) {
        CHECK(pthread_create(&releasers[i], NULL, releaser, &c[i]) == 0, "pthread_create");
        CHECK(pthread_create(&takers[i], NULL, taker, &c[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < N_CONSUMERS; i++) {
        CHECK(pthread_join(takers[i], NULL) == 0, "pthread_join");
    }
    for (int i = 0; i < N_CONSUMERS; i++) {
        mailbox_close(&boxes[i]);
    }
    uint64_t taken = 0, released = 0;
    for (int i = 0; i < N_CONSUMERS; i++) {
        CHECK(pthread_join(releasers[i], NULL) == 0, "pthread_join");
        taken += c[i].taken;
        released += c[i].released;
    }
    w.stop = 1;
    CHECK(pthread_join(watcher_thread, NULL) == 0, "pthread_join");
    CHECK(taken == released, "%" PRIu64 " batches taken, %" PRIu64 " released", taken, released);
    key_list_check_exactly_once(&keys.keys, n_shards, n_samples, "(a)");
    ringfeed_stats s;
    s.size = sizeof s;
    EXPECT_STATUS(ringfeed_loader_stats(l, &s), RINGFEED_OK);
    CHECK(s.samples_delivered == n_samples && s.batches_delivered == taken,
          "stats: %" PRIu64 " samples in %" PRIu64 " batches; %" PRIu64 " batches taken",
          s.samples_delivered, s.batches_delivered, taken);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    printf("  %" PRIu64 " batches, each released by another thread; %" PRIu64
           " stats rounds alongside\n",
           taken, w.rounds);
    free(keys.keys.keys);
}

/* ---- (b) two threads release one batch at once ---- */

typedef struct double_release {
    pthread_barrier_t *start;
    ringfeed_batch copy;
    int32_t status;
} double_release;

static void *release_at_barrier(void *arg) {
    double_release *d = (double_release *)arg;
    pthread_barrier_wait(d->start);
    d->status = ringfeed_batch_release(&d->copy);
    return NULL;
}

static void double_release_race(void) {
    printf("(b) two threads release one batch at once:\n");
    ringfeed_loader *l = open_small();
    pthread_barrier_t start;
    CHECK(pthread_barrier_init(&start, NULL, 2) == 0, "pthread_barrier_init");
    key_list keys = {0};
    uint64_t rounds = 0;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(l, -1, &b);
        if (st == RINGFEED_END_OF_EPOCH) {
            break;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        check_batch(&b, seed, &keys);
        double_release d[2] = {{&start, b, 0}, {&start, b, 0}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++) {
            CHECK(pthread_create(&t[i], NULL, release_at_barrier, &d[i]) == 0, "pthread_create");
        }
        for (int i = 0; i < 2; i++) {
            CHECK(pthread_join(t[i], NULL) == 0, "pthread_join");
        }
        int ok = (d[0].status == RINGFEED_OK) + (d[1].status == RINGFEED_OK);
        int stale = (d[0].status == RINGFEED_ERR_INVALID_HANDLE) +
                    (d[1].status == RINGFEED_ERR_INVALID_HANDLE);
        CHECK(ok == 1 && stale == 1, "racing releases returned %s and %s",
              ringfeed_status_name(d[0].status), ringfeed_status_name(d[1].status));
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_ERR_INVALID_HANDLE);
        rounds++;
    }
    key_list_check_exactly_once(&keys, n_shards, n_samples, "(b)");
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    pthread_barrier_destroy(&start);
    free(keys.keys);
    printf("  %" PRIu64 " batches released twice at once: one RINGFEED_OK each\n", rounds);
}

/* ---- (c) close races next and release ---- */

#define MAX_HELD 64

typedef struct poller {
    ringfeed_loader *loader;
    int32_t last;                /* the status that ended the loop */
    ringfeed_batch held[MAX_HELD]; /* every other batch is kept past the close */
    size_t n_held;
    uint64_t taken;
} poller;

static void *poll_until_closed(void *arg) {
    poller *p = (poller *)arg;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(p->loader, 2, &b);
        if (st == RINGFEED_TIMEOUT) {
            continue;
        }
        if (st != RINGFEED_OK) {
            p->last = st;
            break;
        }
        check_batch(&b, seed, NULL);
        p->taken++;
        if (p->taken % 2 == 0 && p->n_held < MAX_HELD) {
            p->held[p->n_held++] = b;
        } else {
            EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
        }
    }
    return NULL;
}

typedef struct closer {
    pthread_barrier_t *start;
    ringfeed_loader *loader;
    int32_t status;
} closer;

static void *close_at_barrier(void *arg) {
    closer *c = (closer *)arg;
    pthread_barrier_wait(c->start);
    c->status = ringfeed_loader_close(c->loader);
    return NULL;
}

static void close_races_next(void) {
    printf("(c) close races next and release:\n");
    for (int round = 0; round < 3; round++) {
        /* A small budget, so the pollers also wait on a starved loader. */
        char *config = make_config(shards, n_shards,
                                   "\"memory_budget\": \"4MiB\", \"chunk_size\": \"256KiB\", "
                                   "\"batch_size\": 4, \"workers\": 2");
        ringfeed_loader *l = open_or_die(config);
        free(config);
        poller p[3];
        pthread_t t[3];
        for (int i = 0; i < 3; i++) {
            memset(&p[i], 0, sizeof p[i]);
            p[i].loader = l;
            CHECK(pthread_create(&t[i], NULL, poll_until_closed, &p[i]) == 0, "pthread_create");
        }
        usleep((useconds_t)(20000 * (round + 1)));
        pthread_barrier_t start;
        CHECK(pthread_barrier_init(&start, NULL, 2) == 0, "pthread_barrier_init");
        closer c[2] = {{&start, l, 0}, {&start, l, 0}};
        pthread_t ct[2];
        for (int i = 0; i < 2; i++) {
            CHECK(pthread_create(&ct[i], NULL, close_at_barrier, &c[i]) == 0, "pthread_create");
        }
        for (int i = 0; i < 2; i++) {
            CHECK(pthread_join(ct[i], NULL) == 0, "pthread_join");
        }
        pthread_barrier_destroy(&start);
        int ok = (c[0].status == RINGFEED_OK) + (c[1].status == RINGFEED_OK);
        int stale = (c[0].status == RINGFEED_ERR_INVALID_HANDLE) +
                    (c[1].status == RINGFEED_ERR_INVALID_HANDLE);
        CHECK(ok == 1 && stale == 1, "racing closes returned %s and %s",
              ringfeed_status_name(c[0].status), ringfeed_status_name(c[1].status));
        uint64_t taken = 0;
        size_t held = 0;
        for (int i = 0; i < 3; i++) {
            CHECK(pthread_join(t[i], NULL) == 0, "pthread_join");
            CHECK(p[i].last == RINGFEED_ERR_CLOSED || p[i].last == RINGFEED_ERR_INVALID_HANDLE,
                  "a poller ended with %s when the loader closed", ringfeed_status_name(p[i].last));
            taken += p[i].taken;
            /* Taken before the close, released after it: still whole. */
            for (size_t k = 0; k < p[i].n_held; k++) {
                check_batch(&p[i].held[k], seed, NULL);
                EXPECT_STATUS(ringfeed_batch_release(&p[i].held[k]), RINGFEED_OK);
                held++;
            }
        }
        ringfeed_batch b;
        EXPECT_STATUS(ringfeed_loader_next(l, 0, &b), RINGFEED_ERR_INVALID_HANDLE);
        printf("  round %d: %" PRIu64 " batches taken, %zu released after the close\n", round,
               taken, held);
    }
}

/* ---- (d) two loaders at once ---- */

static void two_loaders(void) {
    printf("(d) two loaders:\n");
    ringfeed_loader *a = open_small();
    ringfeed_loader *b = open_small();
    CHECK(a != b, "two loaders share a handle");
    ringfeed_batch from_a, from_b;
    EXPECT_STATUS(ringfeed_loader_next(a, -1, &from_a), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_loader_next(b, -1, &from_b), RINGFEED_OK);
    key_list keys_b = {0};
    check_batch(&from_b, seed, &keys_b);

    /* A's handle with B's arrays: the handle alone decides. */
    ringfeed_batch mixed = from_b;
    mixed.handle = from_a.handle;
    EXPECT_STATUS(ringfeed_batch_release(&mixed), RINGFEED_OK);
    check_zeroed(&mixed, "release");
    EXPECT_STATUS(ringfeed_batch_release(&from_a), RINGFEED_ERR_INVALID_HANDLE);
    CHECK(contains(last_error(), "not held"), "release of a released batch: %s", last_error());
    check_batch(&from_b, seed, NULL); /* B's batch is untouched */

    /* Close A while B's batch is held and B streams on. */
    ringfeed_batch more_a;
    EXPECT_STATUS(ringfeed_loader_next(a, -1, &more_a), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_loader_close(a), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_loader_close(a), RINGFEED_ERR_INVALID_HANDLE);
    ringfeed_batch dummy;
    EXPECT_STATUS(ringfeed_loader_next(a, 0, &dummy), RINGFEED_ERR_INVALID_HANDLE);
    EXPECT_STATUS(ringfeed_batch_release(&from_b), RINGFEED_OK);
    for (;;) {
        ringfeed_batch x;
        int32_t st = ringfeed_loader_next(b, -1, &x);
        if (st == RINGFEED_END_OF_EPOCH) {
            break;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        check_batch(&x, seed, &keys_b);
        EXPECT_STATUS(ringfeed_batch_release(&x), RINGFEED_OK);
    }
    key_list_check_exactly_once(&keys_b, n_shards, n_samples, "(d) loader B");
    /* A's batch, taken before its close, is released after B's epoch. */
    check_batch(&more_a, seed, NULL);
    EXPECT_STATUS(ringfeed_batch_release(&more_a), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_loader_close(b), RINGFEED_OK);
    free(keys_b.keys);
    printf("  the mixed batch released A's batch only; B's epoch whole across A's close\n");
}

/* ---- (e) fork in the middle ---- */

typedef struct fork_consumer {
    ringfeed_loader *loader;
    shared_keys *keys;
    volatile int *forks_done;
    int forks_wanted;
} fork_consumer;

/* Consumes slowly enough that the forks land while batches flow. */
static void *consume_during_forks(void *arg) {
    fork_consumer *c = (fork_consumer *)arg;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(c->loader, -1, &b);
        if (st == RINGFEED_END_OF_EPOCH || st == RINGFEED_FINISHED) {
            break;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        shared_add_batch(c->keys, &b);
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
        if (*c->forks_done < c->forks_wanted) {
            usleep(5000);
        }
    }
    return NULL;
}

/* In the child: the call must give RINGFEED_ERR_INVALID_HANDLE naming fork. */
#define CHILD_REFUSES(expr)                                                                  \
    do {                                                                                     \
        int32_t st_ = (expr);                                                                \
        if (st_ != RINGFEED_ERR_INVALID_HANDLE || !contains(last_error(), "fork")) {         \
            fprintf(stderr, "child: %s returned %s: %s\n", #expr, ringfeed_status_name(st_), \
                    last_error());                                                           \
            fflush(stderr);                                                                  \
            _exit(3);                                                                        \
        }                                                                                    \
    } while (0)

/*
 * The child's side. Ends with _exit: exit() would run LeakSanitizer over a
 * copy of the parent's heap whose owners, the parent's threads, do not
 * exist here.
 */
_Noreturn static void child_after_fork(ringfeed_loader *parents, ringfeed_batch *held,
                                       int stream_own) {
    alarm(60);
    ringfeed_batch b;
    ringfeed_stats s;
    s.size = sizeof s;
    char buf[4096];
    size_t needed;
    int fd;
    const uint8_t *base;
    uint64_t len;
    CHILD_REFUSES(ringfeed_loader_next(parents, 0, &b));
    check_zeroed(&b, "a refused next");
    CHILD_REFUSES(ringfeed_loader_next(parents, -1, &b));
    CHILD_REFUSES(ringfeed_loader_stats(parents, &s));
    CHILD_REFUSES(ringfeed_loader_stats_json(parents, buf, sizeof buf, &needed));
    CHILD_REFUSES(ringfeed_loader_state(parents, buf, sizeof buf, &needed));
    CHILD_REFUSES(ringfeed_loader_arena(parents, &fd, &base, &len));
    CHILD_REFUSES(ringfeed_batch_sample_source(held, 0, buf, sizeof buf, &needed));
    CHILD_REFUSES(ringfeed_batch_node_key(held, buf, sizeof buf, &needed));
    ringfeed_batch copy = *held;
    CHILD_REFUSES(ringfeed_batch_release(&copy));
    CHECK(copy.handle == held->handle, "a refused release zeroed the batch");
    CHILD_REFUSES(ringfeed_loader_close(parents));
    CHILD_REFUSES(ringfeed_loader_next(parents, 0, &b)); /* close did not remove it */
    if (stream_own) {
        /* The library itself still works here: a loader of the child's own. */
        ringfeed_loader *own = open_small();
        CHECK(own != parents, "the child's loader has the parent's handle");
        stream_epoch(own, 0, seed, n_shards, n_samples, n_bytes, NULL);
        expect_finished(own);
        EXPECT_STATUS(ringfeed_loader_close(own), RINGFEED_OK);
    }
    fflush(stdout);
    fflush(stderr);
    _exit(0);
}

static void fork_in_the_middle(void) {
    printf("(e) fork in the middle:\n");
    ringfeed_loader *l = open_small();
    shared_keys keys = {PTHREAD_MUTEX_INITIALIZER, {0}};
    /* One batch held by the main thread across every fork. */
    ringfeed_batch held;
    EXPECT_STATUS(ringfeed_loader_next(l, -1, &held), RINGFEED_OK);
    shared_add_batch(&keys, &held);

    enum { FORKS = 12 };
    volatile int forks_done = 0;
    fork_consumer c = {l, &keys, &forks_done, FORKS};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_create(&t[i], NULL, consume_during_forks, &c) == 0, "pthread_create");
    }
    for (int i = 0; i < FORKS; i++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        CHECK(pid >= 0, "fork: %s", strerror(errno));
        if (pid == 0) {
            /* The first child also streams a loader of its own. */
            child_after_fork(l, &held, i == 0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "fork %d: the child %s %d", i, WIFEXITED(status) ? "exited with" : "died of signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        forks_done = i + 1;
    }
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_join(t[i], NULL) == 0, "pthread_join");
    }
    /* The parent's held batch is intact, and the epoch whole. */
    check_batch(&held, seed, NULL);
    EXPECT_STATUS(ringfeed_batch_release(&held), RINGFEED_OK);
    key_list_check_exactly_once(&keys.keys, n_shards, n_samples, "(e) the parent's epoch");
    expect_finished(l);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    free(keys.keys.keys);
    printf("  %d children refused the parent's loader and batch; the first streamed its own "
           "epoch; the parent's epoch is whole\n",
           FORKS);
}

int main(int argc, char **argv) {
    /* A hang is a failure: SIGALRM ends the process. Generous for valgrind. */
    alarm(240);
    read_dataset_args(argc, argv, 1, "", &seed, &n_samples, &n_bytes, &shards, &n_shards);
    consumers_race();
    double_release_race();
    close_races_next();
    two_loaders();
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer's allocator (GCC 12's libasan) takes no lock around
     * fork(): a child that allocates in a size class whose lock a parent
     * thread (a consumer, or one of the engine's) held at the fork waits
     * for ever. Seen: 1 run in 40, the child starting its own loader's
     * threads. tests/c_abi.rs runs (e) in the build without sanitizers,
     * natively and under valgrind. */
    printf("(e) fork in the middle: not under AddressSanitizer, whose allocator is not "
           "fork-safe (the build without it runs (e))\n");
    (void)fork_in_the_middle;
#else
    fork_in_the_middle();
#endif
    printf("abi_races: all checks passed\n");
    return 0;
}

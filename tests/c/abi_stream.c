/*
 * abi_stream.c — the C ABI's data path, as a C consumer sees it.
 *
 * Usage: abi_stream SEED SAMPLES BYTES SHARD...
 *   (shards from ringfeed::synth with that seed, holding SAMPLES samples and
 *   BYTES payload bytes in all; tests/c_abi.rs passes them)
 *
 * Streams the shards through several loaders (default setup, thread
 * backend over two epochs, drop_last, three consumer threads on one loader,
 * directory and brace-pattern URLs) and checks that every sample arrives
 * exactly once per epoch with the generator's bytes, that the descriptor
 * arrays are consistent, that batch indices and epochs are right, and that
 * the stats and the stats JSON agree with what was delivered.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "common.h"

#ifndef RINGFEED_EXPECTED_VERSION
#error "build with -DRINGFEED_EXPECTED_VERSION=\"x.y.z\" (the crate's version)"
#endif

static uint64_t seed, n_samples, n_bytes;
static char **shards;
static size_t n_shards;

/* Memory kept small so the test is light: 64 chunks of 1 MiB. */
#define SMALL "\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\""

/* Checks that `l` (batch indices) is 0..n-1, each once. Empties it. */
static void check_indices(key_list *l, const char *what) {
    qsort(l->keys, l->len, sizeof *l->keys, cmp_u64);
    for (size_t i = 0; i < l->len; i++) {
        CHECK(l->keys[i] == i, "%s: batch indices are not 0..%zu: sorted entry %zu is %" PRIu64,
              what, l->len - 1, i, l->keys[i]);
    }
    l->len = 0;
}

static const char *memory_kind_name(int32_t kind) {
    switch (kind) {
    case RINGFEED_MEMORY_HUGETLB: return "hugetlb";
    case RINGFEED_MEMORY_THP: return "thp";
    case RINGFEED_MEMORY_NORMAL: return "normal";
    default: FAIL("memory_kind %d is none of RINGFEED_MEMORY_*", (int)kind);
    }
}

static const char *backend_name(int32_t backend) {
    switch (backend) {
    case RINGFEED_BACKEND_IO_URING: return "io_uring";
    case RINGFEED_BACKEND_THREADS: return "threads";
    default: FAIL("io_backend %d is none of RINGFEED_BACKEND_*", (int)backend);
    }
}

/* Checks that the JSON text has `"name":value` (serde_json writes no spaces). */
static void json_has(const char *json, const char *name, const char *value) {
    char member[256];
    snprintf(member, sizeof member, "\"%s\":%s", name, value);
    CHECK(contains(json, member), "stats JSON lacks %s: %s", member, json);
}

static void json_has_u64(const char *json, const char *name, uint64_t v) {
    char value[32];
    snprintf(value, sizeof value, "%" PRIu64, v);
    json_has(json, name, value);
}

/*
 * The default setup: io backend, memory kind, locking all "auto". The main
 * check of the stats and the stats JSON.
 */
static void stream_default(void) {
    char *config = make_config(shards, n_shards, SMALL ", \"batch_size\": 7");
    ringfeed_loader *loader = open_or_die(config);
    key_list keys = {0}, indices = {0};
    uint64_t bytes = 0, batches = 0;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(loader, -1, &b);
        if (st == RINGFEED_END_OF_EPOCH) {
            check_zeroed(&b, "RINGFEED_END_OF_EPOCH");
            break;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        CHECK(b.epoch == 0, "batch %" PRIu64 " has epoch %" PRIu64 " in a one-epoch run", b.index,
              b.epoch);
        CHECK(b.sample_count <= 7, "a batch of %zu samples with batch_size 7", b.sample_count);
        bytes += check_batch(&b, seed, &keys);
        key_list_add(&indices, b.index);
        if (batches++ == 0) {
            /* While the first batch is held, its chunks are in use. */
            ringfeed_stats s;
            s.size = sizeof s;
            EXPECT_STATUS(ringfeed_loader_stats(loader, &s), RINGFEED_OK);
            CHECK(s.chunks_in_use >= 1, "a batch is held but no chunk is in use");
            CHECK(s.batches_delivered == 1, "batches_delivered %" PRIu64 " after one batch",
                  s.batches_delivered);
            CHECK(s.samples_delivered == b.sample_count && s.bytes_delivered == b.bytes,
                  "after one batch: samples_delivered %" PRIu64 ", bytes_delivered %" PRIu64
                  "; the batch has %zu and %" PRIu64,
                  s.samples_delivered, s.bytes_delivered, b.sample_count, b.bytes);
        }
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    }
    expect_finished(loader);
    key_list_check_exactly_once(&keys, n_shards, n_samples, "default setup");
    check_indices(&indices, "default setup");
    CHECK(bytes == n_bytes, "%" PRIu64 " bytes delivered, %" PRIu64 " generated", bytes, n_bytes);

    ringfeed_stats s;
    s.size = sizeof s;
    EXPECT_STATUS(ringfeed_loader_stats(loader, &s), RINGFEED_OK);
    CHECK(s.bytes_delivered == n_bytes, "bytes_delivered %" PRIu64 ", expected %" PRIu64,
          s.bytes_delivered, n_bytes);
    CHECK(s.samples_delivered == n_samples, "samples_delivered %" PRIu64 ", expected %" PRIu64,
          s.samples_delivered, n_samples);
    CHECK(s.batches_delivered == batches, "batches_delivered %" PRIu64 ", %" PRIu64 " received",
          s.batches_delivered, batches);
    CHECK(batches == (n_samples + 6) / 7, "%" PRIu64 " batches of at most 7 for %" PRIu64
          " samples: batches short before the epoch's last", batches, n_samples);
    CHECK(s.bytes_read >= n_bytes, "bytes_read %" PRIu64 " is below the payload %" PRIu64,
          s.bytes_read, n_bytes);
    CHECK(s.reads >= n_shards, "%" PRIu64 " reads for %zu shards", s.reads, n_shards);
    CHECK(s.members == 2 * n_samples, "members %" PRIu64 ", the shards hold %" PRIu64, s.members,
          2 * n_samples);
    CHECK(s.members_skipped == 0 && s.entries_skipped == 0 && s.samples_dropped == 0,
          "skipped %" PRIu64 " members, %" PRIu64 " entries, dropped %" PRIu64 " samples",
          s.members_skipped, s.entries_skipped, s.samples_dropped);
    CHECK(s.shards_total == n_shards && s.shards_done == n_shards,
          "shards_total %" PRIu64 ", shards_done %" PRIu64 ", %zu given", s.shards_total,
          s.shards_done, n_shards);
    CHECK(s.epochs_done == 1, "epochs_done %" PRIu64, s.epochs_done);
    CHECK(s.chunk_size == (1u << 20) && s.chunk_count == 64 && s.arena_bytes == (64u << 20),
          "chunk_size %" PRIu64 ", chunk_count %" PRIu64 ", arena_bytes %" PRIu64
          " for a 64 MiB budget of 1 MiB chunks",
          s.chunk_size, s.chunk_count, s.arena_bytes);
    CHECK(s.chunks_in_use == 0, "%" PRIu64 " chunks in use after every batch was released",
          s.chunks_in_use);
    CHECK(s.chunks_peak >= 1 && s.chunks_peak <= s.chunk_count, "chunks_peak %" PRIu64,
          s.chunks_peak);
    CHECK(s.bytes_copied <= n_bytes, "bytes_copied %" PRIu64 " exceeds the payload",
          s.bytes_copied);
    CHECK(s.workers >= 1, "workers %u", s.workers);
    CHECK(s.time_to_first_batch_ns > 0 && s.elapsed_ns >= s.time_to_first_batch_ns,
          "time_to_first_batch_ns %" PRIu64 ", elapsed_ns %" PRIu64, s.time_to_first_batch_ns,
          s.elapsed_ns);
    const char *kind = memory_kind_name(s.memory_kind);
    const char *backend = backend_name(s.io_backend);
    CHECK(s.memory_locked <= 1 && s.buffers_registered <= 1,
          "memory_locked %u, buffers_registered %u: not 0 or 1", s.memory_locked,
          s.buffers_registered);
    CHECK(!s.buffers_registered || s.io_backend == RINGFEED_BACKEND_IO_URING,
          "buffers registered with io_uring, but the backend is %s", backend);

    /* Too small: nothing but `needed` is written. */
    size_t needed = 0;
    EXPECT_STATUS(ringfeed_loader_stats_json(loader, NULL, 0, &needed),
                  RINGFEED_ERR_BUFFER_TOO_SMALL);
    CHECK(needed > 2, "stats JSON needs %zu bytes", needed);
    CHECK(contains(last_error(), "bytes"), "BUFFER_TOO_SMALL without a message saying the size");
    char *small = (char *)malloc(needed + 1);
    CHECK(small != NULL, "out of memory");
    memset(small, 'X', needed + 1);
    size_t needed_again = 0;
    /* `needed` bytes leave no room for the NUL. */
    EXPECT_STATUS(ringfeed_loader_stats_json(loader, small, needed, &needed_again),
                  RINGFEED_ERR_BUFFER_TOO_SMALL);
    CHECK(needed_again >= needed, "`needed` went from %zu to %zu", needed, needed_again);
    for (size_t i = 0; i <= needed; i++) {
        CHECK(small[i] == 'X', "BUFFER_TOO_SMALL wrote byte %zu of the buffer", i);
    }
    free(small);
    /* Right-sized (and `needed` may be NULL). */
    char *json = stats_json(loader);
    char roomy[1 << 16];
    EXPECT_STATUS(ringfeed_loader_stats_json(loader, roomy, sizeof roomy, NULL), RINGFEED_OK);
    CHECK(roomy[0] == '{', "stats JSON does not start with '{': %s", roomy);
    CHECK(json[0] == '{' && json[strlen(json) - 1] == '}', "stats JSON is not an object: %s", json);
    json_has_u64(json, "bytes_delivered", n_bytes);
    json_has_u64(json, "samples_delivered", n_samples);
    json_has_u64(json, "batches_delivered", batches);
    json_has_u64(json, "shards_done", n_shards);
    json_has_u64(json, "members", 2 * n_samples);
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", kind);
    json_has(json, "memory_kind", quoted);
    snprintf(quoted, sizeof quoted, "\"%s\"", backend);
    json_has(json, "io_backend", quoted);
    json_has(json, "memory_locked", s.memory_locked ? "true" : "false");
    json_has(json, "buffers_registered", s.buffers_registered ? "true" : "false");
    CHECK(contains(json, "\"notes\":["), "stats JSON has no notes array: %s", json);
    printf("default setup: %" PRIu64 " batches, memory %s%s, backend %s%s\n  %s\n", batches, kind,
           s.memory_locked ? " (locked)" : "", backend,
           s.buffers_registered ? " (registered buffers)" : "", json);
    free(json);

    EXPECT_STATUS(ringfeed_loader_close(loader), RINGFEED_OK);
    free(keys.keys);
    free(indices.keys);
    free(config);
}

/* The thread backend over two epochs: each epoch whole, markers between. */
static void stream_two_epochs_threads(void) {
    char *config = make_config(shards, n_shards,
                               SMALL ", \"io_backend\": \"threads\", \"epochs\": 2, "
                                     "\"batch_size\": 16, \"workers\": 2");
    ringfeed_loader *loader = open_or_die(config);
    key_list indices = {0};
    uint64_t batches = stream_epoch(loader, 0, seed, n_shards, n_samples, n_bytes, &indices);
    batches += stream_epoch(loader, 1, seed, n_shards, n_samples, n_bytes, &indices);
    expect_finished(loader);
    check_indices(&indices, "two epochs");
    ringfeed_stats s;
    s.size = sizeof s;
    EXPECT_STATUS(ringfeed_loader_stats(loader, &s), RINGFEED_OK);
    CHECK(s.io_backend == RINGFEED_BACKEND_THREADS, "io_backend %s with \"threads\"",
          backend_name(s.io_backend));
    CHECK(s.buffers_registered == 0, "buffers registered on the thread backend");
    CHECK(s.workers == 2, "workers %u, configured 2", s.workers);
    CHECK(s.epochs_done == 2, "epochs_done %" PRIu64 ", two epochs ran", s.epochs_done);
    CHECK(s.samples_delivered == 2 * n_samples && s.bytes_delivered == 2 * n_bytes &&
              s.batches_delivered == batches,
          "two epochs: samples_delivered %" PRIu64 ", bytes_delivered %" PRIu64
          ", batches_delivered %" PRIu64,
          s.samples_delivered, s.bytes_delivered, s.batches_delivered);
    EXPECT_STATUS(ringfeed_loader_close(loader), RINGFEED_OK);
    free(indices.keys);
    free(config);
    printf("two epochs on threads: %" PRIu64 " batches\n", batches);
}

/* drop_last: only full batches; the short rest is counted as dropped. */
static void stream_drop_last(void) {
    const uint64_t bs = 10;
    char *config =
        make_config(shards, n_shards, SMALL ", \"batch_size\": 10, \"drop_last\": true");
    ringfeed_loader *loader = open_or_die(config);
    key_list keys = {0};
    ringfeed_batch b;
    int32_t st;
    while ((st = ringfeed_loader_next(loader, -1, &b)) == RINGFEED_OK) {
        CHECK(b.sample_count == bs, "drop_last delivered a batch of %zu samples", b.sample_count);
        check_batch(&b, seed, &keys);
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    }
    EXPECT_STATUS(st, RINGFEED_END_OF_EPOCH);
    expect_finished(loader);
    ringfeed_stats s;
    s.size = sizeof s;
    EXPECT_STATUS(ringfeed_loader_stats(loader, &s), RINGFEED_OK);
    CHECK(s.samples_dropped == n_samples % bs,
          "samples_dropped %" PRIu64 "; %" PRIu64 " samples in batches of %" PRIu64
          " leave %" PRIu64,
          s.samples_dropped, n_samples, bs, n_samples % bs);
    CHECK(keys.len + s.samples_dropped == n_samples,
          "%zu delivered + %" PRIu64 " dropped != %" PRIu64 " generated", keys.len,
          s.samples_dropped, n_samples);
    /* Delivered keys are distinct and from the generated set. */
    qsort(keys.keys, keys.len, sizeof *keys.keys, cmp_u64);
    for (size_t i = 1; i < keys.len; i++) {
        CHECK(keys.keys[i] != keys.keys[i - 1], "drop_last delivered key %" PRIu64 " twice",
              keys.keys[i]);
    }
    EXPECT_STATUS(ringfeed_loader_close(loader), RINGFEED_OK);
    free(keys.keys);
    free(config);
}

/* Three threads consume one loader at once. */
struct consumer {
    ringfeed_loader *loader;
    pthread_mutex_t *lock;
    key_list *keys;
    key_list *indices;
    uint64_t bytes;
    uint64_t batches;
    int saw_end_of_epoch;
};

static void *consume(void *arg) {
    struct consumer *c = (struct consumer *)arg;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(c->loader, -1, &b);
        if (st == RINGFEED_END_OF_EPOCH) {
            c->saw_end_of_epoch = 1;
            break;
        }
        if (st == RINGFEED_FINISHED) {
            break;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        key_list mine = {0};
        c->bytes += check_batch(&b, seed, &mine);
        c->batches++;
        pthread_mutex_lock(c->lock);
        for (size_t i = 0; i < mine.len; i++) {
            key_list_add(c->keys, mine.keys[i]);
        }
        key_list_add(c->indices, b.index);
        pthread_mutex_unlock(c->lock);
        free(mine.keys);
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    }
    return NULL;
}

static void stream_three_consumers(void) {
    char *config = make_config(shards, n_shards, SMALL ", \"batch_size\": 5");
    ringfeed_loader *loader = open_or_die(config);
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    key_list keys = {0}, indices = {0};
    struct consumer c[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        c[i] = (struct consumer){loader, &lock, &keys, &indices, 0, 0, 0};
        CHECK(pthread_create(&t[i], NULL, consume, &c[i]) == 0, "pthread_create");
    }
    uint64_t bytes = 0;
    int ends = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(pthread_join(t[i], NULL) == 0, "pthread_join");
        bytes += c[i].bytes;
        ends += c[i].saw_end_of_epoch;
    }
    CHECK(ends == 1, "%d consumers saw the end of the epoch; the marker comes once", ends);
    key_list_check_exactly_once(&keys, n_shards, n_samples, "three consumers");
    check_indices(&indices, "three consumers");
    CHECK(bytes == n_bytes, "three consumers: %" PRIu64 " bytes, %" PRIu64 " generated", bytes,
          n_bytes);
    expect_finished(loader);
    EXPECT_STATUS(ringfeed_loader_close(loader), RINGFEED_OK);
    free(keys.keys);
    free(indices.keys);
    free(config);
}

/* The same shards named by their directory, and by a brace pattern. */
static void stream_other_urls(void) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", shards[0]);
    char *slash = strrchr(dir, '/');
    CHECK(slash != NULL, "shard path %s has no directory", shards[0]);
    *slash = '\0';
    char pattern[4200];
    snprintf(pattern, sizeof pattern, "%s/shard-{000000..%06zu}.tar", dir, n_shards - 1);
    char *urls[2] = {dir, pattern};
    for (int i = 0; i < 2; i++) {
        char *config = make_config(&urls[i], 1, SMALL);
        ringfeed_loader *loader = open_or_die(config);
        stream_epoch(loader, 0, seed, n_shards, n_samples, n_bytes, NULL);
        expect_finished(loader);
        EXPECT_STATUS(ringfeed_loader_close(loader), RINGFEED_OK);
        free(config);
    }
}

int main(int argc, char **argv) {
    /* A hang is a failure: SIGALRM ends the process. */
    alarm(240);
    read_dataset_args(argc, argv, 1, "", &seed, &n_samples, &n_bytes, &shards, &n_shards);

    CHECK(strcmp(ringfeed_version(), RINGFEED_EXPECTED_VERSION) == 0,
          "ringfeed_version() is \"%s\", the crate is %s", ringfeed_version(),
          RINGFEED_EXPECTED_VERSION);

    stream_default();
    stream_two_epochs_threads();
    stream_drop_last();
    stream_three_consumers();
    stream_other_urls();
    printf("abi_stream: all checks passed\n");
    return 0;
}

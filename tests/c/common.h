/*
 * common.h — helpers shared by the C ABI test programs (abi_*.c), which
 * tests/c_abi.rs builds with -Werror and ASan/UBSan and runs on shards from
 * ringfeed::synth. Every helper checks as it goes and ends the process with
 * a message naming the file, line and the library's last error on the first
 * failure, so a test program's exit status is its verdict.
 *
 * Functions are `static inline` so each program uses what it needs without
 * unused-function warnings.
 */
#ifndef RINGFEED_TEST_COMMON_H
#define RINGFEED_TEST_COMMON_H

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ringfeed.h"
#include "synth_check.h"

/* The arguments every test program takes, from argv[first] on:
 * SEED SAMPLES BYTES SHARD... (the generator's seed, the dataset's sample
 * and payload byte counts, the shard paths). `before` names the arguments
 * that come first, for the usage line. Exits 2 when they are missing. */
static inline void read_dataset_args(int argc, char **argv, int first, const char *before,
                                     uint64_t *seed, uint64_t *n_samples, uint64_t *n_bytes,
                                     char ***shards, size_t *n_shards) {
    if (argc < first + 4) {
        fprintf(stderr, "usage: %s %sSEED SAMPLES BYTES SHARD...\n", argv[0], before);
        exit(2);
    }
    *seed = strtoull(argv[first], NULL, 10);
    *n_samples = strtoull(argv[first + 1], NULL, 10);
    *n_bytes = strtoull(argv[first + 2], NULL, 10);
    *shards = argv + first + 3;
    *n_shards = (size_t)(argc - first - 3);
}

/* The calling thread's last error message (truncated to 4 KiB). */
static inline const char *last_error(void) {
    static _Thread_local char buf[4096];
    ringfeed_last_error(buf, sizeof buf);
    return buf;
}

_Noreturn static inline void fail_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: FAILED: ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n  (last error on this thread: \"%s\")\n", last_error());
    va_end(ap);
    fflush(stderr);
    exit(1);
}

#define FAIL(...) fail_at(__FILE__, __LINE__, __VA_ARGS__)

/* CHECK(condition, printf-style explanation...) */
#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: CHECK(%s)\n", __FILE__, __LINE__, #cond);     \
            fail_at(__FILE__, __LINE__, __VA_ARGS__);                             \
        }                                                                         \
    } while (0)

/* EXPECT_STATUS(call, wanted status): the call must return exactly that. */
#define EXPECT_STATUS(expr, want)                                                   \
    do {                                                                            \
        int32_t got_ = (expr);                                                      \
        if (got_ != (want)) {                                                       \
            fail_at(__FILE__, __LINE__, "%s returned %s (%d), wanted %s (%d)", #expr, \
                    ringfeed_status_name(got_), (int)got_,                          \
                    ringfeed_status_name(want), (int)(want));                       \
        }                                                                           \
    } while (0)

static inline int contains(const char *haystack, const char *needle) {
    return strstr(haystack, needle) != NULL;
}

/* Appends `s` to `out` as a JSON string literal (quotes included). */
static inline void check_error(const char *file, int line, const char *expr, int32_t got, int32_t want,
                        const char *needle) {
    if (got != want) {
        fail_at(file, line, "%s returned %s (%d), wanted %s (%d)", expr,
                ringfeed_status_name(got), (int)got, ringfeed_status_name(want), (int)want);
    }
    const char *msg = last_error();
    if (msg[0] == '\0' || contains(msg, "__prime__")) {
        fail_at(file, line, "%s returned %s but left no message of its own", expr,
                ringfeed_status_name(got));
    }
    if (ringfeed_last_error(NULL, 0) != strlen(msg)) {
        fail_at(file, line, "ringfeed_last_error(NULL, 0) is not the message length");
    }
    if (needle && !contains(msg, needle)) {
        fail_at(file, line, "%s: the message does not mention \"%s\": %s", expr, needle, msg);
    }
    printf("  %-28s %s\n", ringfeed_status_name(got), msg);
}

/* EXPECT_ERROR(call, status, text the message must contain or NULL): the
 * file defines prime(), which leaves a message of its own to tell a stale
 * one from the call's. */
#define EXPECT_ERROR(expr, want, needle)                                        \
    do {                                                                        \
        prime();                                                                \
        int32_t st_ = (expr);                                                   \
        check_error(__FILE__, __LINE__, #expr, st_, want, needle);              \
    } while (0)

static inline void write_file(const char *path, const uint8_t *data, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s: %s", path, strerror(errno));
    CHECK(len == 0 || fwrite(data, 1, len, f) == len, "cannot write %s", path);
    CHECK(fclose(f) == 0, "cannot close %s", path);
}

static inline void json_string(char *out, size_t cap, const char *s) {
    size_t n = strlen(out);
    CHECK(n + 2 < cap, "JSON buffer of %zu bytes is too small", cap);
    out[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        CHECK(n + 8 < cap, "JSON buffer of %zu bytes is too small", cap);
        if (*p == '"' || *p == '\\') {
            out[n++] = '\\';
            out[n++] = (char)*p;
        } else if (*p < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", *p);
        } else {
            out[n++] = (char)*p;
        }
    }
    out[n++] = '"';
    out[n] = '\0';
}

/*
 * A configuration: {"urls": [urls...], <extra>}. `extra` is more members of
 * the object ("\"batch_size\": 7, ..."), or "" for none. Returns a malloc'd
 * string.
 */
static inline char *make_config(char *const *urls, size_t n_urls, const char *extra) {
    size_t cap = 1024 + strlen(extra);
    for (size_t i = 0; i < n_urls; i++) {
        cap += 8 * strlen(urls[i]) + 8;
    }
    char *json = (char *)malloc(cap);
    CHECK(json != NULL, "out of memory");
    strcpy(json, "{\"urls\": [");
    for (size_t i = 0; i < n_urls; i++) {
        if (i > 0) {
            strcat(json, ", ");
        }
        json_string(json, cap, urls[i]);
    }
    strcat(json, "]");
    if (extra[0] != '\0') {
        strcat(json, ", ");
        strcat(json, extra);
    }
    strcat(json, "}");
    return json;
}

static inline ringfeed_loader *open_or_die(const char *config) {
    ringfeed_loader *loader = NULL;
    int32_t st = ringfeed_loader_open(config, &loader);
    if (st != RINGFEED_OK) {
        FAIL("ringfeed_loader_open(%s) returned %s", config, ringfeed_status_name(st));
    }
    CHECK(loader != NULL, "open succeeded but wrote a NULL handle");
    return loader;
}

/* A growable set of parsed sample keys (see synth_parse_key). */
typedef struct key_list {
    uint64_t *keys;
    size_t len, cap;
} key_list;

static inline void key_list_add(key_list *l, uint64_t key) {
    if (l->len == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->keys = (uint64_t *)realloc(l->keys, l->cap * sizeof *l->keys);
        CHECK(l->keys != NULL, "out of memory");
    }
    l->keys[l->len++] = key;
}

static inline int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/*
 * Checks that `l` holds every key the generator wrote, exactly once: keys
 * of shards 0..n_shards-1, each shard's samples numbered 0..m-1 without a
 * gap, `expected` keys in all. Empties the list.
 */
static inline void key_list_check_exactly_once(key_list *l, size_t n_shards, uint64_t expected,
                                               const char *what) {
    CHECK(l->len == expected, "%s: %zu samples delivered, %" PRIu64 " generated", what, l->len,
          expected);
    qsort(l->keys, l->len, sizeof *l->keys, cmp_u64);
    uint64_t shard = 0, next_sample = 0;
    for (size_t i = 0; i < l->len; i++) {
        uint64_t s = l->keys[i] / 10000000, j = l->keys[i] % 10000000;
        if (s != shard) {
            CHECK(s == shard + 1 && next_sample > 0,
                  "%s: after shard %" PRIu64 " (%" PRIu64 " samples) comes shard %" PRIu64
                  " sample %" PRIu64 ": a shard is missing or empty",
                  what, shard, next_sample, s, j);
            shard = s;
            next_sample = 0;
        }
        CHECK(j == next_sample,
              "%s: shard %" PRIu64 ": sample %" PRIu64 " where %" PRIu64
              " was due (%s)",
              what, s, j, next_sample, j < next_sample ? "delivered twice" : "one is missing");
        next_sample++;
    }
    CHECK(l->len == 0 || shard + 1 == n_shards, "%s: keys of %" PRIu64 " shards, %zu given", what,
          shard + 1, n_shards);
    l->len = 0;
}

/*
 * Checks one delivered batch: descriptor arrays consistent with each other,
 * keys and field names well formed, every field's bytes exactly the
 * generator's. Adds its keys to `keys` (if not NULL). Returns the payload
 * bytes it holds.
 */
static inline uint64_t check_batch(const ringfeed_batch *b, uint64_t seed, key_list *keys) {
    CHECK(b->handle != 0, "a delivered batch has handle 0");
    CHECK(b->sample_count > 0, "batch %" PRIu64 " has no samples", b->index);
    CHECK(b->samples != NULL && b->fields != NULL, "batch %" PRIu64 " has NULL arrays", b->index);
    uint64_t bytes = 0;
    size_t field_index = 0;
    for (size_t i = 0; i < b->sample_count; i++) {
        const ringfeed_sample *s = &b->samples[i];
        CHECK(s->key != NULL, "sample %zu has a NULL key", i);
        uint64_t parsed;
        CHECK(synth_parse_key(s->key, &parsed), "sample %zu has key \"%s\", not a synth key", i,
              s->key);
        if (keys) {
            key_list_add(keys, parsed);
        }
        /* The batch's fields array holds every sample's fields in order. */
        CHECK(s->fields == b->fields + field_index,
              "sample %s: fields at entry %td of the batch's array, expected %zu", s->key,
              s->fields - b->fields, field_index);
        CHECK(s->field_count == 2, "sample %s has %zu fields, the generator wrote 2 (jpg, cls)",
              s->key, s->field_count);
        int seen_jpg = 0, seen_cls = 0;
        for (size_t k = 0; k < s->field_count; k++) {
            const ringfeed_field *f = &s->fields[k];
            CHECK(f->name != NULL && f->data != NULL, "sample %s field %zu: NULL name or data",
                  s->key, k);
            if (strcmp(f->name, "jpg") == 0) {
                seen_jpg++;
                /* sample_bytes 20000, spread 0.5 in tests/c_abi.rs */
                CHECK(f->len >= 10000 && f->len <= 30000, "sample %s: jpg of %zu bytes", s->key,
                      f->len);
            } else if (strcmp(f->name, "cls") == 0) {
                seen_cls++;
                CHECK(f->len >= 8 && f->len <= 64, "sample %s: cls of %zu bytes", s->key, f->len);
            } else {
                FAIL("sample %s has a field named \"%s\"", s->key, f->name);
            }
            CHECK(synth_verify(seed, s->key, f->name, f->data, f->len),
                  "sample %s field %s: the %zu bytes differ from what was written", s->key,
                  f->name, f->len);
            bytes += f->len;
        }
        CHECK(seen_jpg == 1 && seen_cls == 1, "sample %s: jpg %d times, cls %d times", s->key,
              seen_jpg, seen_cls);
        field_index += s->field_count;
    }
    CHECK(field_index == b->field_count,
          "batch %" PRIu64 ": samples hold %zu fields, field_count %zu", b->index, field_index,
          b->field_count);
    CHECK(bytes == b->bytes,
          "batch %" PRIu64 ": fields hold %" PRIu64 " bytes, `bytes` says %" PRIu64, b->index,
          bytes, b->bytes);
    return bytes;
}

static inline void check_zeroed(const ringfeed_batch *b, const char *after) {
    CHECK(b->handle == 0 && b->epoch == 0 && b->index == 0 && b->bytes == 0 &&
              b->sample_count == 0 && b->samples == NULL && b->field_count == 0 &&
              b->fields == NULL,
          "the batch struct is not zeroed after %s", after);
}

/*
 * Streams one epoch of a loader whose batches come from synth shards:
 * every batch checked and released, then RINGFEED_END_OF_EPOCH. Checks the
 * epoch held every generated sample exactly once and `expected_bytes`.
 * Appends each batch's `index` to `indices` (if not NULL). Returns the
 * number of batches.
 */
static inline uint64_t stream_epoch(ringfeed_loader *loader, uint64_t epoch, uint64_t seed,
                                    size_t n_shards, uint64_t expected_samples,
                                    uint64_t expected_bytes, key_list *indices) {
    key_list keys = {0};
    uint64_t bytes = 0, batches = 0;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(loader, -1, &b);
        if (st == RINGFEED_END_OF_EPOCH) {
            check_zeroed(&b, "RINGFEED_END_OF_EPOCH");
            break;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        CHECK(b.epoch == epoch, "batch %" PRIu64 " of epoch %" PRIu64 " arrived in epoch %" PRIu64,
              b.index, b.epoch, epoch);
        bytes += check_batch(&b, seed, &keys);
        if (indices) {
            key_list_add(indices, b.index);
        }
        batches++;
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
        check_zeroed(&b, "ringfeed_batch_release");
    }
    char what[64];
    snprintf(what, sizeof what, "epoch %" PRIu64, epoch);
    key_list_check_exactly_once(&keys, n_shards, expected_samples, what);
    CHECK(bytes == expected_bytes, "%s: %" PRIu64 " payload bytes delivered, %" PRIu64 " generated",
          what, bytes, expected_bytes);
    free(keys.keys);
    return batches;
}

/* Expects RINGFEED_FINISHED now and on a second call, with `*out` zeroed. */
static inline void expect_finished(ringfeed_loader *loader) {
    for (int i = 0; i < 2; i++) {
        ringfeed_batch b;
        memset(&b, 0xab, sizeof b);
        EXPECT_STATUS(ringfeed_loader_next(loader, -1, &b), RINGFEED_FINISHED);
        check_zeroed(&b, "RINGFEED_FINISHED");
    }
}

/* The loader's stats JSON, malloc'd; sized by asking first. */
static inline char *stats_json(ringfeed_loader *loader) {
    size_t needed = 0;
    EXPECT_STATUS(ringfeed_loader_stats_json(loader, NULL, 0, &needed),
                  RINGFEED_ERR_BUFFER_TOO_SMALL);
    for (int attempt = 0; attempt < 8; attempt++) {
        /* Counters (elapsed_ns) may gain a digit between calls: retry. */
        size_t len = needed + 1;
        char *buf = (char *)malloc(len);
        CHECK(buf != NULL, "out of memory");
        int32_t st = ringfeed_loader_stats_json(loader, buf, len, &needed);
        if (st == RINGFEED_OK) {
            CHECK(strlen(buf) == needed, "stats JSON of %zu bytes, `needed` says %zu",
                  strlen(buf), needed);
            return buf;
        }
        EXPECT_STATUS(st, RINGFEED_ERR_BUFFER_TOO_SMALL);
        CHECK(needed >= len, "BUFFER_TOO_SMALL with %zu bytes, but `needed` is %zu", len, needed);
        free(buf);
    }
    FAIL("the stats JSON kept growing");
}

#endif /* RINGFEED_TEST_COMMON_H */

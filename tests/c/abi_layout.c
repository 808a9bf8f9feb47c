/*
 * abi_layout.c — what a consumer that reads batches with array operations
 * relies on: the layout rules of ringfeed_batch (keys one after the other,
 * one name pointer per field name), each sample's shard
 * (ringfeed_batch_sample_source), a shared arena mapped a second time
 * (ringfeed_loader_arena, as a consumer in another process maps it), and
 * packing fields with ringfeed_gather; then every misuse of those entry
 * points gives its status and a message, and nothing crashes.
 *
 * Usage: abi_layout SEED SAMPLES BYTES SHARD...
 */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

static uint64_t seed, n_samples, n_bytes;
static char **shards;
static size_t n_shards;

#define SMALL "\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\""

/* The shard index a synth key starts with ("000003-0000012" -> 3). */
static size_t shard_of_key(const char *key) {
    return (size_t)strtoull(key, NULL, 10);
}

static void check_layout(const ringfeed_batch *b) {
    for (size_t i = 0; i + 1 < b->sample_count; i++) {
        const char *k = b->samples[i].key;
        CHECK(b->samples[i + 1].key == k + strlen(k) + 1,
              "batch %" PRIu64 ": key %zu does not follow key %zu", b->index, i + 1, i);
    }
    for (size_t i = 0; i < b->field_count; i++) {
        for (size_t j = 0; j < i; j++) {
            int same_text = strcmp(b->fields[i].name, b->fields[j].name) == 0;
            int same_ptr = b->fields[i].name == b->fields[j].name;
            CHECK(same_text == same_ptr, "batch %" PRIu64 ": fields %zu and %zu: \"%s\" and \"%s\"",
                  b->index, j, i, b->fields[j].name, b->fields[i].name);
        }
    }
}

static void check_sources(const ringfeed_batch *b) {
    char buf[4096];
    for (size_t i = 0; i < b->sample_count; i++) {
        size_t needed = 0;
        EXPECT_STATUS(ringfeed_batch_sample_source(b, i, buf, sizeof buf, &needed), RINGFEED_OK);
        size_t s = shard_of_key(b->samples[i].key);
        CHECK(s < n_shards && strcmp(buf, shards[s]) == 0,
              "sample %s: source \"%s\", wanted \"%s\"", b->samples[i].key, buf,
              s < n_shards ? shards[s] : "?");
        CHECK(needed == strlen(buf), "needed %zu for \"%s\"", needed, buf);
    }
}

/* Packs field `name` of every sample with ringfeed_gather over the span
 * from the lowest to the highest byte, and compares with the fields. */
static void check_gather(const ringfeed_batch *b, const char *name) {
    const uint8_t *lo = NULL, *hi = NULL;
    size_t n = 0, total = 0;
    for (size_t i = 0; i < b->field_count; i++) {
        const ringfeed_field *f = &b->fields[i];
        if (strcmp(f->name, name) != 0) continue;
        if (lo == NULL || f->data < lo) lo = f->data;
        if (hi == NULL || f->data + f->len > hi) hi = f->data + f->len;
        n++;
        total += f->len;
    }
    CHECK(n > 0, "no field %s in batch %" PRIu64, name, b->index);
    int64_t *starts = (int64_t *)calloc(n, sizeof *starts);
    int64_t *lengths = (int64_t *)calloc(n, sizeof *lengths);
    uint8_t *out = (uint8_t *)malloc(total + 1);
    CHECK(starts && lengths && out, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < b->field_count; i++) {
        const ringfeed_field *f = &b->fields[i];
        if (strcmp(f->name, name) != 0) continue;
        starts[k] = (int64_t)(f->data - lo);
        lengths[k++] = (int64_t)f->len;
    }
    EXPECT_STATUS(ringfeed_gather(lo, (size_t)(hi - lo), starts, lengths, n, out, total),
                  RINGFEED_OK);
    size_t at = 0;
    for (size_t i = 0; i < b->field_count; i++) {
        const ringfeed_field *f = &b->fields[i];
        if (strcmp(f->name, name) != 0) continue;
        CHECK(memcmp(out + at, f->data, f->len) == 0, "gathered field %zu differs", i);
        at += f->len;
    }
    free(starts);
    free(lengths);
    free(out);
}

static void layout_sources_and_gather(void) {
    printf("layout, sources and gather:\n");
    const char *extras[] = {
        SMALL ", \"batch_size\": 7, \"workers\": 3",
        SMALL ", \"batch_size\": 5, \"workers\": 2, \"shuffle_buffer\": 30, \"seed\": 4",
    };
    for (size_t e = 0; e < sizeof extras / sizeof extras[0]; e++) {
        char *config = make_config(shards, n_shards, extras[e]);
        ringfeed_loader *l = open_or_die(config);
        key_list keys = {0};
        ringfeed_batch b;
        int32_t st;
        while ((st = ringfeed_loader_next(l, 30000, &b)) == RINGFEED_OK) {
            check_batch(&b, seed, &keys);
            check_layout(&b);
            check_sources(&b);
            check_gather(&b, "jpg");
            EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
        }
        CHECK(st == RINGFEED_END_OF_EPOCH, "stream ended with %s", ringfeed_status_name(st));
        key_list_check_exactly_once(&keys, n_shards, n_samples, config);
        printf("  %s: %zu samples\n", extras[e], keys.len);
        free(keys.keys);
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
        free(config);
    }
}

/* A shared arena mapped a second time shows every batch's bytes at the
 * same offset; a private one is refused with RINGFEED_ERR_CONFIG. */
static void shared_arena(void) {
    printf("shared arena:\n");
    char *config = make_config(shards, n_shards, SMALL);
    ringfeed_loader *l = open_or_die(config);
    int32_t fd = -1;
    const uint8_t *base = NULL;
    uint64_t len = 0;
    EXPECT_STATUS(ringfeed_loader_arena(l, &fd, &base, &len), RINGFEED_ERR_CONFIG);
    CHECK(contains(last_error(), "shared_arena"), "the message does not name shared_arena");
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    free(config);

    config = make_config(shards, n_shards, SMALL ", \"shared_arena\": true");
    l = open_or_die(config);
    EXPECT_STATUS(ringfeed_loader_arena(l, &fd, &base, &len), RINGFEED_OK);
    CHECK(fd >= 0 && base != NULL && len >= (64u << 20), "arena fd %d base %p len %" PRIu64, fd,
          (const void *)base, len);
    const uint8_t *again =
        (const uint8_t *)mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(again != MAP_FAILED, "mmap of the arena's memory file failed");
    CHECK(again != base, "the second mapping is at another address");
    key_list keys = {0};
    ringfeed_batch b;
    int32_t st;
    while ((st = ringfeed_loader_next(l, 30000, &b)) == RINGFEED_OK) {
        check_batch(&b, seed, &keys);
        for (size_t i = 0; i < b.field_count; i++) {
            const ringfeed_field *f = &b.fields[i];
            CHECK(f->data >= base && f->data + f->len <= base + len, "field outside the arena");
            CHECK(memcmp(again + (f->data - base), f->data, f->len) == 0,
                  "the second mapping differs at field %zu of batch %" PRIu64, i, b.index);
        }
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    }
    CHECK(st == RINGFEED_END_OF_EPOCH, "stream ended with %s", ringfeed_status_name(st));
    key_list_check_exactly_once(&keys, n_shards, n_samples, config);
    printf("  %zu samples read through a second mapping\n", keys.len);
    free(keys.keys);
    munmap((void *)again, (size_t)len);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    free(config);
}

static void misuse(void) {
    printf("misuse:\n");
    char *config = make_config(shards, n_shards, SMALL ", \"shared_arena\": true");
    ringfeed_loader *l = open_or_die(config);
    ringfeed_batch b;
    EXPECT_STATUS(ringfeed_loader_next(l, 30000, &b), RINGFEED_OK);
    char buf[64];
    size_t needed = 0;

    /* sample_source */
    EXPECT_STATUS(ringfeed_batch_sample_source(NULL, 0, buf, sizeof buf, &needed),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "batch"), "%s", last_error());
    EXPECT_STATUS(ringfeed_batch_sample_source(&b, b.sample_count, buf, sizeof buf, &needed),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "past the batch"), "%s", last_error());
    EXPECT_STATUS(ringfeed_batch_sample_source(&b, 0, buf, 3, &needed),
                  RINGFEED_ERR_BUFFER_TOO_SMALL);
    CHECK(needed == strlen(shards[shard_of_key(b.samples[0].key)]), "needed %zu", needed);
    EXPECT_STATUS(ringfeed_batch_sample_source(&b, 0, NULL, sizeof buf, NULL),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    ringfeed_batch forged = b;
    forged.handle = 0xfeedface;
    EXPECT_STATUS(ringfeed_batch_sample_source(&forged, 0, buf, sizeof buf, NULL),
                  RINGFEED_ERR_INVALID_HANDLE);
    ringfeed_batch copy = b;
    EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_batch_sample_source(&copy, 0, buf, sizeof buf, NULL),
                  RINGFEED_ERR_INVALID_HANDLE);
    CHECK(contains(last_error(), "not held"), "%s", last_error());

    /* loader_arena */
    int32_t fd;
    const uint8_t *base;
    uint64_t len;
    EXPECT_STATUS(ringfeed_loader_arena(l, NULL, &base, &len), RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_loader_arena(l, &fd, NULL, &len), RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_loader_arena(l, &fd, &base, NULL), RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_loader_arena((ringfeed_loader *)(uintptr_t)0x1230, &fd, &base, &len),
                  RINGFEED_ERR_INVALID_HANDLE);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_loader_arena(l, &fd, &base, &len), RINGFEED_ERR_INVALID_HANDLE);

    /* gather */
    uint8_t src[100], dst[100];
    for (int i = 0; i < 100; i++) src[i] = (uint8_t)i;
    int64_t starts[3] = {10, 50, 0}, lengths[3] = {5, 10, 3};
    EXPECT_STATUS(ringfeed_gather(src, 100, starts, lengths, 3, dst, 18), RINGFEED_OK);
    CHECK(dst[0] == 10 && dst[5] == 50 && dst[15] == 0 && dst[17] == 2, "gathered wrong bytes");
    EXPECT_STATUS(ringfeed_gather(NULL, 0, NULL, NULL, 0, NULL, 0), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_gather(NULL, 100, starts, lengths, 3, dst, 100),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_gather(src, 100, NULL, lengths, 3, dst, 100),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_gather(src, 100, starts, NULL, 3, dst, 100),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_gather(src, 100, starts, lengths, 3, NULL, 100),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_gather(src, 100, starts, lengths, 3, dst, 17),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "destination"), "%s", last_error());
    int64_t past[1] = {95}, ten[1] = {10}, neg[1] = {-1}, huge[1] = {INT64_MAX};
    EXPECT_STATUS(ringfeed_gather(src, 100, past, ten, 1, dst, 100), RINGFEED_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "not inside"), "%s", last_error());
    EXPECT_STATUS(ringfeed_gather(src, 100, neg, ten, 1, dst, 100), RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_gather(src, 100, ten, neg, 1, dst, 100), RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_gather(src, 100, huge, ten, 1, dst, 100), RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_gather(src, 100, ten, huge, 1, dst, 100), RINGFEED_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ringfeed_gather(src, 100, starts, lengths, 1, src + 50, 50),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "overlap"), "%s", last_error());
    free(config);
}

int main(int argc, char **argv) {
    alarm(240);
    read_dataset_args(argc, argv, 1, "", &seed, &n_samples, &n_bytes, &shards, &n_shards);
    layout_sources_and_gather();
    shared_arena();
    misuse();
    printf("abi_layout: all checks passed\n");
    return 0;
}

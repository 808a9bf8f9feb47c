/*
 * abi_transform.c — a loader with the image pipeline (`transform`), read
 * from C as the header describes it: each sample's image field points at
 * its row of one contiguous tensor (sample i's row right after sample
 * i-1's, each 8 x 6 x 3 bytes here), each label field at 8 bytes of an
 * int64 array; a broken image is left out (`image_errors` "skip") and
 * counted in `ringfeed_stats.images_skipped`. Prints one line per sample,
 * "KEY HASH LABEL" (HASH: FNV-1a of the image row), which tests/c_abi.rs
 * compares with what the Rust loader of the same configuration gives.
 *
 * Usage: abi_transform SKIPPED SHARD...   (SKIPPED: the images left out)
 */
#include "common.h"

#define ROW (8 * 6 * 3)

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 1099511628211ULL;
    }
    return h;
}

/* The field named `name` of sample `s`, or NULL. */
static const ringfeed_field *field(const ringfeed_sample *s, const char *name) {
    for (size_t f = 0; f < s->field_count; f++) {
        if (strcmp(s->fields[f].name, name) == 0) {
            return &s->fields[f];
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SKIPPED SHARD...\n", argv[0]);
        return 2;
    }
    uint64_t skipped = strtoull(argv[1], NULL, 10);
    char *config = make_config(argv + 2, (size_t)(argc - 2),
                               "\"batch_size\": 5, \"seed\": 3, \"shuffle\": true, \"workers\": 2, "
                               "\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\", "
                               "\"pin_cpus\": false, \"image_errors\": \"skip\", "
                               "\"transform\": {\"png\": {\"resize\": [8, 6], \"flip\": 0.5, "
                               "\"layout\": \"hwc\"}, \"cls\": \"int64\"}");
    ringfeed_loader *loader = open_or_die(config);
    free(config);
    uint64_t samples = 0;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(loader, 60000, &b);
        if (st == RINGFEED_FINISHED) {
            break;
        }
        if (st == RINGFEED_END_OF_EPOCH) {
            continue;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        const uint8_t *first = NULL;
        const uint8_t *first_label = NULL;
        for (size_t i = 0; i < b.sample_count; i++) {
            const ringfeed_sample *s = &b.samples[i];
            const ringfeed_field *img = field(s, "png");
            const ringfeed_field *cls = field(s, "cls");
            CHECK(img != NULL && cls != NULL, "sample %s lacks a field", s->key);
            CHECK(img->len == ROW, "sample %s: an image of %zu bytes", s->key, img->len);
            CHECK(cls->len == 8, "sample %s: a label of %zu bytes", s->key, cls->len);
            if (i == 0) {
                first = img->data;
                first_label = cls->data;
            }
            /* One tensor, one label array: the batch read as arrays. */
            CHECK(img->data == first + i * ROW, "sample %zu's image is not row %zu", i, i);
            CHECK(cls->data == first_label + i * 8, "sample %zu's label is not entry %zu", i, i);
            int64_t label;
            memcpy(&label, cls->data, 8);
            printf("%s %016" PRIx64 " %" PRId64 "\n", s->key, fnv1a(img->data, img->len), label);
            samples++;
        }
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    }
    ringfeed_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.size = sizeof stats;
    EXPECT_STATUS(ringfeed_loader_stats(loader, &stats), RINGFEED_OK);
    CHECK(stats.images_skipped == skipped, "images_skipped %" PRIu64 ", wanted %" PRIu64,
          stats.images_skipped, skipped);
    CHECK(stats.samples_delivered == samples, "samples_delivered %" PRIu64 ", counted %" PRIu64,
          stats.samples_delivered, samples);
    EXPECT_STATUS(ringfeed_loader_close(loader), RINGFEED_OK);
    printf("abi_transform: all checks passed\n");
    return 0;
}

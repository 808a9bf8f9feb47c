/*
 * abi_epochs.c — epochs through the C ABI: splitting among consumers,
 * resume states and elastic resume, as a C trainer uses them.
 *
 * Usage: abi_epochs SEED SAMPLES BYTES SHARD...
 *   (shards from ringfeed::synth; tests/c_abi.rs passes them)
 *
 * - Three consumers (world_size 3) with a shuffle: each yields the same
 *   number of batches, together every sample at least once, and the repeats
 *   are exactly the padding the stats report.
 * - A consumer cut after k batches and reopened with its state delivers
 *   exactly the rest of the uninterrupted order (for several k).
 * - Three consumers cut at different points resume as two (elastic): no
 *   sample is lost.
 * - Bad states are named errors.
 */
#include "common.h"

static uint64_t seed, n_samples, n_bytes;
static char **shards;
static size_t n_shards;

#define SETUP                                                                              \
    "\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\", \"batch_size\": 6, "        \
    "\"shuffle\": true, \"shuffle_buffer\": 40"

/* Checks that an snprintf result fit its buffer (a state can grow). */
static void fits(int n, size_t cap, const char *what) {
    CHECK(n >= 0 && (size_t)n < cap, "%s: %d bytes do not fit %zu", what, n, cap);
}

/* One epoch's keys in delivery order (at most `limit` batches; the loader
 * is left mid-epoch then). Returns the batches taken. */
static size_t take(ringfeed_loader *l, size_t limit, key_list *keys) {
    size_t batches = 0;
    while (batches < limit) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(l, 30000, &b);
        if (st == RINGFEED_END_OF_EPOCH || st == RINGFEED_FINISHED) {
            break;
        }
        CHECK(st == RINGFEED_OK, "next: %s", ringfeed_status_name(st));
        check_batch(&b, seed, keys);
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
        batches++;
    }
    return batches;
}

static char *config_for(int world, int rank, int workers, const char *resume_json) {
    char extra[8192];
    fits(snprintf(extra, sizeof extra,
             SETUP ", \"seed\": 17, \"world_size\": %d, \"rank\": %d, \"workers\": %d%s%s",
             world, rank, workers, resume_json ? ", \"resume\": " : "",
             resume_json ? resume_json : ""), sizeof extra, "extra");
    return make_config(shards, n_shards, extra);
}

/* The loader's state as a malloc'd string, checking the buffer protocol. */
static char *state_of(ringfeed_loader *l) {
    size_t needed = 0;
    char tiny[4];
    EXPECT_STATUS(ringfeed_loader_state(l, tiny, sizeof tiny, &needed),
                  RINGFEED_ERR_BUFFER_TOO_SMALL);
    CHECK(needed > 16 && needed < 1024, "a state of %zu bytes", needed);
    char *s = (char *)malloc(needed + 1);
    CHECK(s != NULL, "out of memory");
    EXPECT_STATUS(ringfeed_loader_state(l, s, needed + 1, NULL), RINGFEED_OK);
    CHECK(strlen(s) == needed, "state length %zu, said %zu", strlen(s), needed);
    return s;
}

static int count_of(const key_list *l, uint64_t key) {
    int n = 0;
    for (size_t i = 0; i < l->len; i++) {
        n += l->keys[i] == key;
    }
    return n;
}

static void split_three_ways(void) {
    key_list all = {0};
    size_t lengths[3];
    uint64_t padded = 0;
    for (int r = 0; r < 3; r++) {
        char *config = config_for(3, r, 2, NULL);
        ringfeed_loader *l = open_or_die(config);
        lengths[r] = take(l, SIZE_MAX, &all);
        ringfeed_stats st;
        st.size = sizeof st;
        EXPECT_STATUS(ringfeed_loader_stats(l, &st), RINGFEED_OK);
        CHECK(st.consumers == 3 && st.consumer == (uint64_t)r, "layout %" PRIu64 "/%" PRIu64,
              st.consumer, st.consumers);
        padded += st.samples_padded;
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
        free(config);
    }
    CHECK(lengths[0] == lengths[1] && lengths[1] == lengths[2],
          "batches per consumer differ: %zu %zu %zu", lengths[0], lengths[1], lengths[2]);
    CHECK(all.len == n_samples + padded, "%zu delivered, %" PRIu64 " + %" PRIu64 " padded",
          all.len, n_samples, padded);
    CHECK(padded < 3, "%" PRIu64 " pads for 3 consumers", padded);
    /* Without the pads, every sample exactly once. */
    qsort(all.keys, all.len, sizeof *all.keys, cmp_u64);
    size_t w = 0;
    for (size_t i = 0; i < all.len; i++) {
        if (w == 0 || all.keys[w - 1] != all.keys[i]) {
            all.keys[w++] = all.keys[i];
        }
    }
    CHECK(all.len - w == padded, "%zu repeats, %" PRIu64 " pads", all.len - w, padded);
    all.len = w;
    key_list_check_exactly_once(&all, n_shards, n_samples, "3 consumers");
    free(all.keys);
    printf("  3 consumers: %zu batches each, %" PRIu64 " padded\n", lengths[0], padded);
}

static void resume_exactly(void) {
    key_list full = {0};
    char *config = config_for(3, 1, 2, NULL);
    ringfeed_loader *l = open_or_die(config);
    size_t n = take(l, SIZE_MAX, &full);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    size_t cuts[] = {0, 1, n / 2, n - 1};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        key_list again = {0};
        l = open_or_die(config);
        take(l, cuts[c], &again);
        char *state = state_of(l);
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
        char quoted[2048];
        fits(snprintf(quoted, sizeof quoted, "\"%s\"", state), sizeof quoted, "quoted");
        char *resumed = config_for(3, 1, 2, quoted);
        l = open_or_die(resumed);
        take(l, SIZE_MAX, &again);
        ringfeed_stats st;
        st.size = sizeof st;
        EXPECT_STATUS(ringfeed_loader_stats(l, &st), RINGFEED_OK);
        CHECK(st.batches_skipped == cuts[c], "skipped %" PRIu64 " batches, cut at %zu",
              st.batches_skipped, cuts[c]);
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
        CHECK(again.len == full.len, "cut at %zu: %zu samples, uninterrupted %zu", cuts[c],
              again.len, full.len);
        for (size_t i = 0; i < full.len; i++) {
            CHECK(again.keys[i] == full.keys[i],
                  "cut at %zu: sample %zu is %" PRIu64 ", uninterrupted %" PRIu64, cuts[c], i,
                  again.keys[i], full.keys[i]);
        }
        free(again.keys);
        free(resumed);
        free(state);
    }
    free(full.keys);
    free(config);
    printf("  resume: the rest of the epoch matches at %zu cut points\n",
           sizeof cuts / sizeof *cuts);
}

static void elastic_three_to_two(void) {
    key_list seen = {0};
    char states[3][1024];
    size_t cut[3] = {1, 4, 2};
    for (int r = 0; r < 3; r++) {
        char *config = config_for(3, r, 2, NULL);
        ringfeed_loader *l = open_or_die(config);
        take(l, cut[r], &seen);
        char *s = state_of(l);
        fits(snprintf(states[r], sizeof states[r], "%s", s), sizeof states[r], "states[r]");
        free(s);
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
        free(config);
    }
    char list[4096];
    fits(snprintf(list, sizeof list, "[\"%s\", \"%s\", \"%s\"]", states[0], states[1], states[2]), sizeof list, "list");
    for (int r = 0; r < 2; r++) {
        char *config = config_for(2, r, 1, list);
        ringfeed_loader *l = open_or_die(config);
        take(l, SIZE_MAX, &seen);
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
        free(config);
    }
    /* Every generated sample appears. */
    key_list distinct = {0};
    for (size_t i = 0; i < seen.len; i++) {
        if (count_of(&distinct, seen.keys[i]) == 0) {
            key_list_add(&distinct, seen.keys[i]);
        }
    }
    CHECK(seen.len - distinct.len <= 3, "%zu repeats after an elastic resume",
          seen.len - distinct.len);
    key_list_check_exactly_once(&distinct, n_shards, n_samples, "elastic 3 -> 2");
    free(distinct.keys);
    free(seen.keys);
    printf("  elastic: 3 consumers cut at 1/4/2 batches resumed as 2, nothing lost\n");
}

static void bad_states(void) {
    ringfeed_loader *l = NULL;
    char *config = config_for(1, 0, 2, "\"not hex\"");
    EXPECT_STATUS(ringfeed_loader_open(config, &l), RINGFEED_ERR_CONFIG);
    CHECK(contains(last_error(), "resume"), "message: %s", last_error());
    free(config);
    config = config_for(1, 0, 2, "\"5246535401000000\"");
    EXPECT_STATUS(ringfeed_loader_open(config, &l), RINGFEED_ERR_CONFIG);
    CHECK(contains(last_error(), "truncated"), "message: %s", last_error());
    free(config);
    /* A state of another seed. */
    config = config_for(1, 0, 2, NULL);
    l = open_or_die(config);
    key_list k = {0};
    take(l, 1, &k);
    char *s = state_of(l);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    free(config);
    char extra[2048];
    fits(snprintf(extra, sizeof extra, SETUP ", \"seed\": 18, \"workers\": 2, \"resume\": \"%s\"",
             s), sizeof extra, "extra");
    config = make_config(shards, n_shards, extra);
    l = NULL;
    EXPECT_STATUS(ringfeed_loader_open(config, &l), RINGFEED_ERR_STATE);
    CHECK(contains(last_error(), "other epoch settings"), "message: %s", last_error());
    CHECK(l == NULL, "a failed open wrote a handle");
    EXPECT_STATUS(ringfeed_loader_state(NULL, extra, sizeof extra, NULL),
                  RINGFEED_ERR_INVALID_ARGUMENT);
    /* A NULL buffer said to be large is refused, not written through. */
    char *plain = config_for(1, 0, 2, NULL);
    l = open_or_die(plain);
    EXPECT_STATUS(ringfeed_loader_state(l, NULL, 4096, NULL), RINGFEED_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "buf"), "message: %s", last_error());
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    free(plain);
    EXPECT_STATUS(ringfeed_loader_state((ringfeed_loader *)(uintptr_t)0x5151, extra, sizeof extra,
                                        NULL),
                  RINGFEED_ERR_INVALID_HANDLE);
    free(config);
    free(s);
    free(k.keys);
}

int main(int argc, char **argv) {
    read_dataset_args(argc, argv, 1, "", &seed, &n_samples, &n_bytes, &shards, &n_shards);
    split_three_ways();
    resume_exactly();
    elastic_three_to_two();
    bad_states();
    printf("abi_epochs: all checks passed\n");
    return 0;
}

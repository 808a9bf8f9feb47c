/*
 * abi_node.c — a C consumer attached to a node engine: the same entry
 * points as an engine of its own, with `"node": SOCKET` in the
 * configuration.
 *
 * Usage: abi_node SOCKET MODE SEED SAMPLES BYTES SHARD...
 *   SOCKET: where the engine listens (tests/c_abi.rs serves one from a
 *   thread, with the dataset keys this program's configuration gives);
 *   MODE:
 *   - stream: every batch of the epoch, every field's bytes checked against
 *     the generator, batches held in a window and released out of order
 *     (each checked again just before its release: a held batch must not
 *     change while the engine fills others), the stats and stats JSON
 *     (with its `node` member), each sample's shard, the resume state, the
 *     first batch's key kept for this process and released;
 *   - crash: takes a few batches and kills itself with SIGKILL without
 *     releasing or closing anything, as a consumer that crashes does; the
 *     test then checks that the engine took those batches back.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <unistd.h>

#include "common.h"

#ifndef RINGFEED_EXPECTED_VERSION
#error "build with -DRINGFEED_EXPECTED_VERSION=\"x.y.z\" (the crate's version)"
#endif

static uint64_t seed, n_samples, n_bytes;
static char **shards;
static size_t n_shards;
static const char *socket_path;

/* The keys tests/c_abi.rs gives the engine: the dataset and layout keys must
 * agree, or the engine refuses the consumer naming the key. */
#define JOB "\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\", \"batch_size\": 7"

/* Batches held at once before the window is released, newest first. */
#define WINDOW 4

/* Batches the crash mode takes (and never releases). */
#define CRASH_HELD 3

static char *node_config(void) {
    char extra[4096 + 256] = JOB ", \"node\": ";
    json_string(extra, sizeof extra, socket_path);
    return make_config(shards, n_shards, extra);
}

/* The shard index a synth key starts with ("000003-0000012" -> 3). */
static size_t shard_of_key(const char *key) {
    return (size_t)strtoull(key, NULL, 10);
}

/* Each sample's shard, asked of the engine: the name its configuration gave. */
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
    size_t needed = 0;
    EXPECT_STATUS(ringfeed_batch_sample_source(b, b->sample_count, buf, sizeof buf, &needed),
                  RINGFEED_ERR_INVALID_ARGUMENT);
}

/* The loader's resume state, malloc'd; sized by asking first. */
static char *state_of(ringfeed_loader *loader) {
    size_t needed = 0;
    EXPECT_STATUS(ringfeed_loader_state(loader, NULL, 0, &needed), RINGFEED_ERR_BUFFER_TOO_SMALL);
    CHECK(needed > 0 && needed < 4096, "a resume state of %zu bytes", needed);
    char *buf = (char *)malloc(needed + 1);
    CHECK(buf != NULL, "out of memory");
    size_t again = 0;
    EXPECT_STATUS(ringfeed_loader_state(loader, buf, needed + 1, &again), RINGFEED_OK);
    CHECK(again == needed && strlen(buf) == needed, "state of %zu bytes, `needed` %zu then %zu",
          strlen(buf), needed, again);
    for (size_t i = 0; i < needed; i++) {
        CHECK(buf[i] > 0x20 && buf[i] < 0x7f, "state byte %zu is %d, not printable ASCII", i,
              buf[i]);
    }
    return buf;
}

/* The batch's key, kept for this process and released; a second release
 * of the one keep is refused by name; the buffer convention of the key;
 * the claim's view of the batch's bytes is the consumer's. */
static void check_keep(ringfeed_loader *loader, const ringfeed_batch *b) {
    size_t needed = 0;
    EXPECT_STATUS(ringfeed_batch_node_key(b, NULL, 0, &needed), RINGFEED_ERR_BUFFER_TOO_SMALL);
    CHECK(needed > 0 && needed < 4096, "a key of %zu bytes", needed);
    char key[4096];
    EXPECT_STATUS(ringfeed_batch_node_key(b, key, needed + 1, NULL), RINGFEED_OK);
    CHECK(strlen(key) == needed, "the key is %zu bytes, said %zu", strlen(key), needed);
    CHECK(strstr(key, "\"engine\"") && strstr(key, "\"cap\""), "the key is %s", key);
    EXPECT_STATUS(ringfeed_node_keep(key, getpid()), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_node_release(key), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_node_release(key), RINGFEED_ERR_NODE);
    CHECK(contains(last_error(), "keeps no batch"), "a second release: %s", last_error());
    const uint8_t *base = NULL;
    uint64_t len = 0;
    EXPECT_STATUS(ringfeed_node_claim(key, &base, &len), RINGFEED_OK);
    int32_t fd = -1;
    const uint8_t *mine = NULL;
    uint64_t mine_len = 0;
    EXPECT_STATUS(ringfeed_loader_arena(loader, &fd, &mine, &mine_len), RINGFEED_OK);
    CHECK(base != NULL && len == mine_len, "the claim mapped %llu bytes of %llu",
          (unsigned long long)len, (unsigned long long)mine_len);
    const ringfeed_field *f = &b->samples[0].fields[0];
    size_t at = (size_t)(f->data - mine);
    CHECK(at + f->len <= len && memcmp(base + at, f->data, f->len) == 0,
          "the holder's mapping shows other bytes than the consumer's");
    EXPECT_STATUS(ringfeed_node_release(key), RINGFEED_OK);
    /* Kept for another process: refused, naming why. */
    EXPECT_STATUS(ringfeed_node_keep(key, 1), RINGFEED_ERR_NODE);
    CHECK(contains(last_error(), "kept by the process that reads it"), "a keep for pid 1: %s",
          last_error());
}

/* Releases the window's batches in an order other than they came (the
 * newest first), each checked once more while still held. */
static void release_window(ringfeed_batch *held, size_t *n) {
    for (size_t i = *n; i-- > 0;) {
        check_batch(&held[i], seed, NULL);
        EXPECT_STATUS(ringfeed_batch_release(&held[i]), RINGFEED_OK);
        check_zeroed(&held[i], "ringfeed_batch_release");
    }
    *n = 0;
}

static void stream(void) {
    char *config = node_config();
    ringfeed_loader *loader = open_or_die(config);
    char *state0 = state_of(loader);
    key_list keys = {0};
    ringfeed_batch held[WINDOW];
    size_t n_held = 0;
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
        CHECK(b.index == batches, "batch %" PRIu64 " arrived as number %" PRIu64, b.index,
              batches);
        CHECK(b.sample_count <= 7, "a batch of %zu samples with batch_size 7", b.sample_count);
        bytes += check_batch(&b, seed, &keys);
        if (batches == 0) {
            check_sources(&b);
            check_keep(loader, &b);
            char *state1 = state_of(loader);
            CHECK(strcmp(state0, state1) != 0, "the resume state did not move after a batch: %s",
                  state1);
            free(state1);
            /* While a batch is held, the engine counts it as this consumer's. */
            char *json = stats_json(loader);
            CHECK(contains(json, "\"node\":{"), "stats JSON has no node member: %s", json);
            CHECK(contains(json, "\"batches_held_by_this_consumer\":"),
                  "stats JSON's node member lacks batches_held_by_this_consumer: %s", json);
            free(json);
        }
        batches++;
        held[n_held++] = b;
        if (n_held == WINDOW) {
            release_window(held, &n_held);
        }
    }
    release_window(held, &n_held);
    expect_finished(loader);
    key_list_check_exactly_once(&keys, n_shards, n_samples, "attached consumer");
    CHECK(bytes == n_bytes, "%" PRIu64 " payload bytes delivered, %" PRIu64 " generated", bytes,
          n_bytes);
    CHECK(batches == (n_samples + 6) / 7, "%" PRIu64 " batches of at most 7 for %" PRIu64
          " samples", batches, n_samples);

    ringfeed_stats s;
    s.size = sizeof s;
    EXPECT_STATUS(ringfeed_loader_stats(loader, &s), RINGFEED_OK);
    CHECK(s.bytes_delivered == n_bytes && s.samples_delivered == n_samples &&
              s.batches_delivered == batches,
          "stats: bytes_delivered %" PRIu64 ", samples_delivered %" PRIu64
          ", batches_delivered %" PRIu64 "; delivered %" PRIu64 ", %" PRIu64 ", %" PRIu64,
          s.bytes_delivered, s.samples_delivered, s.batches_delivered, n_bytes, n_samples,
          batches);
    char *json = stats_json(loader);
    CHECK(contains(json, "\"node\":{"), "stats JSON has no node member: %s", json);
    CHECK(contains(json, "\"batches_held_by_this_consumer\":0"),
          "every batch was released, but the engine holds some for this consumer: %s", json);
    printf("attached consumer: %" PRIu64 " batches\n  %s\n", batches, json);
    free(json);
    char *state_end = state_of(loader);
    CHECK(strcmp(state_end, state0) != 0, "the resume state at the end is the one at the start");
    free(state_end);
    free(state0);
    EXPECT_STATUS(ringfeed_loader_close(loader), RINGFEED_OK);
    free(keys.keys);
    free(config);
}

_Noreturn static void crash(void) {
    char *config = node_config();
    ringfeed_loader *loader = open_or_die(config);
    ringfeed_batch held[CRASH_HELD];
    for (size_t n = 0; n < CRASH_HELD;) {
        int32_t st = ringfeed_loader_next(loader, -1, &held[n]);
        EXPECT_STATUS(st, RINGFEED_OK);
        check_batch(&held[n], seed, NULL);
        n++;
    }
    printf("abi_node: crashing with %d batches held\n", CRASH_HELD);
    fflush(stdout);
    /* No release, no close, no exit handlers: the kernel closes the socket. */
    kill(getpid(), SIGKILL);
    FAIL("still alive after SIGKILL");
}

int main(int argc, char **argv) {
    /* A hang is a failure: SIGALRM ends the process. */
    alarm(240);
    if (argc < 3) {
        fprintf(stderr, "usage: %s SOCKET stream|crash SEED SAMPLES BYTES SHARD...\n", argv[0]);
        return 2;
    }
    socket_path = argv[1];
    read_dataset_args(argc, argv, 3, "SOCKET MODE ", &seed, &n_samples, &n_bytes, &shards,
                      &n_shards);
    CHECK(strcmp(ringfeed_version(), RINGFEED_EXPECTED_VERSION) == 0,
          "ringfeed_version() is \"%s\", the crate is %s", ringfeed_version(),
          RINGFEED_EXPECTED_VERSION);
    if (strcmp(argv[2], "crash") == 0) {
        crash();
    }
    CHECK(strcmp(argv[2], "stream") == 0, "mode \"%s\" is neither stream nor crash", argv[2]);
    stream();
    printf("abi_node: all checks passed\n");
    return 0;
}

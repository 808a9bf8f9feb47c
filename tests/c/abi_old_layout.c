/*
 * abi_old_layout.c — a program built against the previous header of this
 * ABI (tests/c/abi1_previous/ringfeed.h, whose ringfeed_stats lacks the nine
 * cache fields the current one ends with), run against the current library:
 * it streams a dataset, and the library fills exactly the stats it knows,
 * says so in `size`, and writes nothing past them.
 *
 * Usage: abi_old_layout SEED SAMPLES BYTES SHARD...
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi1_previous/ringfeed.h"

static int failures;
#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                  \
            fputc('\n', stderr);                           \
            failures++;                                    \
        }                                                  \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s SEED SAMPLES BYTES SHARD...\n", argv[0]);
        return 2;
    }
    uint64_t samples = strtoull(argv[2], NULL, 10);
    uint64_t bytes = strtoull(argv[3], NULL, 10);
    CHECK(ringfeed_abi_version() == RINGFEED_ABI_VERSION, "library ABI %u, header ABI %d",
          ringfeed_abi_version(), RINGFEED_ABI_VERSION);

    char config[8192];
    size_t at = (size_t)snprintf(config, sizeof config,
                                 "{\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\", \"urls\": [");
    for (int i = 4; i < argc; i++) {
        at += (size_t)snprintf(config + at, sizeof config - at, "%s\"%s\"", i > 4 ? ", " : "", argv[i]);
    }
    snprintf(config + at, sizeof config - at, "]}");
    ringfeed_loader *l = NULL;
    if (ringfeed_loader_open(config, &l) != RINGFEED_OK) {
        char msg[1024];
        ringfeed_last_error(msg, sizeof msg);
        fprintf(stderr, "FAIL open: %s\n", msg);
        return 1;
    }
    uint64_t got = 0;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(l, -1, &b);
        if (st == RINGFEED_FINISHED) {
            break;
        }
        if (st == RINGFEED_END_OF_EPOCH) {
            continue;
        }
        CHECK(st == RINGFEED_OK, "next: %d", st);
        if (st != RINGFEED_OK) {
            break;
        }
        got += b.sample_count;
        ringfeed_batch_release(&b);
    }

    /* The old struct, with a canary right after it. */
    struct {
        ringfeed_stats stats;
        uint64_t canary[16];
    } old;
    memset(&old, 0x5A, sizeof old);
    old.stats.size = sizeof old.stats;
    CHECK(ringfeed_loader_stats(l, &old.stats) == RINGFEED_OK, "stats");
    CHECK(old.stats.size == sizeof old.stats, "size %" PRIu64 ", the old struct has %zu",
          old.stats.size, sizeof old.stats);
    CHECK(old.stats.samples_delivered == samples && got == samples,
          "samples: stats %" PRIu64 ", counted %" PRIu64 ", expected %" PRIu64,
          old.stats.samples_delivered, got, samples);
    CHECK(old.stats.bytes_delivered == bytes, "bytes: %" PRIu64 ", expected %" PRIu64,
          old.stats.bytes_delivered, bytes);
    CHECK(old.stats.io_backend == RINGFEED_BACKEND_IO_URING ||
              old.stats.io_backend == RINGFEED_BACKEND_THREADS,
          "io_backend %d", old.stats.io_backend);
    for (size_t i = 0; i < sizeof old.canary / sizeof old.canary[0]; i++) {
        CHECK(old.canary[i] == 0x5A5A5A5A5A5A5A5Aull, "byte %zu past the old struct was written",
              i * 8);
    }
    ringfeed_loader_close(l);
    if (failures) {
        fprintf(stderr, "abi_old_layout: %d failures\n", failures);
        return 1;
    }
    printf("abi_old_layout: all checks passed\n");
    return 0;
}

/*
 * abi_misuse.c — every documented misuse of the C ABI, and bad input, gives
 * its documented status and a message naming what went wrong; nothing
 * crashes (ASan/UBSan watch) and nothing hangs (alarm).
 *
 * Usage: abi_misuse SCRATCH_DIR SEED SAMPLES BYTES SHARD...
 *   (SCRATCH_DIR: an empty directory for the corrupt shards this program
 *   writes; the rest as abi_stream)
 *
 * Messages are per thread and only set on failure, so before each misuse a
 * known error ("__prime__") is left on the thread: the check then proves the
 * misuse set a message of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

#include "common.h"

static uint64_t seed, n_samples, n_bytes;
static char **shards;
static size_t n_shards;
static const char *scratch;

#define SMALL "\"memory_budget\": \"64MiB\", \"chunk_size\": \"1MiB\""

/* Leaves a known message on this thread (see the top comment). */
static void prime(void) {
    ringfeed_loader *l = NULL;
    EXPECT_STATUS(ringfeed_loader_open("{\"urls\": \"x\", \"__prime__\": 1}", &l),
                  RINGFEED_ERR_CONFIG);
    CHECK(contains(last_error(), "__prime__"), "the priming error has another message");
}

static char *path_in_scratch(const char *name) {
    size_t n = strlen(scratch) + strlen(name) + 2;
    char *p = (char *)malloc(n);
    CHECK(p != NULL, "out of memory");
    snprintf(p, n, "%s/%s", scratch, name);
    return p;
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s: %s", path, strerror(errno));
    CHECK(fseek(f, 0, SEEK_END) == 0, "seek %s", path);
    long n = ftell(f);
    CHECK(n > 0, "ftell %s", path);
    rewind(f);
    uint8_t *data = (uint8_t *)malloc((size_t)n);
    CHECK(data != NULL, "out of memory");
    CHECK(fread(data, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    fclose(f);
    *len = (size_t)n;
    return data;
}

/* ---- configuration and dataset errors, at open ---- */

static void bad_open_arguments(void) {
    printf("open:\n");
    char *good = make_config(shards, 1, SMALL);
    ringfeed_loader *l = (ringfeed_loader *)(uintptr_t)0xdead0;
    EXPECT_ERROR(ringfeed_loader_open(NULL, &l), RINGFEED_ERR_INVALID_ARGUMENT, "config_json");
    CHECK(l == NULL, "a failed open left %p in *out, not NULL", (void *)l);
    EXPECT_ERROR(ringfeed_loader_open(good, NULL), RINGFEED_ERR_INVALID_ARGUMENT, "out");

    struct {
        const char *config;
        int32_t status;
        const char *needle;
    } cases[] = {
        {"{\"urls\": \"\xff\xfe\"}", RINGFEED_ERR_INVALID_ARGUMENT, "UTF-8"},
        {"\xc3", RINGFEED_ERR_INVALID_ARGUMENT, "UTF-8"},
        {"", RINGFEED_ERR_CONFIG, "not valid JSON"},
        {"{\"urls\": ", RINGFEED_ERR_CONFIG, "not valid JSON"},
        {"{\"urls\": \"a.tar\",}", RINGFEED_ERR_CONFIG, "not valid JSON"},
        {"[1, 2]", RINGFEED_ERR_CONFIG, "JSON object"},
        {"{}", RINGFEED_ERR_CONFIG, "urls"},
        {"{\"urls\": []}", RINGFEED_ERR_CONFIG, "urls"},
        {"{\"urls\": \"a.tar\", \"bogus_key\": 1}", RINGFEED_ERR_CONFIG, "bogus_key"},
        {"{\"urls\": \"a.tar\", \"batch_size\": 0}", RINGFEED_ERR_CONFIG, "batch_size"},
        {"{\"urls\": \"a.tar\", \"batch_size\": \"eight\"}", RINGFEED_ERR_CONFIG, "batch_size"},
        {"{\"urls\": \"a.tar\", \"memory_budget\": \"12 parsecs\"}", RINGFEED_ERR_CONFIG,
         "parsecs"},
        {"{\"urls\": \"a.tar\", \"chunk_size\": 1000}", RINGFEED_ERR_CONFIG, "chunk_size"},
        {"{\"urls\": \"a.tar\", \"io_backend\": \"epoll\"}", RINGFEED_ERR_CONFIG, "io_backend"},
        {"{\"urls\": \"a.tar\", \"lock_memory\": \"maybe\"}", RINGFEED_ERR_CONFIG, "lock_memory"},
        {"{\"urls\": \"s3:///a.tar\"}", RINGFEED_ERR_DATASET, "no bucket"},
        {"{\"urls\": \"ftp://host/a.tar\"}", RINGFEED_ERR_DATASET, "ftp"},
        {"{\"urls\": \"shard-{000..\"}", RINGFEED_ERR_DATASET, "shard-{000.."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        l = (ringfeed_loader *)(uintptr_t)0xdead0;
        EXPECT_ERROR(ringfeed_loader_open(cases[i].config, &l), cases[i].status, cases[i].needle);
        CHECK(l == NULL, "a failed open of case %zu left %p in *out", i, (void *)l);
    }

    /* A missing shard, alone and among good ones: the message names it. */
    char *missing = path_in_scratch("no-such-shard.tar");
    char *with_missing[3] = {shards[0], missing, shards[1]};
    for (size_t first = 0; first < 2; first++) {
        char *config = make_config(with_missing + first, 2, SMALL);
        EXPECT_ERROR(ringfeed_loader_open(config, &l), RINGFEED_ERR_DATASET, missing);
        free(config);
    }
    /* ... and inside a brace expansion. */
    char *pattern = path_in_scratch("absent-{0..2}.tar");
    char *absent = path_in_scratch("absent-0.tar");
    char *config = make_config(&pattern, 1, SMALL);
    EXPECT_ERROR(ringfeed_loader_open(config, &l), RINGFEED_ERR_DATASET, absent);
    free(config);
    /* A directory without shards. */
    char *dir = (char *)scratch;
    config = make_config(&dir, 1, SMALL);
    EXPECT_ERROR(ringfeed_loader_open(config, &l), RINGFEED_ERR_DATASET, scratch);
    free(config);
    free(pattern);
    free(absent);
    free(missing);
    free(good);
}

/* ringfeed_plan_json: the same checks as an open (it reads the dataset
 * the same way), and the buffer rules of the other text outputs. */
static void plan_misuse(void) {
    printf("plan:\n");
    char buf[4096];
    size_t needed = 0;
    EXPECT_ERROR(ringfeed_plan_json(NULL, buf, sizeof buf, &needed), RINGFEED_ERR_INVALID_ARGUMENT,
                 "config_json");
    EXPECT_ERROR(ringfeed_plan_json("\xc3", buf, sizeof buf, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "UTF-8");
    EXPECT_ERROR(ringfeed_plan_json("{\"urls\": ", buf, sizeof buf, &needed), RINGFEED_ERR_CONFIG,
                 "not valid JSON");
    EXPECT_ERROR(ringfeed_plan_json("{\"urls\": \"a.tar\", \"bogus_key\": 1}", buf, sizeof buf,
                                    &needed),
                 RINGFEED_ERR_CONFIG, "bogus_key");
    char *missing = path_in_scratch("no-such-shard.tar");
    char *config = make_config(&missing, 1, SMALL);
    EXPECT_ERROR(ringfeed_plan_json(config, buf, sizeof buf, &needed), RINGFEED_ERR_DATASET,
                 missing);
    free(config);
    /* Two consumers over the local shards: counted from their headers, the
     * split by sample, every consumer the same batches. */
    char *two = make_config(shards, n_shards, "\"world_size\": 2, \"rank\": 1, \"batch_size\": 7");
    EXPECT_ERROR(ringfeed_plan_json(two, NULL, sizeof buf, &needed), RINGFEED_ERR_INVALID_ARGUMENT,
                 "buf");
    needed = 0;
    EXPECT_ERROR(ringfeed_plan_json(two, buf, 2, &needed), RINGFEED_ERR_BUFFER_TOO_SMALL, "bytes");
    CHECK(needed > 20 && needed < sizeof buf, "the plan needs %zu bytes", needed);
    EXPECT_STATUS(ringfeed_plan_json(two, buf, sizeof buf, &needed), RINGFEED_OK);
    CHECK(strlen(buf) == needed, "wrote %zu bytes, said %zu", strlen(buf), needed);
    char want[256];
    uint64_t per = (n_samples + 1) / 2;
    snprintf(want, sizeof want,
             "{\"split\":\"samples\",\"consumers\":2,\"samples\":%" PRIu64
             ",\"batches\":%" PRIu64 ",\"shards\":%zu,\"nominal\":null}",
             per, (per + 6) / 7, n_shards);
    CHECK(strcmp(buf, want) == 0, "plan %s, expected %s", buf, want);
    free(two);
    free(missing);
}

/*
 * Opens `config` and streams it, expecting `want` with a message holding
 * every string of `needles` (NULL-terminated): at open, or from next after
 * the batches read before the failure. The error must then stick: the next
 * call returns it again. Adds the keys of the good batches to `keys` (if not
 * NULL).
 */
static void expect_stream_error(const char *config, int32_t want, const char *const *needles,
                                key_list *keys) {
    ringfeed_loader *l = NULL;
    prime();
    int32_t st = ringfeed_loader_open(config, &l);
    if (st == RINGFEED_OK) {
        ringfeed_batch b;
        while ((st = ringfeed_loader_next(l, -1, &b)) == RINGFEED_OK) {
            check_batch(&b, seed, keys);
            EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
        }
    }
    check_error(__FILE__, __LINE__, config, st, want, NULL);
    for (const char *const *n = needles; *n; n++) {
        CHECK(contains(last_error(), *n), "the error of %s does not mention \"%s\"", config, *n);
    }
    if (l != NULL) {
        char first[4096];
        snprintf(first, sizeof first, "%s", last_error());
        ringfeed_batch b;
        prime();
        EXPECT_STATUS(ringfeed_loader_next(l, 0, &b), want);
        CHECK(strcmp(last_error(), first) == 0, "the error changed: \"%s\", then \"%s\"", first,
              last_error());
        EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    }
}

/* Samples in a synth shard: its members (ustar headers walked) over 2. */
static uint64_t samples_in(const uint8_t *tar, size_t len) {
    uint64_t members = 0;
    size_t off = 0;
    while (off + 512 <= len && tar[off] != 0) {
        size_t size = (size_t)strtoull((const char *)tar + off + 124, NULL, 8);
        off += 512 + (size + 511) / 512 * 512;
        members++;
    }
    return members / 2;
}

/* ---- bad shards ---- */

static void corrupt_shards(void) {
    printf("corrupt shards:\n");
    /* Garbage: no tar header at byte 0. */
    uint8_t garbage[4096];
    uint64_t state = 12345;
    for (size_t i = 0; i < sizeof garbage; i++) {
        garbage[i] = (uint8_t)(synth_rng_next(&state) | 1);
    }
    char *garbage_path = path_in_scratch("garbage.tar");
    write_file(garbage_path, garbage, sizeof garbage);
    char *config = make_config(&garbage_path, 1, SMALL);
    const char *garbage_needles[] = {garbage_path, "byte 0", NULL};
    expect_stream_error(config, RINGFEED_ERR_FORMAT, garbage_needles, NULL);
    free(config);

    /* Empty. */
    char *empty_path = path_in_scratch("empty.tar");
    write_file(empty_path, NULL, 0);
    config = make_config(&empty_path, 1, SMALL);
    const char *empty_needles[] = {empty_path, "empty", NULL};
    expect_stream_error(config, RINGFEED_ERR_FORMAT, empty_needles, NULL);
    free(config);

    /* A valid shard whose second member's header has a bad checksum. */
    size_t len;
    uint8_t *tar = read_file(shards[0], &len);
    CHECK(len > 4096 && memcmp(tar + 257, "ustar", 5) == 0, "%s is not a ustar archive",
          shards[0]);
    size_t first_size = (size_t)strtoull((const char *)tar + 124, NULL, 8);
    size_t second = 512 + (first_size + 511) / 512 * 512;
    CHECK(second + 512 < len && memcmp(tar + second + 257, "ustar", 5) == 0,
          "no second member header at byte %zu", second);
    tar[second + 3] ^= 0x20; /* a name byte: the stored checksum no longer matches */
    char *badsum_path = path_in_scratch("badsum.tar");
    write_file(badsum_path, tar, len);
    char offset[64];
    snprintf(offset, sizeof offset, "byte %zu", second);
    config = make_config(&badsum_path, 1, SMALL);
    const char *badsum_needles[] = {badsum_path, offset, "checksum", NULL};
    expect_stream_error(config, RINGFEED_ERR_FORMAT, badsum_needles, NULL);
    free(config);

    /*
     * The same after a good shard, on one worker: every full batch of the
     * good shard comes first (at most batch_size - 1 of its samples wait in
     * the batch the corrupt shard's samples would have completed), then the
     * error.
     */
    size_t good_len;
    uint8_t *good = read_file(shards[1], &good_len);
    uint64_t good_samples = samples_in(good, good_len);
    free(good);
    char *mixed[2] = {shards[1], badsum_path};
    config = make_config(mixed, 2, SMALL ", \"workers\": 1, \"batch_size\": 4");
    key_list keys = {0};
    expect_stream_error(config, RINGFEED_ERR_FORMAT, badsum_needles, &keys);
    qsort(keys.keys, keys.len, sizeof *keys.keys, cmp_u64);
    for (size_t i = 0; i < keys.len; i++) {
        CHECK(keys.keys[i] == UINT64_C(10000000) + i,
              "before the error: sample %" PRIu64 " of shard 1 where %zu was due",
              keys.keys[i] % 10000000, i);
    }
    CHECK(keys.len + 3 >= good_samples,
          "%zu of the good shard's %" PRIu64 " samples came before the corrupt shard's error",
          keys.len, good_samples);
    printf("  %zu of the good shard's %" PRIu64 " samples came before the error\n", keys.len,
           good_samples);
    free(keys.keys);
    free(config);

    /* Truncated inside the first member's data. */
    char *cut_path = path_in_scratch("truncated.tar");
    write_file(cut_path, tar, 512 + first_size / 2);
    config = make_config(&cut_path, 1, SMALL);
    const char *cut_needles[] = {cut_path, "truncated", NULL};
    expect_stream_error(config, RINGFEED_ERR_FORMAT, cut_needles, NULL);
    free(config);

    /* A budget that cannot hold one batch: an error, not a hang. */
    config = make_config(shards, n_shards,
                         "\"memory_budget\": \"256KiB\", \"chunk_size\": \"64KiB\", "
                         "\"workers\": 1, \"batch_size\": 64");
    const char *budget_needles[] = {"memory_budget", NULL};
    expect_stream_error(config, RINGFEED_ERR_MEMORY, budget_needles, NULL);
    free(config);

    free(tar);
    free(garbage_path);
    free(empty_path);
    free(badsum_path);
    free(cut_path);
}

/* ---- handles ---- */

static void ignore_log(void *user, int32_t level, const char *message) {
    (void)user;
    (void)level;
    (void)message;
}

static void bad_handles(void) {
    printf("handles:\n");
    ringfeed_batch b;
    ringfeed_stats s;
    s.size = sizeof s;
    char buf[256];
    size_t needed;
    int fd;
    const uint8_t *base;
    uint64_t arena_len;
    ringfeed_loader *garbage[] = {(ringfeed_loader *)(uintptr_t)0x1234,
                                  (ringfeed_loader *)(uintptr_t)0x1235,
                                  (ringfeed_loader *)(uintptr_t)UINTPTR_MAX,
                                  (ringfeed_loader *)&b};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        ringfeed_loader *g = garbage[i];
        EXPECT_ERROR(ringfeed_loader_next(g, 0, &b), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
        EXPECT_ERROR(ringfeed_loader_next(g, -1, &b), RINGFEED_ERR_INVALID_HANDLE,
                     "loader handle");
        EXPECT_ERROR(ringfeed_loader_stats(g, &s), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
        EXPECT_ERROR(ringfeed_loader_stats_json(g, buf, sizeof buf, &needed),
                     RINGFEED_ERR_INVALID_HANDLE, "loader handle");
        EXPECT_ERROR(ringfeed_loader_metrics(g, buf, sizeof buf, &needed),
                     RINGFEED_ERR_INVALID_HANDLE, "loader handle");
        EXPECT_ERROR(ringfeed_loader_state(g, buf, sizeof buf, &needed),
                     RINGFEED_ERR_INVALID_HANDLE, "loader handle");
        EXPECT_ERROR(ringfeed_loader_arena(g, &fd, &base, &arena_len), RINGFEED_ERR_INVALID_HANDLE,
                     "loader handle");
        EXPECT_ERROR(ringfeed_loader_close(g), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
    }
    EXPECT_ERROR(ringfeed_loader_next(NULL, 0, &b), RINGFEED_ERR_INVALID_ARGUMENT, "loader");
    EXPECT_ERROR(ringfeed_loader_stats(NULL, &s), RINGFEED_ERR_INVALID_ARGUMENT, "loader");
    EXPECT_ERROR(ringfeed_loader_stats_json(NULL, buf, sizeof buf, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "loader");
    EXPECT_ERROR(ringfeed_loader_metrics(NULL, buf, sizeof buf, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "loader");
    EXPECT_ERROR(ringfeed_loader_state(NULL, buf, sizeof buf, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "loader");
    EXPECT_ERROR(ringfeed_loader_arena(NULL, &fd, &base, &arena_len),
                 RINGFEED_ERR_INVALID_ARGUMENT, "loader");
    EXPECT_STATUS(ringfeed_loader_close(NULL), RINGFEED_OK);

    /* NULL and misaligned out pointers on a live loader. */
    char *config = make_config(shards, n_shards, SMALL);
    ringfeed_loader *l = open_or_die(config);
    _Alignas(16) unsigned char raw[sizeof(ringfeed_batch) + sizeof(ringfeed_stats) + 16];
    EXPECT_ERROR(ringfeed_loader_next(l, 0, NULL), RINGFEED_ERR_INVALID_ARGUMENT, "out");
    EXPECT_ERROR(ringfeed_loader_next(l, 0, (ringfeed_batch *)(void *)(raw + 1)),
                 RINGFEED_ERR_INVALID_ARGUMENT, "aligned");
    EXPECT_ERROR(ringfeed_loader_stats(l, NULL), RINGFEED_ERR_INVALID_ARGUMENT, "out");
    EXPECT_ERROR(ringfeed_loader_stats(l, (ringfeed_stats *)(void *)(raw + 4)),
                 RINGFEED_ERR_INVALID_ARGUMENT, "aligned");
    /* A stats struct whose size was not set, or set below its first field. */
    ringfeed_stats unsized;
    memset(&unsized, 0, sizeof unsized);
    EXPECT_ERROR(ringfeed_loader_stats(l, &unsized), RINGFEED_ERR_INVALID_ARGUMENT, "size");
    unsized.size = 4;
    EXPECT_ERROR(ringfeed_loader_stats(l, &unsized), RINGFEED_ERR_INVALID_ARGUMENT, "size");
    /* A program built against a newer header (a larger struct): the library
     * writes what it has, says how much, and leaves the rest alone. */
    struct {
        ringfeed_stats known;
        uint64_t newer[4];
    } larger;
    memset(&larger, 0xAB, sizeof larger);
    larger.known.size = sizeof larger;
    EXPECT_STATUS(ringfeed_loader_stats(l, &larger.known), RINGFEED_OK);
    CHECK(larger.known.size == sizeof(ringfeed_stats), "size after the call: %" PRIu64,
          larger.known.size);
    CHECK(larger.newer[0] == 0xABABABABABABABABull && larger.newer[3] == 0xABABABABABABABABull,
          "bytes past the library's struct were written");
    EXPECT_ERROR(ringfeed_loader_stats_json(l, NULL, 1 << 20, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "buf");
    EXPECT_ERROR(ringfeed_loader_stats_json(l, buf, 1, NULL), RINGFEED_ERR_BUFFER_TOO_SMALL,
                 "bytes");
    /* The metrics: NULL or short buffers say how much is needed; then whole. */
    EXPECT_ERROR(ringfeed_loader_metrics(l, NULL, 1 << 20, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "buf");
    needed = 0;
    EXPECT_ERROR(ringfeed_loader_metrics(l, buf, 1, &needed), RINGFEED_ERR_BUFFER_TOO_SMALL,
                 "bytes");
    CHECK(needed > 100, "metrics need %zu bytes", needed);
    /* Room to spare: the figures (uptime) may have grown a digit since. */
    char *metrics = malloc(needed + 256);
    CHECK(metrics != NULL, "malloc");
    size_t got = 0;
    EXPECT_STATUS(ringfeed_loader_metrics(l, metrics, needed + 256, &got), RINGFEED_OK);
    CHECK(strlen(metrics) == got && strstr(metrics, "# TYPE ringfeed_delivered_samples_total counter"),
          "metrics text (%zu bytes): %.200s", got, metrics);
    free(metrics);
    /* The log callback: a level outside the four is refused; NULL unsets. */
    EXPECT_ERROR(ringfeed_set_log_callback(ignore_log, NULL, 9), RINGFEED_ERR_INVALID_ARGUMENT,
                 "max_level");
    EXPECT_ERROR(ringfeed_set_log_callback(ignore_log, NULL, 0), RINGFEED_ERR_INVALID_ARGUMENT,
                 "max_level");
    EXPECT_STATUS(ringfeed_set_log_callback(NULL, NULL, 0), RINGFEED_OK);

    /* The loader still works after all that. */
    stream_epoch(l, 0, seed, n_shards, n_samples, n_bytes, NULL);
    expect_finished(l);

    /* Used after close. */
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    EXPECT_ERROR(ringfeed_loader_next(l, 0, &b), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
    EXPECT_ERROR(ringfeed_loader_next(l, -1, &b), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
    EXPECT_ERROR(ringfeed_loader_stats(l, &s), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
    EXPECT_ERROR(ringfeed_loader_stats_json(l, buf, sizeof buf, &needed),
                 RINGFEED_ERR_INVALID_HANDLE, "loader handle");
    EXPECT_ERROR(ringfeed_loader_state(l, buf, sizeof buf, &needed), RINGFEED_ERR_INVALID_HANDLE,
                 "loader handle");
    EXPECT_ERROR(ringfeed_loader_arena(l, &fd, &base, &arena_len), RINGFEED_ERR_INVALID_HANDLE,
                 "loader handle");
    EXPECT_ERROR(ringfeed_loader_close(l), RINGFEED_ERR_INVALID_HANDLE, "loader handle");

    /* Extreme time-outs: INT64_MAX waits long, INT64_MIN (negative) for ever. */
    l = open_or_die(config);
    EXPECT_STATUS(ringfeed_loader_next(l, INT64_MAX, &b), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_loader_next(l, INT64_MIN, &b), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    free(config);
}

/* ---- batches ---- */

static void bad_releases(void) {
    printf("batches:\n");
    EXPECT_ERROR(ringfeed_batch_release(NULL), RINGFEED_ERR_INVALID_ARGUMENT, "batch");
    ringfeed_batch zero;
    memset(&zero, 0, sizeof zero);
    EXPECT_ERROR(ringfeed_batch_release(&zero), RINGFEED_ERR_INVALID_HANDLE, "not held");
    ringfeed_batch forged = zero;
    forged.handle = 0x7fffffffffffULL;
    EXPECT_ERROR(ringfeed_batch_release(&forged), RINGFEED_ERR_INVALID_HANDLE, "not held");

    char *config = make_config(shards, n_shards, SMALL ", \"batch_size\": 8");
    ringfeed_loader *l = open_or_die(config);

    /* Released twice, through a copy and through the zeroed original. */
    ringfeed_batch b;
    EXPECT_STATUS(ringfeed_loader_next(l, -1, &b), RINGFEED_OK);
    /* A batch of a loader in this process has no node key. */
    char key[512];
    size_t needed = 0;
    EXPECT_ERROR(ringfeed_batch_node_key(&b, key, sizeof key, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "not from a node engine");
    EXPECT_ERROR(ringfeed_batch_node_key(NULL, key, sizeof key, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "batch");
    EXPECT_ERROR(ringfeed_batch_node_key(&zero, key, sizeof key, &needed),
                 RINGFEED_ERR_INVALID_HANDLE, "not held");
    /* Keys that are not keys, or name no engine. */
    EXPECT_ERROR(ringfeed_node_keep(NULL, getpid()), RINGFEED_ERR_INVALID_ARGUMENT, "key");
    EXPECT_ERROR(ringfeed_node_release(NULL), RINGFEED_ERR_INVALID_ARGUMENT, "key");
    EXPECT_ERROR(ringfeed_node_keep("{\"socket\": 7", getpid()), RINGFEED_ERR_NODE,
                 "not a batch key");
    EXPECT_ERROR(ringfeed_node_release("{}"), RINGFEED_ERR_NODE, "not a batch key");
    EXPECT_ERROR(ringfeed_node_release("\xff\xfe"), RINGFEED_ERR_INVALID_ARGUMENT, "UTF-8");
    EXPECT_ERROR(ringfeed_node_keep("{\"socket\": \"/nonexistent/n.sock\", \"session\": 1, "
                                    "\"id\": 2}",
                                    getpid()),
                 RINGFEED_ERR_NODE, "not a batch key");
    /* A key of the right shape for an engine that is not there. */
    const char *nowhere = "{\"socket\": \"/nonexistent/n.sock\", \"engine\": "
                          "\"0123456789abcdef0123456789abcdef\", \"batch\": 2, "
                          "\"cap\": \"0123456789abcdef\"}";
    EXPECT_ERROR(ringfeed_node_keep(nowhere, getpid()), RINGFEED_ERR_NODE, "cannot reach");
    EXPECT_ERROR(ringfeed_node_claim(nowhere, NULL, NULL), RINGFEED_ERR_NODE, "cannot reach");
    EXPECT_ERROR(ringfeed_node_claim(NULL, NULL, NULL), RINGFEED_ERR_INVALID_ARGUMENT, "key");
    EXPECT_ERROR(ringfeed_node_release(nowhere), RINGFEED_ERR_NODE, "keeps no batch");
    EXPECT_ERROR(ringfeed_batch_ship(&b, key, sizeof key, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "not from a node engine");
    ringfeed_batch copy = b;
    EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    check_zeroed(&b, "ringfeed_batch_release");
    EXPECT_ERROR(ringfeed_batch_release(&copy), RINGFEED_ERR_INVALID_HANDLE, "not held");
    EXPECT_ERROR(ringfeed_batch_release(&b), RINGFEED_ERR_INVALID_HANDLE, "not held");

    /* Held across close: still readable, and released afterwards. */
    ringfeed_batch held[3];
    for (int i = 0; i < 3; i++) {
        EXPECT_STATUS(ringfeed_loader_next(l, -1, &held[i]), RINGFEED_OK);
    }
    ringfeed_batch held_copy = held[0];
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    ringfeed_stats s;
    s.size = sizeof s;
    EXPECT_ERROR(ringfeed_loader_stats(l, &s), RINGFEED_ERR_INVALID_HANDLE, "loader handle");
    for (int i = 2; i >= 0; i--) {
        check_batch(&held[i], seed, NULL);
        EXPECT_STATUS(ringfeed_batch_release(&held[i]), RINGFEED_OK);
        check_zeroed(&held[i], "release after close");
    }
    EXPECT_ERROR(ringfeed_batch_release(&held_copy), RINGFEED_ERR_INVALID_HANDLE, "not held");
    free(config);
}

/* ---- messages ---- */

static void *error_in_thread(void *arg) {
    char *seen = (char *)arg;
    /* A new thread has no message yet. */
    memset(seen, 'X', 64);
    size_t n = ringfeed_last_error(seen, 64);
    CHECK(n == 0 && seen[0] == '\0', "a new thread has a last error of %zu bytes", n);
    ringfeed_loader *l = NULL;
    EXPECT_STATUS(ringfeed_loader_open("{\"urls\": \"a\", \"thread_only_key\": 1}", &l),
                  RINGFEED_ERR_CONFIG);
    snprintf(seen, 256, "%s", last_error());
    return NULL;
}

static void last_error_buffers(void) {
    printf("messages:\n");
    ringfeed_loader *l = NULL;
    EXPECT_STATUS(ringfeed_loader_open("{\"urls\": \"a\", \"abcdefghij_key\": 1}", &l),
                  RINGFEED_ERR_CONFIG);
    char full[4096];
    size_t n = ringfeed_last_error(full, sizeof full);
    CHECK(n > 10 && n < sizeof full && strlen(full) == n, "message of %zu bytes: \"%s\"", n, full);
    CHECK(contains(full, "abcdefghij_key"), "the message does not name the key: %s", full);
    CHECK(ringfeed_last_error(NULL, 0) == n, "length with (NULL, 0)");
    CHECK(ringfeed_last_error(NULL, 100) == n, "length with (NULL, 100)");

    char buf[4096 + 2];
    size_t sizes[] = {0, 1, 2, 6, n - 1, n, n + 1, n + 2};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t len = sizes[i];
        memset(buf, 'X', sizeof buf);
        CHECK(ringfeed_last_error(buf, len) == n, "the length returned with len %zu", len);
        if (len == 0) {
            CHECK(buf[0] == 'X', "len 0 wrote into the buffer");
            continue;
        }
        size_t kept = len - 1 < n ? len - 1 : n;
        CHECK(memcmp(buf, full, kept) == 0, "len %zu: the first %zu bytes differ", len, kept);
        CHECK(buf[kept] == '\0', "len %zu: no NUL at byte %zu", len, kept);
        CHECK(buf[kept + 1] == 'X', "len %zu: wrote past the NUL", len);
        for (size_t j = kept + 1; j < sizeof buf; j++) {
            CHECK(buf[j] == 'X', "len %zu: byte %zu written", len, j);
        }
    }

    /* Per thread: another thread neither sees nor changes this message. */
    char seen[256];
    pthread_t t;
    CHECK(pthread_create(&t, NULL, error_in_thread, seen) == 0, "pthread_create");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    CHECK(contains(seen, "thread_only_key"), "the thread's own message: %s", seen);
    CHECK(strcmp(last_error(), full) == 0, "another thread's error changed this thread's: %s",
          last_error());

    printf("redaction:\n");
    const char *presigned =
        "GET `https://b.s3.amazonaws.com/k.tar?X-Amz-Credential=AKIDSECRET&X-Amz-Signature=SIGSECRET`";
    char red[256];
    size_t rn = ringfeed_redact(presigned, red, sizeof red);
    CHECK(rn == strlen(red) && !contains(red, "AKIDSECRET") && !contains(red, "SIGSECRET") &&
              contains(red, "X-Amz-Signature=REDACTED`"),
          "redacted: %s", red);
    CHECK(ringfeed_redact(presigned, NULL, 0) == rn, "length with (NULL, 0)");
    memset(red, 'X', sizeof red);
    CHECK(ringfeed_redact(presigned, red, 8) == rn && red[7] == '\0' && red[8] == 'X',
          "truncated to 7 bytes and a NUL");
    CHECK(ringfeed_redact(NULL, red, sizeof red) == 0 && red[0] == '\0', "NULL text: \"\"");
    CHECK(ringfeed_redact("\xff\xfe?sig=SECRET", red, sizeof red) == 0 && red[0] == '\0',
          "text that is not UTF-8 gives \"\": %s", red);

    printf("status names:\n");
    struct {
        int32_t code;
        const char *name;
    } names[] = {
        {RINGFEED_OK, "RINGFEED_OK"},
        {RINGFEED_END_OF_EPOCH, "RINGFEED_END_OF_EPOCH"},
        {RINGFEED_TIMEOUT, "RINGFEED_TIMEOUT"},
        {RINGFEED_FINISHED, "RINGFEED_FINISHED"},
        {RINGFEED_ERR_INVALID_ARGUMENT, "RINGFEED_ERR_INVALID_ARGUMENT"},
        {RINGFEED_ERR_INVALID_HANDLE, "RINGFEED_ERR_INVALID_HANDLE"},
        {RINGFEED_ERR_CONFIG, "RINGFEED_ERR_CONFIG"},
        {RINGFEED_ERR_DATASET, "RINGFEED_ERR_DATASET"},
        {RINGFEED_ERR_IO, "RINGFEED_ERR_IO"},
        {RINGFEED_ERR_FORMAT, "RINGFEED_ERR_FORMAT"},
        {RINGFEED_ERR_MEMORY, "RINGFEED_ERR_MEMORY"},
        {RINGFEED_ERR_BUFFER_TOO_SMALL, "RINGFEED_ERR_BUFFER_TOO_SMALL"},
        {RINGFEED_ERR_CLOSED, "RINGFEED_ERR_CLOSED"},
        {RINGFEED_ERR_PANIC, "RINGFEED_ERR_PANIC"},
        {RINGFEED_ERR_IO_URING, "RINGFEED_ERR_IO_URING"},
    };
    size_t n_names = sizeof names / sizeof names[0];
    for (size_t i = 0; i < n_names; i++) {
        const char *got = ringfeed_status_name(names[i].code);
        CHECK(got != NULL && strcmp(got, names[i].name) == 0, "status %d is named \"%s\", not %s",
              (int)names[i].code, got ? got : "(NULL)", names[i].name);
        CHECK(ringfeed_status_name(names[i].code) == got, "status names are not static strings");
    }
    int32_t unknown[] = {4, 100, -12, -1000, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *got = ringfeed_status_name(unknown[i]);
        CHECK(got != NULL && got[0] != '\0', "unknown status %d has no name", (int)unknown[i]);
        for (size_t k = 0; k < n_names; k++) {
            CHECK(strcmp(got, names[k].name) != 0, "unknown status %d is named %s",
                  (int)unknown[i], got);
        }
    }
    CHECK(ringfeed_version() != NULL && ringfeed_version()[0] != '\0', "no version string");
    const char *keys = ringfeed_config_keys();
    CHECK(keys != NULL && strncmp(keys, "urls,", 5) == 0 && strstr(keys, ",batch_size,") != NULL &&
              strchr(keys, ' ') == NULL,
          "config keys are \"%s\"", keys ? keys : "(null)");
}

/* ---- time-outs, starvation and close while waiting ---- */

/* Polling with time-out 0 sees every sample once, then the epoch's end. */
static void poll_with_timeout_zero(void) {
    char *config = make_config(shards, n_shards, SMALL ", \"batch_size\": 9");
    ringfeed_loader *l = open_or_die(config);
    key_list keys = {0};
    uint64_t timeouts = 0;
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(l, 0, &b);
        if (st == RINGFEED_TIMEOUT) {
            check_zeroed(&b, "RINGFEED_TIMEOUT");
            timeouts++;
            usleep(100);
            continue;
        }
        if (st == RINGFEED_END_OF_EPOCH) {
            break;
        }
        EXPECT_STATUS(st, RINGFEED_OK);
        check_batch(&b, seed, &keys);
        EXPECT_STATUS(ringfeed_batch_release(&b), RINGFEED_OK);
    }
    key_list_check_exactly_once(&keys, n_shards, n_samples, "polling with time-out 0");
    /* FINISHED may take a moment after END_OF_EPOCH: the workers exit. */
    for (;;) {
        ringfeed_batch b;
        int32_t st = ringfeed_loader_next(l, 0, &b);
        if (st == RINGFEED_TIMEOUT) {
            usleep(100);
            continue;
        }
        EXPECT_STATUS(st, RINGFEED_FINISHED);
        break;
    }
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    printf("polling with time-out 0: %" PRIu64 " time-outs\n", timeouts);
    free(keys.keys);
    free(config);
}

struct waiter {
    ringfeed_loader *loader;
    int32_t status;
    char message[512];
    ringfeed_batch extra[64];
    size_t n_extra;
};

static void *wait_forever(void *arg) {
    struct waiter *w = (struct waiter *)arg;
    for (;;) {
        ringfeed_batch b;
        w->status = ringfeed_loader_next(w->loader, -1, &b);
        if (w->status != RINGFEED_OK) {
            break;
        }
        /* A batch that trickled in before close: hold it too. */
        CHECK(w->n_extra < 64, "a starved loader keeps delivering");
        w->extra[w->n_extra++] = b;
    }
    snprintf(w->message, sizeof w->message, "%s", last_error());
    return NULL;
}

/*
 * A loader with 1 MiB of memory over 6 MiB of shards, its batches all held:
 * the workers starve, next times out, and threads waiting in next with no
 * time-out return when the loader is closed.
 */
static void close_while_waiting(void) {
    char *config =
        make_config(shards, n_shards,
                    "\"memory_budget\": \"1MiB\", \"chunk_size\": \"64KiB\", \"workers\": 1, "
                    "\"batch_size\": 4, \"prefetch_batches\": 2");
    ringfeed_loader *l = open_or_die(config);
    ringfeed_batch held[256];
    size_t n_held = 0;
    uint64_t held_bytes = 0;
    for (;;) {
        CHECK(n_held < 256, "256 batches held in a 1 MiB budget");
        /* The first batch may take long on a loaded machine under valgrind;
         * after it, a 50 ms wait with every batch held is starvation. */
        int32_t st = ringfeed_loader_next(l, n_held == 0 ? 30000 : 50, &held[n_held]);
        if (st == RINGFEED_TIMEOUT) {
            break;
        }
        CHECK(st == RINGFEED_OK,
              "while every batch is held, next returned %s: a 1 MiB budget cannot hold all "
              "of the shards, so it must time out",
              ringfeed_status_name(st));
        held_bytes += held[n_held++].bytes;
    }
    CHECK(n_held > 0 && held_bytes <= (1u << 20),
          "%zu batches holding %" PRIu64 " bytes in a 1 MiB budget", n_held, held_bytes);
    ringfeed_batch b;
    int32_t st = ringfeed_loader_next(l, 0, &b);
    CHECK(st == RINGFEED_TIMEOUT || st == RINGFEED_OK, "next with time-out 0 returned %s",
          ringfeed_status_name(st));
    if (st == RINGFEED_OK) {
        CHECK(n_held < 256, "256 batches held in a 1 MiB budget");
        held[n_held++] = b;
    }
    printf("starved with %zu batches (%" PRIu64 " bytes) held\n", n_held, held_bytes);

    struct waiter w[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].loader = l;
        CHECK(pthread_create(&t[i], NULL, wait_forever, &w[i]) == 0, "pthread_create");
    }
    /* Give them time to block; either way the outcome below must hold. */
    usleep(300 * 1000);
    EXPECT_STATUS(ringfeed_loader_close(l), RINGFEED_OK);
    for (int i = 0; i < 3; i++) {
        CHECK(pthread_join(t[i], NULL) == 0, "pthread_join");
        CHECK(w[i].status == RINGFEED_ERR_CLOSED || w[i].status == RINGFEED_ERR_INVALID_HANDLE,
              "a thread waiting in next when the loader closed got %s",
              ringfeed_status_name(w[i].status));
        CHECK(contains(w[i].message, "closed"), "waiter %d's message: \"%s\"", i, w[i].message);
        printf("  waiter %d: %s: %s\n", i, ringfeed_status_name(w[i].status), w[i].message);
        for (size_t k = 0; k < w[i].n_extra; k++) {
            CHECK(n_held < 256, "256 batches held in a 1 MiB budget");
            held[n_held++] = w[i].extra[k];
        }
    }
    /* Everything held is still readable after close, then released. */
    for (size_t i = 0; i < n_held; i++) {
        check_batch(&held[i], seed, NULL);
        EXPECT_STATUS(ringfeed_batch_release(&held[i]), RINGFEED_OK);
    }
    free(config);
}

/* The image pipeline on one image: every bad argument, spec and image
 * bytes give their status and a message naming what was wrong; a buffer
 * too small says the size and shape it needs. */
static void image_transform_misuse(void) {
    const char *spec = "{\"jpg\": {\"center_crop\": 8}, \"cls\": \"int64\"}";
    unsigned char garbage[64];
    memset(garbage, 0x5a, sizeof garbage);
    const unsigned char jpeg_head[] = {0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 'J', 'F', 'I', 'F', 0};
    unsigned char out[3 * 8 * 8];
    ringfeed_image_info info;
    EXPECT_ERROR(ringfeed_image_transform(NULL, "jpg", garbage, 64, 0, 0, 0, out, sizeof out, NULL),
                 RINGFEED_ERR_INVALID_ARGUMENT, "spec_json");
    EXPECT_ERROR(ringfeed_image_transform(spec, NULL, garbage, 64, 0, 0, 0, out, sizeof out, NULL),
                 RINGFEED_ERR_INVALID_ARGUMENT, "field");
    EXPECT_ERROR(ringfeed_image_transform("{\"jpg\": {\"flip\": 2}}", "jpg", garbage, 64, 0, 0, 0, out,
                                          sizeof out, NULL),
                 RINGFEED_ERR_CONFIG, "field `jpg`");
    EXPECT_ERROR(ringfeed_image_transform("not json", "jpg", garbage, 64, 0, 0, 0, out, sizeof out, NULL),
                 RINGFEED_ERR_CONFIG, "not JSON");
    EXPECT_ERROR(ringfeed_image_transform(spec, "png", garbage, 64, 0, 0, 0, out, sizeof out, NULL),
                 RINGFEED_ERR_INVALID_ARGUMENT, "no image field `png`");
    EXPECT_ERROR(ringfeed_image_transform(spec, "jpg", NULL, 64, 0, 0, 0, out, sizeof out, NULL),
                 RINGFEED_ERR_INVALID_ARGUMENT, "data");
    EXPECT_ERROR(ringfeed_image_transform(spec, "jpg", garbage, 64, 0, 0, 0, NULL, sizeof out, NULL),
                 RINGFEED_ERR_INVALID_ARGUMENT, "out");
    EXPECT_ERROR(ringfeed_image_transform(spec, "jpg", garbage, 64, 0, 0, 0, out, sizeof out, NULL),
                 RINGFEED_ERR_FORMAT, "not a JPEG or PNG image");
    EXPECT_ERROR(ringfeed_image_transform(spec, "jpg", jpeg_head, sizeof jpeg_head, 0, 0, 0, out,
                                          sizeof out, NULL),
                 RINGFEED_ERR_FORMAT, "field `jpg`: JPEG");
    EXPECT_ERROR(ringfeed_image_transform(spec, "jpg", garbage, 0, 0, 0, 0, out, sizeof out, NULL),
                 RINGFEED_ERR_FORMAT, "0 bytes");
    memset(&info, 0, sizeof info);
    EXPECT_ERROR(ringfeed_image_transform(spec, "jpg", garbage, 64, 0, 0, 0, out, sizeof out - 1, &info),
                 RINGFEED_ERR_BUFFER_TOO_SMALL, "192 bytes");
    CHECK(info.out_bytes == 192 && info.dim0 == 3 && info.dim1 == 8 && info.dim2 == 8 &&
              info.elem_bytes == 1,
          "the size and shape a short buffer needs: %llu bytes, %ux%ux%u of %u",
          (unsigned long long)info.out_bytes, info.dim0, info.dim1, info.dim2, info.elem_bytes);
}

int main(int argc, char **argv) {
    /* A hang is a failure: SIGALRM ends the process. */
    alarm(240);
    read_dataset_args(argc, argv, 2, "SCRATCH_DIR ", &seed, &n_samples, &n_bytes, &shards,
                      &n_shards);
    scratch = argv[1];
    CHECK(n_shards >= 3, "abi_misuse needs at least 3 shards");

    bad_open_arguments();
    corrupt_shards();
    bad_handles();
    bad_releases();
    last_error_buffers();
    poll_with_timeout_zero();
    close_while_waiting();
    image_transform_misuse();
    plan_misuse();
    printf("abi_misuse: all checks passed\n");
    return 0;
}

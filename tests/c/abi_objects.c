/*
 * abi_objects.c — whole objects through the C ABI: read into the library's
 * memory (the bytes compared with the file's), read into a caller's buffer
 * (exact, too small, the size query), list (the JSON names each object; the
 * buffer-too-small protocol), write from a buffer and through a writer in
 * pieces, to local paths and, given an endpoint, to an S3 server; a second
 * write refused with RINGFEED_ERR_EXISTS; misuse (NULL arguments, unknown,
 * released and finished handles, non-UTF-8 URLs, bad configuration) giving
 * its documented status and a message; and a fork() child refused the
 * parent's writer while it reads its copy of an object's bytes.
 *
 * Usage: abi_objects SCRATCH_DIR [ENDPOINT ACCESS_KEY SECRET_KEY BUCKET]
 *   (SCRATCH_DIR: an empty directory; with the S3 arguments, the writes
 *   and reads are repeated on s3://BUCKET/)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

static const char *scratch;

/* Leaves a known message on this thread, so that a check proves the call
 * under test set one of its own. */
static void prime(void) {
    ringfeed_object *o = NULL;
    EXPECT_STATUS(ringfeed_object_read("x", "{\"__prime__\": 1}", &o), RINGFEED_ERR_CONFIG);
    CHECK(contains(last_error(), "__prime__"), "the priming error has another message");
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = (char *)malloc(n);
    CHECK(p != NULL, "out of memory");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* `n` bytes of a pattern that differs per seed and per offset. */
static uint8_t *pattern(size_t n, uint32_t seed) {
    uint8_t *p = (uint8_t *)malloc(n > 0 ? n : 1);
    CHECK(p != NULL, "out of memory");
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
    return p;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static ringfeed_object *read_or_die(const char *url, const char *config) {
    ringfeed_object *o = NULL;
    int32_t st = ringfeed_object_read(url, config, &o);
    if (st != RINGFEED_OK) {
        FAIL("ringfeed_object_read(%s) returned %s", url, ringfeed_status_name(st));
    }
    CHECK(o != NULL, "read succeeded but wrote a NULL handle");
    return o;
}

/* The object at `url` has exactly `want` (`n` bytes), read both ways. */
static void expect_object(const char *url, const char *config, const uint8_t *want, size_t n) {
    ringfeed_object *o = read_or_die(url, config);
    const uint8_t *data = NULL;
    uint64_t len = 1234;
    EXPECT_STATUS(ringfeed_object_data(o, &data, &len), RINGFEED_OK);
    CHECK(data != NULL, "%s: data is NULL", url);
    CHECK(len == n, "%s: %" PRIu64 " bytes, wanted %zu", url, len, n);
    CHECK(n == 0 || memcmp(data, want, n) == 0, "%s: the bytes differ", url);
    EXPECT_STATUS(ringfeed_object_release(o), RINGFEED_OK);

    /* The size query: no buffer. */
    uint64_t size = 0;
    EXPECT_STATUS(ringfeed_object_read_into(url, config, NULL, 0, &size),
                  n == 0 ? RINGFEED_OK : RINGFEED_ERR_BUFFER_TOO_SMALL);
    CHECK(size == n, "%s: size query gave %" PRIu64 ", wanted %zu", url, size, n);
    /* Exact, with a guard byte after that must stay. */
    uint8_t *buf = (uint8_t *)malloc(n + 1);
    CHECK(buf != NULL, "out of memory");
    memset(buf, 0xA5, n + 1);
    size = 0;
    EXPECT_STATUS(ringfeed_object_read_into(url, config, buf, n, &size), RINGFEED_OK);
    CHECK(size == n, "%s: read_into gave size %" PRIu64, url, size);
    CHECK(n == 0 || memcmp(buf, want, n) == 0, "%s: read_into's bytes differ", url);
    CHECK(buf[n] == 0xA5, "%s: read_into wrote past the object", url);
    /* One byte short: refused before any byte, the size still written. */
    if (n > 0) {
        memset(buf, 0xA5, n + 1);
        size = 0;
        EXPECT_ERROR(ringfeed_object_read_into(url, config, buf, n - 1, &size),
                     RINGFEED_ERR_BUFFER_TOO_SMALL, "bytes");
        CHECK(size == n, "%s: too-small read_into gave size %" PRIu64, url, size);
        CHECK(buf[0] == 0xA5, "%s: a too-small read_into wrote into the buffer", url);
    }
    free(buf);
}

/* The listing of `url` names each of `names` (and has `count` entries). */
static void expect_listing(const char *url, const char *config, const char *const *names,
                           size_t count) {
    size_t needed = 0;
    EXPECT_ERROR(ringfeed_object_list(url, config, NULL, 0, &needed),
                 RINGFEED_ERR_BUFFER_TOO_SMALL, "needs");
    CHECK(needed > 2, "listing %s: needed is %zu", url, needed);
    char *buf = (char *)malloc(needed + 1);
    CHECK(buf != NULL, "out of memory");
    /* Room for the text but not its NUL: still too small. */
    size_t again = 0;
    EXPECT_STATUS(ringfeed_object_list(url, config, buf, needed, &again),
                  RINGFEED_ERR_BUFFER_TOO_SMALL);
    CHECK(again == needed, "needed changed from %zu to %zu", needed, again);
    EXPECT_STATUS(ringfeed_object_list(url, config, buf, needed + 1, &again), RINGFEED_OK);
    CHECK(strlen(buf) == needed, "listing is %zu bytes, needed said %zu", strlen(buf), needed);
    CHECK(buf[0] == '[' && buf[needed - 1] == ']', "listing is not a JSON array: %s", buf);
    size_t entries = 0;
    for (const char *p = buf; (p = strstr(p, "\"url\"")) != NULL; p++) {
        entries++;
    }
    CHECK(entries == count, "listing has %zu entries, wanted %zu: %s", entries, count, buf);
    for (size_t i = 0; i < count; i++) {
        CHECK(contains(buf, names[i]), "listing lacks %s: %s", names[i], buf);
    }
    printf("  listing of %s: %s\n", url, buf);
    free(buf);
}

static ringfeed_writer *open_writer_or_die(const char *url, const char *config) {
    ringfeed_writer *w = NULL;
    int32_t st = ringfeed_writer_open(url, config, &w);
    if (st != RINGFEED_OK) {
        FAIL("ringfeed_writer_open(%s) returned %s", url, ringfeed_status_name(st));
    }
    CHECK(w != NULL, "open succeeded but wrote a NULL handle");
    return w;
}

/* Writes through the library to `base`/... (a local directory or an
 * s3://bucket), reads everything back, and checks the refusals.
 * `gone(name)` says whether an aborted object left nothing. */
static void writes_and_reads(const char *base, const char *config, const char *overwrite_config,
                             size_t big, int (*gone)(const char *)) {
    char *one = join(base, "one.bin");
    char *pieces = join(base, "pieces.bin");
    char *empty = join(base, "empty.bin");
    char *aborted = join(base, "aborted.bin");
    uint8_t *a = pattern(70001, 1);
    uint8_t *b = pattern(big, 2);

    /* One call; a second is refused, the first's bytes stay; overwrite
     * replaces. */
    EXPECT_STATUS(ringfeed_object_write(one, config, a, 70001), RINGFEED_OK);
    EXPECT_ERROR(ringfeed_object_write(one, config, b, 10), RINGFEED_ERR_EXISTS, "one.bin");
    expect_object(one, config, a, 70001);
    EXPECT_STATUS(ringfeed_object_write(one, overwrite_config, b, 5000), RINGFEED_OK);
    expect_object(one, config, b, 5000);
    /* An empty object, from NULL with length 0. */
    EXPECT_STATUS(ringfeed_object_write(empty, config, NULL, 0), RINGFEED_OK);
    expect_object(empty, config, (const uint8_t *)"", 0);

    /* A writer, in pieces of odd sizes across the part boundaries. */
    ringfeed_writer *w = open_writer_or_die(pieces, config);
    size_t off = 0, step = 1;
    while (off < big) {
        size_t n = big - off < step ? big - off : step;
        EXPECT_STATUS(ringfeed_writer_write(w, b + off, n), RINGFEED_OK);
        off += n;
        step = step * 7 + 13;
    }
    EXPECT_STATUS(ringfeed_writer_write(w, NULL, 0), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_writer_finish(w), RINGFEED_OK);
    expect_object(pieces, config, b, big);
    /* The finished handle is gone. */
    EXPECT_ERROR(ringfeed_writer_write(w, b, 1), RINGFEED_ERR_INVALID_HANDLE, "writer handle");
    EXPECT_ERROR(ringfeed_writer_finish(w), RINGFEED_ERR_INVALID_HANDLE, "writer handle");
    EXPECT_ERROR(ringfeed_writer_abort(w), RINGFEED_ERR_INVALID_HANDLE, "writer handle");
    /* A writer on an existing object fails at open, and leaves it. */
    w = (ringfeed_writer *)(uintptr_t)1;
    EXPECT_ERROR(ringfeed_writer_open(pieces, config, &w), RINGFEED_ERR_EXISTS, "pieces.bin");
    CHECK(w == NULL, "a failed open left a handle");
    expect_object(pieces, config, b, big);
    /* Aborted: nothing remains, and the handle is gone. */
    w = open_writer_or_die(aborted, config);
    EXPECT_STATUS(ringfeed_writer_write(w, b, big), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_writer_abort(w), RINGFEED_OK);
    CHECK(gone(aborted), "%s exists after an abort", aborted);
    EXPECT_ERROR(ringfeed_writer_write(w, b, 1), RINGFEED_ERR_INVALID_HANDLE, "writer handle");

    const char *names[] = {"one.bin", "pieces.bin", "empty.bin"};
    char *prefix = join(base, "");
    expect_listing(prefix, config, names, 3);

    /* A URL naming several objects is not one object. */
    ringfeed_object *o = (ringfeed_object *)(uintptr_t)1;
    EXPECT_ERROR(ringfeed_object_read(prefix, config, &o), RINGFEED_ERR_DATASET, "names 3");
    CHECK(o == NULL, "a failed read left a handle");

    free(prefix);
    free(a);
    free(b);
    free(one);
    free(pieces);
    free(empty);
    free(aborted);
}

static int local_gone(const char *path) {
    if (exists(path)) {
        return 0;
    }
    /* Nor a temporary file beside it. */
    char *dir = strdup(path);
    CHECK(dir != NULL, "out of memory");
    *strrchr(dir, '/') = '\0';
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -q ringfeed", dir);
    int found = system(cmd) == 0;
    free(dir);
    return !found;
}

static const char *s3_config_text;

static int s3_gone(const char *url) {
    ringfeed_object *o = NULL;
    int32_t st = ringfeed_object_read(url, s3_config_text, &o);
    return st != RINGFEED_OK && o == NULL;
}

static void misuse(const char *file_url, const uint8_t *want, size_t n) {
    ringfeed_object *o = NULL;
    EXPECT_ERROR(ringfeed_object_read(NULL, NULL, &o), RINGFEED_ERR_INVALID_ARGUMENT, "url");
    EXPECT_ERROR(ringfeed_object_read(file_url, NULL, NULL), RINGFEED_ERR_INVALID_ARGUMENT, "out");
    EXPECT_ERROR(ringfeed_object_read("/tmp/\xff\xfe.bin", NULL, &o),
                 RINGFEED_ERR_INVALID_ARGUMENT, "UTF-8");
    EXPECT_ERROR(ringfeed_object_read(file_url, "{not json", &o), RINGFEED_ERR_CONFIG, "JSON");
    EXPECT_ERROR(ringfeed_object_read(file_url, "[1]", &o), RINGFEED_ERR_CONFIG, NULL);
    EXPECT_ERROR(ringfeed_object_read(file_url, "{\"part_size\": 1}", &o), RINGFEED_ERR_CONFIG,
                 "part_size");
    EXPECT_ERROR(ringfeed_object_read(file_url, "{\"config\": \"\xff\"}", &o),
                 RINGFEED_ERR_INVALID_ARGUMENT, "UTF-8");
    char *missing = join(scratch, "missing.bin");
    EXPECT_ERROR(ringfeed_object_read(missing, NULL, &o), RINGFEED_ERR_DATASET, "missing.bin");
    EXPECT_ERROR(ringfeed_object_read_into(NULL, NULL, NULL, 0, NULL),
                 RINGFEED_ERR_INVALID_ARGUMENT, "url");
    uint8_t small[4];
    EXPECT_ERROR(ringfeed_object_read_into(file_url, NULL, NULL, 1u << 30, NULL),
                 RINGFEED_ERR_INVALID_ARGUMENT, "buf");
    EXPECT_ERROR(ringfeed_object_read_into(file_url, NULL, small, sizeof small, NULL),
                 RINGFEED_ERR_BUFFER_TOO_SMALL, NULL);
    size_t needed = 0;
    EXPECT_ERROR(ringfeed_object_list(NULL, NULL, NULL, 0, &needed),
                 RINGFEED_ERR_INVALID_ARGUMENT, "url");

    /* Handles: NULL, never read, released, released twice. */
    const uint8_t *data = NULL;
    uint64_t len = 0;
    EXPECT_ERROR(ringfeed_object_data(NULL, &data, &len), RINGFEED_ERR_INVALID_ARGUMENT, "object");
    ringfeed_object *bogus = (ringfeed_object *)(uintptr_t)0x1230;
    EXPECT_ERROR(ringfeed_object_data(bogus, &data, &len), RINGFEED_ERR_INVALID_HANDLE, "object");
    EXPECT_ERROR(ringfeed_object_release(bogus), RINGFEED_ERR_INVALID_HANDLE, "object");
    EXPECT_ERROR(ringfeed_object_release(NULL), RINGFEED_ERR_INVALID_ARGUMENT, "object");
    o = read_or_die(file_url, NULL);
    EXPECT_ERROR(ringfeed_object_data(o, NULL, &len), RINGFEED_ERR_INVALID_ARGUMENT, "data");
    EXPECT_ERROR(ringfeed_object_data(o, &data, NULL), RINGFEED_ERR_INVALID_ARGUMENT, "len");
    EXPECT_STATUS(ringfeed_object_data(o, &data, &len), RINGFEED_OK);
    CHECK(len == n && memcmp(data, want, n) == 0, "the object's bytes differ");
    EXPECT_STATUS(ringfeed_object_release(o), RINGFEED_OK);
    EXPECT_ERROR(ringfeed_object_release(o), RINGFEED_ERR_INVALID_HANDLE, "released");
    EXPECT_ERROR(ringfeed_object_data(o, &data, &len), RINGFEED_ERR_INVALID_HANDLE, "released");

    /* Writes: NULL url, data NULL with a length, non-UTF-8, bad config,
     * NULL out, unknown writers, an http:// destination. */
    char *dst = join(scratch, "misuse.bin");
    EXPECT_ERROR(ringfeed_object_write(NULL, NULL, want, 1), RINGFEED_ERR_INVALID_ARGUMENT, "url");
    EXPECT_ERROR(ringfeed_object_write(dst, NULL, NULL, 5), RINGFEED_ERR_INVALID_ARGUMENT, "data");
    EXPECT_ERROR(ringfeed_object_write("/tmp/\xc3\x28", NULL, want, 1),
                 RINGFEED_ERR_INVALID_ARGUMENT, "UTF-8");
    EXPECT_ERROR(ringfeed_object_write(dst, "{\"overwrite\": 3}", want, 1), RINGFEED_ERR_CONFIG,
                 "overwrite");
    EXPECT_ERROR(ringfeed_object_write("http://127.0.0.1:1/x", NULL, want, 1),
                 RINGFEED_ERR_DATASET, "uploads");
    CHECK(!exists(dst), "a refused write left %s", dst);
    ringfeed_writer *w = NULL;
    EXPECT_ERROR(ringfeed_writer_open(dst, NULL, NULL), RINGFEED_ERR_INVALID_ARGUMENT, "out");
    EXPECT_ERROR(ringfeed_writer_open(NULL, NULL, &w), RINGFEED_ERR_INVALID_ARGUMENT, "url");
    EXPECT_ERROR(ringfeed_writer_open(dst, "{\"checksum\": \"sha3\"}", &w), RINGFEED_ERR_CONFIG,
                 "checksum");
    CHECK(w == NULL, "a failed open left a handle");
    EXPECT_ERROR(ringfeed_writer_write(NULL, want, 1), RINGFEED_ERR_INVALID_ARGUMENT, "writer");
    EXPECT_ERROR(ringfeed_writer_finish(NULL), RINGFEED_ERR_INVALID_ARGUMENT, "writer");
    EXPECT_ERROR(ringfeed_writer_abort(NULL), RINGFEED_ERR_INVALID_ARGUMENT, "writer");
    ringfeed_writer *wbogus = (ringfeed_writer *)(uintptr_t)0x1230;
    EXPECT_ERROR(ringfeed_writer_write(wbogus, want, 1), RINGFEED_ERR_INVALID_HANDLE, "writer");
    EXPECT_ERROR(ringfeed_writer_finish(wbogus), RINGFEED_ERR_INVALID_HANDLE, "writer");
    /* An object handle is no writer handle, nor the reverse. */
    o = read_or_die(file_url, NULL);
    EXPECT_ERROR(ringfeed_writer_finish((ringfeed_writer *)(void *)o), RINGFEED_ERR_INVALID_HANDLE,
                 "writer");
    w = open_writer_or_die(dst, NULL);
    EXPECT_ERROR(ringfeed_object_release((ringfeed_object *)(void *)w), RINGFEED_ERR_INVALID_HANDLE,
                 "object");
    EXPECT_ERROR(ringfeed_writer_write(w, NULL, 5), RINGFEED_ERR_INVALID_ARGUMENT, "data");
    /* The writer still works after the refused call. */
    EXPECT_STATUS(ringfeed_writer_write(w, want, n), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_writer_finish(w), RINGFEED_OK);
    expect_object(dst, NULL, want, n);
    EXPECT_STATUS(ringfeed_object_release(o), RINGFEED_OK);
    free(missing);
    free(dst);
}

/* A child of fork() is refused the parent's writer (its upload threads are
 * the parent's), while its copy of an object's bytes reads and releases. */
static void fork_child_refused_writer(const char *file_url, const uint8_t *want, size_t n) {
    ringfeed_object *o = read_or_die(file_url, NULL);
    char *dst = join(scratch, "forked.bin");
    ringfeed_writer *w = open_writer_or_die(dst, NULL);
    EXPECT_STATUS(ringfeed_writer_write(w, want, 100), RINGFEED_OK);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        EXPECT_ERROR(ringfeed_writer_write(w, want, 1), RINGFEED_ERR_INVALID_HANDLE, "fork");
        EXPECT_ERROR(ringfeed_writer_finish(w), RINGFEED_ERR_INVALID_HANDLE, "fork");
        EXPECT_ERROR(ringfeed_writer_abort(w), RINGFEED_ERR_INVALID_HANDLE, "fork");
        const uint8_t *data = NULL;
        uint64_t len = 0;
        EXPECT_STATUS(ringfeed_object_data(o, &data, &len), RINGFEED_OK);
        CHECK(len == n && memcmp(data, want, n) == 0, "the child's copy of the bytes differs");
        EXPECT_STATUS(ringfeed_object_release(o), RINGFEED_OK);
        fflush(stdout);
        /* _exit: the parent's writer is not the child's to clean up. */
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the fork child failed (status %d)",
          status);
    /* The parent's handles are untouched by the child's calls. */
    EXPECT_STATUS(ringfeed_writer_write(w, want + 100, n - 100), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_writer_finish(w), RINGFEED_OK);
    expect_object(dst, NULL, want, n);
    const uint8_t *data = NULL;
    uint64_t len = 0;
    EXPECT_STATUS(ringfeed_object_data(o, &data, &len), RINGFEED_OK);
    EXPECT_STATUS(ringfeed_object_release(o), RINGFEED_OK);
    free(dst);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 6) {
        fprintf(stderr, "usage: %s SCRATCH_DIR [ENDPOINT ACCESS_KEY SECRET_KEY BUCKET]\n",
                argv[0]);
        return 2;
    }
    scratch = argv[1];
    alarm(240);

    /* A file written by the test itself: the bytes every read compares. */
    size_t n = (3u << 20) + 4321;
    uint8_t *bytes = pattern(n, 9);
    char *file = join(scratch, "model.bin");
    write_file(file, bytes, n);
    /* Parts of 64 KiB, so even this small object is many ranged reads. */
    const char *small_parts = "{\"part_size\": \"64KiB\", \"parts_in_flight\": 4}";
    expect_object(file, small_parts, bytes, n);
    expect_object(file, NULL, bytes, n);
    char file_url[4200];
    snprintf(file_url, sizeof file_url, "file://%s", file);
    expect_object(file_url, "{}", bytes, n);
    printf("reads: ok\n");

    /* Is it there: 1 for the file, 0 for a missing one, a NULL answer refused. */
    int32_t there = -1;
    EXPECT_STATUS(ringfeed_object_exists(file, NULL, &there), RINGFEED_OK);
    CHECK(there == 1, "exists(%s) gave %d", file, there);
    char *missing = join(scratch, "no-such-file");
    EXPECT_STATUS(ringfeed_object_exists(missing, NULL, &there), RINGFEED_OK);
    CHECK(there == 0, "exists(%s) gave %d", missing, there);
    EXPECT_ERROR(ringfeed_object_exists(file, NULL, NULL), RINGFEED_ERR_INVALID_ARGUMENT, "exists");
    free(missing);
    printf("exists: ok\n");

    char *local = join(scratch, "out");
    CHECK(mkdir(local, 0755) == 0, "mkdir %s: %s", local, strerror(errno));
    writes_and_reads(local, small_parts,
                     "{\"part_size\": \"64KiB\", \"parts_in_flight\": 4, \"overwrite\": true}",
                     (1u << 20) + 17, local_gone);
    printf("local writes: ok\n");

    misuse(file, bytes, n);
    printf("misuse: ok\n");
    fork_child_refused_writer(file, bytes, n);
    printf("fork: ok\n");

    if (argc == 6) {
        char config[2048], overwrite[2048], base[512];
        const char *keys = "\"s3_endpoint\": \"%s\", \"aws_access_key_id\": \"%s\", "
                           "\"aws_secret_access_key\": \"%s\", \"s3_region\": \"us-east-1\", "
                           "\"part_size\": \"5MiB\", \"parts_in_flight\": 3";
        char common[1536];
        snprintf(common, sizeof common, keys, argv[2], argv[3], argv[4]);
        snprintf(config, sizeof config, "{%s}", common);
        snprintf(overwrite, sizeof overwrite, "{%s, \"overwrite\": true}", common);
        snprintf(base, sizeof base, "s3://%s/run", argv[5]);
        s3_config_text = config;
        /* Above two parts: a multipart upload, read back in ranged GETs. */
        writes_and_reads(base, config, overwrite, (11u << 20) + 5, s3_gone);
        /* An object in S3 from the local file, and its listing. */
        char key[600];
        snprintf(key, sizeof key, "s3://%s/model.bin", argv[5]);
        EXPECT_STATUS(ringfeed_object_write(key, config, bytes, n), RINGFEED_OK);
        expect_object(key, config, bytes, n);
        EXPECT_ERROR(ringfeed_object_write(key, config, bytes, n), RINGFEED_ERR_EXISTS,
                     "model.bin");
        snprintf(key, sizeof key, "s3://%s/no-such-key", argv[5]);
        ringfeed_object *o = NULL;
        EXPECT_ERROR(ringfeed_object_read(key, config, &o), RINGFEED_ERR_DATASET, "no-such-key");
        int32_t there = -1;
        EXPECT_STATUS(ringfeed_object_exists(key, config, &there), RINGFEED_OK);
        CHECK(there == 0, "exists(%s) gave %d", key, there);
        snprintf(key, sizeof key, "s3://%s/model.bin", argv[5]);
        EXPECT_STATUS(ringfeed_object_exists(key, config, &there), RINGFEED_OK);
        CHECK(there == 1, "exists(%s) gave %d", key, there);
        CHECK(!contains(last_error(), argv[4]), "a message shows the secret key");
        printf("s3: ok\n");
    }

    free(local);
    free(file);
    free(bytes);
    printf("abi_objects: all checks passed\n");
    return 0;
}

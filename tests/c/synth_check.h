/*
 * synth_check.h — checks bytes written by ringfeed::synth (src/synth.rs)
 * without a copy of the dataset: every field's content is a function of
 * (seed, key, field name, length). A port of `synth::verify`; if the
 * generator changes, change both. Valid C11 and C++17, header-only.
 */
#ifndef RINGFEED_TEST_SYNTH_CHECK_H
#define RINGFEED_TEST_SYNTH_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* FNV-1a over key, a NUL, the field name and the length (8 bytes, LE). */
static inline uint64_t synth_content_seed(uint64_t seed, const char *key, const char *field,
                                          size_t len) {
    uint64_t h = UINT64_C(0xcbf29ce484222325) ^ seed;
    const uint64_t prime = UINT64_C(0x00000100000001b3);
    for (const char *p = key; *p; p++) {
        h = (h ^ (uint8_t)*p) * prime;
    }
    h = (h ^ 0) * prime;
    for (const char *p = field; *p; p++) {
        h = (h ^ (uint8_t)*p) * prime;
    }
    uint64_t n = (uint64_t)len;
    for (int i = 0; i < 8; i++) {
        h = (h ^ ((n >> (8 * i)) & 0xff)) * prime;
    }
    return h;
}

/* xorshift64*, as synth::Rng. */
static inline uint64_t synth_rng_next(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * UINT64_C(0x2545f4914f6cdd1d);
}

/* 1 when `data` is exactly what synth::fill writes for this field, else 0. */
static inline int synth_verify(uint64_t seed, const char *key, const char *field,
                               const uint8_t *data, size_t len) {
    uint64_t state = synth_content_seed(seed, key, field, len) | 1;
    size_t i = 0;
    while (i < len) {
        uint64_t word = synth_rng_next(&state);
        for (int b = 0; b < 8 && i < len; b++, i++) {
            if (data[i] != (uint8_t)(word >> (8 * b))) {
                return 0;
            }
        }
    }
    return 1;
}

/*
 * Parses a synth key ("000003-0000012": shard 3, sample 12) into
 * shard * 10^7 + sample, a number that sorts like the key. Returns 0 for a
 * key of any other shape.
 */
static inline int synth_parse_key(const char *key, uint64_t *out) {
    if (strlen(key) != 14 || key[6] != '-') {
        return 0;
    }
    uint64_t shard = 0, sample = 0;
    for (int i = 0; i < 14; i++) {
        if (i == 6) {
            continue;
        }
        if (key[i] < '0' || key[i] > '9') {
            return 0;
        }
        if (i < 6) {
            shard = shard * 10 + (uint64_t)(key[i] - '0');
        } else {
            sample = sample * 10 + (uint64_t)(key[i] - '0');
        }
    }
    *out = shard * UINT64_C(10000000) + sample;
    return 1;
}

#endif /* RINGFEED_TEST_SYNTH_CHECK_H */

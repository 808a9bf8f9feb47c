#!/usr/bin/env bash
# What a first touch of memory costs on this machine: a C program maps
# SIZE bytes, writes one byte per page (the page faults: the kernel zeroes
# each page, and on a VM whose host backs guest memory only when it is
# first used, the host faults too), then writes the whole region again
# (no fault), for ordinary pages and for transparent huge pages
# (MADV_HUGEPAGE), ROUNDS times each, every round a fresh mapping.
#
# Why it matters: a reader of an object store holds its bandwidth-delay
# product in memory (~345 MB at 3 GB/s and S3's ~115 ms per 8 MiB GET);
# curl writing to /dev/null holds a few buffers. Where the first touch
# runs at ~0.5 GB/s (this machine, a VM; ~10-20 GB/s on bare metal), a
# run of a few seconds spends a large share of its CPU faulting in the
# memory it reads into, once: benches/object_store.sh scenario L shows the
# same readers over several passes.
#
# A benchmark program, not a test. Usage: benches/first_touch.sh
# Knobs: SIZE in MiB [1024], ROUNDS [3].
set -euo pipefail
SIZE=${SIZE:-1024}
ROUNDS=${ROUNDS:-3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/touch.c" <<'C'
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t len = (size_t)atol(argv[1]) << 20;
    int rounds = atoi(argv[2]);
    for (int huge = 0; huge < 2; huge++) {
        for (int r = 1; r <= rounds; r++) {
            char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) {
                perror("mmap");
                return 1;
            }
            if (huge && madvise(p, len, MADV_HUGEPAGE) != 0)
                perror("madvise(MADV_HUGEPAGE)");
            double t0 = now();
            for (size_t i = 0; i < len; i += 4096)
                p[i] = 1;
            double t1 = now();
            memset(p, 2, len);
            double t2 = now();
            printf("%-16s round %d: first touch %6.2f GB/s (%5.2f ms per MB), again %6.2f GB/s\n",
                   huge ? "huge pages (THP)" : "4 KiB pages", r, len / (t1 - t0) / 1e9,
                   (t1 - t0) * 1e3 / (len / 1e6), len / (t2 - t1) / 1e9);
            munmap(p, len);
        }
    }
    return 0;
}
C
cc -O2 -o "$dir/touch" "$dir/touch.c"
echo "first touch of $SIZE MiB, $ROUNDS rounds a kind, every round a fresh mapping"
echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
"$dir/touch" "$SIZE" "$ROUNDS"

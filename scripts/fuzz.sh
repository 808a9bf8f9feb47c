#!/usr/bin/env bash
# Runs every fuzz target for SECONDS_PER_TARGET seconds (default 60), one
# after another, and fails when any of them crashes, naming it.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
#   FUZZ_TARGETS="tar_walk http_response" scripts/fuzz.sh 300
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# Targets build with AddressSanitizer and debug assertions (so an integer
# overflow is a crash too). Each run starts from the committed seeds
# (fuzz/corpus/<target>, read only) and a working corpus that persists
# across runs (fuzz/target/corpus/<target>, not committed); a crash leaves
# its input in fuzz/artifacts/<target>/ and the log in
# fuzz/target/logs/<target>.log. Limits: 10 s per input (a hang), 2 GiB of
# memory (an unbounded allocation). See docs/fuzzing.md.
set -uo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
all="tar_walk http_response http_request config manifest resume s3_xml cache_entry key_glob node_proto image_bytes hub_answer"
read -r -a targets <<<"${FUZZ_TARGETS:-$all}"

if ! cargo +nightly fuzz --help >/dev/null 2>&1; then
    echo "fuzz.sh: needs cargo-fuzz on the nightly toolchain: cargo install cargo-fuzz" >&2
    exit 2
fi
if ! (cd fuzz && cargo +nightly fuzz build); then
    echo "fuzz.sh: the fuzz targets do not build" >&2
    exit 2
fi
mkdir -p fuzz/target/logs
failed=()
printf '%-14s %8s %12s %10s  %s\n' target seconds executions exec/s result
for t in "${targets[@]}"; do
    work=fuzz/target/corpus/$t
    log=fuzz/target/logs/$t.log
    mkdir -p "$work"
    (cd fuzz && cargo +nightly fuzz run "$t" "../$work" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1) \
        >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    if [ "$rc" -eq 0 ]; then
        result=ok
    else
        result="CRASH (exit $rc): see $log"
        failed+=("$t")
    fi
    printf '%-14s %8s %12s %10s  %s\n' "$t" "$secs" "${execs:-?}" "${rate:-?}" "$result"
    if [ "$rc" -ne 0 ]; then
        grep -a -E '^(thread .* panicked|==[0-9]+==ERROR|SUMMARY|artifact_prefix|Test unit written)' "$log" \
            | head -n 8 | sed 's/^/    /'
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz.sh: crashed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz.sh: no crash in ${#targets[@]} targets x ${secs} s"

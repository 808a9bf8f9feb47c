#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this script):
# formatting, lints, the header drift check, unit and property tests, the
# loom model of the ring, end-to-end loader tests on generated shards, and
# the C and C++ programs built with -Werror and ASan/UBSan against the library.
set -euo pipefail
cd "$(dirname "$0")/.."

# The C ABI tests compile C and C++ programs with sanitizers.
if ! command -v cc >/dev/null || ! command -v c++ >/dev/null; then
    apt-get update -qq && apt-get install -y -qq gcc g++ >/dev/null
fi

cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --all-targets --locked --no-fail-fast

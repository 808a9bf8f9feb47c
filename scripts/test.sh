#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this script):
# formatting, lints, the header drift check, unit and property tests, the
# loom model of the ring, end-to-end loader tests on generated shards, and
# the C and C++ programs built with -Werror and ASan/UBSan against the library
# (and the misuse and race programs under valgrind), the install
# (scripts/install.sh) with a CMake and a pkg-config program built on it,
# then the Python package: installed by pip into .venv (which builds and
# bundles the release library) and tested with pytest, torch included; a
# dependency that cannot be installed fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

# No test may reach past 127.0.0.1. The S3 credential chain ends at the
# instance metadata service (169.254.169.254); tests that need it point it at
# a local server, and this keeps any other path from trying the real one.
export AWS_EC2_METADATA_DISABLED=true

# The C ABI tests compile C and C++ programs with sanitizers, and run two
# of them under valgrind (tests/c_abi.rs fails without it).
if ! command -v cc >/dev/null || ! command -v c++ >/dev/null; then
    apt-get update -qq && apt-get install -y -qq gcc g++ >/dev/null
fi
if ! command -v valgrind >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi
# tests/install.rs builds the CMake example and a pkg-config program against
# an install (scripts/install.sh).
if ! command -v cmake >/dev/null || ! command -v pkg-config >/dev/null; then
    apt-get update -qq && apt-get install -y -qq cmake pkg-config >/dev/null
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The release build first: tests/install.rs runs scripts/install.sh, whose
# `cargo build --release` then has nothing left to do. The Python package
# below bundles it too (pip runs the same build),
# and its tests generate shards with the release CLI and write to the
# S3-compatible server of examples/s3_server.rs.
cargo build --release --locked
# A Rust test that finds what it needs missing calls tests/support/skip.rs,
# which fails under RINGFEED_EXPECT_INSTALLED=1 (this machine has everything
# the suite needs) and elsewhere records the skip in skipped-tests.txt, listed
# here after the run so a skip never reads as a pass.
rm -f target/tmp/skipped-tests.txt
rust_status=0
RINGFEED_EXPECT_INSTALLED=1 cargo test --workspace --all-targets --locked --no-fail-fast || rust_status=$?
if [ -s target/tmp/skipped-tests.txt ]; then
    echo "test.sh: Rust tests that skipped:" >&2
    cat target/tmp/skipped-tests.txt >&2
fi
[ "$rust_status" -eq 0 ] || exit "$rust_status"

cargo build --release --locked --example s3_server
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
rm -rf bindings/python/build
# webdataset: the compatibility tests read every shard with it too
# (bindings/python/tests/test_webdataset_compat.py); required here, a failed
# install fails the run rather than skipping that comparison. safetensors:
# ringfeed.load_safetensors is checked against the files it writes
# (bindings/python/tests/test_safetensors.py).
.venv/bin/python -m pip install -q ./bindings/python numpy pytest pillow webdataset safetensors
# torch (CPU use only) for ringfeed.torch, the DLPack and decoding tests and
# the training example; torchdata for StatefulDataLoader; torchvision for its
# image decoder. Required like webdataset: a failed install fails the run,
# since the tests that need them would otherwise not run at all.
if ! .venv/bin/python -m pip install -q torch torchdata torchvision; then
    echo "test.sh: torch, torchdata or torchvision could not be installed: the tests that need them cannot run" >&2
    exit 1
fi
# RINGFEED_EXPECT_INSTALLED=1: everything above is installed, so a test
# skipping for a missing module (or any skip not marked environmental in
# conftest.py) is a failure; -rs lists the environmental skips that remain.
# A test module that fails at import is reported and the others still run.
status=0
RINGFEED_EXPECT_INSTALLED=1 .venv/bin/python -m pytest bindings/python/tests -q -rs \
    --continue-on-collection-errors || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
fi
exit "$status"

#!/usr/bin/env bash
# The compiler of the workspace's own crates in scripts/test.sh (cargo's
# RUSTC_WORKSPACE_WRAPPER, the variable `cargo clippy` sets): the test build
# lints as it compiles, so the suite needs no `cargo clippy` of its own.
#
#     RUSTC_WORKSPACE_WRAPPER=scripts/lint_rustc.sh CLIPPY_ARGS=... cargo ...
#
# `cargo clippy` is `cargo check` with clippy-driver (rustc with clippy's
# lints) compiling the workspace's crates, and check mode shares nothing
# with a build: it made the suite compile every dependency a second time
# (about three minutes of CI's two CPUs). clippy-driver compiles as rustc
# does, so the test build (`cargo test --workspace --all-targets --no-run`:
# the library, its tests, the programs, the examples, the benchmarks, every
# target `cargo clippy --all-targets` checks) is made with it instead, with
# clippy's arguments from CLIPPY_ARGS as `cargo clippy` passes them.
#
# Builds that optimise (the release build, which the Python package bundles
# and the benchmarks time) go to rustc itself: clippy-driver turns off
# rustc's MIR optimisations for its lints, which would change the code they
# ship. The wrapper is set for the whole suite even so, since cargo counts
# it in the fingerprint of each crate it compiles: a build inside a test
# (tests/install.rs, the C ABI tests' library) finds the suite's own and
# compiles nothing again.
#
# Cargo calls it as `lint_rustc.sh RUSTC ARGS...`.
set -euo pipefail
rustc=$1
shift
optimised=false
previous=""
for arg in "$@"; do
    case "$previous/$arg" in
    -C/opt-level=0 | */-Copt-level=0) ;;
    -C/opt-level=* | */-Copt-level=*) optimised=true ;;
    esac
    previous=$arg
done
if $optimised; then
    exec "$rustc" "$@"
fi
# The clippy-driver of rustc's toolchain where it lies beside it (rustup
# installs both), else the one on PATH.
driver=clippy-driver
case "$rustc" in
*/*) [ -x "$(dirname "$rustc")/clippy-driver" ] && driver=$(dirname "$rustc")/clippy-driver ;;
esac
# In this mode clippy-driver takes rustc's path first, as cargo gives it.
exec "$driver" "$rustc" "$@"

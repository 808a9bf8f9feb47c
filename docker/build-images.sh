#!/usr/bin/env bash
# Builds the two images deploy/ runs, from the release build, without a
# Docker daemon (podman, else buildah; docker where neither is installed):
#
#   docker/build-images.sh [--registry REGISTRY] [--tag TAG] [--base IMAGE]
#                          [--pip-packages 'PKG...'] [--push]
#
#   REGISTRY/ringfeed-node:TAG      the `ringfeed` program (docker/Dockerfile, target node)
#   REGISTRY/ringfeed-trainer:TAG   Python, the wheel, PyTorch, examples/train.py (target trainer)
#
# REGISTRY defaults to `localhost` (the name podman gives an image it built
# and holds), TAG to the version in Cargo.toml: the names deploy/
# kustomization.yaml's `images:` gives the pods. Built for a registry
# (`--registry registry.example.com/ml --push`), set the same there:
# `kustomize edit set image ringfeed-node=registry.example.com/ml/ringfeed-node:TAG`.
# BASE (default debian:bookworm-slim) is any Debian 12 image;
# docker/debian-base.sh makes one from Debian's packages with no registry.
# --pip-packages replaces the trainer's PyPI packages (default PyTorch,
# torchdata and Pillow; '' for none, as the test command builds it).
#
# It runs `cargo build --release --locked -p ringfeed -p ringfeed-cli` (a
# no-op when the release build is current) and builds the wheel from it
# with $PYTHON (default python3, with pip, setuptools and wheel); the build
# context is target/images/context. Prints the two image names.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: $0 [--registry REGISTRY] [--tag TAG] [--base IMAGE] [--pip-packages 'PKG...'] [--push]" >&2
    exit 2
}

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
registry=localhost
tag=$version
base=""
pip_packages=""
pip_given=0
push=0
while [ $# -gt 0 ]; do
    case "$1" in
        --registry) [ $# -ge 2 ] || usage; registry=$2; shift 2 ;;
        --tag) [ $# -ge 2 ] || usage; tag=$2; shift 2 ;;
        --base) [ $# -ge 2 ] || usage; base=$2; shift 2 ;;
        --pip-packages) [ $# -ge 2 ] || usage; pip_packages=$2; pip_given=1; shift 2 ;;
        --push) push=1; shift ;;
        -h|--help) usage ;;
        *) echo "$0: unknown argument '$1'" >&2; usage ;;
    esac
done

if command -v podman >/dev/null; then
    build=(podman build)
    tool=podman
elif command -v buildah >/dev/null; then
    build=(buildah bud)
    tool=buildah
elif command -v docker >/dev/null; then
    build=(docker build)
    tool=docker
else
    echo "$0: none of podman, buildah or docker is installed (Debian: apt-get install --no-install-recommends podman)" >&2
    exit 1
fi

cargo build --release --locked -p ringfeed -p ringfeed-cli
target=${CARGO_TARGET_DIR:-target}
context=$target/images/context
rm -rf "$context"
mkdir -p "$context"
cp "$target/release/ringfeed" "$context/ringfeed"
cp examples/train.py "$context/train.py"
# The wheel of the release build above (setup.py finds it current and
# bundles it): no build isolation, so nothing is fetched for it.
"${PYTHON:-python3}" -m pip wheel --quiet --no-deps --no-build-isolation \
    --disable-pip-version-check -w "$context" ./bindings/python >&2

args=(-f docker/Dockerfile)
[ -z "$base" ] || args+=(--build-arg "BASE=$base")
[ "$pip_given" -eq 0 ] || args+=(--build-arg "PIP_PACKAGES=$pip_packages")
# A base this machine built (localhost/...) is never pulled.
case "$base" in
    localhost/*) [ "$tool" = docker ] || args+=(--pull=never) ;;
esac
for name in node trainer; do
    image=$registry/ringfeed-$name:$tag
    "${build[@]}" "${args[@]}" --target "$name" -t "$image" "$context" >&2
    if [ "$push" -eq 1 ]; then
        "$tool" push "$image" >&2
    fi
    echo "$image"
done

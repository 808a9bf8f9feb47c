#!/usr/bin/env bash
# Runs benches/torch_vs_webdataset.py in the repository's .venv (created by
# scripts/test.sh), installing what it compares (torch, webdataset, Pillow)
# there first. Arguments pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q ./bindings/python numpy torch webdataset pillow
mkdir -p benches/out/torch
exec .venv/bin/python benches/torch_vs_webdataset.py --json benches/out/torch/results.json "$@"

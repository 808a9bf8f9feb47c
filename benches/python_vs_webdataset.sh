#!/usr/bin/env bash
# Runs benches/python_vs_webdataset.py in the repository's .venv (created by
# scripts/test.sh), installing what it compares (webdataset, and torch for
# the DataLoader that WebDataset runs under) there first. Arguments pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q ./bindings/python numpy torch webdataset
mkdir -p benches/out/python
exec .venv/bin/python benches/python_vs_webdataset.py --json benches/out/python/results.json "$@"

#!/usr/bin/env bash
# The cipher's cost alone: decryption of 16 KiB TLS records on one core, by
# ring (the engine's rustls provider) and by aws-lc-rs, for AES-128-GCM,
# AES-256-GCM and ChaCha20-Poly1305, rounds rotating over the contenders,
# medians and ratios to ring printed (benches/aead/src/main.rs). Built in
# its own workspace (benches/aead), so the engine's build never compiles
# aws-lc. Arguments pass through: [--seconds 1] [--rounds 5].
set -euo pipefail
cd "$(dirname "$0")/aead"
cargo build --release --locked -q 2>/dev/null || cargo build --release -q
exec target/release/ringfeed-bench-aead "$@"

//! The engine under random faults: a proxy between it and a real server
//! (the one `ringfeed serve` runs, in this process) draws, from a seed, a
//! fault for some of the ranged GETs — 503 Slow Down, 500, a reset before
//! the head, before the body or in its middle, a truncated body, a stall
//! before the head or mid-body, a slow drip, a `Content-Range` that is not
//! the range asked, a `Content-Length` that is not the range's — on both
//! I/O backends. Every sample arrives exactly once with the generator's
//! bytes (every field is checked byte for byte against the pattern the
//! files were written with), and the engine's retries, by kind, are those
//! the proxy injected.
//!
//! The test command runs a short soak (a few hundred requests per backend).
//! A long one, of `RINGFEED_SOAK_GB` gigabytes per backend:
//!
//! ```sh
//! RINGFEED_SOAK_GB=10 cargo test --release --test soak -- --nocapture
//! ```
//!
//! `RINGFEED_SOAK_SEED` picks the faults' seed (printed by every run).

use ringfeed_test_support as support;

use std::collections::BTreeMap;
use std::time::Instant;

use ringfeed::serve::{ServeOptions, Server};
use ringfeed::synth::{GenOptions, generate};
use ringfeed::{Config, Loader};
use support::{Proxy, RANDOM_FAULTS, RandomFaults};

/// Faults drawn for this many GETs in a thousand.
const PER_MILLE: u64 = 80;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// What the engine should count for the faults injected: the retries of
/// each kind.
fn expected_retries(injected: &BTreeMap<&'static str, usize>) -> BTreeMap<&'static str, usize> {
    let mut want = BTreeMap::new();
    for (fault, kind) in RANDOM_FAULTS {
        if let (Some(kind), Some(&n)) = (kind, injected.get(fault)) {
            *want.entry(*kind).or_default() += n;
        }
    }
    want
}

fn soak(backend: &str) {
    let gb = env_u64("RINGFEED_SOAK_GB");
    let seed = env_u64("RINGFEED_SOAK_SEED").unwrap_or(20261201);
    let dir = tempfile::tempdir().unwrap();
    // Short: 6 shards of 6 MiB read in 256 KiB ranges (~150 GETs); long:
    // shards of 256 MiB read in 1 MiB ranges.
    let (shards, shard_bytes, chunk) = match gb {
        Some(gb) => ((gb * 4).max(1) as usize, 256u64 << 20, "1MiB"),
        None => (6, 6 << 20, "256KiB"),
    };
    let made = generate(
        dir.path(),
        &GenOptions {
            shards,
            shard_bytes,
            sample_bytes: 60_000,
            spread: 0.5,
            fields: vec!["jpg".into(), "cls".into()],
            seed,
        },
        |_| {},
    )
    .unwrap();
    let server = Server::bind("127.0.0.1:0", dir.path(), ServeOptions::default()).unwrap();
    let proxy = Proxy::start(server.addr());
    *proxy.faults.random.lock().unwrap() = Some(RandomFaults::new(seed, PER_MILLE, 1500));
    let pattern = std::path::Path::new(&made.pattern)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let cfg = serde_json::json!({
        "urls": format!("http://{}/{pattern}", proxy.addr),
        "batch_size": 16,
        "workers": 2,
        "memory_budget": "32MiB",
        "chunk_size": chunk,
        "stall_timeout_ms": 500,
        "max_attempts": 20,
        "io_backend": backend,
    });
    let started = Instant::now();
    let loader = Loader::open(Config::from_map(cfg.as_object().unwrap()).unwrap()).unwrap();
    let samples = support::stream(&loader, seed);
    let secs = started.elapsed().as_secs_f64();
    let stats = loader.stats();
    drop(loader);
    let injected = proxy
        .faults
        .random
        .lock()
        .unwrap()
        .as_ref()
        .unwrap()
        .injected
        .clone();
    let gets = proxy.faults.gets.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "{backend}: seed {seed}, {} bytes in {samples} samples, {secs:.1} s; {gets} GETs; \
         injected {injected:?}; retries {:?}",
        made.file_bytes, stats.retries
    );
    // Nothing lost, nothing twice, nothing wrong (`stream` checks each
    // sample's bytes and that none comes twice).
    assert_eq!(samples as u64, made.samples, "{backend}: samples lost");
    let total: usize = injected.values().sum();
    assert!(
        total >= 5,
        "{backend}: only {total} faults drawn: {injected:?}"
    );
    // Each fault is one retry of its kind, but for a reset before the head
    // on a reused keep-alive connection: a server closing an idle
    // connection looks the same, and is retried at once on a fresh one
    // without counting. A loaded machine may add stalls (a slow answer
    // looks like one; the drip's pauses too), each a harmless retry;
    // nothing else.
    let want = expected_retries(&injected);
    let got = |k: &str| stats.retries.get(k).copied().unwrap_or(0);
    let wanted = |k: &str| want.get(k).copied().unwrap_or(0) as u64;
    // A hedge (io_uring) races a late range on a fresh connection: a
    // fault that hits one of the pair while the other carries the range on
    // is not retried, so each hedge may take one fault's retry away.
    let hedges = stats.hedges_sent;
    for (kind, &n) in &stats.retries {
        if !["stalled", "reset", "truncated"].contains(kind) {
            let w = wanted(kind);
            assert!(
                n <= w && n + hedges >= w,
                "{backend}: `{kind}` retries: {n}, {w} injected, {hedges} hedges"
            );
        }
    }
    assert!(
        got("stalled") + hedges >= wanted("stalled"),
        "{backend}: {:?}",
        stats.retries
    );
    // A reset and a close mid-body look alike to the receiver.
    let both = got("reset") + got("truncated");
    let hi = wanted("reset") + wanted("truncated");
    let lo = (hi - injected.get("reset_before_head").copied().unwrap_or(0) as u64)
        .saturating_sub(hedges);
    assert!(
        (lo..=hi).contains(&both),
        "{backend}: {both} resets and truncations, {lo} to {hi} injected: {:?}",
        stats.retries
    );
    // Bounded: the extra stalls are a few per cent of the requests at most.
    let extra = got("stalled").saturating_sub(wanted("stalled"));
    assert!(
        extra <= 3 + gets as u64 / 20,
        "{backend}: {extra} stalls beyond those injected in {gets} GETs"
    );
}

#[test]
fn random_faults_lose_nothing_on_io_uring() {
    soak("io_uring");
}

#[test]
fn random_faults_lose_nothing_on_threads() {
    soak("threads");
}

//! Late ranges hedged on the io_uring backend, against the test server on
//! 127.0.0.1: a GET whose head is held, and one whose body stops halfway,
//! both for two minutes. With the stall time-out at ten minutes only a
//! hedge can finish the read before the watchdog (each `next` waits a
//! minute at most, and `stream` panics past it): the read finishes, every
//! byte checked, a hedge counted sent and won, no retry; and a raced head
//! whose twin then stalls in its body is handed over once more. The controls:
//! the same reads with `hedge: false` and a 2 s stall time-out finish only
//! through a stall retry, with no hedge sent.

use ringfeed_test_support as support;

use std::path::Path;

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Loader};
use support::{Server, stream};

const SEED: u64 = 33;
/// The GET that is held: past the first 20 answers, so its host's wait is
/// the recent p95 (at its 50 ms floor on loopback), not the cold 1 s.
const NTH: usize = 40;
/// How long the server holds it: twice the watchdog, so a read that waited
/// for it would fail the test.
const HOLD_MS: u64 = 120_000;

/// Three shards of 2 MiB: some 100 ranged GETs of 64 KiB.
fn dataset(dir: &Path) -> usize {
    let o = GenOptions {
        shards: 3,
        shard_bytes: 2 << 20,
        sample_bytes: 40_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed: SEED,
    };
    synth::generate(dir, &o, |_| {}).unwrap().samples as usize
}

fn config(url: String, hedge: bool, stall_ms: u64) -> Config {
    let m = serde_json::json!({
        "urls": [url],
        "memory_budget": "8MiB",
        "chunk_size": "64KiB",
        "batch_size": 5,
        "workers": 1,
        "io_backend": "io_uring",
        "hedge": hedge,
        "stall_timeout_ms": stall_ms,
    });
    Config::from_map(m.as_object().unwrap()).unwrap()
}

/// Reads the dataset from a fresh server whose `NTH` GET gets `fault`;
/// returns the loader's stats.
fn read_with(fault: fn(&Server), hedge: bool, stall_ms: u64) -> ringfeed::Stats {
    let dir = tempfile::tempdir().unwrap();
    let samples = dataset(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    fault(&server);
    let url = server.url("shard-{000000..000002}.tar");
    let loader = Loader::open(config(url, hedge, stall_ms)).unwrap();
    assert_eq!(stream(&loader, SEED), samples);
    let s = loader.stats();
    eprintln!(
        "hedge {hedge}: {} requests, hedges sent {} won {}, retries {:?}",
        s.http_requests, s.hedges_sent, s.hedges_won, s.retries
    );
    s
}

fn hold_head(s: &Server) {
    *s.faults.hold_head.lock().unwrap() = Some((NTH, HOLD_MS));
}

fn stall_body(s: &Server) {
    *s.faults.stall_body.lock().unwrap() = Some((NTH, HOLD_MS));
}

/// The held head's range is raced, and the twin that takes it stalls
/// halfway through its body.
fn hold_head_then_stall_the_twin(s: &Server) {
    hold_head(s);
    *s.faults.stall_repeat.lock().unwrap() = Some(HOLD_MS);
}

/// Ten minutes: longer than the test could wait.
const NEVER_MS: u64 = 600_000;

#[test]
fn a_held_head_is_hedged_and_the_hedge_wins() {
    let s = read_with(hold_head, true, NEVER_MS);
    assert!(s.hedges_sent >= 1 && s.hedges_won >= 1, "{s:?}");
    assert!(s.hedges_won <= s.hedges_sent);
    assert_eq!(s.retries.values().sum::<u64>(), 0, "{:?}", s.retries);
}

#[test]
fn without_hedging_a_held_head_waits_for_the_stall_time_out() {
    let s = read_with(hold_head, false, 2_000);
    assert_eq!((s.hedges_sent, s.hedges_won), (0, 0));
    assert!(s.retries["stalled"] >= 1, "{:?}", s.retries);
}

#[test]
fn a_body_stalled_halfway_is_handed_to_a_fresh_connection() {
    let s = read_with(stall_body, true, NEVER_MS);
    assert!(s.hedges_sent >= 1 && s.hedges_won >= 1, "{s:?}");
    assert_eq!(s.retries.values().sum::<u64>(), 0, "{:?}", s.retries);
}

#[test]
fn without_hedging_a_stalled_body_waits_for_the_stall_time_out() {
    let s = read_with(stall_body, false, 2_000);
    assert_eq!((s.hedges_sent, s.hedges_won), (0, 0));
    assert!(s.retries["stalled"] >= 1, "{:?}", s.retries);
}

/// A race's winner that stalls in its body is handed to a fresh
/// connection like any range (once a range raced, it was left to the stall
/// time-out: the original's head and the twin's body both held, the read
/// waited for the watchdog).
#[test]
fn a_twin_that_won_and_stalls_is_handed_over_too() {
    let s = read_with(hold_head_then_stall_the_twin, true, NEVER_MS);
    assert!(s.hedges_sent >= 2 && s.hedges_won >= 1, "{s:?}");
    assert_eq!(s.retries.values().sum::<u64>(), 0, "{:?}", s.retries);
}

//! A server that limits GETs to N a second (the test server's token
//! bucket, answering 503 SlowDown past it, as S3 does past a prefix's
//! rate): the loader rides the limit, on both backends. Every sample
//! arrives once with its bytes, the 503s stay a small share of the GETs,
//! and the pacer's rate for the host (the stats' note) ends near N — a
//! value the pacer holds, not a timing of the test. The control: the same
//! read with the adaptation off (`set_pacing(false)`, requests at once,
//! throttled ones retried after their backoff alone) draws many times the
//! 503s. One test: the switch is process-wide.

use ringfeed_test_support as support;

use std::sync::atomic::Ordering;

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Loader};
use support::{Server, stream};

const SEED: u64 = 28;
/// GETs a second the server takes: low enough that the loader's readers
/// (2 workers, several reads in flight each over loopback, hundreds of
/// GETs a second even in a debug build on a loaded machine) are far past
/// it, high enough that the read takes seconds.
const LIMIT: usize = 40;

fn config(url: String, backend: &str) -> Config {
    let m = serde_json::json!({
        "urls": [url],
        // The whole dataset (8 MiB) and every batch of it fit in memory
        // and the ring: the readers never wait for the test's consumer,
        // whose pace on a loaded machine (checking every byte in a debug
        // build, beside other tests) can fall under the limit, when there
        // would be nothing to ride (on CI the threads backend once took
        // 153 GETs without a 503).
        "memory_budget": "32MiB",
        "prefetch_batches": 4096,
        // 64 KiB ranges: some 130 GETs, a few seconds at the limit.
        "chunk_size": "64KiB",
        "batch_size": 5,
        "workers": 2,
        "io_backend": backend,
        // Pacing alone: a hedge's twin that is answered 503 while the
        // other carries its range on is not retried, which would break the
        // exact count of retries against 503s below (hedging has its own
        // tests, tests/hedge.rs).
        "hedge": false,
    });
    Config::from_map(m.as_object().unwrap()).unwrap()
}

/// The rate the note of `host` says its requests are paced at.
fn paced_rate(notes: &[String], host: &str) -> Option<f64> {
    notes.iter().find_map(|n| {
        let rest = n.strip_prefix(host)?.split("paced at ").nth(1)?;
        rest.split("/s").next()?.parse().ok()
    })
}

/// The rate the note of `host` says its requests were taken at without
/// throttling.
fn taken_rate(notes: &[String], host: &str) -> Option<f64> {
    notes.iter().find_map(|n| {
        let rest = n.strip_prefix(host)?.split("(taken ").nth(1)?;
        rest.split("/s").next()?.parse().ok()
    })
}

/// Reads the dataset through the limit; returns (GETs, 503s, the paced
/// rate in the stats, the rate taken without throttling).
fn read(
    server: &Server,
    url: &str,
    backend: &str,
    samples: usize,
) -> (usize, usize, Option<f64>, Option<f64>) {
    let f = &server.faults;
    let (gets0, limited0) = (
        f.gets.load(Ordering::SeqCst),
        f.limited.load(Ordering::SeqCst),
    );
    let loader = Loader::open(config(url.to_string(), backend)).unwrap();
    assert_eq!(stream(&loader, SEED), samples, "{backend}");
    let s = loader.stats();
    let gets = f.gets.load(Ordering::SeqCst) - gets0;
    let limited = f.limited.load(Ordering::SeqCst) - limited0;
    assert_eq!(
        s.retries["throttled"] as usize, limited,
        "{backend}: {:?}",
        s.retries
    );
    let rate = paced_rate(&s.notes, &server.addr.to_string());
    let taken = taken_rate(&s.notes, &server.addr.to_string());
    eprintln!(
        "{backend}: {gets} GETs, {limited} answered 503, paced at {rate:?}/s; {:?}",
        s.notes
    );
    (gets, limited, rate, taken)
}

#[test]
fn a_request_rate_limit_is_ridden_with_few_slow_downs() {
    let dir = tempfile::tempdir().unwrap();
    let o = GenOptions {
        shards: 8,
        shard_bytes: 1 << 20,
        sample_bytes: 30_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed: SEED,
    };
    let samples = synth::generate(dir.path(), &o, |_| {}).unwrap().samples as usize;
    let server = Server::start(dir.path().to_path_buf());
    let url = server.url("shard-{000000..000007}.tar");
    server.faults.rate_limit.store(LIMIT, Ordering::SeqCst);

    let mut adapted = Vec::new();
    for backend in ["io_uring", "threads"] {
        let (gets, limited, rate, taken) = read(&server, &url, backend, samples);
        // The first burst (before any 503, the readers go at loopback
        // speed) and a probe every few seconds: a handful of 503s per
        // hundred GETs, not one per range.
        assert!(
            limited * 4 <= gets,
            "{backend}: {limited} of {gets} GETs answered 503"
        );
        // The rate held is just under the limit, give or take what half
        // a second of measuring sees; or, on a machine so loaded that
        // the readers took fewer GETs than the limit allows, near what
        // they took (the pacer starts from the rate the host was taking,
        // and is never below half of it).
        let rate = rate.unwrap_or_else(|| panic!("{backend}: no paced rate in the notes"));
        let taken = taken.unwrap_or_else(|| panic!("{backend}: no rate taken in the notes"));
        let n = LIMIT as f64;
        assert!(
            rate > 0.5 * n.min(taken) && rate < 1.5 * n,
            "{backend}: paced at {rate}/s, limit {n}/s, {taken}/s taken without throttling"
        );
        adapted.push(limited);
    }

    // The control: without the adaptation, the same read on the default
    // backend is answered 503 many times as often.
    ringfeed::net::set_pacing(false);
    let (gets, limited, rate, _) = read(&server, &url, "io_uring", samples);
    ringfeed::net::set_pacing(true);
    assert_eq!(rate, None, "nothing paced with the adaptation off");
    assert!(
        limited >= 3 * adapted[0].max(1),
        "without pacing: {limited} of {gets} GETs answered 503, with: {adapted:?}"
    );
}

//! A throttling storm outlasted: the S3 test server answers every GET
//! `503 SlowDown` for a minute (and the first HEADs too), then recovers;
//! loaders on both backends deliver every sample once, every byte checked,
//! and none before the storm ends. The control: the same storm with a
//! retry deadline of a few seconds fails by name (`Error::Throttled`), as
//! the old policy of a fixed handful of attempts failed within seconds.
//! One test: the storm takes a minute, shared by both backends.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ringfeed_test_support as support;

use s3s::S3ErrorCode;
use support::s3::{ACCESS_KEY, Op, S3Server, SECRET_KEY};

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader, Next};

const BUCKET: &str = "ringfeed-data";
const SEED: u64 = 27;
/// How long every GET is throttled: "minutes" is what S3 takes; one is
/// enough to outlast the old policy many times over (5 attempts, at most
/// 12.4 s of backoff) and keeps the test near a minute.
const STORM: Duration = Duration::from_secs(60);

/// Three shards of about 1 MiB; returns the samples.
fn dataset(root: &Path) -> usize {
    let o = GenOptions {
        shards: 3,
        shard_bytes: 1 << 20,
        sample_bytes: 40_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed: SEED,
    };
    synth::generate(&root.join(BUCKET), &o, |_| {})
        .unwrap()
        .samples as usize
}

fn config(server: &S3Server, extra: serde_json::Value) -> Config {
    let mut m = serde_json::json!({
        "urls": [format!("s3://{BUCKET}/shard-{{000000..000002}}.tar")],
        "memory_budget": "16MiB",
        "chunk_size": "256KiB",
        "batch_size": 5,
        "workers": 2,
        "s3_endpoint": server.endpoint(),
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
    });
    if let (Some(m), serde_json::Value::Object(e)) = (m.as_object_mut(), extra) {
        m.extend(e);
    }
    Config::from_map(m.as_object().unwrap()).unwrap()
}

/// Streams `loader` to its end: every sample once with the generator's
/// bytes, none before `over` is set. Returns the samples.
fn stream_after(loader: &Loader, over: &AtomicBool) -> usize {
    let mut seen = std::collections::BTreeSet::new();
    loop {
        // Longer than the storm and the backoff after it: a batch comes
        // only once the storm is over.
        match loader.next(Some(Duration::from_secs(300))).unwrap() {
            Next::Batch(b) => {
                // Acquire: pairs with the Release before the faults are
                // cleared; no GET succeeds before that.
                assert!(over.load(Ordering::Acquire), "a batch during the storm");
                for s in b.samples() {
                    for (name, data) in s.fields() {
                        assert!(synth::verify(SEED, s.key(), name, data), "bad bytes");
                    }
                    assert!(seen.insert(s.key().to_vec()), "sample twice");
                }
            }
            Next::EndOfEpoch(_) => {}
            Next::Finished => return seen.len(),
            Next::Timeout => panic!("stalled"),
        }
    }
}

#[test]
fn a_minute_of_slow_down_is_outlasted_and_every_sample_arrives_once() {
    let root = tempfile::tempdir().unwrap();
    let samples = dataset(root.path());
    let server = S3Server::start(root.path());

    // Control: a deadline of 3 s ends the same storm with the named
    // error, after more attempts than `max_attempts` would allow.
    server.fail(Op::GetObject, S3ErrorCode::SlowDown, None);
    let e = support::first_error(config(
        &server,
        serde_json::json!({"retry_deadline_s": 3, "max_attempts": 1}),
    ));
    match &e {
        Error::Throttled {
            deadline_ms: 3000,
            waited_ms,
            attempts,
            ..
        } if *waited_ms >= 3000 && *attempts >= 2 => {}
        other => panic!("not a throttling error past the deadline: {other}"),
    }
    assert_eq!(e.status(), ringfeed::error::status::RINGFEED_ERR_NETWORK);

    // The storm: every GET, and the HEAD at open twice, answered SlowDown
    // until STORM has passed; the default deadline (10 minutes) outlasts it.
    server.clear_faults();
    server.fail(Op::HeadObject, S3ErrorCode::SlowDown, Some(2));
    server.fail(Op::GetObject, S3ErrorCode::SlowDown, None);
    let over = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = ["io_uring", "threads"]
        .into_iter()
        .map(|backend| {
            let cfg = config(&server, serde_json::json!({"io_backend": backend}));
            let over = Arc::clone(&over);
            std::thread::spawn(move || {
                let loader = Loader::open(cfg).unwrap();
                let n = stream_after(&loader, &over);
                (backend, n, loader.stats().retries)
            })
        })
        .collect();
    std::thread::sleep(STORM);
    let during = server.requests(Op::GetObject);
    // Release: pairs with the Acquire of each batch's check.
    over.store(true, Ordering::Release);
    server.clear_faults();
    for r in readers {
        let (backend, n, retries) = r.join().unwrap();
        eprintln!("{backend}: {n} samples, retries {retries:?}");
        assert_eq!(n, samples, "{backend}: samples delivered");
        assert!(retries["throttled"] > 0, "{backend}: {retries:?}");
    }
    // Backed off and paced all along: two loaders of two workers with a
    // few reads each over a minute, not a request per range per moment
    // (retrying each range at once would send thousands).
    eprintln!(
        "{during} GETs during the storm, {} in all",
        server.requests(Op::GetObject)
    );
    assert!(during > 4 && during < 500, "{during} GETs during the storm");
}

//! The chunk size `chunk_size` "auto" picks at open: for remote shards
//! smaller than the default chunk's read, the least whole MiB whose read
//! holds one, so a far store's budget holds as many small shards as it
//! holds reads, and a note says why; one GET per shard still. The
//! controls: a size set by hand, local shards, remote shards as large as a
//! default read, and a cache keep the default 8 MiB.

use ringfeed_test_support as support;

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Loader};
use support::{Server, stream, two_workers};

const MIB: u64 = 1 << 20;

fn open(urls: Vec<String>, extra: serde_json::Value) -> Loader {
    Loader::open(two_workers(urls, extra)).unwrap()
}

/// `n` shards of about `bytes` each in a fresh directory, their sample
/// count and paths.
fn shards(n: usize, bytes: u64, seed: u64) -> (tempfile::TempDir, usize, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let o = GenOptions {
        shards: n,
        shard_bytes: bytes,
        sample_bytes: 20_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    let r = synth::generate(dir.path(), &o, |_| {}).unwrap();
    let paths = r
        .paths
        .iter()
        .map(|p| p.to_str().unwrap().to_string())
        .collect();
    (dir, r.samples as usize, paths)
}

const WHY: &str = "`chunk_size` auto";

#[test]
fn small_remote_shards_get_chunks_of_their_size_and_one_get_each() {
    let (dir, samples, local) = shards(6, MIB, 11);
    let largest = local
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .max()
        .unwrap();
    assert!(largest > MIB && largest < 7 * MIB / 4, "{largest}");
    let server = Server::start(dir.path().to_path_buf());
    let remote = vec![server.url("shard-{000000..000005}.tar")];

    // The case: 2 MiB chunks, whose 1.75 MiB read holds a shard whole.
    let l = open(remote.clone(), serde_json::json!({}));
    assert_eq!(stream(&l, 11), samples);
    let s = l.stats();
    assert_eq!(s.chunk_size, 2 * MIB, "{:?}", s.notes);
    assert_eq!(
        s.chunk_count * s.chunk_size,
        s.arena_bytes,
        "the budget is cut into the smaller chunks"
    );
    assert!(s.notes.iter().any(|n| n.contains(WHY)), "{:?}", s.notes);
    // One GET per shard: no shard split in two reads.
    let ranges = server.faults.ranges.lock().unwrap().clone();
    assert_eq!(
        server.faults.gets.load(std::sync::atomic::Ordering::SeqCst),
        6,
        "{ranges:?}"
    );

    // Controls: the default 8 MiB where the rule does not apply.
    let cache = tempfile::tempdir().unwrap();
    let (big_dir, big_samples, _) = shards(2, 8 * MIB, 12);
    let big_server = Server::start(big_dir.path().to_path_buf());
    for (urls, extra, want, seed, n) in [
        (
            remote.clone(),
            serde_json::json!({"chunk_size": "8MiB"}),
            8 * MIB,
            11,
            samples,
        ),
        (
            remote.clone(),
            serde_json::json!({"chunk_size": "auto"}),
            2 * MIB,
            11,
            samples,
        ),
        (local, serde_json::json!({}), 8 * MIB, 11, samples),
        (
            remote,
            serde_json::json!({"cache_dir": cache.path().to_str().unwrap()}),
            8 * MIB,
            11,
            samples,
        ),
        (
            vec![big_server.url("shard-{000000..000001}.tar")],
            serde_json::json!({}),
            8 * MIB,
            12,
            big_samples,
        ),
    ] {
        let l = open(urls.clone(), extra.clone());
        assert_eq!(stream(&l, seed), n, "{urls:?} {extra}");
        let s = l.stats();
        assert_eq!(s.chunk_size, want, "{urls:?} {extra}: {:?}", s.notes);
        assert_eq!(
            s.notes.iter().any(|n| n.contains(WHY)),
            want != 8 * MIB,
            "{urls:?} {extra}: {:?}",
            s.notes
        );
    }
}

#[test]
fn a_budget_too_small_for_the_chosen_chunks_is_named_at_open() {
    let (dir, samples, local) = shards(2, MIB, 13);
    let server = Server::start(dir.path().to_path_buf());
    let budget = serde_json::json!({"memory_budget": "16MiB"});
    // Local shards: 8 MiB chunks, two of them, and two workers need six.
    let err = match Loader::open(two_workers(local, budget.clone())) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("16 MiB of 8 MiB chunks opened for two workers"),
    };
    assert!(
        err.contains("`memory_budget`") && err.contains("`chunk_size`") && err.contains("8388608"),
        "{err}"
    );
    // The same budget holds eight of the 2 MiB chunks small remote shards get.
    let l = open(vec![server.url("shard-{000000..000001}.tar")], budget);
    assert_eq!(stream(&l, 13), samples);
    assert_eq!(l.stats().chunk_size, 2 * MIB);
}

#[test]
fn a_bad_chunk_size_is_named() {
    for bad in [r#""big""#, "1000", r#""-1MiB""#, "true"] {
        let json = format!(r#"{{"urls": "a.tar", "chunk_size": {bad}}}"#);
        let err = Config::from_json(&json)
            .and_then(|c| c.validate().map(|_| c))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`chunk_size`"), "{bad}: {err}");
    }
}

//! Reads of remote shards as a far object store needs them: the reads in
//! flight counted by their bytes still to come, and the stream's next
//! shard's reads begun before the current shard's end. Against the test
//! HTTP server on 127.0.0.1, on both backends: every sample once, in the
//! plan's order, every byte read once; a next shard that fails fails in
//! its own turn, named, and its reads begun early are waited for.

use ringfeed_test_support as support;

use std::sync::atomic::Ordering;

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader};
use support::{Server, stream};

fn generate(dir: &std::path::Path, shards: usize, shard_bytes: u64, seed: u64) -> u64 {
    let o = GenOptions {
        shards,
        shard_bytes,
        sample_bytes: 40_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    let r = synth::generate(dir, &o, |_| {}).unwrap();
    r.paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// The samples a loader delivers before its first error, and the error.
fn until_error(loader: &Loader, backend: &str) -> (usize, Error) {
    let mut samples = 0;
    loop {
        match loader.next(Some(std::time::Duration::from_secs(60))) {
            Ok(ringfeed::Next::Batch(b)) => samples += b.len(),
            Ok(other) => panic!("{backend}: {other:?} before the missing shard"),
            Err(e) => return (samples, e),
        }
    }
}

fn config(urls: Vec<String>, extra: serde_json::Value) -> Config {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("chunk_size".into(), serde_json::json!("256KiB"));
    m.insert("memory_budget".into(), serde_json::json!("16MiB"));
    m.insert("batch_size".into(), serde_json::json!(4));
    m.insert("workers".into(), serde_json::json!(2));
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Config::from_map(&m).unwrap()
}

/// Eight shards of about four reads each, two workers: each worker's next
/// shard's reads begin while its current shard's last ones come in, and
/// the samples come out exactly as from the local files, every byte read
/// once. The control: with a cache, whose `HEAD` must come first, no read
/// begins ahead, and the samples are the same.
#[test]
fn next_shards_begin_early_and_change_nothing_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let seed = 77;
    let total = generate(dir.path(), 8, 900 << 10, seed);
    let local: Vec<String> = (0..8)
        .map(|i| {
            dir.path()
                .join(format!("shard-{i:06}.tar"))
                .display()
                .to_string()
        })
        .collect();
    let want = stream(
        &Loader::open(config(local, serde_json::json!({}))).unwrap(),
        seed,
    );
    let server = Server::start(dir.path().to_path_buf());
    let url = server.url("shard-{000000..000007}.tar");
    for backend in ["threads", "io_uring"] {
        let loader = Loader::open(config(
            vec![url.clone()],
            serde_json::json!({"io_backend": backend}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, seed), want, "{backend}");
        let s = loader.stats();
        assert_eq!(s.bytes_read, total, "{backend}: every byte once");
        assert!(s.reads_ahead > 0, "{backend}: no read began ahead");
        assert!(
            s.retries.values().all(|&n| n == 0),
            "{backend}: {:?}",
            s.retries
        );
        assert!(s.net_reads_in_flight > 0, "{backend}");
        assert!(!s.limited_by.is_empty(), "{backend}");
    }
    let cache = tempfile::tempdir().unwrap();
    let loader = Loader::open(config(
        vec![url],
        // Cache reads are whole checksum blocks: a chunk of 8 MiB reads 7.
        serde_json::json!({"cache_dir": cache.path().display().to_string(),
                           "cache_min_free": "1MiB", "chunk_size": "8MiB",
                           "memory_budget": "128MiB"}),
    ))
    .unwrap();
    assert_eq!(stream(&loader, seed), want, "with a cache");
    let s = loader.stats();
    assert!(s.cache_misses > 0, "the cache was consulted: {s:?}");
    assert_eq!(s.reads_ahead, 0, "a cache's HEAD comes first");
}

/// The third shard is missing: its first read begins while the second
/// shard is still being read, and fails there; the failure is the third
/// shard's, named, and comes in its turn, after every sample of the two
/// shards before it.
#[test]
fn a_next_shard_that_fails_fails_in_its_own_turn() {
    let dir = tempfile::tempdir().unwrap();
    let seed = 78;
    generate(dir.path(), 4, 900 << 10, seed);
    let before: usize = (0..2)
        .map(|i| {
            let p = dir.path().join(format!("shard-{i:06}.tar"));
            let l = Loader::open(config(
                vec![p.display().to_string()],
                serde_json::json!({"workers": 1}),
            ))
            .unwrap();
            stream(&l, seed)
        })
        .sum();
    std::fs::remove_file(dir.path().join("shard-000002.tar")).unwrap();
    let server = Server::start(dir.path().to_path_buf());
    for backend in ["threads", "io_uring"] {
        let gets = server.faults.gets.load(Ordering::SeqCst);
        let loader = Loader::open(config(
            vec![server.url("shard-{000000..000003}.tar")],
            serde_json::json!({"io_backend": backend, "workers": 1}),
        ))
        .unwrap();
        let (samples, err) = until_error(&loader, backend);
        let text = err.to_string();
        assert!(text.contains("shard-000002.tar"), "{backend}: {text}");
        assert!(!text.contains("shard-000001.tar"), "{backend}: {text}");
        assert!(matches!(err, Error::Http { .. }), "{backend}: {err:?}");
        assert!(
            samples <= before,
            "{backend}: {samples} samples of {before}"
        );
        assert!(loader.stats().reads_ahead > 0, "{backend}");
        assert!(server.faults.gets.load(Ordering::SeqCst) > gets);
        loader.close();
    }
}

/// Small shards (one read each): the reads of several next shards begin
/// at once, up to the reads a worker keeps in flight, and the samples still
/// come out as from the local files, every byte read once; the fourth
/// shard missing fails in its own turn, named, after its elders' samples,
/// though its read began while the first shard was being walked.
#[test]
fn reads_of_several_small_next_shards_begin_together() {
    let dir = tempfile::tempdir().unwrap();
    let seed = 79;
    let shards = 24;
    let total = generate(dir.path(), shards, 120 << 10, seed);
    let name = |i: usize| dir.path().join(format!("shard-{i:06}.tar"));
    for i in 0..shards {
        let len = std::fs::metadata(name(i)).unwrap().len();
        assert!(len < 224 << 10, "shard {i} takes one read: {len} bytes");
    }
    let local: Vec<String> = (0..shards).map(|i| name(i).display().to_string()).collect();
    let one = serde_json::json!({"workers": 1, "reads_in_flight": 8});
    let want = stream(
        &Loader::open(config(local.clone(), one.clone())).unwrap(),
        seed,
    );
    let server = Server::start(dir.path().to_path_buf());
    let url = server.url("shard-{000000..000023}.tar");
    for backend in ["threads", "io_uring"] {
        let mut extra = one.clone();
        extra["io_backend"] = serde_json::json!(backend);
        let loader = Loader::open(config(vec![url.clone()], extra)).unwrap();
        assert_eq!(stream(&loader, seed), want, "{backend}");
        let s = loader.stats();
        assert_eq!(s.bytes_read, total, "{backend}: every byte once");
        assert!(s.reads_ahead > 0, "{backend}: no read began ahead");
    }
    let before: usize = (0..3)
        .map(|i| {
            let l = Loader::open(config(vec![local[i].clone()], one.clone())).unwrap();
            stream(&l, seed)
        })
        .sum();
    std::fs::remove_file(name(3)).unwrap();
    for backend in ["threads", "io_uring"] {
        let mut extra = one.clone();
        extra["io_backend"] = serde_json::json!(backend);
        let loader = Loader::open(config(vec![url.clone()], extra)).unwrap();
        let (samples, err) = until_error(&loader, backend);
        let text = err.to_string();
        assert!(text.contains("shard-000003.tar"), "{backend}: {text}");
        assert!(matches!(err, Error::Http { .. }), "{backend}: {err:?}");
        assert!(
            samples <= before,
            "{backend}: {samples} samples of {before}"
        );
        loader.close();
    }
}

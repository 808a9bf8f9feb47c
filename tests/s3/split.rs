//! Splitting remote shards among consumers with no preparation step: no
//! manifest gives a nominal epoch split by shard (every consumer the same
//! batches, no sample twice); a `shardindex.json` beside the shards makes
//! the split exact; a wrong estimate stops the epoch with a named error.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Loader, Next};

use super::support::s3::S3Server;
use super::{BUCKET, config};

/// `shards` shards of ~`shard_bytes` in `root/BUCKET/split/`; the samples
/// in each.
fn shards(root: &Path, n: usize, shard_bytes: u64, seed: u64) -> Vec<u64> {
    let o = GenOptions {
        shards: n,
        shard_bytes,
        sample_bytes: 4_000,
        spread: 0.5,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    synth::generate(&root.join(BUCKET).join("split"), &o, |_| {})
        .unwrap()
        .shard_samples
}

fn urls(n: usize) -> Vec<String> {
    vec![format!(
        "s3://{BUCKET}/split/shard-{{000000..{:06}}}.tar",
        n - 1
    )]
}

/// Consumer `rank`/`worker` of 2 ranks × 2 loader workers.
fn consumer(
    server: &S3Server,
    urls: &[String],
    rank: u64,
    worker: u64,
    extra: serde_json::Value,
) -> Config {
    let mut e = serde_json::json!({
        "world_size": 2, "rank": rank, "loader_workers": 2, "loader_worker": worker,
        "batch_size": 8, "shuffle": true, "seed": 7,
    });
    if let (Some(m), serde_json::Value::Object(x)) = (e.as_object_mut(), extra) {
        m.extend(x);
    }
    config(server, urls, e)
}

/// Every batch of one consumer's epochs, as its samples' keys, each
/// sample's bytes checked against the generator; the loader's stats notes.
/// One epoch's batches, each its samples' keys.
type Batches = Vec<Vec<Vec<u8>>>;

fn epochs(cfg: Config, seed: u64) -> (Vec<Batches>, Vec<String>, u64) {
    let loader = Loader::open(cfg).unwrap();
    let mut out = vec![Vec::new()];
    loop {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            Next::Batch(b) => {
                let mut keys = Vec::new();
                for s in b.samples() {
                    for (name, data) in s.fields() {
                        assert!(synth::verify(seed, s.key(), name, data), "bad bytes");
                    }
                    keys.push(s.key().to_vec());
                }
                out.last_mut().unwrap().push(keys);
            }
            Next::EndOfEpoch(_) => out.push(Vec::new()),
            Next::Finished => break,
            Next::Timeout => panic!("stalled"),
        }
    }
    out.pop();
    let stats = loader.stats();
    let dropped = stats.samples_dropped;
    (out, stats.notes, dropped)
}

#[test]
fn without_counts_ranks_and_workers_split_by_shard_equal_and_at_most_once() {
    let root = tempfile::tempdir().unwrap();
    let counts = shards(root.path(), 12, 200_000, 61);
    let total: u64 = counts.iter().sum();
    let server = S3Server::start(root.path());
    let urls = urls(12);
    let mut lengths = BTreeSet::new();
    let mut per_epoch: BTreeMap<usize, Vec<Vec<u8>>> = BTreeMap::new();
    for rank in 0..2 {
        for worker in 0..2 {
            let cfg = consumer(
                &server,
                &urls,
                rank,
                worker,
                serde_json::json!({"epochs": 2}),
            );
            let (epochs, notes, dropped) = epochs(cfg, 61);
            assert_eq!(epochs.len(), 2);
            assert!(
                notes.iter().any(|n| n.contains("split by shard")),
                "{notes:?}"
            );
            for (e, batches) in epochs.iter().enumerate() {
                assert!(batches.iter().all(|b| b.len() == 8), "whole batches only");
                lengths.insert(batches.len());
                per_epoch
                    .entry(e)
                    .or_default()
                    .extend(batches.iter().flatten().cloned());
            }
            let delivered: usize = epochs.iter().flatten().map(Vec::len).sum();
            assert!(delivered as u64 + dropped <= 2 * total);
        }
    }
    // Every consumer the same number of batches (DDP never waits on a rank
    // that ran dry), and at least 3 of each consumer's 3 shards' ~4.5 shards
    // worth of samples.
    assert_eq!(lengths.len(), 1, "batches per consumer: {lengths:?}");
    let batches = *lengths.iter().next().unwrap() as u64;
    assert!(
        batches * 8 * 4 * 10 >= total * 7,
        "{batches} batches of {total} samples"
    );
    for (e, keys) in &per_epoch {
        let unique: BTreeSet<_> = keys.iter().collect();
        assert_eq!(
            unique.len(),
            keys.len(),
            "epoch {e}: a sample went out twice"
        );
        assert_eq!(keys.len() as u64, batches * 8 * 4);
    }
    // Shard shuffle: the epochs leave different samples out.
    assert_ne!(
        per_epoch[&0].iter().collect::<BTreeSet<_>>(),
        per_epoch[&1].iter().collect::<BTreeSet<_>>()
    );
}

/// A WebDataset shard index of the shards in `dir`.
fn write_shardindex(dir: &Path, counts: &[u64]) {
    let list: Vec<serde_json::Value> = counts
        .iter()
        .enumerate()
        .map(
            |(i, &n)| serde_json::json!({"url": synth::shard_name(i, counts.len()), "nsamples": n}),
        )
        .collect();
    let index = serde_json::json!({
        "__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": list,
    });
    std::fs::write(dir.join("shardindex.json"), index.to_string()).unwrap();
}

#[test]
fn a_shardindex_beside_the_shards_makes_the_split_exact() {
    let root = tempfile::tempdir().unwrap();
    let counts = shards(root.path(), 6, 100_000, 62);
    let total: u64 = counts.iter().sum();
    write_shardindex(&root.path().join(BUCKET).join("split"), &counts);
    let server = S3Server::start(root.path());
    let urls = urls(6);
    let mut all = Vec::new();
    let mut lengths = BTreeSet::new();
    for rank in 0..2 {
        for worker in 0..2 {
            let cfg = consumer(
                &server,
                &urls,
                rank,
                worker,
                serde_json::json!({"remainder": "drop"}),
            );
            let (epochs, notes, _) = epochs(cfg, 62);
            assert!(
                !notes.iter().any(|n| n.contains("split by shard")),
                "{notes:?}"
            );
            lengths.insert(epochs[0].iter().map(Vec::len).sum::<usize>());
            all.extend(epochs[0].iter().flatten().cloned());
        }
    }
    assert_eq!(lengths.len(), 1, "{lengths:?}");
    let unique: BTreeSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a sample went out twice");
    // Exactly once: all but the fewer than 4 that do not divide evenly.
    assert_eq!(all.len() as u64, total / 4 * 4);

    // A manifest beside the shards (`ringfeed.manifest`) does the same,
    // and one given as an `s3://` URL.
    std::fs::remove_file(root.path().join(BUCKET).join("split/shardindex.json")).unwrap();
    let folder = root.path().join(BUCKET).join("split");
    let manifest: String = counts
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let name = synth::shard_name(i, counts.len());
            let size = std::fs::metadata(folder.join(&name)).unwrap().len();
            format!("{name} {size} {n}\n")
        })
        .collect();
    std::fs::write(
        root.path().join(BUCKET).join("split/ringfeed.manifest"),
        &manifest,
    )
    .unwrap();
    for urls in [
        urls.clone(),
        vec![format!("s3://{BUCKET}/split/ringfeed.manifest")],
    ] {
        let cfg = consumer(
            &server,
            &urls,
            1,
            0,
            serde_json::json!({"remainder": "drop"}),
        );
        let (epochs, notes, _) = epochs(cfg, 62);
        assert!(
            !notes.iter().any(|n| n.contains("split by shard")),
            "{notes:?}"
        );
        assert_eq!(
            epochs[0].iter().map(Vec::len).sum::<usize>() as u64,
            total / 4
        );
    }
    write_shardindex(&root.path().join(BUCKET).join("split"), &counts);

    // The same index given as the dataset.
    let cfg = consumer(
        &server,
        &[format!("s3://{BUCKET}/split/shardindex.json")],
        0,
        1,
        serde_json::json!({"remainder": "drop"}),
    );
    let (epochs, _, _) = epochs(cfg, 62);
    assert_eq!(
        epochs[0].iter().map(Vec::len).sum::<usize>() as u64,
        total / 4
    );
}

#[test]
fn an_index_that_is_no_index_gives_no_counts_and_a_named_error_when_given() {
    let root = tempfile::tempdir().unwrap();
    let counts = shards(root.path(), 4, 60_000, 63);
    let dir = root.path().join(BUCKET).join("split");
    std::fs::write(dir.join("shardindex.json"), "<html>Not Found</html>").unwrap();
    let server = S3Server::start(root.path());
    // Beside the shards: passed over, the split by shard goes on.
    let cfg = consumer(
        &server,
        &urls(4),
        1,
        1,
        serde_json::json!({"batch_size": 2}),
    );
    let (epochs, notes, _) = epochs(cfg, 63);
    assert!(
        notes.iter().any(|n| n.contains("split by shard")),
        "{notes:?}"
    );
    assert!(!epochs[0].is_empty());
    // Given as the dataset: a named error.
    let e = super::open_err(consumer(
        &server,
        &[format!("s3://{BUCKET}/split/shardindex.json")],
        0,
        0,
        serde_json::json!({}),
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("shardindex.json") && msg.contains("not a shard index"),
        "{msg}"
    );
    // Wrong counts in an index are caught when a shard is read: every
    // consumer whose plan reaches a sample a shard does not hold fails,
    // naming it; the plan (the pure one) says which do.
    let wrong: Vec<u64> = counts.iter().map(|n| n + 1).collect();
    write_shardindex(&dir, &wrong);
    let mut failed = 0;
    for (rank, worker) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let cfg = consumer(&server, &urls(4), rank, worker, serde_json::json!({}));
        let order = ringfeed::plan::consumer_order(&cfg.plan_options(2), &wrong, 0, None).unwrap();
        let reaches = order
            .iter()
            .flatten()
            .find(|&&(shard, i, _)| i == counts[shard]);
        let loader = Loader::open(cfg).unwrap();
        let got = loop {
            match loader.next(Some(Duration::from_secs(60))) {
                Ok(Next::Finished) => break None,
                Ok(_) => {}
                Err(e) => break Some(e),
            }
        };
        match (reaches, got) {
            (Some(&(shard, _, _)), Some(e)) => {
                let name = synth::shard_name(shard, 4);
                assert!(e.to_string().contains(&format!("/split/{name}")), "{e}");
                failed += 1;
            }
            (None, None) => {}
            (r, e) => panic!("consumer {rank}/{worker}: plan reaches {r:?}, loader gave {e:?}"),
        }
    }
    assert!(failed >= 1, "no consumer read past a shard's end");
}

#[test]
fn an_estimate_its_shards_do_not_follow_stops_the_epoch_by_name() {
    // Shards whose first mebibyte holds small samples and the rest large
    // ones: the estimate from first bytes is far too high.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join(BUCKET).join("split");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..4 {
        let mut b = Vec::new();
        let mut add = |key: String, len: usize| {
            let mut data = vec![0u8; len];
            synth::fill(61, key.as_bytes(), b"bin", &mut data);
            synth::write_member(&mut b, &format!("{key}.bin"), &data).unwrap();
        };
        for j in 0..400u64 {
            add(synth::sample_key(i, j), 2_000);
        }
        for j in 400..404u64 {
            add(synth::sample_key(i, j), 1_500_000);
        }
        b.extend_from_slice(&[0u8; 1024]);
        std::fs::write(dir.join(synth::shard_name(i, 4)), b).unwrap();
    }
    let server = S3Server::start(root.path());
    let e = {
        let loader = Loader::open(consumer(
            &server,
            &urls(4),
            0,
            0,
            serde_json::json!({"batch_size": 4}),
        ))
        .unwrap();
        loop {
            match loader.next(Some(Duration::from_secs(60))) {
                Ok(Next::Finished) => panic!("a short epoch ended as if whole"),
                Ok(_) => {}
                Err(e) => break e,
            }
        }
    };
    let msg = e.to_string();
    assert!(
        msg.contains("nominal epoch") && msg.contains("shardindex.json"),
        "{msg}"
    );
    // Control: a length the shards hold (`samples_per_epoch`) ends whole.
    let cfg = consumer(
        &server,
        &urls(4),
        0,
        0,
        serde_json::json!({"batch_size": 4, "samples_per_epoch": 1600}),
    );
    let (epochs, _, _) = epochs(cfg, 61);
    assert_eq!(epochs[0].iter().map(Vec::len).sum::<usize>(), 400);
}

#[test]
fn a_nominal_epoch_resumes_where_it_stopped() {
    let root = tempfile::tempdir().unwrap();
    shards(root.path(), 8, 150_000, 64);
    let server = S3Server::start(root.path());
    let urls = urls(8);
    let whole = epochs(consumer(&server, &urls, 1, 0, serde_json::json!({})), 64).0;
    let whole = &whole[0];
    // Three batches, a state, and a new loader from it: the rest of the
    // uninterrupted epoch, batch for batch, and its nominal length in all.
    let loader = Loader::open(consumer(&server, &urls, 1, 0, serde_json::json!({}))).unwrap();
    let mut first = Vec::new();
    while first.len() < 3 {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            Next::Batch(b) => first.push(b.samples().map(|s| s.key().to_vec()).collect::<Vec<_>>()),
            other => panic!("{other:?}"),
        }
    }
    let state = loader.state().to_hex();
    drop(loader);
    let rest = epochs(
        consumer(&server, &urls, 1, 0, serde_json::json!({"resume": state})),
        64,
    )
    .0;
    assert_eq!(first[..], whole[..3]);
    assert_eq!(rest[0][..], whole[3..]);
}

//! End-to-end tests of the epoch plan on real shards: the order the engine
//! delivers is the pure plan's order (`ringfeed::plan`), bit for bit, on
//! both backends; consumers split the data exactly once with equal lengths;
//! a resume state continues an epoch exactly; an elastic resume loses and
//! repeats nothing; shuffling stays within the memory budget; and bad
//! states, wrong manifests and impossible layouts are named errors.
//!
//! Sample keys of the generated shards are `SSSSSS-IIIIIII` (shard, index),
//! so each delivered key says which sample of the plan it is.

use ringfeed_test_support as support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ringfeed::plan::{self, SampleRef};
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader, Next};
use serde_json::{Value, json};

fn make_shards(dir: &Path, shards: usize, shard_bytes: u64, sample_bytes: u64) -> Vec<PathBuf> {
    let o = GenOptions {
        shards,
        shard_bytes,
        sample_bytes,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed: 5,
    };
    synth::generate(dir, &o, |_| {}).unwrap().paths
}

/// The tests' configuration: small chunks and budget, batches of 5.
fn config_urls(urls: &[String], extra: &Value) -> ringfeed::Result<Config> {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), json!(urls));
    m.insert("memory_budget".into(), json!("16MiB"));
    m.insert("chunk_size".into(), json!("256KiB"));
    m.insert("batch_size".into(), json!(5));
    if let Value::Object(e) = extra {
        m.extend(e.clone());
    }
    Config::from_map(&m)
}

fn config(paths: &[PathBuf], extra: Value) -> Config {
    let urls: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    config_urls(&urls, &extra).unwrap()
}

/// `shards` generated shards served over HTTP on 127.0.0.1, as one brace URL.
fn served(dir: &Path, shards: usize) -> (ringfeed::serve::Server, Vec<String>) {
    make_shards(dir, shards, 150_000, 5_000);
    let server = ringfeed::serve::Server::bind("127.0.0.1:0", dir, Default::default()).unwrap();
    let url = format!("{}shard-{{000000..{:06}}}.tar", server.url(), shards - 1);
    (server, vec![url])
}

/// (shard, index) of a generated key.
fn sample_of(key: &[u8]) -> (usize, u64) {
    let k = std::str::from_utf8(key).unwrap();
    let (s, i) = k.split_once('-').unwrap();
    (s.parse().unwrap(), i.parse().unwrap())
}

/// One batch as (shard, index) pairs, each field checked against the
/// generator's content.
fn batch_samples(b: &ringfeed::memory::Batch) -> Vec<(usize, u64)> {
    b.samples()
        .map(|s| {
            for (name, data) in s.fields() {
                assert!(
                    synth::verify(5, s.key(), name, data),
                    "bytes of {:?}",
                    s.key()
                );
            }
            sample_of(s.key())
        })
        .collect()
}

/// The batches of the current epoch, at most `limit` of them (then the
/// loader is left mid-epoch).
fn take_batches(l: &Loader, limit: usize) -> Vec<Vec<(usize, u64)>> {
    let mut out = Vec::new();
    while out.len() < limit {
        match l.next(Some(Duration::from_secs(30))).unwrap() {
            Next::Batch(b) => out.push(batch_samples(&b)),
            Next::EndOfEpoch(_) | Next::Finished => break,
            Next::Timeout => panic!("no batch within 30 s"),
        }
    }
    out
}

fn counts_of(paths: &[PathBuf]) -> Vec<u64> {
    paths
        .iter()
        .map(|p| ringfeed::tar::count_file_samples(p).unwrap())
        .collect()
}

fn strip(order: Vec<Vec<SampleRef>>) -> Vec<Vec<(usize, u64)>> {
    order
        .into_iter()
        .map(|b| b.into_iter().map(|(s, i, _)| (s, i)).collect())
        .collect()
}

#[test]
fn the_engine_delivers_the_plans_order_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 7, 300_000, 9_000);
    let counts = counts_of(&paths);
    let total: u64 = counts.iter().sum();
    for backend in ["io_uring", "threads"] {
        for (consumers, workers, buffer, remainder) in [
            (1, 1, 0, "pad"),
            (3, 2, 40, "pad"),
            (2, 3, 17, "drop"),
            (4, 2, 0, "drop"),
        ] {
            let mut seen: HashMap<(usize, u64), u32> = HashMap::new();
            let mut lengths = Vec::new();
            for c in 0..consumers {
                let cfg = config(
                    &paths,
                    json!({"io_backend": backend, "workers": workers, "seed": 11, "shuffle": true,
                           "shuffle_buffer": buffer, "remainder": remainder,
                           "world_size": consumers, "rank": c, "epochs": 2}),
                );
                let opts = cfg.plan_options(workers);
                let l = Loader::open(cfg).unwrap();
                for epoch in 0..2 {
                    let got = take_batches(&l, usize::MAX);
                    let want = strip(plan::consumer_order(&opts, &counts, epoch, None).unwrap());
                    assert_eq!(
                        got, want,
                        "{backend}, consumer {c}/{consumers}, {workers} workers, epoch {epoch}"
                    );
                    if epoch == 0 {
                        lengths.push(got.len());
                        for s in got.into_iter().flatten() {
                            *seen.entry(s).or_default() += 1;
                        }
                    }
                }
                assert!(matches!(l.next(None).unwrap(), Next::Finished));
                let st = l.stats();
                assert_eq!(st.consumers, consumers);
                assert_eq!(st.epochs_done, 2);
            }
            assert!(lengths.iter().all(|&n| n == lengths[0]), "{lengths:?}");
            let repeats: u32 = seen.values().map(|&k| k - 1).sum();
            if remainder == "pad" {
                assert_eq!(seen.len() as u64, total, "every sample once");
                assert!(u64::from(repeats) < consumers, "only pads repeat");
            } else {
                assert_eq!(repeats, 0);
                assert!(total - (seen.len() as u64) < consumers);
            }
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_order_and_epochs_differ() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 5, 200_000, 7_000);
    let run = |seed: u64| {
        let l = Loader::open(config(
            &paths,
            json!({"seed": seed, "shuffle": true, "shuffle_buffer": 64, "workers": 2, "epochs": 2}),
        ))
        .unwrap();
        (take_batches(&l, usize::MAX), take_batches(&l, usize::MAX))
    };
    let (a0, a1) = run(3);
    let (b0, b1) = run(3);
    assert_eq!((&a0, &a1), (&b0, &b1), "same seed, same order");
    assert_ne!(a0, a1, "epochs are shuffled differently");
    assert_ne!(run(4).0, a0, "another seed, another order");
    // Starting at epoch 1 gives epoch 1's order (each epoch its own shuffle).
    let l = Loader::open(config(
        &paths,
        json!({"seed": 3, "shuffle": true, "shuffle_buffer": 64, "workers": 2, "epochs": 2, "epoch": 1}),
    ))
    .unwrap();
    assert_eq!(take_batches(&l, usize::MAX), a1);
    assert!(matches!(l.next(None).unwrap(), Next::Finished));
    let mut sorted: Vec<_> = a0.concat();
    sorted.sort();
    let mut natural = sorted.clone();
    natural.dedup();
    assert_eq!(sorted, natural, "a permutation: no repeats");
}

/// Cuts a consumer at several points, resumes from its state, and checks
/// the concatenation against the uninterrupted run; returns the bytes each
/// resumed loader read.
fn resume_at_cuts(urls: Vec<String>, extra: Value) -> Vec<(usize, u64, u64)> {
    let cfg = |extra: &Value| config_urls(&urls, extra).unwrap();
    let (full, full_read) = {
        let l = Loader::open(cfg(&extra)).unwrap();
        let f = (take_batches(&l, usize::MAX), take_batches(&l, usize::MAX));
        let read = l.stats().bytes_read;
        (f, read)
    };
    let mut reads = Vec::new();
    for cut in [0, 1, full.0.len() / 2, full.0.len() - 1, full.0.len()] {
        let l = Loader::open(cfg(&extra)).unwrap();
        let head = take_batches(&l, cut);
        let state = l.state();
        assert_eq!(state.batches as usize, cut);
        drop(l);
        let mut resumed = extra.clone();
        resumed["resume"] = json!(state.to_hex());
        let l = Loader::open(cfg(&resumed)).unwrap();
        let mut rest = take_batches(&l, usize::MAX);
        let next_epoch = take_batches(&l, usize::MAX);
        let mut again = head;
        again.append(&mut rest);
        assert_eq!(again, full.0, "cut after {cut} batches");
        assert_eq!(next_epoch, full.1, "the next epoch is untouched");
        let st = l.stats();
        assert_eq!(st.batches_skipped, cut as u64);
        reads.push((cut, st.bytes_read, full_read));
    }
    reads
}

#[test]
fn a_resume_state_continues_the_epoch_exactly() {
    let dir = tempfile::tempdir().unwrap();
    // Many small shards: a resume re-reads only the segments that still
    // hold samples to deliver, a small part of the epoch late in it.
    let paths = make_shards(dir.path(), 24, 60_000, 4_000);
    let urls: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    // Local shards: counted at open, so the cut's batches are replayed as
    // placeholders and whole segments before the cut are not read again.
    for extra in [
        json!({"seed": 9, "shuffle": true, "shuffle_buffer": 30, "workers": 2,
               "world_size": 2, "rank": 1, "epochs": 2}),
        json!({"seed": 9, "workers": 3, "epochs": 2}),
    ] {
        let reads = resume_at_cuts(urls.clone(), extra);
        // The runs cover epochs 0 and 1; a resume late in epoch 0 re-reads
        // little of it (only segments with samples still to deliver).
        let (cut, late, full) = reads[reads.len() - 2];
        let per_epoch = full / 2;
        assert!(
            late - per_epoch < per_epoch / 2,
            "resumed after {cut} batches, the loader read {} bytes of epoch 0 (of {per_epoch})",
            late - per_epoch
        );
    }
}

#[test]
fn a_resume_without_sample_counts_reads_and_skips_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, urls) = served(dir.path(), 4);
    // One consumer over HTTP without a manifest: no counts, so the resumed
    // loader reads the shards from the start and skips the cut's batches.
    let reads = resume_at_cuts(
        urls,
        json!({"seed": 2, "shuffle": true, "shuffle_buffer": 25, "workers": 2, "epochs": 2}),
    );
    // Epoch 0 is read whole again, then epoch 1: as much as the full run.
    let (_, late, full) = reads[reads.len() - 2];
    assert_eq!(late, full, "without counts, the cut is read again");
}

/// States saved when open sized every remote shard with a `HEAD` carry
/// the sizes in their fingerprint; open no longer asks for them, so for
/// such a state it does, and the state resumes exactly. A state of another
/// dataset is still refused, named.
#[test]
fn a_state_fingerprinted_with_every_remote_size_still_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (server, urls) = served(dir.path(), 4);
    let extra = json!({"seed": 3, "shuffle": true, "shuffle_buffer": 20, "workers": 2});
    let cfg = |extra: &Value| config_urls(&urls, extra).unwrap();
    let full = take_batches(&Loader::open(cfg(&extra)).unwrap(), usize::MAX);
    let l = Loader::open(cfg(&extra)).unwrap();
    let mut again = take_batches(&l, 3);
    let mut state = l.state();
    drop(l);
    let ids: Vec<(String, Option<u64>)> = (0..4)
        .map(|i| {
            let name = format!("shard-{i:06}.tar");
            let size = std::fs::metadata(dir.path().join(&name)).unwrap().len();
            (format!("{}{name}", server.url()), Some(size))
        })
        .collect();
    let ids: Vec<(&str, Option<u64>)> = ids.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    state.fingerprint = plan::resume::fingerprint(&ids, &cfg(&extra).plan_options(2));
    let mut resumed = extra.clone();
    resumed["resume"] = json!(state.to_hex());
    let l = Loader::open(cfg(&resumed)).unwrap();
    again.append(&mut take_batches(&l, usize::MAX));
    assert_eq!(again, full);
    state.fingerprint ^= 1;
    resumed["resume"] = json!(state.to_hex());
    let e = Loader::open(cfg(&resumed)).err().unwrap().to_string();
    assert!(e.contains("another dataset"), "{e}");
}

#[test]
fn an_elastic_resume_from_two_consumers_to_three_loses_and_repeats_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 6, 250_000, 8_000);
    let counts = counts_of(&paths);
    let total: u64 = counts.iter().sum();
    let base = json!({"seed": 2, "shuffle": true, "shuffle_buffer": 20, "workers": 2});
    let mut delivered = Vec::new();
    let mut states = Vec::new();
    for (rank, cut) in [(0, 3), (1, 5)] {
        let mut e = base.clone();
        e["world_size"] = json!(2);
        e["rank"] = json!(rank);
        let l = Loader::open(config(&paths, e)).unwrap();
        delivered.extend(take_batches(&l, cut).concat());
        states.push(l.state().to_hex());
    }
    let mut lengths = Vec::new();
    for rank in 0..3 {
        let mut e = base.clone();
        e["world_size"] = json!(3);
        e["rank"] = json!(rank);
        e["workers"] = json!(1);
        e["resume"] = json!(states);
        let l = Loader::open(config(&paths, e)).unwrap();
        let got = take_batches(&l, usize::MAX);
        lengths.push(got.len());
        delivered.extend(got.concat());
        assert!(matches!(l.next(None).unwrap(), Next::Finished));
    }
    assert!(lengths.iter().all(|&n| n == lengths[0]), "{lengths:?}");
    let mut seen: HashMap<(usize, u64), u32> = HashMap::new();
    for s in delivered {
        *seen.entry(s).or_default() += 1;
    }
    assert_eq!(seen.len() as u64, total, "every sample of the epoch");
    let repeats: u32 = seen.values().map(|&k| k - 1).sum();
    assert!(repeats <= 2, "only pads repeat ({repeats})");
}

#[test]
fn a_large_shuffle_buffer_compacts_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    // ~5,000 samples of ~6 KB over 5 shards; a 1,200-sample buffer (~7 MB,
    // ~30 chunks when dense, ~4x that as survivors spread over chunks) with
    // a 64-chunk budget of 256 KiB chunks must copy survivors together.
    let paths = make_shards(dir.path(), 5, 6_000_000, 6_000);
    let counts = counts_of(&paths);
    let cfg = config(
        &paths,
        json!({"memory_budget": "16MiB", "workers": 1, "seed": 1, "shuffle_buffer": 1200}),
    );
    let opts = cfg.plan_options(1);
    let l = Loader::open(cfg).unwrap();
    let got = take_batches(&l, usize::MAX);
    assert_eq!(
        got,
        strip(plan::consumer_order(&opts, &counts, 0, None).unwrap())
    );
    let st = l.stats();
    assert!(st.shuffle_copied > 0, "survivors were compacted");
    assert!(st.bytes_copied >= st.shuffle_copied);
    // Compaction moves the few survivors of old chunks, not the data again.
    assert!(
        st.shuffle_copied < st.bytes_delivered / 2,
        "{} of {} bytes copied",
        st.shuffle_copied,
        st.bytes_delivered
    );
}

#[test]
fn a_shuffle_buffer_larger_than_the_budget_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 2, 3_000_000, 60_000);
    let e = support::first_error(config(
        &paths,
        json!({"memory_budget": "4MiB", "workers": 1, "shuffle_buffer": 1000}),
    ));
    assert!(matches!(e, Error::BudgetTooSmall { .. }), "{e}");
    assert!(e.to_string().contains("shuffle_buffer"), "{e}");
}

#[test]
fn samples_per_epoch_and_resampling_fix_the_epoch_length() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 3, 100_000, 5_000);
    for resampled in [false, true] {
        let l = Loader::open(config(
            &paths,
            json!({"samples_per_epoch": 123, "world_size": 2, "rank": 1, "resampled": resampled,
                   "epochs": 2, "seed": 4}),
        ))
        .unwrap();
        for _ in 0..2 {
            let n: usize = take_batches(&l, usize::MAX).iter().map(Vec::len).sum();
            assert_eq!(n, 61, "resampled: {resampled}");
        }
    }
}

#[test]
fn bad_states_wrong_counts_and_impossible_layouts_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 3, 100_000, 5_000);
    let open_err = |extra: Value| {
        let mut m = serde_json::Map::new();
        let urls: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        m.insert("urls".into(), json!(urls));
        if let Value::Object(e) = extra {
            m.extend(e);
        }
        match Config::from_map(&m).and_then(Loader::open) {
            Ok(_) => panic!("opened with {m:?}"),
            Err(e) => e.to_string(),
        }
    };
    assert!(open_err(json!({"resume": "zz"})).contains("hex"));
    assert!(open_err(json!({"resume": "00112233"})).contains("not a ringfeed resume state"));
    assert!(open_err(json!({"resume": 7})).contains("`resume`"));
    assert!(open_err(json!({"rank": 2, "world_size": 2})).contains("`rank` 2"));
    assert!(open_err(json!({"resampled": true})).contains("samples_per_epoch"));
    assert!(open_err(json!({"shuffle_initial": 5})).contains("shuffle_initial"));
    // A state of another configuration.
    let l = Loader::open(config(&paths, json!({"seed": 1}))).unwrap();
    take_batches(&l, 1);
    let st = l.state().to_hex();
    drop(l);
    let e = open_err(json!({"seed": 2, "batch_size": 5, "resume": st}));
    assert!(e.contains("another dataset or other epoch settings"), "{e}");
    // States of a 2-consumer layout, one missing, resumed as 3.
    let mut e2 = json!({"world_size": 2, "rank": 0});
    let l = Loader::open(config(&paths, e2.clone())).unwrap();
    take_batches(&l, 1);
    e2["world_size"] = json!(3);
    e2["batch_size"] = json!(5);
    e2["resume"] = json!([l.state().to_hex()]);
    let e = open_err(e2);
    assert!(
        e.contains("needs the state of every old consumer; missing: 1"),
        "{e}"
    );
    // A manifest whose sample count is wrong.
    let m = dir.path().join("set.manifest");
    let counts = counts_of(&paths);
    let mut text = String::new();
    for (i, (p, c)) in paths.iter().zip(&counts).enumerate() {
        let c = if i == 1 { c + 3 } else { *c };
        text.push_str(&format!(
            "{} {} {c}\n",
            p.display(),
            p.metadata().unwrap().len()
        ));
    }
    std::fs::write(&m, text).unwrap();
    let cfg = Config::from_map(
        // Rank 1's share ends at the end of shard 1 as the manifest counts it.
        json!({"manifest": m.display().to_string(), "world_size": 2, "rank": 1,
               "memory_budget": "16MiB", "chunk_size": "256KiB"})
        .as_object()
        .unwrap(),
    )
    .unwrap();
    let e = support::first_error(cfg);
    assert!(
        matches!(&e, Error::Plan { .. }) && e.to_string().contains("samples"),
        "{e}"
    );
}

#[test]
fn a_worker_whose_open_batch_fills_its_share_is_an_error_not_a_hang() {
    // Stream 0 reads a shard of ~200 KB samples, stream 1 one of ~4 KB
    // samples. A batch of 16 large samples needs ~16 chunks of 256 KiB, but
    // each of the 2 workers may hold 8: stream 1 fills its queue and waits,
    // the sequencer waits on stream 0, which can never complete its batch.
    // With a shard of a few small samples, stream 1's worker is done at
    // once and worker 0 waits alone: the pool's check for every worker
    // waiting sees it first, and names the worker's share too (CI once
    // saw that check's message, about the arena's free chunks, where the
    // run of 2 MB had finished first).
    for small_bytes in [2_000_000, 20_000] {
        let big = tempfile::tempdir().unwrap();
        let small = tempfile::tempdir().unwrap();
        let a = make_shards(big.path(), 1, 6_000_000, 200_000);
        let b = make_shards(small.path(), 1, small_bytes, 4_000);
        let paths = vec![a[0].clone(), b[0].clone()];
        let l = Loader::open(config(
            &paths,
            json!({"memory_budget": "4MiB", "workers": 2, "batch_size": 16}),
        ))
        .unwrap();
        let e = match l.next(Some(Duration::from_secs(60))) {
            Err(e) => e,
            Ok(other) => panic!("expected an error, got {other:?}"),
        };
        assert!(matches!(e, Error::BudgetTooSmall { .. }), "{e}");
        assert!(
            e.to_string().contains("worker 0 holds all"),
            "{small_bytes}: {e}"
        );
    }
}

#[test]
fn elastic_resumes_that_cannot_be_exact_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, urls) = served(dir.path(), 3);
    let open = |extra: Value| config_urls(&urls, &extra).and_then(Loader::open);
    // Over HTTP without a manifest, the counts are unknown: a mid-epoch
    // state of 2 workers cannot say which samples went out in 3.
    let l = open(json!({"workers": 2})).unwrap();
    take_batches(&l, 2);
    let st = l.state().to_hex();
    drop(l);
    let e = open(json!({"workers": 3, "resume": st}))
        .err()
        .expect("refused");
    assert!(
        e.to_string().contains("needs every shard's sample count"),
        "{e}"
    );
    // Its own layout resumes (by replay).
    let l = open(json!({"workers": 2, "resume": st})).unwrap();
    assert!(!take_batches(&l, usize::MAX).is_empty());
    drop(l);
    // samples_per_epoch: the length of the rest is not defined on another layout.
    let dir2 = tempfile::tempdir().unwrap();
    let paths = make_shards(dir2.path(), 3, 150_000, 5_000);
    let l = Loader::open(config(
        &paths,
        json!({"samples_per_epoch": 40, "workers": 2}),
    ))
    .unwrap();
    take_batches(&l, 2);
    let st = l.state().to_hex();
    drop(l);
    let e = Loader::open(config(
        &paths,
        json!({"samples_per_epoch": 40, "workers": 3, "resume": st}),
    ))
    .err()
    .expect("refused");
    assert!(
        e.to_string()
            .contains("cannot be resumed on another layout"),
        "{e}"
    );
}

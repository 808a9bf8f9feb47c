//! The engine's unit tests: whole loaders (workers, shuffler, sequencer)
//! over scripted readers (`script`), so the worker's read loop, sample
//! assembly, the shuffler and the sequencer are driven through every order
//! of completions, short reads, delays, failing reads and a panicking
//! backend, without files or sockets. The oracle for the order is the pure
//! plan (`plan::consumer_order`): whatever the I/O does, the engine must
//! deliver exactly the plan's batches.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use proptest::prelude::*;

use super::script::Script;
use super::{Loader, Next, Stats};
use crate::config::Config;
use crate::dataset::{Shard, Source};
use crate::error::{Error, Fault, IoOp};
use crate::net::object::HttpObject;
use crate::plan::{self, SampleRef};
use crate::synth;

// The CUDA registration's tests, over these helpers.
mod cuda;

const SEED: u64 = 11;

/// One in-memory shard: `samples` samples of two fields, the first of
/// `size` bytes (varied by index), the second small; returns its tar bytes.
fn shard_bytes(shard: usize, samples: u64, size: usize) -> Vec<u8> {
    let mut tar = Vec::new();
    for j in 0..samples {
        let key = synth::sample_key(shard, j);
        for (field, len) in [("bin", size + (j as usize * 977) % (size + 1)), ("cls", 7)] {
            let mut data = vec![0u8; len];
            synth::fill(SEED, key.as_bytes(), field.as_bytes(), &mut data);
            synth::write_member(&mut tar, &format!("{key}.{field}"), &data).unwrap();
        }
    }
    tar.extend_from_slice(&[0u8; 1024]);
    tar
}

pub(super) struct Data {
    pub(super) shards: Vec<Shard>,
    pub(super) objects: HashMap<String, Vec<u8>>,
    pub(super) counts: Vec<u64>,
}

pub(super) fn data(samples: &[u64], size: usize) -> Data {
    let mut d = Data {
        shards: Vec::new(),
        objects: HashMap::new(),
        counts: samples.to_vec(),
    };
    for (i, &n) in samples.iter().enumerate() {
        let url = format!("http://scripted.invalid/shard-{i}.tar");
        let bytes = shard_bytes(i, n, size);
        d.shards.push(Shard {
            name: url.clone(),
            source: Source::Http(Arc::new(HttpObject::new(&url, Vec::new()).unwrap())),
            size: Some(bytes.len() as u64),
            samples: None,
        });
        d.objects.insert(url, bytes);
    }
    d
}

/// A small engine: 64 KiB chunks (56 KiB read per chunk, so members cross
/// chunks and spill), normal pages, no pinning.
pub(super) fn config(
    workers: usize,
    reads_in_flight: usize,
    budget_chunks: u64,
    extra: &str,
) -> Config {
    Config::from_json(&format!(
        r#"{{"urls": ["scripted"], "batch_size": 5, "workers": {workers},
            "reads_in_flight": {reads_in_flight}, "chunk_size": 65536,
            "memory_budget": {}, "memory_kind": "normal", "lock_memory": "off",
            "pin_cpus": false, "prefetch_batches": 2 {extra}}}"#,
        budget_chunks * 65536
    ))
    .unwrap()
}

/// What one loader over scripted readers gave.
struct Run {
    /// Every batch until the end or the error (each sample's bytes checked).
    batches: Vec<Vec<SampleRef>>,
    error: Option<Error>,
    stats: Stats,
    /// Reads submitted, all workers together.
    submitted: u64,
    /// Reads that landed (or were left in flight) in a chunk back in the pool.
    violations: Vec<String>,
}

/// Opens a loader over `d` whose workers read through `script`, streams it
/// to its end (or its error) and closes it.
fn run(cfg: Config, d: &Data, script: Script) -> Run {
    let script = Arc::new(Script {
        objects: d.objects.clone(),
        ..script
    });
    let s = Arc::clone(&script);
    let loader = Loader::open_with_readers(
        cfg,
        d.shards.clone(),
        Arc::new(move |stream, pool| s.reader(stream, pool)),
    )
    .unwrap();
    let (batches, error) = drain(&loader);
    let stats = loader.stats();
    // Closing joins the workers, which drops their readers: then the script
    // has seen every read's end.
    drop(loader);
    Run {
        batches,
        error,
        stats,
        submitted: script.submitted.load(Ordering::Relaxed),
        violations: script.violations(),
    }
}

/// Every batch until the end (each sample's bytes checked), or the error.
pub(super) fn drain(loader: &Loader) -> (Vec<Vec<SampleRef>>, Option<Error>) {
    let mut batches = Vec::new();
    loop {
        match loader.next(Some(Duration::from_secs(60))) {
            Ok(Next::Batch(b)) => {
                let mut refs = Vec::new();
                for s in b.samples() {
                    let key = std::str::from_utf8(s.key()).unwrap();
                    let (shard, index) = key.split_once('-').unwrap();
                    for (name, data) in s.fields() {
                        assert!(
                            synth::verify(SEED, s.key(), name, data),
                            "bad bytes in {key}"
                        );
                    }
                    assert_eq!(s.fields().count(), 2, "{key} lost a field");
                    refs.push((shard.parse().unwrap(), index.parse().unwrap(), false));
                }
                batches.push(refs);
            }
            Ok(Next::EndOfEpoch(_)) => {}
            Ok(Next::Finished) => return (batches, None),
            Ok(Next::Timeout) => panic!("the loader stalled (no batch, no error in 60 s)"),
            Err(e) => return (batches, Some(e)),
        }
    }
}

fn plan_order(cfg: &Config, workers: usize, counts: &[u64]) -> Vec<Vec<SampleRef>> {
    plan::consumer_order(&cfg.plan_options(workers), counts, 0, None)
        .unwrap()
        .into_iter()
        .map(|b| b.into_iter().map(|(s, i, _)| (s, i, false)).collect())
        .collect()
}

#[test]
fn one_worker_reads_in_any_order_with_short_reads_and_delays() {
    let d = data(&[40, 25, 60], 3000);
    let cfg = config(1, 4, 16, r#", "epochs": 1"#);
    let want = plan_order(&cfg, 1, &d.counts);
    let chunks: usize = d.objects.values().map(|o| o.len().div_ceil(57344)).sum();
    for seed in 0..8 {
        let script = Script {
            seed,
            short_reads: true,
            max_delay: 3,
            ..Script::default()
        };
        let r = run(cfg.clone(), &d, script);
        assert!(r.error.is_none(), "seed {seed}: {:?}", r.error);
        assert_eq!(r.batches, want, "seed {seed}: not the plan's order");
        assert!(
            r.submitted > chunks as u64,
            "seed {seed}: no short read was continued"
        );
        assert_eq!(r.violations, Vec::<String>::new());
    }
}

#[test]
fn members_larger_than_a_chunk_spill_and_arrive_whole() {
    // 150 KB members span three chunks: they go into spill runs.
    let d = data(&[6, 4], 150_000);
    let cfg = config(2, 3, 80, r#", "epochs": 1"#);
    let want = plan_order(&cfg, 2, &d.counts);
    let script = Script {
        seed: 3,
        short_reads: true,
        max_delay: 2,
        ..Script::default()
    };
    let r = run(cfg, &d, script);
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(r.batches, want);
    assert!(r.stats.bytes_copied > 0, "no member was made contiguous");
    assert_eq!(r.violations, Vec::<String>::new());
}

#[test]
fn the_shuffler_keeps_the_plan_order_and_compacts_within_its_share() {
    // A buffer of 60 samples of ~4.5 KB per worker (about 12 to a chunk)
    // pins some 15 chunks, its limit is 6 of the 12 a worker holds: it
    // compacts (packed, its 270 KB take 5).
    let d = data(&[120, 90, 150, 80], 3000);
    let cfg = config(
        2,
        2,
        24,
        r#", "epochs": 2, "shuffle": true, "seed": 5, "shuffle_buffer": 120"#,
    );
    let mut want = plan_order(&cfg, 2, &d.counts);
    want.extend(
        plan::consumer_order(&cfg.plan_options(2), &d.counts, 1, None)
            .unwrap()
            .into_iter()
            .map(|b| {
                b.into_iter()
                    .map(|(s, i, _)| (s, i, false))
                    .collect::<Vec<_>>()
            }),
    );
    for seed in [1, 2] {
        let script = Script {
            seed,
            short_reads: true,
            max_delay: 2,
            ..Script::default()
        };
        let r = run(cfg.clone(), &d, script);
        assert!(r.error.is_none(), "{:?}", r.error);
        assert_eq!(r.batches, want, "seed {seed}");
        assert!(r.stats.shuffle_copied > 0, "the buffer never compacted");
        assert_eq!(r.violations, Vec::<String>::new());
    }
}

#[test]
fn a_failing_read_is_a_named_error_after_the_batches_before_it() {
    let d = data(&[40, 40, 40], 3000);
    let cfg = config(1, 4, 16, r#", "epochs": 1"#);
    let url = d.shards[1].name.clone();
    let script = Script {
        seed: 9,
        max_delay: 2,
        fail_at: Some((url.clone(), 70_000)),
        ..Script::default()
    };
    let r = run(cfg, &d, script);
    match r.error {
        Some(Error::Io {
            op, path, errno, ..
        }) => {
            assert_eq!((op, errno), (IoOp::Read, libc::EIO));
            assert_eq!(path.to_str(), Some(url.as_str()));
        }
        other => panic!("expected the read error, got {other:?}"),
    }
    // The first shard's samples came before the error.
    let first = r.batches.iter().flatten().filter(|s| s.0 == 0).count();
    assert_eq!(first, 40);
    assert_eq!(r.violations, Vec::<String>::new());
}

#[test]
fn a_panicking_backend_is_an_internal_error_and_its_reads_drain_first() {
    let d = data(&[200], 3000);
    let cfg = config(1, 4, 16, r#", "epochs": 1"#);
    // The first four submissions come back to back (4 reads in flight):
    // the fourth panics while three are queued, held back by the delays.
    for queue_then_panic in [false, true] {
        let script = Script {
            seed: 4,
            max_delay: 4,
            panic_on_submit: Some(4),
            queue_then_panic,
            ..Script::default()
        };
        let r = run(cfg.clone(), &d, script);
        match r.error {
            Some(Error::Internal {
                fault: Fault::Panic,
                detail,
            }) => assert!(detail.contains("a worker panicked"), "{detail}"),
            other => panic!("expected an internal error, got {other:?}"),
        }
        assert_eq!(
            r.violations,
            Vec::<String>::new(),
            "queue_then_panic {queue_then_panic}"
        );
    }
}

#[test]
fn a_wait_that_fails_after_giving_completions_is_an_error_without_a_hang() {
    let d = data(&[200], 3000);
    let cfg = config(1, 4, 16, r#", "epochs": 1"#);
    for fail_wait in [1, 2, 3] {
        let script = Script {
            seed: 2,
            max_delay: 1,
            fail_wait: Some(fail_wait),
            ..Script::default()
        };
        let r = run(cfg.clone(), &d, script);
        match r.error {
            Some(Error::Io { op, errno, .. }) => assert_eq!((op, errno), (IoOp::Read, libc::EINTR)),
            other => panic!("wait {fail_wait}: expected the wait's error, got {other:?}"),
        }
        assert_eq!(r.violations, Vec::<String>::new(), "wait {fail_wait}");
    }
}

#[test]
fn shards_of_unknown_size_are_sized_by_their_first_read() {
    // Shards of one chunk and more, one smaller than a read, one with no
    // sample (its 1 KiB end-of-archive only), none sized at open.
    let mut d = data(&[40, 3, 0, 25], 3000);
    for s in &mut d.shards {
        s.size = None;
    }
    for (workers, reads) in [(1, 4), (2, 2)] {
        let cfg = config(workers, reads, 24, r#", "epochs": 1"#);
        let want = plan_order(&cfg, workers, &d.counts);
        for seed in 0..4 {
            let script = Script {
                seed,
                short_reads: true,
                max_delay: 2,
                ..Script::default()
            };
            let r = run(cfg.clone(), &d, script);
            assert!(r.error.is_none(), "seed {seed}: {:?}", r.error);
            assert_eq!(r.batches, want, "seed {seed}: not the plan's order");
            assert_eq!(r.violations, Vec::<String>::new());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any shards, layout and I/O script: either every sample of the plan
    /// arrives in the plan's order, or (when a read fails) the error names
    /// the shard, or (when the backend panics) it is an internal error;
    /// never a hang, never a read into a returned chunk.
    #[test]
    fn any_script_gives_the_plan_or_a_named_error(
        samples in prop::collection::vec(1u64..60, 1..4),
        size in 100usize..20_000,
        workers in 1usize..4,
        reads in 1usize..6,
        seed in any::<u64>(),
        short_reads in any::<bool>(),
        max_delay in 0u32..4,
        fail in prop::option::of((any::<prop::sample::Index>(), any::<prop::sample::Index>())),
        panic in prop::option::of((1u64..40, any::<bool>())),
        size_unknown in any::<bool>(),
    ) {
        let mut d = data(&samples, size);
        let budget = 2 * workers as u64 * (reads as u64 + 6) + 8;
        let cfg = config(workers, reads, budget, r#", "epochs": 1"#);
        let fail_at = fail.map(|(s, o)| {
            let shard = &d.shards[s.index(d.shards.len())];
            (shard.name.clone(), o.index(d.objects[&shard.name].len()) as u64)
        });
        if size_unknown {
            for s in &mut d.shards {
                s.size = None;
            }
        }
        let script = Script {
            seed,
            short_reads,
            max_delay,
            fail_at: fail_at.clone(),
            panic_on_submit: panic.map(|p| p.0),
            queue_then_panic: panic.is_some_and(|p| p.1),
            ..Script::default()
        };
        let r = run(cfg.clone(), &d, script);
        match (&r.error, &fail_at) {
            // A panicking backend: an internal error, whatever else failed.
            (
                Some(Error::Internal {
                    fault: Fault::Panic,
                    detail,
                }),
                _,
            ) if panic.is_some() => {
                prop_assert!(detail.contains("a worker panicked"), "{}", detail)
            }
            // Fewer submissions than the one that would panic.
            (None, None) => prop_assert_eq!(r.batches, plan_order(&cfg, workers, &d.counts)),
            // Every byte of every shard is read (one consumer), so the
            // failing byte is always met.
            (Some(Error::Io { op: IoOp::Read, path, errno, .. }), Some((url, _))) => {
                prop_assert_eq!(*errno, libc::EIO);
                prop_assert_eq!(path.to_str(), Some(url.as_str()));
            }
            (e, f) => prop_assert!(false, "error {:?} for failure {:?}", e, f),
        }
        prop_assert_eq!(r.violations, Vec::<String>::new());
    }
}

#[test]
fn a_stream_wants_room_for_the_batch_kept_and_the_next() {
    use super::setup::batch_share;
    let shard = |size, samples| Shard {
        name: "s".into(),
        source: Source::File("/s".into()),
        size,
        samples,
    };
    let cfg = Config {
        batch_size: 256,
        ..Config::default()
    };
    // 100,000-byte samples: two batches and a quarter are 64,000,000
    // bytes, 8 chunks of 8 MiB, spanning one more, and the read after.
    let shards = [
        shard(Some(50_000_000), Some(500)),
        shard(Some(10_000_000), Some(100)),
    ];
    assert_eq!(batch_share(&cfg, &shards, 8 << 20), 8 + 2);
    // Shards without both their size and count do not count; none: 0.
    let partly = [
        shards[0].clone(),
        shard(None, Some(7)),
        shard(Some(9), None),
    ];
    assert_eq!(batch_share(&cfg, &partly, 8 << 20), 10);
    assert_eq!(batch_share(&cfg, &[shard(None, Some(7))], 8 << 20), 0);
    assert_eq!(batch_share(&cfg, &[shard(Some(0), Some(0))], 8 << 20), 0);
}

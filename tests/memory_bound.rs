//! The memory bound: 20 GB of shards computed on the fly by a server
//! (`support::VirtualShards`: nothing is stored) stream over http:// through
//! an engine with the smallest `memory_budget` it accepts, while the
//! process's resident memory, sampled throughout, stays within the budget
//! plus 64 MiB; once in order, once through a shuffle buffer. Every sample
//! arrives exactly once, every byte of it checked (its number, its key, its
//! `cls` and its own stretch of the pattern).
//!
//! `RINGFEED_BOUND_GB` sets the volume (default 20).

use ringfeed_test_support as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringfeed::{Config, Loader, Next};
use support::{VirtualLayout, VirtualShards, virtual_bin_is};

/// The process's resident bytes (`/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// The smallest budget the engine accepts for `cfg`, from `start` up a
/// chunk at a time: one it opens with and streams its first 64 batches
/// through (a budget too small for the batches or the shuffle buffer shows
/// there, as `BudgetTooSmall`); then a loader opened anew with it.
fn smallest(mut cfg: serde_json::Value, start: u64, chunk: u64) -> (Loader, u64) {
    let mut budget = start;
    let open =
        |cfg: &serde_json::Value| Config::from_map(cfg.as_object().unwrap()).and_then(Loader::open);
    loop {
        cfg["memory_budget"] = serde_json::json!(budget);
        let tried = open(&cfg).and_then(|l| {
            for _ in 0..64 {
                match l.next(Some(Duration::from_secs(120)))? {
                    Next::Batch(_) | Next::EndOfEpoch(_) => {}
                    Next::Finished | Next::Timeout => break,
                }
            }
            Ok(())
        });
        match tried {
            Ok(()) => return (open(&cfg).unwrap(), budget),
            Err(e) => {
                assert!(e.to_string().contains("memory_budget"), "{e}");
                budget += chunk;
                assert!(budget < 1 << 30, "no budget under 1 GiB accepted: {e}");
            }
        }
    }
}

fn bounded(shuffle_buffer: u64) {
    let gb: u64 = std::env::var("RINGFEED_BOUND_GB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let sample_bytes = 200_000;
    let shards = 16;
    let probe = VirtualLayout {
        shards,
        samples_per_shard: 1,
        sample_bytes,
    };
    let layout = VirtualLayout {
        samples_per_shard: (gb << 30).div_ceil(shards * probe.sample_stride()),
        ..probe
    };
    let server = VirtualShards::start(layout);
    let chunk = 1u64 << 20;
    let cfg = serde_json::json!({
        "urls": server.url(&layout),
        "batch_size": 4,
        "workers": 2,
        "chunk_size": chunk,
        "shuffle": shuffle_buffer > 0,
        "shuffle_buffer": shuffle_buffer,
        "seed": 5,
    });
    let before = rss();
    let (loader, budget) = smallest(cfg, chunk, chunk);
    // Sampled every 20 ms on a thread of its own.
    let (peak, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut samples = 0u64;
            while !stop.load(Ordering::Acquire) {
                peak.fetch_max(rss(), Ordering::AcqRel);
                samples += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            samples
        })
    };
    let total = layout.shards * layout.samples_per_shard;
    let mut seen = vec![false; total as usize];
    let (mut n, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    loop {
        match loader.next(Some(Duration::from_secs(120))).unwrap() {
            Next::Batch(b) => {
                for s in b.samples() {
                    let (_, bin) = s.fields().find(|(name, _)| *name == b"bin").unwrap();
                    let (_, cls) = s.fields().find(|(name, _)| *name == b"cls").unwrap();
                    assert_eq!(bin.len() as u64, sample_bytes);
                    let id = u64::from_le_bytes(bin[..8].try_into().unwrap());
                    assert!(id < total, "sample number {id} of {total}");
                    // Every byte: the number in `cls` and the key too, so a
                    // member of another sample in this one's place shows.
                    assert!(
                        virtual_bin_is(id, sample_bytes, bin),
                        "sample {id}: its bin bytes are not its own"
                    );
                    assert_eq!(cls[..8], id.to_le_bytes(), "sample {id}: cls");
                    let spl = layout.samples_per_shard;
                    let key = format!("{:06}-{:07}", id / spl, id % spl);
                    assert_eq!(s.key(), key.as_bytes(), "sample {id}: key");
                    assert!(
                        !std::mem::replace(&mut seen[id as usize], true),
                        "sample {id} twice"
                    );
                    n += 1;
                    bytes += bin.len() as u64;
                }
            }
            Next::EndOfEpoch(_) => {}
            Next::Finished => break,
            Next::Timeout => panic!("no batch for 120 s"),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    let readings = sampler.join().unwrap();
    let peak = peak.load(Ordering::Acquire);
    println!(
        "shuffle_buffer {shuffle_buffer}: {n} samples, {:.1} GB of payload in {secs:.1} s; budget {} MiB; \
         RSS {} MiB before open, peak {} MiB over {readings} readings",
        bytes as f64 / 1e9,
        budget >> 20,
        before >> 20,
        peak >> 20
    );
    assert_eq!(n, total, "samples lost");
    assert!(layout.total_bytes() >= gb << 30);
    assert!(readings >= 10, "{readings} readings");
    assert!(
        peak <= budget + (64 << 20),
        "resident {} MiB, over the budget of {} MiB + 64 MiB",
        peak >> 20,
        budget >> 20
    );
}

#[test]
fn twenty_gb_stream_within_the_smallest_budget() {
    bounded(0);
}

#[test]
fn twenty_gb_stream_within_the_smallest_budget_through_a_shuffle_buffer() {
    bounded(16);
}

#[test]
fn the_virtual_shards_answer_any_range_with_the_bytes_of_the_whole() {
    let layout = VirtualLayout {
        shards: 2,
        samples_per_shard: 5,
        sample_bytes: 70_001,
    };
    let server = VirtualShards::start(layout);
    let get = |range: Option<(u64, u64)>| -> Vec<u8> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(server.addr).unwrap();
        let r = range.map_or(String::new(), |(a, b)| format!("Range: bytes={a}-{b}\r\n"));
        write!(
            c,
            "GET /shard-000001.tar HTTP/1.1\r\nHost: x\r\n{r}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        out.split_off(at)
    };
    let whole = get(None);
    assert_eq!(whole.len() as u64, layout.shard_len());
    for (a, b) in [
        (0, 0),
        (1, 700),
        (511, 513),
        (70_000, 150_000),
        (100, layout.shard_len() - 1),
    ] {
        assert_eq!(get(Some((a, b))), whole[a as usize..=b as usize], "{a}-{b}");
    }
    // A tar the engine reads: the samples, in order, with their numbers.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.tar");
    std::fs::write(&path, &whole).unwrap();
    let cfg = serde_json::json!({"urls": [path], "batch_size": 5});
    let loader = Loader::open(Config::from_map(cfg.as_object().unwrap()).unwrap()).unwrap();
    let Next::Batch(b) = loader.next(Some(Duration::from_secs(60))).unwrap() else {
        panic!("no batch");
    };
    let bins: Vec<&[u8]> = b
        .samples()
        .map(|s| s.fields().find(|(n, _)| *n == b"bin").unwrap().1)
        .collect();
    let ids: Vec<u64> = bins
        .iter()
        .map(|bin| u64::from_le_bytes(bin[..8].try_into().unwrap()))
        .collect();
    assert_eq!(ids, vec![5, 6, 7, 8, 9]);
    for (bin, id) in bins.iter().zip(&ids) {
        assert!(virtual_bin_is(*id, layout.sample_bytes, bin), "sample {id}");
    }
    // The check's control: a sample's number on another's bytes, and one
    // byte changed anywhere, are caught.
    let mut other = bins[1].to_vec();
    other[..8].copy_from_slice(&5u64.to_le_bytes());
    assert!(!virtual_bin_is(5, layout.sample_bytes, &other));
    let mut flipped = bins[0].to_vec();
    flipped[60_000] ^= 1;
    assert!(!virtual_bin_is(5, layout.sample_bytes, &flipped));
}

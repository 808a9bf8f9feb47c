//! The local cache tier against a real HTTP server on 127.0.0.1
//! (tests/support): a second run reads from disk, a changed object or a
//! corrupt entry is never served, the least recently used entry goes first,
//! processes sharing the directory fetch each shard once, and a full disk
//! or a read-only directory leaves the job running uncached, saying so.
//! Every run checks that every sample of what it reads arrived, once, with
//! all its fields, every byte against the generator; the default fill
//! (`cache_fill` "spare") runs end to end too.
//!
//! The disk-full and read-only tests mount small tmpfs file systems, which
//! needs root (CAP_SYS_ADMIN), as CI runs.

use ringfeed_test_support as support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ringfeed::cache::{Cache, CacheOptions, Fill, FillMode, Identity, MinFree, Spool};
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Loader, Stats};
use support::Server;

const SHARDS: usize = 3;

/// A generated dataset: its seed, its bytes, and each shard's sample keys.
struct Data {
    seed: u64,
    bytes: u64,
    /// Each shard's size.
    sizes: Vec<u64>,
    shards: Vec<BTreeSet<Vec<u8>>>,
}

impl Data {
    fn all(&self) -> BTreeSet<Vec<u8>> {
        self.shards.iter().flatten().cloned().collect()
    }
}

/// `SHARDS` shards of about 2 MiB with fields `jpg` and `cls`.
fn dataset(dir: &Path, seed: u64) -> Data {
    dataset_of(dir, seed, 2 << 20)
}

/// `SHARDS` shards of about `shard_bytes` each.
fn dataset_of(dir: &Path, seed: u64, shard_bytes: u64) -> Data {
    let o = GenOptions {
        shards: SHARDS,
        shard_bytes,
        sample_bytes: 60_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    let r = synth::generate(dir, &o, |_| {}).unwrap();
    Data {
        seed,
        bytes: r.paths.iter().map(|p| p.metadata().unwrap().len()).sum(),
        sizes: r
            .paths
            .iter()
            .map(|p| p.metadata().unwrap().len())
            .collect(),
        shards: r
            .shard_samples
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                (0..n)
                    .map(|j| synth::sample_key(i, j).into_bytes())
                    .collect()
            })
            .collect(),
    }
}

/// The test configuration, with every shard read whole written (the
/// default writes only with the disk's spare bandwidth, which a loaded
/// machine may not have; `default_fill_config` leaves it).
fn config(urls: &[String], cache: &Path, extra: serde_json::Value) -> Config {
    let mut m = base_config(urls, cache);
    m.insert("cache_fill".into(), serde_json::json!("always"));
    with(m, extra)
}

/// The test configuration with `cache_fill` at its default.
fn default_fill_config(urls: &[String], cache: &Path) -> Config {
    with(base_config(urls, cache), serde_json::json!({}))
}

fn with(mut m: serde_json::Map<String, serde_json::Value>, extra: serde_json::Value) -> Config {
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Config::from_map(&m).unwrap()
}

fn base_config(urls: &[String], cache: &Path) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("memory_budget".into(), serde_json::json!("16MiB"));
    m.insert("chunk_size".into(), serde_json::json!("1MiB"));
    m.insert("batch_size".into(), serde_json::json!(5));
    m.insert("workers".into(), serde_json::json!(2));
    m.insert("cache_dir".into(), serde_json::json!(cache));
    m.insert("cache_min_free".into(), serde_json::json!(0));
    m
}

fn urls(server: &Server) -> Vec<String> {
    vec![server.url("shard-{000000..000002}.tar")]
}

/// Streams one epoch of the whole dataset (every sample, see `run_some`),
/// closes the loader (which waits for the cache's writes) and gives its
/// stats.
fn run(cfg: Config, d: &Data) -> Stats {
    run_some(cfg, d.seed, &d.all())
}

/// Streams one epoch that must deliver exactly the samples `keys`, each
/// once, with both fields, every byte checked against `seed`.
fn run_some(cfg: Config, seed: u64, keys: &BTreeSet<Vec<u8>>) -> Stats {
    let loader = Loader::open(cfg).unwrap();
    let seen = every_sample(&loader, seed);
    loader.close();
    let stats = loader.stats();
    assert_eq!(seen.len() as u64, stats.samples_delivered);
    let missing = keys.difference(&seen).count();
    let extra = seen.difference(keys).count();
    assert!(
        missing == 0 && extra == 0,
        "{missing} samples missing, {extra} not asked for ({} expected)",
        keys.len()
    );
    stats
}

/// Every sample of the loader's epochs: checked against `seed` (both
/// fields there, every byte), none twice.
fn every_sample(loader: &Loader, seed: u64) -> BTreeSet<Vec<u8>> {
    let mut seen = BTreeSet::new();
    loop {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            ringfeed::Next::Batch(b) => {
                for s in b.samples() {
                    let mut names = Vec::new();
                    for (name, data) in s.fields() {
                        assert!(synth::verify(seed, s.key(), name, data), "bad bytes");
                        names.push(name.to_vec());
                    }
                    names.sort();
                    assert_eq!(names, [b"cls".to_vec(), b"jpg".to_vec()], "fields");
                    assert!(seen.insert(s.key().to_vec()), "a sample twice");
                }
            }
            ringfeed::Next::EndOfEpoch(_) => {}
            ringfeed::Next::Finished => return seen,
            ringfeed::Next::Timeout => panic!("stalled"),
        }
    }
}

/// The entries in `dir`.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "rfc") && !is_hidden(p));
    v.sort();
    v
}

fn is_hidden(p: &Path) -> bool {
    p.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

fn gets(server: &Server) -> usize {
    server.faults.gets.load(Ordering::SeqCst)
}

/// The bytes the server's ranged GETs asked for, all of them ranged.
fn bytes_asked(server: &Server) -> u64 {
    let ranges = server.faults.ranges.lock().unwrap();
    assert_eq!(ranges.len(), gets(server), "a GET without a range");
    ranges.iter().map(|(a, b)| b + 1 - a).sum()
}

#[test]
fn a_restart_reads_every_shard_from_the_cache_and_not_the_network() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 41);
    let bytes = d.bytes;
    let server = Server::start(data.path().to_path_buf());

    let first = run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d,
    );
    assert_eq!(first.cache_misses, SHARDS as u64);
    assert_eq!(first.cache_hits, 0);
    // Every byte of every shard asked for once.
    assert_eq!(bytes_asked(&server), bytes);
    // Written in the background; whole once the loader closed.
    assert_eq!(entries(cache.path()).len(), SHARDS);

    let gets_before = gets(&server);
    let second = run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d,
    );
    assert_eq!(second.cache_hits, SHARDS as u64, "{:?}", second.notes);
    assert_eq!(second.cache_misses, 0);
    assert_eq!(second.cache_bytes, bytes);
    assert_eq!(second.samples_delivered, first.samples_delivered);
    assert_eq!(gets(&server), gets_before, "a hit sent a GET");
    assert_eq!(second.cache_reads, "direct", "{:?}", second.notes);

    // The same on the thread backend, and with direct reads off.
    for extra in [
        serde_json::json!({"io_backend": "threads"}),
        serde_json::json!({"cache_direct": "off"}),
    ] {
        let s = run(config(&urls(&server), cache.path(), extra.clone()), &d);
        assert_eq!(s.cache_hits, SHARDS as u64, "{extra}");
        assert_eq!(gets(&server), gets_before, "{extra}");
    }
    let off = run(
        config(
            &urls(&server),
            cache.path(),
            serde_json::json!({"cache_direct": "off"}),
        ),
        &d,
    );
    assert_eq!(off.cache_reads, "buffered");
}

/// The default fill (`cache_fill` "spare") end to end: a first run on a
/// disk that keeps up fills every shard, those of streams that start
/// together too; a second run reads every shard from the cache and sends
/// no GET, every sample checked. Shards of about 1 MiB read in 1 MiB
/// chunks make 2 pieces each, 6 in all: fewer than the writer's queue
/// holds (8), so even a writer kept off the CPU for the whole run never
/// finds it full, and the machine's load cannot make a fill give up.
#[test]
fn the_default_fill_caches_every_shard_for_the_next_run() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d = dataset_of(data.path(), 53, 1 << 20);
    let server = Server::start(data.path().to_path_buf());
    let first = run(default_fill_config(&urls(&server), cache.path()), &d);
    assert_eq!(first.cache_misses, SHARDS as u64);
    assert_eq!(first.cache_uncached, 0, "{:?}", first.notes);
    assert_eq!(first.cache_written, SHARDS as u64, "{:?}", first.notes);
    assert_eq!(first.cache_bytes_written, d.bytes);
    assert_eq!(entries(cache.path()).len(), SHARDS);

    let gets_before = gets(&server);
    let second = run(default_fill_config(&urls(&server), cache.path()), &d);
    assert_eq!(second.cache_hits, SHARDS as u64, "{:?}", second.notes);
    assert_eq!(second.cache_misses, 0);
    assert_eq!(second.cache_bytes, d.bytes);
    assert_eq!(gets(&server), gets_before, "a hit sent a GET");
}

#[test]
fn a_second_epoch_of_one_loader_reads_from_the_cache() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 42);
    let server = Server::start(data.path().to_path_buf());
    let loader = Loader::open(config(
        &urls(&server),
        cache.path(),
        serde_json::json!({"epochs": 2}),
    ))
    .unwrap();
    let mut per_epoch = std::collections::BTreeMap::<u64, BTreeSet<Vec<u8>>>::new();
    loop {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            ringfeed::Next::Batch(b) => {
                for s in b.samples() {
                    for (name, data) in s.fields() {
                        assert!(synth::verify(42, s.key(), name, data), "bad bytes");
                    }
                    assert_eq!(s.fields().count(), 2, "a field missing");
                    let fresh = per_epoch
                        .entry(b.epoch())
                        .or_default()
                        .insert(s.key().to_vec());
                    assert!(fresh, "a sample twice in an epoch");
                }
            }
            ringfeed::Next::EndOfEpoch(_) => {}
            ringfeed::Next::Finished => break,
            ringfeed::Next::Timeout => panic!("stalled"),
        }
    }
    let s = loader.stats();
    assert_eq!(per_epoch.len(), 2);
    // Every sample in each epoch, the second (from the cache) too.
    assert!(per_epoch[&0] == d.all() && per_epoch[&1] == d.all());
    // Epoch 1 waited for the background writes of epoch 0's fills (same
    // process, same lock) and read the entries.
    assert_eq!(s.cache_misses, SHARDS as u64, "{:?}", s.notes);
    assert_eq!(s.cache_hits, SHARDS as u64, "{:?}", s.notes);
}

#[test]
fn a_changed_object_is_fetched_again_and_never_served_stale() {
    let data = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d43 = dataset(data.path(), 43);
    let d44 = dataset(other.path(), 44);
    let server = Server::start(data.path().to_path_buf());
    run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d43,
    );
    assert_eq!(entries(cache.path()).len(), SHARDS);
    // Every object is replaced under the same name (new bytes, new ETag).
    for i in 0..SHARDS {
        let name = format!("shard-{i:06}.tar");
        std::fs::copy(other.path().join(&name), data.path().join(&name)).unwrap();
    }
    let before = gets(&server);
    // Checked against the new objects' seed: an old entry's bytes would fail.
    let s = run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d44,
    );
    assert_eq!(s.cache_stale, SHARDS as u64);
    assert_eq!(s.cache_hits, 0);
    assert!(gets(&server) > before);
    // The new versions replaced the old entries.
    let again = run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d44,
    );
    assert_eq!(again.cache_hits, SHARDS as u64);
    assert_eq!(entries(cache.path()).len(), SHARDS);
}

/// The data offset of an entry (its header's length).
fn data_offset(entry: &Path) -> usize {
    let raw = std::fs::read(entry).unwrap();
    ringfeed::cache::entry::parse_header(&raw)
        .unwrap()
        .data_offset
}

#[test]
fn a_corrupt_or_truncated_entry_is_dropped_and_fetched_again() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 45);
    let server = Server::start(data.path().to_path_buf());
    run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d,
    );
    let files = entries(cache.path());
    assert_eq!(files.len(), SHARDS);

    // A flipped byte in the middle of one entry's data: found when that
    // read lands, before its samples are parsed; the read and the rest of
    // the shard come from the network; the samples are all right.
    let flipped = &files[0];
    let at = data_offset(flipped) + 1_500_000;
    let mut raw = std::fs::read(flipped).unwrap();
    raw[at] ^= 0x20;
    std::fs::write(flipped, &raw).unwrap();
    // Another entry cut short: refused at open.
    let cut = &files[1];
    let raw = std::fs::read(cut).unwrap();
    std::fs::write(cut, &raw[..raw.len() - 10]).unwrap();

    let before = gets(&server);
    let s = run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d,
    );
    assert_eq!(s.cache_corrupt, 2, "{:?}", s.notes);
    assert!(gets(&server) > before);
    // The flipped entry was a hit until its bad block, the cut one a miss
    // (fetched and written again); the third a hit.
    assert_eq!(s.cache_hits, 2);
    assert_eq!(s.cache_misses, 1);
    assert_eq!(s.cache_written, 1);
    assert!(!flipped.exists(), "the corrupt entry stayed");

    // The next run fills the dropped one and reads the rest from disk.
    let next = run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d,
    );
    assert_eq!(next.cache_corrupt, 0);
    assert_eq!((next.cache_hits, next.cache_misses), (2, 1));
    let last = run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d,
    );
    assert_eq!(last.cache_hits, SHARDS as u64);
}

#[test]
fn eviction_removes_the_least_recently_used_entry() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 46);
    let server = Server::start(data.path().to_path_buf());
    let one = |i: usize| vec![server.url(&format!("shard-{i:06}.tar"))];
    let sizes: Vec<u64> = (0..SHARDS)
        .map(|i| {
            data.path()
                .join(format!("shard-{i:06}.tar"))
                .metadata()
                .unwrap()
                .len()
        })
        .collect();
    // Room for two entries, not three.
    let limit = sizes.iter().sum::<u64>() - sizes.iter().min().unwrap() / 2;
    let cfg = |i: usize| {
        config(
            &one(i),
            cache.path(),
            serde_json::json!({"cache_size": limit, "workers": 1}),
        )
    };
    let read = |i: usize| {
        // Every sample of shard `i`.
        let s = run_some(cfg(i), d.seed, &d.shards[i]);
        // Uses must differ in time for the order to be seen.
        std::thread::sleep(Duration::from_millis(20));
        s
    };
    let name = |i: usize| -> PathBuf {
        let urls = one(i);
        let id = Identity {
            endpoint: format!("http://{}", server.addr),
            object: urls[0].clone(),
            version: String::new(),
            offset: 0,
            len: 0,
        };
        cache.path().join(id.file_name())
    };
    read(0);
    read(1);
    // Shard 0 used again: shard 1 is now the least recently used.
    assert_eq!(read(0).cache_hits, 1);
    let third = read(2);
    assert_eq!(third.cache_evictions, 1);
    assert!(name(0).exists() && name(2).exists());
    assert!(
        !name(1).exists(),
        "the most recently used entry was evicted"
    );

    // A shard larger than the whole limit is read uncached, and said.
    let fresh = tempfile::tempdir().unwrap();
    let s = run(
        config(
            &urls(&server),
            fresh.path(),
            serde_json::json!({"cache_size": "1MiB"}),
        ),
        &d,
    );
    assert_eq!(s.cache_uncached, SHARDS as u64);
    assert!(
        s.notes
            .iter()
            .any(|n| n.contains("larger than `cache_size`")),
        "{:?}",
        s.notes
    );
    assert!(entries(fresh.path()).is_empty());
}

/// Reads the dataset at `RINGFEED_CACHE_CHILD` = "URL CACHE_DIR" and
/// prints its stats as JSON: one of several processes sharing a cache,
/// started by the next test.
#[test]
#[ignore = "a child process of processes_sharing_a_cache_fetch_each_shard_once"]
fn cache_child() {
    let spec = std::env::var("RINGFEED_CACHE_CHILD").expect("run by the parent test");
    let (url, dir) = spec.split_once(' ').unwrap();
    let loader = Loader::open(config(
        &[url.to_string()],
        Path::new(dir),
        serde_json::json!({}),
    ))
    .unwrap();
    let seen = every_sample(&loader, 47);
    loader.close();
    let s = loader.stats();
    println!(
        "CHILD {} {} {} {}",
        s.cache_hits,
        s.cache_misses,
        s.samples_delivered,
        digest(&seen)
    );
}

/// A digest of a set of sample keys, for a child to report its own.
fn digest(keys: &BTreeSet<Vec<u8>>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in keys.iter().flat_map(|k| k.iter().chain(b"\n")) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[test]
fn processes_sharing_a_cache_fetch_each_shard_once() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 47);
    let bytes = d.bytes;
    let server = Server::start(data.path().to_path_buf());
    let url = urls(&server).remove(0);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "cache_child", "--ignored", "--nocapture"])
                .env(
                    "RINGFEED_CACHE_CHILD",
                    format!("{url} {}", cache.path().display()),
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut samples = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "a child failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("CHILD "))
            .unwrap_or_else(|| panic!("no report from a child: {text}"));
        let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        samples.push((f[2], f[3]));
    }
    // Everyone got every sample (the whole set: its size and digest); the
    // network gave each byte once.
    let all = d.all();
    assert!(
        samples
            .iter()
            .all(|&s| s == (all.len() as u64, digest(&all))),
        "{samples:?}"
    );
    let ranged: u64 = server
        .faults
        .ranges
        .lock()
        .unwrap()
        .iter()
        .map(|(a, b)| b - a + 1)
        .sum();
    assert_eq!(ranged, bytes, "bytes fetched over the network");
    assert_eq!(entries(cache.path()).len(), SHARDS);
}

#[test]
fn an_object_without_a_version_is_read_uncached() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 48);
    let server = Server::start(data.path().to_path_buf());
    server.faults.no_version.store(true, Ordering::SeqCst);
    let s = run(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        &d,
    );
    assert_eq!(s.cache_uncached, SHARDS as u64);
    assert!(
        s.notes.iter().any(|n| n.contains("has no ETag")),
        "{:?}",
        s.notes
    );
    assert!(entries(cache.path()).is_empty());
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs, which needs root (CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount(&self, opts: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,{opts}")])
            .arg(self.path())
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_disk_that_fills_stops_caching_and_the_job_goes_on() {
    // The cache's own writer, on a file system another writer fills
    // between the room check and the write.
    let fs = Tmpfs::mount("1m");
    let cache = Arc::new(
        Cache::open(CacheOptions {
            dir: fs.path().join("c"),
            size: 1 << 30,
            min_free: MinFree::Bytes(0),
        })
        .unwrap(),
    );
    let id = Identity {
        endpoint: "http://127.0.0.1:1".into(),
        object: "s3://b/k".into(),
        version: "etag \"1\"".into(),
        offset: 0,
        len: 600_000,
    };
    let Fill::Write(filler) = cache.fill(&id, Duration::from_secs(1)) else {
        panic!("the first fill was not given");
    };
    std::fs::write(fs.path().join("ballast"), vec![7u8; 700_000]).unwrap();
    let spool = Spool::start(Arc::clone(&cache), FillMode::Always).unwrap();
    let mut fill = spool.take(filler, id.len).unwrap();
    let bytes = vec![1u8; 600_000];
    // SAFETY: `bytes` outlives the spool, which is dropped (joined) below.
    assert!(unsafe { fill.append(bytes.as_ptr(), bytes.len(), Box::new(())) });
    fill.finish(Some(1));
    drop(spool);
    let note = cache.note().expect("a note");
    assert!(note.contains("disk is full"), "{note}");
    assert_eq!(cache.stats.snapshot().written, 0);
    // Nothing half-written is left, and no more fills are given.
    let names: Vec<_> = std::fs::read_dir(fs.path().join("c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| !n.ends_with(".lock") && n != ".evict")
        .collect();
    assert!(names.is_empty(), "{names:?}");
    assert!(matches!(
        cache.fill(&id, Duration::from_secs(1)),
        Fill::Uncached(_)
    ));

    // A loader on a disk with no room: every sample, nothing cached, said.
    let data = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 49);
    let server = Server::start(data.path().to_path_buf());
    let s = run(
        config(&urls(&server), &fs.path().join("c2"), serde_json::json!({})),
        &d,
    );
    assert_eq!(s.cache_uncached, SHARDS as u64);
    assert_eq!(s.cache_written, 0);
    assert!(
        s.notes.iter().any(|n| n.contains("no room")),
        "{:?}",
        s.notes
    );
}

#[test]
fn a_read_only_cache_serves_what_it_holds_and_writes_nothing() {
    let fs = Tmpfs::mount("32m");
    let dir = fs.path().join("c");
    let data = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 50);
    let bytes = d.bytes;
    let server = Server::start(data.path().to_path_buf());
    let one = vec![server.url("shard-000000.tar")];
    run_some(config(&one, &dir, serde_json::json!({})), 50, &d.shards[0]);
    assert_eq!(entries(&dir).len(), 1);
    fs.remount("ro");
    let s = run(config(&urls(&server), &dir, serde_json::json!({})), &d);
    // The entry it holds is read; the others are fetched and not written.
    assert_eq!(s.cache_hits, 1);
    assert_eq!(s.cache_written, 0);
    // Shard 0's bytes exactly, from its entry.
    assert_eq!(s.cache_bytes, d.sizes[0]);
    assert!(d.sizes[0] < bytes);
    assert!(
        s.notes
            .iter()
            .any(|n| n.contains("not writable") && n.contains("without caching")),
        "{:?}",
        s.notes
    );
    fs.remount("rw");
}

/// Every sample key of one epoch of `cfg`, checked against `seed`.
fn keys(cfg: Config, seed: u64) -> Vec<Vec<u8>> {
    let loader = Loader::open(cfg).unwrap();
    every_sample(&loader, seed).into_iter().collect()
}

/// Samples one epoch of `cfg` delivers (repeats included), and its stats;
/// or the loader's first error.
fn delivered(cfg: Config) -> ringfeed::Result<(u64, Stats)> {
    let loader = Loader::open(cfg)?;
    let mut n = 0;
    loop {
        match loader.next(Some(Duration::from_secs(60)))? {
            ringfeed::Next::Batch(b) => n += b.len() as u64,
            ringfeed::Next::EndOfEpoch(_) => {}
            ringfeed::Next::Finished => break,
            ringfeed::Next::Timeout => panic!("stalled"),
        }
    }
    Ok((n, loader.stats()))
}

#[test]
fn counts_learned_in_one_epoch_serve_one_consumer_and_never_split_ranks() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let d = dataset(data.path(), 51);
    let server = Server::start(data.path().to_path_buf());
    let ranks = |rank: u64| {
        config(
            &urls(&server),
            cache.path(),
            serde_json::json!({"world_size": 2, "rank": rank, "batch_size": 1}),
        )
    };
    let by_shard = |s: &Stats| s.notes.iter().any(|n| n.contains("split by shard"));
    // Remote shards, no manifest, nothing learned: the ranks split by shard.
    let (_, s) = delivered(ranks(0)).unwrap();
    assert!(by_shard(&s), "{:?}", s.notes);

    let all = keys(
        config(&urls(&server), cache.path(), serde_json::json!({})),
        51,
    );
    assert!(all.iter().cloned().collect::<BTreeSet<_>>() == d.all());
    // The cache holds every count now; the ranks still split by shard: a
    // node's cache is no source for a split that every rank must make alike.
    let (_, s) = delivered(ranks(1)).unwrap();
    assert!(by_shard(&s), "{:?}", s.notes);
    // A single consumer plans from it: `samples_per_epoch` past the data
    // repeats samples to reach it, counted.
    let n = all.len() as u64;
    let spe = serde_json::json!({"samples_per_epoch": n + 10});
    let (got, s) = delivered(config(&urls(&server), cache.path(), spe.clone())).unwrap();
    assert!(!by_shard(&s), "{:?}", s.notes);
    assert_eq!((got, s.samples_padded), (n + 10, 10));
    // Control: with an empty cache the same consumer knows no counts, so the
    // length is a nominal epoch its shards cannot fill: a named error.
    let empty = tempfile::tempdir().unwrap();
    let e = delivered(config(&urls(&server), empty.path(), spe)).unwrap_err();
    assert!(e.to_string().contains("nominal epoch"), "{e}");
}

#[test]
fn s3_shards_are_cached_by_their_etag() {
    use support::s3::{ACCESS_KEY, Op, S3Server, SECRET_KEY};
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("cached");
    std::fs::create_dir(&bucket).unwrap();
    let d = dataset(&bucket, 52);
    let bytes = d.bytes;
    let s3 = S3Server::start(root.path());
    let cache = tempfile::tempdir().unwrap();
    let cfg = || {
        config(
            &["s3://cached/shard-{000000..000002}.tar".to_string()],
            cache.path(),
            serde_json::json!({
                "s3_endpoint": s3.endpoint(),
                "aws_access_key_id": ACCESS_KEY,
                "aws_secret_access_key": SECRET_KEY,
                "s3_region": "us-east-1",
            }),
        )
    };
    let first = run(cfg(), &d);
    assert_eq!(first.cache_misses, SHARDS as u64, "{:?}", first.notes);
    assert_eq!(
        first.cache_written, SHARDS as u64,
        "close waits for the writes"
    );
    assert_eq!(first.cache_bytes_written, bytes);
    let gets = s3.requests(Op::GetObject);
    // One GET a read: a 1 MiB chunk reads 896 KiB (less a sixteenth at
    // each end, where a member crossing chunks is joined).
    let reads: u64 = d.sizes.iter().map(|s| s.div_ceil(896 << 10)).sum();
    assert_eq!(gets, reads);
    let second = run(cfg(), &d);
    assert_eq!(second.cache_hits, SHARDS as u64, "{:?}", second.notes);
    assert_eq!(second.cache_bytes, bytes);
    assert_eq!(s3.requests(Op::GetObject), gets, "a hit sent a GetObject");
    let listed = Cache::contents(cache.path());
    assert_eq!(listed.len(), SHARDS);
    assert!(listed.iter().all(|(id, n)| {
        id.object.starts_with("s3://cached/") && id.version.starts_with("etag ") && n.is_some()
    }));
}

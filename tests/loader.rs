//! End-to-end tests of the loader on real shards on disk: every sample's
//! bytes arrive exactly once per epoch whatever the chunk size, backend and
//! worker count; GNU long names, pax headers and skipped entry types; and the
//! errors of bad shards, named by shard and byte offset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ringfeed::error::TarError;
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader, Next};

/// Sample key → sorted (field, bytes).
type Samples = BTreeMap<String, Vec<(String, Vec<u8>)>>;

fn config(urls: Vec<String>, extra: serde_json::Value) -> Config {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("memory_budget".into(), serde_json::json!("16MiB"));
    m.insert("chunk_size".into(), serde_json::json!("256KiB"));
    m.insert("batch_size".into(), serde_json::json!(7));
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Config::from_map(&m).unwrap()
}

/// What an independent reader (the `tar` crate) finds in the shards,
/// grouped the WebDataset way.
fn expected(paths: &[PathBuf]) -> Samples {
    let mut out = Samples::new();
    for p in paths {
        let mut a = tar::Archive::new(std::fs::File::open(p).unwrap());
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            if !e.header().entry_type().is_file() {
                continue;
            }
            let name = String::from_utf8(e.path_bytes().to_vec()).unwrap();
            let base_at = name.rfind('/').map_or(0, |i| i + 1);
            let Some(dot) = name[base_at..].find('.').filter(|&d| d > 0) else {
                continue;
            };
            let (key, field) = (
                name[..base_at + dot].to_string(),
                name[base_at + dot + 1..].to_string(),
            );
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            out.entry(key).or_default().push((field, data));
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// Streams one epoch; panics if a key arrives twice.
fn epoch(loader: &Loader) -> (Samples, Option<u64>) {
    let mut got = Samples::new();
    loop {
        match loader.next(Some(Duration::from_secs(30))).unwrap() {
            Next::Batch(b) => {
                assert!(!b.is_empty());
                for s in b.samples() {
                    let key = String::from_utf8(s.key().to_vec()).unwrap();
                    let mut fields: Vec<(String, Vec<u8>)> = s
                        .fields()
                        .map(|(n, d)| (String::from_utf8(n.to_vec()).unwrap(), d.to_vec()))
                        .collect();
                    fields.sort();
                    assert!(
                        got.insert(key.clone(), fields).is_none(),
                        "sample {key} delivered twice"
                    );
                }
            }
            Next::EndOfEpoch(e) => return (got, Some(e)),
            Next::Finished => return (got, None),
            Next::Timeout => panic!("no batch within 30 s"),
        }
    }
}

fn make_shards(
    dir: &Path,
    shards: usize,
    shard_bytes: u64,
    sample_bytes: u64,
    seed: u64,
) -> Vec<PathBuf> {
    let o = GenOptions {
        shards,
        shard_bytes,
        sample_bytes,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into(), "json".into()],
        seed,
    };
    synth::generate(dir, &o, |_| {}).unwrap().paths
}

fn urls(paths: &[PathBuf]) -> Vec<String> {
    paths.iter().map(|p| p.display().to_string()).collect()
}

#[test]
fn every_sample_arrives_once_per_epoch_across_chunk_sizes_backends_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    // Samples from ~1 KB to ~190 KB: some fit a slack, some spill, some are
    // larger than a 64 KiB chunk's data region and need a multi-chunk run.
    let paths = make_shards(dir.path(), 5, 1 << 20, 100_000, 3);
    let want = expected(&paths);
    assert!(want.len() > 30);
    for (chunk, backend, workers) in [
        ("64KiB", "io_uring", 1),
        ("64KiB", "threads", 3),
        ("256KiB", "auto", 2),
        ("1MiB", "io_uring", 4),
        ("1MiB", "threads", 1),
    ] {
        let cfg = config(
            urls(&paths),
            serde_json::json!({"chunk_size": chunk, "io_backend": backend, "workers": workers, "epochs": 2}),
        );
        let loader = Loader::open(cfg).unwrap();
        for e in 0..2 {
            let (got, end) = epoch(&loader);
            assert_eq!(end, Some(e), "{chunk} {backend} {workers}");
            assert!(
                got == want,
                "{chunk} {backend} {workers}: epoch {e} differs"
            );
        }
        assert!(matches!(
            loader.next(Some(Duration::from_secs(30))).unwrap(),
            Next::Finished
        ));
        let s = loader.stats();
        assert_eq!(s.samples_delivered, 2 * want.len() as u64);
        assert_eq!(s.epochs_done, 2);
        assert_eq!(
            s.io_backend,
            if backend == "threads" {
                "threads"
            } else {
                "io_uring"
            }
        );
        assert!(s.chunks_peak <= s.chunk_count);
        assert!(
            s.bytes_copied > 0,
            "members crossing chunks are copied and counted"
        );
    }
}

#[test]
fn generated_content_verifies_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let o = GenOptions {
        shards: 3,
        shard_bytes: 2 << 20,
        sample_bytes: 30_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into(), "json".into()],
        seed: 11,
    };
    let made = synth::generate(dir.path(), &o, |_| {}).unwrap();
    let loader = Loader::open(config(urls(&made.paths), serde_json::json!({}))).unwrap();
    let (got, _) = epoch(&loader);
    // Every key the generator wrote, each once, with every field.
    // A map: its keys come sorted.
    let keys: Vec<&String> = got.keys().collect();
    let mut expected: Vec<String> = (0..o.shards)
        .flat_map(|i| (0..made.shard_samples[i]).map(move |j| synth::sample_key(i, j)))
        .collect();
    expected.sort();
    assert_eq!(keys, expected.iter().collect::<Vec<_>>());
    let mut n = 0u64;
    for (key, fields) in &got {
        let mut names: Vec<&str> = fields.iter().map(|(f, _)| f.as_str()).collect();
        names.sort();
        assert_eq!(names, ["cls", "jpg", "json"], "{key}");
        for (name, data) in fields {
            assert!(
                synth::verify(11, key.as_bytes(), name.as_bytes(), data),
                "{key}.{name}"
            );
            n += 1;
        }
    }
    assert_eq!(n, made.samples * 3);
}

/// Shards written by the `tar` crate and by GNU tar: long names, pax paths,
/// directories, symlinks, files without an extension.
#[test]
fn gnu_long_names_pax_headers_and_skipped_entries() {
    let dir = tempfile::tempdir().unwrap();
    let long_dir = "x".repeat(150);
    let mut b = tar::Builder::new(Vec::new());
    let mut n = 0;
    for i in 0..20 {
        for (field, size) in [("jpg", 5000 + i * 777), ("seg.png", 300)] {
            let name = format!("{long_dir}/sample{i:03}.{field}");
            let data: Vec<u8> = (0..size).map(|k| (k * 7 + i) as u8).collect();
            if i % 3 == 0 {
                b.append_pax_extensions([("path", name.as_bytes())])
                    .unwrap();
                let mut h = tar::Header::new_ustar();
                h.set_path("placeholder.bin").unwrap();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append(&h, data.as_slice()).unwrap();
            } else {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                b.append_data(&mut h, &name, data.as_slice()).unwrap();
            }
            n += 1;
        }
        let mut d = tar::Header::new_gnu();
        d.set_entry_type(tar::EntryType::Directory);
        d.set_size(0);
        b.append_data(&mut d, format!("dir{i}/"), std::io::empty())
            .unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_size(3);
    b.append_data(&mut h, "README", b"abc".as_slice()).unwrap();
    let a = dir.path().join("a.tar");
    std::fs::write(&a, b.into_inner().unwrap()).unwrap();

    // GNU tar, pax format, from a tree with a symlink in it.
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("deep").join("y".repeat(120))).unwrap();
    for i in 0..5 {
        let p = tree
            .join("deep")
            .join("y".repeat(120))
            .join(format!("k{i}.txt"));
        std::fs::write(p, format!("payload {i}").repeat(100)).unwrap();
    }
    std::os::unix::fs::symlink("k0.txt", tree.join("deep/link.txt")).unwrap();
    let g = dir.path().join("g.tar");
    let st = std::process::Command::new("tar")
        .args(["--format=pax", "-cf"])
        .arg(&g)
        .arg("-C")
        .arg(&tree)
        .arg("deep")
        .status()
        .expect("GNU tar runs");
    assert!(st.success());

    let paths = vec![a, g];
    let want = expected(&paths);
    assert_eq!(want.len(), 25);
    for chunk in ["64KiB", "1MiB"] {
        let loader = Loader::open(config(
            urls(&paths),
            serde_json::json!({"chunk_size": chunk}),
        ))
        .unwrap();
        let (got, _) = epoch(&loader);
        assert!(got == want, "chunk {chunk}");
        let s = loader.stats();
        assert_eq!(s.members, n + 5);
        assert_eq!(s.members_skipped, 1, "README has no extension");
        // 20 directories, plus GNU tar's directories and the symlink.
        assert!(s.entries_skipped >= 22, "{}", s.entries_skipped);
    }
}

#[test]
fn drop_last_and_batch_counts() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 3, 1 << 20, 40_000, 5);
    let total = expected(&paths).len() as u64;
    for drop_last in [false, true] {
        let cfg = config(
            urls(&paths),
            serde_json::json!({"batch_size": 10, "drop_last": drop_last, "workers": 3}),
        );
        let loader = Loader::open(cfg).unwrap();
        let mut sizes = Vec::new();
        while let Next::Batch(b) = loader.next(Some(Duration::from_secs(30))).unwrap() {
            sizes.push(b.len() as u64);
        }
        let s = loader.stats();
        let full = total / 10;
        if drop_last {
            assert!(sizes.iter().all(|&n| n == 10));
            assert_eq!(sizes.len() as u64, full);
            assert_eq!(s.samples_dropped, total % 10);
        } else {
            assert_eq!(sizes.iter().sum::<u64>(), total);
            assert_eq!(
                sizes.iter().filter(|&&n| n != 10).count(),
                usize::from(total % 10 != 0)
            );
        }
    }
}

fn error_after_batches(paths: &[PathBuf], extra: serde_json::Value) -> Error {
    let loader = Loader::open(config(urls(paths), extra)).unwrap();
    loop {
        match loader.next(Some(Duration::from_secs(30))) {
            Ok(Next::Batch(_)) => {}
            Ok(Next::Timeout) => panic!("hung instead of failing"),
            Ok(_) => panic!("finished without an error"),
            Err(e) => {
                // The failure is sticky: later calls report it again.
                let again = loader.next(Some(Duration::from_millis(10))).unwrap_err();
                assert_eq!(again.to_string(), e.to_string());
                return e;
            }
        }
    }
}

#[test]
fn corrupt_truncated_and_foreign_shards_are_named_with_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 2, 1 << 20, 20_000, 9);
    // Corrupt the header of the third member of shard 1.
    let bytes = std::fs::read(&paths[1]).unwrap();
    let mut off = 0usize;
    for _ in 0..2 {
        let size = usize::from_str_radix(
            std::str::from_utf8(&bytes[off + 124..off + 135]).unwrap(),
            8,
        )
        .unwrap();
        off += 512 + size.div_ceil(512) * 512;
    }
    let mut bad = bytes.clone();
    bad[off + 3] ^= 0x20;
    let corrupt = dir.path().join("corrupt.tar");
    std::fs::write(&corrupt, &bad).unwrap();
    let e = error_after_batches(
        &[paths[0].clone(), corrupt.clone()],
        serde_json::json!({"workers": 1}),
    );
    match &e {
        Error::Tar {
            shard,
            source: TarError::BadChecksum { offset, .. },
        } => {
            assert!(shard.ends_with("corrupt.tar"));
            assert_eq!(*offset, off as u64);
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains(&format!("byte {off}")), "{e}");

    let truncated = dir.path().join("truncated.tar");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2 + 100]).unwrap();
    let e = error_after_batches(&[truncated], serde_json::json!({}));
    assert!(
        matches!(
            &e,
            Error::Tar {
                source: TarError::Truncated { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("truncated.tar"), "{e}");

    let foreign = dir.path().join("notes.tar");
    std::fs::write(&foreign, "just some text, not a tar archive\n".repeat(100)).unwrap();
    let e = error_after_batches(&[foreign], serde_json::json!({}));
    assert!(
        matches!(
            &e,
            Error::Tar {
                source: TarError::NotTar,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("notes.tar"), "{e}");
}

#[test]
fn a_member_larger_than_the_budget_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(20 << 20);
    b.append_data(&mut h, "big.bin", std::io::repeat(7).take_bytes(20 << 20))
        .unwrap();
    let p = dir.path().join("big.tar");
    std::fs::write(&p, b.into_inner().unwrap()).unwrap();
    let e = error_after_batches(&[p], serde_json::json!({}));
    assert!(
        matches!(
            &e,
            Error::Tar {
                source: TarError::TooLarge { offset: 0, .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("big.bin"), "{e}");
}

trait TakeBytes: std::io::Read + Sized {
    fn take_bytes(self, n: u64) -> std::io::Take<Self> {
        std::io::Read::take(self, n)
    }
}
impl<R: std::io::Read> TakeBytes for R {}

#[test]
fn a_batch_that_cannot_fit_the_budget_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 1, 4 << 20, 60_000, 2);
    // 8 chunks of 64 KiB; a batch of 500 samples of ~60 KB cannot be built.
    let cfg = config(
        urls(&paths),
        serde_json::json!({"memory_budget": "512KiB", "chunk_size": "64KiB", "batch_size": 500, "workers": 1}),
    );
    let loader = Loader::open(cfg).unwrap();
    match loader.next(Some(Duration::from_secs(30))) {
        Err(Error::BudgetTooSmall { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("expected BudgetTooSmall"),
    }
}

#[test]
fn a_consumer_holding_batches_makes_fetching_wait_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    // 24 MiB of data through a 2 MiB arena.
    let paths = make_shards(dir.path(), 3, 8 << 20, 50_000, 4);
    let want = expected(&paths).len();
    let cfg = config(
        urls(&paths),
        serde_json::json!({"memory_budget": "2MiB", "chunk_size": "128KiB", "batch_size": 4, "workers": 2}),
    );
    let loader = Loader::open(cfg).unwrap();
    let mut held = Vec::new();
    loop {
        match loader.next(Some(Duration::from_millis(300))).unwrap() {
            Next::Batch(b) => held.push(b),
            Next::Timeout => break,
            _ => panic!("the whole dataset cannot fit in the budget"),
        }
        assert!(held.len() < want, "batches kept coming past the budget");
    }
    let s = loader.stats();
    assert_eq!(
        s.chunks_in_use, s.chunk_count,
        "the pool is exhausted, not grown"
    );
    let mut n: usize = held.iter().map(|b| b.len()).sum();
    held.clear();
    loop {
        match loader.next(Some(Duration::from_secs(30))).unwrap() {
            Next::Batch(b) => n += b.len(),
            Next::EndOfEpoch(_) => {}
            Next::Finished => break,
            Next::Timeout => panic!("did not resume after release"),
        }
    }
    assert_eq!(n, want);
}

#[test]
fn several_consumer_threads_share_one_loader_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 6, 1 << 20, 10_000, 8);
    let want = expected(&paths);
    let loader =
        Arc::new(Loader::open(config(urls(&paths), serde_json::json!({"workers": 2}))).unwrap());
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let l = Arc::clone(&loader);
            std::thread::spawn(move || {
                let mut keys = Vec::new();
                loop {
                    match l.next(Some(Duration::from_secs(30))).unwrap() {
                        Next::Batch(b) => keys.extend(
                            b.samples()
                                .map(|s| String::from_utf8(s.key().to_vec()).unwrap()),
                        ),
                        Next::EndOfEpoch(_) => {}
                        Next::Finished => return keys,
                        Next::Timeout => panic!("timeout"),
                    }
                }
            })
        })
        .collect();
    let mut all: Vec<String> = consumers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    all.sort();
    let want: Vec<String> = want.keys().cloned().collect();
    assert_eq!(all, want);
}

#[test]
fn close_wakes_a_waiting_consumer_and_held_batches_stay_valid() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 2, 4 << 20, 50_000, 6);
    let cfg = config(
        urls(&paths),
        serde_json::json!({"memory_budget": "2MiB", "chunk_size": "128KiB", "batch_size": 4, "workers": 1}),
    );
    let loader = Arc::new(Loader::open(cfg).unwrap());
    let mut held = Vec::new();
    while let Next::Batch(b) = loader.next(Some(Duration::from_millis(300))).unwrap() {
        held.push(b);
    }
    let l = Arc::clone(&loader);
    let waiter = std::thread::spawn(move || l.next(None).map(|_| ()));
    std::thread::sleep(Duration::from_millis(50));
    loader.close();
    assert!(matches!(waiter.join().unwrap(), Err(Error::Closed)));
    assert!(matches!(
        loader.next(Some(Duration::ZERO)),
        Err(Error::Closed)
    ));
    for b in &held {
        for s in b.samples() {
            for (name, data) in s.fields() {
                assert!(synth::verify(6, s.key(), name, data));
            }
        }
    }
}

#[test]
fn bad_configurations_and_urls_fail_at_open_with_the_reason() {
    let cases = [
        (
            r#"{"urls": "/nonexistent/x-{0..2}.tar"}"#,
            "/nonexistent/x-0.tar",
        ),
        (r#"{"urls": "s3:///a.tar"}"#, "no bucket"),
        (r#"{"urls": "x{0..2"}"#, "unmatched"),
        (r#"{"urls": "a.tar", "wokers": 2}"#, "unknown key `wokers`"),
        (
            r#"{"urls": "a.tar", "memory_kind": "hugetlb", "memory_budget": 1}"#,
            "`memory_budget`",
        ),
    ];
    for (json, want) in cases {
        let e = Loader::open_json(json).err().expect(json).to_string();
        assert!(e.contains(want), "{json}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 1, 1 << 20, 10_000, 1);
    let e = Loader::open(config(
        urls(&paths),
        serde_json::json!({"workers": 40, "memory_budget": "4MiB"}),
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("40 workers"), "{e}");
}

#[test]
fn memory_kinds_and_backends_can_be_forced_and_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 1, 1 << 20, 10_000, 1);
    for (kind, backend) in [("thp", "threads"), ("normal", "io_uring"), ("auto", "auto")] {
        let loader = Loader::open(config(
            urls(&paths),
            serde_json::json!({"memory_kind": kind, "io_backend": backend, "lock_memory": "off", "register_buffers": "off"}),
        ))
        .unwrap();
        let s = loader.stats();
        if kind != "auto" {
            assert_eq!(s.memory_kind, kind);
        }
        assert_eq!(
            s.io_backend,
            if backend == "threads" {
                "threads"
            } else {
                "io_uring"
            }
        );
        assert!(!s.memory_locked);
        assert!(!s.buffers_registered);
        let (got, _) = epoch(&loader);
        assert_eq!(got.len(), expected(&paths).len());
    }
}

#[test]
fn a_field_repeated_within_a_sample_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    for name in ["k1.jpg", "k1.cls", "k1.jpg"] {
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        b.append_data(&mut h, name, b"data".as_slice()).unwrap();
    }
    let p = dir.path().join("dup.tar");
    std::fs::write(&p, b.into_inner().unwrap()).unwrap();
    let e = error_after_batches(&[p], serde_json::json!({}));
    match &e {
        Error::DuplicateField {
            key,
            field,
            offset,
            shard,
        } => {
            assert_eq!((key.as_str(), field.as_str()), ("k1", "jpg"));
            assert_eq!(*offset, 2048 + 512);
            assert!(shard.ends_with("dup.tar"));
        }
        other => panic!("{other}"),
    }
}

fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// Members are named as WebDataset names them (docs/webdataset-compat.md):
/// fields lower-cased, a basename with a leading dot keyed by its
/// directory, `__…__` names passed over; so `k.JPG` after `k.jpg`, or a
/// field `__KEY__`, is a duplicate there and here.
#[test]
fn members_are_named_as_webdataset_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![9u8; 100_000];
    let p = dir.path().join("names.tar");
    std::fs::write(
        &p,
        tar_of(&[
            ("k0.JPG", b"a"),
            ("k0.Seg.PNG", &big),
            ("__meta__", b"m"),
            ("k1.jpg", b"b"),
            ("d/.hidden.TXT", b"c"),
            ("d/.Other", b"d"),
            (".top.txt", b"e"),
            ("k2.ÄBC", b"f"),
        ]),
    )
    .unwrap();
    let field = |n: &str, d: &[u8]| (n.to_string(), d.to_vec());
    let want = Samples::from([
        (
            "k0".into(),
            vec![field("jpg", b"a"), field("seg.png", &big)],
        ),
        ("k1".into(), vec![field("jpg", b"b")]),
        (
            "d/".into(),
            vec![field("hidden.txt", b"c"), field("other", b"d")],
        ),
        ("k2".into(), vec![field("äbc", b"f")]),
    ]);
    // 64 KiB chunks split the large member: its field name is lower-cased
    // when its pieces come together.
    for chunk in ["64KiB", "1MiB"] {
        let loader = Loader::open(config(
            urls(std::slice::from_ref(&p)),
            serde_json::json!({"chunk_size": chunk}),
        ))
        .unwrap();
        let (got, _) = epoch(&loader);
        assert_eq!(got, want, "chunk {chunk}");
        assert_eq!(loader.stats().members_skipped, 2, "__meta__ and .top.txt");
    }

    for (members, dup) in [
        (&[("k.jpg", &b"x"[..]), ("k.JPG", b"y")][..], "jpg"),
        (&[("k.cls", &b"x"[..]), ("k.__KEY__", b"y")][..], "__key__"),
        (&[("k.__url__", &b"y"[..])][..], "__url__"),
    ] {
        let p = dir.path().join(format!("dup-{dup}.tar"));
        std::fs::write(&p, tar_of(members)).unwrap();
        match error_after_batches(&[p], serde_json::json!({})) {
            Error::DuplicateField { key, field, .. } => {
                assert_eq!((key.as_str(), field.as_str()), ("k", dup))
            }
            other => panic!("{other}"),
        }
    }
}

/// A `.tar.gz` shard is refused by name, saying how to make it readable.
#[test]
fn compressed_shards_are_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("shard-000.tar");
    std::fs::write(&p, tar_of(&[("k.jpg", b"x")])).unwrap();
    let st = std::process::Command::new("gzip")
        .arg(&p)
        .status()
        .expect("gzip runs");
    assert!(st.success());
    let gz = dir.path().join("shard-000.tar.gz");
    let e = error_after_batches(std::slice::from_ref(&gz), serde_json::json!({}));
    assert!(
        matches!(
            &e,
            Error::Tar {
                source: TarError::Compressed { format: "gzip", .. },
                ..
            }
        ),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("shard-000.tar.gz") && text.contains("gunzip"),
        "{text}"
    );
}

/// The layout the C header promises: keys one after the other in sample
/// order, one name pointer per field name, and each sample's source the
/// shard it came from — through plain batches, shuffle buffers and the
/// merged tails of several workers.
#[test]
fn batches_keep_keys_in_a_row_share_name_pointers_and_name_each_samples_shard() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_shards(dir.path(), 4, 1 << 20, 20_000, 5);
    let mut shard_of = BTreeMap::new();
    for p in &paths {
        for key in expected(std::slice::from_ref(p)).into_keys() {
            shard_of.insert(key, p.display().to_string());
        }
    }
    for extra in [
        serde_json::json!({"workers": 3}),
        serde_json::json!({"workers": 2, "shuffle_buffer": 40, "seed": 9}),
    ] {
        let loader = Loader::open(config(urls(&paths), extra.clone())).unwrap();
        let mut seen = 0;
        while let Next::Batch(b) = loader.next(Some(Duration::from_secs(30))).unwrap() {
            let samples = b.raw_samples();
            for (i, pair) in samples.windows(2).enumerate() {
                // SAFETY: keys are NUL-terminated strings the batch holds.
                let len = unsafe { std::ffi::CStr::from_ptr(pair[0].key) }.count_bytes();
                assert_eq!(
                    pair[1].key.addr(),
                    pair[0].key.addr() + len + 1,
                    "{extra}: key {} does not follow key {i}",
                    i + 1
                );
            }
            let mut by_name: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
            for f in b.raw_fields() {
                // SAFETY: as above, for field names.
                let name = unsafe { std::ffi::CStr::from_ptr(f.name) }
                    .to_bytes()
                    .to_vec();
                let ptr = *by_name.entry(name.clone()).or_insert(f.name.addr());
                assert_eq!(ptr, f.name.addr(), "{extra}: two pointers for one name");
            }
            assert_eq!(
                by_name
                    .values()
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                by_name.len(),
                "{extra}: one pointer for two names"
            );
            for (i, s) in b.samples().enumerate() {
                let key = String::from_utf8(s.key().to_vec()).unwrap();
                assert_eq!(b.source(i), Some(shard_of[&key].as_str()), "{extra}: {key}");
                seen += 1;
            }
            assert_eq!(b.source(b.len()), None);
        }
        assert_eq!(seen, shard_of.len(), "{extra}");
    }
}

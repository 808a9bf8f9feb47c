//! One version per read, against real servers on 127.0.0.1 that replace an
//! object between the requests of one read (same size, other bytes: the
//! case a size check alone misses): a shard over HTTP and S3, a whole
//! object read in parallel parts, a cache fill. The loader and
//! `read_object` end in `Error::Changed` naming the object and both
//! versions, never with another version's bytes; the cache stores no entry
//! of the mixed read. Whether the server honours `If-Match` (412) or
//! ignores it (the answers' ETags are compared), the outcome is the same.
//! A server with no strong ETag still loads, uncached.
//!
//! The controls, the same scenarios with the checks off, are in
//! `versions_unpinned.rs` (a process of their own: the switch is global).

#[path = "versions/common.rs"]
mod common;
use ringfeed_test_support as support;

use std::sync::atomic::Ordering;

use common::{SEED, SHARD, other_version, parts_of, run, shards};
use ringfeed::Error;
use ringfeed::object;
use support::s3::S3Server;
use support::{Replace, Server, pattern};

fn replace(server: &Server, path: &str, after: usize, with: Vec<u8>) {
    *server.faults.replace.lock().unwrap() = Some(Replace {
        path: path.into(),
        after,
        with,
        seen: 0,
    });
}

/// `e` is `Error::Changed` for `name`, from one ETag to another (or a 412).
fn assert_changed(e: &Error, name: &str) {
    match e {
        Error::Changed {
            url,
            expected,
            seen,
        } => {
            assert!(url.contains(name), "{e}");
            assert!(expected.starts_with("ETag \""), "{e}");
            assert!(seen.starts_with("ETag \"") || seen.contains("412"), "{e}");
            assert_ne!(expected, seen, "{e}");
        }
        Error::Part { source, .. } => assert_changed(source, name),
        e => panic!("not a version change: {e}"),
    }
}

#[test]
fn a_shard_rewritten_between_its_ranges_over_http_ends_the_read_unspliced() {
    for backend in ["io_uring", "threads"] {
        for ignore_if_match in [false, true] {
            let data = tempfile::tempdir().unwrap();
            let v1 = shards(data.path());
            let server = Server::start(data.path().to_path_buf());
            server
                .faults
                .ignore_if_match
                .store(ignore_if_match, Ordering::SeqCst);
            replace(&server, &format!("/{SHARD}"), 1, other_version(&v1));
            let urls = vec![server.url("shard-{000000..000001}.tar")];
            let r = run(common::config(
                &urls,
                serde_json::json!({"io_backend": backend}),
            ));
            let case = format!("{backend}, If-Match ignored: {ignore_if_match}");
            let e = r
                .error
                .as_ref()
                .unwrap_or_else(|| panic!("{case}: no error"));
            assert_changed(e, SHARD);
            assert_eq!((r.first_bad, r.others_bad), (0, 0), "{case}: spliced");
            let refused = server.faults.precondition_failed.load(Ordering::SeqCst);
            if ignore_if_match {
                // The new version's bytes were sent, and not taken.
                assert_eq!(refused, 0, "{case}");
            } else {
                // One 412, never retried: another attempt would splice.
                assert_eq!(refused, 1, "{case}: If-Match not sent, or retried");
            }
            let retries: u64 = r.stats.as_ref().unwrap().retries.values().sum();
            assert_eq!(retries, 0, "{case}");
        }
    }
}

#[test]
fn a_shard_rewritten_between_its_ranges_on_s3_ends_the_read_unspliced() {
    for ignore_if_match in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let bucket = root.path().join("data");
        let v1 = shards(&bucket);
        let s3 = S3Server::start(root.path());
        s3.ignore_if_match(ignore_if_match);
        s3.replace_after("data", SHARD, 1, other_version(&v1));
        let urls = vec!["s3://data/shard-{000000..000001}.tar".to_string()];
        let r = run(common::s3_config(&s3, &urls, serde_json::json!({})));
        let e = r.error.as_ref().expect("no error");
        assert_changed(e, SHARD);
        assert_eq!((r.first_bad, r.others_bad), (0, 0), "spliced");
        assert_eq!(s3.precondition_failed(), u64::from(!ignore_if_match));
        let retries: u64 = r.stats.as_ref().unwrap().retries.values().sum();
        assert_eq!(retries, 0);
    }
}

#[test]
fn an_object_rewritten_between_its_parts_is_never_returned_mixed() {
    const LEN: usize = 1 << 20;
    let (v1, v2) = (pattern(1, LEN), pattern(2, LEN));
    for backend in ["io_uring", "threads"] {
        // Over HTTP.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("w.bin"), &v1).unwrap();
        let server = Server::start(dir.path().to_path_buf());
        replace(&server, "/w.bin", 2, v2.clone());
        let c = common::object_config(&format!(r#", "io_backend": "{backend}""#));
        let e = object::read(&server.url("w.bin"), &c, None).unwrap_err();
        assert_changed(&e, "w.bin");
        let mut buf = vec![0u8; LEN];
        let e = object::read_into(&server.url("w.bin"), &c, &mut buf, None);
        // The object is whole again (version 2): read whole.
        assert_eq!(e.unwrap().0, LEN as u64, "{backend}");
        assert!(buf == v2, "{backend}");

        // On S3, an object written by a multipart upload.
        const BIG: usize = 11 << 20;
        let (v1, v2) = (pattern(3, BIG), pattern(4, BIG));
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("ckpt")).unwrap();
        let s3 = S3Server::start(root.path());
        let (c, write) = common::s3_object_config(&s3, &format!(r#", "io_backend": "{backend}""#));
        object::write("s3://ckpt/w.bin", &v1, &write, None).unwrap();
        for ignore in [false, true] {
            s3.ignore_if_match(ignore);
            s3.replace_after("ckpt", "w.bin", 2, v2.clone());
            let e = object::read("s3://ckpt/w.bin", &c, None).unwrap_err();
            assert_changed(&e, "w.bin");
            s3.replace_after("ckpt", "w.bin", 2, v1.clone());
            let e = object::read("s3://ckpt/w.bin", &c, None).unwrap_err();
            assert_changed(&e, "w.bin");
        }
        s3.ignore_if_match(false);
        let got = object::read("s3://ckpt/w.bin", &c, None).unwrap();
        assert_eq!(parts_of(got.as_slice(), &v1, &v2), (BIG / 65536, 0));
    }
}

/// The fill of a shard that changes under it is not stored: when the
/// version its `HEAD` gave comes back (a rollback, a re-upload), the next
/// run reads it from the network, every sample with the generator's bytes,
/// and not a mixed entry from the disk.
#[test]
fn a_cache_fill_of_a_changing_shard_stores_nothing_and_the_old_version_is_read_whole() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (v1, counts) = common::generated(data.path());
    let server = Server::start(data.path().to_path_buf());
    let urls = vec![server.url("shard-{000000..000001}.tar")];
    let cfg = || common::cache_config(&urls, cache.path());
    replace(&server, &format!("/{SHARD}"), 1, other_version(&v1));
    let r = run(cfg());
    assert_changed(r.error.as_ref().expect("no error"), SHARD);
    assert_eq!(r.first_bad, 0, "spliced");
    // The first version is back, under its first ETag.
    *server.faults.replace.lock().unwrap() = None;
    std::fs::write(data.path().join(SHARD), &v1).unwrap();
    let again = run(cfg());
    assert!(again.error.is_none(), "{:?}", again.error);
    assert_eq!(again.first_good as u64, counts[0]);
    assert_eq!(
        (again.first_bad, again.others_bad),
        (0, 0),
        "a mixed entry was served"
    );
    let third = run(cfg());
    let stats = third.stats.unwrap();
    assert_eq!((third.first_bad, third.others_bad), (0, 0));
    assert_eq!(stats.cache_hits, 2, "{:?}", stats.notes);
}

#[test]
fn a_server_without_a_strong_etag_loads_every_sample_uncached() {
    for weak in [false, true] {
        let data = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let (_, counts) = common::generated(data.path());
        let server = Server::start(data.path().to_path_buf());
        if weak {
            server.faults.weak_version.store(true, Ordering::SeqCst);
        } else {
            server.faults.no_version.store(true, Ordering::SeqCst);
        }
        let urls = vec![server.url("shard-{000000..000001}.tar")];
        let cfg = common::cache_config(&urls, cache.path());
        let loader = ringfeed::Loader::open(cfg).unwrap();
        let n = support::stream(&loader, SEED);
        loader.close();
        let s = loader.stats();
        assert_eq!(n as u64, s.samples_delivered);
        assert_eq!(n as u64, counts.iter().sum::<u64>());
        assert_eq!(s.cache_uncached, 2, "weak: {weak}");
        let why = if weak { "weak ETag" } else { "has no ETag" };
        assert!(s.notes.iter().any(|n| n.contains(why)), "{:?}", s.notes);
        let stored = std::fs::read_dir(cache.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "rfc")
            })
            .count();
        assert_eq!(stored, 0, "weak: {weak}");
    }
}

//! The controls of `versions.rs`: the same servers replacing an object
//! between the requests of one read, with the version checks off
//! (`set_version_checks(false)`: no `If-Match`, answers not compared). Each
//! shows the hazard the checks prevent, at the layer below them: the
//! server really serves two versions to one read, and the loader,
//! `read_object` and the cache then hand out and store bytes spliced from
//! both. A process of its own, since the switch is global: every test here
//! turns it off, none turns it on.

#[path = "versions/common.rs"]
mod common;
use ringfeed_test_support as support;

use common::{SHARD, other_version, parts_of, run};
use ringfeed::object;
use support::s3::S3Server;
use support::{Replace, Server, pattern};

fn unpinned() {
    ringfeed::net::version::set_version_checks(false);
}

fn replace(server: &Server, path: &str, after: usize, with: Vec<u8>) {
    *server.faults.replace.lock().unwrap() = Some(Replace {
        path: path.into(),
        after,
        with,
        seen: 0,
    });
}

/// The distinct ETags the server answered GETs with.
fn versions(tags: &[String]) -> std::collections::BTreeSet<String> {
    tags.iter().cloned().collect()
}

#[test]
fn unpinned_a_shard_rewritten_between_its_ranges_is_delivered_spliced() {
    unpinned();
    // Over HTTP.
    let data = tempfile::tempdir().unwrap();
    let (v1, counts) = common::generated(data.path());
    let server = Server::start(data.path().to_path_buf());
    replace(&server, &format!("/{SHARD}"), 1, other_version(&v1));
    let r = run(common::config(
        &[server.url("shard-{000000..000001}.tar")],
        serde_json::json!({}),
    ));
    assert!(r.error.is_none(), "{:?}", r.error);
    // One read of one shard: samples of both versions, every one of it.
    assert!(r.first_good > 0 && r.first_bad > 0, "{r:?}");
    assert_eq!((r.first_good + r.first_bad) as u64, counts[0], "{r:?}");
    assert_eq!(r.others_bad, 0);
    let served = server.faults.served.lock().unwrap().clone();
    assert!(versions(&served).len() >= 3, "{served:?}");

    // On S3.
    let root = tempfile::tempdir().unwrap();
    let (v1, counts) = common::generated(&root.path().join("data"));
    let s3 = S3Server::start(root.path());
    s3.replace_after("data", SHARD, 1, other_version(&v1));
    let urls = vec!["s3://data/shard-{000000..000001}.tar".to_string()];
    let r = run(common::s3_config(&s3, &urls, serde_json::json!({})));
    assert!(r.error.is_none(), "{:?}", r.error);
    assert!(r.first_good > 0 && r.first_bad > 0, "{r:?}");
    assert_eq!((r.first_good + r.first_bad) as u64, counts[0], "{r:?}");
    assert_eq!(s3.precondition_failed(), 0);
}

#[test]
fn unpinned_an_object_rewritten_between_its_parts_is_returned_mixed() {
    unpinned();
    const LEN: usize = 1 << 20;
    let (v1, v2) = (pattern(1, LEN), pattern(2, LEN));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.bin"), &v1).unwrap();
    let server = Server::start(dir.path().to_path_buf());
    replace(&server, "/w.bin", 2, v2.clone());
    let got = object::read(&server.url("w.bin"), &common::object_config(""), None).unwrap();
    let (a, b) = parts_of(got.as_slice(), &v1, &v2);
    assert!(a > 0 && b > 0 && a + b == LEN / 65536, "{a} + {b} parts");

    const BIG: usize = 11 << 20;
    let (v1, v2) = (pattern(3, BIG), pattern(4, BIG));
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ckpt")).unwrap();
    let s3 = S3Server::start(root.path());
    let (c, write) = common::s3_object_config(&s3, "");
    object::write("s3://ckpt/w.bin", &v1, &write, None).unwrap();
    s3.replace_after("ckpt", "w.bin", 2, v2.clone());
    let got = object::read("s3://ckpt/w.bin", &c, None).unwrap();
    let (a, b) = parts_of(got.as_slice(), &v1, &v2);
    assert!(a > 0 && b > 0 && a + b == BIG / 65536, "{a} + {b} parts");
}

/// The scenario of the cache test in `versions.rs`: unpinned, the mixed
/// read is stored under the first `HEAD`'s ETag, and once that version is
/// back the next run serves the mix from the disk.
#[test]
fn unpinned_a_cache_fill_of_a_changing_shard_stores_the_mix_and_serves_it_again() {
    unpinned();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (v1, counts) = common::generated(data.path());
    let server = Server::start(data.path().to_path_buf());
    let urls = vec![server.url("shard-{000000..000001}.tar")];
    replace(&server, &format!("/{SHARD}"), 1, other_version(&v1));
    let r = run(common::cache_config(&urls, cache.path()));
    assert!(r.error.is_none(), "{:?}", r.error);
    assert!(r.first_good > 0 && r.first_bad > 0, "{r:?}");
    assert_eq!((r.first_good + r.first_bad) as u64, counts[0], "{r:?}");
    *server.faults.replace.lock().unwrap() = None;
    std::fs::write(data.path().join(SHARD), &v1).unwrap();
    let again = run(common::cache_config(&urls, cache.path()));
    let stats = again.stats.as_ref().unwrap();
    assert_eq!(stats.cache_hits, 2, "{:?}", stats.notes);
    assert!(
        again.first_bad > 0,
        "the mixed entry was not served: {again:?}"
    );
}

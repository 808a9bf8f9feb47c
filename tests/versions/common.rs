//! What the version tests share: shards and objects in two versions of one
//! size, a loader that reports which of its samples had the generator's
//! bytes, and the configurations.

use std::path::Path;
use std::time::Duration;

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader, Next};

use crate::support::s3::{ACCESS_KEY, S3Server, SECRET_KEY};

pub const SEED: u64 = 61;
pub const SHARD: &str = "shard-000000.tar";

/// Two shards of about 2 MiB (read in 256 KiB ranges) in `dir`; the
/// bytes of the first.
#[allow(dead_code)] // versions_unpinned.rs takes `generated`'s counts too
pub fn shards(dir: &Path) -> Vec<u8> {
    generated(dir).0
}

/// `shards`, and the samples the generator wrote in each shard.
pub fn generated(dir: &Path) -> (Vec<u8>, Vec<u64>) {
    let o = GenOptions {
        shards: 2,
        shard_bytes: 2 << 20,
        sample_bytes: 40_000,
        spread: 0.5,
        fields: vec!["jpg".into(), "cls".into()],
        seed: SEED,
    };
    let made = synth::generate(dir, &o, |_| {}).unwrap();
    (std::fs::read(dir.join(SHARD)).unwrap(), made.shard_samples)
}

/// Another version of a shard, of the same size and layout: every member's
/// bytes inverted, its headers kept. A sample of it fails
/// `synth::verify`; a read that mixes the two versions walks cleanly and
/// gives samples of both.
pub fn other_version(tar: &[u8]) -> Vec<u8> {
    let mut v = tar.to_vec();
    let mut at = 0;
    while at + 512 <= v.len() && v[at..at + 512].iter().any(|&b| b != 0) {
        let field = std::str::from_utf8(&v[at + 124..at + 135]).unwrap();
        let size = usize::from_str_radix(field.trim_matches(['\0', ' ']), 8).unwrap();
        for b in &mut v[at + 512..at + 512 + size] {
            *b = !*b;
        }
        at += 512 + size.next_multiple_of(512);
    }
    assert_eq!(v.len(), tar.len());
    v
}

/// What one epoch of a loader gave: samples of the first shard with the
/// generator's bytes and without, samples of the others, and the error it
/// ended in, if any.
#[derive(Debug, Default)]
pub struct Run {
    pub first_good: usize,
    pub first_bad: usize,
    pub others_bad: usize,
    pub error: Option<Error>,
    pub stats: Option<ringfeed::Stats>,
}

pub fn run(cfg: Config) -> Run {
    let loader = Loader::open(cfg).unwrap();
    let mut r = Run::default();
    loop {
        match loader.next(Some(Duration::from_secs(60))) {
            Ok(Next::Batch(b)) => {
                for s in b.samples() {
                    let good = s
                        .fields()
                        .all(|(name, data)| synth::verify(SEED, s.key(), name, data));
                    match (s.key().starts_with(b"000000-"), good) {
                        (true, true) => r.first_good += 1,
                        (true, false) => r.first_bad += 1,
                        (false, true) => {}
                        (false, false) => r.others_bad += 1,
                    }
                }
            }
            Ok(Next::EndOfEpoch(_)) => {}
            Ok(Next::Finished) => break,
            Ok(Next::Timeout) => panic!("stalled"),
            Err(e) => {
                r.error = Some(e);
                break;
            }
        }
    }
    loader.close();
    r.stats = Some(loader.stats());
    r
}

/// A loader's configuration: one worker with one read in flight, so each
/// shard's ranges (256 KiB) go one after another and a rewrite after the
/// first falls between two of them.
pub fn config(urls: &[String], extra: serde_json::Value) -> Config {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("memory_budget".into(), serde_json::json!("16MiB"));
    m.insert("chunk_size".into(), serde_json::json!("256KiB"));
    m.insert("batch_size".into(), serde_json::json!(5));
    m.insert("workers".into(), serde_json::json!(1));
    m.insert("reads_in_flight".into(), serde_json::json!(1));
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Config::from_map(&m).unwrap()
}

/// `config` with a cache in `dir` that stores every shard read whole, in
/// 1 MiB ranges (whole checksum blocks).
pub fn cache_config(urls: &[String], dir: &Path) -> Config {
    config(
        urls,
        serde_json::json!({
            "cache_dir": dir,
            "cache_min_free": 0,
            "cache_fill": "always",
            "chunk_size": "1MiB",
        }),
    )
}

/// `config` against the S3 test server, signed.
pub fn s3_config(s3: &S3Server, urls: &[String], extra: serde_json::Value) -> Config {
    let mut m = serde_json::json!({
        "s3_endpoint": s3.endpoint(),
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "s3_region": "us-east-1",
    });
    if let (serde_json::Value::Object(a), serde_json::Value::Object(b)) = (&mut m, extra) {
        a.extend(b);
    }
    config(urls, m)
}

/// Whole objects read in 64 KiB parts, `parts_in_flight` at once.
pub fn object_config(extra: &str) -> Config {
    Config::for_objects(&format!(
        r#"{{"part_size": 65536, "parts_in_flight": 3, "max_attempts": 3 {extra}}}"#
    ))
    .unwrap()
}

/// Whole objects on the S3 test server: read in 1 MiB parts, 3 at once,
/// and written in S3's smallest parts (5 MiB).
pub fn s3_object_config(s3: &S3Server, extra: &str) -> (Config, Config) {
    let with = |part: usize| {
        Config::for_objects(&format!(
            r#"{{"part_size": {part}, "parts_in_flight": 3, "max_attempts": 3,
                "s3_endpoint": "{}", "aws_access_key_id": "{ACCESS_KEY}",
                "aws_secret_access_key": "{SECRET_KEY}", "s3_region": "us-east-1" {extra}}}"#,
            s3.endpoint()
        ))
        .unwrap()
    };
    (with(1 << 20), with(5 << 20))
}

/// How many of the 64 KiB parts of `got` are `a`'s and how many `b`'s
/// (a part may be neither: then it counts for none).
pub fn parts_of(got: &[u8], a: &[u8], b: &[u8]) -> (usize, usize) {
    let (mut of_a, mut of_b) = (0, 0);
    for (i, part) in got.chunks(65536).enumerate() {
        let at = i * 65536..i * 65536 + part.len();
        if part == &a[at.clone()] {
            of_a += 1;
        } else if part == &b[at] {
            of_b += 1;
        }
    }
    (of_a, of_b)
}

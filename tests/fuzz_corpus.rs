//! The fuzz targets' corpora, replayed in the ordinary test suite: every
//! committed input of `fuzz/corpus/<target>/` goes through the same check
//! its fuzz target runs (`fuzz/src/checks/`), so the seeds and the inputs
//! that once found a bug keep being tested without nightly or libFuzzer.
//! The fuzzing itself is `scripts/fuzz.sh` (docs/fuzzing.md).

#[path = "../fuzz/src/checks/mod.rs"]
mod checks;

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{}: no corpus", dir.display());
    for path in inputs {
        let data = std::fs::read(&path).expect("corpus file");
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "{target}: {} fails its check",
            path.display()
        );
    }
}

#[test]
fn tar_walk_corpus() {
    replay("tar_walk", checks::tar::check);
}

#[test]
fn http_response_corpus() {
    replay("http_response", checks::http::response);
}

#[test]
fn http_request_corpus() {
    replay("http_request", checks::http::request);
}

#[test]
fn image_bytes_corpus() {
    replay("image_bytes", checks::image::check);
}

#[test]
fn config_corpus() {
    replay("config", checks::config::check);
}

#[test]
fn manifest_corpus() {
    replay("manifest", checks::manifest::check);
}

#[test]
fn resume_corpus() {
    replay("resume", checks::resume::check);
}

#[test]
fn hub_answer_corpus() {
    replay("hub_answer", checks::hub::check);
}

#[test]
fn s3_xml_corpus() {
    replay("s3_xml", checks::s3::check);
}

#[test]
fn key_glob_corpus() {
    replay("key_glob", checks::glob::check);
}

#[test]
fn cache_entry_corpus() {
    replay("cache_entry", checks::cache::check);
}

/// Writes the `cache_entry` seeds (whole entries of a few shapes) when
/// `RINGFEED_BLESS` is set; they are committed, like the other corpora.
#[test]
fn cache_entry_seeds_are_entries_of_today() {
    use ringfeed::cache::entry::{BLOCK, Identity, store};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/cache_entry");
    let tmp = tempfile::tempdir().unwrap();
    let shapes: [(u64, Option<u64>); 4] = [
        (0, None),
        (1, Some(1)),
        (4096, Some(2)),
        (BLOCK as u64 + 7, Some(3)),
    ];
    for (i, (len, samples)) in shapes.into_iter().enumerate() {
        let id = Identity {
            endpoint: "http://127.0.0.1:9000".into(),
            object: format!("s3://bucket/shard-{i:06}.tar"),
            version: "etag \"abc\"".into(),
            offset: 0,
            len,
        };
        let data: Vec<u8> = (0..len).map(|b| (b * 7) as u8).collect();
        let bytes = std::fs::read(store(tmp.path(), &id, &data, samples).unwrap()).unwrap();
        let seed = dir.join(format!("entry-{i}"));
        if std::env::var_os("RINGFEED_BLESS").is_some() {
            std::fs::write(&seed, &bytes).unwrap();
        }
        assert!(
            std::fs::read(&seed).is_ok_and(|s| s == bytes),
            "{} is not today's entry format: run with RINGFEED_BLESS=1",
            seed.display()
        );
    }
}

#[test]
fn node_proto_corpus() {
    replay("node_proto", checks::node::check);
}

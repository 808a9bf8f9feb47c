//! Which memory a loader's arena is asked for with `memory_kind` "auto":
//! the best there is (reserved huge pages, else transparent huge pages),
//! except the default arena of a remote dataset, whose pages mostly fault
//! in as the reads land on the rings' threads: never transparent huge
//! pages there (memory compaction would stall the reads), and a note says
//! why. The controls: the same machine gives a local dataset, and the
//! remote one with a budget set, transparent huge pages where it has them,
//! and `memory_kind` "thp" still gives them to the remote default arena.

use ringfeed_test_support as support;

use ringfeed::Loader;
use ringfeed::synth::{self, GenOptions};
use support::{Server, stream, two_workers};

/// What "auto" gives an arena populated ahead of its reads on this
/// machine: "hugetlb" with huge pages reserved, else "thp" unless the
/// kernel's THP are off.
fn best_kind() -> &'static str {
    let reserved = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|v| !v.contains("[never]"))
        .unwrap_or(false);
    match (reserved, thp) {
        (r, _) if r > 0 => "hugetlb",
        (_, true) => "thp",
        _ => "normal",
    }
}

fn open(urls: Vec<String>, extra: serde_json::Value) -> Loader {
    Loader::open(two_workers(urls, extra)).unwrap()
}

#[test]
fn a_remote_default_arena_takes_no_transparent_huge_pages_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let o = GenOptions {
        shards: 2,
        shard_bytes: 1 << 20,
        sample_bytes: 20_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed: 5,
    };
    let r = synth::generate(dir.path(), &o, |_| {}).unwrap();
    let samples = r.samples as usize;
    let server = Server::start(dir.path().to_path_buf());
    let remote = vec![server.url("shard-{000000..000001}.tar")];
    let local: Vec<String> = r
        .paths
        .iter()
        .map(|p| p.to_str().unwrap().to_string())
        .collect();
    let best = best_kind();
    let why = "transparent huge pages are not asked for memory the reads fault in";

    // The case: a remote dataset, the default budget.
    let l = open(remote.clone(), serde_json::json!({}));
    assert_eq!(stream(&l, 5), samples);
    let s = l.stats();
    let want = if best == "hugetlb" {
        "hugetlb"
    } else {
        "normal"
    };
    assert_eq!(s.memory_kind, want, "{:?}", s.notes);
    if want == "normal" {
        assert!(s.notes.iter().any(|n| n.contains(why)), "{:?}", s.notes);
    }

    // Controls: arenas populated ahead of their reads get the best kind.
    for (urls, extra) in [
        (local, serde_json::json!({})),
        (
            remote.clone(),
            serde_json::json!({"memory_budget": "64MiB"}),
        ),
    ] {
        let l = open(urls.clone(), extra.clone());
        assert_eq!(stream(&l, 5), samples);
        let s = l.stats();
        assert_eq!(s.memory_kind, best, "{urls:?} {extra}: {:?}", s.notes);
        assert!(!s.notes.iter().any(|n| n.contains(why)), "{:?}", s.notes);
    }

    // Asked for by name, the remote default arena still gets them.
    if best == "thp" {
        let l = open(remote, serde_json::json!({"memory_kind": "thp"}));
        assert_eq!(stream(&l, 5), samples);
        assert_eq!(l.stats().memory_kind, "thp");
    }
}

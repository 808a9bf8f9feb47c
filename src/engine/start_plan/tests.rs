//! Each decision of the start on fake facts: no ring, file, socket or
//! thread is made.

use std::sync::Arc;

use super::*;
use crate::net::object::HttpObject;
use crate::topology::NumaNode;

fn local(size: u64) -> Shard {
    Shard {
        name: "/d/s.tar".into(),
        source: Source::File("/d/s.tar".into()),
        size: Some(size),
        samples: None,
    }
}

fn remote(size: Option<u64>) -> Shard {
    let url = "http://store/b/s.tar";
    Shard {
        name: url.into(),
        source: Source::Http(Arc::new(HttpObject::new(url, Vec::new()).unwrap())),
        size,
        samples: None,
    }
}

fn cfg(json: &str) -> Config {
    Config::from_json(json).unwrap()
}

/// A machine of 8 CPUs on 2 NUMA nodes, io_uring working, 1 GiB as the
/// remote budget's bound, no node engine.
struct Machine {
    topo: Topology,
    allowed: Vec<usize>,
    ring: Option<std::result::Result<&'static str, String>>,
    engine: Option<(usize, usize, bool)>,
    scripted: bool,
}

impl Machine {
    fn new() -> Machine {
        Machine {
            topo: Topology {
                nodes: vec![
                    NumaNode {
                        id: 0,
                        cpus: (0..4).collect(),
                    },
                    NumaNode {
                        id: 1,
                        cpus: (4..8).collect(),
                    },
                ],
                ..Topology::default()
            },
            allowed: (0..8).collect(),
            ring: Some(Ok("SINGLE_ISSUER")),
            engine: None,
            scripted: false,
        }
    }

    fn decide(&self, cfg: &Config, shards: &[Shard]) -> Result<StartPlan> {
        let facts = Facts {
            topo: &self.topo,
            allowed: &self.allowed,
            ring: self.ring.clone(),
            scripted: self.scripted,
            remote_budget: 1 << 30,
            engine: self
                .engine
                .map(|(streams, net_threads, spool)| EngineFacts {
                    streams,
                    net_threads,
                    spool,
                }),
        };
        StartPlan::decide(cfg, shards, &facts)
    }
}

fn error(r: Result<StartPlan>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn no_shard_is_a_configuration_error() {
    let e = error(Machine::new().decide(&cfg(r#"{"urls":"a"}"#), &[]));
    assert!(e.contains("`urls` names no shard"), "{e}");
}

#[test]
fn cpus_and_a_numa_node_the_machine_lacks_are_named() {
    let m = Machine::new();
    let e = error(m.decide(&cfg(r#"{"urls":"a","cpus":"6-9"}"#), &[local(1)]));
    assert!(e.contains("`cpus` names CPUs 8-9"), "{e}");
    let e = error(m.decide(&cfg(r#"{"urls":"a","numa_node":3}"#), &[local(1)]));
    assert!(e.contains("`numa_node` is 3"), "{e}");
    // Control: what the machine has passes.
    let ok = r#"{"urls":"a","cpus":"6-7","numa_node":1}"#;
    assert!(m.decide(&cfg(ok), &[local(1)]).is_ok());
}

#[test]
fn workers_are_one_per_shard_up_to_auto_s_most_or_the_count_given() {
    let m = Machine::new();
    let c = cfg(r#"{"urls":"a"}"#);
    assert_eq!(m.decide(&c, &[local(1), local(1)]).unwrap().workers, 2);
    let many: Vec<Shard> = (0..64).map(|_| local(1)).collect();
    assert_eq!(
        m.decide(&c, &many).unwrap().workers,
        crate::config::AUTO_WORKERS
    );
    let c = cfg(r#"{"urls":"a","workers":3}"#);
    assert_eq!(m.decide(&c, &[local(1)]).unwrap().workers, 3);
}

#[test]
fn auto_chunks_fit_remote_shards_and_say_so() {
    let m = Machine::new();
    let c = cfg(r#"{"urls":"a"}"#);
    // Remote shards of 1.5 MB: the least whole MiB whose read holds one.
    let p = m.decide(&c, &[remote(Some(1_500_000))]).unwrap();
    assert_eq!(p.chunk, 2 << 20);
    assert!(p.data_len >= 1_500_000, "{}", p.data_len);
    assert!(
        p.notes.iter().any(|n| n.starts_with("chunks of 2 MiB")),
        "{:?}",
        p.notes
    );
    // Local shards and a given size keep theirs, without a note.
    let p = m.decide(&c, &[local(1_500_000)]).unwrap();
    assert_eq!(p.chunk, crate::config::DEFAULT_CHUNK as usize);
    assert!(!p.notes.iter().any(|n| n.starts_with("chunks of")));
    let c = cfg(r#"{"urls":"a","chunk_size":"4MiB"}"#);
    let p = m.decide(&c, &[remote(Some(1_500_000))]).unwrap();
    assert_eq!(p.chunk, 4 << 20);
}

#[test]
fn the_default_budget_counts_reads_of_the_chunks_chosen() {
    // 8 workers of a rank's 4 processes over shards of 1.5 MB: auto takes
    // 2 MiB chunks, and 8 x (4 + 2) reads of 2 MiB and 64 MiB are below the
    // remote floor, 1 GiB / 4: 256 MiB, 128 chunks (reads of 8 MiB would
    // have asked 448 MiB, 224 chunks).
    let m = Machine::new();
    let c = cfg(r#"{"urls":"a","workers":8,"loader_workers":4}"#);
    let shards: Vec<Shard> = (0..8).map(|_| remote(Some(1_500_000))).collect();
    let p = m.decide(&c, &shards).unwrap();
    assert_eq!((p.chunk, p.chunks), (2 << 20, 128));
}

#[test]
fn the_budget_must_hold_two_chunks_a_worker_and_two_more() {
    let m = Machine::new();
    // 2 workers need 6 chunks of 8 MiB: 40 MiB holds 5.
    let c = cfg(r#"{"urls":"a","workers":2,"memory_budget":"40MiB"}"#);
    let e = error(m.decide(&c, &[local(1)]));
    assert!(
        e.contains("holds 5 chunks") && e.contains("2 workers need at least 6"),
        "{e}"
    );
    let c = cfg(r#"{"urls":"a","workers":2,"memory_budget":"48MiB"}"#);
    assert_eq!(m.decide(&c, &[local(1)]).unwrap().chunks, 6);
    // A node engine's loader takes its share of the engine's pool instead.
    let mut joined = Machine::new();
    joined.engine = Some((2, 0, false));
    let c = cfg(r#"{"urls":"a","workers":2,"memory_budget":"40MiB"}"#);
    assert!(joined.decide(&c, &[local(1)]).is_ok());
}

#[test]
fn remote_shards_raise_the_default_budget_to_the_remote_bound() {
    let m = Machine::new();
    let c = cfg(r#"{"urls":"a"}"#);
    let local_chunks = m.decide(&c, &[local(1)]).unwrap().chunks;
    let p = m.decide(&c, &[remote(Some(64 << 20))]).unwrap();
    // 1 GiB of 8 MiB chunks.
    assert_eq!(p.chunks, 128);
    assert!(local_chunks < p.chunks, "{local_chunks}");
    assert!(p.remote && p.faults_in_on_reads);
    // A given budget is the budget, and its arena is faulted in ahead.
    let c = cfg(r#"{"urls":"a","memory_budget":"256MiB"}"#);
    let p = m.decide(&c, &[remote(Some(64 << 20))]).unwrap();
    assert_eq!(p.chunks, 32);
    assert!(!p.faults_in_on_reads);
}

#[test]
fn io_uring_where_the_probe_found_a_ring_else_threads_or_an_error() {
    let mut m = Machine::new();
    let auto = cfg(r#"{"urls":"a"}"#);
    let p = m.decide(&auto, &[local(1)]).unwrap();
    assert_eq!(
        (p.backend, p.uring_flags),
        (BackendKind::IoUring, "SINGLE_ISSUER")
    );
    m.ring = Some(Err("Operation not permitted".into()));
    let p = m.decide(&auto, &[local(1)]).unwrap();
    assert_eq!(p.backend, BackendKind::Threads);
    assert!(
        p.notes
            .contains(&"io_uring unavailable (Operation not permitted): thread backend".into()),
        "{:?}",
        p.notes
    );
    let e = error(m.decide(&cfg(r#"{"urls":"a","io_backend":"io_uring"}"#), &[local(1)]));
    assert!(e.contains("`io_backend` is \"io_uring\""), "{e}");
    // Asked for, or scripted readers: threads, the ring never consulted.
    m.ring = None;
    let threads = cfg(r#"{"urls":"a","io_backend":"threads"}"#);
    assert_eq!(
        m.decide(&threads, &[local(1)]).unwrap().backend,
        BackendKind::Threads
    );
    m.scripted = true;
    assert_eq!(
        m.decide(&auto, &[local(1)]).unwrap().backend,
        BackendKind::Threads
    );
}

#[test]
fn fixed_buffers_serve_file_reads_on_io_uring_only() {
    let m = Machine::new();
    let auto = cfg(r#"{"urls":"a"}"#);
    assert_eq!(
        m.decide(&auto, &[local(1)]).unwrap().fixed,
        Some(Toggle::Auto)
    );
    // Remote shards alone: nothing to register for, unless asked or cached.
    assert_eq!(m.decide(&auto, &[remote(None)]).unwrap().fixed, None);
    let on = cfg(r#"{"urls":"a","register_buffers":"on"}"#);
    assert_eq!(
        m.decide(&on, &[remote(None)]).unwrap().fixed,
        Some(Toggle::On)
    );
    let cached = cfg(r#"{"urls":"a","cache_dir":"/c"}"#);
    assert_eq!(
        m.decide(&cached, &[remote(None)]).unwrap().fixed,
        Some(Toggle::Auto)
    );
    let off = cfg(r#"{"urls":"a","register_buffers":"off"}"#);
    assert_eq!(
        m.decide(&off, &[local(1)]).unwrap().fixed,
        Some(Toggle::Off)
    );
    // The thread backend: none, and "on" is an error that says why.
    let mut threads = Machine::new();
    threads.ring = Some(Err("no".into()));
    assert_eq!(threads.decide(&auto, &[local(1)]).unwrap().fixed, None);
    let e = error(threads.decide(&on, &[local(1)]));
    assert!(e.contains("`register_buffers` is \"on\""), "{e}");
}

#[test]
fn a_node_engine_s_shared_arena_is_not_registered_on_auto() {
    let mut m = Machine::new();
    m.engine = Some((4, 0, false));
    let p = m.decide(&cfg(r#"{"urls":"a"}"#), &[local(1)]).unwrap();
    assert_eq!(p.fixed, None);
    assert!(
        p.notes
            .iter()
            .any(|n| n.starts_with("fixed buffers not registered")),
        "{:?}",
        p.notes
    );
    let on = cfg(r#"{"urls":"a","register_buffers":"on"}"#);
    assert_eq!(m.decide(&on, &[local(1)]).unwrap().fixed, Some(Toggle::On));
}

#[test]
fn a_node_engine_s_io_threads_register_its_budget_not_its_loaders_rings() {
    let mut m = Machine::new();
    m.engine = Some((4, 2, false));
    for c in [r#"{"urls":"a"}"#, r#"{"urls":"a","register_buffers":"on"}"#] {
        let p = m.decide(&cfg(c), &[local(1)]).unwrap();
        assert_eq!(p.fixed, None, "{c}");
        assert!(
            !p.notes.iter().any(|n| n.contains("fixed buffers")),
            "{c}: {:?}",
            p.notes
        );
    }
}

#[test]
fn network_threads_half_the_cpus_at_most_a_worker_each_or_the_engine_s() {
    let m = Machine::new();
    // 8 CPUs: 4 threads for 4 workers; 2 workers have 2.
    let c = cfg(r#"{"urls":"a","workers":4}"#);
    let p = m.decide(&c, &[remote(None)]).unwrap();
    assert_eq!(
        p.net,
        NetPlan::Own {
            count: 4,
            ring_entries: 256
        }
    );
    let c = cfg(r#"{"urls":"a","workers":2}"#);
    assert_eq!(m.decide(&c, &[remote(None)]).unwrap().net.threads(), 2);
    // Given: at most one a worker; each ring sized for its workers' reads.
    let c = cfg(r#"{"urls":"a","workers":4,"net_threads":1,"reads_in_flight":8}"#);
    let p = m.decide(&c, &[remote(None)]).unwrap();
    assert_eq!(
        p.net,
        NetPlan::Own {
            count: 1,
            ring_entries: 128
        }
    );
    // Local shards, or the thread backend: none.
    assert_eq!(m.decide(&c, &[local(1)]).unwrap().net, NetPlan::None);
    let threads = cfg(r#"{"urls":"a","io_backend":"threads"}"#);
    assert_eq!(
        m.decide(&threads, &[remote(None)]).unwrap().net,
        NetPlan::None
    );
    // A node engine's threads take every read, local ones too.
    let mut joined = Machine::new();
    joined.engine = Some((4, 2, false));
    let p = joined.decide(&c, &[local(1)]).unwrap();
    assert_eq!((p.net, p.own_net_links), (NetPlan::Engine, false));
}

#[test]
fn a_node_engine_s_streams_past_the_cpus_unpin_the_workers() {
    let mut m = Machine::new();
    m.engine = Some((12, 0, false));
    let c = cfg(r#"{"urls":"a","workers":2}"#);
    assert_eq!(m.decide(&c, &[local(1)]).unwrap().unpin_for, Some(12));
    // As many streams as CPUs, CPUs given, or no engine: pinned as placed.
    m.engine = Some((8, 0, false));
    assert_eq!(m.decide(&c, &[local(1)]).unwrap().unpin_for, None);
    m.engine = Some((12, 0, false));
    let given = cfg(r#"{"urls":"a","workers":2,"cpus":"0-1"}"#);
    assert_eq!(m.decide(&given, &[local(1)]).unwrap().unpin_for, None);
    assert_eq!(
        Machine::new().decide(&c, &[local(1)]).unwrap().unpin_for,
        None
    );
}

#[test]
fn the_cache_serves_remote_shards_read_in_whole_blocks() {
    let m = Machine::new();
    let c = cfg(r#"{"urls":"a","cache_dir":"/c"}"#);
    assert!(matches!(
        m.decide(&c, &[remote(None)]).unwrap().cache,
        CachePlan::Own(o) if o.dir == std::path::Path::new("/c")
    ));
    assert_eq!(m.decide(&c, &[local(1)]).unwrap().cache, CachePlan::None);
    // A chunk whose read is not whole blocks: not used, and said.
    let odd = cfg(r#"{"urls":"a","cache_dir":"/c","chunk_size":1052672}"#);
    let p = m.decide(&odd, &[remote(None)]).unwrap();
    assert_eq!(p.cache, CachePlan::None);
    assert!(
        p.notes.iter().any(|n| n.starts_with("cache /c not used")),
        "{:?}",
        p.notes
    );
    // A node engine's writer, where it runs one.
    let mut joined = Machine::new();
    joined.engine = Some((2, 0, true));
    assert_eq!(
        joined.decide(&c, &[remote(None)]).unwrap().cache,
        CachePlan::Engine
    );
    assert_eq!(p.cache_direct, Toggle::On);
    let off = cfg(r#"{"urls":"a","cache_dir":"/c","cache_direct":"off"}"#);
    assert_eq!(
        m.decide(&off, &[remote(None)]).unwrap().cache_direct,
        Toggle::Off
    );
}

#[test]
fn queues_and_direct_reads_follow_the_keys_and_the_local_bytes() {
    let m = Machine::new();
    let c = cfg(r#"{"urls":"a","prefetch_batches":1}"#);
    let p = m
        .decide(&c, &[local(100), local(23), remote(Some(1000))])
        .unwrap();
    assert_eq!((p.per_stream, p.local_bytes), (2, 123));
    let c = cfg(r#"{"urls":"a","prefetch_batches":6}"#);
    assert_eq!(m.decide(&c, &[local(1)]).unwrap().per_stream, 6);
}

//! Where loaders pin their workers, end to end: two loaders in one process
//! hold different CPUs (their claims see each other), a closed loader
//! gives its CPU back, the configuration's `cpus`, `numa_node` and
//! `pin_cpus` are obeyed or refused with a named error, the arena is bound
//! to a NUMA node, and claims that cannot be made are a note. One test: it points `XDG_RUNTIME_DIR` at its own
//! claims directory, so nothing else on the machine claims CPUs there.

use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader};

fn open(urls: &[String], extra: serde_json::Value) -> Result<Loader, Error> {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("memory_budget".into(), serde_json::json!("8MiB"));
    m.insert("chunk_size".into(), serde_json::json!("256KiB"));
    m.insert("workers".into(), serde_json::json!(1));
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Loader::open(Config::from_map(&m)?)
}

#[test]
fn loaders_place_their_workers_apart_and_as_configured() {
    let run = tempfile::tempdir().unwrap();
    // SAFETY: the only test of this binary, and no thread of ours runs yet:
    // nothing reads the environment while it changes.
    unsafe { std::env::set_var("XDG_RUNTIME_DIR", run.path()) };
    let data = tempfile::tempdir().unwrap();
    let o = GenOptions {
        shards: 2,
        shard_bytes: 256 << 10,
        sample_bytes: 10_000,
        ..GenOptions::default()
    };
    let urls: Vec<String> = synth::generate(data.path(), &o, |_| {})
        .unwrap()
        .paths
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let topo = ringfeed::topology::discover();
    let allowed = topo.allowed();

    let a = open(&urls, serde_json::json!({})).unwrap();
    let sa = a.stats();
    assert_eq!(sa.worker_cpus.len(), 1, "{:?}", sa.notes);
    assert!(allowed.contains(&sa.worker_cpus[0]));
    assert!(
        ["nic-queues", "numa", "allowed"].contains(&sa.placement.as_str()),
        "{}",
        sa.placement
    );
    if topo.nodes.len() == 1 {
        // One node: the arena is bound to it whatever the NIC says.
        assert_eq!(sa.numa_node, Some(topo.nodes[0].id), "{:?}", sa.notes);
    }
    if allowed.len() >= 2 {
        let b = open(&urls, serde_json::json!({})).unwrap();
        let sb = b.stats();
        assert_eq!(sb.worker_cpus.len(), 1, "{:?}", sb.notes);
        assert_ne!(sa.worker_cpus, sb.worker_cpus, "two loaders on one CPU");
        // Closed, `a` gives its CPU back: the next loader takes it.
        a.close();
        let c = open(&urls, serde_json::json!({})).unwrap();
        assert_eq!(c.stats().worker_cpus, sa.worker_cpus);
        drop((b, c));
    }
    drop(a);

    let last = *allowed.last().unwrap();
    let l = open(&urls, serde_json::json!({"cpus": [last]})).unwrap();
    let s = l.stats();
    assert_eq!(
        (s.worker_cpus.as_slice(), s.placement.as_str()),
        (&[last][..], "config")
    );
    drop(l);
    let l = open(&urls, serde_json::json!({"pin_cpus": false})).unwrap();
    let s = l.stats();
    assert!(s.worker_cpus.is_empty());
    assert_eq!(s.placement, "none (pin_cpus is false)");
    drop(l);
    let l = open(&urls, serde_json::json!({"workers": allowed.len() + 1})).unwrap();
    let s = l.stats();
    assert!(s.worker_cpus.is_empty());
    assert!(s.placement.starts_with("none ("), "{}", s.placement);
    assert!(
        s.notes.iter().any(|n| n.contains("workers not pinned")),
        "{:?}",
        s.notes
    );
    drop(l);

    let e = open(&urls, serde_json::json!({"cpus": "1022-1023"})).err();
    assert!(
        matches!(&e, Some(Error::Config(m)) if m.contains("`cpus` names CPUs 1022-1023")),
        "{e:?}"
    );
    let e = open(&urls, serde_json::json!({"cpus": "x"})).err();
    assert!(
        matches!(&e, Some(Error::Config(m)) if m.contains("`cpus`")),
        "{e:?}"
    );
    if !topo.nodes.is_empty() {
        let e = open(&urls, serde_json::json!({"numa_node": 999})).err();
        assert!(
            matches!(&e, Some(Error::Config(m)) if m.contains("`numa_node` is 999")),
            "{e:?}"
        );
        let node = topo.nodes[0].id;
        let l = open(&urls, serde_json::json!({"numa_node": node})).unwrap();
        assert_eq!(l.stats().numa_node, Some(node), "{:?}", l.stats().notes);
    }
    let e = open(&urls, serde_json::json!({"numa_node": "near"})).err();
    assert!(
        matches!(&e, Some(Error::Config(m)) if m.contains("`numa_node`")),
        "{e:?}"
    );

    // Claims that cannot be made (the directory cannot be created): placed
    // without them, and the notes say so.
    let file = run.path().join("not-a-directory");
    std::fs::write(&file, b"").unwrap();
    // SAFETY: as above; every loader of this test is closed, its threads joined.
    unsafe { std::env::set_var("XDG_RUNTIME_DIR", &file) };
    let l = open(&urls, serde_json::json!({})).unwrap();
    let s = l.stats();
    assert_eq!(s.worker_cpus.len(), 1);
    assert!(
        s.notes
            .iter()
            .any(|n| n.starts_with("CPU claims unavailable")),
        "{:?}",
        s.notes
    );
}

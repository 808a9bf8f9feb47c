//! The node engine with its consumers in this process: an engine served
//! from a thread on a socket in a temporary directory, consumers attached
//! through `Attached` (what the C ABI and Python use). Each consumer gets
//! exactly the batches, in exactly the order, that an engine of its own
//! gives it; a consumer whose keys disagree is refused naming the key; the
//! arena cannot be written through what a consumer receives; batches a
//! consumer never released come back when it leaves. (The engine as its own
//! process — on demand, killed — is tested in `cli/tests/node.rs`.)

use ringfeed_test_support as support;

use std::path::Path;
use std::time::{Duration, Instant};

use ringfeed::consumer::{AnyBatch, AnyNext, Attached};
use serde_json::{Map, Value, json};
use support::node::*;

#[test]
fn each_consumer_gets_exactly_what_its_own_engine_gives() {
    // The engine's own memory and thread keys differ from the consumers':
    // they are placement, and must not change a batch.
    let mut own = job();
    own.remove("memory_budget");
    own.remove("chunk_size");
    own.insert("net_threads".into(), json!(1));
    let (_dir, socket) = engine(own);
    let mut all_keys = Vec::new();
    for (rank, worker) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let alone = drain(&open(consumer(rank, worker), None).unwrap());
        let attached = open(consumer(rank, worker), Some(&socket)).unwrap();
        let via_node = drain(&attached);
        assert!(alone.len() > 4, "too few batches to compare");
        assert_eq!(alone, via_node, "consumer {rank}/{worker}");
        for (seen, _) in &alone {
            for (key, fields) in seen.iter().flat_map(|s| &s.2) {
                for (name, data) in fields {
                    assert!(
                        ringfeed::synth::verify(DATASET_SEED, key, name, data),
                        "consumer {rank}/{worker}: sample {} field {} is not the generator's",
                        String::from_utf8_lossy(key),
                        String::from_utf8_lossy(name)
                    );
                }
                all_keys.push(key.clone());
            }
        }
        let (json, counts) = attached.stats().unwrap();
        let stats: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(stats["node"]["pid"], json!(std::process::id()));
        // Local shards too are read by the engine's one I/O thread (as
        // its configuration asks), not by each consumer's streams.
        if stats["io_backend"] == json!("io_uring") {
            assert_eq!(stats["net_threads"], json!(1), "{json}");
        }
        // No CUDA runtime on the test machines: said, not an error.
        if stats["cuda_registered"] == json!(0) {
            let notes = stats["notes"].to_string();
            assert!(notes.contains("not registered with CUDA"), "{notes}");
        }
        assert_eq!(
            counts.batches_delivered,
            alone.iter().filter(|b| b.0.is_some()).count() as u64
        );
    }
    // The four consumers together saw every sample of the dataset (padding
    // may repeat a few), and nothing else.
    all_keys.sort();
    all_keys.dedup();
    assert_eq!(
        all_keys,
        dataset().keys,
        "the consumers' samples, against the dataset's"
    );
}

#[test]
fn a_resumed_consumer_continues_where_the_state_says() {
    let (_dir, socket) = engine(job());
    let first = open(consumer(1, 0), Some(&socket)).unwrap();
    let whole = drain(&open(consumer(1, 0), None).unwrap());
    let mut taken = 0;
    while taken < 3 {
        if let AnyNext::Batch(_) = first.next(Some(Duration::from_secs(60))).unwrap() {
            taken += 1;
        }
    }
    let state = first.state_hex();
    assert_eq!(state, whole[2].1);
    first.close();
    let mut again = consumer(1, 0);
    again.insert("resume".into(), json!(state));
    let rest = drain(&open(again, Some(&socket)).unwrap());
    let strip = |v: &[(Option<Seen>, String)]| -> Vec<_> {
        v.iter()
            .filter_map(|(s, _)| s.as_ref().map(|s| (s.0, s.2.clone())))
            .collect()
    };
    assert_eq!(strip(&rest), strip(&whole[3..]));
}

#[test]
fn a_consumer_that_disagrees_on_a_shared_key_is_refused_naming_it() {
    let (_dir, socket) = engine(job());
    for (key, value) in [
        ("seed", json!(4)),
        ("batch_size", json!(8)),
        ("workers", json!(3)),
    ] {
        let mut c = job();
        c.insert(key.into(), value);
        let e = open(c, Some(&socket)).err().expect("refused");
        let status = e.status();
        assert_eq!(status, ringfeed::ffi::status::RINGFEED_ERR_NODE, "{e}");
        assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
    }
    // A bad configuration is the configuration's error, named as usual.
    let mut c = job();
    c.insert("batch_size".into(), json!(0));
    let e = open(c, Some(&socket)).err().expect("refused");
    assert!(e.to_string().contains("batch_size"), "{e}");
    // Nobody listening: a named error, not a hang.
    let e = open(job(), Some(Path::new("/nonexistent/ringfeed.sock")))
        .err()
        .expect("no engine");
    assert_eq!(
        e.node_failure(),
        Some(ringfeed::NodeFailure::Unreachable),
        "{e}"
    );
    assert!(e.to_string().contains("ringfeed node"), "{e}");
}

#[test]
fn the_arena_cannot_be_written_through_what_a_consumer_gets() {
    let (_dir, socket) = engine(job());
    let l = open(consumer(0, 0), Some(&socket)).unwrap();
    let AnyNext::Batch(b) = l.next(Some(Duration::from_secs(60))).unwrap() else {
        panic!("no batch");
    };
    let (fd, base, len) = l.arena().unwrap();
    // SAFETY: asks for a new shared writable mapping of the descriptor; the
    // kernel must refuse it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_eq!(p, libc::MAP_FAILED);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    // Nor through the same file reopened for writing (a memory file's
    // permissions would allow it): the engine sealed it.
    let reopened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{fd}"))
        .unwrap();
    // SAFETY: as above.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&reopened),
            0,
        )
    };
    assert_eq!(p, libc::MAP_FAILED);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
    // Nor can the consumer's own mapping be made writable.
    // SAFETY: the mapping's base and length; the call must fail.
    let rc = unsafe {
        libc::mprotect(
            base.cast_mut().cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    assert!(!view(&b).2.is_empty());
}

#[test]
fn batches_a_consumer_holds_stay_its_own_after_it_closes_until_it_releases_them() {
    // A consumer that closes its loader but keeps batches still holds them:
    // their bytes stay while another consumer reads every batch of the job
    // through the same small arena, and they come back when released. (A
    // consumer's process that exits gives its batches back: see
    // `node_engine_takes_back_the_batches_of_a_c_consumer_that_crashed` in
    // tests/c_abi.rs, and the Python tests of DataLoader workers.)
    let mut own = small(job());
    own.insert("memory_budget".into(), json!("8MiB"));
    let (_dir, socket) = engine(own);
    let held_by = |l: &Attached| -> (u64, u64, u64) {
        let (json, _) = l.stats().unwrap();
        let v: Value = serde_json::from_str(&json).unwrap();
        let n = &v["node"];
        (
            n["batches_held"].as_u64().unwrap(),
            n["batches_held_by_this_consumer"].as_u64().unwrap(),
            n["consumers"].as_u64().unwrap(),
        )
    };
    let leaver = open(small(consumer(0, 0)), Some(&socket)).unwrap();
    let mut kept = Vec::new();
    while kept.len() < 3 {
        if let AnyNext::Batch(b) = leaver.next(Some(Duration::from_secs(60))).unwrap() {
            kept.push(b);
        }
    }
    // The control: a later batch in a chunk none of the kept ones share
    // (more than two chunks away from each), released at once. Its memory
    // is in the same arena, which the kept batches keep mapped in this
    // process, so its bytes can still be read after the release: reading
    // the whole job again through the 8 chunks must write over them. Were
    // it not so, the kept batches' unchanged bytes below would prove nothing.
    let kept_at: Vec<usize> = kept
        .iter()
        .map(|b| b.raw_fields()[0].data as usize)
        .collect();
    let apart = |at: usize| kept_at.iter().all(|&k| at.abs_diff(k) > 2 << 20);
    let released = loop {
        if let AnyNext::Batch(b) = leaver.next(Some(Duration::from_secs(60))).unwrap() {
            if apart(b.raw_fields()[0].data as usize) {
                break b;
            }
        }
    };
    let (released_at, released_len) = {
        let f = &released.raw_fields()[0];
        (f.data as usize, f.len)
    };
    let released_bytes = view(&released).2[0].1[0].1.clone();
    drop(released);
    let before: Vec<Seen> = kept.iter().map(view).collect();
    leaver.close();
    drop(leaver);
    let watcher = open(small(consumer(0, 1)), Some(&socket)).unwrap();
    let again = open(small(consumer(0, 0)), Some(&socket)).unwrap();
    drain(&again);
    // The leaver's session ends on its own thread after the close (its
    // loader stops, then the count drops): on a loaded machine that can
    // come after a drain of this small job. Its batches stay held either way.
    let waited = std::time::Instant::now();
    let (all, own, consumers) = loop {
        let seen = held_by(&watcher);
        if seen.2 <= 2 || waited.elapsed() > Duration::from_secs(60) {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(consumers, 2);
    assert!(all >= own + 3, "held {all}, the watcher's {own}");
    // SAFETY: the address is inside the arena's one mapping in this
    // process, which the kept batches hold; reading it races no write of
    // ours (the engine's writes to it are the point of the control).
    let now: Vec<u8> = (0..released_len)
        .map(|i| unsafe { std::ptr::read_volatile((released_at + i) as *const u8) })
        .collect();
    assert!(
        now != released_bytes,
        "control: a released batch's bytes were not written over by a whole job through the \
         arena, so the kept batches' unchanged bytes would show nothing"
    );
    assert_eq!(
        kept.iter().map(view).collect::<Vec<_>>(),
        before,
        "a batch its consumer still holds was read into"
    );
    drop(kept);
    drop(again);
    let start = Instant::now();
    loop {
        let (all, own, _) = held_by(&watcher);
        if all == own {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "held {all}, the watcher's {own}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn batches_stay_valid_after_close_and_other_threads_wake() {
    let (_dir, socket) = engine(job());
    let l = std::sync::Arc::new(open(consumer(0, 1), Some(&socket)).unwrap());
    let AnyNext::Batch(b) = l.next(Some(Duration::from_secs(60))).unwrap() else {
        panic!("no batch");
    };
    let before = view(&b);
    // Drain the rest so a waiting thread blocks in `next`.
    let waiter = {
        let l = l.clone();
        std::thread::spawn(move || {
            loop {
                match l.next(None) {
                    // Woken by the close (or the stream had ended first);
                    // any other error is not a clean wake-up.
                    Ok(AnyNext::Finished) | Err(ringfeed::Error::Closed) => return,
                    Err(e) => panic!("a waiter woken by close got {e}"),
                    Ok(_) => {}
                }
            }
        })
    };
    l.close();
    waiter.join().unwrap();
    assert!(matches!(
        l.next(Some(Duration::ZERO)),
        Err(ringfeed::Error::Closed)
    ));
    assert_eq!(view(&b), before);
    drop(b);
}

#[test]
fn consumers_share_the_engines_one_arena_and_one_without_room_is_refused() {
    // 7 chunks of 1 MiB split among the 2 streams the engine expects (2
    // loader workers of one stream): 3 each. A third consumer beyond those
    // expected gets its share too, from the arena past the budget.
    let mut own = small(job());
    own.insert("memory_budget".into(), json!("7MiB"));
    let (_dir, socket) = engine(own.clone());
    let first = open(small(consumer(0, 0)), Some(&socket)).unwrap();
    let second = open(small(consumer(0, 1)), Some(&socket)).unwrap();
    let ino = |l: &Attached| {
        let (fd, _, len) = l.arena().unwrap();
        // SAFETY: a zeroed `stat` is a valid value of the plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat of the descriptor the consumer holds, into `st`.
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        (st.st_dev, st.st_ino, len)
    };
    // The consumers' own `memory_budget` (48 MiB) is not the engine's: its
    // arena file is 4 times its 7 MiB, the pages past them unused so far.
    assert_eq!(ino(&first), ino(&second), "one memory file for both");
    assert_eq!(ino(&first).2, 4 * (7 << 20));
    // With its share of 3 chunks each consumer still gets exactly what an
    // engine of its own gives it.
    for (l, worker) in [(&second, 1), (&first, 0)] {
        assert_eq!(
            drain(&open(small(consumer(0, worker)), None).unwrap()),
            drain(l)
        );
    }
    // The two expected consumers read within the budget: no page past it
    // is in memory (registering fixed buffers once pinned all 28 MiB).
    let (_, base, len) = first.arena().unwrap();
    let past = len - (7 << 20);
    let mut resident = vec![0u8; past / 4096];
    // SAFETY: the range lies in the consumer's mapping of the arena, and
    // `resident` has one byte per page of it.
    let rc = unsafe { libc::mincore(base.add(7 << 20) as *mut _, past, resident.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    let pages = resident.iter().filter(|&&r| r & 1 != 0).count();
    assert_eq!(pages, 0, "{pages} pages past the budget are in memory");
    // A third consumer gets its share past the budget, and its batches.
    let third = open(small(consumer(0, 0)), Some(&socket)).unwrap();
    assert_eq!(
        drain(&open(small(consumer(0, 0)), None).unwrap()),
        drain(&third)
    );
    // An engine whose budget gives the streams it expects fewer than 3
    // chunks each refuses them, naming the key.
    own.insert("memory_budget".into(), json!("5MiB"));
    let (_dir5, socket5) = engine(own);
    match open(small(consumer(0, 0)), Some(&socket5)) {
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("memory_budget") && msg.contains("fewer than the 3"),
                "{msg}"
            );
        }
        Ok(_) => panic!("a share of 2 chunks was let in"),
    }
}

#[test]
fn the_engines_io_threads_read_into_its_budget_as_fixed_buffers_exactly() {
    // `register_buffers` "on": the budget is faulted in at the engine's
    // start and every file read is a READ_FIXED into it; each consumer
    // still gets exactly its own batches, and its stats say so. Control:
    // "off", plain reads, the same batches.
    for (want, registered) in [("on", true), ("off", false)] {
        let mut own = job();
        own.insert("register_buffers".into(), json!(want));
        own.insert("net_threads".into(), json!(1));
        let (_dir, socket) = engine(own);
        for (rank, worker) in [(0, 0), (1, 1)] {
            let alone = drain(&open(consumer(rank, worker), None).unwrap());
            let attached = open(consumer(rank, worker), Some(&socket)).unwrap();
            assert_eq!(alone, drain(&attached), "{want}: consumer {rank}/{worker}");
            let (json, counts) = attached.stats().unwrap();
            let stats: Value = serde_json::from_str(&json).unwrap();
            if stats["io_backend"] == json!("io_uring") {
                assert_eq!(
                    counts.buffers_registered,
                    u32::from(registered),
                    "{want}: {json}"
                );
            } else {
                assert_eq!(counts.buffers_registered, 0, "{want}: {json}");
            }
        }
    }
}

#[test]
fn remote_shards_go_through_the_engines_network_threads_exactly() {
    // The shards over HTTP, their counts in a manifest (splitting among
    // consumers needs them): every consumer's loader hands its ranges to
    // the engine's network threads, and still gets exactly its own batches.
    let server = support::Server::start(dataset().dir.path().to_path_buf());
    let manifest = tempfile::Builder::new()
        .suffix(".manifest")
        .tempfile()
        .unwrap();
    let mut lines = String::new();
    for path in &dataset().shards {
        let p = Path::new(path);
        let url = server.url(p.file_name().unwrap().to_str().unwrap());
        let size = std::fs::metadata(p).unwrap().len();
        let samples = ringfeed::tar::count_file_samples(p).unwrap();
        lines.push_str(&format!("{url} {size} {samples}\n"));
    }
    std::fs::write(manifest.path(), lines).unwrap();
    let remote = |c: Map<String, Value>| {
        let mut c = c;
        c.insert("urls".into(), json!([manifest.path()]));
        c
    };
    let (_dir, socket) = engine(remote(job()));
    for (rank, worker) in [(0, 1), (1, 0)] {
        let alone = drain(&open(remote(consumer(rank, worker)), None).unwrap());
        let attached = open(remote(consumer(rank, worker)), Some(&socket)).unwrap();
        assert_eq!(alone, drain(&attached), "consumer {rank}/{worker}");
        let (json, _) = attached.stats().unwrap();
        let stats: Value = serde_json::from_str(&json).unwrap();
        if stats["io_backend"] == json!("io_uring") {
            assert!(stats["net_threads"].as_u64().unwrap() >= 1, "{json}");
        }
        assert!(stats["http_requests"].as_u64().unwrap() > 0, "{json}");
    }
}

#[test]
fn a_consumer_attached_first_leaves_the_shares_of_those_expected_after_it() {
    // A PyTorch DataLoader takes a batch from each worker in turn: the
    // first worker's consumer may hold batches the DataLoader takes only
    // after one from the second. Were the first alone to fill the pool,
    // the second would get no chunk, and the DataLoader would wait for
    // ever. The engine expects 2 consumers (`loader_workers`) of one
    // stream: 8 chunks, at most 4 for each even while one is attached.
    let mut own = small(job());
    own.insert("memory_budget".into(), json!("8MiB"));
    let (_dir, socket) = engine(own);
    let first = open(small(consumer(0, 0)), Some(&socket)).unwrap();
    let held = match first.next(Some(Duration::from_secs(60))).unwrap() {
        AnyNext::Batch(b) => b,
        _ => panic!("no first batch"),
    };
    // Its worker reads ahead as far as the pool lets it.
    std::thread::sleep(Duration::from_millis(500));
    let second = open(small(consumer(0, 1)), Some(&socket)).unwrap();
    match second.next(Some(Duration::from_secs(30))).unwrap() {
        AnyNext::Batch(_) => {}
        AnyNext::Timeout => panic!("the second consumer got no batch: the first holds the pool"),
        _ => panic!("the second consumer ended without a batch"),
    }
    drop(held);
    let (json, _) = first.stats().unwrap();
    let stats: Value = serde_json::from_str(&json).unwrap();
    // The budget's 8 chunks, and 3 times as many past it for consumers
    // beyond those expected.
    assert_eq!(stats["chunk_count"], json!(32));
}

#[test]
fn consumers_that_keep_a_batch_while_asking_the_next_get_every_batch_with_auto_streams() {
    // What `for batch in loader` does: the last batch is kept while the
    // next is asked for. The engine's workers and each consumer's streams
    // left to auto, batches of ~20 samples of ~9 KB in 64 KiB chunks (4
    // chunks each), a budget giving each stream the engine expects 7
    // chunks: a stream cannot hold the batch its consumer keeps and the
    // next. Before, a consumer of this 5-shard dataset (a part of one or
    // two shards) ran 4 streams, 2 of them planned nothing, and its busy
    // stream waited for ever at its 7 chunks (this test's control: "no
    // batch for 60 s after 1 batches"); now it runs 3 streams that split
    // its part, each with room for two batches (taken past the budget:
    // the arena is 4 times it).
    let mut own = job();
    own.remove("workers");
    own.insert("chunk_size".into(), json!("64KiB"));
    own.insert("batch_size".into(), json!(20));
    own.insert("shuffle_buffer".into(), json!(0));
    // 4 consumers x 4 expected streams x 7 chunks of 64 KiB.
    own.insert("memory_budget".into(), json!(4 * 4 * 7 * 65536));
    let (_dir, socket) = engine(own.clone());
    let mut all_keys = Vec::new();
    let consumers: Vec<_> = [(0, 0), (0, 1), (1, 0), (1, 1)]
        .into_iter()
        .map(|(rank, worker)| {
            let mut c = own.clone();
            c.insert("rank".into(), json!(rank));
            c.insert("loader_worker".into(), json!(worker));
            (c.clone(), open(c, Some(&socket)).unwrap())
        })
        .collect();
    for (cfg, attached) in &consumers {
        let mut kept: Option<AnyBatch> = None;
        let mut seen = Vec::new();
        loop {
            match attached.next(Some(Duration::from_secs(60))).unwrap() {
                AnyNext::Batch(b) => {
                    seen.push(view(&b));
                    kept = Some(b);
                }
                AnyNext::EndOfEpoch(_) => {}
                AnyNext::Finished => break,
                AnyNext::Timeout => panic!(
                    "no batch for 60 s after {} batches, the last one kept",
                    seen.len()
                ),
            }
        }
        drop(kept);
        let (json, _) = attached.stats().unwrap();
        let stats: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(stats["workers"], json!(3), "{json}");
        // Exactly what an engine of its own gives this consumer.
        let alone: Vec<Seen> = drain(&open(cfg.clone(), None).unwrap())
            .into_iter()
            .filter_map(|(b, _)| b)
            .collect();
        assert_eq!(seen, alone);
        all_keys.extend(seen.iter().flat_map(|b| b.2.iter().map(|s| s.0.clone())));
    }
    all_keys.sort();
    all_keys.dedup();
    assert_eq!(all_keys, dataset().keys);
}

/// An engine started on demand ends once nothing has been attached for its
/// linger; a connection open counts, attached or not. A consumer that
/// connected as the engine lingered out used to be reset ("attach reply:
/// Connection reset by peer"): the engine ended under a connection it had
/// accepted. Here a connection stays open, unattached, for five lingers:
/// the engine is still there, its socket too; once it closes, the engine
/// ends on its own and removes its socket (the control: the linger does
/// end an engine, so the first half is the open connection's doing).
#[test]
fn an_engine_started_on_demand_never_ends_under_an_open_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("node.sock");
    let listener = ringfeed::node::sock::listen(&socket).unwrap();
    let linger = Duration::from_millis(200);
    let opts = ringfeed::node::NodeOptions {
        socket: socket.clone(),
        config: ringfeed::Config::from_map(&job()).unwrap(),
        linger: Some(linger),
    };
    let engine = std::thread::spawn(move || ringfeed::node::serve(listener, opts));
    let conn = ringfeed::node::sock::connect(&socket).unwrap();
    std::thread::sleep(5 * linger);
    assert!(
        !engine.is_finished(),
        "the engine ended under an open connection"
    );
    assert!(
        socket.exists(),
        "the engine removed its socket under an open connection"
    );
    drop(conn);
    engine.join().unwrap().unwrap();
    assert!(
        !socket.exists(),
        "the engine that lingered out left its socket"
    );
}

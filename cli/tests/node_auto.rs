//! `"node": "auto"`: the first consumer starts this user's engine for the
//! dataset (`ringfeed node --daemon`), the next attaches to the same one, and
//! the engine exits once the last has left; one killed (SIGKILL: its socket
//! stays) is replaced by the next consumer's. One test in its own binary: it
//! sets environment variables (where the engine lives and which program it
//! is), which no other test thread may read meanwhile.

use std::time::{Duration, Instant};

use ringfeed::consumer::{AnyNext, Attached};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_ringfeed");

fn engine_pid(l: &Attached) -> u64 {
    let (text, _) = l.stats().unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["node"]["pid"].as_u64().unwrap()
}

/// Whether process `pid` has exited (gone, or a zombie nobody reaped).
fn exited(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z')),
    }
}

#[test]
fn auto_starts_one_engine_that_stops_after_the_last_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = std::process::Command::new(BIN)
        .args([
            "gen",
            data.to_str().unwrap(),
            "--shards",
            "2",
            "--shard-size",
            "1MiB",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    // SAFETY: this binary's only test sets them before any thread reads the
    // environment.
    unsafe {
        std::env::set_var("XDG_RUNTIME_DIR", &run);
        std::env::set_var("RINGFEED_NODE_EXE", BIN);
        std::env::set_var("RINGFEED_NODE_LINGER_MS", "300");
    }
    let cfg = |rank: u64| {
        json!({"urls": [data], "world_size": 2, "rank": rank, "node": "auto", "batch_size": 3})
            .to_string()
    };
    let a = Attached::open_json(&cfg(0)).unwrap();
    let b = Attached::open_json(&cfg(1)).unwrap();
    let pid = engine_pid(&a);
    assert_eq!(pid, engine_pid(&b), "two engines for one dataset");
    assert_ne!(pid, u64::from(std::process::id()));
    let sockets: Vec<_> = std::fs::read_dir(run.join("ringfeed"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".sock"))
        .collect();
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    for l in [&a, &b] {
        assert!(matches!(
            l.next(Some(Duration::from_secs(60))).unwrap(),
            AnyNext::Batch(_)
        ));
    }
    a.close();
    assert!(
        !exited(pid),
        "the engine left while a consumer was attached"
    );
    b.close();
    let start = Instant::now();
    while !exited(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the engine did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!run.join("ringfeed").join(&sockets[0]).exists());
    // An engine killed with SIGKILL leaves its socket; the next consumer
    // finds nobody answering there and starts an engine that replaces it.
    let c = Attached::open_json(&cfg(0)).unwrap();
    let killed = engine_pid(&c);
    // SAFETY: plain arguments; the engine is this test's grandchild.
    assert_eq!(unsafe { libc::kill(killed as i32, libc::SIGKILL) }, 0);
    // Dead once nobody answers on its socket: its thread-group leader
    // shows as a zombie (`exited`) while its io_uring workers, which share
    // its descriptors, are still closing the listening socket.
    let socket = run.join("ringfeed").join(&sockets[0]);
    let start = Instant::now();
    while ringfeed::node::sock::connect(&socket)
        .map_err(|e| e.raw_os_error())
        .err()
        != Some(Some(libc::ECONNREFUSED))
    {
        assert!(start.elapsed() < Duration::from_secs(60), "SIGKILL ignored");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    assert!(socket.exists());
    let d = Attached::open_json(&cfg(0)).unwrap();
    assert_ne!(engine_pid(&d), killed);
    let log = std::fs::read_to_string(socket.with_extension("log")).unwrap();
    assert!(log.contains("replaced the stale socket"), "{log}");
    assert!(matches!(
        d.next(Some(Duration::from_secs(60))).unwrap(),
        AnyNext::Batch(_)
    ));
}

//! `ringfeed node` as its own process: consumers attached to it take their
//! batches, and when it dies (killed) every attached consumer gets a named
//! error — after the batches it already had — never a hang; the socket a
//! killed engine leaves is replaced by the next engine, never one a live
//! engine answers on; SIGTERM stops it, its socket removed; `ringfeed
//! bench` with `"node"` in its `--config` reads the whole dataset through
//! it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ringfeed::consumer::{AnyNext, Attached};
use serde_json::json;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_ringfeed");

/// Small shards in a temporary directory; returns it and their paths.
pub fn shards(dir: &Path) -> Vec<String> {
    let out = Command::new(BIN)
        .args([
            "gen",
            dir.to_str().unwrap(),
            "--shards",
            "3",
            "--shard-size",
            "2MiB",
        ])
        .args(["--sample-size", "20KiB"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut paths: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".tar"))
        .collect();
    paths.sort();
    paths
}

/// Waits until something listens at `socket` (the engine started).
pub fn wait_listening(socket: &Path, engine: &mut Child) {
    let start = Instant::now();
    while ringfeed::node::sock::connect(socket).is_err() {
        assert!(engine.try_wait().unwrap().is_none(), "the engine exited");
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the engine never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ringfeed node` on `paths` at `socket` with `args`, once it listens.
fn start_engine(paths: &[String], socket: &Path, args: &[&str]) -> Child {
    let mut engine = Command::new(BIN)
        .arg("node")
        .args(paths)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(socket, &mut engine);
    engine
}

#[test]
fn an_engine_that_dies_is_an_error_for_its_consumers_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path());
    let socket = dir.path().join("node.sock");
    // Epochs for ever: the engine can never have handed out everything
    // (the end included) before it is killed.
    let mut engine = start_engine(&paths, &socket, &["--batch-size", "4", "--epochs", "0"]);
    let cfg = json!({"urls": paths, "batch_size": 4, "epochs": 0, "node": socket});
    let l = Attached::open_json(&cfg.to_string()).unwrap();
    let AnyNext::Batch(first) = l.next(Some(Duration::from_secs(60))).unwrap() else {
        panic!("no batch");
    };
    let copy: Vec<u8> = first
        .raw_fields()
        .iter()
        // SAFETY: the batch is alive; its fields point into the mapping.
        .flat_map(|f| unsafe { std::slice::from_raw_parts(f.data, f.len) }.to_vec())
        .collect();
    engine.kill().unwrap();
    engine.wait().unwrap();
    // The consumer waits in `next` without a time-out; the channel only
    // keeps a broken build from hanging the test run.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let end = loop {
            match l.next(None) {
                Ok(AnyNext::Batch(_)) | Ok(AnyNext::EndOfEpoch(_)) => {}
                other => break other.map(|_| ()),
            }
        };
        tx.send(end).unwrap();
    });
    let end = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the consumer hangs after the engine died");
    let e = end.expect_err("an error, not the end");
    assert_eq!(e.node_failure(), Some(ringfeed::NodeFailure::Gone), "{e}");
    assert!(e.to_string().contains("exited"), "{e}");
    // The batch taken before still reads the same bytes.
    let again: Vec<u8> = first
        .raw_fields()
        .iter()
        // SAFETY: as above; the mapping outlives the engine.
        .flat_map(|f| unsafe { std::slice::from_raw_parts(f.data, f.len) }.to_vec())
        .collect();
    assert_eq!(copy, again);
}

/// The samples of one epoch of `cfg`'s loader (in this process, or
/// attached to an engine by its `node` key).
fn epoch_samples(cfg: &serde_json::Value) -> (usize, Option<u64>) {
    let l = Attached::open_json(&cfg.to_string()).unwrap();
    let mut samples = 0;
    loop {
        match l.next(Some(Duration::from_secs(60))).unwrap() {
            AnyNext::Batch(b) => samples += b.len(),
            AnyNext::EndOfEpoch(_) | AnyNext::Finished => break,
            AnyNext::Timeout => panic!("no batch within 60 s"),
        }
    }
    let (stats, _) = l.stats().unwrap();
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    (samples, stats["node"]["pid"].as_u64())
}

/// `ringfeed node` at `socket`, expected to fail: its standard error.
/// Killed (and the test failed) if it is still running after 60 s.
fn refused_engine(paths: &[String], socket: &Path) -> String {
    let mut engine = Command::new(BIN)
        .arg("node")
        .args(paths)
        .arg("--socket")
        .arg(socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while engine.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            engine.kill().unwrap();
            panic!("a second engine at a live engine's socket started serving");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = engine.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_killed_engines_socket_is_replaced_and_a_live_ones_never() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path());
    let socket = dir.path().join("node.sock");
    let cfg = json!({"urls": paths, "batch_size": 4});
    let (alone, _) = epoch_samples(&cfg);
    let attached = json!({"urls": paths, "batch_size": 4, "node": socket});
    // SIGKILL, as the OOM killer or `kubectl delete --force` kill: the
    // engine cannot remove its socket.
    let mut killed = start_engine(&paths, &socket, &["--batch-size", "4"]);
    killed.kill().unwrap();
    killed.wait().unwrap();
    use std::os::unix::fs::FileTypeExt;
    let left = std::fs::symlink_metadata(&socket).expect("the killed engine's socket");
    assert!(left.file_type().is_socket());
    let e = ringfeed::node::sock::connect(&socket).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
    // Control: binding it as it is fails, as every restart did before the
    // engine replaced a socket nobody answers on.
    let e = ringfeed::node::sock::listen(&socket).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    // The next engine takes it over and serves the whole epoch.
    let mut engine = start_engine(&paths, &socket, &["--batch-size", "4"]);
    let (served, pid) = epoch_samples(&attached);
    assert_eq!(served, alone);
    assert_eq!(pid, Some(engine.id() as u64));
    // A third engine at the socket the second holds is refused by name and
    // exits; the second keeps its socket and serves on.
    let err = refused_engine(&paths, &socket);
    assert!(
        err.contains("a node engine answers there already: not replacing it"),
        "{err}"
    );
    let (again, pid) = epoch_samples(&attached);
    assert_eq!(again, alone);
    assert_eq!(pid, Some(engine.id() as u64));
    engine.kill().unwrap();
    engine.wait().unwrap();
}

#[test]
fn sigterm_stops_the_engine_and_removes_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path());
    let socket = dir.path().join("node.sock");
    let mut engine = Command::new(BIN)
        .arg("node")
        .args(&paths)
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(&socket, &mut engine);
    // SAFETY: plain arguments; the engine is this test's child.
    assert_eq!(unsafe { libc::kill(engine.id() as i32, libc::SIGTERM) }, 0);
    let start = Instant::now();
    while engine.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            engine.kill().unwrap();
            panic!("SIGTERM did not stop the engine");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = engine.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(
        err.contains("signal 15: removed the socket; exiting"),
        "{err}"
    );
    assert!(!socket.exists());
}

/// Runs `ringfeed bench --json` and returns its report.
fn bench_report(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_attached_to_a_node_engine_reads_every_byte_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path());
    let socket = dir.path().join("node.sock");
    // A linger, so an engine a failed test leaves behind exits on its own.
    let mut engine = start_engine(&paths, &socket, &["--linger-ms", "1000"]);
    // `gen` without `--seed` writes seed 0's content.
    let mut args: Vec<&str> = paths.iter().map(String::as_str).collect();
    args.extend(["--verify", "0"]);
    let alone = bench_report(&args);
    let node = json!({"node": socket}).to_string();
    args.extend(["--config", &node]);
    let attached = bench_report(&args);
    engine.kill().unwrap();
    engine.wait().unwrap();
    assert_eq!(attached["verify_failures"], 0, "{attached}");
    assert_eq!(alone["verify_failures"], 0, "{alone}");
    assert!(alone["bytes"].as_u64().unwrap() > 0, "{alone}");
    assert_eq!(attached["bytes"], alone["bytes"], "{attached}");
    assert_eq!(attached["samples"], alone["samples"], "{attached}");
    let n = &attached["stats"]["node"];
    assert_eq!(n["pid"], engine.id(), "{attached}");
    assert_eq!(n["socket"], json!(socket), "{attached}");
    // Without a node the report has no such member.
    assert!(alone["stats"].get("node").is_none(), "{alone}");
}

#[test]
fn the_engine_serves_its_metrics_summed_over_its_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path());
    let socket = dir.path().join("node.sock");
    let mut engine = Command::new(BIN)
        .arg("node")
        .args(&paths)
        .arg("--socket")
        .arg(&socket)
        .args([
            "--linger-ms",
            "2000",
            "--metrics-port",
            "0",
            "--batch-size",
            "4",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = common::metrics_address(engine.stderr.take().unwrap());
    wait_listening(&socket, &mut engine);
    let scrape = || common::http_get(&addr, "/metrics");
    // A consumer attached and holding its first batch.
    let cfg = json!({"urls": paths, "batch_size": 4, "node": socket});
    let consumer = Attached::open_json(&cfg.to_string()).unwrap();
    let first = match consumer.next(Some(Duration::from_secs(60))).unwrap() {
        AnyNext::Batch(b) => b,
        _ => panic!("no first batch"),
    };
    let body = scrape();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(body.contains("\nringfeed_node_consumers 1\n"), "{body}");
    assert!(
        body.contains("\nringfeed_node_attached_total 1\n"),
        "{body}"
    );
    assert!(
        body.contains("# TYPE ringfeed_delivered_samples_total counter"),
        "{body}"
    );
    assert!(body.contains("\nringfeed_arena_bytes "), "{body}");
    drop(first);
    drop(consumer);
    engine.kill().unwrap();
    engine.wait().unwrap();
}

#[test]
fn the_engines_metrics_listen_on_the_address_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let paths = shards(dir.path());
    // Default: loopback only; `--metrics-addr 0.0.0.0`: every interface,
    // as a pod's scraper needs (reached here on loopback too).
    for (extra, want_ip) in [(None, "127.0.0.1"), (Some("0.0.0.0"), "0.0.0.0")] {
        let socket = dir.path().join(format!("node-{want_ip}.sock"));
        let mut cmd = Command::new(BIN);
        cmd.arg("node")
            .args(&paths)
            .arg("--socket")
            .arg(&socket)
            .args(["--linger-ms", "2000", "--metrics-port", "0"]);
        if let Some(ip) = extra {
            cmd.args(["--metrics-addr", ip]);
        }
        let mut engine = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = common::metrics_address(engine.stderr.take().unwrap());
        let (ip, port) = addr.rsplit_once(':').unwrap();
        assert_eq!(ip, want_ip, "{addr}");
        wait_listening(&socket, &mut engine);
        let body = common::http_get(&format!("127.0.0.1:{port}"), "/metrics");
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        engine.kill().unwrap();
        engine.wait().unwrap();
    }
    // An address that is not one is refused by name.
    let out = Command::new(BIN)
        .args([
            "node",
            "x.tar",
            "--metrics-port",
            "0",
            "--metrics-addr",
            "everywhere",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--metrics-addr"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

//! The `ringfeed` binary as a user runs it: `gen`, `ls`, `cat` (listings and
//! raw field bytes checked against the generator's content), `serve` (its
//! printed URL answers a ranged GET), `demo` over http://, `topology` (and
//! a second process's CPU claims honoured by `bench`), and bad input failing
//! with a message that names the problem.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ringfeed::synth;

mod common;
#[path = "../../tests/support/skip.rs"]
mod skip;

const BIN: &str = env!("CARGO_BIN_EXE_ringfeed");
const SEED: u64 = 7;

fn ringfeed(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs and expects success; returns stdout.
fn ok(args: &[&str]) -> String {
    let o = ringfeed(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// Runs and expects failure with `want` in stderr.
fn fails(args: &[&str], want: &str) {
    let o = ringfeed(args);
    let err = text(&o.stderr);
    assert!(
        !o.status.success(),
        "{args:?} succeeded: {}",
        text(&o.stdout)
    );
    assert!(err.contains(want), "{args:?}: `{want}` not in: {err}");
}

/// Three small shards in a temporary directory; returns it and the sample count.
fn dataset() -> (tempfile::TempDir, u64) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = ok(&[
        "gen",
        d,
        "--shards",
        "3",
        "--shard-size",
        "1MiB",
        "--sample-size",
        "40KB",
        "--seed",
        &SEED.to_string(),
    ]);
    // "wrote 3 shards, 62 samples, 0.00 GB: DIR/shard-{000000..000002}.tar"
    assert!(out.starts_with("wrote 3 shards, "), "{out}");
    assert!(out.contains("shard-{000000..000002}.tar"), "{out}");
    let samples = out.split(", ").nth(1).unwrap().split(' ').next().unwrap();
    (dir, samples.parse().unwrap())
}

fn pattern(dir: &Path) -> String {
    format!("{}/shard-{{000000..000002}}.tar", dir.display())
}

#[test]
fn ls_lists_the_shards_with_sizes_and_sample_counts() {
    let (dir, samples) = dataset();
    let out = ok(&["ls", &pattern(dir.path())]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let mut total = 0;
    for (i, line) in lines[..3].iter().enumerate() {
        let path = dir.path().join(format!("shard-{i:06}.tar"));
        let size = std::fs::metadata(&path).unwrap().len();
        total += size;
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols, [size.to_string(), path.display().to_string()]);
    }
    assert!(
        lines[3].starts_with(&format!("3 shards, {total} bytes")),
        "{out}"
    );
    // A directory resolves to the same shards.
    assert_eq!(ok(&["ls", dir.path().to_str().unwrap()]), out);
    let out = ok(&["ls", "--samples", dir.path().to_str().unwrap()]);
    let per_shard: u64 = out
        .lines()
        .take(3)
        .map(|l| {
            assert!(l.contains(" samples  cls,jpg "), "{l}");
            l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(per_shard, samples);
    assert!(out.ends_with(&format!(", {samples} samples\n")), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["ls", "--json", &pattern(dir.path())])).unwrap();
    assert_eq!(json["total_bytes"], total);
    assert_eq!(json["shards"].as_array().unwrap().len(), 3);
}

#[test]
fn cat_prints_samples_and_raw_field_bytes() {
    let (dir, samples) = dataset();
    let d = dir.path().to_str().unwrap();
    let all = ok(&["cat", d]);
    assert_eq!(all.lines().count() as u64, samples);
    let first = all.lines().next().unwrap();
    assert!(first.starts_with("000000-0000000  jpg:"), "{first}");
    assert!(first.contains("  cls:"), "{first}");
    let two = ok(&["cat", &pattern(dir.path()), "--limit", "2"]);
    assert_eq!(
        two.lines().collect::<Vec<_>>(),
        all.lines().take(2).collect::<Vec<_>>()
    );
    // One sample, then its fields' raw bytes, which are the generator's.
    let key = synth::sample_key(1, 3);
    let line = ok(&["cat", d, "--key", &key]);
    assert!(line.starts_with(&format!("{key}  jpg:")), "{line}");
    for field in ["jpg", "cls"] {
        let o = ringfeed(&["cat", d, "--key", &key, "--field", field]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let want_len: usize = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{field}:")))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(o.stdout.len(), want_len);
        assert!(synth::verify(
            SEED,
            key.as_bytes(),
            field.as_bytes(),
            &o.stdout
        ));
    }
}

/// Kills the child when dropped, so a failing test leaves no server behind.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ringfeed serve DIR` on a free port: the running server (stopped when
/// dropped) and the base URL it printed.
fn serve(dir: &Path) -> (Running, String) {
    let mut child = Running(
        Command::new(BIN)
            .args(["serve", dir.to_str().unwrap(), "--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut url = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    (child, url.trim().to_string())
}

#[test]
fn serve_prints_its_url_and_answers_ranged_gets() {
    let (dir, samples) = dataset();
    let (_server, url) = serve(dir.path());
    let url = url.as_str();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with('/'),
        "{url}"
    );
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /shard-000001.tar HTTP/1.1\r\nHost: t\r\nRange: bytes=0-99\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = text(&resp[..split]);
    assert!(head.starts_with("HTTP/1.1 206 "), "{head}");
    let size = std::fs::metadata(dir.path().join("shard-000001.tar"))
        .unwrap()
        .len();
    assert!(
        head.contains(&format!("Content-Range: bytes 0-99/{size}")),
        "{head}"
    );
    let file = std::fs::read(dir.path().join("shard-000001.tar")).unwrap();
    assert_eq!(&resp[split..], &file[..100]);
    // The whole dataset over http://, through ls and cat.
    let remote = format!("{url}shard-{{000000..000002}}.tar");
    let out = ok(&["ls", "--samples", &remote]);
    assert!(out.ends_with(&format!(", {samples} samples\n")), "{out}");
    let key = synth::sample_key(2, 0);
    let o = ringfeed(&["cat", &remote, "--key", &key, "--field", "jpg"]);
    assert!(synth::verify(SEED, key.as_bytes(), b"jpg", &o.stdout));
}

#[test]
fn demo_streams_over_http_and_verifies_every_byte_and_sample() {
    let o = ringfeed(&["demo", "--size", "16MiB"]);
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{all}");
    assert!(all.contains("0 mismatches"), "{all}");
    assert!(
        all.contains("counted       every generated sample exactly once per epoch"),
        "{all}"
    );
    assert!(all.contains("streaming http://127.0.0.1:"), "{all}");
    assert!(all.contains("source        http://127.0.0.1:"), "{all}");
    assert!(all.contains("server        "), "{all}");
    let o = ringfeed(&["demo", "--size", "8MiB", "--local"]);
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{all}");
    assert!(
        all.contains("0 mismatches") && !all.contains("http://"),
        "{all}"
    );
    // Two epochs: each sample once in each.
    let o = ringfeed(&["demo", "--size", "8MiB", "--local", "--epochs", "2"]);
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{all}");
    assert!(all.contains("exactly once per epoch"), "{all}");
}

#[test]
fn bad_input_fails_with_a_message_naming_the_problem() {
    let (dir, _) = dataset();
    let d = dir.path().to_str().unwrap();
    fails(&["frobnicate"], "frobnicate");
    fails(&[], "Usage");
    fails(&["ls"], "<URLS>");
    fails(&["cat"], "<URLS>");
    fails(&["serve"], "<DIR>");
    fails(&["cat", d, "--field", "jpg"], "--key");
    fails(&["gen", d, "--shards", "x"], "--shards");
    fails(
        &["ls", "gopher://host/a.tar"],
        "unsupported scheme `gopher`",
    );
    fails(&["ls", &format!("{d}/shard-{{0..2.tar")], "unmatched `{`");
    fails(&["ls", "http://h:99999/a.tar"], "bad port");
    fails(
        &["ls", "/nonexistent/shard-000000.tar"],
        "/nonexistent/shard-000000.tar",
    );
    fails(&["cat", "/nonexistent/a.tar"], "/nonexistent/a.tar");
    fails(
        &["cat", d, "--key", "no-such-key"],
        "sample `no-such-key` not found",
    );
    fails(
        &["cat", d, "--key", "000000-0000000", "--field", "png"],
        "has no field `png`; its fields: jpg, cls",
    );
    // Nobody listens on this port (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/a.tar");
    fails(&["ls", &url, "--config", r#"{"max_attempts": 1}"#], &url);
    fails(
        &["serve", &format!("{d}/missing")],
        "not a readable directory",
    );
    fails(
        &["serve", d, "--bind", "192.0.2.1"],
        "cannot listen on 192.0.2.1:0",
    );
}

#[test]
fn index_writes_a_manifest_that_splits_the_dataset_among_ranks() {
    let (dir, samples) = dataset();
    let m = dir.path().join("set.manifest");
    let m_s = m.to_str().unwrap();
    ok(&["index", &pattern(dir.path()), "-o", m_s]);
    let text = std::fs::read_to_string(&m).unwrap();
    let counted: u64 = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(counted, samples, "{text}");
    // Two ranks from the manifest: each gets half, padded to equal length.
    let mut got = 0;
    for rank in 0..2 {
        let cfg = format!(r#"{{"world_size": 2, "rank": {rank}}}"#);
        let out = ok(&[
            "bench",
            m_s,
            "--json",
            "--verify",
            &SEED.to_string(),
            "--config",
            &cfg,
            "--memory-budget",
            "64MiB",
            "--chunk-size",
            "1MiB",
        ]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        got += v["samples"].as_u64().unwrap() - v["stats"]["samples_padded"].as_u64().unwrap();
        assert_eq!(v["verify_failures"], 0);
    }
    assert_eq!(got, samples);
    fails(&["index", "/nonexistent/x.tar"], "/nonexistent/x.tar");

    // `-o NAME.json`: WebDataset's shard index, its names within `base`,
    // read back as the dataset with the same counts.
    let j = dir.path().join("shardindex.json");
    let j_s = j.to_str().unwrap();
    ok(&["index", &pattern(dir.path()), "-o", j_s]);
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    assert_eq!(index["wids_version"], 1);
    assert_eq!(
        index["base"].as_str().unwrap(),
        format!("{}/", dir.path().display())
    );
    let list = index["shardlist"].as_array().unwrap();
    assert!(
        list.iter()
            .all(|e| !e["url"].as_str().unwrap().contains('/'))
    );
    let total: u64 = list.iter().map(|e| e["nsamples"].as_u64().unwrap()).sum();
    assert_eq!(total, samples);
    let out = ok(&["bench", j_s, "--json", "--verify", &SEED.to_string()]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["samples"].as_u64().unwrap(), samples);
}

#[test]
fn config_objects_given_twice_are_merged_in_order() {
    let (dir, samples) = dataset();
    let url = pattern(dir.path());
    let out = ok(&[
        "bench",
        &url,
        "--json",
        "--config",
        r#"{"workers": 2, "batch_size": 5}"#,
        "--config",
        r#"{"workers": 1}"#,
    ]);
    let d: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(d["stats"]["workers"], 1, "the later object wins");
    assert_eq!(d["samples"], samples);
    // batch_size 5 from the first object still holds.
    assert_eq!(d["batches"], samples.div_ceil(5));
    fails(
        &["bench", &url, "--config", "{}", "--config", "[1]"],
        "--config must be a JSON object",
    );
}

#[test]
fn topology_prints_this_machine_and_a_placement() {
    let out = ok(&["topology"]);
    assert!(out.contains("CPUs allowed: "), "{out}");
    assert!(out.contains("placement of 4 workers: "), "{out}");
    let out = ok(&["topology", "--json", "--workers", "1"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let allowed: Vec<u64> = serde_json::from_value(v["allowed"].clone()).unwrap();
    assert!(!allowed.is_empty(), "{out}");
    assert!(v["topology"]["nics"].is_array(), "{out}");
    assert!(v["topology"]["unread"].is_array(), "{out}");
    let p = &v["placement"];
    assert_eq!(p["workers"], 1, "{out}");
    // One worker on a CPU it may use, unless others claimed every one
    // (then it still gets one, unclaimed by it).
    let cpus = p["cpus"].as_array().expect("one worker is placed");
    assert_eq!(cpus.len(), 1, "{out}");
    assert!(allowed.contains(&cpus[0].as_u64().unwrap()), "{out}");
}

/// Another process holding claims on every allowed CPU but one: a `bench`
/// run in a second process pins its worker on the one left.
#[test]
fn an_engine_in_another_process_avoids_claimed_cpus() {
    use ringfeed::topology::{self, ClaimsDir, PlacementRequest};
    let topo = topology::discover();
    let allowed = topo.allowed();
    if allowed.len() < 2 {
        crate::skip!("fewer than 2 allowed CPUs");
        return;
    }
    let run = tempfile::tempdir().unwrap();
    let dir = ClaimsDir::at(&run.path().join("ringfeed/cpus")).unwrap();
    let (held, claims) = dir.place(
        &topo,
        &PlacementRequest {
            threads: allowed.len() - 1,
            allowed: &allowed,
            ..PlacementRequest::default()
        },
    );
    let held = held.cpus.unwrap();
    assert_eq!(claims.cpus().len(), held.len());
    let free: Vec<usize> = allowed
        .iter()
        .copied()
        .filter(|c| !held.contains(c))
        .collect();
    let (data, _) = dataset();
    let o = Command::new(BIN)
        .args(["bench", &pattern(data.path()), "--workers", "1", "--json"])
        .env("XDG_RUNTIME_DIR", run.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let stats = &v["stats"];
    let cpus: Vec<usize> = serde_json::from_value(stats["worker_cpus"].clone()).unwrap();
    assert_eq!(cpus, free, "{stats}");
    assert!(stats["placement"].is_string(), "{stats}");
    drop(claims);
}

#[test]
fn a_cached_run_reads_from_disk_and_its_counts_become_a_manifest() {
    let (dir, samples) = dataset();
    let (_server, url) = serve(dir.path());
    let urls = format!("{url}shard-{{000000..000002}}.tar");
    let cache = tempfile::tempdir().unwrap();
    let c = cache.path().to_str().unwrap();
    let cfg = format!(r#"{{"cache_dir": "{c}", "cache_min_free": 0, "cache_fill": "always"}}"#);
    let run = || -> serde_json::Value {
        let out = ok(&[
            "bench",
            &urls,
            "--json",
            "--verify",
            &SEED.to_string(),
            "--config",
            &cfg,
        ]);
        serde_json::from_str(out.trim()).unwrap()
    };
    let first = run();
    assert_eq!(first["stats"]["cache_misses"], 3);
    let second = run();
    assert_eq!(second["stats"]["cache_hits"], 3);
    assert_eq!(second["verify_failures"], 0);
    assert_eq!(second["samples"], samples);

    let listed = ok(&["cache", "ls", c]);
    assert_eq!(listed.lines().count(), 3, "{listed}");
    assert!(listed.contains("shard-000001.tar"), "{listed}");
    let m = cache.path().join("learned.manifest");
    ok(&["cache", "manifest", c, "-o", m.to_str().unwrap()]);
    let text = std::fs::read_to_string(&m).unwrap();
    let counted: u64 = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(counted, samples, "{text}");
    fails(&["cache", "ls", "/nonexistent/cache"], "not a directory");
    fails(&["cache", "manifest"], "<DIR>");
}

#[test]
fn bench_serves_its_metrics_while_it_runs() {
    let (dir, _) = dataset();
    let mut child = Running(
        Command::new(BIN)
            .args([
                "bench",
                &pattern(dir.path()),
                "--epochs",
                "0",
                "--metrics-port",
                "0",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let addr = common::metrics_address(child.0.stderr.take().unwrap());
    let get = |path: &str| common::http_get(&addr, path);
    let body = get("/metrics");
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.contains("Content-Type: text/plain; version=0.0.4"),
        "{body}"
    );
    assert!(
        body.contains("# TYPE ringfeed_delivered_samples_total counter"),
        "{body}"
    );
    assert!(body.contains("ringfeed_info{version=\""), "{body}");
    assert!(get("/other").starts_with("HTTP/1.1 404"));
    drop(child);
    // A port another program holds is an error before any work.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    fails(
        &["bench", &pattern(dir.path()), "--metrics-port", &port],
        "--metrics-port",
    );
}

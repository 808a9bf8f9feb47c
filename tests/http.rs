//! The HTTP data plane against a real server on 127.0.0.1 (tests/support):
//! ranged GETs into chunks over keep-alive connections, on both backends,
//! every sample exactly once whatever faults the server injects, retries
//! counted by kind, and errors that retrying cannot fix reported at once.

use ringfeed_test_support as support;

use std::sync::atomic::Ordering;

use ringfeed::net::http::FailKind;
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader};
use support::{Proxy, Server, stream};

/// `shards` shards of about `shard_bytes` with fields `jpg` and `cls`.
fn generate(
    dir: &std::path::Path,
    shards: usize,
    shard_bytes: u64,
    sample_bytes: u64,
    seed: u64,
) -> synth::GenReport {
    let o = GenOptions {
        shards,
        shard_bytes,
        sample_bytes,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    synth::generate(dir, &o, |_| {}).unwrap()
}

fn dataset(dir: &std::path::Path, seed: u64) -> (Vec<String>, usize) {
    let r = generate(dir, 3, 2 << 20, 60_000, seed);
    let names = r
        .paths
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    (names, r.samples as usize)
}

fn config(urls: Vec<String>, extra: serde_json::Value) -> Config {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("memory_budget".into(), serde_json::json!("16MiB"));
    m.insert("chunk_size".into(), serde_json::json!("512KiB"));
    m.insert("batch_size".into(), serde_json::json!(5));
    m.insert("workers".into(), serde_json::json!(2));
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Config::from_map(&m).unwrap()
}

#[test]
fn http_shards_stream_exactly_once_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let (names, samples) = dataset(dir.path(), 21);
    let server = Server::start(dir.path().to_path_buf());
    let pattern = server.url("shard-{000000..000002}.tar");
    assert_eq!(names.len(), 3);
    for backend in ["threads", "io_uring"] {
        let loader = Loader::open(config(
            vec![pattern.clone()],
            serde_json::json!({"io_backend": backend}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 21), samples);
        let s = loader.stats();
        assert!(s.http_requests >= 3 + 12, "HEADs plus ranged GETs");
        assert!(s.retries.values().all(|&n| n == 0));
        // Straddling members and body bytes that arrive with a head are copied, and counted.
        assert!(s.bytes_copied > 0, "{}", s.bytes_copied);
    }
}

#[test]
fn injected_faults_are_retried_by_range_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(dir.path(), 22);
    let server = Server::start(dir.path().to_path_buf());
    let url = server.url("shard-{000000..000002}.tar");
    for backend in ["io_uring", "threads"] {
        let f = &server.faults;
        f.throttle.store(3, Ordering::SeqCst);
        f.server_error.store(1, Ordering::SeqCst);
        f.reset.store(2, Ordering::SeqCst);
        f.truncate.store(2, Ordering::SeqCst);
        f.stall.store(1, Ordering::SeqCst);
        f.stall_ms.store(3000, Ordering::SeqCst);
        let loader = Loader::open(config(
            vec![url.clone()],
            serde_json::json!({"stall_timeout_ms": 1000, "max_attempts": 10, "io_backend": backend}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 22), samples, "{backend}");
        let s = loader.stats();
        assert_eq!(s.io_backend, backend);
        assert_eq!(s.retries["throttled"], 3, "{backend}");
        assert_eq!(s.retries["server_error"], 1, "{backend}");
        // The injected stall always shows: as a stall retry, or, on
        // io_uring, as a hedge that took the stalled range's rest to a fresh
        // connection first. A loaded machine may add more (a slow answer
        // is indistinguishable from a stall), each a harmless retry.
        assert!(
            s.retries["stalled"] + s.hedges_sent >= 1,
            "{backend}: {:?}, {} hedges",
            s.retries,
            s.hedges_sent
        );
        // A reset mid-body reads as a reset or as a truncated body, depending
        // on whether the RST or the FIN is seen first.
        assert_eq!(
            s.retries["reset"] + s.retries["truncated"],
            4,
            "{backend}: {:?}",
            s.retries
        );
    }
}

#[test]
fn a_slow_drip_still_delivers_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(dir.path(), 23);
    let server = Server::start(dir.path().to_path_buf());
    server.faults.drip.store(true, Ordering::SeqCst);
    let loader = Loader::open(config(
        vec![server.url("shard-{000000..000002}.tar")],
        serde_json::json!({}),
    ))
    .unwrap();
    assert_eq!(stream(&loader, 23), samples);
}

fn open_err(json: serde_json::Value, urls: Vec<String>) -> Error {
    support::first_error(config(urls, json))
}

#[test]
fn errors_that_retrying_cannot_fix_fail_at_once_with_the_url() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), 24);
    let server = Server::start(dir.path().to_path_buf());
    let e = open_err(serde_json::json!({}), vec![server.url("missing.tar")]);
    match &e {
        Error::Http {
            kind: FailKind::Client,
            attempts: 1,
            url,
            message,
        } => {
            assert!(url.ends_with("/missing.tar"));
            assert!(message.contains("404"), "{message}");
        }
        other => panic!("{other}"),
    }
    let e = open_err(serde_json::json!({}), vec![server.url("forbidden/x.tar")]);
    assert!(
        matches!(
            &e,
            Error::Http {
                kind: FailKind::Client,
                ..
            }
        ) && e.to_string().contains("403"),
        "{e}"
    );
    let e = open_err(
        serde_json::json!({}),
        vec!["http://nothing.invalid/a.tar".into()],
    );
    assert!(
        matches!(
            &e,
            Error::Http {
                kind: FailKind::Dns,
                attempts: 1,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn persistent_faults_exhaust_the_attempts_and_name_the_kind() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), 25);
    let server = Server::start(dir.path().to_path_buf());
    // Throttling is not bounded by `max_attempts`, only by the deadline:
    // with one attempt allowed, a throttled request is still retried, and
    // fails by name once it has been throttled for `retry_deadline_s`.
    server.faults.throttle.store(1000, Ordering::SeqCst);
    let e = open_err(
        serde_json::json!({"max_attempts": 1, "retry_deadline_s": 3}),
        vec![server.url("shard-000000.tar")],
    );
    match &e {
        Error::Throttled {
            attempts,
            waited_ms,
            deadline_ms: 3000,
            ..
        } if *attempts >= 2 && *waited_ms >= 3000 => {}
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("retry_deadline_s"), "{e}");
    // Nobody listens on this port (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = open_err(
        serde_json::json!({"max_attempts": 2}),
        vec![format!("http://127.0.0.1:{port}/a.tar")],
    );
    assert!(
        matches!(
            &e,
            Error::Http {
                kind: FailKind::Refused,
                attempts: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn garbage_and_range_ignoring_servers_are_protocol_errors() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), 26);
    let server = Server::start(dir.path().to_path_buf());
    let url = server.url("shard-000000.tar");
    server.faults.ignore_range.store(true, Ordering::SeqCst);
    let e = open_err(
        serde_json::json!({"chunk_size": "256KiB"}),
        vec![url.clone()],
    );
    assert!(
        matches!(
            &e,
            Error::Http {
                kind: FailKind::Protocol,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("ignored the Range header"), "{e}");
    server.faults.ignore_range.store(false, Ordering::SeqCst);
    server.faults.garbage.store(true, Ordering::SeqCst);
    let e = open_err(serde_json::json!({}), vec![url]);
    assert!(
        matches!(
            &e,
            Error::Http {
                kind: FailKind::Protocol,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("malformed HTTP response"), "{e}");
}

#[test]
fn bad_http_urls_are_named() {
    for (url, want) in [
        ("http://h:99999/a.tar", "bad port"),
        ("http://user:pw@h/a.tar", "credentials"),
        ("http://h/a{0..2", "unmatched"),
    ] {
        let e = Loader::open(config(vec![url.into()], serde_json::json!({})))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(want), "{url}: {e}");
    }
}

#[test]
fn https_verifies_the_certificate_and_streams_with_a_ca_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(dir.path(), 27);
    let (server, pem) = Server::start_tls(dir.path().to_path_buf());
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pem).unwrap();
    let url = server.https_url("localhost", "shard-{000000..000002}.tar");
    for backend in ["io_uring", "threads"] {
        let loader = Loader::open(config(
            vec![url.clone()],
            serde_json::json!({"ca_bundle": ca.display().to_string(), "io_backend": backend}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 27), samples, "{backend}");
    }
    // Without the bundle the self-signed certificate is refused, at once.
    let e = open_err(
        serde_json::json!({"ca_bundle": "/etc/ssl/certs/ca-certificates.crt"}),
        vec![url.clone()],
    );
    support::assert_tls_at_once(&e, "certificate");
    // A bundle that is not PEM is named.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let e = open_err(
        serde_json::json!({"ca_bundle": junk.display().to_string()}),
        vec![url],
    );
    assert!(e.to_string().contains("junk.pem"), "{e}");
}

#[test]
fn faults_injected_by_a_proxy_in_front_of_the_server_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(dir.path(), 28);
    let server = Server::start(dir.path().to_path_buf());
    let proxy = Proxy::start(server.addr);
    let url = format!("http://{}/shard-{{000000..000002}}.tar", proxy.addr);
    for backend in ["io_uring", "threads"] {
        let f = &proxy.faults;
        f.throttle.store(4, Ordering::SeqCst);
        f.reset.store(1, Ordering::SeqCst);
        f.truncate.store(1, Ordering::SeqCst);
        f.stall.store(1, Ordering::SeqCst);
        f.stall_ms.store(3000, Ordering::SeqCst);
        f.drip.store(backend == "threads", Ordering::SeqCst);
        let loader = Loader::open(config(
            vec![url.clone()],
            serde_json::json!({"stall_timeout_ms": 1000, "max_attempts": 10, "io_backend": backend}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 28), samples, "{backend}");
        let s = loader.stats();
        assert_eq!(s.retries["throttled"], 4, "{backend}");
        // The injected stall always shows: as a stall retry, or, on
        // io_uring, as a hedge that took the stalled range's rest to a fresh
        // connection first. A loaded machine may add more (a slow answer
        // is indistinguishable from a stall), each a harmless retry.
        assert!(
            s.retries["stalled"] + s.hedges_sent >= 1,
            "{backend}: {:?}, {} hedges",
            s.retries,
            s.hedges_sent
        );
        assert_eq!(
            s.retries["reset"] + s.retries["truncated"],
            2,
            "{backend}: {:?}",
            s.retries
        );
    }
}

/// `n` generated shards of about `bytes` each (samples of ~`bytes / 15`).
fn small_dataset(dir: &std::path::Path, n: usize, bytes: u64, seed: u64) -> (u64, usize) {
    let r = generate(dir, n, bytes, bytes / 15, seed);
    let total = r
        .paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    (total, r.samples as usize)
}

/// Open sizes no shard but the first: the others learn their size from
/// their first ranged read when they come due. Every byte of every shard
/// is read once, on both backends, with shards larger than a read (256 KiB
/// chunks: 224 KiB reads) and smaller than one (1 MiB chunks), and open
/// sends one `HEAD` for the 24 shards.
#[test]
fn remote_shards_are_sized_by_their_first_read_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let (total, samples) = small_dataset(dir.path(), 24, 300_000, 41);
    let server = Server::start(dir.path().to_path_buf());
    let url = server.url("shard-{000000..000023}.tar");
    for backend in ["threads", "io_uring"] {
        for chunk in ["256KiB", "1MiB"] {
            let heads = server.faults.heads.load(Ordering::SeqCst);
            let loader = Loader::open(config(
                vec![url.clone()],
                serde_json::json!({"io_backend": backend, "chunk_size": chunk, "workers": 3}),
            ))
            .unwrap();
            assert_eq!(stream(&loader, 41), samples, "{backend} {chunk}");
            let s = loader.stats();
            assert_eq!(s.bytes_read, total, "{backend} {chunk}: every byte once");
            assert!(s.retries.values().all(|&n| n == 0), "{backend} {chunk}");
            assert_eq!(
                server.faults.heads.load(Ordering::SeqCst) - heads,
                1,
                "{backend} {chunk}: one HEAD, for the first shard"
            );
        }
    }
}

/// What open sends does not grow with the shards: resolving 200 remote
/// shards is one `HEAD` (the first shard's) and no `GET`.
#[test]
fn open_sends_one_request_whatever_the_number_of_shards() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..200 {
        std::fs::write(dir.path().join(format!("s-{i:03}.tar")), [0u8; 1024]).unwrap();
    }
    let server = Server::start(dir.path().to_path_buf());
    let cfg = config(vec![server.url("s-{000..199}.tar")], serde_json::json!({}));
    let net = ringfeed::net::NetOptions::for_config(&cfg);
    let shards = ringfeed::dataset::resolve(&cfg.urls, &net).unwrap();
    assert_eq!(shards.len(), 200);
    let f = &server.faults;
    assert_eq!(
        (
            f.heads.load(Ordering::SeqCst),
            f.gets.load(Ordering::SeqCst)
        ),
        (1, 0)
    );
    // The client's own count: the host's lookup and the HEAD.
    assert_eq!(net.stats.requests.load(Ordering::Relaxed), 2);
    assert_eq!(shards[0].size, Some(1024));
    assert!(shards[1..].iter().all(|s| s.size.is_none()));
}

/// A shard missing when it comes due (after open) is an error naming it,
/// at once (a 404 is not retried), after the batches of the shards before
/// it; never a hang. The first shard missing still fails at open
/// (`errors_that_retrying_cannot_fix_fail_at_once_with_the_url`).
#[test]
fn a_shard_missing_when_it_comes_due_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let made = generate(dir.path(), 4, 100_000, 100_000 / 15, 42);
    std::fs::remove_file(dir.path().join("shard-000002.tar")).unwrap();
    let server = Server::start(dir.path().to_path_buf());
    for backend in ["threads", "io_uring"] {
        let loader = Loader::open(config(
            vec![server.url("shard-{000000..000003}.tar")],
            serde_json::json!({"io_backend": backend, "workers": 1}),
        ))
        .expect("open checks the first shard only");
        let mut before = 0;
        let e = loop {
            match loader.next(Some(std::time::Duration::from_secs(60))) {
                Ok(ringfeed::Next::Batch(b)) => before += b.samples().count(),
                Ok(ringfeed::Next::Timeout) => panic!("{backend}: stalled"),
                Ok(other) => panic!("{backend}: {other:?} instead of the error"),
                Err(e) => break e,
            }
        };
        match &e {
            Error::Http {
                kind: FailKind::Client,
                attempts: 1,
                url,
                message,
            } => {
                assert!(url.ends_with("/shard-000002.tar"), "{backend}: {url}");
                assert!(message.contains("404"), "{backend}: {message}");
            }
            other => panic!("{backend}: {other}"),
        }
        // One worker reads the shards in order: samples of shards 0 and 1
        // only. How many of them come before the error is not fixed (those
        // still in the shuffle buffer or a batch being built when it comes
        // are not delivered).
        let earlier = (made.shard_samples[0] + made.shard_samples[1]) as usize;
        assert!(
            before > 0 && before <= earlier,
            "{backend}: {before} samples delivered before it, of {earlier}"
        );
    }
}

/// A 0-byte object is an empty shard, as a 0-byte local file is (a named
/// tar error, not a network one: its first read learns the size 0 from the
/// 416's `Content-Range: bytes */0`); an archive with no sample (its
/// end-of-archive blocks only) delivers nothing and no error.
#[test]
fn empty_objects_are_sized_like_files() {
    let dir = tempfile::tempdir().unwrap();
    let (_, samples) = small_dataset(dir.path(), 2, 100_000, 43);
    std::fs::write(dir.path().join("blank.tar"), [0u8; 1024]).unwrap();
    std::fs::write(dir.path().join("empty.tar"), []).unwrap();
    let server = Server::start(dir.path().to_path_buf());
    for backend in ["threads", "io_uring"] {
        let extra = serde_json::json!({"io_backend": backend});
        let loader = Loader::open(config(
            vec![server.url("{shard-000000,blank,shard-000001}.tar")],
            extra.clone(),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 43), samples, "{backend}");
        let remote = open_err(extra.clone(), vec![server.url("{shard-000000,empty}.tar")]);
        let local = open_err(
            extra,
            vec![dir.path().join("empty.tar").display().to_string()],
        );
        match (&remote, &local) {
            (Error::Tar { shard, source }, Error::Tar { source: want, .. }) => {
                assert!(shard.ends_with("/empty.tar"), "{backend}: {shard}");
                assert_eq!(source.to_string(), want.to_string(), "{backend}");
            }
            other => panic!("{backend}: {other:?}"),
        }
    }
}

/// A server that answers a ranged `GET` with `200` and the whole object:
/// fine while the object fits in the read (its size is the body's length),
/// a named protocol error when it does not; a `206` without the object's
/// size is a named error for a shard whose size is still unknown.
#[test]
fn answers_without_a_range_or_a_size_are_handled_or_named() {
    let dir = tempfile::tempdir().unwrap();
    let (_, samples) = small_dataset(dir.path(), 3, 300_000, 44);
    let server = Server::start(dir.path().to_path_buf());
    let url = server.url("shard-{000000..000002}.tar");
    for backend in ["threads", "io_uring"] {
        let extra = |chunk: &str| serde_json::json!({"io_backend": backend, "chunk_size": chunk, "workers": 1});
        server.faults.ignore_range.store(true, Ordering::SeqCst);
        let loader = Loader::open(config(vec![url.clone()], extra("1MiB"))).unwrap();
        assert_eq!(stream(&loader, 44), samples, "{backend}");
        let e = open_err(extra("256KiB"), vec![url.clone()]);
        assert!(
            matches!(
                &e,
                Error::Http {
                    kind: FailKind::Protocol,
                    ..
                }
            ) && e.to_string().contains("ignored the Range header"),
            "{backend}: {e}"
        );
        server.faults.ignore_range.store(false, Ordering::SeqCst);
        server.faults.hide_total.store(true, Ordering::SeqCst);
        let e = open_err(extra("1MiB"), vec![url.clone()]);
        match &e {
            Error::Http {
                kind: FailKind::Protocol,
                url,
                message,
                ..
            } => {
                assert!(url.ends_with("/shard-000001.tar"), "{backend}: {url}");
                assert!(message.contains("object's size"), "{backend}: {message}");
            }
            other => panic!("{backend}: {other}"),
        }
        server.faults.hide_total.store(false, Ordering::SeqCst);
    }
}

/// The `HEAD`s that size a list of HTTP shards go out in parallel: a server
/// that answers no `HEAD` until 4 are open at once (or 10 s passed, so a
/// sequential resolver fails the count instead of hanging) still sizes
/// every shard, and saw 4 at once.
#[test]
fn heads_of_a_shard_list_go_out_in_parallel() {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::{Duration, Instant};

    const AT_ONCE: usize = 4;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // (open now, most open at once)
    let state = Arc::new((Mutex::new((0usize, 0usize)), Condvar::new()));
    let st = Arc::clone(&state);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { break };
            let st = Arc::clone(&st);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    // The resolver's own `HEAD` of the first shard is
                    // answered at once.
                    let head = line.starts_with("HEAD ") && !line.contains("/shard-0.");
                    // The rest of the request head.
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    if head {
                        let (lock, cv) = &*st;
                        let mut s = lock.lock().unwrap();
                        s.0 += 1;
                        s.1 = s.1.max(s.0);
                        cv.notify_all();
                        let until = Instant::now() + Duration::from_secs(10);
                        while s.1 < AT_ONCE && Instant::now() < until {
                            s = cv.wait_timeout(s, Duration::from_millis(100)).unwrap().0;
                        }
                        s.0 -= 1;
                    }
                    let answer =
                        "HTTP/1.1 200 OK\r\nContent-Length: 1024\r\nAccept-Ranges: bytes\r\n\r\n";
                    if conn.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let urls = vec![format!("http://127.0.0.1:{port}/shard-{{0..7}}.tar")];
    let cfg = Config::from_json(&serde_json::json!({ "urls": urls }).to_string()).unwrap();
    let net = ringfeed::net::NetOptions::for_config(&cfg);
    let mut shards = ringfeed::dataset::resolve(&urls, &net).unwrap();
    assert_eq!(shards.len(), 8);
    // Open sized the first only; the rest are asked for, as `ringfeed ls` does.
    assert_eq!(shards.iter().filter(|s| s.size.is_some()).count(), 1);
    ringfeed::dataset::head_sizes(&mut shards, &net).unwrap();
    assert!(shards.iter().all(|s| s.size == Some(1024)));
    let most = state.0.lock().unwrap().1;
    assert!(most >= AT_ONCE, "at most {most} HEADs were open at once");
}

/// Every sample's key, in the order delivered.
fn keys_in_order(loader: &Loader) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    loop {
        match loader
            .next(Some(std::time::Duration::from_secs(60)))
            .unwrap()
        {
            ringfeed::Next::Batch(b) => keys.extend(b.samples().map(|s| s.key().to_vec())),
            ringfeed::Next::EndOfEpoch(_) => {}
            ringfeed::Next::Finished => return keys,
            ringfeed::Next::Timeout => panic!("stalled"),
        }
    }
}

#[test]
fn network_threads_receive_for_the_workers_without_changing_the_order() {
    let dir = tempfile::tempdir().unwrap();
    let made = generate(dir.path(), 6, 2 << 20, 40_000, 31);
    let server = Server::start(dir.path().to_path_buf());
    let url = server.url("shard-{000000..000005}.tar");
    let open = |extra: serde_json::Value| {
        let mut cfg = serde_json::json!({"workers": 4, "shuffle": true, "seed": 5});
        cfg.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        Loader::open(config(vec![url.clone()], cfg)).unwrap()
    };
    // The thread backend: each worker receives its own ranges.
    let reference = open(serde_json::json!({"io_backend": "threads"}));
    assert_eq!(reference.stats().net_threads, 0);
    let want = keys_in_order(&reference);
    assert_eq!(want.len() as u64, made.samples);
    for n in [1, 2, 4, 9] {
        let loader = open(serde_json::json!({"io_backend": "io_uring", "net_threads": n}));
        // At most one per worker.
        assert_eq!(loader.stats().net_threads, n.min(4), "net_threads {n}");
        assert!(loader.next(None).is_ok());
        loader.close();
        let loader = open(serde_json::json!({"io_backend": "io_uring", "net_threads": n}));
        assert_eq!(keys_in_order(&loader), want, "net_threads {n}");
        let s = loader.stats();
        assert_eq!(s.samples_delivered, made.samples);
        assert!(s.retries.values().all(|&r| r == 0), "{:?}", s.retries);
    }
    // Local shards need none.
    let local = Loader::open(config(
        vec![format!(
            "{}/shard-{{000000..000005}}.tar",
            dir.path().display()
        )],
        serde_json::json!({"io_backend": "io_uring", "net_threads": 2}),
    ))
    .unwrap();
    assert_eq!(local.stats().net_threads, 0);
    for bad in [
        serde_json::json!(5000),
        serde_json::json!(-1),
        serde_json::json!("two"),
    ] {
        let mut m = serde_json::Map::new();
        m.insert("urls".into(), serde_json::json!([url.clone()]));
        m.insert("net_threads".into(), bad.clone());
        let e = Config::from_map(&m);
        assert!(
            matches!(&e, Err(Error::Config(m)) if m.contains("`net_threads`")),
            "{bad}: {:?}",
            e.err()
        );
    }
}

/// A shard of unknown size after one that filled the read-ahead has its
/// reads sent together, each able to end early: a large shard pays no
/// round trip alone, and a small one after a large one gets `416`s (with
/// the size) for the reads past its end, which deliver nothing. Every byte
/// is read once, on both backends, and the reads in vain stay within the
/// window in the server's count of GETs. How many there are depends on how
/// many of the shard before's reads were still coming when the next
/// shard's began (cross-shard read-ahead fills only the window they
/// leave): none is as right as three, so only the bound is checked.
#[test]
fn reads_of_unsized_shards_after_large_ones_go_out_together() {
    let big = tempfile::tempdir().unwrap();
    let small = tempfile::tempdir().unwrap();
    let seed = 51;
    generate(big.path(), 3, 2 << 20, 20_000, seed);
    generate(small.path(), 8, 100_000, 20_000, seed);
    // Keys are unique across the two sets (shard indices 0-2 and 5-6), and
    // a sample's bytes depend on the seed and its key only.
    let served = tempfile::tempdir().unwrap();
    let order = [
        big.path().join("shard-000000.tar"),
        small.path().join("shard-000005.tar"),
        big.path().join("shard-000001.tar"),
        big.path().join("shard-000002.tar"),
        small.path().join("shard-000006.tar"),
    ];
    let read = 224 << 10; // a 256 KiB chunk's data region
    let mut total = 0u64;
    let mut fewest_gets = 0usize; // one GET per read, none in vain
    for (i, p) in order.iter().enumerate() {
        let len = std::fs::metadata(p).unwrap().len();
        assert!(
            (i % 3 == 1 && len < read) || (i % 3 != 1 && len > 4 * read),
            "shard {i}: {len} bytes"
        );
        total += len;
        fewest_gets += len.div_ceil(read) as usize;
        std::fs::copy(p, served.path().join(format!("s-{i}.tar"))).unwrap();
    }
    let local: Vec<String> = order.iter().map(|p| p.display().to_string()).collect();
    let want = stream(
        &Loader::open(config(local, serde_json::json!({}))).unwrap(),
        seed,
    );
    let server = Server::start(served.path().to_path_buf());
    for backend in ["threads", "io_uring"] {
        let gets = server.faults.gets.load(Ordering::SeqCst);
        let loader = Loader::open(config(
            vec![server.url("s-{0..4}.tar")],
            // GETs are counted: no hedge's twin (a loaded machine can
            // leave a read far behind its peers).
            serde_json::json!({"io_backend": backend, "chunk_size": "256KiB",
                               "reads_in_flight": 4, "workers": 1, "hedge": false}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, seed), want, "{backend}");
        let s = loader.stats();
        assert_eq!(s.bytes_read, total, "{backend}: every byte once");
        assert!(
            s.retries.values().all(|&n| n == 0),
            "{backend}: {:?}",
            s.retries
        );
        let sent = server.faults.gets.load(Ordering::SeqCst) - gets;
        // The two small shards follow large ones: up to 3 reads past the
        // end each.
        assert!(
            sent >= fewest_gets && sent <= fewest_gets + 6,
            "{backend}: {sent} GETs for {fewest_gets} reads"
        );
    }
}

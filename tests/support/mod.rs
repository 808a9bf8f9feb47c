//! A real HTTP/1.1 server for the tests, on 127.0.0.1: serves the files of a
//! directory with `Range` and keep-alive, and injects faults on demand
//! (503 bursts, a request-rate limit, resets and truncation mid-body,
//! stalls, a held head or a body stalled for the n-th GET, slow drip,
//! garbage, ignoring `Range`), so the engine's retries are tested against sockets, not
//! mocks. `s3` is the S3-compatible server, `proxy` puts the same faults
//! in front of any server, `virtual_shards` computes shards on the fly,
//! `store` emulates an object store's latency, bandwidth and throttling,
//! `hub` the Hugging Face Hub (its API, its redirects, its content host).

#![allow(dead_code)]

pub mod cargo;
pub mod hub;
pub mod node;
mod proxy;
pub mod refresh;
pub mod s3;
pub mod skip;
pub mod store;
mod virtual_shards;

// Not every test uses them (as `dead_code` above).
#[allow(unused_imports)]
pub use proxy::Proxy;
#[allow(unused_imports)]
pub use virtual_shards::{VirtualLayout, VirtualShards, virtual_bin_is};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// The error a configuration ends in: at open, or the first one `next`
/// reports (batches and end-of-epoch markers before it are passed over).
/// Panics if the loader finishes, or waits 60 s, without one.
/// Deterministic bytes that differ at every offset, a different run per
/// seed (xorshift64, eight bytes a step).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn first_error(cfg: ringfeed::Config) -> ringfeed::Error {
    use ringfeed::Next;
    match ringfeed::Loader::open(cfg) {
        Err(e) => e,
        Ok(l) => loop {
            match l.next(Some(Duration::from_secs(60))) {
                Ok(Next::Batch(_)) | Ok(Next::EndOfEpoch(_)) => {}
                Ok(other) => panic!("no error: {other:?}"),
                Err(e) => break e,
            }
        },
    }
}

/// Asserts `e` is a TLS failure given up after one attempt (retrying
/// cannot fix it) whose message contains `names` (lower case).
pub fn assert_tls_at_once(e: &ringfeed::Error, names: &str) {
    assert!(
        matches!(
            e,
            ringfeed::Error::Http {
                kind: ringfeed::net::http::FailKind::Tls,
                attempts: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().to_lowercase().contains(names), "{e}");
}

/// Streams a loader to its end; checks each sample arrives once with the
/// generator's bytes for `seed`; returns how many samples came.
/// A configuration of 2 workers and batches of 8 over `urls`, with the
/// keys of `extra` (a JSON object) added.
pub fn two_workers(urls: Vec<String>, extra: serde_json::Value) -> ringfeed::Config {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("batch_size".into(), serde_json::json!(8));
    m.insert("workers".into(), serde_json::json!(2));
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    ringfeed::Config::from_map(&m).unwrap()
}

pub fn stream(loader: &ringfeed::Loader, seed: u64) -> usize {
    stream_paced(loader, seed, Duration::ZERO)
}

/// Reads the loader to its end, pausing `pause` after each batch (a slow
/// consumer); every byte checked against the generator's `seed`, no sample
/// twice. Returns the samples seen.
pub fn stream_paced(loader: &ringfeed::Loader, seed: u64, pause: Duration) -> usize {
    use ringfeed::Next;
    let mut seen = std::collections::BTreeSet::new();
    loop {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            Next::Batch(b) => {
                for s in b.samples() {
                    for (name, data) in s.fields() {
                        assert!(
                            ringfeed::synth::verify(seed, s.key(), name, data),
                            "bad bytes"
                        );
                    }
                    assert!(seen.insert(s.key().to_vec()), "sample twice");
                }
                drop(b);
                std::thread::sleep(pause);
            }
            Next::EndOfEpoch(_) => {}
            Next::Finished => return seen.len(),
            Next::Timeout => panic!("stalled"),
        }
    }
}

/// Faults to inject into the next N ranged GETs, each counter decremented
/// as it fires.
#[derive(Default)]
pub struct Faults {
    /// Answer `503 Slow Down`.
    pub throttle: AtomicUsize,
    /// Answer `500 Internal Error`.
    pub server_error: AtomicUsize,
    /// Send the head and half the body, then reset the connection.
    pub reset: AtomicUsize,
    /// Send the head and half the body, then close cleanly (truncated).
    pub truncate: AtomicUsize,
    /// Send the head and half the body, then go silent for `stall_ms`.
    pub stall: AtomicUsize,
    pub stall_ms: AtomicUsize,
    /// Send every body in 1 KiB pieces with a pause between (all requests).
    pub drip: AtomicBool,
    /// Answer garbage instead of HTTP (all requests).
    pub garbage: AtomicBool,
    /// Ignore `Range` and send the whole file with 200 (all requests).
    pub ignore_range: AtomicBool,
    /// Leave the object's size out of `Content-Range` (`bytes a-b/*`).
    pub hide_total: AtomicBool,
    /// Send no ETag (all requests, HEAD and GET).
    pub no_version: AtomicBool,
    /// Send the ETag weak (`W/"..."`), as servers that compress do.
    pub weak_version: AtomicBool,
    /// Ignore `If-Match` (serve whatever the file holds now), as a server
    /// without conditional requests does.
    pub ignore_if_match: AtomicBool,
    /// GETs answered 412 because `If-Match` named another version.
    pub precondition_failed: AtomicUsize,
    /// Replace a file between the GETs of one read (see [`Replace`]).
    pub replace: std::sync::Mutex<Option<Replace>>,
    /// The ETag of the object each GET answered with bytes (206 or 200)
    /// carried, in the order they were answered: which versions a read
    /// really got.
    pub served: std::sync::Mutex<Vec<String>>,
    /// GET requests seen.
    pub gets: AtomicUsize,
    /// HEAD requests seen.
    pub heads: AtomicUsize,
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// The byte ranges of the ranged GETs, in the order they came.
    pub ranges: std::sync::Mutex<Vec<(u64, u64)>>,
    /// TLS 1.3 only: for this many of the requests read, a key update
    /// asking the client to update its key too (rustls's
    /// `refresh_traffic_keys`) goes before the answer.
    pub key_update: AtomicUsize,
    /// Key updates sent.
    pub key_updates_sent: AtomicUsize,
    /// The proxy's faults drawn at random (`Proxy` only).
    pub random: std::sync::Mutex<Option<RandomFaults>>,
    /// Answer `503 Slow Down` to the GETs past this many a second (0: no
    /// limit), as S3 does past a prefix's request rate: a token bucket
    /// that holds a tenth of a second's worth (so a burst is short and the
    /// limit is a rate, not a count per calendar second).
    pub rate_limit: AtomicUsize,
    /// The rate limit's bucket: tokens, and when it was last filled.
    limiter: std::sync::Mutex<(f64, Option<std::time::Instant>)>,
    /// GETs the rate limit answered 503.
    pub limited: AtomicUsize,
    /// `(n, ms)`: the head of the n-th GET (1 for the first) is sent only
    /// after `ms`.
    pub hold_head: std::sync::Mutex<Option<(usize, u64)>>,
    /// `(n, ms)`: the n-th GET gets its head and half its body, then
    /// silence for `ms`, then the connection closes.
    pub stall_body: std::sync::Mutex<Option<(usize, u64)>>,
    /// `ms`: the GET that asks again for the range whose head `hold_head`
    /// held (a hedge's twin) gets its head and half its body, then silence
    /// for `ms`, then the connection closes.
    pub stall_repeat: std::sync::Mutex<Option<u64>>,
    /// The range of the GET whose head `hold_head` held.
    held_range: std::sync::Mutex<Option<(u64, u64)>>,
    /// Connections accepted from now on keep Nagle's algorithm (no
    /// `TCP_NODELAY`), as Python's `http.server` and many small servers
    /// do: a response's head and body are written apart, and the body's
    /// last short segment waits for the head's ACK. Such a server also
    /// acknowledges each request at once (see `serve`). Read by each
    /// connection as it starts.
    pub nagle: AtomicBool,
    /// Requests of these paths (the query left out) are answered with a
    /// redirect instead: `(path, status, Location)`, a `Location` as it
    /// is sent (relative or absolute).
    pub redirects: std::sync::Mutex<Vec<(String, u16, String)>>,
    /// Every request head, as received, when `record` is set: what a
    /// client sent (its `Authorization`, its `Range`).
    pub record: AtomicBool,
    pub requests: std::sync::Mutex<Vec<String>>,
    /// The n-th GETs (1 for the first) answered `403 Forbidden`, as a
    /// content host answers an expired signed URL.
    pub forbid: std::sync::Mutex<Vec<usize>>,
}

impl Faults {
    /// Answers requests of `path` with a `status` redirect to `location`.
    pub fn redirect(&self, path: &str, status: u16, location: &str) {
        self.redirects
            .lock()
            .unwrap()
            .push((path.to_string(), status, location.to_string()));
    }

    /// The request heads recorded (`record`) whose request line names
    /// `path` (the query left out), lower-cased.
    pub fn requests_of(&self, path: &str) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|h| {
                let target = h.split(' ').nth(1).unwrap_or("");
                target.split('?').next() == Some(path)
            })
            .map(|h| h.to_lowercase())
            .collect()
    }
}

impl Faults {
    /// Whether a GET arriving now is within the rate limit (taking its
    /// token if so).
    fn within_rate(&self) -> bool {
        let limit = self.rate_limit.load(Ordering::SeqCst);
        if limit == 0 {
            return true;
        }
        let cap = (limit as f64 / 10.0).max(1.0);
        let now = std::time::Instant::now();
        let mut b = self.limiter.lock().unwrap();
        let (tokens, last) = *b;
        let tokens = match last {
            Some(t) => (tokens + now.duration_since(t).as_secs_f64() * limit as f64).min(cap),
            None => cap,
        };
        let ok = tokens >= 1.0;
        *b = (if ok { tokens - 1.0 } else { tokens }, Some(now));
        ok
    }
}

/// Whether `hold`, an `(n, ms)` fault, is for the n-th GET: its `ms` if so.
fn nth(hold: &std::sync::Mutex<Option<(usize, u64)>>, n: usize) -> Option<u64> {
    hold.lock()
        .unwrap()
        .filter(|(k, _)| *k == n)
        .map(|(_, ms)| ms)
}

/// A file rewritten under its readers: once `after` GETs of `path` were
/// answered with bytes, its content becomes `with` (written to a temporary
/// file and renamed over it, as an object store replaces an object whole),
/// before the body of the last of them is sent.
pub struct Replace {
    /// The request path, `/shard-000001.tar`.
    pub path: String,
    pub after: usize,
    pub with: Vec<u8>,
    /// GETs of `path` answered so far.
    pub seen: usize,
}

/// The faults a `Proxy` injects at random, from a seed: each GET draws one
/// with probability `per_mille` / 1000. `injected` counts them by kind.
pub struct RandomFaults {
    state: u64,
    pub per_mille: u64,
    /// How long a stalled response stays silent.
    pub stall_ms: u64,
    pub injected: std::collections::BTreeMap<&'static str, usize>,
}

/// The kinds `RandomFaults` draws, and the retry kind the engine counts for
/// each (`None`: not a failure — a slow drip only delays).
pub const RANDOM_FAULTS: &[(&str, Option<&str>)] = &[
    ("slow_down_503", Some("throttled")),
    ("internal_error_500", Some("server_error")),
    ("reset_before_head", Some("reset")),
    ("reset_before_body", Some("reset")),
    ("reset_mid_body", Some("reset")),
    ("truncated_body", Some("truncated")),
    ("stalled_mid_body", Some("stalled")),
    ("stalled_before_head", Some("stalled")),
    ("slow_drip", None),
    ("wrong_content_range", Some("truncated")),
    ("wrong_content_length", Some("truncated")),
];

impl RandomFaults {
    pub fn new(seed: u64, per_mille: u64, stall_ms: u64) -> RandomFaults {
        RandomFaults {
            state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            per_mille,
            stall_ms,
            injected: Default::default(),
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The fault for the next GET, if any.
    fn draw(&mut self) -> Option<&'static str> {
        if self.next() % 1000 >= self.per_mille {
            return None;
        }
        let kind = RANDOM_FAULTS[(self.next() % RANDOM_FAULTS.len() as u64) as usize].0;
        *self.injected.entry(kind).or_default() += 1;
        Some(kind)
    }
}

/// SO_LINGER 0: closing `fd` then sends RST instead of FIN.
fn reset_on_close(fd: i32) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a linger struct of the right size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
}

fn take(c: &AtomicUsize) -> bool {
    c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

pub struct Server {
    pub addr: SocketAddr,
    pub faults: Arc<Faults>,
    stop: Arc<AtomicBool>,
}

impl Server {
    pub fn start(root: PathBuf) -> Server {
        Server::start_with(root, None)
    }

    /// An https server with a fresh self-signed certificate for `localhost`
    /// and 127.0.0.1; returns it and the certificate as PEM.
    pub fn start_tls(root: PathBuf) -> (Server, String) {
        Server::start_tls_versions(root, rustls::DEFAULT_VERSIONS)
    }

    /// As [`Server::start_tls`], speaking only TLS 1.2.
    pub fn start_tls12(root: PathBuf) -> (Server, String) {
        Server::start_tls_versions(root, &[&rustls::version::TLS12])
    }

    fn start_tls_versions(
        root: PathBuf,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> (Server, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = cert.pem();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        (Server::start_with(root, Some(Arc::new(config))), pem)
    }

    fn start_with(root: PathBuf, tls: Option<Arc<rustls::ServerConfig>>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let faults = Arc::new(Faults::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (Arc::clone(&faults), Arc::clone(&stop));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                f.connections.fetch_add(1, Ordering::SeqCst);
                let (root, f, tls) = (root.clone(), Arc::clone(&f), tls.clone());
                std::thread::spawn(move || {
                    use std::os::fd::AsRawFd;
                    let fd = conn.as_raw_fd();
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
                    if !f.nagle.load(Ordering::SeqCst) {
                        let _ = conn.set_nodelay(true);
                    }
                    match tls {
                        None => serve(conn, fd, &root, &f),
                        Some(cfg) => {
                            let Ok(sc) = rustls::ServerConnection::new(cfg) else {
                                return;
                            };
                            let stream = KeyUpdating {
                                tls: rustls::StreamOwned::new(sc, conn),
                                faults: Arc::clone(&f),
                            };
                            serve(stream, fd, &root, &f)
                        }
                    }
                });
            }
        });
        Server { addr, faults, stop }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path)
    }

    pub fn https_url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}/{}", self.addr.port(), path)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// A TLS server stream that sends a key update (asking for one back) when
/// it reads a request while [`Faults::key_update`] says so.
struct KeyUpdating {
    tls: rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>,
    faults: Arc<Faults>,
}

impl Read for KeyUpdating {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.tls.read(buf)?;
        let f = &self.faults;
        if n > 0
            && f.key_update
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1))
                .is_ok()
        {
            self.tls
                .conn
                .refresh_traffic_keys()
                .map_err(std::io::Error::other)?;
            f.key_updates_sent.fetch_add(1, Ordering::SeqCst);
        }
        Ok(n)
    }
}

impl Write for KeyUpdating {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tls.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tls.flush()
    }
}

fn serve(mut conn: impl Read + Write, fd: i32, root: &std::path::Path, f: &Faults) {
    let mut buf = Vec::new();
    loop {
        // Read one request head.
        let (method, path, range, if_match, head_len) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                let if_match = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("if-match"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .map(|v| v.trim().to_string());
                let range = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("range"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .and_then(|v| v.strip_prefix("bytes="))
                    .and_then(|v| v.split_once('-'))
                    .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
                if f.record.load(Ordering::SeqCst) {
                    f.requests
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                }
                break (
                    req.method.unwrap_or("").to_string(),
                    req.path.unwrap_or("").to_string(),
                    range,
                    if_match,
                    n,
                );
            }
            let mut tmp = [0u8; 4096];
            match conn.read(&mut tmp) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
            if f.nagle.load(Ordering::SeqCst) {
                // The request is acknowledged at once: a Nagle server's own
                // ACKs are not what tests/delayed_ack.rs counts (they ride
                // on the answer, or on the delayed-ACK timer where a loaded
                // machine holds the answer past it).
                let one: libc::c_int = 1;
                // SAFETY: `fd` is this connection's socket; a c_int option.
                unsafe {
                    libc::setsockopt(
                        fd,
                        libc::IPPROTO_TCP,
                        libc::TCP_QUICKACK,
                        (&raw const one).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    );
                }
            }
        };
        buf.drain(..head_len);
        if f.garbage.load(Ordering::SeqCst) {
            let _ = conn.write_all(b"SSH-2.0-OpenSSH_9.2\r\n\r\n\r\n");
            return;
        }
        let redirect = {
            let bare = path.split('?').next().unwrap_or("");
            f.redirects
                .lock()
                .unwrap()
                .iter()
                .find(|(p, _, _)| p == bare)
                .map(|(_, status, to)| (*status, to.clone()))
        };
        if let Some((status, to)) = redirect {
            let body: &[u8] = if method == "HEAD" {
                b""
            } else {
                b"redirecting"
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status} Redirect\r\nLocation: {to}\r\nContent-Length: 11\r\n\r\n"
            );
            let _ = conn.write_all(body);
            continue;
        }
        // The query (a presigned URL's) names no file.
        let file = root.join(path.split('?').next().unwrap_or("").trim_start_matches('/'));
        let data = if path.contains("forbidden") {
            let _ = conn.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
            continue;
        } else {
            match std::fs::read(&file) {
                Ok(d) => d,
                Err(_) => {
                    let body = b"<Error><Code>NoSuchKey</Code></Error>";
                    let _ = error_answer(&mut conn, "404 Not Found", body);
                    continue;
                }
            }
        };
        // A strong ETag from the content, as S3 gives: a rewritten object
        // has another.
        let tag = (!f.no_version.load(Ordering::SeqCst)).then(|| {
            let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &data);
            match f.weak_version.load(Ordering::SeqCst) {
                true => format!("W/\"{crc:08x}\""),
                false => format!("\"{crc:08x}\""),
            }
        });
        let etag = match &tag {
            Some(t) => format!("ETag: {t}\r\n"),
            None => String::new(),
        };
        if method == "HEAD" {
            f.heads.fetch_add(1, Ordering::SeqCst);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{etag}\r\n",
                data.len()
            );
            continue;
        }
        let n = f.gets.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(r) = range {
            f.ranges.lock().unwrap().push(r);
        }
        if f.forbid.lock().unwrap().contains(&n) {
            let _ = error_answer(&mut conn, "403 Forbidden", b"Request has expired");
            continue;
        }
        if !f.within_rate() {
            f.limited.fetch_add(1, Ordering::SeqCst);
            let _ = error_answer(&mut conn, "503 Slow Down", SLOW_DOWN);
            continue;
        }
        if take(&f.throttle) {
            let _ = error_answer(&mut conn, "503 Slow Down", SLOW_DOWN);
            continue;
        }
        if take(&f.server_error) {
            let _ = conn.write_all(b"HTTP/1.1 500 Internal Error\r\nContent-Length: 0\r\n\r\n");
            continue;
        }
        // RFC 9110 §13.1.1: `If-Match` holds when the current version's
        // strong ETag is one of those listed (or `*`); a weak one never
        // matches.
        if let Some(want) = &if_match
            && !f.ignore_if_match.load(Ordering::SeqCst)
        {
            let holds = want.trim() == "*"
                || tag.as_ref().is_some_and(|t| {
                    !t.starts_with("W/") && want.split(',').any(|w| w.trim() == t)
                });
            if !holds {
                f.precondition_failed.fetch_add(1, Ordering::SeqCst);
                let _ = conn
                    .write_all(b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n");
                continue;
            }
        }
        // As RFC 9110 says: an end past the object is clamped to it, a
        // start at or past it is unsatisfiable (416 with the size).
        let (status, body) = match range {
            Some((a, b))
                if !f.ignore_range.load(Ordering::SeqCst)
                    && a <= b
                    && (a as usize) < data.len() =>
            {
                let b = b.min(data.len() as u64 - 1);
                let total = if f.hide_total.load(Ordering::SeqCst) {
                    "*".to_string()
                } else {
                    data.len().to_string()
                };
                (
                    format!("206 Partial Content\r\nContent-Range: bytes {a}-{b}/{total}"),
                    &data[a as usize..=b as usize],
                )
            }
            Some(_) if !f.ignore_range.load(Ordering::SeqCst) => {
                let _ = write!(
                    conn,
                    "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{}\r\n\
                     Content-Length: 0\r\n\r\n",
                    data.len()
                );
                continue;
            }
            _ => ("200 OK".to_string(), &data[..]),
        };
        f.served
            .lock()
            .unwrap()
            .push(tag.clone().unwrap_or_default());
        if let Some(r) = f.replace.lock().unwrap().as_mut()
            && r.path == path
        {
            r.seen += 1;
            if r.seen == r.after {
                let tmp = file.with_extension("replacing");
                std::fs::write(&tmp, &r.with).unwrap();
                std::fs::rename(&tmp, &file).unwrap();
            }
        }
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{etag}\r\n",
            body.len()
        );
        let repeat = f
            .stall_repeat
            .lock()
            .unwrap()
            .filter(|_| range.is_some() && *f.held_range.lock().unwrap() == range);
        if let Some(ms) = nth(&f.hold_head, n) {
            *f.held_range.lock().unwrap() = range;
            std::thread::sleep(Duration::from_millis(ms));
        }
        if conn.write_all(head.as_bytes()).is_err() {
            return;
        }
        let half = body.len() / 2;
        if let Some(ms) = nth(&f.stall_body, n).or(repeat) {
            let _ = conn.write_all(&body[..half]);
            let _ = conn.flush();
            std::thread::sleep(Duration::from_millis(ms));
            return;
        }
        if take(&f.reset) {
            let _ = conn.write_all(&body[..half]);
            reset_on_close(fd);
            return;
        }
        if take(&f.truncate) {
            let _ = conn.write_all(&body[..half]);
            let _ = conn.flush();
            // SAFETY: shutting down a socket we are serving.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            return;
        }
        if take(&f.stall) {
            let _ = conn.write_all(&body[..half]);
            std::thread::sleep(Duration::from_millis(
                f.stall_ms.load(Ordering::SeqCst) as u64
            ));
            return;
        }
        if f.drip.load(Ordering::SeqCst) {
            for piece in body.chunks(1024) {
                if conn.write_all(piece).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        } else if conn.write_all(body).is_err() {
            return;
        }
    }
}

/// Reads one HTTP head (request or response) from `s` into `buf`; returns
/// its length, or None at EOF.
fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>, response: bool) -> Option<usize> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let done = if response {
            httparse::Response::new(&mut headers).parse(buf)
        } else {
            httparse::Request::new(&mut headers).parse(buf)
        };
        if let Ok(httparse::Status::Complete(n)) = done {
            return Some(n);
        }
        let mut tmp = [0u8; 8192];
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

fn content_length(head: &[u8]) -> usize {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let _ = r.parse(head);
    r.headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

/// `Content-Range: bytes a-b/t` as another valid range of the object: one
/// byte earlier, or (at its start) one byte shorter.
fn shift_range(line: &str) -> String {
    let parsed = line.split_once("bytes ").and_then(|(_, v)| {
        let (range, total) = v.split_once('/')?;
        let (a, b) = range.split_once('-')?;
        Some((
            a.trim().parse::<u64>().ok()?,
            b.trim().parse::<u64>().ok()?,
            total.to_string(),
        ))
    });
    match parsed {
        Some((a, b, total)) if a > 0 => format!("Content-Range: bytes {}-{}/{total}", a - 1, b - 1),
        Some((a, b, total)) if b > a => format!("Content-Range: bytes {a}-{}/{total}", b - 1),
        _ => line.to_string(),
    }
}

/// S3's answer to too many requests.
const SLOW_DOWN: &[u8] =
    b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>";

/// An error status with its body.
fn error_answer(w: &mut impl Write, status: &str, body: &[u8]) -> std::io::Result<()> {
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )?;
    w.write_all(body)
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a time (civil-from-days, Howard Hinnant's).
pub fn iso(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

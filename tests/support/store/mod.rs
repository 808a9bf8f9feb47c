//! An object-store emulator on 127.0.0.1 for the tests and benchmarks: it
//! serves a directory the way S3 performs, not the way loopback does. Run
//! alone by `examples/store_emulator.rs` (whose doc lists the options).
//!
//! What it serves, from one root:
//!
//! - plain HTTP: `GET`/`HEAD /path` of a file under the root, one `Range`
//!   (`bytes=A-B`, `A-`, `-N`) answered 206 with `Content-Range`, 416 with
//!   `Content-Range: bytes */SIZE` when unsatisfiable; a strong `ETag` (the
//!   file's size and modification time) and `If-Match` answered 412 when it
//!   names another.
//! - path-style S3, each folder of the root a bucket: GetObject and
//!   HeadObject are the same answers at `/bucket/key`; ListObjectsV2 at
//!   `GET /bucket?list-type=2` (prefix, delimiter, max-keys, start-after,
//!   continuation tokens; V1's `marker` too, answered in V2's XML with a
//!   `NextMarker`); errors
//!   as S3's XML (`NoSuchKey`, `NoSuchBucket`,
//!   `InvalidRange`, `PreconditionFailed`, `SlowDown`). A request is taken
//!   as S3's when it carries `Authorization`, an `x-amz-*` header or an S3
//!   query (`list-type`): its errors are XML, others' plain text.
//!
//! Any `Authorization` is accepted and never verified: the emulator models
//! performance, not authentication (`examples/s3_server.rs` is the server
//! that verifies SigV4).
//!
//! The models (`Options`, each off with `None`):
//!
//! - first-byte latency: every request waits a draw of a lognormal
//!   (median, p99) before its answer's head;
//! - per-connection bandwidth: each connection's body bytes are paced by
//!   its own token bucket (a small burst, [`CONN_BURST`]), so many
//!   connections interleave smoothly;
//! - per-object bandwidth: every connection reading one file shares one
//!   more bucket, as one stored part of S3 serves about 10 Gbit/s;
//! - request-rate limit: one bucket of requests per prefix (the first path
//!   segment under the bucket, or the bucket for keys at its top; or per
//!   bucket), past which requests are answered 503 (`SlowDown` for S3);
//! - stalls: a GET's body stops for a while halfway, with a probability,
//!   or for the Nth GETs named (deterministic, for tests).
//!
//! Bodies are slices of the file's memory mapping handed to hyper, so the
//! bytes go from the page cache to the socket by the kernel's one copy; a
//! file must not be truncated while it is served. Counters (`stats`) are
//! served at `GET /_emulator/stats` as JSON and zeroed by `GET` or
//! `POST /_emulator/reset` (which answers the counts it zeroed).
//!
//! `model` holds the pure cores (the latency distribution, the token
//! bucket, the parsers), `xml` S3's documents, `stats` the counters, `body`
//! the paced answer. Included by the test crates through
//! `tests/support/mod.rs` and by `examples/store_emulator.rs` through
//! `#[path]`, so it uses nothing else of `support`.

#![allow(dead_code)]

pub mod body;
pub mod model;
pub mod stats;
pub mod xml;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use rand::{Rng, SeedableRng};

use body::{Pace, Reply, Stall, Transfer};
use model::{Lognormal, TokenBucket};
use stats::{Counters, Snapshot};

/// A connection's burst: four paced frames (2.9 ms at 90 MB/s), enough to
/// ride over the timer's millisecond granularity, small enough that the
/// rate holds over any few milliseconds.
pub const CONN_BURST: f64 = (256 << 10) as f64;
/// An object's burst: a few connections' worth of frames at once.
pub const OBJECT_BURST: f64 = (1 << 20) as f64;

/// What the request-rate limit counts requests by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateScope {
    /// `bucket/first-segment` (a key at the top of the bucket: `bucket`),
    /// as S3 partitions a bucket's request rate by prefix.
    Prefix,
    Bucket,
}

/// The models; `None` turns one off. `Default` is S3's shape without its
/// latency: 90 MB/s a connection, 1250 MB/s an object, 5,500 requests a
/// second a prefix.
#[derive(Clone, Debug)]
pub struct Options {
    pub latency: Option<Lognormal>,
    /// Bytes a second, per connection.
    pub conn_rate: Option<f64>,
    /// Bytes a second, per file, shared by every connection reading it.
    pub object_rate: Option<f64>,
    /// Requests a second and the burst, per `rate_scope`.
    pub rate_limit: Option<(f64, f64)>,
    pub rate_scope: RateScope,
    /// Probability per GET, and how long its body stops halfway.
    pub stall: Option<(f64, Duration)>,
    /// The Nth GETs (1-based, counted since start or reset) that stall
    /// halfway, and for how long.
    pub stall_gets: Vec<(u64, Duration)>,
    /// Runtime worker threads.
    pub threads: usize,
    /// Seed of the latency and stall draws.
    pub seed: u64,
}

/// The machine the emulator was written for has 2 CPUs, shared with the
/// client: two workers can use both when the client waits, and no more
/// would help.
pub const DEFAULT_THREADS: usize = 2;

impl Default for Options {
    fn default() -> Options {
        Options {
            latency: None,
            // About what one S3 connection carries (85-90 MB/s).
            conn_rate: Some(90e6),
            // About 10 Gbit/s, what one stored part of S3 serves.
            object_rate: Some(1250e6),
            // S3's documented GETs a second per prefix, a tenth of a
            // second's worth as burst.
            rate_limit: Some((5500.0, 550.0)),
            rate_scope: RateScope::Prefix,
            stall: None,
            stall_gets: Vec::new(),
            threads: DEFAULT_THREADS,
            seed: 0,
        }
    }
}

impl Options {
    /// Every model off: a plain fast server of the same answers.
    pub fn unlimited() -> Options {
        Options {
            conn_rate: None,
            object_rate: None,
            rate_limit: None,
            ..Options::default()
        }
    }

    /// Applies one command-line option (`--latency 20ms:120ms`, ...).
    /// `Ok(false)`: not one of the models' options.
    pub fn set(&mut self, flag: &str, v: &str) -> Result<bool, String> {
        let off = v == "off";
        let named = |e: String| format!("{flag} {v}: {e}");
        match flag {
            "--latency" => {
                self.latency = if off {
                    None
                } else {
                    let (m, p) = v.split_once(':').unwrap_or((v, v));
                    let m = model::parse_duration(m).map_err(named)?;
                    let p = model::parse_duration(p).map_err(named)?;
                    Some(Lognormal::from_median_p99(m, p).map_err(named)?)
                }
            }
            "--conn-rate" | "--object-rate" => {
                let rate = if off {
                    None
                } else {
                    let r = model::parse_bytes_rate(v).map_err(named)?;
                    if r <= 0.0 {
                        return Err(named("a rate above zero, or off".into()));
                    }
                    Some(r)
                };
                if flag == "--conn-rate" {
                    self.conn_rate = rate;
                } else {
                    self.object_rate = rate;
                }
            }
            "--rate-limit" => {
                self.rate_limit = if off {
                    None
                } else {
                    Some(model::parse_request_rate(v).map_err(named)?)
                }
            }
            "--rate-scope" => {
                self.rate_scope = match v {
                    "prefix" => RateScope::Prefix,
                    "bucket" => RateScope::Bucket,
                    _ => return Err(named("prefix or bucket".into())),
                }
            }
            "--stall" => {
                self.stall = if off {
                    None
                } else {
                    let (p, d) = v
                        .split_once(':')
                        .ok_or_else(|| named("not P:DURATION (e.g. 0.001:5s)".into()))?;
                    let p: f64 = p
                        .parse()
                        .ok()
                        .filter(|p| (0.0..=1.0).contains(p))
                        .ok_or_else(|| named("the probability must be in [0, 1]".into()))?;
                    Some((p, model::parse_duration(d).map_err(named)?))
                }
            }
            "--stall-get" => {
                let (n, d) = v
                    .split_once(':')
                    .ok_or_else(|| named("not N:DURATION (e.g. 3:5s)".into()))?;
                let n: u64 = n
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| named("N counts GETs from 1".into()))?;
                self.stall_gets
                    .push((n, model::parse_duration(d).map_err(named)?));
            }
            "--threads" => {
                self.threads = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| named("not a positive number".into()))?;
            }
            "--seed" => self.seed = v.parse().map_err(|_| named("not a number".into()))?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A file mapped and what its answers say of it.
struct Mapped {
    data: Bytes,
    mtime_ns: u128,
    etag: String,
    last_modified: String,
}

/// What the handlers share.
pub struct State {
    root: PathBuf,
    opts: Options,
    start: Instant,
    pub counters: Counters,
    rng: Mutex<rand::rngs::StdRng>,
    /// Mapped files by path, remapped when the size or time changes. One
    /// entry per file served: the benchmarks' few thousand at most.
    files: Mutex<HashMap<PathBuf, Arc<Mapped>>>,
    objects: Mutex<HashMap<PathBuf, Arc<Mutex<TokenBucket>>>>,
    rates: Mutex<HashMap<String, TokenBucket>>,
    /// GETs since start or reset, for `stall_gets`. Relaxed: a ticket
    /// number, nothing else is published with it.
    gets_seen: AtomicU64,
    request_ids: AtomicU64,
}

impl State {
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn request_id(&self) -> u64 {
        self.request_ids.fetch_add(1, Ordering::Relaxed)
    }

    fn reset(&self) {
        self.counters.reset(self.now_ns());
        self.gets_seen.store(0, Ordering::Relaxed);
        self.rates.lock().unwrap().clear();
        self.objects.lock().unwrap().clear();
    }

    fn mapped(&self, path: &Path, meta: &std::fs::Metadata) -> std::io::Result<Arc<Mapped>> {
        let mtime = meta.modified()?;
        let since = mtime
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let mtime_ns = since.as_nanos();
        if let Some(m) = self.files.lock().unwrap().get(path) {
            if m.data.len() as u64 == meta.len() && m.mtime_ns == mtime_ns {
                return Ok(m.clone());
            }
        }
        let data = if meta.len() == 0 {
            Bytes::new()
        } else {
            let file = std::fs::File::open(path)?;
            // SAFETY: the emulator's contract (module doc) is that files
            // under its root are not truncated while served; the mapping
            // is read-only and lives as long as the `Bytes` that own it.
            let map = unsafe { memmap2::Mmap::map(&file)? };
            Bytes::from_owner(map)
        };
        let m = Arc::new(Mapped {
            etag: format!("\"{:x}-{:x}\"", meta.len(), mtime_ns),
            last_modified: model::http_date(since.as_secs() as i64),
            data,
            mtime_ns,
        });
        self.files
            .lock()
            .unwrap()
            .insert(path.to_path_buf(), m.clone());
        Ok(m)
    }

    fn object_bucket(&self, path: &Path) -> Option<Arc<Mutex<TokenBucket>>> {
        let rate = self.opts.object_rate?;
        let now = self.now_ns();
        let mut objects = self.objects.lock().unwrap();
        Some(
            objects
                .entry(path.to_path_buf())
                .or_insert_with(|| Arc::new(Mutex::new(TokenBucket::new(rate, OBJECT_BURST, now))))
                .clone(),
        )
    }

    /// Whether the request on `segments` is within the rate limit.
    fn admitted(&self, segments: &[String]) -> bool {
        let Some((rate, burst)) = self.opts.rate_limit else {
            return true;
        };
        let key = match (self.opts.rate_scope, segments) {
            (RateScope::Prefix, [b, p, _, ..]) => format!("{b}/{p}"),
            (_, [b, ..]) => b.clone(),
            (_, []) => String::new(),
        };
        let now = self.now_ns();
        let mut rates = self.rates.lock().unwrap();
        rates
            .entry(key)
            .or_insert_with(|| TokenBucket::new(rate, burst, now))
            .try_take(1.0, now)
    }

    fn latency(&self) -> Option<Duration> {
        let l = self.opts.latency?;
        let mut rng = self.rng.lock().unwrap();
        Some(l.sample(rng.random(), rng.random()))
    }

    /// The stall this GET gets, if any.
    fn stall(&self, len: usize) -> Option<Stall> {
        let n = self.gets_seen.fetch_add(1, Ordering::Relaxed) + 1;
        let pause = self
            .opts
            .stall_gets
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(_, d)| *d)
            .or_else(|| {
                let (p, d) = self.opts.stall?;
                (self.rng.lock().unwrap().random::<f64>() < p).then_some(d)
            })?;
        (len > 0).then_some(Stall {
            at_remaining: len / 2,
            pause,
        })
    }
}

/// The emulator, serving until dropped.
pub struct StoreEmulator {
    addr: SocketAddr,
    state: Arc<State>,
    _runtime: tokio::runtime::Runtime,
}

impl StoreEmulator {
    /// Serves `root` on a free port.
    pub fn start(root: &Path, opts: Options) -> std::io::Result<StoreEmulator> {
        StoreEmulator::start_on(root, 0, opts)
    }

    pub fn start_on(root: &Path, port: u16, opts: Options) -> std::io::Result<StoreEmulator> {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use hyper_util::server::conn::auto::Builder as ConnBuilder;

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.threads)
            .enable_all()
            .build()?;
        let state = Arc::new(State {
            root: root.to_path_buf(),
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(opts.seed)),
            opts,
            start: Instant::now(),
            counters: Counters::default(),
            files: Mutex::default(),
            objects: Mutex::default(),
            rates: Mutex::default(),
            gets_seen: AtomicU64::new(0),
            request_ids: AtomicU64::new(0),
        });
        let listener = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))?;
        let addr = listener.local_addr()?;
        let st = state.clone();
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let conn = st
                    .opts
                    .conn_rate
                    .map(|r| Arc::new(Mutex::new(TokenBucket::new(r, CONN_BURST, st.now_ns()))));
                let st = st.clone();
                let service = hyper::service::service_fn(move |req| {
                    let (st, conn) = (st.clone(), conn.clone());
                    async move { Ok::<_, Infallible>(handle(st, conn, req).await) }
                });
                let conn = http
                    .serve_connection(TokioIo::new(socket), service)
                    .into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        Ok(StoreEmulator {
            addr,
            state,
            _runtime: runtime,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> Snapshot {
        self.state.counters.snapshot(self.state.now_ns())
    }

    /// Zeroes the counters, the rate buckets and the GET count of
    /// `stall_gets`.
    pub fn reset(&self) {
        self.state.reset();
    }
}

fn is_s3(req: &Request<Incoming>) -> bool {
    req.headers().contains_key(header::AUTHORIZATION)
        || req
            .headers()
            .keys()
            .any(|k| k.as_str().starts_with("x-amz-"))
        || req.uri().query().is_some_and(|q| q.contains("list-type"))
}

/// The query's pairs, percent-decoded (`+` as a space).
fn query_pairs(q: &str) -> HashMap<String, String> {
    let dec = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (dec(k), dec(v))
        })
        .collect()
}

/// An error answer: S3's XML to S3's requests, plain text to others.
fn error(
    st: &State,
    s3: bool,
    status: StatusCode,
    code: &str,
    message: &str,
    resource: &str,
) -> Response<Reply> {
    let (body, kind) = if s3 {
        (
            xml::error(code, message, resource, st.request_id()),
            "application/xml",
        )
    } else {
        (format!("{message}\n"), "text/plain")
    };
    let mut r = Response::new(Reply::text(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

async fn handle(
    st: Arc<State>,
    conn: Option<Arc<Mutex<TokenBucket>>>,
    req: Request<Incoming>,
) -> Response<Reply> {
    let path = req.uri().path().to_string();
    if let Some(what) = path.strip_prefix("/_emulator/") {
        return control(&st, what, req.method());
    }
    let transfer = Transfer::begin(&st);
    Counters::add(&st.counters.requests, 1);
    let s3 = is_s3(&req);
    if let Some(wait) = st.latency() {
        tokio::time::sleep(wait).await;
    }
    let r = answer(&st, conn, &req, &path, s3, &transfer);
    match r {
        Answer::Done(r) => (*r).map(|b| b.holding(transfer)),
        Answer::Object(build) => build(transfer),
    }
}

/// An answer whose body holds the transfer until it is sent.
enum Answer {
    Done(Box<Response<Reply>>),
    Object(Box<dyn FnOnce(Transfer) -> Response<Reply> + Send>),
}

fn control(st: &State, what: &str, method: &Method) -> Response<Reply> {
    let json = |s: &Snapshot| serde_json::to_string(s).unwrap_or_default();
    let (status, body) = match (what, method) {
        ("stats", &Method::GET) => (StatusCode::OK, json(&st.counters.snapshot(st.now_ns()))),
        ("reset", &Method::GET | &Method::POST) => {
            let before = st.counters.snapshot(st.now_ns());
            st.reset();
            (StatusCode::OK, json(&before))
        }
        _ => (
            StatusCode::NOT_FOUND,
            "{\"error\": \"/_emulator/stats or /_emulator/reset\"}".into(),
        ),
    };
    let mut r = Response::new(Reply::text(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn answer(
    st: &Arc<State>,
    conn: Option<Arc<Mutex<TokenBucket>>>,
    req: &Request<Incoming>,
    path: &str,
    s3: bool,
    _transfer: &Transfer,
) -> Answer {
    let done = |r: Response<Reply>| Answer::Done(Box::new(r));
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    if segments
        .iter()
        .any(|s| s == ".." || s == "." || s.contains('\0'))
    {
        return done(error(
            st,
            s3,
            StatusCode::BAD_REQUEST,
            "InvalidURI",
            "the path leaves the root",
            path,
        ));
    }
    if !st.admitted(&segments) {
        Counters::add(&st.counters.slow_down, 1);
        return done(error(
            st,
            s3,
            StatusCode::SERVICE_UNAVAILABLE,
            "SlowDown",
            "Please reduce your request rate.",
            path,
        ));
    }
    let method = req.method();
    if method != Method::GET && method != Method::HEAD {
        return done(error(
            st,
            s3,
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "the emulator serves GET and HEAD only",
            path,
        ));
    }
    let query = query_pairs(req.uri().query().unwrap_or(""));
    if segments.len() == 1 && (s3 || query.contains_key("list-type")) {
        return done(bucket(st, s3, method, &segments[0], &query, path));
    }
    let file = segments.iter().fold(st.root.clone(), |p, s| p.join(s));
    let meta = match std::fs::metadata(&file) {
        Ok(m) if m.is_file() => m,
        _ => {
            Counters::add(&st.counters.not_found, 1);
            let no_bucket = s3 && !segments.first().is_some_and(|b| st.root.join(b).is_dir());
            let (code, msg) = if no_bucket {
                ("NoSuchBucket", "The specified bucket does not exist")
            } else {
                ("NoSuchKey", "The specified key does not exist.")
            };
            return done(error(st, s3, StatusCode::NOT_FOUND, code, msg, path));
        }
    };
    let m = match st.mapped(&file, &meta) {
        Ok(m) => m,
        Err(e) => {
            return done(error(
                st,
                s3,
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                &format!("{}: {e}", file.display()),
                path,
            ));
        }
    };
    if let Some(want) = req.headers().get(header::IF_MATCH) {
        let want = want.to_str().unwrap_or("");
        let hit = want
            .split(',')
            .map(str::trim)
            .any(|t| t == "*" || t == m.etag);
        if !hit {
            Counters::add(&st.counters.precondition_failed, 1);
            return done(error(
                st,
                s3,
                StatusCode::PRECONDITION_FAILED,
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
                path,
            ));
        }
    }
    let size = m.data.len() as u64;
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_range(v, size));
    let (status, start, end) = match range {
        None => (StatusCode::OK, 0, size),
        Some(Ok((a, b))) => (StatusCode::PARTIAL_CONTENT, a, b),
        Some(Err(())) => {
            Counters::add(&st.counters.range_not_satisfiable, 1);
            let mut r = error(
                st,
                s3,
                StatusCode::RANGE_NOT_SATISFIABLE,
                "InvalidRange",
                "The requested range is not satisfiable",
                path,
            );
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return done(r);
        }
    };
    let head = |r: &mut Response<Reply>| {
        *r.status_mut() = status;
        let h = r.headers_mut();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        if let Ok(v) = HeaderValue::from_str(&m.etag) {
            h.insert(header::ETAG, v);
        }
        if let Ok(v) = HeaderValue::from_str(&m.last_modified) {
            h.insert(header::LAST_MODIFIED, v);
        }
        if status == StatusCode::PARTIAL_CONTENT {
            let cr = format!("bytes {start}-{}/{size}", end - 1);
            if let Ok(v) = HeaderValue::from_str(&cr) {
                h.insert(header::CONTENT_RANGE, v);
            }
        }
    };
    if method == Method::HEAD {
        Counters::add(&st.counters.heads, 1);
        let mut r = Response::new(Reply::empty());
        head(&mut r);
        return done(r);
    }
    Counters::add(&st.counters.gets, 1);
    let data = m.data.slice(start as usize..end as usize);
    let stall = st.stall(data.len());
    let pace = Pace {
        connection: conn,
        object: st.object_bucket(&file),
    };
    let mut r = Response::new(Reply::empty());
    head(&mut r);
    let st = st.clone();
    Answer::Object(Box::new(move |transfer| {
        r.map(|_| Reply::object(data, pace, stall, st, transfer))
    }))
}

/// `bytes=A-B`, `bytes=A-`, `bytes=-N` against `size`: `None` when there
/// is no single byte range to honour (the whole object is sent, as HTTP
/// allows), `Err` when it is unsatisfiable. Returns `[start, end)`.
pub fn parse_range(v: &str, size: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = v.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let r = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        if n == 0 || size == 0 {
            Err(())
        } else {
            Ok((size.saturating_sub(n), size))
        }
    } else {
        let a: u64 = a.parse().ok()?;
        let b: Option<u64> = if b.is_empty() {
            None
        } else {
            Some(b.parse().ok()?)
        };
        if b.is_some_and(|b| b < a) {
            return None;
        }
        if a >= size {
            Err(())
        } else {
            Ok((a, b.map_or(size, |b| (b + 1).min(size))))
        }
    };
    Some(r)
}

/// ListObjectsV2 (GET) and HeadBucket (HEAD) on `/bucket`.
fn bucket(
    st: &State,
    s3: bool,
    method: &Method,
    name: &str,
    q: &HashMap<String, String>,
    path: &str,
) -> Response<Reply> {
    let dir = st.root.join(name);
    if !dir.is_dir() {
        Counters::add(&st.counters.not_found, 1);
        return error(
            st,
            s3,
            StatusCode::NOT_FOUND,
            "NoSuchBucket",
            "The specified bucket does not exist",
            path,
        );
    }
    if method == Method::HEAD {
        Counters::add(&st.counters.heads, 1);
        return Response::new(Reply::empty());
    }
    Counters::add(&st.counters.lists, 1);
    let mut entries = Vec::new();
    walk(&dir, "", &mut entries);
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    let max_keys = q
        .get("max-keys")
        .and_then(|m| m.parse().ok())
        .unwrap_or(xml::MAX_KEYS);
    let token = q.get("continuation-token").cloned();
    let start_after = q.get("start-after").cloned();
    // ListObjects (V1) pages by `marker` (the last key a client saw, or
    // the page's NextMarker with a delimiter); its answer here is V2's XML
    // with NextMarker added, whose Contents, CommonPrefixes and
    // IsTruncated V1 clients read the same.
    let marker = q.get("marker").cloned();
    let query = xml::ListQuery {
        prefix: q.get("prefix").cloned().unwrap_or_default(),
        delimiter: q.get("delimiter").cloned().filter(|d| !d.is_empty()),
        max_keys,
        after: token.clone().or_else(|| start_after.clone()).or(marker),
        continuation_token: token,
        start_after,
        v1: !q.contains_key("list-type"),
    };
    let mut r = Response::new(Reply::text(xml::list_objects_v2(name, &entries, &query)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    r
}

/// Every file under `dir`, keys joined with `/` after `prefix`.
fn walk(dir: &Path, prefix: &str, out: &mut Vec<xml::Entry>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(meta) = e.metadata() else { continue };
        let key = format!("{prefix}{name}");
        if meta.is_dir() {
            walk(&e.path(), &format!("{key}/"), out);
        } else if meta.is_file() {
            let since = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .unwrap_or(Duration::ZERO);
            out.push(xml::Entry {
                key,
                size: meta.len(),
                mtime_s: since.as_secs() as i64,
                etag: format!("\"{:x}-{:x}\"", meta.len(), since.as_nanos()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges_are_read_as_http_says() {
        assert_eq!(parse_range("bytes=0-9", 100), Some(Ok((0, 10))));
        assert_eq!(parse_range("bytes=90-", 100), Some(Ok((90, 100))));
        assert_eq!(parse_range("bytes=90-500", 100), Some(Ok((90, 100))));
        assert_eq!(parse_range("bytes=-10", 100), Some(Ok((90, 100))));
        assert_eq!(parse_range("bytes=-500", 100), Some(Ok((0, 100))));
        assert_eq!(parse_range("bytes=100-", 100), Some(Err(())));
        assert_eq!(parse_range("bytes=-0", 100), Some(Err(())));
        // Not one satisfiable-or-not single range: ignored, 200.
        assert_eq!(parse_range("bytes=0-1,5-6", 100), None);
        assert_eq!(parse_range("bytes=9-0", 100), None);
        assert_eq!(parse_range("items=0-9", 100), None);
        assert_eq!(parse_range("bytes=x-9", 100), None);
    }
}

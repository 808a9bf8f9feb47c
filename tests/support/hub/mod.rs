//! A Hugging Face Hub emulator on 127.0.0.1 for the tests and benchmarks:
//! two hosts, as the Hub is two. Run alone by `examples/hub_emulator.rs`
//! (whose doc lists its options), in-process by the Rust tests.
//!
//! The API host (`endpoint`), over the repositories of its root (a
//! folder `ORG/NAME` each; every one has the revisions of
//! [`repo::REVISIONS`], each its own commit):
//!
//! - `GET /api/datasets/ORG/NAME/revision/REV`: `{"sha": ...}`, 404
//!   `RevisionNotFound` for another revision;
//! - `GET /api/datasets/ORG/NAME/tree/REV[/PATH]?recursive=..&cursor=N`:
//!   the entries (`type`, `oid`, `size`, `path`, `lfs` for `.tar` files)
//!   in pages of [`Options::page`], chained by `Link: <...>; rel="next"`;
//!   404 `EntryNotFound` for a path that is no directory;
//! - `GET`/`HEAD /datasets/ORG/NAME/resolve/REV/PATH`: `302 Found` to the
//!   content host with a signed URL that expires (and `X-Repo-Commit`,
//!   `X-Linked-Etag`, `X-Linked-Size`, as the Hub's);
//! - a private repository ([`Options::private`]) answers 401
//!   `RepoNotFound` to a request without the token
//!   (`Authorization: Bearer TOKEN`), a gated one 401 or 403 `GatedRepo`,
//!   a renamed one ([`Options::renamed`]) `307` to its new name
//!   (relative, as the Hub's);
//! - on demand ([`Controls`]): 429 with `Retry-After` to the next API or
//!   `resolve/` requests (a request arriving before the wait is over is
//!   counted `early`), and answers its API does not document (not JSON,
//!   another shape, a page past 16 MiB, pages that loop or never end, a
//!   commit id that is not one, a path outside the directory).
//!
//! The content host checks each URL's signature, its expiry and its
//! generation (every URL signed before an expiry, [`Controls`], is
//! refused 403 as an expired signed URL is), serves `Range`s (206, 416)
//! and `HEAD`, and records every request's headers: what a client sent
//! to a host other than the one it was given a token for. With
//! [`Options::same_host`] the content is served by the API host itself
//! (under `/_content/`): the control where credentials may go.
//!
//! `GET /_hub/stats` on the API host answers the counters as JSON;
//! `POST /_hub/set?NAME=VALUE` sets a control (for the Python tests and
//! the benchmarks). `api` holds the API host's routes, `content` the
//! content host's, `repo` the pure parts. Uses the object-store
//! emulator's bodies and range parser (`super::store`), and nothing else
//! of `support`, so `examples/hub_emulator.rs` includes both by `#[path]`.

#![allow(dead_code)]

mod api;
mod content;
pub mod repo;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};

use super::store::body::Reply;
use super::store::parse_range;

/// The answers the API does not document, on demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Garbage {
    /// The revision API answers an HTML page.
    NotJson,
    /// The revision API answers a number for the commit.
    WrongShape,
    /// The tree API answers an HTML page.
    TreeNotJson,
    /// The tree API answers an object.
    TreeWrongShape,
    /// The revision API answers a commit id that is not one.
    BadSha,
    /// A tree page longer than the client's bound (17 MiB).
    Huge,
    /// A tree page whose next page is itself.
    PageLoop,
    /// Empty tree pages, each naming a next one, without end.
    EmptyPages,
    /// A tree entry outside the directory listed (`../x`).
    OutsidePath,
}

impl Garbage {
    pub fn parse(v: &str) -> Option<Garbage> {
        Some(match v {
            "not-json" => Garbage::NotJson,
            "wrong-shape" => Garbage::WrongShape,
            "tree-not-json" => Garbage::TreeNotJson,
            "tree-wrong-shape" => Garbage::TreeWrongShape,
            "bad-sha" => Garbage::BadSha,
            "huge" => Garbage::Huge,
            "page-loop" => Garbage::PageLoop,
            "empty-pages" => Garbage::EmptyPages,
            "outside-path" => Garbage::OutsidePath,
            _ => return None,
        })
    }
}

/// What the emulator is, fixed at its start.
#[derive(Clone, Debug)]
pub struct Options {
    /// The token private and gated repositories take.
    pub token: Option<String>,
    /// Repositories (`ORG/NAME`) that answer 401 without the token.
    pub private: Vec<String>,
    /// Repositories whose access is never granted (401 without the token,
    /// 403 with it).
    pub gated: Vec<String>,
    /// Repositories moved: requests to the old name answer 307 to the new.
    pub renamed: Vec<(String, String)>,
    /// Tree entries per page (the Hub's: 1,000).
    pub page: usize,
    /// How long a signed URL is good for.
    pub url_ttl: Duration,
    /// The `Retry-After` of a 429, in seconds.
    pub retry_after: u64,
    /// The content is served by the API host (`/_content/...`).
    pub same_host: bool,
    /// Waited before every answer's head (a far Hub's first byte).
    pub latency: Option<Duration>,
    /// Runtime worker threads.
    pub threads: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            token: None,
            private: Vec::new(),
            gated: Vec::new(),
            renamed: Vec::new(),
            page: 1000,
            // The Hub's content URLs are good for about an hour.
            url_ttl: Duration::from_secs(3600),
            retry_after: 1,
            same_host: false,
            latency: None,
            // As the object-store emulator's: two, the machine's CPUs.
            threads: 2,
        }
    }
}

/// What can be changed while it runs.
#[derive(Default)]
pub struct Controls {
    /// The next N requests of the revision and tree APIs answer 429.
    pub throttle_api: AtomicU64,
    /// The next N `resolve/` requests answer 429.
    pub throttle_resolves: AtomicU64,
    /// Once the content host has had this many GETs (0: never), every
    /// URL signed until then expires.
    pub expire_after: AtomicU64,
    /// Every content GET past this many is refused 403 (0: none).
    pub deny_after: AtomicU64,
    /// A 401's `X-Error-Message` repeats the `Authorization` it got.
    pub echo_token: AtomicBool,
    pub garbage: Mutex<Option<Garbage>>,
}

/// What the emulator counted.
#[derive(Default)]
pub struct Stats {
    pub revisions: AtomicU64,
    pub trees: AtomicU64,
    pub resolves: AtomicU64,
    pub throttled: AtomicU64,
    /// Requests that came while a `Retry-After` was running.
    pub early: AtomicU64,
    /// GETs and HEADs at the content host, and what they were answered.
    pub content_gets: AtomicU64,
    pub content_heads: AtomicU64,
    pub served: AtomicU64,
    pub expired: AtomicU64,
    pub denied: AtomicU64,
    pub bad_signature: AtomicU64,
    /// The revision of every `resolve/` request, as it came.
    pub resolved_revisions: Mutex<Vec<String>>,
    /// The `Authorization` of every API-host request (`None`: none).
    pub api_authorization: Mutex<Vec<Option<String>>>,
    /// Every content request's headers, `name: value` lower-cased.
    pub content_headers: Mutex<Vec<Vec<String>>>,
}

impl Stats {
    pub fn json(&self) -> serde_json::Value {
        let n = |a: &AtomicU64| a.load(Ordering::SeqCst);
        let content_authorized = self
            .content_headers
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.iter().any(|l| l.starts_with("authorization:")))
            .count();
        serde_json::json!({
            "revisions": n(&self.revisions),
            "trees": n(&self.trees),
            "resolves": n(&self.resolves),
            "throttled": n(&self.throttled),
            "early": n(&self.early),
            "content_gets": n(&self.content_gets),
            "content_heads": n(&self.content_heads),
            "served": n(&self.served),
            "expired": n(&self.expired),
            "denied": n(&self.denied),
            "bad_signature": n(&self.bad_signature),
            "content_requests": self.content_headers.lock().unwrap().len(),
            "content_authorized": content_authorized,
            "resolved_revisions": *self.resolved_revisions.lock().unwrap(),
        })
    }
}

struct State {
    root: PathBuf,
    opts: Options,
    pub controls: Controls,
    pub stats: Stats,
    key: std::collections::hash_map::RandomState,
    generation: AtomicU64,
    /// Until when a 429's `Retry-After` runs.
    hold: Mutex<Option<Instant>>,
    api: SocketAddr,
    content: SocketAddr,
    files: Mutex<HashMap<PathBuf, (Bytes, String)>>,
}

/// The emulator, serving until dropped.
pub struct HubEmulator {
    state: Arc<State>,
    _runtime: tokio::runtime::Runtime,
}

impl HubEmulator {
    pub fn start(root: &std::path::Path, opts: Options) -> std::io::Result<HubEmulator> {
        HubEmulator::start_on(root, 0, opts)
    }

    /// On `port` (0: a free one) for the API host; the content host on a
    /// free port.
    pub fn start_on(
        root: &std::path::Path,
        port: u16,
        opts: Options,
    ) -> std::io::Result<HubEmulator> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.threads)
            .enable_all()
            .build()?;
        let api = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))?;
        let content = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))?;
        let state = Arc::new(State {
            root: root.to_path_buf(),
            opts,
            controls: Controls::default(),
            stats: Stats::default(),
            key: Default::default(),
            generation: AtomicU64::new(0),
            hold: Mutex::new(None),
            api: api.local_addr()?,
            content: content.local_addr()?,
            files: Mutex::default(),
        });
        for (listener, is_api) in [(api, true), (content, false)] {
            let st = state.clone();
            runtime.spawn(async move {
                use hyper_util::rt::{TokioExecutor, TokioIo};
                let http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                loop {
                    let Ok((socket, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = socket.set_nodelay(true);
                    let st = st.clone();
                    let service = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(handle(st, is_api, req).await) }
                    });
                    let conn = http
                        .serve_connection(TokioIo::new(socket), service)
                        .into_owned();
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                }
            });
        }
        Ok(HubEmulator {
            state,
            _runtime: runtime,
        })
    }

    /// `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.state.api)
    }

    pub fn content_addr(&self) -> SocketAddr {
        self.state.content
    }

    pub fn controls(&self) -> &Controls {
        &self.state.controls
    }

    pub fn stats(&self) -> &Stats {
        &self.state.stats
    }

    /// The commit `revision` names in `repo`.
    pub fn commit(repo: &str, revision: &str) -> String {
        repo::commit_of(repo, revision)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Reply> {
    let mut r = Response::new(Reply::text(body));
    *r.status_mut() = status;
    r
}

fn set(r: &mut Response<Reply>, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        r.headers_mut().insert(name, v);
    }
}

/// A refusal as the Hub's: its status, `X-Error-Code` and message.
fn refusal(status: StatusCode, code: &str, message: &str) -> Response<Reply> {
    let mut r = text(status, format!("{{\"error\":\"{code}\"}}"));
    set(&mut r, "x-error-code", code);
    set(&mut r, "x-error-message", message);
    r
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

fn query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

async fn handle(st: Arc<State>, is_api: bool, req: Request<Incoming>) -> Response<Reply> {
    if let Some(wait) = st.opts.latency {
        tokio::time::sleep(wait).await;
    }
    let path = req.uri().path().to_string();
    if !is_api {
        return content::content(&st, &req, &path);
    }
    if let Some(rest) = path.strip_prefix("/_content") {
        if st.opts.same_host {
            return content::content(&st, &req, rest);
        }
        return text(StatusCode::NOT_FOUND, "no content here\n");
    }
    if path == "/_hub/stats" {
        return text(StatusCode::OK, st.stats.json().to_string());
    }
    if path == "/_hub/set" {
        return control(&st, req.uri().query().unwrap_or(""));
    }
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    st.stats
        .api_authorization
        .lock()
        .unwrap()
        .push(auth.clone());
    api::api(&st, &req, &path, auth.as_deref())
}

/// `NAME=VALUE` of a control.
fn control(st: &State, q: &str) -> Response<Reply> {
    let c = &st.controls;
    for (k, v) in query(q) {
        let n = v.parse::<u64>().unwrap_or(0);
        match k.as_str() {
            "throttle_api" => c.throttle_api.store(n, Ordering::SeqCst),
            "throttle_resolves" => c.throttle_resolves.store(n, Ordering::SeqCst),
            "expire_after" => c.expire_after.store(n, Ordering::SeqCst),
            "deny_after" => c.deny_after.store(n, Ordering::SeqCst),
            "echo_token" => c.echo_token.store(n != 0, Ordering::SeqCst),
            "garbage" => *c.garbage.lock().unwrap() = Garbage::parse(&v),
            _ => return text(StatusCode::BAD_REQUEST, format!("no control `{k}`\n")),
        }
    }
    text(StatusCode::OK, "ok\n")
}

impl State {
    /// A file's bytes and strong ETag, read once.
    fn file(&self, path: &std::path::Path) -> Option<(Bytes, String)> {
        if let Some(f) = self.files.lock().unwrap().get(path) {
            return Some(f.clone());
        }
        if !path.is_file() {
            return None;
        }
        let file = std::fs::File::open(path).ok()?;
        let data = if file.metadata().ok()?.len() == 0 {
            Bytes::new()
        } else {
            // SAFETY: the emulator's files are not truncated while it
            // serves them (its contract, as the object-store emulator's);
            // the mapping is read-only and lives as long as the `Bytes`.
            let map = unsafe { memmap2::Mmap::map(&file).ok()? };
            Bytes::from_owner(map)
        };
        let etag = format!(
            "\"{}\"",
            repo::hex(&<sha1::Sha1 as sha1::Digest>::digest(&data))
        );
        let f = (data, etag);
        self.files
            .lock()
            .unwrap()
            .insert(path.to_path_buf(), f.clone());
        Some(f)
    }
}

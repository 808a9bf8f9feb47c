//! An S3-compatible server for the tests, on 127.0.0.1: s3s with SigV4
//! verification over the s3s-fs backend (each folder of the root a bucket),
//! on its own Tokio runtime.
//!
//! s3s-fs 0.14.1 stores writes but checks them less than S3 does, so `Fs`
//! stands in front of it and answers as S3 would where they differ:
//!
//! - UploadPart verifies `Content-MD5` and the `x-amz-checksum-*` value it
//!   carries (s3s-fs verifies neither), and a part's checksum algorithm must
//!   be the one the upload was created with (S3's "Checksum Type mismatch").
//! - PutObject verifies its digests before s3s-fs stores the body (s3s-fs
//!   verifies after the object is already replaced).
//! - CompleteMultipartUpload checks the part list (each part uploaded, its
//!   ETag and checksum as uploaded, ascending, all but the last at least
//!   5 MiB, `x-amz-mp-object-size`) and the whole-object checksum before
//!   s3s-fs consumes the upload: s3s-fs deletes the upload first and then
//!   fails, leaving parts no one can abort. Parts not listed are freed.
//! - An upload id that is not open is NoSuchUpload (s3s-fs: AccessDenied),
//!   but a completion retried with `If-None-Match: *` after it succeeded is
//!   PreconditionFailed: the object it made is there;
//!   PutObject and CreateMultipartUpload to a missing bucket are
//!   NoSuchBucket (s3s-fs creates the folder); GetObject on a missing
//!   bucket is NoSuchBucket (s3s-fs: NoSuchKey).
//! - Writes to one key are serialized, so of two `If-None-Match: *` writes
//!   racing for a new key exactly one succeeds and the other gets 412
//!   PreconditionFailed (s3s-fs checks and writes with no lock between).
//!
//! - GetObject honours `If-Match` (s3s-fs ignores it): a GET whose
//!   condition names another ETag than the object's now gets 412
//!   PreconditionFailed, as S3 answers.
//!
//! For the tests it also injects S3 errors by operation (and by part
//! number for UploadPart) and by key (every request on a bucket's keys
//! under a prefix, as a policy that denies them), counts requests by
//! operation, tracks the multipart uploads left open, takes keys a test
//! issues with a lifetime (as STS's temporary credentials): a request
//! signed with one past its expiry is refused with `ExpiredToken`, as S3
//! does; and replaces an object between the GETs of one read
//! (`replace_after`; `ignore_if_match` makes it serve the new bytes to a
//! GET pinned to the old ones, as a store without conditional GETs would).
//! A completion can be made to go wrong the ways a network does
//! (`Completion`): done, with its answer lost; another writer's object
//! landing first, the answer lost; held, never answered. The state is
//! shared through an `Arc`
//! between the server's handlers and the `S3Server` the test holds.
//!
//! `checksum` holds S3's checksum rules, `multipart` what completing an
//! upload checks, `fs` the handlers. Included by the test crates through
//! `tests/support/mod.rs` and by `examples/s3_server.rs` through `#[path]`,
//! so it uses nothing else of `support`.

#![allow(dead_code)]

mod checksum;
mod fs;
mod multipart;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};

use checksum::{Algorithm, Crcs};

pub const ACCESS_KEY: &str = "AKIARINGFEEDTEST";
pub const SECRET_KEY: &str = "ringfeed-test-secret-0123456789abcdef";

/// The operations counted and open to injected faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    PutObject,
    CreateMultipartUpload,
    UploadPart,
    CompleteMultipartUpload,
    AbortMultipartUpload,
    DeleteObject,
    GetObject,
    HeadObject,
    ListObjectsV2,
}

impl Op {
    const COUNT: usize = Op::ListObjectsV2 as usize + 1;
}

/// A multipart upload created and neither completed nor aborted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Upload {
    pub bucket: String,
    pub key: String,
    pub upload_id: String,
}

/// An S3 error the next matching requests get instead of their answer.
struct Fault {
    op: Op,
    /// UploadPart only: the part number it hits (`None`: every part).
    part_number: Option<i32>,
    code: S3ErrorCode,
    /// How many more requests it hits (`None`: all).
    remaining: Option<u32>,
    /// CompleteMultipartUpload only: answer 200 and put the error in the
    /// body, as S3 may once it has begun to assemble the object.
    in_body: bool,
}

/// What the next CompleteMultipartUploads do instead of answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Complete the upload, then drop the connection before the answer
    /// (the client's retry meets the object, or no upload).
    LoseAnswer,
    /// Another writer's object ([`OTHER_WRITER_BYTES`]) lands at the key;
    /// the upload stays open and the connection drops before any answer.
    OtherWriterFirst,
    /// Wait without answering until the server stops; the upload stays
    /// open. Each one held is counted (`held_completions`) and printed on
    /// stderr.
    Hold,
}

/// The object another writer puts at the key under
/// `Completion::OtherWriterFirst`.
pub const OTHER_WRITER_BYTES: &[u8] = b"another writer's object";

/// Marks an answer that the connection drops instead of sending (see
/// `Answering`).
#[derive(Clone, Copy, Debug)]
struct DropAnswer;

/// Held by a write to one key, across awaits.
type KeyLock = Arc<tokio::sync::Mutex<()>>;

/// What the handlers and the test share.
#[derive(Default)]
struct State {
    /// Requests that passed authentication, by `Op as usize`. Relaxed:
    /// plain counters, read after the requests they count were answered.
    requests: [AtomicU64; Op::COUNT],
    faults: Mutex<Vec<Fault>>,
    /// (bucket, key prefix, code): every request on a matching key fails.
    denials: Mutex<Vec<(String, String, S3ErrorCode)>>,
    /// What the next CompleteMultipartUploads do, and for how many more
    /// (`None`: all).
    completion: Mutex<Option<(Completion, Option<u32>)>>,
    /// Completions held so far. Relaxed: a counter a test polls.
    held: AtomicU64,
    /// While this file exists, every UploadPart (its body read) waits
    /// before it is answered: a store slow to take parts, held as long as
    /// a test needs and released by removing the file.
    hold_parts: Mutex<Option<std::path::PathBuf>>,
    /// UploadParts waiting under `hold_parts` now. Relaxed: a gauge a
    /// test polls.
    parts_held: AtomicU64,
    /// The MD5 ETags listings computed, by object file, with the size and
    /// time they were computed at: a listing hashes an object once, not
    /// at every listing of it.
    listed_md5: Mutex<HashMap<PathBuf, (u64, std::time::SystemTime, String)>>,
    /// Upload ids completed: a retried completion with `If-None-Match`
    /// meets PreconditionFailed (the object is there), without it
    /// NoSuchUpload. One entry per upload of a test.
    completed: Mutex<std::collections::HashSet<String>>,
    /// Open uploads by upload id.
    uploads: Mutex<HashMap<String, OpenUpload>>,
    /// One lock per (bucket, key) that writes take around s3s-fs's check
    /// of preconditions and its write. Never pruned: one entry per key
    /// written, a few thousand at most in a test or benchmark.
    key_locks: Mutex<HashMap<(String, String), KeyLock>>,
    /// The object replaced under its readers, if any.
    replace: Mutex<Option<Replace>>,
    /// GetObject serves whatever the object holds, `If-Match` or not.
    ignore_if_match: std::sync::atomic::AtomicBool,
    /// GetObjects answered 412 PreconditionFailed.
    precondition_failed: AtomicU64,
    /// The ETag of every GetObject answered with bytes, in order.
    served: Mutex<Vec<String>>,
    /// The keys requests may be signed with: access key id → secret and
    /// expiry (`None`: never expires).
    keys: Mutex<HashMap<String, (String, Option<Instant>)>>,
    /// Requests refused because their key had expired. Relaxed: a counter.
    expired: AtomicU64,
    /// The issued keys requests were signed with.
    used: Mutex<std::collections::BTreeSet<String>>,
}

impl State {
    /// The ETag s3s-fs answers a GET of `bucket/key` with: the one it
    /// saved for the object (a multipart upload's), else the MD5 of its
    /// bytes (kept while the file's size and time stay).
    fn listed_etag(&self, root: &Path, bucket: &str, key: &str) -> Option<String> {
        use base64::Engine as _;
        use md5::Digest as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let info = root.join(format!(
            ".bucket-{}.object-{}.internal.json",
            b64(bucket),
            b64(key)
        ));
        let saved = std::fs::read(info)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("e_tag").and_then(|t| t.as_str()).map(str::to_string));
        if saved.is_some() {
            return saved;
        }
        let path = root.join(bucket).join(key);
        let meta = std::fs::metadata(&path).ok()?;
        let stamp = (meta.len(), meta.modified().ok()?);
        if let Some((n, t, tag)) = self.listed_md5.lock().unwrap().get(&path)
            && (*n, *t) == stamp
        {
            return Some(tag.clone());
        }
        let data = std::fs::read(&path).ok()?;
        let tag: String = md5::Md5::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.listed_md5
            .lock()
            .unwrap()
            .insert(path, (stamp.0, stamp.1, tag.clone()));
        Some(tag)
    }
}

/// The server's key check: the issued keys, each until its expiry.
struct Keys(Arc<State>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<s3s::auth::SecretKey> {
        let keys = self.0.keys.lock().unwrap();
        match keys.get(access_key) {
            None => Err(s3_error!(InvalidAccessKeyId)),
            Some((_, Some(until))) if Instant::now() >= *until => {
                self.0.expired.fetch_add(1, Ordering::Relaxed);
                Err(s3_error!(ExpiredToken, "The provided token has expired."))
            }
            Some((secret, until)) => {
                if until.is_some() {
                    self.0.used.lock().unwrap().insert(access_key.to_string());
                }
                Ok(secret.as_str().into())
            }
        }
    }
}

/// An object rewritten once `after` GetObjects of it were answered.
struct Replace {
    bucket: String,
    key: String,
    after: u64,
    with: Vec<u8>,
    seen: u64,
}

#[derive(Clone)]
struct OpenUpload {
    bucket: String,
    key: String,
    /// The checksum algorithm the upload was created with.
    algorithm: Option<Algorithm>,
    /// FULL_OBJECT (a CRC of the whole object) rather than COMPOSITE (a
    /// checksum of the parts' checksums).
    full_object: bool,
    parts: BTreeMap<i32, PartRecord>,
}

#[derive(Clone)]
struct PartRecord {
    e_tag: String,
    size: u64,
    crcs: Crcs,
    /// Base64 checksum of the upload's algorithm, sent or computed.
    checksum: Option<String>,
}

impl State {
    fn count(&self, op: Op) {
        self.requests[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The injected error this request gets, if any, and whether it goes
    /// in a 200's body.
    fn fault(&self, op: Op, part_number: Option<i32>) -> Option<(S3Error, bool)> {
        let mut faults = self.faults.lock().unwrap();
        let i = faults.iter().position(|f| {
            f.op == op && (f.part_number.is_none() || f.part_number == part_number)
        })?;
        let f = &mut faults[i];
        let hit = (
            S3Error::with_message(f.code.clone(), "fault injected by the test server"),
            f.in_body,
        );
        if let Some(n) = &mut f.remaining {
            *n -= 1;
            if *n == 0 {
                faults.remove(i);
            }
        }
        Some(hit)
    }

    /// The denial a request on `bucket/key` gets, if one matches.
    fn denied(&self, bucket: &str, key: &str) -> S3Result<()> {
        let denials = self.denials.lock().unwrap();
        match denials
            .iter()
            .find(|(b, prefix, _)| b == bucket && key.starts_with(prefix.as_str()))
        {
            Some((_, _, code)) => Err(S3Error::with_message(
                code.clone(),
                "denied by the test server for this key",
            )),
            None => Ok(()),
        }
    }

    /// What this CompleteMultipartUpload does, if a `Completion` is set.
    fn completion(&self) -> Option<Completion> {
        let mut slot = self.completion.lock().unwrap();
        let (mode, remaining) = (*slot)?;
        if let Some(n) = remaining {
            *slot = (n > 1).then_some((mode, Some(n - 1)));
        }
        Some(mode)
    }

    fn open_upload(&self, upload_id: &str, bucket: &str, key: &str) -> S3Result<OpenUpload> {
        match self.uploads.lock().unwrap().get(upload_id) {
            Some(u) if u.bucket == bucket && u.key == key => Ok(u.clone()),
            _ => Err(s3_error!(
                NoSuchUpload,
                "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed."
            )),
        }
    }

    /// Counts a GetObject of `bucket`/`key` answered with bytes, and
    /// replaces the object when it is the one `replace_after` names.
    fn served(&self, root: &Path, bucket: &str, key: &str, etag: String) {
        self.served.lock().unwrap().push(etag);
        let mut replace = self.replace.lock().unwrap();
        let Some(r) = replace.as_mut() else { return };
        if r.bucket != bucket || r.key != key {
            return;
        }
        r.seen += 1;
        if r.seen != r.after {
            return;
        }
        // Whole, as S3 replaces an object: a new file renamed over the old
        // (a GET streaming the old one keeps its bytes), and the ETag that
        // s3s-fs saved for a PutObject dropped, so the new one is the new
        // bytes' MD5.
        let path = root.join(bucket).join(key);
        let tmp = path.with_extension("replacing");
        std::fs::write(&tmp, &r.with).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let info = root.join(format!(
            ".bucket-{}.object-{}.internal.json",
            b64(bucket),
            b64(key)
        ));
        let _ = std::fs::remove_file(info);
    }

    fn key_lock(&self, bucket: &str, key: &str) -> KeyLock {
        let mut locks = self.key_locks.lock().unwrap();
        locks
            .entry((bucket.to_string(), key.to_string()))
            .or_default()
            .clone()
    }
}

/// The S3-compatible server on 127.0.0.1 serving `root` (each folder a
/// bucket), on its own Tokio runtime threads; stops when dropped.
pub struct S3Server {
    pub addr: SocketAddr,
    root: PathBuf,
    state: Arc<State>,
    _runtime: tokio::runtime::Runtime,
}

impl S3Server {
    /// On a free port, with two runtime threads (enough for a test's few
    /// connections); panics if it cannot start.
    pub fn start(root: &Path) -> S3Server {
        S3Server::start_on(root, 0, 2).expect("start the S3 test server")
    }

    /// On 127.0.0.1:`port` (0: a free one), with `threads` runtime threads.
    pub fn start_on(root: &Path, port: u16, threads: usize) -> std::io::Result<S3Server> {
        S3Server::start_at(root, std::net::Ipv4Addr::LOCALHOST.into(), port, threads)
    }

    /// On `ip`:`port` (0: a free one), with `threads` runtime threads.
    pub fn start_at(
        root: &Path,
        ip: std::net::IpAddr,
        port: u16,
        threads: usize,
    ) -> std::io::Result<S3Server> {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use hyper_util::server::conn::auto::Builder as ConnBuilder;
        use s3s::service::S3ServiceBuilder;

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?;
        let state = Arc::new(State::default());
        state
            .keys
            .lock()
            .unwrap()
            .insert(ACCESS_KEY.into(), (SECRET_KEY.into(), None));
        let fs = fs::Fs {
            inner: s3s_fs::FileSystem::new(root)
                .map_err(|e| std::io::Error::other(format!("s3s-fs: {e:?}")))?,
            root: root.to_path_buf(),
            state: state.clone(),
        };
        let mut b = S3ServiceBuilder::new(fs);
        b.set_auth(Keys(state.clone()));
        let service = Answering(b.build());
        let listener = runtime.block_on(tokio::net::TcpListener::bind((ip, port)))?;
        let addr = listener.local_addr()?;
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let conn = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        Ok(S3Server {
            addr,
            root: root.to_path_buf(),
            state,
            _runtime: runtime,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every UploadPart of `part_number` fails with `code` (e.g.
    /// `InternalError`, 500, retried and failing again; `AccessDenied`,
    /// 403), until `clear_faults`.
    pub fn fail_upload_part(&self, part_number: i32, code: S3ErrorCode) {
        self.add_fault(Op::UploadPart, Some(part_number), code, None, false);
    }

    /// The next `times` UploadParts of `part_number` fail with `code`.
    pub fn fail_upload_part_times(&self, part_number: i32, code: S3ErrorCode, times: u32) {
        self.add_fault(Op::UploadPart, Some(part_number), code, Some(times), false);
    }

    /// The next `times` requests of `op` (`None`: all of them) fail with
    /// `code`.
    pub fn fail(&self, op: Op, code: S3ErrorCode, times: Option<u32>) {
        self.add_fault(op, None, code, times, false);
    }

    /// Every request on a key of `bucket` under `prefix` ("" for all)
    /// fails with `code` (`AccessDenied`, 403; `ExpiredToken`, 400), as a
    /// bucket policy that denies them, until `clear_faults`.
    pub fn deny(&self, bucket: &str, prefix: &str, code: S3ErrorCode) {
        self.state
            .denials
            .lock()
            .unwrap()
            .push((bucket.to_string(), prefix.to_string(), code));
    }

    /// The next `times` CompleteMultipartUploads (`None`: all) do what
    /// `mode` says instead of answering.
    pub fn complete_as(&self, mode: Completion, times: Option<u32>) {
        if times == Some(0) {
            return;
        }
        *self.state.completion.lock().unwrap() = Some((mode, times));
    }

    /// Every UploadPart waits, unanswered, while `file` exists (its
    /// body already read), and says so on stderr: `s3_server: holding
    /// UploadPart N of BUCKET/KEY`.
    pub fn hold_parts_while(&self, file: &Path) {
        *self.state.hold_parts.lock().unwrap() = Some(file.to_path_buf());
    }

    /// UploadParts waiting under [`S3Server::hold_parts_while`] now.
    pub fn parts_held(&self) -> u64 {
        self.state.parts_held.load(Ordering::Relaxed)
    }

    /// CompleteMultipartUploads held so far (`Completion::Hold`).
    pub fn held_completions(&self) -> u64 {
        self.state.held.load(Ordering::Relaxed)
    }

    /// The next `times` CompleteMultipartUploads (`None`: all) answer 200
    /// with an error in the body, as S3 may; the upload stays open.
    pub fn fail_complete_in_body(&self, code: S3ErrorCode, times: Option<u32>) {
        self.add_fault(Op::CompleteMultipartUpload, None, code, times, true);
    }

    /// A new key pair requests may be signed with for `lifetime` from now
    /// (`n` makes it unique): `(access key id, secret)`.
    pub fn issue_key(&self, n: u64, lifetime: Duration) -> (String, String) {
        let (id, secret) = (format!("ASIATEMP{n:08}"), format!("temp-secret-{n}"));
        self.state.keys.lock().unwrap().insert(
            id.clone(),
            (secret.clone(), Some(Instant::now() + lifetime)),
        );
        (id, secret)
    }

    /// The issued keys (`issue_key`) requests were signed with.
    pub fn keys_used(&self) -> usize {
        self.state.used.lock().unwrap().len()
    }

    /// Requests refused with `ExpiredToken`.
    pub fn expired_refusals(&self) -> u64 {
        self.state.expired.load(Ordering::Relaxed)
    }

    /// Once `after` GetObjects of `bucket`/`key` were answered, the object
    /// holds `with` (before the body of the last of them is sent): a
    /// rewrite between the parts of one read.
    pub fn replace_after(&self, bucket: &str, key: &str, after: u64, with: Vec<u8>) {
        *self.state.replace.lock().unwrap() = Some(Replace {
            bucket: bucket.into(),
            key: key.into(),
            after,
            with,
            seen: 0,
        });
    }

    /// GetObject ignores `If-Match` (`true`) or honours it (the default).
    pub fn ignore_if_match(&self, ignore: bool) {
        self.state.ignore_if_match.store(ignore, Ordering::SeqCst);
    }

    /// GetObjects answered 412 PreconditionFailed so far.
    pub fn precondition_failed(&self) -> u64 {
        self.state.precondition_failed.load(Ordering::SeqCst)
    }

    /// The ETag each GetObject answered with bytes carried, in order.
    pub fn served_etags(&self) -> Vec<String> {
        self.state.served.lock().unwrap().clone()
    }

    pub fn clear_faults(&self) {
        self.state.faults.lock().unwrap().clear();
        self.state.denials.lock().unwrap().clear();
        *self.state.completion.lock().unwrap() = None;
    }

    fn add_fault(
        &self,
        op: Op,
        part_number: Option<i32>,
        code: S3ErrorCode,
        remaining: Option<u32>,
        in_body: bool,
    ) {
        if remaining == Some(0) {
            return;
        }
        self.state.faults.lock().unwrap().push(Fault {
            op,
            part_number,
            code,
            remaining,
            in_body,
        });
    }

    /// Requests of `op` that passed authentication, answered or failed
    /// (injected faults included).
    pub fn requests(&self, op: Op) -> u64 {
        self.state.requests[op as usize].load(Ordering::Relaxed)
    }

    /// Uploads created and neither completed nor aborted, sorted.
    pub fn dangling_uploads(&self) -> Vec<Upload> {
        let mut v: Vec<Upload> = self
            .state
            .uploads
            .lock()
            .unwrap()
            .iter()
            .map(|(id, u)| Upload {
                bucket: u.bucket.clone(),
                key: u.key.clone(),
                upload_id: id.clone(),
            })
            .collect();
        v.sort();
        v
    }

    /// Files s3s-fs keeps in the root for uploads in progress (parts
    /// `.upload_id-*`, records `.upload-*.json`, their metadata) and
    /// half-written temporaries (`.tmp.*`), sorted.
    pub fn leftover_files(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::dir_names(&self.root)
            .into_iter()
            .filter(|n| {
                n.starts_with(".upload_id-")
                    || n.starts_with(".upload-")
                    || n.starts_with(".tmp.")
                    || (n.starts_with(".bucket-") && n.contains(".upload-"))
            })
            .collect();
        v.sort();
        v
    }

    /// Panics naming what is left if any upload is open or any upload's
    /// file remains.
    pub fn assert_no_uploads_left(&self) {
        let (open, files) = (self.dangling_uploads(), self.leftover_files());
        assert!(
            open.is_empty() && files.is_empty(),
            "uploads left open: {open:?}; upload files left: {files:?}"
        );
    }
}

/// The S3 service, with the answers marked `DropAnswer` not sent: the
/// service fails the request instead, and hyper closes the connection
/// without writing a response, as a network that drops it after the server
/// acted.
#[derive(Clone)]
struct Answering(s3s::service::S3Service);

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Answering {
    type Response = s3s::HttpResponse;
    type Error = s3s::HttpError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let answer = hyper::service::Service::call(&self.0, req);
        Box::pin(async move {
            let resp = answer.await?;
            if resp.extensions().get::<DropAnswer>().is_some() {
                return Err(s3s::HttpError::new(Box::new(std::io::Error::other(
                    "the test server drops this answer",
                ))));
            }
            Ok(resp)
        })
    }
}

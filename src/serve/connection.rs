//! One connection: read a request head (bounded in size and time), answer
//! it (a file, a byte range of one, or a short text error), and go on while
//! the client keeps the connection alive; with what every connection shares
//! (`ServeShared`: the root, the options, the live sockets, the
//! counters), which `server.rs` makes. The decisions are the pure
//! functions of `request.rs`; the bytes of a body go out through `body.rs`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use super::ServeOptions;
use super::body;
use super::request::{self, Method, RangeChoice, TargetError};

/// Counters, for reports and tests. Relaxed: statistics only.
#[derive(Debug, Default)]
pub(super) struct ServeCounters {
    pub(super) connections: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) body_bytes: AtomicU64,
    pub(super) refused_busy: AtomicU64,
    pub(super) cpu_ns: AtomicU64,
}

pub(super) struct ServeShared {
    pub(super) root: PathBuf,
    pub(super) opts: ServeOptions,
    /// Set by `Drop`; connection threads check it between requests.
    /// Release/Acquire: pairs the store in `Drop` with the loads there, so
    /// a thread that sees it also sees the sockets already shut down.
    pub(super) stop: AtomicBool,
    /// Clones of the live connections, to shut them down when stopping.
    pub(super) live: Mutex<HashMap<u64, TcpStream>>,
    pub(super) counters: ServeCounters,
}

/// Every slot is taken: a short 503 and close. The head fits any socket
/// buffer, so the write does not block the accept thread.
pub(super) fn refuse_busy(mut conn: TcpStream, shared: &ServeShared) {
    shared.counters.refused_busy.fetch_add(1, Ordering::Relaxed);
    let body = "server busy: every connection slot is taken\n";
    let head = request::response_head(
        503,
        body.len() as u64,
        "Retry-After: 1\r\nContent-Type: text/plain; charset=utf-8\r\n",
        false,
        now_unix(),
    );
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body.as_bytes());
}

/// CPU time of the calling thread (a vDSO call, ~20 ns).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant
    // every Linux since 2.6.12 supports (on failure `ts` stays zero).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How a request head read ended.
enum HeadRead {
    Request(request::HttpRequest),
    /// The client closed (or went idle) between requests: close quietly.
    Closed,
    /// A head that cannot be served: answer, then close.
    Bad(request::HeadError),
}

/// Serves requests on one connection until it closes, errs, or the server stops.
pub(super) fn serve_connection(mut conn: TcpStream, shared: &ServeShared) {
    let mut buf: Vec<u8> = Vec::with_capacity(shared.opts.max_head);
    loop {
        // Acquire: pairs with the Release store in `Drop for Server`.
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let req = match read_head(&mut conn, &mut buf, &shared.opts) {
            HeadRead::Request(r) => r,
            HeadRead::Closed => return,
            HeadRead::Bad(e) => {
                let _ = send_error(&mut conn, shared, e.status(), &e.message(), false, false);
                log(shared, "-", "-", e.status(), 0);
                linger_close(conn);
                return;
            }
        };
        buf.drain(..req.head_len);
        let cpu0 = thread_cpu_ns();
        let answered = respond(&mut conn, shared, &req);
        let cpu = thread_cpu_ns().saturating_sub(cpu0);
        shared.counters.cpu_ns.fetch_add(cpu, Ordering::Relaxed);
        match answered {
            Ok(true) if req.keep_alive => {}
            _ => return,
        }
    }
}

/// After an error answer the client may still be sending (a body we refused,
/// the rest of an oversized head). Closing with unread bytes makes the kernel
/// send RST, which can destroy our answer before the client reads it; so
/// stop writing, drain briefly, then close. 200 ms per read and 1 s in all
/// cover what is already in flight on any LAN; a client still sending after
/// that is not reading our answer anyway.
fn linger_close(mut conn: TcpStream) {
    let _ = conn.shutdown(Shutdown::Write);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        match conn.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>, opts: &ServeOptions) -> HeadRead {
    let mut deadline: Option<Instant> = None;
    let mut tmp = [0u8; 4096];
    loop {
        if !buf.is_empty() {
            match request::parse_request(buf, opts.max_head) {
                Ok(Some(r)) => return HeadRead::Request(r),
                Ok(None) => {}
                Err(e) => return HeadRead::Bad(e),
            }
            deadline.get_or_insert_with(|| Instant::now() + opts.head_timeout);
        }
        let wait = match deadline {
            None => opts.idle_timeout,
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(w) if !w.is_zero() => w,
                _ => return HeadRead::Closed,
            },
        };
        if conn.set_read_timeout(Some(wait)).is_err() {
            return HeadRead::Closed;
        }
        // Never read past the limit: a head that does not fit is refused.
        let room = (opts.max_head + 1).saturating_sub(buf.len()).min(tmp.len());
        match conn.read(&mut tmp[..room.max(1)]) {
            Ok(0) => return HeadRead::Closed,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return HeadRead::Closed,
        }
    }
}

/// Answers one request. `Ok(true)`: the connection may serve another.
fn respond(
    conn: &mut TcpStream,
    shared: &ServeShared,
    req: &request::HttpRequest,
) -> io::Result<bool> {
    let method_name = match req.method {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Other => "-",
    };
    let target = request::printable(&req.target);
    let head_only = req.method == Method::Head;
    let fail = |conn: &mut TcpStream, status: u16, msg: &str, keep: bool| {
        log(shared, method_name, &target, status, 0);
        send_error(conn, shared, status, msg, head_only, keep).map(|()| keep)
    };
    if req.method == Method::Other {
        return fail(conn, 405, "only GET and HEAD are served", req.keep_alive);
    }
    let path = match request::file_path(&shared.root, &req.target) {
        Ok(p) => p,
        Err(TargetError::Bad(m)) => return fail(conn, 400, &m, false),
        Err(TargetError::Traversal) => {
            return fail(
                conn,
                403,
                "paths with `..` segments or NUL bytes are refused",
                req.keep_alive,
            );
        }
    };
    let opened = File::open(&path).and_then(|f| {
        let m = f.metadata()?;
        Ok((f, m))
    });
    let (file, meta) = match opened {
        Ok((f, m)) if m.is_file() => (f, m),
        Ok(_) => return fail(conn, 404, "not a file", req.keep_alive),
        Err(e) => {
            let status = match e.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => 404,
                io::ErrorKind::PermissionDenied => 403,
                _ => 500,
            };
            return fail(conn, status, &e.to_string(), req.keep_alive);
        }
    };
    let size = meta.len();
    let ctype = request::content_type(&path);
    // A version for caches: nginx's ETag (modification time and size),
    // the time to the nanosecond so a rewrite within a second shows.
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    // The inode too: a file replaced by a rename (how a rewrite is made
    // atomic) has another even when the clock's tick gave both writes one
    // modification time.
    let etag = format!(
        "\"{:x}-{:x}-{size:x}\"",
        std::os::unix::fs::MetadataExt::ino(&meta),
        mtime.as_nanos()
    );
    let version = format!(
        "ETag: {etag}\r\nLast-Modified: {}\r\n",
        request::http_date(mtime.as_secs())
    );
    // A client reading the file in several requests pins them to its ETag:
    // once the file changed, 412 rather than another version's bytes.
    if let Some(want) = &req.if_match
        && !request::if_match_holds(want, &etag)
    {
        return fail(
            conn,
            412,
            "the file changed: its ETag is not the one If-Match names",
            req.keep_alive,
        );
    }
    let (status, start, len, range_line) = match request::choose_range(req.range.as_deref(), size) {
        RangeChoice::Full => (200, 0, size, String::new()),
        RangeChoice::Part { start, end } => (
            206,
            start,
            end - start + 1,
            format!("Content-Range: bytes {start}-{end}/{size}\r\n"),
        ),
        RangeChoice::Unsatisfiable => {
            log(shared, method_name, &target, 416, 0);
            let head = request::response_head(
                416,
                0,
                &format!("Content-Range: bytes */{size}\r\n"),
                req.keep_alive,
                now_unix(),
            );
            shared.counters.requests.fetch_add(1, Ordering::Relaxed);
            conn.write_all(head.as_bytes())?;
            return Ok(req.keep_alive);
        }
    };
    let head = request::response_head(
        status,
        len,
        &format!("{range_line}{version}Accept-Ranges: bytes\r\nContent-Type: {ctype}\r\n"),
        req.keep_alive,
        now_unix(),
    );
    shared.counters.requests.fetch_add(1, Ordering::Relaxed);
    log(
        shared,
        method_name,
        &target,
        status,
        if head_only { 0 } else { len },
    );
    conn.write_all(head.as_bytes())?;
    if !head_only && len > 0 {
        body::send_range(conn, &file, start, len)?;
        shared.counters.body_bytes.fetch_add(len, Ordering::Relaxed);
    }
    Ok(true)
}

/// A short text error response.
fn send_error(
    conn: &mut TcpStream,
    shared: &ServeShared,
    status: u16,
    msg: &str,
    head_only: bool,
    keep_alive: bool,
) -> io::Result<()> {
    shared.counters.requests.fetch_add(1, Ordering::Relaxed);
    let body = format!("{status} {}: {msg}\n", request::reason(status));
    let mut extra = String::from("Content-Type: text/plain; charset=utf-8\r\n");
    if status == 405 {
        extra.push_str("Allow: GET, HEAD\r\n");
    }
    let head = request::response_head(status, body.len() as u64, &extra, keep_alive, now_unix());
    let mut out = head.into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    conn.write_all(&out)
}

fn log(shared: &ServeShared, method: &str, target: &str, status: u16, bytes: u64) {
    if shared.opts.access_log {
        eprintln!("{method} {target} {status} {bytes}");
    }
}

//! A small static-file HTTP/1.1 server on std threads: `ringfeed serve DIR`
//! for users, and the loopback server `ringfeed demo` streams from so that
//! the demo exercises the network path.
//!
//! It serves the files under one root with `GET` and `HEAD`, single byte
//! ranges (`206`, `416`), keep-alive and pipelining. The decisions (request
//! head, target to path, range) are pure functions in [`request`]; bodies
//! go out with `sendfile` ([`body`]). This file is the shell: one accept
//! thread and one thread per connection, at most `max_connections` of them
//! (a client over the limit gets `503` with `Retry-After`, which ringfeed's
//! own client retries as throttling). Dropping the [`Server`] stops the
//! accept thread, shuts every connection down and joins every thread.
//!
//! Robustness: the request head is bounded (`431` past the limit) and must
//! arrive within a time-out; malformed heads and requests with bodies get
//! `400` and the connection is closed (the stream can no longer be framed);
//! targets are percent-decoded before any `..` check; idle keep-alive
//! connections are closed after a time-out so they do not hold a slot.

pub mod body;
pub mod request;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use request::{Method, RangeChoice, TargetError};

/// Tunables of the server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections served at once, each on its own thread.
    pub max_connections: usize,
    /// Longest request head, in bytes.
    pub max_head: usize,
    /// A request head must be complete this long after its first byte.
    pub head_timeout: Duration,
    /// An idle keep-alive connection is closed after this long.
    pub idle_timeout: Duration,
    /// A client that accepts no byte of a response for this long is dropped.
    pub write_timeout: Duration,
    /// Print one line per request on stderr.
    pub access_log: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            // ringfeed opens at most workers (≤ 8 by default) × reads in
            // flight (4) connections: 32. Twice that leaves room for a
            // second client; each idle thread costs a small stack.
            max_connections: 64,
            // Apache's LimitRequestLine and one of nginx's 8 KiB large
            // header buffers. ringfeed's and curl's requests are under 200
            // bytes; a SigV4-signed one about 1.5 KiB.
            max_head: 8 << 10,
            // Against clients that trickle a head byte by byte to hold a
            // slot (slowloris); an honest head arrives in one packet.
            head_timeout: Duration::from_secs(10),
            // S3 closes idle connections after 20 s, and ringfeed's client
            // already handles a server closing an idle connection.
            idle_timeout: Duration::from_secs(20),
            // ringfeed's own stall time-out is 10 s; a reader that takes
            // 30 s for one socket buffer is gone.
            write_timeout: Duration::from_secs(30),
            access_log: false,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("serve: `{}` is not a readable directory: {message}", root.display())]
    Root { root: PathBuf, message: String },
    #[error("serve: cannot listen on {addr}: {message}")]
    Bind { addr: String, message: String },
}

/// Counters, for reports and tests. Relaxed: statistics only.
#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    requests: AtomicU64,
    body_bytes: AtomicU64,
    refused_busy: AtomicU64,
    cpu_ns: AtomicU64,
}

/// What the server has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeStats {
    /// Connections accepted and served.
    pub connections: u64,
    /// Requests answered (any status).
    pub requests: u64,
    /// Response body bytes sent.
    pub body_bytes: u64,
    /// Connections answered 503 because every slot was taken.
    pub refused_busy: u64,
    /// CPU time the connection threads spent answering requests (not
    /// waiting for them), so an in-process client such as `demo` can tell
    /// its own cost from the server's.
    pub cpu_ns: u64,
}

struct Shared {
    root: PathBuf,
    opts: ServeOptions,
    /// Set by `Drop`; connection threads check it between requests.
    /// Release/Acquire: pairs the store in `Drop` with the loads there, so
    /// a thread that sees it also sees the sockets already shut down.
    stop: AtomicBool,
    /// Clones of the live connections, to shut them down when stopping.
    live: Mutex<HashMap<u64, TcpStream>>,
    counters: Counters,
}

/// A running file server. Dropping it stops it and joins its threads.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Dropping this end wakes the accept thread (its poll sees the hang-up).
    wake: Option<UnixStream>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves the files under `root` on `addr` (`127.0.0.1:8080`,
    /// `[::1]:0`, `localhost:0`; port 0: any free port).
    pub fn bind(
        addr: &str,
        root: impl AsRef<Path>,
        opts: ServeOptions,
    ) -> Result<Server, ServeError> {
        let root = root.as_ref();
        let root_err = |message: String| ServeError::Root {
            root: root.to_path_buf(),
            message,
        };
        let root = std::fs::canonicalize(root).map_err(|e| root_err(e.to_string()))?;
        std::fs::read_dir(&root).map_err(|e| root_err(e.to_string()))?;
        let bind_err = |e: io::Error| ServeError::Bind {
            addr: addr.to_string(),
            message: e.to_string(),
        };
        let listener = TcpListener::bind(addr).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        // Non-blocking: a connection reset between poll and accept must not
        // block the accept thread.
        listener.set_nonblocking(true).map_err(bind_err)?;
        let (wake, wake_rx) = UnixStream::pair().map_err(bind_err)?;
        let shared = Arc::new(Shared {
            root,
            opts: ServeOptions {
                max_connections: opts.max_connections.max(1),
                max_head: opts.max_head.max(64),
                ..opts
            },
            stop: AtomicBool::new(false),
            live: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        });
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("ringfeed-serve".into())
            .spawn(move || accept_loop(listener, wake_rx, s))
            .map_err(bind_err)?;
        Ok(Server {
            addr: local,
            shared,
            wake: Some(wake),
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, ending in `/`: `http://127.0.0.1:8080/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The canonical root directory being served.
    pub fn root(&self) -> &Path {
        &self.shared.root
    }

    pub fn stats(&self) -> ServeStats {
        let c = &self.shared.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServeStats {
            connections: r(&c.connections),
            requests: r(&c.requests),
            body_bytes: r(&c.body_bytes),
            refused_busy: r(&c.refused_busy),
            cpu_ns: r(&c.cpu_ns),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Release: pairs with the Acquire loads in `serve_connection`.
        self.shared.stop.store(true, Ordering::Release);
        drop(self.wake.take());
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn lock_live(shared: &Shared) -> std::sync::MutexGuard<'_, HashMap<u64, TcpStream>> {
    // A panicking connection thread cannot leave the map inconsistent.
    shared.live.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits until the listener has a connection (true) or the wake socket
/// hangs up (false).
fn wait_for_connection(listener: &TcpListener, wake: &UnixStream) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the length given,
        // and both descriptors stay open (borrowed) during the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // poll itself failed (ENOMEM): back off rather than spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if fds[1].revents != 0 {
            return false;
        }
        if fds[0].revents != 0 {
            return true;
        }
    }
}

fn accept_loop(listener: TcpListener, wake: UnixStream, shared: Arc<Shared>) {
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    while wait_for_connection(&listener, &wake) {
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                // EMFILE and friends: the condition persists, so poll would
                // report the same connection at once; wait for fds to free.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        threads.retain(|t| !t.is_finished());
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_nodelay(true);
        let _ = conn.set_write_timeout(Some(shared.opts.write_timeout));
        let id = next_id;
        next_id += 1;
        {
            let mut live = lock_live(&shared);
            if live.len() >= shared.opts.max_connections {
                drop(live);
                refuse_busy(conn, &shared);
                continue;
            }
            match conn.try_clone() {
                Ok(c) => live.insert(id, c),
                Err(_) => continue,
            };
        }
        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let s = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("ringfeed-conn".into())
            // The connection loop holds a few small buffers on the stack.
            .stack_size(256 << 10)
            .spawn(move || {
                let _slot = Slot { shared: &s, id };
                serve_connection(conn, &s);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(_) => {
                // The closure (and its socket) is dropped with the error;
                // the client sees a closed connection and may retry.
                lock_live(&shared).remove(&id);
            }
        }
    }
    // Stopping: wake every connection thread out of its read or write, then
    // wait for them, so `Drop for Server` returns with nothing left running.
    for c in lock_live(&shared).values() {
        let _ = c.shutdown(Shutdown::Both);
    }
    for t in threads {
        let _ = t.join();
    }
}

/// Frees a connection slot when its thread ends, even by panic.
struct Slot<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        lock_live(self.shared).remove(&self.id);
    }
}

/// Every slot is taken: a short 503 and close. The head fits any socket
/// buffer, so the write does not block the accept thread.
fn refuse_busy(mut conn: TcpStream, shared: &Shared) {
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
    Request(request::Request),
    /// The client closed (or went idle) between requests: close quietly.
    Closed,
    /// A head that cannot be served: answer, then close.
    Bad(request::HeadError),
}

/// Serves requests on one connection until it closes, errs, or the server stops.
fn serve_connection(mut conn: TcpStream, shared: &Shared) {
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
fn respond(conn: &mut TcpStream, shared: &Shared, req: &request::Request) -> io::Result<bool> {
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
        &format!("{range_line}Accept-Ranges: bytes\r\nContent-Type: {ctype}\r\n"),
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
    shared: &Shared,
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

fn log(shared: &Shared, method: &str, target: &str, status: u16, bytes: u64) {
    if shared.opts.access_log {
        eprintln!("{method} {target} {status} {bytes}");
    }
}
